//! The GPU wipe's host side, for real, against the CUDA driver test double
//! (`tests/cuda-double`, host memory): CI has no GPU. Taking all memory until the driver
//! refuses, the seed table's per-allocation offsets (the bytes read back equal the host's
//! stream), corruption counted, several devices, no device, interruption, and nothing left
//! allocated afterwards. The PTX itself runs only on a real card: `tests/gpu.rs`.
//!
//! One test function: the double's settings are environment variables of this process.

use std::{
    ffi::c_void,
    path::PathBuf,
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use rackwarden::wipe::{self, Backend, WipeRequest};
use rackwarden_tests::{bin, gpu::fill_equals_host_stream, wipe::sigterm_cli_wipe};

const MIB: u64 = 1 << 20;
/// The double's device: 96 MiB, of which the "driver" keeps 3 MiB; our seed table and
/// counter take one 64 KiB granule each.
const TOTAL: u64 = 96 * MIB;
const TAKEABLE: u64 = TOTAL - 3 * MIB - 2 * 64 * 1024;

fn double_path() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/<profile>/deps/<this test> -> target/<profile>/
    let p = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .join("librackwarden_cuda_double.so");
    assert!(
        p.exists(),
        "{} is missing: `cargo xtask test` builds it (cargo build -p rackwarden-cuda-double)",
        p.display()
    );
    p
}

fn set(k: &str, v: impl AsRef<std::ffi::OsStr>) {
    // SAFETY: this binary's only test sets the environment before any thread reads it.
    unsafe { std::env::set_var(k, v) };
}

fn request(max: Option<u64>) -> WipeRequest {
    rackwarden_tests::wipe::request(vec![Backend::Gpu], max)
}

/// (bytes allocated, contexts retained, modules loaded) in the double.
fn outstanding(lib: *mut c_void) -> (u64, i64, i64) {
    // SAFETY: the symbol is the double's `rw_cuda_double_outstanding`.
    unsafe {
        let f = libc::dlsym(lib, c"rw_cuda_double_outstanding".as_ptr());
        assert!(!f.is_null());
        let f: unsafe extern "C" fn(*mut u64, *mut i64, *mut i64) = std::mem::transmute(f);
        let (mut b, mut c, mut m) = (0, 0, 0);
        f(&mut b, &mut c, &mut m);
        (b, c, m)
    }
}

#[test]
fn gpu_wipe_through_the_cuda_test_double() {
    let path = double_path();
    set("RACKWARDEN_LIBCUDA", &path);
    set("RW_CUDA_DOUBLE_MEM", TOTAL.to_string());
    set("RW_CUDA_DOUBLE_DEVICES", "1");
    // Held open so the double's bookkeeping lives across the wipes below.
    let cpath = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: dlopen of our own test library.
    let lib = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW) };
    assert!(!lib.is_null());
    let never = AtomicBool::new(false);

    the_whole_device_is_wiped(lib, &never);
    a_flipped_byte_is_one_bad_block(&never);
    max_bytes_caps_each_of_two_devices(lib, &never);
    no_device_or_no_driver_is_absent(&path, &never);
    a_stop_mid_fill_is_interrupted(lib);
    the_cli_reports_json_and_exits_3_on_sigterm();
    // SAFETY: closing our handle.
    unsafe { libc::dlclose(lib) };
}

/// 1. The whole device: everything the driver gives, in 1 GiB .. 64 KiB allocations.
/// 2. What the kernels wrote equals the host's stream at every offset of every allocation.
fn the_whole_device_is_wiped(lib: *mut c_void, never: &AtomicBool) {
    let r = wipe::run(&request(None), never);
    let d = &r.devices[0];
    println!("{d:?}");
    assert_eq!(d.status.name(), "complete");
    assert_eq!(d.device, "GPU-d0d0d0d0-d0d0-d0d0-d0d0-d0d0d0d0d0d0");
    assert_eq!(d.bytes_total, TOTAL);
    assert_eq!(d.bytes_filled, TAKEABLE, "all the driver would give");
    assert_eq!(d.bytes_verified, TAKEABLE);
    assert_eq!(d.mismatches, 0);
    assert_eq!(d.residue_bytes, TOTAL - TAKEABLE);
    assert_eq!(
        outstanding(lib),
        (0, 0, 0),
        "memory, context or module left behind"
    );

    assert_eq!(fill_equals_host_stream(None, None), TAKEABLE);
    assert_eq!(outstanding(lib), (0, 0, 0));
}

/// 3. A byte flipped between fill and verify (in a later allocation) is one bad block.
fn a_flipped_byte_is_one_bad_block(never: &AtomicBool) {
    let mut req = request(None);
    req.corrupt_byte_for_test = Some(80 * MIB + 5);
    let d = &wipe::run(&req, never).devices[0];
    assert_eq!((d.status.name(), d.mismatches), ("complete", 1), "{d:?}");
    assert_eq!(d.bytes_verified, TAKEABLE - 16);
    assert_eq!(d.residue_bytes, TOTAL - TAKEABLE + 16);
}

/// 4. --max-bytes caps each device; two devices get two streams and two reports.
fn max_bytes_caps_each_of_two_devices(lib: *mut c_void, never: &AtomicBool) {
    set("RW_CUDA_DOUBLE_DEVICES", "2");
    let r = wipe::run(&request(Some(10 * MIB)), never);
    assert_eq!(r.devices.len(), 2);
    assert_ne!(r.devices[0].device, r.devices[1].device);
    for d in &r.devices {
        assert_eq!(
            (d.status.name(), d.bytes_verified),
            ("complete", 10 * MIB),
            "{d:?}"
        );
    }
    assert_eq!(outstanding(lib), (0, 0, 0));
}

/// 5. A driver without devices, and no driver at all: absent, with the reason. A driver
///    that fails to start: failed. Leaves the double as it found it (`path`, one device).
fn no_device_or_no_driver_is_absent(path: &std::path::Path, never: &AtomicBool) {
    set("RW_CUDA_DOUBLE_DEVICES", "0");
    let d = &wipe::run(&request(None), never).devices[0];
    assert_eq!(d.status.name(), "absent");
    assert!(
        d.detail
            .as_deref()
            .unwrap()
            .contains("CUDA_ERROR_NO_DEVICE"),
        "{d:?}"
    );
    set("RW_CUDA_DOUBLE_DEVICES", "1");
    set("RW_CUDA_DOUBLE_INIT_ERROR", "999");
    let d = &wipe::run(&request(None), never).devices[0];
    assert_eq!(
        d.status.name(),
        "failed",
        "a broken driver is not an absent GPU: {d:?}"
    );
    set("RW_CUDA_DOUBLE_INIT_ERROR", "0");
    set("RACKWARDEN_LIBCUDA", "/nonexistent/libcuda.so.1");
    let d = &wipe::run(&request(None), never).devices[0];
    assert_eq!((d.status.name(), d.bytes_verified), ("absent", 0));
    set("RACKWARDEN_LIBCUDA", path);
    set("RW_CUDA_DOUBLE_DEVICES", "1");
}

/// 6. A stop mid-fill: interrupted, nothing verified, everything freed.
fn a_stop_mid_fill_is_interrupted(lib: *mut c_void) {
    set("RW_CUDA_DOUBLE_LAUNCH_DELAY_MS", "100");
    let stop = AtomicBool::new(false);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(250));
            stop.store(true, Ordering::SeqCst);
        });
        wipe::run(&request(None), &stop)
    });
    let d = &r.devices[0];
    assert!(r.interrupted);
    assert_eq!(d.status.name(), "interrupted", "{d:?}");
    assert!(d.bytes_filled > 0 && d.bytes_filled < TAKEABLE, "{d:?}");
    assert_eq!((d.bytes_verified, d.residue_bytes), (0, TOTAL));
    assert_eq!(outstanding(lib), (0, 0, 0));
    set("RW_CUDA_DOUBLE_LAUNCH_DELAY_MS", "0");
}

/// 7. The CLI: JSON report and exit 0; SIGTERM mid-wipe exits 3, interrupted.
fn the_cli_reports_json_and_exits_3_on_sigterm() {
    let out = Command::new(bin("rackwarden"))
        .args([
            "wipe",
            "--backend",
            "gpu",
            "--json",
            "--nonce",
            &"ab".repeat(32),
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stream"], "rackwarden/wipe-stream/v2");
    assert_eq!(v["devices"][0]["status"], "complete");
    assert_eq!(v["devices"][0]["bytes_verified"], TAKEABLE);
    let v = sigterm_cli_wipe(
        &["--backend", "gpu"],
        &[("RW_CUDA_DOUBLE_LAUNCH_DELAY_MS", "200")],
        Duration::from_millis(500),
    );
    assert_eq!(v["devices"][0]["status"], "interrupted");
    assert_eq!(v["devices"][0]["bytes_verified"], 0);
}
