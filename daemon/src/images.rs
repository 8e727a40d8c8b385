//! Precommitted images: the verifier side makes a signed manifest of a directory; the rack
//! side stages a source directory against it and refuses anything that does not match.
//!
//! Staging and sealing (no time-of-check/time-of-use gap):
//! - each image is copied into a fresh set directory `<staging>/sets/<id>.partial/` (root-owned,
//!   0700), hashing the very buffers that are written, so the digest is of the staged bytes
//!   and not of a source that could change after it was read;
//! - a file that matches is fsynced and made read-only (0444); when every image of the set
//!   matches, directories become 0555, the set is renamed to `<staging>/sets/<id>/`, and the
//!   symlink `<staging>/current` is switched to it atomically (rename over the old link);
//! - workloads read only through `current`, so they never see a partial or unverified set;
//! - any refusal removes the `.partial` directory, and the next staging removes any
//!   `.partial` left by a crash: nothing that looks valid is ever left behind.
//!
//! A root process on the host can still chmod and rewrite staged files; fs-verity on the
//! staging filesystem or a read-only bind mount for workloads closes that (not done here).

use std::{
    fs::{File, OpenOptions},
    os::unix::fs::{OpenOptionsExt, PermissionsExt},
    path::{Path, PathBuf},
    sync::atomic::AtomicU64,
};

use ed25519_dalek::{SigningKey, VerifyingKey};
use rackwarden_attest::{
    evidence::{ImageReport, ImageResult},
    manifest::{self, LeavesRef, Manifest, ManifestError, ManifestImage, VerifiedManifest},
    merkle::{self, FileDigest},
    statement::{IMAGE_DIGEST, Subject},
};

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a regular file (symlinks and special files cannot be precommitted)")]
    NotRegular { path: PathBuf },
    #[error("{path}: {detail}")]
    Invalid { path: PathBuf, detail: String },
    #[error("manifest {path}: {source}")]
    Manifest {
        path: PathBuf,
        source: ManifestError,
    },
    #[error("image `{name}`: missing from the source ({path})")]
    Missing { name: String, path: PathBuf },
    #[error("{path}: extra file in a sealed set (not in the manifest)")]
    Extra { path: PathBuf },
    #[error("image `{name}` ({path}): size {found} bytes, manifest says {expected}")]
    WrongSize {
        name: String,
        path: PathBuf,
        expected: u64,
        found: u64,
    },
    #[error("image `{name}` ({path}): merkle_sha3_256 {found} does not match the manifest's {expected}{}",
        first_bad_chunk.map(|c| format!("; first bad chunk: #{c} (bytes {}..{})", c * merkle::CHUNK as u64, (c + 1) * merkle::CHUNK as u64)).unwrap_or_else(|| " (no sidecar: chunk unknown)".into()))]
    Mismatch {
        name: String,
        path: PathBuf,
        expected: String,
        found: String,
        first_bad_chunk: Option<u64>,
    },
    #[error("image `{name}`: leaf sidecar {path}: {problem}")]
    Sidecar {
        name: String,
        path: PathBuf,
        problem: String,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Every regular file under `dir` as (relative path with `/`, absolute path), sorted.
pub fn list_files(dir: &Path) -> Result<Vec<(String, PathBuf)>, ImageError> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<(String, PathBuf)>) -> Result<(), ImageError> {
        for entry in std::fs::read_dir(dir).map_err(io(dir))? {
            let entry = entry.map_err(io(dir))?;
            let path = entry.path();
            let ft = entry.file_type().map_err(io(&path))?;
            if ft.is_dir() {
                walk(root, &path, out)?;
            } else if ft.is_file() {
                let rel = path
                    .strip_prefix(root)
                    .unwrap_or(&path)
                    .to_string_lossy()
                    .replace('\\', "/");
                out.push((rel, path));
            } else {
                return Err(ImageError::NotRegular { path });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out)?;
    out.sort();
    Ok(out)
}

/// Digests every file under `dirs` and writes a manifest signed with the verifier's key to
/// `out`; with `sidecars`, also `<out>.leaves/<n>.leaves` per image.
pub fn create_manifest(
    dirs: &[PathBuf],
    out: &Path,
    verifier_key: &SigningKey,
    sidecars: bool,
    threads: usize,
    progress: Option<&AtomicU64>,
) -> Result<Manifest, ImageError> {
    let mut files: Vec<(String, PathBuf)> = Vec::new();
    for d in dirs {
        for (rel, path) in list_files(d)? {
            if files.iter().any(|(r, _)| *r == rel) {
                return Err(ImageError::Invalid {
                    path,
                    detail: format!("`{rel}` appears in two source directories"),
                });
            }
            files.push((rel, path));
        }
    }
    let out_name = out
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_else(|| "manifest".into());
    let out_dir = out.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut images = Vec::new();
    for (i, (rel, path)) in files.iter().enumerate() {
        manifest::check_relative_path(rel).map_err(|e| ImageError::Invalid {
            path: path.clone(),
            detail: e.to_string(),
        })?;
        let f = File::open(path).map_err(io(path))?;
        let size = f.metadata().map_err(io(path))?.len();
        let d = merkle::digest_file(&f, size, threads, None, progress).map_err(io(path))?;
        let leaves = if sidecars {
            let rel_side = format!("{out_name}.leaves/{i}.leaves");
            let side = out_dir.join(&rel_side);
            if let Some(p) = side.parent() {
                std::fs::create_dir_all(p).map_err(io(p))?;
            }
            let bytes: Vec<u8> = d.leaves.concat();
            std::fs::write(&side, &bytes).map_err(io(&side))?;
            Some(LeavesRef {
                path: rel_side,
                sha3_256: hex::encode(rackwarden_attest::sha3(&bytes)),
            })
        } else {
            None
        };
        images.push(ManifestImage {
            name: rel.clone(),
            path: rel.clone(),
            size,
            merkle_sha3_256: d.hex(),
            leaves,
        });
    }
    let m = Manifest {
        version: manifest::MANIFEST_VERSION,
        images,
    };
    m.validate().map_err(|source| ImageError::Manifest {
        path: out.to_path_buf(),
        source,
    })?;
    let mut line = m
        .sign(verifier_key)
        .and_then(|env| env.to_json())
        .map_err(|e| ImageError::Invalid {
            path: out.to_path_buf(),
            detail: format!("cannot write the signed manifest as JSON: {e}"),
        })?;
    line.push(b'\n');
    crate::atomic_file::replace(out, &line).map_err(io(out))?;
    Ok(m)
}

pub fn read_manifest(path: &Path, verifier: &VerifyingKey) -> Result<VerifiedManifest, ImageError> {
    let bytes = std::fs::read(path).map_err(io(path))?;
    let trimmed = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
    manifest::verify_manifest(trimmed, verifier).map_err(|source| ImageError::Manifest {
        path: path.to_path_buf(),
        source,
    })
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StagedImage {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub merkle_sha3_256: String,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct StagedSet {
    /// The sealed set directory (also reachable as `<staging>/current`).
    pub dir: PathBuf,
    pub manifest_sha3_256: String,
    pub images: Vec<StagedImage>,
}

impl StagedSet {
    /// The statement's subjects: every image loaded, with its `merkle_sha3_256`.
    pub fn subjects(&self) -> Vec<Subject> {
        self.images
            .iter()
            .map(|i| Subject {
                name: i.name.clone(),
                digest: [(IMAGE_DIGEST.to_string(), i.merkle_sha3_256.clone())].into(),
            })
            .collect()
    }

    pub fn report(&self) -> ImageReport {
        ImageReport {
            manifest_sha3_256: self.manifest_sha3_256.clone(),
            images: self
                .images
                .iter()
                .map(|i| ImageResult {
                    name: i.name.clone(),
                    size: i.size,
                    merkle_sha3_256: i.merkle_sha3_256.clone(),
                    ok: true,
                    finding: None,
                })
                .collect(),
        }
    }
}

/// The statement's image report for a refused staging: nothing was loaded.
pub fn refusal_report(manifest_sha3: Option<[u8; 32]>, err: &ImageError) -> ImageReport {
    let name = match err {
        ImageError::Missing { name, .. }
        | ImageError::WrongSize { name, .. }
        | ImageError::Mismatch { name, .. }
        | ImageError::Sidecar { name, .. } => name.clone(),
        _ => "(set)".into(),
    };
    ImageReport {
        manifest_sha3_256: manifest_sha3.map(hex::encode).unwrap_or_default(),
        images: vec![ImageResult {
            name,
            size: 0,
            merkle_sha3_256: String::new(),
            ok: false,
            finding: Some(err.to_string()),
        }],
    }
}

/// Verifies the manifest, then stages and seals the whole set from `source`, or refuses.
pub fn stage(
    manifest_path: &Path,
    verifier: &VerifyingKey,
    source: &Path,
    staging: &Path,
    threads: usize,
) -> Result<StagedSet, ImageError> {
    let vm = read_manifest(manifest_path, verifier)?;
    let m = &vm.manifest;
    // The source must hold exactly the manifest's files, with the manifest's sizes.
    let present = list_files(source)?;
    for (rel, path) in &present {
        if !m.images.iter().any(|i| &i.path == rel) {
            return Err(ImageError::Extra { path: path.clone() });
        }
    }
    for im in &m.images {
        let p = source.join(&im.path);
        let meta = std::fs::symlink_metadata(&p).map_err(|_| ImageError::Missing {
            name: im.name.clone(),
            path: p.clone(),
        })?;
        if !meta.is_file() {
            return Err(ImageError::NotRegular { path: p });
        }
        if meta.len() != im.size {
            return Err(ImageError::WrongSize {
                name: im.name.clone(),
                path: p,
                expected: im.size,
                found: meta.len(),
            });
        }
    }
    let sets = staging.join("sets");
    std::fs::create_dir_all(&sets).map_err(io(&sets))?;
    remove_partials(&sets)?;
    let id = format!(
        "{}-{}",
        &hex::encode(vm.pae_sha3)[..16],
        rackwarden_attest::now_ms()
    );
    let partial = sets.join(format!("{id}.partial"));
    std::fs::create_dir(&partial).map_err(io(&partial))?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o700))
        .map_err(io(&partial))?;
    let result = stage_into(&vm, manifest_path, source, &partial, threads);
    let staged = match result {
        Ok(s) => s,
        Err(e) => {
            let _ = make_writable_and_remove(&partial);
            return Err(e);
        }
    };
    seal_dirs(&partial)?;
    let final_dir = sets.join(&id);
    std::fs::rename(&partial, &final_dir).map_err(io(&final_dir))?;
    let link_tmp = staging.join(".current.tmp");
    let _ = std::fs::remove_file(&link_tmp);
    std::os::unix::fs::symlink(&final_dir, &link_tmp).map_err(io(&link_tmp))?;
    let current = staging.join("current");
    std::fs::rename(&link_tmp, &current).map_err(io(&current))?;
    File::open(staging)
        .and_then(|d| d.sync_all())
        .map_err(io(staging))?;
    Ok(StagedSet {
        dir: final_dir.clone(),
        manifest_sha3_256: hex::encode(vm.pae_sha3),
        images: staged
            .into_iter()
            .map(|mut s| {
                s.path = final_dir.join(s.path.strip_prefix(&partial).unwrap_or(&s.path));
                s
            })
            .collect(),
    })
}

fn stage_into(
    vm: &VerifiedManifest,
    manifest_path: &Path,
    source: &Path,
    partial: &Path,
    threads: usize,
) -> Result<Vec<StagedImage>, ImageError> {
    let mut staged = Vec::new();
    for im in &vm.manifest.images {
        let src_path = source.join(&im.path);
        let dst_path = partial.join(&im.path);
        if let Some(parent) = dst_path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let src = File::open(&src_path).map_err(io(&src_path))?;
        let dst = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&dst_path)
            .map_err(io(&dst_path))?;
        let d =
            merkle::digest_file(&src, im.size, threads, Some(&dst), None).map_err(|e| {
                match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => ImageError::WrongSize {
                        name: im.name.clone(),
                        path: src_path.clone(),
                        expected: im.size,
                        found: src.metadata().map(|m| m.len()).unwrap_or(0),
                    },
                    _ => ImageError::Io {
                        path: src_path.clone(),
                        source: e,
                    },
                }
            })?;
        if d.hex() != im.merkle_sha3_256 {
            let first_bad_chunk = first_bad_chunk(im, manifest_path, &d)?;
            return Err(ImageError::Mismatch {
                name: im.name.clone(),
                path: src_path,
                expected: im.merkle_sha3_256.clone(),
                found: d.hex(),
                first_bad_chunk,
            });
        }
        dst.sync_all().map_err(io(&dst_path))?;
        std::fs::set_permissions(&dst_path, std::fs::Permissions::from_mode(0o444))
            .map_err(io(&dst_path))?;
        staged.push(StagedImage {
            name: im.name.clone(),
            path: dst_path,
            size: im.size,
            merkle_sha3_256: d.hex(),
        });
    }
    Ok(staged)
}

/// With a sidecar (authenticated by the manifest), the index of the first differing chunk.
fn first_bad_chunk(
    im: &ManifestImage,
    manifest_path: &Path,
    d: &FileDigest,
) -> Result<Option<u64>, ImageError> {
    let Some(l) = &im.leaves else { return Ok(None) };
    let path = manifest_path
        .parent()
        .map(|p| p.join(&l.path))
        .unwrap_or_else(|| PathBuf::from(&l.path));
    let side = |problem: String| ImageError::Sidecar {
        name: im.name.clone(),
        path: path.clone(),
        problem,
    };
    let bytes = std::fs::read(&path).map_err(|e| side(e.to_string()))?;
    if hex::encode(rackwarden_attest::sha3(&bytes)) != l.sha3_256 {
        return Err(side(
            "does not match the SHA3-256 the manifest signed".into(),
        ));
    }
    if bytes.len() as u64 != merkle::chunk_count(im.size) * 32 {
        return Err(side(format!(
            "{} bytes, expected 32 per chunk",
            bytes.len()
        )));
    }
    Ok(bytes
        .chunks(32)
        .zip(&d.leaves)
        .position(|(a, b)| a != b)
        .map(|i| i as u64))
}

fn seal_dirs(dir: &Path) -> Result<(), ImageError> {
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let p = entry.map_err(io(dir))?.path();
        if p.is_dir() {
            seal_dirs(&p)?;
        }
    }
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(dir))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).map_err(io(dir))
}

fn make_writable_and_remove(dir: &Path) -> std::io::Result<()> {
    fn chmod_all(p: &Path) {
        let _ = std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o700));
        if let Ok(rd) = std::fs::read_dir(p) {
            for e in rd.flatten() {
                if e.path().is_dir() {
                    chmod_all(&e.path());
                }
            }
        }
    }
    chmod_all(dir);
    std::fs::remove_dir_all(dir)
}

/// Removes staging directories left by an interrupted run.
fn remove_partials(sets: &Path) -> Result<(), ImageError> {
    for entry in std::fs::read_dir(sets).map_err(io(sets))? {
        let p = entry.map_err(io(sets))?.path();
        if p.extension().is_some_and(|e| e == "partial") {
            log::warn!("removing interrupted staging directory {}", p.display());
            make_writable_and_remove(&p).map_err(io(&p))?;
        }
    }
    Ok(())
}

/// What staging an epoch's image set produced: the statement's subjects and report, and
/// whether the workloads may restart on it.
pub struct StagingOutcome {
    pub subjects: Vec<Subject>,
    pub report: ImageReport,
    /// Why the set was refused (the workloads stay stopped); `None`: every image verified.
    pub refused: Option<String>,
}

impl StagingOutcome {
    /// A refusal: the report says which image and why (`err`), or names the whole set.
    fn refused(
        reason: &dyn std::fmt::Display,
        manifest: Option<[u8; 32]>,
        err: Option<&ImageError>,
    ) -> StagingOutcome {
        let report = match err {
            Some(err) => refusal_report(manifest, err),
            None => ImageReport {
                manifest_sha3_256: String::new(),
                images: vec![ImageResult {
                    name: "(set)".into(),
                    size: 0,
                    merkle_sha3_256: String::new(),
                    ok: false,
                    finding: Some(reason.to_string()),
                }],
            },
        };
        StagingOutcome {
            subjects: vec![],
            report,
            refused: Some(format!("images refused: {reason}")),
        }
    }
}

/// Stages the image set an epoch's `[images]` plan names, and prunes older sets.
pub fn stage_plan(plan: &crate::config::epoch::ImagePlan) -> StagingOutcome {
    let vk = match rackwarden_attest::keys::load_verifying_key(&plan.manifest_key) {
        Ok(k) => k,
        Err(e) => {
            return StagingOutcome::refused(
                &format!("images.manifest_key {}: {e}", plan.manifest_key.display()),
                None,
                None,
            );
        }
    };
    match stage(
        &plan.manifest,
        &vk,
        &plan.source,
        &plan.staging,
        merkle::default_threads(),
    ) {
        Ok(set) => {
            if let Err(e) = prune_sets(&plan.staging, &set.dir) {
                log::warn!("images: cannot remove older staged sets: {e}");
            }
            StagingOutcome {
                subjects: set.subjects(),
                report: set.report(),
                refused: None,
            }
        }
        Err(e) => {
            log::error!("images: REFUSED: {e}");
            let manifest = read_manifest(&plan.manifest, &vk).ok().map(|m| m.pae_sha3);
            StagingOutcome::refused(&e, manifest, Some(&e))
        }
    }
}

/// Removes every sealed set under `<staging>/sets` except `keep` (the one `current` points
/// at), so an epoch loop that restages every epoch does not fill the disk. Returns how many
/// were removed.
pub fn prune_sets(staging: &Path, keep: &Path) -> Result<usize, ImageError> {
    let sets = staging.join("sets");
    let mut removed = 0;
    for entry in std::fs::read_dir(&sets).map_err(io(&sets))? {
        let p = entry.map_err(io(&sets))?.path();
        if p != keep && p.is_dir() {
            make_writable_and_remove(&p).map_err(io(&p))?;
            removed += 1;
        }
    }
    Ok(removed)
}
