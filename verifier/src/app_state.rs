//! What the HTTP handlers share: the verifier behind its lock, and the per-source
//! challenge buckets. The API and the pages both take it from here.

// Handlers return a ready `Response` as their error (axum's idiom); boxing it buys nothing.
#![allow(clippy::result_large_err)]

use std::{
    collections::HashMap,
    net::IpAddr,
    sync::{Arc, Mutex},
};

use axum::{http::StatusCode, response::Response};

use crate::{http_responses::error, service::Verifier};

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

    /// Takes one challenge token for `ip`; `Err(seconds)` until the next one.
    pub fn take_challenge_token(&self, ip: IpAddr) -> Result<(), u64> {
        let Ok(mut map) = self.challenge_buckets.lock() else {
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
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * CHALLENGE_RATE)
            .min(CHALLENGE_BURST);
        b.at = now;
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Ok(())
        } else {
            Err(((1.0 - b.tokens) / CHALLENGE_RATE).ceil().max(1.0) as u64)
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

/// Runs `f` on the verifier off the async workers (SQLite is blocking).
pub async fn with_verifier<T: Send + 'static>(
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
