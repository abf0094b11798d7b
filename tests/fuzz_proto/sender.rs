//! (c) The sender machine against its model (`TxModel`).

use super::receiver::comparable;
use super::strategies::*;
use super::*;
use rdma_xfer::proto::{Waiting, keepalive_interval};
use std::time::Duration;

/// Every fuzzed session's receive timeout (its keepalive: 500 ms).
const TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Debug, Clone)]
pub(crate) enum TxAction {
    /// What a well-behaved engine / receiver pair would do next; in a
    /// closed session, start a new one.
    Legal(u32),
    Start {
        size: u64,
        digest: DigestAlg,
        kind: OfferKind,
    },
    Msg(Message),
    /// A credit returning some of the slots in use (mostly legal).
    CreditLike(u32),
    /// The ACK the receiver would send now.
    AckLike(AckStatus),
    /// A HAVE that fits the current offer, wherever it comes: 0 nothing,
    /// 1 a complete copy, 2 a request for the digest.
    HaveLike(u8),
    NextChunk(u8),
    /// A stream chunk of this many bytes (0: a full chunk).
    StreamChunk(u32),
    Finish(Option<DigestAlg>),
    /// A KEEPALIVE, wherever it is asked for.
    Keepalive,
    Close,
    /// Small files offered together (BATCH): their sizes, one digest (or,
    /// now and then, a second one for the last file).
    StartBatch(Vec<u64>, DigestAlg, Option<DigestAlg>),
    /// The engine's answer to a HAVE, as the seed picks: FROM 0 or the
    /// prefix, COMPARE (its SHA-256) for a complete copy; now and then one
    /// that does not fit (FROM past the prefix, FROM of a complete copy's
    /// size, COMPARE of no complete copy).
    From(u32),
    /// The engine waits on the receiver (`peer`) or its own input, maybe
    /// hears from the link, and the clock advances `ms` (synthetic
    /// instants): the machine's timers.
    Clock {
        peer: bool,
        heard: bool,
        ms: u16,
    },
    /// The engine names the hosts after the receiver (`relay`): this many
    /// (0: none, past MAX_RELAY_HOPS: too many), each good, or one of them
    /// not (`bad`).
    Relay {
        hops: usize,
        bad: bool,
    },
    /// The RESULT a relaying receiver would send now.
    ResultLike,
}

pub(crate) fn offer_kind() -> impl Strategy<Value = OfferKind> {
    prop_oneof![
        3 => Just(OfferKind::File),
        1 => Just(OfferKind::Stream),
        1 => Just(OfferKind::Directory),
    ]
}

pub(crate) fn tx_action() -> impl Strategy<Value = TxAction> {
    let start = (
        prop_oneof![4 => 0u64..300, 1 => size()],
        digest_alg(),
        offer_kind(),
    )
        .prop_map(|(size, digest, kind)| TxAction::Start { size, digest, kind });
    let ack = prop_oneof![3 => Just(AckStatus::Ok), 1 => ack_status()];
    let finish = prop_oneof![4 => Just(None), 1 => digest_alg().prop_map(Some)];
    let batch = (
        proptest::collection::vec(prop_oneof![4 => 0u64..100, 1 => size()], 0..5),
        digest_alg(),
        prop_oneof![4 => Just(None), 1 => digest_alg().prop_map(Some)],
    )
        .prop_map(|(sizes, d, other)| TxAction::StartBatch(sizes, d, other));
    prop_oneof![
        2 => start,
        1 => batch,
        3 => message().prop_map(TxAction::Msg),
        2 => ring().prop_map(|r| TxAction::Msg(Message::Mr(r))),
        3 => (0u32..10).prop_map(TxAction::CreditLike),
        2 => ack.prop_map(TxAction::AckLike),
        1 => (0u8..3).prop_map(TxAction::HaveLike),
        6 => (1u8..20).prop_map(TxAction::NextChunk),
        3 => prop_oneof![3 => Just(0u32), 1 => 0u32..100].prop_map(TxAction::StreamChunk),
        2 => finish.prop_map(TxAction::Finish),
        1 => Just(TxAction::Close),
        1 => Just(TxAction::Keepalive),
        1 => any::<u32>().prop_map(TxAction::From),
        3 => (any::<bool>(), 0u8..4, prop_oneof![2 => 0u16..800, 1 => 0u16..4000]).prop_map(
            |(peer, heard, ms)| TxAction::Clock {
                peer,
                heard: heard == 0,
                ms
            }
        ),
        1 => (
            prop_oneof![
                6 => 1usize..4,
                1 => Just(0usize),
                1 => MAX_RELAY_HOPS - 1..=MAX_RELAY_HOPS + 1
            ],
            prop_oneof![5 => Just(false), 1 => Just(true)]
        )
            .prop_map(|(hops, bad)| TxAction::Relay { hops, bad }),
        2 => Just(TxAction::ResultLike),
    ]
}

#[derive(Default)]
pub(crate) struct TxModel {
    size: u64,
    stream: bool,
    /// A stream's short chunk was planned.
    short: bool,
    digest: DigestAlg,
    /// The last ring granted: a finished file's late credits count against
    /// it until the next MR.
    ring: Option<RingInfo>,
    credits: u64,
    planned: u64,
    chunks: u64,
    /// Entries awaiting their verdict, oldest first, and their tags.
    pending: VecDeque<Pending>,
    tags: VecDeque<u64>,
    /// The tag of the next entry, and of the file being sent.
    next_tag: u64,
    tag: u64,
    /// The file being sent was offered without its tag (`offer_file`,
    /// `offer_batch`): only its FIN gives it (`finish_carrying`).
    tag_at_fin: bool,
    /// What the real receiver answers to our PROVE (with a token).
    auth_ok: Option<Message>,
    /// The HAVE answering the current offer (with RESUME or CHECKSUM),
    /// and the resumed prefix's chunk length (0: not resuming).
    have: Option<Have>,
    base_len: u32,
    /// The SHA-256 the current file's COMPARE carried.
    compared: Option<[u8; 32]>,
    /// The current file was offered with CHECKSUM.
    checksum: bool,
    /// The current offer's HELLO flags, and whether it is a batch: what
    /// the receiver may answer without data (ACK unchanged, kept).
    caps: u32,
    batch: bool,
    /// The session is a dry run's (`SenderSession::dry_run`).
    dry_run: bool,
    /// Bytes of a chunk's tag after it: `CHUNK_TAG_LEN` once the receiver
    /// proved the token.
    tag_len: u32,
    /// Hosts after the receiver that RELAY named (0: not relaying).
    relay_hops: usize,
    /// An entry was offered in the session: no RELAY after it.
    offered: bool,
    /// RESULTs heard for the oldest unanswered offer.
    results: usize,
}

/// The sender's offers: a file with CHECKSUM (`--checksum`) now and then;
/// streams and directories get the same option and must drop it.
pub(crate) fn tx_checksum(size: u64) -> bool {
    size % 3 == 1
}

/// The sender's rule for a file the receiver has: now and then one of
/// --ignore-times, --ignore-existing, --update (streams and directories
/// get it too and must drop it).
pub(crate) fn tx_existing(size: u64) -> WhenExisting {
    match size % 7 {
        4 => WhenExisting::IgnoreTimes,
        5 => WhenExisting::IgnoreExisting,
        6 => WhenExisting::Update,
        _ => WhenExisting::QuickCheck,
    }
}

/// An offer awaits its verdict in `state` (the current one, or a pending
/// one): a relaying receiver's RESULTs and KEEPALIVEs may come.
pub(crate) fn verdict_awaited(state: SenderState, front: Option<Pending>) -> bool {
    use SenderState::*;
    !matches!(state, AwaitChallenge | AwaitAuthOk | Closed) && (state != Idle || front.is_some())
}

pub(crate) static TX: Reached = Reached::new();
/// Relaying: 0 RELAYs queued, 1 RESULTs heard, 2 KEEPALIVEs taken only
/// because the session relays.
pub(crate) static TX_RELAY: Reached = Reached::new();

/// The legal next step in state `state`.
pub(crate) fn legal_tx(state: SenderState, m: &TxModel, seed: u32) -> TxAction {
    use SenderState::*;
    let front = m.pending.front().copied();
    let awaited = verdict_awaited(state, front);
    match state {
        // A relaying receiver's RESULTs, before each verdict, one per host.
        // (Now and then one too many: the session ends.)
        _ if m.relay_hops > 0
            && awaited
            && (m.results <= m.relay_hops || seed % 12 == 1)
            && seed % 4 == 1 =>
        {
            TxAction::ResultLike
        }
        // A relaying receiver waits for the hosts after it (KEEPALIVE).
        // (Now and then with no offer awaiting its verdict: misuse.)
        _ if m.relay_hops > 0 && state != Closed && (awaited || seed % 5 == 2) && seed % 9 == 7 => {
            TxAction::Msg(Message::Keepalive)
        }
        // With a token, the hosts after the receiver, before any offer.
        Idle if m.tag_len > 0 && m.relay_hops == 0 && !m.offered && seed % 3 == 2 => {
            TxAction::Relay {
                hops: if seed % 24 == 5 {
                    MAX_RELAY_HOPS
                } else {
                    1 + (seed / 3 % 3) as usize
                },
                bad: false,
            }
        }
        AwaitChallenge => TxAction::Msg(Message::Challenge(Challenge {
            flags: if seed.is_multiple_of(8) {
                0
            } else {
                AUTH_REQUIRED
            },
            nonce: [seed as u8; NONCE_LEN],
        })),
        AwaitAuthOk => TxAction::Msg(
            m.auth_ok
                .clone()
                .unwrap_or(Message::AuthOk { proof: [0; 32] }),
        ),
        // Verdicts on pending entries come first, whenever the receiver sends them.
        Idle | AwaitRing | AwaitHave | AwaitCompared
            if front.is_some() && (seed.is_multiple_of(2) || state != Idle) =>
        {
            match front {
                Some(Pending::Directory) if seed.is_multiple_of(5) => {
                    TxAction::Msg(Message::Reject(Reject::new(RejectCode::Exists, "a file")))
                }
                Some(Pending::File)
                    if seed.is_multiple_of(7)
                        && m.ring.is_some_and(|r| u64::from(r.slot_count) > m.credits) =>
                {
                    TxAction::CreditLike(seed)
                }
                _ if seed.is_multiple_of(10) => TxAction::AckLike(AckStatus::Io),
                _ => TxAction::AckLike(AckStatus::Ok),
            }
        }
        Idle if m.pending.len() >= MAX_PENDING => TxAction::AckLike(AckStatus::Ok),
        Idle if seed % 7 == 6 => TxAction::StartBatch(
            (0..1 + seed % 4)
                .map(|i| u64::from((seed / 7 + i * 13) % 300))
                .collect(),
            DigestAlg::Sha256,
            None,
        ),
        Idle => TxAction::Start {
            size: u64::from(seed % 300),
            digest: if seed.is_multiple_of(3) {
                DigestAlg::Sha256
            } else {
                DigestAlg::Crc32
            },
            kind: match seed % 5 {
                0 => OfferKind::Stream,
                1 => OfferKind::Directory,
                _ => OfferKind::File,
            },
        },
        AwaitRing if seed.is_multiple_of(6) => {
            TxAction::Msg(Message::Reject(Reject::new(RejectCode::Exists, "exists")))
        }
        // A dry run gets no ring: the receiver would receive the offer.
        AwaitRing if m.dry_run && front.is_none() && seed % 4 != 3 => {
            TxAction::AckLike(AckStatus::WouldReceive)
        }
        // The receiver has the file: it stays (a file alone only).
        AwaitRing | AwaitHave if front.is_none() && !m.stream && !m.batch && seed % 11 == 10 => {
            TxAction::AckLike(AckStatus::Unchanged)
        }
        // An offer with CHECKSUM may be asked for its digest (once).
        AwaitRing if m.checksum && m.have.is_none() && seed % 3 == 1 => {
            TxAction::Msg(Message::Have(Have::ask_digest(m.size)))
        }
        // After FROM the receiver reads nothing: a KEEPALIVE there is a
        // receiver's misuse (a protocol error).
        AwaitRing if seed.is_multiple_of(5) => TxAction::Msg(Message::Keepalive),
        AwaitHave if front.is_none() && seed.is_multiple_of(7) => TxAction::Msg(Message::Keepalive),
        AwaitHave => {
            let chunk_len = 1 + seed % 64;
            let chunks = m.size / u64::from(chunk_len);
            TxAction::Msg(Message::Have(match seed % 4 {
                3 if m.checksum => Have::ask_digest(m.size),
                1 if chunks > 1 => Have {
                    kind: HaveKind::Prefix,
                    bytes: u64::from(seed % chunks as u32 + 1).min(chunks - 1)
                        * u64::from(chunk_len),
                    chunk_len,
                    digest: Digest::Sha256([seed as u8; 32]),
                    note: String::new(),
                },
                2 => Have::complete(m.size),
                _ => Have::nothing("fuzz"),
            }))
        }
        AwaitFromDecision => TxAction::From(seed),
        // The receiver reads its copy (KEEPALIVE), then answers the
        // COMPARE: ACK (the same) or HAVE of nothing (it differs).
        AwaitCompared if seed.is_multiple_of(7) => TxAction::Msg(Message::Keepalive),
        AwaitCompared if seed.is_multiple_of(2) => TxAction::AckLike(AckStatus::Ok),
        AwaitCompared => TxAction::Msg(Message::Have(Have::nothing("the receiver's copy differs"))),
        AwaitRing => TxAction::Msg(Message::Mr(RingInfo {
            addr: u64::from(seed) << 12,
            rkey: seed,
            slot_size: m.tag_len + 1 + seed % 64,
            slot_count: 1 + (seed / 64) % 8,
        })),
        Sending if m.stream && m.credits > 0 && !m.short && !seed.is_multiple_of(8) => {
            TxAction::StreamChunk(if seed.is_multiple_of(5) { seed % 50 } else { 0 })
        }
        Sending if m.stream && seed.is_multiple_of(4) => TxAction::Finish(None),
        Sending if !m.stream && m.credits > 0 && m.planned < m.size => {
            TxAction::NextChunk(1 + (seed % 4) as u8)
        }
        Sending if !m.stream && m.planned == m.size && seed.is_multiple_of(2) => {
            TxAction::Finish(None)
        }
        Sending if m.ring.is_some_and(|r| u64::from(r.slot_count) > m.credits) => {
            TxAction::CreditLike(seed)
        }
        Sending => TxAction::Finish(None),
        Closed => TxAction::Legal(seed),
    }
}

pub(crate) fn check_sender(
    chunk_size: u32,
    secret: Option<Vec<u8>>,
    actions: Vec<TxAction>,
) -> Result<(), TestCaseError> {
    use SenderState::*;
    let token = secret.and_then(Token::new);
    // Now and then a dry run's session.
    let dry_run = chunk_size % 5 == 4;
    let new_session = || {
        let s = SenderSession::new(
            chunk_size,
            token.clone().map(|token| SenderAuth {
                token,
                nonce: S_NONCE,
                conn: test_conn(),
            }),
        )
        .with_timeout(TIMEOUT);
        if dry_run { s.dry_run() } else { s }
    };
    let new_model = || TxModel {
        dry_run,
        ..TxModel::default()
    };
    // The synthetic clock.
    let mut now = Instant::now();
    // Whether the receiver proved itself in this session.
    let mut proven = false;
    let mut s = new_session();
    let mut m = new_model();
    for action in actions {
        let action = match action {
            TxAction::Legal(seed) => match legal_tx(s.state(), &m, seed) {
                TxAction::Legal(_) => {
                    s = new_session();
                    m = new_model();
                    proven = false;
                    continue;
                }
                a => a,
            },
            a => a,
        };
        let before = s.state();
        let front = m.pending.front().copied();
        match action {
            TxAction::Legal(_) => unreachable!(),
            TxAction::StartBatch(sizes, digest, other) => {
                let n = sizes.len();
                let offers: Vec<FileOffer> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &size)| FileOffer {
                        name: format!("b/{i}"),
                        size,
                        mode: 0o644,
                        digest: match other {
                            Some(d) if i + 1 == n => d,
                            _ => digest,
                        },
                        kind: OfferKind::File,
                        mtime: None,
                        keep_mode: false,
                        resume: false,
                        checksum: tx_checksum(size),
                        existing: tx_existing(size),
                        piece: None,
                    })
                    .collect();
                let total = sizes.iter().try_fold(0u64, |t, &x| t.checked_add(x));
                let mixed = other.is_some_and(|d| d != digest) && n > 1;
                // The batch's digest is its files' (the first one's).
                let digest = offers.first().map_or(digest, |o| o.digest);
                let tag = m.next_tag;
                m.next_tag += 1;
                // Odd tags: the engine's way, the payload with the FIN.
                let at_fin = tag % 2 == 1;
                let started = if at_fin {
                    s.offer_batch(offers)
                } else {
                    s.start_batch(offers, tag)
                };
                match sent(started, &mut s) {
                    Ok(msg) => {
                        prop_assert_eq!(before, Idle);
                        prop_assert!(token.is_none() || proven, "BATCH before AUTH_OK");
                        prop_assert!(m.pending.len() < MAX_PENDING);
                        prop_assert!(n > 0 && !mixed, "a batch of {} files, mixed {}", n, mixed);
                        let Message::Batch(members) = msg else {
                            return Err(TestCaseError::fail("start_batch gave no BATCH"));
                        };
                        prop_assert_eq!(members.len(), n);
                        for (h, &size) in members.iter().zip(&sizes) {
                            let caps = if tx_checksum(size) {
                                hello_flags::CHECKSUM
                            } else {
                                0
                            } | match tx_existing(size) {
                                WhenExisting::IgnoreTimes => hello_flags::IGNORE_TIMES,
                                WhenExisting::IgnoreExisting => hello_flags::IGNORE_EXISTING,
                                // Without a time, no UPDATE.
                                WhenExisting::Update | WhenExisting::QuickCheck => 0,
                            };
                            prop_assert_eq!(
                                (h.size, h.caps, h.version),
                                (size, caps, PROTOCOL_VERSION)
                            );
                        }
                        prop_assert_eq!(s.state(), AwaitRing);
                        m.offered = true;
                        m.tag = tag;
                        m.tag_at_fin = at_fin;
                        m.have = None;
                        m.base_len = 0;
                        // A batch is never asked for digests, nor
                        // answered without data.
                        m.checksum = false;
                        m.caps = 0;
                        m.batch = true;
                        m.size = total.unwrap_or(u64::MAX);
                        m.stream = false;
                        m.short = false;
                        m.digest = digest;
                        m.planned = 0;
                        m.chunks = 0;
                        TX.hit(8);
                    }
                    Err(_) => {
                        prop_assert!(
                            before != Idle
                                || m.dry_run
                                || m.pending.len() >= MAX_PENDING
                                || n == 0
                                || mixed
                                || total.is_none(),
                            "a good batch refused"
                        );
                        prop_assert_eq!(s.state(), before);
                    }
                }
            }
            TxAction::Start { size, digest, kind } => {
                // Now and then a file offered for resuming (with its mtime).
                let resume = kind == OfferKind::File && size % 5 == 2;
                let offer = FileOffer {
                    name: "f".into(),
                    size,
                    mode: 0o644,
                    digest,
                    kind,
                    mtime: resume.then_some(Mtime { secs: 1, nanos: 2 }),
                    keep_mode: size % 2 == 1,
                    resume,
                    checksum: tx_checksum(size),
                    existing: tx_existing(size),
                    piece: None,
                };
                let checksum = kind == OfferKind::File && tx_checksum(size);
                // A rule for an existing file: files only, UPDATE only
                // with a time.
                let rule = match (kind, tx_existing(size)) {
                    (OfferKind::File, WhenExisting::IgnoreTimes) => hello_flags::IGNORE_TIMES,
                    (OfferKind::File, WhenExisting::IgnoreExisting) => hello_flags::IGNORE_EXISTING,
                    (OfferKind::File, WhenExisting::Update) if resume => hello_flags::UPDATE,
                    _ => 0,
                };
                // A dry run drops RESUME (its time stays) and says so.
                let dry = if m.dry_run { hello_flags::DRY_RUN } else { 0 };
                let resume_caps = match (resume, m.dry_run) {
                    (true, false) => hello_flags::RESUME | hello_flags::MTIME,
                    (true, true) => hello_flags::MTIME,
                    (false, _) => 0,
                } | if checksum { hello_flags::CHECKSUM } else { 0 }
                    | rule
                    | dry;
                let tag = m.next_tag;
                m.next_tag += 1;
                // Odd tags: the engine's way, the payload with the FIN; a
                // directory, answered before any FIN, is refused so.
                let at_fin = tag % 2 == 1;
                if at_fin && kind == OfferKind::Directory {
                    let mut refused = s.clone();
                    prop_assert!(refused.offer_file(offer.clone()).is_err());
                    prop_assert!(refused.poll_transmit().is_none(), "a refused offer sent");
                }
                let started = if at_fin && kind != OfferKind::Directory {
                    s.offer_file(offer)
                } else {
                    s.start_file(offer, tag)
                };
                match sent(started, &mut s) {
                    Ok(msg) => {
                        prop_assert_eq!(before, Idle);
                        // With a token: no name, no size before AUTH_OK.
                        prop_assert!(token.is_none() || proven, "HELLO before AUTH_OK");
                        prop_assert!(m.pending.len() < MAX_PENDING);
                        let Message::Hello(h) = msg else {
                            return Err(TestCaseError::fail("start_file gave no HELLO"));
                        };
                        prop_assert!(encode_to_vec(&Message::Hello(h.clone())).is_ok());
                        m.offered = true;
                        match kind {
                            // -p (keep_mode) sets its flag.
                            OfferKind::File if size % 2 == 1 => {
                                let caps = hello_flags::KEEP_MODE | resume_caps;
                                let want = (size, caps, PROTOCOL_VERSION);
                                prop_assert_eq!((h.size, h.caps, h.version), want);
                            }
                            OfferKind::File => {
                                prop_assert_eq!(
                                    (h.size, h.caps, h.version),
                                    (size, resume_caps, PROTOCOL_VERSION)
                                );
                            }
                            OfferKind::Stream => {
                                prop_assert_eq!(h.size, 0);
                                prop_assert!(h.is_stream() && h.version == PROTOCOL_VERSION);
                                prop_assert_eq!(
                                    h.caps & !hello_flags::KEEP_MODE,
                                    hello_flags::STREAM | dry
                                );
                            }
                            OfferKind::Directory => {
                                prop_assert_eq!(h.size, 0);
                                prop_assert!(h.is_directory() && h.version == PROTOCOL_VERSION);
                                prop_assert_eq!(
                                    h.caps & !hello_flags::KEEP_MODE,
                                    hello_flags::DIRECTORY | dry
                                );
                            }
                        }
                        if kind == OfferKind::Directory {
                            // No ring for a directory: its answer is pending.
                            prop_assert_eq!(s.state(), Idle);
                            m.pending.push_back(Pending::Directory);
                            m.tags.push_back(tag);
                        } else {
                            m.tag = tag;
                            m.tag_at_fin = at_fin;
                            let next = if resume && !m.dry_run {
                                AwaitHave
                            } else {
                                AwaitRing
                            };
                            prop_assert_eq!(s.state(), next);
                            m.have = None;
                            m.base_len = 0;
                            m.checksum = checksum;
                            m.caps = h.caps;
                            m.batch = false;
                            m.size = if kind == OfferKind::File { size } else { 0 };
                            m.stream = kind == OfferKind::Stream;
                            m.short = false;
                            m.digest = digest;
                            m.planned = 0;
                            m.chunks = 0;
                        }
                    }
                    Err(_) => prop_assert_eq!(s.state(), before),
                }
            }
            TxAction::Relay { hops, bad } => {
                let mut list: Vec<String> = (0..hops).map(|i| format!("h{i}:7471")).collect();
                if bad && let Some(last) = list.last_mut() {
                    *last = match hops % 3 {
                        0 => String::new(),
                        1 => "a b".into(),
                        _ => "h".repeat(MAX_HOST_LEN + 1),
                    };
                }
                // Once, after the receiver's proof, before any offer, a
                // list RELAY can carry.
                let allowed = before == Idle
                    && proven
                    && m.relay_hops == 0
                    && !m.offered
                    && !bad
                    && (1..=MAX_RELAY_HOPS).contains(&hops);
                let result = s.relay(&list);
                let queued: Vec<Message> = std::iter::from_fn(|| s.poll_transmit()).collect();
                match result {
                    Ok(()) => {
                        prop_assert!(allowed, "RELAY of {} hosts in {:?}", hops, before);
                        // In order, as few messages as fit a frame each.
                        let want: Vec<Message> = relay_messages(&list)
                            .map_err(|e| TestCaseError::fail(e.to_string()))?
                            .into_iter()
                            .map(Message::Relay)
                            .collect();
                        prop_assert_eq!(queued, want);
                        m.relay_hops = hops;
                        TX_RELAY.hit(0);
                    }
                    Err(e) => {
                        prop_assert!(!allowed, "RELAY refused: {}", e);
                        prop_assert!(queued.is_empty(), "a refused RELAY queued {:?}", queued);
                    }
                }
                prop_assert_eq!(s.state(), before);
                prop_assert_eq!(s.is_relaying(), m.relay_hops > 0);
            }
            TxAction::Msg(_)
            | TxAction::CreditLike(_)
            | TxAction::AckLike(_)
            | TxAction::HaveLike(_)
            | TxAction::ResultLike => {
                let msg = match action {
                    TxAction::Msg(msg) => msg,
                    TxAction::ResultLike => Message::Result(HopResult::new(
                        format!("h{}:7471", m.results),
                        HopVerdict::Ack(AckStatus::Ok),
                        m.planned,
                        "",
                    )),
                    TxAction::CreditLike(k) => {
                        let in_use = m
                            .ring
                            .map_or(0, |r| u64::from(r.slot_count).saturating_sub(m.credits));
                        Message::Credit {
                            count: if in_use == 0 {
                                k
                            } else {
                                (u64::from(k) % in_use + 1) as u32
                            },
                        }
                    }
                    TxAction::AckLike(status) => Message::Ack(Ack::new(status, "r")),
                    TxAction::HaveLike(kind) => Message::Have(match kind {
                        0 => Have::nothing("r"),
                        1 => Have::complete(m.size),
                        _ => Have::ask_digest(m.size),
                    }),
                    _ => unreachable!(),
                };
                let kind = msg.kind();
                let sent = msg.clone();
                let result = s.on_message(msg);
                // A RESULT is taken only in a relaying session while an
                // offer awaits its verdict, one per host of the chain.
                let awaited = verdict_awaited(before, front);
                if let Message::Result(r) = &sent {
                    let taken = m.relay_hops > 0 && awaited && m.results < m.relay_hops + 1;
                    match &result {
                        Ok(SenderEvent::HopResult(got)) => {
                            prop_assert!(taken, "RESULT taken in {:?}", before);
                            prop_assert_eq!(got, r);
                            prop_assert_eq!(s.state(), before);
                            m.results += 1;
                            TX_RELAY.hit(1);
                        }
                        Ok(other) => {
                            return Err(TestCaseError::fail(format!("RESULT gave {other:?}")));
                        }
                        Err(_) => prop_assert!(!taken, "RESULT refused in {:?}", before),
                    }
                }
                // A RESULT before each verdict: the count starts over.
                if matches!(
                    result,
                    Ok(SenderEvent::Rejected(_)
                        | SenderEvent::Same { .. }
                        | SenderEvent::Settled(_)
                        | SenderEvent::Answered { .. }
                        | SenderEvent::Aborted(_))
                ) {
                    m.results = 0;
                }
                // One engine decision at a time (src/proto/mod.rs): a HAVE
                // leaves the machine waiting for the engine's answer
                // (`start_from` or `compare`), and while it waits no message
                // asks for more (neither another HAVE nor an MR).
                if matches!(result, Ok(SenderEvent::Have(_))) {
                    prop_assert_eq!(s.state(), AwaitFromDecision);
                }
                if before == AwaitFromDecision {
                    prop_assert!(
                        !matches!(result, Ok(SenderEvent::Have(_) | SenderEvent::Ring(_))),
                        "a second decision asked: {:?}",
                        result
                    );
                }
                if before == Closed {
                    prop_assert!(result.is_err(), "a closed session accepted {}", kind);
                }
                // A KEEPALIVE is taken only while the receiver reads its
                // copy (before the HAVE, after COMPARE), everything earlier
                // answered, or, in a relaying session, while an offer awaits
                // its verdict (the receiver waits for the hosts after it);
                // anywhere else (after FROM, say) it ends the session.
                if sent == Message::Keepalive {
                    let reading = matches!(before, AwaitHave | AwaitCompared) && front.is_none();
                    let relaying = m.relay_hops > 0 && awaited;
                    prop_assert_eq!(
                        result.is_ok(),
                        reading || relaying,
                        "KEEPALIVE in {:?} (relaying: {})",
                        before,
                        m.relay_hops > 0
                    );
                    if relaying && !reading {
                        TX_RELAY.hit(2);
                    }
                }
                // After COMPARE (earlier entries answered): ACK(ok) is the
                // file's verdict, a HAVE of nothing starts over, KEEPALIVE
                // while the receiver reads; any other HAVE ends the session.
                if before == AwaitCompared && front.is_none() {
                    match &sent {
                        Message::Ack(a) if a.status == AckStatus::Ok => {
                            prop_assert!(
                                matches!(result, Ok(SenderEvent::Same { .. })),
                                "{:?}",
                                result
                            )
                        }
                        Message::Have(h) => prop_assert_eq!(
                            result.is_ok(),
                            h.kind == HaveKind::Nothing && h.fits(m.size),
                            "{:?} gave {:?}",
                            h,
                            result
                        ),
                        Message::Keepalive => {
                            prop_assert_eq!(&result, &Ok(SenderEvent::Keepalive))
                        }
                        _ => {}
                    }
                }
                // Waiting for the answer to the HELLO: a HAVE is taken only
                // if it fits, and only the kinds the offer allows (Digest
                // for CHECKSUM, once; the others for RESUME).
                if let (AwaitRing | AwaitHave, None, Message::Have(h)) = (before, front, &sent) {
                    let offered = match (before, h.kind) {
                        // With CHECKSUM, once: the digest, or a complete
                        // copy under the name compared.
                        (AwaitRing, HaveKind::Digest | HaveKind::Complete) => {
                            m.checksum && m.have.is_none()
                        }
                        (AwaitRing, _) => false,
                        (_, HaveKind::Digest) => m.checksum,
                        _ => true,
                    };
                    prop_assert_eq!(
                        result.is_ok(),
                        offered && h.fits(m.size),
                        "{:?} in {:?} (CHECKSUM {}) gave {:?}",
                        h,
                        before,
                        m.checksum,
                        result
                    );
                }
                // A verdict without data answers the HELLO of a file alone
                // (once earlier entries are answered), and says "kept" only
                // as the offer asked; never a FIN's verdict.
                if let Message::Ack(a) = &sent
                    && a.status.without_data()
                {
                    let asked = match a.status {
                        AckStatus::KeptExisting => m.caps & hello_flags::IGNORE_EXISTING != 0,
                        AckStatus::KeptNewer => m.caps & hello_flags::UPDATE != 0,
                        // A dry run's stream too.
                        AckStatus::WouldReceive => m.dry_run,
                        _ => !m.stream,
                    };
                    let answering =
                        matches!(before, AwaitRing | AwaitHave) && front.is_none() && !m.batch;
                    prop_assert_eq!(
                        result.is_ok(),
                        answering && asked,
                        "{:?} in {:?} gave {:?}",
                        a,
                        before,
                        result
                    );
                }
                match result {
                    Ok(SenderEvent::Settled(a)) => {
                        prop_assert!(matches!(before, AwaitRing | AwaitHave));
                        prop_assert!(m.pending.is_empty());
                        prop_assert_eq!(Message::Ack(a), sent);
                        prop_assert_eq!(s.state(), Idle);
                        prop_assert_eq!(s.pending(), 0);
                        m.planned = m.size;
                        TX.hit(13);
                    }
                    Ok(SenderEvent::Greeted(g)) => {
                        prop_assert_eq!(before, AwaitChallenge);
                        let Message::Challenge(c) = sent else {
                            return Err(TestCaseError::fail(format!("greeted by {kind}")));
                        };
                        if c.auth_required() {
                            prop_assert_eq!(s.state(), AwaitAuthOk);
                            prop_assert!(g.proving);
                            let sent = std::iter::from_fn(|| s.poll_transmit()).collect::<Vec<_>>();
                            let [Message::Prove(p)] = &sent[..] else {
                                return Err(TestCaseError::fail("no PROVE"));
                            };
                            let p = p.clone();
                            prop_assert_eq!(p.version, PROTOCOL_VERSION);
                            match &token {
                                Some(t) => {
                                    let key =
                                        SessionKey::derive(t, &c.nonce, &S_NONCE, &test_conn());
                                    prop_assert_eq!(p.proof, key.sender_proof().to_vec());
                                    m.auth_ok = Some(Message::AuthOk {
                                        proof: key.receiver_proof(),
                                    });
                                }
                                None => prop_assert!(p.proof.is_empty()),
                            }
                        } else {
                            // A token and no authentication asked: refused.
                            prop_assert!(token.is_none(), "downgrade accepted");
                            prop_assert!(!g.proving);
                            prop_assert_eq!(s.poll_transmit(), None);
                            prop_assert_eq!(s.state(), Idle);
                        }
                        TX.hit(4);
                    }
                    Ok(SenderEvent::Authenticated(_)) => {
                        prop_assert_eq!(before, AwaitAuthOk);
                        prop_assert!(token.is_some());
                        prop_assert_eq!(Some(&sent), m.auth_ok.as_ref(), "a wrong AUTH_OK passed");
                        prop_assert_eq!(s.state(), Idle);
                        proven = true;
                        m.tag_len = CHUNK_TAG_LEN as u32;
                        prop_assert_eq!(s.tag_len(), m.tag_len);
                    }
                    Ok(SenderEvent::Keepalive) => {
                        // Only while the receiver reads its copy (before
                        // the HAVE or after COMPARE), or while a relaying
                        // receiver waits for the hosts after it.
                        prop_assert_eq!(&sent, &Message::Keepalive);
                        let reading =
                            matches!(before, AwaitHave | AwaitCompared) && m.pending.is_empty();
                        prop_assert!(reading || m.relay_hops > 0 && awaited, "{:?}", before);
                        prop_assert_eq!(s.state(), before);
                    }
                    Ok(SenderEvent::Have(h)) => {
                        // Only for an offer with RESUME, only once every
                        // earlier entry is answered, only one that fits;
                        // after COMPARE only nothing (the copy differs).
                        match before {
                            AwaitHave if h.kind == HaveKind::Digest => {
                                prop_assert!(m.checksum);
                                TX.hit(9);
                            }
                            AwaitHave => {}
                            // Asked for the digest (not yet asked anything).
                            AwaitRing => {
                                prop_assert!(m.checksum && m.have.is_none());
                                prop_assert!(matches!(
                                    h.kind,
                                    HaveKind::Digest | HaveKind::Complete
                                ));
                                TX.hit(9);
                            }
                            AwaitCompared => {
                                prop_assert_eq!(h.kind, HaveKind::Nothing);
                                prop_assert!(comparable(m.have.as_ref().map(|h| h.kind)));
                            }
                            other => {
                                return Err(TestCaseError::fail(format!("HAVE in {other:?}")));
                            }
                        }
                        prop_assert!(m.pending.is_empty());
                        prop_assert!(h.fits(m.size), "an unfit HAVE: {:?}", h);
                        prop_assert_eq!(Message::Have(h.clone()), sent);
                        prop_assert_eq!(s.state(), AwaitFromDecision);
                        m.have = Some(h);
                    }
                    Ok(SenderEvent::Same {
                        ack: a,
                        copy,
                        sha256,
                    }) => {
                        // The receiver's copy is the file: its ACK is the
                        // verdict, nothing is sent and nothing is pending.
                        prop_assert_eq!(before, AwaitCompared);
                        prop_assert!(m.pending.is_empty());
                        let asked = m.have.as_ref().map(|h| h.kind);
                        prop_assert!(comparable(asked), "the same after {:?}", asked);
                        // Whose copy: the one HAVE held, or --link-dest's
                        // for a HAVE asking the digest; and the digest sent.
                        if asked == Some(HaveKind::Digest) {
                            prop_assert_eq!(copy, SameCopy::LinkDest);
                            TX.hit(10);
                        } else {
                            prop_assert_eq!(copy, SameCopy::Kept);
                        }
                        prop_assert_eq!(Some(sha256), m.compared);
                        prop_assert_eq!(a.status, AckStatus::Ok);
                        prop_assert_eq!(Message::Ack(a), sent);
                        prop_assert_eq!(s.state(), Idle);
                        prop_assert_eq!(s.bytes_planned(), m.size);
                        prop_assert_eq!(s.pending(), 0);
                        m.planned = m.size;
                        TX.hit(6);
                    }
                    Ok(SenderEvent::Ring(ring)) => {
                        prop_assert_eq!(before, AwaitRing);
                        prop_assert!(!m.dry_run, "a ring for a dry run");
                        // Only once every earlier entry is answered.
                        prop_assert!(m.pending.is_empty());
                        // A slot holds at least one byte besides a tag.
                        prop_assert!(ring.slot_size > m.tag_len && ring.slot_count > 0);
                        prop_assert!(ring.addr.checked_add(ring.len_bytes()).is_some());
                        prop_assert_eq!(s.state(), Sending);
                        prop_assert_eq!(s.credits(), ring.slot_count);
                        m.ring = Some(ring);
                        m.credits = u64::from(ring.slot_count);
                        TX.hit(0);
                    }
                    Ok(SenderEvent::Rejected(_)) => {
                        prop_assert!(matches!(before, AwaitRing | AwaitHave | AwaitCompared));
                        prop_assert!(m.pending.is_empty());
                        prop_assert_eq!(s.state(), Idle);
                    }
                    Ok(SenderEvent::Credit(c)) => {
                        // While sending, or a finished file's late credit.
                        prop_assert!(
                            before == Sending
                                || (matches!(before, Idle | AwaitRing | AwaitHave | AwaitCompared)
                                    && front == Some(Pending::File))
                        );
                        prop_assert!(c > 0);
                        m.credits += u64::from(c);
                        let ring = m
                            .ring
                            .ok_or_else(|| TestCaseError::fail("credit without ring"))?;
                        prop_assert!(m.credits <= u64::from(ring.slot_count));
                        prop_assert_eq!(s.state(), before);
                    }
                    Ok(SenderEvent::Answered {
                        payload: tag,
                        entry,
                        verdict,
                    }) => {
                        // In order: the oldest pending entry, named by its tag.
                        prop_assert!(matches!(
                            before,
                            Idle | AwaitRing | AwaitHave | AwaitCompared
                        ));
                        prop_assert_eq!(Some(entry), m.pending.pop_front());
                        prop_assert_eq!(Some(tag), m.tags.pop_front());
                        if let Verdict::Reject(_) = verdict {
                            prop_assert_eq!(entry, Pending::Directory);
                        }
                        prop_assert_eq!(s.state(), before);
                        prop_assert_eq!(s.pending(), m.pending.len());
                        TX.hit(3);
                    }
                    Ok(SenderEvent::Aborted(a)) => {
                        prop_assert!(matches!(
                            before,
                            AwaitRing | AwaitHave | AwaitCompared | Sending
                        ));
                        prop_assert!(m.pending.is_empty());
                        // The failing ACK fed, as it came.
                        let Message::Ack(fed) = &sent else {
                            return Err(TestCaseError::fail(format!("aborted by {sent:?}")));
                        };
                        prop_assert_eq!(AckStatus::from(a.failure), fed.status);
                        prop_assert_eq!(&a.reason, &fed.reason);
                        prop_assert_eq!(s.state(), Closed);
                    }
                    // Checked above.
                    Ok(SenderEvent::HopResult(_)) => {}
                    Err(e) => {
                        prop_assert_eq!(s.state(), Closed);
                        if let (Message::Challenge(c), AwaitChallenge) = (&sent, before) {
                            prop_assert!(!c.auth_required() && token.is_some(), "{}", e);
                            prop_assert_eq!(e, ProtocolError::NoAuthRequested);
                        }
                    }
                }
            }
            // One next_chunk(len) for files and streams: NextChunk offers
            // what a reader would have read, StreamChunk any length.
            TxAction::NextChunk(_) | TxAction::StreamChunk(_) => {
                let full = m.ring.map_or(0, |r| match chunk_size {
                    // A resumed file keeps its prefix's chunk length.
                    _ if m.base_len > 0 => m.base_len,
                    0 => r.slot_size - m.tag_len,
                    c => c.min(r.slot_size - m.tag_len),
                });
                // A file's next chunk must be exactly what is left of it,
                // up to a full chunk; a stream's at most a full chunk, and
                // nothing after a short one.
                let expected =
                    (!m.stream).then(|| m.size.saturating_sub(m.planned).min(u64::from(full)));
                let reader_len = expected.map_or(full, |e| e as u32);
                let (count, len) = match action {
                    TxAction::NextChunk(n) => (n, reader_len),
                    TxAction::StreamChunk(0) => (1, reader_len),
                    TxAction::StreamChunk(len) => (1, len),
                    _ => unreachable!(),
                };
                for _ in 0..count {
                    let expected =
                        (!m.stream).then(|| m.size.saturating_sub(m.planned).min(u64::from(full)));
                    let len = if matches!(action, TxAction::NextChunk(_)) {
                        expected.map_or(full, |e| e as u32)
                    } else {
                        len
                    };
                    let fits = before == Sending
                        && len > 0
                        && len <= full
                        && match expected {
                            None => !m.short,
                            Some(e) => e > 0 && u64::from(len) == e,
                        };
                    match s.next_chunk(len) {
                        Ok(Some(p)) => {
                            prop_assert!(
                                fits && m.credits > 0,
                                "chunk planned without credit / data / ring"
                            );
                            check_plan(&p, &m, chunk_size)?;
                            prop_assert_eq!(p.len, len);
                            if !m.stream {
                                prop_assert!(p.file_offset + u64::from(p.len) <= m.size);
                            }
                            m.credits -= 1;
                            m.planned += u64::from(len);
                            m.chunks += 1;
                            m.short = m.stream && len < full;
                            TX.hit(1);
                        }
                        Ok(None) => {
                            // Only credit may be missing.
                            prop_assert!(fits && m.credits == 0);
                            break;
                        }
                        Err(_) => {
                            // A chunk that does not fit changes nothing.
                            prop_assert_eq!(s.state(), before);
                            prop_assert!(!fits, "a fitting chunk of {} refused", len);
                            break;
                        }
                    }
                    prop_assert_eq!(u64::from(s.credits()), m.credits);
                }
            }
            TxAction::Finish(alg) => {
                let alg = alg.unwrap_or(m.digest);
                let digest = match alg {
                    DigestAlg::Crc32 => Digest::Crc32(7),
                    DigestAlg::Sha256 => Digest::Sha256([7; 32]),
                };
                let finished = if m.tag_at_fin {
                    // Nothing carried yet: `finish` alone is refused.
                    prop_assert!(s.clone().finish(digest).is_err());
                    s.finish_carrying(digest, m.tag)
                } else {
                    s.finish(digest)
                };
                match sent(finished, &mut s) {
                    Ok(Message::Fin(f)) => {
                        prop_assert_eq!(before, Sending);
                        prop_assert_eq!(f.bytes, m.planned);
                        if !m.stream {
                            prop_assert_eq!(m.planned, m.size);
                        }
                        prop_assert_eq!(f.chunks, m.chunks);
                        prop_assert_eq!(f.digest.alg(), m.digest);
                        // Idle at once: the next entry may go out before the ACK.
                        prop_assert_eq!(s.state(), Idle);
                        m.pending.push_back(Pending::File);
                        m.tags.push_back(m.tag);
                        prop_assert_eq!(s.pending(), m.pending.len());
                        TX.hit(2);
                    }
                    Ok(other) => {
                        return Err(TestCaseError::fail(format!("finish() gave {other:?}")));
                    }
                    Err(e) => {
                        prop_assert_eq!(s.state(), before);
                        if before == Sending && (m.stream || m.planned == m.size) && alg == m.digest
                        {
                            return Err(TestCaseError::fail(format!("finish refused: {e}")));
                        }
                        let _: ProtocolError = e;
                    }
                }
            }
            TxAction::Keepalive => {
                // Only a stream waiting for its input, or a file read to
                // answer a HAVE, keeps the receiver waiting.
                let waiting = (before == Sending && m.stream) || before == AwaitFromDecision;
                match sent(s.keepalive(), &mut s) {
                    Ok(msg) => {
                        prop_assert!(waiting, "KEEPALIVE in {:?}", before);
                        prop_assert_eq!(msg, Message::Keepalive);
                    }
                    Err(_) => prop_assert!(!waiting, "KEEPALIVE refused in {:?}", before),
                }
                prop_assert_eq!(s.state(), before);
            }
            TxAction::Clock { peer, heard, ms } => {
                let on = if peer { Waiting::Peer } else { Waiting::Input };
                s.waiting(on, now);
                let limit = if peer {
                    TIMEOUT
                } else {
                    keepalive_interval(TIMEOUT)
                };
                // One timer runs: after now (a due one was handled), at
                // most its length away.
                let due = s.poll_timeout();
                prop_assert!(
                    due.is_some_and(|d| d > now && d <= now + limit),
                    "{:?}: due {:?}",
                    on,
                    due.map(|d| d.saturating_duration_since(now))
                );
                let due = due.unwrap_or(now);
                now += Duration::from_millis(u64::from(ms));
                if heard {
                    s.heard(now);
                    if peer {
                        prop_assert_eq!(s.poll_timeout(), Some(now + TIMEOUT));
                    }
                }
                let due = if heard && peer { now + TIMEOUT } else { due };
                let what = s.waited_for();
                let result = s.handle_timeout(now);
                let msg = s.poll_transmit();
                prop_assert_eq!(s.poll_transmit(), None);
                if due > now {
                    prop_assert!(result.is_ok() && msg.is_none());
                    prop_assert_eq!(s.state(), before);
                } else if peer {
                    // Silent too long: the session is over, saying why.
                    prop_assert_eq!(
                        result,
                        Err(ProtocolError::NoProgress {
                            secs: TIMEOUT.as_secs(),
                            what
                        })
                    );
                    prop_assert!(msg.is_none());
                    prop_assert_eq!(s.state(), Closed);
                    prop_assert_eq!(s.poll_timeout(), None);
                    TX.hit(11);
                } else {
                    // A keepalive only where one may go; the next one
                    // after the interval.
                    let waiting = (before == Sending && m.stream) || before == AwaitFromDecision;
                    prop_assert!(result.is_ok());
                    prop_assert_eq!(s.state(), before);
                    if waiting {
                        prop_assert_eq!(msg, Some(Message::Keepalive));
                        prop_assert_eq!(s.poll_timeout(), Some(now + limit));
                        TX.hit(12);
                    } else {
                        prop_assert!(msg.is_none());
                        prop_assert_eq!(s.poll_timeout(), None);
                    }
                }
            }
            TxAction::Close => match sent(s.close(), &mut s) {
                Ok(msg) => {
                    prop_assert_eq!(before, Idle);
                    prop_assert!(m.pending.is_empty(), "BYE with entries unanswered");
                    prop_assert_eq!(msg, Message::Bye);
                    prop_assert_eq!(s.state(), Closed);
                }
                Err(_) => prop_assert_eq!(s.state(), before),
            },
            TxAction::From(seed) => {
                let have = m.have.clone();
                let complete = comparable(have.as_ref().map(|h| h.kind));
                if seed % 11 == 10 || (complete && seed % 5 >= 2) {
                    // COMPARE: only to answer a HAVE of a complete copy or
                    // asking for the digest.
                    let sha256 = [seed as u8; 32];
                    let taken = before == AwaitFromDecision && complete;
                    match sent(s.compare(sha256), &mut s) {
                        Ok(msg) => {
                            prop_assert!(taken, "COMPARE in {:?} after {:?}", before, have);
                            prop_assert_eq!(msg, Message::Compare { sha256 });
                            prop_assert_eq!(s.state(), AwaitCompared);
                            m.compared = Some(sha256);
                            prop_assert!(m.pending.is_empty());
                            prop_assert_eq!(s.bytes_planned(), m.planned);
                            TX.hit(7);
                        }
                        Err(_) => {
                            prop_assert!(!taken, "COMPARE of a complete copy (or asked) refused");
                            prop_assert_eq!(s.state(), before);
                        }
                    }
                } else {
                    check_from(&mut s, &mut m, before, chunk_size, seed)?;
                }
            }
        }
        if before == Closed {
            prop_assert_eq!(s.state(), Closed);
        }
        if s.state() != Closed {
            prop_assert_eq!(s.pending(), m.pending.len());
            prop_assert!(s.pending() <= MAX_PENDING);
        }
        prop_assert!(m.stream || s.bytes_planned() <= m.size || s.state() == Closed);
    }
    Ok(())
}

/// The engine's FROM after a HAVE (`TxAction::From` when it does not
/// compare): 0, the prefix; past it, or a complete copy's size (nothing is
/// skipped: a complete copy is compared), refused.
pub(crate) fn check_from(
    s: &mut SenderSession,
    m: &mut TxModel,
    before: SenderState,
    chunk_size: u32,
    seed: u32,
) -> Result<(), TestCaseError> {
    use SenderState::*;
    let have = m.have.clone();
    let offset = match (&have, seed % 5) {
        (_, 0) => 0,
        (Some(h), 1) => h.bytes.wrapping_add(1),
        (Some(h), _) => h.bytes,
        (None, _) => u64::from(seed),
    };
    let ok_prefix = |h: &Have| {
        h.kind == HaveKind::Prefix
            && offset == h.bytes
            && (chunk_size == 0 || h.chunk_len <= chunk_size)
    };
    match sent(s.start_from(offset), s) {
        Ok(msg) => {
            prop_assert_eq!(before, AwaitFromDecision);
            prop_assert_eq!(msg, Message::From { offset });
            let h = have.ok_or_else(|| TestCaseError::fail("FROM without HAVE"))?;
            if offset == 0 {
                prop_assert_eq!(s.state(), AwaitRing);
            } else if ok_prefix(&h) {
                prop_assert_eq!(s.state(), AwaitRing);
                prop_assert_eq!(s.resumed_from(), offset);
                m.planned = offset;
                m.chunks = offset / u64::from(h.chunk_len);
                m.base_len = h.chunk_len;
                TX.hit(5);
            } else {
                return Err(TestCaseError::fail(format!(
                    "FROM {offset} taken after {h:?}"
                )));
            }
        }
        Err(_) => {
            let taken = have.as_ref().is_some_and(|h| offset == 0 || ok_prefix(h));
            prop_assert!(
                before != AwaitFromDecision || !taken,
                "FROM {} refused",
                offset
            );
            prop_assert_eq!(s.state(), before);
        }
    }
    Ok(())
}

/// A planned write stays inside the ring, at the start of its slot, in order.
pub(crate) fn check_plan(
    p: &rdma_xfer::proto::ChunkPlan,
    m: &TxModel,
    chunk_size: u32,
) -> Result<(), TestCaseError> {
    let ring = m
        .ring
        .ok_or_else(|| TestCaseError::fail("chunk without ring"))?;
    // The write carries the chunk, then its tag, within its slot.
    prop_assert!(p.len > 0 && p.len + m.tag_len <= ring.slot_size);
    prop_assert_eq!(p.write_len, p.len + m.tag_len);
    if chunk_size > 0 {
        prop_assert!(p.len <= chunk_size);
    }
    prop_assert!(p.slot < ring.slot_count);
    prop_assert_eq!(u64::from(p.slot), p.seq % u64::from(ring.slot_count));
    prop_assert_eq!(
        p.remote_addr,
        ring.addr + u64::from(p.slot) * u64::from(ring.slot_size)
    );
    prop_assert!(p.remote_addr + u64::from(p.write_len) <= ring.addr + ring.len_bytes());
    prop_assert_eq!(p.rkey, ring.rkey);
    prop_assert_eq!(p.seq, m.chunks);
    prop_assert_eq!(p.file_offset, m.planned);
    Ok(())
}

#[test]
pub(crate) fn machine_sender() {
    let secret = prop_oneof![
        Just(None),
        proptest::collection::vec(any::<u8>(), 1..40).prop_map(Some),
    ];
    let strategy = (
        prop_oneof![1 => Just(0u32), 3 => 1u32..80],
        secret,
        sequence(tx_action(), TxAction::Legal, 300),
    );
    fuzz(
        "machine_sender",
        strategy,
        |(_, _, a)| a.len() as u64,
        |(chunk_size, secret, actions)| check_sender(chunk_size, secret, actions),
        || {
            format!(
                "{} greetings, {} rings granted ({} after a resumed prefix), {} chunks \
                 planned, {} FINs, {} verdicts in order, {} COMPAREs ({} copies the same), \
                 {} batches offered, {} digests asked ({} linked), {} silent receivers, \
                 {} keepalives due, {} offers settled without data; {} chains relayed, {} \
                 RESULTs heard, {} KEEPALIVEs from a hop",
                TX.get(4),
                TX.get(0),
                TX.get(5),
                TX.get(1),
                TX.get(2),
                TX.get(3),
                TX.get(7),
                TX.get(6),
                TX.get(8),
                TX.get(9),
                TX.get(10),
                TX.get(11),
                TX.get(12),
                TX.get(13),
                TX_RELAY.get(0),
                TX_RELAY.get(1),
                TX_RELAY.get(2)
            )
        },
    );
}

/// What a call of the engine's queued: its one message, or (refused)
/// nothing.
fn sent<E: std::fmt::Debug>(result: Result<(), E>, s: &mut SenderSession) -> Result<Message, E> {
    crate::one_message(result, std::iter::from_fn(|| s.poll_transmit()).collect())
}
