//! Where the tests find their servers: one reading of the environment for
//! the conformance suite and the stores' own inline tests, below both.

/// Reads the URL of a server for tests from `var`. Returns `None` (and says
/// so on stderr) when it is unset, unless `LEASEHOLD_REQUIRE_SERVERS=1`, in
/// which case a missing server fails the test.
pub fn server_url(var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("LEASEHOLD_REQUIRE_SERVERS").as_deref() == Ok("1") {
                panic!(
                    "{var} is not set and LEASEHOLD_REQUIRE_SERVERS=1: this test needs its server"
                );
            }
            eprintln!("skipping: {var} is not set (set it to run this test against a real server)");
            None
        }
    }
}
