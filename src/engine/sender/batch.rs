//! Small files offered together (BATCH): one ring, one data stream (the
//! files' bytes back to back), one FIN and one ACK for many files, instead
//! of a round trip, a write and an ACK each. A refused batch is not a
//! failure: its files are then offered one by one, and each gets its own
//! answer. And the queue of entries still to offer (`Queue`): pruned below
//! refused directories, small files taken together when a batch may go.

use super::member::{Member, input, open_member};
use super::pump::{Offered, Pipeline, Work};
use super::verdicts::Tracker;
use super::{Connection, FileError, SenderConfig, below_any, proto_err};
use crate::engine::entries::Entry;
use crate::engine::reader::ReadJob;
use crate::error::XferError;
use crate::proto::{BATCH_ROOM, FileOffer, MAX_BATCH_FILES, batch_member_len};
use std::collections::VecDeque;
use std::sync::mpsc;
use std::time::Instant;
use tracing::{error_span, info};

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

impl Connection {
    /// Offers `entries` (small files) as one BATCH: the work of sending
    /// their data, or None when none could be opened (each failed on its
    /// own, as it would alone). Files that grew past the batch limit since
    /// the walk go back to the queue, to be sent alone.
    /// A failure that ends the session is reported for every file of the
    /// batch before it is returned.
    pub(super) fn start_batch(
        &mut self,
        cfg: &SenderConfig,
        entries: Vec<Entry>,
        queue: &mut Queue,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Option<Work>, XferError> {
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
        queue.put_back(alone);
        if members.is_empty() {
            return Ok(None);
        }
        let sizes: Vec<(String, u64)> = members
            .iter()
            .map(|m| (m.offer.name.clone(), m.offer.size))
            .collect();
        self.offer_batch(cfg, members, started, pipe)
            .map(Some)
            .map_err(|err| {
                let (FileError::Fatal(e) | FileError::Continue(e)) = err;
                for (name, size) in &sizes {
                    tracker.report(name, *size, Some(started), &e, true);
                }
                e
            })
    }

    /// BATCH for `members`, read ahead when the ring is known.
    fn offer_batch(
        &mut self,
        cfg: &SenderConfig,
        members: Vec<Member>,
        started: Instant,
        pipe: &mut Pipeline<'_>,
    ) -> Result<Work, FileError> {
        let offers: Vec<FileOffer> = members.iter().map(|m| m.offer.clone()).collect();
        let total: u64 = offers.iter().map(|o| o.size).sum();
        let name = format!(
            "{} files from {}",
            offers.len(),
            offers.first().map_or("", |o| o.name.as_str())
        );
        let span = error_span!("batch", files = offers.len(), size = total);
        // A batch has no span for its MR exchange (see `start_data`).
        let phase = tracing::Span::none();
        let input = input(&members)?;
        // Once the session's ring is known, the files are read while the
        // receiver prepares for them: the MR only confirms the ring.
        let read_ahead = self.session.expected_chunk_len();
        // Its verdict's payload comes with its FIN (`awaiting_ack`).
        self.session.offer_batch(offers).map_err(proto_err)?;
        self.transmit()?;
        let mut work = Work::new(
            name.clone(),
            (span, phase),
            Offered::Batch {
                members,
                size: total,
            },
            self.connect_time,
        );
        work.started = started;
        if let Some(chunk_len) = read_ahead {
            pipe.read(ReadJob {
                input,
                name,
                chunk_len,
                digest: cfg.verify,
                resume: None,
                auth: self.session.chunk_auth(),
            })?;
            work.reading = true;
            work.read_ahead = Some(chunk_len);
        }
        Ok(work)
    }
}

/// What to offer next.
pub(super) enum Next {
    Alone(Entry),
    /// Small files, as one BATCH.
    Batch(Vec<Entry>),
}

/// Entries handed to a session while it runs (a relay hop's, one per
/// offer it passes on): the session says `drained` each time it has
/// answered all it was given, then waits for more; it closes once the
/// feed hangs up.
pub struct Feed {
    pub entries: mpsc::Receiver<Entry>,
    pub drained: mpsc::Sender<()>,
    /// A lane's: what its session and the lanes' dispatcher share.
    pub watch: Option<std::sync::Arc<super::lanes::LaneWatch>>,
}

/// The entries still to offer, in order: what lies below a refused
/// directory is dropped; small files go in batches when the machine
/// allows one, except those put back (a refused batch's, one by one).
pub(super) struct Queue {
    entries: VecDeque<Entry>,
    /// Entries at the front that go one by one.
    alone: usize,
    /// Refused directories already pruned from `entries`.
    pruned: usize,
    /// Where more entries come from, if they do.
    feed: Option<Feed>,
    /// Entries came from the feed since `drained` was last said.
    owed: bool,
}

/// What a drained queue waits for came.
pub(super) enum Fed {
    More,
    /// Nothing more will come: the session may close.
    Over,
}

impl Queue {
    pub(super) fn new(entries: Vec<Entry>, feed: Option<Feed>) -> Self {
        // A fed session with entries of its own says when it answered
        // them too (a lane 0's: the other lanes wait for its directories).
        let owed = feed.is_some() && !entries.is_empty();
        Queue {
            entries: VecDeque::from(entries),
            alone: 0,
            pruned: 0,
            feed,
            owed,
        }
    }

    /// Everything given was answered: says so to the feed and waits for
    /// its next entry (`Over` when it hangs up, or there is none).
    pub(super) fn drained(&mut self) -> Fed {
        let Some(feed) = &self.feed else {
            return Fed::Over;
        };
        if std::mem::take(&mut self.owed) && feed.drained.send(()).is_err() {
            return Fed::Over;
        }
        match feed.entries.recv() {
            Ok(entry) => {
                self.owed = true;
                self.entries.push_back(entry);
                Fed::More
            }
            Err(mpsc::RecvError) => Fed::Over,
        }
    }

    /// `back` goes to the front, each entry to be offered alone.
    pub(super) fn put_back(&mut self, back: Vec<Entry>) {
        self.alone += back.len();
        for e in back.into_iter().rev() {
            self.entries.push_front(e);
        }
    }

    pub(super) fn next(
        &mut self,
        cfg: &SenderConfig,
        may_batch: bool,
        tracker: &mut Tracker<'_>,
    ) -> Option<Next> {
        loop {
            if self.entries.is_empty()
                && let Some(entry) = self.feed.as_ref().and_then(|f| f.entries.try_recv().ok())
            {
                self.owed = true;
                self.entries.push_back(entry);
            }
            // What lies below a refused directory would be refused too.
            // (Not a feed's: each of its entries is answered, by the
            // receiver.)
            if tracker.refused_dirs.len() > self.pruned && self.feed.is_none() {
                let dirs = &tracker.refused_dirs[self.pruned..];
                let before = self.entries.len();
                self.entries.retain(|e| !below_any(e.name(), dirs));
                let dropped = before - self.entries.len();
                if dropped > 0 {
                    info!(
                        dropped,
                        "not offered: below a directory the receiver refused"
                    );
                }
                tracker.outcome.skipped += dropped;
                self.pruned = tracker.refused_dirs.len();
            }
            let entry = self.entries.pop_front()?;
            if self.feed.is_none() && below_any(entry.name(), &tracker.refused_dirs) {
                tracker.outcome.skipped += 1;
                self.alone = self.alone.saturating_sub(1);
                continue;
            }
            if self.alone > 0 {
                self.alone -= 1;
                return Some(Next::Alone(entry));
            }
            if !(batchable(cfg, &entry) && may_batch) {
                return Some(Next::Alone(entry));
            }
            let mut files = take_batch(cfg, entry, &mut self.entries);
            if files.len() > 1 {
                return Some(Next::Batch(files));
            }
            if let Some(e) = files.pop() {
                return Some(Next::Alone(e));
            }
        }
    }
}
