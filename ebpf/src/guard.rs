//! The self-protection guard: programs that refuse, for every process but the daemon, what
//! would switch the policer off. This is where a tamper attempt is refused. The daemon loads
//! them as BPF LSM programs on `bpf_lsm_<hook>` where `bpf` is an active LSM, and otherwise
//! the very same instructions as `fmod_ret` programs on `security_<hook>` (see
//! `daemon/src/guard/fmod_ret.rs`): both see the hook's arguments as one u64 each, in order,
//! and both refuse the call with a non-zero return, so nothing here depends on which.
//!
//! Our objects are named in one frozen config (`RW_GUARD`, see `rackwarden_common::guard`):
//! - a map or program fd of ours (by id, by pin, in any mode): refused at `bpf_map` /
//!   `bpf_prog`, the hooks the kernel calls whenever it hands out such an fd, so no other
//!   process can hold one to detach, update, or load a program that writes our maps;
//! - a link fd of ours by id: refused at `bpf` (`BPF_LINK_GET_FD_BY_ID`); by pin: our pin
//!   directories refuse every lookup (`inode_permission`), so no pin of ours can be opened,
//!   unlinked or renamed, nor a pin put beside ours;
//! - tcx or XDP attach/detach on our interfaces (`bpf`), and rtnetlink qdisc, filter and
//!   chain changes on them (`netlink_send`): the clsact policer is a netlink filter, which
//!   no `bpf()` hook sees;
//! - becoming the daemon: ptrace of it (`ptrace_access_check`, which also guards
//!   `/proc/PID/mem`, `/proc/PID/fd` and `pidfd_getfd`), writing its executable
//!   (`file_open`), or setting another executable (`task_prctl`);
//! - using the TPM: opening any node of its character devices (`file_open`, by `i_rdev`, so
//!   a node made anew with `mknod` is the same device), so the daemon's AK quotes only what
//!   the daemon asks.
//!
//! The daemon is whoever runs the daemon's executable (`mm->exe_file`, by device and inode).
//! Kernel threads (no `mm`) are never refused.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{lsm, map},
    maps::{Array, PerCpuArray},
    programs::LsmContext,
};
use rackwarden_common::guard::{
    FileId, GUARD_MAGIC, GUARD_MAX_DIRS, GUARD_MAX_IDS, GUARD_MAX_IFACES, GUARD_MAX_NLMSGS,
    GUARD_MAX_TPM_DEVS, GuardConfig, GuardRefusals,
};

/// No program can write the config, ours included; the daemon freezes it after writing it.
const BPF_F_RDONLY_PROG: u32 = 1 << 7;
const EPERM: i32 = 1;

#[map(name = "RW_GUARD")]
static RW_GUARD: Array<GuardConfig> = Array::with_max_entries(1, BPF_F_RDONLY_PROG);

#[map(name = "RW_GUARD_REFUSALS")]
static RW_GUARD_REFUSALS: PerCpuArray<GuardRefusals> = PerCpuArray::with_max_entries(1, 0);

// `enum bpf_cmd`.
const BPF_PROG_ATTACH: i32 = 8;
const BPF_PROG_DETACH: i32 = 9;
const BPF_LINK_CREATE: i32 = 28;
const BPF_LINK_GET_FD_BY_ID: i32 = 30;
// `enum bpf_attach_type`.
const BPF_XDP: u32 = 37;
const BPF_TCX_INGRESS: u32 = 46;
const BPF_TCX_EGRESS: u32 = 47;
// Lookup (`MAY_EXEC`) or change (`MAY_WRITE`) in a directory.
const MAY_EXEC: i32 = 1;
const MAY_WRITE: i32 = 2;
const FMODE_WRITE: u32 = 2;
const PR_SET_MM: i32 = 35;
const PR_SET_MM_EXE_FILE: u64 = 13;
const PR_SET_MM_MAP: u64 = 14;
const NETLINK_ROUTE: u16 = 0;
// rtnetlink message types that change a qdisc, filter or chain.
const RTM_NEWQDISC: u16 = 36;
const RTM_DELQDISC: u16 = 37;
const RTM_NEWTFILTER: u16 = 44;
const RTM_DELTFILTER: u16 = 45;
const RTM_NEWCHAIN: u16 = 100;
const RTM_DELCHAIN: u16 = 101;
const NLMSG_HDRLEN: u32 = 16;

/// The refusal counters, by field index (`GuardRefusals` field order).
#[derive(Clone, Copy)]
enum Path {
    LinkFd = 0,
    MapFd = 1,
    ProgFd = 2,
    Attach = 3,
    PinDir = 4,
    Netlink = 5,
    Ptrace = 6,
    Identity = 7,
    Tpm = 8,
}

#[inline(always)]
fn config() -> Option<&'static GuardConfig> {
    let c = RW_GUARD.get(0)?;
    if c.magic == GUARD_MAGIC { Some(c) } else { None }
}

#[inline(always)]
fn read<T>(base: u64, off: u32) -> Option<T> {
    // SAFETY: a checked kernel read; a bad address fails and yields None.
    unsafe { bpf_probe_read_kernel((base + off as u64) as *const T).ok() }
}

/// The executable a task runs; `None` for a kernel thread (no `mm`).
#[inline(always)]
fn exe_of(cfg: &GuardConfig, task: u64) -> Option<FileId> {
    let mm: u64 = read(task, cfg.off.task_mm)?;
    if mm == 0 {
        return None;
    }
    let exe: u64 = read(mm, cfg.off.mm_exe_file)?;
    let inode: u64 = read(exe, cfg.off.file_inode)?;
    file_id(cfg, inode)
}

#[inline(always)]
fn file_id(cfg: &GuardConfig, inode: u64) -> Option<FileId> {
    let sb: u64 = read(inode, cfg.off.inode_sb)?;
    Some(FileId {
        dev: read(sb, cfg.off.sb_dev)?,
        _pad: 0,
        ino: read(inode, cfg.off.inode_ino)?,
    })
}

#[inline(always)]
fn is_daemon_exe(cfg: &GuardConfig, f: &FileId) -> bool {
    f.dev == cfg.daemon_exe.dev && f.ino == cfg.daemon_exe.ino
}

/// Whether the calling task may touch our objects: the daemon, or a kernel thread. A task
/// whose executable cannot be read is not the daemon.
#[inline(always)]
fn caller_is_daemon(cfg: &GuardConfig) -> bool {
    // SAFETY: a helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let Some(mm) = read::<u64>(task, cfg.off.task_mm) else {
        return false;
    };
    if mm == 0 {
        return true;
    }
    match exe_of(cfg, task) {
        Some(f) => is_daemon_exe(cfg, &f),
        None => false,
    }
}

#[inline(always)]
fn refuse(path: Path) -> i32 {
    if let Some(c) = RW_GUARD_REFUSALS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU touches it while this program runs.
        let c = unsafe { &mut *c };
        let n = match path {
            Path::LinkFd => &mut c.link_fd,
            Path::MapFd => &mut c.map_fd,
            Path::ProgFd => &mut c.prog_fd,
            Path::Attach => &mut c.attach,
            Path::PinDir => &mut c.pin_dir,
            Path::Netlink => &mut c.netlink,
            Path::Ptrace => &mut c.ptrace,
            Path::Identity => &mut c.identity,
            Path::Tpm => &mut c.tpm,
        };
        *n = n.wrapping_add(1);
        // SAFETY: helpers without preconditions.
        unsafe {
            c.last_ns = bpf_ktime_get_ns();
            c.last_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        }
        c.last_path = path as u32;
    }
    -EPERM
}

#[inline(always)]
fn listed(ids: &[u32; GUARD_MAX_IDS], n: u32, id: u32) -> bool {
    let mut i = 0;
    while i < GUARD_MAX_IDS {
        if i as u32 >= n {
            return false;
        }
        if ids[i] == id {
            return true;
        }
        i += 1;
    }
    false
}

#[inline(always)]
fn guarded_iface(cfg: &GuardConfig, netns: u32, ifindex: u32) -> bool {
    let mut i = 0;
    while i < GUARD_MAX_IFACES {
        if i as u32 >= cfg.n_ifaces {
            return false;
        }
        let g = &cfg.ifaces[i];
        if g.netns == netns && g.ifindex == ifindex {
            return true;
        }
        i += 1;
    }
    false
}

/// The calling task's network namespace (the one a `bpf()` ifindex is resolved in).
#[inline(always)]
fn current_netns(cfg: &GuardConfig) -> Option<u32> {
    // SAFETY: a helper without preconditions.
    let task = unsafe { bpf_get_current_task() };
    let nsproxy: u64 = read(task, cfg.off.task_nsproxy)?;
    let net: u64 = read(nsproxy, cfg.off.nsproxy_net_ns)?;
    read(net, cfg.off.net_inum)
}

/// `security_bpf(cmd, attr, size[, kernel])`: `attr` is the kernel's copy of the request.
#[lsm(hook = "bpf")]
pub fn rw_guard_bpf(ctx: LsmContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let cmd: i32 = ctx.arg(0);
    let attr: u64 = ctx.arg(1);
    let path = match cmd {
        BPF_LINK_GET_FD_BY_ID => match read::<u32>(attr, 0) {
            Some(id) if listed(&cfg.links, cfg.n_links, id) => Path::LinkFd,
            _ => return 0,
        },
        BPF_LINK_CREATE | BPF_PROG_ATTACH | BPF_PROG_DETACH => {
            let Some(attach_type) = read::<u32>(attr, 8) else {
                return 0;
            };
            if !matches!(attach_type, BPF_XDP | BPF_TCX_INGRESS | BPF_TCX_EGRESS) {
                return 0;
            }
            // link_create.target_ifindex is at 4; prog_attach/detach's target_ifindex at 0.
            let at = if cmd == BPF_LINK_CREATE { 4 } else { 0 };
            let (Some(ifindex), Some(netns)) = (read::<u32>(attr, at), current_netns(cfg)) else {
                return 0;
            };
            if !guarded_iface(cfg, netns, ifindex) {
                return 0;
            }
            Path::Attach
        }
        _ => return 0,
    };
    if caller_is_daemon(cfg) { 0 } else { refuse(path) }
}

/// `security_bpf_map(map, fmode)`: called whenever the kernel makes a new fd for a map.
#[lsm(hook = "bpf_map")]
pub fn rw_guard_bpf_map(ctx: LsmContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let map: u64 = ctx.arg(0);
    match read::<u32>(map, cfg.off.map_id) {
        Some(id) if listed(&cfg.maps, cfg.n_maps, id) && !caller_is_daemon(cfg) => {
            refuse(Path::MapFd)
        }
        _ => 0,
    }
}

/// `security_bpf_prog(prog)`: called whenever the kernel makes a new fd for a program.
#[lsm(hook = "bpf_prog")]
pub fn rw_guard_bpf_prog(ctx: LsmContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let prog: u64 = ctx.arg(0);
    let Some(aux) = read::<u64>(prog, cfg.off.prog_aux) else {
        return 0;
    };
    match read::<u32>(aux, cfg.off.prog_aux_id) {
        Some(id) if listed(&cfg.progs, cfg.n_progs, id) && !caller_is_daemon(cfg) => {
            refuse(Path::ProgFd)
        }
        _ => 0,
    }
}

/// `security_inode_permission(inode, mask)`: every path walk step passes here, so it checks
/// the cheap things first (the mask, the superblock) and the caller last.
#[lsm(hook = "inode_permission")]
pub fn rw_guard_inode_permission(ctx: LsmContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let mask: i32 = ctx.arg(1);
    if mask & (MAY_EXEC | MAY_WRITE) == 0 {
        return 0;
    }
    let inode: u64 = ctx.arg(0);
    let Some(sb) = read::<u64>(inode, cfg.off.inode_sb) else {
        return 0;
    };
    if read::<u32>(sb, cfg.off.sb_dev) != Some(cfg.pin_dev) {
        return 0;
    }
    let Some(ino) = read::<u64>(inode, cfg.off.inode_ino) else {
        return 0;
    };
    let mut i = 0;
    let mut ours = false;
    while i < GUARD_MAX_DIRS {
        if i as u32 >= cfg.n_dirs {
            break;
        }
        if cfg.dirs[i] == ino {
            ours = true;
            break;
        }
        i += 1;
    }
    if ours && !caller_is_daemon(cfg) { refuse(Path::PinDir) } else { 0 }
}

/// `security_netlink_send(sk, skb)`: every message of an rtnetlink `sendmsg` that changes a
/// qdisc, filter or chain on one of our interfaces (tcmsg.tcm_ifindex, in the socket's
/// namespace). A batch longer than we read is refused too: what is not read is not known.
#[lsm(hook = "netlink_send")]
pub fn rw_guard_netlink_send(ctx: LsmContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    if cfg.n_ifaces == 0 {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    if read::<u16>(sk, cfg.off.sk_protocol) != Some(NETLINK_ROUTE) {
        return 0;
    }
    let skb: u64 = ctx.arg(1);
    let (Some(net), Some(data), Some(len)) = (
        read::<u64>(sk, cfg.off.sk_net),
        read::<u64>(skb, cfg.off.skb_data),
        read::<u32>(skb, cfg.off.skb_len),
    ) else {
        return 0;
    };
    let Some(netns) = read::<u32>(net, cfg.off.net_inum) else {
        return 0;
    };
    let mut off: u32 = 0;
    let mut hit = false;
    let mut n = 0;
    while n < GUARD_MAX_NLMSGS {
        // The header and the tcmsg fields up to tcm_parent.
        if off + NLMSG_HDRLEN + 16 > len {
            break;
        }
        let at = data + off as u64;
        let (Some(msg_len), Some(ty)) = (read::<u32>(at, 0), read::<u16>(at, 4)) else {
            break;
        };
        let tc_change = match ty {
            RTM_DELQDISC | RTM_NEWTFILTER | RTM_DELTFILTER | RTM_NEWCHAIN | RTM_DELCHAIN => true,
            // A new qdisc matters only where it replaces clsact/ingress (TC_H_CLSACT).
            RTM_NEWQDISC => read::<u32>(at, NLMSG_HDRLEN + 12) == Some(0xFFFF_FFF1),
            _ => false,
        };
        if tc_change {
            if let Some(ifindex) = read::<u32>(at, NLMSG_HDRLEN + 4) {
                if guarded_iface(cfg, netns, ifindex) {
                    hit = true;
                    break;
                }
            }
        }
        let step = (msg_len + 3) & !3;
        if step < NLMSG_HDRLEN {
            break;
        }
        off += step;
        n += 1;
    }
    if !hit && n == GUARD_MAX_NLMSGS && off < len {
        hit = true;
    }
    if hit && !caller_is_daemon(cfg) { refuse(Path::Netlink) } else { 0 }
}

/// `security_ptrace_access_check(child, mode)`.
#[lsm(hook = "ptrace_access_check")]
pub fn rw_guard_ptrace(ctx: LsmContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let child: u64 = ctx.arg(0);
    match exe_of(cfg, child) {
        Some(f) if is_daemon_exe(cfg, &f) && !caller_is_daemon(cfg) => refuse(Path::Ptrace),
        _ => 0,
    }
}

const S_IFMT: u16 = 0o170000;
const S_IFCHR: u16 = 0o020000;

/// Whether `inode` is a node of one of the TPM's character devices.
#[inline(always)]
fn is_tpm_device(cfg: &GuardConfig, inode: u64) -> bool {
    if cfg.n_tpm_devs == 0 {
        return false;
    }
    match read::<u16>(inode, cfg.off.inode_mode) {
        Some(mode) if mode & S_IFMT == S_IFCHR => {}
        _ => return false,
    }
    let Some(rdev) = read::<u32>(inode, cfg.off.inode_rdev) else {
        return false;
    };
    let mut i = 0;
    while i < GUARD_MAX_TPM_DEVS {
        if i as u32 >= cfg.n_tpm_devs {
            break;
        }
        if cfg.tpm_devs[i] == rdev {
            return true;
        }
        i += 1;
    }
    false
}

/// `security_file_open(file)`: nobody but the daemon opens the TPM, in any mode; nobody opens
/// the daemon's executable for writing, the daemon included (it is replaced by a new file, a
/// new inode, which is not the daemon's).
#[lsm(hook = "file_open")]
pub fn rw_guard_file_open(ctx: LsmContext) -> i32 {
    let Some(cfg) = config() else { return 0 };
    let file: u64 = ctx.arg(0);
    let Some(inode) = read::<u64>(file, cfg.off.file_inode) else {
        return 0;
    };
    if is_tpm_device(cfg, inode) && !caller_is_daemon(cfg) {
        return refuse(Path::Tpm);
    }
    match read::<u32>(file, cfg.off.file_mode) {
        Some(mode) if mode & FMODE_WRITE != 0 => {}
        _ => return 0,
    }
    match file_id(cfg, inode) {
        Some(f) if is_daemon_exe(cfg, &f) => refuse(Path::Identity),
        _ => 0,
    }
}

/// `security_task_prctl(option, arg2, ...)`: no process may set its executable file, or it
/// could name the daemon's.
#[lsm(hook = "task_prctl")]
pub fn rw_guard_task_prctl(ctx: LsmContext) -> i32 {
    if config().is_none() {
        return 0;
    }
    let option: i32 = ctx.arg(0);
    let arg2: u64 = ctx.arg(1);
    if option == PR_SET_MM && (arg2 == PR_SET_MM_EXE_FILE || arg2 == PR_SET_MM_MAP) {
        refuse(Path::Identity)
    } else {
        0
    }
}

mod panic;

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
