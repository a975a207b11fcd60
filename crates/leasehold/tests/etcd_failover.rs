//! A guard on a private 3-member etcd cluster while its leader is killed:
//! the guard keeps its lock (or, if the election outlasts its deadline,
//! says so with the lost-lease signal, and nobody else held the key
//! before that), and every token granted after the leader change is above
//! every token granted before it. The cluster is this test's own (etcd
//! members on free loopback ports, killed and stopped here), never the
//! shared one. Skipped without `etcd` on PATH unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`.
#![cfg(feature = "etcd")]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::backends::etcd::EtcdBackend;
use leasehold::etcd_client::Client;
use leasehold::{AcquireOptions, Locks};
use tokio::time::{sleep, Instant};

struct Member {
    child: Child,
    client_port: u16,
}

struct Cluster {
    members: Vec<Member>,
    _dir: tempfile::TempDir,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for m in &mut self.members {
            let _ = m.child.kill();
            let _ = m.child.wait();
        }
    }
}

fn free_ports(n: usize) -> Vec<u16> {
    let sockets: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free port"))
        .collect();
    sockets
        .iter()
        .map(|s| s.local_addr().unwrap().port())
        .collect()
}

/// Starts 3 members as scripts/services/etcd.sh does (50 ms heartbeat,
/// 500 ms election timeout), or `None` if etcd is not installed.
fn start_cluster() -> Option<Cluster> {
    let found = Command::new("etcd")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(
            std::env::var("LEASEHOLD_REQUIRE_SERVERS").as_deref() != Ok("1"),
            "etcd is not on PATH and LEASEHOLD_REQUIRE_SERVERS=1"
        );
        eprintln!("skipping: etcd is not on PATH");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let ports = free_ports(6);
    let initial: Vec<String> = (0..3)
        .map(|i| format!("m{i}=http://127.0.0.1:{}", ports[i + 3]))
        .collect();
    let initial = initial.join(",");
    let members = (0..3)
        .map(|i| {
            let (client, peer) = (ports[i], ports[i + 3]);
            let child = Command::new("etcd")
                .args(["--name", &format!("m{i}")])
                .args([
                    "--data-dir",
                    &dir.path().join(format!("m{i}")).to_string_lossy(),
                ])
                .args([
                    "--listen-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args([
                    "--advertise-client-urls",
                    &format!("http://127.0.0.1:{client}"),
                ])
                .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
                .args([
                    "--initial-advertise-peer-urls",
                    &format!("http://127.0.0.1:{peer}"),
                ])
                .args(["--initial-cluster", &initial])
                .args(["--initial-cluster-token", "leasehold-failover-test"])
                .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
                .args(["--unsafe-no-fsync", "--log-level", "error"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("etcd starts");
            Member {
                child,
                client_port: client,
            }
        })
        .collect();
    Some(Cluster { members, _dir: dir })
}

impl Cluster {
    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .members
            .iter()
            .map(|m| format!("127.0.0.1:{}", m.client_port))
            .collect();
        format!("etcd://{}", hosts.join(","))
    }

    /// The index of the member that says it is the leader.
    async fn leader(&self) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            let endpoint = format!("http://127.0.0.1:{}", m.client_port);
            let Ok(Ok(client)) =
                tokio::time::timeout(Duration::from_secs(2), Client::connect([endpoint], None))
                    .await
            else {
                continue;
            };
            let Ok(Ok(status)) =
                tokio::time::timeout(Duration::from_secs(2), client.maintenance_client().status())
                    .await
            else {
                continue;
            };
            let me = status.header().map(|h| h.member_id());
            if me == Some(status.leader()) {
                return Some(i);
            }
        }
        None
    }
}

/// Opens the store once the cluster has a leader (about 20 s at most).
async fn open(url: &str) -> Locks {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match EtcdBackend::connect(url).await {
            Ok(backend) => return Locks::new(backend),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("the private cluster never answered: {e}"),
        }
    }
}

/// Takes and gives back `other0` .. `other4` in turn; their tokens.
async fn others_tokens(locks: &Locks, opts: &AcquireOptions) -> Vec<u64> {
    let mut tokens = Vec::new();
    for i in 0..5 {
        let g = locks
            .acquire_with(&format!("other{i}"), opts)
            .await
            .unwrap();
        tokens.push(g.token());
        g.release().await.unwrap();
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_survives_a_leader_kill_and_tokens_keep_rising() {
    let Some(mut cluster) = start_cluster() else {
        return;
    };
    let url = cluster.url();
    let locks = open(&url).await;
    let rival = open(&url).await;
    let ttl = Duration::from_secs(2);
    let opts = AcquireOptions::new()
        .with_ttl(ttl)
        .with_wait(Duration::from_secs(20));

    // Tokens before the leader change, on the guard's key and others.
    let mut before = others_tokens(&locks, &opts).await;
    let guard = locks.acquire_with("held", &opts).await.unwrap();
    before.push(guard.token());
    let highest_before = *before.iter().max().unwrap();

    let leader = loop {
        if let Some(i) = cluster.leader().await {
            break i;
        }
        sleep(Duration::from_millis(100)).await;
    };
    let killed = &mut cluster.members[leader];
    killed.child.kill().unwrap();
    let _ = killed.child.wait();
    let killed_at = Instant::now();

    // For three ttls: while the guard holds, nobody else gets the key; if
    // it loses, it says so by its deadline.
    let try_once = AcquireOptions::new().with_ttl(ttl);
    let mut lost_at = None;
    while killed_at.elapsed() < ttl * 3 {
        let deadline = guard.valid_until();
        if guard.is_lost() {
            lost_at.get_or_insert(Instant::now());
        } else {
            assert!(
                Instant::now() <= deadline + Duration::from_millis(200),
                "the guard's deadline passed without the lost-lease signal"
            );
        }
        if lost_at.is_none() {
            if let Ok(g) = rival.acquire_with("held", &try_once).await {
                // Fine only if the guard had lost by its deadline already.
                assert!(
                    guard.is_lost(),
                    "a second holder (token {}) while the guard holds {}",
                    g.token(),
                    guard.token()
                );
                lost_at.get_or_insert(Instant::now());
            }
        }
        sleep(Duration::from_millis(100)).await;
    }

    // Tokens after the leader change are above every earlier one.
    let mut after = others_tokens(&locks, &opts).await;
    if lost_at.is_none() {
        assert!(guard.check().is_ok(), "the guard kept its lock");
        guard.release().await.unwrap();
    }
    let next = rival.acquire_with("held", &opts).await.unwrap();
    after.push(next.token());
    assert!(
        after.iter().all(|t| *t > highest_before),
        "tokens after the leader change {after:?} must be above {before:?}"
    );
    next.release().await.unwrap();
    eprintln!(
        "leader m{leader} killed; guard {}; tokens before {before:?}, after {after:?}",
        if lost_at.is_some() {
            "lost by its deadline"
        } else {
            "kept"
        }
    );
    locks.close().await;
    rival.close().await;
}
