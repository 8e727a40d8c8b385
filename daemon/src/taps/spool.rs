//! The spool of committed records: each epoch's records with their bytes, under
//! `<state_dir>/tap-spool/`, so that the host can open any record the verifier samples.
//!
//! One file per epoch, `<seq>.records`, written whole (temporary file, fsync, rename) before
//! the statement that commits the epoch is signed, mode 0600: it holds prompts and responses.
//! Each record is, in order: the leaf as JSON (`u32` big-endian length, then the bytes), the
//! input (`u64` big-endian length, then the bytes) and the output (the same). Binary, not
//! base64: the spool holds about one byte per tapped byte (`cargo xtask bench taps`).
//!
//! The spool is bounded by `[taps] spool_limit`. An epoch's file is removed only when the
//! verifier no longer needs it: its statement was acknowledged without a sample, or its
//! openings were acknowledged (`crate::epoch::openings`). Nothing is removed to make room:
//! a statement already said its epoch was kept. An epoch that does not fit (the spool holds
//! epochs not yet answered, the epoch is larger than the limit, or the disk is full) is not
//! silently lost either: its own statement says `not_kept` and why, which the verifier
//! judges (`traffic_not_kept`).

use std::path::{Path, PathBuf};

use super::{TapError, records::Record};

pub struct TapSpool {
    dir: PathBuf,
    limit: u64,
    /// Bytes in the spool as of the last look at the directory (at open and at each epoch's
    /// write): what `status` shows without reading the directory every time it is asked.
    used: u64,
}

/// The spool file of epoch `seq` under `spool_dir`: the one place the name is made.
pub fn path_for(spool_dir: &Path, seq: u64) -> PathBuf {
    spool_dir.join(format!("{seq:020}.records"))
}

/// Whether an epoch's records are in the spool (the statement's word for it).
pub use rackwarden_attest::traffic::SpoolState as Kept;

impl TapSpool {
    pub fn open(dir: PathBuf, limit: u64) -> Result<TapSpool, TapError> {
        use std::os::unix::fs::DirBuilderExt as _;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| TapError::Spool {
                path: dir.clone(),
                detail: e.to_string(),
            })?;
        let mut spool = TapSpool {
            dir,
            limit,
            used: 0,
        };
        spool.used = spool.epochs().iter().map(|(_, n)| n).sum();
        Ok(spool)
    }

    fn path(&self, seq: u64) -> PathBuf {
        path_for(&self.dir, seq)
    }

    /// The spooled epochs, oldest first, with their sizes.
    fn epochs(&self) -> Vec<(PathBuf, u64)> {
        let mut v: Vec<(PathBuf, u64)> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "records"))
            .map(|e| (e.path(), e.metadata().map(|m| m.len()).unwrap_or(0)))
            .collect();
        v.sort();
        v
    }

    pub fn bytes(&self) -> u64 {
        self.used
    }

    /// Writes epoch `seq`'s records if they fit beside the epochs the verifier may still ask
    /// about.
    pub fn keep(&mut self, seq: u64, records: &[Record]) -> Kept {
        let mut text = Vec::new();
        for r in records {
            match encode(r) {
                Ok(b) => text.extend_from_slice(&b),
                Err(e) => {
                    return Kept::NotKept {
                        reason: format!("record of epoch {seq}: {e}"),
                    };
                }
            }
        }
        let size = text.len() as u64;
        if size > self.limit {
            return Kept::NotKept {
                reason: format!(
                    "the epoch's records take {size} bytes, more than spool_limit ({} bytes)",
                    self.limit
                ),
            };
        }
        // Read again: the delivery thread removes the files of epochs it is done with.
        let held: Vec<(PathBuf, u64)> = self
            .epochs()
            .into_iter()
            .filter(|(p, _)| *p != self.path(seq))
            .collect();
        let used: u64 = held.iter().map(|(_, n)| n).sum();
        self.used = used;
        if used + size > self.limit {
            return Kept::NotKept {
                reason: format!(
                    "the epoch's records take {size} bytes and the spool already holds {used} bytes of {} epochs the verifier may still sample; spool_limit is {} bytes",
                    held.len(),
                    self.limit
                ),
            };
        }
        match write_private(&self.path(seq), &text) {
            Ok(()) => {
                self.used += size;
                Kept::Kept { bytes: size }
            }
            Err(e) => Kept::NotKept {
                reason: format!("{}: {e}", self.path(seq).display()),
            },
        }
    }
}

/// One record as the spool stores it (see the module doc).
pub fn encode(r: &Record) -> Result<Vec<u8>, serde_json::Error> {
    let leaf = serde_json::to_vec(&r.leaf)?;
    let mut out = Vec::with_capacity(4 + leaf.len() + 16 + r.input.len() + r.output.len());
    out.extend_from_slice(&(leaf.len() as u32).to_be_bytes());
    out.extend_from_slice(&leaf);
    for part in [&r.input, &r.output] {
        out.extend_from_slice(&(part.len() as u64).to_be_bytes());
        out.extend_from_slice(part);
    }
    Ok(out)
}

/// The records of a spool file, in order; `None` where the file is not whole.
pub fn decode(mut bytes: &[u8]) -> Option<Vec<Record>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (b.get(..n)?, b.get(n..)?);
        *b = rest;
        Some(head)
    }
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let n = u32::from_be_bytes(take(&mut bytes, 4)?.try_into().ok()?) as usize;
        let leaf = serde_json::from_slice(take(&mut bytes, n)?).ok()?;
        let mut parts = Vec::new();
        for _ in 0..2 {
            let n = u64::from_be_bytes(take(&mut bytes, 8)?.try_into().ok()?);
            parts.push(take(&mut bytes, usize::try_from(n).ok()?)?.to_vec());
        }
        let output = parts.pop()?;
        let input = parts.pop()?;
        out.push(Record {
            leaf,
            input,
            output,
        });
    }
    Some(out)
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    crate::atomic_file::replace_private(path, bytes)
}
