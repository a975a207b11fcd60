//! Queues of waiters and the hand-off (the `# Contract`'s queue rules, the
//! etcd way: a waiter is a key whose create revision is its place, as in
//! etcd's own lock recipe).
//!
//! - A waiter's entry `Q/{key}\0{owner}` lives on an etcd lease of its own
//!   with the entry's ttl; each attempt first keeps that lease alive, then
//!   writes the entry with its ticket (a repeat keeps the create revision,
//!   so the place). An entry whose waiter stopped ends with its lease.
//! - The head is the entry with the lowest create revision. A hand-off
//!   puts the head's grant **on the head's entry lease** (the waiter keeps
//!   it alive: the grant lasts at least the claim window from the send of
//!   the attempt whose ticket the entry carries), deletes the entry and
//!   writes the key's announce key with the head and its ticket, which the
//!   head's watch reads (`watch.rs`). The head claims the grant like any
//!   renewal: a keep-alive of that lease, or a move to a lease of its ttl.
//! - A release hands over in its own transaction: the releaser's grant and
//!   the head's are two keys (a mutex grant is named by its owner), since
//!   etcd refuses a delete and a put of one key in one transaction.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{Acquire, AcquireRequest, Busy, Lease, OwnerId};
use crate::error::{Error, Result};
use crate::key::Key;
use crate::notify::HandOff;

use super::errors::STORE;
use super::granted::Granted;
use super::keys::{self, Entry, Record};
use super::leases::GrantId;
use super::spares::Spare;
use super::txns::{self, MutexKeys};
use super::{revision, EtcdBackend, CONFLICT_RETRIES};

/// Past this many tracked entry leases, those not kept alive lately are
/// forgotten (a waiter that took a grant handed over to it stops using its
/// entry's lease without telling this map).
const TRACKED_MAX: usize = 1024;

/// The etcd lease of each queue entry this backend's waiters keep.
#[derive(Debug, Default)]
pub(super) struct EntryLeases(Mutex<HashMap<(String, OwnerId), Kept>>);

#[derive(Debug, Clone, Copy)]
struct Kept {
    lease: Granted,
    at: Instant,
}

impl EntryLeases {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<(String, OwnerId), Kept>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn get(&self, key: &str, owner: OwnerId) -> Option<Granted> {
        self.map()
            .get(&(key.to_owned(), owner))
            .map(|kept| kept.lease)
    }

    fn keep(&self, key: &str, owner: OwnerId, lease: Granted) {
        let mut map = self.map();
        if map.len() >= TRACKED_MAX {
            map.retain(|_, kept| kept.at.elapsed() < kept.lease.ttl * 2);
        }
        let at = Instant::now();
        map.insert((key.to_owned(), owner), Kept { lease, at });
    }

    /// Stops tracking `owner`'s entry lease of `key`, returning it.
    pub(super) fn take(&self, key: &str, owner: OwnerId) -> Option<Granted> {
        self.map()
            .remove(&(key.to_owned(), owner))
            .map(|kept| kept.lease)
    }
}

/// Whether a transaction failed because a lease it attaches a key to is
/// gone (a head whose entry's lease ran out as it was handed the key).
fn lease_gone(e: &Error) -> bool {
    e.to_string().contains("lease not found")
}

impl EtcdBackend {
    /// The attempts of a mutex grant on the fresh lease `spare`: the
    /// answer, and whether the grant is on it (else the caller revokes it
    /// or keeps it for later). A busy key is queued for if the request
    /// queues; a free key with a queue goes to its head.
    pub(super) async fn acquire_mutex(
        &self,
        req: &AcquireRequest,
        spare: Spare,
        promised: Duration,
    ) -> Result<(Acquire, bool)> {
        let fresh = spare.granted;
        let key = req.key().as_str();
        let names = MutexKeys::of(&self.inner.layout, key);
        // A grant is made in the first place of the lock's range.
        let grant_key = &names.lock;
        let granted_here = |token: u64| {
            let lease = req.granted(token).enforced_for(promised);
            self.remember(grant_key, &lease, fresh, spare.asked_secs);
            Ok((Acquire::Granted(lease), true))
        };
        // A waiter that queued before keeps its entry's lease alive while
        // the first transaction runs: it must come before the entry's write
        // (the lease then outlives the claim window counted from this
        // attempt's send), not after the grant's transaction.
        let mut entry_lease = req
            .queue_entry_ttl()
            .and_then(|_| self.inner.entries.get(key, req.owner()))
            .map(KeptAlive::Due);
        for _ in 0..CONFLICT_RETRIES {
            let value = keys::value(req.owner(), fresh.ttl, req.holder());
            let txn = self.txn(txns::acquire(&names, value.clone(), fresh.id));
            let resp = match entry_lease {
                Some(KeptAlive::Due(lease)) => {
                    let (alive, resp) = tokio::join!(self.keep_alive(lease.id), txn);
                    entry_lease = Some(KeptAlive::Done(alive?.then_some(lease)));
                    resp?
                }
                _ => txn.await?,
            };
            if resp.succeeded() {
                return granted_here(revision(&resp)?);
            }
            if let Some(kv) = txns::acquire_reads(&resp) {
                let record = Record::decode(key, &kv)?;
                if record.lease == fresh.id {
                    // Our own transaction, committed though its answer was
                    // lost and the request resent: the grant is on the
                    // fresh lease, as asked.
                    return granted_here(record.token);
                }
                if record.owner == req.owner() {
                    // A repeat of a live grant (or the claim of one handed
                    // over, on the entry's lease, which `extend` keeps
                    // alive or moves from): the same grant, extended.
                    self.inner.entries.take(key, req.owner());
                    let at = String::from_utf8_lossy(kv.key()).into_owned();
                    if let Some(ttl) = self.extend(&at, &record, req.ttl()).await? {
                        let lease = req.granted(record.token).enforced_for(ttl);
                        return Ok((Acquire::Granted(lease), false));
                    }
                    continue; // it lapsed: the ordinary rules
                }
                if req.queue_entry_ttl().is_none() {
                    return Ok((Acquire::Busy(self.busy(&record).await?), false));
                }
                let write = self.entry_write(req, entry_lease.take()).await?;
                self.txn(write.into()).await?;
                // The longest the holder's lease can last, without a
                // round trip more: a queued waiter is told of its turn.
                let busy = Busy {
                    holder: record.holder,
                    remaining: record.ttl,
                };
                return Ok((Acquire::Busy(busy), false));
            }
            // No grant: another kind of lock, free behind a queue, or
            // changed since the compare.
            let reads = self.txn(txns::free_key_reads(&names)).await?;
            let (kind_kv, head_kv) = txns::kind_and_head(&reads);
            if let Some(kind) = kind_kv {
                // A reader-writer lock or a semaphore: nothing was written.
                return Ok((Acquire::OtherKind(super::kind_of(req.key(), &kind)?), false));
            }
            let Some(head) = head_kv else { continue };
            let head = Entry::decode(key, &head)?;
            if head.owner == req.owner() {
                let entry = self.inner.layout.entry(key, req.owner());
                let txn = txns::grant_head_itself(&names, &entry, head.created, value, fresh.id);
                let resp = self.txn(txn).await?;
                if resp.succeeded() {
                    if let Some(entry_lease) = self.inner.entries.take(key, req.owner()) {
                        self.revoke_later(entry_lease.id);
                    }
                    return granted_here(revision(&resp)?);
                }
                continue;
            }
            let mine = match req.queue_entry_ttl() {
                Some(_) => self.entry_write(req, entry_lease.take()).await?.into_ops(),
                None => Vec::new(),
            };
            let when = txns::free_key(&names);
            if self
                .hand_over(req.key(), &head, grant_key, when, mine)
                .await?
            {
                let busy = Busy {
                    holder: head.holder,
                    remaining: head.ttl,
                };
                return Ok((Acquire::Busy(busy), false));
            }
        }
        Err(Error::unavailable("etcd: too many concurrent changes to this lock").in_store(STORE))
    }

    /// The write of `req`'s queue entry with this attempt's ticket, its
    /// lease kept alive (or granted) first, so the lease outlives the
    /// claim window counted from this attempt's send (`kept`: that
    /// keep-alive, if this attempt sent it already).
    async fn entry_write(
        &self,
        req: &AcquireRequest,
        kept: Option<KeptAlive>,
    ) -> Result<EntryWrite> {
        let (Some(ttl), Some(ticket)) = (req.queue_entry_ttl(), req.queue_ticket()) else {
            return Err(Error::backend("a queue entry without its ttl and ticket").in_store(STORE));
        };
        let key = req.key().as_str();
        let alive = match kept {
            Some(KeptAlive::Done(alive)) => alive,
            Some(KeptAlive::Due(lease)) => self.keep_alive(lease.id).await?.then_some(lease),
            None => match self.inner.entries.get(key, req.owner()) {
                Some(lease) => self.keep_alive(lease.id).await?.then_some(lease),
                None => None,
            },
        };
        let lease = match alive {
            Some(lease) => lease,
            None => self.grant_lease(ttl).await?,
        };
        self.inner.entries.keep(key, req.owner(), lease);
        let value = keys::entry_value(req.owner(), lease.ttl, ticket, req.holder());
        Ok(EntryWrite {
            key: self.inner.layout.entry(key, req.owner()),
            value,
            lease: lease.id,
        })
    }

    /// Hands `key` to `head`, its grant at `to`, under `when` (the key is
    /// free, or it is the releaser's grant), with `also`; tells the head at
    /// once if it waits in this process (its watch tells it anyway).
    /// Whether it was done (else what was read changed: read again).
    async fn hand_over(
        &self,
        key: &Key,
        head: &Entry,
        to: &str,
        when: Vec<etcd_client::Compare>,
        also: Vec<etcd_client::TxnOp>,
    ) -> Result<bool> {
        let layout = &self.inner.layout;
        let txn = txns::hand_over(
            when,
            head,
            &layout.entry(key.as_str(), head.owner),
            to,
            &layout.announce(key.as_str()),
            also,
        );
        let resp = match self.txn(txn).await {
            Ok(resp) => resp,
            Err(e) if lease_gone(&e) => return Ok(false),
            Err(e) => return Err(e),
        };
        if !resp.succeeded() {
            return Ok(false);
        }
        self.let_go_deleted(&resp);
        let grant = HandOff {
            token: revision(&resp)?,
            ticket: head.ticket,
        };
        self.inner
            .watcher
            .hand_over_local(key.as_str(), head.owner, grant);
        Ok(true)
    }

    /// Releases `owner`'s mutex grant of `key` with `token` (first tried
    /// at `at`: its place in the range, if known, else the first),
    /// handing the key to the queue's head in the same transaction if it
    /// has one. Whether the grant was there.
    pub(super) async fn release_mutex(
        &self,
        key: &Key,
        at: &str,
        owner: OwnerId,
        token: u64,
    ) -> Result<bool> {
        let layout = &self.inner.layout;
        let (range, queue) = (layout.mutex(key.as_str()), layout.queue(key.as_str()));
        let mut at = at.to_owned();
        for _ in 0..CONFLICT_RETRIES {
            let txn = txns::release(&at, owner, token, None, Some((&range, &queue)))?;
            let resp = self.txn(txn).await?;
            if resp.succeeded() {
                self.let_go_deleted(&resp);
                self.inner.watcher.wake_local(key.as_str());
                return Ok(true);
            }
            let (grants, head) = txns::release_reads(&resp);
            let Some((found, _)) = super::grant_among(key, &grants, owner, token)? else {
                return Ok(false);
            };
            at = found;
            let Some(head) = head else {
                continue; // in the other place, or the queue emptied
            };
            let head = Entry::decode(key.as_str(), &head)?;
            let when = txns::is_grant_of(&at, owner, token)?;
            let to = layout.other_mutex_place(key.as_str(), at.as_bytes());
            let release = vec![txns::release_delete(&at)];
            if self.hand_over(key, &head, &to, when, release).await? {
                return Ok(true);
            }
        }
        Err(Error::unavailable("etcd: too many concurrent changes to this lock").in_store(STORE))
    }

    /// [`Backend::release_to`](crate::backend::Backend::release_to):
    /// `lease` released and `next` granted in the other place of the
    /// mutex's range, on a lease of its own (a spare, as any grant), in one
    /// transaction ([`txns::release_to`]); `None` if that transaction's
    /// conditions failed (nothing changed: the caller releases as usual).
    pub(super) async fn release_mutex_to(
        &self,
        lease: &Lease,
        next: &AcquireRequest,
    ) -> Result<Option<Lease>> {
        let key = lease.key().as_str();
        let layout = &self.inner.layout;
        let range = layout.mutex(key);
        let grant = GrantId::of(&range, lease);
        // Where the grant is: the first place, unless a hand-off put it.
        let at = self
            .inner
            .leases
            .place(&grant)
            .unwrap_or_else(|| range.clone());
        let to = layout.other_mutex_place(key, at.as_bytes());
        let (spare, promised) = self.lease_for_grant(next.ttl()).await?;
        let fresh = spare.granted;
        let value = keys::value(next.owner(), fresh.ttl, next.holder());
        let txn = txns::release_to(
            &at,
            lease.owner(),
            lease.token(),
            &layout.queue(key),
            &to,
            value,
            fresh.id,
        )?;
        let resp = match self.txn(txn).await {
            Ok(resp) => resp,
            Err(e) => {
                // Its answer may have been lost after it put the grant:
                // revoking the lease deletes that grant.
                self.revoke_later(fresh.id);
                return Err(e);
            }
        };
        if !resp.succeeded() {
            self.give_back(spare);
            return Ok(None);
        }
        self.inner.leases.forget(&grant);
        self.let_go_deleted(&resp);
        self.refill_later(next.ttl());
        let granted = next.granted(revision(&resp)?).enforced_for(promised);
        self.inner
            .leases
            .remember_at(GrantId::of(&range, &granted), fresh, to);
        self.inner.spares.in_use(fresh, spare.asked_secs);
        Ok(Some(granted))
    }

    /// Takes `owner` out of `key`'s queue and gives back a grant handed
    /// over to it (to the next head).
    pub(super) async fn leave(&self, key: &Key, owner: OwnerId) -> Result<()> {
        let layout = &self.inner.layout;
        let entry = layout.entry(key.as_str(), owner);
        let range = layout.mutex(key.as_str());
        let resp = self.txn(txns::leave(&entry, &range)).await?;
        let (grants, _) = txns::release_reads(&resp);
        // A grant handed over to it that it never claimed goes on.
        if let Some((at, record)) = super::grant_of(key, &grants, owner)? {
            self.release_mutex(key, &at, owner, record.token).await?;
        }
        if let Some(lease) = self.inner.entries.take(key.as_str(), owner) {
            self.revoke_later(lease.id);
        }
        Ok(())
    }
}

/// A waiter's entry lease in an attempt: to keep alive, or kept alive
/// (`None`: it had ended).
#[derive(Debug, Clone, Copy)]
enum KeptAlive {
    Due(Granted),
    Done(Option<Granted>),
}

/// A queue entry to write: alone, or inside another transaction.
struct EntryWrite {
    key: String,
    value: String,
    lease: i64,
}

impl EntryWrite {
    fn into_ops(self) -> Vec<etcd_client::TxnOp> {
        vec![txns::put(&self.key, self.value, self.lease)]
    }
}

impl From<EntryWrite> for etcd_client::Txn {
    fn from(write: EntryWrite) -> Self {
        txns::enter(&write.key, write.value, write.lease)
    }
}
