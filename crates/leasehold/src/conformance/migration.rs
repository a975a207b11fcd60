//! What a store that migrates a lease table written by the release before
//! kinds (no `kind` column) must keep: its leases and its tokens. The SQL
//! stores had such a table; each plants the old rows its own way, then
//! hands its backend here.

use std::time::Duration;

use crate::backend::{Acquire, AcquireRequest, Backend, KeyKind, OwnerId, RwSide};
use crate::key::Key;

/// Checks the records a store's old table held before the backend opened
/// it: `held` leased by `owner` as holder `old:1` with fence 7 for another
/// minute, and `free` with fence 5 and no holder. The held lease stays held
/// against a mutex and a reader, its owner can renew and release it, and
/// tokens go on from the old fences, also when the free key becomes a
/// reader-writer lock (which then refuses a mutex). Leaves `held` free and
/// `free` with a reader, for the store's own checks after.
pub async fn records_from_before_kinds_keep_leases_and_tokens(
    backend: &dyn Backend,
    owner: OwnerId,
) {
    let ttl = Duration::from_secs(30);
    let held = Key::new("held").expect("valid key");
    let info = backend.inspect(&held).await.unwrap().expect("still held");
    assert_eq!((info.token, info.holder.as_str()), (7, "old:1"));
    let other = AcquireRequest::new(held.clone(), ttl, "new").unwrap();
    let answer = backend.try_acquire(&other).await.unwrap();
    assert!(
        matches!(&answer, Acquire::Busy(b) if b.holder == "old:1"),
        "{answer:?}"
    );
    let reader = AcquireRequest::rw(held.clone(), ttl, "new", RwSide::Read).unwrap();
    let answer = backend.try_acquire(&reader).await.unwrap();
    assert!(
        matches!(&answer, Acquire::Busy(b) if b.holder == "old:1"),
        "a reader waits for the old mutex holder: {answer:?}"
    );
    let lease = AcquireRequest::new(held, ttl, "old:1")
        .unwrap()
        .with_owner(owner)
        .granted(7);
    assert!(backend.renew(&lease, ttl).await.unwrap());
    backend.release(&lease).await.unwrap();
    let Acquire::Granted(next) = backend.try_acquire(&other).await.unwrap() else {
        panic!("free after its release");
    };
    assert_eq!(next.token(), 8);
    backend.release(&next).await.unwrap();

    let free = Key::new("free").expect("valid key");
    let reader = AcquireRequest::rw(free.clone(), ttl, "new", RwSide::Read).unwrap();
    let Acquire::Granted(read) = backend.try_acquire(&reader).await.unwrap() else {
        panic!("a free old key becomes a reader-writer lock");
    };
    assert_eq!(read.token(), 6, "tokens go on from the mutex's fence");
    let mutex = AcquireRequest::new(free, ttl, "new").unwrap();
    assert!(matches!(
        backend.try_acquire(&mutex).await.unwrap(),
        Acquire::OtherKind(KeyKind::ReaderWriter)
    ));
}
