//! DSSE v1 (github.com/secure-systems-lab/dsse, "protocol.md"): the signature is ed25519 over
//! `PAE(payloadType, payload)`; the payload type is therefore covered by the signature.
//! [`verify`] returns the payload bytes it verified, and callers parse the statement from
//! those bytes only: the envelope is never re-parsed after verification (the type confusion
//! behind cosign's CVE-2022-35929).

use base64::{Engine as _, engine::general_purpose::STANDARD as B64};
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};

use crate::keys::keyid;

/// Payload type of attestations (in-toto Statement v1).
pub const INTOTO_PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// Payload type of image manifests signed by the verifier.
pub const MANIFEST_PAYLOAD_TYPE: &str = "application/vnd.rackwarden.manifest+json";

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// Standard base64 of the payload bytes.
    pub payload: String,
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    pub signatures: Vec<Signature>,
    /// Not part of DSSE and not signed: the TPM quote made over this envelope's PAE digest,
    /// carried beside it in the log and on the wire (issue 22). Absent from hosts without a
    /// TPM, so their lines are byte for byte what they always were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpm: Option<crate::tpm::TpmSidecar>,
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// Lowercase hex SHA3-256 of the raw public key. A hint, never trusted on its own.
    pub keyid: String,
    /// Standard base64 of the 64-byte ed25519 signature over PAE.
    pub sig: String,
}

/// The pre-authentication encoding:
/// `"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body`, lengths in decimal bytes.
pub fn pae(payload_type: &str, body: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut out = Vec::with_capacity(48 + payload_type.len() + body.len());
    // Writing to a Vec cannot fail.
    let _ = write!(
        out,
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        body.len()
    );
    out.extend_from_slice(body);
    out
}

/// Signs `body` as `payload_type`. This is where every statement and manifest is signed.
pub fn sign(key: &SigningKey, payload_type: &str, body: &[u8]) -> Envelope {
    sign_pae(key, payload_type, body, &pae(payload_type, body))
}

/// Signs `body` and returns the envelope with the SHA3-256 of the PAE it signed (a
/// statement's link in its host's chain), encoding the PAE once for both.
pub fn sign_chained(key: &SigningKey, payload_type: &str, body: &[u8]) -> (Envelope, [u8; 32]) {
    let pae = pae(payload_type, body);
    (sign_pae(key, payload_type, body, &pae), crate::sha3(&pae))
}

fn sign_pae(key: &SigningKey, payload_type: &str, body: &[u8], pae: &[u8]) -> Envelope {
    let sig = key.sign(pae);
    Envelope {
        payload: B64.encode(body),
        payload_type: payload_type.to_string(),
        signatures: vec![Signature {
            keyid: keyid(&key.verifying_key()),
            sig: B64.encode(sig.to_bytes()),
        }],
        tpm: None,
    }
}

impl Envelope {
    /// One compact JSON line (no trailing newline), written by `serde_json`. A failure is an
    /// error for the caller to report, never an empty or partial line.
    pub fn to_json(&self) -> Result<Vec<u8>, serde_json::Error> {
        serde_json::to_vec(self)
    }
}

/// What a successful verification yields: the exact bytes that were signed.
#[derive(Debug, Clone)]
pub struct Verified {
    pub payload: Vec<u8>,
    /// SHA3-256 of the PAE bytes: the link the next statement's `prev` must carry.
    pub pae_sha3: [u8; 32],
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    #[error("not a DSSE envelope: {0}")]
    Json(String),
    #[error("payload is not valid standard base64: {0}")]
    PayloadBase64(String),
    #[error("signature is not valid standard base64 or not 64 bytes")]
    SignatureEncoding,
    #[error("payloadType is `{found}`, expected `{expected}`")]
    WrongPayloadType { found: String, expected: String },
    #[error("no signature")]
    NoSignature,
    #[error("signed by another key (keyid {keyid}); expected keyid {expected}")]
    WrongKey { keyid: String, expected: String },
    #[error("signature verifies with the expected key but its keyid hint says {keyid}")]
    KeyIdMismatch { keyid: String },
    #[error("bad signature (keyid matches, signature does not verify)")]
    BadSignature,
}

/// Parses and verifies one envelope against `key` and `expected_type`.
pub fn verify(
    json: &[u8],
    key: &VerifyingKey,
    expected_type: &str,
) -> Result<Verified, EnvelopeError> {
    let env: Envelope =
        serde_json::from_slice(json).map_err(|e| EnvelopeError::Json(e.to_string()))?;
    verify_envelope(&env, key, expected_type)
}

pub fn verify_envelope(
    env: &Envelope,
    key: &VerifyingKey,
    expected_type: &str,
) -> Result<Verified, EnvelopeError> {
    let sigs = env
        .signatures
        .iter()
        .map(|s| (s.keyid.as_str(), s.sig.as_str()));
    verify_parts(&env.payload_type, &env.payload, sigs, key, expected_type)
}

/// Decodes standard base64 (padded, canonical: no stray bits in the last symbol); a refusal
/// names the offending byte's offset.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    B64.decode(text)
}

/// The check itself, over an envelope's fields: (keyid, sig) per signature.
fn verify_parts<'s>(
    payload_type: &str,
    payload_b64: &str,
    signatures: impl Iterator<Item = (&'s str, &'s str)>,
    key: &VerifyingKey,
    expected_type: &str,
) -> Result<Verified, EnvelopeError> {
    if payload_type != expected_type {
        return Err(EnvelopeError::WrongPayloadType {
            found: payload_type.to_string(),
            expected: expected_type.to_string(),
        });
    }
    let payload =
        decode_base64(payload_b64).map_err(|e| EnvelopeError::PayloadBase64(e.to_string()))?;
    // The type that goes into PAE is the one we just checked: the signature covers it.
    let pae = pae(payload_type, &payload);
    let ours = keyid(key);
    let mut last_err = EnvelopeError::NoSignature;
    for (keyid, sig) in signatures {
        let sig = B64
            .decode(sig)
            .ok()
            .and_then(|b| <[u8; 64]>::try_from(b.as_slice()).ok())
            .map(|b| ed25519_dalek::Signature::from_bytes(&b));
        let Some(sig) = sig else {
            last_err = EnvelopeError::SignatureEncoding;
            continue;
        };
        // One signature policy everywhere: ed25519-dalek's verify_strict (refuses small-order
        // R and A and non-canonical s).
        let good = key.verify_strict(&pae, &sig).is_ok();
        last_err = match (good, keyid == ours) {
            (true, true) => {
                return Ok(Verified {
                    payload,
                    pae_sha3: crate::sha3(&pae),
                });
            }
            (true, false) => EnvelopeError::KeyIdMismatch {
                keyid: keyid.to_string(),
            },
            (false, true) => EnvelopeError::BadSignature,
            (false, false) => EnvelopeError::WrongKey {
                keyid: keyid.to_string(),
                expected: ours.clone(),
            },
        };
    }
    Err(last_err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pae_matches_the_dsse_spec_vector() {
        // protocol.md: PAE("http://example.com/HelloWorld", "hello world")
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world".to_vec()
        );
    }

    #[test]
    fn to_json_round_trips_through_serde_json() {
        let k = crate::keys::generate();
        let env = sign(&k, INTOTO_PAYLOAD_TYPE, b"{\"x\":\"\\u0001\"}");
        let line = env.to_json().unwrap();
        assert!(!line.contains(&b'\n'), "one line");
        assert_eq!(serde_json::from_slice::<Envelope>(&line).unwrap(), env);
    }

    #[test]
    fn round_trip_and_type_is_signed() {
        let k = crate::keys::generate();
        let env = sign(&k, INTOTO_PAYLOAD_TYPE, b"{\"x\":1}");
        let v = verify(
            &env.to_json().unwrap(),
            &k.verifying_key(),
            INTOTO_PAYLOAD_TYPE,
        )
        .unwrap();
        assert_eq!(v.payload, b"{\"x\":1}");
        // The same bytes presented as another type fail, whatever the caller expects.
        let mut other = env.clone();
        other.payload_type = MANIFEST_PAYLOAD_TYPE.into();
        assert!(matches!(
            verify_envelope(&other, &k.verifying_key(), INTOTO_PAYLOAD_TYPE),
            Err(EnvelopeError::WrongPayloadType { .. })
        ));
        assert_eq!(
            verify_envelope(&other, &k.verifying_key(), MANIFEST_PAYLOAD_TYPE).unwrap_err(),
            EnvelopeError::BadSignature
        );
    }

    #[test]
    fn malformed_envelopes_are_refused_as_json() {
        let k = crate::keys::generate();
        let line =
            String::from_utf8(sign(&k, INTOTO_PAYLOAD_TYPE, b"{}").to_json().unwrap()).unwrap();
        for case in [
            line.replace("}]}", "}],\"x\":1}"),
            line.replace("\"}]", "\",\"x\":1}]"),
            r#"{"payload":"","payloadType":"t"}"#.into(),
            "[]".into(),
        ] {
            assert!(
                matches!(
                    verify(case.as_bytes(), &k.verifying_key(), INTOTO_PAYLOAD_TYPE),
                    Err(EnvelopeError::Json(_))
                ),
                "{case}"
            );
        }
        // Escapes JSON allows are still the same envelope.
        let escaped = line.replace("application/vnd", "application\\/vnd");
        assert!(verify(escaped.as_bytes(), &k.verifying_key(), INTOTO_PAYLOAD_TYPE).is_ok());
        // Non-canonical base64 (stray bits in the last symbol) is refused.
        assert!(decode_base64("QR==").is_err());
        assert_eq!(decode_base64("QQ==").unwrap(), b"A");
    }

    #[test]
    fn wrong_key_and_keyid_mismatch() {
        let (a, b) = (crate::keys::generate(), crate::keys::generate());
        let env = sign(&a, INTOTO_PAYLOAD_TYPE, b"x");
        assert!(matches!(
            verify_envelope(&env, &b.verifying_key(), INTOTO_PAYLOAD_TYPE),
            Err(EnvelopeError::WrongKey { .. })
        ));
        let mut hinted = env.clone();
        hinted.signatures[0].keyid = keyid(&b.verifying_key());
        assert!(matches!(
            verify_envelope(&hinted, &a.verifying_key(), INTOTO_PAYLOAD_TYPE),
            Err(EnvelopeError::KeyIdMismatch { .. })
        ));
    }
}
