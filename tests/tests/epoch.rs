//! The epoch loop end to end: a real `rackwardend` (real eBPF policer in network namespaces)
//! runs challenge, drain, wipe, stage, sign and deliver by itself against a real
//! `rackwarden-verifier` (HTTP, SQLite) on the rack namespace's loopback; then crashes,
//! outages, a bad image, a full disk and a bad reload, each checked at the verifier.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use rackwarden_tests::{
    Daemon, Net, bin,
    epoch::{
        EpochFixture, Verifier, codes, ids, predicate_of, verify_log, wait_epoch, wipe_now,
        write_epoch_config,
    },
};

struct Rack {
    net: Net,
    fx: EpochFixture,
    verifier: Verifier,
    rack: String,
    host: String,
}

/// A rack host with its fixture and an enrolled (not yet started) verifier.
fn rack(tag: &str, image_bytes: usize) -> Rack {
    let net = Net::new(tag);
    let fx = EpochFixture::new(&net.dir, image_bytes);
    // 24 GiB of RAM, 32 MiB wiped: the policy of these tests accepts the bounded wipe.
    let verifier = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    let (rack, host) = ids(&net);
    verifier.enroll(&rack, &host, &fx.host_pub);
    Rack {
        net,
        fx,
        verifier,
        rack,
        host,
    }
}

impl Rack {
    /// The daemon config (wipe every `interval`, `wipe_max` of host RAM) and its socket.
    fn config(&self, interval: &str, wipe_max: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let sections = self
            .fx
            .sections(&self.verifier.daemon_lines(), interval, wipe_max);
        (
            write_epoch_config(&self.net, &sections),
            self.net.socket_path(),
        )
    }
}

fn incident_kinds(p: &serde_json::Value) -> Vec<(String, String)> {
    p["incidents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            (
                i["kind"].as_str().unwrap_or("").to_string(),
                i["state"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

/// Every statement the verifier holds, in seq order 0..n, chained, none rejected.
fn assert_contiguous(h: &[serde_json::Value]) {
    for (i, row) in h.iter().enumerate() {
        assert_eq!(
            row["seq"].as_u64(),
            Some(i as u64),
            "seq {i} missing or out of place"
        );
        assert!(
            !codes(row)
                .iter()
                .any(|c| c == "fork" || c == "broken_prev" || c == "gap"),
            "seq {i}: chain finding {:?}",
            codes(row)
        );
    }
}

#[test]
fn a_full_epoch_is_signed_delivered_and_affirming() {
    let mut r = rack("full", 3 << 20);
    r.verifier.start();
    // In a VM (`cargo xtask vm-test`) the wipe covers a real share of the guest's RAM.
    let wipe = std::env::var("RACKWARDEN_TEST_WIPE").unwrap_or_else(|_| "32 MiB".into());
    let wipe_bytes = rackwarden_attest::units::parse_size(&wipe).unwrap();
    let (cfg, sock) = r.config("1 h", &wipe);
    let _d = Daemon::start(&cfg, &sock);

    the_first_epoch_runs_at_start(&sock);

    // And once more on demand.
    wipe_now(&sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 1 delivered", |e| {
        e["delivery"]["delivered_seq"] == 1
    });
    let h = r.verifier.history(&r.rack, &r.host);
    assert_eq!(h.len(), 2);
    assert_contiguous(&h);
    for row in &h {
        assert_full_epoch_statement(row, wipe_bytes);
    }
    the_text_status_shows_the_epoch(&sock);
    the_host_keeps_its_own_account(&r, &cfg);
}

/// The first epoch runs at start, by itself, and its verdict comes back affirming.
fn the_first_epoch_runs_at_start(sock: &std::path::Path) {
    let st = wait_epoch(sock, Duration::from_secs(60), "seq 0 delivered", |e| {
        e["delivery"]["delivered_seq"] == 0
    });
    let e = &st["epoch"];
    assert_eq!(
        e["delivery"]["last_verdict"]["status"], "affirming",
        "{e:#}"
    );
    assert_eq!(e["delivery"]["backlog"], 0);
    assert_eq!(e["last_epoch"]["wipe_ok"], true);
    assert_eq!(e["last_epoch"]["images_ok"], true);
    assert_eq!(e["last_epoch"]["workloads"]["state"], "restarted");
    assert_eq!(e["last_epoch"]["trigger"], "startup");
    let last = e["last_epoch"]["phases"].as_array().unwrap();
    assert_eq!(last.last().unwrap()["phase"], "sign");
}

/// One statement at the verifier: affirming, nonce-bound, the whole wipe, every image and
/// the epoch's own account. Prints the wipe's coverage as an `RW_REPORT` line.
fn assert_full_epoch_statement(row: &serde_json::Value, wipe_bytes: u64) {
    assert_eq!(row["status"], "affirming", "findings {:?}", codes(row));
    let p = predicate_of(row);
    // Bound to the verifier's nonce: the challenge and the wipe name the same one.
    assert_eq!(p["challenge"]["kind"], "nonce");
    assert_eq!(p["wipe"]["nonce"], p["challenge"]["nonce"]);
    let dev = &p["wipe"]["devices"][0];
    assert_eq!(dev["backend"], "host");
    assert_eq!(dev["status"], "complete");
    assert_eq!(dev["bytes_verified"], wipe_bytes);
    assert_eq!(dev["mismatches"], 0);
    let total = dev["bytes_total"].as_u64().unwrap();
    assert_eq!(
        dev["residue_bytes"].as_u64().unwrap(),
        total - wipe_bytes,
        "residue is total - verified, never rounded"
    );
    println!(
        "RW_REPORT wipe seq {}: {wipe_bytes} of {total} bytes (MemTotal) verified = {:.1}% coverage",
        row["seq"],
        100.0 * wipe_bytes as f64 / total as f64
    );
    // Every image of the manifest, verified, is a subject.
    let imgs = p["images"]["images"].as_array().unwrap();
    assert_eq!(imgs.len(), 2);
    assert!(imgs.iter().all(|i| i["ok"] == true));
    // The epoch's own account: phases, downtime, the daemon's digest.
    let run = &p["epoch"];
    let phases: Vec<&str> = run["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["phase"].as_str().unwrap())
        .collect();
    // `sign` cannot time itself inside the statement it signs: status shows it.
    assert_eq!(phases, ["challenge", "drain", "wipe", "stage", "restart"]);
    assert!(run["downtime_ms"].as_u64().unwrap() > 0);
    assert_eq!(run["wipe_interval_ms"], 3_600_000);
    assert_eq!(p["producer"]["name"], "rackwardend");
    let exe = std::fs::read(bin("rackwardend")).unwrap();
    assert_eq!(
        p["producer"]["binary_sha3_256"],
        hex::encode(rackwarden_attest::sha3(&exe)),
        "the statement names the running daemon's digest"
    );
    assert_eq!(p["limiter"]["state"], "present");
}

/// What an operator reads: the epoch part of the text status.
fn the_text_status_shows_the_epoch(sock: &std::path::Path) {
    let out = Command::new(bin("rackwarden"))
        .args(["status", "--socket"])
        .arg(sock)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    for want in [
        "epoch loop: every 1 h",
        "state: waiting; next epoch at 20",
        "wipe verified, images verified, workloads Restarted",
        "acknowledged up to seq 1; backlog 0",
        "last verdict: seq 1 affirming",
        // No TPM here: every statement says so, and the status with it.
        "root of trust: NONE (",
    ] {
        assert!(text.contains(want), "status lacks {want:?}:\n{text}");
    }
}

/// The host's side after two epochs: workloads, its evidence log, its staging directory,
/// and the log's single writer.
fn the_host_keeps_its_own_account(r: &Rack, cfg: &std::path::Path) {
    // Workloads were stopped before each wipe and started after it.
    let ev: Vec<String> = r.fx.workload_events().into_iter().map(|e| e.0).collect();
    assert_eq!(ev, ["stop", "start", "stop", "start"]);
    // The local log verifies offline with the host's public key.
    let log = r.net.dir.join("state/evidence.jsonl");
    let (ok, table) = verify_log(&r.fx.host_pub, &log);
    assert!(ok, "{table}");
    // The staging directory keeps the current set only.
    let sets = std::fs::read_dir(r.fx.staging.join("sets"))
        .unwrap()
        .count();
    assert_eq!(sets, 1, "older staged sets are pruned");
    // A second writer on the daemon's log is refused, not allowed to fork the chain.
    let out = Command::new(bin("rackwarden"))
        .arg("--config")
        .arg(cfg)
        .args(["attest", "--key"])
        .arg(&r.fx.host_key)
        .arg("--log")
        .arg(&log)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("in use by another process"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn a_verifier_down_for_many_epochs_receives_every_statement_in_order() {
    let mut r = rack("vdown", 1 << 20);
    // Enrolled, but not running: every epoch runs unchallenged and waits in the log.
    let (cfg, sock) = r.config("1 s", "8 MiB");
    let _d = Daemon::start(&cfg, &sock);
    let st = wait_epoch(
        &sock,
        Duration::from_secs(90),
        "10 undelivered statements",
        |e| {
            e["delivery"]["backlog"].as_u64().unwrap_or(0) >= 10
                && e["delivery"]["state"]["state"] == "delivery_failed"
        },
    );
    let e = &st["epoch"];
    assert!(e["last_epoch"]["unchallenged"].is_string(), "{e:#}");
    assert!(e["delivery"]["delivered_seq"].is_null());

    r.verifier.start();
    let t0 = Instant::now();
    let st = wait_epoch(
        &sock,
        Duration::from_secs(60),
        "the backlog delivered",
        |e| e["delivery"]["backlog"] == 0 && e["delivery"]["delivered_seq"].as_u64() >= Some(10),
    );
    let caught_up = t0.elapsed();
    let h = r.verifier.history(&r.rack, &r.host);
    assert_contiguous(&h);
    // Received in seq order (one batch shares a receipt time).
    for w in h.windows(2) {
        assert!(w[0]["received_ms"].as_u64() <= w[1]["received_ms"].as_u64());
    }
    let down: Vec<_> = h
        .iter()
        .filter(|row| predicate_of(row)["challenge"]["kind"] == "unchallenged")
        .collect();
    assert!(down.len() >= 10, "{} unchallenged", down.len());
    for row in &down {
        assert!(codes(row).contains(&"unchallenged".to_string()));
        assert_eq!(row["status"], "warning", "{:?}", codes(row));
    }
    // Back to challenged epochs once it answers.
    let t1 = Instant::now();
    loop {
        let h = r.verifier.history(&r.rack, &r.host);
        if h.iter().any(|row| {
            predicate_of(row)["challenge"]["kind"] == "nonce" && row["status"] == "affirming"
        }) {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "no challenged epoch after the verifier returned"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    println!(
        "verifier down for {} epochs: all {} delivered in order {:.1} s after it returned (delivered up to seq {})",
        down.len(),
        h.len(),
        caught_up.as_secs_f64(),
        st["epoch"]["delivery"]["delivered_seq"]
    );
}

#[test]
fn kill9_in_every_epoch_state_loses_nothing_and_the_limiter_never_lapses() {
    let mut r = rack("kill", 4 << 20);
    r.verifier.start();
    let (cfg, sock) = r.config("1 h", "32 MiB");
    let states = ["draining", "wiping", "staging", "restarting", "signing"];

    // A flood across all the kills and restarts: the pinned policer must hold the bound.
    // The first daemon attaches the limiter before the flood starts.
    let (flooded, window) = std::thread::scope(|sc| {
        let mut flood = None;
        for s in states {
            let hold = format!("{s}:2500");
            let mut d = Daemon::start_with_env(&cfg, &sock, &[("RACKWARDEN_TEST_HOLD", &hold)]);
            if flood.is_none() {
                flood = Some(sc.spawn(|| r.net.egress_flood(14.0)));
            }
            wait_epoch(&sock, Duration::from_secs(30), s, |e| {
                e["state"]["state"] == s
            });
            d.kill9();
        }
        flood.map(|f| f.join().unwrap()).unwrap()
    });
    let bound = 256.0 * 1024.0 + 1e6 * window;
    println!(
        "flood across 5 kill -9s: {flooded} B in {window:.2} s = {:.2}% of burst + rate x T",
        100.0 * flooded as f64 / bound
    );
    assert!(flooded as f64 <= bound, "{flooded} B > bound {bound:.0} B");
    assert!(flooded as f64 >= 0.5 * bound, "the flood ran ({flooded} B)");

    // Nothing was signed yet: the verifier has nothing, and the journal names the epoch.
    assert!(r.verifier.history(&r.rack, &r.host).is_empty());
    let mut d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 0 delivered", |e| {
        e["delivery"]["delivered_seq"] == 0
    });
    let h = r.verifier.history(&r.rack, &r.host);
    assert_eq!(h.len(), 1);
    let p = predicate_of(&h[0]);
    assert_eq!(p["epoch"]["trigger"], "after_interruption");
    let inc = incident_kinds(&p);
    let want: Vec<(String, String)> = states
        .iter()
        .map(|s| ("epoch_interrupted".to_string(), s.to_string()))
        .collect();
    assert_eq!(inc, want, "each interrupted attempt is disclosed, in order");
    assert!(codes(&h[0]).contains(&"epoch_interrupted".to_string()));
    assert_eq!(h[0]["status"], "warning", "{:?}", codes(&h[0]));
    assert_eq!(p["wipe"]["devices"][0]["status"], "complete");

    // Delivering: a statement signed while the verifier is gone, then kill -9 of both.
    r.verifier.kill9();
    wipe_now(&sock);
    wait_epoch(
        &sock,
        Duration::from_secs(60),
        "seq 1 failing to deliver",
        |e| e["last_epoch"]["seq"] == 1 && e["delivery"]["state"]["state"] == "delivery_failed",
    );
    d.kill9();
    // The cursor may lag what the verifier stored (a crash between its answer and our
    // fsync): resending is safe, the verifier takes an exact duplicate as acknowledged.
    std::fs::remove_file(r.net.dir.join("state/delivered.json")).unwrap();
    r.verifier.start();
    let _d = Daemon::start(&cfg, &sock);
    wait_epoch(
        &sock,
        Duration::from_secs(60),
        "seq 1 delivered after restart",
        |e| e["delivery"]["delivered_seq"] == 1 && e["delivery"]["backlog"] == 0,
    );
    let h = r.verifier.history(&r.rack, &r.host);
    assert_eq!(h.len(), 2, "nothing lost, nothing stored twice");
    assert_contiguous(&h);
    assert_eq!(predicate_of(&h[1])["incidents"], serde_json::json!([]));
    // Workloads: the attempt killed while draining never ran its stop hook; those killed
    // in wiping, staging and restarting stopped them and never started them again; the one
    // killed in signing had restarted them (restart comes before signing). Then seq 0 and
    // seq 1 each stop and start once.
    let ev: Vec<String> = r.fx.workload_events().into_iter().map(|e| e.0).collect();
    assert_eq!(
        ev,
        [
            "stop", "stop", "stop", "stop", "start", "stop", "start", "stop", "start"
        ],
        "{ev:?}"
    );
}

#[test]
fn an_image_mismatch_leaves_workloads_stopped_and_is_contraindicated() {
    let mut r = rack("img", 2 << 20);
    r.verifier.start();
    let (cfg, sock) = r.config("1 h", "16 MiB");
    let _d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 0 delivered", |e| {
        e["delivery"]["delivered_seq"] == 0
    });
    // One byte of the weights changes on disk.
    let w = r.fx.images.join("weights.bin");
    let mut bytes = std::fs::read(&w).unwrap();
    bytes[1_234_567] ^= 0x01;
    std::fs::write(&w, &bytes).unwrap();
    wipe_now(&sock);
    let st = wait_epoch(&sock, Duration::from_secs(60), "seq 1 delivered", |e| {
        e["delivery"]["delivered_seq"] == 1
    });
    let e = &st["epoch"];
    assert_eq!(e["last_epoch"]["images_ok"], false);
    assert_eq!(e["last_epoch"]["workloads"]["state"], "left_stopped");
    assert!(
        e["last_epoch"]["workloads"]["reason"]
            .as_str()
            .unwrap()
            .contains("weights.bin"),
        "{e:#}"
    );
    assert_eq!(e["delivery"]["last_verdict"]["status"], "contraindicated");
    let h = r.verifier.history(&r.rack, &r.host);
    assert_eq!(h[1]["status"], "contraindicated");
    assert!(codes(&h[1]).contains(&"image_refused".to_string()));
    let p = predicate_of(&h[1]);
    let finding = p["images"]["images"][0]["finding"].as_str().unwrap();
    assert!(finding.contains("weights.bin"), "{finding}");
    assert_eq!(p["wipe"]["devices"][0]["status"], "complete");
    // Stopped before the wipe, and never started again.
    let ev: Vec<String> = r.fx.workload_events().into_iter().map(|e| e.0).collect();
    assert_eq!(ev, ["stop", "start", "stop"]);
}

/// A small tmpfs mounted over a directory, unmounted on drop (also when the test fails).
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(dir: &std::path::Path, size: &str) -> SmallFs {
        std::fs::create_dir_all(dir).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs on {}", dir.display());
        SmallFs(dir.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_state_disk_stops_epochs_and_loses_nothing() {
    let mut r = rack("disk", 1 << 20);
    r.verifier.start();
    let state = r.net.dir.join("state");
    let _fs = SmallFs::mount(&state, "1m");
    let (cfg, sock) = r.config("1 h", "16 MiB");
    let _d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 0 delivered", |e| {
        e["delivery"]["delivered_seq"] == 0
    });
    let log = state.join("evidence.jsonl");
    let before = std::fs::read(&log).unwrap();
    // Fill the state filesystem to the last byte.
    let filler = state.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", filler.display()))
        .stderr(std::process::Stdio::null())
        .status();
    wipe_now(&sock);
    let st = wait_epoch(&sock, Duration::from_secs(60), "storage_failed", |e| {
        e["state"]["state"] == "storage_failed"
    });
    let err = st["epoch"]["state"]["error"].as_str().unwrap().to_string();
    assert!(err.contains("No space left"), "{err}");
    // What was written is intact and still verifies; the verifier still has it.
    let now = std::fs::read(&log).unwrap();
    assert!(
        now.starts_with(&before),
        "the log's acknowledged bytes are untouched"
    );
    let (ok, table) = verify_log(&r.fx.host_pub, &log);
    println!("{table}");
    assert!(ok, "the log still verifies with the disk full");
    // Space comes back: the epoch is retried and its statement says what happened.
    std::fs::remove_file(&filler).unwrap();
    wait_epoch(&sock, Duration::from_secs(60), "seq 1 delivered", |e| {
        e["delivery"]["delivered_seq"] == 1
    });
    let h = r.verifier.history(&r.rack, &r.host);
    assert_eq!(h.len(), 2);
    assert_contiguous(&h);
    let p = predicate_of(&h[1]);
    assert!(
        incident_kinds(&p)
            .iter()
            .any(|(k, _)| k == "epoch_interrupted"),
        "{:?}",
        p["incidents"]
    );
    let (ok, table) = verify_log(&r.fx.host_pub, &log);
    assert!(ok, "{table}");
}

#[test]
fn sighup_with_a_bad_config_keeps_the_old_one_and_a_good_one_applies() {
    let mut r = rack("hup", 1 << 20);
    // Start pointed at a port where nothing listens; the reload names the real verifier.
    let (cfg, sock) = r.config("1 h", "8 MiB");
    let good = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, good.replace(&r.verifier.url(), "https://127.0.0.1:1")).unwrap();
    r.verifier.start();
    let d = Daemon::start(&cfg, &sock);
    let hup = || {
        // SAFETY: signalling the daemon we started, by PID.
        unsafe { libc::kill(d.child.id() as i32, libc::SIGHUP) };
    };
    wait_epoch(
        &sock,
        Duration::from_secs(60),
        "seq 0 failing to deliver",
        |e| e["last_epoch"]["seq"] == 0 && e["delivery"]["state"]["state"] == "delivery_failed",
    );
    std::fs::write(
        &cfg,
        good.replace("egress = \"1 MB/s\"", "egress = \"1 parsec/s\""),
    )
    .unwrap();
    hup();
    let st = wait_epoch(&sock, Duration::from_secs(10), "the refusal", |_| true);
    let t0 = Instant::now();
    let mut st = st;
    while st["reload_error"].is_null() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(100));
        st = rackwarden_tests::status_json(&sock);
    }
    let err = st["reload_error"].as_str().unwrap_or_default().to_string();
    assert!(
        err.contains("rackwarden.toml:") && err.contains("cap.egress"),
        "{err}"
    );
    assert_eq!(st["agent_state"], "enforcing");
    assert_eq!(st["directions"][0]["host_cap_bytes_per_s"], 1_000_000);

    std::fs::write(
        &cfg,
        good.replace("egress = \"1 MB/s\"", "egress = \"2 MB/s\"")
            .replace("wipe_interval = \"1 h\"", "wipe_interval = \"2 h\""),
    )
    .unwrap();
    hup();
    let t0 = Instant::now();
    loop {
        let st = rackwarden_tests::status_json(&sock);
        if st["directions"][0]["host_cap_bytes_per_s"] == 2_000_000
            && st["epoch"]["wipe_interval_ms"] == 7_200_000
        {
            assert!(st["reload_error"].is_null());
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "reload not applied: {st:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Delivery follows the reload to the real verifier, at once (no old backoff).
    let st = wait_epoch(
        &sock,
        Duration::from_secs(20),
        "seq 0 delivered to the new url",
        |e| e["delivery"]["delivered_seq"] == 0,
    );
    assert_eq!(st["epoch"]["verifier_url"], r.verifier.url());
    assert_eq!(r.verifier.history(&r.rack, &r.host).len(), 1);
    // Nothing was detached by either reload.
    let st = rackwarden_tests::status_json(&sock);
    assert_eq!(st["gaps_total"], 0, "{:#}", st["recent_gaps"]);
}

#[test]
fn the_demo_tells_the_whole_story() {
    let r = rackwarden_tests::demo::full(3.0);
    print!("{}", r.render());
    assert!(r.ok(), "the demo's own success condition");
}

#[test]
fn an_unreadable_journal_is_kept_disclosed_and_does_not_stop_the_daemon() {
    let mut r = rack("jrnl", 1 << 20);
    r.verifier.start();
    let (cfg, sock) = r.config("1 h", "8 MiB");
    let mut d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 0 delivered", |e| {
        e["delivery"]["delivered_seq"] == 0
    });
    d.kill9();
    let state = r.net.dir.join("state");
    std::fs::write(state.join("epoch-in-progress.json"), b"{\"seq\": 1, \"sta").unwrap();
    let _d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 1 delivered", |e| {
        e["delivery"]["delivered_seq"] == 1
    });
    let h = r.verifier.history(&r.rack, &r.host);
    let p = predicate_of(&h[1]);
    assert_eq!(p["epoch"]["trigger"], "after_interruption");
    assert_eq!(
        incident_kinds(&p),
        [("epoch_interrupted".to_string(), "unknown".to_string())]
    );
    let kept: Vec<_> = std::fs::read_dir(&state)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("unreadable-"))
        .collect();
    assert_eq!(kept.len(), 1, "the damaged journal is kept as evidence");
    assert_eq!(
        std::fs::read(kept[0].path()).unwrap(),
        b"{\"seq\": 1, \"sta"
    );
}

/// The daemon talks to its verifier over TLS and believes only the configured CA or the
/// pinned certificate: another CA's chain and another certificate are refused (statements
/// stay in the log), and a reload to the right trust delivers them in order.
#[test]
fn the_verifier_is_trusted_only_through_its_ca_or_pinned_certificate() {
    let mut r = rack("tlstrust", 1 << 20);
    r.verifier.start();
    let other = r.net.dir.join("other-tls");
    rackwarden_tests::tls_init("127.0.0.1", &other);
    let (cfg, sock) = r.config("1 h", "8 MiB");
    let good = std::fs::read_to_string(&cfg).unwrap();
    let ca_line = format!("ca = \"{}\"", r.verifier.ca().display());
    assert!(good.contains(&ca_line));
    let with_trust = |line: String| {
        std::fs::write(&cfg, good.replace(&ca_line, &line)).unwrap();
    };
    let failing_on_certificate = |seq: u64, what: &str| {
        let st = wait_epoch(&sock, Duration::from_secs(60), what, |e| {
            e["delivery"]["state"]["state"] == "delivery_failed"
                && e["delivery"]["state"]["seq"] == seq
        });
        let err = st["epoch"]["delivery"]["state"]["error"]
            .as_str()
            .unwrap_or_default()
            .to_lowercase();
        assert!(err.contains("certificate"), "{what}: {err}");
    };
    // Another CA: seq 0 is made (unchallenged: the challenge met the same refusal) and kept.
    with_trust(format!("ca = \"{}\"", other.join("ca.pem").display()));
    let d = Daemon::start(&cfg, &sock);
    failing_on_certificate(0, "seq 0 refused under another CA");
    assert!(r.verifier.history(&r.rack, &r.host).is_empty());
    let hup = || {
        // SAFETY: signalling the daemon we started, by PID.
        unsafe { libc::kill(d.child.id() as i32, libc::SIGHUP) };
    };
    // The verifier's own certificate, pinned: delivered, and the next epoch is challenged.
    with_trust(format!(
        "pinned_cert = \"{}\"",
        r.verifier.leaf_cert().display()
    ));
    hup();
    wait_epoch(
        &sock,
        Duration::from_secs(30),
        "seq 0 delivered (pinned)",
        |e| e["delivery"]["delivered_seq"] == 0,
    );
    wipe_now(&sock);
    wait_epoch(
        &sock,
        Duration::from_secs(60),
        "seq 1 delivered (pinned)",
        |e| e["delivery"]["delivered_seq"] == 1,
    );
    let h = r.verifier.history(&r.rack, &r.host);
    assert_eq!(predicate_of(&h[0])["challenge"]["kind"], "unchallenged");
    assert_eq!(predicate_of(&h[1])["challenge"]["kind"], "nonce");
    // Another certificate pinned: refused again.
    with_trust(format!(
        "pinned_cert = \"{}\"",
        other.join("server-leaf.pem").display()
    ));
    hup();
    std::thread::sleep(Duration::from_millis(500));
    wipe_now(&sock);
    failing_on_certificate(2, "seq 2 refused under another pinned certificate");
    // The right CA: seq 2 arrives, the chain is whole.
    with_trust(ca_line.clone());
    hup();
    wait_epoch(
        &sock,
        Duration::from_secs(30),
        "seq 2 delivered (CA)",
        |e| e["delivery"]["delivered_seq"] == 2,
    );
    let h = r.verifier.history(&r.rack, &r.host);
    assert_contiguous(&h);
    assert_eq!(h.len(), 3);
}
