//! `leasehold run KEY... -- CMD ...`: run a command while holding a lock
//! (or several, all or none: `Locks::acquire_many`).
//!
//! The promise, in order of the command's life:
//! - it starts only under a live lease (the guard is checked first);
//! - it runs in its own process group, with the terminal if `run` had it;
//! - it is stopped *inside* the lease when renewal stops succeeding: SIGTERM
//!   at `valid_until - kill_after`, SIGKILL at `valid_until - kill_margin`
//!   (see `stop`); the watchdog keeps the same schedule on its own, so a
//!   frozen or hung `run` cannot keep the command alive past it;
//! - it dies with `run`: SIGHUP/SIGQUIT/SIGINT/SIGTERM are forwarded to its
//!   group (`signals`); if `run` is killed, the command gets the
//!   parent-death signal (`child`) and a watchdog process kills its group
//!   (`watchdog`).

mod child;
mod signals;
mod stop;
mod watchdog;

pub use watchdog::{watch as watchdog, WatchdogArgs};

use std::io::Write;
use std::process::ExitStatus;
use std::time::Duration;

use clap::Args;
use leasehold::{AcquireOptions, Locks, MultiGuard};
use nix::sys::signal::Signal;
use tokio::time::{sleep, sleep_until, Instant};
use tokio_util::sync::CancellationToken;

use crate::exit::{CliError, EX_LOST, EX_TEMPFAIL};
use crate::{parse_duration, LeaseArgs};
use child::Spawned;
use signals::Signals;

/// What `run --help` says about the lifecycle; README's "run" section says
/// the same.
const RUN_PROMISES: &str = "\
One key is one lock: a plain run KEY (and run KEY --exclusive, the same) \
is KEY's exclusive acquire, as the library's locks.acquire(KEY): it excludes \
other plain runs of KEY and the --shared runs of KEY (once KEY has been used \
with --shared it is a reader-writer lock and a plain run is its writer, which \
waits for the shared runs to end; new ones wait for it). --shared runs of KEY \
overlap each other only. A key keeps the kind it was first used as: \
--permits N on a key used as a lock (or a lock on a semaphore's key) is \
refused with exit 65. LEASEHOLD_TOKEN is KEY's fencing token; a key's tokens \
keep increasing when it becomes a reader-writer lock.

Several keys are taken all or none, in sorted order (so runs whose key sets \
overlap cannot deadlock), under the \
one --wait; losing any of them stops the command. The command gets \
LEASEHOLD_KEYS and LEASEHOLD_TOKENS (the fencing tokens), one line per key in \
sorted order, in its environment, and with one key also LEASEHOLD_KEY and \
LEASEHOLD_TOKEN; it runs in its own process group. It is started only while \
the lease is valid. With a terminal on stdin (run in the foreground) the \
command's group gets the terminal and run takes it back afterwards.

Signals: SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to run are forwarded to the \
command's group; run then waits for the command and exits with its code. If \
run itself dies (kill -9, a crash), the command gets SIGKILL from the kernel \
(Linux parent-death signal) and a small watchdog process that run starts \
beside it (`leasehold run-watchdog`, in a process group of its own) sends \
SIGKILL to the command's whole group.

Lost lease: the stop schedule is counted inside the lease. If no renewal has \
succeeded by valid_until minus --kill-after, the group gets SIGTERM; at \
valid_until minus 250 ms (a quarter of the ttl if that is less; valid_until \
itself is 1 % of the ttl + 2 ms before the store frees the key) it gets \
SIGKILL; run exits 70 once the command is gone. A renewal that succeeds \
before the SIGTERM cancels the schedule. If the store reports the lease gone \
early (e.g. `release --force`), SIGTERM follows at once and SIGKILL after \
--kill-after or at the SIGKILL time, whichever comes first. The watchdog keeps \
the same schedule on its own (run tells it each new deadline, on \
CLOCK_BOOTTIME; the watchdog starts, with the first deadline, before the \
command): a run that is frozen (SIGSTOP, a cgroup freezer), hung or dead, \
even at the instant its command starts, cannot keep its command running past it. The 250 ms margin covers a \
timer firing late and the group's death under heavy CPU load (measured worst \
about 155 ms together); a machine stalled longer than that (a VM paused, \
swap storms) is out of reach.

Not promised: processes that leave the command's process group (setsid, \
daemonizing, a grandchild that moved to another group) are out of reach; if \
the watchdog is killed or frozen together with run (kill -9 or SIGSTOP of \
both, a freezer over the whole session), only the command itself dies with \
run, and a frozen command holds on until it is thawed; when the command exits \
normally, anything it left running in the background is not stopped; job \
control (Ctrl-Z) of the command is not supported.

Exit: the command's own code (128 + N if signal N ended it, 127 if it could \
not be started); 70 lease lost (the command was stopped); 75 not acquired \
(busy, --wait ran out, or the grant arrived already expired: the command did \
not start); 129, 130, 131, 143: SIGHUP, SIGINT, SIGQUIT, SIGTERM ended the \
wait; 64 bad input; 69 store unavailable; 71 internal failure.";

/// Arguments of `run`.
#[derive(Debug, Args)]
#[command(after_help = RUN_PROMISES)]
pub struct RunArgs {
    /// Lock keys (each 1..=256 bytes, no control characters; no key twice),
    /// taken all or none
    #[arg(required = true, num_args = 1.., value_name = "KEY")]
    pub keys: Vec<String>,
    #[command(flatten)]
    pub lease: LeaseArgs,
    /// Grace between SIGTERM and SIGKILL when renewal stops succeeding, counted
    /// inside the lease; at most half the ttl [default: ttl/4]
    #[arg(long, value_parser = parse_duration)]
    pub kill_after: Option<Duration>,
    /// Take one of N permits of the semaphore KEY (at most N commands run
    /// at once) instead of the lock KEY; the command also gets LEASEHOLD_SLOT
    #[arg(long, value_name = "N")]
    pub permits: Option<u32>,
    /// Take a shared grant of KEY: shared runs of KEY overlap; a plain (or
    /// --exclusive) run of KEY excludes them all
    #[arg(long, conflicts_with_all = ["permits", "exclusive"])]
    pub shared: bool,
    /// Take KEY exclusively, the same as a plain `run KEY` (which is the
    /// exclusive side of KEY's lock): it waits for the --shared runs of KEY
    /// to end, and new ones wait for it
    #[arg(long, conflicts_with = "permits")]
    pub exclusive: bool,
    /// The command and its arguments
    #[arg(required = true, last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

impl RunArgs {
    /// The keys as messages name them: the key, or the keys joined by ", ".
    fn label(&self) -> String {
        self.keys.join(", ")
    }
}

/// The default grace: a quarter of the ttl, so SIGTERM comes at 3/4 of a
/// lease whose renewal (due at 1/3) has failed for 0.4 ttl.
fn default_kill_after(ttl: Duration) -> Duration {
    ttl / 4
}

/// `--kill-after`, validated against the ttl. Renewal is due every ttl/3 and
/// the grace is counted back from the lease's end, so a grace longer than
/// half the ttl would stop a healthy command before its renewal could land.
fn kill_after(args: &RunArgs) -> Result<Duration, CliError> {
    let ttl = args.lease.ttl;
    match args.kill_after {
        None => Ok(default_kill_after(ttl)),
        Some(grace) if grace.saturating_mul(2) <= ttl => Ok(grace),
        Some(grace) => Err(CliError::usage(format!(
            "invalid --kill-after: must be at most half the ttl ({}), got {}: \
             the grace is counted inside the lease and renewal is due every ttl/3",
            humantime::format_duration(ttl / 2),
            humantime::format_duration(grace)
        ))),
    }
}

pub async fn run(store: &str, args: RunArgs) -> Result<u8, CliError> {
    // Bad input fails before the store is touched.
    leasehold::canonical_keys(&args.keys)?;
    leasehold::time::validate_ttl(args.lease.ttl)?;
    if let Some(permits) = args.permits {
        leasehold::validate_permits(permits)?;
        if args.keys.len() > 1 {
            return Err(leasehold::Error::invalid(
                "--permits",
                "takes one semaphore KEY; several keys are a multi-lock of mutexes",
            )
            .into());
        }
    }
    if args.shared && args.keys.len() > 1 {
        return Err(leasehold::Error::invalid(
            "--shared",
            "takes one KEY; several keys are taken exclusively, all or none",
        )
        .into());
    }
    let grace = kill_after(&args)?;
    // Caught from here on: a signal while connecting or waiting ends run
    // with 128 + its number instead of killing it.
    let mut signals = Signals::new()?;
    let locks = tokio::select! {
        locks = Locks::open(store) => locks?,
        signal = signals.recv() => return Err(signals::interrupted(&args.label(), signal)),
    };
    let outcome = run_with(store, &locks, &args, grace, &mut signals).await;
    // Close the store's connections while the runtime still runs, so no
    // driver task is torn down mid-request at exit.
    locks.close().await;
    outcome
}

async fn run_with(
    store: &str,
    locks: &Locks,
    args: &RunArgs,
    grace: Duration,
    signals: &mut Signals,
) -> Result<u8, CliError> {
    // A signal while waiting cancels the wait; run exits 128 + its number.
    let cancel = CancellationToken::new();
    let options = AcquireOptions::new()
        .with_ttl(args.lease.ttl)
        .with_wait(args.lease.wait)
        .with_fair(args.lease.fair)
        // The command's SIGTERM is planned from `valid_until`: a grant
        // handed over is claimed at once, so that the command starts one
        // round trip after the hand-off, not a third into the claim window
        // (wait_for_claim below).
        .with_prompt_claim(true)
        .with_cancel(cancel.clone());
    let acquire = async {
        match (args.permits, args.keys.as_slice()) {
            // A permit is a set of one key (run checked there is one).
            (Some(permits), [key]) => locks
                .semaphore(key, permits)?
                .acquire_with(&options)
                .await
                .map(MultiGuard::from),
            // So is a side of a reader-writer lock.
            (None, [key]) if args.shared => locks
                .rw_lock(key)?
                .read_with(&options)
                .await
                .map(MultiGuard::from),
            // Plain and --exclusive alike: each key's exclusive acquire, as
            // `locks.acquire(KEY)` in an application: one key is one lock,
            // so on a key that --shared runs use (a reader-writer lock) it
            // is that lock's writer, which waits for them and excludes
            // them; on a semaphore's key it is refused (exit 65).
            _ => locks.acquire_many(&args.keys, &options).await,
        }
    };
    let guard = tokio::select! {
        guard = acquire => guard?,
        signal = signals.recv() => {
            cancel.cancel();
            return Err(signals::interrupted(&args.label(), signal));
        }
    };
    tracing::info!(?guard, "acquired");
    // A grant that arrives after its lease's end (a store that stalled the
    // request) is no lease: never start the command on it.
    if guard.is_lost() {
        let _ = guard.release().await;
        return Err(CliError::new(
            EX_TEMPFAIL,
            format!(
                "the lease on {:?} had already expired when its grant arrived; \
                 the command was not started",
                args.label()
            ),
        ));
    }

    // A grant handed over by the queue at the store lasts only its claim
    // window (2 s at most) until the guard's claim (a renewal, sent at once:
    // `with_prompt_claim`) gives it the whole ttl: when the grace does not
    // fit in that window, the command starts once the claim moved the
    // schedule, not on a lease that may end before the grace.
    wait_for_claim(&guard, grace).await;

    let mut spawned = match child::spawn(&args.command, &guard, {
        let (term_at, kill_at) = schedule(guard.valid_until(), grace, kill_margin(guard.ttl()));
        let now = Instant::now();
        (
            term_at.saturating_duration_since(now),
            kill_at.saturating_duration_since(now),
        )
    }) {
        Ok(spawned) => spawned,
        Err(e) => {
            let _ = guard.release().await;
            return Err(e);
        }
    };
    let outcome = supervise(&mut spawned, &guard, grace, signals).await;
    if outcome.is_ok() {
        // The command is reaped and its group stopped or left as promised.
        spawned.finish().await;
    } // else: dropping it makes the watchdog stop the group.
    match outcome {
        Ok(Ending::Exited(status)) => {
            // The command finished under the lease; a failed release only
            // delays the next holder until the ttl ends: reported, not fatal.
            if let Err(e) = guard.release().await {
                let warning =
                    format!("warning: release failed, the lock expires after its ttl: {e}");
                report(&leasehold::redact_secrets(&warning, store));
            }
            Ok(exit_code(status))
        }
        Ok(Ending::Stopped) => {
            // The key that was lost (any, if the deadline passed for all).
            let lost = guard
                .guards()
                .iter()
                .find(|g| g.is_lost())
                .unwrap_or(&guard.guards()[0]);
            report(&format!(
                "lease on {:?} lost (token {}); the command was stopped",
                lost.key().as_str(),
                lost.token()
            ));
            // Give back what is still held (a broken mutex leaves its
            // writer, a lost key of a set the others) now: dropped, it
            // would be released in the background, which exit cuts short,
            // and the rest would stay held for a ttl.
            if let Err(e) = guard.release().await {
                tracing::warn!(error = %e, "could not give the rest of the set back; it expires after its ttl");
            }
            Ok(EX_LOST)
        }
        Err(e) => Err(e.into()),
    }
}

/// How the command's run ended.
enum Ending {
    /// It exited on its own (or of a signal `run` forwarded).
    Exited(ExitStatus),
    /// The lease could no longer be relied on and the group was stopped.
    Stopped,
}

/// Waits for the command while forwarding signals, and stops its group on
/// the schedule counted inside the lease.
async fn supervise(
    spawned: &mut Spawned,
    guard: &MultiGuard,
    grace: Duration,
    signals: &mut Signals,
) -> std::io::Result<Ending> {
    let lost = guard.lost();
    tokio::pin!(lost);
    let margin = kill_margin(guard.ttl());
    // How soon a renewal reaches the watchdog: well inside the slack between
    // a renewal's due time (ttl/3) and SIGTERM (ttl/2 at the earliest).
    let tell_every =
        (guard.ttl() / 20).clamp(Duration::from_millis(10), Duration::from_millis(250));
    loop {
        // Re-read every turn: each successful renewal moves it forward.
        let (term_at, kill_at) = schedule(guard.valid_until(), grace, margin);
        let now = Instant::now();
        spawned.schedule(
            term_at.saturating_duration_since(now),
            kill_at.saturating_duration_since(now),
        );
        tokio::select! {
            status = spawned.child.wait() => {
                let status = status?;
                // Killed by a signal once the schedule had passed: the
                // watchdog stopped it while `run` was frozen or slow.
                use std::os::unix::process::ExitStatusExt;
                if status.signal().is_some() && Instant::now() >= term_at {
                    return Ok(Ending::Stopped);
                }
                return Ok(Ending::Exited(status));
            }
            signal = signals.recv() => spawned.forward(signal),
            _ = &mut lost => {
                // The store says the lease is gone (or its deadline passed):
                // SIGTERM now, SIGKILL after the grace or at the kill time.
                let kill_at = kill_at.min(Instant::now() + grace);
                stop::stop_group(spawned, kill_at, signals).await;
                return Ok(Ending::Stopped);
            }
            _ = sleep(tell_every) => {}
            _ = sleep_until(term_at) => {
                if schedule(guard.valid_until(), grace, margin).0 > term_at {
                    continue; // renewed meanwhile: the schedule moves on
                }
                tracing::warn!(?guard, "no renewal succeeded; stopping the command inside the lease");
                stop::stop_group(spawned, kill_at, signals).await;
                return Ok(Ending::Stopped);
            }
        }
    }
}

/// How long before `valid_until` the group gets SIGKILL: room for the
/// kill timer to fire late and for the group to die before the lease ends
/// (and, `valid_until` being already 1 % + 2 ms inside the store's expiry,
/// before the next holder can be granted). Measured on a 2-core machine
/// with both cores busy (see README, "run"): a timer fired late by
/// p99 46 ms, max 58 ms; SIGKILL of a group to its leader reaped p99 41 ms,
/// max 96 ms. 250 ms covers the worst sum seen (~155 ms) with room; a
/// quarter of a short ttl keeps it inside the lease.
const KILL_MARGIN: Duration = Duration::from_millis(250);

/// Waits while `guard`'s SIGTERM time is already due and its deadline has
/// not passed: a handed-over grant whose claim (its first renewal) is to
/// come. Checked every millisecond; a grant asked for ends this at once.
async fn wait_for_claim(guard: &MultiGuard, grace: Duration) {
    let margin = kill_margin(guard.ttl());
    while schedule(guard.valid_until(), grace, margin).0 <= Instant::now() && !guard.is_lost() {
        sleep(Duration::from_millis(1)).await;
    }
}

fn kill_margin(ttl: Duration) -> Duration {
    KILL_MARGIN.min(ttl / 4)
}

/// When the command gets SIGTERM unless a renewal succeeds first, and when
/// SIGKILL: SIGTERM at `valid_until - grace`, SIGKILL at
/// `valid_until - margin`, and never SIGKILL before SIGTERM (a grace
/// shorter than the margin sends both together).
fn schedule(valid_until: Instant, grace: Duration, margin: Duration) -> (Instant, Instant) {
    let kill = valid_until.checked_sub(margin).unwrap_or(valid_until);
    (sigterm_due(valid_until, grace).min(kill), kill)
}

/// When the command gets SIGTERM unless a renewal succeeds first.
fn sigterm_due(valid_until: Instant, grace: Duration) -> Instant {
    valid_until.checked_sub(grace).unwrap_or(valid_until)
}

/// One line on stderr. A write error is ignored: after a hang-up stderr may
/// be a dead terminal, and `eprintln!` would panic there.
pub(crate) fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "leasehold: {line}");
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

/// 128 + the signal's number: the shell's convention for "ended by it".
pub(crate) fn signal_exit_code(signal: Signal) -> u8 {
    u8::try_from(128 + signal as i32).unwrap_or(255)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_starts_at_valid_until_minus_the_grace() {
        let now = Instant::now();
        let until = now + Duration::from_secs(10);
        assert_eq!(
            sigterm_due(until, Duration::from_secs(3)),
            now + Duration::from_secs(7)
        );
        assert_eq!(sigterm_due(until, Duration::ZERO), until);
    }

    #[test]
    fn signal_codes_follow_the_shell() {
        assert_eq!(signal_exit_code(Signal::SIGHUP), 129);
        assert_eq!(signal_exit_code(Signal::SIGINT), 130);
        assert_eq!(signal_exit_code(Signal::SIGQUIT), 131);
        assert_eq!(signal_exit_code(Signal::SIGTERM), 143);
    }

    #[test]
    fn default_grace_is_a_quarter_of_the_ttl() {
        assert_eq!(
            default_kill_after(Duration::from_secs(30)),
            Duration::from_millis(7500)
        );
    }
}
