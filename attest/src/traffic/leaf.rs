//! One record of an epoch's traffic and its fixed-width encoding: the leaf of the sum tree.
//!
//! The encoding has no length prefixes and no optional parts, so an auditor can rebuild it
//! from the byte table in `docs/traffic-format.md` and a leaf hash names exactly one record.

use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Serialize};

use super::{idx, wire};
use crate::{Digest, Sha3_256, evidence::Direction};

/// The first bytes of every leaf encoding (`rackwarden/traffic-leaf/v1` and a NUL).
pub const LEAF_DOMAIN: &[u8] = b"rackwarden/traffic-leaf/v1\0";

/// The length of a leaf encoding in bytes.
pub const LEAF_LEN: usize = 185;

/// What a record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordKind {
    /// One HTTP request (input) and its response (output) on a TCP connection.
    Exchange,
    /// The bytes of one flow (5-tuple) in the epoch that are not inference traffic.
    RawFlow,
    /// Bytes of an inference connection that were not part of a complete exchange when the
    /// epoch closed (a request still arriving, a response still being sent).
    Partial,
}

impl RecordKind {
    /// The kind's byte in the leaf encoding.
    pub fn code(self) -> u8 {
        match self {
            RecordKind::Exchange => 1,
            RecordKind::RawFlow => 2,
            RecordKind::Partial => 3,
        }
    }
}

/// The flow a record belongs to, from the host's point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowKey {
    /// IP protocol number: 6 TCP, 17 UDP, anything else as the IP header says.
    pub proto: u8,
    /// The host's address and port (port 0 for protocols without ports).
    #[serde(with = "wire::sock")]
    pub local: SocketAddr,
    /// The peer's address and port (port 0 for protocols without ports).
    #[serde(with = "wire::sock")]
    pub remote: SocketAddr,
}

impl FlowKey {
    /// The protocol's name: `tcp`, `udp`, or `ip proto N`.
    pub fn proto_name(&self) -> String {
        match self.proto {
            6 => "tcp".into(),
            17 => "udp".into(),
            p => format!("ip proto {p}"),
        }
    }
}

impl std::fmt::Display for FlowKey {
    /// `udp 10.0.0.2:5353 -> 10.0.0.53:53`: the host's end first.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} -> {}", self.proto_name(), self.local, self.remote)
    }
}

/// A contiguous part of one direction of a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamPart {
    /// Stream offset of the first byte (for TCP: counted from the first payload byte after
    /// the handshake; for raw flows: from the first payload byte of the flow in the epoch).
    pub offset: u64,
    /// Number of payload bytes.
    pub len: u64,
    /// SHA3-256 of exactly those bytes; of the empty input when `len` is 0.
    #[serde(with = "wire::hex32")]
    pub sha3_256: [u8; 32],
}

impl StreamPart {
    /// An empty part at `offset`.
    pub fn empty(offset: u64) -> StreamPart {
        StreamPart {
            offset,
            len: 0,
            sha3_256: Sha3_256::digest([]).into(),
        }
    }

    /// The part holding exactly `bytes`, starting at stream offset `offset`.
    pub fn of_bytes(offset: u64, bytes: &[u8]) -> StreamPart {
        StreamPart {
            offset,
            len: bytes.len() as u64,
            sha3_256: Sha3_256::digest(bytes).into(),
        }
    }
}

/// One record: a leaf of the epoch's sum tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficLeaf {
    /// The epoch this record belongs to (a leaf cannot be replayed into another epoch).
    pub epoch_seq: u64,
    pub kind: RecordKind,
    pub flow: FlowKey,
    /// Payload that came in to the host (ingress): the request of an exchange.
    pub input: StreamPart,
    /// Payload the host sent (egress): the response of an exchange.
    pub output: StreamPart,
    /// Per direction (egress, ingress), the frame bytes of this record's frames in this
    /// epoch, as the kernel charged them (`skb->len`): the record's weight in the sum tree.
    ///
    /// Beyond the payload, this counts link, IP and transport headers, handshakes,
    /// acknowledgements and retransmitted bytes. It is not payload plus something: TCP bytes
    /// that arrived out of order before the previous epoch's cut were held there and enter
    /// the stream in this epoch, while their frames were counted in the epoch they arrived
    /// in. So `wire` can be less than the record's stream bytes in that direction, and
    /// `wire - payload` is the header and retransmission count only for a record with
    /// nothing held across a cut.
    #[serde(with = "wire::per_dir")]
    pub wire: [u64; 2],
}

impl TrafficLeaf {
    /// The leaf encoding (the byte table in `docs/traffic-format.md`): all integers
    /// big-endian, addresses as 16-byte IPv6 (IPv4 as `::ffff:a.b.c.d`).
    pub fn encode(&self) -> [u8; LEAF_LEN] {
        let mut out = [0u8; LEAF_LEN];
        let mut w = Writer {
            buf: &mut out,
            at: 0,
        };
        w.put(LEAF_DOMAIN);
        w.put(&self.epoch_seq.to_be_bytes());
        w.put(&[self.kind.code(), self.flow.proto]);
        for a in [self.flow.local, self.flow.remote] {
            w.put(&ip16(a.ip()));
            w.put(&a.port().to_be_bytes());
        }
        for p in [self.input, self.output] {
            w.put(&p.offset.to_be_bytes());
            w.put(&p.len.to_be_bytes());
            w.put(&p.sha3_256);
        }
        w.put(&self.wire[0].to_be_bytes());
        w.put(&self.wire[1].to_be_bytes());
        debug_assert_eq!(w.at, LEAF_LEN);
        out
    }

    /// SHA3-256 of [`TrafficLeaf::encode`].
    pub fn leaf_hash(&self) -> [u8; 32] {
        Sha3_256::digest(self.encode()).into()
    }

    /// The frame bytes this record accounts for in `dir`: `wire` in that direction, its
    /// weight in the sum tree (see [`TrafficLeaf::wire`] for why it is not derived from the
    /// payload).
    pub fn wire_bytes(&self, dir: Direction) -> u64 {
        self.wire[idx(dir)]
    }

    /// [`TrafficLeaf::wire_bytes`] for both directions, egress first.
    pub fn wire_bytes_both(&self) -> [u64; 2] {
        self.wire
    }
}

/// The 16-byte form of an address: IPv6 as is, IPv4 as IPv4-mapped IPv6.
fn ip16(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

/// Appends to a fixed buffer whose size is [`LEAF_LEN`] (the fields add up to it, which the
/// tests check); `get_mut` keeps a miscount from panicking in a release build.
struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        let end = self.at + bytes.len();
        if let Some(dst) = self.buf.get_mut(self.at..end) {
            dst.copy_from_slice(bytes);
        }
        self.at = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leaf() -> TrafficLeaf {
        TrafficLeaf {
            epoch_seq: 7,
            kind: RecordKind::Exchange,
            flow: FlowKey {
                proto: 6,
                local: "10.0.0.2:8000".parse().unwrap(),
                remote: "10.0.0.9:51234".parse().unwrap(),
            },
            input: StreamPart::of_bytes(0, b"GET / HTTP/1.1\r\n\r\n"),
            output: StreamPart::of_bytes(0, b"HTTP/1.1 200 OK\r\n\r\n"),
            wire: [139, 98],
        }
    }

    #[test]
    fn encoding_is_fixed_width_and_starts_with_the_domain() {
        let l = leaf();
        let e = l.encode();
        assert_eq!(LEAF_DOMAIN.len(), 27);
        assert_eq!(&e[..27], LEAF_DOMAIN);
        assert_eq!(&e[27..35], &7u64.to_be_bytes());
        assert_eq!(e[35], 1);
        assert_eq!(e[36], 6);
        assert_eq!(
            &e[37..53],
            &"::ffff:10.0.0.2"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
        assert_eq!(&e[53..55], &8000u16.to_be_bytes());
        assert_eq!(&e[169..177], &139u64.to_be_bytes());
        assert_eq!(&e[177..185], &98u64.to_be_bytes());
        assert_eq!(l.leaf_hash(), <[u8; 32]>::from(Sha3_256::digest(e)));
    }

    #[test]
    fn every_field_changes_the_hash() {
        let base = leaf();
        let h = base.leaf_hash();
        let mut variants = Vec::new();
        let mut v = base;
        v.epoch_seq += 1;
        variants.push(v);
        for kind in [RecordKind::RawFlow, RecordKind::Partial] {
            let mut v = base;
            v.kind = kind;
            variants.push(v);
        }
        let mut v = base;
        v.flow.proto = 17;
        variants.push(v);
        let mut v = base;
        v.flow.local.set_port(8001);
        variants.push(v);
        let mut v = base;
        v.flow.remote = "[2001:db8::9]:51234".parse().unwrap();
        variants.push(v);
        let mut v = base;
        v.input.offset += 1;
        variants.push(v);
        let mut v = base;
        v.input.len += 1;
        variants.push(v);
        let mut v = base;
        v.output.sha3_256[31] ^= 1;
        variants.push(v);
        let mut v = base;
        v.wire[1] += 1;
        variants.push(v);
        for v in variants {
            assert_ne!(v.leaf_hash(), h, "{v:?}");
        }
    }

    #[test]
    fn wire_bytes_are_the_wire_field_not_derived_from_the_payload() {
        let l = leaf();
        assert_eq!(l.wire_bytes(Direction::Egress), 139);
        assert_eq!(l.wire_bytes(Direction::Ingress), 98);
        assert_eq!(l.wire_bytes_both(), [139, 98]);
        // Bytes held out of order at the previous cut entered the stream in this epoch: the
        // record's 18 input bytes, but only 10 frame bytes of it were charged this epoch.
        let mut held = l;
        held.wire = [139, 10];
        assert!(held.wire_bytes(Direction::Ingress) < held.input.len);
        assert_eq!(held.wire_bytes(Direction::Ingress), 10);
        let mut all = l;
        all.wire = [u64::MAX, 0];
        assert_eq!(all.wire_bytes_both(), [u64::MAX, 0]);
    }

    #[test]
    fn json_round_trip_and_strictness() {
        let l = leaf();
        let j = serde_json::to_string(&l).unwrap();
        assert!(j.contains(r#""kind":"exchange""#), "{j}");
        assert!(j.contains(r#""local":"10.0.0.2:8000""#), "{j}");
        assert!(j.contains(r#""wire":{"egress":139,"ingress":98}"#), "{j}");
        let back: TrafficLeaf = serde_json::from_str(&j).unwrap();
        assert_eq!(back, l);
        let extra = j.replacen("{", r#"{"extra":1,"#, 1);
        assert!(serde_json::from_str::<TrafficLeaf>(&extra).is_err());
        let old = j.replace(r#""wire":"#, r#""overhead":"#);
        assert!(serde_json::from_str::<TrafficLeaf>(&old).is_err());
        let raw = j.replace("exchange", "raw_flow");
        assert_eq!(
            serde_json::from_str::<TrafficLeaf>(&raw).unwrap().kind,
            RecordKind::RawFlow
        );
    }

    #[test]
    fn empty_part_hashes_the_empty_input() {
        assert_eq!(
            hex::encode(StreamPart::empty(5).sha3_256),
            "a7ffc6f8bf1ed76651c14756a061d662f580ff4de43b49fa82d80a4b80f8434a"
        );
    }
}
