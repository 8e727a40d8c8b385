//! Every path under bpffs that rackwarden pins to. Nothing else in the project builds a pin
//! path: a reader (or an auditor) finds the whole on-disk footprint of the limiter here.
//!
//! ```text
//! <root>/                      default /sys/fs/bpf/rackwarden
//!   maps/RW_CONFIG             both directions' caps (LimiterConfig), frozen: a cap change
//!                              loads a new map and new programs that read it
//!   maps/RW_CONFIG_next        such a map, while its programs replace the running ones
//!   maps/RW_STATE              GCRA bucket state per direction (BucketState)
//!   maps/RW_COUNTERS           per-CPU counters per direction (Counters)
//!   progs/rw_egress            the egress policer program
//!   progs/rw_ingress           the ingress policer program
//!   maps/RW_REFUSALS           per-CPU counts of refused bypass socket options
//!   progs/rw_sockopt           the cgroup/setsockopt refusal program
//!   links/cgroup_setsockopt    its link at the cgroup v2 root
//!   links/<ifname>_egress      tcx link holding the egress attachment (tcx mode only)
//!   links/<ifname>_ingress
//!   guard/current/<hook>       the guard's links, one per LSM hook (BPF LSM or fmod_ret; where loaded)
//!   guard/current/RW_GUARD     its frozen config: our object ids, pin directories, interfaces
//!   guard/current/RW_GUARD_REFUSALS  per-CPU counts of what it refused
//!   guard/next/...             a new guard generation while it replaces the current one
//! ```
//!
//! One set of pins belongs to the host, not to a daemon's root: the tamper watch, attached
//! once per boot and shared by every daemon that runs on it (`limiter::tamper_watch`).
//! ```text
//! /sys/fs/bpf/rackwarden-watch/v1/
//!   link                       the raw tracepoint link at sys_exit (keeps it attached)
//!   RW_WATCH_EVENTS            its ring buffer of reports
//!   RW_WATCH_DAEMON            the tgid of the daemon that reads the reports
//! ```
//! The directory is also the consumer lock: the daemon that holds `flock` on it reads the
//! reports; another waits for it. `v1` names the program's map layout: a build that changes
//! it pins a new directory beside the old one instead of detaching a watch another daemon
//! may still read.
//! bpffs refuses any name containing `.` (EPERM, "reserved for future extensions"), and
//! interface names may contain dots (VLANs: `eth0.100`), so dots in names are written `%2E`.
//! ```text
//! ```
//! Pins keep the programs attached and the maps (bucket and counters) alive across daemon
//! crashes and restarts; only a reboot or removing the pin root clears them (README,
//! "Operating it").

use std::path::{Path, PathBuf};

use rackwarden_attest::evidence::Direction;

pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/rackwarden";

#[derive(Debug, Clone)]
pub struct PinPaths {
    root: PathBuf,
}

impl PinPaths {
    pub fn new(root: impl Into<PathBuf>) -> Self {
        PinPaths { root: root.into() }
    }
    pub fn root(&self) -> &Path {
        &self.root
    }
    pub fn maps_dir(&self) -> PathBuf {
        self.root.join("maps")
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.maps_dir().join(name)
    }
    /// Where a new frozen config map waits while the programs that read it replace the
    /// running ones (a cap change or an upgrade).
    pub fn map_next(&self, name: &str) -> PathBuf {
        self.maps_dir().join(format!("{name}_next"))
    }
    pub fn progs_dir(&self) -> PathBuf {
        self.root.join("progs")
    }
    pub fn prog(&self, name: &str) -> PathBuf {
        self.progs_dir().join(name)
    }
    /// Where this build's program waits while it replaces another build's (bpffs refuses
    /// names with a dot, hence `_next`).
    pub fn prog_next(&self, name: &str) -> PathBuf {
        self.progs_dir().join(format!("{name}_next"))
    }
    pub fn links_dir(&self) -> PathBuf {
        self.root.join("links")
    }
    pub fn link(&self, ifname: &str, dir: Direction) -> PathBuf {
        let escaped = ifname.replace('%', "%25").replace('.', "%2E");
        self.links_dir().join(format!("{escaped}_{}", dir.name()))
    }
    pub fn sockopt_link(&self) -> PathBuf {
        self.links_dir().join("cgroup_setsockopt")
    }
    pub fn guard_dir(&self) -> PathBuf {
        self.root.join("guard")
    }
    /// The directory of a guard generation: `current`, or `next` while it replaces it.
    pub fn guard_generation(&self, next: bool) -> PathBuf {
        self.guard_dir().join(if next { "next" } else { "current" })
    }
    /// Every directory of ours: the guard refuses lookups in them to other processes.
    pub fn all_dirs(&self) -> Vec<PathBuf> {
        vec![
            self.root.clone(),
            self.maps_dir(),
            self.progs_dir(),
            self.links_dir(),
            self.guard_dir(),
        ]
    }
    pub fn create_dirs(&self) -> std::io::Result<()> {
        for d in [
            self.maps_dir(),
            self.progs_dir(),
            self.links_dir(),
            self.guard_dir(),
        ] {
            std::fs::create_dir_all(d)?;
        }
        Ok(())
    }
    /// Removes every pin under the root (and the root). Unpinning a tcx link detaches it.
    /// Used by the benchmarks; operators remove the directory by hand (README).
    pub fn remove_all(&self) -> std::io::Result<()> {
        match std::fs::remove_dir_all(&self.root) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            r => r,
        }
    }
}

/// Where the host's one tamper watch is pinned (see the module doc).
pub const WATCH_ROOT: &str = "/sys/fs/bpf/rackwarden-watch/v1";

/// The tamper watch's pins: one set per host, outside every daemon's pin root, so neither a
/// daemon restart nor a test removing its root detaches it.
#[derive(Debug, Clone)]
pub struct WatchPins {
    dir: PathBuf,
}

impl WatchPins {
    pub fn host() -> Self {
        WatchPins {
            dir: PathBuf::from(WATCH_ROOT),
        }
    }
    /// The directory, which is also the consumer lock.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn link(&self) -> PathBuf {
        self.dir.join("link")
    }
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// The bpffs magic number (`BPF_FS_MAGIC` in linux/magic.h).
const BPF_FS_MAGIC: i64 = 0xcafe_4a11;

/// Mounts bpffs on `/sys/fs/bpf` if nothing is mounted there yet. systemd does this at boot;
/// minimal hosts, containers and VM guests may not, and pins on a non-bpffs path fail.
pub fn ensure_bpffs() -> std::io::Result<()> {
    let mnt = "/sys/fs/bpf";
    if nix::sys::statfs::statfs(mnt).is_ok_and(|st| st.filesystem_type().0 == BPF_FS_MAGIC) {
        return Ok(());
    }
    log::info!("bpffs is not mounted on /sys/fs/bpf; mounting it");
    nix::mount::mount(
        Some("bpf"),
        mnt,
        Some("bpf"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )?;
    Ok(())
}

/// Every file the daemon keeps under its `state_dir` (default `/var/lib/rackwarden`).
/// Nothing else builds a state path:
/// ```text
/// <state_dir>/
///   gaps.jsonl                   enforcement gaps, each appended and fsynced
///   evidence.jsonl               the signed, hash-chained statements (delivery's spool)
///   delivered.json               how far delivery got (replaced atomically)
///   epoch-in-progress.json       the epoch journal (an unreadable one is kept beside it
///                                as epoch-in-progress.unreadable-<unix ms>)
///   tpm-ak.json                  the TPM attestation key's public and EK-wrapped private
///                                blobs (0600), so a restart quotes with the AK the
///                                verifier enrolled
///   tlog-entries.jsonl           each acknowledged statement's entry in the verifier's
///                                transparency log (index, proof, checkpoint), appended
///   tlog-checkpoint              the newest log checkpoint that checked out (replaced
///                                atomically)
///   tlog-failures.jsonl          failed log checks, with both checkpoints (evidence)
///   tap-cut.json                 the tap's last epoch cut (kernel passed bytes per CPU)
///   tap-spool/                   each epoch's records and bytes until they are opened
/// ```
#[derive(Debug, Clone)]
pub struct StatePaths {
    dir: PathBuf,
}

impl StatePaths {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        StatePaths { dir: dir.into() }
    }
    pub fn dir(&self) -> &Path {
        &self.dir
    }
    pub fn gaps(&self) -> PathBuf {
        self.dir.join("gaps.jsonl")
    }
    pub fn evidence_log(&self) -> PathBuf {
        self.dir.join("evidence.jsonl")
    }
    pub fn delivery_cursor(&self) -> PathBuf {
        self.dir.join("delivered.json")
    }
    pub fn epoch_journal(&self) -> PathBuf {
        self.dir.join("epoch-in-progress.json")
    }
    pub fn tpm_ak(&self) -> PathBuf {
        self.dir.join("tpm-ak.json")
    }
    pub fn tlog_entries(&self) -> PathBuf {
        self.dir.join("tlog-entries.jsonl")
    }
    pub fn tlog_checkpoint(&self) -> PathBuf {
        self.dir.join("tlog-checkpoint")
    }
    pub fn tlog_failures(&self) -> PathBuf {
        self.dir.join("tlog-failures.jsonl")
    }
    /// The tap's last epoch cut: the kernel's passed bytes per CPU and direction it committed
    /// up to (`crate::taps::cut`). A restarted daemon starts its first epoch there, so bytes
    /// a dead daemon read but never committed show as unaccounted.
    pub fn tap_cut(&self) -> PathBuf {
        self.dir.join("tap-cut.json")
    }
    /// Each epoch's records and their bytes, until the verifier has its openings.
    pub fn tap_spool(&self) -> PathBuf {
        self.dir.join("tap-spool")
    }
    /// The verifier's samples not yet answered and the answers not yet named by a statement
    /// (`crate::epoch::openings`).
    pub fn tap_openings(&self) -> PathBuf {
        self.dir.join("tap-openings.json")
    }
    /// How many lines of `tlog-failures.jsonl` a signed statement has disclosed.
    pub fn tlog_failures_disclosed(&self) -> PathBuf {
        self.dir.join("tlog-failures.disclosed")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_pins_never_contain_dots() {
        let p = PinPaths::new("/sys/fs/bpf/rackwarden");
        let l = p.link("eth0.100", Direction::Egress);
        assert_eq!(
            l,
            PathBuf::from("/sys/fs/bpf/rackwarden/links/eth0%2E100_egress")
        );
        assert!(!l.file_name().unwrap().to_str().unwrap().contains('.'));
    }
}
