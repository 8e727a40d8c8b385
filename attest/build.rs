//! Assembles CRYPTOGAMS' AVX-512VL Keccak (`keccak/`, the patched script `sha3-asm` ships,
//! with its CFI) for x86_64 ELF targets. `src/keccak.rs` calls it where the CPU has AVX-512VL
//! and keccak-asm's scalar Keccak elsewhere, so one binary runs on any x86_64. Its symbols
//! are renamed so they meet neither keccak-asm's nor OpenSSL's.
// A build script: a failure here is a failed build, said by its panic message.
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::{env, path::PathBuf, process::Command};

fn main() {
    println!("cargo::rustc-check-cfg=cfg(rw_keccak_avx512vl)");
    println!("cargo:rerun-if-changed=keccak");
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_default();
    let family = env::var("CARGO_CFG_TARGET_FAMILY").unwrap_or_default();
    let os = env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if arch != "x86_64" || family != "unix" || os == "macos" {
        return;
    }
    let out = PathBuf::from(env::var("OUT_DIR").expect("OUT_DIR"));
    let asm = out.join("keccak1600-avx512vl.S");
    let status = Command::new("perl")
        .arg("keccak/keccak1600-avx512vl.pl")
        .arg("elf")
        .arg(&asm)
        .status()
        .unwrap_or_else(|e| panic!("running perl for keccak/keccak1600-avx512vl.pl: {e}"));
    assert!(
        status.success(),
        "perl keccak/keccak1600-avx512vl.pl: {status}"
    );
    cc::Build::new()
        .file(&asm)
        .define("SHA3_absorb", "RW_AVX512VL_SHA3_absorb")
        .define("SHA3_squeeze", "RW_AVX512VL_SHA3_squeeze")
        .compile("rw_keccak_avx512vl");
    println!("cargo:rustc-cfg=rw_keccak_avx512vl");
}
