//! `sender --lanes N`: big files in pieces over N sessions at once (each
//! its own connection, queue pair, reader and thread), one `Striping`
//! per file deciding which piece each lane sends next. A lane carries one
//! piece at a time and gets the next when its answer comes; a lane whose
//! session ends gives its piece back to the others (`lane_down`), and the
//! file goes on unless every lane is gone.

use super::SessionOutcome;
use super::batch::Feed;
use crate::engine::entries::Entry;
use crate::engine::report::{FileEvent, FileFailure, FileReport, Outcome};
use crate::error::XferError;
use crate::proto::assembly::{LaneId, Piece, Striped, Striping, TransferId, piece_size_for};
use crate::proto::{AckStatus, DigestAlg, FileOffer, Mtime, OfferKind, escaped};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;
use tracing::{info, warn};

/// The least piece: smaller files go whole, on one lane.
pub const MIN_PIECE: u64 = 4 << 20;

/// A file to send in pieces.
pub struct StripedFile {
    pub name: String,
    pub path: PathBuf,
    pub size: u64,
    pub mode: u32,
    pub mtime: Mtime,
}

/// The files of `entries` to send in pieces: regular files of two least
/// pieces or more, with their mtimes (a piece's offer needs one).
pub fn striped_files(entries: &[Entry]) -> Vec<StripedFile> {
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
                })
            }
            _ => None,
        })
        .collect()
}

/// What a lane says to the dispatcher.
enum LaneSays {
    /// The verdict on its piece: the outcome, or why it failed.
    Answer(LaneId, Result<Outcome, String>),
    /// Its session ended (with the error that ended it, if one did).
    Ended(LaneId, Option<String>),
}

/// Runs one lane's session: its entries from `feed`, each verdict to
/// `on_file`. (Over RDMA: `send_fed`; a test's, over the memory wire.)
pub type RunLane<'a> = dyn Fn(LaneId, Feed, &mut dyn FnMut(FileEvent<'_>)) -> Result<SessionOutcome, XferError>
    + Sync
    + 'a;

/// Sends `files` in pieces over `lanes` lanes run by `run_lane`; each
/// file's report (or failure) to `on_file`. The digest each piece is
/// checked with: `verify`; chunks of `chunk` bytes.
pub fn send_striped(
    files: Vec<StripedFile>,
    (lanes, chunk, verify): (u32, u32, DigestAlg),
    run_lane: &RunLane<'_>,
    on_file: &mut dyn FnMut(FileEvent<'_>),
) -> Result<(), XferError> {
    let (says, heard) = mpsc::channel::<LaneSays>();
    std::thread::scope(|s| {
        let mut feeds = Vec::new();
        // A lane's session says when it answered all it was given; the
        // dispatcher goes by the answers, but the session needs someone
        // to say it to (else it takes the feed for hung up).
        let mut said_drained = Vec::new();
        for lane in 0..u64::from(lanes.max(1)) {
            let (entries, taken) = mpsc::channel::<Entry>();
            let (drained, drained_heard) = mpsc::channel::<()>();
            said_drained.push(drained_heard);
            feeds.push(Some(entries));
            let says = says.clone();
            s.spawn(move || {
                let feed = Feed {
                    entries: taken,
                    drained,
                };
                let answers = says.clone();
                let mut on_piece = |event: FileEvent<'_>| {
                    let verdict = match event {
                        FileEvent::Done(r) => Ok(r.outcome),
                        // Cut short with the session: the lane's loss (its
                        // Ended follows), not the piece's verdict.
                        FileEvent::Failed(f) if f.session_ended => return,
                        FileEvent::Failed(f) => Err(f.reason.clone()),
                    };
                    let _ = answers.send(LaneSays::Answer(lane, verdict));
                };
                let ended = run_lane(lane, feed, &mut on_piece);
                let why = match ended {
                    Ok(_) => None,
                    Err(e) => Some(e.to_string()),
                };
                let _ = says.send(LaneSays::Ended(lane, why));
            });
        }
        drop(says);
        let mut dispatch = Dispatch {
            feeds,
            carrying: vec![None; lanes.max(1) as usize],
            heard: &heard,
            chunk,
            verify,
        };
        let mut result = Ok(());
        for file in files {
            if let Err(e) = dispatch.send(&file, on_file) {
                result = Err(e);
                break;
            }
        }
        // The lanes' sessions end (BYE) once their feeds hang up.
        dispatch.feeds.clear();
        drop(said_drained);
        result
    })
}

struct Dispatch<'h> {
    /// Each lane's feed; None once its session ended.
    feeds: Vec<Option<mpsc::Sender<Entry>>>,
    /// The piece each lane carries: (file's transfer, index).
    carrying: Vec<Option<(TransferId, u32)>>,
    heard: &'h mpsc::Receiver<LaneSays>,
    chunk: u32,
    verify: DigestAlg,
}

impl Dispatch<'_> {
    /// Sends `file` in pieces over the lanes standing; its report.
    fn send(
        &mut self,
        file: &StripedFile,
        on_file: &mut dyn FnMut(FileEvent<'_>),
    ) -> Result<(), XferError> {
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
            lanes,
            "sending in pieces"
        );
        let verdict = loop {
            self.hand_out(file, &mut striping)?;
            if self.feeds.iter().all(Option::is_none) {
                break Striped::Failed(AckStatus::Io, "every lane is gone".into());
            }
            let Ok(said) = self.heard.recv() else {
                break Striped::Failed(AckStatus::Io, "every lane is gone".into());
            };
            match said {
                LaneSays::Answer(lane, verdict) => {
                    let Some((t, index)) = self.carrying[lane as usize].take() else {
                        continue;
                    };
                    if t != transfer {
                        continue;
                    }
                    let (status, reason) = match verdict {
                        Ok(Outcome::PieceKept) => (AckStatus::PieceKept, String::new()),
                        Ok(Outcome::Stored) => (AckStatus::Ok, String::new()),
                        Ok(other) => (other.ack_status(), String::new()),
                        Err(why) => (AckStatus::Io, why),
                    };
                    match striping.answered(lane, index, status, &reason) {
                        Striped::Pending => {}
                        done => break done,
                    }
                }
                LaneSays::Ended(lane, why) => {
                    let why = why.unwrap_or_else(|| "its session ended".into());
                    warn!(lane, "lane_down: {why}; its piece goes to the other lanes");
                    self.feeds[lane as usize] = None;
                    self.carrying[lane as usize] = None;
                    striping.lane_gone(lane);
                }
            }
        };
        self.report(file, started, verdict, on_file);
        Ok(())
    }

    /// Gives each idle standing lane its next piece of `file`.
    fn hand_out(&mut self, file: &StripedFile, striping: &mut Striping) -> Result<(), XferError> {
        for lane in 0..self.feeds.len() {
            if self.carrying[lane].is_some() || self.feeds[lane].is_none() {
                continue;
            }
            let Some(piece) = striping.next_for(lane as LaneId) else {
                return Ok(());
            };
            let entry = self.entry(file, piece)?;
            let sent = self.feeds[lane].as_ref().map(|f| f.send(entry).is_ok());
            match sent {
                Some(true) => self.carrying[lane] = Some((piece.transfer, piece.index)),
                // Its session is gone: its Ended says so.
                _ => {
                    striping.lane_gone(lane as LaneId);
                    self.feeds[lane] = None;
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
                keep_mode: false,
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
        &self,
        file: &StripedFile,
        started: Instant,
        verdict: Striped,
        on_file: &mut dyn FnMut(FileEvent<'_>),
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
                    digest: None,
                    phases: Default::default(),
                    resumed_from: 0,
                    outcome,
                    host: None,
                };
                on_file(FileEvent::Done(&report));
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
                on_file(FileEvent::Failed(&failure));
            }
            // (The loop ends only with a verdict.)
            Striped::Pending => {}
        }
    }
}
