//! Root of trust: is the statement bound to a TPM the verifier enrolled, and is what that TPM
//! measured (IMA into PCR 10, the boot into PCRs 0-7) what the policy accepts?
//!
//! The level granted comes only from what verifies here, never from the statement's own
//! `root_of_trust` claim:
//! - `tpm`: a quote by the host's enrolled AK, over this statement's chain digest, whose
//!   PCR digest is the digest of the PCR values shipped;
//! - `tpm_ima`: and PCR 10 is the replay of the IMA entries shipped, continuing the host's
//!   last verified position in this boot, and every entry is allowed by `[policy.runtime]`.

use std::collections::BTreeMap;

use rackwarden_attest::statement::Statement;
use rackwarden_attest::tpm::{
    AkPublic, DecodedSidecar, ImaEntry, MeasuredBoot, QuoteError, QuoteInfo, TpmSidecar,
    TrustLevel, replay_pcr10, verify_quote,
};

use super::{FindingCode as C, Judge, Status};
use crate::config::RuntimePolicy;
use crate::store::{TpmBoot, TpmEnrollment, TpmPosition};
use rackwarden_attest::result::GuardBasis;

/// What the store knows for the TPM check.
#[derive(Debug, Clone, Default)]
pub struct TpmContext {
    /// The sidecar that came beside the envelope.
    pub sidecar: Option<TpmSidecar>,
    /// The host's enrolled AK.
    pub enrollment: Option<TpmEnrollment>,
    /// How far the host's IMA list is verified.
    pub position: Option<TpmPosition>,
    /// The statement's chain digest: what its quote must have as qualifying data.
    pub statement_digest: [u8; 32],
    /// The host's last boot whose event log verified.
    pub boot: Option<TpmBoot>,
}

impl TpmContext {
    /// Whether a TPM is in play for this statement (then the verdict's vector has the
    /// `root_of_trust` aspect).
    pub fn in_play(&self, st: &Statement, min: TrustLevel) -> bool {
        self.sidecar.is_some()
            || self.enrollment.is_some()
            || min > TrustLevel::None
            || st
                .predicate
                .root_of_trust
                .as_ref()
                .is_some_and(|r| r.is_tpm())
    }
}

/// The outcome: the level granted and the IMA position to store (when the replay verified).
pub(crate) struct TpmOutcome {
    pub level: TrustLevel,
    pub position: Option<TpmPosition>,
    /// A boot whose newly shipped event log verified: stored for the boot's later statements.
    pub boot: Option<TpmBoot>,
    /// What the daemon's sealed guard rests on (`None`: nothing sealed, or no verified boot).
    pub guard: Option<GuardBasis>,
}

const PCR_IMA: u8 = 10;

pub(crate) fn check(j: &mut Judge, st: &Statement, ctx: &TpmContext) -> TpmOutcome {
    let (mut outcome, measured) = verified_level(j, st, ctx);
    outcome.guard = super::boot::guard_basis(j, st, measured.as_ref(), outcome.level);
    let min = j.policy.min_root_of_trust;
    if outcome.level < min {
        j.add(
            C::RootOfTrustBelowPolicy,
            Status::Contraindicated,
            format!(
                "verified root of trust is `{}`; the policy requires `{}`{}",
                outcome.level.name(),
                min.name(),
                claimed_reason(st)
            ),
        );
    }
    outcome
}

/// What the host said about a missing TPM, to show beside a level below policy.
fn claimed_reason(st: &Statement) -> String {
    match &st.predicate.root_of_trust {
        Some(rackwarden_attest::tpm::RootOfTrust::None { reason }) => {
            format!(" (the host says: {reason})")
        }
        Some(_) => String::new(),
        None => " (the statement says nothing of a root of trust)".into(),
    }
}

const NONE: (TpmOutcome, Option<MeasuredBoot>) = (
    TpmOutcome {
        level: TrustLevel::None,
        position: None,
        boot: None,
        guard: None,
    },
    None,
);

/// The level granted, and the boot the statement is judged by (for the guard).
fn verified_level(
    j: &mut Judge,
    st: &Statement,
    ctx: &TpmContext,
) -> (TpmOutcome, Option<MeasuredBoot>) {
    let claims_tpm = st
        .predicate
        .root_of_trust
        .as_ref()
        .is_some_and(|r| r.is_tpm());
    let Some(sidecar) = &ctx.sidecar else {
        if let Some(e) = &ctx.enrollment {
            j.add(
                C::QuoteMissing,
                Status::Contraindicated,
                format!(
                    "AK {} is enrolled for this host, but the statement came without a quote",
                    e.ak_name
                ),
            );
        } else if claims_tpm {
            j.add(
                C::QuoteMissing,
                Status::Warning,
                "the statement says the host has a TPM, but came without a quote",
            );
        }
        return NONE;
    };
    let Some(enrollment) = &ctx.enrollment else {
        j.add(
            C::AkNotEnrolled,
            Status::Warning,
            "a quote came, but no AK is enrolled for this host (it enrols over /v1/tpm/enroll)",
        );
        return NONE;
    };
    let Some((info, decoded)) = verify(j, sidecar, enrollment, &ctx.statement_digest) else {
        return NONE;
    };
    if !info.safe {
        j.add(
            C::TpmClockUnsafe,
            Status::Warning,
            format!("clockInfo.safe is clear (clock {} ms)", info.clock),
        );
    }
    check_boot(j, &decoded);
    let boot = super::boot::check(j, st, ctx.boot.as_ref(), &info, &decoded);
    let position = check_ima(j, st, ctx, &info, &decoded);
    let level = match (&position, &j.policy.runtime) {
        (Some(_), Some(_)) if !j.has(super::Aspect::RootOfTrust, Status::Contraindicated) => {
            TrustLevel::TpmIma
        }
        _ => TrustLevel::Tpm,
    };
    (
        TpmOutcome {
            level,
            position,
            boot: boot.store,
            guard: None,
        },
        boot.measured,
    )
}

/// The quote: AK signature, qualifying data = this statement's digest, PCR digest.
fn verify(
    j: &mut Judge,
    sidecar: &TpmSidecar,
    enrollment: &TpmEnrollment,
    pae: &[u8; 32],
) -> Option<(QuoteInfo, DecodedSidecar)> {
    let decoded = match sidecar.decode() {
        Ok(d) => d,
        Err(e) => {
            j.add(C::QuoteInvalid, Status::Contraindicated, e.to_string());
            return None;
        }
    };
    let ak = match hex::decode(&enrollment.ak_public)
        .ok()
        .and_then(|b| AkPublic::parse(&b).ok())
    {
        Some(ak) => ak,
        None => {
            j.add(
                C::QuoteInvalid,
                Status::Contraindicated,
                "the enrolled AK's public area does not parse (re-enrol the host)",
            );
            return None;
        }
    };
    match verify_quote(&ak, &decoded.quote, &decoded.signature, pae, &decoded.pcrs) {
        Ok(info) => Some((info, decoded)),
        Err(e) => {
            let code = match &e {
                QuoteError::Malformed(_) | QuoteError::BadSignature => C::QuoteInvalid,
                QuoteError::ExtraDataMismatch { .. } => C::QuoteNotForStatement,
                QuoteError::PcrDigestMismatch { .. }
                | QuoteError::MissingPcr(_)
                | QuoteError::SelectionMismatch { .. } => C::PcrValuesMismatch,
            };
            j.add(code, Status::Contraindicated, e.to_string());
            None
        }
    }
}

/// Boot PCRs against the policy's reference values (none configured: not judged; the page
/// says what stays unverified then).
fn check_boot(j: &mut Judge, d: &DecodedSidecar) {
    let reference: BTreeMap<u8, String> = j.policy.boot_pcrs.clone();
    for (pcr, want) in reference {
        match d.pcrs.get(pcr) {
            None => j.add(
                C::PcrValuesMismatch,
                Status::Contraindicated,
                format!(
                    "the quote does not cover PCR {pcr}, which the policy's boot reference names"
                ),
            ),
            Some(v) if hex::encode(v) != want => j.add(
                C::BootPcrMismatch,
                Status::Contraindicated,
                format!(
                    "PCR {pcr} is {}, the policy's reference is {want}",
                    hex::encode(v)
                ),
            ),
            Some(_) => {}
        }
    }
}

/// IMA: replay the shipped entries on top of the verified position and judge each by the
/// runtime policy. Returns the new position when PCR 10 verified.
fn check_ima(
    j: &mut Judge,
    st: &Statement,
    ctx: &TpmContext,
    info: &QuoteInfo,
    d: &DecodedSidecar,
) -> Option<TpmPosition> {
    let same_boot = ctx
        .position
        .as_ref()
        .filter(|p| p.reset_count == info.reset_count);
    if let Some(p) = &ctx.position
        && p.reset_count != info.reset_count
    {
        j.add(
            C::TpmReboot,
            Status::Warning,
            format!(
                "TPM resetCount went from {} to {} since statement {}: the host rebooted",
                p.reset_count, info.reset_count, p.seq
            ),
        );
    }
    let (offset, entries) = d.ima.as_ref()?;
    let quoted = *d.pcrs.get(PCR_IMA)?;
    // A delta from entry 0 restarts the replay (a daemon ships the whole list after each
    // start); otherwise it must continue where the last verified one ended, in this boot.
    let start = match (offset, same_boot) {
        (0, _) => [0u8; 32],
        (o, Some(p)) if *o == p.ima_count => p.pcr10,
        (o, p) => {
            j.add(
                C::ImaGap,
                Status::Warning,
                match p {
                    Some(p) => format!(
                        "entries from {o} were shipped, but {} are verified (statement {})",
                        p.ima_count, p.seq
                    ),
                    None => format!(
                        "entries from {o} were shipped, but none of this boot are verified yet"
                    ),
                },
            );
            return None;
        }
    };
    let replayed = replay_pcr10(start, entries);
    if replayed != quoted {
        j.add(
            C::ImaReplayMismatch,
            Status::Contraindicated,
            format!(
                "PCR 10 is {}, the {} entries from {offset} replay to {}",
                hex::encode(quoted),
                entries.len(),
                hex::encode(replayed)
            ),
        );
        return None;
    }
    if let Some(rt) = &j.policy.runtime {
        let rt = rt.clone();
        judge_entries(j, &rt, entries, *offset == 0);
    }
    Some(TpmPosition {
        reset_count: info.reset_count,
        ima_count: offset + entries.len() as u64,
        pcr10: quoted,
        seq: st.predicate.seq,
    })
}

/// Each measured file against `[policy.runtime]`. `from_boot`: the entries start at the boot
/// aggregate, so the daemon's own measurement must be among them.
fn judge_entries(j: &mut Judge, rt: &RuntimePolicy, entries: &[ImaEntry], from_boot: bool) {
    let mut daemon_seen = false;
    for e in entries {
        let path = e.path.as_deref().unwrap_or("");
        if e.is_violation() {
            j.add(
                C::ImaViolation,
                Status::Warning,
                format!("violation recorded for {path}"),
            );
            continue;
        }
        let digest = match &e.file_digest {
            Some((alg, d)) if alg == "sha256" => hex::encode(d),
            Some((alg, d)) => format!("{alg}:{}", hex::encode(d)),
            None => String::new(),
        };
        let file_name = path.rsplit('/').next().unwrap_or(path);
        // The daemon first: an exclude must not hide a modified daemon.
        let excluded =
            path == "boot_aggregate" || rt.exclude.iter().any(|x| path.starts_with(x.as_str()));
        if file_name == rt.daemon_name {
            if rt.daemon_digests.contains(&digest) {
                daemon_seen = true;
            } else {
                j.add(
                    C::DaemonModified,
                    Status::Contraindicated,
                    format!("{path} measured with sha256 {digest}, not an accepted build"),
                );
            }
        } else if !excluded && !rt.allowed.contains(&digest) && !rt.daemon_digests.contains(&digest)
        {
            j.add(
                C::ExecutableNotAllowed,
                Status::Contraindicated,
                format!("{path} (sha256 {digest}) is not in the allowlist"),
            );
        }
    }
    if from_boot && !daemon_seen {
        j.add(
            C::DaemonNotMeasured,
            Status::Contraindicated,
            format!(
                "no accepted `{}` among this boot's {} measurements",
                rt.daemon_name,
                entries.len()
            ),
        );
    }
}
