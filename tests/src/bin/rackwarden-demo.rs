//! `cargo xtask demo`: the limiter's job on an embedded default (see `rackwarden_tests::demo`).
fn main() {
    println!(
        "rackwarden demo: a \"rack\" namespace capped at 1 MB/s, joined by veth to \"outside\""
    );
    println!("running an inference flow beside a bulk gradient flow for 6 s ...\n");
    let r = rackwarden_tests::demo::run(6.0);
    print!("{}", r.render());
    let infer = &r.flows[0];
    let ok = infer.delivered_frame_bytes == infer.offered_frame_bytes
        && r.flows.iter().map(|f| f.delivered_frame_bytes).sum::<u64>() as f64 <= r.bound();
    println!(
        "\n{}",
        if ok {
            "DEMO OK: inference passed untouched, the gradient flow was held to the cap"
        } else {
            "DEMO FAILED: see the table above"
        }
    );
    std::process::exit(if ok { 0 } else { 1 });
}
