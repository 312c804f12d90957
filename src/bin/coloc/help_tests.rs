//! Every command and every argument of the command line says what it is for: a test over
//! clap's whole tree, so a new flag without a help text fails the build's tests.

use clap::CommandFactory;

use crate::args::Cli;

/// `path: what lacks a help text`, for `command` and everything under it.
fn missing_help(command: &clap::Command, path: &str, missing: &mut Vec<String>) {
    for argument in command.get_arguments() {
        let id = argument.get_id().as_str();
        if id == "help" || id == "version" {
            continue;
        }
        if argument.get_help().is_none() && argument.get_long_help().is_none() {
            missing.push(format!("{path}: argument {id}"));
        }
    }
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let sub_path = format!("{path} {}", sub.get_name());
        if sub.get_about().is_none() && sub.get_long_about().is_none() {
            missing.push(format!("{sub_path}: no description"));
        }
        missing_help(sub, &sub_path, missing);
    }
}

#[test]
fn every_command_and_argument_has_a_help_text() {
    let mut missing = Vec::new();
    missing_help(&Cli::command(), "coloc", &mut missing);
    assert!(missing.is_empty(), "without help: {missing:#?}");
}

#[test]
fn the_check_finds_an_argument_without_help() {
    let command = clap::Command::new("probe")
        .arg(clap::Arg::new("said").long("said").help("has a help text"))
        .arg(clap::Arg::new("silent").long("silent"));
    let mut missing = Vec::new();
    missing_help(&command, "probe", &mut missing);
    assert_eq!(missing, vec!["probe: argument silent".to_string()]);
}
