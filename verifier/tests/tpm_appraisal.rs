//! The root-of-trust appraisal through the verifier's ingest path, with quotes made by a
//! software P-256 key in the TPM's exact byte layout (TPMS_ATTEST, TPMT_SIGNATURE): every
//! finding of `appraisal/tpm.rs` provoked on purpose, and the level each verdict grants.
//! The same checks against a real TPM (swtpm) and the real daemon are in the workspace's
//! `tests/tests/tpm_e2e.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use p256::ecdsa::{SigningKey as AkKey, signature::Signer as _};
use rackwarden_attest::{
    api::IngestStatus,
    dsse, keys,
    result::{AttestationResult, FindingCode, Status},
    statement::{Challenge, GENESIS_PREV, Statement},
    tpm::{
        AkPublic, ImaEntry, ImaSource, PcrSelection, PcrValues, QuoteInfo, RootOfTrust, TpmSidecar,
        TrustLevel, encode_ima_binary, quote::encode_signature, replay_pcr10,
    },
};
use rackwarden_verifier::store::TpmEnrollment;
use rackwarden_verifier::{config::VerifierConfig, service::Verifier};

const RACK: &str = "rack-t";
const DAEMON: [u8; 32] = [0xd0; 32];
const PYTHON: [u8; 32] = [0x9e; 32];
const QUOTED: [u8; 9] = [0, 1, 2, 3, 4, 5, 6, 7, 10];

fn config(dir: &std::path::Path, min: &str, boot: &str) -> VerifierConfig {
    let allowlist = dir.join("allowlist.txt");
    std::fs::write(
        &allowlist,
        format!("{}  /usr/bin/python3\n", hex::encode(PYTHON)),
    )
    .unwrap();
    // AKs are enrolled in the store directly; the policy needs EK roots all the same.
    let roots = dir.join("ek-roots.pem");
    std::fs::write(
        &roots,
        "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = format!(
        "listen = \"127.0.0.1:1\"\ninsecure_http = true\ndatabase = \"/unused\"\n\n[policy]\nid = \"tpm-test\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\nmin_root_of_trust = \"{min}\"\n\n[policy.runtime]\ndaemon_digests = [\"{}\"]\nallowlist = \"{}\"\nexclude = [\"/etc/\"]\n{boot}\n[racks.{RACK}]\negress = \"10 MB/s\"\ningress = \"10 MB/s\"\n\n[tpm]\nek_roots = \"{}\"\n",
        hex::encode(DAEMON),
        allowlist.display(),
        roots.display()
    );
    VerifierConfig::parse(&dir.join("v.toml"), &text).unwrap()
}

/// A host with an ed25519 key, a software "TPM" (an AK, PCRs, an IMA list) and its chain.
struct Host {
    name: String,
    key: ed25519_dalek::SigningKey,
    ak: AkKey,
    reset_count: u32,
    pcrs: BTreeMap<u8, [u8; 32]>,
    ima: Vec<ImaEntry>,
    /// Entries already shipped.
    shipped: usize,
    seq: u64,
    prev: String,
}

impl Host {
    fn new(v: &mut Verifier, name: &str, enrol_ak: bool) -> Host {
        let key = keys::generate();
        v.enroll(RACK, name, &keys::public_pem(&key.verifying_key()), 1)
            .unwrap();
        let ak = AkKey::from_slice(&[7u8; 32]).unwrap();
        if enrol_ak {
            enrol_ak_at(v, name, &ak, 1);
        }
        let mut h = Host {
            name: name.into(),
            key,
            ak,
            reset_count: 1,
            pcrs: QUOTED.iter().map(|p| (*p, [*p; 32])).collect(),
            ima: Vec::new(),
            shipped: 0,
            seq: 0,
            prev: GENESIS_PREV.into(),
        };
        h.boot();
        h
    }

    /// A fresh boot: PCR 10 from zero, the boot aggregate and the daemon measured.
    fn boot(&mut self) {
        self.ima.clear();
        self.shipped = 0;
        self.pcrs.insert(10, [0; 32]);
        self.measure("boot_aggregate", [0x11; 32]);
        self.measure("/usr/local/bin/rackwardend", DAEMON);
        self.measure("/etc/rackwarden/rackwarden.toml", [0xcf; 32]);
    }

    /// IMA measures a file: the list grows and PCR 10 is extended.
    fn measure(&mut self, path: &str, digest: [u8; 32]) {
        let e = ImaEntry::ima_ng(path, digest);
        let pcr10 = replay_pcr10(self.pcrs[&10], std::slice::from_ref(&e));
        self.pcrs.insert(10, pcr10);
        self.ima.push(e);
    }

    fn statement(&self) -> Statement {
        let mut st = rackwarden_attest::schema::example_statement();
        let p = &mut st.predicate;
        p.rack_id = RACK.into();
        p.host_id = self.name.clone();
        p.seq = self.seq;
        p.prev = self.prev.clone();
        p.challenge = Challenge::Unchallenged;
        p.next_key = None;
        p.root_of_trust = Some(RootOfTrust::Tpm {
            tcti: "device:/dev/tpmrm0".into(),
            vendor: "test".into(),
            ak_name: String::new(),
            ek_certificate: true,
            ima: ImaSource::Measured {
                list: "/sys/kernel/security/ima/binary_runtime_measurements".into(),
            },
        });
        st
    }

    /// The quote the TPM would make over `digest` now.
    fn quote(&self, digest: &[u8; 32]) -> (Vec<u8>, Vec<u8>) {
        let selection = PcrSelection::from_indices(&QUOTED).unwrap();
        let mut values = PcrValues::new();
        for (p, v) in &self.pcrs {
            values.insert(*p, *v);
        }
        let info = QuoteInfo {
            qualified_signer: vec![0; 34],
            extra_data: digest.to_vec(),
            clock: 1000 + self.seq,
            reset_count: self.reset_count,
            restart_count: 0,
            safe: true,
            firmware_version: 1,
            pcr_digest: values.digest(&selection).unwrap(),
            selection,
        };
        let attest = info.to_bytes();
        let sig: p256::ecdsa::Signature = self.ak.sign(&attest);
        (attest, encode_signature(&sig))
    }

    /// Signs the next statement and makes the sidecar an honest daemon would: a quote over
    /// its digest and the IMA entries not shipped yet. `edit` changes the statement first.
    fn next(&mut self, edit: impl FnOnce(&mut Statement)) -> (Statement, dsse::Envelope) {
        let mut st = self.statement();
        edit(&mut st);
        let body = st.to_json().unwrap();
        let mut env = dsse::sign(&self.key, dsse::INTOTO_PAYLOAD_TYPE, &body);
        let digest = rackwarden_attest::sha3(&dsse::pae(&env.payload_type, &body));
        let (attest, sig) = self.quote(&digest);
        let delta = encode_ima_binary(&self.ima[self.shipped..]);
        env.tpm = Some(TpmSidecar::new(
            &attest,
            &sig,
            &self.pcrs,
            Some((self.shipped as u64, &delta)),
        ));
        self.shipped = self.ima.len();
        self.seq += 1;
        self.prev = hex::encode(digest);
        (st, env)
    }
}

/// Enrols `ak` for host `name` in the store, as the credential exchange would at `at_ms`.
fn enrol_ak_at(v: &Verifier, name: &str, ak: &AkKey, at_ms: u64) {
    let public = AkPublic::from_verifying_key(ak.verifying_key());
    v.store
        .enroll_tpm(&TpmEnrollment {
            rack: RACK.into(),
            host: name.into(),
            ak_public: hex::encode(public.bytes()),
            ak_name: hex::encode(public.name()),
            ek_public: String::new(),
            ek_certificate: None,
            ek_issuer: "CN=test".into(),
            enrolled_ms: at_ms,
        })
        .unwrap();
}

fn ingest(v: &mut Verifier, env: &dsse::Envelope) -> AttestationResult {
    let out = v.ingest(&env.to_json().unwrap(), 2).unwrap();
    assert_eq!(out.status, IngestStatus::Accepted, "{:?}", out.reason);
    out.result.unwrap()
}

fn tpm_codes(r: &AttestationResult) -> Vec<(FindingCode, Status, String)> {
    r.findings
        .iter()
        .filter(|f| f.aspect == rackwarden_attest::result::Aspect::RootOfTrust)
        .map(|f| (f.code, f.severity, f.detail.clone()))
        .collect()
}

fn verifier(min: &str, boot: &str) -> (Verifier, tempdir::Dir) {
    let dir = tempdir::Dir::new();
    let cfg = config(dir.path(), min, boot);
    (
        Verifier::new(
            rackwarden_verifier::store::testing::store("tpm_appraisal").unwrap(),
            cfg.policy,
        )
        .unwrap(),
        dir,
    )
}

mod tempdir {
    pub struct Dir(std::path::PathBuf);
    impl Dir {
        pub fn new() -> Dir {
            static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let p = std::env::temp_dir().join(format!(
                "rw-tpm-appraisal-{}-{}",
                std::process::id(),
                N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            ));
            std::fs::create_dir_all(&p).unwrap();
            Dir(p)
        }
        pub fn path(&self) -> &std::path::Path {
            &self.0
        }
    }
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn an_honest_host_is_tpm_ima_and_its_ima_position_advances() {
    let (mut v, _d) = verifier("tpm_ima", "");
    let mut h = Host::new(&mut v, "h1", true);
    let (_, env) = h.next(|_| {});
    let r = ingest(&mut v, &env);
    assert_eq!(tpm_codes(&r), vec![]);
    assert_eq!(r.root_of_trust, Some(TrustLevel::TpmIma));
    assert_eq!(
        r.trustworthiness[&rackwarden_attest::result::Aspect::RootOfTrust],
        Status::Affirming
    );
    let pos = v.store.tpm_position(RACK, "h1").unwrap().unwrap();
    assert_eq!((pos.ima_count, pos.seq), (3, 0));

    // An allowed program runs: only it ships, from offset 3, and replays on the position.
    h.measure("/usr/bin/python3", PYTHON);
    let (_, env) = h.next(|_| {});
    assert_eq!(env.tpm.as_ref().unwrap().ima.as_ref().unwrap().offset, 3);
    let r = ingest(&mut v, &env);
    assert_eq!(tpm_codes(&r), vec![]);
    assert_eq!(r.root_of_trust, Some(TrustLevel::TpmIma));
    assert_eq!(
        v.store.tpm_position(RACK, "h1").unwrap().unwrap().ima_count,
        4
    );
}

#[test]
fn the_stolen_key_forgery_is_contraindicated() {
    let (mut v, _d) = verifier("none", "");
    let mut h = Host::new(&mut v, "h1", true);
    let (_, honest) = h.next(|_| {});
    let r = ingest(&mut v, &honest);
    assert_eq!(tpm_codes(&r), vec![]);
    assert_eq!(r.root_of_trust, Some(TrustLevel::TpmIma));

    // Root reads the ed25519 key and signs a statement with no quote: the AK is enrolled, so
    // a missing quote is contraindicated even under a policy that asks for no TPM.
    let (_, mut forged) = h.next(|st| st.predicate.incidents.clear());
    forged.tpm = None;
    let r = ingest(&mut v, &forged);
    let codes = tpm_codes(&r);
    assert_eq!(codes[0].0, FindingCode::QuoteMissing, "{codes:?}");
    assert_eq!(codes[0].1, Status::Contraindicated);
    assert_eq!(r.status, Status::Contraindicated);
    assert_eq!(r.root_of_trust, Some(TrustLevel::None));
}

#[test]
fn a_replayed_quote_and_altered_evidence_are_named() {
    let (mut v, _d) = verifier("tpm_ima", "");
    let mut h = Host::new(&mut v, "h1", true);
    let (_, honest) = h.next(|_| {});
    ingest(&mut v, &honest);

    // replayed: the honest quote attached to another statement.
    let (_, mut replayed) = h.next(|_| {});
    replayed.tpm = honest.tpm.clone();
    let r = ingest(&mut v, &replayed);
    let codes = tpm_codes(&r);
    assert_eq!(codes[0].0, FindingCode::QuoteNotForStatement, "{codes:?}");
    assert!(
        codes
            .iter()
            .any(|c| c.0 == FindingCode::RootOfTrustBelowPolicy)
    );
    assert_eq!(r.root_of_trust, Some(TrustLevel::None));

    // PCR values edited after the quote: they no longer hash to the quoted digest.
    let (_, mut edited) = h.next(|_| {});
    edited.tpm.as_mut().unwrap().pcrs.insert(4, "ab".repeat(32));
    let codes = tpm_codes(&ingest(&mut v, &edited));
    assert_eq!(codes[0].0, FindingCode::PcrValuesMismatch, "{codes:?}");

    // A signature by another key.
    let mut other = Host::new(&mut v, "h2", false);
    other.ak = AkKey::from_slice(&[9u8; 32]).unwrap();
    other.seq = h.seq;
    other.prev = h.prev.clone();
    other.name = "h1".into();
    other.key = h.key.clone();
    other.pcrs = h.pcrs.clone();
    other.ima = h.ima.clone();
    let (_, bad_sig) = other.next(|_| {});
    let codes = tpm_codes(&ingest(&mut v, &bad_sig));
    assert_eq!(codes[0].0, FindingCode::QuoteInvalid, "{codes:?}");
}

#[test]
fn runtime_findings_name_path_and_digest() {
    let (mut v, _d) = verifier("tpm_ima", "");
    let mut h = Host::new(&mut v, "h1", true);
    ingest(&mut v, &h.next(|_| {}).1);

    // forged with a quote: root runs a forging program, the TPM quotes honestly, and the
    // program is in the IMA list.
    h.measure("/root/forge", [0x66; 32]);
    let r = ingest(&mut v, &h.next(|_| {}).1);
    let codes = tpm_codes(&r);
    assert_eq!(codes[0].0, FindingCode::ExecutableNotAllowed, "{codes:?}");
    assert!(codes[0].2.contains("/root/forge") && codes[0].2.contains(&"66".repeat(32)));
    assert_eq!(r.root_of_trust, Some(TrustLevel::Tpm));
    assert!(
        codes
            .iter()
            .any(|c| c.0 == FindingCode::RootOfTrustBelowPolicy)
    );

    // modified: the daemon binary changed by a byte and restarted; IMA measures it again.
    let mut modified = DAEMON;
    modified[31] ^= 1;
    h.measure("/usr/local/bin/rackwardend", modified);
    let codes = tpm_codes(&ingest(&mut v, &h.next(|_| {}).1));
    assert_eq!(codes[0].0, FindingCode::DaemonModified, "{codes:?}");
    assert!(codes[0].2.contains(&hex::encode(modified)));

    // An excluded path is replayed but not judged; a violation is a warning.
    h.measure("/etc/shadow", [0x55; 32]);
    let r = ingest(&mut v, &h.next(|_| {}).1);
    assert_eq!(tpm_codes(&r), vec![]);
    assert_eq!(r.root_of_trust, Some(TrustLevel::TpmIma));
}

#[test]
fn a_reboot_a_gap_and_an_altered_list() {
    let (mut v, _d) = verifier("tpm_ima", "");
    let mut h = Host::new(&mut v, "h1", true);
    ingest(&mut v, &h.next(|_| {}).1);

    // The list loses an entry on the way: PCR 10 no longer replays.
    h.measure("/usr/bin/python3", PYTHON);
    h.measure("/usr/bin/python3", PYTHON);
    let (_, mut env) = h.next(|_| {});
    let sc = env.tpm.as_mut().unwrap();
    let d = sc.ima.as_mut().unwrap();
    d.entries = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(encode_ima_binary(&h.ima[3..4]))
    };
    let codes = tpm_codes(&ingest(&mut v, &env));
    assert_eq!(codes[0].0, FindingCode::ImaReplayMismatch, "{codes:?}");

    // The verified position did not move, so the next delta (from 5) leaves a gap.
    h.measure("/usr/bin/python3", PYTHON);
    let r = ingest(&mut v, &h.next(|_| {}).1);
    let codes = tpm_codes(&r);
    assert_eq!(codes[0].0, FindingCode::ImaGap, "{codes:?}");
    assert_eq!(r.root_of_trust, Some(TrustLevel::Tpm));

    // A reboot: resetCount moves, the list starts over from the boot aggregate.
    h.reset_count += 1;
    h.boot();
    let r = ingest(&mut v, &h.next(|_| {}).1);
    let codes = tpm_codes(&r);
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(
        (codes[0].0, codes[0].1),
        (FindingCode::TpmReboot, Status::Warning)
    );
    assert_eq!(r.root_of_trust, Some(TrustLevel::TpmIma));
}

#[test]
fn boot_reference_values_and_hosts_without_a_tpm() {
    let boot = format!(
        "[policy.boot]\npcrs = {{ 4 = \"{}\" }}\n",
        hex::encode([4u8; 32])
    );
    let (mut v, _d) = verifier("tpm", &boot);
    let mut h = Host::new(&mut v, "h1", true);
    let r = ingest(&mut v, &h.next(|_| {}).1);
    assert_eq!(tpm_codes(&r), vec![]);
    h.pcrs.insert(4, [0x44; 32]);
    let codes = tpm_codes(&ingest(&mut v, &h.next(|_| {}).1));
    assert_eq!(codes[0].0, FindingCode::BootPcrMismatch, "{codes:?}");

    // A quote from a host whose AK was never enrolled grants nothing.
    let mut n = Host::new(&mut v, "h3", false);
    let r = ingest(&mut v, &n.next(|_| {}).1);
    let codes = tpm_codes(&r);
    assert_eq!(codes[0].0, FindingCode::AkNotEnrolled, "{codes:?}");
    assert_eq!(r.root_of_trust, Some(TrustLevel::None));

    // A host that says it has no TPM, under a policy that needs one: contraindicated, and
    // the verdict repeats the host's reason.
    let (_, mut env) = n.next(|st| {
        st.predicate.root_of_trust = Some(RootOfTrust::none("no TPM device at /dev/tpmrm0"));
    });
    env.tpm = None;
    let r = ingest(&mut v, &env);
    let codes = tpm_codes(&r);
    assert_eq!(codes[0].0, FindingCode::RootOfTrustBelowPolicy, "{codes:?}");
    assert!(
        codes[0].2.contains("no TPM device at /dev/tpmrm0"),
        "{codes:?}"
    );
}

#[test]
fn verdicts_without_a_tpm_in_play_are_unchanged() {
    let (mut v, _d) = verifier("none", "");
    let mut h = Host::new(&mut v, "h1", false);
    let (_, mut env) = h.next(|st| st.predicate.root_of_trust = None);
    env.tpm = None;
    let r = ingest(&mut v, &env);
    assert_eq!(r.root_of_trust, None);
    assert!(
        !r.trustworthiness
            .contains_key(&rackwarden_attest::result::Aspect::RootOfTrust)
    );
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains("root_of_trust"), "{json}");
}

/// Issue 42: `recheck` re-derives TPM verdicts exactly. The fresh store it re-derives into
/// gets each AK enrolment at the time it was made, so the statements quoted by a host's first
/// AK and those quoted by the AK it enrolled after a reboot re-derive alike (it had copied
/// only host keys and nonces, and cried tampering on every TPM host).
#[test]
fn recheck_re_derives_tpm_verdicts_across_a_new_ak() {
    let (mut v, d) = verifier("tpm_ima", "");
    let mut h = Host::new(&mut v, "h1", true);
    let judge_at = |v: &mut Verifier, env: &dsse::Envelope, t: u64| {
        let out = v.ingest(&env.to_json().unwrap(), t).unwrap();
        assert_eq!(out.status, IngestStatus::Accepted, "{:?}", out.reason);
        out.result.unwrap()
    };
    for t in 10..13 {
        let r = judge_at(&mut v, &h.next(|_| {}).1, t);
        assert_eq!(
            r.root_of_trust,
            Some(TrustLevel::TpmIma),
            "{:?}",
            tpm_codes(&r)
        );
    }
    // A reboot with a fresh AK, enrolled at 20.
    h.ak = AkKey::from_slice(&[9u8; 32]).unwrap();
    h.reset_count += 1;
    h.boot();
    enrol_ak_at(&v, "h1", &h.ak, 20);
    for t in 21..23 {
        let r = judge_at(&mut v, &h.next(|_| {}).1, t);
        assert_eq!(
            r.root_of_trust,
            Some(TrustLevel::TpmIma),
            "{:?}",
            tpm_codes(&r)
        );
    }
    let policy = config(d.path(), "tpm_ima", "").policy;
    let report = rackwarden_verifier::recheck::recheck(&v.store, &policy).unwrap();
    assert_eq!(report.statements, 5);
    assert!(
        report.differences.is_empty() && !report.untrusted(),
        "{:#?}",
        report.differences
    );
    // And a verdict rewritten in the store is still caught.
    v.store
        .tamper_batch(
            "UPDATE statements SET result = replace(result, '\"root_of_trust\":\"tpm_ima\"', '\"root_of_trust\":\"tpm\"') WHERE seq = 3",
        )
        .unwrap();
    let report = rackwarden_verifier::recheck::recheck(&v.store, &policy).unwrap();
    assert!(report.untrusted(), "a rewritten verdict is reported");
}
