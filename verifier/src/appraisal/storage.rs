//! Storage: could state survive the wipe outside memory? The statement's inventory (issue 25)
//! classes every block device, mount and swap area; what is `residue` is writable and
//! persistent. Its sum, recomputed here, must stay within `max_residue_persistent`, and an
//! inventory the host could not read in full is never affirming.

use rackwarden_attest::{statement::Statement, storage::StorageInventory, units::fmt_size};

use super::{FindingCode as C, Judge, Status};

/// Whether the storage aspect is in a verdict: the statement carries an inventory, or the
/// policy requires one.
pub(super) fn in_play(j: &Judge, st: &Statement) -> bool {
    st.predicate.storage.is_some() || j.policy.require_storage_inventory
}

pub(super) fn check(j: &mut Judge, st: &Statement) {
    let Some(inv) = &st.predicate.storage else {
        if j.policy.require_storage_inventory {
            j.add(
                C::StorageUnreported,
                Status::Contraindicated,
                "no storage inventory: disks, swap and persistent filesystems are not accounted for",
            );
        }
        return;
    };
    check_inventory(j, inv);
}

fn check_inventory(j: &mut Judge, inv: &StorageInventory) {
    let recomputed = inv.recomputed_residue();
    if recomputed != inv.residue_bytes {
        j.add(
            C::StorageResidueInconsistent,
            Status::Contraindicated,
            format!(
                "residue claimed {}, the items add up to {}",
                fmt_size(inv.residue_bytes),
                fmt_size(recomputed)
            ),
        );
    }
    for e in inv.erased.iter().filter(|e| e.error.is_some()) {
        j.add(
            C::StorageEraseFailed,
            Status::Warning,
            format!(
                "{}: {}",
                e.device,
                e.error.as_deref().unwrap_or("no detail")
            ),
        );
    }
    if !inv.unreadable.is_empty() {
        j.add(
            C::StorageUnreadable,
            Status::Contraindicated,
            inv.unreadable.join("; "),
        );
    }
    let max = j.policy.max_residue_persistent;
    // Counted as the state bound counts it (one definition: `state_bound`).
    let (counted, items, excluded) = super::state_bound::counted_persistent(j.policy, inv);
    let bytes_of = |i: &rackwarden_attest::storage::ResidueItem| {
        super::state_bound::persistent_bytes(j.policy, i)
    };
    let is_excluded =
        |i: &rackwarden_attest::storage::ResidueItem| j.policy.storage_exclude.contains_key(&i.key);
    if counted > max {
        let mut parts: Vec<String> = items
            .iter()
            .filter(|i| !is_excluded(i) && bytes_of(i) > 0)
            .map(|i| {
                format!(
                    "{}: {}{}",
                    i.label,
                    fmt_size(bytes_of(i)),
                    if i.erased_bytes > 0 {
                        " (erased by key, not credited: root can write the raw device)"
                    } else {
                        ""
                    }
                )
            })
            .collect();
        parts.extend(excluded.iter().map(|(label, bytes, why)| {
            format!("{label}: {} excluded by policy ({why})", fmt_size(*bytes))
        }));
        j.add(
            C::StorageResidue,
            Status::Contraindicated,
            format!(
                "{} of writable persistent storage, the policy allows {}: {}",
                fmt_size(counted),
                fmt_size(max),
                parts.join(", ")
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use rackwarden_attest::{
        schema::example_statement,
        storage::{StorageClass, StorageInventory},
    };

    use super::*;
    use crate::config::VerifierConfig;

    /// The findings under a policy with `max_residue_persistent = max` and `extra` lines.
    fn judge_with(max: &str, extra: &str, inv: Option<StorageInventory>) -> Vec<(C, String)> {
        let text = format!(
            "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nmin_root_of_trust = \"none\"\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\nmax_residue_persistent = \"{max}\"\n{extra}\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n"
        );
        let cfg = VerifierConfig::parse(std::path::Path::new("v.toml"), &text).unwrap();
        let mut st = example_statement();
        st.predicate.storage = inv;
        let mut j = Judge {
            policy: &cfg.policy,
            findings: vec![],
        };
        check(&mut j, &st);
        j.findings.into_iter().map(|f| (f.code, f.detail)).collect()
    }

    fn inventory(residue: u64, claimed: u64) -> StorageInventory {
        let mut inv = example_statement().predicate.storage.unwrap();
        inv.devices[0].class = StorageClass::Residue {
            writable_bytes: residue,
            why: "test".into(),
        };
        inv.unreadable.clear();
        inv.erased.clear();
        inv.residue_bytes = claimed;
        inv
    }

    #[test]
    fn residue_is_judged_on_the_recomputed_sum() {
        assert!(judge_with("1 MiB", "", Some(inventory(1 << 20, 1 << 20))).is_empty());
        let over = judge_with("1 MiB", "", Some(inventory((1 << 20) + 1, (1 << 20) + 1)));
        assert_eq!(over.len(), 1);
        assert_eq!(over[0].0, C::StorageResidue);
        assert!(over[0].1.contains("nvme0n1"), "{}", over[0].1);
        // A host that claims less than its items add up to is caught, and judged on the sum.
        let lie = judge_with("1 MiB", "", Some(inventory(2 << 20, 0)));
        let codes: Vec<C> = lie.iter().map(|f| f.0).collect();
        assert_eq!(
            codes,
            vec![C::StorageResidueInconsistent, C::StorageResidue]
        );
    }

    #[test]
    fn an_erased_class_counts_only_with_a_successful_erase() {
        let mut inv = inventory(0, 0);
        inv.devices[0].class = StorageClass::Erased;
        inv.devices[0].size_bytes = 4 << 20;
        // No erase record: the class is not evidence, its size is residue.
        let f = judge_with("1 MiB", "", Some(inv.clone()));
        assert_eq!(
            f.iter().map(|f| f.0).collect::<Vec<_>>(),
            vec![C::StorageResidueInconsistent, C::StorageResidue]
        );
        let mut erased = example_statement().predicate.storage.unwrap().erased;
        erased[0].device = format!("/dev/{}", inv.devices[0].name);
        erased[0].error = None;
        inv.erased = erased.clone();
        // A successful erase: residue only where the policy does not credit erase by key
        // (the default: root can write the raw device under the mapping).
        let f = judge_with("1 MiB", "", Some(inv.clone()));
        assert_eq!(f.len(), 1, "{f:?}");
        assert!(f[0].1.contains("erased by key, not credited"), "{}", f[0].1);
        assert!(judge_with("1 MiB", "credit_erase_by_key = true", Some(inv.clone())).is_empty());
        // A failed erase is a warning, and the volume is residue.
        erased[0].error = Some("this kernel has no device-mapper".into());
        inv.erased = erased;
        inv.residue_bytes = 4 << 20;
        let f = judge_with("1 MiB", "", Some(inv));
        assert_eq!(
            f.iter().map(|f| f.0).collect::<Vec<_>>(),
            vec![C::StorageEraseFailed, C::StorageResidue]
        );
    }

    #[test]
    fn an_item_the_policy_excludes_is_not_counted_and_still_named() {
        let text = "listen = \"127.0.0.1:7700\"\ninsecure_http = true\ndatabase = \"/tmp/unused.sqlite\"\n\n[policy]\nmin_root_of_trust = \"none\"\nid = \"p\"\nnonce_ttl = \"10 min\"\nmax_wipe_interval = \"15 min\"\nmax_residue_host = \"4 GiB\"\nmax_residue_gpu = \"1 GiB\"\ntrainable_state = \"10 TB\"\nmax_epoch_fraction = 0.01\n\n[policy.storage_exclude]\n\"device:nvme0n1\" = \"the OS image\"\n";
        let cfg = VerifierConfig::parse(std::path::Path::new("v.toml"), text).unwrap();
        let mut st = example_statement();
        let mut inv = inventory(8 << 20, 8 << 20);
        inv.swaps[0].class = StorageClass::Residue {
            writable_bytes: 1 << 20,
            why: "swap".into(),
        };
        inv.residue_bytes = 9 << 20;
        st.predicate.storage = Some(inv);
        let mut j = Judge {
            policy: &cfg.policy,
            findings: vec![],
        };
        check(&mut j, &st);
        assert_eq!(j.findings.len(), 1, "{:?}", j.findings);
        let d = &j.findings[0].detail;
        assert!(d.starts_with("1 MiB of writable persistent storage"), "{d}");
        assert!(
            d.contains("nvme0n1: 8 MiB excluded by policy (the OS image)"),
            "{d}"
        );
        let empty = text.replace("\"the OS image\"", "\" \"");
        let e = VerifierConfig::parse(std::path::Path::new("v.toml"), &empty).unwrap_err();
        assert!(e.to_string().contains("give the reason"), "{e}");
    }

    #[test]
    fn an_incomplete_or_missing_inventory_is_not_affirmed() {
        let mut inv = inventory(0, 0);
        inv.unreadable = vec!["/proc/swaps: permission denied".into()];
        let f = judge_with("0 B", "", Some(inv));
        assert_eq!(f[0].0, C::StorageUnreadable);
        assert!(judge_with("0 B", "", None).is_empty());
        assert_eq!(
            judge_with("0 B", "require_storage_inventory = true", None)[0].0,
            C::StorageUnreported
        );
    }
}
