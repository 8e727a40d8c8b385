//! A real kernel's IMA against a real (emulated) TPM: the `tpm` group of `cargo xtask vm-test`
//! boots the guest with swtpm behind qemu's `tpm-tis` through OVMF (UEFI), the firmware and
//! the kernel's EFI stub measuring the boot into PCRs 0-9 and IMA
//! (`ima_policy=tcb ima_template=ima-ng`) into PCR 10. What the daemon quotes and what the
//! verifier replays from `/sys/kernel/security/ima/binary_runtime_measurements` (PCR 10) and
//! `/sys/kernel/security/tpm0/binary_bios_measurements` (PCRs 0-9) must agree. The EK
//! certificate is checked against the CA the harness manufactured the TPM with
//! (`/rw/tpm-ca/`).
//!
//! Only in the guest: on a host (no `RACKWARDEN_VM`, or no `/dev/tpmrm0`) each test says why
//! and returns; `tests/tests/tpm.rs` covers the same code against swtpm there.

use std::{
    io::Write as _,
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::Path,
    process::Command,
    time::{Instant, SystemTime, UNIX_EPOCH},
};

use rackwarden::tpm::Tpm;
use rackwarden_attest::tpm::{
    AkPublic, EkPublic, ImaEntry, PcrValues,
    eventlog::{
        EV_EFI_BOOT_SERVICES_APPLICATION, EventLog, LINUX_EFI_INITRD_EVENT_TAG_ID,
        LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID, LogEvent, efi_load_options_digest,
    },
    parse_ima_binary, replay_prefix, verify_ek_certificate, verify_quote,
};
use sha2::{Digest, Sha256};

const DEVICE: &str = "/dev/tpmrm0";
const TCTI: &str = "device:/dev/tpmrm0";
const IMA_LIST: &str = "/sys/kernel/security/ima/binary_runtime_measurements";
const EVENT_LOG: &str = "/sys/kernel/security/tpm0/binary_bios_measurements";
/// The boot's PCRs: firmware (0-3, 5-7), the kernel image (4), initrd and command line (9).
const BOOT_PCRS: [u8; 10] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9];
const CA_ROOT: &str = "/rw/tpm-ca/root.pem";
const CA_INTERMEDIATE: &str = "/rw/tpm-ca/intermediate.pem";
/// The firmware's PCRs and IMA's.
const PCRS: [u8; 9] = [0, 1, 2, 3, 4, 5, 6, 7, 10];

/// Why each test here is ignored on the host: the `tpm` VM group runs them with
/// `--include-ignored`.
const GUEST_ONLY: &str =
    "needs the `tpm` vm-test guest (a TPM and IMA); `cargo xtask vm-test --group tpm` runs it";

/// Fails, saying why, unless this is the `tpm` VM group's guest: an ignored test run by
/// hand elsewhere must not pass without checking anything.
fn require_tpm_guest(test: &str) {
    assert!(
        std::env::var_os("RACKWARDEN_VM").is_some(),
        "{test}: not in a vm-test guest (RACKWARDEN_VM unset): {GUEST_ONLY}"
    );
    assert!(
        Path::new(DEVICE).exists(),
        "{test}: this guest has no {DEVICE} (not the `tpm` group): {GUEST_ONLY}"
    );
}

fn open() -> Tpm {
    Tpm::open(TCTI).unwrap_or_else(|e| panic!("opening {TCTI}: {e}"))
}

fn ima_list() -> Vec<ImaEntry> {
    let bytes = std::fs::read(IMA_LIST).unwrap_or_else(|e| panic!("{IMA_LIST}: {e}"));
    parse_ima_binary(&bytes).unwrap_or_else(|e| panic!("the kernel's IMA list: {e}"))
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[test]
#[ignore = "needs the `tpm` vm-test guest (a TPM and IMA); `cargo xtask vm-test --group tpm` runs it"]
fn the_quoted_pcr10_is_the_replay_of_the_kernels_ima_list() {
    require_tpm_guest("the_quoted_pcr10_is_the_replay_of_the_kernels_ima_list");
    let dir = std::env::temp_dir().join(format!("tpm-guest-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut tpm = open();

    // The EK certificate in NV chains to the CA the harness manufactured this TPM with.
    let ek = tpm.ek().unwrap();
    let cert = ek
        .certificate
        .expect("the manufactured TPM has an EK certificate");
    let ek_public = EkPublic::parse(&ek.public).unwrap();
    let root = std::fs::read(CA_ROOT).unwrap();
    let intermediate = std::fs::read(CA_INTERMEDIATE).unwrap();
    let checked = verify_ek_certificate(&cert, &ek_public, &root, &intermediate, now_unix())
        .unwrap_or_else(|e| panic!("the guest TPM's EK certificate is refused: {e}"));
    assert_eq!(checked.chain.len(), 2, "{:?}", checked.chain);

    let ak = tpm.load_or_create_ak(&dir.join("ak.json")).unwrap();
    let ak_public = AkPublic::parse(&ak.public).unwrap();

    // The list before the quote: boot_aggregate first, and what ran since boot.
    let before = ima_list();
    let first = before.first().expect("IMA measured nothing (TPM-bypass?)");
    assert_eq!(
        first.path.as_deref(),
        Some("boot_aggregate"),
        "first entry {first:?}"
    );
    assert!(!first.is_violation(), "boot_aggregate is a violation");
    let (alg, aggregate) = first.file_digest.clone().expect("boot_aggregate's d-ng");
    assert_eq!(alg, "sha256", "boot_aggregate from the sha256 bank");

    let extra: [u8; 32] = Sha256::digest(b"rackwarden tpm guest quote").into();
    let t0 = Instant::now();
    let quote = tpm.quote(&extra, &PCRS).unwrap();
    let quote_ms = t0.elapsed().as_secs_f64() * 1e3;
    // Read after quoting: it may have grown since, never shrunk below what was read before.
    let after = ima_list();
    let pcr10 = quote.pcr_values[&10];
    let prefix = replay_prefix([0; 32], &after, &pcr10).unwrap_or_else(|| {
        panic!(
            "no prefix of the {} IMA entries replays to the quoted PCR 10 {}",
            after.len(),
            hex::encode(pcr10)
        )
    });
    assert!(
        prefix >= before.len(),
        "the replayed prefix ({prefix}) is shorter than the list read before the quote ({})",
        before.len()
    );
    assert_eq!(&after[..before.len()], &before[..], "the list only grows");

    let t0 = Instant::now();
    let values = PcrValues::from(quote.pcr_values.clone());
    let info = verify_quote(&ak_public, &quote.attest, &quote.signature, &extra, &values)
        .unwrap_or_else(|e| panic!("the guest TPM's quote is refused: {e}"));
    let verify_ms = t0.elapsed().as_secs_f64() * 1e3;
    assert_eq!(info.selection.indices(), PCRS.to_vec());

    // boot_aggregate = SHA-256(PCR 0 || ... || PCR 9) of the sha256 bank (Linux >= 5.8).
    let low = tpm.read_pcrs(&[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    let mut h = Sha256::new();
    for v in low.values() {
        h.update(v);
    }
    let recomputed: [u8; 32] = h.finalize().into();
    let violations = after[..prefix].iter().filter(|e| e.is_violation()).count();
    println!(
        "RW_REPORT tpm-guest: {prefix} IMA entries ({} read before the quote, {violations} violations), PCR10 replayed, quote verified in {quote_ms:.0} ms (quote) + {verify_ms:.1} ms (verify); boot_aggregate {} PCRs 0-9",
        before.len(),
        if recomputed.as_slice() == aggregate.as_slice() {
            "= SHA-256 of"
        } else {
            "DIFFERS from SHA-256 of"
        }
    );
    let pcrs: Vec<String> = (0..8u8)
        .map(|i| format!("{i}={}", hex::encode(quote.pcr_values[&i])))
        .collect();
    println!("RW_REPORT tpm-guest PCRs: {}", pcrs.join(" "));
    assert_eq!(
        hex::encode(aggregate),
        hex::encode(recomputed),
        "boot_aggregate is not SHA-256(PCR 0..9) of the sha256 bank"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The basis of the "unknown executable" appraisal: running a file never run before adds an
/// entry naming its path with its SHA-256, and the quote still replays.
#[test]
#[ignore = "needs the `tpm` vm-test guest (a TPM and IMA); `cargo xtask vm-test --group tpm` runs it"]
fn a_new_executable_is_measured_with_its_sha256() {
    require_tpm_guest("a_new_executable_is_measured_with_its_sha256");
    // On the root (ramfs): the tcb policy does not measure tmpfs, which /tmp is.
    let path = format!("/var/tmp/newexe-{}", std::process::id());
    let mut bytes = std::fs::read("/bin/busybox").unwrap();
    // A trailer after the ELF makes its digest unique to this run (the loader ignores it).
    bytes.extend(format!("\nrackwarden {} {}\n", std::process::id(), now_unix()).as_bytes());
    let digest: [u8; 32] = Sha256::digest(&bytes).into();
    {
        let mut f = std::fs::File::create(&path).unwrap();
        f.write_all(&bytes).unwrap();
    }
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = ima_list();
    assert!(
        !before
            .iter()
            .any(|e| e.path.as_deref() == Some(path.as_str())),
        "{path} was measured before it ran"
    );

    let st = Command::new(&path)
        .arg0("busybox")
        .arg("true")
        .status()
        .unwrap();
    assert!(st.success(), "{path} true: {st}");

    let after = ima_list();
    let entry = after[before.len()..]
        .iter()
        .find(|e| e.path.as_deref() == Some(path.as_str()))
        .unwrap_or_else(|| {
            panic!(
                "no new IMA entry names {path} ({} new entries: {:?})",
                after.len() - before.len(),
                after[before.len()..]
                    .iter()
                    .map(|e| e.path.clone())
                    .collect::<Vec<_>>()
            )
        });
    assert_eq!(entry.template_name, "ima-ng");
    assert!(!entry.is_violation(), "{entry:?}");
    assert_eq!(
        entry.file_digest,
        Some(("sha256".to_string(), digest.to_vec())),
        "the d-ng field is the file's SHA-256"
    );

    // And the PCR still replays with the new entry in it.
    let mut tpm = open();
    let pcr10 = tpm.read_pcrs(&[10]).unwrap()[&10];
    let list = ima_list();
    let prefix = replay_prefix([0; 32], &list, &pcr10).expect("PCR 10 replays");
    assert!(prefix >= after.len(), "{prefix} < {}", after.len());
    println!(
        "RW_REPORT tpm-guest: running {path} added entry {} of {} (sha256 {})",
        after.iter().position(|e| e == entry).unwrap_or(0),
        after.len(),
        hex::encode(digest)
    );
    let _ = std::fs::remove_file(&path);
}

/// `rw.<key>=` on the command line: the harness's SHA-256 of what it handed qemu
/// (`kernel_sha256`: the kernel image as OVMF measures it; `initrd_sha256`: the initrd).
fn harness_digest(cmdline: &str, key: &str) -> Option<String> {
    cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("rw.")?.strip_prefix(key)?.strip_prefix('='))
        .map(str::to_string)
}

/// UEFI_IMAGE_LOAD_EVENT's ImageLengthInMemory: the size of the PE image the firmware started.
fn image_length(e: &LogEvent) -> Option<u64> {
    Some(u64::from_le_bytes(e.data.get(8..16)?.try_into().ok()?))
}

/// Measured boot: the firmware's event log replays to the quoted PCRs 0-9; PCR 4 holds the
/// kernel's PE image (EV_EFI_BOOT_SERVICES_APPLICATION) and PCR 9 the initrd the harness
/// handed qemu and, on kernels whose EFI stub measures it, the command line this kernel runs
/// with. The values printed are what an operator records as `[policy.boot] pcrs`.
#[test]
#[ignore = "needs the `tpm` vm-test guest (a TPM and IMA); `cargo xtask vm-test --group tpm` runs it"]
fn the_quoted_boot_pcrs_are_the_replay_of_the_firmware_event_log() {
    require_tpm_guest("the_quoted_boot_pcrs_are_the_replay_of_the_firmware_event_log");
    assert!(
        Path::new("/sys/firmware/efi").exists(),
        "the guest booted without UEFI: the harness boots the tpm group through OVMF"
    );
    let bytes = std::fs::read(EVENT_LOG).unwrap_or_else(|e| panic!("{EVENT_LOG}: {e}"));
    let log = EventLog::parse(&bytes).unwrap_or_else(|e| panic!("the firmware's event log: {e}"));
    let replayed = log
        .replay_sha256()
        .unwrap_or_else(|e| panic!("replaying the event log: {e}"));

    let dir = std::env::temp_dir().join(format!("tpm-guest-boot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut tpm = open();
    let ak = tpm.load_or_create_ak(&dir.join("ak.json")).unwrap();
    let ak_public = AkPublic::parse(&ak.public).unwrap();
    let extra: [u8; 32] = Sha256::digest(b"rackwarden tpm guest boot quote").into();
    let quote = tpm.quote(&extra, &BOOT_PCRS).unwrap();
    let values = PcrValues::from(quote.pcr_values.clone());
    let info = verify_quote(&ak_public, &quote.attest, &quote.signature, &extra, &values)
        .unwrap_or_else(|e| panic!("the guest TPM's quote of PCRs 0-9 is refused: {e}"));
    assert_eq!(info.selection.indices(), BOOT_PCRS.to_vec());

    let differ: Vec<String> = BOOT_PCRS
        .iter()
        .filter(|p| replayed.get(**p) != values.get(**p))
        .map(|p| {
            let events: Vec<String> = log.events_of(u32::from(*p)).map(|e| e.describe()).collect();
            format!(
                "PCR {p}: quoted {}, replayed {} from {events:?}",
                hex::encode(values.get(*p).copied().unwrap_or_default()),
                hex::encode(replayed.get(*p).copied().unwrap_or_default()),
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "the event log does not replay to the quote:\n{}",
        differ.join("\n")
    );

    // PCR 4: the kernel, which OVMF loaded from qemu's fw_cfg and started as a UEFI
    // application (after it, EV_EFI_ACTION and the separator).
    let kernel: Vec<&LogEvent> = log
        .events_of(4)
        .filter(|e| e.event_type == EV_EFI_BOOT_SERVICES_APPLICATION)
        .collect();
    let [kernel] = kernel.as_slice() else {
        panic!(
            "PCR 4 has {} EV_EFI_BOOT_SERVICES_APPLICATION events, want the kernel's one: {:?}",
            kernel.len(),
            log.events_of(4).map(|e| e.describe()).collect::<Vec<_>>()
        );
    };

    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    let cmdline = cmdline.trim_end_matches('\n');
    if let Some(want) = harness_digest(cmdline, "kernel_sha256") {
        assert_eq!(
            hex::encode(kernel.sha256().unwrap_or_default()),
            want,
            "PCR 4's kernel measurement is not the image the harness handed qemu"
        );
    }

    // PCR 9: the EFI stub's tagged events, the initrd always and the command line on kernels
    // that measure LoadOptions.
    let tagged = |id: u32| -> Vec<[u8; 32]> {
        log.events_of(9)
            .filter(|e| e.tagged().is_some_and(|(t, _)| t == id))
            .filter_map(|e| e.sha256())
            .collect()
    };
    let initrd = tagged(LINUX_EFI_INITRD_EVENT_TAG_ID);
    let [initrd] = initrd.as_slice() else {
        panic!(
            "PCR 9 has {} initrd events, want one: {:?}",
            initrd.len(),
            log.events_of(9).map(|e| e.describe()).collect::<Vec<_>>()
        );
    };
    if let Some(want) = harness_digest(cmdline, "initrd_sha256") {
        assert_eq!(
            hex::encode(initrd),
            want,
            "PCR 9's initrd measurement is not the SHA-256 of the initrd the harness handed qemu"
        );
    }
    let load_options = tagged(LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID);
    let cmdline_measured = match load_options.as_slice() {
        [] => false,
        [digest] => {
            assert_eq!(
                hex::encode(digest),
                hex::encode(efi_load_options_digest(cmdline)),
                "PCR 9's LoadOptions measurement is not this kernel's command line {cmdline:?}"
            );
            true
        }
        more => panic!("PCR 9 has {} LoadOptions events, want one", more.len()),
    };

    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "RW_REPORT tpm-guest boot: {} {} events replay to the quoted PCRs 0-9; PCR 4 kernel image {} ({} bytes, = the harness's), PCR 9 initrd {} (= the harness's), command line {}",
        release.trim(),
        log.events.len(),
        hex::encode(kernel.sha256().unwrap_or_default()),
        image_length(kernel).unwrap_or(0),
        hex::encode(initrd),
        if cmdline_measured {
            "measured (LOADED_IMAGE::LoadOptions = this /proc/cmdline)"
        } else {
            "NOT measured by this kernel's EFI stub"
        }
    );
    let reference: Vec<String> = BOOT_PCRS
        .iter()
        .map(|p| {
            format!(
                "{p} = \"{}\"",
                hex::encode(values.get(*p).copied().unwrap_or_default())
            )
        })
        .collect();
    println!(
        "RW_REPORT tpm-guest [policy.boot] pcrs = {{ {} }}",
        reference.join(", ")
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The attack matrix of `tests/tests/tpm_e2e.rs` against the guest's real TPM and its
/// kernel's IMA: the daemon quotes with `/dev/tpmrm0`, the verifier enrols its AK against the
/// CA the harness manufactured the TPM with, and each attack runs as root in the guest (the
/// forging program, the unknown executable and the modified daemon are measured by the
/// kernel because they run from the ramfs root, not from tmpfs, which the tcb policy skips).
#[test]
#[ignore = "needs the `tpm` vm-test guest (a TPM and IMA); `cargo xtask vm-test --group tpm` runs it"]
fn the_tpm_attack_matrix_in_the_guest() {
    require_tpm_guest("the_tpm_attack_matrix_in_the_guest");
    rackwarden_tests::tpmmatrix::run(rackwarden_tests::tpmmatrix::Matrix::new("gmx", |_| {
        rackwarden_tests::tpmmatrix::Platform::device(
            Path::new(CA_ROOT),
            Path::new(CA_INTERMEDIATE),
            Path::new("/root/rw-tpm-matrix"),
        )
    }));
}

/// Measured boot judged from the firmware's event log, through the daemon and the verifier:
/// the policy from `rackwarden boot-reference` accepts this boot; a kernel outside the set,
/// a missing required argument, Secure Boot required and an edited log are each
/// contraindicated; a kernel update is accepted once its digest is added.
#[test]
#[ignore = "needs the `tpm` vm-test guest (a TPM and IMA); `cargo xtask vm-test --group tpm` runs it"]
fn the_boot_is_judged_from_the_event_log_in_the_guest() {
    require_tpm_guest("the_boot_is_judged_from_the_event_log_in_the_guest");
    rackwarden_tests::bootmatrix::run(rackwarden_tests::tpmmatrix::Matrix::new("gbt", |_| {
        rackwarden_tests::tpmmatrix::Platform::device(
            Path::new(CA_ROOT),
            Path::new(CA_INTERMEDIATE),
            Path::new("/root/rw-boot-matrix"),
        )
    }));
}

/// The guard keeps the TPM for the daemon: root's shell writing raw TPM commands to the
/// device is refused while the daemon quotes on.
///
/// Last in the guest, by name: the guest runs its tests one at a time in name order, and a
/// sealed guard stays until reboot (nothing but the daemon can unpin it), so every test
/// after this one could not open the TPM.
#[test]
#[ignore = "needs the `tpm` vm-test guest (a TPM and IMA); `cargo xtask vm-test --group tpm` runs it"]
fn the_tpm_is_kept_for_the_daemon_by_the_guard() {
    require_tpm_guest("the_tpm_is_kept_for_the_daemon_by_the_guard");
    rackwarden_tests::tpmmatrix::run_guarded(rackwarden_tests::tpmmatrix::Matrix::new(
        "ggd",
        |_| {
            rackwarden_tests::tpmmatrix::Platform::device(
                Path::new(CA_ROOT),
                Path::new(CA_INTERMEDIATE),
                Path::new("/root/rw-guard-tpm"),
            )
        },
    ));
}

/// Debian's Secure Boot chain from a disk (the `secure-boot` group): OVMF with Microsoft's
/// keys started the signed shim, shim verified the signed GRUB, GRUB had shim verify the
/// signed kernel and read it and the initrd from the ESP. The log shows each as the harness
/// built it (`rw.loader_sha256=`, `rw.kernel_sha256=`, `rw.kernel_file_sha256=`,
/// `rw.initrd_sha256=`), Secure Boot on, and the command line GRUB measured into PCR 8, the
/// one this kernel runs with (without `bpf` in `lsm=`); then the verifier judges it
/// ([`rackwarden_tests::bootmatrix::run_secure_boot`]).
#[test]
#[ignore = "needs the `secure-boot` vm-test guest (shim, GRUB, a TPM and IMA); `cargo xtask vm-test --group secure-boot` runs it"]
fn the_shim_and_grub_secure_boot_is_judged_in_the_guest() {
    use rackwarden_attest::tpm::{CmdlineWitness, MeasuredBoot, MeasuredCmdline};
    require_tpm_guest("the_shim_and_grub_secure_boot_is_judged_in_the_guest");
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap();
    let cmdline = cmdline.trim_end_matches('\n');
    let want = |key: &str| {
        harness_digest(cmdline, key).unwrap_or_else(|| {
            panic!("rw.{key}= is not on the command line: not the secure-boot group ({cmdline})")
        })
    };
    let bytes = std::fs::read(EVENT_LOG).unwrap_or_else(|e| panic!("{EVENT_LOG}: {e}"));
    let log = EventLog::parse(&bytes).unwrap_or_else(|e| panic!("the firmware's event log: {e}"));
    let m = MeasuredBoot::read(&log, cmdline);
    let describe = |pcr: u32| -> Vec<String> { log.events_of(pcr).map(|e| e.describe()).collect() };

    assert_eq!(
        m.secure_boot.enabled,
        Some(true),
        "PCR 7: {:?}",
        describe(7)
    );
    let lockdown = std::fs::read_to_string("/sys/kernel/security/lockdown").unwrap_or_default();
    assert!(
        lockdown.contains("[integrity]"),
        "the kernel booted under Secure Boot enforces lockdown: {lockdown:?}"
    );
    // PCR 4: shim (the firmware), GRUB (shim), then the kernel as shim verified it for GRUB.
    let loaders: Vec<String> = want("loader_sha256")
        .split(',')
        .map(str::to_string)
        .collect();
    assert_eq!(
        m.applications.get(..2),
        Some(&loaders[..]),
        "PCR 4 does not start with shim and GRUB: {:?}",
        describe(4)
    );
    let kernel = want("kernel_sha256");
    assert!(
        m.applications[2..].iter().all(|a| *a == kernel) && m.applications.len() > 2,
        "PCR 4 after GRUB holds other than the kernel {kernel}: {:?}",
        describe(4)
    );
    // PCR 9: the files GRUB read, its config among them.
    for key in ["kernel_file_sha256", "initrd_sha256"] {
        let d = want(key);
        assert!(
            m.loaded.contains(&d),
            "PCR 9 lacks {key} {d}: {:?}",
            describe(9)
        );
    }
    assert_eq!(
        m.cmdline,
        MeasuredCmdline::Measured {
            cmdline: cmdline.to_string(),
            by: CmdlineWitness::Grub
        },
        "PCR 8: {:?}",
        describe(8)
    );
    assert_eq!(m.cmdline.enables_bpf_lsm(), Some(false), "{cmdline}");
    println!(
        "RW_REPORT tpm-guest: secure boot log of {} events, {} bytes; PCR 4 {} applications, PCR 9 {} files, lockdown {}",
        m.events,
        bytes.len(),
        m.applications.len(),
        m.loaded.len(),
        lockdown.trim()
    );

    rackwarden_tests::bootmatrix::run_secure_boot(
        rackwarden_tests::tpmmatrix::Matrix::new("gsb", |_| {
            rackwarden_tests::tpmmatrix::Platform::device(
                Path::new(CA_ROOT),
                Path::new(CA_INTERMEDIATE),
                Path::new("/root/rw-secure-boot-matrix"),
            )
        }),
        &loaders,
    );
}
