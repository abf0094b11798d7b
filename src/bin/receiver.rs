//! `receiver`: accepts files from `sender`s over RDMA.

use clap::Parser;
use rdma_xfer::XferError;
use rdma_xfer::cli::{CommonArgs, LogFormat, TOKEN_ENV, finish, init_logging, parse_size_arg};
use rdma_xfer::engine::receiver::{DEFAULT_MAX_SESSIONS, ReceiverConfig, serve};
use rdma_xfer::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_SLOTS, check_buffers, print_summary};
use rdma_xfer::verbs::os::install_shutdown_handlers;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Receive files over RDMA from `sender`.",
    long_about = "Receive files over RDMA from `sender`. Each file is written to a temporary \
file in --dir, fsynced, checked against the sender's digest and only then renamed to its \
final name.",
    after_help = concat!(
        "Examples:\n",
        "  receiver --dir /data/incoming\n",
        "  receiver --once --bind 10.0.0.1 --port 7471 --dir .\n",
        "  receiver --token-file /etc/rdma-xfer/token --dir /data/incoming\n\n",
        rdma_xfer::exit_codes_help!()
    )
)]
struct Args {
    /// Local address to listen on (IPv4 or IPv6).
    #[arg(long, default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Port to listen on.
    #[arg(long, default_value_t = 7471)]
    port: u16,
    /// Output directory.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// Serve one session, then exit with its status.
    #[arg(long)]
    once: bool,
    /// Replace existing files (default: refuse them).
    #[arg(long)]
    overwrite: bool,
    /// Number of ring slots registered per session.
    #[arg(long, default_value_t = DEFAULT_SLOTS)]
    slots: u32,
    /// Ring slot size (K, M, G suffixes).
    #[arg(long, value_parser = parse_size_arg, default_value_t = DEFAULT_CHUNK_SIZE as u64)]
    chunk_size: u64,
    /// Refuse files larger than this (K, M, G suffixes); default: no limit
    /// besides the free space of --dir.
    #[arg(long, value_parser = parse_size_arg, value_name = "SIZE")]
    max_size: Option<u64>,
    /// Sessions served at once (each has its own queue pair and ring);
    /// further senders are refused with a "busy" reason.
    #[arg(long, default_value_t = DEFAULT_MAX_SESSIONS as u16, value_parser = clap::value_parser!(u16).range(1..))]
    max_sessions: u16,
    #[command(flatten)]
    common: CommonArgs,
}

fn run(args: &Args) -> Result<(), XferError> {
    let (chunk_size, slots) = check_buffers(args.chunk_size, args.slots as u64, "--slots")?;
    let token = args.common.token()?;
    if token.is_none() {
        tracing::warn!(
            "no token configured: this receiver accepts transfers from anyone who can reach it \
             (use --token-file or {TOKEN_ENV})"
        );
    }
    let mut cfg = ReceiverConfig::new(SocketAddr::new(args.bind, args.port), args.dir.clone());
    cfg.once = args.once;
    cfg.overwrite = args.overwrite;
    cfg.max_size = args.max_size.unwrap_or(u64::MAX);
    cfg.max_sessions = args.max_sessions.into();
    cfg.slots = slots;
    cfg.chunk_size = chunk_size;
    cfg.busy_poll = args.common.busy_poll;
    cfg.timeout = args.common.timeout;
    cfg.token = token;
    serve(&cfg, &|report| {
        print_summary(
            report,
            args.common.quiet,
            args.common.log_format == LogFormat::Json,
        )
    })
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    init_logging(&args.common);
    if let Err(e) = install_shutdown_handlers() {
        eprintln!("receiver: warning: {e}");
    }
    finish("receiver", &args.common, run(&args))
}
