//! The bypass surface software on this host cannot close: listed in every status and
//! statement so the verifier sees it, never assumed away.

/// Names of all network interfaces in the current network namespace.
pub fn interfaces() -> Vec<String> {
    nix::net::if_::if_nameindex()
        .map(|list| {
            list.iter()
                .map(|i| i.name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

fn dir_names(path: &str, keep: impl Fn(&str) -> bool) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(path)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| keep(n))
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// AF_XDP sockets open on the host (`ss --xdp`); None when they cannot be counted.
pub fn af_xdp_sockets() -> Option<u64> {
    let out = std::process::Command::new("ss")
        .args(["-a", "--xdp", "-H"])
        .output()
        .ok()?;
    out.status.success().then(|| {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.trim().is_empty())
            .count() as u64
    })
}

/// The surface, given the interfaces the limiter caps.
pub fn scan(capped: &[String]) -> (Vec<String>, Vec<String>, Vec<String>, Option<u64>) {
    let rdma = dir_names("/sys/class/infiniband", |_| true);
    let vfio = dir_names("/sys/bus/pci/drivers/vfio-pci", |n| n.contains(':'));
    let uncapped = interfaces()
        .into_iter()
        .filter(|i| i != "lo" && !capped.contains(i))
        .collect();
    (rdma, vfio, uncapped, af_xdp_sockets())
}

/// The refusal protection, its counts, and the surface software cannot block.
pub fn bypass_report(
    cfg: &crate::config::Config,
    pins: &crate::pins::PinPaths,
) -> rackwarden_attest::evidence::BypassReport {
    let (rdma_devices, vfio_devices, uncapped_interfaces, af_xdp_sockets) = scan(&cfg.interfaces);
    rackwarden_attest::evidence::BypassReport {
        refusal: crate::limiter::sockopt::inspect(pins, cfg.refusal_cgroup.as_deref()),
        refusals: crate::limiter::sockopt::refusal_counts(pins),
        rdma_devices,
        vfio_devices,
        uncapped_interfaces,
        af_xdp_sockets,
    }
}
