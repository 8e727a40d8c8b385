//! The command line: every flag with its description. Quantities parse through the shared
//! unit types (`ByteSize`, `Rate`, `Interval`, `Nonce`), the same ones the config uses.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rackwarden::units::{ByteSize, Interval, Rate};
use rackwarden_attest::nonce::Nonce;

pub const EXIT_CODES: &str = "Exit status: 0 success; 1 a failure the output names (a statement that does not verify, a wipe mismatch or failure, a refused request); 2 a usage error (bad flag or value); 3 a wipe interrupted by SIGTERM/SIGINT.";

#[derive(Parser)]
#[command(version, about = "Operate and inspect rackwarden", after_help = EXIT_CODES)]
pub struct Cli {
    /// Older scripts write `rackwarden --config X status`: taken for the commands that read
    /// a config, a usage error for the others ([`Cli::command_with_flags`]).
    #[arg(long, hide = true)]
    config: Option<PathBuf>,
    /// As `config`, for the commands that talk to the daemon.
    #[arg(long, hide = true)]
    socket: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

/// The configuration file, for the commands that read it.
#[derive(clap::Args)]
pub struct ConfigArg {
    /// Configuration file [default: /etc/rackwarden/rackwarden.toml].
    #[arg(long)]
    config: Option<PathBuf>,
}

impl ConfigArg {
    pub fn path(&self) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| rackwarden::config::DEFAULT_PATH.into())
    }
}

/// How a command reaches the running daemon: the control socket the config names, or
/// `--socket`.
#[derive(clap::Args)]
pub struct DaemonArgs {
    /// Configuration file (names the control socket, pins and state directory)
    /// [default: /etc/rackwarden/rackwarden.toml].
    #[arg(long)]
    config: Option<PathBuf>,
    /// Control socket; overrides the one named in the config.
    #[arg(long)]
    pub socket: Option<PathBuf>,
}

impl DaemonArgs {
    pub fn config_path(&self) -> PathBuf {
        self.config
            .clone()
            .unwrap_or_else(|| rackwarden::config::DEFAULT_PATH.into())
    }
}

impl Cli {
    /// The command, with a `--config`/`--socket` written before it moved into it. Exits 2
    /// (a usage error) where the command does not use the flag.
    pub fn command_with_flags(self) -> Cmd {
        let Cli {
            config,
            socket,
            mut cmd,
        } = self;
        let (config_slot, socket_slot) = match &mut cmd {
            Cmd::Status { daemon, .. }
            | Cmd::WipeNow { daemon }
            | Cmd::Cap {
                cmd: CapCmd::Set { daemon, .. },
            } => (Some(&mut daemon.config), Some(&mut daemon.socket)),
            Cmd::Attest { config, .. }
            | Cmd::CheckConfig { config, .. }
            | Cmd::Log {
                cmd: LogCmd::Verify { config, .. },
            } => (Some(&mut config.config), None),
            _ => (None, None),
        };
        for (flag, given, slot) in [
            ("--config", config, config_slot),
            ("--socket", socket, socket_slot),
        ] {
            match (given, slot) {
                (None, _) => {}
                (Some(v), Some(slot)) => {
                    slot.get_or_insert(v);
                }
                (Some(_), None) => {
                    use clap::CommandFactory as _;
                    Cli::command()
                        .error(
                            clap::error::ErrorKind::UnknownArgument,
                            format!("this command does not use {flag}"),
                        )
                        .exit()
                }
            }
        }
        cmd
    }
}

/// A wipe backend list (`host`, `gpu`, `scratch`, `all`): an unknown one is a usage error.
fn backend_value(s: &str) -> Result<String, rackwarden::wipe::UnknownBackend> {
    rackwarden::wipe::Backend::parse(s)?;
    Ok(s.to_string())
}

/// A cap as the config writes it (`"5 MB/s"`, `"8 Mbit/s"`, `"200000 tokens/s"`): checked
/// here so a malformed one is a usage error (exit 2); the daemon converts it.
fn cap_value(s: &str) -> Result<String, rackwarden::units::UnitError> {
    rackwarden::units::parse_rate(s)?;
    Ok(s.to_string())
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Caps, counters, recent rates, attachments, enforcement gaps, the epoch loop and
    /// delivery. With the daemon down, what the pinned limiter shows.
    Status {
        #[command(flatten)]
        daemon: DaemonArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Change the running caps.
    Cap {
        #[command(subcommand)]
        cmd: CapCmd,
    },
    /// Start an epoch now: challenge, drain, wipe, stage, sign, deliver.
    WipeNow {
        #[command(flatten)]
        daemon: DaemonArgs,
    },
    /// Write a new ed25519 key pair: DIR/NAME.key (PKCS#8 PEM, 0600) and DIR/NAME.pub.
    /// With --rotate, the host's next key beside its current one: DIR/NAME.next.key and
    /// DIR/NAME.next.pub; the daemon's next statement names it (signed with the current
    /// key), then signs with it.
    Keygen {
        /// Directory to write the pair into (with --rotate: the directory of
        /// epoch.signing_key).
        #[arg(long)]
        out: PathBuf,
        /// File name stem of the pair.
        #[arg(long, default_value = "host")]
        name: String,
        /// Rotate: write the next key of the key DIR/NAME.key (which must exist).
        #[arg(long)]
        rotate: bool,
    },
    /// Append one signed statement describing the current enforcement state to a log (no
    /// wipe, no images: the epoch loop of rackwardend makes the full statements).
    Attest {
        #[command(flatten)]
        config: ConfigArg,
        /// The host's private key (PKCS#8 PEM).
        #[arg(long)]
        key: PathBuf,
        /// The evidence log to append to.
        #[arg(long)]
        log: PathBuf,
        /// The verifier's 32-byte challenge (64 hex digits); without it the statement says
        /// "unchallenged".
        #[arg(long)]
        nonce: Option<Nonce>,
    },
    /// Check every statement of a log: signature, chain, time. Exits 1 on any failure.
    Verify {
        /// The host's public key (SPKI PEM).
        #[arg(long)]
        key: PathBuf,
        /// The evidence log.
        log: PathBuf,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Fill and verify memory with a stream keyed by a challenge nonce; report residue.
    Wipe {
        /// host, gpu, scratch or all.
        #[arg(long, default_value = "all", value_parser = backend_value)]
        backend: String,
        /// Most bytes to take per device, e.g. "256 MiB" or 268435456 (default: all that is safe).
        #[arg(long)]
        max_bytes: Option<ByteSize>,
        /// The 32-byte challenge, 64 hex digits (default: a fresh random one, printed).
        #[arg(long)]
        nonce: Option<Nonce>,
        /// Host memory to leave untouched.
        #[arg(long, default_value = "1 GiB")]
        reserve: ByteSize,
        /// Scratch directories to empty (required with --backend scratch).
        #[arg(long)]
        scratch: Vec<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Every disk, mount and swap area of this host and where its bytes are accounted for:
    /// the storage inventory a statement would carry now. Exits 1 when anything is residue.
    Storage {
        /// Print JSON (the statement's `storage` object) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// The arithmetic behind the caps: transfer times, slowdown, state bound per wipe epoch.
    Budget(BudgetArgs),
    /// Image digests and verified staging.
    Image {
        #[command(subcommand)]
        cmd: ImageCmd,
    },
    /// Signed image manifests (the verifier side makes them).
    Manifest {
        #[command(subcommand)]
        cmd: ManifestCmd,
    },
    /// Check a configuration file as the daemon would (keys, manifest, CA, directories,
    /// interfaces) and print what it means, each value with its unit, and warnings.
    CheckConfig {
        #[command(flatten)]
        config: ConfigArg,
        /// The verifier's configuration file, where it is at hand: warns where this config
        /// cannot meet its policy (the rack's agreed caps, max_residue_host).
        #[arg(long)]
        verifier_config: Option<PathBuf>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The `[policy.boot]` values that accept this host's boot, read from its event log (or
    /// the Authenticode digest of kernel images, to add to `kernels` before an update).
    BootReference {
        /// The firmware's event log.
        #[arg(long, default_value = rackwarden_attest::tpm::EVENT_LOG_PATH)]
        event_log: PathBuf,
        /// The command line the kernel runs with (checked against the measured digest).
        #[arg(long, default_value = "/proc/cmdline")]
        cmdline: PathBuf,
        /// Print the digest firmware or shim logs for these kernel (PE) images instead.
        #[arg(long)]
        kernel: Vec<PathBuf>,
    },
    /// The verifier's transparency log, as this host kept it.
    Log {
        #[command(subcommand)]
        cmd: LogCmd,
    },
}

#[derive(Subcommand)]
pub enum LogCmd {
    /// Check offline what the daemon kept (`<state_dir>/tlog-entries.jsonl`): each
    /// statement's inclusion proof against its signed checkpoint; with --tiles, that the
    /// tiles hash to the newest checkpoint (or --checkpoint), that every kept checkpoint is a
    /// prefix of it, and that each kept statement is its leaf. Exits 1 on any failure,
    /// naming the checkpoints.
    Verify {
        #[command(flatten)]
        config: ConfigArg,
        /// The log's key (a vkey, or a file holding one; default: `[verifier] log_key`).
        #[arg(long)]
        key: Option<String>,
        /// The checkpoint to check the tiles against (default: the tiles' own `checkpoint`).
        #[arg(long)]
        checkpoint: Option<PathBuf>,
        /// The log's tiles: a directory (`rackwarden-verifier log export`) or the URL of
        /// the verifier's log (`https://verifier:7700/tlog`, trusted as `[verifier]` says).
        #[arg(long)]
        tiles: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
pub struct BudgetArgs {
    /// Model parameters, e.g. 1e12.
    #[arg(long)]
    pub params: f64,
    /// Gradient dtype as sent: fp32, bf16, fp16, fp8, int8, fp4, int4.
    #[arg(long, default_value = "fp8")]
    pub dtype: String,
    /// Low-communication sync compression relative to an fp32 gradient.
    #[arg(long, default_value_t = 146.0)]
    pub compression: f64,
    /// Inner optimizer steps between syncs.
    #[arg(long, default_value_t = 30.0)]
    pub inner_steps: f64,
    /// Time of one training step.
    #[arg(long, default_value = "10 s")]
    pub step_time: Interval,
    /// The rack's frontend cap.
    #[arg(long, default_value = "10 MB/s")]
    pub cap: Rate,
    /// Time between wipes.
    #[arg(long, default_value = "15 min")]
    pub wipe_interval: Interval,
    /// Trainable-state bytes per parameter: weights (bf16: 2) ...
    #[arg(long, default_value_t = 2.0)]
    pub weight_bytes_per_param: f64,
    /// ... plus optimizer state (Adam in fp32: 8).
    #[arg(long, default_value_t = 8.0)]
    pub optimizer_bytes_per_param: f64,
    /// Bytes one generated token costs on the wire.
    #[arg(long, default_value_t = 4.0)]
    pub bytes_per_token: f64,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(Subcommand)]
pub enum CapCmd {
    /// Set the rack cap (this host enforces cap x host_share), e.g. --egress "5 MB/s".
    #[command(group(clap::ArgGroup::new("caps").required(true).multiple(true)))]
    Set {
        #[command(flatten)]
        daemon: DaemonArgs,
        /// New rack egress cap.
        #[arg(long, group = "caps", value_parser = cap_value)]
        egress: Option<String>,
        /// New rack ingress cap.
        #[arg(long, group = "caps", value_parser = cap_value)]
        ingress: Option<String>,
        /// Also rewrite the config file so the cap survives a restart.
        #[arg(long)]
        persist: bool,
        /// Apply a cap above the one in the config file (the agreed cap): refused without it.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Print the merkle_sha3_256 of each file.
    Digest {
        /// Files to digest.
        files: Vec<PathBuf>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Worker threads (default: all cores). The digest does not depend on it.
        #[arg(long)]
        threads: Option<usize>,
    },
    /// Verify MANIFEST, then copy, hash and seal the whole set from SOURCE under STAGING.
    Stage {
        /// The signed manifest.
        #[arg(long)]
        manifest: PathBuf,
        /// The verifier's public key (the manifest's signer).
        #[arg(long)]
        key: PathBuf,
        /// Directory holding the images.
        #[arg(long)]
        source: PathBuf,
        /// Staging directory (sets/, current).
        #[arg(long)]
        staging: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum ManifestCmd {
    /// Digest every file under DIR... and write a manifest signed with the verifier's KEY.
    Create {
        /// The verifier's private key.
        #[arg(long)]
        key: PathBuf,
        /// Where to write the manifest.
        #[arg(long)]
        out: PathBuf,
        /// Also write leaf-hash sidecars so a mismatch names its first bad chunk.
        #[arg(long)]
        sidecars: bool,
        /// Directories of images.
        #[arg(required = true)]
        dirs: Vec<PathBuf>,
    },
    /// Check a manifest's signature and contents.
    Verify {
        /// The verifier's public key.
        #[arg(long)]
        key: PathBuf,
        /// The signed manifest.
        manifest: PathBuf,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}
