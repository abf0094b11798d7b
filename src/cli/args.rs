//! The command lines of `sender` and `receiver`: one definition, used by the
//! binaries to parse and by `rdma-xfer-gen` to write man pages and shell
//! completions.

use super::{parse_size_arg, parse_timeout_arg, resolve};
use crate::engine::fit::Given;
use crate::engine::receiver::{
    AllowedNet, DEFAULT_MAX_SESSIONS, DEFAULT_WRITER_THREADS, Output, ReceiverConfig,
};
use crate::engine::remote::{LaunchOptions, Target};
use crate::engine::sender::{DEFAULT_STDIN_NAME, SenderConfig};
use crate::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, DEFAULT_SLOTS, check_buffers, entries};
use crate::error::{Problems, XferError};
use crate::proto::DEFAULT_MAX_FILES;
use crate::proto::{DigestAlg, NameRules, Token, validate_path};
use clap::{CommandFactory, ValueHint};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The port both tools use unless told otherwise.
pub const DEFAULT_PORT: u16 = 7471;

/// Headings `--help` groups the options under.
const CONNECTION: &str = "Connection";
const OUTPUT: &str = "Output";
const SECURITY: &str = "Integrity and security";
const PERFORMANCE: &str = "Performance";
const FORMAT: &str = "Output format";
const REMOTE: &str = "One command (receivers started over ssh)";

/// How log lines (and the per-file lines) on stderr look.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    Text,
    Json,
}

/// Options both tools share (flattened into each tool's arguments).
#[derive(clap::Args, Debug)]
pub struct CommonArgs {
    /// Spin on the completion queue instead of sleeping on events (lower
    /// latency, one core busy).
    #[arg(long, help_heading = PERFORMANCE)]
    pub busy_poll: bool,
    /// Time without progress (or to connect/accept) before giving up: a
    /// number of seconds, or with s, m, h or d (at most 7d).
    #[arg(long, value_name = "DURATION", value_parser = parse_timeout_arg, default_value = "30s",
          value_hint = ValueHint::Other, help_heading = CONNECTION)]
    pub timeout: Duration,
    /// More log output: -v adds timestamps, the phases of each file, peak
    /// memory and CPU time; -vv debug.
    #[arg(short, long, action = clap::ArgAction::Count, conflicts_with = "quiet", help_heading = FORMAT)]
    pub verbose: u8,
    /// Only errors on stderr (no per-file lines, no progress bars).
    #[arg(short, long, help_heading = FORMAT)]
    pub quiet: bool,
    /// Log lines as text, or as one JSON object per line (with the session
    /// and file spans) for log collectors.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, help_heading = FORMAT)]
    pub log_format: LogFormat,
    /// Results for scripts: one JSON object per file on stdout (name, bytes,
    /// seconds, mib_per_s, digest, status, exit_code, reason_code,
    /// retryable), flushed at once, and a summary at the end.
    #[arg(long, help_heading = FORMAT)]
    pub json: bool,
    /// File holding the shared secret that authenticates both ends to each
    /// other (trailing whitespace ignored; at least 16 bytes; make one with
    /// `rdma-xfer-gen token FILE`). Overrides RDMA_XFER_TOKEN. A receiver
    /// needs one unless --insecure.
    #[arg(long, value_name = "PATH", value_hint = ValueHint::FilePath, help_heading = SECURITY)]
    pub token_file: Option<PathBuf>,
    /// RDMA_XFER_TOKEN, once the tool took it out of its environment
    /// (`cli::take_token_env`).
    #[arg(skip)]
    pub taken_token: super::TakenToken,
}

/// What both tools' `--help` says about their output.
macro_rules! output_help {
    () => {
        concat!(
            "Output:\n",
            "  one line per file on stderr (none with -q); errors and warnings as\n",
            "  `TOOL: error: ...` and `TOOL: warning: ...`;\n",
            "  progress bars (per file and overall) while stderr is a terminal, not with -q\n",
            "  or --log-format json;\n",
            "  --json: one JSON object per file on stdout, flushed at once, and a summary."
        )
    };
}

/// Environment variables both tools read.
macro_rules! environment_help {
    () => {
        concat!(
            "Environment:\n",
            "  RDMA_XFER_TOKEN        the shared secret (--token-file wins)\n",
            "  RDMA_XFER_ACK_TIMEOUT  the RDMA ACK timeout exponent, 1-31 (4.096 us x 2^N),\n",
            "                         0 for the kernel's choice; unset: chosen per device\n",
            "  RUST_LOG               log filter, overrides -v and -q (e.g. RUST_LOG=debug)\n",
            "  NO_COLOR               when set and not empty: no colours, even on a terminal"
        )
    };
}

#[derive(clap::Parser, Debug)]
#[command(
    name = "sender",
    version,
    about = "Send files over RDMA to HOST:DIR (over ssh) or a running `receiver`.",
    override_usage = "sender [OPTIONS] FILE... [USER@]HOST:DIR...\n       sender [OPTIONS] --hosts LIST FILE...\n       sender [OPTIONS] ADDR FILE...",
    long_about = "Send files over RDMA. `sender FILE... HOST:DIR` starts a receiver on HOST over \
ssh (honouring ~/.ssh/config) with a one-time key, sends, and ends it: nothing to set up there \
but rdma-xfer itself; several targets each get their own receiver and result. `sender ADDR \
FILE...` sends to a receiver already running at ADDR (a service with a token). All files go in \
one session, in order; each is acknowledged only after the receiver verified its digest, fsynced \
it and renamed it into place. A refused file (say, it exists there) does not stop the others; the \
exit code is the first failure's (with several targets, the highest of theirs).",
    after_help = concat!(
        "Examples:\n",
        "  sender ckpt.pt node01:/ckpt/\n",
        "  sender -r dataset/ node01:/data/ node02:/data/ node03:/data/\n",
        "  sender --hosts nodes.txt --parallel 8 image.sqfs\n",
        "  sender -e 'ssh -p 2222' --remote-receiver /opt/rdma-xfer/bin/receiver f.bin me@node01:in\n",
        "  sender 10.0.0.1 data.bin\n",
        "  sender recv-host:7471 a.bin b.bin\n",
        "  sender --verify sha256 '[fd00::1]:7471' data.bin\n",
        "  sender --source 10.0.0.2 10.0.0.1 data.bin\n",
        "  sender --token-file /etc/rdma-xfer/token 10.0.0.1 data.bin\n",
        "  sender -r 10.0.0.1 results/ notes.txt\n",
        "  sender --resume --retry 10.0.0.1 checkpoint.pt\n",
        "  tar -C src -cf - . | sender 10.0.0.1 - --name src.tar\n",
        "  RDMA_XFER_TOKEN=\"$(cat token)\" sender 10.0.0.1 data.bin\n",
        "  sender --json 10.0.0.1 a.bin b.bin | jq -c 'select(.status != \"ok\")'\n\n",
        output_help!(),
        "\n\n",
        environment_help!(),
        "\n\n",
        crate::exit_codes_help!()
    )
)]
pub struct SenderArgs {
    /// The direct form's receiver address (IPv4, IPv6 or host name,
    /// optionally HOST:PORT or [IPV6]:PORT); in the one-command form, the
    /// first file.
    #[arg(value_hint = ValueHint::AnyPath, value_name = "ADDR|FILE")]
    pub addr: String,
    /// Files to send, in order, in one session; `-` is standard input (of
    /// any length), directories need -r (they arrive under their own name).
    /// In the one-command form the last ones are the targets,
    /// [USER@]HOST:DIR: a receiver is started there over ssh for each.
    #[arg(value_hint = ValueHint::AnyPath, value_name = "FILE|[USER@]HOST:DIR")]
    pub files: Vec<PathBuf>,
    /// More targets, one [USER@]HOST:DIR a line (blank lines and lines
    /// starting with # ignored).
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath, help_heading = REMOTE)]
    pub hosts: Option<PathBuf>,
    /// The remote shell that starts each target's receiver, split as a
    /// shell would (e.g. 'ssh -p 2222'); overrides RDMA_XFER_RSH
    /// [default: ssh].
    #[arg(short = 'e', long, value_name = "CMD", value_hint = ValueHint::CommandString,
          help_heading = REMOTE)]
    pub rsh: Option<String>,
    /// The receiver program on the targets, when it is not `receiver` on
    /// their PATH.
    #[arg(long, value_name = "PATH", default_value = "receiver", value_hint = ValueHint::Other,
          help_heading = REMOTE)]
    pub remote_receiver: String,
    /// The address the targets' receivers listen on [default: the RDMA
    /// address the ssh connection arrived at, else one towards the sender,
    /// else the first RDMA address there].
    #[arg(long, value_name = "ADDR", value_hint = ValueHint::Hostname, help_heading = REMOTE)]
    pub remote_bind: Option<String>,
    /// Targets served at once, 1-256.
    #[arg(long, value_name = "N", default_value_t = 4,
          value_parser = clap::value_parser!(u16).range(1..=256), value_hint = ValueHint::Other,
          help_heading = REMOTE)]
    pub parallel: u16,
    /// Receiver's port (also ADDR:PORT) [default: 7471].
    #[arg(long, value_hint = ValueHint::Other, help_heading = CONNECTION)]
    pub port: Option<u16>,
    /// Local address to connect from (picks the RDMA device and port).
    #[arg(long, value_name = "ADDR", value_hint = ValueHint::Hostname, help_heading = CONNECTION)]
    pub source: Option<String>,
    /// After a failure that may be transient (peer lost, timeout, cannot
    /// connect, busy), connect again up to N times, pausing 1, 2, 4 ... 30 s,
    /// and send what was not acknowledged (implies --resume). Refusals and
    /// integrity failures are never retried. --retry alone means 5.
    #[arg(long, value_name = "N", num_args = 0..=1, require_equals = true, default_missing_value = "5",
          default_value_t = 0, value_hint = ValueHint::Other, help_heading = CONNECTION)]
    pub retry: u32,
    /// Send directories as trees: every file and directory below them
    /// (symbolic links inside are skipped unless --follow-links).
    #[arg(short, long, help_heading = OUTPUT)]
    pub recursive: bool,
    /// Follow symbolic links inside trees (needs -r; links named on the
    /// command line are always followed).
    #[arg(long, help_heading = OUTPUT)]
    pub follow_links: bool,
    /// Keep modification times of files and directories, and their modes
    /// if the receiver runs with --keep-modes (otherwise its umask applies,
    /// as with scp; setuid, setgid and sticky bits are never kept).
    #[arg(short, long, visible_alias = "preserve-times", help_heading = OUTPUT)]
    pub preserve: bool,
    /// Relative path standard input (`-`) arrives under [default: stdin].
    #[arg(long, value_name = "NAME", value_hint = ValueHint::Other, help_heading = OUTPUT)]
    pub name: Option<String>,
    /// If the transfer fails, the receiver keeps what it verified; sent
    /// again with --resume, a file continues where it stopped, and a file
    /// the receiver has complete (same size, mtime and SHA-256) is skipped.
    #[arg(long, help_heading = OUTPUT)]
    pub resume: bool,
    /// Whole-file digest checked by the receiver before it acknowledges
    /// [default: crc32; sha256 with a token, which requires it].
    #[arg(long, value_enum, help_heading = SECURITY)]
    pub verify: Option<Verify>,
    /// Send each file's SHA-256 when the receiver asks for it, read before
    /// any data: a file its --link-dest has is linked there instead of
    /// sent; its --exec command gets it as RDMA_XFER_DIGEST.
    #[arg(long, help_heading = OUTPUT)]
    pub checksum: bool,
    /// RDMA writes kept in flight, 1-1024 (each uses one staging buffer);
    /// unless given, fewer where the memlock limit is lower [default: 16]
    #[arg(long, value_name = "N", value_hint = ValueHint::Other, help_heading = PERFORMANCE)]
    pub depth: Option<u32>,
    /// Size of each staging buffer and write, 4K-64M; the receiver's slot
    /// size caps it; unless given, smaller where the memlock limit does not
    /// allow 2 buffers [default: 1M]
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, value_hint = ValueHint::Other,
          help_heading = PERFORMANCE)]
    pub chunk_size: Option<u64>,
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
file in DIR, fsynced, checked against the sender's digest and only then renamed to its \
final name. Without --once it serves senders (several at once) until SIGINT/SIGTERM. It prints \
one line when it is ready: where it listens and where files go. Senders must prove a shared \
token: make one with `rdma-xfer-gen token FILE` and give it to both tools (--token-file FILE); \
--insecure accepts anyone instead.",
    after_help = concat!(
        "Examples:\n",
        "  receiver --token-file /etc/rdma-xfer/token /data/incoming\n",
        "  receiver --token-file token --once --bind 10.0.0.1 --port 7471 --dir .\n",
        "  receiver --token-file token --max-size 100G --max-sessions 4 --dir /data/incoming\n",
        "  receiver --token-file token --allow 10.0.0.0/24 --dir /data/incoming\n",
        "  receiver --token-file token --once --json --dir /data/incoming > results.jsonl\n",
        "  receiver --token-file token --stdout | tar -C dst -xpf -\n",
        "  receiver --insecure --bind 127.0.0.1 --once --discard\n",
        "  receiver --token-file token --link-dest /data/yesterday /data/today\n",
        "  receiver --token-file token --exec 'mkdir -p -- \"$(dirname -- \"$RDMA_XFER_NAME\")\" && zstd -q -o \"$RDMA_XFER_NAME.zst\"' /data/in\n",
        "  receiver --token-file token --exec 'python3 /opt/ingest.py' /data/in\n\n",
        output_help!(),
        "\n\n",
        environment_help!(),
        "\n\n",
        crate::exit_codes_help!()
    )
)]
pub struct ReceiverArgs {
    /// Output directory (as --dir).
    #[arg(value_name = "DIR", value_hint = ValueHint::DirPath, conflicts_with = "dir")]
    pub dir_arg: Option<PathBuf>,
    /// Local address to listen on: IPv4, IPv6 or host name [default:
    /// 0.0.0.0, every device].
    #[arg(long, value_name = "ADDR", value_hint = ValueHint::Hostname, help_heading = CONNECTION)]
    pub bind: Option<String>,
    /// Port to listen on.
    #[arg(long, default_value_t = DEFAULT_PORT, value_hint = ValueHint::Other, help_heading = CONNECTION)]
    pub port: u16,
    /// Serve one session, then exit with its status.
    #[arg(long, help_heading = CONNECTION)]
    pub once: bool,
    /// With --once: how long to wait for the first sender (s, m, h, d)
    /// before giving up with exit 7 [default: forever].
    #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_duration,
          value_hint = ValueHint::Other, help_heading = CONNECTION)]
    pub wait: Option<Duration>,
    /// How `sender FILE... HOST:DIR` starts its receiver over ssh, not
    /// meant to be typed: read a one-time token from standard input,
    /// listen on a free port of the RDMA address the ssh connection came
    /// in on (or --bind), print where on standard output, serve that one
    /// session (waiting at most --timeout for it), and end when it ends or
    /// standard input closes.
    #[arg(long, hide = true)]
    pub ssh_session: bool,
    /// Sessions served at once, 1-65535 (each has its own queue pair and
    /// ring); further senders are refused as "busy". With --insecure one
    /// address holds at most half of them.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_SESSIONS as u16,
          value_parser = clap::value_parser!(u16).range(1..), value_hint = ValueHint::Other,
          help_heading = CONNECTION)]
    pub max_sessions: u16,
    /// Output directory [default: the current directory].
    #[arg(long, value_hint = ValueHint::DirPath, help_heading = OUTPUT)]
    pub dir: Option<PathBuf>,
    /// Write the one file or stream of a session to standard output
    /// instead of a directory (logs stay on stderr); implies --once.
    #[arg(long, conflicts_with = "json", help_heading = OUTPUT)]
    pub stdout: bool,
    /// Check every chunk and verify every file as usual, then drop it:
    /// nothing is written anywhere (no temporary file, no space check; a
    /// directory given is not used). Tells whether the network or the disk
    /// limits a transfer.
    #[arg(long, help_heading = OUTPUT)]
    pub discard: bool,
    /// Give each file to `sh -c CMD`, run in DIR, on its standard input (in
    /// order, never through a file name in CMD): RDMA_XFER_NAME (its
    /// checked relative path, chosen by the sender: quote it, never make
    /// it code), RDMA_XFER_SIZE, RDMA_XFER_PEER and, from a
    /// `sender --checksum`, RDMA_XFER_DIGEST (sha256:HEX) name it, in an
    /// environment otherwise empty but for PATH. It is received only if its
    /// digest matched and CMD exited 0; CMD sees the end of its input only
    /// once the data is verified. Files come one by one.
    #[arg(long, value_name = "CMD", value_hint = ValueHint::CommandString, help_heading = OUTPUT)]
    pub exec: Option<String>,
    /// As rsync's: a file the sender offers with --checksum whose size and
    /// SHA-256 match the file at the same relative path under this
    /// directory is hard-linked from there (copied if its mode or time
    /// differ, or across file systems) instead of sent.
    #[arg(long, value_name = "DIR", value_hint = ValueHint::DirPath, help_heading = OUTPUT)]
    pub link_dest: Option<PathBuf>,
    /// Replace existing files (default: refuse them).
    #[arg(long, help_heading = OUTPUT)]
    pub overwrite: bool,
    /// Keep the permission bits `sender -p` sends as they are (default:
    /// masked with this receiver's umask even with -p, so that no sender
    /// makes a file more open than the umask allows).
    #[arg(long, help_heading = OUTPUT)]
    pub keep_modes: bool,
    /// Remove partial files kept for `sender --resume` (and temporary files
    /// left by a crash) once they were not written to for this long
    /// (s, m, h, d), at start-up and between sessions.
    #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_duration, default_value = "24h",
          value_hint = ValueHint::Other, help_heading = OUTPUT)]
    pub partial_ttl: Duration,
    /// Accept connections only from this address or network (repeatable,
    /// e.g. --allow 10.0.0.0/24 --allow 10.0.1.7); others are refused
    /// before anything is sent to them. Default: from anywhere.
    #[arg(long, value_name = "ADDR[/PREFIX]", value_hint = ValueHint::Other, help_heading = SECURITY)]
    pub allow: Vec<AllowedNet>,
    /// Accept senders without a token: anyone who can reach the port may
    /// send (the listening line says UNAUTHENTICATED, even with -q). Not
    /// with --exec, --link-dest or --overwrite. Without it the receiver
    /// needs a token (rdma-xfer-gen token FILE).
    #[arg(long, help_heading = SECURITY)]
    pub insecure: bool,
    /// Accept names starting with '.' (`.bashrc`, `dir/.ssh/...`), which
    /// are refused by default: a dotfile configures whoever uses the
    /// directory and does not show in `ls`.
    #[arg(long, help_heading = SECURITY)]
    pub allow_dotfiles: bool,
    /// Refuse files larger than this (e.g. 100G); default: no limit
    /// besides the free space of the directory.
    #[arg(long, value_parser = parse_size_arg, value_name = "SIZE", value_hint = ValueHint::Other,
          help_heading = SECURITY)]
    pub max_size: Option<u64>,
    /// Most entries (files and directories, refused ones included) one
    /// session may offer; the one past it ends the session.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_MAX_FILES,
          value_parser = clap::value_parser!(u64).range(1..), value_hint = ValueHint::Other,
          help_heading = SECURITY)]
    pub max_files: u64,
    /// Most bytes one session may bring over all its files and streams
    /// (e.g. 1T); default: no limit.
    #[arg(long, value_parser = parse_size_arg, value_name = "SIZE", value_hint = ValueHint::Other,
          help_heading = SECURITY)]
    pub max_session_size: Option<u64>,
    /// Ring slots registered per session, 1-1024; unless given, fewer
    /// where the memlock limit is lower [default: 16]
    #[arg(long, value_name = "N", value_hint = ValueHint::Other, help_heading = PERFORMANCE)]
    pub slots: Option<u32>,
    /// Ring slot size, 4K-64M; unless given, smaller where the memlock
    /// limit does not allow 2 slots [default: 1M]
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, value_hint = ValueHint::Other,
          help_heading = PERFORMANCE)]
    pub chunk_size: Option<u64>,
    /// Threads per session that write checked chunks into files while the
    /// session checks the next ones, 0-64 (0: the session's thread writes).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_WRITER_THREADS,
          value_parser = clap::value_parser!(u16).range(0..=64), value_hint = ValueHint::Other,
          help_heading = PERFORMANCE)]
    pub threads: u16,
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

/// The sender's ADDR as host and port, as ssh and scp users write it:
/// `host`, `host:port`, `10.0.0.1:7471`, `[fd00::1]:7471`, `[fd00::1]` or
/// a bare IPv6 address. `host:/path` (scp's remote path) is refused with
/// what to do instead: the receiver decides where files go.
pub fn parse_addr(addr: &str) -> Result<(String, Option<u16>), XferError> {
    let a = addr.trim();
    if a.is_empty() {
        return Err(XferError::Usage("the receiver's address is empty".into()));
    }
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(XferError::Usage(format!(
            "{addr:?}: the port must be a number between 1 and 65535"
        ))),
    };
    // ssh's user@host: nobody logs in anywhere here.
    if !a.starts_with('[')
        && let Some((user, rest)) = a.split_once('@')
    {
        return Err(XferError::Usage(format!(
            "{addr:?}: a running receiver is given by its address alone (sender {rest} FILE...); \
             to log in as {user} and start one there, put the target last: sender FILE... \
             {user}@{rest}:DIR"
        )));
    }
    if let Some(rest) = a.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(XferError::Usage(format!(
                "{addr:?}: an IPv6 address in brackets needs its closing `]`"
            )));
        };
        return match after {
            "" => Ok((host.to_string(), None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((host.to_string(), port(p)?)),
                None => Err(XferError::Usage(format!(
                    "{addr:?}: expected [IPV6] or [IPV6]:PORT"
                ))),
            },
        };
    }
    match a.split_once(':') {
        // More than one colon and no brackets: an IPv6 address, no port.
        Some((_, rest)) if rest.contains(':') => Ok((a.to_string(), None)),
        Some((host, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            Ok((host.to_string(), port(p)?))
        }
        Some((host, path)) => Err(XferError::Usage(format!(
            "{addr:?} is a HOST:DIR target: targets come after the files (sender FILE... \
             {host}:{}); the sender sends local files only, it cannot fetch from a host",
            if path.is_empty() { "DIR" } else { path }
        ))),
        None => Ok((a.to_string(), None)),
    }
}

impl SenderArgs {
    /// How the command line's arguments become entries.
    fn walk_options(&self, times: bool) -> entries::WalkOptions {
        entries::WalkOptions {
            recursive: self.recursive,
            follow_links: self.follow_links,
            preserve: self.preserve,
            times,
            stdin_name: self
                .name
                .clone()
                .unwrap_or_else(|| DEFAULT_STDIN_NAME.into()),
        }
    }

    /// The engine's configuration for the direct form (`sender ADDR
    /// FILE...`); the one-command form is a usage error here (see `plan`).
    pub fn to_config(&self) -> Result<SenderConfig, XferError> {
        match self.plan()? {
            SendPlan::Direct { cfg, .. } => Ok(cfg),
            SendPlan::Remote(_) => Err(XferError::Usage(
                "HOST:DIR targets need the one-command form (SenderArgs::plan)".into(),
            )),
        }
    }

    /// The operands as the direct form (ADDR, then files) or the
    /// one-command form (files, then the trailing `[USER@]HOST:DIR`
    /// targets, plus `--hosts`'s).
    fn operands(&self, problems: &mut Problems) -> Operands {
        let all: Vec<PathBuf> = std::iter::once(PathBuf::from(&self.addr))
            .chain(self.files.iter().cloned())
            .collect();
        // A local file is never a target, whatever its name (`12:00.log`,
        // or one planted as `evil.example:x` in a directory sent with *).
        let target_of = |p: &PathBuf| {
            if p.symlink_metadata().is_ok() {
                return None;
            }
            p.to_str().and_then(Target::parse)
        };
        let trailing = all
            .iter()
            .rev()
            .take_while(|p| target_of(p).is_some())
            .count();
        if trailing == 0 && self.hosts.is_none() {
            if self.files.is_empty() {
                problems.add(
                    "no files to send: `sender FILE... HOST:DIR` (a receiver started over ssh) or \
                     `sender ADDR FILE...` (a running receiver)",
                );
            }
            return Operands::Direct;
        }
        let (files, named) = all.split_at(all.len() - trailing);
        let mut targets = Vec::new();
        for t in named.iter().filter_map(target_of) {
            if let Some(t) = problems.check(t) {
                targets.push(t);
            }
        }
        if let Some(list) = &self.hosts {
            targets.extend(hosts_file(list, problems));
        }
        for f in files.iter().filter(|f| target_of(f).is_some()) {
            problems.add(format!(
                "{}: the sender sends local files, not from a remote host (a local name with a \
                 ':' can be given as ./NAME)",
                f.display()
            ));
        }
        if files.is_empty() {
            problems.add("no files to send: the files come before the HOST:DIR targets");
        }
        if targets.is_empty() && problems.is_empty() {
            problems.add("no targets: give [USER@]HOST:DIR after the files, or --hosts FILE");
        }
        if targets.len() > 1 && files.iter().any(|f| f.as_os_str() == "-") {
            problems.add("standard input (-) is read once: it can go to one target only");
        }
        Operands::Remote {
            files: files.to_vec(),
            targets,
        }
    }

    /// What the command line asks for, every option checked and every
    /// problem reported at once (exit 2): chunk size and depth, timeout,
    /// ADDR and port or the targets, `--name` (a relative path the
    /// receiver will accept, and only with `-` among the files),
    /// `--follow-links` only with -r, the token (`--token-file` or
    /// RDMA_XFER_TOKEN; the one-command form makes its own), and with any
    /// of those wrong, the input files too (otherwise the engine checks
    /// them, all at once, before it connects). The direct form's address
    /// is resolved last: a name that does not resolve is a connect error.
    /// The progress observer is left at its default; the tool sets its own.
    pub fn plan(&self) -> Result<SendPlan, XferError> {
        let mut problems = Problems::default();
        let buffers = problems.check(check_buffers(
            self.chunk_size.unwrap_or(DEFAULT_CHUNK_SIZE.into()),
            self.depth.unwrap_or(DEFAULT_DEPTH).into(),
            "--depth",
        ));
        problems.check(self.common.check());
        let operands = self.operands(&mut problems);
        let remote = matches!(operands, Operands::Remote { .. });
        let files: Vec<PathBuf> = match &operands {
            Operands::Direct => self.files.clone(),
            Operands::Remote { files, .. } => files.clone(),
        };
        let target = if remote {
            self.check_remote_options(&mut problems);
            None
        } else {
            for (given, name) in [
                (self.rsh.is_some(), "--rsh"),
                (self.remote_bind.is_some(), "--remote-bind"),
                (self.remote_receiver != "receiver", "--remote-receiver"),
            ] {
                if given {
                    problems.add(format!(
                        "{name} is for [USER@]HOST:DIR targets (receivers started over ssh), not \
                         for a running receiver at {}",
                        self.addr
                    ));
                }
            }
            problems.check(parse_addr(&self.addr))
        };
        let port = match (target.as_ref().and_then(|(_, p)| *p), self.port) {
            (Some(a), Some(b)) if a != b => {
                problems.add(format!(
                    "the port in {:?} ({a}) and --port {b} disagree: give it once",
                    self.addr
                ));
                DEFAULT_PORT
            }
            (a, b) => a.or(b).unwrap_or(DEFAULT_PORT),
        };
        problems.check(check_port(port));
        if let Some(name) = &self.name {
            if !files.iter().any(|f| f.as_os_str() == "-") {
                problems.add(
                    "--name names standard input, which is sent only when `-` is among the files",
                );
            }
            if let Err(e) = validate_path(name, NameRules::ANY_RECEIVER) {
                problems.add(format!("invalid --name {name:?}: {e}"));
            }
        }
        if self.follow_links && !self.recursive {
            problems.add("--follow-links follows links inside trees: it needs -r");
        }
        // Files in trees and among the inputs get the flag; standard input
        // never does, so --checksum with nothing else has no effect.
        if self.checksum && !files.is_empty() && files.iter().all(|f| f.as_os_str() == "-") {
            problems.add(
                "--checksum with only standard input (-): a stream cannot be hashed before it \
                 is sent",
            );
        }
        // `--retry 3 HOST FILE`: the count needs `=`, so 3 became ADDR.
        if !remote && !self.addr.is_empty() && self.addr.bytes().all(|b| b.is_ascii_digit()) {
            problems.add(if self.retry > 0 {
                format!(
                    "{} was taken as the receiver's address: --retry takes its count after \
                     `=` (--retry={})",
                    self.addr, self.addr
                )
            } else {
                format!("{} is a number, not the receiver's address", self.addr)
            });
        }
        // `sender FILE HOST`: the address is a local file and a "file" is not.
        if !remote
            && !self.addr.is_empty()
            && Path::new(&self.addr).exists()
            && self
                .files
                .iter()
                .any(|f| f.as_os_str() != "-" && !f.exists())
        {
            problems.add(format!(
                "{} is a local file, not an address: the receiver's address comes first \
                 (sender ADDR FILE...), or a target last (sender FILE... HOST:DIR)",
                self.addr
            ));
        }
        let source = self.source.as_deref().and_then(|s| {
            problems.check(
                resolve(s, 0)
                    .map(|a| a.ip())
                    .map_err(|e| XferError::Usage(format!("--source {s}: {}", connect_reason(&e)))),
            )
        });
        // The one-command form makes a one-time token per target.
        let token = if remote {
            None
        } else {
            problems.check(self.common.token()).flatten()
        };
        let ack_timeout = problems.check(self.common.ack_timeout());
        // With a token the digest is authenticated (sealed FIN), so it must
        // resist deliberate changes: CRC32 does not (it can be kept while
        // the data is altered).
        let verify = match (self.verify, token.is_some() || remote) {
            (None, false) | (Some(Verify::Crc32), false) => DigestAlg::Crc32,
            (None, true) | (Some(Verify::Sha256), _) => DigestAlg::Sha256,
            (Some(Verify::Crc32), true) => {
                problems.add(
                    "--verify crc32 with a token: CRC32 does not detect deliberate changes to \
                     the data, so an authenticated transfer uses sha256 (the default with a \
                     token; the one-command form always has one)",
                );
                DigestAlg::Sha256
            }
        };
        let resume = self.resume || self.retry > 0;
        // A resumed file is recognised by its size and modification time.
        let walk = self.walk_options(resume);
        // A name that does not resolve is a usage problem; a resolver that
        // cannot answer now is a connect error, said once all else is fine.
        let mut unanswered = None;
        let addr = match &target {
            None if remote => Some(SocketAddr::from(([0, 0, 0, 0], 0))),
            None => None,
            Some((host, _)) => match resolve(host, port) {
                Ok(a) => Some(a),
                Err(e @ XferError::Connect { .. }) => {
                    unanswered = Some(e);
                    None
                }
                Err(e) => problems.check(Err(e)),
            },
        };
        let launch = if remote {
            let env = std::env::var(crate::engine::remote::RSH_ENV).ok();
            problems
                .check(crate::engine::remote::rsh_command(
                    self.rsh.as_deref(),
                    env.as_deref(),
                ))
                .map(|rsh| self.launch_options(rsh))
        } else {
            None
        };
        // Bad options: report the inputs' problems in the same run. In the
        // one-command form always: before any host is logged in to.
        if !problems.is_empty() || remote {
            problems.check(entries::check_arguments(&files, &walk));
        }
        problems.into_result()?;
        if let Some(e) = unanswered {
            return Err(e);
        }
        let (Some((chunk_size, depth)), Some(addr), Some(ack_timeout)) =
            (buffers, addr, ack_timeout)
        else {
            return Err(XferError::Internal("a checked option has no value".into()));
        };
        let mut cfg = SenderConfig::new(addr);
        cfg.ack_timeout = ack_timeout;
        cfg.source = source;
        cfg.chunk_size = chunk_size;
        cfg.depth = depth;
        cfg.given = Given {
            count: self.depth.is_some(),
            chunk_size: self.chunk_size.is_some(),
        };
        cfg.verify = verify;
        cfg.busy_poll = self.common.busy_poll;
        cfg.timeout = self.common.timeout;
        cfg.token = token;
        cfg.walk = walk;
        cfg.resume = resume;
        cfg.checksum = self.checksum;
        cfg.retries = self.retry;
        Ok(match (operands, launch) {
            (Operands::Remote { targets, .. }, Some(launch)) => {
                // Each attempt starts a new receiver: the engine's own
                // retries (same address) do not apply.
                cfg.retries = 0;
                SendPlan::Remote(RemotePlan {
                    cfg,
                    files,
                    targets,
                    launch,
                    parallel: usize::from(self.parallel),
                    retries: self.retry,
                })
            }
            _ => SendPlan::Direct { cfg, files },
        })
    }

    /// Options that make no sense with receivers started over ssh.
    fn check_remote_options(&self, problems: &mut Problems) {
        if self.port.is_some() {
            problems.add(
                "--port is for a running receiver: one started over ssh listens on a free port \
                 and says which",
            );
        }
        if self.common.token_file.is_some() {
            problems.add(
                "--token-file is for a running receiver: one started over ssh gets a one-time \
                 token from the sender",
            );
        }
    }

    /// How the targets' receivers are started: the sender's timeout, and
    /// its verbosity (warnings and errors; with -vv, info too).
    fn launch_options(&self, rsh: Vec<String>) -> LaunchOptions {
        // The sender logged in with ssh as the user the receiver writes
        // as: its dotfiles (a tree's .git, say) are its to send, as scp's.
        let mut receiver_args = vec!["--allow-dotfiles".to_string()];
        if let Some(bind) = &self.remote_bind {
            receiver_args.extend(["--bind".to_string(), bind.clone()]);
        }
        // Its warnings (a memlock fit, say) and errors reach the user;
        // -vv shows its info too.
        if self.common.verbose > 1 {
            receiver_args.push("-v".to_string());
        }
        LaunchOptions {
            rsh,
            remote_receiver: self.remote_receiver.clone(),
            receiver_args,
            timeout: self.common.timeout,
        }
    }
}

/// The sender's operands, once sorted (the files of the direct form are
/// `SenderArgs::files`).
enum Operands {
    Direct,
    Remote {
        files: Vec<PathBuf>,
        targets: Vec<Target>,
    },
}

/// What `sender`'s command line asks for.
pub enum SendPlan {
    /// `sender ADDR FILE...`: one session with a running receiver.
    Direct {
        cfg: SenderConfig,
        files: Vec<PathBuf>,
    },
    /// `sender FILE... [USER@]HOST:DIR...`: a receiver started over ssh for
    /// each target (see `cli::targets`).
    Remote(RemotePlan),
}

/// The one-command form: what to send, where, and how.
pub struct RemotePlan {
    /// Every target's configuration but its address and token.
    pub cfg: SenderConfig,
    pub files: Vec<PathBuf>,
    pub targets: Vec<Target>,
    pub launch: LaunchOptions,
    /// Targets served at once.
    pub parallel: usize,
    /// New receivers started after a failure that may be transient.
    pub retries: u32,
}

/// The targets of `--hosts FILE`: one `[USER@]HOST:DIR` a line.
fn hosts_file(list: &Path, problems: &mut Problems) -> Vec<Target> {
    let text = match std::fs::read_to_string(list) {
        Ok(t) => t,
        Err(e) => {
            problems.add(format!("--hosts {}: {e}", list.display()));
            return Vec::new();
        }
    };
    let mut targets = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match Target::parse(line) {
            Some(Ok(t)) => targets.push(t),
            Some(Err(e)) => problems.add(format!("--hosts {} line {}: {e}", list.display(), n + 1)),
            None => problems.add(format!(
                "--hosts {} line {}: {line:?} is not [USER@]HOST:DIR",
                list.display(),
                n + 1
            )),
        }
    }
    if targets.is_empty() && problems.is_empty() {
        problems.add(format!("--hosts {} lists no targets", list.display()));
    }
    targets
}

/// What went wrong resolving a name, without the "cannot connect" frame.
fn connect_reason(e: &XferError) -> String {
    match e {
        XferError::Connect { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

impl ReceiverArgs {
    /// The output directory: DIR, --dir, or the current directory.
    pub fn output_dir(&self) -> PathBuf {
        self.dir_arg
            .clone()
            .or_else(|| self.dir.clone())
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// The engine's configuration for these arguments, every option checked
    /// and every problem reported at once (exit 2): slot size and count,
    /// timeout, port, `--bind` (resolved), the output directory (it must
    /// exist), `--stdout` (implies --once; takes no directory and no
    /// --overwrite; never onto a terminal), `--max-sessions` at least 1,
    /// and the token (`--token-file` or RDMA_XFER_TOKEN), required unless
    /// --insecure (see `check_authentication`). The progress observer is
    /// left at its default.
    pub fn to_config(&self) -> Result<ReceiverConfig, XferError> {
        self.to_config_with(std::io::IsTerminal::is_terminal(&std::io::stdout()))
    }

    /// What becomes of accepted files (--stdout, --discard or a
    /// directory); combinations that make no sense are problems.
    fn output(&self, problems: &mut Problems) -> Output {
        let chosen: Vec<&str> = [
            (self.stdout, "--stdout"),
            (self.discard, "--discard"),
            (self.exec.is_some(), "--exec"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if chosen.len() > 1 {
            problems.add(format!(
                "{} choose what becomes of the files: give one of them",
                chosen.join(" and ")
            ));
        }
        if self.threads > 0 && !chosen.is_empty() {
            problems.add(format!(
                "--threads writes files under a directory: it does not apply to {}",
                chosen.join(" or ")
            ));
        }
        if self.discard && self.overwrite {
            problems.add("--discard writes nothing: --overwrite does not apply");
        }
        if self.exec.is_some() && self.overwrite {
            problems
                .add("--exec writes no file itself (its command does): --overwrite does not apply");
        }
        if let Some(dest) = &self.link_dest {
            if !chosen.is_empty() {
                problems.add(format!(
                    "--link-dest puts files under a directory: it does not apply to {}",
                    chosen.join(" or ")
                ));
            }
            self.check_link_dest(dest, problems);
        }
        if self.exec.as_deref().is_some_and(|c| c.trim().is_empty()) {
            problems.add("--exec needs a command (e.g. --exec 'cat > \"$RDMA_XFER_NAME\"')");
        }
        match (&self.exec, self.stdout, self.discard) {
            (_, true, _) => Output::Stdout,
            (_, _, true) => Output::Discard,
            (Some(cmd), _, _) => Output::Exec(cmd.clone()),
            (None, false, false) => Output::Dir,
        }
    }

    /// `--ssh-session`: standard output is the channel to the sender, and
    /// the token comes from the sender alone.
    fn check_ssh_session(&self, problems: &mut Problems) {
        if self.stdout {
            problems.add("--ssh-session tells the sender where to connect on standard output: --stdout does not apply");
        }
        if self.common.token_file.is_some() {
            problems.add("--ssh-session takes its one-time token from the sender: --token-file does not apply");
        }
    }

    /// --link-dest must be a directory other than the output directory (a
    /// rename between two links of one file would do nothing).
    fn check_link_dest(&self, dest: &Path, problems: &mut Problems) {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(dest) {
            Err(e) => problems.add(format!("--link-dest {}: {e}", dest.display())),
            Ok(meta) if !meta.is_dir() => {
                problems.add(format!("--link-dest {} is not a directory", dest.display()))
            }
            Ok(meta) => {
                let same = std::fs::metadata(self.output_dir())
                    .is_ok_and(|d| (d.dev(), d.ino()) == (meta.dev(), meta.ino()));
                if same {
                    problems.add(format!(
                        "--link-dest {} is the output directory itself: give the directory of an \
                         earlier transfer",
                        dest.display()
                    ));
                }
            }
        }
    }

    /// As `to_config`, told whether standard output is a terminal.
    pub fn to_config_with(&self, stdout_is_terminal: bool) -> Result<ReceiverConfig, XferError> {
        let mut problems = Problems::default();
        let buffers = problems.check(check_buffers(
            self.chunk_size.unwrap_or(DEFAULT_CHUNK_SIZE.into()),
            self.slots.unwrap_or(DEFAULT_SLOTS).into(),
            "--slots",
        ));
        problems.check(self.common.check());
        if !self.ssh_session {
            problems.check(check_port(self.port));
        }
        if self.wait.is_some() && !(self.once || self.stdout) {
            problems.add("--wait is how long --once waits for its sender: give --once too");
        }
        if self.ssh_session {
            self.check_ssh_session(&mut problems);
        }
        if self.max_sessions == 0 {
            problems.add("--max-sessions must be at least 1");
        }
        let dir = self.output_dir();
        let output = self.output(&mut problems);
        if self.stdout {
            if self.dir.is_some() || self.dir_arg.is_some() {
                problems.add("--stdout writes to standard output: a directory does not apply");
            }
            if self.overwrite {
                problems.add("--stdout writes to standard output: --overwrite does not apply");
            }
            if stdout_is_terminal {
                problems.add(
                    "--stdout would write the received bytes to this terminal: redirect it \
                     (receiver --stdout > FILE, or receiver --stdout | tar -x ...)",
                );
            }
        } else if matches!(output, Output::Dir | Output::Exec(_)) {
            match std::fs::metadata(&dir) {
                Err(e) => {
                    let hint = match self.dir_arg.as_deref().and_then(Path::to_str) {
                        Some(a) if a.parse::<std::net::IpAddr>().is_ok() => {
                            " (to listen on that address: --bind ADDR)"
                        }
                        _ => "",
                    };
                    problems.add(format!("output directory {}: {e}{hint}", dir.display()));
                }
                Ok(meta) if !meta.is_dir() => {
                    problems.add(format!(
                        "output directory {} is not a directory",
                        dir.display()
                    ));
                }
                Ok(_) => {}
            }
        }
        // Over ssh the port is free unless chosen, and the address is
        // picked once the RDMA devices are known (see `remote`).
        let port = if self.ssh_session && self.port == DEFAULT_PORT {
            0
        } else {
            self.port
        };
        let bind = match &self.bind {
            None => Some(SocketAddr::from(([0, 0, 0, 0], port))),
            Some(b) => problems.check(
                resolve(b, port)
                    .map_err(|e| XferError::Usage(format!("--bind {b}: {}", connect_reason(&e)))),
            ),
        };
        // Over ssh the one-time token, read from standard input by the
        // tool, is the only one; otherwise a token that fails to load is a
        // problem of its own, not a missing token.
        let loaded = if self.ssh_session {
            Some(None)
        } else {
            problems.check(self.common.token())
        };
        if let Some(token) = &loaded {
            self.check_authentication(token, &mut problems);
        }
        let token = loaded.flatten();
        let ack_timeout = problems.check(self.common.ack_timeout());
        problems.into_result()?;
        let (Some((chunk_size, slots)), Some(bind), Some(ack_timeout)) =
            (buffers, bind, ack_timeout)
        else {
            return Err(XferError::Internal("a checked option has no value".into()));
        };
        let mut cfg = ReceiverConfig::new(bind, dir);
        cfg.ack_timeout = ack_timeout;
        cfg.once = self.once || self.stdout || self.ssh_session;
        cfg.wait = match (self.wait, self.ssh_session) {
            (Some(w), _) => Some(w),
            (None, true) => Some(self.common.timeout),
            (None, false) => None,
        };
        cfg.output = output;
        cfg.link_dest = self.link_dest.clone();
        cfg.overwrite = self.overwrite;
        cfg.keep_modes = self.keep_modes;
        cfg.max_size = self.max_size.unwrap_or(u64::MAX);
        cfg.max_sessions = self.max_sessions.into();
        cfg.max_files = self.max_files;
        cfg.max_session_bytes = self.max_session_size.unwrap_or(u64::MAX);
        cfg.slots = slots;
        cfg.chunk_size = chunk_size;
        cfg.given = Given {
            count: self.slots.is_some(),
            chunk_size: self.chunk_size.is_some(),
        };
        cfg.busy_poll = self.common.busy_poll;
        cfg.timeout = self.common.timeout;
        cfg.token = token;
        cfg.allow = self.allow.clone();
        cfg.partial_ttl = self.partial_ttl;
        cfg.threads = usize::from(self.threads);
        cfg.allow_dotfiles = self.allow_dotfiles;
        Ok(cfg)
    }

    /// Whether senders will have to prove a token: one was loaded
    /// (`--token-file`, RDMA_XFER_TOKEN).
    fn has_token_source(&self, token: &Option<Token>) -> bool {
        // --ssh-session: the sender's one-time token, read from stdin.
        token.is_some() || self.ssh_session
    }

    /// Closed by default: the one place deciding whether this receiver may
    /// run without a token. Without one it needs --insecure, which takes
    /// no option that lets a sender run commands or touch existing files;
    /// --insecure with a token is a contradiction.
    fn check_authentication(&self, token: &Option<Token>, problems: &mut Problems) {
        match (self.has_token_source(token), self.insecure) {
            (true, false) => {}
            (true, true) => problems.add(
                "--insecure accepts senders without a token, but a token is given (--token-file \
                 or RDMA_XFER_TOKEN): drop one of them",
            ),
            (false, false) => problems.add(
                "the receiver needs a token, so that only senders holding it may send: make one \
                 with `rdma-xfer-gen token FILE`, then run `receiver --token-file FILE ...` here \
                 and `sender --token-file FILE ...` with a copy of FILE on the sending host (or \
                 set RDMA_XFER_TOKEN on both); to accept anyone who can reach the port instead, \
                 run `receiver --insecure`",
            ),
            (false, true) => {
                for (given, what) in [
                    (
                        self.exec.is_some(),
                        "--exec would run its command on data and names",
                    ),
                    (
                        self.link_dest.is_some(),
                        "--link-dest would link files by names",
                    ),
                    (
                        self.overwrite,
                        "--overwrite would replace existing files by names",
                    ),
                ] {
                    if given {
                        problems.add(format!(
                            "{what} chosen by anyone who can reach the port: it needs a token, \
                             not --insecure (make one with `rdma-xfer-gen token FILE`)"
                        ));
                    }
                }
            }
        }
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
                shell_words(&line[start..])
                    .into_iter()
                    .take_while(|w| !matches!(w.as_str(), "|" | ">"))
                    .collect()
            })
            .collect()
    }

    /// Words as sh splits them, for the examples: whitespace apart, '...'
    /// quoted (what the examples use).
    fn shell_words(line: &str) -> Vec<String> {
        let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
        for c in line.chars() {
            match c {
                '\'' => (quoted, any) = (!quoted, true),
                c if c.is_whitespace() && !quoted => {
                    if any {
                        words.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                c => {
                    word.push(c);
                    any = true;
                }
            }
        }
        if any {
            words.push(word);
        }
        words
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

    /// A usage error (or several) whose message contains `what`.
    fn usage<T>(result: Result<T, XferError>, what: &str) {
        match result {
            Err(e @ (XferError::Usage(_) | XferError::Problems(_))) => {
                assert!(e.to_string().contains(what), "{e}")
            }
            Err(e) => panic!("expected a usage error about {what:?}, got {e:?}"),
            Ok(_) => panic!("expected a usage error about {what:?}, got a configuration"),
        }
    }

    fn plan(args: &[&str]) -> Result<SendPlan, XferError> {
        let argv = std::iter::once("sender").chain(args.iter().copied());
        SenderArgs::try_parse_from(argv).expect("parses").plan()
    }

    fn remote_plan(args: &[&str]) -> RemotePlan {
        match plan(args) {
            Ok(SendPlan::Remote(p)) => p,
            Ok(SendPlan::Direct { .. }) => panic!("{args:?}: the direct form"),
            Err(e) => panic!("{args:?}: {e}"),
        }
    }

    /// The last operands decide the form: `[USER@]HOST:DIR` targets make
    /// it the one-command form, whose files come first.
    #[test]
    fn the_one_command_form_is_told_by_its_last_operands() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f.bin");
        std::fs::write(&f, b"x").unwrap();
        let f = f.to_str().unwrap();
        let p = remote_plan(&[f, "node01:/ckpt/"]);
        assert_eq!(p.files, [PathBuf::from(f)]);
        assert_eq!(p.targets.len(), 1);
        assert_eq!(
            (p.targets[0].login.as_str(), p.targets[0].dir.as_str()),
            ("node01", "/ckpt/")
        );
        // A one-time token per target: SHA-256, no engine retries (each
        // attempt is a new receiver), and ssh by default.
        assert_eq!(p.cfg.verify, DigestAlg::Sha256);
        assert!(p.cfg.token.is_none() && p.cfg.retries == 0);
        assert_eq!(p.launch.rsh, ["ssh"]);
        assert_eq!(p.launch.remote_receiver, "receiver");
        let g = dir.path().join("g.bin");
        std::fs::write(&g, b"y").unwrap();
        let g = g.to_str().unwrap();
        let p = remote_plan(&[
            "--retry=2",
            "-e",
            "ssh -p 2222",
            "--remote-receiver",
            "/opt/r",
            "--remote-bind",
            "10.0.0.1",
            "--parallel",
            "3",
            f,
            g,
            "a:/d",
            "me@b:",
            "[fd00::1]:/x",
        ]);
        assert_eq!(p.files.len(), 2);
        let logins: Vec<&str> = p.targets.iter().map(|t| t.login.as_str()).collect();
        assert_eq!(logins, ["a", "me@b", "fd00::1"]);
        assert_eq!((p.parallel, p.retries), (3, 2));
        assert!(p.cfg.resume, "--retry continues what a receiver kept");
        assert_eq!(p.launch.rsh, ["ssh", "-p", "2222"]);
        assert_eq!(
            p.launch.receiver_args,
            ["--allow-dotfiles", "--bind", "10.0.0.1"]
        );
        // --hosts adds targets, one a line.
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "# nodes\nn1:/d\n\n  me@n2:/e  \n").unwrap();
        let p = remote_plan(&["--hosts", hosts.to_str().unwrap(), f]);
        let logins: Vec<&str> = p.targets.iter().map(|t| t.login.as_str()).collect();
        assert_eq!(logins, ["n1", "me@n2"]);
        // The direct form is untouched: ADDR first, HOST:PORT is an address.
        assert!(matches!(
            plan(&["10.0.0.1:7471", f]),
            Ok(SendPlan::Direct { .. })
        ));
        assert!(matches!(
            plan(&["127.0.0.1", f]),
            Ok(SendPlan::Direct { .. })
        ));
    }

    #[test]
    fn the_one_command_form_refuses_what_cannot_work() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f.bin");
        std::fs::write(&f, b"x").unwrap();
        let f = f.to_str().unwrap();
        let token = token_file(dir.path(), b"sixteen-bytes-ok");
        for (args, says) in [
            (vec!["h:/d"], "no files to send"),
            (vec!["-", "a:/d", "b:/d"], "standard input (-) is read once"),
            (vec!["other:/x", f, "h:/d"], "the sender sends local files"),
            (
                vec!["--port", "9", f, "h:/d"],
                "--port is for a running receiver",
            ),
            (
                vec!["--token-file", &token, f, "h:/d"],
                "--token-file is for a running receiver",
            ),
            (vec!["--verify", "crc32", f, "h:/d"], "--verify crc32"),
            (vec!["-e", "ssh 'x", f, "h:/d"], "not a command"),
            (
                vec!["--", f, "-oProxyCommand=x:/d"],
                "may not start with '-'",
            ),
            (
                vec!["-e", "ssh", "127.0.0.1", f],
                "--rsh is for [USER@]HOST:DIR targets",
            ),
            (
                vec!["--remote-bind", "x", "127.0.0.1", f],
                "--remote-bind is for",
            ),
            (vec!["127.0.0.1"], "no files to send"),
        ] {
            usage(plan(&args), says);
        }
        let hosts = dir.path().join("hosts");
        std::fs::write(&hosts, "n1:/d\nnot-a-target\n").unwrap();
        usage(
            plan(&["--hosts", hosts.to_str().unwrap(), f]),
            "line 2: \"not-a-target\"",
        );
        std::fs::write(&hosts, "# none\n").unwrap();
        usage(
            plan(&["--hosts", hosts.to_str().unwrap(), f]),
            "lists no targets",
        );
        usage(
            plan(&["--hosts", "/no/such/list", f]),
            "--hosts /no/such/list",
        );
        // Over ssh RDMA_XFER_TOKEN does not apply: the one-time token does.
        let p = remote_plan(&[f, "h:/d"]);
        assert!(p.cfg.token.is_none());
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
        let both = Given {
            count: true,
            chunk_size: true,
        };
        assert_eq!(
            cfg.given, both,
            "given: kept even if the memlock limit is lower"
        );
        assert_eq!(cfg.verify, DigestAlg::Sha256);
        assert!(cfg.busy_poll);
        assert_eq!(cfg.timeout, Duration::from_secs(7));
        assert!(cfg.token.is_some());
        assert!(cfg.walk.recursive && cfg.walk.follow_links && cfg.walk.preserve);
        assert_eq!(cfg.walk.stdin_name, "dir/in.tar");
        assert!(!cfg.resume && cfg.retries == 0 && !cfg.walk.times && !cfg.checksum);
        // --checksum: every regular file is offered with CHECKSUM (streams
        // never are), batches included.
        let cfg = sender(&["--checksum", "127.0.0.1", "a", "-"]).unwrap();
        assert!(cfg.checksum && !cfg.resume);
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
            (crate::engine::DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH)
        );
        assert_eq!(cfg.given, Given::default(), "defaults: fitted to the limit");
        // One given, the other a default; the default's value given.
        let cfg = sender(&["--depth", "16", "::1", "-"]).unwrap();
        let depth = Given {
            count: true,
            chunk_size: false,
        };
        assert_eq!((cfg.depth, cfg.given), (16, depth));
        let cfg = sender(&["--chunk-size", "1M", "::1", "-"]).unwrap();
        let chunk = Given {
            count: false,
            chunk_size: true,
        };
        assert_eq!((cfg.chunk_size, cfg.given), (1 << 20, chunk));
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
            "evil\u{202e}txt.exe",
            ".RDMA-XFER-1.part",
        ] {
            usage(sender(&["--name", bad, "h", "-"]), "invalid --name");
        }
        // A dotfile is the receiver's to refuse (--allow-dotfiles).
        assert!(sender(&["--name", ".config/app.toml", "127.0.0.1", "-"]).is_ok());
        usage(sender(&["", "f"]), "address is empty");
        let dir = tempfile::tempdir().unwrap();
        let empty = token_file(dir.path(), b"\n");
        usage(sender(&["--token-file", &empty, "h", "f"]), "is empty");
        let missing = dir.path().join("missing");
        let err = sender(&["--token-file", missing.to_str().unwrap(), "h", "f"]).unwrap_err();
        assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
        usage(sender(&["--follow-links", "h", "f"]), "needs -r");
        usage(
            sender(&["--checksum", "h", "-"]),
            "a stream cannot be hashed before it is sent",
        );
        // A name that does not resolve is a usage error, reported with the
        // inputs' problems.
        let err = sender(&["no.such.host.invalid", "/nonexistent/f"]).unwrap_err();
        assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
        let msg = err.to_string();
        assert!(
            msg.contains("cannot resolve host name no.such.host.invalid"),
            "{msg}"
        );
        assert!(msg.contains("cannot open /nonexistent/f"), "{msg}");
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
            "/",
            "--once",
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
        assert_eq!(cfg.dir, PathBuf::from("/"));
        assert!(cfg.once && cfg.output == Output::Dir && cfg.overwrite && cfg.busy_poll);
        assert_eq!((cfg.slots, cfg.chunk_size), (3, 8 << 10));
        let both = Given {
            count: true,
            chunk_size: true,
        };
        assert_eq!(cfg.given, both);
        assert_eq!((cfg.max_size, cfg.max_sessions), (1 << 30, 2));
        assert_eq!((cfg.max_files, cfg.max_session_bytes), (10, 2 << 30));
        assert_eq!(cfg.timeout, Duration::from_secs(9));
        assert!(cfg.token.is_some());
        let cfg = receiver(&["--insecure"]).unwrap();
        assert_eq!(cfg.bind, "0.0.0.0:7471".parse().unwrap());
        assert!(cfg.token.is_none() && !cfg.allow_dotfiles);
        assert!(
            receiver(&["--insecure", "--allow-dotfiles"])
                .unwrap()
                .allow_dotfiles
        );
        assert_eq!(
            (cfg.slots, cfg.chunk_size),
            (DEFAULT_SLOTS, crate::engine::DEFAULT_CHUNK_SIZE)
        );
        assert_eq!(cfg.given, Given::default());
        let cfg = receiver(&["--insecure", "--slots", "16"]).unwrap();
        let slots = Given {
            count: true,
            chunk_size: false,
        };
        assert_eq!((cfg.slots, cfg.given), (16, slots));
        assert_eq!(cfg.max_size, u64::MAX);
        assert_eq!(cfg.max_sessions, DEFAULT_MAX_SESSIONS);
        assert!(!cfg.once && cfg.output == Output::Dir && !cfg.overwrite);
        assert!(!cfg.keep_modes, "sender -p modes masked by default");
        assert!(
            receiver(&["--insecure", "--keep-modes"])
                .unwrap()
                .keep_modes
        );
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
        args.max_sessions = 0;
        usage(args.to_config(), "--max-sessions");
        args.max_sessions = 1;
        args.common.timeout = Duration::ZERO;
        usage(args.to_config(), "--timeout");
    }

    /// Closed by default: no token is a usage error that says how to make
    /// one and that --insecure exists; --insecure takes no option that lets
    /// a sender run commands or touch existing files, and no token.
    #[test]
    fn a_receiver_needs_a_token_or_insecure() {
        if std::env::var_os(crate::cli::TOKEN_ENV).is_some() {
            return; // this test's own environment decides, not the caller's
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        let err = receiver(&[path]).unwrap_err();
        assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
        for says in [
            "needs a token",
            "rdma-xfer-gen token FILE",
            "receiver --token-file FILE",
            "sender --token-file FILE",
            "receiver --insecure",
        ] {
            assert!(err.to_string().contains(says), "{says:?} not in {err}");
        }
        let cfg = receiver(&["--insecure", path]).unwrap();
        assert!(cfg.token.is_none());
        let token = token_file(dir.path(), b"sixteen-bytes-ok");
        assert!(
            receiver(&["--token-file", &token, path])
                .unwrap()
                .token
                .is_some()
        );
        usage(
            receiver(&["--insecure", "--token-file", &token, path]),
            "--insecure accepts senders without a token, but a token is given",
        );
        for (args, says) in [
            (&["--exec", "cat"][..], "--exec would run its command"),
            (&["--link-dest", "/"], "--link-dest would link files"),
            (&["--overwrite"], "--overwrite would replace existing files"),
        ] {
            let mut argv = vec!["--insecure", path];
            argv.extend(args);
            usage(receiver(&argv), says);
            usage(receiver(&argv), "it needs a token, not --insecure");
            argv.remove(0);
            argv.extend(["--token-file", &token]);
            assert!(receiver(&argv).is_ok(), "{argv:?}");
        }
        // A token that fails to load is said as such, not as a missing one.
        let short = dir.path().join("short");
        std::fs::write(&short, "short").unwrap();
        let err = receiver(&["--token-file", short.to_str().unwrap(), path]).unwrap_err();
        assert!(!err.to_string().contains("needs a token"), "{err}");
    }

    #[test]
    fn addresses_as_ssh_and_scp_users_write_them() {
        let ok = |a: &str, host: &str, port: Option<u16>| {
            assert_eq!(parse_addr(a).unwrap(), (host.to_string(), port), "{a}");
        };
        ok("10.0.0.1", "10.0.0.1", None);
        ok("10.0.0.1:7000", "10.0.0.1", Some(7000));
        ok("recv-host:9", "recv-host", Some(9));
        ok("recv-host", "recv-host", None);
        ok("fd00::1", "fd00::1", None);
        ok("[fd00::1]", "fd00::1", None);
        ok("[fd00::1]:7471", "fd00::1", Some(7471));
        ok(" host ", "host", None);
        for (bad, what) in [
            ("", "empty"),
            ("host:0", "between 1 and 65535"),
            ("host:65536", "between 1 and 65535"),
            ("[fd00::1", "closing `]`"),
            ("[fd00::1]x", "[IPV6]:PORT"),
            ("[fd00::1]:x", "between 1 and 65535"),
            ("host:/data/in", "sender FILE... host:/data/in"),
            ("host:", "sender FILE... host:DIR"),
            ("host:~/in", "targets come after the files"),
            ("host:in", "it cannot fetch from a host"),
            ("me@host", "address alone (sender host FILE...)"),
            ("me@host", "sender FILE... me@host:DIR"),
        ] {
            usage(parse_addr(bad), what);
        }
        // Through the whole configuration: HOST:PORT sets the port, and
        // --port must agree with it.
        let cfg = sender(&["127.0.0.1:9000", "-"]).unwrap();
        assert_eq!(cfg.addr, "127.0.0.1:9000".parse().unwrap());
        let cfg = sender(&["[::1]:9001", "-"]).unwrap();
        assert_eq!(cfg.addr, "[::1]:9001".parse().unwrap());
        let cfg = sender(&["--port", "9000", "127.0.0.1:9000", "-"]).unwrap();
        assert_eq!(cfg.addr.port(), 9000);
        usage(
            sender(&["--port", "9001", "127.0.0.1:9000", "-"]),
            "disagree",
        );
        let err = sender(&["host:/data", "-"]).unwrap_err();
        assert_eq!(err.exit_code(), crate::ExitCode::Usage);
        // `--retry 3 HOST FILE`: 3 became the address.
        usage(sender(&["--retry", "3", "h", "-"]), "(--retry=3)");
        usage(
            sender(&["7471", "-"]),
            "a number, not the receiver's address",
        );
    }

    /// Everything wrong before connecting is reported in one run, with
    /// exit 2: options, token, and the input files.
    #[test]
    fn every_problem_is_reported_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
        std::fs::write(d("a"), b"a").unwrap();
        std::fs::create_dir(d("sub")).unwrap();
        std::fs::write(d("sub/a"), b"a").unwrap();
        std::fs::create_dir(d("tree")).unwrap();
        let short = token_file(dir.path(), b"short");
        let err = sender(&[
            "--depth",
            "0",
            "--token-file",
            &short,
            "--name",
            "../x",
            "h",
            &d("missing"),
            &d("tree"),
            &d("a"),
            &d("sub/a"),
        ])
        .unwrap_err();
        assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
        let XferError::Problems(all) = &err else {
            panic!("expected every problem, got {err:?}");
        };
        for what in [
            "--depth",
            "at least 16 bytes",
            "invalid --name",
            "`-` is among the files",
            "cannot open",
            "is a directory (use -r",
            "would both arrive as a",
        ] {
            assert!(
                all.iter().any(|p| p.contains(what)),
                "{what:?} not in {all:#?}"
            );
        }
        // Only input problems: the engine's planning reports them all too.
        let walk = entries::WalkOptions::default();
        let files = [d("missing"), d("missing2"), d("a"), d("a")].map(PathBuf::from);
        match entries::check_arguments(&files, &walk).unwrap_err() {
            XferError::Problems(all) => {
                assert_eq!(all.len(), 3, "{all:#?}");
                assert!(all[2].ends_with("is named twice"), "{all:#?}");
            }
            other => panic!("{other:?}"),
        }
        // `sender FILE HOST`: a hint that the address comes first.
        usage(
            sender(&[&d("a"), "recv-host"]),
            "the receiver's address comes first",
        );
        // Receiver: a missing directory, a bad port and a short token at once.
        let err = receiver(&[
            "--port",
            "0",
            "--token-file",
            &short,
            "--dir",
            &d("missing"),
        ])
        .unwrap_err();
        let XferError::Problems(all) = &err else {
            panic!("expected every problem, got {err:?}");
        };
        assert_eq!(all.len(), 3, "{all:#?}");
        assert!(
            all.iter().any(|p| p.contains("output directory")),
            "{all:#?}"
        );
        usage(receiver(&[&d("a")]), "is not a directory");
        usage(receiver(&["10.0.0.1"]), "--bind ADDR");
    }

    #[test]
    fn receiver_directory_stdout_and_bind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().to_str().unwrap();
        // DIR works as --dir; both at once is refused by clap.
        assert_eq!(receiver(&["--insecure", path]).unwrap().dir, dir.path());
        assert_eq!(
            receiver(&["--insecure", "--dir", path]).unwrap().dir,
            dir.path()
        );
        assert!(ReceiverArgs::try_parse_from(["receiver", path, "--dir", path]).is_err());
        // --stdout implies --once, takes no directory or --overwrite, and
        // refuses a terminal. (With a token: --exec, --link-dest and
        // --overwrite need one.)
        let token = token_file(dir.path(), b"sixteen-bytes-ok");
        let parse = |args: &[&str]| {
            let argv = ["receiver", "--token-file", &token]
                .into_iter()
                .chain(args.iter().copied());
            ReceiverArgs::try_parse_from(argv).expect("parses")
        };
        let cfg = parse(&["--stdout"]).to_config_with(false).unwrap();
        assert!(cfg.output == Output::Stdout && cfg.once);
        usage(parse(&["--stdout"]).to_config_with(true), "terminal");
        usage(
            parse(&["--stdout", "--dir", path]).to_config_with(false),
            "a directory does not apply",
        );
        usage(
            parse(&["--stdout", path]).to_config_with(false),
            "a directory does not apply",
        );
        usage(
            parse(&["--stdout", "--overwrite"]).to_config_with(false),
            "--overwrite does not apply",
        );
        // --discard: no directory needed (one given is not used), and
        // nothing that writes files goes with it.
        let cfg = parse(&["--discard", "--dir", "/no/such/dir"])
            .to_config_with(true)
            .unwrap();
        assert!(cfg.output == Output::Discard && !cfg.once);
        // --exec runs its command in the directory: it must exist.
        let cfg = parse(&["--exec", "wc -c", path])
            .to_config_with(true)
            .unwrap();
        assert_eq!(cfg.output, Output::Exec("wc -c".into()));
        usage(
            parse(&["--exec", "wc -c", "/no/such/dir"]).to_config_with(false),
            "output directory",
        );
        for (args, says) in [
            (&["--discard", "--stdout"][..], "give one of them"),
            (&["--discard", "--overwrite"], "--overwrite does not apply"),
            (&["--discard", "--threads", "2"], "--threads"),
            (&["--stdout", "--threads", "2"], "--threads"),
            (&["--exec", "cat", "--discard"], "give one of them"),
            (&["--exec", "cat", "--stdout"], "give one of them"),
            (
                &["--exec", "cat", "--overwrite"],
                "--overwrite does not apply",
            ),
            (&["--exec", " "], "needs a command"),
            (&["--exec", "cat", "--threads", "1"], "--threads"),
            (
                &["--link-dest", path, "--discard"],
                "does not apply to --discard",
            ),
            (
                &["--link-dest", path, "--exec", "cat"],
                "does not apply to --exec",
            ),
            (
                &["--link-dest", path, "--stdout"],
                "does not apply to --stdout",
            ),
            (&["--link-dest", "/no/such/dir"], "--link-dest /no/such/dir"),
            (
                &["--link-dest", path, "--dir", path],
                "the output directory itself",
            ),
        ] {
            usage(parse(args).to_config_with(false), says);
        }
        // --bind takes a host name as the sender's ADDR does.
        let cfg = receiver(&["--insecure", "--bind", "localhost", "--port", "9"]).unwrap();
        assert!(
            cfg.bind.ip().is_loopback() && cfg.bind.port() == 9,
            "{}",
            cfg.bind
        );
        usage(receiver(&["--bind", "no.such.host.invalid"]), "--bind");
    }

    #[test]
    fn help_groups_options_and_shows_human_defaults() {
        // The defaults as the help texts give them.
        assert_eq!(
            crate::units::parse_size("1M").unwrap(),
            u64::from(DEFAULT_CHUNK_SIZE)
        );
        assert_eq!((DEFAULT_SLOTS, DEFAULT_DEPTH), (16, 16));
        for mut cmd in commands() {
            let help = cmd.render_long_help().to_string();
            for heading in [CONNECTION, OUTPUT, SECURITY, PERFORMANCE, FORMAT] {
                assert!(help.contains(&format!("{heading}:")), "{heading}:\n{help}");
            }
            assert!(help.contains("[default: 1M]"), "{help}");
            assert!(help.contains("[default: 16]"), "{help}");
            assert!(help.contains("memlock limit"), "{help}");
            assert!(!help.contains("1048576"), "{help}");
            for var in [
                "RDMA_XFER_TOKEN",
                "RDMA_XFER_ACK_TIMEOUT",
                "RUST_LOG",
                "NO_COLOR",
            ] {
                assert!(help.contains(var), "{var}:\n{help}");
            }
            assert!(help.contains("8  no usable RDMA device"), "{help}");
        }
    }
}
