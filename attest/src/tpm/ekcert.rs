//! The EK certificate: chain to a configured manufacturer root, checked by hand, and binding to
//! the EK the host reported. By hand because EK certificates carry what generic (webpki-style)
//! verifiers refuse: a critical subjectAltName of TPM directory attributes, the EK EKU
//! 2.23.133.8.1, keyEncipherment only, and an empty subject.
//!
//! Checked: each link's issuer name and RSA PKCS#1 v1.5 signature (SHA-256/384/512), every
//! certificate's validity at `now`, that every issuer is a CA (basicConstraints cA and, when
//! present, keyUsage keyCertSign), and that the leaf's RSA key is the EK. Not checked:
//! revocation, name or policy constraints, path length, and unknown critical extensions.

use der::asn1::ObjectIdentifier;
use der::oid::AssociatedOid;
use der::{Decode, Encode, SliceReader};
use rsa::pkcs8::DecodePublicKey;
use rsa::{Pkcs1v15Sign, RsaPublicKey};
use sha2::{Digest, Sha256, Sha384, Sha512};
use thiserror::Error;
use x509_cert::Certificate;
use x509_cert::ext::pkix::{BasicConstraints, KeyUsage};

use super::public::EkPublic;

/// Longest chain from leaf to root we follow (a loop in the configured CAs ends here).
const MAX_DEPTH: usize = 8;

const RSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.11");
const RSA_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.12");
const RSA_SHA512: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.13");
const RSA_ENCRYPTION: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.1");
const EC_PUBLIC_KEY: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.2.1");
const ECDSA_SHA256: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.2");
const ECDSA_SHA384: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.3");
const ECDSA_SHA512: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.10045.4.3.4");
const RSA_PSS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.2.840.113549.1.1.10");

/// The verified EK certificate, for the verifier's records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EkCertificate {
    /// RFC 4514 text of the leaf's subject (often empty or "CN=unknown" for EK certs).
    pub subject: String,
    pub issuer: String,
    /// The leaf's serial number, hex.
    pub serial: String,
    /// Subjects from the leaf's issuer up to and including the root that anchored it.
    pub chain: Vec<String>,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum EkCertError {
    #[error("EK certificate is not DER X.509: {0}")]
    LeafDer(der::Error),
    #[error("{which} PEM: {source}")]
    Pem {
        which: &'static str,
        source: der::Error,
    },
    #[error("no trusted EK roots are configured")]
    NoRoots,
    #[error("EK certificate key is {alg}, want rsaEncryption (an RSA EK)")]
    LeafKeyNotRsa { alg: String },
    #[error("EK certificate key: {0}")]
    LeafKey(String),
    #[error("EK certificate key differs from the EK's TPMT_PUBLIC (modulus or exponent)")]
    KeyMismatch,
    #[error("certificate {subject} is not valid before {not_before} (now {now}, unix seconds)")]
    NotYetValid {
        subject: String,
        not_before: u64,
        now: u64,
    },
    #[error("certificate {subject} expired at {not_after} (now {now}, unix seconds)")]
    Expired {
        subject: String,
        not_after: u64,
        now: u64,
    },
    #[error(
        "certificate {subject} is signed with {alg}: only RSA PKCS#1 v1.5 with SHA-256/384/512 is verified (ECDSA-signed CAs are not supported yet)"
    )]
    UnsupportedSignature { subject: String, alg: String },
    #[error("signature on certificate {subject} does not verify with the key of {issuer}")]
    BadSignature { subject: String, issuer: String },
    #[error("no configured root or intermediate is {issuer}, the issuer of {subject}")]
    UnknownIssuer { subject: String, issuer: String },
    #[error("certificate {subject} issues certificates but is not a CA: {why}")]
    NotCa { subject: String, why: &'static str },
    #[error("key of issuing certificate {subject} is not usable: {why}")]
    IssuerKey { subject: String, why: String },
    #[error("certificate {subject}: {why}")]
    Malformed { subject: String, why: String },
    #[error("no root reached within {MAX_DEPTH} certificates")]
    ChainTooLong,
}

fn subject(c: &Certificate) -> String {
    c.tbs_certificate.subject.to_string()
}

fn oid_name(oid: &ObjectIdentifier) -> String {
    let known = [
        (RSA_SHA256, "sha256WithRSAEncryption"),
        (RSA_SHA384, "sha384WithRSAEncryption"),
        (RSA_SHA512, "sha512WithRSAEncryption"),
        (RSA_PSS, "RSASSA-PSS"),
        (ECDSA_SHA256, "ecdsa-with-SHA256"),
        (ECDSA_SHA384, "ecdsa-with-SHA384"),
        (ECDSA_SHA512, "ecdsa-with-SHA512"),
        (RSA_ENCRYPTION, "rsaEncryption"),
        (EC_PUBLIC_KEY, "id-ecPublicKey"),
    ];
    known
        .iter()
        .find(|(o, _)| o == oid)
        .map_or_else(|| oid.to_string(), |(_, n)| (*n).to_string())
}

/// Decodes one certificate from the front of `der`: an EK certificate read from NV is padded
/// to the index size, and the DER SEQUENCE's own length says where the certificate ends.
fn decode_leaf(der_bytes: &[u8]) -> Result<Certificate, EkCertError> {
    let mut r = SliceReader::new(der_bytes).map_err(EkCertError::LeafDer)?;
    Certificate::decode(&mut r).map_err(EkCertError::LeafDer)
}

/// All certificates of a PEM bundle; none for an empty (or all-whitespace) one.
fn load_pem(which: &'static str, pem: &[u8]) -> Result<Vec<Certificate>, EkCertError> {
    // load_pem_chain underflows on an input that trims to nothing, so never hand it one.
    if pem.iter().all(u8::is_ascii_whitespace) {
        return Ok(Vec::new());
    }
    Certificate::load_pem_chain(pem).map_err(|source| EkCertError::Pem { which, source })
}

fn check_validity(c: &Certificate, now: u64) -> Result<(), EkCertError> {
    let v = &c.tbs_certificate.validity;
    let not_before = v.not_before.to_unix_duration().as_secs();
    let not_after = v.not_after.to_unix_duration().as_secs();
    if now < not_before {
        return Err(EkCertError::NotYetValid {
            subject: subject(c),
            not_before,
            now,
        });
    }
    if now > not_after {
        return Err(EkCertError::Expired {
            subject: subject(c),
            not_after,
            now,
        });
    }
    Ok(())
}

/// An issuer must say it is a CA; otherwise any end-entity cert under the root could mint EKs.
fn check_ca(c: &Certificate) -> Result<(), EkCertError> {
    let not_ca = |why| EkCertError::NotCa {
        subject: subject(c),
        why,
    };
    let malformed = |e: der::Error| EkCertError::Malformed {
        subject: subject(c),
        why: e.to_string(),
    };
    let exts = c.tbs_certificate.extensions.as_deref().unwrap_or_default();
    let mut is_ca = false;
    for ext in exts {
        if ext.extn_id == BasicConstraints::OID {
            is_ca = BasicConstraints::from_der(ext.extn_value.as_bytes())
                .map_err(malformed)?
                .ca;
        } else if ext.extn_id == KeyUsage::OID {
            let ku = KeyUsage::from_der(ext.extn_value.as_bytes()).map_err(malformed)?;
            if !ku.key_cert_sign() {
                return Err(not_ca("keyUsage lacks keyCertSign"));
            }
        }
    }
    if !is_ca {
        return Err(not_ca("no basicConstraints with cA true"));
    }
    Ok(())
}

/// Whether `issuer`'s key signed `c`. Errors for algorithms we do not verify and for
/// unusable issuer keys; `Ok(false)` for a signature that does not verify.
fn signed_by(c: &Certificate, issuer: &Certificate) -> Result<bool, EkCertError> {
    let alg = &c.signature_algorithm.oid;
    let scheme = match *alg {
        RSA_SHA256 => Pkcs1v15Sign::new::<Sha256>(),
        RSA_SHA384 => Pkcs1v15Sign::new::<Sha384>(),
        RSA_SHA512 => Pkcs1v15Sign::new::<Sha512>(),
        _ => {
            return Err(EkCertError::UnsupportedSignature {
                subject: subject(c),
                alg: oid_name(alg),
            });
        }
    };
    let malformed = |why: String| EkCertError::Malformed {
        subject: subject(c),
        why,
    };
    // The outer and inner algorithm must agree (RFC 5280 4.1.1.2), or the signed bytes could
    // claim a different algorithm than the one checked.
    if c.tbs_certificate.signature != c.signature_algorithm {
        return Err(malformed(
            "tbsCertificate.signature differs from signatureAlgorithm".into(),
        ));
    }
    let tbs = c
        .tbs_certificate
        .to_der()
        .map_err(|e| malformed(e.to_string()))?;
    let hashed = match *alg {
        RSA_SHA384 => Sha384::digest(&tbs).to_vec(),
        RSA_SHA512 => Sha512::digest(&tbs).to_vec(),
        _ => Sha256::digest(&tbs).to_vec(),
    };
    let sig = c
        .signature
        .as_bytes()
        .ok_or_else(|| malformed("signature has unused bits".into()))?;
    let key = issuer_key(issuer)?;
    Ok(key.verify(scheme, &hashed, sig).is_ok())
}

fn issuer_key(issuer: &Certificate) -> Result<RsaPublicKey, EkCertError> {
    let bad = |why: String| EkCertError::IssuerKey {
        subject: subject(issuer),
        why,
    };
    let spki = issuer
        .tbs_certificate
        .subject_public_key_info
        .to_der()
        .map_err(|e| bad(e.to_string()))?;
    RsaPublicKey::from_public_key_der(&spki).map_err(|e| bad(e.to_string()))
}

/// The leaf's key must be the EK: same modulus and exponent.
fn check_leaf_key(leaf: &Certificate, ek: &EkPublic) -> Result<(), EkCertError> {
    let spki = &leaf.tbs_certificate.subject_public_key_info;
    if spki.algorithm.oid != RSA_ENCRYPTION {
        return Err(EkCertError::LeafKeyNotRsa {
            alg: oid_name(&spki.algorithm.oid),
        });
    }
    let der_spki = spki
        .to_der()
        .map_err(|e| EkCertError::LeafKey(e.to_string()))?;
    let key = RsaPublicKey::from_public_key_der(&der_spki)
        .map_err(|e| EkCertError::LeafKey(e.to_string()))?;
    if &key != ek.public_key() {
        return Err(EkCertError::KeyMismatch);
    }
    Ok(())
}

/// Verifies `ek_cert_der` (NV padding after the certificate is ignored) up to one of
/// `roots_pem` through `intermediates_pem` (either may hold several PEM certificates; the
/// intermediates may be empty), at `now_unix` seconds, and that its key is `ek`.
pub fn verify_ek_certificate(
    ek_cert_der: &[u8],
    ek: &EkPublic,
    roots_pem: &[u8],
    intermediates_pem: &[u8],
    now_unix: u64,
) -> Result<EkCertificate, EkCertError> {
    let leaf = decode_leaf(ek_cert_der)?;
    let roots = load_pem("EK roots", roots_pem)?;
    let intermediates = load_pem("EK intermediates", intermediates_pem)?;
    if roots.is_empty() {
        return Err(EkCertError::NoRoots);
    }
    check_leaf_key(&leaf, ek)?;
    let mut chain = Vec::new();
    let mut cert = &leaf;
    for _ in 0..MAX_DEPTH {
        check_validity(cert, now_unix)?;
        let (issuer, is_root) = find_issuer(cert, &roots, &intermediates)?;
        check_ca(issuer)?;
        chain.push(subject(issuer));
        if is_root {
            check_validity(issuer, now_unix)?;
            return Ok(EkCertificate {
                subject: subject(&leaf),
                issuer: leaf.tbs_certificate.issuer.to_string(),
                serial: hex::encode(leaf.tbs_certificate.serial_number.as_bytes()),
                chain,
            });
        }
        cert = issuer;
    }
    Err(EkCertError::ChainTooLong)
}

/// The root (preferred, `true`) or intermediate (`false`) whose subject is `cert`'s issuer and
/// whose key verifies its signature. Several CAs may share a name (two swtpm installs both
/// call theirs CN=swtpm-localca), so a name match whose signature fails keeps looking.
fn find_issuer<'a>(
    cert: &Certificate,
    roots: &'a [Certificate],
    intermediates: &'a [Certificate],
) -> Result<(&'a Certificate, bool), EkCertError> {
    let issuer_name = &cert.tbs_certificate.issuer;
    let candidates = roots
        .iter()
        .map(|c| (c, true))
        .chain(intermediates.iter().map(|c| (c, false)))
        .filter(|(c, _)| &c.tbs_certificate.subject == issuer_name);
    let mut name_matched = false;
    for (candidate, is_root) in candidates {
        name_matched = true;
        if signed_by(cert, candidate)? {
            return Ok((candidate, is_root));
        }
    }
    let (subject, issuer) = (subject(cert), issuer_name.to_string());
    if name_matched {
        Err(EkCertError::BadSignature { subject, issuer })
    } else {
        Err(EkCertError::UnknownIssuer { subject, issuer })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpm::public::tests::swtpm_ek;

    const LEAF: &[u8] = include_bytes!("testdata/swtpm-ek-rsa2048.der");
    const ROOT: &[u8] = include_bytes!("testdata/swtpm-rootca.pem");
    const ISSUER: &[u8] = include_bytes!("testdata/swtpm-issuer.pem");
    /// After every fixture's notBefore (the latest is 2026-12-04T15:53:52Z).
    const NOW: u64 = 1_796_500_000;

    #[test]
    fn tpm_ek_cert_from_swtpm_verifies() {
        let ek = swtpm_ek();
        let got = verify_ek_certificate(LEAF, &ek, ROOT, ISSUER, NOW).unwrap();
        assert_eq!(got.subject, "CN=unknown");
        assert_eq!(got.issuer, "CN=swtpm-localca");
        assert_eq!(got.serial, "02");
        assert_eq!(
            got.chain,
            vec!["CN=swtpm-localca", "CN=swtpm-localca-rootca"]
        );
        // NV padding after the DER (zeros or erased-flash 0xff) is ignored.
        for pad in [0x00, 0xff] {
            let mut padded = LEAF.to_vec();
            padded.extend([pad; 200]);
            assert_eq!(
                verify_ek_certificate(&padded, &ek, ROOT, ISSUER, NOW).unwrap(),
                got
            );
        }
        // Roots and intermediates may come as one bundle in either argument.
        let bundle = [ISSUER, ROOT].concat();
        verify_ek_certificate(LEAF, &ek, &bundle, b"", NOW).unwrap();
        verify_ek_certificate(LEAF, &ek, ROOT, &bundle, NOW).unwrap();
    }

    #[test]
    fn tpm_ek_cert_refusals() {
        let ek = swtpm_ek();
        let other_root = include_bytes!("testdata/other-rootca.pem");
        let other_issuer = include_bytes!("testdata/other-issuer.pem");
        // Another swtpm install's CA has the same names but other keys.
        let e = verify_ek_certificate(LEAF, &ek, other_root, other_issuer, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "signature on certificate CN=unknown does not verify with the key of CN=swtpm-localca"
        );
        // The intermediate signed by another root.
        let e = verify_ek_certificate(LEAF, &ek, other_root, ISSUER, NOW).unwrap_err();
        assert_eq!(
            e,
            EkCertError::BadSignature {
                subject: "CN=swtpm-localca".into(),
                issuer: "CN=swtpm-localca-rootca".into()
            }
        );
        let e = verify_ek_certificate(LEAF, &ek, ROOT, b"\n", NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "no configured root or intermediate is CN=swtpm-localca, the issuer of CN=unknown"
        );
        assert_eq!(
            verify_ek_certificate(LEAF, &ek, b"", ISSUER, NOW),
            Err(EkCertError::NoRoots)
        );
        let e = verify_ek_certificate(LEAF, &ek, ROOT, ISSUER, 1_796_399_000).unwrap_err();
        assert!(
            matches!(
                e,
                EkCertError::NotYetValid {
                    not_before: 1_796_399_226,
                    ..
                }
            ),
            "{e}"
        );
        // Another EK.
        let mut modulus = ek.modulus().to_vec();
        modulus[100] ^= 1;
        let other_ek = EkPublic::from_modulus(&modulus).unwrap();
        let e = verify_ek_certificate(LEAF, &other_ek, ROOT, ISSUER, NOW);
        assert_eq!(e, Err(EkCertError::KeyMismatch));
        // The same TPM's ECC EK certificate is not the RSA EK's.
        let ecc = include_bytes!("testdata/swtpm-ek-secp384r1.der");
        let e = verify_ek_certificate(ecc, &ek, ROOT, ISSUER, NOW).unwrap_err();
        assert_eq!(
            e.to_string(),
            "EK certificate key is id-ecPublicKey, want rsaEncryption (an RSA EK)"
        );
        // A changed byte in the signed part (the "unknown" of the subject).
        let at = LEAF.windows(7).position(|w| w == b"unknown").unwrap();
        let mut tampered = LEAF.to_vec();
        tampered[at] = b'U';
        let e = verify_ek_certificate(&tampered, &ek, ROOT, ISSUER, NOW).unwrap_err();
        assert!(matches!(e, EkCertError::BadSignature { .. }), "{e}");
        let e = verify_ek_certificate(&LEAF[..500], &ek, ROOT, ISSUER, NOW).unwrap_err();
        assert!(matches!(e, EkCertError::LeafDer(_)), "{e}");
        let e = verify_ek_certificate(LEAF, &ek, b"-----BEGIN CERTIFICATE-----\nAAA", b"", NOW);
        assert!(
            matches!(
                e,
                Err(EkCertError::Pem {
                    which: "EK roots",
                    ..
                })
            ),
            "{e:?}"
        );
    }

    #[test]
    fn tpm_ek_cert_ecdsa_signed_is_a_clear_unsupported_error() {
        let ek = swtpm_ek();
        let leaf = include_bytes!("testdata/ecdsa-signed-ek.der");
        let root = include_bytes!("testdata/ecdsa-rootca.pem");
        let e = verify_ek_certificate(leaf, &ek, root, b"", NOW).unwrap_err();
        assert_eq!(
            e,
            EkCertError::UnsupportedSignature {
                subject: "CN=ec-leaf".into(),
                alg: "ecdsa-with-SHA256".into()
            }
        );
    }
}
