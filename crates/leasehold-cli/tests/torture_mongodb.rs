//! `leasehold torture` on MongoDB (`LEASEHOLD_TEST_MONGODB`), with the fault
//! proxy between the workers and the server.
#![cfg(feature = "mongodb")]

mod common;
mod torture_common;

use leasehold::conformance::server_url;
use torture_common::*;

#[test]
fn fenced_run_passes_under_kills_pauses_and_proxy_faults() {
    let Some(url) = server_url("LEASEHOLD_TEST_MONGODB") else {
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
    let Some(url) = server_url("LEASEHOLD_TEST_MONGODB") else {
        return;
    };
    unfenced_run_reports_lost_updates(&url, &[]);
}
