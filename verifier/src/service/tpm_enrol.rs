//! AK enrolment (issue 22): the verifier learns that a host's attestation key lives in a TPM
//! whose EK a manufacturer CA of `[tpm] ek_roots` certified, with TPM2_MakeCredential /
//! TPM2_ActivateCredential.
//!
//! 1. [`Verifier::tpm_enroll`]: the host sends its EK (public part and certificate) and its
//!    AK's public part, signed with its enrolled ed25519 key. The EK certificate must chain to
//!    a configured root and carry the EK's key; the AK must be a restricted signing key. The
//!    verifier wraps a random secret for the AK's Name under the EK and keeps only the
//!    secret's SHA3-256.
//! 2. [`Verifier::tpm_activate`]: the host returns the secret its TPM released. A TPM
//!    releases it only to an object with that exact Name loaded beside that EK, so a host
//!    that returns it has shown that the AK it named lives in the certified TPM. The AK is
//!    then enrolled (replacing an earlier one: a new AK after a TPM clear, or a rotation).
//!
//! A challenge is used up by its first answer, right or wrong.

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use rackwarden_attest::{
    dsse::{self, Envelope, EnvelopeError, Verified},
    nonce::{Nonce, NonceError},
    tpm::{
        AkPublic, EkCertError, EkPublic, TPM_ENROLL_PAYLOAD_TYPE, TpmActivation, TpmCredential,
        TpmEnrollRequest, TpmEnrolled, TpmError, make_credential, verify_ek_certificate,
    },
};

use super::Verifier;
use crate::store::{DbError, HostKey, TpmChallengeRow, TpmEnrollment};

/// Why an enrolment request or an activation was refused. The text is the reason the host
/// receives (and the operator reads in its log).
#[derive(Debug, thiserror::Error)]
pub enum TpmEnrolError {
    #[error(
        "this verifier enrols no AKs: `[tpm] ek_roots` is not configured (verifier.toml needs a [tpm] section naming the EK manufacturers' root CAs)"
    )]
    NotConfigured,
    #[error("not a DSSE envelope: {0}")]
    NotEnvelope(String),
    /// No signature names an enrolled key (current or retired).
    #[error(
        "signed by no enrolled key (keyid {keyids}): enrol the host's key with `rackwarden-verifier enroll` first"
    )]
    UnknownKey { keyids: String },
    #[error("signature: {0}")]
    Signature(EnvelopeError),
    #[error(
        "key {keyid} of {rack}/{host} was retired at {retired_ms} ms: a retired key enrols no AK"
    )]
    RetiredKey {
        keyid: String,
        rack: String,
        host: String,
        retired_ms: u64,
    },
    #[error(
        "the request names {claimed_rack}/{claimed_host} but key {keyid} is enrolled for {rack}/{host}"
    )]
    KeyOfAnotherHost {
        keyid: String,
        rack: String,
        host: String,
        claimed_rack: String,
        claimed_host: String,
    },
    /// The signed payload, or the activation body, does not decode.
    #[error("{field}: {detail}")]
    Malformed { field: &'static str, detail: String },
    #[error("ek_public is not an EK this verifier enrols: {0}")]
    EkPublic(TpmError),
    #[error("ak_public is not an AK this verifier enrols: {0}")]
    AkPublic(TpmError),
    #[error(
        "no EK certificate: an AK is enrolled only beside an EK whose certificate chains to `[tpm] ek_roots`"
    )]
    NoEkCertificate,
    /// One TPM attests for one host: the same EK under two host names would let one machine
    /// stand in for two.
    #[error(
        "this EK is already enrolled for {rack}/{host}: one TPM attests for one host (retire that host's key and enrolment first)"
    )]
    EkOfAnotherHost { rack: String, host: String },
    #[error("EK certificate refused: {0}")]
    EkCertificate(EkCertError),
    /// MakeCredential failed on inputs that parsed: a bug, not the host's fault.
    #[error("making the credential: {0}")]
    Credential(TpmError),
    #[error("{0}")]
    Random(NonceError),
    #[error(
        "unknown challenge {id}: never issued, already answered (a challenge takes one answer) or pruned after it expired"
    )]
    UnknownChallenge { id: String },
    #[error(
        "challenge {id} expired at {expires_ms} ms (now {now_ms} ms): ask for a new one with /v1/tpm/enroll"
    )]
    ChallengeExpired {
        id: String,
        expires_ms: u64,
        now_ms: u64,
    },
    #[error(
        "challenge {id} was issued to {rack}/{host}, not to {claimed_rack}/{claimed_host}; it is used up"
    )]
    ChallengeOfAnotherHost {
        id: String,
        rack: String,
        host: String,
        claimed_rack: String,
        claimed_host: String,
    },
    #[error(
        "wrong secret for challenge {id}: it is not the one the credential wrapped (the TPM that answered does not hold both that EK and that AK); the challenge is used up"
    )]
    WrongSecret { id: String },
    /// The enrolled keys could not be read back (a stored key that does not parse).
    #[error("reading the enrolled keys: {0}")]
    KeyTable(String),
    #[error("database: {0}")]
    Db(#[from] DbError),
}

/// Hex SHA3-256: what a challenge row keeps of its secret.
fn secret_digest_hex(secret: &[u8]) -> String {
    hex::encode(rackwarden_attest::sha3(secret))
}

/// Equality whose time does not depend on where two equal-length inputs first differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    // black_box: the fold must not be turned into an early-exit comparison.
    std::hint::black_box(diff) == 0
}

fn decode_hex(field: &'static str, s: &str) -> Result<Vec<u8>, TpmEnrolError> {
    hex::decode(s).map_err(|e| TpmEnrolError::Malformed {
        field,
        detail: format!("not hex: {e}"),
    })
}

impl Verifier {
    /// Sets `[tpm]`: whom AK enrolment trusts to certify EKs. `None`: no AK is enrolled.
    pub fn with_tpm_enrolment(mut self, tpm: Option<crate::config::TpmEnrolConfig>) -> Verifier {
        self.tpm = tpm;
        self
    }

    /// The enrolled key that signed `env` and the payload it signed, with the key table reloaded (at most once a
    /// second) when no signature names a known key: a host enrolled with the local CLI while
    /// we serve is seen without a restart, as ingest does.
    fn enrolment_signer(&mut self, env: &Envelope) -> Result<(HostKey, Verified), TpmEnrolError> {
        let find = |v: &Verifier| {
            env.signatures
                .iter()
                .find_map(|s| v.keys.get(&s.keyid))
                .map(|(hk, vk)| (hk.clone(), *vk))
        };
        let mut found = find(self);
        if found.is_none() && self.keys_loaded.elapsed() > std::time::Duration::from_secs(1) {
            self.reload_keys().map_err(|e| match e {
                super::VerifierError::Db(db) => TpmEnrolError::Db(db),
                other => TpmEnrolError::KeyTable(other.to_string()),
            })?;
            found = find(self);
        }
        let Some((hk, vk)) = found else {
            let keyids: Vec<&str> = env.signatures.iter().map(|s| s.keyid.as_str()).collect();
            return Err(TpmEnrolError::UnknownKey {
                keyids: keyids.join(", "),
            });
        };
        let verified = dsse::verify_envelope(env, &vk, TPM_ENROLL_PAYLOAD_TYPE)
            .map_err(TpmEnrolError::Signature)?;
        // The table is reloaded only on a miss: a key retired with the CLI since is read from
        // the store, so its retirement counts at once.
        let hk = self.store.host_key(&hk.keyid)?.unwrap_or(hk);
        Ok((hk, verified))
    }

    /// `POST /v1/tpm/enroll`: checks the signed request, the EK certificate and the AK, and
    /// answers with a credential only the TPM holding that EK can activate, and only for an
    /// object with that AK's Name. `raw` is the DSSE envelope's JSON.
    pub fn tpm_enroll(&mut self, raw: &[u8], now_ms: u64) -> Result<TpmCredential, TpmEnrolError> {
        let Some(cfg) = self.tpm.clone() else {
            return Err(TpmEnrolError::NotConfigured);
        };
        let env: Envelope =
            serde_json::from_slice(raw).map_err(|e| TpmEnrolError::NotEnvelope(e.to_string()))?;
        let (hk, verified) = self.enrolment_signer(&env)?;
        // Parsed from the bytes the signature covers, never from the envelope again.
        let req: TpmEnrollRequest =
            serde_json::from_slice(&verified.payload).map_err(|e| TpmEnrolError::Malformed {
                field: "payload",
                detail: format!("not a TPM enrolment request: {e}"),
            })?;
        if let Some(retired_ms) = hk.retired_ms {
            return Err(TpmEnrolError::RetiredKey {
                keyid: hk.keyid,
                rack: hk.rack,
                host: hk.host,
                retired_ms,
            });
        }
        if req.rack != hk.rack || req.host != hk.host {
            return Err(TpmEnrolError::KeyOfAnotherHost {
                keyid: hk.keyid,
                rack: hk.rack,
                host: hk.host,
                claimed_rack: req.rack,
                claimed_host: req.host,
            });
        }
        let ek = EkPublic::parse(&decode_hex("ek_public", &req.ek_public)?)
            .map_err(TpmEnrolError::EkPublic)?;
        let ak = AkPublic::parse(&decode_hex("ak_public", &req.ak_public)?)
            .map_err(TpmEnrolError::AkPublic)?;
        let ek_hex = hex::encode(ek.bytes());
        if let Some(other) = self
            .store
            .tpm_enrollments()?
            .into_iter()
            .find(|e| e.ek_public == ek_hex && (e.rack != hk.rack || e.host != hk.host))
        {
            return Err(TpmEnrolError::EkOfAnotherHost {
                rack: other.rack,
                host: other.host,
            });
        }
        let cert_b64 = req
            .ek_certificate
            .as_deref()
            .ok_or(TpmEnrolError::NoEkCertificate)?;
        let cert_der = B64
            .decode(cert_b64.trim())
            .map_err(|e| TpmEnrolError::Malformed {
                field: "ek_certificate",
                detail: format!("not standard base64: {e}"),
            })?;
        let cert = verify_ek_certificate(
            &cert_der,
            &ek,
            &cfg.ek_roots_pem,
            &cfg.ek_intermediates_pem,
            now_ms / 1000,
        )
        .map_err(TpmEnrolError::EkCertificate)?;
        // The chain ends at the configured root that vouched for this EK.
        let ek_issuer = cert.chain.last().cloned().unwrap_or(cert.issuer);

        let secret = Nonce::random().map_err(TpmEnrolError::Random)?;
        let ak_name = ak.name();
        let credential =
            make_credential(&ek, &ak_name, secret.as_bytes()).map_err(TpmEnrolError::Credential)?;
        let challenge_id = Nonce::random().map_err(TpmEnrolError::Random)?.to_hex();
        let expires_ms = now_ms.saturating_add(cfg.challenge_ttl.as_millis() as u64);
        // Unanswered challenges go once expired: what a host can make us keep is bounded by
        // the per-source rate and the TTL.
        self.store.prune_tpm_challenges(now_ms)?;
        self.store.insert_tpm_challenge(&TpmChallengeRow {
            id: challenge_id.clone(),
            secret_sha3: secret_digest_hex(secret.as_bytes()),
            enrollment: TpmEnrollment {
                rack: hk.rack,
                host: hk.host,
                // Re-encoded from the parsed bytes: one spelling (lowercase) in the store.
                ak_public: hex::encode(ak.bytes()),
                ak_name: hex::encode(&ak_name),
                ek_public: ek_hex,
                ek_certificate: Some(B64.encode(&cert_der)),
                ek_issuer,
                enrolled_ms: 0,
            },
            expires_ms,
        })?;
        Ok(TpmCredential {
            challenge_id,
            credential_blob: hex::encode(&credential.id_object),
            encrypted_secret: hex::encode(&credential.encrypted_secret),
            expires_at_ms: expires_ms,
        })
    }

    /// `POST /v1/tpm/activate`: enrols the AK of the challenge when the secret is the one its
    /// credential wrapped. The challenge is used up whatever the answer.
    pub fn tpm_activate(
        &mut self,
        a: &TpmActivation,
        now_ms: u64,
    ) -> Result<TpmEnrolled, TpmEnrolError> {
        if self.tpm.is_none() {
            return Err(TpmEnrolError::NotConfigured);
        }
        let Some(row) = self.store.take_tpm_challenge(&a.challenge_id)? else {
            return Err(TpmEnrolError::UnknownChallenge {
                id: a.challenge_id.clone(),
            });
        };
        let mut e = row.enrollment;
        if a.rack != e.rack || a.host != e.host {
            return Err(TpmEnrolError::ChallengeOfAnotherHost {
                id: row.id,
                rack: e.rack,
                host: e.host,
                claimed_rack: a.rack.clone(),
                claimed_host: a.host.clone(),
            });
        }
        if now_ms > row.expires_ms {
            return Err(TpmEnrolError::ChallengeExpired {
                id: row.id,
                expires_ms: row.expires_ms,
                now_ms,
            });
        }
        // A secret that is not hex is a wrong answer like any other (the challenge is gone).
        let given = hex::decode(a.secret.trim())
            .map(|s| rackwarden_attest::sha3(&s))
            .ok();
        let stored = hex::decode(&row.secret_sha3).ok();
        let matches = match (given, stored) {
            (Some(g), Some(s)) => constant_time_eq(&g, &s),
            _ => false,
        };
        if !matches {
            log::warn!(
                "{}/{}: TPM activation refused: wrong secret for challenge {} (AK {})",
                e.rack,
                e.host,
                row.id,
                e.ak_name
            );
            return Err(TpmEnrolError::WrongSecret { id: row.id });
        }
        e.enrolled_ms = now_ms;
        let previous = self.store.tpm_enrollment(&e.rack, &e.host)?;
        self.store.enroll_tpm(&e)?;
        match previous {
            Some(p) if p.ak_name != e.ak_name => log::info!(
                "{}/{}: AK {} enrolled (EK certified by {}), replacing AK {}",
                e.rack,
                e.host,
                e.ak_name,
                e.ek_issuer,
                p.ak_name
            ),
            _ => log::info!(
                "{}/{}: AK {} enrolled (EK certified by {})",
                e.rack,
                e.host,
                e.ak_name,
                e.ek_issuer
            ),
        }
        Ok(TpmEnrolled {
            ak_name: e.ak_name,
            ek_issuer: e.ek_issuer,
        })
    }

    /// Every enrolled AK, by rack and host.
    pub fn tpm_enrollments(&self) -> Result<Vec<TpmEnrollment>, TpmEnrolError> {
        Ok(self.store.tpm_enrollments()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_whole_inputs() {
        assert!(constant_time_eq(&[1, 2, 3], &[1, 2, 3]));
        assert!(!constant_time_eq(&[1, 2, 3], &[1, 2, 4]));
        assert!(!constant_time_eq(&[1, 2], &[1, 2, 3]));
        assert!(constant_time_eq(&[], &[]));
    }
}
