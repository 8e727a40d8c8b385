//! The statement's summary of an epoch's traffic, from the cut and the sum tree's root.

use rackwarden_attest::traffic::{DropCount, EpochStart, TapDrops, TrafficRoot, TrafficSummary};
use rackwarden_common::tap::TapStats;

use super::TapEpoch;

/// The per-epoch drops: the kernel's cumulative counts less those at the previous cut.
pub fn drops(now: &[TapStats; 2], before: &[TapStats; 2]) -> TapDrops {
    let d = |f: fn(&TapStats) -> u64| -> [u64; 2] {
        [
            f(&now[0]).saturating_sub(f(&before[0])),
            f(&now[1]).saturating_sub(f(&before[1])),
        ]
    };
    TapDrops {
        ring_full: DropCount {
            frames: d(|s| s.ring_full_frames),
            bytes: d(|s| s.ring_full_bytes),
        },
        too_large: DropCount {
            frames: d(|s| s.too_large_frames),
            bytes: d(|s| s.too_large_bytes),
        },
        unreadable: DropCount {
            frames: d(|s| s.unreadable_frames),
            bytes: d(|s| s.unreadable_bytes),
        },
    }
}

pub fn of(epoch: &TapEpoch, root: TrafficRoot, held: [u64; 2]) -> TrafficSummary {
    TrafficSummary {
        root,
        passed: epoch.totals.passed,
        unaccounted: epoch.totals.unaccounted,
        tap_drops: epoch.drops,
        held,
        start: match epoch.start {
            super::EpochStart::Resumed => EpochStart::Resumed,
            super::EpochStart::FirstStart => EpochStart::FirstStart,
        },
    }
}

/// Frames the tap dropped in the epoch, all reasons and directions.
pub fn dropped_frames(s: &TrafficSummary) -> u64 {
    let d = &s.tap_drops;
    [d.ring_full, d.too_large, d.unreadable]
        .iter()
        .map(|c| c.frames[0] + c.frames[1])
        .sum()
}
