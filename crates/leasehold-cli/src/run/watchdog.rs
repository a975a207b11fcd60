//! The watchdog: a small second process that stops the command's whole
//! process group when `run` can no longer be relied on to: `run` died
//! without saying goodbye (kill -9, a crash, an OOM kill), or it stopped
//! renewing its promise (frozen with SIGSTOP or a cgroup freezer, hung).
//! The parent-death signal reaches only the command itself, and only when
//! `run` dies; the watchdog also reaches what the command started in its
//! group (the `sleep` in `sh -c 'sleep 60; ...'`), and a frozen `run`.
//!
//! `run` starts it as `leasehold run-watchdog --group PGID` in a process
//! group of its own (so the terminal's and the shell's signals to `run`'s
//! job, SIGSTOP included, do not reach it), with a pipe on its stdin whose
//! only write end `run` holds. Over the pipe `run` sends the stop schedule
//! of the current lease after every successful renewal: when to send SIGTERM
//! and when SIGKILL, on `CLOCK_BOOTTIME` (which both processes read, and
//! which counts suspended time as the lease does). The watchdog keeps that
//! deadline on its own: if no newer schedule arrives in time, it signals the
//! group itself. When `run` is done with the command it writes the goodbye
//! byte: the watchdog exits quietly. If the pipe closes without it, `run`
//! died, and the watchdog sends SIGKILL to the group at once.

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

/// The longest the watchdog sleeps without reading the clock again, so a
/// suspend (the boot clock jumps; a sleep's monotonic clock does not)
/// delays it by at most this much after the resume.
const CLOCK_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Arguments of the hidden `run-watchdog` subcommand.
#[derive(Debug, Args)]
pub struct WatchdogArgs {
    /// The process group to kill if `run` dies or stops renewing
    #[arg(long)]
    pub group: i32,
}

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
    /// Starts a watchdog for `group`. `None` (logged) if it cannot be
    /// started: the command then still dies with `run` through its
    /// parent-death signal, only what it started is not reached.
    pub(super) fn start(group: Pid) -> Option<Watchdog> {
        match Self::try_start(group) {
            Ok(watchdog) => Some(watchdog),
            Err(e) => {
                tracing::warn!(error = %e, "no watchdog for the command's group");
                None
            }
        }
    }

    fn try_start(group: Pid) -> std::io::Result<Watchdog> {
        // Both ends are close-on-exec: neither the command nor the watchdog
        // inherits the write end, so it closes exactly when `run` goes.
        let (reader, writer) = std::io::pipe()?;
        // /proc/self/exe: this very binary, even if its file was replaced.
        let process = Command::new("/proc/self/exe")
            .arg("run-watchdog")
            .arg("--group")
            .arg(group.to_string())
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
            // Not a message of ours: the pipe cannot be trusted; treat as
            // `run` gone rather than guess.
            true => Heard::Gone,
        };
        let last = !matches!(heard, Heard::Schedule(..));
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
pub fn watch(args: &WatchdogArgs) -> u8 {
    if args.group <= 1 {
        return 0; // never signal init's group or every process
    }
    let group = Pid::from_raw(args.group);
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
                let _ = killpg(group, Signal::SIGKILL);
                return 0;
            }
            if now >= term && !termed {
                let _ = killpg(group, Signal::SIGTERM);
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
            Ok(Heard::Goodbye) => return 0,
            Ok(Heard::Gone) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                // `run` died: nobody else will stop the command's group.
                let _ = killpg(group, Signal::SIGKILL);
                return 0;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}
