//! The peak number of connections a run held on the store's server,
//! sampled on the server every 100 ms by a connection of the harness's own.
//!
//! What is counted, per store:
//! - PostgreSQL: rows of `pg_stat_activity` with the run's
//!   `application_name` (added to the URL the run's processes use unless it
//!   sets one), so other clients of the server are not counted and the
//!   sampler is not either;
//! - Redis: `connected_clients` of `INFO clients`, the whole server,
//!   including the sampler's own connection;
//! - MongoDB: `connections.current` of `serverStatus`, the whole server,
//!   including the sampler's own connections (a pooled one and the driver's
//!   monitor).
//!
//! SQLite and memory have no connections to count.

use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::scheme::Scheme;
use serde::Serialize;
use sqlx::Connection;
use tokio::task::JoinHandle;

const EVERY: Duration = Duration::from_millis(100);

/// What a run reports.
#[derive(Debug, Clone, Serialize)]
pub struct Peak {
    /// The most connections seen at once.
    pub peak: u64,
    /// What was counted, in words.
    pub counted: &'static str,
}

/// A running sampler; [`Sampler::finish`] stops it and gives the peak.
pub struct Sampler {
    task: JoinHandle<()>,
    peak: Arc<AtomicU64>,
    counted: &'static str,
}

impl Sampler {
    /// Stops sampling; the peak so far.
    pub fn finish(self) -> Peak {
        self.task.abort();
        Peak {
            peak: self.peak.load(Ordering::Relaxed),
            counted: self.counted,
        }
    }
}

/// `url` with an `application_name` the sampler can count by (PostgreSQL
/// only; other URLs, and one that names itself already, come back as they
/// are), and that name.
pub fn tag(url: &str, run: &str) -> (String, Option<String>) {
    if !matches!(Scheme::parse(url), Ok((Scheme::Postgres, _))) {
        return (url.to_owned(), None);
    }
    let query = url.split_once('?').map_or("", |(_, q)| q);
    if let Some(name) = query
        .split('&')
        .find_map(|p| p.strip_prefix("application_name="))
    {
        return (url.to_owned(), Some(name.to_owned()));
    }
    let name = format!("leasehold-{run}");
    let sep = if url.contains('?') { '&' } else { '?' };
    (format!("{url}{sep}application_name={name}"), Some(name))
}

/// Starts sampling the server behind `url` (as returned by [`tag`]); `None`
/// for a store without connections or one the sampler cannot reach (the
/// run then reports no figure rather than fail).
pub async fn start(url: &str, app: Option<&str>) -> Option<Sampler> {
    let peak = Arc::new(AtomicU64::new(0));
    let (counted, count) = counter(url, app).await?;
    let shared = peak.clone();
    let task = tokio::spawn(async move {
        let mut count = count;
        loop {
            if let Some(n) = count.next().await {
                shared.fetch_max(n, Ordering::Relaxed);
            }
            tokio::time::sleep(EVERY).await;
        }
    });
    Some(Sampler {
        task,
        peak,
        counted,
    })
}

/// One way of asking a server how many connections it has.
enum Counter {
    Postgres(sqlx::PgConnection, String),
    Redis(redis::aio::MultiplexedConnection),
    #[cfg(feature = "mongodb")]
    Mongo(mongodb::Database),
}

impl Counter {
    async fn next(&mut self) -> Option<u64> {
        match self {
            Counter::Postgres(conn, app) => sqlx::query_scalar::<_, i64>(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1",
            )
            .bind(&*app)
            .fetch_one(conn)
            .await
            .ok()
            .map(|n| n as u64),
            Counter::Redis(conn) => {
                let info: String = redis::cmd("INFO")
                    .arg("clients")
                    .query_async(conn)
                    .await
                    .ok()?;
                info.lines()
                    .find_map(|l| l.strip_prefix("connected_clients:"))
                    .and_then(|n| n.trim().parse().ok())
            }
            #[cfg(feature = "mongodb")]
            Counter::Mongo(db) => {
                let status = db
                    .run_command(mongodb::bson::doc! { "serverStatus": 1 })
                    .await
                    .ok()?;
                let current = status.get_document("connections").ok()?.get("current")?;
                match current {
                    mongodb::bson::Bson::Int32(n) => Some(*n as u64),
                    mongodb::bson::Bson::Int64(n) => Some(*n as u64),
                    mongodb::bson::Bson::Double(n) => Some(*n as u64),
                    _ => None,
                }
            }
        }
    }
}

async fn counter(url: &str, app: Option<&str>) -> Option<(&'static str, Counter)> {
    let (scheme, parsed) = Scheme::parse(url).ok()?;
    // The store's own options are not the driver's.
    let plain = parsed.driver_url();
    match scheme {
        Scheme::Postgres => {
            let app = app?.to_owned();
            // Named apart, so the sampler does not count itself.
            let options = sqlx::postgres::PgConnectOptions::from_str(plain)
                .ok()?
                .application_name("leasehold-connection-sampler");
            let conn = sqlx::PgConnection::connect_with(&options).await.ok()?;
            Some((
                "server side: pg_stat_activity rows with the run's application_name",
                Counter::Postgres(conn, app),
            ))
        }
        Scheme::Redis => {
            let client = redis::Client::open(plain).ok()?;
            let conn = client.get_multiplexed_async_connection().await.ok()?;
            Some((
                "server side: INFO connected_clients, whole server, sampler included",
                Counter::Redis(conn),
            ))
        }
        #[cfg(feature = "mongodb")]
        Scheme::Mongodb => {
            let mut options = mongodb::options::ClientOptions::parse(plain).await.ok()?;
            options.server_selection_timeout = Some(Duration::from_secs(3));
            options.max_pool_size = Some(1);
            let client = mongodb::Client::with_options(options).ok()?;
            Some((
                "server side: serverStatus connections.current, whole server, sampler included",
                Counter::Mongo(client.database("admin")),
            ))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_urls_get_a_name_to_count_by() {
        let (url, app) = tag("postgres://u@h/db", "r1");
        assert_eq!(url, "postgres://u@h/db?application_name=leasehold-r1");
        assert_eq!(app.as_deref(), Some("leasehold-r1"));
        let (url, app) = tag("postgres://u@h/db?application_name=mine", "r1");
        assert_eq!(url, "postgres://u@h/db?application_name=mine");
        assert_eq!(app.as_deref(), Some("mine"));
        assert_eq!(tag("redis://h", "r1"), ("redis://h".to_owned(), None));
    }
}
