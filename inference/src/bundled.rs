//! The model the demo and the tests serve: a small Llama-architecture decoder over bytes,
//! written as a model directory from a seed, and optionally trained on text.
//!
//! Two variants, because the covert channel depends on the model's distributions: the
//! *random* one (weights drawn from the seed) predicts nearly flat distributions, as no real
//! model does; the *trained* one (a minute of next-byte training on the repository's own
//! documentation) predicts peaked ones, as a real model does. The figures are reported for both.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{AdamW, Optimizer, ParamsAdamW};
use rand_chacha::ChaCha20Rng;
use rand_core::{RngCore, SeedableRng};

use crate::files::{CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE};
use crate::model::{Llama, LlamaConfig, ModelError};
use crate::tokenizer::{BYTE_SPECIALS, ByteTokenizerFile};

/// The bundled architecture: 258 ids (bytes, BOS, EOS), 2 layers of width 96, grouped-query
/// attention (4 heads sharing 2 key/value heads, as Llama 2 70B and later do), 256 positions.
pub fn bundled_config() -> LlamaConfig {
    LlamaConfig {
        hidden_size: 96,
        intermediate_size: 256,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: Some(2),
        vocab_size: 258,
        rms_norm_eps: 1e-5,
        rope_theta: 10_000.0,
        max_position_embeddings: 256,
        tie_word_embeddings: false,
        rope_scaling: None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("tensor arithmetic: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("the training text has {0} bytes; at least {1} are needed")]
    TooLittleText(usize, usize),
}

/// The error of an I/O failure on `path`, for `map_err`.
fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError {
    let path = path.display().to_string();
    move |error| BundleError::Io { path, error }
}

/// A standard normal draw from the generator (Box–Muller on two 53-bit uniforms).
fn normal(rng: &mut ChaCha20Rng) -> f64 {
    let u = |rng: &mut ChaCha20Rng| ((rng.next_u64() >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
    let (a, b) = (u(rng), u(rng));
    (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
}

/// The initial weights from `seed`: norms 1, every matrix N(0, 0.02²) (the Llama recipe's
/// initialisation), in a fixed order so the same seed gives the same bytes.
pub fn initial_weights(
    cfg: &LlamaConfig,
    seed: u64,
) -> Result<HashMap<String, Tensor>, BundleError> {
    let mut rng = ChaCha20Rng::seed_from_u64(seed);
    let mut out = HashMap::new();
    for (name, shape) in cfg.weight_shapes() {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = if name.ends_with("norm.weight") {
            vec![1.0; n]
        } else {
            (0..n).map(|_| (0.02 * normal(&mut rng)) as f32).collect()
        };
        out.insert(name, Tensor::from_vec(data, shape, &Device::Cpu)?);
    }
    Ok(out)
}

/// Writes a model directory: `config.json`, the byte tokenizer and the weights.
pub fn write_model_dir(
    dir: &Path,
    cfg: &LlamaConfig,
    weights: &HashMap<String, Tensor>,
) -> Result<(), BundleError> {
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let mut config = serde_json::to_value(cfg).unwrap_or_default();
    if let Some(o) = config.as_object_mut() {
        o.insert(
            "architectures".into(),
            serde_json::json!(["LlamaForCausalLM"]),
        );
        o.insert("bos_token_id".into(), BYTE_SPECIALS.bos.into());
        o.insert("eos_token_id".into(), BYTE_SPECIALS.eos.into());
    }
    let p = dir.join(CONFIG_FILE);
    std::fs::write(&p, serde_json::to_vec_pretty(&config).unwrap_or_default()).map_err(io(&p))?;
    let p = dir.join(TOKENIZER_FILE);
    let tok = ByteTokenizerFile {
        rackwarden_byte_tokenizer: BYTE_SPECIALS,
    };
    std::fs::write(&p, serde_json::to_vec_pretty(&tok).unwrap_or_default()).map_err(io(&p))?;
    let p = dir.join(WEIGHTS_FILE);
    candle_core::safetensors::save(weights, &p)?;
    Ok(())
}

/// How the bundled model is trained.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainingPlan {
    pub steps: usize,
    pub batch: usize,
    pub context: usize,
    pub learning_rate: f64,
    /// Seeds the initial weights and the batches.
    pub seed: u64,
}

pub const BUNDLED_TRAINING: TrainingPlan = TrainingPlan {
    steps: 400,
    batch: 16,
    context: 64,
    learning_rate: 3e-3,
    seed: 1,
};

/// Trains next-byte prediction on `text` from the weights of `plan.seed`; returns the
/// trained weights and the loss (nats per byte) of the first and the last step.
pub fn train(
    cfg: &LlamaConfig,
    text: &[u8],
    plan: &TrainingPlan,
    mut progress: impl FnMut(usize, f32),
) -> Result<(HashMap<String, Tensor>, f32, f32), BundleError> {
    let need = plan.context + 2;
    if text.len() < need {
        return Err(BundleError::TooLittleText(text.len(), need));
    }
    let vars: HashMap<String, Var> = initial_weights(cfg, plan.seed)?
        .into_iter()
        .map(|(k, t)| Ok((k, Var::from_tensor(&t)?)))
        .collect::<Result<_, candle_core::Error>>()?;
    let mut names: Vec<&String> = vars.keys().collect();
    names.sort();
    let mut opt = AdamW::new(
        names.iter().map(|n| vars[*n].clone()).collect(),
        ParamsAdamW {
            lr: plan.learning_rate,
            weight_decay: 0.0,
            ..ParamsAdamW::default()
        },
    )?;
    let mut rng = ChaCha20Rng::seed_from_u64(plan.seed ^ 0x5eed);
    let (mut first, mut last) = (f32::NAN, f32::NAN);
    for step in 0..plan.steps {
        let mut input = Vec::with_capacity(plan.batch * plan.context);
        let mut target = Vec::with_capacity(plan.batch * plan.context);
        for _ in 0..plan.batch {
            let start = (rng.next_u64() % (text.len() - plan.context - 1) as u64) as usize;
            let window = &text[start..start + plan.context + 1];
            input.extend(window[..plan.context].iter().map(|b| u32::from(*b)));
            target.extend(window[1..].iter().map(|b| u32::from(*b)));
        }
        let ids = Tensor::from_vec(input, (plan.batch, plan.context), &Device::Cpu)?;
        let targets = Tensor::from_vec(target, plan.batch * plan.context, &Device::Cpu)?;
        let model = Llama::from_vars(cfg, &vars)?;
        let logits = model
            .forward(&ids, 0, None)?
            .reshape((plan.batch * plan.context, cfg.vocab_size))?;
        let loss = candle_nn::loss::cross_entropy(&logits, &targets)?;
        opt.backward_step(&loss)?;
        let l = loss.to_dtype(DType::F32)?.to_scalar::<f32>()?;
        if step == 0 {
            first = l;
        }
        last = l;
        progress(step, l);
    }
    let weights = vars
        .into_iter()
        .map(|(k, v)| (k, v.as_tensor().detach()))
        .collect();
    Ok((weights, first, last))
}

/// Which bundled model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    /// Weights from the seed: near-flat distributions.
    Random,
    /// Trained on the text given: peaked distributions.
    Trained,
}

/// What [`ensure`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Ensured {
    /// The directory already held the model of these inputs.
    UpToDate,
    Written {
        /// First and last training loss (nats per byte), for the trained variant.
        loss: Option<(f32, f32)>,
        seconds: f64,
    },
}

/// `bundle.json`: what made a bundled model directory.
pub const STAMP_FILE: &str = "bundle.json";

/// Makes `dir` hold the bundled model of `variant` (trained on `text` with `plan`), unless it
/// already holds the one these inputs make: the training is paid once per content. A lock
/// file beside `dir` keeps two processes from writing it at once.
pub fn ensure(
    dir: &Path,
    variant: Variant,
    text: &[u8],
    plan: &TrainingPlan,
    progress: impl FnMut(usize, f32),
) -> Result<Ensured, BundleError> {
    use sha3::{Digest, Sha3_256};
    let cfg = bundled_config();
    let recipe = serde_json::json!({
        "config": cfg,
        "variant": format!("{variant:?}").to_lowercase(),
        "seed": plan.seed,
        "steps": if variant == Variant::Trained { plan.steps } else { 0 },
        "batch": plan.batch,
        "context": plan.context,
        "learning_rate": plan.learning_rate,
        "text_sha3_256": hex::encode(Sha3_256::digest(if variant == Variant::Trained { text } else { b"" })),
    });
    let parent = dir.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(io(parent))?;
    let lock_path = dir.with_extension("lock");
    let lock = std::fs::File::create(&lock_path).map_err(io(&lock_path))?;
    lock.lock().map_err(io(&lock_path))?;
    let stamp = dir.join(STAMP_FILE);
    if let Ok(old) = std::fs::read(&stamp)
        && serde_json::from_slice::<serde_json::Value>(&old)
            .ok()
            .as_ref()
            == Some(&recipe)
    {
        return Ok(Ensured::UpToDate);
    }
    // The stamp goes first and last: a directory interrupted while writing has none.
    let _ = std::fs::remove_file(&stamp);
    let started = std::time::Instant::now();
    let (weights, loss) = match variant {
        Variant::Random => (initial_weights(&cfg, plan.seed)?, None),
        Variant::Trained => {
            let (w, first, last) = train(&cfg, text, plan, progress)?;
            (w, Some((first, last)))
        }
    };
    write_model_dir(dir, &cfg, &weights)?;
    std::fs::write(
        &stamp,
        serde_json::to_vec_pretty(&recipe).unwrap_or_default(),
    )
    .map_err(io(&stamp))?;
    Ok(Ensured::Written {
        loss,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// The text the bundled model is trained on: the repository's README and `docs/*.md`, in
/// name order, read from the repository at `root`.
pub fn training_text(root: &Path) -> Result<Vec<u8>, BundleError> {
    let docs = root.join("docs");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(&docs)
        .map_err(io(&docs))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    files.sort();
    files.insert(0, root.join("README.md"));
    let mut text = Vec::new();
    for f in files {
        text.extend(std::fs::read(&f).map_err(io(&f))?);
    }
    Ok(text)
}

/// The bundled model of `variant` for the repository at `root`, made (once per content) in
/// `root/target/models/<variant>`: where the demo, the tests and the benchmarks find it.
pub fn cached(root: &Path, variant: Variant) -> Result<std::path::PathBuf, BundleError> {
    let dir = root
        .join("target")
        .join("models")
        .join(format!("{variant:?}").to_lowercase());
    let text = match variant {
        Variant::Trained => training_text(root)?,
        Variant::Random => Vec::new(),
    };
    ensure(&dir, variant, &text, &BUNDLED_TRAINING, |step, loss| {
        if step % 100 == 0 {
            log::info!("training the bundled model: step {step}, loss {loss:.3} nats/byte");
        }
    })?;
    Ok(dir)
}
