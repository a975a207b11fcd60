//! The command connections a Redis backend opens from a URL: one call at a
//! time on each, so a call that is cancelled or times out must never leave
//! its reply for the next call to read; at most `max_connections` of them;
//! and one the server closed while idle is replaced, not failed on; and a
//! lone call's blocking wait for its reply is bounded by the reply wait.
//!
//! On the shared server (`LEASEHOLD_TEST_REDIS`); skipped without it.
#![cfg(all(feature = "conformance", feature = "redis"))]

#[path = "support/redis.rs"]
mod redis_fixtures;

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backends::redis::{Connection, RedisOptions};
use leasehold::conformance::server_url;
use redis_fixtures::{random_prefix, raw};

async fn open(options: RedisOptions) -> Option<Connection> {
    let url = server_url("LEASEHOLD_TEST_REDIS")?;
    Some(Connection::open(&url, &options).await.expect("connect"))
}

async fn echo(conn: &mut Connection, text: &str) -> redis::RedisResult<String> {
    redis::cmd("ECHO").arg(text).query_async(conn).await
}

#[tokio::test]
async fn a_cancelled_call_leaves_no_reply_for_the_next() {
    let Some(mut conn) = open(RedisOptions::new().with_max_connections(1)).await else {
        return;
    };
    let list = format!("{}:never-pushed", random_prefix());
    // BLPOP answers nil after 0.5 s; the call is dropped long before.
    let mut blpop = redis::cmd("BLPOP");
    blpop.arg(&list).arg(0.5);
    let blocked = blpop.query_async::<Option<(String, String)>>(&mut conn);
    assert!(tokio::time::timeout(Duration::from_millis(50), blocked)
        .await
        .is_err());
    // A connection put back after that would answer this ECHO with the
    // BLPOP's nil, 0.45 s later.
    assert_eq!(echo(&mut conn, "second").await.unwrap(), "second");
}

#[tokio::test]
async fn a_timed_out_call_fails_as_a_timeout_and_the_next_is_in_step() {
    let options = RedisOptions::new()
        .with_max_connections(1)
        .with_response_timeout(Duration::from_millis(100));
    let Some(mut conn) = open(options).await else {
        return;
    };
    let list = format!("{}:never-pushed", random_prefix());
    let err = redis::cmd("BLPOP")
        .arg(&list)
        .arg(1)
        .query_async::<Option<(String, String)>>(&mut conn)
        .await
        .unwrap_err();
    assert!(err.is_timeout(), "{err}");
    assert_eq!(echo(&mut conn, "after").await.unwrap(), "after");
}

#[tokio::test]
async fn concurrent_calls_share_at_most_max_connections() {
    let Some(conn) = open(RedisOptions::new().with_max_connections(2)).await else {
        return;
    };
    let list = format!("{}:never-pushed", random_prefix());
    // Each call holds its connection for 50 ms, so eight at once overlap:
    // without the bound they would open eight connections.
    let calls = (0..8).map(|_| {
        let (mut conn, list) = (conn.clone(), list.clone());
        tokio::spawn(async move {
            let (_, id): (Option<(String, String)>, i64) = redis::pipe()
                .cmd("BLPOP")
                .arg(&list)
                .arg(0.05)
                .cmd("CLIENT")
                .arg("ID")
                .query_async(&mut conn)
                .await
                .unwrap();
            id
        })
    });
    let mut ids = BTreeSet::new();
    for call in calls {
        ids.insert(call.await.unwrap());
    }
    assert!(ids.len() <= 2, "{} connections: {ids:?}", ids.len());
}

#[tokio::test]
async fn an_idle_connection_the_server_closed_is_replaced() {
    let Some(mut conn) = open(RedisOptions::new().with_max_connections(1)).await else {
        return;
    };
    let id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut conn)
        .await
        .unwrap();
    let mut admin = raw(&server_url("LEASEHOLD_TEST_REDIS").unwrap()).await;
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query_async(&mut admin)
        .await
        .unwrap();
    assert_eq!(killed, 1);
    // Let the close reach this side of the socket.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(echo(&mut conn, "still here").await.unwrap(), "still here");
    let new_id: i64 = redis::cmd("CLIENT")
        .arg("ID")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_ne!(new_id, id);
}

/// A lone call waits for its reply on its own thread for the reply wait
/// only: a reply that takes longer (a BLPOP served 100 ms later) leaves the
/// thread to the runtime's other tasks meanwhile (here, on the one thread
/// of a current-thread runtime, a ticker and the task that pushes), and
/// still arrives, read through the runtime's own wake-up.
#[tokio::test(flavor = "current_thread")]
async fn a_slow_reply_does_not_hold_the_thread_past_the_reply_wait() {
    let options = RedisOptions::new().with_reply_wait(Duration::from_millis(2));
    let Some(mut conn) = open(options).await else {
        return;
    };
    let mut pusher = raw(&server_url("LEASEHOLD_TEST_REDIS").unwrap()).await;
    let list = format!("{}:pushed-later", random_prefix());
    let ticks = Arc::new(AtomicU32::new(0));
    let ticker = tokio::spawn({
        let ticks = ticks.clone();
        async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                ticks.fetch_add(1, Ordering::Relaxed);
            }
        }
    });
    let push = tokio::spawn({
        let list = list.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(100)).await;
            let _: i64 = redis::cmd("RPUSH")
                .arg(&list)
                .arg("late")
                .query_async(&mut pusher)
                .await
                .unwrap();
        }
    });
    let popped: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(&list)
        .arg(5)
        .query_async(&mut conn)
        .await
        .unwrap();
    ticker.abort();
    push.await.unwrap();
    assert_eq!(popped, Some((list, "late".to_owned())));
    // Held for the whole reply, the thread would have run neither the
    // pusher (the BLPOP would have answered nil after 5 s) nor the ticker.
    let ticks = ticks.load(Ordering::Relaxed);
    assert!(ticks >= 10, "the ticker ran {ticks} times in 100 ms");
}
