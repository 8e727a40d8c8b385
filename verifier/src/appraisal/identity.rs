//! Identity: is the signing key current, and is the producing daemon a build the policy
//! accepts (the signature itself was checked before appraisal, in `service::prepare`).

use rackwarden_attest::{evidence::LimiterReport, statement::Statement};

use super::{Context, FindingCode as C, Judge, Status};

/// A key retired before the epoch ended no longer speaks for the host.
pub(super) fn check_key(j: &mut Judge, st: &Statement, ctx: &Context) {
    if let Some(r) = ctx.retired_ms
        && st.predicate.epoch_end_unix_ms > r
    {
        j.add(
            C::RetiredKey,
            Status::Contraindicated,
            format!(
                "key {} was retired at {}",
                ctx.keyid,
                rackwarden_attest::units::fmt_unix_ms(r)
            ),
        );
    }
}

/// The daemon builds the policy accepts, if it pins them.
pub(super) fn check_daemon(j: &mut Judge, st: &Statement) {
    let p = &st.predicate;
    if let Some(ok) = &j.policy.accepted_daemon_digests
        && !ok.contains(&p.producer.binary_sha3_256)
    {
        j.add(
            C::DaemonNotAccepted,
            Status::Contraindicated,
            format!(
                "{} {} (sha3-256 {}) is not a daemon build the policy accepts",
                p.producer.name, p.producer.version, p.producer.binary_sha3_256
            ),
        );
    }
}

/// The eBPF programs the policy accepts, if it pins their tags.
pub(super) fn check_programs(j: &mut Judge, st: &Statement) {
    if let (Some(ok), LimiterReport::Present(e)) =
        (&j.policy.accepted_program_tags, &st.predicate.limiter)
    {
        for prog in e.programs.iter().filter(|g| !ok.contains(&g.tag)) {
            j.add(
                C::ProgramNotAccepted,
                Status::Contraindicated,
                format!(
                    "program {} #{} has tag {}, not one the policy accepts",
                    prog.name, prog.id, prog.tag
                ),
            );
        }
    }
}
