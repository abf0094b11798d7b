//! (tests) A file sent in pieces over two lanes without RDMA: two sender
//! engine sessions, each with its own reader and memory wire, against two
//! receiver sessions that share one receiver's piece board. Each lane's
//! pieces are read from their place in the one source file; the receiver
//! commits the file once, whole.

use super::memory_transfers::configs;
use super::{Connection, drive};
use crate::engine::entries::{Entry, Plan};
use crate::engine::memory_wire;
use crate::engine::receiver::{Reported, reported, sender_auth, serve_over};
use crate::engine::report::{FileEvent, Outcome};
use crate::proto::assembly::{PIECE_ALIGN, Piece, TransferId};
use crate::proto::{FileOffer, Mtime, OfferKind};
use crate::sys::rdma::BufferPool;
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[test]
fn a_file_sent_in_pieces_over_two_lanes_arrives_whole_once() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (cfg, rcfg) = configs(dst.path());
    let data: Vec<u8> = (0..3 * PIECE_ALIGN as usize + 999)
        .map(|i| (i * 13 + i / 4093) as u8)
        .collect();
    let path = src.path().join("ckpt.bin");
    std::fs::write(&path, &data).unwrap();
    let mtime = Mtime {
        secs: 1_700_000_000,
        nanos: 0,
    };
    // Lane 0 sends pieces 0 and 2, lane 1 pieces 1 and 3.
    let pieces_of = |lane: u32| -> Vec<Entry> {
        (0..4)
            .filter(|i| i % 2 == lane)
            .map(|index| {
                let piece = Piece {
                    transfer: TransferId([9; 16]),
                    index,
                    piece_size: PIECE_ALIGN,
                    file_size: data.len() as u64,
                };
                Entry::Piece {
                    offer: FileOffer {
                        name: "ckpt.bin".into(),
                        size: piece.bytes(),
                        mode: 0o644,
                        digest: cfg.verify,
                        kind: OfferKind::File,
                        mtime: Some(mtime),
                        keep_mode: false,
                        resume: false,
                        checksum: false,
                        existing: Default::default(),
                        piece: Some(piece),
                    },
                    file: std::fs::File::open(&path).unwrap(),
                    start: piece.offset(),
                }
            })
            .collect()
    };
    let receiver_log = Mutex::new(Vec::new());
    let sender_log = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for lane in 0..2 {
            let (sender_end, receiver_end) = memory_wire::pair();
            let (rcfg, cfg, receiver_log, sender_log) = (&rcfg, &cfg, &receiver_log, &sender_log);
            let entries = pieces_of(lane);
            s.spawn(move || {
                let on_file = |e: FileEvent<'_>| receiver_log.lock().unwrap().push(reported(e));
                serve_over(rcfg, receiver_end, &on_file).expect("the lane's session");
            });
            s.spawn(move || {
                let (pool, tokens) =
                    BufferPool::in_memory(cfg.slot_size() as usize, cfg.depth as usize).unwrap();
                let session = super::connection::session_for(cfg, sender_auth(rcfg));
                let conn = Connection::new(Duration::ZERO, Box::new(sender_end), session);
                let plan = Plan {
                    entries,
                    problems: Vec::new(),
                    skipped: 0,
                };
                let on_file = |e: FileEvent<'_>| sender_log.lock().unwrap().push(reported(e));
                drive(
                    cfg,
                    plan.into(),
                    conn,
                    &pool,
                    tokens,
                    on_file,
                    Instant::now(),
                )
                .map_err(|ended| ended.0.0)
                .expect("the lane's sender");
            });
        }
    });
    assert!(std::fs::read(dst.path().join("ckpt.bin")).unwrap() == data);
    // The receiver reports the file once, whole.
    assert_eq!(
        receiver_log.into_inner().unwrap(),
        [Reported::Done {
            name: "ckpt.bin".into(),
            bytes: data.len() as u64,
            outcome: Outcome::Stored,
        }]
    );
    // The senders saw three pieces kept and one that made the file whole.
    let outcomes: Vec<Outcome> = sender_log
        .into_inner()
        .unwrap()
        .into_iter()
        .map(|r| match r {
            Reported::Done { outcome, .. } => outcome,
            failed => panic!("{failed:?}"),
        })
        .collect();
    let kept = outcomes
        .iter()
        .filter(|o| **o == Outcome::PieceKept)
        .count();
    let whole = outcomes.iter().filter(|o| **o == Outcome::Stored).count();
    assert_eq!((kept, whole), (3, 1), "{outcomes:?}");
}
