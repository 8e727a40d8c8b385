//! Any bytes as a log, an envelope and a statement: must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rackwarden_attest::{dsse, statement::Statement, verify::verify_log};

fuzz_target!(|data: &[u8]| {
    // A fixed key: the fuzzer explores parsing, not forging.
    let key = ed25519_key();
    let _ = verify_log(data, &key);
    let _ = dsse::verify(data, &key, dsse::INTOTO_PAYLOAD_TYPE);
    let _ = Statement::from_verified(data);
});

fn ed25519_key() -> rackwarden_attest::keys::VerifyingKeyType {
    rackwarden_attest::keys::fixed_test_key()
}
