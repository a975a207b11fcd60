//! The shared test suite every backend must pass (feature `conformance`).
//!
//! Each property is a function taking a [`TestStore`]; the
//! [`conformance_tests!`](crate::conformance_tests) macro turns the list into
//! one `#[tokio::test]` per property, so a failure names the property and
//! the store. Differences between stores are [`Capabilities`] and the hooks
//! a store's factory registers on its [`TestStore`], never a forked copy of
//! a property. Every property works under its own random key prefix, so the
//! suite runs in parallel against one server.
//!
//! ```ignore
//! async fn store() -> Option<leasehold::conformance::TestStore> {
//!     let url = leasehold::conformance::server_url("MY_STORE_URL")?;
//!     Some(
//!         TestStore::new(Arc::new(MyBackend::connect(&url).await.ok()?))
//!             // Another client of the same store, as another process is.
//!             .with_second_client(Arc::new(MyBackend::connect(&url).await.ok()?))
//!             .with_url_at_port(|port| format!("my://127.0.0.1:{port}")),
//!     )
//! }
//! // The protocol properties, plus those of the groups named after `;`.
//! leasehold::conformance_tests!(store; unreachable);
//! ```
//!
//! The protocol is every kind's: the mutex properties, the permit rules of
//! docs/semaphore.md and the reader-writer lock rules of docs/rw-lock.md
//! with the `kind_*` properties (one key is one lock, whatever the
//! primitive), since the trait's one family of methods serves them all.
//!
//! Groups beyond the protocol, for stores that have what they test:
//! `options` (bad options rejected before I/O, registered with
//! [`TestStore::with_bad_option`]), `unreachable` (a closed port is
//! [`Error::Unavailable`](crate::Error::Unavailable), with
//! [`TestStore::with_url_at_port`]) and `blocking` (a store that makes an
//! acquisition wait on another transaction bounds that wait by the caller's,
//! with [`TestStore::with_blocker`]), `sweep` (idle keys' records go at a
//! pass, never from under a live grant, with [`TestStore::with_sweep`]) and
//! `queue` (a store whose [`queues`](crate::backend::Backend::queues) is
//! true grants in the order the waiters came, hands a released key to the
//! head alone, and drops dead waiters; with a second client) and
//! `hand_off` (a store whose
//! [`hands_over_locally`](crate::backend::Backend::hands_over_locally) is
//! true hands a released mutex to a request of this process in the release,
//! with the next token, and only when it may).

mod bounds;
mod cross_client;
mod election;
mod hand_off;
mod kinds;
mod migration;
mod multi;
mod protocol;
mod queue;
mod regrant;
mod rwlock;
mod semaphore;
mod store;
mod sweep;

use std::time::Duration;

use crate::backend::{Acquire, AcquireRequest, Backend, Lease, LeaseInfo, PermitInfo};
use crate::guard::LeaseGuard;
use crate::key::Key;

pub use crate::test_server::server_url;
pub use bounds::{a_blocked_store_bounds_waits_and_try_once_calls, a_grant_after_a_block_is_live};
pub use cross_client::{
    a_closed_port_is_unavailable, another_clients_release_wakes_a_waiter,
    bad_options_rejected_before_io,
};
pub use election::{
    announce_wakes_subscribers, election_crashed_leader_is_replaced_after_ttl,
    election_observers_see_every_leader_in_token_order, election_resign_hands_over_promptly,
};
pub use hand_off::*;
pub use kinds::*;
pub use migration::records_from_before_kinds_keep_leases_and_tokens;
pub use multi::{
    acquire_many_is_all_or_nothing, acquire_many_loss_of_one_fires_lost,
    acquire_many_overlapping_sets_do_not_deadlock,
};
pub use protocol::*;
pub use queue::*;
pub use regrant::*;
pub use rwlock::*;
pub use semaphore::*;
pub use store::{unblock, Capabilities, TestStore, Unblock};
pub use sweep::{
    sweep_idle_keys_go_and_come_back_above_every_token,
    sweep_keeps_a_force_released_key_for_its_window, sweep_racing_grants_never_break_a_live_slot,
};

/// `url` (`scheme://[credentials@]hosts[/database][?query]`) naming
/// `database` instead: tests that need a database of their own (and use
/// fixed key or table names) do not meet on one server.
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url.split_once('?').unwrap_or((url, ""));
    let host = match base.split_once("://") {
        Some((scheme, rest)) => format!("{scheme}://{}", rest.split('/').next().unwrap_or(rest)),
        None => base.trim_end_matches('/').to_owned(),
    };
    if query.is_empty() {
        format!("{host}/{database}")
    } else {
        format!("{host}/{database}?{query}")
    }
}

/// Makes one `#[tokio::test]` per conformance property, each calling
/// `$factory().await` (an `async fn() -> Option<TestStore>`; `None` skips):
/// the protocol properties, then those of each group named after `;`
/// (`options`, `unreachable`, `blocking`, `sweep`, `queue`; see the [module docs](crate::conformance)).
#[macro_export]
macro_rules! conformance_tests {
    (@group options $factory:path) => {
        $crate::conformance_tests!(@each $factory; bad_options_rejected_before_io);
    };
    (@group unreachable $factory:path) => {
        $crate::conformance_tests!(@each $factory; a_closed_port_is_unavailable);
    };
    (@group semaphore $factory:path) => {
        $crate::conformance_tests!(@each $factory;
            semaphore_never_more_than_n_live,
            semaphore_reaches_n,
            semaphore_crashed_permit_returns_after_ttl,
            semaphore_fence_never_goes_backwards,
            semaphore_owner_checked_renew_release,
            semaphore_release_wakes_a_waiter,
            semaphore_disagreeing_permits,
            semaphore_stale_view_meets_taken_slots,
            semaphore_stale_view_keeps_a_smaller_count,
            semaphore_bad_input_rejected_before_io,
            regrant_permit_repeat_is_the_same_grant_extended,
            regrant_permit_repeat_takes_no_second_slot,
            regrant_permit_repeat_after_takeover_is_busy,
            regrant_permit_delivered_twice
        );
    };
    (@group rwlock $factory:path) => {
        $crate::conformance_tests!(@each $factory;
            rw_readers_share,
            rw_writer_excludes_readers_and_writers,
            rw_tokens_never_go_backwards,
            rw_owner_checked_renew_release,
            rw_crashed_holder_returns_after_ttl,
            rw_waiting_writer_is_not_starved,
            rw_waiting_writer_turns_away_a_stale_reader,
            rw_release_wakes_a_waiter,
            kind_mutex_held_excludes_readers_then_converts,
            kind_mutex_acquire_of_an_rw_key_is_its_writer,
            kind_semaphore_key_refuses_mutex_and_rw,
            kind_rw_key_refuses_semaphore,
            kind_force_release_frees_every_holder,
            kind_mixed_mutex_and_readers_never_overlap,
            kind_listing_reports_every_kind_in_one_order,
            rw_bad_input_rejected_before_io,
            regrant_reader_repeat_is_the_same_grant_extended,
            regrant_reader_repeat_takes_no_second_slot,
            regrant_reader_repeat_after_takeover_is_busy,
            regrant_reader_delivered_twice,
            regrant_writer_repeat_is_the_same_grant_extended,
            regrant_writer_repeat_takes_no_second_grant,
            regrant_writer_repeat_after_takeover_is_busy,
            regrant_writer_delivered_twice
        );
    };
    (@group sweep $factory:path) => {
        $crate::conformance_tests!(@each $factory;
            sweep_idle_keys_go_and_come_back_above_every_token,
            sweep_keeps_a_force_released_key_for_its_window,
            sweep_racing_grants_never_break_a_live_slot
        );
    };
    (@group queue $factory:path) => {
        $crate::conformance_tests!(@each $factory;
            queue_waiters_get_the_key_in_the_order_they_came,
            queue_release_hands_the_key_to_the_head_alone,
            queue_a_free_key_goes_to_the_head_first,
            queue_dead_waiter_leaves_within_its_entry_lease,
            queue_unclaimed_hand_off_lapses_to_the_next,
            queue_a_handed_over_guard_lasts_its_ttl,
            queue_a_waiter_that_gives_up_leaves_the_queue
        );
    };
    (@group hand_off $factory:path) => {
        $crate::conformance_tests!(@each $factory;
            hand_off_grants_the_next_request_the_next_token,
            hand_off_chains_and_any_client_releases,
            hand_off_of_a_lease_that_is_gone_changes_nothing,
            hand_off_waits_for_waiters_queued_at_the_store,
            hand_off_wakes_no_waiter_of_another_process
        );
    };
    (@group blocking $factory:path) => {
        $crate::conformance_tests!(@each $factory;
            a_blocked_store_bounds_waits_and_try_once_calls,
            a_grant_after_a_block_is_live
        );
    };
    (@each $factory:path; $($property:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $property() {
                if let Some(store) = $factory().await {
                    $crate::conformance::$property(&store).await;
                }
            }
        )*
    };
    ($factory:path $(; $($group:ident),* $(,)?)?) => {
        $crate::conformance_tests!(@each $factory;
            exclusion_under_race,
            release_then_reacquire,
            renew_extends,
            renew_after_expiry_fails,
            non_owner_cannot_renew_or_release,
            tokens_strictly_increase,
            expiry_frees,
            busy_reports_holder_and_remaining_ttl,
            inspect_and_list,
            force_release_frees_and_bumps_fence,
            release_is_idempotent,
            invalid_input_rejected_before_io,
            hostile_keys_are_plain_strings,
            release_wakes_waiter_quickly,
            another_clients_release_wakes_a_waiter,
            waiter_never_exceeds_its_bound,
            acquire_many_is_all_or_nothing,
            acquire_many_overlapping_sets_do_not_deadlock,
            acquire_many_loss_of_one_fires_lost,
            election_observers_see_every_leader_in_token_order,
            election_resign_hands_over_promptly,
            election_crashed_leader_is_replaced_after_ttl,
            announce_wakes_subscribers,
            regrant_mutex_repeat_is_the_same_grant_extended,
            regrant_mutex_repeat_takes_no_second_grant,
            regrant_mutex_repeat_after_takeover_is_busy,
            regrant_mutex_delivered_twice
        );
        // Every store serves every kind: the trait has one family of
        // methods, so the permit and reader-writer rules are the protocol's.
        $crate::conformance_tests!(@group semaphore $factory);
        $crate::conformance_tests!(@group rwlock $factory);
        $($( $crate::conformance_tests!(@group $group $factory); )*)?
    };
}

const LONG: Duration = Duration::from_secs(30);
const SHORT: Duration = Duration::from_millis(200);

/// Slack for "one round trip" on a loaded 2-core machine: a store that
/// waited for a blocker instead of the caller's bound takes seconds.
const ROUND_TRIP_SLACK: Duration = Duration::from_millis(700);

fn prefix() -> String {
    format!("conformance:{:016x}:", rand::random::<u64>())
}

fn key(s: String) -> Key {
    Key::new(s).expect("test keys are valid")
}

fn request(key: &Key, ttl: Duration) -> AcquireRequest {
    AcquireRequest::new(key.clone(), ttl, "conformance").expect("valid ttl")
}

/// One attempt straight at the store, which must answer. It sets no wait
/// deadline, so a writer's attempt leaves no marker (as a try-once call).
async fn attempt(backend: &dyn Backend, req: &AcquireRequest) -> Acquire {
    backend.try_acquire(req).await.expect("store answers")
}

/// Takes `key` on `backend`, which must find it free.
async fn grant_on(backend: &dyn Backend, key: &Key, ttl: Duration) -> Lease {
    match attempt(backend, &request(key, ttl)).await {
        Acquire::Granted(lease) => lease,
        b => panic!("expected {key:?} to be free: {b:?}"),
    }
}

async fn grant(store: &TestStore, key: &Key, ttl: Duration) -> Lease {
    grant_on(store.backend.as_ref(), key, ttl).await
}

/// What the store reports for `key`, which must be held; `why` says what
/// finding it free would mean.
async fn held(store: &TestStore, key: &Key, why: &str) -> LeaseInfo {
    let info = store.backend.inspect(key).await.expect("store answers");
    info.unwrap_or_else(|| panic!("{key:?} is free: {why}"))
}

/// The permits, readers and writers in a store's one listing.
async fn permits_listed(backend: &dyn Backend, prefix: &str) -> crate::Result<Vec<PermitInfo>> {
    let all = backend.list(prefix).await?;
    Ok(all.into_iter().filter_map(LeaseInfo::into_permit).collect())
}

/// The permits, readers and writers the store lists for `key` itself (not
/// for the keys it is a prefix of).
async fn slots_of(store: &TestStore, key: &Key) -> Vec<PermitInfo> {
    let all = permits_listed(store.backend.as_ref(), key.as_str())
        .await
        .unwrap();
    all.into_iter().filter(|p| &p.key == key).collect()
}

/// Whether one attempt of `req` finds its key busy.
async fn busy_for(backend: &dyn Backend, req: &AcquireRequest) -> bool {
    matches!(attempt(backend, req).await, Acquire::Busy(_))
}

async fn is_busy(store: &TestStore, key: &Key) -> bool {
    busy_for(
        store.backend.as_ref(),
        &request(key, Duration::from_secs(10)),
    )
    .await
}

/// Whether a try-once call through the core found its lock busy.
fn answered_busy(outcome: &crate::Result<LeaseGuard>) -> bool {
    matches!(outcome, Err(crate::Error::Busy { .. }))
}

/// Starts `waiter` (an acquisition through the core) and has `releaser`
/// release `holder` 300 ms later. The waiter's guard (`what` says what
/// getting it shows), which must come within 5 s of the release: a
/// wake-up, long before the holder's ttl (30 s) would have ended.
async fn handed_off(
    waiter: impl std::future::Future<Output = crate::Result<LeaseGuard>> + Send + 'static,
    releaser: &dyn Backend,
    holder: &Lease,
    what: &str,
) -> LeaseGuard {
    let waiter = tokio::spawn(async move {
        let guard = waiter.await;
        (guard, tokio::time::Instant::now())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let released_at = tokio::time::Instant::now();
    releaser.release(holder).await.unwrap();
    let (guard, acquired_at) = waiter.await.unwrap();
    let guard = guard.expect(what);
    let handoff = acquired_at - released_at;
    assert!(
        handoff < Duration::from_secs(5),
        "hand-off took {handoff:?}"
    );
    guard
}

#[cfg(test)]
mod tests {
    use super::with_database;

    #[test]
    fn with_database_replaces_or_adds_the_path_and_keeps_the_rest() {
        for (url, expected) in [
            (
                "mongodb://127.0.0.1:1/?directConnection=true",
                "mongodb://127.0.0.1:1/t?directConnection=true",
            ),
            ("mongodb://u:p@a:1,b:2", "mongodb://u:p@a:1,b:2/t"),
            (
                "postgres://postgres@h:5432/test",
                "postgres://postgres@h:5432/t",
            ),
            ("postgres://h/db/?x=1", "postgres://h/t?x=1"),
        ] {
            assert_eq!(with_database(url, "t"), expected, "{url}");
        }
    }
}
