//! One policer per interface. Two daemons with different pin roots on one interface would
//! each see the other's program as a foreign one ahead of or behind its own, fight over the
//! hook and fill both logs with enforcement gaps. So before a daemon loads or attaches
//! anything it looks at every hook it is configured for: a rackwarden policer there that is
//! not pinned under its own pin root belongs to another daemon, and the start is refused,
//! naming that program and, where it can be found, its pin root.
//!
//! Two daemons on one pin root would adopt the same programs and both write the caps: the
//! first holds an exclusive `flock` on the pin root for as long as it runs
//! ([`PinRootLock`]), and a second is refused.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

use super::{Direction, HookDirection, watch::SeenProgram};
use crate::bpf_syscall;
use crate::pins::PinPaths;

/// Where bpffs is mounted: every daemon's pin root is a directory under it.
const BPFFS: &str = "/sys/fs/bpf";

/// A rackwarden policer on one of our hooks that our pin root does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{iface} {}: another rackwarden policer is attached (program {} #{}, {}): one policer per interface; stop the daemon that runs it, or remove its pin root, before starting this one",
    direction.name(),
    program.name,
    program.id,
    match pin_root {
        Some(r) => format!("pinned under {}", r.display()),
        None => format!("pinned under no pin root in {BPFFS}"),
    }
)]
pub struct OtherPolicer {
    pub iface: String,
    pub direction: Direction,
    pub program: SeenProgram,
    /// The pin root that holds it, when one under bpffs does.
    pub pin_root: Option<PathBuf>,
}

/// A pin root another running daemon holds.
#[derive(Debug, thiserror::Error)]
pub enum PinRootLockError {
    #[error(
        "{}: another rackwardend runs on this pin root (it holds its lock): one daemon per pin root; stop that one first",
        root.display()
    )]
    Busy { root: PathBuf },
    #[error("locking the pin root {}: {source}", root.display())]
    Io {
        root: PathBuf,
        source: std::io::Error,
    },
}

/// The exclusive lock on a pin root, held for as long as the daemon runs (released by the
/// kernel when the process ends, also on `kill -9`).
#[derive(Debug)]
pub struct PinRootLock {
    _dir: std::fs::File,
}

impl PinRootLock {
    /// Creates the pin root if needed and locks it. `Ok(None)` where the directory refuses
    /// this process (a guard sealed it for another executable: the load that follows says
    /// so, with the reason).
    pub fn acquire(pins: &PinPaths) -> Result<Option<PinRootLock>, PinRootLockError> {
        let root = pins.root();
        let io = |source| PinRootLockError::Io {
            root: root.to_path_buf(),
            source,
        };
        // The lock comes before the loader, which would mount bpffs: on a host where nothing
        // mounted it (a container, a minimal guest) the pin root cannot be made in sysfs.
        if root.starts_with(BPFFS) {
            crate::pins::ensure_bpffs().map_err(io)?;
        }
        std::fs::create_dir_all(root).map_err(io)?;
        let dir = match std::fs::File::open(root) {
            Ok(d) => d,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => return Ok(None),
            Err(e) => return Err(io(e)),
        };
        match dir.try_lock() {
            Ok(()) => Ok(Some(PinRootLock { _dir: dir })),
            Err(std::fs::TryLockError::WouldBlock) => Err(PinRootLockError::Busy {
                root: root.to_path_buf(),
            }),
            // A kernel or guard that refuses the lock itself must not stop the cap from
            // being enforced: the start goes on, without this one protection.
            Err(std::fs::TryLockError::Error(e)) => {
                log::warn!(
                    "cannot lock the pin root {} ({e}): a second daemon on it would not be refused",
                    root.display()
                );
                Ok(None)
            }
        }
    }
}

/// Refuses a start where a rackwarden policer that is not ours is on any of `ifaces`' hooks.
/// Must run in the daemon's network namespace.
pub fn refuse_other_policers(pins: &PinPaths, ifaces: &[String]) -> Result<(), Box<OtherPolicer>> {
    let ours = pinned_program_ids(pins);
    for iface in ifaces {
        for direction in Direction::ALL {
            let other = super::watch::programs_on_hook(iface, direction)
                .into_iter()
                .find(|p| is_policer_name(&p.name) && !ours.contains(&p.id));
            if let Some(program) = other {
                return Err(Box::new(OtherPolicer {
                    iface: iface.clone(),
                    direction,
                    pin_root: pin_root_of(program.id, pins.root()),
                    program,
                }));
            }
        }
    }
    Ok(())
}

/// The names our policer programs carry in the kernel.
fn is_policer_name(name: &str) -> bool {
    Direction::ALL.iter().any(|d| d.prog_name() == name)
}

/// Ids of the policer programs pinned under one pin root, current and next (an upgrade in
/// progress): ours on a restart, an upgrade or an adopted bare limiter.
fn pinned_program_ids(pins: &PinPaths) -> BTreeSet<u32> {
    Direction::ALL
        .iter()
        .flat_map(|d| [pins.prog(d.prog_name()), pins.prog_next(d.prog_name())])
        .filter_map(|p| bpf_syscall::obj_get(&p).ok())
        .filter_map(|fd| bpf_syscall::prog_id(&fd).ok())
        .collect()
}

/// The pin root under bpffs, other than `ours`, whose policer pins hold program `id`.
fn pin_root_of(id: u32, ours: &Path) -> Option<PathBuf> {
    let mut roots: Vec<PathBuf> = Vec::new();
    collect_pin_roots(Path::new(BPFFS), 0, &mut roots);
    roots
        .into_iter()
        .filter(|r| r != ours)
        .find(|r| pinned_program_ids(&PinPaths::new(r)).contains(&id))
}

/// Directories under `dir` (two levels deep: test harnesses nest pin roots) that have a
/// `progs` directory.
fn collect_pin_roots(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        if PinPaths::new(&path).progs_dir().is_dir() {
            out.push(path.clone());
        }
        if depth < 1 {
            collect_pin_roots(&path, depth + 1, out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_two_program_names_are_policers() {
        assert!(is_policer_name("rw_egress"));
        assert!(is_policer_name("rw_ingress"));
        assert!(!is_policer_name("rw_old"));
        assert!(!is_policer_name("rw_sockopt"));
    }

    #[test]
    fn the_refusal_names_program_id_and_pin_root() {
        let o = OtherPolicer {
            iface: "eth0".into(),
            direction: Direction::Egress,
            program: SeenProgram {
                id: 42,
                name: "rw_egress".into(),
                filter: None,
            },
            pin_root: Some(PathBuf::from("/sys/fs/bpf/rackwarden")),
        };
        let m = o.to_string();
        assert!(
            m.starts_with("eth0 egress: another rackwarden policer")
                && m.contains("rw_egress #42")
                && m.contains("pinned under /sys/fs/bpf/rackwarden"),
            "{m}"
        );
    }
}
