//! C2SP tlog-checkpoint bodies signed as C2SP signed-notes with ed25519.
//!
//! A checkpoint's body is three lines: the log's origin, the tree size in decimal, and the
//! root hash in standard base64; more lines (extensions) may follow. A signed note is the
//! text (ending in a newline), a blank line, and one or more signature lines
//! `— <key name> <base64(key hash (4 bytes) || ed25519 signature (64 bytes))>`, where the key
//! hash is the first four bytes of `SHA-256(key name || "\n" || 0x01 || public key)`. The
//! signature is over the text alone, its final newline included.
//!
//! A verifier key is written as C2SP's vkey: `<name>+<key hash hex>+<base64(0x01 ||
//! public key)>`.

use base64::{Engine as _, engine::general_purpose::STANDARD};
use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use sha2::{Digest, Sha256};

use super::Hash;

/// The ed25519 signature type's identifier in key hashes and vkeys.
const ED25519: u8 = 0x01;

/// What is wrong with a note, a checkpoint or a verifier key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NoteError {
    #[error("line {line}: {what}")]
    Line { line: usize, what: String },
    #[error("the note has no signature block (a blank line and `— ` signature lines)")]
    NoSignatures,
    #[error("the note is signed, but not by `{name}` with key hash {hash}")]
    NotSignedBy { name: String, hash: String },
    #[error("line {line}: the signature by `{name}` does not verify")]
    BadSignature { line: usize, name: String },
    #[error("verifier key: {0}")]
    BadKey(String),
    #[error("the checkpoint's origin is `{got}`, not the expected `{want}`")]
    WrongOrigin { got: String, want: String },
}

fn line_err(line: usize, what: impl Into<String>) -> NoteError {
    NoteError::Line {
        line,
        what: what.into(),
    }
}

/// A log's checkpoint: the tree it commits to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    pub origin: String,
    pub size: u64,
    pub root: Hash,
    /// Extension lines after the root, as they were (without newlines).
    pub extensions: Vec<String>,
}

impl Checkpoint {
    /// The note text: origin, size, root, extensions, each line ending in `\n`.
    pub fn body(&self) -> String {
        let mut s = format!(
            "{}\n{}\n{}\n",
            self.origin,
            self.size,
            STANDARD.encode(self.root)
        );
        for e in &self.extensions {
            s.push_str(e);
            s.push('\n');
        }
        s
    }

    /// Parses a note text (no signatures) as a checkpoint body.
    pub fn parse_body(text: &str) -> Result<Checkpoint, NoteError> {
        let Some(lines) = text.strip_suffix('\n') else {
            return Err(line_err(
                text.lines().count().max(1),
                "the checkpoint does not end in a newline",
            ));
        };
        let lines: Vec<&str> = lines.split('\n').collect();
        let origin = lines.first().copied().unwrap_or_default();
        if origin.is_empty() {
            return Err(line_err(1, "the origin line is empty"));
        }
        let size_line = lines
            .get(1)
            .ok_or_else(|| line_err(2, "missing: the tree size"))?;
        let size = parse_decimal(size_line).ok_or_else(|| {
            line_err(
                2,
                format!("the tree size `{size_line}` is not a decimal number (no sign, no leading zeros)"),
            )
        })?;
        let root_line = lines
            .get(2)
            .ok_or_else(|| line_err(3, "missing: the root hash"))?;
        let root: Hash = STANDARD
            .decode(root_line)
            .ok()
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| {
                line_err(
                    3,
                    format!("the root hash `{root_line}` is not 32 bytes in standard base64"),
                )
            })?;
        let extensions: Vec<String> = lines[3..].iter().map(|l| l.to_string()).collect();
        if let Some(i) = extensions.iter().position(|l| l.is_empty()) {
            return Err(line_err(4 + i, "an empty line inside the checkpoint body"));
        }
        Ok(Checkpoint {
            origin: origin.to_string(),
            size,
            root,
            extensions,
        })
    }

    /// `origin`, size and root hex in one phrase (how errors name a checkpoint).
    pub fn describe(&self) -> String {
        format!(
            "checkpoint of `{}` at size {} root {}",
            self.origin,
            self.size,
            super::hex(&self.root)
        )
    }
}

fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) || (s.len() > 1 && s.starts_with('0'))
    {
        return None;
    }
    s.parse().ok()
}

/// The 4-byte key hash of an ed25519 note key.
pub fn key_hash(name: &str, key: &VerifyingKey) -> [u8; 4] {
    let mut h = Sha256::new();
    h.update(name.as_bytes());
    h.update(b"\n");
    h.update([ED25519]);
    h.update(key.as_bytes());
    let d: [u8; 32] = h.finalize().into();
    [d[0], d[1], d[2], d[3]]
}

fn valid_key_name(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || c == '+' || c.is_control())
}

/// A note signer: a key name and its ed25519 key.
pub struct NoteSigner {
    name: String,
    key: SigningKey,
}

impl NoteSigner {
    /// A signer named `name` (no spaces, no `+`).
    pub fn new(name: &str, key: SigningKey) -> Result<NoteSigner, NoteError> {
        if !valid_key_name(name) {
            return Err(NoteError::BadKey(format!(
                "the key name `{name}` is empty or has a space or `+`"
            )));
        }
        Ok(NoteSigner {
            name: name.to_string(),
            key,
        })
    }

    pub fn verifier(&self) -> NoteVerifier {
        NoteVerifier {
            name: self.name.clone(),
            key: self.key.verifying_key(),
        }
    }

    /// The signed note: `text` (which must end in a newline), a blank line, our signature.
    pub fn sign(&self, text: &str) -> Result<String, NoteError> {
        if !text.ends_with('\n') {
            return Err(line_err(
                text.lines().count().max(1),
                "a note's text ends in a newline",
            ));
        }
        let sig = self.key.sign(text.as_bytes());
        let mut blob = Vec::with_capacity(68);
        blob.extend_from_slice(&key_hash(&self.name, &self.key.verifying_key()));
        blob.extend_from_slice(&sig.to_bytes());
        Ok(format!(
            "{text}\n\u{2014} {} {}\n",
            self.name,
            STANDARD.encode(blob)
        ))
    }

    /// A checkpoint signed.
    pub fn sign_checkpoint(&self, cp: &Checkpoint) -> Result<String, NoteError> {
        self.sign(&cp.body())
    }
}

/// A note verifier: a key name and its ed25519 public key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoteVerifier {
    pub name: String,
    pub key: VerifyingKey,
}

impl NoteVerifier {
    /// The C2SP vkey: `<name>+<key hash hex>+<base64(0x01 || key)>`.
    pub fn vkey(&self) -> String {
        let mut k = vec![ED25519];
        k.extend_from_slice(self.key.as_bytes());
        format!(
            "{}+{}+{}",
            self.name,
            ::hex::encode(key_hash(&self.name, &self.key)),
            STANDARD.encode(k)
        )
    }

    /// Parses a vkey (surrounding whitespace ignored).
    pub fn from_vkey(vkey: &str) -> Result<NoteVerifier, NoteError> {
        let vkey = vkey.trim();
        // Split from the left: a name and a hex hash have no `+`, base64 may.
        let mut parts = vkey.splitn(3, '+');
        let (Some(name), Some(hash_hex), Some(key_b64)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(NoteError::BadKey(format!(
                "`{vkey}` is not `<name>+<key hash hex>+<base64 key>`"
            )));
        };
        if !valid_key_name(name) {
            return Err(NoteError::BadKey(format!("bad key name `{name}`")));
        }
        let raw = STANDARD
            .decode(key_b64)
            .map_err(|e| NoteError::BadKey(format!("the key is not base64: {e}")))?;
        let Some((&ED25519, key)) = raw.split_first() else {
            return Err(NoteError::BadKey(
                "not an ed25519 key (type byte 0x01)".into(),
            ));
        };
        let key: [u8; 32] = key
            .try_into()
            .map_err(|_| NoteError::BadKey(format!("the key has {} bytes, not 32", key.len())))?;
        let key = VerifyingKey::from_bytes(&key)
            .map_err(|e| NoteError::BadKey(format!("not an ed25519 point: {e}")))?;
        let v = NoteVerifier {
            name: name.to_string(),
            key,
        };
        if ::hex::encode(key_hash(name, &key)) != hash_hex.to_ascii_lowercase() {
            return Err(NoteError::BadKey(format!(
                "the key hash {hash_hex} is not the hash of name `{name}` and this key"
            )));
        }
        Ok(v)
    }

    /// Checks that `note` carries a valid signature by this key and returns its text.
    /// Signatures by other keys are ignored (a note may be cosigned).
    pub fn open<'a>(&self, note: &'a str) -> Result<&'a str, NoteError> {
        let Some(split) = note.rfind("\n\n") else {
            return Err(NoteError::NoSignatures);
        };
        let text = &note[..split + 1];
        let sigs = &note[split + 2..];
        let text_lines = text.matches('\n').count();
        let Some(sigs) = sigs.strip_suffix('\n') else {
            return Err(line_err(
                note.matches('\n').count() + 1,
                "the signature block does not end in a newline",
            ));
        };
        let want_hash = key_hash(&self.name, &self.key);
        for (i, line) in sigs.split('\n').enumerate() {
            let lineno = text_lines + 2 + i;
            let Some(rest) = line.strip_prefix("\u{2014} ") else {
                return Err(line_err(
                    lineno,
                    "a signature line starts with `— ` (an em dash and a space)",
                ));
            };
            let Some((name, b64)) = rest.split_once(' ') else {
                return Err(line_err(lineno, "a signature line is `— <name> <base64>`"));
            };
            let blob = STANDARD
                .decode(b64)
                .map_err(|e| line_err(lineno, format!("the signature is not base64: {e}")))?;
            if blob.len() < 5 {
                return Err(line_err(
                    lineno,
                    "the signature is shorter than a key hash and a signature",
                ));
            }
            if name != self.name || blob[..4] != want_hash {
                continue;
            }
            let sig: [u8; 64] = blob[4..].try_into().map_err(|_| {
                line_err(
                    lineno,
                    format!(
                        "an ed25519 signature is 64 bytes, this one {}",
                        blob.len() - 4
                    ),
                )
            })?;
            return match self
                .key
                .verify_strict(text.as_bytes(), &Signature::from_bytes(&sig))
            {
                Ok(()) => Ok(text),
                Err(_) => Err(NoteError::BadSignature {
                    line: lineno,
                    name: name.to_string(),
                }),
            };
        }
        Err(NoteError::NotSignedBy {
            name: self.name.clone(),
            hash: ::hex::encode(want_hash),
        })
    }

    /// Verifies a signed checkpoint and parses its body.
    pub fn open_checkpoint(&self, note: &str) -> Result<Checkpoint, NoteError> {
        Checkpoint::parse_body(self.open(note)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer() -> NoteSigner {
        NoteSigner::new("example.com/log", SigningKey::from_bytes(&[9u8; 32])).unwrap()
    }

    fn cp(size: u64) -> Checkpoint {
        Checkpoint {
            origin: "example.com/log".into(),
            size,
            root: [7u8; 32],
            extensions: vec![],
        }
    }

    #[test]
    fn checkpoint_round_trips_and_verifies() {
        let s = signer();
        let note = s.sign_checkpoint(&cp(42)).unwrap();
        assert!(note.starts_with("example.com/log\n42\nBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=\n\n\u{2014} example.com/log "));
        let v = NoteVerifier::from_vkey(&s.verifier().vkey()).unwrap();
        assert_eq!(v, s.verifier());
        assert_eq!(v.open_checkpoint(&note).unwrap(), cp(42));
    }

    #[test]
    fn tampering_is_refused_with_the_line() {
        let s = signer();
        let v = s.verifier();
        let note = s.sign_checkpoint(&cp(42)).unwrap();
        let forged = note.replacen("\n42\n", "\n41\n", 1);
        assert_eq!(
            v.open_checkpoint(&forged),
            Err(NoteError::BadSignature {
                line: 5,
                name: "example.com/log".into()
            })
        );
        let other = NoteSigner::new("example.com/log", SigningKey::from_bytes(&[8u8; 32]))
            .unwrap()
            .verifier();
        assert!(matches!(
            other.open_checkpoint(&note),
            Err(NoteError::NotSignedBy { .. })
        ));
        assert_eq!(v.open_checkpoint("a\n1\n"), Err(NoteError::NoSignatures));
        let bad_sig_line = note.replace("\u{2014} ", "- ");
        assert!(matches!(
            v.open_checkpoint(&bad_sig_line),
            Err(NoteError::Line { line: 5, .. })
        ));
    }

    #[test]
    fn bodies_are_parsed_strictly() {
        let err = |t: &str| Checkpoint::parse_body(t).unwrap_err().to_string();
        assert!(err("o\n012\nAAAA\n").starts_with("line 2:"));
        assert!(err("o\n12\nAAAA\n").starts_with("line 3:"));
        assert!(err("\n12\nAAAA\n").starts_with("line 1:"));
        assert!(err("o\n12").starts_with("line 2:"));
        let body = cp(3).body() + "ext line\n";
        let parsed = Checkpoint::parse_body(&body).unwrap();
        assert_eq!(parsed.extensions, vec!["ext line".to_string()]);
        assert_eq!(parsed.body(), body);
    }

    /// The example key and note of the Go reference implementation
    /// (golang.org/x/mod/sumdb/note): ed25519 is deterministic, so ours match byte for byte.
    #[test]
    fn the_go_reference_note_is_reproduced_byte_for_byte() {
        const VKEY: &str = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW";
        const SKEY_MATERIAL: &str = "AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz";
        const TEXT: &str = "If you think cryptography is the answer to your problem,\nthen you don't know what your problem is.\n";
        const SIG: &str = "— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n";
        let material = STANDARD.decode(SKEY_MATERIAL).unwrap();
        assert_eq!(material[0], ED25519);
        let seed: [u8; 32] = material[1..].try_into().unwrap();
        let signer = NoteSigner::new("PeterNeumann", SigningKey::from_bytes(&seed)).unwrap();
        assert_eq!(signer.verifier().vkey(), VKEY);
        let note = signer.sign(TEXT).unwrap();
        assert_eq!(note, format!("{TEXT}\n{SIG}"));
        let v = NoteVerifier::from_vkey(VKEY).unwrap();
        assert_eq!(v.open(&note).unwrap(), TEXT);
        assert!(
            v.open(&note.replace("cryptography", "cryptographY"))
                .is_err()
        );
    }

    #[test]
    fn vkeys_are_checked() {
        let vk = signer().verifier().vkey();
        assert!(NoteVerifier::from_vkey("nonsense").is_err());
        let wrong_hash = {
            let mut p: Vec<&str> = vk.split('+').collect();
            p[1] = "00000000";
            p.join("+")
        };
        assert!(NoteVerifier::from_vkey(&wrong_hash).is_err());
    }
}
