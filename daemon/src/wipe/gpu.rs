//! GPU memory: take all the device memory the driver will give, fill it with the keyed
//! stream by a GPU kernel, read it all back with a second kernel that counts the 16-byte
//! blocks that differ, free it.
//!
//! - The driver is loaded at run time ([`super::cuda`]); no driver, or no device, is one
//!   `absent` entry with the reason, never success.
//! - The kernels (`gpu-kernel/`, PTX carried in this binary, compiled by the driver for the
//!   card it finds) compute the same stream as the host wipe. The host computes the AES seed
//!   of every 64 KiB segment and uploads the table (8 bytes per 64 KiB: 17 MB for 141 GB).
//! - The stream of a device is keyed by its UUID (`GPU-…`), which the report names, so a
//!   verifier holding the nonce can recompute any byte of it.
//! - Memory is taken in 1 GiB allocations, then halves of that down to 64 KiB, until the
//!   driver refuses: `bytes_total - bytes_verified` is what the driver, other processes and
//!   our own seed table kept, and is reported as residue.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use rackwarden_attest::evidence::{WipeDeviceReport, WipeStatus};
use rackwarden_common::wipe::{BLOCK_BYTES, SEGMENT_BYTES, SegmentSeed};

use super::{
    WipeRequest,
    cuda::{
        Arg, CUDA_ERROR_NO_DEVICE, CUDA_ERROR_OUT_OF_MEMORY, Context, Cuda, CudaError, DevPtr,
        DeviceBuffer, DeviceInfo, Kernel, Module,
    },
    not_wiped,
    stream::KeyedStream,
};

/// The kernels, as PTX text (built by daemon/build.rs from gpu-kernel/).
pub const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/rackwarden-wipe.ptx"));
/// The largest allocation asked for; smaller ones follow when the driver refuses.
const CHUNK: u64 = 1 << 30;
/// The smallest allocation asked for: one segment, so every chunk begins a segment.
const MIN_CHUNK: u64 = SEGMENT_BYTES;
const THREADS_PER_BLOCK: u32 = 256;
/// Enough resident threads per SM (8 x 256 = 2048, the most Volta..Hopper hold) to keep
/// memory busy; each thread loops over the chunk with the grid's stride.
const BLOCKS_PER_SM: u32 = 8;
/// Kernels are queued back to back and waited for after this many bytes: fewer bubbles
/// than waiting per chunk, and a stop request still takes effect within milliseconds.
const SYNC_EVERY: u64 = 16 << 30;

/// The memory of one device, taken, with the seed table and the mismatch counter.
pub struct Taken<'a> {
    chunks: Vec<DeviceBuffer<'a>>,
    seed_table: DeviceBuffer<'a>,
    counter: DeviceBuffer<'a>,
    /// `cuMemGetInfo` before anything was taken.
    pub free_before: u64,
    pub total: u64,
    pub notes: Vec<String>,
}

impl Taken<'_> {
    pub fn covered(&self) -> u64 {
        self.chunks.iter().map(|c| c.bytes).sum()
    }

    /// Each allocation as (device address, bytes, offset in the device's stream).
    pub fn chunks(&self) -> Vec<(DevPtr, u64, u64)> {
        let mut offset = 0;
        self.chunks
            .iter()
            .map(|c| {
                offset += c.bytes;
                (c.ptr, c.bytes, offset - c.bytes)
            })
            .collect()
    }
}

/// The loaded kernels of one device.
pub struct Kernels<'a> {
    pub fill: Kernel<'a>,
    pub verify: Kernel<'a>,
    pub compare_const: Kernel<'a>,
    grid: u32,
    /// Unloaded on drop, after the kernels' last use.
    _module: Module<'a>,
}

pub fn wipe(req: &WipeRequest, stop: &AtomicBool) -> Vec<WipeDeviceReport> {
    let cuda = match Cuda::load() {
        Ok(c) => c,
        Err(e) => {
            return vec![not_wiped(
                "gpu",
                "gpu",
                WipeStatus::Absent,
                0,
                e.to_string(),
            )];
        }
    };
    let devices = match cuda.devices() {
        Ok(d) if d.is_empty() => {
            return vec![not_wiped(
                "gpu",
                "gpu",
                WipeStatus::Absent,
                0,
                "CUDA driver present, no device".into(),
            )];
        }
        Ok(d) => d,
        Err(e) if e.code() == Some(CUDA_ERROR_NO_DEVICE) => {
            return vec![not_wiped(
                "gpu",
                "gpu",
                WipeStatus::Absent,
                0,
                e.to_string(),
            )];
        }
        // A driver that loads but cannot list its devices may still sit on GPUs full of
        // state: that is a failure to wipe, not an absence of GPUs.
        Err(e) => {
            return vec![not_wiped(
                "gpu",
                "gpu",
                WipeStatus::Failed,
                0,
                format!("{e}: the driver cannot list its devices, so none was wiped"),
            )];
        }
    };
    devices
        .iter()
        .map(|d| {
            if stop.load(Ordering::SeqCst) {
                return not_wiped(
                    "gpu",
                    &device_id(d),
                    WipeStatus::Interrupted,
                    d.total_bytes,
                    "stopped before this device".into(),
                );
            }
            wipe_device(&cuda, d, req, stop).unwrap_or_else(|e| {
                not_wiped(
                    "gpu",
                    &device_id(d),
                    WipeStatus::Failed,
                    d.total_bytes,
                    format!(
                        "{}: {e}; nothing on this device is claimed as wiped",
                        describe(d)
                    ),
                )
            })
        })
        .collect()
}

/// The name the report gives the device and the stream is keyed with.
pub fn device_id(d: &DeviceInfo) -> String {
    d.uuid
        .clone()
        .unwrap_or_else(|| format!("gpu{}", d.ordinal))
}

fn describe(d: &DeviceInfo) -> String {
    format!(
        "gpu{} {} (sm_{}{}, {} SMs)",
        d.ordinal, d.name, d.compute_capability.0, d.compute_capability.1, d.sm_count
    )
}

pub fn load_kernels<'a>(ctx: &Context<'a>, d: &DeviceInfo) -> Result<Kernels<'a>, CudaError> {
    let module = ctx.load_module(PTX)?;
    Ok(Kernels {
        fill: module.function(c"rw_fill")?,
        verify: module.function(c"rw_verify")?,
        compare_const: module.function(c"rw_compare_const")?,
        grid: d.sm_count.saturating_mul(BLOCKS_PER_SM).max(1),
        _module: module,
    })
}

/// Takes up to `limit` bytes (all the driver gives when `None`), in segment multiples.
pub fn take<'a>(ctx: &Context<'a>, limit: Option<u64>) -> Result<Taken<'a>, CudaError> {
    let (free, total) = ctx.mem_info()?;
    let mut notes = vec![format!("{free} B free of {total} B before the wipe")];
    let mut target = free;
    if let Some(m) = limit
        && m < target
    {
        notes.push(format!("capped by --max-bytes {m}"));
        target = m;
    }
    // The table and the counter first: the table is sized for everything that could be
    // taken, and neither must depend on memory the chunks might leave.
    let seed_table =
        ctx.alloc((target / SEGMENT_BYTES).max(1) * size_of::<SegmentSeed>() as u64)?;
    let counter = ctx.alloc(size_of::<u64>() as u64)?;
    let mut chunks: Vec<DeviceBuffer<'a>> = Vec::new();
    let mut taken = 0u64;
    let mut size = CHUNK;
    while size >= MIN_CHUNK {
        let want = size.min(target - taken);
        let want = want - want % SEGMENT_BYTES;
        if want < MIN_CHUNK {
            break;
        }
        match ctx.alloc(want) {
            Ok(b) => {
                taken += want;
                chunks.push(b);
            }
            Err(e) if e.code() == Some(CUDA_ERROR_OUT_OF_MEMORY) => size /= 2,
            Err(e) => return Err(e),
        }
    }
    notes.push(format!(
        "{taken} B taken in {} allocations; seed table {} B",
        chunks.len(),
        seed_table.bytes
    ));
    Ok(Taken {
        chunks,
        seed_table,
        counter,
        free_before: free,
        total,
        notes,
    })
}

/// Computes the seed of every covered segment on all cores and uploads the table.
pub fn upload_seeds(
    ctx: &Context<'_>,
    t: &Taken<'_>,
    stream: &KeyedStream,
    threads: usize,
) -> Result<(), CudaError> {
    let mut seeds = vec![SegmentSeed::default(); (t.covered() / SEGMENT_BYTES) as usize];
    let per = seeds.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (i, part) in seeds.chunks_mut(per).enumerate() {
            s.spawn(move || stream.seeds((i * per) as u64, part));
        }
    });
    ctx.upload(t.seed_table.ptr, &seeds)
}

/// Runs `kernel` over every chunk (arguments: chunk, its block count, its part of the seed
/// table, the counter), queued back to back, waiting every [`SYNC_EVERY`] bytes. Stops
/// queueing when `stop` is set. Returns the bytes of the chunks that ran to completion.
fn over_chunks(
    ctx: &Context<'_>,
    k: &Kernels<'_>,
    kernel: Kernel<'_>,
    t: &Taken<'_>,
    stop: &AtomicBool,
    with_counter: bool,
    mut progress: impl FnMut(u64),
) -> Result<u64, CudaError> {
    let mut done = 0u64;
    let mut queued = 0u64;
    let mut segment = 0u64;
    for c in &t.chunks {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let mut args = vec![
            Arg::U64(c.ptr),
            Arg::U64(c.bytes / BLOCK_BYTES),
            Arg::U64(t.seed_table.ptr + segment * size_of::<SegmentSeed>() as u64),
        ];
        if with_counter {
            args.push(Arg::U64(t.counter.ptr));
        }
        kernel.launch(k.grid, THREADS_PER_BLOCK, &mut args)?;
        segment += c.bytes / SEGMENT_BYTES;
        queued += c.bytes;
        if queued - done >= SYNC_EVERY {
            ctx.synchronize()?;
            progress(queued - done);
            done = queued;
        }
    }
    ctx.synchronize()?;
    progress(queued - done);
    Ok(queued)
}

pub fn fill(
    ctx: &Context<'_>,
    k: &Kernels<'_>,
    t: &Taken<'_>,
    stop: &AtomicBool,
    progress: impl FnMut(u64),
) -> Result<u64, CudaError> {
    over_chunks(ctx, k, k.fill, t, stop, false, progress)
}

/// Returns (bytes read back, mismatched 16-byte blocks among them).
pub fn verify(
    ctx: &Context<'_>,
    k: &Kernels<'_>,
    t: &Taken<'_>,
    stop: &AtomicBool,
    progress: impl FnMut(u64),
) -> Result<(u64, u64), CudaError> {
    ctx.memset_d32(t.counter.ptr, 0, 2)?;
    let read = over_chunks(ctx, k, k.verify, t, stop, true, progress)?;
    let mut bad = [0u64];
    ctx.download(&mut bad, t.counter.ptr)?;
    Ok((read, bad[0]))
}

/// The benchmark's anchor over the same chunks: `cuMemsetD32` of each, then a compare
/// against the constant with the same loop as the verify kernel. Returns (memset time,
/// compare time, mismatched blocks).
pub fn anchor_memset_compare(
    ctx: &Context<'_>,
    k: &Kernels<'_>,
    t: &Taken<'_>,
) -> Result<(Duration, Duration, u64), CudaError> {
    const VALUE: u32 = 0x5a5a_5a5a;
    let start = Instant::now();
    for c in &t.chunks {
        ctx.memset_d32(c.ptr, VALUE, c.bytes / 4)?;
    }
    ctx.synchronize()?;
    let memset = start.elapsed();
    ctx.memset_d32(t.counter.ptr, 0, 2)?;
    let start = Instant::now();
    for c in &t.chunks {
        k.compare_const.launch(
            k.grid,
            THREADS_PER_BLOCK,
            &mut [
                Arg::U64(c.ptr),
                Arg::U64(c.bytes / BLOCK_BYTES),
                Arg::U32(VALUE),
                Arg::U64(t.counter.ptr),
            ],
        )?;
    }
    ctx.synchronize()?;
    let compare = start.elapsed();
    let mut bad = [0u64];
    ctx.download(&mut bad, t.counter.ptr)?;
    Ok((memset, compare, bad[0]))
}

/// TEST HOOK: flips the byte at stream offset `at` (see `WipeRequest::corrupt_byte_for_test`).
fn corrupt(ctx: &Context<'_>, t: &Taken<'_>, at: u64) -> Result<(), CudaError> {
    let mut base = 0u64;
    for c in &t.chunks {
        if at < base + c.bytes {
            let p = c.ptr + (at - base);
            let mut b = [0u8];
            ctx.download(&mut b, p)?;
            b[0] ^= 0xff;
            return ctx.upload(p, &b);
        }
        base += c.bytes;
    }
    Ok(())
}

fn gbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64().max(1e-9) / 1e9
}

fn wipe_device(
    cuda: &Cuda,
    d: &DeviceInfo,
    req: &WipeRequest,
    stop: &AtomicBool,
) -> Result<WipeDeviceReport, CudaError> {
    let id = device_id(d);
    let ctx = cuda.context(d.handle)?;
    let k = load_kernels(&ctx, d)?;
    let t = take(&ctx, req.max_bytes)?;
    let mut notes = vec![describe(d)];
    notes.extend(t.notes.iter().cloned());
    let covered = t.covered();
    let stream = KeyedStream::new(&req.nonce, &id);
    upload_seeds(&ctx, &t, &stream, req.threads)?;
    let tick = |n: u64| {
        if let Some(p) = &req.progress {
            p.fetch_add(n, Ordering::Relaxed);
        }
    };

    let start = Instant::now();
    let filled = fill(&ctx, &k, &t, stop, tick)?;
    let fill_time = start.elapsed();
    let report = |status: WipeStatus,
                  verified: u64,
                  mismatches: u64,
                  verify_time: Duration,
                  mut notes: Vec<String>| {
        notes.push(format!(
            "fill {:.1} GB/s, verify {:.1} GB/s",
            gbps(filled, fill_time),
            gbps(verified, verify_time)
        ));
        WipeDeviceReport {
            backend: "gpu".into(),
            device: id.clone(),
            status,
            bytes_total: t.total,
            bytes_filled: filled,
            bytes_verified: verified,
            mismatches,
            residue_bytes: t.total - verified,
            fill_ms: fill_time.as_millis() as u64,
            verify_ms: verify_time.as_millis() as u64,
            detail: Some(notes.join("; ")),
        }
    };
    if filled < covered {
        notes.push(format!(
            "interrupted during fill after {filled} of {covered} B; nothing verified"
        ));
        return Ok(report(WipeStatus::Interrupted, 0, 0, Duration::ZERO, notes));
    }
    if let Some(at) = req.corrupt_byte_for_test {
        corrupt(&ctx, &t, at)?;
    }
    let start = Instant::now();
    let (read, mismatches) = verify(&ctx, &k, &t, stop, tick)?;
    let verify_time = start.elapsed();
    // A mismatch can only be in a chunk that was read; each one voids its 16 bytes.
    let verified = read - mismatches * BLOCK_BYTES;
    let status = if read < covered {
        notes.push(format!(
            "interrupted during verify after {read} of {covered} B"
        ));
        WipeStatus::Interrupted
    } else {
        WipeStatus::Complete
    };
    Ok(report(status, verified, mismatches, verify_time, notes))
}
