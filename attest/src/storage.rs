//! What a host can keep across a wipe besides memory (issue 25): every block device, every
//! mounted filesystem of the host's mount namespace (PID 1's), and every swap area, each
//! with a class that says where its bytes are accounted for. The host wipe counts what it
//! could not overwrite in RAM; this inventory counts what a disk, a swap area or a
//! persistent filesystem could carry from one epoch to the next.
//!
//! Classes are evidence, not guesses: a writable place the daemon cannot account for any
//! other way is `residue` with its size, never left out. Double counting is allowed (a loop
//! device and the disk its backing file lives on are both residue); leaving bytes out is not.

use serde::{Deserialize, Serialize};

/// One statement's view of persistent storage, taken when the statement is signed (after
/// the wipe).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageInventory {
    pub devices: Vec<BlockDevice>,
    pub mounts: Vec<MountedFs>,
    pub swaps: Vec<SwapArea>,
    /// Swap areas the daemon turned off before this epoch's wipe (`[wipe] swap = "off"`).
    pub swap_turned_off: Vec<SwapOff>,
    /// Scratch volumes erased by key this epoch (`[wipe] erase`), failed ones included.
    pub erased: Vec<ErasedVolume>,
    /// What the daemon could not read (a sysfs attribute, the mount table, `/proc/swaps`):
    /// each is a place whose bytes are unknown, so the inventory is incomplete.
    pub unreadable: Vec<String>,
    /// The sum of `writable_bytes` over every item classed `residue`. The verifier
    /// recomputes it.
    pub residue_bytes: u64,
}

impl StorageInventory {
    /// Every item's name and class, devices first.
    pub fn items(&self) -> impl Iterator<Item = (String, &StorageClass)> {
        let devices = self.devices.iter().map(|d| (d.name.clone(), &d.class));
        let mounts = self.mounts.iter().map(|m| (m.label(), &m.class));
        let swaps = self.swaps.iter().map(|s| (s.label(), &s.class));
        devices.chain(mounts).chain(swaps)
    }

    /// The residue recomputed from the items (what `residue_bytes` must equal).
    pub fn recomputed_residue(&self) -> u64 {
        self.residue_items()
            .iter()
            .map(|i| i.bytes)
            .fold(0u64, u64::saturating_add)
    }

    /// Every item that holds residue, with its bytes. A device classed `erased` counts with
    /// its whole size unless this inventory holds a successful erase of it (the class alone
    /// is not evidence); one that was erased has its size in `erased_bytes`, which a policy
    /// that does not credit erase by key counts too.
    pub fn residue_items(&self) -> Vec<ResidueItem> {
        let mut out = Vec::new();
        for d in &self.devices {
            let (bytes, erased_bytes) = match d.class {
                StorageClass::Erased if self.erase_succeeded(&d.name) => (0, d.size_bytes),
                StorageClass::Erased => (d.size_bytes, 0),
                ref c => (c.residue_bytes(), 0),
            };
            out.push(ResidueItem {
                key: format!("device:{}", d.name),
                label: d.name.clone(),
                bytes,
                erased_bytes,
            });
        }
        for m in &self.mounts {
            out.push(ResidueItem {
                key: format!("mount:{}", m.mount_point),
                label: m.label(),
                bytes: m.class.residue_bytes(),
                erased_bytes: 0,
            });
        }
        for w in &self.swaps {
            out.push(ResidueItem {
                key: format!("swap:{}", w.path),
                label: w.label(),
                bytes: w.class.residue_bytes(),
                erased_bytes: 0,
            });
        }
        out.retain(|i| i.bytes > 0 || i.erased_bytes > 0);
        out
    }

    /// Whether a device (kernel name, `vdb`) was erased by key this epoch without an error.
    pub fn erase_succeeded(&self, device_name: &str) -> bool {
        self.erased.iter().any(|e| {
            e.error.is_none()
                && e.header_sha3_256.is_some()
                && e.device.rsplit('/').next() == Some(device_name)
        })
    }
}

/// An item that holds residue: `key` is what a policy names it by (`device:<kernel name>`,
/// `mount:<mount point>`, `swap:<path>`), `label` how a finding shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResidueItem {
    pub key: String,
    pub label: String,
    pub bytes: u64,
    /// A device erased by key this epoch: its size. Erase by key makes what was written
    /// through the mapping unreadable; root can still write the raw device and read it back,
    /// so these bytes are residue unless the policy credits erase by key.
    pub erased_bytes: u64,
}

/// Where an item's bytes are accounted for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case", deny_unknown_fields)]
pub enum StorageClass {
    /// Writable bytes that can survive the wipe, and why the daemon counts them.
    Residue { writable_bytes: u64, why: String },
    /// Held in RAM (tmpfs, ramfs, zram, a RAM disk): its pages are in the host wipe's
    /// residue, which the verifier judges on its own.
    InMemory,
    /// Its bytes live on another item of this inventory and are counted there (a partition
    /// on its disk, a dm or md device on its members, a filesystem on its block device).
    CountedOn { item: String },
    /// Erased by key this epoch: its old contents are ciphertext under a key that no longer
    /// exists (see [`ErasedVolume`]).
    Erased,
    /// Generated by the kernel; holds nothing a workload writes (proc, sysfs, cgroup, ...),
    /// or a device with no medium (an unbound loop device: 0 bytes).
    NoStorage,
}

impl StorageClass {
    pub fn residue_bytes(&self) -> u64 {
        match self {
            StorageClass::Residue { writable_bytes, .. } => *writable_bytes,
            _ => 0,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            StorageClass::Residue { .. } => "residue",
            StorageClass::InMemory => "in_memory",
            StorageClass::CountedOn { .. } => "counted_on",
            StorageClass::Erased => "erased",
            StorageClass::NoStorage => "no_storage",
        }
    }
}

/// A block device as `/sys/class/block` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlockDevice {
    /// The kernel's name (`nvme0n1`, `vda1`, `loop3`, `dm-0`).
    pub name: String,
    pub size_bytes: u64,
    pub kind: DeviceKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// The kernel's read-only flag. Root can clear it (`BLKROSET`), so it does not make a
    /// device's bytes safe by itself.
    pub read_only: bool,
    pub removable: bool,
    pub class: StorageClass,
}

/// What kind of block device it is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum DeviceKind {
    Disk,
    Partition {
        of: String,
    },
    Loop {
        /// `None`: no file is bound.
        backing_file: Option<String>,
    },
    /// A device-mapper device: its name, the target type its uuid names (`CRYPT`, `LVM`,
    /// `VERITY`, ...) where it has one, and its member devices.
    DeviceMapper {
        dm_name: String,
        uuid_prefix: Option<String>,
        members: Vec<String>,
    },
    /// A software RAID (md) device and its members.
    Raid {
        members: Vec<String>,
    },
    Zram,
    /// A RAM disk (`brd`).
    Ram,
    /// Persistent memory (a `pmem` block device, or a device-DAX `daxX.Y`).
    Pmem,
    /// Raw flash (MTD), not a block device: `/sys/class/mtd`.
    Mtd,
}

/// One line of the host's mount table (`/proc/1/mountinfo`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MountedFs {
    pub mount_point: String,
    pub fs_type: String,
    pub source: String,
    /// Mounted read-only (a remount can change it).
    pub read_only: bool,
    /// `statfs`: total and used bytes (0 where the filesystem reports no size).
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub class: StorageClass,
}

impl MountedFs {
    /// How findings and listings name it: `/srv (ext4)`.
    pub fn label(&self) -> String {
        format!("{} ({})", self.mount_point, self.fs_type)
    }
}

/// One line of `/proc/swaps`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapArea {
    pub path: String,
    /// `partition` or `file`, as the kernel says.
    pub kind: String,
    pub size_bytes: u64,
    pub used_bytes: u64,
    pub class: StorageClass,
}

impl SwapArea {
    /// How findings and listings name it: `swap /swapfile`.
    pub fn label(&self) -> String {
        format!("swap {}", self.path)
    }
}

/// A swap area the daemon turned off before the wipe, and how that went.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SwapOff {
    pub path: String,
    /// `None`: it is off. Otherwise the kernel's refusal (it stays on, and is residue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One scratch volume erased by key: closed, re-opened as a plain dm-crypt mapping under a
/// fresh random key, and (with a mount point) given a fresh filesystem.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErasedVolume {
    /// The block device (`/dev/nvme1n1`).
    pub device: String,
    /// The dm-crypt mapping under `/dev/mapper`.
    pub mapping: String,
    pub cipher: String,
    pub size_bytes: u64,
    /// Where the fresh filesystem is mounted, if one is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mount: Option<String>,
    /// SHA3-256 of the first 64 KiB of the raw device after the erase (the new header as
    /// ciphertext); absent when the erase failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub header_sha3_256: Option<String>,
    pub erase_ms: u64,
    /// Why the erase failed (the volume then counts as residue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
