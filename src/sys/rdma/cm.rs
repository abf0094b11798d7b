//! Connection management (librdmacm): event channels and CM ids.

use super::{Result, SysError};
use crate::sys::os::{set_nonblocking, wait_readable};
use rdma_sys::*;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, Instant};

/// The CM events the tools care about; everything else is `Other`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmEventKind {
    /// `rdma_resolve_addr` found the local device for the peer's address.
    AddrResolved,
    /// Address resolution failed.
    AddrError,
    /// `rdma_resolve_route` found a path to the peer.
    RouteResolved,
    /// Route resolution failed.
    RouteError,
    /// A peer asks to connect (listening ids only).
    ConnectRequest,
    /// The peer answered our connect (ids without a QP only).
    ConnectResponse,
    /// Establishing the connection failed.
    ConnectError,
    /// The peer did not answer.
    Unreachable,
    /// The peer refused the connection (nothing listening, or it said no).
    Rejected,
    /// The connection is up.
    Established,
    /// The peer (or the local side) disconnected.
    Disconnected,
    /// The RDMA device went away.
    DeviceRemoval,
    /// The QP left its time-wait state after a disconnect.
    TimewaitExit,
    /// Any other event, by its raw number.
    Other(u32),
}

impl CmEventKind {
    /// Whether this failure event says the peer could not be reached
    /// (not there yet, not listening, a link or route down): worth trying
    /// again later, unlike a device that went away.
    pub fn is_unreachable(self) -> bool {
        matches!(
            self,
            Self::AddrError
                | Self::RouteError
                | Self::ConnectError
                | Self::Unreachable
                | Self::Rejected
        )
    }

    fn from_raw(raw: rdma_cm_event_type::Type) -> Self {
        use rdma_cm_event_type::*;
        match raw {
            RDMA_CM_EVENT_ADDR_RESOLVED => Self::AddrResolved,
            RDMA_CM_EVENT_ADDR_ERROR => Self::AddrError,
            RDMA_CM_EVENT_ROUTE_RESOLVED => Self::RouteResolved,
            RDMA_CM_EVENT_ROUTE_ERROR => Self::RouteError,
            RDMA_CM_EVENT_CONNECT_REQUEST => Self::ConnectRequest,
            RDMA_CM_EVENT_CONNECT_RESPONSE => Self::ConnectResponse,
            RDMA_CM_EVENT_CONNECT_ERROR => Self::ConnectError,
            RDMA_CM_EVENT_UNREACHABLE => Self::Unreachable,
            RDMA_CM_EVENT_REJECTED => Self::Rejected,
            RDMA_CM_EVENT_ESTABLISHED => Self::Established,
            RDMA_CM_EVENT_DISCONNECTED => Self::Disconnected,
            RDMA_CM_EVENT_DEVICE_REMOVAL => Self::DeviceRemoval,
            RDMA_CM_EVENT_TIMEWAIT_EXIT => Self::TimewaitExit,
            other => Self::Other(other),
        }
    }
}

impl fmt::Display for CmEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            Self::AddrResolved => "ADDR_RESOLVED",
            Self::AddrError => "ADDR_ERROR",
            Self::RouteResolved => "ROUTE_RESOLVED",
            Self::RouteError => "ROUTE_ERROR",
            Self::ConnectRequest => "CONNECT_REQUEST",
            Self::ConnectResponse => "CONNECT_RESPONSE",
            Self::ConnectError => "CONNECT_ERROR",
            Self::Unreachable => "UNREACHABLE",
            Self::Rejected => "REJECTED",
            Self::Established => "ESTABLISHED",
            Self::Disconnected => "DISCONNECTED",
            Self::DeviceRemoval => "DEVICE_REMOVAL",
            Self::TimewaitExit => "TIMEWAIT_EXIT",
            Self::Other(n) => return write!(f, "CM event {n}"),
        };
        f.write_str(s)
    }
}

/// A CM event copied out of librdmacm and already acknowledged.
struct CmEvent {
    kind: CmEventKind,
    status: i32,
    /// The id the event is for: the listener for CONNECT_REQUEST, else the
    /// event's own id.
    owner: *mut rdma_cm_id,
    /// For CONNECT_REQUEST: the new id, owned by us from now on.
    new_id: *mut rdma_cm_id,
}

/// Events read from a shared channel for ids other than the one waiting,
/// kept for their owners (pure bookkeeping: the pointers are only
/// compared, never followed, here).
#[derive(Default)]
struct KeptEvents {
    events: std::collections::VecDeque<CmEvent>,
}

impl KeptEvents {
    /// The oldest kept event of `owner`.
    fn take_first(&mut self, owner: *mut rdma_cm_id) -> Option<CmEvent> {
        let at = self.events.iter().position(|ev| ev.owner == owner)?;
        self.events.remove(at)
    }

    /// Keeps `ev`, unless it is a connection request and
    /// `MAX_KEPT_REQUESTS` are kept already: then it is handed back, to be
    /// refused.
    fn keep(&mut self, ev: CmEvent) -> Option<CmEvent> {
        if !ev.new_id.is_null()
            && self.events.iter().filter(|k| !k.new_id.is_null()).count() >= MAX_KEPT_REQUESTS
        {
            return Some(ev);
        }
        self.events.push_back(ev);
        None
    }

    /// Every kept event, oldest first (the channel's end).
    fn drain_all(&mut self) -> Vec<CmEvent> {
        self.events.drain(..).collect()
    }

    /// Takes in the kept events of an id moved onto this channel.
    fn absorb(&mut self, events: std::collections::VecDeque<CmEvent>) {
        self.events.extend(events);
    }

    /// Takes out every kept event of `owner`, oldest first.
    fn take_all(&mut self, owner: *mut rdma_cm_id) -> std::collections::VecDeque<CmEvent> {
        let (theirs, rest) = std::mem::take(&mut self.events)
            .into_iter()
            .partition(|ev| ev.owner == owner);
        self.events = rest;
        theirs
    }
}

/// An rdma_cm event channel. Its fd is non-blocking and waited on with poll().
/// Several ids may share it (a listener and the requests not yet moved to
/// their own channel): each waits for its own events, and an event read
/// while waiting for another id's is kept for its owner.
pub struct EventChannel {
    raw: *mut rdma_event_channel,
    kept: std::cell::RefCell<KeptEvents>,
}

impl EventChannel {
    /// Creates a channel (its fd made non-blocking), shared by the ids
    /// created on it.
    pub fn new() -> Result<Rc<Self>> {
        Self::create().map(Rc::new)
    }

    fn create() -> Result<Self> {
        // SAFETY: plain constructor; NULL is checked.
        let raw = unsafe { rdma_create_event_channel() };
        if raw.is_null() {
            return Err(map_no_device(SysError::last_os(
                "rdma_create_event_channel",
            )));
        }
        let ch = EventChannel {
            raw,
            kept: Default::default(),
        };
        set_nonblocking(ch.fd(), "fcntl(event channel)")?;
        Ok(ch)
    }

    /// The channel's descriptor, borrowed from the channel.
    fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: self.raw is valid for the lifetime of self, and its fd
        // stays open until rdma_destroy_event_channel in Drop, which cannot
        // run while the returned borrow of self lives.
        unsafe { std::os::fd::BorrowedFd::borrow_raw((*self.raw).fd) }
    }

    /// The next event for `owner` within `timeout`, acknowledged
    /// immediately (all data we need is copied out first). Events for other
    /// ids read meanwhile are kept for them.
    fn next_event(&self, owner: *mut rdma_cm_id, timeout: Duration, what: &str) -> Result<CmEvent> {
        if let Some(ev) = self.kept.borrow_mut().take_first(owner) {
            return Ok(ev);
        }
        let deadline = crate::sys::os::deadline_after(timeout);
        loop {
            let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
            // SAFETY: self.raw is valid; ev is a valid out-pointer. The fd is
            // non-blocking, so this returns EAGAIN when nothing is queued.
            let rc = unsafe { rdma_get_cm_event(self.raw, &mut ev) };
            if rc == 0 && !ev.is_null() {
                // SAFETY: ev is a valid event until acked; we copy and ack it.
                let out = unsafe {
                    let kind = CmEventKind::from_raw((*ev).event);
                    let status = (*ev).status;
                    let (owner, new_id) = if kind == CmEventKind::ConnectRequest {
                        ((*ev).listen_id, (*ev).id)
                    } else {
                        ((*ev).id, std::ptr::null_mut())
                    };
                    rdma_ack_cm_event(ev);
                    CmEvent {
                        kind,
                        status,
                        owner,
                        new_id,
                    }
                };
                if out.owner == owner {
                    return Ok(out);
                }
                self.keep(out);
                continue;
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock
                && err.kind() != std::io::ErrorKind::Interrupted
            {
                return Err(SysError::Call {
                    call: "rdma_get_cm_event",
                    source: err,
                });
            }
            if !wait_readable(self.fd(), deadline)? {
                return Err(SysError::Timeout {
                    what: what.to_string(),
                    after: timeout,
                });
            }
        }
    }

    /// Keeps an event read for another id. A connection request beyond
    /// `MAX_KEPT_REQUESTS` is refused at once: reading a request frees its
    /// place in the kernel's backlog, so keeping every one would let a
    /// flood of requests hold ids without bound.
    fn keep(&self, ev: CmEvent) {
        let refused = self.kept.borrow_mut().keep(ev);
        if let Some(ev) = refused {
            self.refuse(ev);
        }
    }

    /// Takes out the kept events of `owner` (an id leaving this channel).
    fn take_kept(&self, owner: *mut rdma_cm_id) -> std::collections::VecDeque<CmEvent> {
        self.kept.borrow_mut().take_all(owner)
    }

    /// Forgets the kept events of `owner` (an id about to be destroyed: a
    /// later id could get its address); the connection requests among them
    /// (a listener's, never taken) are refused.
    fn forget(&self, owner: *mut rdma_cm_id) {
        for ev in self.take_kept(owner) {
            self.refuse(ev);
        }
    }

    /// Refuses and destroys the id of a connection request never handed
    /// out, and forgets the events kept for it.
    fn refuse(&self, ev: CmEvent) {
        if ev.new_id.is_null() {
            return;
        }
        self.forget(ev.new_id);
        // SAFETY: new_id came with a CONNECT_REQUEST that was never handed
        // out, so it is ours alone and not accepted; its event is consumed
        // by value, so this is its only destruction.
        unsafe { reject_and_destroy(ev.new_id) };
    }
}

/// Refuses a connection request at the CM level and destroys its id.
///
/// # Safety
/// `raw` is the id of a connection request that was never accepted, owned
/// by the caller alone, and never used again.
unsafe fn reject_and_destroy(raw: *mut rdma_cm_id) {
    // SAFETY: the caller's promise: a live, unaccepted request id of ours.
    unsafe {
        rdma_reject(raw, std::ptr::null(), 0);
        rdma_destroy_id(raw);
    }
}

/// Connection requests kept for a listener while another id on its
/// channel waits for its own events (see `EventChannel::keep`).
const MAX_KEPT_REQUESTS: usize = 64;

impl Drop for EventChannel {
    fn drop(&mut self) {
        let left = self.kept.get_mut().drain_all();
        for ev in left {
            self.refuse(ev);
        }
        // SAFETY: every CmId holds an Rc to its channel, so no id uses it now.
        unsafe { rdma_destroy_event_channel(self.raw) };
    }
}

/// An rdma_cm identifier (like a socket). Destroyed on drop; a QP created on
/// it is owned by `Endpoint`, which is always dropped first because it holds
/// an `Rc` of this id.
pub struct CmId {
    raw: *mut rdma_cm_id,
    channel: Rc<EventChannel>,
}

/// A pending incoming connection, not yet accepted. Dropping it rejects it.
pub struct ConnectRequest {
    id: Option<CmId>,
}

impl ConnectRequest {
    /// The connecting peer's address (None if rdma_cm does not say).
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.id.as_ref().and_then(CmId::peer_addr)
    }

    /// Moves the new connection onto its own event channel, so that it can
    /// be served on another thread while the listener takes the next one.
    pub fn detach(mut self) -> Result<IncomingConnection> {
        let mut id = self
            .id
            .take()
            .ok_or(SysError::Invalid("request already taken".into()))?;
        let channel = match EventChannel::create() {
            Ok(c) => c,
            Err(e) => {
                self.id = Some(id);
                return Err(e);
            }
        };
        // SAFETY: both pointers are valid; migrating a fresh id with no
        // outstanding events is allowed.
        let rc = unsafe { rdma_migrate_id(id.raw, channel.raw) };
        if rc != 0 {
            let err = SysError::last_os("rdma_migrate_id");
            self.id = Some(id);
            return Err(err);
        }
        // The id now belongs to `channel`, and so do its events kept on the
        // listener's: take its pointer out of the CmId (whose drop then
        // skips it) and let go of the listener's channel.
        channel
            .kept
            .borrow_mut()
            .absorb(id.channel.take_kept(id.raw));
        let raw = std::mem::replace(&mut id.raw, std::ptr::null_mut());
        drop(id);
        Ok(IncomingConnection {
            raw,
            channel: Some(channel),
        })
    }

    /// Refuses the connection at the CM level (no QP was created).
    pub fn reject(mut self) {
        if let Some(id) = self.id.take() {
            // SAFETY: id.raw is a connect-request id not yet accepted.
            unsafe { rdma_reject(id.raw, std::ptr::null(), 0) };
        }
    }
}

/// An incoming connection on its own event channel, not yet accepted. Unlike
/// `CmId` it may cross threads. Dropping it rejects the connection.
pub struct IncomingConnection {
    raw: *mut rdma_cm_id,
    channel: Option<EventChannel>,
}

// SAFETY: the id and its private event channel are referenced by nothing
// else in the process; librdmacm allows using an id from any thread, and the
// pair moves as a unit.
unsafe impl Send for IncomingConnection {}

impl IncomingConnection {
    /// The connecting peer's address, for logs.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        peer_addr_of(self.raw)
    }

    /// The CM id, to build an endpoint on and accept (on this thread).
    pub fn into_id(mut self) -> Result<CmId> {
        let channel = self
            .channel
            .take()
            .ok_or(SysError::Invalid("connection already taken".into()))?;
        let raw = std::mem::replace(&mut self.raw, std::ptr::null_mut());
        Ok(CmId {
            raw,
            channel: Rc::new(channel),
        })
    }
}

impl Drop for IncomingConnection {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            // SAFETY: raw is a connect-request id that was never accepted and
            // is owned by us alone (dropped once, here); its channel is
            // dropped after this.
            unsafe { reject_and_destroy(self.raw) };
        }
    }
}

/// The peer address of a connected or connecting id.
fn peer_addr_of(raw: *mut rdma_cm_id) -> Option<SocketAddr> {
    if raw.is_null() {
        return None;
    }
    // The destination is a union of every sockaddr type, as large as a
    // sockaddr_storage: copy all of it (never read an IPv6 address through
    // a reference to the 16-byte `sockaddr` member).
    // SAFETY: raw is a valid id while its owner lives; the union field is
    // plain data of 128 bytes, read through a raw pointer into a
    // sockaddr_storage of the same size (read_unaligned: no alignment
    // assumption).
    let storage =
        unsafe { read_sockaddr_union(std::ptr::addr_of!((*raw).route.addr.dst_addr_union)) };
    sockaddr_to_std(&storage)
}

// The two unions read, checked where `cargo check` sees it too (the
// generic check fires only when the function is built).
const _: () = assert!(
    std::mem::size_of::<rdma_addr__bindgen_ty_1>() >= std::mem::size_of::<libc::sockaddr_storage>()
);
const _: () = assert!(
    std::mem::size_of::<rdma_addr__bindgen_ty_2>() >= std::mem::size_of::<libc::sockaddr_storage>()
);

/// Copies one of the route's address unions (`T`, the type of the field
/// read) into a sockaddr_storage; that `T` is at least as large is checked
/// at compile time, on `T` itself.
///
/// # Safety
/// `union` must point to a live, initialised `T`.
unsafe fn read_sockaddr_union<T>(union: *const T) -> libc::sockaddr_storage {
    const {
        assert!(std::mem::size_of::<T>() >= std::mem::size_of::<libc::sockaddr_storage>());
    }
    // SAFETY: the caller's pointer is to a live T of at least that many
    // bytes (checked above); plain data, read unaligned.
    unsafe { std::ptr::read_unaligned(union.cast::<libc::sockaddr_storage>()) }
}

/// Decodes an IPv4 or IPv6 socket address.
fn sockaddr_to_std(storage: &libc::sockaddr_storage) -> Option<SocketAddr> {
    let base = (storage as *const libc::sockaddr_storage).cast::<u8>();
    match storage.ss_family as i32 {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in,
            // which is smaller than sockaddr_storage; read_unaligned copies.
            let sin: libc::sockaddr_in = unsafe { std::ptr::read_unaligned(base.cast()) };
            let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
            Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
        }
        libc::AF_INET6 => {
            // SAFETY: as above, for sockaddr_in6 (28 bytes < 128).
            let sin6: libc::sockaddr_in6 = unsafe { std::ptr::read_unaligned(base.cast()) };
            let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.s6_addr);
            Some(SocketAddr::new(ip.into(), u16::from_be(sin6.sin6_port)))
        }
        _ => None,
    }
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // SAFETY: as in reject().
            unsafe { rdma_reject(id.raw, std::ptr::null(), 0) };
        }
    }
}

impl CmId {
    /// Creates a TCP-port-space id whose events arrive on `channel`.
    pub fn new(channel: &Rc<EventChannel>) -> Result<Self> {
        let mut raw: *mut rdma_cm_id = std::ptr::null_mut();
        // SAFETY: channel is valid; raw is a valid out-pointer.
        let rc = unsafe {
            rdma_create_id(
                channel.raw,
                &mut raw,
                std::ptr::null_mut(),
                rdma_port_space::RDMA_PS_TCP,
            )
        };
        if rc != 0 || raw.is_null() {
            return Err(map_no_device(SysError::last_os("rdma_create_id")));
        }
        Ok(CmId {
            raw,
            channel: channel.clone(),
        })
    }

    pub(crate) fn raw(&self) -> *mut rdma_cm_id {
        self.raw
    }

    /// The peer's address once connected (or connecting), for logs.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        peer_addr_of(self.raw)
    }

    /// This side's address of a bound, resolved or connected id.
    pub fn local_addr(&self) -> Option<SocketAddr> {
        if self.raw.is_null() {
            return None;
        }
        // SAFETY: as in peer_addr_of, for the source half of the route's
        // address (a union as large as a sockaddr_storage).
        let storage = unsafe {
            read_sockaddr_union(std::ptr::addr_of!((*self.raw).route.addr.src_addr_union))
        };
        sockaddr_to_std(&storage)
    }

    /// Sets the QP's local ACK timeout (4.096 us * 2^exp) used from the next
    /// connect/accept on. The kernel's RoCE default (2^17: about 0.5 s) makes
    /// every lost packet that no NAK reports stall the queue for that long.
    pub fn set_ack_timeout(&self, exp: u8) -> Result<()> {
        // Values of librdmacm's anonymous enum (rdma_cma.h).
        const RDMA_OPTION_ID: i32 = 0;
        const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;
        let mut val = exp;
        // SAFETY: self.raw is valid; optval points to one u8 as the option
        // requires and outlives the call.
        let rc = unsafe {
            rdma_set_option(
                self.raw,
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut val as *mut u8).cast(),
                1,
            )
        };
        if rc != 0 {
            return Err(SysError::last_os("rdma_set_option(ACK_TIMEOUT)"));
        }
        Ok(())
    }

    /// The IEEE vendor id the bound device reports (`ibv_query_device`):
    /// SoftRoCE (rdma_rxe) reports 0xFFFFFF.
    pub fn device_vendor_id(&self) -> Result<u32> {
        let ctx = self.context()?;
        // SAFETY: ibv_device_attr is plain data; all-zero is valid.
        let mut attr: ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is the live verbs context of this bound id; attr is a
        // valid out-parameter that outlives the call.
        let rc = unsafe { ibv_query_device(ctx, &mut attr) };
        if rc != 0 {
            return Err(SysError::Call {
                call: "ibv_query_device",
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        Ok(attr.vendor_id)
    }

    /// The verbs context of the device this id is bound to (NULL before the
    /// address is bound or resolved).
    pub(crate) fn context(&self) -> Result<*mut ibv_context> {
        // SAFETY: self.raw is valid for the lifetime of self.
        let ctx = unsafe { (*self.raw).verbs };
        if ctx.is_null() {
            return Err(SysError::Invalid(
                "CM id is not bound to an RDMA device".into(),
            ));
        }
        Ok(ctx)
    }

    /// The device and port this id is bound to: known once it is bound to
    /// an address of a device, None when bound to a wildcard address.
    pub fn bound_device(&self) -> Option<(String, u8)> {
        // SAFETY: self.raw is valid for the lifetime of self; verbs is NULL
        // or a device context that lives as long as the id.
        let ctx = unsafe { (*self.raw).verbs };
        if ctx.is_null() {
            return None;
        }
        // SAFETY: ctx is a live context, so its device pointer is valid; the
        // name is a NUL-terminated string owned by the device, copied at once.
        let name = unsafe { ibv_get_device_name((*ctx).device) };
        if name.is_null() {
            return None;
        }
        // SAFETY: as above, name is non-NULL and NUL-terminated.
        let name = unsafe { std::ffi::CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: self.raw is valid (see above).
        let port = unsafe { (*self.raw).port_num };
        Some((name, port))
    }

    /// Binds to a local address and starts listening.
    pub fn listen(&self, addr: SocketAddr, backlog: i32) -> Result<()> {
        let mut storage = SockAddr::from(addr);
        // SAFETY: storage holds a valid sockaddr of the right family.
        let rc = unsafe { rdma_bind_addr(self.raw, storage.as_mut_ptr()) };
        if rc != 0 {
            let err = SysError::last_os("rdma_bind_addr");
            return Err(map_bind_error(err, addr));
        }
        // SAFETY: self.raw is a bound id.
        let rc = unsafe { rdma_listen(self.raw, backlog) };
        if rc != 0 {
            return Err(SysError::last_os("rdma_listen"));
        }
        Ok(())
    }

    /// Waits for the next incoming connection on a listening id. Returns
    /// Ok(None) on timeout so that a server can check for shutdown.
    pub fn get_request(&self, timeout: Duration) -> Result<Option<ConnectRequest>> {
        let ev = match self.channel.next_event(self.raw, timeout, "a connection") {
            Ok(ev) => ev,
            Err(SysError::Timeout { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        if ev.kind == CmEventKind::ConnectRequest && !ev.new_id.is_null() {
            // The new id reports on the listener's channel until migrated.
            let id = CmId {
                raw: ev.new_id,
                channel: self.channel.clone(),
            };
            return Ok(Some(ConnectRequest { id: Some(id) }));
        }
        // Stray events on a listener (e.g. device removal) are not connections.
        if ev.kind == CmEventKind::DeviceRemoval {
            return Err(SysError::UnexpectedEvent {
                want: "CONNECT_REQUEST",
                got: ev.kind,
                status: ev.status,
            });
        }
        Ok(None)
    }

    /// Resolves the destination address (from `src` if given, else from
    /// whatever address routing picks) and the route to it.
    pub fn resolve(&self, src: Option<IpAddr>, dst: SocketAddr, timeout: Duration) -> Result<()> {
        let mut storage = SockAddr::from(dst);
        let mut src_storage = src.map(|ip| SockAddr::from(SocketAddr::new(ip, 0)));
        let src_ptr = match src_storage.as_mut() {
            Some(s) => s.as_mut_ptr(),
            None => std::ptr::null_mut(),
        };
        let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: storage (and src_storage if used) hold valid sockaddrs that
        // outlive the call; a NULL source means "any".
        let rc = unsafe { rdma_resolve_addr(self.raw, src_ptr, storage.as_mut_ptr(), ms) };
        // ENODEV/EADDRNOTAVAIL here (devices exist: the tools probe first)
        // mean the source address, or the interface towards the receiver,
        // has no RDMA device: a permanent mistake, not an unreachable peer.
        let not_rdma = || match src {
            Some(ip) => SysError::NotRdmaAddress(format!(
                "--source {ip}: no RDMA device has this address (`rdma link` lists the \
                 devices and their network interfaces)"
            )),
            None => SysError::NotRdmaAddress(format!(
                "no RDMA device is on the way to {}: use the receiver's address on the \
                 RDMA fabric (its IPoIB or RoCE interface), or pick the local one with \
                 --source (`rdma link` lists the devices and their network interfaces)",
                dst.ip()
            )),
        };
        if rc != 0 {
            let err = SysError::last_os("rdma_resolve_addr");
            if let SysError::Call { source, .. } = &err
                && matches!(
                    source.raw_os_error(),
                    Some(libc::ENODEV | libc::EADDRNOTAVAIL)
                )
            {
                return Err(not_rdma());
            }
            return Err(map_no_device(err));
        }
        match self.expect(
            CmEventKind::AddrResolved,
            "ADDR_RESOLVED",
            timeout + Duration::from_secs(1),
        ) {
            Err(SysError::UnexpectedEvent {
                got: CmEventKind::AddrError,
                status,
                ..
            }) if status == -libc::ENODEV || status == -libc::EADDRNOTAVAIL => {
                return Err(not_rdma());
            }
            other => other?,
        }
        // SAFETY: address is resolved, so route resolution may start.
        let rc = unsafe { rdma_resolve_route(self.raw, ms) };
        if rc != 0 {
            return Err(SysError::last_os("rdma_resolve_route"));
        }
        self.expect(
            CmEventKind::RouteResolved,
            "ROUTE_RESOLVED",
            timeout + Duration::from_secs(1),
        )
    }

    /// Active side: connects (a QP must exist on this id) and waits for
    /// ESTABLISHED.
    pub fn connect(&self, timeout: Duration) -> Result<()> {
        self.connect_while(timeout, || ())
    }

    /// As `connect`, but runs `meanwhile` once the request is on its way,
    /// so that set-up work overlaps the peer's reply (the REQ -> REP round
    /// trip; the connection completes only when the REP is read, after
    /// `meanwhile`). Its result is returned once ESTABLISHED; `timeout`
    /// bounds the whole, `meanwhile` included.
    pub fn connect_while<T>(&self, timeout: Duration, meanwhile: impl FnOnce() -> T) -> Result<T> {
        let started = Instant::now();
        let deadline = crate::sys::os::deadline_after(timeout);
        let mut param = conn_param();
        // SAFETY: param is a valid, fully initialised struct.
        let rc = unsafe { rdma_connect(self.raw, &mut param) };
        if rc != 0 {
            return Err(SysError::last_os("rdma_connect"));
        }
        let value = meanwhile();
        let left = deadline.saturating_duration_since(Instant::now());
        match self.expect(CmEventKind::Established, "ESTABLISHED", left) {
            // Say how long the whole connect waited, not what was left.
            Err(SysError::Timeout { what, .. }) => Err(SysError::Timeout {
                what,
                after: started.elapsed(),
            }),
            other => other.map(|()| value),
        }
    }

    /// Passive side: accepts (a QP must exist on this id) and waits for
    /// ESTABLISHED.
    pub fn accept(&self, timeout: Duration) -> Result<()> {
        self.accept_until(crate::sys::os::deadline_after(timeout), &|| false)
    }

    /// As `accept`, but waits at most until `deadline`, and gives up early
    /// (a timeout) as soon as `stop()` says so, checked every 100 ms.
    pub fn accept_until(&self, deadline: Instant, stop: &dyn Fn() -> bool) -> Result<()> {
        let mut param = conn_param();
        // SAFETY: param is valid; self.raw is a connect-request id with a QP.
        let rc = unsafe { rdma_accept(self.raw, &mut param) };
        if rc != 0 {
            return Err(SysError::last_os("rdma_accept"));
        }
        let started = Instant::now();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let slice = left.min(Duration::from_millis(100));
            match self.expect(CmEventKind::Established, "ESTABLISHED", slice) {
                Err(SysError::Timeout { .. }) if !left.is_zero() && !stop() => {}
                Err(SysError::Timeout { what, .. }) => {
                    return Err(SysError::Timeout {
                        what,
                        after: started.elapsed(),
                    });
                }
                other => return other,
            }
        }
    }

    /// Starts an orderly disconnect and waits (bounded) for DISCONNECTED, so
    /// that the peer sees the end of the connection promptly.
    pub fn disconnect(&self, timeout: Duration) {
        // SAFETY: disconnecting a connected or half-dead id is allowed; errors
        // (e.g. already disconnected) are harmless here.
        let rc = unsafe { rdma_disconnect(self.raw) };
        if rc == 0 {
            let _ = self.expect(CmEventKind::Disconnected, "DISCONNECTED", timeout);
        }
    }

    /// Non-blocking check whether the peer has disconnected.
    pub fn peer_disconnected(&self) -> bool {
        self.disconnected_within(Duration::ZERO)
    }

    /// Whether a disconnect arrives within `timeout` (a failed work request
    /// is often followed by one when the peer died).
    pub fn disconnected_within(&self, timeout: Duration) -> bool {
        matches!(
            self.channel.next_event(self.raw, timeout, "disconnect"),
            Ok(CmEvent {
                kind: CmEventKind::Disconnected | CmEventKind::DeviceRemoval,
                ..
            })
        )
    }

    fn expect(&self, want: CmEventKind, name: &'static str, timeout: Duration) -> Result<()> {
        let ev = self.channel.next_event(self.raw, timeout, name)?;
        if ev.kind == want && ev.status == 0 {
            return Ok(());
        }
        if ev.kind == CmEventKind::Disconnected {
            return Err(SysError::Disconnected);
        }
        Err(SysError::UnexpectedEvent {
            want: name,
            got: ev.kind,
            status: ev.status,
        })
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return; // handed over (see ConnectRequest::detach)
        }
        // Its kept events go with it (a later id could get its address);
        // a listener's untaken requests are refused.
        self.channel.forget(self.raw);
        // SAFETY: the QP on this id (if any) was destroyed by Endpoint, which
        // holds an Rc of this id; all events were acked when read.
        unsafe { rdma_destroy_id(self.raw) };
    }
}

fn conn_param() -> rdma_conn_param {
    rdma_conn_param {
        private_data: std::ptr::null(),
        private_data_len: 0,
        // Only RDMA WRITE and SEND are used: no RDMA READ resources needed.
        responder_resources: 1,
        initiator_depth: 1,
        flow_control: 1,
        retry_count: 7,
        // 7 = retry forever on receiver-not-ready; the application-level
        // timeouts bound the wait instead.
        rnr_retry_count: 7,
        srq: 0,
        qp_num: 0,
    }
}

/// A sockaddr big enough for IPv4 and IPv6.
struct SockAddr {
    storage: libc::sockaddr_storage,
}

impl From<SocketAddr> for SockAddr {
    fn from(addr: SocketAddr) -> Self {
        // SAFETY: sockaddr_storage is plain data; all-zero is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        match addr {
            SocketAddr::V4(v4) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: v4.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from_ne_bytes(v4.ip().octets()),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than and aligned for
                // sockaddr_in.
                unsafe {
                    std::ptr::write(
                        &mut storage as *mut libc::sockaddr_storage as *mut libc::sockaddr_in,
                        sin,
                    )
                };
            }
            SocketAddr::V6(v6) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: v6.port().to_be(),
                    sin6_flowinfo: v6.flowinfo(),
                    sin6_addr: libc::in6_addr {
                        s6_addr: v6.ip().octets(),
                    },
                    sin6_scope_id: v6.scope_id(),
                };
                // SAFETY: as above, for sockaddr_in6.
                unsafe {
                    std::ptr::write(
                        &mut storage as *mut libc::sockaddr_storage as *mut libc::sockaddr_in6,
                        sin6,
                    )
                };
            }
        }
        SockAddr { storage }
    }
}

impl SockAddr {
    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        &mut self.storage as *mut libc::sockaddr_storage as *mut libc::sockaddr
    }
}

/// librdmacm reports "no RDMA stack" as ENODEV/ENOSYS/ENOENT in several
/// calls; turn those into the one clear NoDevice error.
fn map_no_device(err: SysError) -> SysError {
    if let SysError::Call { source, .. } = &err
        && matches!(source.raw_os_error(), Some(libc::ENODEV | libc::ENOSYS))
    {
        return SysError::no_device();
    }
    err
}

fn map_bind_error(err: SysError, addr: SocketAddr) -> SysError {
    if let SysError::Call { source, .. } = &err {
        match source.raw_os_error() {
            Some(libc::EADDRINUSE) => {
                return SysError::Invalid(format!("address {addr} is already in use"));
            }
            Some(libc::EADDRNOTAVAIL) | Some(libc::ENODEV) => {
                return SysError::NotRdmaAddress(format!(
                    "cannot bind {addr}: no RDMA device has this address (`rdma link` lists \
                     the devices and their network interfaces)"
                ));
            }
            _ => {}
        }
    }
    map_no_device(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pointer that names an id in the bookkeeping (never followed).
    fn id(n: usize) -> *mut rdma_cm_id {
        std::ptr::without_provenance_mut(n * 64)
    }

    fn event(kind: CmEventKind, owner: usize, new_id: usize) -> CmEvent {
        CmEvent {
            kind,
            status: 0,
            owner: id(owner),
            new_id: if new_id == 0 {
                std::ptr::null_mut()
            } else {
                id(new_id)
            },
        }
    }

    #[test]
    fn kept_events_go_to_their_owner_oldest_first() {
        let mut kept = KeptEvents::default();
        assert!(kept.keep(event(CmEventKind::Established, 1, 0)).is_none());
        assert!(
            kept.keep(event(CmEventKind::ConnectRequest, 2, 10))
                .is_none()
        );
        assert!(kept.keep(event(CmEventKind::Disconnected, 1, 0)).is_none());
        assert!(kept.take_first(id(3)).is_none());
        let first = kept.take_first(id(1)).expect("the owner's first event");
        assert_eq!(first.kind, CmEventKind::Established);
        // Leaving: every event of an id at once, the others stay.
        let all = kept.take_all(id(1));
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].kind, CmEventKind::Disconnected);
        let request = kept.take_first(id(2)).expect("the listener's request");
        assert_eq!(request.new_id, id(10));
        assert!(kept.events.is_empty());
    }

    #[test]
    fn connection_requests_kept_are_bounded() {
        let mut kept = KeptEvents::default();
        for n in 0..MAX_KEPT_REQUESTS {
            assert!(
                kept.keep(event(CmEventKind::ConnectRequest, 1, 100 + n))
                    .is_none()
            );
        }
        // One more request is handed back (to be refused), other events
        // are still kept.
        let refused = kept.keep(event(CmEventKind::ConnectRequest, 1, 999));
        assert_eq!(refused.map(|ev| ev.new_id), Some(id(999)));
        assert!(kept.keep(event(CmEventKind::Established, 2, 0)).is_none());
        assert_eq!(kept.events.len(), MAX_KEPT_REQUESTS + 1);
        // Taking one out makes room again.
        assert!(kept.take_first(id(1)).is_some());
        assert!(
            kept.keep(event(CmEventKind::ConnectRequest, 1, 1000))
                .is_none()
        );
    }

    /// `what` stored at the start of a zeroed sockaddr_storage, as the
    /// kernel fills it.
    fn storage_with<T>(what: T) -> libc::sockaddr_storage {
        assert!(std::mem::size_of::<T>() <= std::mem::size_of::<libc::sockaddr_storage>());
        // SAFETY: sockaddr_storage is plain data; zeroed is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        // SAFETY: T fits in the storage (asserted above); write_unaligned
        // needs no alignment.
        unsafe {
            std::ptr::write_unaligned(
                (&mut storage as *mut libc::sockaddr_storage).cast::<T>(),
                what,
            )
        };
        storage
    }

    /// The 28-byte sockaddr_in6 is read whole (port, address), not through
    /// a 16-byte sockaddr.
    #[test]
    fn peer_addresses_decode_in_both_families() {
        // SAFETY: plain data; zeroed is valid.
        let mut sin6: libc::sockaddr_in6 = unsafe { std::mem::zeroed() };
        sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
        sin6.sin6_port = 7471u16.to_be();
        let v6: std::net::Ipv6Addr = "fd00::1:2:3:4".parse().unwrap();
        sin6.sin6_addr.s6_addr = v6.octets();
        sin6.sin6_scope_id = 3;
        assert_eq!(
            sockaddr_to_std(&storage_with(sin6)),
            Some(SocketAddr::new(v6.into(), 7471))
        );
        // SAFETY: as above.
        let mut sin: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sin.sin_family = libc::AF_INET as libc::sa_family_t;
        sin.sin_port = 18515u16.to_be();
        sin.sin_addr.s_addr = u32::from(std::net::Ipv4Addr::new(10, 0, 0, 2)).to_be();
        assert_eq!(
            sockaddr_to_std(&storage_with(sin)),
            Some("10.0.0.2:18515".parse().unwrap())
        );
        // Another family: no address.
        // SAFETY: as above.
        let mut other: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        other.ss_family = libc::AF_UNIX as libc::sa_family_t;
        assert_eq!(sockaddr_to_std(&other), None);
    }
}
