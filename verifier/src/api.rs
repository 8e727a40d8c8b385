//! The HTTP JSON API. Every bad input gets a 4xx with a reason; nothing here panics on input.
//!
//! - `POST /v1/challenges` `{"rack":R,"host":H}` -> `{"nonce":hex,"expires_at_ms":n}`; 429
//!   with `Retry-After` beyond 16 unused nonces per host or 50 (then 10/s) per source address
//! - `POST /v1/statements` one envelope or an array of them -> one outcome per envelope
//! - `GET /v1/racks`, `GET /v1/racks/{rack}`, `GET /v1/hosts/{rack}/{host}/statements?limit=N`
//! - `GET /v1/hosts/{rack}/{host}/statements/{seq}` the statements stored at that seq (two
//!   for a fork)
//! - `GET /metrics` (Prometheus text)
//! - `GET /`, `GET /racks/{rack}` the auditor's pages (`page`)

// Handlers return a ready `Response` as their error (axum's idiom); boxing it buys nothing.
#![allow(clippy::result_large_err)]

use std::{
    collections::HashMap,
    net::{IpAddr, SocketAddr},
    sync::{Arc, Mutex},
    time::Duration,
};

use axum::{
    Json, Router,
    body::Bytes,
    extract::{ConnectInfo, DefaultBodyLimit, Path, Query, State},
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
    routing::{get, post},
};
use serde::Deserialize;

use crate::service::{IngestOutcome, Verifier};

pub struct AppState {
    pub verifier: Mutex<Verifier>,
    /// Challenges asked per source address (a token bucket each).
    pub challenge_buckets: Mutex<HashMap<IpAddr, SourceBucket>>,
}

impl AppState {
    pub fn new(verifier: Verifier) -> AppState {
        AppState {
            verifier: Mutex::new(verifier),
            challenge_buckets: Mutex::new(HashMap::new()),
        }
    }
}

/// Challenges one source may ask for: `CHALLENGE_BURST` at once, then `CHALLENGE_RATE` per
/// second (a rack host asks once per epoch; this only stops a flood).
pub const CHALLENGE_RATE: f64 = 10.0;
pub const CHALLENGE_BURST: f64 = 50.0;
/// Sources remembered at most; idle ones are forgotten first.
const MAX_SOURCES: usize = 100_000;

pub struct SourceBucket {
    tokens: f64,
    at: std::time::Instant,
}

/// Takes one challenge token for `ip`; `Err(seconds)` until the next one.
fn take_challenge_token(st: &AppState, ip: IpAddr) -> Result<(), u64> {
    let Ok(mut map) = st.challenge_buckets.lock() else {
        return Ok(());
    };
    let now = std::time::Instant::now();
    if map.len() >= MAX_SOURCES {
        map.retain(|_, b| {
            now.duration_since(b.at).as_secs_f64() * CHALLENGE_RATE < CHALLENGE_BURST
        });
    }
    let b = map.entry(ip).or_insert(SourceBucket {
        tokens: CHALLENGE_BURST,
        at: now,
    });
    b.tokens =
        (b.tokens + now.duration_since(b.at).as_secs_f64() * CHALLENGE_RATE).min(CHALLENGE_BURST);
    b.at = now;
    if b.tokens >= 1.0 {
        b.tokens -= 1.0;
        Ok(())
    } else {
        Err(((1.0 - b.tokens) / CHALLENGE_RATE).ceil().max(1.0) as u64)
    }
}

fn too_many(retry_after_s: u64, reason: String) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, retry_after_s.to_string())],
        Json(serde_json::json!({ "error": reason })),
    )
        .into_response()
}

pub use rackwarden_attest::now_ms;

fn error(code: StatusCode, reason: impl Into<String>) -> Response {
    (code, Json(serde_json::json!({ "error": reason.into() }))).into_response()
}

/// Runs `f` on the verifier off the async workers (SQLite is blocking).
pub(crate) async fn with_verifier<T: Send + 'static>(
    st: &Arc<AppState>,
    f: impl FnOnce(&mut Verifier) -> T + Send + 'static,
) -> Result<T, Response> {
    let st = st.clone();
    tokio::task::spawn_blocking(move || {
        let mut v = st
            .verifier
            .lock()
            .map_err(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "verifier state poisoned"))?;
        Ok(f(&mut v))
    })
    .await
    .map_err(|e| error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
}

pub fn router(state: Arc<AppState>, max_body: usize, timeout: Duration) -> Router {
    Router::new()
        .route("/v1/challenges", post(challenge))
        .route("/v1/statements", post(statements))
        .route("/v1/racks", get(racks))
        .route("/v1/racks/{rack}", get(rack))
        .route("/v1/hosts/{rack}/{host}/statements", get(history))
        .route("/v1/hosts/{rack}/{host}/statements/{seq}", get(at_seq))
        .route("/metrics", get(metrics))
        .merge(crate::page::routes())
        .layer(DefaultBodyLimit::max(max_body))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            StatusCode::REQUEST_TIMEOUT,
            timeout,
        ))
        .with_state(state)
}

fn require_json(headers: &HeaderMap) -> Result<(), Response> {
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if ct.split(';').next().map(str::trim) != Some("application/json") {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Type must be application/json (got `{ct}`)"),
        ));
    }
    Ok(())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ChallengeReq {
    rack: String,
    host: String,
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
    if let Err(wait) = take_challenge_token(&st, peer.ip()) {
        return too_many(
            wait,
            format!(
                "{}: more than {CHALLENGE_BURST} challenges at {CHALLENGE_RATE}/s from this address",
                peer.ip()
            ),
        );
    }
    let req: ChallengeReq = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body: {e}")),
    };
    match with_verifier(&st, move |v| v.issue_nonce(&req.rack, &req.host, now_ms())).await {
        Err(r) => r,
        Ok(Ok((nonce, expires))) => {
            Json(serde_json::json!({ "nonce": nonce, "expires_at_ms": expires })).into_response()
        }
        Ok(Err(e @ crate::service::VerifierError::NotEnrolled { .. })) => {
            error(StatusCode::NOT_FOUND, e.to_string())
        }
        Ok(Err(e @ crate::service::VerifierError::TooManyNonces { retry_after_s, .. })) => {
            too_many(retry_after_s, e.to_string())
        }
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

async fn statements(State(st): State<Arc<AppState>>, headers: HeaderMap, body: Bytes) -> Response {
    if let Err(r) = require_json(&headers) {
        return r;
    }
    let value: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("body is not JSON: {e}")),
    };
    let items: Vec<Vec<u8>> = match value {
        serde_json::Value::Array(a) => {
            // Each element re-serialized from the parsed body would not be verbatim: take the
            // raw bytes of each element instead.
            match raw_elements(&body) {
                Some(raw) if raw.len() == a.len() => raw,
                _ => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "could not split the batch into its elements",
                    );
                }
            }
        }
        serde_json::Value::Object(_) => vec![body.to_vec()],
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "body must be one envelope object or an array of them",
            );
        }
    };
    let n = items.len();
    // Signatures and parsing first, outside the lock (concurrent requests run in parallel).
    let keys = match with_verifier(&st, |v| v.keys()).await {
        Ok(k) => k,
        Err(r) => return r,
    };
    let prepared = match tokio::task::spawn_blocking(move || {
        let p: Vec<_> = items
            .iter()
            .map(|it| crate::service::prepare(&keys, it))
            .collect();
        (items, p)
    })
    .await
    {
        Ok(x) => x,
        Err(e) => return error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    };
    match with_verifier(&st, move |v| {
        let (items, prepared) = prepared;
        let now = now_ms();
        v.store
            .conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(|e| e.to_string())?;
        let mut out: Vec<Result<IngestOutcome, String>> = Vec::with_capacity(n);
        for (it, p) in items.iter().zip(prepared) {
            out.push(v.commit(p, it, now).map_err(|e| e.to_string()));
        }
        // One durable commit per request: acknowledged only once it is on disk.
        if let Err(e) = v.store.conn.execute_batch("COMMIT") {
            let _ = v.store.conn.execute_batch("ROLLBACK");
            return Err(e.to_string());
        }
        Ok(out)
    })
    .await
    {
        Err(r) => r,
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(outcomes)) => {
            let body: Vec<serde_json::Value> = outcomes
                .into_iter()
                .enumerate()
                .map(|(i, o)| match o {
                    Ok(o) => serde_json::json!({ "index": i, "status": o.status, "result": o.result, "reason": o.reason }),
                    Err(e) => serde_json::json!({ "index": i, "status": "error", "reason": e }),
                })
                .collect();
            Json(serde_json::json!({ "results": body })).into_response()
        }
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

async fn racks(State(st): State<Arc<AppState>>) -> Response {
    match with_verifier(&st, |v| {
        let now = now_ms();
        let mut list = Vec::new();
        for r in v.racks()? {
            let s = v.rack_standing(&r, now)?;
            list.push(serde_json::json!({"rack": s.rack, "status": s.status, "hosts": s.hosts.len(), "findings": s.findings}));
        }
        Ok::<_, crate::service::VerifierError>(list)
    })
    .await
    {
        Err(r) => r,
        // A store that cannot be read is an error, never an empty (all clear) list.
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(list)) => Json(list).into_response(),
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

async fn history(
    State(st): State<Arc<AppState>>,
    Path((rack, host)): Path<(String, String)>,
    Query(q): Query<HistoryQuery>,
) -> Response {
    let limit = q.limit.unwrap_or(100).min(10_000);
    match with_verifier(&st, move |v| v.store.history(&rack, &host, limit)).await {
        Err(r) => r,
        Ok(Err(e)) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        Ok(Ok(rows)) => Json(rows.into_iter().map(stored_json).collect::<Vec<_>>()).into_response(),
    }
}

fn stored_json(s: crate::store::StoredStatement) -> serde_json::Value {
    serde_json::json!({
        "seq": s.seq, "received_ms": s.received_ms, "epoch_end_ms": s.epoch_end_ms, "status": s.status,
        "result": serde_json::from_str::<serde_json::Value>(&s.result).unwrap_or_default(),
        "envelope": s.envelope,
    })
}

async fn at_seq(
    State(st): State<Arc<AppState>>,
    Path((rack, host, seq)): Path<(String, String, u64)>,
) -> Response {
    match with_verifier(&st, move |v| v.store.by_seq(&rack, &host, seq)).await {
        Err(r) => r,
        Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(rows)) if rows.is_empty() => error(StatusCode::NOT_FOUND, "no statement at that seq"),
        Ok(Ok(rows)) => Json(rows.into_iter().map(stored_json).collect::<Vec<_>>()).into_response(),
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    match with_verifier(&st, |v| v.metrics_text(now_ms())).await {
        Err(r) => r,
        Ok(text) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response(),
    }
}
