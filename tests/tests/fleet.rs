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
        Endpoint, EpochFixture, Verifier, codes, ids, predicate_of, wait_epoch, wipe_now,
        write_epoch_config,
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
    dsse::sign(key, INTOTO_PAYLOAD_TYPE, &st.to_json().unwrap())
        .to_json()
        .unwrap()
}

/// The first statement of another host, made from `template` (a stored statement's
/// payload): its host, seq 0 and the genesis link, signed with `key`.
fn genesis_of(template: &[u8], host: &str, key: &ed25519_dalek::SigningKey) -> Vec<u8> {
    let mut st: Statement = serde_json::from_slice(template).unwrap();
    let p = &mut st.predicate;
    p.host_id = host.to_string();
    p.seq = 0;
    p.prev = rackwarden_attest::statement::GENESIS_PREV.to_string();
    p.challenge = Challenge::Unchallenged;
    p.wipe = None;
    p.images = None;
    p.incidents.clear();
    dsse::sign(key, INTOTO_PAYLOAD_TYPE, &st.to_json().unwrap())
        .to_json()
        .unwrap()
}

/// One load host: its key, the envelope to send next and the seqs acknowledged so far
/// (by which instance).
struct LoadHost {
    key: ed25519_dalek::SigningKey,
    next: Vec<u8>,
    acked: Vec<(u64, &'static str)>,
}

/// Posts each load host's chain, one statement per request, round robin, to `first` until
/// it stops answering, then to `second` (the statement in flight is sent again there, as a
/// daemon's delivery does), until `stop` is set and a round has gone to `second`.
fn post_load(
    hosts: &mut [LoadHost],
    first: &Endpoint,
    second: &Endpoint,
    stop: &std::sync::atomic::AtomicBool,
    acked: &std::sync::atomic::AtomicUsize,
) {
    let mut target = (first, "first");
    loop {
        for h in hosts.iter_mut() {
            let body = format!("[{}]", String::from_utf8_lossy(&h.next)).into_bytes();
            let answer = loop {
                match target.0.post_statements(body.clone()) {
                    Some(a) => break a,
                    None if target.1 == "first" => target = (second, "second"),
                    None => std::thread::sleep(Duration::from_millis(100)),
                }
            };
            let item = &answer["results"][0];
            let status = item["status"].as_str().unwrap_or("");
            assert!(
                status == "accepted" || status == "duplicate",
                "a load statement was not stored: {item}"
            );
            let body = {
                use base64::Engine as _;
                let env: serde_json::Value = serde_json::from_slice(&h.next).unwrap();
                base64::engine::general_purpose::STANDARD
                    .decode(env["payload"].as_str().unwrap())
                    .unwrap()
            };
            let st: Statement = serde_json::from_slice(&body).unwrap();
            h.acked.push((st.predicate.seq, target.1));
            acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            h.next = continuation(&body, &h.key, 0);
        }
        if stop.load(std::sync::atomic::Ordering::SeqCst) && target.1 == "second" {
            return;
        }
    }
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
    // Load beside the daemon: hosts whose chains are posted to `a` while it is killed.
    let load_keys: Vec<(String, ed25519_dalek::SigningKey)> = (0..3)
        .map(|i| {
            let k = rackwarden_attest::keys::generate();
            let name = format!("{host}-load{i}");
            let pem = net.dir.join(format!("{name}.pub"));
            std::fs::write(
                &pem,
                rackwarden_attest::keys::public_pem(&k.verifying_key()),
            )
            .unwrap();
            a.enroll(&rack, &name, &pem);
            (name, k)
        })
        .collect();
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
    // Meanwhile `a` is under load: three more hosts post their chains to it, one statement
    // per request, and go on at `b` when `a` stops answering.
    let template = payload(&a.history(&rack, &host)[0]);
    let mut load: Vec<LoadHost> = load_keys
        .iter()
        .map(|(name, key)| LoadHost {
            key: key.clone(),
            next: genesis_of(&template, name, key),
            acked: Vec::new(),
        })
        .collect();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let acked = std::sync::atomic::AtomicUsize::new(0);
    let (ea, eb) = (a.endpoint(), b.endpoint());
    let st = std::thread::scope(|sc| {
        let loader = sc.spawn(|| post_load(&mut load, &ea, &eb, &stop, &acked));
        // The load is flowing before the epoch that ends in the kill starts.
        while acked.load(std::sync::atomic::Ordering::SeqCst) < 15 {
            std::thread::sleep(Duration::from_millis(20));
        }
        wipe_now(&sock);
        wait_epoch(&sock, Duration::from_secs(30), "seq 2 wiping", |e| {
            e["state"]["state"] == "wiping"
        });
        a.kill9();
        let st = delivered(&sock, 2);
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        loader.join().unwrap();
        st
    });
    let mut acked_by_killed = 0;
    for (h, (name, _)) in load.iter().zip(&load_keys) {
        let stored: Vec<u64> = b
            .history(&rack, name)
            .iter()
            .filter_map(|r| r["seq"].as_u64())
            .collect();
        let acked: Vec<u64> = h.acked.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            stored, acked,
            "{name}: every acknowledged statement stored once, the chain contiguous"
        );
        assert_eq!(stored, (0..stored.len() as u64).collect::<Vec<_>>());
        acked_by_killed += h.acked.iter().filter(|(_, by)| *by == "first").count();
    }
    assert!(acked_by_killed > 0, "the killed instance was under load");
    println!(
        "load: {acked_by_killed} statements acknowledged by the instance killed with kill -9, all stored, chains contiguous"
    );
    assert_eq!(
        st["epoch"]["delivery"]["last_verdict"]["status"], "affirming",
        "{:#}",
        st["epoch"]
    );
    // The status names the instance in use: the fallback, once the first was killed.
    assert_eq!(
        st["epoch"]["delivery"]["instance"],
        b.url().trim_end_matches('/'),
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
