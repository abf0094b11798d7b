//! rdma-xfer control protocol v1: wire codec, name checks and the pure sender /
//! receiver session state machines. No I/O happens here; the engine drives it.

pub mod auth;
pub mod names;
pub mod receiver;
pub mod sender;
pub mod wire;

pub use auth::{AUTH_REQUIRED, NONCE_LEN, Token};
pub use names::{MAX_NAME_BYTES, NameError, validate_name};
pub use receiver::{
    AuthFailure, ChunkPlacement, ReceiverConfig, ReceiverEvent, ReceiverSession, ReceiverState,
    RecvError,
};
pub use sender::{ChunkPlan, FileOffer, Greeting, SenderEvent, SenderSession, SenderState};
pub use wire::{
    Ack, AckStatus, CAP_NONE, Challenge, Digest, DigestAlg, Fin, Hello, MAX_MESSAGE, Message,
    Reject, RejectCode, RingInfo, WireError, decode, encode, encode_to_vec,
};

use thiserror::Error;

/// Session protocol version carried in HELLO.
pub const PROTOCOL_VERSION: u16 = 1;

/// A violation of the session protocol (by the peer, or by the local caller for
/// `WrongState`). Errors caused by a peer message end the session: the state
/// machine moves to `Closed`.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("unexpected {msg} in state {state}")]
    Unexpected {
        msg: &'static str,
        state: &'static str,
    },
    #[error("{op} is not allowed in state {state}")]
    WrongState {
        op: &'static str,
        state: &'static str,
    },
    #[error("peer aborted the session ({code}): {reason}")]
    PeerRejected { code: RejectCode, reason: String },
    /// The receiver refused the session in its greeting (e.g. Busy).
    #[error("the receiver refused the session ({code}): {reason}")]
    Refused { code: RejectCode, reason: String },
    /// REJECT(Auth): the receiver did not accept our AUTH (`reason` is its text).
    #[error("authentication failed (the receiver says: {reason})")]
    AuthFailed { reason: String },
    #[error("invalid ring: {reason}")]
    BadRing { reason: &'static str },
    #[error("CREDIT of 0 is invalid")]
    ZeroCredit,
    #[error("CREDIT of {added} with {credits} credits held exceeds the ring's {slot_count} slots")]
    CreditOverflow {
        added: u32,
        credits: u32,
        slot_count: u32,
    },
    #[error("sender wrote more than {slot_count} chunks without credit")]
    CreditOverrun { slot_count: u32 },
    #[error("chunk {seq} ({len} bytes): {reason}")]
    BadChunk {
        seq: u64,
        len: u32,
        reason: &'static str,
    },
    #[error(
        "FIN claims {fin_bytes} bytes in {fin_chunks} chunks, but {got_bytes} bytes in {got_chunks} chunks arrived (announced size {size})"
    )]
    FinMismatch {
        fin_bytes: u64,
        fin_chunks: u64,
        got_bytes: u64,
        got_chunks: u64,
        size: u64,
    },
    #[error("digest algorithm {got} does not match the announced {expected}")]
    DigestAlgMismatch { expected: DigestAlg, got: DigestAlg },
    #[error("finish with {planned} of {size} bytes planned")]
    Incomplete { planned: u64, size: u64 },
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

    use std::collections::VecDeque;

    use super::wire::tests::Rng;
    use super::*;

    const ADDR: u64 = 0x7000_0000;

    enum Wire {
        Msg(Vec<u8>),
        Chunk(ChunkPlan, u32),
    }

    fn send(q: &mut VecDeque<Wire>, m: &Message) {
        q.push_back(Wire::Msg(encode_to_vec(m).unwrap()));
    }

    fn crc(b: &[u8]) -> u32 {
        crc32fast::hash(b)
    }

    struct Sim {
        rng: Rng,
        s: SenderSession,
        r: ReceiverSession,
        ring: RingInfo,
        mem: Vec<u8>,
        s2r: VecDeque<Wire>,
        r2s: VecDeque<Wire>,
        /// Chunks landed at the receiver, not yet consumed: (placement, sender's plan).
        landed: VecDeque<(ChunkPlacement, ChunkPlan)>,
        files: Vec<Vec<u8>>,
        next_file: usize,
        out: Vec<u8>,
        delivered: Vec<Vec<u8>>,
        rejected: usize,
        max_outstanding: u64,
    }

    impl Sim {
        fn sender_next_file(&mut self) {
            if let Some(data) = self.files.get(self.next_file) {
                let offer = FileOffer {
                    name: format!("file-{}", self.next_file),
                    size: data.len() as u64,
                    mode: 0o640,
                    digest: DigestAlg::Crc32,
                };
                let m = self.s.start_file(offer).unwrap();
                send(&mut self.s2r, &m);
            } else {
                let m = self.s.close().unwrap();
                send(&mut self.s2r, &m);
            }
        }

        fn current(&self) -> &[u8] {
            self.files.get(self.next_file).map_or(&[], |v| v)
        }

        fn step(&mut self) -> bool {
            let choice = self.rng.below(6);
            match choice {
                0 => self.deliver_to_receiver(),
                1 => self.deliver_to_sender(),
                2 => self.consume(),
                3 if self.rng.below(8) == 0 => {
                    if let Some(m) = self.r.flush_credits() {
                        send(&mut self.r2s, &m);
                    }
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
            if self.s.state() != SenderState::Sending {
                return;
            }
            if let Some(p) = self.s.next_chunk() {
                let data = self.current();
                let start = p.file_offset as usize;
                let chunk = data[start..start + p.len as usize].to_vec();
                let off = (p.remote_addr - ADDR) as usize;
                assert!(
                    off + chunk.len() <= self.mem.len(),
                    "write outside the ring"
                );
                assert!(u64::from(p.len) <= u64::from(self.ring.slot_size));
                self.mem[off..off + chunk.len()].copy_from_slice(&chunk);
                self.s2r.push_back(Wire::Chunk(p, crc(&chunk)));
            } else if self.s.all_chunks_planned() {
                let m = self.s.finish(Digest::Crc32(crc(self.current()))).unwrap();
                send(&mut self.s2r, &m);
            }
        }

        fn deliver_to_receiver(&mut self) {
            let Some(w) = self.s2r.pop_front() else {
                return;
            };
            match w {
                Wire::Chunk(plan, imm) => {
                    let p = self.r.on_chunk(plan.len, imm).unwrap();
                    assert_eq!(p.seq, plan.seq);
                    assert_eq!(p.slot, plan.slot);
                    assert_eq!(p.slot_offset, plan.remote_addr - ADDR);
                    assert_eq!(p.file_offset, plan.file_offset);
                    assert_eq!(p.len, plan.len);
                    self.landed.push_back((p, plan));
                    let in_flight = self.landed.len() as u64;
                    self.max_outstanding = self.max_outstanding.max(in_flight);
                }
                Wire::Msg(b) => match self.r.on_message(decode(&b).unwrap()).unwrap() {
                    ReceiverEvent::Offer(h) => {
                        // The engine sometimes refuses; otherwise it accepts.
                        let m = if self.rng.below(5) == 0 {
                            self.r.reject(RejectCode::Exists, h.name).unwrap()
                        } else {
                            self.out.clear();
                            self.r.accept(self.ring).unwrap()
                        };
                        send(&mut self.r2s, &m);
                    }
                    ReceiverEvent::Fin(f) => {
                        assert_eq!(f.bytes, self.current().len() as u64);
                    }
                    ReceiverEvent::Closed
                    | ReceiverEvent::Authenticated
                    | ReceiverEvent::AuthIgnored => {}
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
            assert_eq!(
                p.file_offset,
                self.out.len() as u64,
                "placements not contiguous"
            );
            self.out.extend_from_slice(bytes);
            if let Some(m) = self.r.chunk_done() {
                send(&mut self.r2s, &m);
            }
        }

        fn receiver_complete(&mut self) {
            if self.r.state() != ReceiverState::Verifying || !self.landed.is_empty() {
                return;
            }
            assert_eq!(self.out, self.current(), "placements must cover [0,size)");
            self.delivered.push(self.out.clone());
            let m = self.r.complete(AckStatus::Ok, String::new()).unwrap();
            send(&mut self.r2s, &m);
        }

        fn deliver_to_sender(&mut self) {
            let Some(Wire::Msg(b)) = self.r2s.pop_front() else {
                return;
            };
            match self.s.on_message(decode(&b).unwrap()).unwrap() {
                SenderEvent::Greeted(g) => {
                    // AUTH and the first HELLO go out back to back.
                    if let Some(auth) = g.auth {
                        send(&mut self.s2r, &auth);
                    }
                    self.sender_next_file();
                }
                SenderEvent::Ring(r) => assert_eq!(r, self.ring),
                SenderEvent::Credit(_) => {}
                SenderEvent::Rejected(_) => {
                    self.rejected += 1;
                    self.next_file += 1;
                    self.sender_next_file();
                }
                SenderEvent::Acked(a) => {
                    assert_eq!(a.status, AckStatus::Ok);
                    self.next_file += 1;
                    self.sender_next_file();
                }
            }
        }
    }

    #[test]
    fn simulated_sessions_deliver_every_byte() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let mut total_files = 0;
        let mut total_rejected = 0;
        for round in 0..300 {
            let slot_size = 1 + rng.below(200) as u32;
            let slot_count = 1 + rng.below(8) as u32;
            let chunk_size = rng.below(250) as u32;
            let credit_batch = rng.below(10) as u32;
            let nfiles = rng.below(4) as usize;
            let files: Vec<Vec<u8>> = (0..nfiles)
                .map(|_| {
                    let size = match rng.below(4) {
                        0 => rng.below(3),
                        1 => u64::from(slot_size) * (1 + rng.below(4)) + rng.below(3) - 1,
                        _ => rng.below(5000),
                    };
                    (0..size).map(|_| rng.next() as u8).collect()
                })
                .collect();
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
            };
            // A third of the sessions authenticate; a sender token the receiver
            // does not ask for is merely unused.
            let token = Token::new(b"sim".to_vec());
            let (s, r) = match rng.below(3) {
                0 => (
                    SenderSession::new(chunk_size, token.clone()),
                    ReceiverSession::with_auth(rcfg, token.unwrap(), [round as u8; NONCE_LEN]),
                ),
                1 => (
                    SenderSession::new(chunk_size, token),
                    ReceiverSession::new(rcfg),
                ),
                _ => (
                    SenderSession::new(chunk_size, None),
                    ReceiverSession::new(rcfg),
                ),
            };
            let mut sim = Sim {
                rng: Rng(rng.next() | 1),
                s,
                r,
                ring,
                mem: vec![0; ring.len_bytes() as usize],
                s2r: VecDeque::new(),
                r2s: VecDeque::new(),
                landed: VecDeque::new(),
                files: files.clone(),
                next_file: 0,
                out: Vec::new(),
                delivered: Vec::new(),
                rejected: 0,
                max_outstanding: 0,
            };
            let greeting = sim.r.challenge();
            send(&mut sim.r2s, &greeting);
            let mut steps = 0u64;
            while sim.step() {
                steps += 1;
                assert!(steps < 2_000_000, "round {round} stalled (deadlock?)");
            }
            assert_eq!(sim.delivered.len() + sim.rejected, files.len());
            assert!(sim.max_outstanding <= u64::from(slot_count));
            total_files += files.len();
            total_rejected += sim.rejected;
        }
        assert!(total_files > 300 && total_rejected > 20 && total_rejected < total_files / 2);
    }
}
