//! `cargo xtask install --root DIR`: the installed tree, its modes, example configs that
//! parse, and units that `systemd-analyze verify` accepts.

use std::{os::unix::fs::PermissionsExt, path::Path, process::Command};

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
        ("etc/systemd/system/rackwardend.service", 0o644),
        ("etc/systemd/system/rackwarden-verifier.service", 0o644),
        ("etc/sysusers.d/rackwarden.conf", 0o644),
        ("etc/tmpfiles.d/rackwarden.conf", 0o644),
        ("etc/rackwarden/rackwarden.toml.example", 0o644),
        ("etc/rackwarden-verifier/verifier.toml.example", 0o644),
        ("usr/local/share/doc/rackwarden/README.md", 0o644),
    ];
    for (p, mode) in want {
        let m = std::fs::metadata(root.join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert_eq!(m.permissions().mode() & 0o777, mode, "{p}");
    }
    assert_eq!(
        std::fs::read(root.join("usr/local/bin/rackwardend")).unwrap(),
        std::fs::read(bin("rackwardend")).unwrap()
    );
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
    rackwarden_verifier::config::VerifierConfig::load(
        &root.join("etc/rackwarden-verifier/verifier.toml.example"),
    )
    .unwrap_or_else(|e| panic!("{e}"));

    // systemd-analyze checks the units against the distribution's own units, inside the
    // root: give the root those, and the commands the units name.
    let sa = Command::new("systemd-analyze").arg("--version").output();
    assert!(
        sa.is_ok_and(|o| o.status.success()),
        "systemd-analyze is missing: `cargo xtask setup` installs Debian's systemd package"
    );
    copy_dir(
        Path::new("/usr/lib/systemd/system"),
        &root.join("usr/lib/systemd/system"),
    );
    std::fs::create_dir_all(root.join("usr/bin")).unwrap();
    std::fs::copy("/bin/kill", root.join("usr/bin/kill")).unwrap();
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
    std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
    let out = Command::new("systemd-analyze")
        .arg(format!("--root={}", root.display()))
        .args([
            "verify",
            "/etc/systemd/system/rackwardend.service",
            "/etc/systemd/system/rackwarden-verifier.service",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.trim().is_empty(),
        "systemd-analyze verify: {err}"
    );
    let _ = std::fs::remove_dir_all(&root);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (p, t) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type().unwrap();
        if ft.is_symlink() {
            let _ = std::os::unix::fs::symlink(std::fs::read_link(&p).unwrap(), &t);
        } else if ft.is_dir() {
            copy_dir(&p, &t);
        } else {
            std::fs::copy(&p, &t).unwrap();
        }
    }
}
