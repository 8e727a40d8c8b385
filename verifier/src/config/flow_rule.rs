//! `[policy.taps] allowed_raw_flows`: the flows a host may send or receive outside its
//! inference endpoints (DNS, NTP, this verifier, ...), each written `PROTO:PORT` or
//! `PROTO:ADDRESS:PORT` for TCP and UDP (`udp:53`, `tcp:10.0.0.5:7700`,
//! `tcp:[fd00::5]:7700`), matched against the peer's end of an opened raw-flow record, or a
//! whole protocol without ports: `icmp`, `icmpv6`, `ip:N` (IP protocol number N), `non_ip`
//! (frames that are not IP: ARP, LLDP, ...).

use std::net::{IpAddr, SocketAddr};

use rackwarden_attest::traffic::FlowKey;

/// One allowed peer: a protocol, and for TCP and UDP a port and optionally an address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlowRule {
    /// The IP protocol number; [`NON_IP`] for frames that are not IP.
    pub proto: u8,
    pub addr: Option<IpAddr>,
    /// `None`: every flow of the protocol (the rules without ports).
    pub port: Option<u16>,
}

/// The protocol number the tap gives frames that are not IP (its records' `proto` 0).
pub const NON_IP: u8 = 0;

impl FlowRule {
    /// Parses `PROTO:PORT` or `PROTO:ADDRESS:PORT` (IPv6 in brackets); `PROTO` is `tcp` or
    /// `udp`.
    pub fn parse(s: &str) -> Result<FlowRule, String> {
        let whole = |proto| {
            Ok(FlowRule {
                proto,
                addr: None,
                port: None,
            })
        };
        match s {
            "non_ip" => return whole(NON_IP),
            "icmp" => return whole(1),
            "icmpv6" => return whole(58),
            _ => {}
        }
        if let Some(n) = s.strip_prefix("ip:") {
            return match n.parse::<u8>() {
                Ok(6 | 17) => Err(format!("`{s}`: write tcp:PORT or udp:PORT for TCP and UDP")),
                Ok(p) => whole(p),
                Err(_) => Err(format!(
                    "`{s}`: `{n}` is not an IP protocol number (0 to 255)"
                )),
            };
        }
        let (proto, rest) = s
            .split_once(':')
            .ok_or_else(|| {
                format!(
                    "`{s}`: write PROTO:PORT or PROTO:ADDRESS:PORT (udp:53), icmp, icmpv6, ip:N or non_ip"
                )
            })?;
        let proto = match proto {
            "tcp" => 6,
            "udp" => 17,
            other => {
                return Err(format!(
                    "`{s}`: protocol `{other}` is not tcp or udp (other protocols: icmp, icmpv6, ip:N, non_ip)"
                ));
            }
        };
        if let Ok(port) = rest.parse::<u16>() {
            return Ok(FlowRule {
                proto,
                addr: None,
                port: Some(port),
            });
        }
        let sa: SocketAddr = rest.parse().map_err(|_| {
            format!("`{s}`: `{rest}` is neither a port nor ADDRESS:PORT (IPv6 in brackets)")
        })?;
        Ok(FlowRule {
            proto,
            addr: Some(sa.ip()),
            port: Some(sa.port()),
        })
    }

    /// Whether the flow's peer end is this rule's.
    pub fn allows(&self, f: &FlowKey) -> bool {
        f.proto == self.proto
            && self.port.is_none_or(|p| p == f.remote.port())
            && self.addr.is_none_or(|a| a == f.remote.ip())
    }

    /// DNS, NTP and the link layer's own frames (ARP): what every host needs whatever it
    /// serves. ICMP is not in it: a policy that wants it (IPv6 neighbour discovery) says so.
    pub fn defaults() -> Vec<FlowRule> {
        ["udp:53", "tcp:53", "udp:123", "non_ip"]
            .iter()
            .filter_map(|s| FlowRule::parse(s).ok())
            .collect()
    }
}

impl std::fmt::Display for FlowRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (self.proto, self.port, self.addr) {
            (NON_IP, None, _) => write!(f, "non_ip"),
            (1, None, _) => write!(f, "icmp"),
            (58, None, _) => write!(f, "icmpv6"),
            (p, None, _) => write!(f, "ip:{p}"),
            (p, Some(port), addr) => {
                let proto = if p == 6 { "tcp" } else { "udp" };
                match addr {
                    None => write!(f, "{proto}:{port}"),
                    Some(a) => write!(f, "{proto}:{}", SocketAddr::new(a, port)),
                }
            }
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
        for s in [
            "udp:53",
            "tcp:10.0.0.5:7700",
            "tcp:[fd00::5]:7700",
            "icmp",
            "icmpv6",
            "ip:47",
            "non_ip",
        ] {
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
