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
use crate::proto::{
    AckStatus, Digest, DigestAlg, FileOffer, Mtime, OfferKind, RejectCode, WhenExisting, escaped,
};
use std::collections::{HashSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
/// A lane that sent the FIN of a file's last answer owed (every other
/// piece kept, or the file sent whole) is given up only after this much
/// silence: the receiver fsyncs and commits the whole file on that
/// lane's session thread, which says nothing meanwhile (gigabytes to a
/// slow disk take seconds) while the other lanes stand idle. Any other
/// FIN is answered at once (the piece's digest is computed as its chunks
/// come): a lane that owes one is held to `LANE_SILENCE` (after a rail
/// cut a lane almost always owes a FIN it sent into the void).
pub const FIN_SILENCE: Duration = Duration::from_secs(30);
/// Once every file is done, a lane whose session has not ended after
/// this much silence (four `LANE_SILENCE`s) is given up: a healthy lane
/// ends at once (its BYE) or hears its receiver's answers to its probes
/// every 0.5 s, so its path is dead (it carried nothing, and nothing
/// gave it up), and its BYE would wait for --timeout.
const END_SILENCE: Duration = Duration::from_millis(4000);
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
    /// FINs its session sent whose answers have not come yet.
    fins_owed: AtomicU64,
    /// Its session is connected (`connected`).
    connected: AtomicBool,
}

impl LaneWatch {
    fn new(epoch: Instant) -> Self {
        LaneWatch {
            epoch,
            heard_ms: AtomicU64::new(0),
            given_up_ms: AtomicU64::new(0),
            fins_owed: AtomicU64::new(0),
            connected: AtomicBool::new(false),
        }
    }

    /// The lane's session is connected: its silence counts from `at`
    /// (not while it connects, registers and authenticates: its own
    /// timeouts watch that).
    pub fn connected(&self, at: Instant) {
        self.heard(at);
        self.connected.store(true, Ordering::Relaxed);
    }

    /// The lane's session sent a FIN: it awaits its answer.
    pub fn fin_sent(&self) {
        self.fins_owed.fetch_add(1, Ordering::Relaxed);
    }

    /// The answer to one of the lane's FINs came.
    pub fn fin_answered(&self) {
        let _ = self
            .fins_owed
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Whether the lane awaits the answer to a FIN.
    fn fin_owed(&self) -> bool {
        self.fins_owed.load(Ordering::Relaxed) > 0
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
        if !self.connected.load(Ordering::Relaxed) {
            return Duration::ZERO;
        }
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

    /// How the dispatcher sees lane `lane` at `now`.
    fn look(&self, lane: usize, now: Instant) -> Look {
        Look {
            lane,
            silent: self.silent(now),
            fin_owed: self.fin_owed(),
        }
    }
}

/// A lane as the dispatcher looks at it.
#[derive(Debug, Clone, Copy)]
struct Look {
    lane: usize,
    /// Since it last heard its receiver.
    silent: Duration,
    /// It awaits the answer to a FIN.
    fin_owed: bool,
}

impl Look {
    /// Whether the lane has been silent longer than it may be: `usual`,
    /// or `FIN_SILENCE` while it awaits a FIN's answer.
    fn past(&self, usual: Duration) -> bool {
        self.silent >= if self.fin_owed { FIN_SILENCE } else { usual }
    }
}

/// Which of the `carrying` lanes to give up, with its silence: the most
/// silent of those past their allowance (`Look::past` of
/// `LANE_SILENCE`), provided another carrying lane heard its receiver
/// within `FRESH` or some lane stands `idle` (else every lane is silent:
/// the receiver is slow, not a path dead).
fn to_give_up(carrying: &[Look], idle: bool) -> Option<(usize, Duration)> {
    let freshest = carrying.iter().map(|l| l.silent).min()?;
    let most = carrying
        .iter()
        .filter(|l| l.past(LANE_SILENCE))
        .max_by_key(|l| l.silent)?;
    if freshest > FRESH && !idle {
        tracing::debug!(
            lane = most.lane,
            silent = ?most.silent,
            ?freshest,
            "a lane is silent, and so are the others: the receiver is slow"
        );
        return None;
    }
    Some((most.lane, most.silent))
}

/// Pieces a lane is given ahead of their answers: the next one's HELLO
/// goes while the last one's ACK is on its way (the receiver verifies
/// it), so that the lane's wire never idles between pieces.
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
    /// What the receiver does with a file it has under the name (-u,
    /// --ignore-existing, -I), as for a file sent whole.
    pub existing: WhenExisting,
}

/// The files of `entries` to send in pieces: regular files of two least
/// pieces or more, with their mtimes (a piece's offer needs one); each
/// offered with `keep_mode` and `existing`.
pub fn striped_files(
    entries: &[Entry],
    keep_mode: bool,
    existing: WhenExisting,
) -> Vec<StripedFile> {
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
                    existing,
                })
            }
            _ => None,
        })
        .collect()
}

/// The verdict on a lane's piece: the outcome (with the digest of what
/// it sent, if it sent data), or the failure's status (Protocol for an
/// offer refused so, else Io) and reason.
type Verdict = Result<(Outcome, Option<Digest>), (AckStatus, String)>;

/// What a lane says to the dispatcher.
enum LaneSays {
    /// The verdict on its piece (or on its file sent whole).
    Answer(LaneId, Verdict),
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
        // Lanes whose thread the system refused, with why.
        let mut unstarted = Vec::new();
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
            let spawned = std::thread::Builder::new()
                .name(format!("lane-{lane}"))
                .spawn_scoped(s, move || {
                    // A lane's session says when it answered all it was
                    // given; the dispatcher goes by the answers (and lane
                    // 0's first one), but the session needs someone to say
                    // it to (else it takes the feed for hung up).
                    let ready = says.clone();
                    let listener = std::thread::Builder::new()
                        .name(format!("lane-{lane}-drained"))
                        .spawn(move || {
                            let mut first = lane == 0 && first_own;
                            for () in drained_heard.iter() {
                                if std::mem::take(&mut first) {
                                    let _ = ready.send(LaneSays::Ready);
                                }
                            }
                        });
                    let listener = match listener {
                        Ok(listener) => listener,
                        Err(e) => {
                            // The lane is down before it began.
                            let e =
                                XferError::io(format!("cannot start a thread for lane {lane}"), e);
                            let _ = says.send(LaneSays::Ended(lane, Some(e)));
                            return;
                        }
                    };
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
                            // Cut short with the session: the lane's loss
                            // (its Ended follows), not the piece's verdict.
                            FileEvent::Failed(f) if f.session_ended => return,
                            FileEvent::Failed(f) => {
                                let refusal = f.reason_code.and_then(RejectCode::from_slug);
                                let status = match refusal {
                                    Some(RejectCode::Protocol) => AckStatus::Protocol,
                                    _ => AckStatus::Io,
                                };
                                Err((status, f.reason.clone()))
                            }
                        };
                        let _ = answers.send(LaneSays::Answer(lane, verdict));
                    };
                    let ended = run_lane(lane, feed, &mut on_piece);
                    let _ = says.send(LaneSays::Ended(lane, ended.err()));
                    let _ = listener.join();
                });
            if let Err(e) = spawned {
                let e = XferError::io(format!("cannot start a thread for lane {lane}"), e);
                warn!(lane, "{e}");
                unstarted.push((lane, e));
            }
        }
        drop(says);
        let started = (0..lanes.max(1)).map(|l| l == 0 || !first_own).collect();
        let mut dispatch = Dispatch {
            feeds,
            carrying: vec![VecDeque::new(); lanes.max(1) as usize],
            heard: &heard,
            chunk,
            verify,
            waiting: first_own,
            starts,
            started,
            on_file,
            watches,
            progress,
            whole_only: false,
            committing: false,
            sending_whole: false,
            whole_lane: None,
        };
        // A lane that cannot start is a lane down; the run cannot go
        // without any, nor without lane 0 when it offers entries of its
        // own first.
        let none_started = unstarted.len() == dispatch.feeds.len();
        let mut cannot = None;
        for (lane, e) in unstarted {
            if none_started || (lane == 0 && first_own) {
                cannot.get_or_insert(e);
            } else {
                dispatch.lane_down(lane, Some(e), None);
            }
        }
        if let Some(e) = cannot {
            return Err(e);
        }
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
        dispatch.await_ends();
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
    /// Each lane's session was started.
    started: Vec<bool>,
    on_file: &'f mut dyn FnMut(FileEvent<'_>),
    /// Each lane's silence, and its giving up.
    watches: Vec<Arc<LaneWatch>>,
    /// Told of each lane lost (`--json`).
    progress: &'f ProgressSink,
    /// The receiver refused pieces (it takes files whole): every file
    /// goes whole.
    whole_only: bool,
    /// Only the file's last answer is owed: the receiver may be
    /// committing it (`FIN_SILENCE`).
    committing: bool,
    /// A file goes whole (`send_whole`).
    sending_whole: bool,
    /// The lane that took the last file sent whole.
    whole_lane: Option<usize>,
}

/// What the dispatcher heard, once lane 0's own business is dealt with.
enum Heard {
    /// Lane 0 answered its own entries: the other lanes started.
    Ready,
    /// A lane given up for its silence (`LANE_SILENCE`).
    Silent(LaneId),
    Answer(LaneId, Verdict),
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
                    self.started.fill(true);
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

    /// A carrying lane silent too long (`to_give_up`): given up (its
    /// session ends at its next look), its piece to go to the others. A
    /// receiver that is only slow leaves every lane silent, and costs one
    /// lane at most.
    fn silent_lane(&mut self) -> Option<LaneId> {
        // A file sent whole does not probe its path (only a piece does):
        // its session's own timeout watches it.
        if self.sending_whole {
            return None;
        }
        let now = Instant::now();
        let standing: Vec<usize> = (0..self.feeds.len())
            .filter(|&l| self.feeds[l].is_some())
            .collect();
        let idle = standing.iter().any(|&l| self.carrying[l].is_empty());
        let carrying: Vec<Look> = standing
            .into_iter()
            .filter(|&l| !self.carrying[l].is_empty())
            .map(|l| {
                let look = self.watches[l].look(l, now);
                // A FIN's answer may take long only at the file's commit.
                let fin_owed = look.fin_owed && self.committing;
                Look { fin_owed, ..look }
            })
            .collect();
        let (lane, silent) = to_give_up(&carrying, idle)?;
        self.watches[lane].give_up(silent);
        Some(lane as LaneId)
    }

    /// Every file is done: the lanes' sessions end (BYE) once their feeds
    /// hang up, lanes not started never start. Waits for their ends (and
    /// lane 0's last verdicts on its own entries), giving up a lane silent
    /// past `END_SILENCE` meanwhile (its session's `check_watch` ends it).
    fn await_ends(&mut self) {
        let mut ending: Vec<bool> = (0..self.feeds.len())
            .map(|l| self.feeds[l].is_some() && self.started[l])
            .collect();
        self.feeds.clear();
        self.starts.clear();
        // An idle lane heard nothing while its feed had nothing for it:
        // its silence counts from now.
        let now = Instant::now();
        for watch in &self.watches {
            watch.heard(now);
        }
        loop {
            match self.heard.recv_timeout(WATCH_EVERY) {
                Ok(LaneSays::Own(own)) => self.own(own),
                Ok(LaneSays::Ended(lane, _)) => {
                    if let Some(e) = ending.get_mut(lane as usize) {
                        *e = false;
                    }
                }
                Ok(LaneSays::Answer(..) | LaneSays::Ready) => {}
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let now = Instant::now();
                    for (lane, e) in ending.iter_mut().enumerate() {
                        let look = self.watches[lane].look(lane, now);
                        if !*e || !look.past(END_SILENCE) {
                            continue;
                        }
                        *e = false;
                        self.watches[lane].give_up(look.silent);
                        let why = format!(
                            "given up: no word from its receiver for {:.1} s while its session was ending",
                            look.silent.as_secs_f64()
                        );
                        warn!(lane, "lane_down: {why}");
                        self.progress.lane_down(lane as LaneId, &why);
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => return,
            }
        }
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
        let source = match Source::open(file) {
            Ok(source) => source,
            Err(why) => {
                self.report(file, started, Striped::Failed(AckStatus::Io, why), None);
                return Ok(());
            }
        };
        if self.whole_only {
            return self.send_whole(file, &source, started);
        }
        let transfer = new_transfer_id()?;
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
            if let Some(failed) = self.hand_out(file, &source, &mut striping) {
                break failed;
            }
            if self.feeds.iter().all(Option::is_none) {
                break Striped::Failed(AckStatus::Io, "every lane is gone".into());
            }
            self.committing = !striping.more_to_send() && striping.under_way() <= 1;
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
                    // No digest: answered without its data (verified
                    // before).
                    let data = matches!(verdict, Ok((_, Some(_))));
                    if let Ok((_, Some(digest))) = &verdict {
                        striping.piece_digest(index, *digest);
                    }
                    let (status, reason) = match verdict {
                        Ok((Outcome::PieceKept, _)) => (AckStatus::PieceKept, String::new()),
                        Ok((Outcome::Stored, _)) => (AckStatus::Ok, String::new()),
                        Ok((other, _)) => (other.ack_status(), String::new()),
                        Err(failed) => failed,
                    };
                    match striping.answered(lane, index, status, &reason, data) {
                        Striped::Pending => {}
                        done => break done,
                    }
                }
                Heard::Ended(lane, why) => self.lane_down(lane, why, Some(&mut striping)),
                Heard::Silent(lane) => {
                    let why = self.silence_of(lane);
                    self.lane_down(lane, Some(why), Some(&mut striping));
                }
                Heard::Ready => {}
            }
        };
        self.committing = false;
        if let Striped::Whole(why) = verdict {
            // So will the next files be.
            self.whole_only = true;
            info!(
                file = %escaped(&file.name),
                "the receiver takes it whole ({}): it goes whole, on one lane",
                escaped(&why)
            );
            return self.send_whole(file, &source, started);
        }
        self.report(file, started, verdict, striping.whole_digest());
        Ok(())
    }

    /// Why lane `lane` was given up for its silence.
    fn silence_of(&self, lane: LaneId) -> XferError {
        let silent = self.watches[lane as usize].given_up().unwrap_or_default();
        XferError::io(
            "given up",
            std::io::Error::other(format!(
                "no word from its receiver for {:.1} s while the other lanes heard theirs",
                silent.as_secs_f64()
            )),
        )
    }

    /// Sends `file` whole on one lane (the receiver takes no pieces), on
    /// another if that lane is lost; its report.
    fn send_whole(
        &mut self,
        file: &StripedFile,
        source: &Source,
        started: Instant,
    ) -> Result<(), XferError> {
        // Names this offer among what the lanes carry (never a piece's).
        let whole = new_transfer_id()?;
        // Lanes that refused it for a protocol reason: a `--once`
        // receiver takes whole files on its first session only (the
        // others joined it, and carry pieces only).
        let mut refused = vec![false; self.feeds.len()];
        let mut refusal = None;
        let verdict = 'offers: loop {
            // The lane that took the last whole file, then lane 0 (the
            // first to connect, usually), then the least busy.
            let Some(lane) = (0..self.feeds.len())
                .filter(|&l| self.feeds[l].is_some() && !refused[l])
                .min_by_key(|&l| (Some(l) != self.whole_lane, l != 0, self.carrying[l].len()))
            else {
                break Err(refusal.unwrap_or((AckStatus::Io, "every lane is gone".to_string())));
            };
            let opened = match source.reader(file) {
                Ok(opened) => opened,
                Err(why) => break Err((AckStatus::Io, why)),
            };
            let entry = Entry::Piece {
                offer: self.offer_of(file),
                file: opened,
                start: 0,
            };
            if self.feeds[lane]
                .as_ref()
                .is_none_or(|f| f.send(entry).is_err())
            {
                // Its session is gone (its Ended finds it down already).
                self.lane_down(lane as LaneId, None, None);
                continue;
            }
            if self.carrying[lane].is_empty() {
                self.watches[lane].heard(Instant::now());
            }
            self.carrying[lane].push_back((whole, 0));
            // Not watched for silence meanwhile (`silent_lane`).
            self.sending_whole = true;
            loop {
                let Some(heard) = self.hear()? else {
                    break 'offers Err((AckStatus::Io, "every lane is gone".to_string()));
                };
                match heard {
                    Heard::Answer(l, verdict) => {
                        if self.carrying[l as usize].pop_front() != Some((whole, 0)) {
                            continue;
                        }
                        match verdict {
                            Err((AckStatus::Protocol, why)) => {
                                refused[lane] = true;
                                refusal = Some((AckStatus::Protocol, why));
                                continue 'offers;
                            }
                            verdict => {
                                self.whole_lane = Some(lane);
                                break 'offers verdict;
                            }
                        }
                    }
                    Heard::Ended(l, why) => {
                        self.lane_down(l, why, None);
                        if l as usize == lane {
                            continue 'offers;
                        }
                    }
                    Heard::Silent(l) => {
                        let why = self.silence_of(l);
                        self.lane_down(l, Some(why), None);
                        if l as usize == lane {
                            continue 'offers;
                        }
                    }
                    Heard::Ready => {}
                }
            }
        };
        self.sending_whole = false;
        match verdict {
            Ok((outcome, digest)) => self.report_done(file, started, outcome, digest),
            Err((status, why)) => self.report(file, started, Striped::Failed(status, why), None),
        }
        Ok(())
    }

    /// Gives each standing lane its next pieces of `file`, up to
    /// `PIECES_AHEAD` (round by round, so that pieces spread over lanes).
    /// The file's failure if it changed, or no piece can be read.
    fn hand_out(
        &mut self,
        file: &StripedFile,
        source: &Source,
        striping: &mut Striping,
    ) -> Option<Striped> {
        for round in 0..PIECES_AHEAD {
            for lane in 0..self.feeds.len() {
                if self.carrying[lane].len() > round || self.feeds[lane].is_none() {
                    continue;
                }
                if !striping.more_to_send() {
                    return None;
                }
                // A file changed under its pieces would arrive a mix of
                // two versions: no more of it goes.
                let opened = match source.reader(file) {
                    Ok(opened) => opened,
                    Err(why) => return Some(Striped::Failed(AckStatus::Io, why)),
                };
                let piece = striping.next_for(lane as LaneId)?;
                let entry = self.entry(file, piece, opened);
                let sent = self.feeds[lane].as_ref().map(|f| f.send(entry).is_ok());
                match sent {
                    Some(true) => {
                        // An idle lane's silence counts from its new piece.
                        if self.carrying[lane].is_empty() {
                            self.watches[lane].heard(Instant::now());
                        }
                        self.carrying[lane].push_back((piece.transfer, piece.index));
                    }
                    // Its session is gone (its Ended, later, finds it
                    // down already).
                    _ => self.lane_down(lane as LaneId, None, Some(striping)),
                }
            }
        }
        None
    }

    /// The entry of `piece` of `file`, read from `opened`.
    fn entry(&self, file: &StripedFile, piece: Piece, opened: File) -> Entry {
        Entry::Piece {
            offer: FileOffer {
                size: piece.bytes(),
                piece: Some(piece),
                ..self.offer_of(file)
            },
            file: opened,
            start: piece.offset(),
        }
    }

    /// The offer of `file` (whole; a piece's names its place).
    fn offer_of(&self, file: &StripedFile) -> FileOffer {
        FileOffer {
            name: file.name.clone(),
            size: file.size,
            mode: file.mode,
            digest: self.verify,
            kind: OfferKind::File,
            mtime: Some(file.mtime),
            keep_mode: file.keep_mode,
            resume: false,
            checksum: false,
            existing: file.existing,
            piece: None,
        }
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
                self.report_done(file, started, outcome, digest);
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
            // (The loop ends only with a verdict; Whole is sent whole.)
            Striped::Pending | Striped::Whole(_) => {}
        }
    }

    /// `file` arrived (or stays, or was taken otherwise: `outcome`).
    fn report_done(
        &mut self,
        file: &StripedFile,
        started: Instant,
        outcome: Outcome,
        digest: Option<Digest>,
    ) {
        let report = FileReport {
            name: file.name.clone(),
            bytes: file.size,
            elapsed: started.elapsed(),
            // Of what was sent from here: the receiver's too.
            digest: digest.filter(|_| outcome == Outcome::Stored),
            phases: Default::default(),
            resumed_from: 0,
            outcome,
            host: None,
        };
        (self.on_file)(FileEvent::Done(&report));
    }
}

/// A new transfer's id: random, so that pieces of two transfers never
/// meet at the receiver.
fn new_transfer_id() -> Result<TransferId, XferError> {
    let mut id = [0u8; 16];
    getrandom::fill(&mut id)
        .map_err(|e| XferError::Internal(format!("no random transfer id: {e}")))?;
    Ok(TransferId(id))
}

/// A file sent in pieces, opened once: every piece reads this one file
/// (a duplicate of its descriptor; pieces are read at their offsets, so
/// the shared file position does not matter), whatever its path names
/// meanwhile, and it is the file that was listed (size, modification
/// time) while its pieces go out; else the receiver would commit a mix
/// of two versions.
struct Source(File);

impl Source {
    /// Opens `file` and checks it is still what was listed.
    fn open(file: &StripedFile) -> Result<Self, String> {
        let opened = File::open(&file.path)
            .map_err(|e| format!("cannot open {}: {e}", file.path.display()))?;
        let source = Source(opened);
        source.changed(file).map_or(Ok(source), |how| {
            Err(format!(
                "{} changed since it was listed: {how}",
                file.path.display()
            ))
        })
    }

    /// How the open file differs from what was listed, if it does.
    fn changed(&self, file: &StripedFile) -> Option<String> {
        let meta = match self.0.metadata() {
            Ok(meta) => meta,
            Err(e) => return Some(format!("cannot stat it: {e}")),
        };
        if !meta.is_file() {
            return Some("it is no longer a regular file".into());
        }
        if meta.len() != file.size {
            return Some(format!(
                "{} bytes now, {} when listed",
                meta.len(),
                file.size
            ));
        }
        if crate::engine::entries::mtime_of(&meta) != Some(file.mtime) {
            return Some("its modification time changed".into());
        }
        None
    }

    /// A descriptor of the file for one piece (or for the whole file),
    /// once the file is found unchanged (size, modification time).
    fn reader(&self, file: &StripedFile) -> Result<File, String> {
        if let Some(how) = self.changed(file) {
            return Err(format!(
                "{} changed while it was sent: {how}",
                file.path.display()
            ));
        }
        self.0
            .try_clone()
            .map_err(|e| format!("cannot read {} once more: {e}", file.path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn look(lane: usize, silent_ms: u64, fin_owed: bool) -> Look {
        Look {
            lane,
            silent: Duration::from_millis(silent_ms),
            fin_owed,
        }
    }

    #[test]
    fn a_lane_awaiting_a_fins_answer_may_be_silent_far_longer() {
        let ms = Duration::from_millis;
        // Silent past LANE_SILENCE while the other lane is heard: gone.
        let heard = look(1, 100, false);
        assert_eq!(
            to_give_up(&[look(0, 1200, false), heard], false),
            Some((0, ms(1200)))
        );
        // Awaiting its FIN's answer (the receiver may be committing the
        // file): kept, the others heard or idle.
        assert_eq!(to_give_up(&[look(0, 1200, true), heard], false), None);
        assert_eq!(to_give_up(&[look(0, 20_000, true)], true), None);
        // Until FIN_SILENCE.
        assert_eq!(
            to_give_up(&[look(0, 30_000, true), heard], false),
            Some((0, FIN_SILENCE))
        );
        // The most silent of those past their allowance goes.
        let lanes = [
            look(0, 5000, true),
            look(1, 1500, false),
            look(2, 50, false),
        ];
        assert_eq!(to_give_up(&lanes, false), Some((1, ms(1500))));
        // Every lane silent and none idle: the receiver is slow.
        let slow = [look(0, 2000, false), look(1, 1500, false)];
        assert_eq!(to_give_up(&slow, false), None);
        assert_eq!(to_give_up(&slow, true), Some((0, ms(2000))));
        assert_eq!(to_give_up(&[], true), None);
        // Once every file is done: END_SILENCE, or FIN_SILENCE.
        assert!(!look(0, 3000, false).past(END_SILENCE));
        assert!(look(0, 4000, false).past(END_SILENCE));
        assert!(!look(0, 4000, true).past(END_SILENCE));
    }
}
