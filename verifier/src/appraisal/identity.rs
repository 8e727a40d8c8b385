//! Identity: is the signing key current, and is the producing daemon a build the policy
//! accepts (the signature itself was checked before appraisal, in `envelope_check::prepare`).

use rackwarden_attest::{
    evidence::LimiterReport,
    keys,
    statement::{EpochPredicate, NextKey, Statement},
};

use super::{Aspect, Context, FindingCode as C, Judge, Status};

/// A key retired before the epoch ended no longer speaks for the host; a key the host
/// rotated away from speaks up to the statement that named its successor, and the
/// successor from the next seq on (by seq, not time: a backdated epoch changes nothing).
pub(super) fn check_key(j: &mut Judge, st: &Statement, ctx: &Context) {
    let seq = st.predicate.seq;
    match (ctx.retired_after_seq, ctx.retired_ms) {
        (Some(last), _) if seq > last => j.add(
            C::RetiredKey,
            Status::Contraindicated,
            format!(
                "key {} was rotated away from at seq {last}: it signs no later seq",
                ctx.keyid
            ),
        ),
        (None, Some(r)) if st.predicate.epoch_end_unix_ms > r => j.add(
            C::RetiredKey,
            Status::Contraindicated,
            format!(
                "key {} was retired at {}",
                ctx.keyid,
                rackwarden_attest::units::fmt_unix_ms(r)
            ),
        ),
        _ => {}
    }
    if let Some(first) = ctx.from_seq
        && seq < first
    {
        j.add(
            C::KeyNotYetValid,
            Status::Contraindicated,
            format!(
                "key {} speaks for this host from seq {first} on, after the rotation",
                ctx.keyid
            ),
        );
    }
}

/// A statement naming a `next_key`: the rotation it asks for, if it is accepted. The new
/// key must be the one its keyid names, no host's key yet, and announced by the host's
/// current key (checked by `check_key` first). A resent rotation statement is a duplicate
/// before it gets here; `recheck` replays it against a store that already holds the new
/// key, which is this same rotation (same host, from the next seq) and is accepted again
/// with nothing left to apply.
pub(super) fn check_next_key(j: &mut Judge, st: &Statement, ctx: &Context) -> Option<NextKey> {
    let nk = st.predicate.next_key.as_ref()?;
    let p = &st.predicate;
    let refusal = next_key_refusal(nk, p, ctx);
    match refusal {
        Some(why) => {
            j.add(
                C::NextKeyRefused,
                Status::Contraindicated,
                format!("next key {}: {why}", nk.keyid),
            );
            None
        }
        // The signing key itself may not speak for this seq: then it cannot hand over.
        None if j.has(Aspect::Identity, Status::Contraindicated) => {
            j.add(
                C::NextKeyRefused,
                Status::Contraindicated,
                format!(
                    "next key {}: announced with a key that does not speak for seq {}",
                    nk.keyid, p.seq
                ),
            );
            None
        }
        // Already recorded (a replay by `recheck`): nothing to apply.
        None if ctx.next_key_enrolled.is_some() => None,
        None => Some(nk.clone()),
    }
}

/// Why the named next key cannot be accepted, or `None`.
fn next_key_refusal(nk: &NextKey, p: &EpochPredicate, ctx: &Context) -> Option<String> {
    let vk = match keys::parse_verifying_key(&nk.public_key_pem) {
        Ok(vk) => vk,
        Err(e) => return Some(format!("its public key does not parse: {e}")),
    };
    let actual = keys::keyid(&vk);
    if actual != nk.keyid {
        return Some(format!("the public key's key id is {actual}"));
    }
    if nk.keyid == ctx.keyid {
        return Some("it is the key the statement is signed with".into());
    }
    if let Some(k) = &ctx.next_key_enrolled {
        if k.rack != p.rack_id || k.host != p.host_id {
            return Some(format!("it belongs to {}/{}", k.rack, k.host));
        }
        // Retired since by an operator or not: it is still the key this statement named.
        let this_rotation = k.from_seq == Some(p.seq + 1) && ctx.retired_after_seq == Some(p.seq);
        if !this_rotation {
            return Some(match k.retired_ms {
                Some(r) => format!(
                    "it was retired at {}",
                    rackwarden_attest::units::fmt_unix_ms(r)
                ),
                None => "it is already enrolled for this host".into(),
            });
        }
        return None;
    }
    // Not enrolled: the signing key must be the host's current one (not one rotated away
    // from at this seq by another statement: a fork must not give the host two keys).
    if ctx.retired_ms.is_some() {
        return Some("the signing key is no longer the host's current key".into());
    }
    None
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
