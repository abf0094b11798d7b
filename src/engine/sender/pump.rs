//! One offer's work in the connection's loop (`Work`): a file, a stream
//! or a batch from its HELLO to its FIN (the ring, the chunks the reader
//! thread fills, each written as soon as a credit allows, the FIN once
//! all are written and the digest is known), and the reader's side of
//! the pipeline.

use super::have_read::HaveRead;
use super::member::{Member, input};
use super::verdicts::{PendingEntry, Tracker, awaiting_ack};
use super::{Connection, FileError, SenderConfig, proto_err, unexpected};
use crate::engine::Outcome;
use crate::engine::digest::FileHasher;
use crate::engine::entries::Entry;
use crate::engine::link::ChunkWrite;
use crate::engine::progress::FileProgress;
use crate::engine::reader::{Input, ReadJob, ReaderMsg};
use crate::engine::report::{FileReport, Phases};
use crate::engine::worker::{Lost, stalled};
use crate::error::XferError;
use crate::proto::{Ack, Digest, SameCopy, SenderEvent, Verdict, Waiting, escaped};
use crate::sys::rdma::{Buffer, BufferPool};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};
use tracing::{Span, debug, error_span, info};

/// How often a wait for the reader also listens to the receiver.
const READER_SLICE: Duration = Duration::from_millis(200);

/// The sender's side of the reader thread: channels plus the slots that are
/// posted (held until their write completes).
pub(super) struct Pipeline<'a> {
    pub(super) pool: &'a BufferPool,
    pub(super) jobs: Sender<ReadJob>,
    pub(super) free: Sender<Buffer>,
    pub(super) filled: Receiver<ReaderMsg>,
    /// Staging slots in all (each has one buffer).
    pub(super) depth: usize,
    /// Slots posted and not yet completed (the endpoint holds them).
    pub(super) posted: usize,
    /// Filled chunks waiting for a credit, in order.
    pub(super) held: VecDeque<(Buffer, u32, u32)>,
    /// A message of the reader's taken while waiting for it.
    pub(super) arrived: Option<ReaderMsg>,
    pub(super) stop: &'a AtomicBool,
}

impl Drop for Pipeline<'_> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Pipeline<'_> {
    /// Slots the reader holds or has filled but not yet handed over: when
    /// nonzero, a message from the reader is on its way.
    fn with_reader(&self) -> usize {
        // Never negative while the tokens are counted right; saturating so
        // that a miscount cannot wrap into "the reader has them all".
        self.depth
            .saturating_sub(self.posted)
            .saturating_sub(self.held.len())
            .saturating_sub(usize::from(self.arrived.is_some()))
    }

    /// Hands the reader its next job.
    pub(super) fn read(&self, job: ReadJob) -> Result<(), XferError> {
        self.jobs.send(job).map_err(|_| reader_gone_error())
    }

    /// A write completed: its slot goes back to the reader.
    pub(super) fn write_done(&mut self, token: Buffer) {
        self.posted = self.posted.saturating_sub(1);
        // The reader may already be gone (session ending): nothing to do then.
        let _ = self.free.send(token);
    }

    /// The reader's next message, if one came.
    fn next_msg(&mut self) -> Result<Option<ReaderMsg>, FileError> {
        if let Some(msg) = self.arrived.take() {
            return Ok(Some(msg));
        }
        match self.filled.try_recv() {
            Ok(msg) => Ok(Some(msg)),
            Err(TryRecvError::Empty) => Ok(None),
            Err(TryRecvError::Disconnected) => Err(reader_gone()),
        }
    }
}

fn reader_gone() -> FileError {
    FileError::Fatal(reader_gone_error())
}

/// The reader thread ended without saying why: it panicked (its panic
/// was reported on its thread).
fn reader_gone_error() -> XferError {
    Lost { thread: "reader" }.into()
}

/// What is offered.
pub(super) enum Offered {
    /// A file or a stream; its input goes to the reader at the MR (it is
    /// read here first to answer a HAVE).
    File {
        input: Option<Input>,
        stream: bool,
        size: u64,
    },
    /// Small files as one BATCH (read ahead when the ring is known).
    Batch { members: Vec<Member>, size: u64 },
}

/// Where an offer stands.
pub(super) enum Stage {
    /// HELLO or BATCH sent: until its MR (or the file's verdict without
    /// data, or its refusal). `resume`: where FROM continued a prefix,
    /// and the whole-file digest over it.
    Offer { resume: Option<(u64, FileHasher)> },
    /// Its chunks, written as the reader fills them and credits allow.
    Data {
        progress: Box<dyn FileProgress>,
        started: Instant,
        resumed_from: u64,
    },
    /// A refused batch: what the reader read ahead is thrown away, then
    /// its files go back to the queue, one by one.
    Discarding { back: Vec<Entry> },
}

/// One offer's work, from its HELLO to its FIN.
pub(super) struct Work {
    /// The file's name; a batch's "N files from NAME".
    pub(super) name: String,
    pub(super) started: Instant,
    pub(super) phases: Phases,
    /// The file's or batch's span, and its phase's.
    pub(super) span: Span,
    pub(super) phase: Span,
    pub(super) offered: Offered,
    pub(super) stage: Stage,
    /// The reader has this offer's job.
    pub(super) reading: bool,
    /// A batch read ahead of its MR: with this chunk length.
    pub(super) read_ahead: Option<u32>,
    /// The reader's digests (whole, each batch member's), once it is done.
    read: Option<(Digest, Vec<Digest>)>,
    /// Since when the loop waits on the reader without news.
    reader_wait: Option<Instant>,
    /// The read that answers the receiver's HAVE, under way.
    pub(super) have_read: Option<HaveRead>,
    times: DataPathTimes,
}

/// What became of a work after a step.
pub(super) enum Flow {
    Going,
    /// Finished (its FIN went out, or it was answered without data).
    Done,
    /// A refused batch: its files, to be offered one by one.
    Requeue(Vec<Entry>),
}

/// Where the data phase spent its time (logged at debug level for tuning).
#[derive(Default)]
struct DataPathTimes {
    wait_reader: Duration,
    wait_cq: Duration,
}

impl Work {
    pub(super) fn new(
        name: String,
        (span, phase): (Span, Span),
        offered: Offered,
        connect: Duration,
    ) -> Self {
        Work {
            name,
            started: Instant::now(),
            phases: Phases {
                connect,
                ..Phases::default()
            },
            span,
            phase,
            offered,
            stage: Stage::Offer { resume: None },
            reading: false,
            read_ahead: None,
            read: None,
            reader_wait: None,
            have_read: None,
            times: DataPathTimes::default(),
        }
    }

    /// The files this work stands for, with their sizes: what is reported
    /// when the session ends under it.
    pub(super) fn names(&self) -> Vec<(String, u64)> {
        match (&self.stage, &self.offered) {
            (Stage::Discarding { back }, _) => back
                .iter()
                .map(|e| (e.name().to_string(), e.size()))
                .collect(),
            (_, Offered::Batch { members, .. }) => members
                .iter()
                .map(|m| (m.offer.name.clone(), m.offer.size))
                .collect(),
            (_, Offered::File { size, .. }) => vec![(self.name.clone(), *size)],
        }
    }

    /// A single file or stream (whose refusal is its own failure).
    pub(super) fn is_file(&self) -> bool {
        matches!(self.offered, Offered::File { .. })
    }

    fn stream(&self) -> bool {
        matches!(self.offered, Offered::File { stream: true, .. })
    }

    /// The loop waits on the reader: its next chunk (or its end) is all
    /// this work needs to go on.
    pub(super) fn waits_on_reader(&self, pipe: &Pipeline<'_>) -> bool {
        let reading = self.reading && self.read.is_none() && pipe.held.is_empty();
        match self.stage {
            Stage::Data { .. } => reading && pipe.with_reader() > 0,
            Stage::Discarding { .. } => self.reading,
            Stage::Offer { .. } => false,
        }
    }

    /// Time the data phase waited on the link.
    pub(super) fn waited_on_link(&mut self, since: Instant) {
        if matches!(self.stage, Stage::Data { .. }) {
            self.times.wait_cq += since.elapsed();
        }
    }
}

impl Connection {
    /// The machine's answer to this work's offer: the ring (its data
    /// starts), a HAVE (answered from the file), the file's verdict without
    /// data (COMPARE found the same), or its refusal.
    pub(super) fn on_offer_event(
        &mut self,
        cfg: &SenderConfig,
        w: &mut Work,
        event: SenderEvent<PendingEntry>,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Flow, FileError> {
        match event {
            SenderEvent::Ring(ring) => {
                debug!(
                    addr = ring.addr,
                    slots = ring.slot_count,
                    slot_size = ring.slot_size,
                    "ring granted"
                );
                self.start_data(cfg, w, pipe)?;
                Ok(Flow::Going)
            }
            SenderEvent::Have(have) => {
                self.on_have(cfg, w, have)?;
                Ok(Flow::Going)
            }
            SenderEvent::Same { ack, copy, sha256 } => {
                let outcome = if copy == SameCopy::LinkDest {
                    info!(file = %escaped(&w.name), "linked: the receiver had it under --link-dest");
                    Outcome::Linked
                } else {
                    info!(file = %escaped(&w.name), "unchanged: the receiver's copy is the same");
                    Outcome::Unchanged
                };
                self.answered(cfg, w, outcome, Some(Digest::Sha256(sha256)), ack, tracker)?;
                Ok(Flow::Done)
            }
            // The receiver's file stays: nothing is read or sent.
            SenderEvent::Settled(ack) => {
                // A piece verified before whose file is whole: stored.
                let outcome = match ack.status {
                    crate::proto::AckStatus::Ok => Outcome::Stored,
                    status => Outcome::of_no_data(status).unwrap_or(Outcome::Unchanged),
                };
                info!(file = %escaped(&w.name), "{}: nothing sent", ack.status.as_str());
                self.answered(cfg, w, outcome, None, ack, tracker)?;
                Ok(Flow::Done)
            }
            // This entry is refused; the session goes on (a refusal of
            // the whole session comes in the greeting, and REJECT(version)
            // ends it).
            SenderEvent::Rejected(rej) => {
                let back = match &mut w.offered {
                    Offered::File { .. } => {
                        // A verdict: a chain's RESULTs came before it.
                        tracker.chain.verdict();
                        return Err(FileError::Continue(XferError::Rejected {
                            code: Some(rej.code),
                            reason: rej.reason,
                        }));
                    }
                    Offered::Batch { members, .. } => std::mem::take(members),
                };
                debug!(
                    code = rej.code.as_str(),
                    "batch refused, its files go one by one: {}",
                    escaped(&rej.reason)
                );
                let back = back.into_iter().map(Member::into_entry).collect();
                if w.reading && w.read.is_none() {
                    // Its read-ahead goes back to the reader first.
                    for (token, ..) in pipe.held.drain(..) {
                        let _ = pipe.free.send(token);
                    }
                    w.stage = Stage::Discarding { back };
                    return Ok(Flow::Going);
                }
                for (token, ..) in pipe.held.drain(..) {
                    let _ = pipe.free.send(token);
                }
                Ok(Flow::Requeue(back))
            }
            other => Err(unexpected(&other)),
        }
    }

    /// A file the receiver has (COMPARE): its verdict came already.
    fn answered(
        &mut self,
        cfg: &SenderConfig,
        w: &mut Work,
        outcome: Outcome,
        digest: Option<Digest>,
        ack: Ack,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        let size = w.names().first().map_or(0, |(_, size)| *size);
        let mut progress = cfg.progress.file_started(&w.name, size);
        w.phases.mr_exchange = w.started.elapsed();
        progress.advance(size);
        let report = FileReport {
            name: w.name.clone(),
            bytes: size,
            elapsed: w.started.elapsed(),
            digest,
            phases: w.phases,
            resumed_from: 0,
            outcome,
            host: None,
        };
        tracker.answer(awaiting_ack(vec![report], progress), Verdict::Ack(ack))
    }

    /// The MR came: the reader gets the job (unless it read ahead), the
    /// progress starts.
    fn start_data(
        &mut self,
        cfg: &SenderConfig,
        w: &mut Work,
        pipe: &mut Pipeline<'_>,
    ) -> Result<(), FileError> {
        let resume = match &mut w.stage {
            Stage::Offer { resume } => resume.take(),
            _ => None,
        };
        let resumed_from = resume.as_ref().map_or(0, |(offset, _)| *offset);
        let (input, mut progress) = match &mut w.offered {
            Offered::File { input, size, .. } => {
                (input.take(), cfg.progress.file_started(&w.name, *size))
            }
            Offered::Batch { members, size } => {
                let n = members.len() as u64;
                let progress = cfg.progress.batch_started(&w.name, *size, n);
                let input = if w.reading {
                    None
                } else {
                    Some(input(members)?)
                };
                (input, progress)
            }
        };
        if let Some(input) = input {
            pipe.read(ReadJob {
                input,
                name: w.name.clone(),
                chunk_len: self.session.chunk_len(),
                digest: cfg.verify,
                resume,
                auth: self.session.chunk_auth(),
            })?;
            w.reading = true;
        } else if w.read_ahead != Some(self.session.chunk_len()) {
            return Err(FileError::Fatal(XferError::Protocol {
                context: Some("the receiver's MR for a batch".into()),
                source: crate::proto::ProtocolError::BadRing {
                    reason: "its slots changed within the session",
                },
            }));
        }
        w.phases.mr_exchange = w.started.elapsed();
        progress.advance(resumed_from);
        w.phase = error_span!(parent: &w.span, "phase", name = "data");
        w.stage = Stage::Data {
            progress,
            started: Instant::now(),
            resumed_from,
        };
        Ok(())
    }

    /// The reader's news for `w`, then every held chunk a credit allows
    /// written, then (all written, the digest known) its FIN.
    pub(super) fn advance(
        &mut self,
        w: &mut Work,
        pipe: &mut Pipeline<'_>,
    ) -> Result<Flow, FileError> {
        while let Some(msg) = pipe.next_msg()? {
            w.reader_wait = None;
            match (msg, &mut w.stage) {
                (ReaderMsg::Chunk { token, .. }, Stage::Discarding { .. }) => {
                    let _ = pipe.free.send(token);
                }
                (ReaderMsg::Done(..) | ReaderMsg::Failed(..), Stage::Discarding { back }) => {
                    return Ok(Flow::Requeue(std::mem::take(back)));
                }
                (ReaderMsg::Chunk { token, len, crc }, _) => pipe.held.push_back((token, len, crc)),
                (ReaderMsg::Done(digest, each), _) => w.read = Some((digest, each)),
                (ReaderMsg::Failed(context, e), _) => {
                    return Err(FileError::Fatal(XferError::io(context, e)));
                }
            }
        }
        let Stage::Data { progress, .. } = &mut w.stage else {
            return Ok(Flow::Going);
        };
        while self.session.credits() > 0
            && let Some((token, len, crc)) = pipe.held.pop_front()
        {
            let now = Instant::now();
            if let Some(at) = self.pacer.as_mut().and_then(|p| p.ready_at(len, now)) {
                pipe.held.push_front((token, len, crc));
                self.paced_until = Some(at);
                break;
            }
            self.post_chunk(pipe, token, len, crc)?;
            if let Some(p) = self.pacer.as_mut() {
                p.spend(len);
            }
            progress.advance(len.into());
        }
        if !pipe.held.is_empty() {
            return Ok(Flow::Going);
        }
        match w.read.take() {
            Some(digests) => {
                self.send_fin(w, digests)?;
                Ok(Flow::Done)
            }
            None => Ok(Flow::Going),
        }
    }

    /// Writes a filled slot to the ring slot the state machine assigns.
    fn post_chunk(
        &mut self,
        pipe: &mut Pipeline<'_>,
        token: Buffer,
        len: u32,
        crc: u32,
    ) -> Result<(), FileError> {
        // The machine checks the reader's chunk against the file (or
        // stream) and says where it goes (a credit is there: Some).
        let Some(plan) = self.session.next_chunk(len).map_err(proto_err)? else {
            pipe.held.push_front((token, len, crc));
            return Ok(());
        };
        self.link
            .post_write(pipe.pool, token, ChunkWrite::of(&plan, crc))?;
        pipe.posted += 1;
        Ok(())
    }

    /// FIN (RC ordering: it arrives after every WRITE posted before it).
    /// The ACK comes only after verify + fsync + rename; the next entry
    /// goes out meanwhile, and the verdict is logged in the entry's
    /// "fsync+verify" phase span when it comes.
    fn send_fin(
        &mut self,
        w: &mut Work,
        (digest, each): (Digest, Vec<Digest>),
    ) -> Result<(), FileError> {
        let Stage::Data {
            progress,
            started,
            resumed_from,
        } = std::mem::replace(&mut w.stage, Stage::Offer { resume: None })
        else {
            return Ok(());
        };
        w.phases.data = started.elapsed();
        debug!(
            file = %escaped(&w.name),
            bytes = self.session.bytes_planned(),
            wait_reader_s = w.times.wait_reader.as_secs_f64(),
            wait_cq_s = w.times.wait_cq.as_secs_f64(),
            "all chunks written"
        );
        let bytes = self.session.bytes_planned();
        let reports = match &w.offered {
            Offered::File { .. } => vec![FileReport {
                name: w.name.clone(),
                bytes,
                elapsed: w.started.elapsed(),
                digest: Some(digest),
                phases: w.phases,
                resumed_from,
                outcome: Outcome::Stored,
                host: None,
            }],
            // Each file's share of the batch's time (see `Phases::share`).
            Offered::Batch { members, .. } => {
                let n = u32::try_from(members.len()).unwrap_or(u32::MAX);
                members
                    .iter()
                    .zip(each)
                    .map(|(m, digest)| FileReport {
                        name: m.offer.name.clone(),
                        bytes: m.offer.size,
                        elapsed: w.started.elapsed() / n.max(1),
                        digest: Some(digest),
                        phases: w.phases.share(n),
                        resumed_from: 0,
                        outcome: Outcome::Stored,
                        host: None,
                    })
                    .collect()
            }
        };
        #[cfg(feature = "fault-injection")]
        let digest = crate::engine::fault::fin_digest(digest);
        self.session
            .finish_carrying(digest, awaiting_ack(reports, progress))
            .map_err(proto_err)?;
        // A lane awaiting this answer may be silent for long: the
        // receiver may be committing the file (`lanes::FIN_SILENCE`).
        if let Some(watch) = &self.watch {
            watch.fin_sent();
        }
        self.transmit()?;
        debug!(file = %escaped(&w.name), bytes, "FIN sent");
        Ok(())
    }

    /// Waits for the reader's next message, listening to the receiver
    /// meanwhile. A stream may wait for its input indefinitely, keeping the
    /// receiver informed (the machine's keepalive); a file read that makes
    /// no progress for the timeout fails.
    pub(super) fn wait_reader(
        &mut self,
        cfg: &SenderConfig,
        w: &mut Work,
        pipe: &mut Pipeline<'_>,
    ) -> Result<(), FileError> {
        let now = Instant::now();
        let since = *w.reader_wait.get_or_insert(now);
        self.session.waiting(Waiting::Input, now);
        // A lane waiting on its own reader is not silent for its path.
        if let Some(watch) = &self.watch {
            watch.heard(now);
        }
        let slice = self.session.poll_timeout().map_or(READER_SLICE, |due| {
            due.saturating_duration_since(now).min(READER_SLICE)
        });
        match pipe.filled.recv_timeout(slice) {
            Ok(msg) => {
                pipe.arrived = Some(msg);
                w.times.wait_reader += now.elapsed();
                return Ok(());
            }
            Err(RecvTimeoutError::Disconnected) => return Err(reader_gone()),
            Err(RecvTimeoutError::Timeout) => w.times.wait_reader += now.elapsed(),
        }
        // A stream's keepalive, when due (none for a file).
        self.session
            .handle_timeout(Instant::now())
            .map_err(proto_err)?;
        if self.transmit()? > 0 {
            debug!("waiting for input: KEEPALIVE sent");
        }
        // A stream may wait for its input; files (a refused batch's too)
        // are read or fail.
        if !w.stream() && since.elapsed() >= cfg.timeout {
            let what = format!(
                "reading {} made no progress for {}s",
                escaped(&w.name),
                cfg.timeout.as_secs_f64()
            );
            return Err(FileError::Fatal(stalled(what, "reader")));
        }
        Ok(())
    }
}
