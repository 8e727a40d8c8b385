//! Serving one completion: the prompt's ids through the model, then one token at a time
//! drawn with the shared sampler from the request's seed, until end-of-sequence or
//! `max_tokens`; and the canonical body that names them.

use rackwarden_sampler::{SamplerError, Seed, sample};

use crate::files::LoadedModel;
use crate::model::ModelError;
use crate::protocol::{
    Choice, CompletionBody, CompletionRequest, ErrorStatus, FinishReason, SamplingUsed, Usage,
};
use crate::tokenizer::TokenizerError;

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    Sampler(#[from] SamplerError),
}

/// The ids drawn for `prompt_ids` and why drawing stopped.
pub fn draw(
    model: &LoadedModel,
    request: &CompletionRequest,
    prompt_ids: &[u32],
    seed: &Seed,
) -> Result<(Vec<u32>, FinishReason), GenerateError> {
    let params = request.params();
    draw_with(model, request, prompt_ids, |position, logits| {
        Ok(sample(&params, seed, position, logits)?)
    })
}

/// Generation's loop: the prompt through the model, then `pick(position, logits)` chooses
/// each id (the sampler for the honest server, something else for a dishonest one) until
/// end-of-sequence or `max_tokens`.
pub fn draw_with(
    model: &LoadedModel,
    request: &CompletionRequest,
    prompt_ids: &[u32],
    mut pick: impl FnMut(u64, &[f32]) -> Result<u32, GenerateError>,
) -> Result<(Vec<u32>, FinishReason), GenerateError> {
    let eos = model.tokenizer.eos();
    let mut cache = model.llama.new_cache();
    let mut logits = model.llama.step(prompt_ids, &mut cache)?;
    let mut out = Vec::new();
    for position in 0..u64::from(request.max_tokens) {
        let t = pick(position, &logits)?;
        out.push(t);
        if Some(t) == eos {
            return Ok((out, FinishReason::Stop));
        }
        if position + 1 < u64::from(request.max_tokens) {
            logits = model.llama.step(&[t], &mut cache)?;
        }
    }
    Ok((out, FinishReason::Length))
}

/// The body naming `ids` for `request`: the text is the tokenizer's decoding of the ids, so
/// the ids alone determine every byte.
pub fn completion_body(
    model: &LoadedModel,
    request: &CompletionRequest,
    prompt_tokens: usize,
    key_epoch: u64,
    seed: &Seed,
    ids: Vec<u32>,
    finish_reason: FinishReason,
) -> Result<CompletionBody, GenerateError> {
    let text = model.tokenizer.decode(&ids)?;
    let prompt_tokens = u32::try_from(prompt_tokens).unwrap_or(u32::MAX);
    let completion_tokens = u32::try_from(ids.len()).unwrap_or(u32::MAX);
    Ok(CompletionBody {
        object: "text_completion".into(),
        model: request.model.clone(),
        model_sha3_256: hex::encode(model.digest),
        sampling: SamplingUsed {
            epoch: key_epoch,
            seed: hex::encode(seed.0),
        },
        choices: vec![Choice {
            index: 0,
            text,
            token_ids: ids,
            finish_reason,
        }],
        usage: Usage {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens.saturating_add(completion_tokens),
        },
    })
}

/// Whether the model can serve `request` at all, decided before drawing anything: the
/// prompt must tokenize to at least one id, and prompt and `max_tokens` must fit the model's
/// positions together (whether generation would stop early is not known before it runs).
/// The server answers a refused request with the fixed 400 and the replay expects exactly
/// that, so a client's oversized request is no finding against an honest host.
pub fn admit(model: &LoadedModel, request: &CompletionRequest) -> Result<Vec<u32>, ErrorStatus> {
    let prompt_ids = model
        .tokenizer
        .encode(&request.prompt)
        .map_err(|_| ErrorStatus::BadRequest)?;
    let needed = prompt_ids.len() as u64 + u64::from(request.max_tokens);
    if prompt_ids.is_empty() || needed > model.llama.config().max_position_embeddings as u64 {
        return Err(ErrorStatus::BadRequest);
    }
    Ok(prompt_ids)
}

/// Serves an admitted request ([`admit`]): draw, and the canonical body.
pub fn complete(
    model: &LoadedModel,
    request: &CompletionRequest,
    prompt_ids: &[u32],
    key_epoch: u64,
    seed: &Seed,
) -> Result<CompletionBody, GenerateError> {
    let (ids, finish) = draw(model, request, prompt_ids, seed)?;
    completion_body(
        model,
        request,
        prompt_ids.len(),
        key_epoch,
        seed,
        ids,
        finish,
    )
}
