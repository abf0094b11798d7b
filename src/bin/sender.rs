//! `sender`: sends files to a `receiver` over RDMA.
#![forbid(unsafe_code)]

use clap::Parser;
use rdma_xfer::XferError;
use rdma_xfer::cli::LogFormat;
use rdma_xfer::cli::ui::Ui;
use rdma_xfer::cli::{SenderArgs, finish, init_logging, resolve};
use rdma_xfer::engine::sender::{DEFAULT_STDIN_NAME, SenderConfig, send_files};
use rdma_xfer::engine::{ProgressSink, check_buffers, session_summary};
use rdma_xfer::sys::os::install_shutdown_handlers;
use std::sync::Arc;

fn run(args: &SenderArgs, ui: &Arc<Ui>) -> Result<(), XferError> {
    let (chunk_size, depth) = check_buffers(args.chunk_size, args.depth as u64, "--depth")?;
    let mut cfg = SenderConfig::new(resolve(&args.addr, args.port)?);
    cfg.source = args.source;
    cfg.chunk_size = chunk_size;
    cfg.depth = depth;
    cfg.verify = args.verify.into();
    cfg.busy_poll = args.common.busy_poll;
    cfg.timeout = args.common.timeout;
    cfg.token = args.common.token()?;
    cfg.progress = ProgressSink::new(ui.clone());
    if args.name.is_some() && !args.files.iter().any(|f| f.as_os_str() == "-") {
        return Err(XferError::Usage(
            "--name names standard input, which is sent only when `-` is among the files".into(),
        ));
    }
    cfg.walk.recursive = args.recursive;
    cfg.walk.follow_links = args.follow_links;
    cfg.walk.preserve_times = args.preserve_times;
    cfg.walk.stdin_name = args
        .name
        .clone()
        .unwrap_or_else(|| DEFAULT_STDIN_NAME.into());
    let outcome = send_files(&cfg, &args.files, |event| ui.file_event(event))?;
    if args.recursive && !args.common.quiet {
        let json = args.common.log_format == LogFormat::Json;
        ui.eprintln(&session_summary(&outcome, json));
    }
    match outcome.first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn main() -> std::process::ExitCode {
    let args = SenderArgs::parse();
    let ui = Arc::new(Ui::new(&args.common, true));
    init_logging(&args.common, &ui);
    if let Err(e) = install_shutdown_handlers() {
        ui.eprintln(&format!("sender: warning: {e}"));
    }
    let result = run(&args, &ui);
    ui.finish();
    ui.print_json_summary(result.as_ref().map(|_| ()));
    finish("sender", &args.common, result)
}
