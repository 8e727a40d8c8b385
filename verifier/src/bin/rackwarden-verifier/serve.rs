//! `rackwarden-verifier serve`: the HTTP API and the auditor's pages, until SIGINT.

use std::sync::Arc;

use anyhow::Context as _;
use rackwarden_verifier::{
    api,
    config::{Transport, VerifierConfig},
    log_key,
    serve::{self as http, ConnLimits},
    tls,
};

use crate::open;

pub fn run(cfg: VerifierConfig) -> anyhow::Result<()> {
    let tls = match &cfg.transport {
        Transport::Tls { cert, key } => Some(tls::server_config(cert, &key.path()?)?),
        Transport::InsecureHttp => {
            log::warn!(
                "plain HTTP on {} (insecure_http = true, loopback only)",
                cfg.listen
            );
            None
        }
    };
    let signer = log_key::open_or_create(&cfg.log_key, &cfg.log_origin)?;
    log::info!(
        "transparency log `{}`: key {}",
        cfg.log_origin,
        log_key::vkey_path(&cfg.log_key).display()
    );
    let verifier = open(&cfg)?;
    // Instances on one database share one log: each must sign it with the same key and
    // origin, or hosts could not check half of its checkpoints. Fail closed at start.
    let vkey = signer.verifier().vkey();
    if let Some(recorded) = verifier.store.claim_log_key(&vkey)? {
        anyhow::bail!(
            "the database's transparency log is signed with {recorded}, and this instance's log key ({}) and origin (`{}`) give {vkey}: give every instance on one database the same `log_key` file and `log_origin`",
            cfg.log_key.display(),
            cfg.log_origin
        );
    }
    let state = Arc::new(api::AppState::new(verifier.with_log(signer)));
    // The last reference to the state (and its database connection) is dropped here, after
    // the runtime: a PostgreSQL connection closes by blocking on its own runtime, which it
    // may not do from inside another.
    let kept = state.clone();
    let rt = tokio::runtime::Runtime::new()?;
    let served = rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(cfg.listen)
            .await
            .with_context(|| format!("listen on {}", cfg.listen))?;
        log::info!(
            "listening on {}://{} (policy {})",
            if tls.is_some() { "https" } else { "http" },
            listener.local_addr()?,
            cfg.policy.id
        );
        http::serve(
            listener,
            api::router(
                state,
                api::BodyLimits {
                    max_body: cfg.max_body_bytes,
                    max_openings_body: cfg.max_openings_body_bytes,
                },
                cfg.request_timeout,
            ),
            ConnLimits {
                max_connections: cfg.max_connections,
                header_timeout: cfg.header_timeout,
            },
            tls,
            // SIGTERM (systemctl stop) as SIGINT: stop accepting and exit 0 at once, rather
            // than die by the signal.
            async {
                match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                    Ok(mut term) => {
                        tokio::select! {
                            _ = tokio::signal::ctrl_c() => {}
                            _ = term.recv() => {}
                        }
                    }
                    Err(e) => {
                        log::warn!("cannot watch for SIGTERM ({e}): only SIGINT stops cleanly");
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
                log::info!("stopping: no new connections");
            },
        )
        .await?;
        anyhow::Ok(())
    });
    drop(rt);
    drop(kept);
    served
}
