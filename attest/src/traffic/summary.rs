//! What travels: what a statement says of its epoch's traffic ([`TrafficSummary`]), and what
//! the host sends for one sampled offset ([`Opening`]). The JSON forms are in
//! `docs/traffic-format.md` ("What a statement carries", "What an opening carries").

use base64::{Engine as _, engine::general_purpose::STANDARD};
use serde::{Deserialize, Serialize};

use super::{OpeningError, SumPath, TrafficLeaf, TrafficRoot, idx, verify_opening, wire};
use crate::{Digest, Sha3_256, evidence::Direction};

/// How the epoch began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EpochStart {
    /// The epoch follows the previous one: every byte the kernel passed since the daemon
    /// first started counting is in this epoch or an earlier one.
    Resumed,
    /// The first epoch after the daemon first started counting: bytes passed before it are in
    /// no epoch.
    FirstStart,
}

/// Frames and their bytes (`skb->len`), per direction (egress, ingress).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DropCount {
    #[serde(with = "wire::per_dir")]
    pub frames: [u64; 2],
    #[serde(with = "wire::per_dir")]
    pub bytes: [u64; 2],
}

/// What the tap dropped in the epoch, by reason: frames the kernel passed whose bytes the
/// reader never got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TapDrops {
    /// The ring to the reader was full.
    pub ring_full: DropCount,
    /// The frame was larger than a ring slot.
    pub too_large: DropCount,
    /// The frame's bytes could not be read from the packet.
    pub unreadable: DropCount,
}

/// What a statement says of its epoch's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrafficSummary {
    /// The sum tree's root: the records, and per direction the bytes the reader got (the
    /// *tapped* bytes).
    pub root: TrafficRoot,
    /// Per direction, the bytes the kernel passed in the epoch.
    #[serde(with = "wire::per_dir")]
    pub passed: [u64; 2],
    /// Per direction, `passed - root.bytes`: bytes the kernel passed that the reader never
    /// got, so that no record covers them.
    #[serde(with = "wire::per_dir")]
    pub unaccounted: [u64; 2],
    /// What the tap dropped in the epoch, by reason.
    pub tap_drops: TapDrops,
    /// Per direction, the TCP stream bytes held out of order at the epoch's cut: their frames
    /// are counted in this epoch, and they enter the streams (the records' payload) of the
    /// next one.
    #[serde(with = "wire::per_dir")]
    pub held: [u64; 2],
    /// How the epoch began.
    pub start: EpochStart,
}

/// Why a [`TrafficSummary`] does not add up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SummaryError {
    #[error("the tree holds {tapped} {} bytes; the kernel passed only {passed}", .dir.name())]
    TappedExceedsPassed {
        dir: Direction,
        passed: u64,
        tapped: u64,
    },
    #[error(
        "{} bytes passed {passed} - tapped {tapped} = {expected}, but the summary says {got} are unaccounted",
        .dir.name()
    )]
    Unaccounted {
        dir: Direction,
        passed: u64,
        tapped: u64,
        expected: u64,
        got: u64,
    },
}

impl TrafficSummary {
    /// Checks the one identity inside a summary: per direction, `unaccounted` is `passed`
    /// less the tree's bytes (which cannot exceed `passed`). Whether `passed` is the kernel's
    /// count is for the evidence, not for the summary.
    pub fn check(&self) -> Result<(), SummaryError> {
        for dir in Direction::ALL {
            let i = idx(dir);
            let (passed, tapped) = (self.passed[i], self.root.bytes[i]);
            let expected = passed
                .checked_sub(tapped)
                .ok_or(SummaryError::TappedExceedsPassed {
                    dir,
                    passed,
                    tapped,
                })?;
            if self.unaccounted[i] != expected {
                return Err(SummaryError::Unaccounted {
                    dir,
                    passed,
                    tapped,
                    expected,
                    got: self.unaccounted[i],
                });
            }
        }
        Ok(())
    }
}

/// One opened record: what the host sends for a sampled offset.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Opening {
    pub epoch_seq: u64,
    /// The direction the sampled offset is in.
    pub direction: Direction,
    /// The sampled offset, in `direction`'s bytes of the epoch.
    pub offset: u64,
    pub leaf: TrafficLeaf,
    pub path: SumPath,
    /// The record's input bytes (exactly `leaf.input.len` bytes), standard base64 with
    /// padding.
    pub input_base64: String,
    /// The record's output bytes (exactly `leaf.output.len` bytes), standard base64 with
    /// padding.
    pub output_base64: String,
}

impl Opening {
    /// Everything a verifier checks without the host, in this order: the epoch (the
    /// opening's and the record's are `expected_epoch`), the path against `root` and the
    /// offset inside the record ([`verify_opening`]), and each byte string (input, then
    /// output) against the record's length and SHA3-256 digest. Returns the decoded input
    /// and output bytes.
    ///
    /// Left to the caller: that `offset` and `direction` are ones it drew
    /// ([`sample_offsets`](super::sample_offsets)), and that `root` is the one the statement
    /// for `expected_epoch` carries.
    pub fn check(
        &self,
        root: &TrafficRoot,
        expected_epoch: u64,
    ) -> Result<(Vec<u8>, Vec<u8>), OpeningError> {
        for got in [self.epoch_seq, self.leaf.epoch_seq] {
            if got != expected_epoch {
                return Err(OpeningError::Epoch {
                    expected: expected_epoch,
                    got,
                });
            }
        }
        verify_opening(root, &self.leaf, &self.path, self.direction, self.offset)?;
        let input = bytes_of("input", &self.input_base64, &self.leaf.input)?;
        let output = bytes_of("output", &self.output_base64, &self.leaf.output)?;
        Ok((input, output))
    }
}

/// The bytes of `encoded`, if they are exactly the bytes `part` describes.
pub(super) fn bytes_of(
    which: &'static str,
    encoded: &str,
    part: &super::StreamPart,
) -> Result<Vec<u8>, OpeningError> {
    // STANDARD refuses missing padding and non-zero trailing bits: one spelling per string.
    let bytes = STANDARD.decode(encoded).map_err(|e| OpeningError::Base64 {
        which,
        detail: e.to_string(),
    })?;
    let got = bytes.len() as u64;
    if got != part.len {
        return Err(OpeningError::BytesLength {
            which,
            expected: part.len,
            got,
        });
    }
    if <[u8; 32]>::from(Sha3_256::digest(&bytes)) != part.sha3_256 {
        return Err(OpeningError::BytesDigest { which });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::traffic::{FlowKey, RecordKind, StreamPart, SumTree};

    fn summary() -> TrafficSummary {
        TrafficSummary {
            root: TrafficRoot {
                sha3_256: [0x5a; 32],
                bytes: [1000, 2000],
                records: 4,
            },
            passed: [1100, 2000],
            unaccounted: [100, 0],
            tap_drops: TapDrops {
                ring_full: DropCount {
                    frames: [1, 0],
                    bytes: [100, 0],
                },
                ..TapDrops::default()
            },
            held: [0, 1448],
            start: EpochStart::Resumed,
        }
    }

    #[test]
    fn summary_json_round_trip_and_strictness() {
        let s = summary();
        let j = serde_json::to_string(&s).unwrap();
        assert_eq!(
            j,
            format!(
                concat!(
                    r#"{{"root":{{"sha3_256":"{}","bytes":{{"egress":1000,"ingress":2000}},"records":4}},"#,
                    r#""passed":{{"egress":1100,"ingress":2000}},"unaccounted":{{"egress":100,"ingress":0}},"#,
                    r#""tap_drops":{{"ring_full":{{"frames":{{"egress":1,"ingress":0}},"bytes":{{"egress":100,"ingress":0}}}},"#,
                    r#""too_large":{{"frames":{{"egress":0,"ingress":0}},"bytes":{{"egress":0,"ingress":0}}}},"#,
                    r#""unreadable":{{"frames":{{"egress":0,"ingress":0}},"bytes":{{"egress":0,"ingress":0}}}}}},"#,
                    r#""held":{{"egress":0,"ingress":1448}},"start":"resumed"}}"#
                ),
                "5a".repeat(32)
            )
        );
        assert_eq!(serde_json::from_str::<TrafficSummary>(&j).unwrap(), s);
        let first = j.replace(r#""resumed""#, r#""first_start""#);
        assert_eq!(
            serde_json::from_str::<TrafficSummary>(&first)
                .unwrap()
                .start,
            EpochStart::FirstStart
        );
        for bad in [
            j.replacen('{', r#"{"x":1,"#, 1),
            j.replace(r#""ring_full":{"#, r#""ring_full":{"x":1,"#),
            j.replace(r#""tap_drops":{"#, r#""tap_drops":{"x":{"frames":{"egress":0,"ingress":0},"bytes":{"egress":0,"ingress":0}},"#),
            j.replace(r#""resumed""#, r#""Resumed""#),
            j.replace(r#","start":"resumed""#, ""),
        ] {
            assert!(serde_json::from_str::<TrafficSummary>(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn summary_identity() {
        let s = summary();
        s.check().unwrap();
        let mut off = s;
        off.unaccounted[1] = 1;
        assert_eq!(
            off.check(),
            Err(SummaryError::Unaccounted {
                dir: Direction::Ingress,
                passed: 2000,
                tapped: 2000,
                expected: 0,
                got: 1
            })
        );
        let mut over = s;
        over.passed[0] = 999;
        assert_eq!(
            over.check(),
            Err(SummaryError::TappedExceedsPassed {
                dir: Direction::Egress,
                passed: 999,
                tapped: 1000
            })
        );
    }

    fn one_record() -> (TrafficLeaf, TrafficRoot) {
        let leaf = TrafficLeaf {
            epoch_seq: 5,
            kind: RecordKind::Exchange,
            flow: FlowKey {
                proto: 6,
                local: "10.0.0.2:8000".parse().unwrap(),
                remote: "10.0.0.9:51234".parse().unwrap(),
            },
            input: StreamPart::of_bytes(0, b"ping"),
            output: StreamPart::of_bytes(0, b""),
            wire: [54, 58],
        };
        let root = SumTree::build(&[leaf]).unwrap().root();
        (leaf, root)
    }

    #[test]
    fn base64_has_one_spelling() {
        let (leaf, root) = one_record();
        let good = Opening {
            epoch_seq: 5,
            direction: Direction::Ingress,
            offset: 3,
            leaf,
            path: SumTree::build(&[leaf]).unwrap().open(0).unwrap(),
            input_base64: "cGluZw==".into(),
            output_base64: String::new(),
        };
        assert_eq!(good.check(&root, 5).unwrap(), (b"ping".to_vec(), vec![]));
        for bad in [
            "cGluZw",
            "cGluZx==",
            "cGlu Zw==",
            "cGluZw=",
            "cGluZw===",
            "cGluZw-=",
        ] {
            let o = Opening {
                input_base64: bad.into(),
                ..good.clone()
            };
            assert!(
                matches!(
                    o.check(&root, 5),
                    Err(OpeningError::Base64 { which: "input", .. })
                ),
                "{bad}: {:?}",
                o.check(&root, 5)
            );
        }
        let o = Opening {
            output_base64: "=".into(),
            ..good.clone()
        };
        assert!(matches!(
            o.check(&root, 5),
            Err(OpeningError::Base64 {
                which: "output",
                ..
            })
        ));
    }

    #[test]
    fn the_record_epoch_is_checked_too() {
        let (mut leaf, _) = one_record();
        leaf.epoch_seq = 6;
        let tree = SumTree::build(&[leaf]).unwrap();
        let o = Opening {
            epoch_seq: 5,
            direction: Direction::Ingress,
            offset: 0,
            leaf,
            path: tree.open(0).unwrap(),
            input_base64: "cGluZw==".into(),
            output_base64: String::new(),
        };
        assert_eq!(
            o.check(&tree.root(), 5),
            Err(OpeningError::Epoch {
                expected: 5,
                got: 6
            })
        );
    }
}
