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
//! 5. one teacher-forced pass over prompt and ids gives the replay's logits, and no id may
//!    trail the seeded winner by more than the tolerance.

use std::collections::BTreeMap;

use rackwarden_sampler::replay::{ReplayVerdict, judge};
use serde::{Deserialize, Serialize};

use crate::files::LoadedModel;
use crate::generate::completion_body;
use crate::protocol::{
    CompletionBody, ErrorStatus, FinishReason, HeadParse, Routed, first_difference, parse_head,
    render_completion, render_error, route, seed_of,
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

/// What the replay found in a response that does not replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "finding", rename_all = "snake_case")]
pub enum ReplayFinding {
    #[error("the request is not one complete HTTP/1.1 request")]
    RequestUnframed,
    #[error("the response differs from the server's rendering at byte {offset}")]
    NotCanonical { offset: u64 },
    #[error("the response is not a completion: {problem}")]
    NotACompletion { problem: String },
    #[error("the response names model {named}, the replay has {expected} under that name")]
    OtherModel { named: String, expected: String },
    #[error(
        "the response names the sampling key of epoch {named}; a record of epoch {record} may use {record} or the one before"
    )]
    KeyEpoch { named: u64, record: u64 },
    #[error("the verifier has no sampling key for epoch {epoch}")]
    KeyUnknown { epoch: u64 },
    #[error("the response names seed {named}; the epoch's key and the request derive {derived}")]
    SeedNotDerived { named: String, derived: String },
    #[error("the token ids do not have a generation's shape: {problem}")]
    TokenShape { problem: String },
    #[error(
        "token {position}: the response has id {claimed}, the replay draws {replayed}; it trails by {margin} (tolerance {tolerance})"
    )]
    Diverged {
        position: u64,
        claimed: u32,
        replayed: u32,
        margin: f64,
        tolerance: f64,
    },
    #[error("the replay cannot run the model on it: {problem}")]
    Unreplayable { problem: String },
}

/// A replay's result for one exchange.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum ReplayOutcome {
    /// A completion, every token within the tolerance.
    Passed(ReplayScores),
    /// A request answered with the fixed error it must get (or 503, not served): nothing
    /// generated, nothing to replay, and no byte the host chose.
    FixedError { status: String },
    Failed {
        finding: ReplayFinding,
        /// The scores, when the replay got as far as running the model.
        scores: Option<ReplayScores>,
    },
}

impl ReplayOutcome {
    pub fn passed(&self) -> bool {
        !matches!(self, ReplayOutcome::Failed { .. })
    }
}

/// The figures of a replayed completion.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ReplayScores {
    pub tokens: u64,
    /// Tokens that are not the replay's own draw (margin above 0).
    pub differing: u64,
    pub max_margin: f64,
    pub mean_logprob: f64,
}

impl From<&ReplayVerdict> for ReplayScores {
    fn from(v: &ReplayVerdict) -> Self {
        ReplayScores {
            tokens: v.tokens as u64,
            differing: v.differing as u64,
            max_margin: v.max_margin,
            mean_logprob: v.mean_logprob,
        }
    }
}

fn failed(finding: ReplayFinding) -> ReplayOutcome {
    ReplayOutcome::Failed {
        finding,
        scores: None,
    }
}

fn fixed(expected: ErrorStatus, response: &[u8]) -> ReplayOutcome {
    let want = render_error(expected);
    match first_difference(&want, response) {
        None => ReplayOutcome::FixedError {
            status: format!("{expected:?}"),
        },
        Some(offset) => failed(ReplayFinding::NotCanonical {
            offset: offset as u64,
        }),
    }
}

/// Replays `exchange` with `models`, the sampling keys by epoch, and `tolerance`.
pub fn replay_exchange(
    models: &ReplayModels,
    keys: &BTreeMap<u64, [u8; 32]>,
    exchange: &RecordedExchange<'_>,
    tolerance: f64,
) -> ReplayOutcome {
    let request = exchange.request;
    let head = match parse_head(request) {
        HeadParse::Complete(h) => h,
        HeadParse::Refused(s) => return fixed(s, exchange.response),
        HeadParse::Partial => return failed(ReplayFinding::RequestUnframed),
    };
    let body = &request[head.head_len..];
    if head.content_length.unwrap_or(0) != body.len() as u64 {
        return failed(ReplayFinding::RequestUnframed);
    }
    let req = match route(&head, body, &|m| models.get(m).is_some()) {
        Routed::Error(s) => return fixed(s, exchange.response),
        Routed::Completion(r) => r,
    };
    if exchange.response == render_error(ErrorStatus::Unavailable).as_slice() {
        return ReplayOutcome::FixedError {
            status: format!("{:?}", ErrorStatus::Unavailable),
        };
    }
    let Some(model) = models.get(&req.model) else {
        return failed(ReplayFinding::RequestUnframed);
    };
    let claimed = match claimed_body(exchange.response) {
        Ok(b) => b,
        Err(problem) => return failed(ReplayFinding::NotACompletion { problem }),
    };
    let expected_digest = hex::encode(model.digest);
    if claimed.model_sha3_256 != expected_digest {
        return failed(ReplayFinding::OtherModel {
            named: claimed.model_sha3_256,
            expected: expected_digest,
        });
    }
    let named = claimed.sampling.epoch;
    if named > exchange.epoch_seq || named.saturating_add(1) < exchange.epoch_seq {
        return failed(ReplayFinding::KeyEpoch {
            named,
            record: exchange.epoch_seq,
        });
    }
    let Some(key) = keys.get(&named) else {
        return failed(ReplayFinding::KeyUnknown { epoch: named });
    };
    let seed = seed_of(key, request);
    if claimed.sampling.seed != hex::encode(seed.0) {
        return failed(ReplayFinding::SeedNotDerived {
            named: claimed.sampling.seed,
            derived: hex::encode(seed.0),
        });
    }
    let Some(choice) = claimed.choices.into_iter().next() else {
        return failed(ReplayFinding::NotACompletion {
            problem: "no choice".into(),
        });
    };
    let ids = choice.token_ids;
    let finish = match token_shape(&ids, req.max_tokens, model.tokenizer.eos()) {
        Ok(f) => f,
        Err(problem) => return failed(ReplayFinding::TokenShape { problem }),
    };
    let prompt = match model.tokenizer.encode(&req.prompt) {
        Ok(p) => p,
        Err(e) => {
            return failed(ReplayFinding::Unreplayable {
                problem: e.to_string(),
            });
        }
    };
    let rebuilt = completion_body(model, &req, prompt.len(), named, &seed, ids.clone(), finish)
        .map(|b| render_completion(&b));
    match rebuilt {
        Ok(r) => {
            if let Some(offset) = first_difference(&r, exchange.response) {
                return failed(ReplayFinding::NotCanonical {
                    offset: offset as u64,
                });
            }
        }
        Err(e) => {
            return failed(ReplayFinding::Unreplayable {
                problem: e.to_string(),
            });
        }
    }
    let verdict = teacher_forced_logits(model, &prompt, &ids).and_then(|rows| {
        judge(&req.params(), &seed, &rows, &ids, tolerance).map_err(|e| e.to_string())
    });
    match verdict {
        Err(problem) => failed(ReplayFinding::Unreplayable { problem }),
        Ok(v) => match v.first_divergence {
            None => ReplayOutcome::Passed(ReplayScores::from(&v)),
            Some(d) => ReplayOutcome::Failed {
                finding: ReplayFinding::Diverged {
                    position: d.position,
                    claimed: d.claimed,
                    replayed: d.replayed,
                    margin: d.margin,
                    tolerance,
                },
                scores: Some(ReplayScores::from(&v)),
            },
        },
    }
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
    Ok(rows.into_iter().skip(prompt.len().saturating_sub(1)).collect())
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
