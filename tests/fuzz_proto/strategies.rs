//! Generators of the inputs every property draws from: names, sizes,
//! messages, connections, challenges, and the mutations of valid frames.

use super::*;
use rdma_xfer::proto::assembly::{PIECE_ALIGN, Piece, TransferId};

pub(crate) fn text(max_chars: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        3 => proptest::collection::vec(any::<char>(), 0..max_chars).prop_map(String::from_iter),
        1 => (0usize..=MAX_BODY).prop_map(|n| "r".repeat(n / 2)),
    ]
}

/// File names: plain ones (mostly valid), hostile ones, arbitrary text.
pub(crate) fn name() -> impl Strategy<Value = String> {
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

pub(crate) fn size() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 0u64..300,
        1 => Just(u64::MAX),
        1 => any::<u64>(),
    ]
}

pub(crate) fn digest_alg() -> impl Strategy<Value = DigestAlg> {
    prop_oneof![Just(DigestAlg::Crc32), Just(DigestAlg::Sha256)]
}

pub(crate) fn digest() -> impl Strategy<Value = Digest> {
    prop_oneof![
        any::<u32>().prop_map(Digest::Crc32),
        any::<[u8; 32]>().prop_map(Digest::Sha256),
    ]
}

pub(crate) fn reject_code() -> impl Strategy<Value = RejectCode> {
    proptest::sample::select(RejectCode::ALL.to_vec())
}

pub(crate) fn ack_status() -> impl Strategy<Value = AckStatus> {
    proptest::sample::select(AckStatus::ALL.to_vec())
}

/// HELLO flags: mostly the known kinds, sometimes anything.
pub(crate) fn caps() -> impl Strategy<Value = u32> {
    use hello_flags::{CHECKSUM, DIRECTORY, MTIME, PIECE, RESUME, STREAM};
    prop_oneof![
        3 => Just(0),
        2 => Just(STREAM),
        2 => Just(DIRECTORY),
        1 => Just(MTIME),
        1 => Just(DIRECTORY | MTIME),
        1 => Just(STREAM | DIRECTORY),
        1 => Just(CHECKSUM),
        1 => Just(CHECKSUM | STREAM),
        1 => Just(PIECE | MTIME),
        1 => Just(PIECE | MTIME | RESUME),
        1 => any::<u32>(),
    ]
}

/// A piece on a small grid (mostly sound, sometimes off it).
fn piece() -> impl Strategy<Value = Piece> {
    (
        any::<[u8; 2]>(),
        0u32..4,
        prop_oneof![3 => Just(PIECE_ALIGN), 1 => any::<u64>()],
        prop_oneof![3 => 1u64..4 * PIECE_ALIGN, 1 => any::<u64>()],
    )
        .prop_map(|(id, index, piece_size, file_size)| {
            let mut transfer = [0u8; 16];
            transfer[..2].copy_from_slice(&id);
            Piece {
                transfer: TransferId(transfer),
                index,
                piece_size,
                file_size,
            }
        })
}

pub(crate) fn hello() -> impl Strategy<Value = Hello> {
    (
        prop_oneof![4 => Just(PROTOCOL_VERSION), 1 => Just(1u16), 1 => any::<u16>()],
        caps(),
        name(),
        size(),
        any::<u32>(),
        digest_alg(),
        (any::<i64>(), 0u32..1_000_000_000),
        piece(),
    )
        .prop_map(
            |(version, caps, name, size, mode, digest, (secs, nanos), piece)| Hello {
                version,
                caps,
                name,
                size,
                mode,
                digest,
                // The codec needs the flags and the fields to agree.
                mtime: (caps & hello_flags::MTIME != 0).then_some(Mtime { secs, nanos }),
                piece: (caps & hello_flags::PIECE != 0).then_some(piece),
            },
        )
}

pub(crate) fn ring() -> impl Strategy<Value = RingInfo> {
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

/// A host as RELAY and RESULT carry it: printable ASCII, 1 to 255
/// bytes (mostly short).
pub(crate) fn host() -> impl Strategy<Value = String> {
    let graphic = proptest::sample::select((b'!'..=b'~').collect::<Vec<u8>>());
    prop_oneof![
        4 => proptest::collection::vec(graphic.clone(), 1..24),
        1 => proptest::collection::vec(graphic, MAX_HOST_LEN..=MAX_HOST_LEN),
    ]
    .prop_map(|b| String::from_utf8(b).unwrap_or_default())
}

/// A RELAY that fits a frame: a few hosts, or hundreds of one-letter
/// ones (two of those pass MAX_RELAY_HOPS), or a frame's worth of the
/// longest.
pub(crate) fn relay() -> impl Strategy<Value = Relay> {
    prop_oneof![
        4 => proptest::collection::vec(host(), 1..6),
        1 => (500usize..700).prop_map(|n| vec!["h".to_string(); n]),
        1 => (1usize..=15).prop_map(|n| vec!["~".repeat(MAX_HOST_LEN); n]),
    ]
    .prop_map(|hops| Relay { hops })
}

/// One host's verdict, as RESULT carries it.
pub(crate) fn hop_result() -> impl Strategy<Value = HopResult> {
    (
        host(),
        prop_oneof![
            ack_status().prop_map(HopVerdict::Ack),
            reject_code().prop_map(HopVerdict::Reject),
            Just(HopVerdict::Lost),
        ],
        size(),
        text(40),
    )
        .prop_map(|(host, verdict, bytes, reason)| HopResult::new(host, verdict, bytes, reason))
}

/// Any message of the protocol, edge values included.
pub(crate) fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        relay().prop_map(Message::Relay),
        hop_result().prop_map(Message::Result),
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
pub(crate) fn test_conn() -> ConnectionId {
    ConnectionId {
        receiver_addr: "10.77.0.1".parse().unwrap(),
        receiver_qpn: 0x11,
        sender_addr: "10.77.0.2".parse().unwrap(),
        sender_qpn: 0x12,
    }
}

/// The sender's nonce in the harnesses.
pub(crate) const S_NONCE: [u8; NONCE_LEN] = [0x5e; NONCE_LEN];

pub(crate) fn challenge() -> impl Strategy<Value = Challenge> {
    (
        prop_oneof![Just(0u16), Just(AUTH_REQUIRED)],
        any::<[u8; NONCE_LEN]>(),
    )
        .prop_map(|(flags, nonce)| Challenge { flags, nonce })
}

/// A shared secret and a session nonce, or none (no authentication).
pub(crate) fn auth_key() -> impl Strategy<Value = Option<(Vec<u8>, [u8; NONCE_LEN])>> {
    prop_oneof![
        1 => Just(None),
        1 => (proptest::collection::vec(any::<u8>(), 1..40), any::<[u8; NONCE_LEN]>())
            .prop_map(Some),
    ]
}

#[derive(Debug, Clone)]
pub(crate) enum Mutation {
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

pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
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

pub(crate) fn mutate(buf: &mut Vec<u8>, m: &Mutation) {
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

/// A sequence mixing legal steps with hostile ones at a per-case rate
/// (0 to 50%), so that sessions both get deep and get attacked there.
pub(crate) fn sequence<A: Clone + std::fmt::Debug>(
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
