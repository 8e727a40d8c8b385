//! AK enrolment (issue 22): the verifier enrols this host's attestation key only once the
//! TPM proves, with ActivateCredential, that the AK lives beside the EK a manufacturer
//! certified. Until then it cannot trust the quotes, so the daemon enrols at every start
//! (the verifier replaces or keeps the AK it has) and retries once per epoch until it
//! succeeds. It runs on a thread of its own: a slow or absent verifier never holds up an
//! epoch, and the caps never depend on it.
//!
//! 1. `POST {verifier}/v1/tpm/enroll` with a DSSE envelope (payload type
//!    [`TPM_ENROLL_PAYLOAD_TYPE`], signed with the host key) of a [`TpmEnrollRequest`]: the
//!    EK's and AK's TPMT_PUBLIC and the EK certificate -> a [`TpmCredential`];
//! 2. TPM2_ActivateCredential releases the secret only for that EK and that AK's Name;
//! 3. `POST {verifier}/v1/tpm/activate` with the secret ([`TpmActivation`]) ->
//!    [`TpmEnrolled`].
//!
//! A refusal is answered with the API's [`ErrorBody`], whose reason is what gets logged.

use std::{thread::JoinHandle, time::Duration};

use ed25519_dalek::SigningKey;
use rackwarden_attest::{
    api::ErrorBody,
    dsse,
    tpm::{TPM_ENROLL_PAYLOAD_TYPE, TpmActivation, TpmCredential, TpmEnrollRequest, TpmEnrolled},
};
use serde::de::DeserializeOwned;

use super::AkEnrolment;
use crate::{
    config::epoch::VerifierEndpoint,
    tpm::{SharedTpm, Tpm, TpmError},
};

#[derive(Debug, thiserror::Error)]
pub enum EnrolError {
    #[error("the HTTP client to the verifier: {0}")]
    Client(#[from] super::transport::TransportError),
    #[error("{url}: {cause}")]
    Unreachable { url: String, cause: String },
    #[error("{url}: reading the answer: {source}")]
    Read {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: {status}: {reason}")]
    Refused {
        url: String,
        status: reqwest::StatusCode,
        reason: String,
    },
    #[error("{url}: the answer is not a {what}: {source}")]
    Answer {
        url: String,
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("the verifier's credential: `{field}` is not hex: {source}")]
    CredentialHex {
        field: &'static str,
        #[source]
        source: hex::FromHexError,
    },
    #[error("{0}")]
    Tpm(#[from] TpmError),
    #[error("the TPM has no AK loaded")]
    NoAk,
    #[error("writing the {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    #[error("no verifier instance is configured")]
    NoInstance,
}

impl EnrolError {
    /// Whether another instance may answer where this one did not: it could not be reached,
    /// its answer could not be read, or it failed with a server error. A refusal (4xx) is
    /// the fleet's answer.
    fn next_instance_may_answer(&self) -> bool {
        match self {
            EnrolError::Unreachable { .. } | EnrolError::Read { .. } => true,
            EnrolError::Refused { status, .. } => status.is_server_error(),
            _ => false,
        }
    }
}

/// Who enrols, where, and with which key.
#[derive(Clone)]
pub struct Enrolment {
    pub verifier: VerifierEndpoint,
    pub rack: String,
    pub host: String,
    /// The host's current (enrolled) signing key: the verifier takes the request only from it.
    pub key: SigningKey,
}

/// The request this host signs: its EK (public part and certificate) and its AK.
pub fn enrol_request(
    rack: &str,
    host: &str,
    tpm: &mut Tpm,
) -> Result<TpmEnrollRequest, EnrolError> {
    let ek = tpm.ek()?;
    let ak = tpm.ak_info().ok_or(EnrolError::NoAk)?;
    Ok(TpmEnrollRequest {
        rack: rack.to_string(),
        host: host.to_string(),
        ek_public: hex::encode(&ek.public),
        ek_certificate: ek.certificate.as_deref().map(base64_standard),
        ak_public: hex::encode(&ak.public),
    })
}

/// The body of `POST /v1/tpm/enroll`: the request as a DSSE envelope signed with `key`.
pub fn signed_request(key: &SigningKey, request: &TpmEnrollRequest) -> Result<Vec<u8>, EnrolError> {
    let payload = serde_json::to_vec(request).map_err(|source| EnrolError::Serialize {
        what: "enrolment request",
        source,
    })?;
    dsse::sign(key, TPM_ENROLL_PAYLOAD_TYPE, &payload)
        .to_json()
        .map_err(|source| EnrolError::Serialize {
            what: "enrolment envelope",
            source,
        })
}

/// The whole exchange, once, with the first verifier instance that answers (`url`, then
/// `fallback_urls`, as delivery and the challenge do): an instance that cannot be reached or
/// answers with a server error is passed over; a refusal is an answer (the instances share
/// one database) and ends the attempt. The TPM is locked only for its own commands, never
/// across a request to the verifier (the epoch loop quotes with it meanwhile). Returns the
/// AK's enrolment and the instance that made it.
pub fn enrol(e: &Enrolment, tpm: &SharedTpm) -> Result<(TpmEnrolled, String), EnrolError> {
    let request = enrol_request(&e.rack, &e.host, &mut lock(tpm))?;
    let client = super::transport::client(&e.verifier, e.verifier.request_timeout)?;
    let body = signed_request(&e.key, &request)?;
    let mut passed_over = None;
    for base in e.verifier.urls() {
        match enrol_with(e, tpm, &client, base, body.clone()) {
            Ok(enrolled) => return Ok((enrolled, base.to_string())),
            Err(err) if err.next_instance_may_answer() => {
                log::warn!("tpm: AK enrolment with {base}: {err}; trying the next instance");
                passed_over = Some(err);
            }
            Err(err) => return Err(err),
        }
    }
    Err(passed_over.unwrap_or(EnrolError::NoInstance))
}

/// The exchange with one instance: the credential challenge, then its answer, both there.
fn enrol_with(
    e: &Enrolment,
    tpm: &SharedTpm,
    client: &reqwest::blocking::Client,
    base: &str,
    body: Vec<u8>,
) -> Result<TpmEnrolled, EnrolError> {
    let credential: TpmCredential = post(
        client,
        &format!("{base}/v1/tpm/enroll"),
        body,
        "TPM credential",
    )?;
    let secret = activate(tpm, &credential)?;
    let activation = TpmActivation {
        rack: e.rack.clone(),
        host: e.host.clone(),
        challenge_id: credential.challenge_id,
        secret: hex::encode(secret),
    };
    let body = serde_json::to_vec(&activation).map_err(|source| EnrolError::Serialize {
        what: "activation",
        source,
    })?;
    post(
        client,
        &format!("{base}/v1/tpm/activate"),
        body,
        "TPM enrolment",
    )
}

/// The secret the TPM releases for the verifier's credential.
fn activate(tpm: &SharedTpm, credential: &TpmCredential) -> Result<Vec<u8>, EnrolError> {
    let unhex = |field, s: &str| {
        hex::decode(s.trim()).map_err(|source| EnrolError::CredentialHex { field, source })
    };
    let blob = unhex("credential_blob", &credential.credential_blob)?;
    let secret = unhex("encrypted_secret", &credential.encrypted_secret)?;
    Ok(lock(tpm).activate_credential(&blob, &secret)?)
}

fn lock(tpm: &SharedTpm) -> std::sync::MutexGuard<'_, Tpm> {
    // A panic mid-command leaves nothing in the TPM we rely on: each command stands alone.
    tpm.lock().unwrap_or_else(|p| p.into_inner())
}

/// POSTs `body` as JSON and reads a `what` from a 2xx answer, or the refusal's reason.
fn post<T: DeserializeOwned>(
    client: &reqwest::blocking::Client,
    url: &str,
    body: Vec<u8>,
    what: &'static str,
) -> Result<T, EnrolError> {
    let resp = client
        .post(url)
        .header("Content-Type", "application/json")
        .body(body)
        .send()
        .map_err(|e| EnrolError::Unreachable {
            url: url.to_string(),
            cause: super::transport::describe(&e),
        })?;
    let status = resp.status();
    let text = resp.text().map_err(|source| EnrolError::Read {
        url: url.to_string(),
        source,
    })?;
    if !status.is_success() {
        let reason = serde_json::from_str::<ErrorBody>(&text)
            .map(|b| b.error)
            .unwrap_or_else(|_| text.trim().to_string());
        return Err(EnrolError::Refused {
            url: url.to_string(),
            status,
            reason,
        });
    }
    serde_json::from_str(&text).map_err(|source| EnrolError::Answer {
        url: url.to_string(),
        what,
        source,
    })
}

/// Where this run's enrolment stands.
enum State {
    /// No attempt running; the next [`TpmEnrolment::retry`] starts one.
    Due,
    Running(JoinHandle<Result<(TpmEnrolled, String), EnrolError>>),
    Enrolled,
}

/// The epoch loop's handle on enrolment: one attempt at a time, each on its own thread.
pub struct TpmEnrolment {
    tpm: SharedTpm,
    state: State,
}

impl TpmEnrolment {
    pub fn new(tpm: SharedTpm) -> TpmEnrolment {
        TpmEnrolment {
            tpm,
            state: State::Due,
        }
    }

    pub fn is_enrolled(&self) -> bool {
        matches!(self.state, State::Enrolled)
    }

    /// An attempt is under way and its outcome not yet collected.
    pub fn is_running(&self) -> bool {
        matches!(self.state, State::Running(_))
    }

    /// Logs the outcome of an attempt that has finished, and returns it for the status;
    /// never waits for one.
    pub fn collect(&mut self) -> Option<AkEnrolment> {
        let State::Running(handle) = &self.state else {
            return None;
        };
        if !handle.is_finished() {
            return None;
        }
        let State::Running(handle) = std::mem::replace(&mut self.state, State::Due) else {
            return None;
        };
        let error = match handle.join() {
            Ok(Ok((enrolled, verifier))) => {
                log::info!(
                    "tpm: AK {} enrolled with the verifier at {verifier} (EK certified by {})",
                    enrolled.ak_name,
                    enrolled.ek_issuer
                );
                self.state = State::Enrolled;
                return Some(AkEnrolment::Enrolled {
                    ak_name: enrolled.ak_name,
                    ek_issuer: enrolled.ek_issuer,
                    verifier,
                });
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => "the enrolment thread panicked".to_string(),
        };
        log::warn!("tpm: AK enrolment failed: {error}; tried again at the next epoch");
        Some(AkEnrolment::Failed { error })
    }

    /// Collects the last attempt and, unless this run is enrolled or an attempt still runs,
    /// starts another with what `enrolment` says. Returns what changed, for the status.
    pub fn retry(&mut self, enrolment: impl FnOnce() -> Enrolment) -> Option<AkEnrolment> {
        let collected = self.collect();
        if !matches!(self.state, State::Due) {
            return collected;
        }
        let e = enrolment();
        let tpm = self.tpm.clone();
        log::info!(
            "tpm: enrolling the AK with {}",
            e.verifier.urls().collect::<Vec<_>>().join(", then ")
        );
        match std::thread::Builder::new()
            .name("tpm-enrol".into())
            .spawn(move || enrol(&e, &tpm))
        {
            Ok(h) => {
                self.state = State::Running(h);
                Some(AkEnrolment::Enrolling)
            }
            Err(err) => {
                log::error!("tpm: cannot start the AK enrolment thread: {err}");
                Some(AkEnrolment::Failed {
                    error: format!("cannot start the enrolment thread: {err}"),
                })
            }
        }
    }

    /// Waits up to `timeout` for a running attempt (tests, and a clean look at the outcome).
    pub fn wait(&mut self, timeout: Duration) -> bool {
        let until = std::time::Instant::now() + timeout;
        while matches!(self.state, State::Running(_)) && std::time::Instant::now() < until {
            self.collect();
            std::thread::sleep(Duration::from_millis(20));
        }
        self.collect();
        self.is_enrolled()
    }
}

/// Standard base64 (RFC 4648, with padding), for the EK certificate's DER. The daemon has no
/// base64 crate of its own for this one field.
pub fn base64_standard(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let symbol = |six: u32| char::from(ALPHABET[(six & 63) as usize]);
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = |i: usize| u32::from(chunk.get(i).copied().unwrap_or(0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        out.push(symbol(n >> 18));
        out.push(symbol(n >> 12));
        out.push(if chunk.len() > 1 { symbol(n >> 6) } else { '=' });
        out.push(if chunk.len() > 2 { symbol(n) } else { '=' });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tpm_base64_is_what_dsse_writes() {
        // dsse::sign writes the payload as standard base64: the same alphabet and padding.
        let key = SigningKey::from_bytes(&[7; 32]);
        for len in 0..70u8 {
            let data: Vec<u8> = (0..len).map(|i| i.wrapping_mul(37) ^ 0xa5).collect();
            assert_eq!(
                base64_standard(&data),
                dsse::sign(&key, "x", &data).payload,
                "{len} bytes"
            );
        }
        assert_eq!(base64_standard(b"foobar"), "Zm9vYmFy");
        assert_eq!(base64_standard(b"fo"), "Zm8=");
    }

    #[test]
    fn tpm_enrol_request_is_signed_with_the_host_key() {
        let key = SigningKey::from_bytes(&[9; 32]);
        let request = TpmEnrollRequest {
            rack: "rack-a".into(),
            host: "h1".into(),
            ek_public: "0001".into(),
            ek_certificate: Some(base64_standard(b"der")),
            ak_public: "0023".into(),
        };
        let body = signed_request(&key, &request).unwrap();
        let env: dsse::Envelope = serde_json::from_slice(&body).unwrap();
        let verified =
            dsse::verify_envelope(&env, &key.verifying_key(), TPM_ENROLL_PAYLOAD_TYPE).unwrap();
        let back: TpmEnrollRequest = serde_json::from_slice(&verified.payload).unwrap();
        assert_eq!(back, request);
        // Signed as another payload type (a statement), it is refused.
        assert!(
            dsse::verify_envelope(&env, &key.verifying_key(), dsse::INTOTO_PAYLOAD_TYPE).is_err()
        );
    }

    #[test]
    fn tpm_refusals_carry_the_verifiers_reason() {
        let e = EnrolError::Refused {
            url: "https://v/v1/tpm/enroll".into(),
            status: reqwest::StatusCode::CONFLICT,
            reason: "this verifier has no [tpm] ek_roots".into(),
        };
        assert_eq!(
            e.to_string(),
            "https://v/v1/tpm/enroll: 409 Conflict: this verifier has no [tpm] ek_roots"
        );
    }
}
