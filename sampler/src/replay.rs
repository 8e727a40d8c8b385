//! Judging a response against a replay: the scores of each claimed token under the replay's
//! logits ([`score_response`], [`judge`]), and what the tolerance leaves a dishonest host
//! ([`covert_choices`]).
//!
//! The replay's logits come from running the precommitted model over the request and the
//! claimed response in one teacher-forced pass (the verifier's replay service); this module
//! only needs them, one row per generated position.

use super::verdict::{NEAR_CAP, NearPosition, ScoredResponse, TrailingToken};
use super::{SamplerError, SamplingParams, Seed, check_token, perturbed, score_among, winner};

/// Where a response first leaves what the replay accepts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Divergence {
    pub position: u64,
    pub claimed: u32,
    /// The token the replay draws there.
    pub replayed: u32,
    pub margin: f64,
}

/// The replay's verdict on one response.
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayVerdict {
    pub tokens: usize,
    /// Tokens that are not the replay's draw (margin above 0).
    pub differing: usize,
    /// The largest margin of any token (0 for a response the replay reproduces exactly).
    pub max_margin: f64,
    /// The mean log probability of the claimed tokens under the replay's logits.
    pub mean_logprob: f64,
    /// The first token whose margin exceeds the tolerance, if any.
    pub first_divergence: Option<Divergence>,
}

impl ReplayVerdict {
    pub fn passed(&self) -> bool {
        self.first_divergence.is_none()
    }
}

/// Scores every claimed token (`claimed[i]` at position `i`) against the replay's
/// `logits[i]` with the request's seed, tolerance-free: the tokens that are not the replay's
/// draw with their margins, and at each position the gaps (up to [`NEAR_CAP`]) of the other
/// candidates to the winner. The candidates' perturbed logits are drawn once per position.
pub fn score_response(
    params: &SamplingParams,
    seed: &Seed,
    logits: &[Vec<f32>],
    claimed: &[u32],
) -> Result<ScoredResponse, SamplerError> {
    if claimed.len() != logits.len() {
        return Err(SamplerError::Length {
            tokens: claimed.len(),
            rows: logits.len(),
        });
    }
    let (mut trailing, mut near, mut logprob) = (Vec::new(), Vec::new(), 0.0);
    for (i, (row, id)) in logits.iter().zip(claimed).enumerate() {
        let position = i as u64;
        check_token(row, *id)?;
        let values = perturbed(params, seed, position, row)?;
        let s = score_among(params, row, &values, *id);
        logprob += s.logprob;
        if s.margin.is_nan() || s.margin > 0.0 {
            trailing.push(TrailingToken {
                position,
                claimed: *id,
                replayed: s.winner,
                margin: s.margin,
            });
        }
        let best = values
            .iter()
            .find(|(t, _)| *t == s.winner)
            .map_or(f64::NEG_INFINITY, |(_, v)| *v);
        let mut gaps: Vec<f64> = values
            .iter()
            .filter(|(t, _)| *t != s.winner)
            .map(|(_, v)| best - v)
            .filter(|g| *g <= NEAR_CAP)
            .collect();
        if !gaps.is_empty() {
            gaps.sort_by(|a, b| a.total_cmp(b));
            near.push(NearPosition { position, gaps });
        }
    }
    Ok(ScoredResponse {
        tokens: claimed.len() as u64,
        mean_logprob: if claimed.is_empty() {
            0.0
        } else {
            logprob / claimed.len() as f64
        },
        trailing,
        near,
    })
}

/// Judges a response at `tolerance` ([`score_response`], then the first token trailing by
/// more than it).
pub fn judge(
    params: &SamplingParams,
    seed: &Seed,
    logits: &[Vec<f32>],
    claimed: &[u32],
    tolerance: f64,
) -> Result<ReplayVerdict, SamplerError> {
    let r = score_response(params, seed, logits, claimed)?;
    Ok(ReplayVerdict {
        tokens: claimed.len(),
        differing: r.trailing.iter().filter(|t| t.margin > 0.0).count(),
        max_margin: r.trailing.iter().fold(0.0, |m, t| m.max(t.margin)),
        mean_logprob: r.mean_logprob,
        first_divergence: r.first_beyond(tolerance).map(|t| Divergence {
            position: t.position,
            claimed: t.claimed,
            replayed: t.replayed,
            margin: t.margin,
        }),
    })
}

/// The tokens a host could put at `position` and still pass: those whose margin against
/// the replay's draw is within `tolerance` (tokens outside the candidates have none).
/// `log2` of their count is the covert channel the tolerance leaves at that position.
pub fn covert_choices(
    params: &SamplingParams,
    seed: &Seed,
    position: u64,
    logits: &[f32],
    tolerance: f64,
) -> Result<Vec<u32>, SamplerError> {
    // The candidates' perturbed logits once, not once per token as `score` would.
    let values = perturbed(params, seed, position, logits)?;
    let (_, best) = winner(&values);
    Ok(values
        .into_iter()
        .filter(|(_, v)| best - v <= tolerance)
        .map(|(t, _)| t)
        .collect())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::{request_seed, sample, score};

    /// A deterministic "model": logits for a vocabulary of `vocab` at each position, flat
    /// (`spread` small) or peaked (`spread` large), drawn from a fixed generator.
    fn rows(n: usize, vocab: usize, spread: f32, salt: u64) -> Vec<Vec<f32>> {
        let mut x = salt.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 11) as f32 / (1u64 << 53) as f32
        };
        (0..n)
            .map(|_| {
                let mut r: Vec<f32> = (0..vocab).map(|_| next()).collect();
                let top = (next() * vocab as f32) as usize % vocab;
                r[top] += spread;
                r
            })
            .collect()
    }

    fn generate(params: &SamplingParams, seed: &Seed, logits: &[Vec<f32>]) -> Vec<u32> {
        logits
            .iter()
            .enumerate()
            .map(|(i, row)| sample(params, seed, i as u64, row).unwrap())
            .collect()
    }

    #[test]
    fn an_honest_response_replays_with_margin_zero() {
        let params = SamplingParams::at(1.0);
        let seed = request_seed(&[5; 32], b"prompt");
        let logits = rows(200, 64, 4.0, 1);
        let claimed = generate(&params, &seed, &logits);
        let v = judge(&params, &seed, &logits, &claimed, 0.0).unwrap();
        assert!(v.passed(), "{v:?}");
        assert_eq!((v.differing, v.max_margin), (0, 0.0));
    }

    #[test]
    fn replay_drift_is_small_and_a_substituted_token_is_caught() {
        let params = SamplingParams::at(1.0);
        let seed = request_seed(&[5; 32], b"prompt");
        let serving = rows(300, 64, 4.0, 2);
        // The replay's logits differ a little, as another precision or kernel order would.
        let replay: Vec<Vec<f32>> = serving
            .iter()
            .enumerate()
            .map(|(i, r)| {
                r.iter()
                    .enumerate()
                    .map(|(j, l)| l + 1e-3 * (((i * 31 + j * 17) % 7) as f32 - 3.0))
                    .collect()
            })
            .collect();
        let claimed = generate(&params, &seed, &serving);
        let honest = judge(&params, &seed, &replay, &claimed, 0.05).unwrap();
        assert!(honest.passed(), "{honest:?}");
        assert!(honest.max_margin < 0.05);
        // A host that swaps one token for another the seed puts far behind is caught there.
        let mut forged = claimed.clone();
        let worst = (0..64u32)
            .max_by(|a, b| {
                let m = |t: u32| score(&params, &seed, 150, &serving[150], t).unwrap().margin;
                m(*a).total_cmp(&m(*b))
            })
            .unwrap();
        forged[150] = worst;
        let v = judge(&params, &seed, &replay, &forged, 0.05).unwrap();
        let d = v.first_divergence.expect("caught");
        assert_eq!(
            (d.position, d.claimed, d.replayed),
            (150, worst, claimed[150])
        );
        assert!(d.margin > 1.0, "{d:?}");
    }

    /// The covert channel a tolerance leaves: with flat distributions many tokens are within
    /// it, with peaked ones few. Measured, not assumed: the mean log2 of the choices.
    #[test]
    fn the_tolerance_bounds_the_covert_channel_and_peaked_models_leave_less() {
        let params = SamplingParams::at(1.0);
        let seed = request_seed(&[9; 32], b"prompt");
        let bits = |spread: f32, tolerance: f64| -> f64 {
            let logits = rows(200, 64, spread, 3);
            let total: f64 = logits
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let n = covert_choices(&params, &seed, i as u64, r, tolerance)
                        .unwrap()
                        .len();
                    assert!(n >= 1, "the draw itself is always a choice");
                    (n as f64).log2()
                })
                .sum();
            total / 200.0
        };
        assert_eq!(bits(0.0, 0.0), 0.0, "no tolerance: exactly one choice");
        let flat = bits(0.0, 0.5);
        let peaked = bits(8.0, 0.5);
        assert!(flat > peaked, "flat {flat} bits/token, peaked {peaked}");
        assert!(bits(0.0, 1.0) >= flat, "more tolerance, more room");
    }

    #[test]
    fn a_response_longer_than_the_replay_is_an_error() {
        let params = SamplingParams::at(1.0);
        let seed = Seed([1; 32]);
        let logits = rows(3, 8, 1.0, 4);
        assert_eq!(
            judge(&params, &seed, &logits, &[0, 0], 0.1),
            Err(SamplerError::Length { tokens: 2, rows: 3 })
        );
    }
}
