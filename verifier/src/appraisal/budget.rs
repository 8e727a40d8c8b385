//! Budget: the caps a host enforces stay within its rack's agreement (rate and burst, both
//! directions), and the bytes that passed stay within cap x elapsed + burst, counted from
//! the last statement stored before this one, across a gap too.

use rackwarden_attest::{
    evidence::LimiterReport,
    statement::Statement,
    units::{fmt_bytes, fmt_duration, fmt_rate, fmt_size},
};

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
                            "{} burst {} above the agreed {}",
                            c.direction.name(),
                            fmt_size(c.burst_bytes),
                            fmt_size(agreed.max_burst_bytes)
                        ),
                    );
                }
                if c.rate_bytes_per_s > limit {
                    j.add(
                        C::CapAboveAgreement,
                        Status::Contraindicated,
                        format!(
                            "{} cap {} above the agreed {}",
                            c.direction.name(),
                            fmt_rate(c.rate_bytes_per_s as f64),
                            fmt_rate(limit as f64)
                        ),
                    );
                }
            }
        }
    }
    let (Some(prev), Some(elapsed_ms)) = (baseline, elapsed_ms) else {
        return;
    };
    let elapsed = fmt_duration(std::time::Duration::from_millis(elapsed_ms));
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
                format!(
                    "{dir}: the bytes passed went from {} to {}",
                    fmt_size(before),
                    fmt_size(now)
                ),
            );
            continue;
        };
        let bound = epoch_bound(rate, prate, burst, elapsed_ms);
        if delta as f64 > bound {
            j.add(
                C::CountersAboveCap,
                Status::Contraindicated,
                format!(
                    "{dir}: {} passed in {elapsed}, bound {}",
                    fmt_size(delta),
                    fmt_bytes(bound.round())
                ),
            );
        }
        if dir == "ingress" {
            let allowed = j.policy.max_epoch_fraction * j.policy.trainable_state_bytes as f64;
            if delta as f64 > allowed {
                j.add(
                    C::StateBoundExceeded,
                    Status::Contraindicated,
                    format!(
                        "{} received in one epoch, more than {} ({} of the trainable state)",
                        fmt_size(delta),
                        fmt_bytes(allowed.round()),
                        j.policy.max_epoch_fraction
                    ),
                );
            }
        }
    }
}
