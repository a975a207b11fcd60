//! `leasehold torture` on a private Redis Cluster (3 primaries, 3 replicas,
//! from scripts/services/redis-cluster.sh) whose restart step is
//! scripts/redis-cluster-failover.sh in `lagging` mode: the replica of the
//! primary that owns the lock's slot is cut off from replication, then takes
//! the slot over while the primary is frozen. With `min_replicas=1` no grant
//! the replica missed is ever trusted: the run passes with no token
//! regression, no duplicate and no stale write, and failovers did happen.
//!
//! Without `min_replicas` the same run can hand a token out twice (seen
//! while writing this test; docs/redis.md cites it), but whether a grant
//! falls into the window is a race, so that run is not asserted here.
//!
//! A private cluster because a failover disturbs every key of the slot
//! range: the shared one (`LEASEHOLD_TEST_REDIS_CLUSTER`) serves other
//! tests in parallel.

mod torture_common;

use std::path::Path;
use std::process::Command;

use torture_common::*;

const SCRIPTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts");

/// A cluster started by the service script, stopped when dropped.
struct PrivateCluster {
    url: String,
    /// The script's stop hooks: `leasehold_redis_stop PID DIR`, `rm -rf DIR`.
    hooks: Vec<String>,
}

impl PrivateCluster {
    /// `None` (skip) when the script cannot start one, unless servers are
    /// required.
    fn start() -> Option<Self> {
        let out = Command::new("bash")
            .args([
                "-c",
                r#"LEASEHOLD_STOP_HOOKS=(); source "$0/services/redis-cluster.sh" >&2
                   echo "${LEASEHOLD_TEST_REDIS_CLUSTER:-}"
                   printf '%s\n' "${LEASEHOLD_STOP_HOOKS[@]}""#,
                SCRIPTS,
            ])
            .env_remove("LEASEHOLD_TEST_REDIS_CLUSTER")
            .output()
            .expect("bash runs");
        let stdout = String::from_utf8_lossy(&out.stdout);
        let mut lines = stdout.lines();
        let url = lines.next().unwrap_or_default().to_owned();
        let cluster = PrivateCluster {
            url,
            hooks: lines.map(str::to_owned).collect(),
        };
        if cluster.url.is_empty() {
            let why = String::from_utf8_lossy(&out.stderr);
            if std::env::var("LEASEHOLD_REQUIRE_SERVERS").as_deref() == Ok("1") {
                panic!("no private Redis Cluster and LEASEHOLD_REQUIRE_SERVERS=1: {why}");
            }
            eprintln!("skipping: no private Redis Cluster: {why}");
            return None;
        }
        Some(cluster)
    }

    /// The first node, where the failover script asks about slots.
    fn seed(&self) -> &str {
        let hosts = self.url.trim_start_matches("redis+cluster://");
        hosts.split(',').next().unwrap()
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        for hook in &self.hooks {
            let words: Vec<&str> = hook.split_whitespace().collect();
            match words.as_slice() {
                ["leasehold_redis_stop", pid, _dir] => {
                    // A node the failover left frozen must die too.
                    for signal in ["-CONT", "-KILL"] {
                        let _ = Command::new("kill").args([signal, pid]).status();
                    }
                }
                ["rm", "-rf", dir] => {
                    let _ = std::fs::remove_dir_all(Path::new(dir));
                }
                _ => {}
            }
        }
    }
}

#[test]
fn with_min_replicas_lagging_failovers_never_regress_the_fence() {
    let Some(cluster) = PrivateCluster::start() else {
        return;
    };
    let failover = format!(
        "{SCRIPTS}/redis-cluster-failover.sh {} lagging",
        cluster.seed()
    );
    let run = torture(
        &format!("{}?min_replicas=1", cluster.url),
        &[
            "--duration",
            "15s",
            "--ttl",
            "500ms",
            "--seed",
            "7",
            "--faults",
            "restart",
            "--restart-cmd",
            &failover,
        ],
    );
    assert_eq!(run.code, 0, "{}", run.output);
    assert_every_promise_kept(&run);
    // Failovers happened (the script exits non-zero if the roles did not
    // swap), and leases were granted around them. Few: while a promoted
    // primary has no replica yet, every grant waits out its WAIT and is
    // refused (an unknown outcome for the worker), as it must be.
    assert!(run.n("/faults/restart/hit") >= 1, "{}", run.output);
    assert!(run.n("/acquisitions") > 0, "{}", run.output);
    // A worker that died on a store error would hide its grants.
    let notes = run.setup["notes"].to_string();
    assert!(!notes.contains("ended with"), "{}", run.output);
}
