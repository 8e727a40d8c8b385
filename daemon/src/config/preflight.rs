//! Everything a configuration names outside the kernel: the signing key, the manifest and
//! its key, the image, scratch and state directories. The daemon checks all of it before it
//! loads, pins or attaches anything, so a wrong path fails a start that has touched nothing
//! (a start that failed after attaching would leave a second policer on the interface).
//! `rackwarden check-config` runs the same checks, then the interfaces.
//!
//! The verifier's CA or pinned certificate is read when the config is parsed
//! ([`super::epoch`]), so a parsed config has already passed that check.

use std::path::{Path, PathBuf};

use rackwarden_attest::keys::{self, KeyError};

use super::Config;
use crate::images::ImageError;

/// What the checks learnt on the way, for `check-config` to show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Checked {
    /// The keyid of `epoch.signing_key`, when there is an `[epoch]`.
    pub host_keyid: Option<String>,
    /// How many images the verified manifest lists, when there is an `[images]`.
    pub manifest_images: Option<usize>,
}

#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("{}: `epoch.signing_key`: {source}", config.display())]
    SigningKey { config: PathBuf, source: KeyError },
    #[error("{}: `images.manifest_key`: {source}", config.display())]
    ManifestKey { config: PathBuf, source: KeyError },
    #[error("{}: `images.manifest`: {source}", config.display())]
    Manifest {
        config: PathBuf,
        source: Box<ImageError>,
    },
    #[error("{}: `{key}`: {} is not a directory", config.display(), path.display())]
    NotADirectory {
        config: PathBuf,
        key: &'static str,
        path: PathBuf,
    },
    #[error("{}: `state_dir`: {} cannot be created or written: {detail}", config.display(), path.display())]
    StateDir {
        config: PathBuf,
        path: PathBuf,
        detail: String,
    },
}

/// Checks every file and directory `cfg` names, in the order the daemon would use them.
/// Creates nothing.
pub fn check_files(cfg: &Config) -> Result<Checked, PreflightError> {
    let config = || cfg.path.clone();
    let mut checked = Checked::default();
    check_state_dir(&cfg.state_dir).map_err(|e| PreflightError::StateDir {
        config: config(),
        path: cfg.state_dir.clone(),
        detail: e.to_string(),
    })?;
    let Some(e) = &cfg.epoch else {
        return Ok(checked);
    };
    let key =
        keys::load_signing_key(&e.signing_key).map_err(|source| PreflightError::SigningKey {
            config: config(),
            source,
        })?;
    checked.host_keyid = Some(keys::keyid(&key.verifying_key()));
    if let Some(i) = &e.images {
        let vk = keys::load_verifying_key(&i.manifest_key).map_err(|source| {
            PreflightError::ManifestKey {
                config: config(),
                source,
            }
        })?;
        let m = crate::images::read_manifest(&i.manifest, &vk).map_err(|source| {
            PreflightError::Manifest {
                config: config(),
                source: Box::new(source),
            }
        })?;
        checked.manifest_images = Some(m.manifest.images.len());
        directory(cfg, "images.source", &i.source)?;
    }
    for s in &e.wipe.scratch {
        directory(cfg, "wipe.scratch", s)?;
    }
    Ok(checked)
}

fn directory(cfg: &Config, key: &'static str, path: &Path) -> Result<(), PreflightError> {
    if path.is_dir() {
        return Ok(());
    }
    Err(PreflightError::NotADirectory {
        config: cfg.path.clone(),
        key,
        path: path.to_path_buf(),
    })
}

/// Why the state directory cannot be used (the message names the path it stopped at).
#[derive(Debug, thiserror::Error)]
pub enum StateDirProblem {
    #[error("{0} is not a directory")]
    NotADirectory(PathBuf),
    #[error("no existing ancestor")]
    NoAncestor,
    #[error("{path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not writable: {source}")]
    NotWritable { path: PathBuf, source: nix::Error },
}

/// The state directory exists and is writable, or its nearest existing ancestor is a
/// writable directory (the daemon creates it at start).
fn check_state_dir(dir: &Path) -> Result<(), StateDirProblem> {
    let mut at = dir;
    loop {
        match std::fs::metadata(at) {
            Ok(m) if m.is_dir() => break,
            Ok(_) => return Err(StateDirProblem::NotADirectory(at.to_path_buf())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => match at.parent() {
                Some(p) => at = p,
                None => return Err(StateDirProblem::NoAncestor),
            },
            Err(source) => {
                return Err(StateDirProblem::Unreadable {
                    path: at.to_path_buf(),
                    source,
                });
            }
        }
    }
    nix::unistd::access(at, nix::unistd::AccessFlags::W_OK).map_err(|source| {
        StateDirProblem::NotWritable {
            path: at.to_path_buf(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with(extra: &str) -> (tempdir::Dir, Config) {
        let dir = tempdir::Dir::new();
        let text = format!(
            "rack_id = \"r\"\nhost_id = \"h\"\nhost_share = 1.0\ninterfaces = [\"lo\"]\nstate_dir = \"{}\"\n\n[cap]\negress = \"1 MB/s\"\ningress = \"1 MB/s\"\nburst = \"256 KiB\"\n{extra}",
            dir.path.join("state").display()
        );
        let cfg = Config::parse(&dir.path.join("rackwarden.toml"), &text).unwrap();
        (dir, cfg)
    }

    mod tempdir {
        pub struct Dir {
            pub path: std::path::PathBuf,
        }
        impl Dir {
            pub fn new() -> Dir {
                use std::sync::atomic::{AtomicU32, Ordering};
                static N: AtomicU32 = AtomicU32::new(0);
                let path = std::env::temp_dir().join(format!(
                    "rw-preflight-{}-{}",
                    std::process::id(),
                    N.fetch_add(1, Ordering::SeqCst)
                ));
                std::fs::create_dir_all(&path).unwrap();
                Dir { path }
            }
        }
        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.path);
            }
        }
    }

    #[test]
    fn a_missing_signing_key_is_named_with_its_key_and_path() {
        let (_d, cfg) = config_with(
            "\n[epoch]\nwipe_interval = \"1 min\"\nsigning_key = \"/nonexistent/rw/host.key\"\n\n[verifier]\nurl = \"http://127.0.0.1:9\"\n",
        );
        let e = check_files(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("epoch.signing_key") && e.contains("/nonexistent/rw/host.key"),
            "{e}"
        );
    }

    #[test]
    fn a_config_without_epoch_checks_only_the_state_dir() {
        let (_d, cfg) = config_with("");
        assert_eq!(check_files(&cfg).unwrap(), Checked::default());
    }

    #[test]
    fn a_state_dir_under_a_file_is_refused() {
        let (d, mut cfg) = config_with("");
        std::fs::write(d.path.join("file"), b"x").unwrap();
        cfg.state_dir = d.path.join("file").join("state");
        let e = check_files(&cfg).unwrap_err().to_string();
        assert!(
            e.contains("state_dir") && e.to_lowercase().contains("not a directory"),
            "{e}"
        );
    }
}
