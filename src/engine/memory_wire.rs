//! Two links in memory, joined as a sender's and a receiver's are over
//! RDMA: messages travel as the bytes they would be on the wire (sealed
//! once a channel is installed), a data write copies its staging slot
//! into the receiver's ring (a byte vector here) and then completes on
//! both sides. The engines' unit tests run whole sessions over it.

use crate::engine::control::Codec;
use crate::engine::link::{
    ChunkWrite, ExposedRing, Link, RingDelivery, RingLink, Until, WriteDelivery, WriteLink,
};
use crate::error::XferError;
use crate::proto::{Channel, Message};
use crate::sys::SysError;
use crate::sys::rdma::{Buffer, BufferPool};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The address the ring is exposed at, and its key.
pub(super) const RING_ADDR: u64 = 0x10_0000;
pub(super) const RING_KEY: u32 = 7;

/// What reaches the receiver's end.
pub(super) enum ToReceiver {
    /// A control message's bytes.
    Bytes(Vec<u8>),
    /// A data write landed in the ring, announced as its completion is.
    Write { byte_len: u32, imm: u32 },
}

/// What reaches the sender's end.
pub(super) enum ToSender {
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
pub(super) type SharedRing = Arc<Mutex<Vec<u8>>>;

/// One side of the wire: what reaches it, what it sends, and its own state.
pub(super) trait Side {
    /// What reaches this side.
    type In;
    /// What reaches the other side.
    type Out;
    /// A control message's bytes on their way to the other side.
    fn message(bytes: Vec<u8>) -> Self::Out;
    /// What this side's link delivers.
    type Delivery;
    /// What `arrival` delivers.
    fn delivery(codec: &mut Codec, arrival: Self::In) -> Self::Delivery;
    /// The session ended the connection.
    fn disconnected(&mut self) {}
    /// The connection broke: nothing more goes out.
    fn broken(&self) -> bool {
        false
    }
    /// The path went dead without a word: what goes out vanishes.
    fn stalled(&self) -> bool {
        false
    }
    /// `msg` goes out now: what the wire does then (a test's fault).
    fn on_send(&mut self, _msg: &Message) -> OnSend {
        OnSend::Pass
    }
    /// Keeps a stalled side's new inbox open (it hears nothing).
    fn keep_mute(&mut self, _mute: Sender<Self::In>) {}
}

/// What the wire does when a message goes out (`Side::on_send`).
pub(super) enum OnSend {
    Pass,
    /// It goes; what reaches this side comes only this much later.
    Hold(Duration),
    /// The path goes dead with it (as `SenderSide::stall_at_write`).
    Stall,
}

/// One end of the wire.
pub(super) struct End<S: Side> {
    pub(super) codec: Codec,
    to_peer: Sender<S::Out>,
    inbox: Inbox<S::In>,
    /// Until when what reaches this side is held back (`OnSend::Hold`).
    held_until: Option<Instant>,
    ring: SharedRing,
    /// The side's own state (its faults, what it saw).
    pub(super) side: S,
}

/// The sender's side: its writes, and the faults they meet.
#[derive(Default)]
pub(super) struct SenderSide {
    /// Writes made so far.
    writes: u64,
    /// The write of this number (from 0) arrives with its first byte
    /// flipped, as a fault on the way would leave it.
    pub(super) flip_write: Option<u64>,
    /// From the write of this number on, the connection is broken: the
    /// write fails as a post on a dead queue pair does, and so does every
    /// later send; the receiver sees the peer go.
    pub(super) break_at_write: Option<u64>,
    broken: bool,
    /// From the write of this number on, the path is dead with its
    /// carrier up: writes and messages vanish both ways, no completion
    /// and no error comes (a rail cut with packets dropped).
    pub(super) stall_at_write: Option<u64>,
    /// From its HELLO of this number (from 0) on, the path is dead as
    /// with `stall_at_write` (the HELLO vanishes too).
    pub(super) stall_at_hello: Option<u64>,
    hellos: u64,
    /// (n, d): after its FIN of number n (from 0), what the receiver
    /// sends reaches this side only d later (a receiver slow to answer
    /// that FIN: its commit's fsync, say).
    pub(super) hold_after_fin: Option<(u64, Duration)>,
    fins: u64,
    /// Keeps the stalled side's new inbox open (it hears nothing).
    mute: Option<Sender<ToSender>>,
    /// The slots of the writes that vanished.
    lost: Vec<Buffer>,
}

/// The receiver's side.
#[derive(Default)]
pub(super) struct ReceiverSide {
    /// Set when the session disconnects.
    pub(super) disconnected: Arc<AtomicBool>,
}

pub(super) type SenderEnd = End<SenderSide>;
pub(super) type ReceiverEnd = End<ReceiverSide>;

impl Side for SenderSide {
    type In = ToSender;
    type Out = ToReceiver;
    type Delivery = WriteDelivery;

    fn message(bytes: Vec<u8>) -> ToReceiver {
        ToReceiver::Bytes(bytes)
    }

    fn delivery(codec: &mut Codec, arrival: ToSender) -> WriteDelivery {
        match arrival {
            ToSender::Bytes(bytes) => WriteDelivery::Message(codec.open(&bytes)),
            ToSender::Written(buf) => WriteDelivery::Written(buf),
        }
    }

    fn broken(&self) -> bool {
        self.broken
    }

    fn stalled(&self) -> bool {
        self.mute.is_some()
    }

    fn on_send(&mut self, msg: &Message) -> OnSend {
        match msg {
            Message::Hello(_) => {
                self.hellos += 1;
                if self.stall_at_hello.is_some_and(|n| self.hellos > n) {
                    return OnSend::Stall;
                }
            }
            Message::Fin(_) => {
                self.fins += 1;
                if let Some((n, d)) = self.hold_after_fin
                    && self.fins == n + 1
                {
                    return OnSend::Hold(d);
                }
            }
            _ => {}
        }
        OnSend::Pass
    }

    fn keep_mute(&mut self, mute: Sender<ToSender>) {
        self.mute = Some(mute);
    }
}

impl Side for ReceiverSide {
    type In = ToReceiver;
    type Out = ToSender;
    type Delivery = RingDelivery;

    fn message(bytes: Vec<u8>) -> ToSender {
        ToSender::Bytes(bytes)
    }

    fn delivery(codec: &mut Codec, arrival: ToReceiver) -> RingDelivery {
        match arrival {
            ToReceiver::Bytes(bytes) => RingDelivery::Message(codec.open(&bytes)),
            ToReceiver::Write { byte_len, imm } => RingDelivery::Chunk { byte_len, imm },
        }
    }

    fn disconnected(&mut self) {
        self.disconnected.store(true, Ordering::SeqCst);
    }
}

/// A sender's end and a receiver's end, joined.
pub(super) fn pair() -> (SenderEnd, ReceiverEnd) {
    let (to_receiver, receiver_rx) = mpsc::channel();
    let (to_sender, sender_rx) = mpsc::channel();
    let ring = SharedRing::default();
    let sender = End {
        codec: Codec::default(),
        to_peer: to_receiver,
        inbox: Inbox::new(sender_rx),
        held_until: None,
        ring: ring.clone(),
        side: SenderSide::default(),
    };
    let receiver = End {
        codec: Codec::default(),
        to_peer: to_sender,
        inbox: Inbox::new(receiver_rx),
        held_until: None,
        ring,
        side: ReceiverSide::default(),
    };
    (sender, receiver)
}

fn ring_of(ring: &SharedRing) -> std::sync::MutexGuard<'_, Vec<u8>> {
    ring.lock().unwrap_or_else(|p| p.into_inner())
}

impl<S: Side> End<S> {
    /// The oldest arrival, as this side's link delivers it.
    fn next_delivery(&mut self) -> Option<S::Delivery> {
        if self.held() {
            return None;
        }
        let arrival = self.inbox.kept.pop_front()?;
        Some(S::delivery(&mut self.codec, arrival))
    }

    /// Whether what reaches this side is still held back.
    fn held(&mut self) -> bool {
        match self.held_until {
            Some(at) if Instant::now() < at => true,
            _ => {
                self.held_until = None;
                false
            }
        }
    }

    /// The path went dead: nothing reaches this side any more.
    fn stall(&mut self) {
        let (mute, deaf) = mpsc::channel();
        self.side.keep_mute(mute);
        self.inbox = Inbox::new(deaf);
    }

    /// Puts `bytes` on the wire as they are (a test's forgery).
    pub(super) fn send_raw(&self, bytes: Vec<u8>) {
        // A peer that went away takes nothing: like a SEND that completes
        // into the void, noticed by the next wait; the test looks at how.
        let _ = self.to_peer.send(S::message(bytes));
    }
}

impl<S: Side> Link for End<S> {
    fn send(&mut self, msg: &Message) -> Result<(), XferError> {
        if self.side.broken() {
            return Err(XferError::PeerLost("the connection broke".into()));
        }
        let hold = match self.side.on_send(msg) {
            OnSend::Pass => None,
            OnSend::Hold(d) => Some(d),
            OnSend::Stall if !self.side.stalled() => {
                self.stall();
                None
            }
            OnSend::Stall => None,
        };
        if self.side.stalled() {
            return Ok(());
        }
        let bytes = self.codec.seal(msg)?;
        self.send_raw(bytes);
        if let Some(d) = hold {
            self.held_until = Instant::now().checked_add(d);
        }
        Ok(())
    }

    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError> {
        // Held back: nothing comes before the hold ends.
        while let Some(at) = self.held_until {
            if !self.held() {
                break;
            }
            if let Some(e) = (until.give_up)() {
                return Err(e);
            }
            let now = Instant::now();
            if now >= until.deadline {
                return Err((until.expired)());
            }
            std::thread::sleep(
                at.min(until.deadline)
                    .saturating_duration_since(now)
                    .min(until.slice),
            );
        }
        self.inbox.wait(until)
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
        self.side.disconnected();
    }
}

impl WriteLink for SenderEnd {
    fn post_write(
        &mut self,
        pool: &BufferPool,
        buf: Buffer,
        write: ChunkWrite,
    ) -> Result<(), SysError> {
        let ChunkWrite { len, target, imm } = write;
        let side = &mut self.side;
        if side.break_at_write.is_some_and(|n| side.writes >= n) {
            side.broken = true;
            // The receiver's side of the connection goes too.
            self.to_peer = mpsc::channel().0;
            return Err(SysError::Disconnected);
        }
        if side.mute.is_none() && side.stall_at_write.is_some_and(|n| side.writes >= n) {
            self.stall();
        }
        let side = &mut self.side;
        if side.mute.is_some() {
            // Gone without a trace; its slot never comes back.
            side.lost.push(buf);
            return Ok(());
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
            if side.flip_write == Some(side.writes)
                && let Some(first) = slot.first_mut()
            {
                *first ^= 1;
            }
        }
        side.writes += 1;
        let byte_len =
            u32::try_from(len).map_err(|_| SysError::Invalid("write too long".into()))?;
        let _ = self.to_peer.send(ToReceiver::Write { byte_len, imm });
        self.inbox.kept.push_back(ToSender::Written(buf));
        Ok(())
    }

    fn next(&mut self) -> Result<Option<WriteDelivery>, XferError> {
        Ok(self.next_delivery())
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

    fn next(&mut self) -> Result<Option<RingDelivery>, XferError> {
        Ok(self.next_delivery())
    }
}
