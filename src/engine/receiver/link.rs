//! What a receiver session needs of its connection, as a trait: send a
//! control message, wait for what the sender delivered (messages and data
//! writes), expose the ring and copy chunks out of it. `RdmaLink` is the
//! real one (a queue pair, its control buffers and the registered ring);
//! the session's unit tests drive whole sessions over an in-memory one.

use crate::engine::control::{Control, Undelivered};
use crate::engine::{WrId, WrKind, completion_error};
use crate::error::XferError;
use crate::proto::{Channel, Message};
use crate::sys::SysError;
use crate::sys::rdma::{Completion, Endpoint, RemoteRing, WcOpcode};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tracing::debug;

/// What the sender delivered.
#[derive(Debug)]
pub(super) enum Delivery {
    /// A control message, or why it could not be read.
    Message(Result<Message, Undelivered>),
    /// A data write landed in the ring: its length and its immediate.
    Chunk { byte_len: u32, imm: u32 },
}

/// How long a wait may last and how it ends early.
pub(super) struct Until<'a> {
    pub deadline: Instant,
    /// At most this long between looks at `give_up` (and at the peer).
    pub slice: Duration,
    /// What is waited for, for messages.
    pub what: &'a str,
    /// Ends the wait with its error, looked at before every slice.
    pub give_up: &'a dyn Fn() -> Option<XferError>,
    /// The error at the deadline.
    pub expired: &'a dyn Fn() -> XferError,
}

/// Where the sender writes: the ring's address and key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ExposedRing {
    pub addr: u64,
    pub rkey: u32,
}

/// A receiver session's connection to its sender.
pub(super) trait Link {
    /// Sends `msg` now, or as soon as a send buffer is free (order kept).
    fn send(&mut self, msg: &Message) -> Result<(), XferError>;

    /// Waits until the sender delivered something, unless something
    /// delivered waits already (`next`); may return with nothing when
    /// only our own sends completed.
    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError>;

    /// The oldest delivery not handled yet. A message is opened and decoded
    /// only now, so that a channel installed for the one before applies.
    fn next(&mut self) -> Result<Option<Delivery>, XferError>;

    /// Takes what has come without waiting: our sends' completions free
    /// their buffers, deliveries wait for `next`.
    fn poll(&mut self) -> Result<(), XferError>;

    /// From now on every message is sealed and opened with `channel`.
    fn install(&mut self, channel: Channel);

    /// `count` more receives for the sender's messages and writes.
    fn add_receives(&mut self, count: usize) -> Result<(), XferError>;

    /// Fails when the oldest of our messages has waited longer than
    /// `limit` to be taken (the peer posts no receives).
    fn check_sends(&self, limit: Duration) -> Result<(), XferError>;

    /// Registers the ring of `len` bytes (once; later calls give the same).
    fn expose_ring(&mut self, len: usize) -> Result<ExposedRing, XferError>;

    /// Copies `dst.len()` bytes at `offset` out of the ring.
    fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), SysError>;

    /// Lets queued replies reach the sender (best effort, briefly).
    fn drain(&mut self);

    /// Ends the connection.
    fn disconnect(&mut self);
}

/// The link over a connected queue pair.
pub(super) struct RdmaLink {
    ep: Endpoint,
    control: Control,
    ring: Option<RemoteRing>,
    /// The sender's completions not handed out yet (`next`), oldest first.
    kept: VecDeque<Completion>,
    wcs: Vec<Completion>,
}

impl RdmaLink {
    pub fn new(ep: Endpoint, control: Control) -> Self {
        Self {
            ep,
            control,
            ring: None,
            kept: VecDeque::new(),
            wcs: Vec::with_capacity(16),
        }
    }

    /// Our sends free their buffers at once; the rest waits for `next`.
    fn sort_completions(&mut self) -> Result<(), XferError> {
        for wc in std::mem::take(&mut self.wcs) {
            match (WrId::from_raw(wc.wr_id).kind(), wc.opcode) {
                (WrKind::Send, WcOpcode::Send) => self.control.on_send_done(&self.ep, wc)?,
                _ => self.kept.push_back(wc),
            }
        }
        Ok(())
    }
}

impl Link for RdmaLink {
    fn send(&mut self, msg: &Message) -> Result<(), XferError> {
        self.control.send(&self.ep, msg)
    }

    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError> {
        if !self.kept.is_empty() {
            return Ok(());
        }
        let mut wcs = std::mem::take(&mut self.wcs);
        let waited = crate::engine::wait_completions_until(
            &self.ep,
            &mut wcs,
            until.deadline,
            until.slice,
            until.what,
            until.give_up,
            until.expired,
        );
        self.wcs = wcs;
        waited?;
        self.sort_completions()
    }

    fn next(&mut self) -> Result<Option<Delivery>, XferError> {
        let Some(wc) = self.kept.pop_front() else {
            return Ok(None);
        };
        match (WrId::from_raw(wc.wr_id).kind(), wc.opcode) {
            (WrKind::Recv, WcOpcode::RecvWithImm) => {
                let (byte_len, imm) = (wc.byte_len, wc.imm);
                // The receive buffer carried no data: hand it back at once.
                self.control.recycle(&self.ep, wc)?;
                let imm = imm.ok_or_else(|| {
                    XferError::Internal("RDMA write completion without immediate data".into())
                })?;
                Ok(Some(Delivery::Chunk { byte_len, imm }))
            }
            (WrKind::Recv, WcOpcode::Recv) => {
                let decoded = self.control.take_message(&self.ep, wc)?;
                Ok(Some(Delivery::Message(decoded)))
            }
            (kind, opcode) => Err(XferError::Internal(format!(
                "unexpected completion {opcode:?} for a work request of kind {kind:?}"
            ))),
        }
    }

    fn poll(&mut self) -> Result<(), XferError> {
        self.ep
            .poll(&mut self.wcs, 16)
            .map_err(|e| completion_error(&self.ep, e))?;
        self.sort_completions()
    }

    fn install(&mut self, channel: Channel) {
        self.control.install(channel);
    }

    fn add_receives(&mut self, count: usize) -> Result<(), XferError> {
        self.control.add_receives(&self.ep, count)
    }

    fn check_sends(&self, limit: Duration) -> Result<(), XferError> {
        self.control.check_sends(limit)
    }

    fn expose_ring(&mut self, len: usize) -> Result<ExposedRing, XferError> {
        let ring = match &mut self.ring {
            Some(ring) => ring,
            None => {
                let ring = RemoteRing::new(self.ep.pd(), len)?;
                debug!(len, rkey = ring.rkey(), "ring registered");
                self.ring.insert(ring)
            }
        };
        Ok(ExposedRing {
            addr: ring.remote_addr(),
            rkey: ring.rkey(),
        })
    }

    fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), SysError> {
        match &self.ring {
            Some(ring) => ring.copy_out(offset, dst),
            None => Err(SysError::Invalid("no ring is registered".into())),
        }
    }

    fn drain(&mut self) {
        // Best effort: the session is over either way.
        let _ = self.control.drain(&self.ep, Duration::from_secs(2));
    }

    fn disconnect(&mut self) {
        self.ep.cm_id().disconnect(Duration::from_secs(1));
    }
}
