//! Loading, adopting and attaching the policer.
//!
//! On first start the embedded object is loaded, its maps are pinned by name under
//! `<pin_root>/maps` and its programs under `<pin_root>/progs`. Every later start (a restart,
//! or a restart after `kill -9`) *adopts* the pinned programs and maps instead: the kernel
//! keeps enforcing throughout, and the bucket position and counters are never reset.
//!
//! Upgrades: a start also loads this binary's program beside the pinned one, sharing the
//! pinned maps. Same kernel tag: it is dropped and the pinned one adopted. Another tag (an
//! older or newer build is running): the new program replaces the old on every hook in one
//! step that leaves no hook without a policer (`BPF_LINK_UPDATE` on tcx links, an in-place
//! netlink replace of our clsact filter), then its pins are renamed over the old ones.

use std::{collections::BTreeMap, os::fd::AsFd as _};

use aya::{
    EbpfLoader,
    programs::{
        LinkOrder, SchedClassifier,
        links::FdLink,
        tc::{self, NlOptions, TcAttachOptions, TcHandle},
    },
};

use aya::maps::{Array, Map, MapData};
use rackwarden_common::{LimiterConfig, map_names};

use super::{
    Direction, HookDirection, LimiterError,
    maps::{CapSlot, FrozenCaps, LimiterMaps, next_generation},
};
use crate::{config::AttachMode, pins::PinPaths};

/// The policer object, compiled by `build.rs` from `../ebpf`.
pub(crate) static OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rackwarden-ebpf"));
/// The tapped policer object (`../ebpf/src/tap.rs`): the same policer, and every frame it
/// passes copied to the ring `RW_TAP`.
pub(crate) static TAPPED_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/rackwarden-tap"));

/// Which policer object runs on the hooks: `[taps]` in the config picks the tapped one.
/// Both have the same program and map names, so switching is an upgrade like any other
/// (another kernel tag replaces the running programs with no gap on any hook).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PolicerVariant {
    Plain,
    Tapped,
}

impl PolicerVariant {
    fn object(self) -> &'static [u8] {
        match self {
            PolicerVariant::Plain => OBJECT,
            PolicerVariant::Tapped => TAPPED_OBJECT,
        }
    }
}

/// Netlink priority and handle of our clsact filters: priority 1 runs before any filter added
/// with a default priority, and a fixed handle lets us replace our own filter in place.
pub const CLSACT_PRIORITY: u16 = 1;
/// The minor number of our filters' handle ("RW").
pub const CLSACT_HANDLE_MINOR: u16 = 0x5257;
const CLSACT_HANDLE: TcHandle = TcHandle::new(0, CLSACT_HANDLE_MINOR);

/// How a program is attached on this kernel (the statements' type).
pub use rackwarden_attest::evidence::AttachKind;

pub use rackwarden_attest::evidence::ProgramIdentity;

/// What start found pinned, against the program this binary carries.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum ProgramVersion {
    /// Nothing was pinned: this binary's programs were loaded and pinned.
    Loaded,
    /// The pinned programs are this binary's (same kernel tags): adopted.
    Adopted,
    /// Another build's programs are pinned; this binary's are loaded (pinned as `<name>_next`)
    /// and replace them on the hooks at [`Limiter::replace_attached`].
    Upgrading { from: Vec<ProgramIdentity> },
    /// Replaced on every hook; the pins now name this binary's programs.
    Upgraded { from: Vec<ProgramIdentity> },
    /// This binary's program could not be loaded beside the pinned one (its maps do not
    /// fit the pinned maps, say): the pinned one keeps enforcing, and this says why.
    UpgradeRefused { reason: String },
}

pub struct Limiter {
    pins: PinPaths,
    pub maps: LimiterMaps,
    progs: BTreeMap<&'static str, SchedClassifier>,
    identities: BTreeMap<&'static str, ProgramIdentity>,
    /// True when the programs were already pinned when this process started.
    pub adopted: bool,
    pub kind: Option<AttachKind>,
    pub version: ProgramVersion,
    /// Programs (and a config map) loaded beside the pinned ones wait to replace them.
    swap_pending: bool,
    /// The object this process loads for new generations (cap changes, upgrades).
    variant: PolicerVariant,
}

impl Limiter {
    /// Adopts the pinned policer, or loads and pins the embedded one if none is pinned, so
    /// that it enforces `want`. The config map of a generation is frozen: where the pinned
    /// one holds other caps (or is another build's), this build's programs are loaded on a
    /// new config map and replace the pinned ones at [`Limiter::replace_attached`].
    pub fn load_or_adopt(
        pins: &PinPaths,
        want: &[CapSlot; 2],
        variant: PolicerVariant,
    ) -> Result<Limiter, LimiterError> {
        let pinned = Direction::ALL
            .iter()
            .all(|d| pins.prog(d.prog_name()).exists());
        if !pinned {
            // A config map left pinned without programs is not reused: the new generation
            // gets its own, frozen with `want` (the bucket and counters are reused).
            let _ = std::fs::remove_file(pins.map(map_names::CONFIG));
            load_and_pin(pins, false, &next_generation(None, want), variant)?;
            let mut l = Limiter::adopt(pins)?;
            l.variant = variant;
            l.adopted = false;
            l.version = ProgramVersion::Loaded;
            return Ok(l);
        }
        let mut old = Limiter::adopt(pins)?;
        old.variant = variant;
        let current = old.maps.configs()?;
        let caps = next_generation(Some(&current), want);
        // This binary's program, beside the pinned one, on the same pinned maps.
        if let Err(e) = load_and_pin(pins, true, &caps, variant) {
            log::error!(
                "this build's policer cannot be loaded beside the pinned one ({e}); the pinned one (tags {:?}) keeps enforcing",
                old.identities()
                    .iter()
                    .map(|i| i.tag.clone())
                    .collect::<Vec<_>>()
            );
            remove_next(pins);
            return Ok(Limiter {
                version: ProgramVersion::UpgradeRefused {
                    reason: e.to_string(),
                },
                ..old
            });
        }
        let mut next = Limiter::adopt_from(pins, true)?;
        next.variant = variant;
        let same = Direction::ALL
            .iter()
            .all(|d| old.identity(*d).tag == next.identity(*d).tag);
        if same && caps == current {
            remove_next(pins);
            return Ok(Limiter {
                version: ProgramVersion::Adopted,
                ..old
            });
        }
        if same {
            log::info!("the pinned policer holds other caps; a new generation replaces it");
            return Ok(Limiter {
                version: ProgramVersion::Adopted,
                swap_pending: true,
                adopted: true,
                ..next
            });
        }
        log::warn!(
            "the pinned policer is another build's (tags {:?}); this build's (tags {:?}) replaces it on every hook",
            old.identities()
                .iter()
                .map(|i| i.tag.clone())
                .collect::<Vec<_>>(),
            next.identities()
                .iter()
                .map(|i| i.tag.clone())
                .collect::<Vec<_>>()
        );
        Ok(Limiter {
            version: ProgramVersion::Upgrading {
                from: old.identities(),
            },
            swap_pending: true,
            adopted: true,
            ..next
        })
    }

    /// Changes the caps at run time: a new generation (new frozen config map, new programs
    /// on the same bucket and counters) replaces the running one on every hook, with no
    /// moment where a hook has no policer. A no-op when `want` is what runs.
    pub fn change_caps(
        &mut self,
        want: &[CapSlot; 2],
        ifaces: &[String],
    ) -> Result<(), LimiterError> {
        let current = self.maps.configs()?;
        let caps = next_generation(Some(&current), want);
        if caps == current {
            return Ok(());
        }
        remove_next(&self.pins);
        load_and_pin(&self.pins, true, &caps, self.variant)?;
        let next = Limiter::adopt_from(&self.pins, true)?;
        self.progs = next.progs;
        self.identities = next.identities;
        self.maps = next.maps;
        self.swap_pending = true;
        self.replace_attached(ifaces)
    }

    /// Puts the programs loaded beside the pinned ones (an upgrade, or new caps) on every
    /// hook that runs one of ours, with no moment where the hook has no policer, then
    /// renames their pins (and their config map's) over the old ones. Must run after
    /// [`Limiter::choose_kind`]. A no-op when nothing is pending.
    pub fn replace_attached(&mut self, ifaces: &[String]) -> Result<(), LimiterError> {
        if !self.swap_pending {
            return Ok(());
        }
        for iface in ifaces {
            for d in Direction::ALL {
                let err = |detail: String| LimiterError::Attach {
                    prog: d.prog_name().into(),
                    iface: iface.clone(),
                    dir: d.name(),
                    detail,
                };
                match self.kind {
                    Some(AttachKind::Tcx) => {
                        let link_path = self.pins.link(iface, d);
                        let Ok(link) = crate::bpf_syscall::obj_get(&link_path) else {
                            // Not attached: the first hook check attaches the new program.
                            continue;
                        };
                        let prog = self
                            .progs
                            .get(d.prog_name())
                            .ok_or_else(|| LimiterError::MissingProgram(d.prog_name().into()))?;
                        let fd = prog.fd().map_err(|e| err(e.to_string()))?;
                        crate::bpf_syscall::link_update(&link, fd.as_fd())
                            .map_err(|e| err(format!("BPF_LINK_UPDATE: {e}")))?;
                    }
                    // Our filter's priority and handle are taken by the old program: the
                    // attach replaces it in place (one netlink request).
                    _ => self.attach(iface, d)?,
                }
                log::info!("{iface} {}: now runs {}", d.name(), self.identity(d).tag);
            }
        }
        let mut renames: Vec<(std::path::PathBuf, std::path::PathBuf)> = Direction::ALL
            .iter()
            .map(|d| {
                (
                    self.pins.prog_next(d.prog_name()),
                    self.pins.prog(d.prog_name()),
                )
            })
            .collect();
        renames.push((
            self.pins.map_next(map_names::CONFIG),
            self.pins.map(map_names::CONFIG),
        ));
        for (next, pin) in renames {
            std::fs::rename(&next, &pin)
                .map_err(|source| LimiterError::PinDir { path: pin, source })?;
        }
        self.swap_pending = false;
        if let ProgramVersion::Upgrading { from } = self.version.clone() {
            self.version = ProgramVersion::Upgraded { from };
        }
        Ok(())
    }

    /// Opens the pinned policer without ever loading one (for evidence and inspection).
    pub fn adopt(pins: &PinPaths) -> Result<Limiter, LimiterError> {
        Limiter::adopt_from(pins, false)
    }

    /// `next`: the programs pinned by an upgrade in progress.
    fn adopt_from(pins: &PinPaths, next: bool) -> Result<Limiter, LimiterError> {
        let mut progs = BTreeMap::new();
        let mut identities = BTreeMap::new();
        for d in Direction::ALL {
            let name = d.prog_name();
            let prog_err = |source| LimiterError::Program {
                name: name.into(),
                source,
            };
            let path = if next {
                pins.prog_next(name)
            } else {
                pins.prog(name)
            };
            let p = SchedClassifier::from_pin(path).map_err(prog_err)?;
            let info = p.info().map_err(prog_err)?;
            identities.insert(
                name,
                ProgramIdentity {
                    name: name.into(),
                    id: info.id(),
                    tag: format!("{:016x}", info.tag()),
                },
            );
            progs.insert(name, p);
        }
        let maps = LimiterMaps::open_generation(pins, next)?;
        Ok(Limiter {
            pins: pins.clone(),
            maps,
            progs,
            identities,
            adopted: true,
            kind: None,
            version: ProgramVersion::Adopted,
            swap_pending: false,
            // Only a load decides; an adopted limiter is told by `load_or_adopt`.
            variant: PolicerVariant::Plain,
        })
    }

    /// The object this process loads: plain, or tapped (`[taps]`).
    pub fn variant(&self) -> PolicerVariant {
        self.variant
    }

    pub fn pins(&self) -> &PinPaths {
        &self.pins
    }

    pub fn identity(&self, dir: Direction) -> &ProgramIdentity {
        // Both directions are inserted in `load_or_adopt`; the map is never shrunk.
        &self.identities[dir.prog_name()]
    }

    pub fn identities(&self) -> Vec<ProgramIdentity> {
        self.identities.values().cloned().collect()
    }

    /// Decides tcx or clsact for this kernel. `auto` tries a tcx query on the first interface:
    /// kernels without tcx reject the query's attach type.
    pub fn choose_kind(&mut self, mode: AttachMode, probe_iface: &str) -> AttachKind {
        let kind = match mode {
            AttachMode::Tcx => AttachKind::Tcx,
            AttachMode::Clsact => AttachKind::Clsact,
            AttachMode::Auto => {
                match SchedClassifier::query_tcx(probe_iface, Direction::Egress.tc()) {
                    Ok(_) => AttachKind::Tcx,
                    Err(e) => {
                        log::info!("tcx not available ({e}); using clsact");
                        AttachKind::Clsact
                    }
                }
            }
        };
        self.kind = Some(kind);
        kind
    }

    /// Attaches our program to `iface` in `dir`, ahead of any other program there. Replaces a
    /// stale pinned link of ours (one whose attachment was removed behind our back).
    pub fn attach(&mut self, iface: &str, dir: Direction) -> Result<(), LimiterError> {
        let kind = self.kind.unwrap_or(AttachKind::Tcx);
        let name = dir.prog_name();
        let attach_err = |detail: String| LimiterError::Attach {
            prog: name.into(),
            iface: iface.into(),
            dir: dir.name(),
            detail,
        };
        let prog = self
            .progs
            .get_mut(name)
            .ok_or_else(|| LimiterError::MissingProgram(name.into()))?;
        match kind {
            AttachKind::Tcx => {
                let link_path = self.pins.link(iface, dir);
                // A pin of a link that no longer holds an attachment is useless; drop it
                // before pinning the new link in its place.
                let _ = std::fs::remove_file(&link_path);
                let id = prog
                    .attach_with_options(
                        iface,
                        dir.tc(),
                        TcAttachOptions::TcxOrder(LinkOrder::first()),
                    )
                    .map_err(|e| attach_err(e.to_string()))?;
                let link = prog.take_link(id).map_err(|e| attach_err(e.to_string()))?;
                let fd_link: FdLink = link
                    .try_into()
                    .map_err(|e: aya::programs::links::LinkError| attach_err(e.to_string()))?;
                fd_link
                    .pin(&link_path)
                    .map_err(|source| LimiterError::Pin {
                        path: link_path,
                        source,
                    })?;
            }
            AttachKind::Clsact => {
                // An existing clsact qdisc makes this fail with "Exclusivity flag on": fine.
                let _ = tc::qdisc_add_clsact(iface);
                let opts = || NlOptions {
                    priority: CLSACT_PRIORITY,
                    handle: CLSACT_HANDLE,
                    ..Default::default()
                };
                let id = match prog.attach_with_options(
                    iface,
                    dir.tc(),
                    TcAttachOptions::Netlink(opts()),
                ) {
                    Ok(id) => id,
                    Err(_) => {
                        // Our priority/handle is taken (by a stale filter of ours, or a
                        // foreign one squatting it): replace it in place.
                        let existing = tc::SchedClassifierLink::attached(
                            iface,
                            dir.tc(),
                            CLSACT_PRIORITY,
                            CLSACT_HANDLE,
                            None,
                        )
                        .map_err(|e| attach_err(e.to_string()))?;
                        prog.attach_to_link(existing)
                            .map_err(|e| attach_err(e.to_string()))?
                    }
                };
                let link = prog.take_link(id).map_err(|e| attach_err(e.to_string()))?;
                // Dropping a netlink link detaches it; the filter must outlive this process.
                std::mem::forget(link);
            }
        }
        Ok(())
    }

    /// Puts our program back in first place where a foreign program runs ahead of it.
    /// tcx: the kernel refuses a second attachment of the same program, so our link is
    /// released (unpinned) and attached again first; the hook is without our policer only
    /// between those two system calls. clsact: nothing can run before priority 1 except
    /// another filter at priority 1 (cls_bpf runs a priority's newest filter first), and that
    /// priority is ours: such filters are deleted, ours is never touched.
    pub fn move_first(&mut self, iface: &str, dir: Direction) -> Result<bool, LimiterError> {
        match self.kind {
            Some(AttachKind::Clsact) => {
                let hook = self.inspect(iface, dir)?;
                let mut removed = false;
                for p in &hook.foreign_ahead {
                    if let Some((pref, handle)) = p.filter {
                        super::watch::delete_clsact_filter(iface, dir, pref, handle)?;
                        removed = true;
                    }
                }
                Ok(removed)
            }
            _ => {
                let _ = std::fs::remove_file(self.pins.link(iface, dir));
                self.attach(iface, dir)?;
                Ok(true)
            }
        }
    }

    /// Attaches to every interface and direction (used at start).
    pub fn attach_all(&mut self, ifaces: &[String]) -> Result<(), LimiterError> {
        for iface in ifaces {
            for d in Direction::ALL {
                self.attach(iface, d)?;
            }
        }
        Ok(())
    }
}

fn remove_next(pins: &PinPaths) {
    for d in Direction::ALL {
        let _ = std::fs::remove_file(pins.prog_next(d.prog_name()));
    }
    let _ = std::fs::remove_file(pins.map_next(map_names::CONFIG));
}

/// Loads the embedded object and pins its programs (as `progs/<name>_next` while another
/// generation's are pinned: `next`). The bucket state and counters are the pinned maps
/// (created if absent: never refilled, never reset). The config map is always a new one,
/// written with `caps` and frozen before any program is loaded on it; the object declares
/// it `BPF_F_RDONLY_PROG`, so no program can write it either. The bucket state and counters
/// are frozen too: only our programs ever write them.
fn load_and_pin(
    pins: &PinPaths,
    next: bool,
    caps: &FrozenCaps,
    variant: PolicerVariant,
) -> Result<(), LimiterError> {
    crate::pins::ensure_bpffs().map_err(|source| LimiterError::PinDir {
        path: "/sys/fs/bpf".into(),
        source,
    })?;
    pins.create_dirs().map_err(|source| LimiterError::PinDir {
        path: pins.root().to_path_buf(),
        source,
    })?;
    let config_pin = if next {
        pins.map_next(map_names::CONFIG)
    } else {
        pins.map(map_names::CONFIG)
    };
    let _ = std::fs::remove_file(&config_pin);
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(pins.maps_dir())
        .map_pin_path(map_names::CONFIG, config_pin.as_path())
        .load(variant.object())?;
    let freeze_err = |name: &'static str| {
        move |e: std::io::Error| LimiterError::Freeze {
            name,
            detail: e.to_string(),
        }
    };
    {
        let map = ebpf
            .map_mut(map_names::CONFIG)
            .ok_or(LimiterError::MissingMap(map_names::CONFIG))?;
        let err = |source| LimiterError::MapAccess {
            name: map_names::CONFIG,
            source,
        };
        let mut config: Array<&mut MapData, LimiterConfig> = Array::try_from(map).map_err(err)?;
        let value = LimiterConfig {
            egress: caps[Direction::Egress.index() as usize],
            ingress: caps[Direction::Ingress.index() as usize],
        };
        config.set(0, value, 0).map_err(err)?;
    }
    let tapped = [map_names::TAP_STATS];
    let frozen = [map_names::CONFIG, map_names::STATE, map_names::COUNTERS]
        .into_iter()
        .chain(
            tapped
                .into_iter()
                .filter(|_| variant == PolicerVariant::Tapped),
        );
    for name in frozen {
        let Some(Map::Array(data) | Map::PerCpuArray(data)) = ebpf.map(name) else {
            return Err(LimiterError::MissingMap(name));
        };
        crate::bpf_syscall::map_freeze(data.fd().as_fd()).map_err(freeze_err(name))?;
    }
    for d in Direction::ALL {
        let name = d.prog_name();
        let prog_err = |source| LimiterError::Program {
            name: name.into(),
            source,
        };
        let prog: &mut SchedClassifier = ebpf
            .program_mut(name)
            .ok_or_else(|| LimiterError::MissingProgram(name.into()))?
            .try_into()
            .map_err(prog_err)?;
        prog.load().map_err(prog_err)?;
        let path = if next {
            pins.prog_next(name)
        } else {
            pins.prog(name)
        };
        let _ = std::fs::remove_file(&path);
        prog.pin(&path)
            .map_err(|source| LimiterError::Pin { path, source })?;
    }
    Ok(())
}
