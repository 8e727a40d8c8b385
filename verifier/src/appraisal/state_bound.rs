//! The state bound: the most state a rack can hold from one wipe to the next. It is the
//! product's central claim, so it is computed once, here, from each host's last statement and
//! the policy (pure: the same inputs give the same bound, so `recheck` and every reader
//! derive the same number), and both the rack's verdict and its page read it.
//!
//! Per host, from its last statement:
//!
//! | term | from | on whose word |
//! |---|---|---|
//! | host RAM not verified | `wipe.devices[backend = host]`: `total - verified` of a complete wipe, `total` of any other | the daemon's count of RAM; the read-back on the daemon's word, or IMA's proof that the reference daemon ran |
//! | GPU memory not verified | `wipe.devices[backend = gpu]`, the same way | the same, and the GPU driver's count of HBM |
//! | other wiped devices not verified | any other backend (scratch filesystems), the same way | the same |
//! | persistent residue | the storage inventory: writable persistent bytes (erase by key credited only where the policy says so); the operator's `storage_exclude` items are counted too, and named: an exclusion accepts a disk against `max_residue_persistent`, but a disk rebuilt at every boot still holds state from one wipe to the next | the daemon's inventory of disks |
//! | ingress in one epoch | the ingress cap the host reports enforcing x the policy's `max_wipe_interval` | the kernel's policer, read by the daemon |
//! | ingress burst | the ingress bucket's depth | the same |
//!
//! A host whose last statement reports no wipe cannot be bounded: its memory carried
//! everything, and its size is not stated. The rack's bound is then unbounded, never a
//! number that leaves that host out. A host without a storage inventory, where the policy
//! does not require one, is named as such (its disks are not in the bound: the policy chose
//! to accept that).
//!
//! Per rack: the sum over hosts. The policy's limit is `max_epoch_fraction x trainable_state`.

use rackwarden_attest::{
    evidence::{LimiterReport, WipeDeviceReport, WipeStatus},
    statement::Statement,
    storage::{ResidueItem, StorageInventory},
    units::fmt_size,
};
use serde::Serialize;

use crate::config::Policy;

/// One host's terms of the bound.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HostTerms {
    pub host: String,
    /// `None`: the host's last statement reports no wipe, so its memory is not bounded.
    pub memory: Option<MemoryTerms>,
    pub persistent: PersistentTerm,
    /// Ingress cap (bytes/s) the host reports enforcing; 0 where it reports no limiter.
    pub ingress_cap_bytes_per_s: u64,
    /// The ingress cap over one epoch (`max_wipe_interval`).
    pub ingress_per_epoch_bytes: u64,
    pub ingress_burst_bytes: u64,
}

/// Memory the host's last wipe did not cover.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MemoryTerms {
    pub host_ram_unverified_bytes: u64,
    pub gpu_unverified_bytes: u64,
    /// Other wiped devices (scratch filesystems).
    pub other_unverified_bytes: u64,
}

/// Writable persistent storage.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum PersistentTerm {
    /// Every writable persistent byte; `excluded` are the items the operator excluded from
    /// `max_residue_persistent` (label, bytes, reason), included in `bytes` and named.
    Counted {
        bytes: u64,
        excluded: Vec<(String, u64, String)>,
    },
    /// No storage inventory in the statement, and the policy does not require one.
    NotReported,
}

impl HostTerms {
    /// The host's bound in bytes; `None` when it cannot be bounded.
    pub fn total_bytes(&self) -> Option<u64> {
        let m = self.memory?;
        let persistent = match &self.persistent {
            PersistentTerm::Counted { bytes, .. } => *bytes,
            PersistentTerm::NotReported => 0,
        };
        Some(
            [
                m.host_ram_unverified_bytes,
                m.gpu_unverified_bytes,
                m.other_unverified_bytes,
                persistent,
                self.ingress_per_epoch_bytes,
                self.ingress_burst_bytes,
            ]
            .into_iter()
            .fold(0u64, u64::saturating_add),
        )
    }

    /// Each named term with its bytes (for the page and the finding).
    pub fn terms(&self) -> Vec<(&'static str, u64)> {
        let mut out = Vec::new();
        if let Some(m) = self.memory {
            out.push(("host RAM not verified", m.host_ram_unverified_bytes));
            out.push(("GPU memory not verified", m.gpu_unverified_bytes));
            out.push(("other wiped devices not verified", m.other_unverified_bytes));
        }
        if let PersistentTerm::Counted { bytes, .. } = &self.persistent {
            out.push(("persistent residue", *bytes));
        }
        out.push(("ingress cap x epoch", self.ingress_per_epoch_bytes));
        out.push(("ingress burst", self.ingress_burst_bytes));
        out
    }
}

/// The rack's bound against the policy.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StateBound {
    pub hosts: Vec<HostTerms>,
    /// The sum over hosts; `None` when a host cannot be bounded.
    pub total_bytes: Option<u64>,
    /// `max_epoch_fraction x trainable_state`.
    pub limit_bytes: u64,
    pub epoch_s: f64,
}

impl StateBound {
    pub fn exceeded(&self) -> bool {
        self.total_bytes.is_none_or(|t| t > self.limit_bytes)
    }

    /// The bound as a fraction of the trainable state (`None`: unbounded).
    pub fn fraction_of(&self, trainable_state_bytes: u64) -> Option<f64> {
        self.total_bytes
            .map(|t| t as f64 / trainable_state_bytes.max(1) as f64)
    }

    /// The rack's finding when the bound exceeds the policy: the total, the limit, and the
    /// largest terms by host, so an operator sees at once what to change.
    pub fn finding(&self) -> Option<String> {
        if !self.exceeded() {
            return None;
        }
        let unbounded: Vec<&str> = self
            .hosts
            .iter()
            .filter(|h| h.memory.is_none())
            .map(|h| h.host.as_str())
            .collect();
        if !unbounded.is_empty() {
            return Some(format!(
                "state bound: unbounded: the last statement of {} reports no wipe, so its memory carries everything (the policy allows {})",
                unbounded.join(", "),
                fmt_size(self.limit_bytes)
            ));
        }
        let mut terms: Vec<(String, u64)> = self
            .hosts
            .iter()
            .flat_map(|h| {
                h.terms()
                    .into_iter()
                    .filter(|(_, b)| *b > 0)
                    .map(|(name, b)| (format!("{}: {name}", h.host), b))
            })
            .collect();
        terms.sort_by_key(|t| std::cmp::Reverse(t.1));
        let largest: Vec<String> = terms
            .iter()
            .take(3)
            .map(|(name, b)| format!("{name} {}", fmt_size(*b)))
            .collect();
        Some(format!(
            "state bound: {} can be held from one wipe to the next, above the policy's {} (max_epoch_fraction x trainable_state); largest terms: {}",
            fmt_size(self.total_bytes.unwrap_or(u64::MAX)),
            fmt_size(self.limit_bytes),
            largest.join(", ")
        ))
    }
}

/// The persistent bytes the policy counts, and the operator's exclusions: what the storage
/// aspect judges against `max_residue_persistent` and what the bound adds.
pub(crate) fn counted_persistent(
    policy: &Policy,
    inv: &StorageInventory,
) -> (u64, Vec<ResidueItem>, Vec<(String, u64, String)>) {
    let items = inv.residue_items();
    let bytes_of = |i: &ResidueItem| persistent_bytes(policy, i);
    let counted = items
        .iter()
        .filter(|i| !policy.storage_exclude.contains_key(&i.key))
        .map(bytes_of)
        .fold(0u64, u64::saturating_add);
    let excluded = items
        .iter()
        .filter_map(|i| {
            policy
                .storage_exclude
                .get(&i.key)
                .map(|why| (i.label.clone(), bytes_of(i), why.clone()))
        })
        .collect();
    (counted, items, excluded)
}

/// An item's bytes as the policy counts them: erase by key is credited only where the policy
/// says raw devices are out of reach.
pub(crate) fn persistent_bytes(policy: &Policy, i: &ResidueItem) -> u64 {
    if policy.credit_erase_by_key {
        i.bytes
    } else {
        i.bytes.saturating_add(i.erased_bytes)
    }
}

/// What a device's wipe did not verify: `total - verified` of a complete wipe with no
/// mismatch, the whole device otherwise (an interrupted, failed or mismatching wipe proves
/// nothing of what it covered).
fn unverified(d: &WipeDeviceReport) -> u64 {
    match d.status {
        WipeStatus::Complete if d.mismatches == 0 => d.bytes_total.saturating_sub(d.bytes_verified),
        WipeStatus::Absent => 0,
        _ => d.bytes_total,
    }
}

/// One host's terms from its last statement (`None`: the host has no statement yet, and
/// adds nothing: silence is judged elsewhere).
pub fn host_terms(policy: &Policy, host: &str, st: &Statement) -> HostTerms {
    let p = &st.predicate;
    let memory = p.wipe.as_ref().map(|w| {
        let sum = |pick: fn(&str) -> bool| {
            w.devices
                .iter()
                .filter(|d| pick(&d.backend))
                .map(unverified)
                .fold(0u64, u64::saturating_add)
        };
        MemoryTerms {
            host_ram_unverified_bytes: sum(|b| b == "host"),
            gpu_unverified_bytes: sum(|b| b == "gpu"),
            other_unverified_bytes: sum(|b| b != "host" && b != "gpu"),
        }
    });
    let persistent = match &p.storage {
        Some(inv) => {
            let (counted, _, excluded) = counted_persistent(policy, inv);
            let bytes = excluded
                .iter()
                .map(|(_, b, _)| *b)
                .fold(counted, u64::saturating_add);
            PersistentTerm::Counted { bytes, excluded }
        }
        None => PersistentTerm::NotReported,
    };
    let (cap, burst) = match &p.limiter {
        LimiterReport::Present(e) => e
            .caps
            .iter()
            .find(|c| c.direction.name() == "ingress")
            .map_or((0, 0), |c| (c.rate_bytes_per_s, c.burst_bytes)),
        _ => (0, 0),
    };
    let epoch_ms = u64::try_from(policy.max_wipe_interval.as_millis()).unwrap_or(u64::MAX);
    let per_epoch =
        u64::try_from(u128::from(cap) * u128::from(epoch_ms) / 1000).unwrap_or(u64::MAX);
    HostTerms {
        host: host.to_string(),
        memory,
        persistent,
        ingress_cap_bytes_per_s: cap,
        ingress_per_epoch_bytes: per_epoch,
        ingress_burst_bytes: burst,
    }
}

/// The rack's bound from its hosts' terms.
pub fn rack(policy: &Policy, hosts: Vec<HostTerms>) -> StateBound {
    let total = hosts
        .iter()
        .map(HostTerms::total_bytes)
        .try_fold(0u64, |acc, t| t.map(|t| acc.saturating_add(t)));
    let limit = policy.max_epoch_fraction * policy.trainable_state_bytes as f64;
    StateBound {
        hosts,
        total_bytes: total,
        // The policy's fraction of the state, floored: a bound equal to it passes.
        limit_bytes: if limit >= u64::MAX as f64 {
            u64::MAX
        } else {
            limit as u64
        },
        epoch_s: policy.max_wipe_interval.as_secs_f64(),
    }
}

#[cfg(test)]
mod tests {
    use rackwarden_attest::{
        evidence::{WipeDeviceReport, WipeReport, WipeStatus},
        schema::example_statement,
        storage::{StorageClass, StorageInventory},
    };

    use super::*;
    use crate::config::VerifierConfig;

    fn policy(extra: &str) -> Policy {
        let text = format!(
            "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nmin_root_of_trust = \"none\"\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n{extra}"
        );
        VerifierConfig::parse(std::path::Path::new("v.toml"), &text)
            .unwrap()
            .policy
    }

    fn device(backend: &str, status: WipeStatus, total: u64, verified: u64) -> WipeDeviceReport {
        WipeDeviceReport {
            backend: backend.into(),
            device: format!("{backend}0"),
            status,
            bytes_total: total,
            bytes_filled: verified,
            bytes_verified: verified,
            mismatches: 0,
            residue_bytes: total - verified,
            fill_ms: 1,
            verify_ms: 1,
            detail: None,
        }
    }

    fn statement(devices: Vec<WipeDeviceReport>, persistent: u64) -> Statement {
        let mut st = example_statement();
        st.predicate.wipe = Some(WipeReport {
            nonce: "00".repeat(32),
            stream: None,
            interrupted: false,
            devices,
        });
        let mut inv: StorageInventory = st.predicate.storage.clone().unwrap();
        inv.devices.truncate(1);
        inv.devices[0].class = StorageClass::Residue {
            writable_bytes: persistent,
            why: "the OS disk".into(),
        };
        inv.unreadable.clear();
        inv.erased.clear();
        inv.residue_bytes = persistent;
        st.predicate.storage = Some(inv);
        st
    }

    /// The example rack of the README: 8 hosts, each 2 TB of RAM with 4 GiB unwiped, 8 GPUs
    /// of 141 GB with 1 GiB each unwiped, no writable disk, 10 MB/s of ingress for the rack
    /// over a 15 min epoch.
    #[test]
    fn a_realistic_rack_adds_every_residue_term() {
        let p = policy("");
        let mut devices = vec![device(
            "host",
            WipeStatus::Complete,
            2_000_000_000_000,
            2_000_000_000_000 - (4 << 30),
        )];
        for _ in 0..8 {
            devices.push(device(
                "gpu",
                WipeStatus::Complete,
                141_000_000_000,
                141_000_000_000 - (1 << 30),
            ));
        }
        let st = statement(devices, 0);
        let t = host_terms(&p, "h", &st);
        let m = t.memory.unwrap();
        assert_eq!(
            (m.host_ram_unverified_bytes, m.gpu_unverified_bytes),
            (4 << 30, 8 << 30)
        );
        let cap = t.ingress_cap_bytes_per_s;
        assert_eq!(t.ingress_per_epoch_bytes, cap * 900);
        assert_eq!(
            t.total_bytes(),
            Some((12u64 << 30) + cap * 900 + t.ingress_burst_bytes)
        );
        let rack = rack(&p, vec![t.clone(); 8]);
        assert_eq!(rack.total_bytes, Some(8 * t.total_bytes().unwrap()));
        assert_eq!(rack.limit_bytes, 100_000_000_000);
    }

    #[test]
    fn an_incomplete_wipe_counts_the_whole_device_and_no_wipe_is_unbounded() {
        let p = policy("");
        let st = statement(
            vec![
                device("host", WipeStatus::Interrupted, 64 << 30, 60 << 30),
                device("gpu", WipeStatus::Absent, 0, 0),
                device("scratch", WipeStatus::Complete, 10 << 30, 9 << 30),
            ],
            0,
        );
        let m = host_terms(&p, "h", &st).memory.unwrap();
        assert_eq!(
            (
                m.host_ram_unverified_bytes,
                m.gpu_unverified_bytes,
                m.other_unverified_bytes
            ),
            (64 << 30, 0, 1 << 30)
        );
        let mut none = st.clone();
        none.predicate.wipe = None;
        let b = rack(
            &p,
            vec![host_terms(&p, "h1", &st), host_terms(&p, "h2", &none)],
        );
        assert_eq!(b.total_bytes, None);
        assert!(b.exceeded());
        assert!(
            b.finding()
                .unwrap()
                .contains("unbounded: the last statement of h2 reports no wipe")
        );
    }

    #[test]
    fn persistent_residue_is_counted_as_the_storage_aspect_counts_it() {
        let st = statement(
            vec![device("host", WipeStatus::Complete, 1 << 30, 1 << 30)],
            200_000_000_000,
        );
        let counted = host_terms(&policy(""), "h", &st);
        assert!(
            matches!(counted.persistent, PersistentTerm::Counted { bytes: 200_000_000_000, ref excluded } if excluded.is_empty())
        );
        let b = rack(&policy(""), vec![counted]);
        let f = b.finding().unwrap();
        assert!(
            f.contains("largest terms: h: persistent residue 200 GB"),
            "{f}"
        );
        // An operator's exclusion is named with its reason and still counted: the disk holds
        // state between wipes whatever the policy accepts against max_residue_persistent.
        let name = &st.predicate.storage.as_ref().unwrap().devices[0].name;
        let excluding = policy(&format!(
            "[policy.storage_exclude]\n\"device:{name}\" = \"rebuilt at every boot\"\n"
        ));
        let t = host_terms(&excluding, "h", &st);
        match &t.persistent {
            PersistentTerm::Counted { bytes, excluded } => {
                assert_eq!(*bytes, 200_000_000_000);
                assert_eq!(
                    excluded,
                    &vec![(
                        name.clone(),
                        200_000_000_000,
                        "rebuilt at every boot".to_string()
                    )]
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(rack(&excluding, vec![t]).exceeded());
        // No inventory (and the policy requires none): named, not counted.
        let mut bare = st.clone();
        bare.predicate.storage = None;
        assert_eq!(
            host_terms(&policy(""), "h", &bare).persistent,
            PersistentTerm::NotReported
        );
    }
}
