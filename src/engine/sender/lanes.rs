//! `sender --lanes N`: big files in pieces over N sessions at once (each
//! its own connection, queue pair, reader and thread), one `Striping`
//! per file deciding which piece each lane sends next. A lane carries one
//! piece at a time and gets the next when its answer comes; a lane whose
//! session ends gives its piece back to the others (`lane_down`), and the
//! file goes on unless every lane is gone.

use super::SessionOutcome;
use super::batch::Feed;
use crate::engine::entries::Entry;
use crate::engine::progress::ProgressSink;
use crate::engine::report::{FileEvent, FileFailure, FileReport, Outcome};
use crate::error::XferError;
use crate::proto::assembly::{LaneId, Piece, Striped, Striping, TransferId, piece_size_for};
use crate::proto::{AckStatus, Digest, DigestAlg, FileOffer, Mtime, OfferKind, escaped};
use std::collections::{HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// A lane silent this long while another carrying lane heard its
/// receiver within `FRESH` (or another lane stands idle) is given up:
/// its path is dead (a rail cut with its carrier up), not the receiver
/// busy (then every lane is silent). A healthy lane hears something at least every probe interval
/// (0.5 s: credits, completions, the receiver's answers to its probes).
pub const LANE_SILENCE: Duration = Duration::from_millis(1000);
const FRESH: Duration = Duration::from_millis(600);
/// How often the dispatcher looks at the lanes' silences.
pub(super) const WATCH_EVERY: Duration = Duration::from_millis(250);

/// What a lane's session and the dispatcher share.
#[derive(Debug)]
pub struct LaneWatch {
    epoch: Instant,
    /// When the lane last heard its receiver (ms since `epoch`).
    heard_ms: AtomicU64,
    /// How long it had been silent when the dispatcher gave it up (ms;
    /// 0: not given up).
    given_up_ms: AtomicU64,
}

impl LaneWatch {
    fn new(epoch: Instant) -> Self {
        LaneWatch {
            epoch,
            heard_ms: AtomicU64::new(0),
            given_up_ms: AtomicU64::new(0),
        }
    }

    fn ms(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.epoch).as_millis()).unwrap_or(u64::MAX)
    }

    /// The lane heard its receiver at `at`.
    pub fn heard(&self, at: Instant) {
        self.heard_ms.fetch_max(self.ms(at), Ordering::Relaxed);
    }

    /// How long the lane has been silent at `now`.
    fn silent(&self, now: Instant) -> Duration {
        Duration::from_millis(
            self.ms(now)
                .saturating_sub(self.heard_ms.load(Ordering::Relaxed)),
        )
    }

    /// The silence the dispatcher gave the lane up after, if it did.
    pub fn given_up(&self) -> Option<Duration> {
        match self.given_up_ms.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Duration::from_millis(ms)),
        }
    }

    fn give_up(&self, silent: Duration) {
        let ms = u64::try_from(silent.as_millis()).unwrap_or(u64::MAX).max(1);
        self.given_up_ms.store(ms, Ordering::Relaxed);
    }
}

/// Pieces a lane is given ahead of their answers: the next one's HELLO
/// goes while the last one's ACK is on its way (the receiver verifies and
/// fsyncs it), so that the lane's wire never idles between pieces.
const PIECES_AHEAD: usize = 2;

/// The least piece: smaller files go whole, on one lane.
pub const MIN_PIECE: u64 = 4 << 20;

/// A file to send in pieces.
pub struct StripedFile {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub mode: u32,
    pub mtime: Mtime,
    /// `-p`: the receiver keeps its permission bits (with --keep-modes).
    pub keep_mode: bool,
}

/// The files of `entries` to send in pieces: regular files of two least
/// pieces or more, with their mtimes (a piece's offer needs one).
pub fn striped_files(entries: &[Entry], keep_mode: bool) -> Vec<StripedFile> {
    use std::os::unix::fs::PermissionsExt;
    entries
        .iter()
        .filter_map(|e| match e {
            Entry::File {
                path,
                name,
                size,
                mtime: Some(mtime),
                ..
            } if *size >= 2 * MIN_PIECE => {
                let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o7777;
                Some(StripedFile {
                    name: name.clone(),
                    path: path.clone(),
                    size: *size,
                    mode,
                    mtime: *mtime,
                    keep_mode,
                })
            }
            _ => None,
        })
        .collect()
}

/// What a lane says to the dispatcher.
enum LaneSays {
    /// The verdict on its piece: the outcome (with the digest of what it
    /// sent, if it sent data), or why it failed.
    Answer(LaneId, Result<(Outcome, Option<Digest>), String>),
    /// Lane 0 answered the entries it had of its own (`send_striped`'s
    /// `first_own`): the other lanes may start, and pieces go out.
    Ready,
    /// The verdict on an entry of lane 0's own, for `on_file`.
    Own(OwnEvent),
    /// Its session ended (with the error that ended it, if one did).
    Ended(LaneId, Option<XferError>),
}

/// A `FileEvent` sent across threads.
enum OwnEvent {
    Done(FileReport),
    Failed(FileFailure),
}

/// Runs one lane's session: its entries from `feed`, each verdict to
/// `on_file`. (Over RDMA: `send_fed`; a test's, over the memory wire.)
pub type RunLane<'a> = dyn Fn(LaneId, Feed, &mut dyn FnMut(FileEvent<'_>)) -> Result<SessionOutcome, XferError>
    + Sync
    + 'a;

/// Sends `files` in pieces over `lanes` lanes run by `run_lane`; each
/// file's report (or failure) to `on_file`. The digest each piece is
/// checked with: `verify`; chunks of `chunk` bytes. With `first_own`,
/// lane 0 first offers entries of its own (the run's directories and
/// its other files, whose verdicts go to `on_file` too): the other lanes
/// start, and pieces go out, once it answered them (a piece's file may
/// lie in one of those directories). Lane 0 runs from first to last, so a
/// receiver serving one sender's sessions (`--once`) sees no gap. If lane
/// 0 ends before it answered its own, that is the run's error. Each
/// lane lost is told to `progress` too.
pub fn send_striped(
    files: Vec<StripedFile>,
    (lanes, chunk, verify): (u32, u32, DigestAlg),
    first_own: bool,
    progress: &ProgressSink,
    run_lane: &RunLane<'_>,
    on_file: &mut dyn FnMut(FileEvent<'_>),
) -> Result<(), XferError> {
    let striped: HashSet<String> = files.iter().map(|f| f.name.clone()).collect();
    let striped = &striped;
    let (says, heard) = mpsc::channel::<LaneSays>();
    let epoch = Instant::now();
    let watches: Vec<Arc<LaneWatch>> = (0..lanes.max(1))
        .map(|_| Arc::new(LaneWatch::new(epoch)))
        .collect();
    std::thread::scope(|s| {
        let mut feeds = Vec::new();
        let mut starts = Vec::new();
        for lane in 0..u64::from(lanes.max(1)) {
            let watch = watches[lane as usize].clone();
            let (entries, taken) = mpsc::channel::<Entry>();
            let (drained, drained_heard) = mpsc::channel::<()>();
            feeds.push(Some(entries));
            let (start, started) = mpsc::channel::<()>();
            if lane == 0 || !first_own {
                let _ = start.send(());
            } else {
                starts.push(start);
            }
            let says = says.clone();
            s.spawn(move || {
                // A lane's session says when it answered all it was given;
                // the dispatcher goes by the answers (and lane 0's first
                // one), but the session needs someone to say it to (else
                // it takes the feed for hung up).
                let ready = says.clone();
                let listener = std::thread::spawn(move || {
                    let mut first = lane == 0 && first_own;
                    for () in drained_heard.iter() {
                        if std::mem::take(&mut first) {
                            let _ = ready.send(LaneSays::Ready);
                        }
                    }
                });
                if started.recv().is_err() {
                    // The run ended before this lane was needed.
                    drop(drained);
                    let _ = listener.join();
                    return;
                }
                let feed = Feed {
                    entries: taken,
                    drained,
                    watch: Some(watch),
                };
                let answers = says.clone();
                let mut on_piece = |event: FileEvent<'_>| {
                    let name = match event {
                        FileEvent::Done(r) => r.name.as_str(),
                        FileEvent::Failed(f) => f.name.as_str(),
                    };
                    if !striped.contains(name) {
                        let own = match event {
                            FileEvent::Done(r) => OwnEvent::Done(r.clone()),
                            FileEvent::Failed(f) => OwnEvent::Failed(f.clone()),
                        };
                        let _ = answers.send(LaneSays::Own(own));
                        return;
                    }
                    let verdict = match event {
                        FileEvent::Done(r) => Ok((r.outcome, r.digest)),
                        // Cut short with the session: the lane's loss (its
                        // Ended follows), not the piece's verdict.
                        FileEvent::Failed(f) if f.session_ended => return,
                        FileEvent::Failed(f) => Err(f.reason.clone()),
                    };
                    let _ = answers.send(LaneSays::Answer(lane, verdict));
                };
                let ended = run_lane(lane, feed, &mut on_piece);
                let _ = says.send(LaneSays::Ended(lane, ended.err()));
                let _ = listener.join();
            });
        }
        drop(says);
        let mut dispatch = Dispatch {
            feeds,
            carrying: vec![VecDeque::new(); lanes.max(1) as usize],
            heard: &heard,
            chunk,
            verify,
            waiting: first_own,
            starts,
            on_file,
            watches,
            progress,
        };
        let mut result = Ok(());
        for file in files {
            if let Err(e) = dispatch.send(&file) {
                result = Err(e);
                break;
            }
        }
        // Lane 0's own entries come to an end even without pieces.
        if result.is_ok() && dispatch.waiting {
            result = dispatch.await_ready();
        }
        // The lanes' sessions end (BYE) once their feeds hang up; lanes
        // not started never start.
        dispatch.feeds.clear();
        dispatch.starts.clear();
        // Lane 0's last verdicts on its own entries.
        while let Ok(said) = heard.recv() {
            if let LaneSays::Own(own) = said {
                dispatch.own(own);
            }
        }
        result
    })
}

struct Dispatch<'h, 'f> {
    /// Each lane's feed; None once its session ended.
    feeds: Vec<Option<mpsc::Sender<Entry>>>,
    /// The piece each lane carries: (file's transfer, index).
    carrying: Vec<VecDeque<(TransferId, u32)>>,
    heard: &'h mpsc::Receiver<LaneSays>,
    chunk: u32,
    verify: DigestAlg,
    /// Lane 0 has not yet answered its own entries.
    waiting: bool,
    /// What starts lanes 1.. once lane 0 is ready.
    starts: Vec<mpsc::Sender<()>>,
    on_file: &'f mut dyn FnMut(FileEvent<'_>),
    /// Each lane's silence, and its giving up.
    watches: Vec<Arc<LaneWatch>>,
    /// Told of each lane lost (`--json`).
    progress: &'f ProgressSink,
}

/// What the dispatcher heard, once lane 0's own business is dealt with.
enum Heard {
    /// Lane 0 answered its own entries: the other lanes started.
    Ready,
    /// A lane given up for its silence (`LANE_SILENCE`).
    Silent(LaneId),
    Answer(LaneId, Result<(Outcome, Option<Digest>), String>),
    Ended(LaneId, Option<XferError>),
}

impl Dispatch<'_, '_> {
    /// A verdict on one of lane 0's own entries.
    fn own(&mut self, own: OwnEvent) {
        match &own {
            OwnEvent::Done(r) => (self.on_file)(FileEvent::Done(r)),
            OwnEvent::Failed(f) => (self.on_file)(FileEvent::Failed(f)),
        }
    }

    /// The next thing a lane said about pieces (None: every lane is
    /// gone); lane 0's readiness and own verdicts are dealt with on the
    /// way.
    fn hear(&mut self) -> Result<Option<Heard>, XferError> {
        loop {
            let said = match self.heard.recv_timeout(WATCH_EVERY) {
                Ok(said) => said,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(lane) = self.silent_lane() {
                        return Ok(Some(Heard::Silent(lane)));
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return Ok(None),
            };
            match said {
                LaneSays::Own(own) => self.own(own),
                LaneSays::Ready => {
                    self.waiting = false;
                    for start in self.starts.drain(..) {
                        let _ = start.send(());
                    }
                    return Ok(Some(Heard::Ready));
                }
                LaneSays::Ended(0, why) if self.waiting => {
                    return Err(why.unwrap_or_else(|| {
                        XferError::Internal("the first lane's session ended early".into())
                    }));
                }
                LaneSays::Answer(lane, verdict) => return Ok(Some(Heard::Answer(lane, verdict))),
                LaneSays::Ended(lane, why) => return Ok(Some(Heard::Ended(lane, why))),
            }
        }
    }

    /// A carrying lane silent for `LANE_SILENCE` while another carrying
    /// lane heard its receiver within `FRESH`, or while another lane
    /// stands idle (its piece goes there, which tells): given up (its
    /// session ends at its next look), its piece to go to the others. A
    /// receiver that is only slow leaves every lane silent, and costs one
    /// lane at most.
    fn silent_lane(&mut self) -> Option<LaneId> {
        let now = Instant::now();
        let standing: Vec<usize> = (0..self.feeds.len())
            .filter(|&l| self.feeds[l].is_some())
            .collect();
        let idle = standing.iter().any(|&l| self.carrying[l].is_empty());
        let carrying: Vec<(usize, Duration)> = standing
            .into_iter()
            .filter(|&l| !self.carrying[l].is_empty())
            .map(|l| (l, self.watches[l].silent(now)))
            .collect();
        let freshest = carrying.iter().map(|&(_, s)| s).min()?;
        let (lane, silent) = carrying.into_iter().max_by_key(|&(_, s)| s)?;
        if silent < LANE_SILENCE {
            return None;
        }
        if freshest > FRESH && !idle {
            tracing::debug!(
                lane,
                ?silent,
                ?freshest,
                "a lane is silent, and so are the others: the receiver is slow"
            );
            return None;
        }
        self.watches[lane].give_up(silent);
        Some(lane as LaneId)
    }

    /// Waits until lane 0 answered its own entries (or ended).
    fn await_ready(&mut self) -> Result<(), XferError> {
        while self.waiting {
            match self.hear()? {
                None => return Ok(()),
                Some(Heard::Ended(lane, why)) => self.lane_down(lane, why, None),
                Some(Heard::Ready | Heard::Answer(..) | Heard::Silent(_)) => {}
            }
        }
        Ok(())
    }

    /// Lane `lane`'s session ended: its piece goes back to `striping`.
    fn lane_down(&mut self, lane: LaneId, why: Option<XferError>, striping: Option<&mut Striping>) {
        // (A lane given up for its silence ends later: said once.)
        if self.feeds[lane as usize].is_none() {
            return;
        }
        let why = why.map_or_else(|| "its session ended".into(), |e| e.to_string());
        warn!(lane, "lane_down: {why}; its piece goes to the other lanes");
        self.progress.lane_down(lane, &why);
        self.feeds[lane as usize] = None;
        self.carrying[lane as usize].clear();
        if let Some(striping) = striping {
            striping.lane_gone(lane);
        }
    }

    /// Sends `file` in pieces over the lanes standing; its report.
    fn send(&mut self, file: &StripedFile) -> Result<(), XferError> {
        self.await_ready()?;
        let started = Instant::now();
        let mut id = [0u8; 16];
        getrandom::fill(&mut id)
            .map_err(|e| XferError::Internal(format!("no random transfer id: {e}")))?;
        let transfer = TransferId(id);
        let lanes = self.feeds.len() as u32;
        let piece_size = piece_size_for(file.size, lanes, u64::from(self.chunk), MIN_PIECE);
        let mut striping = Striping::new(transfer, file.size, piece_size)
            .map_err(|r| XferError::Internal(r.reason))?;
        info!(
            file = %escaped(&file.name),
            pieces = file.size.div_ceil(piece_size),
            piece_size,
            lanes,
            "sending in pieces"
        );
        let verdict = loop {
            self.hand_out(file, &mut striping)?;
            if self.feeds.iter().all(Option::is_none) {
                break Striped::Failed(AckStatus::Io, "every lane is gone".into());
            }
            let Some(heard) = self.hear()? else {
                break Striped::Failed(AckStatus::Io, "every lane is gone".into());
            };
            match heard {
                Heard::Answer(lane, verdict) => {
                    // A lane's session answers its pieces in order.
                    let Some((t, index)) = self.carrying[lane as usize].pop_front() else {
                        continue;
                    };
                    if t != transfer {
                        continue;
                    }
                    if let Ok((_, Some(digest))) = &verdict {
                        striping.piece_digest(index, *digest);
                    }
                    let (status, reason) = match verdict {
                        Ok((Outcome::PieceKept, _)) => (AckStatus::PieceKept, String::new()),
                        Ok((Outcome::Stored, _)) => (AckStatus::Ok, String::new()),
                        Ok((other, _)) => (other.ack_status(), String::new()),
                        Err(why) => (AckStatus::Io, why),
                    };
                    match striping.answered(lane, index, status, &reason) {
                        Striped::Pending => {}
                        done => break done,
                    }
                }
                Heard::Ended(lane, why) => self.lane_down(lane, why, Some(&mut striping)),
                Heard::Silent(lane) => {
                    let silent = self.watches[lane as usize].given_up().unwrap_or_default();
                    let why = XferError::io(
                        "given up",
                        std::io::Error::other(format!(
                            "no word from its receiver for {:.1} s while the other lanes heard theirs",
                            silent.as_secs_f64()
                        )),
                    );
                    self.lane_down(lane, Some(why), Some(&mut striping));
                }
                Heard::Ready => {}
            }
        };
        self.report(file, started, verdict, striping.whole_digest());
        Ok(())
    }

    /// Gives each standing lane its next pieces of `file`, up to
    /// `PIECES_AHEAD` (round by round, so that pieces spread over lanes).
    fn hand_out(&mut self, file: &StripedFile, striping: &mut Striping) -> Result<(), XferError> {
        for round in 0..PIECES_AHEAD {
            for lane in 0..self.feeds.len() {
                if self.carrying[lane].len() > round || self.feeds[lane].is_none() {
                    continue;
                }
                let Some(piece) = striping.next_for(lane as LaneId) else {
                    return Ok(());
                };
                let entry = self.entry(file, piece)?;
                let sent = self.feeds[lane].as_ref().map(|f| f.send(entry).is_ok());
                match sent {
                    Some(true) => {
                        // An idle lane's silence counts from its new piece.
                        if self.carrying[lane].is_empty() {
                            self.watches[lane].heard(Instant::now());
                        }
                        self.carrying[lane].push_back((piece.transfer, piece.index));
                    }
                    // Its session is gone: its Ended says so.
                    _ => {
                        striping.lane_gone(lane as LaneId);
                        self.feeds[lane] = None;
                    }
                }
            }
        }
        Ok(())
    }

    /// The entry of `piece` of `file`.
    fn entry(&self, file: &StripedFile, piece: Piece) -> Result<Entry, XferError> {
        let opened = std::fs::File::open(&file.path)
            .map_err(|e| XferError::io(format!("cannot open {}", file.path.display()), e))?;
        Ok(Entry::Piece {
            offer: FileOffer {
                name: file.name.clone(),
                size: piece.bytes(),
                mode: file.mode,
                digest: self.verify,
                kind: OfferKind::File,
                mtime: Some(file.mtime),
                keep_mode: file.keep_mode,
                resume: false,
                checksum: false,
                existing: Default::default(),
                piece: Some(piece),
            },
            file: opened,
            start: piece.offset(),
        })
    }

    fn report(
        &mut self,
        file: &StripedFile,
        started: Instant,
        verdict: Striped,
        digest: Option<Digest>,
    ) {
        match verdict {
            Striped::Done(status) => {
                let outcome = match status {
                    AckStatus::Ok => Outcome::Stored,
                    other => Outcome::of_no_data(other).unwrap_or(Outcome::Unchanged),
                };
                let report = FileReport {
                    name: file.name.clone(),
                    bytes: file.size,
                    elapsed: started.elapsed(),
                    // With every piece sent here: the receiver's too.
                    digest: digest.filter(|_| outcome == Outcome::Stored),
                    phases: Default::default(),
                    resumed_from: 0,
                    outcome,
                    host: None,
                };
                (self.on_file)(FileEvent::Done(&report));
            }
            Striped::Failed(status, why) => {
                let e = match status {
                    AckStatus::Integrity => {
                        XferError::Integrity(format!("{}: {}", escaped(&file.name), escaped(&why)))
                    }
                    _ => XferError::io(
                        format!("cannot send {}", escaped(&file.name)),
                        std::io::Error::other(why),
                    ),
                };
                let failure = FileFailure::new(
                    &file.name,
                    file.size,
                    self.verify,
                    started.elapsed(),
                    std::time::Duration::ZERO,
                    &e,
                    false,
                );
                (self.on_file)(FileEvent::Failed(&failure));
            }
            // (The loop ends only with a verdict.)
            Striped::Pending => {}
        }
    }
}
