//! The `coloc` binary: the command line (`args`) parsed and handed to the command's family,
//! one file or folder each: `serve` (serve, backup, config), `data` (import, export),
//! `evaluate` (the `eval` commands over `eval`, the evaluation protocols), `profiling`
//! (agent, calibrate, ncu), `operator` (the commands that talk gRPC to a running server),
//! `bench` (the load generator) and `sim` (the cluster simulation). `report_plot` draws
//! `coloc model report --plot`; `plot` holds what the pictures share. The service itself
//! is the library, `coloc`.

use clap::Parser;

mod args;
mod bench;
mod data;
mod data_sources;
mod eval;
mod evaluate;
#[cfg(test)]
mod help_tests;
mod operator;
mod plot;
mod profiling;
mod report_plot;
mod serve;
mod sim;

use args::{Cli, Command, EvalCommand, ExportCommand, ImportCommand};
use operator::{cluster, models, workloads};

/// glibc's allocator spends a quarter of a Rank request's CPU in malloc/free under load
/// (many small strings and vectors per request, freed on other threads); mimalloc's
/// per-thread heaps cost far less there. Built without transparent huge pages (decision 034).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve(_)) {
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
    match run(cli.command).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("coloc: {}", error_chain(&error));
            // 64 + the gRPC code of a failed RPC (as grpcurl), else 1.
            std::process::ExitCode::from(operator::exit_code(&error))
        }
    }
}

/// The error and its causes, `: `-separated, each said once: transport errors repeat their
/// cause's text in their own ("tcp connect error: tcp connect error: ...").
fn error_chain(error: &anyhow::Error) -> String {
    let mut said: Vec<String> = Vec::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if said.last() != Some(&text) {
            said.push(text);
        }
    }
    said.join(": ")
}

/// The command handed to its family.
async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Serve(args) => serve::serve(args).await,
        Command::Backup(args) => serve::backup(args).await,
        Command::Config(args) => serve::config(args),
        Command::Import(ImportCommand::Kace(args)) => data::import(args).await,
        Command::Export(ExportCommand::Kace(args)) => data::export(args).await,
        Command::Eval(EvalCommand::Kace(args)) => evaluate::kace(args).await,
        Command::Eval(EvalCommand::Objectives(args)) => evaluate::objectives(args).await,
        Command::Eval(EvalCommand::Nway(args)) => evaluate::nway(args).await,
        Command::Agent(args) => profiling::agent(args).await,
        Command::ProfileJob(args) => profiling::profile_job(args).await,
        Command::Calibrate(args) => profiling::calibrate(args).await,
        Command::Ncu(args) => profiling::ncu(args),
        Command::Workloads {
            connection,
            command,
        } => workloads::workloads(&connection, command).await,
        Command::Rank { connection, args } => workloads::rank(&connection, args).await,
        Command::Runs {
            connection,
            command,
        } => operator::undo::runs(&connection, command).await,
        Command::Audit {
            connection,
            command,
        } => operator::undo::audit(&connection, command).await,
        Command::Report { connection, args } => models::report(&connection, args).await,
        Command::Predict { connection, args } => models::predict(&connection, args).await,
        Command::Train { connection, args } => models::train(&connection, args).await,
        Command::Model {
            connection,
            args,
            command,
        } => match command {
            None => models::model(&connection, args).await,
            Some(command) => models::model_command(&connection, command).await,
        },
        Command::Models {
            connection,
            command,
        } => models::models(&connection, command).await,
        Command::Health { connection } => operator::health(&connection).await,
        Command::Place { connection, args } => cluster::place(&connection, args).await,
        Command::Gpus {
            connection,
            command,
        } => cluster::gpus(&connection, command).await,
        Command::Jobs {
            connection,
            command,
        } => cluster::jobs(&connection, command).await,
        Command::Agents {
            connection,
            command,
        } => cluster::agents(&connection, command).await,
        Command::Bench(args) => bench::run(args).await,
        Command::Simulate(args) => sim::run(args),
    }
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[test]
    fn a_cause_repeated_by_its_wrapper_is_said_once() {
        let error = anyhow::anyhow!("Connection refused")
            .context("tcp connect error")
            .context("tcp connect error")
            .context("cannot reach coloc at 127.0.0.1:1");
        assert_eq!(
            error_chain(&error),
            "cannot reach coloc at 127.0.0.1:1: tcp connect error: Connection refused"
        );
    }
}
