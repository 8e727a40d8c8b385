//! TPMT_PUBLIC of the two keys we enrol: the attestation key (ECC P-256, ECDSA-SHA256,
//! restricted signing) and the endorsement key (RSA-2048, restricted decryption). The parsers
//! check the attributes that make the key what the verifier assumes it is; every one of them is
//! bound by the key's Name, which ActivateCredential proves the EK's TPM holds.

use p256::ecdsa::VerifyingKey;
use rsa::{BigUint, RsaPublicKey, traits::PublicKeyParts};

use super::error::TpmError;
use super::kdf::HashAlg;
use super::marshal::Reader;

pub const TPM_ALG_RSA: u16 = 0x0001;
pub const TPM_ALG_AES: u16 = 0x0006;
pub const TPM_ALG_SHA256: u16 = 0x000b;
pub const TPM_ALG_NULL: u16 = 0x0010;
pub const TPM_ALG_ECDSA: u16 = 0x0018;
pub const TPM_ALG_ECC: u16 = 0x0023;
pub const TPM_ALG_CFB: u16 = 0x0043;
pub const TPM_ECC_NIST_P256: u16 = 0x0003;

/// TPMA_OBJECT bits (Part 2 §8.3).
pub mod attr {
    pub const FIXED_TPM: u32 = 1 << 1;
    pub const FIXED_PARENT: u32 = 1 << 4;
    pub const SENSITIVE_DATA_ORIGIN: u32 = 1 << 5;
    pub const USER_WITH_AUTH: u32 = 1 << 6;
    pub const ADMIN_WITH_POLICY: u32 = 1 << 7;
    pub const RESTRICTED: u32 = 1 << 16;
    pub const DECRYPT: u32 = 1 << 17;
    pub const SIGN: u32 = 1 << 18;
}

/// Attributes tss-esapi's `create_ak` sets (0x00050072).
pub const AK_ATTRIBUTES: u32 = attr::FIXED_TPM
    | attr::FIXED_PARENT
    | attr::SENSITIVE_DATA_ORIGIN
    | attr::USER_WITH_AUTH
    | attr::RESTRICTED
    | attr::SIGN;

/// Attributes of the TCG default RSA-2048 EK template L-1 (0x000300b2).
pub const EK_ATTRIBUTES: u32 = attr::FIXED_TPM
    | attr::FIXED_PARENT
    | attr::SENSITIVE_DATA_ORIGIN
    | attr::ADMIN_WITH_POLICY
    | attr::RESTRICTED
    | attr::DECRYPT;

/// authPolicy of template L-1: PolicySecret(TPM_RH_ENDORSEMENT).
pub const EK_L1_POLICY: [u8; 32] = [
    0x83, 0x71, 0x97, 0x67, 0x44, 0x84, 0xb3, 0xf8, 0x1a, 0x90, 0xcc, 0x8d, 0x46, 0xa5, 0xd7, 0x24,
    0xfd, 0x52, 0xd7, 0x6e, 0x06, 0x52, 0x0b, 0x64, 0xf2, 0xa1, 0xda, 0x1b, 0x33, 0x14, 0x69, 0xaa,
];

/// Name(object) = nameAlg || H_nameAlg(TPMT_PUBLIC) (Part 1 §16).
fn object_name(alg: HashAlg, tpmt_public: &[u8]) -> Vec<u8> {
    let mut name = alg.id().to_be_bytes().to_vec();
    name.extend(alg.digest(&[tpmt_public]));
    name
}

/// The header every TPMT_PUBLIC starts with; the offsets are for error messages.
struct Header {
    name_alg: u16,
    name_alg_offset: usize,
    attributes: u32,
    attributes_offset: usize,
}

/// Reads type (which must be `want_type`), nameAlg, objectAttributes and authPolicy.
fn read_header(r: &mut Reader<'_>, want_type: u16) -> Result<Header, TpmError> {
    r.expect_u16("type", want_type)?;
    let name_alg_offset = r.offset();
    let name_alg = r.u16("nameAlg")?;
    let attributes_offset = r.offset();
    let attributes = r.u32("objectAttributes")?;
    r.tpm2b("authPolicy")?;
    Ok(Header {
        name_alg,
        name_alg_offset,
        attributes,
        attributes_offset,
    })
}

/// Checks that `must` bits are set and `must_not` bits clear, naming the first bad bit.
fn check_attributes(
    r: &Reader<'_>,
    h: &Header,
    must: &[(u32, &str)],
    must_not: &[(u32, &str)],
) -> Result<(), TpmError> {
    let bad = |name: &str, state: &str| {
        r.invalid(
            "objectAttributes",
            h.attributes_offset,
            format!("{:#010x}: {name} {state}", h.attributes),
        )
    };
    for (bit, name) in must {
        if h.attributes & bit == 0 {
            return Err(bad(name, "clear, want set"));
        }
    }
    for (bit, name) in must_not {
        if h.attributes & bit != 0 {
            return Err(bad(name, "set, want clear"));
        }
    }
    Ok(())
}

/// A TPM2B_ECC_PARAMETER of at most 32 bytes, left-padded to 32 (a TPM pads to the curve size,
/// but the format allows the short form).
fn read_coordinate(r: &mut Reader<'_>, field: &'static str) -> Result<[u8; 32], TpmError> {
    let offset = r.offset();
    let v = r.tpm2b(field)?;
    if v.len() > 32 {
        return Err(r.invalid(field, offset, format!("{} bytes, want at most 32", v.len())));
    }
    let mut out = [0u8; 32];
    out[32 - v.len()..].copy_from_slice(v);
    Ok(out)
}

/// The attestation key: ECC P-256, ECDSA-SHA256, restricted signing, nameAlg SHA-256.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AkPublic {
    bytes: Vec<u8>,
    key: VerifyingKey,
}

impl AkPublic {
    pub fn parse(tpmt_public: &[u8]) -> Result<AkPublic, TpmError> {
        let mut r = Reader::new("AK TPMT_PUBLIC", tpmt_public);
        let h = read_header(&mut r, TPM_ALG_ECC)?;
        if h.name_alg != TPM_ALG_SHA256 {
            let want = TPM_ALG_SHA256.into();
            return Err(r.unexpected("nameAlg", h.name_alg_offset, h.name_alg.into(), want));
        }
        check_attributes(
            &r,
            &h,
            &[
                (attr::FIXED_TPM, "fixedTPM (bit 1)"),
                (attr::FIXED_PARENT, "fixedParent (bit 4)"),
                (attr::SENSITIVE_DATA_ORIGIN, "sensitiveDataOrigin (bit 5)"),
                (attr::RESTRICTED, "restricted (bit 16)"),
                (attr::SIGN, "sign (bit 18)"),
            ],
            &[(attr::DECRYPT, "decrypt (bit 17)")],
        )?;
        // A signing key has no symmetric cipher; its scheme is fixed to ECDSA-SHA256 so the
        // TPM cannot be asked to sign a quote with another hash.
        r.expect_u16("symmetric.algorithm", TPM_ALG_NULL)?;
        r.expect_u16("scheme.scheme", TPM_ALG_ECDSA)?;
        r.expect_u16("scheme.hashAlg", TPM_ALG_SHA256)?;
        r.expect_u16("curveID", TPM_ECC_NIST_P256)?;
        r.expect_u16("kdf.scheme", TPM_ALG_NULL)?;
        let point_offset = r.offset();
        let x = read_coordinate(&mut r, "unique.x")?;
        let y = read_coordinate(&mut r, "unique.y")?;
        let mut sec1 = vec![0x04];
        sec1.extend(x);
        sec1.extend(y);
        let key = VerifyingKey::from_sec1_bytes(&sec1)
            .map_err(|_| r.invalid("unique", point_offset, "not a point on P-256".to_string()))?;
        r.finish()?;
        Ok(AkPublic {
            bytes: tpmt_public.to_vec(),
            key,
        })
    }

    /// Marshals the TPMT_PUBLIC tss-esapi's `create_ak` makes for `key` (attributes
    /// [`AK_ATTRIBUTES`], empty authPolicy). For tests and fixtures: a real AK comes from a TPM.
    pub fn from_verifying_key(key: &VerifyingKey) -> AkPublic {
        let point = key.to_encoded_point(false);
        let mut b = Vec::with_capacity(88);
        b.extend(TPM_ALG_ECC.to_be_bytes());
        b.extend(TPM_ALG_SHA256.to_be_bytes());
        b.extend(AK_ATTRIBUTES.to_be_bytes());
        b.extend(0u16.to_be_bytes());
        for v in [
            TPM_ALG_NULL,
            TPM_ALG_ECDSA,
            TPM_ALG_SHA256,
            TPM_ECC_NIST_P256,
            TPM_ALG_NULL,
        ] {
            b.extend(v.to_be_bytes());
        }
        for c in [point.x(), point.y()].into_iter().flatten() {
            b.extend(32u16.to_be_bytes());
            b.extend(c.as_slice());
        }
        AkPublic {
            bytes: b,
            key: *key,
        }
    }

    /// Name(AK) = 0x000b || SHA-256(TPMT_PUBLIC), 34 bytes.
    pub fn name(&self) -> Vec<u8> {
        object_name(HashAlg::Sha256, &self.bytes)
    }

    pub fn verifying_key(&self) -> &VerifyingKey {
        &self.key
    }

    /// The TPMT_PUBLIC bytes as parsed.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

/// The endorsement key: RSA-2048 restricted decryption key with an AES-CFB symmetric
/// definition (template L-1 or H-1 of the TCG EK Credential Profile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EkPublic {
    bytes: Vec<u8>,
    name_alg: HashAlg,
    attributes: u32,
    sym_key_bits: u16,
    key: RsaPublicKey,
    modulus: Vec<u8>,
}

impl EkPublic {
    pub fn parse(tpmt_public: &[u8]) -> Result<EkPublic, TpmError> {
        let mut r = Reader::new("EK TPMT_PUBLIC", tpmt_public);
        if tpmt_public.get(..2) == Some(&TPM_ALG_ECC.to_be_bytes()[..]) {
            return Err(TpmError::UnsupportedEccEk);
        }
        let h = read_header(&mut r, TPM_ALG_RSA)?;
        let name_alg = match HashAlg::from_id(h.name_alg) {
            // SHA-1 names are collidable; no TCG EK template uses them.
            Ok(HashAlg::Sha1) | Err(_) => {
                let why = format!("{:#06x}, want SHA-256, SHA-384 or SHA-512", h.name_alg);
                return Err(r.invalid("nameAlg", h.name_alg_offset, why));
            }
            Ok(alg) => alg,
        };
        check_attributes(
            &r,
            &h,
            &[
                (attr::FIXED_TPM, "fixedTPM (bit 1)"),
                (attr::FIXED_PARENT, "fixedParent (bit 4)"),
                (attr::RESTRICTED, "restricted (bit 16)"),
                (attr::DECRYPT, "decrypt (bit 17)"),
            ],
            &[(attr::SIGN, "sign (bit 18)")],
        )?;
        r.expect_u16("symmetric.algorithm", TPM_ALG_AES)?;
        let bits_offset = r.offset();
        let sym_key_bits = r.u16("symmetric.keyBits")?;
        if sym_key_bits != 128 && sym_key_bits != 256 {
            let why = format!("{sym_key_bits}, want 128 or 256");
            return Err(r.invalid("symmetric.keyBits", bits_offset, why));
        }
        r.expect_u16("symmetric.mode", TPM_ALG_CFB)?;
        r.expect_u16("scheme.scheme", TPM_ALG_NULL)?;
        r.expect_u16("keyBits", 2048)?;
        let exponent = match r.u32("exponent")? {
            0 => 65537,
            e => e,
        };
        let unique_offset = r.offset();
        let modulus = r.tpm2b("unique")?;
        if modulus.len() != 256 {
            let why = format!("{} bytes, want 256 (RSA-2048)", modulus.len());
            return Err(r.invalid("unique", unique_offset, why));
        }
        let key = RsaPublicKey::new(BigUint::from_bytes_be(modulus), BigUint::from(exponent))
            .map_err(|e| r.invalid("unique", unique_offset, format!("not an RSA key: {e}")))?;
        let modulus = modulus.to_vec();
        r.finish()?;
        Ok(EkPublic {
            bytes: tpmt_public.to_vec(),
            name_alg,
            attributes: h.attributes,
            sym_key_bits,
            key,
            modulus,
        })
    }

    /// Marshals template L-1 (RSA-2048, SHA-256, AES-128-CFB, policy [`EK_L1_POLICY`]) with
    /// `modulus`, the TPMT_PUBLIC a TPM gives for its default RSA EK. For tests and fixtures.
    pub fn from_modulus(modulus: &[u8]) -> Result<EkPublic, TpmError> {
        let mut b = Vec::with_capacity(314);
        b.extend(TPM_ALG_RSA.to_be_bytes());
        b.extend(TPM_ALG_SHA256.to_be_bytes());
        b.extend(EK_ATTRIBUTES.to_be_bytes());
        b.extend(32u16.to_be_bytes());
        b.extend(EK_L1_POLICY);
        for v in [TPM_ALG_AES, 128, TPM_ALG_CFB, TPM_ALG_NULL, 2048] {
            b.extend(v.to_be_bytes());
        }
        b.extend(0u32.to_be_bytes());
        let len = u16::try_from(modulus.len()).unwrap_or(u16::MAX);
        b.extend(len.to_be_bytes());
        b.extend(modulus);
        EkPublic::parse(&b)
    }

    /// Name(EK) = nameAlg || H_nameAlg(TPMT_PUBLIC).
    pub fn name(&self) -> Vec<u8> {
        object_name(self.name_alg, &self.bytes)
    }

    /// The RSA modulus (`unique`), 256 bytes big-endian.
    pub fn modulus(&self) -> &[u8] {
        &self.modulus
    }

    /// The EK's nameAlg: the hash of MakeCredential's KDFs, OAEP and integrity HMAC.
    pub fn name_alg(&self) -> HashAlg {
        self.name_alg
    }

    /// AES key size of the EK's symmetric definition (128 or 256): the size of the key
    /// MakeCredential derives to encrypt the credential.
    pub fn sym_key_bits(&self) -> u16 {
        self.sym_key_bits
    }

    pub fn attributes(&self) -> u32 {
        self.attributes
    }

    pub fn public_key(&self) -> &RsaPublicKey {
        &self.key
    }

    /// The public exponent (65537 when the TPMT_PUBLIC says 0).
    pub fn exponent(&self) -> u32 {
        // The key was built from a u32, so it fits.
        self.key
            .e()
            .to_bytes_be()
            .iter()
            .fold(0u32, |acc, b| (acc << 8) | u32::from(*b))
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use p256::ecdsa::SigningKey;

    fn ak_bytes() -> Vec<u8> {
        let sk = SigningKey::from_slice(&[7u8; 32]).unwrap();
        AkPublic::from_verifying_key(sk.verifying_key())
            .bytes()
            .to_vec()
    }

    pub(crate) fn swtpm_ek() -> EkPublic {
        let hex = include_str!("testdata/swtpm-ek-rsa2048.modulus.hex").trim();
        EkPublic::from_modulus(&hex::decode(hex).unwrap()).unwrap()
    }

    #[test]
    fn tpm_ak_parses_and_names() {
        let b = ak_bytes();
        assert_eq!(b.len(), 88);
        assert_eq!(&b[..8], &[0x00, 0x23, 0x00, 0x0b, 0x00, 0x05, 0x00, 0x72]);
        let ak = AkPublic::parse(&b).unwrap();
        let name = ak.name();
        assert_eq!(name.len(), 34);
        assert_eq!(&name[..2], &[0x00, 0x0b]);
        assert_eq!(&name[2..], HashAlg::Sha256.digest(&[&b]).as_slice());
        assert_eq!(ak.bytes(), b.as_slice());
    }

    #[test]
    fn tpm_ak_rejects_each_bad_field_with_its_offset() {
        let b = ak_bytes();
        let cases: &[(usize, &[u8], &str)] = &[
            (
                0,
                &[0x00, 0x01],
                "AK TPMT_PUBLIC: type 0x1 at byte 0, want 0x23",
            ),
            (
                2,
                &[0x00, 0x04],
                "AK TPMT_PUBLIC: nameAlg 0x4 at byte 2, want 0xb",
            ),
            (
                4,
                &[0x00, 0x07, 0x00, 0x72],
                "AK TPMT_PUBLIC: objectAttributes at byte 4: 0x00070072: decrypt (bit 17) set, want clear",
            ),
            (
                4,
                &[0x00, 0x04, 0x00, 0x72],
                "AK TPMT_PUBLIC: objectAttributes at byte 4: 0x00040072: restricted (bit 16) clear, want set",
            ),
            (
                10,
                &[0x00, 0x06],
                "AK TPMT_PUBLIC: symmetric.algorithm 0x6 at byte 10, want 0x10",
            ),
            (
                14,
                &[0x00, 0x0c],
                "AK TPMT_PUBLIC: scheme.hashAlg 0xc at byte 14, want 0xb",
            ),
            (
                16,
                &[0x00, 0x04],
                "AK TPMT_PUBLIC: curveID 0x4 at byte 16, want 0x3",
            ),
            (
                20,
                &[0x00, 0x21],
                "AK TPMT_PUBLIC: unique.x at byte 20: 33 bytes, want at most 32",
            ),
        ];
        for (at, patch, want) in cases {
            let mut bad = b.clone();
            bad[*at..at + patch.len()].copy_from_slice(patch);
            assert_eq!(AkPublic::parse(&bad).unwrap_err().to_string(), *want);
        }
        let e = AkPublic::parse(&b[..50]).unwrap_err().to_string();
        assert_eq!(
            e,
            "AK TPMT_PUBLIC: unique.x needs 32 bytes at byte 22, only 28 left"
        );
        let mut long = b.clone();
        long.push(0);
        let e = AkPublic::parse(&long).unwrap_err().to_string();
        assert_eq!(
            e,
            "AK TPMT_PUBLIC: 1 trailing bytes at byte 88, want the structure to end there"
        );
        let mut off_curve = b.clone();
        off_curve[87] ^= 1;
        let e = AkPublic::parse(&off_curve).unwrap_err().to_string();
        assert_eq!(e, "AK TPMT_PUBLIC: unique at byte 20: not a point on P-256");
    }

    #[test]
    fn tpm_ek_parses_the_l1_template() {
        let ek = swtpm_ek();
        let b = ek.bytes();
        assert_eq!(b.len(), 314);
        assert_eq!(hex::encode(&b[..8]), "0001000b000300b2");
        assert_eq!(ek.name_alg(), HashAlg::Sha256);
        assert_eq!(ek.sym_key_bits(), 128);
        assert_eq!(ek.exponent(), 65537);
        assert_eq!(ek.modulus().len(), 256);
        assert_eq!(ek.name().len(), 34);
        assert_eq!(EkPublic::parse(b).unwrap(), ek);
    }

    #[test]
    fn tpm_ek_rejects_each_bad_field_with_its_offset() {
        let b = swtpm_ek().bytes().to_vec();
        let cases: &[(usize, &[u8], &str)] = &[
            (
                0,
                &[0x00, 0x23],
                "unsupported EK type ECC (0x0023): only RSA-2048 EKs are enrolled",
            ),
            (
                2,
                &[0x00, 0x04],
                "EK TPMT_PUBLIC: nameAlg at byte 2: 0x0004, want SHA-256, SHA-384 or SHA-512",
            ),
            (
                4,
                &[0x00, 0x07, 0x00, 0xb2],
                "EK TPMT_PUBLIC: objectAttributes at byte 4: 0x000700b2: sign (bit 18) set, want clear",
            ),
            (
                42,
                &[0x00, 0x10],
                "EK TPMT_PUBLIC: symmetric.algorithm 0x10 at byte 42, want 0x6",
            ),
            (
                44,
                &[0x00, 0xc0],
                "EK TPMT_PUBLIC: symmetric.keyBits at byte 44: 192, want 128 or 256",
            ),
            (
                50,
                &[0x0c, 0x00],
                "EK TPMT_PUBLIC: keyBits 0xc00 at byte 50, want 0x800",
            ),
            (
                56,
                &[0x00, 0x80],
                "EK TPMT_PUBLIC: unique at byte 56: 128 bytes, want 256 (RSA-2048)",
            ),
        ];
        for (at, patch, want) in cases {
            let mut bad = b.clone();
            bad[*at..at + patch.len()].copy_from_slice(patch);
            assert_eq!(EkPublic::parse(&bad).unwrap_err().to_string(), *want);
        }
        let e = EkPublic::parse(&b[..100]).unwrap_err().to_string();
        assert_eq!(
            e,
            "EK TPMT_PUBLIC: unique needs 256 bytes at byte 58, only 42 left"
        );
    }
}
