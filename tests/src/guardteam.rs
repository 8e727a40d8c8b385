//! The red-team matrix against a daemon sealed by the guard (in the `cargo xtask vm-test`
//! guests: as BPF LSM programs where they boot with `bpf` in `lsm=`, as `fmod_ret` on
//! `security_*` where they boot without it). Every path of the unguarded matrix
//! that needs an fd, a pin, a netlink request or the daemon's identity, tried as another
//! root process would, with a flood through the 1 MB/s cap after each attack. Each row is
//! `counted` when the kernel refused with the errno shown and the guard counted it.

use std::{os::fd::AsRawFd as _, path::PathBuf, time::Duration};

use rackwarden::{bpf_syscall, limiter::Direction};
use rackwarden_attest::evidence::GuardAttach;
use rackwarden_common::map_names;

use crate::{
    Daemon, Net, bin,
    redteam::{BURST, CAP, Row, SECS},
    status_json,
    tamper::{self, Hook},
};

fn refusals(net: &Net) -> u64 {
    let st = status_json(&net.socket_path());
    st["self_protection"]["lsm_guard"]["refusals"]
        .as_u64()
        .unwrap_or_else(|| panic!("no guard refusal count in status: {st}"))
}

fn errno(r: &std::io::Result<impl Sized>) -> i32 {
    match r {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

/// A program of the attacker's, pinned outside our pin root (nobody can pin inside it).
fn foreign_pass_all(tag: &str) -> (std::os::fd::OwnedFd, PathBuf) {
    let prog = crate::load_pass_all_classifier();
    let path = PathBuf::from(format!(
        "/sys/fs/bpf/rwt-foreign-{tag}-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&path);
    bpf_syscall::obj_pin(&prog, &path).expect("pin the foreign program outside our root");
    (prog, path)
}

/// One attack on the sealed limiter: run it, flood, and make a row.
struct Attempt<'a> {
    net: &'a Net,
    flood: bool,
}

/// The errno every guarded path expects.
const EPERM: &[i32] = &[libc::EPERM];

impl<'a> Attempt<'a> {
    /// Each attack followed by a flood through the cap.
    fn flooding(net: &'a Net) -> Self {
        Attempt { net, flood: true }
    }

    /// Attacks on ids and the daemon's process: nothing to flood through.
    fn quick(net: &'a Net) -> Self {
        Attempt { net, flood: false }
    }

    fn row(
        &self,
        path: &'static str,
        want: &[i32],
        attack: impl FnOnce() -> i32,
        note: impl FnOnce() -> String,
    ) -> Row {
        let before = refusals(self.net);
        let errno = attack();
        let (b, t) = if self.flood {
            self.net.egress_flood(SECS)
        } else {
            (0, 0.0)
        };
        let after = refusals(self.net);
        let within = b as f64 <= BURST as f64 + CAP as f64 * t;
        Row {
            path,
            expected: "refused by the guard, cap held",
            bytes_through: b,
            window_s: t,
            counted: want.contains(&errno) && after > before && within,
            note: format!(
                "errno {errno}; guard refusals {before} -> {after}; {}",
                note()
            ),
        }
    }
}

/// Runs every path against one sealed daemon (refusals change nothing, so one fixture
/// serves all rows); the last rows stop the daemon and show the seal outlives it. `attach`:
/// where the guard must run on this kernel.
pub fn run(attach: GuardAttach) -> Vec<Row> {
    let net = Net::new("grd");
    let (mut d, st) = start_sealed(&net, attach);
    let hook = Hook::of(&net);
    let mut rows = Vec::new();
    rows.extend(link_rows(&net, hook));
    rows.extend(map_rows(&net));
    rows.extend(by_id_rows(&net, hook, &st));
    rows.push(unlink_pins_row(&net));
    let pid = d.pid();
    rows.extend(process_rows(&net, pid));
    rows.push(cap_change_row(&net, &st));
    let sealed = format!("sealed by the guard ({})", attach.name());
    assert!(
        d.log_text().matches(&sealed).count() >= 3,
        "sealed at start and after each cap change:\n{}",
        d.log_text()
    );
    rows.extend(after_kill_rows(&net, hook, &mut d));
    rows
}

/// Starts the daemon with the guard, which must report itself sealed once started; returns
/// the daemon and that status (its map and program ids, for the by-id rows).
fn start_sealed(net: &Net, attach: GuardAttach) -> (Daemon, serde_json::Value) {
    let cfg = net.write_config_guarded("1 MB/s", "1 MB/s", "256 KiB");
    let d = Daemon::start(&cfg, &net.socket_path());
    let st = status_json(&net.socket_path());
    let guard = &st["self_protection"]["lsm_guard"];
    assert_eq!(guard["state"], "sealed", "{:#}", st["self_protection"]);
    assert_eq!(
        guard["attach"],
        attach.name(),
        "{:#}",
        st["self_protection"]
    );
    (d, st)
}

/// Our policer's attachment: detached, replaced, or bypassed by a program ahead of it.
fn link_rows(net: &Net, hook: Hook) -> Vec<Row> {
    let flood = Attempt::flooding(net);
    let mut rows = Vec::new();
    rows.push(flood.row(
        match hook {
            Hook::Tcx => "detach: BPF_LINK_DETACH via our pin",
            Hook::Clsact => "detach: tc filter del (netlink)",
        },
        EPERM,
        || errno(&tamper::detach(net, hook, Direction::Egress)),
        || "the pin cannot be opened / the netlink request is refused".into(),
    ));

    let (prog, prog_pin) = foreign_pass_all("rep");
    rows.push(flood.row(
        match hook {
            Hook::Tcx => "replace: BPF_LINK_UPDATE of our link",
            Hook::Clsact => "replace: netlink replace of our filter",
        },
        EPERM,
        || {
            errno(&tamper::replace(
                net,
                hook,
                Direction::Egress,
                &prog,
                &prog_pin,
            ))
        },
        || "a pass-all program in ours' place".into(),
    ));
    rows.push(flood.row(
        match hook {
            Hook::Tcx => "foreign ahead: tcx BPF_F_BEFORE",
            Hook::Clsact => "foreign ahead: filter at our priority",
        },
        EPERM,
        || errno(&tamper::attach_ahead(net, hook, &prog, &prog_pin)),
        || "a pass-all program before ours".into(),
    ));
    let _ = std::fs::remove_file(&prog_pin);
    rows
}

/// Our maps, written through their pins or zeroed by a program of the attacker's.
fn map_rows(net: &Net) -> Vec<Row> {
    let flood = Attempt::flooding(net);
    let pins = net.pins();
    let mut rows = Vec::new();
    for (path, map) in [
        ("write the config map (via its pin)", map_names::CONFIG),
        ("refill the bucket (via its pin)", map_names::STATE),
        ("zero the counters (via its pin)", map_names::COUNTERS),
    ] {
        rows.push(flood.row(
            path,
            EPERM,
            || errno(&tamper::write_map(&pins.map(map), 0)),
            || "bpf(BPF_OBJ_GET) of the pin".into(),
        ));
    }
    rows.push(flood.row(
        "a BPF program zeroes the counters",
        EPERM,
        || {
            errno(&tamper::zero_counters_by_program(
                &pins.map(map_names::COUNTERS),
            ))
        },
        || "it needs a map fd to load".into(),
    ));
    rows
}

/// Our maps, programs and links opened by id, as `bpftool` does, without any pin.
fn by_id_rows(net: &Net, hook: Hook, st: &serde_json::Value) -> Vec<Row> {
    let quick = Attempt::quick(net);
    let ids = &st["map_ids"];
    let map_ids: Vec<u32> = ["config", "state", "counters"]
        .iter()
        .map(|k| ids[k].as_u64().unwrap() as u32)
        .collect();
    let prog_ids: Vec<u32> = st["programs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["id"].as_u64().unwrap() as u32)
        .collect();
    let refused_all = |cmd, ids: &[u32]| {
        let refused = ids
            .iter()
            .filter(|id| errno(&tamper::fd_by_id(cmd, **id)) == libc::EPERM)
            .count();
        if refused == ids.len() { libc::EPERM } else { 0 }
    };
    let mut rows = Vec::new();
    rows.push(quick.row(
        "our maps by id (BPF_MAP_GET_FD_BY_ID)",
        EPERM,
        || refused_all(tamper::BPF_MAP_GET_FD_BY_ID, &map_ids),
        || format!("map ids {map_ids:?}"),
    ));
    rows.push(quick.row(
        "our programs by id (BPF_PROG_GET_FD_BY_ID)",
        EPERM,
        || refused_all(tamper::BPF_PROG_GET_FD_BY_ID, &prog_ids),
        || format!("program ids {prog_ids:?}"),
    ));
    // Ours: the refusal's cgroup link and the guard's 8 LSM links, plus 2 tcx links.
    let ours = 9 + if hook == Hook::Tcx { 2 } else { 0 };
    let seen = std::cell::Cell::new((0, 0));
    rows.push(quick.row(
        "our links by id (BPF_LINK_GET_FD_BY_ID)",
        EPERM,
        || {
            let links = tamper::all_link_ids();
            let refused = links
                .iter()
                .filter(|id| {
                    errno(&tamper::fd_by_id(tamper::BPF_LINK_GET_FD_BY_ID, **id)) == libc::EPERM
                })
                .count();
            seen.set((refused, links.len()));
            if refused >= ours { libc::EPERM } else { 0 }
        },
        || {
            let (refused, all) = seen.get();
            format!("{refused} of {all} link ids refused, {ours} are ours")
        },
    ));
    rows
}

/// The pin root removed, which would leave the daemon's objects unreachable by path.
fn unlink_pins_row(net: &Net) -> Row {
    let pins = net.pins();
    Attempt::flooding(net).row(
        "unlink our pins (rm -r of the pin root)",
        EPERM,
        || errno(&std::fs::remove_dir_all(&net.pin_root)),
        || {
            let stat = std::fs::metadata(pins.prog("rw_egress"));
            format!("stat of our program pin afterwards: errno {}", errno(&stat))
        },
    )
}

/// The daemon's process: traced, its memory or fds taken, or its identity assumed.
fn process_rows(net: &Net, pid: i32) -> Vec<Row> {
    let quick = Attempt::quick(net);
    let mut rows = Vec::new();
    rows.push(quick.row(
        "ptrace the daemon (PTRACE_ATTACH)",
        EPERM,
        // SAFETY: ptrace(2) on the daemon we started; detached again if it ever succeeded.
        || unsafe {
            let r = libc::ptrace(libc::PTRACE_ATTACH, pid, 0, 0);
            let e = errno(&tamper::errno_of(r));
            if r == 0 {
                libc::ptrace(libc::PTRACE_DETACH, pid, 0, 0);
            }
            e
        },
        || format!("daemon pid {pid}"),
    ));
    rows.push(quick.row(
        "the daemon's memory (/proc/PID/mem)",
        &[libc::EPERM, libc::EACCES],
        || {
            errno(
                &std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(format!("/proc/{pid}/mem")),
            )
        },
        || "open O_RDWR".into(),
    ));
    rows.push(quick.row(
        "the daemon's fds (pidfd_getfd)",
        EPERM,
        || pidfd_getfd_errno(pid),
        || "fds 3..15".into(),
    ));
    let exe = bin("rackwardend");
    rows.push(quick.row(
        "become the daemon: prctl(PR_SET_MM_EXE_FILE)",
        EPERM,
        || {
            let f = std::fs::File::open(&exe).expect("open the daemon binary read-only");
            // SAFETY: prctl(2) with an fd we hold; refused before it changes anything.
            let r = unsafe {
                libc::prctl(
                    libc::PR_SET_MM,
                    libc::PR_SET_MM_EXE_FILE,
                    f.as_raw_fd() as libc::c_ulong,
                    0,
                    0,
                )
            };
            errno(&tamper::errno_of(r as libc::c_long))
        },
        || "this test process would run as the daemon's executable".into(),
    ));
    rows
}

/// Tries to take one of the daemon's fds 3..15 with pidfd_getfd: 0 if one was taken, else
/// the last errno (-1 if the daemon's pidfd could not be opened).
fn pidfd_getfd_errno(pid: i32) -> i32 {
    // SAFETY: pidfd_open/pidfd_getfd syscalls on the daemon we started; fds closed.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid, 0);
        if pidfd < 0 {
            return -1;
        }
        let mut e = 0;
        for target in 3..16 {
            let r = libc::syscall(libc::SYS_pidfd_getfd, pidfd, target, 0);
            if r >= 0 {
                libc::close(r as i32);
                e = 0;
                break;
            }
            e = std::io::Error::last_os_error().raw_os_error().unwrap_or(-1);
        }
        libc::close(pidfd as i32);
        e
    }
}

/// A cap change under the seal: new programs and a new frozen config map, which the next
/// check seals again (a new guard generation, in force before the old one goes).
fn cap_change_row(net: &Net, st: &serde_json::Value) -> Row {
    let pins = net.pins();
    let old_config = st["map_ids"]["config"].as_u64().unwrap();
    let set_cap = |rate: &str| {
        let out = std::process::Command::new(bin("rackwarden"))
            .args(["cap", "set", "--egress", rate, "--force", "--socket"])
            .arg(net.socket_path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let seen = std::cell::Cell::new(0u64);
    Attempt::quick(net).row(
        "cap change: the new generation is sealed",
        EPERM,
        || {
            set_cap("2 MB/s");
            // The next hook check (500 ms) seals the new generation.
            std::thread::sleep(Duration::from_millis(1500));
            let st = status_json(&net.socket_path());
            let new_config = st["map_ids"]["config"].as_u64().unwrap();
            seen.set(new_config);
            assert_ne!(
                new_config, old_config,
                "a cap change makes a new config map"
            );
            assert_eq!(
                st["self_protection"]["lsm_guard"]["state"], "sealed",
                "{st}"
            );
            let by_pin = errno(&tamper::write_map(&pins.map(map_names::CONFIG), 0));
            let by_id = errno(&tamper::fd_by_id(
                tamper::BPF_MAP_GET_FD_BY_ID,
                new_config as u32,
            ));
            set_cap("1 MB/s");
            std::thread::sleep(Duration::from_millis(1500));
            if by_pin == libc::EPERM && by_id == libc::EPERM {
                libc::EPERM
            } else {
                by_pin.max(by_id)
            }
        },
        || {
            format!(
                "config map #{old_config} -> #{}: its pin and its id refused; back to 1 MB/s",
                seen.get()
            )
        },
    )
}

/// The daemon dies: the seal is pinned and stays in force.
fn after_kill_rows(net: &Net, hook: Hook, d: &mut Daemon) -> Vec<Row> {
    d.kill9();
    std::thread::sleep(Duration::from_millis(200));
    let after_kill = |path, r: i32, note: String| {
        let (b, t) = net.egress_flood(SECS);
        Row {
            path,
            expected: "refused by the guard, cap held",
            bytes_through: b,
            window_s: t,
            counted: r == libc::EPERM && b as f64 <= BURST as f64 + CAP as f64 * t,
            note,
        }
    };
    let mut rows = Vec::new();
    let r = errno(&tamper::detach(net, hook, Direction::Egress));
    rows.push(after_kill(
        "daemon killed (-9), then detach",
        r,
        format!("errno {r}; no daemon runs"),
    ));
    let exe = bin("rackwardend");
    let r = errno(&std::fs::OpenOptions::new().write(true).open(&exe));
    rows.push(after_kill(
        "daemon killed, then write its binary",
        r,
        format!("errno {r}; open O_WRONLY of {}", exe.display()),
    ));
    rows
}
