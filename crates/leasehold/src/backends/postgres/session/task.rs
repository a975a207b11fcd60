//! The task that owns the session's connection: its queue of statement
//! jobs (renewals first), the connection's life (open, probe, drop when
//! it looks dead, reconnect with a backoff) and the running of each job.

#[allow(clippy::wildcard_imports)] // the session's types and bounds, one module split in two
use super::*;

/// The open connection: the listener and its pool of one (sqlx's
/// `PgListener` needs a pool; this one is never reaped).
struct Link {
    listener: PgListener,
    pool: PgPool,
    /// The link's round trip as the fastest recent statements saw it (see
    /// [`Link::answered_in`]).
    round_trip: Duration,
}

impl Link {
    /// Counts a statement answered after `took`: a faster one lowers the
    /// estimate at once (the round trip is the least a statement takes); a
    /// slower one raises it by an eighth of the gap, so that a row-lock
    /// wait moves it little while a link that became slower is followed.
    fn answered_in(&mut self, took: Duration) {
        let took = took.min(SESSION_LOCK_TIMEOUT);
        self.round_trip = if took < self.round_trip {
            took
        } else {
            self.round_trip + (took - self.round_trip) / 8
        };
    }

    /// Closes the connection in the background (a dead one may never
    /// answer the `UNLISTEN` sqlx sends on drop).
    fn close(self) {
        let Link { listener, pool, .. } = self;
        drop(listener);
        tokio::spawn(async move {
            let _ = timeout(Duration::from_secs(1), pool.close()).await;
        });
    }
}

/// The last failed connection attempt.
struct Refusal {
    at: Instant,
    cause: Arc<dyn std::error::Error + Send + Sync>,
    retryable: bool,
}

impl Refusal {
    /// Classified as `classify` does: a pooler's refusal says what to
    /// change and is not retryable.
    fn new(e: sqlx::Error) -> Self {
        let (cause, retryable): (Arc<dyn std::error::Error + Send + Sync>, bool) =
            match super::super::pooler::explain(e) {
                Ok(explained) => (Arc::new(explained), false),
                Err(e) => {
                    let retryable = super::super::is_transient_pg_error(&e)
                        || matches!(e, sqlx::Error::PoolClosed);
                    (Arc::new(e), retryable)
                }
            };
        Refusal {
            at: Instant::now(),
            cause,
            retryable,
        }
    }

    fn error(&self) -> Failed {
        let cause = SharedCause(self.cause.clone());
        Failed::Store(if self.retryable {
            Error::unavailable(cause)
        } else {
            Error::backend(cause)
        })
    }
}

/// One connection failure, told to every caller it answers.
#[derive(Debug)]
struct SharedCause(Arc<dyn std::error::Error + Send + Sync>);

impl std::fmt::Display for SharedCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for SharedCause {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Runs `serving` on a thread with a runtime of its own. The session is
/// shared by every runtime of the process (one per `#[tokio::test]`, one per
/// worker pool of an application that runs several), and a task spawned on
/// the first caller's runtime would die with that runtime, failing the
/// statements the others had queued ("its runtime shut down").
pub(super) fn spawn_serving(
    serving: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    std::thread::Builder::new()
        .name("leasehold-postgres".to_owned())
        .spawn(move || {
            runtime.block_on(serving);
            // Lets the closing connection say goodbye (`Link::close`),
            // without waiting on a dead one.
            runtime.shutdown_timeout(Duration::from_secs(1));
        })
}

/// The jobs the serving task has taken off its channel, renewals first.
///
/// A renewal must not wait behind acquisitions queued before it: attempts
/// whose callers left are still completed (and their grants given back) in
/// the background, so a burst of callers that give up can queue many
/// statements on a slow link, and the leases this process holds would
/// lapse behind them. Renewals are the only `Op::Execute` jobs.
pub(super) struct JobQueue {
    channel: mpsc::UnboundedReceiver<Job>,
    renewals: VecDeque<Job>,
    others: VecDeque<Job>,
}

impl JobQueue {
    pub(super) fn new(channel: mpsc::UnboundedReceiver<Job>) -> Self {
        JobQueue {
            channel,
            renewals: VecDeque::new(),
            others: VecDeque::new(),
        }
    }

    pub(super) fn sort_in(&mut self, job: Job) {
        match job.op {
            Op::Execute(_) => self.renewals.push_back(job),
            _ => self.others.push_back(job),
        }
    }

    /// The next job without waiting, renewals first.
    pub(super) fn try_next(&mut self) -> Option<Job> {
        while let Ok(job) = self.channel.try_recv() {
            self.sort_in(job);
        }
        self.renewals
            .pop_front()
            .or_else(|| self.others.pop_front())
    }

    /// The next job, renewals first; `None` once every sender is gone and
    /// nothing is left. Cancel safe: a job taken off the channel stays
    /// queued here until it is returned.
    pub(super) async fn next(&mut self) -> Option<Job> {
        loop {
            if let Some(job) = self.try_next() {
                return Some(job);
            }
            let job = self.channel.recv().await?;
            self.sort_in(job);
        }
    }
}

/// Serves jobs and forwards notifications until the last backend goes.
pub(super) async fn serve(
    jobs: mpsc::UnboundedReceiver<Job>,
    config: Arc<Config>,
    hub: WakeHub,
    gave_up: watch::Receiver<u64>,
) {
    // Waiters may have missed a release (a task restarted with waiters
    // registered).
    let missed = hub.watched_keys() > 0;
    let mut task = Task {
        jobs: JobQueue::new(jobs),
        config,
        hub,
        gave_up,
        link: None,
        refusal: None,
        after_refusal: refused_backoff(),
        after_drop: dropped_backoff(),
        retry_at: None,
        missed,
    };
    while task.step().await {}
}

/// Refusals back off from 1 s to 30 s: many processes must not keep a full
/// server busy refusing them.
fn refused_backoff() -> Backoff {
    Backoff::new(Duration::from_secs(1), Duration::from_secs(30))
}

/// A connection that dropped is made again sooner.
fn dropped_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(100), Duration::from_secs(5))
}

/// The serving task's state.
struct Task {
    jobs: JobQueue,
    config: Arc<Config>,
    hub: WakeHub,
    gave_up: watch::Receiver<u64>,
    link: Option<Link>,
    /// The last failed attempt, until one succeeds.
    refusal: Option<Refusal>,
    after_refusal: Backoff,
    after_drop: Backoff,
    /// When the task connects again by itself (if anyone waits).
    retry_at: Option<Instant>,
    /// Whether waiters may have missed a release while nobody listened.
    missed: bool,
}

impl Task {
    /// Serves one event; `false` once every backend is gone.
    async fn step(&mut self) -> bool {
        let Some(open) = self.link.as_mut() else {
            return self.step_unconnected().await;
        };
        // Notifications first: those a statement's run left in the buffer
        // go out before the next statement, however many are queued.
        let broken: Option<&str> = tokio::select! {
            biased;
            notification = open.listener.try_recv() => match notification {
                Ok(Some(notification)) => {
                    self.hub.deliver(notification.payload());
                    None
                }
                // The connection dropped (sqlx reconnects only when asked).
                Ok(None) => Some("the connection closed"),
                Err(e) => {
                    tracing::debug!(error = %e, "LISTEN connection failed");
                    Some("the connection failed")
                }
            },
            job = self.jobs.next() => match job {
                None => return false,
                Some(job) if job.reply.is_closed() => None,
                Some(job) => serve_job(open, job, &mut self.gave_up).await.err(),
            },
            () = sleep(self.config.idle_timeout) => {
                if self.hub.watched_keys() == 0 {
                    tracing::debug!("PostgreSQL connection idle; closing it");
                    if let Some(link) = self.link.take() {
                        link.close();
                    }
                }
                None
            }
        };
        if let Some(why) = broken {
            self.dropped(why);
        }
        true
    }

    /// Without a connection: waits for a job (or the time to reconnect for
    /// waiters), then connects.
    async fn step_unconnected(&mut self) -> bool {
        let job = tokio::select! {
            job = self.jobs.next() => match job {
                Some(job) if job.reply.is_closed() => return true,
                Some(job) => Some(job),
                None => return false,
            },
            () = sleep_until_some(self.retry_at) => {
                self.retry_at = None;
                if self.hub.watched_keys() == 0 {
                    return true;
                }
                None
            }
        };
        if let (Some(asked), Some(last)) = (&job, &self.refusal) {
            // While the task retries by itself, a waiter polls; a
            // statement gets the last answer if it is recent.
            let backing_off = matches!(asked.op, Op::Connect)
                && self.retry_at.is_some_and(|at| at > Instant::now());
            if backing_off || last.at.elapsed() < REFUSAL_MEMORY {
                let error = last.error();
                if let Some(job) = job {
                    let _ = job.reply.send(Err(error));
                }
                return true;
            }
        }
        match open_link(&self.config, self.refusal.is_some()).await {
            Ok(opened) => {
                let open = self.link.insert(opened);
                self.refusal = None;
                self.retry_at = None;
                (self.after_refusal, self.after_drop) = (refused_backoff(), dropped_backoff());
                if std::mem::take(&mut self.missed) {
                    let woken = self.hub.notify_all();
                    tracing::info!(woken, "LISTEN back in place; waking all waiters");
                }
                if let Some(job) = job {
                    if let Err(why) = serve_job(open, job, &mut self.gave_up).await {
                        self.dropped(why);
                    }
                }
            }
            Err(e) => {
                // The operations that asked get the error themselves; only
                // waiters, who do not, hear it here.
                if self.hub.watched_keys() > 0 {
                    tracing::warn!(error = %e, "cannot connect to PostgreSQL; waiters poll");
                } else {
                    tracing::trace!(error = %e, "cannot connect to PostgreSQL");
                }
                let last = Refusal::new(e);
                // Everyone asking now gets this answer: one attempt serves all.
                if let Some(job) = job {
                    let _ = job.reply.send(Err(last.error()));
                }
                while let Some(job) = self.jobs.try_next() {
                    let _ = job.reply.send(Err(last.error()));
                }
                self.refusal = Some(last);
                self.missed |= self.hub.watched_keys() > 0;
                self.retry_at = Some(Instant::now() + self.after_refusal.next_delay());
            }
        }
        true
    }

    /// The connection is gone: close it, and make a new one soon if anyone
    /// waits.
    fn dropped(&mut self, why: &str) {
        tracing::warn!(why, "PostgreSQL connection dropped; reconnecting");
        if let Some(link) = self.link.take() {
            link.close();
        }
        self.missed |= self.hub.watched_keys() > 0;
        self.retry_at = Some(Instant::now() + self.after_drop.next_delay());
    }
}

/// Runs one job on the open connection and answers it. `Err` says why the
/// connection is no longer usable.
async fn serve_job(
    open: &mut Link,
    mut job: Job,
    gave_up: &mut watch::Receiver<u64>,
) -> Result<(), &'static str> {
    gave_up.borrow_and_update();
    let started = Instant::now();
    // Its own caller gone: abandoned once the link's normal time is past.
    let own_patience = started + patience(open.round_trip);
    // Another caller gone: only once no healthy statement could still be
    // running (the migration's lock waits are longer; it has the bound).
    let healthy = match job.op {
        Op::Transaction(_) => STATEMENT_BOUND,
        _ => SESSION_LOCK_TIMEOUT + patience(open.round_trip),
    };
    let (mut abandoned, mut others_gave_up) = (false, false);
    let outcome = {
        let work = perform(&mut open.listener, job.op);
        tokio::pin!(work);
        loop {
            tokio::select! {
                biased;
                outcome = &mut work => break Some(outcome),
                () = job.reply.closed(), if !abandoned => abandoned = true,
                changed = gave_up.changed(), if !others_gave_up => {
                    // The sender lives in the session, which outlives this task.
                    others_gave_up = changed.is_ok();
                }
                () = sleep_until(own_patience), if abandoned => break None,
                () = sleep_until(started + healthy), if others_gave_up => break None,
                () = sleep_until(started + STATEMENT_BOUND) => break None,
            }
        }
    };
    let waited = started.elapsed();
    let Some(outcome) = outcome else {
        let _ = job.reply.send(Err(Failed::Store(Error::unavailable(format!(
            "PostgreSQL did not answer a statement within {waited:?}; reconnecting"
        )))));
        return Err("a statement did not answer");
    };
    let broken = matches!(&outcome, Err(e) if breaks_connection(e));
    if !broken {
        open.answered_in(waited);
    }
    let _ = job.reply.send(outcome.map_err(Failed::Sql));
    if broken {
        Err("a statement failed with the connection")
    } else {
        Ok(())
    }
}

/// How long a statement whose caller gave up may still run before the
/// connection is presumed dead, on a link whose round trip is `round_trip`.
fn patience(round_trip: Duration) -> Duration {
    MIN_PATIENCE + round_trip * 2
}

async fn perform(listener: &mut PgListener, op: Op) -> Result<Answer, sqlx::Error> {
    let conn: &mut PgConnection = listener.acquire().await?;
    match op {
        Op::Connect => Ok(Answer::Ready),
        Op::Rows(s) => {
            let params = Owned::borrowed(&s.params);
            exec::fetch_all(conn, Pooler::None, &s.sql, &params)
                .await
                .map(Answer::Rows)
        }
        Op::Execute(s) => {
            let params = Owned::borrowed(&s.params);
            exec::execute(conn, Pooler::None, &s.sql, &params)
                .await
                .map(Answer::Done)
        }
        Op::Transaction(statements) => {
            let mut tx = Connection::begin(conn).await?;
            (&mut *tx)
                .execute(&*format!(
                    "SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT}'"
                ))
                .await?;
            for s in &statements {
                let params = Owned::borrowed(&s.params);
                exec::execute(&mut tx, Pooler::None, &s.sql, &params).await?;
            }
            tx.commit().await?;
            Ok(Answer::Ready)
        }
    }
}

/// Whether `e` leaves the connection unusable (as opposed to a statement
/// the server refused on a healthy connection).
fn breaks_connection(e: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match e {
        E::Database(db) => db
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        E::Io(_)
        | E::Tls(_)
        | E::Protocol(_)
        | E::WorkerCrashed
        | E::PoolTimedOut
        | E::PoolClosed => true,
        _ => false,
    }
}

/// Opens the connection: `LISTEN` and the session's lock timeout in one
/// round trip. After a failed attempt (`retrying`) a direct attempt goes
/// first, so a server that refuses connections sees one per attempt, not
/// the pool's silent retries.
async fn open_link(config: &Config, retrying: bool) -> Result<Link, sqlx::Error> {
    let attempt = async {
        if retrying {
            PgConnection::connect_with(&config.connect)
                .await?
                .close()
                .await?;
        }
        let pool = PgPoolOptions::new()
            .max_connections(1)
            .min_connections(0)
            .idle_timeout(None)
            .max_lifetime(None)
            .acquire_timeout(config.acquire_timeout)
            .connect_lazy_with(config.connect.clone());
        // The pool retries a refused connection in silence until its
        // timeout: if the first try is slow, give it up and ask the server
        // directly why (one connection attempt at a time, never two).
        let mut listener = match timeout(SUSPECT_AFTER, PgListener::connect_with(&pool)).await {
            Ok(listener) => listener?,
            Err(_) => {
                match timeout(PROBE_TIMEOUT, PgConnection::connect_with(&config.connect)).await {
                    Ok(Err(e)) => return Err(e),
                    Ok(Ok(probe)) => probe.close().await?,
                    Err(_) => {}
                }
                PgListener::connect_with(&pool).await?
            }
        };
        // sqlx would reconnect inside `try_recv`, where a cancelled
        // reconnect loses its buffer; the task reconnects itself instead.
        listener.eager_reconnect(false);
        listener.ignore_pool_close_event(true);
        // This round trip is the link's first estimate of its own.
        let sent = Instant::now();
        listener
            .execute(&*format!(
                "LISTEN \"{CHANNEL}\"; SET lock_timeout = '{}ms'",
                SESSION_LOCK_TIMEOUT.as_millis()
            ))
            .await?;
        Ok(Link {
            listener,
            pool,
            round_trip: sent.elapsed(),
        })
    };
    // The whole attempt, probe included, within the acquire timeout: a
    // server that accepts and never answers is `Unavailable` within it.
    match timeout(config.acquire_timeout, attempt).await {
        Ok(outcome) => outcome,
        Err(_) => Err(sqlx::Error::PoolTimedOut),
    }
}

/// Sleeps until `deadline`; forever without one.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(d) => sleep_until(d).await,
        None => std::future::pending().await,
    }
}
