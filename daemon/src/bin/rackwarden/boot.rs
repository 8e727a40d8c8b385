//! `rackwarden boot-reference`: what to put in the verifier's `[policy.boot]` to accept this
//! host's boot, or a kernel image about to be installed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rackwarden_attest::tpm::{EventLog, MeasuredBoot, MeasuredCmdline, pe_image_sha256};

/// GRUB's PCR 9 file events: digest and the path its text names (not covered by the replay).
fn loader_file_labels(log: &EventLog) -> Vec<(String, String)> {
    log.events_of(9)
        .filter(|e| e.event_type == rackwarden_attest::tpm::boot::EV_IPL)
        .filter_map(|e| {
            let label = String::from_utf8_lossy(&e.data)
                .trim_end_matches('\0')
                .to_string();
            Some((hex::encode(e.sha256()?), label))
        })
        .collect()
}

pub fn reference(event_log: &Path, cmdline: &Path, kernels: &[PathBuf]) -> Result<()> {
    if !kernels.is_empty() {
        println!("# The Authenticode SHA-256 firmware and shim log into PCR 4 for each image:");
        println!("# add to [policy.boot] kernels before the hosts boot it.");
        for k in kernels {
            let image = std::fs::read(k).with_context(|| format!("reading {}", k.display()))?;
            let digest =
                pe_image_sha256(&image).map_err(|e| anyhow::anyhow!("{}: {e}", k.display()))?;
            println!("\"{}\",  # {}", hex::encode(digest), k.display());
        }
        return Ok(());
    }
    let bytes = std::fs::read(event_log).with_context(|| {
        format!(
            "reading the event log {} (as root, on a UEFI host with a TPM)",
            event_log.display()
        )
    })?;
    let log = EventLog::parse(&bytes).with_context(|| event_log.display().to_string())?;
    let text = std::fs::read_to_string(cmdline)
        .with_context(|| format!("reading {}", cmdline.display()))?;
    let m = MeasuredBoot::read(&log, text.trim_end_matches('\n'));
    let list = |v: &[String]| {
        v.iter()
            .map(|d| format!("\"{d}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    println!(
        "# From {} ({} events, {} bytes) and {}.",
        event_log.display(),
        log.events.len(),
        bytes.len(),
        cmdline.display()
    );
    println!("[policy.boot]");
    println!("loaders = [{}]", list(&m.loaders));
    println!(
        "kernels = [{}]",
        list(&m.kernel.iter().cloned().collect::<Vec<_>>())
    );
    if !m.initrds.is_empty() {
        println!("initrds = [{}]", list(&m.initrds));
    }
    if !m.loader_files.is_empty() {
        println!(
            "# the boot loader read the kernel itself: put its file's SHA-256 in kernels, the"
        );
        println!("# initrd's in initrds, and the rest in boot_files (the labels are the log's):");
        for (digest, label) in loader_file_labels(&log) {
            println!("#   {digest}  {label}");
        }
        println!("boot_files = [{}]", list(&m.loader_files));
    }
    match &m.cmdline {
        MeasuredCmdline::Measured { cmdline } => {
            println!("# measured command line: {cmdline:?}");
            if let Some(lsm) = m.cmdline.lsm() {
                println!("cmdline_required = [\"{lsm}\"]");
            }
        }
        MeasuredCmdline::Mismatch { shipped, measured } => println!(
            "# the command line {shipped:?} does not hash to the measured {measured}: not proven"
        ),
        MeasuredCmdline::NotMeasured => println!("# no event measures the command line"),
    }
    match m.secure_boot.enabled {
        Some(true) => println!("secure_boot = true"),
        Some(false) => println!("# Secure Boot is disabled on this host"),
        None => println!("# the log measures no SecureBoot variable"),
    }
    if !m.secure_boot.variables.is_empty() {
        let vars: Vec<String> = m
            .secure_boot
            .variables
            .iter()
            .map(|(k, v)| format!("{k} = [\"{v}\"]"))
            .collect();
        println!("secure_boot_variables = {{ {} }}", vars.join(", "));
    }
    Ok(())
}
