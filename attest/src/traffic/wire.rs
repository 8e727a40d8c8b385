//! How the commitment's values are written in JSON, in one place so every type writes them
//! the same way: digests as 64 lowercase hex digits, per-direction counts as
//! `{"egress": n, "ingress": n}`, socket addresses as strings. Each reader accepts exactly
//! one spelling of each value, so two different JSON texts never read as the same leaf.

use std::net::SocketAddr;

use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// `[u8; 32]` as 64 lowercase hex digits.
pub(crate) mod hex32 {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(h: &[u8; 32], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(h))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u8; 32], D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        parse(&s).ok_or_else(|| {
            de::Error::custom(format_args!(
                "a digest is 64 lowercase hex digits; `{s}` is not"
            ))
        })
    }

    /// Only lowercase: the one spelling the writers use.
    pub(crate) fn parse(s: &str) -> Option<[u8; 32]> {
        if s.len() != 64 || !s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return None;
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(s, &mut out).ok()?;
        Some(out)
    }
}

/// `[u64; 2]` (egress, ingress) as `{"egress": n, "ingress": n}`.
pub(crate) mod per_dir {
    use super::*;

    #[derive(Serialize, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct PerDirection {
        egress: u64,
        ingress: u64,
    }

    pub(crate) fn serialize<S: Serializer>(v: &[u64; 2], s: S) -> Result<S::Ok, S::Error> {
        PerDirection {
            egress: v[0],
            ingress: v[1],
        }
        .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<[u64; 2], D::Error> {
        let p = PerDirection::deserialize(d)?;
        Ok([p.egress, p.ingress])
    }
}

/// A socket address as `a.b.c.d:port` or `[v6]:port`. IPv4 peers are written in IPv4 form
/// only: the leaf encodes IPv4 as IPv4-mapped IPv6, so `[::ffff:a.b.c.d]:port` would be a
/// second spelling of the same leaf. Zone ids (`%eth0`) are refused for the same reason (the
/// encoding does not carry them).
pub(crate) mod sock {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(a: &SocketAddr, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(a)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        let a: SocketAddr = s.parse().map_err(|_| {
            de::Error::custom(format_args!(
                "`{s}` is not a socket address (a.b.c.d:port or [v6]:port)"
            ))
        })?;
        if let SocketAddr::V6(v6) = a {
            if v6.ip().to_ipv4_mapped().is_some() {
                return Err(de::Error::custom(format_args!(
                    "`{s}` is an IPv4-mapped address: write it as a.b.c.d:port"
                )));
            }
            if v6.scope_id() != 0 || v6.flowinfo() != 0 {
                return Err(de::Error::custom(format_args!(
                    "`{s}` has a zone id, which the record encoding does not carry"
                )));
            }
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Serialize, Deserialize)]
    struct T {
        #[serde(with = "hex32")]
        h: [u8; 32],
        #[serde(with = "per_dir")]
        b: [u64; 2],
        #[serde(with = "sock")]
        a: SocketAddr,
    }

    fn read(h: &str, a: &str) -> Result<T, serde_json::Error> {
        serde_json::from_str(&format!(
            r#"{{"h":"{h}","b":{{"egress":1,"ingress":2}},"a":"{a}"}}"#
        ))
    }

    #[test]
    fn one_spelling_each() {
        let lower = "ab".repeat(32);
        let t = read(&lower, "10.0.0.1:80").unwrap();
        assert_eq!(t.h, [0xab; 32]);
        assert_eq!(t.b, [1, 2]);
        assert_eq!(
            serde_json::to_string(&t).unwrap(),
            format!(r#"{{"h":"{lower}","b":{{"egress":1,"ingress":2}},"a":"10.0.0.1:80"}}"#)
        );
        assert!(read(&"AB".repeat(32), "10.0.0.1:80").is_err());
        assert!(read(&"ab".repeat(31), "10.0.0.1:80").is_err());
        assert!(read(&lower, "[::ffff:10.0.0.1]:80").is_err());
        assert!(read(&lower, "[fe80::1%2]:80").is_err());
        assert!(read(&lower, "10.0.0.1").is_err());
        assert!(read(&lower, "[2001:db8::1]:443").is_ok());
        let extra =
            format!(r#"{{"h":"{lower}","b":{{"egress":1,"ingress":2,"x":3}},"a":"10.0.0.1:80"}}"#);
        assert!(serde_json::from_str::<T>(&extra).is_err());
    }
}
