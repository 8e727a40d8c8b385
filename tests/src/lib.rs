//! Fixtures for rackwarden's integration tests and demo: a "rack" and an "outside" network
//! namespace joined by a veth pair, a daemon process running against them, and traffic
//! generators. Every fixture has its own namespace, interface and pin names (so tests can
//! run side by side) and removes all of them on drop, also when the test fails.
//!
//! Addresses are TEST-NET-1 (192.0.2.0/24) and exist only inside the fixture's namespaces.

pub mod benchstats;
pub mod bootmatrix;
pub mod demo;
pub mod epoch;
pub mod gpu;
pub mod guardteam;
pub mod redteam;
pub mod replaybench;
pub mod serving;
pub mod tamper;
pub mod tapped;
pub mod tpm;
pub mod tpmbench;
pub mod tpmmatrix;
pub mod watchbench;
pub mod wipe;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    thread,
    time::{Duration, Instant},
};

pub const RACK_ADDR: &str = "192.0.2.1";
pub const OUT_ADDR: &str = "192.0.2.2";
/// Ethernet + IPv4 + UDP headers: `skb->len` at tc = UDP payload + this.
pub const UDP_FRAME_OVERHEAD: u64 = 14 + 20 + 8;

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The share of burst + rate x T a flood must at least deliver (the limiter must not
/// under-deliver). The upper bound is exact everywhere; this floor is about usefulness, and
/// in a VM under TCG (`cargo xtask vm-test`, `RACKWARDEN_VM` set) two emulated guests share
/// two host cores, so a sender cannot always offer 10 MB/s: the floor there is 90%.
pub fn delivery_floor() -> f64 {
    if std::env::var_os("RACKWARDEN_VM").is_some() {
        0.90
    } else {
        0.97
    }
}

/// Fails the test (never skips) when not root: CI runs as root and these tests must run there.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        panic!(
            "this test needs root (network namespaces, BPF); run it via `cargo xtask test` as root"
        );
    }
}

fn run(cmd: &[&str]) {
    run_tool(cmd[0], &cmd[1..], None);
}

/// Runs a tool to completion with `stdin` written to it; its trimmed stdout. Panics, naming
/// the command and what it printed on stderr, unless it succeeds.
pub fn run_tool(cmd: &str, args: &[&str], stdin: Option<&[u8]>) -> String {
    use std::io::Write as _;
    let mut child = Command::new(cmd)
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    if let (Some(d), Some(mut p)) = (stdin, child.stdin.take()) {
        p.write_all(d).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Two namespaces joined by veth: `rack_if` in `rack_ns` (192.0.2.1), `out_if` in `out_ns`
/// (192.0.2.2), plus a pin root and a state dir that belong to this fixture only.
pub struct Net {
    pub rack_ns: String,
    pub out_ns: String,
    pub rack_if: String,
    pub out_if: String,
    pub pin_root: PathBuf,
    pub dir: PathBuf,
    /// A cgroup v2 directory of this fixture's own: the daemon's bypass refusal attaches
    /// there (`refusal_cgroup`), so a test neither refuses nor counts other processes. Tests
    /// about the system-wide refusal use [`Net::write_config_root_refusal`].
    pub cgroup: PathBuf,
}

impl Net {
    pub fn new(tag: &str) -> Net {
        require_root();
        let n = SEQ.fetch_add(1, Ordering::SeqCst);
        let id = format!("{:x}{n}", std::process::id() % 0xfffff);
        let tag: String = tag
            .chars()
            .filter(|c| c.is_ascii_alphanumeric())
            .take(4)
            .collect();
        let net = Net {
            rack_ns: format!("rwt-{tag}-{id}-rack"),
            out_ns: format!("rwt-{tag}-{id}-out"),
            rack_if: format!("rr{id}"),
            out_if: format!("ro{id}"),
            pin_root: PathBuf::from(format!("/sys/fs/bpf/rwt-{tag}-{id}")),
            dir: std::env::temp_dir().join(format!("rwt-{tag}-{id}")),
            cgroup: rackwarden::limiter::sockopt::cgroup2_root()
                .expect("a cgroup v2 hierarchy (the bypass refusal attaches to one)")
                .join(format!("rwt-{tag}-{id}")),
        };
        assert!(net.rack_if.len() <= 15 && net.out_if.len() <= 15);
        // Constructed before any command runs: if one fails, Drop still removes what exists.
        let _ = std::fs::remove_dir_all(&net.dir);
        std::fs::create_dir_all(&net.dir).unwrap();
        std::fs::create_dir_all(&net.cgroup).unwrap();
        run(&["ip", "netns", "add", &net.rack_ns]);
        run(&["ip", "netns", "add", &net.out_ns]);
        run(&[
            "ip",
            "link",
            "add",
            &net.rack_if,
            "netns",
            &net.rack_ns,
            "type",
            "veth",
            "peer",
            "name",
            &net.out_if,
            "netns",
            &net.out_ns,
        ]);
        for (ns, ifc, addr) in [
            (&net.rack_ns, &net.rack_if, RACK_ADDR),
            (&net.out_ns, &net.out_if, OUT_ADDR),
        ] {
            // No IPv6: router solicitations and MLD reports would spend budget in the
            // middle of a measurement.
            run(&[
                "ip",
                "netns",
                "exec",
                ns,
                "sysctl",
                "-qw",
                &format!("net.ipv6.conf.{ifc}.disable_ipv6=1"),
            ]);
            run(&[
                "ip",
                "-n",
                ns,
                "addr",
                "add",
                &format!("{addr}/24"),
                "dev",
                ifc,
            ]);
            run(&["ip", "-n", ns, "link", "set", ifc, "up"]);
            run(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        // Static neighbours: no ARP exchange inside a measurement window.
        net.static_neighbours();
        net
    }

    fn static_neighbours(&self) {
        let mac = |ns: &str, ifc: &str| -> String {
            let out = Command::new("ip")
                .args(["-n", ns, "-j", "link", "show", ifc])
                .output()
                .unwrap();
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            v[0]["address"].as_str().unwrap().to_string()
        };
        let rack_mac = mac(&self.rack_ns, &self.rack_if);
        let out_mac = mac(&self.out_ns, &self.out_if);
        run(&[
            "ip",
            "-n",
            &self.rack_ns,
            "neigh",
            "replace",
            OUT_ADDR,
            "lladdr",
            &out_mac,
            "dev",
            &self.rack_if,
            "nud",
            "permanent",
        ]);
        run(&[
            "ip",
            "-n",
            &self.out_ns,
            "neigh",
            "replace",
            RACK_ADDR,
            "lladdr",
            &rack_mac,
            "dev",
            &self.out_if,
            "nud",
            "permanent",
        ]);
    }

    /// Writes a daemon config for this fixture and returns its path.
    pub fn write_config(&self, egress: &str, ingress: &str, burst: &str) -> PathBuf {
        let path = self.dir.join("rackwarden.toml");
        let text = format!(
            r#"# generated by the rackwarden test fixture
rack_id = "rack-test"
host_id = "host-{id}"
host_share = 1.0
interfaces = ["{ifc}"]
netns = "{ns}"
pin_root = "{pins}"
state_dir = "{state}"
control_socket = "{sock}"
check_interval = "500 ms"
refusal_cgroup = "{cgroup}"
self_protection = "off"

[cap]
egress = "{egress}"
ingress = "{ingress}"
burst = "{burst}"
"#,
            id = self.rack_if,
            ifc = self.rack_if,
            ns = self.rack_ns,
            pins = self.pin_root.display(),
            state = self.dir.join("state").display(),
            sock = self.dir.join("control.sock").display(),
            cgroup = self.cgroup.display(),
        );
        std::fs::write(&path, text).unwrap();
        path
    }

    /// As [`Net::write_config`], with the bypass refusal at the cgroup v2 root (every
    /// process), for the tests about that refusal.
    pub fn write_config_root_refusal(&self, egress: &str, ingress: &str, burst: &str) -> PathBuf {
        let path = self.write_config(egress, ingress, burst);
        let text = std::fs::read_to_string(&path).unwrap();
        let text: String = text
            .lines()
            .filter(|l| !l.starts_with("refusal_cgroup"))
            .map(|l| format!("{l}\n"))
            .collect();
        std::fs::write(&path, text).unwrap();
        path
    }

    /// As [`Net::write_config`], with the guard required (`self_protection = "lsm"`):
    /// the daemon refuses to start where it cannot seal. The other fixtures leave it off so
    /// their tamper tests exercise the restore-on-poll path every kernel has.
    pub fn write_config_guarded(&self, egress: &str, ingress: &str, burst: &str) -> PathBuf {
        set_protection(self.write_config(egress, ingress, burst), "lsm")
    }

    /// As [`Net::write_config_root_refusal`], with the tamper watch and no guard
    /// (`self_protection = "watch"`): the red-team matrix of hosts without BPF LSM.
    pub fn write_config_watched(&self, egress: &str, ingress: &str, burst: &str) -> PathBuf {
        set_protection(
            self.write_config_root_refusal(egress, ingress, burst),
            "watch",
        )
    }

    pub fn socket_path(&self) -> PathBuf {
        self.dir.join("control.sock")
    }

    /// Floods rack -> outside with 1400-byte UDP datagrams for `secs`; returns the frame bytes
    /// that arrived and the sender's window in seconds.
    pub fn egress_flood(&self, secs: f64) -> (u64, f64) {
        self.egress_flood_during(secs, Duration::ZERO, || {})
    }

    /// [`Net::egress_flood`] with `act` run `after` the flood started, while it runs.
    pub fn egress_flood_during(
        &self,
        secs: f64,
        after: Duration,
        act: impl FnOnce(),
    ) -> (u64, f64) {
        let sink = UdpSink::start(&self.out_ns, OUT_ADDR);
        let dst: SocketAddr = format!("{OUT_ADDR}:{}", sink.port).parse().unwrap();
        let flood = udp_send(&self.rack_ns, dst, 1400, secs, None, None);
        thread::sleep(after);
        act();
        let sent = flood.join().unwrap();
        let (b, p) = sink.finish();
        (b + p * UDP_FRAME_OVERHEAD, window_secs(&[sent]))
    }

    pub fn pins(&self) -> rackwarden::pins::PinPaths {
        rackwarden::pins::PinPaths::new(&self.pin_root)
    }

    /// Where a test pins a program of its own (a stand-in for another build or an
    /// attacker's): inside this fixture's pin root, so it goes with the fixture.
    pub fn foreign_pin(&self, name: &str) -> PathBuf {
        self.pin_root.join(name)
    }

    /// Loads and attaches the policer on the rack interface with the library alone (no
    /// daemon), its config map frozen with `caps` (`CapSlot::Unset`: fails closed).
    pub fn attach_bare_limiter(
        &self,
        caps: [rackwarden::limiter::maps::CapSlot; 2],
    ) -> rackwarden::pins::PinPaths {
        self.attach_bare_variant(caps, rackwarden::limiter::loader::PolicerVariant::Plain)
    }

    /// [`Net::attach_bare_limiter`] with the tapped policer: every frame it passes goes to the
    /// ring `RW_TAP` under this fixture's pin root.
    pub fn attach_tapped_limiter(
        &self,
        caps: [rackwarden::limiter::maps::CapSlot; 2],
    ) -> rackwarden::pins::PinPaths {
        self.attach_bare_variant(caps, rackwarden::limiter::loader::PolicerVariant::Tapped)
    }

    fn attach_bare_variant(
        &self,
        caps: [rackwarden::limiter::maps::CapSlot; 2],
        variant: rackwarden::limiter::loader::PolicerVariant,
    ) -> rackwarden::pins::PinPaths {
        let pins = self.pins();
        let (p2, ifc) = (pins.clone(), self.rack_if.clone());
        in_netns(&self.rack_ns, move || {
            let mut l = rackwarden::limiter::Limiter::load_or_adopt(&p2, &caps, variant)
                .expect("load the policer");
            l.choose_kind(rackwarden::config::AttachMode::Auto, &ifc);
            l.attach_all(std::slice::from_ref(&ifc))
                .expect("attach the policer");
        });
        pins
    }

    /// Every BPF program on the rack interface's hooks, tcx and clsact, both directions, as
    /// `"<hook> <direction>: <name> #<id>"`: what a start that must touch nothing leaves empty.
    pub fn hook_programs(&self) -> Vec<String> {
        use aya::programs::{SchedClassifier, TcAttachType};
        let ifc = self.rack_if.clone();
        let mut found = in_netns(&self.rack_ns, move || {
            let mut found = Vec::new();
            for (dir, t) in [
                ("egress", TcAttachType::Egress),
                ("ingress", TcAttachType::Ingress),
            ] {
                // A kernel without tcx has none there; clsact is listed below.
                if let Ok((_, infos)) = SchedClassifier::query_tcx(&ifc, t) {
                    for i in infos {
                        found.push(format!(
                            "tcx {dir}: {} #{}",
                            i.name_as_str().unwrap_or("?"),
                            i.id()
                        ));
                    }
                }
            }
            found
        });
        for dir in ["egress", "ingress"] {
            let out = Command::new("tc")
                .args([
                    "-n",
                    &self.rack_ns,
                    "filter",
                    "show",
                    "dev",
                    &self.rack_if,
                    dir,
                ])
                .output()
                .unwrap();
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains(" bpf ") {
                    found.push(format!("clsact {dir}: {}", line.trim()));
                }
            }
        }
        found
    }

    /// The entries under the pin root (recursively), or none where it does not exist.
    pub fn pinned_entries(&self) -> Vec<PathBuf> {
        fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
            let Ok(rd) = std::fs::read_dir(dir) else {
                return;
            };
            for e in rd.flatten() {
                out.push(e.path());
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    walk(&e.path(), out);
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.pin_root, &mut out);
        out
    }

    /// Changes the caps of a bare limiter the way the daemon does: a new generation.
    pub fn change_bare_caps(&self, caps: [rackwarden::limiter::maps::CapSlot; 2]) {
        let (p2, ifc) = (self.pins(), self.rack_if.clone());
        in_netns(&self.rack_ns, move || {
            let mut l = rackwarden::limiter::Limiter::adopt(&p2).expect("adopt the policer");
            l.choose_kind(rackwarden::config::AttachMode::Auto, &ifc);
            l.change_caps(&caps, std::slice::from_ref(&ifc))
                .expect("change the caps");
        });
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        // Deleting the namespaces destroys the veth pair and any tc state on it; removing the
        // pin root releases the pinned programs, links and maps.
        let _ = Command::new("ip")
            .args(["netns", "del", &self.rack_ns])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.out_ns])
            .status();
        let _ = std::fs::remove_dir_all(&self.pin_root);
        let _ = std::fs::remove_dir_all(&self.dir);
        // Empty by now (no process of ours stays in it); its links go with it.
        let _ = std::fs::remove_dir(&self.cgroup);
    }
}

/// A CA and a server certificate for `name` in `out`, made by `rackwarden-verifier tls-init`
/// (ca.pem, server.pem, server.key, server-leaf.pem).
pub fn tls_init(name: &str, out: &Path) {
    let o = Command::new(bin("rackwarden-verifier"))
        .args(["tls-init", "--name", name, "--out"])
        .arg(out)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "tls-init: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Path of a workspace binary (built by `cargo xtask test` before the tests run).
pub fn bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // Tests run from target/<profile>/deps/, binaries from target/<profile>/.
    let mut dir = exe.parent().unwrap();
    if dir.ends_with("deps") {
        dir = dir.parent().unwrap();
    }
    let p = dir.join(name);
    assert!(
        p.exists(),
        "{} is missing: build the workspace binaries first (`cargo xtask test` does)",
        p.display()
    );
    p
}

/// Rewrites the fixture config's `self_protection` (written `"off"`) to `mode`.
pub fn set_protection(path: PathBuf, mode: &str) -> PathBuf {
    let text = std::fs::read_to_string(&path).unwrap().replace(
        "self_protection = \"off\"",
        &format!("self_protection = \"{mode}\""),
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// A running `rackwardend`, killed (by its own PID) on drop.
pub struct Daemon {
    pub child: Child,
    pub log: PathBuf,
}

impl Daemon {
    pub fn start(config: &Path, socket: &Path) -> Daemon {
        Daemon::start_with_env(config, socket, &[])
    }

    /// Starts the daemon from another executable than the build's (a modified copy).
    pub fn start_exe(exe: &Path, config: &Path, socket: &Path) -> Daemon {
        Daemon::spawn(exe, config, socket, &[])
    }

    /// Starts the daemon with extra environment (e.g. the epoch loop's test hook).
    pub fn start_with_env(config: &Path, socket: &Path, env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn(&bin("rackwardend"), config, socket, env)
    }

    fn spawn(exe: &Path, config: &Path, socket: &Path, env: &[(&str, &str)]) -> Daemon {
        let log = config.with_extension(format!("log.{}", SEQ.fetch_add(1, Ordering::SeqCst)));
        let f = std::fs::File::create(&log).unwrap();
        let _ = std::fs::remove_file(socket);
        let child = Command::new(exe)
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("spawn rackwardend");
        let mut d = Daemon { child, log };
        let t0 = Instant::now();
        while !socket.exists() {
            if let Ok(Some(status)) = d.child.try_wait() {
                panic!("rackwardend exited at start ({status}):\n{}", d.log_text());
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "rackwardend did not start:\n{}",
                d.log_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
        d
    }

    /// Starts the daemon where it must refuse to start; returns its log once it has exited.
    pub fn start_refused(config: &Path) -> String {
        let log = config.with_extension(format!("log.{}", SEQ.fetch_add(1, Ordering::SeqCst)));
        let f = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(bin("rackwardend"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(f)
            .spawn()
            .expect("spawn rackwardend");
        let t0 = Instant::now();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                assert!(!status.success(), "rackwardend exited 0");
                return std::fs::read_to_string(&log).unwrap_or_default();
            }
            if t0.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "rackwardend did not refuse to start:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// SIGKILL: no cleanup code of the daemon runs.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait.
    pub fn stop(&mut self) {
        // SAFETY: signalling our own child by PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill9();
        }
    }
}

/// Runs `f` on a thread that has entered network namespace `ns`. Sockets created inside stay
/// in that namespace whichever thread uses them later.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_string();
    thread::spawn(move || {
        rackwarden::netns::enter(&ns).expect("enter netns");
        f()
    })
    .join()
    .expect("netns thread panicked")
}

/// One HTTP/1.1 exchange through the capped veth: a client in the outside namespace sends
/// `request` to the rack's TCP `port` and reads `response` back, whole, before both close.
pub fn http_exchange(net: &Net, port: u16, request: Vec<u8>, response: Vec<u8>) {
    use std::io::{Read, Write};
    let (rack_ns, out_ns) = (net.rack_ns.clone(), net.out_ns.clone());
    let (req_len, resp) = (request.len(), response.clone());
    let server = thread::spawn(move || {
        rackwarden::netns::enter(&rack_ns).expect("enter netns");
        let l = std::net::TcpListener::bind((RACK_ADDR, port)).expect("bind");
        let (mut s, _) = l.accept().expect("accept");
        let mut got = vec![0u8; req_len];
        s.read_exact(&mut got).expect("read the request");
        s.write_all(&resp).expect("write the response");
        s.shutdown(std::net::Shutdown::Write).expect("shutdown");
        let _ = s.read(&mut [0u8; 1]);
    });
    thread::sleep(std::time::Duration::from_millis(200));
    let got = in_netns(&out_ns, move || {
        let mut s = std::net::TcpStream::connect((RACK_ADDR, port)).expect("connect");
        s.write_all(&request).expect("write the request");
        let mut got = Vec::new();
        s.read_to_end(&mut got).expect("read the response");
        got
    });
    assert_eq!(got, response, "the response arrived whole");
    server.join().expect("the server thread");
}

pub fn pin_to_cpu(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes within it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// Result of a traffic run.
#[derive(Debug, Clone, Copy)]
pub struct Delivered {
    /// Bytes the sender handed to the kernel (payload).
    pub offered_payload: u64,
    /// Payload bytes that arrived.
    pub delivered_payload: u64,
    /// Datagrams (or 0 for TCP) that arrived.
    pub delivered_packets: u64,
    /// Sender's wall time from first send to last send.
    pub secs: f64,
}

impl Delivered {
    pub fn delivered_frame_bytes(&self) -> u64 {
        self.delivered_payload + self.delivered_packets * UDP_FRAME_OVERHEAD
    }
}

/// UDP receiver bound in `ns` at `addr:port`; counts payload bytes and datagrams.
pub struct UdpSink {
    pub port: u16,
    bytes: Arc<AtomicU64>,
    packets: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    handle: Option<thread::JoinHandle<()>>,
}

impl UdpSink {
    pub fn start(ns: &str, addr: &str) -> UdpSink {
        let addr = addr.to_string();
        let sock = in_netns(ns, move || {
            let s =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None).unwrap();
            let _ = s.set_recv_buffer_size(8 << 20);
            let sa: SocketAddr = format!("{addr}:0").parse().unwrap();
            s.bind(&sa.into()).unwrap();
            UdpSocket::from(s)
        });
        let port = sock.local_addr().unwrap().port();
        sock.set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let bytes = Arc::new(AtomicU64::new(0));
        let packets = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (b, p, st) = (bytes.clone(), packets.clone(), stop.clone());
        let handle = thread::spawn(move || {
            let mut buf = vec![0u8; 65536];
            while !st.load(Ordering::SeqCst) {
                if let Ok(n) = sock.recv(&mut buf) {
                    b.fetch_add(n as u64, Ordering::SeqCst);
                    p.fetch_add(1, Ordering::SeqCst);
                }
            }
        });
        UdpSink {
            port,
            bytes,
            packets,
            stop,
            handle: Some(handle),
        }
    }

    pub fn totals(&self) -> (u64, u64) {
        (
            self.bytes.load(Ordering::SeqCst),
            self.packets.load(Ordering::SeqCst),
        )
    }

    /// Waits until nothing has arrived for a moment, then stops and returns the totals.
    pub fn finish(mut self) -> (u64, u64) {
        let mut last = self.totals();
        loop {
            thread::sleep(Duration::from_millis(300));
            let now = self.totals();
            if now == last {
                break;
            }
            last = now;
        }
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
        last
    }
}

impl Drop for UdpSink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// What one sender did: payload bytes handed to the kernel, and the instants of its first
/// and last send (several senders' window is earliest start to latest end).
#[derive(Debug, Clone, Copy)]
pub struct Sent {
    pub offered: u64,
    pub start: Instant,
    pub end: Instant,
}

/// The window covering all senders, in seconds.
pub fn window_secs(sent: &[Sent]) -> f64 {
    let start = sent.iter().map(|s| s.start).min().unwrap();
    let end = sent.iter().map(|s| s.end).max().unwrap();
    end.duration_since(start).as_secs_f64()
}

/// Sends UDP datagrams of `payload` bytes from `ns` to `dst` for `secs`, optionally paced
/// to `rate_bytes_per_s` (payload), optionally pinned to a CPU.
pub fn udp_send(
    ns: &str,
    dst: SocketAddr,
    payload: usize,
    secs: f64,
    rate_bytes_per_s: Option<u64>,
    cpu: Option<usize>,
) -> thread::JoinHandle<Sent> {
    let ns = ns.to_string();
    thread::spawn(move || {
        rackwarden::netns::enter(&ns).expect("enter netns");
        if let Some(c) = cpu {
            pin_to_cpu(c);
        }
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        s.connect(dst).unwrap();
        let buf = vec![0x5au8; payload];
        let mut offered = 0u64;
        let t0 = Instant::now();
        let mut end = t0;
        let dur = Duration::from_secs_f64(secs);
        loop {
            let el = t0.elapsed();
            if el >= dur {
                break;
            }
            if let Some(r) = rate_bytes_per_s {
                let allowed = (el.as_secs_f64() * r as f64) as u64;
                if offered >= allowed {
                    thread::sleep(Duration::from_micros(500));
                    continue;
                }
            }
            if s.send(&buf).is_ok() {
                offered += payload as u64;
            }
            end = Instant::now();
        }
        Sent {
            offered,
            start: t0,
            end,
        }
    })
}

/// A TCP sink in `ns`: accepts one connection and counts bytes; returns (bytes, secs from
/// first byte to EOF).
pub fn tcp_sink(ns: &str, addr: &str) -> (u16, thread::JoinHandle<(u64, f64)>) {
    tcp_sink_counted(ns, addr, Arc::new(AtomicU64::new(0)), None)
}

/// [`tcp_sink`] that also adds every read to `received` as it arrives, so another thread can
/// take the bytes of a time window while the transfer runs; on `cpu` alone where one is given.
pub fn tcp_sink_counted(
    ns: &str,
    addr: &str,
    received: Arc<AtomicU64>,
    cpu: Option<usize>,
) -> (u16, thread::JoinHandle<(u64, f64)>) {
    let addr = addr.to_string();
    let l = in_netns(ns, move || TcpListener::bind(format!("{addr}:0")).unwrap());
    let port = l.local_addr().unwrap().port();
    let h = thread::spawn(move || {
        if let Some(cpu) = cpu {
            pin_to_cpu(cpu);
        }
        let (mut c, _) = l.accept().unwrap();
        let mut buf = vec![0u8; 1 << 16];
        let mut total = 0u64;
        let mut t0 = None;
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    t0.get_or_insert_with(Instant::now);
                    total += n as u64;
                    received.fetch_add(n as u64, Ordering::Relaxed);
                }
            }
        }
        (total, t0.map(|t| t.elapsed().as_secs_f64()).unwrap_or(0.0))
    });
    (port, h)
}

/// Sends as fast as TCP allows from `ns` to `dst` for `secs`.
pub fn tcp_send(ns: &str, dst: SocketAddr, secs: f64) -> thread::JoinHandle<u64> {
    // The clock starts at the first check, once connected, not when the thread is asked for.
    let t0 = std::sync::OnceLock::new();
    tcp_send_while(ns, dst, None, move || {
        t0.get_or_init(Instant::now).elapsed().as_secs_f64() < secs
    })
}

/// Sends as fast as TCP allows from `ns` to `dst` while `go_on` says so, then closes; on `cpu`
/// alone where one is given.
pub fn tcp_send_while(
    ns: &str,
    dst: SocketAddr,
    cpu: Option<usize>,
    go_on: impl Fn() -> bool + Send + 'static,
) -> thread::JoinHandle<u64> {
    let ns = ns.to_string();
    thread::spawn(move || {
        rackwarden::netns::enter(&ns).expect("enter netns");
        let mut c = TcpStream::connect_timeout(&dst, Duration::from_secs(5)).unwrap();
        c.set_write_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let buf = vec![0x77u8; 1 << 16];
        if let Some(cpu) = cpu {
            pin_to_cpu(cpu);
        }
        let mut sent = 0u64;
        while go_on() {
            match c.write(&buf) {
                Ok(n) => sent += n as u64,
                Err(e)
                    if e.kind() == std::io::ErrorKind::WouldBlock
                        || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(e) => panic!("tcp send: {e}"),
            }
        }
        let _ = c.shutdown(std::net::Shutdown::Write);
        sent
    })
}

/// `rackwarden status --json` against a fixture's socket.
pub fn status_json(socket: &Path) -> serde_json::Value {
    let out = Command::new(bin("rackwarden"))
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// Field of a direction's counters in a status JSON.
pub fn counter(status: &serde_json::Value, dir: &str, field: &str) -> u64 {
    status["directions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["direction"] == dir)
        .unwrap()["counters"][field]
        .as_u64()
        .unwrap()
}

/// Loads a tc classifier that passes every packet (`r0 = 0; exit`): a stand-in for another
/// build's policer in the upgrade test. The returned fd keeps it loaded.
pub fn load_pass_all_classifier() -> std::os::fd::OwnedFd {
    let insns: [u8; 16] = [0xb7, 0, 0, 0, 0, 0, 0, 0, 0x95, 0, 0, 0, 0, 0, 0, 0];
    load_raw_program(3, &insns, b"rw_old") // BPF_PROG_TYPE_SCHED_CLS
}

/// `BPF_PROG_LOAD` of hand-assembled instructions (8 bytes each), GPL-licensed; panics with
/// the kernel's error when the load is refused.
pub fn load_raw_program(prog_type: u32, insns: &[u8], name: &[u8]) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    let license = b"GPL\0";
    let mut a = [0u8; 128];
    a[0..4].copy_from_slice(&prog_type.to_ne_bytes());
    a[4..8].copy_from_slice(&((insns.len() / 8) as u32).to_ne_bytes());
    a[8..16].copy_from_slice(&(insns.as_ptr() as u64).to_ne_bytes());
    a[16..24].copy_from_slice(&(license.as_ptr() as u64).to_ne_bytes());
    let n = name.len().min(15);
    a[48..48 + n].copy_from_slice(&name[..n]);
    // SAFETY: a zero-padded bpf_attr for BPF_PROG_LOAD (5) with pointers that outlive the call.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, 5, a.as_mut_ptr(), a.len()) };
    assert!(
        fd >= 0,
        "BPF_PROG_LOAD: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the kernel returned a new fd we now own.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }
}
