//! A start that fails must fail before it touches the kernel: the whole configuration
//! (keys, manifest, directories, interfaces) is checked first, and a refused start leaves
//! no pin, no program and no link behind.

use rackwarden_tests::{Daemon, Net};

/// Appends an `[epoch]` whose signing key does not exist (the verifier is never reached).
fn with_missing_signing_key(net: &Net, cfg: &std::path::Path) -> std::path::PathBuf {
    let key = net.dir.join("keys").join("no-such-host.key");
    let mut text = std::fs::read_to_string(cfg).unwrap();
    text.push_str(&format!(
        "\n[epoch]\nwipe_interval = \"1 min\"\nsigning_key = \"{}\"\n\n[verifier]\nurl = \"http://127.0.0.1:9\"\n",
        key.display()
    ));
    std::fs::write(cfg, text).unwrap();
    key
}

#[test]
fn a_missing_signing_key_refuses_the_start_before_anything_is_loaded() {
    let net = Net::new("pfk");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let key = with_missing_signing_key(&net, &cfg);
    let log = Daemon::start_refused(&cfg);
    assert!(
        log.contains(&key.display().to_string()) && log.contains("signing_key"),
        "the refusal names the key and its path:\n{log}"
    );
    assert_eq!(
        net.hook_programs(),
        Vec::<String>::new(),
        "a refused start attaches nothing:\n{log}"
    );
    assert_eq!(
        net.pinned_entries(),
        Vec::<std::path::PathBuf>::new(),
        "a refused start pins nothing:\n{log}"
    );
}

/// Removes a pin root the fixture does not know about, also when the test fails.
struct ExtraPinRoot(std::path::PathBuf);

impl Drop for ExtraPinRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn a_second_daemon_with_its_own_pin_root_refuses_an_interface_that_has_a_policer() {
    let net = Net::new("two");
    let first_cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let _first = Daemon::start(&first_cfg, &net.socket_path());
    let first_prog = net
        .hook_programs()
        .into_iter()
        .find(|p| p.contains("rw_egress"))
        .expect("the first daemon's egress policer is attached");
    let second_pins = ExtraPinRoot(std::path::PathBuf::from(format!(
        "{}-second",
        net.pin_root.display()
    )));
    let second_dir = net.dir.join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let text = std::fs::read_to_string(&first_cfg)
        .unwrap()
        .replace(
            &format!("pin_root = \"{}\"", net.pin_root.display()),
            &format!("pin_root = \"{}\"", second_pins.0.display()),
        )
        .replace(
            &net.dir.join("state").display().to_string(),
            &second_dir.join("state").display().to_string(),
        )
        .replace(
            &net.socket_path().display().to_string(),
            &second_dir.join("control.sock").display().to_string(),
        );
    let second_cfg = second_dir.join("rackwarden.toml");
    std::fs::write(&second_cfg, text).unwrap();
    let before = net.hook_programs();
    let log = Daemon::start_refused(&second_cfg);
    // "tcx egress: rw_egress #101": the refusal names the program and its id.
    let id = first_prog.rsplit('#').next().unwrap();
    assert!(
        log.contains("another rackwarden policer")
            && log.contains(&format!("rw_egress #{id}"))
            && log.contains(&net.pin_root.display().to_string()),
        "the refusal names the first daemon's program and pin root:\n{log}"
    );
    assert_eq!(
        net.hook_programs(),
        before,
        "the refused daemon attached nothing"
    );
    assert!(
        !second_pins.0.join("progs").exists(),
        "the refused daemon pinned nothing"
    );
}

/// A failure that only shows once the policer is loaded (here: the evidence log is locked by
/// another writer, which the epoch loop finds when it opens it) takes back what this start
/// loaded: a first start that fails leaves no policer behind.
#[test]
fn a_start_that_fails_after_loading_takes_its_new_policer_back() {
    let net = Net::new("pfl");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let keys = net.dir.join("keys");
    let o = std::process::Command::new(rackwarden_tests::bin("rackwarden"))
        .args(["keygen", "--out"])
        .arg(&keys)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    text.push_str(&format!(
        "\n[epoch]\nwipe_interval = \"1 min\"\nsigning_key = \"{}\"\n\n[verifier]\nurl = \"http://127.0.0.1:9\"\n",
        keys.join("host.key").display()
    ));
    std::fs::write(&cfg, text).unwrap();
    let state = net.dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let log = std::fs::File::create(state.join("evidence.jsonl")).unwrap();
    log.lock().unwrap();
    let out = Daemon::start_refused(&cfg);
    assert!(out.contains("in use by another process"), "{out}");
    assert_eq!(
        net.hook_programs(),
        Vec::<String>::new(),
        "the refused start took its policer back:\n{out}"
    );
    assert_eq!(
        net.pinned_entries(),
        Vec::<std::path::PathBuf>::new(),
        "the refused start took its pins back:\n{out}"
    );
    drop(log);
}

/// Two daemons on one pin root would adopt the same programs and both write the caps.
#[test]
fn a_second_daemon_on_the_same_pin_root_refuses() {
    let net = Net::new("same");
    let first_cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let _first = Daemon::start(&first_cfg, &net.socket_path());
    let second_dir = net.dir.join("second");
    std::fs::create_dir_all(&second_dir).unwrap();
    let text = std::fs::read_to_string(&first_cfg)
        .unwrap()
        .replace(
            &net.dir.join("state").display().to_string(),
            &second_dir.join("state").display().to_string(),
        )
        .replace(
            &net.socket_path().display().to_string(),
            &second_dir.join("control.sock").display().to_string(),
        );
    let second_cfg = second_dir.join("rackwarden.toml");
    std::fs::write(&second_cfg, text).unwrap();
    let log = Daemon::start_refused(&second_cfg);
    assert!(
        log.contains(&net.pin_root.display().to_string())
            && log.contains("another rackwardend runs on this pin root"),
        "the refusal names the pin root:\n{log}"
    );
    // The first daemon still holds its policer.
    assert!(
        net.hook_programs().iter().any(|p| p.contains("rw_egress")),
        "{log}"
    );
}

/// The pin root's lock goes with the process: a restart after `kill -9` or a stop adopts.
#[test]
fn a_restart_after_kill_9_or_stop_is_not_refused() {
    let net = Net::new("rst");
    let cfg = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let mut d = Daemon::start(&cfg, &net.socket_path());
    d.kill9();
    let mut d = Daemon::start(&cfg, &net.socket_path());
    d.stop();
    let d = Daemon::start(&cfg, &net.socket_path());
    assert!(
        d.log_text().contains("adopted pinned policer"),
        "{}",
        d.log_text()
    );
}
