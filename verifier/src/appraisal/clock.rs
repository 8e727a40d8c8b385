//! Clock: the epoch times a statement claims are the host's word; what this verifier saw is
//! not. A challenged epoch cannot end before its nonce was issued (the wipe is keyed by
//! it), and no epoch ends after its statement was received. Claimed times outside that
//! window by more than the policy's `max_clock_skew` are a finding naming both clocks, and
//! the byte bound never takes a longer elapsed time than the verifier could have seen.
//!
//! The epoch's claimed *start* is not anchored to the nonce: the daemon's epoch starts where
//! the previous one ended and asks for its nonce only when it wipes, at the end, so an honest
//! start always precedes its nonce. The budget counts from the baseline's end, not from the
//! claimed start, and that end is anchored instead.

use std::time::Duration;

use rackwarden_attest::{
    statement::Statement,
    units::{fmt_duration, fmt_unix_ms},
};

use super::{Context, FindingCode as C, Judge, NonceLookup, Status};

/// When this verifier issued the nonce the statement answers, if it issued it to this host.
fn nonce_issued_ms(st: &Statement, ctx: &Context) -> Option<u64> {
    match &ctx.nonce {
        NonceLookup::Found(n)
            if n.rack == st.predicate.rack_id && n.host == st.predicate.host_id =>
        {
            Some(n.issued_ms)
        }
        _ => None,
    }
}

fn skew_ms(j: &Judge) -> u64 {
    j.policy.max_clock_skew.as_millis() as u64
}

fn apart(a: u64, b: u64) -> String {
    fmt_duration(Duration::from_millis(a.abs_diff(b)))
}

/// Adds a `clock_skew` finding for each claimed time outside what the verifier saw.
/// `received_ms` is the receipt time.
pub(super) fn check(j: &mut Judge, st: &Statement, ctx: &Context, received_ms: u64) {
    let end = st.predicate.epoch_end_unix_ms;
    let skew = skew_ms(j);
    let allowance = fmt_duration(j.policy.max_clock_skew);
    if end > received_ms.saturating_add(skew) {
        j.add(
            C::ClockSkew,
            Status::Contraindicated,
            format!(
                "the epoch ends at {} by the host's clock, {} after the statement was received at {} by the verifier's (allowed: {allowance})",
                fmt_unix_ms(end),
                apart(end, received_ms),
                fmt_unix_ms(received_ms),
            ),
        );
    }
    if let Some(issued) = nonce_issued_ms(st, ctx)
        && end.saturating_add(skew) < issued
    {
        j.add(
            C::ClockSkew,
            Status::Contraindicated,
            format!(
                "the epoch ends at {} by the host's clock, {} before its nonce was issued at {} by the verifier's (allowed: {allowance})",
                fmt_unix_ms(end),
                apart(end, issued),
                fmt_unix_ms(issued),
            ),
        );
    }
}

/// The elapsed time the byte bound is computed over: the claimed time since the baseline's
/// end, but never more than the verifier saw. This epoch ended by its receipt; a baseline
/// that answered our nonce ended after that nonce was issued (plus the skew allowance).
/// A baseline without one has no verifier-observed end and its claim stands (its own
/// receipt bounds it only from above, which bounds nothing here).
pub(super) fn elapsed_ms(
    j: &Judge,
    st: &Statement,
    ctx: &Context,
    received_ms: u64,
) -> Option<u64> {
    let base = ctx.baseline.as_ref()?;
    let claimed = st
        .predicate
        .epoch_end_unix_ms
        .saturating_sub(base.predicate.epoch_end_unix_ms);
    let observed = ctx.baseline_earliest_end_ms.map(|earliest| {
        received_ms
            .saturating_sub(earliest)
            .saturating_add(skew_ms(j))
    });
    Some(observed.map_or(claimed, |o| o.min(claimed)))
}

/// The latest the epoch can have ended by the verifier's clock: its claim, or its receipt
/// when the claim lies later (a claimed end in the future must not stop the wipe clock).
pub(super) fn anchored_end_ms(st: &Statement, received_ms: u64) -> u64 {
    st.predicate.epoch_end_unix_ms.min(received_ms)
}
