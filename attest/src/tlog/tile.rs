//! C2SP tlog-tiles: the log served as static tiles of hashes, height 8 (256 hashes in a full
//! tile).
//!
//! - `tile/<L>/<N>`: the hashes of the level `8·L` nodes `256·N .. 256·N + 256`, each 32 bytes,
//!   concatenated; `tile/<L>/<N>.p/<W>` holds the first `W` (1..=255) of them while the
//!   tile is not yet full;
//! - `tile/entries/<N>[.p/<W>]`: the data of leaves `256·N ..`, each prefixed with its length
//!   as a big-endian u16;
//! - `<N>` is written in groups of three digits, every group but the last prefixed with `x`:
//!   1234067 is `x001/x234/067`, 5 is `005`.
//!
//! [`TileReader`] reads a tree's nodes from tiles fetched by any means (files, HTTP), so that
//! a third party can check a checkpoint from the tiles alone.

use std::{cell::RefCell, collections::HashMap, sync::Arc};

use super::{Hash, HashReader, TlogError, node_hash};

/// What a tile fetcher fails with: any error (an I/O error, an HTTP status, a message), so
/// that files, HTTP clients and tests can each fetch with their own error type.
pub type FetchError = Box<dyn std::error::Error + Send + Sync>;

/// A tile the fetcher could not supply: the tile's path and the fetcher's error.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{path}: {source}")]
pub struct TileFetchError {
    /// The tile's path under the log (`tile/0/005.p/7`).
    pub path: String,
    /// Shared so that the error stays `Clone`, as [`TlogError`] is.
    pub source: Arc<dyn std::error::Error + Send + Sync>,
}

impl TileFetchError {
    fn new(path: &str, source: impl Into<FetchError>) -> TileFetchError {
        TileFetchError {
            path: path.to_string(),
            source: Arc::from(source.into()),
        }
    }
}

/// Two fetch errors are the same when they name the same tile and say the same thing (the
/// fetcher's error type is erased).
impl PartialEq for TileFetchError {
    fn eq(&self, other: &TileFetchError) -> bool {
        self.path == other.path && self.source.to_string() == other.source.to_string()
    }
}

impl Eq for TileFetchError {}

/// Tree levels per tile.
pub const TILE_HEIGHT: u32 = 8;
/// Hashes (or entries) in a full tile.
pub const TILE_WIDTH: u64 = 1 << TILE_HEIGHT;

/// What a tile holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TileKind {
    /// Hashes of tile level `L` (tree level `8·L`).
    Hashes(u8),
    /// Leaf data.
    Entries,
}

/// A tile's address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TilePath {
    pub kind: TileKind,
    pub index: u64,
    /// 1..=256; 256 is a full tile.
    pub width: u16,
}

/// A tile path that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{path}` is not a tile path: {what}")]
pub struct TilePathError {
    pub path: String,
    pub what: &'static str,
}

/// `<N>` in groups of three digits (`x001/x234/067`).
pub fn index_path(n: u64) -> String {
    let digits = n.to_string();
    let pad = (3 - digits.len() % 3) % 3;
    let digits = format!("{}{digits}", "0".repeat(pad));
    let groups: Vec<&str> = digits
        .as_bytes()
        .chunks(3)
        .filter_map(|c| std::str::from_utf8(c).ok())
        .collect();
    let last = groups.len() - 1;
    groups
        .iter()
        .enumerate()
        .map(|(i, g)| {
            if i == last {
                g.to_string()
            } else {
                format!("x{g}")
            }
        })
        .collect::<Vec<_>>()
        .join("/")
}

impl TilePath {
    /// The path under the log's prefix: `tile/0/x001/005.p/7`.
    pub fn path(&self) -> String {
        let kind = match self.kind {
            TileKind::Hashes(l) => l.to_string(),
            TileKind::Entries => "entries".to_string(),
        };
        let mut p = format!("tile/{kind}/{}", index_path(self.index));
        if u64::from(self.width) < TILE_WIDTH {
            p.push_str(&format!(".p/{}", self.width));
        }
        p
    }

    /// Parses `tile/<L>/<N>[.p/<W>]` or `tile/entries/<N>[.p/<W>]` (a leading `/` allowed).
    pub fn parse(path: &str) -> Result<TilePath, TilePathError> {
        let err = |what| TilePathError {
            path: path.to_string(),
            what,
        };
        let rest = path
            .trim_start_matches('/')
            .strip_prefix("tile/")
            .ok_or_else(|| err("it does not start with `tile/`"))?;
        let (kind, rest) = rest
            .split_once('/')
            .ok_or_else(|| err("no index after the level"))?;
        let kind = if kind == "entries" {
            TileKind::Entries
        } else {
            match kind.parse::<u8>() {
                Ok(l) if l.to_string() == kind && l < 8 => TileKind::Hashes(l),
                _ => return Err(err("the level is not `entries` or a number 0..=7")),
            }
        };
        let (index_part, width) = match rest.split_once(".p/") {
            Some((i, w)) => {
                let w = match w.parse::<u16>() {
                    Ok(w) if (1..256).contains(&w) => w,
                    _ => return Err(err("the partial width is not a number 1..=255")),
                };
                (i, w)
            }
            None => (rest, TILE_WIDTH as u16),
        };
        let groups: Vec<&str> = index_part.split('/').collect();
        let mut index: u64 = 0;
        let last = groups.len() - 1;
        for (i, g) in groups.iter().enumerate() {
            let digits = if i == last {
                *g
            } else {
                g.strip_prefix('x')
                    .ok_or_else(|| err("an index group before the last lacks its `x`"))?
            };
            if digits.len() != 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(err("an index group is not three digits"));
            }
            let d: u64 = digits.parse().map_err(|_| err("bad index digits"))?;
            index = index
                .checked_mul(1000)
                .and_then(|v| v.checked_add(d))
                .ok_or_else(|| err("the index overflows"))?;
        }
        let parsed = TilePath { kind, index, width };
        // One spelling per tile: `x000/005` is not `005`.
        if parsed.path() != path.trim_start_matches('/') {
            return Err(err("not in canonical form"));
        }
        Ok(parsed)
    }
}

/// How many nodes a tree of `size` leaves has complete at tile level `level` (tree level
/// `8·level`).
pub fn level_count(level: u8, size: u64) -> u64 {
    size.checked_shr(TILE_HEIGHT * u32::from(level))
        .unwrap_or(0)
}

/// The width of tile `index` at `level` in a tree of `size` leaves (`None`: no such tile
/// yet). Entries tiles have the widths of level 0.
pub fn tile_width(level: u8, index: u64, size: u64) -> Option<u16> {
    let count = level_count(level, size);
    let start = index.checked_mul(TILE_WIDTH)?;
    if start >= count {
        return None;
    }
    Some((count - start).min(TILE_WIDTH) as u16)
}

/// An entries bundle: each entry prefixed by its length as a big-endian u16.
pub fn encode_bundle<E: AsRef<[u8]>>(entries: &[E]) -> Result<Vec<u8>, TlogError> {
    let mut out = Vec::new();
    for e in entries {
        let e = e.as_ref();
        let len = u16::try_from(e.len())
            .map_err(|_| TlogError::Read(format!("an entry of {} bytes is over 65535", e.len())))?;
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(e);
    }
    Ok(out)
}

/// The entries of a bundle.
pub fn decode_bundle(mut data: &[u8]) -> Result<Vec<Vec<u8>>, TlogError> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let [a, b, rest @ ..] = data else {
            return Err(TlogError::Read(format!(
                "entries bundle: entry {} has half a length prefix",
                out.len()
            )));
        };
        let len = usize::from(u16::from_be_bytes([*a, *b]));
        if rest.len() < len {
            return Err(TlogError::Read(format!(
                "entries bundle: entry {} says {len} bytes, {} are left",
                out.len(),
                rest.len()
            )));
        }
        out.push(rest[..len].to_vec());
        data = &rest[len..];
    }
    Ok(out)
}

/// A [`HashReader`] over the tiles of a tree of `size` leaves, fetched by `fetch(path)` (a
/// path like `tile/0/005.p/7`; any error type that converts to [`FetchError`]) and kept once
/// fetched. Nodes between tile levels are
/// computed from the level below.
pub struct TileReader<F> {
    size: u64,
    fetch: F,
    tiles: RefCell<HashMap<(u8, u64), Vec<u8>>>,
}

impl<F, E> TileReader<F>
where
    F: Fn(&str) -> Result<Vec<u8>, E>,
    E: Into<FetchError>,
{
    pub fn new(size: u64, fetch: F) -> TileReader<F> {
        TileReader {
            size,
            fetch,
            tiles: RefCell::new(HashMap::new()),
        }
    }

    /// The data of leaf tile `index` (its entries bundle, decoded).
    pub fn entries(&self, index: u64) -> Result<Vec<Vec<u8>>, TlogError> {
        let width = tile_width(0, index, self.size).ok_or(TlogError::MissingNode {
            level: 0,
            index: index * TILE_WIDTH,
        })?;
        let path = TilePath {
            kind: TileKind::Entries,
            index,
            width,
        }
        .path();
        let data = (self.fetch)(&path).map_err(|e| TileFetchError::new(&path, e))?;
        let entries = decode_bundle(&data).map_err(|e| TlogError::Read(format!("{path}: {e}")))?;
        if entries.len() != usize::from(width) {
            return Err(TlogError::Read(format!(
                "{path}: {} entries, not {width}",
                entries.len()
            )));
        }
        Ok(entries)
    }

    fn tile_hash(&self, level: u8, index: u64) -> Result<Hash, TlogError> {
        let missing = TlogError::MissingNode {
            level: u32::from(level) * TILE_HEIGHT,
            index,
        };
        let tile = index / TILE_WIDTH;
        let width = tile_width(level, tile, self.size).ok_or(missing.clone())?;
        let pos = (index % TILE_WIDTH) as usize;
        if pos >= usize::from(width) {
            return Err(missing);
        }
        let mut tiles = self.tiles.borrow_mut();
        if let std::collections::hash_map::Entry::Vacant(slot) = tiles.entry((level, tile)) {
            let path = TilePath {
                kind: TileKind::Hashes(level),
                index: tile,
                width,
            }
            .path();
            let data = (self.fetch)(&path).map_err(|e| TileFetchError::new(&path, e))?;
            if data.len() != usize::from(width) * 32 {
                return Err(TlogError::Read(format!(
                    "{path}: {} bytes, not {} ({width} hashes)",
                    data.len(),
                    usize::from(width) * 32
                )));
            }
            slot.insert(data);
        }
        let data = tiles.get(&(level, tile)).ok_or(missing.clone())?;
        data[pos * 32..pos * 32 + 32]
            .try_into()
            .map_err(|_| missing)
    }
}

impl<F, E> HashReader for TileReader<F>
where
    F: Fn(&str) -> Result<Vec<u8>, E>,
    E: Into<FetchError>,
{
    fn node(&self, level: u32, index: u64) -> Result<Hash, TlogError> {
        let missing = TlogError::MissingNode { level, index };
        let end = index
            .checked_add(1)
            .and_then(|i| i.checked_shl(level))
            .filter(|e| e >> level == index + 1)
            .ok_or(missing.clone())?;
        if end > self.size {
            return Err(missing);
        }
        if level.is_multiple_of(TILE_HEIGHT) {
            let tl = u8::try_from(level / TILE_HEIGHT).map_err(|_| missing)?;
            return self.tile_hash(tl, index);
        }
        let l = self.node(level - 1, 2 * index)?;
        let r = self.node(level - 1, 2 * index + 1)?;
        Ok(node_hash(&l, &r))
    }
}

/// The tiles a server holds for a tree of `size` leaves: every tile of every level, full or
/// partial, as `(path, hashes or leaf-tile index)`. A static publisher writes these.
pub fn tiles_of(size: u64) -> Vec<TilePath> {
    let mut out = Vec::new();
    for level in 0u8..8 {
        let count = level_count(level, size);
        if count == 0 {
            break;
        }
        for index in 0..count.div_ceil(TILE_WIDTH) {
            if let Some(width) = tile_width(level, index, size) {
                out.push(TilePath {
                    kind: TileKind::Hashes(level),
                    index,
                    width,
                });
                if level == 0 {
                    out.push(TilePath {
                        kind: TileKind::Entries,
                        index,
                        width,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_paths_are_grouped() {
        assert_eq!(index_path(0), "000");
        assert_eq!(index_path(5), "005");
        assert_eq!(index_path(1000), "x001/000");
        assert_eq!(index_path(1234067), "x001/x234/067");
    }

    #[test]
    fn tile_paths_round_trip() {
        for (p, want) in [
            (
                "tile/0/x001/x234/067",
                TilePath {
                    kind: TileKind::Hashes(0),
                    index: 1234067,
                    width: 256,
                },
            ),
            (
                "tile/1/005.p/7",
                TilePath {
                    kind: TileKind::Hashes(1),
                    index: 5,
                    width: 7,
                },
            ),
            (
                "tile/entries/000.p/255",
                TilePath {
                    kind: TileKind::Entries,
                    index: 0,
                    width: 255,
                },
            ),
        ] {
            assert_eq!(TilePath::parse(p).unwrap(), want);
            assert_eq!(want.path(), p);
        }
        for bad in [
            "tile/0/5",
            "tile/0/x000/005",
            "tile/0/005.p/0",
            "tile/0/005.p/256",
            "tile/0/005.p/07",
            "tile/9/005",
            "tile/0/001/005",
            "tiles/0/005",
            "tile/00/005",
        ] {
            assert!(TilePath::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn bundles_round_trip_and_refuse_truncation() {
        let entries = vec![b"".to_vec(), b"abc".to_vec(), vec![0u8; 300]];
        let b = encode_bundle(&entries).unwrap();
        assert_eq!(&b[..5], &[0, 0, 0, 3, b'a']);
        assert_eq!(decode_bundle(&b).unwrap(), entries);
        assert!(decode_bundle(&b[..b.len() - 1]).is_err());
        assert!(decode_bundle(&[0]).is_err());
    }

    #[test]
    fn widths() {
        assert_eq!(tile_width(0, 0, 0), None);
        assert_eq!(tile_width(0, 0, 5), Some(5));
        assert_eq!(tile_width(0, 0, 300), Some(256));
        assert_eq!(tile_width(0, 1, 300), Some(44));
        assert_eq!(tile_width(1, 0, 300), Some(1));
        assert_eq!(tile_width(1, 0, 255), None);
    }
}
