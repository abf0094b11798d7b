//! Files in pieces over several lanes (sessions of one receiver sharing
//! its piece board): each piece ACKed PieceKept, the one that makes the
//! file whole Ok; the file committed once, whole; a lane lost mid-piece
//! gives its piece back; a receiver that takes files whole refuses pieces.

use super::peer::{Peer, bytes, file};
use super::{Reported, config, listing, session, session_joined};
use crate::engine::receiver::Output;
use crate::engine::receiver::storage::pieces::ASSEMBLY_IDLE;
use crate::engine::report::Outcome;
use crate::proto::assembly::{PIECE_ALIGN, Piece, TransferId};
use crate::proto::{Ack, AckStatus, FileOffer, RejectCode, SenderEvent};

const PIECE: u64 = PIECE_ALIGN;

/// The offer of piece `index` of `data` (pieces of `PIECE` bytes).
fn piece_offer(name: &str, data: &[u8], index: u32) -> (FileOffer, Piece) {
    // A transfer per name.
    let mut transfer = [7; 16];
    for (i, b) in name.bytes().enumerate() {
        transfer[i % 16] ^= b;
    }
    let piece = Piece {
        transfer: TransferId(transfer),
        index,
        piece_size: PIECE,
        file_size: data.len() as u64,
    };
    let offer = FileOffer {
        piece: Some(piece),
        ..file(name, piece.bytes())
    };
    (offer, piece)
}

/// Sends piece `index` of `data` whole; its ACK.
fn send_piece(peer: &mut Peer, name: &str, data: &[u8], index: u32) -> Ack {
    let (offer, piece) = piece_offer(name, data, index);
    match peer.offer(offer) {
        SenderEvent::Ring(_) => {}
        SenderEvent::Settled(ack) => return ack,
        other => panic!("piece {index} not accepted: {other:?}"),
    }
    let at = piece.offset() as usize;
    let hasher = peer.write_data(&data[at..at + piece.bytes() as usize], None);
    peer.finish(hasher.finish())
}

#[test]
fn a_file_in_pieces_over_two_lanes_is_committed_once_whole() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(2 * PIECE as usize + 5000, 4);
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| {
            session(&cfg, |peer| {
                peer.greet();
                let acks = [0, 2].map(|i| send_piece(peer, "big", &data, i));
                peer.bye();
                acks
            })
        });
        let b = s.spawn(|| {
            session(&cfg, |peer| {
                peer.greet();
                let ack = send_piece(peer, "big", &data, 1);
                peer.bye();
                ack
            })
        });
        (a.join().unwrap(), b.join().unwrap())
    });
    a.result.unwrap();
    b.result.unwrap();
    let statuses: Vec<AckStatus> = a
        .played
        .iter()
        .chain([&b.played])
        .map(|ack| ack.status)
        .collect();
    // Exactly one piece made the file whole; the others were kept.
    assert_eq!(
        statuses.iter().filter(|s| **s == AckStatus::Ok).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|s| **s == AckStatus::PieceKept)
            .count(),
        2,
        "{statuses:?}"
    );
    // One report, of the whole file, by the session that completed it.
    let reports: Vec<&Reported> = a.reported.iter().chain(&b.reported).collect();
    assert_eq!(
        reports,
        [&Reported::Done {
            name: "big".into(),
            bytes: data.len() as u64,
            outcome: Outcome::Stored,
        }]
    );
    assert_eq!(listing(dir.path()), ["big"]);
    assert!(std::fs::read(dir.path().join("big")).unwrap() == data);
}

#[test]
fn a_lane_lost_mid_piece_gives_it_back_and_another_lane_completes_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(PIECE as usize + 700, 5);
    // Lane A takes piece 0, writes part of it and is gone.
    let cut = session(&cfg, |peer| {
        peer.greet();
        let (offer, _) = piece_offer("f", &data, 0);
        assert!(matches!(peer.offer(offer), SenderEvent::Ring(_)));
        peer.write_data(&data[..8192], None);
    });
    assert!(cut.result.is_err());
    assert!(cut.reported.is_empty(), "{:?}", cut.reported);
    // Its temporary file waits for the other lanes (ASSEMBLY_IDLE).
    assert_eq!(listing(dir.path()).len(), 1, "{:?}", listing(dir.path()));
    // Lane B sends both pieces: the file is whole.
    let whole = session(&cfg, |peer| {
        peer.greet();
        let acks = [0, 1].map(|i| send_piece(peer, "f", &data, i).status);
        peer.bye();
        acks
    });
    whole.result.unwrap();
    assert_eq!(whole.played, [AckStatus::PieceKept, AckStatus::Ok]);
    assert!(std::fs::read(dir.path().join("f")).unwrap() == data);
}

#[test]
fn a_piece_verified_before_is_answered_without_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(PIECE as usize + 10, 6);
    let ended = session(&cfg, |peer| {
        peer.greet();
        let first = send_piece(peer, "f", &data, 0).status;
        // Its ACK lost with a lane: offered again, answered at once.
        let (offer, _) = piece_offer("f", &data, 0);
        let again = match peer.offer(offer) {
            SenderEvent::Settled(ack) => ack.status,
            other => panic!("{other:?}"),
        };
        let last = send_piece(peer, "f", &data, 1).status;
        peer.bye();
        (first, again, last)
    });
    ended.result.unwrap();
    assert_eq!(
        ended.played,
        (AckStatus::PieceKept, AckStatus::PieceKept, AckStatus::Ok)
    );
    assert!(std::fs::read(dir.path().join("f")).unwrap() == data);
}

#[test]
fn an_unchanged_file_stays_at_its_first_piece_and_a_whole_file_receiver_refuses_pieces() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(PIECE as usize + 10, 7);
    // The same size and time under the name: unchanged, no data.
    std::fs::write(dir.path().join("f"), &data).unwrap();
    let f = std::fs::File::options()
        .write(true)
        .open(dir.path().join("f"))
        .unwrap();
    f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000))
        .unwrap();
    let ended = session(&cfg, |peer| {
        peer.greet();
        let ack = send_piece(peer, "f", &data, 1);
        peer.bye();
        ack.status
    });
    ended.result.unwrap();
    assert_eq!(ended.played, AckStatus::Unchanged);
    // --discard takes files whole: a piece is refused.
    let mut discard = config(dir.path());
    discard.output = Output::Discard;
    let ended = session(&discard, |peer| {
        peer.greet();
        let (offer, _) = piece_offer("g", &data, 0);
        let answer = peer.offer(offer);
        peer.bye();
        answer
    });
    // Declined, not failed: its sender sends the file whole instead.
    assert!(ended.result.is_ok(), "{:?}", ended.result);
    assert!(ended.reported.is_empty(), "{:?}", ended.reported);
    match ended.played {
        SenderEvent::Rejected(r) => assert_eq!(r.code, RejectCode::Protocol),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_piece_verified_on_a_lane_now_gone_waits_for_the_others_until_idle() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(2 * PIECE as usize + 300, 8);
    // Lane A has piece 0 verified, then is cut (no BYE).
    let cut = session(&cfg, |peer| {
        peer.greet();
        send_piece(peer, "f", &data, 0).status
    });
    assert_eq!(cut.played, AckStatus::PieceKept);
    // Lane B brings the other two: the file is whole, piece 0 included.
    let whole = session(&cfg, |peer| {
        peer.greet();
        let acks = [1, 2].map(|i| send_piece(peer, "f", &data, i).status);
        peer.bye();
        acks
    });
    whole.result.unwrap();
    assert_eq!(whole.played, [AckStatus::PieceKept, AckStatus::Ok]);
    assert!(std::fs::read(dir.path().join("f")).unwrap() == data);
    // A file no lane comes back to goes once idle, its temporary file
    // with it.
    let gone = session(&cfg, |peer| {
        peer.greet();
        send_piece(peer, "g", &data, 1).status
    });
    assert_eq!(gone.played, AckStatus::PieceKept);
    assert_eq!(listing(dir.path()).len(), 2, "{:?}", listing(dir.path()));
    cfg.pieces.sweep(std::time::Instant::now());
    assert_eq!(listing(dir.path()).len(), 2, "swept before its time");
    let later = std::time::Instant::now() + ASSEMBLY_IDLE;
    cfg.pieces.sweep(later);
    assert_eq!(listing(dir.path()), ["f"]);
}

#[test]
fn a_lane_that_lost_its_piece_writes_nothing_more_into_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(PIECE as usize + 900, 9);
    let (offered, take_offered) = std::sync::mpsc::channel::<()>();
    let (whole, take_whole) = std::sync::mpsc::channel::<()>();
    let (cfg, data) = (&cfg, &data);
    let (late, over) = std::thread::scope(|s| {
        // Lane A is offered piece 0 and stalls (its path died, say).
        let late = s.spawn(move || {
            session(cfg, |peer| {
                peer.greet();
                let (offer, piece) = piece_offer("f", data, 0);
                assert!(matches!(peer.offer(offer), SenderEvent::Ring(_)));
                offered.send(()).unwrap();
                take_whole.recv().unwrap();
                // Then writes other bytes there: refused, the piece fails.
                let first_chunk = u64::from(peer.machine.chunk_len()).min(piece.bytes());
                let other = vec![0xee; first_chunk as usize];
                peer.write_data(&other, None);
                peer.event()
            })
        });
        // Lane B takes piece 0 over and makes the file whole.
        take_offered.recv().unwrap();
        let over = session(cfg, |peer| {
            peer.greet();
            let acks = [0, 1].map(|i| send_piece(peer, "f", data, i).status);
            peer.bye();
            acks
        });
        whole.send(()).unwrap();
        (late.join().unwrap(), over)
    });
    over.result.unwrap();
    assert_eq!(over.played, [AckStatus::PieceKept, AckStatus::Ok]);
    match late.played {
        SenderEvent::Aborted(failed) => {
            assert_eq!(failed.failure, crate::proto::AckFailure::Io);
            assert!(
                failed.reason.contains("no longer this lane's"),
                "{}",
                failed.reason
            );
        }
        other => panic!("{other:?}"),
    }
    assert!(std::fs::read(dir.path().join("f")).unwrap() == *data);
    assert_eq!(listing(dir.path()), ["f"]);
}

#[test]
fn a_piece_is_held_to_max_size_by_its_whole_file() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    let data = bytes(2 * PIECE as usize, 10);
    cfg.max_size = PIECE + 1;
    let ended = session(&cfg, |peer| {
        peer.greet();
        let (offer, _) = piece_offer("f", &data, 0);
        let answer = peer.offer(offer);
        peer.bye();
        answer
    });
    match ended.played {
        SenderEvent::Rejected(r) => assert_eq!(r.code, RejectCode::TooLarge, "{}", r.reason),
        other => panic!("{other:?}"),
    }
    assert_eq!(listing(dir.path()), Vec::<String>::new());
}

#[test]
fn a_session_joining_a_once_receivers_first_carries_pieces_only() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(PIECE as usize + 20, 11);
    let ended = session_joined(&cfg, |peer| {
        peer.greet();
        let file = peer.offer(super::peer::file("other", 10));
        let (offer, _) = piece_offer("f", &data, 1);
        let piece = peer.offer(offer);
        (file, piece)
    });
    match &ended.played.0 {
        SenderEvent::Rejected(r) => {
            assert_eq!(r.code, RejectCode::Protocol);
            assert!(
                r.reason.contains("pieces of its files only"),
                "{}",
                r.reason
            );
        }
        other => panic!("a whole file taken: {other:?}"),
    }
    assert!(
        matches!(ended.played.1, SenderEvent::Ring(_)),
        "{:?}",
        ended.played.1
    );
    assert!(!listing(dir.path()).contains(&"other".to_string()));
}

#[test]
fn a_session_holds_a_few_unfinished_files_in_pieces_at_most() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(2 * PIECE as usize, 12);
    let ended = session(&cfg, |peer| {
        peer.greet();
        // One piece of each of five files: the fifth is refused, busy.
        let kept: Vec<AckStatus> = (0..4)
            .map(|i| send_piece(peer, &format!("f{i}"), &data, 0).status)
            .collect();
        let (offer, _) = piece_offer("f4", &data, 0);
        let fifth = peer.offer(offer);
        // A piece of a file it holds is still taken.
        let more = send_piece(peer, "f0", &data, 1).status;
        (kept, fifth, more)
    });
    let (kept, fifth, more) = ended.played;
    assert_eq!(kept, [AckStatus::PieceKept; 4]);
    match fifth {
        SenderEvent::Rejected(r) => assert_eq!(r.code, RejectCode::Busy, "{}", r.reason),
        other => panic!("{other:?}"),
    }
    assert_eq!(more, AckStatus::Ok);
}
