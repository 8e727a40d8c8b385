//! Delivery with the default backoff: after a long verifier outage the backlog reaches the
//! verifier within 30 s of its return (README, "The epoch loop": `retry_max` defaults to
//! 15 s). The outage is long enough (over a minute) that the old 5 min ceiling would have
//! held the next attempt for a minute or more.

use std::time::{Duration, Instant};

use rackwarden_tests::{
    Daemon, Net,
    epoch::{EpochFixture, Verifier, ids, wait_epoch, wipe_now, write_epoch_config},
};

#[test]
fn a_verifier_back_after_a_long_outage_gets_the_backlog_within_30_s() {
    let net = Net::new("dlvr");
    let fx = EpochFixture::new(&net.dir, 64 * 1024);
    let (rack, host) = ids(&net);
    let mut verifier = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    verifier.enroll(&rack, &host, &fx.host_pub);
    verifier.start();
    // The fixture's sections with the default backoff ceiling (it sets 1 s for its tests).
    let sections = fx
        .sections(&verifier.daemon_lines(), "1 h", "8 MiB")
        .replace("retry_max = \"1 s\"\n", "");
    assert!(!sections.contains("retry_max"), "{sections}");
    let cfg = write_epoch_config(&net, &sections);
    let sock = net.socket_path();
    let _d = Daemon::start(&cfg, &sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 0 delivered", |e| {
        e["delivery"]["delivered_seq"] == 0
    });

    verifier.kill9();
    wipe_now(&sock);
    wait_epoch(&sock, Duration::from_secs(60), "seq 1 signed", |e| {
        e["last_epoch"]["seq"] == 1 && e["state"]["state"] == "waiting"
    });
    // Long enough for the backoff to reach any ceiling under a minute many times over.
    std::thread::sleep(Duration::from_secs(70));
    let st = wait_epoch(&sock, Duration::from_secs(5), "a backlog", |e| {
        e["delivery"]["backlog"].as_u64().unwrap_or(0) >= 1
    });
    println!("before the verifier returns: {}", st["epoch"]["delivery"]);

    verifier.start();
    let back = Instant::now();
    wait_epoch(&sock, Duration::from_secs(60), "seq 1 delivered", |e| {
        e["delivery"]["delivered_seq"] == 1
    });
    let took = back.elapsed();
    println!("RW_REPORT delivery: backlog delivered {took:?} after the verifier returned");
    assert!(
        took <= Duration::from_secs(30),
        "the backlog arrived {took:?} after the verifier returned"
    );
    assert_eq!(verifier.history(&rack, &host).len(), 2);
}
