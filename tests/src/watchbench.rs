//! `cargo xtask bench watch`: what the tamper watch costs the host, on each hook the kernel
//! accepts (fexit on `__x64_sys_bpf`, the raw tracepoint at `sys_exit`). The load is the worst
//! case for a hook at every syscall exit: one thread making the smallest
//! syscalls (a 1-byte `read` of `/dev/zero` and a 1-byte `write` to `/dev/null`) as fast as it
//! can, timed with and without the watch attached, in alternating rounds (anchor, watch,
//! anchor, ...), medians compared.
//!
//! The daemon never detaches the watch it pins (see `limiter::tamper_watch`), so while one is
//! pinned on this host both arms would carry it: the bench then says so and measures nothing.
//! It attaches its own unpinned copy for the watched rounds: a benchmark, not a daemon, may
//! live-patch the kernel a few times.

use std::{fs::File, io::Read as _, io::Write as _, time::Instant};

use rackwarden::limiter::tamper_watch::{self, UnpinnedWatch, WatchHook};

const ROUNDS: usize = 7;
/// Read+write pairs per round (two syscalls each).
const PAIRS: usize = 400_000;

/// Nanoseconds per syscall of the load.
fn load_ns_per_syscall() -> f64 {
    let (mut zero, mut null) = match (File::open("/dev/zero"), File::create("/dev/null")) {
        (Ok(z), Ok(n)) => (z, n),
        _ => return f64::NAN,
    };
    let mut b = [0u8; 1];
    let t0 = Instant::now();
    for _ in 0..PAIRS {
        let _ = zero.read(&mut b);
        let _ = null.write(&b);
    }
    t0.elapsed().as_nanos() as f64 / (2 * PAIRS) as f64
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Prints the watch's cost next to its anchor (the same load without it) and the ratio.
pub fn bench_watch() {
    println!("== bench watch: the tamper watch on a syscall-heavy load (1-byte read/write) ==");
    if let Some(id) = tamper_watch::pinned_link_id() {
        println!(
            "SKIP: a daemon's watch is pinned on this host (link {id}), so both arms would carry it; \
             remove /sys/fs/bpf/rackwarden-watch (or reboot) to measure"
        );
        return;
    }
    for hook in WatchHook::PREFERENCE {
        let _ = bench_hook(hook);
    }
}

/// Alternating rounds without and with the watch on `hook`, medians and their ratio
/// (printed); `None` where the kernel refuses the hook (said why).
pub fn bench_hook(hook: WatchHook) -> Option<(f64, f64)> {
    let name = hook.name();
    let mut watch = match UnpinnedWatch::load(hook) {
        Ok(w) => w,
        Err(e) => {
            println!("{name}: SKIP, the kernel refuses this hook here: {e}");
            return None;
        }
    };
    let (mut anchor, mut ours) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        anchor.push(load_ns_per_syscall());
        let link = match watch.attach() {
            Ok(link) => link,
            Err(e) => {
                println!("{name}: SKIP, the watch does not attach here: {e}");
                return None;
            }
        };
        ours.push(load_ns_per_syscall());
        drop(link);
    }
    let (a, o) = (median(&mut anchor), median(&mut ours));
    println!(
        "{:<44} {:>10.1} ns/syscall   (median of {ROUNDS} rounds of {} syscalls)",
        "anchor: the load without the watch",
        a,
        2 * PAIRS
    );
    println!(
        "{:<44} {:>10.1} ns/syscall",
        format!("with the watch on {name}"),
        o
    );
    println!(
        "{:<44} {:>10.3}x   ({:+.1}%; goal <= 2%)",
        format!("ratio, {name}"),
        o / a,
        (o / a - 1.0) * 100.0
    );
    Some((a, o))
}
