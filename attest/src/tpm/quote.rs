//! TPM2_Quote: the TPMS_ATTEST a TPM signs, its TPMT_SIGNATURE, and the verifier's check that a
//! quote binds the expected nonce (extraData) and the shipped PCR values to the enrolled AK.

use p256::ecdsa::Signature;
use p256::ecdsa::signature::Verifier;
use thiserror::Error;

use super::error::TpmError;
use super::marshal::Reader;
use super::pcr::{MissingPcr, PcrSelection, PcrValues};
use super::public::{AkPublic, TPM_ALG_ECDSA, TPM_ALG_SHA256};

/// TPM_GENERATED_VALUE: only the TPM signs structures starting with it (a restricted key
/// refuses to sign external data that does), which is what makes a quote a quote.
pub const TPM_GENERATED_VALUE: u32 = 0xff54_4347;
/// TPM_ST_ATTEST_QUOTE.
pub const TPM_ST_ATTEST_QUOTE: u16 = 0x8018;

/// The fields of a quote's TPMS_ATTEST.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuoteInfo {
    /// The AK's qualified name. Not compared with Name(AK): the signature already binds the key.
    pub qualified_signer: Vec<u8>,
    pub extra_data: Vec<u8>,
    /// TPMS_CLOCK_INFO.clock: milliseconds the TPM has been powered, monotonic.
    pub clock: u64,
    /// Incremented on every TPM Reset (reboot).
    pub reset_count: u32,
    /// Incremented on TPM Restart / resume.
    pub restart_count: u32,
    /// The clock has not gone backwards since it was last set.
    pub safe: bool,
    pub firmware_version: u64,
    pub selection: PcrSelection,
    pub pcr_digest: [u8; 32],
}

impl QuoteInfo {
    /// Marshals the TPMS_ATTEST (what the TPM signs). For building quotes in tests.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = TPM_GENERATED_VALUE.to_be_bytes().to_vec();
        b.extend(TPM_ST_ATTEST_QUOTE.to_be_bytes());
        for t in [&self.qualified_signer, &self.extra_data] {
            b.extend(u16::try_from(t.len()).unwrap_or(u16::MAX).to_be_bytes());
            b.extend(t);
        }
        b.extend(self.clock.to_be_bytes());
        b.extend(self.reset_count.to_be_bytes());
        b.extend(self.restart_count.to_be_bytes());
        b.push(u8::from(self.safe));
        b.extend(self.firmware_version.to_be_bytes());
        b.extend(self.selection.to_bytes());
        b.extend(32u16.to_be_bytes());
        b.extend(self.pcr_digest);
        b
    }
}

/// Parses a TPMS_ATTEST that must be a quote over one SHA-256 PCR bank, with nothing after it.
pub fn parse_attest(tpms_attest: &[u8]) -> Result<QuoteInfo, TpmError> {
    let mut r = Reader::new("TPMS_ATTEST", tpms_attest);
    r.expect_u32("magic", TPM_GENERATED_VALUE)?;
    r.expect_u16("type", TPM_ST_ATTEST_QUOTE)?;
    let qualified_signer = r.tpm2b("qualifiedSigner")?.to_vec();
    let extra_data = r.tpm2b("extraData")?.to_vec();
    let clock = r.u64("clockInfo.clock")?;
    let reset_count = r.u32("clockInfo.resetCount")?;
    let restart_count = r.u32("clockInfo.restartCount")?;
    let safe_offset = r.offset();
    let safe = match r.u8("clockInfo.safe")? {
        0 => false,
        1 => true,
        other => {
            return Err(r.unexpected("clockInfo.safe", safe_offset, other.into(), 1));
        }
    };
    let firmware_version = r.u64("firmwareVersion")?;
    let selection = PcrSelection::read(&mut r)?;
    let digest_offset = r.offset();
    let digest = r.tpm2b("pcrDigest")?;
    let pcr_digest: [u8; 32] = digest.try_into().map_err(|_| {
        let why = format!("{} bytes, want 32 (SHA-256)", digest.len());
        r.invalid("pcrDigest", digest_offset, why)
    })?;
    r.finish()?;
    Ok(QuoteInfo {
        qualified_signer,
        extra_data,
        clock,
        reset_count,
        restart_count,
        safe,
        firmware_version,
        selection,
        pcr_digest,
    })
}

/// Parses an ECDSA-SHA256 TPMT_SIGNATURE into (r, s), each left-padded to 32 bytes.
pub fn parse_signature(tpmt_signature: &[u8]) -> Result<([u8; 32], [u8; 32]), TpmError> {
    let mut r = Reader::new("TPMT_SIGNATURE", tpmt_signature);
    r.expect_u16("sigAlg", TPM_ALG_ECDSA)?;
    r.expect_u16("hash", TPM_ALG_SHA256)?;
    let mut scalar = |field| -> Result<[u8; 32], TpmError> {
        let offset = r.offset();
        let v = r.tpm2b(field)?;
        if v.len() > 32 {
            let why = format!("{} bytes, want at most 32", v.len());
            return Err(r.invalid(field, offset, why));
        }
        let mut out = [0u8; 32];
        out[32 - v.len()..].copy_from_slice(v);
        Ok(out)
    };
    let sig_r = scalar("signatureR")?;
    let sig_s = scalar("signatureS")?;
    r.finish()?;
    Ok((sig_r, sig_s))
}

/// Marshals an ECDSA-SHA256 TPMT_SIGNATURE. For building quotes in tests.
pub fn encode_signature(sig: &Signature) -> Vec<u8> {
    let (sig_r, sig_s) = sig.split_bytes();
    let mut b = TPM_ALG_ECDSA.to_be_bytes().to_vec();
    b.extend(TPM_ALG_SHA256.to_be_bytes());
    for v in [sig_r, sig_s] {
        b.extend(32u16.to_be_bytes());
        b.extend(v);
    }
    b
}

/// Why a quote was refused; each is its own finding for the verifier.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum QuoteError {
    #[error("quote is malformed: {0}")]
    Malformed(#[from] TpmError),
    #[error("quote signature does not verify with the enrolled AK")]
    BadSignature,
    #[error("quote extraData is {}, want {}", hex::encode(.got), hex::encode(.want))]
    ExtraDataMismatch { want: Vec<u8>, got: Vec<u8> },
    #[error(
        "quote pcrDigest is {}, but the PCR values given hash to {}",
        hex::encode(.quoted),
        hex::encode(.computed)
    )]
    PcrDigestMismatch {
        quoted: [u8; 32],
        computed: [u8; 32],
    },
    #[error("quote covers PCR {0} but no value for it was given")]
    MissingPcr(u8),
    /// From [`verify_quote`]: values were given for PCRs the quote does not cover (`got`), so
    /// they are not attested; from [`check_selection`]: the quote covers other PCRs than the
    /// verifier asked for.
    #[error("quote covers PCRs {want:?}, but the evidence has {got:?}")]
    SelectionMismatch { want: Vec<u8>, got: Vec<u8> },
}

impl From<MissingPcr> for QuoteError {
    fn from(m: MissingPcr) -> Self {
        QuoteError::MissingPcr(m.0)
    }
}

/// Verifies a quote: the structure, the AK's ECDSA-SHA256 signature over the exact bytes, the
/// nonce, and that `pcrs` (exactly the quoted PCRs) hash to the quoted pcrDigest. Returns the
/// parsed quote so the caller can check the clock and the selection it expects.
pub fn verify_quote(
    ak: &AkPublic,
    tpms_attest: &[u8],
    tpmt_signature: &[u8],
    expected_extra_data: &[u8],
    pcrs: &PcrValues,
) -> Result<QuoteInfo, QuoteError> {
    let info = parse_attest(tpms_attest)?;
    let (sig_r, sig_s) = parse_signature(tpmt_signature)?;
    // Zero or out-of-range scalars are well-formed bytes that no key signs: a bad signature.
    let sig = Signature::from_scalars(sig_r, sig_s).map_err(|_| QuoteError::BadSignature)?;
    // Verifier hashes with SHA-256, the AK's (checked) scheme hash.
    ak.verifying_key()
        .verify(tpms_attest, &sig)
        .map_err(|_| QuoteError::BadSignature)?;
    if info.extra_data != expected_extra_data {
        return Err(QuoteError::ExtraDataMismatch {
            want: expected_extra_data.to_vec(),
            got: info.extra_data,
        });
    }
    let computed = pcrs.digest(&info.selection)?;
    if pcrs.indices() != info.selection.indices() {
        return Err(QuoteError::SelectionMismatch {
            want: info.selection.indices(),
            got: pcrs.indices(),
        });
    }
    if computed != info.pcr_digest {
        return Err(QuoteError::PcrDigestMismatch {
            quoted: info.pcr_digest,
            computed,
        });
    }
    Ok(info)
}

/// The quote covers exactly the PCRs the verifier asked for.
pub fn check_selection(info: &QuoteInfo, expected: &PcrSelection) -> Result<(), QuoteError> {
    if &info.selection != expected {
        return Err(QuoteError::SelectionMismatch {
            want: expected.indices(),
            got: info.selection.indices(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::SigningKey;
    use p256::ecdsa::signature::Signer;

    struct Fixture {
        ak: AkPublic,
        key: SigningKey,
        pcrs: PcrValues,
        info: QuoteInfo,
    }

    fn fixture() -> Fixture {
        let key = SigningKey::from_slice(&[0x42; 32]).unwrap();
        let ak = AkPublic::from_verifying_key(key.verifying_key());
        let mut pcrs = PcrValues::new();
        for i in [0u8, 1, 2, 3, 4, 5, 6, 7, 10] {
            pcrs.insert(i, [i ^ 0x5a; 32]);
        }
        let selection = PcrSelection::from_indices(&pcrs.indices()).unwrap();
        let info = QuoteInfo {
            qualified_signer: ak.name(),
            extra_data: vec![0xab; 32],
            clock: 123_456,
            reset_count: 3,
            restart_count: 1,
            safe: true,
            firmware_version: 0x2021_0101,
            pcr_digest: pcrs.digest(&selection).unwrap(),
            selection,
        };
        Fixture {
            ak,
            key,
            pcrs,
            info,
        }
    }

    fn sign(key: &SigningKey, attest: &[u8]) -> Vec<u8> {
        let sig: Signature = key.sign(attest);
        encode_signature(&sig)
    }

    #[test]
    fn tpm_quote_verifies_and_parses_back() {
        let f = fixture();
        let attest = f.info.to_bytes();
        let sig = sign(&f.key, &attest);
        let got = verify_quote(&f.ak, &attest, &sig, &[0xab; 32], &f.pcrs).unwrap();
        assert_eq!(got, f.info);
        check_selection(&got, &f.info.selection).unwrap();
        let other = PcrSelection::from_indices(&[0, 1, 2, 3, 4, 5, 6, 7]).unwrap();
        assert!(matches!(
            check_selection(&got, &other),
            Err(QuoteError::SelectionMismatch { .. })
        ));
    }

    #[test]
    fn tpm_quote_refusals_are_distinct() {
        let f = fixture();
        let attest = f.info.to_bytes();
        let sig = sign(&f.key, &attest);
        let e = verify_quote(&f.ak, &attest, &sig, &[0xac; 32], &f.pcrs).unwrap_err();
        assert_eq!(
            e,
            QuoteError::ExtraDataMismatch {
                want: vec![0xac; 32],
                got: vec![0xab; 32]
            }
        );
        let mut pcrs = f.pcrs.clone();
        pcrs.insert(10, [0; 32]);
        let e = verify_quote(&f.ak, &attest, &sig, &[0xab; 32], &pcrs).unwrap_err();
        assert!(
            matches!(e, QuoteError::PcrDigestMismatch { quoted, .. } if quoted == f.info.pcr_digest)
        );
        let mut pcrs = f.pcrs.clone();
        pcrs.0.remove(&7);
        let e = verify_quote(&f.ak, &attest, &sig, &[0xab; 32], &pcrs).unwrap_err();
        assert_eq!(e, QuoteError::MissingPcr(7));
        let mut pcrs = f.pcrs.clone();
        pcrs.insert(11, [0; 32]);
        let e = verify_quote(&f.ak, &attest, &sig, &[0xab; 32], &pcrs).unwrap_err();
        assert!(matches!(e, QuoteError::SelectionMismatch { got, .. } if got.contains(&11)));
        let mut bad_sig = sig.clone();
        bad_sig[10] ^= 1;
        let e = verify_quote(&f.ak, &attest, &bad_sig, &[0xab; 32], &f.pcrs).unwrap_err();
        assert_eq!(e, QuoteError::BadSignature);
        // A signature by another key over the same bytes.
        let other = SigningKey::from_slice(&[0x43; 32]).unwrap();
        let e = verify_quote(&f.ak, &attest, &sign(&other, &attest), &[0xab; 32], &f.pcrs);
        assert_eq!(e.unwrap_err(), QuoteError::BadSignature);
        // Changing the signed bytes (here the clock) breaks the signature.
        let mut tampered = attest.clone();
        tampered[80] ^= 1;
        let e = verify_quote(&f.ak, &tampered, &sig, &[0xab; 32], &f.pcrs).unwrap_err();
        assert_eq!(e, QuoteError::BadSignature);
    }

    #[test]
    fn tpm_attest_parse_errors_name_the_offset() {
        let f = fixture();
        let attest = f.info.to_bytes();
        // magic 0-3, type 4-5, qualifiedSigner 6-41, extraData 42-75, clock 76-83,
        // resetCount 84-87, restartCount 88-91, safe 92, firmwareVersion 93-100,
        // selection 101-110, pcrDigest 111-144.
        assert_eq!(attest.len(), 145);
        let cases: &[(usize, &[u8], &str)] = &[
            (
                0,
                &[0xff, 0x54, 0x43, 0x00],
                "TPMS_ATTEST: magic 0xff544300 at byte 0, want 0xff544347",
            ),
            (
                4,
                &[0x80, 0x17],
                "TPMS_ATTEST: type 0x8017 at byte 4, want 0x8018",
            ),
            (
                92,
                &[2],
                "TPMS_ATTEST: clockInfo.safe 0x2 at byte 92, want 0x1",
            ),
            (
                105,
                &[0x00, 0x04],
                "TPMS_ATTEST: pcrSelections[0].hash 0x4 at byte 105, want 0xb",
            ),
            (
                111,
                &[0x00, 0x14],
                "TPMS_ATTEST: pcrDigest at byte 111: 20 bytes, want 32 (SHA-256)",
            ),
        ];
        for (at, patch, want) in cases {
            let mut bad = attest.clone();
            bad[*at..at + patch.len()].copy_from_slice(patch);
            let e = parse_attest(&bad).unwrap_err();
            assert_eq!(e.to_string(), *want);
            // verify_quote reports the same as Malformed, before looking at the signature.
            let v = verify_quote(&f.ak, &bad, &[], &[], &f.pcrs).unwrap_err();
            assert_eq!(v, QuoteError::Malformed(e));
        }
        let e = parse_attest(&attest[..100]).unwrap_err().to_string();
        assert_eq!(
            e,
            "TPMS_ATTEST: firmwareVersion needs 8 bytes at byte 93, only 7 left"
        );
        let mut long = attest.clone();
        long.push(0);
        let e = parse_attest(&long).unwrap_err().to_string();
        assert_eq!(
            e,
            "TPMS_ATTEST: 1 trailing bytes at byte 145, want the structure to end there"
        );
    }

    #[test]
    fn tpm_signature_parse_errors_name_the_offset() {
        let f = fixture();
        let sig = sign(&f.key, &f.info.to_bytes());
        assert_eq!(sig.len(), 72);
        let mut rsa = sig.clone();
        rsa[..2].copy_from_slice(&[0x00, 0x14]);
        let e = parse_signature(&rsa).unwrap_err().to_string();
        assert_eq!(e, "TPMT_SIGNATURE: sigAlg 0x14 at byte 0, want 0x18");
        let mut long_r = sig.clone();
        long_r[4..6].copy_from_slice(&[0x00, 0x21]);
        let e = parse_signature(&long_r).unwrap_err().to_string();
        assert_eq!(
            e,
            "TPMT_SIGNATURE: signatureR at byte 4: 33 bytes, want at most 32"
        );
        // A short (unpadded) r is accepted and left-padded.
        let (r, s) = parse_signature(&sig).unwrap();
        let mut short = vec![0x00, 0x18, 0x00, 0x0b, 0x00, 0x1f];
        short.extend(&r[1..]);
        short.extend([0x00, 0x20]);
        short.extend(s);
        let (r2, _) = parse_signature(&short).unwrap();
        assert_eq!(&r2[1..], &r[1..]);
        assert_eq!(r2[0], 0);
    }
}
