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

/// `send_striped` over lanes on the memory wire: lane `cut` (if any) has
/// its connection broken at its write number `at`.
fn striped_over_memory(
    files: Vec<super::lanes::StripedFile>,
    lanes: u32,
    cut: Option<(u64, u64)>,
    dst: &std::path::Path,
) -> (Vec<Reported>, Vec<Reported>) {
    striped_after_own(None, files, lanes, cut, dst)
}

/// `striped_over_memory` with lane 0 offering `own` first.
fn striped_after_own(
    own: Option<Plan>,
    files: Vec<super::lanes::StripedFile>,
    lanes: u32,
    cut: Option<(u64, u64)>,
    dst: &std::path::Path,
) -> (Vec<Reported>, Vec<Reported>) {
    striped_with(own, files, lanes, (cut, None), dst)
}

/// A fault of one lane's wire: (lane, at its write number).
type LaneFault = Option<(u64, u64)>;

/// `striped_after_own` where lane `stall.0`'s path also goes dead
/// without a word at its write number `stall.1`.
fn striped_with(
    own: Option<Plan>,
    files: Vec<super::lanes::StripedFile>,
    lanes: u32,
    (cut, stall): (LaneFault, LaneFault),
    dst: &std::path::Path,
) -> (Vec<Reported>, Vec<Reported>) {
    let (cfg, rcfg) = configs(dst);
    let first_own = own.is_some();
    let own = Mutex::new(own);
    let receiver_log = Mutex::new(Vec::new());
    let run_lane = |lane: u64,
                    feed: super::Feed,
                    on_file: &mut dyn FnMut(FileEvent<'_>)|
     -> Result<super::SessionOutcome, crate::error::XferError> {
        let (mut sender_end, receiver_end) = memory_wire::pair();
        if let Some((cut_lane, at)) = cut
            && cut_lane == lane
        {
            sender_end.side.break_at_write = Some(at);
        }
        if let Some((stall_lane, at)) = stall
            && stall_lane == lane
        {
            sender_end.side.stall_at_write = Some(at);
        }
        std::thread::scope(|s| {
            let log = &receiver_log;
            let rcfg = &rcfg;
            s.spawn(move || {
                let on_file = |e: FileEvent<'_>| log.lock().unwrap().push(reported(e));
                // A cut lane's session fails; that is the point.
                let _ = serve_over(rcfg, receiver_end, &on_file);
            });
            let (pool, tokens) =
                BufferPool::in_memory(cfg.slot_size() as usize, cfg.depth as usize).unwrap();
            let session = super::connection::session_for(&cfg, sender_auth(rcfg));
            let conn = Connection::new(Duration::ZERO, Box::new(sender_end), session);
            let plan = match lane {
                0 => own.lock().unwrap().take(),
                _ => None,
            };
            let offers = super::Offers {
                plan: plan.unwrap_or_default(),
                feed: Some(feed),
            };
            drive(&cfg, offers, conn, &pool, tokens, on_file, Instant::now())
                .map_err(|ended| ended.0.0)
        })
    };
    let mut sender_log = Vec::new();
    super::lanes::send_striped(
        files,
        (lanes, cfg.chunk_size, cfg.verify),
        first_own,
        &Default::default(),
        &run_lane,
        &mut |e| sender_log.push(reported(e)),
    )
    .expect("striped");
    (sender_log, receiver_log.into_inner().unwrap())
}

fn striped_file(
    dir: &std::path::Path,
    name: &str,
    size: usize,
) -> (super::lanes::StripedFile, Vec<u8>) {
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 65521) as u8).collect();
    let path = dir.join(name);
    std::fs::write(&path, &data).unwrap();
    let file = super::lanes::StripedFile {
        name: name.into(),
        path,
        size: size as u64,
        mode: 0o644,
        mtime: Mtime {
            secs: 1_700_000_000,
            nanos: 0,
        },
        keep_mode: false,
    };
    (file, data)
}

#[test]
fn the_lanes_send_a_big_file_in_pieces_and_report_it_once() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (file, data) = striped_file(src.path(), "model.bin", 10 << 20);
    let (sent, received) = striped_over_memory(vec![file], 2, None, dst.path());
    let done = Reported::Done {
        name: "model.bin".into(),
        bytes: data.len() as u64,
        outcome: Outcome::Stored,
    };
    assert_eq!(sent, std::slice::from_ref(&done));
    assert_eq!(received, [done]);
    assert!(std::fs::read(dst.path().join("model.bin")).unwrap() == data);
}

#[test]
fn a_lane_lost_mid_file_gives_its_piece_to_the_other_and_the_file_arrives() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (file, data) = striped_file(src.path(), "model.bin", 10 << 20);
    // Lane 1's connection breaks at its 100th write (of its first piece).
    let (sent, _) = striped_over_memory(vec![file], 2, Some((1, 100)), dst.path());
    assert_eq!(
        sent,
        [Reported::Done {
            name: "model.bin".into(),
            bytes: data.len() as u64,
            outcome: Outcome::Stored,
        }]
    );
    assert!(std::fs::read(dst.path().join("model.bin")).unwrap() == data);
}

#[test]
fn lane_0_offers_the_rest_first_and_the_pieces_go_into_its_directory() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tree = src.path().join("run");
    std::fs::create_dir(&tree).unwrap();
    std::fs::write(tree.join("notes.txt"), b"small").unwrap();
    let (mut file, data) = striped_file(&tree, "model.bin", 10 << 20);
    file.name = "run/model.bin".into();
    let walk = crate::engine::entries::WalkOptions {
        recursive: true,
        ..Default::default()
    };
    let mut own = crate::engine::entries::plan(&[tree], &walk).unwrap();
    own.entries.retain(|e| e.name() != "run/model.bin");
    assert_eq!(own.entries.len(), 2, "{:?}", own.entries);
    let (sent, received) = striped_after_own(Some(own), vec![file], 2, None, dst.path());
    let done = |name: &str, bytes: u64| Reported::Done {
        name: name.into(),
        bytes,
        outcome: Outcome::Stored,
    };
    // The small file first (lane 0, before any piece), then the big one.
    assert_eq!(
        sent,
        [
            done("run/notes.txt", 5),
            done("run/model.bin", data.len() as u64)
        ]
    );
    assert!(received.contains(&done("run/model.bin", data.len() as u64)));
    assert!(std::fs::read(dst.path().join("run/model.bin")).unwrap() == data);
    assert_eq!(
        std::fs::read(dst.path().join("run/notes.txt")).unwrap(),
        b"small"
    );
}

#[test]
fn a_lane_whose_path_goes_silent_is_given_up_while_the_other_is_heard() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (file, data) = striped_file(src.path(), "model.bin", 10 << 20);
    let started = Instant::now();
    // Lane 1's path goes dead at its 10th write: no error, no word.
    let (sent, _) = striped_with(None, vec![file], 2, (None, Some((1, 10))), dst.path());
    assert_eq!(
        sent,
        [Reported::Done {
            name: "model.bin".into(),
            bytes: data.len() as u64,
            outcome: Outcome::Stored,
        }]
    );
    assert!(std::fs::read(dst.path().join("model.bin")).unwrap() == data);
    // Given up after its silence, not after the 30 s receive timeout.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(15), "{took:?}");
}
