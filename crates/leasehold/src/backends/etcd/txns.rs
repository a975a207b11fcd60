//! The transactions of the protocol, one builder per operation, so each
//! operation's compares are in one place (a further condition on a grant
//! is one more compare here).
//!
//! Every grant key is attached to its own etcd lease; its
//! `create_revision` is the fencing token (`keys.rs`).

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, PutOptions, SortOrder, SortTarget,
    Txn, TxnOp, TxnOpResponse, TxnResponse,
};

use crate::backend::OwnerId;
use crate::error::Result;

use super::keys::{hand_off_value, owner_bounds, Entry, Kind, Layout, Record};

pub(super) fn put(key: &str, value: String, lease: i64) -> TxnOp {
    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)))
}

/// The keys a mutex transaction names: the lock's range (which holds its
/// one grant, in the first of its two places or the other), the key's kind
/// record and its queue's range.
#[derive(Debug, Clone)]
pub(super) struct MutexKeys {
    pub lock: String,
    pub kind: String,
    pub queue: String,
}

impl MutexKeys {
    pub fn of(layout: &Layout, key: &str) -> Self {
        MutexKeys {
            lock: layout.lock(Kind::Mutex, key),
            kind: layout.kind(key),
            queue: layout.queue(key),
        }
    }
}

/// "No key under `base`": etcd applies a range compare to every key in
/// the range, and to a zero create revision when there is none.
fn range_empty(base: &str) -> Compare {
    Compare::create_revision(base, CompareOp::Equal, 0).with_prefix()
}

/// The head of a queue: its entry with the lowest create revision.
fn head_of(queue: &str) -> TxnOp {
    let first = GetOptions::new()
        .with_prefix()
        .with_sort(SortTarget::Create, SortOrder::Ascend)
        .with_limit(1);
    TxnOp::get(queue, Some(first))
}

/// Mutex grant: `if the lock's range is empty and the key has no kind
/// and no queue then put(grant, value, lease) else get(lock range)`. One
/// round trip; a refusal carries the grant that holds the key, which
/// decides a busy answer ([`acquire_reads`]). The kind record and the
/// queue's head matter only when the range is empty (a key that is
/// another kind of lock, or free behind a queue): [`free_key_reads`] reads
/// them then. Each read named here costs every grant, answered or not: the
/// server puts the whole request in its Raft log, and two more reads made
/// the uncontended pair about 2 % slower (docs/etcd.md, "What a grant
/// sends").
pub(super) fn acquire(keys: &MutexKeys, value: String, lease: i64) -> Txn {
    let mut when = free_key(keys);
    when.push(range_empty(&keys.queue));
    Txn::new()
        .when(when)
        .and_then([put(&keys.lock, value, lease)])
        .or_else([TxnOp::get(
            keys.lock.as_str(),
            Some(GetOptions::new().with_prefix().with_limit(1)),
        )])
}

/// The answers of a transaction's gets, in order (each get's key-values).
pub(super) fn gets(resp: &TxnResponse) -> impl Iterator<Item = Vec<KeyValue>> + '_ {
    resp.op_responses().into_iter().filter_map(|op| match op {
        TxnOpResponse::Get(mut get) => Some(get.take_kvs()),
        _ => None,
    })
}

/// The first key-value of a get's answer, if any.
pub(super) fn first(kvs: Option<Vec<KeyValue>>) -> Option<KeyValue> {
    kvs.and_then(|kvs| kvs.into_iter().next())
}

/// What a refused [`acquire`] read: the mutex grant, if any.
pub(super) fn acquire_reads(resp: &TxnResponse) -> Option<KeyValue> {
    first(gets(resp).next())
}

/// What decides a refused grant on a key with no mutex grant: its kind
/// record and its queue's head, read in one revision.
pub(super) fn free_key_reads(keys: &MutexKeys) -> Txn {
    Txn::new().and_then([TxnOp::get(keys.kind.as_str(), None), head_of(&keys.queue)])
}

/// The answer to [`free_key_reads`]: the kind record and the queue's head,
/// each if present.
pub(super) fn kind_and_head(resp: &TxnResponse) -> (Option<KeyValue>, Option<KeyValue>) {
    let mut gets = gets(resp);
    (first(gets.next()), first(gets.next()))
}

/// A waiter's entry written (a new one goes last: its create revision is
/// the newest; a repeat keeps its place and renews its ticket).
pub(super) fn enter(entry: &str, value: String, lease: i64) -> Txn {
    Txn::new().and_then([put(entry, value, lease)])
}

/// The head of the queue takes the free key itself: `if the lock's range
/// is empty, the key has no kind and the head's entry is the one read,
/// then put(grant) and delete(entry)`.
pub(super) fn grant_head_itself(
    keys: &MutexKeys,
    entry: &str,
    created: i64,
    value: String,
    lease: i64,
) -> Txn {
    let mut when = free_key(keys);
    when.push(Compare::create_revision(entry, CompareOp::Equal, created));
    Txn::new()
        .when(when)
        .and_then([put(&keys.lock, value, lease), TxnOp::delete(entry, None)])
}

/// The key handed to the queue's head `head` (its entry at `entry`, its
/// grant to be at `grant`): under `when` and iff the head's entry is the
/// one read, grant it on the entry's lease (the head keeps that alive;
/// its create revision is the token), delete the entry and write the
/// hand-off to `announce` (on the same lease) for the head's watch; `also`
/// runs with it (the releaser's delete, a waiter's own entry).
pub(super) fn hand_over(
    mut when: Vec<Compare>,
    head: &Entry,
    entry: &str,
    grant: &str,
    announce: &str,
    also: Vec<TxnOp>,
) -> Txn {
    when.push(Compare::create_revision(
        entry,
        CompareOp::Equal,
        head.created,
    ));
    let mut ops = vec![
        put(grant, head.grant_value(), head.lease),
        TxnOp::delete(entry, None),
        put(
            announce,
            hand_off_value(head.owner, head.ticket),
            head.lease,
        ),
    ];
    ops.extend(also);
    Txn::new().when(when).and_then(ops)
}

/// The key is free and has no kind: what a mutex grant (or a hand-off
/// in an acquire) needs.
pub(super) fn free_key(keys: &MutexKeys) -> Vec<Compare> {
    vec![
        range_empty(&keys.lock),
        Compare::create_revision(keys.kind.as_str(), CompareOp::Equal, 0),
    ]
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

    /// The key has no kind and no mutex grant (under `mutex_key`, the
    /// mutex's range) as read:
    /// claim it as `stored`. The kind key is on no lease: it outlives
    /// every grant.
    pub fn claim(kind_key: &str, mutex_key: &str, stored: &str) -> Self {
        KindClaim {
            compares: vec![
                Compare::create_revision(kind_key, CompareOp::Equal, 0),
                range_empty(mutex_key),
            ],
            ops: vec![TxnOp::put(kind_key, stored, None)],
        }
    }
}

/// The keys a permit's or reader-writer grant reads: the lock's range
/// (`keys::Layout::lock`), the key's kind record and its mutex's range.
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
            // The mutex's range: its one grant, if any.
            TxnOp::get(
                self.mutex.as_str(),
                Some(GetOptions::new().with_prefix().with_limit(1)),
            ),
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
        Seen::Empty => range_empty(base),
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
/// `mod_revision` says when the key was last released (sweep.rs). A
/// mutex's release (`mutex`: its range and its queue's) also needs the
/// queue empty; else it reads the range's grants and the queue's head
/// ([`release_reads`]), and the caller hands over ([`hand_over`]).
pub(super) fn release(
    key: &str,
    owner: OwnerId,
    token: u64,
    kind: Option<(String, &str)>,
    mutex: Option<(&str, &str)>,
) -> Result<Txn> {
    let mut ops = vec![release_delete(key)];
    ops.extend(kind.map(|(record, stored)| TxnOp::put(record, stored, None)));
    let mut when = is_grant_of(key, owner, token)?;
    let txn = match mutex {
        Some((range, queue)) => {
            when.push(range_empty(queue));
            let grants = TxnOp::get(range, Some(GetOptions::new().with_prefix()));
            Txn::new()
                .when(when)
                .and_then(ops)
                .or_else([grants, head_of(queue)])
        }
        None => Txn::new().when(when).and_then(ops),
    };
    Ok(txn)
}

/// A hand-off inside a release ([`Backend::release_to`](crate::backend::Backend::release_to)):
/// iff `at` is `owner`'s grant with `token`, nobody queues at the store
/// (`queue` is empty) and the other place `to` is empty, deletes the
/// grant (bringing it back, for its lease) and puts the next one at `to`
/// on `lease`: a new key, so its create revision, the token, is this
/// transaction's.
pub(super) fn release_to(
    at: &str,
    owner: OwnerId,
    token: u64,
    queue: &str,
    to: &str,
    value: String,
    lease: i64,
) -> Result<Txn> {
    let mut when = is_grant_of(at, owner, token)?;
    when.push(range_empty(queue));
    when.push(Compare::create_revision(to, CompareOp::Equal, 0));
    Ok(Txn::new()
        .when(when)
        .and_then([release_delete(at), put(to, value, lease)]))
}

/// The delete of a released grant, which brings the record back.
pub(super) fn release_delete(key: &str) -> TxnOp {
    TxnOp::delete(key, Some(DeleteOptions::new().with_prev_key()))
}

/// What a refused mutex [`release`] (or a [`leave`]) read: the grants in
/// the mutex's range, and the queue's head if any.
pub(super) fn release_reads(resp: &TxnResponse) -> (Vec<KeyValue>, Option<KeyValue>) {
    let mut gets = gets(resp);
    (gets.next().unwrap_or_default(), first(gets.next()))
}

/// A waiter leaves: its entry goes (named by its owner id, fresh per
/// acquisition: nobody else's), and the mutex's range is read for a grant
/// handed over to it (the caller releases it, handing the key on).
pub(super) fn leave(entry: &str, range: &str) -> Txn {
    Txn::new().and_then([
        TxnOp::delete(entry, None),
        TxnOp::get(range, Some(GetOptions::new().with_prefix())),
    ])
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
pub(super) fn is_grant_of(key: &str, owner: OwnerId, token: u64) -> Result<Vec<Compare>> {
    let token = crate::backend::token_to_i64(token)?;
    let (low, high) = owner_bounds(owner);
    Ok(vec![
        Compare::create_revision(key, CompareOp::Equal, token),
        Compare::value(key, CompareOp::Greater, low),
        Compare::value(key, CompareOp::Less, high),
    ])
}
