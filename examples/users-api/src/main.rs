//! `users-api`: serve the example users API.

use std::process::ExitCode;

use clap::Parser;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = users_api::cli::Cli::parse();
    match users_api::cli::run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("users-api: {e:#}");
            ExitCode::FAILURE
        }
    }
}
