//! Two verifier instances on one database behave as one verifier (issue 24, on SQLite, or
//! on PostgreSQL when `RACKWARDEN_TEST_POSTGRES` names a server): a nonce one issued is
//! accepted by the other, `kill -9` of the one a daemon delivers to loses no acknowledged
//! statement (the daemon fails over to
//! `fallback_urls` and keeps its order), and two different statements with the same seq
//! posted to both at the same moment give one continuation and one fork, never two
//! continuations. Real processes over TLS in a network namespace, one database.

use std::{path::Path, time::Duration};

use rackwarden_attest::{
    dsse::{self, INTOTO_PAYLOAD_TYPE},
    statement::{Challenge, Statement},
};
use rackwarden_tests::{
    Daemon, Net,
    epoch::{
        EpochFixture, Verifier, codes, ids, predicate_of, wait_epoch, wipe_now, write_epoch_config,
    },
};

fn delivered(sock: &Path, seq: u64) -> serde_json::Value {
    wait_epoch(sock, Duration::from_secs(90), "statement delivered", |e| {
        e["delivery"]["delivered_seq"] == seq
    })
}

/// A statement after `prev_body` (the payload of the stored statement it continues),
/// unchallenged, made distinct by `variant`, signed with `key`.
fn continuation(prev_body: &[u8], key: &ed25519_dalek::SigningKey, variant: u64) -> Vec<u8> {
    let mut st: Statement = serde_json::from_slice(prev_body).unwrap();
    let p = &mut st.predicate;
    p.seq += 1;
    p.prev = hex::encode(rackwarden_attest::sha3(&dsse::pae(
        INTOTO_PAYLOAD_TYPE,
        prev_body,
    )));
    p.challenge = Challenge::Unchallenged;
    p.epoch_start_unix_ms = p.epoch_end_unix_ms;
    p.epoch_end_unix_ms += 1000 + variant;
    p.wipe = None;
    p.images = None;
    p.incidents.clear();
    dsse::sign(key, INTOTO_PAYLOAD_TYPE, &st.to_json()).to_json()
}

fn payload(row: &serde_json::Value) -> Vec<u8> {
    use base64::Engine as _;
    let env: serde_json::Value = serde_json::from_str(row["envelope"].as_str().unwrap()).unwrap();
    base64::engine::general_purpose::STANDARD
        .decode(env["payload"].as_str().unwrap())
        .unwrap()
}

#[test]
fn two_instances_on_one_database_are_one_verifier() {
    let net = Net::new("fleet");
    let fx = EpochFixture::new(&net.dir, 1 << 20);
    let mut a = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    let (rack, host) = ids(&net);
    a.enroll(&rack, &host, &fx.host_pub);
    let mut b = a.second_instance();
    a.start();
    b.start();
    let lines = format!("{}\nfallback_urls = [\"{}\"]", a.daemon_lines(), b.url());
    let cfg = write_epoch_config(&net, &fx.sections(&lines, "1 h", "16 MiB"));
    let sock = net.socket_path();
    // Each epoch pauses 3 s after its challenge, in `wiping`: time to kill the instance
    // that issued the nonce before the statement is delivered.
    let mut d = Daemon::start_with_env(&cfg, &sock, &[("RACKWARDEN_TEST_HOLD", "wiping:3000")]);
    delivered(&sock, 0);
    wipe_now(&sock);
    delivered(&sock, 1);

    // seq 2 is challenged by `a`; `a` is killed before it is delivered; it reaches `b`.
    wipe_now(&sock);
    wait_epoch(&sock, Duration::from_secs(30), "seq 2 wiping", |e| {
        e["state"]["state"] == "wiping"
    });
    a.kill9();
    let st = delivered(&sock, 2);
    assert_eq!(
        st["epoch"]["delivery"]["last_verdict"]["status"], "affirming",
        "{:#}",
        st["epoch"]
    );
    wipe_now(&sock);
    delivered(&sock, 3);
    d.stop();
    let h = b.history(&rack, &host);
    let seqs: Vec<u64> = h.iter().filter_map(|r| r["seq"].as_u64()).collect();
    assert_eq!(seqs, vec![0, 1, 2, 3], "every statement once, in order");
    for row in &h {
        assert_eq!(row["status"], "affirming", "{:?}", codes(row));
        assert_eq!(predicate_of(row)["challenge"]["kind"], "nonce");
    }
    println!("seq 2: challenged by the killed instance, accepted by the other: affirming");

    // The race: two different statements with the same seq, one to each instance, at once.
    a.start();
    let key = rackwarden_attest::keys::load_signing_key(&fx.host_key).unwrap();
    let mut tip = payload(h.last().unwrap());
    for round in 0..5u64 {
        let (x, y) = (continuation(&tip, &key, 0), continuation(&tip, &key, 1));
        let seq = 4 + round;
        std::thread::scope(|sc| {
            let ta = sc.spawn(|| {
                a.post_statements(format!("[{}]", String::from_utf8_lossy(&x)).into_bytes())
            });
            let tb = sc.spawn(|| {
                b.post_statements(format!("[{}]", String::from_utf8_lossy(&y)).into_bytes())
            });
            let (ra, rb) = (ta.join().unwrap(), tb.join().unwrap());
            assert!(ra.is_some() && rb.is_some(), "both answered: {ra:?} {rb:?}");
        });
        let rows: Vec<serde_json::Value> = a
            .history(&rack, &host)
            .into_iter()
            .filter(|r| r["seq"] == seq)
            .collect();
        assert_eq!(rows.len(), 2, "both kept: {rows:#?}");
        let forks: Vec<bool> = rows
            .iter()
            .map(|r| codes(r).iter().any(|c| c == "fork"))
            .collect();
        assert_eq!(
            forks.iter().filter(|f| !**f).count(),
            1,
            "seq {seq}: exactly one continuation: {:?}",
            rows.iter().map(codes).collect::<Vec<_>>()
        );
        let cont = rows.iter().zip(&forks).find(|(_, f)| !**f).unwrap().0;
        tip = payload(cont);
    }
    println!("5 races of two statements with one seq: one continuation and one fork each");
}
