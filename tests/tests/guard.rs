//! The guard. Where the kernel takes it (the `cargo xtask vm-test` guests: as BPF LSM
//! programs where they boot with `bpf` in `lsm=`, as `fmod_ret` programs on `security_*`
//! where the `guard-fmod-ret` group boots them without it), every tamper path is refused
//! with the cap held (`rackwarden_tests::guardteam`). Where it does not (this project's CI
//! host refuses both LSM and tracing loads), the daemon must say so: `status` and statements
//! name the reason and report the weaker levels, and `self_protection = "lsm"` refuses to
//! start.

use rackwarden_attest::evidence::GuardAttach;

use rackwarden_tests::{Daemon, Net, guardteam, redteam, status_json};

#[test]
fn the_guard_refuses_every_tamper_path_or_the_daemon_says_why_not() {
    rackwarden_tests::require_root();
    let in_vm = std::env::var_os("RACKWARDEN_VM").is_some();
    match rackwarden::guard::probe() {
        Ok(attach) => {
            // BPF LSM where it is an active LSM, fmod_ret only where it is not.
            let want = if rackwarden::lsm::bpf_lsm_active() {
                GuardAttach::Lsm
            } else {
                GuardAttach::FmodRet
            };
            assert_eq!(attach, want, "where the guard runs on this kernel");
            println!("RW_REPORT guard: attached as {}", attach.name());
            let rows = guardteam::run(attach);
            print!("{}", redteam::render(&rows));
            for r in &rows {
                println!(
                    "RW_REPORT guard: {:<48} {:>9} B in {:.1} s ({:.1}% of bound) {}",
                    r.path,
                    r.bytes_through,
                    r.window_s,
                    100.0 * r.bytes_through as f64 / r.bound(),
                    if r.counted { "refused" } else { "NOT REFUSED" }
                );
            }
            for r in &rows {
                assert!(r.counted, "{}: not refused ({})", r.path, r.note);
                assert!(
                    r.bytes_through as f64 <= r.bound(),
                    "{}: {} B",
                    r.path,
                    r.bytes_through
                );
            }
        }
        Err(e) => {
            assert!(
                !in_vm,
                "the VM guests' kernels take BPF LSM or fmod_ret: the guard must load there ({e})"
            );
            println!("RW_REPORT guard: this kernel does not take it: {e}");
            let net = Net::new("gno");
            let cfg = rackwarden_tests::set_protection(
                net.write_config("1 MB/s", "1 MB/s", "256 KiB"),
                "auto",
            );
            let d = Daemon::start(&cfg, &net.socket_path());
            let st = status_json(&net.socket_path());
            let p = &st["self_protection"];
            assert_eq!(p["lsm_guard"]["state"], "unavailable", "{p:#}");
            let reason = p["lsm_guard"]["reason"].as_str().unwrap();
            assert_eq!(reason, e.to_string(), "status names the probe's reason");
            // The tamper watch stands in: bpf() detaches are seen as they return (tcx).
            let fallback = if st["attach_kind"] == "tcx" {
                "restored_on_event"
            } else {
                "restored_on_poll"
            };
            assert_eq!(p["detach"], fallback, "{p:#}");
            assert_eq!(p["foreign_ahead"], fallback, "{p:#}");
            assert_eq!(p["program_writes"], "detected_on_sample", "{p:#}");
            drop(d);
            let cfg = net.write_config_guarded("1 MB/s", "1 MB/s", "256 KiB");
            let log = Daemon::start_refused(&cfg);
            assert!(
                log.contains("self_protection = \"lsm\"") && log.contains(&e.to_string()),
                "the refusal names the key and the reason:\n{log}"
            );
        }
    }
}
