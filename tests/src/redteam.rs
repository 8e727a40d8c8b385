//! The red-team matrix: each known way around (or through) the limiter, tried for real in the
//! fixture's namespaces against a daemon capping 1 MB/s. Shared by the `bypass` test and
//! `cargo xtask bench bypass`.

use std::{
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    process::Command,
    time::Duration,
};

use rackwarden::{bpf_syscall, pins::PinPaths};

use crate::{
    Daemon, Net, OUT_ADDR, RACK_ADDR, UDP_FRAME_OVERHEAD, UdpSink, in_netns, status_json,
    tamper::{self, Hook},
};

pub const CAP: u64 = 1_000_000;
pub const BURST: u64 = 256 * 1024;
pub const SECS: f64 = 3.0;

#[derive(Debug, Clone)]
pub struct Row {
    pub path: &'static str,
    pub expected: &'static str,
    /// Frame bytes that crossed in the window (UDP payload + headers).
    pub bytes_through: u64,
    pub window_s: f64,
    /// Whether the refusal or the gap was counted / detected.
    pub counted: bool,
    pub note: String,
}

impl Row {
    pub fn bound(&self) -> f64 {
        BURST as f64 + CAP as f64 * self.window_s
    }
}

pub fn render(rows: &[Row]) -> String {
    let mut s = format!(
        "{:<40} {:<36} {:>14} {:>10} {:>8}  note\n",
        "path", "expected", "bytes through", "of bound", "counted"
    );
    for r in rows {
        s += &format!(
            "{:<40} {:<36} {:>14} {:>9.1}% {:>8}  {}\n",
            r.path,
            r.expected,
            r.bytes_through,
            100.0 * r.bytes_through as f64 / r.bound(),
            if r.counted { "yes" } else { "NO" },
            r.note
        );
    }
    s
}

fn mac(ns: &str, ifc: &str) -> [u8; 6] {
    let out = Command::new("ip")
        .args(["-n", ns, "-j", "link", "show", ifc])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let s = v[0]["address"].as_str().unwrap();
    let mut m = [0u8; 6];
    for (i, p) in s.split(':').enumerate() {
        m[i] = u8::from_str_radix(p, 16).unwrap();
    }
    m
}

fn ipv4_checksum(h: &[u8]) -> u16 {
    let mut sum = 0u32;
    for c in h.chunks(2) {
        sum += u16::from_be_bytes([c[0], c[1]]) as u32;
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet + IPv4 + UDP frame from the rack to `port` on the outside.
fn udp_frame(src_mac: [u8; 6], dst_mac: [u8; 6], port: u16, payload: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(42 + payload);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let total = (20 + 8 + payload) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&RACK_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets());
    ip.extend_from_slice(&OUT_ADDR.parse::<std::net::Ipv4Addr>().unwrap().octets());
    let c = ipv4_checksum(&ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    f.extend_from_slice(&ip);
    f.extend_from_slice(&40000u16.to_be_bytes());
    f.extend_from_slice(&port.to_be_bytes());
    f.extend_from_slice(&((8 + payload) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]); // no UDP checksum (allowed for IPv4)
    f.resize(42 + payload, 0x33);
    f
}

/// An AF_PACKET socket bound to the rack interface; with `bypass`, PACKET_QDISC_BYPASS is
/// requested first. Returns the socket and the setsockopt errno (0 if it succeeded).
fn packet_socket(net: &Net, bypass: bool) -> (OwnedFd, i32) {
    let ifc = net.rack_if.clone();
    in_netns(&net.rack_ns, move || {
        // SAFETY: plain socket calls; every return value is checked.
        unsafe {
            let fd = libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW,
                (libc::ETH_P_ALL as u16).to_be() as i32,
            );
            assert!(
                fd >= 0,
                "AF_PACKET socket: {}",
                std::io::Error::last_os_error()
            );
            let owned = OwnedFd::from_raw_fd(fd);
            let mut errno = 0;
            if bypass {
                let one: libc::c_int = 1;
                let r = libc::setsockopt(fd, 263, 20, &one as *const _ as *const libc::c_void, 4);
                if r != 0 {
                    errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(-1);
                }
            }
            let mut sll: libc::sockaddr_ll = std::mem::zeroed();
            sll.sll_family = libc::AF_PACKET as u16;
            sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
            sll.sll_ifindex = rackwarden::netns::ifindex(&ifc).unwrap() as i32;
            let r = libc::bind(
                fd,
                &sll as *const _ as *const libc::sockaddr,
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(r, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
            (owned, errno)
        }
    })
}

/// Sends `frame` on `fd` as fast as possible for `secs`; returns the window.
fn packet_flood(fd: &OwnedFd, frame: &[u8], secs: f64) -> f64 {
    let t0 = std::time::Instant::now();
    let mut end = t0;
    while t0.elapsed().as_secs_f64() < secs {
        // SAFETY: sending our own buffer on our own socket.
        unsafe {
            libc::send(
                fd.as_raw_fd(),
                frame.as_ptr() as *const libc::c_void,
                frame.len(),
                0,
            )
        };
        end = std::time::Instant::now();
    }
    end.duration_since(t0).as_secs_f64()
}

fn refusals(net: &Net) -> (u64, u64) {
    let r =
        rackwarden::limiter::sockopt::refusals(&PinPaths::new(&net.pin_root)).unwrap_or_default();
    (r.qdisc_bypass, r.xdp_umem_reg)
}

fn gaps_of(net: &Net, kind: &str) -> usize {
    let st = status_json(&net.socket_path());
    st["recent_gaps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kind"] == kind)
        .count()
}

/// What the daemon's tamper watch did, from its log.
fn watch_note(d: &Daemon) -> String {
    let log = d.log_text();
    if let Some(l) = log.lines().find(|l| l.contains("tamper watch not loaded")) {
        return format!("uncapped until the next check ({})", l.trim());
    }
    let events = log
        .lines()
        .filter(|l| l.contains("tamper watch: pid"))
        .count();
    format!("tamper watch: {events} report(s), each checked at once")
}

/// Runs every path; each on a fresh fixture and daemon.
pub fn run() -> Vec<Row> {
    let mut rows = vec![udp_row()];
    for bypass in [false, true] {
        rows.push(packet_row(bypass));
    }
    rows.push(af_xdp_row());
    rows.push(detach_row());
    for (path, map, tag) in [
        (
            "write to the config map (cap x 1000)",
            rackwarden_common::map_names::CONFIG,
            "rcfg",
        ),
        (
            "write to the bucket state (refill)",
            rackwarden_common::map_names::STATE,
            "rsta",
        ),
        (
            "write to the counters (hide a leak)",
            rackwarden_common::map_names::COUNTERS,
            "rcnt",
        ),
    ] {
        rows.push(frozen_map_row(path, map, tag));
    }
    rows.push(counters_zeroed_row());
    rows.push(foreign_ahead_row());
    rows
}

/// A fixture and a daemon capping 1 MB/s for one path.
fn fresh(tag: &str) -> (Net, Daemon) {
    let net = Net::new(tag);
    // The refusal under test is the system-wide one, at the cgroup v2 root.
    // With the tamper watch (no guard): what a host without BPF LSM gets.
    let cfg = net.write_config_watched("1 MB/s", "1 MB/s", "256 KiB");
    let d = Daemon::start(&cfg, &net.socket_path());
    (net, d)
}

/// Path 1: plain UDP.
fn udp_row() -> Row {
    let (net, d) = fresh("rudp");
    let (b, t) = net.egress_flood(SECS);
    let row = Row {
        path: "UDP socket",
        expected: "capped",
        bytes_through: b,
        window_s: t,
        counted: true,
        note: "policed at tc".into(),
    };
    drop(d);
    drop(net);
    row
}

/// Paths 2 and 3: AF_PACKET without and with PACKET_QDISC_BYPASS.
fn packet_row(bypass: bool) -> Row {
    let (net, _d) = fresh(if bypass { "rbyp" } else { "rpkt" });
    let before = refusals(&net);
    let (fd, errno) = packet_socket(&net, bypass);
    let sink = UdpSink::start(&net.out_ns, OUT_ADDR);
    let frame = udp_frame(
        mac(&net.rack_ns, &net.rack_if),
        mac(&net.out_ns, &net.out_if),
        sink.port,
        1400,
    );
    let t = packet_flood(&fd, &frame, SECS);
    let (b, p) = sink.finish();
    let after = refusals(&net);
    if bypass {
        Row {
            path: "AF_PACKET + PACKET_QDISC_BYPASS",
            expected: "refused (EPERM), cap held",
            bytes_through: b + p * UDP_FRAME_OVERHEAD,
            window_s: t,
            counted: errno == libc::EPERM && after.0 == before.0 + 1,
            note: format!(
                "setsockopt errno {errno}; refusals {} -> {}",
                before.0, after.0
            ),
        }
    } else {
        Row {
            path: "raw AF_PACKET",
            expected: "capped",
            bytes_through: b + p * UDP_FRAME_OVERHEAD,
            window_s: t,
            counted: true,
            note: "policed at tc".into(),
        }
    }
}

/// Path 4: AF_XDP UMEM registration.
fn af_xdp_row() -> Row {
    let (net, d) = fresh("rxdp");
    let before = refusals(&net);
    let errno = in_netns(&net.rack_ns, xdp_umem_reg_errno);
    let after = refusals(&net);
    let row = Row {
        path: "AF_XDP UMEM registration",
        expected: "refused (EPERM): no AF_XDP sends",
        bytes_through: 0,
        window_s: SECS,
        counted: errno == libc::EPERM && after.1 == before.1 + 1,
        note: format!(
            "setsockopt errno {errno}; refusals {} -> {}",
            before.1, after.1
        ),
    };
    drop(d);
    drop(net);
    row
}

/// Registers a UMEM on a fresh AF_XDP socket (the step before any AF_XDP send): the
/// setsockopt errno (0 if it succeeded), or minus the socket's errno if none was made.
fn xdp_umem_reg_errno() -> i32 {
    // SAFETY: plain socket calls on our own buffers; results checked.
    unsafe {
        let fd = libc::socket(44, libc::SOCK_RAW, 0); // AF_XDP
        if fd < 0 {
            return -std::io::Error::last_os_error().raw_os_error().unwrap_or(1);
        }
        let mut area = vec![0u8; 1 << 16];
        // struct xdp_umem_reg { u64 addr, u64 len, u32 chunk_size, u32 headroom, u32 flags, u32 tx_metadata_len }
        let mut reg = [0u8; 32];
        reg[0..8].copy_from_slice(&(area.as_mut_ptr() as u64).to_ne_bytes());
        reg[8..16].copy_from_slice(&(area.len() as u64).to_ne_bytes());
        reg[16..20].copy_from_slice(&2048u32.to_ne_bytes());
        let r = libc::setsockopt(fd, 283, 4, reg.as_ptr() as *const libc::c_void, 24);
        let e = if r == 0 {
            0
        } else {
            std::io::Error::last_os_error().raw_os_error().unwrap_or(-1)
        };
        libc::close(fd);
        e
    }
}

/// Path 5: another process detaches our policer: bpf(BPF_LINK_DETACH) on tcx, a netlink
/// filter delete on clsact.
fn detach_row() -> Row {
    let (net, d) = fresh("rdet");
    let hook = Hook::of(&net);
    // As an attacker would run it: the flood is in flight when the policer is removed, so
    // what crosses inside the detach call itself is counted too.
    let (b, t) = net.egress_flood_during(SECS, Duration::from_millis(500), || {
        tamper::detach(&net, hook, rackwarden::limiter::Direction::Egress).expect("detach")
    });
    let gaps = gaps_of(&net, "detached");
    let st = status_json(&net.socket_path());
    let restored = st["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|h| h["attached"] == true);
    let restore = match hook {
        Hook::Tcx => restore_times(&net),
        Hook::Clsact => Ok("the watch does not see netlink: restored at the next check".into()),
    };
    let row = Row {
        path: match hook {
            Hook::Tcx => "detach via bpf(BPF_LINK_DETACH)",
            Hook::Clsact => "detach via netlink (tc filter del)",
        },
        expected: "gap detected, limiter restored",
        bytes_through: b,
        window_s: t,
        counted: gaps >= 1 && restored && restore.is_ok(),
        note: format!(
            "{gaps} detached gap(s); restored: {restored}; {}; {}",
            watch_note(&d),
            restore.unwrap_or_else(|e| e)
        ),
    };
    drop(d);
    drop(net);
    row
}

/// How long a detach leaves the hook empty, in `DETACH_TRIALS` detaches with no load (what
/// crosses meanwhile is the leak, at whatever rate the sender reaches): the detach call
/// itself, then the daemon's restore after the call returned.
fn restore_times(net: &Net) -> Result<String, String> {
    const DETACH_TRIALS: usize = 15;
    let mut call = Vec::new();
    let mut back = Vec::new();
    for _ in 0..DETACH_TRIALS {
        // Quiet between trials: the daemon has pinned the new link and recorded the gap.
        std::thread::sleep(Duration::from_millis(100));
        match tamper::timed_tcx_detach(net, Duration::from_secs(3)) {
            Ok(Some(t)) => {
                call.push(t.call.as_micros());
                back.push(t.back_after.as_micros());
            }
            Ok(None) => return Err("NOT restored within 3 s of a detach".into()),
            Err(e) => return Err(format!("detach timing failed: {e}")),
        }
    }
    let median_max = |v: &mut Vec<u128>| {
        v.sort_unstable();
        format!("median {} us, max {} us", v[v.len() / 2], v[v.len() - 1])
    };
    Ok(format!(
        "{DETACH_TRIALS} timed detaches: the call took {} (hook empty, unseen); ours back {} after it returned",
        median_max(&mut call),
        median_max(&mut back)
    ))
}

/// Path 6: another process rewrites the cap, resets the bucket or zeroes the counters in the
/// pinned maps (what `bpftool map update` does). Every map is frozen.
fn frozen_map_row(path: &'static str, map: &str, tag: &str) -> Row {
    let (net, d) = fresh(tag);
    let pins = PinPaths::new(&net.pin_root);
    let before = rackwarden::limiter::LimiterMaps::open(&pins).unwrap();
    let was = before
        .counters(rackwarden::limiter::Direction::Egress)
        .unwrap();
    let errno = write_frozen_map_errno(&pins, map);
    let (b, t) = net.egress_flood(SECS);
    let now = before
        .counters(rackwarden::limiter::Direction::Egress)
        .unwrap();
    let rate = before
        .config(rackwarden::limiter::Direction::Egress)
        .unwrap()
        .rate_bytes_per_s;
    let row = Row {
        path,
        expected: "refused (EPERM): map frozen",
        bytes_through: b,
        window_s: t,
        counted: errno == libc::EPERM && rate == CAP && now.passed_bytes >= was.passed_bytes + b,
        note: format!(
            "bpf(BPF_MAP_UPDATE_ELEM) errno {errno}; cap still {rate} B/s; counters {} -> {} B",
            was.passed_bytes, now.passed_bytes
        ),
    };
    drop(d);
    drop(net);
    row
}

/// Writes `map` through its pin: the config map as the daemon would (the cap x 1000),
/// the others with a zero. The errno (0 if the write went through).
fn write_frozen_map_errno(pins: &PinPaths, map: &str) -> i32 {
    match map {
        rackwarden_common::map_names::CONFIG => {
            let mut maps = rackwarden::limiter::LimiterMaps::open(pins).unwrap();
            let spec = rackwarden::config::CapSpec {
                rate_bytes_per_s: CAP * 1000,
                burst_bytes: 1 << 30,
                small_reserve_bytes: 0,
                small_max_len: 1024,
            };
            maps.set_config(
                rackwarden::limiter::Direction::Egress,
                &rackwarden::limiter::maps::bucket_config(&spec, 77),
            )
            .err()
            .and_then(|e| tamper::errno(&e))
            .unwrap_or(0)
        }
        _ => tamper::write_map(&pins.map(map), 0)
            .err()
            .and_then(|e| e.raw_os_error())
            .unwrap_or(0),
    }
}

/// Path 6b: another process's own BPF program zeroes the counters (programs may write a frozen
/// map): the daemon's next sample sees them go down and records a gap.
fn counters_zeroed_row() -> Row {
    let (net, d) = fresh("rrew");
    let pins = PinPaths::new(&net.pin_root);
    let (b, t) = net.egress_flood(SECS);
    tamper::zero_counters_by_program(&pins.map(rackwarden_common::map_names::COUNTERS))
        .expect("open the counters map");
    std::thread::sleep(Duration::from_millis(1500));
    let gaps = gaps_of(&net, "counters_rewound");
    let row = Row {
        path: "a BPF program zeroes the counters",
        expected: "detected at the next sample (gap)",
        bytes_through: b,
        window_s: t,
        counted: gaps >= 1,
        note: format!("{gaps} counters_rewound gap(s), not restorable: the statement carries it"),
    };
    drop(d);
    drop(net);
    row
}

/// Path 7: a foreign tc program attached ahead of ours (it passes everything).
fn foreign_ahead_row() -> Row {
    let (net, _d) = fresh("rfor");
    let hook = Hook::of(&net);
    let prog = crate::load_pass_all_classifier();
    let pinned = net.foreign_pin("foreign_pass_all");
    bpf_syscall::obj_pin(&prog, &pinned).unwrap();
    let link = tamper::attach_ahead(&net, hook, &prog, &pinned).expect("attach ahead");
    std::thread::sleep(Duration::from_millis(1200));
    let (b, t) = net.egress_flood(SECS);
    let gaps = gaps_of(&net, "foreign_ahead");
    let st = status_json(&net.socket_path());
    let first_again = st["hooks"].as_array().unwrap().iter().all(|h| {
        h["foreign_ahead"]
            .as_array()
            .map(|a| a.is_empty())
            .unwrap_or(false)
    });
    let row = Row {
        path: "foreign tc program ahead of ours",
        expected: match hook {
            Hook::Tcx => "gap detected, ours moved first",
            Hook::Clsact => "gap detected, foreign filter at our priority deleted",
        },
        bytes_through: b,
        window_s: t,
        counted: gaps >= 1 && first_again,
        note: format!(
            "{gaps} foreign_ahead gap(s); ours first again: {first_again}; BPF LSM would refuse the attach"
        ),
    };
    drop(link);
    row
}
