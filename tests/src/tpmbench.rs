//! `cargo xtask bench tpm`: what a TPM quote adds to each statement, on both sides.
//!
//! - Host: signing a statement alone (the anchor) against signing it, quoting its digest
//!   with the AK (swtpm here; a discrete TPM takes a few hundred ms) and encoding the IMA
//!   entries measured since the previous one.
//! - Verifier: ingesting the same statements without their quotes (the anchor) against
//!   ingesting them with quote, PCR and IMA replay checks.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use rackwarden::tpm::Tpm;
use rackwarden_attest::{
    dsse, keys,
    statement::{Challenge, GENESIS_PREV},
    tpm::{EventLog, ImaEntry, TpmSidecar, encode_ima_binary, replay_pcr10},
};
use rackwarden_verifier::{
    config::VerifierConfig,
    service::Verifier,
    store::{Store, TpmEnrollment},
};

use crate::tpm::SwTpm;

const STATEMENTS: u64 = 100;
const RACK: &str = "rack-bench";
const HOST: &str = "h1";

fn policy(dir: &std::path::Path, daemon: &[u8; 32]) -> rackwarden_verifier::config::Policy {
    let allowlist = dir.join("allowlist.txt");
    let lines: String = (0..STATEMENTS)
        .map(|i| format!("{}  /usr/bin/tool{i}\n", hex::encode(tool_digest(i))))
        .collect();
    std::fs::write(&allowlist, lines).unwrap_or_else(|e| panic!("{}: {e}", allowlist.display()));
    // AKs are enrolled in the store directly; the policy needs EK roots all the same.
    let roots = dir.join("ek-roots.pem");
    std::fs::write(
        &roots,
        "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let text = format!(
        "listen = \"127.0.0.1:1\"\ninsecure_http = true\ndatabase = \"/unused\"\n\n[policy]\nid = \"tpm-bench\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\nmax_residue_persistent = \"1024 TiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\nmin_root_of_trust = \"tpm_ima\"\n\n[policy.runtime]\ndaemon_digests = [\"{}\"]\nallowlist = \"{}\"\n\n[racks.{RACK}]\negress = \"10 MB/s\"\ningress = \"10 MB/s\"\n\n[tpm]\nek_roots = \"{}\"\n",
        hex::encode(daemon),
        allowlist.display(),
        roots.display()
    );
    VerifierConfig::parse(&dir.join("v.toml"), &text)
        .unwrap_or_else(|e| panic!("bench policy: {e}"))
        .policy
}

fn tool_digest(i: u64) -> [u8; 32] {
    let mut d = [0x70u8; 32];
    d[..8].copy_from_slice(&i.to_be_bytes());
    d
}

/// The envelopes made, each with its sidecar, and the time each way of making them took.
struct Made {
    envelopes: Vec<dsse::Envelope>,
    sign_only: Duration,
    sign_and_quote: Duration,
}

fn make_statements(tpm: &mut Tpm, key: &ed25519_dalek::SigningKey) -> Made {
    let daemon = [0xd0u8; 32];
    let mut ima = vec![
        ImaEntry::ima_ng("boot_aggregate", [0x11; 32]),
        ImaEntry::ima_ng("/usr/local/bin/rackwardend", daemon),
    ];
    for e in &ima {
        tpm.extend_pcr(10, e.sha256_bank_extend_value())
            .unwrap_or_else(|e| panic!("extending PCR 10: {e}"));
    }
    let mut shipped = 0usize;
    let mut prev = GENESIS_PREV.to_string();
    let (mut sign_only, mut sign_and_quote) = (Duration::ZERO, Duration::ZERO);
    let mut envelopes = Vec::new();
    for seq in 0..STATEMENTS {
        // One program runs per epoch: IMA measures it before the statement is made.
        let e = ImaEntry::ima_ng(&format!("/usr/bin/tool{seq}"), tool_digest(seq));
        tpm.extend_pcr(10, e.sha256_bank_extend_value())
            .unwrap_or_else(|e| panic!("extending PCR 10: {e}"));
        ima.push(e);
        let mut st = rackwarden_attest::schema::example_statement();
        st.predicate.rack_id = RACK.into();
        st.predicate.host_id = HOST.into();
        st.predicate.seq = seq;
        st.predicate.prev = prev.clone();
        st.predicate.challenge = Challenge::Unchallenged;
        st.predicate.next_key = None;
        let t = Instant::now();
        let body = st.to_json().unwrap();
        let mut env = dsse::sign(key, dsse::INTOTO_PAYLOAD_TYPE, &body);
        let digest = rackwarden_attest::sha3(&dsse::pae(&env.payload_type, &body));
        sign_only += t.elapsed();
        let q = tpm
            .quote(&digest, &rackwarden_attest::tpm::DEFAULT_QUOTE_PCRS)
            .unwrap_or_else(|e| panic!("quote: {e}"));
        let delta = encode_ima_binary(&ima[shipped..]);
        env.tpm = Some(TpmSidecar::new(
            &q.attest,
            &q.signature,
            &q.pcr_values,
            Some((shipped as u64, &delta)),
        ));
        sign_and_quote += t.elapsed();
        shipped = ima.len();
        prev = hex::encode(digest);
        envelopes.push(env);
    }
    // What the verifier will replay to, as a check that the bench measures honest quotes.
    assert_eq!(
        replay_pcr10([0; 32], &ima),
        tpm.read_pcrs(&[10]).unwrap_or_default()[&10]
    );
    Made {
        envelopes,
        sign_only,
        sign_and_quote,
    }
}

fn verifier(dir: &std::path::Path, key: &ed25519_dalek::SigningKey) -> Verifier {
    let store = Store::in_memory().unwrap_or_else(|e| panic!("store: {e}"));
    let mut v =
        Verifier::new(store, policy(dir, &[0xd0; 32])).unwrap_or_else(|e| panic!("verifier: {e}"));
    v.enroll(RACK, HOST, &keys::public_pem(&key.verifying_key()), 1)
        .unwrap_or_else(|e| panic!("enroll: {e}"));
    v
}

/// Median of three passes of ingesting `lines` into a fresh verifier made by `fresh`.
fn ingest_time(lines: &[Vec<u8>], fresh: impl Fn() -> Verifier) -> Duration {
    let mut passes: Vec<Duration> = (0..3)
        .map(|_| {
            let mut v = fresh();
            let t = Instant::now();
            for l in lines {
                v.ingest(l, 2).unwrap_or_else(|e| panic!("ingest: {e}"));
            }
            t.elapsed()
        })
        .collect();
    passes.sort();
    passes[1]
}

pub fn bench_tpm() {
    println!("== bench tpm: a quote beside every statement (swtpm), and its appraisal ==");
    let swtpm = SwTpm::start();
    let dir = swtpm.dir.join("bench");
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let mut tpm = Tpm::open(&swtpm.tcti).unwrap_or_else(|e| panic!("opening swtpm: {e}"));
    tpm.ek().unwrap_or_else(|e| panic!("EK: {e}"));
    let ak = tpm
        .load_or_create_ak(&dir.join("ak.json"))
        .unwrap_or_else(|e| panic!("AK: {e}"));
    let key = keys::generate();
    let made = make_statements(&mut tpm, &key);
    let n = STATEMENTS as f64;
    let per = |d: Duration| d.as_secs_f64() * 1e3 / n;
    println!("{:<58} {:>10} {:>10} {:>8}", "", "ours", "anchor", "ratio");
    println!(
        "{:<58} {:>7.3} ms {:>7.3} ms {:>7.1}x",
        "host: sign + quote + IMA delta vs sign alone, per statement",
        per(made.sign_and_quote),
        per(made.sign_only),
        made.sign_and_quote.as_secs_f64() / made.sign_only.as_secs_f64()
    );

    let with: Vec<Vec<u8>> = made
        .envelopes
        .iter()
        .map(|e| e.to_json().unwrap())
        .collect();
    let without: Vec<Vec<u8>> = made
        .envelopes
        .iter()
        .map(|e| {
            let mut e = e.clone();
            e.tpm = None;
            e.to_json().unwrap()
        })
        .collect();
    let enrollment = TpmEnrollment {
        rack: RACK.into(),
        host: HOST.into(),
        ak_public: hex::encode(&ak.public),
        ak_name: hex::encode(&ak.name),
        ek_public: String::new(),
        ek_certificate: None,
        ek_issuer: "bench".into(),
        enrolled_ms: 1,
    };
    let t_with = ingest_time(&with, || {
        let v = verifier(&dir, &key);
        v.store
            .enroll_tpm(&enrollment)
            .unwrap_or_else(|e| panic!("enrolling the AK: {e}"));
        v
    });
    let t_without = ingest_time(&without, || verifier(&dir, &key));
    // Sanity: the quoted statements were judged tpm_ima, so the bench timed the full check.
    let mut v = verifier(&dir, &key);
    v.store
        .enroll_tpm(&enrollment)
        .unwrap_or_else(|e| panic!("{e}"));
    let levels: BTreeMap<String, usize> = with
        .iter()
        .filter_map(|l| v.ingest(l, 2).ok()?.result?.root_of_trust)
        .fold(BTreeMap::new(), |mut m, l| {
            *m.entry(l.name().to_string()).or_default() += 1;
            m
        });
    println!(
        "{:<58} {:>7.3} ms {:>7.3} ms {:>7.2}x",
        "verifier: ingest with quote+PCR+IMA checks vs without",
        per(t_with),
        per(t_without),
        t_with.as_secs_f64() / t_without.as_secs_f64()
    );
    println!(
        "levels granted to the {} quoted statements: {levels:?}; sidecar adds {} bytes to an envelope of {}",
        STATEMENTS,
        with[1].len() - without[1].len(),
        without[1].len()
    );
    bench_boot_log();
}

/// A UEFI boot's event log as hardware with Secure Boot writes it for Debian's shim and
/// GRUB 2.06 (the guests' logs are smaller: 24 events from OVMF's direct boot, 48 from the
/// secure-boot group's shim and GRUB): firmware blobs, the boot variables, PCR 7's Secure
/// Boot databases (a 16 KiB dbx), shim, GRUB and the kernel, GRUB's commands with the
/// kernel's command line last among them (PCR 8, each digest the hash of the text after its
/// label, so the verifier hashes each string once more to read it) and the files it read
/// (PCR 9). `cmdline` is `linux`'s arguments: the kernel's `/proc/cmdline` is
/// `BOOT_IMAGE=` and this.
fn uefi_log(cmdline: &str) -> EventLog {
    use rackwarden_attest::tpm::boot::{EV_IPL, encode_variable, secure_boot_variable_guid};
    use rackwarden_attest::tpm::eventlog::*;
    use sha2::Digest as _;
    let mut log = EventLog::new_sha256();
    let mut push = |pcr: u32, event_type: u32, data: Vec<u8>, measured: Option<&str>| {
        let d = match measured {
            Some(text) => sha2::Sha256::digest(text.as_bytes()).to_vec(),
            None => sha2::Sha256::digest(&data).to_vec(),
        };
        log.events.push(LogEvent {
            offset: 0,
            pcr,
            event_type,
            digests: vec![(TPM_ALG_SHA256, d)],
            data,
        });
    };
    for i in 0..10u8 {
        push(0, EV_EFI_PLATFORM_FIRMWARE_BLOB, vec![i; 16], None);
    }
    for i in 0..20u8 {
        push(1, EV_EFI_VARIABLE_BOOT, vec![i; 200], None);
    }
    for (name, size) in [
        ("SecureBoot", 1),
        ("PK", 900),
        ("KEK", 1600),
        ("db", 3200),
        ("dbx", 16 * 1024),
    ] {
        let value = vec![1u8; size];
        push(
            7,
            EV_EFI_VARIABLE_DRIVER_CONFIG,
            encode_variable(secure_boot_variable_guid(name), name, &value),
            None,
        );
    }
    push(5, EV_EFI_GPT_EVENT, vec![0; 600], None);
    for i in 0..4u8 {
        push(4, EV_EFI_BOOT_SERVICES_APPLICATION, vec![i; 120], None);
    }
    // GRUB's strings: what it ran, then `linux` and the kernel's command line, then the
    // initrd and `boot`.
    let linux = format!("linux {cmdline}");
    let mut strings: Vec<(&str, String)> = (0..56)
        .map(|i| ("grub_cmd: ", format!("set var{i}=value{i}")))
        .collect();
    strings.extend([
        ("grub_cmd: ", linux),
        ("kernel_cmdline: ", cmdline.to_string()),
        ("grub_cmd: ", "initrd /initrd.img".to_string()),
        ("grub_cmd: ", "boot".to_string()),
    ]);
    for (label, text) in &strings {
        push(
            8,
            EV_IPL,
            format!("{label}{text}\0").into_bytes(),
            Some(text.as_str()),
        );
    }
    for i in 0..10 {
        push(
            9,
            EV_IPL,
            format!("/boot/grub/x86_64-efi/mod{i}.mod\0").into_bytes(),
            None,
        );
    }
    for pcr in 0..8 {
        push(pcr, EV_SEPARATOR, vec![0; 4], None);
    }
    log
}

/// The verifier's work on a boot log, once per boot: decode the sidecar's base64, parse,
/// replay to PCRs 0-9 against the quote, read what was measured. Anchor: SHA-256 of the
/// log's bytes (one pass over them; the replay hashes each event's digest once more).
fn bench_boot_log() {
    use rackwarden_attest::tpm::{BootEvidence, MeasuredBoot, decode_boot_log, replay_differences};
    use sha2::Digest as _;
    let args =
        "/vmlinuz root=/dev/sda1 ro lsm=lockdown,capability,yama,bpf,integrity ima_policy=tcb";
    let log = uefi_log(args);
    let cmdline = &format!("BOOT_IMAGE={args}");
    let bytes = log.to_bytes();
    let evidence = BootEvidence::new(&bytes, cmdline);
    let quoted = log.replay_sha256().unwrap_or_else(|e| panic!("{e}"));
    // The whole reading: GRUB's command line is proven (every PCR 8 string hashed again).
    assert!(
        matches!(
            MeasuredBoot::read(&log, cmdline).cmdline,
            rackwarden_attest::tpm::MeasuredCmdline::Measured {
                by: rackwarden_attest::tpm::CmdlineWitness::Grub,
                ..
            }
        ),
        "the bench's log must prove GRUB's command line"
    );
    // Rounds taken in turn, anchor first and last (anchor, ours, anchor, ...): each round
    // of ours against the anchors on both sides (`Bracketed`), medians printed.
    const PER_ROUND: u32 = 50;
    const ROUNDS: usize = 41;
    let ours_round = || {
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            let l = decode_boot_log(&evidence).unwrap_or_else(|e| panic!("{e}"));
            let differ = replay_differences(&l, &quoted).unwrap_or_else(|e| panic!("{e}"));
            assert!(differ.is_empty());
            std::hint::black_box(MeasuredBoot::read(&l, cmdline));
        }
        t.elapsed().as_secs_f64() / f64::from(PER_ROUND)
    };
    let anchor_round = || {
        let t = Instant::now();
        for _ in 0..PER_ROUND {
            std::hint::black_box(sha2::Sha256::digest(std::hint::black_box(&bytes)));
        }
        t.elapsed().as_secs_f64() / f64::from(PER_ROUND)
    };
    let rounds: Vec<f64> = (0..ROUNDS)
        .map(|i| {
            if i % 2 == 1 {
                ours_round()
            } else {
                anchor_round()
            }
        })
        .collect();
    let ratios = crate::benchstats::Bracketed::new(&rounds, |i| i % 2 == 1, |i| i % 2 == 0);
    let mut ours: Vec<f64> = rounds.iter().skip(1).step_by(2).copied().collect();
    let mut anchor: Vec<f64> = rounds.iter().step_by(2).copied().collect();
    println!(
        "{:<58} {:>7.3} ms {:>7.3} ms {:>7.1}x",
        format!(
            "verifier: a boot log ({} events, {} KiB) vs its SHA-256",
            log.events.len(),
            bytes.len() / 1024
        ),
        crate::benchstats::median(&mut ours) * 1e3,
        crate::benchstats::median(&mut anchor) * 1e3,
        ratios.median()
    );
    println!(
        "  boot log replay and reading / SHA-256 of its bytes: {}",
        ratios.describe()
    );
    println!(
        "the boot log goes once per boot: {} bytes of base64 in the first statement's sidecar",
        evidence.log.len()
    );
}
