//! rackwarden-verifier: the verifying party's service. All logic is in the library; each
//! command here calls it and prints what it returns; each has a module of its own, the
//! command line is [`args`].

mod args;
mod clear;
mod clearances;
mod enroll;
mod hosts;
mod log_cmd;
mod recheck;
mod retire;
mod serve;
mod tls_init;
mod tpm_enrollments;

use anyhow::Context as _;
use clap::Parser;
use rackwarden_verifier::{config::VerifierConfig, service::Verifier, store::Store};

use args::{Cli, Cmd, LogCmd};

/// The verifier over the configured database, with the policy and TPM enrolment settings.
fn open(cfg: &VerifierConfig) -> anyhow::Result<Verifier> {
    let store =
        Store::connect(&cfg.database).with_context(|| format!("database {}", cfg.database))?;
    Ok(Verifier::new(store, cfg.policy.clone())?.with_tpm_enrolment(cfg.tpm.clone()))
}

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The cause chain once, on one line; never a backtrace (RUST_BACKTRACE is for
            // developers, not for an operator's failed command).
            eprintln!(
                "rackwarden-verifier: {}",
                rackwarden_attest::error_chain::error_chain(e.as_ref())
            );
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // tls-init makes what `serve` will need: it runs before a config exists.
    if let Cmd::TlsInit { names, out } = &cli.cmd {
        return tls_init::run(names, out);
    }
    // An offline check needs no config: a third party runs it.
    if let Cmd::Log(LogCmd::Verify {
        checkpoint,
        key,
        tiles,
        ca,
        old,
    }) = &cli.cmd
    {
        return log_cmd::verify(checkpoint, key, tiles.as_deref(), ca.as_deref(), old);
    }
    let cfg = VerifierConfig::load(&cli.config)?;
    match cli.cmd {
        Cmd::TlsInit { .. } => Ok(()),
        Cmd::Serve => serve::run(cfg),
        Cmd::Enroll { rack, host, key } => enroll::run(&cfg, &rack, &host, &key),
        Cmd::Retire { rack, host } => retire::run(&cfg, &rack, &host),
        Cmd::Hosts { json } => hosts::run(&cfg, json),
        Cmd::Clear {
            rack,
            host,
            reason,
            by,
        } => clear::run(&cfg, &rack, &host, &by, &reason),
        Cmd::Clearances { rack, json } => clearances::run(&cfg, rack.as_deref(), json),
        Cmd::TpmEnrollments { json } => tpm_enrollments::run(&cfg, json),
        Cmd::Recheck { json } => recheck::run(&cfg, json),
        Cmd::Log(LogCmd::Vkey) => log_cmd::vkey(&cfg),
        Cmd::Log(LogCmd::Export { out }) => log_cmd::export(&cfg, &out),
        Cmd::Log(LogCmd::Verify { .. }) => Ok(()),
    }
}
