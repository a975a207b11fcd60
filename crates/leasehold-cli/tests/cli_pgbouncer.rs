//! The `leasehold` binary against PostgreSQL through PgBouncer in
//! transaction pooling mode, across real OS processes: the counter under
//! `run`, the takeover after SIGKILL, the paused holder, and the inventory
//! demo's four strategies.
//!
//! Needs `LEASEHOLD_TEST_PGBOUNCER` and `LEASEHOLD_TEST_POSTGRES` (started
//! by scripts/services/pgbouncer.sh); skips with a notice without them,
//! fails under `LEASEHOLD_REQUIRE_SERVERS=1`.

mod common;

use std::time::Duration;

use common::*;
use leasehold::conformance::{server_url, with_database};
use rand::Rng;

/// A database of its own for one test, dropped at the end: session settings
/// such as `search_path` do not travel through a transaction pooler, so a
/// schema per test (as in cli_postgres.rs) would not keep tests apart. The
/// pooler routes any database name to the server's database of that name.
struct Database {
    /// Through the pooler, with LISTEN on a direct connection.
    url: String,
    /// Through the pooler, without a listen URL: waiters poll.
    polling_url: String,
    /// FORCE closes the pooler's server connections to it.
    _drop: PgCleanup,
}

impl Database {
    fn create() -> Option<Database> {
        let pooler = server_url("LEASEHOLD_TEST_PGBOUNCER")?;
        let server = server_url("LEASEHOLD_TEST_POSTGRES")?;
        let name = format!("leasehold_cli_{:016x}", rand::thread_rng().gen::<u64>());
        pg_exec(&server, &format!("CREATE DATABASE {name}"));
        let direct = with_database(&server, &name);
        let polling_url = format!("{}?pooler=transaction", with_database(&pooler, &name));
        let url = format!("{polling_url}&listen_url={direct}");
        let statement = format!("DROP DATABASE {name} WITH (FORCE)");
        Some(Database {
            url,
            polling_url,
            _drop: PgCleanup { server, statement },
        })
    }
}

impl AsRef<str> for Database {
    fn as_ref(&self) -> &str {
        &self.url
    }
}

process_tests!(Database::create());

/// The same counter with waiters that poll (no listen URL): still exact,
/// and each process says once why it polls and how to fix it.
#[test]
fn polling_waiters_count_exactly_and_say_why_once() {
    let Some(db) = Database::create() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    counter_under_many_processes(&db.polling_url, dir.path(), 4, 10);

    // A waiter behind a holder: one warning line naming listen_url.
    let mut holder = leasehold(&db.polling_url)
        .args(["run", "polled", "--ttl", "2s", "--", "sleep", "3"])
        .spawn()
        .unwrap();
    assert!(wait_until(Duration::from_secs(10), || status(
        &db.polling_url,
        "polled"
    )["held"]
        == true));
    let out =
        run(leasehold(&db.polling_url).args(["run", "polled", "--wait", "20s", "--", "true"]));
    assert!(out.status.success(), "{}", stderr(&out));
    let message = stderr(&out);
    assert_eq!(
        message.lines().filter(|l| l.contains("listen_url")).count(),
        1,
        "one warning naming listen_url: {message}"
    );
    assert!(message.contains("transaction-mode pooler"), "{message}");
    holder.wait().unwrap();
}

#[test]
fn demo_shows_the_race_and_three_safe_strategies() {
    let Some(db) = Database::create() else {
        return;
    };
    demo_shows_race_and_safety(&db.url, &["none", "lease", "row-lock", "optimistic"]);
}
