//! The verifier's replay of one recorded exchange: is the response exactly what the
//! precommitted model, sampled with the request's seed, could have sent?
//!
//! In order, each a finding of its own ([`ReplayFinding`]):
//! 1. the request is routed as the server routes it; a request the server must refuse must
//!    have been answered with exactly that fixed error;
//! 2. a completion names its key's epoch, which must be the record's epoch or the one before
//!    (the key file changes a moment after the tap's cut), and the seed that key and the
//!    request's bytes derive;
//! 3. its ids must have the shape generation gives (end-of-sequence only last; short only if
//!    it ended there);
//! 4. the whole response must be the rendering of those ids, byte for byte;
//! 5. one teacher-forced pass over prompt and ids gives the replay's logits; every id is
//!    scored against the seeded winner (the verifier's tolerance judges the scores).

use std::collections::BTreeMap;

use rackwarden_sampler::replay::score_response;
use rackwarden_sampler::verdict::{ExchangeReplay, StructuralFinding};

use crate::files::LoadedModel;
use crate::generate::{admit, completion_body};
use crate::protocol::{
    CompletionBody, ErrorStatus, FinishReason, HeadParse, RequestHead, Routed, body_refused,
    first_difference, parse_head, render_completion, render_error, render_refusal, route, seed_of,
};

/// The models the verifier replays with, by the name requests give.
pub struct ReplayModels {
    pub models: Vec<(String, LoadedModel)>,
}

impl ReplayModels {
    fn get(&self, name: &str) -> Option<&LoadedModel> {
        self.models.iter().find(|(n, _)| n == name).map(|(_, m)| m)
    }
}

/// One exchange as the tap recorded it.
#[derive(Debug, Clone, Copy)]
pub struct RecordedExchange<'a> {
    /// The epoch the record was committed in.
    pub epoch_seq: u64,
    /// From the request line to the end of the body.
    pub request: &'a [u8],
    /// The whole response.
    pub response: &'a [u8],
}

fn failed(finding: StructuralFinding) -> ExchangeReplay {
    ExchangeReplay::Failed { finding }
}

/// The response must be exactly the server's refusal of this request.
fn fixed(head: Option<&RequestHead>, expected: ErrorStatus, response: &[u8]) -> ExchangeReplay {
    let want = render_refusal(head, expected);
    match first_difference(&want, response) {
        None => ExchangeReplay::FixedError {
            status: format!("{expected:?}"),
        },
        Some(offset) => failed(StructuralFinding::NotCanonical {
            offset: offset as u64,
        }),
    }
}

/// Replays `exchange` with `models` and the sampling keys by epoch. What it records is
/// tolerance-free; [`ExchangeReplay::judge`] applies one.
pub fn replay_exchange(
    models: &ReplayModels,
    keys: &BTreeMap<u64, [u8; 32]>,
    exchange: &RecordedExchange<'_>,
) -> ExchangeReplay {
    let request = exchange.request;
    let head = match parse_head(request) {
        HeadParse::Complete(h) => h,
        HeadParse::Refused(s) => return fixed(None, s, exchange.response),
        HeadParse::Partial => return failed(StructuralFinding::RequestUnframed),
    };
    if let Some(s) = body_refused(&head) {
        return fixed(Some(&head), s, exchange.response);
    }
    let body = &request[head.head_len..];
    if head.content_length.unwrap_or(0) != body.len() as u64 {
        return failed(StructuralFinding::RequestUnframed);
    }
    let req = match route(&head, body, &|m| models.get(m).is_some()) {
        Routed::Error(s) => return fixed(Some(&head), s, exchange.response),
        Routed::Completion(r) => r,
    };
    let Some(model) = models.get(&req.model) else {
        return failed(StructuralFinding::RequestUnframed);
    };
    let prompt = match admit(model, &req) {
        Ok(p) => p,
        Err(s) => return fixed(Some(&head), s, exchange.response),
    };
    // Not served: the key could not be read (503), or this host does not serve that model
    // (404; the verifier may hold models another host serves). Nothing generated, no byte
    // chosen; the choice between serving and not is a bit a host has per exchange.
    for s in [ErrorStatus::Unavailable, ErrorStatus::NotFound] {
        if exchange.response == render_error(s).as_slice() {
            return ExchangeReplay::FixedError {
                status: format!("{s:?}"),
            };
        }
    }
    let claimed = match claimed_body(exchange.response) {
        Ok(b) => b,
        Err(problem) => return failed(StructuralFinding::NotACompletion { problem }),
    };
    let expected_digest = hex::encode(model.digest);
    if claimed.model_sha3_256 != expected_digest {
        return failed(StructuralFinding::OtherModel {
            named: claimed.model_sha3_256,
            expected: expected_digest,
        });
    }
    let named = claimed.sampling.epoch;
    if named > exchange.epoch_seq || named.saturating_add(1) < exchange.epoch_seq {
        return failed(StructuralFinding::KeyEpoch {
            named,
            record: exchange.epoch_seq,
        });
    }
    let Some(key) = keys.get(&named) else {
        return failed(StructuralFinding::KeyUnknown { epoch: named });
    };
    let seed = seed_of(key, request);
    if claimed.sampling.seed != hex::encode(seed.0) {
        return failed(StructuralFinding::SeedNotDerived {
            named: claimed.sampling.seed,
            derived: hex::encode(seed.0),
        });
    }
    let Some(choice) = claimed.choices.into_iter().next() else {
        return failed(StructuralFinding::NotACompletion {
            problem: "no choice".into(),
        });
    };
    let ids = choice.token_ids;
    let finish = match token_shape(&ids, req.max_tokens, model.tokenizer.eos()) {
        Ok(f) => f,
        Err(problem) => return failed(StructuralFinding::TokenShape { problem }),
    };
    let rebuilt = completion_body(model, &req, prompt.len(), named, &seed, ids.clone(), finish)
        .map(|b| render_completion(&b));
    match rebuilt {
        Ok(r) => {
            if let Some(offset) = first_difference(&r, exchange.response) {
                return failed(StructuralFinding::NotCanonical {
                    offset: offset as u64,
                });
            }
        }
        Err(e) => {
            return failed(StructuralFinding::Unreplayable {
                problem: e.to_string(),
            });
        }
    }
    match teacher_forced_logits(model, &prompt, &ids).and_then(|rows| {
        score_response(&req.params(), &seed, &rows, &ids)
            .map(ExchangeReplay::from)
            .map_err(|e| e.to_string())
    }) {
        Ok(r) => r,
        Err(problem) => failed(StructuralFinding::Unreplayable { problem }),
    }
}

/// Judges the bytes of an inference connection that were not a complete exchange when the
/// epoch closed (a partial record; `None` when the host sent none). Bytes sent with no request
/// pending answer nothing: no server sends them. Bytes sent while a request is pending are
/// the start of its response, judged whole when its exchange is committed.
pub fn replay_partial(input: &[u8], output: &[u8]) -> Option<ExchangeReplay> {
    if output.is_empty() {
        return None;
    }
    let bytes = output.len() as u64;
    Some(if input.is_empty() {
        failed(StructuralFinding::UnrequestedOutput { bytes })
    } else {
        ExchangeReplay::InFlight {
            output_bytes: bytes,
        }
    })
}

/// The logits rows that predicted each of `ids` after `prompt`, from one pass.
pub fn teacher_forced_logits(
    model: &LoadedModel,
    prompt: &[u32],
    ids: &[u32],
) -> Result<Vec<Vec<f32>>, String> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let mut all = prompt.to_vec();
    // The last id is predicted, never run: the pass stops before it.
    all.extend_from_slice(&ids[..ids.len() - 1]);
    let rows = model.llama.logits_all(&all).map_err(|e| e.to_string())?;
    Ok(rows
        .into_iter()
        .skip(prompt.len().saturating_sub(1))
        .collect())
}

/// The completion a response claims (its body parsed; the bytes are checked by rendering).
fn claimed_body(response: &[u8]) -> Result<CompletionBody, String> {
    let mut headers = [httparse::EMPTY_HEADER; 8];
    let mut r = httparse::Response::new(&mut headers);
    let n = match r.parse(response) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Err("the response head is incomplete".into()),
        Err(e) => return Err(format!("the response head: {e}")),
    };
    if r.code != Some(200) {
        return Err(format!("status {:?}", r.code));
    }
    // The body as framed: bytes after it are found by the rendering's comparison.
    let len = r
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))
        .and_then(|h| {
            std::str::from_utf8(h.value)
                .ok()?
                .trim()
                .parse::<usize>()
                .ok()
        })
        .ok_or("no content-length")?;
    let body = response
        .get(n..n.saturating_add(len))
        .ok_or("the body is shorter than its content-length")?;
    serde_json::from_slice(body).map_err(|e| format!("the body: {e}"))
}

/// Checks that `ids` could come from generation with `max_tokens` and `eos`, and says why it
/// stopped.
fn token_shape(ids: &[u32], max_tokens: u32, eos: Option<u32>) -> Result<FinishReason, String> {
    if ids.len() as u64 > u64::from(max_tokens) {
        return Err(format!("{} ids for max_tokens {max_tokens}", ids.len()));
    }
    if let Some(e) = eos
        && let Some(p) = ids.iter().position(|&t| t == e)
        && p + 1 != ids.len()
    {
        return Err(format!("end-of-sequence at {p} is not the last id"));
    }
    match ids.last() {
        Some(&t) if Some(t) == eos => Ok(FinishReason::Stop),
        _ if ids.len() as u64 == u64::from(max_tokens) => Ok(FinishReason::Length),
        _ => Err(format!(
            "{} ids end without end-of-sequence before max_tokens {max_tokens}",
            ids.len()
        )),
    }
}
