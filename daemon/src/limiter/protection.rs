//! What stops another root process from switching the limiter off on this host, path by
//! path, as it stands (not as it was meant to be): reported in `status` and every statement
//! so the verifier can weigh a host's evidence.
//!
//! - Map writes: every map is frozen at load (`BPF_MAP_FREEZE`), so `bpf()` writes are
//!   refused for every process. Read back from `/proc/self/fdinfo` (`frozen: 1`), because an
//!   older build's pinned maps, adopted, may not be.
//! - Detach, replace, a program ahead of ours: refused by the guard (`crate::guard`)
//!   where it is sealed; elsewhere restored as the `bpf()` call returns when the tamper watch
//!   runs and the hooks are tcx links ([`super::tamper_watch`]), else at the next hook check.
//! - Programs writing the bucket or the counters (a frozen map still takes program writes;
//!   the config map is `BPF_F_RDONLY_PROG` and takes none): under the guard no other process
//!   can get an fd to our maps, so none can load such a program; elsewhere a counter that
//!   goes down between two samples is a `counters_rewound` gap.

use std::{os::fd::AsRawFd as _, time::Duration};

use rackwarden_attest::evidence::{LsmGuard, ProtectionLevel, SelfProtection};
use rackwarden_common::map_names;

use crate::pins::PinPaths;

/// The agent samples the counters this often (and checks their monotonicity then).
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// Whether the map pinned at `name` is frozen (`None`: it cannot be opened or read).
pub fn map_frozen(pins: &PinPaths, name: &str) -> Option<bool> {
    let fd = crate::bpf_syscall::obj_get(&pins.map(name)).ok()?;
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("frozen:"))
        .map(|v| v.trim() == "1")
}

/// This host's protection, from the pinned maps and the kernel.
pub fn assess(pins: &PinPaths, check_interval: Duration) -> SelfProtection {
    let all_frozen = [map_names::CONFIG, map_names::STATE, map_names::COUNTERS]
        .iter()
        .all(|m| map_frozen(pins, m) == Some(true));
    let lsm_guard = crate::guard::report(pins);
    let sealed = matches!(lsm_guard, LsmGuard::Sealed { .. });
    // The watch sees bpf() calls, so a tcx detach or attach (a link) but not a netlink one.
    let watched = super::tamper_watch::active()
        && std::fs::read_dir(pins.links_dir())
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .any(|e| e.file_name().to_string_lossy().ends_with("_egress"))
            })
            .unwrap_or(false);
    let unless_sealed = |l| {
        if sealed {
            ProtectionLevel::Refused
        } else if watched && l == ProtectionLevel::RestoredOnPoll {
            ProtectionLevel::RestoredOnEvent
        } else {
            l
        }
    };
    SelfProtection {
        map_writes: if all_frozen || sealed {
            ProtectionLevel::Refused
        } else {
            // A writable config map is compared with what we wrote at every check.
            ProtectionLevel::RestoredOnPoll
        },
        detach: unless_sealed(ProtectionLevel::RestoredOnPoll),
        foreign_ahead: unless_sealed(ProtectionLevel::RestoredOnPoll),
        program_writes: unless_sealed(ProtectionLevel::DetectedOnSample),
        poll_interval_ms: check_interval.as_millis() as u64,
        sample_interval_ms: SAMPLE_INTERVAL.as_millis() as u64,
        bpf_lsm_active: crate::lsm::bpf_lsm_active(),
        lsm_guard,
    }
}
