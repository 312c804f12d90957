//! Logging through tracing: human-readable text on a terminal, JSON for log collectors.
//!
//! Logging must never take the service down. Log lines go to stderr through
//! [`LossyStderr`]: a line that cannot be written (the reader of a pipe went away, a full
//! disk) is dropped and counted ([`dropped_log_lines`], exported as a metric), never
//! reported with `eprintln!`, which panics on a closed pipe and would take the task that
//! logged (an RPC, the signal handler) with it.

use std::{
    io::{IsTerminal, Write},
    sync::atomic::{AtomicU64, Ordering},
};

use tracing_subscriber::{fmt, EnvFilter};

use crate::settings::LogFormat;

static DROPPED_LOG_LINES: AtomicU64 = AtomicU64::new(0);

/// Log lines dropped because stderr could not take them, since the process started.
pub fn dropped_log_lines() -> u64 {
    DROPPED_LOG_LINES.load(Ordering::Relaxed)
}

/// Stderr that never fails: what cannot be written is dropped and counted.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        // The formatter hands over one whole line per call.
        if std::io::stderr().lock().write_all(bytes).is_err() {
            DROPPED_LOG_LINES.fetch_add(1, Ordering::Relaxed);
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`. Colours only
/// on a terminal.
pub fn init(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .with_ansi(std::io::stderr().is_terminal())
        .log_internal_errors(false);
    // try_init: a second call (tests) keeps the first subscriber instead of panicking.
    let _ = if format == LogFormat::Json {
        // The span the event happened in, once; not the whole list of its parents too.
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .try_init()
    } else {
        builder.try_init()
    };
}
