//! `cargo xtask demo`: the product's job on an embedded default (see `rackwarden_tests::demo`):
//! a verifier, a rack host in network namespaces capped at 1 MB/s, inference beside a bulk
//! flow, epochs with a bounded host wipe and a small image set, delivered and judged, and the
//! bundled model served on the rack with its sampled completions replayed at the verifier.
//! In a terminal it then keeps the verifier and its page up until Ctrl-C; `--exit` (or no
//! terminal) tears everything down at once.
use rackwarden_tests::demo::Hold;

fn main() {
    let hold = Hold::from_args(&std::env::args().skip(1).collect::<Vec<_>>());
    println!(
        "rackwarden demo: a \"rack\" namespace capped at 1 MB/s, joined by veth to \"outside\";"
    );
    println!(
        "a verifier on the rack's loopback; rackwardend runs an epoch at start, then inference and a"
    );
    println!(
        "bulk gradient flow run for 6 s, then a second epoch is asked for with wipe-now; then the bundled"
    );
    println!(
        "model serves three completions on the rack, a third epoch commits them, the verifier's replay\nservice reruns the model over the sampled ones, and a fourth epoch's verdict judges them ...\n"
    );
    let r = rackwarden_tests::demo::full_live(6.0);
    print!("{}", r.render());
    let ok = r.ok();
    println!(
        "\n{}",
        if ok {
            "DEMO OK: inference passed untouched, the gradient flow was held to the cap, every epoch was wiped, checked, signed, delivered and affirmed, and the sampled completions replayed and passed"
        } else {
            "DEMO FAILED: see the tables above"
        }
    );
    if ok {
        r.hold(hold);
    } else {
        drop(r);
    }
    std::process::exit(if ok { 0 } else { 1 });
}
