//! The verifiable completions protocol: what a request is, how its seed is derived, and the
//! one byte sequence that answers it. The server renders its responses here and the replay
//! renders them again from the claimed tokens, so a response with any byte the tokens do not
//! determine (an extra field, a header, a space) does not replay.
//!
//! Every response is whole and canonical, headers included: `HTTP/1.1`, a status line, exactly
//! `content-type: application/json` and `content-length`, then a compact JSON body whose
//! fields come in the order of the structs below. Errors carry a fixed body per status and
//! never echo the request, so an error is no channel either.

use rackwarden_sampler::{SamplingParams, Seed, request_seed};
use serde::{Deserialize, Serialize};

/// The only path served.
pub const COMPLETIONS_PATH: &str = "/v1/completions";
/// The largest request body accepted.
pub const MAX_REQUEST_BODY: u64 = 1 << 20;
/// Header fields accepted in a request head.
pub const MAX_HEADERS: usize = 64;
/// The longest request head accepted: a longer one is refused (400), however it arrives.
pub const MAX_HEAD: usize = 64 * 1024;
/// The lowest temperature above 0 accepted: below it `logit / T` magnifies the replay's
/// drift past any tolerance (and overflows near 0), so an honest response could not pass.
/// Greedy decoding is temperature 0.
pub const MIN_TEMPERATURE: f64 = 0.01;

fn default_max_tokens() -> u32 {
    16
}
fn default_one() -> f64 {
    1.0
}

/// `POST /v1/completions` (the OpenAI completions shape, the fields a replay can check).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: String,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    #[serde(default = "default_one")]
    pub temperature: f64,
    #[serde(default)]
    pub top_k: u32,
    #[serde(default = "default_one")]
    pub top_p: f64,
}

impl CompletionRequest {
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
        }
    }
}

/// The seed of a request: the sampler's derivation over the epoch key and the request's bytes
/// exactly as received, head and body, from the request line on (`docs/sampler.md`).
pub fn seed_of(epoch_key: &[u8; 32], request: &[u8]) -> Seed {
    request_seed(epoch_key, request)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model drew its end-of-sequence token (the last id).
    Stop,
    /// `max_tokens` ids were drawn.
    Length,
}

/// Which key seeded the response, and the seed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingUsed {
    /// The epoch whose sampling key was used.
    pub epoch: u64,
    pub seed: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Choice {
    pub index: u32,
    pub text: String,
    pub token_ids: Vec<u32>,
    pub finish_reason: FinishReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub total_tokens: u32,
}

/// A completion's body, field for field in the order rendered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompletionBody {
    pub object: String,
    pub model: String,
    pub model_sha3_256: String,
    pub sampling: SamplingUsed,
    pub choices: Vec<Choice>,
    pub usage: Usage,
}

/// The statuses a request can get, each with its fixed body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorStatus {
    BadRequest,
    NotFound,
    MethodNotAllowed,
    LengthRequired,
    PayloadTooLarge,
    /// The server has no sampling key or no model now: not served, nothing to replay.
    Unavailable,
}

impl ErrorStatus {
    fn line_and_code(self) -> (&'static str, &'static str) {
        match self {
            ErrorStatus::BadRequest => ("400 Bad Request", "bad_request"),
            ErrorStatus::NotFound => ("404 Not Found", "not_found"),
            ErrorStatus::MethodNotAllowed => ("405 Method Not Allowed", "method_not_allowed"),
            ErrorStatus::LengthRequired => ("411 Length Required", "length_required"),
            ErrorStatus::PayloadTooLarge => ("413 Content Too Large", "content_too_large"),
            ErrorStatus::Unavailable => ("503 Service Unavailable", "unavailable"),
        }
    }
}

fn render(status_line: &str, body: &[u8]) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    out.extend_from_slice(body);
    out
}

/// The whole response for an error.
pub fn render_error(status: ErrorStatus) -> Vec<u8> {
    let (line, code) = status.line_and_code();
    render(line, format!("{{\"error\":\"{code}\"}}").as_bytes())
}

/// The refusal of a request whose head is `head` (`None`: no head could be read): a `HEAD`
/// request gets the same status line and headers without the body (RFC 9110 §9.3.2), as the
/// tap frames it.
pub fn render_refusal(head: Option<&RequestHead>, status: ErrorStatus) -> Vec<u8> {
    let mut r = render_error(status);
    if head.is_some_and(|h| h.method == "HEAD")
        && let Some(end) = r.windows(4).position(|w| w == b"\r\n\r\n")
    {
        r.truncate(end + 4);
    }
    r
}

/// The whole response for a completion.
pub fn render_completion(body: &CompletionBody) -> Vec<u8> {
    // Serializing a struct of strings and integers cannot fail; an empty body would not
    // replay, so the failure could not pass unseen either.
    let json = serde_json::to_vec(body).unwrap_or_default();
    render("200 OK", &json)
}

/// A request head: method, path, and how its body is framed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    pub path: String,
    /// `Content-Length`, if given (once, and a number).
    pub content_length: Option<u64>,
    /// The head's length in bytes: the body starts there.
    pub head_len: usize,
}

/// What a request head is, once parsed as far as the bytes allow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeadParse {
    Complete(RequestHead),
    /// More bytes are needed.
    Partial,
    /// Not HTTP/1.1 the server can read: answered with this status, then the connection closes.
    Refused(ErrorStatus),
}

/// Parses a request head from the start of `buf`.
pub fn parse_head(buf: &[u8]) -> HeadParse {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head_len = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) if n <= MAX_HEAD => n,
        Ok(httparse::Status::Partial) if buf.len() <= MAX_HEAD => return HeadParse::Partial,
        Ok(_) => return HeadParse::Refused(ErrorStatus::BadRequest),
        Err(_) => return HeadParse::Refused(ErrorStatus::BadRequest),
    };
    let mut content_length = None;
    for h in req.headers.iter() {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return HeadParse::Refused(ErrorStatus::LengthRequired);
        }
        if h.name.eq_ignore_ascii_case("content-length") {
            // Digits only, as the tap reads it (Rust's parse would take a `+`).
            let n = std::str::from_utf8(h.value)
                .ok()
                .map(str::trim)
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok());
            match (n, content_length) {
                (Some(n), None) => content_length = Some(n),
                _ => return HeadParse::Refused(ErrorStatus::BadRequest),
            }
        }
    }
    HeadParse::Complete(RequestHead {
        method: req.method.unwrap_or_default().to_string(),
        path: req.path.unwrap_or_default().to_string(),
        content_length,
        head_len,
    })
}

/// A body the server does not read (over [`MAX_REQUEST_BODY`]): refused with 413 before it
/// arrives, and the connection closed.
pub fn body_refused(head: &RequestHead) -> Option<ErrorStatus> {
    (head.content_length.unwrap_or(0) > MAX_REQUEST_BODY).then_some(ErrorStatus::PayloadTooLarge)
}

/// What a complete request asks for: a completion or a fixed error. The server and the replay both route with this, so they agree on which
/// requests get which answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Routed {
    Completion(CompletionRequest),
    Error(ErrorStatus),
}

/// Routes a request whose head is `head` and body `body` (exactly `content_length` bytes);
/// `served` says which model names are served.
pub fn route(head: &RequestHead, body: &[u8], served: &dyn Fn(&str) -> bool) -> Routed {
    if head.path != COMPLETIONS_PATH {
        return Routed::Error(ErrorStatus::NotFound);
    }
    if head.method != "POST" {
        return Routed::Error(ErrorStatus::MethodNotAllowed);
    }
    let request: CompletionRequest = match serde_json::from_slice(body) {
        Ok(r) => r,
        Err(_) => return Routed::Error(ErrorStatus::BadRequest),
    };
    if !served(&request.model) {
        return Routed::Error(ErrorStatus::NotFound);
    }
    if request.params().check().is_err()
        || (request.temperature > 0.0 && request.temperature < MIN_TEMPERATURE)
    {
        return Routed::Error(ErrorStatus::BadRequest);
    }
    Routed::Completion(request)
}

/// Where two renderings first differ (`None` when equal): the byte offset a finding names.
pub fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    match a.iter().zip(b).position(|(x, y)| x != y) {
        Some(i) => Some(i),
        None if a.len() != b.len() => Some(a.len().min(b.len())),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn a_request_routes_to_a_completion_and_anything_else_to_a_fixed_error() {
        let body = br#"{"model":"m","prompt":"hi","max_tokens":4}"#;
        let raw = [
            format!(
                "POST /v1/completions HTTP/1.1\r\ncontent-length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
            body,
        ]
        .concat();
        let HeadParse::Complete(head) = parse_head(&raw) else {
            panic!("complete head");
        };
        assert_eq!(head.content_length, Some(body.len() as u64));
        let b = &raw[head.head_len..];
        match route(&head, b, &|m| m == "m") {
            Routed::Completion(request) => {
                assert_eq!((request.max_tokens, request.temperature), (4, 1.0))
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            route(&head, b, &|m| m == "other"),
            Routed::Error(ErrorStatus::NotFound)
        );
        assert_eq!(
            route(&head, br#"{"model":"m","prompt":"x","extra":1}"#, &|m| m
                == "m"),
            Routed::Error(ErrorStatus::BadRequest)
        );
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n"),
            HeadParse::Refused(ErrorStatus::LengthRequired)
        );
        assert_eq!(parse_head(b"POST /v1/comp"), HeadParse::Partial);
        assert_eq!(
            parse_head(b"POST / HTTP/1.1\r\ncontent-length: +5\r\n\r\n"),
            HeadParse::Refused(ErrorStatus::BadRequest)
        );
        let long = format!("POST / HTTP/1.1\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(
            parse_head(long.as_bytes()),
            HeadParse::Refused(ErrorStatus::BadRequest)
        );
        assert_eq!(
            parse_head(&long.as_bytes()[..MAX_HEAD + 1]),
            HeadParse::Refused(ErrorStatus::BadRequest),
            "a head is refused once it is longer than MAX_HEAD, however it arrives"
        );
        assert_eq!(
            route(
                &head,
                br#"{"model":"m","prompt":"x","temperature":0.001}"#,
                &|m| m == "m"
            ),
            Routed::Error(ErrorStatus::BadRequest)
        );
        let HeadParse::Complete(h) = parse_head(b"HEAD /v1/completions HTTP/1.1\r\n\r\n") else {
            panic!("complete head");
        };
        assert!(render_refusal(Some(&h), ErrorStatus::MethodNotAllowed).ends_with(b"\r\n\r\n"));
    }

    #[test]
    fn renderings_are_fixed_and_differences_are_located() {
        let e = render_error(ErrorStatus::Unavailable);
        assert_eq!(
            e,
            b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: 23\r\n\r\n{\"error\":\"unavailable\"}"
        );
        assert_eq!(first_difference(b"abc", b"abc"), None);
        assert_eq!(first_difference(b"abc", b"abd"), Some(2));
        assert_eq!(first_difference(b"abc", b"abcd"), Some(3));
    }
}
