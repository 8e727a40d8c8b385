//! Upgrades: a daemon that finds another build's policer pinned replaces it on every hook,
//! with no moment without a policer, and keeps the bucket and counters (the maps are the
//! pinned ones).

use std::time::Duration;

use rackwarden::{bpf_syscall, limiter::Direction};
use rackwarden_tests::{
    Daemon, Net, counter, load_pass_all_classifier, status_json,
    tamper::{self, Hook},
};

#[test]
fn a_new_daemon_replaces_an_old_pinned_policer_on_every_hook() {
    let net = Net::new("upg");
    let spec = rackwarden::config::CapSpec {
        rate_bytes_per_s: 1_000_000,
        burst_bytes: 256 * 1024,
        small_reserve_bytes: 16_384,
        small_max_len: 1024,
    };
    let cap = rackwarden::limiter::maps::CapSlot::Cap(spec);
    let pins = net.attach_bare_limiter([cap, cap]);
    // "Another build": a classifier that passes everything, put on our tcx links and pinned
    // where our programs are pinned.
    let old = load_pass_all_classifier();
    let old_id = bpf_syscall::prog_id(&old).unwrap();
    let hook = if pins.link(&net.rack_if, Direction::Egress).exists() {
        Hook::Tcx
    } else {
        Hook::Clsact
    };
    println!("RW_REPORT upgrade: policer attached as {hook:?}");
    for d in Direction::ALL {
        let name = match d {
            Direction::Egress => rackwarden_common::prog_names::EGRESS,
            Direction::Ingress => rackwarden_common::prog_names::INGRESS,
        };
        std::fs::remove_file(pins.prog(name)).unwrap();
        bpf_syscall::obj_pin(&old, &pins.prog(name)).unwrap();
        tamper::replace(&net, hook, d, &old, &pins.prog(name)).expect("replace");
    }
    // The old program really is what runs: nothing is capped.
    let (uncapped, w) = net.egress_flood(1.0);
    assert!(
        // 4x the cap's bound: far beyond it, and within what an emulated guest can send.
        uncapped as f64 > 4.0 * (256.0 * 1024.0 + 1e6 * w),
        "{uncapped} B in {w:.2} s"
    );

    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let mut d = Daemon::start(&cfg, &net.socket_path());
    let st = status_json(&net.socket_path());
    assert_eq!(
        st["program_version"]["state"], "upgraded",
        "{:#}",
        st["program_version"]
    );
    assert_eq!(st["program_version"]["from"][0]["id"], old_id);
    for p in st["programs"].as_array().unwrap() {
        assert_ne!(p["id"], old_id, "the old program is gone from the pins");
    }
    for h in st["hooks"].as_array().unwrap() {
        assert_eq!(h["attached"], true, "{h:#}");
        assert!(h["foreign_ahead"].as_array().unwrap().is_empty());
        assert!(
            !h["programs"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["id"] == old_id)
        );
    }
    assert_eq!(
        st["gaps_total"], 0,
        "the swap leaves no hook unprotected: no gap to record"
    );
    let before = counter(&st, "egress", "passed_bytes");
    // Capped again, and on the same counters (the maps were kept).
    let (bytes, w) = net.egress_flood(3.0);
    let bound = 256.0 * 1024.0 + 1e6 * w;
    assert!(
        bytes as f64 <= bound && bytes as f64 >= 0.9 * bound,
        "{bytes} B vs bound {bound:.0}"
    );
    let after = counter(&status_json(&net.socket_path()), "egress", "passed_bytes");
    assert!(
        after >= before + bytes,
        "counters go on from where the old program left them"
    );

    // The next start finds its own build pinned: adopted, nothing replaced.
    d.stop();
    let _d = Daemon::start(&cfg, &net.socket_path());
    std::thread::sleep(Duration::from_millis(200));
    let st = status_json(&net.socket_path());
    assert_eq!(st["program_version"]["state"], "adopted");
}
