//! `cargo xtask bench watch`: what the tamper watch costs the host, on each hook the kernel
//! accepts (fexit on `__x64_sys_bpf`, the raw tracepoint at `sys_exit`). The load is the worst
//! case for a hook at every syscall exit: one thread making the smallest
//! syscalls (a 1-byte `read` of `/dev/zero` and a 1-byte `write` to `/dev/null`) as fast as it
//! can, timed with and without the watch attached, in alternating rounds (anchor, watch,
//! anchor, ..., anchor). Each watched round is judged against the anchor rounds on both sides
//! of it, and the median of those ratios is printed with its 95% interval: short rounds and
//! many of them, because a guest under a loaded CI host drifts by 5% between long ones.
//!
//! The daemon never detaches the watch it pins (see `limiter::tamper_watch`), so while one is
//! pinned on this host both arms would carry it: the bench then says so and measures nothing.
//! It attaches its own unpinned copy for the watched rounds: a benchmark, not a daemon, may
//! live-patch the kernel a few times.

use std::{fs::File, io::Read as _, io::Write as _, time::Instant};

use rackwarden::limiter::tamper_watch::{self, UnpinnedWatch, WatchHook};

use crate::benchstats::{BpfStatsOn, Bracketed, median};

/// What the watch on one hook costs the load.
pub struct WatchCost {
    /// Median ns per syscall without the watch.
    pub anchor_ns: f64,
    /// Median ns per syscall with it.
    pub watched_ns: f64,
    /// Each watched round against the anchor rounds on both sides of it.
    pub ratios: Bracketed,
    /// The kernel's count of the watch program's runs over one more watched round, with
    /// `kernel.bpf_stats_enabled` on; `None` where that cannot be turned on.
    pub runs_in_a_round: Option<u64>,
}

/// The watch program's runs over one watched round of the load, counted by the kernel. A
/// round of its own, after the timed ones: the statistics' clock reads would weigh on a
/// timed round of a hook that runs on every syscall.
fn count_runs(watch: &mut UnpinnedWatch) -> Option<u64> {
    let _on = BpfStatsOn::enable()?;
    let link = watch.attach().ok()?;
    let before = watch.run_stats().ok()?;
    load_ns_per_syscall();
    let after = watch.run_stats().ok()?;
    drop(link);
    Some(after.0 - before.0)
}

/// Watched rounds; one more anchor round than this brackets them.
const ROUNDS: usize = 25;
/// Read+write pairs per round (two syscalls each).
const PAIRS: usize = 100_000;

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

/// Alternating rounds without and with the watch on `hook`, anchor first and last (printed);
/// `None` where the kernel refuses the hook (said why).
pub fn bench_hook(hook: WatchHook) -> Option<WatchCost> {
    let name = hook.name();
    let mut watch = match UnpinnedWatch::load(hook) {
        Ok(w) => w,
        Err(e) => {
            println!("{name}: SKIP, the kernel refuses this hook here: {e}");
            return None;
        }
    };
    let mut rounds = vec![load_ns_per_syscall()];
    for _ in 0..ROUNDS {
        let link = match watch.attach() {
            Ok(link) => link,
            Err(e) => {
                println!("{name}: SKIP, the watch does not attach here: {e}");
                return None;
            }
        };
        rounds.push(load_ns_per_syscall());
        drop(link);
        rounds.push(load_ns_per_syscall());
    }
    let of = |watched: bool| {
        median(
            &mut rounds
                .iter()
                .enumerate()
                .filter(|(i, _)| (i % 2 == 1) == watched)
                .map(|(_, ns)| *ns)
                .collect::<Vec<_>>(),
        )
    };
    let cost = WatchCost {
        anchor_ns: of(false),
        watched_ns: of(true),
        ratios: Bracketed::new(&rounds, |i| i % 2 == 1, |i| i % 2 == 0),
        runs_in_a_round: count_runs(&mut watch),
    };
    println!(
        "{:<44} {:>10.1} ns/syscall   (median of {} rounds of {} syscalls)",
        "anchor: the load without the watch",
        cost.anchor_ns,
        ROUNDS + 1,
        2 * PAIRS
    );
    println!(
        "{:<44} {:>10.1} ns/syscall   (median of {ROUNDS} rounds)",
        format!("with the watch on {name}"),
        cost.watched_ns
    );
    println!(
        "{:<44} {}   (goal <= 1.02x)",
        format!("ratio, {name}"),
        cost.ratios.describe()
    );
    match cost.runs_in_a_round {
        Some(runs) => println!(
            "{:<44} {runs} runs in {} syscalls (kernel.bpf_stats_enabled)",
            format!("the watch's own runs, {name}"),
            2 * PAIRS
        ),
        None => {
            println!("the watch's own runs: not counted (kernel.bpf_stats_enabled not writable)")
        }
    }
    Some(cost)
}
