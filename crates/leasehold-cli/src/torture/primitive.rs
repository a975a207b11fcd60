//! The lock under test (`--primitive`): what a worker acquires, which
//! resource cell a grant writes to, and how the nemesis finds holders.
//!
//! A semaphore's resource is fenced per slot (docs/semaphore.md), so each
//! slot is its own cell, `KEY#sSLOT`, and the checker follows each slot as
//! one lease: a slot has at most one live holder, as a mutex key does.
//! A read-write lock's cell is its key: readers share it (their reads are
//! fenced by writers' tokens only), a writer has it alone.

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
    /// `locks.rw_lock(key)`: readers (two rounds in three) or one writer
    Rw,
}

impl Primitive {
    /// As `--primitive` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Primitive::Mutex => "mutex",
            Primitive::Semaphore => "semaphore",
            Primitive::Rw => "rw",
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
    /// A semaphore permit's slot: the resource fences per slot.
    pub slot: Option<u32>,
}

impl Held {
    /// The resource cell this grant reads and writes.
    pub fn cell(&self, key: &str) -> String {
        cell(key, self.slot)
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
            Primitive::Mutex | Primitive::Rw => keys.to_vec(),
            Primitive::Semaphore => keys
                .iter()
                .flat_map(|k| (0..self.permits).map(move |s| cell(k, Some(s))))
                .collect(),
        }
    }

    /// Whether a worker's next round takes the read side (read-write lock
    /// only; the other primitives draw nothing, so their seeded schedules
    /// stay as they were).
    pub fn shared_round(&self, rng: &mut impl rand::Rng) -> bool {
        match self.primitive {
            Primitive::Mutex | Primitive::Semaphore => false,
            // Mostly readers, so they overlap and writers wait behind them.
            Primitive::Rw => rng.gen_bool(2.0 / 3.0),
        }
    }

    /// Takes the lock as a worker does; `shared` picks a read-write lock's
    /// read side.
    pub async fn acquire(
        &self,
        locks: &Locks,
        key: &str,
        options: &AcquireOptions,
        shared: bool,
    ) -> leasehold::Result<Held> {
        let (guard, shared) = match self.primitive {
            Primitive::Mutex => (locks.acquire_with(key, options).await?, false),
            Primitive::Semaphore => {
                let semaphore = locks.semaphore(key, self.permits)?;
                (semaphore.acquire_with(options).await?, false)
            }
            Primitive::Rw if shared => (locks.rw_lock(key)?.read_with(options).await?, true),
            Primitive::Rw => (locks.rw_lock(key)?.write_with(options).await?, false),
        };
        let slot = match self.primitive {
            Primitive::Semaphore => guard.slot(),
            Primitive::Mutex | Primitive::Rw => None,
        };
        Ok(Held {
            guard,
            shared,
            slot,
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
            Primitive::Semaphore | Primitive::Rw => {
                let permits = if self.primitive == Primitive::Rw {
                    locks.rw_lock(key)?.holders().await?
                } else {
                    locks.semaphore(key, self.permits)?.holders().await?
                };
                permits
                    .into_iter()
                    .map(|p| Holder {
                        label: p.holder,
                        token: p.token,
                    })
                    .collect()
            }
        })
    }

    /// How many live grants are left under `prefix`, of every kind.
    pub async fn live(&self, locks: &Locks, prefix: &str) -> leasehold::Result<usize> {
        Ok(locks.list_holders(prefix).await?.len())
    }
}
