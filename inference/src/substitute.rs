//! Substituted models, for the attack tests and the detection benchmark: a model directory
//! like a given one with every weight matrix changed, the configuration and tokenizer kept.
//! What a host serving "almost" the committed model would hold.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::files::{CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE};

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
