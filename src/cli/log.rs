//! How messages look on stderr. Text: one line each, `sender: error: ...`,
//! `receiver: warning: ...` (a timestamp and the session/file context only
//! with -v). JSON (`--log-format json`): tracing's JSON objects, and the
//! final error and the resource line in the very same shape.

use super::line::{colours_on_stderr, json_message, text_prefix};
use super::{CommonArgs, LogFormat, ui};
use crate::error::XferError;
use std::fmt;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// The text shape of every message: `tool: level: message`.
struct TextFormat {
    tool: &'static str,
    /// -v: a timestamp first, and the spans the event happened in.
    verbose: bool,
}

impl<S, N> FormatEvent<S, N> for TextFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        if self.verbose {
            SystemTime.format_time(&mut writer)?;
            writer.write_char(' ')?;
        }
        let prefix = text_prefix(
            self.tool,
            *event.metadata().level(),
            writer.has_ansi_escapes(),
        );
        writer.write_str(&prefix)?;
        if self.verbose
            && let Some(scope) = ctx.event_scope()
        {
            for span in scope.from_root() {
                write!(writer, "{}", span.name())?;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>()
                    && !fields.is_empty()
                {
                    write!(writer, "{{{fields}}}")?;
                }
                writer.write_str(": ")?;
            }
        }
        // Several targets (cli::targets): every line says its host.
        if !self.verbose
            && let Some(scope) = ctx.event_scope()
        {
            for span in scope.from_root().filter(|s| s.name() == TARGET_SPAN) {
                let ext = span.extensions();
                if let Some(host) = ext
                    .get::<FormattedFields<N>>()
                    .and_then(|f| f.fields.strip_prefix("host="))
                {
                    write!(writer, "{host}: ")?;
                }
            }
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// The span a target's work runs in when there are several (its `host`
/// field starts each text line).
pub const TARGET_SPAN: &str = "target";

/// Logs go to stderr (around the progress bars, if any); stdout stays free
/// for data. Default shows warnings, `-v` info, `-vv` debug, `-q` only
/// errors. RUST_LOG overrides. Colours only on a terminal (and without
/// NO_COLOR).
pub fn init_logging(tool: &'static str, args: &CommonArgs, ui: &ui::Ui) {
    let level = if args.quiet {
        "error"
    } else {
        match args.verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(ui.log_writer())
        .with_ansi(colours_on_stderr())
        .with_target(false);
    let _ = match args.log_format {
        LogFormat::Text => builder
            .event_format(TextFormat {
                tool,
                verbose: args.verbose > 0,
            })
            .try_init(),
        LogFormat::Json => builder
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .try_init(),
    };
}

/// The final error, as the tool's last line on stderr; None when it was
/// said already (one file that failed, reported as it failed).
pub fn error_line(tool: &str, err: &XferError, json: bool) -> Option<String> {
    let code = err.exit_code();
    let message = match err {
        XferError::FilesFailed { files: 0 | 1, .. } => return None,
        XferError::FilesFailed { failed, files, .. } => {
            format!("{failed} of {files} files failed (each said above)")
        }
        e => e.to_string(),
    };
    if json {
        let mut fields = serde_json::json!({
            "tool": tool,
            "exit_code": code as u8,
            "status": code.as_str(),
            "retryable": err.is_transient(),
        });
        if let Some(reason) = err.reason_code() {
            fields["reason_code"] = reason.into();
        }
        if let XferError::Problems(all) = err {
            fields["problems"] = all.clone().into();
        }
        return Some(json_message(Level::ERROR, &message, fields));
    }
    let prefix = text_prefix(tool, Level::ERROR, colours_on_stderr());
    Some(match err {
        // One line per problem: each is a message of its own.
        XferError::Problems(all) => all
            .iter()
            .map(|p| format!("{prefix}{p}"))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => format!("{prefix}{message}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RejectCode;

    #[test]
    fn error_lines_have_one_shape() {
        let err = XferError::Rejected {
            code: Some(RejectCode::Exists),
            reason: "a.bin exists".into(),
        };
        assert_eq!(
            error_line("sender", &err, false).unwrap(),
            "sender: error: rejected by the receiver (file exists): a.bin exists"
        );
        let v: serde_json::Value =
            serde_json::from_str(&error_line("sender", &err, true).unwrap()).unwrap();
        assert_eq!(v["level"], "ERROR");
        assert_eq!(
            v["fields"]["message"],
            "rejected by the receiver (file exists): a.bin exists"
        );
        assert_eq!(v["fields"]["exit_code"], 4);
        assert_eq!(v["fields"]["status"], "rejected");
        assert_eq!(v["fields"]["reason_code"], "exists");
        assert_eq!(v["fields"]["retryable"], false);
        assert!(v["timestamp"].as_str().is_some_and(|t| t.len() > 10));
        // Several problems: a line each in text, a list in JSON.
        let all = XferError::Problems(vec!["a is missing".into(), "b is a directory".into()]);
        assert_eq!(
            error_line("sender", &all, false).unwrap(),
            "sender: error: a is missing\nsender: error: b is a directory"
        );
        let v: serde_json::Value =
            serde_json::from_str(&error_line("sender", &all, true).unwrap()).unwrap();
        assert_eq!(v["fields"]["exit_code"], 2);
        assert_eq!(v["fields"]["problems"][1], "b is a directory");
        assert_eq!(v["fields"]["message"], "a is missing; b is a directory");
        // Files that failed as the session went on were said one by one:
        // nothing more for one file, the tally for several.
        let failed = |failed, files| XferError::FilesFailed {
            first: Box::new(XferError::Integrity("x".into())),
            failed,
            files,
        };
        assert_eq!(error_line("sender", &failed(1, 1), false), None);
        assert_eq!(
            error_line("sender", &failed(2, 5), false).unwrap(),
            "sender: error: 2 of 5 files failed (each said above)"
        );
        let v: serde_json::Value =
            serde_json::from_str(&error_line("sender", &failed(2, 5), true).unwrap()).unwrap();
        assert_eq!(v["fields"]["exit_code"], 5);
    }
}
