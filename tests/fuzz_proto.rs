//! Property-based fuzzing (proptest) of everything a peer's bytes reach
//! before any I/O happens: the control-message codec and both session state
//! machines. No RDMA needed.
//!
//! - `decode_*`: the decoder on arbitrary bytes and on mutated valid frames
//!   never panics, and whatever it accepts re-encodes to the same bytes;
//!   `decode(encode(m)) == m` for generated messages.
//! - `machine_receiver`: a `ReceiverSession` fed arbitrary sequences of
//!   decoded messages, chunk completions and engine decisions never panics,
//!   never places a chunk outside the ring or past the offered size (a
//!   stream's: --max-size), never hands out an MR without an accepted file
//!   HELLO (nor for a directory), never accepts a path that could leave its
//!   directory, and every protocol error closes the session for good.
//!   Resuming: FROM only at 0 or HAVE's prefix, COMPARE only after a HAVE
//!   of a complete copy, then the engine's verdict (ACK or HAVE of nothing).
//!   `--checksum`: a HAVE asking for the digest only for an offer with
//!   CHECKSUM (files only, batch members included), once, then COMPARE
//!   and the same verdicts; an offer with CHECKSUM not asked goes on as
//!   any other.
//! - `machine_sender`: a `SenderSession` fed arbitrary receiver messages and
//!   engine calls (files, streams, directories, pipelined) never panics,
//!   never plans a write outside the ring or beyond its credits, hands out
//!   verdicts in the order the entries were sent, and every error closes
//!   the session; COMPARE only answers a HAVE of a complete copy (or one
//!   asking for the digest of an offer with CHECKSUM, in AWAIT_RING or
//!   AWAIT_HAVE), and its ACK is the file's verdict (nothing sent, nothing
//!   left pending). With
//!   a token it never offers an entry before a correct AUTH_OK, and
//!   refuses a receiver that does not ask for authentication.
//! - `decode_sealed`: sealed control messages (protocol 3) through a
//!   sender/receiver channel pair, delivered in order, replayed, reordered,
//!   dropped, bit-flipped, truncated, extended or reflected: exactly the
//!   genuine next message opens, to its exact frame; nothing else does, and
//!   a refused one never advances the sequence.
//! - The receiver property drives the v3 handshake (PROVE with right,
//!   wrong, relayed and other-version proofs; AUTH_OK checked against the
//!   sender's key) and checks that the channel both sides get interoperates.
//!
//! The number of cases per property is proptest's: `PROPTEST_CASES`
//! (default 256, a few seconds in all). `make fuzz` runs >= 1 million.
//! Each property prints its case and input counts (`--nocapture` shows them).

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rdma_xfer::proto::wire::{HEADER_LEN, MAX_BODY};
use rdma_xfer::proto::{
    AUTH_REQUIRED, Ack, AckStatus, CHUNK_TAG_LEN, Challenge, Channel, ChannelError, ConnectionId,
    DEFAULT_MAX_FILES, Digest, DigestAlg, DigestBudget, FileOffer, Fin, Have, HaveKind, Hello,
    MAX_BATCH_FILES, MAX_MESSAGE, MAX_PENDING, MAX_REFUSALS_IN_A_ROW, Message, Mtime, NONCE_LEN,
    NameRules, OfferKind, PROTOCOL_VERSION, Pending, ProtocolError, Prove, ReceiverConfig,
    ReceiverEvent, ReceiverSession, ReceiverState, RecvError, Reject, RejectCode, RingInfo, Role,
    SEAL_LEN, SameCopy, SenderAuth, SenderEvent, SenderSession, SenderState, SessionKey, Token,
    Verdict, decode, encode_to_vec, hello_flags, is_invisible, validate_path,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How deep the generated inputs got (printed with the counts, so a weak
/// generator shows): frames decoded, chunks placed, files verified, ...
struct Reached([AtomicU64; 13]);

impl Reached {
    const fn new() -> Self {
        Reached([const { AtomicU64::new(0) }; 13])
    }
    fn hit(&self, i: usize) {
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self, i: usize) -> u64 {
        self.0[i].load(Ordering::Relaxed)
    }
}

/// Runs `test` on `PROPTEST_CASES` values of `strategy`; prints the counts.
/// `inputs` is what one case feeds the code under test (1 for a frame, the
/// number of events for a session).
fn fuzz<S: Strategy>(
    name: &str,
    strategy: S,
    inputs: impl Fn(&S::Value) -> u64,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
    reached: impl Fn() -> String,
) {
    let config = Config {
        // Failures print the shrunk input; no regression files in the tree.
        failure_persistence: None,
        ..Config::default() // reads PROPTEST_CASES
    };
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let fed = AtomicU64::new(0);
    let ran = AtomicU64::new(0);
    let started = Instant::now();
    let result = runner.run(&strategy, |v| {
        ran.fetch_add(1, Ordering::Relaxed);
        fed.fetch_add(inputs(&v), Ordering::Relaxed);
        test(v)
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    eprintln!(
        "fuzz {name}: {cases} cases ({} run), {} inputs in {:.1}s; reached: {}",
        ran.load(Ordering::Relaxed),
        fed.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
        reached()
    );
}

// ---------------------------------------------------------------- strategies

fn text(max_chars: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::collection::vec(any::<char>(), 0..max_chars).prop_map(String::from_iter),
        1 => (0usize..=MAX_BODY).prop_map(|n| "r".repeat(n / 2)),
    ]
}

/// File names: plain ones (mostly valid), hostile ones, arbitrary text.
fn name() -> impl Strategy<Value = String> {
    let plain =
        proptest::collection::vec(proptest::sample::select(b"abcxyz019._-".to_vec()), 1..20)
            .prop_map(|v| String::from_utf8(v).unwrap_or_default());
    let hostile = proptest::sample::select(vec![
        "../x",
        "/etc/passwd",
        "a/b",
        "..",
        ".",
        "",
        "a\0b",
        "a\nb",
        "a/../../x",
        "a//b",
        "a/",
        "./a",
        "a/./b",
        "d/sub/f",
        "\u{1b}[31m",
        "\u{7f}",
        "\u{85}",
        "back\\slash",
        ".bashrc",
        "d/.ssh/authorized_keys",
        ".RDMA-XFER-1.part",
        "d/.Rdma-Xfer-partial-00",
        "evil\u{202e}txt.exe",
        "a\u{200b}b",
        "a\u{2028}b",
        "\u{feff}x",
        "\u{61c}",
        "d/\u{2066}y",
    ])
    .prop_map(str::to_owned);
    prop_oneof![
        6 => plain,
        2 => hostile,
        1 => (250usize..260).prop_map(|n| "n".repeat(n)),
        2 => proptest::collection::vec(any::<char>(), 0..16).prop_map(String::from_iter),
    ]
}

fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..300,
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

fn digest_alg() -> impl Strategy<Value = DigestAlg> {
    prop_oneof![Just(DigestAlg::Crc32), Just(DigestAlg::Sha256)]
}

fn digest() -> impl Strategy<Value = Digest> {
    prop_oneof![
        any::<u32>().prop_map(Digest::Crc32),
        any::<[u8; 32]>().prop_map(Digest::Sha256),
    ]
}

fn reject_code() -> impl Strategy<Value = RejectCode> {
    proptest::sample::select(RejectCode::ALL.to_vec())
}

fn ack_status() -> impl Strategy<Value = AckStatus> {
    proptest::sample::select(AckStatus::ALL.to_vec())
}

/// HELLO flags: mostly the known kinds, sometimes anything.
fn caps() -> impl Strategy<Value = u32> {
    use hello_flags::{CHECKSUM, DIRECTORY, MTIME, STREAM};
    prop_oneof![
        3 => Just(0),
        2 => Just(STREAM),
        2 => Just(DIRECTORY),
        1 => Just(MTIME),
        1 => Just(DIRECTORY | MTIME),
        1 => Just(STREAM | DIRECTORY),
        1 => Just(CHECKSUM),
        1 => Just(CHECKSUM | STREAM),
        1 => any::<u32>(),
    ]
}

fn hello() -> impl Strategy<Value = Hello> {
    (
        prop_oneof![4 => Just(PROTOCOL_VERSION), 1 => Just(1u16), 1 => any::<u16>()],
        caps(),
        name(),
        size(),
        any::<u32>(),
        digest_alg(),
        (any::<i64>(), 0u32..1_000_000_000),
    )
        .prop_map(
            |(version, caps, name, size, mode, digest, (secs, nanos))| Hello {
                version,
                caps,
                name,
                size,
                mode,
                digest,
                // The codec needs the flag and the field to agree.
                mtime: (caps & hello_flags::MTIME != 0).then_some(Mtime { secs, nanos }),
            },
        )
}

fn ring() -> impl Strategy<Value = RingInfo> {
    prop_oneof![
        // Plausible rings, small enough for whole files to go through.
        4 => (any::<u64>(), any::<u32>(), 1u32..64, 1u32..8).prop_map(|(a, rkey, s, c)| RingInfo {
            addr: a >> 8,
            rkey,
            slot_size: s,
            slot_count: c,
        }),
        1 => any::<(u64, u32, u32, u32)>().prop_map(|(addr, rkey, slot_size, slot_count)| {
            RingInfo { addr, rkey, slot_size, slot_count }
        }),
        1 => (0u32..2, 0u32..2).prop_map(|(slot_size, slot_count)| RingInfo {
            addr: u64::MAX - 8,
            rkey: 1,
            slot_size,
            slot_count,
        }),
    ]
}

/// Any message of the protocol, edge values included.
fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        hello().prop_map(Message::Hello),
        ring().prop_map(Message::Mr),
        (reject_code(), text(40))
            .prop_map(|(code, reason)| Message::Reject(Reject::new(code, reason))),
        prop_oneof![Just(0u32), 1u32..20, any::<u32>()].prop_map(|count| Message::Credit { count }),
        (size(), prop_oneof![0u64..20, any::<u64>()], digest()).prop_map(
            |(bytes, chunks, digest)| Message::Fin(Fin {
                bytes,
                chunks,
                digest
            })
        ),
        (ack_status(), text(40))
            .prop_map(|(status, reason)| Message::Ack(Ack::new(status, reason))),
        Just(Message::Bye),
        challenge().prop_map(Message::Challenge),
        prop_oneof![Just(Vec::new()), any::<[u8; 32]>().prop_map(|m| m.to_vec()),]
            .prop_map(|mac| Message::Auth { mac }),
        Just(Message::Keepalive),
        (
            prop_oneof![Just(PROTOCOL_VERSION), any::<u16>()],
            any::<[u8; NONCE_LEN]>(),
            prop_oneof![Just(Vec::new()), any::<[u8; 32]>().prop_map(|m| m.to_vec()),]
        )
            .prop_map(|(version, nonce, proof)| Message::Prove(Prove {
                version,
                nonce,
                proof
            })),
        any::<[u8; 32]>().prop_map(|proof| Message::AuthOk { proof }),
        prop_oneof![
            3 => (0u8..4, size(), any::<u32>(), digest(), text(40)).prop_map(
                |(kind, bytes, chunk_len, digest, note)| Have {
                    kind: HaveKind::from_u8(kind).unwrap_or(HaveKind::Nothing),
                    bytes,
                    chunk_len,
                    digest,
                    note,
                }
            ),
            // The shapes a receiver sends: nothing, a complete copy, a
            // request for the digest.
            1 => text(40).prop_map(Have::nothing),
            1 => size().prop_map(Have::complete),
            1 => size().prop_map(Have::ask_digest),
        ]
        .prop_map(Message::Have),
        prop_oneof![Just(0u64), Just(u64::MAX), any::<u64>()]
            .prop_map(|offset| Message::From { offset }),
        any::<[u8; 32]>().prop_map(|sha256| Message::Compare { sha256 }),
    ]
}

/// The connection both harnesses authenticate on.
fn test_conn() -> ConnectionId {
    ConnectionId {
        receiver_addr: "10.77.0.1".parse().unwrap(),
        receiver_qpn: 0x11,
        sender_addr: "10.77.0.2".parse().unwrap(),
        sender_qpn: 0x12,
    }
}

/// The sender's nonce in the harnesses.
const S_NONCE: [u8; NONCE_LEN] = [0x5e; NONCE_LEN];

fn challenge() -> impl Strategy<Value = Challenge> {
    (
        prop_oneof![Just(0u16), Just(AUTH_REQUIRED)],
        any::<[u8; NONCE_LEN]>(),
    )
        .prop_map(|(flags, nonce)| Challenge { flags, nonce })
}

/// A shared secret and a session nonce, or none (no authentication).
fn auth_key() -> impl Strategy<Value = Option<(Vec<u8>, [u8; NONCE_LEN])>> {
    prop_oneof![
        1 => Just(None),
        1 => (proptest::collection::vec(any::<u8>(), 1..40), any::<[u8; NONCE_LEN]>())
            .prop_map(Some),
    ]
}

#[derive(Debug, Clone)]
enum Mutation {
    Set(Index, u8),
    Xor(Index, u8),
    Truncate(Index),
    Push(u8),
    Insert(Index, u8),
    Remove(Index),
    /// Rewrite the header's body length near the real one (or anything).
    BodyLen(i32),
    /// Rewrite the type byte / version byte.
    Type(u8),
    Version(u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Set(i, v)),
        3 => (any::<Index>(), 1u8..=255).prop_map(|(i, v)| Mutation::Xor(i, v)),
        2 => any::<Index>().prop_map(Mutation::Truncate),
        1 => any::<u8>().prop_map(Mutation::Push),
        1 => (any::<Index>(), any::<u8>()).prop_map(|(i, v)| Mutation::Insert(i, v)),
        1 => any::<Index>().prop_map(Mutation::Remove),
        2 => prop_oneof![-4i32..=4, any::<i32>()].prop_map(Mutation::BodyLen),
        1 => any::<u8>().prop_map(Mutation::Type),
        1 => any::<u8>().prop_map(Mutation::Version),
    ]
}

fn mutate(buf: &mut Vec<u8>, m: &Mutation) {
    let n = buf.len();
    match m {
        Mutation::Set(i, v) if n > 0 => buf[i.index(n)] = *v,
        Mutation::Xor(i, v) if n > 0 => buf[i.index(n)] ^= *v,
        Mutation::Truncate(i) => buf.truncate(i.index(n + 1)),
        Mutation::Push(v) => buf.push(*v),
        Mutation::Insert(i, v) => buf.insert(i.index(n + 1), *v),
        Mutation::Remove(i) if n > 0 => {
            buf.remove(i.index(n));
        }
        Mutation::BodyLen(d) if n >= HEADER_LEN => {
            let real = (n - HEADER_LEN) as i64;
            let len = if d.unsigned_abs() <= 4 {
                (real + i64::from(*d)).max(0) as u32
            } else {
                *d as u32
            };
            buf[8..12].copy_from_slice(&len.to_be_bytes());
        }
        Mutation::Type(t) if n > 5 => buf[5] = *t,
        Mutation::Version(v) if n > 4 => buf[4] = *v,
        _ => {}
    }
}

// ------------------------------------------------------------- (a) decoder

/// What the decoder must guarantee for any input: no panic (the caller runs
/// it), and an accepted frame is canonical.
static DECODED: Reached = Reached::new();

/// `counter`: which DECODED slot counts the accepted frames.
fn check_decoded(bytes: &[u8], counter: usize) -> Result<(), TestCaseError> {
    if let Ok(msg) = decode(bytes) {
        DECODED.hit(counter);
        prop_assert!(bytes.len() <= MAX_MESSAGE, "accepted {} bytes", bytes.len());
        let again = encode_to_vec(&msg);
        prop_assert_eq!(again.as_deref(), Ok(bytes), "non-canonical: {:?}", msg);
    }
    Ok(())
}

#[test]
fn decode_arbitrary_bytes() {
    let header = (any::<u8>(), any::<u16>(), any::<u32>());
    let body = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..80),
        // The fixed body sizes of CREDIT, BYE and MR.
        proptest::sample::select(vec![0usize, 4, 20]).prop_map(|n| vec![0xa5; n]),
    ];
    let framed = (header, 0u8..12, body).prop_map(|((ver, flags, len), ty, body)| {
        let mut b = 0x5258_4652u32.to_be_bytes().to_vec();
        b.push(if ver < 200 { 1 } else { ver });
        b.push(ty);
        let flags = if flags < 60000 { 0 } else { flags };
        b.extend_from_slice(&flags.to_be_bytes());
        let len = if len.is_multiple_of(4) {
            len
        } else {
            body.len() as u32
        };
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(&body);
        b
    });
    let strategy = prop_oneof![
        // Noise.
        2 => proptest::collection::vec(any::<u8>(), 0..64),
        // Noise behind a valid magic + version, so parsing gets further.
        3 => framed,
        // Big buffers around the frame limit.
        1 => (MAX_MESSAGE - 16..MAX_MESSAGE + 16).prop_map(|n| vec![0u8; n]),
    ];
    fuzz(
        "decode_arbitrary_bytes",
        strategy,
        |_| 1,
        |bytes| check_decoded(&bytes, 0),
        || format!("{} frames decoded", DECODED.get(0)),
    );
}

#[test]
fn decode_mutated_frames() {
    let strategy = (message(), proptest::collection::vec(mutation(), 1..6));
    fuzz(
        "decode_mutated_frames",
        strategy,
        |_| 1,
        |(msg, mutations)| {
            let mut bytes = encode_to_vec(&msg).map_err(|e| TestCaseError::fail(e.to_string()))?;
            for m in &mutations {
                mutate(&mut bytes, m);
            }
            check_decoded(&bytes, 1)
        },
        || format!("{} mutated frames still decoded", DECODED.get(1)),
    );
}

#[test]
fn decode_encode_round_trip() {
    fuzz(
        "decode_encode_round_trip",
        message(),
        |_| 1,
        |msg| {
            let bytes = encode_to_vec(&msg).map_err(|e| TestCaseError::fail(e.to_string()))?;
            // Room for the seal: a sealed frame still fits a receive buffer.
            prop_assert!(bytes.len() + SEAL_LEN <= MAX_MESSAGE);
            prop_assert_eq!(decode(&bytes), Ok(msg));
            Ok(())
        },
        || "every message".into(),
    );
}

/// What happens to one sealed message on its way.
#[derive(Debug, Clone)]
enum SealOp {
    /// The sender seals it and it arrives.
    Deliver(Message),
    /// A genuine earlier message arrives again.
    Replay(Index),
    /// Sealed, held back (arrives later with `Release`, or never).
    Hold(Message),
    /// The oldest held-back message arrives now.
    Release,
    /// Sealed, and one bit of it flipped on the way.
    Flip(Message, Index, u8),
    /// Sealed, and cut short.
    Truncate(Message, Index),
    /// Sealed, with bytes appended.
    Extend(Message, Vec<u8>),
    /// The receiver's own sealed message reflected back to it.
    Reflect(Message),
    /// Bytes from nowhere.
    Garbage(Vec<u8>),
}

fn seal_op() -> impl Strategy<Value = SealOp> {
    prop_oneof![
        6 => message().prop_map(SealOp::Deliver),
        2 => any::<Index>().prop_map(SealOp::Replay),
        2 => message().prop_map(SealOp::Hold),
        2 => Just(SealOp::Release),
        2 => (message(), any::<Index>(), 0u8..8).prop_map(|(m, i, b)| SealOp::Flip(m, i, b)),
        1 => (message(), any::<Index>()).prop_map(|(m, i)| SealOp::Truncate(m, i)),
        1 => (message(), proptest::collection::vec(any::<u8>(), 1..50))
            .prop_map(|(m, v)| SealOp::Extend(m, v)),
        1 => message().prop_map(SealOp::Reflect),
        1 => proptest::collection::vec(any::<u8>(), 0..120).prop_map(SealOp::Garbage),
    ]
}

static SEALED: Reached = Reached::new();

/// Seals `msg` on the sender's channel: (its sequence number, the sealed
/// bytes, the frame).
fn seal_next(s: &mut Channel, msg: &Message) -> Result<(u64, Vec<u8>, Vec<u8>), TestCaseError> {
    let frame = encode_to_vec(msg).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let seq = s.sent();
    let sealed = s
        .seal(&frame)
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert!(sealed.len() <= MAX_MESSAGE);
    prop_assert_eq!(sealed.len(), frame.len() + SEAL_LEN);
    Ok((seq, sealed, frame))
}

/// A genuine message arriving: it opens exactly when it is the next one.
fn arrive(r: &mut Channel, seq: u64, sealed: &[u8], frame: &[u8]) -> Result<(), TestCaseError> {
    let expected = r.received();
    let got = r.open(sealed);
    if seq == expected {
        prop_assert_eq!(got, Ok(frame));
        prop_assert!(decode(frame).is_ok());
        prop_assert_eq!(r.received(), expected + 1);
        SEALED.hit(0);
    } else {
        let want = if seq < expected {
            SEALED.hit(1);
            ChannelError::Replayed { got: seq, expected }
        } else {
            SEALED.hit(2);
            ChannelError::OutOfOrder { got: seq, expected }
        };
        prop_assert_eq!(got, Err(want));
        prop_assert_eq!(r.received(), expected);
    }
    Ok(())
}

/// A message that is not genuine: refused, and the sequence stays.
fn refused(r: &mut Channel, bytes: &[u8]) -> Result<(), TestCaseError> {
    let expected = r.received();
    let got = r.open(bytes);
    prop_assert!(got.is_err(), "forged bytes opened: {:?}", bytes);
    if bytes.len() < SEAL_LEN {
        prop_assert_eq!(got, Err(ChannelError::Truncated { len: bytes.len() }));
    }
    prop_assert_eq!(r.received(), expected);
    SEALED.hit(3);
    Ok(())
}

fn check_sealed(
    secret: Vec<u8>,
    nonces: ([u8; 32], [u8; 32]),
    ops: Vec<SealOp>,
) -> Result<(), TestCaseError> {
    let Some(token) = Token::new(secret) else {
        return Ok(());
    };
    let key = SessionKey::derive(&token, &nonces.0, &nonces.1, &test_conn());
    let (mut s, mut r) = (key.channel(Role::Sender), key.channel(Role::Receiver));
    let mut genuine: Vec<(u64, Vec<u8>, Vec<u8>)> = Vec::new();
    let mut held: VecDeque<usize> = VecDeque::new();
    for op in ops {
        match op {
            SealOp::Deliver(m) => {
                let (seq, sealed, frame) = seal_next(&mut s, &m)?;
                arrive(&mut r, seq, &sealed, &frame)?;
                genuine.push((seq, sealed, frame));
            }
            SealOp::Replay(i) if !genuine.is_empty() => {
                let (seq, sealed, frame) = genuine[i.index(genuine.len())].clone();
                arrive(&mut r, seq, &sealed, &frame)?;
            }
            SealOp::Replay(_) | SealOp::Release => {
                if let Some(i) = held.pop_front() {
                    let (seq, sealed, frame) = genuine[i].clone();
                    arrive(&mut r, seq, &sealed, &frame)?;
                }
            }
            SealOp::Hold(m) => {
                genuine.push(seal_next(&mut s, &m)?);
                held.push_back(genuine.len() - 1);
            }
            SealOp::Flip(m, i, bit) => {
                let (seq, sealed, frame) = seal_next(&mut s, &m)?;
                let mut bad = sealed.clone();
                let at = i.index(bad.len());
                bad[at] ^= 1 << bit;
                refused(&mut r, &bad)?;
                genuine.push((seq, sealed, frame));
                held.push_back(genuine.len() - 1);
            }
            SealOp::Truncate(m, i) => {
                let (seq, sealed, frame) = seal_next(&mut s, &m)?;
                refused(&mut r, &sealed[..i.index(sealed.len())])?;
                genuine.push((seq, sealed, frame));
                held.push_back(genuine.len() - 1);
            }
            SealOp::Extend(m, extra) => {
                let (seq, sealed, frame) = seal_next(&mut s, &m)?;
                let mut long = sealed.clone();
                long.extend_from_slice(&extra);
                refused(&mut r, &long)?;
                genuine.push((seq, sealed, frame));
                held.push_back(genuine.len() - 1);
            }
            SealOp::Reflect(m) => {
                // Sealed by the receiver for the sender: useless to itself.
                let frame = encode_to_vec(&m).map_err(|e| TestCaseError::fail(e.to_string()))?;
                let mut back = r.clone();
                let sealed = back
                    .seal(&frame)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                refused(&mut r, &sealed)?;
                // And the sender's own message reflected to the sender.
                let mut own = s.clone();
                let mine = own
                    .seal(&frame)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert!(s.clone().open(&mine).is_err());
            }
            SealOp::Garbage(b) => refused(&mut r, &b)?,
        }
    }
    Ok(())
}

#[test]
fn decode_sealed_messages() {
    fuzz(
        "decode_sealed_messages",
        (
            proptest::collection::vec(any::<u8>(), 1..40),
            any::<([u8; 32], [u8; 32])>(),
            proptest::collection::vec(seal_op(), 1..30),
        ),
        |(_, _, ops)| ops.len() as u64,
        |(secret, nonces, ops)| check_sealed(secret, nonces, ops),
        || {
            format!(
                "{} opened in order, {} replays and {} reorders refused, {} forgeries refused",
                SEALED.get(0),
                SEALED.get(1),
                SEALED.get(2),
                SEALED.get(3)
            )
        },
    );
}

// ------------------------------------------- (a2) the protocol 3 handshake

/// What stands between the sender and the receiver during one handshake.
#[derive(Debug, Clone)]
enum Interference {
    /// Nothing: both must authenticate each other.
    None,
    /// The sender believes it is on another connection (a relay: the
    /// CHALLENGE was forwarded from a connection it is not on).
    Relay(ConnectionId),
    /// The sender holds another token.
    OtherToken(Vec<u8>),
    /// The CHALLENGE reaches the sender without AUTH_REQUIRED (a rogue
    /// receiver or a forger asking for no authentication).
    Downgrade,
    /// The PROVE's encoded bytes are altered on the way.
    MangleProve(Vec<Mutation>),
    /// The AUTH_OK's encoded bytes are altered on the way.
    MangleAuthOk(Vec<Mutation>),
    /// The AUTH_OK comes from another session of the same receiver (same
    /// token, another receiver nonce): a replay.
    ForeignAuthOk([u8; NONCE_LEN]),
}

fn conn_id() -> impl Strategy<Value = ConnectionId> {
    (
        any::<[u8; 4]>(),
        any::<u32>(),
        any::<[u8; 4]>(),
        any::<u32>(),
    )
        .prop_map(|(ra, rq, sa, sq)| ConnectionId {
            receiver_addr: std::net::IpAddr::from(ra),
            receiver_qpn: rq,
            sender_addr: std::net::IpAddr::from(sa),
            sender_qpn: sq,
        })
}

fn interference() -> impl Strategy<Value = Interference> {
    let mutations = || proptest::collection::vec(mutation(), 1..4);
    prop_oneof![
        3 => Just(Interference::None),
        2 => conn_id().prop_map(Interference::Relay),
        2 => proptest::collection::vec(any::<u8>(), 16..40).prop_map(Interference::OtherToken),
        1 => Just(Interference::Downgrade),
        2 => mutations().prop_map(Interference::MangleProve),
        2 => mutations().prop_map(Interference::MangleAuthOk),
        1 => any::<[u8; NONCE_LEN]>().prop_map(Interference::ForeignAuthOk),
    ]
}

/// What the handshake cases reached: both authenticated, the receiver
/// refused, the sender refused, a mangled frame that no longer decoded.
static HANDSHAKE: Reached = Reached::new();

/// Bytes of `msg` after `mutations`; None if they no longer decode.
fn mangled(msg: &Message, mutations: &[Mutation]) -> Option<Message> {
    let mut bytes = encode_to_vec(msg).ok()?;
    for m in mutations {
        mutate(&mut bytes, m);
    }
    decode(&bytes).ok()
}

/// One protocol-3 handshake between a sender machine and a receiver
/// machine, with `interference`. Both authenticate iff the token, the
/// connection and the nonces are the same on both sides and nothing
/// changed what one said to the other; otherwise at least one side
/// refuses, and a sender never may start a HELLO before it verified the
/// receiver.
fn check_handshake(
    secret: Vec<u8>,
    nonces: ([u8; NONCE_LEN], [u8; NONCE_LEN]),
    conn: ConnectionId,
    interference: Interference,
) -> Result<(), TestCaseError> {
    let token = Token::new(secret.clone()).ok_or_else(|| TestCaseError::fail("empty token"))?;
    let (r_nonce, s_nonce) = nonces;
    let cfg = ReceiverConfig {
        slot_size: 4096,
        slot_count: 4,
        credit_batch: 1,
        max_size: u64::MAX,
        max_files: DEFAULT_MAX_FILES,
        max_session_bytes: u64::MAX,
        names: NameRules::default(),
        digest_budget: DigestBudget::DEFAULT,
    };
    let mut r = ReceiverSession::with_auth(cfg, token.clone(), r_nonce, conn);
    let sender_conn = match &interference {
        Interference::Relay(other) => *other,
        _ => conn,
    };
    let sender_token = match &interference {
        Interference::OtherToken(t) => Token::new(t.clone()).unwrap_or_else(|| token.clone()),
        _ => token.clone(),
    };
    let mut s = SenderSession::new(
        4096,
        Some(SenderAuth {
            token: sender_token.clone(),
            nonce: s_nonce,
            conn: sender_conn,
        }),
    );
    prop_assert!(!s.can_start(), "a HELLO before the CHALLENGE");
    let Some(Message::Challenge(mut c)) = r.poll_transmit() else {
        return Err(TestCaseError::fail("no CHALLENGE"));
    };
    if let Interference::Downgrade = interference {
        c.flags &= !AUTH_REQUIRED;
    }
    let prove = match s.on_message(Message::Challenge(c)) {
        Ok(SenderEvent::Greeted(g)) => g.prove,
        Err(ProtocolError::NoAuthRequested) => {
            prop_assert!(matches!(interference, Interference::Downgrade));
            prop_assert!(!s.can_start(), "a HELLO after a downgrade");
            HANDSHAKE.hit(2);
            return Ok(());
        }
        other => return Err(TestCaseError::fail(format!("CHALLENGE gave {other:?}"))),
    };
    prop_assert!(
        !matches!(interference, Interference::Downgrade),
        "a downgrade went through"
    );
    let prove = prove.ok_or_else(|| TestCaseError::fail("no PROVE for AUTH_REQUIRED"))?;
    prop_assert!(!s.can_start(), "a HELLO before AUTH_OK");
    let (prove, prove_changed) = match &interference {
        Interference::MangleProve(ms) => match mangled(&prove, ms) {
            Some(m) => {
                let changed = m != prove;
                (m, changed)
            }
            None => {
                HANDSHAKE.hit(3);
                return Ok(());
            }
        },
        _ => (prove, false),
    };
    let honest_so_far = !prove_changed
        && !matches!(interference, Interference::Relay(c) if c != conn)
        && !matches!(&interference, Interference::OtherToken(t) if *t != secret);
    match r.on_message(prove) {
        Ok(ReceiverEvent::Authenticated) => {
            prop_assert!(
                honest_so_far,
                "a proof passed that should not: {:?}",
                interference
            );
            r.admit().map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
        Ok(other) => return Err(TestCaseError::fail(format!("PROVE gave {other:?}"))),
        Err(_) => {
            prop_assert!(!honest_so_far, "an honest proof failed");
            prop_assert_eq!(r.state(), ReceiverState::Closed);
            prop_assert!(r.take_channel().is_none());
            // What the receiver says is a refusal, never its proof.
            while let Some(m) = r.poll_transmit() {
                prop_assert!(
                    !matches!(m, Message::AuthOk { .. }),
                    "AUTH_OK after a failure"
                );
            }
            HANDSHAKE.hit(1);
            return Ok(());
        }
    }
    let Some(auth_ok) = r.poll_transmit() else {
        return Err(TestCaseError::fail("no AUTH_OK"));
    };
    let auth_ok = match &interference {
        Interference::MangleAuthOk(ms) => match mangled(&auth_ok, ms) {
            Some(m) => m,
            None => {
                HANDSHAKE.hit(3);
                return Ok(());
            }
        },
        Interference::ForeignAuthOk(other_nonce) => {
            let mut other = ReceiverSession::with_auth(cfg, token.clone(), *other_nonce, conn);
            other.poll_transmit();
            let Message::Prove(p) = &s_prove_for(&sender_token, other_nonce, s_nonce, conn) else {
                return Err(TestCaseError::fail("no PROVE"));
            };
            prop_assert!(other.on_message(Message::Prove(p.clone())).is_ok());
            other
                .admit()
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            other
                .poll_transmit()
                .ok_or_else(|| TestCaseError::fail("no foreign AUTH_OK"))?
        }
        _ => auth_ok,
    };
    let genuine = auth_ok
        == Message::AuthOk {
            proof: SessionKey::derive(&token, &r_nonce, &s_nonce, &conn).receiver_proof(),
        };
    match s.on_message(auth_ok) {
        Ok(SenderEvent::Authenticated) => {
            prop_assert!(
                genuine,
                "the sender took a proof that is not the receiver's"
            );
            prop_assert!(s.can_start());
            // Both channels talk to each other, each way, once per message.
            let mut mine = s
                .take_channel()
                .ok_or_else(|| TestCaseError::fail("no channel"))?;
            let mut theirs = r
                .take_channel()
                .ok_or_else(|| TestCaseError::fail("no channel"))?;
            let sealed = mine
                .seal(b"HELLO")
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(theirs.clone().open(&sealed).ok(), Some(&b"HELLO"[..]));
            prop_assert!(
                mine.clone().open(&sealed).is_err(),
                "opened in its own direction"
            );
            let back = theirs
                .seal(b"MR")
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(mine.open(&back).ok(), Some(&b"MR"[..]));
            HANDSHAKE.hit(0);
        }
        Ok(other) => return Err(TestCaseError::fail(format!("AUTH_OK gave {other:?}"))),
        Err(_) => {
            prop_assert!(!genuine, "the receiver's own proof was refused");
            prop_assert!(!s.can_start(), "a HELLO after a refused AUTH_OK");
            HANDSHAKE.hit(2);
        }
    }
    Ok(())
}

/// The PROVE an honest sender with `token` makes for `r_nonce` on `conn`.
fn s_prove_for(
    token: &Token,
    r_nonce: &[u8; NONCE_LEN],
    s_nonce: [u8; NONCE_LEN],
    conn: ConnectionId,
) -> Message {
    let key = SessionKey::derive(token, r_nonce, &s_nonce, &conn);
    Message::Prove(Prove {
        version: PROTOCOL_VERSION,
        nonce: s_nonce,
        proof: key.sender_proof().to_vec(),
    })
}

#[test]
fn handshake_mutual_and_bound() {
    fuzz(
        "handshake_mutual_and_bound",
        (
            proptest::collection::vec(any::<u8>(), 16..40),
            any::<([u8; NONCE_LEN], [u8; NONCE_LEN])>(),
            conn_id(),
            interference(),
        ),
        |_| 1,
        |(secret, nonces, conn, interference)| check_handshake(secret, nonces, conn, interference),
        || {
            format!(
                "{} mutual authentications, {} refused by the receiver, {} by the sender, {} \
                 mangled frames that no longer decoded",
                HANDSHAKE.get(0),
                HANDSHAKE.get(1),
                HANDSHAKE.get(2),
                HANDSHAKE.get(3)
            )
        },
    );
}

// ---------------------------------------------------- (b) receiver machine

#[derive(Debug, Clone)]
enum ChunkLen {
    /// A whole slot.
    Slot,
    /// What is left of the file (at most a slot).
    Rest,
    Zero,
    SlotPlus(u32),
    Any(u32),
}

#[derive(Debug, Clone)]
enum RxAction {
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
    /// (after COMPARE): 0 a KEEPALIVE while it reads, 1 the same (`same`),
    /// 2 it differs (`have` of nothing).
    Compared(u8),
    ChunkDone,
    Flush,
    Complete(AckStatus),
}

fn rx_action() -> impl Strategy<Value = RxAction> {
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
        6 => Just(RxAction::ChunkDone),
        1 => Just(RxAction::Flush),
        2 => prop_oneof![3 => Just(AckStatus::Ok), 1 => ack_status()].prop_map(RxAction::Complete),
    ]
}

/// A sequence mixing legal steps with hostile ones at a per-case rate
/// (0 to 50%), so that sessions both get deep and get attacked there.
fn sequence<A: Clone + std::fmt::Debug>(
    hostile: impl Strategy<Value = A>,
    legal: fn(u32) -> A,
    max_len: usize,
) -> impl Strategy<Value = Vec<A>> {
    (
        prop_oneof![1 => Just(0u32), 2 => 1u32..10, 2 => 10u32..50],
        proptest::collection::vec((0u32..100, any::<u32>(), hostile), 1..max_len),
    )
        .prop_map(move |(chaos, v)| {
            v.into_iter()
                .map(|(roll, seed, h)| if roll < chaos { h } else { legal(seed) })
                .collect()
        })
}

/// What the harness knows about the session, to check the machine against.
#[derive(Default)]
struct RxModel {
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
    /// Where the current file's data starts: bytes, chunks, chunk length.
    base: (u64, u64, u32),
    /// Digest questions (HAVE of a complete copy or of a digest) asked in
    /// the session, and their files' bytes.
    digest_questions: u32,
    digest_bytes: u64,
    /// Names whose copy was compared in the session: once each.
    compared: std::collections::BTreeSet<String>,
}

/// The current offer's name.
fn offer_name(m: &RxModel) -> String {
    m.offer.as_ref().map(|h| h.name.clone()).unwrap_or_default()
}

/// Whether the current offer may be compared: its name not compared yet
/// in the session, and the session's budget has room for one more digest
/// question about `bytes`.
fn within_budget(m: &RxModel, budget: DigestBudget, bytes: u64) -> bool {
    !m.compared.contains(&offer_name(m))
        && m.digest_questions < budget.questions
        && m.digest_bytes
            .checked_add(bytes)
            .is_some_and(|b| b <= budget.bytes)
}

/// The current offer asked to resume.
fn resumable(m: &RxModel) -> bool {
    m.offer
        .as_ref()
        .is_some_and(|h| h.caps & hello_flags::RESUME != 0)
}

/// The current offer's sender answers a request for its digest.
fn checksummed(m: &RxModel) -> bool {
    m.offer
        .as_ref()
        .is_some_and(|h| h.caps & hello_flags::CHECKSUM != 0)
}

/// Whether the engine may answer the current offer (AwaitDecision) with
/// a HAVE of `kind`: once, Digest for CHECKSUM, the others for RESUME.
fn may_have(m: &RxModel, kind: HaveKind) -> bool {
    m.have.is_none()
        && match kind {
            HaveKind::Digest => checksummed(m),
            _ => resumable(m),
        }
}

/// A HAVE after which COMPARE may come.
fn comparable(have: Option<HaveKind>) -> bool {
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
struct RxAuth {
    token: Token,
    nonce: [u8; NONCE_LEN],
}

impl RxAuth {
    fn session(auth: &Option<RxAuth>, cfg: ReceiverConfig) -> ReceiverSession {
        match auth {
            Some(a) => ReceiverSession::with_auth(cfg, a.token.clone(), a.nonce, test_conn()),
            None => ReceiverSession::new(cfg),
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

/// Every reply the receiver queued.
fn replies(r: &mut ReceiverSession) -> Vec<Message> {
    std::iter::from_fn(|| r.poll_transmit()).collect()
}

/// The machine answers every error of the sender's with exactly one reply
/// of its own making (the engine builds none), and nothing else: a REJECT
/// for a refused offer, REJECT(auth) for a failed authentication, an ACK
/// saying why for a broken session; nothing once the session is closed.
fn replies_fit(
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
fn legal_rx(
    state: ReceiverState,
    m: &RxModel,
    cfg: &ReceiverConfig,
    auth: &Option<RxAuth>,
    seed: u32,
) -> RxAction {
    use ReceiverState::*;
    let slots = u64::from(cfg.slot_count);
    match state {
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
                5 | 6 if seed.is_multiple_of(2) => {
                    (v, hello_flags::CHECKSUM, format!("c{}", m.files))
                }
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
            }))
        }
        AwaitDecision if seed.is_multiple_of(6) => RxAction::Reject(RejectCode::Exists),
        // An offer with RESUME gets its HAVE first (with CHECKSUM too,
        // now and then the request for its digest).
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
        Comparing if seed.is_multiple_of(2) => RxAction::Compared(1),
        Comparing => RxAction::Compared(2),
        // Never seen here: the engine decides as soon as the proof passed.
        AwaitAdmission => RxAction::Msg(Message::Bye),
    }
}

static RX: Reached = Reached::new();

fn check_receiver(
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
    for action in actions {
        let action = match action {
            RxAction::Legal(seed) => match legal_rx(r.state(), &m, &cfg, &auth, seed) {
                RxAction::Legal(_) => {
                    // Closed: the next session (its CHALLENGE goes first).
                    r = RxAuth::session(&auth, cfg);
                    prop_assert!(matches!(r.poll_transmit(), Some(Message::Challenge(_))));
                    m = RxModel::default();
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
                let msg = match action {
                    RxAction::Msg(msg) => msg,
                    RxAction::Frame(b) => match decode(&b) {
                        Ok(msg) => msg,
                        Err(e) => {
                            // An undecodable frame ends the session with
                            // the machine's own reply.
                            let version =
                                matches!(e, rdma_xfer::proto::WireError::UnknownVersion(_));
                            let err = r.on_undecodable(e);
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
                let result = r.on_message(msg);
                // The engine's admission after a right proof: nothing is
                // answered before it; a session is free unless the case's
                // receiver nonce says otherwise (1 in 8: busy).
                let refused_busy = match (&result, &auth) {
                    (Ok(ReceiverEvent::Authenticated), Some(a)) => {
                        prop_assert!(replies(&mut r).is_empty(), "an answer before admission");
                        prop_assert_eq!(r.state(), AwaitAdmission);
                        if a.nonce[0] % 8 == 0 {
                            RX.hit(6);
                            Some(
                                r.refuse_busy(2)
                                    .ok_or_else(|| TestCaseError::fail("not refused"))?,
                            )
                        } else {
                            r.admit()
                                .map_err(|e| TestCaseError::fail(format!("not admitted: {e}")))?;
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
                    prop_assert!(r.take_channel().is_none(), "a channel for a refused sender");
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
                    prop_assert!(r.take_channel().is_none(), "a channel without AUTH_OK");
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
                    Ok(ReceiverEvent::From { offset }) => {
                        // Only where a HAVE offered it: 0 or its prefix.
                        prop_assert_eq!(before, AwaitFrom);
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
                    Ok(ReceiverEvent::Compare { sha256 }) => {
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
                        prop_assert!(r.clone().have(Have::ask_digest(total)).is_err());
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
                    Ok(ReceiverEvent::Fin(f)) => {
                        prop_assert_eq!(before, Receiving);
                        if !m.is_stream() {
                            let size = m.offer.as_ref().map(|h| h.size);
                            prop_assert_eq!(Some(f.bytes), size);
                        }
                        prop_assert_eq!(f.bytes, m.bytes);
                        prop_assert_eq!(f.chunks, m.chunks);
                        prop_assert_eq!(r.state(), Verifying);
                        RX.hit(2);
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
                        let mut theirs = r
                            .take_channel()
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
                replies_fit(before, result.as_ref().err(), &replies(&mut r))?;
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
                    Err(RecvError::Protocol(_)) => prop_assert_eq!(r.state(), Closed),
                    Err(RecvError::TooLarge { limit, option }) => {
                        // Only a stream, only past --max-size.
                        prop_assert_eq!(option, "--max-size");
                        prop_assert!(m.is_stream());
                        prop_assert_eq!(limit, cfg.max_size);
                        prop_assert!(m.bytes + u64::from(len - tag_len) > cfg.max_size);
                        prop_assert_eq!(r.state(), Closed);
                    }
                    Err(
                        RecvError::Reject(_)
                        | RecvError::Auth(_)
                        | RecvError::Version(_)
                        | RecvError::Forged(_)
                        | RecvError::SessionLimit(_),
                    ) => {
                        return Err(TestCaseError::fail("on_chunk returned a Reject"));
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
                match r.accept(ring) {
                    Ok(mr) => {
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
                match r.have(have.clone()) {
                    Ok(msg) => {
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
                        }
                        prop_assert_eq!(r.state(), before);
                    }
                }
            }
            RxAction::Compared(what) => {
                let comparing = before == Comparing;
                match what {
                    // Reading its copy (or a kept prefix): the sender waits.
                    0 => {
                        let reading = comparing
                            || (before == AwaitDecision
                                && (m.base.0 > 0 || (resumable(&m) && m.have.is_none())));
                        match r.keepalive() {
                            Ok(msg) => {
                                prop_assert!(reading, "KEEPALIVE in {:?}", before);
                                prop_assert_eq!(msg, Message::Keepalive);
                            }
                            Err(_) => prop_assert!(!reading, "KEEPALIVE refused in {:?}", before),
                        }
                        prop_assert_eq!(r.state(), before);
                    }
                    // The same: the file is done without data, its ACK.
                    1 => match r.same() {
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
                        match r.have(differs.clone()) {
                            Ok(msg) => {
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
            RxAction::AcceptDir => match r.accept_directory() {
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
            RxAction::Reject(code) => match r.reject(code, "no".into()) {
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
            RxAction::ChunkDone => {
                let credit = r.chunk_done();
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
                if let Some(msg) = r.flush_credits() {
                    let Message::Credit { count } = msg else {
                        return Err(TestCaseError::fail("flush_credits returned a non-CREDIT"));
                    };
                    prop_assert_eq!(before, Receiving);
                    prop_assert!(count > 0 && u64::from(count) <= m.pending);
                    m.pending -= u64::from(count);
                }
            }
            RxAction::Complete(status) => match r.complete(status, "why".into()) {
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
    }
    Ok(())
}

/// What an accepted name never is, said without `validate_path`: a
/// dotfile (unless allowed), one of the receiver's own names in any case,
/// or one with an invisible character.
fn check_accepted_name(name: &str, rules: NameRules) -> Result<(), TestCaseError> {
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
fn machine_receiver() {
    let cfg = (
        1u32..64,
        1u32..8,
        0u32..10,
        prop_oneof![3 => Just(u64::MAX), 1 => 0u64..300],
        prop_oneof![3 => Just(DEFAULT_MAX_FILES), 1 => 1u64..4],
        any::<bool>(),
        prop_oneof![
            1 => Just(DigestBudget::DEFAULT),
            3 => (0u32..4, 0u64..600).prop_map(|(questions, bytes)| DigestBudget { questions, bytes }),
        ],
    )
        .prop_map(
            |(slot_size, slot_count, credit_batch, max_size, max_files, allow_dotfiles, digest_budget)| {
                ReceiverConfig {
                    slot_size,
                    slot_count,
                    credit_batch,
                    max_size,
                    max_files,
                    max_session_bytes: u64::MAX,
                    names: NameRules { allow_dotfiles },
                    digest_budget,
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
                 same), {} digest questions past the budget refused",
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
                RX.get(12)
            )
        },
    );
}

// ------------------------------------------------------ (c) sender machine

#[derive(Debug, Clone)]
enum TxAction {
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
    Close,
    /// Small files offered together (BATCH): their sizes, one digest (or,
    /// now and then, a second one for the last file).
    StartBatch(Vec<u64>, DigestAlg, Option<DigestAlg>),
    /// The engine's answer to a HAVE, as the seed picks: FROM 0 or the
    /// prefix, COMPARE (its SHA-256) for a complete copy; now and then one
    /// that does not fit (FROM past the prefix, FROM of a complete copy's
    /// size, COMPARE of no complete copy).
    From(u32),
}

fn offer_kind() -> impl Strategy<Value = OfferKind> {
    prop_oneof![
        3 => Just(OfferKind::File),
        1 => Just(OfferKind::Stream),
        1 => Just(OfferKind::Directory),
    ]
}

fn tx_action() -> impl Strategy<Value = TxAction> {
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
        1 => any::<u32>().prop_map(TxAction::From),
    ]
}

#[derive(Default)]
struct TxModel {
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
    /// Bytes of a chunk's tag after it: `CHUNK_TAG_LEN` once the receiver
    /// proved the token.
    tag_len: u32,
}

/// The sender's offers: a file with CHECKSUM (`--checksum`) now and then;
/// streams and directories get the same option and must drop it.
fn tx_checksum(size: u64) -> bool {
    size % 3 == 1
}

static TX: Reached = Reached::new();

/// The legal next step in state `state`.
fn legal_tx(state: SenderState, m: &TxModel, seed: u32) -> TxAction {
    use SenderState::*;
    let front = m.pending.front().copied();
    match state {
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
        // An offer with CHECKSUM may be asked for its digest (once).
        AwaitRing if m.checksum && m.have.is_none() && seed % 3 == 1 => {
            TxAction::Msg(Message::Have(Have::ask_digest(m.size)))
        }
        // The receiver reading a resumed prefix back says it is alive.
        AwaitRing if m.base_len > 0 && seed.is_multiple_of(5) => TxAction::Msg(Message::Keepalive),
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

fn check_sender(
    chunk_size: u32,
    secret: Option<Vec<u8>>,
    actions: Vec<TxAction>,
) -> Result<(), TestCaseError> {
    use SenderState::*;
    let token = secret.and_then(Token::new);
    let new_session = || {
        SenderSession::new(
            chunk_size,
            token.clone().map(|token| SenderAuth {
                token,
                nonce: S_NONCE,
                conn: test_conn(),
            }),
        )
    };
    // Whether the receiver proved itself in this session.
    let mut proven = false;
    let mut s = new_session();
    let mut m = TxModel::default();
    for action in actions {
        let action = match action {
            TxAction::Legal(seed) => match legal_tx(s.state(), &m, seed) {
                TxAction::Legal(_) => {
                    s = new_session();
                    m = TxModel::default();
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
                    })
                    .collect();
                let total = sizes.iter().try_fold(0u64, |t, &x| t.checked_add(x));
                let mixed = other.is_some_and(|d| d != digest) && n > 1;
                // The batch's digest is its files' (the first one's).
                let digest = offers.first().map_or(digest, |o| o.digest);
                let tag = m.next_tag;
                m.next_tag += 1;
                match s.start_batch(offers, tag) {
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
                            };
                            prop_assert_eq!(
                                (h.size, h.caps, h.version),
                                (size, caps, PROTOCOL_VERSION)
                            );
                        }
                        prop_assert_eq!(s.state(), AwaitRing);
                        m.tag = tag;
                        m.have = None;
                        m.base_len = 0;
                        // A batch is never asked for digests.
                        m.checksum = false;
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
                };
                let checksum = kind == OfferKind::File && tx_checksum(size);
                let resume_caps = if resume {
                    hello_flags::RESUME | hello_flags::MTIME
                } else {
                    0
                } | if checksum { hello_flags::CHECKSUM } else { 0 };
                let tag = m.next_tag;
                m.next_tag += 1;
                match s.start_file(offer, tag) {
                    Ok(msg) => {
                        prop_assert_eq!(before, Idle);
                        // With a token: no name, no size before AUTH_OK.
                        prop_assert!(token.is_none() || proven, "HELLO before AUTH_OK");
                        prop_assert!(m.pending.len() < MAX_PENDING);
                        let Message::Hello(h) = msg else {
                            return Err(TestCaseError::fail("start_file gave no HELLO"));
                        };
                        prop_assert!(encode_to_vec(&Message::Hello(h.clone())).is_ok());
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
                                prop_assert_eq!(h.caps & hello_flags::CHECKSUM, 0);
                            }
                            OfferKind::Directory => {
                                prop_assert_eq!(h.size, 0);
                                prop_assert!(h.is_directory() && h.version == PROTOCOL_VERSION);
                                prop_assert_eq!(h.caps & hello_flags::CHECKSUM, 0);
                            }
                        }
                        if kind == OfferKind::Directory {
                            // No ring for a directory: its answer is pending.
                            prop_assert_eq!(s.state(), Idle);
                            m.pending.push_back(Pending::Directory);
                            m.tags.push_back(tag);
                        } else {
                            m.tag = tag;
                            let next = if resume { AwaitHave } else { AwaitRing };
                            prop_assert_eq!(s.state(), next);
                            m.have = None;
                            m.base_len = 0;
                            m.checksum = checksum;
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
            TxAction::Msg(_)
            | TxAction::CreditLike(_)
            | TxAction::AckLike(_)
            | TxAction::HaveLike(_) => {
                let msg = match action {
                    TxAction::Msg(msg) => msg,
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
                if before == Closed {
                    prop_assert!(result.is_err(), "a closed session accepted {}", kind);
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
                        (AwaitRing, HaveKind::Digest) => m.checksum && m.have.is_none(),
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
                match result {
                    Ok(SenderEvent::Greeted(g)) => {
                        prop_assert_eq!(before, AwaitChallenge);
                        let Message::Challenge(c) = sent else {
                            return Err(TestCaseError::fail(format!("greeted by {kind}")));
                        };
                        if c.auth_required() {
                            prop_assert_eq!(s.state(), AwaitAuthOk);
                            let Some(Message::Prove(p)) = g.prove else {
                                return Err(TestCaseError::fail("no PROVE"));
                            };
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
                            prop_assert_eq!(g.prove, None);
                            prop_assert_eq!(s.state(), Idle);
                        }
                        TX.hit(4);
                    }
                    Ok(SenderEvent::Authenticated) => {
                        prop_assert_eq!(before, AwaitAuthOk);
                        prop_assert!(token.is_some());
                        prop_assert_eq!(Some(&sent), m.auth_ok.as_ref(), "a wrong AUTH_OK passed");
                        prop_assert_eq!(s.state(), Idle);
                        prop_assert!(s.take_channel().is_some());
                        proven = true;
                        m.tag_len = CHUNK_TAG_LEN as u32;
                        prop_assert_eq!(s.tag_len(), m.tag_len);
                    }
                    Ok(SenderEvent::Keepalive) => {
                        // Only while the receiver reads its copy: before
                        // the HAVE, after COMPARE, or after FROM continued
                        // a prefix.
                        prop_assert!(
                            matches!(before, AwaitHave | AwaitCompared)
                                || (before == AwaitRing && m.base_len > 0)
                        );
                        prop_assert!(m.pending.is_empty());
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
                                prop_assert_eq!(h.kind, HaveKind::Digest);
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
                        tag,
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
                        prop_assert!(a.status != AckStatus::Ok);
                        prop_assert_eq!(s.state(), Closed);
                    }
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
                match s.finish(digest) {
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
            TxAction::Close => match s.close() {
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
                    match s.compare(sha256) {
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
fn check_from(
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
    match s.start_from(offset) {
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
fn check_plan(
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
fn machine_sender() {
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
                 {} batches offered, {} digests asked ({} linked)",
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
                TX.get(10)
            )
        },
    );
}
