//! What crosses between the parties, derived from the evidence schema so it cannot drift:
//! every field of a statement (from `schema::example_statement`, which names every field)
//! is put in one class by its name. A field no rule classifies is listed as such on the
//! page, and the unit test below fails on it.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;

/// What kind of thing a field discloses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Disclosure {
    /// Names both parties already know: rack, host, interfaces, devices, programs, images.
    Identifier,
    /// SHA3-256 digests and program tags: of images, the manifest, the daemon binary, the
    /// previous statement, damaged log bytes.
    Digest,
    /// The verifier's challenge, echoed back.
    Nonce,
    /// Counts of bytes, packets, blocks and refusals.
    Counter,
    /// Timestamps and durations.
    Time,
    /// Caps, protection levels, states and flags.
    Setting,
    /// Short text the daemon wrote about a failure or a refusal.
    Diagnostic,
}

impl Disclosure {
    pub const ALL: [Disclosure; 7] = [
        Disclosure::Identifier,
        Disclosure::Digest,
        Disclosure::Nonce,
        Disclosure::Counter,
        Disclosure::Time,
        Disclosure::Setting,
        Disclosure::Diagnostic,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Disclosure::Identifier => "identifiers",
            Disclosure::Digest => "digests",
            Disclosure::Nonce => "nonces",
            Disclosure::Counter => "counters",
            Disclosure::Time => "times",
            Disclosure::Setting => "settings and states",
            Disclosure::Diagnostic => "diagnostic text",
        }
    }

    pub fn explain(self) -> &'static str {
        match self {
            Disclosure::Identifier => {
                "names both parties already know (rack, host, interfaces, devices, programs, image file names)"
            }
            Disclosure::Digest => {
                "SHA3-256 digests and kernel program tags: they commit to content without carrying it"
            }
            Disclosure::Nonce => "the verifier's own random challenge, echoed back",
            Disclosure::Counter => "counts of bytes, packets, blocks and refusals",
            Disclosure::Time => "timestamps and durations in milliseconds",
            Disclosure::Setting => "caps, protection levels, states and flags",
            Disclosure::Diagnostic => "a short line the daemon wrote about a failure or refusal",
        }
    }
}

/// The class of a field, by its name (the last path segment, without `[]`).
pub fn classify(leaf: &str) -> Option<Disclosure> {
    use Disclosure::*;
    Some(match leaf {
        "rack_id"
        | "host_id"
        | "interface"
        | "device"
        | "name"
        | "pin_root"
        | "cgroup"
        | "version"
        | "backend"
        | "rdma_devices"
        | "vfio_devices"
        | "uncapped_interfaces"
        | "hooks"
        | "_type"
        | "predicateType"
        | "id"
        | "program_id"
        | "last_tgid"
        | "last_cgroup_id"
        | "stream"
        | "keyid"
        | "public_key_pem"
        | "tcti"
        | "vendor"
        | "ak_name"
        | "list"
        | "model"
        | "serial"
        | "backing_file"
        | "dm_name"
        | "uuid_prefix"
        | "members"
        | "of"
        | "item"
        | "mount_point"
        | "mount"
        | "mapping"
        | "cipher"
        | "fs_type"
        | "source"
        | "path" => Identifier,
        "prev" | "binary_sha3_256" | "tag" | "merkle_sha3_256" | "manifest_sha3_256"
        | "sha3_256" | "header_sha3_256" | "kept_checkpoint" | "shown_checkpoint" => Digest,
        "nonce" => Nonce,
        "passed_bytes" | "passed_packets" | "dropped_bytes" | "dropped_packets"
        | "unconfigured_drops" | "contention_drops" | "bytes_total" | "bytes_filled"
        | "bytes_verified" | "mismatches" | "residue_bytes" | "refusals" | "qdisc_bypass"
        | "xdp_umem_reg" | "af_xdp_sockets" | "objects" | "bpf_hook_args" | "size" | "seq"
        | "offset" | "length" | "generation" | "size_bytes" | "used_bytes" | "writable_bytes"
        | "epoch_seq"
        // The traffic summary's counts: records, and bytes or frames per direction
        // (`{"egress": n, "ingress": n}`).
        | "records" | "bytes" | "egress" | "ingress" => Counter,
        "ms" => Time,
        l if l.ends_with("_ms") => Time,
        "rate_bytes_per_s"
        | "burst_bytes"
        | "small_reserve_bytes"
        | "attach_kind"
        | "attach"
        | "direction"
        | "map_writes"
        | "detach"
        | "program_writes"
        | "foreign_ahead"
        | "bpf_lsm_active"
        | "trigger"
        | "phase"
        | "kind"
        | "state"
        | "attached"
        | "restored"
        | "interrupted"
        | "ok"
        | "level"
        | "ek_certificate"
        | "read_only"
        | "removable"
        | "class"
        | "start"
        | "status" => Setting,
        "detail" | "reason" | "finding" | "why" | "error" | "unreadable" => Diagnostic,
        _ => return None,
    })
}

/// Every leaf path of a JSON value (`predicate.limiter.caps[].burst_bytes`); the keys of a
/// map of digests count as the leaf's name (`subject[].digest.merkle_sha3_256`).
fn leaf_paths(v: &serde_json::Value, at: String, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                leaf_paths(x, p, out);
            }
        }
        serde_json::Value::Array(a) => {
            if a.is_empty() {
                out.insert(format!("{at}[]"));
            }
            for x in a {
                leaf_paths(x, format!("{at}[]"), out);
            }
        }
        _ => {
            out.insert(at);
        }
    }
}

fn leaf_name(path: &str) -> &str {
    path.rsplit('.')
        .next()
        .unwrap_or(path)
        .trim_end_matches("[]")
}

#[derive(Debug, Clone, Serialize)]
pub struct Inventory {
    pub by_class: BTreeMap<Disclosure, Vec<String>>,
    pub unclassified: Vec<String>,
    pub fields: usize,
}

/// The inventory of everything a statement can carry.
pub fn of_schema() -> Inventory {
    let v =
        serde_json::to_value(rackwarden_attest::schema::example_statement()).unwrap_or_default();
    let mut paths = BTreeSet::new();
    leaf_paths(&v, String::new(), &mut paths);
    let mut by_class: BTreeMap<Disclosure, Vec<String>> = BTreeMap::new();
    let mut unclassified = Vec::new();
    for p in &paths {
        match classify(leaf_name(p)) {
            Some(c) => by_class.entry(c).or_default().push(p.clone()),
            None => unclassified.push(p.clone()),
        }
    }
    Inventory {
        by_class,
        unclassified,
        fields: paths.len(),
    }
}

/// What the verifier itself keeps (its database's tables), and what it never has.
pub const VERIFIER_HOLDS: [(&str, &str); 6] = [
    (
        "host public keys",
        "each enrolled host's ed25519 public key (SPKI PEM) and key id, with enrollment and retirement times",
    ),
    (
        "nonces",
        "the challenges it issued: random 32-byte values, for which host, when issued, expired and used",
    ),
    (
        "statements",
        "every statement exactly as received (signed envelopes with the fields listed here) and its verdict",
    ),
    (
        "policy",
        "the agreed caps per rack, intervals, residue limits, the trainable-state size and the accepted digests",
    ),
    (
        "manifest digests",
        "the Merkle SHA3-256 digests of the precommitted images (never the images)",
    ),
    (
        "clearances",
        "who cleared which contraindicated statements, when, and why",
    ),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_field_of_the_schema_is_classified() {
        let inv = of_schema();
        assert!(
            inv.unclassified.is_empty(),
            "fields with no disclosure class: {:?}",
            inv.unclassified
        );
        assert!(inv.fields > 60, "{} fields", inv.fields);
        assert!(inv.by_class[&Disclosure::Nonce].contains(&"predicate.challenge.nonce".into()));
        assert!(
            inv.by_class[&Disclosure::Digest].contains(&"subject[].digest.merkle_sha3_256".into())
        );
    }
}
