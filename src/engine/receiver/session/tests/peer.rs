//! The test's sender: the protocol's own sender machine, speaking to a
//! session over a `MemoryLink` the way the sender engine does over RDMA.

use super::memory_link::{Arrival, RING_ADDR, SharedRing};
use crate::engine::control::Codec;
use crate::engine::digest::FileHasher;
use crate::engine::per_byte::tag_chunk;
use crate::proto::{
    Ack, CHUNK_TAG_LEN, Digest, DigestAlg, FileOffer, Message, Mtime, OfferKind, SenderEvent,
    SenderSession, Verdict,
};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

/// Longest a test waits for the session's next message.
const PATIENCE: Duration = Duration::from_secs(30);

pub(super) struct Peer {
    pub machine: SenderSession,
    pub codec: Codec,
    pub to_session: Sender<Arrival>,
    pub from_session: Receiver<Vec<u8>>,
    pub ring: SharedRing,
    /// The whole-file digest of every offer (a receiver with a token
    /// takes only SHA-256).
    pub digest: DigestAlg,
    tags: u64,
}

/// A plain file offer of `size` bytes.
pub(super) fn file(name: &str, size: u64) -> FileOffer {
    FileOffer {
        name: name.into(),
        size,
        mode: 0o644,
        digest: DigestAlg::Crc32,
        kind: OfferKind::File,
        mtime: Some(Mtime {
            secs: 1_700_000_000,
            nanos: 0,
        }),
        keep_mode: false,
        resume: false,
        checksum: false,
    }
}

/// `len` bytes that differ from one file to the next.
pub(super) fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

impl Peer {
    pub fn new(
        machine: SenderSession,
        to_session: Sender<Arrival>,
        from_session: Receiver<Vec<u8>>,
        ring: SharedRing,
    ) -> Self {
        Self {
            machine,
            codec: Codec::default(),
            to_session,
            from_session,
            ring,
            digest: DigestAlg::Crc32,
            tags: 0,
        }
    }

    pub fn send(&mut self, msg: &Message) {
        let bytes = self.codec.seal(msg).expect("a message seals");
        self.put(Arrival::Bytes(bytes));
    }

    pub fn put(&self, arrival: Arrival) {
        // A session that ended takes nothing more; the test looks at how.
        let _ = self.to_session.send(arrival);
    }

    /// The session's next message; None once it ended (its link is gone).
    pub fn recv(&mut self) -> Option<Message> {
        match self.from_session.recv_timeout(PATIENCE) {
            Ok(bytes) => Some(
                self.codec
                    .open(&bytes)
                    .expect("the session's messages open"),
            ),
            Err(RecvTimeoutError::Disconnected) => None,
            Err(RecvTimeoutError::Timeout) => panic!("the session said nothing for {PATIENCE:?}"),
        }
    }

    /// What the session's next message means; credits and keepalives are
    /// taken in passing.
    pub fn event(&mut self) -> SenderEvent {
        loop {
            let msg = self.recv().expect("the session ended early");
            let event = self
                .machine
                .on_message(msg)
                .expect("the session keeps to the protocol");
            if !matches!(event, SenderEvent::Credit(_) | SenderEvent::Keepalive) {
                return event;
            }
        }
    }

    /// Answers the CHALLENGE (with PROVE when the session wants one).
    pub fn greet(&mut self) {
        let SenderEvent::Greeted(greeting) = self.event() else {
            panic!("no CHALLENGE first");
        };
        if let Some(prove) = greeting.prove {
            self.send(&prove);
            assert_eq!(self.event(), SenderEvent::Authenticated);
            let channel = self
                .machine
                .take_channel()
                .expect("a channel once authenticated");
            self.codec.install(channel);
        }
    }

    /// Sends the HELLO (with the peer's digest) and returns the session's
    /// answer.
    pub fn offer(&mut self, mut offer: FileOffer) -> SenderEvent {
        offer.digest = self.digest;
        self.tags += 1;
        let hello = self.machine.start_file(offer, self.tags).expect("Idle");
        self.send(&hello);
        self.event()
    }

    /// Writes `data` into the ring chunk by chunk as credits allow; the
    /// chunk numbered `bad_crc` announces a wrong CRC32.
    pub fn write_data(&mut self, data: &[u8], bad_crc: Option<u64>) -> FileHasher {
        let mut hasher = FileHasher::new(self.digest);
        let chunk_len = self.machine.chunk_len() as usize;
        for chunk in data.chunks(chunk_len.max(1)) {
            let plan = loop {
                match self.machine.next_chunk(chunk.len() as u32) {
                    Ok(Some(plan)) => break plan,
                    Ok(None) => match self.recv().map(|m| self.machine.on_message(m)) {
                        Some(Ok(SenderEvent::Credit(_))) => {}
                        other => panic!("waiting for credit: {other:?}"),
                    },
                    Err(e) => panic!("no chunk to plan: {e}"),
                }
            };
            let at = (plan.remote_addr - RING_ADDR) as usize;
            {
                let mut ring = self.ring.lock().unwrap();
                ring[at..at + chunk.len()].copy_from_slice(chunk);
                if let Some(auth) = self.machine.chunk_auth() {
                    let tag = &mut ring[at + chunk.len()..at + chunk.len() + CHUNK_TAG_LEN];
                    tag_chunk(Some(&auth), plan.file_offset, chunk, tag);
                }
            }
            let crc = crc32fast::hash(chunk);
            hasher.update(chunk, crc);
            let imm = if bad_crc == Some(plan.seq) { !crc } else { crc };
            self.put(Arrival::Write {
                byte_len: plan.write_len,
                imm,
            });
        }
        hasher
    }

    /// Sends the FIN with `digest` and returns the file's verdict.
    pub fn finish(&mut self, digest: Digest) -> Ack {
        let fin = self.machine.finish(digest).expect("every chunk planned");
        self.send(&fin);
        match self.event() {
            SenderEvent::Answered {
                verdict: Verdict::Ack(ack),
                ..
            } => ack,
            other => panic!("no verdict: {other:?}"),
        }
    }

    /// Offers `data` as the file `name` and sends it whole.
    pub fn send_file(&mut self, name: &str, data: &[u8]) -> Ack {
        match self.offer(file(name, data.len() as u64)) {
            SenderEvent::Ring(_) => {}
            other => panic!("{name} not accepted: {other:?}"),
        }
        let hasher = self.write_data(data, None);
        self.finish(hasher.finish())
    }

    pub fn bye(&mut self) {
        let bye = self.machine.close().expect("nothing pending");
        self.send(&bye);
    }
}
