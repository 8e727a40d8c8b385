//! The daemon as a systemd service, without systemd: the sd_notify protocol on a socket of
//! our own (READY, STATUS, WATCHDOG pings that stop while a loop is stuck), and a frontend
//! interface that appears only after the daemon started.

use std::{
    os::unix::net::UnixDatagram,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use rackwarden_tests::{
    Daemon, Net, bin,
    epoch::{EpochFixture, Verifier, write_epoch_config},
    status_json,
};

#[test]
fn ready_status_and_a_watchdog_that_stops_while_a_loop_is_stuck() {
    let net = Net::new("wdog");
    let fx = EpochFixture::new(&net.dir, 1 << 20);
    // No verifier runs: the epoch goes unchallenged, which is fine here.
    let v = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    let cfg = write_epoch_config(&net, &fx.sections(&v.daemon_lines(), "1 h", "8 MiB"));
    let sock_path = net.dir.join("notify.sock");
    let notify = UnixDatagram::bind(&sock_path).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let log = std::fs::File::create(net.dir.join("daemon.log")).unwrap();
    // WATCHDOG_PID must be the daemon's own pid, as systemd sets it: the shell's `$$`,
    // which `exec` hands to the daemon.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "WATCHDOG_PID=$$ exec {} --config {}",
            bin("rackwardend").display(),
            cfg.display()
        ))
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "1500000")
        .env("RUST_LOG", "info")
        // The startup epoch sticks in `signing` for 6 s: no sign of life meanwhile (signing
        // has no budget beyond the watchdog's own timeout).
        .env("RACKWARDEN_TEST_HOLD", "signing:6000")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    let mut events: Vec<(f64, String)> = vec![];
    let mut buf = [0u8; 4096];
    while t0.elapsed() < Duration::from_secs(12) {
        if let Ok(n) = notify.recv(&mut buf) {
            events.push((
                t0.elapsed().as_secs_f64(),
                String::from_utf8_lossy(&buf[..n]).into_owned(),
            ));
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let text = std::fs::read_to_string(net.dir.join("daemon.log")).unwrap();
    let ready = events
        .iter()
        .find(|e| e.1.contains("READY=1"))
        .unwrap_or_else(|| panic!("no READY=1: {events:?}\n{text}"));
    assert!(ready.1.contains("STATUS=enforcing"), "{ready:?}");
    let pings: Vec<f64> = events
        .iter()
        .filter(|e| e.1.contains("WATCHDOG=1"))
        .map(|e| e.0)
        .collect();
    assert!(!pings.is_empty(), "no watchdog ping at all: {events:?}");
    // While the epoch loop is held (about ready+0 .. ready+6 s) the pings stop for longer
    // than the watchdog timeout: systemd would kill and restart the daemon.
    let longest_gap = pings.windows(2).map(|w| w[1] - w[0]).fold(0.0f64, f64::max);
    assert!(longest_gap > 3.0, "pings never paused: {pings:?}");
    assert!(text.contains("shows no sign of life"), "{text}");
    // And resume once the loop moves again.
    assert!(
        pings.last().unwrap() > &(ready.0 + 6.0),
        "pings did not resume after the loop moved on: {pings:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| e.1.contains("STATUS=") && e.1.contains("epoch:")),
        "STATUS lines carry the epoch state: {events:?}"
    );
}

#[test]
fn a_frontend_interface_that_appears_late_is_waited_for() {
    let net = Net::new("late");
    let late = format!("rl{}", &net.rack_if[2..]);
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let text = std::fs::read_to_string(&cfg).unwrap().replace(
        &format!("interfaces = [\"{}\"]", net.rack_if),
        &format!("interfaces = [\"{}\", \"{late}\"]", net.rack_if),
    );
    std::fs::write(&cfg, text).unwrap();
    let (ns, l) = (net.rack_ns.clone(), late.clone());
    let peer = format!("rp{}", &net.rack_if[2..]);
    let adder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(2));
        for args in [
            // No `dummy` module on every kernel: a veth pair inside the namespace.
            vec![
                "-n", &ns, "link", "add", &l, "type", "veth", "peer", "name", &peer,
            ],
            vec!["-n", &ns, "link", "set", &l, "up"],
        ] {
            assert!(Command::new("ip").args(&args).status().unwrap().success());
        }
    });
    let d = Daemon::start(&cfg, &net.socket_path());
    adder.join().unwrap();
    assert!(
        d.log_text().contains("waiting up to 30 s"),
        "{}",
        d.log_text()
    );
    let st = status_json(&net.socket_path());
    let hooks = st["hooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 4);
    assert!(hooks.iter().all(|h| h["attached"] == true), "{hooks:#?}");
    assert!(hooks.iter().any(|h| h["interface"] == late.as_str()));
}
