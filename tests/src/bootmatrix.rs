//! Measured boot in the guest (issue 41): the daemon ships the firmware's real event log
//! with its first quote, the verifier replays it to the quoted PCRs 0-9 and judges it by the
//! `[policy.boot]` sets an operator took from `rackwarden boot-reference` on the host. Each
//! policy below is what an operator could write; each verdict is the verifier's, over HTTP.
//!
//! The guest boots through OVMF without Secure Boot and with `bpf` in `lsm=`; what a boot
//! without `bpf` or with Secure Boot changes is judged with synthetic logs in the verifier's
//! `tpm_appraisal` tests.

use std::process::Command;

use rackwarden_attest::tpm::{BootEvidence, EventLog};

use crate::bin;
use crate::tpmmatrix::{Matrix, codes, expect};

/// The verifier's config with `boot` as its `[policy.boot]`, restarted on it.
fn with_boot_policy(m: &mut Matrix, base: &str, boot: &str) {
    std::fs::write(&m.verifier.config, format!("{base}\n{boot}\n")).unwrap();
    m.verifier.kill9();
    m.verifier.start();
}

/// `kernels = ["<hex>"]` of a reference, the digest alone.
fn kernel_of(reference: &str) -> String {
    reference
        .lines()
        .find_map(|l| l.strip_prefix("kernels = [\""))
        .and_then(|l| l.get(..64))
        .unwrap_or_else(|| panic!("no kernel in the reference:\n{reference}"))
        .to_string()
}

pub fn run(mut m: Matrix) {
    // What the operator records on the host at install.
    let out = Command::new(bin("rackwarden"))
        .arg("boot-reference")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "rackwarden boot-reference: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reference = String::from_utf8(out.stdout).unwrap();
    println!("BOOT-MATRIX reference:\n{reference}");
    let kernel = kernel_of(&reference);
    let base = std::fs::read_to_string(&m.verifier.config).unwrap();
    std::fs::write(&m.verifier.config, format!("{base}\n{reference}\n")).unwrap();
    m.verifier.start();

    // honest: the log replays, every component is in its set; the page names them.
    let (mut daemon, r) = m.start_and_first(None);
    assert_eq!(r["status"], "affirming", "{r:#}");
    assert_eq!(r["root_of_trust"], "tpm_ima", "{r:#}");
    let shipped = m.last_logged().tpm.and_then(|t| t.boot);
    let Some(BootEvidence { log, .. }) = &shipped else {
        panic!("the daemon's first statement carries no boot log")
    };
    println!(
        "BOOT-MATRIX honest: affirming (boot log of {} base64 bytes replayed; guard {})",
        log.len(),
        r["guard"].as_str().unwrap_or("not sealed")
    );
    let page = m
        .verifier
        .get_text(&format!("/racks/{}", m.rack))
        .expect("the rack page");
    assert!(
        page.contains("measured boot") && page.contains(&kernel[..12]),
        "the page names the measured kernel {kernel}"
    );
    // The next statement carries no log: judged by the boot the first one verified.
    let r = m.next_epoch();
    assert_eq!(r["status"], "affirming", "{r:#}");
    assert!(
        m.last_logged().tpm.and_then(|t| t.boot).is_none(),
        "the log goes once per boot"
    );

    // Each policy an operator could hold against this boot, judged on the next statement.
    let other = "0".repeat(64);
    for (attack, boot, code, naming) in [
        (
            "kernel outside the set",
            reference.replace(&kernel, &other),
            "boot_component_not_accepted",
            kernel.clone(),
        ),
        (
            "command line without a required argument",
            format!("{reference}cmdline_required = [\"rw.absent=1\"]\n"),
            "boot_cmdline_not_accepted",
            "rw.absent=1".to_string(),
        ),
        (
            "Secure Boot disabled",
            format!("{reference}secure_boot = true\n"),
            "secure_boot_not_accepted",
            "SecureBoot".to_string(),
        ),
    ] {
        with_boot_policy(&mut m, &base, &last_of_each_key(&boot));
        let r = m.next_epoch();
        expect(attack, &r, "contraindicated", code, &naming);
    }

    // A kernel update: the new kernel's digest added to the set, nothing else changed.
    let updated = reference.replace(
        &format!("kernels = [\"{kernel}\"]"),
        &format!("kernels = [\"{other}\", \"{kernel}\"]"),
    );
    with_boot_policy(&mut m, &base, &updated);
    let r = m.next_epoch();
    assert_eq!(r["status"], "affirming", "{r:#}");
    println!("BOOT-MATRIX kernel update: affirming once its digest is in the set");
    daemon.stop();

    // An edited log: root ships the real log with one event's digest changed (the kernel's
    // swapped for another), beside a quote of the real PCRs.
    let bytes = std::fs::read(rackwarden_attest::tpm::EVENT_LOG_PATH).unwrap();
    let mut edited = EventLog::parse(&bytes).unwrap();
    let event = edited
        .events
        .iter_mut()
        .rfind(|e| e.pcr == 4 && e.sha256().is_some())
        .expect("a PCR 4 event");
    for (alg, d) in &mut event.digests {
        if *alg == rackwarden_attest::tpm::eventlog::TPM_ALG_SHA256 {
            d.fill(0x42);
        }
    }
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    let (_, mut forged, digest) = m.forge();
    let mut sidecar = m.quote_as_root(&digest);
    sidecar.boot = Some(BootEvidence::new(&edited.to_bytes(), &cmdline));
    forged.tpm = Some(sidecar);
    let r = m.post(&forged);
    expect(
        "edited event log",
        &r,
        "contraindicated",
        "boot_log_mismatch",
        "PCR 4 quoted",
    );
    println!("BOOT-MATRIX codes of the last verdict: {:?}", codes(&r));
}

/// A reference with a key appended again keeps the last (TOML refuses a repeated key).
fn last_of_each_key(text: &str) -> String {
    let mut seen = std::collections::BTreeSet::new();
    let mut lines: Vec<&str> = text.lines().collect();
    lines.reverse();
    let mut out: Vec<&str> = lines
        .into_iter()
        .filter(|l| match l.split_once(" = ") {
            Some((k, _)) if !l.starts_with('#') => seen.insert(k.trim().to_string()),
            _ => true,
        })
        .collect();
    out.reverse();
    out.join("\n")
}
