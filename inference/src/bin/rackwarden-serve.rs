//! The reference inference server: `rackwarden-serve --model DIR --listen ADDR`.
//!
//! Serves `POST /v1/completions` from one model directory, each request seeded from the
//! daemon's `sampling-key.json`, each response canonical (see the `protocol` module).

use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use candle_core::DType;
use clap::Parser;
use rackwarden_inference::files::LoadedModel;
use rackwarden_inference::serve::{ServeConfig, serve};

#[derive(Parser)]
#[command(about = "Serves a model with the verifiable sampler")]
struct Cli {
    /// The model directory: config.json, tokenizer.json, model.safetensors.
    #[arg(long)]
    model: PathBuf,
    /// The name requests give in `model` (default: the directory's name).
    #[arg(long)]
    name: Option<String>,
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: String,
    /// The daemon's sampling key file.
    #[arg(long, default_value = "/run/rackwarden/sampling-key.json")]
    key_file: PathBuf,
}

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    let cli = Cli::parse();
    let model = LoadedModel::open(&cli.model, DType::F32)
        .with_context(|| format!("loading {}", cli.model.display()))?;
    let name = match cli.name {
        Some(n) => n,
        None => cli
            .model
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .context("the model directory has no name: give --name")?,
    };
    let listener =
        TcpListener::bind(&cli.listen).with_context(|| format!("binding {}", cli.listen))?;
    log::info!(
        "serving {name} (model {}) on {}",
        hex::encode(model.digest),
        listener.local_addr()?
    );
    serve(
        listener,
        Arc::new(model),
        ServeConfig {
            model_name: name,
            key_file: cli.key_file,
        },
    )?;
    Ok(())
}
