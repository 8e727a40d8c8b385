//! Measured boot in the guest (issue 41): the daemon ships the firmware's real event log
//! with its first quote, the verifier replays it to the quoted PCRs 0-9 and judges it by the
//! `[policy.boot]` sets an operator took from `rackwarden boot-reference` on the host. Each
//! policy below is what an operator could write; each verdict is the verifier's, over HTTP.
//!
//! The guest boots through OVMF without Secure Boot and with `bpf` in `lsm=`; what a boot
//! without `bpf` or with Secure Boot changes is judged with synthetic logs in the verifier's
//! `tpm_appraisal` tests.

use std::process::Command;

use rackwarden_attest::{
    evidence::{GuardAttach, LimiterReport, LsmGuard},
    tpm::{BootEvidence, EventLog},
};

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
    let reference = boot_reference();
    let kernel = kernel_of(&reference);
    // honest: the log replays, every component is in its set; the page names them.
    let (base, mut daemon, r) = honest_start(&mut m, &reference);
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
    let cases = vec![
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
    ];
    judge_policies_then_update(&mut m, &base, &reference, &kernel, cases);
    daemon.stop();

    edited_log_is_a_mismatch(&m);
}

/// An edited log: root ships the real log with one event's digest changed (the kernel's
/// swapped for another), beside a quote of the real PCRs.
fn edited_log_is_a_mismatch(m: &Matrix) {
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

/// Debian's Secure Boot chain from a disk (the `secure-boot` group): shim, GRUB and the
/// signed kernel, with `bpf` left out of `lsm=`. The policy from `rackwarden boot-reference`
/// accepts the boot with Secure Boot required and GRUB's measured command line required; a
/// kernel outside the set, a Secure Boot database other than the accepted one, a guard
/// claimed as BPF LSM programs on this command line and an edited log are each
/// contraindicated; a kernel update is accepted once its digest is added. `loaders`: shim's
/// and GRUB's digests as the harness computed them, which the page must name.
pub fn run_secure_boot(mut m: Matrix, loaders: &[String]) {
    let reference = boot_reference();
    let kernel = kernel_of(&reference);
    for line in [
        "secure_boot = true",
        "secure_boot_variables = {",
        "cmdline_required = [\"lsm=",
    ] {
        assert!(
            reference.contains(line),
            "the reference of a Secure Boot host lacks `{line}`:\n{reference}"
        );
    }
    let (base, mut daemon, _) = honest_start(&mut m, &reference);
    let page = m
        .verifier
        .get_text(&format!("/racks/{}", m.rack))
        .expect("the rack page");
    for (what, text) in [
        ("shim", &loaders[0][..12]),
        ("GRUB", &loaders[1][..12]),
        ("the kernel", &kernel[..12]),
        ("GRUB's command line", "(measured by GRUB)"),
        ("Secure Boot", "Secure Boot on"),
    ] {
        assert!(
            page.contains(text),
            "the page does not name {what} (`{text}`)"
        );
    }
    println!("SECURE-BOOT-MATRIX honest: affirming, the page names shim, GRUB and the kernel");

    let other = "0".repeat(64);
    let db = reference
        .lines()
        .find_map(|l| l.split("db = [\"").nth(1))
        .and_then(|l| l.get(..64))
        .unwrap_or_else(|| panic!("no db digest in the reference:\n{reference}"))
        .to_string();
    let cases = vec![(
        "Secure Boot's db other than the accepted one",
        reference.replace(&db, &other),
        "secure_boot_not_accepted",
        "db".to_string(),
    )];
    judge_policies_then_update(&mut m, &base, &reference, &kernel, cases);
    daemon.stop();

    // Root says the guard runs as BPF LSM programs, on a kernel GRUB started without `bpf`
    // in `lsm=`: the measured command line contradicts it.
    let (_, mut forged, digest) = m.forge_with(|st| {
        let LimiterReport::Present(e) = &mut st.predicate.limiter else {
            panic!("the daemon's statement has no limiter")
        };
        let sp = e
            .self_protection
            .as_mut()
            .expect("the daemon reports its self-protection");
        sp.lsm_guard = LsmGuard::Sealed {
            attach: GuardAttach::Lsm,
            hooks: vec!["bpf".into(), "file_open".into()],
            bpf_hook_args: 3,
            objects: 1,
            refusals: 0,
            tpm_devices: 0,
            tpm_held_elsewhere: 0,
        };
    });
    let mut sidecar = m.quote_as_root(&digest);
    let log = std::fs::read(rackwarden_attest::tpm::EVENT_LOG_PATH).unwrap();
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    sidecar.boot = Some(BootEvidence::new(&log, &cmdline));
    forged.tpm = Some(sidecar);
    let r = m.post(&forged);
    expect(
        "BPF LSM guard on a command line without bpf",
        &r,
        "contraindicated",
        "guard_contradicts_boot",
        "has no bpf",
    );
    assert_eq!(r["guard"], "contradicted_by_boot", "{r:#}");

    edited_log_is_a_mismatch(&m);
}

/// A kernel outside the set, then each `(attack, [policy.boot], code, naming)` an operator
/// could hold against this boot, judged on the next statement: contraindicated with `code`.
/// Then a kernel update: another kernel's digest added to the set beside `kernel`, nothing
/// else changed, is affirming.
fn judge_policies_then_update(
    m: &mut Matrix,
    base: &str,
    reference: &str,
    kernel: &str,
    cases: Vec<(&str, String, &str, String)>,
) {
    let other = "0".repeat(64);
    let kernel_outside = (
        "kernel outside the set",
        reference.replace(kernel, &other),
        "boot_component_not_accepted",
        kernel.to_string(),
    );
    for (attack, boot, code, naming) in std::iter::once(kernel_outside).chain(cases) {
        with_boot_policy(m, base, &last_of_each_key(&boot));
        let r = m.next_epoch();
        expect(attack, &r, "contraindicated", code, &naming);
    }
    let updated = reference.replace(
        &format!("\"{kernel}\""),
        &format!("\"{other}\", \"{kernel}\""),
    );
    with_boot_policy(m, base, &updated);
    let r = m.next_epoch();
    assert_eq!(r["status"], "affirming", "{r:#}");
    println!("BOOT-MATRIX kernel update: affirming once its digest is in the set");
}

/// The verifier on its config plus `reference`, the daemon started: its first verdict is
/// affirming at `tpm_ima`. Returns the config without the reference, the daemon and that
/// verdict.
fn honest_start(m: &mut Matrix, reference: &str) -> (String, crate::Daemon, serde_json::Value) {
    let base = std::fs::read_to_string(&m.verifier.config).unwrap();
    std::fs::write(&m.verifier.config, format!("{base}\n{reference}\n")).unwrap();
    m.verifier.start();
    let (daemon, r) = m.start_and_first(None);
    assert_eq!(r["status"], "affirming", "{r:#}");
    assert_eq!(r["root_of_trust"], "tpm_ima", "{r:#}");
    (base, daemon, r)
}

/// What the operator records on the host at install: `rackwarden boot-reference`.
fn boot_reference() -> String {
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
    reference
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
