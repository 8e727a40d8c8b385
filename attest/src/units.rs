//! Quantities with explicit units, as written in the config and on the command line.
//!
//! Decimal prefixes are decimal (`MB` = 10^6 bytes, `Mbit` = 10^6 bits); binary prefixes are
//! binary (`MiB` = 2^20 bytes). A bare number is a number of bytes where a size is meant
//! (`--max-bytes 268435456`, what a user types first); rates and durations must name their
//! unit, since a bare `10` there could mean anything.
//!
//! [`ByteSize`], [`Rate`] and [`Interval`] are the one set of types the config files and every
//! command-line flag parse through (`FromStr`), so a unit means the same thing everywhere.

use std::{fmt, str::FromStr, time::Duration};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct UnitError(pub String);

/// A rate as written: either bytes per second or tokens per second (converted with the
/// configured `bytes_per_token`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Rate {
    BytesPerSec(u64),
    TokensPerSec(u64),
}

impl Rate {
    /// Bytes per second; token rates need `bytes_per_token`.
    pub fn bytes_per_sec(self, bytes_per_token: Option<u64>) -> Result<u64, UnitError> {
        match self {
            Rate::BytesPerSec(b) => Ok(b),
            Rate::TokensPerSec(t) => {
                let bpt = bytes_per_token.ok_or_else(|| {
                    UnitError("a rate in tokens/s needs `bytes_per_token` in [cap]".into())
                })?;
                t.checked_mul(bpt)
                    .ok_or_else(|| UnitError(format!("{t} tokens/s x {bpt} bytes overflows")))
            }
        }
    }
}

fn split_number(s: &str) -> Result<(f64, &str), UnitError> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.' || *c == '_' || *c == '-' || *c == '+'))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let num_clean: String = num.chars().filter(|c| *c != '_').collect();
    if num_clean.is_empty() {
        return Err(UnitError(format!("`{s}` does not start with a number")));
    }
    let value: f64 = num_clean
        .parse()
        .map_err(|_| UnitError(format!("`{num}` is not a number")))?;
    if !value.is_finite() {
        return Err(UnitError(format!("`{num}` is not a finite number")));
    }
    Ok((value, unit.trim()))
}

/// Byte multiplier for a size unit (`B`, `KB`, `MiB`, `bit`, `Mbit`, ...).
fn size_multiplier(unit: &str) -> Option<f64> {
    Some(match unit {
        "" | "B" | "byte" | "bytes" => 1.0,
        "kB" | "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1048576.0,
        "GiB" => 1073741824.0,
        "TiB" => 1099511627776.0,
        "bit" | "bits" => 0.125,
        "kbit" | "Kbit" => 125.0,
        "Mbit" => 125_000.0,
        "Gbit" => 125_000_000.0,
        _ => return None,
    })
}

fn to_whole(value: f64, what: &str, input: &str) -> Result<u64, UnitError> {
    if value < 0.0 {
        return Err(UnitError(format!("{what} `{input}` is negative")));
    }
    if value > u64::MAX as f64 {
        return Err(UnitError(format!("{what} `{input}` is too large")));
    }
    if value.fract() != 0.0 {
        return Err(UnitError(format!(
            "{what} `{input}` is not a whole number of bytes ({value})"
        )));
    }
    Ok(value as u64)
}

/// Parses a size such as `"256 KiB"` or `"1 MB"` into bytes.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (value, unit) = split_number(s)?;
    let mult = size_multiplier(unit).ok_or_else(|| {
        UnitError(format!(
            "unknown size unit `{unit}` in `{s}` (use B, KB, MB, GB, KiB, MiB, GiB, kbit, Mbit, Gbit)"
        ))
    })?;
    to_whole(value * mult, "size", s)
}

/// Parses a rate such as `"10 MB/s"`, `"8 Mbit/s"` or `"200000 tokens/s"`.
pub fn parse_rate(s: &str) -> Result<Rate, UnitError> {
    let (value, unit) = split_number(s)?;
    let Some(per) = unit.strip_suffix("/s") else {
        return Err(UnitError(format!(
            "rate `{s}` has no `/s` (write e.g. \"10 MB/s\", \"8 Mbit/s\" or \"200000 tokens/s\")"
        )));
    };
    let per = per.trim();
    if per == "tokens" || per == "token" {
        return Ok(Rate::TokensPerSec(to_whole(value, "token rate", s)?));
    }
    let mult = size_multiplier(per).ok_or_else(|| {
        UnitError(format!(
            "unknown rate unit `{per}/s` in `{s}` (use B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, kbit/s, Mbit/s, Gbit/s, tokens/s)"
        ))
    })?;
    Ok(Rate::BytesPerSec(to_whole(value * mult, "rate", s)?))
}

/// Parses a duration such as `"2 s"`, `"500 ms"`, `"15 min"`, `"1 h"`.
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let (value, unit) = split_number(s)?;
    if value < 0.0 {
        return Err(UnitError(format!("duration `{s}` is negative")));
    }
    let secs = match unit {
        "ms" => value / 1e3,
        "s" | "sec" | "secs" => value,
        "min" | "mins" => value * 60.0,
        "h" | "hour" | "hours" => value * 3600.0,
        _ => {
            return Err(UnitError(format!(
                "unknown duration unit `{unit}` in `{s}` (use ms, s, min, h)"
            )));
        }
    };
    Ok(Duration::from_secs_f64(secs))
}

/// Human form of a byte rate (decimal units, as operators write caps).
pub fn fmt_rate(bytes_per_s: f64) -> String {
    format!("{}/s", fmt_bytes(bytes_per_s))
}

/// Human form of a byte count: [`fmt_size`] for whole byte counts.
pub fn fmt_bytes(b: f64) -> String {
    if b >= 0.0 && b.fract() == 0.0 && b < u64::MAX as f64 {
        return fmt_size(b as u64);
    }
    let (v, u) = if b >= 1e9 {
        (b / 1e9, "GB")
    } else if b >= 1e6 {
        (b / 1e6, "MB")
    } else if b >= 1e3 {
        (b / 1e3, "KB")
    } else {
        (b, "B")
    };
    format!("{v:.3} {u}")
}

/// A size in bytes, parsed by [`parse_size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ByteSize(pub u64);

impl FromStr for ByteSize {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<ByteSize, UnitError> {
        parse_size(s).map(ByteSize)
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fmt_size(self.0))
    }
}

impl FromStr for Rate {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Rate, UnitError> {
        parse_rate(s)
    }
}

/// A duration, parsed by [`parse_duration`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Interval(pub Duration);

impl FromStr for Interval {
    type Err = UnitError;
    fn from_str(s: &str) -> Result<Interval, UnitError> {
        parse_duration(s).map(Interval)
    }
}

impl fmt::Display for Interval {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&fmt_duration(self.0))
    }
}

/// A size as an operator reads it: exact when a unit divides it into a short number
/// (`256 KiB`, `10 MB`, `9999 B`), otherwise to two decimals in binary units
/// (`23.29 GiB`).
pub fn fmt_size(b: u64) -> String {
    for (m, u) in [
        (1u64 << 40, "TiB"),
        (1 << 30, "GiB"),
        (1 << 20, "MiB"),
        (1 << 10, "KiB"),
        (1_000_000_000_000, "TB"),
        (1_000_000_000, "GB"),
        (1_000_000, "MB"),
    ] {
        if b >= m && b.is_multiple_of(m) && b / m < 10_000 {
            return format!("{} {u}", b / m);
        }
    }
    if b < 10_000 {
        return format!("{b} B");
    }
    let (v, u) = if b >= 1 << 40 {
        (b as f64 / (1u64 << 40) as f64, "TiB")
    } else if b >= 1 << 30 {
        (b as f64 / (1u64 << 30) as f64, "GiB")
    } else if b >= 1 << 20 {
        (b as f64 / (1u64 << 20) as f64, "MiB")
    } else {
        (b as f64 / 1024.0, "KiB")
    };
    format!("{v:.2} {u}")
}

/// A duration for people: `250 ms`, `4.2 s`, `15 min`, `2 h 5 min`.
pub fn fmt_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 && ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else if ms < 60_000 {
        format!("{:.1} s", d.as_secs_f64())
    } else if ms < 3_600_000 {
        let (m, s) = (d.as_secs() / 60, d.as_secs() % 60);
        if s == 0 {
            format!("{m} min")
        } else {
            format!("{m} min {s} s")
        }
    } else {
        let (h, m) = (d.as_secs() / 3600, (d.as_secs() % 3600) / 60);
        if m == 0 {
            format!("{h} h")
        } else {
            format!("{h} h {m} min")
        }
    }
}

/// A unix time in ms as UTC, `2026-12-03 06:10:01.250Z` (days-to-civil, proleptic Gregorian).
pub fn fmt_unix_ms(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60,
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates() {
        assert_eq!(parse_rate("10 MB/s"), Ok(Rate::BytesPerSec(10_000_000)));
        assert_eq!(parse_rate("8 Mbit/s"), Ok(Rate::BytesPerSec(1_000_000)));
        assert_eq!(parse_rate("1 MiB/s"), Ok(Rate::BytesPerSec(1_048_576)));
        assert_eq!(
            parse_rate("200000 tokens/s"),
            Ok(Rate::TokensPerSec(200_000))
        );
        assert_eq!(parse_rate("1.5 MB/s"), Ok(Rate::BytesPerSec(1_500_000)));
        assert!(parse_rate("10").unwrap_err().0.contains("/s"));
        assert!(
            parse_rate("10 parsecs/s")
                .unwrap_err()
                .0
                .contains("unknown rate unit")
        );
        assert!(parse_rate("-1 MB/s").unwrap_err().0.contains("negative"));
        assert!(parse_rate("MB/s").unwrap_err().0.contains("number"));
        assert!(parse_rate("0.3 B/s").unwrap_err().0.contains("whole"));
    }

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("256 KiB"), Ok(262_144));
        assert_eq!(parse_size("1 MB"), Ok(1_000_000));
        assert!(parse_size("12 furlongs").is_err());
        // A bare number of bytes is what a user types first.
        assert_eq!(parse_size("268435456"), Ok(268_435_456));
        assert_eq!("268435456".parse::<ByteSize>(), Ok(ByteSize(268_435_456)));
        assert!(parse_size("1.5").is_err());
        assert!(parse_duration("10").is_err());
        assert_eq!(ByteSize(262_144).to_string(), "256 KiB");
        assert_eq!(ByteSize(10_000_000).to_string(), "10 MB");
        assert_eq!(ByteSize(262_145).to_string(), "256.00 KiB");
        assert_eq!(ByteSize(9_999).to_string(), "9999 B");
        assert_eq!(ByteSize(25_275_924_480).to_string(), "23.54 GiB");
        assert_eq!(fmt_bytes(262_144.0), "256 KiB");
        assert_eq!(Interval(Duration::from_secs(900)).to_string(), "15 min");
        assert_eq!(Interval(Duration::from_millis(250)).to_string(), "250 ms");
        assert_eq!(Interval(Duration::from_secs(30)).to_string(), "30 s");
        assert_eq!(Interval(Duration::from_millis(4200)).to_string(), "4.2 s");
        assert_eq!(fmt_unix_ms(0), "1970-01-01 00:00:00.000Z");
        // `date -u -d @1796278201` = 2026-12-03 06:10:01 UTC
        assert_eq!(fmt_unix_ms(1_796_278_201_250), "2026-12-03 06:10:01.250Z");
        assert_eq!(fmt_unix_ms(951_782_400_000), "2000-02-29 00:00:00.000Z");
        assert_eq!(parse_duration("15 min"), Ok(Duration::from_secs(900)));
        assert_eq!(parse_duration("500 ms"), Ok(Duration::from_millis(500)));
        assert!(parse_duration("3 fortnights").is_err());
    }

    #[test]
    fn tokens_need_bytes_per_token() {
        assert!(Rate::TokensPerSec(5).bytes_per_sec(None).is_err());
        assert_eq!(
            Rate::TokensPerSec(200_000).bytes_per_sec(Some(4)),
            Ok(800_000)
        );
    }
}
