//! Text to token ids and back: the bundled model's byte-level tokenizer, or a real model's
//! Hugging Face `tokenizer.json`. Both sides tokenize the prompt with the same file, so the
//! replay runs exactly the ids the server ran.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// The bundled model's tokenizer file: every byte is its own token, then two specials.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByteTokenizerFile {
    pub rackwarden_byte_tokenizer: ByteSpecials,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ByteSpecials {
    pub bos: u32,
    pub eos: u32,
}

/// The bundled model's: bytes 0..=255, then BOS 256 and EOS 257.
pub const BYTE_SPECIALS: ByteSpecials = ByteSpecials { bos: 256, eos: 257 };

pub enum Tokenizer {
    Bytes(ByteSpecials),
    HuggingFace {
        inner: Box<tokenizers::Tokenizer>,
        eos: Option<u32>,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {problem}")]
    File { path: String, problem: String },
    #[error("tokenizing: {0}")]
    Encode(String),
}

impl Tokenizer {
    /// Reads a tokenizer file: the byte-level one if it says so, else a Hugging Face one.
    /// `eos` is the end-of-sequence id from the model's configuration, for the latter.
    pub fn read(path: &Path, eos: Option<u32>) -> Result<Tokenizer, TokenizerError> {
        let problem = |problem: String| TokenizerError::File {
            path: path.display().to_string(),
            problem,
        };
        let bytes = std::fs::read(path).map_err(|e| problem(e.to_string()))?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| problem(format!("line {} column {}: {e}", e.line(), e.column())))?;
        if value.get("rackwarden_byte_tokenizer").is_some() {
            let f: ByteTokenizerFile =
                serde_json::from_value(value).map_err(|e| problem(e.to_string()))?;
            return Ok(Tokenizer::Bytes(f.rackwarden_byte_tokenizer));
        }
        let inner =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| problem(e.to_string()))?;
        Ok(Tokenizer::HuggingFace {
            inner: Box::new(inner),
            eos,
        })
    }

    /// The prompt's ids, with the beginning-of-sequence token the model expects.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        match self {
            Tokenizer::Bytes(s) => Ok(std::iter::once(s.bos)
                .chain(text.bytes().map(u32::from))
                .collect()),
            Tokenizer::HuggingFace { inner, .. } => inner
                .encode(text, true)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizerError::Encode(e.to_string())),
        }
    }

    /// The text of generated ids (special tokens left out; bytes that are not UTF-8 become
    /// U+FFFD, deterministically, so the replay rebuilds the same text).
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        match self {
            Tokenizer::Bytes(_) => {
                let bytes: Vec<u8> = ids.iter().filter_map(|&i| u8::try_from(i).ok()).collect();
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            Tokenizer::HuggingFace { inner, .. } => inner
                .decode(ids, true)
                .map_err(|e| TokenizerError::Encode(e.to_string())),
        }
    }

    /// The id that ends a completion, if the model has one.
    pub fn eos(&self) -> Option<u32> {
        match self {
            Tokenizer::Bytes(s) => Some(s.eos),
            Tokenizer::HuggingFace { eos, .. } => *eos,
        }
    }
}
