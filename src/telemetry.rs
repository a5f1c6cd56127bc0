//! Logging: `LOG_LEVEL` (envoyproxy/ratelimit's names, any case, or a full tracing filter directive) and
//! `LOG_FORMAT` (`text` or `json`).

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. Logs go to stderr so `tollgate query` output stays clean on stdout.
pub fn init(level: &str, format: &str) {
    let filter = EnvFilter::try_new(level.to_ascii_lowercase()).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // Colour only on a terminal: escape codes in a log file or a collector break parsing.
        .with_ansi(std::io::stderr().is_terminal());
    // A second init (tests) is harmless: the first subscriber stays.
    let _ = if format.eq_ignore_ascii_case("json") {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}
