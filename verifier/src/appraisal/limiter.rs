//! Limiter: was the policer attached and first on every interface, which paths around it
//! exist, when it was not enforcing, and how well it is protected from other root processes.

use rackwarden_attest::{
    evidence::{GapKind, GuardAttach, LimiterReport, LsmGuard, ProtectionLevel, SelfProtection},
    statement::Statement,
    units::fmt_unix_ms,
};

use super::{FindingCode as C, Judge, Status};

/// Attachment, bypass surface and enforcement gaps.
pub(super) fn check(j: &mut Judge, st: &Statement) {
    let e = match &st.predicate.limiter {
        LimiterReport::Absent { finding } => {
            j.add(C::LimiterAbsent, Status::Contraindicated, finding.clone());
            return;
        }
        LimiterReport::Present(e) => e,
    };
    for a in &e.attach_points {
        if !a.attached {
            j.add(
                C::NotAttached,
                Status::Contraindicated,
                format!(
                    "{} {} not enforcing at epoch end",
                    a.interface,
                    a.direction.name()
                ),
            );
        } else if !a.foreign_ahead.is_empty() {
            j.add(
                C::ForeignAhead,
                Status::Contraindicated,
                format!(
                    "programs with ids {} run before ours on {} {}",
                    a.foreign_ahead
                        .iter()
                        .map(u32::to_string)
                        .collect::<Vec<_>>()
                        .join(", "),
                    a.interface,
                    a.direction.name()
                ),
            );
        }
    }
    match &e.bypass {
        None => j.add(
            C::BypassUnreported,
            Status::Warning,
            "the statement does not report the bypass surface",
        ),
        Some(b) => {
            if b.refusal.state != rackwarden_attest::evidence::ProtectionState::Present {
                j.add(
                    C::BypassRefusalAbsent,
                    Status::Warning,
                    b.refusal.detail.clone(),
                );
            }
            for (code, v) in [
                (C::RdmaDevices, &b.rdma_devices),
                (C::VfioDevices, &b.vfio_devices),
                (C::UncappedInterfaces, &b.uncapped_interfaces),
            ] {
                if !v.is_empty() {
                    j.add(
                        code,
                        Status::Warning,
                        format!("{}: {}", code.name(), v.join(", ")),
                    );
                }
            }
            if let Some(n) = b.af_xdp_sockets.filter(|n| *n > 0) {
                j.add(
                    C::AfXdpSockets,
                    Status::Warning,
                    format!("{n} AF_XDP sockets open"),
                );
            }
        }
    }
    for g in &e.gaps {
        let sev = if g.restored {
            Status::Warning
        } else {
            Status::Contraindicated
        };
        j.add(
            C::EnforcementGap,
            sev,
            format!(
                "{}{} detected at {}{}: {}",
                gap_kind(g.kind),
                match (&g.interface, g.direction) {
                    (Some(i), Some(d)) => format!(" on {i} {}", d.name()),
                    (Some(i), None) => format!(" on {i}"),
                    _ => String::new(),
                },
                fmt_unix_ms(g.detected_at_ms),
                if g.restored {
                    ", restored"
                } else {
                    ", not restored"
                },
                g.detail
            ),
        );
    }
}

/// A gap's kind as an operator reads it.
fn gap_kind(k: GapKind) -> &'static str {
    match k {
        GapKind::Detached => "policer detached",
        GapKind::Replaced => "policer replaced",
        GapKind::ForeignAhead => "a foreign program ahead of the policer",
        GapKind::ConfigChanged => "cap rewritten",
        GapKind::CheckFailed => "hook check failed",
        GapKind::CountersRewound => "counters rewound",
    }
}

/// A guard the statement itself shows cannot be in force: BPF LSM programs sealed where
/// `bpf` is not an active LSM. Such a kernel takes LSM programs and attaches them to
/// `bpf_lsm_*` functions that no LSM hook calls, so they refuse nothing; daemons before the
/// fmod_ret guard reported exactly that as `sealed` on kernels booted without BPF LSM (the
/// `guard-fmod-ret` VM group showed every tamper path passing). The levels such a statement
/// credits to the guard are then not `refused`.
fn guard_claim_is_void(sp: &SelfProtection) -> bool {
    matches!(
        sp.lsm_guard,
        LsmGuard::Sealed {
            attach: GuardAttach::Lsm,
            ..
        }
    ) && !sp.bpf_lsm_active
}

/// The weakest protection the policy accepts for any tamper path, if it names one.
pub(super) fn check_self_protection(j: &mut Judge, st: &Statement) {
    let LimiterReport::Present(e) = &st.predicate.limiter else {
        return;
    };
    let void = e.self_protection.as_ref().is_some_and(guard_claim_is_void);
    if void {
        // A policy that asks for self-protection cannot be met by a guard that is not there;
        // without one, the claim is still wrong and shown.
        j.add(
            C::GuardOnInactiveLsm,
            if j.policy.min_self_protection.is_some() {
                Status::Contraindicated
            } else {
                Status::Warning
            },
            "the statement says the BPF LSM guard is sealed, and also that `bpf` is not an active LSM on the host: nothing refuses tampering there".to_string(),
        );
    }
    if let Some(SelfProtection {
        lsm_guard:
            LsmGuard::Sealed {
                tpm_held_elsewhere: held @ 1..,
                ..
            },
        ..
    }) = &e.self_protection
    {
        // The guard refuses new opens of the TPM, not descriptors opened before it sealed:
        // while any is held elsewhere, a quote may have been asked for by its holder.
        j.add(
            C::TpmHeldElsewhere,
            Status::Warning,
            format!(
                "{held} descriptors of the TPM the guard keeps were opened by other processes before it sealed and are still held: they can quote with the daemon's AK"
            ),
        );
    }
    let Some(min) = j.policy.min_self_protection else {
        return;
    };
    let Some(sp) = &e.self_protection else {
        j.add(
            C::SelfProtectionUnreported,
            Status::Contraindicated,
            format!(
                "the policy requires self-protection of at least `{}`; the statement reports none",
                min.name()
            ),
        );
        return;
    };
    let why = match &sp.lsm_guard {
        LsmGuard::Unavailable { reason } => format!("no BPF LSM guard: {reason}"),
        LsmGuard::Sealed { attach, .. } => format!("the guard is sealed ({})", attach.name()),
        LsmGuard::NotReported => "a daemon that predates the guard".into(),
    };
    // Without the guard, a `refused` detach, program ahead or program write is not believed:
    // what a daemon reports for them without one (the tamper watch's levels at best).
    let unguarded = |l: ProtectionLevel, without: ProtectionLevel| {
        if void && l == ProtectionLevel::Refused {
            without
        } else {
            l
        }
    };
    for (path, level) in [
        ("map_writes", sp.map_writes),
        (
            "detach",
            unguarded(sp.detach, ProtectionLevel::RestoredOnEvent),
        ),
        (
            "foreign_ahead",
            unguarded(sp.foreign_ahead, ProtectionLevel::RestoredOnEvent),
        ),
        (
            "program_writes",
            unguarded(sp.program_writes, ProtectionLevel::DetectedOnSample),
        ),
    ] {
        if level.rank() > min.rank() {
            j.add(
                C::SelfProtectionBelowPolicy,
                Status::Contraindicated,
                format!(
                    "{path} is `{}` on this host; the policy requires `{}` ({why})",
                    level.name(),
                    min.name(),
                ),
            );
        }
    }
}
