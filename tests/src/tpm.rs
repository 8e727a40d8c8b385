//! A software TPM for the TPM tests: swtpm 0.7.1 manufactured by `swtpm_setup` with an RSA-2048
//! EK certificate issued by a private local CA (as a TPM vendor would), served on 127.0.0.1.
//!
//! Manufacturing takes about a second (a CA with RSA-3072 keys, two EKs), so a test binary
//! manufactures once ([`manufactured`]) and every [`SwTpm`] runs on its own copy of that
//! state: tests never share PCRs or transient objects. Everything lives in temp dirs of this
//! process, with no config read from $HOME or /etc (swtpm_setup gets a private config that
//! points swtpm_localca at a private CA directory).

use std::{
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{
        OnceLock,
        atomic::{AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

static SEQ: AtomicU64 = AtomicU64::new(0);
static SHARED: OnceLock<Manufactured> = OnceLock::new();

/// A manufactured TPM state (`state/`) and the CA that issued its EK certificates (`ca/`).
/// Its directory goes with it on drop.
pub struct Manufactured {
    pub dir: PathBuf,
}

impl Manufactured {
    /// Runs swtpm_setup into a fresh directory: a new TPM (new EK seed) and a new CA.
    pub fn new(tag: &str) -> Manufactured {
        require_swtpm();
        let dir = unique_dir(&format!("mfg-{tag}"));
        // Constructed before anything can fail: Drop removes what exists.
        let m = Manufactured { dir };
        for sub in ["state", "ca", "certs"] {
            std::fs::create_dir_all(m.dir.join(sub)).unwrap();
        }
        m.write_configs();
        let out = Command::new("swtpm_setup")
            .args(["--tpm2", "--tpmstate"])
            .arg(m.dir.join("state"))
            .arg("--config")
            .arg(m.dir.join("swtpm_setup.conf"))
            .args(["--create-ek-cert", "--pcr-banks", "sha256"])
            .arg("--write-ek-cert-files")
            .arg(m.dir.join("certs"))
            .arg("--overwrite")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "swtpm_setup failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(m.state_file().exists(), "swtpm_setup wrote no TPM state");
        m
    }

    fn write_configs(&self) {
        let d = &self.dir;
        let setup = format!(
            "create_certs_tool = /usr/bin/swtpm_localca\n\
             create_certs_tool_config = {d}/swtpm-localca.conf\n\
             create_certs_tool_options = {d}/swtpm-localca.options\n\
             active_pcr_banks = sha256\n",
            d = d.display()
        );
        let localca = format!(
            "statedir = {ca}\nsigningkey = {ca}/signkey.pem\n\
             issuercert = {ca}/issuercert.pem\ncertserial = {ca}/certserial\n",
            ca = d.join("ca").display()
        );
        std::fs::write(d.join("swtpm_setup.conf"), setup).unwrap();
        std::fs::write(d.join("swtpm-localca.conf"), localca).unwrap();
        std::fs::write(
            d.join("swtpm-localca.options"),
            "--platform-manufacturer rackwarden\n--platform-version 2.1\n--platform-model test\n",
        )
        .unwrap();
    }

    fn state_file(&self) -> PathBuf {
        self.dir.join("state").join("tpm2-00.permall")
    }

    /// The self-signed root ("CN=swtpm-localca-rootca"): the manufacturer root to trust.
    pub fn ca_root(&self) -> PathBuf {
        self.dir.join("ca").join("swtpm-localca-rootca-cert.pem")
    }

    /// The issuing CA ("CN=swtpm-localca", signed by the root): an intermediate.
    pub fn ca_intermediate(&self) -> PathBuf {
        self.dir.join("ca").join("issuercert.pem")
    }

    /// The RSA-2048 EK certificate as swtpm_setup wrote it (DER), to compare with NV.
    pub fn ek_cert_file(&self) -> PathBuf {
        self.dir.join("certs").join("ek-rsa2048.crt")
    }
}

impl Drop for Manufactured {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The state this test binary manufactured once; removed when the process exits.
pub fn manufactured() -> &'static Manufactured {
    SHARED.get_or_init(|| {
        let m = Manufactured::new("shared");
        // A static is never dropped: remove its directory at exit instead (the test harness
        // leaves through exit(), also when tests failed).
        // SAFETY: atexit only stores the pointer to a function that takes and returns
        // nothing; remove_shared touches only a OnceLock and the file system.
        let rc = unsafe { libc::atexit(remove_shared) };
        assert_eq!(rc, 0, "atexit");
        m
    })
}

extern "C" fn remove_shared() {
    if let Some(m) = SHARED.get() {
        let _ = std::fs::remove_dir_all(&m.dir);
    }
}

/// A running swtpm on 127.0.0.1 (a port pair of its own), on a private copy of a manufactured
/// state. Killed by its PID and its directory removed on drop.
pub struct SwTpm {
    child: Child,
    pub dir: PathBuf,
    pub port: u16,
    /// `swtpm:host=127.0.0.1,port=P` (the TCTI uses P+1 for control).
    pub tcti: String,
    pub ca_root: PathBuf,
    pub ca_intermediate: PathBuf,
    /// The network namespace it listens in (its 127.0.0.1), if not the test's own: a daemon
    /// with `netns` set opens its TCTI from inside that namespace.
    pub netns: Option<String>,
}

impl SwTpm {
    /// A TPM from this binary's shared manufactured state.
    pub fn start() -> SwTpm {
        SwTpm::start_from(manufactured())
    }

    /// A TPM on a copy of `m`'s state. A port pair can be taken between choosing and binding
    /// it (other tests run beside us): then it tries another pair.
    pub fn start_from(m: &Manufactured) -> SwTpm {
        SwTpm::start_from_in(m, None)
    }

    /// A TPM from the shared state, listening on the loopback of network namespace `ns`.
    pub fn start_in_netns(ns: &str) -> SwTpm {
        SwTpm::start_from_in(manufactured(), Some(ns))
    }

    fn start_from_in(m: &Manufactured, netns: Option<&str>) -> SwTpm {
        let mut last = String::new();
        for _ in 0..5 {
            match SwTpm::try_start(m, netns) {
                Ok(t) => return t,
                Err(log) => last = log,
            }
        }
        panic!("swtpm did not start on 5 port pairs; last log:\n{last}");
    }

    fn try_start(m: &Manufactured, netns: Option<&str>) -> Result<SwTpm, String> {
        let dir = unique_dir("run");
        let state = dir.join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::copy(m.state_file(), state.join("tpm2-00.permall")).unwrap();
        let port = match netns {
            Some(ns) => {
                let ns = ns.to_string();
                crate::in_netns(&ns, free_port_pair)
            }
            None => free_port_pair(),
        };
        let log = dir.join("swtpm.log");
        let child = spawn_swtpm(&state, port, &log, netns);
        // From here Drop kills it and removes the directory, whatever happens next.
        let mut t = SwTpm {
            child,
            dir,
            port,
            tcti: format!("swtpm:host=127.0.0.1,port={port}"),
            ca_root: m.ca_root(),
            ca_intermediate: m.ca_intermediate(),
            netns: netns.map(String::from),
        };
        t.wait_listening()?;
        Ok(t)
    }

    fn wait_listening(&mut self) -> Result<(), String> {
        let t0 = Instant::now();
        let ctrl = self.port + 1;
        let listening = |ns: &Option<String>| match ns {
            Some(ns) => {
                crate::in_netns(ns, move || TcpStream::connect(("127.0.0.1", ctrl)).is_ok())
            }
            None => TcpStream::connect(("127.0.0.1", ctrl)).is_ok(),
        };
        while !listening(&self.netns) {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("swtpm exited ({status}):\n{}", self.log()));
            }
            if t0.elapsed() > Duration::from_secs(10) {
                return Err(format!("swtpm not listening after 10 s:\n{}", self.log()));
            }
            thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// A power cycle: swtpm stops and starts again on the same state and ports, so the TPM
    /// comes up with TPM2_Startup(CLEAR): PCRs from zero, resetCount one higher (a reboot).
    pub fn restart(&mut self) {
        // Child::kill signals our own child by its PID; wait reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.child = spawn_swtpm(
            &self.dir.join("state"),
            self.port,
            &self.dir.join("swtpm.log"),
            self.netns.as_deref(),
        );
        if let Err(log) = self.wait_listening() {
            panic!("swtpm did not come back after a restart:\n{log}");
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("swtpm.log")).unwrap_or_default()
    }
}

impl Drop for SwTpm {
    fn drop(&mut self) {
        // Child::kill signals our own child by its PID (SIGKILL); wait reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn_swtpm(
    state: &std::path::Path,
    port: u16,
    log: &std::path::Path,
    netns: Option<&str>,
) -> Child {
    // `ip netns exec` execs swtpm in place: the child's PID is swtpm's.
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "swtpm"]);
            c
        }
        None => Command::new("swtpm"),
    };
    cmd.args(["socket", "--tpm2", "--tpmstate"])
        .arg(format!("dir={}", state.display()))
        .arg("--server")
        .arg(format!("type=tcp,port={port},bindaddr=127.0.0.1"))
        .arg("--ctrl")
        .arg(format!("type=tcp,port={},bindaddr=127.0.0.1", port + 1))
        .args(["--flags", "not-need-init,startup-clear", "--log"])
        .arg(format!("file={},level=1", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Fails (never skips) when swtpm is missing: `cargo xtask setup` installs it, and CI must run
/// these tests.
pub fn require_swtpm() {
    for tool in ["swtpm", "swtpm_setup", "swtpm_localca", "certtool"] {
        let found = std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
            .unwrap_or(false);
        assert!(
            found,
            "{tool} is missing: install swtpm, swtpm-tools and gnutls-bin (`cargo xtask setup` does)"
        );
    }
}

/// A port P with P+1 also free on 127.0.0.1 (swtpm serves commands on P, control on P+1).
fn free_port_pair() -> u16 {
    for _ in 0..200 {
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = a.local_addr().unwrap().port();
        if p < u16::MAX && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair on 127.0.0.1");
}

fn unique_dir(tag: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::SeqCst);
    let d = std::env::temp_dir().join(format!("rwt-swtpm-{tag}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A `rackwarden-verifier serve` over TLS on 127.0.0.1 whose `[tpm]` trusts the EK CA of
/// [`manufactured`] (so it enrols the AKs of this binary's swtpms), its stderr in
/// `verifier.log`. Host keys are enrolled with the CLI before it serves. Killed by its PID
/// and its directory removed on drop.
pub struct TpmVerifier {
    child: Option<Child>,
    pub port: u16,
    pub dir: PathBuf,
    pub config: PathBuf,
    /// The TLS CA its certificate chains to (`verifier.ca` of a host's config).
    pub ca: PathBuf,
}

impl TpmVerifier {
    /// Writes the config and a TLS CA and certificate for 127.0.0.1; nothing runs yet.
    pub fn configure(tag: &str, rack: &str) -> TpmVerifier {
        let m = manufactured();
        let dir = unique_dir(&format!("verifier-{tag}"));
        crate::tls_init("127.0.0.1", &dir.join("tls"));
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let config = dir.join("verifier.toml");
        std::fs::write(
            &config,
            format!(
                r#"listen = "127.0.0.1:{port}"
tls_cert = "{tls}/server.pem"
tls_key = "{tls}/server.key"
database = "{db}"

[policy]
min_root_of_trust = "none"
id = "tpm-daemon-test"
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

[racks.{rack}]
egress = "10 MB/s"
ingress = "10 MB/s"

[tpm]
ek_roots = "{root}"
ek_intermediates = "{intermediate}"
challenge_ttl = "1 min"
"#,
                tls = dir.join("tls").display(),
                db = dir.join("v.sqlite").display(),
                root = m.ca_root().display(),
                intermediate = m.ca_intermediate().display(),
            ),
        )
        .unwrap();
        TpmVerifier {
            child: None,
            port,
            ca: dir.join("tls").join("ca.pem"),
            dir,
            config,
        }
    }

    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Enrols the host key whose public PEM is at `public_key`, as an operator does.
    pub fn enroll_key(&self, rack: &str, host: &str, public_key: &std::path::Path) {
        let key = public_key.to_str().unwrap();
        self.cli(&["enroll", "--rack", rack, "--host", host, "--key", key]);
    }

    /// Runs a CLI subcommand against this verifier's config; its stdout.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(crate::bin("rackwarden-verifier"))
            .arg("--config")
            .arg(&self.config)
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "rackwarden-verifier {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `serve` and waits until it listens.
    pub fn serve(&mut self) {
        let log = std::fs::File::create(self.dir.join("verifier.log")).unwrap();
        let child = Command::new(crate::bin("rackwarden-verifier"))
            .arg("--config")
            .arg(&self.config)
            .arg("serve")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let child = self.child.insert(child);
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("verifier exited ({status}):\n{}", self.log());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "verifier did not listen within 20 s:\n{}",
                self.log()
            );
            thread::sleep(Duration::from_millis(25));
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("verifier.log")).unwrap_or_default()
    }

    /// A client that trusts this verifier's TLS CA.
    pub fn client(&self) -> reqwest::blocking::Client {
        let ca = std::fs::read(&self.ca).unwrap();
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(20))
            .tls_built_in_root_certs(false)
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap()
    }
}

impl Drop for TpmVerifier {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            // Our own child, by its PID (SIGKILL); wait reaps it.
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
