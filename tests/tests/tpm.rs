//! The daemon's TPM side (`rackwarden::tpm`) against a real software TPM (swtpm), checked by
//! the verifier's pure-Rust side (`rackwarden_attest::tpm`): what a host sends is what the
//! verifier accepts, and what it must refuse is refused; and statements made through the
//! daemon's signing path carry quotes the verifier's checks accept. Root is not needed.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rackwarden::{
    epoch::{
        AkEnrolment,
        statement::{self, AttestedLog},
        tpm_enroll::{self, Enrolment, TpmEnrolment},
    },
    tpm::{
        AkSource, Attestor, RootOfTrust, Tpm, TpmError, Tss2ResponseCodeKind, open_root_of_trust,
    },
};
use rackwarden_attest::tpm::{
    AkPublic, EkCertError, EkPublic, ImaEntry, PcrValues, QuoteError, encode_ima_binary,
    make_credential, parse_ima_binary, replay_pcr10, replay_prefix, verify_ek_certificate,
    verify_quote,
};
use rackwarden_attest::{
    api::{IngestItem, IngestStatus, ReceivedResponse},
    dsse::{self, Envelope},
    evidence_log::EvidenceLog,
    statement::{Challenge, Statement},
};
use rackwarden_tests::tpm::{Manufactured, SwTpm, TpmVerifier, manufactured};
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

    // A TCTI nothing listens on: said in words before libtss2 is asked, naming the TCTI and
    // the address.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let tcti = format!("swtpm:host=127.0.0.1,port={port}");
    let e = Tpm::open(&tcti).unwrap_err();
    assert!(matches!(e, TpmError::SocketUnreachable { .. }), "{e}");
    assert!(
        e.to_string().contains(&tcti) && e.to_string().contains(&format!("127.0.0.1:{port}")),
        "{e}"
    );
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

// ---------------------------------------------------------------------------------------
// Statements made through the daemon's signing path (`epoch::statement::sign_and_append`)
// with a swtpm behind `[tpm]`: each carries a quote over its chain digest and the IMA
// entries the quote covers. IMA is simulated: the test writes the binary list to a file that
// `[tpm] ima_list` names and extends PCR 10 through the TPM, as the kernel does (list first,
// then the PCR).

/// A host's state dir, config, key and evidence log, its TPM opened as the daemon opens it.
struct QuotedHost {
    dir: std::path::PathBuf,
    cfg: rackwarden::config::Config,
    key: ed25519_dalek::SigningKey,
    log: AttestedLog,
    attestor: Attestor,
    ima_list: std::path::PathBuf,
    /// Every entry written to the list so far.
    measured: Vec<ImaEntry>,
    /// Made once, as the daemon does at start (it hashes the running executable).
    producer: rackwarden_attest::evidence::ProducerIdentity,
}

/// A config with `[tpm]` as given (its `ima_list` in the host's dir).
fn host_config(dir: &std::path::Path, tpm: &str) -> rackwarden::config::Config {
    let path = dir.join("rackwarden.toml");
    let text = format!(
        r#"rack_id = "rack-a"
host_id = "h1"
host_share = 1.0
interfaces = ["eth0"]
state_dir = "{state}"
pin_root = "/sys/fs/bpf/rwt-tpm-none"

[cap]
egress = "10 MB/s"
ingress = "10 MB/s"
burst = "256 KiB"

[tpm]
ima_list = "{ima}"
event_log = "{event_log}"
{tpm}
"#,
        state = dir.display(),
        ima = dir.join("ima.bin").display(),
        event_log = dir.join("swtpm-has-no-event-log").display(),
    );
    std::fs::write(&path, &text).unwrap();
    rackwarden::config::Config::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn host_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("rwt-tpm-host-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl QuotedHost {
    /// A host whose `[tpm]` names `t`; the boot aggregate is measured before the daemon starts.
    fn start(tag: &str, t: &SwTpm) -> QuotedHost {
        let dir = host_dir(tag);
        let cfg = host_config(&dir, &format!("mode = \"required\"\ntcti = \"{}\"", t.tcti));
        let ima_list = cfg.tpm.ima_list.clone();
        std::fs::write(&ima_list, b"").unwrap();
        let key = rackwarden_attest::keys::generate();
        let attestor = Attestor::open(&cfg.tpm, &cfg.state_paths().tpm_ak(), &cfg.path)
            .unwrap_or_else(|e| panic!("{e}\nswtpm log:\n{}", t.log()));
        let log =
            EvidenceLog::open(&cfg.state_paths().evidence_log(), &key.verifying_key()).unwrap();
        let mut h = QuotedHost {
            log: AttestedLog::new(log, attestor.clone()),
            dir,
            cfg,
            key,
            attestor,
            ima_list,
            measured: vec![],
            producer: rackwarden::host_evidence::producer("rackwardend"),
        };
        h.measure(&[ImaEntry::ima_ng("boot_aggregate", [0x11; 32])]);
        h
    }

    fn tpm(&self) -> rackwarden::tpm::SharedTpm {
        self.attestor.tpm().expect("a TPM")
    }

    fn ak_public(&self) -> AkPublic {
        let tpm = self.tpm();
        let tpm = tpm.lock().unwrap();
        AkPublic::parse(&tpm.ak_info().expect("an AK").public).unwrap()
    }

    /// IMA's order: the entries go on the list, then into PCR 10.
    fn measure(&mut self, entries: &[ImaEntry]) {
        self.list(entries);
        self.extend(entries);
    }

    /// Only the list: the kernel has not extended PCR 10 for them yet.
    fn list(&mut self, entries: &[ImaEntry]) {
        self.measured.extend_from_slice(entries);
        std::fs::write(&self.ima_list, encode_ima_binary(&self.measured)).unwrap();
    }

    fn extend(&self, entries: &[ImaEntry]) {
        let tpm = self.tpm();
        let mut tpm = tpm.lock().unwrap();
        for e in entries {
            tpm.extend_pcr(10, e.sha256_bank_extend_value()).unwrap();
        }
    }

    /// One statement through the daemon's path; its envelope as the log holds it.
    fn sign(&mut self) -> Envelope {
        self.append();
        last_envelope(&self.cfg)
    }

    fn append(&mut self) {
        statement::sign_and_append(
            &self.cfg,
            &mut self.log,
            &self.key,
            &self.producer,
            bare_evidence(),
            None,
        )
        .unwrap();
    }
}

impl Drop for QuotedHost {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn bare_evidence() -> statement::EpochEvidence {
    statement::EpochEvidence {
        challenge: Challenge::Unchallenged,
        wipe: None,
        images: None,
        incidents: vec![],
        epoch: None,
        storage: Default::default(),
        traffic: None,
        openings: Vec::new(),
    }
}

/// The last line of the host's evidence log, parsed.
fn last_envelope(cfg: &rackwarden::config::Config) -> Envelope {
    let text = std::fs::read_to_string(cfg.state_paths().evidence_log()).unwrap();
    let line = text.lines().last().expect("a statement");
    serde_json::from_str(line).unwrap()
}

/// What the verifier checks of one envelope: the signature, the quote over the chain digest
/// by the AK, and PCR 10 replayed from the shipped entries on top of `pcr10_before`. Returns
/// the statement, the shipped `(offset, entries)` and the quoted PCR 10.
fn check_quoted(
    h: &QuotedHost,
    env: &Envelope,
    pcr10_before: [u8; 32],
) -> (Statement, (u64, Vec<ImaEntry>), [u8; 32]) {
    let verified =
        dsse::verify_envelope(env, &h.key.verifying_key(), dsse::INTOTO_PAYLOAD_TYPE).unwrap();
    // The chain digest is the log's tip: the value the next statement names as `prev`.
    assert_eq!(Some(verified.pae_sha3), h.log.tip.map(|t| t.pae_sha3));
    let st: Statement = serde_json::from_slice(&verified.payload).unwrap();
    assert_eq!(
        st.predicate.root_of_trust.as_ref(),
        Some(h.attestor.root_of_trust())
    );
    let sidecar = env
        .tpm
        .as_ref()
        .expect("a quote beside the envelope")
        .decode()
        .unwrap();
    let info = verify_quote(
        &h.ak_public(),
        &sidecar.quote,
        &sidecar.signature,
        &verified.pae_sha3,
        &sidecar.pcrs,
    )
    .unwrap_or_else(|e| panic!("the statement's quote is refused: {e}"));
    assert_eq!(
        info.selection.indices(),
        rackwarden_attest::tpm::DEFAULT_QUOTE_PCRS.to_vec()
    );
    let quoted10 = *sidecar.pcrs.get(10).expect("PCR 10 quoted");
    let shipped = sidecar.ima.expect("IMA entries shipped");
    assert_eq!(
        replay_pcr10(pcr10_before, &shipped.1),
        quoted10,
        "PCR 10 replays from the shipped entries"
    );
    (st, shipped, quoted10)
}

#[test]
fn statements_carry_a_quote_over_their_chain_digest_and_the_new_ima_entries() {
    let t = SwTpm::start();
    let mut h = QuotedHost::start("quoted", &t);
    h.measure(&[
        ImaEntry::ima_ng("/usr/local/bin/rackwardend", [0xd0; 32]),
        ImaEntry::ima_ng("/usr/lib/libtss2-esys.so.0", [0xd1; 32]),
    ]);

    // The first statement after a start ships the whole list from the boot aggregate.
    let env = h.sign();
    let (st, (offset, entries), pcr10) = check_quoted(&h, &env, [0; 32]);
    assert_eq!(st.predicate.seq, 0);
    assert_eq!(offset, 0);
    assert_eq!(entries, h.measured);
    assert!(matches!(
        st.predicate.root_of_trust,
        Some(RootOfTrust::Tpm { .. })
    ));

    // The next ships only what was measured since, from where the last one stopped.
    let new = [
        ImaEntry::ima_ng("/usr/bin/python3.13", [0xe0; 32]),
        ImaEntry::violation("/var/log/inference.log"),
    ];
    h.measure(&new);
    let env = h.sign();
    let (st, (offset, entries), pcr10_after) = check_quoted(&h, &env, pcr10);
    assert_eq!(st.predicate.seq, 1);
    assert_eq!(offset, 3);
    assert_eq!(entries, new);

    // Nothing measured: an empty stretch at the end, PCR 10 unchanged.
    let env = h.sign();
    let (_, (offset, entries), pcr10_same) = check_quoted(&h, &env, pcr10_after);
    assert_eq!((offset, entries.len()), (5, 0));
    assert_eq!(pcr10_same, pcr10_after);

    // The log with its sidecars reads back as a chain of statements (the daemon's next
    // start; a copy, since this one holds the log's lock).
    let copy = h.dir.join("copy.jsonl");
    std::fs::copy(h.cfg.state_paths().evidence_log(), &copy).unwrap();
    let reopened = EvidenceLog::open(&copy, &h.key.verifying_key()).unwrap();
    assert_eq!(reopened.next_link().0, 3);
    assert_eq!(reopened.tip, h.log.tip);
    assert!(
        reopened.pending_incidents.is_empty(),
        "no line read as damage"
    );
}

#[test]
fn entries_listed_before_their_pcr_extend_wait_for_the_next_statement() {
    let t = SwTpm::start();
    let mut h = QuotedHost::start("race", &t);
    let env = h.sign();
    let (_, (_, entries), pcr10) = check_quoted(&h, &env, [0; 32]);
    assert_eq!(entries.len(), 1, "the boot aggregate");

    // IMA put two entries on the list; the quote ran before it extended PCR 10 with them.
    let pending = [
        ImaEntry::ima_ng("/usr/bin/tool-a", [0xa0; 32]),
        ImaEntry::ima_ng("/usr/bin/tool-b", [0xb0; 32]),
    ];
    h.list(&pending);
    let env = h.sign();
    let (_, (offset, entries), same) = check_quoted(&h, &env, pcr10);
    assert_eq!((offset, entries.len()), (1, 0), "not covered by this quote");
    assert_eq!(same, pcr10);

    // One of them extended: it alone goes; then the other.
    h.extend(&pending[..1]);
    let env = h.sign();
    let (_, (offset, entries), pcr10) = check_quoted(&h, &env, pcr10);
    assert_eq!((offset, entries.as_slice()), (1, &pending[..1]));
    h.extend(&pending[1..]);
    let env = h.sign();
    let (_, (offset, entries), _) = check_quoted(&h, &env, pcr10);
    assert_eq!((offset, entries.as_slice()), (2, &pending[1..]));
}

#[test]
fn a_pcr_10_the_list_cannot_explain_ships_the_rest_and_resynchronises() {
    let t = SwTpm::start();
    let mut h = QuotedHost::start("resync", &t);
    let env = h.sign();
    let (_, _, pcr10) = check_quoted(&h, &env, [0; 32]);
    // Something extended PCR 10 outside IMA: no prefix of the list replays to it.
    h.extend(&[ImaEntry::ima_ng("not on the list", [0x99; 32])]);
    h.measure(&[ImaEntry::ima_ng("/usr/bin/tool-c", [0xc0; 32])]);
    let env = h.sign();
    let sidecar = env.tpm.as_ref().unwrap().decode().unwrap();
    let (offset, entries) = sidecar.ima.unwrap();
    assert_eq!(offset, 1, "everything from the cursor");
    assert_eq!(entries, h.measured[1..]);
    assert_ne!(
        replay_pcr10(pcr10, &entries),
        sidecar.pcrs.get(10).copied().unwrap()
    );
    // The next statement starts over from the boot aggregate: the verifier resynchronises.
    let env = h.sign();
    let sidecar = env.tpm.as_ref().unwrap().decode().unwrap();
    let (offset, entries) = sidecar.ima.unwrap();
    assert_eq!((offset, entries), (0, h.measured.clone()));
}

#[test]
fn a_tpm_that_fails_costs_the_quote_not_the_statement() {
    let t = SwTpm::start();
    let mut h = QuotedHost::start("tpmgone", &t);
    assert!(h.sign().tpm.is_some());
    // The TPM goes away (a swtpm killed; on a host, a TPM in failure mode).
    drop(t);
    let env = h.sign();
    assert!(env.tpm.is_none(), "no quote without a TPM");
    let verified =
        dsse::verify_envelope(&env, &h.key.verifying_key(), dsse::INTOTO_PAYLOAD_TYPE).unwrap();
    let st: Statement = serde_json::from_slice(&verified.payload).unwrap();
    assert_eq!(st.predicate.seq, 1, "the statement is signed and logged");
}

#[test]
fn tpm_modes_without_a_tpm_auto_says_why_required_refuses_to_start() {
    let dir = host_dir("modes");
    let tcti = "device:/nonexistent/tpmrm0";
    let key = rackwarden_attest::keys::generate();

    // auto: the statement says there is no root of trust, and why.
    let cfg = host_config(&dir, &format!("mode = \"auto\"\ntcti = \"{tcti}\""));
    let attestor = Attestor::open(&cfg.tpm, &cfg.state_paths().tpm_ak(), &cfg.path).unwrap();
    let log = EvidenceLog::open(&cfg.state_paths().evidence_log(), &key.verifying_key()).unwrap();
    let mut log = AttestedLog::new(log, attestor);
    let producer = rackwarden::host_evidence::producer("rackwardend");
    let st =
        statement::sign_and_append(&cfg, &mut log, &key, &producer, bare_evidence(), None).unwrap();
    let Some(RootOfTrust::None { reason }) = &st.predicate.root_of_trust else {
        panic!("{:?}", st.predicate.root_of_trust)
    };
    assert!(
        reason.contains("no TPM device at /nonexistent/tpmrm0"),
        "{reason}"
    );
    assert!(last_envelope(&cfg).tpm.is_none());

    // off: no TPM is opened, and the statement names the config that turned it off.
    let cfg = host_config(&dir, "mode = \"off\"");
    let attestor = Attestor::open(&cfg.tpm, &cfg.state_paths().tpm_ak(), &cfg.path).unwrap();
    assert_eq!(
        attestor.root_of_trust(),
        &RootOfTrust::none(format!(
            "disabled by [tpm] mode = \"off\" in {}",
            cfg.path.display()
        ))
    );

    // required: the epoch loop does not start, naming the TCTI and the cause.
    let (key_path, _, _) = rackwarden_attest::keys::write_keypair(&dir, "host").unwrap();
    let cfg = host_config(
        &dir,
        &format!(
            "mode = \"required\"\ntcti = \"{tcti}\"\n\n[epoch]\nwipe_interval = \"15 min\"\nsigning_key = \"{}\"\n\n[verifier]\nurl = \"http://127.0.0.1:1\"\n",
            key_path.display()
        ),
    );
    let ecfg = cfg.epoch.clone().unwrap();
    let stop: &'static std::sync::atomic::AtomicBool =
        Box::leak(Box::new(std::sync::atomic::AtomicBool::new(true)));
    let e = match rackwarden::epoch::start(&cfg, &ecfg, stop) {
        Ok(_) => panic!("the epoch loop started without the required TPM"),
        Err(e) => e.to_string(),
    };
    assert_eq!(
        e,
        format!(
            "[tpm] mode = \"required\" in {}, but the TPM at `{tcti}` cannot be used: no TPM device at /nonexistent/tpmrm0: this host has no TPM, or no TPM driver (tpm_tis, tpm_crb) is loaded",
            cfg.path.display()
        )
    );
    assert!(!cfg.state_paths().tpm_ak().exists());
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 42: a wrong swtpm port passed `check-config`, and the daemon's statements then said
/// only what libtss2 printed on stderr. The probe `check-config` runs says it in words, and
/// finds a running swtpm (without creating a key).
#[test]
fn the_tpm_probe_names_a_wrong_port_and_finds_a_running_swtpm() {
    let t = SwTpm::start();
    assert_eq!(rackwarden::tpm::probe(&t.tcti).unwrap(), "SW   TPM".trim());
    let wrong = "swtpm:host=127.0.0.1,port=1";
    let e = rackwarden::tpm::probe(wrong).unwrap_err();
    assert!(
        e.contains("no TPM answers at 127.0.0.1:1")
            && e.contains("Connection refused")
            && e.contains("is swtpm (or the simulator) running"),
        "{e}"
    );
    // The daemon's statements say the same.
    let dir = host_dir("probe");
    let cfg = host_config(&dir, &format!("mode = \"auto\"\ntcti = \"{wrong}\""));
    let attestor = Attestor::open(&cfg.tpm, &cfg.state_paths().tpm_ak(), &cfg.path).unwrap();
    let RootOfTrust::None { reason } = attestor.root_of_trust() else {
        panic!("{attestor:?}")
    };
    assert!(reason.contains("no TPM answers at 127.0.0.1:1"), "{reason}");
    // And the running swtpm still answers after the probe's connection.
    assert!(rackwarden::tpm::probe(&t.tcti).is_ok());
    let _ = std::fs::remove_dir_all(&dir);
}

/// POSTs one envelope line to the verifier as delivery does; the finding codes of its
/// verdict (it must be accepted).
fn deliver(v: &TpmVerifier, line: &str) -> Vec<String> {
    let resp = v
        .client()
        .post(format!("{}/v1/statements", v.url()))
        .header("Content-Type", "application/json")
        .body(format!("[{line}]"))
        .send()
        .unwrap();
    assert!(resp.status().is_success(), "{}", resp.status());
    let answer: ReceivedResponse = serde_json::from_str(&resp.text().unwrap()).unwrap();
    match answer.item(0) {
        Some(IngestItem::Judged {
            status: IngestStatus::Accepted,
            result: Some(r),
            ..
        }) => r.findings.iter().map(|f| f.code.clone()).collect(),
        other => panic!("not accepted: {other:?}\n{}", v.log()),
    }
}

/// The daemon's enrolment client against the real verifier: the AK it enrols is the one
/// its statements are quoted with, and once enrolled the verifier takes those quotes.
#[test]
fn the_daemon_enrols_its_ak_and_the_verifier_takes_its_quotes() {
    let t = SwTpm::start();
    let mut v = TpmVerifier::configure("enrol", "rack-a");
    let dir = host_dir("enrol");
    let (key_path, pub_path, key) = rackwarden_attest::keys::write_keypair(&dir, "host").unwrap();
    v.enroll_key("rack-a", "h1", &pub_path);
    v.serve();
    let cfg = host_config(
        &dir,
        &format!(
            "mode = \"required\"\ntcti = \"{}\"\n\n[epoch]\nwipe_interval = \"15 min\"\nsigning_key = \"{}\"\n\n[verifier]\nurl = \"{}\"\nca = \"{}\"\n",
            t.tcti,
            key_path.display(),
            v.url(),
            v.ca.display()
        ),
    );
    std::fs::write(&cfg.tpm.ima_list, b"").unwrap();
    let attestor = Attestor::open(&cfg.tpm, &cfg.state_paths().tpm_ak(), &cfg.path).unwrap();
    let RootOfTrust::Tpm { ak_name, .. } = attestor.root_of_trust().clone() else {
        panic!("{attestor:?}")
    };
    let tpm = attestor.tpm().unwrap();
    let log = EvidenceLog::open(&cfg.state_paths().evidence_log(), &key.verifying_key()).unwrap();
    let mut log = AttestedLog::new(log, attestor);
    let producer = rackwarden::host_evidence::producer("rackwardend");
    let sign = |log: &mut AttestedLog| {
        statement::sign_and_append(&cfg, log, &key, &producer, bare_evidence(), None).unwrap();
        let text = std::fs::read_to_string(cfg.state_paths().evidence_log()).unwrap();
        text.lines().last().unwrap().to_string()
    };

    // Before enrolment the verifier has no AK to check the quote with.
    let findings = deliver(&v, &sign(&mut log));
    assert!(
        findings.contains(&"ak_not_enrolled".to_string()),
        "{findings:?}"
    );

    let enrolment = Enrolment {
        verifier: cfg.epoch.as_ref().unwrap().verifier.clone(),
        rack: "rack-a".into(),
        host: "h1".into(),
        key: key.clone(),
    };
    let t0 = Instant::now();
    let (enrolled, at) =
        tpm_enroll::enrol(&enrolment, &tpm).unwrap_or_else(|e| panic!("{e}\n{}", v.log()));
    assert_eq!(at, enrolment.verifier.url);
    println!(
        "RW_REPORT tpm: AK enrolment (request, credential, ActivateCredential, activation) {:.0} ms against the verifier over TLS with swtpm",
        ms_since(t0)
    );
    assert_eq!(enrolled.ak_name, ak_name);
    assert!(
        enrolled.ek_issuer.contains("swtpm"),
        "{}",
        enrolled.ek_issuer
    );

    // With the primary instance down, the AK is enrolled with the fallback (issue 42: it
    // used to try `url` only), and the instance that enrolled it is named.
    let mut failover = enrolment.verifier.clone();
    failover.fallback_urls = vec![failover.url.clone()];
    failover.url = "https://127.0.0.1:1".into();
    let (_, at) = tpm_enroll::enrol(
        &Enrolment {
            verifier: failover.clone(),
            ..enrolment.clone()
        },
        &tpm,
    )
    .unwrap_or_else(|e| panic!("{e}\n{}", v.log()));
    assert_eq!(at, failover.fallback_urls[0]);

    // The loop's handle does the same on a thread of its own (the verifier keeps the AK).
    let mut handle = TpmEnrolment::new(tpm.clone());
    handle.retry(|| enrolment.clone());
    assert!(handle.wait(Duration::from_secs(30)), "{}", v.log());

    // Now the quotes verify: none of the root-of-trust findings that say otherwise.
    let findings = deliver(&v, &sign(&mut log));
    for code in [
        "quote_missing",
        "ak_not_enrolled",
        "quote_invalid",
        "quote_not_for_statement",
        "pcr_values_mismatch",
        "ima_replay_mismatch",
        "ima_gap",
    ] {
        assert!(
            !findings.iter().any(|f| f == code),
            "{code} in {findings:?}\n{}",
            v.log()
        );
    }

    // A request signed by another key is refused with the verifier's reason.
    let other = Enrolment {
        key: rackwarden_attest::keys::generate(),
        ..enrolment
    };
    let e = tpm_enroll::enrol(&other, &tpm).unwrap_err();
    assert!(matches!(e, tpm_enroll::EnrolError::Refused { .. }), "{e}");
    println!("refused as it should be: {e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Polls `f` every 100 ms for up to `secs`; its value once it has one.
fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t0 = Instant::now();
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "no {what} within {secs} s"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The whole loop as the daemon runs it (`epoch::start`, a scratch-only wipe so no root is
/// needed): it opens the TPM, enrols the AK beside the first epoch, and every statement it
/// signs and delivers carries a quote; once the AK is enrolled the verifier finds nothing
/// wrong with them.
#[test]
fn the_epoch_loop_quotes_every_statement_and_enrols_its_ak() {
    let t = SwTpm::start();
    let mut v = TpmVerifier::configure("loop", "rack-a");
    let dir = host_dir("loop");
    let (key_path, pub_path, _) = rackwarden_attest::keys::write_keypair(&dir, "host").unwrap();
    v.enroll_key("rack-a", "h1", &pub_path);
    v.serve();
    std::fs::create_dir_all(dir.join("scratch")).unwrap();
    let cfg = host_config(
        &dir,
        &format!(
            "mode = \"required\"\ntcti = \"{}\"\n\n[epoch]\nwipe_interval = \"15 min\"\nsigning_key = \"{}\"\n\n[verifier]\nurl = \"{}\"\nca = \"{}\"\n\n[wipe]\nbackends = [\"scratch\"]\nscratch = [\"{}\"]\nmax_bytes = \"1 MiB\"\n",
            t.tcti,
            key_path.display(),
            v.url(),
            v.ca.display(),
            dir.join("scratch").display()
        ),
    );
    // The boot aggregate, measured before the daemon starts (swtpm serves one client at a
    // time: this one lets go before the daemon opens it).
    let boot = ImaEntry::ima_ng("boot_aggregate", [0x11; 32]);
    std::fs::write(
        &cfg.tpm.ima_list,
        encode_ima_binary(std::slice::from_ref(&boot)),
    )
    .unwrap();
    open(&t)
        .extend_pcr(10, boot.sha256_bank_extend_value())
        .unwrap();

    let ecfg = cfg.epoch.clone().unwrap();
    let stop: &'static std::sync::atomic::AtomicBool =
        Box::leak(Box::new(std::sync::atomic::AtomicBool::new(false)));
    let handle = rackwarden::epoch::start(&cfg, &ecfg, stop).unwrap_or_else(|e| panic!("{e}"));
    let verdict_of = |seq: u64| {
        let handle = &handle;
        wait_for(60, &format!("verdict for seq {seq}"), move || {
            handle
                .snapshot()
                .and_then(|s| s.delivery.last_verdict)
                .filter(|v| v.seq == seq)
        })
    };
    // The first epoch waited for the AK's enrolment, so even the first statement's quote is
    // checked against the enrolled AK.
    let first = verdict_of(0);
    for code in ["quote_missing", "ak_not_enrolled", "quote_invalid"] {
        assert!(
            !first.findings.iter().any(|f| f == code),
            "seq 0: {code} in {:?}\n{}",
            first.findings,
            v.log()
        );
    }
    // The status says what the statements say, and where the enrolment stands.
    let status = wait_for(60, "AK enrolment in the status", || {
        handle
            .snapshot()
            .filter(|s| matches!(s.ak_enrolment, Some(AkEnrolment::Enrolled { .. })))
    });
    let Some(RootOfTrust::Tpm { ak_name, .. }) = &status.root_of_trust else {
        panic!("{:?}", status.root_of_trust)
    };
    assert_eq!(
        status.ak_enrolment,
        Some(AkEnrolment::Enrolled {
            ak_name: ak_name.clone(),
            ek_issuer: "CN=swtpm-localca-rootca".into(),
            verifier: v.url(),
        })
    );
    let enrolled = wait_for(60, "AK enrolment", || {
        let listed = v.cli(&["tpm-enrollments"]);
        listed.contains("h1").then_some(listed)
    });
    println!("{enrolled}");

    // An epoch after enrolment: its quote is checked against the enrolled AK.
    handle
        .commands
        .send(rackwarden::epoch::EpochCommand::WipeNow)
        .unwrap();
    let verdict = verdict_of(1);
    for code in [
        "quote_missing",
        "ak_not_enrolled",
        "quote_invalid",
        "quote_not_for_statement",
        "pcr_values_mismatch",
        "ima_replay_mismatch",
        "ima_gap",
    ] {
        assert!(
            !verdict.findings.iter().any(|f| f == code),
            "{code} in {:?}\n{}",
            verdict.findings,
            v.log()
        );
    }
    println!(
        "seq 1 after enrolment: {:?} {:?}",
        verdict.status, verdict.findings
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);

    // Every line the loop wrote carries its quote, and the statement says the root of trust.
    let text = std::fs::read_to_string(cfg.state_paths().evidence_log()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    for (seq, line) in lines.iter().enumerate() {
        let env: Envelope = serde_json::from_str(line).unwrap();
        // The first ships the list from the boot aggregate (the first after the start, and
        // the first after the enrolment it waited for); the second only what was measured
        // since, here nothing.
        let sidecar = env.tpm.as_ref().expect("a quote").decode().unwrap();
        let shipped = sidecar.ima.expect("IMA entries");
        let want = if seq == 0 {
            (0, vec![boot.clone()])
        } else {
            (1, vec![])
        };
        assert_eq!(shipped, want, "seq {seq}: {line}");
        let verifier_key = rackwarden_attest::keys::load_verifying_key(&pub_path).unwrap();
        let verified =
            dsse::verify_envelope(&env, &verifier_key, dsse::INTOTO_PAYLOAD_TYPE).unwrap();
        let st: Statement = serde_json::from_slice(&verified.payload).unwrap();
        assert!(
            matches!(st.predicate.root_of_trust, Some(RootOfTrust::Tpm { .. })),
            "{:?}",
            st.predicate.root_of_trust
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
