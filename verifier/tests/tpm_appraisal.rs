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
        AkPublic, BootEvidence, EventLog, ImaEntry, ImaSource, PcrSelection, PcrValues, QuoteInfo,
        RootOfTrust, TpmSidecar, TrustLevel, encode_ima_binary, quote::encode_signature,
        replay_pcr10,
    },
};
use rackwarden_verifier::store::TpmEnrollment;
use rackwarden_verifier::{config::VerifierConfig, service::Verifier};

const RACK: &str = "rack-t";
const DAEMON: [u8; 32] = [0xd0; 32];
const PYTHON: [u8; 32] = [0x9e; 32];
const QUOTED: [u8; 11] = [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10];

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
    /// The boot's event log and command line, shipped with the next statement.
    boot_log: Option<(EventLog, String)>,
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
            boot_log: None,
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

    /// A fresh measured boot: PCRs 0-9 are `log`'s replay (the TPM extended what the log
    /// records), and the next statement ships the log with `cmdline`.
    fn measured_boot(&mut self, log: EventLog, cmdline: &str) {
        let replayed = log.replay_sha256().unwrap();
        for p in 0..=9u8 {
            self.pcrs.insert(p, *replayed.get(p).unwrap());
        }
        self.boot_log = Some((log, cmdline.into()));
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
        let mut sidecar = TpmSidecar::new(
            &attest,
            &sig,
            &self.pcrs,
            Some((self.shipped as u64, &delta)),
        );
        sidecar.boot = self
            .boot_log
            .take()
            .map(|(log, cmdline)| BootEvidence::new(&log.to_bytes(), &cmdline));
        env.tpm = Some(sidecar);
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

/// A UEFI boot's event log as OVMF and the Linux EFI stub write it: Secure Boot's variables
/// (PCR 7), the applications started (PCR 4: `apps`, the kernel last), and the initrd and the
/// command line (PCR 9).
fn boot_log(apps: &[[u8; 32]], initrd: [u8; 32], cmdline: &str, secure_boot: u8) -> EventLog {
    use rackwarden_attest::tpm::boot::{encode_variable, secure_boot_variable_guid};
    use rackwarden_attest::tpm::eventlog::{
        EV_EFI_BOOT_SERVICES_APPLICATION, EV_EFI_VARIABLE_DRIVER_CONFIG, EV_SEPARATOR,
        LINUX_EFI_INITRD_EVENT_TAG_ID, LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID, LogEvent,
        efi_load_options_digest,
    };
    use sha2::{Digest, Sha256};
    let ev = LogEvent::sha256_event;
    let mut log = EventLog::new_sha256();
    for (name, value) in [
        ("SecureBoot", vec![secure_boot]),
        ("PK", b"the platform key".to_vec()),
        ("db", DB.to_vec()),
    ] {
        let data = encode_variable(secure_boot_variable_guid(name), name, &value);
        let d: [u8; 32] = Sha256::digest(&data).into();
        log.events
            .push(ev(7, EV_EFI_VARIABLE_DRIVER_CONFIG, data, d));
    }
    for pcr in 0..8 {
        log.events.push(ev(
            pcr,
            EV_SEPARATOR,
            vec![0; 4],
            Sha256::digest([0u8; 4]).into(),
        ));
    }
    for a in apps {
        log.events
            .push(ev(4, EV_EFI_BOOT_SERVICES_APPLICATION, vec![0; 32], *a));
    }
    log.events.push(LogEvent::linux_tag(
        LINUX_EFI_INITRD_EVENT_TAG_ID,
        b"event\0",
        initrd,
    ));
    log.events.push(LogEvent::linux_tag(
        LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID,
        b"event\0",
        efi_load_options_digest(cmdline),
    ));
    log
}

const SHIM: [u8; 32] = [0x5a; 32];
const KERNEL: [u8; 32] = [0x4b; 32];
const NEW_KERNEL: [u8; 32] = [0x4c; 32];
const INITRD: [u8; 32] = [0x1d; 32];
const DB: &[u8] = b"the signature database";
const CMDLINE: &str = "root=/dev/vda ro lsm=lockdown,yama,integrity,bpf ima_policy=tcb";

fn boot_policy(kernels: &[[u8; 32]]) -> String {
    use sha2::{Digest, Sha256};
    let list = |v: &[[u8; 32]]| {
        v.iter()
            .map(|d| format!("\"{}\"", hex::encode(d)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!(
        "[policy.boot]\nloaders = [{}]\nkernels = [{}]\ninitrds = [{}]\ncmdline_required = [\"ima_policy=tcb\"]\ncmdline_forbidden = [\"init\"]\nsecure_boot = true\nsecure_boot_variables = {{ db = [\"{}\"] }}\n",
        list(&[SHIM]),
        list(kernels),
        list(&[INITRD]),
        hex::encode(Sha256::digest(DB))
    )
}

/// The guard the statement reports: sealed as BPF LSM programs.
fn lsm_guard(st: &mut Statement) {
    use rackwarden_attest::evidence::{GuardAttach, LimiterReport, LsmGuard};
    if let LimiterReport::Present(e) = &mut st.predicate.limiter
        && let Some(sp) = &mut e.self_protection
        && let LsmGuard::Sealed { attach, .. } = &mut sp.lsm_guard
    {
        *attach = GuardAttach::Lsm;
    }
}

#[test]
fn a_boot_is_judged_from_its_event_log_for_the_whole_boot() {
    use rackwarden_attest::result::GuardBasis;
    let (mut v, d) = verifier("tpm_ima", &boot_policy(&[KERNEL]));
    let mut h = Host::new(&mut v, "h1", true);
    h.measured_boot(boot_log(&[SHIM, KERNEL], INITRD, CMDLINE, 1), CMDLINE);
    // The statement with the log, then one without: judged by the boot the first verified.
    for _ in 0..2 {
        let r = ingest(&mut v, &h.next(lsm_guard).1);
        assert_eq!(tpm_codes(&r), vec![]);
        assert_eq!(r.root_of_trust, Some(TrustLevel::TpmIma));
        assert_eq!(r.guard, Some(GuardBasis::ProvenByBoot));
    }
    let boot = v.store.tpm_boot(RACK, "h1").unwrap().unwrap();
    assert_eq!(boot.seq, 0);
    assert_eq!(
        boot.measured.applications,
        vec![hex::encode(SHIM), hex::encode(KERNEL)]
    );
    // The fmod_ret guard needs no BPF LSM: an accepted kernel is its proof.
    let r = ingest(&mut v, &h.next(|_| {}).1);
    assert_eq!(r.guard, Some(GuardBasis::ProvenByBoot));

    // Something extends PCR 9 after boot: the boot's log no longer describes it.
    h.pcrs.insert(9, [0x99; 32]);
    let r = ingest(&mut v, &h.next(lsm_guard).1);
    let codes = tpm_codes(&r);
    assert_eq!(codes[0].0, FindingCode::BootLogMismatch, "{codes:?}");
    assert!(codes[0].2.contains("PCR 9 changed"), "{codes:?}");
    assert_eq!(r.guard, None);

    // recheck re-derives every verdict from the stored sidecars, the boot log among them.
    let policy = config(d.path(), "tpm_ima", &boot_policy(&[KERNEL])).policy;
    let report = rackwarden_verifier::recheck::recheck(&v.store, &policy).unwrap();
    assert!(
        report.differences.is_empty() && !report.untrusted(),
        "{:#?}",
        report.differences
    );
}

#[test]
fn each_boot_outside_the_policy_is_named() {
    use rackwarden_attest::result::GuardBasis;
    let (mut v, _d) = verifier("tpm_ima", &boot_policy(&[KERNEL]));
    let judge = |v: &mut Verifier, name: &str, log: EventLog, cmdline: &str| {
        let mut h = Host::new(v, name, true);
        h.measured_boot(log, cmdline);
        ingest(v, &h.next(lsm_guard).1)
    };
    let first = |r: &AttestationResult| {
        let codes = tpm_codes(r);
        assert!(!codes.is_empty(), "no finding");
        (codes[0].0, codes[0].2.clone())
    };

    // A kernel outside the accepted set.
    let r = judge(
        &mut v,
        "k",
        boot_log(&[SHIM, NEW_KERNEL], INITRD, CMDLINE, 1),
        CMDLINE,
    );
    let (code, detail) = first(&r);
    assert_eq!(code, FindingCode::BootComponentNotAccepted);
    assert!(detail.contains(&hex::encode(NEW_KERNEL)), "{detail}");
    assert_eq!(rot(&r), Status::Contraindicated);
    // A loader outside it (a GRUB nobody accepted between shim and the kernel).
    let r = judge(
        &mut v,
        "l",
        boot_log(&[SHIM, [0x66; 32], KERNEL], INITRD, CMDLINE, 1),
        CMDLINE,
    );
    assert!(
        first(&r).1.contains(&hex::encode([0x66; 32])),
        "{:?}",
        first(&r)
    );

    // A command line without bpf in lsm=, while the daemon says its BPF LSM guard is sealed.
    let no_bpf = "root=/dev/vda ro lsm=lockdown,yama ima_policy=tcb";
    let r = judge(
        &mut v,
        "c",
        boot_log(&[SHIM, KERNEL], INITRD, no_bpf, 1),
        no_bpf,
    );
    let codes: Vec<FindingCode> = tpm_codes(&r).into_iter().map(|c| c.0).collect();
    assert_eq!(codes, vec![FindingCode::GuardContradictsBoot]);
    assert_eq!(r.guard, Some(GuardBasis::ContradictedByBoot));
    // A forbidden argument and a missing required one.
    let bad = "root=/dev/vda init=/bin/sh lsm=bpf";
    let r = judge(&mut v, "f", boot_log(&[SHIM, KERNEL], INITRD, bad, 1), bad);
    let details: Vec<String> = tpm_codes(&r).into_iter().map(|c| c.2).collect();
    assert!(
        details.iter().any(|d| d.contains("lacks `ima_policy=tcb`")),
        "{details:?}"
    );
    assert!(
        details.iter().any(|d| d.contains("carries `init=/bin/sh`")),
        "{details:?}"
    );
    // The host lies about its command line: it does not hash to the measured one.
    let r = judge(
        &mut v,
        "m",
        boot_log(&[SHIM, KERNEL], INITRD, no_bpf, 1),
        CMDLINE,
    );
    // The measured command line is a PCR 9 measurement nothing explains, and the shipped one
    // hashes to none.
    let codes = tpm_codes(&r);
    assert_eq!(
        codes[0].0,
        FindingCode::BootComponentNotAccepted,
        "{codes:?}"
    );
    assert!(
        codes
            .iter()
            .any(|c| c.0 == FindingCode::BootCmdlineNotAccepted && c.2.contains("does not hash")),
        "{codes:?}"
    );
    assert_eq!(r.guard, Some(GuardBasis::DaemonWord));

    // Secure Boot disabled.
    let r = judge(
        &mut v,
        "s",
        boot_log(&[SHIM, KERNEL], INITRD, CMDLINE, 0),
        CMDLINE,
    );
    let (code, detail) = first(&r);
    assert_eq!(code, FindingCode::SecureBootNotAccepted);
    assert!(detail.contains("disabled"), "{detail}");

    // One event edited in the log shipped (the kernel swapped for an accepted one), the
    // quote made over what was really measured: the replay does not match.
    let mut h = Host::new(&mut v, "e", true);
    h.measured_boot(boot_log(&[SHIM, NEW_KERNEL], INITRD, CMDLINE, 1), CMDLINE);
    if let Some((log, _)) = &mut h.boot_log {
        let kernel = log.events.iter_mut().rfind(|e| e.pcr == 4).unwrap();
        kernel.digests[0].1 = KERNEL.to_vec();
    }
    let r = ingest(&mut v, &h.next(lsm_guard).1);
    let (code, detail) = first(&r);
    assert_eq!(code, FindingCode::BootLogMismatch);
    assert!(detail.contains("PCR 4 quoted"), "{detail}");
    assert_eq!(r.guard, None);

    // No log at all: the boot is not judged, and the verdict says so.
    let mut h = Host::new(&mut v, "n", true);
    let r = ingest(&mut v, &h.next(lsm_guard).1);
    let (code, _) = first(&r);
    assert_eq!(code, FindingCode::BootLogMissing);
    assert_eq!(rot(&r), Status::Contraindicated);
}

#[test]
fn a_kernel_update_is_accepted_once_its_digest_is_in_the_set() {
    let log = || boot_log(&[SHIM, NEW_KERNEL], INITRD, CMDLINE, 1);
    let (mut before, _d) = verifier("tpm_ima", &boot_policy(&[KERNEL]));
    let mut h = Host::new(&mut before, "u", true);
    h.measured_boot(log(), CMDLINE);
    let r = ingest(&mut before, &h.next(lsm_guard).1);
    assert_eq!(first_code(&r), Some(FindingCode::BootComponentNotAccepted));
    // The same host, the same boot, under the policy with the new kernel added to the set.
    let (mut after, _d2) = verifier("tpm_ima", &boot_policy(&[KERNEL, NEW_KERNEL]));
    let mut h = Host::new(&mut after, "u", true);
    h.measured_boot(log(), CMDLINE);
    let r = ingest(&mut after, &h.next(lsm_guard).1);
    assert_eq!(tpm_codes(&r), vec![]);
    assert_eq!(rot(&r), Status::Affirming);
}

/// The verdict's root-of-trust aspect (the example statement's other aspects vary).
fn rot(r: &AttestationResult) -> Status {
    r.trustworthiness[&rackwarden_attest::result::Aspect::RootOfTrust]
}

fn first_code(r: &AttestationResult) -> Option<FindingCode> {
    tpm_codes(r).first().map(|c| c.0)
}

#[test]
fn a_grub_boot_is_judged_by_every_file_it_read() {
    use rackwarden_attest::tpm::boot::EV_IPL;
    use rackwarden_attest::tpm::eventlog::{LogEvent, TPM_ALG_SHA256};
    const GRUB: [u8; 32] = [0x67; 32];
    const GRUB_CFG: [u8; 32] = [0x0c; 32];
    // shim and GRUB in PCR 4; GRUB's file reads in PCR 9 (the kernel by its file SHA-256).
    let grub_log = |files: &[[u8; 32]]| {
        let mut log = boot_log(&[SHIM, GRUB], INITRD, CMDLINE, 1);
        for f in files {
            log.events.push(LogEvent {
                offset: 0,
                pcr: 9,
                event_type: EV_IPL,
                digests: vec![(TPM_ALG_SHA256, f.to_vec())],
                data: b"/a/file/name/the/replay/does/not/cover\0".to_vec(),
            });
        }
        log
    };
    let policy = format!(
        "{}boot_files = [\"{}\"]\n",
        boot_policy(&[KERNEL]).replace(
            &format!("loaders = [\"{}\"]", hex::encode(SHIM)),
            &format!(
                "loaders = [\"{}\", \"{}\"]",
                hex::encode(SHIM),
                hex::encode(GRUB)
            )
        ),
        hex::encode(GRUB_CFG)
    );
    let (mut v, _d) = verifier("tpm_ima", &policy);
    let mut judge = |name: &str, files: &[[u8; 32]]| {
        let mut h = Host::new(&mut v, name, true);
        h.measured_boot(grub_log(files), CMDLINE);
        let r = ingest(&mut v, &h.next(|_| {}).1);
        // The boot's own findings (a contraindicated boot also lowers the level granted).
        tpm_codes(&r)
            .into_iter()
            .filter(|c| c.0 != FindingCode::RootOfTrustBelowPolicy)
            .collect::<Vec<_>>()
    };
    assert_eq!(judge("ok", &[GRUB_CFG, KERNEL]), vec![]);
    // GRUB as the "kernel" would have hidden this: a kernel file nobody accepted.
    let codes = judge("evil", &[GRUB_CFG, NEW_KERNEL]);
    assert_eq!(codes.len(), 2, "{codes:?}");
    assert!(codes[0].2.contains(&hex::encode(NEW_KERNEL)), "{codes:?}");
    assert!(codes[1].2.contains("is an accepted kernel"), "{codes:?}");
    // An accepted kernel read, and an unaccepted file beside it.
    let codes = judge("extra", &[GRUB_CFG, KERNEL, [0xee; 32]]);
    assert_eq!(codes.len(), 1, "{codes:?}");
    assert_eq!(codes[0].0, FindingCode::BootComponentNotAccepted);
}

#[test]
fn a_command_line_extended_after_boot_proves_nothing() {
    use rackwarden_attest::result::GuardBasis;
    use rackwarden_attest::tpm::eventlog::{
        LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID, LogEvent, efi_load_options_digest,
    };
    let (mut v, _d) = verifier("tpm_ima", &boot_policy(&[KERNEL]));
    let real = "root=/dev/vda ro lsm=lockdown,yama ima_policy=tcb";
    // Root extends PCR 9 with the digest of a command line that enables bpf, adds the event
    // to the log, and ships that command line: the replay matches, the real one stays.
    let mut log = boot_log(&[SHIM, KERNEL], INITRD, real, 1);
    log.events.push(LogEvent::linux_tag(
        LINUX_EFI_LOAD_OPTIONS_EVENT_TAG_ID,
        b"tag\0",
        efi_load_options_digest(CMDLINE),
    ));
    let mut h = Host::new(&mut v, "x", true);
    h.measured_boot(log, CMDLINE);
    let r = ingest(&mut v, &h.next(lsm_guard).1);
    let codes = tpm_codes(&r);
    assert!(
        codes
            .iter()
            .any(|c| c.0 == FindingCode::BootComponentNotAccepted
                && c.2.contains(&hex::encode(efi_load_options_digest(real)))),
        "{codes:?}"
    );
    assert_eq!(r.guard, Some(GuardBasis::DaemonWord));
    // A required argument after `--` is init's, not the kernel's.
    let init_args = "root=/dev/vda ro -- ima_policy=tcb lsm=bpf";
    let mut h = Host::new(&mut v, "y", true);
    h.measured_boot(boot_log(&[SHIM, KERNEL], INITRD, init_args, 1), init_args);
    let codes = tpm_codes(&ingest(&mut v, &h.next(lsm_guard).1));
    assert!(
        codes.iter().any(|c| c.2.contains("lacks `ima_policy=tcb`")),
        "{codes:?}"
    );
}
