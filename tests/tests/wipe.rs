//! The wipe engine on real memory: coverage, corruption counted, interruption honest,
//! GPU absent without a driver, scratch emptied, and the CLI's exit codes.

use std::{
    process::Command,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use rackwarden::wipe::{self, Backend, WipeRequest};
use rackwarden_tests::{bin, wipe::sigterm_cli_wipe};

fn request(max: u64, backends: Vec<Backend>) -> WipeRequest {
    rackwarden_tests::wipe::request(backends, Some(max))
}

const MIB: u64 = 1 << 20;

#[test]
fn host_wipe_verifies_and_coverage_adds_up() {
    let r = wipe::run(
        &request(256 * MIB, vec![Backend::Host]),
        &AtomicBool::new(false),
    );
    let d = &r.devices[0];
    assert_eq!(d.status.name(), "complete", "{d:?}");
    assert_eq!(d.bytes_filled, 256 * MIB);
    assert_eq!(d.bytes_verified, 256 * MIB);
    assert_eq!(d.mismatches, 0);
    assert_eq!(
        d.bytes_total,
        d.bytes_verified + d.residue_bytes,
        "coverage and residue must add up"
    );
    assert_eq!(d.bytes_total, wipe::host::meminfo("MemTotal").unwrap());
    assert!(!r.interrupted);
}

#[test]
fn a_corrupted_byte_between_fill_and_verify_is_counted() {
    let mut req = request(64 * MIB, vec![Backend::Host]);
    req.corrupt_byte_for_test = Some(33 * MIB + 12_345);
    let d = &wipe::run(&req, &AtomicBool::new(false)).devices[0];
    assert_eq!(d.mismatches, 1, "{d:?}");
    assert_eq!(
        d.bytes_verified,
        64 * MIB - 16,
        "the bad 16-byte block is not verified"
    );
    assert_eq!(d.bytes_total, d.bytes_verified + d.residue_bytes);
}

#[test]
fn an_interrupted_wipe_says_so_and_claims_nothing_unverified() {
    let stop = AtomicBool::new(false);
    let req = request(4096 * MIB, vec![Backend::Host]);
    let r = std::thread::scope(|s| {
        s.spawn(|| {
            std::thread::sleep(Duration::from_millis(300));
            stop.store(true, Ordering::SeqCst);
        });
        wipe::run(&req, &stop)
    });
    let d = &r.devices[0];
    assert!(r.interrupted);
    assert_eq!(d.status.name(), "interrupted", "{d:?}");
    assert!(
        d.bytes_filled < 4096 * MIB,
        "the stop was not prompt: {d:?}"
    );
    assert!(d.bytes_verified <= d.bytes_filled);
    assert_eq!(d.residue_bytes, d.bytes_total - d.bytes_verified);
}

#[test]
fn gpu_backend_reports_absent_without_a_driver() {
    let r = wipe::run(&request(MIB, vec![Backend::Gpu]), &AtomicBool::new(false));
    let d = &r.devices[0];
    if std::path::Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1").exists() {
        println!("SKIP: a CUDA driver is installed here; this test checks the no-driver path");
        assert_ne!(d.status.name(), "complete");
        return;
    }
    assert_eq!(d.status.name(), "absent");
    assert_eq!(d.bytes_verified, 0);
    assert!(
        d.detail.as_deref().unwrap_or("").contains("libcuda.so.1"),
        "{d:?}"
    );
}

#[test]
fn scratch_is_emptied_and_freed_bytes_reported() {
    let dir = std::env::temp_dir().join(format!("rw-scratch-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(dir.join("a.bin"), vec![1u8; 10_000]).unwrap();
    std::fs::write(dir.join("sub/b.bin"), vec![2u8; 5_000]).unwrap();
    let mut req = request(MIB, vec![Backend::Scratch]);
    req.scratch_paths = vec![dir.clone()];
    let d = wipe::run(&req, &AtomicBool::new(false)).devices.remove(0);
    assert_eq!(d.status.name(), "complete");
    assert_eq!(d.bytes_total, 15_000);
    assert_eq!(d.bytes_verified, 15_000);
    assert_eq!(d.residue_bytes, 0);
    assert!(dir.exists() && std::fs::read_dir(&dir).unwrap().next().is_none());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn cli_reports_json_and_sigterm_interrupts() {
    let out = Command::new(bin("rackwarden"))
        .args([
            "wipe",
            "--backend",
            "host",
            "--max-bytes",
            "64 MiB",
            "--json",
            "--nonce",
            &"11".repeat(32),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["nonce"], "11".repeat(32));
    assert_eq!(v["devices"][0]["bytes_verified"], 64 * MIB);

    let bad = Command::new(bin("rackwarden"))
        .args(["wipe", "--nonce", "xyz"])
        .output()
        .unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("--nonce"));
    // A usage error is 2, and only that (an interrupted wipe is 3).
    assert_eq!(bad.status.code(), Some(2));

    // A bare number of bytes is a size.
    let bare = Command::new(bin("rackwarden"))
        .args([
            "wipe",
            "--backend",
            "host",
            "--max-bytes",
            "16777216",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        bare.status.success(),
        "{}",
        String::from_utf8_lossy(&bare.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&bare.stdout).unwrap();
    assert_eq!(v["devices"][0]["bytes_verified"], 16 * MIB);

    // Asking for a backend that wipes nothing is a failure, not a silent success.
    let gpu = Command::new(bin("rackwarden"))
        .args(["wipe", "--backend", "gpu", "--json"])
        .env("RACKWARDEN_LIBCUDA", "/nonexistent/libcuda.so.1")
        .output()
        .unwrap();
    assert_eq!(
        gpu.status.code(),
        Some(1),
        "gpu without a driver must not exit 0"
    );
    assert!(String::from_utf8_lossy(&gpu.stderr).contains("nothing was wiped"));
    let scratch = Command::new(bin("rackwarden"))
        .args(["wipe", "--backend", "scratch"])
        .output()
        .unwrap();
    assert_eq!(scratch.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&scratch.stderr).contains("--scratch"));

    sigterm_cli_wipe(
        &["--backend", "host", "--max-bytes", "8 GiB"],
        &[],
        Duration::from_millis(400),
    );
}
