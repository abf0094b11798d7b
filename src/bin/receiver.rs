//! `receiver`: accepts files from `sender`s over RDMA.
#![forbid(unsafe_code)]

use clap::Parser;
use rdma_xfer::XferError;
use rdma_xfer::cli::ui::Ui;
use rdma_xfer::cli::{ReceiverArgs, finish, init_logging};
use rdma_xfer::engine::ProgressSink;
use rdma_xfer::engine::receiver::serve;
use rdma_xfer::sys::os::install_shutdown_handlers;
use std::sync::Arc;

fn run(args: &ReceiverArgs, ui: &Arc<Ui>) -> Result<(), XferError> {
    let mut cfg = args.to_config()?;
    cfg.progress = ProgressSink::new(ui.clone());
    serve(&cfg, &|event| ui.file_event(event))
}

fn main() -> std::process::ExitCode {
    let args = ReceiverArgs::parse();
    let ui = Arc::new(Ui::new(&args.common, false));
    init_logging("receiver", &args.common, &ui);
    if let Err(e) = install_shutdown_handlers() {
        tracing::warn!("{e}");
    }
    let result = run(&args, &ui);
    ui.finish();
    // A serving receiver reports per file only; --once sums up its session.
    if args.once || args.stdout {
        ui.print_json_summary(result.as_ref().map(|_| ()));
    }
    finish("receiver", &args.common, result)
}
