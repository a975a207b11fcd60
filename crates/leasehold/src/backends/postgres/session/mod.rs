//! The process's one connection per PostgreSQL URL: it `LISTEN`s for
//! releases *and* carries the lock statements, so a process costs the
//! server one connection (the default; see `PostgresOptions::with_max_connections`
//! for the pooled alternative).
//!
//! A task owns the connection (a sqlx `PgListener`, which buffers the
//! notifications that arrive while a statement runs) and serves statement
//! jobs sent over a channel, interleaved with notifications. It runs on a
//! thread and runtime of its own, since callers on any runtime of the
//! process share it and none of their runtimes outlives the others. Waiters never
//! hold it: they hold a [`Subscription`] of the shared [`WakeHub`].
//!
//! Connecting is lazy (the first statement or waiter), and the connection
//! is closed after `idle_timeout` without statements while nobody waits, so
//! an idle process holds none. After a failed attempt, statements arriving
//! within [`REFUSAL_MEMORY`] get that attempt's answer at once (one attempt
//! a second at most, however many operations ask), and waiters poll while
//! the task retries on its own with a backoff of 1 s up to 30 s.
//!
//! Every statement is bounded, since everything behind it waits for it:
//! row-lock waits by the session's `lock_timeout` ([`SESSION_LOCK_TIMEOUT`])
//! and the store's caps ([`ROW_LOCK_WAIT`] for acquire and renew). A
//! statement is taken as a sign of a dead connection (it is dropped and the
//! next statement goes out on a new one) when it outlives the patience of
//! *its own* caller by the link's normal time ([`patience`]), when it runs
//! longer than any healthy statement can while a caller queued behind it
//! has given up, or after [`STATEMENT_BOUND`]. Another caller's impatience
//! says nothing about a statement still within its healthy time: on a slow
//! link (a server 120 ms away), callers with a short patience would
//! otherwise abandon every statement in turn, renewals included.
//!
//! Releases announced while nobody listened are lost, so every waiter is
//! woken once `LISTEN` is back after a gap with waiters (not before: a
//! waiter woken early could retry, find the key held, and miss the release
//! that follows).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions, PgQueryResult, PgRow};
use sqlx::{Acquire, Connection, Executor, PgConnection};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::{sleep, sleep_until, timeout, Instant};

use super::exec::{self, Param};
use super::names::CHANNEL;
use super::pooler::Pooler;
use crate::error::Error;
use crate::key::Key;
use crate::notify::{HandOff, Subscription, WakeHub};
use crate::owner::OwnerId;
use crate::time::Backoff;

mod task;

use task::*;

/// The longest an acquire or renew statement on the shared connection
/// waits for a row another transaction holds (a `check_in`, an
/// application's `FOR UPDATE`): long enough for a concurrent lease
/// statement on the same key to commit. An acquire then answers busy and
/// its waiter retries when woken or after its backoff; a renewal retries
/// within its lease.
pub(super) const ROW_LOCK_WAIT: Duration = Duration::from_millis(50);
/// The session's `lock_timeout`, for the statements that do not set their
/// own (release, force-release): far above a commit, and a bound on how
/// long they hold up the statements queued behind them.
const SESSION_LOCK_TIMEOUT: Duration = Duration::from_secs(1);
/// The migration's wait for a concurrent first start (an advisory lock).
const MIGRATION_LOCK_TIMEOUT: &str = "5s";
/// A statement still running after this is presumed stuck on a dead path.
const STATEMENT_BOUND: Duration = Duration::from_secs(10);
/// A caller that gives up on its statement (a renewal attempt's own bound,
/// the acquire backstop) marks the connection dead, but only once the
/// statement has had this long plus two of the link's round trips
/// ([`patience`]): a healthy one answers far sooner.
const MIN_PATIENCE: Duration = Duration::from_millis(100);
/// How long a failed connection attempt answers for the server.
const REFUSAL_MEMORY: Duration = Duration::from_secs(1);
/// How long a waiter waits for the first connection before it polls.
const FIRST_CONNECTION_WAIT: Duration = Duration::from_secs(5);
/// How long the connection may take to open before the task asks the
/// server directly why: sqlx's pool retries a refusal (`too many clients`,
/// `connection refused`) in silence until its timeout.
const SUSPECT_AFTER: Duration = Duration::from_millis(250);
/// Bound on that direct attempt.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A statement parameter the job owns (it crosses to the task).
#[derive(Debug, Clone)]
pub(super) enum Owned {
    Text(String),
    Int(i64),
}

impl Owned {
    fn all(params: &[Param<'_>]) -> Vec<Owned> {
        params
            .iter()
            .map(|p| match *p {
                Param::Text(t) => Owned::Text(t.to_owned()),
                Param::Int(n) => Owned::Int(n),
            })
            .collect()
    }

    fn borrowed(params: &[Owned]) -> Vec<Param<'_>> {
        params
            .iter()
            .map(|p| match p {
                Owned::Text(t) => Param::Text(t),
                Owned::Int(n) => Param::Int(*n),
            })
            .collect()
    }
}

/// One statement and its parameters.
#[derive(Debug, Clone)]
pub(super) struct Statement {
    pub sql: String,
    pub params: Vec<Owned>,
}

impl Statement {
    pub(super) fn new(sql: &str, params: &[Param<'_>]) -> Self {
        Statement {
            sql: sql.to_owned(),
            params: Owned::all(params),
        }
    }
}

/// What a job asks of the connection.
#[derive(Debug)]
enum Op {
    /// Nothing but the connection (and so `LISTEN`) in place.
    Connect,
    Rows(Statement),
    Execute(Statement),
    /// The statements in one transaction whose row and advisory lock
    /// waits are bounded by [`MIGRATION_LOCK_TIMEOUT`] (the migration).
    Transaction(Vec<Statement>),
}

/// What a job brings back.
#[derive(Debug)]
pub(super) enum Answer {
    Ready,
    Rows(Vec<PgRow>),
    Done(PgQueryResult),
}

/// Why a job brought nothing back.
#[derive(Debug)]
pub(super) enum Failed {
    /// The server's or the driver's answer to the statement (or to the
    /// connection attempt).
    Sql(sqlx::Error),
    /// The store's own verdict: no connection right now.
    Store(Error),
}

impl Failed {
    /// The caller's error.
    pub(super) fn into_error(self) -> Error {
        match self {
            Failed::Sql(e) => super::classify(e),
            // Errors made here (no connection, a refusal kept for a
            // second) name the store like every other PostgreSQL error.
            Failed::Store(e) => e.in_store(super::STORE),
        }
    }
}

struct Job {
    op: Op,
    reply: oneshot::Sender<Result<Answer, Failed>>,
}

/// The shared connection of one URL in this process.
#[derive(Debug)]
pub(super) struct Session {
    config: Arc<Config>,
    hub: WakeHub,
    /// Bumped by every caller that stops waiting for its answer (the
    /// running statement's own caller is seen by its reply channel).
    gave_up: watch::Sender<u64>,
    running: std::sync::Mutex<Option<Running>>,
}

#[derive(Debug)]
struct Config {
    connect: PgConnectOptions,
    idle_timeout: Duration,
    acquire_timeout: Duration,
}

/// The serving task, on a thread of its own ([`spawn_serving`]); it ends
/// when `jobs` is dropped, that is when the last backend on the URL goes
/// (after the statement it is running, if any: each is bounded).
#[derive(Debug)]
struct Running {
    jobs: mpsc::UnboundedSender<Job>,
    thread: std::thread::JoinHandle<()>,
}

impl Session {
    pub(super) fn new(
        connect: PgConnectOptions,
        idle_timeout: Duration,
        acquire_timeout: Duration,
    ) -> Self {
        Session {
            config: Arc::new(Config {
                connect,
                idle_timeout,
                acquire_timeout,
            }),
            hub: WakeHub::new(),
            gave_up: watch::channel(0).0,
            running: std::sync::Mutex::new(None),
        }
    }

    /// Makes sure the connection is up (for `connect` without migration).
    pub(super) async fn connect(&self) -> Result<(), Failed> {
        self.run(Op::Connect).await.map(drop)
    }

    /// Runs `statement` and returns its rows.
    pub(super) async fn fetch_all(&self, statement: Statement) -> Result<Vec<PgRow>, Failed> {
        match self.run(Op::Rows(statement)).await? {
            Answer::Rows(rows) => Ok(rows),
            other => Err(unexpected(other)),
        }
    }

    /// Runs `statement` and returns what it changed.
    pub(super) async fn execute(&self, statement: Statement) -> Result<PgQueryResult, Failed> {
        match self.run(Op::Execute(statement)).await? {
            Answer::Done(done) => Ok(done),
            other => Err(unexpected(other)),
        }
    }

    /// Runs `statements` in one transaction (the migration).
    pub(super) async fn transaction(&self, statements: Vec<Statement>) -> Result<(), Failed> {
        self.run(Op::Transaction(statements)).await.map(drop)
    }

    /// Wakes this process's waiters of `key` now, without waiting for the
    /// notification to come back from the server.
    pub(super) fn wake_local(&self, key: &Key) {
        self.hub.notify(key.as_str());
    }

    /// Tells this process's waiter of `key` registered as `owner` (if it
    /// is here) of a grant handed over to it, without waiting for the
    /// notification to come back from the server.
    pub(super) fn hand_over_local(&self, key: &Key, owner: OwnerId, grant: HandOff) {
        self.hub.hand_over(key.as_str(), owner, grant);
    }

    /// Registers a waiter for `key`: live once `LISTEN` is in place, so no
    /// release committed after this returns is missed; a subscription that
    /// never fires (the waiter polls) if there is no connection right now.
    pub(super) async fn subscribe(&self, key: &Key) -> Subscription {
        // Register first: a release between LISTEN and this is then seen.
        let subscription = self.hub.subscribe(key.as_str());
        match timeout(FIRST_CONNECTION_WAIT, self.run(Op::Connect)).await {
            Ok(Ok(_)) => subscription,
            _ => {
                tracing::debug!(%key, "no LISTEN connection; this waiter polls");
                Subscription::never()
            }
        }
    }

    async fn run(&self, op: Op) -> Result<Answer, Failed> {
        let (reply, answer) = oneshot::channel();
        self.send(Job { op, reply });
        let mut waiting = GiveUpOnDrop {
            gave_up: &self.gave_up,
            answered: false,
        };
        let answer = answer.await;
        waiting.answered = true;
        answer.unwrap_or_else(|_| {
            Err(Failed::Store(Error::unavailable(
                "the PostgreSQL connection task stopped",
            )))
        })
    }

    /// Hands `job` to the task, starting it unless it runs (a thread that
    /// ended, or never started, is replaced).
    fn send(&self, mut job: Job) {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..2 {
            if let Some(r) = running.as_ref().filter(|r| !r.thread.is_finished()) {
                match r.jobs.send(job) {
                    Ok(()) => return,
                    Err(mpsc::error::SendError(back)) => job = back,
                }
            }
            let (jobs, queue) = mpsc::unbounded_channel();
            let serving = serve(
                queue,
                self.config.clone(),
                self.hub.clone(),
                self.gave_up.subscribe(),
            );
            match spawn_serving(serving) {
                Ok(thread) => *running = Some(Running { jobs, thread }),
                Err(e) => {
                    let _ = job.reply.send(Err(Failed::Store(Error::unavailable(format!(
                        "the PostgreSQL connection thread could not be started: {e}"
                    )))));
                    return;
                }
            }
        }
        // Unreachable in practice: a task just started takes its first job.
        let _ = job.reply.send(Err(Failed::Store(Error::unavailable(
            "the PostgreSQL connection task could not be started",
        ))));
    }
}

fn unexpected(answer: Answer) -> Failed {
    Failed::Store(Error::backend(format!(
        "internal: unexpected answer {answer:?}"
    )))
}

/// Tells the task a caller stopped waiting (dropped before its answer).
struct GiveUpOnDrop<'a> {
    gave_up: &'a watch::Sender<u64>,
    answered: bool,
}

impl Drop for GiveUpOnDrop<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.gave_up.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(op: Op) -> Job {
        Job {
            op,
            reply: oneshot::channel().0,
        }
    }

    fn is_renewal(job: &Job) -> bool {
        matches!(job.op, Op::Execute(_))
    }

    /// A renewal queued behind acquisitions is served before them, and
    /// the rest keep their order.
    #[tokio::test]
    async fn renewals_go_before_the_jobs_queued_ahead_of_them() {
        let (sender, channel) = mpsc::unbounded_channel();
        let mut queue = JobQueue::new(channel);
        for n in 0..3 {
            sender
                .send(job(Op::Rows(Statement::new(&format!("attempt {n}"), &[]))))
                .unwrap();
        }
        sender
            .send(job(Op::Execute(Statement::new("renew", &[]))))
            .unwrap();
        let first = queue.next().await.unwrap();
        assert!(is_renewal(&first), "the renewal first");
        for n in 0..3 {
            match queue.next().await.unwrap().op {
                Op::Rows(statement) => assert_eq!(statement.sql, format!("attempt {n}")),
                other => panic!("unexpected {other:?}"),
            }
        }
        drop(sender);
        assert!(queue.next().await.is_none(), "ends with its senders");
    }
}
