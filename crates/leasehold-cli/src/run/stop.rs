//! Stopping the command's process group when the lease can no longer be
//! relied on: SIGTERM now, SIGKILL at `kill_at` at the latest.

use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{killpg, Signal};
use tokio::time::{sleep, timeout_at, Instant};

use super::child::Spawned;
use super::signals::Signals;

/// How often to look whether the group has emptied after its leader exited.
const GROUP_POLL: Duration = Duration::from_millis(20);

/// SIGTERM to the group; the command and then anything else left in its
/// group get until `kill_at` to exit, then the group gets SIGKILL (so a
/// member that outlived the command by ignoring SIGTERM does not outlive the
/// lease). Returns once the command has been reaped. Signals that arrive meanwhile are
/// still forwarded.
pub(super) async fn stop_group(spawned: &mut Spawned, kill_at: Instant, signals: &mut Signals) {
    spawned.forward(Signal::SIGTERM);
    let graceful = timeout_at(kill_at, async {
        loop {
            tokio::select! {
                _ = spawned.child.wait() => break,
                signal = signals.recv() => spawned.forward(signal),
            }
        }
        group_gone(spawned.group).await;
    })
    .await;
    if graceful.is_ok() {
        return; // the command and everything in its group exited
    }
    tracing::debug!("the grace ran out; killing the command's group");
    spawned.forward(Signal::SIGKILL);
    let _ = spawned.child.wait().await;
}

/// Resolves when no process is left in `group` (exited members that nobody
/// has reaped yet still count, so this may wait out the grace).
async fn group_gone(group: nix::unistd::Pid) {
    while killpg(group, None) != Err(Errno::ESRCH) {
        sleep(GROUP_POLL).await;
    }
}
