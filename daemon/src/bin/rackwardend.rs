//! rackwardend: the rack host daemon. All logic is in the `rackwarden` library.
use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use rackwarden::{
    config::Config,
    enforce::{agent, signals},
};

#[derive(Parser)]
#[command(
    version,
    about = "Keeps this rack host's frontend within its byte budget and proves it"
)]
struct Args {
    /// Configuration file.
    #[arg(long, default_value = rackwarden::config::DEFAULT_PATH)]
    config: PathBuf,
}

fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // The cause chain once, on one line, never a backtrace: this is what the journal
            // keeps of a refused start.
            log::error!("{}", rackwarden::error_chain(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> anyhow::Result<()> {
    let cfg = Config::load(&args.config)?;
    // Signals first: a SIGTERM during start must not kill us between pin and attach.
    let stop = signals::stop_on_signals();
    signals::reload_on_sighup();
    let agent = agent::Agent::start(cfg, stop).context("starting rackwardend")?;
    agent.run(stop).context("rackwardend main loop")?;
    Ok(())
}
