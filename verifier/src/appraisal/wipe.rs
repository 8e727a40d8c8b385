//! Wipe: was memory wiped completely, bound to this epoch's nonce, with what can be
//! recomputed adding up, and is the host's last counted wipe within the policy's interval.
//! Returns whether this statement's wipe counts (resets the wipe clock).

use rackwarden_attest::{
    evidence::{WipeDeviceReport, WipeReport, WipeStatus},
    statement::{Challenge, Statement},
    units::{fmt_duration, fmt_size, fmt_unix_ms},
};

use super::{Aspect, Context, FindingCode as C, Judge, Status};

/// `end_ms`: the epoch's end as the verifier can vouch for it (never after receipt).
pub(super) fn check(j: &mut Judge, st: &Statement, ctx: &Context, end_ms: u64) -> bool {
    let p = &st.predicate;
    let max = j.policy.max_wipe_interval.as_millis() as u64;
    let complete = match &p.wipe {
        None => {
            j.add(C::NoWipe, Status::Warning, "no wipe in this epoch");
            false
        }
        Some(w) => judge_report(j, w, &p.challenge),
    };
    // Only a wipe keyed by a nonce this verifier issued, to this host, unused and unexpired,
    // resets the wipe clock: a nonce the host chose itself proves nothing about freshness.
    let bound_to_ours = matches!(p.challenge, Challenge::Nonce { .. })
        && !j.has(Aspect::Freshness, Status::Contraindicated);
    if complete && !bound_to_ours {
        j.add(
            C::WipeNotCounted,
            Status::Warning,
            "the wipe is not keyed by a nonce this verifier issued: it does not reset the wipe clock",
        );
    }
    let counts = complete && bound_to_ours;
    if !counts {
        let since = ctx.last_wipe_ms.unwrap_or(ctx.enrolled_ms);
        if end_ms.saturating_sub(since) > max {
            j.add(
                C::WipeOverdue,
                Status::Contraindicated,
                format!(
                    "last complete wipe at {}, more than {} before this epoch's end",
                    fmt_unix_ms(since),
                    fmt_duration(j.policy.max_wipe_interval)
                ),
            );
        }
    }
    counts
}

/// Whether the report is a complete wipe within policy.
fn judge_report(j: &mut Judge, w: &WipeReport, challenge: &Challenge) -> bool {
    let mut ok = true;
    if let Challenge::Nonce { nonce } = challenge
        && &w.nonce != nonce
    {
        j.add(
            C::WipeNotBound,
            Status::Contraindicated,
            "the wipe's nonce is not this epoch's challenge",
        );
        ok = false;
    }
    if w.interrupted {
        j.add(
            C::WipeInterrupted,
            Status::Contraindicated,
            "the wipe was interrupted",
        );
        ok = false;
    }
    if w.devices.is_empty() {
        j.add(
            C::WipeEmpty,
            Status::Contraindicated,
            "the wipe report names no device",
        );
        ok = false;
    }
    for backend in &j.policy.required_wipe_backends {
        let covered = w.devices.iter().any(|d| {
            &d.backend == backend && d.status == WipeStatus::Complete && d.bytes_verified > 0
        });
        if !covered {
            let seen: Vec<String> = w
                .devices
                .iter()
                .map(|d| format!("{} {}", d.backend, d.status))
                .collect();
            j.add(
                C::WipeDeviceMissing,
                Status::Contraindicated,
                format!(
                    "the policy requires a complete `{backend}` wipe; the report has [{}]",
                    seen.join(", ")
                ),
            );
            ok = false;
        }
    }
    for d in &w.devices {
        ok &= judge_device(j, d);
    }
    ok
}

/// One device of a wipe report: whether it adds up, completed, matched and left no more
/// residue than the policy allows.
fn judge_device(j: &mut Judge, d: &WipeDeviceReport) -> bool {
    let mut ok = true;
    // What can be recomputed is: a report that does not add up counts for nothing, and
    // residue is judged on total - verified whatever the report claims.
    let recomputed = d.bytes_total.saturating_sub(d.bytes_verified);
    if d.bytes_verified > d.bytes_filled
        || d.bytes_filled > d.bytes_total
        || d.residue_bytes != recomputed
    {
        j.add(
            C::WipeInconsistent,
            Status::Contraindicated,
            format!(
                "{}: total {}, filled {}, verified {}, residue claimed {} (total - verified = {})",
                d.device,
                fmt_size(d.bytes_total),
                fmt_size(d.bytes_filled),
                fmt_size(d.bytes_verified),
                fmt_size(d.residue_bytes),
                fmt_size(recomputed)
            ),
        );
        ok = false;
    }
    // A failed device says nothing of its memory (a GPU whose driver would not start
    // reports no size at all), so its residue cannot be judged: it was not wiped.
    if d.status == WipeStatus::Failed {
        j.add(
            C::WipeFailed,
            Status::Contraindicated,
            format!(
                "{}: the wipe failed: {}",
                d.device,
                d.detail.as_deref().unwrap_or("no detail")
            ),
        );
        ok = false;
    }
    if d.mismatches > 0 {
        j.add(
            C::WipeMismatch,
            Status::Contraindicated,
            format!("{}: {} mismatching blocks", d.device, d.mismatches),
        );
        ok = false;
    }
    let max = match d.backend.as_str() {
        "host" => Some(j.policy.max_residue_host),
        "gpu" => Some(j.policy.max_residue_gpu),
        _ => None,
    };
    let residue = d.residue_bytes.max(recomputed);
    if let Some(max) = max
        && residue > max
    {
        j.add(
            C::ResidueAboveMax,
            Status::Contraindicated,
            format!(
                "{}: residue {} above the allowed {} ({})",
                d.device,
                fmt_size(residue),
                fmt_size(max),
                d.status
            ),
        );
        ok = false;
    }
    ok
}
