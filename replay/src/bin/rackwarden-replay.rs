//! `rackwarden-replay --database URL --model NAME=DIR [--model ...] [--once]`: the verifier's
//! replay service. Replays every matched openings the verifier stored and has not replayed,
//! then (without `--once`) keeps polling.

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use candle_core::DType;
use clap::Parser;
use rackwarden_inference::files::LoadedModel;
use rackwarden_inference::replay::ReplayModels;
use rackwarden_replay::run_once;
use rackwarden_verifier::store::{DatabaseUrl, Store};

#[derive(Parser)]
#[command(about = "Replays opened exchanges with the precommitted models")]
struct Cli {
    /// The verifier's database (a SQLite path or a postgres:// URL), as in its config.
    #[arg(long)]
    database: String,
    /// A model the racks serve: the name requests give, and the verifier's own copy of its
    /// directory (config.json, tokenizer.json, model.safetensors). Repeatable.
    #[arg(long = "model", value_name = "NAME=DIR", required = true)]
    models: Vec<String>,
    /// The precision the replay runs in: f64 (default) or f32.
    #[arg(long, default_value = "f64")]
    precision: String,
    /// Replay what is pending and exit.
    #[arg(long)]
    once: bool,
    /// How often to look for new openings.
    #[arg(long, default_value_t = 5)]
    interval_secs: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let dtype = match cli.precision.as_str() {
        "f64" => DType::F64,
        "f32" => DType::F32,
        other => bail!("--precision {other}: use f64 or f32"),
    };
    let mut models = Vec::new();
    for m in &cli.models {
        let Some((name, dir)) = m.split_once('=') else {
            bail!("--model {m}: write NAME=DIR");
        };
        let dir = PathBuf::from(dir);
        let model = LoadedModel::open(&dir, dtype)
            .with_context(|| format!("--model {m}: loading {}", dir.display()))?;
        log::info!(
            "replaying {name} with {} (model digest {}): its three files must be the images the racks' signed manifest names",
            dir.display(),
            hex::encode(model.digest)
        );
        models.push((name.to_string(), model));
    }
    let models = ReplayModels { models };
    let url = DatabaseUrl::parse(&cli.database);
    let store = Store::connect(&url).context("opening the verifier's database")?;
    let mut damaged = rackwarden_replay::Damaged::new();
    loop {
        let n = run_once(&store, &models, 64, now_ms, &mut damaged)?;
        if cli.once {
            log::info!("{n} epochs replayed");
            return Ok(());
        }
        if n == 0 {
            std::thread::sleep(Duration::from_secs(cli.interval_secs));
        }
    }
}
