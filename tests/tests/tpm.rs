//! The daemon's TPM side (`rackwarden::tpm`) against a real software TPM (swtpm), checked by
//! the verifier's pure-Rust side (`rackwarden_attest::tpm`): what a host sends is what the
//! verifier accepts, and what it must refuse is refused. Root is not needed.

use std::time::Instant;

use rackwarden::tpm::{AkSource, RootOfTrust, Tpm, TpmError, open_root_of_trust};
use rackwarden_attest::tpm::{AkPublic, EkPublic, PcrValues, QuoteError, verify_quote};
use rackwarden_tests::tpm::{SwTpm, manufactured};
use sha2::{Digest, Sha256};

/// PCRs a statement quotes: the firmware's 0-7 and IMA's 10.
const PCRS: [u8; 9] = [0, 1, 2, 3, 4, 5, 6, 7, 10];

fn open(t: &SwTpm) -> Tpm {
    Tpm::open(&t.tcti).unwrap_or_else(|e| panic!("{e}\nswtpm log:\n{}", t.log()))
}

/// An ima-ng entry's template data (d-ng "sha256:\0" + digest, n-ng path + NUL; each field
/// a u32 little-endian length first) and what IMA extends PCR 10 with: its SHA-256.
fn ima_ng_template_digest(path: &str, file_sha256: [u8; 32]) -> [u8; 32] {
    let mut d_ng = b"sha256:\0".to_vec();
    d_ng.extend(file_sha256);
    let mut n_ng = path.as_bytes().to_vec();
    n_ng.push(0);
    let mut data = Vec::new();
    for field in [d_ng, n_ng] {
        data.extend((field.len() as u32).to_le_bytes());
        data.extend(field);
    }
    Sha256::digest(&data).into()
}

fn synthetic_ima() -> Vec<[u8; 32]> {
    (0..5u8)
        .map(|i| {
            let file = Sha256::digest([i; 100]).into();
            ima_ng_template_digest(&format!("/usr/bin/tool{i}"), file)
        })
        .collect()
}

fn replay(extends: &[[u8; 32]]) -> [u8; 32] {
    extends.iter().fold([0u8; 32], |pcr, e| {
        let mut h = Sha256::new();
        h.update(pcr);
        h.update(e);
        h.finalize().into()
    })
}

#[test]
fn ek_certificate_in_nv_is_the_one_the_ca_issued_for_this_ek() {
    let t = SwTpm::start();
    let mut tpm = open(&t);
    let ek = tpm.ek().unwrap();
    let cert = ek
        .certificate
        .expect("swtpm_setup wrote an RSA-2048 EK certificate");
    // The NV copy, padding cut, is byte for byte the certificate swtpm_localca issued.
    let issued = std::fs::read(manufactured().ek_cert_file()).unwrap();
    assert_eq!(cert, issued);
    let ek_public = EkPublic::parse(&ek.public).unwrap();
    assert_eq!(ek_public.modulus().len(), 256);
    // The same EK again (deterministic template): same TPMT_PUBLIC.
    drop(tpm);
    assert_eq!(open(&t).ek().unwrap().public, ek.public);
}

#[test]
fn quote_binds_the_statement_and_the_pcrs() {
    let t = SwTpm::start();
    let mut tpm = open(&t);
    let ak = tpm.load_or_create_ak(&t.dir.join("ak.json")).unwrap();
    assert_eq!(ak.source, AkSource::Created);
    let ak_public = AkPublic::parse(&ak.public).unwrap();
    assert_eq!(ak_public.name(), ak.name, "Name(AK) computed = the TPM's");

    let extends = synthetic_ima();
    for e in &extends {
        tpm.extend_pcr(10, *e).unwrap();
    }
    let statement = br#"{"statement":"rack-test epoch 7"}"#;
    let nonce: [u8; 32] = Sha256::digest(statement).into();
    let quote = tpm.quote(&nonce, &PCRS).unwrap();
    assert_eq!(
        quote.pcr_values[&10],
        replay(&extends),
        "PCR 10 = IMA replay"
    );

    let values = PcrValues::from(quote.pcr_values.clone());
    let info = verify_quote(&ak_public, &quote.attest, &quote.signature, &nonce, &values)
        .unwrap_or_else(|e| panic!("a fresh quote is refused: {e}"));
    assert_eq!(info.selection.indices(), PCRS.to_vec());

    // Replayed onto another statement: refused.
    let other: [u8; 32] = Sha256::digest(b"another statement").into();
    let e = verify_quote(&ak_public, &quote.attest, &quote.signature, &other, &values).unwrap_err();
    assert!(matches!(e, QuoteError::ExtraDataMismatch { .. }), "{e}");

    // A PCR value changed after quoting (a hidden measurement): refused.
    let mut changed = quote.pcr_values.clone();
    changed.insert(10, replay(&extends[..4]));
    let e = verify_quote(
        &ak_public,
        &quote.attest,
        &quote.signature,
        &nonce,
        &PcrValues::from(changed),
    )
    .unwrap_err();
    assert!(matches!(e, QuoteError::PcrDigestMismatch { .. }), "{e}");

    // One flipped byte in what the TPM signed: refused.
    let mut forged = quote.attest.clone();
    let last = forged.len() - 1;
    forged[last] ^= 1;
    assert!(verify_quote(&ak_public, &forged, &quote.signature, &nonce, &values).is_err());
}

#[test]
fn quote_time_on_swtpm() {
    let t = SwTpm::start();
    let mut tpm = open(&t);
    tpm.load_or_create_ak(&t.dir.join("ak.json")).unwrap();
    let mut ms: Vec<f64> = (0..10u8)
        .map(|i| {
            let t0 = Instant::now();
            tpm.quote(&[i; 32], &PCRS).unwrap();
            t0.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    println!(
        "RW_REPORT tpm: quote {:.1} ms on swtpm (median of 10; min {:.1}, max {:.1}; PCR read + quote)",
        ms[5], ms[0], ms[9]
    );
}

#[test]
fn ak_persists_across_daemon_restarts() {
    let t = SwTpm::start();
    let path = t.dir.join("ak.json");
    let first = {
        let mut tpm = open(&t);
        tpm.load_or_create_ak(&path).unwrap()
        // Dropped here: its EK and AK are flushed (swtpm has no resource manager).
    };
    assert_eq!(first.source, AkSource::Created);
    let mut tpm = open(&t);
    let again = tpm.load_or_create_ak(&path).unwrap();
    assert_eq!(again.source, AkSource::Loaded);
    assert_eq!(again.name, first.name);
    assert_eq!(again.public, first.public);
    // And it still signs: a quote verifies against the AK enrolled the first time.
    let q = tpm.quote(&[7; 32], &PCRS).unwrap();
    let ak = AkPublic::parse(&first.public).unwrap();
    verify_quote(&ak, &q.attest, &q.signature, &[7; 32], &q.pcr_values.into()).unwrap();
}

#[test]
fn ak_of_another_tpm_is_replaced_not_used() {
    let t = SwTpm::start();
    let path = t.dir.join("ak.json");
    let first = open(&t).load_or_create_ak(&path).unwrap();
    // Another TPM (another EK seed) cannot load this AK: it makes and stores its own.
    let other = rackwarden_tests::tpm::Manufactured::new("other-ek");
    let t2 = SwTpm::start_from(&other);
    let replaced = open(&t2).load_or_create_ak(&path).unwrap();
    assert!(
        matches!(replaced.source, AkSource::Replaced { .. }),
        "{:?}",
        replaced.source
    );
    assert_ne!(replaced.name, first.name);
}

#[test]
fn no_tpm_is_root_of_trust_none_naming_the_device() {
    let dir = std::env::temp_dir().join(format!("rwt-notpm-{}", std::process::id()));
    let (root, tpm) = open_root_of_trust("device:/nonexistent", &dir.join("ak.json"));
    assert!(tpm.is_none());
    let RootOfTrust::None { reason } = &root else {
        panic!("{root:?}")
    };
    assert!(reason.contains("/nonexistent"), "{reason}");
    let json = serde_json::to_value(&root).unwrap();
    assert_eq!(json["level"], "none");
    assert!(!dir.exists(), "no AK file is made without a TPM");

    // A TCTI nothing listens on: none, naming the TCTI.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcti = format!("swtpm:host=127.0.0.1,port={port}");
    let e = Tpm::open(&tcti).unwrap_err();
    assert!(matches!(e, TpmError::Open { .. }), "{e}");
    assert!(e.to_string().contains(&tcti), "{e}");
}

#[test]
fn root_of_trust_on_swtpm_is_tpm() {
    let t = SwTpm::start();
    let (root, tpm) = open_root_of_trust(&t.tcti, &t.dir.join("ak.json"));
    assert!(tpm.is_some(), "{root:?}");
    let RootOfTrust::Tpm {
        vendor,
        ek_certificate,
        ak_name,
        ..
    } = &root
    else {
        panic!("{root:?}")
    };
    assert!(*ek_certificate);
    assert!(vendor.contains("SW"), "swtpm's vendor string: {vendor:?}");
    assert_eq!(ak_name.len(), 68, "hex of 0x000b || SHA-256");
}
