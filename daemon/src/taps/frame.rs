//! What a tapped frame is: its flow (from the host's side), and where its payload is.
//!
//! Ethernet (with at most one VLAN tag), IPv4 or IPv6, then TCP or UDP. Anything else (ARP,
//! IPv6 with extension headers, other protocols, truncated headers) is a frame without ports:
//! its flow is the protocol alone and its whole frame is its payload, so its bytes are still
//! committed, only not split further.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    ops::Range,
};

use rackwarden_attest::evidence::Direction;

pub const PROTO_TCP: u8 = 6;
pub const PROTO_UDP: u8 = 17;
/// A frame that is not IP (ARP, LLDP, ...): no addresses.
pub const PROTO_NOT_IP: u8 = 0;

/// A flow from the host's point of view: `local` is this host's end.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowId {
    pub proto: u8,
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// TCP's fields the stream reassembly needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpSegment {
    pub seq: u32,
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedFrame {
    pub flow: FlowId,
    /// The stream bytes this frame carries, within the frame.
    pub payload: Range<usize>,
    pub tcp: Option<TcpSegment>,
}

const UNSPECIFIED: SocketAddr = SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0);

/// Parses `frame` as seen in `dir`. Never fails: what cannot be parsed is a frame of its own
/// protocol, payload the whole frame.
pub fn parse(frame: &[u8], dir: Direction) -> ParsedFrame {
    parse_ip(frame, dir).unwrap_or(ParsedFrame {
        flow: FlowId {
            proto: PROTO_NOT_IP,
            local: UNSPECIFIED,
            remote: UNSPECIFIED,
        },
        payload: 0..frame.len(),
        tcp: None,
    })
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn parse_ip(frame: &[u8], dir: Direction) -> Option<ParsedFrame> {
    let mut l3 = 14;
    let mut ethertype = be16(frame, 12)?;
    if ethertype == 0x8100 || ethertype == 0x88a8 {
        ethertype = be16(frame, 16)?;
        l3 = 18;
    }
    // (src, dst, protocol, where L4 starts, where the IP packet ends)
    let (src, dst, proto, l4, end) = match ethertype {
        0x0800 => {
            let vihl = *frame.get(l3)?;
            if vihl >> 4 != 4 {
                return None;
            }
            let ihl = usize::from(vihl & 0x0f) * 4;
            let total = usize::from(be16(frame, l3 + 2)?);
            // A GSO super-packet may carry 0 (BIG TCP): then the frame's end is the packet's.
            let end = if total == 0 {
                frame.len()
            } else {
                (l3 + total).min(frame.len())
            };
            let src: [u8; 4] = frame.get(l3 + 12..l3 + 16)?.try_into().ok()?;
            let dst: [u8; 4] = frame.get(l3 + 16..l3 + 20)?.try_into().ok()?;
            let frag = be16(frame, l3 + 6)? & 0x1fff;
            if ihl < 20 || frag != 0 {
                // A later fragment has no L4 header: treat as unparsed (whole frame).
                return None;
            }
            (
                IpAddr::V4(Ipv4Addr::from(src)),
                IpAddr::V4(Ipv4Addr::from(dst)),
                *frame.get(l3 + 9)?,
                l3 + ihl,
                end,
            )
        }
        0x86dd => {
            let plen = usize::from(be16(frame, l3 + 4)?);
            let end = if plen == 0 {
                frame.len()
            } else {
                (l3 + 40 + plen).min(frame.len())
            };
            let src: [u8; 16] = frame.get(l3 + 8..l3 + 24)?.try_into().ok()?;
            let dst: [u8; 16] = frame.get(l3 + 24..l3 + 40)?.try_into().ok()?;
            (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                *frame.get(l3 + 6)?,
                l3 + 40,
                end,
            )
        }
        _ => return None,
    };
    let (sport, dport, payload_start, tcp) = match proto {
        PROTO_TCP => {
            let off = usize::from(*frame.get(l4 + 12)? >> 4) * 4;
            let flags = *frame.get(l4 + 13)?;
            if off < 20 {
                return None;
            }
            (
                be16(frame, l4)?,
                be16(frame, l4 + 2)?,
                l4 + off,
                Some(TcpSegment {
                    seq: be32(frame, l4 + 4)?,
                    syn: flags & 0x02 != 0,
                    fin: flags & 0x01 != 0,
                    rst: flags & 0x04 != 0,
                }),
            )
        }
        PROTO_UDP => (be16(frame, l4)?, be16(frame, l4 + 2)?, l4 + 8, None),
        _ => (0, 0, l4, None),
    };
    if payload_start > end {
        return None;
    }
    let (s, d) = (SocketAddr::new(src, sport), SocketAddr::new(dst, dport));
    let (local, remote) = match dir {
        Direction::Egress => (s, d),
        Direction::Ingress => (d, s),
    };
    Some(ParsedFrame {
        flow: FlowId {
            proto,
            local,
            remote,
        },
        payload: payload_start..end,
        tcp,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Ethernet + IPv4 + TCP with `payload`, from 10.0.0.1:40000 to 10.0.0.2:8000.
    pub(crate) fn tcp4(seq: u32, flags: u8, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&0x0800u16.to_be_bytes());
        let total = 20 + 20 + payload.len();
        f.extend_from_slice(&[0x45, 0]);
        f.extend_from_slice(&(total as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0, 0x40, 0, 64, PROTO_TCP, 0, 0]);
        f.extend_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        f.extend_from_slice(&40000u16.to_be_bytes());
        f.extend_from_slice(&8000u16.to_be_bytes());
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn tcp_over_ipv4_names_the_flow_from_the_host_side() {
        let f = tcp4(1000, 0x18, b"hello");
        let out = parse(&f, Direction::Egress);
        assert_eq!(out.flow.proto, PROTO_TCP);
        assert_eq!(out.flow.local, "10.0.0.1:40000".parse().unwrap());
        assert_eq!(out.flow.remote, "10.0.0.2:8000".parse().unwrap());
        assert_eq!(&f[out.payload.clone()], b"hello");
        assert_eq!(out.tcp.map(|t| t.seq), Some(1000));
        let back = parse(&f, Direction::Ingress);
        assert_eq!(back.flow.local, "10.0.0.2:8000".parse().unwrap());
    }

    #[test]
    fn ethernet_padding_is_not_payload_and_junk_is_a_whole_frame() {
        let mut f = tcp4(1, 0x10, b"");
        f.extend_from_slice(&[0; 6]); // padded to the 60-byte minimum
        assert_eq!(parse(&f, Direction::Egress).payload.len(), 0);
        let arp = vec![0xffu8; 42];
        let out = parse(&arp, Direction::Ingress);
        assert_eq!(out.flow.proto, PROTO_NOT_IP);
        assert_eq!(out.payload, 0..42);
        for n in 0..f.len() {
            let _ = parse(&f[..n], Direction::Egress);
        }
    }
}
