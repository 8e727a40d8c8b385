//! `rackwarden wipe`: one wipe, run by hand, with its report; `rackwarden storage`: what a
//! wipe does not cover.

use std::path::PathBuf;

use anyhow::bail;
use rackwarden::{units::ByteSize, wipe};
use rackwarden_attest::{nonce::Nonce, storage::StorageClass, units::fmt_size};

/// Exit code: 0 when every device is complete without mismatches, or absent; 1 on
/// mismatches or failures; 3 when interrupted (2 is clap's usage error).
pub fn wipe_cmd(
    backend: &str,
    max_bytes: Option<ByteSize>,
    nonce: Option<Nonce>,
    reserve: ByteSize,
    scratch: &[PathBuf],
    json: bool,
) -> anyhow::Result<i32> {
    let backends = wipe::Backend::parse(backend)?;
    if backends.contains(&wipe::Backend::Scratch) && scratch.is_empty() && backend == "scratch" {
        bail!("--backend scratch needs at least one --scratch DIR: nothing would be wiped");
    }
    let max_bytes = max_bytes.map(|b| b.0);
    let reserve_bytes = reserve.0;
    let nonce = match nonce {
        Some(n) => n,
        None => Nonce::random()?,
    };
    let nonce = *nonce.as_bytes();
    let stop = rackwarden::enforce::signals::stop_on_signals();
    let expect = 2 * max_bytes.unwrap_or_else(|| wipe::host::meminfo("MemAvailable").unwrap_or(0));
    let progress = rackwarden::progress::Progress::start("wipe".into(), expect);
    let req = wipe::WipeRequest {
        nonce,
        backends,
        max_bytes,
        reserve_bytes,
        scratch_paths: scratch.to_vec(),
        threads: rackwarden_attest::merkle::default_threads(),
        progress: Some(progress.done.clone()),
        corrupt_byte_for_test: None,
    };
    let report = wipe::run(&req, stop);
    drop(progress);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "nonce {}{}",
            report.nonce,
            if report.interrupted {
                "  (INTERRUPTED)"
            } else {
                ""
            }
        );
        println!(
            "{:<40} {:<12} {:>16} {:>16} {:>16} {:>10} {:>16} {:>9} {:>9}",
            "device",
            "status",
            "total B",
            "filled B",
            "verified B",
            "mismatch",
            "residue B",
            "fill GB/s",
            "ver GB/s"
        );
        let gbps = |b: u64, ms: u64| {
            if ms == 0 {
                "-".to_string()
            } else {
                format!("{:.2}", b as f64 / ms as f64 / 1e6)
            }
        };
        for d in &report.devices {
            println!(
                "{:<40} {:<12} {:>16} {:>16} {:>16} {:>10} {:>16} {:>9} {:>9}",
                d.device,
                d.status,
                d.bytes_total,
                d.bytes_filled,
                d.bytes_verified,
                d.mismatches,
                d.residue_bytes,
                gbps(d.bytes_filled, d.fill_ms),
                gbps(d.bytes_verified, d.verify_ms)
            );
            if let Some(x) = &d.detail {
                println!("    {x}");
            }
        }
    }
    let bad = report
        .devices
        .iter()
        .any(|d| d.mismatches > 0 || d.status == rackwarden_attest::evidence::WipeStatus::Failed);
    // Asking for one backend and wiping nothing (no driver, no device) is not a success.
    let nothing = report.devices.iter().all(|d| d.bytes_verified == 0);
    if nothing && !report.interrupted {
        eprintln!("rackwarden wipe: nothing was wiped (see each device's status above)");
    }
    let bad = bad || (nothing && backend != "all");
    Ok(if report.interrupted {
        3
    } else if bad {
        1
    } else {
        0
    })
}

/// `rackwarden storage`: the inventory a statement would carry now; returns its residue.
pub fn storage_cmd(json: bool) -> anyhow::Result<u64> {
    let inv = rackwarden::storage::take(Default::default());
    if json {
        println!("{}", serde_json::to_string_pretty(&inv)?);
        return Ok(inv.residue_bytes);
    }
    println!("{:<44} {:<11} {:>12}  why", "item", "class", "residue");
    for (name, class) in inv.items() {
        let (bytes, why) = match class {
            StorageClass::Residue {
                writable_bytes,
                why,
            } => (fmt_size(*writable_bytes), why.clone()),
            StorageClass::CountedOn { item } => (String::new(), format!("counted on {item}")),
            _ => (String::new(), String::new()),
        };
        println!("{name:<44} {:<11} {bytes:>12}  {why}", class.name());
    }
    for u in &inv.unreadable {
        println!("UNREADABLE: {u}");
    }
    println!(
        "persistent residue: {} ({} B): state written there survives a wipe",
        fmt_size(inv.residue_bytes),
        inv.residue_bytes
    );
    Ok(inv.residue_bytes)
}
