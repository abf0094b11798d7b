//! (b) The receiver machine against its model (`RxModel`).

use super::strategies::*;
use super::*;
use rdma_xfer::proto::{
    AUTH_TIMEOUT, ChunkError, Existing, Found, Standing, TimedOut, keepalive_interval,
};
use std::time::Duration;

#[derive(Debug, Clone)]
pub(crate) enum ChunkLen {
    /// A whole slot.
    Slot,
    /// What is left of the file (at most a slot).
    Rest,
    Zero,
    SlotPlus(u32),
    Any(u32),
}

#[derive(Debug, Clone)]
pub(crate) enum RxAction {
    /// Whatever a well-behaved sender / engine would do next (resolved from
    /// the state; the seed picks sizes and choices). In a closed session it
    /// starts a new one, so a case goes on after an error.
    Legal(u32),
    Msg(Message),
    /// Bytes through the decoder; fed only if they decode.
    Frame(Vec<u8>),
    /// A FIN built from what arrived (deltas mostly 0, so Verifying is reached).
    FinLike {
        dbytes: i8,
        dchunks: i8,
        alg: Option<DigestAlg>,
    },
    Chunk(ChunkLen, u32),
    Accept {
        same_shape: bool,
        addr: u64,
        rkey: u32,
    },
    Reject(RejectCode),
    /// The engine created the offered directory.
    AcceptDir,
    /// The engine's HAVE for an offer with RESUME: 0 nothing, 1 a prefix of
    /// `n` slots (bounded by the size), 2 the complete file; for one with
    /// CHECKSUM, 3 a request for its digest; then, for a bad one, some
    /// bytes off.
    Have(u8, u32, bool),
    /// The engine comparing its copy (or --link-dest's) with the sender's SHA-256
    /// (after COMPARE): 0 it starts reading (`work_started`: KEEPALIVEs are
    /// due while it reads; the same call for the HAVE of an offer with
    /// RESUME, and for a relaying engine that waits for the hosts after it
    /// before its verdict), 1 the same (`same`), 2 it differs (`have` of
    /// nothing).
    Compared(u8),
    /// The engine refuses the current batch: one of its members (this
    /// one) may be linked from --link-dest.
    RefuseBatchForLink(u8),
    /// What the engine found under the offer's final name
    /// (`ReceiverSession::existing`): nothing (None), something that is
    /// no regular file (`dsize` 2), or a regular file whose size is the
    /// offer's plus `dsize` and whose time is the offer's plus `dsecs`
    /// seconds.
    Existing(Option<(u8, i8)>),
    /// A dry run's offer passed the engine's checks (`would_receive`).
    WouldReceive,
    /// Time passes (milliseconds) and the engine's wait ends at the
    /// machine's deadline or later (`handle_timeout`).
    Elapse(u32),
    ChunkDone,
    Flush,
    Complete(AckStatus),
    /// The engine queues a RESULT (`push_result`): 0 a good one, 1 one
    /// without a host, 2 one with a host that has a space, 3 one with too
    /// long a reason.
    PushResult(u8),
}

pub(crate) fn rx_action() -> impl Strategy<Value = RxAction> {
    let chunk_len = prop_oneof![
        4 => Just(ChunkLen::Slot),
        4 => Just(ChunkLen::Rest),
        1 => Just(ChunkLen::Zero),
        1 => (1u32..3).prop_map(ChunkLen::SlotPlus),
        1 => any::<u32>().prop_map(ChunkLen::Any),
    ];
    let small = prop_oneof![8 => Just(0i8), 1 => -2i8..=2];
    // Mostly acceptable offers, so sessions get deep.
    let offer = hello().prop_map(|h| {
        let version = if h.version == PROTOCOL_VERSION || h.caps.is_multiple_of(2) {
            PROTOCOL_VERSION
        } else {
            h.version
        };
        let size = if h.caps.is_multiple_of(3) {
            h.size
        } else if h.is_stream() || h.is_directory() {
            0
        } else {
            h.size % 300
        };
        RxAction::Msg(Message::Hello(Hello { version, size, ..h }))
    });
    // Batches of mostly plain, small files.
    let batch = proptest::collection::vec(hello(), 0..4).prop_map(|hs| {
        let members = hs
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                let plain = h.caps % 4 != 0;
                Hello {
                    version: if plain { PROTOCOL_VERSION } else { h.version },
                    caps: if plain { 0 } else { h.caps },
                    mtime: if plain { None } else { h.mtime },
                    name: if plain { format!("b/{i}") } else { h.name },
                    size: if plain { h.size % 300 } else { h.size },
                    digest: if plain { DigestAlg::Sha256 } else { h.digest },
                    ..h
                }
            })
            .collect();
        RxAction::Msg(Message::Batch(members))
    });
    let alg = prop_oneof![4 => Just(None), 1 => digest_alg().prop_map(Some)];
    let fin = (small.clone(), small, alg).prop_map(|(dbytes, dchunks, alg)| RxAction::FinLike {
        dbytes,
        dchunks,
        alg,
    });
    let same_shape = prop_oneof![5 => Just(true), 1 => Just(false)];
    let accept = (same_shape, any::<u64>(), any::<u32>()).prop_map(|(same_shape, addr, rkey)| {
        RxAction::Accept {
            same_shape,
            addr: addr >> 1,
            rkey,
        }
    });
    prop_oneof![
        2 => message().prop_map(RxAction::Msg),
        3 => offer,
        2 => batch,
        1 => proptest::collection::vec(any::<u8>(), 0..40).prop_map(RxAction::Frame),
        2 => fin,
        8 => (chunk_len, any::<u32>()).prop_map(|(l, imm)| RxAction::Chunk(l, imm)),
        3 => accept,
        1 => reject_code().prop_map(RxAction::Reject),
        1 => Just(RxAction::AcceptDir),
        1 => (0u8..4, any::<u32>(), prop_oneof![9 => Just(false), 1 => Just(true)])
            .prop_map(|(k, n, off)| RxAction::Have(k, n, off)),
        1 => (0u8..3).prop_map(RxAction::Compared),
        1 => any::<u8>().prop_map(RxAction::RefuseBatchForLink),
        1 => proptest::option::of((0u8..3, -1i8..=1)).prop_map(RxAction::Existing),
        1 => Just(RxAction::WouldReceive),
        2 => prop_oneof![3 => 0u32..1_000, 1 => 0u32..70_000].prop_map(RxAction::Elapse),
        6 => Just(RxAction::ChunkDone),
        1 => Just(RxAction::Flush),
        2 => prop_oneof![3 => Just(AckStatus::Ok), 1 => ack_status()].prop_map(RxAction::Complete),
        1 => relay().prop_map(|r| RxAction::Msg(Message::Relay(r))),
        1 => hop_result().prop_map(|r| RxAction::Msg(Message::Result(r))),
        3 => prop_oneof![6 => Just(0u8), 1 => 1u8..4].prop_map(RxAction::PushResult),
    ]
}

/// What the harness knows about the session, to check the machine against.
#[derive(Default)]
pub(crate) struct RxModel {
    /// The HELLO that passed the checks (AwaitDecision) or was accepted.
    offer: Option<Hello>,
    ring: Option<RingInfo>,
    /// Next file offset / chunk sequence expected.
    bytes: u64,
    chunks: u64,
    /// Received, not yet consumed.
    unconsumed: u64,
    /// Consumed, credit not yet returned.
    pending: u64,
    /// Length of the file's first chunk (0 before it).
    chunk_len: u32,
    /// Files offered so far (for names).
    files: u64,
    /// The current offer is a batch of this many files (0: it is not);
    /// they count as entries once it is accepted.
    batch_files: u64,
    /// How long a legal sender makes the offered stream.
    stream_len: u64,
    /// The HAVE answering the current offer (with RESUME or CHECKSUM).
    have: Option<Have>,
    /// `existing` decided that the file under the name is compared.
    compare_existing: bool,
    /// `existing` was asked about the current offer (once per offer).
    existing_decided: bool,
    /// Where the current file's data starts: bytes, chunks, chunk length.
    base: (u64, u64, u32),
    /// Digest questions (HAVE of a complete copy or of a digest) asked in
    /// the session, and their files' bytes.
    digest_questions: u32,
    digest_bytes: u64,
    /// Names whose copy was compared in the session: once each.
    compared: std::collections::BTreeSet<String>,
    /// The token the engine gave `have`: FROM or COMPARE hands it back.
    waiting_token: Option<u64>,
    /// The copy token a HAVE that asks for a COMPARE carried (`have`'s
    /// default, 0, when given none): only COMPARE hands it back.
    copy_token: Option<u64>,
    /// Hosts after the receiver the session's RELAYs named (session-wide).
    relay_hops: usize,
    /// A HELLO or BATCH came in the session: no RELAY after it.
    offered: bool,
    /// RESULTs the engine queued for the current offer.
    results: usize,
}

/// The states in which an offer is open: from its event to the engine's
/// verdict (RESULTs may be queued).
pub(crate) fn offer_open(state: ReceiverState) -> bool {
    use ReceiverState::*;
    matches!(
        state,
        AwaitDecision | AwaitFrom | Comparing | Receiving | Verifying
    )
}

/// The machine under test carries numbered tokens for the engine, so that
/// what it hands back can be told apart.
pub(crate) type Rx = ReceiverSession<u64, u64, u64>;

/// The current offer's name.
pub(crate) fn offer_name(m: &RxModel) -> String {
    m.offer.as_ref().map(|h| h.name.clone()).unwrap_or_default()
}

/// Whether the current offer may be compared: its name not compared yet
/// in the session, and the session's budget has room for one more digest
/// question about `bytes`.
pub(crate) fn within_budget(m: &RxModel, budget: DigestBudget, bytes: u64) -> bool {
    !m.compared.contains(&offer_name(m))
        && m.digest_questions < budget.questions
        && m.digest_bytes
            .checked_add(bytes)
            .is_some_and(|b| b <= budget.bytes)
}

/// The current offer asked to resume.
pub(crate) fn resumable(m: &RxModel) -> bool {
    m.offer
        .as_ref()
        .is_some_and(|h| h.caps & hello_flags::RESUME != 0)
}

/// The current offer's sender answers a request for its digest.
pub(crate) fn checksummed(m: &RxModel) -> bool {
    m.offer
        .as_ref()
        .is_some_and(|h| h.caps & hello_flags::CHECKSUM != 0)
}

/// Whether the engine may answer the current offer (AwaitDecision) with
/// a HAVE of `kind`: once, Digest for CHECKSUM, the others for RESUME.
pub(crate) fn may_have(m: &RxModel, kind: HaveKind) -> bool {
    m.have.is_none()
        && match kind {
            HaveKind::Digest => checksummed(m),
            HaveKind::Complete => resumable(m) || m.compare_existing,
            _ => resumable(m),
        }
}

/// The current offer is a plain file alone (not a stream, directory or
/// batch): what is under its name may decide first.
pub(crate) fn plain_file(m: &RxModel) -> bool {
    m.batch_files == 0
        && m.offer
            .as_ref()
            .is_some_and(|h| !h.is_stream() && !h.is_directory())
}

/// The current offer is a dry run's.
pub(crate) fn dry(m: &RxModel) -> bool {
    m.offer
        .as_ref()
        .is_some_and(|h| h.caps & hello_flags::DRY_RUN != 0)
}

/// A HAVE after which COMPARE may come.
pub(crate) fn comparable(have: Option<HaveKind>) -> bool {
    matches!(have, Some(HaveKind::Complete | HaveKind::Digest))
}

impl RxModel {
    /// A model for the next offer: only what counts for the whole session
    /// is carried over.
    fn session_wide(&self) -> RxModel {
        RxModel {
            digest_questions: self.digest_questions,
            digest_bytes: self.digest_bytes,
            compared: self.compared.clone(),
            relay_hops: self.relay_hops,
            offered: self.offered,
            ..RxModel::default()
        }
    }

    fn is_stream(&self) -> bool {
        self.offer.as_ref().is_some_and(Hello::is_stream)
    }

    /// What a legal sender sends for the current offer.
    fn data_len(&self) -> u64 {
        match &self.offer {
            Some(h) if h.is_stream() => self.stream_len,
            Some(h) => h.size,
            None => 0,
        }
    }
}

/// The receiver's secret, as the harness knows it.
#[derive(Clone)]
pub(crate) struct RxAuth {
    token: Token,
    nonce: [u8; NONCE_LEN],
}

impl RxAuth {
    fn session(auth: &Option<RxAuth>, cfg: ReceiverConfig) -> Rx {
        match auth {
            Some(a) => Rx::carrying_with_auth(cfg, a.token.clone(), a.nonce, test_conn()),
            None => Rx::carrying(cfg),
        }
    }

    /// The key an honest sender derives on the test connection.
    fn key(&self) -> SessionKey {
        SessionKey::derive(&self.token, &self.nonce, &S_NONCE, &test_conn())
    }

    /// An honest sender's PROVE.
    fn good_prove(&self) -> Message {
        Message::Prove(Prove {
            version: PROTOCOL_VERSION,
            nonce: S_NONCE,
            proof: self.key().sender_proof().to_vec(),
        })
    }

    /// PROVEs an attacker can make: the right token over another
    /// connection (a relay), another nonce, another version.
    fn bad_proves(&self, seed: u32) -> Message {
        let other = ConnectionId {
            sender_qpn: seed | 0x100,
            ..test_conn()
        };
        let proof = match seed % 3 {
            0 => SessionKey::derive(&self.token, &self.nonce, &S_NONCE, &other).sender_proof(),
            1 => SessionKey::derive(
                &self.token,
                &[seed as u8; NONCE_LEN],
                &S_NONCE,
                &test_conn(),
            )
            .sender_proof(),
            _ => self.key().receiver_proof(),
        };
        Message::Prove(Prove {
            version: PROTOCOL_VERSION,
            nonce: S_NONCE,
            proof: proof.to_vec(),
        })
    }
}

/// The states in which the machine waits for the engine's answer to the
/// one decision it asked for (admission, an offer, a COMPARE, a FIN).
fn awaits_engine(state: ReceiverState) -> bool {
    use ReceiverState::*;
    matches!(
        state,
        AwaitAdmission | AwaitDecision | Comparing | Verifying
    )
}

/// Every reply the receiver queued.
pub(crate) fn replies(r: &mut Rx) -> Vec<Message> {
    std::iter::from_fn(|| r.poll_transmit()).collect()
}

/// What an engine call queued: its one reply, or (refused) nothing.
fn queued<E: std::fmt::Debug>(result: Result<(), E>, r: &mut Rx) -> Result<Message, E> {
    crate::one_message(result, replies(r))
}

/// At most one queued reply (a credit's), taken.
fn at_most_one(r: &mut Rx) -> Option<Message> {
    let mut sent = replies(r);
    assert!(sent.len() <= 1, "more than one reply: {sent:?}");
    sent.pop()
}

/// The machine answers every error of the sender's with exactly one reply
/// of its own making (the engine builds none), and nothing else: a REJECT
/// for a refused offer, REJECT(auth) for a failed authentication, an ACK
/// saying why for a broken session; nothing once the session is closed.
pub(crate) fn replies_fit(
    before: ReceiverState,
    err: Option<&RecvError>,
    replies: &[Message],
) -> Result<(), TestCaseError> {
    let Some(err) = err.filter(|_| before != ReceiverState::Closed) else {
        prop_assert!(replies.is_empty(), "unasked replies {:?}", replies);
        return Ok(());
    };
    prop_assert_eq!(replies.len(), 1, "{} answered with {:?}", err, replies);
    match (err, &replies[0]) {
        (RecvError::Reject(r), Message::Reject(m)) => prop_assert_eq!(r, m),
        (RecvError::Version(r), Message::Reject(m)) => {
            prop_assert_eq!(r, m);
            prop_assert_eq!(m.code, RejectCode::Version);
        }
        (RecvError::Forged(_), Message::Ack(a)) => {
            prop_assert_eq!(a.status, AckStatus::Protocol)
        }
        (RecvError::Auth(_), Message::Reject(m)) => prop_assert_eq!(m.code, RejectCode::Auth),
        (RecvError::Protocol(_), Message::Ack(a)) => {
            prop_assert_eq!(a.status, AckStatus::Protocol)
        }
        (RecvError::TooLarge { .. }, Message::Ack(a)) => {
            prop_assert_eq!(a.status, AckStatus::Rejected)
        }
        (RecvError::SessionLimit(r), Message::Reject(m)) => prop_assert_eq!(r, m),
        (e, m) => return Err(TestCaseError::fail(format!("{e} answered with {m:?}"))),
    }
    Ok(())
}

/// The legal next step of a sender / engine pair in state `state`.
pub(crate) fn legal_rx(
    state: ReceiverState,
    m: &RxModel,
    cfg: &ReceiverConfig,
    auth: &Option<RxAuth>,
    seed: u32,
) -> RxAction {
    use ReceiverState::*;
    let slots = u64::from(cfg.slot_count);
    match state {
        // A relaying engine queues each host's RESULT while the offer is
        // open, one per host (now and then one too many: refused).
        s if offer_open(s)
            && m.relay_hops > 0
            && (m.results <= m.relay_hops || seed % 12 == 1)
            && seed % 3 == 1 =>
        {
            RxAction::PushResult(0)
        }
        // An authenticated sender names the hosts after the receiver
        // before its first offer, now and then in several RELAYs, now and
        // then hundreds at once (never more than MAX_RELAY_HOPS in all).
        // (Now and then to a receiver that does not relay: it refuses.)
        AwaitHello
            if (cfg.relay_allowed || seed % 64 == 3)
                && auth.is_some()
                && !m.offered
                && m.relay_hops < MAX_RELAY_HOPS
                && seed % 2 == 1 =>
        {
            let n = if seed % 32 == 7 {
                600
            } else {
                1 + (seed / 4 % 3) as usize
            };
            let n = n.min(MAX_RELAY_HOPS - m.relay_hops);
            RxAction::Msg(Message::Relay(Relay {
                hops: (0..n).map(|i| format!("h{i}:7471")).collect(),
            }))
        }
        AwaitAuth => match auth {
            Some(a) if seed.is_multiple_of(8) => RxAction::Msg(a.bad_proves(seed / 8)),
            Some(a) => RxAction::Msg(a.good_prove()),
            None => RxAction::Msg(Message::Bye),
        },
        // Now and then a batch of small files (one to four).
        AwaitHello if seed % 7 == 6 => {
            let digest = if auth.is_some() || seed.is_multiple_of(2) {
                DigestAlg::Sha256
            } else {
                DigestAlg::Crc32
            };
            let members = (0..1 + seed % 4)
                .map(|i| Hello {
                    version: PROTOCOL_VERSION,
                    // Members of a --checksum run carry its flag.
                    caps: if (seed / 7 + i).is_multiple_of(3) {
                        hello_flags::CHECKSUM
                    } else {
                        0
                    },
                    name: format!("b{}/{i}", m.files),
                    size: u64::from((seed / 7 + i * 13) % 300).min(cfg.max_size),
                    mode: 0o644,
                    digest,
                    mtime: None,
                    piece: None,
                })
                .collect();
            RxAction::Msg(Message::Batch(members))
        }
        AwaitHello => {
            // Files (names or paths), streams, directories; now and then an
            // older sender's HELLO.
            let v = PROTOCOL_VERSION;
            let (version, caps, name) = match seed % 9 {
                4 if seed.is_multiple_of(8) => (
                    v,
                    hello_flags::RESUME | hello_flags::MTIME | hello_flags::CHECKSUM,
                    format!("r{}", m.files),
                ),
                4 if seed.is_multiple_of(4) => (
                    v,
                    hello_flags::RESUME | hello_flags::MTIME,
                    format!("r{}", m.files),
                ),
                // Now and then the same file again, under a name compared
                // already in the session (once is all it gets).
                5 | 6 if seed.is_multiple_of(2) => {
                    let again = m.compared.iter().next().filter(|_| seed.is_multiple_of(5));
                    let name = again.cloned().unwrap_or_else(|| format!("c{}", m.files));
                    (v, hello_flags::CHECKSUM, name)
                }
                7 if seed.is_multiple_of(3) => {
                    (v, hello_flags::IGNORE_EXISTING, format!("f{}", m.files))
                }
                7 if seed % 3 == 1 => (
                    v,
                    hello_flags::UPDATE | hello_flags::MTIME,
                    format!("f{}", m.files),
                ),
                8 if seed % 4 == 1 => (
                    v,
                    hello_flags::DRY_RUN | hello_flags::MTIME,
                    format!("f{}", m.files),
                ),
                1 if seed % 6 == 1 => (
                    v,
                    hello_flags::DIRECTORY | hello_flags::DRY_RUN,
                    format!("d/{}", m.files),
                ),
                8 if seed.is_multiple_of(2) => (
                    v,
                    hello_flags::MTIME
                        | if seed.is_multiple_of(4) {
                            hello_flags::IGNORE_TIMES
                        } else {
                            0
                        },
                    format!("f{}", m.files),
                ),
                0 => (v, hello_flags::STREAM, format!("s{}", m.files)),
                1 => (v, hello_flags::DIRECTORY, format!("d/{}", m.files)),
                2 => (v, 0, format!("d/f{}", m.files)),
                3 if seed.is_multiple_of(5) => (2, 0, format!("old{}", m.files)),
                _ => (v, 0, format!("f{}", m.files)),
            };
            RxAction::Msg(Message::Hello(Hello {
                version,
                caps,
                name,
                size: match seed % 8 {
                    _ if caps & (hello_flags::STREAM | hello_flags::DIRECTORY) != 0 => 0,
                    // A file to resume spans a few chunks.
                    _ if caps & hello_flags::RESUME != 0 => {
                        u64::from(cfg.slot_size) * u64::from(2 + seed % 5) + u64::from(seed % 7)
                    }
                    0 => 0,
                    1 => u64::from(cfg.slot_size) * u64::from(seed % 5),
                    _ => u64::from(seed % 300),
                }
                .min(cfg.max_size),
                mode: 0o644,
                // With a token SHA-256 (CRC32 now and then, to be refused).
                digest: if seed.is_multiple_of(3) || (auth.is_some() && !seed.is_multiple_of(11)) {
                    DigestAlg::Sha256
                } else {
                    DigestAlg::Crc32
                },
                // RESUME needs the source's mtime.
                mtime: (caps & hello_flags::MTIME != 0).then_some(Mtime {
                    secs: i64::from(seed),
                    nanos: 0,
                }),
                piece: None,
            }))
        }
        // A relaying engine waits for the hosts after it before its
        // verdict (KEEPALIVEs due meanwhile): after the offer, after a FIN.
        AwaitDecision | Verifying if m.relay_hops > 0 && seed % 7 == 5 => RxAction::Compared(0),
        AwaitDecision | Verifying if m.relay_hops > 0 && matches!(seed % 7, 3 | 6) => {
            RxAction::Elapse(seed % 1_500)
        }
        AwaitDecision if seed.is_multiple_of(6) => RxAction::Reject(RejectCode::Exists),
        // What is under the name decides first: a file of its size is
        // compared (CHECKSUM) with a HAVE of the complete copy.
        AwaitDecision if m.compare_existing && m.have.is_none() => RxAction::Have(2, seed, false),
        AwaitDecision
            if plain_file(m) && m.have.is_none() && !m.existing_decided && seed % 3 == 2 =>
        {
            RxAction::Existing(
                (!seed.is_multiple_of(7))
                    .then_some(((seed % 5 % 3) as u8, (seed / 3 % 3) as i8 - 1)),
            )
        }
        // An offer with RESUME gets its HAVE first (with CHECKSUM too,
        // now and then the request for its digest).
        // The engine reads what it holds (KEEPALIVEs due while it does).
        AwaitDecision if resumable(m) && m.have.is_none() && seed % 5 == 4 => RxAction::Compared(0),
        AwaitDecision if resumable(m) && m.have.is_none() && seed % 5 == 3 => {
            RxAction::Elapse(seed % 1_500)
        }
        AwaitDecision if resumable(m) && m.have.is_none() => {
            let kind = if checksummed(m) && seed % 4 == 3 {
                3
            } else {
                (seed % 3) as u8
            };
            RxAction::Have(kind, seed / 3, false)
        }
        // One with CHECKSUM is asked for its digest (a copy under
        // --link-dest), or not (none there: its MR at once).
        AwaitDecision if checksummed(m) && m.have.is_none() && !seed.is_multiple_of(3) => {
            RxAction::Have(3, seed, false)
        }
        AwaitDecision if m.offer.as_ref().is_some_and(Hello::is_directory) => RxAction::AcceptDir,
        // Now and then --link-dest may hold a member: the batch is refused.
        AwaitDecision if m.batch_files > 0 && seed % 11 == 10 => {
            RxAction::RefuseBatchForLink(seed as u8)
        }
        // A dry run is answered without data where a real run gets its MR.
        AwaitDecision if dry(m) && !m.offer.as_ref().is_some_and(Hello::is_directory) => {
            RxAction::WouldReceive
        }
        AwaitDecision => RxAction::Accept {
            same_shape: true,
            addr: u64::from(seed) << 12,
            rkey: seed,
        },
        // Only a stream waits for its input.
        Receiving if seed.is_multiple_of(50) && m.offer.as_ref().is_some_and(Hello::is_stream) => {
            RxAction::Msg(Message::Keepalive)
        }
        Receiving => {
            let size = m.data_len();
            let full = m.unconsumed + m.pending >= slots;
            if m.unconsumed > 0 && (full || seed.is_multiple_of(3)) {
                RxAction::ChunkDone
            } else if m.bytes < size && !full {
                let len = match m.chunk_len {
                    0 if seed.is_multiple_of(4) => 1 + seed % cfg.slot_size,
                    0 => cfg.slot_size,
                    l => l,
                };
                RxAction::Chunk(
                    ChunkLen::Any((size - m.bytes).min(u64::from(len)) as u32),
                    seed,
                )
            } else if m.bytes == size {
                RxAction::FinLike {
                    dbytes: 0,
                    dchunks: 0,
                    alg: None,
                }
            } else {
                RxAction::Flush
            }
        }
        Verifying if m.unconsumed > 0 => RxAction::ChunkDone,
        Verifying if seed.is_multiple_of(10) => RxAction::Complete(AckStatus::Integrity),
        Verifying => RxAction::Complete(AckStatus::Ok),
        Closed => RxAction::Legal(seed),
        // The sender reading its file to answer the HAVE says it is alive.
        AwaitFrom if seed % 9 == 8 => RxAction::Msg(Message::Keepalive),
        // A complete copy (or --link-dest's) is compared (the sender's
        // SHA-256); now and then the sender sends it all anyway (FROM 0).
        AwaitFrom if !seed.is_multiple_of(4) && comparable(m.have.as_ref().map(|h| h.kind)) => {
            RxAction::Msg(Message::Compare {
                sha256: [seed as u8; 32],
            })
        }
        AwaitFrom => RxAction::Msg(Message::From {
            offset: match m.have.as_ref().map(|h| h.kind) {
                _ if seed.is_multiple_of(4) => 0,
                Some(HaveKind::Prefix) => m.have.as_ref().map_or(0, |h| h.bytes),
                _ => 0,
            },
        }),
        // The engine reads its copy (KEEPALIVE now and then), then says
        // whether it is the sender's file.
        Comparing if seed.is_multiple_of(5) => RxAction::Compared(0),
        Comparing if seed % 5 == 1 => RxAction::Elapse(seed % 1_500),
        Comparing if seed.is_multiple_of(2) => RxAction::Compared(1),
        Comparing => RxAction::Compared(2),
        // Never seen here: the engine decides as soon as the proof passed.
        AwaitAdmission => RxAction::Msg(Message::Bye),
    }
}

pub(crate) static RX: Reached = Reached::new();
/// Relaying: 0 RELAYs taken, 1 RESULTs queued, 2 RELAYs refused by a
/// receiver that does not relay, 3 waits for the hosts after it started,
/// 4 KEEPALIVEs due in such a wait.
pub(crate) static RX_RELAY: Reached = Reached::new();
/// The timers: 0 KEEPALIVEs due while the engine worked, 1 sessions timed
/// out, 2 deadlines not reached yet.
pub(crate) static RX_TIMERS: Reached = Reached::new();

/// What the session waits for in `state`, and how long.
fn wait_of(state: ReceiverState, timeout: Duration) -> (&'static str, Duration) {
    use ReceiverState::*;
    match state {
        AwaitAuth | AwaitAdmission => ("the sender's PROVE", timeout.min(AUTH_TIMEOUT)),
        Receiving | Verifying => ("data from the sender", timeout),
        AwaitFrom => ("the sender's FROM or COMPARE", timeout),
        _ => ("the next HELLO or BYE", timeout),
    }
}

pub(crate) fn check_receiver(
    cfg: ReceiverConfig,
    key: Option<(Vec<u8>, [u8; NONCE_LEN])>,
    actions: Vec<RxAction>,
) -> Result<(), TestCaseError> {
    use ReceiverState::*;
    let auth = key.and_then(|(secret, nonce)| {
        Some(RxAuth {
            token: Token::new(secret)?,
            nonce,
        })
    });
    // With a token every write carries its chunk, then the chunk's tag: a
    // slot holds the configured chunk room and a tag.
    let tag_len = if auth.is_some() {
        CHUNK_TAG_LEN as u32
    } else {
        0
    };
    let cfg = ReceiverConfig {
        slot_size: cfg.slot_size.saturating_add(tag_len),
        ..cfg
    };
    let room = cfg.slot_size - tag_len;
    let mut r = RxAuth::session(&auth, cfg);
    prop_assert_eq!(r.tag_len(), tag_len);
    let mut m = RxModel::default();
    // Tokens handed to the machine so far (each one a new number).
    let mut tokens = 0u64;
    // The channel the last admission gave.
    let mut admitted_channel = None;
    // The token the machine holds for the file being received, from
    // `accept` to its FIN, or to `take_file` once the session is closed.
    let mut file_token: Option<u64> = None;
    // Authenticated in this session (or no token configured).
    let mut admitted = auth.is_none();
    // HELLOs the machine considered (AwaitHello, authenticated).
    let mut hellos = 0u64;
    // Offers refused since the last accepted one (machine or engine).
    let mut refused = 0u32;
    // The greeting: asks for AUTH exactly when a token is configured.
    let Some(Message::Challenge(c)) = r.poll_transmit() else {
        return Err(TestCaseError::fail("the first message is not a CHALLENGE"));
    };
    prop_assert!(replies(&mut r).is_empty());
    prop_assert_eq!(c.auth_required(), auth.is_some());
    prop_assert_eq!(r.state() == AwaitAuth, auth.is_some());
    // The engine's clock (synthetic), when the session last progressed,
    // and while the engine's file work runs, when its KEEPALIVE is due and
    // the state it runs in (its decision moves the machine on).
    let mut now = Instant::now();
    prop_assert_eq!(
        r.poll_timeout(),
        None,
        "a deadline before the session started"
    );
    r.progressed(now);
    let mut progressed_at = now;
    let mut working: Option<(Instant, ReceiverState)> = None;
    let interval = keepalive_interval(cfg.timeout);
    for action in actions {
        if working.is_some_and(|(_, state)| state != r.state()) {
            working = None;
        }
        let action = match action {
            RxAction::Legal(seed) => match legal_rx(r.state(), &m, &cfg, &auth, seed) {
                RxAction::Legal(_) => {
                    // Closed: the next session (its CHALLENGE goes first).
                    r = RxAuth::session(&auth, cfg);
                    prop_assert!(matches!(r.poll_transmit(), Some(Message::Challenge(_))));
                    r.progressed(now);
                    progressed_at = now;
                    working = None;
                    m = RxModel::default();
                    // The old session went with whatever it held.
                    file_token = None;
                    admitted = auth.is_none();
                    hellos = 0;
                    refused = 0;
                    continue;
                }
                a => a,
            },
            a => a,
        };
        let before = r.state();
        match action {
            RxAction::Legal(_) => unreachable!(),
            RxAction::Msg(_) | RxAction::Frame(_) | RxAction::FinLike { .. } => {
                // The sender's input: the wait for it starts over.
                r.progressed(now);
                progressed_at = now;
                let msg = match action {
                    RxAction::Msg(msg) => msg,
                    RxAction::Frame(b) => match decode(&b) {
                        Ok(msg) => msg,
                        Err(e) => {
                            // An undecodable frame ends the session with
                            // the machine's own reply.
                            let version =
                                matches!(e, rdma_xfer::proto::WireError::UnknownVersion(_));
                            let err = RecvError::from(r.on_undecodable(e));
                            let sent = replies(&mut r);
                            replies_fit(before, Some(&err), &sent)?;
                            prop_assert_eq!(version, matches!(err, RecvError::Reject(_)));
                            prop_assert_eq!(r.state(), Closed);
                            continue;
                        }
                    },
                    RxAction::FinLike {
                        dbytes,
                        dchunks,
                        alg,
                    } => {
                        let alg = alg
                            .or(m.offer.as_ref().map(|h| h.digest))
                            .unwrap_or(DigestAlg::Crc32);
                        Message::Fin(Fin {
                            bytes: r.bytes_received().wrapping_add_signed(dbytes.into()),
                            chunks: r.chunks_received().wrapping_add_signed(dchunks.into()),
                            digest: match alg {
                                DigestAlg::Crc32 => Digest::Crc32(0),
                                DigestAlg::Sha256 => Digest::Sha256([0; 32]),
                            },
                        })
                    }
                    _ => unreachable!(),
                };
                let kind = msg.kind();
                let sent = msg.clone();
                // A BATCH counts as one entry when offered, its other
                // files when accepted.
                if (kind == "HELLO" || kind == "BATCH") && before == AwaitHello && admitted {
                    hellos += 1;
                }
                // RELAY is taken only from an authenticated sender, before
                // its first offer, by a receiver that relays, within
                // MAX_RELAY_HOPS for the session.
                let relay_taken = match &sent {
                    Message::Relay(relay) => Some(
                        before == AwaitHello
                            && auth.is_some()
                            && !m.offered
                            && cfg.relay_allowed
                            && m.relay_hops + relay.hops.len() <= MAX_RELAY_HOPS,
                    ),
                    _ => None,
                };
                if (kind == "HELLO" || kind == "BATCH") && before == AwaitHello {
                    m.offered = true;
                }
                let result = r.on_message(msg);
                if let Some(taken) = relay_taken {
                    prop_assert_eq!(result.is_ok(), taken, "RELAY in {:?}: {:?}", before, result);
                }
                // A sender never sends RESULT.
                prop_assert!(!(kind == "RESULT" && result.is_ok()), "RESULT taken");
                // One engine decision at a time (src/proto/mod.rs): a
                // message that asks the engine for work leaves the machine
                // waiting for its answer, and while it waits no message
                // asks for more (a queue of them would hold one at most).
                let asks = matches!(
                    result,
                    Ok(ReceiverEvent::Offer(_)
                        | ReceiverEvent::Batch(_)
                        | ReceiverEvent::Fin(..)
                        | ReceiverEvent::From { .. }
                        | ReceiverEvent::Compare { .. }
                        | ReceiverEvent::Authenticated)
                );
                if asks {
                    prop_assert!(
                        !awaits_engine(before),
                        "a second decision asked in {:?}",
                        before
                    );
                    prop_assert!(
                        awaits_engine(r.state()),
                        "a decision asked, then {:?}",
                        r.state()
                    );
                }
                // The engine's admission after a right proof: nothing is
                // answered before it; a session is free unless the case's
                // receiver nonce says otherwise (1 in 8: busy).
                let refused_busy =
                    match (&result, &auth) {
                        (Ok(ReceiverEvent::Authenticated), Some(a)) => {
                            prop_assert!(replies(&mut r).is_empty(), "an answer before admission");
                            prop_assert_eq!(r.state(), AwaitAdmission);
                            if a.nonce[0] % 8 == 0 {
                                RX.hit(6);
                                Some(r.refuse_busy(2).map_err(|e| {
                                    TestCaseError::fail(format!("not refused: {e}"))
                                })?)
                            } else {
                                admitted_channel = Some(r.admit().map_err(|e| {
                                    TestCaseError::fail(format!("not admitted: {e}"))
                                })?);
                                None
                            }
                        }
                        _ => None,
                    };
                let answered = replies(&mut r);
                if let Some(busy) = &refused_busy {
                    // REJECT(busy) instead of the proof, and nothing else.
                    prop_assert_eq!(&answered, &vec![Message::Reject(busy.clone())]);
                    prop_assert_eq!(busy.code, RejectCode::Busy);
                    prop_assert!(r.admit().is_err(), "a channel for a refused sender");
                } else if let Ok(ReceiverEvent::Authenticated) = result {
                    // The receiver's proof, and nothing else.
                    let a = auth
                        .as_ref()
                        .ok_or_else(|| TestCaseError::fail("no token"))?;
                    prop_assert_eq!(
                        answered,
                        vec![Message::AuthOk {
                            proof: a.key().receiver_proof()
                        }]
                    );
                } else {
                    replies_fit(before, result.as_ref().err(), &answered)?;
                }
                if before == Closed {
                    prop_assert!(result.is_err(), "a closed session accepted {}", kind);
                }
                // What a HAVE allows the sender must be taken: FROM 0 or
                // the prefix, COMPARE only of a complete copy.
                let have_kind = m.have.as_ref().map(|h| h.kind);
                if before == AwaitFrom {
                    let allowed = match &sent {
                        Message::From { offset: 0 } => true,
                        Message::From { offset } => {
                            have_kind == Some(HaveKind::Prefix)
                                && m.have.as_ref().map(|h| h.bytes) == Some(*offset)
                        }
                        Message::Compare { .. } => comparable(have_kind),
                        Message::Keepalive => true,
                        _ => false,
                    };
                    prop_assert_eq!(result.is_ok(), allowed, "{} after {:?}", kind, m.have);
                }
                match result {
                    Ok(ReceiverEvent::From { offset, waiting }) => {
                        // Only where a HAVE offered it: 0 or its prefix,
                        // with what the HAVE carried.
                        prop_assert_eq!(before, AwaitFrom);
                        prop_assert_eq!(Some(waiting), m.waiting_token.take());
                        // A COMPARE's copy is not needed after FROM.
                        m.copy_token = None;
                        let have = m
                            .have
                            .clone()
                            .ok_or_else(|| TestCaseError::fail("FROM without HAVE"))?;
                        match (have.kind, offset) {
                            (_, 0) => prop_assert_eq!(r.state(), AwaitDecision),
                            (HaveKind::Prefix, o) if o == have.bytes => {
                                prop_assert_eq!(r.state(), AwaitDecision);
                                m.base = (o, o / u64::from(have.chunk_len), have.chunk_len);
                                RX.hit(5);
                            }
                            _ => return Err(TestCaseError::fail(format!("FROM {offset} taken"))),
                        }
                        prop_assert_eq!(r.resumed_from(), m.base.0);
                    }
                    Ok(ReceiverEvent::Compare {
                        sha256,
                        copy,
                        waiting,
                    }) => {
                        prop_assert_eq!(Some(waiting), m.waiting_token.take());
                        // Exactly the copy its HAVE carried.
                        prop_assert_eq!(Some(copy), m.copy_token.take());
                        // Only after a HAVE of a complete copy (or asking
                        // for the digest), with the sender's SHA-256 as
                        // sent; the engine compares.
                        prop_assert_eq!(before, AwaitFrom);
                        prop_assert!(comparable(have_kind), "COMPARE after {:?}", have_kind);
                        prop_assert_eq!(Message::Compare { sha256 }, sent);
                        prop_assert_eq!(r.state(), Comparing);
                        prop_assert_eq!(r.resumed_from(), m.base.0);
                        RX.hit(7);
                    }
                    Ok(ReceiverEvent::Offer(h)) => {
                        prop_assert_eq!(before, AwaitHello);
                        prop_assert!(
                            hellos <= cfg.max_files,
                            "offer {} of {}",
                            hellos,
                            cfg.max_files
                        );
                        // Nothing is considered before authentication.
                        prop_assert!(admitted, "HELLO considered before AUTH");
                        let files = m.files + 1;
                        prop_assert_eq!(Message::Hello(h.clone()), sent);
                        // Exactly this protocol version.
                        prop_assert_eq!(h.version, PROTOCOL_VERSION);
                        prop_assert_eq!(h.caps & !hello_flags::KNOWN, 0);
                        prop_assert!(!(h.is_stream() && h.is_directory()));
                        prop_assert!(
                            validate_path(&h.name, cfg.names).is_ok(),
                            "accepted path {:?}",
                            h.name
                        );
                        check_accepted_name(&h.name, cfg.names)?;
                        // Nothing that could climb out of the directory.
                        prop_assert!(
                            !h.name.starts_with('/')
                                && h.name.split('/').all(|c| !c.is_empty() && c != ".."),
                            "accepted {:?}",
                            h.name
                        );
                        prop_assert!(h.size <= cfg.max_size);
                        // With a token the digest resists deliberate changes.
                        if auth.is_some() && !h.is_directory() {
                            prop_assert_eq!(h.digest, DigestAlg::Sha256);
                        }
                        if h.is_stream() || h.is_directory() {
                            prop_assert_eq!(h.size, 0);
                            prop_assert_eq!(h.caps & hello_flags::CHECKSUM, 0);
                        }
                        prop_assert_eq!(r.state(), AwaitDecision);
                        m = RxModel {
                            offer: Some(h),
                            files,
                            stream_len: (files * 37) % 300,
                            ..m.session_wide()
                        };
                    }
                    Ok(ReceiverEvent::Batch(members)) => {
                        prop_assert_eq!(before, AwaitHello);
                        prop_assert!(admitted, "BATCH considered before AUTH");
                        prop_assert_eq!(Message::Batch(members.clone()), sent);
                        prop_assert!(!members.is_empty() && members.len() <= MAX_BATCH_FILES);
                        prop_assert!(
                            hellos - 1 + members.len() as u64 <= cfg.max_files,
                            "a batch past --max-files"
                        );
                        let mut names = std::collections::HashSet::new();
                        let mut total = 0u64;
                        for h in &members {
                            prop_assert_eq!(h.version, PROTOCOL_VERSION);
                            prop_assert_eq!(h.caps & !hello_flags::KNOWN, 0);
                            prop_assert!(!h.is_stream() && !h.is_directory());
                            prop_assert_eq!(h.caps & hello_flags::RESUME, 0);
                            prop_assert!(
                                validate_path(&h.name, cfg.names).is_ok(),
                                "accepted path {:?}",
                                h.name
                            );
                            check_accepted_name(&h.name, cfg.names)?;
                            prop_assert!(names.insert(h.name.clone()), "a name twice");
                            prop_assert!(h.size <= cfg.max_size);
                            prop_assert_eq!(h.digest, members[0].digest);
                            if auth.is_some() {
                                prop_assert_eq!(h.digest, DigestAlg::Sha256);
                            }
                            total += h.size;
                        }
                        prop_assert_eq!(r.state(), AwaitDecision);
                        // Never asked, whatever its files carry.
                        prop_assert!(r.clone().have(Have::ask_digest(total), 0).is_err());
                        // From here on the batch is one file of its total size.
                        let files = m.files + 1;
                        m = RxModel {
                            offer: Some(Hello {
                                caps: 0,
                                size: total,
                                ..members[0].clone()
                            }),
                            files,
                            batch_files: members.len() as u64,
                            ..m.session_wide()
                        };
                        RX.hit(9);
                    }
                    Ok(ReceiverEvent::Fin(f, token)) => {
                        prop_assert_eq!(before, Receiving);
                        // The file `accept` was given, once.
                        prop_assert_eq!(Some(token), file_token.take());
                        if !m.is_stream() {
                            let size = m.offer.as_ref().map(|h| h.size);
                            prop_assert_eq!(Some(f.bytes), size);
                        }
                        prop_assert_eq!(f.bytes, m.bytes);
                        prop_assert_eq!(f.chunks, m.chunks);
                        prop_assert_eq!(r.state(), Verifying);
                        RX.hit(2);
                    }
                    Ok(ReceiverEvent::Relay(hops)) => {
                        prop_assert_eq!(before, AwaitHello);
                        prop_assert!(admitted && auth.is_some() && cfg.relay_allowed);
                        prop_assert_eq!(Message::Relay(Relay { hops: hops.clone() }), sent);
                        m.relay_hops += hops.len();
                        prop_assert!(m.relay_hops <= MAX_RELAY_HOPS);
                        prop_assert!(r.is_relaying());
                        prop_assert_eq!(r.state(), AwaitHello);
                        RX_RELAY.hit(0);
                    }
                    Ok(ReceiverEvent::Closed) => {
                        prop_assert_eq!(kind, "BYE");
                        prop_assert!(matches!(before, AwaitHello | AwaitAuth));
                        prop_assert_eq!(r.state(), Closed);
                    }
                    Ok(ReceiverEvent::Authenticated) => {
                        prop_assert_eq!(before, AwaitAuth);
                        let a = auth
                            .as_ref()
                            .ok_or_else(|| TestCaseError::fail("no token"))?;
                        let Message::Prove(p) = &sent else {
                            return Err(TestCaseError::fail(format!("{kind} authenticated")));
                        };
                        // Only a proof under this connection's key.
                        let key = SessionKey::derive(&a.token, &a.nonce, &p.nonce, &test_conn());
                        prop_assert!(key.verify_sender(&p.proof), "a wrong proof authenticated");
                        prop_assert_eq!(p.version, PROTOCOL_VERSION);
                        if refused_busy.is_some() {
                            prop_assert_eq!(r.state(), Closed);
                            continue;
                        }
                        prop_assert_eq!(r.state(), AwaitHello);
                        // Both ends' channels talk to each other, one way only.
                        let mut theirs = admitted_channel
                            .take()
                            .ok_or_else(|| TestCaseError::fail("no channel"))?;
                        let mut mine = key.channel(Role::Sender);
                        let sealed = mine
                            .seal(b"HELLO")
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        prop_assert_eq!(theirs.open(&sealed).ok(), Some(&b"HELLO"[..]));
                        prop_assert!(theirs.clone().open(&sealed).is_err(), "replay opened");
                        admitted = true;
                        RX.hit(4);
                    }
                    Ok(ReceiverEvent::Keepalive) => {
                        // A stream waiting for its input, or the sender
                        // reading its file to answer the HAVE.
                        match before {
                            Receiving => {
                                prop_assert!(m.offer.as_ref().is_some_and(Hello::is_stream))
                            }
                            AwaitFrom => prop_assert!(m.have.is_some()),
                            other => {
                                return Err(TestCaseError::fail(format!("KEEPALIVE in {other:?}")));
                            }
                        }
                        prop_assert_eq!(r.state(), before);
                    }
                    Err(RecvError::Auth(_)) => {
                        prop_assert_eq!(before, AwaitAuth);
                        prop_assert_eq!(r.state(), Closed);
                    }
                    Err(RecvError::Version(j)) => {
                        // Another version: refused by name, session over.
                        prop_assert!(
                            matches!(kind, "HELLO" | "BATCH" | "PROVE" | "AUTH"),
                            "{}",
                            kind
                        );
                        prop_assert!(
                            j.reason.contains("protocol version") || j.reason.contains("flags"),
                            "{}",
                            j.reason
                        );
                        prop_assert_eq!(r.state(), Closed);
                    }
                    Err(RecvError::Forged(_)) => {
                        return Err(TestCaseError::fail("on_message reported a forgery"));
                    }
                    Err(RecvError::Reject(rej)) => {
                        // A refused offer: the session goes on.
                        refused += 1;
                        prop_assert!(refused <= MAX_REFUSALS_IN_A_ROW);
                        prop_assert!(kind == "HELLO" || kind == "BATCH", "{}", kind);
                        prop_assert_eq!(before, AwaitHello);
                        prop_assert_eq!(r.state(), AwaitHello);
                        prop_assert!(!rej.reason.is_empty());
                    }
                    Err(RecvError::Protocol(_)) => prop_assert_eq!(r.state(), Closed),
                    // A receiver that does not relay refuses a RELAY so.
                    Err(RecvError::SessionLimit(rej)) if kind == "RELAY" => {
                        prop_assert!(!cfg.relay_allowed);
                        prop_assert_eq!(rej.code, RejectCode::Protocol);
                        prop_assert!(rej.reason.contains("does not relay"), "{}", rej.reason);
                        prop_assert_eq!(r.state(), Closed);
                        RX_RELAY.hit(2);
                    }
                    Err(RecvError::SessionLimit(rej)) => {
                        // Only the HELLO past --max-files, or after too many
                        // refusals in a row, ends a session so.
                        prop_assert!(kind == "HELLO" || kind == "BATCH", "{}", kind);
                        prop_assert_eq!(before, AwaitHello);
                        if rej.code == RejectCode::TooLarge {
                            prop_assert_eq!(kind, "HELLO");
                            // The first HELLO past the limit (batches past
                            // it are refused without ending the session).
                            prop_assert!(hellos > cfg.max_files, "{} of {}", hellos, cfg.max_files);
                        } else {
                            prop_assert_eq!(rej.code, RejectCode::Protocol);
                            prop_assert_eq!(refused, MAX_REFUSALS_IN_A_ROW);
                        }
                        prop_assert_eq!(r.state(), Closed);
                    }
                    Err(RecvError::TooLarge { .. }) => {
                        return Err(TestCaseError::fail("a message was too large"));
                    }
                }
            }
            RxAction::Chunk(len, imm) => {
                r.progressed(now);
                progressed_at = now;
                let slot = u64::from(room);
                let rest = m.data_len().saturating_sub(m.bytes);
                // What the write carries: the chunk and its tag.
                let len = match len {
                    ChunkLen::Slot => cfg.slot_size,
                    ChunkLen::Rest => rest.min(slot) as u32 + tag_len,
                    ChunkLen::Zero => 0,
                    ChunkLen::SlotPlus(d) => cfg.slot_size.saturating_add(d),
                    ChunkLen::Any(v) => v,
                };
                let result = r.on_chunk(len, imm);
                let refused = result.clone().err().map(RecvError::from);
                replies_fit(before, refused.as_ref(), &replies(&mut r))?;
                match result {
                    Ok(p) => {
                        prop_assert_eq!(before, Receiving);
                        let ring = m
                            .ring
                            .ok_or_else(|| TestCaseError::fail("chunk without MR"))?;
                        // A stream's only bound is --max-size.
                        let size = if m.is_stream() {
                            cfg.max_size
                        } else {
                            m.offer.as_ref().map_or(0, |h| h.size)
                        };
                        // Inside the ring, inside its slot, with its tag.
                        prop_assert!(p.len > 0 && p.len + tag_len <= ring.slot_size);
                        prop_assert_eq!(p.len + tag_len, len);
                        prop_assert_eq!(p.auth.is_some(), tag_len > 0);
                        prop_assert!(p.slot < ring.slot_count);
                        prop_assert_eq!(
                            p.slot_offset,
                            u64::from(p.slot) * u64::from(ring.slot_size)
                        );
                        prop_assert!(p.slot_offset + u64::from(p.len) <= ring.len_bytes());
                        prop_assert_eq!(u64::from(p.slot), p.seq % u64::from(ring.slot_count));
                        // Contiguous, and never past the offered size.
                        prop_assert_eq!(p.seq, m.chunks);
                        prop_assert_eq!(p.file_offset, m.bytes);
                        prop_assert!(p.file_offset + u64::from(p.len) <= size);
                        prop_assert_eq!(p.expected_crc, imm);
                        // Never more slots in use than the ring has.
                        prop_assert!(m.unconsumed + m.pending < u64::from(ring.slot_count));
                        m.bytes += u64::from(p.len);
                        m.chunks += 1;
                        m.unconsumed += 1;
                        if m.chunk_len == 0 {
                            m.chunk_len = p.len;
                        }
                        RX.hit(1);
                        prop_assert_eq!(r.bytes_received(), m.bytes);
                        prop_assert!(r.bytes_received() <= size);
                    }
                    Err(ChunkError::Protocol(_)) => prop_assert_eq!(r.state(), Closed),
                    Err(ChunkError::TooLarge { limit, option }) => {
                        // Only a stream, only past --max-size.
                        prop_assert_eq!(option, "--max-size");
                        prop_assert!(m.is_stream());
                        prop_assert_eq!(limit, cfg.max_size);
                        prop_assert!(m.bytes + u64::from(len - tag_len) > cfg.max_size);
                        prop_assert_eq!(r.state(), Closed);
                    }
                }
            }
            RxAction::Accept {
                same_shape,
                addr,
                rkey,
            } => {
                let ring = RingInfo {
                    addr,
                    rkey,
                    slot_size: if same_shape {
                        cfg.slot_size
                    } else {
                        cfg.slot_size ^ 1
                    },
                    slot_count: cfg.slot_count,
                };
                tokens += 1;
                match queued(r.accept(ring, tokens), &mut r) {
                    Ok(mr) => {
                        prop_assert!(!dry(&m), "an MR for a dry run");
                        prop_assert_eq!(file_token.replace(tokens), None);
                        // An accepted batch's other files count now.
                        hellos += m.batch_files.saturating_sub(1);
                        // No MR before an accepted HELLO (nor before AUTH).
                        prop_assert_eq!(before, AwaitDecision);
                        prop_assert!(admitted);
                        prop_assert!(m.offer.is_some());
                        // Never a ring for a directory.
                        prop_assert!(!m.offer.as_ref().is_some_and(Hello::is_directory));
                        prop_assert_eq!(mr, Message::Mr(ring));
                        refused = 0;
                        RX.hit(0);
                        prop_assert_eq!(r.state(), Receiving);
                        m.ring = Some(ring);
                        // A resumed file continues its prefix.
                        (m.bytes, m.chunks, m.chunk_len) = m.base;
                        m.unconsumed = 0;
                        m.pending = 0;
                    }
                    Err(_) => prop_assert_eq!(r.state(), before),
                }
            }
            RxAction::Have(kind, n, off) => {
                let size = m.offer.as_ref().map_or(0, |h| h.size);
                let chunk = u64::from(room);
                let mut have = match kind {
                    0 => Have::nothing("fuzz"),
                    1 => Have {
                        kind: HaveKind::Prefix,
                        bytes: (u64::from(n) % size.div_ceil(chunk).max(1)) * chunk,
                        chunk_len: room,
                        digest: Digest::Sha256([n as u8; 32]),
                        note: String::new(),
                    },
                    // A complete copy discloses no digest: it is compared.
                    2 => Have::complete(size),
                    _ => Have::ask_digest(size),
                };
                if off {
                    have.bytes = have.bytes.wrapping_add(u64::from(n % 7) + 1);
                }
                let fits = have.fits(size) && have.chunk_len <= room;
                // A complete copy or a digest: within the session's budget.
                let compares = matches!(have.kind, HaveKind::Complete | HaveKind::Digest);
                let within = within_budget(&m, cfg.digest_budget, have.bytes);
                prop_assert_eq!(r.may_compare(&offer_name(&m), have.bytes), within);
                // From Comparing (the copy differs) only a HAVE of nothing.
                let allowed =
                    (before == AwaitDecision && may_have(&m, have.kind) && (!compares || within))
                        || (before == Comparing && have.kind == HaveKind::Nothing);
                tokens += 1;
                // A well-formed one as the engine makes it: from what the
                // store found (or asking the digest); the machine makes
                // the HAVE of the offer.
                let made = match kind {
                    _ if off => r.have(have.clone(), tokens),
                    0 => r.have_found(Found::Nothing("fuzz".into()), tokens),
                    1 => {
                        let found = Found::Prefix {
                            bytes: have.bytes,
                            chunk_len: room,
                            sha256: [n as u8; 32],
                        };
                        r.have_found(found, tokens)
                    }
                    2 => r.have_found(Found::Complete(tokens), tokens),
                    _ => r.ask_digest(tokens, tokens),
                };
                // `have` carries the default copy.
                let copy = if off || kind < 2 { 0 } else { tokens };
                match queued(made, &mut r) {
                    Ok(msg) => {
                        m.waiting_token = Some(tokens);
                        m.copy_token = compares.then_some(copy);
                        prop_assert!(
                            allowed,
                            "HAVE {:?} in {:?} (RESUME: {}, CHECKSUM: {}, after {:?})",
                            have.kind,
                            before,
                            resumable(&m),
                            checksummed(&m),
                            m.have
                        );
                        match (before, have.kind) {
                            (_, HaveKind::Digest) => {
                                prop_assert!(checksummed(&m), "a digest asked without CHECKSUM");
                                RX.hit(10);
                            }
                            // The copy differs (after RESUME's or CHECKSUM's COMPARE).
                            (Comparing, _) => {}
                            // CHECKSUM's compare of the file under the name.
                            (_, HaveKind::Complete) if m.compare_existing => {}
                            _ => prop_assert!(resumable(&m), "HAVE without RESUME"),
                        }
                        prop_assert!(fits, "an unfit HAVE: {:?}", have);
                        if compares {
                            m.digest_questions += 1;
                            m.digest_bytes += have.bytes;
                            m.compared.insert(offer_name(&m));
                        }
                        prop_assert_eq!(msg, Message::Have(have.clone()));
                        prop_assert_eq!(r.state(), AwaitFrom);
                        m.have = Some(have);
                    }
                    Err(_) => {
                        prop_assert!(!allowed || !fits, "a fitting HAVE refused: {:?}", have);
                        if before == AwaitDecision
                            && may_have(&m, have.kind)
                            && fits
                            && compares
                            && !within
                        {
                            RX.hit(12);
                            if m.compared.contains(&offer_name(&m)) {
                                RX.hit(13);
                            }
                        }
                        prop_assert_eq!(r.state(), before);
                    }
                }
            }
            RxAction::Compared(what) => {
                let comparing = before == Comparing;
                match what {
                    // Reading its copy (or a kept prefix): the sender waits.
                    // Or, relaying, waiting for the hosts after it before
                    // its verdict on the offer (after it, after a FIN).
                    0 => {
                        let reading = comparing
                            || (before == AwaitDecision && resumable(&m) && m.have.is_none());
                        let hop_waits =
                            m.relay_hops > 0 && matches!(before, AwaitDecision | Verifying);
                        match r.work_started(now) {
                            Ok(()) => {
                                prop_assert!(reading || hop_waits, "work started in {:?}", before);
                                prop_assert!(replies(&mut r).is_empty(), "sent at once");
                                working = Some((now + interval, before));
                                if !reading {
                                    RX_RELAY.hit(3);
                                }
                            }
                            Err(_) => {
                                prop_assert!(
                                    !reading && !hop_waits,
                                    "work refused in {:?}",
                                    before
                                );
                                prop_assert!(replies(&mut r).is_empty(), "misuse queued");
                            }
                        }
                        prop_assert_eq!(r.state(), before);
                    }
                    // The same: the file is done without data, its ACK.
                    1 => match queued(r.same(), &mut r) {
                        Ok(msg) => {
                            prop_assert!(comparing, "same() in {:?}", before);
                            let asked = m.have.as_ref().map(|h| h.kind);
                            prop_assert!(comparable(asked), "same() after {:?}", asked);
                            if asked == Some(HaveKind::Digest) {
                                RX.hit(11);
                            }
                            prop_assert_eq!(msg, Message::Ack(Ack::new(AckStatus::Ok, "")));
                            prop_assert_eq!(r.state(), AwaitHello);
                            prop_assert!(replies(&mut r).is_empty());
                            RX.hit(8);
                            m = RxModel {
                                files: m.files,
                                ..m.session_wide()
                            };
                        }
                        Err(_) => {
                            prop_assert!(!comparing, "same() refused while comparing");
                            prop_assert_eq!(r.state(), before);
                        }
                    },
                    // It differs: HAVE of nothing, FROM 0 follows.
                    _ => {
                        let differs = Have::nothing("the receiver's copy differs");
                        let answering = before == AwaitDecision && may_have(&m, HaveKind::Nothing);
                        tokens += 1;
                        match queued(r.have(differs.clone(), tokens), &mut r) {
                            Ok(msg) => {
                                m.waiting_token = Some(tokens);
                                m.copy_token = None;
                                prop_assert!(comparing || answering, "have() in {:?}", before);
                                prop_assert_eq!(msg, Message::Have(differs.clone()));
                                prop_assert_eq!(r.state(), AwaitFrom);
                                m.have = Some(differs);
                            }
                            Err(_) => {
                                prop_assert!(!comparing && !answering, "nothing refused");
                                prop_assert_eq!(r.state(), before);
                            }
                        }
                    }
                }
            }
            RxAction::Elapse(ms) => {
                // A KEEPALIVE is due only while the engine works; else the
                // wait for the sender ends the session at its limit.
                let (what, limit) = wait_of(before, cfg.timeout);
                let deadline = match working {
                    _ if before == Closed => None,
                    Some((due, _)) => Some(due),
                    None => progressed_at.checked_add(limit),
                };
                prop_assert_eq!(r.poll_timeout(), deadline);
                now += Duration::from_millis(ms.into());
                let result = r.handle_timeout(now);
                let sent = replies(&mut r);
                match deadline {
                    Some(deadline) if now >= deadline => match working {
                        Some(_) => {
                            RX_TIMERS.hit(0);
                            let reading =
                                before == AwaitDecision && resumable(&m) && m.have.is_none();
                            if matches!(before, AwaitDecision | Verifying)
                                && m.relay_hops > 0
                                && !reading
                            {
                                RX_RELAY.hit(4);
                            }
                            prop_assert_eq!(result, Ok(()));
                            prop_assert_eq!(sent, vec![Message::Keepalive]);
                            prop_assert_eq!(r.state(), before);
                            working = Some((now + interval, before));
                        }
                        None => {
                            RX_TIMERS.hit(1);
                            prop_assert_eq!(
                                result,
                                Err(TimedOut {
                                    waiting_for: what,
                                    after: limit,
                                    state: before
                                })
                            );
                            prop_assert!(sent.is_empty(), "said something to a silent sender");
                            prop_assert_eq!(r.state(), Closed);
                        }
                    },
                    _ => {
                        if deadline.is_some() {
                            RX_TIMERS.hit(2);
                        }
                        prop_assert_eq!(result, Ok(()));
                        prop_assert!(sent.is_empty(), "sent before its time: {:?}", sent);
                        prop_assert_eq!(r.state(), before);
                    }
                }
            }
            RxAction::AcceptDir => match queued(r.accept_directory(), &mut r) {
                Ok(msg) => {
                    prop_assert_eq!(before, AwaitDecision);
                    prop_assert!(m.offer.as_ref().is_some_and(Hello::is_directory));
                    prop_assert_eq!(msg, Message::Ack(Ack::new(AckStatus::Ok, "")));
                    prop_assert_eq!(r.state(), AwaitHello);
                    refused = 0;
                    RX.hit(3);
                    m = RxModel {
                        files: m.files,
                        ..m.session_wide()
                    };
                }
                Err(_) => prop_assert_eq!(r.state(), before),
            },
            RxAction::WouldReceive => {
                let answering = before == AwaitDecision
                    && dry(&m)
                    && m.batch_files == 0
                    && !m.offer.as_ref().is_some_and(Hello::is_directory);
                match queued(r.would_receive(), &mut r) {
                    Ok(msg) => {
                        prop_assert!(answering, "would_receive in {:?}", before);
                        prop_assert_eq!(msg, Message::Ack(Ack::new(AckStatus::WouldReceive, "")));
                        prop_assert_eq!(r.state(), AwaitHello);
                        refused = 0;
                        RX.hit(15);
                        m = RxModel {
                            files: m.files,
                            ..m.session_wide()
                        };
                    }
                    Err(_) => {
                        prop_assert!(!answering, "a dry run not answered");
                        prop_assert_eq!(r.state(), before);
                    }
                }
            }
            RxAction::Existing(found) => {
                let offer = m.offer.clone();
                let found = match (&offer, found) {
                    // Something that is no regular file.
                    (Some(_), Some((2, _))) => Existing::Other,
                    (Some(h), Some((dsize, dsecs))) => {
                        let t = h.mtime.unwrap_or(Mtime { secs: 0, nanos: 0 });
                        Existing::File {
                            size: h.size.wrapping_add(u64::from(dsize)),
                            secs: t.secs.wrapping_add(i64::from(dsecs)),
                            nsec: i64::from(t.nanos),
                        }
                    }
                    _ => Existing::NoFile,
                };
                let deciding = before == AwaitDecision
                    && plain_file(&m)
                    && m.have.is_none()
                    && !m.existing_decided;
                // rsync's rules, in order.
                let want = offer.as_ref().map(|h| {
                    let flag = |f: u32| h.caps & f != 0;
                    let (size, secs) = match found {
                        Existing::File { size, secs, .. } => (size, secs),
                        Existing::Other if flag(hello_flags::IGNORE_EXISTING) => {
                            return Standing::Stays(AckStatus::KeptExisting);
                        }
                        Existing::Other | Existing::NoFile => return Standing::Proceed,
                    };
                    let t = h.mtime.map(|t| t.secs);
                    if flag(hello_flags::IGNORE_EXISTING) {
                        Standing::Stays(AckStatus::KeptExisting)
                    } else if flag(hello_flags::UPDATE) && t.is_some_and(|t| secs > t) {
                        Standing::Stays(AckStatus::KeptNewer)
                    } else if size != h.size {
                        Standing::Proceed
                    } else if flag(hello_flags::CHECKSUM)
                        && within_budget(&m, cfg.digest_budget, size)
                        && !m.compared.contains(&h.name)
                    {
                        Standing::Compare
                    } else if !flag(hello_flags::IGNORE_TIMES) && t == Some(secs) {
                        Standing::Stays(AckStatus::Unchanged)
                    } else {
                        Standing::Proceed
                    }
                });
                match r.existing(found) {
                    Ok(standing) => {
                        prop_assert!(deciding, "existing in {:?}", before);
                        m.existing_decided = true;
                        prop_assert_eq!(Some(standing), want, "{:?} for {:?}", found, offer);
                        match standing {
                            Standing::Stays(status) => {
                                prop_assert_eq!(
                                    replies(&mut r),
                                    vec![Message::Ack(Ack::new(status, ""))]
                                );
                                prop_assert_eq!(r.state(), AwaitHello);
                                refused = 0;
                                RX.hit(14);
                                m = RxModel {
                                    files: m.files,
                                    ..m.session_wide()
                                };
                            }
                            Standing::Compare => {
                                prop_assert!(replies(&mut r).is_empty());
                                prop_assert_eq!(r.state(), AwaitDecision);
                                m.compare_existing = true;
                            }
                            Standing::Proceed => {
                                prop_assert!(replies(&mut r).is_empty());
                                prop_assert_eq!(r.state(), AwaitDecision);
                            }
                        }
                    }
                    Err(_) => {
                        prop_assert!(!deciding, "existing refused in {:?}", before);
                        prop_assert!(replies(&mut r).is_empty());
                        prop_assert_eq!(r.state(), before);
                    }
                }
            }
            RxAction::RefuseBatchForLink(i) => {
                let member = format!("b/{i}");
                let deciding = before == AwaitDecision && m.batch_files > 0;
                match r.refuse_batch_for_link(&member) {
                    Ok(refusal) => {
                        prop_assert!(deciding, "a batch refused in {:?}", before);
                        refused += 1;
                        prop_assert_eq!(refusal.code, RejectCode::Exists);
                        prop_assert!(refusal.reason.starts_with(&member));
                        prop_assert_eq!(replies(&mut r), vec![Message::Reject(refusal)]);
                        prop_assert_eq!(r.state(), AwaitHello);
                        m = RxModel {
                            files: m.files,
                            ..m.session_wide()
                        };
                    }
                    Err(_) => {
                        prop_assert!(!deciding, "a batch not refused");
                        prop_assert!(replies(&mut r).is_empty());
                        prop_assert_eq!(r.state(), before);
                    }
                }
            }
            RxAction::Reject(code) => match queued(r.reject(code, "no".into()), &mut r) {
                Ok(msg) => {
                    refused += 1;
                    prop_assert_eq!(before, AwaitDecision);
                    prop_assert!(matches!(msg, Message::Reject(_)));
                    prop_assert_eq!(r.state(), AwaitHello);
                    m = RxModel {
                        files: m.files,
                        ..m.session_wide()
                    };
                }
                Err(_) => prop_assert_eq!(r.state(), before),
            },
            RxAction::PushResult(how) => {
                let good = HopResult::new(
                    format!("h{}:7471", m.results),
                    HopVerdict::Ack(AckStatus::Ok),
                    m.bytes,
                    "",
                );
                let result = match how {
                    1 => HopResult {
                        host: String::new(),
                        ..good
                    },
                    2 => HopResult {
                        host: "a b".into(),
                        ..good
                    },
                    3 => HopResult {
                        reason: "r".repeat(rdma_xfer::proto::wire::MAX_REASON + 1),
                        ..good
                    },
                    _ => good,
                };
                // Only in a relaying session, while an offer is open, once
                // per host of the chain, and only one RESULT can carry.
                let allowed = how == 0
                    && m.relay_hops > 0
                    && offer_open(before)
                    && m.results < m.relay_hops + 1;
                match queued(r.push_result(result.clone()), &mut r) {
                    Ok(msg) => {
                        prop_assert!(allowed, "RESULT {:?} queued in {:?}", result, before);
                        prop_assert_eq!(msg, Message::Result(result));
                        m.results += 1;
                        RX_RELAY.hit(1);
                    }
                    Err(_) => prop_assert!(!allowed, "RESULT refused in {:?}", before),
                }
                prop_assert_eq!(r.state(), before);
                prop_assert_eq!(r.is_relaying(), m.relay_hops > 0);
            }
            RxAction::ChunkDone => {
                r.chunk_done();
                let credit = at_most_one(&mut r);
                if m.unconsumed > 0 {
                    m.unconsumed -= 1;
                    m.pending += 1;
                }
                if let Some(msg) = credit {
                    let Message::Credit { count } = msg else {
                        return Err(TestCaseError::fail("chunk_done returned a non-CREDIT"));
                    };
                    prop_assert_eq!(before, Receiving);
                    prop_assert!(count > 0 && u64::from(count) <= m.pending);
                    m.pending -= u64::from(count);
                }
            }
            RxAction::Flush => {
                r.flush_credits();
                if let Some(msg) = at_most_one(&mut r) {
                    let Message::Credit { count } = msg else {
                        return Err(TestCaseError::fail("flush_credits returned a non-CREDIT"));
                    };
                    prop_assert_eq!(before, Receiving);
                    prop_assert!(count > 0 && u64::from(count) <= m.pending);
                    m.pending -= u64::from(count);
                }
            }
            RxAction::Complete(status) => match queued(r.complete(status, "why".into()), &mut r) {
                Ok(msg) => {
                    prop_assert!(matches!(msg, Message::Ack(_)));
                    match before {
                        Verifying => {
                            prop_assert_eq!(r.state(), AwaitHello);
                            RX.hit(3);
                        }
                        Receiving | AwaitDecision => {
                            prop_assert!(status != AckStatus::Ok);
                            prop_assert_eq!(r.state(), Closed);
                        }
                        other => {
                            return Err(TestCaseError::fail(format!("complete() in {other:?}")));
                        }
                    }
                    m = RxModel {
                        files: m.files,
                        ..m.session_wide()
                    };
                }
                Err(_) => prop_assert_eq!(r.state(), before),
            },
        }
        // Closed is final.
        if before == Closed {
            prop_assert_eq!(r.state(), Closed);
        }
        // A closed session gives back the file it held, once.
        if r.state() == Closed {
            prop_assert_eq!(r.take_file(), file_token.take());
            prop_assert_eq!(r.take_file(), None);
        }
    }
    Ok(())
}

/// What an accepted name never is, said without `validate_path`: a
/// dotfile (unless allowed), one of the receiver's own names in any case,
/// or one with an invisible character.
pub(crate) fn check_accepted_name(name: &str, rules: NameRules) -> Result<(), TestCaseError> {
    for c in name.split('/') {
        prop_assert!(
            rules.allow_dotfiles || !c.starts_with('.'),
            "accepted dotfile {:?}",
            name
        );
        prop_assert!(
            !c.to_ascii_lowercase().starts_with(".rdma-xfer-"),
            "accepted reserved {:?}",
            name
        );
    }
    prop_assert!(
        !name.chars().any(is_invisible),
        "accepted invisible {:?}",
        name
    );
    Ok(())
}

#[test]
pub(crate) fn machine_receiver() {
    let cfg = (
        (
            1u32..64,
            1u32..8,
            0u32..10,
            prop_oneof![3 => Just(u64::MAX), 1 => 0u64..300],
            prop_oneof![3 => Just(DEFAULT_MAX_FILES), 1 => 1u64..4],
            any::<bool>(),
        ),
        (
            prop_oneof![
                1 => Just(DigestBudget::DEFAULT),
                3 => (0u32..4, 0u64..600).prop_map(|(questions, bytes)| DigestBudget { questions, bytes }),
            ],
            prop_oneof![
                1 => Just(Duration::from_secs(30)),
                2 => (0u64..20_000).prop_map(Duration::from_millis),
            ],
            // Most receivers relay.
            prop_oneof![3 => Just(true), 1 => Just(false)],
        ),
    )
        .prop_map(
            |(
                (slot_size, slot_count, credit_batch, max_size, max_files, allow_dotfiles),
                (digest_budget, timeout, relay_allowed),
            )| {
                ReceiverConfig {
                    slot_size,
                    slot_count,
                    credit_batch,
                    max_size,
                    max_files,
                    max_session_bytes: u64::MAX,
                    names: NameRules { allow_dotfiles },
                    digest_budget,
                    timeout,
                    relay_allowed,
                }
            },
        );
    let strategy = (cfg, auth_key(), sequence(rx_action(), RxAction::Legal, 300));
    fuzz(
        "machine_receiver",
        strategy,
        |(_, _, a)| a.len() as u64,
        |(cfg, key, actions)| check_receiver(cfg, key, actions),
        || {
            format!(
                "{} AUTHs verified ({} of them refused as busy), {} offers accepted ({} resuming \
                 a prefix), {} chunks placed, {} FINs verified, {} files acknowledged, {} \
                 copies compared ({} the same), {} batches passed, {} digests asked ({} the \
                 same), {} digest questions past the budget refused ({} about a name compared \
                 already), {} files left as they were, {} dry-run offers answered; {} \
                 KEEPALIVEs while the engine worked, {} sessions timed out, {} early wakes; {} \
                 RELAYs taken ({} refused by a receiver that does not relay), {} RESULTs queued, \
                 {} waits for the hosts after it ({} KEEPALIVEs due)",
                RX.get(4) + RX.get(6),
                RX.get(6),
                RX.get(0),
                RX.get(5),
                RX.get(1),
                RX.get(2),
                RX.get(3),
                RX.get(7),
                RX.get(8),
                RX.get(9),
                RX.get(10),
                RX.get(11),
                RX.get(12),
                RX.get(13),
                RX.get(14),
                RX.get(15),
                RX_TIMERS.get(0),
                RX_TIMERS.get(1),
                RX_TIMERS.get(2),
                RX_RELAY.get(0),
                RX_RELAY.get(2),
                RX_RELAY.get(1),
                RX_RELAY.get(3),
                RX_RELAY.get(4)
            )
        },
    );
}
