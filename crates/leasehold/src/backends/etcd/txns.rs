//! The transactions of the protocol, one builder per operation, so each
//! operation's compares are in one place (a further condition on a grant
//! is one more compare here).
//!
//! Every grant key is attached to its own etcd lease; its
//! `create_revision` is the fencing token (`keys.rs`).

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, Txn, TxnOp, TxnOpResponse,
    TxnResponse,
};

use crate::backend::OwnerId;
use crate::error::Result;

use super::keys::{owner_bounds, Record};

fn put(key: &str, value: String, lease: i64) -> TxnOp {
    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)))
}

/// Mutex grant: `if create_revision(key) == 0 and the key has no kind
/// then put(key, value, lease) else get(key), get(kind_key)`. One round
/// trip; a busy answer carries the holder's record (and its lease, for the
/// time left), a key of another kind its kind ([`acquire_reads`]).
pub(super) fn acquire(key: &str, kind_key: &str, value: String, lease: i64) -> Txn {
    Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, 0),
            Compare::create_revision(kind_key, CompareOp::Equal, 0),
        ])
        .and_then([put(key, value, lease)])
        .or_else([TxnOp::get(key, None), TxnOp::get(kind_key, None)])
}

/// What a refused [`acquire`] read: the mutex record and the kind key,
/// each if present.
pub(super) fn acquire_reads(resp: &TxnResponse) -> (Option<KeyValue>, Option<KeyValue>) {
    let mut reads = resp.op_responses().into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(mut get) => Some(get.take_kvs().into_iter().next()),
        _ => None,
    });
    (reads.next().flatten(), reads.next().flatten())
}

/// The condition on a key's kind that a permit or reader-writer commit
/// carries, and the claim it makes (one key is one lock): the key is of
/// the asked kind already, or it becomes it in the same transaction,
/// provided it still has no kind and no mutex grant.
#[derive(Debug, Clone, Default)]
pub(super) struct KindClaim {
    compares: Vec<Compare>,
    ops: Vec<TxnOp>,
}

impl KindClaim {
    /// The key (kind key `kind_key`) is of kind `stored` already.
    pub fn held(kind_key: &str, stored: &str) -> Self {
        KindClaim {
            compares: vec![Compare::value(kind_key, CompareOp::Equal, stored)],
            ops: Vec::new(),
        }
    }

    /// Whether this is [`held`](Self::held): the kind is the key's already.
    pub fn is_held(&self) -> bool {
        self.ops.is_empty()
    }

    /// The key has no kind and no mutex grant (`mutex_key`) as read:
    /// claim it as `stored`. The kind key is on no lease: it outlives
    /// every grant.
    pub fn claim(kind_key: &str, mutex_key: &str, stored: &str) -> Self {
        KindClaim {
            compares: vec![
                Compare::create_revision(kind_key, CompareOp::Equal, 0),
                Compare::create_revision(mutex_key, CompareOp::Equal, 0),
            ],
            ops: vec![TxnOp::put(kind_key, stored, None)],
        }
    }
}

/// The keys a permit's or reader-writer grant reads: the lock's range
/// (`keys::Layout::lock`), the key's kind record and its mutex record.
#[derive(Debug, Clone)]
pub(super) struct LockKeys {
    pub base: String,
    pub kind: String,
    pub mutex: String,
}

impl LockKeys {
    /// The three reads, in this order: the range, the kind, the mutex. A
    /// read-only transaction of them is one linearizable look at the lock;
    /// a claim's else branch carries the same, so a claim that failed
    /// answers what it would have needed to read.
    pub fn reads(&self) -> Vec<TxnOp> {
        vec![
            TxnOp::get(self.base.as_str(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(self.kind.as_str(), None),
            TxnOp::get(self.mutex.as_str(), None),
        ]
    }
}

/// What a claim compares the lock's range against: what a look found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Seen {
    /// Presumed empty, unread (hints.rs): the range must have no record.
    Empty,
    /// As read at this revision: nothing in the range written after it.
    At(i64),
}

/// A permit or reader-writer grant in `key` (one slot of the lock of
/// `lock`), iff the range is as `seen` and the slot is free, with the
/// kind condition `kind`; `also` runs with it. Else the lock is read
/// ([`LockKeys::reads`]) in the same round trip.
pub(super) fn claim(
    lock: &LockKeys,
    seen: Seen,
    kind: &KindClaim,
    key: &str,
    value: String,
    lease: i64,
    also: Vec<TxnOp>,
) -> Txn {
    let mut ops = vec![put(key, value, lease)];
    ops.extend(also);
    ops.extend(kind.ops.iter().cloned());
    let mut compares = vec![
        range_as(&lock.base, seen),
        Compare::create_revision(key, CompareOp::Equal, 0),
    ];
    compares.extend(kind.compares.iter().cloned());
    Txn::new()
        .when(compares)
        .and_then(ops)
        .or_else(lock.reads())
}

/// A waiting writer's marker, iff the lock's range is as `seen`; else the
/// lock is read, as for [`claim`].
pub(super) fn mark(
    lock: &LockKeys,
    seen: Seen,
    kind: &KindClaim,
    marker: &str,
    value: String,
    lease: i64,
) -> Txn {
    let mut ops = vec![put(marker, value, lease)];
    ops.extend(kind.ops.iter().cloned());
    let mut compares = vec![range_as(&lock.base, seen)];
    compares.extend(kind.compares.iter().cloned());
    Txn::new()
        .when(compares)
        .and_then(ops)
        .or_else(lock.reads())
}

/// The range `base` is as `seen`: empty (no key has a create revision:
/// etcd compares an empty range as one absent key), or nothing under it
/// written after revision `read` (a key deleted since is not compared: a
/// freed slot never makes a grant wrong).
fn range_as(base: &str, seen: Seen) -> Compare {
    match seen {
        Seen::Empty => Compare::create_revision(base, CompareOp::Equal, 0).with_prefix(),
        Seen::At(read) => Compare::mod_revision(base, CompareOp::Less, read + 1).with_prefix(),
    }
}

/// Moves `record` (still on its lease, checked by the caller's keep-alive
/// just before) to a longer lease: the key stays, so does its token.
pub(super) fn repoint(key: &str, record: &Record, value: String, lease: i64) -> Result<Txn> {
    let token = crate::backend::token_to_i64(record.token)?;
    Ok(Txn::new()
        .when([
            Compare::create_revision(key, CompareOp::Equal, token),
            Compare::lease(key, CompareOp::Equal, record.lease),
        ])
        .and_then([put(key, value, lease)]))
}

/// Release: deletes `key` iff it is the grant of `owner` with `token`;
/// the deleted record comes back (its lease is then revoked). A permit's or
/// reader-writer grant's release also writes its key's kind record again
/// (`kind`: the record and its unchanged value), so that record's
/// `mod_revision` says when the key was last released (sweep.rs).
pub(super) fn release(
    key: &str,
    owner: OwnerId,
    token: u64,
    kind: Option<(String, &str)>,
) -> Result<Txn> {
    let mut ops = vec![TxnOp::delete(
        key,
        Some(DeleteOptions::new().with_prev_key()),
    )];
    ops.extend(kind.map(|(record, stored)| TxnOp::put(record, stored, None)));
    Ok(Txn::new()
        .when(is_grant_of(key, owner, token)?)
        .and_then(ops))
}

/// Force-release's cleanup of a record whose lease is gone or missing:
/// deletes it iff it is still the one read.
pub(super) fn delete_if_created_at(key: &str, create_revision: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(
            key,
            CompareOp::Equal,
            create_revision,
        )])
        .and_then([TxnOp::delete(key, None)])
}

/// "`key` is `owner`'s grant with `token`": the token pins the grant (a
/// revision creates one key once), the owner bounds pin its value.
fn is_grant_of(key: &str, owner: OwnerId, token: u64) -> Result<Vec<Compare>> {
    let token = crate::backend::token_to_i64(token)?;
    let (low, high) = owner_bounds(owner);
    Ok(vec![
        Compare::create_revision(key, CompareOp::Equal, token),
        Compare::value(key, CompareOp::Greater, low),
        Compare::value(key, CompareOp::Less, high),
    ])
}
