//! The watchdog: a small second process that stops the command's whole
//! process group when `run` can no longer be relied on to: `run` died
//! without saying goodbye (kill -9, a crash, an OOM kill), or it stopped
//! renewing its promise (frozen with SIGSTOP or a cgroup freezer, hung).
//! The parent-death signal reaches only the command itself, and only when
//! `run` dies; the watchdog also reaches what the command started in its
//! group (the `sleep` in `sh -c 'sleep 60; ...'`), and a frozen `run`.
//!
//! `run` starts it as `leasehold run-watchdog` in a process group of its
//! own (so the terminal's and the shell's signals to `run`'s job, SIGSTOP
//! included, do not reach it), with a pipe on its stdin whose only write end
//! `run` holds, **before** it starts the command, and sends it the lease's
//! stop schedule at once: when to send SIGTERM and when SIGKILL, on
//! `CLOCK_BOOTTIME` (which both processes read, and which counts suspended
//! time as the lease does). Then `run` starts the command and sends its
//! process group, and after every successful renewal a new schedule. The
//! watchdog keeps the deadline on its own: if no newer schedule arrives in
//! time, it signals the group itself. A `run` frozen between starting the
//! command and sending its group (a few microseconds) leaves the watchdog
//! a deadline without a group: it then signals the group of every child of
//! `run` that leads one (the command is the only other), found in `/proc`.
//! When `run` is done with the command it writes the goodbye byte: the
//! watchdog exits quietly. If the pipe closes without it, `run` died, and
//! the watchdog sends SIGKILL to the group at once (the command also has
//! the parent-death signal).

use std::io::{Read, Write};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::Duration;

use clap::Args;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// The goodbye byte: `run` is done with the group.
const GOODBYE: u8 = b'x';
/// A schedule message: this byte, then SIGTERM's and SIGKILL's deadlines
/// as nanoseconds of `CLOCK_BOOTTIME`, big-endian u64 each.
const SCHEDULE: u8 = b's';
const SCHEDULE_LEN: usize = 17;
/// A group message: this byte, then the command's process group id,
/// big-endian i32.
const GROUP: u8 = b'g';
const GROUP_LEN: usize = 5;

/// The longest the watchdog sleeps without reading the clock again, so a
/// suspend (the boot clock jumps; a sleep's monotonic clock does not)
/// delays it by at most this much after the resume.
const CLOCK_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Arguments of the hidden `run-watchdog` subcommand (none: `run` sends
/// the command's group over the pipe once the command exists).
#[derive(Debug, Args)]
pub struct WatchdogArgs {}

/// Time on `CLOCK_BOOTTIME`: the clock `run` and the watchdog share.
pub(super) fn boot_now() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)
        .map_or(Duration::ZERO, Duration::from)
}

/// What `run` keeps: the pipe's write end and the watchdog process.
pub(super) struct Watchdog {
    writer: std::io::PipeWriter,
    process: Child,
    /// The last schedule sent, to send only changes.
    sent: Option<(Duration, Duration)>,
}

impl Watchdog {
    /// Starts a watchdog, before the command. `None` (logged) if it cannot
    /// be started: the command then still dies with `run` through its
    /// parent-death signal, only what it started is not reached.
    pub(super) fn start() -> Option<Watchdog> {
        match Self::try_start() {
            Ok(watchdog) => Some(watchdog),
            Err(e) => {
                tracing::warn!(error = %e, "no watchdog for the command's group");
                None
            }
        }
    }

    fn try_start() -> std::io::Result<Watchdog> {
        // Both ends are close-on-exec: neither the command nor the watchdog
        // inherits the write end, so it closes exactly when `run` goes.
        let (reader, writer) = std::io::pipe()?;
        // /proc/self/exe: this very binary, even if its file was replaced.
        let process = Command::new("/proc/self/exe")
            .arg("run-watchdog")
            .stdin(Stdio::from(reader))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .kill_on_drop(false)
            .spawn()?;
        Ok(Watchdog {
            writer,
            process,
            sent: None,
        })
    }

    /// Tells the watchdog the current schedule: SIGTERM `term_in` from now,
    /// SIGKILL `kill_in` from now, unless a later schedule arrives first.
    pub(super) fn schedule(&mut self, term_in: Duration, kill_in: Duration) {
        let now = boot_now();
        let (term, kill) = (now + term_in, now + kill_in);
        // Reading the clock twice gives slightly different answers for one
        // lease: resend only when the deadline moved by a renewal.
        if self
            .sent
            .is_some_and(|(_, k)| k.abs_diff(kill) < Duration::from_millis(1))
        {
            return;
        }
        let mut message = [0u8; SCHEDULE_LEN];
        message[0] = SCHEDULE;
        message[1..9].copy_from_slice(&nanos(term).to_be_bytes());
        message[9..].copy_from_slice(&nanos(kill).to_be_bytes());
        // 17 bytes into a pipe the watchdog drains: does not block. If the
        // watchdog is gone, nothing more can be done (logged).
        match self.writer.write_all(&message) {
            Ok(()) => self.sent = Some((term, kill)),
            Err(e) => {
                tracing::warn!(error = %e, "could not tell the watchdog the lease's deadline")
            }
        }
    }

    /// Tells the watchdog the command's process group, once it exists.
    pub(super) fn watch_group(&mut self, group: Pid) {
        let mut message = [0u8; GROUP_LEN];
        message[0] = GROUP;
        message[1..].copy_from_slice(&group.as_raw().to_be_bytes());
        if let Err(e) = self.writer.write_all(&message) {
            tracing::warn!(error = %e, "could not tell the watchdog the command's group");
        }
    }

    /// Tells the watchdog that `run` is done with the group, and reaps it.
    pub(super) async fn stand_down(mut self) {
        let _ = self.writer.write_all(&[GOODBYE]);
        drop(self.writer);
        let limit = std::time::Duration::from_secs(2);
        if tokio::time::timeout(limit, self.process.wait())
            .await
            .is_err()
        {
            let _ = self.process.start_kill();
        }
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// What the watchdog hears from `run`.
enum Heard {
    /// A new schedule: SIGTERM at the first, SIGKILL at the second.
    Schedule(Duration, Duration),
    /// The command's process group.
    Group(i32),
    /// `run` is done with the group.
    Goodbye,
    /// The pipe closed (or broke) without a goodbye: `run` died.
    Gone,
}

/// Reads `run`'s messages from stdin, one at a time, onto `tx`.
fn listen(tx: &mpsc::Sender<Heard>) {
    let mut stdin = std::io::stdin().lock();
    loop {
        let mut tag = [0u8; 1];
        let heard = match read_exact(&mut stdin, &mut tag) {
            false => Heard::Gone,
            true if tag[0] == GOODBYE => Heard::Goodbye,
            true if tag[0] == SCHEDULE => {
                let mut body = [0u8; SCHEDULE_LEN - 1];
                if read_exact(&mut stdin, &mut body) {
                    let at = |b: &[u8]| {
                        Duration::from_nanos(u64::from_be_bytes(b.try_into().unwrap_or([0; 8])))
                    };
                    Heard::Schedule(at(&body[..8]), at(&body[8..]))
                } else {
                    Heard::Gone
                }
            }
            true if tag[0] == GROUP => {
                let mut body = [0u8; GROUP_LEN - 1];
                if read_exact(&mut stdin, &mut body) {
                    Heard::Group(i32::from_be_bytes(body))
                } else {
                    Heard::Gone
                }
            }
            // Not a message of ours: the pipe cannot be trusted; treat as
            // `run` gone rather than guess.
            true => Heard::Gone,
        };
        let last = !matches!(heard, Heard::Schedule(..) | Heard::Group(_));
        if tx.send(heard).is_err() || last {
            return;
        }
    }
}

fn read_exact(from: &mut impl Read, buf: &mut [u8]) -> bool {
    loop {
        match from.read_exact(buf) {
            Ok(()) => return true,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return false,
        }
    }
}

/// The watchdog's body: keeps the latest schedule and signals the group
/// when it passes, or at once if `run` dies. Runs before any async runtime
/// exists.
pub fn watch(_args: &WatchdogArgs) -> u8 {
    // `run`, whose children the fallback looks for (read now: if `run`
    // dies, this process is handed to another parent).
    let run = nix::unistd::getppid();
    let mut group: Option<Pid> = None;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || listen(&tx));
    let mut schedule: Option<(Duration, Duration)> = None;
    let mut termed = false;
    loop {
        let now = boot_now();
        if let Some((term, kill)) = schedule {
            if now >= kill {
                // `run` did not renew the schedule in time: the lease can no
                // longer be relied on, and `run` is not stopping the group.
                signal_group(group, run, Signal::SIGKILL);
                return 0;
            }
            if now >= term && !termed {
                signal_group(group, run, Signal::SIGTERM);
                termed = true;
            }
        }
        let next = match schedule {
            Some((term, _)) if !termed => term,
            Some((_, kill)) => kill,
            None => now + CLOCK_CHECK_EVERY,
        };
        let sleep = next.saturating_sub(now).min(CLOCK_CHECK_EVERY);
        match rx.recv_timeout(sleep) {
            // Once SIGTERM went out the group is being stopped (`run`
            // decides the same at that moment): a late renewal does not
            // call the SIGKILL off.
            Ok(Heard::Schedule(term, kill)) if !termed => schedule = Some((term, kill)),
            Ok(Heard::Schedule(..)) => {}
            // Never init's group or every process.
            Ok(Heard::Group(pgid)) if pgid > 1 => group = Some(Pid::from_raw(pgid)),
            Ok(Heard::Group(_)) => {}
            Ok(Heard::Goodbye) => return 0,
            Ok(Heard::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                // `run` died: nobody else will stop the command's group.
                // (Without a group yet, the command dies of its
                // parent-death signal; `run`'s children are no longer
                // findable as its children.)
                if let Some(group) = group {
                    let _ = killpg(group, Signal::SIGKILL);
                }
                return 0;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// Sends `signal` to the command's group; before `run` said which group
/// that is, to the group of every child of `run` that leads one, except
/// this watchdog's own: the command (`run` starts only the two).
fn signal_group(group: Option<Pid>, run: Pid, signal: Signal) {
    match group {
        Some(group) => {
            let _ = killpg(group, signal);
        }
        None => {
            let me = nix::unistd::getpid();
            for child in group_leaders_under(run).into_iter().filter(|c| *c != me) {
                let _ = killpg(child, signal);
            }
        }
    }
}

/// The children of `parent` that lead their own process group, from
/// `/proc/*/stat` (fields after the command name: state, ppid, pgrp).
fn group_leaders_under(parent: Pid) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // The command name is in parentheses and may hold anything:
            // the fields that follow start after its last ')'.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.get(1).and_then(|p| p.parse::<i32>().ok()) == Some(parent.as_raw())
                && fields.get(2).and_then(|g| g.parse::<i32>().ok()) == Some(*pid)
        })
        .map(Pid::from_raw)
        .collect()
}
