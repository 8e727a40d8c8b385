//! Asking the verifier for this epoch's nonce (`POST /v1/challenges`). If it cannot be had
//! within `challenge_timeout`, the epoch goes on with a nonce of our own and the statement
//! says `unchallenged`: the verifier never sees a local nonce presented as its own.

use std::time::Duration;

use rackwarden_attest::nonce::Nonce;

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

#[derive(serde::Deserialize)]
struct ChallengeResponse {
    nonce: String,
}

/// Requests a nonce for `rack`/`host`; never fails: a verifier that cannot be reached, or
/// that answers badly, gives `Unchallenged` with the reason.
pub fn request(
    verifier: &VerifierEndpoint,
    rack: &str,
    host: &str,
    timeout: Duration,
) -> Result<EpochChallenge, rackwarden_attest::nonce::NonceError> {
    match ask(verifier, rack, host, timeout) {
        Ok(nonce) => Ok(EpochChallenge::Verifier { nonce }),
        Err(reason) => Ok(EpochChallenge::Unchallenged {
            local: Nonce::random()?,
            reason,
        }),
    }
}

fn ask(
    verifier: &VerifierEndpoint,
    rack: &str,
    host: &str,
    timeout: Duration,
) -> Result<Nonce, String> {
    let client = super::transport::client(verifier, timeout)?;
    let url = format!("{}/v1/challenges", verifier.url);
    let resp = client
        .post(&url)
        .json(&serde_json::json!({"rack": rack, "host": host}))
        .send()
        .map_err(|e| format!("{url}: {}", super::transport::describe(&e)))?;
    let status = resp.status();
    let body = resp
        .text()
        .map_err(|e| format!("{url}: reading the answer: {e}"))?;
    if !status.is_success() {
        return Err(format!("{url}: {status}: {}", body.trim()));
    }
    let r: ChallengeResponse = serde_json::from_str(&body)
        .map_err(|e| format!("{url}: answer is not a challenge: {e}"))?;
    r.nonce
        .parse()
        .map_err(|e| format!("{url}: the verifier's nonce: {e}"))
}
