//! Fail-closed behaviour, run-time cap changes, and detection of detaches and config tampering.

use std::{process::Command, thread, time::Duration};

use rackwarden::{
    limiter::{Direction, maps::CapSlot},
    pins::PinPaths,
};
use rackwarden_common::BucketConfig;
use rackwarden_tests::{
    tamper::{self, Hook},
    *,
};

fn spec(rate: u64, burst: u64) -> rackwarden::config::CapSpec {
    rackwarden::config::CapSpec {
        rate_bytes_per_s: rate,
        burst_bytes: burst,
        small_reserve_bytes: 16_384,
        small_max_len: 1024,
    }
}

#[test]
fn zeroed_or_missing_config_drops_everything() {
    let net = Net::new("fail");
    // Load and attach with the library alone, no cap in either slot.
    let pins = net.attach_bare_limiter([CapSlot::Unset, CapSlot::Unset]);
    let (frames, _) = net.egress_flood(1.0);
    assert_eq!(frames, 0, "an unconfigured policer must drop everything");
    let mut maps = rackwarden::limiter::LimiterMaps::open(&pins).unwrap();
    let c = maps.counters(Direction::Egress).unwrap();
    assert!(c.unconfigured_drops > 0 && c.passed_packets == 0, "{c:?}");

    // The config map is frozen: nobody writes a cap into it, the daemon's library included.
    let refused = maps
        .set_config(
            Direction::Egress,
            &rackwarden::limiter::maps::bucket_config(&spec(1_000_000, 262_144), 1),
        )
        .unwrap_err();
    assert_eq!(tamper::errno(&refused), Some(libc::EPERM), "{refused}");

    // A new generation with a valid cap passes traffic; one without drops everything again,
    // and the counters go on (same maps).
    net.change_bare_caps([CapSlot::Cap(spec(1_000_000, 262_144)), CapSlot::Unset]);
    let (frames, _) = net.egress_flood(1.0);
    assert!(frames > 0);
    net.change_bare_caps([CapSlot::Unset, CapSlot::Unset]);
    let maps = rackwarden::limiter::LimiterMaps::open(&pins).unwrap();
    let before = maps.counters(Direction::Egress).unwrap();
    let (frames, _) = net.egress_flood(1.0);
    assert_eq!(frames, 0, "a generation without a cap must drop everything");
    let after = maps.counters(Direction::Egress).unwrap();
    assert!(after.unconfigured_drops > before.unconfigured_drops);
    assert!(
        before.passed_packets > 0,
        "the counters were kept across generations"
    );
    assert_eq!(BucketConfig::default().magic, 0);
}

#[test]
fn cap_change_at_run_time_applies_and_says_whether_persisted() {
    let net = Net::new("capc");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let d = Daemon::start(&cfg, &net.socket_path());
    // Above the config file's cap (the agreed one) it is refused, naming both, and nothing
    // changes; with --force it is applied (issue 42: 500 GB/s against 1 MB/s was accepted).
    let out = Command::new(bin("rackwarden"))
        .args(["cap", "set", "--egress", "500 GB/s", "--socket"])
        .arg(net.socket_path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("rack egress 500 GB/s is above the 1 MB/s in") && err.contains("--force"),
        "{err}"
    );
    let st = status_json(&net.socket_path());
    assert_eq!(st["directions"][0]["host_cap_bytes_per_s"], 1_000_000);
    let out = Command::new(bin("rackwarden"))
        .args(["cap", "set", "--egress", "5 MB/s", "--force", "--socket"])
        .arg(net.socket_path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("persisted: no"), "{text}");
    // One unit system in the answer.
    assert!(
        text.contains("host egress 5 MB/s, ingress 1 MB/s") && !text.contains("iB/s"),
        "{text}"
    );
    // Drain the bucket, then measure a steady window at the new rate.
    let (frames, t) = net.egress_flood(3.0);
    let bound = 262_144.0 + 5_000_000.0 * t;
    println!("after cap set 5 MB/s: {frames} frame B in {t:.2} s (bound {bound:.0})");
    assert!(frames as f64 <= bound && frames as f64 >= 0.97 * bound);
    assert!(
        d.log_text().contains("cap egress: 1 MB/s -> 5 MB/s"),
        "{}",
        d.log_text()
    );

    // --persist rewrites the config file (comments kept) and says so.
    let out = Command::new(bin("rackwarden"))
        .args([
            "cap",
            "set",
            "--egress",
            "2 MB/s",
            "--persist",
            "--force",
            "--json",
            "--socket",
        ])
        .arg(net.socket_path())
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["persisted"], true, "{v}");
    assert_eq!(v["egress_host_bytes_per_s"], 2_000_000);
    let file = std::fs::read_to_string(&cfg).unwrap();
    assert!(
        file.contains("egress = \"2 MB/s\"") && file.contains("# generated by"),
        "{file}"
    );

    // Garbage is refused with a reason, and the cap is unchanged.
    let out = Command::new(bin("rackwarden"))
        .args(["cap", "set", "--egress", "fast please", "--socket"])
        .arg(net.socket_path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("egress"));
    let st = status_json(&net.socket_path());
    assert_eq!(st["directions"][0]["host_cap_bytes_per_s"], 2_000_000);
}

#[test]
fn a_detach_is_a_gap_and_restored_and_map_writes_are_refused() {
    let net = Net::new("tamp");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let _d = Daemon::start(&cfg, &net.socket_path());
    let st = status_json(&net.socket_path());
    assert_eq!(st["gaps_total"], 0);
    assert_eq!(st["agent_state"], "enforcing");
    assert_eq!(st["bypass"]["refusal"]["state"], "present", "{st}");
    // In the fixture's own cgroup, not the root: other processes are neither refused nor
    // counted by this test's program, and the report names where it is.
    assert_eq!(
        st["bypass"]["refusal"]["cgroup"],
        net.cgroup.display().to_string()
    );
    // Another process removes the refusal's link pin: detected as a gap and reattached.
    std::fs::remove_file(net.pin_root.join("links/cgroup_setsockopt")).unwrap();
    thread::sleep(Duration::from_millis(1500));
    let st = status_json(&net.socket_path());
    assert!(
        st["recent_gaps"].to_string().contains("cgroup/setsockopt"),
        "{st}"
    );
    assert_eq!(st["bypass"]["refusal"]["state"], "present");

    // Another process removes our policer from the egress hook: on tcx it removes our link
    // pin (the link is destroyed), on clsact it deletes our filter over netlink.
    let hook = Hook::of(&net);
    let link = net.pins().link(&net.rack_if, Direction::Egress);
    match hook {
        Hook::Tcx => std::fs::remove_file(&link).unwrap(),
        Hook::Clsact => tamper::detach(&net, hook, Direction::Egress).expect("detach"),
    }
    println!("RW_REPORT enforcement: policer attached as {hook:?}");
    thread::sleep(Duration::from_millis(1500));
    let st = status_json(&net.socket_path());
    let gaps = st["recent_gaps"].as_array().unwrap();
    let g = gaps
        .iter()
        .find(|g| g["kind"] == "detached" && g["interface"] == net.rack_if.as_str())
        .unwrap_or_else(|| panic!("no detached gap: {st}"));
    assert_eq!(g["restored"], true);
    assert!(g["last_verified_at_ms"].as_u64().unwrap() <= g["detected_at_ms"].as_u64().unwrap());
    if hook == Hook::Tcx {
        assert!(link.exists(), "the daemon must re-pin its link");
    }
    let hook = st["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["direction"] == "egress")
        .unwrap()
        .clone();
    assert_eq!(hook["attached"], true);

    // Another process tries to rewrite the cap, reset the bucket and zero the counters in
    // the pinned maps: every map is frozen, so each write is refused and nothing changes.
    let pins = PinPaths::new(&net.pin_root);
    let mut maps = rackwarden::limiter::LimiterMaps::open(&pins).unwrap();
    let before = maps.counters(Direction::Egress).unwrap();
    let err = maps
        .set_config(
            Direction::Egress,
            &rackwarden::limiter::maps::bucket_config(&spec(1_000_000_000, 1 << 30), 99),
        )
        .unwrap_err();
    assert_eq!(tamper::errno(&err), Some(libc::EPERM), "{err}");
    for name in [
        rackwarden_common::map_names::STATE,
        rackwarden_common::map_names::COUNTERS,
    ] {
        let e = tamper::write_map(&pins.map(name), 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM), "{name}: {e}");
    }
    assert!(maps.counters(Direction::Egress).unwrap().passed_bytes >= before.passed_bytes);
    thread::sleep(Duration::from_millis(1500));
    let st = status_json(&net.socket_path());
    assert!(
        !st["recent_gaps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|g| g["kind"] == "config_changed"),
        "a refused write is not a gap: {st}"
    );
    assert_eq!(
        maps.config(Direction::Egress).unwrap().rate_bytes_per_s,
        1_000_000,
        "cap changed"
    );
    let p = &st["self_protection"];
    assert_eq!(p["map_writes"], "refused", "{p}");
    assert_eq!(p["detach"], "restored_on_poll", "{p}");
    assert_eq!(p["program_writes"], "detected_on_sample", "{p}");
    // The cap holds after the restore.
    let (frames, t) = net.egress_flood(2.0);
    assert!(frames as f64 <= 262_144.0 + 1_000_000.0 * t);
    // Gaps survive a daemon restart (they are on disk, fsynced).
    drop(_d);
    let _d2 = Daemon::start(&cfg, &net.socket_path());
    let st = status_json(&net.socket_path());
    assert!(st["gaps_total"].as_u64().unwrap() >= 2, "{st}");
}
