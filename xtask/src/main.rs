//! `cargo xtask <setup|demo|test|bench|install|pg>`: the project's two front-door commands,
//! their provisioning, and the installer. Every step is idempotent: it checks before it
//! installs.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result, bail};

mod esp;
mod pg;
mod vm;

const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
/// Debian packages the build and the tests need.
const APT_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "iproute2",
    "openssl",
    "bpftool",
    "python3",
    // The in-toto interop test's virtual environment (see `intoto_python`).
    "python3-venv",
    // systemd-analyze verifies the installed units (the install test).
    "systemd",
    // Headless browser: the verifier page test and the demo's screenshot.
    "chromium",
    // TPM 2.0: the daemon links libtss2 (tss-esapi, found with pkg-config); the tests run a
    // software TPM (swtpm, with swtpm_setup and its local CA, which needs certtool).
    "pkg-config",
    "libtss2-dev",
    "swtpm",
    "swtpm-tools",
    "gnutls-bin",
    // The verifier's PostgreSQL backend is tested against a real server (see `pg`).
    "postgresql",
    // The C compiler and linker rustc links with, and that ring's build script uses.
    "gcc",
];

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match args.first().map(String::as_str) {
        Some("setup") => {
            setup()?;
        }
        Some("demo") => {
            let env = setup()?;
            cargo(&env, &["build", "--workspace", "--bins"])?;
            // `cargo xtask demo [--exit]`: in a terminal the demo holds its page up until
            // Ctrl-C; `--exit` ends it at once.
            run_checked(
                Command::new("target/debug/rackwarden-demo")
                    .args(&args[1..])
                    .envs(&env),
                "demo",
            )?;
        }
        Some("test") => test(&setup()?)?,
        Some("vm-test") => vm::vm_test(&setup()?, &args[1..])?,
        Some("pg") => {
            // `cargo xtask pg -- <command...>`: the command runs as `sh -c "<args joined by
            // spaces>"` (as ssh does), so `$RACKWARDEN_TEST_POSTGRES` in it expands there:
            // quote it once for your own shell.
            let cmd = match args.get(1).map(String::as_str) {
                Some("--") => &args[2..],
                _ => &args[1..],
            };
            if cmd.is_empty() {
                bail!("usage: cargo xtask pg -- <command...>");
            }
            let env = setup()?;
            let code = pg_run(&env, &cmd.join(" "))?;
            std::process::exit(code);
        }
        Some("bench") => {
            let env = setup()?;
            cargo(&env, &["build", "--release", "--workspace", "--bins"])?;
            let what: Vec<&str> = args[1..].iter().map(String::as_str).collect();
            // The verifier and page benchmarks run their PostgreSQL arms on a throwaway
            // server, stopped (dropped) whatever the benchmarks' result.
            let server = if what.is_empty() || what.iter().any(|w| *w == "verifier" || *w == "page")
            {
                Some(pg::Server::start(&pg::scratch_dir())?)
            } else {
                None
            };
            let mut env = env;
            if let Some(s) = &server {
                env.insert(pg::URL_VAR.into(), s.url());
            }
            let ran = run_checked(
                Command::new("target/release/rackwarden-bench")
                    .args(&what)
                    .envs(&env),
                "bench",
            );
            drop(server);
            ran?;
        }
        Some("uninstall") => {
            // cargo xtask uninstall [--root DIR]
            uninstall(Path::new(&root_flag(&args)?))?;
        }
        Some("install") => {
            // cargo xtask install [--root DIR] [--debug] [--no-build] [--verify]
            let root = root_flag(&args)?;
            let profile = if args.iter().any(|a| a == "--debug") {
                "debug"
            } else {
                "release"
            };
            if !args.iter().any(|a| a == "--no-build") {
                let env = setup()?;
                let mut b = vec![
                    "build",
                    "-p",
                    "rackwarden",
                    "-p",
                    "rackwarden-verifier",
                    "-p",
                    "rackwarden-inference",
                    "-p",
                    "rackwarden-replay",
                    "--bins",
                ];
                if profile == "release" {
                    b.push("--release");
                }
                cargo(&env, &b)?;
            }
            install(Path::new(&root), profile)?;
            if args.iter().any(|a| a == "--verify") {
                verify_units(Path::new(&root))?;
            }
        }
        Some("fuzz") => {
            // Not part of CI: `cargo xtask fuzz [SECONDS]` (default 300) on the envelope parser.
            setup()?;
            let secs = args.get(1).map(String::as_str).unwrap_or("300");
            if !succeeds(Command::new("cargo").args(["fuzz", "--version"])) {
                step("cargo install cargo-fuzz");
                run_checked(
                    Command::new("cargo").args(["install", "cargo-fuzz", "--locked"]),
                    "cargo install cargo-fuzz",
                )?;
            }
            run_checked(
                Command::new("rustup")
                    .args(["run", "nightly", "cargo", "fuzz", "run", "envelope", "--"])
                    .arg(format!("-max_total_time={secs}"))
                    .current_dir("attest"),
                "cargo fuzz",
            )?;
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <command>\n\n  setup          install what the build needs (idempotent)\n  demo [--exit]  the whole job on an embedded default; in a terminal it keeps the page up\n                 until Ctrl-C, --exit ends it at once\n  test           fmt, clippy, unit and integration tests (root), the verifier suite on\n                 PostgreSQL, then vm-test\n  vm-test [--kernel PATH [--modules DIR]] [--group NAME]... [--accel A] [--cpu MODEL]\n                 kernel-facing tests in VMs on Debian 6.1 and the newest cloud kernel\n  bench [attest|images|wipe|verifier|page|limiter|bypass|epoch|watch|tpm|taps|replay]  benchmarks, each next to its anchor\n  install [--root DIR] [--debug] [--no-build] [--verify]\n                 binaries, units, sysusers/tmpfiles, example configs; --debug installs the\n                 debug build, --no-build installs what target/ has, --verify runs\n                 systemd-analyze verify and security on the installed units\n  uninstall [--root DIR]  removes what install wrote (never configs, keys or state); refused on\n                 a sealed host\n  fuzz [SECONDS]   fuzz the envelope/statement parser (not in CI)\n  pg -- <command...>\n                 runs sh -c \"<command...>\" with a throwaway PostgreSQL server in\n                 $RACKWARDEN_TEST_POSTGRES, e.g. cargo xtask pg -- 'cargo test -p\n                 rackwarden-verifier --lib'; exits with the command's status"
            );
            bail!("unknown command {:?}", args.first());
        }
    }
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

fn step(msg: &str) {
    println!("==> {msg}");
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd
        .status()
        .with_context(|| format!("cannot run {what}: {cmd:?}"))?;
    if !status.success() {
        bail!("{what} failed ({status}): {cmd:?}");
    }
    Ok(())
}

fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn apt_install(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| {
            !output(Command::new("dpkg-query").args(["-W", "-f=${Status}", p]))
                .is_some_and(|s| s.contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    step(&format!("apt-get install {}", missing.join(" ")));
    apt_update_and_install(&missing)
}

/// `apt-get update`, then `apt-get install` of `args` (package names, and options such as
/// `-t SUITE`), non-interactive and without recommends.
fn apt_update_and_install(args: &[&str]) -> Result<()> {
    run_checked(
        Command::new("apt-get").args(["update", "-qq"]),
        "apt-get update",
    )?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive"),
        &format!("apt-get install {}", args.join(" ")),
    )
}

/// Installs what the build needs and returns the environment the builds must run with.
fn setup() -> Result<BTreeMap<String, String>> {
    let mut env = BTreeMap::new();
    apt_install(APT_PACKAGES)?;

    // The eBPF crate needs core built from source for bpfel-unknown-none.
    let nightly_src =
        output(Command::new("rustup").args(["run", "nightly", "rustc", "--print", "sysroot"]))
            .map(|s| {
                Path::new(&s)
                    .join("lib/rustlib/src/rust/library/core")
                    .exists()
            })
            .unwrap_or(false);
    if !nightly_src {
        step("rustup component add rust-src --toolchain nightly");
        let added = succeeds(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]));
        if !added {
            // Fallback: Debian's rustc-web ships its library sources.
            step("rust-src unavailable from rustup; using Debian rustc-web + rust-web-src");
            apt_install(&["rustc-web", "rust-web-src", "libstd-rust-web-dev"])?;
            // rustc-web installs /usr/bin/rustc with sysroot /usr; take whichever rustc's
            // sysroot really carries the library sources.
            let rustc = ["/usr/bin/rustc", "/usr/lib/rust-web/bin/rustc"]
                .into_iter()
                .find(|r| {
                    output(Command::new(r).args(["--print", "sysroot"])).is_some_and(|s| {
                        Path::new(&s)
                            .join("lib/rustlib/src/rust/library/core")
                            .exists()
                    })
                })
                .context("rustc-web installed but no rustc with library sources was found")?;
            env.insert("RACKWARDEN_EBPF_RUSTC".into(), rustc.into());
        }
    }

    let have_linker = output(Command::new("bpf-linker").arg("--version"))
        .is_some_and(|v| v.contains(BPF_LINKER_VERSION));
    if !have_linker {
        step(&format!(
            "cargo install bpf-linker {BPF_LINKER_VERSION} (LLVM 22)"
        ));
        run_checked(
            Command::new("cargo")
                .args([
                    "install",
                    "bpf-linker",
                    "--version",
                    BPF_LINKER_VERSION,
                    "--locked",
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ])
                .env("LLVM_PREFIX", LLVM_PREFIX),
            "cargo install bpf-linker",
        )?;
    }
    for comp in ["clippy", "rustfmt"] {
        if !succeeds(Command::new("cargo").args([comp_cmd(comp), "--version"])) {
            step(&format!("rustup component add {comp}"));
            run_checked(
                Command::new("rustup").args(["component", "add", comp]),
                "rustup component add",
            )?;
        }
    }
    env.insert(INTOTO_PYTHON_VAR.into(), intoto_python()?);
    Ok(env)
}

/// Where the in-toto interop test finds its interpreter.
const INTOTO_PYTHON_VAR: &str = "RACKWARDEN_INTOTO_PYTHON";
/// The in-toto libraries our statements are tested against, pinned.
const INTOTO_PIP: &[&str] = &[
    "in-toto-attestation==0.9.3",
    "securesystemslib==1.6.0",
    "cryptography==46.0.3",
];

/// A virtual environment under target/ with [`INTOTO_PIP`] installed (Debian's python3, from
/// PyPI); returns its interpreter. Made again when the pins change.
fn intoto_python() -> Result<String> {
    let venv = workspace_root().join("target/py-intoto");
    let python = venv.join("bin/python");
    let stamp = venv.join("rackwarden-pins");
    let want = INTOTO_PIP.join("\n");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(want.as_str()) {
        step(&format!(
            "python venv {} with {}",
            venv.display(),
            INTOTO_PIP.join(" ")
        ));
        let _ = std::fs::remove_dir_all(&venv);
        run_checked(
            Command::new("/usr/bin/python3")
                .arg("-m")
                .arg("venv")
                .arg(&venv),
            "python3 -m venv",
        )?;
        run_checked(
            Command::new(&python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                ])
                .args(INTOTO_PIP),
            "pip install (in-toto libraries)",
        )?;
        std::fs::write(&stamp, &want)?;
    }
    Ok(python.display().to_string())
}

fn comp_cmd(c: &str) -> &str {
    match c {
        "rustfmt" => "fmt",
        other => other,
    }
}

fn cargo(env: &BTreeMap<String, String>, args: &[&str]) -> Result<()> {
    run_checked(
        Command::new("cargo").args(args).envs(env),
        &format!("cargo {}", args.join(" ")),
    )
}

fn test(env: &BTreeMap<String, String>) -> Result<()> {
    step("cargo fmt --check");
    cargo(env, &["fmt", "--all", "--check"])?;
    step("cargo clippy -D warnings");
    cargo(
        env,
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    )?;
    step("build binaries");
    cargo(env, &["build", "--workspace", "--bins"])?;
    // The GPU wipe tests load this library as their CUDA driver (CI has no GPU).
    cargo(env, &["build", "-p", "rackwarden-cuda-double"])?;
    step("unit tests");
    cargo(
        env,
        &[
            "test",
            "--workspace",
            "--exclude",
            "rackwarden-tests",
            "--lib",
            "--bins",
            "--tests",
        ],
    )?;
    // `--tests` runs test targets only: no empty doc-test run, so the last runner line that
    // CI reads counts the integration tests.
    // The netns tests measure rates against wall time on a 2-core machine: run them one at
    // a time so one test's flood does not steal the other's CPU. (Their names and pins are
    // unique, so they could also run side by side.)
    // Shown with their output: without a GPU each prints SKIP and the reason, and on a GPU
    // the numbers (bytes covered, GB/s, mismatches).
    step("GPU tests (real GPU only; SKIP without one)");
    cargo(
        env,
        &[
            "test",
            "-p",
            "rackwarden-tests",
            "--test",
            "gpu",
            "--",
            "--nocapture",
            "--test-threads=1",
        ],
    )?;
    step("integration tests (network namespaces, eBPF; needs root)");
    cargo(
        env,
        &[
            "test",
            "-p",
            "rackwarden-tests",
            "--tests",
            "--",
            "--test-threads=1",
        ],
    )?;
    // The steps above ran the verifier's default store; these run its suite, and the
    // integration tests that drive a verifier, again on a real PostgreSQL server (the
    // backend's SQL, locking and transactions are only proven against the real thing).
    step("verifier suite on PostgreSQL");
    let server = pg::Server::start(&pg::scratch_dir())?;
    let mut pg_env = env.clone();
    pg_env.insert(pg::URL_VAR.into(), server.url());
    let ran = cargo(
        &pg_env,
        &[
            "test",
            "-p",
            "rackwarden-verifier",
            "--lib",
            "--tests",
            "--",
            "--test-threads=2",
        ],
    )
    .and_then(|()| {
        cargo(
            &pg_env,
            &[
                "test",
                "-p",
                "rackwarden-tests",
                "--test",
                "fleet",
                "--test",
                "tlog",
                "--",
                "--test-threads=1",
            ],
        )
    });
    // Stopped whatever the result, before the error goes up.
    drop(server);
    ran?;
    // The same kernel-facing tests on the kernels rack hosts run (6.1: clsact; newest: tcx).
    step("VM tests (Debian 6.1 and the newest cloud kernel, under qemu)");
    vm::vm_test(env, &[])?;
    // Downloads a guest kernel (vm-test has by now): ignored in the unit-test step, run here.
    step("the harness's kernel digest against OVMF's measurement");
    cargo(
        env,
        &[
            "test",
            "-p",
            "xtask",
            "--",
            "--ignored",
            "--exact",
            "vm::tests::the_kernel_digest_is_what_ovmf_measured_for_qemus_image",
        ],
    )?;
    println!("==> all tests passed");
    Ok(())
}

/// `cargo xtask pg`: runs `script` under `sh -c` with a fresh server in
/// `RACKWARDEN_TEST_POSTGRES` and returns its exit code (128 + the signal if one killed it).
/// The server is stopped before the code is returned: `process::exit` runs no drops.
fn pg_run(env: &BTreeMap<String, String>, script: &str) -> Result<i32> {
    use std::os::unix::process::ExitStatusExt as _;
    let server = pg::Server::start(&pg::scratch_dir())?;
    step(&format!("{}={}", pg::URL_VAR, server.url()));
    let status = Command::new("sh")
        .args(["-c", script])
        .envs(env)
        .env(pg::URL_VAR, server.url())
        .status()
        .with_context(|| format!("cannot run sh -c {script:?}"));
    drop(server);
    let status = status?;
    Ok(status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1))
}

/// `--root DIR`, or `/`.
fn root_flag(args: &[String]) -> Result<String> {
    Ok(args
        .iter()
        .position(|a| a == "--root")
        .map(|i| args.get(i + 1).cloned().context("--root needs a directory"))
        .transpose()?
        .unwrap_or_else(|| "/".into()))
}

/// What `install` puts where, relative to the root: (source in the repo, destination, mode).
/// Binaries come from `target/<profile>/`.
const INSTALL: &[(&str, &str, u32)] = &[
    (
        "target/{profile}/rackwardend",
        "usr/local/bin/rackwardend",
        0o755,
    ),
    (
        "target/{profile}/rackwarden",
        "usr/local/bin/rackwarden",
        0o755,
    ),
    (
        "target/{profile}/rackwarden-verifier",
        "usr/local/bin/rackwarden-verifier",
        0o755,
    ),
    // The reference inference server (rack hosts), the replay service (the verifier's
    // side) and the model tool (digests, the bundled model).
    (
        "target/{profile}/rackwarden-serve",
        "usr/local/bin/rackwarden-serve",
        0o755,
    ),
    (
        "target/{profile}/rackwarden-replay",
        "usr/local/bin/rackwarden-replay",
        0o755,
    ),
    (
        "target/{profile}/rackwarden-model",
        "usr/local/bin/rackwarden-model",
        0o755,
    ),
    (
        "systemd/rackwardend.service",
        "etc/systemd/system/rackwardend.service",
        0o644,
    ),
    (
        "systemd/rackwarden-verifier.service",
        "etc/systemd/system/rackwarden-verifier.service",
        0o644,
    ),
    (
        "systemd/rackwarden.sysusers.conf",
        "etc/sysusers.d/rackwarden.conf",
        0o644,
    ),
    (
        "systemd/rackwarden.tmpfiles.conf",
        "etc/tmpfiles.d/rackwarden.conf",
        0o644,
    ),
    (
        "systemd/rackwarden.toml.example",
        "etc/rackwarden/rackwarden.toml.example",
        0o644,
    ),
    (
        "systemd/verifier.toml.example",
        "etc/rackwarden-verifier/verifier.toml.example",
        0o644,
    ),
    (
        "README.md",
        "usr/local/share/doc/rackwarden/README.md",
        0o644,
    ),
];

/// Installs under `root`. Each file is written beside its destination and renamed over it,
/// so a running daemon keeps its old binary (the old inode) until it restarts, and a crash
/// never leaves half a file. Existing configs are never touched: only `.example` files.
fn install(root: &Path, profile: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for (src, dst, mode) in INSTALL {
        let src = PathBuf::from(src.replace("{profile}", profile));
        let dst = root.join(dst);
        let bytes = std::fs::read(&src).with_context(|| {
            format!(
                "{}: missing (build first, or drop --no-build)",
                src.display()
            )
        })?;
        let dir = dst.parent().context("destination without a directory")?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let tmp = dst.with_extension("rackwarden-install-tmp");
        std::fs::write(&tmp, &bytes).with_context(|| format!("writing {}", tmp.display()))?;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(*mode))?;
        std::fs::rename(&tmp, &dst).with_context(|| format!("installing {}", dst.display()))?;
        println!("installed {}", dst.display());
        if dst.file_name().is_some_and(|n| n == "rackwardend") {
            record_daemon_digest(root, &bytes)?;
        }
    }
    if root == Path::new("/") {
        println!(
            "\nnext steps:\n  systemd-sysusers && systemd-tmpfiles --create\n  rackwarden keygen --out /etc/rackwarden/keys\n  cp /etc/rackwarden/rackwarden.toml.example /etc/rackwarden/rackwarden.toml   # then edit it\n  rackwarden check-config\n  (verifier side) rackwarden-verifier enroll --rack R --host H --key host.pub\n  systemctl daemon-reload && systemctl enable --now rackwardend"
        );
    }
    Ok(())
}

/// Where install records the daemon's SHA-256 (under the install root).
const DAEMON_DIGEST_FILE: &str = "usr/share/rackwarden/rackwardend.sha256";

/// The SHA-256 of the installed daemon, which IMA measures when it runs: the verifier's
/// `[policy.runtime] daemon_digests` names it. Kept beside the install (sha256sum format) and
/// printed, so the operator copies it from the build they installed, not from the host later.
fn record_daemon_digest(root: &Path, exe: &[u8]) -> Result<()> {
    use sha2::Digest as _;
    let digest = hex_lower(&sha2::Sha256::digest(exe));
    let file = root.join(DAEMON_DIGEST_FILE);
    let dir = file.parent().context("digest file without a directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::write(&file, format!("{digest}  /usr/local/bin/rackwardend\n"))
        .with_context(|| format!("writing {}", file.display()))?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644))?;
    println!(
        "rackwardend sha256 {digest} (in {}): name it in the verifier's [policy.runtime] daemon_digests",
        file.display()
    );
    Ok(())
}

fn hex_lower(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The most exposure `systemd-analyze security` may give each installed unit (lower is
/// better; each setting the units leave out says why in the unit).
const EXPOSURE_GOALS: &[(&str, f64)] = &[
    ("rackwardend.service", 4.0),
    ("rackwarden-verifier.service", 2.5),
];

/// `install --verify`: `systemd-analyze verify` and `security --offline` on the units as
/// installed under `root`. verify resolves what a unit names (targets it orders after, the
/// commands it runs) inside the root, so a root that is not `/` first gets this host's own
/// systemd units and `kill` beside ours.
fn verify_units(root: &Path) -> Result<()> {
    if !succeeds(Command::new("systemd-analyze").arg("--version")) {
        bail!("systemd-analyze is missing: `cargo xtask setup` installs Debian's systemd package");
    }
    if root != Path::new("/") {
        copy_tree(
            Path::new("/usr/lib/systemd/system"),
            &root.join("usr/lib/systemd/system"),
        )?;
        std::fs::create_dir_all(root.join("usr/bin"))?;
        std::fs::copy("/bin/kill", root.join("usr/bin/kill")).context("copying /bin/kill")?;
        for (link, target) in [("bin", "usr/bin"), ("lib", "usr/lib")] {
            if std::fs::symlink_metadata(root.join(link)).is_err() {
                std::os::unix::fs::symlink(target, root.join(link))?;
            }
        }
    }
    let units: Vec<String> = EXPOSURE_GOALS
        .iter()
        .map(|(u, _)| format!("/etc/systemd/system/{u}"))
        .collect();
    let out = Command::new("systemd-analyze")
        .arg(format!("--root={}", root.display()))
        .arg("verify")
        .args(&units)
        .output()
        .context("running systemd-analyze verify")?;
    let err = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() || !err.trim().is_empty() {
        bail!("systemd-analyze verify: {}", err.trim());
    }
    println!("systemd-analyze verify: both units OK");
    for ((unit, goal), path) in EXPOSURE_GOALS.iter().zip(&units) {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true"])
            .arg(format!("--root={}", root.display()))
            .arg(path)
            .output()
            .context("running systemd-analyze security")?;
        let text = String::from_utf8_lossy(&out.stdout);
        let score = text
            .lines()
            .find_map(|l| l.split_once("Overall exposure level for "))
            .and_then(|(_, r)| r.split_once(": "))
            .and_then(|(_, r)| r.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
            .with_context(|| format!("systemd-analyze security printed no score for {unit}"))?;
        println!("exposure {unit}: {score:.1} (goal <= {goal:.1})");
        if score > *goal {
            bail!("{unit}: exposure {score:.1} is above its goal {goal:.1}");
        }
    }
    Ok(())
}

fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let e = e?;
        let (p, t) = (e.path(), to.join(e.file_name()));
        let ft = e.file_type()?;
        if ft.is_symlink() {
            let _ = std::os::unix::fs::symlink(std::fs::read_link(&p)?, &t);
        } else if ft.is_dir() {
            copy_tree(&p, &t)?;
        } else {
            std::fs::copy(&p, &t).with_context(|| format!("copying {}", p.display()))?;
        }
    }
    Ok(())
}

/// Where a sealed host keeps its guard: while it is there, the guard refuses a detach to
/// everyone but the daemon, and only a reboot without the guard lifts it.
const SEALED_GUARD: &str = "/sys/fs/bpf/rackwarden/guard/current";

/// `uninstall`: removes every file `install` wrote under `root`, never the configs, the
/// keys or the state (an operator's, and evidence). The pinned limiter stays enforcing
/// until its pins are removed or the host reboots: uninstalling the software does not lift
/// the cap by itself, and says how to.
fn uninstall(root: &Path) -> Result<()> {
    if root == Path::new("/") && Path::new(SEALED_GUARD).exists() {
        bail!(
            "this host is sealed ({SEALED_GUARD} exists): the guard refuses removal; \
             set self_protection = \"watch\" or \"off\", reboot, then uninstall"
        );
    }
    let written = INSTALL
        .iter()
        .map(|(_, dst, _)| *dst)
        .chain([DAEMON_DIGEST_FILE]);
    for dst in written {
        let dst = root.join(dst);
        match std::fs::remove_file(&dst) {
            Ok(()) => println!("removed {}", dst.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("removing {}", dst.display())),
        }
    }
    println!(
        "\nkept: /etc/rackwarden (config, keys), /var/lib/rackwarden (the signed log),\n\
         /etc/rackwarden-verifier, /var/lib/rackwarden-verifier.\n\
         The limiter stays pinned and enforcing: `systemctl disable --now rackwardend` first,\n\
         then `rm -r /sys/fs/bpf/rackwarden` to lift the cap (or reboot)."
    );
    Ok(())
}
