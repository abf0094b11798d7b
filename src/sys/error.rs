//! The one error type of the `sys` layer; the engine maps it to exit codes.
#![forbid(unsafe_code)]

use std::time::Duration;

/// Errors of a system or verbs call.
#[derive(Debug, thiserror::Error)]
pub enum SysError {
    /// No RDMA device (or no RDMA stack at all), with the first missing
    /// step found (`SysError::no_device`).
    #[error("no RDMA device found: {cause}. `rdma-xfer-gen doctor` checks every step")]
    NoDevice {
        /// What is missing, and the command that adds it.
        cause: String,
    },
    /// An address to bind or connect from that no RDMA device has.
    #[error("{0}")]
    NotRdmaAddress(String),
    /// A call failed with an errno.
    #[error("{call} failed: {source}")]
    Call {
        /// The library or system call.
        call: &'static str,
        /// What errno said.
        source: std::io::Error,
    },
    /// A post call failed, but the provider did not name our request as
    /// the one it refused (`bad_wr`): it may have queued it (rxe and siw
    /// queue a request, then report a failed doorbell). Its buffer stays
    /// with the queue pair, and its work request id in flight, until its
    /// completion or the queue pair's end.
    #[error(
        "{call} failed: {source} (the request may still run: its buffer stays with the queue pair)"
    )]
    PostHeld {
        /// The post call.
        call: &'static str,
        /// What it returned.
        source: std::io::Error,
    },
    /// `ibv_poll_cq` returned a negative value: not an errno, the CQ itself
    /// is broken (overrun or a device error).
    #[error("ibv_poll_cq failed (returned {ret}): the completion queue is unusable")]
    PollCq {
        /// The value returned.
        ret: i32,
    },
    /// A wait passed its deadline.
    #[error("timed out after {:.1}s waiting for {what}", .after.as_secs_f64())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the wait lasted.
        after: Duration,
    },
    /// A connection manager event other than the one awaited.
    #[error(
        "{} (rdma_cm: {got} while waiting for {want}, status {status})",
        cm_failure_hint(*.got)
    )]
    UnexpectedEvent {
        /// The event awaited.
        want: &'static str,
        /// The event that came.
        got: crate::sys::rdma::CmEventKind,
        /// Its status field.
        status: i32,
    },
    /// The peer disconnected.
    #[error("peer disconnected")]
    Disconnected,
    /// A work request completed with an error status. No opcode: verbs
    /// leaves it undefined in a failed completion.
    #[error("work request {wr_id:#x} failed: {status}")]
    WorkRequest {
        /// The request's id.
        wr_id: u64,
        /// The status, as text.
        status: String,
        /// Retry-exceeded style statuses mean the peer is gone.
        peer_lost: bool,
    },
    /// RLIMIT_MEMLOCK is too low for the memory to register (and the
    /// process lacks CAP_IPC_LOCK, which would lift the limit).
    #[error("{}", memlock_message(*.needed, what.as_deref(), *.pinned, *.limit, *.hard))]
    Memlock {
        /// Bytes wanted.
        needed: u64,
        /// What they are for, in words ("the ring: --slots 16 ..."), if
        /// more is known than a registration's size.
        what: Option<String>,
        /// Bytes this process has pinned or locked already.
        pinned: u64,
        /// The soft limit.
        limit: u64,
        /// The hard limit (`u64::MAX`: unlimited).
        hard: u64,
    },
    /// SIGINT or SIGTERM arrived during a wait.
    #[error("interrupted by signal")]
    Interrupted,
    /// The caller asked for something impossible (a misuse the types could
    /// not rule out: a buffer of another pool, a range out of bounds...).
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl SysError {
    /// `NoDevice`, naming the first missing step of the stack as the
    /// kernel shows it now.
    pub fn no_device() -> Self {
        SysError::NoDevice {
            cause: crate::sys::rdma::Inventory::read().no_device_cause(),
        }
    }

    /// Builds a `Call` error from the current `errno`.
    pub(crate) fn last_os(call: &'static str) -> Self {
        SysError::Call {
            call,
            source: std::io::Error::last_os_error(),
        }
    }

    /// Builds a `Call` error from a returned (positive or negative) errno value.
    pub(crate) fn from_ret(call: &'static str, ret: i32) -> Self {
        SysError::Call {
            call,
            source: std::io::Error::from_raw_os_error(ret.saturating_abs()),
        }
    }
}

/// Result of a `sys` call.
pub type Result<T> = std::result::Result<T, SysError>;

/// The message of `SysError::Memlock`: the numbers and every way out.
fn memlock_message(needed: u64, what: Option<&str>, pinned: u64, limit: u64, hard: u64) -> String {
    use crate::units::format_bytes;
    let what = what.map(|w| format!(" ({w})")).unwrap_or_default();
    let hard = match hard {
        u64::MAX => "unlimited".to_string(),
        h => format_bytes(h),
    };
    format!(
        "cannot lock {} of memory for RDMA{what}: RLIMIT_MEMLOCK is {} (hard limit {hard}) and \
         {} is pinned already; raise it with `ulimit -l unlimited` (or a memlock entry in \
         /etc/security/limits.conf, or LimitMEMLOCK=infinity for a systemd unit), or use \
         fewer/smaller buffers",
        format_bytes(needed),
        format_bytes(limit),
        format_bytes(pinned),
    )
}

/// What an rdma_cm failure event most likely means, in words.
fn cm_failure_hint(got: crate::sys::rdma::CmEventKind) -> &'static str {
    use crate::sys::rdma::CmEventKind::*;
    match got {
        Rejected => {
            "the connection was refused: nothing listens on that port (is the receiver \
             running there, with the same --port?), or the receiver refused this address \
             (--allow) or has too many connections authenticating"
        }
        AddrError => {
            "no RDMA device here can reach that address (is an RDMA or rxe device on the \
             interface that routes to it? --source picks the local address)"
        }
        RouteError => "no route to that address over RDMA",
        Unreachable => "the peer did not answer (unreachable, or its RDMA device is down)",
        ConnectError => "the connection could not be established",
        DeviceRemoval => "the RDMA device went away",
        _ => "the connection failed",
    }
}
