//! In-process queueing of waiters: tasks of one process that wait for the
//! same key line up here in FIFO order, and only the first of them waits at
//! the store.
//!
//! Without it, a task that releases a key and asks for it again at once
//! beats its woken neighbours to the store every time (they are still being
//! scheduled), starving them; and N local waiters would each poll the store.
//!
//! The front waiter's turn ends when the store grants it the key, not when
//! the resulting guard is dropped: while this process holds the key, the
//! next local waiter already waits at the store, exactly as a waiter in
//! another process would. So a guard whose lease was lost (expired, broken by
//! `force_release`) never keeps its own process out of a key the store
//! considers free, and a holder that releases and re-acquires still queues
//! behind that waiter.
//!
//! The queue also counts the live guards of each key ([`LocalHold`]), so a
//! wait that times out can say that it waited behind this very process.
//!
//! **Hand-off inside the release.** On a store that can release a mutex and
//! grant it to a given request in one atomic operation
//! ([`Backend::release_to`](crate::backend::Backend::release_to)), each
//! waiter leaves its request with the key's queue as it arrives
//! ([`LocalQueues::offer`]), and the guard that releases the key takes the
//! oldest one ([`LocalHold::take_offer`]) and grants it in the release: one
//! store write passes the key on, where a release, a wake-up and the
//! waiter's own attempt took two writes and a hop. Offers are made on
//! arrival, not when a waiter reaches the front: a holder that releases at
//! once would otherwise always release before its successor's offer. (A
//! waiter with nobody ahead of it and no holder here makes none: the
//! uncontended acquire pays nothing for the hand-off.) The
//! front waiter withdraws its offer while it asks the store itself and
//! makes it again, first in line, when it goes back to waiting. A process
//! does this at most [`HAND_OFFS_IN_A_ROW`] times in a row for a key; then
//! one release frees the key at the store, and the waiters of this process
//! step aside for as long as that release took ([`Successor::StepAside`]),
//! so the waiters of other processes, woken by it, reach the store first
//! (docs/fairness.md, "A release that hands over in this process"): the
//! local waiter, woken in-process, would otherwise win that race nearly
//! every time and the key would stay here.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::backend::{AcquireRequest, Lease};
use crate::key::Key;

/// How many releases in a row of one key may hand it to a waiter of this
/// process before one frees it at the store. Each hand-off saves a store
/// write; the release after them lets other processes' waiters race for
/// the key (measured: docs/fairness.md).
pub(crate) const HAND_OFFS_IN_A_ROW: u32 = 4;

/// The per-key queues of one [`Locks`](crate::Locks) handle and its clones.
#[derive(Debug, Default)]
pub(crate) struct LocalQueues {
    queues: Mutex<HashMap<Key, Arc<KeyQueue>>>,
}

/// One key's local state.
#[derive(Debug)]
struct KeyQueue {
    /// One permit: the front of the queue, the waiter that goes to the store.
    front: Arc<Semaphore>,
    /// Live guards of this key in this process.
    holders: AtomicUsize,
    /// The waiters' requests, oldest first, left for a releasing guard of
    /// this process to hand the key to.
    offers: Mutex<Offers>,
    /// Releases of this key in a row that handed it over here.
    handed_in_a_row: AtomicU32,
    /// Until when this process's waiters leave the key to other processes
    /// after a release that ended a run of hand-offs.
    step_aside_until: Mutex<Option<Instant>>,
    /// When a waiter here last found the key held by another process: the
    /// waiters here step aside at the end of a run of hand-offs only if
    /// that was less than [`WANTED_ELSEWHERE_FOR`] ago (alone on a key,
    /// stepping aside would leave it idle).
    held_elsewhere_at: Mutex<Option<Instant>>,
}

/// How long a key found held by another process counts as wanted there.
const WANTED_ELSEWHERE_FOR: std::time::Duration = std::time::Duration::from_secs(1);

/// The open offers of a key, oldest first.
#[derive(Debug, Default)]
struct Offers {
    open: VecDeque<Offered>,
    /// The id of the next offer.
    next: u64,
}

/// An open offer: the request, and where its grant goes.
#[derive(Debug)]
struct Offered {
    id: u64,
    request: Arc<AcquireRequest>,
    reply: oneshot::Sender<Option<Handed>>,
}

/// A grant a releasing guard made to the front waiter, and when the
/// release that made it was sent (on the lease clock: its ttl counts from
/// then).
#[derive(Debug)]
pub(crate) struct Handed {
    pub lease: Lease,
    pub sent_at: Instant,
}

/// A waiter's side of its offer ([`LocalQueues::offer`]). Dropped, it
/// withdraws the offer; a grant made for it after that is released by the
/// guard that made it.
#[derive(Debug)]
pub(crate) struct LocalOffer {
    entry: Entry,
    id: u64,
    reply: oneshot::Receiver<Option<Handed>>,
}

/// Who a releasing guard passes the key to ([`LocalHold::take_offer`]).
#[derive(Debug)]
pub(crate) enum Successor {
    /// Nobody of this process waits: the release frees the key as usual.
    Nobody,
    /// The oldest offer, to grant inside the release.
    Offer(TakenOffer),
    /// Waiters of this process wait, but the key was handed over here
    /// [`HAND_OFFS_IN_A_ROW`] times in a row: the release frees it, and
    /// then they step aside ([`StepAside::for_as_long_as`]).
    StepAside(StepAside),
}

/// The waiters of a key step aside after a release that freed it at the
/// end of a run of hand-offs.
#[derive(Debug)]
pub(crate) struct StepAside {
    queue: Arc<KeyQueue>,
}

/// A releasing guard's side of an offer it took ([`LocalHold::take_offer`]):
/// it must answer, with a grant or with `None` (it released as usual).
#[derive(Debug)]
pub(crate) struct TakenOffer {
    request: Arc<AcquireRequest>,
    reply: oneshot::Sender<Option<Handed>>,
}

/// A task's turn at the front of its key's local queue, held while it waits
/// at the store. Dropped once the store granted the key (or the wait ended).
#[derive(Debug)]
pub(crate) struct LocalTurn {
    _permit: Option<OwnedSemaphorePermit>,
    entry: Entry,
}

/// A live guard's mark on its key.
#[derive(Debug)]
pub(crate) struct LocalHold {
    entry: Entry,
}

/// A counted reference to a key's queue; the last one removes the queue
/// from the map, so it does not grow with every key ever used.
#[derive(Debug)]
struct Entry {
    queues: Arc<LocalQueues>,
    key: Key,
    queue: Option<Arc<KeyQueue>>,
}

impl LocalQueues {
    /// Waits for this task's turn on `key`. Cancel safe: dropping the future
    /// leaves the queue.
    pub(crate) async fn turn(self: &Arc<Self>, key: &Key) -> LocalTurn {
        let entry = self.entry(key);
        let front = entry.queue().front.clone();
        // The semaphore is never closed, so acquiring cannot fail.
        let permit = front.acquire_owned().await.ok();
        LocalTurn {
            _permit: permit,
            entry,
        }
    }

    /// This task's turn on `key` if nobody of this process is ahead of it
    /// (the semaphore hands a freed permit to its oldest waiter, so a free
    /// one means an empty line).
    pub(crate) fn try_turn(self: &Arc<Self>, key: &Key) -> Option<LocalTurn> {
        let entry = self.entry(key);
        let permit = entry.queue().front.clone().try_acquire_owned().ok()?;
        Some(LocalTurn {
            _permit: Some(permit),
            entry,
        })
    }

    /// Whether a guard of this process holds `key` right now (the map's
    /// lock and a lookup; a waiter with its turn asks
    /// [`LocalTurn::behind_a_holder`] instead).
    pub(crate) fn is_held_here(&self, key: &Key) -> bool {
        self.lock()
            .get(key)
            .is_some_and(|q| q.holders.load(Ordering::Relaxed) > 0)
    }

    /// Marks `key` as held by a guard of this process until the returned
    /// value is dropped.
    pub(crate) fn hold(self: &Arc<Self>, key: &Key) -> LocalHold {
        let entry = self.entry(key);
        entry.queue().holders.fetch_add(1, Ordering::Relaxed);
        LocalHold { entry }
    }

    /// Leaves `request` (a mutex request of a waiter for `key`) for the
    /// next guard of this process that releases the key: it may hand the
    /// key over inside its release. Last in line, or `first` (the front
    /// waiter, going back to waiting after an attempt of its own).
    pub(crate) fn offer(
        self: &Arc<Self>,
        key: &Key,
        request: Arc<AcquireRequest>,
        first: bool,
    ) -> LocalOffer {
        let entry = self.entry(key);
        let (reply, answer) = oneshot::channel();
        let id = {
            let mut offers = lock(&entry.queue().offers);
            let id = offers.next;
            offers.next += 1;
            let offered = Offered { id, request, reply };
            if first {
                offers.open.push_front(offered);
            } else {
                offers.open.push_back(offered);
            }
            id
        };
        LocalOffer {
            entry,
            id,
            reply: answer,
        }
    }

    fn entry(self: &Arc<Self>, key: &Key) -> Entry {
        let queue = self
            .lock()
            .entry(key.clone())
            .or_insert_with(|| {
                Arc::new(KeyQueue {
                    front: Arc::new(Semaphore::new(1)),
                    holders: AtomicUsize::new(0),
                    offers: Mutex::default(),
                    handed_in_a_row: AtomicU32::new(0),
                    step_aside_until: Mutex::default(),
                    held_elsewhere_at: Mutex::default(),
                })
            })
            .clone();
        Entry {
            queues: self.clone(),
            key: key.clone(),
            queue: Some(queue),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Key, Arc<KeyQueue>>> {
        // Every update is a single insert or remove: a panic cannot leave
        // the map half-changed, so poison is ignored.
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LocalTurn {
    /// Whether a guard of this process holds the turn's key right now:
    /// one atomic read of the key's queue this turn already holds.
    pub(crate) fn behind_a_holder(&self) -> bool {
        self.entry.queue().holders.load(Ordering::Relaxed) > 0
    }

    /// Notes that this waiter's attempt found the key busy with no guard of
    /// this process on it: another process holds it.
    pub(crate) fn found_held_elsewhere(&self) {
        let queue = self.entry.queue();
        if queue.holders.load(Ordering::Relaxed) == 0 {
            *lock(&queue.held_elsewhere_at) = Some(Instant::now());
        }
    }

    /// Until when this waiter leaves the key to other processes (a release
    /// of this process just freed it after a run of hand-offs), if that is
    /// still to come.
    pub(crate) fn stepping_aside(&self) -> Option<Instant> {
        let until = *lock(&self.entry.queue().step_aside_until);
        until.filter(|&t| t > Instant::now())
    }
}

impl LocalOffer {
    /// The answer of the guard that took the offer: a grant, or `None` (it
    /// released as usual, or went away). Pending while nobody took it.
    pub(crate) async fn answered(&mut self) -> Option<Handed> {
        (&mut self.reply).await.ok().flatten()
    }

    /// Takes the offer back, before its waiter asks the store: `true` if no
    /// guard had taken it; `false` if one has, and its
    /// [`answered`](Self::answered) is on its way.
    pub(crate) fn withdraw(&mut self) -> bool {
        let mut offers = lock(&self.entry.queue().offers);
        let open = offers.open.iter().position(|o| o.id == self.id);
        open.and_then(|at| offers.open.remove(at)).is_some()
    }
}

impl Drop for LocalOffer {
    fn drop(&mut self) {
        self.withdraw();
    }
}

impl LocalHold {
    /// Who this guard's release passes the key to: the oldest open offer,
    /// unless the key was handed over here [`HAND_OFFS_IN_A_ROW`] times in
    /// a row (then this release frees it, and the waiters here step aside
    /// if another process was seen holding the key lately).
    pub(crate) fn take_offer(&self) -> Successor {
        let queue = self.entry.queue();
        let mut offers = lock(&queue.offers);
        if !offers.open.is_empty()
            && queue.handed_in_a_row.load(Ordering::Relaxed) >= HAND_OFFS_IN_A_ROW
        {
            queue.handed_in_a_row.store(0, Ordering::Relaxed);
            let seen = *lock(&queue.held_elsewhere_at);
            if seen.is_none_or(|at| at.elapsed() > WANTED_ELSEWHERE_FOR) {
                return Successor::Nobody;
            }
            let queue = self.entry.queue.clone().expect("entry in use");
            return Successor::StepAside(StepAside { queue });
        }
        match offers.open.pop_front() {
            Some(o) => {
                queue.handed_in_a_row.fetch_add(1, Ordering::Relaxed);
                Successor::Offer(TakenOffer {
                    request: o.request,
                    reply: o.reply,
                })
            }
            None => {
                queue.handed_in_a_row.store(0, Ordering::Relaxed);
                Successor::Nobody
            }
        }
    }
}

impl StepAside {
    /// The key is free at the store since now: this process's waiters
    /// leave it to others for `long`, about the time other processes'
    /// waiters need to learn of the release and ask.
    pub(crate) fn for_as_long_as(self, long: std::time::Duration) {
        *lock(&self.queue.step_aside_until) = Some(Instant::now() + long);
    }
}

impl TakenOffer {
    /// The request to grant.
    pub(crate) fn request(&self) -> &AcquireRequest {
        &self.request
    }

    /// Tells the waiter: its grant, or `None`. A grant whose waiter went
    /// away comes back (`Err`) for the caller to release.
    pub(crate) fn answer(self, handed: Option<Handed>) -> Result<(), Handed> {
        match self.reply.send(handed) {
            Ok(()) => Ok(()),
            Err(Some(handed)) => Err(handed),
            Err(None) => Ok(()),
        }
    }
}

/// Locks an offer slot. Every update is a single replace: a panic cannot
/// leave it half-changed, so poison is ignored.
fn lock<T>(slot: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    slot.lock().unwrap_or_else(|p| p.into_inner())
}

impl Entry {
    fn queue(&self) -> &KeyQueue {
        // Only taken in drop.
        self.queue.as_deref().expect("entry in use")
    }
}

impl Drop for LocalHold {
    fn drop(&mut self) {
        self.entry.queue().holders.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        drop(self.queue.take());
        let mut queues = self.queues.lock();
        if queues
            .get(&self.key)
            .is_some_and(|q| Arc::strong_count(q) == 1)
        {
            queues.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn turns_are_first_come_first_served_and_cleaned_up() {
        let queues = Arc::new(LocalQueues::default());
        let key = Key::new("k").unwrap();
        let first = queues.turn(&key).await;
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..3 {
            let (q, k, o) = (queues.clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let turn = q.turn(&k).await;
                o.lock().unwrap().push(i);
                tokio::time::sleep(Duration::from_millis(1)).await;
                drop(turn);
            }));
            // Queue them in a known order.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(first);
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), [0, 1, 2]);
        assert!(
            queues.lock().is_empty(),
            "queue removed after the last turn"
        );
    }

    #[tokio::test]
    async fn a_hold_does_not_block_the_next_turn_but_is_counted() {
        let queues = Arc::new(LocalQueues::default());
        let key = Key::new("k").unwrap();
        let hold = queues.hold(&key);
        assert!(queues.is_held_here(&key));
        let turn = tokio::time::timeout(Duration::from_secs(1), queues.turn(&key))
            .await
            .expect("a guard does not hold the queue");
        drop(hold);
        assert!(!queues.is_held_here(&key));
        drop(turn);
        assert!(queues.lock().is_empty());
    }

    /// After HAND_OFFS_IN_A_ROW hand-offs the next release frees the key
    /// and the waiters here step aside for as long as it is told; a release
    /// with nobody waiting starts the count again.
    #[tokio::test(start_paused = true)]
    async fn a_run_of_hand_offs_ends_in_a_release_the_waiters_here_step_aside_for() {
        let queues = Arc::new(LocalQueues::default());
        let key = Key::new("k").unwrap();
        let request =
            Arc::new(AcquireRequest::new(key.clone(), Duration::from_secs(1), "h").unwrap());
        let hold = queues.hold(&key);
        let turn = queues.turn(&key).await;
        let _offers: Vec<LocalOffer> = (0..5 * HAND_OFFS_IN_A_ROW)
            .map(|_| queues.offer(&key, request.clone(), false))
            .collect();
        for _ in 0..HAND_OFFS_IN_A_ROW {
            assert!(matches!(hold.take_offer(), Successor::Offer(_)));
        }
        assert_eq!(turn.stepping_aside(), None);
        // Nobody else was seen wanting the key: the fifth release frees
        // it, and nobody steps aside.
        assert!(matches!(hold.take_offer(), Successor::Nobody));
        for _ in 0..HAND_OFFS_IN_A_ROW {
            assert!(matches!(hold.take_offer(), Successor::Offer(_)));
        }
        // A waiter found the key held with no guard here: held elsewhere.
        // (The hold is dropped for that, and taken again.)
        drop(hold);
        turn.found_held_elsewhere();
        let hold = queues.hold(&key);
        let Successor::StepAside(aside) = hold.take_offer() else {
            panic!("the fifth release in a row frees the key");
        };
        for _ in 0..HAND_OFFS_IN_A_ROW {
            assert!(matches!(hold.take_offer(), Successor::Offer(_)));
        }
        // Seen lately still: the next run ends the same way.
        assert!(matches!(hold.take_offer(), Successor::StepAside(_)));
        aside.for_as_long_as(Duration::from_millis(2));
        let until = turn.stepping_aside().expect("stepping aside now");
        assert_eq!(until, Instant::now() + Duration::from_millis(2));
        tokio::time::sleep(Duration::from_millis(2)).await;
        assert_eq!(turn.stepping_aside(), None, "over once its time passed");
        // The count started again: the next release hands over.
        assert!(matches!(hold.take_offer(), Successor::Offer(_)));
        // Not seen for longer than WANTED_ELSEWHERE_FOR: nobody steps aside.
        tokio::time::sleep(WANTED_ELSEWHERE_FOR).await;
        for _ in 1..HAND_OFFS_IN_A_ROW {
            assert!(matches!(hold.take_offer(), Successor::Offer(_)));
        }
        assert!(matches!(hold.take_offer(), Successor::Nobody));
    }
}
