//! The records a torture run keeps: worker events, resource decisions and
//! injected faults, each stamped with the shared monotonic clock.

use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use super::clock::mono_ns;

/// A step of a worker, as Jepsen-style histories record it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Acquire,
    Read,
    Write,
    Release,
    /// A renewal request of the guard's background task (logged by the
    /// worker's store wrapper, so every request is seen, whatever its fate).
    Renew,
    /// The guard's lost-lease signal fired.
    Lost,
}

/// Whether a step started, succeeded, was refused, or ended without a
/// known outcome (the request may or may not have taken effect).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Invoke,
    Ok,
    Fail,
    Unknown,
    Info,
}

/// One line of a worker's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Event {
    /// Monotonic nanoseconds.
    pub t: u64,
    pub worker: u32,
    pub pid: u32,
    pub op: Op,
    #[serde(rename = "type")]
    pub kind: Kind,
    pub key: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<i64>,
    /// The guard's `valid_until` on the monotonic clock, when the step had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Acquire `ok`: when the request that was granted was sent (an acquire
    /// that waited sends several; the store granted the last one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sent: Option<u64>,
    /// Acquire `ok` of a semaphore permit: its slot (the resource fences
    /// per slot, so the checker follows each slot as one lease).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u32>,
    /// Acquire `ok` of a read-write lock's read side: readers may overlap.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
}

/// An operation on the protected resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResourceOp {
    Read,
    Write,
    /// A read-write lock reader's read: fenced only by writers' tokens, so
    /// readers holding the lock together do not refuse each other.
    SharedRead,
}

impl ResourceOp {
    /// As the in-store log writes it.
    pub fn name(self) -> &'static str {
        match self {
            ResourceOp::Read => "read",
            ResourceOp::Write => "write",
            ResourceOp::SharedRead => "shared_read",
        }
    }
}

/// One decision of the protected resource, in the order it made them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Decision {
    pub seq: u64,
    pub t: u64,
    pub key: String,
    pub op: ResourceOp,
    pub token: u64,
    /// Read: the value returned. Write: the value written (or refused).
    pub value: i64,
    pub accepted: bool,
    /// The highest token the resource compared with: the highest it had
    /// accepted for the key before (for a shared read, from writers only).
    pub highest: u64,
    pub worker: u32,
}

/// The kinds of fault the nemesis injects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    Kill,
    Pause,
    ProxyLatency,
    ProxyStall,
    ProxyReset,
    Restart,
}

impl FaultKind {
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Pause => "pause",
            FaultKind::ProxyLatency => "proxy-latency",
            FaultKind::ProxyStall => "proxy-stall",
            FaultKind::ProxyReset => "proxy-reset",
            FaultKind::Restart => "restart",
        }
    }

    /// Whether requests sent while it lasts may reach the store only much
    /// later (held in the proxy, resent after a reset or a restart).
    pub fn delays_requests(self) -> bool {
        !matches!(self, FaultKind::Kill | FaultKind::Pause)
    }
}

/// One injected fault.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Fault {
    pub kind: FaultKind,
    pub start: u64,
    pub end: u64,
    /// Whether it landed where it was aimed (a pause or kill on a process
    /// that held a lease at that moment; a proxy fault that delayed or cut a
    /// holder's request, as the checker finds from the history; a restart
    /// command that exited 0).
    pub hit: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub detail: String,
}

/// A line of the merged history file (`--history`).
#[derive(Debug, Serialize)]
#[serde(tag = "source", rename_all = "snake_case")]
pub enum Record<'a> {
    Worker(&'a Event),
    Resource(&'a Decision),
    Nemesis(&'a Fault),
}

impl Record<'_> {
    fn t(&self) -> u64 {
        match self {
            Record::Worker(e) => e.t,
            Record::Resource(d) => d.t,
            Record::Nemesis(f) => f.start,
        }
    }
}

/// Reads a JSONL file of `T`. A torn last line (a worker killed mid-write)
/// is skipped; any other bad line is an error.
pub fn read_jsonl<T: for<'de> Deserialize<'de>>(path: &Path) -> std::io::Result<Vec<T>> {
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    let lines: Vec<String> = file.lines().collect::<Result<_, _>>()?;
    let mut out = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        match serde_json::from_str(line) {
            Ok(v) => out.push(v),
            Err(_) if i + 1 == lines.len() => {}
            Err(e) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("{}:{}: {e}", path.display(), i + 1),
                ))
            }
        }
    }
    Ok(out)
}

/// Writes everything, in time order, to one JSONL file.
pub fn write_merged(
    path: &Path,
    events: &[Event],
    decisions: &[Decision],
    faults: &[Fault],
) -> std::io::Result<()> {
    let mut records: Vec<Record<'_>> = events
        .iter()
        .map(Record::Worker)
        .chain(decisions.iter().map(Record::Resource))
        .chain(faults.iter().map(Record::Nemesis))
        .collect();
    records.sort_by_key(Record::t);
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for r in &records {
        serde_json::to_writer(&mut out, r)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Appends events to the history; shared with the lost-lease watcher and
/// the store wrapper.
#[derive(Debug, Clone)]
pub struct Log {
    file: Arc<Mutex<std::fs::File>>,
    worker: u32,
    pid: u32,
}

impl Log {
    /// Appends to the history file at `path` (created if missing) as
    /// worker `worker`, process `pid`.
    pub fn open(path: &Path, worker: u32, pid: u32) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Log {
            file: Arc::new(Mutex::new(file)),
            worker,
            pid,
        })
    }

    pub fn event(&self, op: Op, kind: Kind, key: &str) -> Event {
        Event {
            t: mono_ns(),
            worker: self.worker,
            pid: self.pid,
            op,
            kind,
            key: key.to_owned(),
            token: None,
            value: None,
            valid_until: None,
            error: None,
            sent: None,
            slot: None,
            shared: false,
        }
    }

    /// One `write` per line, so a SIGKILL tears at most the last line.
    pub fn put(&self, event: Event) -> std::io::Result<()> {
        let mut line = serde_json::to_vec(&event).expect("events serialize");
        line.push(b'\n');
        self.file
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .write_all(&line)
    }
}
