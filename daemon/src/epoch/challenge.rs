//! Asking the verifier for this epoch's nonce (`POST /v1/challenges`). If it cannot be had
//! within `challenge_timeout`, the epoch goes on with a nonce of our own and the statement
//! says `unchallenged`: the verifier never sees a local nonce presented as its own.

use std::time::Duration;

use rackwarden_attest::{
    api::{ChallengeRequest, ChallengeResponse},
    nonce::Nonce,
};

use crate::config::epoch::VerifierEndpoint;

/// Where this epoch's nonce came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EpochChallenge {
    /// Issued by the verifier; the wipe is keyed by it and the statement names it.
    Verifier { nonce: Nonce },
    /// No verifier nonce: the wipe is keyed by a local random nonce and the statement says
    /// `unchallenged`. `reason` says why (logged and shown in status).
    Unchallenged { local: Nonce, reason: String },
}

impl EpochChallenge {
    /// The nonce the wipe stream is keyed with.
    pub fn wipe_nonce(&self) -> Nonce {
        match self {
            EpochChallenge::Verifier { nonce } => *nonce,
            EpochChallenge::Unchallenged { local, .. } => *local,
        }
    }

    /// The statement's `challenge` field.
    pub fn statement_challenge(&self) -> rackwarden_attest::statement::Challenge {
        match self {
            EpochChallenge::Verifier { nonce } => rackwarden_attest::statement::Challenge::Nonce {
                nonce: nonce.to_hex(),
            },
            EpochChallenge::Unchallenged { .. } => {
                rackwarden_attest::statement::Challenge::Unchallenged
            }
        }
    }
}

/// Why the verifier's nonce could not be had (the statement then says `unchallenged`).
#[derive(Debug, thiserror::Error)]
enum AskError {
    #[error("{0}")]
    Client(String),
    #[error("{url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("{url}: reading the answer: {source}")]
    Read {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: {status}: {body}")]
    Refused {
        url: String,
        status: reqwest::StatusCode,
        body: String,
    },
    #[error("{url}: answer is not a challenge: {source}")]
    NotAChallenge {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{url}: the verifier's nonce: {source}")]
    BadNonce {
        url: String,
        #[source]
        source: rackwarden_attest::nonce::NonceError,
    },
}

/// Requests a nonce for `rack`/`host`; never fails: a verifier that cannot be reached, or
/// that answers badly, gives `Unchallenged` with the reason.
pub fn request(
    verifier: &VerifierEndpoint,
    rack: &str,
    host: &str,
    timeout: Duration,
) -> Result<EpochChallenge, rackwarden_attest::nonce::NonceError> {
    match ask_any(verifier, rack, host, timeout) {
        Ok(nonce) => Ok(EpochChallenge::Verifier { nonce }),
        Err(reason) => Ok(EpochChallenge::Unchallenged {
            local: Nonce::random()?,
            reason: reason.to_string(),
        }),
    }
}

/// Asks each instance in turn (`url`, then `fallback_urls`) until one issues a nonce, all
/// within `timeout`: they share one database, so the nonce is good at whichever instance
/// gets the statement. The last instance's error when none does.
fn ask_any(
    verifier: &VerifierEndpoint,
    rack: &str,
    host: &str,
    timeout: Duration,
) -> Result<Nonce, AskError> {
    let client =
        super::transport::client(verifier, timeout).map_err(|e| AskError::Client(e.to_string()))?;
    // One deadline for all of them: the epoch waits `challenge_timeout` at most in all.
    let deadline = std::time::Instant::now() + timeout;
    let mut last = None;
    for base in verifier.urls() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break;
        }
        match ask(&client, base, rack, host, left) {
            Ok(n) => return Ok(n),
            Err(e) => {
                log::warn!("challenge: {e}");
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| AskError::Client("no verifier URL".into())))
}

fn ask(
    client: &reqwest::blocking::Client,
    base: &str,
    rack: &str,
    host: &str,
    timeout: Duration,
) -> Result<Nonce, AskError> {
    let url = format!("{base}/v1/challenges");
    let resp = client
        .post(&url)
        .timeout(timeout)
        .json(&ChallengeRequest {
            rack: rack.into(),
            host: host.into(),
        })
        .send()
        .map_err(|e| AskError::Unreachable {
            url: url.clone(),
            cause: super::transport::describe(&e),
        })?;
    let status = resp.status();
    let body = resp.text().map_err(|source| AskError::Read {
        url: url.clone(),
        source,
    })?;
    if !status.is_success() {
        return Err(AskError::Refused {
            url,
            status,
            body: body.trim().into(),
        });
    }
    let r: ChallengeResponse =
        serde_json::from_str(&body).map_err(|source| AskError::NotAChallenge {
            url: url.clone(),
            source,
        })?;
    r.nonce
        .parse()
        .map_err(|source| AskError::BadNonce { url, source })
}
