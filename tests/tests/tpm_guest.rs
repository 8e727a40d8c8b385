//! A real kernel's IMA against a real (emulated) TPM: the `tpm` group of `cargo xtask vm-test`
//! boots the guest with swtpm behind qemu's `tpm-tis`, SeaBIOS measuring into PCRs 0-7 and
//! IMA (`ima_policy=tcb ima_template=ima-ng`) into PCR 10. What the daemon quotes and what
//! the verifier replays from `/sys/kernel/security/ima/binary_runtime_measurements` must
//! agree. The EK certificate is checked against the CA the harness manufactured the TPM with
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
    AkPublic, EkPublic, ImaEntry, PcrValues, parse_ima_binary, replay_prefix,
    verify_ek_certificate, verify_quote,
};
use sha2::{Digest, Sha256};

const DEVICE: &str = "/dev/tpmrm0";
const TCTI: &str = "device:/dev/tpmrm0";
const IMA_LIST: &str = "/sys/kernel/security/ima/binary_runtime_measurements";
const CA_ROOT: &str = "/rw/tpm-ca/root.pem";
const CA_INTERMEDIATE: &str = "/rw/tpm-ca/intermediate.pem";
/// The firmware's PCRs and IMA's.
const PCRS: [u8; 9] = [0, 1, 2, 3, 4, 5, 6, 7, 10];

/// True in the `tpm` VM group; elsewhere prints why the test does nothing.
fn in_tpm_guest(test: &str) -> bool {
    if std::env::var_os("RACKWARDEN_VM").is_none() {
        println!("{test}: not in a vm-test guest (RACKWARDEN_VM unset): nothing to check here");
        return false;
    }
    if !Path::new(DEVICE).exists() {
        println!("{test}: this guest has no {DEVICE} (not the `tpm` group): nothing to check");
        return false;
    }
    true
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
fn the_quoted_pcr10_is_the_replay_of_the_kernels_ima_list() {
    if !in_tpm_guest("the_quoted_pcr10_is_the_replay_of_the_kernels_ima_list") {
        return;
    }
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
fn a_new_executable_is_measured_with_its_sha256() {
    if !in_tpm_guest("a_new_executable_is_measured_with_its_sha256") {
        return;
    }
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
