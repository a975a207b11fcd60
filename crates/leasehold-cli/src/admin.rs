//! `status`, `list` and `release --force`: inspecting and breaking locks.

use clap::Args;
use leasehold::{LeaseInfo, Locks, PermitInfo, RwSide};
use serde::Serialize;

use crate::exit::CliError;

/// Arguments of `status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Lock key
    pub key: String,
    /// Print {"key","kind","held","holder","token","expires_in_ms"}: one
    /// key is one lock; "kind" is "mutex", "reader-writer lock" or
    /// "semaphore" while something holds KEY, "held" whether anything does;
    /// "holder", "token" and "expires_in_ms" are a mutex holder's, and
    /// "permits" (each {"slot","holder","token","expires_in_ms"}) a
    /// semaphore's live permits, "rw" (each with "side": "read" or "write")
    /// a reader-writer lock's live holders
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `list`.
#[derive(Debug, Args)]
pub struct ListArgs {
    /// Only keys starting with this
    #[arg(long, default_value = "")]
    pub prefix: String,
    /// Print a JSON array of status objects (a semaphore permit's has
    /// "slot", a reader-writer lock holder's "slot" and "side")
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `release`.
#[derive(Debug, Args)]
pub struct ReleaseArgs {
    /// Lock key
    pub key: String,
    /// Required: breaking somebody else's lock is an admin action. The
    /// fencing token moves on, so the evicted holders' writes are refused by
    /// fenced resources. One key is one lock: it breaks whatever holds KEY,
    /// the mutex holder, or every --shared run and the writer of a
    /// reader-writer lock, or every permit of a semaphore; their `run`s
    /// lose KEY and stop their commands.
    #[arg(long)]
    pub force: bool,
}

/// One lock as `status --json` and `list --json` print it.
#[derive(Debug, Serialize)]
struct Status<'a> {
    key: &'a str,
    /// For a semaphore permit, its slot.
    #[serde(skip_serializing_if = "Option::is_none")]
    slot: Option<u32>,
    /// For a reader-writer lock's holder, "read" or "write".
    #[serde(skip_serializing_if = "Option::is_none")]
    side: Option<&'static str>,
    /// `status`: the key's kind, while something holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    held: bool,
    holder: Option<&'a str>,
    token: Option<u64>,
    expires_in_ms: Option<u128>,
    /// `status` of a semaphore key: its live permits.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    permits: Vec<Status<'a>>,
    /// `status` of a reader-writer lock key: its live readers and writer.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    rw: Vec<Status<'a>>,
}

impl<'a> Status<'a> {
    fn of_permit(permit: &'a PermitInfo) -> Self {
        Status {
            key: permit.key.as_str(),
            slot: Some(permit.slot),
            side: permit.rw.map(|side| match side {
                RwSide::Read => "read",
                RwSide::Write => "write",
            }),
            kind: None,
            held: true,
            holder: Some(permit.holder.as_str()),
            token: Some(permit.token),
            expires_in_ms: Some(permit.remaining.as_millis()),
            permits: Vec::new(),
            rw: Vec::new(),
        }
    }

    fn of(key: &'a str, info: Option<&'a LeaseInfo>) -> Self {
        Status {
            key,
            slot: None,
            side: None,
            permits: Vec::new(),
            rw: Vec::new(),
            kind: None,
            held: info.is_some(),
            holder: info.map(|i| i.holder.as_str()),
            token: info.map(|i| i.token),
            expires_in_ms: info.map(|i| i.remaining.as_millis()),
        }
    }

    fn line(&self) -> String {
        let what = match (self.side, self.slot) {
            (Some("write"), _) => format!("{} writer", self.key),
            (Some(_), Some(slot)) => format!("{} reader {slot}", self.key),
            (_, Some(slot)) => format!("{} permit {slot}", self.key),
            _ => self.key.to_owned(),
        };
        match (self.holder, self.token, self.expires_in_ms) {
            (Some(holder), Some(token), Some(ms)) => format!(
                "{what} held by {holder}, token {token}, expires in {:.1}s",
                ms as f64 / 1000.0
            ),
            _ => format!("{what} is free"),
        }
    }
}

fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).expect("status values always serialize")
}

pub async fn status(store: &str, args: StatusArgs) -> Result<u8, CliError> {
    leasehold::Key::new(args.key.as_str())?;
    let locks = Locks::open(store).await?;
    let info = locks.inspect(&args.key).await?;
    let permits = locks.semaphore(&args.key, 1)?.holders().await?;
    let rw = locks.rw_lock(&args.key)?.holders().await?;
    let mut status = Status::of(&args.key, info.as_ref());
    status.permits = permits.iter().map(Status::of_permit).collect();
    status.rw = rw.iter().map(Status::of_permit).collect();
    // One key is one lock, of one kind: the kind of what holds it.
    status.kind = if info.is_some() {
        Some("mutex")
    } else if !status.rw.is_empty() {
        Some("reader-writer lock")
    } else if !status.permits.is_empty() {
        Some("semaphore")
    } else {
        None
    };
    status.held = status.kind.is_some();
    if args.json {
        println!("{}", to_json(&status));
    } else {
        // The lock's line, then one per live permit of the semaphore KEY
        // and per holder of the reader-writer lock KEY.
        if info.is_some() || (status.permits.is_empty() && status.rw.is_empty()) {
            println!("{}", status.line());
        }
        for permit in status.permits.iter().chain(&status.rw) {
            println!("{}", permit.line());
        }
    }
    Ok(0)
}

pub async fn list(store: &str, args: ListArgs) -> Result<u8, CliError> {
    leasehold::validate_prefix(&args.prefix)?;
    let locks = Locks::open(store).await?;
    // One listing of every kind; permits and grants print as permits.
    let held = locks.list_holders(&args.prefix).await?;
    let permits: Vec<_> = held
        .iter()
        .filter_map(|i| i.clone().into_permit())
        .collect();
    let mut rows: Vec<Status> = held
        .iter()
        .filter(|i| i.slot.is_none())
        .map(|i| Status::of(i.key.as_str(), Some(i)))
        .chain(permits.iter().map(Status::of_permit))
        .collect();
    // By key; a lock before the permits of the semaphore of the same key,
    // and those before the reader-writer lock's holders.
    rows.sort_by_key(|r| (r.key, r.side.is_some(), r.slot));
    if args.json {
        println!("{}", to_json(&rows));
    } else if rows.is_empty() {
        println!("no locks held");
    } else {
        for row in rows {
            println!("{}", row.line());
        }
    }
    Ok(0)
}

pub async fn release(store: &str, args: ReleaseArgs) -> Result<u8, CliError> {
    leasehold::Key::new(args.key.as_str())?;
    if !args.force {
        return Err(CliError::usage(
            "release breaks whoever holds the lock; pass --force to confirm \
             (a holder releases by exiting `leasehold run`)",
        ));
    }
    let locks = Locks::open(store).await?;
    let before = locks.inspect(&args.key).await?;
    let others = locks.rw_lock(&args.key)?.holders().await?.len()
        + locks.semaphore(&args.key, 1)?.holders().await?.len();
    // One key is one lock: the store breaks whatever holds it.
    let broken = locks.force_release(&args.key).await?;
    match (broken, before) {
        (true, Some(info)) => println!(
            "broke the lock on {} (was held by {}, token {}); its token is now stale",
            args.key, info.holder, info.token
        ),
        (true, None) => println!(
            "broke the lock on {} ({others} holder(s)); their tokens are now stale",
            args.key
        ),
        (false, _) => println!("{} was not held", args.key),
    }
    Ok(0)
}
