//! Any bytes as the TPM structures a host sends (TPMS_ATTEST, TPMT_SIGNATURE, the AK's and
//! EK's TPMT_PUBLIC, TPML_PCR_SELECTION): must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rackwarden_attest::tpm::{
    AkPublic, EkPublic, PcrSelection, parse_attest, quote::parse_signature,
};

fuzz_target!(|data: &[u8]| {
    if let Ok(info) = parse_attest(data) {
        let _ = info.to_bytes();
    }
    let _ = parse_signature(data);
    if let Ok(ak) = AkPublic::parse(data) {
        let _ = ak.name();
    }
    if let Ok(ek) = EkPublic::parse(data) {
        let _ = (ek.name(), ek.exponent());
    }
    if let Ok(s) = PcrSelection::parse(data) {
        let _ = s.to_bytes();
    }
});
