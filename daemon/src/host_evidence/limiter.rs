//! Builds the limiter part of a statement from the kernel's pinned state, and the producer
//! identity. Reads only: it never loads, attaches or changes anything.

use rackwarden_attest::evidence::{
    AttachPoint, CapInForce, DirectionCounters, LimiterEvidence, LimiterReport, ProducerIdentity,
};

use crate::{
    config::Config,
    enforce::gaps::GapLog,
    limiter::{Direction, Limiter, LimiterError},
    pins::PinPaths,
    status::counters_json,
};

/// The limiter as it stands now, with gaps detected at or after `since_ms`. Must run in the
/// interfaces' network namespace (the CLI enters `cfg.netns` first).
pub fn limiter_report(cfg: &Config, since_ms: u64) -> LimiterReport {
    match collect(cfg, since_ms) {
        Ok(e) => LimiterReport::Present(Box::new(e)),
        Err(e) => LimiterReport::Absent {
            finding: e.to_string(),
        },
    }
}

/// Why the limiter could not be reported (the statement then says it is absent, and why).
#[derive(Debug, thiserror::Error)]
enum CollectError {
    #[error("limiter absent: no usable policer pinned under {}: {source}", root.display())]
    NotPinned {
        root: std::path::PathBuf,
        source: Box<LimiterError>,
    },
    #[error(transparent)]
    Maps(Box<LimiterError>),
    #[error(transparent)]
    Gaps(#[from] crate::enforce::gaps::GapLogError),
}

impl From<LimiterError> for CollectError {
    fn from(e: LimiterError) -> Self {
        CollectError::Maps(Box::new(e))
    }
}

fn collect(cfg: &Config, since_ms: u64) -> Result<LimiterEvidence, CollectError> {
    let pins = PinPaths::new(&cfg.pin_root);
    let mut limiter = Limiter::adopt(&pins).map_err(|e| CollectError::NotPinned {
        root: pins.root().to_path_buf(),
        source: Box::new(e),
    })?;
    let kind = limiter.choose_kind(cfg.attach_mode, &cfg.interfaces[0]);
    let mut attach_points = Vec::new();
    for iface in &cfg.interfaces {
        for d in Direction::ALL {
            let p = match limiter.inspect(iface, d) {
                Ok(h) => AttachPoint {
                    interface: iface.clone(),
                    direction: d,
                    attached: h.attached,
                    foreign_ahead: h.foreign_ahead.iter().map(|p| p.id).collect(),
                },
                // Unprovable is reported as not attached, never as attached.
                Err(_) => AttachPoint {
                    interface: iface.clone(),
                    direction: d,
                    attached: false,
                    foreign_ahead: vec![],
                },
            };
            attach_points.push(p);
        }
    }
    let mut caps = Vec::new();
    let mut counters = Vec::new();
    for d in Direction::ALL {
        let c = limiter.maps.config(d)?;
        caps.push(CapInForce {
            direction: d,
            rate_bytes_per_s: c.rate_bytes_per_s,
            burst_bytes: c.burst_bytes,
            small_reserve_bytes: c.small_reserve_bytes as u64,
            generation: c.generation,
        });
        counters.push(DirectionCounters {
            direction: d,
            counters: counters_json(limiter.maps.counters(d)?),
        });
    }
    let gaps = GapLog::open(&cfg.state_paths()).map(|g| {
        g.gaps
            .into_iter()
            .filter(|g| g.detected_at_ms >= since_ms)
            .collect()
    })?;
    Ok(LimiterEvidence {
        attach_kind: kind,
        pin_root: pins.root().display().to_string(),
        programs: limiter.identities(),
        attach_points,
        caps,
        counters,
        gaps,
        bypass: Some(super::bypass::bypass_report(cfg, &pins)),
        self_protection: Some(crate::limiter::protection::assess(
            &pins,
            cfg.check_interval,
        )),
    })
}

/// This binary's name, version and SHA3-256 (of `/proc/self/exe`).
pub fn producer(name: &str) -> ProducerIdentity {
    let digest = std::fs::read("/proc/self/exe")
        .map(|b| hex::encode(rackwarden_attest::sha3(&b)))
        .unwrap_or_else(|e| format!("unreadable: {e}"));
    ProducerIdentity {
        name: name.into(),
        version: env!("CARGO_PKG_VERSION").into(),
        binary_sha3_256: digest,
    }
}
