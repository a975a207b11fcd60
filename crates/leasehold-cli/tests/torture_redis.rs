//! `leasehold torture` on Redis (`LEASEHOLD_TEST_REDIS`), with the fault
//! proxy between the workers and the server.

mod common;
mod torture_common;

use common::{leasehold, run, stderr};
use leasehold::conformance::server_url;
use torture_common::*;

#[test]
fn fenced_run_passes_under_kills_pauses_and_proxy_faults() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let run = fenced_run_passes_and_faults_hit(&url, &["--faults", "kill,pause,proxy"]);
    assert!(run.report["faults"]
        .as_object()
        .unwrap()
        .keys()
        .any(|k| k.starts_with("proxy-")));
}

#[test]
fn unfenced_run_loses_updates() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    unfenced_run_reports_lost_updates(&url, &[]);
}

#[test]
fn the_in_store_resource_is_not_offered_on_redis_yet() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let out = run(leasehold(&url).args(["torture", "--resource", "store", "--duration", "1s"]));
    assert_eq!(out.status.code(), Some(64), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("use --resource server"),
        "{}",
        stderr(&out)
    );
}
