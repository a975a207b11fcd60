//! The watchdog: a small second process that stops the command's whole
//! process group if `run` dies without saying goodbye (kill -9, a crash, an
//! OOM kill). The parent-death signal reaches only the command itself; the
//! watchdog also reaches what the command started in its group (the `sleep`
//! in `sh -c 'sleep 60; ...'`).
//!
//! `run` starts it as `leasehold run-watchdog --group PGID` in a process
//! group of its own (so the terminal's and the shell's signals to `run`'s
//! job do not reach it), with a pipe on its stdin whose only write end `run`
//! holds. When `run` is done with the command it writes one byte: the
//! watchdog exits quietly. If the pipe closes without that byte, `run` died,
//! and the watchdog sends SIGKILL to the group.

use std::io::{Read, Write};
use std::process::Stdio;

use clap::Args;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// Arguments of the hidden `run-watchdog` subcommand.
#[derive(Debug, Args)]
pub struct WatchdogArgs {
    /// The process group to kill if `run` dies
    #[arg(long)]
    pub group: i32,
}

/// What `run` keeps: the pipe's write end and the watchdog process.
pub(super) struct Watchdog {
    writer: std::io::PipeWriter,
    process: Child,
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
        Ok(Watchdog { writer, process })
    }

    /// Tells the watchdog that `run` is done with the group, and reaps it.
    pub(super) async fn stand_down(mut self) {
        let _ = self.writer.write_all(b"x");
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

/// The watchdog's body: waits for `run`'s byte or the end of the pipe.
/// Runs before any async runtime exists.
pub fn watch(args: &WatchdogArgs) -> u8 {
    let mut byte = [0u8; 1];
    let said_goodbye = loop {
        match std::io::stdin().read(&mut byte) {
            Ok(n) => break n == 1,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break false,
        }
    };
    if !said_goodbye && args.group > 1 {
        // `run` died: nobody else will stop the command's group.
        let _ = killpg(Pid::from_raw(args.group), Signal::SIGKILL);
    }
    0
}
