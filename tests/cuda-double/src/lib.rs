//! A test double of the CUDA driver API: exactly the calls the GPU wipe makes
//! (`daemon/src/wipe/cuda.rs`), over host memory, so CI (which has no GPU) exercises the
//! wipe's host side for real: taking memory until the driver refuses, the seed table and
//! its per-chunk offsets, mismatch counting, interruption and releasing everything.
//!
//! What it cannot test is the PTX itself: launching a kernel here runs the same
//! `rackwarden_common::wipe` functions the kernels are built from, on the CPU. The PTX runs
//! only on a real card (`tests/tests/gpu.rs`, which prints SKIP without one).
//!
//! It is stricter than a driver where that finds bugs: every kernel's arguments must lie
//! inside one live allocation (else `CUDA_ERROR_ILLEGAL_ADDRESS`), and the module must be
//! PTX with all three kernels. It is loaded through `RACKWARDEN_LIBCUDA`, never as
//! `libcuda.so.1`. Settings (read at `cuInit`): `RW_CUDA_DOUBLE_DEVICES` (default 1),
//! `RW_CUDA_DOUBLE_MEM` bytes per device (default 96 MiB), `RW_CUDA_DOUBLE_LAUNCH_DELAY_MS`
//! (default 0; makes a wipe slow enough to interrupt), `RW_CUDA_DOUBLE_INIT_ERROR` (a
//! CUresult for `cuInit` to return, as a broken driver would).
#![allow(clippy::missing_safety_doc)]

use std::{
    alloc::Layout,
    collections::BTreeMap,
    ffi::{CStr, c_char, c_void},
    sync::Mutex,
};

use rackwarden_common::wipe::{SEGMENT_BLOCKS, SegmentSeed, stream_block};

type CuResult = i32;
const SUCCESS: CuResult = 0;
const INVALID_VALUE: CuResult = 1;
const OUT_OF_MEMORY: CuResult = 2;
const NOT_INITIALIZED: CuResult = 3;
const NO_DEVICE: CuResult = 100;
const INVALID_DEVICE: CuResult = 101;
const INVALID_PTX: CuResult = 218;
const NOT_FOUND: CuResult = 500;
const ILLEGAL_ADDRESS: CuResult = 700;

/// What the "driver" keeps for itself on each device, as a real one does.
const RESERVED: u64 = 3 << 20;
/// Allocation granularity.
const GRANULE: u64 = 64 << 10;
const ALIGN: usize = 256;
const KERNELS: [&str; 3] = ["rw_fill", "rw_verify", "rw_compare_const"];

struct Alloc {
    bytes: u64,
    device: i32,
}

#[derive(Default)]
struct State {
    initialised: bool,
    devices: i32,
    mem: u64,
    delay_ms: u64,
    current: Option<i32>,
    allocs: BTreeMap<u64, Alloc>,
    used: BTreeMap<i32, u64>,
    contexts: i64,
    modules: i64,
    launches: u64,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

fn with<R>(f: impl FnOnce(&mut State) -> R) -> R {
    let mut g = STATE.lock().unwrap_or_else(|p| p.into_inner());
    f(g.get_or_insert_with(State::default))
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

impl State {
    fn device(&self) -> Result<i32, CuResult> {
        if !self.initialised {
            return Err(NOT_INITIALIZED);
        }
        self.current.ok_or(INVALID_VALUE)
    }

    /// Whether `[ptr, ptr + len)` lies inside one live allocation.
    fn inside(&self, ptr: u64, len: u64) -> bool {
        self.allocs
            .range(..=ptr)
            .next_back()
            .is_some_and(|(&base, a)| ptr + len <= base + a.bytes)
    }
}

fn code(r: Result<(), CuResult>) -> CuResult {
    r.err().unwrap_or(SUCCESS)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: u32) -> CuResult {
    with(|s| {
        s.devices = env_u64("RW_CUDA_DOUBLE_DEVICES", 1) as i32;
        s.mem = env_u64("RW_CUDA_DOUBLE_MEM", 96 << 20);
        s.delay_ms = env_u64("RW_CUDA_DOUBLE_LAUNCH_DELAY_MS", 0);
        if s.devices == 0 {
            return NO_DEVICE;
        }
        let fail = env_u64("RW_CUDA_DOUBLE_INIT_ERROR", 0) as CuResult;
        if fail != SUCCESS {
            return fail;
        }
        s.initialised = true;
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(e: CuResult, out: *mut *const c_char) -> CuResult {
    let name: &'static CStr = match e {
        SUCCESS => c"CUDA_SUCCESS",
        INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
        OUT_OF_MEMORY => c"CUDA_ERROR_OUT_OF_MEMORY",
        NOT_INITIALIZED => c"CUDA_ERROR_NOT_INITIALIZED",
        NO_DEVICE => c"CUDA_ERROR_NO_DEVICE",
        INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
        INVALID_PTX => c"CUDA_ERROR_INVALID_PTX",
        NOT_FOUND => c"CUDA_ERROR_NOT_FOUND",
        ILLEGAL_ADDRESS => c"CUDA_ERROR_ILLEGAL_ADDRESS",
        _ => return INVALID_VALUE,
    };
    unsafe { *out = name.as_ptr() };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(n: *mut i32) -> CuResult {
    with(|s| {
        if !s.initialised {
            return NOT_INITIALIZED;
        }
        unsafe { *n = s.devices };
        SUCCESS
    })
}

fn valid_device(dev: i32) -> Result<(), CuResult> {
    with(|s| {
        if !s.initialised {
            Err(NOT_INITIALIZED)
        } else if dev < 0 || dev >= s.devices {
            Err(INVALID_DEVICE)
        } else {
            Ok(())
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(out: *mut i32, ordinal: i32) -> CuResult {
    code(valid_device(ordinal).map(|()| unsafe { *out = ordinal }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetName(buf: *mut c_char, len: i32, dev: i32) -> CuResult {
    code(valid_device(dev).map(|()| {
        let name = b"rackwarden CUDA test double (host memory)\0";
        let n = name.len().min(len.max(0) as usize);
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr() as *const c_char, buf, n) };
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(out: *mut [u8; 16], dev: i32) -> CuResult {
    code(valid_device(dev).map(|()| unsafe { *out = [0xd0 | dev as u8; 16] }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetAttribute(out: *mut i32, attr: i32, dev: i32) -> CuResult {
    code(valid_device(dev).and_then(|()| {
        let v = match attr {
            16 => 4, // multiprocessors
            75 => 9, // compute capability
            76 => 0,
            _ => return Err(INVALID_VALUE),
        };
        unsafe { *out = v };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(out: *mut usize, dev: i32) -> CuResult {
    code(valid_device(dev).map(|()| unsafe { *out = with(|s| s.mem) as usize }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: i32) -> CuResult {
    code(valid_device(dev).map(|()| {
        with(|s| s.contexts += 1);
        unsafe { *ctx = (0x1000 + dev as usize) as *mut c_void };
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: i32) -> CuResult {
    code(valid_device(dev).map(|()| with(|s| s.contexts -= 1)))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CuResult {
    with(|s| {
        s.current = (!ctx.is_null()).then(|| (ctx as usize - 0x1000) as i32);
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxSynchronize() -> CuResult {
    // Launches run to completion inside cuLaunchKernel.
    code(with(|s| s.device().map(|_| ())))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CuResult {
    code(with(|s| {
        let dev = s.device()?;
        let used = s.used.get(&dev).copied().unwrap_or(0);
        unsafe {
            *free = (s.mem - RESERVED - used) as usize;
            *total = s.mem as usize;
        }
        Ok(())
    }))
}

fn layout(bytes: u64) -> Layout {
    Layout::from_size_align(
        bytes.div_ceil(GRANULE).max(1) as usize * GRANULE as usize,
        ALIGN,
    )
    .expect("layout")
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(out: *mut u64, bytes: usize) -> CuResult {
    code(with(|s| {
        let dev = s.device()?;
        if bytes == 0 {
            return Err(INVALID_VALUE);
        }
        let cost = layout(bytes as u64).size() as u64;
        let used = s.used.entry(dev).or_default();
        if *used + cost > s.mem - RESERVED {
            return Err(OUT_OF_MEMORY);
        }
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout(bytes as u64)) };
        if p.is_null() {
            return Err(OUT_OF_MEMORY);
        }
        *used += cost;
        s.allocs.insert(
            p as u64,
            Alloc {
                bytes: bytes as u64,
                device: dev,
            },
        );
        unsafe { *out = p as u64 };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(ptr: u64) -> CuResult {
    code(with(|s| {
        let a = s.allocs.remove(&ptr).ok_or(INVALID_VALUE)?;
        let l = layout(a.bytes);
        *s.used.entry(a.device).or_default() -= l.size() as u64;
        // SAFETY: allocated above with this layout.
        unsafe { std::alloc::dealloc(ptr as *mut u8, l) };
        Ok(())
    }))
}

fn checked(ptr: u64, len: u64) -> Result<(), CuResult> {
    with(|s| {
        s.device()?;
        if s.inside(ptr, len) {
            Ok(())
        } else {
            Err(ILLEGAL_ADDRESS)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CuResult {
    code(
        checked(dst, n as u64).map(|()| unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n)
        }),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CuResult {
    code(
        checked(src, n as u64).map(|()| unsafe {
            std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n)
        }),
    )
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemsetD32_v2(dst: u64, value: u32, words: usize) -> CuResult {
    code(checked(dst, words as u64 * 4).map(|()| {
        let p = dst as *mut u32;
        for i in 0..words {
            unsafe { p.add(i).write(value) };
        }
    }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleLoadDataEx(
    module: *mut *mut c_void,
    image: *const c_void,
    n_opts: u32,
    opts: *mut i32,
    vals: *mut *mut c_void,
) -> CuResult {
    let ptx = unsafe { CStr::from_ptr(image as *const c_char) }.to_string_lossy();
    let missing: Vec<&str> = KERNELS
        .iter()
        .filter(|k| !ptx.contains(&format!(".entry {k}(")))
        .copied()
        .collect();
    if !ptx.contains(".version") || !missing.is_empty() {
        // Write the "JIT log" where the caller asked for it.
        let (mut buf, mut size) = (std::ptr::null_mut::<u8>(), 0usize);
        for i in 0..n_opts as usize {
            let (o, v) = unsafe { (*opts.add(i), *vals.add(i)) };
            match o {
                5 => buf = v as *mut u8,
                6 => size = v as usize,
                _ => {}
            }
        }
        let msg = format!("not PTX with the wipe kernels (missing {missing:?})\0");
        if !buf.is_null() && size > 0 {
            let n = msg.len().min(size);
            unsafe { std::ptr::copy_nonoverlapping(msg.as_ptr(), buf, n) };
        }
        return INVALID_PTX;
    }
    code(with(|s| {
        s.device()?;
        s.modules += 1;
        unsafe { *module = 0x2000 as *mut c_void };
        Ok(())
    }))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuModuleUnload(_m: *mut c_void) -> CuResult {
    with(|s| s.modules -= 1);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuModuleGetFunction(
    f: *mut *mut c_void,
    _m: *mut c_void,
    name: *const c_char,
) -> CuResult {
    let name = unsafe { CStr::from_ptr(name) }.to_string_lossy();
    match KERNELS.iter().position(|k| *k == name) {
        Some(i) => {
            unsafe { *f = (0x3000 + i) as *mut c_void };
            SUCCESS
        }
        None => NOT_FOUND,
    }
}

/// Reads kernel argument `i` as a `T`.
unsafe fn arg<T: Copy>(params: *mut *mut c_void, i: usize) -> T {
    unsafe { *(*params.add(i) as *const T) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: u32,
    gy: u32,
    gz: u32,
    bx: u32,
    by: u32,
    bz: u32,
    _shared: u32,
    _stream: *mut c_void,
    params: *mut *mut c_void,
    _extra: *mut *mut c_void,
) -> CuResult {
    if gx == 0 || bx == 0 || gy != 1 || gz != 1 || by != 1 || bz != 1 || bx > 1024 {
        return INVALID_VALUE;
    }
    let delay = with(|s| {
        s.launches += 1;
        s.delay_ms
    });
    std::thread::sleep(std::time::Duration::from_millis(delay));
    let kernel = (f as usize).wrapping_sub(0x3000);
    let (ptr, n_blocks): (u64, u64) = unsafe { (arg(params, 0), arg(params, 1)) };
    let data = ptr as *mut [u32; 4];
    let seeds_needed = n_blocks.div_ceil(SEGMENT_BLOCKS);
    let r = (|| {
        checked(ptr, n_blocks * 16)?;
        match kernel {
            0 | 1 => {
                let seeds: u64 = unsafe { arg(params, 2) };
                checked(seeds, seeds_needed * 8)?;
                let seeds = seeds as *const SegmentSeed;
                let block = |b: u64| unsafe {
                    stream_block(
                        *seeds.add((b / SEGMENT_BLOCKS) as usize),
                        (b % SEGMENT_BLOCKS) as u32,
                    )
                };
                if kernel == 0 {
                    for b in 0..n_blocks {
                        unsafe { data.add(b as usize).write(block(b)) };
                    }
                    Ok(())
                } else {
                    let counter: u64 = unsafe { arg(params, 3) };
                    checked(counter, 8)?;
                    let bad = (0..n_blocks)
                        .filter(|&b| unsafe { data.add(b as usize).read() } != block(b))
                        .count() as u64;
                    unsafe { *(counter as *mut u64) += bad };
                    Ok(())
                }
            }
            2 => {
                let (value, counter): (u32, u64) = unsafe { (arg(params, 2), arg(params, 3)) };
                checked(counter, 8)?;
                let bad = (0..n_blocks)
                    .filter(|&b| unsafe { data.add(b as usize).read() } != [value; 4])
                    .count() as u64;
                unsafe { *(counter as *mut u64) += bad };
                Ok(())
            }
            _ => Err(INVALID_VALUE),
        }
    })();
    code(r)
}

/// For the tests: bytes still allocated, contexts still retained, modules still loaded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn rw_cuda_double_outstanding(
    bytes: *mut u64,
    contexts: *mut i64,
    modules: *mut i64,
) {
    with(|s| unsafe {
        *bytes = s.allocs.values().map(|a| a.bytes).sum();
        *contexts = s.contexts;
        *modules = s.modules;
    })
}
