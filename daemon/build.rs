//! Builds the two device-side programs and leaves them in `$OUT_DIR`:
//! - the eBPF policer (`../ebpf`) for `bpfel-unknown-none`: `rackwarden-ebpf`, embedded by
//!   `limiter::loader` with `include_bytes!`, and the guard `rackwarden-guard`,
//!   embedded by `guard`;
//! - the GPU wipe kernels (`../gpu-kernel`) for `nvptx64-nvidia-cuda`, as PTX text:
//!   `rackwarden-wipe.ptx`, embedded by `wipe::gpu` and compiled by the CUDA driver at run
//!   time, so the build needs no CUDA at all.
//!
//! Two toolchains are supported (`cargo xtask setup` provides one of them):
//! - rustup nightly with `rust-src` (the normal route);
//! - a rustc whose sysroot ships the library sources (Debian `rustc-web` + `rust-web-src`),
//!   named by `RACKWARDEN_EBPF_RUSTC`, driven with `RUSTC_BOOTSTRAP=1`.
//!
//! The eBPF build needs `bpf-linker` on PATH and BPF CPU v3 (the policer needs BPF_CMPXCHG).
//! The PTX needs no linker: it is the assembly of one crate with `core` inlined away, and
//! this script refuses it if it calls anything outside itself.
// A build script reports a failure by panicking: cargo prints the message and stops.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
};

/// PTX for Volta (sm_70) and newer; the driver JIT-compiles it for the card it finds.
const PTX_CPU: &str = "sm_70";
/// The kernels `wipe::gpu` looks up by name.
const PTX_KERNELS: [&str; 3] = ["rw_fill", "rw_verify", "rw_compare_const"];

fn main() {
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR"));
    for p in [
        "ebpf/src",
        "ebpf/Cargo.toml",
        "ebpf/Cargo.lock",
        "gpu-kernel/src",
        "gpu-kernel/Cargo.toml",
        "gpu-kernel/Cargo.lock",
        "common/src",
    ] {
        println!(
            "cargo:rerun-if-changed={}",
            manifest.join("..").join(p).display()
        );
    }
    println!("cargo:rerun-if-env-changed=RACKWARDEN_EBPF_RUSTC");
    build_ebpf(&manifest.join("../ebpf"), &out_dir);
    build_ptx(&manifest.join("../gpu-kernel"), &out_dir);
}

/// A cargo for a nested `-Z build-std=core` build with the chosen toolchain, cleaned of the
/// outer build's settings.
fn nested_cargo(dir: &Path, target_dir: &Path, rustflags: &str) -> Command {
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
    cmd.current_dir(dir)
        .arg("--quiet")
        .arg("--config")
        .arg("build.target-dir=\"".to_string() + &target_dir.display().to_string() + "\"")
        // Clippy and coverage wrappers of the outer build must not reach the device builds.
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .env("CARGO_ENCODED_RUSTFLAGS", rustflags);
    cmd
}

fn run(mut cmd: Command, what: &str) {
    let status = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run the {what} build ({cmd:?}): {e}. Run `cargo xtask setup` first.")
    });
    if !status.success() {
        panic!(
            "the {what} build failed ({status}). `cargo xtask setup` installs what it needs \
             (nightly rust-src or Debian rust-web-src, bpf-linker 0.13 against LLVM 22)."
        );
    }
}

fn build_ebpf(dir: &Path, out_dir: &Path) {
    let target_dir = out_dir.join("ebpf-target");
    let mut cmd = nested_cargo(dir, &target_dir, "-Ctarget-cpu=v3");
    cmd.args([
        "build",
        "--release",
        "--locked",
        "--target",
        "bpfel-unknown-none",
        "-Z",
        "build-std=core",
    ]);
    run(cmd, "eBPF");
    for object in [
        "rackwarden-ebpf",
        "rackwarden-tap",
        "rackwarden-guard",
        "rackwarden-watch",
    ] {
        let built = target_dir.join("bpfel-unknown-none/release").join(object);
        std::fs::copy(&built, out_dir.join(object))
            .unwrap_or_else(|e| panic!("copy {}: {e}", built.display()));
    }
}

fn build_ptx(dir: &Path, out_dir: &Path) {
    let target_dir = out_dir.join("ptx-target");
    let deps = target_dir.join("nvptx64-nvidia-cuda/release/deps");
    // Old assembly files would be indistinguishable from the new one: start clean.
    let _ = std::fs::remove_dir_all(&deps);
    let mut cmd = nested_cargo(dir, &target_dir, &format!("-Ctarget-cpu={PTX_CPU}"));
    cmd.args([
        "rustc",
        "--release",
        "--locked",
        "--target",
        "nvptx64-nvidia-cuda",
        "-Z",
        "build-std=core",
        "--",
        "--emit=asm",
    ]);
    run(cmd, "PTX");
    let asm: Vec<PathBuf> = std::fs::read_dir(&deps)
        .unwrap_or_else(|e| panic!("read {}: {e}", deps.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.extension().is_some_and(|x| x == "s")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("rackwarden_gpu_kernel-"))
        })
        .collect();
    let [ptx_path] = &asm[..] else {
        panic!(
            "expected one rackwarden_gpu_kernel-*.s in {}, found {asm:?}",
            deps.display()
        );
    };
    let ptx = std::fs::read_to_string(ptx_path)
        .unwrap_or_else(|e| panic!("read {}: {e}", ptx_path.display()));
    // The PTX is loaded as it is, without a linker: it must not call out of itself.
    if let Some(l) = ptx.lines().find(|l| l.contains(".extern")) {
        panic!(
            "the PTX calls outside itself (`{}`): a core function was not inlined",
            l.trim()
        );
    }
    for k in PTX_KERNELS {
        if !ptx.contains(&format!(".entry {k}(")) {
            panic!("the PTX has no kernel `{k}`");
        }
    }
    std::fs::write(out_dir.join("rackwarden-wipe.ptx"), ptx).expect("write rackwarden-wipe.ptx");
}
