//! Rewrites the `[cap]` values of the config file in place (comments and layout kept), for
//! `rackwarden cap set --persist`, with [`crate::atomic_file::replace`].

use std::path::Path;

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
    crate::atomic_file::replace(path, new_text.as_bytes()).map_err(|e| err(e.to_string()))?;
    Ok(())
}
