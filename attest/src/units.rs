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

/// A number as written, exactly: its sign and its decimal digits, with no rounding.
#[derive(Debug)]
struct Decimal {
    negative: bool,
    /// The digits, integer part then fraction, most significant first (each 0..=9).
    digits: Vec<u8>,
    /// How many of `digits` are after the decimal point.
    scale: usize,
}

impl Decimal {
    fn is_zero(&self) -> bool {
        self.digits.iter().all(|d| *d == 0)
    }

    /// This number times `mult / 10^shift`, exactly: a unit's multiplier is a whole number
    /// except for bits (`1/8 = 125/10^3`), and a decimal times it stays a decimal.
    fn times(&self, mult: u64, shift: usize) -> Decimal {
        let mut out = Vec::with_capacity(self.digits.len() + 20);
        let mut carry: u128 = 0;
        for d in self.digits.iter().rev() {
            let v = u128::from(*d) * u128::from(mult) + carry;
            out.push((v % 10) as u8);
            carry = v / 10;
        }
        while carry > 0 {
            out.push((carry % 10) as u8);
            carry /= 10;
        }
        out.reverse();
        Decimal {
            negative: self.negative,
            digits: out,
            scale: self.scale + shift,
        }
    }

    /// The integer part (`None` if it is above `u64::MAX`) and whether a fraction is left.
    fn whole(&self) -> (Option<u64>, bool) {
        let int_len = self.digits.len().saturating_sub(self.scale);
        let (int, frac) = self.digits.split_at(int_len);
        let fraction = frac.iter().any(|d| *d != 0);
        let mut value: u64 = 0;
        for d in int {
            match value
                .checked_mul(10)
                .and_then(|v| v.checked_add(u64::from(*d)))
            {
                Some(v) => value = v,
                None => return (None, fraction),
            }
        }
        (Some(value), fraction)
    }
}

/// The exact decimal text of a value (for errors): `0.3`, `1.5`, `0.000000001`.
impl fmt::Display for Decimal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        /// Fraction digits an error shows; a longer fraction ends in `...`.
        const SHOWN: usize = 24;
        let int_len = self.digits.len().saturating_sub(self.scale);
        let (int, frac) = self.digits.split_at(int_len);
        let mut text = String::new();
        if self.negative && !self.is_zero() {
            text.push('-');
        }
        let int: Vec<u8> = int.iter().copied().skip_while(|d| *d == 0).collect();
        if int.is_empty() {
            text.push('0');
        }
        text.extend(int.iter().map(|d| char::from(b'0' + d)));
        // The fraction is `scale` digits: the ones stored, after zeros the product did not
        // reach (0.001 stored as digits `1`, scale 3).
        let mut fraction: Vec<u8> = std::iter::repeat_n(0, self.scale - frac.len())
            .chain(frac.iter().copied())
            .collect();
        while fraction.last() == Some(&0) {
            fraction.pop();
        }
        if !fraction.is_empty() {
            text.push('.');
            text.extend(fraction.iter().take(SHOWN).map(|d| char::from(b'0' + d)));
            if fraction.len() > SHOWN {
                text.push_str("...");
            }
        }
        f.write_str(&text)
    }
}

/// Splits `"1.5 MB"` into the number, exactly, and the unit. The number is an optional sign,
/// digits with at most one decimal point, and `_` anywhere as a digit separator
/// (`1_000_000`); no exponent (`1e9` is the number 1 and the unit `e9`).
fn split_number(s: &str) -> Result<(Decimal, &str), UnitError> {
    let s = s.trim();
    let end = s
        .char_indices()
        .find(|(_, c)| !(c.is_ascii_digit() || *c == '.' || *c == '_' || *c == '-' || *c == '+'))
        .map(|(i, _)| i)
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(end);
    let num_clean: Vec<u8> = num.bytes().filter(|c| *c != b'_').collect();
    let not_a_number = || UnitError(format!("`{num}` is not a number"));
    let (negative, unsigned) = match num_clean.split_first() {
        None => return Err(UnitError(format!("`{s}` does not start with a number"))),
        Some((b'-', rest)) => (true, rest),
        Some((b'+', rest)) => (false, rest),
        Some(_) => (false, num_clean.as_slice()),
    };
    let (int, frac) = match unsigned.iter().position(|c| *c == b'.') {
        Some(dot) => (&unsigned[..dot], &unsigned[dot + 1..]),
        None => (unsigned, &[][..]),
    };
    if int.len() + frac.len() == 0 || !int.iter().chain(frac).all(u8::is_ascii_digit) {
        return Err(not_a_number());
    }
    // Leading zeros of the integer part and trailing zeros of the fraction change nothing:
    // dropped, so that `0000...1` or `1.000...` costs nothing to scale.
    let int: Vec<u8> = int
        .iter()
        .skip_while(|c| **c == b'0')
        .map(|c| c - b'0')
        .collect();
    let mut frac: Vec<u8> = frac.iter().map(|c| c - b'0').collect();
    while frac.last() == Some(&0) {
        frac.pop();
    }
    let scale = frac.len();
    let mut digits = int;
    digits.extend(frac);
    Ok((
        Decimal {
            negative,
            digits,
            scale,
        },
        unit.trim(),
    ))
}

/// The multiplier of a size unit (`B`, `KB`, `MiB`, `bit`, `Mbit`, ...) as `(m, k)`: the unit
/// is `m / 10^k` bytes, exactly.
fn size_multiplier(unit: &str) -> Option<(u64, usize)> {
    Some(match unit {
        "" | "B" | "byte" | "bytes" => (1, 0),
        "kB" | "KB" => (1_000, 0),
        "MB" => (1_000_000, 0),
        "GB" => (1_000_000_000, 0),
        "TB" => (1_000_000_000_000, 0),
        "PB" => (1_000_000_000_000_000, 0),
        "KiB" => (1 << 10, 0),
        "MiB" => (1 << 20, 0),
        "GiB" => (1 << 30, 0),
        "TiB" => (1 << 40, 0),
        "PiB" => (1 << 50, 0),
        // 1/8 byte = 0.125.
        "bit" | "bits" => (125, 3),
        "kbit" | "Kbit" => (125, 0),
        "Mbit" => (125_000, 0),
        "Gbit" => (125_000_000, 0),
        _ => return None,
    })
}

/// `value` as a whole count of `units` (bytes, tokens, ns), or why not. `what` and `input`
/// name the quantity in the error.
fn to_whole(value: &Decimal, what: &str, units: &str, input: &str) -> Result<u64, UnitError> {
    if value.negative && !value.is_zero() {
        return Err(UnitError(format!("{what} `{input}` is negative")));
    }
    let (int, fraction) = value.whole();
    let Some(int) = int else {
        return Err(UnitError(format!(
            "{what} `{input}` is too large (more than {} {units})",
            u64::MAX
        )));
    };
    if fraction {
        return Err(UnitError(format!(
            "{what} `{input}` is not a whole number of {units} ({value} {units})"
        )));
    }
    Ok(int)
}

/// Parses a size such as `"256 KiB"` or `"1 MB"` into bytes, exactly.
pub fn parse_size(s: &str) -> Result<u64, UnitError> {
    let (value, unit) = split_number(s)?;
    let (mult, shift) = size_multiplier(unit).ok_or_else(|| {
        UnitError(format!(
            "unknown size unit `{unit}` in `{s}` (use B, KB, MB, GB, TB, PB, KiB, MiB, GiB, TiB, PiB, bit, kbit, Mbit, Gbit)"
        ))
    })?;
    to_whole(&value.times(mult, shift), "size", "bytes", s)
}

/// Parses a rate such as `"10 MB/s"`, `"8 Mbit/s"` or `"200000 tokens/s"`, exactly.
pub fn parse_rate(s: &str) -> Result<Rate, UnitError> {
    let (value, unit) = split_number(s)?;
    let Some(per) = unit.strip_suffix("/s") else {
        return Err(UnitError(format!(
            "rate `{s}` has no `/s` (write e.g. \"10 MB/s\", \"8 Mbit/s\" or \"200000 tokens/s\")"
        )));
    };
    let per = per.trim();
    if per == "tokens" || per == "token" {
        return Ok(Rate::TokensPerSec(to_whole(
            &value,
            "token rate",
            "tokens",
            s,
        )?));
    }
    let (mult, shift) = size_multiplier(per).ok_or_else(|| {
        UnitError(format!(
            "unknown rate unit `{per}/s` in `{s}` (use B/s, KB/s, MB/s, GB/s, KiB/s, MiB/s, kbit/s, Mbit/s, Gbit/s, tokens/s)"
        ))
    })?;
    Ok(Rate::BytesPerSec(to_whole(
        &value.times(mult, shift),
        "rate",
        "bytes",
        s,
    )?))
}

/// Parses a duration such as `"2 s"`, `"500 ms"`, `"15 min"`, `"1 h"`, exactly: a whole
/// number of nanoseconds up to `u64::MAX` (about 584 years).
pub fn parse_duration(s: &str) -> Result<Duration, UnitError> {
    let (value, unit) = split_number(s)?;
    let ns_per_unit: u64 = match unit {
        "ms" => 1_000_000,
        "s" | "sec" | "secs" => 1_000_000_000,
        "min" | "mins" => 60_000_000_000,
        "h" | "hour" | "hours" => 3_600_000_000_000,
        _ => {
            return Err(UnitError(format!(
                "unknown duration unit `{unit}` in `{s}` (use ms, s, min, h)"
            )));
        }
    };
    let ns = to_whole(&value.times(ns_per_unit, 0), "duration", "ns", s)?;
    Ok(Duration::from_nanos(ns))
}

/// Human form of a byte rate (decimal units, as operators write caps).
pub fn fmt_rate(bytes_per_s: f64) -> String {
    format!("{}/s", fmt_bytes(bytes_per_s))
}

/// A rate in decimal units only (`2.5 MB/s`, `10 MB/s`, `500 GB/s`), as caps are written:
/// for outputs that must not mix `MB/s` and `MiB/s`. Up to three decimals, trailing zeros
/// dropped; exact below 1 kB/s.
pub fn fmt_rate_decimal(bytes_per_s: u64) -> String {
    let (div, unit) = match bytes_per_s {
        b if b >= 1_000_000_000_000 => (1e12, "TB/s"),
        b if b >= 1_000_000_000 => (1e9, "GB/s"),
        b if b >= 1_000_000 => (1e6, "MB/s"),
        b if b >= 1_000 => (1e3, "kB/s"),
        b => return format!("{b} B/s"),
    };
    let v = format!("{:.3}", bytes_per_s as f64 / div);
    let v = v.trim_end_matches('0').trim_end_matches('.');
    format!("{v} {unit}")
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
    #[test]
    fn decimal_rates_do_not_mix_unit_systems() {
        assert_eq!(fmt_rate_decimal(2_500_000), "2.5 MB/s");
        assert_eq!(fmt_rate_decimal(10_000_000), "10 MB/s");
        assert_eq!(fmt_rate_decimal(500_000_000_000), "500 GB/s");
        assert_eq!(fmt_rate_decimal(999), "999 B/s");
        assert_eq!(fmt_rate_decimal(1_048_576), "1.049 MB/s");
    }

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
    fn sizes_are_exact_to_the_last_byte() {
        assert_eq!(parse_size("18446744073709551615 B"), Ok(u64::MAX));
        let e = parse_size("18446744073709551616 B").unwrap_err();
        assert!(e.0.contains("too large"), "{e}");
        assert!(e.0.contains("18446744073709551616 B"), "{e}");
        // 2^53 + 1: an f64 rounds it to 2^53.
        assert_eq!(parse_size("9007199254740993 B"), Ok(9_007_199_254_740_993));
        assert_eq!(parse_size("9007199254740993"), Ok(9_007_199_254_740_993));
        assert!(parse_size("16 EiB").unwrap_err().0.contains("unknown"));
        assert_eq!(
            parse_size("16777216 TiB"),
            Err(UnitError(
                "size `16777216 TiB` is too large (more than 18446744073709551615 bytes)".into()
            ))
        );
        assert_eq!(parse_size("16777215.999999 TiB").map(|_| ()), Err(UnitError(
            "size `16777215.999999 TiB` is not a whole number of bytes (18446744073708452104.372224 bytes)".into()
        )));
        assert_eq!(parse_size("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("1.5 GiB"), Ok(1_610_612_736));
        assert_eq!(parse_size("0.5 KiB"), Ok(512));
        assert_eq!(parse_size(".5 KiB"), Ok(512));
        assert_eq!(parse_size("2. KiB"), Ok(2048));
        assert_eq!(parse_size("+2 KiB"), Ok(2048));
        assert_eq!(parse_size("1_000_000 B"), Ok(1_000_000));
        assert_eq!(parse_size("-0 B"), Ok(0));
        assert_eq!(parse_size("0000000000000000000000000000000042 B"), Ok(42));
        assert_eq!(
            parse_size("1.000000000000000000000000000000000000000000 TB"),
            Ok(1_000_000_000_000)
        );
        // 2^-40 TiB is one byte: 40 decimals, more than a u128 holds as 10^40.
        assert_eq!(
            parse_size("0.0000000000009094947017729282379150390625 TiB"),
            Ok(1)
        );
        assert_eq!(parse_size("8 bit"), Ok(1));
        assert_eq!(
            parse_size("12 bits"),
            Err(UnitError(
                "size `12 bits` is not a whole number of bytes (1.5 bytes)".into()
            ))
        );
        assert_eq!(parse_size("4 kbit"), Ok(500));
        assert_eq!(
            parse_size("0.001 B"),
            Err(UnitError(
                "size `0.001 B` is not a whole number of bytes (0.001 bytes)".into()
            ))
        );
        for bad in [
            "1e3 B", "1.2.3 B", "--1 B", "1-2 B", "+ B", ". B", "_", "inf B", "NaN B", "", "   ",
        ] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
        assert_eq!(parse_size("-1 B").unwrap_err().0, "size `-1 B` is negative");
    }

    #[test]
    fn durations_are_exact_and_never_panic() {
        assert_eq!(parse_duration("1.5 s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0.000000001 s"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse_duration("2 h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse_duration("0.25 hours"), Ok(Duration::from_secs(900)));
        assert_eq!(
            parse_duration("18446744073.709551615 s"),
            Ok(Duration::from_nanos(u64::MAX))
        );
        for huge in [
            "1e400 s",
            "18446744073.709551616 s",
            "1000000000000 h",
            "99999999999999999999999999999999999999999999 min",
        ] {
            assert!(parse_duration(huge).is_err(), "{huge}");
        }
        assert!(
            parse_duration("1000000000000 h")
                .unwrap_err()
                .0
                .contains("too large")
        );
        assert_eq!(
            parse_duration("0.0000000001 s"),
            Err(UnitError(
                "duration `0.0000000001 s` is not a whole number of ns (0.1 ns)".into()
            ))
        );
        assert!(parse_duration("-1 s").unwrap_err().0.contains("negative"));
        assert!(
            parse_rate("1.5 tokens/s")
                .unwrap_err()
                .0
                .contains("whole number of tokens")
        );
        assert_eq!(
            parse_rate("18446744073709551615 tokens/s"),
            Ok(Rate::TokensPerSec(u64::MAX))
        );
        assert!(parse_rate("18446744073709551616 tokens/s").is_err());
        assert_eq!(parse_rate("8 Gbit/s"), Ok(Rate::BytesPerSec(1_000_000_000)));
    }

    proptest::proptest! {
        #[test]
        fn parsing_never_panics(s in ".{0,64}") {
            let _ = parse_size(&s);
            let _ = parse_rate(&s);
            let _ = parse_duration(&s);
        }

        #[test]
        fn number_like_text_never_panics(s in "[-+0-9._]{0,48} ?(B|KiB|TiB|bit|kbit|MB/s|bit/s|tokens/s|ms|s|min|h|e9|)") {
            let _ = parse_size(&s);
            let _ = parse_rate(&s);
            let _ = parse_duration(&s);
        }

        #[test]
        fn bytes_and_kib_round_trip_exactly(n: u64) {
            proptest::prop_assert_eq!(parse_size(&format!("{n} B")), Ok(n));
            proptest::prop_assert_eq!(parse_size(&format!("{n}")), Ok(n));
            let kib = parse_size(&format!("{n} KiB"));
            match n.checked_mul(1024) {
                Some(b) => proptest::prop_assert_eq!(kib, Ok(b)),
                None => proptest::prop_assert!(kib.unwrap_err().0.contains("too large")),
            }
            // Any byte count in KiB with its exact decimal fraction (r/1024 = r·5^10/10^10).
            let (q, r) = (n / 1024, n % 1024);
            proptest::prop_assert_eq!(parse_size(&format!("{q}.{:010} KiB", r * 9_765_625)), Ok(n));
            proptest::prop_assert_eq!(parse_rate(&format!("{n} B/s")), Ok(Rate::BytesPerSec(n)));
            proptest::prop_assert_eq!(parse_duration(&format!("{n} ms")).ok(), n.checked_mul(1_000_000).map(Duration::from_nanos));
        }
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
