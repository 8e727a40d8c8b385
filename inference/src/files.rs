//! A model directory as the image set holds it: `config.json`, `tokenizer.json` and
//! `model.safetensors`, and the digest that names the three together.
//!
//! The digest is what a response names and what the replay looks up in the verifier's own
//! copy: `SHA3-256("rackwarden/model/v1\0" || SHA3-256(config.json) || SHA3-256(tokenizer.json)
//! || SHA3-256(model.safetensors))`. The three files are also images of the signed manifest,
//! each under its own digest, so the verifier knows which model the rack may serve.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use sha3::{Digest, Sha3_256};

use crate::model::{Llama, LlamaConfig, ModelError};
use crate::tokenizer::{Tokenizer, TokenizerError};

pub const CONFIG_FILE: &str = "config.json";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const MODEL_DIGEST_DOMAIN: &[u8] = b"rackwarden/model/v1\0";

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{path}: {error}")]
    Io { path: String, error: std::io::Error },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{path}: {problem}")]
    Weights { path: String, problem: String },
}

/// A model ready to run: its weights in one precision and its tokenizer.
pub struct LoadedModel {
    pub dir: PathBuf,
    pub digest: [u8; 32],
    pub llama: Llama,
    pub tokenizer: Tokenizer,
}

/// The model digest of the directory `dir` (reads the three files whole).
pub fn model_digest(dir: &Path) -> Result<[u8; 32], LoadError> {
    let mut h = Sha3_256::new();
    h.update(MODEL_DIGEST_DOMAIN);
    for f in [CONFIG_FILE, TOKENIZER_FILE, WEIGHTS_FILE] {
        let p = dir.join(f);
        let bytes = std::fs::read(&p).map_err(|error| LoadError::Io {
            path: p.display().to_string(),
            error,
        })?;
        h.update(Sha3_256::digest(&bytes));
    }
    Ok(h.finalize().into())
}

/// The end-of-sequence id a Hugging Face `config.json` names (a number or the first of a list).
fn config_eos(path: &Path) -> Option<u32> {
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    let e = v.get("eos_token_id")?;
    e.as_u64()
        .or_else(|| e.as_array()?.first()?.as_u64())
        .and_then(|n| u32::try_from(n).ok())
}

impl LoadedModel {
    /// Loads `dir` with its weights in `dtype`.
    pub fn open(dir: &Path, dtype: DType) -> Result<LoadedModel, LoadError> {
        let digest = model_digest(dir)?;
        let cfg_path = dir.join(CONFIG_FILE);
        let cfg = LlamaConfig::read(&cfg_path)?;
        let tokenizer = Tokenizer::read(&dir.join(TOKENIZER_FILE), config_eos(&cfg_path))?;
        let wpath = dir.join(WEIGHTS_FILE);
        let weights = candle_core::safetensors::load(&wpath, &Device::Cpu).map_err(|e| {
            LoadError::Weights {
                path: wpath.display().to_string(),
                problem: e.to_string(),
            }
        })?;
        let llama = Llama::from_weights(&cfg, &weights, dtype, &wpath.display().to_string())?;
        Ok(LoadedModel {
            dir: dir.to_path_buf(),
            digest,
            llama,
            tokenizer,
        })
    }
}
