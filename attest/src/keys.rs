//! ed25519 keys in the formats OpenSSL uses: private keys as PKCS#8 PEM
//! (`-----BEGIN PRIVATE KEY-----`), public keys as SubjectPublicKeyInfo PEM
//! (`-----BEGIN PUBLIC KEY-----`). `openssl genpkey -algorithm ed25519` keys load here and
//! ours load in OpenSSL.

use std::{
    fs::OpenOptions,
    io::Write,
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
};

use ed25519_dalek::{
    SigningKey, VerifyingKey,
    pkcs8::{
        DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey,
        spki::der::pem::LineEnding,
    },
};

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a PKCS#8 ed25519 private key PEM: {detail}")]
    BadPrivate { path: PathBuf, detail: String },
    #[error("{path}: not a SubjectPublicKeyInfo ed25519 public key PEM: {detail}")]
    BadPublic { path: PathBuf, detail: String },
    #[error("{path}: private key is readable by group or others (mode {mode:o}); chmod 600 it")]
    TooOpen { path: PathBuf, mode: u32 },
    #[error("{path} exists; refusing to overwrite a key")]
    Exists { path: PathBuf },
}

/// Lowercase hex SHA3-256 of the 32-byte raw public key.
pub fn keyid(key: &VerifyingKey) -> String {
    hex::encode(crate::sha3(key.as_bytes()))
}

/// The verifying key type, re-exported for callers that do not depend on ed25519-dalek.
pub type VerifyingKeyType = VerifyingKey;

/// A fixed, public, well-known key (secret = 32 bytes of 7) for fuzzing and examples. Never
/// enroll it anywhere.
pub fn fixed_test_key() -> VerifyingKey {
    SigningKey::from_bytes(&[7u8; 32]).verifying_key()
}

pub fn generate() -> SigningKey {
    SigningKey::generate(&mut rand_core::OsRng)
}

/// PKCS#8 v1 (private key only). ed25519-dalek's default is v2 with the public key
/// embedded (RFC 5958), which OpenSSL 3.0 refuses as "unsupported".
pub fn private_pem(key: &SigningKey) -> String {
    let bytes = ed25519_dalek::pkcs8::KeypairBytes {
        secret_key: key.to_bytes(),
        public_key: None,
    };
    // Encoding 32 in-memory bytes cannot fail.
    bytes
        .to_pkcs8_pem(LineEnding::LF)
        .map(|p| p.to_string())
        .unwrap_or_default()
}

pub fn public_pem(key: &VerifyingKey) -> String {
    key.to_public_key_pem(LineEnding::LF).unwrap_or_default()
}

/// Writes `DIR/NAME.key` (0600) and `DIR/NAME.pub` (0644); refuses to overwrite either.
pub fn write_keypair(dir: &Path, name: &str) -> Result<(PathBuf, PathBuf, SigningKey), KeyError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| KeyError::Io { path, source }
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let key_path = dir.join(format!("{name}.key"));
    let pub_path = dir.join(format!("{name}.pub"));
    for p in [&key_path, &pub_path] {
        if p.exists() {
            return Err(KeyError::Exists { path: p.clone() });
        }
    }
    let key = generate();
    for (path, text, mode) in [
        (&key_path, private_pem(&key), 0o600),
        (&pub_path, public_pem(&key.verifying_key()), 0o644),
    ] {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(path)
            .map_err(|source| match source.kind() {
                std::io::ErrorKind::AlreadyExists => KeyError::Exists { path: path.clone() },
                _ => KeyError::Io {
                    path: path.clone(),
                    source,
                },
            })?;
        f.write_all(text.as_bytes()).map_err(io(path))?;
        f.sync_all().map_err(io(path))?;
    }
    Ok((key_path, pub_path, key))
}

/// Loads a private key, refusing one that group or others can read.
pub fn load_signing_key(path: &Path) -> Result<SigningKey, KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mode = std::fs::metadata(path).map_err(io)?.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(KeyError::TooOpen {
            path: path.to_path_buf(),
            mode,
        });
    }
    let text = std::fs::read_to_string(path).map_err(io)?;
    SigningKey::from_pkcs8_pem(&text).map_err(|e| KeyError::BadPrivate {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

pub fn load_verifying_key(path: &Path) -> Result<VerifyingKey, KeyError> {
    let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse_verifying_key(&text).map_err(|e| KeyError::BadPublic {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

pub fn parse_verifying_key(pem: &str) -> Result<VerifyingKey, ed25519_dalek::pkcs8::spki::Error> {
    VerifyingKey::from_public_key_pem(pem)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keygen_modes_refusal_and_round_trip() {
        let dir = std::env::temp_dir().join(format!("rw-keys-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let (k, p, key) = write_keypair(&dir, "host").unwrap();
        assert_eq!(
            std::fs::metadata(&k).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(matches!(
            write_keypair(&dir, "host"),
            Err(KeyError::Exists { .. })
        ));
        assert_eq!(load_signing_key(&k).unwrap().to_bytes(), key.to_bytes());
        assert_eq!(load_verifying_key(&p).unwrap(), key.verifying_key());
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert!(matches!(
            load_signing_key(&k),
            Err(KeyError::TooOpen { mode: 0o640, .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Interop with OpenSSL, when it is installed (it is on CI: `cargo xtask setup`).
    #[test]
    fn openssl_keys_load_and_ours_load_in_openssl() {
        use std::process::Command;
        if Command::new("openssl").arg("version").output().is_err() {
            panic!("openssl is not installed; `cargo xtask setup` installs it");
        }
        let dir = std::env::temp_dir().join(format!("rw-ossl-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let k = dir.join("o.key");
        let ok = Command::new("openssl")
            .args(["genpkey", "-algorithm", "ed25519", "-out"])
            .arg(&k)
            .status()
            .unwrap()
            .success();
        assert!(ok);
        std::fs::set_permissions(&k, std::fs::Permissions::from_mode(0o600)).unwrap();
        let ours = load_signing_key(&k).unwrap();
        let pubout = Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(&k)
            .output()
            .unwrap();
        let theirs_pub = parse_verifying_key(&String::from_utf8_lossy(&pubout.stdout)).unwrap();
        assert_eq!(ours.verifying_key(), theirs_pub);
        // A statement signed with OpenSSL's key verifies with OpenSSL's public key.
        let env = crate::dsse::sign(&ours, crate::dsse::INTOTO_PAYLOAD_TYPE, b"{}");
        crate::dsse::verify_envelope(&env, &theirs_pub, crate::dsse::INTOTO_PAYLOAD_TYPE).unwrap();
        // Ours load in OpenSSL.
        let (_, p, _) = write_keypair(&dir, "host").unwrap();
        let st = Command::new("openssl")
            .args(["pkey", "-pubin", "-noout", "-in"])
            .arg(&p)
            .status()
            .unwrap();
        assert!(st.success(), "openssl rejected our public key");
        let st = Command::new("openssl")
            .args(["pkey", "-noout", "-in"])
            .arg(dir.join("host.key"))
            .status()
            .unwrap();
        assert!(st.success(), "openssl rejected our private key");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
