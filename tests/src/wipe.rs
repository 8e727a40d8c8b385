//! Helpers shared by the wipe tests: host RAM (`tests/wipe.rs`), the CUDA test double
//! (`tests/gpu_double.rs`) and a real GPU (`tests/gpu.rs`).

use std::{
    process::{Command, Stdio},
    time::Duration,
};

use rackwarden::wipe::{Backend, WipeRequest};

use crate::bin;

/// A wipe of `backends`, each device capped at `max` bytes (`None`: all it gives), with a
/// 1 GiB host reserve, on 2 threads.
pub fn request(backends: Vec<Backend>, max: Option<u64>) -> WipeRequest {
    WipeRequest {
        nonce: [0x5au8; 32],
        backends,
        max_bytes: max,
        reserve_bytes: 1 << 30,
        scratch_paths: vec![],
        threads: 2,
        progress: None,
        corrupt_byte_for_test: None,
    }
}

/// Runs `rackwarden wipe <args> --json` with `env`, sends it SIGTERM after `after`, checks
/// that it exits 3 (interrupted) and returns its JSON report.
pub fn sigterm_cli_wipe(args: &[&str], env: &[(&str, &str)], after: Duration) -> serde_json::Value {
    let child = Command::new(bin("rackwarden"))
        .arg("wipe")
        .args(args)
        .arg("--json")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(after);
    // SAFETY: signalling the child we started, by PID.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(3), "interrupted wipes exit 3");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["interrupted"], true);
    v
}
