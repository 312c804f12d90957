//! Logging through tracing: human-readable text on a terminal, JSON for log collectors.

use crate::settings::LogFormat;
use tracing_subscriber::{fmt, EnvFilter};

/// Installs the global subscriber. `RUST_LOG`, when set, overrides `level`.
pub fn init(level: &str, format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    // try_init: a second call (tests) keeps the first subscriber instead of panicking.
    let _ = if format == LogFormat::Json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}
