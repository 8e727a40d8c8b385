//! Budget: the caps a host enforces stay within its rack's agreement (rate and burst, both
//! directions), and the bytes that passed stay within cap x elapsed + burst, counted from
//! the last statement stored before this one, across a gap too.

use rackwarden_attest::{evidence::LimiterReport, statement::Statement};

use super::{FindingCode as C, Judge, Status};

/// (passed bytes, cap rate, burst) of one direction.
pub(crate) fn counters_of(s: &Statement, dir: &str) -> Option<(u64, u64, u64)> {
    let LimiterReport::Present(e) = &s.predicate.limiter else {
        return None;
    };
    let c = e.counters.iter().find(|c| c.direction.name() == dir)?;
    let cap = e.caps.iter().find(|c| c.direction.name() == dir)?;
    Some((
        c.counters.passed_bytes,
        cap.rate_bytes_per_s,
        cap.burst_bytes,
    ))
}

/// The byte bound of one epoch: the larger of the two caps in force (a cap may change
/// within it) times the elapsed time, plus the bucket.
pub(crate) fn epoch_bound(rate: u64, prev_rate: u64, burst: u64, elapsed_ms: u64) -> f64 {
    rate.max(prev_rate) as f64 * (elapsed_ms as f64 / 1000.0) + burst as f64
}

/// `elapsed_ms`: the time since the baseline's end the bound is computed over (the claim,
/// capped by what the verifier saw: `clock::elapsed_ms`).
pub(super) fn check(
    j: &mut Judge,
    st: &Statement,
    baseline: Option<&Statement>,
    elapsed_ms: Option<u64>,
) {
    let p = &st.predicate;
    let LimiterReport::Present(e) = &p.limiter else {
        return;
    };
    match j.policy.racks.get(&p.rack_id) {
        None => j.add(
            C::NoAgreement,
            Status::Contraindicated,
            format!("no agreed cap for rack `{}`", p.rack_id),
        ),
        Some(agreed) => {
            for c in &e.caps {
                let limit = if c.direction.name() == "egress" {
                    agreed.egress_bytes_per_s
                } else {
                    agreed.ingress_bytes_per_s
                };
                if c.burst_bytes > agreed.max_burst_bytes {
                    j.add(
                        C::BurstAboveAgreement,
                        Status::Contraindicated,
                        format!(
                            "{} burst {} B above the agreed {} B",
                            c.direction.name(),
                            c.burst_bytes,
                            agreed.max_burst_bytes
                        ),
                    );
                }
                if c.rate_bytes_per_s > limit {
                    j.add(
                        C::CapAboveAgreement,
                        Status::Contraindicated,
                        format!(
                            "{} cap {} B/s above the agreed {} B/s",
                            c.direction.name(),
                            c.rate_bytes_per_s,
                            limit
                        ),
                    );
                }
            }
        }
    }
    let (Some(prev), Some(elapsed_ms)) = (baseline, elapsed_ms) else {
        return;
    };
    let elapsed_s = elapsed_ms as f64 / 1000.0;
    for dir in ["egress", "ingress"] {
        let (Some((now, rate, burst)), Some((before, prate, _))) =
            (counters_of(st, dir), counters_of(prev, dir))
        else {
            continue;
        };
        let Some(delta) = now.checked_sub(before) else {
            j.add(
                C::CountersReset,
                Status::Contraindicated,
                format!("{dir} passed bytes went from {before} to {now}"),
            );
            continue;
        };
        let bound = epoch_bound(rate, prate, burst, elapsed_ms);
        if delta as f64 > bound {
            j.add(
                C::CountersAboveCap,
                Status::Contraindicated,
                format!("{dir}: {delta} B passed in {elapsed_s:.3} s, bound {bound:.0} B"),
            );
        }
        if dir == "ingress" {
            let allowed = j.policy.max_epoch_fraction * j.policy.trainable_state_bytes as f64;
            if delta as f64 > allowed {
                j.add(
                    C::StateBoundExceeded,
                    Status::Contraindicated,
                    format!(
                        "{delta} B received in one epoch, more than {allowed:.0} B ({} of the trainable state)",
                        j.policy.max_epoch_fraction
                    ),
                );
            }
        }
    }
}
