//! The `coloc` binary: parses the command line and hands over to the library.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = coloc::cli::Cli::parse();
    match coloc::cli::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("coloc: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
