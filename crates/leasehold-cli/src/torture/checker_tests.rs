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
    }
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
    check(&Input {
        events,
        decisions,
        faults,
        ttl: Duration::from_secs(1),
        retry: Duration::from_millis(100),
        held_after_end: 0,
        pauses_enabled: pauses,
    })
}

#[test]
fn a_clean_history_passes() {
    let events: Vec<_> = [round(1, 0, 1), round(2, 100, 2)].concat();
    let decisions = [write(0, 1, 1, true), write(1, 2, 2, true)];
    let r = run(&events, &decisions, &[], false);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
    assert_eq!((r.acquisitions, r.writes_accepted, r.trials), (2, 2, 2));
    assert_eq!(r.violation_rate_upper_95, 1.0);
    assert_eq!(r.lost_signal.superseded, 0);
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
    events.push(ev(2000, 1, Op::Write, Kind::Invoke, Some(1), Some(900)));
    events.extend(round(2, 1000, 2));
    let r = run(&events, &[], &[], true);
    assert_eq!(r.lost_signal.deadline_before_next_grant, 1);
    assert_eq!(r.overlapping_beliefs, 1);
    assert_eq!(r.verdict, Verdict::Pass, "{:?}", r.violations);
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
