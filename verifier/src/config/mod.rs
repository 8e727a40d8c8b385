//! `verifier.toml`: where to listen, where the database lives, and the policy. Errors name
//! the file, the line and the key.
//!
//! ```toml
//! listen = "10.0.0.5:7700"
//! tls_cert = "/etc/rackwarden-verifier/tls/server.pem"   # PEM chain, leaf first
//! tls_key = "/etc/rackwarden-verifier/tls/server.key"    # PEM private key, or
//! # tls_key = "credential:tls-key"   # read from $CREDENTIALS_DIRECTORY/tls-key (systemd's
//! #                                  # LoadCredential=, for a DynamicUser= service)
//! # insecure_http = true          # plain HTTP instead: refused unless `listen` is loopback
//! database = "/var/lib/rackwarden-verifier/verifier.sqlite"
//! # database = "postgres://rackwarden@db.internal/verifier"  # PostgreSQL: several instances
//! #                                  # share one server (then `log_key` must be set: the key is
//! #                                  # the fleet's, copied to each instance)
//! max_body = "4 MiB"
//! max_openings_body = "1 GiB"     # POST /v1/openings: sampled records with their bytes
//! request_timeout = "10 s"
//! max_connections = 1024          # open connections at once; more wait in the backlog
//! header_timeout = "5 s"          # a client that has not sent its headers by then is dropped
//! # The transparency log of stored statements (issue 24). Its ed25519 key is made on the
//! # first `serve` and never overwritten: <key> (0600), <key stem>.pub and <key stem>.vkey
//! # (the C2SP verifier key hosts and auditors check checkpoints with).
//! # log_key = "/var/lib/rackwarden-verifier/tlog.key"   # default: tlog.key beside `database`
//! # log_origin = "verifier.example/rackwarden"  # default: rackwarden-verifier/<listen IP>, or
//! #                                            # /<host name> when listening on 0.0.0.0 or ::
//!
//! [policy]
//! id = "inference-only-2026-12"
//! nonce_ttl = "10 min"
//! max_wipe_interval = "15 min"    # also the longest a host may stay silent
//! max_clock_skew = "5 s"          # how far a host's clock may be from ours (default)
//! max_residue_host = "4 GiB"
//! max_residue_gpu = "1 GiB"
//! max_residue_persistent = "0 B"   # disks, swap, persistent filesystems (default 0)
//! require_storage_inventory = false  # true: a statement without one is contraindicated
//! # credit_erase_by_key = false      # true: volumes erased by key hold no residue
//! # [policy.storage_exclude]          # residue not counted, each with its reason
//! # "device:vda" = "the OS disk: holds no model state (our image, read-only in production)"
//! trainable_state = "10 TB"
//! max_epoch_fraction = 0.01       # bytes received in one epoch / trainable state
//! reference_bandwidth = "400 Gbit/s" # the interconnect training would otherwise have (default)
//! required_wipe_backends = ["host"] # device classes each wipe must cover completely (default)
//! # accepted_daemon_digests = ["<sha3-256 of rackwardend>"]   # pin daemon builds (optional)
//! # accepted_program_tags = ["<16 hex digits>"]               # pin eBPF program tags (optional)
//! # min_self_protection = "refused"   # weakest level a host may report for any tamper path
//! #                                   # (refused: the BPF LSM guard; default: not checked)
//! # manifest = "/etc/rackwarden-verifier/manifest.dsse.json"
//! # manifest_key = "/etc/rackwarden-verifier/verifier.pub"
//! # [policy.taps]                  # the tap's traffic commitment (at the end of [policy])
//! # required = false               # true: a statement without a traffic report is contraindicated
//! # max_unaccounted = "0 B"        # bytes passed that no record covers, per direction (default)
//! # samples = 8                    # byte offsets drawn per direction of each epoch (default)
//! # opening_deadline = "10 min"    # how long a host has to open them (default)
//! # keep_openings = "168 h"        # how long the opened bytes are kept (default: 7 days)
//! # allowed_raw_flows = ["udp:53", "tcp:53", "udp:123", "non_ip"]  # peers of other flows
//! #                                # (default: DNS, NTP, non_ip; add "tcp:VERIFIER_ADDR:PORT")
//! # [policy.replay]                # judging the replay service's findings (docs/replay.md)
//! # tolerance = 0.05               # how far a token may trail the seeded winner (default;
//! #                                # between 0 and 1, in logits divided by the temperature)
//!
//! [racks.rack-a17]
//! egress = "10 MB/s"
//! ingress = "10 MB/s"
//! burst = "1 MiB"                  # the largest bucket a host may report (default)
//! ```

use std::{
    collections::BTreeMap,
    net::SocketAddr,
    path::{Path, PathBuf},
    time::Duration,
};

use rackwarden_attest::units;
use rackwarden_sampler::verdict::NEAR_CAP;
use serde::Deserialize;
use toml::Spanned;

pub use rackwarden_attest::config_error::{ConfigError, line_of};

mod boot;
mod flow_rule;
mod tpm;
pub use boot::{BootLogPolicy, forbids};
pub use flow_rule::FlowRule;
pub use tpm::{RuntimePolicy, TpmEnrolConfig, parse_allowlist};

#[derive(Debug, Clone, serde::Serialize)]
pub struct RackAgreement {
    pub egress_bytes_per_s: u64,
    pub ingress_bytes_per_s: u64,
    /// The largest bucket depth a host may report (`burst`, default 1 MiB): the byte bound
    /// is burst + rate x time, so an unbounded burst would bound nothing.
    pub max_burst_bytes: u64,
}

/// Serialised only for its digest ([`Policy::digest`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Policy {
    pub id: String,
    pub nonce_ttl: Duration,
    pub max_wipe_interval: Duration,
    /// How far a host's claimed epoch times may lie outside what this verifier saw (nonce
    /// issued, statement received) before they are a finding (`max_clock_skew`, default 5 s).
    pub max_clock_skew: Duration,
    pub max_residue_host: u64,
    pub max_residue_gpu: u64,
    pub trainable_state_bytes: u64,
    pub max_epoch_fraction: f64,
    /// The interconnect bandwidth a training job would have without the caps: the page's
    /// slowdown factor is this over the rack's enforced caps.
    pub reference_bandwidth_bytes_per_s: u64,
    /// Device classes (`host`, `gpu`, `scratch`) every wipe must cover completely to count.
    pub required_wipe_backends: Vec<String>,
    /// SHA3-256 of the daemon binaries the policy accepts (`producer.binary_sha3_256`); any
    /// when unset.
    pub accepted_daemon_digests: Option<Vec<String>>,
    /// Kernel tags of the eBPF programs the policy accepts; any when unset.
    pub accepted_program_tags: Option<Vec<String>>,
    /// The weakest protection a statement may report for any tamper path (`None`: any).
    pub min_self_protection: Option<rackwarden_attest::evidence::ProtectionLevel>,
    /// Digests (merkle_sha3_256) the signed manifest allows, if a manifest is configured.
    pub allowed_images: Option<Vec<String>>,
    pub racks: BTreeMap<String, RackAgreement>,
    /// The least root of trust a statement must have (`none`: the daemon's word is enough).
    /// Left out of the digest at its default, so policies written before it keep theirs.
    #[serde(skip_serializing_if = "trust_level_is_none")]
    pub min_root_of_trust: rackwarden_attest::tpm::TrustLevel,
    /// How IMA entries are judged (`None`: replayed against PCR 10, not judged).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtime: Option<RuntimePolicy>,
    /// Reference values (hex SHA-256 bank) of boot PCRs (empty: the boot is not judged).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub boot_pcrs: BTreeMap<u8, String>,
    /// `[policy.boot]`'s sets, judged from the boot's event log (`None`: not judged so).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub boot_log: Option<BootLogPolicy>,
    /// The most writable persistent bytes (residue in a statement's storage inventory) a
    /// host may have. Default 0; left out of the digest at 0, so policies written before it
    /// keep theirs.
    #[serde(skip_serializing_if = "is_zero")]
    pub max_residue_persistent: u64,
    /// A statement without a storage inventory is contraindicated (default false: daemons
    /// older than the inventory are judged as before). Left out of the digest when false.
    #[serde(skip_serializing_if = "is_false")]
    pub require_storage_inventory: bool,
    /// Residue items the policy does not count against `max_residue_persistent`, each with
    /// the operator's reason (`[policy.storage_exclude]`, keyed by device name, mount point
    /// or swap path). The findings still name them. Left out of the digest when empty.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub storage_exclude: BTreeMap<String, String>,
    /// Whether a volume erased by key this epoch holds no residue. Erase by key destroys
    /// what was written through the dm-crypt mapping; a workload with root can write the raw
    /// device and read it back, so the default (false) counts erased volumes in full. Set it
    /// where workloads cannot reach raw block devices. Left out of the digest when false.
    #[serde(skip_serializing_if = "is_false")]
    pub credit_erase_by_key: bool,
    /// `[policy.taps]`: how a statement's traffic report is judged. Left out of the digest at
    /// its defaults, so policies written before it keep theirs.
    #[serde(skip_serializing_if = "TapsPolicy::is_default")]
    pub taps: TapsPolicy,
    /// `[policy.replay]`: how the replays of opened exchanges are judged. Left out of the
    /// digest at its defaults, so policies written before it keep theirs.
    #[serde(skip_serializing_if = "ReplayPolicy::is_default")]
    pub replay: ReplayPolicy,
}

/// `[policy.replay]`: the tolerance the replay's scores are judged at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReplayPolicy {
    /// How far a claimed token's perturbed logit may trail the seeded winner's
    /// (`tolerance`, default [`rackwarden_sampler::DEFAULT_TOLERANCE`]): what honest replays
    /// on other hardware need, and exactly the covert channel left (bench replay).
    pub tolerance: Tolerance,
}

/// A replay tolerance: finite, between 0 and [`NEAR_CAP`] (above it the stored gaps no
/// longer bound the covert channel exactly). Compared by its bits, so a policy stays `Eq`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
#[serde(transparent)]
pub struct Tolerance(f64);

impl Tolerance {
    pub fn new(t: f64) -> Result<Tolerance, String> {
        if t.is_finite() && (0.0..=NEAR_CAP).contains(&t) {
            Ok(Tolerance(t))
        } else {
            Err(format!("{t} is not between 0 and {NEAR_CAP}"))
        }
    }

    pub fn get(self) -> f64 {
        self.0
    }
}

impl PartialEq for Tolerance {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Tolerance {}

impl Default for ReplayPolicy {
    fn default() -> Self {
        ReplayPolicy {
            tolerance: Tolerance(rackwarden_sampler::DEFAULT_TOLERANCE),
        }
    }
}

impl ReplayPolicy {
    fn is_default(&self) -> bool {
        *self == ReplayPolicy::default()
    }
}

/// `[policy.taps]`: what the host's tap must commit of the bytes its policer passed, and
/// how much of it the host must open.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TapsPolicy {
    /// A statement without a traffic report is contraindicated (`traffic_missing`), and one
    /// whose records were not kept too (`traffic_not_kept`). Default false: hosts without
    /// the tap and daemons older than it are judged as before.
    pub required: bool,
    /// The most bytes per direction an epoch may pass that no committed record covers
    /// (`max_unaccounted`, default 0).
    pub max_unaccounted_bytes: u64,
    /// Byte offsets drawn per direction of every committed epoch with bytes (`samples`,
    /// default 8; 0 draws none).
    pub samples: u32,
    /// How long after the draw the host has to answer with the openings (`opening_deadline`,
    /// default 10 min): a statement whose epoch ends after a deadline that passed unanswered
    /// is contraindicated (`traffic_opening_missing`).
    pub opening_deadline: Duration,
    /// How long the opened bytes are kept (`keep_openings`, default 7 days); the digest and
    /// the outcome are kept with the statements.
    pub keep_openings: Duration,
    /// The peers an opened raw-flow record may have (`allowed_raw_flows`, default DNS,
    /// NTP and frames that are not IP); any other is `traffic_flow_not_allowed`.
    pub allowed_raw_flows: Vec<FlowRule>,
}

impl Default for TapsPolicy {
    fn default() -> Self {
        TapsPolicy {
            required: false,
            max_unaccounted_bytes: 0,
            samples: 8,
            opening_deadline: Duration::from_secs(600),
            keep_openings: Duration::from_secs(7 * 24 * 3600),
            allowed_raw_flows: FlowRule::defaults(),
        }
    }
}

impl TapsPolicy {
    fn is_default(&self) -> bool {
        *self == TapsPolicy::default()
    }
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

fn is_false(v: &bool) -> bool {
    !*v
}

fn trust_level_is_none(l: &rackwarden_attest::tpm::TrustLevel) -> bool {
    *l == rackwarden_attest::tpm::TrustLevel::None
}

impl Policy {
    /// Lowercase hex SHA3-256 of the policy as parsed (every value that can change a
    /// verdict, in declaration order): each stored verdict names it, so `recheck` tells a
    /// policy edit from a verdict that does not re-derive under its own policy.
    pub fn digest(&self) -> String {
        // Serialising plain data into memory cannot fail (string map keys, no custom
        // serialisers); an empty body would still be a digest, just never a matching one.
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(rackwarden_attest::sha3(&bytes))
    }
}

/// Where the TLS private key is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TlsKey {
    /// A PEM file.
    File(PathBuf),
    /// A systemd credential (`tls_key = "credential:<name>"`): the file `<name>` in
    /// `$CREDENTIALS_DIRECTORY`, which systemd fills from `LoadCredential=` readable by the
    /// service's (dynamic) user alone, so the key on disk can stay 0600 root.
    Credential(String),
}

/// The prefix of a `tls_key` that names a systemd credential.
pub const CREDENTIAL_PREFIX: &str = "credential:";

/// A `tls_key = "credential:<name>"` that cannot be read.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error(
        "tls_key names the credential `{0}` but $CREDENTIALS_DIRECTORY is not set (the unit needs LoadCredential={0}:<path of the key>)"
    )]
    NoDirectory(String),
}

impl TlsKey {
    /// The file to read the key from (for a credential, resolved now: systemd sets the
    /// directory for the service's process only).
    pub fn path(&self) -> Result<PathBuf, CredentialError> {
        match self {
            TlsKey::File(p) => Ok(p.clone()),
            TlsKey::Credential(name) => std::env::var_os("CREDENTIALS_DIRECTORY")
                .filter(|d| !d.is_empty())
                .map(|d| PathBuf::from(d).join(name))
                .ok_or_else(|| CredentialError::NoDirectory(name.clone())),
        }
    }
}

/// How `serve` speaks to its clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transport {
    /// TLS with this certificate chain (PEM file) and key.
    Tls { cert: PathBuf, key: TlsKey },
    /// Plain HTTP, only ever on a loopback address (`insecure_http = true`).
    InsecureHttp,
}

#[derive(Debug, Clone)]
pub struct VerifierConfig {
    pub path: PathBuf,
    pub listen: SocketAddr,
    pub transport: Transport,
    pub database: crate::store::DatabaseUrl,
    pub max_body_bytes: usize,
    /// The largest body `POST /v1/openings` takes (`max_openings_body`, default 1 GiB): an
    /// opened record carries its bytes, up to a whole raw flow of an epoch.
    pub max_openings_body_bytes: usize,
    pub request_timeout: Duration,
    pub max_connections: usize,
    pub header_timeout: Duration,
    pub policy: Policy,
    /// `[tpm]`: whom AK enrolment trusts to certify EKs (`None`: no AK is enrolled).
    pub tpm: Option<TpmEnrolConfig>,
    /// The transparency log's private key (made on first `serve` if absent).
    pub log_key: PathBuf,
    /// The log's origin: the first line of its checkpoints and its key's name.
    pub log_origin: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Raw {
    listen: Spanned<String>,
    tls_cert: Option<Spanned<String>>,
    tls_key: Option<Spanned<String>>,
    insecure_http: Option<Spanned<bool>>,
    database: Spanned<String>,
    max_body: Option<Spanned<String>>,
    max_openings_body: Option<Spanned<String>>,
    request_timeout: Option<Spanned<String>>,
    max_connections: Option<Spanned<i64>>,
    header_timeout: Option<Spanned<String>>,
    policy: RawPolicy,
    #[serde(default)]
    racks: BTreeMap<String, Spanned<RawRack>>,
    tpm: Option<tpm::RawTpm>,
    log_key: Option<Spanned<String>>,
    log_origin: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    id: Spanned<String>,
    nonce_ttl: Spanned<String>,
    max_wipe_interval: Spanned<String>,
    max_clock_skew: Option<Spanned<String>>,
    max_residue_host: Spanned<String>,
    max_residue_gpu: Spanned<String>,
    trainable_state: Spanned<String>,
    max_epoch_fraction: Spanned<f64>,
    reference_bandwidth: Option<Spanned<String>>,
    required_wipe_backends: Option<Spanned<Vec<Spanned<String>>>>,
    accepted_daemon_digests: Option<Vec<Spanned<String>>>,
    accepted_program_tags: Option<Vec<Spanned<String>>>,
    min_self_protection: Option<Spanned<String>>,
    manifest: Option<Spanned<String>>,
    manifest_key: Option<Spanned<String>>,
    min_root_of_trust: Option<Spanned<String>>,
    runtime: Option<tpm::RawRuntime>,
    boot: Option<boot::RawBoot>,
    max_residue_persistent: Option<Spanned<String>>,
    require_storage_inventory: Option<bool>,
    storage_exclude: Option<BTreeMap<String, Spanned<String>>>,
    credit_erase_by_key: Option<bool>,
    taps: Option<RawTaps>,
    replay: Option<RawReplay>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReplay {
    tolerance: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTaps {
    required: Option<bool>,
    max_unaccounted: Option<Spanned<String>>,
    samples: Option<u32>,
    opening_deadline: Option<Spanned<String>>,
    keep_openings: Option<Spanned<String>>,
    allowed_raw_flows: Option<Vec<Spanned<String>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRack {
    egress: Spanned<String>,
    ingress: Spanned<String>,
    burst: Option<Spanned<String>>,
}

impl VerifierConfig {
    pub fn load(path: &Path) -> Result<VerifierConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        Self::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<VerifierConfig, ConfigError> {
        let src = Source { path, text };
        let raw: Raw =
            toml::from_str(text).map_err(|e| src.err(e.span(), e.message().trim().to_string()))?;
        let listen: SocketAddr = raw
            .listen
            .get_ref()
            .parse()
            .map_err(|e| src.err(Some(raw.listen.span()), format!("`listen`: {e}")))?;
        let transport = transport(&src, &raw, listen)?;
        // The steps run in the order their errors have always been reported in.
        let checked = checked_first(&src, &raw.policy, &raw.racks)?;
        let max_body_bytes = match &raw.max_body {
            Some(s) => src.size("max_body", s)? as usize,
            None => 4 << 20,
        };
        let max_openings_body_bytes = match &raw.max_openings_body {
            Some(s) => src.size("max_openings_body", s)? as usize,
            None => 1 << 30,
        };
        let max_connections = max_connections(&src, &raw.max_connections)?;
        let header_timeout = match &raw.header_timeout {
            Some(s) => src.dur("header_timeout", s)?,
            None => Duration::from_secs(5),
        };
        let request_timeout = match &raw.request_timeout {
            Some(s) => src.dur("request_timeout", s)?,
            None => Duration::from_secs(10),
        };
        let database = crate::store::DatabaseUrl::parse(raw.database.get_ref());
        let log_key = match (&raw.log_key, database.path()) {
            (Some(k), _) => PathBuf::from(k.get_ref()),
            (None, Some(file)) => file.parent().unwrap_or(Path::new(".")).join("tlog.key"),
            // A server has no directory beside it, and every instance must sign with the
            // same log key: the operator says where each instance finds its copy.
            (None, None) => {
                return Err(src.err(
                    Some(raw.database.span()),
                    "`log_key`: required with a PostgreSQL `database` (every instance signs the shared log with one key; there is no directory beside a server to make it in)".to_string(),
                ));
            }
        };
        let log_origin = match &raw.log_origin {
            Some(o) => {
                let name = o.get_ref();
                if name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '+') {
                    return Err(src.err(
                        Some(o.span()),
                        format!("`log_origin`: `{name}` is empty or has a space or `+` (it names the log's key)"),
                    ));
                }
                name.clone()
            }
            None => default_log_origin(listen),
        };
        let policy = policy(&src, &raw.policy, checked)?;
        let tpm = tpm::tpm_enrol(&src, &raw.tpm)?;
        // A policy that requires quotes from AKs no host can enrol (no EK roots to certify
        // them) would hold every host: refuse it now, with the fix.
        if policy.min_root_of_trust >= rackwarden_attest::tpm::TrustLevel::Tpm && tpm.is_none() {
            return Err(src.err(
                raw.policy.min_root_of_trust.as_ref().map(|s| s.span()),
                format!(
                    "`policy.min_root_of_trust = \"{}\"` needs a `[tpm]` table with `ek_roots` (the manufacturer root CAs that certify hosts' EKs): without it no host can enrol an AK and every host is held",
                    policy.min_root_of_trust.name()
                ),
            ));
        }
        Ok(VerifierConfig {
            path: path.into(),
            listen,
            transport,
            database,
            log_key,
            log_origin,
            max_body_bytes,
            max_openings_body_bytes,
            request_timeout,
            max_connections,
            header_timeout,
            policy,
            tpm,
        })
    }
}

/// `rackwarden-verifier/<listen IP>`, or `rackwarden-verifier/<host name>` when the verifier
/// listens on every address (0.0.0.0 or ::). It names the log's key: set `log_origin`
/// explicitly on a verifier whose address or name may change.
fn default_log_origin(listen: SocketAddr) -> String {
    if !listen.ip().is_unspecified() {
        return format!("rackwarden-verifier/{}", listen.ip());
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '+')
        .collect();
    if host.is_empty() {
        "rackwarden-verifier".into()
    } else {
        format!("rackwarden-verifier/{host}")
    }
}

/// The file being parsed: every error names it and the line of the value at fault.
struct Source<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Source<'_> {
    fn err(&self, span: Option<std::ops::Range<usize>>, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.into(),
            line: span.map(|s| line_of(self.text, s.start)).unwrap_or(1),
            message,
        }
    }

    fn size(&self, key: &str, s: &Spanned<String>) -> Result<u64, ConfigError> {
        units::parse_size(s.get_ref())
            .map_err(|e| self.err(Some(s.span()), format!("`{key}`: {e}")))
    }

    fn dur(&self, key: &str, s: &Spanned<String>) -> Result<Duration, ConfigError> {
        units::parse_duration(s.get_ref())
            .map_err(|e| self.err(Some(s.span()), format!("`{key}`: {e}")))
    }

    fn rate(&self, key: &str, s: &Spanned<String>) -> Result<u64, ConfigError> {
        let r = units::parse_rate(s.get_ref())
            .and_then(|r| r.bytes_per_sec(None))
            .map_err(|e| self.err(Some(s.span()), format!("`{key}`: {e}")))?;
        if r == 0 {
            return Err(self.err(Some(s.span()), format!("`{key}` must be above zero")));
        }
        Ok(r)
    }
}

/// TLS with a certificate and key, or plain HTTP on loopback only.
fn transport(src: &Source, raw: &Raw, listen: SocketAddr) -> Result<Transport, ConfigError> {
    // `insecure_http = false` is the same as leaving it out.
    let insecure = raw.insecure_http.as_ref().filter(|i| *i.get_ref());
    match (&raw.tls_cert, &raw.tls_key, insecure) {
        (Some(c), Some(k), None) => Ok(Transport::Tls {
            cert: PathBuf::from(c.get_ref()),
            key: tls_key(src, k)?,
        }),
        (Some(_), Some(_), Some(i)) => Err(src.err(
            Some(i.span()),
            "`insecure_http = true` and `tls_cert`/`tls_key` together: choose one".into(),
        )),
        (Some(c), None, _) => Err(src.err(Some(c.span()), "`tls_cert` needs `tls_key`".into())),
        (None, Some(k), _) => Err(src.err(Some(k.span()), "`tls_key` needs `tls_cert`".into())),
        (None, None, Some(i)) if !listen.ip().is_loopback() => Err(src.err(
            Some(i.span()),
            format!(
                "`insecure_http = true` is refused on {listen}: plain HTTP only on a loopback address (set `tls_cert` and `tls_key`)"
            ),
        )),
        (None, None, Some(_)) => Ok(Transport::InsecureHttp),
        (None, None, None) => Err(src.err(
            Some(raw.listen.span()),
            format!(
                "`listen` on {listen} needs `tls_cert` and `tls_key` (or `insecure_http = true` on a loopback address)"
            ),
        )),
    }
}

/// A key file, or `credential:<name>`: a plain file name (systemd's credential names hold
/// no `/`).
fn tls_key(src: &Source, k: &Spanned<String>) -> Result<TlsKey, ConfigError> {
    let Some(name) = k.get_ref().strip_prefix(CREDENTIAL_PREFIX) else {
        return Ok(TlsKey::File(PathBuf::from(k.get_ref())));
    };
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(src.err(
            Some(k.span()),
            format!("`tls_key`: `{name}` is not a credential name (a file name, as in LoadCredential=<name>:<path>)"),
        ));
    }
    Ok(TlsKey::Credential(name.into()))
}

fn max_connections(src: &Source, n: &Option<Spanned<i64>>) -> Result<usize, ConfigError> {
    match n {
        None => Ok(1024),
        Some(n) if (1..=65_536).contains(n.get_ref()) => Ok(*n.get_ref() as usize),
        Some(n) => Err(src.err(
            Some(n.span()),
            format!(
                "`max_connections` must be between 1 and 65536 (it is {})",
                n.get_ref()
            ),
        )),
    }
}

/// The parts of the policy checked before the listener's limits: the epoch fraction, the
/// manifest, and the racks' agreements.
struct CheckedFirst {
    max_epoch_fraction: f64,
    allowed_images: Option<Vec<String>>,
    racks: BTreeMap<String, RackAgreement>,
}

fn checked_first(
    src: &Source,
    p: &RawPolicy,
    raw_racks: &BTreeMap<String, Spanned<RawRack>>,
) -> Result<CheckedFirst, ConfigError> {
    let frac = *p.max_epoch_fraction.get_ref();
    if !(frac > 0.0 && frac <= 1.0) {
        return Err(src.err(
            Some(p.max_epoch_fraction.span()),
            "`policy.max_epoch_fraction` must be > 0 and <= 1".into(),
        ));
    }
    Ok(CheckedFirst {
        max_epoch_fraction: frac,
        allowed_images: allowed_images(src, p)?,
        racks: racks(src, raw_racks)?,
    })
}

/// The rest of the `[policy]` table.
fn policy(src: &Source, p: &RawPolicy, checked: CheckedFirst) -> Result<Policy, ConfigError> {
    Ok(Policy {
        accepted_daemon_digests: hex_list(
            src,
            "policy.accepted_daemon_digests",
            &p.accepted_daemon_digests,
            64,
        )?,
        accepted_program_tags: hex_list(
            src,
            "policy.accepted_program_tags",
            &p.accepted_program_tags,
            16,
        )?,
        min_self_protection: min_self_protection(src, &p.min_self_protection)?,
        required_wipe_backends: required_wipe_backends(src, &p.required_wipe_backends)?,
        id: p.id.get_ref().clone(),
        nonce_ttl: src.dur("policy.nonce_ttl", &p.nonce_ttl)?,
        max_wipe_interval: src.dur("policy.max_wipe_interval", &p.max_wipe_interval)?,
        max_clock_skew: match &p.max_clock_skew {
            None => Duration::from_secs(5),
            Some(s) => src.dur("policy.max_clock_skew", s)?,
        },
        max_residue_host: src.size("policy.max_residue_host", &p.max_residue_host)?,
        max_residue_gpu: src.size("policy.max_residue_gpu", &p.max_residue_gpu)?,
        trainable_state_bytes: src.size("policy.trainable_state", &p.trainable_state)?,
        max_epoch_fraction: checked.max_epoch_fraction,
        reference_bandwidth_bytes_per_s: match &p.reference_bandwidth {
            None => 50_000_000_000,
            Some(r) => src.rate("policy.reference_bandwidth", r)?,
        },
        allowed_images: checked.allowed_images,
        racks: checked.racks,
        min_root_of_trust: tpm::min_root_of_trust(src, &p.min_root_of_trust)?,
        runtime: tpm::runtime(
            src,
            &p.runtime,
            tpm::min_root_of_trust(src, &p.min_root_of_trust)?,
            p.min_root_of_trust.as_ref().map(|s| s.span()),
        )?,
        boot_pcrs: tpm::boot(src, &p.boot)?,
        boot_log: boot::boot_log(src, p.boot.as_ref())?,
        max_residue_persistent: match &p.max_residue_persistent {
            None => 0,
            Some(v) => src.size("policy.max_residue_persistent", v)?,
        },
        require_storage_inventory: p.require_storage_inventory.unwrap_or(false),
        storage_exclude: storage_exclude(src, &p.storage_exclude)?,
        credit_erase_by_key: p.credit_erase_by_key.unwrap_or(false),
        taps: taps(src, &p.taps)?,
        replay: match p.replay.as_ref().and_then(|r| r.tolerance.as_ref()) {
            None => ReplayPolicy::default(),
            Some(t) => ReplayPolicy {
                tolerance: Tolerance::new(*t.get_ref()).map_err(|e| {
                    src.err(Some(t.span()), format!("`policy.replay.tolerance`: {e}"))
                })?,
            },
        },
    })
}

/// `[policy.taps]`, with its defaults when absent.
fn taps(src: &Source, raw: &Option<RawTaps>) -> Result<TapsPolicy, ConfigError> {
    let Some(t) = raw else {
        return Ok(TapsPolicy::default());
    };
    let d = TapsPolicy::default();
    let dur = |key: &str, v: &Option<Spanned<String>>, default: Duration| match v {
        None => Ok(default),
        Some(v) => src.dur(key, v),
    };
    let policy = TapsPolicy {
        required: t.required.unwrap_or(d.required),
        max_unaccounted_bytes: match &t.max_unaccounted {
            None => d.max_unaccounted_bytes,
            Some(v) => src.size("policy.taps.max_unaccounted", v)?,
        },
        samples: t.samples.unwrap_or(d.samples),
        opening_deadline: dur(
            "policy.taps.opening_deadline",
            &t.opening_deadline,
            d.opening_deadline,
        )?,
        keep_openings: dur(
            "policy.taps.keep_openings",
            &t.keep_openings,
            d.keep_openings,
        )?,
        allowed_raw_flows: match &t.allowed_raw_flows {
            None => d.allowed_raw_flows.clone(),
            Some(list) => list
                .iter()
                .map(|v| {
                    FlowRule::parse(v.get_ref()).map_err(|e| {
                        src.err(
                            Some(v.span()),
                            format!("`policy.taps.allowed_raw_flows`: {e}"),
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        },
    };
    // A deadline of zero would contraindicate every sampled epoch at its next statement.
    if let Some(v) = &t.opening_deadline
        && policy.opening_deadline.is_zero()
    {
        return Err(src.err(
            Some(v.span()),
            "`policy.taps.opening_deadline` must be above 0 (the host needs time to answer)".into(),
        ));
    }
    Ok(policy)
}

/// The image digests the signed manifest allows, if one is configured (read and verified
/// now: a bad manifest stops the verifier from starting).
fn allowed_images(src: &Source, p: &RawPolicy) -> Result<Option<Vec<String>>, ConfigError> {
    match (&p.manifest, &p.manifest_key) {
        (None, None) => Ok(None),
        (Some(m), Some(k)) => {
            let key = rackwarden_attest::keys::load_verifying_key(Path::new(k.get_ref()))
                .map_err(|e| src.err(Some(k.span()), format!("`policy.manifest_key`: {e}")))?;
            let bytes = std::fs::read(m.get_ref())
                .map_err(|e| src.err(Some(m.span()), format!("`policy.manifest`: {e}")))?;
            let trimmed = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
            let vm = rackwarden_attest::manifest::verify_manifest(trimmed, &key)
                .map_err(|e| src.err(Some(m.span()), format!("`policy.manifest`: {e}")))?;
            Ok(Some(
                vm.manifest
                    .images
                    .into_iter()
                    .map(|i| i.merkle_sha3_256)
                    .collect(),
            ))
        }
        (Some(m), None) => Err(src.err(
            Some(m.span()),
            "`policy.manifest` needs `policy.manifest_key`".into(),
        )),
        (None, Some(k)) => Err(src.err(
            Some(k.span()),
            "`policy.manifest_key` without `policy.manifest`".into(),
        )),
    }
}

fn racks(
    src: &Source,
    raw: &BTreeMap<String, Spanned<RawRack>>,
) -> Result<BTreeMap<String, RackAgreement>, ConfigError> {
    let mut racks = BTreeMap::new();
    for (name, r) in raw {
        let rr = r.get_ref();
        racks.insert(
            name.clone(),
            RackAgreement {
                egress_bytes_per_s: src.rate(&format!("racks.{name}.egress"), &rr.egress)?,
                ingress_bytes_per_s: src.rate(&format!("racks.{name}.ingress"), &rr.ingress)?,
                max_burst_bytes: match &rr.burst {
                    None => 1 << 20,
                    Some(b) => src.size(&format!("racks.{name}.burst"), b)?,
                },
            },
        );
    }
    Ok(racks)
}

fn min_self_protection(
    src: &Source,
    v: &Option<Spanned<String>>,
) -> Result<Option<rackwarden_attest::evidence::ProtectionLevel>, ConfigError> {
    let Some(v) = v else { return Ok(None) };
    rackwarden_attest::evidence::ProtectionLevel::ALL
        .into_iter()
        .find(|l| l.name() == v.get_ref())
        .map(Some)
        .ok_or_else(|| {
            src.err(
                Some(v.span()),
                format!(
                    "`policy.min_self_protection`: unknown level `{}` (refused, restored_on_event, restored_on_poll, detected_on_sample)",
                    v.get_ref()
                ),
            )
        })
}

/// `[policy.storage_exclude]`: each item with a reason an auditor can read.
fn storage_exclude(
    src: &Source,
    raw: &Option<BTreeMap<String, Spanned<String>>>,
) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for (item, reason) in raw.iter().flatten() {
        let kinds = ["device:", "mount:", "swap:"];
        if !kinds
            .iter()
            .any(|k| item.starts_with(k) && item.len() > k.len())
        {
            return Err(src.err(
                Some(reason.span()),
                format!(
                    "`policy.storage_exclude`: `{item}` names no item: write `device:<kernel name>`, `mount:<mount point>` or `swap:<path>`"
                ),
            ));
        }
        if reason.get_ref().trim().is_empty() {
            return Err(src.err(
                Some(reason.span()),
                format!("`policy.storage_exclude.{item}`: give the reason it is not counted"),
            ));
        }
        out.insert(item.clone(), reason.get_ref().trim().to_string());
    }
    Ok(out)
}

fn required_wipe_backends(
    src: &Source,
    list: &Option<Spanned<Vec<Spanned<String>>>>,
) -> Result<Vec<String>, ConfigError> {
    let Some(list) = list else {
        return Ok(vec!["host".into()]);
    };
    let mut v = Vec::new();
    for b in list.get_ref() {
        if !["host", "gpu", "scratch"].contains(&b.get_ref().as_str()) {
            return Err(src.err(
                Some(b.span()),
                format!(
                    "`policy.required_wipe_backends`: unknown backend `{}` (host, gpu, scratch)",
                    b.get_ref()
                ),
            ));
        }
        v.push(b.get_ref().clone());
    }
    Ok(v)
}

/// A list of lowercase hex strings of `len` digits, each checked where it is written.
fn hex_list(
    src: &Source,
    key: &str,
    v: &Option<Vec<Spanned<String>>>,
    len: usize,
) -> Result<Option<Vec<String>>, ConfigError> {
    let Some(list) = v else { return Ok(None) };
    let mut out = Vec::new();
    for h in list {
        let s = h.get_ref();
        if s.len() != len
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(src.err(
                Some(h.span()),
                format!("`{key}`: `{s}` is not {len} lowercase hex digits"),
            ));
        }
        out.push(s.clone());
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/v.sqlite\"\n\n[policy]\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\nmin_root_of_trust = \"none\"\n\n[racks.r1]\negress = \"10 MB/s\"\ningress = \"10 MB/s\"\n";

    #[test]
    fn good_config() {
        let c = VerifierConfig::parse(Path::new("v.toml"), GOOD).unwrap();
        assert_eq!(c.policy.racks["r1"].egress_bytes_per_s, 10_000_000);
        assert_eq!(c.policy.trainable_state_bytes, 10_000_000_000_000);
        assert_eq!(c.policy.max_clock_skew, Duration::from_secs(5));
        let c = VerifierConfig::parse(
            Path::new("v.toml"),
            &GOOD.replace(
                "insecure_http = true",
                "tls_cert = \"/c\"\ntls_key = \"credential:tls-key\"",
            ),
        )
        .unwrap();
        assert_eq!(
            c.transport,
            Transport::Tls {
                cert: "/c".into(),
                key: TlsKey::Credential("tls-key".into())
            }
        );
        let c = VerifierConfig::parse(
            Path::new("v.toml"),
            &GOOD.replace(
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 0.01\nmax_clock_skew = \"2 min\"",
            ),
        )
        .unwrap();
        assert_eq!(c.policy.max_clock_skew, Duration::from_secs(120));
    }

    #[test]
    fn taps_policy_parses_and_leaves_old_digests_alone() {
        let plain = VerifierConfig::parse(Path::new("v.toml"), GOOD).unwrap();
        assert_eq!(plain.policy.taps, TapsPolicy::default());
        let with = |table: &str| {
            VerifierConfig::parse(
                Path::new("v.toml"),
                &GOOD.replace(
                    "min_root_of_trust = \"none\"",
                    &format!("min_root_of_trust = \"none\"\n[policy.taps]\n{table}"),
                ),
            )
            .unwrap()
            .policy
        };
        let t = with("required = true\nmax_unaccounted = \"64 KiB\"\n");
        assert_eq!(
            t.taps,
            TapsPolicy {
                required: true,
                max_unaccounted_bytes: 64 << 10,
                ..TapsPolicy::default()
            }
        );
        assert_ne!(t.digest(), plain.policy.digest());
        // At its defaults, written out or not, the table is not in the digest: verdicts
        // stored before it existed recheck under the same policy.
        let defaults = with("required = false\nmax_unaccounted = \"0 B\"\n");
        assert_eq!(defaults.taps, TapsPolicy::default());
        assert_eq!(defaults.digest(), plain.policy.digest());
        assert!(
            !String::from_utf8(serde_json::to_vec(&plain.policy).unwrap())
                .unwrap()
                .contains("taps")
        );
        assert_eq!(with("").taps, TapsPolicy::default());
    }

    #[test]
    fn the_log_key_lies_beside_the_database_and_the_origin_names_the_listener() {
        let c = VerifierConfig::parse(Path::new("v.toml"), GOOD).unwrap();
        assert_eq!(c.log_key, PathBuf::from("/tmp/tlog.key"));
        assert_eq!(c.log_origin, "rackwarden-verifier/127.0.0.1");
        let c = VerifierConfig::parse(
            Path::new("v.toml"),
            &GOOD.replace(
                "database = \"/tmp/v.sqlite\"",
                "database = \"/tmp/v.sqlite\"\nlog_key = \"/k/log.key\"\nlog_origin = \"v.example/log\"",
            ),
        )
        .unwrap();
        assert_eq!(c.log_key, PathBuf::from("/k/log.key"));
        assert_eq!(c.log_origin, "v.example/log");
        let e = VerifierConfig::parse(
            Path::new("v.toml"),
            &GOOD.replace(
                "database = \"/tmp/v.sqlite\"",
                "database = \"postgres://rw:pw@db/v\"",
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("v.toml:3: `log_key`: required with a PostgreSQL"),
            "{e}"
        );
        let e = VerifierConfig::parse(
            Path::new("v.toml"),
            &GOOD.replace(
                "database = \"/tmp/v.sqlite\"",
                "database = \"/tmp/v.sqlite\"\nlog_origin = \"two words\"",
            ),
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("v.toml:4: `log_origin`"), "{e}");
    }

    #[test]
    fn errors_name_file_line_and_key() {
        for (from, to, want) in [
            (
                "listen = \"127.0.0.1:7700\"",
                "listen = \"nowhere\"",
                "v.toml:1: `listen`",
            ),
            (
                "nonce_ttl = \"10 min\"",
                "nonce_ttl = \"10 eons\"",
                "v.toml:7: `policy.nonce_ttl`",
            ),
            (
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 2.0",
                "v.toml:12: `policy.max_epoch_fraction`",
            ),
            (
                "egress = \"10 MB/s\"",
                "egress = \"0 MB/s\"",
                "v.toml:16: `racks.r1.egress` must be above zero",
            ),
            (
                "id = \"p\"",
                "id = \"p\"\ncolour = 1",
                "v.toml:7: unknown field `colour`",
            ),
            (
                "database = \"/tmp/v.sqlite\"",
                "database = \"/tmp/v.sqlite\"\nmax_connections = 0",
                "v.toml:4: `max_connections` must be between 1 and 65536",
            ),
            (
                "database = \"/tmp/v.sqlite\"",
                "database = \"/tmp/v.sqlite\"\nheader_timeout = \"5 fortnights\"",
                "v.toml:4: `header_timeout`",
            ),
            (
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 0.01\nrequired_wipe_backends = [\"host\", \"tape\"]",
                "v.toml:13: `policy.required_wipe_backends`: unknown backend `tape`",
            ),
            (
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 0.01\naccepted_daemon_digests = [\"abc\"]",
                "v.toml:13: `policy.accepted_daemon_digests`: `abc` is not 64 lowercase hex digits",
            ),
            (
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 0.01\naccepted_program_tags = [\"FE60982FE492CB35\"]",
                "v.toml:13: `policy.accepted_program_tags`",
            ),
            (
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 0.01\nmin_self_protection = \"sealed\"",
                "v.toml:13: `policy.min_self_protection`: unknown level `sealed`",
            ),
            (
                "ingress = \"10 MB/s\"",
                "ingress = \"10 MB/s\"\nburst = \"lots\"",
                "v.toml:18: `racks.r1.burst`",
            ),
            (
                "insecure_http = true",
                "insecure_http = false",
                "v.toml:1: `listen` on 127.0.0.1:7700 needs `tls_cert` and `tls_key`",
            ),
            (
                "listen = \"127.0.0.1:7700\"",
                "listen = \"10.1.2.3:7700\"",
                "v.toml:2: `insecure_http = true` is refused on 10.1.2.3:7700",
            ),
            (
                "insecure_http = true",
                "tls_cert = \"/etc/c.pem\"",
                "v.toml:2: `tls_cert` needs `tls_key`",
            ),
            (
                "insecure_http = true",
                "insecure_http = true\ntls_cert = \"/c\"\ntls_key = \"/k\"",
                "v.toml:2: `insecure_http = true` and `tls_cert`/`tls_key` together",
            ),
            (
                "insecure_http = true",
                "tls_cert = \"/c\"\ntls_key = \"credential:../k\"",
                "v.toml:3: `tls_key`: `../k` is not a credential name",
            ),
            (
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 0.01\nmax_clock_skew = \"a while\"",
                "v.toml:13: `policy.max_clock_skew`",
            ),
            (
                "max_epoch_fraction = 0.01",
                "max_epoch_fraction = 0.01\nreference_bandwidth = \"fast\"",
                "v.toml:13: `policy.reference_bandwidth`",
            ),
            (
                "min_root_of_trust = \"none\"",
                "min_root_of_trust = \"none\"\n[policy.taps]\nrequired = true\nmax_unaccounted = \"a few\"",
                "v.toml:16: `policy.taps.max_unaccounted`",
            ),
            (
                "min_root_of_trust = \"none\"",
                "min_root_of_trust = \"none\"\n[policy.taps]\nrequried = true",
                "v.toml:15: unknown field `requried`",
            ),
        ] {
            let e = VerifierConfig::parse(Path::new("v.toml"), &GOOD.replace(from, to))
                .unwrap_err()
                .to_string();
            assert!(e.starts_with(want), "{to}: got `{e}`, want `{want}`");
        }
    }
}
