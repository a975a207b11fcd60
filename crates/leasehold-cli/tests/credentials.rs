//! A store URL with a password, given the careful way (in `LEASEHOLD_STORE`,
//! not on the command line), never shows up in what `leasehold` prints nor
//! in the command line of any process it starts, on every network store.
//!
//! Each test makes a login with a fresh random password on the real server
//! (a PostgreSQL role, a Redis ACL user, a MongoDB user; all removed at the
//! end), then runs `demo`, `torture`, `bench --processes`, `status`, `list`
//! (one of them at `-vv`) and a failing connection with that URL, while a
//! thread samples `/proc/*/cmdline` of every process on the machine.
//!
//! Needs LEASEHOLD_TEST_POSTGRES, LEASEHOLD_TEST_REDIS, LEASEHOLD_TEST_MONGODB
//! (`source scripts/test-services.sh`); each test skips without its server,
//! and fails instead under `LEASEHOLD_REQUIRE_SERVERS=1`.

mod common;

use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{pg_exec, stderr, stdout, SHORT_DEMO};
use leasehold::conformance::server_url;
use rand::Rng;

/// A password for one test: a unique core (what is searched for: it is in
/// both the written and the decoded form) plus a character that must be
/// percent-encoded in a URL.
struct Password {
    core: String,
}

impl Password {
    fn new() -> Self {
        Password {
            core: format!("Cr3d{:016x}", rand::thread_rng().gen::<u64>()),
        }
    }

    /// As the server knows it.
    fn plain(&self) -> String {
        format!("{}@x", self.core)
    }

    /// As written in a URL.
    fn encoded(&self) -> String {
        format!("{}%40x", self.core)
    }
}

/// `scheme://user:password@` followed by the hosts and the rest of `base`
/// (whose own userinfo, if any, is dropped).
fn with_login(base: &str, user: &str, password: &Password) -> String {
    let (scheme, rest) = base.split_once("://").expect("a server URL has a scheme");
    let authority_end = rest.find(['/', '?']).unwrap_or(rest.len());
    let rest = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    format!("{scheme}://{user}:{}@{rest}", password.encoded())
}

/// Appends `param` to the URL's query.
fn with_param(url: &str, param: &str) -> String {
    let separator = if url.contains('?') { '&' } else { '?' };
    format!("{url}{separator}{param}")
}

/// What one watched run saw.
struct Watched {
    output: Output,
    /// Worker processes (children of the run) seen while it ran.
    workers_seen: usize,
    /// Workers whose environment carried `LEASEHOLD_STORE`.
    workers_with_store_env: usize,
}

/// Runs `leasehold ARGS` with `store` in `LEASEHOLD_STORE` only, sampling
/// the command line of every process on the machine until it exits, and
/// fails the test if any of them, or the run's output, shows `secret`.
fn run_watched(store: &str, args: &[&str], secret: &str) -> Watched {
    let child = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env("LEASEHOLD_STORE", store)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the leasehold binary runs");
    let parent = child.id();
    let done = Arc::new(AtomicBool::new(false));
    let leaks = Arc::new(Mutex::new(Vec::<String>::new()));
    let workers = Arc::new(Mutex::new(std::collections::HashMap::<u32, bool>::new()));
    let sampler = {
        let (done, leaks, workers) = (done.clone(), leaks.clone(), workers.clone());
        let secret = secret.to_owned();
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                sample(&secret, parent, &leaks, &workers);
                std::thread::sleep(Duration::from_millis(5));
            }
        })
    };
    let output = child.wait_with_output().unwrap();
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    let leaks = leaks.lock().unwrap();
    assert!(
        leaks.is_empty(),
        "leasehold {args:?}: the password is on a command line: {leaks:?}"
    );
    let printed = format!("{}{}", stdout(&output), stderr(&output));
    assert!(
        !printed.contains(secret),
        "leasehold {args:?} printed the password:\n{printed}"
    );
    let workers = workers.lock().unwrap();
    Watched {
        output,
        workers_seen: workers.len(),
        workers_with_store_env: workers.values().filter(|env| **env).count(),
    }
}

/// One pass over /proc: command lines showing `secret` go to `leaks`;
/// children of `parent` go to `workers`, with whether their environment
/// has `LEASEHOLD_STORE`.
fn sample(
    secret: &str,
    parent: u32,
    leaks: &Mutex<Vec<String>>,
    workers: &Mutex<std::collections::HashMap<u32, bool>>,
) {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // Processes come and go between listing and reading: skip those.
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(secret) {
            leaks.lock().unwrap().push(format!("pid {pid}: {cmdline}"));
        }
        if cmdline.contains("-worker") && parent_of(pid) == Some(parent) {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let has_store = String::from_utf8_lossy(&environ)
                .split('\0')
                .any(|var| var.starts_with("LEASEHOLD_STORE="));
            let mut workers = workers.lock().unwrap();
            let seen = workers.entry(pid).or_insert(false);
            *seen |= has_store;
        }
    }
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// Every command that prints the URL or starts workers, with `store`.
fn check_every_command(store: &str, password: &Password, unreachable: &str) {
    let secret = password.core.as_str();

    let demo = run_watched(
        store,
        &[&SHORT_DEMO[..], &["--strategy", "lease"]].concat(),
        secret,
    );
    assert!(
        demo.output.status.success(),
        "demo: {}",
        stderr(&demo.output)
    );
    assert_workers_got_the_store("demo", &demo);

    let torture = run_watched(
        store,
        &[
            "torture",
            "--workers",
            "2",
            "--duration",
            "2s",
            "--ttl",
            "500ms",
            "--faults",
            "kill,proxy",
        ],
        secret,
    );
    let code = torture.output.status.code();
    assert!(
        matches!(code, Some(0..=2)),
        "torture reached no verdict ({code:?}): {}{}",
        stdout(&torture.output),
        stderr(&torture.output)
    );
    let header = stdout(&torture.output);
    assert!(
        header.starts_with("leasehold torture: ") && header.contains(":***@"),
        "the header names the store, password masked: {header}"
    );
    assert_workers_got_the_store("torture", &torture);

    let torture_json = run_watched(
        store,
        &[
            "torture",
            "--workers",
            "1",
            "--duration",
            "1s",
            "--ttl",
            "500ms",
            "--faults",
            "none",
            "--json",
        ],
        secret,
    );
    let report: serde_json::Value = serde_json::from_slice(&torture_json.output.stdout)
        .unwrap_or_else(|e| panic!("torture --json: {e}: {}", stderr(&torture_json.output)));
    assert!(report["setup"]["store"].as_str().unwrap().contains(":***@"));

    let bench = run_watched(
        store,
        &[
            "bench",
            "--scenario",
            "uncontended",
            "--scenario",
            "contended",
            "--processes",
            "--workers",
            "2",
            "--rounds",
            "10",
            "--duration",
            "500ms",
        ],
        secret,
    );
    assert!(
        bench.output.status.success(),
        "bench: {}",
        stderr(&bench.output)
    );
    assert!(
        stdout(&bench.output)
            .lines()
            .any(|l| l.starts_with("store: ") && l.contains(":***@")),
        "bench names the store, password masked: {}",
        stdout(&bench.output)
    );
    assert_workers_got_the_store("bench", &bench);

    // Tracing at its most verbose, the drivers' info events included.
    let traced = run_watched(
        store,
        &["-vv", "run", "credentials:key", "--", "true"],
        secret,
    );
    assert!(
        traced.output.status.success(),
        "run: {}",
        stderr(&traced.output)
    );
    assert!(!stderr(&traced.output).is_empty(), "-vv traces something");

    let status = run_watched(store, &["status", "credentials:key", "--json"], secret);
    assert!(
        status.output.status.success(),
        "status: {}",
        stderr(&status.output)
    );

    let list = run_watched(store, &["list", "--json"], secret);
    assert!(
        list.output.status.success(),
        "list: {}",
        stderr(&list.output)
    );

    // A connection that fails: the error line names no password.
    let failed = run_watched(unreachable, &["-v", "status", "credentials:key"], secret);
    assert!(!failed.output.status.success());
    assert!(stderr(&failed.output).starts_with("leasehold: "));
}

fn assert_workers_got_the_store(what: &str, run: &Watched) {
    assert!(
        run.workers_seen > 0,
        "{what}: no worker process was sampled"
    );
    assert_eq!(
        run.workers_with_store_env, run.workers_seen,
        "{what}: every worker gets the store URL through its environment"
    );
}

/// A user name of this test only, and a new password for it.
fn new_login() -> (String, Password) {
    let name = format!("leasehold_cred_{:016x}", rand::thread_rng().gen::<u64>());
    (name, Password::new())
}

#[test]
fn postgres_password_stays_out_of_output_and_argv() {
    let Some(base) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    let (name, password) = new_login();
    // The shared server trusts local connections: the password is accepted
    // without being checked, which is all this test needs.
    pg_exec(
        &base,
        &format!(
            "CREATE ROLE {name} LOGIN PASSWORD '{}'; CREATE SCHEMA {name} AUTHORIZATION {name}",
            password.plain()
        ),
    );
    struct Cleanup(String, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = std::panic::catch_unwind(|| {
                pg_exec(
                    &self.0,
                    &format!("DROP SCHEMA {0} CASCADE; DROP ROLE {0}", self.1),
                )
            });
        }
    }
    let _cleanup = Cleanup(base.clone(), name.clone());
    let store = with_param(
        &with_login(&base, &name, &password),
        &format!("options[search_path]={name}"),
    );
    let unreachable = format!("postgres://{name}:{}@127.0.0.1:9/test", password.encoded());
    check_every_command(&store, &password, &unreachable);
}

#[test]
fn redis_password_stays_out_of_output_and_argv() {
    let Some(base) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let (name, password) = new_login();
    let client = redis::Client::open(base.as_str()).unwrap();
    let mut admin = client.get_connection().unwrap();
    redis::cmd("ACL")
        .arg("SETUSER")
        .arg(&name)
        .arg("on")
        .arg(format!(">{}", password.plain()))
        .arg("~*")
        .arg("&*")
        .arg("+@all")
        .exec(&mut admin)
        .unwrap();
    struct Cleanup(redis::Connection, String);
    impl Drop for Cleanup {
        fn drop(&mut self) {
            let _ = redis::cmd("ACL")
                .arg("DELUSER")
                .arg(&self.1)
                .exec(&mut self.0);
        }
    }
    let _cleanup = Cleanup(admin, name.clone());
    let store = with_param(
        &with_login(&base, &name, &password),
        &format!("prefix={name}"),
    );
    // Redis checks the password: a wrong one is the failing connection.
    let wrong = Password {
        core: format!("{}wrong", password.core),
    };
    let unreachable = with_login(&base, &name, &wrong);
    check_every_command(&store, &password, &unreachable);
}

#[cfg(feature = "mongodb")]
#[test]
fn mongodb_password_stays_out_of_output_and_argv() {
    use mongodb::bson::doc;

    let Some(base) = server_url("LEASEHOLD_TEST_MONGODB") else {
        return;
    };
    let (name, password) = new_login();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let client = rt.block_on(mongodb::Client::with_uri_str(&base)).unwrap();
    let admin = client.database("admin");
    rt.block_on(async {
        admin
            .run_command(doc! { "createUser": &name, "pwd": password.plain(), "roles": ["root"] })
            .await
    })
    .unwrap();
    let store_url = {
        let login = with_login(&base, &name, &password);
        let (before_query, query) = login.split_once('?').unwrap_or((&login, ""));
        let hosts_end = before_query["mongodb://".len()..]
            .find('/')
            .map_or(before_query.len(), |i| i + "mongodb://".len());
        let mut url = format!("{}/{name}", &before_query[..hosts_end]);
        if !query.is_empty() {
            url = with_param(&url, query);
        }
        with_param(&url, "authSource=admin")
    };
    // MongoDB checks the password: a wrong one is the failing connection.
    let unreachable = store_url.replace(&password.encoded(), &format!("{}wrong", password.core));
    let result =
        std::panic::catch_unwind(|| check_every_command(&store_url, &password, &unreachable));
    let _ = rt.block_on(async {
        let _ = admin.run_command(doc! { "dropUser": &name }).await;
        client.database(&name).drop().await
    });
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}
