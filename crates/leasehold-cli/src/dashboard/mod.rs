//! `leasehold dashboard`: a local web page for one store — the live leases
//! with a countdown, grants and releases as they happen, observed hold
//! times, `/metrics` in the Prometheus text format, and (with
//! `--admin-token`) force-release.
//!
//! One page, no build step: `page.html` is plain HTML and JavaScript,
//! compiled into the binary. Live updates go out as server-sent events.
//! The store URL is shown with its credentials removed; nothing else about
//! the connection reaches the page.

pub(crate) mod prom;
mod watch;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::{ConnectInfo, State as Extract};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use clap::Args;
use leasehold::Locks;
use serde::Deserialize;
use tokio::sync::broadcast;

use crate::exit::CliError;
use watch::State;

#[derive(Debug, Args)]
pub struct DashboardArgs {
    /// Address to serve on; a port of 0 picks a free one (printed)
    #[arg(long, default_value = "127.0.0.1:7878")]
    pub listen: SocketAddr,
    /// Serve on a non-loopback address too (the page shows every holder)
    #[arg(long)]
    pub allow_remote: bool,
    /// Enables force-release from the page for whoever presents this token
    #[arg(long, env = "LEASEHOLD_ADMIN_TOKEN", hide_env_values = true)]
    pub admin_token: Option<String>,
    /// Longest time between two listings of the store (50ms..=10s); a
    /// release the store announces is listed at once
    #[arg(long, default_value = "250ms", value_parser = crate::parse_duration)]
    pub poll: Duration,
    /// Only keys starting with this prefix
    #[arg(long, default_value = "")]
    pub prefix: String,
}

const PAGE: &str = include_str!("page.html");

/// What the handlers share.
struct App {
    locks: Locks,
    /// The store URL without credentials: all the page learns of it.
    store: String,
    /// The URL as given, only to remove its secrets from error messages.
    store_raw: String,
    state: Arc<Mutex<State>>,
    events: broadcast::Sender<String>,
    admin_token: Option<String>,
    /// Check the `Host` header: served on loopback, only a loopback name
    /// may reach the page (a DNS-rebinding site cannot).
    loopback: bool,
    poll: Duration,
}

pub async fn dashboard(store: &str, args: DashboardArgs) -> Result<u8, CliError> {
    leasehold::validate_prefix(&args.prefix)?;
    if !(Duration::from_millis(50)..=Duration::from_secs(10)).contains(&args.poll) {
        return Err(CliError::usage("--poll must be between 50ms and 10s"));
    }
    let loopback = args.listen.ip().is_loopback();
    if !loopback && !args.allow_remote {
        return Err(CliError::usage(format!(
            "{} is not a loopback address; the page shows every holder and token: \
             pass --allow-remote to serve it there",
            args.listen
        )));
    }
    if args.admin_token.as_deref().is_some_and(|t| t.len() < 8) {
        return Err(CliError::usage(
            "--admin-token must be at least 8 characters",
        ));
    }
    let locks = Locks::open(store).await?;
    let state = Arc::new(Mutex::new(State::default()));
    let (events, _) = broadcast::channel(1024);
    let watcher = tokio::spawn(watch::watch(
        locks.clone(),
        store.to_owned(),
        args.prefix.clone(),
        args.poll,
        state.clone(),
        events.clone(),
    ));
    let app = Arc::new(App {
        locks,
        store: leasehold::redact_url(store),
        store_raw: store.to_owned(),
        state,
        events,
        admin_token: args.admin_token,
        loopback,
        poll: args.poll,
    });
    let router = Router::new()
        .route("/", get(page))
        .route("/api/info", get(info))
        .route("/api/leases", get(leases))
        .route("/api/holds", get(holds))
        .route("/api/release", post(release))
        .route("/events", get(events_stream))
        .route("/metrics", get(metrics))
        .with_state(app.clone());
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| CliError::usage(format!("cannot listen on {}: {e}", args.listen)))?;
    let addr = listener
        .local_addr()
        .map_err(|e| CliError::new(crate::EX_INTERNAL, e.to_string()))?;
    println!("dashboard for {} on http://{addr}/", app.store);
    let served = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await;
    watcher.abort();
    served.map_err(|e| CliError::new(crate::EX_INTERNAL, e.to_string()))?;
    Ok(0)
}

/// Refuses a request whose `Host` is not a loopback name while served on
/// loopback.
fn host_refused(app: &App, headers: &HeaderMap) -> Option<Response> {
    loopback_host_refused(app.loopback, headers)
}

/// [`host_refused`] for any server of the CLI: `loopback` when served on a
/// loopback address.
pub(crate) fn loopback_host_refused(loopback: bool, headers: &HeaderMap) -> Option<Response> {
    if !loopback {
        return None;
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.split(':').next().unwrap_or(""),
    };
    if matches!(name, "localhost" | "::1") || name.starts_with("127.") {
        None
    } else {
        Some((StatusCode::FORBIDDEN, "served on loopback only").into_response())
    }
}

type Shared = Extract<Arc<App>>;

async fn page(Extract(app): Shared, headers: HeaderMap) -> Response {
    if let Some(refused) = host_refused(&app, &headers) {
        return refused;
    }
    ([(header::CACHE_CONTROL, "no-store")], Html(PAGE)).into_response()
}

async fn info(Extract(app): Shared, headers: HeaderMap) -> Response {
    if let Some(refused) = host_refused(&app, &headers) {
        return refused;
    }
    Json(serde_json::json!({
        "store": app.store,
        "admin": app.admin_token.is_some(),
        "poll_ms": app.poll.as_millis() as u64,
    }))
    .into_response()
}

async fn leases(Extract(app): Shared, headers: HeaderMap) -> Response {
    if let Some(refused) = host_refused(&app, &headers) {
        return refused;
    }
    let json = watch::snapshot_json(&app.state.lock().unwrap_or_else(|p| p.into_inner()));
    ([(header::CONTENT_TYPE, "application/json")], json).into_response()
}

async fn holds(Extract(app): Shared, headers: HeaderMap) -> Response {
    if let Some(refused) = host_refused(&app, &headers) {
        return refused;
    }
    let st = app.state.lock().unwrap_or_else(|p| p.into_inner());
    let holds: Vec<[u64; 2]> = st.holds.iter().map(|&(at, ms)| [at, ms]).collect();
    Json(serde_json::json!({ "now_ms": watch::unix_ms(), "holds": holds })).into_response()
}

async fn metrics(Extract(app): Shared, headers: HeaderMap) -> Response {
    if let Some(refused) = host_refused(&app, &headers) {
        return refused;
    }
    let text = prom::render(&app.state.lock().unwrap_or_else(|p| p.into_inner()));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

async fn events_stream(Extract(app): Shared, headers: HeaderMap) -> Response {
    if let Some(refused) = host_refused(&app, &headers) {
        return refused;
    }
    let first = watch::snapshot_json(&app.state.lock().unwrap_or_else(|p| p.into_inner()));
    let receiver = app.events.subscribe();
    let start = futures_util::stream::once(async move {
        Ok::<_, std::convert::Infallible>(SseEvent::default().event("leases").data(first))
    });
    let rest = futures_util::stream::unfold(receiver, |mut rx| async move {
        loop {
            match rx.recv().await {
                Ok(message) => {
                    let (name, data) = message.split_once('\n').unwrap_or(("leases", &message));
                    let event = SseEvent::default().event(name).data(data);
                    return Some((Ok(event), rx));
                }
                // A slow page missed some: the next snapshot catches it up.
                Err(broadcast::error::RecvError::Lagged(_)) => continue,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    });
    use futures_util::StreamExt;
    Sse::new(start.chain(rest))
        .keep_alive(KeepAlive::default())
        .into_response()
}

#[derive(Debug, Deserialize)]
struct ReleaseBody {
    key: String,
    /// The key typed again: the page's confirmation.
    confirm: String,
}

/// Whether `given` is `expected`, in time that does not depend on where
/// they differ.
fn same_token(given: &str, expected: &str) -> bool {
    given.len() == expected.len()
        && given
            .bytes()
            .zip(expected.bytes())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
}

async fn release(
    Extract(app): Shared,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Json(body): Json<ReleaseBody>,
) -> Response {
    if let Some(refused) = host_refused(&app, &headers) {
        return refused;
    }
    let refuse = |status: StatusCode, why: &str| {
        eprintln!(
            "dashboard: refused force-release of {:?} from {peer}: {why}",
            body.key
        );
        (status, Json(serde_json::json!({ "error": why }))).into_response()
    };
    let Some(expected) = app.admin_token.as_deref() else {
        return refuse(
            StatusCode::FORBIDDEN,
            "force-release is off: start the dashboard with --admin-token",
        );
    };
    let given = headers
        .get("x-admin-token")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    if !same_token(given, expected) {
        return refuse(StatusCode::UNAUTHORIZED, "wrong or missing admin token");
    }
    if body.confirm != body.key {
        return refuse(
            StatusCode::BAD_REQUEST,
            "the confirmation does not name the key",
        );
    }
    match app.locks.force_release(&body.key).await {
        Ok(broken) => {
            eprintln!(
                "dashboard: force-release of {:?} from {peer}: {}",
                body.key,
                if broken {
                    "broke a live lease"
                } else {
                    "was not held"
                }
            );
            tracing::warn!(key = %body.key, %peer, broken, "force-release from the dashboard");
            Json(serde_json::json!({ "broken": broken })).into_response()
        }
        Err(e) => {
            let status = if matches!(e, leasehold::Error::InvalidInput { .. }) {
                StatusCode::BAD_REQUEST
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            };
            let why = leasehold::redact_secrets(&e.to_string(), &app.store_raw);
            refuse(status, &why)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::same_token;

    #[test]
    fn tokens_compare_whole() {
        assert!(same_token("s3cret-token", "s3cret-token"));
        assert!(!same_token("s3cret-toke", "s3cret-token"));
        assert!(!same_token("s3cret-tokeN", "s3cret-token"));
        assert!(!same_token("", "s3cret-token"));
    }
}
