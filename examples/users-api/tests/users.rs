//! The users API over real HTTP: 50 concurrent creates under the collection
//! lock, in reject and in wait mode, and the race without the lock; on
//! SQLite (locks and data), and with locks and data on the MongoDB server in
//! `LEASEHOLD_TEST_MONGODB` (skipped when unset, unless
//! `LEASEHOLD_REQUIRE_SERVERS=1`).

mod common;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use leasehold::http::Mode;
use leasehold::Locks;
use reqwest::StatusCode;
use serde_json::{json, Value};
use users_api::db::CreateError;
use users_api::{app, AppState, LockSettings, MongoUsers, SqliteUsers, UserStore, USERS_LOCK};

struct Api {
    base: String,
    /// Whether the lock store may answer a try-once with a retryable 503:
    /// the MongoDB test server is SecantusDB, one Python process, and
    /// under a loaded CI machine 50 concurrent try-once acquisitions can
    /// outlast the core's one-second answer grace
    /// (`leasehold::STORE_ANSWER_GRACE`), which the layer then reports as
    /// the documented `store-unavailable` problem (seen in CI).
    may_shed: bool,
    client: reqwest::Client,
    _dir: tempfile::TempDir,
    _server: tokio::task::JoinHandle<()>,
}

/// The app with locks and data on SQLite files in a fresh directory.
async fn start(mode: Option<Mode>, step_delay: Duration) -> Api {
    let dir = tempfile::tempdir().unwrap();
    let locks = common::locks(&common::sqlite_store(&dir).await);
    let users = SqliteUsers::open(&dir.path().join("users.db"))
        .await
        .unwrap();
    start_with(dir, locks, Arc::new(users), mode, step_delay).await
}

/// The app with locks and data in the database `url` names, as
/// `--store URL --data URL` would run it.
async fn start_mongodb(url: &str, mode: Option<Mode>, step_delay: Duration) -> Api {
    let locks = Locks::open(url).await.unwrap();
    let users = MongoUsers::open(url).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut api = start_with(dir, locks, Arc::new(users), mode, step_delay).await;
    api.may_shed = true;
    api
}

async fn start_with(
    dir: tempfile::TempDir,
    locks: Locks,
    users: Arc<dyn UserStore>,
    mode: Option<Mode>,
    step_delay: Duration,
) -> Api {
    let lock = mode.map(|mode| LockSettings {
        ttl: Duration::from_secs(10),
        mode,
    });
    let router = app(AppState { users, step_delay }, locks, lock).unwrap();
    let (base, server) = common::serve(router).await;
    Api {
        base,
        may_shed: false,
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

/// Two tests of one case: `$sqlite` with locks and data on SQLite files,
/// `$mongodb` on the MongoDB server (skipped when unset, see the top).
macro_rules! on_both_stores {
    ($sqlite:ident, $mongodb:ident: $case:ident($mode:expr, $step_delay:expr)) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $sqlite() {
            $case(start($mode, $step_delay).await).await;
        }

        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $mongodb() {
            let Some(url) = common::mongodb_url() else {
                return;
            };
            $case(start_mongodb(&url, $mode, $step_delay).await).await;
        }
    };
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("user{i}")).collect()
}

/// Each create holds the lock for at least 200 ms, so 50 requests sent at
/// once overlap.
const REJECT_STEP: Duration = Duration::from_millis(200);

on_both_stores! {
    reject_mode_answers_409_with_retry_after_and_keeps_invariants,
    mongodb_reject_mode_answers_409_and_keeps_invariants:
    reject_mode_case(Some(Mode::Reject), REJECT_STEP)
}

/// 50 creates at once in reject mode: a mix of 201 and 409, every 409 a
/// complete lock problem, and exactly the 201s stored. Where the store may
/// shed load (see [`Api::may_shed`]), a 503 must be the retryable
/// store-unavailable problem, and it stores nothing either.
async fn reject_mode_case(api: Api) {
    let names = names(50);
    let responses = api.create_all(&names).await;
    let mut created = Vec::new();
    let mut rejected = 0;
    let mut shed = 0;
    for (name, response) in names.iter().zip(responses) {
        match response.status() {
            StatusCode::CREATED => created.push(name.clone()),
            StatusCode::CONFLICT => {
                common::locked(response, USERS_LOCK).await;
                rejected += 1;
            }
            StatusCode::SERVICE_UNAVAILABLE if api.may_shed => {
                assert_eq!(response.headers()[reqwest::header::RETRY_AFTER], "1");
                let doc = common::problem(response, StatusCode::SERVICE_UNAVAILABLE).await;
                assert_eq!(doc["type"], leasehold::http::problem::STORE_UNAVAILABLE);
                assert_eq!(doc["key"], USERS_LOCK);
                shed += 1;
            }
            other => panic!("unexpected {other}: {}", response.text().await.unwrap()),
        }
    }
    // Some got through and some were turned away while the lock was held.
    assert!(
        !created.is_empty() && rejected + shed > 0,
        "{} created, {rejected} rejected, {shed} shed",
        created.len()
    );
    let mut stored = api.invariants().await;
    stored.sort();
    created.sort();
    assert_eq!(stored, created);
}

const WAIT: Mode = Mode::Wait(Duration::from_secs(50));

on_both_stores! {
    wait_mode_lets_all_50_through_in_turn,
    mongodb_wait_mode_lets_all_50_through_in_turn:
    wait_mode_case(Some(WAIT), Duration::from_millis(10))
}

async fn wait_mode_case(api: Api) {
    let names = names(50);
    for response in api.create_all(&names).await {
        assert_eq!(response.status(), StatusCode::CREATED);
    }
    assert_eq!(api.invariants().await.len(), 50);
}

on_both_stores! {
    wait_mode_creates_a_contested_username_once,
    mongodb_wait_mode_creates_a_contested_username_once:
    contested_case(Some(WAIT), Duration::from_millis(20))
}

async fn contested_case(api: Api) {
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

/// A create whose token is lower than the counter's last one (its lease
/// expired and a newer holder wrote) is refused and writes nothing: the
/// fenced counter update comes first, in one transaction with the insert.
async fn fenced_create_writes_nothing(users: &dyn UserStore) {
    let first = users.create("ada", 7, Duration::ZERO).await.unwrap();
    assert_eq!(first.created_token, 7);
    let stale = users.create("bob", 6, Duration::ZERO).await;
    assert!(matches!(stale, Err(CreateError::Fenced)), "{stale:?}");
    // A token beyond i64 cannot be stored: refused, not wrapped.
    let huge = users.create("eve", u64::MAX, Duration::ZERO).await;
    assert!(matches!(huge, Err(CreateError::Fenced)), "{huge:?}");
    let names: Vec<String> = users
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|u| u.username)
        .collect();
    assert_eq!(names, ["ada"]);
    let counter = users.counter().await.unwrap();
    assert_eq!((counter.value, counter.last_token), (1, 7));
    // An equal token is the same lease writing again: accepted.
    users.create("bob", 7, Duration::ZERO).await.unwrap();
    assert_eq!(users.counter().await.unwrap().value, 2);
}

#[tokio::test]
async fn a_fenced_create_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let users = SqliteUsers::open(&dir.path().join("users.db"))
        .await
        .unwrap();
    fenced_create_writes_nothing(&users).await;
}

#[tokio::test]
async fn mongodb_a_fenced_create_writes_nothing() {
    let Some(url) = common::mongodb_url() else {
        return;
    };
    let users = MongoUsers::open(&url).await.unwrap();
    assert!(
        users.transactions(),
        "the test server runs transactions: the insert and the counter update commit together"
    );
    fenced_create_writes_nothing(&users).await;
    // Opening again keeps the counter and the users.
    let again = MongoUsers::open(&url).await.unwrap();
    assert_eq!(again.counter().await.unwrap().value, 2);
    assert_eq!(again.list().await.unwrap().len(), 2);
}
