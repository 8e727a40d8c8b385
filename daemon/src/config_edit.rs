//! Rewrites the `[cap]` values of the config file in place (comments and layout kept), for
//! `rackwarden cap set --persist`. Written to a temporary file, fsynced, then renamed, so a
//! crash leaves either the old or the new file, never half of one.

use std::{io::Write, path::Path};

#[derive(Debug, thiserror::Error)]
pub enum ConfigEditError {
    #[error("{path}: {detail}")]
    Edit { path: String, detail: String },
}

pub fn set_caps(
    path: &Path,
    egress: Option<&str>,
    ingress: Option<&str>,
) -> Result<(), ConfigEditError> {
    let err = |detail: String| ConfigEditError::Edit {
        path: path.display().to_string(),
        detail,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let mut doc: toml_edit::DocumentMut = text
        .parse()
        .map_err(|e: toml_edit::TomlError| err(e.to_string()))?;
    let cap = doc
        .get_mut("cap")
        .and_then(|c| c.as_table_like_mut())
        .ok_or_else(|| err("no [cap] table".into()))?;
    if let Some(e) = egress {
        cap.insert("egress", toml_edit::value(e));
    }
    if let Some(i) = ingress {
        cap.insert("ingress", toml_edit::value(i));
    }
    let new_text = doc.to_string();
    // Refuse to write a file the daemon would not load.
    crate::config::Config::parse(path, &new_text)
        .map_err(|e| err(format!("edited config would be invalid: {e}")))?;
    let tmp = path.with_extension("toml.rackwarden-tmp");
    let mut f = std::fs::File::create(&tmp).map_err(|e| err(e.to_string()))?;
    f.write_all(new_text.as_bytes())
        .map_err(|e| err(e.to_string()))?;
    f.sync_all().map_err(|e| err(e.to_string()))?;
    std::fs::rename(&tmp, path).map_err(|e| err(e.to_string()))?;
    if let Some(dir) = path.parent()
        && let Ok(d) = std::fs::File::open(dir)
    {
        let _ = d.sync_all();
    }
    Ok(())
}
