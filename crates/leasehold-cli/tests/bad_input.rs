//! One bad-input suite for the `leasehold` command, run against every store
//! available: each bad key, ttl, wait or URL gets exit 64 (or 69 for a store
//! that cannot be reached) with a specific message, hostile-looking keys
//! are plain strings, and afterwards the store works and holds no stray
//! lock under the test's prefix.
//!
//! A store joins with one line in `stores()`.

mod common;

use common::{leasehold, run, sqlite_store, stderr, stdout};
use leasehold::conformance::server_url;

/// A store under test: its URL, and URLs for it that must fail, each with
/// the exit code and message it must fail with.
struct Store {
    name: &'static str,
    url: String,
    bad_urls: Vec<(String, u8, &'static str)>,
    _dir: Option<tempfile::TempDir>,
}

fn stores() -> Vec<Store> {
    let dir = tempfile::tempdir().unwrap();
    let mut stores = vec![Store {
        name: "sqlite",
        url: sqlite_store(dir.path()),
        bad_urls: vec![
            ("sqlite://".into(), 64, "sqlite:// needs a file path"),
            (
                "sqlite:///tmp/x.db?mode=rw".into(),
                64,
                "unknown sqlite option",
            ),
            (
                "sqlite:///proc/locks.db".into(),
                69,
                "store unavailable (sqlite)",
            ),
            // A mistyped directory is not created: no second lock database.
            (
                "sqlite:///proc/leasehold-no-such-dir/locks.db".into(),
                64,
                "directory /proc/leasehold-no-such-dir of /proc/leasehold-no-such-dir/locks.db does not exist",
            ),
        ],
        _dir: Some(dir),
    }];
    if let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") {
        let (base, _) = url.rsplit_once('/').expect("a database in the URL");
        stores.push(Store {
            name: "postgres",
            bad_urls: vec![
                ("postgres://u@h:notaport/db".into(), 64, "invalid store url"),
                (
                    "postgres://postgres@127.0.0.1:1/test".into(),
                    69,
                    "store unavailable (postgres)",
                ),
                (
                    format!("{base}/leasehold_no_such_database"),
                    69,
                    "does not exist",
                ),
            ],
            url,
            _dir: None,
        });
    }
    if let Some(url) = server_url("LEASEHOLD_TEST_MONGODB") {
        stores.push(Store {
            name: "mongodb",
            bad_urls: vec![
                ("mongodb://a:b:c:d".into(), 64, "invalid store url"),
                (
                    "mongodb://127.0.0.1:1".into(),
                    69,
                    "store unavailable (mongodb)",
                ),
            ],
            url,
            _dir: None,
        });
    }
    if let Some(url) = server_url("LEASEHOLD_TEST_REDIS") {
        let hostport = url
            .trim_start_matches("redis://")
            .split('/')
            .next()
            .unwrap()
            .to_owned();
        stores.push(Store {
            name: "redis",
            bad_urls: vec![
                (
                    format!("redis://:wrongpass@{hostport}"),
                    69,
                    "authentication failed",
                ),
                (
                    format!("redis://{hostport}/99"),
                    69,
                    "refused to switch database",
                ),
                (
                    "redis://127.0.0.1:1".into(),
                    69,
                    "store unavailable (redis)",
                ),
                ("redis://127.0.0.1:99999".into(), 64, "invalid store url"),
                (format!("rediss://{hostport}"), 64, "TLS"),
                (
                    format!("redis://{hostport}?prefix=a{{b"),
                    64,
                    "must not contain braces",
                ),
            ],
            url,
            _dir: None,
        });
    }
    stores
}

#[test]
fn bad_keys_ttls_and_waits_exit_64_and_leave_no_record() {
    for store in stores() {
        let prefix = format!("bad-input-{:08x}:", rand::random::<u32>());
        let long = format!("{prefix}{}", "k".repeat(300));
        let key = format!("{prefix}k");
        let cases: Vec<(Vec<&str>, &str)> = vec![
            (
                vec!["run", "", "--", "true"],
                "invalid key: must not be empty",
            ),
            (
                vec!["run", &long, "--", "true"],
                "must be at most 256 bytes",
            ),
            (vec!["run", "a\u{1}b", "--", "true"], "control characters"),
            (vec!["run", "a\u{7f}b", "--", "true"], "control characters"),
            (vec!["status", "tab\there"], "control characters"),
            (vec!["release", "", "--force"], "must not be empty"),
            (
                vec!["run", &key, "--ttl", "0s", "--", "true"],
                "invalid ttl",
            ),
            (
                vec!["run", &key, "--ttl", "99ms", "--", "true"],
                "invalid ttl",
            ),
            (
                vec!["run", &key, "--ttl", "25h", "--", "true"],
                "invalid ttl",
            ),
            (
                vec!["run", &key, "--ttl=-1s", "--", "true"],
                "expected a duration",
            ),
            (
                vec!["run", &key, "--ttl", "99999999999999999999h", "--", "true"],
                "expected a duration",
            ),
            (
                vec!["run", &key, "--wait=-1s", "--", "true"],
                "expected a duration",
            ),
            (
                vec!["run", &key, "--wait", "soon", "--", "true"],
                "expected a duration",
            ),
            (vec!["list", "--prefix", "a\u{7}"], "invalid prefix"),
        ];
        for (args, expected) in &cases {
            let out = run(leasehold(&store.url).args(args));
            let err = stderr(&out);
            assert_eq!(
                out.status.code(),
                Some(64),
                "{}: {args:?}: {err}",
                store.name
            );
            assert!(err.contains(expected), "{}: {args:?}: {err}", store.name);
        }
        // Keys shaped like SQL, Mongo operators and Redis patterns are keys.
        for hostile in ["'; DROP TABLE x; --", "$ne", "a.b", "*", "{x}", "[a-z]?"] {
            let k = format!("{prefix}{hostile}");
            let out = run(leasehold(&store.url).args([
                "run",
                &k,
                "--",
                "sh",
                "-c",
                "echo $LEASEHOLD_KEY",
            ]));
            assert!(
                out.status.success(),
                "{}: {hostile:?}: {}",
                store.name,
                stderr(&out)
            );
            assert_eq!(stdout(&out).trim_end(), k, "{}", store.name);
        }
        // No stray record, and the store still works.
        let out = run(leasehold(&store.url).args(["list", "--prefix", &prefix, "--json"]));
        assert!(out.status.success(), "{}: {}", store.name, stderr(&out));
        let listed: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            listed.as_array().map(Vec::len),
            Some(0),
            "{}: {listed}",
            store.name
        );
        let out = run(leasehold(&store.url).args(["run", &key, "--", "true"]));
        assert!(out.status.success(), "{}: {}", store.name, stderr(&out));
    }
}

#[test]
fn bad_store_urls_get_specific_errors() {
    let common: Vec<(String, u8, &str)> = vec![
        ("locks.db".into(), 64, "has no scheme"),
        ("ftp://x".into(), 64, "unknown scheme \"ftp\""),
        ("memory://x".into(), 64, "takes nothing after the scheme"),
    ];
    for store in stores() {
        for (url, code, expected) in common.iter().chain(&store.bad_urls) {
            let out = run(leasehold(url).args(["status", "k"]));
            let err = stderr(&out).to_lowercase();
            assert_eq!(out.status.code(), Some(i32::from(*code)), "{url}: {err}");
            assert!(err.contains(&expected.to_lowercase()), "{url}: {err}");
        }
        // The store is untouched by its failed neighbours.
        let out = run(leasehold(&store.url).args(["list"]));
        assert!(out.status.success(), "{}: {}", store.name, stderr(&out));
    }
}
