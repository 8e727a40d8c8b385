//! Our envelopes and statements as the in-toto tooling sees them: the Python
//! `securesystemslib` verifies the DSSE envelope with the host's ed25519 key, and the
//! `in-toto-attestation` library parses and validates the Statement v1 inside. Both are
//! installed, pinned, into a virtual environment by `cargo xtask setup`, which names its
//! interpreter in `RACKWARDEN_INTOTO_PYTHON`.
//!
//! The statement without a subject is there to show that the check can fail: the library
//! refuses it ("At least one subject required"), which is why every statement we sign has
//! at least one subject (the host itself when no image was loaded).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, process::Command};

use rackwarden_attest::{
    dsse::{self, INTOTO_PAYLOAD_TYPE},
    keys,
    schema::example_statement,
    statement::{Statement, Subject},
};

const CHECK: &str = r#"
import json, sys
from securesystemslib.dsse import Envelope
from securesystemslib.signer import SSlibKey
from google.protobuf import json_format
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

envelope_path, public_hex, keyid = sys.argv[1:4]
env = Envelope.from_dict(json.load(open(envelope_path)))
key = SSlibKey(keyid, "ed25519", "ed25519", {"public": public_hex})
env.verify([key], 1)
assert env.payload_type == "application/vnd.in-toto+json", env.payload_type
pb = json_format.Parse(env.pae()[len(b"DSSEv1 "):].split(b" ", 3)[3], statement_pb2.Statement())
Statement.copy_from_pb(pb).validate()
print("in-toto: ok", len(pb.subject), "subject(s)")
"#;

fn python() -> String {
    std::env::var("RACKWARDEN_INTOTO_PYTHON").unwrap_or_else(|_| {
        panic!(
            "RACKWARDEN_INTOTO_PYTHON is not set: `cargo xtask setup` installs the in-toto \
             libraries into a virtual environment and names its python there (run the suite \
             with `cargo xtask test`)"
        )
    })
}

/// Signs `st`, runs the Python check on it; its exit status and output.
fn check(st: &Statement) -> (bool, String) {
    let key = keys::generate();
    let env = dsse::sign(&key, INTOTO_PAYLOAD_TYPE, &st.to_json().unwrap());
    check_envelope(&env, &key.verifying_key())
}

/// Runs the Python check on `env` with the host key `vk`; its exit status and output.
fn check_envelope(env: &dsse::Envelope, vk: &ed25519_dalek::VerifyingKey) -> (bool, String) {
    let dir = std::env::temp_dir().join(format!("rw-intoto-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}.json", keys::keyid(vk)));
    std::fs::write(&path, env.to_json().unwrap()).unwrap();
    let out = Command::new(python())
        .arg("-c")
        .arg(CHECK)
        .arg(&path)
        .arg(hex::encode(vk.as_bytes()))
        .arg(keys::keyid(vk))
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", python()));
    let _ = std::fs::remove_file(&path);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn a_statement_with_images_is_accepted_by_in_toto() {
    let (ok, out) = check(&example_statement());
    assert!(ok, "{out}");
    assert!(out.contains("in-toto: ok 1 subject(s)"), "{out}");
}

#[test]
fn a_statement_without_images_names_its_host_and_is_accepted() {
    let mut st = example_statement();
    let key = keys::generate();
    st.subject = vec![Subject::host(
        &st.predicate.rack_id,
        &st.predicate.host_id,
        &key.verifying_key(),
    )];
    st.predicate.images = None;
    let (ok, out) = check(&st);
    assert!(ok, "{out}");
}

#[test]
fn a_statement_without_a_subject_is_refused_by_in_toto() {
    let mut st = example_statement();
    st.subject.clear();
    let (ok, out) = check(&st);
    assert!(!ok, "{out}");
    assert!(out.contains("At least one subject required"), "{out}");
    // And a subject without a digest.
    st.subject = vec![Subject {
        name: "host".into(),
        digest: BTreeMap::new(),
    }];
    let (ok, out) = check(&st);
    assert!(!ok, "{out}");
    assert!(out.contains("At least one digest required"), "{out}");
}

#[test]
fn a_tampered_envelope_is_refused_by_securesystemslib() {
    let key = keys::generate();
    let vk = key.verifying_key();
    let mut env = dsse::sign(
        &key,
        INTOTO_PAYLOAD_TYPE,
        &example_statement().to_json().unwrap(),
    );
    // Another body under the same signature.
    env.payload = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(b"{\"_type\":\"x\"}")
    };
    let (ok, out) = check_envelope(&env, &vk);
    assert!(!ok);
    assert!(out.contains("VerificationError"), "{out}");
}
