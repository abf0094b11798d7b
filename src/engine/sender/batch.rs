//! Small files offered together (BATCH): one ring, one data stream (the
//! files' bytes back to back), one FIN and one ACK for many files, instead
//! of a round trip, a write and an ACK each. A refused batch is not a
//! failure: its files are then offered one by one, and each gets its own
//! answer.

use super::verdicts::{PendingEntry, Tracker, awaiting_ack};
use super::{Connection, FileError, SenderConfig, ack_error, proto_err, unexpected};
use crate::engine::entries::Entry;
use crate::engine::reader::{BatchFile, Input, ReadJob, ReaderMsg};
use crate::engine::report::{FileReport, Phases};
use crate::error::XferError;
use crate::proto::{
    BATCH_ROOM, FileOffer, MAX_BATCH_FILES, SenderEvent, SenderState, batch_member_len,
};
use std::collections::VecDeque;
use std::fs::File;
use std::time::Instant;
use tracing::{debug, error_span};

/// Files up to this size are offered in batches.
pub(super) const BATCH_FILE_MAX: u64 = 64 * 1024;
/// A batch carries at most this many bytes (what a failed batch costs).
const BATCH_BYTES_MAX: u64 = 4 * 1024 * 1024;

/// Whether `entry` may go in a batch: a small file, not resumed (a
/// resumed file needs its own HAVE).
pub(super) fn batchable(cfg: &SenderConfig, entry: &Entry) -> bool {
    !cfg.resume && matches!(entry, Entry::File { size, .. } if *size <= BATCH_FILE_MAX)
}

/// Takes `first` and the batchable files that follow it in `queue`, as many
/// as one BATCH holds.
pub(super) fn take_batch(
    cfg: &SenderConfig,
    first: Entry,
    queue: &mut VecDeque<Entry>,
) -> Vec<Entry> {
    let mtime = |e: &Entry| matches!(e, Entry::File { mtime: Some(_), .. });
    let mut room = BATCH_ROOM.saturating_sub(batch_member_len(first.name(), mtime(&first)));
    let mut bytes = first.size();
    // Names given twice on the command line (`a/f b/f`) never share a
    // batch (the receiver refuses that).
    let mut names = std::collections::HashSet::from([first.name().to_string()]);
    let mut batch = vec![first];
    while batch.len() < MAX_BATCH_FILES {
        let Some(next) = queue.front() else { break };
        let len = batch_member_len(next.name(), mtime(next));
        if !batchable(cfg, next)
            || len > room
            || bytes + next.size() > BATCH_BYTES_MAX
            || !names.insert(next.name().to_string())
        {
            break;
        }
        room -= len;
        bytes += next.size();
        batch.extend(queue.pop_front());
    }
    batch
}

/// What became of a batch.
pub(super) enum Batched {
    /// Sent; its verdict comes later (or its files failed to open, each
    /// reported). `alone`: files that grew past the batch limit since the
    /// walk, to be sent on their own.
    Sent { alone: Vec<Entry> },
    /// The receiver refused the batch: these files go one by one.
    Refused(Vec<Entry>),
}

/// A batch file, opened and measured.
struct Member {
    path: std::path::PathBuf,
    offer: FileOffer,
    file: File,
}

impl Connection {
    /// Offers `entries` (small files) as one BATCH and sends their data.
    /// A file that cannot be opened fails on its own, as it would alone. A
    /// fatal error is reported for every file of the batch before it is
    /// returned.
    pub(super) fn send_batch(
        &mut self,
        cfg: &SenderConfig,
        entries: Vec<Entry>,
        pipe: &mut super::pump::Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Batched, XferError> {
        let started = Instant::now();
        let mut members = Vec::with_capacity(entries.len());
        let mut alone = Vec::new();
        for entry in entries {
            let Entry::File {
                path,
                name,
                size,
                opened,
                mtime,
            } = entry
            else {
                continue;
            };
            match open_member(cfg, &path, name.clone(), opened, mtime) {
                Ok(m) if m.offer.size > BATCH_FILE_MAX => alone.push(m.into_entry()),
                Ok(m) => members.push(m),
                Err(e) => tracker.fail(&name, size, Some(started), e),
            }
        }
        if members.is_empty() {
            return Ok(Batched::Sent { alone });
        }
        let sizes: Vec<(String, u64)> = members
            .iter()
            .map(|m| (m.offer.name.clone(), m.offer.size))
            .collect();
        match self.offer_and_send(cfg, members, started, pipe, tracker) {
            Ok(Batched::Sent { .. }) => Ok(Batched::Sent { alone }),
            Ok(Batched::Refused(mut back)) => {
                back.append(&mut alone);
                Ok(Batched::Refused(back))
            }
            Err(FileError::Fatal(e) | FileError::Continue(e)) => {
                for (name, size) in &sizes {
                    tracker.report(name, *size, Some(started), &e, true);
                }
                Err(e)
            }
        }
    }

    fn offer_and_send(
        &mut self,
        cfg: &SenderConfig,
        members: Vec<Member>,
        started: Instant,
        pipe: &mut super::pump::Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Batched, FileError> {
        let offers: Vec<FileOffer> = members.iter().map(|m| m.offer.clone()).collect();
        let total: u64 = offers.iter().map(|o| o.size).sum();
        let name = format!(
            "{} files from {}",
            offers.len(),
            offers.first().map_or("", |o| o.name.as_str())
        );
        let span = error_span!("batch", files = offers.len(), size = total);
        let _enter = span.enter();
        let files: Vec<BatchFile> = members
            .iter()
            .map(|m| {
                m.file.try_clone().map(|file| BatchFile {
                    file,
                    size: m.offer.size,
                    name: m.offer.name.clone(),
                })
            })
            .collect::<Result<_, _>>()
            .map_err(|e| XferError::io("cannot read a file of a batch", e))?;
        // Once the session's ring is known, the files are read while the
        // receiver prepares for them: the MR only confirms the ring.
        let read_ahead = self.session.expected_chunk_len();
        let offered = PendingEntry::Offered {
            name: name.clone(),
            started,
        };
        self.session
            .start_batch(offers, offered)
            .map_err(proto_err)?;
        self.transmit()?;
        let mut input = Some(Input::Batch(files));
        if let Some(chunk_len) = read_ahead
            && let Some(files) = input.take()
        {
            pipe.read(ReadJob {
                input: files,
                name: name.clone(),
                chunk_len,
                digest: cfg.verify,
                resume: None,
                auth: self.session.chunk_auth(),
            })?;
        }
        while self.session.state() == SenderState::AwaitRing {
            let event = self.next_event(pipe, tracker)?;
            match event {
                None | Some(SenderEvent::Ring(_)) => {}
                Some(SenderEvent::Rejected(rej)) => {
                    debug!(
                        code = rej.code.as_str(),
                        "batch refused, its files go one by one: {}",
                        crate::proto::escaped(&rej.reason)
                    );
                    if input.is_none() {
                        self.discard_read(cfg, pipe, tracker)?;
                    }
                    let back = members.into_iter().map(Member::into_entry).collect();
                    return Ok(Batched::Refused(back));
                }
                Some(SenderEvent::Aborted(ack)) => {
                    return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                }
                Some(other) => return Err(unexpected(&other)),
            }
        }
        let mut phases = Phases {
            connect: self.connect_time,
            mr_exchange: started.elapsed(),
            ..Phases::default()
        };
        if input.is_none() && read_ahead != Some(self.session.chunk_len()) {
            return Err(FileError::Fatal(XferError::Protocol {
                context: Some("the receiver's MR for a batch".into()),
                source: crate::proto::ProtocolError::BadRing {
                    reason: "its slots changed within the session",
                },
            }));
        }
        let files = members.len() as u64;
        let mut progress = cfg.progress.batch_started(&name, total, files);
        let data_started = Instant::now();
        let (digest, each) = error_span!("phase", name = "data").in_scope(|| {
            self.pump_chunks(
                cfg,
                input,
                &name,
                false,
                None,
                &mut *progress,
                pipe,
                tracker,
            )
        })?;
        phases.data = data_started.elapsed();
        // Each file's share of the batch's time (see `Phases::share`).
        let n = u32::try_from(members.len()).unwrap_or(u32::MAX);
        let reports = members
            .iter()
            .zip(each)
            .map(|(m, digest)| FileReport {
                name: m.offer.name.clone(),
                bytes: m.offer.size,
                elapsed: started.elapsed() / n.max(1),
                digest,
                phases: phases.share(n),
                resumed_from: 0,
                outcome: crate::engine::Outcome::Stored,
            })
            .collect();
        #[cfg(feature = "fault-injection")]
        let digest = crate::engine::fault::fin_digest(digest);
        self.session
            .finish_carrying(digest, awaiting_ack(reports, progress))
            .map_err(proto_err)?;
        self.transmit()?;
        debug!(files = members.len(), bytes = total, "FIN sent");
        Ok(Batched::Sent { alone: Vec::new() })
    }

    /// Takes back what the reader read ahead for a batch that was refused:
    /// every slot returns to it until it is done. The completions of
    /// earlier writes are handled meanwhile (they free the slots the
    /// reader may be waiting for).
    fn discard_read(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut super::pump::Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        if let Some((token, ..)) = pipe.held.take() {
            let _ = pipe.free.send(token);
        }
        let since = Instant::now();
        loop {
            match pipe
                .filled
                .recv_timeout(std::time::Duration::from_millis(100))
            {
                Ok(ReaderMsg::Chunk { token, .. }) => {
                    let _ = pipe.free.send(token);
                }
                Ok(ReaderMsg::Done(..) | ReaderMsg::Failed(..)) => return Ok(()),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout)
                    if since.elapsed() < cfg.timeout =>
                {
                    self.poll_events(pipe, tracker)?;
                }
                Err(_) => {
                    return Err(FileError::Fatal(XferError::Internal(
                        "the reader thread stalled or is gone".into(),
                    )));
                }
            }
        }
    }
}

impl Member {
    /// Back to an entry (its file stays open) to be sent on its own.
    fn into_entry(self) -> Entry {
        Entry::File {
            path: self.path,
            size: self.offer.size,
            name: self.offer.name,
            opened: Some(self.file),
            mtime: self.offer.mtime,
        }
    }
}

/// Opens (unless opened already) and measures a file of a batch.
fn open_member(
    cfg: &SenderConfig,
    path: &std::path::Path,
    name: String,
    opened: Option<File>,
    mtime: Option<crate::proto::Mtime>,
) -> Result<Member, XferError> {
    let (mut offer, file) = super::open_offer(cfg, path, name, opened, mtime)?;
    // Never resumed (batchable() sends no file of a --resume run here);
    // CHECKSUM stays: the receiver refuses the batch if it would ask one
    // of its files for a digest, and then asks that file alone.
    offer.resume = false;
    Ok(Member {
        path: path.to_path_buf(),
        offer,
        file,
    })
}
