//! The `leasehold` binary against Redis, across real OS processes.
//!
//! Reads the server from `LEASEHOLD_TEST_REDIS`; without it these tests skip
//! (or fail, with `LEASEHOLD_REQUIRE_SERVERS=1`). Each test uses its own key
//! prefix, so runs in parallel on one server never share a lock.

mod common;

use std::time::Duration;

use common::*;

/// The shared server with a fresh key prefix, or `None` to skip.
fn redis_store() -> Option<String> {
    redis_store_of("LEASEHOLD_TEST_REDIS")
}

process_tests!(redis_store());
demo_tests_without_row_lock!(redis_store(), "redis");

/// Needs no server: the point is that there is none.
#[test]
fn a_store_that_is_down_exits_69_quickly_with_one_line() {
    let store = format!("redis://127.0.0.1:{}", free_port());
    for args in [
        &["run", "k", "--", "true"][..],
        &["run", "k", "--wait", "30s", "--", "true"],
        &["demo"],
    ] {
        let err = down_store_stderr(&store, args);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains("refused"), "{args:?}: {err}");
    }
}

/// A private `redis-server` without AOF and with an evicting
/// `maxmemory-policy`: both warnings show at the CLI's default log level,
/// each once. `None` (skip) if `redis-server` is not installed.
#[test]
fn durability_warnings_show_once_without_verbose() {
    let Ok(server) = std::process::Command::new("redis-server")
        .arg("--version")
        .output()
    else {
        assert_ne!(
            std::env::var("LEASEHOLD_REQUIRE_SERVERS").as_deref(),
            Ok("1"),
            "redis-server is not installed"
        );
        return;
    };
    assert!(server.status.success());
    let port = free_port();
    let mut redis = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--maxmemory-policy", "allkeys-lru"])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("redis://127.0.0.1:{port}");
    assert!(wait_until(Duration::from_secs(10), || {
        std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
    }));
    let out = run(leasehold(&url).args(["run", "k", "--", "true"]));
    let _ = redis.kill();
    let _ = redis.wait();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stderr(&out);
    assert_eq!(text.matches("redis runs without AOF").count(), 1, "{text}");
    assert_eq!(
        text.matches("maxmemory-policy noeviction").count(),
        1,
        "{text}"
    );
}
