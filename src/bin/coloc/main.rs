//! The `coloc` binary: parses the command line and hands over to the library.

use clap::Parser;

mod bench;
mod cli;
mod eval;
mod operator;
mod report_plot;
mod sim;

/// glibc's allocator spends a quarter of a Rank request's CPU in malloc/free under load
/// (many small strings and vectors per request, freed on other threads); mimalloc's
/// per-thread heaps cost far less there.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = crate::cli::Cli::parse();
    if !matches!(cli.command, crate::cli::Command::Serve(_)) {
        // Command-line tools end quietly when their reader goes away (`coloc ... | head`);
        // the server keeps Rust's default of handling broken pipes as errors.
        // SAFETY: sigaction is process-wide and thread-safe, and SIG_DFL installs no handler
        // code that would have to be async-signal-safe.
        unsafe {
            let _ = nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigDfl,
            );
        }
    }
    coloc::startup::note_fatal_storage_signals();
    let result = match cli.command {
        crate::cli::Command::Bench(args) => bench::run(args).await,
        crate::cli::Command::Simulate(args) => sim::run(args),
        _ => crate::cli::run(cli).await,
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("coloc: {error:#}");
            // 64 + the gRPC code of a failed RPC (as grpcurl), else 1.
            std::process::ExitCode::from(crate::operator::exit_code(&error))
        }
    }
}
