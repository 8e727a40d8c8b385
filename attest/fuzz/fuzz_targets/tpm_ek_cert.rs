//! Any bytes as an EK certificate (DER, as read from the TPM's NV), checked against swtpm's
//! test CA: must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rackwarden_attest::tpm::{EkPublic, verify_ek_certificate};

const ROOT: &[u8] = include_bytes!("../../src/tpm/testdata/swtpm-rootca.pem");
const ISSUER: &[u8] = include_bytes!("../../src/tpm/testdata/swtpm-issuer.pem");
const EK_MODULUS_HEX: &str = include_str!("../../src/tpm/testdata/swtpm-ek-rsa2048.modulus.hex");

fuzz_target!(|data: &[u8]| {
    let Ok(modulus) = hex::decode(EK_MODULUS_HEX.trim()) else {
        return;
    };
    let Ok(ek) = EkPublic::from_modulus(&modulus) else {
        return;
    };
    let _ = verify_ek_certificate(data, &ek, ROOT, ISSUER, 1_796_500_000);
});
