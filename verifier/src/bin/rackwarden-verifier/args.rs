//! The command line: every subcommand and flag with its description.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    version,
    about = "Checks rackwarden attestations and shows each rack's standing"
)]
pub struct Cli {
    /// Configuration file (listen address, database, policy, racks).
    #[arg(
        long,
        global = true,
        default_value = "/etc/rackwarden-verifier/verifier.toml"
    )]
    pub config: PathBuf,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Serve the HTTP API and the auditor's pages (TLS unless `insecure_http` on loopback).
    Serve,
    /// Make a CA and a server certificate for `serve` (for a verifier without its own PKI):
    /// writes ca.pem (hosts' `[verifier] ca`), server.pem and server.key (`tls_cert`,
    /// `tls_key`) and server-leaf.pem (hosts' `[verifier] pinned_cert`).
    TlsInit {
        /// DNS names and IP addresses hosts use to reach the verifier.
        #[arg(long = "name", required = true)]
        names: Vec<String>,
        /// Directory to write into (created; existing files are not overwritten).
        #[arg(long)]
        out: PathBuf,
    },
    /// Enroll (or rotate) a host's public key.
    Enroll {
        /// The rack the host belongs to (a `[racks.<id>]` of the policy).
        #[arg(long)]
        rack: String,
        /// The host's id, as its config's `host_id`.
        #[arg(long)]
        host: String,
        /// The host's public key (SPKI PEM, `host.pub` from `rackwarden keygen`).
        #[arg(long)]
        key: PathBuf,
    },
    /// Retire a host's current key (it leaves its rack; its history is kept).
    Retire {
        /// The rack.
        #[arg(long)]
        rack: String,
        /// The host.
        #[arg(long)]
        host: String,
    },
    /// List enrolled hosts: keys, enrollment and retirement times, last statement.
    Hosts {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Clear a host's contraindicated statements after investigating them; the clearing is
    /// recorded with its reason and shown in the host's standing. Local only: no HTTP
    /// endpoint changes state beyond ingesting signed statements.
    Clear {
        /// The rack.
        #[arg(long)]
        rack: String,
        /// The host.
        #[arg(long)]
        host: String,
        /// Why: what was found and done (kept with the clearance).
        #[arg(long)]
        reason: String,
        /// Who clears it: the person answerable for the decision (kept and shown).
        #[arg(long)]
        by: String,
    },
    /// List every clearance: who cleared which host's statements, when, why, and which.
    Clearances {
        /// Only this rack's.
        #[arg(long)]
        rack: Option<String>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// List the AKs enrolled through `/v1/tpm/enroll` and `/v1/tpm/activate`: each host's
    /// AK Name, the CA that certified its EK, and when it was enrolled.
    TpmEnrollments {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// The transparency log of stored statements: its key, a static copy, offline checks.
    #[command(subcommand)]
    Log(LogCmd),
    /// Re-derive every stored verdict, host standing and rack state bound from the stored
    /// statements. Exits 1 when a verdict does not re-derive under the policy it names (or
    /// names none and differs), a standing row, the transparency log or a state bound
    /// differs; exits 0 otherwise, also when verdicts differ only because the policy was
    /// edited since (those are listed).
    Recheck {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum LogCmd {
    /// Print the log's verifier key (C2SP vkey: what hosts set as `[verifier] log_key`).
    Vkey,
    /// Write the log as static files: `checkpoint` and every tile under `tile/` (what a
    /// third party checks with `log verify --tiles DIR`).
    Export {
        /// Directory to write into (created).
        #[arg(long)]
        out: PathBuf,
    },
    /// Check a checkpoint offline: its signature, that the tiles hash to its root, every
    /// entry against its leaf hash, and that each `--old` checkpoint is a prefix of it.
    /// Needs no config.
    Verify {
        /// The signed checkpoint (a file).
        #[arg(long)]
        checkpoint: PathBuf,
        /// The log's key: a vkey, or a file holding one (`tlog.vkey`).
        #[arg(long)]
        key: String,
        /// The log's tiles: a directory (`tile/...`, as `log export` writes them) or the
        /// URL of a verifier's log (`https://verifier.example:7700/tlog`). Without it, only
        /// the signature is checked.
        #[arg(long)]
        tiles: Option<String>,
        /// The CA (PEM) to trust for an https:// --tiles URL (a verifier's `ca.pem`).
        #[arg(long)]
        ca: Option<PathBuf>,
        /// Earlier checkpoints (files) that must be prefixes of this one.
        #[arg(long = "old")]
        old: Vec<PathBuf>,
    },
}
