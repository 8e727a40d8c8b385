//! Measured boot (issue 41): the boot's event log replayed to the quoted PCRs 0-9 and what it
//! measured judged against `[policy.boot]`'s sets; and from that, whether the daemon's sealed
//! guard rests on the TPM or on the daemon's word.
//!
//! The log comes once per boot. The verifier keeps what the first verified one measured (the
//! `tpm_boots` row) and judges every later statement of the same boot (same TPM resetCount,
//! same quoted PCRs 0-9) by it, so a boot outside the policy stays contraindicated for as long
//! as the host runs it, not for one statement.

use std::collections::{BTreeMap, BTreeSet};

use rackwarden_attest::evidence::{GuardAttach, LimiterReport, LsmGuard};
use rackwarden_attest::result::GuardBasis;
use rackwarden_attest::statement::Statement;
use rackwarden_attest::tpm::{
    BOOT_LOG_PCRS, DecodedSidecar, MeasuredBoot, MeasuredCmdline, QuoteInfo, TrustLevel,
    replay_differences,
};

use super::{FindingCode as C, Judge, Status};
use crate::config::{BootLogPolicy, forbids};
use crate::store::TpmBoot;

/// What the boot check found: the boot to judge by, and the row to store when a newly
/// shipped log verified.
pub(crate) struct BootOutcome {
    pub measured: Option<MeasuredBoot>,
    pub store: Option<TpmBoot>,
}

/// The quoted PCRs 0-9, or the first one the quote lacks.
fn quoted_boot_pcrs(d: &DecodedSidecar) -> Result<BTreeMap<u8, [u8; 32]>, u8> {
    BOOT_LOG_PCRS
        .map(|p| d.pcrs.get(p).map(|v| (p, *v)).ok_or(p))
        .collect()
}

pub(crate) fn check(
    j: &mut Judge,
    st: &Statement,
    stored: Option<&TpmBoot>,
    info: &QuoteInfo,
    d: &DecodedSidecar,
) -> BootOutcome {
    let none = BootOutcome {
        measured: None,
        store: None,
    };
    let judged = j.policy.boot_log.is_some();
    let outcome = match (
        &d.boot,
        stored.filter(|b| b.reset_count == info.reset_count),
    ) {
        (Some((log, cmdline)), _) => {
            let pcrs = match quoted_boot_pcrs(d) {
                Ok(p) => p,
                Err(p) => {
                    j.add(
                        C::BootLogMismatch,
                        Status::Contraindicated,
                        format!("a boot log came, but the quote does not cover PCR {p}: nothing checks it (quote PCRs 0-9)"),
                    );
                    return none;
                }
            };
            let differ = match replay_differences(log, &d.pcrs) {
                Ok(differ) => differ,
                Err(e) => {
                    j.add(C::BootLogInvalid, Status::Contraindicated, e.to_string());
                    return none;
                }
            };
            if !differ.is_empty() {
                let list: Vec<String> = differ
                    .iter()
                    .map(|d| {
                        format!(
                            "PCR {} quoted {} replayed {}",
                            d.pcr,
                            d.quoted.map(hex::encode).unwrap_or_default(),
                            hex::encode(d.replayed)
                        )
                    })
                    .collect();
                j.add(
                    C::BootLogMismatch,
                    Status::Contraindicated,
                    format!(
                        "the boot log's {} events do not replay to the quote: {}",
                        log.events.len(),
                        list.join("; ")
                    ),
                );
                return none;
            }
            let measured = MeasuredBoot::read(log, cmdline);
            BootOutcome {
                store: Some(TpmBoot {
                    reset_count: info.reset_count,
                    pcrs,
                    measured: measured.clone(),
                    seq: st.predicate.seq,
                }),
                measured: Some(measured),
            }
        }
        (None, Some(b)) => {
            let changed: Vec<String> = b
                .pcrs
                .iter()
                .filter(|(p, v)| d.pcrs.get(**p) != Some(*v))
                .map(|(p, _)| p.to_string())
                .collect();
            if !changed.is_empty() {
                j.add(
                    C::BootLogMismatch,
                    Status::Contraindicated,
                    format!(
                        "PCR {} changed since this boot's log verified with statement {}: something extended the boot PCRs after boot",
                        changed.join(", "),
                        b.seq
                    ),
                );
                return none;
            }
            BootOutcome {
                measured: Some(b.measured.clone()),
                store: None,
            }
        }
        (None, None) => {
            if judged {
                j.add(
                    C::BootLogMissing,
                    Status::Contraindicated,
                    format!(
                        "no event log of this boot (TPM resetCount {}) has verified: the daemon ships it with its first statement after it starts",
                        info.reset_count
                    ),
                );
            }
            return none;
        }
    };
    // The policy outlives the judge's borrow: no copy of its sets per statement.
    let policy = j.policy;
    if let (Some(m), Some(p)) = (&outcome.measured, &policy.boot_log) {
        appraise(j, p, m);
    }
    outcome
}

/// A measured boot against the policy's sets. Every measurement counts by its digest (see
/// `MeasuredBoot`): each PCR 4 application must be an accepted loader or kernel, each PCR 9
/// measurement an accepted kernel, initrd or boot file (or the proven command line), and one
/// of them an accepted kernel. Measurements only add up: a log cannot hide one, and one
/// extended after boot is one more to accept.
fn appraise(j: &mut Judge, p: &BootLogPolicy, m: &MeasuredBoot) {
    let in_any = |sets: &[&Option<BTreeSet<String>>], d: &String| {
        sets.iter()
            .any(|s| s.as_ref().is_some_and(|s| s.contains(d)))
    };
    if p.loaders.is_some() || p.kernels.is_some() {
        for a in &m.applications {
            if !in_any(&[&p.loaders, &p.kernels], a) {
                j.add(
                    C::BootComponentNotAccepted,
                    Status::Contraindicated,
                    format!("PCR 4 application {a} is no accepted boot loader or kernel"),
                );
            }
        }
    }
    let cmdline = m.cmdline_digest();
    if p.kernels.is_some() || p.initrds.is_some() || p.boot_files.is_some() {
        for l in &m.loaded {
            if Some(l) != cmdline.as_ref() && !in_any(&[&p.kernels, &p.initrds, &p.boot_files], l) {
                j.add(
                    C::BootComponentNotAccepted,
                    Status::Contraindicated,
                    format!(
                        "PCR 9 measurement {l} is no accepted kernel, initrd or boot file (nor the command line the host shipped)"
                    ),
                );
            }
        }
    }
    if let Some(kernels) = &p.kernels
        && !m
            .applications
            .iter()
            .chain(&m.loaded)
            .any(|d| kernels.contains(d))
    {
        j.add(
            C::BootComponentNotAccepted,
            Status::Contraindicated,
            format!(
                "none of the {} applications and {} loaded files measured is an accepted kernel",
                m.applications.len(),
                m.loaded.len()
            ),
        );
    }
    if let Some(initrds) = &p.initrds
        && !m.loaded.iter().any(|d| initrds.contains(d))
    {
        j.add(
            C::BootComponentNotAccepted,
            Status::Contraindicated,
            "the policy names initrds, but none was measured",
        );
    }
    let judges_cmdline = !p.cmdline_required.is_empty() || !p.cmdline_forbidden.is_empty();
    match &m.cmdline {
        MeasuredCmdline::Measured { .. } => {
            let words = m.cmdline.words();
            for r in &p.cmdline_required {
                if !words.contains(r) {
                    j.add(
                        C::BootCmdlineNotAccepted,
                        Status::Contraindicated,
                        format!("the measured command line lacks `{r}`"),
                    );
                }
            }
            for f in &p.cmdline_forbidden {
                if let Some(w) = words.iter().find(|w| forbids(f, w)) {
                    j.add(
                        C::BootCmdlineNotAccepted,
                        Status::Contraindicated,
                        format!("the measured command line carries `{w}` (forbidden: `{f}`)"),
                    );
                }
            }
        }
        MeasuredCmdline::Mismatch { shipped, measured } => j.add(
            C::BootCmdlineNotAccepted,
            Status::Contraindicated,
            format!("the host says its command line is {shipped:?}, which does not hash to the measured {measured}"),
        ),
        MeasuredCmdline::NotMeasured if judges_cmdline => j.add(
            C::BootCmdlineNotAccepted,
            Status::Contraindicated,
            "the policy judges the command line, but the log does not measure one",
        ),
        MeasuredCmdline::NotMeasured => {}
    }
    if p.secure_boot && m.secure_boot.enabled != Some(true) {
        j.add(
            C::SecureBootNotAccepted,
            Status::Contraindicated,
            match m.secure_boot.enabled {
                Some(false) => "the measured SecureBoot variable is 0: Secure Boot is disabled",
                _ => "the log measures no SecureBoot variable",
            },
        );
    }
    for (name, accepted) in &p.secure_boot_variables {
        match m.secure_boot.variables.get(name) {
            Some(d) if accepted.contains(d) => {}
            Some(d) => j.add(
                C::SecureBootNotAccepted,
                Status::Contraindicated,
                format!("the measured {name} (sha256 {d}) is not one the policy accepts"),
            ),
            None => j.add(
                C::SecureBootNotAccepted,
                Status::Contraindicated,
                format!("the log measures no {name}, which the policy pins"),
            ),
        }
    }
}

/// What the statement's sealed guard rests on (`None`: no sealed guard reported, or no
/// verified boot to judge it by). Either guard needs a kernel the policy accepts (for
/// fmod_ret, one with trampolines; the policy vouches for it by accepting it), a BPF LSM
/// guard also `bpf` in the measured `lsm=`; and either is proven only with IMA's proof that
/// the accepted daemon is what runs.
pub(crate) fn guard_basis(
    j: &mut Judge,
    st: &Statement,
    measured: Option<&MeasuredBoot>,
    level: TrustLevel,
) -> Option<GuardBasis> {
    let m = measured?;
    let LimiterReport::Present(e) = &st.predicate.limiter else {
        return None;
    };
    let LsmGuard::Sealed { attach, .. } = &e.self_protection.as_ref()?.lsm_guard else {
        return None;
    };
    // The boot allows the guard only where the policy accepted its kernel (`kernels` set and
    // no root-of-trust finding, checked below): a kernel nobody vouched for may take BPF
    // LSM programs and never call them.
    let kernel_vouched = j
        .policy
        .boot_log
        .as_ref()
        .is_some_and(|p| p.kernels.is_some());
    let boot_allows = match attach {
        GuardAttach::Lsm => match m.cmdline.enables_bpf_lsm() {
            Some(true) => kernel_vouched,
            Some(false) => {
                j.add(
                    C::GuardContradictsBoot,
                    Status::Contraindicated,
                    format!(
                        "the guard is sealed as BPF LSM programs, but the measured command line's {} has no bpf",
                        m.cmdline.lsm().unwrap_or_else(|| "lsm=".into())
                    ),
                );
                return Some(GuardBasis::ContradictedByBoot);
            }
            None => false,
        },
        GuardAttach::FmodRet => kernel_vouched,
    };
    let proven = boot_allows
        && level == TrustLevel::TpmIma
        && !j.has(super::Aspect::RootOfTrust, Status::Contraindicated);
    Some(if proven {
        GuardBasis::ProvenByBoot
    } else {
        GuardBasis::DaemonWord
    })
}
