//! Measuring what the tolerance must absorb and what it leaves open: honest completions
//! served in one precision and replayed in another give the distribution of honest margins
//! (the false positives a tolerance would cause), and at each honest position the number of
//! tokens within a tolerance of the seeded winner is the room a steganographic host has there
//! (`log2` of it, in bits).

use rackwarden_sampler::replay::score_response;
use rackwarden_sampler::{SamplingParams, Seed};

use crate::files::LoadedModel;
use crate::generate::draw;
use crate::protocol::CompletionRequest;
use crate::replay::teacher_forced_logits;

/// What honest completions measured.
#[derive(Debug, Clone, Default)]
pub struct HonestMeasurement {
    /// Every generated token's margin under the replay (0 where the replay draws it too).
    pub margins: Vec<f64>,
    /// Per tolerance asked, the sum over tokens of log2(tokens within it): bits a host could
    /// hide in these completions and still pass.
    pub covert_bits: Vec<f64>,
}

impl HonestMeasurement {
    pub fn tokens(&self) -> usize {
        self.margins.len()
    }

    /// Tokens whose margin exceeds `tolerance`: honest tokens a replay would fail.
    pub fn false_positives(&self, tolerance: f64) -> usize {
        self.margins.iter().filter(|m| **m > tolerance).count()
    }

    /// The `q` quantile of the margins (0 for none).
    pub fn quantile(&self, q: f64) -> f64 {
        let mut m = self.margins.clone();
        m.sort_by(|a, b| a.total_cmp(b));
        m.get(((m.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    }
}

/// Serves each prompt with `serving` (seed `seeds(i)`), replays with `replay` in one
/// teacher-forced pass, and scores every token as the replay service does; `tolerances` are
/// the covert-channel points (up to `NEAR_CAP`, the widest gap the scores keep).
pub fn measure_honest(
    serving: &LoadedModel,
    replay: &LoadedModel,
    prompts: &[Vec<u32>],
    params: &SamplingParams,
    max_tokens: u32,
    tolerances: &[f64],
    seeds: impl Fn(usize) -> Seed,
) -> Result<HonestMeasurement, String> {
    let mut out = HonestMeasurement {
        covert_bits: vec![0.0; tolerances.len()],
        ..HonestMeasurement::default()
    };
    let request = CompletionRequest {
        model: String::new(),
        prompt: String::new(),
        max_tokens,
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
    };
    for (i, prompt) in prompts.iter().enumerate() {
        let seed = seeds(i);
        let (ids, _) = draw(serving, &request, prompt, &seed).map_err(|e| e.to_string())?;
        let rows = teacher_forced_logits(replay, prompt, &ids)?;
        // What the replay service stores, then what the verifier derives from it.
        let r = score_response(params, &seed, &rows, &ids).map_err(|e| e.to_string())?;
        out.margins
            .extend(std::iter::repeat_n(0.0, ids.len() - r.trailing.len()));
        out.margins.extend(r.trailing.iter().map(|t| t.margin));
        for (k, tol) in tolerances.iter().enumerate() {
            out.covert_bits[k] += r.covert_bits(*tol);
        }
    }
    Ok(out)
}

/// Prompts for measurement: `n` windows of `len` bytes of `text`, spread evenly, each as the
/// model's ids.
pub fn prompts_from_text(
    model: &LoadedModel,
    text: &[u8],
    n: usize,
    len: usize,
) -> Result<Vec<Vec<u32>>, String> {
    let span = text.len().saturating_sub(len).max(1);
    (0..n)
        .map(|i| {
            let start = i * span / n.max(1);
            let end = (start + len).min(text.len());
            let window = String::from_utf8_lossy(&text[start..end]);
            model.tokenizer.encode(&window).map_err(|e| e.to_string())
        })
        .collect()
}
