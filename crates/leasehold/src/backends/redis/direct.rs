//! The command connection to one server: a few plain connections, each
//! used by one call at a time, and the caller's own task writes the command
//! and reads the reply.
//!
//! Why not redis-rs's multiplexed connection: it sends every request over a
//! channel to a driver task and the reply back on a oneshot, so each call
//! crosses threads twice unless caller and driver happen to share one
//! (measured in docs/redis.md). Here the task that awaits the reply is the
//! one the socket's readiness wakes; a lone caller pays its round trip and
//! little else. Concurrent callers each take a connection of their own, up
//! to [`RedisOptions::with_max_connections`](super::RedisOptions::with_max_connections);
//! past that they queue for the next free one.
//!
//! Connections beyond the one in use most recently are closed once idle
//! for [`IDLE_TRIM`], so a burst of concurrency does not keep its extra
//! connections for good (a fleet of processes stays within the server's
//! `maxclients`; see docs/redis.md, "Connection budget").
//!
//! A connection goes back to the pool only after its reply was read in
//! full. A call that fails, times out or is dropped half-way drops its
//! connection, so no later call can read a reply that was meant for another.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use combine::parser::combinator::AnySendSyncPartialState;
use combine::stream::{Decoder, PointerOffset};
use redis::{Client, ConnectionAddr, ProtocolVersion, RedisError, RedisResult, Value};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio::sync::Semaphore;

/// How long an extra connection may stay idle before it is closed.
const IDLE_TRIM: Duration = Duration::from_secs(1);

/// A pool of plain connections to one server. Cheap to clone; clones share
/// the pool.
#[derive(Clone)]
pub struct DirectPool {
    inner: Arc<Pool>,
}

struct Pool {
    client: Client,
    /// Connections with no call on them, most recently used last.
    idle: Mutex<Vec<Wire>>,
    /// One permit per connection that may be open at once.
    slots: Semaphore,
    connect_timeout: Duration,
    response_timeout: Duration,
}

/// One connection and the parser state of its replies (bytes read past
/// one reply stay there for the next).
struct Wire {
    stream: Stream,
    decoder: Decoder<AnySendSyncPartialState, PointerOffset<[u8]>>,
    last_used: Instant,
}

enum Stream {
    Tcp(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
}

/// `$body` run on the socket inside `$stream` (bound to `$s`), whichever
/// transport it is: the one `match` over the transports, which the I/O
/// traits forward through.
macro_rules! on_socket {
    ($stream:expr, $s:ident => $body:expr) => {
        match $stream {
            Stream::Tcp($s) => $body,
            #[cfg(unix)]
            Stream::Unix($s) => $body,
        }
    };
}

impl DirectPool {
    /// A pool of at most `max` connections to `client`'s server; opens the
    /// first one now, so an unreachable server is reported at once.
    pub(super) async fn open(
        client: Client,
        max: usize,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> RedisResult<DirectPool> {
        let pool = DirectPool {
            inner: Arc::new(Pool {
                client,
                idle: Mutex::new(Vec::new()),
                slots: Semaphore::new(max),
                connect_timeout,
                response_timeout,
            }),
        };
        let first = pool.inner.connect().await?;
        pool.inner.put_back(first);
        Ok(pool)
    }

    /// The database the connections use.
    pub(super) fn db(&self) -> i64 {
        self.inner
            .client
            .get_connection_info()
            .redis_settings()
            .db()
    }

    /// Sends `packed` (`offset + count` commands) and returns the last
    /// `count` replies; the first `offset` (a transaction's `MULTI` and
    /// `QUEUED`) are read and dropped. The whole call is bounded by the
    /// response timeout.
    pub(super) async fn exchange(
        &self,
        packed: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        let pool = &self.inner;
        let _slot = pool
            .slots
            .acquire()
            .await
            .map_err(|_| io::Error::other("the redis connection pool was closed"))?;
        let call = async {
            let mut wire = match pool.take_idle() {
                Some(wire) => wire,
                None => pool.connect().await?,
            };
            let replies = wire.exchange(packed, offset, count).await?;
            Ok::<_, RedisError>((wire, replies))
        };
        let (wire, replies) = tokio::time::timeout(pool.response_timeout, call)
            .await
            .map_err(|_| timed_out("no reply from redis within the response timeout"))??;
        pool.put_back(wire);
        Ok(replies)
    }
}

impl Pool {
    /// An idle connection that still looks usable: one the server closed
    /// (a restart, an idle timeout) reads as end of stream and is dropped
    /// here instead of failing the call.
    fn take_idle(&self) -> Option<Wire> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(wire) = idle.pop() {
            if wire.stream.is_quiet() {
                return Some(wire);
            }
        }
        None
    }

    /// Returns `wire` to the pool and closes the other idle connections
    /// that nobody used for [`IDLE_TRIM`] (callers take the most recent
    /// first, so extra ones age out once concurrency drops).
    fn put_back(&self, mut wire: Wire) {
        wire.last_used = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        idle.retain(|w| w.last_used.elapsed() < IDLE_TRIM);
        idle.push(wire);
    }

    /// Opens a connection and sets it up as the URL asks (protocol,
    /// credentials, database).
    async fn connect(&self) -> RedisResult<Wire> {
        let info = self.client.get_connection_info();
        let open = async {
            let stream = match info.addr() {
                ConnectionAddr::Tcp(host, port) => {
                    let stream = TcpStream::connect((host.as_str(), *port)).await?;
                    // Each call is one small write awaited by its reply:
                    // Nagle's algorithm would only hold it back.
                    stream.set_nodelay(true)?;
                    Stream::Tcp(stream)
                }
                #[cfg(unix)]
                ConnectionAddr::Unix(path) => Stream::Unix(UnixStream::connect(path).await?),
                _ => {
                    return Err(RedisError::from((
                        redis::ErrorKind::InvalidClientConfig,
                        "this build connects to redis over TCP or a Unix socket only",
                    )))
                }
            };
            Ok::<_, RedisError>(stream)
        };
        let stream = tokio::time::timeout(self.connect_timeout, open)
            .await
            .map_err(|_| timed_out("could not connect to redis within the connect timeout"))??;
        let mut wire = Wire {
            stream,
            decoder: Decoder::new(),
            last_used: Instant::now(),
        };
        let settings = info.redis_settings();
        let mut setup = redis::pipe();
        if settings.protocol() == ProtocolVersion::RESP3 {
            setup.cmd("HELLO").arg(3);
            if let Some(password) = settings.password() {
                setup
                    .arg("AUTH")
                    .arg(settings.username().unwrap_or("default"))
                    .arg(password);
            }
        } else if let Some(password) = settings.password() {
            setup.cmd("AUTH");
            if let Some(user) = settings.username() {
                setup.arg(user);
            }
            setup.arg(password);
        }
        if settings.db() != 0 {
            setup.cmd("SELECT").arg(settings.db());
        }
        let steps = setup.cmd_iter().count();
        if steps > 0 {
            let replies = tokio::time::timeout(
                self.response_timeout,
                wire.exchange(&setup.get_packed_pipeline(), 0, steps),
            )
            .await
            .map_err(|_| timed_out("redis did not answer the connection setup in time"))??;
            // Refusals read as redis-rs's own connection setup reports
            // them: the first step carries the credentials (AUTH, or HELLO
            // with AUTH), the last one (if any) is the SELECT.
            let login = settings.password().is_some();
            let select = settings.db() != 0;
            for (step, reply) in replies.into_iter().enumerate() {
                reply.extract_error().map_err(|e| {
                    if step == 0 && login {
                        RedisError::from((
                            redis::ErrorKind::AuthenticationFailed,
                            "Password authentication failed",
                            e.to_string(),
                        ))
                    } else if step + 1 == steps && select {
                        RedisError::from((
                            redis::ServerErrorKind::ResponseError.into(),
                            "Redis server refused to switch database",
                            e.to_string(),
                        ))
                    } else {
                        e
                    }
                })?;
            }
        }
        Ok(wire)
    }
}

impl Wire {
    /// As [`DirectPool::exchange`], on this connection, unbounded.
    async fn exchange(
        &mut self,
        packed: &[u8],
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.stream.write_all(packed).await?;
        let mut replies = Vec::with_capacity(count);
        let mut aborted = None;
        let mut index = 0;
        while index < offset + count {
            let reply = redis::parse_redis_value_async(&mut self.decoder, &mut self.stream).await?;
            match reply {
                // RESP3 may put out-of-band data between replies; nothing
                // here subscribes or tracks, but it must not be taken for
                // a reply.
                Value::Push { .. } => continue,
                Value::ServerError(e) if index < offset => {
                    aborted.get_or_insert(e);
                }
                reply if index >= offset => replies.push(reply),
                _ => {}
            }
            index += 1;
        }
        // Every reply was read, so the connection is in step even when a
        // queued command of a transaction was refused.
        match aborted {
            Some(e) => Err(e.into()),
            None => Ok(replies),
        }
    }
}

impl Stream {
    /// True if nothing is waiting to be read: no end of stream, no error,
    /// no stray bytes (a connection in step has none between calls).
    fn is_quiet(&self) -> bool {
        let mut probe = [0u8; 1];
        let read = on_socket!(self, s => s.try_read(&mut probe));
        matches!(read, Err(e) if e.kind() == io::ErrorKind::WouldBlock)
    }
}

fn timed_out(what: &'static str) -> RedisError {
    io::Error::new(io::ErrorKind::TimedOut, what).into()
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        on_socket!(self.get_mut(), s => Pin::new(s).poll_read(cx, buf))
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        on_socket!(self.get_mut(), s => Pin::new(s).poll_write(cx, buf))
    }

    fn poll_flush(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        on_socket!(self.get_mut(), s => Pin::new(s).poll_flush(cx))
    }

    fn poll_shutdown(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        on_socket!(self.get_mut(), s => Pin::new(s).poll_shutdown(cx))
    }
}
