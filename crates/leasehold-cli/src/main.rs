//! The `leasehold` binary; all logic lives in the library half of the crate.

use std::process::ExitCode;

fn main() -> ExitCode {
    leasehold_cli::main_with_args(std::env::args_os())
}
