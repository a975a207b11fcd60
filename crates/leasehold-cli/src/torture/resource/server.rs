//! The resource as a small TCP server on loopback, inside the harness
//! process (never paused or killed by the nemesis). One JSON line per
//! request and per answer; every decision goes to an in-memory log.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::{FencedResource, Operation, Reply};
use crate::torture::clock::mono_ns;
use crate::torture::history::{Decision, ResourceOp};

#[derive(Debug, Serialize, Deserialize)]
struct Request {
    op: ResourceOp,
    key: String,
    token: u64,
    #[serde(default)]
    value: i64,
    worker: u32,
}

#[derive(Default)]
struct Cell {
    value: i64,
    highest: u64,
    /// The highest token of a writer's operation (read or write): what a
    /// shared read is compared with.
    highest_writer: u64,
}

struct State {
    fencing: bool,
    cells: HashMap<String, Cell>,
    log: Vec<Decision>,
}

impl State {
    /// The one place the resource decides. With fencing off it accepts
    /// everything but still records the tokens, so the checker can show
    /// which accepted writes were stale.
    ///
    /// A shared read (a read-write lock's reader) is compared with writers'
    /// tokens only: readers overlap, and a reader granted before another
    /// reader is not stale for it. Any other operation is compared with
    /// every token seen, readers' included: a writer older than a reader
    /// that already read has lost its lease.
    fn decide(&mut self, req: &Request) -> Reply {
        let cell = self.cells.entry(req.key.clone()).or_default();
        let shared = req.op == ResourceOp::SharedRead;
        let highest = if shared {
            cell.highest_writer
        } else {
            cell.highest
        };
        let accepted = !self.fencing || req.token >= highest;
        if accepted {
            cell.highest = cell.highest.max(req.token);
            if !shared {
                cell.highest_writer = cell.highest_writer.max(req.token);
            }
            if req.op == ResourceOp::Write {
                cell.value = req.value;
            }
        }
        let value = match req.op {
            ResourceOp::Read | ResourceOp::SharedRead => cell.value,
            ResourceOp::Write => req.value,
        };
        self.log.push(Decision {
            seq: self.log.len() as u64,
            t: mono_ns(),
            key: req.key.clone(),
            op: req.op,
            token: req.token,
            value,
            accepted,
            highest,
            worker: req.worker,
        });
        Reply {
            accepted,
            value,
            highest,
        }
    }
}

/// The running server. Dropping it stops accepting connections.
pub struct Server {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Server {
    /// Listens on an ephemeral loopback port.
    pub async fn start(fencing: bool) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(Mutex::new(State {
            fencing,
            cells: HashMap::new(),
            log: Vec::new(),
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(serve(stream, shared.clone()));
            }
        });
        Ok(Server { addr, state, task })
    }

    /// Where workers connect (`tcp://` + this).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every decision so far, in order.
    pub fn decisions(&self) -> Vec<Decision> {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .log
            .clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(stream: TcpStream, state: Arc<Mutex<State>>) {
    let _ = stream.set_nodelay(true);
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        let Ok(req) = serde_json::from_str::<Request>(&line) else {
            return;
        };
        let reply = state.lock().unwrap_or_else(|p| p.into_inner()).decide(&req);
        let mut out = serde_json::to_vec(&reply).expect("replies serialize");
        out.push(b'\n');
        if write.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// A worker's connection to the server.
pub struct Client {
    lines: tokio::io::Lines<BufReader<tokio::net::tcp::OwnedReadHalf>>,
    write: tokio::net::tcp::OwnedWriteHalf,
    worker: u32,
}

impl Client {
    pub async fn connect(addr: &str, worker: u32) -> Result<Self> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let (read, write) = stream.into_split();
        Ok(Client {
            lines: BufReader::new(read).lines(),
            write,
            worker,
        })
    }

    async fn call(&mut self, operation: Operation<'_>) -> Result<Reply> {
        let req = Request {
            op: operation.op,
            key: operation.key.to_owned(),
            token: operation.token,
            value: operation.value,
            worker: self.worker,
        };
        let mut out = serde_json::to_vec(&req)?;
        out.push(b'\n');
        self.write.write_all(&out).await?;
        let Some(line) = self.lines.next_line().await? else {
            bail!("the resource server closed the connection");
        };
        serde_json::from_str(&line).context("bad reply from the resource server")
    }
}

impl FencedResource for Client {
    fn decide<'a>(&'a mut self, operation: Operation<'a>) -> BoxFuture<'a, Result<Reply>> {
        Box::pin(self.call(operation))
    }
}
