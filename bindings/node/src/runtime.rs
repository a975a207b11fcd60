//! The tokio runtime every native call and every lease renewal runs on.

use napi::bindgen_prelude::create_custom_tokio_runtime;

/// The environment variable that sets the number of native worker threads.
const WORKERS_VAR: &str = "LEASEHOLD_NODE_WORKERS";

/// Builds the runtime before the first call when `LEASEHOLD_NODE_WORKERS`
/// asks for a number of worker threads (a positive integer); otherwise
/// napi-rs's default runtime (one worker per core) is used. Fewer workers
/// means fewer hand-offs between threads per call (a store driver's task
/// and the caller's task then share a thread), so the knob exists to
/// measure and tune that; renewal runs on these threads either way, never
/// on the JS thread.
#[napi_derive::module_init]
fn init() {
    let Some(workers) = std::env::var(WORKERS_VAR)
        .ok()
        .and_then(|w| w.trim().parse::<usize>().ok())
        .filter(|&w| w > 0)
    else {
        return;
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
