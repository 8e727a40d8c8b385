//! The AK state file: the AK's public and (EK-wrapped) private blobs, so a restarted daemon
//! loads the AK the verifier enrolled instead of making a new one. A saved TPM context would
//! not do: transient contexts die at TPM Reset (reboot); the blobs load under the EK again.
//!
//! Format (JSON): `{"format":"rackwarden-tpm-ak/1","public":HEX,"private":HEX}` where
//! `public` is TPM2B_PUBLIC and `private` TPM2B_PRIVATE (each a u16 big-endian size, then the
//! body), the sizes kept so the file is what `tpm2_load -u/-r` would take.

use std::path::Path;

use super::TpmError;

const FORMAT: &str = "rackwarden-tpm-ak/1";

/// The AK's blobs without their TPM2B sizes: `public` is TPMT_PUBLIC (`Public::marshall`),
/// `private` the TPM2B_PRIVATE body (`Private::value`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct AkBlobs {
    pub public: Vec<u8>,
    pub private: Vec<u8>,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct AkFile {
    format: String,
    public: String,
    private: String,
}

/// The stored blobs, or `None` when there is no file yet (first start).
pub(super) fn read(path: &Path) -> Result<Option<AkBlobs>, TpmError> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(TpmError::AkFileIo {
                path: path.to_owned(),
                source,
            });
        }
    };
    let bad = |why: String| TpmError::AkFileFormat {
        path: path.to_owned(),
        why,
    };
    let file: AkFile = serde_json::from_slice(&text).map_err(|e| bad(e.to_string()))?;
    if file.format != FORMAT {
        return Err(bad(format!(
            "format is {:?}, this daemon reads {FORMAT:?}",
            file.format
        )));
    }
    let public = untpm2b(&file.public).map_err(|why| bad(format!("`public`: {why}")))?;
    let private = untpm2b(&file.private).map_err(|why| bad(format!("`private`: {why}")))?;
    Ok(Some(AkBlobs { public, private }))
}

/// Writes the blobs atomically (a crash leaves the old file or the new one) with mode 0600:
/// the private blob is only usable inside this TPM, but nobody else needs to read it.
pub(super) fn write(path: &Path, blobs: &AkBlobs) -> Result<(), TpmError> {
    let file = AkFile {
        format: FORMAT.to_string(),
        public: tpm2b(&blobs.public),
        private: tpm2b(&blobs.private),
    };
    let mut text = serde_json::to_vec_pretty(&file).map_err(|e| TpmError::AkFileFormat {
        path: path.to_owned(),
        why: format!("serializing: {e}"),
    })?;
    text.push(b'\n');
    crate::atomic_file::replace_private(path, &text).map_err(|source| TpmError::AkFileIo {
        path: path.to_owned(),
        source,
    })
}

fn tpm2b(body: &[u8]) -> String {
    // Bodies come from the TPM (TPM2B_PUBLIC and TPM2B_PRIVATE are well under 64 KiB).
    let len = u16::try_from(body.len()).unwrap_or(u16::MAX);
    let mut out = len.to_be_bytes().to_vec();
    out.extend_from_slice(body);
    hex::encode(out)
}

/// Why a stored blob is not a TPM2B.
#[derive(Debug, thiserror::Error)]
enum Tpm2bError {
    #[error("not hex: {0}")]
    NotHex(#[from] hex::FromHexError),
    #[error("{len} bytes, shorter than its 2-byte size")]
    NoSize { len: usize },
    #[error("size field says {size} bytes, {body} follow")]
    SizeMismatch { size: usize, body: usize },
    #[error("size field says 0 bytes: an empty blob is no key")]
    Empty,
}

fn untpm2b(text: &str) -> Result<Vec<u8>, Tpm2bError> {
    let bytes = hex::decode(text)?;
    let (size, body) = bytes
        .split_first_chunk::<2>()
        .ok_or(Tpm2bError::NoSize { len: bytes.len() })?;
    let size = usize::from(u16::from_be_bytes(*size));
    if size != body.len() {
        return Err(Tpm2bError::SizeMismatch {
            size,
            body: body.len(),
        });
    }
    if size == 0 {
        return Err(Tpm2bError::Empty);
    }
    Ok(body.to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::{os::unix::fs::PermissionsExt, path::PathBuf};

    fn dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rw-tpm-akfile-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn tpm_ak_file_round_trips_with_mode_0600() {
        let d = dir("rt");
        let path = d.join("ak.json");
        assert_eq!(read(&path).unwrap(), None);
        let blobs = AkBlobs {
            public: vec![0, 0x23, 0, 0x0b, 1, 2, 3],
            private: vec![9; 126],
        };
        write(&path, &blobs).unwrap();
        assert_eq!(read(&path).unwrap(), Some(blobs.clone()));
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // Rewriting replaces it whole, no temporary left behind.
        let other = AkBlobs {
            public: vec![1],
            private: vec![2],
        };
        write(&path, &other).unwrap();
        assert_eq!(read(&path).unwrap(), Some(other));
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 1);
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn tpm_ak_file_malformed_is_an_error_not_a_new_ak() {
        let d = dir("bad");
        let path = d.join("ak.json");
        for text in [
            "not json",
            r#"{"format":"other/9","public":"0001aa","private":"0001bb"}"#,
            r#"{"format":"rackwarden-tpm-ak/1","public":"0005aa","private":"0001bb"}"#,
            r#"{"format":"rackwarden-tpm-ak/1","public":"zz","private":"0001bb"}"#,
            r#"{"format":"rackwarden-tpm-ak/1","public":"00","private":"0001bb"}"#,
            r#"{"format":"rackwarden-tpm-ak/1","public":"0000","private":"0001bb"}"#,
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read(&path).unwrap_err();
            assert!(matches!(e, TpmError::AkFileFormat { .. }), "{text}: {e}");
            assert!(e.to_string().contains("ak.json"), "{e}");
        }
        assert_eq!(
            untpm2b("0005aa").unwrap_err().to_string(),
            "size field says 5 bytes, 1 follow"
        );
        assert_eq!(
            untpm2b("00").unwrap_err().to_string(),
            "1 bytes, shorter than its 2-byte size"
        );
        std::fs::remove_dir_all(&d).unwrap();
    }
}
