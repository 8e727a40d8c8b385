//! Taps: every frame the policer passes is copied to the daemon (the tapped policer,
//! `ebpf/src/tap.rs`), put back into flows and byte streams, and committed each epoch.
//!
//! - [`ring`]: chunks from the kernel's ring buffer put back into whole frames;
//! - [`frame`]: a frame's flow and payload;
//! - [`flows`]: each flow's streams in order (reordering undone, retransmits kept once);
//! - [`cut`]: the epoch's end, matched to the kernel's passed counters CPU by CPU, so that
//!   `unaccounted = passed - tapped` is exact;
//! - [`http`]: HTTP/1.1 exchanges on inference endpoints.
//!
//! [`TapReader`] ties them together; the daemon runs it on a thread of its own.

pub mod cut;
pub mod flows;
pub mod frame;
pub mod http;
pub mod openings;
pub mod records;
pub mod ring;
pub mod runner;
pub mod spool;
mod summary;

use std::{path::PathBuf, time::Instant};

use rackwarden_attest::evidence::Direction;
use rackwarden_common::tap::TapStats;

use crate::{limiter::maps::LimiterMaps, pins::PinPaths};
use cut::{Belongs, CutTotals, Ledger, PerCpuBytes};
use flows::{FlowEpoch, FlowTable};
use ring::{FrameReader, ReaderDiscards, TappedFrame};

#[derive(Debug, thiserror::Error)]
pub enum TapError {
    #[error(
        "tap map {path}: {detail} (is the tapped policer loaded? `[taps]` in the config loads it)"
    )]
    Map { path: PathBuf, detail: String },
    #[error("reading the kernel's passed counters: {0}")]
    Counters(String),
    #[error("tap cut file {path}: {detail}")]
    CutFile { path: PathBuf, detail: String },
    #[error("tap spool {path}: {detail}")]
    Spool { path: PathBuf, detail: String },
    #[error("tap records: {0}")]
    Records(String),
    #[error("tap thread: {0}")]
    Thread(String),
}

/// One epoch's traffic as the tap saw it.
#[derive(Debug, Clone)]
pub struct TapEpoch {
    pub flows: Vec<FlowEpoch>,
    pub totals: CutTotals,
    /// Frame bytes the reader took into this epoch, per direction (egress, ingress).
    pub tapped: [u64; 2],
    /// What the tap dropped in the epoch, by reason.
    pub drops: rackwarden_attest::traffic::TapDrops,
    pub discards: ReaderDiscards,
    /// Whether the epoch's start is the last committed cut (`Resumed`) or this process's
    /// first look at the counters with nothing committed before (`FirstStart`: bytes passed
    /// before it are not in any epoch).
    pub start: EpochStart,
}

pub use rackwarden_attest::traffic::EpochStart;

/// The reading side of the tap: frames into flows, and the epoch cut.
pub struct TapReader {
    reader: FrameReader,
    maps: LimiterMaps,
    flows: FlowTable,
    ledger: Ledger,
    cut_file: PathBuf,
    start: EpochStart,
    tapped: [u64; 2],
    /// The kernel's drop counts at the previous cut (at open: now).
    drops_before: [TapStats; 2],
    /// Payload bytes the flows may hold before the reader stops taking frames (the ring then
    /// fills and the policer drops: fail closed).
    buffer_limit: u64,
}

impl TapReader {
    /// Opens the tapped policer's maps under `pins`; the epoch in progress starts at the last
    /// cut committed in `cut_file`, or at the kernel's counters now if there is none.
    pub fn open(pins: &PinPaths, cut_file: PathBuf, buffer_limit: u64) -> Result<Self, TapError> {
        let reader = FrameReader::open(pins)?;
        let maps = LimiterMaps::open(pins).map_err(|e| TapError::Counters(e.to_string()))?;
        let (ledger, start) = match read_cut(&cut_file)? {
            Some(at) => (Ledger::starting_at(at), EpochStart::Resumed),
            None => (Ledger::starting_at(passed(&maps)?), EpochStart::FirstStart),
        };
        let drops_before = [
            reader.stats(Direction::Egress)?,
            reader.stats(Direction::Ingress)?,
        ];
        Ok(TapReader {
            drops_before,
            reader,
            maps,
            flows: FlowTable::default(),
            ledger,
            cut_file,
            start,
            tapped: [0; 2],
            buffer_limit,
        })
    }

    /// Frame bytes read into the epoch in progress (egress, ingress).
    pub fn tapped_so_far(&self) -> [u64; 2] {
        self.tapped
    }

    /// Payload bytes the flows hold in memory for the epoch in progress.
    pub fn buffered(&self) -> u64 {
        self.flows.buffered()
    }

    /// Waits up to `timeout` for frames, then takes what the ring holds. Returns the number
    /// of frames taken; none while the flows hold `buffer_limit` (fail closed: the ring fills
    /// and the policer drops, counted as `ring_full`).
    pub fn poll(&mut self, timeout: std::time::Duration) -> usize {
        if self.flows.buffered() >= self.buffer_limit {
            std::thread::sleep(timeout);
            return 0;
        }
        self.reader.wait(timeout);
        let (flows, ledger, tapped) = (&mut self.flows, &mut self.ledger, &mut self.tapped);
        self.reader.drain(|f| {
            ledger.take(&f);
            add(flows, tapped, &f);
        })
    }

    /// Ends the epoch: matches the frames to the kernel's counters (see [`cut`]), returns the
    /// epoch's flows and totals, and commits the cut to `cut_file` before anything else sees
    /// it, so a restart starts the next epoch exactly there.
    pub fn cut(&mut self) -> Result<TapEpoch, TapError> {
        let maps = &self.maps;
        let target = cut::settle_target(&self.ledger, || passed(maps).ok())
            .ok_or_else(|| TapError::Counters("the passed counters cannot be read".into()))?;
        let mut next: Vec<TappedFrame> = Vec::new();
        let mut taken_next: PerCpuBytes = [Vec::new(), Vec::new()];
        let mut last_progress = Instant::now();
        while !self.ledger.reached(&target) && last_progress.elapsed() < cut::CUT_PATIENCE {
            self.reader.wait(std::time::Duration::from_millis(10));
            let (flows, ledger, tapped) = (&mut self.flows, &mut self.ledger, &mut self.tapped);
            let n = self
                .reader
                .drain(|f| match ledger.take_towards(&f, &target) {
                    Belongs::Ending => add(flows, tapped, &f),
                    Belongs::Next => {
                        *cut::cell(&mut taken_next, f.dir, f.cpu) += f.bytes.len() as u64;
                        next.push(f);
                    }
                });
            if n > 0 {
                last_progress = Instant::now();
            }
        }
        let mut totals = self.ledger.close(&target, &taken_next);
        // The statement's identity, per direction: unaccounted = passed - tapped. (Per CPU the
        // ledger agrees; this also holds where a reader ran past a counter it never caught.)
        for d in 0..2 {
            totals.unaccounted[d] = totals.passed[d].saturating_sub(self.tapped[d]);
        }
        write_cut(&self.cut_file, &target)?;
        let drops_now = [
            self.reader.stats(Direction::Egress)?,
            self.reader.stats(Direction::Ingress)?,
        ];
        let drops = summary::drops(&drops_now, &self.drops_before);
        self.drops_before = drops_now;
        let epoch = TapEpoch {
            flows: self.flows.cut(),
            totals,
            tapped: std::mem::take(&mut self.tapped),
            drops,
            discards: self.reader.discards,
            start: self.start,
        };
        self.start = EpochStart::Resumed;
        for f in &next {
            add(&mut self.flows, &mut self.tapped, f);
        }
        Ok(epoch)
    }
}

fn add(flows: &mut FlowTable, tapped: &mut [u64; 2], f: &TappedFrame) {
    tapped[rackwarden_attest::traffic::idx(f.dir)] += f.bytes.len() as u64;
    let parsed = frame::parse(&f.bytes, f.dir);
    flows.push(f.dir, &f.bytes, &parsed);
}

/// The kernel's passed bytes per direction and CPU.
fn passed(maps: &LimiterMaps) -> Result<PerCpuBytes, TapError> {
    let one = |d: Direction| -> Result<Vec<u64>, TapError> {
        Ok(maps
            .counters_per_cpu(d)
            .map_err(|e| TapError::Counters(e.to_string()))?
            .iter()
            .map(|c| c.passed_bytes)
            .collect())
    };
    Ok([one(Direction::Egress)?, one(Direction::Ingress)?])
}

fn read_cut(path: &std::path::Path) -> Result<Option<PerCpuBytes>, TapError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(TapError::CutFile {
                path: path.to_path_buf(),
                detail: e.to_string(),
            });
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TapError::CutFile {
            path: path.to_path_buf(),
            detail: format!("not a cut ({e}); remove it to start counting afresh"),
        })
}

fn write_cut(path: &std::path::Path, at: &PerCpuBytes) -> Result<(), TapError> {
    let err = |detail: String| TapError::CutFile {
        path: path.to_path_buf(),
        detail,
    };
    let json = serde_json::to_vec(at).map_err(|e| err(e.to_string()))?;
    crate::atomic_file::replace(path, &json).map_err(|e| err(e.to_string()))
}
