//! The few raw `bpf()` commands aya 0.14 does not offer: for cgroup sockopt links (create a
//! link, pin it, open a pinned object, query a cgroup's programs, read a program's id), and
//! for the guard's `fmod_ret` programs (load a tracing program, attach it).

use std::{
    ffi::CString,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    path::Path,
};

const BPF_OBJ_PIN: libc::c_long = 6;
const BPF_MAP_FREEZE: libc::c_long = 22;
const BPF_OBJ_GET: libc::c_long = 7;
const BPF_PROG_QUERY: libc::c_long = 16;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_LINK_UPDATE: libc::c_long = 29;
const BPF_PROG_LOAD: libc::c_long = 5;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
/// `enum bpf_prog_type`: BPF_PROG_TYPE_TRACING.
pub const PROG_TYPE_TRACING: u32 = 26;
/// `enum bpf_attach_type`: BPF_MODIFY_RETURN (fmod_ret).
pub const ATTACH_MODIFY_RETURN: u32 = 26;
/// `enum bpf_attach_type`: BPF_CGROUP_SETSOCKOPT.
pub const ATTACH_CGROUP_SETSOCKOPT: u32 = 22;

fn bpf(cmd: libc::c_long, attr: &mut [u8; 128]) -> std::io::Result<i64> {
    // SAFETY: `attr` is a zero-padded bpf_attr for `cmd`, larger than any we use.
    let r = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len()) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn put32(a: &mut [u8; 128], off: usize, v: u32) {
    a[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put64(a: &mut [u8; 128], off: usize, v: u64) {
    a[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}

fn cpath(p: &Path) -> std::io::Result<CString> {
    CString::new(p.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::other("path contains NUL"))
}

/// `BPF_MAP_FREEZE`: from now on no `bpf()` syscall can write the map (programs still can,
/// unless the map was created `BPF_F_RDONLY_PROG`). A map frozen before is left as it is:
/// the kernel answers EPERM for it (a frozen map gives no fd write permission, and that is
/// checked first; our fds are opened read-write, so EPERM means frozen) or EBUSY.
pub fn map_freeze(map: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    let mut a = [0u8; 128];
    put32(&mut a, 0, map.as_raw_fd() as u32);
    match bpf(BPF_MAP_FREEZE, &mut a) {
        Err(e) if matches!(e.raw_os_error(), Some(libc::EBUSY | libc::EPERM)) => Ok(()),
        r => r.map(|_| ()),
    }
}

/// Opens a pinned program, map or link.
pub fn obj_get(path: &Path) -> std::io::Result<OwnedFd> {
    let c = cpath(path)?;
    let mut a = [0u8; 128];
    put64(&mut a, 0, c.as_ptr() as u64);
    let fd = bpf(BPF_OBJ_GET, &mut a)?;
    // SAFETY: the kernel returned a new fd we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

pub fn obj_pin(fd: &OwnedFd, path: &Path) -> std::io::Result<()> {
    let c = cpath(path)?;
    let mut a = [0u8; 128];
    put64(&mut a, 0, c.as_ptr() as u64);
    put32(&mut a, 8, fd.as_raw_fd() as u32);
    bpf(BPF_OBJ_PIN, &mut a).map(|_| ())
}

/// `BPF_LINK_CREATE` of `prog` on the object `target` (a cgroup directory fd).
pub fn link_create(prog: &OwnedFd, target: &OwnedFd, attach_type: u32) -> std::io::Result<OwnedFd> {
    let mut a = [0u8; 128];
    put32(&mut a, 0, prog.as_raw_fd() as u32);
    put32(&mut a, 4, target.as_raw_fd() as u32);
    put32(&mut a, 8, attach_type);
    let fd = bpf(BPF_LINK_CREATE, &mut a)?;
    // SAFETY: a new link fd we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// `BPF_LINK_UPDATE`: the link runs `new_prog` from the next packet on. The kernel swaps the
/// program under RCU, so the hook is never without a program.
pub fn link_update(link: &OwnedFd, new_prog: std::os::fd::BorrowedFd<'_>) -> std::io::Result<()> {
    let mut a = [0u8; 128];
    put32(&mut a, 0, link.as_raw_fd() as u32);
    put32(&mut a, 4, new_prog.as_raw_fd() as u32);
    bpf(BPF_LINK_UPDATE, &mut a).map(|_| ())
}

/// A program for `BPF_PROG_LOAD`: its instructions (8 bytes each, as the kernel reads them)
/// and where it attaches.
pub struct ProgLoad<'a> {
    pub prog_type: u32,
    pub expected_attach_type: u32,
    /// The kernel function it attaches to, by its type id in the kernel's BTF.
    pub attach_btf_id: u32,
    pub insns: &'a [u64],
    /// At most 15 bytes are kept (the kernel's limit).
    pub name: &'a str,
}

/// `BPF_PROG_LOAD` (GPL). On a refusal the error carries the verifier's log: the load is
/// repeated with a log buffer, since asking for one up front makes every load slower.
pub fn prog_load(p: &ProgLoad<'_>) -> std::io::Result<OwnedFd> {
    let license = c"GPL";
    let mut name = [0u8; 16];
    let n = p.name.len().min(15);
    name[..n].copy_from_slice(&p.name.as_bytes()[..n]);
    let attr = |log: Option<&mut Vec<u8>>| {
        let mut a = [0u8; 128];
        put32(&mut a, 0, p.prog_type);
        put32(&mut a, 4, p.insns.len() as u32);
        put64(&mut a, 8, p.insns.as_ptr() as u64);
        put64(&mut a, 16, license.as_ptr() as u64);
        if let Some(log) = log {
            put32(&mut a, 24, 1);
            put32(&mut a, 28, log.len() as u32);
            put64(&mut a, 32, log.as_mut_ptr() as u64);
        }
        a[48..64].copy_from_slice(&name);
        put32(&mut a, 68, p.expected_attach_type);
        put32(&mut a, 108, p.attach_btf_id);
        a
    };
    let fd = match bpf(BPF_PROG_LOAD, &mut attr(None)) {
        Ok(fd) => fd,
        Err(e) => {
            let mut log = vec![0u8; 1 << 20];
            let _ = bpf(BPF_PROG_LOAD, &mut attr(Some(&mut log)));
            let end = log.iter().position(|c| *c == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]);
            let tail: String = text.lines().rev().take(8).collect::<Vec<_>>().join(" | ");
            if tail.trim().is_empty() {
                return Err(e);
            }
            return Err(std::io::Error::new(
                e.kind(),
                format!("{e}; verifier log (last lines, newest first): {tail}"),
            ));
        }
    };
    // SAFETY: the kernel returned a new program fd we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Attaches a tracing program (fentry, fexit, fmod_ret) to the function it was loaded for:
/// `BPF_RAW_TRACEPOINT_OPEN` without a name. Returns the link.
pub fn tracing_attach(prog: &OwnedFd) -> std::io::Result<OwnedFd> {
    let mut a = [0u8; 128];
    put32(&mut a, 8, prog.as_raw_fd() as u32);
    let fd = bpf(BPF_RAW_TRACEPOINT_OPEN, &mut a)?;
    // SAFETY: a new link fd we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Ids of the programs attached to `target` for `attach_type`, in run order.
pub fn prog_query(target: &OwnedFd, attach_type: u32) -> std::io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    let mut a = [0u8; 128];
    put32(&mut a, 0, target.as_raw_fd() as u32);
    put32(&mut a, 4, attach_type);
    put64(&mut a, 16, ids.as_mut_ptr() as u64);
    put32(&mut a, 24, ids.len() as u32);
    bpf(BPF_PROG_QUERY, &mut a)?;
    let n = u32::from_ne_bytes([a[24], a[25], a[26], a[27]]) as usize;
    ids.truncate(n.min(64));
    Ok(ids)
}

/// The kernel id of a program fd (`bpf_prog_info.id`, at offset 4).
pub fn prog_id(fd: &OwnedFd) -> std::io::Result<u32> {
    obj_id(fd)
}

/// The first 256 bytes of the `bpf_{prog,map,link}_info` of `fd` (`BPF_OBJ_GET_INFO_BY_FD`).
fn obj_info(fd: &OwnedFd) -> std::io::Result<[u8; 256]> {
    let mut info = [0u8; 256];
    let mut a = [0u8; 128];
    put32(&mut a, 0, fd.as_raw_fd() as u32);
    put32(&mut a, 4, info.len() as u32);
    put64(&mut a, 8, info.as_mut_ptr() as u64);
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a)?;
    Ok(info)
}

/// The kernel id of a program, map or link fd: `bpf_{prog,map,link}_info.id` are all at
/// offset 4 (after the type).
pub fn obj_id(fd: &OwnedFd) -> std::io::Result<u32> {
    let info = obj_info(fd)?;
    Ok(u32::from_ne_bytes([info[4], info[5], info[6], info[7]]))
}

/// A program's run count and total run time (`bpf_prog_info.run_cnt` and `run_time_ns`, at
/// offsets 200 and 192), counted only while `kernel.bpf_stats_enabled` is 1.
pub fn prog_run_stats(fd: &OwnedFd) -> std::io::Result<(u64, u64)> {
    let info = obj_info(fd)?;
    let u64_at = |o: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&info[o..o + 8]);
        u64::from_ne_bytes(b)
    };
    Ok((u64_at(200), u64_at(192)))
}

/// Opens a directory (a cgroup) as an fd for link creation and queries.
pub fn open_dir(path: &Path) -> std::io::Result<OwnedFd> {
    let c = cpath(path)?;
    // SAFETY: open(2) on a NUL-terminated path; checked below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The single entry of the per-CPU array pinned at `pin`, folded over CPUs with `add`
/// (`None`: not pinned, or not readable by this process).
pub fn sum_per_cpu<T: aya::Pod + Default>(pin: &Path, add: impl Fn(&mut T, &T)) -> Option<T> {
    let data = aya::maps::MapData::from_pin(pin).ok()?;
    let arr: aya::maps::PerCpuArray<_, T> =
        aya::maps::PerCpuArray::try_from(aya::maps::Map::PerCpuArray(data)).ok()?;
    let per_cpu = arr.get(&0, 0).ok()?;
    let mut total = T::default();
    for c in per_cpu.iter() {
        add(&mut total, c);
    }
    Some(total)
}
