//! `rackwarden keygen | attest | verify` against a real daemon and limiter.

use std::{path::Path, process::Command, thread, time::Duration};

use rackwarden_tests::*;

fn rw(args: &[&str], config: &Path) -> (bool, String) {
    let mut cmd = Command::new(bin("rackwarden"));
    cmd.args(args);
    // Only the commands that read a config take --config (keygen and verify refuse it).
    if args.first() == Some(&"attest") {
        cmd.arg("--config").arg(config);
    }
    let out = cmd.output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn statements(log: &Path) -> Vec<serde_json::Value> {
    use base64::Engine as _;
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .map(|env| {
            let p = base64::engine::general_purpose::STANDARD
                .decode(env["payload"].as_str().unwrap())
                .unwrap();
            serde_json::from_slice(&p).unwrap()
        })
        .collect()
}

#[test]
fn attest_and_verify_a_real_limiter() {
    let net = Net::new("evid");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let keys = net.dir.join("keys");
    let k = keys.join("host.key");
    let p = keys.join("host.pub");
    let log = net.dir.join("evidence.jsonl");
    let attest = |extra: &[&str]| {
        let mut a = vec![
            "attest",
            "--key",
            k.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
        ];
        a.extend_from_slice(extra);
        rw(&a, &cfg)
    };
    let verify = || {
        rw(
            &[
                "verify",
                "--key",
                p.to_str().unwrap(),
                log.to_str().unwrap(),
            ],
            &cfg,
        )
    };
    let (ok, t) = rw(&["keygen", "--out", keys.to_str().unwrap()], &cfg);
    assert!(ok, "{t}");
    let (ok, t) = rw(&["keygen", "--out", keys.to_str().unwrap()], &cfg);
    assert!(!ok && t.contains("refusing to overwrite"), "{t}");

    // No limiter yet: the statement says so explicitly.
    let (ok, t) = attest(&[]);
    assert!(ok && t.contains("ABSENT"), "{t}");

    let _d = Daemon::start(&cfg, &net.socket_path());
    // A gap inside the epoch: remove our egress link pin, let the daemon notice and restore.
    std::fs::remove_file(
        net.pin_root
            .join("links")
            .join(format!("{}_egress", net.rack_if)),
    )
    .unwrap();
    thread::sleep(Duration::from_millis(1500));
    let nonce = "ab".repeat(32);
    let (ok, t) = attest(&["--nonce", &nonce]);
    assert!(ok && t.contains("present"), "{t}");
    let st = statements(&log);
    assert_eq!(st.len(), 2);
    let p1 = &st[1]["predicate"];
    assert_eq!(p1["seq"], 1);
    assert_eq!(p1["challenge"]["nonce"], nonce.as_str());
    assert_eq!(p1["limiter"]["state"], "present");
    assert_eq!(p1["limiter"]["programs"].as_array().unwrap().len(), 2);
    assert!(
        p1["limiter"]["attach_points"]
            .as_array()
            .unwrap()
            .iter()
            .all(|a| a["attached"] == true)
    );
    assert_eq!(p1["limiter"]["caps"][0]["rate_bytes_per_s"], 1_000_000);
    assert!(
        p1["limiter"]["gaps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["kind"] == "detached"),
        "{p1}"
    );
    assert_eq!(st[0]["predicate"]["limiter"]["state"], "absent");

    let (ok, t) = verify();
    assert!(ok && t.contains("2 ok, 0 warnings, 0 failures"), "{t}");

    // A crash mid-write: the next attest discloses it, verify warns but passes.
    let bytes = std::fs::read(&log).unwrap();
    let last_start = bytes[..bytes.len() - 1]
        .iter()
        .rposition(|b| *b == b'\n')
        .unwrap()
        + 1;
    let half_line = &bytes[last_start..last_start + (bytes.len() - last_start) / 2];
    std::fs::write(&log, [&bytes[..], half_line].concat()).unwrap();
    let (ok, t) = verify();
    assert!(!ok && t.contains("torn_tail"), "{t}");
    let (ok, t) = attest(&[]);
    assert!(ok && t.contains("incidents disclosed: 1"), "{t}");
    let (ok, t) = verify();
    assert!(ok && t.contains("3 ok, 1 warnings, 0 failures"), "{t}");

    // One flipped byte in a signature: verify fails and names line and offset.
    let mut bytes = std::fs::read(&log).unwrap();
    let at = bytes.windows(7).position(|w| w == b"\"sig\":\"").unwrap() + 10;
    bytes[at] = if bytes[at] == b'A' { b'B' } else { b'A' };
    std::fs::write(&log, &bytes).unwrap();
    let (ok, t) = verify();
    assert!(!ok && t.contains("bad_signature"), "{t}");
}
