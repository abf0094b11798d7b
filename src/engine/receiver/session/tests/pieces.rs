//! Files in pieces over several lanes (sessions of one receiver sharing
//! its piece board): each piece ACKed PieceKept, the one that makes the
//! file whole Ok; the file committed once, whole; a lane lost mid-piece
//! gives its piece back; a receiver that takes files whole refuses pieces.

use super::peer::{Peer, bytes, file};
use super::{Reported, config, listing, session};
use crate::engine::receiver::Output;
use crate::engine::report::Outcome;
use crate::proto::assembly::{PIECE_ALIGN, Piece, TransferId};
use crate::proto::{Ack, AckStatus, FileOffer, RejectCode, SenderEvent};

const PIECE: u64 = PIECE_ALIGN;

/// The offer of piece `index` of `data` (pieces of `PIECE` bytes).
fn piece_offer(name: &str, data: &[u8], index: u32) -> (FileOffer, Piece) {
    let piece = Piece {
        transfer: TransferId([7; 16]),
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
    // Nothing of it stays (no lane holds the file).
    assert_eq!(listing(dir.path()), Vec::<String>::new());
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
    // The refusal is the session's result too (as any refusal).
    assert!(
        matches!(
            &ended.result,
            Err(crate::error::XferError::Rejected {
                code: Some(RejectCode::Protocol),
                ..
            })
        ),
        "{:?}",
        ended.result
    );
    match ended.played {
        SenderEvent::Rejected(r) => assert_eq!(r.code, RejectCode::Protocol),
        other => panic!("{other:?}"),
    }
}
