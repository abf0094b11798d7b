//! The shape of one message line on stderr, shared by the log formatter
//! and the lines the tools print themselves: `tool: level: ` in text (the
//! level in colour on a terminal), tracing's JSON envelope otherwise.

use tracing::Level;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};

/// The word a level is shown with in text.
fn level_word(level: Level) -> &'static str {
    match level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    }
}

/// `tool: level: `, the start of every message in text, the level in
/// colour when `ansi` (errors bold red, warnings yellow).
pub(super) fn text_prefix(tool: &str, level: Level, ansi: bool) -> String {
    let word = level_word(level);
    let colour = match level {
        Level::ERROR => "\x1b[1;31m",
        Level::WARN => "\x1b[33m",
        _ => "",
    };
    if ansi && !colour.is_empty() {
        format!("{tool}: {colour}{word}\x1b[0m: ")
    } else {
        format!("{tool}: {word}: ")
    }
}

/// Colours only on a terminal, and not with NO_COLOR set (no-color.org).
pub(super) fn colours_on_stderr() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// A message in tracing's JSON shape (`timestamp`, `level`, `fields` with
/// `message`), for lines the tools print themselves.
pub fn json_message(level: Level, message: &str, mut fields: serde_json::Value) -> String {
    let mut timestamp = String::new();
    let _ = SystemTime.format_time(&mut Writer::new(&mut timestamp));
    fields["message"] = message.into();
    serde_json::json!({
        "timestamp": timestamp,
        "level": level.as_str(),
        "fields": fields,
    })
    .to_string()
}
