//! The checker on hand-made histories: each violation it claims to catch is
//! caught, and a clean history passes.

use super::*;

const MS: u64 = 1_000_000;

fn ev(t: u64, pid: u32, op: Op, kind: Kind, token: Option<u64>, valid_until: Option<u64>) -> Event {
    Event {
        t: t * MS,
        worker: pid,
        pid,
        op,
        kind,
        key: "k".into(),
        token,
        value: None,
        valid_until: valid_until.map(|v| v * MS),
        error: None,
        sent: None,
        slot: None,
        shared: false,
    }
}

/// The first of a report's `findings` (violations, inconclusive reasons)
/// says `what`.
fn assert_first_mentions(findings: &[String], what: &str) {
    assert!(findings[0].contains(what), "{findings:?}");
}

/// A renewal of `token` by `pid`, sent at `at` and answered 2 ms later.
fn renewal(pid: u32, at: u64, token: u64, outcome: Kind) -> Vec<Event> {
    vec![
        ev(at, pid, Op::Renew, Kind::Invoke, Some(token), None),
        ev(at + 2, pid, Op::Renew, outcome, Some(token), None),
    ]
}

/// Pid 1 holds token 1 until 1000 ms (renewed once at 300 ms); pid 2,
/// asking from 100 ms, sends its granted request for token 2 at `sent` and
/// gets the answer at `ok`: the cases around the first lease's deadline.
fn next_grant_after_deadline(sent: u64, ok: u64) -> Vec<Event> {
    let mut events = granted(1, 0, 0, 1, 1, 1000);
    events.extend(renewal(1, 300, 1, Kind::Ok));
    events.extend(granted(2, 100, sent, ok, 2, 2000));
    events
}

/// The grant of `token` to `pid`: asked at `invoke`, the granted request
/// sent at `sent`, answered at `ok`, trusted until `valid_until`.
fn granted(pid: u32, invoke: u64, sent: u64, ok: u64, token: u64, valid_until: u64) -> Vec<Event> {
    let mut ok = ev(
        ok,
        pid,
        Op::Acquire,
        Kind::Ok,
        Some(token),
        Some(valid_until),
    );
    ok.sent = Some(sent * MS);
    vec![ev(invoke, pid, Op::Acquire, Kind::Invoke, None, None), ok]
}

/// A full round by `pid`: acquire at `at`, hold `token`, trusted until
/// `at + 900`, use the resource at `at + 10`, release at `at + 20`.
fn round(pid: u32, at: u64, token: u64) -> Vec<Event> {
    let v = Some(at + 900);
    vec![
        ev(at, pid, Op::Acquire, Kind::Invoke, None, None),
        ev(at + 1, pid, Op::Acquire, Kind::Ok, Some(token), v),
        ev(at + 10, pid, Op::Write, Kind::Invoke, Some(token), v),
        ev(at + 20, pid, Op::Release, Kind::Invoke, Some(token), v),
    ]
}

fn write(seq: u64, token: u64, value: i64, accepted: bool) -> Decision {
    Decision {
        seq,
        t: seq,
        key: "k".into(),
        op: ResourceOp::Write,
        token,
        value,
        accepted,
        highest: 0,
        worker: 0,
    }
}

fn run(events: &[Event], decisions: &[Decision], faults: &[Fault], pauses: bool) -> Report {
    let requested: &[&str] = if pauses { &["pause"] } else { &[] };
    check_requested(events, decisions, faults, requested)
}

fn check_requested(
    events: &[Event],
    decisions: &[Decision],
    faults: &[Fault],
    requested: &[&'static str],
) -> Report {
    check(&Input {
        events,
        decisions,
        faults,
        ttl: Duration::from_secs(1),
        enforced_ttl: Duration::from_secs(1),
        retry: Duration::from_millis(100),
        lost_slack: Duration::from_millis(50),
        held_after_end: 0,
        requested,
        primitive: Primitive::Mutex,
        permits: 1,
        workers: 2,
    })
}

fn fault(kind: FaultKind, start_ms: u64, end_ms: u64, worker: Option<u32>) -> Fault {
    Fault {
        kind,
        start: start_ms * MS,
        end: end_ms * MS,
        hit: true,
        worker,
        key: worker.map(|_| "k".into()),
        token: None,
        detail: String::new(),
    }
}

#[test]
fn a_clean_history_passes() {
    let events: Vec<_> = [round(1, 0, 1), renewal(1, 5, 1, Kind::Ok), round(2, 100, 2)].concat();
    let decisions = [write(0, 1, 1, true), write(1, 2, 2, true)];
    let r = run(&events, &decisions, &[], false);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
    assert_eq!((r.acquisitions, r.writes_accepted, r.trials), (2, 2, 2));
    assert_eq!(r.violation_rate_upper_95, 1.0);
    assert_eq!(r.lost_signal.superseded, 0);
    assert_eq!((r.renewals.sent, r.renewals.renewed), (1, 1));
}

#[test]
fn a_run_without_renewals_is_inconclusive() {
    let events: Vec<_> = [round(1, 0, 1), round(2, 100, 2)].concat();
    let decisions = [write(0, 1, 1, true), write(1, 2, 2, true)];
    let r = run(&events, &decisions, &[], false);
    assert_eq!(r.renewals.renewed, 0);
    assert_eq!(r.verdict, Verdict::Inconclusive);
    assert_first_mentions(&r.inconclusive, "no lease was renewed");
}

#[test]
fn a_requested_fault_kind_that_never_landed_is_inconclusive() {
    let events: Vec<_> = [round(1, 0, 1), renewal(1, 5, 1, Kind::Ok)].concat();
    let decisions = [write(0, 1, 1, true)];
    // Proxy faults were injected, but none delayed or cut a holder.
    let mut stall = fault(FaultKind::ProxyStall, 500, 900, None);
    stall.hit = false;
    let r = check_requested(&events, &decisions, &[stall.clone()], &["proxy"]);
    assert_eq!(r.verdict, Verdict::Inconclusive);
    assert_eq!(
        r.inconclusive,
        ["proxy faults never landed on a holder (1 injected)"]
    );
    // Asked for and never injected at all: the same.
    let r = check_requested(&events, &decisions, &[], &["kill"]);
    assert_eq!(r.verdict, Verdict::Inconclusive);
    assert_eq!(
        r.inconclusive,
        ["kill faults never landed on a holder (0 injected)"]
    );
    stall.hit = true;
    let r = check_requested(&events, &decisions, &[stall], &["proxy"]);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.inconclusive);
}

#[test]
fn proxy_faults_hit_only_when_a_holder_request_went_through_them() {
    // pid 1 renews at 100 ms and 400 ms; its release at 700 ms fails.
    let events: Vec<_> = [
        renewal(1, 100, 1, Kind::Ok),
        renewal(1, 400, 1, Kind::Ok),
        vec![
            ev(700, 1, Op::Release, Kind::Invoke, Some(1), None),
            ev(705, 1, Op::Release, Kind::Unknown, Some(1), None),
        ],
    ]
    .concat();
    let mut faults = vec![
        fault(FaultKind::ProxyLatency, 90, 150, None), // the renewal at 100
        fault(FaultKind::ProxyStall, 150, 390, None),  // only idle time
        fault(FaultKind::ProxyReset, 401, 401, None),  // the renewal in flight
        fault(FaultKind::ProxyReset, 200, 200, None),  // nothing in flight
        fault(FaultKind::ProxyReset, 650, 650, None),  // the release then fails
        fault(FaultKind::Kill, 300, 300, Some(1)),     // not the checker's call
    ];
    for f in &mut faults {
        f.hit = !f.hit;
    }
    mark_proxy_hits(&events, &mut faults, Duration::from_millis(100));
    let hits: Vec<bool> = faults.iter().map(|f| f.hit).collect();
    assert_eq!(hits, [true, false, true, false, true, false]);
}

#[test]
fn stale_writes_and_lost_increments_are_violations() {
    let decisions = [
        write(0, 1, 1, true),
        write(1, 3, 2, true),
        // token 2 after 3, writing a value read before: stale and lost.
        write(2, 2, 2, true),
    ];
    let r = run(&[], &decisions, &[], false);
    assert_eq!(r.stale_writes_accepted, 1);
    assert_eq!(r.lost_increments, 1);
    assert_eq!(r.verdict, Verdict::Violation);
}

#[test]
fn a_fenced_rejection_is_not_a_violation_and_counts_as_a_trial() {
    let decisions = [write(0, 3, 1, true), write(1, 2, 1, false)];
    let r = run(&[], &decisions, &[], true);
    assert_eq!((r.fenced_writes, r.trials), (1, 2));
    assert!(r.violations.is_empty());
    assert!((r.violation_rate_upper_95 - 1.0).abs() < 1e-9); // 3/2 capped
}

#[test]
fn token_regressions_and_duplicates_are_violations() {
    // pid 2 is granted token 1 after pid 1's grant of token 5 completed.
    let events: Vec<_> = [round(1, 0, 5), round(2, 100, 1), round(3, 200, 1)].concat();
    let r = run(&events, &[], &[], false);
    assert_eq!(r.token_regressions, 2);
    assert_eq!(r.token_duplicates, 1);
    assert_eq!(r.verdict, Verdict::Violation);
}

#[test]
fn a_holder_still_trusting_its_lease_at_the_next_grant_is_a_violation() {
    // pid 1 never releases; it trusts its lease until 900 ms, but pid 2 is
    // granted at 501 ms.
    let mut events = round(1, 0, 1);
    events.pop();
    events.extend(round(2, 500, 2));
    let r = run(&events, &[], &[], false);
    assert_eq!(r.lost_signal.superseded, 1);
    assert_eq!(r.lost_signal.deadline_before_next_grant, 0);
    assert_eq!(r.verdict, Verdict::Violation);

    // Granted after the deadline instead: fine, and the late write of the
    // paused holder is an overlapping belief.
    let mut events = round(1, 0, 1);
    events.truncate(2);
    events.extend(renewal(1, 5, 1, Kind::Ok));
    events.push(ev(2000, 1, Op::Write, Kind::Invoke, Some(1), Some(900)));
    events.extend(round(2, 1000, 2));
    let pause = fault(FaultKind::Pause, 100, 1900, Some(1));
    let r = run(&events, &[], &[pause], true);
    assert_eq!(r.lost_signal.deadline_before_next_grant, 1);
    assert_eq!(r.overlapping_beliefs, 1);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
}

#[test]
fn the_next_holder_s_request_must_be_sent_after_the_deadline() {
    // pid 1 holds token 1 and trusts it until 1000 ms; pid 2 sent the
    // request that got token 2 at 995 ms, and the answer came at 1003 ms
    // (a quick round trip, within the 12 ms safety margin of a 1 s ttl).
    // A deadline measured from the wrong instant hides behind the answer's
    // travel time: this must fail although the answer came after 1000 ms.
    let events = next_grant_after_deadline(995, 1003);
    let r = run(&events, &[], &[], false);
    assert_eq!(r.lost_signal.superseded, 1);
    assert_eq!(r.lost_signal.deadline_before_next_grant, 0);
    assert_eq!(r.verdict, Verdict::Violation);
    assert_first_mentions(&r.violations, "request was sent");

    // Sent at 1001 ms: the deadline came first.
    let events = next_grant_after_deadline(1001, 1010);
    let r = run(&events, &[], &[], false);
    assert_eq!(r.lost_signal.deadline_before_next_grant, 1);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);

    // Sent at 950 ms, answered at 1010 ms: a round trip longer than the
    // safety margin waited somewhere (a busy store lock), so the store may
    // have taken it after 1000 ms; only the answer bounds the grant.
    let events = next_grant_after_deadline(950, 1010);
    let r = run(&events, &[], &[], false);
    assert_eq!(r.lost_signal.next_request_delayed, 1);
    assert_eq!(r.lost_signal.deadline_before_next_grant, 1);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
    // ... but an answer before the deadline is a violation whatever the wait.
    let events = next_grant_after_deadline(950, 990);
    let r = run(&events, &[], &[], false);
    assert_eq!(r.verdict, Verdict::Violation);

    // Sent at 995 ms but held in a stalled proxy until 1008 ms: the store
    // saw it at some moment before the answer, which is all that is known.
    let events = next_grant_after_deadline(995, 1010);
    let stall = fault(FaultKind::ProxyStall, 990, 1008, None);
    let r = check_requested(&events, &[], &[stall], &["proxy"]);
    assert_eq!(r.lost_signal.next_request_delayed, 1);
    assert_eq!(r.lost_signal.deadline_before_next_grant, 1);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
}

#[test]
fn lost_must_fire_by_valid_until_for_a_running_holder() {
    // pid 1 is granted token 1, trusted until 500 ms; it does not release
    // before its deadline, and writes at 2000 ms: it was running.
    let holder = |lost_at: Option<u64>| {
        let mut e = granted(1, 0, 0, 1, 1, 500);
        e.extend(renewal(1, 100, 1, Kind::Unknown));
        e.extend(lost_at.map(|t| ev(t, 1, Op::Lost, Kind::Info, Some(1), None)));
        e.push(ev(2000, 1, Op::Write, Kind::Invoke, Some(1), Some(500)));
        e.push(ev(2010, 1, Op::Release, Kind::Invoke, Some(1), Some(500)));
        e
    };
    let r = run(&holder(Some(540)), &[], &[], false);
    assert_eq!(
        (r.lost_signal.must_fire, r.lost_signal.fired_on_time),
        (1, 1)
    );
    assert!(r.violations.is_empty(), "{:?}", r.violations);

    for late in [None, Some(560)] {
        let r = run(&holder(late), &[], &[], false);
        assert_eq!(
            (r.lost_signal.must_fire, r.lost_signal.fired_on_time),
            (1, 0)
        );
        assert_eq!(r.verdict, Verdict::Violation);
        assert_first_mentions(&r.violations, "lost() fired later");
    }

    // Born past its deadline (the answer came late): the guard can only
    // fire once it exists, so the slack counts from the grant.
    let born_late = |lost_at: Option<u64>| {
        let mut e = granted(1, 0, 0, 600, 1, 500);
        e.extend(lost_at.map(|t| ev(t, 1, Op::Lost, Kind::Info, Some(1), None)));
        e.push(ev(2000, 1, Op::Write, Kind::Invoke, Some(1), Some(500)));
        e
    };
    let r = run(&born_late(Some(601)), &[], &[], false);
    assert_eq!(
        (r.lost_signal.must_fire, r.lost_signal.fired_on_time),
        (1, 1)
    );
    let r = run(&born_late(None), &[], &[], false);
    assert_eq!(
        (r.lost_signal.must_fire, r.lost_signal.fired_on_time),
        (1, 0)
    );

    // Stopped over its deadline, it cannot fire on time: not counted.
    let pause = fault(FaultKind::Pause, 400, 1500, Some(1));
    let r = run(&holder(Some(1501)), &[], &[pause], true);
    assert_eq!(r.lost_signal.must_fire, 0);
    // Killed (nothing logged after the deadline): not counted either.
    let r = run(&granted(1, 0, 0, 1, 1, 500), &[], &[], false);
    assert_eq!(r.lost_signal.must_fire, 0);
    // Released before the deadline: nothing was lost.
    let mut released = granted(1, 0, 0, 1, 1, 500);
    released.push(ev(300, 1, Op::Release, Kind::Invoke, Some(1), Some(500)));
    released.push(ev(2000, 1, Op::Acquire, Kind::Invoke, None, None));
    let r = run(&released, &[], &[], false);
    assert_eq!(r.lost_signal.must_fire, 0);
}

/// A renewal moves the deadline without the worker logging it (it sleeps
/// in its critical section): `lost()` firing at the renewed deadline is on
/// time, not late by the renewal's extension (a MongoDB soak run counted
/// one such holder as a violation). Late past the renewed deadline still is.
#[test]
fn lost_is_due_at_the_deadline_the_last_renewal_gave() {
    // Trusted until 500 ms at the grant; renewed at 300 ms (ttl 1 s:
    // trusted 988 ms, so until about 1288 ms); a timed-out attempt at
    // 600 ms logs no answer; the next one at 700 ms is refused.
    let holder = |lost_at: u64| {
        let mut e = granted(1, 0, 0, 1, 1, 500);
        e.extend(renewal(1, 300, 1, Kind::Ok));
        e.push(ev(600, 1, Op::Renew, Kind::Invoke, Some(1), None));
        e.extend(renewal(1, 700, 1, Kind::Fail));
        e.push(ev(lost_at, 1, Op::Lost, Kind::Info, Some(1), None));
        e.push(ev(3000, 1, Op::Write, Kind::Invoke, Some(1), Some(500)));
        e
    };
    let r = run(&holder(1290), &[], &[], false);
    assert_eq!(
        (r.lost_signal.must_fire, r.lost_signal.fired_on_time),
        (1, 1)
    );
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    let r = run(&holder(1400), &[], &[], false);
    assert_eq!(
        (r.lost_signal.must_fire, r.lost_signal.fired_on_time),
        (1, 0)
    );
    assert_first_mentions(&r.violations, "lost() fired later");
}

#[test]
fn pauses_without_visible_effect_are_inconclusive() {
    let events = round(1, 0, 1);
    let r = run(&events, &[write(0, 1, 1, true)], &[], true);
    assert_eq!(r.verdict, Verdict::Inconclusive);
    assert_eq!(run(&[], &[], &[], false).verdict, Verdict::Inconclusive);
}

#[test]
fn slow_takeover_after_a_kill_is_a_violation() {
    let kill = |start_ms: u64| Fault {
        kind: FaultKind::Kill,
        start: start_ms * MS,
        end: start_ms * MS,
        hit: true,
        worker: Some(1),
        key: Some("k".into()),
        token: Some(1),
        detail: String::new(),
    };
    let mut events = round(1, 0, 1);
    events.truncate(2);
    // pid 2 starts waiting at 100 ms and is granted at 1400 ms.
    events.push(ev(100, 2, Op::Acquire, Kind::Invoke, None, None));
    events.push(ev(1400, 2, Op::Acquire, Kind::Ok, Some(2), Some(2300)));
    let r = run(&events, &[], &[kill(50)], false);
    assert_eq!(r.takeover.measured, 1);
    assert_eq!(r.takeover.max_ms, Some(1350.0));
    assert_eq!(r.takeover.bound_ms, 1350.0);
    assert_eq!(r.takeover.over_bound, 0);
    let r = run(&events, &[], &[kill(40)], false);
    assert_eq!(r.takeover.over_bound, 1);
    assert_eq!(r.faults["kill"].injected, 1);
    assert_eq!(r.verdict, Verdict::Violation);
}

/// `round` of a semaphore permit in `slot`, or of a reader (`slot` None,
/// `shared`), each with its own renewal so the run counts as tested.
fn permit_round(pid: u32, at: u64, token: u64, slot: Option<u32>, shared: bool) -> Vec<Event> {
    let mut events = round(pid, at, token);
    events[1].slot = slot;
    events[1].shared = shared;
    events.extend(renewal(pid, at + 5, token, Kind::Ok));
    events
}

fn check_lock(
    events: &[Event],
    decisions: &[Decision],
    primitive: Primitive,
    permits: u32,
) -> Report {
    check(&Input {
        events,
        decisions,
        faults: &[],
        ttl: Duration::from_secs(1),
        enforced_ttl: Duration::from_secs(1),
        retry: Duration::from_millis(100),
        lost_slack: Duration::from_millis(50),
        held_after_end: 0,
        requested: &[],
        primitive,
        permits,
        workers: 5,
    })
}

#[test]
fn a_semaphore_may_have_its_permits_at_once_and_no_more() {
    // Three holders in three slots overlap: within 3 permits.
    let three: Vec<_> = (0..3)
        .flat_map(|i| permit_round(i + 1, i as u64, u64::from(i) + 1, Some(i), false))
        .collect();
    let r = check_lock(&three, &[], Primitive::Semaphore, 3);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
    assert_eq!((r.holders_at_once.max, r.holders_at_once.limit), (3, 3));
    // The same with 2 permits: the third holder is one too many.
    let r = check_lock(&three, &[], Primitive::Semaphore, 2);
    assert_eq!(r.holders_at_once.over_limit, 1);
    assert_eq!(r.verdict, Verdict::Violation);
    assert_first_mentions(&r.violations, "beyond the lock's limit");
    // A mutex with those grants: two too many (tokens differ, so only
    // the count catches what the overlapping grants mean).
    let r = check_lock(&three, &[], Primitive::Mutex, 1);
    assert_eq!(r.holders_at_once.over_limit, 2);
}

#[test]
fn a_semaphore_that_never_overlapped_is_inconclusive() {
    let apart: Vec<_> = [
        permit_round(1, 0, 1, Some(0), false),
        permit_round(2, 100, 2, Some(0), false),
    ]
    .concat();
    let r = check_lock(&apart, &[], Primitive::Semaphore, 3);
    assert_eq!(r.verdict, Verdict::Inconclusive);
    assert_first_mentions(&r.inconclusive, "never had two holders at once");
}

#[test]
fn one_slot_is_one_lease_and_other_slots_do_not_supersede_it() {
    // Slot 0's holder (token 1) is still trusting its permit when token 2
    // is granted in slot 1: fine. Token 3 in slot 0 while token 1 trusts
    // it: the deadline check catches it per slot.
    let mut events: Vec<_> = [
        permit_round(1, 0, 1, Some(0), false),
        permit_round(2, 5, 2, Some(1), false),
    ]
    .concat();
    let r = check_lock(&events, &[], Primitive::Semaphore, 2);
    assert_eq!(r.lost_signal.superseded, 0, "{:?}", r.violations);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
    events.extend(permit_round(3, 8, 3, Some(0), false));
    let r = check_lock(&events, &[], Primitive::Semaphore, 3);
    assert_eq!(r.lost_signal.superseded, 1);
    assert_eq!(r.verdict, Verdict::Violation);
}

fn decision(seq: u64, op: ResourceOp, token: u64, value: i64) -> Decision {
    Decision {
        op,
        value,
        ..write(seq, token, value, true)
    }
}

#[test]
fn shared_reads_are_stale_only_behind_a_writer() {
    // Readers 2 and 3 read in either order: both fine. Writer 4 reads and
    // writes; reader 3 reading after it is stale, and so is writer 1
    // writing after reader 3 registered a higher token.
    let ok = [
        decision(0, ResourceOp::SharedRead, 3, 0),
        decision(1, ResourceOp::SharedRead, 2, 0),
        decision(2, ResourceOp::Read, 4, 0),
        decision(3, ResourceOp::Write, 4, 1),
    ];
    let events: Vec<_> = [round(1, 0, 1), renewal(1, 5, 1, Kind::Ok)].concat();
    let r = check_lock(&events, &ok, Primitive::Mutex, 1);
    assert_eq!((r.stale_reads_accepted, r.stale_writes_accepted), (0, 0));
    let mut late = ok.to_vec();
    late.push(decision(4, ResourceOp::SharedRead, 3, 1));
    late.push(decision(5, ResourceOp::Write, 3, 2));
    let r = check_lock(&events, &late, Primitive::Mutex, 1);
    assert_eq!((r.stale_reads_accepted, r.stale_writes_accepted), (1, 1));
    assert_eq!(r.verdict, Verdict::Violation);
}

#[test]
fn readers_overlap_and_a_writer_overlaps_nobody() {
    let readers: Vec<_> = [
        permit_round(1, 0, 1, None, true),
        permit_round(2, 5, 2, None, true),
    ]
    .concat();
    let r = check_lock(&readers, &[], Primitive::Mutex, 1);
    assert_eq!(r.holders_at_once.max, 2);
    assert_eq!(r.holders_at_once.over_limit, 0, "{:?}", r.violations);
    assert_eq!(
        r.lost_signal.superseded, 0,
        "readers do not supersede readers"
    );
    let mut with_writer = readers.clone();
    with_writer.extend(permit_round(3, 8, 3, None, false));
    let r = check_lock(&with_writer, &[], Primitive::Mutex, 1);
    assert_eq!(r.holders_at_once.over_limit, 1);
    assert_eq!(r.lost_signal.superseded, 2, "the writer supersedes both");
    assert_eq!(r.verdict, Verdict::Violation);
}

#[test]
fn a_store_that_rounds_ttls_up_gets_the_takeover_bound_of_the_ttl_it_enforces() {
    let retry = Duration::from_millis(100);
    // Exact stores: the ttl asked for.
    let exact = super::takeover_bound(
        Duration::from_millis(500),
        Duration::from_millis(500),
        retry,
    );
    assert_eq!(exact, Duration::from_millis(850));
    // etcd: 500 ms asked, 1 s enforced; the lease lives 1 s and the store
    // may delete it one such ttl later.
    let etcd = super::takeover_bound(Duration::from_millis(500), Duration::from_secs(1), retry);
    assert_eq!(etcd, Duration::from_millis(2350));
}
