//! The tokio runtime every native call and every lease renewal runs on.

use std::sync::OnceLock;

use napi::bindgen_prelude::create_custom_tokio_runtime;

/// The environment variable that sets the number of native worker threads.
const WORKERS_VAR: &str = "LEASEHOLD_NODE_WORKERS";

/// Worker threads when `LEASEHOLD_NODE_WORKERS` is not set: one. The work
/// on these threads is waiting on sockets, not computing, so one thread
/// serves every lease of the process; a PM2 cluster runs a process per core,
/// and one thread per core in each would give it cores² threads. With one
/// thread a store driver's task and the caller's task share it, which saves
/// a cross-thread wake-up per round trip; the README's "Performance" has
/// the runs (the difference in speed was within this machine's noise).
/// Renewal still runs here, never on the JS thread.
const DEFAULT_WORKERS: usize = 1;

/// Why `LEASEHOLD_NODE_WORKERS` was refused, reported by `Locks.open`.
static SETTING_ERROR: OnceLock<String> = OnceLock::new();

/// Builds the runtime before the first call, with `LEASEHOLD_NODE_WORKERS`
/// worker threads (a positive integer) or [`DEFAULT_WORKERS`].
#[napi_derive::module_init]
fn init() {
    let workers = match std::env::var(WORKERS_VAR) {
        Err(_) => DEFAULT_WORKERS,
        Ok(value) => match parse_workers(&value) {
            Some(workers) => workers,
            None => {
                let _ = SETTING_ERROR.set(format!(
                    "{WORKERS_VAR} must be a positive integer, got {value:?}"
                ));
                DEFAULT_WORKERS
            }
        },
    };
    // A runtime that cannot be built leaves napi-rs's default in place.
    if let Ok(runtime) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        create_custom_tokio_runtime(runtime);
    }
}

fn parse_workers(value: &str) -> Option<usize> {
    value.trim().parse::<usize>().ok().filter(|&w| w > 0)
}

/// An invalid `LEASEHOLD_NODE_WORKERS`, as the error `Locks.open` rejects
/// with (before any I/O), so a typo is not silently ignored.
pub(crate) fn check_setting() -> leasehold::Result<()> {
    match SETTING_ERROR.get() {
        Some(reason) => Err(leasehold::Error::invalid(WORKERS_VAR, reason.clone())),
        None => Ok(()),
    }
}
