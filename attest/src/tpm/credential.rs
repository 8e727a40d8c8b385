//! TPM2_MakeCredential in software (TPM 2.0 Part 1 §24, ms-tpm-20-ref `CryptSecretEncrypt` and
//! `ComputeProtectionKeyParms`): the verifier wraps a secret so that only the TPM holding the EK
//! can unwrap it, and only for an object with the AK's Name. A host that returns the secret has
//! proven the AK lives in the same TPM as the certified EK.

use aes::{Aes128, Aes256};
use cfb_mode::Encryptor;
use cfb_mode::cipher::{AsyncStreamCipher, KeyIvInit};
use rand_core::{CryptoRngCore, OsRng, RngCore};
use rsa::Oaep;

use super::error::TpmError;
use super::kdf::{HashAlg, kdfa, with_hash};
use super::public::EkPublic;

/// The two blobs TPM2_ActivateCredential takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CredentialChallenge {
    /// TPM2B_ID_OBJECT without its outer u16 size: `u16 hmacSize || integrityHMAC ||
    /// encIdentity`, what tss-esapi's `IdObject::try_from(Vec<u8>)` takes.
    pub id_object: Vec<u8>,
    /// TPM2B_ENCRYPTED_SECRET without its size: the RSA-OAEP ciphertext of the seed, what
    /// `EncryptedSecret::try_from(Vec<u8>)` takes.
    pub encrypted_secret: Vec<u8>,
}

/// OAEP label of a credential seed: "IDENTITY" with its NUL (Part 1 §24.4).
const IDENTITY_LABEL: &str = "IDENTITY\0";

/// Wraps `credential` (at most the EK nameAlg's digest size; use 32 random bytes) for the
/// object named `ak_name` (Name(AK), 34 bytes for a SHA-256 name) under the RSA EK `ek`.
/// The KDFs, OAEP and the HMAC use the EK's nameAlg, and the symmetric key the EK's AES size,
/// as the TPM does when it unwraps (the protector's parameters, not the AK's).
pub fn make_credential(
    ek: &EkPublic,
    ak_name: &[u8],
    credential: &[u8],
) -> Result<CredentialChallenge, TpmError> {
    // The seed is the nameAlg's digest size, as CryptSecretEncrypt makes it.
    let mut seed = vec![0u8; ek.name_alg().size()];
    OsRng.fill_bytes(&mut seed);
    make_credential_with_seed(ek, ak_name, credential, &seed, &mut OsRng)
}

/// [`make_credential`] with the seed and OAEP randomness given, for known-answer tests.
pub(crate) fn make_credential_with_seed(
    ek: &EkPublic,
    ak_name: &[u8],
    credential: &[u8],
    seed: &[u8],
    rng: &mut impl CryptoRngCore,
) -> Result<CredentialChallenge, TpmError> {
    check_name(ak_name)?;
    let h = ek.name_alg();
    if credential.len() > h.size() {
        return Err(TpmError::CredentialTooLong {
            len: credential.len(),
            max: h.size(),
        });
    }
    let encrypted_secret = encrypt_seed(ek, seed, rng)?;
    let id_object = wrap(h, ek.sym_key_bits(), seed, ak_name, credential)?;
    Ok(CredentialChallenge {
        id_object,
        encrypted_secret,
    })
}

/// A Name is a 2-byte hash algorithm then a digest of that algorithm's size.
fn check_name(name: &[u8]) -> Result<(), TpmError> {
    let alg = name
        .get(..2)
        .map(|a| u16::from_be_bytes([a[0], a[1]]))
        .ok_or(TpmError::BadName {
            len: name.len(),
            want: 2,
        })?;
    let want = 2 + HashAlg::from_id(alg)?.size();
    if name.len() != want {
        return Err(TpmError::BadName {
            len: name.len(),
            want,
        });
    }
    Ok(())
}

/// RSA-OAEP(hash = mgf1 hash = EK nameAlg, label "IDENTITY\0") of the seed.
fn encrypt_seed(
    ek: &EkPublic,
    seed: &[u8],
    rng: &mut impl CryptoRngCore,
) -> Result<Vec<u8>, TpmError> {
    with_hash!(ek.name_alg(), D => {
        let padding = Oaep::new_with_label::<D, _>(IDENTITY_LABEL);
        Ok(ek.public_key().encrypt(rng, padding, seed)?)
    })
}

/// The ID object body: `u16 H.len || HMAC_H(hmacKey, encIdentity || name) || encIdentity`,
/// where encIdentity = AES-CFB(symKey, IV 0)(u16 len || credential).
fn wrap(
    h: HashAlg,
    sym_bits: u16,
    seed: &[u8],
    name: &[u8],
    credential: &[u8],
) -> Result<Vec<u8>, TpmError> {
    let sym_key = kdfa(h, seed, b"STORAGE", name, &[], sym_bits.into());
    // The credential is at most 64 bytes (checked by the caller), so its length fits a u16.
    let mut enc_identity = (credential.len() as u16).to_be_bytes().to_vec();
    enc_identity.extend(credential);
    cfb(&sym_key, &mut enc_identity, true)?;
    let hmac_key = kdfa(h, seed, b"INTEGRITY", &[], &[], 8 * h.size() as u32);
    let hmac = h.hmac(&hmac_key, &[&enc_identity, name]);
    let mut out = (h.size() as u16).to_be_bytes().to_vec();
    out.extend(hmac);
    out.extend(enc_identity);
    Ok(out)
}

/// AES-CFB128 with a zero IV over `buf` in place (a stream: no padding), with AES-128 or
/// AES-256 by key size. `encrypt` false decrypts (tests unwrap with it).
fn cfb(key: &[u8], buf: &mut [u8], encrypt: bool) -> Result<(), TpmError> {
    let iv = [0u8; 16];
    let bad = |_| TpmError::SymmetricKey { bytes: key.len() };
    match (key.len(), encrypt) {
        (16, true) => Encryptor::<Aes128>::new_from_slices(key, &iv)
            .map(|c| c.encrypt(buf))
            .map_err(bad),
        (32, true) => Encryptor::<Aes256>::new_from_slices(key, &iv)
            .map(|c| c.encrypt(buf))
            .map_err(bad),
        (16, false) => cfb_mode::Decryptor::<Aes128>::new_from_slices(key, &iv)
            .map(|c| c.decrypt(buf))
            .map_err(bad),
        (32, false) => cfb_mode::Decryptor::<Aes256>::new_from_slices(key, &iv)
            .map(|c| c.decrypt(buf))
            .map_err(bad),
        _ => Err(TpmError::SymmetricKey { bytes: key.len() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tpm::marshal::Reader;
    use crate::tpm::public::EK_ATTRIBUTES;
    use base64::Engine;
    use rand_core::CryptoRng;
    use rsa::pkcs8::DecodePublicKey;
    use rsa::traits::PublicKeyParts;
    use rsa::{BigUint, RsaPrivateKey, RsaPublicKey};

    /// Hands out `bytes`, then zeros: fixes OAEP's randomness to a vector's.
    struct FixedRng(Vec<u8>);
    impl RngCore for FixedRng {
        fn next_u32(&mut self) -> u32 {
            rand_core::impls::next_u32_via_fill(self)
        }
        fn next_u64(&mut self) -> u64 {
            rand_core::impls::next_u64_via_fill(self)
        }
        fn fill_bytes(&mut self, dest: &mut [u8]) {
            for d in dest {
                *d = if self.0.is_empty() {
                    0
                } else {
                    self.0.remove(0)
                };
            }
        }
        fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand_core::Error> {
            self.fill_bytes(dest);
            Ok(())
        }
    }
    impl CryptoRng for FixedRng {}

    /// go-tpm legacy/tpm2/credactivation/credential_activation_test.go @ 9312d3e6
    /// (TestCredentialActivation, RSA case): generate(aikName, rsaEKPub, 16, secret,
    /// zeroReader{}) — a 16-byte zero seed, zero OAEP randomness, SHA-256 and AES-128.
    #[test]
    fn tpm_make_credential_matches_go_tpm_known_answer() {
        let ek_pem = "-----BEGIN PUBLIC KEY-----
MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEArIqmuAvuIcakIEPd2hZl
avob21ehQ7zaHduJQNbNuKVSc1HTlvw9DkWN03b0SktcRIfsjw/omqPl60RhCx0j
qxsYnf5Gk4jhfCnUeQVicAqHnUGrKjMkLIGTZVOpyqBEXHsdhugw6M5HVIKyfwNO
KhvLZKRH8JkvtElVhLQ6E2+H83XoSpkt9oCnGPyN2Z5qRP+fhQiRylMCD8Rz8ABn
YVqGBBrG+2cBt/0uFLjxHx2mm/4sI/1scG5xrcrDLva9WZB40MehW5VlS6Fwqq05
dKtLGpk7ludjH38m2zhM5/UdKZ34skJaS/Aiyj+P5AT1BpJL2ZtjCbBdnMDUSbRF
1QIDAQAB
-----END PUBLIC KEY-----";
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.decode(s).unwrap();
        let expected = b64(
            "AEQAIFjKZAUo3Wmgxu+CqHFzsQZr7BqawtprBmpXpZa77nb5S+iN6IcSPQLCKPZMNuunv7BIb4/VJA/xjMrj8RnQbjspCwEAJcQogjACOfStYTVjmR4p61ZbTTRt7ZNG5nc6iifq+TfnyfoU+E3T6Kount4M8fSUdMWlKx5A24Ms4ndi1VYOA+s4inPusyn1X1ZCHe5tNwT1E9jpVxc0jaUAVad6Q5cOgUyAp4qvc8wmaYXcIa/PzVfa6teF4iXxNqVDAYqpdmbP68v0Hk5gRqCa/tHAdg5avE3C20DP1SSvPitumWROL6mHMooVxjsyjPnHEBLo7y/BKwezEO/15xnBvPOvWs7ARIu1KdER+zrCJX9SMCPbn4cVMfLdrX70xko7XjdhV7pXtAeUeKmmKSYE45m5ZN0h83YgHXGDjf+ynWse10okyA==",
        );
        let rsa = RsaPublicKey::from_public_key_pem(ek_pem).unwrap();
        let ek = EkPublic::from_modulus(&rsa.n().to_bytes_be()).unwrap();
        let mut name = vec![0x00, 0x0b];
        name.extend(b64("5snpf9qRfKD2Tb72eLAZqC/a/MyUhg+IvdwDZkTJK9w="));
        let secret = b64("AQIDBAUGBwgBAgMEBQYHCAECAwQFBgcIAQIDBAUGBwg=");
        let got = make_credential_with_seed(&ek, &name, &secret, &[0; 16], &mut FixedRng(vec![]))
            .unwrap();
        // go-tpm's blob is u16 size || ID object body || u16 size || encrypted secret.
        assert_eq!(&expected[..2], &[0x00, 0x44]);
        assert_eq!(hex::encode(&got.id_object), hex::encode(&expected[2..70]));
        assert_eq!(&expected[70..72], &[0x01, 0x00]);
        assert_eq!(
            hex::encode(&got.encrypted_secret),
            hex::encode(&expected[72..])
        );
    }

    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct EncapsVector {
        name: String,
        public_key: String,
        private_key: String,
        #[serde(rename = "OAEPSalt")]
        oaep_salt: String,
        secret: String,
        ciphertext: String,
    }

    /// An EK-like key from a go-tpm RSA labeled-encapsulation vector (restricted decryption
    /// keys made by the TCG reference implementation), with its attributes set to the EK
    /// template's (the vectors' keys are not fixedTPM), and its private key from the prime p
    /// in the TPMT_SENSITIVE.
    fn encaps_key(v: &EncapsVector) -> (EkPublic, RsaPrivateKey) {
        let mut public = hex::decode(&v.public_key).unwrap();
        public[4..8].copy_from_slice(&EK_ATTRIBUTES.to_be_bytes());
        let ek = EkPublic::parse(&public).unwrap();
        let sensitive = hex::decode(&v.private_key).unwrap();
        let mut r = Reader::new("TPMT_SENSITIVE", &sensitive);
        r.expect_u16("sensitiveType", 0x0001).unwrap();
        r.tpm2b("authValue").unwrap();
        r.tpm2b("seedValue").unwrap();
        let p = BigUint::from_bytes_be(r.tpm2b("sensitive").unwrap());
        r.finish().unwrap();
        let n = BigUint::from_bytes_be(ek.modulus());
        let q = &n / &p;
        let e = BigUint::from(ek.exponent());
        let private = RsaPrivateKey::from_p_q(p, q, e).unwrap();
        assert_eq!(private.to_public_key(), *ek.public_key());
        (ek, private)
    }

    fn encaps_vectors() -> Vec<EncapsVector> {
        let json = include_str!("testdata/go-tpm-rsa-labeled-encaps-identity.json");
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn tpm_seed_encryption_matches_reference_implementation_vectors() {
        for v in encaps_vectors() {
            let (ek, _) = encaps_key(&v);
            let seed = hex::decode(&v.secret).unwrap();
            let mut rng = FixedRng(hex::decode(&v.oaep_salt).unwrap());
            let got = encrypt_seed(&ek, &seed, &mut rng).unwrap();
            assert_eq!(hex::encode(got), v.ciphertext, "vector {}", v.name);
        }
    }

    /// TPM2_ActivateCredential's checks and unwrapping, in software, for the round trip.
    fn activate(
        private: &RsaPrivateKey,
        ek: &EkPublic,
        ak_name: &[u8],
        c: &CredentialChallenge,
    ) -> Result<Vec<u8>, &'static str> {
        let h = ek.name_alg();
        let seed = with_hash!(h, D => private
            .decrypt(Oaep::new_with_label::<D, _>(IDENTITY_LABEL), &c.encrypted_secret)
            .map_err(|_| "OAEP")?);
        let mut r = Reader::new("TPM2B_ID_OBJECT", &c.id_object);
        let hmac = r.tpm2b("integrityHMAC").map_err(|_| "short")?;
        let mut enc_identity = r.take("encIdentity", r.remaining()).unwrap().to_vec();
        let hmac_key = kdfa(h, &seed, b"INTEGRITY", &[], &[], 8 * h.size() as u32);
        if h.hmac(&hmac_key, &[&enc_identity, ak_name]) != hmac {
            return Err("TPM_RC_INTEGRITY");
        }
        let sym_key = kdfa(h, &seed, b"STORAGE", ak_name, &[], ek.sym_key_bits().into());
        cfb(&sym_key, &mut enc_identity, false).unwrap();
        let mut r = Reader::new("TPM2B_DIGEST", &enc_identity);
        let cred = r.tpm2b("credential").map_err(|_| "size")?.to_vec();
        r.finish().map_err(|_| "size")?;
        Ok(cred)
    }

    #[test]
    fn tpm_make_credential_round_trips_through_software_activation() {
        for v in encaps_vectors() {
            let (ek, private) = encaps_key(&v);
            let ak_name = [&[0x00, 0x0b][..], &[0x11; 32]].concat();
            let credential = [0x5c; 32];
            let c = make_credential(&ek, &ak_name, &credential).unwrap();
            let h = ek.name_alg().size();
            assert_eq!(c.encrypted_secret.len(), 256, "vector {}", v.name);
            assert_eq!(c.id_object.len(), 2 + h + 2 + 32, "vector {}", v.name);
            assert_eq!(&c.id_object[..2], &(h as u16).to_be_bytes());
            assert_eq!(activate(&private, &ek, &ak_name, &c).unwrap(), credential);
            // Another AK (another Name) fails the integrity check, as on a TPM.
            let mut other = ak_name.clone();
            other[33] ^= 1;
            assert_eq!(
                activate(&private, &ek, &other, &c),
                Err("TPM_RC_INTEGRITY"),
                "vector {}",
                v.name
            );
        }
    }

    #[test]
    fn tpm_make_credential_binds_the_name_and_checks_inputs() {
        let ek = crate::tpm::public::tests::swtpm_ek();
        let name = [&[0x00, 0x0b][..], &[0x22; 32]].concat();
        let mut other = name.clone();
        other[2] ^= 0x80;
        let seed = [9u8; 32];
        let a = make_credential_with_seed(&ek, &name, &[1; 32], &seed, &mut OsRng).unwrap();
        let b = make_credential_with_seed(&ek, &other, &[1; 32], &seed, &mut OsRng).unwrap();
        assert_eq!(a.id_object.len(), 68);
        assert_ne!(
            a.id_object[2..34],
            b.id_object[2..34],
            "HMAC covers the name"
        );
        assert_ne!(
            a.id_object[34..],
            b.id_object[34..],
            "key derivation uses the name"
        );
        let c = make_credential(&ek, &name, &[1; 32]).unwrap();
        assert_ne!(c.encrypted_secret, a.encrypted_secret, "random seed");
        assert_eq!(
            make_credential(&ek, &name, &[1; 33]).unwrap_err(),
            TpmError::CredentialTooLong { len: 33, max: 32 }
        );
        assert_eq!(
            make_credential(&ek, &name[..33], &[1; 32]).unwrap_err(),
            TpmError::BadName { len: 33, want: 34 }
        );
        assert_eq!(
            make_credential(&ek, &[0x00, 0x0e, 1], &[1; 32]).unwrap_err(),
            TpmError::UnsupportedHash(0x000e)
        );
    }
}
