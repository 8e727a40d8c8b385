//! The tamper watch, for hosts where the guard cannot load: it tells the daemon,
//! through a ring buffer, the moment another process's `bpf()` attach, detach or link update
//! has returned. The daemon then checks its hooks at once instead of at the next poll
//! (`restored_on_event`). It refuses nothing.
//!
//! Two hooks, the same report. The daemon attaches the first the kernel accepts:
//! - `rw_watch_bpf_exit`, fexit on `__x64_sys_bpf`: runs only when `bpf()` returns, so no other
//!   system call pays anything, and attaching it patches only that function's entry (a BPF
//!   trampoline), not the exit path every syscall takes. Needs BTF and trampolines (x86-64
//!   kernels with `CONFIG_DEBUG_INFO_BTF`, e.g. Debian's).
//! - `rw_watch_sys_exit`, a raw tracepoint at `sys_exit`: kernels that refuse the fexit (no
//!   trampolines) still attach it (`BPF_RAW_TRACEPOINT_OPEN`, no kprobe PMU or tracefs
//!   needed). It runs at every syscall exit and leaves at its first comparison for every
//!   syscall but `bpf`; switching the tracepoint on sends every syscall through the slow exit
//!   path (about 30 ns each, `cargo xtask bench watch`).
//!
//! Attaching either live-patches kernel text other CPUs may be running through (the raw
//! tracepoint: the syscall exit path of every CPU). The daemon therefore attaches the watch
//! once per boot and pins it (`daemon/src/limiter/tamper_watch.rs`): a restarted daemon finds
//! it attached and only tells it its new tgid, through `RW_WATCH_DAEMON`.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_kernel},
    macros::{fexit, map, raw_tracepoint},
    maps::{Array, RingBuf},
    programs::{FExitContext, RawTracePointContext},
};
use rackwarden_common::guard::{TamperEvent, WATCHED_BPF_CMDS};

/// The tgid of the daemon that consumes the events (slot 0), written by each daemon that
/// takes the watch over: its own calls are not tampering. A map, not a load-time constant,
/// because the program outlives the daemon that loaded it.
#[map(name = "RW_WATCH_DAEMON")]
static RW_WATCH_DAEMON: Array<u32> = Array::with_max_entries(1, 0);

#[map(name = "RW_WATCH_EVENTS")]
static RW_WATCH_EVENTS: RingBuf = RingBuf::with_byte_size(16 * 4096, 0);

/// x86-64 `struct pt_regs`: the first argument (`di`) and the syscall number (`orig_ax`).
const PT_REGS_DI: usize = 14 * 8;
const PT_REGS_ORIG_AX: usize = 15 * 8;
const NR_BPF: u64 = 321;

/// `sys_exit(struct pt_regs *regs, long ret)`: every system call's exit.
#[raw_tracepoint(tracepoint = "sys_exit")]
pub fn rw_watch_sys_exit(ctx: RawTracePointContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    // SAFETY: checked kernel reads of the task's saved registers.
    let Ok(nr) = (unsafe { bpf_probe_read_kernel(regs.wrapping_add(PT_REGS_ORIG_AX) as *const u64) })
    else {
        return 0;
    };
    if nr != NR_BPF {
        return 0;
    }
    report(regs, ctx.arg(1));
    0
}

/// `long __x64_sys_bpf(const struct pt_regs *regs)`: only `bpf()`. An fexit program's
/// arguments are the function's, then its return value.
#[fexit(function = "__x64_sys_bpf")]
pub fn rw_watch_bpf_exit(ctx: FExitContext) -> i32 {
    report(ctx.arg(0), ctx.arg(1));
    0
}

/// One returned `bpf()` call: reported when it succeeded, is one of the watched commands and
/// was not made by the daemon itself.
#[inline(always)]
fn report(regs: *const u8, ret: i64) {
    if ret < 0 {
        return;
    }
    // SAFETY: a checked kernel read of the task's saved registers.
    let Ok(cmd) = (unsafe { bpf_probe_read_kernel(regs.wrapping_add(PT_REGS_DI) as *const u64) })
    else {
        return;
    };
    let cmd = cmd as u32;
    if !WATCHED_BPF_CMDS.contains(&cmd) {
        return;
    }
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if RW_WATCH_DAEMON.get(0).is_some_and(|daemon| *daemon == tgid) {
        return;
    }
    let _ = RW_WATCH_EVENTS.output::<TamperEvent>(TamperEvent { cmd, tgid, ret }, 0);
}

mod panic;

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
