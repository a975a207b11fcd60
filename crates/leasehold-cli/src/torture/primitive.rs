//! The lock under test (`--primitive`): what a worker acquires, which
//! resource cell a grant writes to, and how the nemesis finds holders.
//!
//! A semaphore's resource is fenced per slot (docs/semaphore.md), so each
//! slot is its own cell, `KEY#sSLOT`, and the checker follows each slot as
//! one lease: a slot has at most one live holder, as a mutex key does.

use clap::ValueEnum;
use leasehold::{AcquireOptions, LeaseGuard, Locks};
use serde::Serialize;

/// A `--primitive`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Primitive {
    /// `locks.acquire`: one holder per key
    Mutex,
    /// `locks.semaphore(key, --permits)`: at most N holders, fenced per slot
    Semaphore,
}

impl Primitive {
    /// As `--primitive` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Semaphore => "semaphore",
        }
    }
}

/// The lock under test with its parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lock {
    pub primitive: Primitive,
    /// Semaphore permits; 1 otherwise.
    pub permits: u32,
}

/// One granted lock, as a worker holds it.
pub struct Held {
    pub guard: LeaseGuard,
    /// The read side of a read-write lock.
    pub shared: bool,
}

impl Held {
    /// The resource cell this grant reads and writes.
    pub fn cell(&self, key: &str) -> String {
        cell(key, self.guard.slot())
    }
}

/// The resource cell of `key` (and a semaphore permit's slot).
pub fn cell(key: &str, slot: Option<u32>) -> String {
    match slot {
        Some(slot) => format!("{key}#s{slot}"),
        None => key.to_owned(),
    }
}

/// A current holder, as the nemesis sees it.
pub struct Holder {
    pub label: String,
    pub token: u64,
}

impl Lock {
    /// Every resource cell a run on `keys` may use.
    pub fn cells(&self, keys: &[String]) -> Vec<String> {
        match self.primitive {
            Primitive::Mutex => keys.to_vec(),
            Primitive::Semaphore => keys
                .iter()
                .flat_map(|k| (0..self.permits).map(move |s| cell(k, Some(s))))
                .collect(),
        }
    }

    /// Whether a worker's next round takes the read side (read-write lock
    /// only; the other primitives draw nothing, so their seeded schedules
    /// stay as they were).
    pub fn shared_round(&self, _rng: &mut impl rand::Rng) -> bool {
        match self.primitive {
            Primitive::Mutex | Primitive::Semaphore => false,
        }
    }

    /// Takes the lock as a worker does; `shared` picks a read-write lock's
    /// read side.
    pub async fn acquire(
        &self,
        locks: &Locks,
        key: &str,
        options: &AcquireOptions,
        _shared: bool,
    ) -> leasehold::Result<Held> {
        let guard = match self.primitive {
            Primitive::Mutex => locks.acquire_with(key, options).await?,
            Primitive::Semaphore => {
                locks
                    .semaphore(key, self.permits)?
                    .acquire_with(options)
                    .await?
            }
        };
        Ok(Held {
            guard,
            shared: false,
        })
    }

    /// The live holders of `key`.
    pub async fn holders(&self, locks: &Locks, key: &str) -> leasehold::Result<Vec<Holder>> {
        Ok(match self.primitive {
            Primitive::Mutex => locks
                .inspect(key)
                .await?
                .map(|i| Holder {
                    label: i.holder,
                    token: i.token,
                })
                .into_iter()
                .collect(),
            Primitive::Semaphore => locks
                .semaphore(key, self.permits)?
                .holders()
                .await?
                .into_iter()
                .map(|p| Holder {
                    label: p.holder,
                    token: p.token,
                })
                .collect(),
        })
    }

    /// How many live grants are left under `prefix`, of every kind.
    pub async fn live(&self, locks: &Locks, prefix: &str) -> leasehold::Result<usize> {
        Ok(locks.list(prefix).await?.len() + locks.list_permits(prefix).await?.len())
    }
}
