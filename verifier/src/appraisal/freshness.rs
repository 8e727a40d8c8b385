//! Freshness, where a nonce is checked: issued by this verifier, for this host, not used
//! before, not expired. Returns whether the nonce is fresh (the service then consumes it).

use rackwarden_attest::{
    statement::{Challenge, Statement},
    units::fmt_unix_ms,
};

use super::{Context, FindingCode as C, Judge, NonceLookup, Status};
use crate::store::NonceRecord;

pub(super) fn check(j: &mut Judge, st: &Statement, ctx: &Context, now_ms: u64) -> bool {
    let p = &st.predicate;
    match (&p.challenge, &ctx.nonce) {
        (Challenge::Unchallenged, _) | (Challenge::Nonce { .. }, NonceLookup::NotNamed) => {
            j.add(
                C::Unchallenged,
                Status::Warning,
                "the statement answers no challenge",
            );
            false
        }
        (Challenge::Nonce { .. }, NonceLookup::Unknown) => {
            j.add(
                C::NonceUnknown,
                Status::Contraindicated,
                "nonce was not issued by this verifier",
            );
            false
        }
        (Challenge::Nonce { .. }, NonceLookup::Found(n)) => {
            if n.rack != p.rack_id || n.host != p.host_id {
                j.add(
                    C::NonceOtherHost,
                    Status::Contraindicated,
                    format!("nonce was issued for {}/{}", n.rack, n.host),
                );
            } else if let NonceRecord {
                used_ms: Some(used),
                ..
            } = n
            {
                j.add(
                    C::NonceReused,
                    Status::Contraindicated,
                    format!("nonce already used at {}", fmt_unix_ms(*used)),
                );
            } else if now_ms > n.expires_ms {
                j.add(
                    C::NonceExpired,
                    Status::Contraindicated,
                    format!(
                        "nonce expired at {}, the statement was received at {}",
                        fmt_unix_ms(n.expires_ms),
                        fmt_unix_ms(now_ms)
                    ),
                );
            } else {
                return true;
            }
            false
        }
    }
}
