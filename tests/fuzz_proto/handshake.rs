//! (a2) The protocol 3 handshake, mutual and bound to the connection,
//! under interference.

use super::strategies::*;
use super::*;

/// What stands between the sender and the receiver during one handshake.
#[derive(Debug, Clone)]
pub(crate) enum Interference {
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

pub(crate) fn conn_id() -> impl Strategy<Value = ConnectionId> {
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

pub(crate) fn interference() -> impl Strategy<Value = Interference> {
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
pub(crate) static HANDSHAKE: Reached = Reached::new();

/// Bytes of `msg` after `mutations`; None if they no longer decode.
pub(crate) fn mangled(msg: &Message, mutations: &[Mutation]) -> Option<Message> {
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
pub(crate) fn check_handshake(
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
        timeout: std::time::Duration::from_secs(30),
        relay_allowed: false,
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
        Ok(SenderEvent::Greeted(g)) => {
            let prove = s.poll_transmit();
            prop_assert_eq!(g.proving, prove.is_some());
            prop_assert_eq!(s.poll_transmit(), None);
            prove
        }
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
    let mut theirs = match r.on_message(prove) {
        Ok(ReceiverEvent::Authenticated) => {
            prop_assert!(
                honest_so_far,
                "a proof passed that should not: {:?}",
                interference
            );
            r.admit().map_err(|e| TestCaseError::fail(e.to_string()))?
        }
        Ok(other) => return Err(TestCaseError::fail(format!("PROVE gave {other:?}"))),
        Err(_) => {
            prop_assert!(!honest_so_far, "an honest proof failed");
            prop_assert_eq!(r.state(), ReceiverState::Closed);
            prop_assert!(r.admit().is_err(), "a channel after a failed proof");
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
    };
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
        Ok(SenderEvent::Authenticated(mut mine)) => {
            prop_assert!(
                genuine,
                "the sender took a proof that is not the receiver's"
            );
            prop_assert!(s.can_start());
            // Both channels talk to each other, each way, once per message.
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
pub(crate) fn s_prove_for(
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
pub(crate) fn handshake_mutual_and_bound() {
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
