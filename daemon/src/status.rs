//! What `rackwarden status` shows: the agent builds a [`StatusReport`], the CLI renders it as
//! a table or prints it as JSON.

use std::fmt::Write as _;

use rackwarden_common::Counters;

use crate::{
    enforce::gaps::EnforcementGap,
    limiter::{AttachKind, Direction, ProgramIdentity, maps::MapIds, watch::HookStatus},
    units::{fmt_bytes, fmt_rate},
};

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct DirectionStatus {
    pub direction: Direction,
    pub rack_cap_bytes_per_s: u64,
    pub host_cap_bytes_per_s: u64,
    pub burst_bytes: u64,
    pub config_generation: u32,
    pub counters: CountersJson,
    /// Passed bytes per second over the last few seconds (None until two samples exist).
    pub recent_passed_bytes_per_s: Option<f64>,
    pub recent_dropped_bytes_per_s: Option<f64>,
    pub recent_window_s: f64,
}

pub use rackwarden_attest::evidence::LimiterCounters as CountersJson;

/// The kernel-facing counters as the evidence type.
pub fn counters_json(c: Counters) -> CountersJson {
    CountersJson {
        passed_bytes: c.passed_bytes,
        passed_packets: c.passed_packets,
        dropped_bytes: c.dropped_bytes,
        dropped_packets: c.dropped_packets,
        unconfigured_drops: c.unconfigured_drops,
        contention_drops: c.contention_drops,
    }
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StatusReport {
    pub rack_id: String,
    pub host_id: String,
    pub host_share: f64,
    pub agent_state: String,
    pub attach_kind: Option<AttachKind>,
    pub pin_root: String,
    pub programs: Vec<ProgramIdentity>,
    pub map_ids: MapIds,
    pub directions: Vec<DirectionStatus>,
    pub hooks: Vec<HookStatus>,
    pub gaps_total: usize,
    /// Gaps known to the daemon but not yet written to disk (storage full or failing).
    pub gaps_unpersisted: usize,
    /// The most recent gaps (newest last).
    pub recent_gaps: Vec<EnforcementGap>,
    pub bypass: rackwarden_attest::evidence::BypassReport,
    /// The epoch loop and delivery (absent when no `[epoch]` is configured).
    #[serde(default)]
    pub epoch: Option<crate::epoch::EpochStatus>,
    /// Why the last SIGHUP reload was refused, if it was.
    #[serde(default)]
    pub reload_error: Option<String>,
    /// Whether the running policer was loaded, adopted or upgraded by this daemon.
    #[serde(default)]
    pub program_version: Option<crate::limiter::loader::ProgramVersion>,
    /// What stops another root process from switching the limiter off here.
    #[serde(default)]
    pub self_protection: Option<rackwarden_attest::evidence::SelfProtection>,
}

impl StatusReport {
    pub fn render(&self) -> String {
        let mut s = String::new();
        self.write_header(&mut s);
        self.write_directions(&mut s);
        self.write_hooks(&mut s);
        self.write_programs(&mut s);
        self.write_self_protection(&mut s);
        self.write_bypass(&mut s);
        self.write_gaps(&mut s);
        if let Some(e) = &self.epoch {
            render_epoch(&mut s, e);
        }
        if let Some(r) = &self.reload_error {
            let _ = writeln!(s, "\nlast reload REFUSED (running configuration kept): {r}");
        }
        s
    }

    /// Who, where, and the enforcement state.
    fn write_header(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "rack {}  host {}  share {}  state {}  attach {}",
            self.rack_id,
            self.host_id,
            self.host_share,
            self.agent_state,
            self.attach_kind
                .map(|k| format!("{k:?}").to_lowercase())
                .unwrap_or_else(|| "-".into())
        );
    }

    /// Caps, counters and recent rate per direction.
    fn write_directions(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n{:<8} {:>14} {:>14} {:>12} {:>4} {:>16} {:>12} {:>16} {:>12} {:>14}",
            "dir",
            "rack cap",
            "host cap",
            "burst",
            "gen",
            "passed",
            "pkts",
            "dropped",
            "pkts",
            "rate (recent)"
        );
        for d in &self.directions {
            let _ = writeln!(
                s,
                "{:<8} {:>14} {:>14} {:>12} {:>4} {:>16} {:>12} {:>16} {:>12} {:>14}",
                d.direction.name(),
                fmt_rate(d.rack_cap_bytes_per_s as f64),
                fmt_rate(d.host_cap_bytes_per_s as f64),
                fmt_bytes(d.burst_bytes as f64),
                d.config_generation,
                d.counters.passed_bytes,
                d.counters.passed_packets,
                d.counters.dropped_bytes,
                d.counters.dropped_packets,
                d.recent_passed_bytes_per_s
                    .map(fmt_rate)
                    .unwrap_or_else(|| "-".into()),
            );
        }
    }

    /// Each hook and the programs on it.
    fn write_hooks(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\n{:<16} {:<8} {:<10} {:<24} programs on hook (run order)",
            "interface", "dir", "attached", "foreign ahead"
        );
        for h in &self.hooks {
            let ahead: Vec<String> = h
                .foreign_ahead
                .iter()
                .map(|p| format!("{}#{}", p.name, p.id))
                .collect();
            let all: Vec<String> = h
                .programs
                .iter()
                .map(|p| format!("{}#{}", p.name, p.id))
                .collect();
            let _ = writeln!(
                s,
                "{:<16} {:<8} {:<10} {:<24} {}",
                h.interface,
                h.direction.name(),
                if h.attached { "yes" } else { "NO" },
                if ahead.is_empty() {
                    "-".into()
                } else {
                    ahead.join(",")
                },
                all.join(",")
            );
        }
    }

    /// Our programs and maps.
    fn write_programs(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\nprograms ({}):",
            match &self.program_version {
                Some(crate::limiter::loader::ProgramVersion::Upgraded { from }) => format!(
                    "upgraded at start from tags {}",
                    from.iter()
                        .map(|p| p.tag.clone())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                Some(crate::limiter::loader::ProgramVersion::UpgradeRefused { reason }) => {
                    format!(
                        "ANOTHER BUILD'S program is running; this build's was refused: {reason}"
                    )
                }
                Some(v) => format!("{v:?}").to_lowercase(),
                None => "-".into(),
            }
        );
        for p in &self.programs {
            let _ = writeln!(s, "  {:<12} id {:<8} tag {}", p.name, p.id, p.tag);
        }
        let _ = writeln!(
            s,
            "maps: config #{} state #{} counters #{} under {}",
            self.map_ids.config, self.map_ids.state, self.map_ids.counters, self.pin_root
        );
    }

    /// What stops another root process from switching the limiter off.
    fn write_self_protection(&self, s: &mut String) {
        if let Some(p) = &self.self_protection {
            let level = |l: &rackwarden_attest::evidence::ProtectionLevel| {
                serde_json::to_value(l)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            };
            let _ = writeln!(
                s,
                "self-protection: map writes {}, detach {}, foreign ahead {}, program writes {} (checks every {} ms, samples every {} ms; BPF LSM {})",
                level(&p.map_writes),
                level(&p.detach),
                level(&p.foreign_ahead),
                level(&p.program_writes),
                p.poll_interval_ms,
                p.sample_interval_ms,
                if p.bpf_lsm_active {
                    "active"
                } else {
                    "not active"
                }
            );
            use rackwarden_attest::evidence::LsmGuard;
            let _ = match &p.lsm_guard {
                LsmGuard::Sealed {
                    attach,
                    hooks,
                    objects,
                    refusals,
                    tpm_devices,
                    tpm_held_elsewhere,
                    ..
                } => writeln!(
                    s,
                    "guard: sealed ({}; {objects} objects; {tpm_devices} TPM devices kept for the daemon{}; hooks {}); refused {refusals} attempts",
                    attach.name(),
                    if *tpm_held_elsewhere > 0 {
                        format!(
                            ", but {tpm_held_elsewhere} descriptors of them opened before the seal are held by other processes"
                        )
                    } else {
                        String::new()
                    },
                    hooks.join(", ")
                ),
                LsmGuard::Unavailable { reason } => writeln!(s, "guard: not in force: {reason}"),
                LsmGuard::NotReported => writeln!(s, "guard: not reported"),
            };
        }
    }

    /// The bypass refusal and the surface it cannot block.
    fn write_bypass(&self, s: &mut String) {
        let b = &self.bypass;
        let _ = writeln!(
            s,
            "\nbypass refusal (cgroup/setsockopt): {}  {}",
            b.refusal.state.name().to_uppercase(),
            b.refusal.detail
        );
        if let Some(r) = &b.refusals {
            let _ = writeln!(
                s,
                "  refused: PACKET_QDISC_BYPASS {}  XDP_UMEM_REG {}  (last by tgid {} cgroup {})",
                r.qdisc_bypass, r.xdp_umem_reg, r.last_tgid, r.last_cgroup_id
            );
        }
        let list = |v: &Vec<String>| {
            if v.is_empty() {
                "none".to_string()
            } else {
                v.join(", ")
            }
        };
        let _ = writeln!(s, "bypass surface (not blockable here, reported):");
        let _ = writeln!(s, "  RDMA/InfiniBand devices: {}", list(&b.rdma_devices));
        let _ = writeln!(s, "  NICs bound to vfio-pci:  {}", list(&b.vfio_devices));
        let _ = writeln!(
            s,
            "  interfaces without cap:  {}",
            list(&b.uncapped_interfaces)
        );
        let _ = writeln!(
            s,
            "  AF_XDP sockets open:     {}",
            b.af_xdp_sockets
                .map(|n| n.to_string())
                .unwrap_or_else(|| "unknown".into())
        );
    }

    /// Enforcement gaps, the most recent listed.
    fn write_gaps(&self, s: &mut String) {
        let _ = writeln!(
            s,
            "\nenforcement gaps: {} in total{}",
            self.gaps_total,
            if self.gaps_unpersisted > 0 {
                format!(
                    " ({} NOT YET ON DISK: the state directory cannot be written)",
                    self.gaps_unpersisted
                )
            } else {
                String::new()
            }
        );
        for g in &self.recent_gaps {
            let _ = writeln!(
                s,
                "  at {}  {:?} {} {}  last ok {}  restored {}  {}",
                crate::units::fmt_unix_ms(g.detected_at_ms),
                g.kind,
                g.interface.as_deref().unwrap_or("-"),
                g.direction.map(|d| d.name()).unwrap_or("-"),
                g.last_verified_at_ms
                    .map(crate::units::fmt_unix_ms)
                    .unwrap_or_else(|| "never".into()),
                g.restored,
                g.detail
            );
        }
    }
}

fn render_epoch(s: &mut String, e: &crate::epoch::EpochStatus) {
    use crate::{epoch::EpochState, epoch::delivery::DeliveryState, units::fmt_unix_ms};
    let dur = |ms: u64| crate::units::fmt_duration(std::time::Duration::from_millis(ms));
    let _ = writeln!(
        s,
        "\nepoch loop: every {}, verifier {}",
        dur(e.wipe_interval_ms),
        e.verifier_url
    );
    let short = |k: &str| k.get(..16).unwrap_or(k).to_string();
    let _ = writeln!(
        s,
        "signing key: {}{}",
        short(&e.keyid),
        match &e.next_keyid {
            Some(n) => format!(
                "; rotation pending to {}: the next statement names it",
                short(n)
            ),
            None => String::new(),
        }
    );
    let state = match &e.state {
        EpochState::Waiting { next_at_ms } => {
            format!("waiting; next epoch at {}", fmt_unix_ms(*next_at_ms))
        }
        EpochState::StorageFailed { error, retry_at_ms } => format!(
            "STORAGE FAILED (no new epochs; nothing written is lost): {error}; retry at {}",
            fmt_unix_ms(*retry_at_ms)
        ),
        EpochState::Challenged { seq, nonce } => format!(
            "epoch {seq}: challenged ({})",
            nonce.as_deref().unwrap_or("UNCHALLENGED")
        ),
        other => format!("{} ({other:?})", other.name()),
    };
    let _ = writeln!(s, "  state: {state}");
    if let Some(l) = &e.last_epoch {
        let _ = writeln!(
            s,
            "  last epoch: seq {} at {} ({:?}){}: wipe {}, images {}, workloads {:?}, downtime {}",
            l.seq,
            fmt_unix_ms(l.ended_at_ms),
            l.trigger,
            l.unchallenged
                .as_ref()
                .map(|r| format!(" UNCHALLENGED ({r})"))
                .unwrap_or_default(),
            if l.wipe_ok {
                "verified"
            } else {
                "NOT VERIFIED"
            },
            match l.images_ok {
                None => "not configured",
                Some(true) => "verified",
                Some(false) => "REFUSED",
            },
            l.workloads,
            dur(l.downtime_ms)
        );
        let phases: Vec<String> = l
            .phases
            .iter()
            .map(|p| format!("{} {}", p.phase, dur(p.ms)))
            .collect();
        let _ = writeln!(s, "  phases: {}", phases.join(", "));
    }
    if let Some(err) = &e.last_error {
        let _ = writeln!(s, "  last error: {err}");
    }
    let d = &e.delivery;
    let _ = writeln!(
        s,
        "delivery: {}; acknowledged up to seq {}; backlog {} statement(s)",
        match &d.state {
            DeliveryState::Idle => "idle".to_string(),
            DeliveryState::Delivering { seq } => format!("delivering from seq {seq}"),
            DeliveryState::DeliveryFailed {
                seq,
                attempt,
                retry_at_ms,
                error,
            } => format!(
                "FAILED at seq {seq} (attempt {attempt}, retry at {}): {error}",
                fmt_unix_ms(*retry_at_ms)
            ),
        },
        d.delivered_seq
            .map(|x| x.to_string())
            .unwrap_or_else(|| "-".into()),
        d.backlog
    );
    if let Some(instance) = &d.instance {
        let _ = writeln!(s, "  verifier instance in use: {instance}");
    }
    if let Some(v) = &d.last_verdict {
        let _ = writeln!(
            s,
            "last verdict: seq {} {} {}",
            v.seq,
            v.status.as_deref().unwrap_or(&v.ingest),
            if v.findings.is_empty() {
                String::new()
            } else {
                format!("findings: {}", v.findings.join(", "))
            }
        );
    }
    if let Some(f) = &d.log_failure {
        let _ = writeln!(s, "VERIFIER LOG CHECK FAILED: {f}");
    }
    render_root_of_trust(s, e);
    if let Some(t) = &e.taps {
        render_taps(s, t);
    }
    let o = &d.openings;
    if o.pending > 0 || o.answered > 0 || o.last_failure.is_some() {
        let _ = writeln!(
            s,
            "openings: {} sampled epoch(s) pending, {} answered since start",
            o.pending, o.answered
        );
        if let Some(f) = &o.last_failure {
            let _ = writeln!(s, "  LAST OPENINGS FAILURE: {f}");
        }
    }
}

/// The tap: what the epoch in progress has read, the spool, the last commit.
fn render_taps(s: &mut String, t: &crate::taps::runner::TapStatus) {
    use rackwarden_attest::units::fmt_size;
    let _ = writeln!(
        s,
        "tap: epoch in progress {} egress, {} ingress tapped ({} held in memory); spool {} of {}",
        fmt_size(t.tapped_bytes[0]),
        fmt_size(t.tapped_bytes[1]),
        fmt_size(t.buffered_bytes),
        fmt_size(t.spool_bytes),
        fmt_size(t.spool_limit)
    );
    if let Some(l) = &t.last {
        let unaccounted = l.unaccounted_bytes[0] + l.unaccounted_bytes[1];
        let _ = writeln!(
            s,
            "  last commit: seq {}, {} records, root {}..., {} egress + {} ingress; {}{}",
            l.seq,
            l.records,
            l.root.get(..16).unwrap_or(&l.root),
            fmt_size(l.tapped_bytes[0]),
            fmt_size(l.tapped_bytes[1]),
            if unaccounted == 0 {
                "unaccounted 0".to_string()
            } else {
                format!("UNACCOUNTED {} bytes", unaccounted)
            },
            if l.dropped_frames == 0 {
                String::new()
            } else {
                format!(", tap DROPPED {} frames (fail closed)", l.dropped_frames)
            }
        );
    }
    if let Some(err) = &t.error {
        let _ = writeln!(s, "  TAP COMMIT FAILED: {err}");
    }
}

/// What every statement of this run says of the root of trust, and the AK's enrolment.
fn render_root_of_trust(s: &mut String, e: &crate::epoch::EpochStatus) {
    use crate::epoch::AkEnrolment;
    use rackwarden_attest::tpm::{ImaSource, RootOfTrust};
    let line = match &e.root_of_trust {
        None => return,
        Some(RootOfTrust::None { reason }) => {
            format!(
                "NONE ({reason}): WARNING: statements stand on the daemon's key alone; a verifier that requires a TPM holds this host"
            )
        }
        Some(RootOfTrust::Tpm {
            tcti,
            vendor,
            ak_name,
            ek_certificate,
            ima,
        }) => format!(
            "TPM {} via {tcti}, AK {}, EK certificate {}, IMA {}",
            vendor.trim(),
            ak_name.get(..16).unwrap_or(ak_name),
            if *ek_certificate { "present" } else { "ABSENT" },
            match ima {
                ImaSource::Measured { list } => format!("from {list}"),
                ImaSource::Unavailable { reason } => format!("UNAVAILABLE ({reason})"),
            }
        ),
    };
    let _ = writeln!(s, "root of trust: {line}");
    if let Some(a) = &e.ak_enrolment {
        let _ = writeln!(
            s,
            "  AK enrolment: {}",
            match a {
                AkEnrolment::Enrolling => "in progress".to_string(),
                AkEnrolment::Enrolled {
                    ak_name,
                    ek_issuer,
                    verifier,
                } => format!(
                    "enrolled ({}..., EK issued by {ek_issuer}) with {verifier}",
                    ak_name.get(..16).unwrap_or(ak_name)
                ),
                AkEnrolment::Failed { error } => format!("FAILED, retried next epoch: {error}"),
            }
        );
    }
}
