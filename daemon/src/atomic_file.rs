//! Replacing a file so that a crash leaves either the old or the new content, never half:
//! write a temporary file beside it, fsync it, rename it over the target, fsync the directory.

use std::{
    io::Write,
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

pub fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary(path, "");
    let f = std::fs::File::create(&tmp)?;
    finish(f, &tmp, path, bytes)
}

/// As [`replace`], but the file is created 0600 from the start (a chmod after writing would
/// leave a window where it is readable): keys and key blobs.
pub fn replace_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = temporary(path, ".");
    // A temporary file left by a crash may have other permissions: start afresh.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)?;
    finish(f, &tmp, path, bytes)
}

fn temporary(path: &Path, prefix: &str) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!("{prefix}{name}.rackwarden-tmp"))
}

/// Writes and syncs the temporary file, renames it over `path` and syncs the directory.
fn finish(mut f: std::fs::File, tmp: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)?;
    // The rename itself is durable only once the directory is synced.
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::File::open(dir)?.sync_all()
}
