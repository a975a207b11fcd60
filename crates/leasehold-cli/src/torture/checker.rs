//! The checker: reads the merged history (worker events, resource
//! decisions, faults) and decides whether the lock and the fenced resource
//! kept their promises, and whether the run tested anything: every
//! requested fault kind landed on a holder and leases lived on renewals.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::history::{Decision, Event, Fault, FaultKind, Kind, Op, ResourceOp};
use super::primitive::{cell, Primitive};

/// What the checker reads.
pub struct Input<'a> {
    pub events: &'a [Event],
    pub decisions: &'a [Decision],
    pub faults: &'a [Fault],
    pub ttl: Duration,
    /// The ttl the store enforces for `ttl` (`Lease::ttl` of a grant):
    /// longer on a store that rounds ttls up (etcd: whole seconds).
    pub enforced_ttl: Duration,
    /// Allowance for one more acquisition attempt after a lease runs out.
    pub retry: Duration,
    /// How late after `valid_until` a running holder's `lost()` may fire.
    pub lost_slack: Duration,
    /// Live leases under the run's prefix once the run ended and a ttl passed.
    pub held_after_end: usize,
    /// The fault families asked for (`Family::name`): each must land.
    pub requested: &'a [&'static str],
    /// The lock under test.
    pub primitive: Primitive,
    /// Semaphore permits (1 for the other primitives).
    pub permits: u32,
    /// Worker processes (a semaphore run with one worker cannot overlap).
    pub workers: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Violation,
    /// Nothing was violated, but the run did not test what it was asked to
    /// (a fault kind never landed, no renewal, ...), so it proves little.
    Inconclusive,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct FaultCount {
    pub injected: u64,
    /// Landed on a lease holder (kill, pause), delayed or cut a holder's
    /// request (proxy), or took effect (restart).
    pub hit: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct Takeover {
    /// Kills of a holder followed by a grant to a worker already waiting.
    pub measured: u64,
    pub max_ms: Option<f64>,
    /// ttl + retry + 250 ms.
    pub bound_ms: f64,
    pub over_bound: u64,
}

#[derive(Debug, Default, Serialize)]
pub struct LostSignal {
    /// Holders that had not released when the next holder was granted.
    pub superseded: u64,
    /// Of those, holders whose `valid_until` had passed when the next
    /// grant's request was sent (or, for a request the nemesis held back in
    /// the proxy or a restart, when its answer came).
    pub deadline_before_next_grant: u64,
    /// Superseded holders compared with the next grant's answer because the
    /// nemesis delayed that request.
    pub next_request_delayed: u64,
    pub percent: f64,
    /// `lost()` signals the workers saw fire (a paused worker sees it late).
    pub signals_fired: u64,
    /// Holders still holding past `valid_until` + slack while running (not
    /// paused over it, not killed): `lost()` must have fired for each...
    pub must_fire: u64,
    /// ... by `valid_until` + slack.
    pub fired_on_time: u64,
    pub slack_ms: f64,
}

/// Holders that trusted their grant at the same time, per lock: from each
/// grant's answer until its `valid_until` or its release, whichever first.
#[derive(Debug, Default, Serialize)]
pub struct HoldersAtOnce {
    /// Mutex 1, semaphore its permits (a read-write lock: 1 writer alone,
    /// or any number of readers).
    pub limit: u32,
    /// The most at one instant.
    pub max: u64,
    /// Grants that began while the limit was already reached (a writer
    /// beside anyone, or anyone beside a writer).
    pub over_limit: u64,
}

/// The guard's background renewals, as the workers' store client saw them.
#[derive(Debug, Default, Serialize)]
pub struct Renewals {
    /// Renew requests sent.
    pub sent: u64,
    /// The store extended the lease.
    pub renewed: u64,
    /// The store said the lease was gone.
    pub refused: u64,
    /// Errors and requests cut short (outcome unknown).
    pub failed: u64,
    /// Holds that lasted longer than the ttl (they live on renewals).
    pub holds_over_ttl: u64,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub acquisitions: u64,
    pub acquire_timeouts: u64,
    pub acquire_unknown: u64,
    pub faults: BTreeMap<&'static str, FaultCount>,
    pub reads_accepted: u64,
    pub writes_accepted: u64,
    pub fenced_reads: u64,
    pub fenced_writes: u64,
    pub fenced_rejections: u64,
    /// Holders that used the resource after a newer holder was granted:
    /// the hole every lease lock has, which fencing must close.
    pub overlapping_beliefs: u64,
    pub stale_writes_accepted: u64,
    pub stale_reads_accepted: u64,
    pub token_regressions: u64,
    pub token_duplicates: u64,
    pub lost_increments: u64,
    pub holders_at_once: HoldersAtOnce,
    pub takeover: Takeover,
    pub renewals: Renewals,
    pub lost_signal: LostSignal,
    pub locks_held_after_end: usize,
    /// Write decisions: each a chance to accept a stale write.
    pub trials: u64,
    /// 95 % upper bound on the stale-write rate: 3/trials when none was
    /// seen (the rule of three), else the observed rate.
    pub violation_rate_upper_95: f64,
    pub violations: Vec<String>,
    /// Why the run proves little, when the verdict is inconclusive.
    pub inconclusive: Vec<String>,
    pub verdict: Verdict,
}

/// One granted lease, as its holder saw it.
#[derive(Debug, Clone)]
struct Grant {
    /// The lock's key.
    lock: String,
    /// The resource cell, which one holder at a time may use: the key, or
    /// a semaphore permit's slot of it.
    key: String,
    /// A read-write lock's reader: readers may hold a cell together.
    shared: bool,
    token: u64,
    worker: u32,
    pid: u32,
    invoke: u64,
    /// When the request the store granted was sent.
    sent: u64,
    ok: u64,
    /// When the holder's `lost()` fired, if it did.
    lost: Option<u64>,
    /// The latest `valid_until` the holder logged.
    valid_until: u64,
    /// No earlier than the deadline the holder's last successful renewal
    /// gave it: that renewal's logged start plus the trusted part of the
    /// ttl. A renewal extends `valid_until` without the worker logging
    /// it (the holder sleeps in its critical section), and the guard
    /// counts from an instant just before the store wrapper logs the start.
    renewed_until_at_most: u64,
    release: Option<u64>,
    /// The last resource operation the holder started.
    last_op: Option<u64>,
}

pub fn check(input: &Input<'_>) -> Report {
    let mut r = Report {
        acquisitions: 0,
        acquire_timeouts: 0,
        acquire_unknown: 0,
        faults: BTreeMap::new(),
        reads_accepted: 0,
        writes_accepted: 0,
        fenced_reads: 0,
        fenced_writes: 0,
        fenced_rejections: 0,
        overlapping_beliefs: 0,
        stale_writes_accepted: 0,
        stale_reads_accepted: 0,
        token_regressions: 0,
        token_duplicates: 0,
        lost_increments: 0,
        holders_at_once: HoldersAtOnce::default(),
        takeover: Takeover::default(),
        renewals: Renewals::default(),
        lost_signal: LostSignal::default(),
        locks_held_after_end: input.held_after_end,
        trials: 0,
        violation_rate_upper_95: 1.0,
        violations: Vec::new(),
        inconclusive: Vec::new(),
        verdict: Verdict::Pass,
    };
    let renewed_ttl = input.enforced_ttl.max(input.ttl);
    let grants = grants(input.events, renewed_ttl, &mut r);
    count_renewals(input, &grants, &mut r);
    check_tokens(&grants, &mut r);
    check_beliefs(input, &grants, &mut r);
    check_holders_at_once(input, &grants, &mut r);
    check_lost_signals(input, &grants, &mut r);
    check_resource(input.decisions, &mut r);
    check_takeovers(input, &grants, &mut r);
    for f in input.faults {
        let c = r.faults.entry(f.kind.name()).or_default();
        c.injected += 1;
        c.hit += u64::from(f.hit);
    }
    // A requested kind never injected still shows, as 0 of 0.
    for family in input.requested {
        if !r.faults.keys().any(|k| family_of(k) == *family) {
            r.faults.insert(family, FaultCount::default());
        }
    }
    judge(input, &mut r);
    r
}

/// Rebuilds each holder's view from its own events, process by process;
/// `renewed_ttl` is the longest ttl a renewal may extend a lease by.
fn grants(events: &[Event], renewed_ttl: Duration, r: &mut Report) -> Vec<Grant> {
    let trusted = leasehold::time::trusted_for(renewed_ttl).as_nanos() as u64;
    let mut by_pid: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_pid.entry(e.pid).or_default().push(e);
    }
    let mut out = Vec::new();
    for stream in by_pid.values_mut() {
        stream.sort_by_key(|e| e.t);
        let mut invoked = None;
        let mut renew_invoked = None;
        let mut current: Option<usize> = None;
        for e in stream.iter() {
            match (e.op, e.kind) {
                (Op::Acquire, Kind::Invoke) => {
                    invoked = Some(e.t);
                    renew_invoked = None;
                    current = None;
                }
                (Op::Acquire, Kind::Ok) => {
                    r.acquisitions += 1;
                    out.push(Grant {
                        lock: e.key.clone(),
                        key: cell(&e.key, e.slot),
                        shared: e.shared,
                        token: e.token.unwrap_or(0),
                        worker: e.worker,
                        pid: e.pid,
                        invoke: invoked.unwrap_or(e.t),
                        // Histories without it: the answer, the old bound.
                        sent: e.sent.unwrap_or(e.t),
                        ok: e.t,
                        lost: None,
                        valid_until: e.valid_until.unwrap_or(0),
                        renewed_until_at_most: 0,
                        release: None,
                        last_op: None,
                    });
                    current = Some(out.len() - 1);
                }
                (Op::Acquire, Kind::Fail) => r.acquire_timeouts += 1,
                (Op::Acquire, Kind::Unknown) => r.acquire_unknown += 1,
                (Op::Lost, _) => r.lost_signal.signals_fired += 1,
                _ => {}
            }
            let Some(g) = current.map(|i| &mut out[i]) else {
                continue;
            };
            // The renewal task and the lost watcher of a released guard may
            // still log a line after the next acquire began.
            if e.token.is_some_and(|t| t != g.token) {
                continue;
            }
            if let Some(v) = e.valid_until {
                g.valid_until = g.valid_until.max(v);
            }
            match (e.op, e.kind) {
                (Op::Read | Op::Write, Kind::Invoke) => g.last_op = Some(e.t),
                (Op::Release, Kind::Invoke) => g.release = Some(e.t),
                (Op::Lost, _) => g.lost = g.lost.or(Some(e.t)),
                // Attempts the guard timed out log no answer: an answer
                // belongs to the latest start before it.
                (Op::Renew, Kind::Invoke) => renew_invoked = Some(e.t),
                (Op::Renew, Kind::Ok) => {
                    if let Some(t) = renew_invoked.take() {
                        g.renewed_until_at_most = g.renewed_until_at_most.max(t + trusted);
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// No two grants of a key share a token, and a grant that completed before
/// another started has the smaller token.
///
/// Across the whole lock: a semaphore's slots and a read-write lock's
/// readers and writers all draw from the key's one fence.
fn check_tokens(grants: &[Grant], r: &mut Report) {
    let mut seen: HashMap<(&str, u64), u64> = HashMap::new();
    for g in grants {
        *seen.entry((&g.lock, g.token)).or_default() += 1;
    }
    r.token_duplicates = seen.values().map(|n| n - 1).sum();
    for key_grants in per_lock(grants).values() {
        let mut by_ok = key_grants.clone();
        by_ok.sort_by_key(|g| g.ok);
        let mut by_invoke = key_grants.clone();
        by_invoke.sort_by_key(|g| g.invoke);
        let (mut i, mut max_before) = (0, None::<u64>);
        for g in by_invoke {
            while i < by_ok.len() && by_ok[i].ok < g.invoke {
                max_before = max_before.max(Some(by_ok[i].token));
                i += 1;
            }
            if max_before.is_some_and(|m| m > g.token) {
                r.token_regressions += 1;
            }
        }
    }
}

/// Renew requests and their outcomes; holds that outlived the ttl.
fn count_renewals(input: &Input<'_>, grants: &[Grant], r: &mut Report) {
    for e in input.events.iter().filter(|e| e.op == Op::Renew) {
        match e.kind {
            Kind::Invoke => r.renewals.sent += 1,
            Kind::Ok => r.renewals.renewed += 1,
            Kind::Fail => r.renewals.refused += 1,
            Kind::Unknown | Kind::Info => r.renewals.failed += 1,
        }
    }
    let ttl = input.ttl.as_nanos() as u64;
    r.renewals.holds_over_ttl = grants
        .iter()
        .filter(|g| g.release.is_some_and(|rel| rel.saturating_sub(g.ok) > ttl))
        .count() as u64;
}

/// For each holder and the next grant of its cell that excludes it (any
/// grant, except a reader's after a reader): did the holder's local
/// deadline pass before the next holder even sent the request that got the
/// grant (it must: a deadline counted from the wrong instant hides behind
/// the answer's travel time otherwise), and did it still use the resource
/// after that grant (the overlap fencing has to catch)?
///
/// A request the nemesis held back (in the proxy, or while the store
/// restarted), or one whose round trip outlasted the lease's safety
/// margin, may reach the store long after it was sent; for those only the
/// answer bounds when the store granted it.
fn check_beliefs(input: &Input<'_>, grants: &[Grant], r: &mut Report) {
    let delaying: Vec<(u64, u64)> = input
        .faults
        .iter()
        .filter(|f| f.kind.delays_requests())
        .map(|f| (f.start, f.end))
        .collect();
    // A round trip longer than the lease's own safety margin waited
    // somewhere on the way (SQLite's busy handler behind a paused writer, a
    // loaded scheduler): the store may have taken it long after it was sent.
    // A deadline counted from the wrong instant overshoots by the holder's
    // own round trip, so quick requests, the usual case, still catch it.
    let queued_after = leasehold::time::safety_margin(input.ttl).as_nanos() as u64;
    for key_grants in per_key(grants).values() {
        let mut by_token = key_grants.clone();
        by_token.sort_by_key(|g| g.token);
        for (i, h) in by_token.iter().enumerate() {
            let excludes = |n: &&&Grant| n.token > h.token && !(h.shared && n.shared);
            let Some(next) = by_token[i + 1..].iter().find(excludes) else {
                continue;
            };
            if h.release.is_none_or(|rel| rel > next.ok) {
                r.lost_signal.superseded += 1;
                let held_back = delaying
                    .iter()
                    .any(|&(start, end)| next.sent <= end && next.ok >= start)
                    || next.ok.saturating_sub(next.sent) > queued_after;
                let granted_no_earlier_than = if held_back {
                    r.lost_signal.next_request_delayed += 1;
                    next.ok
                } else {
                    next.sent
                };
                if h.valid_until <= granted_no_earlier_than {
                    r.lost_signal.deadline_before_next_grant += 1;
                }
            }
            if h.last_op.is_some_and(|t| t > next.ok) {
                r.overlapping_beliefs += 1;
            }
        }
    }
    r.lost_signal.percent = percent(
        r.lost_signal.deadline_before_next_grant,
        r.lost_signal.superseded,
    );
}

/// Every holder that still held its lease past `valid_until` (it had not
/// started releasing) must have seen `lost()` fire by `valid_until` plus
/// the scheduling slack, if it was running then: not stopped by a pause
/// over that moment, and alive (it logged something later; a killed
/// process logs nothing more).
fn check_lost_signals(input: &Input<'_>, grants: &[Grant], r: &mut Report) {
    let slack = input.lost_slack.as_nanos() as u64;
    r.lost_signal.slack_ms = ms(slack);
    // The latest line of each process that the renewal task did not write:
    // proof that the worker itself ran until then.
    let mut last_seen: HashMap<u32, u64> = HashMap::new();
    for e in input.events.iter().filter(|e| e.op != Op::Renew) {
        let t = last_seen.entry(e.pid).or_default();
        *t = (*t).max(e.t);
    }
    for g in grants {
        // A grant whose answer came after its deadline (the request was
        // held back) can signal only once the guard exists. The deadline
        // the worker logged last may predate renewals.
        let deadline = g.valid_until.max(g.renewed_until_at_most).max(g.ok);
        let due = deadline + slack;
        let still_holding = g.release.is_none_or(|rel| rel > due);
        let ran_past_due = last_seen.get(&g.pid).is_some_and(|&t| t > due);
        let paused_over_deadline = input.faults.iter().any(|f| {
            f.kind == FaultKind::Pause
                && f.worker == Some(g.worker)
                && f.start <= due
                && f.end >= deadline
        });
        if !still_holding || !ran_past_due || paused_over_deadline {
            continue;
        }
        r.lost_signal.must_fire += 1;
        if g.lost.is_some_and(|t| t <= due) {
            r.lost_signal.fired_on_time += 1;
        }
    }
}

/// A request a holder sent to the store, as its history shows it.
#[derive(Debug)]
struct HolderRequest {
    sent: u64,
    done: Option<u64>,
    /// Ended in an error (outcome unknown): a connection cut, for one.
    failed: bool,
}

/// The renew and release requests of every holder.
fn holder_requests(events: &[Event]) -> Vec<HolderRequest> {
    let mut by_pid: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
    for e in events
        .iter()
        .filter(|e| matches!(e.op, Op::Renew | Op::Release))
    {
        by_pid.entry(e.pid).or_default().push(e);
    }
    let mut out = Vec::new();
    for stream in by_pid.values_mut() {
        stream.sort_by_key(|e| e.t);
        let mut open: HashMap<Op, usize> = HashMap::new();
        for e in stream.iter() {
            if e.kind == Kind::Invoke {
                out.push(HolderRequest {
                    sent: e.t,
                    done: None,
                    failed: false,
                });
                open.insert(e.op, out.len() - 1);
            } else if let Some(i) = open.remove(&e.op) {
                out[i].done = Some(e.t);
                out[i].failed = e.kind == Kind::Unknown;
            }
        }
    }
    out
}

/// Sets `hit` on each proxy fault by what the holders' requests went
/// through: latency or a stall hit if a holder sent a request while it was
/// on (every byte then waits in the proxy); a reset hit if a holder's
/// request was in flight at that moment, or one sent within a ttl after it
/// failed on the cut connection. A fault that only touched idle
/// connections or waiters proves nothing about holders.
pub fn mark_proxy_hits(events: &[Event], faults: &mut [Fault], ttl: Duration) {
    let requests = holder_requests(events);
    let ttl = ttl.as_nanos() as u64;
    for f in faults.iter_mut() {
        f.hit = match f.kind {
            FaultKind::ProxyLatency | FaultKind::ProxyStall => {
                requests.iter().any(|q| (f.start..=f.end).contains(&q.sent))
            }
            FaultKind::ProxyReset => requests.iter().any(|q| {
                let in_flight = q.sent <= f.start && q.done.is_some_and(|d| d >= f.start);
                let cut_after = q.failed && (f.start..=f.start + ttl).contains(&q.sent);
                in_flight || cut_after
            }),
            _ => continue,
        };
    }
}

/// Replays the resource's decisions per key: no accepted operation may
/// carry a token below one already accepted (a reader's shared read: below
/// a writer's), and every accepted write must build on the value before it.
fn check_resource(decisions: &[Decision], r: &mut Report) {
    let mut by_key: BTreeMap<&str, Vec<&Decision>> = BTreeMap::new();
    for d in decisions {
        by_key.entry(&d.key).or_default().push(d);
    }
    for ds in by_key.values_mut() {
        ds.sort_by_key(|d| d.seq);
        let (mut highest, mut highest_writer, mut value) = (0u64, 0u64, 0i64);
        for d in ds.iter() {
            match (d.op, d.accepted) {
                (ResourceOp::Read | ResourceOp::SharedRead, false) => r.fenced_reads += 1,
                (ResourceOp::Write, false) => r.fenced_writes += 1,
                (op, true) => {
                    let shared = op == ResourceOp::SharedRead;
                    let stale = d.token < if shared { highest_writer } else { highest };
                    highest = highest.max(d.token);
                    if !shared {
                        highest_writer = highest_writer.max(d.token);
                    }
                    if op != ResourceOp::Write {
                        r.reads_accepted += 1;
                        r.stale_reads_accepted += u64::from(stale);
                        continue;
                    }
                    r.writes_accepted += 1;
                    r.stale_writes_accepted += u64::from(stale);
                    r.lost_increments += (value + 1 - d.value).max(0) as u64;
                    value = d.value;
                }
            }
        }
    }
    r.fenced_rejections = r.fenced_reads + r.fenced_writes;
    r.trials = r.writes_accepted + r.fenced_writes;
}

/// At no instant may more holders trust their grants than the lock allows:
/// one for a mutex, the permits for a semaphore, a writer alone or readers
/// only for a read-write lock. Implied by the per-cell deadline check above
/// when every slot stays below the permits; counted here as the promise
/// itself, so a slot past the permits or an overlap of the cells shows.
fn check_holders_at_once(input: &Input<'_>, grants: &[Grant], r: &mut Report) {
    let limit = input.permits.max(1);
    r.holders_at_once.limit = limit;
    for key_grants in per_lock(grants).values() {
        // (instant, starts, shared); ends sort before starts at one instant.
        let mut edges: Vec<(u64, bool, bool)> = Vec::new();
        for g in key_grants {
            let end = g
                .release
                .map_or(g.valid_until, |rel| rel.min(g.valid_until));
            if end > g.ok {
                edges.push((g.ok, true, g.shared));
                edges.push((end, false, g.shared));
            }
        }
        edges.sort();
        let (mut readers, mut others) = (0u64, 0u64);
        for (_, starts, shared) in edges {
            if !starts {
                *if shared { &mut readers } else { &mut others } -= 1;
                continue;
            }
            let over = if shared {
                others > 0 // a reader beside a writer
            } else if readers > 0 {
                true // a writer beside readers
            } else {
                // A mutex's or a semaphore's holders, or writers (limit 1).
                others + 1 > u64::from(limit)
            };
            *if shared { &mut readers } else { &mut others } += 1;
            r.holders_at_once.max = r.holders_at_once.max.max(readers + others);
            r.holders_at_once.over_limit += u64::from(over);
        }
    }
}

/// After a holder is killed, a worker already waiting must get the key
/// within [`takeover_bound`]. (A read-write lock's reader is not timed: a
/// writer behind it also waits for the other readers' holds.)
fn check_takeovers(input: &Input<'_>, grants: &[Grant], r: &mut Report) {
    let ttl = input.enforced_ttl.max(input.ttl).as_nanos() as u64;
    let bound = takeover_bound(input.ttl, input.enforced_ttl, input.retry);
    r.takeover.bound_ms = ms(bound.as_nanos() as u64);
    let kills = input
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::Kill && f.hit);
    for kill in kills {
        let (Some(key), Some(token)) = (&kill.key, kill.token) else {
            continue;
        };
        let killed_reader = grants
            .iter()
            .any(|g| &g.lock == key && g.token == token && g.shared);
        if killed_reader {
            continue;
        }
        let later = grants.iter().filter(|g| &g.lock == key && g.token > token);
        // A semaphore's waiter takes whichever permit frees first, maybe
        // before the killed one expires: the first grant after the kill.
        let next = if input.primitive == Primitive::Semaphore {
            later.filter(|g| g.ok >= kill.start).min_by_key(|g| g.ok)
        } else {
            later.min_by_key(|g| g.token)
        };
        let Some(next) = next.filter(|n| n.invoke <= kill.start + ttl) else {
            continue; // nobody was waiting when the lease ran out
        };
        let took = next.ok.saturating_sub(kill.start);
        r.takeover.measured += 1;
        r.takeover.max_ms = Some(r.takeover.max_ms.unwrap_or(0.0).max(ms(took)));
        if took > bound.as_nanos() as u64 {
            r.takeover.over_bound += 1;
        }
    }
}

/// How soon after a kill a waiting worker must hold the key: the ttl,
/// one more attempt and 250 ms. On a store that enforces a longer ttl than
/// asked (etcd rounds up to whole seconds) the killed lease lives for that
/// ttl, and the store's own deletion of an expired lease may come one such
/// ttl later (etcd's lessor looks for expired leases twice a second and
/// revokes them through Raft) — the allowance the conformance suite makes
/// for a coarse store (`TestStore::past_expiry`).
pub fn takeover_bound(ttl: Duration, enforced_ttl: Duration, retry: Duration) -> Duration {
    let lease_end = if enforced_ttl > ttl {
        enforced_ttl * 2
    } else {
        ttl
    };
    lease_end + retry + Duration::from_millis(250)
}

fn judge(input: &Input<'_>, r: &mut Report) {
    let mut v = Vec::new();
    let mut must_be_zero = |n: u64, what: &str| {
        if n > 0 {
            v.push(format!("{n} {what}"));
        }
    };
    must_be_zero(r.stale_writes_accepted, "stale writes accepted");
    must_be_zero(r.stale_reads_accepted, "stale reads accepted");
    must_be_zero(r.token_regressions, "token regressions");
    must_be_zero(r.token_duplicates, "duplicate tokens");
    must_be_zero(r.lost_increments, "lost increments");
    must_be_zero(
        r.holders_at_once.over_limit,
        "grants beyond the lock's limit of holders at once",
    );
    must_be_zero(r.takeover.over_bound, "takeovers over the bound");
    must_be_zero(
        r.lost_signal.superseded - r.lost_signal.deadline_before_next_grant,
        "holders still within valid_until when the next grant's request was sent",
    );
    must_be_zero(
        r.lost_signal.must_fire - r.lost_signal.fired_on_time,
        "holders whose lost() fired later than valid_until + slack, or never",
    );
    must_be_zero(r.locks_held_after_end as u64, "locks held after the run");
    r.violations = v;
    r.violation_rate_upper_95 = match (r.trials, r.stale_writes_accepted) {
        (0, _) => 1.0,
        (n, 0) => (3.0 / n as f64).min(1.0),
        (n, bad) => bad as f64 / n as f64,
    };
    r.inconclusive = untested(input, r);
    r.verdict = if !r.violations.is_empty() {
        Verdict::Violation
    } else if !r.inconclusive.is_empty() {
        Verdict::Inconclusive
    } else {
        Verdict::Pass
    };
}

/// What the run was asked to test but did not.
fn untested(input: &Input<'_>, r: &Report) -> Vec<String> {
    let mut why = Vec::new();
    if r.acquisitions == 0 {
        why.push("nothing was acquired".to_owned());
    }
    if r.renewals.renewed == 0 {
        why.push("no lease was renewed".to_owned());
    }
    let could_overlap = input.permits.min(input.workers) >= 2;
    if input.primitive == Primitive::Semaphore && could_overlap && r.holders_at_once.max < 2 {
        why.push("the semaphore never had two holders at once".to_owned());
    }
    for family in input.requested {
        let (injected, hit) = r
            .faults
            .iter()
            .filter(|(kind, _)| family_of(kind) == *family)
            .fold((0, 0), |(i, h), (_, c)| (i + c.injected, h + c.hit));
        if hit == 0 {
            why.push(format!(
                "{family} faults never landed on a holder ({injected} injected)"
            ));
        }
    }
    let faults_visible = r.fenced_rejections + r.overlapping_beliefs > 0;
    if input.requested.contains(&"pause") && !faults_visible {
        why.push("pauses caused neither a fenced rejection nor an overlapping belief".to_owned());
    }
    why
}

/// `proxy` for `proxy-stall`: fault kinds are named `FAMILY[-variant]`.
fn family_of(kind: &str) -> &str {
    kind.split('-').next().unwrap_or(kind)
}

fn per_lock(grants: &[Grant]) -> BTreeMap<&str, Vec<&Grant>> {
    let mut m: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants {
        m.entry(&g.lock).or_default().push(g);
    }
    m
}

fn per_key(grants: &[Grant]) -> BTreeMap<&str, Vec<&Grant>> {
    let mut m: BTreeMap<&str, Vec<&Grant>> = BTreeMap::new();
    for g in grants {
        m.entry(&g.key).or_default().push(g);
    }
    m
}

fn ms(ns: u64) -> f64 {
    (ns as f64 / 1e6 * 10.0).round() / 10.0
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        100.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

#[cfg(test)]
#[path = "checker_tests.rs"]
mod tests;
