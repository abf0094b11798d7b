//! `sender`: sends files to a `receiver` over RDMA.

use clap::{Parser, ValueEnum};
use rdma_xfer::XferError;
use rdma_xfer::cli::{CommonArgs, LogFormat, finish, init_logging, parse_size_arg, resolve};
use rdma_xfer::engine::sender::{SenderConfig, send_files};
use rdma_xfer::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, check_buffers, print_summary};
use rdma_xfer::proto::DigestAlg;
use rdma_xfer::verbs::os::install_shutdown_handlers;
use std::net::IpAddr;
use std::path::PathBuf;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Verify {
    Crc32,
    Sha256,
}

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Send files over RDMA to a running `receiver`.",
    after_help = concat!(
        "Examples:\n",
        "  sender 10.0.0.1 data.bin\n",
        "  sender --verify sha256 recv-host a.bin b.bin\n",
        "  RDMA_XFER_TOKEN=... sender 10.0.0.1 data.bin   (or --token-file PATH)\n\n",
        rdma_xfer::exit_codes_help!()
    )
)]
struct Args {
    /// Receiver's address: IPv4, IPv6 or host name.
    addr: String,
    /// Files to send, in order, in one session.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Local address to connect from (picks the RDMA device and port).
    #[arg(long, value_name = "ADDR")]
    source: Option<IpAddr>,
    /// Receiver's port.
    #[arg(long, default_value_t = 7471)]
    port: u16,
    /// Whole-file digest checked by the receiver before it acknowledges.
    #[arg(long, value_enum, default_value_t = Verify::Crc32)]
    verify: Verify,
    /// RDMA writes kept in flight (each uses one staging buffer).
    #[arg(long, default_value_t = DEFAULT_DEPTH)]
    depth: u32,
    /// Size of each staging buffer / write (K, M, G suffixes); the
    /// receiver's slot size caps it.
    #[arg(long, value_parser = parse_size_arg, default_value_t = DEFAULT_CHUNK_SIZE as u64)]
    chunk_size: u64,
    #[command(flatten)]
    common: CommonArgs,
}

fn run(args: &Args) -> Result<(), XferError> {
    let (chunk_size, depth) = check_buffers(args.chunk_size, args.depth as u64, "--depth")?;
    let mut cfg = SenderConfig::new(resolve(&args.addr, args.port)?);
    cfg.source = args.source;
    cfg.chunk_size = chunk_size;
    cfg.depth = depth;
    cfg.verify = match args.verify {
        Verify::Crc32 => DigestAlg::Crc32,
        Verify::Sha256 => DigestAlg::Sha256,
    };
    cfg.busy_poll = args.common.busy_poll;
    cfg.timeout = args.common.timeout;
    cfg.token = args.common.token()?;
    let outcome = send_files(&cfg, &args.files, |report| {
        print_summary(
            report,
            args.common.quiet,
            args.common.log_format == LogFormat::Json,
        )
    })?;
    match outcome.first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    init_logging(&args.common);
    if let Err(e) = install_shutdown_handlers() {
        eprintln!("sender: warning: {e}");
    }
    finish("sender", &args.common, run(&args))
}
