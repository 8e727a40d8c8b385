//! Any bytes as the IMA binary measurement list: parse and replay must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rackwarden_attest::tpm::{encode_ima_binary, parse_ima_binary, replay_pcr10, replay_prefix};

fuzz_target!(|data: &[u8]| {
    if let Ok(entries) = parse_ima_binary(data) {
        let pcr = replay_pcr10([0; 32], &entries);
        let _ = replay_prefix([0; 32], &entries, &pcr);
        let _ = encode_ima_binary(&entries);
    }
});
