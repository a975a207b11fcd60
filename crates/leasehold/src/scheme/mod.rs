//! A store URL taken apart once, before any I/O: which store it names,
//! where that store lives, and which query options are leasehold's own.
//!
//! [`open_backend`](crate::open::open_backend) and every tool that picks a
//! store from a URL (the `leasehold` CLI's demo, bench and torture) match on
//! what [`Scheme::parse`] returns instead of on the scheme's text.
//!
//! ```
//! use leasehold::scheme::{Location, Scheme};
//!
//! let (scheme, url) = Scheme::parse("memory://?listen=off")?;
//! assert_eq!(scheme, Scheme::Memory);
//! assert_eq!(url.location(), Location::InProcess);
//! assert!(!url.listen());
//! assert!(Scheme::parse("ftp://files").is_err());
//! # Ok::<(), leasehold::Error>(())
//! ```
//!
//! ```
//! # #[cfg(feature = "redis")] {
//! use leasehold::scheme::{Location, Scheme};
//!
//! let (scheme, url) = Scheme::parse("redis://cache:6380/2?prefix=jobs&protocol=resp3")?;
//! assert_eq!(scheme, Scheme::Redis);
//! assert_eq!(url.location(), Location::Tcp { default_port: 6379 });
//! assert_eq!(url.option("prefix"), Some("jobs"));
//! assert_eq!(url.driver_url(), "redis://cache:6380/2?protocol=resp3");
//! # }
//! # Ok::<(), leasehold::Error>(())
//! ```

use std::fmt;

pub(crate) mod options;

pub use options::parse_idle_window;

use options::{
    check_redis_option, ETCD_OPTIONS, MONGODB_OPTIONS, POSTGRES_DRIVER_OPTIONS, POSTGRES_OPTIONS,
    REDIS_DRIVER_OPTIONS, REDIS_OPTIONS, SQLITE_OPTIONS,
};

use crate::error::{Error, Result};

/// A store leasehold knows by URL scheme, whether or not this build has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// `memory://`: a store inside this process.
    Memory,
    /// `sqlite://PATH`: an SQLite file.
    Sqlite,
    /// `postgres://`, `postgresql://`: a PostgreSQL server.
    Postgres,
    /// `redis://`, `redis+unix://`, `rediss://`: a Redis server;
    /// `redis+cluster://`: a Redis Cluster.
    Redis,
    /// `mongodb://`, `mongodb+srv://`: a MongoDB deployment.
    Mongodb,
    /// `etcd://`, `etcds://` (TLS): an etcd v3 cluster.
    Etcd,
}

/// Where a store's data lives, seen from a client process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Location {
    /// Inside this process (`memory://`): other processes cannot share it.
    InProcess,
    /// A file on this host (`sqlite://PATH`).
    File,
    /// A server on this host behind a Unix socket (`redis+unix://`).
    UnixSocket,
    /// Servers found through DNS (`mongodb+srv://`).
    Discovered,
    /// A server over TCP, on `default_port` where the URL names no port.
    Tcp {
        /// The store's usual port.
        default_port: u16,
    },
}

/// Every scheme as written in URLs, with its store and location.
const SCHEMES: &[(&str, Scheme, Location)] = &[
    ("memory", Scheme::Memory, Location::InProcess),
    ("sqlite", Scheme::Sqlite, Location::File),
    (
        "postgres",
        Scheme::Postgres,
        Location::Tcp { default_port: 5432 },
    ),
    (
        "postgresql",
        Scheme::Postgres,
        Location::Tcp { default_port: 5432 },
    ),
    ("redis", Scheme::Redis, Location::Tcp { default_port: 6379 }),
    ("redis+unix", Scheme::Redis, Location::UnixSocket),
    (
        REDIS_CLUSTER,
        Scheme::Redis,
        Location::Tcp { default_port: 6379 },
    ),
    (
        "rediss",
        Scheme::Redis,
        Location::Tcp { default_port: 6379 },
    ),
    (
        "mongodb",
        Scheme::Mongodb,
        Location::Tcp {
            default_port: 27017,
        },
    ),
    ("mongodb+srv", Scheme::Mongodb, Location::Discovered),
    ("etcd", Scheme::Etcd, Location::Tcp { default_port: 2379 }),
    ("etcds", Scheme::Etcd, Location::Tcp { default_port: 2379 }),
];

/// Schemes whose connection is TLS (`valkeys` is the Redis driver's alias,
/// which `Scheme::parse` does not offer but a backend's own `connect` sees).
const TLS_SCHEMES: &[&str] = &["rediss", "valkeys", "etcds"];
/// The scheme of a Redis Cluster's seed list.
pub(crate) const REDIS_CLUSTER: &str = "redis+cluster";

/// Query options every store takes: waiters listen (`on`, the default) or
/// poll (`off`).
const LISTEN: &str = "listen";

impl Scheme {
    /// Parses `url`: the store it names and the URL's parts.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a URL without a scheme, an unknown scheme,
    /// a store not compiled into this build (naming the cargo feature), a
    /// `listen` option other than `on` or `off`, anything after `memory://`,
    /// or an SQLite URL without a path or with an unknown option. A store's
    /// other options are checked when it is opened. Messages never show the
    /// URL's password.
    pub fn parse(url: &str) -> Result<(Scheme, StoreUrl)> {
        Self::parse_unredacted(url).map_err(|e| e.without_secrets_of(url))
    }

    fn parse_unredacted(url: &str) -> Result<(Scheme, StoreUrl)> {
        let Some((written, rest)) = url.split_once("://") else {
            return Err(Error::invalid(
                "store url",
                format!(
                    "{:?} has no scheme; expected e.g. sqlite://PATH or memory://",
                    crate::redact::redact_url(url)
                ),
            ));
        };
        let Some(&(_, scheme, location)) = SCHEMES.iter().find(|(s, _, _)| *s == written) else {
            return Err(unknown_scheme(written));
        };
        if let Some(feature) = scheme.feature().filter(|_| !scheme.is_compiled_in()) {
            return Err(Error::invalid(
                "store url",
                format!(
                    "store {written:?} is not compiled into this build; enable cargo feature {feature:?}"
                ),
            ));
        }
        let (base, query) = rest.split_once('?').unwrap_or((rest, ""));
        let mut parsed = StoreUrl {
            location,
            path: None,
            backend_url: String::new(),
            driver_url: String::new(),
            options: Vec::new(),
            listen: true,
        };
        let mut store_pairs = Vec::new();
        let mut driver_pairs = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            if name == LISTEN {
                parsed.listen = match value {
                    "on" => true,
                    "off" => false,
                    other => {
                        return Err(Error::invalid(
                            "store url",
                            format!("listen must be on or off, got {other:?}"),
                        ))
                    }
                };
                continue;
            }
            store_pairs.push(pair);
            if scheme.own_options().contains(&name) {
                scheme.check_option(name, value, pair)?;
                parsed.options.push((name.to_owned(), value.to_owned()));
            } else if scheme.takes_driver_option(name) {
                driver_pairs.push(pair);
            } else if scheme.takes_driver_options() || scheme == Scheme::Etcd {
                // Named without its value: a misspelt option may carry a secret.
                return Err(scheme.unknown_driver_option(name));
            } else {
                return Err(scheme.unknown_option(pair));
            }
        }
        match scheme {
            Scheme::Memory if !base.is_empty() => {
                return Err(Error::invalid(
                    "store url",
                    format!("memory:// takes nothing after the scheme, got {base:?}"),
                ))
            }
            Scheme::Sqlite if base.is_empty() => {
                return Err(Error::invalid(
                    "store url",
                    "sqlite:// needs a file path, e.g. sqlite:///var/lib/app/locks.db",
                ))
            }
            Scheme::Sqlite => parsed.path = Some(base.to_owned()),
            _ => {}
        }
        let with_query = |pairs: &[&str]| {
            if pairs.is_empty() {
                format!("{written}://{base}")
            } else {
                format!("{written}://{base}?{}", pairs.join("&"))
            }
        };
        parsed.backend_url = with_query(&store_pairs);
        parsed.driver_url = with_query(&driver_pairs);
        Ok((scheme, parsed))
    }

    /// The store `url` names by its scheme alone (`None`: no scheme, or one
    /// leasehold does not know), without checking the rest: for a store's
    /// own constructor, which parses the rest itself.
    pub fn of(url: &str) -> Option<Scheme> {
        let (written, _) = url.split_once("://")?;
        SCHEMES
            .iter()
            .find(|(s, _, _)| *s == written)
            .map(|&(_, scheme, _)| scheme)
    }

    /// Whether `url`'s scheme asks for TLS (`rediss://`, and the driver's
    /// `valkeys://`), by the scheme alone.
    pub fn asks_for_tls(url: &str) -> bool {
        url.split_once("://")
            .is_some_and(|(written, _)| TLS_SCHEMES.contains(&written))
    }

    /// Whether `url` names the seed nodes of a Redis Cluster
    /// (`redis+cluster://HOST:PORT[,HOST:PORT...]`), by the scheme alone.
    pub fn names_a_cluster(url: &str) -> bool {
        url.split_once("://")
            .is_some_and(|(written, _)| written == REDIS_CLUSTER)
    }

    /// The store's name: `memory`, `sqlite`, `postgres`, `redis`, `mongodb`, `etcd`.
    pub fn name(self) -> &'static str {
        match self {
            Scheme::Memory => "memory",
            Scheme::Sqlite => "sqlite",
            Scheme::Postgres => "postgres",
            Scheme::Redis => "redis",
            Scheme::Mongodb => "mongodb",
            Scheme::Etcd => "etcd",
        }
    }

    /// The cargo feature that compiles the store in (`None`: always there).
    pub fn feature(self) -> Option<&'static str> {
        match self {
            Scheme::Memory => None,
            other => Some(other.name()),
        }
    }

    /// Whether this build has the store.
    pub fn is_compiled_in(self) -> bool {
        match self {
            Scheme::Memory => true,
            Scheme::Sqlite => cfg!(feature = "sqlite"),
            Scheme::Postgres => cfg!(feature = "postgres"),
            Scheme::Redis => cfg!(feature = "redis"),
            Scheme::Mongodb => cfg!(feature = "mongodb"),
            Scheme::Etcd => cfg!(feature = "etcd"),
        }
    }

    /// The query options that are leasehold's, not the driver's (besides
    /// `listen`, which every store takes).
    pub fn own_options(self) -> &'static [&'static str] {
        match self {
            Scheme::Memory => &[],
            Scheme::Mongodb => MONGODB_OPTIONS,
            Scheme::Sqlite => SQLITE_OPTIONS,
            Scheme::Postgres => POSTGRES_OPTIONS,
            Scheme::Redis => REDIS_OPTIONS,
            Scheme::Etcd => ETCD_OPTIONS,
        }
    }

    /// Whether options that are not leasehold's go to a driver (otherwise
    /// they are refused).
    fn takes_driver_options(self) -> bool {
        !matches!(self, Scheme::Memory | Scheme::Sqlite | Scheme::Etcd)
    }

    /// The driver's own query options that leasehold passes on, where the
    /// driver would otherwise ignore a misspelt one silently (sqlx logs and
    /// skips an unknown PostgreSQL parameter; redis-rs reads only the
    /// names it knows). `None`: the driver refuses unknown options itself
    /// (MongoDB's, with a "similar name" hint), before any I/O.
    fn driver_options(self) -> Option<&'static [&'static str]> {
        match self {
            Scheme::Postgres => Some(POSTGRES_DRIVER_OPTIONS),
            Scheme::Redis => Some(REDIS_DRIVER_OPTIONS),
            Scheme::Memory | Scheme::Sqlite | Scheme::Mongodb | Scheme::Etcd => None,
        }
    }

    /// Whether `name` is an option the driver takes (see
    /// [`driver_options`](Self::driver_options)).
    fn takes_driver_option(self, name: &str) -> bool {
        if !self.takes_driver_options() {
            return false;
        }
        match self.driver_options() {
            None => true,
            Some(known) => {
                known.contains(&name)
                    // sqlx's per-parameter form of `options`: options[search_path]=x
                    || (self == Scheme::Postgres
                        && name.starts_with("options[")
                        && name.ends_with(']'))
            }
        }
    }

    /// A store option that is neither leasehold's nor the driver's: named
    /// without its value (a misspelt `password` must not show its secret).
    fn unknown_driver_option(self, name: &str) -> Error {
        let mut allowed: Vec<&str> = vec![LISTEN];
        allowed.extend_from_slice(self.own_options());
        allowed.extend_from_slice(self.driver_options().unwrap_or(&[]));
        Error::invalid(
            "store url",
            format!(
                "unknown {} option {name:?}; allowed: {}",
                self.name(),
                allowed.join(", ")
            ),
        )
    }

    /// Checks the values the store does not check itself when opened, and
    /// those that must be numbers.
    fn check_option(self, name: &str, value: &str, pair: &str) -> Result<()> {
        match (self, name) {
            (Scheme::Sqlite, "synchronous") if !matches!(value, "full" | "normal") => {
                Err(self.unknown_option(pair))
            }
            (Scheme::Sqlite | Scheme::Postgres | Scheme::Mongodb | Scheme::Etcd, "idle_window") => {
                parse_idle_window(value).map(drop)
            }
            (Scheme::Redis, name) => check_redis_option(name, value),
            _ => Ok(()),
        }
    }

    fn unknown_option(self, pair: &str) -> Error {
        match self {
            Scheme::Sqlite => Error::invalid(
                "store url",
                format!(
                    "unknown sqlite option {pair:?}; allowed: synchronous=full|normal, idle_window=DURATION|never"
                ),
            ),
            _ => Error::invalid(
                "store url",
                format!(
                    "{}:// takes no option {pair:?}; allowed: listen=on|off",
                    self.name()
                ),
            ),
        }
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn unknown_scheme(written: &str) -> Error {
    let known: Vec<&str> = SCHEMES.iter().map(|(s, _, _)| *s).collect();
    Error::invalid(
        "store url",
        format!(
            "unknown scheme {written:?}; expected one of: {}",
            known.join(", ")
        ),
    )
}

/// The parts of a store URL, from [`Scheme::parse`].
///
/// Option values are as written in the URL (not percent-decoded); each
/// store decodes what it needs when it is opened.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    location: Location,
    path: Option<String>,
    backend_url: String,
    driver_url: String,
    options: Vec<(String, String)>,
    listen: bool,
}

impl StoreUrl {
    /// Where the store lives.
    pub fn location(&self) -> Location {
        self.location
    }

    /// The file of a file store (`sqlite://PATH`), as written.
    pub fn path(&self) -> Option<&str> {
        self.path.as_deref()
    }

    /// The URL for the store's own `connect`: all of it but `listen`.
    pub fn backend_url(&self) -> &str {
        &self.backend_url
    }

    /// The URL for the store's driver: leasehold's options taken out, the
    /// driver's kept (e.g. `redis://h?prefix=x&protocol=resp3` gives
    /// `redis://h?protocol=resp3`).
    pub fn driver_url(&self) -> &str {
        &self.driver_url
    }

    /// The last value of leasehold's own option `name` (see
    /// [`Scheme::own_options`]).
    pub fn option(&self, name: &str) -> Option<&str> {
        self.options
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// Leasehold's own options, in the order written.
    pub fn options(&self) -> impl Iterator<Item = (&str, &str)> {
        self.options.iter().map(|(n, v)| (n.as_str(), v.as_str()))
    }

    /// Whether waiters keep a listening connection (`listen=on`, the
    /// default) or poll with the holder's remaining ttl and a backoff.
    pub fn listen(&self) -> bool {
        self.listen
    }
}

/// Shows the URLs with their passwords masked.
impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreUrl")
            .field("location", &self.location)
            .field("path", &self.path)
            .field("backend_url", &crate::redact::redact_url(&self.backend_url))
            .field("driver_url", &crate::redact::redact_url(&self.driver_url))
            .field("options", &self.options)
            .field("listen", &self.listen)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn problem(url: &str) -> String {
        Scheme::parse(url).unwrap_err().to_string()
    }

    #[test]
    fn every_alias_names_its_store_and_location() {
        let tcp = |default_port| Location::Tcp { default_port };
        for (url, scheme, location) in [
            ("memory://", Scheme::Memory, Location::InProcess),
            ("sqlite:///tmp/x.db", Scheme::Sqlite, Location::File),
            ("postgres://u@h/db", Scheme::Postgres, tcp(5432)),
            ("postgresql://u@h/db", Scheme::Postgres, tcp(5432)),
            ("redis://h", Scheme::Redis, tcp(6379)),
            ("rediss://h", Scheme::Redis, tcp(6379)),
            ("redis+unix:///r.sock", Scheme::Redis, Location::UnixSocket),
            ("redis+cluster://a:7000,b:7001", Scheme::Redis, tcp(6379)),
            ("mongodb://h/db", Scheme::Mongodb, tcp(27017)),
            ("mongodb+srv://c/db", Scheme::Mongodb, Location::Discovered),
            ("etcd://a:2379,b:2379", Scheme::Etcd, tcp(2379)),
            ("etcds://a:2379?ca_file=/ca.pem", Scheme::Etcd, tcp(2379)),
        ] {
            if !scheme.is_compiled_in() {
                assert!(
                    problem(url).contains("not compiled into this build"),
                    "{url}"
                );
                continue;
            }
            let (parsed, parts) = Scheme::parse(url).unwrap();
            assert_eq!((parsed, parts.location()), (scheme, location), "{url}");
            assert_eq!(parts.backend_url(), url);
        }
    }

    #[test]
    #[cfg(feature = "etcd")]
    fn etcd_options_are_named_without_their_values() {
        let message = problem("etcd://h:2379?pasword=hunter22");
        assert!(
            message.contains("unknown etcd option \"pasword\""),
            "{message}"
        );
        assert!(message.contains("prefix, ca_file"), "{message}");
        assert!(!message.contains("hunter22"), "{message}");
        let (_, url) = Scheme::parse("etcd://h:2379?prefix=a/&listen=off").unwrap();
        assert_eq!(url.option("prefix"), Some("a/"));
        assert!(!url.listen());
    }

    #[test]
    fn tls_and_cluster_are_read_from_the_scheme() {
        assert!(Scheme::asks_for_tls("rediss://h"));
        assert!(Scheme::asks_for_tls("valkeys://h"));
        assert!(!Scheme::asks_for_tls("redis://rediss"));
        assert!(Scheme::names_a_cluster("redis+cluster://a:1,b:2"));
        assert!(!Scheme::names_a_cluster("redis://a:1"));
    }

    #[test]
    fn of_reads_the_scheme_alone() {
        for (url, scheme) in [
            ("postgresql://u@h/db?x=1", Some(Scheme::Postgres)),
            ("sqlite://", Some(Scheme::Sqlite)),
            ("mysql://h/db", None),
            ("postgres:/h", None),
        ] {
            assert_eq!(Scheme::of(url), scheme, "{url}");
        }
    }

    #[test]
    fn bad_urls_are_refused_with_specific_messages() {
        assert!(problem("locks.db").contains("has no scheme"));
        assert!(problem("ftp://x").contains("unknown scheme \"ftp\""));
        assert!(problem("memory://x").contains("takes nothing"));
        assert!(problem("memory://?cache=1").contains("memory:// takes no option \"cache=1\""));
        assert!(
            problem("memory://?listen=maybe").contains("listen must be on or off, got \"maybe\"")
        );
        assert!(!problem("memory://app:hunter22@host").contains("hunter22"));
        #[cfg(feature = "sqlite")]
        {
            assert!(problem("sqlite://").contains("needs a file path"));
            assert!(
                problem("sqlite:///tmp/x.db?mode=rw").contains("unknown sqlite option \"mode=rw\"")
            );
            assert!(
                problem("sqlite:///tmp/x.db?synchronous=off").contains("synchronous=full|normal")
            );
        }
    }

    #[test]
    fn unknown_options_are_refused_on_every_store() {
        assert!(problem("memory://?cache=1").contains("takes no option"));
        #[cfg(feature = "sqlite")]
        assert!(problem("sqlite:///tmp/x.db?mode=rw").contains("unknown sqlite option"));
        #[cfg(feature = "postgres")]
        {
            let message = problem("postgres://u:hunter22@h/db?max_conections=4");
            assert!(message.contains("unknown postgres option \"max_conections\""));
            assert!(message.contains("max_connections") && message.contains("sslmode"));
            let hidden = problem("postgres://h/db?pasword=hunter22");
            assert!(hidden.contains("\"pasword\"") && !hidden.contains("hunter22"));
            for good in [
                "postgres://h/db?sslmode=disable&application_name=x&max_connections=2",
                "postgresql://h/db?options[search_path]=app&pooler=pgbouncer",
            ] {
                assert!(Scheme::parse(good).is_ok(), "{good}");
            }
        }
        #[cfg(feature = "redis")]
        {
            assert!(problem("redis://h?prefx=a").contains("unknown redis option \"prefx\""));
            assert!(problem("redis+cluster://a:1,b:2?min_replica=1")
                .contains("unknown redis option \"min_replica\""));
            assert!(Scheme::parse("redis://h/2?prefix=a&protocol=resp3&min_replicas=1").is_ok());
        }
    }

    #[test]
    fn listen_and_own_options_are_taken_out() {
        let (_, url) = Scheme::parse("memory://?listen=off").unwrap();
        assert!(!url.listen());
        assert_eq!(url.backend_url(), "memory://");
        #[cfg(feature = "redis")]
        {
            let (_, url) =
                Scheme::parse("redis://:pw@h/2?listen=off&prefix=a&protocol=resp3").unwrap();
            assert!(!url.listen());
            assert_eq!(url.backend_url(), "redis://:pw@h/2?prefix=a&protocol=resp3");
            assert_eq!(url.driver_url(), "redis://:pw@h/2?protocol=resp3");
            assert_eq!(url.option("prefix"), Some("a"));
            assert!(!format!("{url:?}").contains("pw"));
            let (scheme, url) =
                Scheme::parse("redis+cluster://:pw@a:7000,b:7001?prefix=a&listen=off").unwrap();
            assert_eq!(scheme, Scheme::Redis);
            assert!(!url.listen());
            assert_eq!(url.option("prefix"), Some("a"));
            assert_eq!(url.driver_url(), "redis+cluster://:pw@a:7000,b:7001");
            let (_, url) = Scheme::parse("redis+cluster://a:1?min_replicas=1").unwrap();
            assert_eq!(url.option("min_replicas"), Some("1"));
            assert!(Scheme::parse("redis://h?min_replicas=one")
                .unwrap_err()
                .to_string()
                .contains("min_replicas must be a whole number"));
        }
        #[cfg(feature = "postgres")]
        {
            let (_, url) = Scheme::parse(
                "postgres://u@h/db?sslmode=disable&pooler=transaction&max_connections=3",
            )
            .unwrap();
            assert_eq!(url.driver_url(), "postgres://u@h/db?sslmode=disable");
            assert_eq!(
                url.options().collect::<Vec<_>>(),
                [("pooler", "transaction"), ("max_connections", "3")]
            );
        }
        #[cfg(feature = "sqlite")]
        {
            let (_, url) = Scheme::parse("sqlite://rel/x.db?synchronous=normal&listen=on").unwrap();
            assert_eq!(url.path(), Some("rel/x.db"));
            assert_eq!(url.option("synchronous"), Some("normal"));
            assert!(url.listen());
            assert_eq!(url.driver_url(), "sqlite://rel/x.db");
        }
    }
}
