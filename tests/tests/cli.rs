//! The operator's command line as a person meets it: usage errors exit 2, a closed pipe is
//! not a panic, an error is its cause chain once (no backtrace, whatever RUST_BACKTRACE
//! says), flags only where they mean something, `check-config` in words with units, and
//! `cap set` telling the truth about the file.

use std::{
    os::unix::process::ExitStatusExt,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use rackwarden_tests::{Daemon, Net, bin};

fn rackwarden(args: &[&str]) -> Output {
    Command::new(bin("rackwarden"))
        .args(args)
        .env_remove("RUST_BACKTRACE")
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A directory of this test's own, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("rw-cli-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).unwrap();
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn usage_errors_exit_2() {
    for args in [
        // `cap set` with no cap to set.
        &["cap", "set", "--socket", "/nonexistent/rw.sock"][..],
        // A cap that is not a rate.
        &[
            "cap",
            "set",
            "--socket",
            "/nonexistent/rw.sock",
            "--egress",
            "5 parsecs/s",
        ][..],
        // A wipe backend that does not exist.
        &["wipe", "--backend", "floppy"][..],
        // --config and --socket only where a command uses them.
        &["keygen", "--config", "/x.toml", "--out", "/nonexistent"][..],
        &["verify", "--socket", "/x.sock", "--key", "/k.pub", "/log"][..],
        &["budget", "--config", "/x.toml", "--params", "1e12"][..],
        // Also where older scripts write it, before the command.
        &["--config", "/x.toml", "keygen", "--out", "/nonexistent"][..],
        &[
            "--socket", "/x.sock", "attest", "--key", "/k", "--log", "/l",
        ][..],
    ] {
        let o = rackwarden(args);
        assert_eq!(
            o.status.code(),
            Some(2),
            "{args:?}: {}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
    }
}

#[test]
fn a_closed_pipe_ends_the_command_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let o = Command::new(bin("rackwarden"))
        .args(["budget", "--params", "1e12"])
        .stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert!(
        !err.contains("panicked") && o.status.code() != Some(101),
        "{:?}: {err}",
        o.status
    );
    assert!(
        o.status.signal() == Some(libc::SIGPIPE) || o.status.success(),
        "{:?}: {err}",
        o.status
    );
}

#[test]
fn an_error_is_its_cause_chain_once_without_a_backtrace() {
    let o = Command::new(bin("rackwarden"))
        .args([
            "verify",
            "--key",
            "/nonexistent/rw/host.pub",
            "/nonexistent/rw/log",
        ])
        .env("RUST_BACKTRACE", "1")
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "one line:\n{err}");
    assert_eq!(err.matches("/nonexistent/rw/host.pub").count(), 1, "{err}");
    assert!(
        !err.contains("backtrace") && !err.contains("Caused by"),
        "{err}"
    );
}

/// A config with an `[epoch]` whose files exist, on `lo`.
fn epoch_config(dir: &Path) -> PathBuf {
    let keys = dir.join("keys");
    let o = rackwarden(&["keygen", "--out", keys.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let cfg = dir.join("rackwarden.toml");
    std::fs::write(
        &cfg,
        format!(
            r#"rack_id = "rack-cli"
host_id = "host-cli"
host_share = 0.5
interfaces = ["lo"]
state_dir = "{state}"
self_protection = "off"

[cap]
egress = "10 MB/s"
ingress = "8 Mbit/s"
burst = "256 KiB"

[epoch]
wipe_interval = "15 min"
signing_key = "{key}"

[verifier]
url = "http://127.0.0.1:7700"

[wipe]
backends = ["host"]
max_bytes = "64 MiB"

[workloads]
stop_command = ["/bin/true", "stop"]
start_command = ["/bin/true"]
"#,
            state = dir.join("state").display(),
            key = keys.join("host.key").display()
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn check_config_speaks_to_a_person_with_units_and_json_on_request() {
    let dir = Scratch::new("check");
    let cfg = epoch_config(&dir.0);
    let verifier = dir.0.join("verifier.toml");
    std::fs::write(
        &verifier,
        "[policy]\nmax_residue_host = \"4 GiB\"\n\n[racks.rack-cli]\negress = \"5 MB/s\"\ningress = \"1 MB/s\"\n",
    )
    .unwrap();
    let o = rackwarden(&["check-config", "--config", cfg.to_str().unwrap()]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    for want in ["rack 10 MB/s", "256 KiB", "every 15 min", "at most 64 MiB"] {
        assert!(out.contains(want), "missing {want:?}:\n{out}");
    }
    for debug in ["[Host]", "Commands {", "{\n", "\"rack_id\""] {
        assert!(!out.contains(debug), "{debug:?} in:\n{out}");
    }
    let o = rackwarden(&[
        "check-config",
        "--config",
        cfg.to_str().unwrap(),
        "--verifier-config",
        verifier.to_str().unwrap(),
    ]);
    let out = text(&o.stdout);
    assert!(
        out.contains("WARNING: `cap.egress` = 10 MB/s is above the rack's agreement"),
        "{out}"
    );
    // Before the command, as older scripts write it, for a command that reads a config.
    let o = rackwarden(&["--config", cfg.to_str().unwrap(), "check-config", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["caps"][0]["rack_bytes_per_s"], 10_000_000);
    assert_eq!(v["epoch"]["wipe_backends"], serde_json::json!(["host"]));
}

#[test]
fn cap_set_back_to_the_files_value_says_it_survives_a_restart() {
    let net = Net::new("capb");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let _d = Daemon::start(&cfg, &net.socket_path());
    let sock = net.socket_path();
    let set = |egress: &str| {
        let o = rackwarden(&[
            "cap",
            "set",
            "--socket",
            sock.to_str().unwrap(),
            "--egress",
            egress,
        ]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        text(&o.stdout)
    };
    // Lower than the file's cap: no --force needed.
    let away = set("500 kB/s");
    assert!(away.contains("persisted: no"), "{away}");
    let back = set("1 MB/s");
    assert!(
        back.contains("persisted: yes") && back.contains("already holds"),
        "the file holds 1 MB/s: a restart keeps it:\n{back}"
    );
}
