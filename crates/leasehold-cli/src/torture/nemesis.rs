//! The seeded nemesis: one fault at a time, cycling through the enabled
//! kinds in a shuffled order, so every kind is injected in any run longer
//! than a few ttls. A kind that has not landed yet goes first in each
//! cycle, and once more right after a miss, so that a short run rarely ends
//! inconclusive. Kills and pauses are aimed at a process that holds a
//! lease right now (found through `inspect`, or a semaphore's holders, and
//! the holder label), since a fault on an idle process proves nothing;
//! after a miss, at a hold that has lasted a while (`Nemesis::aim`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use leasehold::Locks;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::Rng;
use tokio::time::sleep;

use super::clock::mono_ns;
use super::fleet::Fleet;
use super::history::{Fault, FaultKind};
use super::primitive::Lock;
use super::proxy::Control;
use crate::exit::CliError;

/// The variable that hands the restart command the run's lock keys,
/// space-separated.
const KEYS_ENV: &str = "LEASEHOLD_TORTURE_KEYS";

/// The variable that hands the restart command the hosts the current
/// holders talk to: one entry per holder, space-separated, each the
/// comma-separated hosts of that worker's URL (one host with
/// `--pin-hosts`), so a command can cut off the member a holder is
/// pinned to.
const HOLDER_HOSTS_ENV: &str = "LEASEHOLD_TORTURE_HOLDER_HOSTS";

/// The fault families `--faults` can enable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Family {
    /// SIGKILL a lease holder, then start a new worker in its place
    Kill,
    /// SIGSTOP a lease holder for 1.5–2.5 ttl (of the ttl the store enforces, if longer), then SIGCONT
    Pause,
    /// Latency, stalls and connection resets between workers and store
    Proxy,
    /// Run --restart-cmd (restart the store, or fail over its primary)
    Restart,
}

impl Family {
    /// As `--faults` names it; fault kinds are named `FAMILY[-variant]`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Kill => "kill",
            Family::Pause => "pause",
            Family::Proxy => "proxy",
            Family::Restart => "restart",
        }
    }
}

pub struct Nemesis<'a> {
    pub fleet: &'a mut Fleet,
    /// A direct connection (not through the proxy) for finding holders.
    pub locks: &'a Locks,
    pub keys: &'a [String],
    /// The lock under test: how holders are found.
    pub lock: Lock,
    pub proxy: Option<Arc<Control>>,
    pub restart_cmd: Option<String>,
    /// Workers are pinned to hosts (`--pin-hosts`): a restart waits for a
    /// long hold of a worker pinned to one host (`long_hold_hosts`).
    pub pinned: bool,
    pub families: Vec<Family>,
    pub rng: StdRng,
    pub ttl: Duration,
    /// How long the store keeps a lease it was asked to keep for `ttl`: the
    /// ttl itself, or the longer one a store enforces (etcd: whole
    /// seconds). A pause must outlast it to cost the holder its lease.
    pub lease: Duration,
    /// How long a takeover after a kill may take (`checker::takeover_bound`):
    /// the next fault waits for it, so that a store restart does not
    /// blur the takeover being measured.
    pub takeover: Duration,
    /// CLOCK_MONOTONIC ns after which no new fault starts.
    pub end: u64,
}

/// Whom a kill or pause is aimed at.
struct Target {
    worker: u32,
    key: String,
    token: u64,
}

impl Nemesis<'_> {
    pub async fn run(mut self) -> Result<Vec<Fault>, CliError> {
        let mut faults = Vec::new();
        if self.families.is_empty() {
            return Ok(faults);
        }
        // Warm-up: let the workers connect and take the first leases.
        sleep(self.ttl).await;
        let mut order = Vec::new();
        // Families that have landed at least once, and whether the family
        // about to run is a retry of a miss.
        let mut landed = Vec::new();
        let mut retrying = false;
        // Proxy faults take turns too, from a seeded starting point.
        let mut proxy_turn = self.rng.gen_range(0..3usize);
        // Leave room for the longest step (a pause of up to 2.5 leases).
        while mono_ns() + ((self.lease * 3).as_nanos() as u64) < self.end {
            if order.is_empty() {
                order = self.families.clone();
                order.shuffle(&mut self.rng);
                order_unlanded_first(&mut order, &landed);
            }
            let family = order.pop().expect("refilled above");
            let fault = match family {
                Family::Kill => self.kill().await?,
                Family::Pause => self.pause().await?,
                Family::Proxy => {
                    proxy_turn += 1;
                    self.proxy_fault(proxy_turn % 3).await
                }
                Family::Restart => self.restart().await,
            };
            // Proxy faults are judged by the checker afterwards; the others
            // know now whether they hit. A family that has never landed and
            // just missed goes again at once (one retry in a row), so that
            // a short run does not end with a requested kind unplayed.
            let hit = family == Family::Proxy || fault.as_ref().is_some_and(|f| f.hit);
            if hit && !landed.contains(&family) {
                landed.push(family);
            }
            if !hit && !landed.contains(&family) && !retrying {
                order.push(family);
                retrying = true;
            } else {
                retrying = false;
            }
            faults.extend(fault);
            sleep(self.ttl.mul_f64(self.rng.gen_range(0.5..1.0))).await;
        }
        if let Some(p) = &self.proxy {
            p.set_latency(Duration::ZERO);
            p.set_stalled(false);
        }
        Ok(faults)
    }

    /// A worker holding a lease right now, trying for up to about a ttl.
    async fn find_holder(&mut self) -> Result<Option<Target>, CliError> {
        let deadline = mono_ns() + self.ttl.as_nanos() as u64;
        while mono_ns() < deadline {
            let key = &self.keys[self.rng.gen_range(0..self.keys.len())];
            // The store may be restarting (our own fault): ask again.
            if let Ok(holders) = self.lock.holders(self.locks, key).await {
                let mut targets: Vec<Target> = holders
                    .into_iter()
                    .filter_map(|h| self.target(key, &h.label, h.token))
                    .collect();
                if !targets.is_empty() {
                    // A mutex has one holder: draw nothing, so its seeded
                    // schedules stay as they were.
                    let i = match targets.len() {
                        1 => 0,
                        n => self.rng.gen_range(0..n),
                    };
                    return Ok(Some(targets.swap_remove(i)));
                }
            }
            sleep(Duration::from_millis(3)).await;
        }
        Ok(None)
    }

    /// Where the next kill or pause aims: any holder at the first try, a
    /// long hold after a miss. On a slow store (a MongoDB server late in a
    /// long test run answered a holder listing in tens of milliseconds)
    /// the short holds, most of them, ended between the listing and the
    /// signal, and every try of a short run missed.
    async fn aim(&mut self, attempt: u32) -> Result<Option<Target>, CliError> {
        if attempt == 0 {
            self.find_holder().await
        } else {
            self.find_long_holder().await
        }
    }

    /// A worker in one of the long holds (one in ten lasts 1.5–3 ttls, the
    /// rest a few hundredths of one): a lease still held a tenth of a ttl
    /// after the nemesis first saw it. Looks for up to 3 leases, never
    /// past the end of the run.
    async fn find_long_holder(&mut self) -> Result<Option<Target>, CliError> {
        let deadline = (mono_ns() + (self.lease * 3).as_nanos() as u64).min(self.end);
        let long = (self.ttl / 10).as_nanos() as u64;
        let mut first_seen: HashMap<(&str, u64), u64> = HashMap::new();
        let keys = self.keys;
        while mono_ns() < deadline {
            for key in keys {
                // The store may be restarting (our own fault): ask again.
                let Ok(holders) = self.lock.holders(self.locks, key).await else {
                    continue;
                };
                let now = mono_ns();
                for target in holders
                    .into_iter()
                    .filter_map(|h| self.target(key, &h.label, h.token))
                {
                    let since = *first_seen
                        .entry((key.as_str(), target.token))
                        .or_insert(now);
                    if now - since >= long {
                        return Ok(Some(target));
                    }
                }
            }
            sleep(Duration::from_millis(3)).await;
        }
        Ok(None)
    }

    /// The worker holding `key` with `token`, from its holder label; `None`
    /// for a holder that is no worker of this run.
    fn target(&self, key: &str, label: &str, token: u64) -> Option<Target> {
        let worker = parse_pid(label).and_then(|pid| self.fleet.by_pid(pid))?;
        Some(Target {
            worker,
            key: key.to_owned(),
            token,
        })
    }

    /// Whether `target` still holds its lease: run right after a signal, it
    /// tells whether the signal landed inside the lease.
    async fn still_holds(&self, target: &Target) -> Result<bool, CliError> {
        Ok(match self.lock.holders(self.locks, &target.key).await {
            Ok(holders) => holders.iter().any(|h| h.token == target.token),
            Err(e) if e.is_retryable() => false,
            Err(e) => return Err(e.into()),
        })
    }

    async fn kill(&mut self) -> Result<Option<Fault>, CliError> {
        // The holder is stopped first and killed only if it still holds
        // then: a kill that lands after the release proves nothing and
        // cannot be undone, and short holds (a semaphore's, in a short run)
        // made every kill of a run miss. A miss is let go and aimed again,
        // as a pause is.
        for attempt in 0..5 {
            let Some(target) = self.aim(attempt).await? else {
                continue;
            };
            self.fleet.signal(target.worker, Signal::SIGSTOP);
            if !self.still_holds(&target).await? {
                self.fleet.signal(target.worker, Signal::SIGCONT);
                continue;
            }
            let start = mono_ns();
            self.fleet.kill_and_respawn(target.worker).await?;
            // Let the takeover happen before the next fault blurs it.
            sleep(self.takeover).await;
            return Ok(Some(aimed(
                FaultKind::Kill,
                start,
                start,
                true,
                target,
                format!("{attempt} missed attempts first"),
            )));
        }
        Ok(None)
    }

    async fn pause(&mut self) -> Result<Option<Fault>, CliError> {
        // A pause that lands after the holder released is undone at once
        // and aimed again: only a pause inside a lease tests fencing.
        for attempt in 0..5 {
            let Some(target) = self.aim(attempt).await? else {
                continue;
            };
            self.fleet.signal(target.worker, Signal::SIGSTOP);
            let start = mono_ns();
            if !self.still_holds(&target).await? {
                self.fleet.signal(target.worker, Signal::SIGCONT);
                continue;
            }
            let length = self.lease.mul_f64(self.rng.gen_range(1.5..2.5));
            sleep(length).await;
            self.fleet.signal(target.worker, Signal::SIGCONT);
            let detail = format!("{} ms; {attempt} missed attempts first", length.as_millis());
            return Ok(Some(aimed(
                FaultKind::Pause,
                start,
                mono_ns(),
                true,
                target,
                detail,
            )));
        }
        Ok(None)
    }

    async fn proxy_fault(&mut self, turn: usize) -> Option<Fault> {
        let proxy = self.proxy.clone()?;
        let start = mono_ns();
        let (kind, detail) = match turn {
            0 => {
                let latency = self.ttl.mul_f64(self.rng.gen_range(0.05..0.2));
                proxy.set_latency(latency);
                sleep(self.ttl * 2).await;
                proxy.set_latency(Duration::ZERO);
                let detail = format!("+{} ms per chunk for 2 ttl", latency.as_millis());
                (FaultKind::ProxyLatency, detail)
            }
            1 => {
                let length = self.ttl.mul_f64(self.rng.gen_range(1.2..2.0));
                proxy.set_stalled(true);
                sleep(length).await;
                proxy.set_stalled(false);
                (FaultKind::ProxyStall, format!("{} ms", length.as_millis()))
            }
            _ => {
                proxy.reset_all();
                (FaultKind::ProxyReset, "every open connection".to_owned())
            }
        };
        Some(Fault {
            kind,
            start,
            end: mono_ns(),
            // Whether a holder's request went through it shows in the
            // history only: the checker decides (`mark_proxy_hits`).
            hit: false,
            worker: None,
            key: None,
            token: None,
            detail,
        })
    }

    /// The hosts of every worker holding a lease now (on any key; no
    /// random draw, so the seeded schedule is the same with or without
    /// it). The store may be down: then none.
    async fn holder_hosts(&self) -> Vec<(u64, String)> {
        let mut hosts = Vec::new();
        for key in self.keys {
            let asked = tokio::time::timeout(self.ttl, self.lock.holders(self.locks, key));
            let Ok(Ok(holders)) = asked.await else {
                continue;
            };
            for h in holders {
                if let Some(worker) = parse_pid(&h.label).and_then(|pid| self.fleet.by_pid(pid)) {
                    hosts.push((h.token, self.fleet.hosts(worker)));
                }
            }
        }
        hosts
    }

    /// Waits (up to 3 leases) for a holder that has held for half a lease
    /// already, one of the holds that outlive a ttl on renewals (most last
    /// a few percent of it), so that a restart lands inside a lease that
    /// must outlive it: whether the lease survives (with persistence), is
    /// reported lost (without), or `lost()` fires in time is then tested.
    /// A restart aimed at a short hold often proved nothing: the hold ended
    /// (its release failing) while the store was down. With workers pinned
    /// to hosts, only a holder pinned to one host counts, and the hosts
    /// returned are that holder's alone; otherwise every holder's. At the
    /// end of the wait, the holders' hosts as they are then.
    async fn long_hold_hosts(&self) -> Vec<String> {
        let deadline = mono_ns() + (self.lease * 3).as_nanos() as u64;
        let mut seen: Vec<(u64, u64)> = Vec::new();
        loop {
            let now_held = self.holder_hosts().await;
            let now = mono_ns();
            let long = now_held.iter().find(|(token, hosts)| {
                (!self.pinned || !hosts.contains(','))
                    && seen.iter().any(|(t, since)| {
                        t == token && now - since >= (self.lease / 2).as_nanos() as u64
                    })
            });
            if let Some((_, hosts)) = long {
                if self.pinned {
                    return vec![hosts.clone()];
                }
                return now_held.into_iter().map(|(_, h)| h).collect();
            }
            if now >= deadline {
                return now_held.into_iter().map(|(_, h)| h).collect();
            }
            seen.retain(|(t, _)| now_held.iter().any(|(token, _)| token == t));
            for (token, _) in &now_held {
                if !seen.iter().any(|(t, _)| t == token) {
                    seen.push((*token, now));
                }
            }
            sleep(Duration::from_millis(20)).await;
        }
    }

    async fn restart(&mut self) -> Option<Fault> {
        let cmd = self.restart_cmd.clone()?;
        let holder_hosts = self.long_hold_hosts().await.join(" ");
        let start = mono_ns();
        let status = tokio::time::timeout(
            Duration::from_secs(60),
            tokio::process::Command::new("sh")
                .args(["-c", &cmd])
                // The run's keys, so a command can aim at the server that
                // holds them (a cluster's failover of that slot's primary).
                .env(KEYS_ENV, self.keys.join(" "))
                .env(HOLDER_HOSTS_ENV, &holder_hosts)
                // Its output is copied to stderr: stdout carries the
                // report (`--json` must stay one object).
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .output(),
        )
        .await;
        let (hit, detail) = match status {
            Ok(Ok(out)) => {
                let said = String::from_utf8_lossy(&out.stdout);
                eprint!("{said}");
                // Its last line says what it did (which member it cut off).
                let last = said.lines().rfind(|l| !l.trim().is_empty());
                let s = out.status;
                let detail = match last {
                    Some(line) => format!("{cmd:?}: {s}: {}", line.trim()),
                    None => format!("{cmd:?}: {s}"),
                };
                (s.success(), detail)
            }
            Ok(Err(e)) => (false, format!("{cmd:?}: {e}")),
            Err(_) => (false, format!("{cmd:?}: still running after 60 s")),
        };
        let end = mono_ns();
        sleep(self.ttl).await;
        Some(Fault {
            kind: FaultKind::Restart,
            start,
            end,
            hit,
            worker: None,
            key: None,
            token: None,
            detail,
        })
    }
}

/// Reorders a freshly shuffled `order` (run from its end) so that the
/// families that have not landed yet run first, each group keeping its
/// shuffled order.
fn order_unlanded_first(order: &mut [Family], landed: &[Family]) {
    order.sort_by_key(|f| !landed.contains(f));
}

fn aimed(kind: FaultKind, start: u64, end: u64, hit: bool, t: Target, detail: String) -> Fault {
    Fault {
        kind,
        start,
        end,
        hit,
        worker: Some(t.worker),
        key: Some(t.key),
        token: Some(t.token),
        detail,
    }
}

/// The pid in a worker's holder label `torture-w{id}:{pid}`.
fn parse_pid(label: &str) -> Option<u32> {
    label
        .strip_prefix("torture-w")?
        .split_once(':')?
        .1
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::Family;

    #[test]
    fn families_that_never_landed_run_first() {
        // The order runs from its end.
        let mut order = vec![Family::Pause, Family::Kill, Family::Proxy, Family::Restart];
        super::order_unlanded_first(&mut order, &[Family::Kill, Family::Restart]);
        assert_eq!(
            order,
            vec![Family::Kill, Family::Restart, Family::Pause, Family::Proxy]
        );
        let mut all_landed = vec![Family::Pause, Family::Kill];
        super::order_unlanded_first(&mut all_landed, &[Family::Kill, Family::Pause]);
        assert_eq!(all_landed, vec![Family::Pause, Family::Kill]);
    }

    #[test]
    fn holder_labels() {
        assert_eq!(super::parse_pid("torture-w3:4242"), Some(4242));
        assert_eq!(super::parse_pid("host:4242"), None);
    }
}
