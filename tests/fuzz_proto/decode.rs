//! (a) The decoder on arbitrary bytes and mutated frames, the round trip
//! through the encoder, and sealed control messages through a channel pair.

use super::strategies::*;
use super::*;

/// What the decoder must guarantee for any input: no panic (the caller runs
/// it), and an accepted frame is canonical.
pub(crate) static DECODED: Reached = Reached::new();

/// `counter`: which DECODED slot counts the accepted frames.
pub(crate) fn check_decoded(bytes: &[u8], counter: usize) -> Result<(), TestCaseError> {
    if let Ok(msg) = decode(bytes) {
        DECODED.hit(counter);
        prop_assert!(bytes.len() <= MAX_MESSAGE, "accepted {} bytes", bytes.len());
        let again = encode_to_vec(&msg);
        prop_assert_eq!(again.as_deref(), Ok(bytes), "non-canonical: {:?}", msg);
    }
    Ok(())
}

#[test]
pub(crate) fn decode_arbitrary_bytes() {
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
pub(crate) fn decode_mutated_frames() {
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
pub(crate) fn decode_encode_round_trip() {
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
pub(crate) enum SealOp {
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

pub(crate) fn seal_op() -> impl Strategy<Value = SealOp> {
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

pub(crate) static SEALED: Reached = Reached::new();

/// Seals `msg` on the sender's channel: (its sequence number, the sealed
/// bytes, the frame).
pub(crate) fn seal_next(
    s: &mut Channel,
    msg: &Message,
) -> Result<(u64, Vec<u8>, Vec<u8>), TestCaseError> {
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
pub(crate) fn arrive(
    r: &mut Channel,
    seq: u64,
    sealed: &[u8],
    frame: &[u8],
) -> Result<(), TestCaseError> {
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
pub(crate) fn refused(r: &mut Channel, bytes: &[u8]) -> Result<(), TestCaseError> {
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

pub(crate) fn check_sealed(
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
pub(crate) fn decode_sealed_messages() {
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
