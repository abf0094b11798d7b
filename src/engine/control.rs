//! Two-sided control messages: a pool of posted receive buffers and a pool of
//! send buffers, both registered for local access only. Once the handshake
//! installed a channel (with a token), every message is sealed on its way
//! out and opened on its way in (see `proto::Channel`).

use super::wr;
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
    recv_pool: BufferPool,
    send_pool: BufferPool,
    /// Send buffers not posted; the others come back with their completion.
    free_send: Vec<Buffer>,
    /// Encoded (and sealed) messages waiting for a free send buffer, in order.
    queued: VecDeque<Vec<u8>>,
    /// Seals and opens every message once authenticated.
    channel: Option<Channel>,
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
        let (recv_pool, recv_bufs) = BufferPool::new(ep.pd(), MAX_MESSAGE, recv_count)?;
        let (send_pool, mut free_send) = BufferPool::new(ep.pd(), MAX_MESSAGE, send_count)?;
        free_send.reverse();
        let control = Control {
            recv_pool,
            send_pool,
            free_send,
            queued: VecDeque::new(),
            channel: None,
        };
        for buf in recv_bufs {
            control.repost(ep, buf)?;
        }
        Ok(control)
    }

    /// Hands a receive buffer back to the QP.
    fn repost(&self, ep: &Endpoint, buf: Buffer) -> Result<(), XferError> {
        let wr_id = wr::RECV | buf.index() as u64;
        ep.post_recv(&self.recv_pool, buf, wr_id)?;
        Ok(())
    }

    /// From now on, seal what is sent and open what is received (messages
    /// queued before keep the form they had).
    pub fn install(&mut self, channel: Channel) {
        self.channel = Some(channel);
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
        let buf = returned(wc.buffer)?;
        let len = wc.byte_len as usize;
        let decoded = match self.recv_pool.bytes(&buf, len) {
            Ok(bytes) => match self.channel.as_mut() {
                Some(channel) => match channel.open(bytes) {
                    Ok(frame) => decode(frame).map_err(Undelivered::Wire),
                    Err(e) => Err(Undelivered::Seal(e)),
                },
                None => decode(bytes).map_err(Undelivered::Wire),
            },
            Err(_) => Err(Undelivered::Wire(WireError::Oversized { len })),
        };
        self.repost(ep, buf)?;
        Ok(decoded)
    }

    /// A receive that carried no message (consumed by a data write): posts
    /// its buffer again.
    pub fn recycle(&self, ep: &Endpoint, wc: Completion) -> Result<(), XferError> {
        self.repost(ep, returned(wc.buffer)?)
    }

    /// Sends `msg` now, or as soon as a send buffer is free (order kept).
    pub fn send(&mut self, ep: &Endpoint, msg: &Message) -> Result<(), XferError> {
        if self.queued.len() >= MAX_QUEUED {
            return Err(XferError::PeerLost(format!(
                "the peer takes none of our messages ({} waiting to be sent)",
                self.queued.len()
            )));
        }
        let mut buf = vec![0u8; MAX_MESSAGE];
        let len = encode(msg, &mut buf)
            .map_err(|e| XferError::Internal(format!("cannot encode {}: {e}", msg.kind())))?;
        buf.truncate(len);
        if let Some(channel) = self.channel.as_mut() {
            buf = channel
                .seal(&buf)
                .map_err(|e| XferError::Internal(format!("cannot seal {}: {e}", msg.kind())))?;
        }
        self.queued.push_back(buf);
        self.flush(ep)
    }

    /// A SEND completed: its buffer is free again.
    pub fn on_send_done(&mut self, ep: &Endpoint, wc: Completion) -> Result<(), XferError> {
        self.free_send.push(returned(wc.buffer)?);
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
                if wr::kind(wc.wr_id) == wr::SEND {
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
            let wr_id = wr::SEND | buf.index() as u64;
            ep.post_send(&self.send_pool, buf, bytes.len(), wr_id)?;
        }
        Ok(())
    }
}

/// The buffer a completion gave back (every request of ours has one).
fn returned(buffer: Option<Buffer>) -> Result<Buffer, XferError> {
    buffer.ok_or_else(|| XferError::Internal("a completion without its buffer".into()))
}
