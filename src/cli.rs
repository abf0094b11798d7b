//! What both binaries share: logging set-up, argument parsers and turning a
//! result into an exit code with one clear message.

use crate::error::{ExitCode, XferError};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

/// Options both tools share (flattened into each tool's arguments).
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// Spin on the completion queue instead of sleeping on events.
    #[arg(long)]
    pub busy_poll: bool,
    /// Seconds without progress (or to connect/accept) before giving up.
    #[arg(long, value_parser = parse_timeout_arg, default_value = "30")]
    pub timeout: Duration,
    /// More log output (-v info, -vv debug; -v also prints peak RSS).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Only errors on stderr.
    #[arg(short, long)]
    pub quiet: bool,
}

/// Logs go to stderr; stdout stays free for data. Default shows warnings,
/// `-v` info, `-vv` debug, `-q` only errors. RUST_LOG overrides.
pub fn init_logging(verbose: u8, quiet: bool) {
    let level = if quiet {
        "error"
    } else {
        match verbose {
            0 => "warn",
            1 => "info",
            2 => "debug",
            _ => "trace",
        }
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}

/// clap value parser for sizes with K/M/G suffixes.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s).map_err(|e| e.to_string())
}

/// clap value parser for a timeout in whole seconds (at least 1).
pub fn parse_timeout_arg(s: &str) -> Result<Duration, String> {
    match s.parse::<u64>() {
        Ok(n) if n >= 1 => Ok(Duration::from_secs(n)),
        _ => Err(format!("expected a number of seconds >= 1, got {s:?}")),
    }
}

/// Resolves a host name or IPv4/IPv6 literal with a port.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, XferError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let mut addrs = (host, port)
        .to_socket_addrs()
        .map_err(|e| XferError::Connect {
            addr: format!("{host}:{port}"),
            source: crate::verbs::VerbsError::Invalid(format!("cannot resolve host name: {e}")),
        })?;
    addrs.next().ok_or_else(|| XferError::Connect {
        addr: format!("{host}:{port}"),
        source: crate::verbs::VerbsError::Invalid("host name has no address".into()),
    })
}

/// Prints the error (if any) once, clearly, and returns the exit code. With
/// `-v` it also reports the peak RSS (the memory bound is a promise).
pub fn finish(tool: &str, verbose: u8, result: Result<(), XferError>) -> std::process::ExitCode {
    if verbose > 0 {
        let rss = crate::verbs::os::peak_rss_bytes();
        eprintln!(
            "{tool}: peak RSS {:.1} MiB (peak_rss_bytes={rss})",
            rss as f64 / 1048576.0
        );
    }
    match result {
        Ok(()) => std::process::ExitCode::from(ExitCode::Ok as u8),
        Err(e) => {
            eprintln!("{tool}: error: {e}");
            std::process::ExitCode::from(e.exit_code() as u8)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_parser() {
        assert_eq!(parse_timeout_arg("5"), Ok(Duration::from_secs(5)));
        assert!(parse_timeout_arg("0").is_err());
        assert!(parse_timeout_arg("-1").is_err());
        assert!(parse_timeout_arg("x").is_err());
    }

    #[test]
    fn resolve_literals() {
        assert_eq!(
            resolve("127.0.0.1", 7471).unwrap().to_string(),
            "127.0.0.1:7471"
        );
        assert_eq!(resolve("::1", 7471).unwrap().to_string(), "[::1]:7471");
        assert_eq!(resolve("[::1]", 9).unwrap().to_string(), "[::1]:9");
        assert!(resolve("no.such.host.invalid", 1).is_err());
    }
}
