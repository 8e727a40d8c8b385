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
use crate::generate::draw_with;
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
    let mut hidden = 0u64;
    let (ids, _) = draw_with(model, request, prompt_ids, |position, logits| {
        let winner = sample(&params, seed, position, logits)?;
        let choices = covert_choices(&params, seed, position, logits, room)?;
        // Two or more choices: one bit, the winner for 0 and another for 1.
        // The next bit is taken only where there is a choice to carry it.
        let Some(other) = choices.iter().find(|c| **c != winner) else {
            return Ok(winner);
        };
        Ok(match secret.next() {
            Some(bit) => {
                hidden += 1;
                if bit { *other } else { winner }
            }
            None => winner,
        })
    })
    .map_err(|e| e.to_string())?;
    Ok((ids, hidden))
}
