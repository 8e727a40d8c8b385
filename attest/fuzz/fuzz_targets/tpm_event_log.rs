//! Any bytes as the firmware's event log (binary_bios_measurements): parse, replay and
//! describe must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rackwarden_attest::tpm::eventlog::EventLog;

fuzz_target!(|data: &[u8]| {
    if let Ok(log) = EventLog::parse(data) {
        let _ = log.replay_sha256();
        for e in &log.events {
            let _ = (e.describe(), e.tagged(), e.sha256());
        }
        let _ = log.to_bytes();
    }
});
