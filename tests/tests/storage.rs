//! Storage in the evidence (issue 25), on this host with a real daemon and verifier: a
//! writable loop device and a swap file are residue in the statement's inventory and the
//! verifier contraindicates them under a policy that accepts only what the host had before;
//! `[wipe] swap = "off"` turns the swap off before the wipe and says so; once the loop
//! device is gone the host is affirming again.
//!
//! This host's kernel has loop devices but no device-mapper, so the erase-by-key backend
//! (dm-crypt) is not here.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use rackwarden_tests::{
    Daemon, Net, bin,
    epoch::{
        EpochFixture, Verifier, codes, finding, ids, predicate_of, wait_epoch, wipe_now,
        write_epoch_config,
    },
    run_tool,
};

/// A loop device over a file of `size` bytes, detached when dropped (also when the test
/// fails).
struct LoopDevice {
    dev: Option<String>,
}

impl LoopDevice {
    fn attach(file: &Path, size: u64) -> LoopDevice {
        std::fs::File::create(file).unwrap().set_len(size).unwrap();
        let dev = run_tool(
            "losetup",
            &["--find", "--show", file.to_str().unwrap()],
            None,
        );
        LoopDevice { dev: Some(dev) }
    }
    /// `loop3` for `/dev/loop3`.
    fn name(&self) -> String {
        self.dev
            .as_deref()
            .unwrap_or("")
            .trim_start_matches("/dev/")
            .to_string()
    }
    fn detach(&mut self) {
        if let Some(d) = self.dev.take() {
            let _ = Command::new("losetup").args(["-d", &d]).status();
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        self.detach();
    }
}

/// A swap file, turned on; turned off when dropped (if the daemon has not already).
struct SwapFile {
    path: PathBuf,
}

impl SwapFile {
    fn on(path: &Path, size: u64) -> SwapFile {
        // Allocated, not sparse: swapon refuses a file with holes.
        run_tool(
            "fallocate",
            &["-l", &size.to_string(), path.to_str().unwrap()],
            None,
        );
        run_tool("chmod", &["600", path.to_str().unwrap()], None);
        run_tool("mkswap", &[path.to_str().unwrap()], None);
        run_tool("swapon", &[path.to_str().unwrap()], None);
        SwapFile { path: path.into() }
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        let _ = Command::new("swapoff")
            .arg(&self.path)
            .stderr(std::process::Stdio::null())
            .status();
    }
}

fn delivered(sock: &Path, seq: u64) {
    wait_epoch(sock, Duration::from_secs(90), "statement delivered", |e| {
        e["delivery"]["delivered_seq"] == seq
    });
}

#[test]
fn loop_devices_and_swap_are_residue_and_swap_off_clears_swap() {
    let net = Net::new("stor");
    let fx = EpochFixture::new(&net.dir, 1 << 20);
    let mut v = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    // What this host can keep before the test adds anything (its own disks): the policy
    // accepts exactly that, so any byte more is a finding.
    let before = rackwarden::storage::take(Default::default());
    assert!(before.unreadable.is_empty(), "{:?}", before.unreadable);
    let text = std::fs::read_to_string(&v.config).unwrap();
    let text = text.replace(
        "max_residue_persistent = \"1024 TiB\"",
        &format!("max_residue_persistent = \"{} B\"", before.residue_bytes),
    );
    std::fs::write(&v.config, text).unwrap();
    let (rack, host) = ids(&net);
    v.enroll(&rack, &host, &fx.host_pub);
    v.start();
    let sections = fx.sections(&v.daemon_lines(), "1 h", "16 MiB");
    let cfg = write_epoch_config(&net, &sections);
    let sock = net.socket_path();
    let mut d = Daemon::start(&cfg, &sock);

    // seq 0: the host as it was, within the policy.
    delivered(&sock, 0);
    let h = v.history(&rack, &host);
    let p0 = predicate_of(&h[0]);
    assert!(p0["storage"]["devices"].is_array(), "{p0:#}");
    assert!(
        finding(&h[0], "storage_residue").is_none(),
        "{:?}",
        codes(&h[0])
    );
    assert_eq!(h[0]["status"], "affirming", "{:?}", codes(&h[0]));
    println!(
        "this host's own residue: {} B in {} devices, {} mounts",
        before.residue_bytes,
        before.devices.len(),
        before.mounts.len()
    );

    // seq 1: a 64 MiB loop device and a 32 MiB swap file appear.
    let mut lo = LoopDevice::attach(&net.dir.join("disk.img"), 64 << 20);
    let swap_path = net.dir.join("swap.img");
    let _swap = SwapFile::on(&swap_path, 32 << 20);
    // What an operator sees before deploying: `rackwarden storage` lists it, exit 1.
    let out = Command::new(bin("rackwarden"))
        .args(["storage", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "residue exits 1");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        shown["devices"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["name"] == lo.name() && d["class"]["class"] == "residue"),
        "{shown:#}"
    );
    wipe_now(&sock);
    delivered(&sock, 1);
    let h = v.history(&rack, &host);
    let p1 = predicate_of(&h[1]);
    let dev = p1["storage"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == lo.name())
        .unwrap_or_else(|| panic!("{} not in {:#}", lo.name(), p1["storage"]))
        .clone();
    assert_eq!(dev["kind"]["kind"], "loop", "{dev:#}");
    assert!(
        dev["kind"]["backing_file"]
            .as_str()
            .unwrap()
            .ends_with("disk.img"),
        "{dev:#}"
    );
    assert_eq!(dev["class"]["class"], "residue", "{dev:#}");
    assert_eq!(dev["class"]["writable_bytes"], 64u64 << 20, "{dev:#}");
    let swap = p1["storage"]["swaps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["path"] == swap_path.to_str().unwrap())
        .unwrap_or_else(|| panic!("the swap file is not in {:#}", p1["storage"]))
        .clone();
    assert_eq!(swap["class"]["class"], "residue", "{swap:#}");
    assert_eq!(h[1]["status"], "contraindicated", "{:?}", codes(&h[1]));
    let detail = finding(&h[1], "storage_residue").expect("storage_residue");
    assert!(detail.contains(&format!("{}:", lo.name())), "{detail}");
    assert!(detail.contains("swap.img"), "{detail}");
    println!("seq 1 storage_residue: {detail}");

    // seq 2: `swap = "off"` (a restart with the new config) turns it off before the wipe, and
    // the loop device is configured to be erased by key, which this kernel cannot do.
    d.stop();
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(
        &cfg,
        text.replacen(
            "[wipe]\n",
            &format!(
                "[wipe]\nswap = \"off\"\nerase = [{{ device = \"/dev/{}\" }}]\n",
                lo.name()
            ),
            1,
        ),
    )
    .unwrap();
    let mut d = Daemon::start(&cfg, &sock);
    wipe_now(&sock);
    delivered(&sock, 2);
    let h = v.history(&rack, &host);
    let p2 = predicate_of(&h[2]);
    let off = p2["storage"]["swap_turned_off"].as_array().unwrap();
    assert!(
        off.iter()
            .any(|s| s["path"] == swap_path.to_str().unwrap() && s.get("error").is_none()),
        "{:#}",
        p2["storage"]
    );
    assert!(
        !p2["storage"]["swaps"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["path"] == swap_path.to_str().unwrap()),
        "the swap is off: {:#}",
        p2["storage"]["swaps"]
    );
    assert!(
        !std::fs::read_to_string("/proc/swaps")
            .unwrap()
            .contains("swap.img")
    );
    // Erase by key where the kernel has no device-mapper: refused with the reason, and the
    // device stays residue.
    let dm = Path::new("/sys/class/misc/device-mapper").exists();
    let erased = &p2["storage"]["erased"][0];
    assert_eq!(
        erased["device"],
        format!("/dev/{}", lo.name()),
        "{erased:#}"
    );
    if !dm {
        assert!(
            erased["error"]
                .as_str()
                .is_some_and(|e| e.contains("device-mapper")),
            "{erased:#}"
        );
        assert!(erased.get("header_sha3_256").is_none(), "{erased:#}");
        let failed = finding(&h[2], "storage_erase_failed").expect("storage_erase_failed");
        assert!(failed.contains("device-mapper"), "{failed}");
        println!("seq 2 storage_erase_failed: {failed}");
    } else {
        println!("this host has device-mapper: the refusal is not checked here");
    }
    let detail = finding(&h[2], "storage_residue").expect("the loop device is still residue");
    assert!(
        detail.contains(&format!("{}:", lo.name())) && !detail.contains("swap.img"),
        "{detail}"
    );

    // seq 3: the loop device detached and no longer configured for erasing: back to what
    // the policy accepts.
    d.stop();
    let loop_name = lo.name();
    lo.detach();
    let text = std::fs::read_to_string(&cfg).unwrap();
    let text = text.replace(
        &format!("erase = [{{ device = \"/dev/{loop_name}\" }}]\n"),
        "",
    );
    std::fs::write(&cfg, text).unwrap();
    let mut d = Daemon::start(&cfg, &sock);
    wipe_now(&sock);
    delivered(&sock, 3);
    let h = v.history(&rack, &host);
    assert!(
        finding(&h[3], "storage_residue").is_none(),
        "{:?}",
        finding(&h[3], "storage_residue")
    );
    assert_eq!(h[3]["status"], "affirming", "{:?}", codes(&h[3]));
    d.stop();
}
