//! Host key rotation end to end: a real `rackwardend` signs epochs with its first key,
//! `rackwarden keygen --rotate` makes the next one, the daemon's next statement (signed with
//! the old key) names it, and every later statement is signed with it; the real verifier
//! (TLS) takes the new key from that statement on with no re-enrollment, the chain
//! continuing, and refuses a later statement signed with the old key.

use std::{path::Path, process::Command, time::Duration};

use rackwarden_attest::{
    dsse::{self, INTOTO_PAYLOAD_TYPE},
    keys,
    statement::{Challenge, Statement},
};
use rackwarden_tests::{
    Daemon, Net, bin,
    epoch::{
        EpochFixture, Verifier, ids, predicate_of, verify_log, wait_epoch, wipe_now,
        write_epoch_config,
    },
};

/// The keyid each stored envelope's signature names.
fn signer(row: &serde_json::Value) -> String {
    let env: serde_json::Value = serde_json::from_str(row["envelope"].as_str().unwrap()).unwrap();
    env["signatures"][0]["keyid"].as_str().unwrap().to_string()
}

fn epoch_delivered(sock: &Path, seq: u64) -> serde_json::Value {
    wait_epoch(
        sock,
        Duration::from_secs(90),
        &format!("seq {seq} delivered"),
        |e| e["delivery"]["delivered_seq"] == seq,
    )
}

/// `rackwarden keygen --rotate` in the key directory; the new keyid.
fn keygen_rotate(keys_dir: &Path) -> String {
    let out = Command::new(bin("rackwarden"))
        .args(["keygen", "--rotate", "--name", "host", "--out"])
        .arg(keys_dir)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text.lines()
        .find_map(|l| l.strip_prefix("keyid:"))
        .map(|k| k.trim().to_string())
        .unwrap_or_else(|| panic!("no keyid in {text}"))
}

/// The statement after the log's last one, signed with `key` (what a host that kept
/// signing with its old key would send).
fn next_statement_signed_with(log: &Path, key: &ed25519_dalek::SigningKey) -> Vec<u8> {
    next_statement(log, key, None)
}

/// The statement after the log's last one, unchallenged and with no wipe or images,
/// naming `next_key`, signed with `key`.
fn next_statement(
    log: &Path,
    key: &ed25519_dalek::SigningKey,
    next_key: Option<rackwarden_attest::statement::NextKey>,
) -> Vec<u8> {
    use base64::Engine as _;
    let text = std::fs::read_to_string(log).unwrap();
    let last: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    let body = base64::engine::general_purpose::STANDARD
        .decode(last["payload"].as_str().unwrap())
        .unwrap();
    let mut st: Statement = serde_json::from_slice(&body).unwrap();
    let p = &mut st.predicate;
    p.seq += 1;
    p.prev = hex::encode(rackwarden_attest::sha3(&dsse::pae(
        INTOTO_PAYLOAD_TYPE,
        &body,
    )));
    p.challenge = Challenge::Unchallenged;
    // It ends now, not in the future: the daemon's next epoch starts after it.
    p.epoch_start_unix_ms = p.epoch_end_unix_ms;
    p.epoch_end_unix_ms = rackwarden_attest::now_ms().max(p.epoch_start_unix_ms);
    p.next_key = next_key;
    p.wipe = None;
    p.images = None;
    p.incidents.clear();
    dsse::sign(key, INTOTO_PAYLOAD_TYPE, &st.to_json().unwrap())
        .to_json()
        .unwrap()
}

#[test]
fn the_host_rotates_its_key_and_the_verifier_follows_without_reenrollment() {
    let net = Net::new("rotate");
    let fx = EpochFixture::new(&net.dir, 1 << 20);
    let mut verifier = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    let (rack, host) = ids(&net);
    verifier.enroll(&rack, &host, &fx.host_pub);
    verifier.start();
    let sections = fx.sections(&verifier.daemon_lines(), "1 h", "32 MiB");
    let cfg = write_epoch_config(&net, &sections);
    let sock = net.socket_path();
    let keys_dir = fx.host_key.parent().unwrap().to_path_buf();
    let old_key = keys::load_signing_key(&fx.host_key).unwrap();
    let old_id = keys::keyid(&old_key.verifying_key());
    let _d = Daemon::start(&cfg, &sock);

    // Epochs 0 and 1 with the first key.
    let st = epoch_delivered(&sock, 0);
    assert_eq!(st["epoch"]["keyid"], old_id.as_str());
    wipe_now(&sock);
    epoch_delivered(&sock, 1);

    // Rotate: the status shows it pending; the next statement names the new key.
    let new_id = keygen_rotate(&keys_dir);
    wait_epoch(&sock, Duration::from_secs(10), "rotation pending", |e| {
        e["next_keyid"] == new_id.as_str()
    });
    for seq in 2..=4 {
        wipe_now(&sock);
        epoch_delivered(&sock, seq);
    }
    let st = epoch_delivered(&sock, 4);
    assert_eq!(st["epoch"]["keyid"], new_id.as_str(), "{:#}", st["epoch"]);
    assert!(st["epoch"]["next_keyid"].is_null(), "{:#}", st["epoch"]);

    let h = verifier.history(&rack, &host);
    assert_eq!(h.len(), 5, "{h:#?}");
    for (i, row) in h.iter().enumerate() {
        assert_eq!(row["seq"], i as u64);
        assert_eq!(row["status"], "affirming", "seq {i}: {}", row["result"]);
        let want = if i <= 2 { &old_id } else { &new_id };
        assert_eq!(&signer(row), want, "seq {i} signed with the wrong key");
    }
    assert_eq!(predicate_of(&h[2])["next_key"]["keyid"], new_id.as_str());
    assert!(predicate_of(&h[1])["next_key"].is_null());
    assert!(predicate_of(&h[3])["next_key"].is_null());

    // The files: the new key is host.key, the old public key is kept, nothing pending.
    let current = keys::load_signing_key(&fx.host_key).unwrap();
    assert_eq!(keys::keyid(&current.verifying_key()), new_id);
    let kept = keys_dir.join(format!("host.{old_id}.pub"));
    assert!(kept.exists());
    assert!(!keys_dir.join("host.next.key").exists());
    assert!(!keys_dir.join("host.next.pub").exists());
    // The log verifies offline from the first key, across the rotation.
    let log = net.dir.join("state/evidence.jsonl");
    let (ok, table) = verify_log(&kept, &log);
    assert!(ok, "{table}");

    // The verifier lists both keys; a statement signed with the old key after the
    // rotation is refused.
    let out = Command::new(bin("rackwarden-verifier"))
        .arg("--config")
        .arg(&verifier.config)
        .args(["hosts", "--json"])
        .output()
        .unwrap();
    let hosts: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<(String, String)> = hosts
        .as_array()
        .unwrap()
        .iter()
        .map(|k| {
            (
                k["keyid"].as_str().unwrap().to_string(),
                k["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        states.contains(&(old_id.clone(), "rotated away".into())),
        "{states:?}"
    );
    assert!(
        states.contains(&(new_id.clone(), "rotated".into())),
        "{states:?}"
    );
    let r = verifier
        .post_statements(next_statement_signed_with(&log, &old_key))
        .unwrap();
    let item = &r["results"][0];
    assert_eq!(item["result"]["status"], "contraindicated", "{item}");
    assert!(
        item["result"]["findings"]
            .to_string()
            .contains("retired_key"),
        "{item}"
    );
}

#[test]
fn a_kill_between_the_rotation_statement_and_the_rename_is_completed_at_start() {
    let net = Net::new("rotkill");
    let fx = EpochFixture::new(&net.dir, 1 << 20);
    let mut verifier = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    let (rack, host) = ids(&net);
    verifier.enroll(&rack, &host, &fx.host_pub);
    verifier.start();
    let sections = fx.sections(&verifier.daemon_lines(), "1 h", "32 MiB");
    let cfg = write_epoch_config(&net, &sections);
    let sock = net.socket_path();
    let keys_dir = fx.host_key.parent().unwrap().to_path_buf();
    let old_key = keys::load_signing_key(&fx.host_key).unwrap();
    let old_id = keys::keyid(&old_key.verifying_key());
    let mut d = Daemon::start(&cfg, &sock);
    epoch_delivered(&sock, 0);
    d.kill9();

    // The state a kill -9 right after the rotation statement's fsync leaves: the log ends
    // with a statement signed by the old key naming the next key, which is still
    // host.next.key (the rename never happened).
    let new_id = keygen_rotate(&keys_dir);
    let next = keys::load_signing_key(&keys_dir.join("host.next.key")).unwrap();
    let log = net.dir.join("state/evidence.jsonl");
    let mut line = next_statement(
        &log,
        &old_key,
        Some(rackwarden_attest::statement::NextKey {
            keyid: new_id.clone(),
            public_key_pem: keys::public_pem(&next.verifying_key()),
        }),
    );
    line.push(b'\n');
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    std::io::Write::write_all(&mut f, &line).unwrap();
    f.sync_all().unwrap();
    drop(f);

    // By hand, the old key may not sign after the statement that rotated away from it.
    let out = Command::new(bin("rackwarden"))
        .arg("--config")
        .arg(&cfg)
        .args(["attest", "--key"])
        .arg(&fx.host_key)
        .arg("--log")
        .arg(&log)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("rotated to key"),
        "{err}"
    );

    // The start completes the rotation: seq 2 is signed with the new key.
    let _d = Daemon::start(&cfg, &sock);
    let st = epoch_delivered(&sock, 1);
    assert_eq!(st["epoch"]["keyid"], new_id.as_str(), "{:#}", st["epoch"]);
    assert!(st["epoch"]["next_keyid"].is_null(), "{:#}", st["epoch"]);
    assert!(!keys_dir.join("host.next.key").exists());
    assert!(keys_dir.join(format!("host.{old_id}.pub")).exists());
    wipe_now(&sock);
    epoch_delivered(&sock, 2);
    let h = verifier.history(&rack, &host);
    assert_eq!(h.len(), 3, "{h:#?}");
    assert_eq!(signer(&h[1]), old_id);
    assert_eq!(signer(&h[2]), new_id);
    assert_eq!(h[2]["status"], "affirming", "{}", h[2]["result"]);
    for row in &h {
        assert!(
            !row["result"]["findings"]
                .to_string()
                .contains("retired_key"),
            "{}",
            row["result"]
        );
    }
}
