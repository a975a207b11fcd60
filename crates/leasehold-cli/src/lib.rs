//! The `leasehold` command: run a command under a lock, inspect and break
//! locks, and the inventory demo. `main.rs` only parses and exits; everything
//! here is testable.

mod admin;
mod bench;
mod connections;
mod dashboard;
mod demo;
mod exit;
mod redacted_stderr;
mod run;
mod sql;
mod torture;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

pub use exit::{
    CliError, EX_INCONCLUSIVE, EX_INTERNAL, EX_LOST, EX_TEMPFAIL, EX_UNAVAILABLE, EX_USAGE,
    EX_VIOLATION,
};

const EXIT_CODES: &str = "\
Exit codes:
  0   success (for `run`: the command's own exit code is passed through)
  1   torture: the checker found a violation
  2   torture: inconclusive (a requested fault kind never landed on a holder, no
      lease was renewed, or pauses caused no fenced rejection or overlap)
  64  invalid usage or input (bad key, ttl, duration, store URL, arguments)
  69  store unreachable or failing
  70  lease lost while `run` was running the command (the command was stopped)
  71  internal failure (the runtime or a process could not be started)
  75  lock not acquired within --wait (or busy, without --wait, or its grant
      arrived already expired)
  129 SIGHUP, 130 SIGINT, 131 SIGQUIT, 143 SIGTERM while waiting for the lock

Durations: 250ms, 30s, 2m, 1h (also combined: 1m30s).
Set RUST_LOG (e.g. RUST_LOG=leasehold=debug) or pass -v for tracing output.";

/// Distributed lease locks with fencing tokens, on the database you already run.
#[derive(Debug, Parser)]
#[command(name = "leasehold", version, after_help = EXIT_CODES)]
pub struct Cli {
    /// Lock store URL: sqlite://PATH, postgres://..., redis://HOST[:PORT][/DB][?prefix=NAME], redis+cluster://HOST:PORT,..., mongodb://HOST[:PORT]/DB, etcd://HOST:PORT[,HOST:PORT...], memory://
    #[arg(long, env = "LEASEHOLD_STORE", global = true, default_value_t = default_store_url())]
    pub store: String,

    /// More log output (-v debug, -vv trace); RUST_LOG overrides
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,

    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command while holding a lock; exit with its exit code
    Run(run::RunArgs),
    /// Kills a command's process group if its `run` dies (started by `run`)
    #[command(hide = true)]
    RunWatchdog(run::WatchdogArgs),
    /// Show who holds a lock
    Status(admin::StatusArgs),
    /// List held locks
    List(admin::ListArgs),
    /// Break a lock (admin): frees it and bumps its fencing token
    Release(admin::ReleaseArgs),
    /// A local web page for the store: live leases, grants and releases, /metrics
    Dashboard(dashboard::DashboardArgs),
    /// Inventory demo: worker processes buying the last items, per strategy
    Demo(demo::DemoArgs),
    /// One demo worker process (started by `demo`)
    #[command(hide = true)]
    DemoWorker(demo::WorkerArgs),
    /// Measure a store: leasehold next to the store's raw baseline
    Bench(bench::BenchArgs),
    /// One bench worker process (started by `bench --processes`)
    #[command(hide = true)]
    BenchWorker(bench::BenchWorkerArgs),
    /// Fault-injection checker: workers, a fenced resource, a nemesis, a verdict
    Torture(torture::TortureArgs),
    /// One torture worker process (started by `torture`)
    #[command(hide = true)]
    TortureWorker(torture::WorkerArgs),
}

/// Options shared by commands that acquire.
#[derive(Debug, Args, Clone)]
pub struct LeaseArgs {
    /// Lease length; renewed every ttl/3 while held (100ms..=24h)
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,
    /// How long to wait for a busy lock (0 = try once)
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub wait: Duration,
    /// Wait in the key's queue at the store, first come, first served
    /// across processes, and be handed the key at a release (stores that
    /// keep queues: memory, SQLite, PostgreSQL, Redis, MongoDB, etcd; see
    /// docs/fairness.md)
    #[arg(long)]
    pub fair: bool,
}

/// Parses `250ms`, `30s`, `2m`, `1h`, `1m30s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim())
        .map_err(|e| format!("{e}; expected a duration such as 250ms, 30s, 2m or 1h"))
}

/// `sqlite://` under `$XDG_STATE_HOME/leasehold/`, else
/// `~/.local/state/leasehold/`, else the current directory.
pub fn default_store_url() -> String {
    let state_dir = std::env::var_os("XDG_STATE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|h| !h.is_empty())
                .map(|h| PathBuf::from(h).join(".local/state"))
        })
        .unwrap_or_else(|| PathBuf::from("."));
    format!(
        "sqlite://{}",
        state_dir.join("leasehold").join("locks.db").display()
    )
}

/// Creates the directory of the default store, which does not exist on a
/// fresh machine. The library creates no directory (a mistyped path would
/// quietly be a second lock database), so the default is the CLI's to make.
fn create_default_state_dir(store: &str) -> Result<(), CliError> {
    if store != default_store_url() {
        return Ok(());
    }
    let path = PathBuf::from(store.trim_start_matches("sqlite://"));
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(dir) => std::fs::create_dir_all(dir).map_err(|e| {
            CliError::new(
                exit::EX_UNAVAILABLE,
                format!("cannot create the state directory {}: {e}", dir.display()),
            )
        }),
        None => Ok(()),
    }
}

/// Parses the arguments and runs; what `main` calls.
pub fn main_with_args(args: impl IntoIterator<Item = std::ffi::OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    if let Command::RunWatchdog(args) = &cli.command {
        // Synchronous and tiny: no runtime, no logging.
        return ExitCode::from(run::watchdog(args));
    }
    let stderr = redacted_stderr::RedactedStderr::new(&cli.store);
    init_tracing(cli.verbose, stderr.clone());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            run::report(&format!("cannot start the async runtime: {e}"));
            return ExitCode::from(exit::EX_INTERNAL);
        }
    };
    match runtime.block_on(execute(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            run::report(&stderr.redact(&e.to_string()));
            ExitCode::from(e.code)
        }
    }
}

async fn execute(cli: Cli) -> Result<u8, CliError> {
    create_default_state_dir(&cli.store)?;
    match cli.command {
        Command::Run(args) => run::run(&cli.store, args).await,
        Command::RunWatchdog(args) => Ok(run::watchdog(&args)),
        Command::Status(args) => admin::status(&cli.store, args).await,
        Command::List(args) => admin::list(&cli.store, args).await,
        Command::Release(args) => admin::release(&cli.store, args).await,
        Command::Dashboard(args) => dashboard::dashboard(&cli.store, args).await,
        Command::Demo(args) => demo::demo(&cli.store, args).await,
        Command::DemoWorker(args) => demo::worker(&cli.store, args).await,
        // As a task of the runtime, the way an application calls the
        // library (a request handler is a task): a future driven by
        // `block_on` from the main thread is woken across threads by the
        // worker that saw its socket ready, once per round trip
        // (docs/redis.md, "Speed").
        Command::Bench(args) => {
            let store = cli.store.clone();
            tokio::spawn(async move { bench::bench(&store, args).await })
                .await
                .map_err(|e| CliError::new(exit::EX_INTERNAL, format!("bench stopped: {e}")))?
        }
        Command::BenchWorker(args) => bench::bench_worker(&cli.store, args).await,
        Command::Torture(args) => torture::torture(&cli.store, args).await,
        Command::TortureWorker(args) => torture::worker(&cli.store, args).await,
    }
}

fn init_tracing(verbose: u8, stderr: redacted_stderr::RedactedStderr) {
    use tracing_subscriber::EnvFilter;
    // Quiet by default: every failure is reported as one line by `main`.
    // Warnings that a store's settings weaken fencing (Redis without AOF)
    // are the exception: the user must hear of those without -v; and so is
    // why waiters poll instead of being woken (PostgreSQL behind a
    // transaction pooler without a listen URL).
    let durability = leasehold::backends::redis::DURABILITY_TARGET;
    let wakeup = leasehold::backends::postgres::WAKEUP_TARGET;
    let default = match verbose {
        0 => format!("error,{durability}=warn,{wakeup}=warn"),
        1 => "leasehold=debug,leasehold_cli=debug,warn".to_owned(),
        _ => "leasehold=trace,leasehold_cli=trace,info".to_owned(),
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(stderr)
        // No colour codes in logs and captured output.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("soon")
            .unwrap_err()
            .contains("expected a duration"));
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
