//! Writes the bundled model: `rackwarden-model bundle --out DIR [--trained-from REPO]`.
//!
//! Without `--trained-from`, the random variant (weights from the seed). With it, the trained
//! variant: next-byte training on the repository's README and `docs/*.md`. The directory
//! records what made it (`bundle.json`), and a second call with the same inputs leaves it as
//! it is: the minute of training is paid once per content.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};
use rackwarden_inference::bundled::{BUNDLED_TRAINING, Ensured, Variant, ensure, training_text};

#[derive(Parser)]
#[command(about = "The bundled model of the reference inference server")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Writes the bundled model directory (random, or trained on a repository's docs).
    Bundle {
        #[arg(long)]
        out: PathBuf,
        /// The repository whose README.md and docs/*.md to train on.
        #[arg(long = "trained-from")]
        trained_from: Option<PathBuf>,
        /// Training steps (default: the bundled plan's).
        #[arg(long)]
        steps: Option<usize>,
    },
    /// Prints a model directory's digest (what responses name and the replay looks up).
    Digest { dir: PathBuf },
}

fn main() -> Result<()> {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info")).init();
    match Cli::parse().command {
        Command::Digest { dir } => {
            let d = rackwarden_inference::files::model_digest(&dir)?;
            println!("{}", hex::encode(d));
        }
        Command::Bundle {
            out,
            trained_from,
            steps,
        } => {
            let mut plan = BUNDLED_TRAINING;
            if let Some(s) = steps {
                plan.steps = s;
            }
            let (variant, text) = match &trained_from {
                Some(root) => (Variant::Trained, training_text(root)?),
                None => (Variant::Random, Vec::new()),
            };
            let done = ensure(&out, variant, &text, &plan, |step, loss| {
                if step % 50 == 0 {
                    log::info!("step {step}: loss {loss:.3} nats/byte");
                }
            })?;
            match done {
                Ensured::UpToDate => log::info!("{} is up to date", out.display()),
                Ensured::Written { loss, seconds } => log::info!(
                    "{} written in {seconds:.1} s{}",
                    out.display(),
                    loss.map_or(String::new(), |(a, b)| format!(
                        " ({} steps on {} bytes: loss {a:.3} -> {b:.3} nats/byte)",
                        plan.steps,
                        text.len()
                    ))
                ),
            }
            println!("{}", out.display());
        }
    }
    Ok(())
}
