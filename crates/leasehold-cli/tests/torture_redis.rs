//! `leasehold torture` on Redis (`LEASEHOLD_TEST_REDIS`), with the fault
//! proxy between the workers and the server.

mod common;
mod torture_common;

use common::{assert_exit, leasehold, run};
use leasehold::conformance::server_url;

network_torture_tests!("LEASEHOLD_TEST_REDIS");

#[test]
fn the_in_store_resource_is_not_offered_on_redis_yet() {
    let Some(url) = server_url("LEASEHOLD_TEST_REDIS") else {
        return;
    };
    let out = run(leasehold(&url).args(["torture", "--resource", "store", "--duration", "1s"]));
    assert_exit(&out, 64, "use --resource server", "--resource store");
}
