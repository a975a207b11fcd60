//! The transactions of the protocol, one builder per operation, so each
//! operation's compares are in one place (a further condition on a grant
//! is one more compare here).
//!
//! Every grant key is attached to its own etcd lease; its
//! `create_revision` is the fencing token (`keys.rs`).

use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp};

use crate::backend::OwnerId;
use crate::error::Result;

use super::keys::{owner_bounds, Record};

fn put(key: &str, value: String, lease: i64) -> TxnOp {
    TxnOp::put(key, value, Some(PutOptions::new().with_lease(lease)))
}

/// Mutex grant: `if create_revision(key) == 0 then put(key, value, lease)
/// else get(key)`. One round trip; a busy answer carries the holder's
/// record (and its lease, for the time left).
pub(super) fn acquire(key: &str, value: String, lease: i64) -> Txn {
    Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([put(key, value, lease)])
        .or_else([TxnOp::get(key, None)])
}

/// A permit or reader-writer grant in `key` (one slot of the lock whose
/// records are the range `base`), iff nothing in the range changed since
/// the read at revision `read` and the slot is free; `also` runs with it.
pub(super) fn claim(
    base: &str,
    read: i64,
    key: &str,
    value: String,
    lease: i64,
    also: Vec<TxnOp>,
) -> Txn {
    let mut ops = vec![put(key, value, lease)];
    ops.extend(also);
    Txn::new()
        .when([
            unchanged_since(base, read),
            Compare::create_revision(key, CompareOp::Equal, 0),
        ])
        .and_then(ops)
}

/// A waiting writer's marker, iff the lock's range is as read.
pub(super) fn mark(base: &str, read: i64, marker: &str, value: String, lease: i64) -> Txn {
    Txn::new()
        .when([unchanged_since(base, read)])
        .and_then([put(marker, value, lease)])
}

/// "Nothing under `base` was written after revision `read`" (a key
/// deleted since is not compared: a freed slot never makes a grant wrong).
fn unchanged_since(base: &str, read: i64) -> Compare {
    Compare::mod_revision(base, CompareOp::Less, read + 1).with_prefix()
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
/// the deleted record comes back (its lease is then revoked).
pub(super) fn release(key: &str, owner: OwnerId, token: u64) -> Result<Txn> {
    Ok(Txn::new()
        .when(is_grant_of(key, owner, token)?)
        .and_then([TxnOp::delete(
            key,
            Some(DeleteOptions::new().with_prev_key()),
        )]))
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
