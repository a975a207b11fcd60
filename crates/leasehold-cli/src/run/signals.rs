//! The signals `run` catches: while waiting for the lock they cancel the
//! wait (exit 128 + N); while the command runs they are forwarded to its
//! process group. SIGHUP (a closed terminal or ssh session) and SIGQUIT are
//! caught too, so that `run` never dies of them leaving its command behind.

use nix::sys::signal::Signal;
use tokio::signal::unix::{signal, SignalKind};

use crate::exit::CliError;

/// The caught signals, as one stream.
pub(super) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers; from here on these signals no longer kill `run`.
    pub(super) fn new() -> std::io::Result<Self> {
        Ok(Signals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
            hangup: signal(SignalKind::hangup())?,
            quit: signal(SignalKind::quit())?,
        })
    }

    /// The next signal received.
    ///
    /// # Cancel safety
    /// Cancel safe: a signal not returned stays pending for the next call.
    pub(super) async fn recv(&mut self) -> Signal {
        tokio::select! {
            _ = self.interrupt.recv() => Signal::SIGINT,
            _ = self.terminate.recv() => Signal::SIGTERM,
            _ = self.hangup.recv() => Signal::SIGHUP,
            _ = self.quit.recv() => Signal::SIGQUIT,
        }
    }
}

/// The error for a wait that `signal` cancelled: exit 128 + its number.
pub(super) fn interrupted(key: &str, signal: Signal) -> CliError {
    let cancelled = leasehold::Error::Cancelled {
        key: key.to_owned(),
    };
    CliError::new(
        super::signal_exit_code(signal),
        format!("{cancelled} ({})", signal.as_str()),
    )
}
