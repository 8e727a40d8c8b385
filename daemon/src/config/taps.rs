//! `[taps]`: every frame the policer passes is copied to the daemon, which commits each
//! epoch's traffic as records (`crate::taps`).
//!
//! ```toml
//! [taps]
//! inference = ["tcp:8000"]          # endpoints split into HTTP/1.1 exchanges; the rest is raw flows
//! spool_limit = "2 GiB"             # the most the spool of unopened records may hold
//! ```
//!
//! Without the section the plain policer runs and nothing is tapped.

use serde::Deserialize;
use toml::Spanned;

use super::{ConfigError, epoch::Err};
use crate::units;

/// A local endpoint whose connections are split into HTTP/1.1 request/response exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct InferenceEndpoint {
    /// The host's own TCP port (the server side of the connection).
    pub tcp_port: u16,
}

/// The default spool bound: about 2 GiB, 100 s of a 10 MB/s cap in each direction.
pub const DEFAULT_SPOOL_LIMIT: u64 = 2 << 30;

/// `[taps]`, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Taps {
    /// No `[taps]`: the plain policer, nothing recorded.
    Off,
    On(TapsConfig),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TapsConfig {
    pub inference: Vec<InferenceEndpoint>,
    /// Bytes the spool of records may hold before the daemon stops passing traffic (the
    /// tap then drops: fail closed).
    pub spool_limit: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTaps {
    inference: Option<Spanned<Vec<Spanned<String>>>>,
    spool_limit: Option<Spanned<String>>,
}

pub(super) fn validate(err: Err, raw: Option<RawTaps>) -> Result<Taps, ConfigError> {
    let Some(raw) = raw else {
        return Ok(Taps::Off);
    };
    let mut inference = Vec::new();
    if let Some(list) = &raw.inference {
        for e in list.get_ref() {
            let ep = endpoint(e.get_ref()).map_err(|m| {
                err(
                    Some(e.span()),
                    format!("`taps.inference`: `{}` {m}", e.get_ref()),
                )
            })?;
            if inference.contains(&ep) {
                return Err(err(
                    Some(e.span()),
                    format!("`taps.inference`: `{}` is listed twice", e.get_ref()),
                ));
            }
            inference.push(ep);
        }
    }
    let spool_limit = match &raw.spool_limit {
        None => DEFAULT_SPOOL_LIMIT,
        Some(s) => {
            let n = units::parse_size(s.get_ref())
                .map_err(|e| err(Some(s.span()), format!("`taps.spool_limit`: {e}")))?;
            if n < 1 << 20 {
                return Err(err(
                    Some(s.span()),
                    "`taps.spool_limit` must be at least 1 MiB".into(),
                ));
            }
            n
        }
    };
    Ok(Taps::On(TapsConfig {
        inference,
        spool_limit,
    }))
}

/// `tcp:PORT`: the only transport HTTP/1.1 exchanges are split on.
fn endpoint(s: &str) -> Result<InferenceEndpoint, String> {
    let Some(port) = s.strip_prefix("tcp:") else {
        return Err("must be `tcp:PORT` (for example \"tcp:8000\")".into());
    };
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(InferenceEndpoint { tcp_port: p }),
        _ => Err(format!("has no valid port (`{port}`: 1 to 65535)")),
    }
}

#[cfg(test)]
mod tests {
    use super::endpoint;

    #[test]
    fn endpoints_are_tcp_ports() {
        assert_eq!(endpoint("tcp:8000").map(|e| e.tcp_port), Ok(8000));
        assert!(endpoint("udp:53").unwrap_err().contains("tcp:PORT"));
        assert!(endpoint("tcp:0").unwrap_err().contains("1 to 65535"));
        assert!(endpoint("tcp:70000").unwrap_err().contains("70000"));
    }
}
