//! The test's sender: the protocol's own sender machine, speaking to a
//! session over the memory wire the way the sender engine does over RDMA.

use crate::engine::digest::FileHasher;
use crate::engine::link::{ChunkWrite, Link, Until, WriteDelivery, WriteLink};
use crate::engine::memory_wire::SenderEnd;
use crate::engine::per_byte::tag_chunk;
use crate::proto::{
    Ack, CHUNK_TAG_LEN, Digest, DigestAlg, FileOffer, Message, Mtime, OfferKind, SenderEvent,
    SenderSession, Verdict,
};
use crate::sys::rdma::{Buffer, BufferPool};
use std::time::{Duration, Instant};

/// Longest a test waits for the session's next message.
const PATIENCE: Duration = Duration::from_secs(30);

/// Staging slots: enough for any test's chunks in flight.
const STAGING: usize = 4;

pub(super) struct Peer {
    pub machine: SenderSession,
    pub end: SenderEnd,
    pool: BufferPool,
    free: Vec<Buffer>,
    /// The whole-file digest of every offer (a receiver with a token
    /// takes only SHA-256).
    pub digest: DigestAlg,
    /// The chunk of this number carries a wrong tag (its CRC is right).
    pub flip_tag: Option<u64>,
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
        existing: Default::default(),
        piece: None,
    }
}

/// `len` bytes that differ from one file to the next.
pub(super) fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

impl Peer {
    /// A sender whose slots hold `slot_size` bytes (a chunk and its tag).
    pub fn new(machine: SenderSession, end: SenderEnd, slot_size: usize) -> Self {
        let (pool, free) = BufferPool::in_memory(slot_size, STAGING).expect("staging");
        Self {
            machine,
            end,
            pool,
            free,
            digest: DigestAlg::Crc32,
            flip_tag: None,
            tags: 0,
        }
    }

    /// Sends what the machine queued.
    pub fn transmit(&mut self) {
        while let Some(msg) = self.machine.poll_transmit() {
            self.end.send(&msg).expect("a message seals");
        }
    }

    /// The next delivery; None once the session ended (its end is gone).
    fn delivery(&mut self) -> Option<WriteDelivery> {
        loop {
            let waited = self.end.wait(Until {
                deadline: Instant::now() + PATIENCE,
                slice: PATIENCE,
                what: "the session",
                give_up: &|| None,
                expired: &|| panic!("the session said nothing for {PATIENCE:?}"),
            });
            if waited.is_err() {
                return None;
            }
            if let Some(d) = self.end.next().expect("the wire delivers") {
                return Some(d);
            }
        }
    }

    /// The session's next message; None once it ended. Completed writes
    /// give their slots back on the way.
    pub fn recv(&mut self) -> Option<Message> {
        loop {
            match self.delivery()? {
                WriteDelivery::Message(m) => return Some(m.expect("the session's messages open")),
                WriteDelivery::Written(buf) => self.free.push(buf),
            }
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
        if greeting.proving {
            self.transmit();
            let SenderEvent::Authenticated(channel) = self.event() else {
                panic!("not authenticated");
            };
            self.end.install(channel);
        }
    }

    /// Sends the HELLO (with the peer's digest) and returns the session's
    /// answer.
    pub fn offer(&mut self, mut offer: FileOffer) -> SenderEvent {
        offer.digest = self.digest;
        self.tags += 1;
        self.machine.start_file(offer, self.tags).expect("Idle");
        self.transmit();
        self.event()
    }

    /// A free staging slot, once one of our writes completed.
    fn slot(&mut self) -> Buffer {
        loop {
            if let Some(buf) = self.free.pop() {
                return buf;
            }
            match self.delivery().expect("the session ended early") {
                WriteDelivery::Written(buf) => return buf,
                WriteDelivery::Message(m) => {
                    let m = m.expect("the session's messages open");
                    match self.machine.on_message(m) {
                        Ok(SenderEvent::Credit(_)) => {}
                        other => panic!("waiting for a slot: {other:?}"),
                    }
                }
            }
        }
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
            let mut buf = self.slot();
            let slot = self
                .pool
                .bytes_mut(&mut buf, plan.write_len as usize)
                .expect("a slot");
            let (data, tag) = slot.split_at_mut(chunk.len());
            data.copy_from_slice(chunk);
            if let Some(auth) = self.machine.chunk_auth() {
                let tag = &mut tag[..CHUNK_TAG_LEN];
                tag_chunk(Some(&auth), plan.file_offset, chunk, tag);
                if self.flip_tag == Some(plan.seq) {
                    tag[0] ^= 1;
                }
            }
            let crc = crc32fast::hash(chunk);
            hasher.update(chunk, crc);
            let imm = if bad_crc == Some(plan.seq) { !crc } else { crc };
            self.end
                .post_write(&self.pool, buf, ChunkWrite::of(&plan, imm))
                .expect("the write fits the ring");
        }
        hasher
    }

    /// Sends the FIN with `digest` and returns the file's verdict.
    pub fn finish(&mut self, digest: Digest) -> Ack {
        self.machine.finish(digest).expect("every chunk planned");
        self.transmit();
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
        self.machine.close().expect("nothing pending");
        self.transmit();
    }
}
