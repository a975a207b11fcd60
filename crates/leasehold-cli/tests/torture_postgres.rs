//! `leasehold torture` on PostgreSQL (`LEASEHOLD_TEST_POSTGRES`): the
//! harness's resource server with the fault proxy, and the in-store resource
//! (a counter row behind `WHERE fence <= token` in the same database).

mod common;
mod torture_common;

use leasehold::conformance::server_url;
use torture_common::*;

network_torture_tests!("LEASEHOLD_TEST_POSTGRES");

#[test]
fn fenced_in_store_resource_passes_under_kills_and_pauses() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    fenced_run_passes_and_faults_hit(&url, &["--resource", "store"]);
}

#[test]
fn unfenced_in_store_resource_loses_updates() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    unfenced_run_reports_lost_updates(&url, &["--resource", "store"]);
}

#[test]
fn fenced_semaphore_run_with_the_counter_in_the_store_passes() {
    let Some(url) = server_url("LEASEHOLD_TEST_POSTGRES") else {
        return;
    };
    fenced_primitive_run_passes(&url, "semaphore", &["--resource", "store"]);
}
