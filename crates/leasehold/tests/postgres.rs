//! PostgreSQL-specific behaviour beyond the conformance suite: input checks
//! before I/O, a server that is down, cross-process waking and its
//! reconnection, the same-transaction lease check, fenced writes, and the
//! row-lock / optimistic helpers. Against the real server in
//! `LEASEHOLD_TEST_POSTGRES` (skipped without it, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).
#![cfg(all(feature = "conformance", feature = "postgres"))]

use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::backends::postgres::{PostgresBackend, PostgresOptions};
use leasehold::conformance::server_url;
use leasehold::occ::{Attempt, RetryError, RetryPolicy};
use leasehold::rowlock::{
    retry_transaction, with_locked_rows, Isolation, LockMode, RowLockOptions,
};
use leasehold::{Acquire, AcquireRequest, Backend, Error, Key, Lease, Locks};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::Row;
use tokio::time::{sleep, timeout, Instant};

fn url() -> Option<String> {
    server_url("LEASEHOLD_TEST_POSTGRES")
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

/// A port on 127.0.0.1 with nothing listening (bound, then released).
fn closed_port() -> u16 {
    let socket = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    socket.local_addr().unwrap().port()
}

async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .connect(url)
        .await
        .expect("connect to LEASEHOLD_TEST_POSTGRES")
}

async fn grant(backend: &PostgresBackend, key: &str, ttl: Duration) -> Lease {
    let req = AcquireRequest::new(Key::new(key).unwrap(), ttl, "test").unwrap();
    match backend.try_acquire(&req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        Acquire::Busy(b) => panic!("{key} is held: {b:?}"),
    }
}

/// A resource table for the inventory tests: `products(id, stock, version, fence)`.
async fn products(pool: &PgPool, stock: i32) -> String {
    let table = unique("products");
    sqlx::query(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, stock INT NOT NULL, \
         version BIGINT NOT NULL DEFAULT 0, fence BIGINT NOT NULL DEFAULT 0)"
    ))
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(&format!(
        "INSERT INTO {table} (id, stock) VALUES (1, $1), (2, $1)"
    ))
    .bind(stock)
    .execute(pool)
    .await
    .unwrap();
    table
}

async fn drop_table(pool: &PgPool, table: &str) {
    sqlx::query(&format!("DROP TABLE IF EXISTS {table}"))
        .execute(pool)
        .await
        .unwrap();
}

async fn stock(pool: &PgPool, table: &str, id: i64) -> i32 {
    sqlx::query_scalar(&format!("SELECT stock FROM {table} WHERE id = $1"))
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn bad_options_are_rejected_before_io() {
    // Nothing listens on this port: an attempt to connect would answer
    // Unavailable (after the acquire timeout), not InvalidInput.
    let down = format!("postgres://postgres@127.0.0.1:{}/test", closed_port());
    let started = Instant::now();
    for table in ["", "a.b.c", "x\"; DROP TABLE y; --", "9lives"] {
        let options = PostgresOptions::new().with_table(table);
        match PostgresBackend::connect_with(&down, options.clone()).await {
            Err(Error::InvalidInput {
                what: "table name", ..
            }) => {}
            other => panic!("table {table:?}: expected InvalidInput, got {other:?}"),
        }
        let lazy = PgPool::connect_lazy(&down).unwrap();
        match PostgresBackend::from_pool(lazy, options).await {
            Err(Error::InvalidInput {
                what: "table name", ..
            }) => {}
            other => panic!("table {table:?}: expected InvalidInput, got {other:?}"),
        }
    }
    match PostgresBackend::connect("postgres://u:secret@h:notaport/db").await {
        Err(
            e @ Error::InvalidInput {
                what: "store url", ..
            },
        ) => {
            assert!(!e.to_string().contains("secret"), "password leaked: {e}")
        }
        other => panic!("expected InvalidInput, got {other:?}"),
    }
    // The listener is a connection of its own: one data connection is fine,
    // none is not.
    let none = PostgresOptions::new().with_max_connections(0);
    assert!(matches!(
        PostgresBackend::connect_with(&down, none).await,
        Err(Error::InvalidInput {
            what: "max_connections",
            ..
        })
    ));
    let lazy = PgPoolOptions::new()
        .max_connections(1)
        .connect_lazy(&down)
        .unwrap();
    assert!(matches!(
        PostgresBackend::from_pool(lazy, PostgresOptions::new()).await,
        Err(Error::InvalidInput {
            what: "max_connections",
            ..
        })
    ));
    let bad_listen = PostgresOptions::new().with_listen_url("mysql://x");
    assert!(matches!(
        PostgresBackend::connect_with(&down, bad_listen).await,
        Err(Error::InvalidInput {
            what: "listen url",
            ..
        })
    ));
    let no_wait = PostgresOptions::new().with_acquire_timeout(Duration::ZERO);
    assert!(matches!(
        PostgresBackend::connect_with(&down, no_wait).await,
        Err(Error::InvalidInput {
            what: "acquire_timeout",
            ..
        })
    ));
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "validation must not wait for the server"
    );
}

#[tokio::test]
async fn server_down_is_unavailable_within_the_acquire_timeout() {
    let down = format!("postgres://postgres@127.0.0.1:{}/test", closed_port());
    let started = Instant::now();
    let err = PostgresBackend::connect(&down).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    assert!(err.is_retryable());
    // The cause, not just the pool's "timed out".
    assert!(err.to_string().contains("refused"), "{err}");
    let err = Locks::open(&down).await.unwrap_err();
    assert!(matches!(err, Error::Unavailable { .. }), "{err:?}");
    // Two connects of 5 s each at most; the CLI needs under 10 s for one.
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn migration_is_idempotent_and_table_is_configurable() {
    let Some(url) = url() else { return };
    let pool = pool(&url).await;
    let table = unique("Locks");
    let options = PostgresOptions::new().with_table(&table);
    // Concurrent first starts must not trip over each other's CREATE TABLE.
    let backends =
        futures_join((0..4).map(|_| PostgresBackend::from_pool(pool.clone(), options.clone())))
            .await;
    let backend = backends.into_iter().next().unwrap();
    assert!(backend.migration_sql().contains(&format!("\"{table}\"")));
    let lease = grant(&backend, "k", Duration::from_secs(5)).await;
    // Quoted, so the mixed-case name is kept as given.
    let fence: i64 = sqlx::query_scalar(&format!("SELECT fence FROM \"{table}\" WHERE key = 'k'"))
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(fence as u64, lease.token());
    backend.release(&lease).await.unwrap();
    let kept: Option<String> =
        sqlx::query_scalar(&format!("SELECT owner FROM \"{table}\" WHERE key = 'k'"))
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(
        kept, None,
        "release frees the row but keeps it (and its fence)"
    );
    drop_table(&pool, &format!("\"{table}\"")).await;
}

async fn futures_join<F, T>(futures: impl Iterator<Item = F>) -> Vec<T>
where
    F: std::future::Future<Output = leasehold::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap().expect("concurrent migration"));
    }
    out
}

#[tokio::test]
async fn release_in_another_process_wakes_a_waiter() {
    let Some(url) = url() else { return };
    // Two backends, two pools: the waiter can only learn of the release
    // through NOTIFY, as another process would.
    let waiter = PostgresBackend::connect(&url).await.unwrap();
    let releaser = PostgresBackend::connect(&url).await.unwrap();
    let key = Key::new(unique("wake")).unwrap();
    let lease = grant(&releaser, key.as_str(), Duration::from_secs(60)).await;
    let mut sub = waiter.subscribe(&key).await.unwrap();
    assert!(sub.is_live());
    releaser.release(&lease).await.unwrap();
    timeout(Duration::from_secs(5), sub.notified())
        .await
        .expect("NOTIFY from another backend wakes the waiter");
}

/// The pid of the LISTEN connection whose application_name is `app`.
async fn listener_pid(admin: &PgPool, app: &str) -> Option<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN%'",
    )
    .bind(app)
    .fetch_optional(admin)
    .await
    .unwrap()
}

#[tokio::test]
async fn listener_reconnects_after_its_connection_is_killed() {
    let Some(url) = url() else { return };
    let admin = pool(&url).await;
    let app = unique("leasehold_listen_test");
    let options = PgConnectOptions::from_str(&url)
        .unwrap()
        .application_name(&app);
    let waiter_pool = PgPoolOptions::new().connect_with(options).await.unwrap();
    let waiter = PostgresBackend::from_pool(waiter_pool, PostgresOptions::new())
        .await
        .unwrap();
    let releaser = PostgresBackend::connect(&url).await.unwrap();
    let key = Key::new(unique("reconnect")).unwrap();

    let first = waiter.subscribe(&key).await.unwrap();
    let old_pid = listener_pid(&admin, &app).await.expect("LISTEN connection");
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(old_pid)
        .fetch_one(&admin)
        .await
        .unwrap();
    assert!(killed);
    drop(first);

    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match listener_pid(&admin, &app).await {
            Some(pid) if pid != old_pid => break,
            _ if Instant::now() > deadline => panic!("LISTEN connection not re-established"),
            _ => sleep(Duration::from_millis(50)).await,
        }
    }
    // Subscribed after the reconnect, so only a real NOTIFY can wake it.
    let lease = grant(&releaser, key.as_str(), Duration::from_secs(60)).await;
    let mut sub = waiter.subscribe(&key).await.unwrap();
    releaser.release(&lease).await.unwrap();
    timeout(Duration::from_secs(5), sub.notified())
        .await
        .expect("woken through the re-established LISTEN connection");
}

/// A LISTEN connection that cannot be made (here: a server that accepts
/// the connection and never answers, as a hung pooler does) must not hold
/// waiters past their bound: before, the first waiter blocked in
/// `subscribe` on the connection attempt, and every other waiter queued
/// behind it on a mutex.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_listen_connection_does_not_stretch_the_wait() {
    let Some(url) = url() else { return };
    let black_hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen_url = format!(
        "postgres://postgres@{}/test",
        black_hole.local_addr().unwrap()
    );
    let holder = PostgresBackend::connect(&url).await.unwrap();
    let waiter = Locks::new(
        PostgresBackend::connect_with(&url, PostgresOptions::new().with_listen_url(&listen_url))
            .await
            .unwrap(),
    );
    let key = unique("stalled_listen");
    let lease = grant(&holder, &key, Duration::from_secs(30)).await;

    let wait = Duration::from_millis(300);
    // Honest slack for a loaded machine; before, this took the pool's
    // connect timeout (seconds) per waiter, one after the other.
    let bound = wait + Duration::from_millis(700);
    let started = Instant::now();
    let waits = (0..2).map(|_| {
        let (waiter, key) = (waiter.clone(), key.clone());
        async move {
            let e = timeout(Duration::from_secs(10), waiter.acquire(&key, wait))
                .await
                .expect("the wait ends")
                .unwrap_err();
            (e, started.elapsed())
        }
    });
    let handles: Vec<_> = waits.map(tokio::spawn).collect();
    for h in handles {
        let (e, took) = h.await.unwrap();
        assert!(matches!(e, Error::Timeout { .. }), "{e:?}");
        assert!(took < bound, "a {wait:?} wait took {took:?}");
    }
    holder.release(&lease).await.unwrap();
    drop(black_hole);
}

/// A TCP proxy in front of the server whose connections the test can cut,
/// and which then refuses new ones until resumed: a network outage.
struct Proxy {
    addr: std::net::SocketAddr,
    refusing: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl Proxy {
    async fn start(target: String) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let refusing = Arc::new(AtomicBool::new(false));
        let links = Arc::new(Mutex::new(Vec::new()));
        let accept = tokio::spawn({
            let (refusing, links) = (refusing.clone(), links.clone());
            async move {
                while let Ok((mut inbound, _)) = listener.accept().await {
                    if refusing.load(Ordering::SeqCst) {
                        continue; // dropped: the client sees the connection close
                    }
                    let target = target.clone();
                    let link = tokio::spawn(async move {
                        if let Ok(mut out) = tokio::net::TcpStream::connect(target).await {
                            let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                        }
                    });
                    links.lock().unwrap().push(link);
                }
            }
        });
        Proxy {
            addr,
            refusing,
            links,
            accept,
        }
    }

    /// Closes every connection and refuses new ones.
    fn cut(&self) {
        self.refusing.store(true, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    fn resume(&self) {
        self.refusing.store(false, Ordering::SeqCst);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// Waiters are woken when LISTEN is back after an outage, not before: a
/// waiter woken earlier retries, finds the key still held, and then misses
/// the release that follows while nobody listens. Before, every failed
/// reconnect woke all waiters, and the successful one (inside sqlx) woke
/// nobody, so a release during the outage was never heard.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_are_woken_once_listen_is_back_and_not_before() {
    let Some(url) = url() else { return };
    let server = PgConnectOptions::from_str(&url).unwrap();
    let target = format!("{}:{}", server.get_host(), server.get_port());
    let proxy = Proxy::start(target.clone()).await;
    let listen_url = url.replacen(&target, &proxy.addr.to_string(), 1);
    assert_ne!(listen_url, url, "the listen URL goes through the proxy");
    let waiter =
        PostgresBackend::connect_with(&url, PostgresOptions::new().with_listen_url(&listen_url))
            .await
            .unwrap();
    let releaser = PostgresBackend::connect(&url).await.unwrap();
    let key = Key::new(unique("relisten")).unwrap();
    let lease = grant(&releaser, key.as_str(), Duration::from_secs(60)).await;
    let mut sub = waiter.subscribe(&key).await.unwrap();
    assert!(sub.is_live());

    proxy.cut();
    // Announced while nobody listens: lost.
    releaser.release(&lease).await.unwrap();
    assert!(
        timeout(Duration::from_secs(1), sub.notified())
            .await
            .is_err(),
        "woken while LISTEN was down: the waiter would retry too early"
    );
    proxy.resume();
    timeout(Duration::from_secs(10), sub.notified())
        .await
        .expect("woken once LISTEN is back, to find the key released");
}

#[tokio::test]
async fn check_in_rejects_a_stale_holder_and_admits_the_current_one() {
    let Some(url) = url() else { return };
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let key = unique("checkin");
    let a = grant(&backend, &key, Duration::from_millis(300)).await;

    let mut tx = backend.pool().begin().await.unwrap();
    backend
        .check_in(&mut tx, &a)
        .await
        .expect("A holds the lease");
    tx.rollback().await.unwrap();

    sleep(Duration::from_millis(600)).await;
    // Expired, nobody took it yet: already rejected by the server's clock.
    let mut tx = backend.pool().begin().await.unwrap();
    match backend.check_in(&mut tx, &a).await {
        Err(Error::LeaseLost { key: k }) => assert_eq!(k, key),
        other => panic!("expected LeaseLost, got {other:?}"),
    }
    tx.rollback().await.unwrap();

    let b = grant(&backend, &key, Duration::from_secs(30)).await;
    let mut tx = backend.pool().begin().await.unwrap();
    assert!(matches!(
        backend.check_in(&mut tx, &a).await,
        Err(Error::LeaseLost { .. })
    ));
    tx.rollback().await.unwrap();
    let mut tx = backend.pool().begin().await.unwrap();
    backend.check_in(&mut tx, &b).await.expect("B holds it now");
    tx.commit().await.unwrap();
}

#[tokio::test]
async fn check_in_holds_off_takeover_until_the_transaction_ends() {
    let Some(url) = url() else { return };
    let backend = PostgresBackend::connect(&url).await.unwrap();
    // A pool of its own: on the shared connection (the default) a
    // statement waits at most 50 ms for a row lock (postgres_shared.rs).
    let options = PostgresOptions::new().with_max_connections(2);
    let other = PostgresBackend::connect_with(&url, options).await.unwrap();
    let table = products(backend.pool(), 10).await;
    let key = unique("checkin-hold");
    let a = grant(&backend, &key, Duration::from_millis(500)).await;

    let mut tx = backend.pool().begin().await.unwrap();
    backend.check_in(&mut tx, &a).await.unwrap();
    // A's lease runs out by the clock while its transaction is open...
    sleep(Duration::from_millis(800)).await;
    let k = Key::new(key.clone()).unwrap();
    let mut acquire = tokio::spawn({
        let other = other.clone();
        // A waiting caller's attempt: it may queue on the row lock for up
        // to 10 s (a try-once attempt would report the key busy instead).
        let req = AcquireRequest::new(k.clone(), Duration::from_secs(30), "b")
            .unwrap()
            .with_lock_deadline(Instant::now() + Duration::from_secs(10));
        async move { other.try_acquire(&req).await }
    });
    let mut force = tokio::spawn({
        let other = other.clone();
        async move { other.force_release(&k).await }
    });
    // ...but nobody can take the key while A's FOR SHARE lock stands.
    assert!(timeout(Duration::from_millis(500), &mut acquire)
        .await
        .is_err());
    assert!(timeout(Duration::from_millis(100), &mut force)
        .await
        .is_err());
    sqlx::query(&format!(
        "UPDATE {table} SET stock = stock - 1 WHERE id = 1"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();

    let granted = timeout(Duration::from_secs(10), acquire)
        .await
        .expect("acquire proceeds after A commits")
        .unwrap()
        .unwrap();
    timeout(Duration::from_secs(10), force)
        .await
        .expect("force-release proceeds after A commits")
        .unwrap()
        .unwrap();
    // Whichever ran first after the commit, A's lease was expired or broken.
    match granted {
        Acquire::Granted(b) => assert!(b.token() > a.token()),
        Acquire::Busy(busy) => panic!("acquire after A's commit found {busy:?}"),
    }
    assert_eq!(
        stock(backend.pool(), &table, 1).await,
        9,
        "A's write committed"
    );
    drop_table(backend.pool(), &table).await;
}

#[tokio::test]
async fn fenced_write_rejects_a_lower_token() {
    let Some(url) = url() else { return };
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let table = products(backend.pool(), 10).await;
    let key = unique("fenced");
    let fenced_write = |token: u64, stock: i32| {
        let pool = backend.pool().clone();
        let sql =
            format!("UPDATE {table} SET stock = $2, fence = $3 WHERE id = $1 AND fence <= $3");
        async move {
            sqlx::query(&sql)
                .bind(1_i64)
                .bind(stock)
                .bind(token as i64)
                .execute(&pool)
                .await
                .unwrap()
                .rows_affected()
        }
    };
    let a = grant(&backend, &key, Duration::from_secs(30)).await;
    assert_eq!(fenced_write(a.token(), 9).await, 1);
    // A is evicted (it paused, say); B takes over and writes.
    assert!(backend.force_release(a.key()).await.unwrap());
    let b = grant(&backend, &key, Duration::from_secs(30)).await;
    assert!(b.token() > a.token());
    assert_eq!(fenced_write(b.token(), 5).await, 1);
    // A wakes up and writes with its old token: rejected.
    assert_eq!(fenced_write(a.token(), 8).await, 0);
    assert_eq!(stock(backend.pool(), &table, 1).await, 5);
    assert_eq!(
        fenced_write(b.token(), 4).await,
        1,
        "the same token may write again"
    );
    drop_table(backend.pool(), &table).await;
}

/// Holds a row lock on `products.id = 1` in an open transaction.
async fn lock_row(pool: &PgPool, table: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(&format!("SELECT 1 FROM {table} WHERE id = 1 FOR UPDATE"))
        .execute(&mut *tx)
        .await
        .unwrap();
    tx
}

#[tokio::test]
async fn row_lock_modes_and_lock_timeout() {
    let Some(url) = url() else { return };
    let pool = pool(&url).await;
    let table = products(&pool, 10).await;
    let select = format!("SELECT id FROM {table} ORDER BY id");
    let select_one = format!("SELECT id FROM {table} WHERE id = $1");
    let held = lock_row(&pool, &table).await;

    let nowait = RowLockOptions::new()
        .with_mode(LockMode::NoWait)
        .with_label("products:1");
    let result = with_locked_rows(
        &pool,
        &nowait,
        &select_one,
        |q| q.bind(1_i64),
        |_, _| Box::pin(async { Ok(()) }),
    )
    .await;
    match result {
        Err(Error::Busy { key, holder, .. }) => {
            assert_eq!(
                (key.as_str(), holder.as_str()),
                ("products:1", "another transaction")
            )
        }
        other => panic!("NOWAIT on a locked row: expected Busy, got {other:?}"),
    }

    let bounded = RowLockOptions::new().with_lock_timeout(Duration::from_millis(200));
    let result = with_locked_rows(
        &pool,
        &bounded,
        &select_one,
        |q| q.bind(1_i64),
        |_, _| Box::pin(async { Ok(()) }),
    )
    .await;
    assert!(matches!(result, Err(Error::Busy { .. })), "{result:?}");

    let skip = RowLockOptions::new().with_mode(LockMode::SkipLocked);
    let ids: Vec<i64> = with_locked_rows(
        &pool,
        &skip,
        &select,
        |q| q,
        |_, rows| Box::pin(async move { rows.iter().map(|r| r.try_get::<i64, _>(0)).collect() }),
    )
    .await
    .unwrap();
    assert_eq!(ids, vec![2_i64], "the locked row is skipped");

    held.rollback().await.unwrap();
    let bad = RowLockOptions::new().with_lock_timeout(Duration::ZERO);
    assert!(matches!(
        with_locked_rows(
            &pool,
            &bad,
            &select,
            |q| q,
            |_, _| Box::pin(async { Ok(()) })
        )
        .await,
        Err(Error::InvalidInput {
            what: "lock_timeout",
            ..
        })
    ));
    drop_table(&pool, &table).await;
}

#[tokio::test]
async fn row_lock_sells_exactly_the_stock_and_rolls_back_on_error() {
    let Some(url) = url() else { return };
    let pool = pool(&url).await;
    let table = products(&pool, 5).await;
    let select = format!("SELECT stock FROM {table} WHERE id = $1");
    let update = format!("UPDATE {table} SET stock = stock - 1 WHERE id = $1");
    let buyers = (0..12).map(|_| {
        let (pool, select, update) = (pool.clone(), select.clone(), update.clone());
        tokio::spawn(async move {
            with_locked_rows(
                &pool,
                &RowLockOptions::new(),
                &select,
                |q| q.bind(1_i64),
                |tx, rows| {
                    Box::pin(async move {
                        let stock: i32 = rows[0].try_get(0)?;
                        // Widen the read-then-write window: without the row lock
                        // concurrent buyers would all see the same stock.
                        sleep(Duration::from_millis(5)).await;
                        if stock == 0 {
                            return Ok(false);
                        }
                        sqlx::query(&update).bind(1_i64).execute(&mut *tx).await?;
                        Ok(true)
                    })
                },
            )
            .await
        })
    });
    let mut sold = 0;
    for b in buyers.collect::<Vec<_>>() {
        sold += b.await.unwrap().unwrap() as i32;
    }
    assert_eq!((sold, stock(&pool, &table, 1).await), (5, 0), "no oversell");

    // An error from the closure rolls its writes back.
    let result = with_locked_rows(
        &pool,
        &RowLockOptions::new(),
        &select,
        |q| q.bind(2_i64),
        |tx, _| {
            let update = update.clone();
            Box::pin(async move {
                sqlx::query(&update).bind(2_i64).execute(&mut *tx).await?;
                sqlx::query("SELECT 1/0").execute(&mut *tx).await?;
                Ok(())
            })
        },
    )
    .await;
    assert!(matches!(result, Err(Error::Backend { .. })), "{result:?}");
    assert_eq!(stock(&pool, &table, 2).await, 5);
    drop_table(&pool, &table).await;
}

#[tokio::test]
async fn optimistic_retries_version_conflicts_and_serialization_failures() {
    let Some(url) = url() else { return };
    let pool = pool(&url).await;
    let table = products(&pool, 10).await;
    let read = format!("SELECT stock, version FROM {table} WHERE id = $1");
    let write = format!(
        "UPDATE {table} SET stock = $3, version = version + 1 WHERE id = $1 AND version = $2"
    );
    let interfere = format!("UPDATE {table} SET version = version + 1 WHERE id = $1");

    for isolation in [Isolation::ReadCommitted, Isolation::Serializable] {
        let before = stock(&pool, &table, 1).await;
        let done = retry_transaction(&pool, &RetryPolicy::default(), isolation, |tx, attempt| {
            let (read, write, interfere, pool) =
                (read.clone(), write.clone(), interfere.clone(), pool.clone());
            Box::pin(async move {
                let (stock, version): (i32, i64) = sqlx::query_as(&read)
                    .bind(1_i64)
                    .fetch_one(&mut *tx)
                    .await?;
                if attempt == 1 {
                    // Another writer commits between our read and write.
                    sqlx::query(&interfere).bind(1_i64).execute(&pool).await?;
                }
                let done = sqlx::query(&write)
                    .bind(1_i64)
                    .bind(version)
                    .bind(stock - 1)
                    .execute(&mut *tx)
                    .await?;
                Ok(if done.rows_affected() == 0 {
                    Attempt::Conflict
                } else {
                    Attempt::Committed(stock - 1)
                })
            })
        })
        .await
        .unwrap_or_else(|e| panic!("{isolation:?}: {e}"));
        // READ COMMITTED sees the new version and matches 0 rows (conflict);
        // SERIALIZABLE fails the write with 40001 (transient). Both retry.
        assert_eq!(done.attempts, 2, "{isolation:?}");
        assert_eq!(done.value, before - 1);
        assert_eq!(stock(&pool, &table, 1).await, before - 1);
    }

    let policy = RetryPolicy::new(3, Duration::from_millis(1), Duration::from_millis(2)).unwrap();
    let gave_up = retry_transaction(&pool, &policy, Isolation::ReadCommitted, |_, _| {
        Box::pin(async { Ok(Attempt::<()>::Conflict) })
    })
    .await;
    assert!(matches!(
        gave_up,
        Err(RetryError::Exhausted { attempts: 3 })
    ));
    let failed = retry_transaction(&pool, &policy, Isolation::ReadCommitted, |tx, _| {
        Box::pin(async move {
            sqlx::query("SELECT * FROM no_such_table_here")
                .execute(&mut *tx)
                .await?;
            Ok(Attempt::Committed(()))
        })
    })
    .await;
    assert!(
        matches!(failed, Err(RetryError::Failed { attempts: 1, .. })),
        "a permanent error is not retried"
    );
    drop_table(&pool, &table).await;
}

#[tokio::test]
async fn locks_open_takes_both_url_schemes() {
    let Some(url) = url() else { return };
    let (_, rest) = url.split_once("://").expect("a URL");
    let key = unique("open");
    let first = Locks::open(&format!("postgres://{rest}")).await.unwrap();
    let second = Locks::open(&format!("postgresql://{rest}")).await.unwrap();
    let guard = first.try_acquire(&key).await.unwrap();
    match second.try_acquire(&key).await {
        Err(Error::Busy { .. }) => {}
        other => panic!("the two handles must share the lock, got {other:?}"),
    }
    guard.release().await.unwrap();
    second
        .try_acquire(&key)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
