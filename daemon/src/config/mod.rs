//! `/etc/rackwarden/rackwarden.toml`: parsed, validated, and every error names the file, the
//! key and the line.
//!
//! ```toml
//! rack_id = "rack-a17"
//! host_id = "host-03"
//! host_share = 0.25            # this host's share of the rack cap, 0 < share <= 1
//! interfaces = ["eth0", "eth1"] # frontend interfaces; all share this host's budget
//!
//! [cap]                         # caps for the whole rack; this host enforces cap x share
//! egress = "10 MB/s"
//! ingress = "10 MB/s"
//! burst = "256 KiB"             # per host, not scaled by the share
//! small_packet_reserve = "16 KiB" # bucket share only packets <= small_packet_max may use
//! small_packet_max = "1024 B"   # prompts, token messages and ACKs are below this
//! # bytes_per_token = 4         # required when a cap is written in tokens/s
//! ```
//!
//! Optional keys: `pin_root` (default `/sys/fs/bpf/rackwarden`), `state_dir` (default
//! `/var/lib/rackwarden`), `control_socket` (default `/run/rackwarden/control.sock`),
//! `check_interval` (default `"2 s"`), `attach_mode` (`auto` | `tcx` | `clsact`),
//! `self_protection` (`auto` | `lsm` | `watch` | `off`: the guard, see `guard`), `netns`
//! (a named network namespace under `/run/netns` to enforce in; for tests and for hosts whose
//! frontend lives in a namespace), `refusal_cgroup` (a cgroup v2 directory the bypass refusal
//! attaches to instead of the root; leave it unset in production, where the root covers every
//! process). Top-level keys must come before the first `[table]`:
//! TOML puts a key written after `[cap]` into `cap`.
//!
//! The epoch loop's sections (`[epoch]`, `[verifier]`, `[wipe]`, `[images]`, `[workloads]`)
//! are in [`epoch`]; `[tpm]` (the TPM quote on every statement) is in [`tpm`].

pub mod caps;
pub mod epoch;
pub mod preflight;
pub mod report;
pub mod taps;
pub mod tpm;

use std::{
    ops::Range,
    path::{Path, PathBuf},
    time::Duration,
};

use rackwarden_attest::evidence::Direction;
use serde::Deserialize;
use toml::Spanned;

use crate::units;

pub use caps::{CapSpec, Caps};

pub const DEFAULT_PATH: &str = "/etc/rackwarden/rackwarden.toml";

/// The smallest burst we accept: one maximal GSO/TSO super-packet (64 KiB of payload plus
/// headers) must fit, or a TCP flow could never send a full segment.
pub const MIN_BURST_BYTES: u64 = 65_536 + 1_024;
/// The largest burst we accept: 64 MiB is seconds of any sane cap; a bigger bucket would let
/// a host pass a burst no rack agreement bounds (the verifier's default is 1 MiB).
pub const MAX_BURST_BYTES: u64 = 64 << 20;
/// Default bucket share reserved for small packets: room for ~16 token messages at once.
pub const DEFAULT_SMALL_RESERVE: u64 = 16 * 1024;
/// Default largest packet that counts as small (frame bytes).
pub const DEFAULT_SMALL_MAX: u32 = 1024;

pub use rackwarden_attest::config_error::{ConfigError, line_of};

/// Whether the daemon loads the guard (`self_protection`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum GuardMode {
    /// Where the kernel takes the guard (BPF LSM, else fmod_ret); elsewhere the daemon says why not, in
    /// `status` and every statement, and restores tampering at its checks.
    Auto,
    /// Refuse to start without it, in either form (for hosts whose kernel is known to take it).
    Lsm,
    /// No guard, only the tamper watch (tampering by `bpf()` is restored as it returns):
    /// for testing that fallback on kernels that would take the guard.
    Watch,
    /// Neither (the levels then say `restored_on_poll`).
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AttachMode {
    /// tcx where the kernel has it, clsact otherwise.
    Auto,
    Tcx,
    Clsact,
}

/// A validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub rack_id: String,
    pub host_id: String,
    pub host_share: f64,
    pub interfaces: Vec<String>,
    /// Line of each interface entry, for errors found later (an interface that does not exist).
    pub interface_lines: Vec<usize>,
    /// The rack's caps; this host enforces them times `host_share`.
    pub caps: Caps,
    pub pin_root: PathBuf,
    pub state_dir: PathBuf,
    pub control_socket: PathBuf,
    pub check_interval: Duration,
    pub attach_mode: AttachMode,
    pub self_protection: GuardMode,
    pub netns: Option<String>,
    /// Where the bypass refusal attaches; `None`: the cgroup v2 root (every process).
    pub refusal_cgroup: Option<PathBuf>,
    /// `[metrics] listen`: where Prometheus text is served (a loopback address only).
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The epoch loop; `None`: this daemon only enforces the caps.
    pub epoch: Option<epoch::EpochConfig>,
    /// `[tpm]`: the root of trust the epoch loop's statements are quoted by (defaults when
    /// the section is absent).
    pub tpm: tpm::TpmConfig,
    /// `[taps]`: whether the tapped policer runs and how records are split.
    pub taps: taps::Taps,
}

impl Config {
    /// This host's cap in `dir`: the rack cap times the share, rounded down (never up).
    pub fn host_bytes_per_s(&self, dir: Direction) -> u64 {
        self.caps.host_bytes_per_s(dir, self.host_share)
    }

    /// Every file under `state_dir`.
    pub fn state_paths(&self) -> crate::pins::StatePaths {
        crate::pins::StatePaths::new(&self.state_dir)
    }

    /// What the limiter enforces in `dir` on this host.
    pub fn cap_spec(&self, dir: Direction) -> CapSpec {
        self.caps.spec(dir, self.host_share)
    }

    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let err = |span: Option<Range<usize>>, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            line: span.map(|s| line_of(text, s.start)).unwrap_or(1),
            message,
        };
        let raw = read_raw(path, text, &err)?;
        let rack_id = nonempty(&err, "rack_id", &raw.rack_id)?;
        let host_id = nonempty(&err, "host_id", &raw.host_id)?;
        let share = host_share(&err, &raw.host_share)?;
        let (interfaces, interface_lines) = interfaces(&err, text, &raw.interfaces)?;
        let caps = caps::parse_table(&err, raw.cap.get_ref(), share)?;
        let check_interval = check_interval(&err, &raw.check_interval)?;
        let attach_mode = one_of(
            "attach_mode",
            &raw.attach_mode,
            &[
                ("auto", AttachMode::Auto),
                ("tcx", AttachMode::Tcx),
                ("clsact", AttachMode::Clsact),
            ],
        )
        .map_err(|(span, m)| err(Some(span), m))?;
        let self_protection = one_of(
            "self_protection",
            &raw.self_protection,
            &[
                ("auto", GuardMode::Auto),
                ("lsm", GuardMode::Lsm),
                ("watch", GuardMode::Watch),
                ("off", GuardMode::Off),
            ],
        )
        .map_err(|(span, m)| err(Some(span), m))?;
        let pin_root = pin_root(&err, &raw.pin_root)?;
        let refusal_cgroup = refusal_cgroup(&err, &raw.refusal_cgroup)?;
        let metrics_listen = metrics_listen(&err, raw.metrics.as_ref())?;
        let epoch = epoch::validate(
            &err,
            epoch::RawSections {
                epoch: raw.epoch,
                verifier: raw.verifier,
                wipe: raw.wipe,
                images: raw.images,
                workloads: raw.workloads,
            },
        )?;
        let tpm = tpm::validate(&err, raw.tpm.map(Spanned::into_inner))?;
        let taps_span = raw.taps.as_ref().map(|t| t.span());
        let taps = taps::validate(&err, raw.taps.map(Spanned::into_inner))?;
        if matches!(taps, taps::Taps::On(_)) && epoch.is_none() {
            // The reader runs with the epoch loop; without it the ring would fill and the
            // tapped policer would drop every frame.
            return Err(err(
                taps_span,
                "`[taps]` needs `[epoch]`: the tapped traffic is committed in each epoch's statement".into(),
            ));
        }
        Ok(Config {
            path: path.to_path_buf(),
            rack_id,
            host_id,
            host_share: share,
            interfaces,
            interface_lines,
            caps,
            pin_root,
            state_dir: path_or(&raw.state_dir, "/var/lib/rackwarden"),
            control_socket: path_or(&raw.control_socket, "/run/rackwarden/control.sock"),
            check_interval,
            attach_mode,
            self_protection,
            netns: raw.netns.map(|s| s.into_inner()),
            refusal_cgroup,
            metrics_listen,
            epoch,
            tpm,
            taps,
        })
    }

    /// Checks that every configured interface exists in the current network namespace.
    pub fn check_interfaces_exist(&self) -> Result<(), ConfigError> {
        for (name, line) in self.interfaces.iter().zip(&self.interface_lines) {
            if crate::netns::ifindex(name).is_none() {
                return Err(ConfigError::Invalid {
                    path: self.path.clone(),
                    line: *line,
                    message: format!(
                        "`interfaces`: no interface named `{name}` on this host{}",
                        self.netns
                            .as_ref()
                            .map(|n| format!(" (network namespace `{n}`)"))
                            .unwrap_or_default()
                    ),
                });
            }
        }
        Ok(())
    }
}

/// The file as TOML, each error naming its key and line (or the file, for a missing key).
fn read_raw(path: &Path, text: &str, err: epoch::Err) -> Result<RawConfig, ConfigError> {
    toml::from_str(text).map_err(|e| {
        let msg = e.message().trim().to_string();
        // A missing key or table has no place in the file: blame the file, not line 1's key.
        if msg.starts_with("missing field") {
            return ConfigError::Missing {
                path: path.to_path_buf(),
                message: msg,
            };
        }
        // serde's type errors do not say which key; the span does.
        let key = e.span().and_then(|s| key_at(text, s.start));
        let mut msg = match &key {
            Some(key) if !msg.contains(key) => format!("`{key}`: {msg}"),
            _ => msg,
        };
        // `pin_root = ...` written below `[cap]` lands in `cap`: say why.
        if let Some((table, bare)) = key.as_deref().and_then(|k| k.split_once('.'))
            && msg.contains("unknown field")
            && TOP_LEVEL_KEYS.contains(&bare)
        {
            msg += &format!(
                " (`{bare}` is a top-level key: move it above the first table; here it is read as part of `[{table}]`)"
            );
        }
        err(e.span(), msg)
    })
}

fn nonempty(err: epoch::Err, key: &str, s: &Spanned<String>) -> Result<String, ConfigError> {
    if s.get_ref().trim().is_empty() {
        Err(err(Some(s.span()), format!("`{key}` must not be empty")))
    } else {
        Ok(s.get_ref().clone())
    }
}

fn host_share(err: epoch::Err, s: &Spanned<f64>) -> Result<f64, ConfigError> {
    let share = *s.get_ref();
    if !(share > 0.0 && share <= 1.0) {
        return Err(err(
            Some(s.span()),
            format!("`host_share` must be > 0 and <= 1 (it is {share})"),
        ));
    }
    Ok(share)
}

/// The frontend interfaces (at least one, each valid and listed once) and the line of each.
fn interfaces(
    err: epoch::Err,
    text: &str,
    list: &Spanned<Vec<Spanned<String>>>,
) -> Result<(Vec<String>, Vec<usize>), ConfigError> {
    if list.get_ref().is_empty() {
        return Err(err(
            Some(list.span()),
            "`interfaces` must name at least one frontend interface".into(),
        ));
    }
    let mut interfaces = Vec::new();
    let mut interface_lines = Vec::new();
    for i in list.get_ref() {
        let name = i.get_ref();
        if name.is_empty() || name.len() > 15 || name.contains('/') || name.contains(' ') {
            return Err(err(
                Some(i.span()),
                format!("`interfaces`: `{name}` is not a valid interface name"),
            ));
        }
        if interfaces.contains(name) {
            return Err(err(
                Some(i.span()),
                format!("`interfaces`: `{name}` is listed twice"),
            ));
        }
        interfaces.push(name.clone());
        interface_lines.push(line_of(text, i.span().start));
    }
    Ok((interfaces, interface_lines))
}

/// `check_interval`: 2 s unless set, 100 ms to 60 s.
fn check_interval(err: epoch::Err, v: &Option<Spanned<String>>) -> Result<Duration, ConfigError> {
    let Some(s) = v else {
        return Ok(Duration::from_secs(2));
    };
    let d = units::parse_duration(s.get_ref())
        .map_err(|e| err(Some(s.span()), format!("`check_interval`: {e}")))?;
    if d < Duration::from_millis(100) || d > Duration::from_secs(60) {
        return Err(err(
            Some(s.span()),
            "`check_interval` must be between 100 ms and 60 s".into(),
        ));
    }
    Ok(d)
}

fn path_or(v: &Option<Spanned<String>>, default: &str) -> PathBuf {
    PathBuf::from(v.as_ref().map(|s| s.get_ref().as_str()).unwrap_or(default))
}

/// `pin_root`: under /sys/fs/bpf/, [`crate::pins::DEFAULT_ROOT`] unless set.
fn pin_root(err: epoch::Err, v: &Option<Spanned<String>>) -> Result<PathBuf, ConfigError> {
    let pin_root = path_or(v, crate::pins::DEFAULT_ROOT);
    if let Some(s) = v
        && !pin_root.starts_with("/sys/fs/bpf/")
    {
        return Err(err(
            Some(s.span()),
            "`pin_root` must be a directory under /sys/fs/bpf/".into(),
        ));
    }
    Ok(pin_root)
}

/// `refusal_cgroup`: a cgroup v2 directory, or `None` for the root.
fn refusal_cgroup(
    err: epoch::Err,
    v: &Option<Spanned<String>>,
) -> Result<Option<PathBuf>, ConfigError> {
    let Some(s) = v else { return Ok(None) };
    let p = PathBuf::from(s.get_ref());
    if !p.starts_with("/sys/fs/cgroup") {
        return Err(err(
            Some(s.span()),
            "`refusal_cgroup` must be a cgroup v2 directory under /sys/fs/cgroup".into(),
        ));
    }
    Ok(Some(p))
}

/// `[metrics]`: the Prometheus listener.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Spanned<String>,
}

/// `metrics.listen`: an IP address and port on loopback. The metrics are served without
/// authentication or TLS, so they never leave the host (a local agent or proxy exports them).
fn metrics_listen(
    err: epoch::Err,
    raw: Option<&Spanned<RawMetrics>>,
) -> Result<Option<std::net::SocketAddr>, ConfigError> {
    let Some(m) = raw else { return Ok(None) };
    let v = &m.get_ref().listen;
    let addr: std::net::SocketAddr = v.get_ref().parse().map_err(|e| {
        err(
            Some(v.span()),
            format!(
                "`metrics.listen`: `{}` is not an address and port ({e}), e.g. \"127.0.0.1:9464\"",
                v.get_ref()
            ),
        )
    })?;
    if !addr.ip().is_loopback() {
        return Err(err(
            Some(v.span()),
            format!(
                "`metrics.listen`: {addr} is not a loopback address: the metrics have no authentication, so they are served to this host only (127.0.0.1 or [::1])"
            ),
        ));
    }
    Ok(Some(addr))
}

/// The dotted key (`cap.burst`) written on the line holding `offset`, if the line is a
/// `key = value` line.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let offset = offset.min(text.len());
    let line_start = text[..offset].rfind('\n').map(|i| i + 1).unwrap_or(0);
    let line = text[line_start..].lines().next()?;
    let key = line.split_once('=')?.0.trim();
    if key.is_empty() || key.starts_with('[') {
        return None;
    }
    let table = text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.starts_with('[') && l.ends_with(']'))
        .map(|l| l.trim_matches(|c| c == '[' || c == ']').trim().to_string());
    Some(match table {
        Some(t) => format!("{t}.{key}"),
        None => key.to_string(),
    })
}

/// Keys that belong before the first `[table]`.
const TOP_LEVEL_KEYS: &[&str] = &[
    "rack_id",
    "host_id",
    "host_share",
    "interfaces",
    "pin_root",
    "state_dir",
    "control_socket",
    "check_interval",
    "attach_mode",
    "self_protection",
    "netns",
    "refusal_cgroup",
];

/// A key whose value is one of `choices`; the first is the default when the key is absent.
fn one_of<T: Copy>(
    key: &str,
    value: &Option<Spanned<String>>,
    choices: &[(&str, T)],
) -> Result<T, (Range<usize>, String)> {
    let Some(v) = value else {
        return Ok(choices[0].1);
    };
    if let Some((_, t)) = choices.iter().find(|(name, _)| *name == v.get_ref()) {
        return Ok(*t);
    }
    let names: Vec<&str> = choices.iter().map(|(n, _)| *n).collect();
    let (last, rest) = names.split_last().unwrap_or((&"", &[]));
    Err((
        v.span(),
        format!(
            "`{key}` must be {} or {last} (not `{}`)",
            rest.join(", "),
            v.get_ref()
        ),
    ))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    rack_id: Spanned<String>,
    host_id: Spanned<String>,
    host_share: Spanned<f64>,
    interfaces: Spanned<Vec<Spanned<String>>>,
    cap: Spanned<caps::RawCap>,
    pin_root: Option<Spanned<String>>,
    state_dir: Option<Spanned<String>>,
    control_socket: Option<Spanned<String>>,
    check_interval: Option<Spanned<String>>,
    attach_mode: Option<Spanned<String>>,
    self_protection: Option<Spanned<String>>,
    netns: Option<Spanned<String>>,
    refusal_cgroup: Option<Spanned<String>>,
    metrics: Option<Spanned<RawMetrics>>,
    epoch: Option<Spanned<epoch::RawEpoch>>,
    verifier: Option<Spanned<epoch::RawVerifier>>,
    wipe: Option<Spanned<epoch::RawWipe>>,
    images: Option<Spanned<epoch::RawImages>>,
    workloads: Option<Spanned<epoch::RawWorkloads>>,
    tpm: Option<Spanned<tpm::RawTpm>>,
    taps: Option<Spanned<taps::RawTaps>>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"rack_id = "rack-a17"
host_id = "host-03"
host_share = 0.25
interfaces = ["eth0"]

[cap]
egress = "10 MB/s"
ingress = "8 Mbit/s"
burst = "256 KiB"
"#;

    fn err_of(text: &str) -> String {
        Config::parse(Path::new("/etc/rackwarden/rackwarden.toml"), text)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn taps_name_their_key_and_line_and_need_the_epoch_loop() {
        let bad = format!("{GOOD}\n[taps]\ninference = [\"udp:53\"]\n");
        let e = err_of(&bad);
        assert!(e.contains(":12: `taps.inference`: `udp:53`"), "{e}");
        let small = format!("{GOOD}\n[taps]\nspool_limit = \"1 KiB\"\n");
        assert!(err_of(&small).contains("`taps.spool_limit` must be at least 1 MiB"));
        let alone = format!("{GOOD}\n[taps]\ninference = [\"tcp:8000\"]\n");
        let e = err_of(&alone);
        assert!(e.contains(":11: `[taps]` needs `[epoch]`"), "{e}");
        let c = Config::parse(Path::new("x.toml"), GOOD).unwrap();
        assert_eq!(c.taps, taps::Taps::Off);
    }

    #[test]
    fn self_protection_is_one_of_three_and_defaults_to_auto() {
        let c = Config::parse(Path::new("x.toml"), GOOD).unwrap();
        assert_eq!(c.self_protection, GuardMode::Auto);
        let text = GOOD.replace(
            "interfaces = [\"eth0\"]\n",
            "interfaces = [\"eth0\"]\nself_protection = \"lsm\"\n",
        );
        assert_eq!(
            Config::parse(Path::new("x.toml"), &text)
                .unwrap()
                .self_protection,
            GuardMode::Lsm
        );
        let text = GOOD.replace(
            "interfaces = [\"eth0\"]\n",
            "interfaces = [\"eth0\"]\nself_protection = \"maybe\"\n",
        );
        assert_eq!(
            err_of(&text),
            "/etc/rackwarden/rackwarden.toml:5: `self_protection` must be auto, lsm, watch or off (not `maybe`)"
        );
    }

    #[test]
    fn good_config_scales_by_share() {
        let c = Config::parse(Path::new("x.toml"), GOOD).unwrap();
        assert_eq!(c.caps.rack_egress_bytes_per_s, 10_000_000);
        assert_eq!(c.host_bytes_per_s(Direction::Egress), 2_500_000);
        assert_eq!(c.host_bytes_per_s(Direction::Ingress), 250_000);
        assert_eq!(c.caps.burst_bytes, 262_144);
        assert_eq!(c.pin_root, PathBuf::from("/sys/fs/bpf/rackwarden"));
    }

    #[test]
    fn tokens_per_second_with_bytes_per_token() {
        let t = GOOD.replace(
            "egress = \"10 MB/s\"",
            "egress = \"200000 tokens/s\"\nbytes_per_token = 4",
        );
        let c = Config::parse(Path::new("x.toml"), &t).unwrap();
        assert_eq!(c.caps.rack_egress_bytes_per_s, 800_000);
        let t = GOOD.replace("egress = \"10 MB/s\"", "egress = \"200000 tokens/s\"");
        let e = err_of(&t);
        assert!(e.contains(":7:") && e.contains("bytes_per_token"), "{e}");
    }

    #[test]
    fn each_bad_case_names_key_and_line() {
        let cases: &[(&str, &str, &str, &str)] = &[
            // (replace, with, expected line, expected text)
            (
                "host_share = 0.25",
                "host_share = 0.25\ncolour = \"red\"",
                ":4:",
                "colour",
            ),
            (
                "egress = \"10 MB/s\"",
                "egress = \"10 MB/fortnight\"",
                ":7:",
                "cap.egress",
            ),
            (
                "egress = \"10 MB/s\"",
                "egress = \"10 parsecs/s\"",
                ":7:",
                "unknown rate unit",
            ),
            (
                "ingress = \"8 Mbit/s\"",
                "ingress = \"0 MB/s\"",
                ":8:",
                "cap.ingress` must be above zero",
            ),
            (
                "ingress = \"8 Mbit/s\"",
                "ingress = \"-5 MB/s\"",
                ":8:",
                "negative",
            ),
            ("host_share = 0.25", "host_share = 1.5", ":3:", "host_share"),
            ("host_share = 0.25", "host_share = 0.0", ":3:", "host_share"),
            (
                "interfaces = [\"eth0\"]",
                "interfaces = []",
                ":4:",
                "at least one",
            ),
            (
                "interfaces = [\"eth0\"]",
                "interfaces = [\"eth0\", \"eth0\"]",
                ":4:",
                "twice",
            ),
            (
                "burst = \"256 KiB\"",
                "burst = \"1 KiB\"",
                ":9:",
                "cap.burst",
            ),
            (
                "burst = \"256 KiB\"",
                "burst = \"100 TiB\"",
                ":9:",
                "at most 64 MiB",
            ),
            (
                "burst = \"256 KiB\"",
                "burst = \"80 KiB\"\nsmall_packet_reserve = \"64 KiB\"",
                ":10:",
                "small_packet_reserve",
            ),
            (
                "burst = \"256 KiB\"",
                "burst = \"256 KiB\"\nsmall_packet_max = \"20 B\"",
                ":10:",
                "small_packet_max",
            ),
            (
                "burst = \"256 KiB\"",
                "burst = 262144",
                ":9:",
                "`cap.burst`: invalid type",
            ),
            // A missing key has no line: the file is named, and no other key is blamed.
            (
                "rack_id = \"rack-a17\"\n",
                "",
                "rackwarden.toml: missing field",
                "`rack_id`",
            ),
            (
                "\n[cap]\negress = \"10 MB/s\"\ningress = \"8 Mbit/s\"\nburst = \"256 KiB\"\n",
                "\n",
                "rackwarden.toml: missing field",
                "`cap`",
            ),
        ];
        for (from, to, line, text) in cases {
            let t = GOOD.replace(from, to);
            let e = err_of(&t);
            assert!(e.starts_with("/etc/rackwarden/rackwarden.toml"), "{e}");
            assert!(
                e.contains(line) && e.contains(text),
                "case {to:?}: got `{e}`, want {line} and {text:?}"
            );
        }
    }

    #[test]
    fn metrics_listen_only_on_loopback() {
        let c = Config::parse(Path::new("x.toml"), GOOD).unwrap();
        assert_eq!(c.metrics_listen, None, "off unless configured");
        let on = format!("{GOOD}\n[metrics]\nlisten = \"127.0.0.1:9464\"\n");
        let c = Config::parse(Path::new("x.toml"), &on).unwrap();
        assert_eq!(c.metrics_listen, Some("127.0.0.1:9464".parse().unwrap()));
        let e = err_of(&on.replace("127.0.0.1", "0.0.0.0"));
        assert!(
            e.contains(":12:") && e.contains("not a loopback address"),
            "{e}"
        );
        let e = err_of(&on.replace("127.0.0.1:9464", "localhost"));
        assert!(e.contains("`metrics.listen`"), "{e}");
    }

    #[test]
    fn missing_interface_names_it_and_its_line() {
        let t = GOOD.replace("[\"eth0\"]", "[\n  \"rw-no-such0\",\n]");
        let c = Config::parse(Path::new("x.toml"), &t).unwrap();
        let e = c.check_interfaces_exist().unwrap_err().to_string();
        assert!(e.contains("x.toml:5:") && e.contains("rw-no-such0"), "{e}");
    }
}
