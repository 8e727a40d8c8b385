//! Is each hook still enforcing with our program, first in line? This is where a detach, a
//! replacement or a foreign program ahead of ours is noticed.

use aya::programs::SchedClassifier;

use super::{AttachKind, Direction, HookDirection, Limiter, LimiterError};

/// A program seen on a hook.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SeenProgram {
    pub id: u32,
    pub name: String,
    /// clsact only: the filter's priority and handle (how a filter is named to delete it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<(u16, u32)>,
}

/// What is on one hook right now.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct HookStatus {
    pub interface: String,
    pub direction: Direction,
    /// Our program id is on the hook.
    pub attached: bool,
    /// Programs that run before ours (tcx order, or lower clsact priority). Any of them can
    /// pass a packet before our policer sees it.
    pub foreign_ahead: Vec<SeenProgram>,
    /// All programs on the hook, in run order.
    pub programs: Vec<SeenProgram>,
}

impl HookStatus {
    /// Attached and nothing ahead of us.
    pub fn enforcing(&self) -> bool {
        self.attached && self.foreign_ahead.is_empty()
    }
}

impl Limiter {
    pub fn inspect(&self, iface: &str, dir: Direction) -> Result<HookStatus, LimiterError> {
        let ours = self.identity(dir).id;
        let programs = match self.kind.unwrap_or(AttachKind::Tcx) {
            AttachKind::Tcx => query_tcx(iface, dir)?,
            AttachKind::Clsact => query_clsact(iface, dir)?,
        };
        let pos = programs.iter().position(|p| p.id == ours);
        let foreign_ahead = match pos {
            Some(i) => programs[..i].to_vec(),
            None => programs.clone(),
        };
        Ok(HookStatus {
            interface: iface.into(),
            direction: dir,
            attached: pos.is_some(),
            foreign_ahead,
            programs,
        })
    }
}

fn query_tcx(iface: &str, dir: Direction) -> Result<Vec<SeenProgram>, LimiterError> {
    let (_rev, infos) =
        SchedClassifier::query_tcx(iface, dir.tc()).map_err(|e| LimiterError::Query {
            iface: iface.into(),
            dir: dir.name(),
            detail: e.to_string(),
        })?;
    Ok(infos
        .iter()
        .map(|i| SeenProgram {
            id: i.id(),
            name: i.name_as_str().unwrap_or("").to_string(),
            filter: None,
        })
        .collect())
}

/// clsact filters, read with `tc -j filter show`, in priority order. aya 0.14 has no netlink
/// filter dump, and iproute2 is a dependency of the package anyway.
fn query_clsact(iface: &str, dir: Direction) -> Result<Vec<SeenProgram>, LimiterError> {
    let qerr = |detail: String| LimiterError::Query {
        iface: iface.into(),
        dir: dir.name(),
        detail,
    };
    let out = std::process::Command::new("tc")
        .args(["-j", "filter", "show", "dev", iface, dir.name()])
        .output()
        .map_err(|e| qerr(format!("running tc: {e}")))?;
    if !out.status.success() {
        return Err(qerr(
            String::from_utf8_lossy(&out.stderr).trim().to_string(),
        ));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| qerr(format!("tc printed unparseable JSON: {e}")))?;
    let mut seen: Vec<(u64, SeenProgram)> = Vec::new();
    for f in v.as_array().into_iter().flatten() {
        let pref = f.get("pref").and_then(|p| p.as_u64()).unwrap_or(u64::MAX);
        let Some(prog) = f.get("options").and_then(|o| o.get("prog")) else {
            continue;
        };
        let Some(id) = prog.get("id").and_then(|i| i.as_u64()) else {
            continue;
        };
        let name = prog
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or("")
            .to_string();
        let handle = f
            .get("options")
            .and_then(|o| o.get("handle"))
            .and_then(|h| h.as_str())
            .and_then(|h| u32::from_str_radix(h.trim_start_matches("0x"), 16).ok());
        seen.push((
            pref,
            SeenProgram {
                id: id as u32,
                name,
                filter: handle.and_then(|h| Some((u16::try_from(pref).ok()?, h))),
            },
        ));
    }
    seen.sort_by_key(|(p, _)| *p);
    Ok(seen.into_iter().map(|(_, s)| s).collect())
}

/// Deletes a clsact filter (`tc filter del`): how a foreign filter that runs before ours at
/// our priority is removed. There is no way to move ours ahead of it without a gap: cls_bpf
/// runs the newest filter of a priority first.
pub(crate) fn delete_clsact_filter(
    iface: &str,
    dir: Direction,
    pref: u16,
    handle: u32,
) -> Result<(), LimiterError> {
    let out = std::process::Command::new("tc")
        .args(["filter", "del", "dev", iface, dir.name()])
        .args([
            "pref",
            &pref.to_string(),
            "handle",
            &format!("0x{handle:x}"),
            "bpf",
        ])
        .output()
        .map_err(|e| LimiterError::Query {
            iface: iface.into(),
            dir: dir.name(),
            detail: format!("running tc: {e}"),
        })?;
    if !out.status.success() {
        return Err(LimiterError::Query {
            iface: iface.into(),
            dir: dir.name(),
            detail: format!(
                "tc filter del pref {pref} handle 0x{handle:x}: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    Ok(())
}
