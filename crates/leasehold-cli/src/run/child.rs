//! Starting the command: its own process group, the lease in its
//! environment, the terminal if `run` has it, and death with `run`.

use std::io::IsTerminal;
use std::os::fd::AsFd;

use leasehold::MultiGuard;
use nix::sys::signal::{killpg, pthread_sigmask, SigSet, SigmaskHow, Signal};
use nix::unistd::{getpgrp, tcgetpgrp, tcsetpgrp, Pid};
use tokio::process::{Child, Command};

use super::watchdog::Watchdog;
use crate::exit::{CliError, EX_INTERNAL};

/// The running command.
pub(super) struct Spawned {
    pub(super) child: Child,
    /// Its process group (its pid: it leads the group).
    pub(super) group: Pid,
    /// Whether the group was given the terminal, to be taken back.
    has_terminal: bool,
    /// Kills the group if `run` dies; dropped without `finish`, it does so
    /// at once.
    watchdog: Option<Watchdog>,
}

impl Spawned {
    /// Sends `signal` to the command's group; it may already be gone.
    pub(super) fn forward(&self, signal: Signal) {
        tracing::debug!(?signal, "signalling the command's group");
        let _ = killpg(self.group, signal);
    }

    /// Tells the watchdog the current stop schedule (SIGTERM in `term_in`,
    /// SIGKILL in `kill_in`), which it keeps on its own if `run` stops
    /// renewing it.
    pub(super) fn schedule(&mut self, term_in: std::time::Duration, kill_in: std::time::Duration) {
        if let Some(watchdog) = self.watchdog.as_mut() {
            watchdog.schedule(term_in, kill_in);
        }
    }

    /// Call once the command is reaped: takes the terminal back (if the
    /// command had it) and stands the watchdog down.
    pub(super) async fn finish(mut self) {
        if self.has_terminal {
            if let Err(e) = set_foreground(getpgrp()) {
                tracing::debug!(error = %e, "could not take the terminal back");
            }
        }
        if let Some(watchdog) = self.watchdog.take() {
            watchdog.stand_down().await;
        }
    }
}

/// Starts `command` in a new process group with `LEASEHOLD_KEYS` and
/// `LEASEHOLD_TOKENS` set (one line per key, in canonical order) and, when
/// it holds one key, `LEASEHOLD_KEY` and `LEASEHOLD_TOKEN` too (left unset
/// with several keys, so a script written for one key cannot silently use
/// another key's token). If `run` is the terminal's foreground process,
/// the command's group becomes the foreground group, so a command that reads
/// the terminal is not stopped by SIGTTIN (and Ctrl-C reaches it directly).
pub(super) fn spawn(
    command: &[String],
    guard: &MultiGuard,
    first_schedule: (std::time::Duration, std::time::Duration),
) -> Result<Spawned, CliError> {
    let (program, rest) = command
        .split_first()
        .ok_or_else(|| CliError::usage("run needs a command after --"))?;
    let foreground = in_terminal_foreground();
    let mut cmd = Command::new(program);
    let (keys, tokens): (Vec<&str>, Vec<String>) = guard
        .guards()
        .iter()
        .map(|g| (g.key().as_str(), g.token().to_string()))
        .unzip();
    if let ([key], [token]) = (keys.as_slice(), tokens.as_slice()) {
        cmd.env("LEASEHOLD_KEY", key).env("LEASEHOLD_TOKEN", token);
    }
    cmd.args(rest)
        .env("LEASEHOLD_KEYS", keys.join("\n"))
        .env("LEASEHOLD_TOKENS", tokens.join("\n"))
        // Its own group: a lost lease stops the command and everything it
        // started, and our terminal's signals reach it only through us
        // (or directly, once it is the foreground group).
        .process_group(0)
        .kill_on_drop(false);
    let first = guard.guards().first();
    // A reader-writer lock's grant has a slot too, but its token alone is
    // what a resource compares (docs/rw-lock.md).
    let rw = first.and_then(|g| g.rw_side()).is_some();
    if let Some(slot) = first.and_then(|permit| permit.slot()).filter(|_| !rw) {
        // A semaphore permit: fenced writes compare tokens per slot.
        cmd.env("LEASEHOLD_SLOT", slot.to_string());
    }
    // The watchdog first, with the lease's schedule: a `run` frozen right
    // after the command starts must not leave it without a deadline.
    let mut watchdog = Watchdog::start();
    if let Some(w) = watchdog.as_mut() {
        w.schedule(first_schedule.0, first_schedule.1);
    }
    die_with_parent(&mut cmd, foreground);
    let child = cmd
        .spawn()
        .map_err(|e| CliError::new(127, format!("cannot run {program:?}: {e}")))?;
    let group = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .map(Pid::from_raw)
        .ok_or_else(|| {
            CliError::new(EX_INTERNAL, "the command exited before it could be watched")
        })?;
    // The child also does this before exec; doing it here too closes the
    // window in which one of the two has not happened yet (as shells do).
    if let Some(w) = watchdog.as_mut() {
        w.watch_group(group);
    }
    let has_terminal = foreground && set_foreground(group).is_ok();
    Ok(Spawned {
        child,
        group,
        has_terminal,
        watchdog,
    })
}

/// Whether stdin is a terminal whose foreground group is `run`'s own.
fn in_terminal_foreground() -> bool {
    let stdin = std::io::stdin();
    stdin.is_terminal() && tcgetpgrp(stdin.as_fd()) == Ok(getpgrp())
}

/// Makes `group` the foreground group of the terminal on stdin. SIGTTOU is
/// blocked meanwhile: a background group that changes the foreground group
/// would otherwise be stopped by it (and `run` is one, once the command has
/// the terminal).
fn set_foreground(group: Pid) -> nix::Result<()> {
    let mut ttou = SigSet::empty();
    ttou.add(Signal::SIGTTOU);
    let mut previous = SigSet::empty();
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), Some(&mut previous))?;
    let result = tcsetpgrp(std::io::stdin().as_fd(), group);
    let _ = pthread_sigmask(SigmaskHow::SIG_SETMASK, Some(&previous), None);
    result
}

/// Arranges, in the forked child before it execs the command, that
/// - the kernel sends it SIGKILL when `run` dies (PR_SET_PDEATHSIG), even
///   of SIGKILL or a crash; if `run` died before that was armed (the child's
///   parent is no longer `run`), the child kills itself at once;
/// - with `take_terminal`, its new process group is the terminal's
///   foreground group before the command can read.
///
/// The parent-death signal reaches this one process, not the processes the
/// command starts later (those get the signals `run` forwards while it
/// lives). It fires when the *thread* that forked exits: `run` spawns from
/// the thread that runs `block_on` in `main`, which lives as long as the
/// process.
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command, take_terminal: bool) {
    let parent = Pid::from_raw(i32::try_from(std::process::id()).unwrap_or(0));
    // SAFETY: `pre_exec` runs the closure in the child between fork and
    // exec, where only async-signal-safe calls are allowed. It makes only
    // raw system calls (prctl, getppid, raise, sigprocmask, getpgrp,
    // tcsetpgrp), allocates nothing and takes no locks. Fd 0 is open for the
    // closure's duration (stdio is set up before pre_exec hooks run).
    unsafe {
        cmd.pre_exec(move || {
            #[cfg(any(target_os = "linux", target_os = "android"))]
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != parent {
                // `run` died before the signal was armed: nobody would
                // stop us, so do not start the command at all.
                nix::sys::signal::raise(Signal::SIGKILL)?;
            }
            if take_terminal {
                let mut ttou = SigSet::empty();
                ttou.add(Signal::SIGTTOU);
                pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&ttou), None)?;
                let stdin = std::os::fd::BorrowedFd::borrow_raw(0);
                // Best effort: without it the parent's call still lands.
                let _ = tcsetpgrp(stdin, getpgrp());
                pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&ttou), None)?;
            }
            Ok(())
        });
    }
}
