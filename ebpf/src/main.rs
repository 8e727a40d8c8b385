//! The rack limiter: a tc policer for egress and ingress of each frontend interface.
//!
//! This is the only place a packet is dropped for budget. Algorithm: GCRA (a token bucket
//! written as a virtual clock). The bucket state is one u64 `tat_ns` per direction, shared by
//! all CPUs and advanced only with compare-and-exchange, so concurrent senders can never spend
//! the same budget twice: over any window T, passed bytes <= burst + rate * T exactly.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{cgroup_sockopt, classifier, map},
    maps::{Array, PerCpuArray},
    programs::{SockoptContext, TcContext},
};
use core::intrinsics::{AtomicOrdering, atomic_cxchg};
use rackwarden_common::{
    BucketState, CONFIG_MAGIC, LimiterConfig, Counters, DIR_EGRESS, DIR_INGRESS, NUM_BUCKETS,
    PACKET_QDISC_BYPASS, RefusalCounters, SOL_PACKET, SOL_XDP, XDP_UMEM_REG,
};

/// `BPF_F_RDONLY_PROG`: no program can write the caps, ours included (it only reads them).
/// The daemon writes them once and freezes the map, so no syscall can either.
const BPF_F_RDONLY_PROG: u32 = 1 << 7;

#[map(name = "RW_CONFIG")]
static RW_CONFIG: Array<LimiterConfig> = Array::pinned(1, BPF_F_RDONLY_PROG);

#[map(name = "RW_STATE")]
static RW_STATE: Array<BucketState> = Array::pinned(NUM_BUCKETS, 0);

#[map(name = "RW_COUNTERS")]
static RW_COUNTERS: PerCpuArray<Counters> = PerCpuArray::pinned(NUM_BUCKETS, 0);

/// How many lost compare-and-exchange races a packet tolerates before it is dropped. Each
/// loss means another CPU made progress, so this only bites under extreme contention, and
/// then it fails closed (drop) rather than open.
const MAX_CAS_RETRIES: u32 = 16;

#[classifier]
pub fn rw_egress(ctx: TcContext) -> i32 {
    police(&ctx, DIR_EGRESS)
}

#[classifier]
pub fn rw_ingress(ctx: TcContext) -> i32 {
    police(&ctx, DIR_INGRESS)
}

#[inline(always)]
fn police(ctx: &TcContext, dir: u32) -> i32 {
    let len = ctx.len() as u64; // skb->len: a GSO super-packet counts in full.
    let Some(counters) = RW_COUNTERS.get_ptr_mut(dir) else {
        return TC_ACT_SHOT;
    };
    // SAFETY: per-CPU slot, only this CPU touches it while this program runs.
    let counters = unsafe { &mut *counters };

    let verdict = decide(dir, len);
    match verdict {
        Verdict::Pass => {
            counters.passed_bytes = counters.passed_bytes.wrapping_add(len);
            counters.passed_packets = counters.passed_packets.wrapping_add(1);
            TC_ACT_OK
        }
        drop => {
            counters.dropped_bytes = counters.dropped_bytes.wrapping_add(len);
            counters.dropped_packets = counters.dropped_packets.wrapping_add(1);
            match drop {
                Verdict::DropUnconfigured => {
                    counters.unconfigured_drops = counters.unconfigured_drops.wrapping_add(1)
                }
                Verdict::DropContention => {
                    counters.contention_drops = counters.contention_drops.wrapping_add(1)
                }
                _ => {}
            }
            TC_ACT_SHOT
        }
    }
}

enum Verdict {
    Pass,
    DropOverBudget,
    DropUnconfigured,
    DropContention,
}

#[inline(always)]
fn decide(dir: u32, len: u64) -> Verdict {
    let Some(cfgs) = RW_CONFIG.get(0) else {
        return Verdict::DropUnconfigured;
    };
    // Frozen and read-only: the kernel has read these at load time, they are constants.
    let cfg = *cfgs.get(dir);
    if cfg.magic != CONFIG_MAGIC || cfg.rate_bytes_per_s == 0 {
        return Verdict::DropUnconfigured;
    }
    let Some(state) = RW_STATE.get_ptr_mut(dir) else {
        return Verdict::DropUnconfigured;
    };
    // Cost rounded up: the policer may under-deliver by < 1 ns of budget per packet, never over.
    let cost = (len.wrapping_mul(1_000_000_000) + cfg.rate_bytes_per_s - 1) / cfg.rate_bytes_per_s;
    // SAFETY: a helper call with no arguments; it reads the monotonic clock.
    let now = unsafe { bpf_ktime_get_ns() };
    // Small packets may use the whole bucket; bulk ones stop short of the reserve.
    let depth = if len <= cfg.small_max_len as u64 {
        cfg.tau_ns
    } else {
        cfg.bulk_tau_ns
    };
    let limit = now.wrapping_add(depth);
    // SAFETY: `state` points into a map value that lives as long as the map.
    let tat_ptr = unsafe { &raw mut (*state).tat_ns };
    // A plain (volatile) read is enough: a stale value only makes the exchange below fail
    // and retry with the value the other CPU wrote.
    // SAFETY: `tat_ptr` is the aligned u64 inside the map value above.
    let mut old = unsafe { core::ptr::read_volatile(tat_ptr) };
    let mut tries = 0;
    while tries < MAX_CAS_RETRIES {
        let base = if old > now { old } else { now };
        let new = base.wrapping_add(cost);
        if new > limit {
            return Verdict::DropOverBudget;
        }
        // SAFETY: `tat_ptr` is an aligned u64 in a map value shared by all CPUs; the
        // compare-and-exchange (BPF_CMPXCHG) is the only write to it.
        let (seen, ok) = unsafe {
            atomic_cxchg::<u64, { AtomicOrdering::SeqCst }, { AtomicOrdering::SeqCst }>(
                tat_ptr, old, new,
            )
        };
        if ok {
            return Verdict::Pass;
        }
        old = seen;
        tries += 1;
    }
    Verdict::DropContention
}

#[map(name = "RW_REFUSALS")]
static RW_REFUSALS: PerCpuArray<RefusalCounters> = PerCpuArray::pinned(1, 0);

/// Attached at the cgroup v2 root: every process's `setsockopt` passes here. Returning 0
/// makes the call fail with EPERM; 1 lets it through unchanged.
#[cgroup_sockopt(setsockopt)]
pub fn rw_sockopt(ctx: SockoptContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    let (level, optname) = unsafe { ((*ctx.sockopt).level, (*ctx.sockopt).optname) };
    let refuse = (level == SOL_PACKET && optname == PACKET_QDISC_BYPASS)
        || (level == SOL_XDP && optname == XDP_UMEM_REG);
    if !refuse {
        return 1;
    }
    if let Some(c) = RW_REFUSALS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU touches it while this program runs.
        let c = unsafe { &mut *c };
        if optname == PACKET_QDISC_BYPASS {
            c.qdisc_bypass = c.qdisc_bypass.wrapping_add(1);
        } else {
            c.xdp_umem_reg = c.xdp_umem_reg.wrapping_add(1);
        }
        // SAFETY: helpers without preconditions.
        unsafe {
            c.last_ns = bpf_ktime_get_ns();
            c.last_cgroup_id = bpf_get_current_cgroup_id();
            c.last_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        }
        c.last_optname = optname;
    }
    0
}

mod panic;

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
