//! The command lines of `sender` and `receiver`: one definition, used by the
//! binaries to parse and by `rdma-xfer-gen` to write man pages and shell
//! completions.

use super::{parse_size_arg, parse_timeout_arg};
use crate::engine::receiver::DEFAULT_MAX_SESSIONS;
use crate::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, DEFAULT_SLOTS};
use crate::proto::DigestAlg;
use clap::{CommandFactory, ValueHint};
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

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
    /// Keep modification times (files and directories).
    #[arg(long)]
    pub preserve_times: bool,
    /// Name standard input (`-`) arrives under on the receiver [default: stdin].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Local address to connect from (picks the RDMA device and port).
    #[arg(long, value_name = "ADDR")]
    pub source: Option<IpAddr>,
    /// Receiver's port.
    #[arg(long, default_value_t = 7471)]
    pub port: u16,
    /// Whole-file digest checked by the receiver before it acknowledges.
    #[arg(long, value_enum, default_value_t = Verify::Crc32)]
    pub verify: Verify,
    /// RDMA writes kept in flight (each uses one staging buffer).
    #[arg(long, value_name = "N", default_value_t = DEFAULT_DEPTH)]
    pub depth: u32,
    /// Size of each staging buffer / write (K, M, G suffixes); the
    /// receiver's slot size caps it.
    #[arg(long, value_name = "SIZE", value_parser = parse_size_arg, default_value_t = DEFAULT_CHUNK_SIZE as u64)]
    pub chunk_size: u64,
    #[command(flatten)]
    pub common: CommonArgs,
}

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
    #[command(flatten)]
    pub common: CommonArgs,
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
        assert_eq!(DigestAlg::from(s.verify), DigestAlg::Crc32);
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
}
