//! The epoch cut: which tapped frames belong to the epoch that ends, matched to the kernel's
//! own count, CPU by CPU.
//!
//! The policer writes a frame into the ring and *then* adds its bytes to its CPU's passed
//! counter. So when the counters are read, every frame they count is already in the ring
//! (or was lost: read by another process, or by a daemon that died before committing it).
//! The cut reads the counters, then takes frames of each CPU and direction until the bytes
//! taken reach that CPU's count; later frames open the next epoch. What cannot be reached is
//! unaccounted, and the statement says so.

use std::time::{Duration, Instant};

use rackwarden_attest::evidence::Direction;

use rackwarden_attest::traffic::idx;

use super::ring::TappedFrame;

/// Kernel passed bytes, per direction (egress, ingress) and CPU.
pub type PerCpuBytes = [Vec<u64>; 2];

/// `v`'s count for `dir` and `cpu`, the row grown to reach it (CPUs appear as frames and
/// counters name them).
pub fn cell(v: &mut PerCpuBytes, dir: Direction, cpu: u32) -> &mut u64 {
    let row = &mut v[idx(dir)];
    let i = cpu as usize;
    if row.len() <= i {
        row.resize(i + 1, 0);
    }
    &mut row[i]
}

/// The reader's side of the count: cumulative bytes taken, per direction and CPU, on the
/// kernel counters' scale.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Ledger {
    pub taken: PerCpuBytes,
    /// Where the epoch in progress started, on the same scale.
    pub epoch_start: PerCpuBytes,
}

/// How long a cut waits for frames the counters say are in the ring.
pub const CUT_PATIENCE: Duration = Duration::from_millis(500);

/// Which epoch a frame taken during a cut belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Belongs {
    Ending,
    Next,
}

impl Ledger {
    /// A ledger that starts at `at` (the last committed cut, or the counters now).
    pub fn starting_at(at: PerCpuBytes) -> Ledger {
        Ledger {
            taken: at.clone(),
            epoch_start: at,
        }
    }

    /// Counts a frame taken outside a cut.
    pub fn take(&mut self, f: &TappedFrame) {
        *cell(&mut self.taken, f.dir, f.cpu) += f.bytes.len() as u64;
    }

    /// Counts a frame taken during a cut towards `target`: the ending epoch's while its CPU
    /// has not reached the target, the next one's after.
    pub fn take_towards(&mut self, f: &TappedFrame, target: &PerCpuBytes) -> Belongs {
        let goal = target[idx(f.dir)].get(f.cpu as usize).copied().unwrap_or(0);
        let taken = cell(&mut self.taken, f.dir, f.cpu);
        let belongs = if *taken < goal {
            Belongs::Ending
        } else {
            Belongs::Next
        };
        *taken += f.bytes.len() as u64;
        belongs
    }

    /// Whether every CPU has reached `target`.
    pub fn reached(&self, target: &PerCpuBytes) -> bool {
        (0..2).all(|d| {
            target[d]
                .iter()
                .enumerate()
                .all(|(c, &t)| self.taken[d].get(c).copied().unwrap_or(0) >= t)
        })
    }

    /// Whether some CPU has taken more than `counted`: a frame written but not yet counted
    /// (its program is between the two steps); the counters must be read again.
    pub fn ahead_of(&self, counted: &PerCpuBytes) -> bool {
        (0..2).any(|d| {
            self.taken[d]
                .iter()
                .enumerate()
                .any(|(c, &t)| t > counted[d].get(c).copied().unwrap_or(0))
        })
    }

    /// Closes the epoch at `target`: returns the kernel's passed bytes in it and the bytes
    /// the reader could not reach (unaccounted), per direction, and starts the next epoch at
    /// `target`. Frames never reached are written off here, so they are disclosed once.
    pub fn close(&mut self, target: &PerCpuBytes, taken_next: &PerCpuBytes) -> CutTotals {
        let mut totals = CutTotals::default();
        for dir in Direction::ALL {
            let d = idx(dir);
            for (c, &t) in target[d].iter().enumerate() {
                let start = self.epoch_start[d].get(c).copied().unwrap_or(0);
                let next = taken_next[d].get(c).copied().unwrap_or(0);
                let taken = self.taken[d]
                    .get(c)
                    .copied()
                    .unwrap_or(0)
                    .saturating_sub(next);
                totals.passed[d] += t.saturating_sub(start);
                totals.unaccounted[d] += t.saturating_sub(taken);
                if taken < t {
                    *cell(&mut self.taken, dir, c as u32) = t + next;
                }
            }
        }
        self.epoch_start = target.clone();
        totals
    }
}

/// An epoch's totals from the cut, per direction (egress, ingress).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CutTotals {
    /// What the kernel passed in the epoch (its counters' difference).
    pub passed: [u64; 2],
    /// Of that, what the reader never received: `passed - tapped`.
    pub unaccounted: [u64; 2],
}

/// Reads the counters until no CPU's reader count is ahead of them (at most `CUT_PATIENCE`).
pub fn settle_target(
    ledger: &Ledger,
    mut read: impl FnMut() -> Option<PerCpuBytes>,
) -> Option<PerCpuBytes> {
    let until = Instant::now() + CUT_PATIENCE;
    loop {
        let target = read()?;
        if !ledger.ahead_of(&target) || Instant::now() > until {
            return Some(target);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(dir: Direction, cpu: u32, len: usize) -> TappedFrame {
        TappedFrame {
            dir,
            cpu,
            seq: 0,
            ktime_ns: 0,
            bytes: vec![0; len],
        }
    }

    #[test]
    fn frames_past_a_cpus_count_open_the_next_epoch() {
        let mut l = Ledger::starting_at([vec![0, 0], vec![0, 0]]);
        let target: PerCpuBytes = [vec![100, 50], vec![0, 0]];
        let e = Direction::Egress;
        assert_eq!(l.take_towards(&frame(e, 0, 60), &target), Belongs::Ending);
        assert_eq!(l.take_towards(&frame(e, 1, 50), &target), Belongs::Ending);
        assert_eq!(l.take_towards(&frame(e, 1, 10), &target), Belongs::Next);
        assert_eq!(l.take_towards(&frame(e, 0, 40), &target), Belongs::Ending);
        assert!(l.reached(&target));
        let next: PerCpuBytes = [vec![0, 10], vec![0, 0]];
        let t = l.close(&target, &next);
        assert_eq!(t.passed, [150, 0]);
        assert_eq!(t.unaccounted, [0, 0]);
    }

    #[test]
    fn frames_never_read_are_unaccounted_once() {
        let mut l = Ledger::starting_at([vec![0], vec![0]]);
        let target: PerCpuBytes = [vec![100], vec![0]];
        l.take(&frame(Direction::Egress, 0, 70));
        let t = l.close(&target, &[vec![0], vec![0]]);
        assert_eq!(t.unaccounted, [30, 0]);
        // The next epoch starts clean: the 30 bytes are not disclosed twice.
        l.take(&frame(Direction::Egress, 0, 20));
        let t = l.close(&[vec![120], vec![0]], &[vec![0], vec![0]]);
        assert_eq!(t.passed, [20, 0]);
        assert_eq!(t.unaccounted, [0, 0]);
    }
}
