//! The parsers of what a host sends about its TPM (the quote's TPMS_ATTEST and TPMT_SIGNATURE,
//! the AK's and EK's TPMT_PUBLIC, the PCR selection, the EK certificate, the firmware event
//! log, the IMA list, the sidecar that carries them) under property tests, as the envelope
//! parser is: any bytes, and valid inputs truncated or with one byte or one 32-bit field
//! changed, either parse or return their typed error, and never panic. Where the input is
//! signed, a changed byte never verifies.

// Test code: a panic here is a failed test, so unwrap and expect are fine in helpers too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use p256::ecdsa::{Signature, SigningKey, signature::Signer};
use proptest::prelude::*;
use rackwarden_attest::tpm::{
    AkPublic, EkPublic, ImaEntry, PcrSelection, PcrValues, QuoteInfo, TpmSidecar,
    encode_ima_binary,
    eventlog::{
        BankSize, EV_EFI_ACTION, EV_EVENT_TAG, EV_NO_ACTION, EV_SEPARATOR, EventLog, LogEvent,
        SpecId, TPM_ALG_SHA1, TPM_ALG_SHA256,
    },
    make_credential, parse_attest, parse_ima_binary,
    quote::{encode_signature, parse_signature, verify_quote},
    replay_pcr10, replay_prefix, verify_ek_certificate,
};

const EK_CERT: &[u8] = include_bytes!("../src/tpm/testdata/swtpm-ek-rsa2048.der");
const EK_ECC_CERT: &[u8] = include_bytes!("../src/tpm/testdata/swtpm-ek-secp384r1.der");
const ROOT: &[u8] = include_bytes!("../src/tpm/testdata/swtpm-rootca.pem");
const ISSUER: &[u8] = include_bytes!("../src/tpm/testdata/swtpm-issuer.pem");
const EK_MODULUS_HEX: &str = include_str!("../src/tpm/testdata/swtpm-ek-rsa2048.modulus.hex");
/// After every fixture's notBefore.
const NOW: u64 = 1_796_500_000;

fn ek() -> EkPublic {
    EkPublic::from_modulus(&hex::decode(EK_MODULUS_HEX.trim()).unwrap()).unwrap()
}

/// A signed quote and everything that checks it.
struct Quote {
    ak: AkPublic,
    attest: Vec<u8>,
    signature: Vec<u8>,
    pcrs: PcrValues,
    nonce: Vec<u8>,
}

fn quote() -> Quote {
    let key = SigningKey::from_slice(&[0x42; 32]).unwrap();
    let ak = AkPublic::from_verifying_key(key.verifying_key());
    let mut pcrs = PcrValues::new();
    for i in [0u8, 1, 2, 3, 4, 5, 6, 7, 10] {
        pcrs.insert(i, [i ^ 0x5a; 32]);
    }
    let selection = PcrSelection::from_indices(&pcrs.indices()).unwrap();
    let nonce = vec![0xab; 32];
    let info = QuoteInfo {
        qualified_signer: ak.name(),
        extra_data: nonce.clone(),
        clock: 123_456,
        reset_count: 3,
        restart_count: 1,
        safe: true,
        firmware_version: 0x2021_0101,
        pcr_digest: pcrs.digest(&selection).unwrap(),
        selection,
    };
    let attest = info.to_bytes();
    let sig: Signature = key.sign(&attest);
    let q = Quote {
        ak,
        signature: encode_signature(&sig),
        attest,
        pcrs,
        nonce,
    };
    verify_quote(&q.ak, &q.attest, &q.signature, &q.nonce, &q.pcrs).unwrap();
    q
}

fn event(pcr: u32, event_type: u32, data: &[u8]) -> LogEvent {
    use sha2::Digest;
    LogEvent {
        offset: 0,
        pcr,
        event_type,
        digests: vec![
            (TPM_ALG_SHA1, vec![0x11; 20]),
            (TPM_ALG_SHA256, sha2::Sha256::digest(data).to_vec()),
        ],
        data: data.to_vec(),
    }
}

/// A crypto-agile log with both banks, a tagged event and a StartupLocality event.
fn event_log() -> Vec<u8> {
    let mut tag = 0x8f3b_22ecu32.to_le_bytes().to_vec();
    tag.extend(13u32.to_le_bytes());
    tag.extend(b"Linux initrd\0");
    let mut locality = b"StartupLocality\0".to_vec();
    locality.push(3);
    let log = EventLog {
        spec_id: SpecId {
            platform_class: 0,
            spec_version: (2, 0),
            spec_errata: 0,
            uintn_size: 2,
            banks: vec![
                BankSize {
                    alg: TPM_ALG_SHA1,
                    digest_size: 20,
                },
                BankSize {
                    alg: TPM_ALG_SHA256,
                    digest_size: 32,
                },
            ],
            vendor_info: vec![1, 2, 3],
        },
        events: vec![
            event(0, EV_NO_ACTION, &locality),
            event(0, 0x8000_0008, &[1; 16]),
            event(
                4,
                EV_EFI_ACTION,
                b"Calling EFI Application from Boot Option",
            ),
            event(9, EV_EVENT_TAG, &tag),
            event(7, EV_SEPARATOR, &[0; 4]),
        ],
    };
    let bytes = log.to_bytes();
    EventLog::parse(&bytes).unwrap();
    bytes
}

fn ima_list() -> Vec<u8> {
    let entries = vec![
        ImaEntry::ima_ng("boot_aggregate", [0x11; 32]),
        ImaEntry::ima_ng("/usr/bin/rackwarden", [0x22; 32]),
        ImaEntry::violation("/etc/passwd"),
    ];
    let bytes = encode_ima_binary(&entries);
    assert_eq!(parse_ima_binary(&bytes).unwrap(), entries);
    bytes
}

/// Every parser of host bytes on `bytes`, and what a caller then does with a parse that
/// succeeds; an error's text is rendered too (it goes into findings). Nothing may panic.
fn parse_everything(bytes: &[u8]) {
    match parse_attest(bytes) {
        Ok(info) => {
            let _ = info.selection.indices();
            let _ = info.to_bytes();
        }
        Err(e) => drop(e.to_string()),
    }
    if let Err(e) = parse_signature(bytes) {
        drop(e.to_string());
    }
    match AkPublic::parse(bytes) {
        Ok(ak) => drop(ak.name()),
        Err(e) => drop(e.to_string()),
    }
    match EkPublic::parse(bytes) {
        Ok(ek) => {
            let _ = (ek.name(), ek.exponent());
        }
        Err(e) => drop(e.to_string()),
    }
    match PcrSelection::parse(bytes) {
        Ok(s) => drop(s.to_bytes()),
        Err(e) => drop(e.to_string()),
    }
    match EventLog::parse(bytes) {
        Ok(log) => {
            let _ = log.replay_sha256().map_err(|e| e.to_string());
            for e in &log.events {
                let _ = (e.describe(), e.tagged(), e.sha256());
            }
            let _ = log.to_bytes();
        }
        Err(e) => drop(e.to_string()),
    }
    match parse_ima_binary(bytes) {
        Ok(entries) => {
            let pcr = replay_pcr10([0; 32], &entries);
            let _ = replay_prefix([0; 32], &entries, &pcr);
            let _ = encode_ima_binary(&entries);
        }
        Err(e) => drop(e.to_string()),
    }
    if let Err(e) = verify_ek_certificate(bytes, &ek(), ROOT, ISSUER, NOW) {
        drop(e.to_string());
    }
}

/// `bytes` with `at` (an index into it) set to `to`.
fn with_byte(bytes: &[u8], at: prop::sample::Index, to: u8) -> (Vec<u8>, bool) {
    let mut out = bytes.to_vec();
    let i = at.index(out.len());
    let changed = out[i] != to;
    out[i] = to;
    (out, changed)
}

/// `bytes` with the 4 bytes from `at` (clamped to fit) set to `word`, big-endian: a length or
/// count field made huge, zero or anything between.
fn with_word(bytes: &[u8], at: prop::sample::Index, word: u32) -> Vec<u8> {
    let mut out = bytes.to_vec();
    if out.len() >= 4 {
        let i = at.index(out.len() - 3);
        out[i..i + 4].copy_from_slice(&word.to_be_bytes());
    }
    out
}

/// `default` cases, or `PROPTEST_CASES` when set (a long fuzzing run:
/// `PROPTEST_CASES=100000 cargo test -p rackwarden-attest --test tpm_parsers`).
fn cases(default: u32) -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = default;
    }
    config
}

/// Interesting 32-bit values for length fields: around zero, around the sizes of the
/// structures, and the largest.
fn word() -> impl Strategy<Value = u32> {
    prop_oneof![
        0u32..600,
        Just(u32::MAX),
        Just(u32::MAX - 1),
        Just(0x8000_0000),
        Just(0xffff),
        Just(0x1_0000),
        any::<u32>(),
    ]
}

#[test]
fn the_samples_parse() {
    let q = quote();
    parse_everything(&q.attest);
    parse_everything(&q.signature);
    parse_everything(q.ak.bytes());
    parse_everything(ek().bytes());
    parse_everything(&event_log());
    parse_everything(&ima_list());
    verify_ek_certificate(EK_CERT, &ek(), ROOT, ISSUER, NOW).unwrap();
    assert!(verify_ek_certificate(EK_ECC_CERT, &ek(), ROOT, ISSUER, NOW).is_err());
}

/// Lengths that claim more than is there are refused before anything is allocated.
#[test]
fn huge_claimed_lengths_are_errors_not_allocations() {
    // An event log whose Spec ID event says 4 GiB.
    let mut log = event_log();
    log[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(EventLog::parse(&log).is_err());
    // ... whose Spec ID event lists a billion banks.
    let mut log = event_log();
    log[56..60].copy_from_slice(&1_000_000_000u32.to_le_bytes());
    assert!(EventLog::parse(&log).is_err());
    // An IMA entry whose template data says 4 GiB.
    let mut ima = ima_list();
    let data_len_at = 4 + 20 + 4 + "ima-ng".len();
    ima[data_len_at..data_len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(parse_ima_binary(&ima).is_err());
}

proptest! {
    #![proptest_config(cases(256))]

    #[test]
    fn any_bytes_parse_or_are_refused(bytes in prop::collection::vec(any::<u8>(), 0..1024)) {
        parse_everything(&bytes);
    }

    /// Random bytes behind a valid prefix reach deeper than random bytes alone.
    #[test]
    fn valid_prefixes_with_random_tails(
        which in 0usize..6,
        cut in any::<prop::sample::Index>(),
        tail in prop::collection::vec(any::<u8>(), 0..300),
    ) {
        let q = quote();
        let sample = match which {
            0 => q.attest,
            1 => q.signature,
            2 => q.ak.bytes().to_vec(),
            3 => ek().bytes().to_vec(),
            4 => event_log(),
            _ => ima_list(),
        };
        let mut bytes = sample[..cut.index(sample.len() + 1)].to_vec();
        bytes.extend(tail);
        parse_everything(&bytes);
    }
}

proptest! {
    #![proptest_config(cases(128))]

    #[test]
    fn quotes_truncated_or_changed_never_verify(
        cut in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
        word in word(),
    ) {
        let q = quote();
        let truncated = &q.attest[..cut.index(q.attest.len())];
        prop_assert!(parse_attest(truncated).is_err());
        prop_assert!(verify_quote(&q.ak, truncated, &q.signature, &q.nonce, &q.pcrs).is_err());
        parse_everything(truncated);
        let (changed, differs) = with_byte(&q.attest, at, to);
        parse_everything(&changed);
        if differs {
            prop_assert!(verify_quote(&q.ak, &changed, &q.signature, &q.nonce, &q.pcrs).is_err());
        }
        let changed = with_word(&q.attest, at, word);
        parse_everything(&changed);
        if changed != q.attest {
            prop_assert!(verify_quote(&q.ak, &changed, &q.signature, &q.nonce, &q.pcrs).is_err());
        }
        let (sig, differs) = with_byte(&q.signature, at, to);
        parse_everything(&sig);
        if differs {
            prop_assert!(verify_quote(&q.ak, &q.attest, &sig, &q.nonce, &q.pcrs).is_err());
        }
        let truncated = &q.signature[..cut.index(q.signature.len())];
        prop_assert!(parse_signature(truncated).is_err());
    }

    #[test]
    fn public_areas_truncated_or_changed_parse_or_are_refused(
        cut in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
        word in word(),
    ) {
        let ak = quote().ak.bytes().to_vec();
        let ek = ek().bytes().to_vec();
        let selection = PcrSelection::from_indices(&[0, 7, 10, 23]).unwrap().to_bytes();
        for sample in [&ak, &ek, &selection] {
            let truncated = &sample[..cut.index(sample.len())];
            prop_assert!(AkPublic::parse(truncated).is_err());
            prop_assert!(EkPublic::parse(truncated).is_err());
            prop_assert!(PcrSelection::parse(truncated).is_err());
            parse_everything(truncated);
            parse_everything(&with_byte(sample, at, to).0);
            parse_everything(&with_word(sample, at, word));
        }
        // A changed AK is another key, or no AK: never the same Name.
        let (changed, differs) = with_byte(&ak, at, to);
        if differs && let Ok(other) = AkPublic::parse(&changed) {
            prop_assert_ne!(other.name(), quote().ak.name());
        }
    }

    #[test]
    fn ek_certificates_truncated_or_changed_never_verify(
        cut in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
        word in word(),
    ) {
        let ek = ek();
        let truncated = &EK_CERT[..cut.index(EK_CERT.len())];
        prop_assert!(verify_ek_certificate(truncated, &ek, ROOT, ISSUER, NOW).is_err());
        let (changed, differs) = with_byte(EK_CERT, at, to);
        let verdict = verify_ek_certificate(&changed, &ek, ROOT, ISSUER, NOW);
        if differs {
            prop_assert!(verdict.is_err(), "byte {} changed to {:#04x} still verifies", at.index(EK_CERT.len()), to);
        }
        let changed = with_word(EK_CERT, at, word);
        let verdict = verify_ek_certificate(&changed, &ek, ROOT, ISSUER, NOW);
        if changed.as_slice() != EK_CERT {
            prop_assert!(verdict.is_err());
        }
        // The EK's own fields changed: no longer the certificate's key (or no EK at all).
        let (ek_bytes, differs) = with_byte(ek.bytes(), at, to);
        if differs && let Ok(other) = EkPublic::parse(&ek_bytes) {
            let v = verify_ek_certificate(EK_CERT, &other, ROOT, ISSUER, NOW);
            prop_assert!(v.is_ok() == (other.public_key() == ek.public_key()));
        }
    }

    /// The configured roots and intermediates are PEM; none of it may panic the verifier,
    /// whatever an operator pastes.
    #[test]
    fn pem_bundles_parse_or_are_refused(
        body in "[A-Za-z0-9+/=\n -]{0,200}",
        cut in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
    ) {
        let ek = ek();
        let pem = format!("-----BEGIN CERTIFICATE-----\n{body}\n-----END CERTIFICATE-----\n");
        let _ = verify_ek_certificate(EK_CERT, &ek, pem.as_bytes(), ISSUER, NOW);
        let _ = verify_ek_certificate(EK_CERT, &ek, ROOT, pem.as_bytes(), NOW);
        let _ = verify_ek_certificate(EK_CERT, &ek, body.as_bytes(), b"", NOW);
        let truncated = &ROOT[..cut.index(ROOT.len())];
        let _ = verify_ek_certificate(EK_CERT, &ek, truncated, ISSUER, NOW);
        let (changed, _) = with_byte(ISSUER, at, to);
        let _ = verify_ek_certificate(EK_CERT, &ek, ROOT, &changed, NOW);
    }

    #[test]
    fn event_logs_truncated_or_changed_parse_or_are_refused(
        cut in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
        word in word(),
    ) {
        let log = event_log();
        parse_everything(&log[..cut.index(log.len())]);
        parse_everything(&with_byte(&log, at, to).0);
        parse_everything(&with_word(&log, at, word));
        // Little-endian lengths too.
        parse_everything(&with_word(&log, at, word.swap_bytes()));
    }

    #[test]
    fn ima_lists_truncated_or_changed_parse_or_are_refused(
        cut in any::<prop::sample::Index>(),
        at in any::<prop::sample::Index>(),
        to in any::<u8>(),
        word in word(),
    ) {
        let list = ima_list();
        parse_everything(&list[..cut.index(list.len())]);
        let (changed, differs) = with_byte(&list, at, to);
        parse_everything(&changed);
        // A changed list replays to another PCR 10, or does not parse.
        if differs && let Ok(entries) = parse_ima_binary(&changed) {
            let original = parse_ima_binary(&list).unwrap();
            prop_assert!(entries != original);
        }
        parse_everything(&with_word(&list, at, word));
        parse_everything(&with_word(&list, at, word.swap_bytes()));
    }

    /// The sidecar's text fields as a host may fill them.
    #[test]
    fn sidecars_decode_or_are_refused(
        quote_hex in "[0-9a-fA-F]{0,80}|.{0,20}",
        signature_hex in "[0-9a-f]{0,40}|.{0,10}",
        pcrs in prop::collection::btree_map(any::<u8>(), "[0-9a-f]{60,68}|.{0,8}", 0..4),
        ima in prop::option::of((any::<u64>(), "[A-Za-z0-9+/=]{0,120}|.{0,20}")),
        boot in prop::option::of(("[A-Za-z0-9+/=]{0,200}|.{0,20}", ".{0,40}")),
    ) {
        let sidecar = TpmSidecar {
            quote: quote_hex,
            signature: signature_hex,
            pcrs: pcrs.into_iter().collect::<BTreeMap<u8, String>>(),
            ima: ima.map(|(offset, entries)| rackwarden_attest::tpm::ImaDelta { offset, entries }),
            boot: boot.map(|(log, cmdline)| rackwarden_attest::tpm::BootEvidence { log, cmdline }),
        };
        match sidecar.decode() {
            Ok(d) => {
                parse_everything(&d.quote);
                parse_everything(&d.signature);
            }
            Err(e) => drop(e.to_string()),
        }
    }
}

proptest! {
    #![proptest_config(cases(16))]

    /// MakeCredential takes the AK's Name and the credential from the enrolment request:
    /// any of them is wrapped or refused.
    #[test]
    fn make_credential_wraps_or_refuses(
        name in prop::collection::vec(any::<u8>(), 0..80),
        credential in prop::collection::vec(any::<u8>(), 0..80),
    ) {
        let ek = ek();
        if let Err(e) = make_credential(&ek, &name, &credential) {
            drop(e.to_string());
        }
        let mut sha256_name = vec![0x00, 0x0b];
        sha256_name.extend(&name[..name.len().min(32)]);
        sha256_name.resize(34, 0);
        let r = make_credential(&ek, &sha256_name, &credential);
        prop_assert_eq!(r.is_ok(), credential.len() <= 32);
    }
}
