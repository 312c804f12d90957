//! Progress bars for long offline work (`coloc eval`, `coloc import`, `coloc calibrate`,
//! `coloc bench`, `coloc simulate`): drawn on stderr only when stderr is a terminal and the
//! command was not asked for `--json`, hidden otherwise, so that logs, pipes and machine
//! output never carry bar characters. The service itself never draws one.

use std::{
    io::IsTerminal,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Set to any value to hide progress bars even on a terminal (scripts under `script`, CI
/// logs captured through a pty).
pub const HIDE_ENV: &str = "COLOC_NO_PROGRESS";

static HIDDEN: AtomicBool = AtomicBool::new(false);

/// Hides every bar of this process from now on: the CLI calls it for `--json` commands,
/// whose output is for programs.
pub fn hide() {
    HIDDEN.store(true, Ordering::Relaxed);
}

/// A bar of `len` steps labelled `what`, visible only where a person watches.
pub fn bar(len: u64, what: &str) -> ProgressBar {
    if !visible() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{msg:>12} [{bar:30}] {pos}/{len} ({elapsed}, eta {eta})")
            .expect("a valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// A spinner for work whose length is not known in advance (training a model).
pub fn spinner(what: &str) -> ProgressBar {
    if !visible() {
        return ProgressBar::hidden();
    }
    let spinner = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    spinner.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"),
    );
    spinner.set_message(what.to_string());
    spinner.enable_steady_tick(Duration::from_millis(120));
    spinner
}

fn visible() -> bool {
    !HIDDEN.load(Ordering::Relaxed)
        && std::env::var_os(HIDE_ENV).is_none()
        && std::io::stderr().is_terminal()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_are_hidden_once_hidden_whatever_the_terminal() {
        hide();
        assert!(bar(10, "eval").is_hidden());
        assert!(spinner("training").is_hidden());
    }
}
