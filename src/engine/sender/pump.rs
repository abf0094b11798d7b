//! The data pump: one file or stream from HELLO to FIN, in three phases
//! (the ring, the chunks, the FIN), with the reader thread filling staging
//! slots and RDMA WRITE WITH IMM posting them as credits allow.

use super::verdicts::{PendingEntry, Tracker};
use super::{Connection, FileError, SenderConfig, ack_error, proto_err, unexpected};
use crate::engine::progress::FileProgress;
use crate::engine::reader::{Input, ReadJob, ReaderMsg};
use crate::engine::report::{FileReport, Phases};
use crate::engine::wr;
use crate::error::XferError;
use crate::proto::{Digest, FileOffer, OfferKind, SenderEvent, SenderState};
use crate::sys::rdma::{Buffer, BufferPool, Completion, RemoteTarget};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};
use tracing::{debug, error_span};

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

    /// A write completed: its slot goes back to the reader.
    pub(super) fn write_done(&mut self, wc: Completion) -> Result<(), XferError> {
        let token = wc.buffer.ok_or_else(|| {
            XferError::Internal(format!("write completion {:#x} without its slot", wc.wr_id))
        })?;
        self.posted = self.posted.saturating_sub(1);
        // The reader may already be gone (session ending): nothing to do then.
        let _ = self.free.send(token);
        Ok(())
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
            error_span!("file", name = %name, size = "unknown")
        } else {
            error_span!("file", name = %name, size = offer.size)
        };
        let _enter = span.enter();
        let started = Instant::now();
        let mut phases = Phases {
            connect: self.connect_time,
            ..Phases::default()
        };
        let tag = tracker.tag();
        error_span!("phase", name = "mr exchange")
            .in_scope(|| self.await_ring(cfg, offer, tag, pipe, tracker))?;
        let mut progress = cfg.progress.file_started(&name, size);
        phases.mr_exchange = started.elapsed();
        let data_started = Instant::now();
        let digest = error_span!("phase", name = "data").in_scope(|| {
            self.pump_chunks(cfg, input, &name, stream, &mut *progress, pipe, tracker)
        })?;
        phases.data = data_started.elapsed();
        let report = FileReport {
            name,
            bytes: self.session.bytes_planned(),
            elapsed: started.elapsed(),
            digest,
            phases,
        };
        self.send_fin(tag, report, progress, tracker)
    }

    /// Phase 1: HELLO, then wait for the ring (or this entry's refusal);
    /// verdicts on earlier entries come first.
    fn await_ring(
        &mut self,
        cfg: &SenderConfig,
        offer: FileOffer,
        tag: u64,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        let hello = self.session.start_file(offer, tag).map_err(proto_err)?;
        self.control.send(&self.ep, &hello)?;
        while self.session.state() == SenderState::AwaitRing {
            let Some(event) = self.next_event(cfg, pipe, tracker, "the receiver's MR reply")?
            else {
                continue;
            };
            match event {
                SenderEvent::Ring(ring) => {
                    debug!(
                        addr = ring.addr,
                        slots = ring.slot_count,
                        slot_size = ring.slot_size,
                        "ring granted"
                    );
                }
                // This entry is refused; the session goes on (a refusal of
                // the whole session comes in the greeting).
                SenderEvent::Rejected(rej) => {
                    return Err(FileError::Continue(XferError::Rejected {
                        code: rej.code.as_str(),
                        reason: rej.reason,
                    }));
                }
                SenderEvent::Aborted(ack) => {
                    return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                }
                other => return Err(unexpected(&other)),
            }
        }
        Ok(())
    }

    /// Phase 2: the reader fills slots; each filled slot is written to the
    /// ring slot the state machine assigns as soon as a credit allows.
    /// Returns the whole-file digest the reader computed.
    #[allow(clippy::too_many_arguments)]
    fn pump_chunks(
        &mut self,
        cfg: &SenderConfig,
        input: Input,
        name: &str,
        stream: bool,
        progress: &mut dyn FileProgress,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Digest, FileError> {
        let job = ReadJob {
            input,
            name: name.to_string(),
            chunk_len: self.session.chunk_len(),
            digest: cfg.verify,
        };
        pipe.jobs
            .send(job)
            .map_err(|_| XferError::Internal("the reader thread is gone".into()))?;
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
                    ReaderMsg::Done(digest) => break digest,
                    ReaderMsg::Failed(context, e) => {
                        return Err(FileError::Fatal(XferError::io(context, e)));
                    }
                }
                continue;
            }
            // Out of credits, or every slot is in flight: wait for the CQ.
            let t0 = Instant::now();
            let event = self.next_event(cfg, pipe, tracker, "credit from the receiver")?;
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
            file = %name,
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
        tag: u64,
        report: FileReport,
        progress: Box<dyn FileProgress>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        let fin = self.session.finish(report.digest).map_err(proto_err)?;
        self.control.send(&self.ep, &fin)?;
        debug!(file = %report.name, bytes = report.bytes, "FIN sent");
        tracker.pending.insert(
            tag,
            PendingEntry::File {
                report,
                fin_sent: Instant::now(),
                span: error_span!("phase", name = "fsync+verify"),
                progress,
            },
        );
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
        let mut last_sign = Instant::now();
        loop {
            match pipe.filled.recv_timeout(READER_SLICE) {
                Ok(msg) => return Ok(msg),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(FileError::Fatal(XferError::Internal(
                        "the reader thread is gone".into(),
                    )));
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            self.poll_events(pipe, tracker)?;
            if stream {
                if last_sign.elapsed() >= crate::proto::keepalive_interval(cfg.timeout) {
                    debug!("waiting for input: KEEPALIVE sent");
                    let keepalive = self.session.keepalive().map_err(proto_err)?;
                    self.control.send(&self.ep, &keepalive)?;
                    last_sign = Instant::now();
                }
            } else if started.elapsed() >= cfg.timeout {
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
        let wr_id = wr::WRITE | token.index() as u64;
        let target = RemoteTarget {
            addr: plan.remote_addr,
            rkey: plan.rkey,
        };
        self.ep
            .post_write_imm(pipe.pool, token, len as usize, target, crc, wr_id)?;
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
