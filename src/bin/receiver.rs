//! `receiver`: accepts files from `sender`s over RDMA.
#![forbid(unsafe_code)]

use clap::Parser;
use rdma_xfer::XferError;
use rdma_xfer::cli::ui::Ui;
use rdma_xfer::cli::{ReceiverArgs, finish, init_logging, take_token_env};
use rdma_xfer::engine::ProgressSink;
use rdma_xfer::engine::receiver::{first_rdma_address, serve};
use rdma_xfer::engine::remote;
use rdma_xfer::sys::os::install_shutdown_handlers;
use std::net::SocketAddr;
use std::sync::Arc;

fn run(args: &ReceiverArgs, ui: &Arc<Ui>) -> Result<(), XferError> {
    let mut cfg = args.to_config()?;
    if args.ssh_session {
        // Started by `sender FILE HOST:DIR`: its one-time token first,
        // then the end of standard input ends the session.
        cfg.token = Some(remote::read_token_line(&mut std::io::stdin().lock())?);
        remote::watch_hangup(cfg.relay_keys.clone());
        if args.bind.is_none() {
            let ssh = std::env::var("SSH_CONNECTION").ok();
            let ip = first_rdma_address(&remote::bind_candidates(ssh.as_deref()))?;
            cfg.bind = SocketAddr::new(ip, cfg.bind.port());
        }
    }
    cfg.progress = ProgressSink::new(ui.clone());
    serve(&cfg, &|event| ui.file_event(event))
}

fn main() -> std::process::ExitCode {
    // Started as an --exec command's trampoline: becomes the command.
    rdma_xfer::sys::os::exec_trampoline_or_continue();
    // Then, while this is the only thread (see `take_token_env`).
    let taken_token = take_token_env();
    let mut args = ReceiverArgs::parse();
    args.common.taken_token = taken_token;
    // `sender FILE HOST:PATH`: decided once, before anything listens.
    let settled = match args.ssh_path.then(|| remote::scp_path(&args.output_dir())) {
        Some(Ok(Some(parent))) => {
            args.dir_arg = Some(parent);
            args.dir = None;
            Ok(true)
        }
        Some(Err(e)) => Err(e),
        Some(Ok(None)) | None => Ok(false),
    };
    let mut ui = Ui::new(&args.common, false);
    if args.ssh_session {
        ui = ui.with_ready_line(settled.as_ref().is_ok_and(|named| *named));
    }
    let ui = Arc::new(ui);
    init_logging("receiver", &args.common, &ui);
    if let Err(e) = install_shutdown_handlers() {
        tracing::warn!("{e}");
    }
    let result = settled.and_then(|_| run(&args, &ui));
    ui.finish();
    // A serving receiver reports per file only; --once sums up its session.
    if args.once || args.stdout || args.ssh_session {
        ui.print_json_summary(result.as_ref().map(|_| ()));
    }
    finish("receiver", &args.common, result)
}
