//! `leasehold run KEY -- CMD ...`: run a command while holding a lock.

use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use leasehold::{AcquireOptions, LeaseGuard, Locks};
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};
use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

use crate::exit::{CliError, EX_LOST, EX_SOFTWARE};
use crate::{parse_duration, LeaseArgs};

/// Arguments of `run`.
#[derive(Debug, Args)]
#[command(
    after_help = "The command gets LEASEHOLD_KEY and LEASEHOLD_TOKEN (the fencing token) \
in its environment and runs in its own process group. SIGINT and SIGTERM are forwarded to it. \
If the lease is lost, the group gets SIGTERM, then SIGKILL after --kill-after, and run exits 70."
)]
pub struct RunArgs {
    /// Lock key (1..=256 bytes, no control characters)
    pub key: String,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// After a lost lease, how long the command gets between SIGTERM and SIGKILL
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub kill_after: Duration,
    /// The command and its arguments
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub async fn run(store: &str, args: RunArgs) -> Result<u8, CliError> {
    // Bad input fails before the store is touched.
    leasehold::Key::new(args.key.as_str())?;
    leasehold::time::validate_ttl(args.lease.ttl)?;
    let locks = Locks::open(store).await?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;

    // A signal while waiting cancels the wait.
    let cancel = CancellationToken::new();
    let options = AcquireOptions::new()
        .with_ttl(args.lease.ttl)
        .with_wait(args.lease.wait)
        .with_cancel(cancel.clone());
    let guard = tokio::select! {
        guard = locks.acquire_with(&args.key, &options) => guard?,
        _ = sigint.recv() => { cancel.cancel(); return Err(interrupted(&args.key)) }
        _ = sigterm.recv() => { cancel.cancel(); return Err(interrupted(&args.key)) }
    };
    tracing::info!(key = %guard.key(), token = guard.token(), "acquired");

    let (mut child, group) = match spawn(&args, &guard) {
        Ok(child) => child,
        Err(e) => {
            let _ = guard.release().await;
            return Err(e);
        }
    };
    let lost = guard.lost();
    tokio::pin!(lost);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status?,
            _ = sigint.recv() => forward(group, Signal::SIGINT),
            _ = sigterm.recv() => forward(group, Signal::SIGTERM),
            _ = &mut lost => {
                stop_after_lost_lease(&mut child, group, args.kill_after).await;
                eprintln!(
                    "leasehold: lease on {:?} lost (token {}); the command was stopped",
                    args.key,
                    guard.token()
                );
                return Ok(EX_LOST);
            }
        }
    };
    // The command finished under the lease; a failed release only delays
    // the next holder until the ttl ends, so it is reported, not fatal.
    if let Err(e) = guard.release().await {
        eprintln!("leasehold: warning: release failed, the lock expires after its ttl: {e}");
    }
    Ok(exit_code(status))
}

fn interrupted(key: &str) -> CliError {
    CliError::from(leasehold::Error::Cancelled {
        key: key.to_owned(),
    })
}

fn spawn(args: &RunArgs, guard: &LeaseGuard) -> Result<(Child, Pid), CliError> {
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| CliError::usage("run needs a command after --"))?;
    let child = Command::new(program)
        .args(rest)
        .env("LEASEHOLD_KEY", guard.key().as_str())
        .env("LEASEHOLD_TOKEN", guard.token().to_string())
        // Its own group: a lost lease stops the command and everything it
        // started, and our terminal's signals reach it only through us.
        .process_group(0)
        .kill_on_drop(false)
        .spawn()
        .map_err(|e| CliError::new(127, format!("cannot run {program:?}: {e}")))?;
    let group = child_group(&child)?;
    Ok((child, group))
}

fn child_group(child: &Child) -> Result<Pid, CliError> {
    child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .ok_or_else(|| CliError::new(EX_SOFTWARE, "the command exited before it could be watched"))
}

fn forward(group: Pid, signal: Signal) {
    tracing::debug!(?signal, "forwarding to the command");
    // The group may already be gone; nothing to do then.
    let _ = killpg(group, signal);
}

/// SIGTERM to the command's group, then SIGKILL if it outlives `grace`.
async fn stop_after_lost_lease(child: &mut Child, group: Pid, grace: Duration) {
    forward(group, Signal::SIGTERM);
    if tokio::time::timeout(grace, child.wait()).await.is_err() {
        forward(group, Signal::SIGKILL);
        let _ = child.wait().await;
    }
}

/// The command's exit code, or 128 + signal number if a signal ended it.
fn exit_code(status: ExitStatus) -> u8 {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code).unwrap_or(1),
        (None, Some(sig)) => u8::try_from(128 + sig).unwrap_or(255),
        (None, None) => 1,
    }
}
