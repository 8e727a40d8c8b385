//! A sampler anyone can reproduce: what a serving stack implements so that the verifier can
//! replay its responses (`docs/sampler.md` is the specification, with a reference in
//! Python).
//!
//! 1. **The seed** of a request is SHA3-256 of [`SEED_DOMAIN`], the epoch's key (the
//!    verifier's nonce for the epoch, which the daemon hands to workloads) and the request's
//!    bytes ([`request_seed`]). The host cannot choose it: the key comes from the verifier,
//!    and the request from the client.
//! 2. **The noise** for position `p` and token `t` is a standard Gumbel variable drawn from
//!    ChaCha20 keyed by the seed: the stream (nonce) is `p`, and the keystream's 64-bit
//!    little-endian word `t` gives a uniform `u` in (0, 1) ([`uniform`], [`gumbel`]).
//! 3. **The choice** at each position is the candidate token (top-k, then top-p, of the
//!    temperature-scaled distribution: [`candidates`]) with the largest `logit / T + noise`
//!    ([`sample`]): Gumbel-max, so the tokens are distributed exactly as softmax sampling,
//!    and fixed by the seed. Temperature 0 is greedy (no noise).
//! 4. **The score** of a claimed token ([`score`]) is what the replay needs: how far its
//!    perturbed logit trails the seeded winner's under the replay's own logits (the DiFR
//!    margin; 0 when it is the winner, infinite outside the candidates), and its log
//!    likelihood.
//!
//! Pure and deterministic: no I/O, no clock, no randomness but the seed's.

pub mod replay;
pub mod verdict;

use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};
use sha3::{Digest, Sha3_256};

/// The replay's default tolerance: the largest margin (in units of perturbed logits, i.e.
/// logits divided by the temperature) by which a claimed token may trail the seeded winner.
/// Measured, not guessed: `cargo xtask bench replay` prints the honest margins it must
/// absorb and the covert channel it leaves (`docs/replay.md`).
pub const DEFAULT_TOLERANCE: f64 = 0.05;

/// The first bytes of the seed derivation (`rackwarden/sampling-seed/v1` and a NUL).
pub const SEED_DOMAIN: &[u8] = b"rackwarden/sampling-seed/v1\0";

/// A request's seed: the ChaCha20 key of its noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Seed(pub [u8; 32]);

/// SHA3-256(`SEED_DOMAIN` || `epoch_key` || u64 big-endian length of `request` ||
/// `request`): the seed of one request (its bytes as the client sent them, headers and body).
pub fn request_seed(epoch_key: &[u8; 32], request: &[u8]) -> Seed {
    let mut h = Sha3_256::new();
    h.update(SEED_DOMAIN);
    h.update(epoch_key);
    h.update((request.len() as u64).to_be_bytes());
    h.update(request);
    Seed(h.finalize().into())
}

/// How tokens are drawn. `temperature` 0 is greedy; `top_k` 0 and `top_p` 1 are off.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    pub temperature: f64,
    pub top_k: u32,
    pub top_p: f64,
}

impl SamplingParams {
    pub const GREEDY: SamplingParams = SamplingParams {
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
    };

    /// Plain softmax sampling at temperature `t`.
    pub fn at(t: f64) -> SamplingParams {
        SamplingParams {
            temperature: t,
            ..SamplingParams::GREEDY
        }
    }

    pub fn check(&self) -> Result<(), SamplerError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplerError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplerError::TopP(self.top_p));
        }
        Ok(())
    }

    fn greedy(&self) -> bool {
        self.temperature == 0.0
    }
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplerError {
    #[error("temperature {0} is not a finite number at or above 0")]
    Temperature(f64),
    #[error("top_p {0} is not in (0, 1]")]
    TopP(f64),
    #[error("no logits: the vocabulary is empty")]
    EmptyVocabulary,
    #[error("logit {index} is {value}, not a finite number")]
    Logit { index: usize, value: f32 },
    #[error("token {token} is outside the vocabulary of {vocab}")]
    Token { token: u32, vocab: usize },
    #[error("{tokens} claimed tokens against {rows} rows of replayed logits")]
    Length { tokens: usize, rows: usize },
}

/// The noise generator of one seed and position: ChaCha20 (the original construction:
/// 64-bit block counter, 64-bit nonce), key = the seed, nonce = the position.
fn stream(seed: &Seed, position: u64) -> ChaCha20Rng {
    let mut rng = ChaCha20Rng::from_seed(seed.0);
    rng.set_stream(position);
    rng
}

/// A 64-bit word as a uniform number in (0, 1): its top 53 bits, plus one half, over 2^53.
fn unit(word: u64) -> f64 {
    ((word >> 11) as f64 + 0.5) / (1u64 << 53) as f64
}

/// The uniform number of `token` at `position`: the keystream's little-endian 64-bit word
/// `token` (bytes `8 token .. 8 token + 8`), as [`unit`] maps it.
pub fn uniform(seed: &Seed, position: u64, token: u32) -> f64 {
    let mut rng = stream(seed, position);
    rng.set_word_pos(2 * u128::from(token));
    unit(rng.next_u64())
}

/// The Gumbel noise of `token` at `position`: `-ln(-ln(u))` of its [`uniform`].
pub fn gumbel(seed: &Seed, position: u64, token: u32) -> f64 {
    -(-uniform(seed, position, token).ln()).ln()
}

/// The Gumbel noise of every token `0 .. vocab` at `position` (one pass of the keystream).
pub fn gumbel_row(seed: &Seed, position: u64, vocab: usize) -> Vec<f64> {
    let mut rng = stream(seed, position);
    (0..vocab)
        .map(|_| -(-unit(rng.next_u64()).ln()).ln())
        .collect()
}

fn check_logits(logits: &[f32]) -> Result<(), SamplerError> {
    if logits.is_empty() {
        return Err(SamplerError::EmptyVocabulary);
    }
    if let Some((index, value)) = logits.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(SamplerError::Logit {
            index,
            value: *value,
        });
    }
    Ok(())
}

/// The tokens that may be drawn, in ascending id: every token at temperature 0 (the argmax
/// is drawn regardless); otherwise the `top_k` most likely (ties to the lower id), then the
/// fewest of those, most likely first, whose probability under `softmax(logits / T)` adds
/// up to at least `top_p` (at least one).
pub fn candidates(params: &SamplingParams, logits: &[f32]) -> Result<Vec<u32>, SamplerError> {
    params.check()?;
    check_logits(logits)?;
    let all = || (0..logits.len() as u32).collect::<Vec<u32>>();
    if params.greedy() || (params.top_k == 0 && params.top_p >= 1.0) {
        return Ok(all());
    }
    let mut order = all();
    // Most likely first; equal logits by id.
    order.sort_by(|a, b| {
        logits[*b as usize]
            .total_cmp(&logits[*a as usize])
            .then(a.cmp(b))
    });
    if params.top_k > 0 {
        order.truncate(params.top_k as usize);
    }
    if params.top_p < 1.0 {
        let p = softmax(logits, params.temperature);
        let mut sum = 0.0;
        let mut keep = 0;
        for t in &order {
            sum += p[*t as usize];
            keep += 1;
            if sum >= params.top_p {
                break;
            }
        }
        order.truncate(keep.max(1));
    }
    order.sort_unstable();
    Ok(order)
}

/// `softmax(logits / t)` in f64 (`t` 0 is taken as 1).
fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
    let t = if t == 0.0 { 1.0 } else { t };
    let max = logits
        .iter()
        .map(|l| f64::from(*l) / t)
        .fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits
        .iter()
        .map(|l| (f64::from(*l) / t - max).exp())
        .collect();
    let z: f64 = e.iter().sum();
    e.into_iter().map(|x| x / z).collect()
}

/// The perturbed logits `logit / T + gumbel` of the candidates, with their ids (greedy: the
/// logits themselves).
fn perturbed(
    params: &SamplingParams,
    seed: &Seed,
    position: u64,
    logits: &[f32],
) -> Result<Vec<(u32, f64)>, SamplerError> {
    let allowed = candidates(params, logits)?;
    if params.greedy() {
        return Ok(allowed
            .into_iter()
            .map(|t| (t, f64::from(logits[t as usize])))
            .collect());
    }
    let noise = gumbel_row(seed, position, logits.len());
    Ok(allowed
        .into_iter()
        .map(|t| {
            let i = t as usize;
            (t, f64::from(logits[i]) / params.temperature + noise[i])
        })
        .collect())
}

/// The largest of `values` (the lower id on a tie).
fn winner(values: &[(u32, f64)]) -> (u32, f64) {
    values
        .iter()
        .copied()
        .fold((u32::MAX, f64::NEG_INFINITY), |best, (t, v)| {
            if v > best.1 || (v == best.1 && t < best.0) {
                (t, v)
            } else {
                best
            }
        })
}

/// The token drawn at `position` from `logits` (the model's output for that position).
pub fn sample(
    params: &SamplingParams,
    seed: &Seed,
    position: u64,
    logits: &[f32],
) -> Result<u32, SamplerError> {
    Ok(winner(&perturbed(params, seed, position, logits)?).0)
}

/// How a claimed token stands against the replay's logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenScore {
    /// The token the replay draws with the same seed.
    pub winner: u32,
    /// How far the claimed token's perturbed logit trails the winner's (0 when it is the
    /// winner; infinite when it is not a candidate).
    pub margin: f64,
    /// Whether the claimed token is a candidate under the replay's logits.
    pub in_candidates: bool,
    /// Its log probability under `softmax(logits / T)` (T 0 taken as 1).
    pub logprob: f64,
}

/// Scores `claimed` at `position` against the replay's `logits`.
pub fn score(
    params: &SamplingParams,
    seed: &Seed,
    position: u64,
    logits: &[f32],
    claimed: u32,
) -> Result<TokenScore, SamplerError> {
    check_token(logits, claimed)?;
    let values = perturbed(params, seed, position, logits)?;
    Ok(score_among(params, logits, &values, claimed))
}

fn check_token(logits: &[f32], claimed: u32) -> Result<(), SamplerError> {
    if claimed as usize >= logits.len() {
        return Err(SamplerError::Token {
            token: claimed,
            vocab: logits.len(),
        });
    }
    Ok(())
}

/// [`score`] on the perturbed `values` already drawn for this position.
fn score_among(
    params: &SamplingParams,
    logits: &[f32],
    values: &[(u32, f64)],
    claimed: u32,
) -> TokenScore {
    let (winner_id, best) = winner(values);
    let mine = values.iter().find(|(t, _)| *t == claimed).map(|(_, v)| *v);
    let logprob = softmax(logits, params.temperature)[claimed as usize].ln();
    TokenScore {
        winner: winner_id,
        margin: mine.map_or(f64::INFINITY, |v| best - v),
        in_candidates: mine.is_some(),
        logprob,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;

    use super::*;

    const SEED: Seed = Seed([7; 32]);

    /// The keystream against an independent ChaCha20 (Python's `cryptography`, whose 16-byte
    /// nonce is the block counter and the stream, each u64 little-endian): see
    /// `docs/sampler.md`, appendix.
    #[test]
    fn the_noise_is_the_documented_chacha20_keystream() {
        let mut rng = stream(&SEED, 5);
        let words: Vec<String> = (0..3)
            .map(|_| format!("{:016x}", rand_core::RngCore::next_u64(&mut rng)))
            .collect();
        assert_eq!(words, KAT_WORDS_POSITION_5);
        // Word `t` is token `t`'s, read directly or in one pass.
        let row = gumbel_row(&SEED, 5, 40);
        for t in [0u32, 1, 7, 8, 15, 16, 39] {
            assert_eq!(row[t as usize], gumbel(&SEED, 5, t), "token {t}");
        }
        assert_ne!(gumbel(&SEED, 5, 0), gumbel(&SEED, 6, 0), "positions differ");
    }

    /// Written by the appendix's Python from the same key (32 bytes of 7) and position 5.
    const KAT_WORDS_POSITION_5: [&str; 3] =
        ["2466552f8fc65211", "aa8cbb1d8a647bca", "4855a84448adbeb2"];

    /// The reference in Python (`docs/sampler.md`, appendix) draws the same tokens.
    #[test]
    fn the_reference_draws_the_same_tokens() {
        let seed = request_seed(&[1; 32], b"POST /v1/completions");
        assert_eq!(
            hex::encode(seed.0),
            "a718886637c1df7eebf3328480b357e7c5c1c6d17c6cfd50b77580b85d029ceb"
        );
        let logits = [0.0f32, 1.0, 2.0, 0.5];
        let drawn: Vec<u32> = (0..12)
            .map(|p| sample(&SamplingParams::at(0.8), &seed, p, &logits).unwrap())
            .collect();
        assert_eq!(drawn, [2, 2, 2, 2, 1, 1, 3, 2, 2, 2, 2, 1]);
    }

    #[test]
    fn seeds_bind_the_epoch_key_and_every_request_byte() {
        let a = request_seed(&[1; 32], b"POST /v1/completions");
        assert_ne!(a, request_seed(&[2; 32], b"POST /v1/completions"));
        assert_ne!(a, request_seed(&[1; 32], b"POST /v1/completionz"));
        assert_eq!(a, request_seed(&[1; 32], b"POST /v1/completions"));
    }

    #[test]
    fn greedy_is_the_argmax_and_ties_go_to_the_lower_id() {
        let logits = [0.5f32, 2.0, 2.0, -1.0];
        assert_eq!(
            sample(&SamplingParams::GREEDY, &SEED, 0, &logits).unwrap(),
            1
        );
        let s = score(&SamplingParams::GREEDY, &SEED, 0, &logits, 2).unwrap();
        assert_eq!((s.winner, s.margin), (1, 0.0));
        let s = score(&SamplingParams::GREEDY, &SEED, 0, &logits, 0).unwrap();
        assert_eq!(s.margin, 1.5);
    }

    #[test]
    fn candidates_are_top_k_then_top_p() {
        let logits = [1.0f32, 3.0, 2.0, 3.0, -5.0];
        let p = |k, p| SamplingParams {
            temperature: 1.0,
            top_k: k,
            top_p: p,
        };
        assert_eq!(
            candidates(&p(0, 1.0), &logits).unwrap(),
            vec![0, 1, 2, 3, 4]
        );
        assert_eq!(candidates(&p(2, 1.0), &logits).unwrap(), vec![1, 3]);
        assert_eq!(candidates(&p(3, 1.0), &logits).unwrap(), vec![1, 2, 3]);
        // softmax: 3 -> 0.3995 each, 2 -> 0.1470, 1 -> 0.0541, -5 -> 0.0001
        assert_eq!(candidates(&p(0, 0.39), &logits).unwrap(), vec![1]);
        assert_eq!(candidates(&p(0, 0.4), &logits).unwrap(), vec![1, 3]);
        assert_eq!(candidates(&p(0, 0.79), &logits).unwrap(), vec![1, 3]);
        assert_eq!(candidates(&p(0, 0.9), &logits).unwrap(), vec![1, 2, 3]);
        assert_eq!(candidates(&p(2, 0.9), &logits).unwrap(), vec![1, 3]);
        // The winner is always a candidate, and a non-candidate's margin is infinite.
        let params = p(2, 1.0);
        for pos in 0..50 {
            let w = sample(&params, &SEED, pos, &logits).unwrap();
            assert!(w == 1 || w == 3);
            assert_eq!(
                score(&params, &SEED, pos, &logits, 0).unwrap().margin,
                f64::INFINITY
            );
        }
    }

    #[test]
    fn bad_inputs_name_themselves() {
        assert_eq!(
            sample(&SamplingParams::at(-1.0), &SEED, 0, &[1.0]),
            Err(SamplerError::Temperature(-1.0))
        );
        let bad_p = SamplingParams {
            top_p: 0.0,
            ..SamplingParams::at(1.0)
        };
        assert_eq!(
            sample(&bad_p, &SEED, 0, &[1.0]),
            Err(SamplerError::TopP(0.0))
        );
        assert_eq!(
            sample(&SamplingParams::at(1.0), &SEED, 0, &[]),
            Err(SamplerError::EmptyVocabulary)
        );
        assert!(matches!(
            sample(&SamplingParams::at(1.0), &SEED, 0, &[1.0, f32::NAN]),
            Err(SamplerError::Logit { index: 1, .. })
        ));
        assert_eq!(
            score(&SamplingParams::at(1.0), &SEED, 0, &[1.0], 1).map(|s| s.margin),
            Err(SamplerError::Token { token: 1, vocab: 1 })
        );
    }

    /// Gumbel-max draws from softmax(logits / T): over many seeds, each token's share is its
    /// probability (a chi-square test at a fixed set of seeds, so it cannot flake).
    #[test]
    fn gumbel_max_draws_from_the_softmax() {
        let logits = [0.0f32, 1.0, 2.0, 0.5];
        let t = 0.8;
        let p = softmax(&logits, t);
        let n = 20_000u64;
        let mut counts = [0u64; 4];
        for i in 0..n {
            let seed = request_seed(&[3; 32], &i.to_be_bytes());
            counts[sample(&SamplingParams::at(t), &seed, 0, &logits).unwrap() as usize] += 1;
        }
        let chi2: f64 = counts
            .iter()
            .zip(&p)
            .map(|(c, p)| {
                let e = p * n as f64;
                (*c as f64 - e).powi(2) / e
            })
            .sum();
        // 3 degrees of freedom: P(chi2 > 16.27) = 0.001.
        assert!(chi2 < 16.27, "chi2 {chi2}, counts {counts:?}, p {p:?}");
    }

    proptest! {
        /// The sampled token scores margin 0 against the same logits; every other candidate
        /// a positive margin.
        #[test]
        fn the_drawn_token_has_margin_zero(
            logits in proptest::collection::vec(-20.0f32..20.0, 1..64),
            t in 0.0f64..2.0,
            k in 0u32..8,
            pos in 0u64..1_000,
            key in proptest::array::uniform32(any::<u8>()),
        ) {
            let params = SamplingParams { temperature: t, top_k: k, top_p: 0.95 };
            let seed = Seed(key);
            let w = sample(&params, &seed, pos, &logits).unwrap();
            let s = score(&params, &seed, pos, &logits, w).unwrap();
            prop_assert_eq!(s.margin, 0.0);
            prop_assert_eq!(s.winner, w);
            for other in 0..logits.len() as u32 {
                let o = score(&params, &seed, pos, &logits, other).unwrap();
                prop_assert!(o.margin >= 0.0);
                if other != w && o.in_candidates && !params.greedy() {
                    prop_assert!(o.margin > 0.0);
                }
            }
        }
    }
}
