//! `cargo xtask demo` as its users meet it: the verifier's policy allows the wipe interval
//! the demo's daemon runs with, the terminal reports inference overhead the way the rack's
//! page does (scheduled epochs apart from the forced one), the page can be reached from the
//! host while the demo holds, and asked to exit at once it does. Needs root (namespaces, BPF).

use std::time::{Duration, Instant};

use rackwarden_tests::demo::{self, Hold};

/// `key = "<duration>"` of a TOML file, parsed with the project's duration type.
fn duration_of(text: &str, key: &str) -> Duration {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with(&format!("{key} =")))
        .unwrap_or_else(|| panic!("no `{key}` in:\n{text}"));
    let value = line.split('"').nth(1).unwrap_or_default();
    rackwarden_attest::units::parse_duration(value).unwrap()
}

#[test]
fn the_demo_agrees_with_itself_and_exits_at_once_when_asked() {
    let r = demo::full_live(2.0);
    let (verifier, daemon) = r.configs().unwrap();
    let policy = duration_of(
        &std::fs::read_to_string(verifier).unwrap(),
        "max_wipe_interval",
    );
    let interval = duration_of(&std::fs::read_to_string(daemon).unwrap(), "wipe_interval");
    // An epoch ends a wipe interval plus its own run after the last: the policy must leave
    // room for that run, or every scheduled epoch would be wipe_overdue.
    assert!(
        interval + Duration::from_secs(60) <= policy,
        "daemon wipe_interval {interval:?} vs the verifier's max_wipe_interval {policy:?}"
    );
    let text = r.render();
    print!("{text}");
    assert!(r.ok(), "the demo's own success condition");
    // The second epoch was forced (wipe-now): the terminal says so, as the page does.
    assert!(text.contains("forced by wipe-now"), "{text}");
    assert!(text.contains("as the rack's page counts it"), "{text}");
    // Reachable from the host while it holds: a forwarded port on this host's loopback.
    let fwd = r.forward().unwrap();
    let ca = std::fs::read(r.ca().unwrap()).unwrap();
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let page = client.get(fwd.url()).send().and_then(|r| r.text()).unwrap();
    assert!(page.contains("Scorecard"), "{page}");
    // The page shows the last epoch's traffic committed, the completions' epoch (seq 2)
    // sampled and opened, and its opened exchanges replayed with none failed.
    assert!(
        page.contains("seq 3: traffic committed:")
            && page
                .contains("last sampled epoch, seq 2: sampled 16 offsets per direction: opened,")
            && page.contains("last replayed epoch, seq 2: replayed ")
            && page.contains(" opened records: 0 failed, 0 in flight and not judged, "),
        "{page}"
    );
    assert!(text.contains("== 3. taps"), "{text}");
    assert!(text.contains("== 4. replay"), "{text}");
    assert!(text.contains("replay aspect: affirming"), "{text}");
    // The page's scheduled overhead is the number the terminal printed.
    let at = page
        .find(r#"id="score-inference""#)
        .unwrap_or_else(|| panic!("{page}"));
    let value = page[at..]
        .split("data-value=\"")
        .nth(1)
        .and_then(|v| v.split('"').next())
        .unwrap_or_default();
    let pct: f64 = value
        .parse()
        .unwrap_or_else(|_| panic!("no scheduled overhead on the page: `{value}`"));
    let terminal: f64 = text
        .split("as the rack's page counts it: scheduled")
        .nth(1)
        .and_then(|rest| rest.split("= ").nth(1))
        .and_then(|v| v.split('%').next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no scheduled overhead in the terminal:\n{text}"));
    assert!(
        (terminal - pct).abs() < 0.001,
        "the page says {pct}%, the terminal {terminal}%:\n{text}"
    );
    // Asked to exit at once (what this test and a script want), it does.
    let t = Instant::now();
    r.hold(Hold::ExitNow);
    assert!(t.elapsed() < Duration::from_secs(1));
}
