//! The bpf filters on a clsact hook, dumped over rtnetlink in this process (`RTM_GETTFILTER`,
//! what `tc filter show` sends). In-process rather than by running `tc`: under the BPF LSM
//! guard only the daemon's own process may look at our programs, and a `tc` child asking
//! for their fds would be refused (and counted as an attack) at every check.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use super::Direction;

const RTM_NEWTFILTER: u16 = 44;
const RTM_GETTFILTER: u16 = 46;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_DUMP: u16 = 0x300;
const NLMSG_HDRLEN: usize = 16;
const TCMSG_LEN: usize = 20;
const TCA_KIND: u16 = 1;
const TCA_OPTIONS: u16 = 2;
const TCA_BPF_NAME: u16 = 7;
const TCA_BPF_ID: u16 = 11;
/// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_INGRESS / TC_H_MIN_EGRESS)`.
const PARENT_INGRESS: u32 = 0xFFFF_FFF2;
const PARENT_EGRESS: u32 = 0xFFFF_FFF3;

/// One bpf filter: its priority, handle, and program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfFilter {
    pub pref: u16,
    pub handle: u32,
    pub prog_id: u32,
    pub prog_name: String,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// The (type, payload) rtattrs in `b`.
fn attrs(b: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    let mut off = 0;
    while let (Some(len), Some(ty)) = (u16_at(b, off), u16_at(b, off + 2)) {
        let len = len as usize;
        if len < 4 || off + len > b.len() {
            break;
        }
        out.push((ty & 0x3fff, &b[off + 4..off + len]));
        off += (len + 3) & !3;
    }
    out
}

fn c_string(b: &[u8]) -> String {
    let end = b.iter().position(|c| *c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

/// The bpf filters on `dir` of interface `ifindex` (in this thread's network namespace).
pub fn bpf_filters(ifindex: u32, dir: Direction) -> std::io::Result<Vec<BpfFilter>> {
    // SAFETY: socket(2); the fd is owned below.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            libc::NETLINK_ROUTE,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = [0u8; NLMSG_HDRLEN + TCMSG_LEN];
    let len = req.len() as u32;
    req[0..4].copy_from_slice(&len.to_ne_bytes());
    req[4..6].copy_from_slice(&RTM_GETTFILTER.to_ne_bytes());
    req[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    req[8..12].copy_from_slice(&1u32.to_ne_bytes());
    let parent = match dir {
        Direction::Egress => PARENT_EGRESS,
        Direction::Ingress => PARENT_INGRESS,
    };
    req[NLMSG_HDRLEN + 4..NLMSG_HDRLEN + 8].copy_from_slice(&ifindex.to_ne_bytes());
    req[NLMSG_HDRLEN + 12..NLMSG_HDRLEN + 16].copy_from_slice(&parent.to_ne_bytes());
    // SAFETY: send(2) of a buffer that outlives the call.
    let r = unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut filters = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        // SAFETY: recv(2) into our buffer.
        let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let b = &buf[..n as usize];
        let mut off = 0;
        while let (Some(len), Some(ty)) = (u32_at(b, off), u16_at(b, off + 4)) {
            let len = len as usize;
            if len < NLMSG_HDRLEN || off + len > b.len() {
                return Err(std::io::Error::other(format!(
                    "rtnetlink: message of {len} bytes at byte offset {off} of a {} byte reply",
                    b.len()
                )));
            }
            let msg = &b[off..off + len];
            match ty {
                NLMSG_DONE => return Ok(filters),
                NLMSG_ERROR => {
                    let code = u32_at(msg, NLMSG_HDRLEN).unwrap_or(0) as i32;
                    if code != 0 {
                        return Err(std::io::Error::from_raw_os_error(-code));
                    }
                }
                RTM_NEWTFILTER if msg.len() >= NLMSG_HDRLEN + TCMSG_LEN => {
                    let t = NLMSG_HDRLEN;
                    let handle = u32_at(msg, t + 8).unwrap_or(0);
                    let pref = (u32_at(msg, t + 16).unwrap_or(0) >> 16) as u16;
                    let all = attrs(&msg[t + TCMSG_LEN..]);
                    let is_bpf = all
                        .iter()
                        .any(|(k, v)| *k == TCA_KIND && c_string(v) == "bpf");
                    let opts = all.iter().find(|(k, _)| *k == TCA_OPTIONS);
                    if let (true, Some((_, opts))) = (is_bpf, opts) {
                        let o = attrs(opts);
                        let id = o
                            .iter()
                            .find(|(k, _)| *k == TCA_BPF_ID)
                            .and_then(|(_, v)| u32_at(v, 0));
                        let name = o
                            .iter()
                            .find(|(k, _)| *k == TCA_BPF_NAME)
                            .map(|(_, v)| c_string(v))
                            .unwrap_or_default();
                        if let Some(prog_id) = id {
                            filters.push(BpfFilter {
                                pref,
                                handle,
                                prog_id,
                                prog_name: name,
                            });
                        }
                    }
                }
                _ => {}
            }
            off += (len + 3) & !3;
        }
    }
}
