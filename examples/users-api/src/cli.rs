//! Command line: where the locks and the data live, how creates are guarded.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use leasehold::http::Mode;
use leasehold::{redact_url, Locks};

use crate::{app, db, AppState, LockSettings};

/// Serve the example users API: creates run under a leasehold lock.
#[derive(Debug, Parser)]
#[command(version)]
pub struct Cli {
    /// Lock store URL: sqlite://PATH, memory://, redis://..., mongodb://...
    /// (any store compiled into leasehold). Default: locks.db in the state dir.
    #[arg(long)]
    pub store: Option<String>,
    /// Where the users and the counter live: a SQLite file path, or a
    /// mongodb://HOST/DB URL (collections `users` and `counters`; DB default
    /// `users_api`). Default: users.db in the state dir.
    #[arg(long)]
    pub data: Option<String>,
    /// Where the state files go by default.
    #[arg(long, default_value_os_t = std::env::temp_dir().join("leasehold-users-api"))]
    pub state_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,
    /// Wait up to this long for the users lock (e.g. 2s); without it a busy
    /// lock answers 409 at once.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub wait: Option<Duration>,
    /// Lease length; renewed while a create runs.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    pub ttl: Duration,
    /// Pause inside each create between the check and the insert, to make
    /// the lock visible by hand (e.g. 3s).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub step_delay: Duration,
    /// Serve without the lock layer (the racy hand-written baseline).
    #[arg(long)]
    pub no_lock: bool,
}

/// Opens the stores and serves until Ctrl-C.
///
/// # Errors
/// A store cannot be opened, a setting is out of range, or the address
/// cannot be bound.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    if cli.store.is_none() || cli.data.is_none() {
        // The default files go in the state dir, which a fresh machine
        // lacks; leasehold creates no directory for a lock store.
        std::fs::create_dir_all(&cli.state_dir)
            .with_context(|| format!("creating state dir {}", cli.state_dir.display()))?;
    }
    let store = cli
        .store
        .clone()
        .unwrap_or_else(|| format!("sqlite://{}", cli.state_dir.join("locks.db").display()));
    let data = cli
        .data
        .clone()
        .unwrap_or_else(|| cli.state_dir.join("users.db").display().to_string());
    let locks = Locks::open(&store)
        .await
        .with_context(|| format!("opening lock store {}", redact_url(&store)))?;
    let users = db::open(&data)
        .await
        .map_err(|e| anyhow::anyhow!(e))
        .with_context(|| format!("opening users database {}", redact_url(&data)))?;
    let lock = (!cli.no_lock).then_some(LockSettings {
        ttl: cli.ttl,
        mode: cli.wait.map_or(Mode::Reject, Mode::Wait),
    });
    let state = AppState {
        users,
        step_delay: cli.step_delay,
    };
    let router = app(state, locks, lock)?;
    let listener = tokio::net::TcpListener::bind(cli.listen)
        .await
        .with_context(|| format!("binding {}", cli.listen))?;
    // The URLs may carry passwords: logged redacted.
    tracing::info!(
        listen = %cli.listen,
        store = %redact_url(&store),
        data = %redact_url(&data),
        "serving"
    );
    axum::serve(listener, router)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
