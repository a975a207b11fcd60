//! The native half of the npm package `leasehold`: the Rust library's
//! [`leasehold::Locks`] exposed to Node.js through napi-rs.
//!
//! Everything async runs on napi-rs's tokio runtime, so lease renewal keeps
//! going while the JS event loop is blocked. The JS wrapper (`index.js`)
//! turns the errors built in [`errors`] into `Error`s with a `code`, parses
//! durations, and wires `AbortSignal`s to [`locks::NativeLocks::cancel`].
//!
//! Nothing here keeps Node alive on its own: the only JS callback held from
//! native threads (the lost-lease notification) is a weak threadsafe
//! function, so a process with nothing pending exits by itself.

mod errors;
mod lease;
mod locks;
mod options;
mod policy;
mod runtime;
mod settle;
mod stats;

pub use lease::NativeLease;
pub use locks::{LeaderInfo, LeaseInfo, NativeLocks, NativeObserver, PermitInfo};
pub use options::{check_key, check_route_options, check_semaphore};
pub use policy::{
    problem_concurrency_limit, problem_invalid_key, problem_locked, problem_store_unavailable,
    ProblemAnswer, DEFAULT_TTL_MS, PROBLEM_CONCURRENCY_LIMIT, PROBLEM_CONTENT_TYPE,
    PROBLEM_INVALID_KEY, PROBLEM_LOCKED, PROBLEM_STORE_UNAVAILABLE, RELEASE_BOUND_MS,
};
