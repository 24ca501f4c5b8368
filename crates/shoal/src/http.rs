//! The HTTP port of `shoal broker`, `shoal namesrv` and `shoal dev`: Prometheus metrics at
//! `/metrics`, and (where a broker runs) the dashboard and its JSON API (see `dashboard`),
//! behind sign-in when ACL is on (`http_auth`), over TLS when asked (`http_listener`).

use crate::http_access::Peer;
use crate::http_listener::HttpListener;
pub(crate) use crate::http_state::HttpState;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::task::JoinHandle;
use tokio_util_shutdown::Shutdown;

/// A running HTTP server; stops when dropped or by [`HttpServer::shutdown`].
#[derive(Debug)]
pub(crate) struct HttpServer {
    addr: SocketAddr,
    stop: Shutdown,
    task: Option<JoinHandle<()>>,
    admin: Option<Arc<shoal_client::AdminClient>>,
}

impl HttpServer {
    /// Binds `addr` and serves `state` over plain HTTP.
    pub(crate) async fn start(addr: &str, state: HttpState) -> anyhow::Result<HttpServer> {
        Self::start_with_tls(addr, state, shoal_net::ServerTls::disabled()).await
    }

    /// Binds `addr` and serves `state` in `tls`'s mode (HTTP, HTTPS or both).
    pub(crate) async fn start_with_tls(
        addr: &str,
        state: HttpState,
        tls: shoal_net::ServerTls,
    ) -> anyhow::Result<HttpServer> {
        let tcp = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("HTTP port {addr}: {e}"))?;
        let bound = tcp.local_addr()?;
        let mode = tls.mode();
        let listener = HttpListener::new(tcp, tls)?;
        let admin = state.admin.clone();
        let app = router(state).into_make_service_with_connect_info::<Peer>();
        let stop = Shutdown::default();
        let wait = stop.clone();
        let task = tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { wait.wait().await })
                .await;
            if let Err(e) = served {
                tracing::warn!(error = %e, "HTTP server failed");
            }
        });
        tracing::info!(addr = %bound, tls = %mode, "HTTP (metrics, dashboard) listening");
        Ok(HttpServer {
            addr: bound,
            stop,
            task: Some(task),
            admin,
        })
    }

    /// The bound address.
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving (open requests finish) and waits.
    pub(crate) async fn shutdown(mut self) {
        self.stop.trigger();
        if let Some(a) = &self.admin {
            a.shutdown();
        }
        if let Some(t) = self.task.take() {
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop.trigger();
    }
}

fn router(state: HttpState) -> Router {
    let r = Router::new().route("/metrics", get(metrics));
    let r = if state.broker.is_some() {
        crate::dashboard::routes(r)
            .route(
                "/api/session",
                get(crate::http_auth::session).post(crate::http_auth::sign_in),
            )
            .route("/api/session/end", post(crate::http_auth::sign_out))
    } else {
        r.route("/", get(no_dashboard))
    };
    r.layer(axum::middleware::from_fn_with_state(
        state.clone(),
        crate::http_auth::guard,
    ))
    .with_state(state)
}

async fn no_dashboard() -> &'static str {
    "Shoal: Prometheus metrics at /metrics (brokers and shoal dev serve the dashboard)\n"
}

/// `/metrics`: every registry of the process, in the Prometheus text format, or OpenMetrics
/// when the scraper asks for it.
async fn metrics(
    axum::extract::State(state): axum::extract::State<HttpState>,
    headers: HeaderMap,
) -> Response {
    let openmetrics = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/openmetrics-text"));
    let registries: Vec<Arc<shoal_metrics::Metrics>> = state
        .broker
        .iter()
        .map(|b| b.metrics())
        .chain(state.namesrv.iter().map(|n| n.metrics().registry.clone()))
        .chain(state.broker.is_some().then(|| state.access.registry()))
        .chain(state.registries.iter().cloned())
        .collect();
    // Collectors read store offsets and tables: off the async threads.
    let body = tokio::task::spawn_blocking(move || {
        let mut out = String::new();
        for r in &registries {
            if openmetrics {
                out.push_str(&r.encode_openmetrics());
            } else {
                out.push_str(&r.encode_text());
            }
        }
        if openmetrics {
            shoal_metrics::openmetrics_eof(&mut out);
        }
        out
    })
    .await;
    match body {
        Ok(body) => (
            [(
                header::CONTENT_TYPE,
                if openmetrics {
                    shoal_metrics::OPENMETRICS_CONTENT_TYPE
                } else {
                    shoal_metrics::TEXT_CONTENT_TYPE
                },
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// A one-shot shutdown signal shared by clones.
mod tokio_util_shutdown {
    use std::sync::Arc;
    use tokio::sync::watch;

    #[derive(Debug, Clone)]
    pub(super) struct Shutdown {
        tx: Arc<watch::Sender<bool>>,
    }

    impl Default for Shutdown {
        fn default() -> Self {
            Self {
                tx: Arc::new(watch::channel(false).0),
            }
        }
    }

    impl Shutdown {
        pub(super) fn trigger(&self) {
            self.tx.send_replace(true);
        }

        pub(super) async fn wait(&self) {
            let mut rx = self.tx.subscribe();
            let _ = rx.wait_for(|v| *v).await;
        }
    }
}
