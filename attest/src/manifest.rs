//! The image manifest: what both parties agreed may be loaded after a wipe. A DSSE envelope
//! (payloadType `application/vnd.rackwarden.manifest+json`) signed by the *verifier's* key.

use ed25519_dalek::{SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::dsse::{self, Envelope, EnvelopeError, MANIFEST_PAYLOAD_TYPE};

pub const MANIFEST_VERSION: u32 = 1;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub version: u32,
    /// Every file of the set: a source directory holding anything else is refused.
    pub images: Vec<ManifestImage>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestImage {
    pub name: String,
    /// Relative path under the source (and staging) directory; `/`-separated, no `..`.
    pub path: String,
    pub size: u64,
    pub merkle_sha3_256: String,
    /// Optional sidecar of the leaf hashes (32 bytes per 1 MiB chunk), so a mismatch can name
    /// the first bad chunk. Its own SHA3-256 is here, so the manifest's signature covers it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leaves: Option<LeavesRef>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeavesRef {
    /// Path of the sidecar, relative to the manifest file's directory.
    pub path: String,
    pub sha3_256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest signature: {0}")]
    Envelope(#[from] EnvelopeError),
    #[error("manifest payload is not a valid manifest: {0}")]
    Payload(String),
    #[error("manifest image #{index} (`{name}`): {problem}")]
    Image {
        index: usize,
        name: String,
        problem: String,
    },
}

/// A relative path that cannot escape its directory.
pub fn check_relative_path(p: &str) -> Result<(), PathError> {
    if p.is_empty() || p.starts_with('/') || p.contains('\0') || p.contains('\\') {
        return Err(PathError::NotRelative(p.to_string()));
    }
    if p.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return Err(PathError::Component(p.to_string()));
    }
    Ok(())
}

/// A manifest path that could name a file outside the image directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("`{0}` is not a relative path")]
    NotRelative(String),
    #[error("`{0}` has an empty, `.` or `..` component")]
    Component(String),
}

fn is_hex64(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

impl Manifest {
    /// Checks names, paths and digests; every error names the image.
    pub fn validate(&self) -> Result<(), ManifestError> {
        if self.version != MANIFEST_VERSION {
            return Err(ManifestError::Payload(format!(
                "version {} (expected {MANIFEST_VERSION})",
                self.version
            )));
        }
        let mut names = std::collections::BTreeSet::new();
        let mut paths = std::collections::BTreeSet::new();
        for (index, im) in self.images.iter().enumerate() {
            let bad = |problem: String| ManifestError::Image {
                index,
                name: im.name.clone(),
                problem,
            };
            if im.name.is_empty() || !names.insert(&im.name) {
                return Err(bad("empty or duplicate name".into()));
            }
            check_relative_path(&im.path).map_err(|e| bad(e.to_string()))?;
            if !paths.insert(&im.path) {
                return Err(bad(format!("path `{}` is listed twice", im.path)));
            }
            if !is_hex64(&im.merkle_sha3_256) {
                return Err(bad("merkle_sha3_256 is not 64 lowercase hex digits".into()));
            }
            if let Some(l) = &im.leaves {
                check_relative_path(&l.path).map_err(|e| bad(e.to_string()))?;
                if !is_hex64(&l.sha3_256) {
                    return Err(bad("leaves.sha3_256 is not 64 lowercase hex digits".into()));
                }
            }
        }
        Ok(())
    }

    /// Signs the manifest as written by `serde_json`; a serialisation failure is returned,
    /// never signed as an empty body.
    pub fn sign(&self, verifier_key: &SigningKey) -> Result<Envelope, serde_json::Error> {
        let body = serde_json::to_vec(self)?;
        Ok(dsse::sign(verifier_key, MANIFEST_PAYLOAD_TYPE, &body))
    }
}

/// A manifest whose signature was checked, with the SHA3-256 of its PAE (for evidence).
#[derive(Debug, Clone)]
pub struct VerifiedManifest {
    pub manifest: Manifest,
    pub pae_sha3: [u8; 32],
}

/// Verifies the envelope with the verifier's key and parses the manifest from the signed
/// bytes only.
pub fn verify_manifest(
    envelope_json: &[u8],
    verifier: &VerifyingKey,
) -> Result<VerifiedManifest, ManifestError> {
    let v = dsse::verify(envelope_json, verifier, MANIFEST_PAYLOAD_TYPE)?;
    let manifest: Manifest =
        serde_json::from_slice(&v.payload).map_err(|e| ManifestError::Payload(e.to_string()))?;
    manifest.validate()?;
    Ok(VerifiedManifest {
        manifest,
        pae_sha3: v.pae_sha3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Manifest {
        Manifest {
            version: 1,
            images: vec![ManifestImage {
                name: "weights".into(),
                path: "model/weights.bin".into(),
                size: 5,
                merkle_sha3_256: "ab".repeat(32),
                leaves: None,
            }],
        }
    }

    #[test]
    fn sign_verify_and_tamper() {
        let k = crate::keys::generate();
        let env = sample().sign(&k).unwrap();
        let v = verify_manifest(&env.to_json().unwrap(), &k.verifying_key()).unwrap();
        assert_eq!(v.manifest, sample());
        // Another key.
        let other = crate::keys::generate();
        assert!(matches!(
            verify_manifest(&env.to_json().unwrap(), &other.verifying_key()),
            Err(ManifestError::Envelope(EnvelopeError::WrongKey { .. }))
        ));
        // One byte of the payload.
        let mut bad = env.clone();
        let mut p = bad.payload.into_bytes();
        p[10] = if p[10] == b'A' { b'B' } else { b'A' };
        bad.payload = String::from_utf8(p).unwrap();
        assert!(verify_manifest(&bad.to_json().unwrap(), &k.verifying_key()).is_err());
        // An attestation envelope is not a manifest, even signed by the same key.
        let att = dsse::sign(
            &k,
            dsse::INTOTO_PAYLOAD_TYPE,
            &serde_json::to_vec(&sample()).unwrap(),
        );
        assert!(matches!(
            verify_manifest(&att.to_json().unwrap(), &k.verifying_key()),
            Err(ManifestError::Envelope(
                EnvelopeError::WrongPayloadType { .. }
            ))
        ));
        // Plain JSON (unsigned) is refused.
        assert!(
            verify_manifest(&serde_json::to_vec(&sample()).unwrap(), &k.verifying_key()).is_err()
        );
    }

    #[test]
    fn paths_cannot_escape() {
        for p in ["../x", "/etc/passwd", "a//b", "a/./b", "", "a/.."] {
            assert!(check_relative_path(p).is_err(), "{p}");
        }
        let mut m = sample();
        m.images[0].path = "../../etc/shadow".into();
        assert!(matches!(
            m.validate(),
            Err(ManifestError::Image { index: 0, .. })
        ));
    }
}
