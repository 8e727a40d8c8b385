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

/// Every program on `iface`'s `dir` hook, tcx and clsact alike, whichever this process
/// would use: how a start finds another daemon's policer before it attaches its own. A
/// kind the kernel or the interface does not have (no tcx, no clsact qdisc) shows nothing.
pub(crate) fn programs_on_hook(iface: &str, dir: Direction) -> Vec<SeenProgram> {
    let mut all = Vec::new();
    for found in [query_tcx(iface, dir), query_clsact(iface, dir)] {
        match found {
            Ok(p) => all.extend(p),
            Err(e) => log::debug!("{e}"),
        }
    }
    all
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

/// clsact bpf filters, in priority order, dumped over rtnetlink by this process
/// ([`super::tcdump`]).
fn query_clsact(iface: &str, dir: Direction) -> Result<Vec<SeenProgram>, LimiterError> {
    let qerr = |detail: String| LimiterError::Query {
        iface: iface.into(),
        dir: dir.name(),
        detail,
    };
    let ifindex = crate::netns::ifindex(iface).ok_or_else(|| qerr("no such interface".into()))?;
    let mut filters = super::tcdump::bpf_filters(ifindex, dir)
        .map_err(|e| qerr(format!("RTM_GETTFILTER dump: {e}")))?;
    filters.sort_by_key(|f| f.pref);
    Ok(filters
        .into_iter()
        .map(|f| SeenProgram {
            id: f.prog_id,
            name: f.prog_name,
            filter: Some((f.pref, f.handle)),
        })
        .collect())
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
