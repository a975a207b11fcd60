//! A busy answer says what the primitive's state is (issue: a full
//! semaphore used to say "held by", as did a reader turned away by a
//! waiting writer's marker).

use std::time::Duration;

use std::sync::Arc;

use leasehold::backends::memory::MemoryBackend;
use leasehold::{Backend, Error, LockKind, Locks};

#[tokio::test]
async fn a_full_semaphore_says_all_its_permits_are_taken() {
    let locks = Locks::open("memory://").await.unwrap();
    let workers = locks.semaphore("workers", 2).unwrap();
    let _a = workers.try_acquire().await.unwrap();
    let _b = workers.try_acquire().await.unwrap();
    let error = workers.try_acquire().await.unwrap_err();
    assert!(
        matches!(
            error,
            Error::Busy {
                kind: LockKind::Semaphore { permits: 2 },
                ..
            }
        ),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with(
            r#"all 2 permits of semaphore "workers" are taken; the first frees within "#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_reader_behind_a_waiting_writer_is_told_so() {
    // Two handles on one store: two processes, so the writer's wait is
    // seen at the store (its marker), not in a local queue.
    let shared: Arc<dyn Backend> = Arc::new(MemoryBackend::new());
    let locks = Locks::from_arc(shared.clone());
    let writers = Locks::from_arc(shared);
    let rw = locks.rw_lock("doc").unwrap();
    let reader = rw.try_read().await.unwrap();
    // A writer waits behind the reader: its marker closes the lock to new
    // readers of other owners.
    let writer_rw = writers.rw_lock("doc").unwrap();
    let writer = tokio::spawn(async move { writer_rw.write(Duration::from_secs(5)).await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let error = loop {
        match rw.try_read().await {
            Ok(extra) => {
                extra.release().await.unwrap();
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the writer never marked"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(e) => break e,
        }
    };
    assert!(
        matches!(
            error,
            Error::Busy {
                kind: LockKind::Read,
                ..
            }
        ),
        "{error:?}"
    );
    let text = error.to_string();
    assert!(
        text.starts_with(r#"rw lock "doc" is closed to readers: writer "#),
        "{text}"
    );
    assert!(!text.contains("is held by"), "{text}");
    reader.release().await.unwrap();
    writer.await.unwrap().unwrap().release().await.unwrap();
}
