//! The data pump: one file or stream from HELLO to FIN, in three phases
//! (the ring, the chunks, the FIN), with the reader thread filling staging
//! slots and RDMA WRITE WITH IMM posting them as credits allow.

use super::verdicts::{PendingEntry, Tracker, awaiting_ack};
use super::{Connection, FileError, SenderConfig, ack_error, proto_err, unexpected};
use crate::engine::Outcome;
use crate::engine::digest::{FileHasher, PrefixRead, read_prefix};
use crate::engine::link::ChunkWrite;
use crate::engine::progress::FileProgress;
use crate::engine::reader::{Input, ReadJob, ReaderMsg};
use crate::engine::report::{FileReport, Phases};
use crate::error::XferError;
use crate::proto::{
    Ack, Digest, DigestAlg, FileOffer, Have, HaveKind, OfferKind, Pending, SameCopy, SenderEvent,
    SenderState, Verdict, Waiting, escaped,
};
use crate::sys::SysError;
use crate::sys::rdma::{Buffer, BufferPool};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};
use tracing::{debug, error_span, info, warn};

/// How a file's data starts once the receiver answered its HELLO.
enum Start {
    /// From the start, or after the prefix the receiver kept (its length
    /// and the whole-file digest over it).
    Data(Option<(u64, FileHasher)>),
    /// Answered without data (this SHA-256; the ACK is its verdict):
    /// `Skipped`, the receiver's copy is the file, or `Linked`, it asked
    /// for the digest (`--checksum`) and had the file under --link-dest.
    Answered(Outcome, Digest, Ack),
}

/// How the sender answers a HAVE.
enum Answer {
    /// FROM: data from this offset (0 or the kept prefix; for a prefix,
    /// the whole-file digest over it).
    From(u64, Option<(u64, FileHasher)>),
    /// COMPARE: the receiver has a complete copy, or asked for the file's
    /// digest; this is the file's SHA-256.
    Compare([u8; 32]),
}

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
    /// A filled chunk waiting for a credit.
    pub(super) held: Option<(Buffer, u32, u32)>,
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
            .saturating_sub(usize::from(self.held.is_some()))
    }

    /// Hands the reader its next job.
    pub(super) fn read(&self, job: ReadJob) -> Result<(), XferError> {
        self.jobs
            .send(job)
            .map_err(|_| XferError::Internal("the reader thread is gone".into()))
    }

    /// A write completed: its slot goes back to the reader.
    pub(super) fn write_done(&mut self, token: Buffer) {
        self.posted = self.posted.saturating_sub(1);
        // The reader may already be gone (session ending): nothing to do then.
        let _ = self.free.send(token);
    }
}

impl Connection {
    /// One file or stream: HELLO and the ring (`await_ring`), every chunk
    /// (`pump_chunks`), FIN (`send_fin`). Its verdict is collected later
    /// (see `Tracker::answer`).
    pub(super) fn send_data(
        &mut self,
        cfg: &SenderConfig,
        offer: FileOffer,
        input: Input,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        let stream = offer.kind == OfferKind::Stream;
        let name = offer.name.clone();
        // A stream's size is unknown (0 here: its bar grows as it goes).
        let size = offer.size;
        let span = if stream {
            error_span!("file", file = %escaped(&name), size = "unknown")
        } else {
            error_span!("file", file = %escaped(&name), size = offer.size)
        };
        let _enter = span.enter();
        let started = Instant::now();
        let mut phases = Phases {
            connect: self.connect_time,
            ..Phases::default()
        };
        let start = error_span!("phase", name = "mr exchange")
            .in_scope(|| self.await_ring(cfg, offer, started, &input, pipe, tracker))?;
        let mut progress = cfg.progress.file_started(&name, size);
        phases.mr_exchange = started.elapsed();
        let resume = match start {
            Start::Data(resume) => resume,
            Start::Answered(outcome, digest, ack) => {
                // Its verdict came already: the ACK of the COMPARE.
                progress.advance(size);
                let report = FileReport {
                    name,
                    bytes: size,
                    elapsed: started.elapsed(),
                    digest,
                    phases,
                    resumed_from: 0,
                    outcome,
                };
                let answered = awaiting_ack(vec![report], progress);
                return tracker.answer(answered, Pending::File, Verdict::Ack(ack));
            }
        };
        let resumed_from = resume.as_ref().map_or(0, |(offset, _)| *offset);
        progress.advance(resumed_from);
        let data_started = Instant::now();
        let (digest, _) = error_span!("phase", name = "data").in_scope(|| {
            self.pump_chunks(
                cfg,
                Some(input),
                &name,
                stream,
                resume,
                &mut *progress,
                pipe,
                tracker,
            )
        })?;
        phases.data = data_started.elapsed();
        let report = FileReport {
            name,
            bytes: self.session.bytes_planned(),
            elapsed: started.elapsed(),
            digest,
            phases,
            resumed_from,
            outcome: Outcome::Stored,
        };
        self.send_fin(report, progress)
    }

    /// Phase 1: HELLO, then wait for the ring (or this entry's refusal);
    /// verdicts on earlier entries come first. An offer with RESUME gets
    /// the receiver's HAVE first, which `input` is checked against; one
    /// with CHECKSUM may get a HAVE asking for its SHA-256.
    fn await_ring(
        &mut self,
        cfg: &SenderConfig,
        offer: FileOffer,
        started: Instant,
        input: &Input,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Start, FileError> {
        let name = offer.name.clone();
        let offered = PendingEntry::Offered {
            name: name.clone(),
            started,
        };
        self.session.start_file(offer, offered).map_err(proto_err)?;
        self.transmit()?;
        self.await_answer(cfg, &name, input, pipe, tracker)
    }

    /// The receiver's answers to the HELLO just sent, until its MR (or
    /// the file's verdict without data, or its refusal).
    fn await_answer(
        &mut self,
        cfg: &SenderConfig,
        name: &str,
        input: &Input,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Start, FileError> {
        let mut start = Start::Data(None);
        // Until the MR, or the file's verdict or refusal.
        while matches!(
            self.session.state(),
            SenderState::AwaitRing | SenderState::AwaitHave | SenderState::AwaitCompared
        ) {
            let Some(event) = self.next_event(pipe, tracker)? else {
                continue;
            };
            match event {
                SenderEvent::Have(have) => {
                    match self.answer(cfg, name, &have, input, pipe, tracker)? {
                        Answer::From(offset, resume) => {
                            self.session.start_from(offset).map_err(proto_err)?;
                            self.transmit()?;
                            start = Start::Data(resume);
                        }
                        Answer::Compare(sha256) => {
                            self.session.compare(sha256).map_err(proto_err)?;
                            self.transmit()?;
                        }
                    }
                }
                SenderEvent::Same { ack, copy, sha256 } => {
                    let digest = Digest::Sha256(sha256);
                    if copy == SameCopy::LinkDest {
                        info!(file = %escaped(name), "linked: the receiver had it under --link-dest");
                        return Ok(Start::Answered(Outcome::Linked, digest, ack));
                    }
                    info!(file = %escaped(name), "skipped: the receiver's copy is the same");
                    return Ok(Start::Answered(Outcome::Skipped, digest, ack));
                }
                SenderEvent::Keepalive => debug!("the receiver reads its copy"),
                SenderEvent::Ring(ring) => {
                    debug!(
                        addr = ring.addr,
                        slots = ring.slot_count,
                        slot_size = ring.slot_size,
                        "ring granted"
                    );
                }
                // This entry is refused; the session goes on (a refusal of
                // the whole session comes in the greeting, and REJECT(version)
                // ends it: see `older_receiver`).
                SenderEvent::Rejected(rej) => {
                    return Err(FileError::Continue(XferError::Rejected {
                        code: Some(rej.code),
                        reason: rej.reason,
                    }));
                }
                SenderEvent::Aborted(ack) => {
                    return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                }
                other => return Err(unexpected(&other)),
            }
        }
        Ok(start)
    }

    /// Checks the file against what the receiver holds of it (HAVE) and
    /// answers: for a complete copy, or a request for it (`--checksum`),
    /// the file's SHA-256 (the receiver compares), else where its data starts: the kept prefix when every
    /// chunk of it has the CRC the receiver recorded (with the whole-file
    /// digest over it), else 0, saying why.
    fn answer(
        &mut self,
        cfg: &SenderConfig,
        name: &str,
        have: &Have,
        input: &Input,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Answer, FileError> {
        // Streams are never offered with RESUME or CHECKSUM.
        let Input::File { file, size } = input else {
            return Ok(Answer::From(0, None));
        };
        match have.kind {
            HaveKind::Nothing if have.note.is_empty() => Ok(Answer::From(0, None)),
            HaveKind::Nothing => {
                warn!(file = %escaped(name), "starting from zero: {}", escaped(&have.note));
                Ok(Answer::From(0, None))
            }
            HaveKind::Prefix if have.chunk_len > cfg.chunk_size => {
                warn!(
                    file = %escaped(name),
                    "starting from zero: the receiver kept {} bytes in chunks of {}, larger than \
                     this sender's --chunk-size {}",
                    have.bytes, have.chunk_len, cfg.chunk_size
                );
                Ok(Answer::From(0, None))
            }
            HaveKind::Prefix => {
                let read = self.read_for_have(
                    name,
                    file,
                    (have.bytes, have.chunk_len, cfg.verify),
                    pipe,
                    tracker,
                )?;
                if Digest::Sha256(read.crc_digest) == have.digest {
                    info!(file = %escaped(name), bytes = have.bytes, "continuing after the part the receiver kept");
                    Ok(Answer::From(have.bytes, Some((have.bytes, read.hasher))))
                } else {
                    warn!(
                        file = %escaped(name),
                        "starting from zero: the source changed within the {} bytes the receiver kept",
                        have.bytes
                    );
                    Ok(Answer::From(0, None))
                }
            }
            // Read before any data, whatever the receiver then decides.
            HaveKind::Complete | HaveKind::Digest => {
                let read = self.read_for_have(
                    name,
                    file,
                    (*size, cfg.chunk_size, DigestAlg::Sha256),
                    pipe,
                    tracker,
                )?;
                let sha256 = read.hasher.finish_sha256().ok_or_else(|| {
                    FileError::Fatal(XferError::Internal("a SHA-256 read gave a CRC32".into()))
                })?;
                Ok(Answer::Compare(sha256))
            }
        }
    }

    /// Reads the file's first `upto` bytes in chunks of `chunk_len` with
    /// whole-file digest `alg` (see `read_prefix`), keeping the receiver
    /// informed meanwhile (KEEPALIVE) and listening to it.
    fn read_for_have(
        &mut self,
        name: &str,
        file: &std::fs::File,
        (upto, chunk_len, alg): (u64, u32, DigestAlg),
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<PrefixRead, FileError> {
        self.session.waiting(Waiting::Input, Instant::now());
        let mut failed = None;
        let read = read_prefix(file, upto, chunk_len, alg, |_, _, _| {
            if crate::sys::os::shutdown_requested() {
                failed = Some(FileError::Fatal(XferError::Sys(SysError::Interrupted)));
                return Err(std::io::Error::other("interrupted by signal"));
            }
            // The machine's keepalive, when due.
            let now = Instant::now();
            if self.session.poll_timeout().is_none_or(|due| now < due) {
                return Ok(());
            }
            let sent = self
                .session
                .handle_timeout(now)
                .map_err(proto_err)
                .and_then(|()| Ok(self.transmit()?))
                .and_then(|_| self.poll_events(pipe, tracker));
            match sent {
                Ok(()) => Ok(()),
                Err(e) => {
                    failed = Some(e);
                    Err(std::io::Error::other("the session failed"))
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        read.map_err(|e| {
            FileError::Fatal(XferError::io(
                format!("cannot read {name} to compare it with what the receiver holds"),
                e,
            ))
        })
    }

    /// Phase 2: the reader fills slots; each filled slot is written to the
    /// ring slot the state machine assigns as soon as a credit allows.
    /// Returns the whole-file digest the reader computed (and, for a
    /// batch, each file's).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn pump_chunks(
        &mut self,
        cfg: &SenderConfig,
        input: Option<Input>,
        name: &str,
        stream: bool,
        resume: Option<(u64, FileHasher)>,
        progress: &mut dyn FileProgress,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(Digest, Vec<Digest>), FileError> {
        // None: the reader has the job already (`Pipeline::read_ahead`).
        if let Some(input) = input {
            let job = ReadJob {
                input,
                name: name.to_string(),
                chunk_len: self.session.chunk_len(),
                digest: cfg.verify,
                resume,
                auth: self.session.chunk_auth(),
            };
            pipe.read(job)?;
        }
        let mut time = DataPathTimes::default();
        let digest = loop {
            if self.session.credits() > 0
                && let Some((token, len, crc)) = pipe.held.take()
            {
                self.post_chunk(pipe, token, len, crc)?;
                progress.advance(len.into());
                // Hand finished slots back early so the reader keeps going.
                self.poll_events(pipe, tracker)?;
                continue;
            }
            if pipe.held.is_none() && pipe.with_reader() > 0 {
                // The reader is working (or waiting for input): wait for
                // its next chunk.
                let t0 = Instant::now();
                let msg = self.wait_reader(cfg, pipe, tracker, stream)?;
                time.wait_reader += t0.elapsed();
                match msg {
                    ReaderMsg::Chunk { token, len, crc } => pipe.held = Some((token, len, crc)),
                    ReaderMsg::Done(digest, each) => break (digest, each),
                    ReaderMsg::Failed(context, e) => {
                        return Err(FileError::Fatal(XferError::io(context, e)));
                    }
                }
                continue;
            }
            // Out of credits, or every slot is in flight: wait for the CQ.
            let t0 = Instant::now();
            let event = self.next_event(pipe, tracker)?;
            time.wait_cq += t0.elapsed();
            match event {
                None => {}
                Some(SenderEvent::Aborted(ack)) => {
                    return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                }
                Some(other) => return Err(unexpected(&other)),
            }
        };
        debug!(
            file = %escaped(name),
            bytes = self.session.bytes_planned(),
            wait_reader_s = time.wait_reader.as_secs_f64(),
            wait_cq_s = time.wait_cq.as_secs_f64(),
            "all chunks written"
        );
        Ok(digest)
    }

    /// Phase 3: FIN (RC ordering: it arrives after every WRITE posted
    /// before it). The ACK comes only after verify + fsync + rename; the
    /// next entry goes out meanwhile, and the verdict is logged in the
    /// file's "fsync+verify" phase span when it comes.
    fn send_fin(
        &mut self,
        report: FileReport,
        progress: Box<dyn FileProgress>,
    ) -> Result<(), FileError> {
        #[cfg(feature = "fault-injection")]
        let digest = crate::engine::fault::fin_digest(report.digest);
        #[cfg(not(feature = "fault-injection"))]
        let digest = report.digest;
        let (name, bytes) = (report.name.clone(), report.bytes);
        self.session
            .finish_carrying(digest, awaiting_ack(vec![report], progress))
            .map_err(proto_err)?;
        self.transmit()?;
        debug!(file = %escaped(&name), bytes, "FIN sent");
        Ok(())
    }

    /// Waits for the reader's next message, listening to the receiver
    /// meanwhile (an abort ends the wait). A stream may wait for its input
    /// indefinitely, keeping the receiver informed; a file read that makes
    /// no progress for the timeout fails.
    fn wait_reader(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
        stream: bool,
    ) -> Result<ReaderMsg, FileError> {
        let started = Instant::now();
        self.session.waiting(Waiting::Input, started);
        loop {
            let slice = self.session.poll_timeout().map_or(READER_SLICE, |due| {
                due.saturating_duration_since(Instant::now())
                    .min(READER_SLICE)
            });
            match pipe.filled.recv_timeout(slice) {
                Ok(msg) => return Ok(msg),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(FileError::Fatal(XferError::Internal(
                        "the reader thread is gone".into(),
                    )));
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.poll_events(pipe, tracker)?;
            // A stream's keepalive, when due (none for a file).
            self.session
                .handle_timeout(Instant::now())
                .map_err(proto_err)?;
            if self.transmit()? > 0 {
                debug!("waiting for input: KEEPALIVE sent");
            }
            if !stream && started.elapsed() >= cfg.timeout {
                return Err(FileError::Fatal(XferError::io(
                    "reading the input",
                    std::io::Error::new(std::io::ErrorKind::TimedOut, "the reader thread stalled"),
                )));
            }
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
        // stream) and says where it goes.
        let plan = self
            .session
            .next_chunk(len)
            .map_err(proto_err)?
            .ok_or_else(|| XferError::Internal("no chunk to plan despite credit".into()))?;
        self.link
            .post_write(pipe.pool, token, ChunkWrite::of(&plan, crc))?;
        pipe.posted += 1;
        Ok(())
    }
}

/// Where the data phase spent its time (logged at debug level for tuning).
#[derive(Default)]
struct DataPathTimes {
    wait_reader: Duration,
    wait_cq: Duration,
}
