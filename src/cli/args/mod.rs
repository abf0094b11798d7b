//! The command lines of `sender` and `receiver`: one definition, used by the
//! binaries to parse and by `rdma-xfer-gen` to write man pages and shell
//! completions.
//!
//! The definitions are here (clap derives: flags, help, headings); turning
//! parsed arguments into the engine's configuration is `config.rs`.

mod config;
#[cfg(test)]
mod tests;

pub use config::{Chain, MAX_TIMEOUT, RemotePlan, SendPlan, parse_addr};

use super::{parse_size_arg, parse_timeout_arg};
use crate::engine::filter::Rule;
use crate::engine::receiver::{AllowedNet, DEFAULT_MAX_SESSIONS, DEFAULT_WRITER_THREADS};
use crate::proto::DEFAULT_MAX_FILES;
use crate::proto::DigestAlg;
use clap::{CommandFactory, ValueHint};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

/// What rsync's and scp's options that `sender` lacks are here, for the
/// reflex that types them (clap alone would suggest `--port` for
/// `--partial`, or `-- -P`).
const FOREIGN_FLAGS: &[(&str, &str)] = &[
    (
        "-P",
        "rsync's -P (--partial --progress): use --resume, which keeps what arrived and continues it; progress bars show on a terminal (--progress forces them)",
    ),
    (
        "--partial",
        "rsync's --partial: use --resume, which keeps what arrived and continues it",
    ),
    (
        "-a",
        "rsync's -a: use -r for trees (modification times are always kept; -p keeps modes too if the receiver runs with --keep-modes)",
    ),
    (
        "--archive",
        "rsync's --archive: use -r for trees (modification times are always kept; -p keeps modes too if the receiver runs with --keep-modes)",
    ),
    (
        "-z",
        "no compression: RDMA moves the bytes faster than compressing them would",
    ),
    (
        "--compress",
        "no compression: RDMA moves the bytes faster than compressing them would",
    ),
    ("--delete", "sender never deletes files on the receiver"),
];

/// Parses `sender`'s command line, or exits 2 with clap's message; an
/// option of rsync or scp that it lacks gets one line naming what to
/// use instead.
pub fn parse_sender_args() -> SenderArgs {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let e = match try_parse_sender(std::env::args_os()) {
        Ok(args) => return args,
        Err(e) => e,
    };
    if e.kind() == ErrorKind::UnknownArgument
        && let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg)
        && let Some(hint) = foreign_flag_hint(arg)
    {
        eprintln!("sender: error: unknown option '{arg}': {hint}");
        eprintln!("For more information, try 'sender --help'.");
        std::process::exit(crate::error::ExitCode::Usage as i32);
    }
    e.exit()
}

/// Parses a `sender` command line (`args` with the program's name first).
pub fn try_parse_sender(
    args: impl IntoIterator<Item = OsString>,
) -> Result<SenderArgs, clap::Error> {
    use clap::{CommandFactory, FromArgMatches};
    let mut cmd = SenderArgs::command();
    let matches = cmd.try_get_matches_from_mut(retry_count_joined(args))?;
    let mut parsed = SenderArgs::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))?;
    parsed.filter = filter_rules(&matches);
    Ok(parsed)
}

/// `--exclude` and `--include` in command-line order, the order their
/// rules are tried in (clap keeps each option's values apart).
fn filter_rules(matches: &clap::ArgMatches) -> Vec<Rule> {
    let mut placed: Vec<(usize, Rule)> = Vec::new();
    for (id, include) in [("exclude", false), ("include", true)] {
        let (Some(at), Some(values)) = (matches.indices_of(id), matches.get_many::<String>(id))
        else {
            continue;
        };
        placed.extend(at.zip(values).map(|(i, pattern)| {
            (
                i,
                Rule {
                    include,
                    pattern: pattern.clone(),
                },
            )
        }));
    }
    placed.sort_by_key(|(i, _)| *i);
    placed.into_iter().map(|(_, rule)| rule).collect()
}

/// `--retry 3` as `--retry=3`: a count right after a bare --retry is its
/// count, as one types it (the option's value is optional, so clap alone
/// would take 3 for the receiver's address).
fn retry_count_joined(args: impl IntoIterator<Item = OsString>) -> Vec<OsString> {
    let mut out: Vec<OsString> = Vec::new();
    // After `--` every argument is a file.
    let mut options_ended = false;
    for arg in args {
        let is_count = !arg.is_empty() && arg.as_encoded_bytes().iter().all(u8::is_ascii_digit);
        match out.last_mut() {
            Some(last) if is_count && !options_ended && last == "--retry" => {
                last.push("=");
                last.push(&arg);
            }
            _ => {
                options_ended |= arg == "--";
                out.push(arg);
            }
        }
    }
    out
}

/// The hint for an rsync or scp option `sender` lacks (`arg` as clap
/// names it: `-P`, `--partial`, `--partial=x`).
fn foreign_flag_hint(arg: &str) -> Option<&'static str> {
    let name = arg.split('=').next().unwrap_or(arg);
    FOREIGN_FLAGS
        .iter()
        .find(|(flag, _)| *flag == name)
        .map(|(_, hint)| *hint)
}

pub use crate::engine::DEFAULT_PORT;

/// Headings `--help` groups the options under.
const CONNECTION: &str = "Connection";
const OUTPUT: &str = "Output";
const SELECTION: &str = "File selection";
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
    /// Progress bars even when stderr is not a terminal (a CI log that
    /// renders them); not with -q or JSON logs.
    #[arg(long, help_heading = FORMAT)]
    pub progress: bool,
    /// Where no progress bars are drawn (stderr is a pipe, a file or a
    /// journal; JSON logs): a progress line this often while bytes move
    /// (done, of how much, files, rate, ETA).
    #[arg(long, value_name = "DURATION", value_parser = crate::units::parse_duration,
          value_hint = ValueHint::Other, help_heading = FORMAT)]
    pub stats: Option<Duration>,
    /// Results for scripts: one JSON object per file on stdout (name, bytes,
    /// seconds, mib_per_s, digest, status, exit_code, reason_code,
    /// retryable), flushed at once, and a summary at the end.
    #[arg(long, help_heading = FORMAT)]
    pub json: bool,
    /// File holding the shared secret that authenticates both ends to each
    /// other (trailing whitespace ignored; at least 16 bytes; make one with
    /// `rdma-xfer-gen token FILE`). Overrides RDMA_XFER_TOKEN; without
    /// either, the first of $XDG_CONFIG_HOME/rdma-xfer/token (or
    /// ~/.config/...) and /etc/rdma-xfer/token that exists. A receiver
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
    version = crate::cli::version(),
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
        "  sender ckpt.pt node01:/ckpt/step-100.pt\n",
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
    /// [USER@]HOST:DIR: a receiver is started there over ssh for each. As
    /// scp's, with one regular file (or `-`) and no --name, a DIR that is
    /// no directory there (and does not end with `/`) names the file:
    /// `f host:/data/new.pt` writes /data/new.pt.
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
    /// Several targets: copy to each directly, up to --parallel at once,
    /// instead of the default relay chain (the sender sends to the first
    /// target only, each passes the files on to the next).
    #[arg(long, conflicts_with = "relay", help_heading = REMOTE)]
    pub no_relay: bool,
    /// Targets served at once with --no-relay (and receivers started at
    /// once in a chain), 1-256.
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
    /// integrity failures are never retried. --retry alone means 5; by
    /// default there is no retry.
    #[arg(long, value_name = "N", num_args = 0..=1, require_equals = true, default_missing_value = "5",
          default_value_t = 0, hide_default_value = true, value_hint = ValueHint::Other, help_heading = CONNECTION)]
    pub retry: u32,
    /// Send to a chain of running receivers, each HOST[:PORT]: this
    /// sender talks to the first only; each host keeps the files and
    /// passes them on to the next as they arrive, so every byte leaves
    /// this host once. Then every operand is a file. Needs a token (all
    /// hosts share it); each host's result comes back per file.
    #[arg(long, value_name = "HOST,...", value_delimiter = ',', value_hint = ValueHint::Hostname,
          help_heading = CONNECTION)]
    pub relay: Vec<String>,
    /// Send directories as trees: every file and directory below them
    /// (symbolic links inside are skipped unless --follow-links).
    #[arg(short, long, help_heading = OUTPUT)]
    pub recursive: bool,
    /// Follow symbolic links inside trees (needs -r; links named on the
    /// command line are always followed).
    #[arg(long, help_heading = OUTPUT)]
    pub follow_links: bool,
    /// Keep modes too, if the receiver runs with --keep-modes (otherwise
    /// its umask applies, as with scp; setuid, setgid and sticky bits are
    /// never kept). Modification times are always kept: a re-run finds
    /// them.
    #[arg(short, long, visible_alias = "preserve-times", help_heading = OUTPUT)]
    pub preserve: bool,
    /// A file the receiver has with a different size or modification time
    /// replaces it: the one-command form starts its receivers with
    /// --overwrite (a long-running receiver decides for itself).
    #[arg(long, help_heading = OUTPUT)]
    pub overwrite: bool,
    /// Never take a file as unchanged by its size and modification time:
    /// each goes on (and replaces the receiver's only with --overwrite).
    #[arg(short = 'I', long, conflicts_with_all = ["ignore_existing", "update"], help_heading = OUTPUT)]
    pub ignore_times: bool,
    /// Leave every file the receiver has under the name as it is
    /// (reported kept-existing, a success).
    #[arg(long, conflicts_with = "update", help_heading = OUTPUT)]
    pub ignore_existing: bool,
    /// Leave a file the receiver has with a later modification time as it
    /// is (reported kept-newer, a success).
    #[arg(short = 'u', long, help_heading = OUTPUT)]
    pub update: bool,
    /// Say what would be sent, left unchanged or kept, and refused (and
    /// why), with totals: the receiver makes every check of a real run
    /// and nothing is sent or written on either side. The exit status is
    /// the real run's (4 if any file would be refused).
    #[arg(short = 'n', long, conflicts_with_all = ["resume", "retry"], help_heading = OUTPUT)]
    pub dry_run: bool,
    /// Leave out what matches PATTERN (repeatable; with --include, the
    /// first matching rule in command-line order decides). Matched against
    /// the path an entry arrives under: `*.tmp` (any depth; `*` stops at
    /// `/`, `**` does not), `cache/` (directories only), `/tree/cache`
    /// (anchored at the start of that path). An excluded directory is not
    /// walked: nothing below it is sent, whatever --include says.
    #[arg(long, value_name = "PATTERN", value_hint = ValueHint::Other, help_heading = SELECTION)]
    pub exclude: Vec<String>,
    /// Send what matches PATTERN even where a later --exclude matches it
    /// (repeatable; patterns as --exclude's): `--include keep.tmp
    /// --exclude '*.tmp'`.
    #[arg(long, value_name = "PATTERN", value_hint = ValueHint::Other, help_heading = SELECTION)]
    pub include: Vec<String>,
    /// `--exclude` and `--include` in command-line order (set by
    /// `try_parse_sender`).
    #[arg(skip)]
    pub filter: Vec<Rule>,
    /// Send the paths listed in FILE (one a line; blank lines and lines
    /// starting with # ignored; `-`: standard input), relative to the one
    /// directory given as source, under those paths (implies -R). A listed
    /// directory is sent alone, or as a tree with -r.
    #[arg(long, value_name = "FILE", value_hint = ValueHint::FilePath, help_heading = SELECTION)]
    pub files_from: Option<PathBuf>,
    /// Send files and directories under their paths as given (`a/b/c.txt`
    /// arrives as a/b/c.txt, its directories created), not their base
    /// name; a leading `/` is dropped, and in `dir/./sub/f` the part after
    /// `/./` is kept.
    #[arg(short = 'R', long, help_heading = SELECTION)]
    pub relative: bool,
    /// Relative path the one source, a regular file or standard input
    /// (`-`), arrives under (`new.pt`, `sub/dir/new.pt`: a file's
    /// directories are offered first, so the receiver makes them)
    /// [default: a file's own name; stdin]. Not with several sources, a
    /// tree, -R or --files-from.
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
    /// Decide by SHA-256 instead of modification time: a file the
    /// receiver has with the same size and content is unchanged (both
    /// sides read it; past the receiver's budget of compared files a
    /// session falls back to size and time). A receiver with --overwrite
    /// gives such a file of its own the source's time. Also answers the
    /// receiver's other digest questions: a file its --link-dest has is
    /// linked instead of sent; its --exec command gets it as
    /// RDMA_XFER_DIGEST.
    #[arg(short = 'c', long, help_heading = OUTPUT)]
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
    /// At most RATE bytes of data a second (K, M, G: binary; 1M at
    /// least), per session: to share a fabric with other jobs.
    #[arg(long, value_name = "RATE", value_parser = parse_size_arg, value_hint = ValueHint::Other,
          help_heading = PERFORMANCE)]
    pub bwlimit: Option<u64>,
    /// Send each file of 8M or more in pieces over N sessions side by side
    /// (lanes: each its own connection, queue pair and core on both
    /// sides); a lane lost mid-file gives its piece to the others. Not
    /// with --resume, --checksum, --dry-run, --bwlimit or a relay chain
    /// (files go whole then) [default: 1]
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=16),
          value_hint = ValueHint::Other, help_heading = PERFORMANCE)]
    pub lanes: Option<u32>,
    /// With --lanes: other addresses of the receiver, one per rail (a
    /// device or wire of its own), each as [SRC=]ADDR (SRC: the local
    /// address to connect from; else the route's); lane i goes to the
    /// receiver's address (i mod (R+1) = 0) or to rail i mod (R+1)
    #[arg(long, value_name = "[SRC=]ADDR,...", value_delimiter = ',', requires = "lanes",
          value_parser = parse_rail, value_hint = ValueHint::Other, help_heading = PERFORMANCE)]
    pub rails: Vec<(Option<std::net::IpAddr>, std::net::IpAddr)>,
    #[command(flatten)]
    pub common: CommonArgs,
}

/// One `--rails` item: `[SRC=]ADDR`.
fn parse_rail(s: &str) -> Result<(Option<std::net::IpAddr>, std::net::IpAddr), String> {
    let ip = |a: &str| {
        a.parse::<std::net::IpAddr>()
            .map_err(|_| format!("{a:?} is not an IP address ([SRC=]ADDR)"))
    };
    match s.split_once('=') {
        Some((src, dst)) => Ok((Some(ip(src)?), ip(dst)?)),
        None => Ok((None, ip(s)?)),
    }
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
    version = crate::cli::version(),
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
    /// Serve one sender, then exit with its first session's status (the
    /// sessions that join it while it runs, a sender's --lanes, are
    /// served too; with --stdout, one session alone).
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
    /// Remove no old partial files (the receiver a dry run starts over
    /// ssh: a dry run writes and removes nothing).
    #[arg(long, hide = true)]
    pub no_sweep: bool,
    /// With --ssh-session, for `sender FILE HOST:PATH`: DIR is scp's PATH,
    /// the output directory if it is one, else the one file's name in its
    /// parent directory (said on the ready line).
    #[arg(long, hide = true, requires = "ssh_session")]
    pub ssh_path: bool,
    /// With --ssh-session, for `sender FILE HOST:DIR HOST:DIR...`: a host
    /// of the sender's relay chain. It reads the tokens of the hosts after
    /// it from standard input once it listens, serves the sessions of the
    /// host before it until standard input ends, and passes each file on.
    #[arg(long, hide = true, requires = "ssh_session")]
    pub ssh_relay: bool,
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
    /// Be a host of relay chains (`sender --relay`): a sender that proved
    /// the token may then have this receiver pass what it receives on to
    /// the next host the sender names, connecting there with this
    /// receiver's token. Off by default: it lets every holder of the token
    /// make this host connect to receivers of its choice.
    #[arg(long, help_heading = SECURITY)]
    pub allow_relay: bool,
    /// As a host of a relay chain, connect to the next host from this
    /// local address (it selects the RDMA device and port).
    #[arg(long, value_name = "ADDR", value_hint = ValueHint::Hostname, help_heading = CONNECTION)]
    pub relay_source: Option<String>,
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

/// The tools whose man pages and completions `rdma-xfer-gen` writes, by
/// name, with their command definitions.
pub fn commands() -> Vec<clap::Command> {
    vec![SenderArgs::command(), ReceiverArgs::command()]
}
