//! rackwarden: the operator's command line. Each subcommand lives in its own module and only
//! parses, calls the `rackwarden` library and prints.

mod args;
mod boot;
mod budget;
mod evidence;
mod image;
mod log_cmd;
mod operate;
mod wipe;

use std::process::ExitCode;

use clap::Parser;

use args::{CapCmd, Cli, Cmd, LogCmd};

fn main() -> ExitCode {
    // `rackwarden verify ... | head`: a reader that goes away ends us quietly, as it does any
    // Unix filter, instead of a panic in println!. The default disposition is restored
    // because Rust's runtime ignores SIGPIPE.
    // SAFETY: signal(2) with SIG_DFL installs no handler; called before any thread starts.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    // Usage errors exit 2 from clap itself.
    let cmd = Cli::parse().command_with_flags();
    match run(&cmd) {
        Ok(code) => code,
        Err(e) => {
            // The cause chain once, on one line; never a backtrace (RUST_BACKTRACE is for
            // developers, not for an operator's failed command).
            eprintln!("rackwarden: {}", rackwarden::error_chain(e.as_ref()));
            ExitCode::FAILURE
        }
    }
}

fn run(cmd: &Cmd) -> anyhow::Result<ExitCode> {
    match cmd {
        Cmd::Status { daemon, json } => operate::status(daemon, *json)?,
        Cmd::Cap {
            cmd:
                CapCmd::Set {
                    daemon,
                    egress,
                    ingress,
                    persist,
                    force,
                    json,
                },
        } => operate::cap_set(
            daemon,
            egress.clone(),
            ingress.clone(),
            *persist,
            *force,
            *json,
        )?,
        Cmd::WipeNow { daemon } => operate::wipe_now(daemon)?,
        Cmd::Keygen { out, name, rotate } => evidence::keygen(out, name, *rotate)?,
        Cmd::Attest {
            config,
            key,
            log,
            nonce,
        } => evidence::attest(&config.path(), key, log, *nonce)?,
        Cmd::Verify { key, log, json } => evidence::verify(key, log, *json)?,
        Cmd::Wipe {
            backend,
            max_bytes,
            nonce,
            reserve,
            scratch,
            json,
        } => {
            let code = wipe::wipe_cmd(backend, *max_bytes, *nonce, *reserve, scratch, *json)?;
            return Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)));
        }
        Cmd::Storage { json } => {
            let residue = wipe::storage_cmd(*json)?;
            if residue > 0 {
                return Ok(ExitCode::from(1));
            }
        }
        Cmd::Budget(a) => budget::budget_cmd(a)?,
        Cmd::Image { cmd } => image::image_cmd(cmd)?,
        Cmd::Manifest { cmd } => image::manifest_cmd(cmd)?,
        Cmd::CheckConfig {
            config,
            verifier_config,
            json,
        } => operate::check_config(&config.path(), verifier_config.as_deref(), *json)?,
        Cmd::BootReference {
            event_log,
            cmdline,
            kernel,
        } => boot::reference(event_log, cmdline, kernel)?,
        Cmd::Log {
            cmd:
                LogCmd::Verify {
                    config,
                    key,
                    checkpoint,
                    tiles,
                    json,
                },
        } => log_cmd::verify(
            &config.path(),
            key.as_deref(),
            checkpoint.as_deref(),
            tiles.as_deref(),
            *json,
        )?,
    }
    Ok(ExitCode::SUCCESS)
}
