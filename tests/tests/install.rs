//! `cargo xtask install --root DIR`: the installed tree, its modes, example configs that
//! parse, and units that `systemd-analyze verify` accepts.

use std::{os::unix::fs::PermissionsExt, process::Command};

use rackwarden_tests::bin;

#[test]
fn install_into_a_temporary_root_gives_the_tree_and_units_verify() {
    let root = std::env::temp_dir().join(format!("rw-install-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let out = Command::new(bin("xtask"))
        .args(["install", "--debug", "--no-build", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "xtask install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let want = [
        ("usr/local/bin/rackwardend", 0o755),
        ("usr/local/bin/rackwarden", 0o755),
        ("usr/local/bin/rackwarden-verifier", 0o755),
        ("usr/local/bin/rackwarden-serve", 0o755),
        ("usr/local/bin/rackwarden-replay", 0o755),
        ("usr/local/bin/rackwarden-model", 0o755),
        ("etc/systemd/system/rackwardend.service", 0o644),
        ("etc/systemd/system/rackwarden-verifier.service", 0o644),
        ("etc/sysusers.d/rackwarden.conf", 0o644),
        ("etc/tmpfiles.d/rackwarden.conf", 0o644),
        ("etc/rackwarden/rackwarden.toml.example", 0o644),
        ("etc/rackwarden-verifier/verifier.toml.example", 0o644),
        ("usr/local/share/doc/rackwarden/README.md", 0o644),
        ("usr/share/rackwarden/rackwardend.sha256", 0o644),
    ];
    for (p, mode) in want {
        let m = std::fs::metadata(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(m.permissions().mode() & 0o777, mode, "{p}");
    }
    assert_eq!(
        std::fs::read(root.join("usr/local/bin/rackwardend")).unwrap(),
        std::fs::read(bin("rackwardend")).unwrap()
    );
    // The daemon's SHA-256 (what IMA measures and the verifier's runtime policy names) is
    // recorded beside the install and printed, and is the installed binary's.
    let recorded =
        std::fs::read_to_string(root.join("usr/share/rackwarden/rackwardend.sha256")).unwrap();
    let sha: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(
        std::fs::read(root.join("usr/local/bin/rackwardend")).unwrap(),
    )
    .into();
    assert_eq!(
        recorded,
        format!("{}  /usr/local/bin/rackwardend\n", hex::encode(sha))
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&hex::encode(sha)));
    // The unit's Documentation= names a file that is installed.
    let unit =
        std::fs::read_to_string(root.join("etc/systemd/system/rackwardend.service")).unwrap();
    assert!(unit.contains("Documentation=file:///usr/local/share/doc/rackwarden/README.md"));
    // No leftovers of the atomic replace.
    let tmp = Command::new("find")
        .arg(&root)
        .args(["-name", "*.rackwarden-install-tmp"])
        .output()
        .unwrap();
    assert!(tmp.stdout.is_empty());

    // The example configs parse as shipped.
    // The daemon reads the verifier's CA when it reads its config: give it one made by
    // `tls-init`, where the example names it inside this root.
    let ex = root.join("etc/rackwarden/rackwarden.toml.example");
    let tls = root.join("tls");
    rackwarden_tests::tls_init("verifier.example", &tls);
    let text = std::fs::read_to_string(&ex).unwrap();
    assert!(text.contains("ca = \"/etc/rackwarden/verifier-ca.pem\""));
    let text = text.replace(
        "/etc/rackwarden/verifier-ca.pem",
        tls.join("ca.pem").to_str().unwrap(),
    );
    let cfg = rackwarden::config::Config::parse(&ex, &text).unwrap_or_else(|e| panic!("{e}"));
    assert!(cfg.epoch.is_some(), "the example shows the epoch loop");
    // The verifier's example requires tpm_ima: as shipped it refuses to start until the
    // daemon's digest is filled in, and with the operator's files it loads.
    let vex = root.join("etc/rackwarden-verifier/verifier.toml.example");
    let e = rackwarden_verifier::config::VerifierConfig::load(&vex)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("verifier.toml.example:") && e.contains("policy.runtime.daemon_digests"),
        "{e}"
    );
    let allowlist = root.join("ima-allowlist.txt");
    std::fs::write(&allowlist, format!("{}  /usr/bin/true\n", "cd".repeat(32))).unwrap();
    let text = std::fs::read_to_string(&vex)
        .unwrap()
        .replace(
            "REPLACE with the sha256 of rackwardend that cargo xtask install prints",
            &"ab".repeat(32),
        )
        .replace(
            "/etc/rackwarden-verifier/ima-allowlist.txt",
            allowlist.to_str().unwrap(),
        )
        .replace(
            "/etc/rackwarden-verifier/ek-roots.pem",
            tls.join("ca.pem").to_str().unwrap(),
        );
    let filled = rackwarden_verifier::config::VerifierConfig::parse(&vex, &text)
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        filled.policy.min_root_of_trust,
        rackwarden_attest::tpm::TrustLevel::TpmIma
    );

    // `install --verify` checks the units as installed: systemd-analyze verify, and the
    // exposure of each against its goal (daemon <= 4.0, verifier <= 2.5).
    let out = Command::new(bin("xtask"))
        .args(["install", "--debug", "--no-build", "--verify", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "xtask install --verify: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("systemd-analyze verify: both units OK"),
        "{text}"
    );
    for unit in ["rackwardend.service", "rackwarden-verifier.service"] {
        assert!(text.contains(&format!("exposure {unit}: ")), "{text}");
    }

    // uninstall removes what install wrote and nothing of the operator's.
    let kept = root.join("etc/rackwarden/rackwarden.toml");
    std::fs::write(&kept, "# the operator's config\n").unwrap();
    let out = Command::new(bin("xtask"))
        .args(["uninstall", "--root"])
        .arg(&root)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for (p, _) in want {
        assert!(!root.join(p).exists(), "{p} is left after uninstall");
    }
    assert!(kept.exists(), "uninstall must keep the operator's config");
    let _ = std::fs::remove_dir_all(&root);
}
