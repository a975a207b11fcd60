//! The users API over real HTTP: 50 concurrent creates under the collection
//! lock, in reject and in wait mode, and the race without the lock.

mod common;

use std::collections::HashSet;
use std::time::Duration;

use leasehold::http::Mode;
use reqwest::StatusCode;
use serde_json::{json, Value};
use users_api::{app, AppState, LockSettings, Users, USERS_LOCK};

struct Api {
    base: String,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
    _server: tokio::task::JoinHandle<()>,
}

async fn start(mode: Option<Mode>, step_delay: Duration) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let store = common::sqlite_store(&dir).await;
    let users = Users::open(&dir.path().join("users.db")).await.unwrap();
    let lock = mode.map(|mode| LockSettings {
        ttl: Duration::from_secs(10),
        mode,
    });
    let router = app(AppState { users, step_delay }, store.locks(), lock).unwrap();
    let (base, server) = common::serve(router).await;
    Api {
        base,
        client: common::client(),
        _dir: dir,
        _server: server,
    }
}

impl Api {
    /// Sends every create at once; returns the responses in input order.
    async fn create_all(&self, names: &[String]) -> Vec<reqwest::Response> {
        let sends = names.iter().map(|name| {
            self.client
                .post(format!("{}/users", self.base))
                .json(&json!({ "username": name }))
                .send()
        });
        futures_util::future::join_all(sends)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect()
    }

    /// Checks the invariants the lock protects and returns the usernames:
    /// no duplicates, counter = number of users, tokens increase with ids.
    async fn invariants(&self) -> Vec<String> {
        let users: Vec<Value> = self.get("/users").await;
        let stats: Value = self.get("/stats").await;
        let names: Vec<String> = users
            .iter()
            .map(|u| u["username"].as_str().unwrap().to_owned())
            .collect();
        let unique: HashSet<&String> = names.iter().collect();
        assert_eq!(unique.len(), names.len(), "duplicate usernames: {names:?}");
        assert_eq!(stats["counter"]["value"], names.len(), "{stats}");
        let tokens: Vec<u64> = users
            .iter()
            .map(|u| u["created_token"].as_u64().unwrap())
            .collect();
        assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
        names
    }

    async fn get<T: serde::de::DeserializeOwned>(&self, path: &str) -> T {
        let response = self.client.get(format!("{}{path}", self.base)).send().await;
        response
            .unwrap()
            .error_for_status()
            .unwrap()
            .json()
            .await
            .unwrap()
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reject_mode_answers_409_with_retry_after_and_keeps_invariants() {
    // Each create holds the lock for at least 200 ms, so 50 requests sent at
    // once overlap.
    let api = start(Some(Mode::Reject), Duration::from_millis(200)).await;
    let names = names(50);
    let responses = api.create_all(&names).await;
    let mut created = Vec::new();
    let mut rejected = 0;
    for (name, response) in names.iter().zip(responses) {
        match response.status() {
            StatusCode::CREATED => created.push(name.clone()),
            StatusCode::CONFLICT => {
                common::locked(response, USERS_LOCK).await;
                rejected += 1;
            }
            other => panic!("unexpected {other}: {}", response.text().await.unwrap()),
        }
    }
    assert!(
        !created.is_empty() && rejected > 0,
        "{} created, {rejected} rejected",
        created.len()
    );
    let mut stored = api.invariants().await;
    stored.sort();
    created.sort();
    assert_eq!(stored, created);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_mode_lets_all_50_through_in_turn() {
    let api = start(
        Some(Mode::Wait(Duration::from_secs(50))),
        Duration::from_millis(10),
    )
    .await;
    let names = names(50);
    for response in api.create_all(&names).await {
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    assert_eq!(api.invariants().await.len(), 50);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wait_mode_creates_a_contested_username_once() {
    let api = start(
        Some(Mode::Wait(Duration::from_secs(50))),
        Duration::from_millis(20),
    )
    .await;
    let same = vec!["ada".to_owned(); 20];
    let mut created = 0;
    for response in api.create_all(&same).await {
        if response.status() == StatusCode::CREATED {
            created += 1;
        } else {
            let doc = common::problem(response, StatusCode::CONFLICT).await;
            assert!(
                doc["type"].as_str().unwrap().ends_with("username-taken"),
                "{doc}"
            );
        }
    }
    assert_eq!(created, 1);
    assert_eq!(api.invariants().await, ["ada"]);
}

/// The hand-written pattern without a lock: the check-then-insert race the
/// layer prevents really happens here, so the invariant checks above can
/// fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_lock_the_check_then_insert_races() {
    let api = start(None, Duration::from_millis(300)).await;
    let same = vec!["ada".to_owned(); 20];
    let created = api
        .create_all(&same)
        .await
        .iter()
        .filter(|r| r.status() == StatusCode::CREATED)
        .count();
    let users: Vec<Value> = api.get("/users").await;
    assert!(created > 1, "{created} creates of one username succeeded");
    assert_eq!(users.len(), created);
}
