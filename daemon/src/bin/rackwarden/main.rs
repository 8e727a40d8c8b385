//! rackwarden: the operator's command line. Each subcommand lives in its own module and only
//! parses, calls the `rackwarden` library and prints.

mod args;
mod budget;
mod evidence;
mod image;
mod operate;
mod wipe;

use clap::Parser;

use args::{CapCmd, Cli, Cmd};

fn main() -> anyhow::Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = Cli::parse();
    match &cli.cmd {
        Cmd::Status { json } => operate::status(&cli, *json)?,
        Cmd::Cap {
            cmd:
                CapCmd::Set {
                    egress,
                    ingress,
                    persist,
                    json,
                },
        } => operate::cap_set(&cli, egress.clone(), ingress.clone(), *persist, *json)?,
        Cmd::WipeNow => operate::wipe_now(&cli)?,
        Cmd::Keygen { out, name } => evidence::keygen(out, name)?,
        Cmd::Attest { key, log, nonce } => evidence::attest(&cli.config, key, log, *nonce)?,
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
            std::process::exit(code);
        }
        Cmd::Budget(a) => budget::budget_cmd(a)?,
        Cmd::Image { cmd } => image::image_cmd(cmd)?,
        Cmd::Manifest { cmd } => image::manifest_cmd(cmd)?,
        Cmd::CheckConfig { json } => operate::check_config(&cli.config, *json)?,
    }
    Ok(())
}
