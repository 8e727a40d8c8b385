//! Round trips and every tamper case named in the evidence issue, each with its specific
//! finding; a property test that random logs verify and any one-byte change is detected.

// Test code: a panic here is a failed test, so unwrap and expect are fine in helpers too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ed25519_dalek::SigningKey;
use proptest::prelude::*;
use rackwarden_attest::{
    dsse::{self, INTOTO_PAYLOAD_TYPE},
    evidence::*,
    evidence_log::EvidenceLog,
    keys,
    statement::*,
    verify::{Finding, Verdict, verify_log},
};

fn predicate(seq: u64, prev: String, start: u64, end: u64) -> EpochPredicate {
    EpochPredicate {
        rack_id: "rack-a17".into(),
        host_id: "host-03".into(),
        seq,
        prev,
        challenge: Challenge::Unchallenged,
        epoch_start_unix_ms: start,
        epoch_end_unix_ms: end,
        limiter: LimiterReport::Absent {
            finding: "test".into(),
        },
        wipe: None,
        images: None,
        incidents: vec![],
        epoch: None,
        producer: ProducerIdentity {
            name: "test".into(),
            version: "0".into(),
            binary_sha3_256: "00".into(),
        },
        next_key: None,
        root_of_trust: None,
        storage: None,
        traffic: None,
        openings: Vec::new(),
    }
}

/// A valid log of `n` statements, one line each.
fn make_log(key: &SigningKey, n: u64) -> Vec<Vec<u8>> {
    let mut prev = GENESIS_PREV.to_string();
    let mut lines = Vec::new();
    for seq in 0..n {
        let st = Statement::new(
            vec![],
            predicate(seq, prev.clone(), 1000 * seq, 1000 * seq + 999),
        );
        let body = st.to_json().unwrap();
        let env = dsse::sign(key, INTOTO_PAYLOAD_TYPE, &body);
        prev = hex::encode(rackwarden_attest::sha3(&dsse::pae(
            INTOTO_PAYLOAD_TYPE,
            &body,
        )));
        let mut l = env.to_json().unwrap();
        l.push(b'\n');
        lines.push(l);
    }
    lines
}

/// One signed log line (with its newline) for `p`.
fn signed_line(key: &SigningKey, p: EpochPredicate) -> Vec<u8> {
    let st = Statement::new(vec![], p);
    let mut l = dsse::sign(key, INTOTO_PAYLOAD_TYPE, &st.to_json().unwrap())
        .to_json()
        .unwrap();
    l.push(b'\n');
    l
}

fn join(lines: &[Vec<u8>]) -> Vec<u8> {
    lines.concat()
}

fn findings(log: &[u8], key: &SigningKey) -> Vec<(usize, Finding)> {
    let r = verify_log(log, &key.verifying_key());
    r.lines
        .iter()
        .flat_map(|l| l.findings.iter().map(move |f| (l.line, f.clone())))
        .collect()
}

#[test]
fn round_trip() {
    let k = keys::generate();
    let log = join(&make_log(&k, 5));
    let r = verify_log(&log, &k.verifying_key());
    assert!(r.ok());
    assert_eq!(r.statements_ok, 5);
    assert!(r.lines.iter().all(|l| l.verdict == Verdict::Pass));
}

/// Flips one byte inside a JSON string field's value of line `i`.
fn flip_in_field(line: &[u8], field: &str) -> Vec<u8> {
    let key = format!("\"{field}\":\"");
    let s = String::from_utf8(line.to_vec()).unwrap();
    let at = s.find(&key).unwrap() + key.len() + 3;
    let mut out = line.to_vec();
    out[at] = if out[at] == b'A' { b'B' } else { b'A' };
    out
}

/// The findings for the log made of `lines`.
fn case(k: &SigningKey, lines: Vec<Vec<u8>>) -> Vec<(usize, Finding)> {
    findings(&join(&lines), k)
}

#[test]
fn each_tamper_case_has_its_finding() {
    let k = keys::generate();
    let lines = make_log(&k, 4);
    envelope_tampering_is_caught(&k, &lines);
    reordered_dropped_and_repeated_lines_are_caught(&k, &lines);
    a_foreign_key_and_a_fork_are_caught(&k, &lines);
    a_broken_prev_and_time_backwards_are_caught(&k, &lines);
    a_torn_tail_names_its_byte_offset(&k, &lines);
}

/// A flipped byte in the payload, the signature or the payload type.
fn envelope_tampering_is_caught(k: &SigningKey, lines: &[Vec<u8>]) {
    let mut l = lines.to_vec();
    l[1] = flip_in_field(&l[1], "payload");
    assert!(matches!(
        case(k, l)[0],
        (2, Finding::BadSignature) | (2, Finding::BadBase64 { .. }) | (2, Finding::BadJson { .. })
    ));

    let mut l = lines.to_vec();
    l[1] = flip_in_field(&l[1], "sig");
    assert!(matches!(case(k, l)[0], (2, Finding::BadSignature)));

    let mut l = lines.to_vec();
    l[1] = flip_in_field(&l[1], "payloadType");
    assert!(matches!(
        case(k, l)[0],
        (2, Finding::WrongPayloadType { .. })
    ));
}

/// Two lines swapped, one removed, one repeated.
fn reordered_dropped_and_repeated_lines_are_caught(k: &SigningKey, lines: &[Vec<u8>]) {
    let mut l = lines.to_vec();
    l.swap(1, 2);
    let f = case(k, l);
    assert!(
        f.iter().any(|x| matches!(
            x,
            (
                2,
                Finding::SeqGap {
                    expected: 1,
                    found: 2
                }
            )
        )),
        "{f:?}"
    );
    assert!(
        f.iter().any(|x| matches!(
            x,
            (
                3,
                Finding::SeqOutOfOrder {
                    expected: 3,
                    found: 1
                }
            )
        )),
        "{f:?}"
    );

    let mut l = lines.to_vec();
    l.remove(1);
    assert!(matches!(
        case(k, l)[..],
        [(
            2,
            Finding::SeqGap {
                expected: 1,
                found: 2
            }
        )]
    ));

    let mut l = lines.to_vec();
    l.insert(2, l[1].clone());
    assert!(matches!(
        case(k, l)[..],
        [(
            3,
            Finding::DuplicateSeq {
                seq: 1,
                first_line: 2
            }
        )]
    ));
}

/// A line signed by another key; a second statement for a seq already seen.
fn a_foreign_key_and_a_fork_are_caught(k: &SigningKey, lines: &[Vec<u8>]) {
    let other = keys::generate();
    let mut l = lines.to_vec();
    l[2] = make_log(&other, 3)[2].clone();
    assert!(matches!(case(k, l)[0], (3, Finding::WrongKey { .. })));

    // A different statement with the same seq, correctly signed: a fork.
    let mut l = lines.to_vec();
    let alt = signed_line(k, predicate(1, "ab".repeat(32), 5, 6));
    l.push(alt);
    let f = case(k, l);
    assert!(
        f.iter().any(|x| matches!(
            x,
            (
                5,
                Finding::Fork {
                    seq: 1,
                    first_line: 2
                }
            )
        )),
        "{f:?}"
    );
}

/// Correctly signed statements that do not link, or go back in time.
fn a_broken_prev_and_time_backwards_are_caught(k: &SigningKey, lines: &[Vec<u8>]) {
    // A correctly signed statement whose prev does not link.
    let mut l = lines[..2].to_vec();
    let bad = signed_line(k, predicate(2, "cd".repeat(32), 3000, 3999));
    l.push(bad);
    assert!(matches!(case(k, l)[..], [(3, Finding::BrokenPrev { .. })]));

    // Time going backwards.
    let mut l = lines[..2].to_vec();
    let prev = {
        let r = verify_log(&join(&l), &k.verifying_key());
        assert!(r.ok());
        let body = &l[1];
        let v = dsse::verify(
            &body[..body.len() - 1],
            &k.verifying_key(),
            INTOTO_PAYLOAD_TYPE,
        )
        .unwrap();
        hex::encode(v.pae_sha3)
    };
    let back = signed_line(k, predicate(2, prev, 10, 20));
    l.push(back);
    assert!(matches!(
        case(k, l)[..],
        [(3, Finding::TimeBackwards { .. })]
    ));
}

/// Truncate the last line mid-way.
fn a_torn_tail_names_its_byte_offset(k: &SigningKey, lines: &[Vec<u8>]) {
    let mut log = join(lines);
    log.truncate(log.len() - 40);
    let f = findings(&log, k);
    assert!(matches!(f[..], [(4, Finding::TornTail { .. })]), "{f:?}");
    let r = verify_log(&log, &k.verifying_key());
    assert_eq!(
        r.lines[3].offset as usize,
        join(&lines[..3]).len(),
        "finding names the byte offset"
    );
}

#[test]
fn torn_tail_is_kept_disclosed_and_the_chain_continues() {
    let k = keys::generate();
    let dir = std::env::temp_dir().join(format!("rw-log-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("evidence.jsonl");
    let lines = make_log(&k, 3);
    let mut bytes = join(&lines);
    let cut = bytes.len() - 30;
    bytes.truncate(cut);
    std::fs::write(&path, &bytes).unwrap();

    let mut log = EvidenceLog::open(&path, &k.verifying_key()).unwrap();
    assert_eq!(
        log.next_link().0,
        2,
        "continues after the last good statement (seq 1)"
    );
    let torn_offset = join(&lines[..2]).len() as u64;
    assert!(
        matches!(log.pending_incidents[..], [Incident::TornLogTail { offset, .. }] if offset == torn_offset)
    );
    // The torn bytes are still there, byte for byte.
    assert_eq!(&std::fs::read(&path).unwrap()[..cut], &bytes[..]);

    let (seq, prev) = log.next_link();
    let mut p = predicate(seq, prev, 3000, 3999);
    p.incidents = log.pending_incidents.clone();
    let st = Statement::new(vec![], p);
    let env = dsse::sign(&k, INTOTO_PAYLOAD_TYPE, &st.to_json().unwrap());
    log.append(&env, &st).unwrap();
    drop(log);

    let r = verify_log(&std::fs::read(&path).unwrap(), &k.verifying_key());
    assert!(r.ok(), "{:?}", r.lines);
    assert_eq!(r.warnings, 1);
    assert_eq!(
        r.lines[2].findings,
        vec![Finding::DisclosedDamage {
            disclosed_by_seq: 2
        }]
    );
    // Reopening: the disclosed incident is not reported again; the chain goes on.
    let log = EvidenceLog::open(&path, &k.verifying_key()).unwrap();
    assert!(log.pending_incidents.is_empty());
    assert_eq!(log.next_link().0, 3);
    std::fs::remove_dir_all(&dir).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_logs_verify(n in 1u64..12) {
        let k = keys::generate();
        prop_assert!(verify_log(&join(&make_log(&k, n)), &k.verifying_key()).ok());
    }

    #[test]
    fn any_single_byte_mutation_is_detected(n in 1u64..5, pos in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let k = keys::generate();
        let mut log = join(&make_log(&k, n));
        let i = pos.index(log.len());
        prop_assume!(log[i] != byte);
        log[i] = byte;
        let r = verify_log(&log, &k.verifying_key());
        prop_assert!(!r.ok(), "mutation at {} to {:#x} not detected", i, byte);
    }
}

/// Three statements: seq 0 by `a`, seq 1 by `a` naming `b` as its next key, seq 2 by
/// `third` (the key that should be `b`).
fn rotated_log(a: &SigningKey, b: &SigningKey, third: &SigningKey) -> Vec<u8> {
    let mut prev = GENESIS_PREV.to_string();
    let mut lines = Vec::new();
    for (seq, key) in [(0u64, a), (1, a), (2, third)] {
        let mut p = predicate(seq, prev.clone(), 1000 * seq, 1000 * seq + 999);
        if seq == 1 {
            p.next_key = Some(NextKey {
                keyid: keys::keyid(&b.verifying_key()),
                public_key_pem: keys::public_pem(&b.verifying_key()),
            });
        }
        let body = Statement::new(vec![], p).to_json().unwrap();
        prev = hex::encode(rackwarden_attest::sha3(&dsse::pae(
            INTOTO_PAYLOAD_TYPE,
            &body,
        )));
        let mut l = dsse::sign(key, INTOTO_PAYLOAD_TYPE, &body)
            .to_json()
            .unwrap();
        l.push(b'\n');
        lines.push(l);
    }
    join(&lines)
}

#[test]
fn a_log_verifies_across_a_key_rotation_from_its_first_key() {
    let (a, b) = (keys::generate(), keys::generate());
    let r = verify_log(&rotated_log(&a, &b, &b), &a.verifying_key());
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.statements_ok, 3);
    // The old key after the statement that rotated away from it: a failure.
    let r = verify_log(&rotated_log(&a, &b, &a), &a.verifying_key());
    assert!(!r.ok());
    assert!(
        matches!(r.lines[2].findings[..], [Finding::WrongKey { .. }]),
        "{:?}",
        r.lines[2]
    );
    // The log of a rotated host opens with its keys, the chain's tip naming no next key.
    let dir = std::env::temp_dir().join(format!("rw-rotlog-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("evidence.jsonl");
    std::fs::write(&path, rotated_log(&a, &b, &b)).unwrap();
    let log = EvidenceLog::open_with_keys(&path, &[a.verifying_key(), b.verifying_key()]).unwrap();
    assert_eq!(log.next_link().0, 3);
    assert!(log.pending_incidents.is_empty());
    assert_eq!(log.tip_next_keyid, None);
    let _ = std::fs::remove_dir_all(&dir);
}
