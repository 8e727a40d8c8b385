//! `[metrics] listen`: the daemon serves Prometheus text on loopback, scraped here while a
//! flood runs through the policer.

use std::io::{Read, Write};

use rackwarden_tests::{Daemon, Net, epoch::free_port, in_netns};

/// `GET /metrics` from inside the rack namespace (where the daemon listens).
fn scrape(ns: &str, port: u16) -> String {
    in_netns(ns, move || {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        out
    })
}

/// The value of the sample whose name and labels are `series`.
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[test]
fn the_daemon_serves_its_counters_to_a_scrape_on_loopback() {
    let net = Net::new("metr");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let port = free_port(&net.rack_ns);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    std::fs::write(&cfg, text).unwrap();
    let d = Daemon::start(&cfg, &net.socket_path());
    // 1400-byte datagrams for a second at far above 1 MB/s: some pass, most are dropped.
    net.egress_flood(1.0);
    let got = scrape(&net.rack_ns, port);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}\n{}", d.log_text());
    let passed = sample(
        &got,
        "rackwarden_limiter_bytes_total{direction=\"egress\",outcome=\"passed\"}",
    );
    let dropped = sample(
        &got,
        "rackwarden_limiter_packets_total{direction=\"egress\",outcome=\"dropped\"}",
    );
    assert!(passed.is_some_and(|b| b > 1e5), "{got}");
    assert!(dropped.is_some_and(|p| p > 0.0), "{got}");
    assert_eq!(
        sample(
            &got,
            "rackwarden_cap_bytes_per_second{direction=\"egress\"}"
        ),
        Some(1e6),
        "{got}"
    );
    assert_eq!(sample(&got, "rackwarden_enforcing"), Some(1.0), "{got}");
    assert!(
        got.contains("# TYPE rackwarden_enforcement_gaps_total counter"),
        "{got}"
    );
}

#[test]
fn a_metrics_address_off_loopback_is_refused() {
    let net = Net::new("mnlo");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str("\n[metrics]\nlisten = \"0.0.0.0:9464\"\n");
    std::fs::write(&cfg, text).unwrap();
    let log = Daemon::start_refused(&cfg);
    assert!(
        log.contains("metrics.listen") && log.contains("not a loopback address"),
        "{log}"
    );
}

/// The listener is bound before the limiter is loaded: an address in use refuses a start
/// that has touched nothing.
#[test]
fn a_metrics_address_in_use_refuses_the_start_before_anything_is_loaded() {
    let net = Net::new("minu");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let taken = in_netns(&net.rack_ns, || {
        std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind")
    });
    let port = taken.local_addr().unwrap().port();
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!("\n[metrics]\nlisten = \"127.0.0.1:{port}\"\n"));
    std::fs::write(&cfg, text).unwrap();
    let log = Daemon::start_refused(&cfg);
    assert!(log.contains("metrics listener"), "{log}");
    assert_eq!(net.hook_programs(), Vec::<String>::new(), "{log}");
    assert_eq!(
        net.pinned_entries(),
        Vec::<std::path::PathBuf>::new(),
        "{log}"
    );
    drop(taken);
}
