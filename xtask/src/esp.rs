//! The `secure-boot` group's disk: a GPT disk image with one EFI System Partition that holds
//! Debian's Secure Boot chain as a Debian host installs it, built without root (mtools writes
//! the FAT file system, sfdisk the partition table, both on plain files).
//!
//! ```text
//! \EFI\BOOT\BOOTX64.EFI    shim (shim-signed: signed by Microsoft's UEFI CA 2011)
//! \EFI\BOOT\grubx64.efi    GRUB (grub-efi-amd64-signed: signed by Debian's key, which shim
//!                          carries); no fbx64.efi, so shim starts GRUB, not the fallback
//! \EFI\debian\grub.cfg     where the signed GRUB's built-in prefix looks for its config
//! \vmlinuz                 the guest kernel (Debian's signed cloud kernel)
//! \initrd.zst              the guest root
//! ```
//!
//! The packages are fetched with `apt-get download` and unpacked under
//! `target/vm/secureboot/` (never installed: their maintainer scripts would write the host's
//! own ESP).

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

use crate::{run_checked, step};

/// Debian's signed shim and GRUB, unpacked.
#[derive(Clone, Debug)]
pub struct SignedChain {
    pub shim: PathBuf,
    pub grub: PathBuf,
}

/// The partition starts at 1 MiB (sector 2048), as partitioning tools align it.
const PARTITION_START_SECTORS: u64 = 2048;
const SECTOR: u64 = 512;
/// The GPT's backup header and table at the disk's end.
const BACKUP_GPT_SECTORS: u64 = 33;
/// Room on the ESP beyond its files (FAT tables, directories).
const ESP_SLACK_BYTES: u64 = 16 << 20;

/// `apt-get download` `pkg` into `target/vm/debs` and `dpkg -x` it under `dest` (once).
pub fn unpack_package(pkg: &str, dest: &Path) -> Result<()> {
    if dest.exists() {
        return Ok(());
    }
    step(&format!("apt-get download {pkg} (unpacked, not installed)"));
    let debs = Path::new("target/vm/debs");
    std::fs::create_dir_all(debs)?;
    run_checked(
        Command::new("apt-get")
            .args(["download", "-qq", pkg])
            .current_dir(debs),
        "apt-get download",
    )?;
    let deb = std::fs::read_dir(debs)?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{pkg}_")) && n.ends_with(".deb"))
        })
        // The one just downloaded, where an older version is still there.
        .max_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .with_context(|| format!("apt-get download {pkg} left no .deb in {}", debs.display()))?;
    let tmp = dest.with_extension("unpacking");
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    run_checked(
        Command::new("dpkg").arg("-x").arg(&deb).arg(&tmp),
        "dpkg -x",
    )?;
    std::fs::rename(&tmp, dest)?;
    Ok(())
}

impl SignedChain {
    pub fn fetch() -> Result<SignedChain> {
        let base = Path::new("target/vm/secureboot");
        let (shim_pkg, grub_pkg) = (base.join("shim-signed"), base.join("grub-efi-amd64-signed"));
        unpack_package("shim-signed", &shim_pkg)?;
        unpack_package("grub-efi-amd64-signed", &grub_pkg)?;
        let chain = SignedChain {
            shim: shim_pkg.join("usr/lib/shim/shimx64.efi.signed"),
            grub: grub_pkg.join("usr/lib/grub/x86_64-efi-signed/grubx64.efi.signed"),
        };
        for f in [&chain.shim, &chain.grub] {
            if !f.exists() {
                bail!("{} is missing: the package's layout changed", f.display());
            }
        }
        Ok(chain)
    }
}

/// GRUB's config: boot `kernel` and `initrd` from the ESP with `cmdline`, at once.
fn grub_cfg(cmdline: &str) -> String {
    format!(
        "# Written by cargo xtask vm-test (xtask/src/esp.rs).\n\
         set timeout=0\n\
         echo 'Loading Linux ...'\n\
         linux /vmlinuz {cmdline}\n\
         echo 'Loading initial ramdisk ...'\n\
         initrd /initrd.zst\n\
         boot\n"
    )
}

/// Writes the disk image `out`: the ESP above, GRUB told to start `vmlinuz` with `cmdline`.
/// On failure nothing is left behind (neither `out` nor the files it was made from).
pub fn write_disk(
    chain: &SignedChain,
    vmlinuz: &Path,
    initrd: &Path,
    cmdline: &str,
    out: &Path,
) -> Result<()> {
    let dir = out.with_extension("files");
    let written = write_disk_from(chain, vmlinuz, initrd, cmdline, out, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    if written.is_err() {
        let _ = std::fs::remove_file(out);
    }
    written
}

fn write_disk_from(
    chain: &SignedChain,
    vmlinuz: &Path,
    initrd: &Path,
    cmdline: &str,
    out: &Path,
    dir: &Path,
) -> Result<()> {
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let cfg = dir.join("grub.cfg");
    std::fs::write(&cfg, grub_cfg(cmdline))?;
    let files: [(&Path, &str); 5] = [
        (&chain.shim, "::/EFI/BOOT/BOOTX64.EFI"),
        (&chain.grub, "::/EFI/BOOT/grubx64.efi"),
        (&cfg, "::/EFI/debian/grub.cfg"),
        (vmlinuz, "::/vmlinuz"),
        (initrd, "::/initrd.zst"),
    ];
    let mut bytes = ESP_SLACK_BYTES;
    for (f, _) in &files {
        bytes += std::fs::metadata(f)
            .with_context(|| format!("{}", f.display()))?
            .len();
    }
    // Whole MiB, so the partition ends aligned.
    let esp_sectors = bytes.div_ceil(1 << 20) * (1 << 20) / SECTOR;
    let fat = dir.join("esp.fat");
    let img = |p: &Path| p.display().to_string();
    run_checked(
        Command::new("mformat")
            .args(["-i", &img(&fat), "-C", "-T", &esp_sectors.to_string()])
            .args(["-h", "64", "-s", "32", "-v", "ESP", "::"]),
        "mformat (mtools)",
    )?;
    run_checked(
        Command::new("mmd").args(["-i", &img(&fat)]).args([
            "::/EFI",
            "::/EFI/BOOT",
            "::/EFI/debian",
        ]),
        "mmd (mtools)",
    )?;
    for (src, dst) in files {
        run_checked(
            Command::new("mcopy")
                .args(["-i", &img(&fat)])
                .arg(src)
                .arg(dst),
            &format!("mcopy {} {dst}", src.display()),
        )?;
    }
    let total = (PARTITION_START_SECTORS + esp_sectors + BACKUP_GPT_SECTORS) * SECTOR;
    std::fs::File::create(out)
        .and_then(|f| f.set_len(total))
        .with_context(|| format!("creating {}", out.display()))?;
    let table = format!(
        "label: gpt\nstart={PARTITION_START_SECTORS}, size={esp_sectors}, \
         type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name=\"EFI System\"\n"
    );
    let mut sfdisk = Command::new("sfdisk")
        .args(["-q", "--no-reread", "--no-tell-kernel"])
        .arg(out)
        .stdin(std::process::Stdio::piped())
        .spawn()
        .context("cannot run sfdisk (Debian package fdisk)")?;
    {
        use std::io::Write as _;
        sfdisk
            .stdin
            .take()
            .context("sfdisk's stdin")?
            .write_all(table.as_bytes())?;
    }
    if !sfdisk.wait()?.success() {
        bail!("sfdisk could not partition {}", out.display());
    }
    // The FAT file system into its partition.
    {
        use std::io::{Seek as _, SeekFrom, Write as _};
        let mut disk = std::fs::OpenOptions::new().write(true).open(out)?;
        disk.seek(SeekFrom::Start(PARTITION_START_SECTORS * SECTOR))?;
        disk.write_all(&std::fs::read(&fat)?)?;
    }
    Ok(())
}
