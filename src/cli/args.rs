//! The command lines of `sender` and `receiver`: one definition, used by the
//! binaries to parse and by `rdma-xfer-gen` to write man pages and shell
//! completions.

use super::{parse_size_arg, parse_timeout_arg, resolve};
use crate::engine::receiver::{
    AllowedNet, DEFAULT_MAX_SESSIONS, DEFAULT_WRITER_THREADS, ReceiverConfig,
};
use crate::engine::sender::{DEFAULT_STDIN_NAME, SenderConfig};
use crate::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, DEFAULT_SLOTS, check_buffers};
use crate::error::XferError;
use crate::proto::DEFAULT_MAX_FILES;
use crate::proto::{DigestAlg, validate_path};
use clap::{CommandFactory, ValueHint};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

/// How log lines (and the per-file lines) on stderr look.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Options both tools share (flattened into each tool's arguments).
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// Spin on the completion queue instead of sleeping on events.
    #[arg(long)]
    pub busy_poll: bool,
    /// Seconds without progress (or to connect/accept) before giving up.
    #[arg(long, value_name = "SECS", value_parser = parse_timeout_arg, default_value = "30")]
    pub timeout: Duration,
    /// More log output (-v info, -vv debug; -v also prints peak RSS).
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Only errors on stderr (no per-file lines, no progress bars).
    #[arg(short, long)]
    pub quiet: bool,
    /// Log lines as text, or as one JSON object per line (with the session
    /// and file spans) for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Results for scripts: one JSON object per file on stdout (name, bytes,
    /// seconds, mib_per_s, digest, status, exit_code), flushed at once.
    #[arg(long)]
    pub json: bool,
    /// File holding the shared secret that authenticates the sender to the
    /// receiver (trailing whitespace ignored). Overrides RDMA_XFER_TOKEN.
    #[arg(long, value_name = "PATH", value_hint = ValueHint::FilePath)]
    pub token_file: Option<PathBuf>,
}

/// What both tools' `--help` says about their output.
macro_rules! output_help {
    () => {
        concat!(
            "Output:\n",
            "  one line per file on stderr (none with -q);\n",
            "  progress bars (per file and overall) while stderr is a terminal, not with -q\n",
            "  or --log-format json;\n",
            "  --json: one JSON object per file on stdout, flushed at once (see the README)."
        )
    };
}

#[derive(clap::Parser, Debug)]
#[command(
    name = "sender",
    version,
    about = "Send files over RDMA to a running `receiver`.",
    long_about = "Send files over RDMA to a running `receiver`. All files go in one session, in \
order; each is acknowledged only after the receiver verified its digest, fsynced it and renamed \
it into place. A refused file (say, it exists there) does not stop the others; the exit code is \
the first failure's.",
    after_help = concat!(
        "Examples:\n",
        "  sender 10.0.0.1 data.bin\n",
        "  sender --verify sha256 recv-host a.bin b.bin\n",
        "  sender --source 10.0.0.2 --port 7471 10.0.0.1 data.bin\n",
        "  sender --token-file /etc/rdma-xfer/token 10.0.0.1 data.bin\n",
        "  sender -r 10.0.0.1 results/ notes.txt\n",
        "  tar -C src -cf - . | sender 10.0.0.1 - --name src.tar\n",
        "  RDMA_XFER_TOKEN=\"$(cat token)\" sender 10.0.0.1 data.bin\n",
        "  sender --json 10.0.0.1 a.bin b.bin | jq -c 'select(.status != \"ok\")'\n\n",
        output_help!(),
        "\n\n",
        crate::exit_codes_help!()
    )
)]
pub struct SenderArgs {
    /// Receiver's address: IPv4, IPv6 or host name.
    #[arg(value_hint = ValueHint::Hostname)]
    pub addr: String,
    /// Files to send, in order, in one session; `-` is standard input (of
    /// any length), directories need -r (they arrive under their own name).
    #[arg(required = true, value_hint = ValueHint::AnyPath)]
    pub files: Vec<PathBuf>,
    /// Send directories as trees: every file and directory below them
    /// (symbolic links inside are skipped unless --follow-links).
    #[arg(short, long)]
    pub recursive: bool,
    /// Follow symbolic links inside trees (links named on the command line
    /// are always followed).
    #[arg(long)]
    pub follow_links: bool,
    /// Keep modes and modification times of files and directories (without
    /// it the receiver's umask applies, as with scp; setuid, setgid and
    /// sticky bits are never kept).
    #[arg(short, long, visible_alias = "preserve-times")]
    pub preserve: bool,
    /// Name standard input (`-`) arrives under on the receiver [default: stdin].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Local address to connect from (picks the RDMA device and port).
    #[arg(long, value_name = "ADDR")]
    pub source: Option<IpAddr>,
    /// Receiver's port.
    #[arg(long, default_value_t = 7471)]
    pub port: u16,
    /// Whole-file digest checked by the receiver before it acknowledges
    /// [default: crc32; sha256 with a token, which requires it]
    #[arg(long, value_enum)]
    pub verify: Option<Verify>,
    /// RDMA writes kept in flight (each uses one staging buffer).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DEPTH)]
    pub depth: u32,
    /// Size of each staging buffer / write (K, M, G suffixes); the
    /// receiver's slot size caps it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, default_value_t = DEFAULT_CHUNK_SIZE as u64)]
    pub chunk_size: u64,
    /// If the transfer fails, the receiver keeps what it verified; sent
    /// again with --resume, a file continues where it stopped, and a file
    /// the receiver has complete (same size, mtime and SHA-256) is skipped. Also
    /// carries modification times, which identify the source.
    #[arg(long)]
    pub resume: bool,
    /// After a failure that may be transient (peer lost, timeout, cannot
    /// connect), connect again up to N times, pausing 1, 2, 4 ... 30 s, and
    /// send what was not acknowledged (implies --resume). Refusals and
    /// integrity failures are never retried. --retry alone means 5;
    /// --retry=N sets N.
    #[arg(long, value_name = "N", num_args = 0..=1, require_equals = true, default_missing_value = "5", default_value_t = 0)]
    pub retry: u32,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// `--verify`: the whole-file digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Verify {
    Crc32,
    Sha256,
}

impl From<Verify> for DigestAlg {
    fn from(v: Verify) -> Self {
        match v {
            Verify::Crc32 => DigestAlg::Crc32,
            Verify::Sha256 => DigestAlg::Sha256,
        }
    }
}

#[derive(clap::Parser, Debug)]
#[command(
    name = "receiver",
    version,
    about = "Receive files over RDMA from `sender`.",
    long_about = "Receive files over RDMA from `sender`. Each file is written to a temporary \
file in --dir, fsynced, checked against the sender's digest and only then renamed to its \
final name. Without --once it serves senders (several at once) until SIGINT/SIGTERM.",
    after_help = concat!(
        "Examples:\n",
        "  receiver --dir /data/incoming\n",
        "  receiver --once --bind 10.0.0.1 --port 7471 --dir .\n",
        "  receiver --token-file /etc/rdma-xfer/token --dir /data/incoming\n",
        "  receiver --max-size 100G --max-sessions 4 --dir /data/incoming\n",
        "  receiver --allow 10.0.0.0/24 --dir /data/incoming\n",
        "  receiver --once --json --dir /data/incoming > results.jsonl\n",
        "  receiver --once --stdout | tar -C dst -xpf -\n\n",
        output_help!(),
        "\n\n",
        crate::exit_codes_help!()
    )
)]
pub struct ReceiverArgs {
    /// Local address to listen on (IPv4 or IPv6).
    #[arg(long, value_name = "ADDR", default_value = "0.0.0.0")]
    pub bind: IpAddr,
    /// Port to listen on.
    #[arg(long, default_value_t = 7471)]
    pub port: u16,
    /// Output directory.
    #[arg(long, default_value = ".", value_hint = ValueHint::DirPath)]
    pub dir: PathBuf,
    /// Serve one session, then exit with its status.
    #[arg(long)]
    pub once: bool,
    /// Write the one file or stream of the session to standard output
    /// instead of --dir (logs stay on stderr); needs --once.
    #[arg(long, requires = "once", conflicts_with = "json")]
    pub stdout: bool,
    /// Replace existing files (default: refuse them).
    #[arg(long)]
    pub overwrite: bool,
    /// Number of ring slots registered per session.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_SLOTS)]
    pub slots: u32,
    /// Threads per session that write checked chunks into files while the
    /// session checks the next ones (0: the session's thread writes).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WRITER_THREADS, value_parser = clap::value_parser!(u16).range(0..=64))]
    pub threads: u16,
    /// Ring slot size (K, M, G suffixes).
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, default_value_t = DEFAULT_CHUNK_SIZE as u64)]
    pub chunk_size: u64,
    /// Refuse files larger than this (K, M, G suffixes); default: no limit
    /// besides the free space of --dir.
    #[arg(long, value_parser = parse_size_arg, value_name = "SIZE")]
    pub max_size: Option<u64>,
    /// Sessions served at once (each has its own queue pair and ring);
    /// further senders are refused with a "busy" reason.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_SESSIONS as u16, value_parser = clap::value_parser!(u16).range(1..))]
    pub max_sessions: u16,
    /// Most entries (files and directories, refused ones included) one
    /// session may offer; the one past it ends the session.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_FILES, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_files: u64,
    /// Most bytes one session may bring over all its files and streams (K,
    /// M, G suffixes); default: no limit.
    #[arg(long, value_parser = parse_size_arg, value_name = "SIZE")]
    pub max_session_size: Option<u64>,
    /// Accept connections only from this address or network (repeatable,
    /// e.g. --allow 10.0.0.0/24 --allow 10.0.1.7); others are refused
    /// before anything is sent to them. Default: from anywhere.
    #[arg(long, value_name = "ADDR[/PREFIX]")]
    pub allow: Vec<AllowedNet>,
    /// Remove partial files kept for `sender --resume` (and temporary files
    /// left by a crash) once they were not written to for this long
    /// (s, m, h, d), at start-up and between sessions.
    #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_duration, default_value = "24h")]
    pub partial_ttl: Duration,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// Longest `--timeout` accepted: deadlines are computed as "now + timeout",
/// which must not overflow, and a week without progress is already no
/// timeout at all.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

impl CommonArgs {
    /// Checks the options both tools share (the token is loaded separately,
    /// see [`CommonArgs::token`]).
    fn check(&self) -> Result<(), XferError> {
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(XferError::Usage(format!(
                "--timeout must be between 1 and {} seconds, got {}",
                MAX_TIMEOUT.as_secs(),
                self.timeout.as_secs()
            )));
        }
        Ok(())
    }
}

/// A port to connect to or listen on: 0 would mean "any port", which no
/// sender could find.
fn check_port(port: u16) -> Result<(), XferError> {
    if port == 0 {
        return Err(XferError::Usage(
            "--port must be between 1 and 65535".into(),
        ));
    }
    Ok(())
}

impl SenderArgs {
    /// The engine's configuration for these arguments, every option checked:
    /// chunk size and depth, timeout, port, `--name` (a relative path the
    /// receiver will accept, and only with `-` among the files), the token
    /// (`--token-file` or RDMA_XFER_TOKEN) and the receiver's address
    /// (resolved here; a name that does not resolve is a connect error).
    /// The progress observer is left at its default; the tool sets its own.
    pub fn to_config(&self) -> Result<SenderConfig, XferError> {
        let (chunk_size, depth) = check_buffers(self.chunk_size, self.depth as u64, "--depth")?;
        self.common.check()?;
        check_port(self.port)?;
        if let Some(name) = &self.name {
            if !self.files.iter().any(|f| f.as_os_str() == "-") {
                return Err(XferError::Usage(
                    "--name names standard input, which is sent only when `-` is among the files"
                        .into(),
                ));
            }
            validate_path(name)
                .map_err(|e| XferError::Usage(format!("invalid --name {name:?}: {e}")))?;
        }
        if self.addr.trim().is_empty() {
            return Err(XferError::Usage("the receiver's address is empty".into()));
        }
        let token = self.common.token()?;
        let ack_timeout = self.common.ack_timeout()?;
        let mut cfg = SenderConfig::new(resolve(&self.addr, self.port)?);
        cfg.ack_timeout = ack_timeout;
        cfg.source = self.source;
        cfg.chunk_size = chunk_size;
        cfg.depth = depth;
        // With a token the digest is authenticated (sealed FIN), so it must
        // resist deliberate changes: CRC32 does not (it can be kept while
        // the data is altered).
        cfg.verify = match (self.verify, token.is_some()) {
            (None, false) => DigestAlg::Crc32,
            (None, true) | (Some(Verify::Sha256), _) => DigestAlg::Sha256,
            (Some(Verify::Crc32), false) => DigestAlg::Crc32,
            (Some(Verify::Crc32), true) => {
                return Err(XferError::Usage(
                    "--verify crc32 with a token: CRC32 does not detect deliberate changes to \
                     the data, so an authenticated transfer uses sha256 (the default with a \
                     token)"
                        .into(),
                ));
            }
        };
        cfg.busy_poll = self.common.busy_poll;
        cfg.timeout = self.common.timeout;
        cfg.token = token;
        cfg.walk.recursive = self.recursive;
        cfg.walk.follow_links = self.follow_links;
        cfg.walk.preserve = self.preserve;
        cfg.resume = self.resume || self.retry > 0;
        cfg.retries = self.retry;
        // A resumed file is recognised by its size and modification time.
        cfg.walk.times = cfg.resume;
        cfg.walk.stdin_name = self
            .name
            .clone()
            .unwrap_or_else(|| DEFAULT_STDIN_NAME.into());
        Ok(cfg)
    }
}

impl ReceiverArgs {
    /// The engine's configuration for these arguments, every option checked:
    /// slot size and count, timeout, port, `--stdout` only with `--once`,
    /// `--max-sessions` at least 1, and the token (`--token-file` or
    /// RDMA_XFER_TOKEN). The output directory is opened (and checked) by the
    /// engine. The progress observer is left at its default.
    pub fn to_config(&self) -> Result<ReceiverConfig, XferError> {
        let (chunk_size, slots) = check_buffers(self.chunk_size, self.slots as u64, "--slots")?;
        self.common.check()?;
        check_port(self.port)?;
        if self.stdout && !self.once {
            return Err(XferError::Usage(
                "--stdout needs --once (standard output takes one session's stream)".into(),
            ));
        }
        if self.max_sessions == 0 {
            return Err(XferError::Usage("--max-sessions must be at least 1".into()));
        }
        let token = self.common.token()?;
        let mut cfg = ReceiverConfig::new(SocketAddr::new(self.bind, self.port), self.dir.clone());
        cfg.ack_timeout = self.common.ack_timeout()?;
        cfg.once = self.once;
        cfg.stdout = self.stdout;
        cfg.overwrite = self.overwrite;
        cfg.max_size = self.max_size.unwrap_or(u64::MAX);
        cfg.max_sessions = self.max_sessions.into();
        cfg.max_files = self.max_files;
        cfg.max_session_bytes = self.max_session_size.unwrap_or(u64::MAX);
        cfg.slots = slots;
        cfg.chunk_size = chunk_size;
        cfg.busy_poll = self.common.busy_poll;
        cfg.timeout = self.common.timeout;
        cfg.token = token;
        cfg.allow = self.allow.clone();
        cfg.partial_ttl = self.partial_ttl;
        cfg.threads = usize::from(self.threads);
        Ok(cfg)
    }
}

/// The tools whose man pages and completions `rdma-xfer-gen` writes, by
/// name, with their command definitions.
pub fn commands() -> Vec<clap::Command> {
    vec![SenderArgs::command(), ReceiverArgs::command()]
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn definitions_are_consistent() {
        for cmd in commands() {
            cmd.debug_assert();
        }
    }

    /// The command lines of a `--help`'s "Examples:" block, as argv (from
    /// the command's name on: leading VAR=value assignments dropped; cut at
    /// a pipe or redirection).
    fn examples(cmd: &mut clap::Command) -> Vec<Vec<String>> {
        let name = cmd.get_name().to_string();
        let help = cmd.render_help().to_string();
        let block = help
            .split("Examples:\n")
            .nth(1)
            .and_then(|rest| rest.split("\n\n").next())
            .expect("an Examples: block");
        block
            .lines()
            .map(|line| {
                let start = line.find(&format!("{name} ")).unwrap_or(0);
                line[start..]
                    .split_whitespace()
                    .take_while(|w| !matches!(*w, "|" | ">"))
                    .map(str::to_string)
                    .collect()
            })
            .collect()
    }

    #[test]
    fn help_examples_parse() {
        for mut cmd in commands() {
            let name = cmd.get_name().to_string();
            let examples = examples(&mut cmd);
            assert!(examples.len() >= 4, "{name}: {examples:?}");
            for argv in examples {
                assert_eq!(argv[0], name, "{argv:?}");
                if let Err(e) = cmd.clone().try_get_matches_from(&argv) {
                    panic!("{argv:?} does not parse: {e}");
                }
            }
        }
    }

    #[test]
    fn json_option_on_both() {
        let s = SenderArgs::try_parse_from(["sender", "--json", "h", "f"]).unwrap();
        assert!(s.common.json);
        assert_eq!(s.verify, None);
        let r = ReceiverArgs::try_parse_from(["receiver", "--once", "--json"]).unwrap();
        assert!(r.common.json && r.once);
    }

    #[test]
    fn names_are_the_binaries() {
        let names: Vec<String> = commands()
            .iter()
            .map(|c| c.get_name().to_string())
            .collect();
        assert_eq!(names, ["sender", "receiver"]);
    }
    fn sender(args: &[&str]) -> Result<SenderConfig, XferError> {
        let argv = std::iter::once("sender").chain(args.iter().copied());
        SenderArgs::try_parse_from(argv)
            .expect("parses")
            .to_config()
    }

    fn receiver(args: &[&str]) -> Result<ReceiverConfig, XferError> {
        let argv = std::iter::once("receiver").chain(args.iter().copied());
        ReceiverArgs::try_parse_from(argv)
            .expect("parses")
            .to_config()
    }

    /// A usage error whose message contains `what`.
    fn usage<T>(result: Result<T, XferError>, what: &str) {
        match result {
            Err(e @ XferError::Usage(_)) => assert!(e.to_string().contains(what), "{e}"),
            Err(e) => panic!("expected a usage error about {what:?}, got {e:?}"),
            Ok(_) => panic!("expected a usage error about {what:?}, got a configuration"),
        }
    }

    fn token_file(dir: &std::path::Path, content: &[u8]) -> String {
        use std::os::unix::fs::PermissionsExt;
        let p = dir.join("token");
        std::fs::write(&p, content).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        p.to_str().unwrap().to_string()
    }

    /// CRC32 by default; SHA-256 with a token, which refuses CRC32 (a
    /// sealed FIN must carry a digest that resists deliberate changes).
    #[test]
    fn the_digest_follows_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let token = token_file(dir.path(), b"a-secret-of-some-length\n");
        let t = ["--token-file", token.as_str()];
        let with = |extra: &[&str]| {
            let mut args: Vec<&str> = extra.to_vec();
            args.extend(["10.0.0.1", "f"]);
            sender(&args)
        };
        assert_eq!(with(&[]).unwrap().verify, DigestAlg::Crc32);
        assert_eq!(
            with(&["--verify", "sha256"]).unwrap().verify,
            DigestAlg::Sha256
        );
        assert_eq!(with(&t).unwrap().verify, DigestAlg::Sha256);
        let both = [t[0], t[1], "--verify", "sha256"];
        assert_eq!(with(&both).unwrap().verify, DigestAlg::Sha256);
        let crc = [t[0], t[1], "--verify", "crc32"];
        usage(with(&crc), "--verify crc32 with a token");
    }

    #[test]
    fn sender_config_carries_every_option() {
        let dir = tempfile::tempdir().unwrap();
        let token = token_file(dir.path(), b"a-secret-of-some-length\n");
        let cfg = sender(&[
            "--source",
            "127.0.0.2",
            "--port",
            "9000",
            "--verify",
            "sha256",
            "--depth",
            "4",
            "--chunk-size",
            "64K",
            "--busy-poll",
            "--timeout",
            "7",
            "--token-file",
            &token,
            "-r",
            "--follow-links",
            "--preserve-times",
            "--name",
            "dir/in.tar",
            "127.0.0.1",
            "a",
            "-",
        ])
        .unwrap();
        assert_eq!(cfg.addr, "127.0.0.1:9000".parse().unwrap());
        assert_eq!(cfg.source, Some("127.0.0.2".parse().unwrap()));
        assert_eq!((cfg.chunk_size, cfg.depth), (64 << 10, 4));
        assert_eq!(cfg.verify, DigestAlg::Sha256);
        assert!(cfg.busy_poll);
        assert_eq!(cfg.timeout, Duration::from_secs(7));
        assert!(cfg.token.is_some());
        assert!(cfg.walk.recursive && cfg.walk.follow_links && cfg.walk.preserve);
        assert_eq!(cfg.walk.stdin_name, "dir/in.tar");
        assert!(!cfg.resume && cfg.retries == 0 && !cfg.walk.times);
        // --resume carries times; --retry alone is 5 and implies --resume,
        // and takes its count only after `=` (never the address).
        let cfg = sender(&["--resume", "127.0.0.1", "a"]).unwrap();
        assert!(cfg.resume && cfg.walk.times && cfg.retries == 0);
        let cfg = sender(&["--retry", "127.0.0.1", "a"]).unwrap();
        assert!(cfg.resume && cfg.retries == 5);
        assert_eq!(cfg.addr, "127.0.0.1:7471".parse().unwrap());
        let cfg = sender(&["--retry=2", "127.0.0.1", "a"]).unwrap();
        assert_eq!(cfg.retries, 2);
        // Defaults.
        let cfg = sender(&["::1", "-"]).unwrap();
        assert_eq!(cfg.addr, "[::1]:7471".parse().unwrap());
        assert_eq!(
            (cfg.chunk_size, cfg.depth),
            (DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH)
        );
        assert_eq!(cfg.walk.stdin_name, DEFAULT_STDIN_NAME);
        assert!(!cfg.walk.recursive && cfg.source.is_none());
    }

    #[test]
    fn sender_config_refuses_bad_options() {
        usage(sender(&["--chunk-size", "1K", "h", "f"]), "chunk size");
        usage(sender(&["--chunk-size", "65M", "h", "f"]), "chunk size");
        usage(sender(&["--depth", "0", "h", "f"]), "--depth");
        usage(sender(&["--depth", "1025", "h", "f"]), "--depth");
        usage(sender(&["--timeout", "604801", "h", "f"]), "--timeout");
        usage(sender(&["--port", "0", "h", "f"]), "--port");
        usage(sender(&["--name", "x", "h", "f"]), "`-` is among the files");
        for bad in [
            "",
            "/etc/passwd",
            "../up",
            "a/../b",
            "a//b",
            "dir/",
            ".",
            "x\u{1}y",
        ] {
            usage(sender(&["--name", bad, "h", "-"]), "invalid --name");
        }
        usage(sender(&["", "f"]), "address is empty");
        let dir = tempfile::tempdir().unwrap();
        let empty = token_file(dir.path(), b"\n");
        usage(sender(&["--token-file", &empty, "h", "f"]), "is empty");
        let missing = dir.path().join("missing");
        let err = sender(&["--token-file", missing.to_str().unwrap(), "h", "f"]).unwrap_err();
        assert_eq!(err.exit_code(), crate::ExitCode::Io, "{err}");
        // An address that does not resolve cannot be connected to.
        let err = sender(&["no.such.host.invalid", "f"]).unwrap_err();
        assert_eq!(err.exit_code(), crate::ExitCode::NoDeviceOrConnect, "{err}");
    }

    #[test]
    fn receiver_config_carries_every_option() {
        let dir = tempfile::tempdir().unwrap();
        let token = token_file(dir.path(), b"sixteen-bytes-ok");
        let cfg = receiver(&[
            "--bind",
            "::1",
            "--port",
            "9001",
            "--dir",
            "/data",
            "--once",
            "--stdout",
            "--overwrite",
            "--slots",
            "3",
            "--chunk-size",
            "8K",
            "--max-size",
            "1G",
            "--max-sessions",
            "2",
            "--busy-poll",
            "--timeout",
            "9",
            "--token-file",
            &token,
            "--allow",
            "10.0.0.0/24",
            "--allow",
            "[fe80::1]",
            "--max-files",
            "10",
            "--max-session-size",
            "2G",
        ])
        .unwrap();
        assert_eq!(cfg.bind, "[::1]:9001".parse().unwrap());
        let allowed: Vec<String> = cfg.allow.iter().map(ToString::to_string).collect();
        assert_eq!(allowed, ["10.0.0.0/24", "fe80::1/128"]);
        assert_eq!(cfg.dir, PathBuf::from("/data"));
        assert!(cfg.once && cfg.stdout && cfg.overwrite && cfg.busy_poll);
        assert_eq!((cfg.slots, cfg.chunk_size), (3, 8 << 10));
        assert_eq!((cfg.max_size, cfg.max_sessions), (1 << 30, 2));
        assert_eq!((cfg.max_files, cfg.max_session_bytes), (10, 2 << 30));
        assert_eq!(cfg.timeout, Duration::from_secs(9));
        assert!(cfg.token.is_some());
        let cfg = receiver(&[]).unwrap();
        assert_eq!(cfg.bind, "0.0.0.0:7471".parse().unwrap());
        assert_eq!(
            (cfg.slots, cfg.chunk_size),
            (DEFAULT_SLOTS, DEFAULT_CHUNK_SIZE)
        );
        assert_eq!(cfg.max_size, u64::MAX);
        assert_eq!(cfg.max_sessions, DEFAULT_MAX_SESSIONS);
        assert!(!cfg.once && !cfg.stdout && !cfg.overwrite);
        assert!(cfg.allow.is_empty(), "everyone by default");
        assert_eq!(
            (cfg.max_files, cfg.max_session_bytes),
            (1_000_000, u64::MAX)
        );
    }

    #[test]
    fn receiver_config_refuses_bad_options() {
        usage(receiver(&["--chunk-size", "100"]), "chunk size");
        usage(receiver(&["--slots", "0"]), "--slots");
        usage(receiver(&["--slots", "5000"]), "--slots");
        usage(receiver(&["--timeout", "99999999"]), "--timeout");
        usage(receiver(&["--port", "0"]), "--port");
        for bad in ["10.0.0.0/33", "example.org", ""] {
            let err = ReceiverArgs::try_parse_from(["receiver", "--allow", bad]).unwrap_err();
            assert!(err.to_string().contains("--allow"), "{bad:?}: {err}");
        }
        let dir = tempfile::tempdir().unwrap();
        let err = receiver(&["--token-file", dir.path().to_str().unwrap()]).unwrap_err();
        assert!(err.to_string().contains("not a regular file"), "{err}");
        // Built directly (not through clap), the cross-option checks hold too.
        let mut args = ReceiverArgs::try_parse_from(["receiver"]).unwrap();
        args.stdout = true;
        usage(args.to_config(), "--once");
        args.stdout = false;
        args.max_sessions = 0;
        usage(args.to_config(), "--max-sessions");
        args.max_sessions = 1;
        args.common.timeout = Duration::ZERO;
        usage(args.to_config(), "--timeout");
    }
}
