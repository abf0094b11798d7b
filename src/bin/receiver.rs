//! `receiver`: accepts files from `sender`s over RDMA.
#![forbid(unsafe_code)]

use clap::Parser;
use rdma_xfer::XferError;
use rdma_xfer::cli::ui::Ui;
use rdma_xfer::cli::{ReceiverArgs, TOKEN_ENV, finish, init_logging};
use rdma_xfer::engine::receiver::{ReceiverConfig, serve};
use rdma_xfer::engine::{ProgressSink, check_buffers};
use rdma_xfer::sys::os::install_shutdown_handlers;
use std::net::SocketAddr;
use std::sync::Arc;

fn run(args: &ReceiverArgs, ui: &Arc<Ui>) -> Result<(), XferError> {
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
    cfg.stdout = args.stdout;
    cfg.overwrite = args.overwrite;
    cfg.max_size = args.max_size.unwrap_or(u64::MAX);
    cfg.max_sessions = args.max_sessions.into();
    cfg.slots = slots;
    cfg.chunk_size = chunk_size;
    cfg.busy_poll = args.common.busy_poll;
    cfg.timeout = args.common.timeout;
    cfg.token = token;
    cfg.progress = ProgressSink::new(ui.clone());
    serve(&cfg, &|event| ui.file_event(event))
}

fn main() -> std::process::ExitCode {
    let args = ReceiverArgs::parse();
    let ui = Arc::new(Ui::new(&args.common, false));
    init_logging(&args.common, &ui);
    if let Err(e) = install_shutdown_handlers() {
        ui.eprintln(&format!("receiver: warning: {e}"));
    }
    let result = run(&args, &ui);
    ui.finish();
    // A serving receiver reports per file only; --once sums up its session.
    if args.once {
        ui.print_json_summary(result.as_ref().map(|_| ()));
    }
    finish("receiver", &args.common, result)
}
