//! [`EtcdOptions`]: where the lock records live and how long a request may
//! take.

use std::path::PathBuf;
use std::time::Duration;

use crate::backend::{check_idle_window, DEFAULT_IDLE_WINDOW};
use crate::error::{Error, Result};

/// The key prefix used when none is configured.
pub const DEFAULT_PREFIX: &str = "leasehold/";

/// Options of an [`EtcdBackend`](super::EtcdBackend).
///
/// ```
/// use leasehold::backends::etcd::EtcdOptions;
/// let opts = EtcdOptions::new().with_prefix("jobs/");
/// assert_eq!(opts.prefix(), "jobs/");
/// ```
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    pub(super) prefix: String,
    pub(super) connect_timeout: Duration,
    pub(super) request_timeout: Duration,
    pub(super) user: Option<(String, String)>,
    pub(super) tls: bool,
    pub(super) ca_file: Option<PathBuf>,
    pub(super) cert_file: Option<PathBuf>,
    pub(super) key_file: Option<PathBuf>,
    pub(super) domain: Option<String>,
    pub(super) idle_window: Option<Duration>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            prefix: DEFAULT_PREFIX.to_owned(),
            connect_timeout: Duration::from_secs(3),
            request_timeout: Duration::from_secs(5),
            user: None,
            tls: false,
            ca_file: None,
            cert_file: None,
            key_file: None,
            domain: None,
            idle_window: Some(DEFAULT_IDLE_WINDOW),
        }
    }
}

impl EtcdOptions {
    /// Defaults: prefix `leasehold/`, 3 s to connect, 5 s per request,
    /// no authentication, plain TCP.
    pub fn new() -> Self {
        Self::default()
    }

    setters! {
        /// The first part of every etcd key this store uses (default
        /// `leasehold/`): 1 to 64 bytes, no control characters. Stores with
        /// different prefixes on one cluster never see each other's locks.
        with_prefix(prefix: impl Into<String>) => prefix = prefix.into();

        /// How long opening a connection to a member may take (default 3 s).
        with_connect_timeout(timeout: Duration) => connect_timeout = timeout;

        /// How long one request may wait for its answer (default 5 s); past
        /// it the call fails with [`Error::Unavailable`](crate::Error::Unavailable).
        with_request_timeout(timeout: Duration) => request_timeout = timeout;

        /// Connect with TLS (`etcds://` sets it).
        with_tls(tls: bool) => tls = tls;

        /// PEM file of the certificate authority that signed the members'
        /// certificates (URL option `ca_file`; implies TLS).
        with_ca_file(path: impl Into<PathBuf>) => ca_file = Some(path.into());

        /// PEM files of a client certificate and its key, for members that
        /// check clients (URL options `cert_file`, `key_file`; implies TLS).
        with_client_cert(cert: impl Into<PathBuf>) => cert_file = Some(cert.into());

        /// The key of the client certificate (see [`with_client_cert`](Self::with_client_cert)).
        with_client_key(key: impl Into<PathBuf>) => key_file = Some(key.into());

        /// The name the members' certificates must carry, when it is not
        /// the host in the URL (URL option `domain`).
        with_domain(domain: impl Into<String>) => domain = Some(domain.into());

        /// How often the kind records of keys with no grant left are
        /// deleted: a pass after a release, at most one every half window
        /// (default an hour, so every 30 min; `None` keeps them). Grants and
        /// fencing tokens need no record to survive (docs/storage.md). URL:
        /// `?idle_window=30s|10m|1h|never`.
        with_idle_window(window: Option<Duration>) => idle_window = window;
    }

    /// Authenticate as `user` (the URL's `user:password@`).
    pub fn with_user(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether connections use TLS.
    pub fn uses_tls(&self) -> bool {
        self.tls || self.ca_file.is_some() || self.cert_file.is_some() || self.domain.is_some()
    }

    /// Checks the options before any I/O.
    pub(super) fn validate(&self) -> Result<()> {
        crate::key::check_name("prefix", &self.prefix, 64)?;
        for (what, timeout) in [
            ("connect timeout", self.connect_timeout),
            ("request timeout", self.request_timeout),
        ] {
            if timeout.is_zero() {
                return Err(Error::invalid(what, "must be longer than zero"));
            }
        }
        check_idle_window(self.idle_window)?;
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(Error::invalid(
                "client certificate",
                "cert_file and key_file go together",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_options_are_refused() {
        assert!(EtcdOptions::new().validate().is_ok());
        assert!(EtcdOptions::new().with_prefix("").validate().is_err());
        assert!(EtcdOptions::new().with_prefix("a\nb").validate().is_err());
        assert!(EtcdOptions::new()
            .with_request_timeout(Duration::ZERO)
            .validate()
            .is_err());
        assert!(EtcdOptions::new()
            .with_client_cert("c.pem")
            .validate()
            .is_err());
        assert!(EtcdOptions::new().with_ca_file("ca.pem").uses_tls());
    }
}
