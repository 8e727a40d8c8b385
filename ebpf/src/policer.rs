//! The policer: the only place a packet is dropped for budget. Shared by the plain object
//! (`main.rs`) and the tapped one (`tap.rs`), which differ only in what happens to a packet
//! the bucket passes.
//!
//! Algorithm: GCRA (a token bucket written as a virtual clock). The bucket state is one u64
//! `tat_ns` per direction, shared by all CPUs and advanced only with compare-and-exchange, so
//! concurrent senders can never spend the same budget twice: over any window T, passed bytes
//! <= burst + rate * T exactly.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    helpers::bpf_ktime_get_ns,
    macros::map,
    maps::{Array, PerCpuArray},
    programs::TcContext,
};
use core::intrinsics::{AtomicOrdering, atomic_cxchg};
use rackwarden_common::{BucketState, CONFIG_MAGIC, Counters, LimiterConfig, NUM_BUCKETS};

/// Why a packet the bucket passed was still dropped: the tap could not record it. (The plain
/// object never builds one.)
#[allow(dead_code)]
pub enum TapFailure {
    RingFull,
    TooLarge,
    Unreadable,
}

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

/// Charges the packet to `dir`'s bucket; a packet the bucket passes is then handed to `tap`
/// (the plain object's does nothing), and counted as passed only if `tap` took it. A packet
/// the tap refuses is dropped and counted as dropped: no byte passes untapped.
#[inline(always)]
pub fn police(
    ctx: &TcContext,
    dir: u32,
    tap: impl FnOnce(&TcContext, u32, u64) -> Result<(), TapFailure>,
) -> i32 {
    let len = ctx.len() as u64; // skb->len: a GSO super-packet counts in full.
    let Some(counters) = RW_COUNTERS.get_ptr_mut(dir) else {
        return TC_ACT_SHOT;
    };
    // SAFETY: per-CPU slot, only this CPU touches it while this program runs.
    let counters = unsafe { &mut *counters };

    let verdict = match decide(dir, len) {
        Verdict::Pass => match tap(ctx, dir, len) {
            Ok(()) => Verdict::Pass,
            Err(_) => Verdict::DropTap,
        },
        other => other,
    };
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
    /// Passed by the bucket (and charged), refused by the tap: fail closed.
    DropTap,
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
