//! rdma-xfer control protocol (session protocol 8): wire codec, name checks and the pure sender /
//! receiver session state machines. No I/O happens here; the engine drives it.
//!
//! How a machine talks to its engine:
//! - Messages: every one it sends goes into its outbox (`poll_transmit`),
//!   whether an input or an engine call caused it; no call returns a
//!   message to send (`refuse_busy` and `refuse_batch_for_link` return a
//!   copy of the REJECT they queued, for the log).
//! - Timers: `poll_timeout` and `handle_timeout`, fed the engine's instants.
//! - The engine's work: each input (`on_message`, `on_chunk_of`) returns
//!   the one piece of work it causes, as its event or placement; engine
//!   calls (`accept`, `have_found`, `start_from`, `complete`, ...) return
//!   none. There is no separate action queue because it would never hold
//!   more than that one: an event that asks the engine to decide (an offer,
//!   FROM, COMPARE, FIN, admission on the receiver; a HAVE on the sender)
//!   leaves the machine in a state that waits for the answer, and there no
//!   message asks for another (fuzzed: `tests/fuzz_proto`, "one engine
//!   decision at a time"). The other events are notices that need no
//!   answer (a verdict, credits, a KEEPALIVE, the ring); a sender engine
//!   that takes several deliveries before acting keeps them in order
//!   (`Connection::events`), the FIFO a `poll_action` would be.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

pub mod assembly;
pub mod auth;
pub mod names;
pub mod receiver;
pub mod sender;
pub mod wire;

pub use auth::{
    AUTH_REQUIRED, CHUNK_TAG_LEN, Channel, ChannelError, ChunkAuth, ChunkKey, ConnectionId,
    MAC_LEN, MIN_TOKEN_LEN, NONCE_LEN, Role, SEAL_LEN, SessionKey, Token,
};
pub use names::{
    Escaped, MAX_NAME_BYTES, MAX_PATH_BYTES, NameError, NameRules, PathError, escaped,
    is_invisible, validate_name, validate_path,
};
pub use receiver::{
    AUTH_TIMEOUT, AuthFailure, Busy, ChunkError, ChunkPlacement, DEFAULT_MAX_FILES, DigestBudget,
    Existing, Found, MAX_REFUSALS_IN_A_ROW, ReceiverConfig, ReceiverEvent, ReceiverSession,
    ReceiverState, RecvError, Standing, TimedOut, Undecodable, busy_refusal,
};
pub use sender::{
    Capability, ChunkPlan, FileOffer, Greeting, MAX_PENDING, OfferKind, Pending, SameCopy,
    SenderAuth, SenderEvent, SenderSession, SenderState, Verdict, Waiting, WhenExisting,
    keepalive_interval,
};
pub use wire::{
    Ack, AckFailure, AckStatus, BATCH_ROOM, CAP_NONE, Challenge, Digest, DigestAlg, FailedAck, Fin,
    Have, HaveKind, Hello, HopResult, HopVerdict, MAX_FRAME, MAX_HOST_LEN, MAX_MESSAGE,
    MAX_RELAY_HOPS, Message, MessageType, Mtime, Prove, Reject, RejectCode, Relay, RingInfo,
    WireError, batch_member_len, check_host, decode, encode, encode_to_vec, hello_flags,
    relay_messages,
};

use thiserror::Error;

/// Session protocol version carried in HELLO and PROVE. Version 2 added
/// HELLO flags (streams, directories, mtimes), relative paths and
/// KEEPALIVE; version 3 the mutual, connection-bound authentication (PROVE,
/// AUTH_OK) and sealed control messages; version 4 BATCH (small files
/// offered, written and acknowledged together); version 5 the chunks'
/// tags with a token (each write carries its chunk, then the chunk's tag);
/// version 6 verdicts without data (ACK unchanged, kept-existing,
/// kept-newer answering a HELLO: re-runs are no-ops); version 7 relay
/// chains (RELAY names the hosts after the receiver, RESULT reports each
/// host's verdict before the offer's own); version 8 pieces (HELLO's
/// PIECE: one file offered in pieces over several sessions, lanes; ACK
/// PieceKept). Both sides speak exactly one version: a peer of another one
/// is refused, naming both.
pub const PROTOCOL_VERSION: u16 = 8;

/// Most files one BATCH may offer.
pub const MAX_BATCH_FILES: usize = 256;

/// A violation of the session protocol (by the peer, or by the local caller for
/// `WrongState`). Errors caused by a peer message end the session: the state
/// machine moves to `Closed`.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    /// The peer sent a message (or a chunk) the current state does not allow.
    #[error("unexpected {msg} in state {state}")]
    Unexpected {
        /// The message's kind.
        msg: &'static str,
        /// The state it arrived in.
        state: &'static str,
    },
    /// The local caller asked for an operation the current state does not
    /// allow (a bug in the engine; the state is unchanged).
    #[error("{op} is not allowed in state {state}")]
    WrongState {
        /// The operation (method name).
        op: &'static str,
        /// The state it was called in.
        state: &'static str,
    },
    /// The peer ended the session with a REJECT where no answer to an
    /// offer was due.
    #[error("peer aborted the session ({code}): {}", escaped(reason))]
    PeerRejected {
        /// The REJECT's code.
        code: RejectCode,
        /// The REJECT's text.
        reason: String,
    },
    /// The receiver refused the session in its greeting (e.g. Busy).
    #[error("the receiver refused the session ({code}): {}", escaped(reason))]
    Refused {
        /// The REJECT's code.
        code: RejectCode,
        /// The REJECT's text.
        reason: String,
    },
    /// REJECT(Auth): the receiver did not accept our AUTH (`reason` is its text).
    #[error("authentication failed (the receiver says: {})", escaped(reason))]
    AuthFailed {
        /// The receiver's explanation.
        reason: String,
    },
    /// This sender has a token but the receiver's CHALLENGE does not ask
    /// for authentication: a receiver without a token, or someone posing
    /// as the receiver. Nothing is sent to it.
    #[error(
        "the receiver does not ask for authentication, but this sender has a token: refusing to \
         send anything to it (a receiver without a token, or someone posing as the receiver)"
    )]
    NoAuthRequested,
    /// AUTH_OK whose proof is wrong: the peer does not know the token (or
    /// relays another connection's handshake). Nothing is sent to it.
    #[error(
        "the receiver failed to prove that it knows the token: refusing to send anything to it \
         (a receiver with another token, or someone posing as the receiver)"
    )]
    ReceiverProofFailed,
    /// The peer speaks another session protocol version.
    #[error("protocol version mismatch: {detail}")]
    VersionMismatch {
        /// Both versions, as far as known.
        detail: String,
    },
    /// A receiver of this protocol version refused an offer for a
    /// capability it predates (REJECT(version) of an offer with it).
    #[error("protocol version mismatch: {detail}")]
    OlderReceiver {
        /// What the offer asked for that the receiver does not know.
        lacks: sender::Capability,
        /// Both versions, as far as known.
        detail: String,
    },
    /// The peer said nothing for the session's timeout while it was
    /// awaited (the sender's receive timeout).
    #[error("no progress for {secs}s while waiting for {what}")]
    NoProgress {
        /// The timeout, in whole seconds.
        secs: u64,
        /// What was awaited.
        what: &'static str,
    },
    /// The MR's ring is unusable (empty, overflowing the address space, or
    /// not the configured shape).
    #[error("invalid ring: {reason}")]
    BadRing {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A BATCH the engine asked for that the protocol does not allow (a
    /// bug in the engine; the state is unchanged).
    #[error("invalid batch: {reason}")]
    BadBatch {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A HAVE that does not fit the offer it answers.
    #[error("invalid HAVE: {reason}")]
    BadHave {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A FROM at an offset HAVE did not offer.
    #[error("FROM at byte {offset}: the receiver offered to continue at {have} (or 0)")]
    BadFrom {
        /// FROM's offset.
        offset: u64,
        /// HAVE's bytes.
        have: u64,
    },
    /// A CREDIT granting nothing.
    #[error("CREDIT of 0 is invalid")]
    ZeroCredit,
    #[error("CREDIT of {added} with {credits} credits held exceeds the ring's {slot_count} slots")]
    /// A CREDIT that would give the sender more credits than the ring has
    /// slots.
    CreditOverflow {
        /// Credits in the CREDIT.
        added: u32,
        /// Credits the sender already held.
        credits: u32,
        /// The ring's slots.
        slot_count: u32,
    },
    /// The sender wrote into a slot it held no credit for.
    #[error("sender wrote more than {slot_count} chunks without credit")]
    CreditOverrun {
        /// The ring's slots.
        slot_count: u32,
    },
    /// A chunk that cannot be placed: empty, larger than a slot or than
    /// the file's rest, after a stream's short last chunk, and the like.
    #[error("chunk {seq} ({len} bytes): {reason}")]
    BadChunk {
        /// The chunk's sequence number in its file.
        seq: u64,
        /// Its length.
        len: u32,
        /// What is wrong with it.
        reason: &'static str,
    },
    #[error(
        "FIN claims {fin_bytes} bytes in {fin_chunks} chunks, but {got_bytes} bytes in {got_chunks} chunks arrived (announced size {size})"
    )]
    /// A file's FIN disagrees with what arrived or with its HELLO's size.
    FinMismatch {
        /// Bytes the FIN claims.
        fin_bytes: u64,
        /// Chunks the FIN claims.
        fin_chunks: u64,
        /// Bytes that arrived.
        got_bytes: u64,
        /// Chunks that arrived.
        got_chunks: u64,
        /// The size the HELLO announced.
        size: u64,
    },
    /// A digest (in FIN, or given to `finish`) of another algorithm than
    /// the HELLO announced.
    #[error("digest algorithm {got} does not match the announced {expected}")]
    DigestAlgMismatch {
        /// The announced algorithm.
        expected: DigestAlg,
        /// The digest's algorithm.
        got: DigestAlg,
    },
    /// The sender's engine finished a file of known size before planning
    /// all its bytes.
    #[error("finish with {planned} of {size} bytes planned")]
    Incomplete {
        /// Bytes planned so far.
        planned: u64,
        /// The file's size.
        size: u64,
    },
    #[error(
        "FIN of a stream claims {fin_bytes} bytes in {fin_chunks} chunks, but {got_bytes} bytes in {got_chunks} chunks arrived"
    )]
    /// A stream's FIN disagrees with what arrived.
    StreamFinMismatch {
        /// Bytes the FIN claims.
        fin_bytes: u64,
        /// Chunks the FIN claims.
        fin_chunks: u64,
        /// Bytes that arrived.
        got_bytes: u64,
        /// Chunks that arrived.
        got_chunks: u64,
    },
    /// The receiver's engine answered an offer with the wrong kind of
    /// decision (accepting a directory as a file, or the reverse).
    #[error("{op} does not fit the current offer ({kind})")]
    OfferKind {
        /// The operation called.
        op: &'static str,
        /// What the offer is.
        kind: &'static str,
    },
    /// A frame that does not decode.
    #[error("malformed message: {0}")]
    Malformed(WireError),
    /// The sender's engine offered more entries than may await an answer.
    #[error("{pending} entries still await the receiver's answer (at most {max})")]
    TooManyPending {
        /// Entries awaiting an answer.
        pending: usize,
        /// The limit ([`MAX_PENDING`]).
        max: usize,
    },
    /// Relaying where the protocol does not allow it: a RELAY (or the
    /// engine's `relay` or `push_result`) without a token, after an offer,
    /// a second time, or in a session that relays nothing.
    #[error("relaying is not allowed here: {reason}")]
    RelayNotAllowed {
        /// Why not.
        reason: &'static str,
    },
    /// A list of hosts to relay to that RELAY cannot carry (empty, too
    /// many, a bad host), or more hosts than a session may relay to.
    #[error("invalid relay chain: {0}")]
    BadRelayChain(WireError),
    /// A RESULT the engine asked for that RESULT cannot carry (a bad
    /// host, too long a reason).
    #[error("invalid RESULT: {0}")]
    BadResult(WireError),
    /// More RESULTs for one offer than a chain has hosts.
    #[error("more than {max} RESULTs for one offer")]
    TooManyResults {
        /// The limit (`MAX_RELAY_HOPS` + 1: every host of the chain).
        max: usize,
    },
    /// The sender's engine closed the session while entries still awaited
    /// the receiver's answer.
    #[error("close with {pending} entries still awaiting the receiver's answer")]
    Unanswered {
        /// Entries awaiting an answer.
        pending: usize,
    },
}

/// Ring sanity shared by both sides: non-empty and addressable without u64 overflow.
pub(crate) fn check_ring(ring: &RingInfo) -> Result<(), ProtocolError> {
    if ring.slot_size == 0 {
        return Err(ProtocolError::BadRing {
            reason: "slot size is 0",
        });
    }
    if ring.slot_count == 0 {
        return Err(ProtocolError::BadRing {
            reason: "slot count is 0",
        });
    }
    if ring.addr.checked_add(ring.len_bytes()).is_none() {
        return Err(ProtocolError::BadRing {
            reason: "address + length overflows 64 bits",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    //! Drives a SenderSession and a ReceiverSession against each other through the
    //! codec, with a simulated ring that the sender writes as early as possible.
    //! Sessions mix files, streams and directories, and half of them pipeline
    //! (offer the next entry before the previous one is answered). Most
    //! sessions with a token relay: RELAY before the first offer, and every
    //! host's RESULT before each verdict, some while a stream's data comes;
    //! now and then the receiver waits for the hosts after it before a
    //! verdict, and its KEEPALIVE reaches the sender.

    use std::collections::VecDeque;

    use super::wire::tests::Rng;
    use super::*;

    const ADDR: u64 = 0x7000_0000;

    enum Wire {
        Msg(Vec<u8>),
        Chunk(ChunkPlan, u32),
    }

    /// Opens (once a channel is installed) and decodes.
    fn open(channel: &mut Option<Channel>, b: &[u8]) -> Message {
        match channel.as_mut() {
            Some(c) => decode(c.open(b).unwrap()).unwrap(),
            None => decode(b).unwrap(),
        }
    }

    fn crc(b: &[u8]) -> u32 {
        crc32fast::hash(b)
    }

    #[derive(Debug, Clone)]
    enum SimEntry {
        File(Vec<u8>),
        Stream(Vec<u8>),
        Dir,
    }

    impl SimEntry {
        fn data(&self) -> &[u8] {
            match self {
                SimEntry::File(d) | SimEntry::Stream(d) => d,
                SimEntry::Dir => &[],
            }
        }
    }

    struct Sim {
        rng: Rng,
        pipeline: bool,
        s: SenderSession,
        r: ReceiverSession,
        ring: RingInfo,
        mem: Vec<u8>,
        s2r: VecDeque<Wire>,
        r2s: VecDeque<Wire>,
        /// Chunks landed at the receiver, not yet consumed: (placement, sender's plan).
        landed: VecDeque<(ChunkPlacement, ChunkPlan)>,
        entries: Vec<SimEntry>,
        next_entry: usize,
        /// The entry the sender is sending data for.
        sending: Option<usize>,
        /// Entries offered, not yet seen by the receiver.
        offered: VecDeque<usize>,
        /// The entry the receiver is receiving.
        receiving: Option<usize>,
        /// Entries awaiting their verdict at the sender, in order.
        awaiting: VecDeque<usize>,
        out: Vec<u8>,
        delivered: Vec<usize>,
        rejected: usize,
        /// Files the receiver found unchanged, as each side saw them.
        unchanged: usize,
        unchanged_r: usize,
        dirs_done: usize,
        max_outstanding: u64,
        max_pending: usize,
        /// Each side's sealing channel once authenticated.
        s_channel: Option<Channel>,
        r_channel: Option<Channel>,
        sealed: usize,
        /// Chunks whose tag the receiver's placement checked.
        tagged: usize,
        /// Hosts after the receiver in this session's relay chain (0: it
        /// relays nothing), and the decisions about its RESULTs.
        relay_hops: usize,
        relay_rng: Rng,
        /// The hosts the receiver was told (RELAY).
        relay_heard: Vec<String>,
        /// RESULTs the receiver still owes the open offer.
        to_push: usize,
        /// RESULTs the sender heard for the oldest unanswered offer, and
        /// in all.
        results_seen: usize,
        results_total: usize,
        /// The receiver's clock (synthetic), and the KEEPALIVEs it sent
        /// while it waited for the hosts after it, and the sender heard.
        now: std::time::Instant,
        keepalives_sent: usize,
        keepalives_heard: usize,
    }

    fn chain(hops: usize) -> Vec<String> {
        (0..hops).map(|k| format!("hop{k}:7471")).collect()
    }

    impl Sim {
        /// The receiver's engine queues `n` more of the open offer's
        /// RESULTs (each host's, this receiver's first).
        fn push_results(&mut self, n: usize) {
            for _ in 0..n.min(self.to_push) {
                let host = self.relay_hops + 1 - self.to_push;
                let result =
                    HopResult::new(format!("host{host}"), HopVerdict::Ack(AckStatus::Ok), 0, "");
                self.r.push_result(result).unwrap();
                self.to_push -= 1;
            }
        }

        /// Now and then a relaying receiver waits for the hosts after it
        /// before its verdict: its KEEPALIVE is due after an interval.
        fn hop_waits(&mut self) {
            if self.relay_hops == 0 || self.relay_rng.below(3) != 0 {
                return;
            }
            self.r.work_started(self.now).unwrap();
            let due = self.r.poll_timeout().expect("a KEEPALIVE is due");
            self.now = due;
            self.r.handle_timeout(due).unwrap();
            self.keepalives_sent += 1;
        }

        /// A verdict reached the sender: every host's RESULT came first.
        fn verdict_heard(&mut self) {
            if self.relay_hops > 0 {
                assert_eq!(
                    self.results_seen,
                    self.relay_hops + 1,
                    "RESULTs before a verdict"
                );
            }
            self.results_seen = 0;
        }

        fn send_s(&mut self, m: &Message) {
            let mut b = encode_to_vec(m).unwrap();
            if let Some(c) = self.s_channel.as_mut() {
                b = c.seal(&b).unwrap();
                self.sealed += 1;
            }
            self.s2r.push_back(Wire::Msg(b));
        }

        fn send_r(&mut self, m: &Message) {
            let mut b = encode_to_vec(m).unwrap();
            if let Some(c) = self.r_channel.as_mut() {
                b = c.seal(&b).unwrap();
                self.sealed += 1;
            }
            self.r2s.push_back(Wire::Msg(b));
        }

        fn sender_start_next(&mut self) {
            let i = self.next_entry;
            let (kind, size) = match &self.entries[i] {
                SimEntry::File(d) => (OfferKind::File, d.len() as u64),
                SimEntry::Stream(_) => (OfferKind::Stream, 0),
                SimEntry::Dir => (OfferKind::Directory, 0),
            };
            let offer = FileOffer {
                name: format!("e/{i}"),
                size,
                mode: 0o640,
                // What a sender with a token must use (these sessions may
                // have one).
                digest: DigestAlg::Sha256,
                kind,
                // Some files have a copy at the receiver (see `Offer`).
                mtime: (i % 4 == 1).then_some(Mtime {
                    secs: i as i64,
                    nanos: 7,
                }),
                keep_mode: i % 2 == 1,
                // (Resuming is simulated in the machines' own tests.)
                resume: false,
                // Never asked here (as by a receiver without --link-dest):
                // such an offer goes on as any other; streams and
                // directories drop the flag.
                checksum: i.is_multiple_of(3) && i % 4 != 1,
                existing: Default::default(),
                piece: None,
            };
            // The tag is the entry's index (offset so that 0 means nothing).
            self.s.start_file(offer, 1000 + i as u64).unwrap();
            self.transmit_s();
            self.offered.push_back(i);
            if kind == OfferKind::Directory {
                self.awaiting.push_back(i);
            } else {
                self.sending = Some(i);
            }
            self.next_entry += 1;
            self.max_pending = self.max_pending.max(self.s.pending());
        }

        /// Sends what the sender queued.
        fn transmit_s(&mut self) {
            while let Some(m) = self.s.poll_transmit() {
                self.send_s(&m);
            }
        }

        /// Sends what the receiver queued.
        fn transmit_r(&mut self) {
            while let Some(m) = self.r.poll_transmit() {
                self.send_r(&m);
            }
        }

        fn step(&mut self) -> bool {
            let choice = self.rng.below(6);
            match choice {
                0 => self.deliver_to_receiver(),
                1 => self.deliver_to_sender(),
                2 => self.consume(),
                3 if self.rng.below(8) == 0 => {
                    self.r.flush_credits();
                    self.transmit_r();
                }
                3 => {}
                4 => self.sender_work(),
                _ => self.receiver_complete(),
            }
            !(self.r.state() == ReceiverState::Closed
                && self.s.state() == SenderState::Closed
                && self.s2r.is_empty()
                && self.r2s.is_empty())
        }

        fn sender_work(&mut self) {
            match self.s.state() {
                SenderState::Idle => {
                    let more = self.next_entry < self.entries.len();
                    let may = if self.pipeline {
                        self.s.can_start()
                    } else {
                        self.s.pending() == 0
                    };
                    if more && may {
                        self.sender_start_next();
                    } else if !more && self.s.pending() == 0 {
                        self.s.close().unwrap();
                        self.transmit_s();
                    }
                }
                SenderState::Sending => self.sender_data(),
                _ => {}
            }
        }

        fn sender_data(&mut self) {
            let i = self.sending.expect("sending an entry");
            let entry = self.entries[i].clone();
            let data = entry.data();
            let done = self.s.bytes_planned() as usize;
            // One next_chunk for files and streams: the reader's length.
            let plan = match entry {
                SimEntry::Stream(_) | SimEntry::File(_) if done < data.len() => {
                    let len = (data.len() - done).min(self.s.chunk_len() as usize) as u32;
                    self.s.next_chunk(len).unwrap()
                }
                _ => None,
            };
            if let Some(p) = plan {
                let start = p.file_offset as usize;
                let chunk = data[start..start + p.len as usize].to_vec();
                let off = (p.remote_addr - ADDR) as usize;
                // The write: the chunk, then (with a token) its tag.
                let mut write = chunk.clone();
                if let Some(auth) = self.s.chunk_auth() {
                    write.extend_from_slice(&auth.tag(p.file_offset, &chunk));
                }
                assert_eq!(write.len(), p.write_len as usize);
                assert!(
                    off + write.len() <= self.mem.len(),
                    "write outside the ring"
                );
                assert!(u64::from(p.write_len) <= u64::from(self.ring.slot_size));
                self.mem[off..off + write.len()].copy_from_slice(&write);
                self.s2r.push_back(Wire::Chunk(p, crc(&chunk)));
            } else if done == data.len()
                && (self.s.all_chunks_planned() || matches!(entry, SimEntry::Stream(_)))
            {
                let sum: [u8; 32] =
                    sha2::Digest::finalize(<sha2::Sha256 as sha2::Digest>::new_with_prefix(data))
                        .into();
                self.s.finish(Digest::Sha256(sum)).unwrap();
                self.transmit_s();
                self.awaiting.push_back(i);
                self.sending = None;
                self.max_pending = self.max_pending.max(self.s.pending());
            }
        }

        fn deliver_to_receiver(&mut self) {
            // The engine verifies and answers a FIN before it reads on.
            if self.r.state() == ReceiverState::Verifying {
                return;
            }
            let Some(w) = self.s2r.pop_front() else {
                return;
            };
            match w {
                Wire::Chunk(plan, imm) => {
                    let p = self.r.on_chunk(plan.write_len, imm).unwrap();
                    assert_eq!(p.seq, plan.seq);
                    assert_eq!(p.slot, plan.slot);
                    assert_eq!(p.slot_offset, plan.remote_addr - ADDR);
                    assert_eq!(p.file_offset, plan.file_offset);
                    assert_eq!(p.len, plan.len);
                    self.landed.push_back((p, plan));
                    let in_flight = self.landed.len() as u64;
                    self.max_outstanding = self.max_outstanding.max(in_flight);
                }
                Wire::Msg(b) => match self.r.on_message(open(&mut self.r_channel, &b)).unwrap() {
                    ReceiverEvent::From {
                        offset,
                        waiting: (),
                    } => panic!("FROM without HAVE: {offset}"),
                    ReceiverEvent::Compare { .. } => panic!("COMPARE without HAVE"),
                    ReceiverEvent::Batch(_) => panic!("a BATCH where none was offered"),
                    ReceiverEvent::Offer(h) => {
                        let i = self.offered.pop_front().expect("an offered entry");
                        assert_eq!(h.name, format!("e/{i}"));
                        let refuse = self.rng.below(5) == 0;
                        // A relaying receiver owes each host's RESULT: some
                        // now, all before a verdict (a stream's may wait
                        // for its data).
                        if self.relay_hops > 0 {
                            self.to_push = self.relay_hops + 1;
                            let now = self.relay_rng.below(self.to_push as u64 + 1) as usize;
                            self.push_results(now);
                            self.hop_waits();
                        }
                        if refuse || !h.is_stream() {
                            self.push_results(self.to_push);
                        }
                        match (&self.entries[i], refuse) {
                            (_, true) => self.r.reject(RejectCode::Exists, h.name).unwrap(),
                            (SimEntry::Dir, false) => {
                                assert!(h.is_directory());
                                self.r.accept_directory().unwrap()
                            }
                            (e, false) => {
                                assert_eq!(h.is_stream(), matches!(e, SimEntry::Stream(_)));
                                // A file with a time has the same copy at
                                // the receiver: it stays, nothing is sent.
                                let copy = match h.mtime {
                                    Some(m) if !h.is_stream() => Existing::File {
                                        size: h.size,
                                        secs: m.secs,
                                        nsec: i64::from(m.nanos),
                                    },
                                    _ => Existing::NoFile,
                                };
                                let standing = if h.is_stream() {
                                    Standing::Proceed
                                } else {
                                    self.r.existing(copy).unwrap()
                                };
                                if standing == Standing::Stays(AckStatus::Unchanged) {
                                    self.unchanged_r += 1;
                                } else {
                                    assert_eq!(standing, Standing::Proceed);
                                    self.out.clear();
                                    self.receiving = Some(i);
                                    self.r.accept(self.ring, ()).unwrap()
                                }
                            }
                        }
                        self.transmit_r();
                    }
                    ReceiverEvent::Fin(f, ()) => {
                        let i = self.receiving.expect("receiving");
                        assert_eq!(f.bytes, self.entries[i].data().len() as u64);
                    }
                    ReceiverEvent::Authenticated => {
                        // A session is free; AUTH_OK as it is, everything
                        // after it sealed.
                        let channel = self.r.admit().unwrap();
                        while let Some(m) = self.r.poll_transmit() {
                            assert!(matches!(m, Message::AuthOk { .. }));
                            self.send_r(&m);
                        }
                        self.r_channel = Some(channel);
                    }
                    ReceiverEvent::Relay(hops) => {
                        assert!(self.relay_hops > 0, "RELAY never sent: {hops:?}");
                        self.relay_heard.extend(hops);
                    }
                    ReceiverEvent::Closed | ReceiverEvent::Keepalive => {}
                },
            }
        }

        fn consume(&mut self) {
            let Some((p, _)) = self.landed.pop_front() else {
                return;
            };
            let off = p.slot_offset as usize;
            let bytes = &self.mem[off..off + p.len as usize];
            // A slot overwritten before consumption (credit bug) fails here.
            assert_eq!(crc(bytes), p.expected_crc, "slot {} clobbered", p.slot);
            // With a token the tag after the bytes is theirs, at this place.
            if let Some(auth) = &p.auth {
                let at = off + p.len as usize;
                let tag: [u8; auth::CHUNK_TAG_LEN] = self.mem[at..at + auth::CHUNK_TAG_LEN]
                    .try_into()
                    .expect("a tag's room");
                assert!(auth.verify(p.file_offset, bytes, &tag), "bad tag");
                self.tagged += 1;
            }
            assert_eq!(
                p.file_offset,
                self.out.len() as u64,
                "placements not contiguous"
            );
            self.out.extend_from_slice(bytes);
            if self.to_push > 0 && self.relay_rng.below(3) == 0 {
                self.push_results(1);
            }
            self.r.chunk_done();
            self.transmit_r();
        }

        fn receiver_complete(&mut self) {
            if self.r.state() != ReceiverState::Verifying || !self.landed.is_empty() {
                return;
            }
            let i = self.receiving.take().expect("receiving");
            assert_eq!(
                self.out,
                self.entries[i].data(),
                "placements must cover [0,size)"
            );
            self.delivered.push(i);
            self.hop_waits();
            self.push_results(self.to_push);
            self.r.complete(AckStatus::Ok, String::new()).unwrap();
            self.transmit_r();
        }

        fn deliver_to_sender(&mut self) {
            let Some(Wire::Msg(b)) = self.r2s.pop_front() else {
                return;
            };
            match self.s.on_message(open(&mut self.s_channel, &b)).unwrap() {
                SenderEvent::Greeted(_) => self.transmit_s(),
                SenderEvent::Authenticated(channel) => {
                    self.s_channel = Some(channel);
                    // The chain goes before any offer.
                    if self.relay_hops > 0 {
                        self.s.relay(&chain(self.relay_hops)).unwrap();
                        self.transmit_s();
                    }
                }
                SenderEvent::HopResult(r) => {
                    self.results_seen += 1;
                    self.results_total += 1;
                    assert!(self.results_seen <= self.relay_hops + 1, "{r:?}");
                    assert_eq!(r.host, format!("host{}", self.results_seen - 1));
                }
                SenderEvent::Ring(r) => {
                    assert_eq!(r, self.ring);
                    assert!(self.awaiting.is_empty(), "MR before earlier verdicts");
                }
                SenderEvent::Credit(_) => {}
                SenderEvent::Have(h) => panic!("HAVE without RESUME: {h:?}"),
                // (Never for a resumed prefix: none is offered here.)
                SenderEvent::Keepalive => {
                    assert!(
                        self.relay_hops > 0,
                        "KEEPALIVE from a receiver that waits for nothing"
                    );
                    self.keepalives_heard += 1;
                }
                SenderEvent::Same { ack, .. } => panic!("ACK of a COMPARE never sent: {ack:?}"),
                SenderEvent::Settled(a) => {
                    self.verdict_heard();
                    assert_eq!(a.status, AckStatus::Unchanged);
                    assert!(self.awaiting.is_empty(), "ACK before earlier verdicts");
                    let i = self.sending.take().expect("an unchanged offer");
                    assert_eq!(i % 4, 1, "only a file with a copy is unchanged");
                    self.unchanged += 1;
                }
                SenderEvent::Rejected(_) => {
                    self.verdict_heard();
                    assert!(self.awaiting.is_empty(), "REJECT before earlier verdicts");
                    self.sending.take().expect("a rejected offer");
                    self.rejected += 1;
                }
                SenderEvent::Answered {
                    payload: tag,
                    entry,
                    verdict,
                } => {
                    self.verdict_heard();
                    let i = self.awaiting.pop_front().expect("a pending entry");
                    assert_eq!(tag, 1000 + i as u64, "the verdict names its entry");
                    let dir = matches!(self.entries[i], SimEntry::Dir);
                    assert_eq!(entry == Pending::Directory, dir, "verdict order");
                    match verdict {
                        Verdict::Ack(a) => {
                            assert_eq!(a.status, AckStatus::Ok);
                            if dir {
                                self.dirs_done += 1;
                            } else {
                                assert!(self.delivered.contains(&i));
                            }
                        }
                        Verdict::Reject(_) => {
                            assert!(dir);
                            self.rejected += 1;
                        }
                    }
                }
                SenderEvent::Aborted(a) => panic!("aborted: {a:?}"),
            }
        }
    }

    #[test]
    fn simulated_sessions_deliver_every_byte() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut total_entries = 0;
        let mut total_rejected = 0;
        let mut total_unchanged = 0;
        let mut deepest = 0;
        let mut streams = 0;
        let mut tagged = 0;
        let mut results = 0;
        let mut keepalives = 0;
        for round in 0..400 {
            let slot_size = 1 + rng.below(200) as u32;
            let slot_count = 1 + rng.below(8) as u32;
            let chunk_size = rng.below(250) as u32;
            let credit_batch = rng.below(10) as u32;
            let nentries = rng.below(if round % 4 == 0 { 20 } else { 5 }) as usize;
            let entries: Vec<SimEntry> = (0..nentries)
                .map(|_| {
                    let size = match rng.below(4) {
                        0 => rng.below(3),
                        1 => u64::from(slot_size) * (1 + rng.below(4)) + rng.below(3) - 1,
                        _ => rng.below(5000),
                    };
                    let data: Vec<u8> = (0..size).map(|_| rng.next() as u8).collect();
                    match rng.below(5) {
                        0 | 1 => SimEntry::Dir,
                        2 => SimEntry::Stream(data),
                        _ => SimEntry::File(data),
                    }
                })
                .collect();
            streams += entries
                .iter()
                .filter(|e| matches!(e, SimEntry::Stream(_)))
                .count();
            // Half of the sessions authenticate (and seal everything after,
            // and tag every chunk: a slot holds a chunk and its tag).
            let authenticated = rng.below(2) == 0;
            let slot_size = if authenticated {
                slot_size + auth::CHUNK_TAG_LEN as u32
            } else {
                slot_size
            };
            let ring = RingInfo {
                addr: ADDR,
                rkey: round,
                slot_size,
                slot_count,
            };
            let rcfg = ReceiverConfig {
                slot_size,
                slot_count,
                credit_batch,
                max_size: u64::MAX,
                max_files: DEFAULT_MAX_FILES,
                max_session_bytes: u64::MAX,
                names: NameRules::DEFAULT,
                digest_budget: DigestBudget::DEFAULT,
                timeout: std::time::Duration::from_secs(30),
                relay_allowed: true,
            };
            let token = Token::new(b"sim".to_vec()).unwrap();
            let conn = ConnectionId {
                receiver_addr: "10.0.0.1".parse().unwrap(),
                receiver_qpn: round,
                sender_addr: "10.0.0.2".parse().unwrap(),
                sender_qpn: round + 1,
            };
            let (s, r) = match authenticated {
                true => (
                    SenderSession::new(
                        chunk_size,
                        Some(SenderAuth {
                            token: token.clone(),
                            nonce: [!(round as u8); NONCE_LEN],
                            conn,
                        }),
                    ),
                    ReceiverSession::with_auth(rcfg, token, [round as u8; NONCE_LEN], conn),
                ),
                false => (
                    SenderSession::new(chunk_size, None),
                    ReceiverSession::new(rcfg),
                ),
            };
            let mut sim = Sim {
                rng: Rng(rng.next() | 1),
                pipeline: round % 2 == 0,
                s,
                r,
                ring,
                mem: vec![0; ring.len_bytes() as usize],
                s2r: VecDeque::new(),
                r2s: VecDeque::new(),
                landed: VecDeque::new(),
                entries: entries.clone(),
                next_entry: 0,
                sending: None,
                offered: VecDeque::new(),
                receiving: None,
                awaiting: VecDeque::new(),
                out: Vec::new(),
                delivered: Vec::new(),
                rejected: 0,
                unchanged: 0,
                unchanged_r: 0,
                dirs_done: 0,
                max_outstanding: 0,
                max_pending: 0,
                s_channel: None,
                r_channel: None,
                sealed: 0,
                tagged: 0,
                // Sessions with a token relay to 0 to 3 hosts.
                relay_hops: if authenticated { round as usize % 4 } else { 0 },
                relay_rng: Rng(u64::from(round) * 7919 + 1),
                relay_heard: Vec::new(),
                to_push: 0,
                results_seen: 0,
                results_total: 0,
                now: std::time::Instant::now(),
                keepalives_sent: 0,
                keepalives_heard: 0,
            };
            let greeting = sim.r.poll_transmit().expect("the CHALLENGE comes first");
            assert!(matches!(greeting, Message::Challenge(_)));
            assert_eq!(sim.r.poll_transmit(), None);
            sim.send_r(&greeting);
            let mut steps = 0u64;
            while sim.step() {
                steps += 1;
                assert!(steps < 2_000_000, "round {round} stalled (deadlock?)");
            }
            assert_eq!(
                sim.delivered.len() + sim.dirs_done + sim.rejected + sim.unchanged,
                entries.len()
            );
            assert!(sim.awaiting.is_empty() && sim.offered.is_empty());
            assert_eq!(
                sim.unchanged, sim.unchanged_r,
                "each side saw every unchanged file"
            );
            total_unchanged += sim.unchanged;
            assert!(sim.max_outstanding <= u64::from(slot_count));
            assert!(sim.max_pending <= MAX_PENDING);
            if !sim.pipeline {
                assert!(sim.max_pending <= 1);
            }
            deepest = deepest.max(sim.max_pending);
            total_entries += entries.len();
            total_rejected += sim.rejected;
            tagged += sim.tagged;
            if !authenticated {
                assert_eq!(sim.tagged, 0);
            }
            assert_eq!(sim.relay_heard, chain(sim.relay_hops));
            assert_eq!(sim.s.is_relaying(), sim.relay_hops > 0);
            assert_eq!(sim.to_push, 0);
            assert_eq!(sim.keepalives_heard, sim.keepalives_sent);
            results += sim.results_total;
            keepalives += sim.keepalives_heard;
        }
        assert!(results > 1000, "{results} RESULTs heard");
        assert!(keepalives > 100, "{keepalives} KEEPALIVEs heard");
        assert!(total_entries > 1000 && total_rejected > 50 && total_rejected < total_entries / 2);
        assert!(deepest >= 4, "pipelining barely exercised: depth {deepest}");
        assert!(total_unchanged > 50, "unchanged files: {total_unchanged}");
        assert!(streams > 100);
        assert!(tagged > 1000, "{tagged} tagged chunks");
    }
}
