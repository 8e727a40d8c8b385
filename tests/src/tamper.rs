//! What another root process does to the policer, on either attachment kind. The daemon
//! picks tcx where the kernel has it and a netlink clsact filter where it does not (Debian's
//! 6.1, in `cargo xtask vm-test`); an attacker uses whatever removes ours on that kernel.

use std::{
    os::fd::{AsRawFd as _, OwnedFd},
    process::Command,
    time::{Duration, Instant},
};

use rackwarden::{
    bpf_syscall,
    limiter::{
        Direction, HookDirection as _,
        loader::{CLSACT_HANDLE_MINOR, CLSACT_PRIORITY},
    },
};

use crate::{Net, in_netns, status_json};

/// How the daemon attached the policer on this kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hook {
    Tcx,
    Clsact,
}

impl Hook {
    /// As the daemon under test reports it.
    pub fn of(net: &Net) -> Hook {
        let st = status_json(&net.socket_path());
        match st["attach_kind"].as_str() {
            Some("tcx") => Hook::Tcx,
            Some("clsact") => Hook::Clsact,
            other => panic!("the daemon reports no attach kind ({other:?}): {st}"),
        }
    }
}

/// Removes our policer from `dir` of the rack interface, as another process would:
/// `bpf(BPF_LINK_DETACH)` on our pinned tcx link, or a netlink delete of our clsact filter.
/// An error carries the errno of the refusal (EPERM under the guard).
pub fn detach(net: &Net, hook: Hook, dir: Direction) -> std::io::Result<()> {
    detach_from(&net.pins(), &net.rack_ns, &net.rack_if, hook, dir)
}

/// [`detach`] for a thread that holds the fixture's parts rather than the fixture: our
/// policer pinned under `pins`, on `iface` in the namespace `ns`. Returns once the hook is
/// empty (tcx takes the program off before the call returns).
pub fn detach_from(
    pins: &rackwarden::pins::PinPaths,
    ns: &str,
    iface: &str,
    hook: Hook,
    dir: Direction,
) -> std::io::Result<()> {
    match hook {
        Hook::Tcx => link_detach(&bpf_syscall::obj_get(&pins.link(iface, dir))?),
        Hook::Clsact => {
            let out = Command::new("ip")
                .args(["netns", "exec", ns, "tc", "filter", "del", "dev"])
                .arg(iface)
                .arg(dir.name())
                .args(["pref", &CLSACT_PRIORITY.to_string()])
                .args(["handle", &format!("0x{CLSACT_HANDLE_MINOR:x}"), "bpf"])
                .output()?;
            tool_result("tc filter del", &out)
        }
    }
}

/// `bpf(BPF_LINK_DETACH)` on a link fd.
fn link_detach(link: &OwnedFd) -> std::io::Result<()> {
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&(link.as_raw_fd() as u32).to_ne_bytes());
    // SAFETY: BPF_LINK_DETACH (34) on a link fd we hold, with an attr buffer of its size.
    let r = unsafe { libc::syscall(libc::SYS_bpf, 34, a.as_mut_ptr(), a.len()) };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// One timed `bpf(BPF_LINK_DETACH)` of our tcx egress link.
#[derive(Debug, Clone, Copy)]
pub struct DetachTiming {
    /// How long the call itself took. tcx unpublishes our program at the start of the call
    /// and waits for an RCU grace period before it returns: no watch at the call's return
    /// can see this part, and traffic crosses uncapped throughout it.
    pub call: Duration,
    /// From the call's return until a query of the hook shows ours again. The query waits
    /// for the RTNL lock our own attach holds through its grace period, so this is an upper
    /// bound on when our program was running again.
    pub back_after: Duration,
}

/// Detaches our tcx egress link from the rack namespace and queries the hook in a tight
/// loop until ours is back; `None` when it is not back within `limit`. tcx only: on clsact
/// the detach is a netlink delete the watch does not see.
pub fn timed_tcx_detach(net: &Net, limit: Duration) -> std::io::Result<Option<DetachTiming>> {
    use aya::programs::{SchedClassifier, TcAttachType};
    let pin = net.pins().link(&net.rack_if, Direction::Egress);
    let iface = net.rack_if.clone();
    in_netns(&net.rack_ns, move || {
        let ours = Direction::Egress.prog_name();
        let link = bpf_syscall::obj_get(&pin)?;
        let called = Instant::now();
        link_detach(&link)?;
        let returned = Instant::now();
        while returned.elapsed() < limit {
            let (_, on_hook) = SchedClassifier::query_tcx(&iface, TcAttachType::Egress)
                .map_err(std::io::Error::other)?;
            if on_hook.iter().any(|p| p.name_as_str() == Some(ours)) {
                return Ok(Some(DetachTiming {
                    call: returned - called,
                    back_after: returned.elapsed(),
                }));
            }
        }
        Ok(None)
    })
}

/// A command-line tool's outcome as an errno: EPERM when it says "Operation not permitted".
pub fn tool_result(what: &str, out: &std::process::Output) -> std::io::Result<()> {
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    if err.contains("Operation not permitted") {
        return Err(std::io::Error::from_raw_os_error(libc::EPERM));
    }
    Err(std::io::Error::other(format!("{what}: {err}")))
}

/// Puts `prog` (pinned at its own path) where ours runs on `dir`, in ours' place: a
/// `BPF_LINK_UPDATE` of our tcx link, or an in-place netlink replace of our clsact filter.
pub fn replace(
    net: &Net,
    hook: Hook,
    dir: Direction,
    prog: &OwnedFd,
    pinned_at: &std::path::Path,
) -> std::io::Result<()> {
    match hook {
        Hook::Tcx => {
            let link = bpf_syscall::obj_get(&net.pins().link(&net.rack_if, dir))?;
            bpf_syscall::link_update(&link, std::os::fd::AsFd::as_fd(prog))
        }
        Hook::Clsact => {
            let (ifc, path) = (net.rack_if.clone(), pinned_at.to_path_buf());
            in_netns(&net.rack_ns, move || {
                use aya::programs::{SchedClassifier, tc};
                let mut p = SchedClassifier::from_pin(&path).map_err(std::io::Error::other)?;
                let existing = tc::SchedClassifierLink::attached(
                    &ifc,
                    dir.tc(),
                    CLSACT_PRIORITY,
                    tc::TcHandle::new(0, CLSACT_HANDLE_MINOR),
                    None,
                )
                .map_err(std::io::Error::other)?;
                let id = p.attach_to_link(existing).map_err(netlink_errno)?;
                // The filter outlives this thread.
                std::mem::forget(p.take_link(id));
                Ok(())
            })
        }
    }
}

/// The errno inside an aya netlink attach error (EPERM under the guard).
fn netlink_errno(e: aya::programs::ProgramError) -> std::io::Error {
    let text = format!("{e:?}");
    if text.contains("Operation not permitted")
        || text.contains("code: 1,")
        || text.contains("EPERM")
    {
        std::io::Error::from_raw_os_error(libc::EPERM)
    } else {
        std::io::Error::other(text)
    }
}

/// Attaches `prog` (pinned at `pinned_at`) ahead of ours on egress: first in tcx order, or
/// a second filter at our clsact priority (cls_bpf runs the newest filter of a priority first).
pub fn attach_ahead(
    net: &Net,
    hook: Hook,
    prog: &OwnedFd,
    pinned_at: &std::path::Path,
) -> std::io::Result<Option<OwnedFd>> {
    let ifc = net.rack_if.clone();
    match hook {
        Hook::Tcx => {
            let fd = prog.try_clone()?;
            in_netns(&net.rack_ns, move || {
                let mut a = [0u8; 128];
                let ifindex = rackwarden::netns::ifindex(&ifc).expect("ifindex");
                a[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
                a[4..8].copy_from_slice(&ifindex.to_ne_bytes());
                a[8..12].copy_from_slice(&47u32.to_ne_bytes()); // BPF_TCX_EGRESS
                a[12..16].copy_from_slice(&8u32.to_ne_bytes()); // BPF_F_BEFORE
                // SAFETY: a zero-padded bpf_attr for BPF_LINK_CREATE.
                let r = unsafe { libc::syscall(libc::SYS_bpf, 28, a.as_mut_ptr(), a.len()) };
                if r < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // SAFETY: a new link fd we now own.
                Ok(Some(unsafe {
                    std::os::fd::FromRawFd::from_raw_fd(r as i32)
                }))
            })
        }
        Hook::Clsact => {
            let path = pinned_at.to_path_buf();
            in_netns(&net.rack_ns, move || {
                use aya::programs::{SchedClassifier, TcAttachType, tc};
                let mut p = SchedClassifier::from_pin(&path).map_err(std::io::Error::other)?;
                let id = p
                    .attach_with_options(
                        &ifc,
                        TcAttachType::Egress,
                        tc::TcAttachOptions::Netlink(tc::NlOptions {
                            priority: CLSACT_PRIORITY,
                            handle: tc::TcHandle::new(0, 1),
                            ..Default::default()
                        }),
                    )
                    .map_err(netlink_errno)?;
                std::mem::forget(p.take_link(id));
                Ok(None)
            })
        }
    }
}

/// `bpf(BPF_MAP_UPDATE_ELEM)` of `key` in the map pinned at `pin`, with an all-zero value (as
/// `bpftool map update` would): resetting a bucket, zeroing counters, clearing a cap.
pub fn write_map(pin: &std::path::Path, key: u32) -> std::io::Result<()> {
    let map = bpf_syscall::obj_get(pin)?;
    // Large enough for any of our values on every possible CPU (per-CPU maps take one value
    // per CPU, each rounded up to 8 bytes).
    let value = vec![0u8; 1 << 16];
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&(map.as_raw_fd() as u32).to_ne_bytes());
    a[8..16].copy_from_slice(&(&key as *const u32 as u64).to_ne_bytes());
    a[16..24].copy_from_slice(&(value.as_ptr() as u64).to_ne_bytes());
    // SAFETY: BPF_MAP_UPDATE_ELEM (2) with pointers that outlive the call.
    let r = unsafe { libc::syscall(libc::SYS_bpf, 2, a.as_mut_ptr(), a.len()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The errno inside a map access error (EPERM: the map is frozen).
pub fn errno(e: &rackwarden::limiter::LimiterError) -> Option<i32> {
    match e {
        rackwarden::limiter::LimiterError::MapAccess {
            source: aya::maps::MapError::SyscallError(s),
            ..
        } => s.io_error.raw_os_error(),
        _ => None,
    }
}

/// An attacker's own BPF program that zeroes `passed_bytes` of the egress counters on every
/// CPU: frozen maps refuse `bpf()` writes, but a program may still write a map it was loaded
/// with. (Our config map is also read-only to programs; counters cannot be, ours count.)
/// Returns how many CPUs it ran on, or the errno that refused the map fd.
pub fn zero_counters_by_program(counters_pin: &std::path::Path) -> std::io::Result<usize> {
    let map = bpf_syscall::obj_get(counters_pin)?;
    let fd = map.as_raw_fd();
    let insn = |code: u8, dst: u8, src: u8, off: i16, imm: i32| {
        let mut b = [0u8; 8];
        b[0] = code;
        b[1] = dst | (src << 4);
        b[2..4].copy_from_slice(&off.to_ne_bytes());
        b[4..8].copy_from_slice(&imm.to_ne_bytes());
        b
    };
    let prog: Vec<[u8; 8]> = vec![
        insn(0x18, 1, 1, 0, fd),  // r1 = map (BPF_PSEUDO_MAP_FD)
        insn(0, 0, 0, 0, 0),      //   (second half of the 64-bit load)
        insn(0x62, 10, 0, -4, 0), // *(u32 *)(r10 - 4) = 0: key DIR_EGRESS
        insn(0xbf, 2, 10, 0, 0),  // r2 = r10
        insn(0x07, 2, 0, 0, -4),  // r2 += -4
        insn(0x85, 0, 0, 0, 1),   // call bpf_map_lookup_elem
        insn(0x15, 0, 0, 1, 0),   // if r0 == 0 goto +1
        insn(0x7a, 0, 0, 0, 0),   // *(u64 *)(r0 + 0) = 0: passed_bytes
        insn(0xb7, 0, 0, 0, 0),   // r0 = 0
        insn(0x95, 0, 0, 0, 0),   // exit
    ];
    // BPF_PROG_TYPE_SOCKET_FILTER
    let prog_fd = crate::load_raw_program(1, &prog.concat(), b"rw_rewind");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for cpu in 0..cpus {
        let pfd = prog_fd.as_raw_fd();
        std::thread::spawn(move || {
            crate::pin_to_cpu(cpu);
            let data = [0u8; 64];
            let mut t = [0u8; 128];
            t[0..4].copy_from_slice(&(pfd as u32).to_ne_bytes());
            t[8..12].copy_from_slice(&(data.len() as u32).to_ne_bytes());
            t[16..24].copy_from_slice(&(data.as_ptr() as u64).to_ne_bytes());
            t[32..36].copy_from_slice(&1u32.to_ne_bytes());
            // SAFETY: BPF_PROG_TEST_RUN (10) on our program with a buffer that outlives it.
            let r = unsafe { libc::syscall(libc::SYS_bpf, 10, t.as_mut_ptr(), t.len()) };
            assert_eq!(
                r,
                0,
                "BPF_PROG_TEST_RUN: {}",
                std::io::Error::last_os_error()
            );
        })
        .join()
        .expect("test run thread");
    }
    Ok(cpus)
}

/// `BPF_{PROG,MAP,LINK}_GET_FD_BY_ID` (13, 14, 30) of `id`, as `bpftool` does for each
/// object it lists.
pub fn fd_by_id(cmd: libc::c_long, id: u32) -> std::io::Result<OwnedFd> {
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&id.to_ne_bytes());
    // SAFETY: a zero-padded bpf_attr for a GET_FD_BY_ID command.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, a.as_mut_ptr(), a.len()) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(r as i32) })
}

pub const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
pub const BPF_MAP_GET_FD_BY_ID: libc::c_long = 14;
pub const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;

/// Every link id on the system (`BPF_LINK_GET_NEXT_ID`).
pub fn all_link_ids() -> Vec<u32> {
    let mut ids = Vec::new();
    let mut id = 0u32;
    loop {
        let mut a = [0u8; 128];
        a[0..4].copy_from_slice(&id.to_ne_bytes());
        // SAFETY: a zero-padded bpf_attr for BPF_LINK_GET_NEXT_ID.
        let r =
            unsafe { libc::syscall(libc::SYS_bpf, BPF_LINK_GET_NEXT_ID, a.as_mut_ptr(), a.len()) };
        if r < 0 {
            return ids;
        }
        id = u32::from_ne_bytes([a[4], a[5], a[6], a[7]]);
        ids.push(id);
    }
}

/// The errno of a failed libc call's return value (`Ok` for success).
pub fn errno_of(r: libc::c_long) -> std::io::Result<()> {
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}
