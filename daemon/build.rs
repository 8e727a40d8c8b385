//! Builds the eBPF policer (`../ebpf`) for `bpfel-unknown-none` and leaves the object in
//! `$OUT_DIR/rackwarden-ebpf`, which `limiter::loader` embeds with `include_bytes!`.
//!
//! Two toolchains are supported (see TOOLCHAIN.md and `cargo xtask setup`):
//! - rustup nightly with `rust-src` (the normal route);
//! - a rustc whose sysroot ships the library sources (Debian `rustc-web` + `rust-web-src`),
//!   named by `RACKWARDEN_EBPF_RUSTC`, driven with `RUSTC_BOOTSTRAP=1`.
//!
//! Both need `bpf-linker` on PATH. The CPU is BPF v3: the policer needs BPF_CMPXCHG.
use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let ebpf_dir = manifest.join("../ebpf");
    let common_dir = manifest.join("../common");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    for p in [
        ebpf_dir.join("src"),
        ebpf_dir.join("Cargo.toml"),
        ebpf_dir.join("Cargo.lock"),
        common_dir.join("src"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }
    println!("cargo:rerun-if-env-changed=RACKWARDEN_EBPF_RUSTC");

    let target_dir = out_dir.join("ebpf-target");
    let mut cmd = match env::var_os("RACKWARDEN_EBPF_RUSTC") {
        Some(rustc) => {
            let mut c = Command::new("cargo");
            c.env("RUSTC", rustc).env("RUSTC_BOOTSTRAP", "1");
            c
        }
        None => {
            let mut c = Command::new("rustup");
            c.args(["run", "nightly", "cargo"]);
            // The outer cargo's RUSTC points at the stable compiler; the nested build must
            // use nightly's.
            c.env_remove("RUSTC");
            c
        }
    };
    cmd.current_dir(&ebpf_dir)
        .args([
            "build",
            "--release",
            "--locked",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir)
        // Clippy and coverage wrappers of the outer build must not reach the BPF build.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .env("CARGO_ENCODED_RUSTFLAGS", "-Ctarget-cpu=v3");
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run the eBPF build ({cmd:?}): {e}. Run `cargo xtask setup` first.")
    });
    if !status.success() {
        panic!(
            "the eBPF build failed ({status}). `cargo xtask setup` installs what it needs \
             (nightly rust-src or Debian rust-web-src, bpf-linker 0.13 against LLVM 22)."
        );
    }
    let built = target_dir.join("bpfel-unknown-none/release/rackwarden-ebpf");
    copy(&built, &out_dir.join("rackwarden-ebpf"));
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
}
