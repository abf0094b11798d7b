//! What a receiver is configured with (`ReceiverConfig`, built by
//! cli/args/config.rs) and where its files go (`Output`).

use super::AllowedNet;
use super::{DEFAULT_MAX_SESSIONS, DEFAULT_PARTIAL_TTL, DEFAULT_WRITER_THREADS};
use crate::engine::fit::Given;
use crate::engine::progress::ProgressSink;
use crate::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_SLOTS, DEFAULT_TIMEOUT};
use crate::proto::Token;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    pub bind: SocketAddr,
    pub dir: PathBuf,
    pub once: bool,
    /// With `once`: how long to wait for the first admitted session
    /// (None: forever).
    pub wait: Option<Duration>,
    pub overwrite: bool,
    pub slots: u32,
    pub chunk_size: u32,
    /// Which of `slots` and `chunk_size` the user gave; the others are
    /// lowered to fit the memlock limit (`fit::fit_to_memlock`).
    pub given: Given,
    pub busy_poll: bool,
    pub ack_timeout: crate::engine::AckTimeout,
    pub timeout: Duration,
    /// Largest file accepted (checked before the file is created).
    pub max_size: u64,
    /// Sessions served at once; more are refused with a reason. With a
    /// token only authenticated sessions count (see `admission`).
    pub max_sessions: usize,
    /// Entries one session may offer (see `proto::ReceiverConfig`).
    pub max_files: u64,
    /// Bytes one session may bring; `u64::MAX` = no limit.
    pub max_session_bytes: u64,
    /// Shared secret senders must prove before anything else; None accepts anyone.
    pub token: Option<Token>,
    /// What becomes of accepted files (stored under `dir` by default).
    pub output: Output,
    /// --link-dest: a file offered with CHECKSUM whose size and SHA-256
    /// match the file at its path here is linked (or copied) from here
    /// instead of received (`Output::Dir` only).
    pub link_dest: Option<PathBuf>,
    /// Told about each file's progress (the tool draws bars with it).
    pub progress: ProgressSink,
    /// Networks peers may connect from (`--allow`); empty: everyone.
    pub allow: Vec<AllowedNet>,
    /// Masks received modes unless the sender keeps them (`sender -p`)
    /// and `keep_modes` lets it; the process's umask by default.
    pub umask: u32,
    /// `--keep-modes`: the modes of `sender -p` are kept as they are, not
    /// masked with `umask`.
    pub keep_modes: bool,
    /// Partial files kept for `sender --resume` (and temporary files left
    /// by a crash) that were not modified for this long are removed, at
    /// start-up and then periodically (see `SWEEP_EVERY`).
    pub partial_ttl: Duration,
    /// Remove such old files at all (not for the receiver a dry run
    /// starts over ssh: a dry run writes and removes nothing).
    pub sweep: bool,
    /// Threads per session that write checked chunks into files (0: the
    /// session's own thread writes them).
    pub threads: usize,
    /// Names starting with `.` are accepted (`--allow-dotfiles`; the
    /// protocol machine decides, see `proto::NameRules`).
    pub allow_dotfiles: bool,
    /// A sender that proved the token may make this receiver a host of a
    /// relay chain (RELAY): it passes what it receives on to the next
    /// host, with the same token (`--allow-relay`; off by default).
    pub relay: bool,
    /// The address a relay hop connects to the next host from
    /// (`--relay-source`; None: the route decides).
    pub relay_source: Option<std::net::IpAddr>,
    /// A relay hop started over ssh: the tokens of the hosts after it, as
    /// its sender handed them over (None: they share this receiver's own).
    pub relay_keys: Option<std::sync::Arc<crate::engine::relay::KeyRing>>,
    /// The files arriving in pieces over several lanes, shared by every
    /// session (`storage::pieces`).
    pub(in crate::engine::receiver) pieces: std::sync::Arc<super::storage::pieces::PieceBoard>,
}

/// What the receiver does with the files it accepts. Every output checks
/// each chunk and verifies each file's digest before its ACK.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Output {
    /// Stored under --dir: fsynced and renamed into place once verified.
    #[default]
    Dir,
    /// The one file or stream of the session, to standard output
    /// (--stdout; requires `once`).
    Stdout,
    /// Verified, then dropped: nothing is written anywhere (--discard).
    Discard,
    /// Each file to the standard input of `sh -c COMMAND`, run in --dir
    /// (--exec); received only if the command exits 0.
    Exec(String),
}

impl Output {
    /// What the listening line says about it ("writing to DIR").
    pub fn describe(&self, dir: &std::path::Path) -> String {
        match self {
            Output::Dir => format!("writing to {}", dir.display()),
            Output::Stdout => "writing to standard output".into(),
            Output::Discard => "discarding what arrives (--discard: verified, not written)".into(),
            Output::Exec(cmd) => {
                format!("giving each file to `{cmd}` in {} (--exec)", dir.display())
            }
        }
    }

    /// Its name in JSON logs: the directory, "standard output" or "discard".
    pub fn json_name(&self, dir: &std::path::Path) -> String {
        match self {
            Output::Dir => dir.display().to_string(),
            Output::Stdout => "standard output".into(),
            Output::Discard => "discard".into(),
            Output::Exec(_) => "exec".into(),
        }
    }
}

/// Logs what the sender also hears through the chain: at info on a host
/// a chain started ([`ReceiverConfig::started_by_chain`]), else at warn,
/// or at the level after `else`:
/// `said_upstream!(cfg, [else error,] fields..., "message")`.
macro_rules! said_upstream {
    ($cfg:expr, else $level:ident, $($event:tt)+) => {
        if $cfg.started_by_chain() {
            ::tracing::info!($($event)+)
        } else {
            ::tracing::$level!($($event)+)
        }
    };
    ($cfg:expr, $($event:tt)+) => {
        if $cfg.started_by_chain() {
            ::tracing::info!($($event)+)
        } else {
            ::tracing::warn!($($event)+)
        }
    };
}
pub(crate) use said_upstream;

impl ReceiverConfig {
    /// A host of a relay chain started over ssh (`--ssh-relay`): what
    /// becomes of its sessions goes back to the sender in RESULTs, so its
    /// own log says it quietly (its stderr is on the sender's terminal).
    pub fn started_by_chain(&self) -> bool {
        self.relay_keys.is_some()
    }

    /// Bytes per ring slot: a chunk, and with a token its tag after it.
    pub fn slot_size(&self) -> u32 {
        let tag = if self.token.is_some() {
            crate::proto::CHUNK_TAG_LEN as u32
        } else {
            0
        };
        self.chunk_size.saturating_add(tag)
    }

    pub fn new(bind: SocketAddr, dir: PathBuf) -> Self {
        ReceiverConfig {
            bind,
            dir,
            once: false,
            wait: None,
            overwrite: false,
            slots: DEFAULT_SLOTS,
            chunk_size: DEFAULT_CHUNK_SIZE,
            given: Given::default(),
            busy_poll: false,
            ack_timeout: crate::engine::AckTimeout::Auto,
            timeout: DEFAULT_TIMEOUT,
            max_size: u64::MAX,
            max_sessions: DEFAULT_MAX_SESSIONS,
            max_files: crate::proto::DEFAULT_MAX_FILES,
            max_session_bytes: u64::MAX,
            token: None,
            output: Output::Dir,
            link_dest: None,
            progress: ProgressSink::default(),
            allow: Vec::new(),
            umask: crate::sys::os::process_umask(),
            keep_modes: false,
            partial_ttl: DEFAULT_PARTIAL_TTL,
            sweep: true,
            threads: DEFAULT_WRITER_THREADS as usize,
            allow_dotfiles: false,
            relay: false,
            relay_source: None,
            relay_keys: None,
            pieces: Default::default(),
        }
    }
}
