//! Building responses: the error body every refusal carries, and typed bodies written the
//! way the API always wrote them (through `serde_json::Value`, keys in order).

// Handlers return a ready `Response` as their error (axum's idiom); boxing it buys nothing.
#![allow(clippy::result_large_err)]

use axum::{
    Json,
    http::{HeaderMap, StatusCode, header},
    response::{IntoResponse, Response},
};
use rackwarden_attest::api::{ErrorBody, to_wire};
use serde::Serialize;

/// `{"error": reason}` with `code`.
pub fn error(code: StatusCode, reason: impl Into<String>) -> Response {
    (
        code,
        Json(ErrorBody {
            error: reason.into(),
        }),
    )
        .into_response()
}

/// 429 with `Retry-After`.
pub fn too_many(retry_after_s: u64, reason: String) -> Response {
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, retry_after_s.to_string())],
        Json(ErrorBody { error: reason }),
    )
        .into_response()
}

/// A 200 with `body` as JSON, byte-for-byte as the hand-built bodies were.
pub fn json<T: Serialize>(body: &T) -> Response {
    match to_wire(body) {
        Ok(bytes) => ([(header::CONTENT_TYPE, "application/json")], bytes).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

/// 415 unless the request says its body is JSON.
pub fn require_json(headers: &HeaderMap) -> Result<(), Response> {
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
