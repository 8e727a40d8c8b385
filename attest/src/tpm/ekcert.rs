//! The EK certificate: chain to a configured manufacturer root, checked by hand, and binding to
//! the EK the host reported. By hand because EK certificates carry what generic (webpki-style)
//! verifiers refuse: a critical subjectAltName of TPM directory attributes, the EK EKU
//! 2.23.133.8.1, keyEncipherment only, and an empty subject.
//!
//! Checked: each link's issuer name and RSA PKCS#1 v1.5 signature (SHA-256/384/512), every
//! certificate's validity at `now`, that every issuer is a CA (basicConstraints cA; keyUsage
//! keyCertSign, which an intermediate must have and a root must have when it has a keyUsage),
//! each CA's pathLenConstraint (how many intermediate CAs may follow it; self-issued ones do
//! not count, RFC 5280 §6.1.4), that a critical extendedKeyUsage of the leaf allows the EK
//! certificate purpose, that no certificate carries an extension twice or a critical extension
//! not in [`UNDERSTOOD_EXTENSIONS`], and that the leaf's RSA key is the EK. Not checked:
//! revocation, and name or policy constraints (a certificate that makes them critical, as
//! RFC 5280 requires, is refused as carrying a critical extension not understood).

use der::asn1::ObjectIdentifier;
use der::oid::AssociatedOid;
use der::{Decode, Encode, SliceReader};
use rsa::pkcs8::DecodePublicKey;
use rsa::{Pkcs1v15Sign, RsaPublicKey};
use sha2::{Digest, Sha256, Sha384, Sha512};
use thiserror::Error;
use x509_cert::Certificate;
use x509_cert::ext::pkix::{BasicConstraints, ExtendedKeyUsage, KeyUsage};

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

const BASIC_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.19");
const KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.15");
const EXTENDED_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37");
const SUBJECT_ALT_NAME: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.17");
const SUBJECT_KEY_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.14");
const AUTHORITY_KEY_ID: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.35");
const SUBJECT_DIRECTORY_ATTRIBUTES: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.9");
const CERTIFICATE_POLICIES: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.32");
const AUTHORITY_INFO_ACCESS: ObjectIdentifier = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.1.1");
const NAME_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.30");
const POLICY_CONSTRAINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.36");
const INHIBIT_ANY_POLICY: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.54");
const CRL_DISTRIBUTION_POINTS: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.31");
/// tcg-kp-EKCertificate: the purpose of an EK certificate (TCG EK Credential Profile).
const TCG_KP_EK_CERTIFICATE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.23.133.8.1");
const ANY_EXTENDED_KEY_USAGE: ObjectIdentifier = ObjectIdentifier::new_unwrap("2.5.29.37.0");

/// The extensions a certificate may mark critical and still be accepted: the ones this
/// verifier checks, and the ones whose meaning cannot be violated by a path it accepts.
///
/// - basicConstraints, keyUsage: checked on every CA (cA, pathLenConstraint, keyCertSign);
/// - extendedKeyUsage: a critical one on the leaf must allow tcg-kp-EKCertificate (or any
///   purpose);
/// - subjectAltName: the TPM's manufacturer, model and firmware version as a directoryName;
///   EK certificates mark it critical because their subject is empty, and no name is
///   matched against it here;
/// - subjectKeyIdentifier, authorityKeyIdentifier, authorityInfoAccess: identifiers and
///   pointers (RFC 5280 has them non-critical);
/// - subjectDirectoryAttributes: the TPM specification and security assertions, informative;
/// - certificatePolicies: no policy is required of a path, so any policy set is acceptable
///   (RFC 5280 §6.1 with `initial-explicit-policy` unset); policyConstraints and
///   inhibitAnyPolicy, which could require one, are not understood.
pub const UNDERSTOOD_EXTENSIONS: &[ObjectIdentifier] = &[
    BASIC_CONSTRAINTS,
    KEY_USAGE,
    EXTENDED_KEY_USAGE,
    SUBJECT_ALT_NAME,
    SUBJECT_KEY_ID,
    AUTHORITY_KEY_ID,
    SUBJECT_DIRECTORY_ATTRIBUTES,
    CERTIFICATE_POLICIES,
    AUTHORITY_INFO_ACCESS,
];

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
    #[error(
        "certificate {subject} carries critical extension {oid}, which this verifier does not process"
    )]
    UnknownCriticalExtension { subject: String, oid: String },
    #[error("certificate {subject} carries extension {oid} more than once")]
    DuplicateExtension { subject: String, oid: String },
    #[error(
        "CA certificate {subject} allows {path_len} intermediate CA(s) below it (basicConstraints pathLenConstraint), but the chain has {below}"
    )]
    PathLenExceeded {
        subject: String,
        path_len: u8,
        below: usize,
    },
    #[error(
        "EK certificate {subject} has a critical extendedKeyUsage without tcg-kp-EKCertificate (2.23.133.8.1): {purposes}"
    )]
    NotForEk { subject: String, purposes: String },
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
        (BASIC_CONSTRAINTS, "basicConstraints"),
        (KEY_USAGE, "keyUsage"),
        (EXTENDED_KEY_USAGE, "extendedKeyUsage"),
        (SUBJECT_ALT_NAME, "subjectAltName"),
        (SUBJECT_KEY_ID, "subjectKeyIdentifier"),
        (AUTHORITY_KEY_ID, "authorityKeyIdentifier"),
        (SUBJECT_DIRECTORY_ATTRIBUTES, "subjectDirectoryAttributes"),
        (CERTIFICATE_POLICIES, "certificatePolicies"),
        (AUTHORITY_INFO_ACCESS, "authorityInfoAccess"),
        (NAME_CONSTRAINTS, "nameConstraints"),
        (POLICY_CONSTRAINTS, "policyConstraints"),
        (INHIBIT_ANY_POLICY, "inhibitAnyPolicy"),
        (CRL_DISTRIBUTION_POINTS, "cRLDistributionPoints"),
        (TCG_KP_EK_CERTIFICATE, "tcg-kp-EKCertificate"),
        (ANY_EXTENDED_KEY_USAGE, "anyExtendedKeyUsage"),
    ];
    known
        .iter()
        .find(|(o, _)| o == oid)
        .map_or_else(|| oid.to_string(), |(_, n)| (*n).to_string())
}

/// An OID in an error about an extension: its name and number (`nameConstraints
/// (2.5.29.30)`), or the number alone.
fn extension_name(oid: &ObjectIdentifier) -> String {
    let name = oid_name(oid);
    if name == oid.to_string() {
        name
    } else {
        format!("{name} ({oid})")
    }
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

/// The extensions of a certificate that the chain checks read, decoded.
struct Extensions {
    basic_constraints: Option<BasicConstraints>,
    key_usage: Option<KeyUsage>,
    /// With whether it is critical.
    extended_key_usage: Option<(ExtendedKeyUsage, bool)>,
}

/// Decodes what the checks read, and refuses an extension that appears twice (which of
/// the two would count?) or a critical one this verifier does not understand (RFC 5280
/// §4.2: a relying party must then reject the certificate).
fn read_extensions(c: &Certificate) -> Result<Extensions, EkCertError> {
    let malformed = |oid: &ObjectIdentifier, e: der::Error| EkCertError::Malformed {
        subject: subject(c),
        why: format!("{}: {e}", extension_name(oid)),
    };
    let exts = c.tbs_certificate.extensions.as_deref().unwrap_or_default();
    let mut out = Extensions {
        basic_constraints: None,
        key_usage: None,
        extended_key_usage: None,
    };
    let mut seen = std::collections::BTreeSet::new();
    for ext in exts {
        let id = &ext.extn_id;
        if !seen.insert(id) {
            return Err(EkCertError::DuplicateExtension {
                subject: subject(c),
                oid: extension_name(id),
            });
        }
        if ext.critical && !UNDERSTOOD_EXTENSIONS.contains(id) {
            return Err(EkCertError::UnknownCriticalExtension {
                subject: subject(c),
                oid: extension_name(id),
            });
        }
        let value = ext.extn_value.as_bytes();
        if *id == BasicConstraints::OID {
            out.basic_constraints =
                Some(BasicConstraints::from_der(value).map_err(|e| malformed(id, e))?);
        } else if *id == KeyUsage::OID {
            out.key_usage = Some(KeyUsage::from_der(value).map_err(|e| malformed(id, e))?);
        } else if *id == ExtendedKeyUsage::OID {
            let eku = ExtendedKeyUsage::from_der(value).map_err(|e| malformed(id, e))?;
            out.extended_key_usage = Some((eku, ext.critical));
        }
    }
    Ok(out)
}

/// The leaf's own extensions: understood, and, if its extendedKeyUsage is critical, one that
/// allows an EK certificate.
fn check_leaf_extensions(leaf: &Certificate) -> Result<(), EkCertError> {
    let exts = read_extensions(leaf)?;
    if let Some((eku, true)) = &exts.extended_key_usage
        && !eku
            .0
            .iter()
            .any(|p| *p == TCG_KP_EK_CERTIFICATE || *p == ANY_EXTENDED_KEY_USAGE)
    {
        let purposes: Vec<String> = eku.0.iter().map(extension_name).collect();
        return Err(EkCertError::NotForEk {
            subject: subject(leaf),
            purposes: purposes.join(", "),
        });
    }
    Ok(())
}

/// An issuer must say it is a CA; otherwise any end-entity cert under the root could mint EKs.
/// An intermediate must also allow keyCertSign in a keyUsage (RFC 5280 has CAs include one);
/// a root, which the operator configured, only when it has a keyUsage. Returns the CA's
/// pathLenConstraint.
fn check_ca(c: &Certificate, is_root: bool) -> Result<Option<u8>, EkCertError> {
    let not_ca = |why| EkCertError::NotCa {
        subject: subject(c),
        why,
    };
    let exts = read_extensions(c)?;
    match &exts.key_usage {
        Some(ku) if !ku.key_cert_sign() => return Err(not_ca("keyUsage lacks keyCertSign")),
        None if !is_root => {
            return Err(not_ca(
                "no keyUsage: an intermediate CA must allow keyCertSign",
            ));
        }
        _ => {}
    }
    match exts.basic_constraints {
        Some(bc) if bc.ca => Ok(bc.path_len_constraint),
        _ => Err(not_ca("no basicConstraints with cA true")),
    }
}

/// A self-issued certificate (subject = issuer, a CA's key rollover) does not count against
/// a pathLenConstraint.
fn self_issued(c: &Certificate) -> bool {
    c.tbs_certificate.subject == c.tbs_certificate.issuer
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
    check_leaf_extensions(&leaf)?;
    let mut chain = Vec::new();
    // The CAs on the path so far, nearest the leaf first.
    let mut cas: Vec<&Certificate> = Vec::new();
    let mut cert = &leaf;
    for _ in 0..MAX_DEPTH {
        check_validity(cert, now_unix)?;
        let (issuer, is_root) = find_issuer(cert, &roots, &intermediates)?;
        let path_len = check_ca(issuer, is_root)?;
        let below = cas.iter().filter(|c| !self_issued(c)).count();
        if let Some(path_len) = path_len
            && below > usize::from(path_len)
        {
            return Err(EkCertError::PathLenExceeded {
                subject: subject(issuer),
                path_len,
                below,
            });
        }
        cas.push(issuer);
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

    /// Certificate chains made here, signed with the test CA keys of testdata (RSA-1024, so
    /// that signing is quick in a debug build), for the swtpm EK's key.
    mod generated {
        use super::*;
        use der::EncodePem;
        use der::asn1::{BitString, OctetString, UtcTime};
        use rsa::RsaPrivateKey;
        use rsa::pkcs8::{DecodePrivateKey, EncodePublicKey};
        use std::str::FromStr;
        use std::time::Duration;
        use x509_cert::ext::Extension;
        use x509_cert::ext::pkix::KeyUsages;
        use x509_cert::name::Name;
        use x509_cert::serial_number::SerialNumber;
        use x509_cert::spki::{AlgorithmIdentifierOwned, SubjectPublicKeyInfoOwned};
        use x509_cert::time::{Time, Validity};
        use x509_cert::{TbsCertificate, Version};

        fn key(which: char) -> RsaPrivateKey {
            let pem = match which {
                'a' => include_str!("testdata/test-ca-a-rsa1024.pk8.pem"),
                _ => include_str!("testdata/test-ca-b-rsa1024.pk8.pem"),
            };
            RsaPrivateKey::from_pkcs8_pem(pem).unwrap()
        }

        fn spki_of(key: &RsaPrivateKey) -> SubjectPublicKeyInfoOwned {
            let der = key.to_public_key().to_public_key_der().unwrap();
            SubjectPublicKeyInfoOwned::from_der(der.as_bytes()).unwrap()
        }

        fn ext<T: Encode + AssociatedOid>(critical: bool, value: &T) -> Extension {
            Extension {
                extn_id: T::OID,
                critical,
                extn_value: OctetString::new(value.to_der().unwrap()).unwrap(),
            }
        }

        fn ca_extensions(path_len: Option<u8>) -> Vec<Extension> {
            vec![
                ext(
                    true,
                    &BasicConstraints {
                        ca: true,
                        path_len_constraint: path_len,
                    },
                ),
                ext(true, &KeyUsage(KeyUsages::KeyCertSign | KeyUsages::CRLSign)),
            ]
        }

        /// `subject` with key `spki`, issued by `issuer` with `issuer_key`.
        fn cert(
            subject: &str,
            spki: SubjectPublicKeyInfoOwned,
            issuer: &str,
            issuer_key: &RsaPrivateKey,
            extensions: Vec<Extension>,
        ) -> Certificate {
            let alg = AlgorithmIdentifierOwned {
                oid: RSA_SHA256,
                parameters: Some(der::Any::null()),
            };
            let time =
                |t| Time::UtcTime(UtcTime::from_unix_duration(Duration::from_secs(t)).unwrap());
            let tbs = TbsCertificate {
                version: Version::V3,
                serial_number: SerialNumber::new(&[7]).unwrap(),
                signature: alg.clone(),
                issuer: Name::from_str(issuer).unwrap(),
                validity: Validity {
                    not_before: time(NOW - 86_400),
                    not_after: time(NOW + 86_400),
                },
                subject: Name::from_str(subject).unwrap(),
                subject_public_key_info: spki,
                issuer_unique_id: None,
                subject_unique_id: None,
                extensions: Some(extensions),
            };
            let digest = Sha256::digest(tbs.to_der().unwrap());
            let sig = issuer_key
                .sign(Pkcs1v15Sign::new::<Sha256>(), &digest)
                .unwrap();
            Certificate {
                tbs_certificate: tbs,
                signature_algorithm: alg,
                signature: BitString::from_bytes(&sig).unwrap(),
            }
        }

        /// A self-signed root.
        fn root(name: &str, key: &RsaPrivateKey, extensions: Vec<Extension>) -> Certificate {
            cert(name, spki_of(key), name, key, extensions)
        }

        /// The swtpm EK certificate's own extensions (critical subjectAltName with the TPM's
        /// manufacturer, model and version, critical basicConstraints CA:FALSE, critical
        /// keyUsage keyEncipherment, the EK extendedKeyUsage, subjectDirectoryAttributes,
        /// authorityKeyIdentifier): what a real EK certificate carries.
        fn ek_extensions() -> Vec<Extension> {
            decode_leaf(LEAF)
                .unwrap()
                .tbs_certificate
                .extensions
                .unwrap()
        }

        fn leaf(issuer: &str, issuer_key: &RsaPrivateKey, extensions: Vec<Extension>) -> Vec<u8> {
            let spki = decode_leaf(LEAF)
                .unwrap()
                .tbs_certificate
                .subject_public_key_info;
            cert("CN=unknown", spki, issuer, issuer_key, extensions)
                .to_der()
                .unwrap()
        }

        fn pem(certs: &[&Certificate]) -> Vec<u8> {
            certs
                .iter()
                .map(|c| c.to_pem(der::pem::LineEnding::LF).unwrap())
                .collect::<String>()
                .into_bytes()
        }

        /// Root `CN=Root` (key a) over `CN=Int1` (key b) over `CN=Int2` (key a) over the EK,
        /// with the pathLenConstraints given; `two` false leaves `CN=Int2` out.
        fn chain(
            root_len: Option<u8>,
            int1_len: Option<u8>,
            two: bool,
        ) -> Result<EkCertificate, EkCertError> {
            let (a, b) = (key('a'), key('b'));
            let root = root("CN=Root", &a, ca_extensions(root_len));
            let int1 = cert(
                "CN=Int1",
                spki_of(&b),
                "CN=Root",
                &a,
                ca_extensions(int1_len),
            );
            let int2 = cert("CN=Int2", spki_of(&a), "CN=Int1", &b, ca_extensions(None));
            let (leaf, intermediates) = if two {
                (leaf("CN=Int2", &a, ek_extensions()), pem(&[&int1, &int2]))
            } else {
                (leaf("CN=Int1", &b, ek_extensions()), pem(&[&int1]))
            };
            verify_ek_certificate(&leaf, &swtpm_ek(), &pem(&[&root]), &intermediates, NOW)
        }

        #[test]
        fn tpm_ek_chain_path_length_constraints() {
            let got = chain(None, None, true).unwrap();
            assert_eq!(got.chain, vec!["CN=Int2", "CN=Int1", "CN=Root"]);
            chain(Some(2), Some(1), true).unwrap();
            chain(Some(1), Some(0), false).unwrap();
            assert_eq!(
                chain(Some(0), None, false),
                Err(EkCertError::PathLenExceeded {
                    subject: "CN=Root".into(),
                    path_len: 0,
                    below: 1
                })
            );
            assert_eq!(
                chain(Some(1), None, true),
                Err(EkCertError::PathLenExceeded {
                    subject: "CN=Root".into(),
                    path_len: 1,
                    below: 2
                })
            );
            let e = chain(None, Some(0), true).unwrap_err();
            assert_eq!(
                e.to_string(),
                "CA certificate CN=Int1 allows 0 intermediate CA(s) below it (basicConstraints pathLenConstraint), but the chain has 1"
            );
            // A root with pathLen 0 may sign the EK certificate itself.
            let a = key('a');
            let root = root("CN=Root", &a, ca_extensions(Some(0)));
            let leaf = leaf("CN=Root", &a, ek_extensions());
            verify_ek_certificate(&leaf, &swtpm_ek(), &pem(&[&root]), b"", NOW).unwrap();
        }

        /// A self-issued intermediate (the root's name, another key: a key rollover) does not
        /// count against the root's pathLenConstraint.
        #[test]
        fn tpm_ek_chain_self_issued_intermediates_do_not_count() {
            let (a, b) = (key('a'), key('b'));
            let root = root("CN=Root", &a, ca_extensions(Some(0)));
            let rollover = cert("CN=Root", spki_of(&b), "CN=Root", &a, ca_extensions(None));
            let leaf = leaf("CN=Root", &b, ek_extensions());
            let got =
                verify_ek_certificate(&leaf, &swtpm_ek(), &pem(&[&root]), &pem(&[&rollover]), NOW)
                    .unwrap();
            assert_eq!(got.chain, vec!["CN=Root", "CN=Root"]);
        }

        #[test]
        fn tpm_ek_chain_intermediates_must_allow_key_cert_sign() {
            let (a, b) = (key('a'), key('b'));
            let bc_only = vec![ext(
                true,
                &BasicConstraints {
                    ca: true,
                    path_len_constraint: None,
                },
            )];
            // A root without keyUsage is accepted (the operator configured it) ...
            let root = root("CN=Root", &a, bc_only.clone());
            let int1 = cert("CN=Int1", spki_of(&b), "CN=Root", &a, ca_extensions(None));
            let leaf1 = leaf("CN=Int1", &b, ek_extensions());
            verify_ek_certificate(&leaf1, &swtpm_ek(), &pem(&[&root]), &pem(&[&int1]), NOW)
                .unwrap();
            // ... an intermediate without one is not.
            let int1 = cert("CN=Int1", spki_of(&b), "CN=Root", &a, bc_only);
            let e = verify_ek_certificate(&leaf1, &swtpm_ek(), &pem(&[&root]), &pem(&[&int1]), NOW)
                .unwrap_err();
            assert_eq!(
                e.to_string(),
                "certificate CN=Int1 issues certificates but is not a CA: no keyUsage: an intermediate CA must allow keyCertSign"
            );
            // An intermediate whose keyUsage lacks keyCertSign, and one that is not a CA.
            let mut no_sign = ca_extensions(None);
            no_sign[1] = ext(true, &KeyUsage(KeyUsages::DigitalSignature.into()));
            let int1 = cert("CN=Int1", spki_of(&b), "CN=Root", &a, no_sign);
            let e = verify_ek_certificate(&leaf1, &swtpm_ek(), &pem(&[&root]), &pem(&[&int1]), NOW);
            assert!(
                matches!(
                    e,
                    Err(EkCertError::NotCa {
                        why: "keyUsage lacks keyCertSign",
                        ..
                    })
                ),
                "{e:?}"
            );
            let mut not_ca = ca_extensions(None);
            not_ca[0] = ext(
                true,
                &BasicConstraints {
                    ca: false,
                    path_len_constraint: None,
                },
            );
            let int1 = cert("CN=Int1", spki_of(&b), "CN=Root", &a, not_ca);
            let e = verify_ek_certificate(&leaf1, &swtpm_ek(), &pem(&[&root]), &pem(&[&int1]), NOW);
            assert!(
                matches!(
                    e,
                    Err(EkCertError::NotCa {
                        why: "no basicConstraints with cA true",
                        ..
                    })
                ),
                "{e:?}"
            );
        }

        #[test]
        fn tpm_ek_chain_refuses_critical_extensions_it_does_not_understand() {
            let a = key('a');
            let root_pem = pem(&[&root("CN=Root", &a, ca_extensions(None))]);
            let verify = |leaf: &[u8], intermediates: &[u8]| {
                verify_ek_certificate(leaf, &swtpm_ek(), &root_pem, intermediates, NOW)
            };
            // The EK certificate's own critical extensions are understood.
            verify(&leaf("CN=Root", &a, ek_extensions()), b"").unwrap();
            // An unknown critical extension on the EK certificate, named by its OID.
            let mut exts = ek_extensions();
            exts.push(Extension {
                extn_id: ObjectIdentifier::new_unwrap("1.3.6.1.4.1.99999.1"),
                critical: true,
                extn_value: OctetString::new(vec![0x05, 0x00]).unwrap(),
            });
            assert_eq!(
                verify(&leaf("CN=Root", &a, exts.clone()), b"")
                    .unwrap_err()
                    .to_string(),
                "certificate CN=unknown carries critical extension 1.3.6.1.4.1.99999.1, which this verifier does not process"
            );
            // The same extension, not critical, is ignored.
            if let Some(last) = exts.last_mut() {
                last.critical = false;
            }
            verify(&leaf("CN=Root", &a, exts), b"").unwrap();
            // nameConstraints on an intermediate (critical, as RFC 5280 has it) are not
            // enforced here, so the intermediate is refused.
            let b = key('b');
            let mut int_exts = ca_extensions(None);
            int_exts.push(Extension {
                extn_id: NAME_CONSTRAINTS,
                critical: true,
                // NameConstraints { permittedSubtrees [0] { dNSName "example.com" } }
                extn_value: OctetString::new(
                    [
                        &[0x30, 0x11, 0xa0, 0x0f, 0x30, 0x0d, 0x82, 0x0b][..],
                        b"example.com",
                    ]
                    .concat(),
                )
                .unwrap(),
            });
            let int1 = cert("CN=Int1", spki_of(&b), "CN=Root", &a, int_exts);
            let e = verify(&leaf("CN=Int1", &b, ek_extensions()), &pem(&[&int1])).unwrap_err();
            assert_eq!(
                e,
                EkCertError::UnknownCriticalExtension {
                    subject: "CN=Int1".into(),
                    oid: "nameConstraints (2.5.29.30)".into()
                }
            );
            // An extension twice.
            let mut exts = ek_extensions();
            exts.push(ext(false, &KeyUsage(KeyUsages::DigitalSignature.into())));
            let e = verify(&leaf("CN=Root", &a, exts), b"").unwrap_err();
            assert_eq!(
                e.to_string(),
                "certificate CN=unknown carries extension keyUsage (2.5.29.15) more than once"
            );
        }

        #[test]
        fn tpm_ek_chain_a_critical_extended_key_usage_must_allow_an_ek() {
            let a = key('a');
            let root_pem = pem(&[&root("CN=Root", &a, ca_extensions(None))]);
            let with_eku = |purposes: Vec<ObjectIdentifier>, critical: bool| {
                let mut exts: Vec<Extension> = ek_extensions()
                    .into_iter()
                    .filter(|e| e.extn_id != EXTENDED_KEY_USAGE)
                    .collect();
                exts.push(ext(critical, &ExtendedKeyUsage(purposes)));
                verify_ek_certificate(&leaf("CN=Root", &a, exts), &swtpm_ek(), &root_pem, b"", NOW)
            };
            let server_auth = ObjectIdentifier::new_unwrap("1.3.6.1.5.5.7.3.1");
            with_eku(vec![TCG_KP_EK_CERTIFICATE], true).unwrap();
            with_eku(vec![server_auth, ANY_EXTENDED_KEY_USAGE], true).unwrap();
            with_eku(vec![server_auth], false).unwrap();
            assert_eq!(
                with_eku(vec![server_auth], true).unwrap_err().to_string(),
                "EK certificate CN=unknown has a critical extendedKeyUsage without tcg-kp-EKCertificate (2.23.133.8.1): 1.3.6.1.5.5.7.3.1"
            );
        }
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
