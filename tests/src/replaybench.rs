//! `cargo xtask bench replay`: what the replay costs next to generation (its anchor: the same
//! model, the same CPU, in the same run), what the tolerance lets through honest hosts and
//! dishonest ones, and what a sample catches.

use std::path::{Path, PathBuf};

use candle_core::DType;
use rackwarden_inference::attacks::{self, substitute};
use rackwarden_inference::bundled::{Variant, cached, training_text};
use rackwarden_inference::calibrate::{HonestMeasurement, measure_honest, prompts_from_text};
use rackwarden_inference::files::LoadedModel;
use rackwarden_inference::generate::draw;
use rackwarden_inference::protocol::CompletionRequest;
use rackwarden_inference::replay::teacher_forced_logits;
use rackwarden_sampler::replay::judge;
use rackwarden_sampler::{DEFAULT_TOLERANCE, SamplingParams, Seed};

use crate::benchstats::{Bracketed, median};

/// The cap the covert channel is priced at (the docs' example cap).
const CAP_BYTES_PER_SEC: f64 = 10e6;
/// What a training run would have to move: a 70B-parameter model's weights in bf16.
const WEIGHTS_70B_BYTES: f64 = 140e9;
const TOKENS: u32 = 128;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The bundled model of `variant` under `target/models/`, made once per content.
pub fn bundled_dir(variant: Variant) -> PathBuf {
    cached(&repo(), variant).expect("the bundled model")
}

fn open(dir: &Path, dtype: DType) -> LoadedModel {
    LoadedModel::open(dir, dtype).expect("load the model")
}

fn seed(i: usize) -> Seed {
    let mut s = [0u8; 32];
    s[..8].copy_from_slice(&(i as u64).to_le_bytes());
    Seed(s)
}

pub fn bench_replay() {
    println!("== bench replay ==");
    let text = training_text(&repo()).expect("the repository's docs");
    let trained = bundled_dir(Variant::Trained);
    let random = bundled_dir(Variant::Random);
    let params = SamplingParams::at(1.0);

    cost(&trained, &text, &params);

    // Honest margins: served in one precision, replayed in another, over >= 10^5 tokens each.
    let tolerances = [0.01, DEFAULT_TOLERANCE, 0.2];
    println!(
        "honest margins (temperature 1, {TOKENS}-token completions of doc windows); false positives at tolerance {:?}:",
        tolerances
    );
    let mut trained_f32 = None;
    for (name, dir, serve, rep, n) in [
        ("trained", &trained, DType::F32, DType::F64, 800),
        ("trained", &trained, DType::F16, DType::F32, 800),
        ("trained", &trained, DType::BF16, DType::F32, 800),
        ("random", &random, DType::F32, DType::F64, 800),
    ] {
        let s = open(dir, serve);
        let r = open(dir, rep);
        let prompts = prompts_from_text(&s, &text, n, 32).expect("prompts");
        let m = measure_honest(&s, &r, &prompts, &params, TOKENS, &tolerances, seed)
            .expect("honest run");
        println!(
            "  {name:7} served {serve:?} replayed {rep:?}: {} tokens, {} with margin > 0, max {:.3e}, q99.9 {:.3e}; false positives {:?}",
            m.tokens(),
            m.margins.iter().filter(|x| **x > 0.0).count(),
            m.quantile(1.0),
            m.quantile(0.999),
            tolerances.map(|t| m.false_positives(t)),
        );
        if serve == DType::F32 {
            covert_line(name, &m, &tolerances);
            if name == "trained" {
                trained_f32 = Some(m);
            }
        }
    }
    let _ = trained_f32;

    detection(&trained, &text, &params);
}

fn covert_line(name: &str, m: &HonestMeasurement, tolerances: &[f64]) {
    // Canonical response bytes per token, measured on the byte model: each id costs its
    // digits and a comma in token_ids plus its byte (escaped when it must be) in text.
    let bytes_per_token = 5.0;
    for (t, bits) in tolerances.iter().zip(&m.covert_bits) {
        let per_token = bits / m.tokens() as f64;
        let tokens_per_day = CAP_BYTES_PER_SEC / bytes_per_token * 86_400.0;
        let bytes_per_day = per_token * tokens_per_day / 8.0;
        println!(
            "  covert channel, {name} model, tolerance {t}: {per_token:.4} bits/token = {:.1} MB/day at a 10 MB/s cap ({:.0} days for a 70B model's bf16 weights)",
            bytes_per_day / 1e6,
            WEIGHTS_70B_BYTES / bytes_per_day
        );
    }
}

/// Replay per token against generation per token, bracketed; and one core's throughput.
fn cost(dir: &Path, text: &[u8], params: &SamplingParams) {
    let model = open(dir, DType::F32);
    let prompts = prompts_from_text(&model, text, 8, 32).expect("prompts");
    let request = CompletionRequest {
        model: String::new(),
        prompt: String::new(),
        max_tokens: TOKENS,
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
    };
    let drawn: Vec<Vec<u32>> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| draw(&model, &request, p, &seed(i)).expect("draw").0)
        .collect();
    let tokens: usize = drawn.iter().map(Vec::len).sum();
    let generate = || {
        let t = std::time::Instant::now();
        for (i, p) in prompts.iter().enumerate() {
            draw(&model, &request, p, &seed(i)).expect("draw");
        }
        t.elapsed().as_secs_f64() / tokens as f64
    };
    let replay = || {
        let t = std::time::Instant::now();
        for (i, (p, ids)) in prompts.iter().zip(&drawn).enumerate() {
            let rows = teacher_forced_logits(&model, p, ids).expect("replay");
            judge(params, &seed(i), &rows, ids, DEFAULT_TOLERANCE).expect("judge");
        }
        t.elapsed().as_secs_f64() / tokens as f64
    };
    // generate, replay, generate, ..., generate: each replay against the two around it.
    let rounds = 9;
    let mut values = Vec::new();
    for i in 0..(2 * rounds + 1) {
        values.push(if i % 2 == 0 { generate() } else { replay() });
    }
    let b = Bracketed::new(&values, |i| i % 2 == 1, |i| i % 2 == 0);
    let (mid, (lo, hi)) = (b.median(), b.ci95());
    let mut gen_vals: Vec<f64> = values.iter().step_by(2).copied().collect();
    println!(
        "replay vs generation, same model, same CPU ({tokens} tokens a round, {rounds} rounds): {mid:.3}x per token (95% CI {lo:.3}..{hi:.3}; goal <= 0.2x); generation {:.1} us/token",
        median(&mut gen_vals) * 1e6
    );
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool");
    let per_token = one.install(|| {
        let mut v: Vec<f64> = (0..5).map(|_| replay()).collect();
        median(&mut v)
    });
    let tps = 1.0 / per_token;
    println!(
        "replay on one core: {tps:.0} tokens/s = {:.0} exchanges of {TOKENS} tokens per 10-min epoch per core",
        tps * 600.0 / f64::from(TOKENS)
    );
}

/// The per-sample catch rate d of two substituted models, and what k samples catch.
fn detection(dir: &Path, text: &[u8], params: &SamplingParams) {
    let tmp = std::env::temp_dir().join(format!("rwbench-replay-{}", std::process::id()));
    let perturbed = tmp.join("perturbed");
    substitute(dir, &perturbed, attacks::perturbed(0.05)).expect("perturbed copy");
    let quantised = tmp.join("q4");
    substitute(dir, &quantised, attacks::quantised_4bit).expect("quantised copy");
    let honest = open(dir, DType::F64);
    let request = CompletionRequest {
        model: String::new(),
        prompt: String::new(),
        max_tokens: 48,
        temperature: params.temperature,
        top_k: params.top_k,
        top_p: params.top_p,
    };
    println!(
        "detection of a substituted model (48-token exchanges, tolerance {DEFAULT_TOLERANCE}):"
    );
    for (name, fake_dir) in [
        ("weights +-5%", &perturbed),
        ("4-bit quantised", &quantised),
    ] {
        let fake = open(fake_dir, DType::F32);
        let prompts = prompts_from_text(&fake, text, 200, 32).expect("prompts");
        let mut caught = 0usize;
        let mut tokens_to_catch = Vec::new();
        for (i, p) in prompts.iter().enumerate() {
            let (ids, _) = draw(&fake, &request, p, &seed(i)).expect("draw");
            let rows = teacher_forced_logits(&honest, p, &ids).expect("replay");
            let v = judge(params, &seed(i), &rows, &ids, DEFAULT_TOLERANCE).expect("judge");
            if let Some(d) = v.first_divergence {
                caught += 1;
                tokens_to_catch.push(d.position as f64 + 1.0);
            }
        }
        let d = caught as f64 / prompts.len() as f64;
        let med = if tokens_to_catch.is_empty() {
            f64::NAN
        } else {
            median(&mut tokens_to_catch)
        };
        println!(
            "  {name}: d = {d:.3} ({caught} of {} exchanges; median {med:.0} tokens to the first divergence)",
            prompts.len()
        );
        println!("    P(caught) = 1 - (1 - f d)^k:        k=8     k=32    k=128");
        for f in [0.01, 0.1, 1.0] {
            let p = |k: i32| 1.0 - (1.0 - f * d).powi(k);
            println!(
                "      forged fraction f = {f:<5}      {:.3}   {:.3}   {:.3}",
                p(8),
                p(32),
                p(128)
            );
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    steganography(dir, text, params, &request);
}

/// A steganographic host (`attacks::hide_bits`) at 90% of the tolerance and at 10 times it:
/// the bits it actually hid per token, and how many exchanges passed the replay.
fn steganography(dir: &Path, text: &[u8], params: &SamplingParams, request: &CompletionRequest) {
    let host = open(dir, DType::F32);
    let honest = open(dir, DType::F64);
    let prompts = prompts_from_text(&host, text, 200, 32).expect("prompts");
    println!(
        "a steganographic host picking among tokens near the seeded winner (48-token exchanges):"
    );
    for room in [0.9 * DEFAULT_TOLERANCE, 10.0 * DEFAULT_TOLERANCE] {
        let mut secret = std::iter::repeat([true, false, false, true]).flatten();
        let (mut bits, mut tokens, mut passed) = (0u64, 0usize, 0usize);
        for (i, p) in prompts.iter().enumerate() {
            let (ids, hidden) =
                attacks::hide_bits(&host, request, p, &seed(i), room, &mut secret).expect("draw");
            let rows = teacher_forced_logits(&honest, p, &ids).expect("replay");
            let v = judge(params, &seed(i), &rows, &ids, DEFAULT_TOLERANCE).expect("judge");
            if v.passed() {
                passed += 1;
                bits += hidden;
                tokens += ids.len();
            }
        }
        println!(
            "  room {room:.3}: {passed} of {} exchanges passed tolerance {DEFAULT_TOLERANCE}, carrying {bits} bits in {tokens} tokens = {:.4} bits/token",
            prompts.len(),
            bits as f64 / tokens.max(1) as f64
        );
    }
}
