//! The daemon's TPM side (`rackwarden::tpm`) against a real software TPM (swtpm), checked by
//! the verifier's pure-Rust side (`rackwarden_attest::tpm`): what a host sends is what the
//! verifier accepts, and what it must refuse is refused. Root is not needed.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use rackwarden::tpm::{
    AkSource, RootOfTrust, Tpm, TpmError, Tss2ResponseCodeKind, open_root_of_trust,
};
use rackwarden_attest::tpm::{
    AkPublic, EkCertError, EkPublic, ImaEntry, PcrValues, QuoteError, encode_ima_binary,
    make_credential, parse_ima_binary, replay_pcr10, replay_prefix, verify_ek_certificate,
    verify_quote,
};
use rackwarden_tests::tpm::{Manufactured, SwTpm, manufactured};
use sha2::{Digest, Sha256};

/// PCRs a statement quotes: the firmware's 0-7 and IMA's 10.
const PCRS: [u8; 9] = [0, 1, 2, 3, 4, 5, 6, 7, 10];

fn open(t: &SwTpm) -> Tpm {
    Tpm::open(&t.tcti).unwrap_or_else(|e| panic!("{e}\nswtpm log:\n{}", t.log()))
}

/// A synthetic IMA list: what the kernel would have measured, as the verifier will read it.
fn synthetic_ima() -> Vec<ImaEntry> {
    (0..5u8)
        .map(|i| {
            ImaEntry::ima_ng(
                &format!("/usr/bin/tool{i}"),
                Sha256::digest([i; 100]).into(),
            )
        })
        .collect()
}

fn now_unix() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// 32 bytes nobody can predict (the verifier's credential is random).
fn random32() -> [u8; 32] {
    let mut b = [0u8; 32];
    let mut f = std::fs::File::open("/dev/urandom").unwrap();
    std::io::Read::read_exact(&mut f, &mut b).unwrap();
    b
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

    // The verifier's check: leaf key = this EK, chained to the swtpm CA's root.
    let root = std::fs::read(&t.ca_root).unwrap();
    let intermediate = std::fs::read(&t.ca_intermediate).unwrap();
    let checked = verify_ek_certificate(&cert, &ek_public, &root, &intermediate, now_unix())
        .unwrap_or_else(|e| panic!("the swtpm EK certificate is refused: {e}"));
    assert_eq!(checked.chain.len(), 2, "{:?}", checked.chain);

    // Another manufacturer's CA (same names, other keys) does not anchor it.
    let other = Manufactured::new("other-ca");
    let other_root = std::fs::read(other.ca_root()).unwrap();
    let other_intermediate = std::fs::read(other.ca_intermediate()).unwrap();
    let e = verify_ek_certificate(
        &cert,
        &ek_public,
        &other_root,
        &other_intermediate,
        now_unix(),
    )
    .unwrap_err();
    assert!(matches!(e, EkCertError::BadSignature { .. }), "{e}");
    // Nor the right intermediate under another root.
    let e = verify_ek_certificate(&cert, &ek_public, &other_root, &intermediate, now_unix())
        .unwrap_err();
    assert!(matches!(e, EkCertError::BadSignature { .. }), "{e}");
    // Nor does the right CA vouch for another TPM's EK.
    let t2 = SwTpm::start_from(&other);
    let other_ek = EkPublic::parse(&open(&t2).ek().unwrap().public).unwrap();
    let e = verify_ek_certificate(&cert, &other_ek, &root, &intermediate, now_unix()).unwrap_err();
    assert!(matches!(e, EkCertError::KeyMismatch), "{e}");

    // The same EK again (deterministic template): same TPMT_PUBLIC.
    drop(tpm);
    assert_eq!(open(&t).ek().unwrap().public, ek.public);
}

#[test]
fn credential_activates_only_for_the_ak_it_was_made_for() {
    let t = SwTpm::start();
    let mut tpm = open(&t);
    let ek = EkPublic::parse(&tpm.ek().unwrap().public).unwrap();
    let ak = tpm.load_or_create_ak(&t.dir.join("ak.json")).unwrap();

    // Several rounds: sessions and handles are flushed each time (swtpm has a few slots).
    for _ in 0..4 {
        let secret = random32();
        let ch = make_credential(&ek, &ak.name, &secret).unwrap();
        let got = tpm
            .activate_credential(&ch.id_object, &ch.encrypted_secret)
            .unwrap_or_else(|e| panic!("activation refused: {e}"));
        assert_eq!(got, secret);
    }

    // Made for another AK's Name: the TPM's integrity check fails, nothing is released.
    let mut other_name = ak.name.clone();
    let last = other_name.len() - 1;
    other_name[last] ^= 0x01;
    let ch = make_credential(&ek, &other_name, &random32()).unwrap();
    let e = tpm
        .activate_credential(&ch.id_object, &ch.encrypted_secret)
        .unwrap_err();
    assert_eq!(
        e.response_code(),
        Some(Tss2ResponseCodeKind::Integrity),
        "{e}"
    );
    assert!(e.to_string().contains("TPM2_ActivateCredential"), "{e}");

    // A tampered blob is refused the same way; and the TPM still works afterwards.
    let secret = random32();
    let mut ch = make_credential(&ek, &ak.name, &secret).unwrap();
    let last = ch.id_object.len() - 1;
    ch.id_object[last] ^= 0x80;
    assert!(
        tpm.activate_credential(&ch.id_object, &ch.encrypted_secret)
            .is_err()
    );
    let ch = make_credential(&ek, &ak.name, &secret).unwrap();
    assert_eq!(
        tpm.activate_credential(&ch.id_object, &ch.encrypted_secret)
            .unwrap(),
        secret
    );
}

#[test]
fn quote_binds_the_statement_and_the_pcrs() {
    let t = SwTpm::start();
    let mut tpm = open(&t);
    let ak = tpm.load_or_create_ak(&t.dir.join("ak.json")).unwrap();
    assert_eq!(ak.source, AkSource::Created);
    let ak_public = AkPublic::parse(&ak.public).unwrap();
    assert_eq!(ak_public.name(), ak.name, "Name(AK) computed = the TPM's");

    let entries = synthetic_ima();
    for e in &entries {
        tpm.extend_pcr(10, e.sha256_bank_extend_value()).unwrap();
    }
    let statement = br#"{"statement":"rack-test epoch 7"}"#;
    let nonce: [u8; 32] = Sha256::digest(statement).into();
    let quote = tpm.quote(&nonce, &PCRS).unwrap();
    assert_eq!(
        quote.pcr_values[&10],
        replay_pcr10([0; 32], &entries),
        "PCR 10 = IMA replay"
    );
    // What the verifier does with the list it is sent: parse, and replay up to the quote.
    let list = parse_ima_binary(&encode_ima_binary(&entries)).unwrap();
    assert_eq!(
        replay_prefix([0; 32], &list, &quote.pcr_values[&10]),
        Some(5)
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
    changed.insert(10, replay_pcr10([0; 32], &entries[..4]));
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

fn ms_since(t0: Instant) -> f64 {
    t0.elapsed().as_secs_f64() * 1e3
}

#[test]
fn quote_time_on_swtpm() {
    let t = SwTpm::start();
    let t0 = Instant::now();
    let mut tpm = open(&t);
    let ek = EkPublic::parse(&tpm.ek().unwrap().public).unwrap();
    let start_ms = ms_since(t0);
    let t0 = Instant::now();
    let ak = tpm.load_or_create_ak(&t.dir.join("ak.json")).unwrap();
    let ak_ms = ms_since(t0);
    let mut ms: Vec<f64> = (0..10u8)
        .map(|i| {
            let t0 = Instant::now();
            tpm.quote(&[i; 32], &PCRS).unwrap();
            ms_since(t0)
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    let secret = random32();
    let ch = make_credential(&ek, &ak.name, &secret).unwrap();
    let t0 = Instant::now();
    assert_eq!(
        tpm.activate_credential(&ch.id_object, &ch.encrypted_secret)
            .unwrap(),
        secret
    );
    let activate_ms = ms_since(t0);
    println!(
        "RW_REPORT tpm: quote {:.1} ms on swtpm (median of 10; min {:.1}, max {:.1}; PCR read + quote of 9 PCRs)",
        ms[5], ms[0], ms[9]
    );
    println!(
        "RW_REPORT tpm: open + EK {start_ms:.0} ms, AK create {ak_ms:.0} ms, ActivateCredential {activate_ms:.1} ms on swtpm"
    );
}

/// Misuse is refused before the TPM sees it, naming what was wrong.
#[test]
fn misuse_is_refused_with_typed_errors() {
    let t = SwTpm::start();
    let mut tpm = open(&t);
    assert!(matches!(tpm.quote(&[0; 32], &PCRS), Err(TpmError::NoAk)));
    assert!(matches!(
        tpm.activate_credential(&[0; 10], &[0; 10]),
        Err(TpmError::NoAk)
    ));
    assert!(matches!(
        tpm.extend_pcr(24, [0; 32]),
        Err(TpmError::PcrOutOfRange { pcr: 24 })
    ));
    tpm.load_or_create_ak(&t.dir.join("ak.json")).unwrap();
    assert!(matches!(
        tpm.quote(&[0; 65], &PCRS),
        Err(TpmError::ExtraDataTooLong { len: 65 })
    ));
    assert!(matches!(tpm.quote(&[0; 32], &[]), Err(TpmError::NoPcrs)));
    assert!(matches!(
        tpm.activate_credential(&[0; 20], &[0; 256]),
        Err(TpmError::Command { .. })
    ));
    // An AK file that is not ours is an error naming the file, not silently a new AK.
    let bad = t.dir.join("bad-ak.json");
    std::fs::write(&bad, "{}").unwrap();
    let e = tpm.load_or_create_ak(&bad).unwrap_err();
    assert!(matches!(e, TpmError::AkFileFormat { .. }), "{e}");
    assert_eq!(std::fs::read_to_string(&bad).unwrap(), "{}");
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
    let other = Manufactured::new("other-ek");
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
    let (root, tpm) = open_root_of_trust(
        "device:/nonexistent",
        &dir.join("ak.json"),
        &dir.join("ima"),
    );
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
    let (root, tpm) = open_root_of_trust(&t.tcti, &t.dir.join("ak.json"), &t.dir.join("no-ima"));
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
