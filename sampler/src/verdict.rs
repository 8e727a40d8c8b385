//! What the replay of one opened exchange found, as stored and judged by the verifier.
//!
//! The replay service records what the model said about every token, independent of any
//! tolerance: the tokens that were not the replay's own draw with their margins, and at each
//! position the gaps of the other tokens near the winner. The verifier's appraisal applies
//! `[policy.replay] tolerance` to that ([`ExchangeReplay::judge`]), so a recheck under another
//! tolerance re-derives the verdict and the covert-channel bound from the same stored rows.

use serde::{Deserialize, Serialize};

/// Gaps up to this are kept at each position: tolerances above it are not judged exactly.
pub const NEAR_CAP: f64 = 1.0;

/// A token that is not the replay's draw.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrailingToken {
    pub position: u64,
    pub claimed: u32,
    /// The token the replay draws there.
    pub replayed: u32,
    /// How far the claimed token trails (infinite, stored as `null`, when it is not a
    /// candidate).
    #[serde(with = "finite_or_null")]
    pub margin: f64,
}

/// At one position, the gaps (≤ [`NEAR_CAP`]) of the tokens other than the winner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NearPosition {
    pub position: u64,
    pub gaps: Vec<f64>,
}

/// Why an exchange cannot be what the model served, before any token is scored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "finding", rename_all = "snake_case", deny_unknown_fields)]
pub enum StructuralFinding {
    #[error("the request is not one complete HTTP/1.1 request")]
    RequestUnframed,
    #[error("the response differs from the server's rendering at byte {offset}")]
    NotCanonical { offset: u64 },
    #[error("the response is not a completion: {problem}")]
    NotACompletion { problem: String },
    #[error("the response names model {named}; the replay has {expected} under that name")]
    OtherModel { named: String, expected: String },
    #[error(
        "the response names the sampling key of epoch {named}; a record of epoch {record} may use {record} or the one before"
    )]
    KeyEpoch { named: u64, record: u64 },
    #[error("the verifier has no sampling key for epoch {epoch}")]
    KeyUnknown { epoch: u64 },
    #[error("the response names seed {named}; the epoch's key and the request derive {derived}")]
    SeedNotDerived { named: String, derived: String },
    #[error("the token ids do not have a generation's shape: {problem}")]
    TokenShape { problem: String },
    #[error("the replay cannot run the model on it: {problem}")]
    Unreplayable { problem: String },
    #[error("{bytes} bytes were sent on an inference connection with no request pending")]
    UnrequestedOutput { bytes: u64 },
}

/// A response scored token by token against the replay's logits, tolerance-free
/// (`replay::score_response`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScoredResponse {
    pub tokens: u64,
    pub mean_logprob: f64,
    /// The tokens that are not the replay's draw, in position order.
    pub trailing: Vec<TrailingToken>,
    /// The positions where other candidates are within [`NEAR_CAP`] of the winner.
    pub near: Vec<NearPosition>,
}

impl ScoredResponse {
    /// The first token trailing the winner by more than `tolerance`.
    pub fn first_beyond(&self, tolerance: f64) -> Option<&TrailingToken> {
        first_beyond(&self.trailing, tolerance)
    }

    /// The bits a host could have hidden in this response within `tolerance`.
    pub fn covert_bits(&self, tolerance: f64) -> f64 {
        covert_bits(&self.near, tolerance)
    }
}

impl From<ScoredResponse> for ExchangeReplay {
    fn from(r: ScoredResponse) -> Self {
        ExchangeReplay::Replayed {
            tokens: r.tokens,
            mean_logprob: r.mean_logprob,
            trailing: r.trailing,
            near: r.near,
        }
    }
}

/// The first of `trailing` (by position) that trails by more than `tolerance`; NaN trails by
/// more than any tolerance.
fn first_beyond(trailing: &[TrailingToken], tolerance: f64) -> Option<&TrailingToken> {
    trailing
        .iter()
        .filter(|t| t.margin.is_nan() || t.margin > tolerance)
        .min_by_key(|t| t.position)
}

/// Σ over positions of log2(1 + the gaps within `tolerance`).
fn covert_bits(near: &[NearPosition], tolerance: f64) -> f64 {
    near.iter()
        .map(|p| {
            let n = 1 + p.gaps.iter().filter(|g| **g <= tolerance).count();
            (n as f64).log2()
        })
        .sum()
}

/// The replay of one exchange, tolerance-free.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case", deny_unknown_fields)]
pub enum ExchangeReplay {
    /// A completion whose bytes the tokens determine, scored token by token.
    Replayed {
        tokens: u64,
        mean_logprob: f64,
        trailing: Vec<TrailingToken>,
        near: Vec<NearPosition>,
    },
    /// A request answered with the fixed error it must get, or 503 (not served): nothing
    /// generated, no byte the host chose.
    FixedError {
        status: String,
    },
    /// The start of a response to a request still pending when the epoch closed: judged in
    /// full when its exchange is committed (in a later epoch, with these bytes).
    InFlight {
        output_bytes: u64,
    },
    Failed {
        finding: StructuralFinding,
    },
}

/// An exchange judged at a tolerance.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayJudgement {
    Passed {
        tokens: u64,
        /// Σ over positions of log2(tokens within the tolerance of the winner): the bits a
        /// host could have hidden in this response and still passed.
        covert_bits: f64,
    },
    NotGenerated,
    /// Output of a response still in flight at the cut: not judged here (a gap, reported).
    Unjudged {
        bytes: u64,
    },
    Failed(ReplayFailure),
}

/// Why an exchange failed its replay.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReplayFailure {
    #[error(transparent)]
    Structural(StructuralFinding),
    #[error(
        "token {}: the response has id {}, the replay draws {}; it trails by {} (tolerance {tolerance})",
        .token.position, .token.claimed, .token.replayed, .token.margin
    )]
    Diverged {
        token: TrailingToken,
        tolerance: f64,
    },
}

impl ExchangeReplay {
    /// Judges the stored replay at `tolerance`: the first token trailing by more fails it.
    pub fn judge(&self, tolerance: f64) -> ReplayJudgement {
        match self {
            ExchangeReplay::FixedError { .. } => ReplayJudgement::NotGenerated,
            ExchangeReplay::InFlight { output_bytes } => ReplayJudgement::Unjudged {
                bytes: *output_bytes,
            },
            ExchangeReplay::Failed { finding } => {
                ReplayJudgement::Failed(ReplayFailure::Structural(finding.clone()))
            }
            ExchangeReplay::Replayed {
                tokens,
                trailing,
                near,
                ..
            } => {
                if let Some(t) = first_beyond(trailing, tolerance) {
                    return ReplayJudgement::Failed(ReplayFailure::Diverged {
                        token: *t,
                        tolerance,
                    });
                }
                ReplayJudgement::Passed {
                    tokens: *tokens,
                    covert_bits: covert_bits(near, tolerance),
                }
            }
        }
    }
}

/// An `f64` that may be infinite, as JSON (which has no infinity): `null` for infinite.
mod finite_or_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
        if v.is_finite() {
            s.serialize_f64(*v)
        } else {
            s.serialize_none()
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn replayed(trailing: Vec<TrailingToken>) -> ExchangeReplay {
        ExchangeReplay::Replayed {
            tokens: 10,
            mean_logprob: -1.0,
            trailing,
            near: vec![
                NearPosition {
                    position: 2,
                    gaps: vec![0.01, 0.3],
                },
                NearPosition {
                    position: 5,
                    gaps: vec![0.02, 0.04, 0.9],
                },
            ],
        }
    }

    #[test]
    fn the_tolerance_decides_and_the_first_trailing_token_is_named() {
        let t = |position, margin| TrailingToken {
            position,
            claimed: 1,
            replayed: 2,
            margin,
        };
        let r = replayed(vec![t(7, 0.5), t(3, 0.02), t(9, f64::INFINITY)]);
        match r.judge(0.05) {
            ReplayJudgement::Failed(ReplayFailure::Diverged { token, .. }) => {
                assert_eq!(token.position, 7)
            }
            other => panic!("{other:?}"),
        }
        let clean = replayed(vec![t(3, 0.02)]);
        match clean.judge(0.05) {
            ReplayJudgement::Passed { covert_bits, .. } => {
                // position 2: 1 + 1 within 0.05 -> 1 bit; position 5: 1 + 2 -> log2 3.
                assert!((covert_bits - (1.0 + 3f64.log2())).abs() < 1e-12)
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            ExchangeReplay::InFlight { output_bytes: 9 }.judge(0.05),
            ReplayJudgement::Unjudged { bytes: 9 },
            "in-flight output is a reported gap, not a pass"
        );
        // Stored and read back, infinity included, it judges the same.
        let json = serde_json::to_string(&r).unwrap();
        assert!(json.contains("\"margin\":null"), "{json}");
        assert_eq!(serde_json::from_str::<ExchangeReplay>(&json).unwrap(), r);
    }
}
