//! The tapped limiter: the same policer and `setsockopt` refusals as `main.rs`, and every
//! frame the bucket passes is copied, whole, into the ring buffer `RW_TAP` for the daemon
//! (layout: `rackwarden_common::tap`). The daemon loads this object instead of the plain one
//! when `[taps]` is configured; both name their programs `rw_egress` and `rw_ingress`, so
//! pins, the guard and upgrades treat them alike.
//!
//! The copy happens in the program that charged the frame, before it is passed: a frame the
//! ring cannot take whole (full, too large, unreadable) is dropped and counted in
//! `RW_TAP_STATS`, so the kernel's passed counters are exactly the bytes the ring received.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

use aya_ebpf::{
    helpers::{
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
        generated::{bpf_ringbuf_output, bpf_skb_load_bytes},
    },
    macros::{classifier, map},
    maps::{PerCpuArray, RingBuf},
    programs::TcContext,
};
use rackwarden_common::{
    DIR_EGRESS, DIR_INGRESS, NUM_BUCKETS,
    tap::{
        TAP_CHUNK_BYTES, TAP_CHUNK_MAGIC, TAP_MAX_CHUNKS, TAP_MAX_FRAME, TAP_RING_BYTES,
        TapChunkHeader, TapStats,
    },
};

mod policer;
mod sockopt;

use policer::TapFailure;

#[map(name = "RW_TAP")]
static RW_TAP: RingBuf = RingBuf::pinned(TAP_RING_BYTES, 0);

#[map(name = "RW_TAP_STATS")]
static RW_TAP_STATS: PerCpuArray<TapStats> = PerCpuArray::pinned(NUM_BUCKETS, 0);

/// One chunk of scratch per CPU for frames larger than an MTU slot: loaded here, then copied
/// into the ring with its header by one `bpf_ringbuf_output`. Not pinned: it holds nothing
/// between runs.
#[map(name = "RW_TAP_SCRATCH")]
static RW_TAP_SCRATCH: PerCpuArray<Slot<{ TAP_CHUNK_BYTES as usize }>> =
    PerCpuArray::with_max_entries(1, 0);

#[classifier]
pub fn rw_egress(ctx: TcContext) -> i32 {
    policer::police(&ctx, DIR_EGRESS, tap)
}

#[classifier]
pub fn rw_ingress(ctx: TcContext) -> i32 {
    policer::police(&ctx, DIR_INGRESS, tap)
}

/// Copies the whole frame (`len` = `skb->len`, linear and paged parts alike) into the ring,
/// and counts a failure by its reason.
#[inline(always)]
fn tap(ctx: &TcContext, dir: u32, len: u64) -> Result<(), TapFailure> {
    let Some(stats) = RW_TAP_STATS.get_ptr_mut(dir) else {
        return Err(TapFailure::Unreadable);
    };
    // SAFETY: per-CPU slot, only this CPU touches it while this program runs.
    let stats = unsafe { &mut *stats };
    let seq = stats.next_frame_seq;
    stats.next_frame_seq = seq.wrapping_add(1);
    let result = copy_frame(ctx, dir, len, seq);
    match result {
        Ok(()) => {}
        Err(TapFailure::RingFull) => {
            stats.ring_full_frames = stats.ring_full_frames.wrapping_add(1);
            stats.ring_full_bytes = stats.ring_full_bytes.wrapping_add(len);
        }
        Err(TapFailure::TooLarge) => {
            stats.too_large_frames = stats.too_large_frames.wrapping_add(1);
            stats.too_large_bytes = stats.too_large_bytes.wrapping_add(len);
        }
        Err(TapFailure::Unreadable) => {
            stats.unreadable_frames = stats.unreadable_frames.wrapping_add(1);
            stats.unreadable_bytes = stats.unreadable_bytes.wrapping_add(len);
        }
    }
    result
}

/// A ring slot: the header and room for `N` bytes of the frame. Three sizes, so that an ACK
/// does not take a 4 KiB slot and a full-MTU frame takes one slot.
#[repr(C)]
struct Slot<const N: usize> {
    header: TapChunkHeader,
    data: [u8; N],
}

/// Frames up to this size take one small slot (ACKs, token messages).
const TINY: usize = 128;
/// Frames up to this size take one MTU slot.
const MTU: usize = 1536;

/// Copies the frame into the ring: a frame up to an MTU is loaded straight into a slot
/// reserved in the ring (one copy), in the smallest slot it fits; a larger one goes in chunks
/// of `TAP_CHUNK_BYTES` through the scratch.
#[inline(always)]
fn copy_frame(ctx: &TcContext, dir: u32, len: u64, seq: u64) -> Result<(), TapFailure> {
    if len == 0 || len > TAP_MAX_FRAME as u64 {
        return Err(TapFailure::TooLarge);
    }
    let frame_len = len as u32;
    // SAFETY: helpers without preconditions.
    let (cpu, now) = unsafe { (bpf_get_smp_processor_id(), bpf_ktime_get_ns()) };
    let head = TapChunkHeader {
        magic: TAP_CHUNK_MAGIC,
        dir,
        cpu,
        frame_len,
        chunk_offset: 0,
        chunk_len: 0,
        frame_seq: seq,
        ktime_ns: now,
    };
    if frame_len as usize <= TINY {
        return put::<TINY>(ctx, head, 0, frame_len);
    }
    if frame_len as usize <= MTU {
        return put::<MTU>(ctx, head, 0, frame_len);
    }
    // Larger frames (GSO super-packets) go through a per-CPU scratch chunk and
    // `bpf_ringbuf_output`: a reservation held across loop iterations makes the 6.1
    // verifier explore every path of the loop (over its million-instruction limit).
    let Some(chunk) = RW_TAP_SCRATCH.get_ptr_mut(0) else {
        return Err(TapFailure::Unreadable);
    };
    // SAFETY: per-CPU scratch, only this CPU touches it while this program runs.
    let chunk = unsafe { &mut *chunk };
    let mut offset: u32 = 0;
    for _ in 0..TAP_MAX_CHUNKS {
        if offset >= frame_len {
            break;
        }
        let mut n = frame_len - offset;
        if n > TAP_CHUNK_BYTES {
            n = TAP_CHUNK_BYTES;
        }
        // See `put` for why the bound is written this way.
        let n = (core::hint::black_box(n).wrapping_sub(1) & (TAP_CHUNK_BYTES - 1)) + 1;
        // SAFETY: `chunk.data` has TAP_CHUNK_BYTES bytes and `n` is at most that.
        let loaded = unsafe {
            bpf_skb_load_bytes(
                ctx.skb.skb as *const _,
                offset,
                chunk.data.as_mut_ptr() as *mut _,
                n,
            )
        };
        if loaded != 0 {
            return Err(TapFailure::Unreadable);
        }
        chunk.header = TapChunkHeader {
            chunk_offset: offset,
            chunk_len: n,
            ..head
        };
        let size = core::mem::size_of::<TapChunkHeader>() as u64 + n as u64;
        // SAFETY: `chunk` is a map value of size_of::<Chunk>() >= `size` bytes.
        let out = unsafe {
            bpf_ringbuf_output(
                &raw const RW_TAP as *mut _,
                chunk as *mut Slot<{ TAP_CHUNK_BYTES as usize }> as *mut _,
                size,
                0,
            )
        };
        if out != 0 {
            return Err(TapFailure::RingFull);
        }
        offset += n;
    }
    if offset == frame_len {
        Ok(())
    } else {
        Err(TapFailure::TooLarge)
    }
}

/// Reserves an `N`-byte slot, loads `n` (1..=N) bytes of the frame from `offset` into it and
/// submits it; a failed load discards the slot.
#[inline(always)]
fn put<const N: usize>(
    ctx: &TcContext,
    head: TapChunkHeader,
    offset: u32,
    n: u32,
) -> Result<(), TapFailure> {
    // `n` is 1..=N here, but LLVM drops a check it can prove and the verifier then cannot:
    // write the bound as arithmetic the verifier follows (an identity for every such `n`),
    // behind a barrier the compiler does not see through. The mask is the power of two at or
    // above N (N = 1536 is not one), so the comparison after it is needed and kept.
    let mask = (N as u32).next_power_of_two() - 1;
    let n = (core::hint::black_box(n).wrapping_sub(1) & mask) + 1;
    if n > N as u32 {
        return Err(TapFailure::TooLarge);
    }
    let Some(mut slot) = RW_TAP.reserve::<Slot<N>>(0) else {
        return Err(TapFailure::RingFull);
    };
    let p = slot.as_mut_ptr();
    // SAFETY: `p` is the reserved slot, `size_of::<Slot<N>>()` bytes, and `n <= N`.
    let loaded = unsafe {
        (*p).header = TapChunkHeader {
            chunk_offset: offset,
            chunk_len: n,
            ..head
        };
        bpf_skb_load_bytes(
            ctx.skb.skb as *const _,
            offset,
            (&raw mut (*p).data) as *mut _,
            n,
        )
    };
    if loaded != 0 {
        slot.discard(0);
        return Err(TapFailure::Unreadable);
    }
    slot.submit(0);
    Ok(())
}

mod panic;

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
