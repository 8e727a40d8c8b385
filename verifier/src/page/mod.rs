//! The auditor's pages: `/` lists racks with their verdict; `/racks/{rack}` shows the
//! rack's hosts, findings with their explanation and statement, timelines, and the
//! scorecard. `view` gathers from the store into `model`, `scorecard` and `inventory`
//! compute, `render` draws.

pub mod inventory;
pub mod model;
pub mod render;
pub mod scorecard;
pub mod view;

use std::sync::Arc;

use axum::{
    Router,
    extract::{Path, Query, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
    routing::get,
};
use rackwarden_attest::now_ms;
use serde::Deserialize;

use crate::{
    app_state::{AppState, with_verifier},
    service::VerifierError,
};

pub fn routes() -> Router<Arc<AppState>> {
    Router::new()
        .route("/", get(index))
        .route("/racks/{rack}", get(rack))
}

fn html(m: maud::Markup) -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            // Nothing on these pages runs script or loads from elsewhere.
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'",
            ),
        ],
        m.into_string(),
    )
        .into_response()
}

fn text(code: StatusCode, msg: String) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        msg,
    )
        .into_response()
}

async fn index(State(st): State<Arc<AppState>>) -> Response {
    match with_verifier(&st, |v| {
        let now = now_ms();
        let mut rows = Vec::new();
        for r in v.racks()? {
            let s = v.rack_standing(&r, now)?;
            rows.push((r, s.status, s.hosts.len()));
        }
        Ok::<_, VerifierError>(render::index(&rows, &v.policy.id, now))
    })
    .await
    {
        Err(r) => r,
        // A store that cannot be read is an error page, never an empty list.
        Ok(Err(e)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(m)) => html(m),
    }
}

#[derive(Deserialize)]
struct RackQuery {
    epochs: Option<u32>,
}

async fn rack(
    State(st): State<Arc<AppState>>,
    Path(rack): Path<String>,
    Query(q): Query<RackQuery>,
) -> Response {
    let window = q.epochs.unwrap_or(view::DEFAULT_WINDOW);
    match with_verifier(&st, move |v| {
        if !v.racks()?.contains(&rack) {
            return Ok(None);
        }
        Ok::<_, VerifierError>(Some(render::rack(&v.rack_view(&rack, now_ms(), window)?)))
    })
    .await
    {
        Err(r) => r,
        Ok(Err(e)) => text(StatusCode::SERVICE_UNAVAILABLE, format!("storage: {e}")),
        Ok(Ok(None)) => text(StatusCode::NOT_FOUND, "unknown rack".into()),
        Ok(Ok(Some(m))) => html(m),
    }
}
