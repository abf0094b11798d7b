//! The session's file work on its worker: the sender kept waiting with
//! KEEPALIVEs while it runs, and stopped with the session.

use super::peer::{Peer, bytes, file};
use super::{Reported, compare_then_bye, done, session, session_hooked};
use crate::engine::digest::FileHasher;
use crate::engine::receiver::session::file_work::COMPARE_HOOK;
use crate::engine::receiver::storage::partial::Claim;
use crate::engine::worker::fail_next_start;
use crate::error::{ExitCode, XferError};
use crate::proto::{AckFailure, AckStatus, DigestAlg, FileOffer, HaveKind, Message, SenderEvent};
use crate::sys::dirfd::DirFd;
use sha2::Digest as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn resumed(name: &str, size: u64) -> FileOffer {
    let mut offer = file(name, size);
    offer.resume = true;
    offer
}

/// Sends a resumed offer and reads the session's answer message by
/// message: the KEEPALIVEs before it, and the answer.
fn offer_counting_keepalives(peer: &mut Peer, offer: FileOffer) -> (u32, SenderEvent) {
    peer.machine.start_file(offer, 1).unwrap();
    peer.transmit();
    let mut keepalives = 0;
    loop {
        let msg = peer.recv().expect("the session ended early");
        let keepalive = matches!(msg, Message::Keepalive);
        let event = peer.machine.on_message(msg).expect("the protocol is kept");
        if !keepalive {
            return (keepalives, event);
        }
        keepalives += 1;
    }
}

#[test]
fn a_resume_waits_on_the_worker_while_keepalives_flow_and_continues_the_kept_part() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = super::config(dir.path());
    let data = bytes(4096 * 3, 11);
    let size = data.len() as u64;
    // A first session keeps two chunks of three: its sender vanishes.
    let first = session(&cfg, |peer| {
        peer.greet();
        let SenderEvent::Have(have) = peer.offer(resumed("f", size)) else {
            panic!("no HAVE for a resumed offer");
        };
        assert_eq!(have.kind, HaveKind::Nothing);
        peer.machine.start_from(0).unwrap();
        peer.transmit();
        assert!(matches!(peer.event(), SenderEvent::Ring(_)));
        peer.write_data(&data[..4096 * 2], None);
        // Both chunks taken before the sender goes.
        std::thread::sleep(Duration::from_millis(300));
    });
    assert!(matches!(first.result, Err(XferError::PeerLost(_))));
    // Another session holds the partial file for a while: the second one
    // waits on its worker, and its sender hears KEEPALIVEs meanwhile,
    // though the session's timeout is shorter than the wait.
    cfg.timeout = Duration::from_secs(2);
    let root = DirFd::open(dir.path()).unwrap();
    let held = Claim::try_take(&root, "f")
        .unwrap()
        .expect("the claim is free");
    let ended = session(&cfg, |peer| {
        peer.greet();
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(3));
            drop(held);
        });
        let (keepalives, answer) = offer_counting_keepalives(peer, resumed("f", size));
        release.join().unwrap();
        let SenderEvent::Have(have) = answer else {
            panic!("no HAVE: {answer:?}");
        };
        assert_eq!((have.kind, have.bytes), (HaveKind::Prefix, 4096 * 2));
        peer.machine.start_from(have.bytes).unwrap();
        peer.transmit();
        assert!(matches!(peer.event(), SenderEvent::Ring(_)));
        peer.write_data(&data[4096 * 2..], None);
        let mut whole = FileHasher::new(DigestAlg::Crc32);
        whole.update(&data, crc32fast::hash(&data));
        let ack = peer.finish(whole.finish());
        peer.bye();
        (keepalives, ack)
    });
    ended.result.unwrap();
    let (keepalives, ack) = ended.played;
    // One every 667 ms over 3 s: about 4; 2 leave room for a loaded
    // machine and still show that they flow while the worker waits.
    assert!(keepalives >= 2, "{keepalives} KEEPALIVEs");
    assert_eq!(ack.status, AckStatus::Ok, "{ack:?}");
    assert_eq!(ended.reported, [done("f", size)]);
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
}

#[test]
fn a_sender_that_vanishes_while_the_worker_waits_ends_the_session_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = super::config(dir.path());
    // Held for the whole test: the worker would wait 40 s for it.
    let root = DirFd::open(dir.path()).unwrap();
    let _held = Claim::try_take(&root, "f")
        .unwrap()
        .expect("the claim is free");
    let started = Instant::now();
    let ended = session(&cfg, |peer| {
        peer.greet();
        peer.machine.start_file(resumed("f", 10), 1).unwrap();
        peer.transmit();
        // The offer is on the worker: the sender goes.
        std::thread::sleep(Duration::from_millis(300));
    });
    // The session noticed, stopped its worker and joined it.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert!(
        matches!(&ended.result, Err(XferError::PeerLost(m)) if m.contains("disconnected")),
        "{:?}",
        ended.result
    );
    assert!(
        !ended
            .reported
            .iter()
            .any(|r| matches!(r, Reported::Done { .. }))
    );
    assert!(ended.closed);
}

#[test]
fn a_link_dest_copy_is_hashed_and_copied_into_place_on_the_worker() {
    use crate::engine::report::Outcome;
    use crate::proto::SameCopy;
    let (dir, link_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut cfg = super::config(dir.path());
    cfg.link_dest = Some(link_dir.path().into());
    let data = bytes(4096 * 2 + 5, 12);
    // Another modification time than the offer's: copied, not linked.
    std::fs::write(link_dir.path().join("f"), &data).unwrap();
    let size = data.len() as u64;
    let ended = session(&cfg, |peer| {
        peer.greet();
        let mut offer = file("f", size);
        offer.checksum = true;
        compare_then_bye(peer, offer, HaveKind::Digest, &data)
    });
    ended.result.unwrap();
    assert!(
        matches!(
            ended.played,
            SenderEvent::Same {
                copy: SameCopy::LinkDest,
                ..
            }
        ),
        "{:?}",
        ended.played
    );
    let linked = Reported::Done {
        name: "f".into(),
        bytes: size,
        outcome: Outcome::Linked,
    };
    assert_eq!(ended.reported, [linked]);
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
}

#[test]
fn a_compare_stuck_for_the_timeout_ends_the_session_and_is_left_behind() {
    let (dir, link_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut cfg = super::config(dir.path());
    cfg.link_dest = Some(link_dir.path().into());
    let timeout = Duration::from_secs(1);
    cfg.timeout = timeout;
    let data = bytes(4096 * 2, 13);
    std::fs::write(link_dir.path().join("f"), &data).unwrap();
    // The COMPARE's work blocks before its first piece until the test
    // lets it go, as a read stuck in the kernel does.
    let (release, held) = mpsc::channel::<()>();
    let let_go = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&let_go);
    let stuck = Box::new(move || {
        // At most 10 s: a session that waits for it shows, and does not hang.
        let _ = held.recv_timeout(Duration::from_secs(10));
        seen.store(true, Ordering::SeqCst);
    });
    let started = Instant::now();
    let ended = session_hooked(
        &cfg,
        move || COMPARE_HOOK.set(Some(stuck)),
        |peer| {
            peer.greet();
            let mut offer = file("f", data.len() as u64);
            offer.checksum = true;
            let SenderEvent::Have(_) = peer.offer(offer) else {
                panic!("no HAVE asking for the digest");
            };
            let sha256: [u8; 32] = sha2::Sha256::digest(&data).into();
            peer.machine.compare(sha256).unwrap();
            peer.transmit();
            // KEEPALIVEs until the session gives up on its work, says why and
            // goes (the test's sender goes after 8: a session that would go
            // on for ever).
            let mut keepalives = 0;
            let mut answer = None;
            while keepalives < 8
                && let Some(msg) = peer.recv()
            {
                if !matches!(msg, Message::Keepalive) {
                    answer = Some(peer.machine.on_message(msg));
                    break;
                }
                keepalives += 1;
            }
            (keepalives, answer)
        },
    );
    let took = started.elapsed();
    let what = "hashing the --link-dest copy of f made no progress for 1s";
    assert!(
        matches!(&ended.result, Err(XferError::Io { context, source })
            if source.kind() == std::io::ErrorKind::TimedOut
                && source.to_string() == "the rdma-xfer-compare thread stalled"
                && context == what),
        "{:?}",
        ended.result
    );
    // A local read stuck: an I/O error, not worth retrying.
    let stalled = ended.result.as_ref().unwrap_err();
    assert!(!stalled.is_transient());
    assert_eq!(stalled.exit_code(), ExitCode::Io);
    // The sender heard why, in a failing ACK (not a vanished receiver).
    let (keepalives, answer) = ended.played;
    assert!(
        matches!(&answer, Some(Ok(SenderEvent::Aborted(failed)))
            if failed.failure == AckFailure::Io && failed.reason.contains(what)),
        "{answer:?}"
    );
    // Not before the timeout, and not after the work (still stuck).
    assert!(took >= timeout, "{took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(!let_go.load(Ordering::SeqCst), "the work was never stuck");
    // One every 333 ms until the stall was found, then none.
    assert!((1..=4).contains(&keepalives), "{keepalives} KEEPALIVEs");
    assert!(ended.closed);
    assert!(!dir.path().join("f").exists());
    release.send(()).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !let_go.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "the stuck work never ended");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Sends `data` from FROM 0 on (the HAVE answered), then BYE: the ACK.
fn whole_then_bye(peer: &mut Peer, data: &[u8]) -> crate::proto::Ack {
    peer.machine.start_from(0).unwrap();
    peer.transmit();
    assert!(matches!(peer.event(), SenderEvent::Ring(_)));
    let digest = peer.write_data(data, None);
    let ack = peer.finish(digest.finish());
    peer.bye();
    ack
}

#[test]
fn a_resume_whose_work_cannot_start_has_the_file_sent_whole() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = super::config(dir.path());
    let data = bytes(4096 * 2 + 3, 14);
    let ended = session_hooked(&cfg, fail_next_start, |peer| {
        peer.greet();
        let SenderEvent::Have(have) = peer.offer(resumed("f", data.len() as u64)) else {
            panic!("no HAVE for a resumed offer");
        };
        (have, whole_then_bye(peer, &data))
    });
    ended.result.unwrap();
    let (have, ack) = ended.played;
    // Not a refusal: nothing held, the file comes whole.
    assert_eq!(have.kind, HaveKind::Nothing);
    assert!(
        have.note.contains("cannot start the session's file work")
            && have.note.ends_with("sent whole"),
        "{}",
        have.note
    );
    assert_eq!(ack.status, AckStatus::Ok, "{ack:?}");
    assert_eq!(ended.reported, [done("f", data.len() as u64)]);
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
}

#[test]
fn a_compare_whose_work_cannot_start_is_a_have_of_nothing() {
    let (dir, link_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut cfg = super::config(dir.path());
    cfg.link_dest = Some(link_dir.path().into());
    let data = bytes(4096 + 9, 15);
    std::fs::write(link_dir.path().join("f"), &data).unwrap();
    let ended = session_hooked(&cfg, fail_next_start, |peer| {
        peer.greet();
        let mut offer = file("f", data.len() as u64);
        offer.checksum = true;
        let SenderEvent::Have(asked) = peer.offer(offer) else {
            panic!("no HAVE asking for the digest");
        };
        assert_eq!(asked.kind, HaveKind::Digest);
        let sha256: [u8; 32] = sha2::Sha256::digest(&data).into();
        peer.machine.compare(sha256).unwrap();
        peer.transmit();
        let verdict = peer.event();
        (verdict, whole_then_bye(peer, &data))
    });
    ended.result.unwrap();
    let (verdict, ack) = ended.played;
    assert!(
        matches!(&verdict, SenderEvent::Have(h)
            if h.kind == HaveKind::Nothing
                && h.note.contains("cannot start the session's file work")),
        "{verdict:?}"
    );
    assert_eq!(ack.status, AckStatus::Ok, "{ack:?}");
    // Received, not linked.
    assert_eq!(ended.reported, [done("f", data.len() as u64)]);
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
}
