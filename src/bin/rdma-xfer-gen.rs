//! `rdma-xfer-gen`: makes a token for both tools, and writes the man pages
//! and shell completions of `sender` and `receiver` from their clap
//! definitions (`make install` runs it).
#![forbid(unsafe_code)]

use clap::Parser;
use clap_complete::Shell;
use rdma_xfer::cli::create_token_file;
use rdma_xfer::cli::generate::{completion_scripts, write_completions, write_man_pages};
use rdma_xfer::{ExitCode, XferError};
use std::io::Write;
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(
    name = "rdma-xfer-gen",
    version = rdma_xfer::cli::version(),
    about = "Make a token for `sender` and `receiver`; write their man pages and shell completions.",
    after_help = "Examples:\n  \
rdma-xfer-gen token /etc/rdma-xfer/token\n  \
rdma-xfer-gen man /usr/local/share/man/man1\n  \
rdma-xfer-gen man --unit /usr/local/lib/systemd/system/rdma-xfer-receiver.service DIR\n  \
rdma-xfer-gen completions bash /usr/local/share/bash-completion/completions\n  \
rdma-xfer-gen completions zsh /usr/local/share/zsh/site-functions\n  \
rdma-xfer-gen completions fish /usr/local/share/fish/vendor_completions.d\n\n\
Exit codes: 0 done, 2 usage (FILE exists, its directory does not), 6 I/O error, 8 the doctor found\nthat a transfer would fail."
)]
enum Gen {
    /// Write a new random token (64 hex digits) into FILE, created with
    /// mode 0600; an existing FILE is never replaced (`-`: to standard
    /// output). Give it to both tools: `receiver --token-file FILE`, and a
    /// copy on the sending host to `sender --token-file FILE`.
    Token {
        #[arg(value_hint = clap::ValueHint::FilePath)]
        file: PathBuf,
    },
    /// Write sender.1 and receiver.1 into DIR (created if missing; two
    /// pages, so never `-`).
    Man {
        #[arg(value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
        /// Where the receiver's systemd unit is installed (receiver.1's
        /// FILES then describes it).
        #[arg(long, value_name = "PATH")]
        unit: Option<PathBuf>,
    },
    /// Check why RDMA works here or not: the kernel's driver and devices,
    /// /dev/infiniband, the user-space provider, each port (state, link
    /// layer, MTU, GIDs), locked memory, and with HOST the device the
    /// route to it leaves by. Each problem comes with the command that
    /// fixes it. Exit 0: a transfer should work; 8: it would fail.
    Doctor {
        /// A receiver (name or address, a port may follow) to check the
        /// way to, then to greet: a handshake that moves no data.
        #[arg(value_hint = clap::ValueHint::Hostname)]
        host: Option<String>,
        /// The token for the handshake (else RDMA_XFER_TOKEN, else the
        /// default places, as the sender looks).
        #[arg(long, value_name = "PATH", value_hint = clap::ValueHint::FilePath)]
        token_file: Option<PathBuf>,
    },
    /// Write both tools' completion scripts for SHELL into DIR (created if
    /// missing; bash: `sender`, zsh: `_sender`, fish: `sender.fish`; same
    /// for receiver); `-`: both to standard output, e.g. `source
    /// <(rdma-xfer-gen completions bash -)`.
    Completions {
        shell: Shell,
        #[arg(value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
    },
}

/// Writes into `dir`, created first if missing (with its parents).
fn into_dir(
    dir: &Path,
    write: impl FnOnce(&Path) -> std::io::Result<Vec<PathBuf>>,
) -> Result<Vec<PathBuf>, XferError> {
    let ctx = || format!("cannot write into {}", dir.display());
    std::fs::create_dir_all(dir).map_err(|e| XferError::io(ctx(), e))?;
    write(dir).map_err(|e| XferError::io(ctx(), e))
}

/// Writes `parts` to standard output and flushes it; an error is said
/// with `context`.
fn write_stdout(parts: &[&[u8]], context: &str) -> Result<(), XferError> {
    let mut out = std::io::stdout().lock();
    let wrote = parts
        .iter()
        .try_for_each(|part| out.write_all(part))
        .and_then(|()| out.flush());
    wrote.map_err(|e| XferError::io(context, e))
}

fn run(command: Gen) -> Result<ExitCode, XferError> {
    let files = match command {
        Gen::Token { file } if file.as_os_str() == "-" => {
            refuse_open_stdout()?;
            let (_, hex) = rdma_xfer::engine::remote::one_time_token()?;
            write_stdout(
                &[hex.as_bytes(), b"\n"],
                "cannot write the token to standard output",
            )?;
            eprintln!(
                "rdma-xfer-gen: new token on standard output: keep it in a file only its owner \
                 can read (umask 077), for `receiver --token-file FILE` and `sender --token-file \
                 FILE`"
            );
            return Ok(ExitCode::Ok);
        }
        Gen::Man { dir, .. } if dir.as_os_str() == "-" => {
            return Err(XferError::Usage(
                "man writes two pages (sender.1 and receiver.1): give a directory, not -".into(),
            ));
        }
        Gen::Completions { shell, dir } if dir.as_os_str() == "-" => {
            let scripts = completion_scripts(shell)
                .map_err(|e| XferError::io("cannot make the completion scripts", e))?;
            let scripts: Vec<&[u8]> = scripts.iter().map(|(_, script)| &script[..]).collect();
            write_stdout(&scripts, "cannot write to standard output")?;
            return Ok(ExitCode::Ok);
        }
        Gen::Token { file } => {
            create_token_file(&file)?;
            let f = file.display();
            eprintln!(
                "rdma-xfer-gen: new token in {f} (mode 600): run `receiver --token-file {f}` \
                 here and `sender --token-file {f}` with a copy of it on the sending host"
            );
            return Ok(ExitCode::Ok);
        }
        Gen::Doctor { host, token_file } => {
            return Ok(doctor(host.as_deref(), token_file.as_deref()));
        }
        Gen::Man { dir, unit } => into_dir(&dir, |d| write_man_pages(d, unit.as_deref()))?,
        Gen::Completions { shell, dir } => into_dir(&dir, |d| write_completions(shell, d))?,
    };
    for f in files {
        println!("{}", f.display());
    }
    Ok(ExitCode::Ok)
}

/// A token goes to standard output only where no one else reads it: not
/// a terminal (its scrollback, a session log), not a file others may
/// read (`umask 077` first).
fn refuse_open_stdout() -> Result<(), XferError> {
    use std::io::IsTerminal;
    use std::os::unix::fs::PermissionsExt;
    if std::io::stdout().is_terminal() {
        return Err(XferError::Usage(
            "token - would print the secret on this terminal: redirect it into a file only \
             you can read (umask 077; rdma-xfer-gen token - > FILE), or give FILE"
                .into(),
        ));
    }
    let meta = std::fs::metadata("/dev/stdout");
    if let Ok(m) = meta
        && m.is_file()
        && m.permissions().mode() & 0o077 != 0
    {
        return Err(XferError::Usage(format!(
            "token - would write the secret into a file others may read (mode {:o}): run \
             `umask 077` first, or give FILE (made with mode 600)",
            m.permissions().mode() & 0o777
        )));
    }
    Ok(())
}

/// Prints the doctor's findings; exit 8 when a transfer would fail.
fn doctor(host: Option<&str>, token_file: Option<&Path>) -> ExitCode {
    use rdma_xfer::cli::doctor::{Host, Route, examine, ready, render};
    let inventory = rdma_xfer::sys::rdma::Inventory::read();
    let verbs = rdma_xfer::sys::rdma::probe_devices();
    let memlock = rdma_xfer::sys::os::memlock_room();
    let route = host.map(Route::towards);
    let mut findings = examine(&Host {
        inventory: &inventory,
        verbs: &verbs,
        memlock: &memlock,
        route: route.as_ref(),
    });
    // The handshake only where the local steps are fine: it would fail
    // for their reason.
    if let Some(route) = &route
        && let Some(peer) = route.peer
        && ready(&findings)
    {
        let port = route.port.unwrap_or(rdma_xfer::cli::args::DEFAULT_PORT);
        findings.push(greet(
            std::net::SocketAddr::new(peer, port),
            route.source,
            token_file,
        ));
    }
    print!("{}", render(&findings));
    if ready(&findings) {
        ExitCode::Ok
    } else {
        ExitCode::NoDevice
    }
}

/// The doctor's handshake with the receiver at `addr`, with the token a
/// sender would use (`token_file`, else RDMA_XFER_TOKEN, else the
/// default places).
fn greet(
    addr: std::net::SocketAddr,
    source: Option<std::net::IpAddr>,
    token_file: Option<&Path>,
) -> rdma_xfer::cli::doctor::Finding {
    use rdma_xfer::cli::doctor::handshake_finding;
    use rdma_xfer::cli::{TOKEN_ENV, find_token};
    let loaded = find_token(token_file, std::env::var_os(TOKEN_ENV), true);
    let (token, from) = match loaded {
        Ok(Some((token, from))) => (Some(token), Some(from)),
        Ok(None) => (None, None),
        Err(e) => return handshake_finding(addr, Some("the token given"), &Err(e)),
    };
    let mut cfg = rdma_xfer::engine::sender::SenderConfig::new(addr);
    cfg.source = source;
    cfg.timeout = std::time::Duration::from_secs(5);
    if token.is_some() {
        cfg.verify = rdma_xfer::proto::DigestAlg::Sha256;
    }
    cfg.token = token;
    let greeted = rdma_xfer::engine::sender::send_files(&cfg, &[], |_| {}).map(drop);
    handshake_finding(addr, from.as_deref(), &greeted)
}

fn main() -> std::process::ExitCode {
    match run(Gen::parse()) {
        Ok(code) => std::process::ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("rdma-xfer-gen: error: {e}");
            let code = match e.exit_code() {
                ExitCode::Usage => ExitCode::Usage,
                _ => ExitCode::Io,
            };
            std::process::ExitCode::from(code as u8)
        }
    }
}
