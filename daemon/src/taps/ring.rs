//! Reading the tapped policer's ring buffer: chunks put back together into whole frames.
//!
//! The chunks of one frame come from one program run on one CPU, in order (the layout is in
//! `rackwarden_common::tap`). A frame is whole when its chunks add up to its length. A frame
//! whose chunks stop short (the ring filled between two of them: the policer then dropped it)
//! is discarded here when the next frame of the same CPU and direction starts, and counted.

use std::{
    collections::HashMap,
    os::fd::{AsFd as _, AsRawFd as _},
    time::Duration,
};

use aya::maps::{Map, MapData, PerCpuArray, RingBuf};
use rackwarden_attest::evidence::Direction;
use rackwarden_common::{
    DIR_EGRESS, DIR_INGRESS, map_names,
    tap::{TAP_CHUNK_MAGIC, TAP_MAX_FRAME, TapChunkHeader, TapStats},
};

use super::TapError;
use crate::pins::PinPaths;

/// One frame the policer passed, whole, as the kernel charged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TappedFrame {
    pub dir: Direction,
    pub cpu: u32,
    pub seq: u64,
    pub ktime_ns: u64,
    pub bytes: Vec<u8>,
}

/// A frame whose first chunks have arrived.
struct Partial {
    seq: u64,
    frame_len: u32,
    ktime_ns: u64,
    bytes: Vec<u8>,
}

/// What the reader threw away, and why: each is a gap the statement discloses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ReaderDiscards {
    /// Chunks with a wrong magic, direction or length: not written by our program.
    pub malformed_chunks: u64,
    /// Frames whose chunks stopped short (the policer dropped them: counted there too).
    pub incomplete_frames: u64,
}

pub struct FrameReader {
    ring: RingBuf<MapData>,
    stats: PerCpuArray<MapData, TapStats>,
    partial: HashMap<(u32, u32), Partial>,
    pub discards: ReaderDiscards,
}

impl FrameReader {
    /// Opens the pinned ring and statistics of the tapped policer under `pins`.
    pub fn open(pins: &PinPaths) -> Result<FrameReader, TapError> {
        let open = |name: &'static str| {
            let path = pins.map(name);
            MapData::from_pin(&path).map_err(|source| TapError::Map {
                path: path.clone(),
                detail: source.to_string(),
            })
        };
        let ring =
            RingBuf::try_from(Map::RingBuf(open(map_names::TAP)?)).map_err(|e| TapError::Map {
                path: pins.map(map_names::TAP),
                detail: e.to_string(),
            })?;
        let stats =
            PerCpuArray::try_from(Map::PerCpuArray(open(map_names::TAP_STATS)?)).map_err(|e| {
                TapError::Map {
                    path: pins.map(map_names::TAP_STATS),
                    detail: e.to_string(),
                }
            })?;
        Ok(FrameReader {
            ring,
            stats,
            partial: HashMap::new(),
            discards: ReaderDiscards::default(),
        })
    }

    /// Waits up to `timeout` for the ring to have data (`poll(2)` on its fd).
    pub fn wait(&self, timeout: Duration) {
        let mut fds = [libc::pollfd {
            fd: self.ring.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: one valid pollfd for the duration of the call. An error (EINTR) only
        // means the caller drains a little early.
        unsafe { libc::poll(fds.as_mut_ptr(), 1, ms) };
    }

    /// Takes every chunk the ring holds now, and hands each frame that became whole to `f`.
    /// Returns the number of frames handed over.
    pub fn drain(&mut self, mut f: impl FnMut(TappedFrame)) -> usize {
        let mut frames = 0;
        let (ring, partial, discards) = (&mut self.ring, &mut self.partial, &mut self.discards);
        while let Some(item) = ring.next() {
            if let Some(frame) = take_chunk(partial, discards, &item) {
                frames += 1;
                f(frame);
            }
        }
        frames
    }
}

/// Adds one chunk to the frame it belongs to; returns the frame when it is whole.
fn take_chunk(
    partial: &mut HashMap<(u32, u32), Partial>,
    discards: &mut ReaderDiscards,
    raw: &[u8],
) -> Option<TappedFrame> {
    let hlen = std::mem::size_of::<TapChunkHeader>();
    let Some(h) = parse_header(raw) else {
        discards.malformed_chunks += 1;
        return None;
    };
    let data = raw.get(hlen..hlen + h.chunk_len as usize)?;
    let dir = match h.dir {
        DIR_EGRESS => Direction::Egress,
        DIR_INGRESS => Direction::Ingress,
        _ => {
            discards.malformed_chunks += 1;
            return None;
        }
    };
    let key = (h.cpu, h.dir);
    if h.chunk_offset == 0 {
        if partial.remove(&key).is_some() {
            discards.incomplete_frames += 1;
        }
        partial.insert(
            key,
            Partial {
                seq: h.frame_seq,
                frame_len: h.frame_len,
                ktime_ns: h.ktime_ns,
                bytes: Vec::with_capacity(h.frame_len as usize),
            },
        );
    }
    let Some(p) = partial.get_mut(&key) else {
        // A continuation without its start: the start was read by another process.
        discards.malformed_chunks += 1;
        return None;
    };
    if p.seq != h.frame_seq || p.bytes.len() != h.chunk_offset as usize {
        partial.remove(&key);
        discards.incomplete_frames += 1;
        return None;
    }
    p.bytes.extend_from_slice(data);
    if p.bytes.len() < p.frame_len as usize {
        return None;
    }
    let p = partial.remove(&key)?;
    Some(TappedFrame {
        dir,
        cpu: h.cpu,
        seq: p.seq,
        ktime_ns: p.ktime_ns,
        bytes: p.bytes,
    })
}

impl FrameReader {
    /// The tap's drop counts in `dir`, summed over CPUs.
    pub fn stats(&self, dir: Direction) -> Result<TapStats, TapError> {
        let per_cpu = self
            .stats
            .get(&crate::limiter::HookDirection::index(dir), 0)
            .map_err(|e| TapError::Map {
                path: map_names::TAP_STATS.into(),
                detail: e.to_string(),
            })?;
        let mut total = TapStats::default();
        for s in per_cpu.iter() {
            total.add(s);
        }
        Ok(total)
    }
}

/// The header of a chunk, if the chunk is one our program wrote.
fn parse_header(raw: &[u8]) -> Option<TapChunkHeader> {
    let hlen = std::mem::size_of::<TapChunkHeader>();
    let head = raw.get(..hlen)?;
    let u32_at = |o: usize| {
        head.get(o..o + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_ne_bytes)
    };
    let u64_at = |o: usize| {
        head.get(o..o + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_ne_bytes)
    };
    let h = TapChunkHeader {
        magic: u32_at(0)?,
        dir: u32_at(4)?,
        cpu: u32_at(8)?,
        frame_len: u32_at(12)?,
        chunk_offset: u32_at(16)?,
        chunk_len: u32_at(20)?,
        frame_seq: u64_at(24)?,
        ktime_ns: u64_at(32)?,
    };
    let fits = raw.len() >= hlen + h.chunk_len as usize
        && h.frame_len <= TAP_MAX_FRAME
        && h.chunk_offset.checked_add(h.chunk_len)? <= h.frame_len
        && h.chunk_len > 0;
    (h.magic == TAP_CHUNK_MAGIC && fits).then_some(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(h: TapChunkHeader, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        for x in [
            h.magic,
            h.dir,
            h.cpu,
            h.frame_len,
            h.chunk_offset,
            h.chunk_len,
        ] {
            v.extend_from_slice(&x.to_ne_bytes());
        }
        v.extend_from_slice(&h.frame_seq.to_ne_bytes());
        v.extend_from_slice(&h.ktime_ns.to_ne_bytes());
        v.extend_from_slice(data);
        v
    }

    #[test]
    fn headers_outside_the_layout_are_refused() {
        let h = TapChunkHeader {
            magic: TAP_CHUNK_MAGIC,
            dir: 0,
            cpu: 1,
            frame_len: 10,
            chunk_offset: 0,
            chunk_len: 10,
            frame_seq: 7,
            ktime_ns: 9,
        };
        assert_eq!(parse_header(&chunk(h, &[0; 10])), Some(h));
        assert_eq!(parse_header(&chunk(h, &[0; 9])), None, "short data");
        let bad = TapChunkHeader { magic: 1, ..h };
        assert_eq!(parse_header(&chunk(bad, &[0; 10])), None, "magic");
        let over = TapChunkHeader {
            chunk_offset: 5,
            ..h
        };
        assert_eq!(parse_header(&chunk(over, &[0; 10])), None, "past the frame");
    }
}
