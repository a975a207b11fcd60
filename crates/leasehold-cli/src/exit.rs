//! Exit codes (sysexits.h) and the one-line error the command prints.

use std::fmt;

/// Invalid usage or input.
pub const EX_USAGE: u8 = 64;
/// The key is a lock of another kind (a semaphore's key taken as a lock,
/// say): the command names the wrong key. sysexits' EX_DATAERR.
pub const EX_DATAERR: u8 = 65;
/// Store unreachable or failing.
pub const EX_UNAVAILABLE: u8 = 69;
/// Lease lost while running the command (the command was stopped).
pub const EX_LOST: u8 = 70;
/// Internal or operating-system failure (the runtime could not start, a
/// pipe or process could not be made): sysexits' EX_OSERR, so that it is
/// never mistaken for a lost lease.
pub const EX_INTERNAL: u8 = 71;
/// The name the other modules use for [`EX_INTERNAL`].
pub const EX_SOFTWARE: u8 = EX_INTERNAL;
/// Not acquired within the wait bound.
pub const EX_TEMPFAIL: u8 = 75;
/// `torture`: the checker found a violation.
pub const EX_VIOLATION: u8 = 1;
/// `torture`: no violation, but the run did not test what it was asked to
/// (a fault kind never landed on a holder, no renewal, ...).
pub const EX_INCONCLUSIVE: u8 = 2;
/// Interrupted by SIGINT while waiting (128 + 2); SIGTERM gives 143,
/// SIGHUP 129 (128 + the signal's number, as shells report it).
pub const EX_INTERRUPTED: u8 = 130;

/// An error with the exit code it maps to; printed as one line.
#[derive(Debug)]
pub struct CliError {
    /// The process exit code.
    pub code: u8,
    message: String,
}

impl CliError {
    /// An error exiting with `code`.
    pub fn new(code: u8, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
        }
    }

    /// Invalid usage or input (64).
    pub fn usage(message: impl Into<String>) -> Self {
        Self::new(EX_USAGE, message)
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl From<leasehold::Error> for CliError {
    fn from(e: leasehold::Error) -> Self {
        use leasehold::Error as E;
        let code = match &e {
            E::InvalidInput { .. } => EX_USAGE,
            E::Busy { .. } | E::Timeout { .. } => EX_TEMPFAIL,
            E::Cancelled { .. } => EX_INTERRUPTED,
            E::LeaseLost { .. } => EX_LOST,
            E::KindMismatch { .. } => EX_DATAERR,
            // Unavailable, Backend, and variants added later.
            _ => EX_UNAVAILABLE,
        };
        CliError::new(code, error_chain(&e))
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError::new(EX_INTERNAL, e.to_string())
    }
}

/// The error and its causes on one line: "store unavailable: ...: refused"
/// (the library's rule, with line breaks flattened for the terminal).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    leasehold::error_chain(e).replace('\n', " ")
}
