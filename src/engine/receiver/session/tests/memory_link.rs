//! A receiver session's link in memory: messages travel as the bytes
//! they would be on the wire (sealed once a channel is installed), the
//! ring is a byte vector the test's sender writes into.

use crate::engine::control::Codec;
use crate::engine::receiver::link::{Delivery, ExposedRing, Link, Until};
use crate::error::XferError;
use crate::proto::{Channel, Message};
use crate::sys::SysError;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What the sender puts on the link.
pub(super) enum Arrival {
    /// A control message's bytes.
    Bytes(Vec<u8>),
    /// A data write into the ring, announced the way its completion is.
    Write { byte_len: u32, imm: u32 },
}

/// Where the sender's writes land: exposed by the session.
pub(super) type SharedRing = Arc<Mutex<Vec<u8>>>;

/// The address the in-memory ring is exposed at.
pub(super) const RING_ADDR: u64 = 0x10_0000;

pub(super) struct MemoryLink {
    pub codec: Codec,
    pub to_peer: Sender<Vec<u8>>,
    pub from_peer: Receiver<Arrival>,
    pub kept: VecDeque<Arrival>,
    pub ring: SharedRing,
    /// Set by `disconnect`.
    pub closed: Arc<AtomicBool>,
}

impl MemoryLink {
    /// Keeps what arrived without waiting; false once the peer is gone.
    fn take_arrived(&mut self) -> bool {
        loop {
            match self.from_peer.try_recv() {
                Ok(a) => self.kept.push_back(a),
                Err(TryRecvError::Empty) => return true,
                Err(TryRecvError::Disconnected) => return false,
            }
        }
    }
}

impl Link for MemoryLink {
    fn send(&mut self, msg: &Message) -> Result<(), XferError> {
        let bytes = self.codec.seal(msg)?;
        // A sender that went away takes nothing: like a SEND that
        // completes into the void, noticed by the next wait.
        let _ = self.to_peer.send(bytes);
        Ok(())
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
            match self.from_peer.recv_timeout(left.min(until.slice)) {
                Ok(a) => {
                    self.kept.push_back(a);
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

    fn next(&mut self) -> Result<Option<Delivery>, XferError> {
        Ok(self.kept.pop_front().map(|a| match a {
            Arrival::Bytes(bytes) => Delivery::Message(self.codec.open(&bytes)),
            Arrival::Write { byte_len, imm } => Delivery::Chunk { byte_len, imm },
        }))
    }

    fn poll(&mut self) -> Result<(), XferError> {
        self.take_arrived();
        Ok(())
    }

    fn install(&mut self, channel: Channel) {
        self.codec.install(channel);
    }

    fn add_receives(&mut self, _count: usize) -> Result<(), XferError> {
        Ok(())
    }

    fn check_sends(&self, _limit: Duration) -> Result<(), XferError> {
        Ok(())
    }

    fn expose_ring(&mut self, len: usize) -> Result<ExposedRing, XferError> {
        let mut ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        if ring.is_empty() {
            ring.resize(len, 0);
        }
        Ok(ExposedRing {
            addr: RING_ADDR,
            rkey: 7,
        })
    }

    fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<(), SysError> {
        let ring = self.ring.lock().unwrap_or_else(|p| p.into_inner());
        let src = offset
            .checked_add(dst.len())
            .and_then(|end| ring.get(offset..end))
            .ok_or_else(|| {
                SysError::Invalid(format!("range {offset}+{} outside the ring", dst.len()))
            })?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn drain(&mut self) {}

    fn disconnect(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
    }
}
