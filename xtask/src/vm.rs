//! `cargo xtask vm-test`: the integration tests that touch the kernel, run inside VMs on the
//! kernels rack hosts run.
//!
//! - Kernels: Debian's cloud kernels, fetched with `apt-get download` and unpacked with
//!   `dpkg -x` under `target/vm/kernels/` (never installed). By default the one
//!   `linux-image-cloud-amd64` depends on (6.1: no tcx, so the policer is a netlink clsact
//!   filter) and the newest cloud kernel the registry has (tcx). `--kernel PATH` boots any
//!   other bzImage (its modules, if any, from `--modules DIR`).
//! - Guest root: one initramfs per kernel, written here (busybox, iproute2, the daemon, the
//!   CLI, the verifier, the test binaries stripped of debug info, their shared libraries, and
//!   the kernel's tc and veth modules) and cached by the content of what goes in.
//! - One VM per test group, as many at once as the host has CPUs for their vCPUs, under TCG (`-cpu max`: this machine's
//!   `/dev/kvm` is a nested device qemu cannot use). The guest's `/init` prints
//!   `RW_VM_BOOTED` when userspace starts and `RW_VM_EXIT=<code>` after the group's tests;
//!   a boot that never prints the first is retried once, then reported as a harness failure.
//!   The console log of every run is kept under `target/vm/logs/`.
//! - Firmware: SeaBIOS (qemu's default) for most groups; the `tpm` group boots the same
//!   `-kernel`/`-initrd` through Debian's OVMF, so that the firmware measures the kernel into
//!   PCR 4 and the kernel's EFI stub the initrd and command line into PCR 9 (measured boot),
//!   and is told what those measurements must be (`rw.kernel_sha256=`, `rw.initrd_sha256=`).

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt::Write as _,
    hash::{Hash as _, Hasher as _},
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result, bail};

use crate::{apt_install, apt_update_and_install, cargo, output, run_checked, step};

/// Host packages the harness needs.
const VM_PACKAGES: &[&str] = &[
    "qemu-system-x86",
    "busybox-static",
    "cpio",
    "xz-utils",
    "binutils",
    "kmod",
    // UEFI firmware for the measured-boot group (see [`Firmware::Ovmf`]), and the compressor
    // of that group's initrd (see [`compressed_initrd`]).
    "ovmf",
    "zstd",
    // The secure-boot group's disk: its FAT file system and its partition table (esp.rs).
    "mtools",
    "fdisk",
    // The storage group's erase by key (`cryptsetup`, `dmsetup`, `mkfs.ext4` in the guest).
    "cryptsetup-bin",
    "dmsetup",
    "e2fsprogs",
];

/// Modules the tests need that Debian's cloud kernels build as modules.
const MODULES: &[&str] = &[
    "veth",
    "sch_ingress",
    "cls_bpf",
    "act_bpf",
    // The taps group's loss and reordering (`tc qdisc ... netem`).
    "sch_netem",
    // The storage group: its second disk and dm-crypt with AES-XTS (built in where no file).
    "virtio_pci",
    "virtio_blk",
    "dm_crypt",
    "xts",
    // xts(aes) is instantiated as xts(ecb(aes)): a module on 6.1, built in on 6.12.
    "ecb",
];

/// The storage group's second virtual disk (`/dev/vda` in the guest).
const SCRATCH_DISK_BYTES: u64 = 64 << 20;

/// Guest memory and CPUs: two CPUs so the two-senders test runs on two CPUs; 3 GiB so the
/// epoch guest wipes its 512 MiB beside an initramfs that carries the test binaries (about
/// 320 MB unpacked since the test library links the inference crate).
const GUEST_MEM_MIB: u64 = 3072;
const GUEST_CPUS: u32 = 2;
/// The guest epoch test wipes this much of the guest's RAM (and reports the coverage).
const GUEST_WIPE: &str = "512 MiB";
/// A group that has not finished after this long is killed and reported as failed.
const GROUP_TIMEOUT: Duration = Duration::from_secs(900);

/// A test group: one VM runs one test binary (optionally only some of its tests).
struct Group {
    name: &'static str,
    /// The integration test target in `tests/tests/`.
    target: &'static str,
    /// libtest filters (exact names); empty runs the whole target.
    tests: &'static [&'static str],
    /// Runs the target's ignored tests too (`--include-ignored`): tests that only make sense
    /// in a guest are ignored on the host with a reason and run here.
    ignored: bool,
    /// The guest gets a TPM (swtpm behind qemu's `tpm-tis`, manufactured with an EK
    /// certificate from a private CA whose PEMs are in the guest under `/rw/tpm-ca/`) and IMA
    /// measures into it (`ima_policy=tcb ima_template=ima-ng`, a ramfs root so that IMA
    /// measures what runs from it: the tcb policy skips tmpfs).
    tpm: bool,
    /// `bpf` is among the guest's active LSMs (`lsm=`). Without it the guard must run as
    /// `fmod_ret` programs on `security_*`, as on a host whose kernel was booted without BPF
    /// LSM (Debian's default list leaves it out).
    bpf_lsm: bool,
    /// What the guest boots through: the measured-boot group needs UEFI.
    firmware: Firmware,
    /// The guest gets a second, empty virtio disk of [`SCRATCH_DISK_BYTES`] (`/dev/vda`).
    scratch_disk: bool,
    /// Part of a plain `vm-test` (and so of `cargo xtask test`); a group that is not runs
    /// only when named with `--group`.
    default: bool,
}

const GROUPS: &[Group] = &[
    Group {
        name: "limiter",
        target: "limiter",
        tests: &[],
        ignored: false,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    // The tap on both kernels (6.1: clsact and its verifier; newest: tcx), and the test that
    // needs `netem`, which the CI host's kernel lacks.
    Group {
        name: "taps",
        target: "taps",
        tests: &[],
        ignored: true,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    Group {
        name: "enforcement",
        target: "enforcement",
        tests: &[],
        ignored: false,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    Group {
        name: "bypass",
        target: "bypass",
        tests: &[],
        ignored: false,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    Group {
        name: "upgrade",
        target: "upgrade",
        tests: &[],
        ignored: false,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    Group {
        name: "guard",
        target: "guard",
        tests: &[],
        ignored: false,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    // The guard on a kernel booted without BPF LSM: the same matrix, every path refused by
    // fmod_ret programs on the kernel's security_* functions.
    Group {
        name: "guard-fmod-ret",
        target: "guard",
        tests: &[],
        ignored: false,
        tpm: false,
        bpf_lsm: false,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    Group {
        name: "epoch",
        target: "epoch",
        tests: &["a_full_epoch_is_signed_delivered_and_affirming"],
        ignored: false,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    // Hundreds of daemon starts of the tamper watch beside CPUs busy with syscalls: the
    // watch is attached once per boot, and any kernel oops fails the group by name.
    Group {
        name: "watch",
        target: "watch",
        tests: &[
            "hundreds_of_daemon_starts_beside_busy_cpus_attach_the_watch_at_most_once",
            "a_bpf_call_that_touches_none_of_our_hooks_is_not_a_warning",
            "the_fexit_watch_cost_is_measured_in_the_guests",
        ],
        ignored: true,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: true,
    },
    // The old attach/detach at every start, to reproduce the int3 oops it caused under
    // multi-threaded TCG (`--group watch-raw [--accel tcg,thread=single] [--cpu MODEL]`).
    Group {
        name: "watch-raw",
        target: "watch",
        tests: &["raw_attach_detach_loop"],
        ignored: true,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: false,
        default: false,
    },
    // A real (emulated) TPM in the guest and IMA measuring into it: the EK certificate, an
    // AK, a quote of PCRs 0-7 and 10, and the kernel's IMA list replayed to the quoted PCR 10.
    // Booted through OVMF: the firmware's event log replays to the quoted PCRs 0-9, with the
    // kernel in PCR 4 and the initrd and command line in PCR 9.
    Group {
        name: "tpm",
        target: "tpm_guest",
        // All but the secure-boot group's test (its boot is shim and GRUB's).
        tests: &[
            "the_quoted_pcr10_is_the_replay_of_the_kernels_ima_list",
            "a_new_executable_is_measured_with_its_sha256",
            "the_quoted_boot_pcrs_are_the_replay_of_the_firmware_event_log",
            "the_tpm_attack_matrix_in_the_guest",
            "the_boot_is_judged_from_the_event_log_in_the_guest",
            "the_tpm_is_kept_for_the_daemon_by_the_guard",
        ],
        ignored: true,
        tpm: true,
        bpf_lsm: true,
        firmware: Firmware::Ovmf,
        scratch_disk: false,
        default: true,
    },
    // Debian's Secure Boot chain from a disk: OVMF with Microsoft's keys enrolled starts
    // Debian's signed shim, shim verifies Debian's signed GRUB, GRUB has shim verify the
    // signed kernel and reads it and the initrd from the ESP the harness built (esp.rs).
    // Booted without `bpf` in `lsm=`, so GRUB's measured command line contradicts a guard
    // claimed as BPF LSM programs.
    Group {
        name: "secure-boot",
        target: "tpm_guest",
        tests: &["the_shim_and_grub_secure_boot_is_judged_in_the_guest"],
        ignored: true,
        tpm: true,
        bpf_lsm: false,
        firmware: Firmware::SecureBootDisk,
        scratch_disk: false,
        default: true,
    },
    // A scratch volume on a second virtual disk, erased by key at every epoch (dm-crypt):
    // state written before an epoch is gone after it, or the disk is residue.
    Group {
        name: "storage",
        target: "erase_guest",
        tests: &[],
        ignored: true,
        tpm: false,
        bpf_lsm: true,
        firmware: Firmware::SeaBios,
        scratch_disk: true,
        default: true,
    },
];

/// The guest's firmware.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Firmware {
    /// qemu's default BIOS: boots `-kernel` directly, the fastest.
    SeaBios,
    /// Debian's OVMF (UEFI, without Secure Boot): with a TPM it measures what it starts (the
    /// kernel's PE image, loaded from fw_cfg, into PCR 4) and logs it, and the kernel's EFI
    /// stub measures the initrd and the command line (LoadOptions) into PCR 9. The code is
    /// read-only; each boot gets its own copy of the variable store.
    Ovmf,
    /// OVMF built for Secure Boot (SMM), its variable store with Microsoft's keys enrolled
    /// (`PK`/`KEK` and `db` with the UEFI CA 2011 that signs shim), booting a disk: shim,
    /// GRUB, the kernel and the initrd from an ESP ([`crate::esp`]). The kernel enforces
    /// lockdown (integrity) as on a Secure Boot host.
    SecureBootDisk,
}

impl Firmware {
    /// The code (read-only) and the variable store template of an OVMF boot.
    fn ovmf_images(self) -> Option<(&'static str, &'static str)> {
        match self {
            Firmware::SeaBios => None,
            Firmware::Ovmf => Some((OVMF_CODE, OVMF_VARS)),
            Firmware::SecureBootDisk => Some((OVMF_SECBOOT_CODE, OVMF_MS_VARS)),
        }
    }

    /// Whether the firmware keeps its variable store in SMM (Secure Boot's keys writable only
    /// through the firmware): the machine needs `smm=on` and a secure pflash.
    fn smm(self) -> bool {
        self == Firmware::SecureBootDisk
    }
}

/// Debian `ovmf`'s 4 MiB images (the pair qemu's firmware descriptor
/// `60-edk2-x86_64.json` names for q35 without Secure Boot or SMM).
const OVMF_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.fd";
const OVMF_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.fd";
/// Debian `ovmf`'s Secure Boot pair: SMM-protected variables, Microsoft's keys enrolled.
const OVMF_SECBOOT_CODE: &str = "/usr/share/OVMF/OVMF_CODE_4M.secboot.fd";
const OVMF_MS_VARS: &str = "/usr/share/OVMF/OVMF_VARS_4M.ms.fd";

/// How qemu runs the guests: `--accel` and `--cpu` of `vm-test` (the reproduction of a
/// TCG fault compares accelerators and CPU models).
#[derive(Clone)]
struct Machine {
    accel: String,
    cpu: String,
}

/// A kernel to boot.
#[derive(Clone)]
struct GuestKernel {
    /// What the summary calls it (the package or the file name).
    label: String,
    vmlinuz: PathBuf,
    /// `lib/modules/<release>` of this kernel, if it has modules.
    modules: Option<PathBuf>,
}

/// `cargo xtask vm-test [--kernel PATH [--modules DIR]] [--group NAME]...`
pub fn vm_test(env: &BTreeMap<String, String>, args: &[String]) -> Result<()> {
    apt_install(VM_PACKAGES)?;
    ensure_qemu_without_tcg_race();
    let kernels = match flag(args, "--kernel")? {
        Some(path) => vec![GuestKernel {
            label: Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or(path.clone()),
            vmlinuz: PathBuf::from(&path),
            modules: flag(args, "--modules")?.map(PathBuf::from),
        }],
        None => debian_kernels()?,
    };
    let only: Vec<String> = args
        .windows(2)
        .filter(|w| w[0] == "--group")
        .map(|w| w[1].clone())
        .collect();
    let groups: Vec<&Group> = GROUPS
        .iter()
        .filter(|g| {
            if only.is_empty() {
                g.default
            } else {
                only.iter().any(|o| o == g.name)
            }
        })
        .collect();
    let machine = Machine {
        accel: flag(args, "--accel")?.unwrap_or_else(|| "tcg".into()),
        cpu: flag(args, "--cpu")?.unwrap_or_else(|| "max".into()),
    };
    if groups.is_empty() {
        bail!(
            "no test group named {only:?}; groups: {}",
            GROUPS.iter().map(|g| g.name).collect::<Vec<_>>().join(", ")
        );
    }

    step("build the daemon, the tools and the test binaries for the guest");
    cargo(env, &["build", "--workspace", "--bins"])?;
    let tests = test_executables(env, &groups)?;

    let common = common_root(&tests)?;
    // One manufactured TPM per run of vm-test: its CA goes into the guest root (so into the
    // initramfs hash), and every boot of a TPM group runs swtpm on a copy of its state.
    let tpm = if groups.iter().any(|g| g.tpm) {
        step("swtpm_setup: a TPM with an EK certificate from a private CA");
        let m = ManufacturedTpm::new()?;
        let ca = common.join("rw/tpm-ca");
        std::fs::create_dir_all(&ca)?;
        std::fs::copy(
            m.dir.join("ca/swtpm-localca-rootca-cert.pem"),
            ca.join("root.pem"),
        )
        .context("swtpm_setup wrote no root CA")?;
        std::fs::copy(m.dir.join("ca/issuercert.pem"), ca.join("intermediate.pem"))
            .context("swtpm_setup wrote no issuing CA")?;
        Some(m)
    } else {
        None
    };
    let chain = if groups
        .iter()
        .any(|g| g.firmware == Firmware::SecureBootDisk)
    {
        Some(crate::esp::SignedChain::fetch()?)
    } else {
        None
    };
    let mut runs = Vec::new();
    for k in &kernels {
        let initrd = initramfs(&common, k)?;
        // A UEFI guest's initrd (zstd: the firmware or GRUB hashes all of it).
        let zst = if groups.iter().any(|g| g.firmware != Firmware::SeaBios) {
            Some(compressed_initrd(&initrd)?)
        } else {
            None
        };
        for g in &groups {
            let (initrd, boot_digests) = match (&zst, g.firmware) {
                (Some(zst), Firmware::Ovmf | Firmware::SecureBootDisk) => (
                    zst.clone(),
                    Some(BootDigests::of(g.firmware, k, zst, chain.as_ref())?),
                ),
                _ => (initrd.clone(), None),
            };
            runs.push(Run {
                kernel: k.clone(),
                machine: machine.clone(),
                group: g,
                initrd,
                tpm_state: tpm
                    .as_ref()
                    .filter(|_| g.tpm)
                    .map(|m| m.dir.join("state/tpm2-00.permall")),
                boot_digests,
                chain: chain
                    .clone()
                    .filter(|_| g.firmware == Firmware::SecureBootDisk),
                outcome: None,
            });
        }
    }
    // As many guests as the host has CPUs for all their vCPUs: an emulated CPU that shares a
    // host core with another is too slow for the rate tests to offer their load.
    let parallel = (std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        / GUEST_CPUS as usize)
        .max(1);
    step(&format!(
        "boot {} VMs ({} kernels x {} groups), {parallel} at a time",
        runs.len(),
        kernels.len(),
        groups.len()
    ));
    let started = Instant::now();
    run_all(&mut runs, parallel);
    let total = started.elapsed();
    let (table, ok) = summary(&runs, total);
    println!("{table}");
    std::fs::write("target/vm/summary.txt", &table).ok();
    if !ok {
        bail!("VM tests failed (console logs under target/vm/logs/)");
    }
    println!("==> VM tests passed");
    Ok(())
}

fn flag(args: &[String], name: &str) -> Result<Option<String>> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => args
            .get(i + 1)
            .cloned()
            .map(Some)
            .with_context(|| format!("{name} needs a value")),
    }
}

/// The QEMU that has the fix for the multi-threaded TCG race behind the guest `int3` oops
/// (a vCPU could translate a page while another wrote to it and keep running the stale
/// translation: a kernel's live patch of its own text then met a breakpoint it had already
/// removed). Fixed in QEMU 8.1 ("accel/tcg: Always lock pages before translation"), with a
/// regression for blocks that cross a page fixed in 9.0.2/9.1; Debian bookworm ships 7.2.
const QEMU_TCG_FIXED: (u64, u64, u64) = (9, 0, 2);

/// The running QEMU's version, from `qemu-system-x86_64 --version`.
fn qemu_version() -> Option<(u64, u64, u64)> {
    let out = output(Command::new("qemu-system-x86_64").arg("--version"))?;
    let v = out
        .split_whitespace()
        .skip_while(|w| *w != "version")
        .nth(1)?;
    let mut n = v
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse().unwrap_or(0));
    Some((n.next()?, n.next().unwrap_or(0), n.next().unwrap_or(0)))
}

/// Where the guests' QEMU is older than [`QEMU_TCG_FIXED`], installs the distribution's
/// backported one (bookworm-backports carries QEMU 10), from the same mirror the host's
/// Debian sources name. Best effort: on failure the guests run on the old QEMU, which is
/// said, and the daemon still live-patches the kernel at most once per boot (the tamper
/// watch is pinned), so the race is rare but not gone.
fn ensure_qemu_without_tcg_race() {
    let have = qemu_version();
    if have.is_some_and(|v| v >= QEMU_TCG_FIXED) {
        return;
    }
    let step_result = (|| -> Result<()> {
        let uri = debian_mirror().context("no Debian bookworm source in /etc/apt")?;
        let list = "/etc/apt/sources.list.d/rackwarden-bookworm-backports.sources";
        std::fs::write(
            list,
            format!(
                "# Added by `cargo xtask vm-test`: a QEMU without the TCG race (xtask/src/vm.rs).\n\
                 Types: deb\nURIs: {uri}\nSuites: bookworm-backports\nComponents: main\n\
                 Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
            ),
        )
        .with_context(|| format!("writing {list}"))?;
        step("apt-get install -t bookworm-backports qemu-system-x86 (QEMU >= 9.0.2 for TCG)");
        apt_update_and_install(&["-t", "bookworm-backports", "qemu-system-x86"])
    })();
    match (step_result, qemu_version()) {
        (Ok(()), Some(v)) if v >= QEMU_TCG_FIXED => {}
        (r, v) => eprintln!(
            "WARNING: the guests run on QEMU {v:?}, which has the multi-threaded TCG race \
             (fixed in 9.0.2): a guest kernel's live patch can oops ({})",
            r.err()
                .map_or("the backport did not replace it".into(), |e| e.to_string())
        ),
    }
}

/// The URI of the host's Debian bookworm source (deb822 or one-line format).
fn debian_mirror() -> Option<String> {
    let deb822 =
        std::fs::read_to_string("/etc/apt/sources.list.d/debian.sources").unwrap_or_default();
    for stanza in deb822.split("\n\n") {
        let field = |k: &str| {
            stanza
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
        };
        if field("Suites:").is_some_and(|s| s.split_whitespace().any(|s| s == "bookworm")) {
            return field("URIs:").and_then(|u| u.split_whitespace().next().map(str::to_string));
        }
    }
    let lines = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    lines.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (w.first() == Some(&"deb") && w.get(2) == Some(&"bookworm"))
            .then(|| w.get(1).map(|u| u.to_string()))
            .flatten()
    })
}

/// The numeric parts of a kernel package name, for ordering (`6.12.117+deb12` > `6.1.0-57`).
fn version_key(pkg: &str) -> Vec<u64> {
    pkg.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap_or(0))
        .collect()
}

/// The package a Debian meta package (`linux-image-cloud-amd64`) currently depends on.
fn resolve_meta(meta: &str) -> Option<String> {
    let deps = output(Command::new("apt-cache").args(["depends", "--no-recommends", meta]))?;
    deps.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|d| d.starts_with("linux-image-") && d.ends_with("-cloud-amd64"))
        .map(str::to_string)
}

/// Debian's default cloud kernel (6.1) and the newest cloud kernel the registry has.
fn debian_kernels() -> Result<Vec<GuestKernel>> {
    let mut default = resolve_meta("linux-image-cloud-amd64");
    if default.is_none() {
        run_checked(
            Command::new("apt-get").args(["update", "-qq"]),
            "apt-get update",
        )?;
        default = resolve_meta("linux-image-cloud-amd64");
    }
    let default = default.context(
        "apt-cache knows no linux-image-cloud-amd64: is deb.debian.org (bookworm) in the sources?",
    )?;
    // Versioned meta packages (`linux-image-6.12-cloud-amd64`) point at newer series.
    let names =
        output(Command::new("apt-cache").args(["pkgnames", "linux-image-"])).unwrap_or_default();
    let mut candidates: Vec<String> = names
        .lines()
        .filter(|n| {
            n.strip_prefix("linux-image-")
                .and_then(|r| r.strip_suffix("-cloud-amd64"))
                .is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        })
        .filter_map(resolve_meta)
        .collect();
    candidates.push(default.clone());
    candidates.sort_by_key(|p| version_key(p));
    let newest = candidates.pop().unwrap_or(default.clone());
    let mut pkgs = vec![default];
    if !pkgs.contains(&newest) {
        pkgs.push(newest);
    }
    pkgs.iter().map(|p| unpack_kernel(p)).collect()
}

/// Downloads and unpacks a kernel package under `target/vm/kernels/<pkg>` (once).
fn unpack_kernel(pkg: &str) -> Result<GuestKernel> {
    let base = Path::new("target/vm/kernels").join(pkg);
    let release = pkg.trim_start_matches("linux-image-");
    let vmlinuz = base.join(format!("boot/vmlinuz-{release}"));
    if !vmlinuz.exists() {
        let _ = std::fs::remove_dir_all(&base);
        crate::esp::unpack_package(pkg, &base)?;
    }
    if !vmlinuz.exists() {
        bail!("{pkg} has no {}", vmlinuz.display());
    }
    let modules = base.join(format!("lib/modules/{release}"));
    Ok(GuestKernel {
        label: release.to_string(),
        vmlinuz,
        modules: modules.exists().then_some(modules),
    })
}

/// The test executables of the groups' targets, from cargo's build messages.
fn test_executables(
    env: &BTreeMap<String, String>,
    groups: &[&Group],
) -> Result<BTreeMap<String, PathBuf>> {
    let mut args = vec![
        "test",
        "-p",
        "rackwarden-tests",
        "--no-run",
        "--message-format=json",
    ];
    let targets: BTreeSet<&str> = groups.iter().map(|g| g.target).collect();
    for t in &targets {
        args.extend(["--test", t]);
    }
    let out = Command::new("cargo")
        .args(&args)
        .envs(env)
        .stderr(Stdio::inherit())
        .output()
        .context("cargo test --no-run")?;
    if !out.status.success() {
        bail!("cargo test --no-run failed");
    }
    let mut exes = BTreeMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(name), Some(exe)) = (v["target"]["name"].as_str(), v["executable"].as_str())
        else {
            continue;
        };
        if v["target"]["kind"][0] == "test" && targets.contains(name) {
            exes.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    for t in targets {
        if !exes.contains_key(t) {
            bail!("cargo built no test executable for `{t}`");
        }
    }
    Ok(exes)
}

/// The part of the guest root every kernel shares: busybox, iproute2, our binaries, the test
/// binaries and their libraries. Written into `target/vm/root/`; returns that directory.
fn common_root(tests: &BTreeMap<String, PathBuf>) -> Result<PathBuf> {
    let root = PathBuf::from("target/vm/root");
    let _ = std::fs::remove_dir_all(&root);
    for d in [
        "bin", "sbin", "usr/bin", "usr/sbin", "proc", "sys", "dev", "tmp", "run", "etc", "rw/deps",
        "var/tmp",
    ] {
        std::fs::create_dir_all(root.join(d))?;
    }
    copy_file(Path::new("/bin/busybox"), &root.join("bin/busybox"), false)?;
    // iproute2 proper (`ip netns`, `tc -j`): busybox's applets lack both; coreutils `date`
    // for `%N` (the workload hooks stamp milliseconds).
    let mut elfs: Vec<(PathBuf, PathBuf)> = Vec::new();
    for tool in [
        "ip",
        "tc",
        "bpftool",
        "date",
        "cryptsetup",
        "dmsetup",
        "mkfs.ext4",
    ] {
        let path = which(tool).with_context(|| format!("{tool} is not installed"))?;
        // Where the host has it: busybox ash runs its own applet for a bare `date` whatever
        // PATH says, so the workload hooks name `/usr/bin/date`.
        let dst = root.join(path.strip_prefix("/").unwrap_or(&path));
        elfs.push((path, dst));
    }
    // The fixtures find the binaries next to the test executable's `deps/` directory.
    for b in ["rackwardend", "rackwarden", "rackwarden-verifier"] {
        elfs.push((
            PathBuf::from("target/debug").join(b),
            root.join("rw").join(b),
        ));
    }
    for (name, exe) in tests {
        elfs.push((exe.clone(), root.join("rw/deps").join(name)));
    }
    let mut libs = BTreeSet::new();
    for (src, dst) in &elfs {
        copy_file(src, dst, true)?;
        libs.extend(shared_libs(src)?);
    }
    // libtss2's TCTI loader dlopens the device TCTI by name at run time (`device:/dev/tpmrm0`):
    // ldd of the binaries does not list it.
    for lib in dlopened_libs(DLOPENED) {
        libs.extend(shared_libs(&lib)?);
        libs.insert(lib);
    }
    for lib in libs {
        let dst = root.join(lib.strip_prefix("/").unwrap_or(&lib));
        std::fs::create_dir_all(dst.parent().context("library without a directory")?)?;
        copy_file(&lib, &dst, false)?;
    }
    // /lib64/ld-linux-x86-64.so.2 is what the binaries name as their interpreter.
    std::fs::write(root.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    std::fs::write(root.join("etc/group"), "root:x:0:\n")?;
    std::fs::write(root.join("etc/hosts"), "127.0.0.1 localhost\n")?;
    if Path::new("/etc/mke2fs.conf").exists() {
        copy_file(
            Path::new("/etc/mke2fs.conf"),
            &root.join("etc/mke2fs.conf"),
            false,
        )?;
    }
    Ok(root)
}

/// Libraries the guest binaries dlopen (not in their ldd): libtss2's device TCTI.
const DLOPENED: &[&str] = &["libtss2-tcti-device.so.0"];

/// Where the host's dynamic linker finds `names` (from `ldconfig -p`, else the multiarch
/// directories); a library the host lacks is left out (the guest then has no device TCTI and
/// the daemon says so).
fn dlopened_libs(names: &[&str]) -> Vec<PathBuf> {
    let cache = output(Command::new("ldconfig").arg("-p"))
        .or_else(|| output(Command::new("/sbin/ldconfig").arg("-p")))
        .unwrap_or_default();
    names
        .iter()
        .filter_map(|name| {
            let from_cache = cache.lines().find_map(|l| {
                let (lhs, rhs) = l.split_once("=>")?;
                (lhs.split_whitespace().next() == Some(name) && lhs.contains("x86-64"))
                    .then(|| PathBuf::from(rhs.trim()))
            });
            from_cache.or_else(|| {
                ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"]
                    .iter()
                    .map(|d| Path::new(d).join(name))
                    .find(|p| p.exists())
            })
        })
        .collect()
}

fn which(tool: &str) -> Option<PathBuf> {
    ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
        .iter()
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.exists())
}

/// Copies a file keeping it executable; `strip` drops debug info (test binaries are ~100 MB
/// with it, ~15 MB without).
fn copy_file(src: &Path, dst: &Path, strip: bool) -> Result<()> {
    if strip {
        run_checked(
            Command::new("objcopy")
                .arg("--strip-debug")
                .arg(src)
                .arg(dst),
            &format!("objcopy --strip-debug {}", src.display()),
        )?;
    } else {
        std::fs::copy(src, dst).with_context(|| format!("copying {}", src.display()))?;
    }
    let mode = std::fs::metadata(src)?.permissions().mode();
    std::fs::set_permissions(dst, std::fs::Permissions::from_mode(mode))?;
    Ok(())
}

/// The shared libraries `ldd` resolves for an ELF (none for a static one).
fn shared_libs(elf: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd").arg(elf).output()?;
    // A static binary makes ldd exit 1 with "not a dynamic executable".
    let text = String::from_utf8_lossy(&out.stdout);
    let mut libs = Vec::new();
    for line in text.lines() {
        let path = match line.split_once("=>") {
            Some((_, rhs)) => rhs.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        if let Some(p) = path.filter(|p| p.starts_with('/')) {
            libs.push(PathBuf::from(p));
        }
    }
    Ok(libs)
}

/// The guest's `/init`: mounts what the tests expect, loads the modules, runs the group named
/// on the kernel command line and reports its exit code on the console.
fn init_script(modules: &[String]) -> String {
    let mut s = String::from(
        r#"#!/bin/busybox sh
/bin/busybox --install -s /bin 2>/dev/null
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/ TMPDIR=/tmp
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t tmpfs run /run
mount -t bpf bpf /sys/fs/bpf
mkdir -p /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup
mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
ip link set lo up
"#,
    );
    for m in modules {
        let _ = writeln!(s, "insmod /modules/{m}.ko || echo RW_VM_MODULE_FAILED={m}");
    }
    s.push_str(
        r#"echo "RW_VM_BOOTED uptime=$(cut -d' ' -f1 /proc/uptime) kernel=$(uname -r) lsm=$(cat /sys/kernel/security/lsm 2>/dev/null) mem_kib=$(grep MemTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2)""#,
    );
    s.push('\n');
    s.push_str(
        r#"group=$(sed -n 's/.*rw\.group=\([^ ]*\).*/\1/p' /proc/cmdline)
tests=$(sed -n 's/.*rw\.tests=\([^ ]*\).*/\1/p' /proc/cmdline | tr ',' ' ')
filters=""
for t in $tests; do filters="$filters $t"; done
[ -n "$filters" ] && filters="$filters --exact"
grep -q 'rw\.ignored=1' /proc/cmdline && filters="$filters --include-ignored"
export RACKWARDEN_VM=1
"#,
    );
    let _ = writeln!(s, "export RACKWARDEN_TEST_WIPE='{GUEST_WIPE}'");
    s.push_str(
        r#"cd /rw/deps
./$group --test-threads=1 --nocapture $filters
echo "RW_VM_EXIT=$? uptime=$(cut -d' ' -f1 /proc/uptime)"
sync
poweroff -f
"#,
    );
    s
}

/// Module files and what they depend on, in load order, from the kernel's tree.
fn module_closure(dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    let mut files = BTreeMap::new();
    collect_modules(dir, &mut files)?;
    let mut order: Vec<(String, PathBuf)> = Vec::new();
    fn visit(
        name: &str,
        files: &BTreeMap<String, PathBuf>,
        order: &mut Vec<(String, PathBuf)>,
        depth: usize,
    ) -> Result<()> {
        if order.iter().any(|(n, _)| n == name) || depth > 16 {
            return Ok(());
        }
        // Not a file: built into this kernel.
        let Some(path) = files.get(name) else {
            return Ok(());
        };
        let deps =
            output(Command::new("modinfo").args(["-F", "depends"]).arg(path)).unwrap_or_default();
        // `depends` names modules as their files are named (`dm-mod`); the map's keys,
        // like the kernel's names, have `_` for `-`.
        for d in deps.split(',').map(str::trim).filter(|d| !d.is_empty()) {
            visit(&d.replace('-', "_"), files, order, depth + 1)?;
        }
        order.push((name.to_string(), path.clone()));
        Ok(())
    }
    for m in MODULES {
        visit(m, &files, &mut order, 0)?;
    }
    Ok(order)
}

fn collect_modules(dir: &Path, out: &mut BTreeMap<String, PathBuf>) -> Result<()> {
    for e in std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))? {
        let p = e?.path();
        if p.is_dir() {
            collect_modules(&p, out)?;
        } else if let Some(stem) = p
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".ko").or_else(|| n.strip_suffix(".ko.xz")))
        {
            out.insert(stem.replace('-', "_"), p.clone());
        }
    }
    Ok(())
}

/// Writes (or reuses) the initramfs for a kernel: the common root plus the kernel's modules
/// and `/init`, as one newc cpio, named by a hash of everything in it.
fn initramfs(common: &Path, k: &GuestKernel) -> Result<PathBuf> {
    let root = PathBuf::from("target/vm/root-kernel").join(&k.label);
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("modules"))?;
    let mut names = Vec::new();
    if let Some(dir) = &k.modules {
        for (name, path) in module_closure(dir)? {
            let dst = root.join("modules").join(format!("{name}.ko"));
            if path.extension().is_some_and(|e| e == "xz") {
                let out = Command::new("xz").arg("-dc").arg(&path).output()?;
                if !out.status.success() {
                    bail!(
                        "xz -dc {}: {}",
                        path.display(),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
                std::fs::write(&dst, out.stdout)?;
            } else {
                std::fs::copy(&path, &dst)?;
            }
            names.push(name);
        }
    }
    let init = root.join("init");
    std::fs::write(&init, init_script(&names))?;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;

    let mut h = std::collections::hash_map::DefaultHasher::new();
    for dir in [common, &root] {
        hash_tree(dir, dir, &mut h)?;
    }
    let out = PathBuf::from(format!(
        "target/vm/initramfs-{}-{:016x}.cpio",
        k.label,
        h.finish()
    ));
    if out.exists() {
        return Ok(out);
    }
    step(&format!("write {}", out.display()));
    let tmp = out.with_extension("tmp");
    let mut bytes = Vec::new();
    for dir in [common, &root] {
        bytes.extend(cpio(dir)?);
    }
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

/// The initrd as a UEFI guest gets it, zstd-compressed (`<initrd>.zst`, written once): OVMF
/// copies the initrd out of fw_cfg and the EFI stub hashes all of it into PCR 9 in emulated
/// firmware code (6.4 s for the 116 MB cpio under TCG), while the kernel's zstd unpacks the
/// 33 MB in under 2 s. Under SeaBIOS nothing hashes it, so there the plain cpio is faster.
fn compressed_initrd(initrd: &Path) -> Result<PathBuf> {
    let mut name = initrd.as_os_str().to_owned();
    name.push(".zst");
    let out = PathBuf::from(name);
    if out.exists() {
        return Ok(out);
    }
    step(&format!("zstd {}", initrd.display()));
    let tmp = out.with_extension("zst.tmp");
    // One thread: the host's other CPU is often someone's compiler.
    run_checked(
        Command::new("zstd")
            .args(["-q", "-3", "-T1", "-f", "-o"])
            .arg(&tmp)
            .arg(initrd),
        &format!("zstd {}", initrd.display()),
    )?;
    std::fs::rename(&tmp, &out)?;
    Ok(out)
}

fn hash_tree(base: &Path, dir: &Path, h: &mut impl std::hash::Hasher) -> Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    entries.sort();
    for p in entries {
        p.strip_prefix(base).unwrap_or(&p).hash(h);
        let meta = std::fs::symlink_metadata(&p)?;
        if meta.is_dir() {
            hash_tree(base, &p, h)?;
        } else if meta.is_file() {
            h.write(&std::fs::read(&p)?);
            meta.permissions().mode().hash(h);
        }
    }
    Ok(())
}

/// `find . | cpio -o -H newc` of a directory (one archive; the kernel unpacks concatenated
/// archives in order, so the kernel part lands on top of the common part).
fn cpio(dir: &Path) -> Result<Vec<u8>> {
    let out = Command::new("sh")
        .arg("-c")
        .arg("find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet --owner=0:0")
        .current_dir(dir)
        .output()
        .context("running cpio")?;
    if !out.status.success() {
        bail!(
            "cpio in {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out.stdout)
}

/// A TPM state manufactured by `swtpm_setup` with an RSA-2048 EK certificate issued by a
/// private local CA (`ca/`), as `tests/src/tpm.rs` makes one: all config in its own directory,
/// nothing read from $HOME or /etc. The directory goes with it on drop.
struct ManufacturedTpm {
    dir: PathBuf,
}

impl ManufacturedTpm {
    fn new() -> Result<ManufacturedTpm> {
        let dir = std::env::temp_dir().join(format!("rw-vm-tpm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        // Constructed before anything can fail: Drop removes what exists.
        let m = ManufacturedTpm { dir };
        for sub in ["state", "ca", "certs"] {
            std::fs::create_dir_all(m.dir.join(sub))?;
        }
        let d = m.dir.display();
        std::fs::write(
            m.dir.join("swtpm_setup.conf"),
            format!(
                "create_certs_tool = /usr/bin/swtpm_localca\n\
                 create_certs_tool_config = {d}/swtpm-localca.conf\n\
                 create_certs_tool_options = {d}/swtpm-localca.options\n\
                 active_pcr_banks = sha256\n"
            ),
        )?;
        std::fs::write(
            m.dir.join("swtpm-localca.conf"),
            format!(
                "statedir = {d}/ca\nsigningkey = {d}/ca/signkey.pem\n\
                 issuercert = {d}/ca/issuercert.pem\ncertserial = {d}/ca/certserial\n"
            ),
        )?;
        std::fs::write(
            m.dir.join("swtpm-localca.options"),
            "--platform-manufacturer rackwarden\n--platform-version 2.1\n--platform-model vm\n",
        )?;
        let out = Command::new("swtpm_setup")
            .args(["--tpm2", "--tpmstate"])
            .arg(m.dir.join("state"))
            .arg("--config")
            .arg(m.dir.join("swtpm_setup.conf"))
            .args(["--create-ek-cert", "--pcr-banks", "sha256"])
            .arg("--write-ek-cert-files")
            .arg(m.dir.join("certs"))
            .arg("--overwrite")
            .output()
            .context("running swtpm_setup (swtpm-tools; `cargo xtask setup` installs it)")?;
        if !out.status.success() || !m.dir.join("state/tpm2-00.permall").exists() {
            bail!(
                "swtpm_setup failed ({}):\n{}\n{}",
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(m)
    }
}

impl Drop for ManufacturedTpm {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One boot's swtpm on a copy of the manufactured state, for qemu's `-tpmdev emulator`
/// (control on a unix socket; qemu hands it the data channel and sends INIT). Killed by the
/// PID we started and its directory removed on drop.
struct GuestSwtpm {
    child: Option<std::process::Child>,
    dir: PathBuf,
    sock: PathBuf,
}

impl GuestSwtpm {
    fn start(state: &Path, tag: &str) -> Result<GuestSwtpm> {
        let dir = std::env::temp_dir().join(format!("rw-vm-swtpm-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut t = GuestSwtpm {
            child: None,
            sock: dir.join("swtpm.sock"),
            dir,
        };
        std::fs::create_dir_all(t.dir.join("state"))?;
        std::fs::copy(state, t.dir.join("state/tpm2-00.permall"))
            .with_context(|| format!("copying {}", state.display()))?;
        let child = Command::new("swtpm")
            .args(["socket", "--tpm2", "--tpmstate"])
            .arg(format!("dir={}", t.dir.join("state").display()))
            .arg("--ctrl")
            .arg(format!("type=unixio,path={}", t.sock.display()))
            .arg("--log")
            .arg(format!(
                "file={},level=1",
                t.dir.join("swtpm.log").display()
            ))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting swtpm")?;
        let child = t.child.insert(child);
        let started = Instant::now();
        while !t.sock.exists() {
            if let Ok(Some(st)) = child.try_wait() {
                bail!("swtpm exited ({st}) before listening: {}", t.log());
            }
            if started.elapsed() > Duration::from_secs(10) {
                bail!("swtpm made no socket in 10 s: {}", t.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(t)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("swtpm.log")).unwrap_or_default()
    }

    /// qemu's arguments for a TIS TPM backed by this swtpm.
    fn qemu_args(&self) -> Vec<String> {
        vec![
            "-chardev".into(),
            format!("socket,id=chrtpm,path={}", self.sock.display()),
            "-tpmdev".into(),
            "emulator,id=tpm0,chardev=chrtpm".into(),
            "-device".into(),
            "tpm-tis,tpmdev=tpm0".into(),
        ]
    }
}

impl Drop for GuestSwtpm {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // Usually gone already (swtpm exits when qemu closes the control channel).
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One boot's copy of OVMF's variable store (the firmware writes it: boot entries, the
/// MemoryOverwriteRequestControl the TPM driver sets), removed on drop.
struct OvmfVars {
    firmware: Firmware,
    code: &'static str,
    path: PathBuf,
}

impl OvmfVars {
    /// `images`: [`Firmware::ovmf_images`] of `firmware`.
    fn copy(
        tag: &str,
        firmware: Firmware,
        (code, vars): (&'static str, &'static str),
    ) -> Result<OvmfVars> {
        let path =
            std::env::temp_dir().join(format!("rw-vm-ovmf-vars-{}-{tag}.fd", std::process::id()));
        std::fs::copy(vars, &path)
            .with_context(|| format!("copying {vars} (Debian package ovmf)"))?;
        // The template is installed read-only; the copy is the guest's to write.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))?;
        Ok(OvmfVars {
            firmware,
            code,
            path,
        })
    }

    /// The two pflash devices: the code read-only, this boot's variables writable (only
    /// from SMM, for the Secure Boot build).
    fn qemu_args(&self) -> Vec<String> {
        let mut args: Vec<String> = Vec::new();
        if self.firmware.smm() {
            args.extend([
                "-global".into(),
                "driver=cfi.pflash01,property=secure,value=on".into(),
            ]);
        }
        args.extend([
            "-drive".into(),
            format!("if=pflash,format=raw,unit=0,readonly=on,file={}", self.code),
            "-drive".into(),
            format!("if=pflash,format=raw,unit=1,file={}", self.path.display()),
        ]);
        args
    }
}

/// How a guest's kernel reaches it.
enum BootFrom {
    /// `-kernel`, `-initrd` and `-append`.
    Qemu(Vec<String>),
    /// A disk image GRUB boots from (read-only; removed when the boot is over).
    Disk(PathBuf),
}

impl BootFrom {
    fn qemu_args(&self) -> Vec<String> {
        match self {
            BootFrom::Qemu(args) => args.clone(),
            BootFrom::Disk(path) => vec![
                "-drive".into(),
                format!("file={},format=raw,if=virtio,readonly=on", path.display()),
            ],
        }
    }
}

impl Drop for BootFrom {
    fn drop(&mut self) {
        if let BootFrom::Disk(path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

impl Drop for OvmfVars {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// `sha256sum` of a file, as lowercase hex (xtask has no hash crate).
fn sha256_file(path: &Path) -> Result<String> {
    let out = output(Command::new("sha256sum").arg(path))
        .with_context(|| format!("sha256sum {}", path.display()))?;
    sha256sum_digest(&out)
}

/// The digest in `sha256sum`'s output line.
fn sha256sum_digest(out: &str) -> Result<String> {
    let digest = out.split_whitespace().next().unwrap_or_default();
    if digest.len() != 64 || !digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("sha256sum said {out:?}");
    }
    Ok(digest.to_string())
}

/// Little-endian integers of a PE image or bzImage setup header, `None` past its end.
fn le_u16(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(off..off + 2)?.try_into().ok()?))
}

fn le_u32(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(off..off + 4)?.try_into().ok()?))
}

/// The Authenticode SHA-256 of a PE image: what UEFI firmware logs for an image it starts
/// (the `authenticode` crate over `object`'s PE reader, as `rackwarden boot-reference` uses).
fn authenticode_sha256(pe: &[u8]) -> Result<String> {
    use object::read::pe::PeFile64;
    let file = PeFile64::parse(pe).map_err(|e| anyhow::anyhow!("not a PE32+ image: {e}"))?;
    let mut h = <sha2::Sha256 as sha2::Digest>::new();
    authenticode::authenticode_digest(&file, &mut h)
        .map_err(|e| anyhow::anyhow!("PE offsets out of range: {e}"))?;
    Ok(crate::hex_lower(&sha2::Digest::finalize(h)))
}

/// q35's `acpi_data_size` (hw/i386/pc.c): qemu keeps the top of low memory for ACPI tables
/// and loads the initrd below it.
const QEMU_ACPI_DATA_SIZE: u64 = 0x28000;

/// What OVMF measures into PCR 4 for a `-kernel` boot: the Authenticode SHA-256 of the
/// kernel as qemu hands it over fw_cfg, whose setup header qemu's `x86_load_linux` has
/// filled in (boot loader type, heap end, command line address, and the initrd's address
/// and size). So PCR 4 changes with the initrd's size and the guest's memory, never with
/// the command line, and is not the hash of the vmlinuz file. On hardware, where a boot
/// loader starts the kernel file unmodified, it is that file's Authenticode hash.
fn qemu_kernel_image_sha256(vmlinuz: &Path, initrd_size: u64) -> Result<String> {
    let mut image =
        std::fs::read(vmlinuz).with_context(|| format!("reading {}", vmlinuz.display()))?;
    let protocol = le_u16(&image, 0x206).unwrap_or(0);
    // The setup header ends by 0x268 in every protocol this checks for.
    if image.len() < 0x268 || le_u32(&image, 0x202) != Some(0x5372_6448) || protocol < 0x203 {
        bail!(
            "{}: not a bzImage of boot protocol 2.03 or later",
            vmlinuz.display()
        );
    }
    let loadflags = image.get(0x211).copied().unwrap_or(0);
    // A "high" kernel (LOADED_HIGH): real-mode code at 0x10000, command line at 0x20000.
    if loadflags & 0x01 == 0 {
        bail!("{}: not a LOADED_HIGH kernel", vmlinuz.display());
    }
    let (real_addr, cmdline_addr) = (0x1_0000u32, 0x2_0000u32);
    let low_memory = (GUEST_MEM_MIB << 20).min(0x8000_0000);
    let initrd_addr_max = u64::from(le_u32(&image, 0x22c).unwrap_or(0x37ff_ffff));
    let initrd_max = initrd_addr_max.min(low_memory - QEMU_ACPI_DATA_SIZE - 1);
    let initrd_addr = initrd_max
        .checked_sub(initrd_size)
        .context("the initrd does not fit in the guest's low memory")?
        & !0xfff;
    image[0x210] = 0xb0;
    image[0x211] = loadflags | 0x80;
    // Fit in u16/u32: checked above (below 2 GiB).
    image[0x224..0x226].copy_from_slice(&((cmdline_addr - real_addr - 0x200) as u16).to_le_bytes());
    image[0x228..0x22c].copy_from_slice(&cmdline_addr.to_le_bytes());
    image[0x218..0x21c].copy_from_slice(&(initrd_addr as u32).to_le_bytes());
    image[0x21c..0x220].copy_from_slice(&(initrd_size as u32).to_le_bytes());
    authenticode_sha256(&image)
}

/// One VM run of one group on one kernel.
struct Run<'a> {
    kernel: GuestKernel,
    machine: Machine,
    group: &'a Group,
    initrd: PathBuf,
    /// For a TPM group: the manufactured state each boot's swtpm starts from.
    tpm_state: Option<PathBuf>,
    /// For a UEFI group: what its measured boot must show, told to the guest on its command
    /// line.
    boot_digests: Option<BootDigests>,
    /// For the Secure Boot disk: the signed shim and GRUB its ESP holds.
    chain: Option<crate::esp::SignedChain>,
    outcome: Option<Outcome>,
}

/// The digests a UEFI guest checks its event log against (lowercase hex), so that PCR 4 and
/// PCR 9 are shown to hold what the harness handed qemu, not merely some kernel and initrd:
/// `rw.<key>=<hex>[,<hex>]` words on its command line.
#[derive(Clone, Debug)]
struct BootDigests(Vec<(&'static str, String)>);

impl BootDigests {
    fn of(
        firmware: Firmware,
        k: &GuestKernel,
        initrd: &Path,
        chain: Option<&crate::esp::SignedChain>,
    ) -> Result<BootDigests> {
        let pe = |p: &Path| {
            authenticode_sha256(
                &std::fs::read(p).with_context(|| format!("reading {}", p.display()))?,
            )
        };
        Ok(BootDigests(match (firmware, chain) {
            // OVMF's PCR 4 event for the kernel ([`qemu_kernel_image_sha256`]) and the EFI
            // stub's PCR 9 event for the initrd (the file's SHA-256).
            (Firmware::Ovmf, _) => vec![
                (
                    "kernel_sha256",
                    qemu_kernel_image_sha256(&k.vmlinuz, std::fs::metadata(initrd)?.len())?,
                ),
                ("initrd_sha256", sha256_file(initrd)?),
            ],
            // PCR 4: shim and GRUB as the firmware and shim start them, the kernel as shim
            // verifies it for GRUB (Authenticode of the signed images); PCR 9: the kernel
            // and the initrd as GRUB read them (the files' SHA-256).
            (Firmware::SecureBootDisk, Some(chain)) => vec![
                (
                    "loader_sha256",
                    format!("{},{}", pe(&chain.shim)?, pe(&chain.grub)?),
                ),
                ("kernel_sha256", pe(&k.vmlinuz)?),
                ("kernel_file_sha256", sha256_file(&k.vmlinuz)?),
                ("initrd_sha256", sha256_file(initrd)?),
            ],
            (f, _) => bail!("no boot digests for {f:?}"),
        }))
    }
}

#[derive(Debug)]
struct Outcome {
    /// The group's tests ran and exited with this code (None: they never finished).
    exit: Option<i32>,
    /// Guest uptime when `/init` started: the boot time.
    boot_s: Option<f64>,
    wall: Duration,
    /// libtest's per-test results: (name, "ok" | "FAILED" | "ignored").
    tests: Vec<(String, String)>,
    /// `RW_REPORT key=value` lines the tests printed.
    reports: Vec<String>,
    /// Kernel oopses, panics and BUGs the console shows: each fails the group by name,
    /// whatever the tests' exit code, and is never retried away.
    kernel_faults: Vec<String>,
    log: PathBuf,
    attempts: u32,
    harness_error: Option<String>,
}

fn run_all(runs: &mut [Run<'_>], parallel: usize) {
    let queue = std::sync::Mutex::new(runs.iter_mut().rev().collect::<Vec<_>>());
    std::thread::scope(|s| {
        for _ in 0..parallel {
            s.spawn(|| {
                loop {
                    let Some(run) = queue.lock().map(|mut q| q.pop()).ok().flatten() else {
                        return;
                    };
                    let mut attempts = 0;
                    let outcome = loop {
                        attempts += 1;
                        let o = boot(run, attempts);
                        // Retry only a boot that never reached the tests (and never one that
                        // oopsed: a retry must not hide a kernel fault).
                        if o.boot_s.is_some() || !o.kernel_faults.is_empty() || attempts >= 2 {
                            break o;
                        }
                        eprintln!(
                            "{} {}: the guest never reached /init; retrying once",
                            run.kernel.label, run.group.name
                        );
                    };
                    println!(
                        "{} {}: {} in {:.1} s",
                        run.kernel.label,
                        run.group.name,
                        match outcome.exit {
                            Some(0) => "passed".to_string(),
                            Some(c) => format!("FAILED (exit {c})"),
                            None => "FAILED (no result)".to_string(),
                        },
                        outcome.wall.as_secs_f64()
                    );
                    run.outcome = Some(Outcome {
                        attempts,
                        ..outcome
                    });
                }
            });
        }
    });
}

fn boot(run: &Run<'_>, attempt: u32) -> Outcome {
    let logs = Path::new("target/vm/logs");
    let _ = std::fs::create_dir_all(logs);
    let log = logs.join(format!(
        "{}-{}-{attempt}.log",
        run.kernel.label, run.group.name
    ));
    let _ = std::fs::remove_file(&log);
    let mut append = kernel_command_line(run.group);
    for (key, value) in run.boot_digests.iter().flat_map(|d| &d.0) {
        let _ = write!(append, " rw.{key}={value}");
    }
    let started = Instant::now();
    let fail = |e: String| Outcome {
        exit: None,
        boot_s: None,
        wall: started.elapsed(),
        tests: Vec::new(),
        reports: Vec::new(),
        kernel_faults: Vec::new(),
        log: log.clone(),
        attempts: attempt,
        harness_error: Some(e),
    };
    // Lives until this function returns: after qemu exited (or was killed).
    let swtpm = match &run.tpm_state {
        Some(state) => {
            let tag = format!("{}-{attempt}", run.kernel.label);
            match GuestSwtpm::start(state, &tag) {
                Ok(t) => Some(t),
                Err(e) => return fail(format!("{e:#}")),
            }
        }
        None => None,
    };
    let vars = match run.group.firmware.ovmf_images() {
        None => None,
        Some(images) => {
            let tag = format!("{}-{}-{attempt}", run.kernel.label, run.group.name);
            match OvmfVars::copy(&tag, run.group.firmware, images) {
                Ok(v) => Some(v),
                Err(e) => return fail(format!("{e:#}")),
            }
        }
    };
    // How the kernel gets to the guest: qemu hands it over, or GRUB reads it from the ESP.
    let machine = if run.group.firmware.smm() {
        "q35,smm=on"
    } else {
        "q35"
    };
    let boot_from = match &run.chain {
        None => BootFrom::Qemu(vec![
            "-kernel".into(),
            run.kernel.vmlinuz.display().to_string(),
            "-initrd".into(),
            run.initrd.display().to_string(),
            "-append".into(),
            append.clone(),
        ]),
        Some(chain) => {
            let path = disk_path(run, attempt, "-esp");
            let made = path.map_err(anyhow::Error::from).and_then(|path| {
                crate::esp::write_disk(chain, &run.kernel.vmlinuz, &run.initrd, &append, &path)
                    .map(|()| path)
            });
            let path = match made {
                Ok(path) => path,
                Err(e) => return fail(format!("the ESP disk: {e:#}")),
            };
            BootFrom::Disk(path)
        }
    };
    // A fresh, empty second disk for each boot of a group that has one.
    let scratch = if run.group.scratch_disk {
        let made = disk_path(run, attempt, "").and_then(|path| {
            std::fs::File::create(&path)
                .and_then(|f| f.set_len(SCRATCH_DISK_BYTES))
                .map(|()| path)
        });
        let path = match made {
            Ok(path) => path,
            Err(e) => return fail(format!("scratch disk: {e}")),
        };
        vec![
            "-drive".to_string(),
            format!("file={},format=raw,if=virtio", path.display()),
        ]
    } else {
        vec![]
    };
    let child = Command::new("qemu-system-x86_64")
        .args([
            "-M",
            machine,
            "-accel",
            &run.machine.accel,
            "-cpu",
            &run.machine.cpu,
        ])
        .args(["-smp", &GUEST_CPUS.to_string()])
        .args(["-m", &GUEST_MEM_MIB.to_string()])
        .args(vars.iter().flat_map(OvmfVars::qemu_args))
        .args(boot_from.qemu_args())
        .args(swtpm.iter().flat_map(GuestSwtpm::qemu_args))
        .args(&scratch)
        .args([
            "-nodefaults",
            "-nic",
            "none",
            "-no-reboot",
            "-display",
            "none",
        ])
        .arg("-serial")
        .arg(format!("file:{}", log.display()))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return fail(format!("starting qemu: {e}")),
    };
    let status = wait_for_power_off(&mut child, started);
    drop(boot_from);
    let wall = started.elapsed();
    let text = std::fs::read(&log)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let mut o = parse_console(&text);
    o.wall = wall;
    o.log = log;
    o.attempts = attempt;
    if status.is_none() {
        o.harness_error = Some(format!(
            "killed after {} s without powering off",
            GROUP_TIMEOUT.as_secs()
        ));
    } else if o.boot_s.is_none() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            use std::io::Read as _;
            let _ = e.read_to_string(&mut err);
        }
        o.harness_error = Some(format!("the guest never reached /init {}", err.trim()));
    }
    o
}

/// `target/vm/disks/<kernel>-<group>-<attempt><suffix>.img`, its directory created.
fn disk_path(run: &Run<'_>, attempt: u32, suffix: &str) -> std::io::Result<PathBuf> {
    let dir = Path::new("target/vm/disks");
    std::fs::create_dir_all(dir)?;
    Ok(dir.join(format!(
        "{}-{}-{attempt}{suffix}.img",
        run.kernel.label, run.group.name
    )))
}

/// The guest kernel's command line for a group.
fn kernel_command_line(group: &Group) -> String {
    // IMA needs the "integrity" LSM on 6.1 (without it the first measurement panics:
    // "integrity_inode_get: lsm=integrity required"); from 6.9 IMA and EVM are LSMs of their
    // own that are always on, and an unknown name in lsm= is skipped.
    let mut lsm = String::from("lockdown,capability,yama");
    if group.bpf_lsm {
        lsm.push_str(",bpf");
    }
    if group.tpm {
        lsm.push_str(",integrity");
    }
    let mut append = format!(
        "console=ttyS0 panic=-1 quiet loglevel=3 lsm={lsm} rw.group={}",
        group.target
    );
    if !group.tests.is_empty() {
        let _ = write!(append, " rw.tests={}", group.tests.join(","));
    }
    if group.ignored {
        append.push_str(" rw.ignored=1");
    }
    if group.tpm {
        // The tcb policy skips tmpfs, which the initramfs root is unless rootfstype says
        // otherwise: on ramfs what runs from the root is measured.
        append.push_str(" ima_policy=tcb ima_template=ima-ng rootfstype=ramfs");
    }
    append
}

/// Waits for the guest to power off; kills qemu (by the PID we started) past the timeout.
/// `None`: killed, or it could not be waited for.
fn wait_for_power_off(
    child: &mut std::process::Child,
    started: Instant,
) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if started.elapsed() > GROUP_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(200)),
            Err(_) => return None,
        }
    }
}

fn parse_console(text: &str) -> Outcome {
    let field = |line: &str, key: &str| -> Option<String> {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .map(str::to_string)
    };
    let mut o = Outcome {
        exit: None,
        boot_s: None,
        wall: Duration::ZERO,
        tests: Vec::new(),
        reports: Vec::new(),
        kernel_faults: Vec::new(),
        log: PathBuf::new(),
        attempts: 0,
        harness_error: None,
    };
    // With --nocapture a test's own output comes between `test NAME ... ` and its result.
    let mut pending: Option<String> = None;
    let is_result = |r: &str| matches!(r, "ok" | "FAILED" | "ignored");
    for line in text.lines() {
        let line = line.trim_end_matches('\r');
        // First: a fault can print in the middle of a test's line (`test NAME ... [ 37.8] Oops`).
        if let Some(fault) = kernel_fault(line) {
            o.kernel_faults.push(fault);
        }
        if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|r| r.split_once(" ... "))
        {
            let (name, rest) = name;
            let rest = rest.trim();
            if is_result(rest) {
                o.tests.push((name.to_string(), rest.to_string()));
                continue;
            }
            pending = Some(name.to_string());
            if let Some(i) = rest.find("RW_REPORT ") {
                o.reports.push(rest[i + "RW_REPORT ".len()..].to_string());
            }
            continue;
        }
        if is_result(line.trim()) {
            if let Some(name) = pending.take() {
                o.tests.push((name, line.trim().to_string()));
            }
            continue;
        }
        if line.contains("RW_VM_BOOTED") {
            o.boot_s = field(line, "uptime=").and_then(|u| u.parse().ok());
        } else if let Some(i) = line.find("RW_VM_EXIT=") {
            o.exit = line[i + "RW_VM_EXIT=".len()..]
                .split_whitespace()
                .next()
                .and_then(|c| c.parse().ok());
        } else if let Some(i) = line.find("RW_REPORT ") {
            o.reports.push(line[i + "RW_REPORT ".len()..].to_string());
        } else if let Some(m) = line.strip_prefix("RW_VM_MODULE_FAILED=") {
            o.reports.push(format!("module {m} failed to load"));
        }
    }
    o
}

/// The console lines that say the guest kernel faulted: an oops (`Oops: int3: 0000 [#1]`),
/// a panic, a BUG or a general protection fault. The rest of an oops (registers, the call
/// trace) stays in the kept console log.
fn kernel_fault(line: &str) -> Option<String> {
    const MARKS: &[&str] = &[
        "Oops:",
        "Kernel panic",
        "BUG:",
        "kernel BUG at",
        "general protection fault",
    ];
    let i = MARKS.iter().filter_map(|m| line.find(m)).min()?;
    Some(line[i..].trim().to_string())
}

/// The table printed at the end: per kernel, each group's tests, boot time, wall time.
fn summary(runs: &[Run<'_>], total: Duration) -> (String, bool) {
    let mut ok = true;
    let mut s = String::new();
    let kernels: Vec<&str> = {
        let mut v: Vec<&str> = runs.iter().map(|r| r.kernel.label.as_str()).collect();
        v.dedup();
        v
    };
    for k in kernels {
        let machine = runs
            .iter()
            .find(|r| r.kernel.label == k)
            .map(|r| format!("-accel {} -cpu {}", r.machine.accel, r.machine.cpu))
            .unwrap_or_default();
        let _ = writeln!(s, "\nkernel {k} ({machine})");
        let _ = writeln!(
            s,
            "  {:<12} {:>6} {:>6} {:>8} {:>8}  result",
            "group", "passed", "failed", "boot s", "wall s"
        );
        for r in runs.iter().filter(|r| r.kernel.label == k) {
            let Some(o) = &r.outcome else { continue };
            let passed = o.tests.iter().filter(|t| t.1 == "ok").count();
            let failed: Vec<&str> = o
                .tests
                .iter()
                .filter(|t| t.1.starts_with("FAILED"))
                .map(|t| t.0.as_str())
                .collect();
            // Every test the group names ran and passed, and none was left ignored: a guest
            // test that did not run is a failure, not a pass.
            let all_named_passed = r
                .group
                .tests
                .iter()
                .all(|t| o.tests.iter().any(|(n, res)| n == t && res == "ok"));
            let none_ignored = o.tests.iter().all(|t| t.1 != "ignored");
            let good = o.exit == Some(0)
                && o.harness_error.is_none()
                && o.kernel_faults.is_empty()
                && passed > 0
                && all_named_passed
                && none_ignored;
            ok &= good;
            let _ = writeln!(
                s,
                "  {:<12} {:>6} {:>6} {:>8} {:>8.1}  {}{}",
                r.group.name,
                passed,
                failed.len(),
                o.boot_s.map(|b| format!("{b:.2}")).unwrap_or("-".into()),
                o.wall.as_secs_f64(),
                if good { "ok" } else { "FAILED" },
                if o.attempts > 1 {
                    " (after a retry)"
                } else {
                    ""
                }
            );
            for f in &failed {
                let _ = writeln!(s, "      failed: {f}");
            }
            for rep in &o.reports {
                let _ = writeln!(s, "      {rep}");
            }
            if let Some(e) = &o.harness_error {
                let _ = writeln!(s, "      harness: {e}");
            }
            let oopses = o
                .kernel_faults
                .iter()
                .filter(|f| f.starts_with("Oops:"))
                .count();
            if !o.kernel_faults.is_empty() {
                let _ = writeln!(s, "      KERNEL FAULT ({oopses} oops):");
            }
            for f in &o.kernel_faults {
                let _ = writeln!(s, "        {f}");
            }
            if !good {
                let _ = writeln!(s, "      console log: {}", o.log.display());
            }
        }
    }
    let _ = writeln!(s, "\nVM tests: {:.0} s in all", total.as_secs_f64());
    (s, ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_guest_test_runs_in_a_group_and_every_named_test_exists() {
        let tests_of = |target: &str| -> Vec<String> {
            let path = format!("{}/../tests/tests/{target}.rs", env!("CARGO_MANIFEST_DIR"));
            let text = std::fs::read_to_string(&path).unwrap();
            let mut names = Vec::new();
            let mut after_test = false;
            for line in text.lines() {
                let line = line.trim();
                if line == "#[test]" {
                    after_test = true;
                } else if after_test && let Some(rest) = line.strip_prefix("fn ") {
                    names.push(rest.split('(').next().unwrap().to_string());
                    after_test = false;
                }
            }
            names
        };
        for g in GROUPS {
            let names = tests_of(g.target);
            for t in g.tests {
                assert!(
                    names.iter().any(|n| n == t),
                    "group {}: no test {t}",
                    g.name
                );
            }
        }
        // A group that names its tests must not leave one of its target's ignored guest
        // tests out of every group.
        for target in ["tpm_guest"] {
            for name in tests_of(target) {
                assert!(
                    GROUPS.iter().any(|g| g.target == target
                        && (g.tests.is_empty() || g.tests.contains(&name.as_str()))),
                    "{target}::{name} runs in no VM group"
                );
            }
        }
    }

    #[test]
    fn only_the_tpm_groups_boot_with_ima_the_integrity_lsm_and_uefi() {
        let by_name = |n: &str| GROUPS.iter().find(|g| g.name == n).unwrap();
        let tpm = kernel_command_line(by_name("tpm"));
        assert!(
            tpm.contains("lsm=lockdown,capability,yama,bpf,integrity "),
            "{tpm}"
        );
        assert!(
            tpm.contains("ima_policy=tcb") && tpm.contains("rootfstype=ramfs"),
            "{tpm}"
        );
        let guard = kernel_command_line(by_name("guard"));
        assert!(
            guard.contains("lsm=lockdown,capability,yama,bpf "),
            "{guard}"
        );
        assert!(!guard.contains("ima_policy"), "{guard}");
        let fmod_ret = kernel_command_line(by_name("guard-fmod-ret"));
        assert!(
            fmod_ret.contains("lsm=lockdown,capability,yama "),
            "{fmod_ret}"
        );
        assert_eq!(by_name("tpm").firmware, Firmware::Ovmf);
        let secure_boot = by_name("secure-boot");
        assert_eq!(secure_boot.firmware, Firmware::SecureBootDisk);
        let sb = kernel_command_line(secure_boot);
        assert!(
            sb.contains("lsm=lockdown,capability,yama,integrity ") && sb.contains("ima_policy=tcb"),
            "{sb}"
        );
        assert!(
            GROUPS
                .iter()
                .filter(|g| g.name != "tpm" && g.name != "secure-boot")
                .all(|g| g.firmware == Firmware::SeaBios)
        );
        let raw = kernel_command_line(by_name("watch-raw"));
        assert!(
            raw.contains("rw.tests=raw_attach_detach_loop rw.ignored=1"),
            "{raw}"
        );
    }

    /// The PCR 4 digest OVMF logged when it started Debian's 6.1 kernel under qemu 10.0.2
    /// (2 GiB, a 1,984,000-byte initrd): the harness's reconstruction of qemu's patched
    /// setup header gives the same Authenticode hash. Only where `vm-test` has unpacked that
    /// kernel, which the test downloads and unpacks (as vm-test does) where it is not yet:
    /// ignored in the unit-test step for its download, `cargo xtask test` runs it after
    /// vm-test with `--ignored`.
    #[test]
    #[ignore = "downloads Debian's 6.1 cloud kernel; cargo xtask test runs it after vm-test"]
    fn the_kernel_digest_is_what_ovmf_measured_for_qemus_image() {
        // unpack_kernel works in the workspace root, as vm-test does.
        std::env::set_current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("..")).unwrap();
        let vmlinuz = unpack_kernel("linux-image-6.1.0-57-cloud-amd64")
            .unwrap()
            .vmlinuz;
        assert_eq!(
            qemu_kernel_image_sha256(&vmlinuz, 1_984_000).unwrap(),
            "93b311f7899579ff3e4108f49e5edbcc0a5d2356e286ee5b3b0c2c5842205cad"
        );
        // The file itself (what a boot loader on hardware would have measured) differs.
        assert_eq!(
            authenticode_sha256(&std::fs::read(&vmlinuz).unwrap()).unwrap(),
            "65c89335d8a5d25a8eeffd4de4a02087ac8dcf26165dbff8806a19f68ecd2842"
        );
    }

    /// The console of the 6.12 guest that panicked in the bypass group: the oopses are
    /// named, whatever the tests printed before.
    #[test]
    fn an_oops_on_the_console_is_a_named_kernel_fault() {
        let console = "RW_VM_BOOTED uptime=1.70 kernel=6.12.118+deb12-cloud-amd64\n\
test bypass_matrix ... [   37.862352] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
[   37.862671] CPU: 1 UID: 0 PID: 334 Comm: rackwardend Not tainted 6.12.118+deb12-cloud-amd64 #1\n\
[   37.862840] RIP: 0010:syscall_exit_to_user_mode_prepare+0xe1/0x170\n\
[   37.864699] Oops: int3: 0000 [#2] PREEMPT SMP NOPTI\n\
[   37.864893] Kernel panic - not syncing: Fatal exception in interrupt\n";
        let o = parse_console(console);
        assert_eq!(
            o.kernel_faults,
            vec![
                "Oops: int3: 0000 [#1] PREEMPT SMP NOPTI",
                "Oops: int3: 0000 [#2] PREEMPT SMP NOPTI",
                "Kernel panic - not syncing: Fatal exception in interrupt",
            ]
        );
        assert_eq!(o.exit, None);
        let clean =
            parse_console("RW_VM_BOOTED uptime=1.7\ntest a ... ok\nRW_VM_EXIT=0 uptime=9\n");
        assert!(clean.kernel_faults.is_empty());
        assert_eq!(clean.exit, Some(0));
    }
}
