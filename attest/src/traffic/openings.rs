//! Sampling after commitment, on the wire: what the verifier demands of an epoch once it has
//! stored its root ([`SampleDemand`]), what the host answers, signed ([`EpochOpenings`]), how
//! the verifier checks the answer ([`EpochOpenings::check`]), and how the host's next
//! statement names the answers the verifier acknowledged ([`OpeningsRef`]).
//!
//! A record covering several drawn offsets is sent once: the answer is the set of records
//! the drawn offsets land in, each with its path and bytes, and the verifier finds, for each
//! offset it drew, the one record whose byte range the root fixes there. A record no drawn
//! offset lands in is refused: the host sends what was asked, no more.

use std::ops::Range;

use serde::{Deserialize, Serialize};

use super::{
    OpeningError, SumPath, TrafficLeaf, TrafficRoot, idx, sample_offsets, summary::bytes_of,
    verified_ranges, wire,
};
use crate::evidence::Direction;

/// The DSSE payload type of a signed [`EpochOpenings`].
pub const OPENINGS_PAYLOAD_TYPE: &str = "application/vnd.rackwarden.traffic-openings+json";

/// The verifier's demand for one epoch, drawn after it stored the epoch's root: `k` offsets
/// per direction from `randomness` ([`sample_offsets`]), to be answered by `deadline_ms` (the
/// verifier's clock).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SampleDemand {
    pub epoch_seq: u64,
    #[serde(with = "wire::hex32")]
    pub randomness: [u8; 32],
    pub per_direction: u32,
    pub deadline_ms: u64,
}

impl SampleDemand {
    /// The offsets drawn, per direction in [`Direction::ALL`] order, for the epoch of `root`.
    pub fn offsets(&self, root: &TrafficRoot) -> [(Direction, Vec<u64>); 2] {
        Direction::ALL.map(|d| {
            (
                d,
                sample_offsets(&self.randomness, root, d, self.per_direction),
            )
        })
    }
}

/// One opened record: the record, its path in the epoch's sum tree, and its bytes (standard
/// base64 with padding, exactly the lengths the leaf names).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenedRecord {
    pub leaf: TrafficLeaf,
    pub path: SumPath,
    pub input_base64: String,
    pub output_base64: String,
}

/// The host's answer to a [`SampleDemand`]: every record a drawn offset lands in, once, in
/// leaf order. Signed by the host key as a DSSE envelope of [`OPENINGS_PAYLOAD_TYPE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EpochOpenings {
    pub rack: String,
    pub host: String,
    pub epoch_seq: u64,
    /// The root the host's statement for `epoch_seq` committed.
    pub root: TrafficRoot,
    pub records: Vec<OpenedRecord>,
}

/// A record as checked: its index in the epoch's tree, the leaf, and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedRecord {
    pub index: u64,
    pub leaf: TrafficLeaf,
    pub input: Vec<u8>,
    pub output: Vec<u8>,
}

/// Why an [`EpochOpenings`] is refused: the first thing that does not hold.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpeningsRefused {
    #[error(
        "the openings are for {rack}/{host}; the signing key is {expected_rack}/{expected_host}'s"
    )]
    Host {
        rack: String,
        host: String,
        expected_rack: String,
        expected_host: String,
    },
    #[error("the openings are for epoch {got}; the demand is for epoch {expected}")]
    Epoch { expected: u64, got: u64 },
    #[error(
        "the openings name root {}, not the {} the statement for epoch {seq} committed",
        hex::encode(.got),
        hex::encode(.expected)
    )]
    Root {
        seq: u64,
        expected: [u8; 32],
        got: [u8; 32],
    },
    #[error("opened record {position} (tree index {index}): {error}")]
    Record {
        position: usize,
        index: u64,
        error: OpeningError,
    },
    #[error("record {index} is opened twice")]
    Duplicate { index: u64 },
    #[error("no opened record covers the drawn {} offset {offset}", .dir.name())]
    NotOpened { dir: Direction, offset: u64 },
    #[error("record {index} was opened but no drawn offset lands in it")]
    NotDrawn { index: u64 },
}

/// The flows of the raw-flow records among `checked`, each once, in order.
pub fn raw_flows(checked: &[CheckedRecord]) -> Vec<super::FlowKey> {
    let mut flows: Vec<super::FlowKey> = Vec::new();
    for c in checked {
        if c.leaf.kind == super::RecordKind::RawFlow && !flows.contains(&c.leaf.flow) {
            flows.push(c.leaf.flow);
        }
    }
    flows
}

impl EpochOpenings {
    /// Checks the answer against the demand and the root the verifier stored for the epoch,
    /// for the host the signing key belongs to: the host and epoch, the root, each record
    /// (its own epoch, its path to the root, its bytes against the leaf), and that the
    /// records are exactly those the drawn offsets land in. Returns the records checked, in
    /// the order sent.
    pub fn check(
        &self,
        rack: &str,
        host: &str,
        root: &TrafficRoot,
        demand: &SampleDemand,
    ) -> Result<Vec<CheckedRecord>, OpeningsRefused> {
        if self.rack != rack || self.host != host {
            return Err(OpeningsRefused::Host {
                rack: self.rack.clone(),
                host: self.host.clone(),
                expected_rack: rack.into(),
                expected_host: host.into(),
            });
        }
        if self.epoch_seq != demand.epoch_seq {
            return Err(OpeningsRefused::Epoch {
                expected: demand.epoch_seq,
                got: self.epoch_seq,
            });
        }
        if self.root != *root {
            return Err(OpeningsRefused::Root {
                seq: demand.epoch_seq,
                expected: root.sha3_256,
                got: self.root.sha3_256,
            });
        }
        let mut checked = Vec::with_capacity(self.records.len());
        let mut ranges: Vec<[Range<u64>; 2]> = Vec::with_capacity(self.records.len());
        for (position, r) in self.records.iter().enumerate() {
            let index = r.path.index;
            let refuse = |error| OpeningsRefused::Record {
                position,
                index,
                error,
            };
            if r.leaf.epoch_seq != demand.epoch_seq {
                return Err(refuse(OpeningError::Epoch {
                    expected: demand.epoch_seq,
                    got: r.leaf.epoch_seq,
                }));
            }
            if checked.iter().any(|c: &CheckedRecord| c.index == index) {
                return Err(OpeningsRefused::Duplicate { index });
            }
            ranges.push(verified_ranges(root, &r.leaf, &r.path).map_err(refuse)?);
            let input = bytes_of("input", &r.input_base64, &r.leaf.input).map_err(refuse)?;
            let output = bytes_of("output", &r.output_base64, &r.leaf.output).map_err(refuse)?;
            checked.push(CheckedRecord {
                index,
                leaf: r.leaf,
                input,
                output,
            });
        }
        let mut drawn = vec![false; checked.len()];
        for (dir, offsets) in demand.offsets(root) {
            for offset in offsets {
                let at = ranges
                    .iter()
                    .position(|r| r[idx(dir)].contains(&offset))
                    .ok_or(OpeningsRefused::NotOpened { dir, offset })?;
                drawn[at] = true;
            }
        }
        if let Some(at) = drawn.iter().position(|d| !d) {
            return Err(OpeningsRefused::NotDrawn {
                index: checked[at].index,
            });
        }
        Ok(checked)
    }
}

/// What a statement names of the openings the verifier acknowledged since the host's
/// previous statement: the epoch and the SHA3-256 of the envelope's bytes as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpeningsRef {
    pub epoch_seq: u64,
    #[serde(with = "wire::hex32")]
    pub sha3_256: [u8; 32],
}

/// The answer to `POST /v1/openings`: the verifier's check of the envelope, kept with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpeningsReceipt {
    pub epoch_seq: u64,
    /// SHA3-256 of the envelope's bytes as received (what the next statement names).
    #[serde(with = "wire::hex32")]
    pub sha3_256: [u8; 32],
    pub outcome: OpeningsOutcome,
}

/// What the verifier made of an epoch's openings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum OpeningsOutcome {
    /// Every drawn offset is answered by its record, with the record's bytes. `raw_flows`:
    /// the flows of the opened raw-flow records (each once), which the policy's allowlist
    /// judges.
    Matched {
        records: u64,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        raw_flows: Vec<super::FlowKey>,
    },
    /// Refused: why.
    Refused { reason: String },
}

#[cfg(test)]
mod tests {
    use base64::{Engine as _, engine::general_purpose::STANDARD};

    use super::*;
    use crate::traffic::{FlowKey, RecordKind, StreamPart, SumTree};

    const SEQ: u64 = 9;

    /// Each record's (input, output) bytes.
    type Payloads = Vec<(Vec<u8>, Vec<u8>)>;

    /// Three records of one epoch with their bytes; the middle one weighs the most.
    fn epoch() -> (Vec<TrafficLeaf>, Payloads) {
        let bytes: Payloads = vec![
            (
                b"GET / HTTP/1.1\r\n\r\n".to_vec(),
                b"HTTP/1.1 200 OK\r\n\r\n".to_vec(),
            ),
            (vec![7u8; 3000], vec![1u8; 40]),
            (b"q".to_vec(), b"".to_vec()),
        ];
        let leaves = bytes
            .iter()
            .enumerate()
            .map(|(i, (input, output))| TrafficLeaf {
                epoch_seq: SEQ,
                kind: if i == 1 {
                    RecordKind::RawFlow
                } else {
                    RecordKind::Exchange
                },
                flow: FlowKey {
                    proto: 6,
                    local: "10.0.0.2:8000".parse().unwrap(),
                    remote: format!("10.0.0.9:{}", 50000 + i).parse().unwrap(),
                },
                input: StreamPart::of_bytes(0, input),
                output: StreamPart::of_bytes(0, output),
                wire: [output.len() as u64 + 54, input.len() as u64 + 54],
            })
            .collect();
        (leaves, bytes)
    }

    /// The honest answer to `demand`.
    fn answer(demand: &SampleDemand) -> (EpochOpenings, TrafficRoot) {
        let (leaves, bytes) = epoch();
        let tree = SumTree::build(&leaves).unwrap();
        let root = tree.root();
        let mut wanted: Vec<usize> = demand
            .offsets(&root)
            .iter()
            .flat_map(|(d, offs)| offs.iter().map(|o| tree.locate(*d, *o).unwrap()))
            .collect();
        wanted.sort();
        wanted.dedup();
        let records = wanted
            .into_iter()
            .map(|i| OpenedRecord {
                leaf: leaves[i],
                path: tree.open(i).unwrap(),
                input_base64: STANDARD.encode(&bytes[i].0),
                output_base64: STANDARD.encode(&bytes[i].1),
            })
            .collect();
        (
            EpochOpenings {
                rack: "r1".into(),
                host: "h1".into(),
                epoch_seq: SEQ,
                root,
                records,
            },
            root,
        )
    }

    fn demand(r: u8, k: u32) -> SampleDemand {
        SampleDemand {
            epoch_seq: SEQ,
            randomness: [r; 32],
            per_direction: k,
            deadline_ms: 1,
        }
    }

    #[test]
    fn an_honest_answer_passes_and_sends_each_record_once() {
        for r in 0..20u8 {
            let d = demand(r, 8);
            let (o, root) = answer(&d);
            let checked = o.check("r1", "h1", &root, &d).unwrap();
            assert_eq!(checked.len(), o.records.len());
            assert!(checked.len() <= 3);
            let (_, bytes) = epoch();
            for c in &checked {
                assert_eq!((c.input.clone(), c.output.clone()), bytes[c.index as usize]);
            }
            // JSON both ways, unknown fields refused.
            let j = serde_json::to_string(&o).unwrap();
            assert_eq!(serde_json::from_str::<EpochOpenings>(&j).unwrap(), o);
            assert!(
                serde_json::from_str::<EpochOpenings>(&j.replacen('{', "{\"x\":1,", 1)).is_err()
            );
        }
    }

    #[test]
    fn each_tampering_is_refused_with_its_reason() {
        let d = demand(3, 8);
        let (good, root) = answer(&d);
        let check = |o: &EpochOpenings| o.check("r1", "h1", &root, &d);
        assert!(good.records.len() >= 2, "the heavy record and another");

        // One byte changed.
        let mut o = good.clone();
        let mut b = STANDARD.decode(&o.records[0].input_base64).unwrap();
        b[0] ^= 1;
        o.records[0].input_base64 = STANDARD.encode(&b);
        assert!(matches!(
            check(&o),
            Err(OpeningsRefused::Record {
                position: 0,
                error: OpeningError::BytesDigest { which: "input" },
                ..
            })
        ));
        // Another record's bytes under this leaf.
        let mut o = good.clone();
        o.records[0].output_base64 = o.records[1].output_base64.clone();
        o.records[0].input_base64 = o.records[1].input_base64.clone();
        assert!(matches!(
            check(&o),
            Err(OpeningsRefused::Record { position: 0, .. })
        ));
        // A forged path.
        let mut o = good.clone();
        o.records[1].path.siblings[0].bytes[0] += 1;
        assert!(matches!(
            check(&o),
            Err(OpeningsRefused::Record {
                position: 1,
                error: OpeningError::HashMismatch { .. },
                ..
            })
        ));
        // A record withheld: its offsets are unanswered.
        let mut o = good.clone();
        o.records.remove(0);
        assert!(matches!(check(&o), Err(OpeningsRefused::NotOpened { .. })));
        // A record sent twice.
        let mut o = good.clone();
        o.records.push(o.records[0].clone());
        assert!(matches!(check(&o), Err(OpeningsRefused::Duplicate { .. })));
        // Another epoch, another root, another host.
        let mut o = good.clone();
        o.epoch_seq += 1;
        assert!(matches!(check(&o), Err(OpeningsRefused::Epoch { .. })));
        let mut o = good.clone();
        o.root.sha3_256[0] ^= 1;
        assert!(matches!(check(&o), Err(OpeningsRefused::Root { .. })));
        assert!(matches!(
            good.check("r1", "h2", &root, &d),
            Err(OpeningsRefused::Host { .. })
        ));
    }

    #[test]
    fn a_record_nobody_drew_is_refused() {
        // k = 1: one offset per direction, so at most two of the three records are drawn.
        let d = demand(5, 1);
        let (mut o, root) = answer(&d);
        let (leaves, bytes) = epoch();
        let tree = SumTree::build(&leaves).unwrap();
        let extra = (0..3u64)
            .find(|i| !o.records.iter().any(|r| r.path.index == *i))
            .expect("a record not drawn");
        let i = extra as usize;
        o.records.push(OpenedRecord {
            leaf: leaves[i],
            path: tree.open(i).unwrap(),
            input_base64: STANDARD.encode(&bytes[i].0),
            output_base64: STANDARD.encode(&bytes[i].1),
        });
        assert_eq!(
            o.check("r1", "h1", &root, &d),
            Err(OpeningsRefused::NotDrawn { index: extra })
        );
    }

    #[test]
    fn the_wire_forms() {
        let d = SampleDemand {
            epoch_seq: 4,
            randomness: [0xab; 32],
            per_direction: 8,
            deadline_ms: 1000,
        };
        let j = serde_json::to_string(&d).unwrap();
        assert_eq!(
            j,
            format!(
                "{{\"epoch_seq\":4,\"randomness\":\"{}\",\"per_direction\":8,\"deadline_ms\":1000}}",
                "ab".repeat(32)
            )
        );
        assert_eq!(serde_json::from_str::<SampleDemand>(&j).unwrap(), d);
        let r = OpeningsReceipt {
            epoch_seq: 4,
            sha3_256: [1; 32],
            outcome: OpeningsOutcome::Refused {
                reason: "no".into(),
            },
        };
        let j = serde_json::to_string(&r).unwrap();
        assert!(
            j.contains("\"outcome\":{\"status\":\"refused\",\"reason\":\"no\"}"),
            "{j}"
        );
        assert_eq!(serde_json::from_str::<OpeningsReceipt>(&j).unwrap(), r);
    }

    proptest::proptest! {
        /// No single-byte change of an honest answer's JSON passes the check with other
        /// content: it fails to parse, is refused, or parses to the same answer (a spelling
        /// the parser maps to the same value).
        #[test]
        fn no_one_byte_change_passes_with_other_content(at in 0usize..100_000, byte in 0u8..=255) {
            let d = demand(3, 8);
            let (good, root) = answer(&d);
            let mut json = serde_json::to_vec(&good).unwrap();
            let at = at % json.len();
            proptest::prop_assume!(json[at] != byte);
            json[at] = byte;
            if let Ok(o) = serde_json::from_slice::<EpochOpenings>(&json)
                && o.check("r1", "h1", &root, &d).is_ok()
            {
                proptest::prop_assert_eq!(o, good);
            }
        }
    }
}
