//! The envelope bytes and the chain digest for a fixed statement and key, pinned: a change
//! to how statements are serialized, signed or enveloped must not change a single byte.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use ed25519_dalek::SigningKey;
use rackwarden_attest::{
    dsse::{self, INTOTO_PAYLOAD_TYPE},
    evidence::*,
    statement::*,
};

fn statement(seq: u64, prev: String) -> Statement {
    let mut digest = BTreeMap::new();
    digest.insert(IMAGE_DIGEST.to_string(), "ab".repeat(32));
    Statement::new(
        vec![Subject {
            name: "image \"quoted\" \\ é\n".into(),
            digest,
        }],
        EpochPredicate {
            rack_id: "rack-a17".into(),
            host_id: "host-03".into(),
            seq,
            prev,
            challenge: Challenge::Nonce {
                nonce: "cd".repeat(32),
            },
            epoch_start_unix_ms: 1_796_000_000_000,
            epoch_end_unix_ms: 1_796_000_900_000,
            limiter: LimiterReport::Absent {
                finding: "no limiter <&> \u{1}".into(),
            },
            wipe: None,
            images: None,
            incidents: vec![],
            epoch: None,
            producer: ProducerIdentity {
                name: "rackwarden".into(),
                version: "1.2.3".into(),
                binary_sha3_256: "ef".repeat(32),
            },
            next_key: None,
            root_of_trust: None,
            storage: None,
            traffic: None,
            openings: Vec::new(),
        },
    )
}

/// Two chained envelopes: (envelope JSON, hex chain digest) each.
fn chain() -> Vec<(Vec<u8>, String)> {
    let key = SigningKey::from_bytes(&[7u8; 32]);
    let mut prev = GENESIS_PREV.to_string();
    let mut out = Vec::new();
    for seq in 0..2 {
        let body = statement(seq, prev.clone()).to_json().unwrap();
        let env = dsse::sign(&key, INTOTO_PAYLOAD_TYPE, &body);
        let line = env.to_json().unwrap();
        let v = dsse::verify(&line, &key.verifying_key(), INTOTO_PAYLOAD_TYPE).unwrap();
        assert_eq!(v.payload, body);
        prev = hex::encode(v.pae_sha3);
        assert_eq!(
            prev,
            hex::encode(rackwarden_attest::sha3(&dsse::pae(
                INTOTO_PAYLOAD_TYPE,
                &body
            )))
        );
        assert!(line.starts_with(b"{\"payload\":\"eyJfdHlwZSI6"));
        let back = Statement::from_verified(&v.payload).unwrap();
        assert_eq!(back, statement(seq, back.predicate.prev.clone()));
        out.push((line, prev.clone()));
    }
    out
}

#[test]
fn envelope_bytes_for_a_fixed_statement_and_key_are_unchanged() {
    let got = chain();
    // Captured before the sign and verify paths were trimmed (issue 23).
    let want: [(&str, &str); 2] = [
        (
            "4ccb81cb0d4146fb411dbdf747763d5caa27c0f4e14eadc3798fb5607e015f21",
            "19aad5f2436521cbeb83fc2becf55972325bb1a1c1cb9a5a1035694983c07986",
        ),
        (
            "17110fa9c3ab5b18fe683adc24cc19445e111baf0f891bc5238bb944eaa56f7b",
            "814a46ec5bb4201a2ec44091943f73b2dbb959a823eb14fdb4468d426e4f2bfb",
        ),
    ];
    for ((line, digest), (want_line, want_digest)) in got.iter().zip(want) {
        assert_eq!(hex::encode(rackwarden_attest::sha3(line)), want_line);
        assert_eq!(digest, want_digest);
    }
}
