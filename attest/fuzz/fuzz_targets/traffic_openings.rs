//! Any bytes as a host's answer to a sample (`POST /v1/openings`' signed payload): parsing it
//! and checking it against a fixed root and demand must never panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use rackwarden_attest::traffic::{EpochOpenings, SampleDemand, TrafficRoot};

fuzz_target!(|data: &[u8]| {
    if let Ok(o) = serde_json::from_slice::<EpochOpenings>(data) {
        let root = TrafficRoot {
            sha3_256: o.root.sha3_256,
            bytes: o.root.bytes,
            records: o.root.records,
        };
        let demand = SampleDemand {
            epoch_seq: o.epoch_seq,
            randomness: [7; 32],
            per_direction: 4,
            deadline_ms: 0,
        };
        let _ = o.check(&o.rack, &o.host, &root, &demand);
    }
});
