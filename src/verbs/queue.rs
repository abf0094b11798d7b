//! Protection domain, completion queue (with completion channel) and the
//! connected RC queue pair with its posting operations.

use super::cm::CmId;
use super::memory::MemoryRegion;
use super::os::{set_nonblocking, shutdown_requested, wait_readable};
use super::{Result, VerbsError};
use rdma_sys::*;
use std::cell::Cell;
use std::ffi::CStr;
use std::rc::Rc;
use std::time::{Duration, Instant};

/// A protection domain on the device of a CM id.
pub struct ProtectionDomain {
    raw: *mut ibv_pd,
    _id: Rc<CmId>,
}

impl ProtectionDomain {
    pub fn new(id: &Rc<CmId>) -> Result<Rc<Self>> {
        let ctx = id.context()?;
        // SAFETY: ctx is the live verbs context of a bound id.
        let raw = unsafe { ibv_alloc_pd(ctx) };
        if raw.is_null() {
            return Err(VerbsError::last_os("ibv_alloc_pd"));
        }
        Ok(Rc::new(ProtectionDomain {
            raw,
            _id: id.clone(),
        }))
    }

    pub(crate) fn raw(&self) -> *mut ibv_pd {
        self.raw
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every MR and the QP hold an Rc of this PD, so they are gone.
        unsafe { ibv_dealloc_pd(self.raw) };
    }
}

/// Kind of a finished work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WcOpcode {
    Send,
    RdmaWrite,
    Recv,
    RecvWithImm,
    Other(u32),
}

/// A successful completion, copied out of the CQ. Failed completions are
/// turned into `VerbsError::WorkRequest` by `poll`/`wait`.
#[derive(Debug, Clone, Copy)]
pub struct WorkCompletion {
    pub wr_id: u64,
    pub opcode: WcOpcode,
    pub byte_len: u32,
    /// Immediate data in host order, when the completion carries one.
    pub imm: Option<u32>,
}

/// A CQ with its own completion channel, shared by send and receive queues.
pub struct CompletionQueue {
    cq: *mut ibv_cq,
    channel: *mut ibv_comp_channel,
    unacked_events: Cell<u32>,
    /// A failed work request polled together with good completions: those
    /// are returned first (a peer's last message before it went away, say),
    /// the failure on the next poll.
    pending_error: Cell<Option<VerbsError>>,
    busy_poll: bool,
    _id: Rc<CmId>,
}

/// How many CQ events to collect before acknowledging them in one call.
const EVENT_ACK_BATCH: u32 = 64;

impl CompletionQueue {
    pub fn new(id: &Rc<CmId>, entries: u32, busy_poll: bool) -> Result<Self> {
        let ctx = id.context()?;
        // SAFETY: ctx is a live verbs context.
        let channel = unsafe { ibv_create_comp_channel(ctx) };
        if channel.is_null() {
            return Err(VerbsError::last_os("ibv_create_comp_channel"));
        }
        // SAFETY: ctx and channel are live; entries is a positive count.
        let cq = unsafe {
            ibv_create_cq(
                ctx,
                entries as libc::c_int,
                std::ptr::null_mut(),
                channel,
                0,
            )
        };
        if cq.is_null() {
            let err = VerbsError::last_os("ibv_create_cq");
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
        // SAFETY: channel is valid; fd is its descriptor.
        set_nonblocking(unsafe { (*channel).fd }, "fcntl(completion channel)")?;
        Ok(out)
    }

    /// Polls up to `max` completions without blocking; returns how many were
    /// appended. A failed work request is returned as an error, after the
    /// successful completions polled with it.
    pub fn poll(&self, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
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
            return Err(VerbsError::from_ret("ibv_poll_cq", n));
        }
        let mut first_error = None;
        let mut good = 0;
        for wc in wcs.iter().take(n as usize) {
            let opcode = match wc.opcode {
                ibv_wc_opcode::IBV_WC_SEND => WcOpcode::Send,
                ibv_wc_opcode::IBV_WC_RDMA_WRITE => WcOpcode::RdmaWrite,
                ibv_wc_opcode::IBV_WC_RECV => WcOpcode::Recv,
                ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM => WcOpcode::RecvWithImm,
                other => WcOpcode::Other(other),
            };
            if wc.status != ibv_wc_status::IBV_WC_SUCCESS {
                if first_error.is_none() {
                    first_error = Some(wc_error(wc));
                }
                continue;
            }
            let imm = if wc.wc_flags & ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0 {
                // SAFETY: WITH_IMM is set, so the union holds imm_data.
                Some(u32::from_be(unsafe {
                    wc.imm_data_invalidated_rkey_union.imm_data
                }))
            } else {
                None
            };
            out.push(WorkCompletion {
                wr_id: wc.wr_id,
                opcode,
                byte_len: wc.byte_len,
                imm,
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
    /// with none: `VerbsError::Timeout`), then polls them into `out`.
    pub fn wait(
        &self,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
        what: &str,
    ) -> Result<usize> {
        let deadline = Instant::now() + timeout;
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
                        return Err(VerbsError::Interrupted);
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
                return Err(VerbsError::from_ret("ibv_req_notify_cq", rc));
            }
            let n = self.poll(out, max)?;
            if n > 0 {
                return Ok(n);
            }
            // SAFETY: channel is live.
            let fd = unsafe { (*self.channel).fd };
            if !wait_readable(fd, deadline)? {
                return Err(timeout_err(what, timeout));
            }
            self.consume_event()?;
        }
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
            return Err(VerbsError::Call {
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
        unsafe {
            let pending = self.unacked_events.get();
            if pending > 0 {
                ibv_ack_cq_events(self.cq, pending);
            }
            ibv_destroy_cq(self.cq);
            ibv_destroy_comp_channel(self.channel);
        }
    }
}

fn timeout_err(what: &str, after: Duration) -> VerbsError {
    VerbsError::Timeout {
        what: what.to_string(),
        after,
    }
}

fn wc_error(wc: &ibv_wc) -> VerbsError {
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
    VerbsError::WorkRequest {
        wr_id: wc.wr_id,
        status: format!(
            "{text} (status {}, vendor error {:#x})",
            wc.status, wc.vendor_err
        ),
        peer_lost,
    }
}

/// The scatter/gather entry for `[offset, offset+len)` of a region.
fn scatter_entry(mr: &MemoryRegion, offset: usize, len: usize) -> Result<ibv_sge> {
    mr.check(offset, len)?;
    let length = u32::try_from(len)
        .map_err(|_| VerbsError::Invalid(format!("{len} bytes exceed one work request")))?;
    Ok(ibv_sge {
        addr: mr.addr() + offset as u64,
        length,
        lkey: mr.lkey(),
    })
}

/// Queue sizes of an RC endpoint.
#[derive(Debug, Clone, Copy)]
pub struct QpCaps {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
}

/// One connected (or about to be connected) RC queue pair with its CQ and
/// PD. Field order is drop order: QP, then CQ, then PD, then the CM id.
pub struct Endpoint {
    qp: QpGuard,
    cq: CompletionQueue,
    pd: Rc<ProtectionDomain>,
    id: Rc<CmId>,
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

impl Endpoint {
    /// Creates PD, CQ (one for both directions) and an RC QP on `id`.
    pub fn new(id: CmId, caps: QpCaps, busy_poll: bool) -> Result<Self> {
        let id = Rc::new(id);
        let pd = ProtectionDomain::new(&id)?;
        let cq = CompletionQueue::new(&id, caps.max_send_wr + caps.max_recv_wr + 16, busy_poll)?;
        // SAFETY: ibv_qp_init_attr is plain data; zeroed is valid.
        let mut attr: ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = cq.cq;
        attr.recv_cq = cq.cq;
        attr.qp_type = ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        // SAFETY: id, pd and cq are live and belong to the same device.
        let rc = unsafe { rdma_create_qp(id.raw(), pd.raw(), &mut attr) };
        if rc != 0 {
            return Err(VerbsError::last_os("rdma_create_qp"));
        }
        // SAFETY: rdma_create_qp succeeded, so id->qp is set.
        let qp = unsafe { (*id.raw()).qp };
        Ok(Endpoint {
            qp: QpGuard { id: id.clone(), qp },
            cq,
            pd,
            id,
        })
    }

    pub fn pd(&self) -> &Rc<ProtectionDomain> {
        &self.pd
    }

    pub fn cm_id(&self) -> &CmId {
        &self.id
    }

    pub fn cq(&self) -> &CompletionQueue {
        &self.cq
    }

    /// Posts a receive of `[offset, offset+len)` of `mr`.
    pub fn post_recv(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        wr_id: u64,
    ) -> Result<()> {
        let mut sge = scatter_entry(mr, offset, len)?;
        // SAFETY: ibv_recv_wr is plain data; zeroed is valid.
        let mut wr: ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad: *mut ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: qp is live; wr and sge are valid for the call; the range is
        // inside a registered region that outlives the QP's use of it (the MR
        // deregisters before freeing, so a late NIC write cannot hit freed
        // memory).
        let rc = unsafe { ibv_post_recv(self.qp.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_post_recv", rc));
        }
        Ok(())
    }

    /// Posts a two-sided SEND of `[offset, offset+len)` of `mr`.
    pub fn post_send(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        wr_id: u64,
        signaled: bool,
    ) -> Result<()> {
        self.post(mr, offset, len, wr_id, signaled, None)
    }

    /// Posts an RDMA WRITE WITH IMMEDIATE of `[offset, offset+len)` of `mr`
    /// to `remote_addr`/`rkey`; `imm` is delivered (in host order) with the
    /// peer's receive completion.
    #[allow(clippy::too_many_arguments)]
    pub fn post_write_imm(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        imm: u32,
        wr_id: u64,
        signaled: bool,
    ) -> Result<()> {
        self.post(
            mr,
            offset,
            len,
            wr_id,
            signaled,
            Some((remote_addr, rkey, imm)),
        )
    }

    fn post(
        &self,
        mr: &MemoryRegion,
        offset: usize,
        len: usize,
        wr_id: u64,
        signaled: bool,
        write: Option<(u64, u32, u32)>,
    ) -> Result<()> {
        let mut sge = scatter_entry(mr, offset, len)?;
        // SAFETY: ibv_send_wr is plain data; zeroed is valid.
        let mut wr: ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        // A zero-length write needs no scatter entry.
        if len > 0 {
            wr.sg_list = &mut sge;
            wr.num_sge = 1;
        }
        wr.send_flags = if signaled {
            ibv_send_flags::IBV_SEND_SIGNALED.0
        } else {
            0
        };
        match write {
            None => wr.opcode = ibv_wr_opcode::IBV_WR_SEND,
            Some((remote_addr, rkey, imm)) => {
                wr.opcode = ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
                wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
                wr.wr.rdma = rdma_t { remote_addr, rkey };
            }
        }
        let mut bad: *mut ibv_send_wr = std::ptr::null_mut();
        // SAFETY: as in post_recv; the WR is copied by the provider during
        // the call.
        let rc = unsafe { ibv_post_send(self.qp.qp, &mut wr, &mut bad) };
        if rc != 0 {
            return Err(VerbsError::from_ret("ibv_post_send", rc));
        }
        Ok(())
    }
}
