//! Erase by key on a real second disk (issue 25): the `storage` group of `cargo xtask
//! vm-test` boots the guest with an empty 64 MiB virtio disk (`/dev/vda`) and the Debian
//! kernel's dm-crypt. A real daemon keeps it as a scratch volume erased by key at every
//! epoch and a real verifier (policy `max_residue_persistent = 0`) judges the statements:
//! - state a workload writes to the volume is on the medium only as ciphertext;
//! - after the epoch the volume is a fresh, empty filesystem under a new key, the raw disk
//!   and the new mapping hold no trace of the state, the header digest changed, and the
//!   statement says `erased` and is affirming;
//! - the old key (which the test, as root, read from the kernel before the epoch: the daemon
//!   keeps it nowhere) is tried on the medium and what it reads is reported;
//! - without `erase` the disk is residue and the verdict contraindicated.
//!
//! Only in the guest: on a host (no `RACKWARDEN_VM`, or no `/dev/vda`) the test says why and
//! returns; `tests/tests/storage.rs` covers the inventory and the refusal without
//! device-mapper there.

use std::{
    io::Write as _,
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use rackwarden_tests::{
    Daemon, Net,
    epoch::{
        EpochFixture, Verifier, codes, ids, predicate_of, wait_epoch, wipe_now, write_epoch_config,
    },
    run_tool,
};

const DISK: &str = "/dev/vda";
const MAPPING: &str = "rw-erase-vda";
const MOUNT: &str = "/tmp/rw-scratch";

/// Fails, saying why, unless this is the `storage` VM group's guest (its second disk): an
/// ignored test run by hand elsewhere must not pass without checking anything.
fn require_storage_guest() {
    assert!(
        std::env::var_os("RACKWARDEN_VM").is_some(),
        "not in a vm-test guest (RACKWARDEN_VM unset): `cargo xtask vm-test --group storage` runs this"
    );
    assert!(
        Path::new(DISK).exists(),
        "this guest has no {DISK} (not the `storage` group)"
    );
}

/// Every byte of a block device, past the page cache.
fn read_device(dev: &str) -> Vec<u8> {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
    run_tool("blockdev", &["--flushbufs", dev], None);
    std::fs::read(dev).unwrap_or_else(|e| panic!("reading {dev}: {e}"))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    memchr::memmem::find(hay, needle).is_some()
}

fn delivered(sock: &Path, seq: u64) {
    wait_epoch(sock, Duration::from_secs(120), "statement delivered", |e| {
        e["delivery"]["delivered_seq"] == seq
    });
}

fn vda_of(p: &serde_json::Value) -> serde_json::Value {
    p["storage"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "vda")
        .unwrap_or_else(|| panic!("vda not in {:#}", p["storage"]))
        .clone()
}

#[test]
#[ignore = "needs the `storage` vm-test guest (a second disk it may erase); `cargo xtask vm-test --group storage` runs it"]
fn a_scratch_volume_erased_by_key_forgets_and_an_unerased_disk_is_residue() {
    require_storage_guest();
    let net = Net::new("erase");
    let fx = EpochFixture::new(&net.dir, 1 << 20);
    let mut v = Verifier::configure(&net, &fx.manifest, &fx.verifier_pub, "64 GiB");
    // The guest has no disk but this one: the policy accepts no persistent residue at all.
    let text = std::fs::read_to_string(&v.config).unwrap();
    std::fs::write(
        &v.config,
        // In this guest nothing but the test itself could write the raw disk: the policy
        // credits erase by key (by default an erased volume counts in full).
        text.replace(
            "max_residue_persistent = \"1024 TiB\"",
            "max_residue_persistent = \"0 B\"\ncredit_erase_by_key = true",
        ),
    )
    .unwrap();
    let (rack, host) = ids(&net);
    v.enroll(&rack, &host, &fx.host_pub);
    v.start();
    let sections = fx.sections(&v.daemon_lines(), "1 h", "16 MiB");
    let erase_line = format!("erase = [{{ device = \"{DISK}\", mount = \"{MOUNT}\" }}]\n");
    let cfg = write_epoch_config(
        &net,
        &sections.replacen("[wipe]\n", &format!("[wipe]\n{erase_line}"), 1),
    );
    let sock = net.socket_path();
    let mut d = Daemon::start(&cfg, &sock);

    // seq 0: the first epoch keys the volume and mounts a fresh filesystem.
    delivered(&sock, 0);
    let h = v.history(&rack, &host);
    let p0 = predicate_of(&h[0]);
    let e0 = p0["storage"]["erased"][0].clone();
    assert!(e0.get("error").is_none(), "{e0:#}");
    assert_eq!(vda_of(&p0)["class"]["class"], "erased");
    assert_eq!(h[0]["status"], "affirming", "{:?}", codes(&h[0]));

    // A workload keeps its state on the volume.
    let marker = format!("RACKWARDEN-STATE-{}", std::process::id());
    let state: Vec<u8> = marker.as_bytes().repeat((1 << 20) / marker.len());
    std::fs::write(Path::new(MOUNT).join("state.bin"), &state).unwrap();
    run_tool("sync", &[], None);
    assert!(
        contains(
            &read_device(&format!("/dev/mapper/{MAPPING}")),
            marker.as_bytes()
        ),
        "the state is on the volume"
    );
    assert!(
        !contains(&read_device(DISK), marker.as_bytes()),
        "the medium holds the state only as ciphertext"
    );
    // Root can read the live key from the kernel; the test keeps it to show what it unlocks.
    let table = run_tool("dmsetup", &["table", "--showkeys", MAPPING], None);
    let old_key = table
        .split_whitespace()
        .nth(4)
        .map(|k| hex::decode(k).unwrap())
        .unwrap_or_else(|| panic!("no key in {table}"));

    // seq 1: the epoch erases it by key.
    wipe_now(&sock);
    delivered(&sock, 1);
    let h = v.history(&rack, &host);
    let p1 = predicate_of(&h[1]);
    let e1 = p1["storage"]["erased"][0].clone();
    assert!(e1.get("error").is_none(), "{e1:#}");
    assert_ne!(e1["header_sha3_256"], e0["header_sha3_256"], "a new header");
    assert_eq!(vda_of(&p1)["class"]["class"], "erased");
    assert_eq!(h[1]["status"], "affirming", "{:?}", codes(&h[1]));
    assert!(
        !Path::new(MOUNT).join("state.bin").exists(),
        "a fresh filesystem"
    );
    assert!(
        !contains(
            &read_device(&format!("/dev/mapper/{MAPPING}")),
            marker.as_bytes()
        ),
        "the new key decrypts no trace of the state"
    );
    assert!(!contains(&read_device(DISK), marker.as_bytes()));
    // The old key (which the daemon never stored) against the medium now: whatever the new
    // filesystem has not overwritten still decrypts under it, so the erase is the key
    // ceasing to exist. Reported, not asserted: it depends on where mkfs wrote.
    run_tool(
        "cryptsetup",
        &[
            "open",
            "--type",
            "plain",
            "--cipher",
            "aes-xts-plain64",
            "--key-size",
            "512",
            "--key-file",
            "-",
            "--keyfile-size",
            "64",
            "--readonly",
            "--shared",
            DISK,
            "rw-old-key",
        ],
        Some(&old_key),
    );
    let old_view = contains(&read_device("/dev/mapper/rw-old-key"), marker.as_bytes());
    run_tool("cryptsetup", &["close", "rw-old-key"], None);
    println!(
        "RW_REPORT with the old key (read from the kernel by the test before the epoch), the state is {}",
        if old_view {
            "still readable on the medium: only the key's end erased it"
        } else {
            "no longer readable: the new filesystem overwrote its blocks"
        }
    );
    // The erase against its anchor, a zero fill of the same 64 MiB (synced), at the end.
    let erase_ms = e1["erase_ms"].as_u64().unwrap();
    let size = e1["size_bytes"].as_u64().unwrap();
    let downtime_ms = p1["epoch"]["downtime_ms"].as_u64().unwrap();

    // seq 2: without `erase` the disk is residue and the verdict contraindicated.
    d.stop();
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, text.replace(&erase_line, "")).unwrap();
    let mut d = Daemon::start(&cfg, &sock);
    wipe_now(&sock);
    delivered(&sock, 2);
    let h = v.history(&rack, &host);
    let p2 = predicate_of(&h[2]);
    assert_eq!(
        vda_of(&p2)["class"]["class"],
        "residue",
        "{:#}",
        p2["storage"]
    );
    assert_eq!(h[2]["status"], "contraindicated", "{:?}", codes(&h[2]));
    assert!(codes(&h[2]).contains(&"storage_residue".to_string()));
    d.stop();

    let _ = Command::new("umount").arg(MOUNT).status();
    let _ = Command::new("cryptsetup").args(["close", MAPPING]).status();
    let t0 = Instant::now();
    let mut f = std::fs::OpenOptions::new().write(true).open(DISK).unwrap();
    f.write_all(&vec![0u8; size as usize]).unwrap();
    f.sync_all().unwrap();
    let fill_ms = t0.elapsed().as_secs_f64() * 1e3;
    println!(
        "RW_REPORT erase by key of a {} MiB volume: {erase_ms} ms (close, new key, mkfs.ext4, mount); zero fill of the same {} MiB: {fill_ms:.0} ms; ratio {:.2}x; epoch downtime with the volume: {downtime_ms} ms",
        size >> 20,
        size >> 20,
        erase_ms as f64 / fill_ms.max(1.0)
    );
}
