//! `rackwarden-verifier.service` runs as a dynamic user that cannot read the TLS key
//! `tls-init` writes (0600 root). systemd hands it over with `LoadCredential=`, and the
//! config names it `tls_key = "credential:tls-key"`: the verifier reads it from
//! `$CREDENTIALS_DIRECTORY`. Here the built verifier runs as nobody (65534) with the key in a
//! directory laid out as systemd lays out a credentials directory (owned by that user,
//! 0500, the file 0400), and serves TLS to a client. Needs root (setpriv, chown).

use std::{
    os::unix::fs::PermissionsExt as _,
    path::Path,
    process::{Command, Stdio},
    time::Duration,
};

use rackwarden_tests::{bin, tls_init};

const NOBODY: u32 = 65534;

fn chown(p: &Path, mode: u32) {
    std::os::unix::fs::chown(p, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn config(dir: &Path, port: u16, tls_key: &str) -> std::path::PathBuf {
    let p = dir.join(format!("verifier-{port}.toml"));
    std::fs::write(
        &p,
        format!(
            r#"listen = "127.0.0.1:{port}"
tls_cert = "{tls}/server.pem"
tls_key = "{tls_key}"
database = "{state}/v.sqlite"

[policy]
min_root_of_trust = "none"
id = "credential-test"
nonce_ttl = "10 min"
max_wipe_interval = "15 min"
max_residue_host = "2 GiB"
max_residue_gpu = "1 GiB"
# The test host's own disks are residue (issue 25); the storage tests judge them at 0.
max_residue_persistent = "1024 TiB"
# The test host is a development machine: its own RAM and disks (hundreds of GB) are
# residue in the state bound; 1 PB keeps the bound's limit (10 TB) above them.
trainable_state = "1 PB"
max_epoch_fraction = 0.01

[racks.rack-a]
egress = "10 MB/s"
ingress = "10 MB/s"
"#,
            tls = dir.join("tls").display(),
            state = dir.join("state").display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The verifier as nobody, with `CREDENTIALS_DIRECTORY` set as systemd sets it.
fn as_nobody(cfg: &Path, creds: &Path) -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={NOBODY}"),
        &format!("--regid={NOBODY}"),
        "--clear-groups",
    ])
    .arg(bin("rackwarden-verifier"))
    .arg("--config")
    .arg(cfg)
    .arg("serve")
    .env("CREDENTIALS_DIRECTORY", creds)
    .stdout(Stdio::null())
    .stderr(Stdio::piped());
    c
}

#[test]
fn an_unprivileged_verifier_serves_tls_with_its_key_passed_as_a_credential() {
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test needs root");
    let dir = std::env::temp_dir().join(format!("rw-vcred-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    tls_init("127.0.0.1", &dir.join("tls"));
    let state = dir.join("state");
    std::fs::create_dir(&state).unwrap();
    chown(&state, 0o700);
    let creds = dir.join("credentials");
    std::fs::create_dir(&creds).unwrap();
    std::fs::copy(dir.join("tls/server.key"), creds.join("tls-key")).unwrap();
    chown(&creds.join("tls-key"), 0o400);
    chown(&creds, 0o500);

    // The key where tls-init left it (0600 root) is out of nobody's reach: serve refuses.
    let port = free_port();
    let direct = config(
        &dir,
        port,
        &dir.join("tls/server.key").display().to_string(),
    );
    let out = as_nobody(&direct, &creds).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("server.key"), "{err}");

    // Passed as a credential, it serves.
    let port = free_port();
    let cfg = config(&dir, port, "credential:tls-key");
    let mut child = as_nobody(&cfg, &creds).spawn().unwrap();
    let ca = std::fs::read(dir.join("tls/ca.pem")).unwrap();
    let client = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(5))
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let url = format!("https://127.0.0.1:{port}/v1/racks");
    let mut answer = None;
    for _ in 0..200 {
        if let Ok(r) = client.get(&url).send() {
            answer = Some((r.status().as_u16(), r.text().unwrap_or_default()));
            break;
        }
        if let Ok(Some(status)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("the verifier exited ({status}): {err}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    let (code, body) = answer.expect("no TLS answer from the unprivileged verifier");
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("rack-a"), "{body}");
    let _ = std::fs::remove_dir_all(&dir);
}
