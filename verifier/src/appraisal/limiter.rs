//! Limiter: was the policer attached and first on every interface, which paths around it
//! exist, when it was not enforcing, and how well it is protected from other root processes.

use rackwarden_attest::{
    evidence::{GapKind, LimiterReport, LsmGuard},
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

/// The weakest protection the policy accepts for any tamper path, if it names one.
pub(super) fn check_self_protection(j: &mut Judge, st: &Statement) {
    let (Some(min), LimiterReport::Present(e)) =
        (j.policy.min_self_protection, &st.predicate.limiter)
    else {
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
        LsmGuard::Sealed { .. } => "the BPF LSM guard is sealed".into(),
        LsmGuard::NotReported => "a daemon that predates the guard".into(),
    };
    for (path, level) in [
        ("map_writes", sp.map_writes),
        ("detach", sp.detach),
        ("foreign_ahead", sp.foreign_ahead),
        ("program_writes", sp.program_writes),
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
