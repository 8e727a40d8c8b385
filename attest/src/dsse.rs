//! DSSE v1 (github.com/secure-systems-lab/dsse, "protocol.md"): the signature is ed25519 over
//! `PAE(payloadType, payload)`; the payload type is therefore covered by the signature.
//! [`verify`] returns the payload bytes it verified, and callers parse the statement from
//! those bytes only: the envelope is never re-parsed after verification (the type confusion
//! behind cosign's CVE-2022-35929).

use std::borrow::Cow;

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
        payload: base64_simd::STANDARD.encode_to_string(body),
        payload_type: payload_type.to_string(),
        signatures: vec![Signature {
            keyid: keyid(&key.verifying_key()),
            sig: B64.encode(sig.to_bytes()),
        }],
        tpm: None,
    }
}

impl Envelope {
    /// One compact JSON line (no trailing newline).
    ///
    /// Written by hand, byte for byte what `serde_json::to_vec` writes for this struct (a
    /// test holds them equal): the base64 and hex strings need no escaping, so they are
    /// copied, not scanned and escaped character by character.
    pub fn to_json(&self) -> Vec<u8> {
        let sigs: usize = self
            .signatures
            .iter()
            .map(|s| s.keyid.len() + s.sig.len() + 24)
            .sum();
        let mut out = Vec::with_capacity(48 + self.payload.len() + self.payload_type.len() + sigs);
        out.extend_from_slice(b"{\"payload\":");
        json_str(&mut out, &self.payload);
        out.extend_from_slice(b",\"payloadType\":");
        json_str(&mut out, &self.payload_type);
        out.extend_from_slice(b",\"signatures\":[");
        for (i, s) in self.signatures.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"keyid\":");
            json_str(&mut out, &s.keyid);
            out.extend_from_slice(b",\"sig\":");
            json_str(&mut out, &s.sig);
            out.push(b'}');
        }
        out.push(b']');
        if let Some(tpm) = &self.tpm {
            out.extend_from_slice(b",\"tpm\":");
            // Serializing plain strings and maps into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut out, tpm);
        }
        out.push(b'}');
        out
    }
}

/// Appends `s` as a JSON string exactly as serde_json writes it: copied between quotes when
/// nothing in it needs escaping (no control character, `"` or `\\`), else by serde_json.
fn json_str(out: &mut Vec<u8>, s: &str) {
    // A fold without early exit, so the check runs over whole vectors of bytes.
    let plain = s
        .bytes()
        .fold(true, |ok, b| ok & (b >= 0x20) & (b != b'"') & (b != b'\\'));
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        // Serializing a string into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut *out, s);
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

/// [`Envelope`] borrowing its strings from the line it is read from, where they hold no
/// escapes (always, for what rackwarden writes): verifying then copies the payload's base64
/// nowhere. It accepts and refuses exactly what [`Envelope`] does (a test holds them equal).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct EnvelopeRef<'a> {
    #[serde(borrow)]
    payload: Cow<'a, str>,
    #[serde(rename = "payloadType", borrow)]
    payload_type: Cow<'a, str>,
    #[serde(borrow)]
    signatures: Vec<SignatureRef<'a>>,
    #[serde(default)]
    #[allow(dead_code)] // Read so that a malformed sidecar is refused here as well.
    tpm: Option<crate::tpm::TpmSidecar>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct SignatureRef<'a> {
    #[serde(borrow)]
    keyid: Cow<'a, str>,
    #[serde(borrow)]
    sig: Cow<'a, str>,
}

/// Parses and verifies one envelope against `key` and `expected_type`.
pub fn verify(
    json: &[u8],
    key: &VerifyingKey,
    expected_type: &str,
) -> Result<Verified, EnvelopeError> {
    let env: EnvelopeRef =
        serde_json::from_slice(json).map_err(|e| EnvelopeError::Json(e.to_string()))?;
    let sigs = env.signatures.iter().map(|s| (&*s.keyid, &*s.sig));
    verify_parts(&env.payload_type, &env.payload, sigs, key, expected_type)
}

pub fn verify_envelope(
    env: &Envelope,
    key: &VerifyingKey,
    expected_type: &str,
) -> Result<Verified, EnvelopeError> {
    let sigs = env.signatures.iter().map(|s| (&*s.keyid, &*s.sig));
    verify_parts(&env.payload_type, &env.payload, sigs, key, expected_type)
}

/// Decodes standard base64 as the `base64` crate's `STANDARD` does (padded, canonical: no
/// stray bits in the last symbol; a test holds the two equal), with SIMD; a refusal is worded
/// by the `base64` crate, which names the offending byte's offset.
pub fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    match base64_simd::STANDARD.decode_to_vec(text) {
        Ok(bytes) => Ok(bytes),
        Err(_) => B64.decode(text),
    }
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
        let good = crate::ed25519::verify_strict(key, &pae, &sig);
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
    fn to_json_is_what_serde_json_writes() {
        let k = crate::keys::generate();
        let mut env = sign(&k, INTOTO_PAYLOAD_TYPE, b"{\"x\":\"\\u0001\"}");
        assert_eq!(env.to_json(), serde_json::to_vec(&env).unwrap());
        env.payload_type = "a\"b\\c\u{1}\n\u{7f}é".into();
        env.signatures.push(Signature {
            keyid: "k\"\t".into(),
            sig: String::new(),
        });
        assert_eq!(env.to_json(), serde_json::to_vec(&env).unwrap());
        env.signatures.clear();
        assert_eq!(env.to_json(), serde_json::to_vec(&env).unwrap());
    }

    #[test]
    fn round_trip_and_type_is_signed() {
        let k = crate::keys::generate();
        let env = sign(&k, INTOTO_PAYLOAD_TYPE, b"{\"x\":1}");
        let v = verify(&env.to_json(), &k.verifying_key(), INTOTO_PAYLOAD_TYPE).unwrap();
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
    fn the_borrowing_reader_accepts_and_refuses_what_envelope_does() {
        let k = crate::keys::generate();
        let env = sign(&k, INTOTO_PAYLOAD_TYPE, b"{\"x\":1}");
        let line = String::from_utf8(env.to_json()).unwrap();
        let sig = &env.signatures[0];
        let cases = [
            line.clone(),
            // Escapes the writer never makes but JSON allows: the reader copies those strings.
            line.replace("application/vnd", "application\\/vnd"),
            line.replacen(
                &sig.sig[..4],
                &format!("\\u00{:x}{}", sig.sig.as_bytes()[0], &sig.sig[1..4]),
                1,
            ),
            line.replace("}]}", "}],\"x\":1}"),
            line.replace("}]}", "}],\"tpm\":{}}"),
            line.replace("}]}", "}],\"tpm\":null}"),
            line.replace("\"}]", "\",\"x\":1}]"),
            line.replace(",\"payloadType\"", ",\"payloadType\":\"a\",\"payloadType\""),
            line.replace(
                "\"signatures\":[",
                "\"signatures\":[{\"keyid\":\"aa\",\"sig\":\"!\"},",
            ),
            line.replace("\"signatures\":[", "\"signatures\":[],\"z\":["),
            r#"{"payload":"","payloadType":"t"}"#.into(),
            "[]".into(),
        ];
        // The escaped lines are still good envelopes, read through copies.
        for case in &cases[..3] {
            assert!(verify(case.as_bytes(), &k.verifying_key(), INTOTO_PAYLOAD_TYPE).is_ok());
        }
        assert_ne!(cases[1], cases[0]);
        assert_ne!(cases[2], cases[0]);
        for case in cases {
            let owned = serde_json::from_str::<Envelope>(&case)
                .map_err(|e| EnvelopeError::Json(e.to_string()))
                .and_then(|e| verify_envelope(&e, &k.verifying_key(), INTOTO_PAYLOAD_TYPE));
            let borrowed = verify(case.as_bytes(), &k.verifying_key(), INTOTO_PAYLOAD_TYPE);
            match (&owned, &borrowed) {
                (Ok(a), Ok(b)) => assert_eq!((&a.payload, a.pae_sha3), (&b.payload, b.pae_sha3)),
                (Err(EnvelopeError::Json(_)), Err(EnvelopeError::Json(_))) => {}
                (Err(a), Err(b)) => assert_eq!(a, b, "{case}"),
                _ => panic!("{case}: {owned:?} against {borrowed:?}"),
            }
        }
    }

    #[test]
    fn simd_base64_decodes_what_the_base64_crate_decodes() {
        use proptest::prelude::*;
        // Canonical and not (stray bits in the last symbol), padded and not, and junk.
        let text = proptest::string::string_regex("[A-Za-z0-9+/=._ -]{0,24}").unwrap();
        proptest!(ProptestConfig::with_cases(4096), |(s in text)| {
            let ours = decode_base64(&s);
            let scalar = B64.decode(&s);
            prop_assert_eq!(ours.is_ok(), scalar.is_ok(), "{}", s);
            if let (Ok(a), Ok(b)) = (&ours, &scalar) {
                prop_assert_eq!(a, b);
            }
        });
        for bytes in 0..100u8 {
            let data: Vec<u8> = (0..bytes).map(|b| b.wrapping_mul(37)).collect();
            let text = B64.encode(&data);
            assert_eq!(decode_base64(&text).unwrap(), data);
            assert_eq!(base64_simd::STANDARD.encode_to_string(&data), text);
        }
        // Stray bits: "QR==" decodes to the same byte as "QQ==" but is not canonical.
        assert!(decode_base64("QR==").is_err());
        assert_eq!(
            decode_base64("QQ=!").unwrap_err().to_string(),
            B64.decode("QQ=!").unwrap_err().to_string()
        );
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
