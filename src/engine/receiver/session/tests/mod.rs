//! Whole receiver sessions without RDMA: the session runs on its own
//! thread over an in-memory link, the test plays the sender with the
//! protocol's sender machine and looks at the result, the replies, the
//! reported files and the directory.

mod dry_run;
mod existing;
mod file_work;
mod peer;
mod pieces;

use super::{Parts, drive};
use crate::engine::memory_wire::{self, ReceiverEnd};
use crate::engine::receiver::OnFile;
use crate::engine::receiver::ReceiverConfig;
use crate::engine::receiver::admission::{Admission, SessionSlots};
use crate::engine::receiver::storage::FileStore;
// The names in a directory, sorted (temporary files included).
use crate::engine::receiver::storage::tests::entries as listing;
use crate::engine::report::{FileEvent, Outcome};
use crate::error::XferError;
use crate::proto::{
    AckStatus, ConnectionId, Digest, DigestAlg, FileOffer, HaveKind, Message, NONCE_LEN,
    RejectCode, SenderAuth, SenderEvent, SenderSession, Token,
};
use peer::{Peer, bytes, file};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the session reported about one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine) enum Reported {
    Done {
        name: String,
        bytes: u64,
        outcome: Outcome,
    },
    Failed {
        name: String,
        reason: String,
    },
}

/// How a session ended, and what the test's sender made of it.
struct Ended<T> {
    result: Result<(), XferError>,
    played: T,
    reported: Vec<Reported>,
    /// The session closed its link.
    closed: bool,
}

fn config(dir: &std::path::Path) -> ReceiverConfig {
    let mut cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), dir.into());
    // Small chunks and a short ring: files of a few chunks wait for credit.
    cfg.chunk_size = 4096;
    cfg.slots = 2;
    cfg
}

fn token() -> Token {
    Token::new(b"session-test".to_vec()).unwrap()
}

const CONN: ConnectionId = ConnectionId {
    receiver_addr: std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1)),
    receiver_qpn: 17,
    sender_addr: std::net::IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2)),
    sender_qpn: 18,
};

/// Serves one session with `cfg` over `end` (admitted at once; with a
/// token, bound to `CONN`).
pub(in crate::engine) fn serve(
    cfg: &ReceiverConfig,
    end: ReceiverEnd,
    on_file: &OnFile<'_>,
) -> Result<(), XferError> {
    serve_as(cfg, end, on_file, false)
}

/// `serve`, the session joining another's (`--once`) if `joined`.
fn serve_as(
    cfg: &ReceiverConfig,
    end: ReceiverEnd,
    on_file: &OnFile<'_>,
    joined: bool,
) -> Result<(), XferError> {
    let slots = SessionSlots::new(1);
    let mut admission = Admission::Admitted {
        _slot: slots.take().expect("a free slot"),
    };
    let parts = Parts {
        cfg,
        admission: &mut admission,
        on_admitted: &|| {},
        joined: &|| joined,
        on_file,
        unposted_recvs: 0,
        peer: "the test's sender".into(),
        connect_time: Duration::ZERO,
    };
    let machine = crate::engine::receiver::new_machine(cfg, || Ok(CONN))?;
    let store = FileStore::open(cfg, &Arc::default())?;
    drive(parts, Box::new(end), machine, store)
}

/// What the session reported, as the tests compare it.
pub(in crate::engine) fn reported(event: FileEvent<'_>) -> Reported {
    match event {
        FileEvent::Done(r) => Reported::Done {
            name: r.name.clone(),
            bytes: r.bytes,
            outcome: r.outcome,
        },
        FileEvent::Failed(f) => Reported::Failed {
            name: f.name.clone(),
            reason: f.reason.clone(),
        },
    }
}

/// The sender's authentication for a receiver with `cfg`'s token.
pub(in crate::engine) fn sender_auth(cfg: &ReceiverConfig) -> Option<SenderAuth> {
    cfg.token.clone().map(|token| SenderAuth {
        token,
        nonce: [9; NONCE_LEN],
        conn: CONN,
    })
}

/// Runs one session with `cfg` while `play` is its sender (with the
/// token when `cfg` has one); the sender goes away when `play` returns.
fn session<T>(cfg: &ReceiverConfig, play: impl FnOnce(&mut Peer) -> T) -> Ended<T> {
    session_hooked(cfg, || {}, play)
}

/// `session`, whose thread runs `hook` first (to set the test hooks of
/// its file work: `COMPARE_HOOK`, `worker::fail_next_start`).
fn session_hooked<T>(
    cfg: &ReceiverConfig,
    hook: impl FnOnce() + Send,
    play: impl FnOnce(&mut Peer) -> T,
) -> Ended<T> {
    session_as(cfg, hook, false, play)
}

/// `session` joining another's (`--once`): it carries pieces only.
fn session_joined<T>(cfg: &ReceiverConfig, play: impl FnOnce(&mut Peer) -> T) -> Ended<T> {
    session_as(cfg, || {}, true, play)
}

/// `session_hooked`, joining another's if `joined`.
fn session_as<T>(
    cfg: &ReceiverConfig,
    hook: impl FnOnce() + Send,
    joined: bool,
    play: impl FnOnce(&mut Peer) -> T,
) -> Ended<T> {
    let (sender_end, receiver_end) = memory_wire::pair();
    let disconnected = receiver_end.side.disconnected.clone();
    let log = Mutex::new(Vec::new());
    let auth = sender_auth(cfg);
    let sha256 = auth.is_some();
    let slot_size = cfg.slot_size() as usize;
    let mut peer = Peer::new(SenderSession::new(0, auth), sender_end, slot_size);
    if sha256 {
        peer.digest = DigestAlg::Sha256;
    }
    let (result, played) = std::thread::scope(|s| {
        let running = s.spawn(|| {
            hook();
            let on_file = |event: FileEvent<'_>| log.lock().unwrap().push(reported(event));
            serve_as(cfg, receiver_end, &on_file, joined)
        });
        let played = play(&mut peer);
        drop(peer);
        (running.join().expect("the session panicked"), played)
    });
    Ended {
        result,
        played,
        reported: log.into_inner().unwrap(),
        closed: disconnected.load(Ordering::SeqCst),
    }
}

/// Offers `offer`, takes the session's HAVE (of `kind`), sends the
/// COMPARE of `data`'s SHA-256 and returns the session's verdict; then
/// BYE.
fn compare_then_bye(peer: &mut Peer, offer: FileOffer, kind: HaveKind, data: &[u8]) -> SenderEvent {
    use sha2::Digest as _;
    let SenderEvent::Have(have) = peer.offer(offer) else {
        panic!("no HAVE");
    };
    assert_eq!(have.kind, kind);
    let sha256: [u8; 32] = sha2::Sha256::digest(data).into();
    peer.machine.compare(sha256).unwrap();
    peer.transmit();
    let verdict = peer.event();
    peer.bye();
    verdict
}

fn done(name: &str, bytes: u64) -> Reported {
    Reported::Done {
        name: name.into(),
        bytes,
        outcome: Outcome::Stored,
    }
}

#[test]
fn files_arrive_whole_and_each_is_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    // Five chunks through a ring of two: the sender waits for credits.
    let (big, small) = (bytes(4096 * 4 + 100, 1), bytes(10, 2));
    let ended = session(&cfg, |peer| {
        peer.greet();
        let acks = [
            peer.send_file("big", &big),
            peer.send_file("small", &small),
            peer.send_file("empty", &[]),
        ];
        peer.bye();
        acks
    });
    ended.result.unwrap();
    for ack in &ended.played {
        assert_eq!(ack.status, AckStatus::Ok, "{ack:?}");
    }
    assert_eq!(
        ended.reported,
        [done("big", 16484), done("small", 10), done("empty", 0)]
    );
    assert_eq!(listing(dir.path()), ["big", "empty", "small"]);
    assert_eq!(std::fs::read(dir.path().join("big")).unwrap(), big);
    assert_eq!(std::fs::read(dir.path().join("small")).unwrap(), small);
    assert!(ended.closed);
}

#[test]
fn with_a_token_every_message_is_sealed_and_every_chunk_tagged() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.token = Some(token());
    let data = bytes(9000, 3);
    let ended = session(&cfg, |peer| {
        peer.greet();
        assert!(peer.machine.chunk_auth().is_some());
        let ack = peer.send_file("f", &data);
        peer.bye();
        ack
    });
    ended.result.unwrap();
    assert_eq!(ended.played.status, AckStatus::Ok);
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
}

#[test]
fn a_forged_message_ends_the_session_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.token = Some(token());
    let ended = session(&cfg, |peer| {
        peer.greet();
        let mut offer = file("f", 10);
        offer.digest = DigestAlg::Sha256;
        peer.machine.start_file(offer, 1).unwrap();
        let hello = peer.machine.poll_transmit().unwrap();
        let mut sealed = peer.end.codec.seal(&hello).unwrap();
        sealed[3] ^= 1;
        peer.end.send_raw(sealed);
        // The session says why, and goes.
        (peer.recv(), peer.recv())
    });
    assert!(
        matches!(ended.result, Err(XferError::Forged { .. })),
        "{:?}",
        ended.result
    );
    let (Some(Message::Ack(ack)), None) = ended.played else {
        panic!("{:?}", ended.played);
    };
    assert_eq!(ack.status, AckStatus::Protocol);
    assert!(ack.reason.contains("failed its MAC check"), "{ack:?}");
    assert!(listing(dir.path()).is_empty());
}

#[test]
fn a_chunk_that_fails_its_crc_aborts_the_file_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(4096 * 3, 4);
    let ended = session(&cfg, |peer| {
        peer.greet();
        assert!(matches!(
            peer.offer(file("f", data.len() as u64)),
            SenderEvent::Ring(_)
        ));
        peer.write_data(&data, Some(1));
        peer.event()
    });
    assert!(
        matches!(&ended.result, Err(XferError::Integrity(m)) if m.contains("chunk 1 of f")),
        "{:?}",
        ended.result
    );
    let SenderEvent::Aborted(ack) = ended.played else {
        panic!("{:?}", ended.played);
    };
    assert_eq!(ack.failure, crate::proto::AckFailure::Integrity);
    assert!(matches!(&ended.reported[..], [Reported::Failed { name, .. }] if name == "f"));
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));
}

#[test]
fn a_wrong_whole_file_digest_fails_that_file_only() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (bad, good) = (bytes(5000, 5), bytes(300, 6));
    let ended = session(&cfg, |peer| {
        peer.greet();
        assert!(matches!(
            peer.offer(file("bad", 5000)),
            SenderEvent::Ring(_)
        ));
        let Digest::Crc32(crc) = peer.write_data(&bad, None).finish() else {
            unreachable!()
        };
        let acks = [
            peer.finish(Digest::Crc32(!crc)),
            peer.send_file("good", &good),
        ];
        peer.bye();
        acks
    });
    assert_eq!(ended.played[0].status, AckStatus::Integrity);
    assert!(ended.played[0].reason.contains("digest mismatch for bad"));
    assert_eq!(ended.played[1].status, AckStatus::Ok);
    // The session reports the file's failure at its end.
    assert!(matches!(ended.result, Err(XferError::Integrity(_))));
    assert!(matches!(&ended.reported[0], Reported::Failed { name, .. } if name == "bad"));
    assert_eq!(ended.reported[1], done("good", 300));
    assert_eq!(listing(dir.path()), ["good"]);
}

#[test]
fn a_refused_name_is_reported_and_the_session_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let ended = session(&cfg, |peer| {
        peer.greet();
        let refused = peer.offer(file(".bashrc", 10));
        let ack = peer.send_file("ok", b"0123456789");
        peer.bye();
        (refused, ack)
    });
    let (SenderEvent::Rejected(reject), ack) = ended.played else {
        panic!("{:?}", ended.played);
    };
    assert_eq!(reject.code, RejectCode::BadName);
    assert_eq!(ack.status, AckStatus::Ok);
    assert!(matches!(ended.result, Err(XferError::Rejected { .. })));
    assert!(matches!(&ended.reported[0], Reported::Failed { name, .. } if name == ".bashrc"));
    assert_eq!(listing(dir.path()), ["ok"]);
}

#[test]
fn a_sender_that_vanishes_mid_file_leaves_no_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(4096, 7);
    let ended = session(&cfg, |peer| {
        peer.greet();
        assert!(matches!(
            peer.offer(file("f", 3 * 4096)),
            SenderEvent::Ring(_)
        ));
        // One chunk of three, then the sender is gone.
        peer.write_data(&data, None);
    });
    assert!(
        matches!(ended.result, Err(XferError::PeerLost(_))),
        "{:?}",
        ended.result
    );
    assert!(matches!(&ended.reported[..], [Reported::Failed { name, .. }] if name == "f"));
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));
    assert!(ended.closed);
}

#[test]
fn a_silent_sender_times_out() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.timeout = Duration::from_secs(1);
    let ended = session(&cfg, |peer| {
        peer.greet();
        assert!(matches!(peer.offer(file("f", 10)), SenderEvent::Ring(_)));
        // The session gives up and goes: its link closes.
        peer.recv()
    });
    assert!(
        matches!(&ended.result, Err(XferError::PeerLost(m)) if m.contains("no progress for 1s")),
        "{:?}",
        ended.result
    );
    // Nothing is said to a sender that says nothing.
    assert_eq!(ended.played, None);
    assert!(listing(dir.path()).is_empty());
}

#[test]
fn a_chunk_whose_tag_is_wrong_is_refused_though_its_crc_is_right() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.token = Some(token());
    let data = bytes(4096 * 3, 9);
    let ended = session(&cfg, |peer| {
        peer.greet();
        peer.flip_tag = Some(1);
        assert!(matches!(
            peer.offer(file("f", data.len() as u64)),
            SenderEvent::Ring(_)
        ));
        peer.write_data(&data, None);
        peer.event()
    });
    assert!(
        matches!(&ended.result, Err(XferError::Integrity(m)) if m.contains("authentication tag")),
        "{:?}",
        ended.result
    );
    let SenderEvent::Aborted(ack) = ended.played else {
        panic!("{:?}", ended.played);
    };
    assert_eq!(ack.failure, crate::proto::AckFailure::Integrity);
    assert!(listing(dir.path()).is_empty(), "{:?}", listing(dir.path()));
}

#[test]
fn a_resumed_offer_is_asked_what_is_held_and_a_same_copy_is_not_sent_again() {
    use crate::proto::{HaveKind, SameCopy};
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(4096 * 2 + 7, 8);
    let resumed = || {
        let mut offer = file("f", data.len() as u64);
        offer.resume = true;
        offer
    };
    let ended = session(&cfg, |peer| {
        peer.greet();
        // Nothing held yet: everything, from 0.
        let SenderEvent::Have(have) = peer.offer(resumed()) else {
            panic!("no HAVE for a resumed offer");
        };
        assert_eq!(have.kind, HaveKind::Nothing);
        peer.machine.start_from(0).unwrap();
        peer.transmit();
        assert!(matches!(peer.event(), SenderEvent::Ring(_)));
        let hasher = peer.write_data(&data, None);
        assert_eq!(peer.finish(hasher.finish()).status, AckStatus::Ok);
        // Now the complete copy is held: compared (times aside: by its
        // size and time alone it is unchanged), not sent.
        let mut compared = resumed();
        compared.existing = crate::proto::WhenExisting::IgnoreTimes;
        compare_then_bye(peer, compared, HaveKind::Complete, &data)
    });
    ended.result.unwrap();
    assert!(
        matches!(
            ended.played,
            SenderEvent::Same {
                copy: SameCopy::Kept,
                ..
            }
        ),
        "{:?}",
        ended.played
    );
    let skipped = Reported::Done {
        name: "f".into(),
        bytes: data.len() as u64,
        outcome: Outcome::Unchanged,
    };
    assert_eq!(ended.reported, [done("f", data.len() as u64), skipped]);
    // RESUME keeps the key its records of kept parts are sealed with.
    assert_eq!(listing(dir.path()), [".rdma-xfer-key", "f"]);
}
