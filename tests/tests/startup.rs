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
