//! The epoch loop's sections of `rackwarden.toml`: `[epoch]`, `[verifier]`, `[wipe]`,
//! `[images]` and `[workloads]`. Without `[epoch]` the daemon only enforces the caps; with it,
//! it also runs an epoch (challenge, drain, wipe, stage, sign, deliver) every `wipe_interval`.
//!
//! ```toml
//! [epoch]
//! wipe_interval = "15 min"
//! challenge_timeout = "10 s"       # then the epoch goes on, marked `unchallenged`
//! signing_key = "/etc/rackwarden/keys/host.key"
//!
//! [verifier]
//! url = "https://verifier.example:7700"
//! fallback_urls = ["https://verifier-2.example:7700"]  # other instances on the same database
//! ca = "/etc/rackwarden/verifier-ca.pem"  # trust this CA for the verifier's certificate, or
//! # pinned_cert = "/etc/rackwarden/verifier.pem"  # accept exactly this certificate
//! # (http:// only to a loopback address, with neither)
//! request_timeout = "10 s"
//! retry_max = "15 s"               # ceiling of the delivery backoff
//! # The verifier's transparency log key (its `tlog.vkey`): a C2SP vkey, or an absolute path
//! # to a file holding one. With it, each acknowledged statement's inclusion proof and each
//! # new checkpoint's consistency with the last are checked (see `epoch::tlog`).
//! # log_key = "/etc/rackwarden/verifier-tlog.vkey"
//!
//! [wipe]
//! backends = ["host", "gpu"]       # host, gpu, scratch
//! max_bytes = "64 GiB"             # per device (default: all that is safe)
//! reserve = "1 GiB"                # host memory left untouched
//! scratch = ["/var/lib/inference/scratch"]
//! swap = "off"                     # turn swap off before each wipe (default "on": residue)
//! erase = [{ device = "/dev/nvme1n1", mount = "/srv/scratch" }]  # erased by key each epoch
//!
//! [images]
//! manifest = "/etc/rackwarden/manifest.dsse.json"
//! manifest_key = "/etc/rackwarden/keys/verifier.pub"
//! source = "/srv/models"
//! staging = "/var/lib/rackwarden/images"
//!
//! [workloads]
//! units = ["inference.service"]    # systemd units stopped before and started after a wipe
//! # or: stop_command = ["/usr/local/bin/drain"], start_command = ["/usr/local/bin/serve"]
//! stop_timeout = "2 min"
//! ```

use std::{ops::Range, path::PathBuf, time::Duration};

use serde::Deserialize;
use toml::Spanned;

use super::ConfigError;
use crate::{units, wipe::Backend};

/// `verifier.request_timeout` unless set.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// `verifier.retry_max` unless set: the ceiling of the delivery backoff. A verifier back
/// after an outage of any length gets the backlog within this plus one request timeout
/// (25 s with the defaults); a longer ceiling saves nothing worth the wait (a refused
/// connection costs the verifier nothing, and `Retry-After` still slows us when it asks).
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(15);

/// Everything the epoch loop needs, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct EpochConfig {
    pub wipe_interval: Duration,
    pub challenge_timeout: Duration,
    pub signing_key: PathBuf,
    pub verifier: VerifierEndpoint,
    pub wipe: WipePlan,
    pub images: Option<ImagePlan>,
    pub workloads: Workloads,
}

#[derive(Debug, Clone, PartialEq)]
pub struct VerifierEndpoint {
    /// Base URL without a trailing slash, e.g. `https://verifier.example:7700`.
    pub url: String,
    /// Other instances of the same verifier (one database), tried in order when the one in
    /// use fails; same scheme and trust as `url`.
    pub fallback_urls: Vec<String>,
    /// How the verifier's certificate is checked.
    pub trust: VerifierTrust,
    pub request_timeout: Duration,
    /// Ceiling of the exponential delivery backoff.
    pub retry_max: Duration,
    /// The verifier's transparency log key (`None`: log entries are kept, not checked).
    pub log_key: Option<rackwarden_attest::tlog::note::NoteVerifier>,
}

impl VerifierEndpoint {
    /// Every instance, `url` first.
    pub fn urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(self.fallback_urls.iter().map(String::as_str))
    }
}

/// How the daemon knows it talks to its verifier. The certificates are read when the
/// config is (a reload picks up a rotated file).
#[derive(Debug, Clone, PartialEq)]
pub enum VerifierTrust {
    /// `http://` to a loopback address: nothing leaves the host, nothing to check.
    PlainLoopback,
    /// The verifier's chain must lead to one of these CA certificates (DER), for the URL's
    /// host name.
    Ca { path: PathBuf, certs: Vec<Vec<u8>> },
    /// The verifier must present exactly this certificate (DER); names and dates are not
    /// checked, the pin is the trust decision.
    Pinned { path: PathBuf, cert: Vec<u8> },
}

#[derive(Debug, Clone, PartialEq)]
pub struct WipePlan {
    pub backends: Vec<Backend>,
    pub max_bytes: Option<u64>,
    pub reserve_bytes: u64,
    pub scratch: Vec<PathBuf>,
    pub swap: SwapPolicy,
    /// Scratch volumes erased by key at every wipe.
    pub erase: Vec<crate::storage::erase::EraseVolume>,
}

/// `wipe.swap`: what happens to swap at a wipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SwapPolicy {
    /// `"on"` (the default): swap stays on, and every area is residue in the statement.
    #[default]
    On,
    /// `"off"`: every swap area is turned off before the wipe, and the statement says so.
    Off,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ImagePlan {
    pub manifest: PathBuf,
    pub manifest_key: PathBuf,
    pub source: PathBuf,
    pub staging: PathBuf,
}

/// How the inference workloads are stopped before a wipe and started after it.
#[derive(Debug, Clone, PartialEq)]
pub enum Workloads {
    NoneConfigured,
    /// systemd units, stopped and started with `systemctl`.
    Units {
        units: Vec<String>,
        stop_timeout: Duration,
    },
    /// Commands (argv) run to completion; a non-zero exit is a failure.
    Commands {
        stop: Vec<String>,
        start: Vec<String>,
        stop_timeout: Duration,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEpoch {
    wipe_interval: Spanned<String>,
    challenge_timeout: Option<Spanned<String>>,
    signing_key: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVerifier {
    url: Spanned<String>,
    fallback_urls: Option<Vec<Spanned<String>>>,
    ca: Option<Spanned<String>>,
    pinned_cert: Option<Spanned<String>>,
    request_timeout: Option<Spanned<String>>,
    retry_max: Option<Spanned<String>>,
    log_key: Option<Spanned<String>>,
}

/// The PEM certificates in the file a key names (at least one).
fn certificates(err: Err, key: &str, s: &Spanned<String>) -> Result<Vec<Vec<u8>>, ConfigError> {
    use rustls::pki_types::{CertificateDer, pem::PemObject};
    let p = path(err, key, s)?;
    let certs: Vec<Vec<u8>> = CertificateDer::pem_file_iter(&p)
        .and_then(|it| it.map(|c| c.map(|c| c.to_vec())).collect())
        .map_err(|e| err(Some(s.span()), format!("`{key}`: {}: {e}", p.display())))?;
    if certs.is_empty() {
        return Err(err(
            Some(s.span()),
            format!("`{key}`: {} holds no PEM certificate", p.display()),
        ));
    }
    Ok(certs)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWipe {
    backends: Option<Spanned<Vec<Spanned<String>>>>,
    max_bytes: Option<Spanned<String>>,
    reserve: Option<Spanned<String>>,
    scratch: Option<Vec<Spanned<String>>>,
    swap: Option<Spanned<String>>,
    erase: Option<Vec<Spanned<RawEraseVolume>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawEraseVolume {
    device: Spanned<String>,
    mount: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawImages {
    manifest: Spanned<String>,
    manifest_key: Spanned<String>,
    source: Spanned<String>,
    staging: Spanned<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorkloads {
    units: Option<Spanned<Vec<Spanned<String>>>>,
    stop_command: Option<Spanned<Vec<String>>>,
    start_command: Option<Spanned<Vec<String>>>,
    stop_timeout: Option<Spanned<String>>,
}

/// The raw sections as they came out of the file.
pub(super) struct RawSections {
    pub epoch: Option<Spanned<RawEpoch>>,
    pub verifier: Option<Spanned<RawVerifier>>,
    pub wipe: Option<Spanned<RawWipe>>,
    pub images: Option<Spanned<RawImages>>,
    pub workloads: Option<Spanned<RawWorkloads>>,
}

pub(super) type Err<'a> = &'a dyn Fn(Option<Range<usize>>, String) -> ConfigError;

fn duration(
    err: Err,
    key: &str,
    v: &Option<Spanned<String>>,
    default: Duration,
    min: Duration,
    max: Duration,
) -> Result<Duration, ConfigError> {
    let Some(s) = v else { return Ok(default) };
    let d = units::parse_duration(s.get_ref())
        .map_err(|e| err(Some(s.span()), format!("`{key}`: {e}")))?;
    if d < min || d > max {
        return Err(err(
            Some(s.span()),
            format!(
                "`{key}` must be between {} and {} (it is {})",
                units::fmt_duration(min),
                units::fmt_duration(max),
                units::fmt_duration(d)
            ),
        ));
    }
    Ok(d)
}

fn path(err: Err, key: &str, s: &Spanned<String>) -> Result<PathBuf, ConfigError> {
    let p = PathBuf::from(s.get_ref());
    if !p.is_absolute() {
        return Err(err(
            Some(s.span()),
            format!("`{key}` must be an absolute path (it is `{}`)", s.get_ref()),
        ));
    }
    Ok(p)
}

pub(super) fn validate(err: Err, raw: RawSections) -> Result<Option<EpochConfig>, ConfigError> {
    let Some(epoch) = raw.epoch else {
        no_epoch_sections(err, &raw)?;
        return Ok(None);
    };
    let epoch_span = epoch.span();
    let e = epoch.into_inner();
    let wipe_interval = duration(
        err,
        "epoch.wipe_interval",
        &Some(e.wipe_interval),
        Duration::ZERO,
        Duration::from_secs(1),
        Duration::from_secs(7 * 86_400),
    )?;
    let challenge_timeout = duration(
        err,
        "epoch.challenge_timeout",
        &e.challenge_timeout,
        Duration::from_secs(10),
        Duration::from_millis(100),
        Duration::from_secs(600),
    )?;
    let signing_key = path(err, "epoch.signing_key", &e.signing_key)?;
    let Some(v) = raw.verifier else {
        return Err(err(
            Some(epoch_span),
            "`[epoch]` needs a `[verifier]` section with `url` (where challenges come from and statements go)".into(),
        ));
    };
    Ok(Some(EpochConfig {
        wipe_interval,
        challenge_timeout,
        signing_key,
        verifier: verifier(err, v.into_inner())?,
        wipe: wipe_plan(err, raw.wipe.map(Spanned::into_inner))?,
        images: image_plan(err, raw.images.map(Spanned::into_inner))?,
        workloads: workloads(err, raw.workloads)?,
    }))
}

/// Without `[epoch]`, the loop's other sections mean nothing: say so rather than ignore them.
fn no_epoch_sections(err: Err, raw: &RawSections) -> Result<(), ConfigError> {
    for (name, span) in [
        ("verifier", raw.verifier.as_ref().map(|s| s.span())),
        ("wipe", raw.wipe.as_ref().map(|s| s.span())),
        ("images", raw.images.as_ref().map(|s| s.span())),
        ("workloads", raw.workloads.as_ref().map(|s| s.span())),
    ] {
        if let Some(span) = span {
            return Err(err(
                Some(span),
                format!(
                    "`[{name}]` is used only by the epoch loop: add an `[epoch]` section (wipe_interval, signing_key)"
                ),
            ));
        }
    }
    Ok(())
}

/// `[verifier]`: a URL with no path, how its certificate is trusted, and the timeouts.
fn verifier(err: Err, v: RawVerifier) -> Result<VerifierEndpoint, ConfigError> {
    let (url, parsed) = base_url(err, "verifier.url", &v.url)?;
    let trust = verifier_trust(err, &v, &parsed, &url)?;
    let mut fallback_urls = Vec::new();
    for f in v.fallback_urls.iter().flatten() {
        let (u, p) = base_url(err, "verifier.fallback_urls", f)?;
        // One trust for all instances: the same scheme, and plain http only to loopback.
        if p.scheme() != parsed.scheme() || (p.scheme() == "http" && !is_loopback(&p)) {
            return Err(err(
                Some(f.span()),
                format!(
                    "`verifier.fallback_urls`: `{u}` must be {}:// like `verifier.url`{}",
                    parsed.scheme(),
                    if p.scheme() == "http" {
                        ", to a loopback address"
                    } else {
                        ""
                    }
                ),
            ));
        }
        if u == url || fallback_urls.contains(&u) {
            return Err(err(
                Some(f.span()),
                format!("`verifier.fallback_urls`: `{u}` is listed twice"),
            ));
        }
        fallback_urls.push(u);
    }
    let log_key = match &v.log_key {
        None => None,
        Some(k) => {
            let text = k.get_ref();
            if text.starts_with('/') {
                path(err, "verifier.log_key", k)?;
            }
            Some(
                rackwarden_attest::tlog::audit::load_log_key(text)
                    .map_err(|e| err(Some(k.span()), format!("`verifier.log_key`: {e}")))?,
            )
        }
    };
    Ok(VerifierEndpoint {
        log_key,
        url,
        fallback_urls,
        trust,
        request_timeout: duration(
            err,
            "verifier.request_timeout",
            &v.request_timeout,
            DEFAULT_REQUEST_TIMEOUT,
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?,
        retry_max: duration(
            err,
            "verifier.retry_max",
            &v.retry_max,
            DEFAULT_RETRY_MAX,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?,
    })
}

/// A verifier's base URL: trimmed of a trailing slash, with a host and no path.
fn base_url(
    err: Err,
    key: &str,
    s: &Spanned<String>,
) -> Result<(String, reqwest::Url), ConfigError> {
    let url = s.get_ref().trim().trim_end_matches('/').to_string();
    let parsed = reqwest::Url::parse(&url)
        .map_err(|x| err(Some(s.span()), format!("`{key}`: `{url}`: {x}")))?;
    if parsed.host_str().is_none_or(str::is_empty) || parsed.path() != "/" {
        return Err(err(
            Some(s.span()),
            format!(
                "`{key}`: `{url}` must be {}://HOST[:PORT] with no path",
                parsed.scheme()
            ),
        ));
    }
    Ok((url, parsed))
}

fn is_loopback(u: &reqwest::Url) -> bool {
    match u.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    }
}

/// https with exactly one of `ca` and `pinned_cert`, or plain http to a loopback address.
fn verifier_trust(
    err: Err,
    v: &RawVerifier,
    parsed: &reqwest::Url,
    url: &str,
) -> Result<VerifierTrust, ConfigError> {
    Ok(match (parsed.scheme(), &v.ca, &v.pinned_cert) {
        ("https", Some(c), None) => VerifierTrust::Ca {
            path: path(err, "verifier.ca", c)?,
            certs: certificates(err, "verifier.ca", c)?,
        },
        ("https", None, Some(c)) => {
            let mut certs = certificates(err, "verifier.pinned_cert", c)?;
            if certs.len() != 1 {
                return Err(err(
                    Some(c.span()),
                    format!(
                        "`verifier.pinned_cert`: holds {} certificates; pin exactly one (the verifier's own)",
                        certs.len()
                    ),
                ));
            }
            VerifierTrust::Pinned {
                path: path(err, "verifier.pinned_cert", c)?,
                cert: certs.remove(0),
            }
        }
        ("https", Some(_), Some(p)) => {
            return Err(err(
                Some(p.span()),
                "`verifier.ca` and `verifier.pinned_cert` together: choose one".into(),
            ));
        }
        ("https", None, None) => {
            return Err(err(
                Some(v.url.span()),
                "`verifier.url` is https: set `verifier.ca` (the CA that signed the verifier's certificate) or `verifier.pinned_cert` (the certificate itself)".into(),
            ));
        }
        ("http", ca, pin) => {
            if let Some(k) = ca.as_ref().or(pin.as_ref()) {
                return Err(err(
                    Some(k.span()),
                    "`verifier.ca`/`verifier.pinned_cert` need an https:// `verifier.url`".into(),
                ));
            }
            if !is_loopback(parsed) {
                return Err(err(
                    Some(v.url.span()),
                    format!(
                        "`verifier.url`: `{url}` is plain http to another host: use https:// with `verifier.ca` or `verifier.pinned_cert` (http only to a loopback address)"
                    ),
                ));
            }
            VerifierTrust::PlainLoopback
        }
        (other, _, _) => {
            return Err(err(
                Some(v.url.span()),
                format!("`verifier.url`: scheme `{other}` is not supported (use https://)"),
            ));
        }
    })
}

/// `[wipe]`, or host and GPU with a 1 GiB reserve when it is absent.
fn wipe_plan(err: Err, w: Option<RawWipe>) -> Result<WipePlan, ConfigError> {
    let Some(w) = w else {
        return Ok(WipePlan {
            backends: vec![Backend::Host, Backend::Gpu],
            max_bytes: None,
            reserve_bytes: 1 << 30,
            scratch: vec![],
            swap: SwapPolicy::On,
            erase: vec![],
        });
    };
    let backends = match &w.backends {
        None => vec![Backend::Host, Backend::Gpu],
        Some(list) => wipe_backends(err, list)?,
    };
    let size = |key: &str, v: &Spanned<String>| {
        units::parse_size(v.get_ref()).map_err(|x| err(Some(v.span()), format!("`{key}`: {x}")))
    };
    let max_bytes = w
        .max_bytes
        .as_ref()
        .map(|v| size("wipe.max_bytes", v))
        .transpose()?;
    if let (Some(0), Some(v)) = (max_bytes, &w.max_bytes) {
        return Err(err(
            Some(v.span()),
            "`wipe.max_bytes` must be above zero".into(),
        ));
    }
    let reserve_bytes = match &w.reserve {
        None => 1 << 30,
        Some(v) => size("wipe.reserve", v)?,
    };
    let mut scratch = Vec::new();
    for s in w.scratch.iter().flatten() {
        scratch.push(path(err, "wipe.scratch", s)?);
    }
    if backends.contains(&Backend::Scratch) && scratch.is_empty() {
        let span = w.backends.as_ref().map(|b| b.span());
        return Err(err(
            span,
            "`wipe.backends` names `scratch` but `wipe.scratch` lists no directory".into(),
        ));
    }
    let swap = match &w.swap {
        None => SwapPolicy::On,
        Some(v) => match v.get_ref().as_str() {
            "on" => SwapPolicy::On,
            "off" => SwapPolicy::Off,
            other => {
                return Err(err(
                    Some(v.span()),
                    format!("`wipe.swap`: `{other}` is neither \"on\" nor \"off\""),
                ));
            }
        },
    };
    let mut erase: Vec<crate::storage::erase::EraseVolume> = Vec::new();
    for v in w.erase.iter().flatten() {
        let raw = v.get_ref();
        let device = path(err, "wipe.erase.device", &raw.device)?;
        if !device.is_absolute() || !device.starts_with("/dev") {
            return Err(err(
                Some(raw.device.span()),
                format!(
                    "`wipe.erase.device`: `{}` is not a device under /dev",
                    device.display()
                ),
            ));
        }
        let mount = raw
            .mount
            .as_ref()
            .map(|m| path(err, "wipe.erase.mount", m))
            .transpose()?;
        if erase.iter().any(|e| e.device == device) {
            return Err(err(
                Some(raw.device.span()),
                format!("`wipe.erase`: {} is listed twice", device.display()),
            ));
        }
        erase.push(crate::storage::erase::EraseVolume { device, mount });
    }
    Ok(WipePlan {
        backends,
        max_bytes,
        reserve_bytes,
        scratch,
        swap,
        erase,
    })
}

/// `wipe.backends`: at least one, each known and listed once.
fn wipe_backends(
    err: Err,
    list: &Spanned<Vec<Spanned<String>>>,
) -> Result<Vec<Backend>, ConfigError> {
    let mut backends = Vec::new();
    for b in list.get_ref() {
        let parsed = match b.get_ref().as_str() {
            "host" => Backend::Host,
            "gpu" => Backend::Gpu,
            "scratch" => Backend::Scratch,
            other => {
                return Err(err(
                    Some(b.span()),
                    format!("`wipe.backends`: unknown backend `{other}` (use host, gpu, scratch)"),
                ));
            }
        };
        if backends.contains(&parsed) {
            return Err(err(
                Some(b.span()),
                format!("`wipe.backends`: `{}` is listed twice", b.get_ref()),
            ));
        }
        backends.push(parsed);
    }
    if backends.is_empty() {
        return Err(err(
            Some(list.span()),
            "`wipe.backends` must name at least one backend: an epoch without a wipe proves nothing".into(),
        ));
    }
    Ok(backends)
}

fn image_plan(err: Err, i: Option<RawImages>) -> Result<Option<ImagePlan>, ConfigError> {
    let Some(i) = i else { return Ok(None) };
    Ok(Some(ImagePlan {
        manifest: path(err, "images.manifest", &i.manifest)?,
        manifest_key: path(err, "images.manifest_key", &i.manifest_key)?,
        source: path(err, "images.source", &i.source)?,
        staging: path(err, "images.staging", &i.staging)?,
    }))
}

/// `[workloads]`: systemd units, or a stop and a start command; nothing when absent.
fn workloads(err: Err, w: Option<Spanned<RawWorkloads>>) -> Result<Workloads, ConfigError> {
    let Some(w) = w else {
        return Ok(Workloads::NoneConfigured);
    };
    let span = w.span();
    let w = w.into_inner();
    let stop_timeout = duration(
        err,
        "workloads.stop_timeout",
        &w.stop_timeout,
        Duration::from_secs(120),
        Duration::from_secs(1),
        Duration::from_secs(3600),
    )?;
    match (w.units, w.stop_command, w.start_command) {
        (Some(u), None, None) => Ok(Workloads::Units {
            units: unit_names(err, &u)?,
            stop_timeout,
        }),
        (None, Some(stop), Some(start)) => {
            for (key, c) in [
                ("workloads.stop_command", &stop),
                ("workloads.start_command", &start),
            ] {
                if c.get_ref().is_empty() || !c.get_ref()[0].starts_with('/') {
                    return Err(err(
                        Some(c.span()),
                        format!("`{key}` must be an argv list starting with an absolute path"),
                    ));
                }
            }
            Ok(Workloads::Commands {
                stop: stop.into_inner(),
                start: start.into_inner(),
                stop_timeout,
            })
        }
        _ => Err(err(
            Some(span),
            "`[workloads]` takes either `units` or both `stop_command` and `start_command`".into(),
        )),
    }
}

/// `workloads.units`: at least one, each a plausible unit name.
fn unit_names(err: Err, u: &Spanned<Vec<Spanned<String>>>) -> Result<Vec<String>, ConfigError> {
    let mut units = Vec::new();
    for n in u.get_ref() {
        let name = n.get_ref();
        if name.is_empty() || name.starts_with('-') || name.contains(char::is_whitespace) {
            return Err(err(
                Some(n.span()),
                format!("`workloads.units`: `{name}` is not a unit name"),
            ));
        }
        units.push(name.clone());
    }
    if units.is_empty() {
        return Err(err(
            Some(u.span()),
            "`workloads.units` is empty: leave out `[workloads]` when nothing is to be drained"
                .into(),
        ));
    }
    Ok(units)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    const BASE: &str = r#"rack_id = "rack-a17"
host_id = "host-03"
host_share = 1.0
interfaces = ["eth0"]

[cap]
egress = "10 MB/s"
ingress = "10 MB/s"
burst = "256 KiB"
"#;

    const EPOCH: &str = r#"
[epoch]
wipe_interval = "15 min"
signing_key = "/etc/rackwarden/keys/host.key"

[verifier]
url = "http://127.0.0.1:7700/"

[wipe]
backends = ["host", "scratch"]
max_bytes = "68719476736"
scratch = ["/scratch"]

[images]
manifest = "/etc/rackwarden/m.dsse.json"
manifest_key = "/etc/rackwarden/keys/verifier.pub"
source = "/srv/models"
staging = "/var/lib/rackwarden/images"

[workloads]
units = ["vllm.service", "router.service"]
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/rackwarden/rackwarden.toml"), text)
    }

    #[test]
    fn a_full_epoch_config_parses_with_units_and_defaults() {
        let c = parse(&format!("{BASE}{EPOCH}")).unwrap();
        let e = c.epoch.unwrap();
        assert_eq!(e.wipe_interval, Duration::from_secs(900));
        assert_eq!(e.challenge_timeout, Duration::from_secs(10));
        assert_eq!(e.verifier.url, "http://127.0.0.1:7700");
        assert_eq!(e.verifier.trust, VerifierTrust::PlainLoopback);
        assert_eq!(e.verifier.retry_max, DEFAULT_RETRY_MAX);
        assert_eq!(e.wipe.backends, [Backend::Host, Backend::Scratch]);
        assert_eq!(e.wipe.max_bytes, Some(64 << 30), "a bare number is bytes");
        assert_eq!(e.wipe.reserve_bytes, 1 << 30);
        assert_eq!(
            e.wipe.swap,
            SwapPolicy::On,
            "swap stays on (and is residue) by default"
        );
        assert!(e.wipe.erase.is_empty());
        assert!(matches!(e.workloads, Workloads::Units { ref units, .. } if units.len() == 2));
        assert!(e.images.is_some());
        assert!(
            parse(BASE).unwrap().epoch.is_none(),
            "no [epoch]: enforcement only"
        );
    }

    /// The issue: after an outage, the verifier must get the backlog within 30 s of coming
    /// back with the default settings. The worst case is a retry that was just scheduled
    /// (the whole ceiling) followed by one request that times out while it comes up.
    #[test]
    fn a_verifier_back_after_a_long_outage_is_reached_within_30_s_by_default() {
        let e = parse(&format!("{BASE}{EPOCH}")).unwrap().epoch.unwrap();
        for attempt in [1, 5, 10, 100, u32::MAX] {
            let worst = crate::epoch::delivery::backoff(attempt, e.verifier.retry_max)
                + e.verifier.request_timeout;
            assert!(
                worst <= Duration::from_secs(30),
                "attempt {attempt}: the next try may come {} after the verifier is back",
                units::fmt_duration(worst)
            );
        }
    }

    #[test]
    fn each_bad_epoch_case_names_key_and_line() {
        let full = format!("{BASE}{EPOCH}");
        let cases: &[(&str, &str, &str)] = &[
            (
                "wipe_interval = \"15 min\"",
                "wipe_interval = \"15 fortnights\"",
                "epoch.wipe_interval",
            ),
            (
                "wipe_interval = \"15 min\"",
                "wipe_interval = \"100 ms\"",
                "between 1 s",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"https://v:7700\"",
                "set `verifier.ca`",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"http://10.0.0.1:7700\"",
                "plain http to another host",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"https://v:7700\"\nca = \"/nonexistent/ca.pem\"",
                "`verifier.ca`: /nonexistent/ca.pem",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"http://127.0.0.1:7700\"\npinned_cert = \"/etc/v.pem\"",
                "need an https://",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"ftp://v:7700\"",
                "scheme `ftp`",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"http://v:7700/api\"",
                "no path",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"not a url\"",
                "verifier.url",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"http://127.0.0.1:7700/\"\nfallback_urls = [\"https://v2:7700\"]",
                "must be http:// like `verifier.url`",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"http://127.0.0.1:7700/\"\nfallback_urls = [\"http://10.0.0.2:7700\"]",
                "to a loopback address",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"http://127.0.0.1:7700/\"\nfallback_urls = [\"http://127.0.0.1:7700\"]",
                "is listed twice",
            ),
            (
                "url = \"http://127.0.0.1:7700/\"",
                "url = \"http://127.0.0.1:7700/\"\nfallback_urls = [\"http://127.0.0.1:7701/v1\"]",
                "`verifier.fallback_urls`: `http://127.0.0.1:7701/v1` must be http://HOST[:PORT] with no path",
            ),
            (
                "backends = [\"host\", \"scratch\"]",
                "backends = [\"host\", \"ram\"]",
                "unknown backend `ram`",
            ),
            (
                "backends = [\"host\", \"scratch\"]",
                "backends = []",
                "at least one backend",
            ),
            (
                "scratch = [\"/scratch\"]",
                "scratch = []",
                "lists no directory",
            ),
            (
                "max_bytes = \"68719476736\"",
                "max_bytes = \"0 B\"",
                "above zero",
            ),
            (
                "scratch = [\"/scratch\"]",
                "scratch = [\"/scratch\"]\nswap = \"sometimes\"",
                "`wipe.swap`: `sometimes` is neither",
            ),
            (
                "scratch = [\"/scratch\"]",
                "scratch = [\"/scratch\"]\nerase = [{ device = \"/srv/disk.img\" }]",
                "not a device under /dev",
            ),
            (
                "scratch = [\"/scratch\"]",
                "scratch = [\"/scratch\"]\nerase = [{ device = \"/dev/vdb\" }, { device = \"/dev/vdb\" }]",
                "/dev/vdb is listed twice",
            ),
            (
                "scratch = [\"/scratch\"]",
                "scratch = [\"/scratch\"]\nerase = [{ device = \"/dev/vdb\", mount = \"scratch\" }]",
                "wipe.erase.mount` must be an absolute path",
            ),
            (
                "source = \"/srv/models\"",
                "source = \"models\"",
                "images.source` must be an absolute path",
            ),
            (
                "units = [\"vllm.service\", \"router.service\"]",
                "units = []",
                "workloads.units` is empty",
            ),
            (
                "units = [\"vllm.service\", \"router.service\"]",
                "stop_command = [\"/bin/stop\"]",
                "either `units` or both",
            ),
            (
                "signing_key = \"/etc/rackwarden/keys/host.key\"",
                "signing_key = \"/k\"\ncolour = 1",
                "unknown field `colour`",
            ),
        ];
        for (from, to, want) in cases {
            assert!(full.contains(from), "{from}");
            let e = parse(&full.replace(from, to)).unwrap_err().to_string();
            assert!(
                e.starts_with("/etc/rackwarden/rackwarden.toml:") && e.contains(want),
                "case {to:?}: got `{e}`, want {want:?}"
            );
            // Every one names a line (a number after the file name).
            let line = e["/etc/rackwarden/rackwarden.toml:".len()..]
                .split(':')
                .next()
                .unwrap();
            assert!(
                line.parse::<usize>().unwrap() > 10,
                "case {to:?}: line {line}"
            );
        }
        // [epoch] without [verifier], and the loop's sections without [epoch].
        let no_verifier = full.replace("[verifier]\nurl = \"http://127.0.0.1:7700/\"\n", "");
        assert!(
            parse(&no_verifier)
                .unwrap_err()
                .to_string()
                .contains("needs a `[verifier]`")
        );
        let no_epoch = full.replace(
            "[epoch]\nwipe_interval = \"15 min\"\nsigning_key = \"/etc/rackwarden/keys/host.key\"\n",
            "",
        );
        assert!(
            parse(&no_epoch)
                .unwrap_err()
                .to_string()
                .contains("add an `[epoch]` section")
        );
        // A top-level key written below a table gets told why it is unknown there.
        let misplaced = format!("{BASE}pin_root = \"/sys/fs/bpf/x\"\n");
        assert!(
            parse(&misplaced)
                .unwrap_err()
                .to_string()
                .contains("top-level key")
        );
    }
}
