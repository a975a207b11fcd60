//! Connecting a MongoDB store: the driver's lock-client defaults, the
//! lease collection's read and write concerns, the first measure of the
//! server's clock and the change stream.

use std::sync::Arc;
use std::time::Duration;

use mongodb::options::{ClientOptions, CollectionOptions, ReadConcern, ServerMonitoringMode};
use mongodb::Database;

use super::clock::ServerClock;
use super::{helpers, watch, Inner, MongoBackend, MongoOptions};
use crate::backend::SweepSchedule;
use crate::error::{Error, Result};
use crate::scheme::parse_idle_window;

/// Database used when the URL names none.
pub(super) const DEFAULT_DATABASE: &str = "leasehold";
/// Fail fast when the server is down: the driver's default is 30 s.
pub(super) const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Pool size per server unless the URL sets `maxPoolSize` (the driver's
/// default is 10): the change stream's waiting read holds one connection,
/// the lock operations, one short write each, share the other.
pub const DEFAULT_MAX_POOL_SIZE: u32 = 2;
/// How long an unused pooled connection stays open unless the URL sets
/// `maxIdleTimeMS` (the driver keeps them forever).
pub const DEFAULT_MAX_IDLE_TIME: Duration = Duration::from_secs(5);

impl MongoBackend {
    connect_methods! {
        /// Connects to the server at `url` (`mongodb://host:port/db?options`;
        /// database `leasehold` if the URL names none) with default options.
        ///
        /// The driver gets lock-client defaults unless the URL sets them:
        /// `maxPoolSize` [`DEFAULT_MAX_POOL_SIZE`], `minPoolSize` 0,
        /// `maxIdleTimeMS` [`DEFAULT_MAX_IDLE_TIME`], `serverMonitoringMode`
        /// `poll`. A process then holds at most `maxPoolSize` connections per
        /// server plus one monitoring connection per server (streaming
        /// monitoring would take two).
        ///
        /// # Errors
        /// [`Error::InvalidInput`] for a malformed URL; [`Error::Unavailable`] if
        /// the server cannot be reached within about 3 s (unless the URL sets
        /// `serverSelectionTimeoutMS`/`connectTimeoutMS`).
        ///
        /// # Cancel safety
        /// Cancel safe: nothing is written.
        connect;

        /// As [`connect`](Self::connect), with `options`.
        ///
        /// # Errors
        /// As [`connect`](Self::connect); [`Error::InvalidInput`] for bad options.
        ///
        /// # Cancel safety
        /// Cancel safe: nothing is written.
        connect_with(options: MongoOptions);
    }

    async fn connect_to(url: &str, options: MongoOptions) -> Result<Self> {
        // leasehold's own URL options out, the driver's kept; a URL the
        // scheme parser refuses goes to the driver whole, for its message.
        let (options, url) = match crate::scheme::Scheme::parse(url) {
            Ok((_, parts)) => {
                let options = match parts.option("idle_window") {
                    Some(window) => options.with_idle_window(parse_idle_window(window)?),
                    None => options,
                };
                (options, parts.driver_url().to_owned())
            }
            Err(_) => (options, url.to_owned()),
        };
        options.validate()?;
        let mut client_options = ClientOptions::parse(&url).await.map_err(|e| {
            // The driver's own sentence, not its whole error dump.
            let context = match &*e.kind {
                mongodb::error::ErrorKind::InvalidArgument { message, .. } => {
                    format!("not a MongoDB URL ({message})")
                }
                _ => "not a MongoDB URL".to_owned(),
            };
            Error::InvalidInput {
                what: "store url",
                problem: context,
                source: Some(e.into()),
            }
        })?;
        client_options
            .connect_timeout
            .get_or_insert(CONNECT_TIMEOUT);
        client_options
            .app_name
            .get_or_insert_with(|| "leasehold".to_owned());
        client_options
            .max_pool_size
            .get_or_insert(DEFAULT_MAX_POOL_SIZE);
        client_options
            .max_idle_time
            .get_or_insert(DEFAULT_MAX_IDLE_TIME);
        // One monitoring connection per server instead of two (a streaming
        // monitor and a round-trip timer); a failed operation still has
        // the server checked at once.
        client_options
            .server_monitoring_mode
            .get_or_insert(ServerMonitoringMode::Poll);
        let (_, db) =
            helpers::client_and_database(client_options, DEFAULT_DATABASE, CONNECT_TIMEOUT)?;
        Self::build(db, options, true).await
    }

    /// Uses the collection named in `options` of the application's own
    /// database handle (and its client's connection pool).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for bad options (before any I/O);
    /// [`Error::Unavailable`] if the server cannot be reached to measure its
    /// clock; [`Error::Backend`] if it does not report its clock.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    pub async fn from_database(db: Database, options: MongoOptions) -> Result<Self> {
        Self::build(db, options, false).await
    }

    async fn build(db: Database, options: MongoOptions, owns_client: bool) -> Result<Self> {
        options.validate()?;
        let coll = db.collection_with_options(
            options.collection(),
            CollectionOptions::builder()
                .write_concern(options.write_concern().clone())
                .read_concern(ReadConcern::majority())
                .build(),
        );
        let clock = ServerClock::measure(&db, options.clock_skew_us()).await?;
        Ok(MongoBackend {
            inner: Arc::new(Inner {
                watcher: watch::notifier(coll.clone()),
                db,
                coll,
                clock,
                owns_client,
                sweeper: SweepSchedule::new(options.idle_window()),
                #[cfg(test)]
                stale_read: std::sync::Mutex::default(),
            }),
        })
    }
}
