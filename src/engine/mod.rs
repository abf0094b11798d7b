//! The engine drives the pure session state machines of `proto` over the
//! verbs wrapper and the file system: the sender's pipeline (file ->
//! registered staging buffers -> RDMA WRITE WITH IMM, limited by credits)
//! and the receiver's ring (completion -> CRC check -> pwrite -> credit).
#![forbid(unsafe_code)]

mod control;
mod digest;
pub mod entries;
#[cfg(feature = "fault-injection")]
mod fault;
pub mod filter;
pub mod fit;
mod link;
#[cfg(test)]
mod memory_wire;
pub mod per_byte;
pub mod progress;
mod reader;
pub mod receiver;
pub mod relay;
pub mod remote;
mod report;
pub mod sender;
mod stdio;
mod worker;

pub use digest::{FileHasher, crc32_of_chunks};
pub use progress::{FileProgress, Listening, NoProgress, Progress, ProgressSink};
pub use report::{FileEvent, FileFailure, FileReport, Outcome, Phases, Totals};

use crate::error::XferError;
use std::net::SocketAddr;
use std::time::Duration;

/// The port both tools use unless told otherwise.
pub const DEFAULT_PORT: u16 = 7471;

/// Default slot (chunk) size of the receiver's ring and the sender's buffers.
pub const DEFAULT_CHUNK_SIZE: u32 = 1 << 20;
/// Default number of ring slots.
pub const DEFAULT_SLOTS: u32 = 16;
/// Default number of RDMA WRITEs the sender keeps in flight.
pub const DEFAULT_DEPTH: u32 = 16;
/// Default for every phase timeout and the no-progress timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// Environment variable that sets the QPs' local ACK timeout exponent
/// (`AckTimeout`, read by the tools' command line).
pub const ACK_TIMEOUT_ENV: &str = "RDMA_XFER_ACK_TIMEOUT";

/// The queue pairs' local ACK timeout, 4.096 us * 2^exponent. On a
/// hardware NIC it also bounds how long a connection survives an outage:
/// the transport gives up after 7 retries, about 8 timeouts without any
/// ACK (SoftRoCE reads a retry count of 7 as "forever"; there the tools'
/// `--timeout` does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckTimeout {
    /// `default_ack_timeout` for the device and the kernel.
    Auto,
    /// Whatever the kernel chooses (RoCE: 2^17, about 0.5 s).
    Kernel,
    /// This exponent, 1..=31.
    Exponent(u8),
}

/// Reads `ACK_TIMEOUT_ENV`'s value: unset or empty is `Auto`, `0` the
/// kernel's, 1..=31 that exponent; anything else is a usage error.
pub fn parse_ack_timeout(value: Option<&std::ffi::OsStr>) -> Result<AckTimeout, XferError> {
    let Some(value) = value else {
        return Ok(AckTimeout::Auto);
    };
    let text = value.to_str().map(str::trim);
    match text.map(str::parse::<u8>) {
        Some(_) if text == Some("") => Ok(AckTimeout::Auto),
        Some(Ok(0)) => Ok(AckTimeout::Kernel),
        Some(Ok(e @ 1..=31)) => Ok(AckTimeout::Exponent(e)),
        _ => Err(XferError::Usage(format!(
            "{ACK_TIMEOUT_ENV}={value:?}: expected an exponent 1..31 (4.096 us x 2^N; 14 = 67 \
             ms), or 0 for the kernel's choice"
        ))),
    }
}

/// The ACK timeout exponent of `AckTimeout::Auto`: 14 (67 ms, perftest's
/// default). Every lost packet that no later packet reveals (the last one
/// before the pipeline waits, or a lost ACK) stalls the queue for one
/// timeout, so the kernel's 0.5 s made 1% loss cost 96% of the throughput.
/// SoftRoCE before kernel 6.12 gets 15 (134 ms): with 14 its connections
/// break ("remote invalid request") when spurious retransmissions (ACKs
/// late under CPU starvation) meet packet loss, perftest's ib_write_bw's
/// as well (measured on 6.1, docs/performance.md). A device that cannot be
/// queried (`None`) may be SoftRoCE.
pub fn default_ack_timeout(vendor_id: Option<u32>, kernel: Option<(u32, u32)>) -> u8 {
    /// `ibv_device_attr.vendor_id` of rdma_rxe (RXE_VENDOR_ID).
    const SOFT_ROCE_VENDOR: u32 = 0xFF_FFFF;
    let maybe_soft_roce = vendor_id.is_none_or(|v| v == SOFT_ROCE_VENDOR);
    // An unknown kernel counts as old: the longer timeout only costs speed.
    let fixed_kernel = kernel.is_some_and(|k| k >= (6, 12));
    if maybe_soft_roce && !fixed_kernel {
        15
    } else {
        14
    }
}

/// The running kernel's (major, minor), from its release string.
pub fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    parse_kernel_release(&release)
}

fn parse_kernel_release(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.trim().split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Sets the QP's ACK timeout before connect/accept (see `AckTimeout`).
pub(crate) fn tune_ack_timeout(id: &crate::sys::rdma::CmId, setting: AckTimeout) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let exp = match setting {
        AckTimeout::Kernel => return,
        AckTimeout::Exponent(e) => e,
        AckTimeout::Auto => {
            let vendor = id
                .device_vendor_id()
                .inspect_err(|e| tracing::debug!("device vendor unknown: {e}"))
                .ok();
            default_ack_timeout(vendor, kernel_version())
        }
    };
    tracing::debug!(exp, "ACK timeout 4.096 us * 2^exp");
    if let Err(e) = id.set_ack_timeout(exp) {
        // A warning once per process, not for every session of a serving
        // receiver; later failures still reach the debug log.
        if WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::debug!("ACK timeout 2^{exp} not applied: {e}");
        } else {
            tracing::warn!("ACK timeout 2^{exp} not applied: {e}");
        }
    }
}

/// Largest accepted chunk size: the receive completion's byte_len and the
/// wire's u32 fields bound it, and bigger slots bring nothing.
pub const MAX_CHUNK_SIZE: u32 = 64 << 20;
/// Largest ring / staging pool, to keep a typo from pinning all memory.
pub const MAX_SLOTS: u32 = 1024;

/// Checks a (chunk size, count) pair given on the command line.
pub fn check_buffers(chunk_size: u64, count: u64, what: &str) -> Result<(u32, u32), XferError> {
    if chunk_size < 4096 || chunk_size > MAX_CHUNK_SIZE as u64 {
        return Err(XferError::Usage(format!(
            "chunk size must be between 4K and {}M, got {chunk_size}",
            MAX_CHUNK_SIZE >> 20
        )));
    }
    if count == 0 || count > MAX_SLOTS as u64 {
        return Err(XferError::Usage(format!(
            "{what} must be between 1 and {MAX_SLOTS}, got {count}"
        )));
    }
    Ok((chunk_size as u32, count as u32))
}

/// How often a wait for completions also checks for a CM disconnect, so a
/// vanished peer is noticed long before the no-progress timeout.
const DISCONNECT_CHECK: Duration = Duration::from_millis(500);

/// Waits for completions on the endpoint's CQ until `deadline`, in slices
/// of at most `slice`; after each empty slice it looks whether the peer
/// disconnected. Before every slice `give_up` may end the wait (its
/// error); at the deadline the wait ends with `expired`'s error.
pub(crate) fn wait_completions_until(
    ep: &crate::sys::rdma::Endpoint,
    wcs: &mut Vec<crate::sys::rdma::Completion>,
    deadline: std::time::Instant,
    slice: Duration,
    what: &str,
    give_up: &dyn Fn() -> Option<XferError>,
    expired: &dyn Fn() -> XferError,
) -> Result<(), XferError> {
    use crate::sys::SysError;
    loop {
        if let Some(e) = give_up() {
            return Err(e);
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match ep.wait(wcs, 16, left.min(slice), what) {
            Ok(_) => return Ok(()),
            Err(SysError::Timeout { .. }) => {
                if ep.cm_id().peer_disconnected() {
                    return Err(XferError::PeerLost(format!(
                        "the peer disconnected while we waited for {what}"
                    )));
                }
                if std::time::Instant::now() >= deadline {
                    return Err(expired());
                }
            }
            Err(e) => return Err(completion_error(ep, e)),
        }
    }
}

/// Maps verbs errors that mean "the peer went away" to PeerLost.
fn peer_lost_or(e: crate::sys::SysError) -> XferError {
    use crate::sys::SysError;
    match e {
        SysError::Disconnected => XferError::PeerLost("the peer disconnected".into()),
        SysError::WorkRequest {
            peer_lost: true, ..
        } => XferError::PeerLost(format!("the peer stopped responding ({e})")),
        other => XferError::Sys(other),
    }
}

/// Classifies an error from polling the CQ: besides `peer_lost_or`, any
/// failed work request counts as PeerLost when a disconnect follows promptly
/// (a dying peer tears down its memory first, so our writes fail with a
/// remote access error just before its disconnect arrives).
pub(crate) fn completion_error(
    ep: &crate::sys::rdma::Endpoint,
    e: crate::sys::SysError,
) -> XferError {
    use crate::sys::SysError;
    match e {
        SysError::WorkRequest {
            peer_lost: false, ..
        } if ep.cm_id().disconnected_within(Duration::from_secs(2)) => {
            XferError::PeerLost(format!("the peer went away ({e})"))
        }
        other => peer_lost_or(other),
    }
}

/// This connection's identity for the authentication transcript: both
/// addresses (from rdma_cm) and both QP numbers (from the QP), each put in
/// its role's place.
pub fn connection_id(
    ep: &crate::sys::rdma::Endpoint,
    side: crate::proto::Role,
) -> Result<crate::proto::ConnectionId, crate::error::XferError> {
    let id = ep.cm_id();
    // rdma_cm gives both once connected; a connection without them is
    // gone.
    let missing = |what: &str| {
        crate::error::XferError::PeerLost(format!("the connection has no {what} address"))
    };
    let local = id.local_addr().ok_or_else(|| missing("local"))?.ip();
    let peer = id.peer_addr().ok_or_else(|| missing("peer"))?.ip();
    let (local_qpn, peer_qpn) = ep.qp_numbers()?;
    Ok(match side {
        crate::proto::Role::Receiver => crate::proto::ConnectionId {
            receiver_addr: local,
            receiver_qpn: local_qpn,
            sender_addr: peer,
            sender_qpn: peer_qpn,
        },
        crate::proto::Role::Sender => crate::proto::ConnectionId {
            receiver_addr: peer,
            receiver_qpn: peer_qpn,
            sender_addr: local,
            sender_qpn: local_qpn,
        },
    })
}

/// A work request's id, as posted and as its completion brings it back:
/// its kind in the top byte, and below it what the engine needs to find
/// again (a receive's pool and buffer, a send's buffer, a write's chunk).
/// Public for the test tools that speak to a receiver the way the sender
/// does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WrId(u64);

/// What a work request was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WrKind {
    /// A posted receive.
    Recv,
    /// A control-message SEND.
    Send,
    /// A data RDMA WRITE (WITH IMM).
    Write,
    /// None of ours.
    Unknown,
}

impl WrId {
    const KIND_SHIFT: u32 = 56;
    const POOL_SHIFT: u32 = 32;
    /// Receive pools a receive's id can name.
    pub const RECV_POOLS: usize = 0x100;
    const LOW_MASK: u64 = (1 << Self::POOL_SHIFT) - 1;

    fn of(kind: u64, low: u64) -> Self {
        WrId(kind << Self::KIND_SHIFT | low & ((1 << Self::KIND_SHIFT) - 1))
    }

    /// A receive into buffer `buffer` of receive pool `pool` (below
    /// `RECV_POOLS`).
    pub fn recv(pool: usize, buffer: usize) -> Self {
        let pool = pool as u64 & (Self::RECV_POOLS as u64 - 1);
        Self::of(1, pool << Self::POOL_SHIFT | buffer as u64 & Self::LOW_MASK)
    }

    /// A SEND from buffer `buffer`.
    pub fn send(buffer: usize) -> Self {
        Self::of(2, buffer as u64 & Self::LOW_MASK)
    }

    /// A WRITE of the chunk or staging buffer `index` (below 2^56).
    pub fn write(index: u64) -> Self {
        Self::of(3, index)
    }

    /// The id a completion carries.
    pub const fn from_raw(raw: u64) -> Self {
        WrId(raw)
    }

    /// The id to post with.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// What the request was.
    pub fn kind(self) -> WrKind {
        match self.0 >> Self::KIND_SHIFT {
            1 => WrKind::Recv,
            2 => WrKind::Send,
            3 => WrKind::Write,
            _ => WrKind::Unknown,
        }
    }

    /// The receive pool a receive's id names.
    pub fn recv_pool(self) -> usize {
        ((self.0 >> Self::POOL_SHIFT) & (Self::RECV_POOLS as u64 - 1)) as usize
    }
}

/// Resolves a host name or IPv4/IPv6 literal with a port. A name that
/// does not resolve is a usage error (exit 2: a typo, found before
/// connecting); a resolver that cannot answer right now is a connect error
/// worth retrying (exit 3). Of several addresses an IPv4 one is preferred:
/// a receiver listens on IPv4 by default.
pub fn resolve(host: &str, port: u16) -> Result<SocketAddr, XferError> {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = match std::net::ToSocketAddrs::to_socket_addrs(&(host, port)) {
        Ok(a) => a.collect(),
        // std reports getaddrinfo's EAI_AGAIN only through its message
        // (gai_strerror's "Temporary failure in name resolution").
        Err(e) if e.to_string().contains("Temporary failure") => {
            return Err(XferError::Connect {
                addr: format!("{host}:{port}"),
                source: crate::sys::SysError::Call {
                    call: "getaddrinfo",
                    source: std::io::Error::from_raw_os_error(libc::EAGAIN),
                },
            });
        }
        Err(e) => {
            let why = e.to_string();
            let why = why
                .strip_prefix("failed to lookup address information: ")
                .unwrap_or(&why);
            return Err(XferError::Usage(format!(
                "cannot resolve host name {host}: {why}"
            )));
        }
    };
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| XferError::Usage(format!("host name {host} has no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_request_ids_keep_their_kind_and_what_they_name() {
        let r = WrId::recv(3, 17);
        assert_eq!((r.kind(), r.recv_pool()), (WrKind::Recv, 3));
        assert_eq!(WrId::from_raw(r.raw()), r);
        assert_eq!(WrId::send(5).kind(), WrKind::Send);
        assert_eq!(WrId::write(u64::MAX).kind(), WrKind::Write);
        assert_eq!(
            WrId::recv(WrId::RECV_POOLS - 1, usize::MAX).recv_pool(),
            0xff
        );
        assert_eq!(WrId::from_raw(0).kind(), WrKind::Unknown);
        assert_eq!(WrId::from_raw(9 << 56).kind(), WrKind::Unknown);
        assert_ne!(WrId::send(1), WrId::write(1));
    }

    #[test]
    fn kernel_release_strings_parse() {
        assert_eq!(parse_kernel_release("6.1.0-56-amd64\n"), Some((6, 1)));
        assert_eq!(parse_kernel_release("6.12.107+deb13-amd64"), Some((6, 12)));
        assert_eq!(parse_kernel_release("5.15.0"), Some((5, 15)));
        assert_eq!(parse_kernel_release("6"), None);
        assert_eq!(parse_kernel_release("x.y"), None);
        assert_eq!(parse_kernel_release(""), None);
    }

    #[test]
    fn ack_timeout_settings_parse_strictly() {
        use std::ffi::OsStr;
        let p = |v: &str| parse_ack_timeout(Some(OsStr::new(v)));
        assert_eq!(parse_ack_timeout(None).unwrap(), AckTimeout::Auto);
        assert_eq!(p("").unwrap(), AckTimeout::Auto);
        assert_eq!(p("  ").unwrap(), AckTimeout::Auto);
        assert_eq!(p("0").unwrap(), AckTimeout::Kernel);
        assert_eq!(p(" 14 ").unwrap(), AckTimeout::Exponent(14));
        assert_eq!(p("1").unwrap(), AckTimeout::Exponent(1));
        assert_eq!(p("31").unwrap(), AckTimeout::Exponent(31));
        for bad in ["32", "255", "300", "-1", "abc", "1.5", "0x10"] {
            let e = p(bad).unwrap_err();
            assert!(matches!(e, XferError::Usage(_)), "{bad}: {e}");
            assert!(e.to_string().contains("RDMA_XFER_ACK_TIMEOUT"), "{e}");
        }
        use std::os::unix::ffi::OsStrExt;
        assert!(parse_ack_timeout(Some(OsStr::from_bytes(b"\xff"))).is_err());
    }

    #[test]
    fn ack_timeout_is_longer_only_on_soft_roce_before_6_12() {
        let rxe = Some(0xFF_FFFF);
        let mlx = Some(0x02c9);
        assert_eq!(default_ack_timeout(rxe, Some((6, 1))), 15);
        assert_eq!(default_ack_timeout(rxe, Some((5, 15))), 15);
        assert_eq!(default_ack_timeout(rxe, None), 15);
        assert_eq!(default_ack_timeout(rxe, Some((6, 12))), 14);
        assert_eq!(default_ack_timeout(rxe, Some((7, 0))), 14);
        assert_eq!(default_ack_timeout(mlx, Some((6, 1))), 14);
        assert_eq!(default_ack_timeout(mlx, None), 14);
        // A device that cannot be queried may be SoftRoCE.
        assert_eq!(default_ack_timeout(None, Some((6, 1))), 15);
        assert_eq!(default_ack_timeout(None, Some((6, 12))), 14);
    }
}
