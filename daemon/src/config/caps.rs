//! The rack's caps as one validated value ([`Caps`]). The config's `[cap]` table and
//! `rackwarden cap set` go through the same parse and the same checks ([`rack_rate`],
//! [`Caps::with_rack_rates`]), so the daemon never runs a cap its config file would refuse.

use std::ops::Range;

use rackwarden_attest::evidence::Direction;
use serde::Deserialize;
use toml::Spanned;

use super::{
    ConfigError, DEFAULT_SMALL_MAX, DEFAULT_SMALL_RESERVE, MAX_BURST_BYTES, MIN_BURST_BYTES,
};
use crate::units::{self, UnitError};

/// The rack's caps and the bucket's shape, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Caps {
    pub rack_egress_bytes_per_s: u64,
    pub rack_ingress_bytes_per_s: u64,
    pub burst_bytes: u64,
    pub small_reserve_bytes: u64,
    pub small_max_len: u32,
    pub bytes_per_token: Option<u64>,
}

/// How one direction's cap is written into the limiter's config map on this host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSpec {
    pub rate_bytes_per_s: u64,
    pub burst_bytes: u64,
    /// Bytes of the bucket that only small packets may use.
    pub small_reserve_bytes: u64,
    /// Largest `skb->len` that counts as a small packet.
    pub small_max_len: u32,
}

/// A cap that does not pass; `key` is the config key it was written for.
#[derive(Debug, thiserror::Error)]
pub enum CapError {
    #[error("`{key}`: {source}")]
    Unit { key: String, source: UnitError },
    #[error("`{key}` must be above zero")]
    Zero { key: String },
    #[error("`{key}` x host_share rounds to zero bytes/s for this host")]
    ZeroForHost { key: String },
    #[error(
        "`cap.burst` must be at most {} (it is {}): the byte bound is burst + rate x time, and no rack agreement allows a bucket that deep",
        units::ByteSize(MAX_BURST_BYTES),
        units::ByteSize(*.burst)
    )]
    BurstTooDeep { burst: u64 },
    #[error("`cap.burst` must be at least {MIN_BURST_BYTES} bytes (one GSO packet); it is {burst}")]
    BurstTooShallow { burst: u64 },
    #[error(
        "`cap.small_packet_reserve` ({reserve} B) leaves less than {MIN_BURST_BYTES} B of `cap.burst` ({burst} B) for bulk packets"
    )]
    ReserveTooLarge { reserve: u64, burst: u64 },
    #[error("`cap.small_packet_max` must be between 64 B and 9000 B (it is {size})")]
    SmallMaxOutOfRange { size: u64 },
    #[error("`cap.bytes_per_token` must be positive (it is {value})")]
    BytesPerTokenNotPositive { value: i64 },
    #[error("give --egress and/or --ingress")]
    NoRateGiven,
}

/// A rack rate as written (`10 MB/s`, `200000 tokens/s`), in bytes per second, above zero.
pub fn rack_rate(key: &str, text: &str, bytes_per_token: Option<u64>) -> Result<u64, CapError> {
    let unit = |source| CapError::Unit {
        key: key.into(),
        source,
    };
    let bytes = units::parse_rate(text)
        .map_err(unit)?
        .bytes_per_sec(bytes_per_token)
        .map_err(unit)?;
    if bytes == 0 {
        return Err(CapError::Zero { key: key.into() });
    }
    Ok(bytes)
}

/// Refuses a rack rate whose share for this host rounds to nothing.
pub fn check_host_rate(key: &str, rack_bytes_per_s: u64, host_share: f64) -> Result<(), CapError> {
    if scale(rack_bytes_per_s, host_share) == 0 {
        return Err(CapError::ZeroForHost { key: key.into() });
    }
    Ok(())
}

/// A burst as written, within [`MIN_BURST_BYTES`, `MAX_BURST_BYTES`].
pub fn burst(text: &str) -> Result<u64, CapError> {
    let burst = units::parse_size(text).map_err(|source| CapError::Unit {
        key: "cap.burst".into(),
        source,
    })?;
    if burst > MAX_BURST_BYTES {
        return Err(CapError::BurstTooDeep { burst });
    }
    if burst < MIN_BURST_BYTES {
        return Err(CapError::BurstTooShallow { burst });
    }
    Ok(burst)
}

/// The small-packet reserve (default [`DEFAULT_SMALL_RESERVE`]): it must leave a GSO
/// packet's worth of `burst` to bulk packets.
pub fn small_reserve(text: Option<&str>, burst: u64) -> Result<u64, CapError> {
    let reserve = match text {
        None => DEFAULT_SMALL_RESERVE,
        Some(t) => units::parse_size(t).map_err(|source| CapError::Unit {
            key: "cap.small_packet_reserve".into(),
            source,
        })?,
    };
    if burst.saturating_sub(reserve) < MIN_BURST_BYTES || reserve > u32::MAX as u64 {
        return Err(CapError::ReserveTooLarge { reserve, burst });
    }
    Ok(reserve)
}

/// The largest small packet (default [`DEFAULT_SMALL_MAX`]), 64 B to 9000 B.
pub fn small_max(text: Option<&str>) -> Result<u32, CapError> {
    let Some(t) = text else {
        return Ok(DEFAULT_SMALL_MAX);
    };
    let size = units::parse_size(t).map_err(|source| CapError::Unit {
        key: "cap.small_packet_max".into(),
        source,
    })?;
    if !(64..=9000).contains(&size) {
        return Err(CapError::SmallMaxOutOfRange { size });
    }
    Ok(size as u32)
}

impl Caps {
    /// This host's cap in `dir`: the rack cap times the share, rounded down (never up).
    pub fn host_bytes_per_s(&self, dir: Direction, host_share: f64) -> u64 {
        scale(self.rack_bytes_per_s(dir), host_share)
    }

    pub fn rack_bytes_per_s(&self, dir: Direction) -> u64 {
        match dir {
            Direction::Egress => self.rack_egress_bytes_per_s,
            Direction::Ingress => self.rack_ingress_bytes_per_s,
        }
    }

    /// What the limiter enforces in `dir` on a host with `host_share` of the rack.
    pub fn spec(&self, dir: Direction, host_share: f64) -> CapSpec {
        CapSpec {
            rate_bytes_per_s: self.host_bytes_per_s(dir, host_share),
            burst_bytes: self.burst_bytes,
            small_reserve_bytes: self.small_reserve_bytes,
            small_max_len: self.small_max_len,
        }
    }

    /// These caps with new rack rates (`cap set`), written and checked like the config's.
    pub fn with_rack_rates(
        &self,
        egress: Option<&str>,
        ingress: Option<&str>,
        host_share: f64,
    ) -> Result<Caps, CapError> {
        if egress.is_none() && ingress.is_none() {
            return Err(CapError::NoRateGiven);
        }
        let mut next = self.clone();
        for (key, text, slot) in [
            ("cap.egress", egress, &mut next.rack_egress_bytes_per_s),
            ("cap.ingress", ingress, &mut next.rack_ingress_bytes_per_s),
        ] {
            if let Some(text) = text {
                let rate = rack_rate(key, text, self.bytes_per_token)?;
                check_host_rate(key, rate, host_share)?;
                *slot = rate;
            }
        }
        Ok(next)
    }
}

/// `rate x share`, floored: a host never gets more than its share.
pub(super) fn scale(rate: u64, share: f64) -> u64 {
    // f64 has 53 bits of mantissa: exact for any cap below 9 PB/s. Floor, never round up.
    (rate as f64 * share).floor() as u64
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCap {
    egress: Spanned<String>,
    ingress: Spanned<String>,
    burst: Spanned<String>,
    small_packet_reserve: Option<Spanned<String>>,
    small_packet_max: Option<Spanned<String>>,
    bytes_per_token: Option<Spanned<i64>>,
}

/// The `[cap]` table, validated for a host with `host_share`; each error names its key's line.
pub(super) fn parse_table(
    err: super::epoch::Err,
    cap: &RawCap,
    host_share: f64,
) -> Result<Caps, ConfigError> {
    let at = |span: Range<usize>| move |e: CapError| err(Some(span.clone()), e.to_string());
    let bytes_per_token = match &cap.bytes_per_token {
        None => None,
        Some(b) if *b.get_ref() <= 0 => {
            return Err(at(b.span())(CapError::BytesPerTokenNotPositive {
                value: *b.get_ref(),
            }));
        }
        Some(b) => Some(*b.get_ref() as u64),
    };
    let egress = rack_rate("cap.egress", cap.egress.get_ref(), bytes_per_token)
        .map_err(at(cap.egress.span()))?;
    let ingress = rack_rate("cap.ingress", cap.ingress.get_ref(), bytes_per_token)
        .map_err(at(cap.ingress.span()))?;
    check_host_rate("cap.egress", egress, host_share).map_err(at(cap.egress.span()))?;
    check_host_rate("cap.ingress", ingress, host_share).map_err(at(cap.ingress.span()))?;
    let burst_bytes = burst(cap.burst.get_ref()).map_err(at(cap.burst.span()))?;
    let reserve_span = cap
        .small_packet_reserve
        .as_ref()
        .map(|s| s.span())
        .unwrap_or(cap.burst.span());
    let small_reserve_bytes = small_reserve(
        cap.small_packet_reserve
            .as_ref()
            .map(|s| s.get_ref().as_str()),
        burst_bytes,
    )
    .map_err(at(reserve_span))?;
    let small_max_span = cap
        .small_packet_max
        .as_ref()
        .map(|s| s.span())
        .unwrap_or(cap.burst.span());
    let small_max_len = small_max(cap.small_packet_max.as_ref().map(|s| s.get_ref().as_str()))
        .map_err(at(small_max_span))?;
    Ok(Caps {
        rack_egress_bytes_per_s: egress,
        rack_ingress_bytes_per_s: ingress,
        burst_bytes,
        small_reserve_bytes,
        small_max_len,
        bytes_per_token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps() -> Caps {
        Caps {
            rack_egress_bytes_per_s: 10_000_000,
            rack_ingress_bytes_per_s: 1_000_000,
            burst_bytes: 262_144,
            small_reserve_bytes: DEFAULT_SMALL_RESERVE,
            small_max_len: DEFAULT_SMALL_MAX,
            bytes_per_token: None,
        }
    }

    #[test]
    fn cap_set_runs_the_config_checks() {
        let c = caps();
        let next = c.with_rack_rates(Some("5 MB/s"), None, 0.25).unwrap();
        assert_eq!(next.rack_egress_bytes_per_s, 5_000_000);
        assert_eq!(next.rack_ingress_bytes_per_s, 1_000_000);
        assert_eq!(next.host_bytes_per_s(Direction::Egress, 0.25), 1_250_000);
        let e = c.with_rack_rates(Some("0 MB/s"), None, 0.25).unwrap_err();
        assert_eq!(e.to_string(), "`cap.egress` must be above zero");
        let e = c.with_rack_rates(None, Some("3 B/s"), 0.25).unwrap_err();
        assert_eq!(
            e.to_string(),
            "`cap.ingress` x host_share rounds to zero bytes/s for this host"
        );
        let e = c
            .with_rack_rates(Some("1 tokens/s"), None, 1.0)
            .unwrap_err();
        assert!(e.to_string().starts_with("`cap.egress`: "), "{e}");
        assert!(matches!(
            c.with_rack_rates(None, None, 1.0),
            Err(CapError::NoRateGiven)
        ));
    }
}
