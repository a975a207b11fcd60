//! The PostgreSQL store through PgBouncer in transaction pooling mode
//! (`LEASEHOLD_TEST_PGBOUNCER`, and `LEASEHOLD_TEST_PGBOUNCER_STRICT`
//! without `ignore_startup_parameters`; both started by
//! scripts/services/pgbouncer.sh in front of `LEASEHOLD_TEST_POSTGRES`),
//! beyond the conformance suite: what a misconfigured pooler tells the
//! user, that data connections never LISTEN, and the same-transaction
//! check and row-lock helpers through the pooler. Skipped without the
//! servers, unless `LEASEHOLD_REQUIRE_SERVERS=1`.
#![cfg(all(feature = "conformance", feature = "postgres"))]

use std::str::FromStr;
use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::backends::postgres::{parse_store_url, Pooler, PostgresBackend, PostgresOptions};
use leasehold::conformance::server_url;
use leasehold::occ::{Attempt, RetryPolicy};
use leasehold::rowlock::{retry_transaction, with_locked_rows, Isolation, RowLockOptions};
use leasehold::{Backend, Error, Key, Lease, Locks};
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::Row;

fn pooled() -> Option<String> {
    server_url("LEASEHOLD_TEST_PGBOUNCER").map(|url| format!("{url}?pooler=transaction"))
}

fn unique(prefix: &str) -> String {
    format!("{prefix}_{:016x}", rand::random::<u64>())
}

async fn grant(backend: &PostgresBackend, key: &str, ttl: Duration) -> Lease {
    let req = AcquireRequest::new(Key::new(key).unwrap(), ttl, "test").unwrap();
    match backend.try_acquire(&req).await.expect("store answers") {
        Acquire::Granted(lease) => lease,
        b => panic!("{key} is not granted: {b:?}"),
    }
}

/// A pool for the application's own queries through the pooler, built as
/// docs/postgres.md tells.
async fn app_pool(url: &str) -> PgPool {
    let (connect, _) = parse_store_url(url, PostgresOptions::new()).unwrap();
    PgPoolOptions::new()
        .max_connections(8)
        .connect_with(connect)
        .await
        .expect("connect through LEASEHOLD_TEST_PGBOUNCER")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_startup_parameter_names_the_pooler_setting() {
    let Some(strict) = server_url("LEASEHOLD_TEST_PGBOUNCER_STRICT") else {
        return;
    };
    // sqlx sends extra_float_digits, which this PgBouncer does not ignore.
    let e = PostgresBackend::connect(&strict).await.unwrap_err();
    let message = e.to_string();
    assert!(matches!(e, Error::Backend { .. }), "{e:?}");
    assert!(
        message.contains("extra_float_digits")
            && message.contains("PgBouncer")
            && message.contains("ignore_startup_parameters")
            && message.contains("?pooler=transaction"),
        "{message}"
    );
    // Declared as a transaction pooler, the store leaves it out and works.
    let backend = PostgresBackend::connect(&format!("{strict}?pooler=transaction"))
        .await
        .expect("connects without extra_float_digits");
    let lease = grant(&backend, &unique("strict"), Duration::from_secs(5)).await;
    backend.release(&lease).await.unwrap();
    // Session settings in `options` are rejected too, and named.
    let e = PostgresBackend::connect(&format!(
        "{strict}?pooler=transaction&options[statement_timeout]=5000"
    ))
    .await
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("\"options\"") && e.contains("ignore_startup_parameters"),
        "{e}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undeclared_transaction_pooler_is_named_with_the_fix() {
    let Some(url) = server_url("LEASEHOLD_TEST_PGBOUNCER") else {
        return;
    };
    // On the `postgres` database: PgBouncer pools per database, and these
    // undeclared clients LISTEN through the pooler, which leaves server
    // connections listening. In the other tests' pool (database `test`),
    // those would hand NOTIFYs to their data connections
    // (`notifies_never_reach_pooled_connections` failed so in CI).
    let (base, _) = url.rsplit_once('/').expect("a database in the URL");
    let url = format!("{base}/postgres");
    // Without ?pooler=transaction, two clients' named prepared statements
    // land on the same server connections and collide. Named apart, as
    // three processes would be (one URL shares one connection per process).
    let mut backends = Vec::new();
    let mut errors = Vec::new();
    for i in 0..3 {
        match PostgresBackend::connect(&format!("{url}?application_name=undeclared{i}")).await {
            Ok(backend) => backends.push(backend),
            Err(e) => errors.push(e),
        }
    }
    let key = Key::new(unique("undeclared")).unwrap();
    for _ in 0..10 {
        for backend in &backends {
            // A collision may also bind to another client's statement of the
            // same name and return its rows: only declaring the pooler is safe.
            if let Err(e) = backend.inspect(&key).await {
                errors.push(e);
            }
        }
    }
    let named = errors.iter().map(ToString::to_string).find(|message| {
        message.contains("prepared statement")
            && message.contains("?pooler=transaction")
            && message.contains("max_prepared_statements")
    });
    assert!(
        named.is_some(),
        "a prepared-statement collision should name the fix: {errors:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_connections_never_listen_and_a_listen_url_does() {
    let (Some(url), Some(server)) = (pooled(), server_url("LEASEHOLD_TEST_POSTGRES")) else {
        return;
    };
    let key = Key::new(unique("listen")).unwrap();
    let polling = PostgresBackend::connect(&url).await.unwrap();
    assert!(
        !polling.subscribe(&key).await.unwrap().is_live(),
        "no LISTEN without a listen url behind a transaction pooler"
    );
    let listening = PostgresBackend::connect(&format!("{url}&listen_url={server}"))
        .await
        .unwrap();
    let mut subscription = listening.subscribe(&key).await.unwrap();
    assert!(subscription.is_live());
    // A release through the pooler wakes the waiter through the listen url.
    let lease = grant(&polling, key.as_str(), Duration::from_secs(30)).await;
    polling.release(&lease).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), subscription.notified())
        .await
        .expect("the release notification arrives on the listen url");
}

/// Another process releasing (NOTIFY) all the time while waiters and
/// workers go through the pooler: no pooled connection ever sees a
/// notification, so no operation fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notifies_never_reach_pooled_connections() {
    let (Some(url), Some(server)) = (pooled(), server_url("LEASEHOLD_TEST_POSTGRES")) else {
        return;
    };
    let direct = PostgresBackend::connect(&server).await.unwrap();
    let waiting = Locks::new(PostgresBackend::connect(&url).await.unwrap());
    let listening = Locks::new(
        PostgresBackend::connect(&format!("{url}&listen_url={server}"))
            .await
            .unwrap(),
    );
    let prefix = unique("mixed");
    let notifier = tokio::spawn({
        let prefix = prefix.clone();
        async move {
            for i in 0..200 {
                let lease = grant(&direct, &format!("{prefix}:n{i}"), Duration::from_secs(5)).await;
                direct.release(&lease).await.unwrap();
            }
        }
    });
    let mut workers = Vec::new();
    for (w, locks) in [waiting, listening].into_iter().enumerate() {
        let key = format!("{prefix}:shared");
        workers.push(tokio::spawn(async move {
            for _ in 0..25 {
                let guard = locks
                    .acquire(&key, Duration::from_secs(20))
                    .await
                    .unwrap_or_else(|e| panic!("worker {w}: {e}"));
                tokio::time::sleep(Duration::from_millis(5)).await;
                guard
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("worker {w}: {e}"));
            }
        }));
    }
    for worker in workers {
        worker.await.unwrap();
    }
    notifier.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_in_and_row_locks_are_transaction_scoped_through_the_pooler() {
    let Some(url) = pooled() else {
        return;
    };
    let backend = PostgresBackend::connect(&url).await.unwrap();
    let pool = app_pool(&url).await;
    let table = unique("pooled_products");
    sqlx::raw_sql(&format!(
        "CREATE TABLE {table} (id BIGINT PRIMARY KEY, stock INT NOT NULL, version BIGINT NOT NULL)"
    ))
    .execute(&pool)
    .await
    .unwrap();
    sqlx::raw_sql(&format!("INSERT INTO {table} VALUES (1, 40, 0)"))
        .execute(&pool)
        .await
        .unwrap();

    // check_in inside a transaction through the pooler, many times and
    // from several tasks, so transactions land on different server
    // connections.
    let key = unique("checked");
    let lease = grant(&backend, &key, Duration::from_secs(30)).await;
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (backend, pool, lease) = (backend.clone(), pool.clone(), lease.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let mut tx = pool.begin().await.unwrap();
                backend.check_in(&mut tx, &lease).await.expect("still held");
                tx.commit().await.unwrap();
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    backend.release(&lease).await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    assert!(matches!(
        backend.check_in(&mut tx, &lease).await,
        Err(Error::LeaseLost { .. })
    ));
    tx.rollback().await.unwrap();

    // Row locks (with a lock timeout) and optimistic retries sell exactly
    // the stock, from tasks sharing the pooler.
    let mut sellers = Vec::new();
    for seller in 0..4 {
        let (pool, table) = (pool.clone(), table.clone());
        sellers.push(tokio::spawn(async move {
            for _ in 0..5 {
                if seller % 2 == 0 {
                    let options = RowLockOptions::new()
                        .with_lock_timeout(Duration::from_secs(10))
                        .with_pooler(Pooler::Transaction);
                    let update = format!(
                        "UPDATE {table} SET stock = stock - 1, version = version + 1 WHERE id = 1"
                    );
                    with_locked_rows(
                        &pool,
                        &options,
                        &format!("SELECT stock FROM {table} WHERE id = $1"),
                        |q| q.bind(1_i64),
                        move |tx, _rows| {
                            Box::pin(async move {
                                sqlx::query(&update)
                                    .persistent(false)
                                    .execute(&mut *tx)
                                    .await?;
                                Ok(())
                            })
                        },
                    )
                    .await
                    .unwrap();
                } else {
                    retry_transaction(
                        &pool,
                        &RetryPolicy::default(),
                        Isolation::ReadCommitted,
                        |tx, _| {
                            let table = table.clone();
                            Box::pin(async move {
                                let row = sqlx::query(&format!(
                                    "SELECT stock, version FROM {table} WHERE id = $1"
                                ))
                                .persistent(false)
                                .bind(1_i64)
                                .fetch_one(&mut *tx)
                                .await?;
                                let (stock, version): (i32, i64) = (row.get(0), row.get(1));
                                let done = sqlx::query(&format!(
                                    "UPDATE {table} SET stock = $1, version = version + 1 \
                                     WHERE id = 1 AND version = $2"
                                ))
                                .persistent(false)
                                .bind(stock - 1)
                                .bind(version)
                                .execute(&mut *tx)
                                .await?;
                                Ok(if done.rows_affected() == 1 {
                                    Attempt::Committed(())
                                } else {
                                    Attempt::Conflict
                                })
                            })
                        },
                    )
                    .await
                    .unwrap();
                }
            }
        }));
    }
    for seller in sellers {
        seller.await.unwrap();
    }
    let stock: i32 = sqlx::raw_sql(&format!("SELECT stock FROM {table} WHERE id = 1"))
        .fetch_one(&pool)
        .await
        .unwrap()
        .get(0);
    assert_eq!(stock, 20);
    sqlx::raw_sql(&format!("DROP TABLE {table}"))
        .execute(&pool)
        .await
        .unwrap();
}

#[test]
fn store_url_options_reach_the_backend_options() {
    let (connect, options) = parse_store_url(
        "postgresql://u@pooler:6432/app?pooler=transaction&sslmode=disable",
        PostgresOptions::new().with_table("app.locks"),
    )
    .unwrap();
    assert_eq!(options.pooler(), Pooler::Transaction);
    assert_eq!(options.table(), "app.locks");
    assert_eq!(
        connect.get_port(),
        PgConnectOptions::from_str("postgres://u@pooler:6432/app")
            .unwrap()
            .get_port()
    );
}
