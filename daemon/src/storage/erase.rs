//! Erase by key (`[wipe] erase`): each configured scratch volume is a plain dm-crypt mapping
//! whose key is random and exists only in the kernel's dm table. At each epoch, after the
//! drain, the daemon unmounts the volume, closes the mapping (the kernel frees the key with
//! `kfree_sensitive`), and opens the device again under a fresh random key with a fresh
//! filesystem. What was written before is ciphertext under a key that no longer exists
//! anywhere: the daemon wrote it to `cryptsetup`'s stdin and zeroed it, and the host wipe
//! that follows overwrites the freed pages.
//!
//! Nothing is pretended: without device-mapper in the kernel, without `cryptsetup`, or when
//! any step fails, the volume is reported with the error and the inventory counts it as
//! residue. NVMe drives can do the same in hardware (`nvme format --ses=2`: the controller
//! replaces its media encryption key); this backend does not depend on it.

use std::{
    io::{Read as _, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
    process::{Command, ExitStatus, Stdio},
    time::Instant,
};

use rackwarden_attest::storage::ErasedVolume;

/// The cipher of every mapping: AES-256 in XTS mode (a 512-bit key), as dm-crypt names it.
pub const CIPHER: &str = "aes-xts-plain64";
const KEY_BYTES: usize = 64;
/// How much of the raw device (ciphertext) the header digest covers.
const HEADER_BYTES: usize = 64 << 10;

/// Why a volume was not erased by key (it stays residue, with this as its error).
#[derive(Debug, thiserror::Error)]
pub enum EraseError {
    #[error(
        "this kernel has no device-mapper (CONFIG_BLK_DEV_DM, module dm_mod): erase by key is not possible here"
    )]
    NoDeviceMapper,
    #[error("{tool} is not installed{}", package.map(|p| format!(" (Debian: {p})")).unwrap_or_default())]
    ToolMissing {
        tool: &'static str,
        /// The Debian package that has it, where the operator may not guess it.
        package: Option<&'static str>,
    },
    #[error("{link}: {source}")]
    MountNamespace {
        link: &'static str,
        source: std::io::Error,
    },
    #[error(
        "the daemon runs in a private mount namespace ({} is not PID 1's {}): a fresh filesystem mounted here would be invisible to the workloads; run it with PrivateMounts=no and ProtectSystem=no for [wipe] erase with a mount (see the README)",
        ours.display(),
        host.display()
    )]
    PrivateMountNamespace { ours: PathBuf, host: PathBuf },
    #[error("unmounting {}: {source}", mount.display())]
    Unmount {
        mount: PathBuf,
        source: nix::errno::Errno,
    },
    #[error("creating {}: {source}", mount.display())]
    MountPoint {
        mount: PathBuf,
        source: std::io::Error,
    },
    #[error("mounting {} on {}: {source}", device.display(), mount.display())]
    Mount {
        device: PathBuf,
        mount: PathBuf,
        source: nix::errno::Errno,
    },
    /// The tool could not be started, fed its stdin, or waited for.
    #[error("{command}: {step}{source}")]
    Tool {
        command: String,
        /// `""`, or `"stdin: "` when writing its input failed.
        step: &'static str,
        source: std::io::Error,
    },
    #[error("{command}: {status}: {stderr}")]
    ToolFailed {
        command: String,
        status: ExitStatus,
        /// What the tool wrote to stderr, trimmed.
        stderr: String,
    },
    #[error("getrandom: {0}")]
    Random(std::io::Error),
    #[error("header buffer: {0}")]
    HeaderLayout(std::alloc::LayoutError),
    #[error("header buffer: out of memory")]
    HeaderAlloc,
    #[error("opening {} for the header digest: {source}", device.display())]
    OpenHeader {
        device: PathBuf,
        source: std::io::Error,
    },
    #[error("reading the header of {}: {source}", device.display())]
    ReadHeader {
        device: PathBuf,
        source: std::io::Error,
    },
}

/// One `[wipe] erase` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EraseVolume {
    /// The block device (`/dev/nvme1n1`).
    pub device: PathBuf,
    /// Where its fresh ext4 is mounted each epoch; `None`: the mapping is left unformatted
    /// for the workload to use raw.
    pub mount: Option<PathBuf>,
}

impl EraseVolume {
    /// `rw-erase-<device name>`: the mapping under `/dev/mapper`.
    pub fn mapping(&self) -> String {
        format!("rw-erase-{}", device_name(&self.device))
    }
}

fn device_name(dev: &Path) -> String {
    dev.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Erases every volume in turn; one's failure does not stop the next.
pub fn erase_all(volumes: &[EraseVolume]) -> Vec<ErasedVolume> {
    volumes.iter().map(erase).collect()
}

pub fn erase(v: &EraseVolume) -> ErasedVolume {
    let t0 = Instant::now();
    // The kernel's name (`/dev/nvme1n1`, not a `/dev/disk/by-id/` link): what the inventory
    // matches the erase to.
    let canonical = std::fs::canonicalize(&v.device).unwrap_or_else(|_| v.device.clone());
    let mut out = ErasedVolume {
        device: canonical.display().to_string(),
        mapping: v.mapping(),
        cipher: CIPHER.into(),
        size_bytes: device_size(&v.device).unwrap_or(0),
        mount: v.mount.as_ref().map(|m| m.display().to_string()),
        header_sha3_256: None,
        erase_ms: 0,
        error: None,
    };
    match rekey(v) {
        Ok(digest) => {
            out.header_sha3_256 = Some(digest);
            log::info!(
                "{}: erased by key in {} ms (new mapping {})",
                out.device,
                t0.elapsed().as_millis(),
                out.mapping
            );
        }
        Err(e) => {
            log::error!("{}: erase by key failed, it stays residue: {e}", out.device);
            out.error = Some(e.to_string());
        }
    }
    out.erase_ms = t0.elapsed().as_millis() as u64;
    out
}

/// Whether this kernel can map dm-crypt at all, and where `cryptsetup` is.
pub fn precheck() -> Result<PathBuf, EraseError> {
    if !Path::new("/sys/class/misc/device-mapper").exists() {
        return Err(EraseError::NoDeviceMapper);
    }
    find_tool("cryptsetup", Some("cryptsetup-bin"))
}

/// Unmount, close, open under a fresh key, format, mount; the digest of the new header.
fn rekey(v: &EraseVolume) -> Result<String, EraseError> {
    let cryptsetup = precheck()?;
    if v.mount.is_some() {
        same_mount_namespace_as_pid1()?;
    }
    let mapping = v.mapping();
    let mapped = PathBuf::from("/dev/mapper").join(&mapping);
    if let Some(m) = &v.mount
        && is_mount_point(m)
    {
        nix::mount::umount(m).map_err(|source| EraseError::Unmount {
            mount: m.clone(),
            source,
        })?;
    }
    if mapping_exists(&mapping) {
        run(Command::new(&cryptsetup).args(["close", &mapping]), None)?;
    }
    let mut key = [0u8; KEY_BYTES];
    fill_random(&mut key)?;
    let opened = run(
        Command::new(&cryptsetup)
            .args([
                "open",
                "--type",
                "plain",
                "--cipher",
                CIPHER,
                "--key-size",
                "512",
                "--key-file",
                "-",
                "--keyfile-size",
                "64",
            ])
            .arg(&v.device)
            .arg(&mapping),
        Some(&key),
    );
    zero(&mut key);
    opened?;
    if let Some(m) = &v.mount {
        run(
            Command::new(find_tool("mkfs.ext4", None)?)
                .args(["-q", "-F", "-E", "nodiscard,lazy_itable_init=1"])
                .arg(&mapped),
            None,
        )?;
        std::fs::create_dir_all(m).map_err(|source| EraseError::MountPoint {
            mount: m.clone(),
            source,
        })?;
        nix::mount::mount(
            Some(&mapped),
            m,
            Some("ext4"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .map_err(|source| EraseError::Mount {
            device: mapped.clone(),
            mount: m.clone(),
            source,
        })?;
    }
    header_digest(&v.device)
}

/// A mount made in a private mount namespace (systemd's `PrivateMounts=`, `ProtectSystem=`)
/// is invisible to the workloads, which would then write to the directory underneath, on
/// another disk: refuse rather than mount where nobody else looks.
fn same_mount_namespace_as_pid1() -> Result<(), EraseError> {
    let ns = |link: &'static str| {
        std::fs::read_link(link).map_err(|source| EraseError::MountNamespace { link, source })
    };
    let (ours, host) = (ns("/proc/self/ns/mnt")?, ns("/proc/1/ns/mnt")?);
    if ours != host {
        return Err(EraseError::PrivateMountNamespace { ours, host });
    }
    Ok(())
}

/// Where a tool is installed; `package` names the Debian package for the error.
fn find_tool(name: &'static str, package: Option<&'static str>) -> Result<PathBuf, EraseError> {
    ["/usr/sbin", "/sbin", "/usr/bin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(name))
        .find(|p| p.exists())
        .ok_or(EraseError::ToolMissing {
            tool: name,
            package,
        })
}

/// Runs a tool to completion, `stdin` written to it; its stderr in the error.
fn run(cmd: &mut Command, stdin: Option<&[u8]>) -> Result<(), EraseError> {
    let what = format!("{cmd:?}");
    let tool = |step, source| EraseError::Tool {
        command: what.clone(),
        step,
        source,
    };
    let mut child = cmd
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| tool("", e))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data).map_err(|e| tool("stdin: ", e))?;
    }
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    let status = child.wait().map_err(|e| tool("", e))?;
    if !status.success() {
        return Err(EraseError::ToolFailed {
            command: what,
            status,
            stderr: err.trim().to_string(),
        });
    }
    Ok(())
}

fn fill_random(buf: &mut [u8]) -> Result<(), EraseError> {
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: writes at most the remaining length into the buffer.
        let n = unsafe { libc::getrandom(buf[got..].as_mut_ptr().cast(), buf.len() - got, 0) };
        if n < 0 {
            return Err(EraseError::Random(std::io::Error::last_os_error()));
        }
        got += n as usize;
    }
    Ok(())
}

/// Overwrites the key in a way the compiler keeps.
fn zero(buf: &mut [u8]) {
    for b in buf.iter_mut() {
        // SAFETY: a valid, aligned, exclusive reference.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

fn device_size(dev: &Path) -> Option<u64> {
    let name = device_name(&std::fs::canonicalize(dev).ok()?);
    super::inventory::sysfs_size_bytes(&Path::new(super::inventory::SYS_CLASS_BLOCK).join(name))
}

fn mapping_exists(mapping: &str) -> bool {
    std::fs::read_dir("/sys/class/block")
        .map(|rd| {
            rd.flatten().any(|e| {
                std::fs::read_to_string(e.path().join("dm/name")).is_ok_and(|n| n.trim() == mapping)
            })
        })
        .unwrap_or(false)
}

fn is_mount_point(p: &Path) -> bool {
    let want = p.display().to_string();
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|t| {
        t.lines().any(|l| {
            super::inventory::parse_mountinfo_line(l).is_some_and(|m| m.mount_point == want)
        })
    })
}

/// SHA3-256 of the first 64 KiB of the raw device as it is on the medium now (read with
/// `O_DIRECT`, past the page cache): the new filesystem's header as ciphertext under the new
/// key. A third party reading the disk gets the same digest; an unchanged digest across two
/// epochs would mean nothing was re-keyed.
fn header_digest(dev: &Path) -> Result<String, EraseError> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(dev)
        .map_err(|source| EraseError::OpenHeader {
            device: dev.to_owned(),
            source,
        })?;
    // O_DIRECT needs a buffer aligned to the logical block size: 4096 covers every device.
    let layout = std::alloc::Layout::from_size_align(HEADER_BYTES, 4096)
        .map_err(EraseError::HeaderLayout)?;
    // SAFETY: a non-zero size; freed below with the same layout.
    let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
    if ptr.is_null() {
        return Err(EraseError::HeaderAlloc);
    }
    // SAFETY: `ptr` is valid for HEADER_BYTES and exclusively ours until dealloc.
    let buf = unsafe { std::slice::from_raw_parts_mut(ptr, HEADER_BYTES) };
    let r = std::os::unix::fs::FileExt::read_exact_at(&f, buf, 0);
    let digest = hex::encode(rackwarden_attest::sha3(buf));
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(ptr, layout) };
    r.map_err(|source| EraseError::ReadHeader {
        device: dev.to_owned(),
        source,
    })?;
    Ok(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erase_errors_name_the_tool_its_package_and_its_exit() {
        let e = find_tool("rackwarden-no-such-tool", Some("rackwarden-pkg")).unwrap_err();
        assert_eq!(
            e.to_string(),
            "rackwarden-no-such-tool is not installed (Debian: rackwarden-pkg)"
        );
        let e = find_tool("rackwarden-no-such-tool", None).unwrap_err();
        assert_eq!(e.to_string(), "rackwarden-no-such-tool is not installed");
        let e = run(
            Command::new("/bin/sh").args(["-c", "echo nope >&2; exit 3"]),
            None,
        )
        .unwrap_err();
        assert!(
            matches!(&e, EraseError::ToolFailed { status, stderr, .. }
                if status.code() == Some(3) && stderr == "nope"),
            "{e}"
        );
        assert!(e.to_string().ends_with(": exit status: 3: nope"), "{e}");
        let e = run(&mut Command::new("/nonexistent/rackwarden-tool"), None).unwrap_err();
        assert!(matches!(e, EraseError::Tool { step: "", .. }), "{e}");
    }
}
