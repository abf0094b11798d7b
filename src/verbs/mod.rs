//! Thin safe wrapper over `rdma-sys` (libibverbs + librdmacm).
//!
//! Every `unsafe` block of the crate lives under this module. Resources are
//! RAII types; children hold `Rc`s of their parents so that Drop always runs
//! in a legal order (QP before CQ and PD, MR before PD, CM id before its
//! event channel), on success and on every error path.

mod cm;
mod device;
mod memory;
pub mod os;
mod queue;

pub use cm::{CmEventKind, CmId, ConnectRequest, EventChannel, IncomingConnection};
pub use device::probe_devices;
pub use memory::{Access, MemoryRegion, SlotFiller, SlotPool, SlotToken};
pub use queue::{CompletionQueue, Endpoint, ProtectionDomain, QpCaps, WcOpcode, WorkCompletion};

use std::time::Duration;

/// Errors of the verbs layer. The engine maps them to exit codes.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    #[error(
        "no RDMA device found (is rdma_rxe or an RDMA NIC driver loaded? see scripts/rxe-setup.sh)"
    )]
    NoDevice,
    #[error("{call} failed: {source}")]
    Call {
        call: &'static str,
        source: std::io::Error,
    },
    #[error("timed out after {:.1}s waiting for {what}", .after.as_secs_f64())]
    Timeout { what: String, after: Duration },
    #[error("connection failed while waiting for {want}: got {got} (status {status})")]
    UnexpectedEvent {
        want: &'static str,
        got: CmEventKind,
        status: i32,
    },
    #[error("peer disconnected")]
    Disconnected,
    // No opcode: verbs leaves it undefined in a failed completion.
    #[error("work request {wr_id:#x} failed: {status}")]
    WorkRequest {
        wr_id: u64,
        status: String,
        /// Retry-exceeded style statuses mean the peer is gone.
        peer_lost: bool,
    },
    #[error(
        "cannot lock {needed} bytes of memory for RDMA: RLIMIT_MEMLOCK is {limit} (hard limit {hard}); raise it with `ulimit -l unlimited` (or a memlock entry in /etc/security/limits.conf, or LimitMEMLOCK= for a systemd unit), or use fewer/smaller buffers"
    )]
    Memlock { needed: u64, limit: u64, hard: u64 },
    #[error("interrupted by signal")]
    Interrupted,
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl VerbsError {
    /// Builds a `Call` error from the current `errno`.
    pub(crate) fn last_os(call: &'static str) -> Self {
        VerbsError::Call {
            call,
            source: std::io::Error::last_os_error(),
        }
    }

    /// Builds a `Call` error from a returned (positive or negative) errno value.
    pub(crate) fn from_ret(call: &'static str, ret: i32) -> Self {
        let errno = if ret < 0 { -ret } else { ret };
        VerbsError::Call {
            call,
            source: std::io::Error::from_raw_os_error(errno),
        }
    }
}

pub type Result<T> = std::result::Result<T, VerbsError>;
