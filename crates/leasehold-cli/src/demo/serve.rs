//! `demo --metrics-addr`: `/metrics` for the demo's own work. Each worker
//! process exports the library's metrics with a Prometheus recorder and
//! sends its exposition to the parent after every order; a scrape gets
//! the latest of every worker (of every strategy so far), summed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, HeaderMap};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::dashboard::{loopback_host_refused, prom};
use crate::exit::CliError;

/// The latest exposition of each worker, by worker name.
type Latest = Arc<Mutex<BTreeMap<String, String>>>;

/// The served metrics: where the workers' reports go.
pub struct Exported {
    latest: Latest,
}

/// One worker's slot in [`Exported`].
pub struct WorkerMetrics {
    name: String,
    latest: Latest,
}

impl Exported {
    pub fn worker(&self, name: String) -> WorkerMetrics {
        WorkerMetrics {
            name,
            latest: self.latest.clone(),
        }
    }
}

impl WorkerMetrics {
    /// The worker's exposition now (its totals so far).
    pub fn update(&self, exposition: String) {
        self.latest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(self.name.clone(), exposition);
    }
}

/// Serves `/metrics` on `addr` (loopback only: the labels name the demo's
/// lock classes, nothing secret, but the dashboard's rule holds for every
/// server of the CLI) until the process ends.
pub async fn serve(addr: SocketAddr) -> Result<Exported, CliError> {
    if !addr.ip().is_loopback() {
        return Err(CliError::usage(format!(
            "--metrics-addr {addr} is not a loopback address"
        )));
    }
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| CliError::usage(format!("cannot listen on {addr}: {e}")))?;
    let bound = listener
        .local_addr()
        .map_err(|e| CliError::new(crate::EX_INTERNAL, e.to_string()))?;
    let latest = Latest::default();
    let router = Router::new()
        .route("/metrics", get(metrics))
        .with_state(latest.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            eprintln!("leasehold: demo metrics server stopped: {e}");
        }
    });
    eprintln!("leasehold: demo metrics on http://{bound}/metrics");
    Ok(Exported { latest })
}

async fn metrics(State(latest): State<Latest>, headers: HeaderMap) -> Response {
    if let Some(refused) = loopback_host_refused(true, &headers) {
        return refused;
    }
    let text = {
        let latest = latest.lock().unwrap_or_else(|p| p.into_inner());
        prom::merge(latest.values().map(String::as_str))
    };
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}
