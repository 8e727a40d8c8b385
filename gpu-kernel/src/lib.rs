//! The GPU wipe kernels, compiled to PTX by `daemon/build.rs` and loaded by the daemon's GPU
//! backend through the CUDA driver API (`cuModuleLoadData`), so nothing CUDA is needed at
//! build time and the driver compiles the PTX for whatever card it finds.
//!
//! The bytes come from `rackwarden_common::wipe::stream_block`, the very function the host
//! wipe uses: the host computes the AES seed of each 64 KiB segment and uploads the table;
//! each thread writes or checks one 16-byte block at a time (one `v4.u32` access), in a
//! grid-stride loop.
//!
//! Every chunk the host launches begins a segment, so block `b` of a chunk is block
//! `b % 4096` of the chunk's segment `b / 4096`, whose seed is `seeds[b / 4096]` (the host
//! passes the table already offset to the chunk's first segment).
#![no_std]
#![feature(abi_ptx, stdarch_nvptx)]

use core::{
    arch::nvptx,
    sync::atomic::{AtomicU64, Ordering},
};

use rackwarden_common::wipe::{SEGMENT_BLOCKS, SegmentSeed, stream_block};

/// One 16-byte block, aligned so each access is a single vector load or store.
#[repr(C, align(16))]
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Block([u32; 4]);

#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    // Nothing here can panic (no indexing, wrapping arithmetic); if it ever did, trap so the
    // launch fails and the host reports the device as failed, instead of spinning.
    // SAFETY: a PTX trap instruction: no memory access; it ends the launch.
    unsafe { nvptx::trap() }
}

/// This thread's first block and the grid's stride.
#[inline(always)]
unsafe fn grid() -> (u64, u64) {
    // SAFETY: reads of this thread's special registers: always valid in a kernel.
    unsafe {
        let dim = nvptx::_block_dim_x() as u64;
        let first = nvptx::_block_idx_x() as u64 * dim + nvptx::_thread_idx_x() as u64;
        (first, nvptx::_grid_dim_x() as u64 * dim)
    }
}

#[inline(always)]
unsafe fn expected(seeds: *const SegmentSeed, b: u64) -> Block {
    // SAFETY: callers pass `b < n_blocks`, so `b / SEGMENT_BLOCKS` indexes one of the
    // `ceil(n_blocks / 4096)` seeds the caller provides.
    let seed = unsafe { *seeds.add((b / SEGMENT_BLOCKS) as usize) };
    Block(stream_block(seed, (b % SEGMENT_BLOCKS) as u32))
}

/// Adds this thread's count to the device counter: one atomic per thread that found any.
#[inline(always)]
unsafe fn add_count(counter: *mut u64, n: u64) {
    if n != 0 {
        // SAFETY: `counter` is a device allocation of 8 bytes, aligned, only used atomically.
        unsafe { AtomicU64::from_ptr(counter) }.fetch_add(n, Ordering::Relaxed);
    }
}

/// Writes the stream into `n_blocks` blocks at `dst`.
///
/// # Safety
/// `dst` holds `n_blocks` blocks; `seeds` holds `ceil(n_blocks / 4096)` seeds.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn rw_fill(dst: *mut Block, n_blocks: u64, seeds: *const SegmentSeed) {
    // SAFETY: reads of this thread's special registers (ctaid, ntid, tid, nctaid).
    let (mut b, stride) = unsafe { grid() };
    while b < n_blocks {
        // SAFETY: `b < n_blocks` and `dst` holds `n_blocks` blocks (the kernel's contract).
        unsafe { *dst.add(b as usize) = expected(seeds, b) };
        b += stride;
    }
}

/// Reads `n_blocks` blocks at `src` back and adds the number that differ from the stream to
/// `*mismatches`.
///
/// # Safety
/// As [`rw_fill`]; `mismatches` is an 8-byte device counter.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn rw_verify(
    src: *const Block,
    n_blocks: u64,
    seeds: *const SegmentSeed,
    mismatches: *mut u64,
) {
    // SAFETY: reads of this thread's special registers (ctaid, ntid, tid, nctaid).
    let (mut b, stride) = unsafe { grid() };
    let mut bad = 0u64;
    while b < n_blocks {
        // A plain load (one `ld.global.v4`): the memory is the kernel's input, which the
        // compiler cannot know. A volatile read would be split into four scalar loads.
        // SAFETY: `b < n_blocks` and `src` holds `n_blocks` blocks (the kernel's contract).
        let got = unsafe { *src.add(b as usize) };
        // SAFETY: `b < n_blocks`: the seed index is in bounds, as in `expected`.
        if got != unsafe { expected(seeds, b) } {
            bad += 1;
        }
        b += stride;
    }
    // SAFETY: `mismatches` is the 8-byte device counter of the kernel's contract.
    unsafe { add_count(mismatches, bad) };
}

/// The benchmark's anchor after `cuMemsetD32`: counts the blocks that are not four copies of
/// `value`, with the same loop shape and access width as [`rw_verify`].
///
/// # Safety
/// As [`rw_verify`].
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn rw_compare_const(
    src: *const Block,
    n_blocks: u64,
    value: u32,
    mismatches: *mut u64,
) {
    // SAFETY: reads of this thread's special registers (ctaid, ntid, tid, nctaid).
    let (mut b, stride) = unsafe { grid() };
    let want = Block([value; 4]);
    let mut bad = 0u64;
    while b < n_blocks {
        // SAFETY: `b < n_blocks` and `src` holds `n_blocks` blocks (the kernel's contract).
        let got = unsafe { *src.add(b as usize) };
        if got != want {
            bad += 1;
        }
        b += stride;
    }
    // SAFETY: `mismatches` is the 8-byte device counter of the kernel's contract.
    unsafe { add_count(mismatches, bad) };
}
