//! What dishonest hosts do, for the attack tests and the detection benchmark: serve a
//! substituted model (a model directory like the committed one with every weight matrix
//! changed, the configuration and tokenizer kept), or hide bits by picking among tokens near
//! the seeded winner ([`hide_bits`]).

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use rackwarden_sampler::replay::covert_choices;
use rackwarden_sampler::{Seed, sample};

use crate::files::{CONFIG_FILE, LoadedModel, TOKENIZER_FILE, WEIGHTS_FILE};
use crate::protocol::CompletionRequest;

/// Every weight scaled by 1 ± `fraction`, the sign alternating.
pub fn perturbed(fraction: f32) -> impl Fn(&[f32]) -> Vec<f32> {
    move |v| {
        v.iter()
            .enumerate()
            .map(|(i, x)| x * (1.0 + fraction * if i % 2 == 0 { 1.0 } else { -1.0 }))
            .collect()
    }
}

/// 4-bit absmax quantisation per block of 32 weights (as the common quantised formats do),
/// then back to f32: the quantised copy's arithmetic.
pub fn quantised_4bit(v: &[f32]) -> Vec<f32> {
    v.chunks(32)
        .flat_map(|c| {
            let m = c
                .iter()
                .fold(0f32, |a, x| a.max(x.abs()))
                .max(f32::MIN_POSITIVE);
            c.iter().map(move |x| (x / m * 7.0).round() / 7.0 * m)
        })
        .collect()
}

/// Writes to `out` the model of `dir` with every matrix changed by `change`.
pub fn substitute(
    dir: &Path,
    out: &Path,
    change: impl Fn(&[f32]) -> Vec<f32>,
) -> Result<(), String> {
    let weights = candle_core::safetensors::load(dir.join(WEIGHTS_FILE), &Device::Cpu)
        .map_err(|e| e.to_string())?;
    let mut changed: HashMap<String, Tensor> = HashMap::new();
    for (k, t) in weights {
        let t = if t.rank() == 2 {
            let shape = t.dims().to_vec();
            let v = t
                .flatten_all()
                .and_then(|f| f.to_dtype(candle_core::DType::F32))
                .and_then(|f| f.to_vec1::<f32>())
                .map_err(|e| e.to_string())?;
            Tensor::from_vec(change(&v), shape, &Device::Cpu).map_err(|e| e.to_string())?
        } else {
            t
        };
        changed.insert(k, t);
    }
    std::fs::create_dir_all(out).map_err(|e| format!("{}: {e}", out.display()))?;
    for f in [CONFIG_FILE, TOKENIZER_FILE] {
        std::fs::copy(dir.join(f), out.join(f)).map_err(|e| format!("{f}: {e}"))?;
    }
    candle_core::safetensors::save(&changed, out.join(WEIGHTS_FILE)).map_err(|e| e.to_string())
}

/// A steganographic host: draws like the honest server, except that wherever tokens other
/// than the seeded winner are within `room` of it (under the host's own logits), it picks
/// among them to carry the next bits of `secret`. Returns the ids and how many bits it hid.
/// With `room` at or under the verifier's tolerance this passes the replay: the bits are the
/// covert channel the tolerance leaves.
pub fn hide_bits(
    model: &LoadedModel,
    request: &CompletionRequest,
    prompt_ids: &[u32],
    seed: &Seed,
    room: f64,
    secret: &mut dyn Iterator<Item = bool>,
) -> Result<(Vec<u32>, u64), String> {
    let params = request.params();
    let mut cache = model.llama.new_cache();
    let mut logits = model
        .llama
        .step(prompt_ids, &mut cache)
        .map_err(|e| e.to_string())?;
    let (mut ids, mut hidden) = (Vec::new(), 0u64);
    for position in 0..u64::from(request.max_tokens) {
        let winner = sample(&params, seed, position, &logits).map_err(|e| e.to_string())?;
        let choices =
            covert_choices(&params, seed, position, &logits, room).map_err(|e| e.to_string())?;
        // Two or more choices: one bit, the winner for 0 and another for 1.
        let t = match (choices.iter().find(|c| **c != winner), choices.len() >= 2) {
            (Some(other), true) => match secret.next() {
                Some(true) => {
                    hidden += 1;
                    *other
                }
                Some(false) => {
                    hidden += 1;
                    winner
                }
                None => winner,
            },
            _ => winner,
        };
        ids.push(t);
        if Some(t) == model.tokenizer.eos() {
            break;
        }
        if position + 1 < u64::from(request.max_tokens) {
            logits = model
                .llama
                .step(&[t], &mut cache)
                .map_err(|e| e.to_string())?;
        }
    }
    Ok((ids, hidden))
}
