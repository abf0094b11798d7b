//! `sender`: sends files over RDMA, to receivers it starts over ssh
//! (`sender FILE... HOST:DIR`) or to a running `receiver` (`sender ADDR
//! FILE...`).
#![forbid(unsafe_code)]

use rdma_xfer::XferError;
use rdma_xfer::cli::render::session_summary;
use rdma_xfer::cli::targets::send_to_targets;
use rdma_xfer::cli::ui::Ui;
use rdma_xfer::cli::{
    LogFormat, SendPlan, SenderArgs, finish, init_logging, parse_sender_args, take_token_env,
};
use rdma_xfer::engine::ProgressSink;
use rdma_xfer::engine::sender::send_files;
use rdma_xfer::sys::os::install_shutdown_handlers;
use std::sync::Arc;

fn run(args: &SenderArgs, ui: &Arc<Ui>) -> Result<(), XferError> {
    let plan = args.plan()?;
    let files = match &plan {
        SendPlan::Direct { files, .. } => files,
        SendPlan::Remote(remote) => &remote.files,
    };
    // As gzip and zstd do: a terminal on stdin means the user is to type.
    if files.iter().any(|f| f.as_os_str() == "-")
        && std::io::IsTerminal::is_terminal(&std::io::stdin())
        && !args.common.quiet
    {
        ui.eprintln("sender: reading standard input from the terminal (end it with Ctrl-D)");
    }
    let (mut cfg, files) = match plan {
        SendPlan::Remote(remote) => {
            return send_to_targets(&remote, ui, args.recursive || args.dry_run);
        }
        SendPlan::Direct { cfg, files } => (cfg, files),
    };
    cfg.progress = ProgressSink::new(ui.clone());
    let outcome = send_files(&cfg, &files, |event| ui.file_event(event))?;
    // A dry run's totals are what it is for.
    if (args.recursive || args.dry_run) && !args.common.quiet {
        let json = args.common.log_format == LogFormat::Json;
        ui.eprintln(&ui.summary_line(session_summary(&outcome, json)));
    }
    match outcome.first_error {
        Some(first) => {
            let (files, failed) = ui.file_counts();
            Err(XferError::FilesFailed {
                first: Box::new(first),
                failed: failed.max(1),
                files: files.max(1),
            })
        }
        None => Ok(()),
    }
}

fn main() -> std::process::ExitCode {
    // First, while this is the only thread (see `take_token_env`).
    let taken_token = take_token_env();
    let mut args = parse_sender_args();
    args.common.taken_token = taken_token;
    let ui = Arc::new(Ui::new(&args.common, true).with_dry_run(args.dry_run));
    init_logging("sender", &args.common, &ui);
    if let Err(e) = install_shutdown_handlers() {
        tracing::warn!("{e}");
    }
    let result = run(&args, &ui);
    ui.finish();
    ui.print_json_summary(result.as_ref().map(|_| ()));
    finish("sender", &args.common, result)
}
