//! A statement with every field present: what the evidence schema can carry, for whoever
//! must list it (the verifier's disclosure inventory). Built with struct literals that name
//! every field, so a field added to the schema does not compile here until it is added,
//! and every `Option` is `Some` so that it serialises.

use std::collections::BTreeMap;

use crate::{
    evidence::*,
    statement::{
        Challenge, EpochPredicate, GENESIS_PREV, IMAGE_DIGEST, NextKey, Statement, Subject,
    },
    storage::*,
    tpm::{ImaSource, RootOfTrust},
    traffic::{EpochStart, SpoolState, TapDrops, TrafficReport, TrafficRoot, TrafficSummary},
};

pub fn example_statement() -> Statement {
    let hex64 = || "0".repeat(64);
    let counters = LimiterCounters {
        passed_bytes: 0,
        passed_packets: 0,
        dropped_bytes: 0,
        dropped_packets: 0,
        unconfigured_drops: 0,
        contention_drops: 0,
    };
    let limiter = LimiterEvidence {
        attach_kind: AttachKind::Tcx,
        pin_root: "/sys/fs/bpf/rackwarden".into(),
        programs: vec![ProgramIdentity {
            name: "rw_egress".into(),
            id: 1,
            tag: "0".repeat(16),
        }],
        attach_points: vec![AttachPoint {
            interface: "eth0".into(),
            direction: Direction::Egress,
            attached: true,
            foreign_ahead: vec![2],
        }],
        caps: vec![CapInForce {
            direction: Direction::Egress,
            rate_bytes_per_s: 1,
            burst_bytes: 1,
            small_reserve_bytes: 0,
            generation: 1,
        }],
        counters: vec![DirectionCounters {
            direction: Direction::Egress,
            counters,
        }],
        gaps: vec![EnforcementGap {
            kind: GapKind::Detached,
            interface: Some("eth0".into()),
            direction: Some(Direction::Egress),
            last_verified_at_ms: Some(0),
            detected_at_ms: 0,
            detail: String::new(),
            restored: true,
        }],
        bypass: Some(BypassReport {
            refusal: Protection {
                state: ProtectionState::Present,
                detail: String::new(),
                cgroup: Some("/".into()),
                program_id: Some(3),
            },
            refusals: Some(RefusalCounts {
                qdisc_bypass: 0,
                xdp_umem_reg: 0,
                last_tgid: 0,
                last_cgroup_id: 0,
            }),
            rdma_devices: vec!["mlx5_0".into()],
            vfio_devices: vec!["0000:01:00.0".into()],
            uncapped_interfaces: vec!["eth1".into()],
            af_xdp_sockets: Some(0),
        }),
        self_protection: Some(SelfProtection {
            map_writes: ProtectionLevel::Refused,
            detach: ProtectionLevel::Refused,
            foreign_ahead: ProtectionLevel::Refused,
            program_writes: ProtectionLevel::Refused,
            poll_interval_ms: 0,
            sample_interval_ms: 0,
            bpf_lsm_active: true,
            lsm_guard: LsmGuard::Sealed {
                attach: GuardAttach::FmodRet,
                hooks: vec!["bpf".into()],
                bpf_hook_args: 4,
                objects: 1,
                refusals: 0,
                tpm_devices: 0,
                tpm_held_elsewhere: 0,
            },
        }),
    };
    let predicate = EpochPredicate {
        rack_id: "rack".into(),
        host_id: "host".into(),
        seq: 0,
        prev: GENESIS_PREV.into(),
        challenge: Challenge::Nonce { nonce: hex64() },
        epoch_start_unix_ms: 0,
        epoch_end_unix_ms: 0,
        limiter: LimiterReport::Present(Box::new(limiter)),
        wipe: Some(WipeReport {
            nonce: hex64(),
            stream: Some("aes-128-ctr".into()),
            interrupted: false,
            devices: vec![WipeDeviceReport {
                backend: "host".into(),
                device: "ram".into(),
                status: WipeStatus::Complete,
                bytes_total: 0,
                bytes_filled: 0,
                bytes_verified: 0,
                mismatches: 0,
                residue_bytes: 0,
                fill_ms: 0,
                verify_ms: 0,
                detail: Some(String::new()),
            }],
        }),
        images: Some(ImageReport {
            manifest_sha3_256: hex64(),
            images: vec![ImageResult {
                name: "weights.bin".into(),
                size: 0,
                merkle_sha3_256: hex64(),
                ok: true,
                finding: Some(String::new()),
            }],
        }),
        incidents: vec![
            Incident::TornLogTail {
                offset: 0,
                length: 0,
                sha3_256: hex64(),
            },
            Incident::EpochInterrupted {
                seq: 0,
                state: "wiping".into(),
                started_unix_ms: 0,
                detected_unix_ms: 0,
            },
            Incident::VerifierLogInconsistent {
                detected_unix_ms: 0,
                error: String::new(),
                kept_checkpoint: Some(String::new()),
                shown_checkpoint: String::new(),
            },
        ],
        epoch: Some(EpochRun {
            trigger: EpochTrigger::Interval,
            wipe_interval_ms: 0,
            phases: vec![PhaseTime {
                phase: "wipe".into(),
                ms: 0,
            }],
            workloads: WorkloadOutcome::LeftStopped {
                reason: String::new(),
            },
            downtime_ms: 0,
        }),
        producer: ProducerIdentity {
            name: "rackwardend".into(),
            version: "0".into(),
            binary_sha3_256: hex64(),
        },
        next_key: Some(NextKey {
            keyid: hex64(),
            public_key_pem: String::new(),
        }),
        root_of_trust: Some(RootOfTrust::Tpm {
            tcti: String::new(),
            vendor: String::new(),
            ak_name: String::new(),
            ek_certificate: false,
            ima: ImaSource::Measured {
                list: String::new(),
            },
        }),
        storage: Some(StorageInventory {
            devices: vec![BlockDevice {
                name: "nvme0n1".into(),
                size_bytes: 0,
                kind: DeviceKind::Loop {
                    backing_file: Some(String::new()),
                },
                model: Some(String::new()),
                serial: Some(String::new()),
                read_only: false,
                removable: false,
                class: StorageClass::Residue {
                    writable_bytes: 0,
                    why: String::new(),
                },
            }],
            mounts: vec![MountedFs {
                mount_point: "/".into(),
                fs_type: "ext4".into(),
                source: "/dev/nvme0n1".into(),
                read_only: false,
                size_bytes: 0,
                used_bytes: 0,
                class: StorageClass::CountedOn {
                    item: "nvme0n1".into(),
                },
            }],
            swaps: vec![SwapArea {
                path: "/swapfile".into(),
                kind: "file".into(),
                size_bytes: 0,
                used_bytes: 0,
                class: StorageClass::InMemory,
            }],
            swap_turned_off: vec![SwapOff {
                path: "/swapfile".into(),
                error: Some(String::new()),
            }],
            erased: vec![ErasedVolume {
                device: "/dev/nvme1n1".into(),
                mapping: "rw-erase-nvme1n1".into(),
                cipher: "aes-xts-plain64".into(),
                size_bytes: 0,
                mount: Some(String::new()),
                header_sha3_256: Some(hex64()),
                erase_ms: 0,
                error: Some(String::new()),
            }],
            unreadable: vec![String::new()],
            residue_bytes: 0,
        }),
        traffic: Some(TrafficReport::Committed {
            summary: Box::new(TrafficSummary {
                root: TrafficRoot {
                    sha3_256: [0; 32],
                    bytes: [0, 0],
                    records: 0,
                },
                passed: [0, 0],
                unaccounted: [0, 0],
                tap_drops: TapDrops::default(),
                held: [0, 0],
                start: EpochStart::Resumed,
            }),
            spool: SpoolState::Kept { bytes: 0 },
        }),
        openings: vec![crate::traffic::OpeningsRef {
            epoch_seq: 0,
            sha3_256: [0; 32],
        }],
    };
    Statement::new(
        vec![Subject {
            name: "weights.bin".into(),
            digest: BTreeMap::from([(IMAGE_DIGEST.to_string(), hex64())]),
        }],
        predicate,
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_example_is_a_valid_statement() {
        let st = super::example_statement();
        let back = crate::statement::Statement::from_verified(&st.to_json().unwrap()).unwrap();
        assert_eq!(back, st);
    }
}
