//! System-wide refusal of the socket options that let traffic skip tc: a `cgroup/setsockopt`
//! program at the cgroup v2 root refuses `PACKET_QDISC_BYPASS` (AF_PACKET's direct transmit
//! path) and `XDP_UMEM_REG` (without which an AF_XDP socket cannot send) for every process,
//! and counts each refusal. Pinned beside the limiter; survives daemon restarts.
//!
//! The cgroup is the root unless the config's `refusal_cgroup` names a cgroup v2 directory:
//! then only processes under it are refused (the integration tests use one of their own so
//! they neither refuse nor count other processes). The report always names the cgroup.

use std::path::{Path, PathBuf};

use aya::{EbpfLoader, programs::CgroupSockopt};
use rackwarden_attest::evidence::ProtectionState;
use rackwarden_common::{RefusalCounters, map_names, prog_names};

use crate::bpf_syscall;
use crate::pins::PinPaths;

/// Where cgroup v2 is mounted (the root the refusal attaches to), from /proc/self/mountinfo.
pub fn cgroup2_root() -> Option<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next()? != "cgroup2" {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

pub use rackwarden_attest::evidence::Protection as RefusalState;

fn absent(detail: String) -> RefusalState {
    RefusalState {
        state: ProtectionState::Absent,
        detail,
        cgroup: None,
        program_id: None,
    }
}

/// The cgroup the refusal attaches to: `configured`, or the cgroup v2 root.
pub fn target_cgroup(configured: Option<&Path>) -> Option<PathBuf> {
    configured.map(Path::to_path_buf).or_else(cgroup2_root)
}

/// The refusal as it stands, read-only: present only if our pinned program is attached at
/// the target cgroup right now.
pub fn inspect(pins: &PinPaths, cgroup: Option<&Path>) -> RefusalState {
    let Some(root) = target_cgroup(cgroup) else {
        return absent("no cgroup v2 hierarchy is mounted".into());
    };
    let prog_path = pins.prog(prog_names::SOCKOPT);
    let prog = match bpf_syscall::obj_get(&prog_path) {
        Ok(p) => p,
        Err(e) => {
            return absent(format!(
                "refusal program not pinned ({}: {e})",
                prog_path.display()
            ));
        }
    };
    let id = bpf_syscall::prog_id(&prog).ok();
    let attached = bpf_syscall::open_dir(&root)
        .and_then(|cg| bpf_syscall::prog_query(&cg, bpf_syscall::ATTACH_CGROUP_SETSOCKOPT))
        .map(|ids| id.is_some_and(|i| ids.contains(&i)));
    match attached {
        Ok(true) => RefusalState {
            state: ProtectionState::Present,
            detail: format!(
                "PACKET_QDISC_BYPASS and XDP_UMEM_REG refused for every process under {}",
                root.display()
            ),
            cgroup: Some(root.display().to_string()),
            program_id: id,
        },
        Ok(false) => RefusalState {
            program_id: id,
            ..absent(format!("program not attached at {}", root.display()))
        },
        Err(e) => absent(format!("cannot query {}: {e}", root.display())),
    }
}

/// Loads (or adopts) the refusal program, and attaches and pins it at the target cgroup
/// unless it is already there. Returns the state and whether it had to (re)attach.
pub fn ensure(pins: &PinPaths, object: &[u8], cgroup: Option<&Path>) -> (RefusalState, bool) {
    let Some(root) = target_cgroup(cgroup) else {
        return (absent("no cgroup v2 hierarchy is mounted".into()), false);
    };
    let prog_path = pins.prog(prog_names::SOCKOPT);
    if !prog_path.exists()
        && let Err(e) = load_and_pin(pins, object)
    {
        return (
            absent(format!(
                "the kernel refused the cgroup/setsockopt program: {e}"
            )),
            false,
        );
    }
    let now = inspect(pins, cgroup);
    if now.state == ProtectionState::Present {
        return (now, false);
    }
    let attach = bpf_syscall::obj_get(&prog_path).and_then(|prog| {
        let cg = bpf_syscall::open_dir(&root)?;
        let link_path = pins.sockopt_link();
        let _ = std::fs::remove_file(&link_path);
        bpf_syscall::link_create(&prog, &cg, bpf_syscall::ATTACH_CGROUP_SETSOCKOPT)
            .and_then(|l| bpf_syscall::obj_pin(&l, &link_path))
    });
    match attach {
        Ok(()) => (inspect(pins, cgroup), true),
        Err(e) => (
            absent(format!("attaching to {}: {e}", root.display())),
            false,
        ),
    }
}

/// Why the refusal program could not be loaded and pinned.
#[derive(Debug, thiserror::Error)]
pub enum SockoptLoadError {
    #[error("{0}")]
    PinDirs(std::io::Error),
    #[error(transparent)]
    Load(#[from] aya::EbpfError),
    #[error("no rw_sockopt in the object")]
    NoProgram,
    #[error(transparent)]
    Program(#[from] aya::programs::ProgramError),
    #[error(transparent)]
    Pin(#[from] aya::pin::PinError),
}

fn load_and_pin(pins: &PinPaths, object: &[u8]) -> Result<(), SockoptLoadError> {
    pins.create_dirs().map_err(SockoptLoadError::PinDirs)?;
    // Same object, same pinned maps: only the sockopt program is loaded here.
    let mut ebpf = EbpfLoader::new()
        .default_map_pin_directory(pins.maps_dir())
        .load(object)?;
    let prog: &mut CgroupSockopt = ebpf
        .program_mut(prog_names::SOCKOPT)
        .ok_or(SockoptLoadError::NoProgram)?
        .try_into()?;
    prog.load()?;
    prog.pin(pins.prog(prog_names::SOCKOPT))?;
    Ok(())
}

/// Refusals so far as evidence.
pub fn refusal_counts(pins: &PinPaths) -> Option<rackwarden_attest::evidence::RefusalCounts> {
    refusals(pins).map(|r| rackwarden_attest::evidence::RefusalCounts {
        qdisc_bypass: r.qdisc_bypass,
        xdp_umem_reg: r.xdp_umem_reg,
        last_tgid: r.last_tgid,
        last_cgroup_id: r.last_cgroup_id,
    })
}

/// Refusals so far, summed over CPUs, with the latest offender.
pub fn refusals(pins: &PinPaths) -> Option<RefusalCounters> {
    bpf_syscall::sum_per_cpu(
        &pins.map(map_names::REFUSALS),
        |total: &mut RefusalCounters, c| {
            total.qdisc_bypass += c.qdisc_bypass;
            total.xdp_umem_reg += c.xdp_umem_reg;
            if c.last_ns > total.last_ns {
                total.last_ns = c.last_ns;
                total.last_cgroup_id = c.last_cgroup_id;
                total.last_tgid = c.last_tgid;
                total.last_optname = c.last_optname;
            }
        },
    )
}
