//! An epoch's flows as committed records (the leaves of the traffic sum tree).
//!
//! - A connection to a configured inference endpoint (`[taps] inference`) is cut into HTTP/1.1
//!   exchanges: one `exchange` record per request and its response. What is not part of a
//!   complete exchange at the cut (a request still arriving, a response still streaming) is a
//!   `partial` record of the remaining bytes, and is carried into the next epoch, where the
//!   exchange it belongs to is recorded whole.
//! - Every other flow (UDP, other TCP, frames without ports, an inference connection that is
//!   not HTTP/1.1) is one `raw_flow` record per epoch: all of its bytes in each direction.
//!
//! Each record's `wire` bytes are frame bytes of its flow in this epoch. An exchange is given
//! the frame bytes of its payload that arrived in this epoch; the flow's `partial` record gets
//! the rest (headers, handshake, retransmits, bytes still pending). So the records' `wire`
//! bytes add up to the tapped bytes exactly, flow by flow.

use std::collections::HashMap;

use rackwarden_attest::traffic::{FlowKey, RecordKind, StreamPart, TrafficLeaf};

use super::{
    flows::{EpochPart, FlowEpoch},
    frame::{FlowId, PROTO_TCP},
    http,
};
use crate::config::taps::InferenceEndpoint;

/// One record: its leaf and the bytes its stream parts name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub leaf: TrafficLeaf,
    pub input: Vec<u8>,
    pub output: Vec<u8>,
}

/// The bytes of an inference connection not yet part of a complete exchange, kept across cuts.
#[derive(Debug, Default)]
struct Carry {
    input_offset: u64,
    input: Vec<u8>,
    output_offset: u64,
    output: Vec<u8>,
    /// Epochs in a row this connection carried no frame.
    idle: u32,
}

/// A connection idle this many epochs is forgotten: its unfinished bytes were committed as
/// its last epoch's `partial` record, and a later frame starts a new `raw_flow` or exchange.
const MAX_IDLE_EPOCHS: u32 = 10;

/// Cuts each epoch's flows into records, keeping inference connections' unfinished bytes.
#[derive(Default)]
pub struct RecordMaker {
    inference: Vec<InferenceEndpoint>,
    carry: HashMap<FlowId, Carry>,
}

fn key(id: &FlowId) -> FlowKey {
    FlowKey {
        proto: id.proto,
        local: id.local,
        remote: id.remote,
    }
}

impl RecordMaker {
    pub fn new(inference: Vec<InferenceEndpoint>) -> RecordMaker {
        RecordMaker {
            inference,
            carry: HashMap::new(),
        }
    }

    fn is_inference(&self, id: &FlowId) -> bool {
        id.proto == PROTO_TCP && self.inference.iter().any(|e| e.tcp_port == id.local.port())
    }

    /// The records of epoch `seq`, in flow order (and, within an inference connection, in
    /// stream order, its `partial` record last).
    pub fn records(&mut self, seq: u64, flows: Vec<FlowEpoch>) -> Vec<Record> {
        let mut out = Vec::new();
        for c in self.carry.values_mut() {
            c.idle += 1;
        }
        self.carry.retain(|_, c| c.idle <= MAX_IDLE_EPOCHS);
        for f in flows {
            if self.is_inference(&f.flow) {
                self.exchanges(seq, f, &mut out);
            } else {
                out.push(raw_flow(seq, &f.flow, f.ingress, f.egress));
            }
        }
        out
    }

    fn exchanges(&mut self, seq: u64, f: FlowEpoch, out: &mut Vec<Record>) {
        let mut carry = self.carry.remove(&f.flow).unwrap_or_else(|| Carry {
            input_offset: f.ingress.start,
            output_offset: f.egress.start,
            ..Carry::default()
        });
        // Where this epoch's new bytes start within the carried-plus-new streams.
        let (new_in, new_out) = (carry.input.len(), carry.output.len());
        carry.input.extend_from_slice(&f.ingress.bytes);
        carry.output.extend_from_slice(&f.egress.bytes);
        let split = match http::split_exchanges(&carry.input, &carry.output) {
            Ok(s) => s,
            Err(e) => {
                // Not HTTP/1.1 (or broken): the epoch's bytes are a raw flow, and the
                // connection is no longer split.
                log::warn!(
                    "tap: {:?} on an inference port is not HTTP/1.1 ({e}); recorded as a raw flow",
                    f.flow
                );
                out.push(raw_flow(seq, &f.flow, f.ingress, f.egress));
                return;
            }
        };
        // Frame bytes still to hand out, per direction (egress, ingress).
        let mut wire_left = [f.egress.wire, f.ingress.wire];
        for x in &split.exchanges {
            let req = &carry.input[x.request.clone()];
            let resp = &carry.output[x.response.clone()];
            let fresh_in = overlap(&x.request, new_in);
            let fresh_out = overlap(&x.response, new_out);
            let wire = [
                take(&mut wire_left[0], fresh_out),
                take(&mut wire_left[1], fresh_in),
            ];
            out.push(Record {
                leaf: TrafficLeaf {
                    epoch_seq: seq,
                    kind: RecordKind::Exchange,
                    flow: key(&f.flow),
                    input: StreamPart::of_bytes(carry.input_offset + x.request.start as u64, req),
                    output: StreamPart::of_bytes(
                        carry.output_offset + x.response.start as u64,
                        resp,
                    ),
                    wire,
                },
                input: req.to_vec(),
                output: resp.to_vec(),
            });
        }
        let rest_in = carry.input.split_off(split.input_used);
        let rest_out = carry.output.split_off(split.output_used);
        let rest = Carry {
            input_offset: carry.input_offset + split.input_used as u64,
            input: rest_in,
            output_offset: carry.output_offset + split.output_used as u64,
            output: rest_out,
            idle: 0,
        };
        // The partial record: what remains, and every frame byte not given to an exchange.
        if wire_left != [0, 0] || !rest.input.is_empty() || !rest.output.is_empty() {
            out.push(Record {
                leaf: TrafficLeaf {
                    epoch_seq: seq,
                    kind: RecordKind::Partial,
                    flow: key(&f.flow),
                    input: StreamPart::of_bytes(rest.input_offset, &rest.input),
                    output: StreamPart::of_bytes(rest.output_offset, &rest.output),
                    wire: wire_left,
                },
                input: rest.input.clone(),
                output: rest.output.clone(),
            });
        }
        self.carry.insert(f.flow, rest);
    }
}

/// How many bytes of `range` lie at or after `fresh_from` (this epoch's new bytes).
fn overlap(range: &std::ops::Range<usize>, fresh_from: usize) -> u64 {
    range.end.saturating_sub(range.start.max(fresh_from)) as u64
}

/// Takes up to `want` from `left`.
fn take(left: &mut u64, want: u64) -> u64 {
    let n = want.min(*left);
    *left -= n;
    n
}

fn raw_flow(seq: u64, id: &FlowId, ingress: EpochPart, egress: EpochPart) -> Record {
    Record {
        leaf: TrafficLeaf {
            epoch_seq: seq,
            kind: RecordKind::RawFlow,
            flow: key(id),
            input: StreamPart::of_bytes(ingress.start, &ingress.bytes),
            output: StreamPart::of_bytes(egress.start, &egress.bytes),
            wire: [egress.wire, ingress.wire],
        },
        input: ingress.bytes,
        output: egress.bytes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(start: u64, bytes: &[u8], wire: u64) -> EpochPart {
        EpochPart {
            start,
            bytes: bytes.to_vec(),
            wire,
            ..EpochPart::default()
        }
    }

    fn served(port: u16) -> FlowId {
        FlowId {
            proto: PROTO_TCP,
            local: format!("10.0.0.1:{port}").parse().unwrap(),
            remote: "10.0.0.2:40000".parse().unwrap(),
        }
    }

    const REQ: &[u8] = b"POST /v1/completions HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi";
    const RESP: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nyes";

    fn wire_sum(r: &[Record]) -> [u64; 2] {
        r.iter().fold([0, 0], |a, r| {
            [a[0] + r.leaf.wire[0], a[1] + r.leaf.wire[1]]
        })
    }

    #[test]
    fn an_exchange_split_by_the_cut_is_recorded_whole_in_the_epoch_it_completes() {
        let mut m = RecordMaker::new(vec![InferenceEndpoint { tcp_port: 8000 }]);
        let id = served(8000);
        // Epoch 1: the request and half the response.
        let e1 = FlowEpoch {
            flow: id,
            ingress: part(0, REQ, 400),
            egress: part(0, &RESP[..10], 300),
            held: [0, 0],
        };
        let r1 = m.records(1, vec![e1]);
        assert_eq!(r1.len(), 1);
        assert_eq!(r1[0].leaf.kind, RecordKind::Partial);
        assert_eq!(wire_sum(&r1), [300, 400], "every frame byte is in a record");
        // Epoch 2: the rest of the response.
        let e2 = FlowEpoch {
            flow: id,
            ingress: part(REQ.len() as u64, b"", 66),
            egress: part(10, &RESP[10..], 200),
            held: [0, 0],
        };
        let r2 = m.records(2, vec![e2]);
        let x = &r2[0];
        assert_eq!(x.leaf.kind, RecordKind::Exchange);
        assert_eq!((x.input.as_slice(), x.output.as_slice()), (REQ, RESP));
        assert_eq!((x.leaf.input.offset, x.leaf.output.offset), (0, 0));
        assert_eq!(
            x.leaf.wire,
            [(RESP.len() - 10) as u64, 0],
            "only the bytes that arrived now"
        );
        assert_eq!(wire_sum(&r2), [200, 66]);
    }

    #[test]
    fn other_flows_are_raw_and_broken_http_falls_back_to_raw() {
        let mut m = RecordMaker::new(vec![InferenceEndpoint { tcp_port: 8000 }]);
        let raw = FlowEpoch {
            flow: served(22),
            ingress: part(0, b"ssh", 100),
            egress: part(0, b"SSH-2.0", 120),
            held: [0, 0],
        };
        let junk = FlowEpoch {
            flow: served(8000),
            ingress: part(0, b"\x16\x03\x01 not http", 90),
            egress: part(0, b"", 60),
            held: [0, 0],
        };
        let r = m.records(7, vec![raw, junk]);
        assert_eq!(r.len(), 2);
        assert!(r.iter().all(|r| r.leaf.kind == RecordKind::RawFlow));
        assert_eq!(wire_sum(&r), [180, 190]);
        assert_eq!(r[0].input, b"ssh");
    }
}
