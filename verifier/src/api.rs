//! The HTTP JSON API. Every bad input gets a 4xx with a reason; nothing here panics on input.
//!
//! - `POST /v1/challenges` `{"rack":R,"host":H}` -> `{"nonce":hex,"expires_at_ms":n}`; 429
//!   with `Retry-After` beyond 16 unused nonces per host or 50 (then 10/s) per source address
//! - `POST /v1/statements` one envelope or an array of them -> one outcome per envelope
//! - `GET /v1/racks` (each rack's status and the findings behind it, by host),
//!   `GET /v1/racks/{rack}`, `GET /v1/hosts/{rack}/{host}/statements?limit=N`
//! - `GET /v1/hosts/{rack}/{host}/statements/{seq}` the statements stored at that seq (two
//!   for a fork)
//! - `POST /v1/openings` a DSSE envelope (`application/vnd.rackwarden.traffic-openings+json`)
//!   of the records a sample drawn for one epoch landed in, signed by the host's key ->
//!   `OpeningsReceipt` (matched or refused, kept either way); 404 for an epoch with no
//!   sample, 409 when the epoch was answered with other bytes, 403 for a bad signature
//! - `POST /v1/tpm/enroll` a DSSE envelope (`application/vnd.rackwarden.tpm-enroll+json`) of a
//!   `TpmEnrollRequest`, signed by the host's enrolled key -> `TpmCredential` (a credential
//!   for the AK under the certified EK); 409 when `[tpm] ek_roots` is not configured; counts
//!   against the same per-source bucket as challenges
//! - `POST /v1/tpm/activate` `TpmActivation` -> `TpmEnrolled` when the secret is the
//!   credential's (the challenge is used up whatever the answer); 403 naming why not
//! - `GET /tlog/checkpoint` the transparency log's signed checkpoint (C2SP signed note);
//!   `GET /tlog/tile/<L>/<N>[.p/<W>]` and `GET /tlog/tile/entries/<N>[.p/<W>]` its tiles
//!   (C2SP tlog-tiles); `GET /v1/tlog/inclusion?index=I&size=N` and
//!   `GET /v1/tlog/consistency?from=M&to=N` proofs (`rackwarden_attest::api`)
//! - `GET /metrics` (Prometheus text)
//! - `GET /`, `GET /racks/{rack}` the auditor's pages (`page`)

// Handlers return a ready `Response` as their error (axum's idiom); boxing it buys nothing.
#![allow(clippy::result_large_err)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use rackwarden_attest::{
    api::{ChallengeRequest, ChallengeResponse, IngestItem, IngestResponse},
    tpm::TpmActivation,
};
use serde::{Deserialize, Serialize};

pub use crate::app_state::AppState;
use crate::{
    app_state::{CHALLENGE_BURST, CHALLENGE_RATE, with_verifier},
    envelope_check::prepare_all,
    http_responses::{error, json, require_json, too_many},
    service::{AttestationResult, Ingested, LogServeError, Status, TpmEnrolError, VerifierError},
    store::StoredStatement,
};

pub use rackwarden_attest::now_ms;

/// How long one `POST /v1/openings` may take (at least `request_timeout`): a large sampled
/// record crosses at the host's upload rate.
pub const OPENINGS_TIMEOUT: Duration = Duration::from_secs(600);

/// The body limits: `max_body` for every route but `/v1/openings`, which carries sampled
/// records with their bytes and takes up to `max_openings_body`.
pub struct BodyLimits {
    pub max_body: usize,
    pub max_openings_body: usize,
}

pub fn router(state: Arc<AppState>, limits: BodyLimits, timeout: Duration) -> Router {
    let BodyLimits {
        max_body,
        max_openings_body,
    } = limits;
    // Its bodies are large and come at the host's upload rate: its own limit and timeout.
    let openings_route = Router::new()
        .route("/v1/openings", post(openings))
        .layer(DefaultBodyLimit::max(max_openings_body))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            OPENINGS_TIMEOUT.max(timeout),
        ));
    Router::new()
        .route("/v1/challenges", post(challenge))
        .route("/v1/statements", post(statements))
        .route("/v1/tpm/enroll", post(tpm_enroll))
        .route("/v1/tpm/activate", post(tpm_activate))
        .route("/v1/racks", get(racks))
        .route("/v1/racks/{rack}", get(rack))
        .route("/v1/hosts/{rack}/{host}/statements", get(history))
        .route("/v1/hosts/{rack}/{host}/statements/{seq}", get(at_seq))
        .route("/tlog/checkpoint", get(tlog_checkpoint))
        .route("/tlog/tile/{*rest}", get(tlog_tile))
        .route("/v1/tlog/inclusion", get(tlog_inclusion))
        .route("/v1/tlog/consistency", get(tlog_consistency))
        .route("/metrics", get(metrics))
        .merge(crate::page::routes())
        .layer(DefaultBodyLimit::max(max_body))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        .merge(openings_route)
        .with_state(state)
}

async fn challenge(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = require_json(&headers) {
        return r;
    }
    if let Err(wait) = st.take_challenge_token(peer.ip()) {
        return too_many(
            wait,
            format!(
                "{}: more than {CHALLENGE_BURST} challenges at {CHALLENGE_RATE}/s from this address",
                peer.ip()
            ),
        );
    }
    let req: ChallengeRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    match with_verifier(&st, move |v| v.issue_nonce(&req.rack, &req.host, now_ms())).await {
        Err(r) => r,
        Ok(Ok(issued)) => json(&ChallengeResponse {
            nonce: issued.nonce,
            expires_at_ms: issued.expires_at_ms,
        }),
        Ok(Err(e @ VerifierError::NotEnrolled { .. })) => {
            error(StatusCode::NOT_FOUND, e.to_string())
        }
        Ok(Err(e @ VerifierError::TooManyNonces { retry_after_s, .. })) => {
            too_many(retry_after_s, e.to_string())
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// The statements of a POST body, each as its verbatim bytes: one envelope object, or an
/// array of them.
fn split_batch(body: &Bytes) -> Result<Vec<Vec<u8>>, Response> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")))?;
    match value {
        // Each element re-serialized from the parsed body would not be verbatim: take the
        // raw bytes of each element instead.
        serde_json::Value::Array(a) => match raw_elements(body) {
            Some(raw) if raw.len() == a.len() => Ok(raw),
            _ => Err(error(
                StatusCode::BAD_REQUEST,
                "could not split the batch into its elements",
            )),
        },
        serde_json::Value::Object(_) => Ok(vec![body.to_vec()]),
        _ => Err(error(
            StatusCode::BAD_REQUEST,
            "body must be one envelope object or an array of them",
        )),
    }
}

async fn statements(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = require_json(&headers) {
        return r;
    }
    let items = match split_batch(&body) {
        Ok(items) => items,
        Err(r) => return r,
    };
    // Signatures and parsing first, outside the lock (concurrent requests run in parallel).
    let keys = match with_verifier(&st, |v| v.keys()).await {
        Ok(k) => k,
        Err(r) => return r,
    };
    let prepared = match tokio::task::spawn_blocking(move || prepare_all(&keys, items)).await {
        Ok(p) => p,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    match with_verifier(&st, move |v| v.ingest_batch(prepared, now_ms())).await {
        Err(r) => r,
        Ok(Err(VerifierError::Db(e))) => {
            error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}"))
        }
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(outcomes)) => json(&IngestResponse {
            results: outcomes
                .into_iter()
                .enumerate()
                .map(|(i, o)| match o {
                    Ok(Ingested {
                        outcome,
                        log,
                        sample,
                    }) => IngestItem::judged_logged(i, outcome, log, sample),
                    Err(e) => IngestItem::failed(i, e.to_string()),
                })
                .collect(),
        }),
    }
}

async fn openings(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    use crate::service::OpeningsError as E;
    if let Err(r) = require_json(&headers) {
        return r;
    }
    match with_verifier(&st, move |v| v.accept_openings(&body, now_ms())).await {
        Err(r) => r,
        Ok(Ok(receipt)) => json(&receipt),
        Ok(Err(e)) => {
            let code = match &e {
                E::NotEnvelope(_) | E::Malformed(_) => StatusCode::BAD_REQUEST,
                E::UnknownKey | E::Signature(_) => StatusCode::FORBIDDEN,
                E::NoSample { .. } => StatusCode::NOT_FOUND,
                E::AlreadyAnswered { .. } => StatusCode::CONFLICT,
                E::Verifier(_) => StatusCode::SERVICE_UNAVAILABLE,
            };
            error(code, e.to_string())
        }
    }
}

/// The status an AK enrolment refusal is answered with: 409 for a verifier that enrols no AKs,
/// 400 for what does not decode, 404 for a key nobody enrolled, 403 for everything the
/// verifier will not trust, 503 when its storage fails.
fn tpm_refusal(e: TpmEnrolError) -> Response {
    use TpmEnrolError as E;
    let code = match &e {
        E::NotConfigured => StatusCode::CONFLICT,
        E::NotEnvelope(_) | E::Malformed { .. } => StatusCode::BAD_REQUEST,
        E::UnknownKey { .. } => StatusCode::NOT_FOUND,
        E::Signature(_)
        | E::RetiredKey { .. }
        | E::KeyOfAnotherHost { .. }
        | E::EkPublic(_)
        | E::AkPublic(_)
        | E::NoEkCertificate
        | E::EkCertificate(_)
        | E::EkOfAnotherHost { .. }
        | E::UnknownChallenge { .. }
        | E::ChallengeExpired { .. }
        | E::ChallengeOfAnotherHost { .. }
        | E::WrongSecret { .. } => StatusCode::FORBIDDEN,
        E::Credential(_) | E::Random(_) => StatusCode::INTERNAL_SERVER_ERROR,
        E::KeyTable(_) | E::Db(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(code, e.to_string())
}

async fn tpm_enroll(
    State(st): State<Arc<AppState>>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = require_json(&headers) {
        return r;
    }
    // Each request makes the verifier store a challenge: the same bucket as nonces bounds it.
    if let Err(wait) = st.take_challenge_token(peer.ip()) {
        return too_many(
            wait,
            format!(
                "{}: more than {CHALLENGE_BURST} challenges at {CHALLENGE_RATE}/s from this address",
                peer.ip()
            ),
        );
    }
    match with_verifier(&st, move |v| v.tpm_enroll(&body, now_ms())).await {
        Err(r) => r,
        Ok(Ok(credential)) => json(&credential),
        Ok(Err(e)) => tpm_refusal(e),
    }
}

async fn tpm_activate(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if let Err(r) = require_json(&headers) {
        return r;
    }
    let activation: TpmActivation = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    match with_verifier(&st, move |v| v.tpm_activate(&activation, now_ms())).await {
        Err(r) => r,
        Ok(Ok(enrolled)) => json(&enrolled),
        Ok(Err(e)) => tpm_refusal(e),
    }
}

/// The raw bytes of each element of a top-level JSON array (statements are stored verbatim).
fn raw_elements(body: &[u8]) -> Option<Vec<Vec<u8>>> {
    let raws: Vec<&serde_json::value::RawValue> = serde_json::from_slice(body).ok()?;
    Some(
        raws.into_iter()
            .map(|r| r.get().as_bytes().to_vec())
            .collect(),
    )
}

/// One rack in `GET /v1/racks`.
#[derive(Serialize)]
struct RackSummary {
    rack: String,
    status: Status,
    hosts: usize,
    /// What is behind the status: the rack's findings and its hosts', by host.
    findings: Vec<String>,
}

async fn racks(State(st): State<Arc<AppState>>) -> Response {
    match with_verifier(&st, |v| {
        let now = now_ms();
        let mut list = Vec::new();
        for r in v.racks()? {
            let s = v.rack_standing(&r, now)?;
            list.push(RackSummary {
                findings: s.reasons(),
                rack: s.rack,
                status: s.status,
                hosts: s.hosts.len(),
            });
        }
        Ok::<_, VerifierError>(list)
    })
    .await
    {
        Err(r) => r,
        // A store that cannot be read is an error, never an empty (all clear) list.
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(list)) => json(&list),
    }
}

async fn rack(State(st): State<Arc<AppState>>, Path(rack): Path<String>) -> Response {
    match with_verifier(&st, move |v| {
        let racks = v
            .racks()
            .map_err(|e| error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")))?;
        if !racks.contains(&rack) {
            return Err(error(
                StatusCode::NOT_FOUND,
                format!("unknown rack `{rack}`"),
            ));
        }
        v.rack_standing(&rack, now_ms())
            .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))
    })
    .await
    {
        Err(r) | Ok(Err(r)) => r,
        Ok(Ok(s)) => Json(s).into_response(),
    }
}

#[derive(Deserialize)]
struct HistoryQuery {
    limit: Option<u32>,
}

/// A stored statement as the history endpoints show it.
#[derive(Serialize)]
struct HistoryEntry {
    seq: u64,
    received_ms: u64,
    epoch_end_ms: u64,
    status: String,
    result: Option<AttestationResult>,
    envelope: String,
}

impl From<StoredStatement> for HistoryEntry {
    fn from(s: StoredStatement) -> HistoryEntry {
        HistoryEntry {
            result: s.result(),
            seq: s.seq,
            received_ms: s.received_ms,
            epoch_end_ms: s.epoch_end_ms,
            status: s.status,
            envelope: s.envelope,
        }
    }
}

fn history_json(rows: Vec<StoredStatement>) -> Response {
    json(&rows.into_iter().map(HistoryEntry::from).collect::<Vec<_>>())
}

async fn history(
    State(st): State<Arc<AppState>>,
    Path((rack, host)): Path<(String, String)>,
    Query(q): Query<HistoryQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(100).min(10_000);
    match with_verifier(&st, move |v| v.history(&rack, &host, limit)).await {
        Err(r) => r,
        Ok(Err(VerifierError::Db(e))) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Ok(Ok(rows)) => history_json(rows),
    }
}

async fn at_seq(
    State(st): State<Arc<AppState>>,
    Path((rack, host, seq)): Path<(String, String, u64)>,
) -> Response {
    match with_verifier(&st, move |v| v.statements_at(&rack, &host, seq)).await {
        Err(r) => r,
        Ok(Err(VerifierError::Db(e))) => {
            error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}"))
        }
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(rows)) if rows.is_empty() => error(StatusCode::NOT_FOUND, "no statement at that seq"),
        Ok(Ok(rows)) => history_json(rows),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    match with_verifier(&st, |v| v.metrics_text(now_ms())).await {
        Err(r) => r,
        Ok(Err(std::fmt::Error)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "the exposition could not be written",
        ),
        Ok(Ok(text)) => {
            ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
        }
    }
}

fn log_refusal(e: LogServeError) -> Response {
    let code = match &e {
        LogServeError::NoLog | LogServeError::NotFound(_) => StatusCode::NOT_FOUND,
        LogServeError::BadRequest(_) => StatusCode::BAD_REQUEST,
        LogServeError::Internal(_) => StatusCode::SERVICE_UNAVAILABLE,
    };
    error(code, e.to_string())
}

async fn tlog_checkpoint(State(st): State<Arc<AppState>>) -> Response {
    match with_verifier(&st, |v| v.log_checkpoint()).await {
        Err(r) => r,
        Ok(Err(e)) => log_refusal(e),
        Ok(Ok(note)) => {
            ([(header::CONTENT_TYPE, "text/plain; charset=utf-8")], note).into_response()
        }
    }
}

async fn tlog_tile(State(st): State<Arc<AppState>>, Path(rest): Path<String>) -> Response {
    let path = format!("tile/{rest}");
    match with_verifier(&st, move |v| v.log_tile(&path)).await {
        Err(r) => r,
        Ok(Err(e)) => log_refusal(e),
        Ok(Ok(bytes)) => {
            ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
        }
    }
}

#[derive(Deserialize)]
struct InclusionQuery {
    index: u64,
    size: u64,
}

async fn tlog_inclusion(
    State(st): State<Arc<AppState>>,
    Query(q): Query<InclusionQuery>,
) -> Response {
    match with_verifier(&st, move |v| v.log_inclusion(q.index, q.size)).await {
        Err(r) => r,
        Ok(Err(e)) => log_refusal(e),
        Ok(Ok(p)) => json(&p),
    }
}

#[derive(Deserialize)]
struct ConsistencyQuery {
    from: u64,
    to: u64,
}

async fn tlog_consistency(
    State(st): State<Arc<AppState>>,
    Query(q): Query<ConsistencyQuery>,
) -> Response {
    match with_verifier(&st, move |v| v.log_consistency(q.from, q.to)).await {
        Err(r) => r,
        Ok(Err(e)) => log_refusal(e),
        Ok(Ok(p)) => json(&p),
    }
}
