//! Red-team tests: every known path around the limiter, tried for real (see
//! `rackwarden_tests::redteam`). Prints the matrix.

use rackwarden_tests::redteam;

#[test]
fn bypass_matrix() {
    let rows = redteam::run();
    print!("{}", redteam::render(&rows));
    let row = |p: &str| rows.iter().find(|r| r.path == p).unwrap();
    for p in [
        "UDP socket",
        "raw AF_PACKET",
        "AF_PACKET + PACKET_QDISC_BYPASS",
    ] {
        let r = row(p);
        assert!(
            r.bytes_through as f64 <= r.bound(),
            "{p}: {} B crossed, bound {:.0}",
            r.bytes_through,
            r.bound()
        );
        assert!(
            r.bytes_through as f64 >= 0.9 * r.bound(),
            "{p}: traffic should still flow up to the cap"
        );
    }
    for r in &rows {
        assert!(
            r.counted,
            "{}: refusal or gap not counted ({})",
            r.path, r.note
        );
    }
}
