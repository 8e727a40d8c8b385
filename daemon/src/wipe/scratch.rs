//! Scratch directories (tmpfs, local scratch): everything inside is removed; the directory
//! itself stays. On tmpfs the freed pages return to RAM, where the host wipe covers them; on a
//! disk the deleted blocks are not overwritten, and the report says so.

use std::path::{Path, PathBuf};

use rackwarden_attest::evidence::{WipeDeviceReport, WipeStatus};

fn used_bytes(p: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(p) else {
        return 0;
    };
    if meta.is_dir() {
        std::fs::read_dir(p)
            .map(|rd| rd.flatten().map(|e| used_bytes(&e.path())).sum())
            .unwrap_or(0)
    } else {
        meta.len()
    }
}

fn fs_type(p: &Path) -> String {
    match nix::sys::statfs::statfs(p) {
        Err(_) => "unknown".into(),
        Ok(st) if st.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC => "tmpfs".into(),
        Ok(st) => format!("fs magic {:#x}", st.filesystem_type().0),
    }
}

pub fn wipe(paths: &[PathBuf]) -> Vec<WipeDeviceReport> {
    paths
        .iter()
        .map(|p| {
            let device = p.display().to_string();
            let before = used_bytes(p);
            let mut errors = Vec::new();
            match std::fs::read_dir(p) {
                Err(e) => errors.push(format!("cannot list: {e}")),
                Ok(rd) => {
                    for e in rd.flatten() {
                        let path = e.path();
                        let r = if path.is_dir() && !path.is_symlink() {
                            std::fs::remove_dir_all(&path)
                        } else {
                            std::fs::remove_file(&path)
                        };
                        if let Err(err) = r {
                            errors.push(format!("{}: {err}", path.display()));
                        }
                    }
                }
            }
            let after = used_bytes(p);
            let fs = fs_type(p);
            let mut detail = format!(
                "{fs}; {before} B in files before, {after} B after; contents removed, not overwritten{}",
                if fs == "tmpfs" { " (tmpfs pages return to RAM)" } else { " (deleted disk blocks may persist)" }
            );
            if !errors.is_empty() {
                detail.push_str(&format!("; errors: {}", errors.join(", ")));
            }
            WipeDeviceReport {
                backend: "scratch".into(),
                device,
                status: if errors.is_empty() && after == 0 { WipeStatus::Complete } else { WipeStatus::Failed },
                bytes_total: before,
                bytes_filled: 0,
                bytes_verified: before - after.min(before),
                mismatches: 0,
                residue_bytes: after.min(before),
                fill_ms: 0,
                verify_ms: 0,
                detail: Some(detail),
            }
        })
        .collect()
}
