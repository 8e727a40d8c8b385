//! `rackwarden boot-reference`: what to put in the verifier's `[policy.boot]` to accept this
//! host's boot, or a kernel image about to be installed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rackwarden_attest::tpm::{EventLog, MeasuredBoot, MeasuredCmdline, pe_image_sha256};

/// PCR 9's events: digest and the text they carry (a file's path for GRUB; not covered by the
/// replay, so a hint for the operator only).
fn loaded_labels(log: &EventLog) -> Vec<(String, String)> {
    log.events_of(9)
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
        println!(
            "# Add to [policy.boot] kernels before the hosts boot it: the Authenticode SHA-256"
        );
        println!(
            "# where firmware or shim starts the image (PCR 4), the file's SHA-256 where a boot"
        );
        println!(
            "# loader reads it (GRUB, PCR 9). Adding both is safe: each accepts only this image."
        );
        for k in kernels {
            let image = std::fs::read(k).with_context(|| format!("reading {}", k.display()))?;
            let digest =
                pe_image_sha256(&image).map_err(|e| anyhow::anyhow!("{}: {e}", k.display()))?;
            use sha2::Digest as _;
            let file = sha2::Sha256::digest(&image);
            println!(
                "\"{}\",  # {} (Authenticode)",
                hex::encode(digest),
                k.display()
            );
            println!("\"{}\",  # {} (file)", hex::encode(file), k.display());
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
        let mut seen = std::collections::BTreeSet::new();
        v.iter()
            .filter(|d| seen.insert(d.as_str()))
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
    println!("# The verifier accepts by digest only; the sorting below follows the log's labels,");
    println!("# which the replay does not cover: check them before you rely on the sets.");
    // PCR 9 beyond the stub's initrd and command line: files a boot loader read.
    let cmdline_digest = m.cmdline_digest();
    let labels = loaded_labels(&log);
    let read_by_loader: Vec<&String> = m
        .loaded
        .iter()
        .filter(|d| Some(*d) != cmdline_digest.as_ref() && !m.initrd_labelled.contains(d))
        .collect();
    let label_of = |d: &String| labels.iter().find(|(x, _)| x == d).map(|(_, l)| l.as_str());
    let (mut loaders, mut kernel_list, mut initrds, mut boot_files) = (
        Vec::new(),
        Vec::new(),
        m.initrd_labelled.clone(),
        Vec::new(),
    );
    let kernel_files: Vec<String> = read_by_loader
        .iter()
        .filter(|d| label_of(d).is_some_and(|l| l.contains("vmlinu")))
        .map(|d| d.to_string())
        .collect();
    if kernel_files.is_empty() {
        // The kernel was started as an application: the last one in PCR 4.
        let n = m.applications.len();
        loaders.extend(m.applications.iter().take(n.saturating_sub(1)).cloned());
        kernel_list.extend(m.applications.last().cloned());
    } else {
        // GRUB read the kernel; shim then measures it into PCR 4 as it verifies it for GRUB.
        // By the log's order (a label too): applications after GRUB read the kernel are it.
        let read_at = log
            .events
            .iter()
            .position(|e| {
                e.pcr == 9
                    && e.sha256()
                        .is_some_and(|d| kernel_files.contains(&hex::encode(d)))
            })
            .unwrap_or(usize::MAX);
        for (i, e) in log.events.iter().enumerate() {
            let Some(d) = e.sha256().map(hex::encode) else {
                continue;
            };
            if e.pcr != 4 || !m.applications.contains(&d) {
                continue;
            }
            if i > read_at {
                kernel_list.push(d);
            } else {
                loaders.push(d);
            }
        }
        kernel_list.extend(kernel_files.iter().cloned());
    }
    for d in read_by_loader {
        if kernel_list.contains(d) {
            continue;
        }
        if label_of(d).is_some_and(|l| l.contains("initrd")) {
            initrds.push(d.clone());
        } else {
            boot_files.push(d.clone());
        }
        println!("#   PCR 9 {d}  {}", label_of(d).unwrap_or("(no label)"));
    }
    println!("[policy.boot]");
    println!("loaders = [{}]", list(&loaders));
    println!("kernels = [{}]", list(&kernel_list));
    if !initrds.is_empty() {
        println!("initrds = [{}]", list(&initrds));
    }
    if !boot_files.is_empty() {
        println!("boot_files = [{}]", list(&boot_files));
    }
    match &m.cmdline {
        MeasuredCmdline::Measured { cmdline, by } => {
            println!("# measured command line ({by:?}): {cmdline:?}");
            if let Some(lsm) = m.cmdline.lsm() {
                println!("cmdline_required = [\"{lsm}\"]");
            }
        }
        MeasuredCmdline::Mismatch { shipped, measured } => println!(
            "# the command line {shipped:?} does not hash to the measured {measured}: not proven"
        ),
        MeasuredCmdline::NotMeasured => println!("# no event measures this command line"),
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
