//! What the binaries share: their command-line definitions (`args`, also
//! used to generate man pages and completions), logging set-up, progress
//! bars (`ui`), how results look as text and JSON (`render`), argument
//! parsers, and turning a result into an exit code with one clear message.
#![forbid(unsafe_code)]

pub mod args;
mod chain;
pub mod doctor;
pub mod generate;
pub mod line;
pub mod log;
mod log_progress;
pub mod render;
pub mod targets;
pub mod ui;

pub use args::{
    CommonArgs, LogFormat, ReceiverArgs, RemotePlan, SendPlan, SenderArgs, Verify,
    parse_sender_args,
};
pub use log::init_logging;

use crate::error::{ExitCode, XferError};
use crate::proto::{MIN_TOKEN_LEN, Token};
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What `--version` prints after the tool's name: the package version,
/// the protocol version (peers must speak the same) and the git commit
/// when the build knew it (`make` passes RXFER_GIT_COMMIT), so that
/// hosts mixing builds can be told apart.
pub fn version() -> &'static str {
    static VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        let commit = option_env!("RXFER_GIT_COMMIT")
            .filter(|c| !c.is_empty())
            .map(|c| format!(", commit {c}"))
            .unwrap_or_default();
        format!(
            "{} (rdma-xfer, protocol {}{commit})",
            env!("CARGO_PKG_VERSION"),
            crate::proto::PROTOCOL_VERSION
        )
    });
    VERSION.as_str()
}

/// Environment variable holding the shared secret (`--token-file` wins).
pub const TOKEN_ENV: &str = "RDMA_XFER_TOKEN";

/// RDMA_XFER_TOKEN as the tool took it out of its environment at start-up
/// (`take_token_env`), for `CommonArgs::token`. Wiped when dropped, never
/// shown.
#[derive(Default)]
pub struct TakenToken {
    /// The variable's value when taken; None: not taken (the environment
    /// is read then, as in tests).
    value: Option<Option<Vec<u8>>>,
    /// Why it could not be taken out of the environment, if so.
    left: Option<String>,
}

impl std::fmt::Debug for TakenToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TakenToken(<redacted>)")
    }
}

impl Drop for TakenToken {
    fn drop(&mut self) {
        if let Some(Some(bytes)) = &mut self.value {
            // Best effort; black_box keeps the stores from being elided.
            bytes.fill(0);
            std::hint::black_box(&bytes);
        }
    }
}

/// Takes RDMA_XFER_TOKEN out of the process environment
/// (`sys::os::take_env_var`: removed, and its bytes in the environment
/// block wiped): the first thing both tools do, while their main thread is
/// their only one, so that no child process (an --exec command, ssh)
/// inherits it and no process can read it in /proc/PID/environ.
pub fn take_token_env() -> TakenToken {
    match crate::sys::os::take_env_var(TOKEN_ENV) {
        Ok(value) => TakenToken {
            value: Some(value.map(OsString::into_vec)),
            left: None,
        },
        Err(e) => TakenToken {
            value: None,
            left: Some(format!("{TOKEN_ENV} stays in the environment: {e}")),
        },
    }
}

impl CommonArgs {
    /// The shared secret from `--token-file` or RDMA_XFER_TOKEN (as
    /// `take_token_env` took it, else from the environment), else, with
    /// `defaults`, from the first default location that holds one
    /// (`default_token_paths`).
    pub fn token(&self, defaults: bool) -> Result<Option<Token>, XferError> {
        if let Some(why) = &self.taken_token.left {
            tracing::warn!("{why}");
        }
        let env = match &self.taken_token.value {
            Some(taken) => taken.clone().map(OsString::from_vec),
            None => std::env::var_os(TOKEN_ENV),
        };
        Ok(find_token(self.token_file.as_deref(), env, defaults)?.map(|(token, _)| token))
    }

    /// The ACK timeout from RDMA_XFER_ACK_TIMEOUT (a bad value is a usage
    /// error).
    pub fn ack_timeout(&self) -> Result<crate::engine::AckTimeout, XferError> {
        crate::engine::parse_ack_timeout(
            std::env::var_os(crate::engine::ACK_TIMEOUT_ENV).as_deref(),
        )
    }
}

/// The token a sender or receiver uses, and where it came from: `file`
/// (which wins), else `env` (RDMA_XFER_TOKEN's value), else, with
/// `defaults`, the first default place that holds one.
pub fn find_token(
    file: Option<&Path>,
    env: Option<OsString>,
    defaults: bool,
) -> Result<Option<(Token, String)>, XferError> {
    let from = match (file, &env) {
        (Some(file), _) => file.display().to_string(),
        (None, Some(_)) => TOKEN_ENV.to_string(),
        (None, None) if defaults => {
            let paths = default_token_paths(
                std::env::var_os("XDG_CONFIG_HOME"),
                std::env::var_os("HOME"),
            );
            let found = load_default_token(&paths)?;
            return Ok(found.map(|(token, path)| (token, path.display().to_string())));
        }
        (None, None) => return Ok(None),
    };
    Ok(load_token(file, env)?.map(|token| (token, from)))
}

/// Where both tools look for a token when neither `--token-file` nor
/// RDMA_XFER_TOKEN gives one, in order: the user's
/// (`$XDG_CONFIG_HOME/rdma-xfer/token`, else `~/.config/...`), then the
/// host's, which the packaged service reads (`/etc/rdma-xfer/token`).
pub fn default_token_paths(xdg_config: Option<OsString>, home: Option<OsString>) -> Vec<PathBuf> {
    let user = xdg_config
        .filter(|x| Path::new(x).is_absolute())
        .map(PathBuf::from)
        .or_else(|| {
            home.filter(|h| Path::new(h).is_absolute())
                .map(|h| PathBuf::from(h).join(".config"))
        });
    user.map(|dir| dir.join("rdma-xfer").join("token"))
        .into_iter()
        .chain([PathBuf::from("/etc/rdma-xfer/token")])
        .collect()
}

/// The token of the first of `paths` that exists, and that path. One
/// this user may not read (the service's, say) is passed over with a
/// warning; anything else wrong with it fails as `--token-file` would.
pub fn load_default_token(paths: &[PathBuf]) -> Result<Option<(Token, PathBuf)>, XferError> {
    for path in paths {
        match std::fs::File::open(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                tracing::warn!(
                    "cannot read the token in {} ({e}): going on without it",
                    path.display()
                );
                continue;
            }
            _ => {
                tracing::info!("the token from {}", path.display());
                return Ok(load_token(Some(path), None)?.map(|token| (token, path.clone())));
            }
        }
    }
    Ok(None)
}

/// Loads the token: the file wins over the environment value. Trailing
/// whitespace (the newline of `echo secret > file`) is dropped; an empty
/// token, or one shorter than `MIN_TOKEN_LEN` bytes (guessable offline
/// from a recorded handshake), is a usage error, an unreadable file an I/O
/// error. The token's bytes never appear in a message.
pub fn load_token(file: Option<&Path>, env: Option<OsString>) -> Result<Option<Token>, XferError> {
    let (bytes, source) = match (file, env) {
        (Some(path), _) => {
            let ctx = || format!("cannot read token file {}", path.display());
            let meta = std::fs::metadata(path).map_err(|e| XferError::io(ctx(), e))?;
            if !meta.is_file() {
                return Err(XferError::Usage(format!(
                    "token file {} is not a regular file",
                    path.display()
                )));
            }
            let mode = meta.permissions().mode();
            if exposed_to_others(mode) {
                tracing::warn!(
                    "token file {} is readable by group or others (mode {:o}); \
                     `chmod 600 {}` keeps the secret to its owner",
                    path.display(),
                    mode & 0o777,
                    path.display()
                );
            }
            let bytes = std::fs::read(path).map_err(|e| XferError::io(ctx(), e))?;
            (bytes, format!("token file {}", path.display()))
        }
        (None, Some(value)) => (value.into_vec(), TOKEN_ENV.to_string()),
        (None, None) => return Ok(None),
    };
    let len = bytes.trim_ascii_end().len();
    let mut bytes = bytes;
    // Wipe the trimmed tail too; Token::new wipes the rest.
    bytes[len..].fill(0);
    bytes.truncate(len);
    if (1..MIN_TOKEN_LEN).contains(&len) {
        bytes.fill(0);
        return Err(XferError::Usage(format!(
            "{source} holds a token of {len} bytes: a token must be at least {MIN_TOKEN_LEN} \
             bytes; make a good one with `rdma-xfer-gen token FILE`"
        )));
    }
    match Token::new(bytes) {
        Some(token) => Ok(Some(token)),
        None => Err(XferError::Usage(format!(
            "{source} is empty: the token must not be empty (make one with `rdma-xfer-gen token FILE`)"
        ))),
    }
}

/// Makes a new token (`rdma-xfer-gen token FILE`): the text of
/// [`one_time_token`](crate::engine::remote::one_time_token) (32 random
/// bytes as 64 lowercase hex digits) and a newline, in a file created
/// with mode 0600 (O_CREAT|O_EXCL with the mode: never a moment with a
/// wider one). An existing file is never replaced (a usage error: it may
/// be the token in use); the directory must exist.
pub fn create_token_file(path: &Path) -> Result<(), XferError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    // Both copies of the secret are wiped when they drop.
    let text = {
        let (_, hex) = crate::engine::remote::one_time_token()?;
        let mut text = zeroize::Zeroizing::new(Vec::with_capacity(hex.len() + 1));
        text.extend_from_slice(hex.as_bytes());
        text.push(b'\n');
        text
    };
    let created = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path);
    let mut file = match created {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            return Err(XferError::Usage(format!(
                "{} exists: a token file is never replaced (it may be the token in use); \
                 remove it first or give another name",
                path.display()
            )));
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.display().to_string(),
                _ => ".".into(),
            };
            return Err(XferError::Usage(format!(
                "cannot create token file {}: directory {parent} does not exist",
                path.display()
            )));
        }
        Err(e) => {
            return Err(XferError::io(
                format!("cannot create token file {}", path.display()),
                e,
            ));
        }
    };
    let written = file.write_all(&text).and_then(|()| file.sync_all());
    drop(text);
    if let Err(e) = written {
        // Half a token is no token: nothing is left to be mistaken for one.
        let _ = std::fs::remove_file(path);
        return Err(XferError::io(
            format!("cannot write token file {}", path.display()),
            e,
        ));
    }
    Ok(())
}

/// Whether file permission bits let group or others read the file.
pub fn exposed_to_others(mode: u32) -> bool {
    mode & 0o044 != 0
}

/// clap value parser for sizes with K/M/G suffixes.
pub fn parse_size_arg(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s).map_err(|e| e.to_string())
}

/// clap value parser for a timeout: seconds, or a number with s, m, h or
/// d (at least 1 s; `CommonArgs::check` bounds it above).
pub fn parse_timeout_arg(s: &str) -> Result<Duration, String> {
    crate::units::parse_duration(s)
}

pub use crate::engine::resolve;

/// Prints the error (if any) once, clearly, and returns the exit code. With
/// `-v` it also reports the peak RSS (the memory bound is a promise) and
/// the CPU time used (what a byte costs). With JSON logs both are JSON
/// objects too.
pub fn finish(
    tool: &str,
    args: &CommonArgs,
    result: Result<(), XferError>,
) -> std::process::ExitCode {
    let json = args.log_format == LogFormat::Json;
    if args.verbose > 0 {
        let rss = crate::sys::os::peak_rss_bytes();
        let (user, system) = crate::sys::os::cpu_times();
        let (user, system) = (user.as_secs_f64(), system.as_secs_f64());
        if json {
            let fields = serde_json::json!({
                "tool": tool, "peak_rss_bytes": rss, "cpu_user_s": user, "cpu_system_s": system,
            });
            eprintln!(
                "{}",
                line::json_message(tracing::Level::INFO, "peak rss", fields)
            );
        } else {
            eprintln!(
                "{tool}: info: peak RSS {:.1} MiB (peak_rss_bytes={rss}), CPU {user:.3} s user + \
                 {system:.3} s system (cpu_s={:.3})",
                rss as f64 / 1048576.0,
                user + system
            );
        }
    }
    match result {
        Ok(()) => std::process::ExitCode::from(ExitCode::Ok as u8),
        Err(e) => {
            if let Some(line) = log::error_line(tool, &e, json) {
                eprintln!("{line}");
            }
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
        assert_eq!(parse_timeout_arg("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_timeout_arg("1d"), Ok(Duration::from_secs(86400)));
    }

    fn env(s: &str) -> Option<OsString> {
        Some(OsString::from(s))
    }

    fn write_token(dir: &Path, name: &str, content: &[u8], mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn default_tokens_are_the_users_then_the_hosts() {
        let etc = PathBuf::from("/etc/rdma-xfer/token");
        assert_eq!(
            default_token_paths(env("/x"), env("/home/u")),
            [PathBuf::from("/x/rdma-xfer/token"), etc.clone()]
        );
        assert_eq!(
            default_token_paths(None, env("/home/u")),
            [
                PathBuf::from("/home/u/.config/rdma-xfer/token"),
                etc.clone()
            ]
        );
        // Relative values are ignored (as the XDG spec says).
        assert_eq!(
            default_token_paths(env("rel"), env("also-rel")),
            std::slice::from_ref(&etc)
        );
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("none");
        assert!(
            load_default_token(std::slice::from_ref(&missing))
                .unwrap()
                .is_none()
        );
        let first = write_token(dir.path(), "first", b"the-first-token-of-two\n", 0o600);
        let second = write_token(dir.path(), "second", b"the-second-token-of-two", 0o600);
        let (t, from) = load_default_token(&[missing, first.clone(), second])
            .unwrap()
            .unwrap();
        assert_eq!(from, first);
        let nonce = [1u8; crate::proto::NONCE_LEN];
        let want = Token::new(b"the-first-token-of-two".to_vec()).unwrap();
        assert_eq!(t.mac(&nonce), want.mac(&nonce));
        // A bad one fails as --token-file would, never passed over.
        let short = write_token(dir.path(), "short", b"short", 0o600);
        let err = load_default_token(&[short, first]).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
    }

    #[test]
    fn short_tokens_are_usage_errors_with_a_hint() {
        let dir = tempfile::tempdir().unwrap();
        for content in [&b"x"[..], b"fifteen-bytes!!", b"fifteen-bytes!!\n  "] {
            let f = write_token(dir.path(), "short", content, 0o600);
            let err = load_token(Some(&f), None).unwrap_err();
            assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
            let msg = err.to_string();
            assert!(msg.contains("at least 16 bytes"), "{msg}");
            assert!(msg.contains("rdma-xfer-gen token FILE"), "{msg}");
            assert!(!msg.contains("fifteen"), "token leaked: {msg}");
        }
        let err = load_token(None, env("short-secret")).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
        assert!(
            err.to_string()
                .starts_with("RDMA_XFER_TOKEN holds a token of 12 bytes"),
            "{err}"
        );
        // 16 bytes is enough.
        assert!(load_token(None, env("sixteen-bytes!!!")).unwrap().is_some());
    }

    /// Same token iff the MACs agree.
    fn same(a: &Token, secret: &[u8]) -> bool {
        let n = [9u8; crate::proto::NONCE_LEN];
        a.mac(&n) == Token::new(secret.to_vec()).unwrap().mac(&n)
    }

    #[test]
    fn token_sources_and_precedence() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load_token(None, None).unwrap().is_none());
        let t = load_token(None, env("from-the-environment \n"))
            .unwrap()
            .unwrap();
        assert!(same(&t, b"from-the-environment"));
        let f = write_token(dir.path(), "t", b"from-the-token-file\n\r\t ", 0o600);
        // The file wins over the environment.
        let t = load_token(Some(&f), env("from-the-environment"))
            .unwrap()
            .unwrap();
        assert!(same(&t, b"from-the-token-file"));
        assert!(!same(&t, b"from-the-token-file\n"));
        // Only trailing whitespace goes; leading and inner bytes are the secret.
        let f = write_token(dir.path(), "u", b" a b\x00\xff sixteen bytes\n", 0o600);
        let t = load_token(Some(&f), None).unwrap().unwrap();
        assert!(same(&t, b" a b\x00\xff sixteen bytes"));
    }

    #[test]
    fn empty_or_unreadable_tokens_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        for content in [&b""[..], b"\n", b"  \r\n\t"] {
            let f = write_token(dir.path(), "e", content, 0o600);
            let err = load_token(Some(&f), env("ignored")).unwrap_err();
            assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
            assert!(err.to_string().contains("is empty"), "{err}");
            assert!(err.to_string().contains(&f.display().to_string()), "{err}");
        }
        let err = load_token(None, env("\n")).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage);
        assert!(
            err.to_string().starts_with("RDMA_XFER_TOKEN is empty"),
            "{err}"
        );
        let missing = dir.path().join("missing");
        let err = load_token(Some(&missing), env("x")).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Io, "{err}");
        assert!(err.to_string().contains("cannot read token file"), "{err}");
        let err = load_token(Some(dir.path()), None).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn token_never_in_messages() {
        let err = load_token(None, env(" ")).unwrap_err();
        assert!(!format!("{err} {err:?}").contains("secret"));
        let dir = tempfile::tempdir().unwrap();
        let f = write_token(dir.path(), "s", b"my-secret-of-many-bytes", 0o644);
        let t = load_token(Some(&f), None).unwrap().unwrap();
        assert!(!format!("{t:?}").contains("my-secret"));
    }

    /// A new token: 64 lowercase hex digits and a newline, mode 0600 from
    /// creation, loadable, different each time; never over an existing
    /// file; a missing directory said as such.
    #[test]
    fn new_token_files() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        create_token_file(&a).unwrap();
        let text = std::fs::read_to_string(&a).unwrap();
        assert_eq!(
            text.len(),
            2 * crate::engine::remote::ONE_TIME_TOKEN_BYTES + 1,
            "{text:?}"
        );
        let hex = text.strip_suffix('\n').unwrap();
        assert!(
            hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
            "{text}"
        );
        let mode = std::fs::metadata(&a).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & !0o600, 0, "{mode:o}");
        assert!(load_token(Some(&a), None).unwrap().is_some());
        let b = dir.path().join("b");
        create_token_file(&b).unwrap();
        assert_ne!(std::fs::read(&b).unwrap(), text.as_bytes());
        // An existing file (even an empty one) is left as it is.
        let err = create_token_file(&a).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
        assert!(err.to_string().contains("exists"), "{err}");
        assert_eq!(std::fs::read_to_string(&a).unwrap(), text);
        let missing = dir.path().join("no/such/dir/token");
        let err = create_token_file(&missing).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");
        assert!(err.to_string().contains("no/such/dir"), "{err}");
    }

    #[test]
    fn group_or_world_readable_is_flagged() {
        for (mode, flagged) in [
            (0o600, false),
            (0o400, false),
            (0o700, false),
            (0o620, false),
            (0o640, true),
            (0o604, true),
            (0o644, true),
            (0o100644, true),
            (0o100600, false),
        ] {
            assert_eq!(exposed_to_others(mode), flagged, "{mode:o}");
        }
    }

    #[test]
    fn resolve_literals() {
        assert_eq!(
            resolve("127.0.0.1", 7471).unwrap().to_string(),
            "127.0.0.1:7471"
        );
        assert_eq!(resolve("::1", 7471).unwrap().to_string(), "[::1]:7471");
        assert_eq!(resolve("[::1]", 9).unwrap().to_string(), "[::1]:9");
        let err = resolve("no.such.host.invalid", 1).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{err}");
        assert!(
            err.to_string()
                .starts_with("cannot resolve host name no.such.host.invalid: "),
            "{err}"
        );
        // Both families: IPv4 first, as the receiver listens by default.
        assert!(resolve("localhost", 9).unwrap().is_ipv4());
    }
}
