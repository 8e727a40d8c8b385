//! The storage inventory: every block device (`/sys/class/block`), every mount of the host's
//! mount namespace (`/proc/1/mountinfo`, so a daemon in a private namespace of its unit still
//! sees the host's), every swap area (`/proc/swaps`), with sizes from sysfs and `statfs`.
//!
//! How each item is classed (the rules the README's "what a wipe covers" states):
//! - a partition is counted on its disk; a device-mapper or md device on its members;
//! - a filesystem on a block device is counted on that device;
//! - zram and RAM disks, tmpfs, ramfs, devtmpfs, hugetlbfs, mqueue and bpf are in memory
//!   (their pages are in the host wipe's residue);
//! - proc, sysfs, cgroup and the other kernel-generated filesystems hold no storage, nor does
//!   a device of 0 bytes (an unbound loop device);
//! - everything else is residue with its size: a disk (its read-only flag reported, but root
//!   can clear it), a bound loop device (also when its file's disk is counted: double
//!   counting is allowed, leaving bytes out is not), persistent memory, a swap area other
//!   than zram, and any filesystem not on a block device of this host (overlay, btrfs's
//!   anonymous devices, NFS, FUSE, 9p, virtiofs, efivarfs, pstore) with its `statfs` size.
//!
//! It is a snapshot taken when the statement is signed: a device attached and detached
//! between two statements is not in either. What cannot be read is listed as unreadable,
//! and the verifier does not affirm an incomplete inventory.

use std::path::Path;

use rackwarden_attest::storage::{
    BlockDevice, DeviceKind, ErasedVolume, MountedFs, StorageClass, StorageInventory, SwapArea,
    SwapOff,
};

pub const SYS_CLASS_BLOCK: &str = "/sys/class/block";
pub const SYS_DEV_BLOCK: &str = "/sys/dev/block";
/// PID 1's mount table: the host's namespace, whatever namespace the daemon runs in.
pub const HOST_MOUNTINFO: &str = "/proc/1/mountinfo";
/// PID 1's root: `statfs` of a host mount point through it.
pub const HOST_ROOT: &str = "/proc/1/root";
pub const PROC_SWAPS: &str = "/proc/swaps";
/// Device-DAX persistent memory and raw flash: storage that is not a block device.
pub const SYS_BUS_DAX: &str = "/sys/bus/dax/devices";
pub const SYS_CLASS_MTD: &str = "/sys/class/mtd";

/// Filesystems whose pages live in RAM.
const IN_MEMORY_FS: &[&str] = &[
    "tmpfs",
    "ramfs",
    "rootfs",
    "devtmpfs",
    "hugetlbfs",
    "mqueue",
    "bpf",
];

/// Filesystems the kernel generates, which hold nothing a workload writes.
const KERNEL_FS: &[&str] = &[
    "proc",
    "sysfs",
    "cgroup",
    "cgroup2",
    "devpts",
    "securityfs",
    "debugfs",
    "tracefs",
    "configfs",
    "fusectl",
    "binfmt_misc",
    "autofs",
    "nsfs",
    "selinuxfs",
    "rpc_pipefs",
    "nfsd",
];

/// What the epoch did to storage before the inventory is taken.
#[derive(Debug, Clone, Default)]
pub struct EpochStorage {
    pub swap_turned_off: Vec<SwapOff>,
    pub erased: Vec<ErasedVolume>,
}

/// The inventory of this host, with what this epoch turned off and erased.
pub fn take(done: EpochStorage) -> StorageInventory {
    let class_block = Path::new(SYS_CLASS_BLOCK);
    let mut unreadable = Vec::new();
    let mut devices = block_devices(class_block, &mut unreadable);
    devices.extend(char_storage(&mut unreadable));
    let mounts = mounts(&mut unreadable);
    let (swaps, swap_errors) = swap_lines(PROC_SWAPS);
    unreadable.extend(swap_errors);
    let mut inv = StorageInventory {
        devices: vec![],
        mounts,
        swaps,
        swap_turned_off: done.swap_turned_off,
        erased: done.erased,
        unreadable,
        residue_bytes: 0,
    };
    // A device erased by key this epoch (and only one whose erase succeeded) is `erased`.
    for d in &mut devices {
        if inv.erase_succeeded(&d.name) {
            d.class = StorageClass::Erased;
        }
    }
    inv.devices = devices;
    inv.residue_bytes = inv.recomputed_residue();
    inv
}

/// A block device's size in bytes from its sysfs directory (`size` counts 512-byte sectors
/// whatever the device's block size); `None` where it cannot be read.
pub fn sysfs_size_bytes(dir: &Path) -> Option<u64> {
    read_trimmed(&dir.join("size"))?
        .parse::<u64>()
        .ok()
        .map(|sectors| sectors.saturating_mul(512))
}

fn read_trimmed(p: &Path) -> Option<String> {
    std::fs::read_to_string(p)
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
}

fn flag(p: &Path) -> bool {
    read_trimmed(p).as_deref() == Some("1")
}

/// The names in a sysfs directory (`slaves/`), sorted; none where it does not exist.
fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

fn block_devices(class_block: &Path, unreadable: &mut Vec<String>) -> Vec<BlockDevice> {
    let mut names = match std::fs::read_dir(class_block) {
        Ok(rd) => rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect::<Vec<_>>(),
        Err(e) => {
            unreadable.push(format!("{}: {e}", class_block.display()));
            return vec![];
        }
    };
    names.sort();
    names
        .into_iter()
        .map(|name| block_device(&class_block.join(&name), name, unreadable))
        .collect()
}

fn block_device(dir: &Path, name: String, unreadable: &mut Vec<String>) -> BlockDevice {
    let size_bytes = sysfs_size_bytes(dir).unwrap_or_else(|| {
        unreadable.push(format!("{}/size: not a sector count", dir.display()));
        0
    });
    let kind = device_kind(dir, &name);
    let read_only = flag(&dir.join("ro"));
    let class = device_class(&kind, size_bytes, read_only);
    BlockDevice {
        model: read_trimmed(&dir.join("device/model")),
        serial: read_trimmed(&dir.join("serial"))
            .or_else(|| read_trimmed(&dir.join("device/serial"))),
        read_only,
        removable: flag(&dir.join("removable")),
        name,
        size_bytes,
        kind,
        class,
    }
}

fn device_kind(dir: &Path, name: &str) -> DeviceKind {
    if dir.join("partition").exists() {
        // /sys/class/block/vda1 -> .../block/vda/vda1: the disk is the parent directory.
        let of = std::fs::canonicalize(dir)
            .ok()
            .and_then(|p| p.parent().and_then(|d| d.file_name()).map(|n| n.to_owned()))
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        return DeviceKind::Partition { of };
    }
    if dir.join("dm").is_dir() {
        return DeviceKind::DeviceMapper {
            dm_name: read_trimmed(&dir.join("dm/name")).unwrap_or_default(),
            uuid_prefix: read_trimmed(&dir.join("dm/uuid"))
                .and_then(|u| u.split('-').next().map(str::to_string))
                .filter(|p| !p.is_empty()),
            members: names_in(&dir.join("slaves")),
        };
    }
    if dir.join("md").is_dir() {
        return DeviceKind::Raid {
            members: names_in(&dir.join("slaves")),
        };
    }
    if name.starts_with("loop") {
        return DeviceKind::Loop {
            backing_file: read_trimmed(&dir.join("loop/backing_file")),
        };
    }
    if name.starts_with("zram") {
        DeviceKind::Zram
    } else if name.starts_with("ram") {
        DeviceKind::Ram
    } else if name.starts_with("pmem") {
        DeviceKind::Pmem
    } else {
        DeviceKind::Disk
    }
}

fn device_class(kind: &DeviceKind, size_bytes: u64, read_only: bool) -> StorageClass {
    if size_bytes == 0 {
        return StorageClass::NoStorage;
    }
    let ro = if read_only {
        " (its read-only flag is set, but root can clear it)"
    } else {
        ""
    };
    match kind {
        DeviceKind::Partition { of } if !of.is_empty() => {
            StorageClass::CountedOn { item: of.clone() }
        }
        DeviceKind::DeviceMapper { members, .. } | DeviceKind::Raid { members }
            if !members.is_empty() =>
        {
            StorageClass::CountedOn {
                item: members.join("+"),
            }
        }
        DeviceKind::Zram | DeviceKind::Ram => StorageClass::InMemory,
        DeviceKind::Loop { backing_file } => StorageClass::Residue {
            writable_bytes: size_bytes,
            why: format!(
                "a loop device over {}{ro}: writable, and not proven read-only",
                backing_file.as_deref().unwrap_or("an unknown file")
            ),
        },
        DeviceKind::Pmem => StorageClass::Residue {
            writable_bytes: size_bytes,
            why: format!("persistent memory{ro}"),
        },
        _ => StorageClass::Residue {
            writable_bytes: size_bytes,
            why: format!("a block device{ro}: writable, and not proven read-only"),
        },
    }
}

/// Writable storage that is not a block device: device-DAX persistent memory
/// (`/sys/bus/dax/devices/daxX.Y/size`) and raw flash (`/sys/class/mtd/mtdN/size`), both
/// sized in bytes; none where the kernel has neither.
fn char_storage(unreadable: &mut Vec<String>) -> Vec<BlockDevice> {
    let mut out = Vec::new();
    for (dir, kind, what) in [
        (
            Path::new(SYS_BUS_DAX),
            DeviceKind::Pmem,
            "device-DAX persistent memory",
        ),
        (Path::new(SYS_CLASS_MTD), DeviceKind::Mtd, "raw flash (MTD)"),
    ] {
        for name in names_in(dir) {
            // mtdNro is the read-only alias of mtdN: the same flash, counted once.
            if name.ends_with("ro") {
                continue;
            }
            let size_bytes = match read_trimmed(&dir.join(&name).join("size")).map(|s| s.parse()) {
                Some(Ok(b)) => b,
                _ => {
                    unreadable.push(format!("{}/{name}/size: not a byte count", dir.display()));
                    0
                }
            };
            out.push(BlockDevice {
                name,
                size_bytes,
                kind: kind.clone(),
                model: None,
                serial: None,
                read_only: false,
                removable: false,
                class: if size_bytes == 0 {
                    StorageClass::NoStorage
                } else {
                    StorageClass::Residue {
                        writable_bytes: size_bytes,
                        why: format!("{what}: writable, outside the wipe"),
                    }
                },
            });
        }
    }
    out
}

/// Undoes the kernel's octal escapes (`\040` for a space) in mountinfo and /proc/swaps.
pub fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') as u32 * 64
                + (b[i + 2] - b'0') as u32 * 8
                + (b[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One mountinfo line's fields we use.
#[derive(Debug, PartialEq, Eq)]
pub struct MountLine {
    pub major: u32,
    pub minor: u32,
    pub mount_point: String,
    pub read_only: bool,
    pub fs_type: String,
    pub source: String,
}

/// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
/// (proc(5)): the optional fields end at the lone `-`.
pub fn parse_mountinfo_line(line: &str) -> Option<MountLine> {
    let fields: Vec<&str> = line.split(' ').collect();
    let sep = fields.iter().position(|f| *f == "-")?;
    if sep < 6 || fields.len() < sep + 3 {
        return None;
    }
    let (major, minor) = fields[2].split_once(':')?;
    let super_ro = fields
        .get(sep + 3)
        .is_some_and(|o| o.split(',').any(|x| x == "ro"));
    Some(MountLine {
        major: major.parse().ok()?,
        minor: minor.parse().ok()?,
        mount_point: unescape(fields[4]),
        read_only: fields[5].split(',').any(|x| x == "ro") || super_ro,
        fs_type: fields[sep + 1].to_string(),
        source: unescape(fields[sep + 2]),
    })
}

fn mounts(unreadable: &mut Vec<String>) -> Vec<MountedFs> {
    let mountinfo = Path::new(HOST_MOUNTINFO);
    let text = match std::fs::read_to_string(mountinfo) {
        Ok(t) => t,
        Err(e) => {
            unreadable.push(format!("{}: {e}", mountinfo.display()));
            return vec![];
        }
    };
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let Some(m) = parse_mountinfo_line(line) else {
            unreadable.push(format!(
                "{} line {}: not a mountinfo line: {line}",
                mountinfo.display(),
                n + 1
            ));
            continue;
        };
        out.push(mounted_fs(m, unreadable));
    }
    out
}

fn mounted_fs(m: MountLine, unreadable: &mut Vec<String>) -> MountedFs {
    let device = (m.major != 0)
        .then(|| Path::new(SYS_DEV_BLOCK).join(format!("{}:{}", m.major, m.minor)))
        .and_then(|link| std::fs::canonicalize(link).ok())
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let kernel_fs = KERNEL_FS.contains(&m.fs_type.as_str());
    // Kernel filesystems are not asked for a size: nothing is stored there, and a statfs of
    // an automount point would mount it.
    let (size_bytes, used_bytes, statfs_error) = if kernel_fs {
        (0, 0, None)
    } else {
        match fs_size(Path::new(HOST_ROOT), &m) {
            Ok((s, u)) => (s, u, None),
            Err(e) => (0, 0, Some(e)),
        }
    };
    let class = if let Some(item) = device {
        StorageClass::CountedOn { item }
    } else if IN_MEMORY_FS.contains(&m.fs_type.as_str()) {
        StorageClass::InMemory
    } else if kernel_fs {
        StorageClass::NoStorage
    } else {
        if let Some(e) = &statfs_error {
            unreadable.push(format!("statfs {}: {e}", m.mount_point));
        }
        StorageClass::Residue {
            writable_bytes: size_bytes,
            why: format!(
                "{} from {}, not on a block device of this host{}",
                m.fs_type,
                m.source,
                if m.read_only {
                    " (mounted read-only, but root can remount it)"
                } else {
                    ""
                }
            ),
        }
    };
    MountedFs {
        mount_point: m.mount_point,
        fs_type: m.fs_type,
        source: m.source,
        read_only: m.read_only,
        size_bytes,
        used_bytes,
        class,
    }
}

/// Why a mounted filesystem's size could not be read.
#[derive(Debug, thiserror::Error)]
enum FsSizeError {
    #[error("{}: {source}", path.display())]
    Statfs {
        path: std::path::PathBuf,
        source: nix::errno::Errno,
    },
    #[error(
        "neither {} nor {mount_point} is the mounted filesystem {major}:{minor} (another mount hides it, or PID 1's root cannot be entered)",
        through_root.display()
    )]
    NotThere {
        through_root: std::path::PathBuf,
        mount_point: String,
        major: u32,
        minor: u32,
    },
}

/// Total and used bytes of the filesystem a mountinfo line names, at its mount point in the
/// host's namespace (through PID 1's root) or, where that cannot be entered, in the daemon's
/// own. Either path counts only if it is that filesystem (its `st_dev` is the line's
/// `major:minor`): a mount stacked over it, or a different mount in the daemon's namespace,
/// would report another filesystem's size.
fn fs_size(root: &Path, m: &MountLine) -> Result<(u64, u64), FsSizeError> {
    let want = libc::makedev(m.major, m.minor);
    let through_root = root.join(m.mount_point.trim_start_matches('/'));
    for path in [through_root.as_path(), Path::new(&m.mount_point)] {
        let Ok(st) = nix::sys::stat::stat(path) else {
            continue;
        };
        if st.st_dev != want {
            continue;
        }
        let fs = nix::sys::statfs::statfs(path).map_err(|source| FsSizeError::Statfs {
            path: path.to_owned(),
            source,
        })?;
        let bs = fs.block_size() as u64;
        let total = (fs.blocks() as u64).saturating_mul(bs);
        let free = (fs.blocks_free() as u64).saturating_mul(bs);
        return Ok((total, total.saturating_sub(free)));
    }
    Err(FsSizeError::NotThere {
        through_root,
        mount_point: m.mount_point.clone(),
        major: m.major,
        minor: m.minor,
    })
}

/// The swap areas of a `/proc/swaps` file, and what could not be read of it.
pub fn swap_lines(path: impl AsRef<Path>) -> (Vec<SwapArea>, Vec<String>) {
    let path = path.as_ref();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => return (vec![], vec![format!("{}: {e}", path.display())]),
    };
    let mut areas = Vec::new();
    let mut errors = Vec::new();
    // The first line is the header.
    for (n, line) in text.lines().enumerate().skip(1) {
        match parse_swap_line(line) {
            Some(a) => areas.push(a),
            None => errors.push(format!(
                "{} line {}: not a swap line: {line}",
                path.display(),
                n + 1
            )),
        }
    }
    (areas, errors)
}

/// `/swapfile  file  1048572  0  -2`: sizes in KiB.
pub fn parse_swap_line(line: &str) -> Option<SwapArea> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 4 {
        return None;
    }
    let path = unescape(f[0]);
    let size_bytes = f[2].parse::<u64>().ok()?.saturating_mul(1024);
    let used_bytes = f[3].parse::<u64>().ok()?.saturating_mul(1024);
    // Only a zram device itself is in memory, not a file that happens to live under a
    // directory of that name.
    let zram = f[1] == "partition"
        && path
            .strip_prefix("/dev/zram")
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    let class = if zram {
        StorageClass::InMemory
    } else {
        StorageClass::Residue {
            writable_bytes: size_bytes,
            why: "swap: any process's pages can be written here and read back after the wipe \
                  (`[wipe] swap = \"off\"` turns it off before each wipe)"
                .into(),
        }
    };
    Some(SwapArea {
        path,
        kind: f[1].to_string(),
        size_bytes,
        used_bytes,
        class,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_optional_fields_and_escapes() {
        let m = parse_mountinfo_line(
            "36 35 98:0 /mnt1 /mnt\\0402 rw,noatime master:1 shared:2 - ext3 /dev/root rw,errors=continue",
        )
        .unwrap();
        assert_eq!(
            m,
            MountLine {
                major: 98,
                minor: 0,
                mount_point: "/mnt 2".into(),
                read_only: false,
                fs_type: "ext3".into(),
                source: "/dev/root".into(),
            }
        );
        let ro = parse_mountinfo_line("1 0 0:5 / /ro ro - squashfs none ro").unwrap();
        assert!(ro.read_only);
        assert_eq!(parse_mountinfo_line("garbage"), None);
        assert_eq!(parse_mountinfo_line("1 2 x:y / / rw - ext4 a rw"), None);
    }

    #[test]
    fn swap_lines_are_residue_unless_zram() {
        let a = parse_swap_line("/swap\\040file file 1048572 4 -2").unwrap();
        assert_eq!(a.path, "/swap file");
        assert_eq!(a.size_bytes, 1048572 * 1024);
        assert_eq!(a.used_bytes, 4096);
        assert_eq!(a.class.residue_bytes(), 1048572 * 1024);
        let z = parse_swap_line("/dev/zram0 partition 4194300 0 100").unwrap();
        assert_eq!(z.class, StorageClass::InMemory);
        let not_zram = parse_swap_line("/dev/zramx/swapfile file 1024 0 -2").unwrap();
        assert_eq!(not_zram.class.residue_bytes(), 1 << 20);
        assert!(parse_swap_line("/x file big 0 1").is_none());
    }

    #[test]
    fn classes_count_each_byte_at_least_once() {
        let disk = device_class(&DeviceKind::Disk, 100, true);
        assert_eq!(
            disk.residue_bytes(),
            100,
            "a read-only flag does not exclude"
        );
        assert_eq!(
            device_class(&DeviceKind::Partition { of: "vda".into() }, 50, false),
            StorageClass::CountedOn { item: "vda".into() }
        );
        // A dm device without members is not counted anywhere else: residue.
        let dm = DeviceKind::DeviceMapper {
            dm_name: "x".into(),
            uuid_prefix: None,
            members: vec![],
        };
        assert_eq!(device_class(&dm, 10, false).residue_bytes(), 10);
        assert_eq!(
            device_class(&DeviceKind::Loop { backing_file: None }, 0, false),
            StorageClass::NoStorage
        );
        assert_eq!(
            device_class(&DeviceKind::Zram, 10, false),
            StorageClass::InMemory
        );
    }

    #[test]
    fn this_host_has_an_inventory_that_adds_up() {
        let inv = take(EpochStorage::default());
        for (name, class) in inv.items() {
            println!("{name}: {class:?}");
        }
        assert_eq!(inv.residue_bytes, inv.recomputed_residue());
        assert!(
            inv.mounts.iter().any(|m| m.mount_point == "/"),
            "the root is mounted: {inv:?}"
        );
    }
}
