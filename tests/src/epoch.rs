//! Fixtures for the epoch-loop tests and the demo: a real `rackwarden-verifier` serving TLS
//! (a CA and certificate from its own `tls-init`) on the rack namespace's loopback, the
//! host's and the verifier's keys, a small signed image set, workload hooks that record when inference was stopped and started, and a daemon
//! config with the `[epoch]` sections. Everything lives under the fixture's own directory
//! and namespaces, and goes with them on drop.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{Net, bin, in_netns};
use rackwarden_verifier::store::{DatabaseUrl, testing};

/// Address of the verifier inside the rack namespace (its loopback; nothing leaves it).
pub const VERIFIER_ADDR: &str = "127.0.0.1";

/// A verifier process in the rack namespace. Killed by PID on drop.
pub struct Verifier {
    pub ns: String,
    pub port: u16,
    pub dir: PathBuf,
    pub config: PathBuf,
    child: Option<Child>,
    log: PathBuf,
}

/// A free TCP port in namespace `ns`.
pub fn free_port(ns: &str) -> u16 {
    in_netns(ns, || {
        std::net::TcpListener::bind((VERIFIER_ADDR, 0))
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    })
}

impl Verifier {
    /// Writes the verifier config (policy with the manifest) without starting it.
    /// `max_residue_host`: the tests wipe a bounded slice of RAM, so the rest is residue;
    /// the policy says how much it accepts.
    pub fn configure(
        net: &Net,
        manifest: &Path,
        manifest_pub: &Path,
        max_residue_host: &str,
    ) -> Verifier {
        let dir = net.dir.join("verifier");
        std::fs::create_dir_all(&dir).unwrap();
        let port = free_port(&net.rack_ns);
        let tls = dir.join("tls");
        if !tls.join("ca.pem").exists() {
            crate::tls_init(VERIFIER_ADDR, &tls);
        }
        let config = dir.join("verifier.toml");
        // SQLite beside the config, or a database of its own on the run's PostgreSQL server
        // (`RACKWARDEN_TEST_POSTGRES`, reached over its unix socket from the rack's
        // namespace); made once per test, kept across reconfigurations.
        let db = match std::fs::read_to_string(dir.join("db.url")) {
            Ok(url) => DatabaseUrl::parse(&url),
            Err(_) => {
                let url = testing::fresh_database("epoch", &dir.join("verifier.sqlite")).unwrap();
                std::fs::write(dir.join("db.url"), url.config_text()).unwrap();
                url
            }
        };
        // The log key lies beside the SQLite file by default; a server has no "beside".
        let log_key = match db {
            DatabaseUrl::Sqlite(_) => String::new(),
            DatabaseUrl::Postgres(_) => {
                format!("log_key = \"{}\"\n", dir.join("tlog.key").display())
            }
        };
        std::fs::write(
            &config,
            format!(
                r#"listen = "{VERIFIER_ADDR}:{port}"
tls_cert = "{tls}/server.pem"
tls_key = "{tls}/server.key"
database = "{db}"
{log_key}max_body = "4 MiB"
request_timeout = "5 s"

[policy]
min_root_of_trust = "none"
id = "epoch-test"
nonce_ttl = "10 min"
max_wipe_interval = "10 min"
max_residue_host = "{max_residue_host}"
max_residue_gpu = "1 GiB"
# The test host's own disks are residue (issue 25); the storage tests judge them at 0.
max_residue_persistent = "1024 TiB"
# The test host is a development machine: its own RAM and disks (hundreds of GB) are
# residue in the state bound; 1 PB keeps the bound's limit (10 TB) above them.
trainable_state = "1 PB"
max_epoch_fraction = 0.01
manifest = "{manifest}"
manifest_key = "{manifest_pub}"

[racks.rack-test]
egress = "1 MB/s"
ingress = "1 MB/s"
"#,
                db = db.config_text(),
                tls = tls.display(),
                manifest = manifest.display(),
                manifest_pub = manifest_pub.display(),
            ),
        )
        .unwrap();
        Verifier {
            ns: net.rack_ns.clone(),
            port,
            dir: dir.clone(),
            config,
            child: None,
            log: dir.join("verifier.log"),
        }
    }

    pub fn url(&self) -> String {
        format!("https://{VERIFIER_ADDR}:{}", self.port)
    }

    /// The database this verifier (and any second instance of it) stores in.
    pub fn database(&self) -> DatabaseUrl {
        DatabaseUrl::parse(&std::fs::read_to_string(self.dir.join("db.url")).unwrap())
    }

    /// The CA hosts trust for this verifier (`[verifier] ca`).
    pub fn ca(&self) -> PathBuf {
        self.dir.join("tls/ca.pem")
    }

    /// The verifier's own certificate, for `[verifier] pinned_cert`.
    pub fn leaf_cert(&self) -> PathBuf {
        self.dir.join("tls/server-leaf.pem")
    }

    /// Another instance of this verifier: the same database, policy, TLS and log key (all
    /// beside the database), its own port, config file and log. Not started.
    pub fn second_instance(&self) -> Verifier {
        let port = free_port(&self.ns);
        let text = std::fs::read_to_string(&self.config).unwrap();
        let text = text.replacen(
            &format!("listen = \"{VERIFIER_ADDR}:{}\"", self.port),
            &format!("listen = \"{VERIFIER_ADDR}:{port}\""),
            1,
        );
        let config = self.dir.join(format!("verifier-{port}.toml"));
        std::fs::write(&config, text).unwrap();
        Verifier {
            ns: self.ns.clone(),
            port,
            dir: self.dir.clone(),
            config,
            child: None,
            log: self.dir.join(format!("verifier-{port}.log")),
        }
    }

    /// The daemon's `[verifier]` lines that reach this verifier: its URL and its CA.
    pub fn daemon_lines(&self) -> String {
        format!("url = \"{}\"\nca = \"{}\"", self.url(), self.ca().display())
    }

    pub fn enroll(&self, rack: &str, host: &str, key: &Path) {
        let out = Command::new(bin("rackwarden-verifier"))
            .arg("--config")
            .arg(&self.config)
            .args(["enroll", "--rack", rack, "--host", host, "--key"])
            .arg(key)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "enroll: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts `serve` inside the rack namespace and waits until it answers.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "verifier already running");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        // `ip netns exec` execs the verifier: the child's PID is the verifier's.
        let child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(bin("rackwarden-verifier"))
            .arg("--config")
            .arg(&self.config)
            .arg("serve")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("spawn rackwarden-verifier");
        self.child = Some(child);
        let t0 = Instant::now();
        while self.get("/v1/racks").is_none() {
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "verifier did not start: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL, by PID.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// `GET path` on the verifier, from inside its namespace; `None` if it does not answer.
    pub fn get(&self, path: &str) -> Option<serde_json::Value> {
        let (port, path, ca) = (self.port, path.to_string(), self.ca());
        in_netns(&self.ns, move || https_get(port, &path, &ca))
    }

    /// The body of a GET (the HTML pages), or `None` if there was no 200.
    pub fn get_text(&self, path: &str) -> Option<String> {
        let (port, path, ca) = (self.port, path.to_string(), self.ca());
        in_netns(&self.ns, move || https_get_text(port, &path, &ca))
    }

    /// The host's stored statements, oldest first (the API lists newest first).
    /// POSTs envelopes (`body`: one, or a JSON array of them) to `/v1/statements`; the
    /// answer's JSON, or `None` if there was no 200.
    pub fn post_statements(&self, body: Vec<u8>) -> Option<serde_json::Value> {
        self.post_json("/v1/statements", body)
    }

    /// POSTs a JSON body to `path`; the answer's body when it is a success.
    pub fn post_json(&self, path: &str, body: Vec<u8>) -> Option<serde_json::Value> {
        self.endpoint().post_json(path, body)
    }

    /// Where this verifier answers, for a thread that posts while this one is killed.
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            ns: self.ns.clone(),
            port: self.port,
            ca: self.ca(),
        }
    }

    /// Adds `policy_lines` to the `[policy]` table and `tables` at the end of the config (a
    /// verifier started after this reads them).
    pub fn extend_config(&self, policy_lines: &str, tables: &str) {
        let mut text = std::fs::read_to_string(&self.config).unwrap();
        if policy_lines.contains("min_root_of_trust") {
            // The base config names `none`; a key may appear once.
            text = text.replacen("min_root_of_trust = \"none\"\n", "", 1);
        }
        let text = text.replacen("[policy]\n", &format!("[policy]\n{policy_lines}\n"), 1);
        std::fs::write(&self.config, format!("{text}\n{tables}\n")).unwrap();
    }

    pub fn history(&self, rack: &str, host: &str) -> Vec<serde_json::Value> {
        let mut v = self
            .get(&format!("/v1/hosts/{rack}/{host}/statements?limit=10000"))
            .and_then(|v| v.as_array().cloned())
            .unwrap_or_default();
        v.sort_by_key(|s| s["seq"].as_u64().unwrap_or(u64::MAX));
        v
    }
}

/// A verifier's address and CA, apart from the process (see [`Verifier::endpoint`]).
#[derive(Clone)]
pub struct Endpoint {
    ns: String,
    port: u16,
    ca: PathBuf,
}

impl Endpoint {
    /// POSTs a JSON body to `path`; the answer's body when it is a success.
    pub fn post_json(&self, path: &str, body: Vec<u8>) -> Option<serde_json::Value> {
        let (port, ca, path) = (self.port, self.ca.clone(), path.to_string());
        in_netns(&self.ns, move || https_post(port, &path, body, &ca))
    }

    /// POSTs envelopes to `/v1/statements`; the answer's JSON, or `None` without a 200.
    pub fn post_statements(&self, body: Vec<u8>) -> Option<serde_json::Value> {
        self.post_json("/v1/statements", body)
    }
}

impl Drop for Verifier {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A GET over TLS trusting only `ca`; the body parsed as JSON. The client (and its
/// runtime thread) is made here, so its sockets live in the caller's namespace.
fn https_post(port: u16, path: &str, body: Vec<u8>, ca: &Path) -> Option<serde_json::Value> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).ok()?).ok()?;
    let c = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .build()
        .ok()?;
    let r = c
        .post(format!("https://{VERIFIER_ADDR}:{port}{path}"))
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().ok()
}

fn https_get(port: u16, path: &str, ca: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&https_get_text(port, path, ca)?).ok()
}

fn https_get_text(port: u16, path: &str, ca: &Path) -> Option<String> {
    let ca = reqwest::Certificate::from_pem(&std::fs::read(ca).ok()?).ok()?;
    let c = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2))
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .build()
        .ok()?;
    let r = c
        .get(format!("https://{VERIFIER_ADDR}:{port}{path}"))
        .send()
        .ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.text().ok()
}

/// Keys, a signed image set and workload hooks for one rack host.
pub struct EpochFixture {
    pub host_key: PathBuf,
    pub host_pub: PathBuf,
    pub verifier_pub: PathBuf,
    pub manifest: PathBuf,
    pub images: PathBuf,
    pub staging: PathBuf,
    /// Lines `stop <ms>` / `start <ms>` written by the workload hooks.
    pub workload_log: PathBuf,
    stop_hook: PathBuf,
    start_hook: PathBuf,
}

fn cli(args: &[&str]) -> String {
    let out = Command::new(bin("rackwarden")).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "rackwarden {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl EpochFixture {
    /// `image_bytes`: total size of the image set (two files).
    pub fn new(dir: &Path, image_bytes: usize) -> EpochFixture {
        let keys = dir.join("keys");
        std::fs::create_dir_all(&keys).unwrap();
        let k = keys.to_str().unwrap();
        cli(&["keygen", "--out", k, "--name", "host"]);
        cli(&["keygen", "--out", k, "--name", "verifier"]);
        let images = dir.join("models");
        std::fs::create_dir_all(images.join("tok")).unwrap();
        // Deterministic, incompressible-looking content.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut bytes = vec![0u8; image_bytes];
        for b in bytes.iter_mut() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        let split = image_bytes * 3 / 4;
        std::fs::write(images.join("weights.bin"), &bytes[..split]).unwrap();
        std::fs::write(images.join("tok/tokenizer.json"), &bytes[split..]).unwrap();
        let manifest = dir.join("manifest.dsse.json");
        cli(&[
            "manifest",
            "create",
            "--key",
            keys.join("verifier.key").to_str().unwrap(),
            "--out",
            manifest.to_str().unwrap(),
            images.to_str().unwrap(),
        ]);
        let workload_log = dir.join("workloads.log");
        let hook = |name: &str, word: &str| {
            let p = dir.join(name);
            std::fs::write(
                &p,
                format!(
                    // By path: a busybox sh (the VM guests') would run its own `date`,
                    // which has no %N.
                    "#!/bin/sh\necho \"{word} $(/usr/bin/date +%s%3N)\" >> {}\n",
                    workload_log.display()
                ),
            )
            .unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
            p
        };
        EpochFixture {
            host_key: keys.join("host.key"),
            host_pub: keys.join("host.pub"),
            verifier_pub: keys.join("verifier.pub"),
            manifest,
            images,
            staging: dir.join("staging"),
            stop_hook: hook("stop-inference.sh", "stop"),
            start_hook: hook("start-inference.sh", "start"),
            workload_log,
        }
    }

    /// The `[epoch]` ... `[workloads]` sections for a daemon config.
    /// `verifier_lines`: the `[verifier]` section's url and trust (`Verifier::daemon_lines`).
    pub fn sections(&self, verifier_lines: &str, wipe_interval: &str, wipe_max: &str) -> String {
        format!(
            r#"
[epoch]
wipe_interval = "{wipe_interval}"
challenge_timeout = "2 s"
signing_key = "{key}"

[verifier]
{verifier_lines}
request_timeout = "3 s"
retry_max = "1 s"

[wipe]
backends = ["host"]
max_bytes = "{wipe_max}"
reserve = "1 GiB"

[images]
manifest = "{manifest}"
manifest_key = "{vpub}"
source = "{source}"
staging = "{staging}"

[workloads]
stop_command = ["{stop}"]
start_command = ["{start}"]
stop_timeout = "10 s"
"#,
            key = self.host_key.display(),
            manifest = self.manifest.display(),
            vpub = self.verifier_pub.display(),
            source = self.images.display(),
            staging = self.staging.display(),
            stop = self.stop_hook.display(),
            start = self.start_hook.display(),
        )
    }

    /// The hooks' record: ("stop" | "start", unix ms), in order.
    pub fn workload_events(&self) -> Vec<(String, u64)> {
        std::fs::read_to_string(&self.workload_log)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| {
                let (w, t) = l.split_once(' ')?;
                Some((w.to_string(), t.trim().parse().ok()?))
            })
            .collect()
    }
}

/// The rack id the fixture's daemon config uses, and its host id.
pub fn ids(net: &Net) -> (String, String) {
    ("rack-test".into(), format!("host-{}", net.rack_if))
}

/// Writes a daemon config with the epoch sections appended; returns its path.
pub fn write_epoch_config(net: &Net, sections: &str) -> PathBuf {
    let path = net.write_config("1 MB/s", "1 MB/s", "256 KiB");
    let mut text = std::fs::read_to_string(&path).unwrap();
    text += sections;
    std::fs::write(&path, text).unwrap();
    path
}

/// Polls `rackwarden status --json` until `pred` holds on its `epoch` part, or panics after
/// `timeout` with the last status.
pub fn wait_epoch(
    socket: &Path,
    timeout: Duration,
    what: &str,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let t0 = Instant::now();
    let mut last = serde_json::Value::Null;
    while t0.elapsed() < timeout {
        if socket.exists() {
            let out = Command::new(bin("rackwarden"))
                .args(["status", "--json", "--socket"])
                .arg(socket)
                .output()
                .unwrap();
            if out.status.success()
                && let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout)
            {
                if pred(&v["epoch"]) {
                    return v;
                }
                last = v;
            }
        }
        std::thread::sleep(Duration::from_millis(30));
    }
    panic!(
        "timed out after {timeout:?} waiting for {what}; last status epoch part: {}",
        serde_json::to_string_pretty(&last["epoch"]).unwrap_or_default()
    );
}

/// The statement (predicate JSON) inside a stored history row's verbatim envelope.
pub fn predicate_of(row: &serde_json::Value) -> serde_json::Value {
    use base64::Engine as _;
    let env: serde_json::Value = serde_json::from_str(row["envelope"].as_str().unwrap()).unwrap();
    let payload = base64::engine::general_purpose::STANDARD
        .decode(env["payload"].as_str().unwrap())
        .unwrap();
    let st: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    st["predicate"].clone()
}

/// The finding codes of a stored history row's verdict, in order.
pub fn codes(row: &serde_json::Value) -> Vec<String> {
    crate::tpmmatrix::codes(&row["result"])
}

/// The detail of the first finding of a stored row's verdict with `code`, if it has one.
pub fn finding(row: &serde_json::Value, code: &str) -> Option<String> {
    row["result"]["findings"].as_array().and_then(|f| {
        f.iter()
            .find(|x| x["code"] == code)
            .and_then(|x| x["detail"].as_str().map(String::from))
    })
}

/// `rackwarden wipe-now` against a socket.
pub fn wipe_now(socket: &Path) {
    let out = Command::new(bin("rackwarden"))
        .args(["wipe-now", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "wipe-now: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `rackwarden verify --key PUB LOG`: whether every statement verifies offline, and the table.
pub fn verify_log(host_pub: &Path, log: &Path) -> (bool, String) {
    let out = Command::new(bin("rackwarden"))
        .args(["verify", "--key"])
        .arg(host_pub)
        .arg(log)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}
