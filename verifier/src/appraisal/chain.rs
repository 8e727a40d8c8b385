//! Chain: does the statement extend the host's stored chain: one statement per seq, the
//! previous one stored, its digest named as `prev`, and time moving forward. Also what the
//! host disclosed about its own trail.

use rackwarden_attest::{statement::Statement, units::fmt_unix_ms};

use super::{Context, FindingCode as C, Judge, Status};

pub(super) fn check(j: &mut Judge, st: &Statement, ctx: &Context) {
    let p = &st.predicate;
    if ctx.same_seq_others > 0 {
        j.add(
            C::Fork,
            Status::Contraindicated,
            format!("another statement with seq {} is already stored", p.seq),
        );
    }
    if p.seq == 0 {
        return;
    }
    if ctx.predecessors.is_empty() {
        j.add(
            C::Gap,
            Status::Warning,
            format!("seq {} has not arrived (yet)", p.seq - 1),
        );
    } else if let Some((_, pred_end)) = ctx.predecessors.iter().find(|(d, _)| *d == p.prev) {
        if p.epoch_start_unix_ms < *pred_end {
            j.add(
                C::TimeBackwards,
                Status::Contraindicated,
                format!(
                    "the epoch starts at {}, before the previous one ended at {}",
                    fmt_unix_ms(p.epoch_start_unix_ms),
                    fmt_unix_ms(*pred_end)
                ),
            );
        }
    } else {
        j.add(
            C::BrokenPrev,
            Status::Contraindicated,
            format!(
                "prev {} is not the digest of the stored seq {}",
                p.prev,
                p.seq - 1
            ),
        );
    }
}

/// What the host disclosed about its own trail: damage to its log, and epochs cut short
/// (a crash mid-wipe leaves that epoch unproven; the statement carrying it starts over).
pub(super) fn check_incidents(j: &mut Judge, st: &Statement) {
    use rackwarden_attest::evidence::Incident;
    for i in &st.predicate.incidents {
        match i {
            Incident::TornLogTail { offset, length, .. }
            | Incident::CorruptLogLine { offset, length, .. } => j.add(
                C::LogDamageDisclosed,
                Status::Warning,
                format!(
                    "the host's log has {} of damaged bytes at offset {offset} (disclosed)",
                    rackwarden_attest::units::fmt_size(*length)
                ),
            ),
            Incident::EpochInterrupted {
                seq,
                state,
                started_unix_ms,
                ..
            } => j.add(
                C::EpochInterrupted,
                Status::Warning,
                format!(
                    "epoch {seq} (started {}) was interrupted while {state}; this epoch redid it",
                    fmt_unix_ms(*started_unix_ms)
                ),
            ),
            // The host accuses this verifier; the verdict carries it to the page and to
            // whoever reads the record. Both checkpoints are in the statement.
            Incident::VerifierLogInconsistent {
                detected_unix_ms,
                error,
                ..
            } => j.add(
                C::VerifierLogInconsistent,
                Status::Warning,
                format!(
                    "found by the host at {}: {error}",
                    fmt_unix_ms(*detected_unix_ms)
                ),
            ),
        }
    }
}
