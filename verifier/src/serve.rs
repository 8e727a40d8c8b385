//! The accept loop. `axum::serve` bounds neither the number of connections nor the time a
//! client may take to send its request headers, so ~1,100 half-open connections made the
//! verifier unreachable. Here every connection holds one of `max_connections` permits, and
//! one that has not sent its headers within `header_timeout` is closed, freeing its permit.
//! Each request carries its peer address (`ConnectInfo`) for the per-source limits. With
//! TLS, the handshake runs inside the same header timeout, holding the same permit.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use axum::{Router, extract::ConnectInfo};
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};

#[derive(Debug, Clone, Copy)]
pub struct ConnLimits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Serves `app` on `listener` until `shutdown` resolves; over TLS when `tls` is given.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnLimits,
    tls: Option<Arc<rustls::ServerConfig>>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        // At the cap, wait for a connection to end (or time out its headers) before
        // accepting another: the kernel's backlog holds the rest meanwhile.
        let permit = tokio::select! {
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return Ok(()),
            },
            _ = &mut shutdown => return Ok(()),
        };
        let (stream, peer) = tokio::select! {
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    // EMFILE and friends: back off briefly rather than spin.
                    log::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => return Ok(()),
        };
        let svc = TowerToHyperService::new(
            app.clone()
                .layer(axum::Extension(ConnectInfo::<SocketAddr>(peer))),
        );
        let acceptor = tls.clone().map(tokio_rustls::TlsAcceptor::from);
        tokio::spawn(async move {
            let _permit = permit;
            let mut b = hyper::server::conn::http1::Builder::new();
            b.timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout);
            let served = match acceptor {
                None => b.serve_connection(TokioIo::new(stream), svc).await,
                Some(a) => {
                    let started = tokio::time::Instant::now();
                    match tokio::time::timeout(limits.header_timeout, a.accept(stream)).await {
                        Err(_) => {
                            log::debug!("connection from {peer}: no TLS handshake in time");
                            return;
                        }
                        Ok(Err(e)) => {
                            log::debug!("connection from {peer}: TLS: {e}");
                            return;
                        }
                        Ok(Ok(tls_stream)) => {
                            // What the handshake used counts against the header timeout.
                            let left = limits.header_timeout.saturating_sub(started.elapsed());
                            b.header_read_timeout(left.max(Duration::from_millis(1)));
                            b.serve_connection(TokioIo::new(tls_stream), svc).await
                        }
                    }
                }
            };
            if let Err(e) = served {
                log::debug!("connection from {peer}: {e}");
            }
        });
    }
}
