//! `leasehold torture` on MongoDB (`LEASEHOLD_TEST_MONGODB`), with the fault
//! proxy between the workers and the server.
#![cfg(feature = "mongodb")]

mod common;
mod torture_common;

network_torture_tests!("LEASEHOLD_TEST_MONGODB");
