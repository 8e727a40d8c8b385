//! The verifier's transparency log seen from the host (issue 24): a real verifier over TLS
//! and a real daemon with `[verifier] log_key`. The daemon keeps each statement's log entry
//! and checks it; then a statement is removed behind the verifier's back (its row and its
//! leaf deleted from the SQLite database, the log rebuilt without it so that every proof the
//! verifier serves is well formed), and the host's consistency check catches it, naming the
//! checkpoint it kept and the one it was shown, and keeping both as evidence. The same for a
//! statement rewritten in place (its envelope and its leaf changed, the nodes recomputed).

use std::{path::Path, process::Command, time::Duration};

use rackwarden_attest::tlog::{self, HashReader, MemoryTree, audit, note::NoteVerifier};
use rackwarden_tests::{
    Daemon, Net, bin,
    epoch::{EpochFixture, Verifier, ids, wait_epoch, wipe_now, write_epoch_config},
};
use rackwarden_verifier::store::{DatabaseUrl, Store, db::Value as DbValue};

/// The checkpoint the daemon kept, once it has reached `size`.
fn wait_kept(state: &Path, key: &NoteVerifier, size: u64) -> tlog::note::Checkpoint {
    let t0 = std::time::Instant::now();
    loop {
        if let Ok(note) = std::fs::read_to_string(state.join("tlog-checkpoint"))
            && let Ok(cp) = key.open_checkpoint(&note)
            && cp.size >= size
        {
            return cp;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the daemon kept no checkpoint of size {size}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Tamper {
    /// The statement and its leaf deleted.
    Remove,
    /// The statement's envelope changed (a byte appended) and its leaf with it.
    Rewrite,
}

/// Removes or rewrites the statement at `seq` and its leaf, and rebuilds the log: leaves
/// renumbered, every hash and node recomputed. What a verifier rewriting its history
/// thoroughly would do.
fn tamper(db: &DatabaseUrl, rack: &str, host: &str, seq: u64, how: Tamper) {
    let c = Store::connect(db).unwrap();
    let text = |v: &str| DbValue::Text(Some(v.to_string()));
    let int = |v: i64| DbValue::Int(Some(v));
    let id = c
        .probe(
            "SELECT id FROM statements WHERE rack = ?1 AND host = ?2 AND seq = ?3",
            &[text(rack), text(host), int(seq as i64)],
        )
        .unwrap()[0]
        .i64(0)
        .unwrap();
    match how {
        Tamper::Remove => {
            c.tamper("DELETE FROM statements WHERE id = ?1", &[int(id)])
                .unwrap();
            c.tamper(
                "DELETE FROM tlog_leaves WHERE statement_id = ?1",
                &[int(id)],
            )
            .unwrap();
        }
        Tamper::Rewrite => {
            c.tamper(
                "UPDATE statements SET envelope = envelope || ' ' WHERE id = ?1",
                &[int(id)],
            )
            .unwrap();
            let env = c
                .probe("SELECT envelope FROM statements WHERE id = ?1", &[int(id)])
                .unwrap()[0]
                .text(0)
                .unwrap();
            let data = tlog::statement_leaf(rack, host, seq, env.as_bytes()).unwrap();
            c.tamper(
                "UPDATE tlog_leaves SET data = ?1 WHERE statement_id = ?2",
                &[DbValue::Bytes(data), int(id)],
            )
            .unwrap();
        }
    }
    let rest: Vec<(i64, Vec<u8>)> = c
        .probe(
            "SELECT statement_id, data FROM tlog_leaves ORDER BY idx",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.i64(0).unwrap(), r.bytes(1).unwrap()))
        .collect();
    c.tamper_batch("DELETE FROM tlog_leaves; DELETE FROM tlog_nodes;")
        .unwrap();
    let mut tree = MemoryTree::new();
    for (i, (sid, data)) in rest.iter().enumerate() {
        let leaf = tlog::leaf_hash(data);
        let nodes = tlog::completed_nodes(&tree, i as u64, leaf).unwrap();
        tree.push_hash(leaf);
        c.tamper(
            "INSERT INTO tlog_leaves (idx, statement_id, data, hash) VALUES (?1, ?2, ?3, ?4)",
            &[
                int(i as i64),
                int(*sid),
                DbValue::Bytes(data.clone()),
                DbValue::Bytes(leaf.to_vec()),
            ],
        )
        .unwrap();
        for (level, idx, h) in nodes {
            c.tamper(
                "INSERT INTO tlog_nodes (level, idx, hash) VALUES (?1, ?2, ?3)",
                &[
                    int(i64::from(level)),
                    int(idx as i64),
                    DbValue::Bytes(h.to_vec()),
                ],
            )
            .unwrap();
        }
    }
    // The rebuilt log is sound on its own: the verifier will serve proofs that verify
    // against its new roots; only the host's memory of the old root can tell.
    assert_eq!(tree.node(0, 0).unwrap(), tlog::leaf_hash(&rest[0].1));
}

/// `rackwarden log verify` as an operator runs it: from the root namespace; the command
/// enters the config's `netns` itself (issue 42: it used to ignore it).
fn log_verify(_net: &Net, cfg: &Path, tiles: Option<&str>) -> (bool, String) {
    let mut c = Command::new(bin("rackwarden"));
    c.args(["log", "verify", "--config"]).arg(cfg);
    if let Some(t) = tiles {
        c.args(["--tiles", t]);
    }
    let out = c.output().unwrap();
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn a_statement_removed_behind_the_verifiers_back_is_caught_by_the_host() {
    caught(Tamper::Remove);
}

#[test]
fn a_statement_rewritten_behind_the_verifiers_back_is_caught_by_the_host() {
    caught(Tamper::Rewrite);
}

fn caught(how: Tamper) {
    let net = Net::new(if how == Tamper::Remove {
        "tlgr"
    } else {
        "tlgw"
    });
    let fx = EpochFixture::new(&net.dir, 64 * 1024);
    let (rack, host) = ids(&net);
    let mut verifier = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    verifier.enroll(&rack, &host, &fx.host_pub);
    verifier.start();
    // The verifier made its log key on its first start; the host is given its vkey.
    let vkey = verifier.dir.join("tlog.vkey");
    let key = audit::load_log_key(vkey.to_str().unwrap()).unwrap();
    let lines = format!(
        "{}\nlog_key = \"{}\"",
        verifier.daemon_lines(),
        vkey.display()
    );
    let cfg = write_epoch_config(&net, &fx.sections(&lines, "1 h", "8 MiB"));
    let state = net.dir.join("state");
    let sock = net.socket_path();
    let _d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 0 delivered", |e| {
        e["delivery"]["delivered_seq"] == 0
    });
    for seq in 1..=2u64 {
        wipe_now(&sock);
        wait_epoch(&sock, Duration::from_secs(60), "delivered", |e| {
            e["delivery"]["delivered_seq"] == seq
        });
    }
    // Three statements, three entries, each proven; the checkpoints consistent.
    let kept = wait_kept(&state, &key, 3);
    assert_eq!(kept.size, 3);
    let entries = std::fs::read_to_string(state.join("tlog-entries.jsonl")).unwrap();
    assert_eq!(entries.lines().count(), 3, "{entries}");
    assert!(!state.join("tlog-failures.jsonl").exists());
    let (ok, out) = log_verify(&net, &cfg, None);
    assert!(ok, "{out}");
    assert!(out.contains("3 kept entries"), "{out}");
    let tiles = format!("{}/tlog", verifier.url());
    let (ok, out) = log_verify(&net, &cfg, Some(&tiles));
    assert!(ok, "{out}");

    // Behind the verifier's back: seq 1 and its leaf go (or change), the log is rebuilt.
    verifier.kill9();
    tamper(&verifier.database(), &rack, &host, 1, how);
    verifier.start();
    let stored = if how == Tamper::Remove { 2 } else { 3 };
    assert_eq!(verifier.history(&rack, &host).len(), stored);

    // The next statement's checkpoint is of a log that does not extend the kept one.
    wipe_now(&sock);
    let st = wait_epoch(&sock, Duration::from_secs(60), "a log failure", |e| {
        e["delivery"]["log_failure"].is_string()
    });
    let failure = st["epoch"]["delivery"]["log_failure"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    println!("RW_REPORT tlog: the host caught it: {failure}");
    let text = Command::new(bin("rackwarden"))
        .args(["status", "--socket"])
        .arg(&sock)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("VERIFIER LOG CHECK FAILED: the log is not append-only"),
        "{text}"
    );
    let old = format!("size 3 root {}", tlog::hex(&kept.root));
    assert!(failure.contains("not append-only"), "{failure}");
    assert!(failure.contains(&old), "{failure}");
    // The new checkpoint (removed: size 3 again, leaves 0, 2, 3; rewritten: size 4) is
    // named with its own root.
    let new_size = stored + 1;
    assert!(
        failure.contains(&format!("is not a prefix of the checkpoint of `rackwarden-verifier/127.0.0.1` at size {new_size} root")),
        "{failure}"
    );

    // Kept as evidence: both signed checkpoints, each verifying with the log's key.
    let failures = std::fs::read_to_string(state.join("tlog-failures.jsonl")).unwrap();
    let f: serde_json::Value = serde_json::from_str(failures.lines().next().unwrap()).unwrap();
    let old_cp = key
        .open_checkpoint(f["old_checkpoint"].as_str().unwrap())
        .unwrap();
    let new_cp = key
        .open_checkpoint(f["new_checkpoint"].as_str().unwrap())
        .unwrap();
    assert_eq!(old_cp, kept);
    assert_ne!(new_cp.root, kept.root);
    assert_eq!(new_cp.size, new_size as u64);
    // The host did not adopt the rewritten history.
    assert_eq!(wait_kept(&state, &key, 3), kept);

    // Offline, from the tiles alone: the verifier's log no longer contains what the host
    // kept.
    let (ok, out) = log_verify(&net, &cfg, Some(&tiles));
    assert!(!ok, "{out}");
    assert!(out.contains("not append-only"), "{out}");
    assert!(out.contains(&tlog::hex(&new_cp.root)), "{out}");
    println!(
        "RW_REPORT tlog: rackwarden log verify --tiles: {}",
        out.trim()
    );

    // The next signed statement discloses it, with both checkpoints, and the verdict (even
    // this verifier's) names it.
    wipe_now(&sock);
    // seqs 0-2 before the tampering, 3 whose checkpoint failed the check, then this one.
    let seq = 4u64;
    wait_epoch(
        &sock,
        Duration::from_secs(60),
        "the next statement delivered",
        |e| e["delivery"]["delivered_seq"].as_u64() >= Some(seq),
    );
    let row = verifier
        .history(&rack, &host)
        .into_iter()
        .find(|r| r["seq"] == seq)
        .unwrap_or_else(|| panic!("seq {seq} not stored"));
    let incident = rackwarden_tests::epoch::predicate_of(&row)["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "verifier_log_inconsistent")
        .unwrap_or_else(|| panic!("no log incident in seq {seq}"))
        .clone();
    assert_eq!(incident["kept_checkpoint"], f["old_checkpoint"]);
    assert_eq!(incident["shown_checkpoint"], f["new_checkpoint"]);
    assert!(
        rackwarden_tests::epoch::codes(&row).contains(&"verifier_log_inconsistent".to_string()),
        "{:?}",
        rackwarden_tests::epoch::codes(&row)
    );
}
