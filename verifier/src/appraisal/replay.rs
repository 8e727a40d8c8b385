//! Replay: whether the opened exchanges are what the precommitted model produces (issue
//! 28). The replay service (`rackwarden-replay`, run by the verifier's operator on hardware
//! they trust) stores, per opened epoch, each exchange record's replay without a tolerance;
//! here each is judged at `[policy.replay] tolerance`. A statement judges the replays stored
//! in its window (after the host's previous stored statement ended, up to this one's end),
//! from stored rows only, so `recheck` re-derives it and a recheck under another tolerance
//! says what that tolerance would have found.

use rackwarden_sampler::verdict::{ReplayFailure, ReplayJudgement};

use super::{FindingCode as C, Judge, Status};
use crate::store::ReplayRow;

/// The replays stored in the statement's window.
#[derive(Debug, Clone, Default)]
pub struct ReplayContext {
    pub replays: Vec<ReplayRow>,
}

/// Whether the replay aspect is in a verdict: a replay was stored in its window.
pub(super) fn in_play(ctx: &ReplayContext) -> bool {
    !ctx.replays.is_empty()
}

pub(super) fn check(j: &mut Judge, ctx: &ReplayContext) {
    let tolerance = j.policy.replay.tolerance.get();
    for row in &ctx.replays {
        for r in &row.records {
            match r.replay.judge(tolerance) {
                ReplayJudgement::Failed(f) => {
                    let what = match &f {
                        ReplayFailure::Structural(_) => "cannot be the server's",
                        ReplayFailure::Diverged { .. } => "is not the model's draw",
                    };
                    j.add(
                        C::ReplayFailed,
                        Status::Contraindicated,
                        format!(
                            "epoch {} record {}: the response {what}: {f}",
                            row.seq, r.index
                        ),
                    );
                }
                ReplayJudgement::Unjudged { bytes } => j.add(
                    C::ReplayUnjudged,
                    Status::Warning,
                    format!(
                        "epoch {} record {}: {bytes} bytes sent for a request still pending at the cut are not judged here",
                        row.seq, r.index
                    ),
                ),
                ReplayJudgement::Passed { .. } | ReplayJudgement::NotGenerated => {}
            }
        }
    }
}

/// One epoch's replay in figures, at a tolerance (the page).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct ReplayFigures {
    /// The tolerance the figures are at.
    pub tolerance: f64,
    /// Exchange records opened and replayed.
    pub replayed: u64,
    /// Of them, completions scored token by token (the rest got a fixed error).
    pub generated: u64,
    pub failed: u64,
    /// Records holding output of a response in flight at the cut, not judged.
    pub unjudged: u64,
    /// Tokens of the passed completions.
    pub tokens: u64,
    /// Bits a host could have hidden in the passed completions at this tolerance.
    pub covert_bits: f64,
}

pub fn figures(row: &ReplayRow, tolerance: f64) -> ReplayFigures {
    let mut f = ReplayFigures {
        tolerance,
        ..ReplayFigures::default()
    };
    for r in &row.records {
        f.replayed += 1;
        match r.replay.judge(tolerance) {
            ReplayJudgement::Passed {
                tokens,
                covert_bits,
            } => {
                f.generated += 1;
                f.tokens += tokens;
                f.covert_bits += covert_bits;
            }
            ReplayJudgement::NotGenerated => {}
            ReplayJudgement::Unjudged { .. } => f.unjudged += 1,
            ReplayJudgement::Failed(_) => f.failed += 1,
        }
    }
    f
}
