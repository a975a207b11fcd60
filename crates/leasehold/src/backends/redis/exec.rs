//! Running the scripts: one `EVALSHA` per call, or, with `min_replicas`,
//! the script and a `WAIT` in one pipeline on the key's primary.

use redis::Script;

use super::errors::{classify, unconfirmed};
use super::{AcquireAnswer, AcquireReply, RedisBackend};
use crate::backend::duration_to_millis;
use crate::error::Result;
use crate::key::Key;

impl RedisBackend {
    /// Acquires with `min_replicas` > 0: a grant that fewer replicas
    /// confirmed is not trusted, so it is released again (best effort: if
    /// that fails too, it expires with its ttl) and the call fails.
    pub(super) async fn acquire_confirmed(
        &self,
        key: &Key,
        keys: &[String],
        owner: &str,
        args: &[&str],
        replicas: u32,
    ) -> Result<Option<AcquireAnswer>> {
        let (AcquireReply(answer), confirmed): (AcquireReply, i64) = self
            .run_and_wait_on(&self.inner.scripts.acquire, keys, args, replicas)
            .await?;
        if confirmed >= i64::from(replicas) {
            return Ok(answer);
        }
        // A grant has a positive token (0 is busy, -1 another kind).
        let token = answer.map_or(0, |a| a.token);
        if token > 0 {
            // release.lua's arguments: the lease's prefix (held_prefix),
            // the channel and the key; a queue behind the grant gets the
            // key handed over.
            let args = [
                &format!("{owner}#{token}:"),
                &self.inner.ns.channel(),
                key.as_str(),
            ];
            let undone: Result<redis::Value> = self
                .run_and_wait_on(&self.inner.scripts.release, &self.queue_keys(key), &args, 0)
                .await
                .map(|(freed, _)| freed);
            if let Err(e) = undone {
                tracing::debug!(%key, error = %e, "could not release an unconfirmed grant; it expires with its ttl");
            }
        }
        Err(unconfirmed(confirmed, replicas))
    }

    /// Runs `script` on `key`'s lock and fence keys, confirmed by
    /// `min_replicas` replicas when that option is set.
    pub(super) async fn run<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        key: &Key,
        args: &[&str],
    ) -> Result<T> {
        self.run_on(script, &self.lock_keys(key), args).await
    }

    /// `key`'s lock and fence keys: the two keys of the mutex scripts that
    /// renew, release, force-release and read.
    pub(super) fn lock_keys(&self, key: &Key) -> [String; 2] {
        [self.inner.ns.lock(key), self.inner.ns.fence(key)]
    }

    /// The mutex's lock, fence and kind keys: what the permit scripts
    /// claim the key's kind on (claim_kind.lua).
    pub(super) fn acquire_keys(&self, key: &Key) -> [String; 3] {
        let ns = &self.inner.ns;
        [ns.lock(key), ns.fence(key), ns.kind(key)]
    }

    /// The keys of the mutex scripts that may hand the key to the head of
    /// its queue (acquire, release, leave): lock, fence and kind (a mutex
    /// request on a reader-writer lock or a semaphore is answered as such),
    /// the queue's order and its entries.
    pub(super) fn queue_keys(&self, key: &Key) -> [String; 5] {
        let ns = &self.inner.ns;
        [
            ns.lock(key),
            ns.fence(key),
            ns.kind(key),
            ns.queue(key),
            ns.waiters(key),
        ]
    }

    /// The last argument of every script: the idle window in ms, 0 to keep
    /// records forever. Those that grant, or renew a permit, read it
    /// (`idle.lua`); the others ignore it.
    fn idle_window_ms(&self) -> i64 {
        self.inner.options.idle_window.map_or(0, duration_to_millis)
    }

    /// Runs `script` on `keys` (keys of one hash tag), confirmed by
    /// `min_replicas` replicas when that option is set.
    pub(super) async fn run_on<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&str],
    ) -> Result<T> {
        let replicas = self.inner.options.min_replicas;
        if replicas == 0 {
            let mut call = script.prepare_invoke();
            for key in keys {
                call.key(key);
            }
            for arg in args {
                call.arg(*arg);
            }
            call.arg(self.idle_window_ms());
            return call.invoke_async(&mut self.conn()).await.map_err(classify);
        }
        let (answer, confirmed) = self.run_and_wait_on(script, keys, args, replicas).await?;
        if confirmed < i64::from(replicas) {
            return Err(unconfirmed(confirmed, replicas));
        }
        Ok(answer)
    }

    /// Runs `script` and `WAIT replicas timeout` in one pipeline: both go on
    /// the same connection to the key's primary, so the `WAIT` covers this
    /// call's writes (and any sent before them on that connection). The
    /// answer and how many replicas confirmed.
    pub(super) async fn run_and_wait_on<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[String],
        args: &[&str],
        replicas: u32,
    ) -> Result<(T, i64)> {
        let wait_ms = duration_to_millis(self.inner.options.response_timeout / 2).max(1);
        let mut call = redis::pipe();
        call.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .arg(self.idle_window_ms())
            .cmd("WAIT")
            .arg(replicas)
            .arg(wait_ms);
        match call.query_async(&mut self.conn()).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                // A node that forgot the script (restarted, or a replica
                // promoted since): load it there and try once more.
                script
                    .load_async(&mut self.conn())
                    .await
                    .map_err(classify)?;
                call.query_async(&mut self.conn()).await.map_err(classify)
            }
            other => other.map_err(classify),
        }
    }
}
