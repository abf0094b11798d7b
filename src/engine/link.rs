//! What a session needs of its connection, as traits: `Link` sends and
//! receives control messages; a receiver's `RingLink` also exposes the ring
//! and copies chunks out of it, a sender's `WriteLink` writes chunks into
//! the peer's ring. `RdmaLink` is the real one (a queue pair, its control
//! buffers, the ring); the engines' unit tests drive whole sessions over
//! in-memory ones.

use crate::engine::control::{Control, Undelivered, not_ours, returned};
use crate::engine::{WrId, WrKind, completion_error};
use crate::error::XferError;
use crate::proto::{Channel, ChunkPlan, Message, ProtocolError};
use crate::sys::SysError;
use crate::sys::rdma::{
    Buffer, BufferPool, Completion, Endpoint, RemoteRing, RemoteTarget, WcOpcode,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};
use tracing::debug;

/// What a receiver's connection delivered.
#[derive(Debug)]
pub(super) enum RingDelivery {
    /// A control message from the sender, or why it could not be read.
    Message(Result<Message, Undelivered>),
    /// The sender's data write landed in our ring: its length and its
    /// immediate.
    Chunk { byte_len: u32, imm: u32 },
}

/// What a sender's connection delivered.
#[derive(Debug)]
pub(super) enum WriteDelivery {
    /// A control message from the receiver, or why it could not be read.
    Message(Result<Message, Undelivered>),
    /// Our data write completed: its staging buffer is back.
    Written(Buffer),
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

/// A session's connection to its peer: control messages.
pub(super) trait Link {
    /// Sends `msg` now, or as soon as a send buffer is free (order kept).
    fn send(&mut self, msg: &Message) -> Result<(), XferError>;

    /// Waits until the peer delivered something, unless something
    /// delivered waits already (`next`); may return with nothing when
    /// only our own sends completed. What came before a failure is kept
    /// for `next` all the same (the sender takes it: a verdict may say why;
    /// a receiver's session ends with the failure).
    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError>;

    /// `wait` until `deadline` at most, watching for the peer's disconnect
    /// meanwhile: false when the deadline came first (the caller's timers
    /// say what that means).
    fn wait_until(&mut self, deadline: Instant, what: &str) -> Result<bool, XferError> {
        let expired = std::cell::Cell::new(false);
        let waited = self.wait(Until {
            deadline,
            slice: crate::engine::DISCONNECT_CHECK,
            what,
            give_up: &|| None,
            expired: &|| {
                expired.set(true);
                XferError::PeerLost(format!("nothing came while waiting for {what}"))
            },
        });
        match waited {
            Err(_) if expired.get() => Ok(false),
            Err(e) => Err(e),
            Ok(()) => Ok(true),
        }
    }

    /// Takes what has come without waiting: our sends' completions free
    /// their buffers, deliveries wait for `next` (also when it fails).
    fn poll(&mut self) -> Result<(), XferError>;

    /// From now on every message is sealed and opened with `channel`.
    fn install(&mut self, channel: Channel);

    /// Fails when the oldest of our messages has waited longer than
    /// `limit` to be taken (the peer posts no receives).
    fn check_sends(&self, limit: Duration) -> Result<(), XferError>;

    /// Whether some message of ours is queued or not yet completed.
    fn busy(&self) -> bool;

    /// Lets queued messages reach the peer (best effort, briefly).
    fn drain(&mut self);

    /// Ends the connection, waiting at most `within` for the peer's part.
    fn disconnect(&mut self, within: Duration);
}

/// A receiver's link: the sender writes into its ring.
pub(super) trait RingLink: Link {
    /// `count` more receives for the sender's messages and writes.
    fn add_receives(&mut self, count: usize) -> Result<(), XferError>;

    /// Registers the ring of `len` bytes (once; later calls give the same).
    fn expose_ring(&mut self, len: usize) -> Result<ExposedRing, XferError>;

    /// Copies `dst.len()` bytes at `offset` out of the ring.
    fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), SysError>;

    /// The oldest delivery not handled yet. A message is opened and decoded
    /// only now, so that a channel installed for the one before applies.
    fn next(&mut self) -> Result<Option<RingDelivery>, XferError>;
}

/// One data write: the first `len` bytes of a staging slot to `target`,
/// with `imm`.
#[derive(Debug, Clone, Copy)]
pub(super) struct ChunkWrite {
    pub len: usize,
    pub target: RemoteTarget,
    pub imm: u32,
}

impl ChunkWrite {
    /// The write of a planned chunk: the chunk and, with a token, its tag
    /// after it, to the slot the machine chose.
    pub fn of(plan: &ChunkPlan, imm: u32) -> Self {
        ChunkWrite {
            len: plan.write_len as usize,
            target: RemoteTarget {
                addr: plan.remote_addr,
                rkey: plan.rkey,
            },
            imm,
        }
    }
}

/// A sender's link: it writes chunks into the receiver's ring.
pub(super) trait WriteLink: Link {
    /// Writes from `buf`'s slot of `pool`; the buffer comes back with its
    /// completion (`WriteDelivery::Written`).
    fn post_write(
        &mut self,
        pool: &BufferPool,
        buf: Buffer,
        write: ChunkWrite,
    ) -> Result<(), SysError>;

    /// The oldest delivery not handled yet (as `RingLink::next`).
    fn next(&mut self) -> Result<Option<WriteDelivery>, XferError>;
}

/// The link over a connected queue pair.
pub(super) struct RdmaLink {
    ep: Endpoint,
    control: Control,
    ring: Option<RemoteRing>,
    /// The peer's and our writes' completions not handed out yet (`next`), oldest first.
    kept: VecDeque<Completion>,
    wcs: Vec<Completion>,
}

impl RdmaLink {
    pub(super) fn new(ep: Endpoint, control: Control) -> Self {
        Self {
            ep,
            control,
            ring: None,
            kept: VecDeque::new(),
            wcs: Vec::with_capacity(16),
        }
    }

    /// The oldest completion `next` has not handed out, and what it is.
    fn next_kept(&mut self) -> Option<(Completion, WrKind, WcOpcode)> {
        let wc = self.kept.pop_front()?;
        let (kind, opcode) = (WrId::from_raw(wc.wr_id).kind(), wc.opcode);
        Some((wc, kind, opcode))
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
        // Completions polled before a failure still count.
        let sorted = self.sort_completions();
        waited?;
        sorted
    }

    fn poll(&mut self) -> Result<(), XferError> {
        let polled = self.ep.poll(&mut self.wcs, 16);
        self.sort_completions()?;
        polled.map(drop).map_err(|e| completion_error(&self.ep, e))
    }

    fn install(&mut self, channel: Channel) {
        self.control.install(channel);
    }

    fn check_sends(&self, limit: Duration) -> Result<(), XferError> {
        self.control.check_sends(limit)
    }

    fn busy(&self) -> bool {
        self.control.busy()
    }

    fn drain(&mut self) {
        // Best effort: the session is over either way.
        let _ = self.control.drain(&self.ep, Duration::from_secs(2));
    }

    fn disconnect(&mut self, within: Duration) {
        self.ep.cm_id().disconnect(within);
    }
}

impl RingLink for RdmaLink {
    fn add_receives(&mut self, count: usize) -> Result<(), XferError> {
        self.control.add_receives(&self.ep, count)
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

    fn next(&mut self) -> Result<Option<RingDelivery>, XferError> {
        let Some((wc, kind, opcode)) = self.next_kept() else {
            return Ok(None);
        };
        match (kind, opcode) {
            (WrKind::Recv, WcOpcode::RecvWithImm(imm)) => {
                let byte_len = wc.byte_len;
                // The receive buffer carried no data: hand it back at once.
                self.control.recycle(&self.ep, wc)?;
                Ok(Some(RingDelivery::Chunk { byte_len, imm }))
            }
            (WrKind::Recv, WcOpcode::Recv) => {
                let decoded = self.control.take_message(&self.ep, wc)?;
                Ok(Some(RingDelivery::Message(decoded)))
            }
            // A receiver posts no writes.
            (kind, opcode) => Err(not_ours(format_args!(
                "{opcode:?} for a work request of kind {kind:?}"
            ))),
        }
    }
}

impl WriteLink for RdmaLink {
    fn post_write(
        &mut self,
        pool: &BufferPool,
        buf: Buffer,
        write: ChunkWrite,
    ) -> Result<(), SysError> {
        let wr_id = WrId::write(buf.index() as u64).raw();
        let ChunkWrite { len, target, imm } = write;
        self.ep.post_write_imm(pool, buf, len, target, imm, wr_id)
    }

    fn next(&mut self) -> Result<Option<WriteDelivery>, XferError> {
        let Some((wc, kind, opcode)) = self.next_kept() else {
            return Ok(None);
        };
        match (kind, opcode) {
            (WrKind::Recv, WcOpcode::Recv) => {
                let decoded = self.control.take_message(&self.ep, wc)?;
                Ok(Some(WriteDelivery::Message(decoded)))
            }
            (WrKind::Write, WcOpcode::RdmaWrite) => {
                Ok(Some(WriteDelivery::Written(returned(wc.buffer)?)))
            }
            // Nothing should write into a sender; a receiver that does
            // (its queue pair may) breaks the protocol.
            (WrKind::Recv, WcOpcode::RecvWithImm(_)) => Err(XferError::Protocol {
                context: Some("the receiver wrote into the sender's memory".into()),
                source: ProtocolError::Unexpected {
                    msg: "RDMA write with immediate data",
                    state: "any of the sender's",
                },
            }),
            (kind, opcode) => Err(not_ours(format_args!(
                "{opcode:?} for a work request of kind {kind:?}"
            ))),
        }
    }
}
