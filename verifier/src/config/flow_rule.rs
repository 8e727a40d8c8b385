//! `[policy.taps] allowed_raw_flows`: the flows a host may send or receive outside its
//! inference endpoints (DNS, NTP, this verifier, ...), each written `PROTO:PORT` or
//! `PROTO:ADDRESS:PORT` (`udp:53`, `tcp:10.0.0.5:7700`, `tcp:[fd00::5]:7700`) and matched
//! against the peer's end of an opened raw-flow record.

use std::net::{IpAddr, SocketAddr};

use rackwarden_attest::traffic::FlowKey;

/// One allowed peer: a protocol, a port, and optionally an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRule {
    pub proto: u8,
    pub addr: Option<IpAddr>,
    pub port: u16,
}

impl FlowRule {
    /// Parses `PROTO:PORT` or `PROTO:ADDRESS:PORT` (IPv6 in brackets); `PROTO` is `tcp` or
    /// `udp`.
    pub fn parse(s: &str) -> Result<FlowRule, String> {
        let (proto, rest) = s
            .split_once(':')
            .ok_or_else(|| format!("`{s}`: write PROTO:PORT or PROTO:ADDRESS:PORT (udp:53)"))?;
        let proto = match proto {
            "tcp" => 6,
            "udp" => 17,
            other => return Err(format!("`{s}`: protocol `{other}` is not tcp or udp")),
        };
        if let Ok(port) = rest.parse::<u16>() {
            return Ok(FlowRule {
                proto,
                addr: None,
                port,
            });
        }
        let sa: SocketAddr = rest.parse().map_err(|_| {
            format!("`{s}`: `{rest}` is neither a port nor ADDRESS:PORT (IPv6 in brackets)")
        })?;
        Ok(FlowRule {
            proto,
            addr: Some(sa.ip()),
            port: sa.port(),
        })
    }

    /// Whether the flow's peer end is this rule's.
    pub fn allows(&self, f: &FlowKey) -> bool {
        f.proto == self.proto
            && f.remote.port() == self.port
            && self.addr.is_none_or(|a| a == f.remote.ip())
    }

    /// DNS and NTP: what every host needs whatever it serves.
    pub fn defaults() -> Vec<FlowRule> {
        ["udp:53", "tcp:53", "udp:123"]
            .iter()
            .filter_map(|s| FlowRule::parse(s).ok())
            .collect()
    }
}

impl std::fmt::Display for FlowRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let proto = if self.proto == 6 { "tcp" } else { "udp" };
        match self.addr {
            None => write!(f, "{proto}:{}", self.port),
            Some(a) => write!(f, "{proto}:{}", SocketAddr::new(a, self.port)),
        }
    }
}

impl serde::Serialize for FlowRule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(proto: u8, remote: &str) -> FlowKey {
        FlowKey {
            proto,
            local: "10.0.0.2:40000".parse().unwrap(),
            remote: remote.parse().unwrap(),
        }
    }

    #[test]
    fn rules_parse_print_and_match_the_peer() {
        for s in ["udp:53", "tcp:10.0.0.5:7700", "tcp:[fd00::5]:7700"] {
            assert_eq!(FlowRule::parse(s).unwrap().to_string(), s);
        }
        let dns = FlowRule::parse("udp:53").unwrap();
        assert!(dns.allows(&flow(17, "10.9.9.9:53")));
        assert!(!dns.allows(&flow(6, "10.9.9.9:53")));
        assert!(!dns.allows(&flow(17, "10.9.9.9:54")));
        let v = FlowRule::parse("tcp:[fd00::5]:7700").unwrap();
        assert!(v.allows(&flow(6, "[fd00::5]:7700")));
        assert!(!v.allows(&flow(6, "[fd00::6]:7700")));
        for bad in [
            "53",
            "icmp:1",
            "udp:",
            "udp:70000",
            "udp:fd00::5:53",
            "udp:host:53",
        ] {
            assert!(FlowRule::parse(bad).is_err(), "{bad}");
        }
    }
}
