//! A reference model of the lease protocol and a runner that applies random
//! operation sequences to a real store and to the model side by side,
//! comparing every answer and, after every step, what the store reports.
//!
//! The model is deliberately naive: a map of key -> {fence, holder, expiry}
//! with its own millisecond clock. A key's first token is taken as the
//! store gives it; each later grant must be the next, or above the last
//! where the store's tokens have gaps ([`Tokens`]).
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use leasehold::backend::{Acquire, AcquireRequest};
use leasehold::{AcquireOptions, Backend, Error, Key, Lease, Locks, OwnerId};
use proptest::prelude::*;

pub const CLIENTS: usize = 3;
pub const KEYS: usize = 3;

/// Inputs the core must refuse before any I/O.
#[derive(Debug, Clone, Copy)]
pub enum Bad {
    EmptyKey,
    LongKey,
    ControlKey,
    ZeroTtl,
    HugeTtl,
    ControlPrefix,
}

#[derive(Debug, Clone)]
pub enum Op {
    Acquire {
        client: usize,
        key: usize,
        ttl_ms: u64,
    },
    Renew {
        client: usize,
        key: usize,
        ttl_ms: u64,
    },
    Release {
        client: usize,
        key: usize,
    },
    ForceRelease {
        key: usize,
    },
    /// Time passes (only where the test controls the store's clock).
    Advance {
        ms: u64,
    },
    /// The client vanishes without releasing: its leases are forgotten.
    Crash {
        client: usize,
    },
    Invalid(Bad),
}

/// How the store's clock can be driven.
#[derive(Debug, Clone, Copy)]
pub enum Clock {
    /// The store reads tokio's paused clock: time moves only by `Advance`,
    /// so expiry and remaining ttls are compared exactly.
    Paused,
    /// The store reads the host clock: no `Advance`, ttls far longer than a
    /// case runs, remaining ttls compared within a margin.
    Real,
}

/// What a store promises of a key's successive tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tokens {
    /// Each grant takes the next token: the store draws one per grant.
    Next,
    /// Each grant takes a token above the last: the store may draw one on
    /// a busy try too (Redis draws it before it tries the key), which the
    /// protocol allows (tokens need not be contiguous).
    Increasing,
}

pub fn ops(clock: Clock) -> impl Strategy<Value = Vec<Op>> {
    let ttl = match clock {
        // 100 ms .. 2 s: short enough that advances expire leases often.
        Clock::Paused => (100u64..2_000).boxed(),
        Clock::Real => (60_000u64..600_000).boxed(),
    };
    let client = 0..CLIENTS;
    let key = 0..KEYS;
    let bad = prop_oneof![
        Just(Bad::EmptyKey),
        Just(Bad::LongKey),
        Just(Bad::ControlKey),
        Just(Bad::ZeroTtl),
        Just(Bad::HugeTtl),
        Just(Bad::ControlPrefix),
    ];
    let advance = match clock {
        Clock::Paused => prop_oneof![(0u64..3_000).prop_map(|ms| Op::Advance { ms })].boxed(),
        Clock::Real => Just(Op::Crash { client: 0 }).boxed(),
    };
    let op = prop_oneof![
        4 => (client.clone(), key.clone(), ttl.clone())
            .prop_map(|(client, key, ttl_ms)| Op::Acquire { client, key, ttl_ms }),
        2 => (client.clone(), key.clone(), ttl)
            .prop_map(|(client, key, ttl_ms)| Op::Renew { client, key, ttl_ms }),
        2 => (client.clone(), key.clone()).prop_map(|(client, key)| Op::Release { client, key }),
        1 => key.prop_map(|key| Op::ForceRelease { key }),
        3 => advance,
        1 => client.prop_map(|client| Op::Crash { client }),
        1 => bad.prop_map(Op::Invalid),
    ];
    prop::collection::vec(op, 1..40)
}

#[derive(Debug)]
struct Holder {
    owner: OwnerId,
    label: String,
    expires_ms: u64,
}

#[derive(Debug, Default)]
struct Record {
    fence: u64,
    holder: Option<Holder>,
}

#[derive(Debug, Default)]
struct Model {
    now_ms: u64,
    records: BTreeMap<usize, Record>,
    /// The latest lease each client was granted per key.
    leases: HashMap<(usize, usize), Lease>,
}

impl Model {
    fn live(&self, key: usize) -> Option<(&Record, &Holder)> {
        let r = self.records.get(&key)?;
        let h = r.holder.as_ref().filter(|h| h.expires_ms > self.now_ms)?;
        Some((r, h))
    }
}

/// Applies `ops` to `backend` and to the model; panics on the first
/// difference. Keys live under `prefix`, so cases can share a store.
pub async fn run(
    backend: Arc<dyn Backend>,
    clock: Clock,
    tokens: Tokens,
    prefix: &str,
    ops: &[Op],
) {
    let mut m = Model::default();
    let key = |k: usize| Key::new(format!("{prefix}k{k}")).unwrap();
    let locks = Locks::from_arc(backend.clone());
    for (step, op) in ops.iter().enumerate() {
        let ctx = format!("step {step}: {op:?}");
        match *op {
            Op::Acquire {
                client,
                key: k,
                ttl_ms,
            } => {
                let req = AcquireRequest::new(key(k), ms(ttl_ms), &format!("c{client}")).unwrap();
                let real = backend.try_acquire(&req).await.expect(&ctx);
                let now = m.now_ms;
                match (
                    m.live(k).map(|(_, h)| (h.label.clone(), h.expires_ms)),
                    real,
                ) {
                    (Some((label, expires)), Acquire::Busy(busy)) => {
                        assert_eq!(busy.holder, label, "{ctx}");
                        assert_remaining(clock, busy.remaining, expires - now, &ctx);
                    }
                    (None, Acquire::Granted(lease)) => {
                        let r = m.records.entry(k).or_default();
                        if r.fence == 0 {
                            // A key's first token is the store's to choose
                            // (Redis starts a new fence at its clock, see
                            // docs/storage.md); every later one is the next.
                            assert!(lease.token() > 0, "{ctx}: token");
                            r.fence = lease.token();
                        } else if tokens == Tokens::Next {
                            r.fence += 1;
                            assert_eq!(lease.token(), r.fence, "{ctx}: token");
                        } else {
                            assert!(lease.token() > r.fence, "{ctx}: token");
                            r.fence = lease.token();
                        }
                        assert_eq!(lease.owner(), req.owner());
                        r.holder = Some(Holder {
                            owner: req.owner(),
                            label: format!("c{client}"),
                            expires_ms: now + ttl_ms,
                        });
                        m.leases.insert((client, k), lease);
                    }
                    (model, real) => panic!("{ctx}: model holder {model:?}, store {real:?}"),
                }
            }
            Op::Renew {
                client,
                key: k,
                ttl_ms,
            } => {
                let Some(lease) = m.leases.get(&(client, k)).cloned() else {
                    continue;
                };
                let real = backend.renew(&lease, ms(ttl_ms)).await.expect(&ctx);
                let now = m.now_ms;
                let expected = matches!(m.live(k), Some((r, h)) if h.owner == lease.owner() && r.fence == lease.token());
                assert_eq!(real, expected, "{ctx}: renewed");
                if expected {
                    let h = m.records.get_mut(&k).unwrap().holder.as_mut().unwrap();
                    h.expires_ms = now + ttl_ms;
                }
            }
            Op::Release { client, key: k } => {
                let Some(lease) = m.leases.get(&(client, k)).cloned() else {
                    continue;
                };
                backend.release(&lease).await.expect(&ctx);
                let r = m.records.get_mut(&k).unwrap();
                if r.fence == lease.token()
                    && r.holder.as_ref().is_some_and(|h| h.owner == lease.owner())
                {
                    r.holder = None;
                }
            }
            Op::ForceRelease { key: k } => {
                let real = backend.force_release(&key(k)).await.expect(&ctx);
                let was_live = m.live(k).is_some();
                if let Some(r) = m.records.get_mut(&k) {
                    r.holder = None;
                    r.fence += 1;
                }
                assert_eq!(real, was_live, "{ctx}: broke a live lease");
            }
            Op::Advance { ms: by } => {
                tokio::time::advance(ms(by)).await;
                m.now_ms += by;
            }
            Op::Crash { client } => m.leases.retain(|(c, _), _| *c != client),
            Op::Invalid(bad) => invalid(&locks, prefix, bad, &ctx).await,
        }
        check_view(&*backend, clock, prefix, &m, &ctx).await;
    }
}

/// The store's own view (inspect and list) matches the model.
async fn check_view(backend: &dyn Backend, clock: Clock, prefix: &str, m: &Model, ctx: &str) {
    let mut expected_keys = Vec::new();
    for k in 0..KEYS {
        let key = Key::new(format!("{prefix}k{k}")).unwrap();
        let real = backend.inspect(&key).await.expect(ctx);
        match (m.live(k), real) {
            (None, None) => {}
            (Some((r, h)), Some(info)) => {
                assert_eq!(
                    (info.token, &info.holder),
                    (r.fence, &h.label),
                    "{ctx}: inspect"
                );
                assert_remaining(clock, info.remaining, h.expires_ms - m.now_ms, ctx);
                expected_keys.push(key);
            }
            (model, real) => panic!("{ctx}: inspect k{k}: model {model:?}, store {real:?}"),
        }
    }
    let listed: Vec<Key> = backend
        .list(prefix)
        .await
        .expect(ctx)
        .into_iter()
        .map(|i| i.key)
        .collect();
    assert_eq!(listed, expected_keys, "{ctx}: list");
}

fn assert_remaining(clock: Clock, real: Duration, model_ms: u64, ctx: &str) {
    let model = ms(model_ms);
    match clock {
        Clock::Paused => assert_eq!(real, model, "{ctx}: remaining ttl"),
        // The host clock moved on since the model's "now"; never past it.
        Clock::Real => assert!(
            real <= model && real + Duration::from_secs(10) > model,
            "{ctx}: remaining {real:?}, model {model:?}"
        ),
    }
}

async fn invalid(locks: &Locks, prefix: &str, bad: Bad, ctx: &str) {
    let ok_key = format!("{prefix}k0");
    let result = match bad {
        Bad::EmptyKey => locks.try_acquire("").await.map(drop),
        Bad::LongKey => locks.try_acquire(&"k".repeat(257)).await.map(drop),
        Bad::ControlKey => locks
            .force_release(&format!("{prefix}\u{0}"))
            .await
            .map(drop),
        Bad::ZeroTtl | Bad::HugeTtl => {
            let ttl = match bad {
                Bad::ZeroTtl => Duration::ZERO,
                _ => Duration::MAX,
            };
            let opts = AcquireOptions::new().with_ttl(ttl);
            locks.acquire_with(&ok_key, &opts).await.map(drop)
        }
        Bad::ControlPrefix => locks.list(&format!("{prefix}\n")).await.map(drop),
    };
    match result {
        Err(Error::InvalidInput { .. }) => {}
        other => panic!("{ctx}: expected InvalidInput, got {other:?}"),
    }
}

fn ms(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
