//! What `rackwarden check-config` tells a person about a configuration that passed every
//! check: each value with its unit, and warnings where the configuration cannot satisfy the
//! policy it will be judged by (a host wipe bound that leaves more residue than the policy
//! accepts, a cap above the rack's agreement, a guard that will seal the limiter in place,
//! a delivery backoff that would hold the backlog long after the verifier is back).
//!
//! The verifier's policy is known only where its configuration file is at hand
//! (`check-config --verifier-config`): [`VerifierPolicy::read`] takes what concerns this rack.

use std::{
    fmt,
    path::{Path, PathBuf},
    time::Duration,
};

use rackwarden_attest::evidence::Direction;
use serde::Serialize;

use super::{
    AttachMode, Config, GuardMode,
    epoch::{EpochConfig, VerifierTrust, Workloads},
    preflight::Checked,
};
use crate::{units, wipe::Backend};

/// What the verifier's policy says about this rack.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifierPolicy {
    /// `policy.max_residue_host`.
    pub max_residue_host: Option<u64>,
    /// `racks.<rack_id>.egress` and `.ingress` (byte rates; a token rate is not compared).
    pub agreement_egress: Option<u64>,
    pub agreement_ingress: Option<u64>,
    /// `policy.min_root_of_trust` (`none`, `tpm`, `tpm_ima`), as written.
    pub min_root_of_trust: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum VerifierPolicyError {
    #[error("verifier config {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("verifier config {path}: {detail}")]
    Toml { path: PathBuf, detail: String },
    #[error("verifier config {path}: `{key}`: {source}")]
    Value {
        path: PathBuf,
        key: String,
        source: units::UnitError,
    },
    #[error("verifier config {path}: no `[racks.{rack}]`: the verifier would refuse this rack")]
    UnknownRack { path: PathBuf, rack: String },
}

impl VerifierPolicy {
    /// Reads the verifier's `rackwarden-verifier.toml` for what concerns `rack`.
    pub fn read(path: &Path, rack: &str) -> Result<VerifierPolicy, VerifierPolicyError> {
        let text = std::fs::read_to_string(path).map_err(|source| VerifierPolicyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let doc: toml::Table =
            text.parse()
                .map_err(|e: toml::de::Error| VerifierPolicyError::Toml {
                    path: path.to_path_buf(),
                    detail: e.message().to_string(),
                })?;
        let value = |table: Option<&toml::Value>, key: &str| {
            table
                .and_then(|t| t.get(key))
                .and_then(toml::Value::as_str)
                .map(str::to_string)
        };
        let bad = |key: String| {
            let path = path.to_path_buf();
            move |source| VerifierPolicyError::Value { path, key, source }
        };
        let max_residue_host = value(doc.get("policy"), "max_residue_host")
            .map(|s| units::parse_size(&s).map_err(bad("policy.max_residue_host".into())))
            .transpose()?;
        let Some(r) = doc.get("racks").and_then(|r| r.get(rack)) else {
            return Err(VerifierPolicyError::UnknownRack {
                path: path.to_path_buf(),
                rack: rack.to_string(),
            });
        };
        let rate = |dir: &str| -> Result<Option<u64>, VerifierPolicyError> {
            let Some(s) = value(Some(r), dir) else {
                return Ok(None);
            };
            match units::parse_rate(&s).map_err(bad(format!("racks.{rack}.{dir}")))? {
                units::Rate::BytesPerSec(b) => Ok(Some(b)),
                units::Rate::TokensPerSec(_) => Ok(None),
            }
        };
        Ok(VerifierPolicy {
            max_residue_host,
            agreement_egress: rate("egress")?,
            agreement_ingress: rate("ingress")?,
            min_root_of_trust: value(doc.get("policy"), "min_root_of_trust"),
        })
    }
}

/// What `check-config` knows of this host beyond the file.
#[derive(Debug, Clone, Default)]
pub struct HostFacts {
    /// `MemTotal`, where `/proc/meminfo` says it.
    pub memory_bytes: Option<u64>,
    /// The kernel takes the guard (`self_protection = "auto"` will seal).
    pub guard_available: bool,
    /// What opening the configured TPM gave.
    pub tpm: TpmFact,
}

/// The configured TPM, opened the way the daemon will open it (`tpm::probe`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(tag = "tpm", rename_all = "snake_case")]
pub enum TpmFact {
    /// `[tpm] mode = "off"`, or not looked at.
    #[default]
    NotOpened,
    /// It answers; its vendor string.
    Usable { vendor: String },
    /// It cannot be used, and why.
    Unusable { reason: String },
}

/// Where the configuration cannot satisfy the policy it will be judged by.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "warning", rename_all = "snake_case")]
pub enum ConfigWarning {
    /// `wipe.max_bytes` (with the reserve) leaves at least `residue_bytes` of host memory
    /// unwiped every epoch; above `limit_bytes` (the policy's) or most of memory (no policy).
    HostWipeBound {
        max_bytes: u64,
        memory_bytes: u64,
        residue_bytes: u64,
        limit_bytes: Option<u64>,
    },
    /// The rack cap the config asks for is above the rack's agreement at the verifier.
    CapAboveAgreement {
        direction: Direction,
        cap_bytes_per_s: u64,
        agreement_bytes_per_s: u64,
    },
    /// `self_protection = "auto"` on a kernel that takes the guard: the limiter will be
    /// sealed, and removing it then needs a reboot.
    WillSeal,
    /// The backoff ceiling plus one request can hold the backlog this long after the
    /// verifier is back.
    SlowRedelivery { worst_ms: u64 },
    /// `[tpm] mode = "auto"` and the TPM cannot be used: every statement will say its root of
    /// trust is none.
    TpmUnusable { tcti: String, reason: String },
    /// The verifier's policy requires a TPM this host will not quote with: every statement
    /// will be contraindicated (`quote_missing`, `root_of_trust_below_policy`).
    PolicyNeedsTpm { level: String, why: String },
}

/// How long after the verifier is back the backlog may wait before this is worth a warning.
pub const REDELIVERY_GOAL: Duration = Duration::from_secs(30);

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigWarning::HostWipeBound {
                max_bytes,
                memory_bytes,
                residue_bytes,
                limit_bytes: Some(limit),
            } => write!(
                f,
                "`wipe.max_bytes` = {} of {} host memory leaves at least {} unwiped each epoch, above the verifier's max_residue_host of {}: every host wipe will be judged residue over the limit",
                units::fmt_size(*max_bytes),
                units::fmt_size(*memory_bytes),
                units::fmt_size(*residue_bytes),
                units::fmt_size(*limit)
            ),
            ConfigWarning::HostWipeBound {
                max_bytes,
                memory_bytes,
                residue_bytes,
                limit_bytes: None,
            } => write!(
                f,
                "`wipe.max_bytes` = {} covers less than half of {} host memory: at least {} stays unwiped each epoch, and the verifier judges it against its max_residue_host (give --verifier-config to check)",
                units::fmt_size(*max_bytes),
                units::fmt_size(*memory_bytes),
                units::fmt_size(*residue_bytes)
            ),
            ConfigWarning::CapAboveAgreement {
                direction,
                cap_bytes_per_s,
                agreement_bytes_per_s,
            } => write!(
                f,
                "`cap.{}` = {} is above the rack's agreement at the verifier ({}): statements will be judged over the agreement",
                direction.name(),
                units::fmt_rate(*cap_bytes_per_s as f64),
                units::fmt_rate(*agreement_bytes_per_s as f64)
            ),
            ConfigWarning::WillSeal => write!(
                f,
                "`self_protection = \"auto\"` and this kernel takes the guard: the limiter will be sealed, and removing it (or uninstalling) then needs `self_protection = \"watch\"` and a reboot"
            ),
            ConfigWarning::TpmUnusable { tcti, reason } => write!(
                f,
                "[tpm] tcti `{tcti}`: the TPM cannot be used: {reason}; with mode = \"auto\" the daemon starts without it and every statement's root of trust is none (set mode = \"required\" to refuse to start instead)"
            ),
            ConfigWarning::PolicyNeedsTpm { level, why } => write!(
                f,
                "the verifier's policy requires min_root_of_trust = \"{level}\" and {why}: every statement of this host will be contraindicated (quote_missing, root_of_trust_below_policy)"
            ),
            ConfigWarning::SlowRedelivery { worst_ms } => write!(
                f,
                "`verifier.retry_max` + `verifier.request_timeout` = {}: after an outage the backlog may reach the verifier only that long after it is back (goal {})",
                units::fmt_duration(Duration::from_millis(*worst_ms)),
                units::fmt_duration(REDELIVERY_GOAL)
            ),
        }
    }
}

/// One direction's cap: the rack's and this host's share of it.
#[derive(Debug, Clone, Serialize)]
pub struct CapLine {
    pub direction: Direction,
    pub rack_bytes_per_s: u64,
    pub host_bytes_per_s: u64,
    pub rack: String,
    pub host: String,
}

/// The epoch loop's settings, each in its unit.
#[derive(Debug, Clone, Serialize)]
pub struct EpochSummary {
    pub wipe_interval: String,
    pub challenge_timeout: String,
    pub verifier: String,
    pub verifier_trust: String,
    pub request_timeout: String,
    pub retry_max: String,
    /// The verifier's transparency log key (its vkey), when entries are checked.
    pub log_key: Option<String>,
    pub signing_key: PathBuf,
    pub host_keyid: Option<String>,
    pub wipe_backends: Vec<&'static str>,
    pub wipe_max_bytes: Option<String>,
    pub wipe_reserve: String,
    pub scratch: Vec<PathBuf>,
    pub manifest_images: Option<usize>,
    pub workloads: String,
    /// `[wipe] swap` and `[wipe] erase`, in words.
    pub storage: String,
    /// `[tpm]` in words: what every statement's root of trust will be asked of.
    pub root_of_trust: String,
}

/// Everything `check-config` prints.
#[derive(Debug, Clone, Serialize)]
pub struct ConfigReport {
    pub path: PathBuf,
    pub rack_id: String,
    pub host_id: String,
    pub host_share: f64,
    pub interfaces: Vec<String>,
    pub netns: Option<String>,
    pub caps: Vec<CapLine>,
    pub burst: String,
    pub burst_bytes: u64,
    pub pin_root: PathBuf,
    pub state_dir: PathBuf,
    pub control_socket: PathBuf,
    pub check_interval: String,
    pub attach_mode: AttachMode,
    pub self_protection: GuardMode,
    /// `[taps]` in words.
    pub taps: String,
    pub epoch: Option<EpochSummary>,
    pub warnings: Vec<ConfigWarning>,
}

fn backend_name(b: Backend) -> &'static str {
    match b {
        Backend::Host => "host",
        Backend::Gpu => "gpu",
        Backend::Scratch => "scratch",
    }
}

fn workloads_text(w: &Workloads) -> String {
    match w {
        Workloads::NoneConfigured => "none (nothing is stopped before a wipe)".into(),
        Workloads::Units {
            units: list,
            stop_timeout,
        } => format!(
            "systemd units {} (stop timeout {})",
            list.join(", "),
            units::fmt_duration(*stop_timeout)
        ),
        Workloads::Commands {
            stop,
            start,
            stop_timeout,
        } => format!(
            "stop `{}`, start `{}` (stop timeout {})",
            stop.join(" "),
            start.join(" "),
            units::fmt_duration(*stop_timeout)
        ),
    }
}

fn trust_text(t: &VerifierTrust) -> String {
    match t {
        VerifierTrust::PlainLoopback => "plain http on loopback".into(),
        VerifierTrust::Ca { path, certs } => {
            format!("CA {} ({} certificate(s))", path.display(), certs.len())
        }
        VerifierTrust::Pinned { path, .. } => format!("pinned certificate {}", path.display()),
    }
}

fn epoch_summary(e: &EpochConfig, tpm: &super::tpm::TpmConfig, checked: &Checked) -> EpochSummary {
    use super::{epoch::SwapPolicy, tpm::TpmMode};
    let mut storage = match e.wipe.swap {
        SwapPolicy::On => "swap stays on (residue in every statement)".to_string(),
        SwapPolicy::Off => "swap turned off before each wipe".to_string(),
    };
    for v in &e.wipe.erase {
        storage += &format!(
            "; {} erased by key each epoch{}",
            v.device.display(),
            v.mount
                .as_ref()
                .map(|m| format!(" (fresh ext4 on {})", m.display()))
                .unwrap_or_default()
        );
    }
    let pcrs: Vec<String> = tpm.pcrs.iter().map(u8::to_string).collect();
    let root_of_trust = match tpm.mode {
        TpmMode::Off => "off: statements say the TPM was turned off here".to_string(),
        TpmMode::Auto | TpmMode::Required => format!(
            "{} TPM via {}, quoting PCRs {} with the IMA list {}",
            if tpm.mode == TpmMode::Required {
                "required:"
            } else {
                "auto: where there is one, a"
            },
            tpm.tcti,
            pcrs.join(","),
            tpm.ima_list.display()
        ),
    };
    EpochSummary {
        wipe_interval: units::fmt_duration(e.wipe_interval),
        challenge_timeout: units::fmt_duration(e.challenge_timeout),
        verifier: e.verifier.urls().collect::<Vec<_>>().join(", then "),
        verifier_trust: trust_text(&e.verifier.trust),
        request_timeout: units::fmt_duration(e.verifier.request_timeout),
        retry_max: units::fmt_duration(e.verifier.retry_max),
        log_key: e.verifier.log_key.as_ref().map(|k| k.vkey()),
        signing_key: e.signing_key.clone(),
        host_keyid: checked.host_keyid.clone(),
        wipe_backends: e.wipe.backends.iter().map(|b| backend_name(*b)).collect(),
        wipe_max_bytes: e.wipe.max_bytes.map(units::fmt_size),
        wipe_reserve: units::fmt_size(e.wipe.reserve_bytes),
        scratch: e.wipe.scratch.clone(),
        manifest_images: checked.manifest_images,
        workloads: workloads_text(&e.workloads),
        storage,
        root_of_trust,
    }
}

/// The warnings about the epoch loop's settings.
fn epoch_warnings(
    e: &EpochConfig,
    policy: Option<&VerifierPolicy>,
    facts: &HostFacts,
) -> Vec<ConfigWarning> {
    let mut warnings = Vec::new();
    if let (true, Some(max_bytes), Some(memory_bytes)) = (
        e.wipe.backends.contains(&Backend::Host),
        e.wipe.max_bytes,
        facts.memory_bytes,
    ) {
        let residue_bytes = memory_bytes
            .saturating_sub(max_bytes)
            .max(e.wipe.reserve_bytes);
        let limit_bytes = policy.and_then(|p| p.max_residue_host);
        let over = match limit_bytes {
            Some(limit) => residue_bytes > limit,
            None => max_bytes < memory_bytes / 2,
        };
        if over {
            warnings.push(ConfigWarning::HostWipeBound {
                max_bytes,
                memory_bytes,
                residue_bytes,
                limit_bytes,
            });
        }
    }
    let worst = e.verifier.retry_max + e.verifier.request_timeout;
    if worst > REDELIVERY_GOAL {
        warnings.push(ConfigWarning::SlowRedelivery {
            worst_ms: worst.as_millis() as u64,
        });
    }
    warnings
}

/// Where the TPM this host will (not) quote with meets the verifier's policy.
fn tpm_warnings(
    cfg: &Config,
    policy: Option<&VerifierPolicy>,
    tpm: &TpmFact,
) -> Vec<ConfigWarning> {
    use super::tpm::TpmMode;
    let mut warnings = Vec::new();
    if let TpmFact::Unusable { reason } = tpm
        && cfg.tpm.mode == TpmMode::Auto
    {
        warnings.push(ConfigWarning::TpmUnusable {
            tcti: cfg.tpm.tcti.clone(),
            reason: reason.clone(),
        });
    }
    let level = policy.and_then(|p| p.min_root_of_trust.as_deref());
    if let Some(level @ ("tpm" | "tpm_ima")) = level {
        let why = match (cfg.tpm.mode, tpm) {
            (TpmMode::Off, _) => Some(format!("[tpm] mode = \"off\" in {}", cfg.path.display())),
            (_, TpmFact::Unusable { reason }) => Some(format!(
                "the TPM at `{}` cannot be used: {reason}",
                cfg.tpm.tcti
            )),
            _ => None,
        };
        if let Some(why) = why {
            warnings.push(ConfigWarning::PolicyNeedsTpm {
                level: level.to_string(),
                why,
            });
        }
    }
    warnings
}

/// The report of a configuration that passed every check.
pub fn report(
    cfg: &Config,
    checked: &Checked,
    policy: Option<&VerifierPolicy>,
    facts: HostFacts,
) -> ConfigReport {
    let caps: Vec<CapLine> = Direction::ALL
        .iter()
        .map(|d| CapLine {
            direction: *d,
            rack_bytes_per_s: cfg.caps.rack_bytes_per_s(*d),
            host_bytes_per_s: cfg.host_bytes_per_s(*d),
            rack: units::fmt_rate(cfg.caps.rack_bytes_per_s(*d) as f64),
            host: units::fmt_rate(cfg.host_bytes_per_s(*d) as f64),
        })
        .collect();
    let mut warnings = Vec::new();
    for c in &caps {
        let agreement = policy.and_then(|p| match c.direction {
            Direction::Egress => p.agreement_egress,
            Direction::Ingress => p.agreement_ingress,
        });
        if let Some(a) = agreement.filter(|a| c.rack_bytes_per_s > *a) {
            warnings.push(ConfigWarning::CapAboveAgreement {
                direction: c.direction,
                cap_bytes_per_s: c.rack_bytes_per_s,
                agreement_bytes_per_s: a,
            });
        }
    }
    if let Some(e) = &cfg.epoch {
        warnings.extend(epoch_warnings(e, policy, &facts));
    }
    if cfg.self_protection == GuardMode::Auto && facts.guard_available {
        warnings.push(ConfigWarning::WillSeal);
    }
    warnings.extend(tpm_warnings(cfg, policy, &facts.tpm));
    ConfigReport {
        path: cfg.path.clone(),
        rack_id: cfg.rack_id.clone(),
        host_id: cfg.host_id.clone(),
        host_share: cfg.host_share,
        interfaces: cfg.interfaces.clone(),
        netns: cfg.netns.clone(),
        caps,
        burst: units::fmt_size(cfg.caps.burst_bytes),
        burst_bytes: cfg.caps.burst_bytes,
        pin_root: cfg.pin_root.clone(),
        state_dir: cfg.state_dir.clone(),
        control_socket: cfg.control_socket.clone(),
        check_interval: units::fmt_duration(cfg.check_interval),
        attach_mode: cfg.attach_mode,
        self_protection: cfg.self_protection,
        taps: taps_text(&cfg.taps),
        epoch: cfg
            .epoch
            .as_ref()
            .map(|e| epoch_summary(e, &cfg.tpm, checked)),
        warnings,
    }
}

fn taps_text(t: &super::taps::Taps) -> String {
    match t {
        super::taps::Taps::Off => "off (the plain policer: traffic is capped, not recorded)".into(),
        super::taps::Taps::On(c) => format!(
            "every passed frame recorded; HTTP/1.1 exchanges on {}; spool {}",
            if c.inference.is_empty() {
                "no endpoint (all raw flows)".to_string()
            } else {
                c.inference
                    .iter()
                    .map(|e| format!("tcp:{}", e.tcp_port))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            units::fmt_size(c.spool_limit)
        ),
    }
}

fn attach_mode_name(m: AttachMode) -> &'static str {
    match m {
        AttachMode::Auto => "auto (tcx where the kernel has it, clsact otherwise)",
        AttachMode::Tcx => "tcx",
        AttachMode::Clsact => "clsact",
    }
}

fn guard_mode_name(m: GuardMode) -> &'static str {
    match m {
        GuardMode::Auto => "auto (the guard where the kernel takes it: BPF LSM, else fmod_ret)",
        GuardMode::Lsm => "lsm (the guard required, BPF LSM or fmod_ret)",
        GuardMode::Watch => "watch (the tamper watch, no guard)",
        GuardMode::Off => "off",
    }
}

impl ConfigReport {
    /// The report for a person: one value per line, each with its unit.
    pub fn render(&self) -> String {
        let mut out = format!(
            "{}: ok (checked as rackwardend checks it: keys, manifest, CA, directories, interfaces)\n",
            self.path.display()
        );
        let mut line = |k: &str, v: String| out.push_str(&format!("  {k:<18} {v}\n"));
        line(
            "rack / host",
            format!(
                "{} / {} (this host's share of the rack cap: {})",
                self.rack_id, self.host_id, self.host_share
            ),
        );
        line(
            "interfaces",
            match &self.netns {
                Some(ns) => format!("{} (network namespace {ns})", self.interfaces.join(", ")),
                None => self.interfaces.join(", "),
            },
        );
        for c in &self.caps {
            line(
                &format!("cap {}", c.direction.name()),
                format!("rack {}, this host {}", c.rack, c.host),
            );
        }
        line("burst", self.burst.clone());
        line("pin root", self.pin_root.display().to_string());
        line("state dir", self.state_dir.display().to_string());
        line("control socket", self.control_socket.display().to_string());
        line("hook check every", self.check_interval.clone());
        line("attach mode", attach_mode_name(self.attach_mode).into());
        line(
            "self-protection",
            guard_mode_name(self.self_protection).into(),
        );
        line("taps", self.taps.clone());
        match &self.epoch {
            None => line(
                "epoch loop",
                "none (this daemon only enforces the caps)".into(),
            ),
            Some(e) => render_epoch(e, &mut line),
        }
        if self.warnings.is_empty() {
            out.push_str("no warnings\n");
        } else {
            out.push_str(&format!("{} warning(s):\n", self.warnings.len()));
            for w in &self.warnings {
                out.push_str(&format!("  WARNING: {w}\n"));
            }
        }
        out
    }
}

fn render_epoch(e: &EpochSummary, line: &mut impl FnMut(&str, String)) {
    line(
        "epoch",
        format!(
            "every {}, challenge timeout {}",
            e.wipe_interval, e.challenge_timeout
        ),
    );
    line("verifier", format!("{} ({})", e.verifier, e.verifier_trust));
    line(
        "delivery",
        format!(
            "request timeout {}, backoff ceiling {}",
            e.request_timeout, e.retry_max
        ),
    );
    line(
        "verifier log",
        match &e.log_key {
            Some(k) => format!("inclusion and consistency checked with {k}"),
            None => "entries kept, not checked (no [verifier] log_key)".into(),
        },
    );
    line(
        "signing key",
        format!(
            "{} (keyid {})",
            e.signing_key.display(),
            e.host_keyid.as_deref().unwrap_or("not read")
        ),
    );
    let mut wipe = format!(
        "{}; {} per device; {} of host memory left untouched",
        e.wipe_backends.join(", "),
        e.wipe_max_bytes
            .as_ref()
            .map_or("no bound".to_string(), |m| format!("at most {m}")),
        e.wipe_reserve
    );
    if !e.scratch.is_empty() {
        let dirs: Vec<String> = e.scratch.iter().map(|p| p.display().to_string()).collect();
        wipe += &format!("; scratch {}", dirs.join(", "));
    }
    line("wipe", wipe);
    line("storage", e.storage.clone());
    line("root of trust", e.root_of_trust.clone());
    if let Some(n) = e.manifest_images {
        line("images", format!("{n} in the signed manifest"));
    }
    line("workloads", e.workloads.clone());
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "rack_id = \"rack-a17\"\nhost_id = \"host-03\"\nhost_share = 0.25\ninterfaces = [\"eth0\"]\n\n[cap]\negress = \"10 MB/s\"\ningress = \"10 MB/s\"\nburst = \"256 KiB\"\n";
    const EPOCH: &str = "\n[epoch]\nwipe_interval = \"15 min\"\nsigning_key = \"/k/host.key\"\n\n[verifier]\nurl = \"http://127.0.0.1:7700\"\n\n[wipe]\nbackends = [\"host\"]\nmax_bytes = \"1 GiB\"\n\n[workloads]\nstop_command = [\"/bin/stop\", \"now\"]\nstart_command = [\"/bin/start\"]\n";

    fn parse(text: &str) -> Config {
        Config::parse(Path::new("/etc/rackwarden/rackwarden.toml"), text).unwrap()
    }

    #[test]
    fn the_report_has_units_and_no_debug_output() {
        let cfg = parse(&format!("{BASE}{EPOCH}"));
        let r = report(&cfg, &Checked::default(), None, HostFacts::default());
        let text = r.render();
        let host_cap = format!("rack 10 MB/s, this host {}", units::fmt_rate(2_500_000.0));
        for want in [
            host_cap.as_str(),
            "256 KiB",
            "every 15 min",
            "host; at most 1 GiB per device; 1 GiB of host memory left untouched",
            "stop `/bin/stop now`, start `/bin/start`",
            "backoff ceiling 15 s",
            "storage            swap stays on (residue in every statement)",
            "root of trust      auto: where there is one, a TPM via device:/dev/tpmrm0, quoting PCRs 0,1,2,3,4,5,6,7,8,9,10",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        for debug in ["[Host]", "Commands {", "Some(", "\"", "{ "] {
            assert!(!text.contains(debug), "Debug output {debug:?} in:\n{text}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["epoch"]["wipe_backends"], serde_json::json!(["host"]));
        assert_eq!(json["caps"][0]["host_bytes_per_s"], 2_500_000);
    }

    #[test]
    fn warnings_where_the_policy_cannot_be_met() {
        let cfg = parse(&format!("{BASE}{EPOCH}").replace("15 min", "15 min"));
        let policy = VerifierPolicy {
            max_residue_host: Some(4 << 30),
            agreement_egress: Some(5_000_000),
            agreement_ingress: Some(10_000_000),
            min_root_of_trust: None,
        };
        let facts = HostFacts {
            memory_bytes: Some(64 << 30),
            guard_available: true,
            tpm: TpmFact::NotOpened,
        };
        let r = report(&cfg, &Checked::default(), Some(&policy), facts.clone());
        let text = r.render();
        assert!(
            r.warnings.contains(&ConfigWarning::CapAboveAgreement {
                direction: Direction::Egress,
                cap_bytes_per_s: 10_000_000,
                agreement_bytes_per_s: 5_000_000
            }),
            "{text}"
        );
        assert!(r.warnings.contains(&ConfigWarning::WillSeal), "{text}");
        assert!(
            r.warnings.contains(&ConfigWarning::HostWipeBound {
                max_bytes: 1 << 30,
                memory_bytes: 64 << 30,
                residue_bytes: 63 << 30,
                limit_bytes: Some(4 << 30)
            }),
            "{text}"
        );
        assert!(
            text.contains("above the verifier's max_residue_host of 4 GiB"),
            "{text}"
        );
        // Without the policy, the bound is still far below memory.
        let r = report(&cfg, &Checked::default(), None, facts);
        assert!(
            r.warnings.iter().any(|w| matches!(
                w,
                ConfigWarning::HostWipeBound {
                    limit_bytes: None,
                    ..
                }
            )),
            "{}",
            r.render()
        );
        let slow = parse(&format!("{BASE}{EPOCH}").replace(
            "url = \"http://127.0.0.1:7700\"",
            "url = \"http://127.0.0.1:7700\"\nretry_max = \"5 min\"",
        ));
        let r = report(&slow, &Checked::default(), None, HostFacts::default());
        assert_eq!(
            r.warnings,
            [ConfigWarning::SlowRedelivery { worst_ms: 310_000 }]
        );
    }

    #[test]
    fn the_verifier_policy_is_read_for_this_rack() {
        let dir = std::env::temp_dir().join(format!("rw-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("verifier.toml");
        std::fs::write(
            &p,
            "listen = \"127.0.0.1:7700\"\n\n[policy]\nmax_residue_host = \"4 GiB\"\n\n[racks.rack-a17]\negress = \"5 MB/s\"\ningress = \"8 Mbit/s\"\n",
        )
        .unwrap();
        let got = VerifierPolicy::read(&p, "rack-a17").unwrap();
        let other = VerifierPolicy::read(&p, "rack-b").unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(
            got,
            VerifierPolicy {
                max_residue_host: Some(4 << 30),
                agreement_egress: Some(5_000_000),
                agreement_ingress: Some(1_000_000),
                min_root_of_trust: None,
            }
        );
        assert!(other.contains("no `[racks.rack-b]`"), "{other}");
    }

    /// Issue 42: a wrong TPM port passed every check. Unusable under `auto` is a warning;
    /// under a policy that requires a TPM it says the host will be contraindicated.
    #[test]
    fn a_tpm_that_cannot_be_used_is_said_and_judged_against_the_policy() {
        let cfg = parse(&format!("{BASE}{EPOCH}"));
        let unusable = HostFacts {
            tpm: TpmFact::Unusable {
                reason: "no TPM answers at 127.0.0.1:2399".into(),
            },
            ..HostFacts::default()
        };
        let needs = VerifierPolicy {
            min_root_of_trust: Some("tpm".into()),
            ..VerifierPolicy::default()
        };
        let r = report(&cfg, &Checked::default(), Some(&needs), unusable.clone());
        let text = r.render();
        assert!(
            r.warnings
                .iter()
                .any(|w| matches!(w, ConfigWarning::TpmUnusable { .. })),
            "{text}"
        );
        assert!(
            text.contains("requires min_root_of_trust = \"tpm\" and the TPM at")
                && text.contains("no TPM answers at 127.0.0.1:2399")
                && text.contains("contraindicated"),
            "{text}"
        );
        // A usable TPM under the same policy: nothing to say.
        let usable = HostFacts {
            tpm: TpmFact::Usable {
                vendor: "SW   TPM".into(),
            },
            ..HostFacts::default()
        };
        let r = report(&cfg, &Checked::default(), Some(&needs), usable);
        assert!(
            !r.warnings.iter().any(|w| matches!(
                w,
                ConfigWarning::TpmUnusable { .. } | ConfigWarning::PolicyNeedsTpm { .. }
            )),
            "{}",
            r.render()
        );
        // No policy: the unusable TPM is still a warning, not a policy finding.
        let r = report(&cfg, &Checked::default(), None, unusable);
        assert!(
            !r.warnings
                .iter()
                .any(|w| matches!(w, ConfigWarning::PolicyNeedsTpm { .. }))
        );
    }
}
