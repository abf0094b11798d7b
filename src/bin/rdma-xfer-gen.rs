//! `rdma-xfer-gen`: writes the man pages and shell completions of `sender`
//! and `receiver` from their clap definitions (`make install` runs it).
#![forbid(unsafe_code)]

use clap::Parser;
use clap_complete::Shell;
use rdma_xfer::cli::generate::{write_completions, write_man_pages};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "rdma-xfer-gen",
    version,
    about = "Write the man pages and shell completions of `sender` and `receiver`.",
    after_help = "Examples:\n  \
rdma-xfer-gen man /usr/local/share/man/man1\n  \
rdma-xfer-gen man --unit /usr/local/lib/systemd/system/rdma-xfer-receiver.service DIR\n  \
rdma-xfer-gen completions bash /usr/local/share/bash-completion/completions\n  \
rdma-xfer-gen completions zsh /usr/local/share/zsh/site-functions\n  \
rdma-xfer-gen completions fish /usr/local/share/fish/vendor_completions.d"
)]
enum Gen {
    /// Write sender.1 and receiver.1 into DIR.
    Man {
        #[arg(value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
        /// Where the receiver's systemd unit is installed (receiver.1's
        /// FILES then describes it).
        #[arg(long, value_name = "PATH")]
        unit: Option<PathBuf>,
    },
    /// Write both tools' completion scripts for SHELL into DIR (bash:
    /// `sender`, zsh: `_sender`, fish: `sender.fish`; same for receiver).
    Completions {
        shell: Shell,
        #[arg(value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
    },
}

fn main() -> std::process::ExitCode {
    let (result, dir) = match Gen::parse() {
        Gen::Man { dir, unit } => (write_man_pages(&dir, unit.as_deref()), dir),
        Gen::Completions { shell, dir } => (write_completions(shell, &dir), dir),
    };
    match result {
        Ok(files) => {
            for f in files {
                println!("{}", f.display());
            }
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rdma-xfer-gen: cannot write into {}: {e}", dir.display());
            std::process::ExitCode::from(6)
        }
    }
}
