//! A waiter's place in a key's queue at the store (issue 31): the tickets
//! of its attempts, the grant a release hands over to it, and leaving the
//! queue when its wait ends without a grant.
//!
//! Where the store keeps queues ([`Backend::queues`]), every waiter of a
//! mutex queues there, first come, first served across processes, instead
//! of lining up in its process's local queue (local.rs) and racing the
//! other processes at each release. Each attempt renews the waiter's entry
//! and numbers itself (its *ticket*); a release hands the key to the head
//! and tells that waiter alone, with the token and the ticket its entry
//! carried. The waiter builds its guard from that without another round
//! trip, and claims the grant with a renewal at once.
//!
//! **From when the handed grant counts.** The store granted it for the
//! claim window at some moment after it processed the attempt whose
//! ticket the entry carried; that attempt's send time is a safe start (as
//! an ordinary grant counts from its request's send time). A hand-off is
//! stale if a later attempt was answered busy: the store answered that
//! attempt after the hand-off (the entry would otherwise carry its ticket),
//! so the grant had lapsed by then (a live one would have been answered
//! as a repeat, granted).

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::backend::{AcquireRequest, Backend, OwnerId, QUEUE_ENTRY_TTL};
use crate::background::Background;
use crate::key::Key;
use crate::notify::HandOff;
use crate::time::Backoff;

/// A waiter's place in the store's queue of one key, for one acquisition.
///
/// Dropped before it is [`settle`](Self::settle)d (the wait timed out,
/// was cancelled or failed, or its future was dropped), it takes the
/// owner out of the queue in the background, and gives back a grant
/// handed over to it meanwhile; a store that cannot be told drops the
/// entry at the end of its lease anyway.
pub(crate) struct QueueSeat {
    backend: Arc<dyn Backend>,
    key: Key,
    owner: OwnerId,
    background: Background,
    /// When each attempt was sent, on the lease clock, by ticket.
    sent: Vec<Instant>,
    /// The ticket of the last attempt answered busy.
    last_busy: Option<u32>,
    /// Between two attempts: about a third of the entry's lease, so two
    /// renewals may fail before the entry dies.
    refresh: Backoff,
    settled: bool,
}

impl QueueSeat {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        request: &AcquireRequest,
        background: Background,
    ) -> Self {
        QueueSeat {
            backend,
            key: request.key().clone(),
            owner: request.owner(),
            background,
            sent: Vec::new(),
            last_busy: None,
            refresh: Backoff::new(QUEUE_ENTRY_TTL / 3, QUEUE_ENTRY_TTL / 3),
            settled: false,
        }
    }

    /// `request` as the next attempt, sent at `sent_at` (lease clock),
    /// with its queue entry and a fresh ticket.
    pub(crate) fn next_attempt(
        &mut self,
        request: &AcquireRequest,
        sent_at: Instant,
    ) -> AcquireRequest {
        let ticket = u32::try_from(self.sent.len()).unwrap_or(u32::MAX);
        self.sent.push(sent_at);
        request.clone().with_queue_entry(QUEUE_ENTRY_TTL, ticket)
    }

    /// The last attempt was answered busy.
    pub(crate) fn busy(&mut self) {
        self.last_busy = self
            .sent
            .len()
            .checked_sub(1)
            .and_then(|t| u32::try_from(t).ok());
    }

    /// How long to sleep before the next attempt renews the entry.
    pub(crate) fn next_refresh(&mut self) -> Duration {
        self.refresh.next_delay()
    }

    /// From when (lease clock) the handed-over `grant` counts, unless it is
    /// stale (see the module docs).
    pub(crate) fn counts_from(&self, grant: HandOff) -> Option<Instant> {
        if self.last_busy.is_some_and(|busy| busy > grant.ticket) {
            return None;
        }
        self.sent.get(usize::try_from(grant.ticket).ok()?).copied()
    }

    /// The wait took a grant (or left the queue's business to the store):
    /// nothing to undo.
    pub(crate) fn settle(&mut self) {
        self.settled = true;
    }
}

impl Drop for QueueSeat {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        let backend = self.backend.clone();
        let key = self.key.clone();
        let owner = self.owner;
        // A grant handed over meanwhile is given back by the same call.
        // The key's next acquisition through this handle does not wait
        // for it (a blocked store would hold that one up too): at worst it
        // finds the key busy and queues, and the leave hands the key on.
        self.background.spawn(async move {
            if let Err(e) = backend.leave_queue(&key, owner).await {
                tracing::debug!(%key, error = %e, "could not leave the queue; the entry expires by itself");
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backends::memory::MemoryBackend;

    fn seat() -> (QueueSeat, AcquireRequest) {
        let request =
            AcquireRequest::new(Key::new("k").unwrap(), Duration::from_secs(5), "test").unwrap();
        let seat = QueueSeat::new(
            Arc::new(MemoryBackend::new()),
            &request,
            Background::On(tokio::runtime::Handle::current()),
        );
        (seat, request)
    }

    #[tokio::test]
    async fn tickets_count_up_and_a_hand_off_counts_from_its_attempt() {
        let (mut seat, request) = seat();
        let t0 = Instant::now();
        let first = seat.next_attempt(&request, t0);
        assert_eq!(first.queue_ticket(), Some(0));
        assert_eq!(first.queue_entry_ttl(), Some(QUEUE_ENTRY_TTL));
        seat.busy();
        let t1 = t0 + Duration::from_millis(10);
        assert_eq!(seat.next_attempt(&request, t1).queue_ticket(), Some(1));
        seat.busy();
        assert_eq!(
            seat.counts_from(HandOff {
                token: 3,
                ticket: 1
            }),
            Some(t1)
        );
        seat.settle();
    }

    #[tokio::test]
    async fn a_hand_off_older_than_a_busy_answer_is_stale() {
        let (mut seat, request) = seat();
        let t0 = Instant::now();
        seat.next_attempt(&request, t0);
        seat.busy();
        seat.next_attempt(&request, t0 + Duration::from_millis(5));
        seat.busy();
        assert_eq!(
            seat.counts_from(HandOff {
                token: 3,
                ticket: 0
            }),
            None
        );
        assert_eq!(
            seat.counts_from(HandOff {
                token: 3,
                ticket: 9
            }),
            None,
            "no such attempt"
        );
        seat.settle();
    }
}
