//! Both resource variants decide the same way: a token below the highest
//! accepted one is refused, unless fencing is off.

use super::server::{Client, Server};
use super::*;

async fn exercise(r: &mut dyn FencedResource, key: &str, fencing: bool) {
    assert_eq!(r.read(key, 2).await.unwrap(), Answer::Accepted(0));
    assert_eq!(r.write(key, 2, 1).await.unwrap(), Answer::Accepted(()));
    // A reader with token 5 registers it: token 3 may no longer write.
    assert_eq!(r.read(key, 5).await.unwrap(), Answer::Accepted(1));
    let late = r.write(key, 3, 7).await.unwrap();
    let late_read = r.read(key, 4).await.unwrap();
    if fencing {
        assert_eq!(late, Answer::Fenced { highest: 5 });
        assert_eq!(late_read, Answer::Fenced { highest: 5 });
        assert_eq!(r.write(key, 5, 2).await.unwrap(), Answer::Accepted(()));
    } else {
        assert_eq!(late, Answer::Accepted(()));
        assert_eq!(late_read, Answer::Accepted(7));
    }
}

/// The in-store resource of `url` decides like the server and logs every
/// decision; a reset starts the counter and its log afresh.
async fn check_in_store(url: &str) {
    for fencing in [true, false] {
        let store = in_store(url).await.unwrap();
        let keys = [format!("k-{:08x}", rand::random::<u32>())];
        store.reset(&keys).await.unwrap();
        exercise(&mut *store.connect(1, fencing), &keys[0], fencing).await;
        let log = store.decisions(&keys).await.unwrap();
        assert_eq!(log.len(), if fencing { 6 } else { 5 });
        assert_eq!(
            log.iter().filter(|d| !d.accepted).count(),
            if fencing { 2 } else { 0 }
        );
        assert!(log.windows(2).all(|w| w[0].seq < w[1].seq));
        store.reset(&keys).await.unwrap();
        assert!(store.decisions(&keys).await.unwrap().is_empty());
    }
}

#[tokio::test]
async fn the_server_fences_and_logs_every_decision() {
    for fencing in [true, false] {
        let server = Server::start(fencing).await.unwrap();
        let mut client = Client::connect(&server.addr().to_string(), 1)
            .await
            .unwrap();
        exercise(&mut client, "k", fencing).await;
        let log = server.decisions();
        assert_eq!(log.len(), if fencing { 6 } else { 5 });
        assert_eq!(
            log.iter().filter(|d| !d.accepted).count(),
            if fencing { 2 } else { 0 }
        );
        assert!(log
            .windows(2)
            .all(|w| w[0].seq < w[1].seq && w[0].t <= w[1].t));
    }
}

#[tokio::test]
async fn the_sqlite_table_fences_and_logs_every_decision() {
    let dir = tempfile::tempdir().unwrap();
    check_in_store(&format!(
        "sqlite://{}",
        dir.path().join("locks.db").display()
    ))
    .await;
}

#[tokio::test]
async fn the_postgres_table_fences_and_logs_every_decision() {
    if let Some(url) = leasehold::conformance::server_url("LEASEHOLD_TEST_POSTGRES") {
        check_in_store(&url).await;
    }
}

#[tokio::test]
async fn the_postgres_table_behind_a_transaction_pooler_fences_too() {
    if let Some(url) = leasehold::conformance::server_url("LEASEHOLD_TEST_PGBOUNCER") {
        check_in_store(&format!("{url}?pooler=transaction")).await;
    }
}

#[tokio::test]
async fn stores_without_an_in_store_resource_say_so() {
    let e = in_store("redis://127.0.0.1:1").await.err().unwrap();
    assert_eq!(e.code, crate::exit::EX_USAGE);
    assert!(e.to_string().contains("use --resource server"), "{e}");
}

#[tokio::test]
async fn the_server_fences_shared_reads_by_writers_only() {
    let server = Server::start(true).await.unwrap();
    let mut r = Client::connect(&server.addr().to_string(), 1)
        .await
        .unwrap();
    let r: &mut dyn FencedResource = &mut r;
    // Readers 3 and 2 in either order; writer 4 is above both.
    assert_eq!(r.shared_read("k", 3).await.unwrap(), Answer::Accepted(0));
    assert_eq!(r.shared_read("k", 2).await.unwrap(), Answer::Accepted(0));
    assert_eq!(r.read("k", 4).await.unwrap(), Answer::Accepted(0));
    assert_eq!(r.write("k", 4, 1).await.unwrap(), Answer::Accepted(()));
    // Behind writer 4: reader 3 is stale; writer 3 too.
    assert_eq!(
        r.shared_read("k", 3).await.unwrap(),
        Answer::Fenced { highest: 4 }
    );
    assert_eq!(
        r.write("k", 3, 9).await.unwrap(),
        Answer::Fenced { highest: 4 }
    );
    // Reader 6 registers: writer 5 (granted before it) may not write.
    assert_eq!(r.shared_read("k", 6).await.unwrap(), Answer::Accepted(1));
    assert_eq!(
        r.write("k", 5, 2).await.unwrap(),
        Answer::Fenced { highest: 6 }
    );
}
