//! The checker: reads the merged history (worker events, resource
//! decisions, faults) and decides whether the lock and the fenced resource
//! kept their promises, and whether the faults actually hit.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;

use super::history::{Decision, Event, Fault, FaultKind, Kind, Op, ResourceOp};

/// What the checker reads.
pub struct Input<'a> {
    pub events: &'a [Event],
    pub decisions: &'a [Decision],
    pub faults: &'a [Fault],
    pub ttl: Duration,
    /// Allowance for one more acquisition attempt after a lease runs out.
    pub retry: Duration,
    /// Live leases under the run's prefix once the run ended and a ttl passed.
    pub held_after_end: usize,
    pub pauses_enabled: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Violation,
    /// Nothing was violated, but the faults did not visibly hit, so the run
    /// proves little.
    Inconclusive,
}

#[derive(Debug, Default, Clone, Copy, Serialize)]
pub struct FaultCount {
    pub injected: u64,
    /// Landed on a lease holder (kill, pause) or took effect (proxy, restart).
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
    /// Of those, holders whose `valid_until` had passed by that grant.
    pub deadline_before_next_grant: u64,
    pub percent: f64,
    /// `lost()` signals the workers saw fire (a paused worker sees it late).
    pub signals_fired: u64,
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
    pub takeover: Takeover,
    pub lost_signal: LostSignal,
    pub locks_held_after_end: usize,
    /// Write decisions: each a chance to accept a stale write.
    pub trials: u64,
    /// 95 % upper bound on the stale-write rate: 3/trials when none was
    /// seen (the rule of three), else the observed rate.
    pub violation_rate_upper_95: f64,
    pub violations: Vec<String>,
    pub verdict: Verdict,
}

/// One granted lease, as its holder saw it.
#[derive(Debug, Clone)]
struct Grant {
    key: String,
    token: u64,
    invoke: u64,
    ok: u64,
    /// The latest `valid_until` the holder logged.
    valid_until: u64,
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
        takeover: Takeover::default(),
        lost_signal: LostSignal::default(),
        locks_held_after_end: input.held_after_end,
        trials: 0,
        violation_rate_upper_95: 1.0,
        violations: Vec::new(),
        verdict: Verdict::Pass,
    };
    let grants = grants(input.events, &mut r);
    check_tokens(&grants, &mut r);
    check_beliefs(&grants, &mut r);
    check_resource(input.decisions, &mut r);
    check_takeovers(input, &grants, &mut r);
    for f in input.faults {
        let c = r.faults.entry(f.kind.name()).or_default();
        c.injected += 1;
        c.hit += u64::from(f.hit);
    }
    judge(input, &mut r);
    r
}

/// Rebuilds each holder's view from its own events, process by process.
fn grants(events: &[Event], r: &mut Report) -> Vec<Grant> {
    let mut by_pid: BTreeMap<u32, Vec<&Event>> = BTreeMap::new();
    for e in events {
        by_pid.entry(e.pid).or_default().push(e);
    }
    let mut out = Vec::new();
    for stream in by_pid.values_mut() {
        stream.sort_by_key(|e| e.t);
        let mut invoked = None;
        let mut current: Option<usize> = None;
        for e in stream.iter() {
            match (e.op, e.kind) {
                (Op::Acquire, Kind::Invoke) => {
                    invoked = Some(e.t);
                    current = None;
                }
                (Op::Acquire, Kind::Ok) => {
                    r.acquisitions += 1;
                    out.push(Grant {
                        key: e.key.clone(),
                        token: e.token.unwrap_or(0),
                        invoke: invoked.unwrap_or(e.t),
                        ok: e.t,
                        valid_until: e.valid_until.unwrap_or(0),
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
            if let Some(v) = e.valid_until {
                g.valid_until = g.valid_until.max(v);
            }
            match (e.op, e.kind) {
                (Op::Read | Op::Write, Kind::Invoke) => g.last_op = Some(e.t),
                (Op::Release, Kind::Invoke) => g.release = Some(e.t),
                _ => {}
            }
        }
    }
    out
}

/// No two grants of a key share a token, and a grant that completed before
/// another started has the smaller token.
fn check_tokens(grants: &[Grant], r: &mut Report) {
    let mut seen: HashMap<(&str, u64), u64> = HashMap::new();
    for g in grants {
        *seen.entry((&g.key, g.token)).or_default() += 1;
    }
    r.token_duplicates = seen.values().map(|n| n - 1).sum();
    for key_grants in per_key(grants).values() {
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

/// For each holder and the next grant of its key: did the holder's local
/// deadline pass before that grant (it must), and did it still use the
/// resource after it (the overlap fencing has to catch)?
fn check_beliefs(grants: &[Grant], r: &mut Report) {
    for key_grants in per_key(grants).values() {
        let mut by_token = key_grants.clone();
        by_token.sort_by_key(|g| g.token);
        for (i, h) in by_token.iter().enumerate() {
            let Some(next) = by_token[i + 1..].iter().find(|n| n.token > h.token) else {
                continue;
            };
            if h.release.is_none_or(|rel| rel > next.ok) {
                r.lost_signal.superseded += 1;
                if h.valid_until <= next.ok {
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

/// Replays the resource's decisions per key: no accepted operation may
/// carry a token below one already accepted, and every accepted write must
/// build on the value before it.
fn check_resource(decisions: &[Decision], r: &mut Report) {
    let mut by_key: BTreeMap<&str, Vec<&Decision>> = BTreeMap::new();
    for d in decisions {
        by_key.entry(&d.key).or_default().push(d);
    }
    for ds in by_key.values_mut() {
        ds.sort_by_key(|d| d.seq);
        let (mut highest, mut value) = (0u64, 0i64);
        for d in ds.iter() {
            match (d.op, d.accepted) {
                (ResourceOp::Read, false) => r.fenced_reads += 1,
                (ResourceOp::Write, false) => r.fenced_writes += 1,
                (op, true) => {
                    let stale = d.token < highest;
                    highest = highest.max(d.token);
                    if op == ResourceOp::Read {
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

/// After a holder is killed, a worker already waiting must get the key
/// within ttl + retry + 250 ms.
fn check_takeovers(input: &Input<'_>, grants: &[Grant], r: &mut Report) {
    let ttl = input.ttl.as_nanos() as u64;
    let bound = input.ttl + input.retry + Duration::from_millis(250);
    r.takeover.bound_ms = ms(bound.as_nanos() as u64);
    let kills = input
        .faults
        .iter()
        .filter(|f| f.kind == FaultKind::Kill && f.hit);
    for kill in kills {
        let (Some(key), Some(token)) = (&kill.key, kill.token) else {
            continue;
        };
        let next = grants
            .iter()
            .filter(|g| &g.key == key && g.token > token)
            .min_by_key(|g| g.token);
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
    must_be_zero(r.takeover.over_bound, "takeovers over the bound");
    must_be_zero(
        r.lost_signal.superseded - r.lost_signal.deadline_before_next_grant,
        "holders still within valid_until when the next holder was granted",
    );
    must_be_zero(r.locks_held_after_end as u64, "locks held after the run");
    r.violations = v;
    r.violation_rate_upper_95 = match (r.trials, r.stale_writes_accepted) {
        (0, _) => 1.0,
        (n, 0) => (3.0 / n as f64).min(1.0),
        (n, bad) => bad as f64 / n as f64,
    };
    let faults_visible = r.fenced_rejections + r.overlapping_beliefs > 0;
    r.verdict = if !r.violations.is_empty() {
        Verdict::Violation
    } else if r.acquisitions == 0 || (input.pauses_enabled && !faults_visible) {
        Verdict::Inconclusive
    } else {
        Verdict::Pass
    };
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
