//! Host RAM: drop the page cache, take all memory that can safely be taken (MemAvailable and
//! the cgroup's headroom, minus a reserve), fill it with the keyed stream on all cores, lock
//! it, read everything back, release it.

use std::{
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::Instant,
};

use rackwarden_attest::evidence::{WipeDeviceReport, WipeStatus};

use super::{WipeRequest, not_wiped, stream::KeyedStream};

pub const DEVICE: &str = "host-ram";
/// Work unit: one worker fills or verifies one such block at a time.
const BLOCK: usize = 1 << 20;
/// Memory is taken in mappings of this size (a failed mapping stops the taking, not the wipe).
const SEGMENT: usize = 256 << 20;

/// Fields of /proc/meminfo, in bytes.
pub fn meminfo(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Headroom left by this process's memory cgroup (v2 `memory.max - memory.current`, or v1
/// `memory.limit_in_bytes - memory.usage_in_bytes`), if a limit is set.
pub fn cgroup_headroom() -> Option<(u64, String)> {
    let cg = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    };
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        if ctrl.is_empty() {
            for base in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                let dir = format!("{base}{path}");
                if let (Some(max), Some(cur)) = (
                    read(&format!("{dir}/memory.max")),
                    read(&format!("{dir}/memory.current")),
                ) {
                    return Some((
                        max.saturating_sub(cur),
                        format!("cgroup v2 {dir}: memory.max {max}"),
                    ));
                }
            }
        } else if ctrl.split(',').any(|c| c == "memory") {
            let dir = format!("/sys/fs/cgroup/memory{path}");
            if let (Some(max), Some(cur)) = (
                read(&format!("{dir}/memory.limit_in_bytes")),
                read(&format!("{dir}/memory.usage_in_bytes")),
            ) {
                // v1 reports "no limit" as a huge number.
                if max < (1u64 << 60) {
                    return Some((
                        max.saturating_sub(cur),
                        format!("cgroup v1 {dir}: limit {max}"),
                    ));
                }
            }
        }
    }
    None
}

fn drop_page_cache() -> std::io::Result<()> {
    nix::unistd::sync();
    std::fs::write("/proc/sys/vm/drop_caches", b"3\n")
}

/// One anonymous mapping, unmapped on drop.
struct Segment {
    ptr: std::ptr::NonNull<libc::c_void>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by the segment; moving it to a worker is fine.
unsafe impl Send for Segment {}
// SAFETY: workers share it only to write and read disjoint blocks of it.
unsafe impl Sync for Segment {}

impl Segment {
    fn map(len: usize) -> Option<Segment> {
        use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags};
        let len = std::num::NonZeroUsize::new(len)?;
        // SAFETY: a fresh anonymous private mapping aliases nothing.
        let ptr = unsafe {
            nix::sys::mman::mmap_anonymous(
                None,
                len,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE | MapFlags::MAP_NORESERVE,
            )
        }
        .ok()?;
        // SAFETY: advice on our own mapping; failure only means no huge pages.
        let _ = unsafe { nix::sys::mman::madvise(ptr, len.get(), MmapAdvise::MADV_HUGEPAGE) };
        Some(Segment {
            ptr,
            len: len.get(),
        })
    }

    /// # Safety
    /// The caller must not create overlapping mutable slices (workers claim distinct blocks).
    #[allow(clippy::mut_from_ref)]
    unsafe fn block(&self, off: usize, len: usize) -> &mut [u8] {
        // SAFETY: within the mapping (off + len <= self.len); distinctness is the caller's.
        unsafe { std::slice::from_raw_parts_mut((self.ptr.as_ptr() as *mut u8).add(off), len) }
    }

    fn lock(&self) -> bool {
        // SAFETY: locking pages of our own mapping changes no memory.
        unsafe { nix::sys::mman::mlock(self.ptr, self.len) }.is_ok()
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmapping the mapping we created; no slice of it outlives the segment.
        let _ = unsafe { nix::sys::mman::munmap(self.ptr, self.len) };
    }
}

/// Every block of every segment, as (segment index, offset, length, stream offset).
fn blocks(segs: &[Segment]) -> Vec<(usize, usize, usize, u64)> {
    let mut out = Vec::new();
    let mut stream_off = 0u64;
    for (i, s) in segs.iter().enumerate() {
        let mut off = 0;
        while off < s.len {
            let len = BLOCK.min(s.len - off);
            out.push((i, off, len, stream_off));
            stream_off += len as u64;
            off += len;
        }
    }
    out
}

/// Runs `work` over all blocks on `threads` workers until done or `stop`; returns the sum of
/// what `work` returned and whether every block was processed.
fn parallel<F>(
    blocks: &[(usize, usize, usize, u64)],
    threads: usize,
    stop: &AtomicBool,
    work: F,
) -> (u64, u64, bool)
where
    F: Fn(usize, usize, usize, u64) -> (u64, u64) + Sync,
{
    let next = AtomicU64::new(0);
    let a = AtomicU64::new(0);
    let b = AtomicU64::new(0);
    let done_blocks = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                loop {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                    let Some(&(seg, off, len, soff)) = blocks.get(i) else {
                        break;
                    };
                    let (x, y) = work(seg, off, len, soff);
                    a.fetch_add(x, Ordering::Relaxed);
                    b.fetch_add(y, Ordering::Relaxed);
                    done_blocks.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
    });
    let complete = done_blocks.load(Ordering::Relaxed) as usize == blocks.len();
    (a.into_inner(), b.into_inner(), complete)
}

/// How many bytes of host RAM to wipe: what is available less the reserve, within the
/// cgroup's headroom and `max_bytes`, whole blocks. Each limit that applied is noted.
fn coverage_target(req: &WipeRequest, notes: &mut Vec<String>) -> u64 {
    match drop_page_cache() {
        Ok(()) => notes.push("page cache dropped".to_string()),
        Err(e) => notes.push(format!("page cache NOT dropped ({e})")),
    }
    let available = meminfo("MemAvailable").unwrap_or(0);
    let mut target = available.saturating_sub(req.reserve_bytes);
    notes.push(format!(
        "MemAvailable {available} B, reserve {} B",
        req.reserve_bytes
    ));
    if let Some((headroom, what)) = cgroup_headroom() {
        let h = headroom.saturating_sub(req.reserve_bytes);
        if h < target {
            notes.push(format!("coverage capped by {what} (headroom {headroom} B)"));
            target = h;
        }
    }
    if let Some(m) = req.max_bytes
        && m < target
    {
        notes.push(format!("capped by --max-bytes {m}"));
        target = m;
    }
    target -= target % BLOCK as u64;
    target
}

/// Maps `target` bytes in segments, as far as the kernel allows; returns them and the bytes
/// taken.
fn map_segments(target: u64, notes: &mut Vec<String>) -> (Vec<Segment>, u64) {
    let mut segs = Vec::new();
    let mut taken = 0u64;
    while taken < target {
        let len = (SEGMENT as u64).min(target - taken) as usize;
        match Segment::map(len) {
            Some(s) => {
                taken += len as u64;
                segs.push(s);
            }
            None => {
                notes.push(format!("mmap refused after {taken} B"));
                break;
            }
        }
    }
    (segs, taken)
}

pub fn wipe(req: &WipeRequest, stop: &AtomicBool) -> WipeDeviceReport {
    let Some(total) = meminfo("MemTotal") else {
        return not_wiped(
            "host",
            DEVICE,
            WipeStatus::Failed,
            0,
            "cannot read MemTotal from /proc/meminfo".into(),
        );
    };
    let mut notes = Vec::new();
    let target = coverage_target(req, &mut notes);
    let (segs, taken) = map_segments(target, &mut notes);
    let list = blocks(&segs);
    let stream = KeyedStream::new(&req.nonce, DEVICE);
    let progress = req.progress.clone();

    let t = Instant::now();
    let (filled, _, fill_complete) = parallel(&list, req.threads, stop, |seg, off, len, soff| {
        // SAFETY: block indices are claimed once, so slices never overlap.
        let buf = unsafe { segs[seg].block(off, len) };
        stream.fill(soff, buf);
        if let Some(p) = &progress {
            p.fetch_add(len as u64, Ordering::Relaxed);
        }
        (len as u64, 0)
    });
    let fill_ms = t.elapsed().as_millis() as u64;
    if !fill_complete {
        return WipeDeviceReport {
            backend: "host".into(),
            device: DEVICE.into(),
            status: WipeStatus::Interrupted,
            bytes_total: total,
            bytes_filled: filled,
            bytes_verified: 0,
            mismatches: 0,
            residue_bytes: total,
            fill_ms,
            verify_ms: 0,
            detail: Some(format!(
                "interrupted during fill after {filled} B; nothing verified; {}",
                notes.join("; ")
            )),
        };
    }
    let locked: u64 = segs.iter().filter(|s| s.lock()).map(|s| s.len as u64).sum();
    notes.push(format!("{locked} B of {taken} B locked in RAM"));

    if let Some(at) = req.corrupt_byte_for_test
        && let Some(&(seg, off, len, soff)) =
            list.iter().find(|b| (b.3..b.3 + b.2 as u64).contains(&at))
    {
        // SAFETY: no worker is running.
        let buf = unsafe { segs[seg].block(off, len) };
        buf[(at - soff) as usize] ^= 0xff;
    }

    let t = Instant::now();
    let (verified, mismatches, verify_complete) =
        parallel(&list, req.threads, stop, |seg, off, len, soff| {
            // SAFETY: as above.
            let buf = unsafe { segs[seg].block(off, len) };
            let bad = stream.count_mismatches(soff, buf);
            if let Some(p) = &progress {
                p.fetch_add(len as u64, Ordering::Relaxed);
            }
            (len as u64 - bad * super::stream::BLOCK as u64, bad)
        });
    let verify_ms = t.elapsed().as_millis() as u64;
    drop(segs);
    WipeDeviceReport {
        backend: "host".into(),
        device: DEVICE.into(),
        status: if verify_complete {
            WipeStatus::Complete
        } else {
            WipeStatus::Interrupted
        },
        bytes_total: total,
        bytes_filled: filled,
        bytes_verified: verified,
        mismatches,
        residue_bytes: total - verified,
        fill_ms,
        verify_ms,
        detail: Some(notes.join("; ")),
    }
}

/// The memory-bandwidth anchor for `cargo xtask bench wipe`: the same allocation path, block
/// size and workers as [`wipe`], but plain `memset` then `memcmp` against a constant block.
/// Returns (fill ms, verify ms, mismatched blocks).
pub fn anchor_memset_memcmp(bytes: u64, threads: usize) -> (u64, u64, u64) {
    let mut segs = Vec::new();
    let mut taken = 0u64;
    while taken < bytes {
        let len = (SEGMENT as u64).min(bytes - taken) as usize;
        let Some(s) = Segment::map(len) else { break };
        taken += len as u64;
        segs.push(s);
    }
    let list = blocks(&segs);
    let never = AtomicBool::new(false);
    let reference = vec![0x5au8; BLOCK];
    let t = Instant::now();
    parallel(&list, threads, &never, |seg, off, len, _| {
        // SAFETY: distinct blocks, as in `wipe`.
        unsafe { std::ptr::write_bytes(segs[seg].block(off, len).as_mut_ptr(), 0x5a, len) };
        (0, 0)
    });
    let fill_ms = t.elapsed().as_millis() as u64;
    let t = Instant::now();
    let (_, bad, _) = parallel(&list, threads, &never, |seg, off, len, _| {
        // SAFETY: as above.
        let b = unsafe { segs[seg].block(off, len) };
        (0, u64::from(b != &reference[..len]))
    });
    (fill_ms, t.elapsed().as_millis() as u64, bad)
}
