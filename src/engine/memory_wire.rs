//! Two links in memory, joined as a sender's and a receiver's are over
//! RDMA: messages travel as the bytes they would be on the wire (sealed
//! once a channel is installed), a data write copies its staging slot
//! into the receiver's ring (a byte vector here) and then completes on
//! both sides. The engines' unit tests run whole sessions over it.

use crate::engine::control::Codec;
use crate::engine::link::{Delivery, ExposedRing, Link, RingLink, Until, WriteLink};
use crate::error::XferError;
use crate::proto::{Channel, Message};
use crate::sys::SysError;
use crate::sys::rdma::{Buffer, BufferPool, RemoteTarget};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The address the ring is exposed at, and its key.
pub const RING_ADDR: u64 = 0x10_0000;
pub const RING_KEY: u32 = 7;

/// What reaches the receiver's end.
pub enum ToReceiver {
    /// A control message's bytes.
    Bytes(Vec<u8>),
    /// A data write landed in the ring, announced as its completion is.
    Write { byte_len: u32, imm: u32 },
}

/// What reaches the sender's end.
pub enum ToSender {
    /// A control message's bytes.
    Bytes(Vec<u8>),
    /// One of its writes completed.
    Written(Buffer),
}

/// A connection's receiving half: what arrived, in order, and waiting
/// for more within a link's `Until`.
struct Inbox<T> {
    rx: Receiver<T>,
    kept: VecDeque<T>,
}

impl<T> Inbox<T> {
    fn new(rx: Receiver<T>) -> Self {
        Self {
            rx,
            kept: VecDeque::new(),
        }
    }

    /// Keeps what arrived without waiting; false once the peer is gone.
    fn take_arrived(&mut self) -> bool {
        loop {
            match self.rx.try_recv() {
                Ok(t) => self.kept.push_back(t),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }

    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError> {
        if !self.kept.is_empty() {
            return Ok(());
        }
        loop {
            if let Some(e) = (until.give_up)() {
                return Err(e);
            }
            let left = until.deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left.min(until.slice)) {
                Ok(t) => {
                    self.kept.push_back(t);
                    self.take_arrived();
                    return Ok(());
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(XferError::PeerLost(format!(
                        "the peer disconnected while we waited for {}",
                        until.what
                    )));
                }
                Err(RecvTimeoutError::Timeout) if Instant::now() >= until.deadline => {
                    return Err((until.expired)());
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }
}

/// The receiver's ring.
pub type SharedRing = Arc<Mutex<Vec<u8>>>;

/// The receiver's end.
pub struct ReceiverEnd {
    codec: Codec,
    to_sender: Sender<ToSender>,
    inbox: Inbox<ToReceiver>,
    ring: SharedRing,
    /// Set by `disconnect`.
    pub disconnected: Arc<AtomicBool>,
}

/// The sender's end.
pub struct SenderEnd {
    pub codec: Codec,
    to_receiver: Sender<ToReceiver>,
    /// The receiver's messages, and our own writes' completions.
    inbox: Inbox<ToSender>,
    ring: SharedRing,
    /// Writes made so far.
    writes: u64,
    /// The write of this number (from 0) arrives with its first byte
    /// flipped, as a fault on the way would leave it.
    pub flip_write: Option<u64>,
    /// From the write of this number on, the connection is broken: the
    /// write fails as a post on a dead queue pair does.
    pub break_at_write: Option<u64>,
}

/// A sender's end and a receiver's end, joined.
pub fn pair() -> (SenderEnd, ReceiverEnd) {
    let (to_receiver, receiver_rx) = mpsc::channel();
    let (to_sender, sender_rx) = mpsc::channel();
    let ring = SharedRing::default();
    let sender = SenderEnd {
        codec: Codec::default(),
        to_receiver,
        inbox: Inbox::new(sender_rx),
        ring: ring.clone(),
        writes: 0,
        flip_write: None,
        break_at_write: None,
    };
    let receiver = ReceiverEnd {
        codec: Codec::default(),
        to_sender,
        inbox: Inbox::new(receiver_rx),
        ring,
        disconnected: Arc::default(),
    };
    (sender, receiver)
}

fn ring_of(ring: &SharedRing) -> std::sync::MutexGuard<'_, Vec<u8>> {
    ring.lock().unwrap_or_else(|p| p.into_inner())
}

impl SenderEnd {
    /// Puts `bytes` on the wire as they are (a test's forgery).
    pub fn send_raw(&self, bytes: Vec<u8>) {
        // A receiver that went away takes nothing: the test looks at how.
        let _ = self.to_receiver.send(ToReceiver::Bytes(bytes));
    }
}

impl Link for SenderEnd {
    fn send(&mut self, msg: &Message) -> Result<(), XferError> {
        let bytes = self.codec.seal(msg)?;
        self.send_raw(bytes);
        Ok(())
    }

    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError> {
        self.inbox.wait(until)
    }

    fn next(&mut self) -> Result<Option<Delivery>, XferError> {
        Ok(self.inbox.kept.pop_front().map(|t| match t {
            ToSender::Bytes(bytes) => Delivery::Message(self.codec.open(&bytes)),
            ToSender::Written(buf) => Delivery::Written(buf),
        }))
    }

    fn poll(&mut self) -> Result<(), XferError> {
        self.inbox.take_arrived();
        Ok(())
    }

    fn install(&mut self, channel: Channel) {
        self.codec.install(channel);
    }

    fn check_sends(&self, _limit: Duration) -> Result<(), XferError> {
        Ok(())
    }

    fn busy(&self) -> bool {
        false
    }

    fn drain(&mut self) {}

    fn disconnect(&mut self, _within: Duration) {}
}

impl WriteLink for SenderEnd {
    fn post_write(
        &mut self,
        pool: &BufferPool,
        buf: Buffer,
        len: usize,
        target: RemoteTarget,
        imm: u32,
    ) -> Result<(), SysError> {
        if self.break_at_write.is_some_and(|n| self.writes >= n) {
            return Err(SysError::Disconnected);
        }
        let bytes = pool.bytes(&buf, len)?;
        {
            let mut ring = ring_of(&self.ring);
            let at = target
                .addr
                .checked_sub(RING_ADDR)
                .and_then(|a| usize::try_from(a).ok());
            let slot = at
                .filter(|_| target.rkey == RING_KEY)
                .and_then(|at| ring.get_mut(at..at.checked_add(len)?))
                .ok_or_else(|| {
                    SysError::Invalid(format!(
                        "a write of {len} bytes to {:#x} (key {}) outside the ring",
                        target.addr, target.rkey
                    ))
                })?;
            slot.copy_from_slice(bytes);
            if self.flip_write == Some(self.writes)
                && let Some(first) = slot.first_mut()
            {
                *first ^= 1;
            }
        }
        self.writes += 1;
        let byte_len =
            u32::try_from(len).map_err(|_| SysError::Invalid("write too long".into()))?;
        let _ = self.to_receiver.send(ToReceiver::Write { byte_len, imm });
        self.inbox.kept.push_back(ToSender::Written(buf));
        Ok(())
    }
}

impl Link for ReceiverEnd {
    fn send(&mut self, msg: &Message) -> Result<(), XferError> {
        let bytes = self.codec.seal(msg)?;
        // A sender that went away takes nothing: like a SEND that
        // completes into the void, noticed by the next wait.
        let _ = self.to_sender.send(ToSender::Bytes(bytes));
        Ok(())
    }

    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError> {
        self.inbox.wait(until)
    }

    fn next(&mut self) -> Result<Option<Delivery>, XferError> {
        Ok(self.inbox.kept.pop_front().map(|t| match t {
            ToReceiver::Bytes(bytes) => Delivery::Message(self.codec.open(&bytes)),
            ToReceiver::Write { byte_len, imm } => Delivery::Chunk { byte_len, imm },
        }))
    }

    fn poll(&mut self) -> Result<(), XferError> {
        self.inbox.take_arrived();
        Ok(())
    }

    fn install(&mut self, channel: Channel) {
        self.codec.install(channel);
    }

    fn check_sends(&self, _limit: Duration) -> Result<(), XferError> {
        Ok(())
    }

    fn busy(&self) -> bool {
        false
    }

    fn drain(&mut self) {}

    fn disconnect(&mut self, _within: Duration) {
        self.disconnected.store(true, Ordering::SeqCst);
    }
}

impl RingLink for ReceiverEnd {
    fn add_receives(&mut self, _count: usize) -> Result<(), XferError> {
        Ok(())
    }

    fn expose_ring(&mut self, len: usize) -> Result<ExposedRing, XferError> {
        let mut ring = ring_of(&self.ring);
        if ring.is_empty() {
            ring.resize(len, 0);
        }
        Ok(ExposedRing {
            addr: RING_ADDR,
            rkey: RING_KEY,
        })
    }

    fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), SysError> {
        let ring = ring_of(&self.ring);
        let src = offset
            .checked_add(dst.len())
            .and_then(|end| ring.get(offset..end))
            .ok_or_else(|| {
                SysError::Invalid(format!("range {offset}+{} outside the ring", dst.len()))
            })?;
        dst.copy_from_slice(src);
        Ok(())
    }
}
