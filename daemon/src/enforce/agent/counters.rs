//! Counter sampling: one sample a second, for the "recent rate" column of `status`, and a
//! check that no counter ever goes down (only a program can write our frozen maps, and a
//! rewind would hide bytes from the verifier).

use std::time::Instant;

use rackwarden_attest::now_ms;
use rackwarden_common::Counters;

use super::{Agent, AgentError};
use crate::{
    enforce::gaps::{EnforcementGap, GapKind},
    limiter::{Direction, HookDirection},
};

/// Counter samples for the "recent rate" column: one per second, a few seconds kept.
pub(super) const RATE_SAMPLES: usize = 6;

/// The first counter field that is lower in `is` than in `was`.
fn rewound(was: &Counters, is: &Counters) -> Option<&'static str> {
    [
        ("passed_bytes", was.passed_bytes, is.passed_bytes),
        ("passed_packets", was.passed_packets, is.passed_packets),
        ("dropped_bytes", was.dropped_bytes, is.dropped_bytes),
        ("dropped_packets", was.dropped_packets, is.dropped_packets),
        (
            "unconfigured_drops",
            was.unconfigured_drops,
            is.unconfigured_drops,
        ),
        (
            "contention_drops",
            was.contention_drops,
            is.contention_drops,
        ),
    ]
    .into_iter()
    .find(|(_, w, i)| i < w)
    .map(|(f, _, _)| f)
}

impl Agent {
    /// Samples the counters and checks that none went down since the last sample: only a
    /// program can write our frozen maps, and a rewind would hide bytes from the verifier.
    pub(super) fn sample(&mut self) -> Result<(), AgentError> {
        let c = [
            self.limiter.maps.counters(Direction::Egress)?,
            self.limiter.maps.counters(Direction::Ingress)?,
        ];
        if let Some((_, last)) = self.samples.back() {
            for d in Direction::ALL {
                let (was, is) = (&last[d.index() as usize], &c[d.index() as usize]);
                if let Some(field) = rewound(was, is) {
                    self.gaps.record(EnforcementGap {
                        kind: GapKind::CountersRewound,
                        interface: None,
                        direction: Some(d),
                        last_verified_at_ms: None,
                        detected_at_ms: now_ms(),
                        detail: format!(
                            "{field} went down between two samples: {} -> {} passed bytes, {} -> {} dropped bytes",
                            was.passed_bytes, is.passed_bytes, was.dropped_bytes, is.dropped_bytes
                        ),
                        restored: false,
                    });
                }
            }
        }
        self.samples.push_back((Instant::now(), c));
        while self.samples.len() > RATE_SAMPLES {
            self.samples.pop_front();
        }
        Ok(())
    }
}
