//! Protection domain, completion queue (with completion channel) and the
//! connected RC queue pair with its posting operations.

use super::cm::CmId;
use super::memory::{Buffer, BufferPool, Registration};
use super::pd::ProtectionDomain;
use super::{Result, SysError};
use crate::sys::os::{set_nonblocking, shutdown_requested, wait_readable};
use rdma_sys::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::CStr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// Kind of a finished work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    /// A two-sided SEND of ours.
    Send,
    /// An RDMA WRITE of ours.
    RdmaWrite,
    /// A receive that got a SEND.
    Recv,
    /// A receive consumed by the peer's RDMA WRITE WITH IMMEDIATE, with
    /// the immediate data in host order.
    RecvWithImm(u32),
    /// Anything else (never posted by this crate).
    Other(u32),
}

/// A successful completion, copied out of the CQ, with the buffer its
/// request was posted on (the only way to get a posted buffer back).
/// Failed completions are turned into `SysError::WorkRequest` by
/// `poll`/`wait`.
#[derive(Debug)]
pub struct Completion {
    /// The id the request was posted with.
    pub wr_id: u64,
    /// What kind of request finished.
    pub opcode: WcOpcode,
    /// Bytes received (receives only).
    pub byte_len: u32,
    /// The buffer the request was posted on; the NIC is done with it.
    pub buffer: Option<Buffer>,
}

/// A successful completion as the CQ reports it.
#[derive(Debug, Clone, Copy)]
struct RawCompletion {
    wr_id: u64,
    opcode: WcOpcode,
    byte_len: u32,
}

/// A CQ with its own completion channel, shared by send and receive queues.
struct CompletionQueue {
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    unacked_events: Cell<u32>,
    /// A failed work request polled together with good completions: those
    /// are returned first (a peer's last message before it went away, say),
    /// the failure on the next poll.
    pending_error: Cell<Option<SysError>>,
    busy_poll: bool,
    _id: Rc<CmId>,
}

/// How many CQ events to collect before acknowledging them in one call.
const EVENT_ACK_BATCH: u32 = 64;

impl CompletionQueue {
    fn new(id: &Rc<CmId>, entries: u32, busy_poll: bool) -> Result<Self> {
        let entries = libc::c_int::try_from(entries)
            .map_err(|_| SysError::Invalid(format!("{entries} CQ entries are too many")))?;
        let ctx = id.context()?;
        // SAFETY: ctx is a live verbs context.
        let channel = unsafe { ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            return Err(SysError::last_os("ibv_create_comp_channel"));
        }
        // SAFETY: ctx and channel are live; entries is a positive count.
        let cq = unsafe { ibv_create_cq(ctx, entries, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let err = SysError::last_os("ibv_create_cq");
            // SAFETY: channel is unused by any CQ.
            unsafe { ibv_destroy_comp_channel(channel) };
            return Err(err);
        }
        let out = CompletionQueue {
            cq,
            channel,
            unacked_events: Cell::new(0),
            pending_error: Cell::new(None),
            busy_poll,
            _id: id.clone(),
        };
        set_nonblocking(out.channel_fd(), "fcntl(completion channel)")?;
        Ok(out)
    }

    /// Polls up to `max` completions without blocking; returns how many were
    /// appended. A failed work request is returned as an error, after the
    /// successful completions polled with it.
    fn poll(&self, out: &mut Vec<RawCompletion>, max: usize) -> Result<usize> {
        if let Some(e) = self.pending_error.take() {
            return Err(e);
        }
        const BATCH: usize = 32;
        // SAFETY: ibv_wc is plain data; zeroed is a valid initial value.
        let mut wcs: [ibv_wc; BATCH] = unsafe { std::mem::zeroed() };
        let want = max.clamp(1, BATCH) as i32;
        // SAFETY: cq is live; wcs has room for `want` entries.
        let n = unsafe { ibv_poll_cq(self.cq, want, wcs.as_mut_ptr()) };
        if n < 0 {
            // Not an errno: the CQ is broken (overrun, device error).
            return Err(SysError::PollCq { ret: n });
        }
        let mut first_error = None;
        let mut good = 0;
        for wc in wcs.iter().take(n as usize) {
            if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                if first_error.is_none() {
                    first_error = Some(wc_error(wc));
                }
                continue;
            }
            let with_imm = wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0;
            let opcode = match wc.opcode {
                ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
                ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
                ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM if with_imm => {
                    // SAFETY: WITH_IMM is set, so the union holds imm_data.
                    WcOpcode::RecvWithImm(u32::from_be(unsafe {
                        wc.imm_data_invalidated_rkey_union.imm_data
                    }))
                }
                other => WcOpcode::Other(other),
            };
            out.push(RawCompletion {
                wr_id: wc.wr_id,
                opcode,
                byte_len: wc.byte_len,
            });
            good += 1;
        }
        match first_error {
            Some(e) if good == 0 => Err(e),
            Some(e) => {
                self.pending_error.set(Some(e));
                Ok(good)
            }
            None => Ok(good),
        }
    }

    /// Waits until at least one completion is available (or `timeout` passes
    /// with none: `SysError::Timeout`), then polls them into `out`.
    fn wait(
        &self,
        out: &mut Vec<RawCompletion>,
        max: usize,
        timeout: Duration,
        what: &str,
    ) -> Result<usize> {
        let deadline = crate::sys::os::deadline_after(timeout);
        if self.busy_poll {
            let mut spins: u32 = 0;
            loop {
                let n = self.poll(out, max)?;
                if n > 0 {
                    return Ok(n);
                }
                spins = spins.wrapping_add(1);
                if spins.is_multiple_of(1024) {
                    if shutdown_requested() {
                        return Err(SysError::Interrupted);
                    }
                    if Instant::now() >= deadline {
                        return Err(timeout_err(what, timeout));
                    }
                }
                std::hint::spin_loop();
            }
        }
        loop {
            let n = self.poll(out, max)?;
            if n > 0 {
                return Ok(n);
            }
            // Arm, then poll again: a completion that arrived before arming
            // would otherwise raise no event.
            // SAFETY: cq is live.
            let rc = unsafe { ibv_req_notify_cq(self.cq, 0) };
            if rc != 0 {
                return Err(SysError::from_ret("ibv_req_notify_cq", rc));
            }
            let n = self.poll(out, max)?;
            if n > 0 {
                return Ok(n);
            }
            if !wait_readable(self.channel_fd(), deadline)? {
                return Err(timeout_err(what, timeout));
            }
            self.consume_event()?;
        }
    }

    /// The completion channel's descriptor, borrowed from the CQ.
    fn channel_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the channel is live for the lifetime of self and its fd
        // stays open until ibv_destroy_comp_channel in Drop, which cannot
        // run while the returned borrow of self lives.
        unsafe { std::os::fd::BorrowedFd::borrow_raw((*self.channel).fd) }
    }

    fn consume_event(&self) -> Result<()> {
        let mut cq: *mut ibv_cq = std::ptr::null_mut();
        let mut ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: channel is live and non-blocking; out-pointers are valid.
        let rc = unsafe { ibv_get_cq_event(self.channel, &mut cq, &mut ctx) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::WouldBlock {
                return Ok(());
            }
            return Err(SysError::Call {
                call: "ibv_get_cq_event",
                source: err,
            });
        }
        let pending = self.unacked_events.get() + 1;
        if pending >= EVENT_ACK_BATCH {
            // SAFETY: acking events we received on this CQ.
            unsafe { ibv_ack_cq_events(self.cq, pending) };
            self.unacked_events.set(0);
        } else {
            self.unacked_events.set(pending);
        }
        Ok(())
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ is destroyed first (Endpoint field
        // order); all events are acked before destroying the CQ, and the CQ
        // before its channel.
        let (cq_rc, channel_rc) = unsafe {
            let pending = self.unacked_events.get();
            if pending > 0 {
                ibv_ack_cq_events(self.cq, pending);
            }
            let cq_rc = ibv_destroy_cq(self.cq);
            (cq_rc, ibv_destroy_comp_channel(self.channel))
        };
        for (call, rc) in [
            ("ibv_destroy_cq", cq_rc),
            ("ibv_destroy_comp_channel", channel_rc),
        ] {
            if rc != 0 {
                tracing::warn!(
                    "{call} failed: {} (leaked)",
                    std::io::Error::from_raw_os_error(rc.abs())
                );
            }
        }
    }
}

fn timeout_err(what: &str, after: Duration) -> SysError {
    SysError::Timeout {
        what: what.to_string(),
        after,
    }
}

fn wc_error(wc: &ibv_wc) -> SysError {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let text = unsafe { CStr::from_ptr(ibv_wc_status_str(wc.status)) }
        .to_string_lossy()
        .into_owned();
    // LOC_QP_OP_ERR is how software RoCE reports that it could not transmit
    // (the link is down); our own work requests are well-formed.
    let peer_lost = matches!(
        wc.status,
        ibv_wc_status::IBV_WC_LOC_QP_OP_ERR
            | ibv_wc_status::IBV_WC_RETRY_EXC_ERR
            | ibv_wc_status::IBV_WC_RNR_RETRY_EXC_ERR
            | ibv_wc_status::IBV_WC_WR_FLUSH_ERR
            | ibv_wc_status::IBV_WC_REM_ABORT_ERR
    );
    SysError::WorkRequest {
        wr_id: wc.wr_id,
        status: format!(
            "{text} (status {}, vendor error {:#x})",
            wc.status, wc.vendor_err
        ),
        peer_lost,
    }
}

/// Queue sizes of an RC endpoint.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    /// Sends and writes in flight at most.
    pub max_send_wr: u32,
    /// Receives posted at most.
    pub max_recv_wr: u32,
}

/// Where an RDMA WRITE goes: an address and key the peer granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteTarget {
    /// The peer's address for the first byte (often an offset).
    pub addr: u64,
    /// The peer's remote key.
    pub rkey: u32,
}

/// A buffer the NIC owns until its completion, with the memory it lies in
/// (kept registered and allocated until then, even if its pool is gone).
struct Posted {
    buffer: Buffer,
    queue: WorkQueue,
    _memory: Rc<Registration>,
}

/// The queue of the QP a request went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WorkQueue {
    Send,
    Recv,
}

impl WorkQueue {
    /// The verbs call that posts to it, and its name in messages.
    fn call_and_name(self) -> (&'static str, &'static str) {
        match self {
            WorkQueue::Send => ("ibv_post_send", "send"),
            WorkQueue::Recv => ("ibv_post_recv", "receive"),
        }
    }
}

impl QpCaps {
    /// Requests `queue` was sized for.
    fn size_of(self, queue: WorkQueue) -> u32 {
        match queue {
            WorkQueue::Send => self.max_send_wr,
            WorkQueue::Recv => self.max_recv_wr,
        }
    }
}

/// The requests in flight, by id, and how many on each queue.
#[derive(Default)]
struct InFlight {
    by_id: HashMap<u64, Posted>,
    sends: u32,
    recvs: u32,
}

impl InFlight {
    fn count(&mut self, queue: WorkQueue) -> &mut u32 {
        match queue {
            WorkQueue::Send => &mut self.sends,
            WorkQueue::Recv => &mut self.recvs,
        }
    }

    fn insert(&mut self, wr_id: u64, posted: Posted) {
        *self.count(posted.queue) += 1;
        self.by_id.insert(wr_id, posted);
    }

    fn remove(&mut self, wr_id: u64) -> Option<Posted> {
        let posted = self.by_id.remove(&wr_id)?;
        *self.count(posted.queue) -= 1;
        Some(posted)
    }
}

/// One connected (or about to be connected) RC queue pair with its CQ and
/// PD. Field order is drop order: the QP first (after which the NIC touches
/// no posted buffer), then the posted buffers' memory, the CQ, the PD and
/// the CM id.
pub struct Endpoint {
    qp: QpGuard,
    posted: RefCell<InFlight>,
    /// The queue sizes asked for: the CQ holds a completion for each, and
    /// no more are ever in flight (the provider may grant more).
    caps: QpCaps,
    cq: CompletionQueue,
    pd: Rc<ProtectionDomain>,
    id: Rc<CmId>,
    raw_wcs: RefCell<Vec<RawCompletion>>,
}

/// Destroys the QP of a CM id on drop.
struct QpGuard {
    id: Rc<CmId>,
    qp: *mut ibv_qp,
}

impl Drop for QpGuard {
    fn drop(&mut self) {
        // SAFETY: the QP was created by rdma_create_qp on this id and is
        // destroyed exactly once, before its CQ and PD.
        unsafe { rdma_destroy_qp(self.id.raw()) };
    }
}

/// CQ entries for both queues plus room for a few unexpected completions.
fn cq_entries(caps: QpCaps) -> Result<u32> {
    caps.max_send_wr
        .checked_add(caps.max_recv_wr)
        .and_then(|n| n.checked_add(16))
        .filter(|&n| n <= i32::MAX as u32)
        .ok_or_else(|| {
            SysError::Invalid(format!(
                "queue sizes {} + {} are too large",
                caps.max_send_wr, caps.max_recv_wr
            ))
        })
}

impl Endpoint {
    /// Creates PD, CQ (one for both directions) and an RC QP on `id`.
    pub fn new(id: CmId, caps: QpCaps, busy_poll: bool) -> Result<Self> {
        let entries = cq_entries(caps)?;
        let id = Rc::new(id);
        let pd = ProtectionDomain::new(&id)?;
        let cq = CompletionQueue::new(&id, entries, busy_poll)?;
        // SAFETY: ibv_qp_init_attr is plain data; zeroed is valid.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.cq;
        attr.recv_cq = cq.cq;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        // Every request is signaled: its completion returns its buffer.
        attr.sq_sig_all = 1;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        // SAFETY: id, pd and cq are live and belong to the same device.
        let rc = unsafe { rdma_create_qp(id.raw(), pd.raw(), &mut attr) };
        if rc != 0 {
            return Err(SysError::last_os("rdma_create_qp"));
        }
        // SAFETY: rdma_create_qp succeeded, so id->qp is set.
        let qp = unsafe { (*id.raw()).qp };
        // The provider may grant more work requests than asked (rounded
        // up, its own minimum); the CQ holds completions for what was asked
        // (resizing it is optional in verbs: siw, efa and others refuse),
        // so `check_post` keeps at most that many in flight on each queue.
        let qp = QpGuard { id: id.clone(), qp };
        Ok(Endpoint {
            qp,
            posted: RefCell::new(InFlight::default()),
            caps,
            cq,
            pd,
            id,
            raw_wcs: RefCell::new(Vec::new()),
        })
    }

    /// The protection domain every buffer posted here must belong to.
    pub fn pd(&self) -> &Rc<ProtectionDomain> {
        &self.pd
    }

    /// The CM id (connect, accept, disconnect, peer address).
    pub fn cm_id(&self) -> &CmId {
        &self.id
    }

    /// This QP's number and the peer's (the destination QP number set
    /// when the connection was established), as the QP reports them.
    pub fn qp_numbers(&self) -> Result<(u32, u32)> {
        // SAFETY: ibv_qp_attr and ibv_qp_init_attr are plain data; zeroed
        // is a valid value for both.
        let mut attr: ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = ibv_qp_attr_mask::IBV_QP_DEST_QPN.0 as i32;
        // SAFETY: self.qp.qp is the live QP this endpoint owns; attr and
        // init are valid out-pointers for the duration of the call.
        let rc = unsafe { ibv_query_qp(self.qp.qp, &mut attr, mask, &mut init) };
        if rc != 0 {
            return Err(SysError::Call {
                call: "ibv_query_qp",
                source: std::io::Error::from_raw_os_error(rc),
            });
        }
        // SAFETY: self.qp.qp is live; qp_num is set when the QP is created.
        let local = unsafe { (*self.qp.qp).qp_num };
        Ok((local, attr.dest_qp_num))
    }

    /// Posts a receive into the whole of `buf`'s slot. The buffer comes back
    /// with the receive's completion.
    pub fn post_recv(&self, pool: &BufferPool, buf: Buffer, wr_id: u64) -> Result<()> {
        let mut sge = self.check_post(pool, &buf, pool.slot_size(), wr_id, WorkQueue::Recv)?;
        // SAFETY: ibv_recv_wr is plain data; zeroed is valid.
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        let ours: *mut ibv_recv_wr = &mut wr;
        self.track(pool, buf, wr_id, WorkQueue::Recv, || {
            // SAFETY: qp is live; wr and sge are valid for the call (the
            // provider copies them); the slot lies inside a registration of
            // this QP's PD that `track` keeps alive, and its only token is
            // held by the endpoint until the completion (or the QP's end),
            // so safe code cannot touch the bytes while the NIC may write
            // them.
            let rc = unsafe { ibv_post_recv(self.qp.qp, ours, &mut bad) };
            (rc, std::ptr::eq(bad, ours))
        })
    }

    /// Posts a two-sided SEND of the first `len` bytes of `buf`'s slot. The
    /// buffer comes back with the send's completion.
    pub fn post_send(&self, pool: &BufferPool, buf: Buffer, len: usize, wr_id: u64) -> Result<()> {
        self.post(pool, buf, len, wr_id, None)
    }

    /// Posts an RDMA WRITE WITH IMMEDIATE of the first `len` bytes of
    /// `buf`'s slot to `target`; `imm` is delivered (in host order) with the
    /// peer's receive completion. The buffer comes back with the write's
    /// completion.
    pub fn post_write_imm(
        &self,
        pool: &BufferPool,
        buf: Buffer,
        len: usize,
        target: RemoteTarget,
        imm: u32,
        wr_id: u64,
    ) -> Result<()> {
        self.post(pool, buf, len, wr_id, Some((target, Some(imm))))
    }

    /// Posts a plain RDMA WRITE (no immediate: the peer gets no completion
    /// and cannot tell it happened) of the first `len` bytes of `buf`'s slot
    /// to `target`. The tools never send one; the hostile tests' client
    /// does, to show that it cannot change what the receiver stores. The
    /// buffer comes back with the write's completion.
    pub fn post_write(
        &self,
        pool: &BufferPool,
        buf: Buffer,
        len: usize,
        target: RemoteTarget,
        wr_id: u64,
    ) -> Result<()> {
        self.post(pool, buf, len, wr_id, Some((target, None)))
    }

    fn post(
        &self,
        pool: &BufferPool,
        buf: Buffer,
        len: usize,
        wr_id: u64,
        write: Option<(RemoteTarget, Option<u32>)>,
    ) -> Result<()> {
        let mut sge = self.check_post(pool, &buf, len, wr_id, WorkQueue::Send)?;
        // SAFETY: ibv_send_wr is plain data; zeroed is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        // A zero-length request needs no scatter entry.
        if len > 0 {
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
        }
        wr.send_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        match write {
            None => wr.opcode = ibv_wr_opcode::IBV_WR_SEND,
            Some((target, imm)) => {
                match imm {
                    Some(imm) => {
                        wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                        wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                    }
                    None => wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE,
                }
                wr.wr.rdma = rdma_t {
                    remote_addr: target.addr,
                    rkey: target.rkey,
                };
            }
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        let ours: *mut ibv_send_wr = &mut wr;
        self.track(pool, buf, wr_id, WorkQueue::Send, || {
            // SAFETY: as in post_recv: the provider copies wr and sge during
            // the call; the slot stays registered, allocated and out of
            // reach of safe code until its completion (or the QP's end).
            let rc = unsafe { ibv_post_send(self.qp.qp, ours, &mut bad) };
            (rc, std::ptr::eq(bad, ours))
        })
    }

    /// The checks before any post: the buffer belongs to `pool`, `len` fits
    /// its slot, the pool's memory is registered with this QP's PD, `wr_id`
    /// is not already in flight (its completion could not say which buffer
    /// to give back), and the queue has room within the sizes asked for
    /// (the CQ holds a completion for each of those, no more).
    fn check_post(
        &self,
        pool: &BufferPool,
        buf: &Buffer,
        len: usize,
        wr_id: u64,
        queue: WorkQueue,
    ) -> Result<ibv_sge> {
        let sge = pool.scatter_entry(buf, len)?;
        if !Rc::ptr_eq(pool.registration()?.pd(), &self.pd) {
            return Err(SysError::Invalid(
                "the buffer is registered with another protection domain than this queue pair's"
                    .into(),
            ));
        }
        let mut posted = self.posted.borrow_mut();
        if posted.by_id.contains_key(&wr_id) {
            return Err(SysError::Invalid(format!(
                "work request {wr_id:#x} is already in flight"
            )));
        }
        let (in_flight, size) = (*posted.count(queue), self.caps.size_of(queue));
        if in_flight >= size {
            let (_, name) = queue.call_and_name();
            return Err(SysError::Invalid(format!(
                "the {name} queue is full: {in_flight} requests in flight, it was sized for {size}"
            )));
        }
        Ok(sge)
    }

    /// Records `buf` as posted under `wr_id`, then runs the post call,
    /// which returns its code and whether `bad_wr` names our request. A
    /// failure that names it means the provider refused it: the NIC never
    /// saw it, so it is forgotten again and dropped. Any other failure may
    /// have left it queued (rxe and siw queue a request, then report a
    /// failed doorbell with `bad_wr` unset), so the buffer and its id stay
    /// tracked until a completion or the QP's end (`SysError::PostHeld`).
    fn track(
        &self,
        pool: &BufferPool,
        buf: Buffer,
        wr_id: u64,
        queue: WorkQueue,
        post: impl FnOnce() -> (libc::c_int, bool),
    ) -> Result<()> {
        let (call, _) = queue.call_and_name();
        let memory = pool.registration()?.clone();
        self.posted.borrow_mut().insert(
            wr_id,
            Posted {
                buffer: buf,
                queue,
                _memory: memory,
            },
        );
        let (rc, refused_ours) = post();
        if rc == 0 {
            return Ok(());
        }
        // Providers return an errno (some negated); siw returns -1 from a
        // failed doorbell write with errno set.
        let source = match rc {
            -1 => std::io::Error::last_os_error(),
            rc => std::io::Error::from_raw_os_error(rc.saturating_abs()),
        };
        if refused_ours {
            self.posted.borrow_mut().remove(wr_id);
            return Err(SysError::Call { call, source });
        }
        Err(SysError::PostHeld { call, source })
    }

    /// Polls up to `max` completions without blocking; returns how many were
    /// appended to `out`. A failed work request is returned as an error,
    /// after the successful completions polled with it.
    pub fn poll(&self, out: &mut Vec<Completion>, max: usize) -> Result<usize> {
        let mut raw = self.raw_wcs.borrow_mut();
        raw.clear();
        let n = self.cq.poll(&mut raw, max)?;
        self.give_back(&raw, out);
        Ok(n)
    }

    /// Waits until at least one completion is available (or `timeout` passes
    /// with none: `SysError::Timeout`), then polls them into `out`.
    pub fn wait(
        &self,
        out: &mut Vec<Completion>,
        max: usize,
        timeout: Duration,
        what: &str,
    ) -> Result<usize> {
        let mut raw = self.raw_wcs.borrow_mut();
        raw.clear();
        let n = self.cq.wait(&mut raw, max, timeout, what)?;
        self.give_back(&raw, out);
        Ok(n)
    }

    /// Attaches to each completion the buffer its request was posted on.
    fn give_back(&self, raw: &[RawCompletion], out: &mut Vec<Completion>) {
        let mut posted = self.posted.borrow_mut();
        out.extend(raw.iter().map(|wc| Completion {
            wr_id: wc.wr_id,
            opcode: wc.opcode,
            byte_len: wc.byte_len,
            buffer: posted.remove(wc.wr_id).map(|p| p.buffer),
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_sizes_never_overflow() {
        let caps = |s, r| QpCaps {
            max_send_wr: s,
            max_recv_wr: r,
        };
        assert_eq!(cq_entries(caps(24, 64)).unwrap(), 104);
        assert!(cq_entries(caps(u32::MAX, 1)).is_err());
        assert!(cq_entries(caps(u32::MAX - 16, 0)).is_err());
        assert!(cq_entries(caps(i32::MAX as u32, 1)).is_err());
    }
}
