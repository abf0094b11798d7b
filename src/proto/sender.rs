//! Sender side of a session: the receiver's greeting (CHALLENGE, answered
//! with AUTH when it requires authentication, or a REJECT that refuses the
//! session), then several files in order, each
//! HELLO -> (MR | REJECT) -> chunks under credit -> FIN -> ACK, then BYE.

use super::auth::Token;
use super::wire::{
    Ack, AckStatus, CAP_NONE, Digest, DigestAlg, Fin, Hello, Message, Reject, RejectCode, RingInfo,
};
use super::{PROTOCOL_VERSION, ProtocolError, check_ring};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenderState {
    /// Connected, waiting for the receiver's CHALLENGE (or a REJECT).
    AwaitChallenge,
    /// Between files: may offer a file or close.
    Idle,
    /// HELLO sent, waiting for MR or REJECT.
    AwaitRing,
    /// Writing chunks under credit.
    Sending,
    /// FIN sent, waiting for ACK.
    AwaitAck,
    Closed,
}

impl SenderState {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AwaitChallenge => "AWAIT_CHALLENGE",
            Self::Idle => "IDLE",
            Self::AwaitRing => "AWAIT_RING",
            Self::Sending => "SENDING",
            Self::AwaitAck => "AWAIT_ACK",
            Self::Closed => "CLOSED",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOffer {
    pub name: String,
    pub size: u64,
    pub mode: u32,
    pub digest: DigestAlg,
}

/// Where the engine must RDMA-WRITE (with imm = CRC32 of the chunk) the next chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    pub seq: u64,
    pub slot: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    pub file_offset: u64,
    pub len: u32,
}

/// What the receiver's CHALLENGE asks of the engine before the first HELLO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// The AUTH to send first (the receiver requires authentication). The
    /// first HELLO may follow at once: the receiver handles them in order.
    /// Its MAC is empty when this sender has no token, and the receiver
    /// will then refuse with REJECT(Auth).
    pub auth: Option<Message>,
    /// This sender has a token the receiver did not ask for (worth a warning:
    /// the receiver accepts anyone).
    pub token_unused: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderEvent {
    /// The receiver's CHALLENGE arrived: now Idle, ready for `start_file`
    /// once `Greeting::auth` (if any) is sent.
    Greeted(Greeting),
    /// MR accepted: start sending (see `next_chunk`).
    Ring(RingInfo),
    /// Offer refused; back to Idle, the session may continue with another file.
    Rejected(Reject),
    /// Credits added.
    Credit(u32),
    /// Final answer for the file. After FIN: back to Idle. Before FIN (only a
    /// non-OK status is legal then): the receiver aborted and the session is Closed.
    Acked(Ack),
}

#[derive(Debug, Clone)]
pub struct SenderSession {
    state: SenderState,
    token: Option<Token>,
    chunk_size: u32,
    size: u64,
    digest: DigestAlg,
    ring: RingInfo,
    chunk_len: u32,
    credits: u32,
    seq: u64,
    planned: u64,
}

impl SenderSession {
    /// `chunk_size` is the sender's staging buffer size; 0 means "use the
    /// ring's slot size". `token` answers the receiver's CHALLENGE.
    pub fn new(chunk_size: u32, token: Option<Token>) -> Self {
        Self {
            state: SenderState::AwaitChallenge,
            token,
            chunk_size,
            size: 0,
            digest: DigestAlg::Crc32,
            ring: RingInfo::default(),
            chunk_len: 0,
            credits: 0,
            seq: 0,
            planned: 0,
        }
    }

    pub fn state(&self) -> SenderState {
        self.state
    }

    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Ring of the current file (meaningful from `Sending` on).
    pub fn ring(&self) -> RingInfo {
        self.ring
    }

    /// Length of every chunk but the last: min(chunk_size, slot_size).
    pub fn chunk_len(&self) -> u32 {
        self.chunk_len
    }

    pub fn bytes_planned(&self) -> u64 {
        self.planned
    }

    pub fn chunks_planned(&self) -> u64 {
        self.seq
    }

    fn wrong_state(&self, op: &'static str) -> ProtocolError {
        ProtocolError::WrongState {
            op,
            state: self.state.as_str(),
        }
    }

    /// Idle -> AwaitRing; returns the HELLO to send. The name is not checked
    /// here: the receiver is the authority and answers a bad one with REJECT.
    pub fn start_file(&mut self, offer: FileOffer) -> Result<Message, ProtocolError> {
        if self.state != SenderState::Idle {
            return Err(self.wrong_state("start_file"));
        }
        self.size = offer.size;
        self.digest = offer.digest;
        self.ring = RingInfo::default();
        self.chunk_len = 0;
        self.credits = 0;
        self.seq = 0;
        self.planned = 0;
        self.state = SenderState::AwaitRing;
        Ok(Message::Hello(Hello {
            version: PROTOCOL_VERSION,
            caps: CAP_NONE,
            name: offer.name,
            size: offer.size,
            mode: offer.mode,
            digest: offer.digest,
        }))
    }

    /// Applies a message from the receiver. Any error closes the session.
    pub fn on_message(&mut self, msg: Message) -> Result<SenderEvent, ProtocolError> {
        let result = self.dispatch(msg);
        if result.is_err() {
            self.state = SenderState::Closed;
        }
        result
    }

    fn dispatch(&mut self, msg: Message) -> Result<SenderEvent, ProtocolError> {
        use SenderState::*;
        match (self.state, msg) {
            (Closed, m) => Err(self.unexpected(&m)),
            // Authentication refused: whenever it comes, the session is over.
            (_, Message::Reject(r)) if r.code == RejectCode::Auth => {
                Err(ProtocolError::AuthFailed { reason: r.reason })
            }
            (AwaitChallenge, Message::Challenge(c)) => {
                let greeting = if c.auth_required() {
                    let mac = self
                        .token
                        .as_ref()
                        .map_or_else(Vec::new, |t| t.mac(&c.nonce).to_vec());
                    Greeting {
                        auth: Some(Message::Auth { mac }),
                        token_unused: false,
                    }
                } else {
                    Greeting {
                        auth: None,
                        token_unused: self.token.is_some(),
                    }
                };
                self.state = Idle;
                Ok(SenderEvent::Greeted(greeting))
            }
            // Greeted with a REJECT (e.g. Busy): refused before anything began.
            (AwaitChallenge, Message::Reject(r)) => Err(ProtocolError::Refused {
                code: r.code,
                reason: r.reason,
            }),
            (AwaitRing, Message::Mr(ring)) => {
                check_ring(&ring)?;
                self.ring = ring;
                self.chunk_len = match self.chunk_size {
                    0 => ring.slot_size,
                    c => c.min(ring.slot_size),
                };
                // The ring is empty at a file boundary, so every slot is available.
                self.credits = ring.slot_count;
                self.state = Sending;
                Ok(SenderEvent::Ring(ring))
            }
            (AwaitRing, Message::Reject(r)) => {
                self.state = Idle;
                Ok(SenderEvent::Rejected(r))
            }
            // A REJECT at any other point is the receiver giving up on the session.
            (_, Message::Reject(r)) => Err(ProtocolError::PeerRejected {
                code: r.code,
                reason: r.reason,
            }),
            (Sending | AwaitAck, Message::Credit { count }) => {
                if count == 0 {
                    return Err(ProtocolError::ZeroCredit);
                }
                let slot_count = self.ring.slot_count;
                match self.credits.checked_add(count) {
                    Some(total) if total <= slot_count => {
                        self.credits = total;
                        Ok(SenderEvent::Credit(count))
                    }
                    _ => Err(ProtocolError::CreditOverflow {
                        added: count,
                        credits: self.credits,
                        slot_count,
                    }),
                }
            }
            (AwaitAck, Message::Ack(a)) => {
                self.state = Idle;
                Ok(SenderEvent::Acked(a))
            }
            (AwaitRing | Sending, Message::Ack(a)) if a.status != AckStatus::Ok => {
                self.state = Closed;
                Ok(SenderEvent::Acked(a))
            }
            (_, m) => Err(self.unexpected(&m)),
        }
    }

    fn unexpected(&self, m: &Message) -> ProtocolError {
        ProtocolError::Unexpected {
            msg: m.kind(),
            state: self.state.as_str(),
        }
    }

    /// Plans the next chunk, consuming one credit. None when not Sending, out of
    /// credit, or every byte is planned.
    pub fn next_chunk(&mut self) -> Option<ChunkPlan> {
        if self.state != SenderState::Sending || self.credits == 0 || self.planned >= self.size {
            return None;
        }
        let remaining = self.size - self.planned;
        let len = u32::try_from(remaining.min(u64::from(self.chunk_len))).ok()?;
        if len == 0 {
            return None;
        }
        let slot = u32::try_from(self.seq % u64::from(self.ring.slot_count)).ok()?;
        // Cannot overflow: check_ring verified addr + slot_size * slot_count.
        let remote_addr = self
            .ring
            .addr
            .checked_add(u64::from(slot) * u64::from(self.ring.slot_size))?;
        let plan = ChunkPlan {
            seq: self.seq,
            slot,
            remote_addr,
            rkey: self.ring.rkey,
            file_offset: self.planned,
            len,
        };
        self.seq += 1;
        self.planned += u64::from(len);
        self.credits -= 1;
        Some(plan)
    }

    pub fn all_chunks_planned(&self) -> bool {
        matches!(self.state, SenderState::Sending | SenderState::AwaitAck)
            && self.planned == self.size
    }

    /// Sending with every byte planned -> AwaitAck; returns the FIN.
    pub fn finish(&mut self, digest: Digest) -> Result<Message, ProtocolError> {
        if self.state != SenderState::Sending {
            return Err(self.wrong_state("finish"));
        }
        if self.planned != self.size {
            return Err(ProtocolError::Incomplete {
                planned: self.planned,
                size: self.size,
            });
        }
        if digest.alg() != self.digest {
            return Err(ProtocolError::DigestAlgMismatch {
                expected: self.digest,
                got: digest.alg(),
            });
        }
        self.state = SenderState::AwaitAck;
        Ok(Message::Fin(Fin {
            bytes: self.size,
            chunks: self.seq,
            digest,
        }))
    }

    /// Idle -> Closed; returns the BYE.
    pub fn close(&mut self) -> Result<Message, ProtocolError> {
        if self.state != SenderState::Idle {
            return Err(self.wrong_state("close"));
        }
        self.state = SenderState::Closed;
        Ok(Message::Bye)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::auth::{AUTH_REQUIRED, NONCE_LEN};
    use crate::proto::wire::Challenge;

    const ADDR: u64 = 0x1000_0000;
    const NONCE: [u8; NONCE_LEN] = [0x5a; NONCE_LEN];

    fn challenge(flags: u16) -> Message {
        Message::Challenge(Challenge {
            flags,
            nonce: NONCE,
        })
    }

    fn token() -> Token {
        Token::new(b"s3cret".to_vec()).unwrap()
    }

    /// A session past the receiver's greeting (no authentication asked).
    fn greeted(chunk_size: u32) -> SenderSession {
        let mut s = SenderSession::new(chunk_size, None);
        s.on_message(challenge(0)).unwrap();
        s
    }

    fn offer(size: u64) -> FileOffer {
        FileOffer {
            name: "f.bin".into(),
            size,
            mode: 0o600,
            digest: DigestAlg::Crc32,
        }
    }

    fn ring(slot_size: u32, slot_count: u32) -> RingInfo {
        RingInfo {
            addr: ADDR,
            rkey: 77,
            slot_size,
            slot_count,
        }
    }

    fn ack(status: AckStatus) -> Message {
        Message::Ack(Ack::new(status, "r"))
    }

    fn fin() -> Message {
        Message::Fin(Fin {
            bytes: 0,
            chunks: 0,
            digest: Digest::Crc32(0),
        })
    }

    /// A session in `state`, with a 4x100 ring, 1000-byte file, one chunk planned.
    fn session_in(state: SenderState) -> SenderSession {
        if state == SenderState::AwaitChallenge {
            return SenderSession::new(100, Some(token()));
        }
        let mut s = greeted(100);
        if state == SenderState::Idle {
            return s;
        }
        if state == SenderState::Closed {
            s.close().unwrap();
            return s;
        }
        let size = if state == SenderState::AwaitAck {
            100
        } else {
            1000
        };
        s.start_file(offer(size)).unwrap();
        if state == SenderState::AwaitRing {
            return s;
        }
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        s.next_chunk().unwrap();
        if state == SenderState::AwaitAck {
            s.finish(Digest::Crc32(1)).unwrap();
        }
        assert_eq!(s.state(), state);
        s
    }

    fn all_messages() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                version: 1,
                caps: 0,
                name: "x".into(),
                size: 1,
                mode: 0,
                digest: DigestAlg::Crc32,
            }),
            Message::Mr(ring(100, 4)),
            Message::Reject(Reject::new(RejectCode::Exists, "exists")),
            Message::Credit { count: 1 },
            fin(),
            ack(AckStatus::Ok),
            ack(AckStatus::Io),
            Message::Bye,
            challenge(0),
            challenge(AUTH_REQUIRED),
            Message::Auth { mac: Vec::new() },
            Message::Auth {
                mac: token().mac(&NONCE).to_vec(),
            },
            Message::Reject(Reject::new(RejectCode::Busy, "busy")),
            Message::Reject(Reject::new(
                RejectCode::Auth,
                "authentication failed: wrong token",
            )),
        ]
    }

    const STATES: [SenderState; 6] = [
        SenderState::AwaitChallenge,
        SenderState::Idle,
        SenderState::AwaitRing,
        SenderState::Sending,
        SenderState::AwaitAck,
        SenderState::Closed,
    ];

    #[test]
    fn every_state_message_pair() {
        use SenderState::*;
        for state in STATES {
            for msg in all_messages() {
                let mut s = session_in(state);
                let res = s.on_message(msg.clone());
                let failed_ack = matches!(&msg, Message::Ack(a) if a.status != AckStatus::Ok);
                let auth_reject = matches!(&msg, Message::Reject(r) if r.code == RejectCode::Auth);
                let expect_state = match (state, &msg) {
                    (AwaitChallenge, Message::Challenge(_)) => Some(Idle),
                    (AwaitRing, Message::Reject(_)) if !auth_reject => Some(Idle),
                    (AwaitRing, Message::Mr(_)) => Some(Sending),
                    (Sending | AwaitAck, Message::Credit { .. }) => Some(state),
                    (AwaitAck, Message::Ack(_)) => Some(Idle),
                    (AwaitRing | Sending, Message::Ack(_)) if failed_ack => Some(Closed),
                    _ => None,
                };
                let ctx = format!("{} in {}", msg.kind(), state.as_str());
                match expect_state {
                    Some(next) => {
                        assert!(res.is_ok(), "{ctx}: {res:?}");
                        assert_eq!(s.state(), next, "{ctx}");
                    }
                    None => {
                        let want = match (&msg, state) {
                            (Message::Reject(r), st) if st != Closed && auth_reject => {
                                ProtocolError::AuthFailed {
                                    reason: r.reason.clone(),
                                }
                            }
                            (Message::Reject(r), AwaitChallenge) => ProtocolError::Refused {
                                code: r.code,
                                reason: r.reason.clone(),
                            },
                            (Message::Reject(r), st) if st != Closed => {
                                ProtocolError::PeerRejected {
                                    code: r.code,
                                    reason: r.reason.clone(),
                                }
                            }
                            _ => ProtocolError::Unexpected {
                                msg: msg.kind(),
                                state: state.as_str(),
                            },
                        };
                        assert_eq!(res, Err(want), "{ctx}");
                        assert_eq!(s.state(), Closed, "{ctx}: errors end the session");
                    }
                }
            }
        }
    }

    #[test]
    fn greeting_answers_the_challenge() {
        // (auth required, sender has a token) -> AUTH to send, token unused.
        let mac = token().mac(&NONCE).to_vec();
        for (flags, tok, want_auth, unused) in [
            (AUTH_REQUIRED, true, Some(mac.clone()), false),
            (AUTH_REQUIRED, false, Some(Vec::new()), false),
            (0, true, None, true),
            (0, false, None, false),
        ] {
            let mut s = SenderSession::new(10, tok.then(token));
            assert_eq!(s.state(), SenderState::AwaitChallenge);
            let ev = s.on_message(challenge(flags)).unwrap();
            assert_eq!(
                ev,
                SenderEvent::Greeted(Greeting {
                    auth: want_auth.map(|mac| Message::Auth { mac }),
                    token_unused: unused,
                }),
                "flags {flags} token {tok}"
            );
            assert_eq!(s.state(), SenderState::Idle);
            // The HELLO may follow at once (pipelined after the AUTH).
            assert!(matches!(s.start_file(offer(1)), Ok(Message::Hello(_))));
            // A second CHALLENGE is a protocol error.
            assert_eq!(
                s.on_message(challenge(flags)),
                Err(ProtocolError::Unexpected {
                    msg: "CHALLENGE",
                    state: "AWAIT_RING"
                })
            );
        }
        // The AUTH answers this nonce, and only this one.
        let mut s = SenderSession::new(10, Some(token()));
        let other = [1u8; NONCE_LEN];
        let Ok(SenderEvent::Greeted(Greeting {
            auth: Some(Message::Auth { mac }),
            ..
        })) = s.on_message(Message::Challenge(Challenge {
            flags: AUTH_REQUIRED,
            nonce: other,
        }))
        else {
            panic!("no AUTH");
        };
        assert!(token().verify(&other, &mac));
        assert!(!token().verify(&NONCE, &mac));
    }

    #[test]
    fn nothing_before_the_greeting() {
        let mut s = SenderSession::new(10, None);
        assert_eq!(
            s.start_file(offer(1)),
            Err(ProtocolError::WrongState {
                op: "start_file",
                state: "AWAIT_CHALLENGE"
            })
        );
        assert_eq!(
            s.close(),
            Err(ProtocolError::WrongState {
                op: "close",
                state: "AWAIT_CHALLENGE"
            })
        );
        assert_eq!(s.state(), SenderState::AwaitChallenge);
        // Greeted with REJECT (busy): the session is refused and over.
        let busy = Reject::new(RejectCode::Busy, "at --max-sessions 4");
        assert_eq!(
            s.on_message(Message::Reject(busy)),
            Err(ProtocolError::Refused {
                code: RejectCode::Busy,
                reason: "at --max-sessions 4".into()
            })
        );
        assert_eq!(s.state(), SenderState::Closed);
    }

    #[test]
    fn auth_rejection_after_the_pipelined_hello_ends_the_session() {
        // No token, auth required: empty AUTH, HELLO sent without waiting,
        // then the receiver's REJECT(Auth) arrives while awaiting the ring.
        let mut s = SenderSession::new(10, None);
        s.on_message(challenge(AUTH_REQUIRED)).unwrap();
        s.start_file(offer(5)).unwrap();
        let reason = "authentication failed: the sender has no token";
        let err = s
            .on_message(Message::Reject(Reject::new(RejectCode::Auth, reason)))
            .unwrap_err();
        assert_eq!(
            err,
            ProtocolError::AuthFailed {
                reason: reason.into()
            }
        );
        assert_eq!(
            err.to_string(),
            "authentication failed (the receiver says: authentication failed: the sender has no token)"
        );
        assert_eq!(s.state(), SenderState::Closed);
        // Not a per-file refusal: nothing more may be sent.
        assert!(s.start_file(offer(1)).is_err());
        assert!(s.close().is_err());
    }

    #[test]
    fn local_calls_in_wrong_state() {
        for state in STATES {
            let mut s = session_in(state);
            if state != SenderState::Idle {
                assert_eq!(
                    s.start_file(offer(1)),
                    Err(ProtocolError::WrongState {
                        op: "start_file",
                        state: state.as_str()
                    })
                );
                assert_eq!(
                    s.close(),
                    Err(ProtocolError::WrongState {
                        op: "close",
                        state: state.as_str()
                    })
                );
            }
            if state != SenderState::Sending {
                assert_eq!(s.next_chunk(), None);
                assert_eq!(
                    s.finish(Digest::Crc32(0)),
                    Err(ProtocolError::WrongState {
                        op: "finish",
                        state: state.as_str()
                    })
                );
            }
            // Local misuse does not change the state.
            assert_eq!(s.state(), state);
        }
    }

    #[test]
    fn hello_contents_and_bad_offer() {
        let mut s = greeted(10);
        let m = s.start_file(offer(5)).unwrap();
        assert_eq!(
            m,
            Message::Hello(Hello {
                version: 1,
                caps: CAP_NONE,
                name: "f.bin".into(),
                size: 5,
                mode: 0o600,
                digest: DigestAlg::Crc32,
            })
        );
        // Hostile names are the receiver's to refuse, so they go out as is.
        let mut s = greeted(10);
        let mut o = offer(5);
        o.name = "../etc".into();
        assert!(matches!(s.start_file(o), Ok(Message::Hello(h)) if h.name == "../etc"));
        assert_eq!(s.state(), SenderState::AwaitRing);
    }

    #[test]
    fn bad_rings_are_protocol_errors() {
        for (r, reason) in [
            (ring(0, 4), "slot size is 0"),
            (ring(100, 0), "slot count is 0"),
            (
                RingInfo {
                    addr: u64::MAX - 399,
                    ..ring(100, 4)
                },
                "address + length overflows 64 bits",
            ),
        ] {
            let mut s = session_in(SenderState::AwaitRing);
            assert_eq!(
                s.on_message(Message::Mr(r)),
                Err(ProtocolError::BadRing { reason })
            );
            assert_eq!(s.state(), SenderState::Closed);
        }
        // Exactly reaching the top of the address space is fine.
        let mut s = session_in(SenderState::AwaitRing);
        let top = RingInfo {
            addr: u64::MAX - 400,
            ..ring(100, 4)
        };
        assert!(s.on_message(Message::Mr(top)).is_ok());
    }

    /// Plans every chunk, returning credit whenever it runs out.
    fn plan_all(s: &mut SenderSession) -> Vec<ChunkPlan> {
        let mut out = Vec::new();
        while !s.all_chunks_planned() {
            match s.next_chunk() {
                Some(p) => out.push(p),
                None => {
                    assert_eq!(s.credits(), 0);
                    s.on_message(Message::Credit {
                        count: s.ring().slot_count,
                    })
                    .unwrap();
                }
            }
        }
        assert_eq!(s.next_chunk(), None);
        out
    }

    #[test]
    fn placement_math_and_wraparound() {
        let mut s = greeted(100);
        s.start_file(offer(1050)).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        assert_eq!(s.chunk_len(), 100);
        let plans = plan_all(&mut s);
        assert_eq!(plans.len(), 11);
        for (i, p) in plans.iter().enumerate() {
            let i64_ = i as u64;
            assert_eq!(p.seq, i64_);
            assert_eq!(p.slot, (i % 4) as u32);
            assert_eq!(p.remote_addr, ADDR + u64::from(p.slot) * 100);
            assert_eq!(p.rkey, 77);
            assert_eq!(p.file_offset, i64_ * 100);
            assert_eq!(p.len, if i == 10 { 50 } else { 100 });
        }
        let fin = s.finish(Digest::Crc32(9)).unwrap();
        assert_eq!(
            fin,
            Message::Fin(Fin {
                bytes: 1050,
                chunks: 11,
                digest: Digest::Crc32(9)
            })
        );
        assert!(s.all_chunks_planned());
    }

    #[test]
    fn chunk_len_is_min_of_own_and_slot() {
        for (own, slot, want) in [(64, 100, 64), (100, 64, 64), (0, 64, 64), (64, 64, 64)] {
            let mut s = greeted(own);
            s.start_file(offer(1000)).unwrap();
            s.on_message(Message::Mr(ring(slot, 2))).unwrap();
            assert_eq!(s.chunk_len(), want);
            let p = s.next_chunk().unwrap();
            assert_eq!(p.len, want);
            // Slots are spaced by the ring's slot size, not the chunk length.
            assert_eq!(s.next_chunk().unwrap().remote_addr, ADDR + u64::from(slot));
        }
    }

    #[test]
    fn sizes_around_the_chunk_length() {
        for (size, lens) in [
            (0u64, vec![]),
            (1, vec![1]),
            (99, vec![99]),
            (100, vec![100]),
            (101, vec![100, 1]),
            (199, vec![100, 99]),
            (200, vec![100, 100]),
        ] {
            let mut s = greeted(100);
            s.start_file(offer(size)).unwrap();
            s.on_message(Message::Mr(ring(100, 3))).unwrap();
            let got: Vec<u32> = plan_all(&mut s).iter().map(|p| p.len).collect();
            assert_eq!(got, lens, "size {size}");
            assert!(matches!(
                s.finish(Digest::Crc32(0)),
                Ok(Message::Fin(Fin { bytes, chunks, .. })) if bytes == size && chunks == lens.len() as u64
            ));
        }
    }

    #[test]
    fn credit_accounting() {
        let mut s = greeted(10);
        s.start_file(offer(1000)).unwrap();
        s.on_message(Message::Mr(ring(10, 3))).unwrap();
        assert_eq!(s.credits(), 3);
        // Full credit already: any more overflows.
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 1 }),
            Err(ProtocolError::CreditOverflow {
                added: 1,
                credits: 3,
                slot_count: 3
            })
        );
        for _ in 0..3 {
            assert!(s.next_chunk().is_some());
        }
        assert_eq!(s.credits(), 0);
        assert_eq!(s.next_chunk(), None, "no chunk without credit");
        assert_eq!(
            s.on_message(Message::Credit { count: 2 }),
            Ok(SenderEvent::Credit(2))
        );
        assert_eq!(s.credits(), 2);
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 2 }),
            Err(ProtocolError::CreditOverflow {
                added: 2,
                credits: 2,
                slot_count: 3
            })
        );
        assert_eq!(
            s.clone().on_message(Message::Credit { count: u32::MAX }),
            Err(ProtocolError::CreditOverflow {
                added: u32::MAX,
                credits: 2,
                slot_count: 3
            })
        );
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 0 }),
            Err(ProtocolError::ZeroCredit)
        );
        assert_eq!(
            s.on_message(Message::Credit { count: 1 }),
            Ok(SenderEvent::Credit(1))
        );
        assert_eq!(s.credits(), 3);
        assert_eq!(s.chunks_planned(), 3);
        assert_eq!(s.bytes_planned(), 30);
    }

    #[test]
    fn finish_requires_everything_planned_and_matching_digest() {
        let mut s = greeted(10);
        s.start_file(offer(25)).unwrap();
        s.on_message(Message::Mr(ring(10, 8))).unwrap();
        s.next_chunk().unwrap();
        assert_eq!(
            s.finish(Digest::Crc32(0)),
            Err(ProtocolError::Incomplete {
                planned: 10,
                size: 25
            })
        );
        assert!(!s.all_chunks_planned());
        s.next_chunk().unwrap();
        s.next_chunk().unwrap();
        assert!(s.all_chunks_planned());
        assert_eq!(
            s.finish(Digest::Sha256([0; 32])),
            Err(ProtocolError::DigestAlgMismatch {
                expected: DigestAlg::Crc32,
                got: DigestAlg::Sha256
            })
        );
        assert_eq!(s.state(), SenderState::Sending);
        assert!(s.finish(Digest::Crc32(0)).is_ok());
        // Late credits after FIN are fine.
        assert!(s.on_message(Message::Credit { count: 3 }).is_ok());
    }

    #[test]
    fn zero_byte_file() {
        let mut s = greeted(10);
        s.start_file(offer(0)).unwrap();
        s.on_message(Message::Mr(ring(10, 2))).unwrap();
        assert_eq!(s.state(), SenderState::Sending);
        assert!(s.all_chunks_planned());
        assert_eq!(s.next_chunk(), None);
        assert_eq!(
            s.finish(Digest::Crc32(0)).unwrap(),
            Message::Fin(Fin {
                bytes: 0,
                chunks: 0,
                digest: Digest::Crc32(0)
            })
        );
    }

    #[test]
    fn multi_file_session_with_reject_and_abort() {
        let mut s = greeted(10);
        // File 1: rejected.
        s.start_file(offer(5)).unwrap();
        let rej = Reject::new(RejectCode::Exists, "exists");
        assert_eq!(
            s.on_message(Message::Reject(rej.clone())),
            Ok(SenderEvent::Rejected(rej))
        );
        assert_eq!(s.state(), SenderState::Idle);
        // File 2 and 3: sent; credits reset per file.
        for size in [25u64, 7] {
            s.start_file(offer(size)).unwrap();
            s.on_message(Message::Mr(ring(10, 2))).unwrap();
            assert_eq!(s.credits(), 2);
            let plans = plan_all(&mut s);
            assert_eq!(plans[0].seq, 0);
            assert_eq!(plans[0].file_offset, 0);
            s.finish(Digest::Crc32(0)).unwrap();
            let a = Ack::new(AckStatus::Integrity, "bad");
            assert_eq!(
                s.on_message(Message::Ack(a.clone())),
                Ok(SenderEvent::Acked(a))
            );
            assert_eq!(s.state(), SenderState::Idle);
        }
        assert_eq!(s.close(), Ok(Message::Bye));
        assert_eq!(s.state(), SenderState::Closed);

        // Receiver aborting mid-file closes the session.
        let mut s = session_in(SenderState::Sending);
        let a = Ack::new(AckStatus::Io, "disk full");
        assert_eq!(
            s.on_message(Message::Ack(a.clone())),
            Ok(SenderEvent::Acked(a))
        );
        assert_eq!(s.state(), SenderState::Closed);
        assert_eq!(s.next_chunk(), None);
    }
}
