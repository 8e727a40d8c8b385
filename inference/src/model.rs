//! A Llama-architecture decoder on candle's CPU backend: the reference server generates with
//! it, the replay runs it teacher-forced, and the bundled model is trained with it. One
//! forward pass for all three, so that what is replayed is what was served.
//!
//! It reads the Hugging Face layout (`config.json` keys, `model.layers.N.self_attn.q_proj`
//! weight names, rotary embeddings on split halves) so that a real Llama checkpoint in
//! safetensors loads as the bundled one does. Rope scaling (Llama 3.1's `rope_scaling`) is
//! refused rather than ignored: ignoring it would replay another model.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{D, DType, Device, Tensor, Var};
use serde::{Deserialize, Serialize};

/// The architecture's numbers: the subset of a Hugging Face `config.json` this model reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    #[serde(default = "default_rope_theta")]
    pub rope_theta: f64,
    pub max_position_embeddings: usize,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// Present in Llama 3.1 checkpoints; this model refuses any value but null.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rope_scaling: Option<serde_json::Value>,
}

fn default_rope_theta() -> f64 {
    10_000.0
}

/// Why a model cannot be loaded or run.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("{path}: {problem}")]
    Config { path: String, problem: String },
    #[error("{path}: weight `{name}`: {problem}")]
    Weight {
        path: String,
        name: String,
        problem: String,
    },
    #[error("{tokens} tokens do not fit the model's {max} positions")]
    TooLong { tokens: usize, max: usize },
    #[error("no tokens to run (an empty prompt for a tokenizer without a start token)")]
    Empty,
    #[error("token {token} is outside the vocabulary of {vocab}")]
    Token { token: u32, vocab: usize },
    #[error("tensor arithmetic: {0}")]
    Candle(#[from] candle_core::Error),
}

impl LlamaConfig {
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }

    /// Reads `config.json`, naming the file and what is wrong.
    pub fn read(path: &Path) -> Result<LlamaConfig, ModelError> {
        let problem = |problem: String| ModelError::Config {
            path: path.display().to_string(),
            problem,
        };
        let text = std::fs::read(path).map_err(|e| problem(e.to_string()))?;
        let cfg: LlamaConfig = serde_json::from_slice(&text)
            .map_err(|e| problem(format!("line {} column {}: {e}", e.line(), e.column())))?;
        cfg.check().map_err(problem)?;
        Ok(cfg)
    }

    /// The shapes must divide as the architecture needs.
    pub fn check(&self) -> Result<(), String> {
        if let Some(s) = &self.rope_scaling
            && !s.is_null()
        {
            return Err(format!(
                "rope_scaling {s} is not supported (only plain rotary embeddings)"
            ));
        }
        let h = self.num_attention_heads;
        if h == 0 || !self.hidden_size.is_multiple_of(h) || !self.head_dim().is_multiple_of(2) {
            return Err(format!(
                "hidden_size {} must split into num_attention_heads {h} heads of an even size",
                self.hidden_size
            ));
        }
        let kv = self.kv_heads();
        if kv == 0 || !h.is_multiple_of(kv) {
            return Err(format!(
                "num_attention_heads {h} must be a multiple of num_key_value_heads {kv}"
            ));
        }
        if self.vocab_size == 0 || self.num_hidden_layers == 0 || self.max_position_embeddings == 0
        {
            return Err(
                "vocab_size, num_hidden_layers and max_position_embeddings must be positive".into(),
            );
        }
        Ok(())
    }

    /// Every weight's name and shape, in the Hugging Face layout.
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (d, f, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let kvd = self.kv_heads() * self.head_dim();
        let mut out = vec![
            ("model.embed_tokens.weight".to_string(), vec![v, d]),
            ("model.norm.weight".to_string(), vec![d]),
        ];
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![v, d]));
        }
        for i in 0..self.num_hidden_layers {
            let p = format!("model.layers.{i}");
            out.extend([
                (format!("{p}.input_layernorm.weight"), vec![d]),
                (format!("{p}.post_attention_layernorm.weight"), vec![d]),
                (format!("{p}.self_attn.q_proj.weight"), vec![d, d]),
                (format!("{p}.self_attn.k_proj.weight"), vec![kvd, d]),
                (format!("{p}.self_attn.v_proj.weight"), vec![kvd, d]),
                (format!("{p}.self_attn.o_proj.weight"), vec![d, d]),
                (format!("{p}.mlp.gate_proj.weight"), vec![f, d]),
                (format!("{p}.mlp.up_proj.weight"), vec![f, d]),
                (format!("{p}.mlp.down_proj.weight"), vec![d, f]),
            ]);
        }
        out
    }
}

struct Layer {
    input_norm: Tensor,
    post_norm: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    gate: Tensor,
    up: Tensor,
    down: Tensor,
}

/// The keys and values of the positions already run, per layer: generation runs each new
/// token against them instead of rerunning the prefix.
pub struct KvCache {
    layers: Vec<Option<(Tensor, Tensor)>>,
    len: usize,
}

impl KvCache {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A loaded model in one precision (`dtype`: F32 to serve, F64 for a replay in another
/// precision, either for training).
pub struct Llama {
    cfg: LlamaConfig,
    dtype: DType,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Tensor,
    cos: Tensor,
    sin: Tensor,
}

impl Llama {
    /// Builds the model from named weights (any float dtype; converted to `dtype`), checking
    /// every name and shape the configuration implies and refusing any other.
    pub fn from_weights(
        cfg: &LlamaConfig,
        weights: &HashMap<String, Tensor>,
        dtype: DType,
        source: &str,
    ) -> Result<Llama, ModelError> {
        cfg.check().map_err(|problem| ModelError::Config {
            path: source.to_string(),
            problem,
        })?;
        let shapes: HashMap<String, Vec<usize>> = cfg.weight_shapes().into_iter().collect();
        for name in weights.keys() {
            if !shapes.contains_key(name) && !name.ends_with("rotary_emb.inv_freq") {
                return Err(ModelError::Weight {
                    path: source.to_string(),
                    name: name.clone(),
                    problem: "is not a weight of this architecture".into(),
                });
            }
        }
        let get = |name: &str| -> Result<Tensor, ModelError> {
            let w = weights.get(name).ok_or_else(|| ModelError::Weight {
                path: source.to_string(),
                name: name.to_string(),
                problem: "is missing".into(),
            })?;
            let want = &shapes[name];
            if w.dims() != want.as_slice() {
                return Err(ModelError::Weight {
                    path: source.to_string(),
                    name: name.to_string(),
                    problem: format!("has shape {:?}, the configuration needs {want:?}", w.dims()),
                });
            }
            Ok(w.to_dtype(dtype)?)
        };
        let embed = get("model.embed_tokens.weight")?;
        let lm_head = if cfg.tie_word_embeddings {
            embed.clone()
        } else {
            get("lm_head.weight")?
        };
        let layers = (0..cfg.num_hidden_layers)
            .map(|i| {
                let p = format!("model.layers.{i}");
                Ok(Layer {
                    input_norm: get(&format!("{p}.input_layernorm.weight"))?,
                    post_norm: get(&format!("{p}.post_attention_layernorm.weight"))?,
                    q: get(&format!("{p}.self_attn.q_proj.weight"))?,
                    k: get(&format!("{p}.self_attn.k_proj.weight"))?,
                    v: get(&format!("{p}.self_attn.v_proj.weight"))?,
                    o: get(&format!("{p}.self_attn.o_proj.weight"))?,
                    gate: get(&format!("{p}.mlp.gate_proj.weight"))?,
                    up: get(&format!("{p}.mlp.up_proj.weight"))?,
                    down: get(&format!("{p}.mlp.down_proj.weight"))?,
                })
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let (cos, sin) = rope_tables(cfg, dtype)?;
        Ok(Llama {
            cfg: cfg.clone(),
            dtype,
            embed,
            layers,
            norm: get("model.norm.weight")?,
            lm_head,
            cos,
            sin,
        })
    }

    /// Builds the model on trainable variables (the same arithmetic as serving).
    pub fn from_vars(cfg: &LlamaConfig, vars: &HashMap<String, Var>) -> Result<Llama, ModelError> {
        let weights: HashMap<String, Tensor> = vars
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().clone()))
            .collect();
        let dtype = weights.values().next().map_or(DType::F32, |t| t.dtype());
        Llama::from_weights(cfg, &weights, dtype, "training variables")
    }

    pub fn config(&self) -> &LlamaConfig {
        &self.cfg
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn new_cache(&self) -> KvCache {
        KvCache {
            layers: (0..self.cfg.num_hidden_layers).map(|_| None).collect(),
            len: 0,
        }
    }

    fn check_tokens(&self, tokens: &[u32], before: usize) -> Result<(), ModelError> {
        if tokens.is_empty() {
            return Err(ModelError::Empty);
        }
        let max = self.cfg.max_position_embeddings;
        if before + tokens.len() > max {
            return Err(ModelError::TooLong {
                tokens: before + tokens.len(),
                max,
            });
        }
        if let Some(&token) = tokens.iter().find(|&&t| t as usize >= self.cfg.vocab_size) {
            return Err(ModelError::Token {
                token,
                vocab: self.cfg.vocab_size,
            });
        }
        Ok(())
    }

    /// The logits of every position of `tokens` (one teacher-forced pass), as f32 rows.
    pub fn logits_all(&self, tokens: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        self.check_tokens(tokens, 0)?;
        let ids = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
        let logits = self.forward(&ids, 0, None)?.squeeze(0)?;
        Ok(logits.to_dtype(DType::F32)?.to_vec2::<f32>()?)
    }

    /// Runs `tokens` after what `cache` holds and returns the last position's logits.
    pub fn step(&self, tokens: &[u32], cache: &mut KvCache) -> Result<Vec<f32>, ModelError> {
        self.check_tokens(tokens, cache.len)?;
        let ids = Tensor::new(tokens, &Device::Cpu)?.unsqueeze(0)?;
        let logits = self.forward(&ids, cache.len, Some(cache))?;
        let last = logits.squeeze(0)?.get(tokens.len() - 1)?;
        Ok(last.to_dtype(DType::F32)?.to_vec1::<f32>()?)
    }

    /// `ids` is `[batch, t]` at positions `pos..pos + t`; returns `[batch, t, vocab]`.
    pub fn forward(
        &self,
        ids: &Tensor,
        pos: usize,
        mut cache: Option<&mut KvCache>,
    ) -> Result<Tensor, ModelError> {
        let (_, t) = ids.dims2()?;
        let mut x = self.embed.embedding(&ids.flatten_all()?)?.reshape((
            ids.dims()[0],
            t,
            self.cfg.hidden_size,
        ))?;
        let mask = causal_mask(t, pos, self.dtype)?;
        let cos = self.cos.narrow(0, pos, t)?;
        let sin = self.sin.narrow(0, pos, t)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.input_norm, self.cfg.rms_norm_eps)?;
            let slot = cache.as_deref_mut().map(|c| &mut c.layers[i]);
            let a = self.attention(layer, &h, &cos, &sin, mask.as_ref(), slot)?;
            x = (x + a)?;
            let h = rms_norm(&x, &layer.post_norm, self.cfg.rms_norm_eps)?;
            let m = linear(
                &(linear(&h, &layer.gate)?.silu()? * linear(&h, &layer.up)?)?,
                &layer.down,
            )?;
            x = (x + m)?;
        }
        if let Some(c) = cache {
            c.len += t;
        }
        let x = rms_norm(&x, &self.norm, self.cfg.rms_norm_eps)?;
        Ok(linear(&x, &self.lm_head)?)
    }

    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        mask: Option<&Tensor>,
        cache: Option<&mut Option<(Tensor, Tensor)>>,
    ) -> candle_core::Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (h, kvh, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.kv_heads(),
            self.cfg.head_dim(),
        );
        let heads = |w: &Tensor, n: usize| -> candle_core::Result<Tensor> {
            linear(x, w)?
                .reshape((b, t, n, hd))?
                .transpose(1, 2)?
                .contiguous()
        };
        let q = rope(&heads(&layer.q, h)?, cos, sin)?;
        let mut k = rope(&heads(&layer.k, kvh)?, cos, sin)?;
        let mut v = heads(&layer.v, kvh)?;
        if let Some(slot) = cache {
            if let Some((pk, pv)) = slot.as_ref() {
                k = Tensor::cat(&[pk, &k], 2)?;
                v = Tensor::cat(&[pv, &v], 2)?;
            }
            *slot = Some((k.clone(), v.clone()));
        }
        let k = repeat_kv(&k, h / kvh)?;
        let v = repeat_kv(&v, h / kvh)?;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut att = (q.matmul(&k.t()?.contiguous()?)? * scale)?;
        if let Some(m) = mask {
            att = att.broadcast_add(m)?;
        }
        let att = candle_nn::ops::softmax(&att, D::Minus1)?;
        let y = att.matmul(&v)?.transpose(1, 2)?.reshape((b, t, h * hd))?;
        linear(&y, &layer.o)
    }
}

/// `x · wᵀ` for `x` of `[.., in]` and a weight of `[out, in]`.
fn linear(x: &Tensor, w: &Tensor) -> candle_core::Result<Tensor> {
    x.broadcast_matmul(&w.t()?)
}

fn rms_norm(x: &Tensor, w: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let rms = (x.sqr()?.mean_keepdim(D::Minus1)? + eps)?.sqrt()?;
    x.broadcast_div(&rms)?.broadcast_mul(w)
}

/// Rotary embedding on split halves (the Hugging Face Llama convention): `x` is
/// `[b, heads, t, head_dim]`, `cos`/`sin` are `[t, head_dim]`.
fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let half = x.dim(D::Minus1)? / 2;
    let x1 = x.narrow(D::Minus1, 0, half)?;
    let x2 = x.narrow(D::Minus1, half, half)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?
}

fn rope_tables(cfg: &LlamaConfig, dtype: DType) -> candle_core::Result<(Tensor, Tensor)> {
    let hd = cfg.head_dim();
    let n = cfg.max_position_embeddings;
    let mut cos = Vec::with_capacity(n * hd);
    let mut sin = Vec::with_capacity(n * hd);
    for p in 0..n {
        // Each frequency twice: the first and the second half of the head share it.
        for j in 0..hd {
            let i = j % (hd / 2);
            let freq = 1.0 / cfg.rope_theta.powf(2.0 * i as f64 / hd as f64);
            let angle = p as f64 * freq;
            cos.push(angle.cos());
            sin.push(angle.sin());
        }
    }
    Ok((
        Tensor::from_vec(cos, (n, hd), &Device::Cpu)?.to_dtype(dtype)?,
        Tensor::from_vec(sin, (n, hd), &Device::Cpu)?.to_dtype(dtype)?,
    ))
}

/// `-inf` above the diagonal for `t` new positions after `pos` cached ones; none for one token.
fn causal_mask(t: usize, pos: usize, dtype: DType) -> candle_core::Result<Option<Tensor>> {
    if t == 1 {
        return Ok(None);
    }
    let total = pos + t;
    let m: Vec<f32> = (0..t)
        .flat_map(|i| (0..total).map(move |j| if j > pos + i { f32::NEG_INFINITY } else { 0.0 }))
        .collect();
    Tensor::from_vec(m, (t, total), &Device::Cpu)?
        .to_dtype(dtype)
        .map(Some)
}

fn repeat_kv(x: &Tensor, n: usize) -> candle_core::Result<Tensor> {
    if n == 1 {
        return Ok(x.clone());
    }
    let (b, kvh, t, hd) = x.dims4()?;
    x.unsqueeze(2)?
        .expand((b, kvh, n, t, hd))?
        .contiguous()?
        .reshape((b, kvh * n, t, hd))
}
