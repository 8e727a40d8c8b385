//! The `setsockopt` refusals that keep traffic on tc: a socket option that would let a
//! process send past the policer (`PACKET_QDISC_BYPASS`, an AF_XDP umem) is refused for every
//! process on the host. In both limiter objects, plain and tapped.

use aya_ebpf::{
    helpers::{bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{cgroup_sockopt, map},
    maps::PerCpuArray,
    programs::SockoptContext,
};
use rackwarden_common::{PACKET_QDISC_BYPASS, RefusalCounters, SOL_PACKET, SOL_XDP, XDP_UMEM_REG};

#[map(name = "RW_REFUSALS")]
static RW_REFUSALS: PerCpuArray<RefusalCounters> = PerCpuArray::pinned(1, 0);

/// Attached at the cgroup v2 root: every process's `setsockopt` passes here. Returning 0
/// makes the call fail with EPERM; 1 lets it through unchanged.
#[cgroup_sockopt(setsockopt)]
pub fn rw_sockopt(ctx: SockoptContext) -> i32 {
    // SAFETY: the context pointer is valid for the program's run.
    let (level, optname) = unsafe { ((*ctx.sockopt).level, (*ctx.sockopt).optname) };
    let refuse = (level == SOL_PACKET && optname == PACKET_QDISC_BYPASS)
        || (level == SOL_XDP && optname == XDP_UMEM_REG);
    if !refuse {
        return 1;
    }
    if let Some(c) = RW_REFUSALS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU touches it while this program runs.
        let c = unsafe { &mut *c };
        if optname == PACKET_QDISC_BYPASS {
            c.qdisc_bypass = c.qdisc_bypass.wrapping_add(1);
        } else {
            c.xdp_umem_reg = c.xdp_umem_reg.wrapping_add(1);
        }
        // SAFETY: helpers without preconditions.
        unsafe {
            c.last_ns = bpf_ktime_get_ns();
            c.last_cgroup_id = bpf_get_current_cgroup_id();
            c.last_tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
        }
        c.last_optname = optname;
    }
    0
}
