//! Two-sided control messages: a pool of posted receive buffers and a pool of
//! send buffers, both registered for local access only. Once the handshake
//! installed a channel (with a token), every message is sealed on its way
//! out and opened on its way in (see `proto::Channel`).

use super::{WrId, WrKind};
use crate::error::XferError;
use crate::proto::{Channel, ChannelError, MAX_MESSAGE, Message, WireError, decode, encode};
use crate::sys::rdma::{Buffer, BufferPool, Completion, Endpoint};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Most encoded messages waiting for a send buffer. Each peer message gets
/// at most a reply or two, so a longer queue means the peer sends but does
/// not take our messages (it posts no receives): end the session rather than
/// buffer without bound.
const MAX_QUEUED: usize = 256;

pub(super) struct Control {
    /// Receive buffers: a few at first, more once the peer may use them
    /// (`add_receives`). A receive's work-request id names its pool.
    recv_pools: Vec<BufferPool>,
    send_pool: BufferPool,
    /// Send buffers not posted; the others come back with their completion.
    free_send: Vec<Buffer>,
    /// Encoded (and sealed) messages waiting for a free send buffer, in order.
    queued: VecDeque<Vec<u8>>,
    codec: Codec,
    /// When each posted SEND went out, oldest first (an RC queue pair
    /// completes them in that order).
    posted_at: VecDeque<Instant>,
}

/// Why a received control message was not delivered.
#[derive(Debug)]
pub(super) enum Undelivered {
    /// It failed its seal (forged, replayed, reordered, truncated).
    Seal(ChannelError),
    /// It does not decode.
    Wire(WireError),
}

impl Control {
    /// Registers the buffers and posts every receive.
    pub fn new(ep: &Endpoint, recv_count: usize, send_count: usize) -> Result<Self, XferError> {
        let (send_pool, mut free_send) = BufferPool::new(ep.pd(), MAX_MESSAGE, send_count)?;
        free_send.reverse();
        let mut control = Control {
            recv_pools: Vec::new(),
            send_pool,
            free_send,
            queued: VecDeque::new(),
            codec: Codec::default(),
            posted_at: VecDeque::new(),
        };
        control.add_receives(ep, recv_count)?;
        Ok(control)
    }

    /// Registers `count` more receive buffers and posts them (the QP must
    /// have room for them).
    pub fn add_receives(&mut self, ep: &Endpoint, count: usize) -> Result<(), XferError> {
        if count == 0 {
            return Ok(());
        }
        let pool_index = self.recv_pools.len();
        if pool_index >= WrId::RECV_POOLS {
            return Err(XferError::Internal("too many receive pools".into()));
        }
        let (pool, bufs) = BufferPool::new(ep.pd(), MAX_MESSAGE, count)?;
        self.recv_pools.push(pool);
        for buf in bufs {
            self.repost(ep, pool_index, buf)?;
        }
        Ok(())
    }

    /// Hands a receive buffer of pool `pool_index` back to the QP.
    fn repost(&self, ep: &Endpoint, pool_index: usize, buf: Buffer) -> Result<(), XferError> {
        let wr_id = WrId::recv(pool_index, buf.index()).raw();
        ep.post_recv(&self.recv_pools[pool_index], buf, wr_id)?;
        Ok(())
    }

    /// The index of the pool a receive's work-request id names.
    fn recv_pool_of(&self, wr_id: u64) -> Result<usize, XferError> {
        let index = WrId::from_raw(wr_id).recv_pool();
        if index < self.recv_pools.len() {
            Ok(index)
        } else {
            Err(not_ours(format_args!("receive {wr_id:#x} of no pool")))
        }
    }

    /// From now on, seal what is sent and open what is received (messages
    /// queued before keep the form they had).
    pub fn install(&mut self, channel: Channel) {
        self.codec.install(channel);
    }

    /// A receive completed: opens (once a channel is installed) and decodes
    /// the control message it delivered (a receive consumed by an RDMA
    /// WRITE WITH IMM delivers none: use `recycle`) and posts the buffer
    /// again.
    pub fn take_message(
        &mut self,
        ep: &Endpoint,
        wc: Completion,
    ) -> Result<Result<Message, Undelivered>, XferError> {
        let pool_index = self.recv_pool_of(wc.wr_id)?;
        let buf = returned(wc.buffer)?;
        let len = wc.byte_len as usize;
        let decoded = match self.recv_pools[pool_index].bytes(&buf, len) {
            Ok(bytes) => self.codec.open(bytes),
            Err(_) => Err(Undelivered::Wire(WireError::Oversized { len })),
        };
        self.repost(ep, pool_index, buf)?;
        Ok(decoded)
    }

    /// A receive that carried no message (consumed by a data write): posts
    /// its buffer again.
    pub fn recycle(&self, ep: &Endpoint, wc: Completion) -> Result<(), XferError> {
        let pool_index = self.recv_pool_of(wc.wr_id)?;
        self.repost(ep, pool_index, returned(wc.buffer)?)
    }

    /// Sends `msg` now, or as soon as a send buffer is free (order kept).
    pub fn send(&mut self, ep: &Endpoint, msg: &Message) -> Result<(), XferError> {
        if self.queued.len() >= MAX_QUEUED {
            return Err(XferError::PeerLost(format!(
                "the peer takes none of our messages ({} waiting to be sent)",
                self.queued.len()
            )));
        }
        let bytes = self.codec.seal(msg)?;
        self.queued.push_back(bytes);
        self.flush(ep)
    }

    /// A SEND completed: its buffer is free again.
    pub fn on_send_done(&mut self, ep: &Endpoint, wc: Completion) -> Result<(), XferError> {
        self.free_send.push(returned(wc.buffer)?);
        self.posted_at.pop_front();
        self.flush(ep)
    }

    /// True while some message is queued or not yet completed.
    pub fn busy(&self) -> bool {
        !self.queued.is_empty() || self.free_send.len() < self.send_pool.count()
    }

    /// At the end of a session: lets queued and posted messages complete
    /// (until `within` passes) so that a last reply reaches the peer before
    /// the disconnect. Other completions are dropped.
    pub fn drain(&mut self, ep: &Endpoint, within: Duration) -> Result<(), XferError> {
        let deadline = crate::sys::os::deadline_after(within);
        let mut wcs = Vec::new();
        while self.busy() && Instant::now() < deadline {
            wcs.clear();
            ep.wait(&mut wcs, 16, Duration::from_millis(200), "the last sends")?;
            for wc in wcs.drain(..) {
                if WrId::from_raw(wc.wr_id).kind() == WrKind::Send {
                    self.on_send_done(ep, wc)?;
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self, ep: &Endpoint) -> Result<(), XferError> {
        while !self.queued.is_empty() {
            let Some(mut buf) = self.free_send.pop() else {
                return Ok(());
            };
            let Some(bytes) = self.queued.pop_front() else {
                self.free_send.push(buf);
                return Ok(());
            };
            self.send_pool
                .bytes_mut(&mut buf, bytes.len())?
                .copy_from_slice(&bytes);
            let wr_id = WrId::send(buf.index()).raw();
            ep.post_send(&self.send_pool, buf, bytes.len(), wr_id)?;
            self.posted_at.push_back(Instant::now());
        }
        Ok(())
    }

    /// Ends the session when the oldest SEND has waited longer than
    /// `limit` for its completion: the peer takes none of our messages (it
    /// posts no receives, and the queue pair retries on; the peer chose
    /// how often in its connection request).
    pub fn check_sends(&self, limit: Duration) -> Result<(), XferError> {
        match self.posted_at.front() {
            Some(t) if t.elapsed() > limit => Err(XferError::PeerLost(format!(
                "the peer has taken none of our messages for {}s (it posts no receives)",
                limit.as_secs()
            ))),
            _ => Ok(()),
        }
    }
}

/// Messages as they travel: encoded, and once the handshake installed a
/// channel, sealed (what is received is opened, then decoded).
#[derive(Default)]
pub(super) struct Codec {
    channel: Option<Channel>,
}

impl Codec {
    /// From now on, seal and open every message.
    pub fn install(&mut self, channel: Channel) {
        self.channel = Some(channel);
    }

    /// The bytes that carry `msg`.
    pub fn seal(&mut self, msg: &Message) -> Result<Vec<u8>, XferError> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        // Messages are built within the limits (names checked, reasons
        // clamped) and a channel's counter does not run out in a session:
        // neither step fails on anything the peer or the user controls.
        let unsendable = |e: &dyn std::fmt::Display| {
            XferError::Internal(format!("cannot send {}: {e}", msg.kind()))
        };
        let len = encode(msg, &mut buf).map_err(|e| unsendable(&e))?;
        buf.truncate(len);
        match self.channel.as_mut() {
            Some(channel) => channel.seal(&buf).map_err(|e| unsendable(&e)),
            None => Ok(buf),
        }
    }

    /// The message `bytes` carry, or why they carry none.
    pub fn open(&mut self, bytes: &[u8]) -> Result<Message, Undelivered> {
        match self.channel.as_mut() {
            Some(channel) => match channel.open(bytes) {
                Ok(frame) => decode(frame).map_err(Undelivered::Wire),
                Err(e) => Err(Undelivered::Seal(e)),
            },
            None => decode(bytes).map_err(Undelivered::Wire),
        }
    }
}

/// The buffer a completion gave back (every request of ours has one).
pub(crate) fn returned(buffer: Option<Buffer>) -> Result<Buffer, XferError> {
    buffer.ok_or_else(|| not_ours("a completion without its buffer"))
}

/// A completion of a request the engine did not post as it says (the
/// verbs wrapper hands back only what was posted through it).
pub(crate) fn not_ours(what: impl std::fmt::Display) -> XferError {
    XferError::Internal(format!("a completion not of our requests: {what}"))
}
