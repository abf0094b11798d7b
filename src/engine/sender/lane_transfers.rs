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
    let run = striped_run(
        Setup {
            own,
            lanes,
            cut,
            ..Setup::default()
        },
        files,
        dst,
    );
    (run.sent, run.received)
}

/// A fault of one lane's wire: (lane, at its write number).
type LaneFault = Option<(u64, u64)>;

/// What sees a lane's verdicts: (lane, verdict).
type OnVerdict = dyn Fn(u64, FileEvent<'_>) + Sync;

/// How `striped_run` runs, and the faults its lanes meet.
#[derive(Default)]
struct Setup {
    /// Lane 0 offers these first.
    own: Option<Plan>,
    lanes: u32,
    /// The lane's connection breaks at its write number.
    cut: LaneFault,
    /// The lane's path goes dead without a word at its write number.
    stall: LaneFault,
    /// (lane, n): the lane's path goes dead at its HELLO number n.
    stall_at_hello: LaneFault,
    /// (lane, n, d): the receiver's answers after the lane's FIN number
    /// n reach it only d later.
    hold_after_fin: Option<(u64, u64, Duration)>,
    /// The receiver replaces files (--overwrite).
    overwrite: bool,
    /// The receiver checks files and drops them (--discard): it takes
    /// files whole.
    discard: bool,
    /// Sees each verdict a lane's session reports, before the dispatcher.
    on_verdict: Option<Box<OnVerdict>>,
}

/// What `striped_run` saw.
struct Run {
    /// The sender's reports.
    sent: Vec<Reported>,
    /// The receiver's.
    received: Vec<Reported>,
    /// How each lane's session ended: (lane, its error).
    ended: Vec<(u64, Option<String>)>,
}

/// `send_striped` of `files` over the memory wire into `dst`, as `setup`
/// says.
fn striped_run(setup: Setup, files: Vec<super::lanes::StripedFile>, dst: &std::path::Path) -> Run {
    let (cfg, mut rcfg) = configs(dst);
    rcfg.overwrite = setup.overwrite;
    if setup.discard {
        rcfg.output = crate::engine::receiver::Output::Discard;
    }
    let first_own = setup.own.is_some();
    let own = Mutex::new(setup.own);
    let receiver_log = Mutex::new(Vec::new());
    let ended = Mutex::new(Vec::new());
    let faulty = |fault: LaneFault, lane: u64| fault.filter(|f| f.0 == lane).map(|f| f.1);
    let run_lane = |lane: u64,
                    feed: super::Feed,
                    on_file: &mut dyn FnMut(FileEvent<'_>)|
     -> Result<super::SessionOutcome, crate::error::XferError> {
        let (mut sender_end, receiver_end) = memory_wire::pair();
        sender_end.side.break_at_write = faulty(setup.cut, lane);
        sender_end.side.stall_at_write = faulty(setup.stall, lane);
        sender_end.side.stall_at_hello = faulty(setup.stall_at_hello, lane);
        sender_end.side.hold_after_fin = setup
            .hold_after_fin
            .filter(|h| h.0 == lane)
            .map(|h| (h.1, h.2));
        let result = std::thread::scope(|s| {
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
            let on_file = |e: FileEvent<'_>| {
                if let Some(see) = &setup.on_verdict {
                    see(lane, e);
                }
                on_file(e);
            };
            drive(&cfg, offers, conn, &pool, tokens, on_file, Instant::now())
                .map_err(|ended| ended.0.0)
        });
        let error = result.as_ref().err().map(ToString::to_string);
        ended.lock().unwrap().push((lane, error));
        result
    };
    let mut sender_log = Vec::new();
    super::lanes::send_striped(
        files,
        (setup.lanes, cfg.chunk_size, cfg.verify),
        first_own,
        &Default::default(),
        &run_lane,
        &mut |e| sender_log.push(reported(e)),
    )
    .expect("striped");
    Run {
        sent: sender_log,
        received: receiver_log.into_inner().unwrap(),
        ended: ended.into_inner().unwrap(),
    }
}

/// The modification time `striped_file`'s files are listed with.
const LISTED_SECS: u64 = 1_700_000_000;

/// Writes `data` to `path`, modified at `LISTED_SECS`.
fn write_listed(path: &std::path::Path, data: &[u8]) {
    std::fs::write(path, data).unwrap();
    let at = std::time::UNIX_EPOCH + Duration::from_secs(LISTED_SECS);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(at)
        .unwrap();
}

fn striped_file(
    dir: &std::path::Path,
    name: &str,
    size: usize,
) -> (super::lanes::StripedFile, Vec<u8>) {
    let data: Vec<u8> = (0..size).map(|i| (i * 7 + i / 65521) as u8).collect();
    let path = dir.join(name);
    write_listed(&path, &data);
    let file = super::lanes::StripedFile {
        name: name.into(),
        path,
        size: size as u64,
        mode: 0o644,
        mtime: Mtime {
            secs: LISTED_SECS as i64,
            nanos: 0,
        },
        keep_mode: false,
        existing: Default::default(),
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
    let setup = Setup {
        lanes: 2,
        stall: Some((1, 10)),
        ..Setup::default()
    };
    let sent = striped_run(setup, vec![file], dst.path()).sent;
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

/// The first verdict any lane reports runs `change` (once; the other
/// lanes' verdicts wait until it is done), before the dispatcher hears
/// it: the pieces handed out after it are read after the change.
fn after_first_verdict(change: impl Fn() + Send + Sync + 'static) -> Setup {
    let changed = Mutex::new(false);
    Setup {
        lanes: 2,
        on_verdict: Some(Box::new(move |_, e| {
            let mut changed = changed.lock().unwrap();
            if !*changed && matches!(e, FileEvent::Done(_)) {
                change();
                *changed = true;
            }
        })),
        ..Setup::default()
    }
}

#[test]
fn a_source_renamed_over_while_its_pieces_go_out_arrives_as_listed_never_a_mix() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Six pieces: four go out at once, the rest after answers.
    let (file, data) = striped_file(src.path(), "model.bin", 24 << 20);
    // Another version, same size and time: its path says nothing changed.
    let other: Vec<u8> = data.iter().map(|b| !b).collect();
    let other_path = src.path().join("model.bin.new");
    write_listed(&other_path, &other);
    let source = file.path.clone();
    let setup = after_first_verdict(move || std::fs::rename(&other_path, &source).unwrap());
    let run = striped_run(setup, vec![file], dst.path());
    // Read from the file that was listed, start to end.
    assert_eq!(
        run.sent,
        [Reported::Done {
            name: "model.bin".into(),
            bytes: data.len() as u64,
            outcome: Outcome::Stored,
        }]
    );
    let got = std::fs::read(dst.path().join("model.bin")).unwrap();
    assert!(got == data, "the receiver's copy is not the listed file");
}

#[test]
fn a_source_changed_while_its_pieces_go_out_fails_and_is_never_committed() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (file, _) = striped_file(src.path(), "model.bin", 24 << 20);
    let source = file.path.clone();
    // Written to in place: same file, a byte longer.
    let setup = after_first_verdict(move || {
        use std::io::Write;
        let mut f = std::fs::File::options().append(true).open(&source).unwrap();
        f.write_all(b"!").unwrap();
    });
    let run = striped_run(setup, vec![file], dst.path());
    match &run.sent[..] {
        [Reported::Failed { name, reason }] => {
            assert_eq!(name, "model.bin");
            assert!(reason.contains("changed while it was sent"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(!dst.path().join("model.bin").exists());
}

#[test]
fn a_source_changed_since_it_was_listed_fails_before_any_piece() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (file, _) = striped_file(src.path(), "model.bin", 10 << 20);
    write_listed(&file.path, &[7u8; 9 << 20]);
    let (sent, received) = striped_over_memory(vec![file], 2, None, dst.path());
    match &sent[..] {
        [Reported::Failed { name, reason }] => {
            assert_eq!(name, "model.bin");
            assert!(reason.contains("changed since it was listed"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(received, []);
}

/// A 10 MiB file of `src` sent with `--ignore-existing` over two lanes,
/// and a file of `dst` under its name.
fn kept_existing(
    src: &std::path::Path,
    dst: &std::path::Path,
) -> (super::lanes::StripedFile, Setup) {
    std::fs::write(dst.join("model.bin"), b"the receiver's own").unwrap();
    let (mut file, _) = striped_file(src, "model.bin", 10 << 20);
    file.existing = crate::proto::WhenExisting::IgnoreExisting;
    let setup = Setup {
        lanes: 2,
        // It would be replaced, were it not kept.
        overwrite: true,
        ..Setup::default()
    };
    (file, setup)
}

#[test]
fn ignore_existing_keeps_the_receivers_file_for_a_file_sent_in_pieces_too() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (file, setup) = kept_existing(src.path(), dst.path());
    let run = striped_run(setup, vec![file], dst.path());
    assert_eq!(
        run.sent,
        [Reported::Done {
            name: "model.bin".into(),
            bytes: 10 << 20,
            outcome: Outcome::KeptExisting,
        }]
    );
    assert_eq!(
        std::fs::read(dst.path().join("model.bin")).unwrap(),
        b"the receiver's own"
    );
}

#[test]
fn a_lane_awaiting_its_fins_answer_is_not_given_up_while_the_receiver_commits() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Three pieces: lane 0 carries 0 and 2, lane 1 carries 1 and then
    // stands idle while the answer to lane 0's last FIN takes 2.5 s.
    let (file, data) = striped_file(src.path(), "model.bin", 12 << 20);
    let setup = Setup {
        lanes: 2,
        hold_after_fin: Some((0, 1, Duration::from_millis(2500))),
        ..Setup::default()
    };
    let run = striped_run(setup, vec![file], dst.path());
    assert_eq!(
        run.sent,
        [Reported::Done {
            name: "model.bin".into(),
            bytes: data.len() as u64,
            outcome: Outcome::Stored,
        }]
    );
    assert!(std::fs::read(dst.path().join("model.bin")).unwrap() == data);
    // Neither lane was given up.
    let mut ended = run.ended;
    ended.sort();
    assert_eq!(ended, [(0, None), (1, None)]);
}

#[test]
fn a_lane_gone_silent_after_the_files_verdict_is_given_up_not_awaited() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (file, mut setup) = kept_existing(src.path(), dst.path());
    // Lane 1's path dies with its first HELLO: lane 0's piece is answered
    // (kept), and lane 1 waits for an answer that never comes.
    setup.stall_at_hello = Some((1, 0));
    let started = Instant::now();
    let run = striped_run(setup, vec![file], dst.path());
    let took = started.elapsed();
    assert_eq!(
        run.sent,
        [Reported::Done {
            name: "model.bin".into(),
            bytes: 10 << 20,
            outcome: Outcome::KeptExisting,
        }]
    );
    // Given up a few seconds after the verdict, not after the 30 s
    // receive timeout.
    assert!(took < Duration::from_secs(15), "{took:?}");
    let lane_1 = run.ended.iter().find(|(lane, _)| *lane == 1);
    assert!(
        matches!(lane_1, Some((_, Some(e))) if e.contains("given up")),
        "{:?}",
        run.ended
    );
}

#[test]
fn a_receiver_that_takes_files_whole_gets_them_whole_on_one_lane() {
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (first, _) = striped_file(src.path(), "a.bin", 9 << 20);
    let (second, _) = striped_file(src.path(), "b.bin", 9 << 20);
    let run = striped_run(
        Setup {
            lanes: 2,
            discard: true,
            ..Setup::default()
        },
        vec![first, second],
        dst.path(),
    );
    // Its pieces refused (--discard), each file goes whole, verified.
    let discarded = |name: &str| Reported::Done {
        name: name.into(),
        bytes: 9 << 20,
        outcome: Outcome::Discarded,
    };
    assert_eq!(run.sent, [discarded("a.bin"), discarded("b.bin")]);
    // The receiver declined the pieces (no failure said) and tells of
    // each file.
    assert_eq!(run.received, [discarded("a.bin"), discarded("b.bin")]);
    // No lane was lost on the way.
    assert!(
        run.ended.iter().all(|(_, e)| e.is_none()),
        "{:?}",
        run.ended
    );
}
