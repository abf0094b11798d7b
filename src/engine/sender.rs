//! Sender: connects, then for each file HELLO -> MR -> WRITE_WITH_IMM chunks
//! (at most `depth` in flight and never more than the granted credits) ->
//! FIN -> ACK; finally BYE.

use super::control::Control;
use super::progress::{FileProgress, ProgressSink};
use super::reader::{self, ReadJob, ReaderMsg};
use super::report::{FileEvent, FileFailure, FileReport, Phases};
use super::{DEFAULT_TIMEOUT, wr};
use crate::error::XferError;
use crate::proto::{
    AckStatus, DigestAlg, FileOffer, ProtocolError, RejectCode, SenderEvent, SenderSession,
    SenderState, Token,
};
use crate::verbs::{
    CmId, Endpoint, EventChannel, QpCaps, SlotPool, SlotToken, VerbsError, WcOpcode,
    WorkCompletion, probe_devices,
};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::mpsc::{self, Receiver, Sender};
use std::time::{Duration, Instant};
use tracing::{debug, error_span, info, warn};

#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub addr: SocketAddr,
    /// Local address to connect from (selects the RDMA device / port).
    pub source: Option<IpAddr>,
    pub chunk_size: u32,
    pub depth: u32,
    pub verify: DigestAlg,
    pub busy_poll: bool,
    pub timeout: Duration,
    /// Shared secret proving this sender to a receiver that requires one.
    pub token: Option<Token>,
    /// Told about each file's progress (the tool draws bars with it).
    pub progress: ProgressSink,
}

impl SenderConfig {
    pub fn new(addr: SocketAddr) -> Self {
        SenderConfig {
            addr,
            source: None,
            chunk_size: super::DEFAULT_CHUNK_SIZE,
            depth: super::DEFAULT_DEPTH,
            verify: DigestAlg::Crc32,
            busy_poll: false,
            timeout: DEFAULT_TIMEOUT,
            token: None,
            progress: ProgressSink::default(),
        }
    }
}

/// A local file opened and checked before connecting.
struct Source {
    file: File,
    name: String,
    size: u64,
    mode: u32,
}

/// Outcome of a whole session: reports of acknowledged files and the first
/// per-file failure (later files are still attempted after a rejection).
pub struct SessionOutcome {
    pub files: Vec<FileReport>,
    pub first_error: Option<XferError>,
}

/// Receive buffers the sender keeps posted (MR, CREDIT, ACK, REJECT).
const RECV_BUFFERS: usize = 64;
const SEND_BUFFERS: usize = 8;

/// Opens every file up front so that a typo fails before any connection.
fn open_sources(paths: &[PathBuf]) -> Result<Vec<Source>, XferError> {
    let mut out = Vec::with_capacity(paths.len());
    for path in paths {
        let file = File::open(path)
            .map_err(|e| XferError::io(format!("cannot open {}", path.display()), e))?;
        let meta = file
            .metadata()
            .map_err(|e| XferError::io(format!("cannot stat {}", path.display()), e))?;
        if !meta.is_file() {
            return Err(XferError::Usage(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                XferError::Usage(format!("{} has no valid UTF-8 file name", path.display()))
            })?
            .to_string();
        out.push(Source {
            file,
            name,
            size: meta.len(),
            mode: meta.permissions().mode() & 0o7777,
        });
    }
    Ok(out)
}

/// Sends `paths` in one session. `on_file` is called for every file that
/// was offered: after its ACK(ok), or when it failed (refused, failed its
/// check, or cut short by an error that ends the session).
pub fn send_files(
    cfg: &SenderConfig,
    paths: &[PathBuf],
    mut on_file: impl FnMut(FileEvent<'_>),
) -> Result<SessionOutcome, XferError> {
    let sources = open_sources(paths)?;
    cfg.progress
        .planned(sources.len() as u64, sources.iter().map(|s| s.size).sum());
    probe_devices()?;
    let span = error_span!("session", peer = %cfg.addr);
    let _enter = span.enter();
    let mut conn = Connection::open(cfg)?;
    let (pool, tokens) = SlotPool::new(conn.ep.pd(), cfg.chunk_size as usize, cfg.depth as usize)?;
    std::thread::scope(|scope| {
        let (job_tx, job_rx) = mpsc::channel();
        let (free_tx, free_rx) = mpsc::channel();
        let (out_tx, out_rx) = mpsc::channel();
        for token in tokens {
            let _ = free_tx.send(token);
        }
        let filler = pool.filler();
        scope.spawn(move || reader::run(filler, job_rx, free_rx, out_tx));
        let mut pipe = Pipeline {
            pool: &pool,
            jobs: job_tx,
            free: free_tx,
            filled: out_rx,
            in_flight: (0..cfg.depth).map(|_| None).collect(),
            held: None,
        };
        let mut outcome = SessionOutcome {
            files: Vec::new(),
            first_error: None,
        };
        if let Err(e) = conn.greet(cfg, &mut pipe) {
            conn.abort();
            return Err(e);
        }
        let connect_time = conn.connect_time;
        for source in &sources {
            let started = Instant::now();
            let failed = |e: &XferError, session_ended| {
                FileFailure::new(
                    &source.name,
                    source.size,
                    cfg.verify,
                    started.elapsed(),
                    connect_time,
                    e,
                    session_ended,
                )
            };
            match conn.send_file(cfg, source, &mut pipe) {
                Ok(report) => {
                    on_file(FileEvent::Done(&report));
                    outcome.files.push(report);
                }
                Err(FileError::Continue(e)) => {
                    warn!(file = %source.name, "{e}");
                    on_file(FileEvent::Failed(&failed(&e, false)));
                    outcome.first_error.get_or_insert(e);
                }
                Err(FileError::Fatal(e)) => {
                    // Where the file stood, for whoever reads the logs.
                    info!(
                        file = %source.name,
                        bytes_done = conn.session.bytes_planned(),
                        "file abandoned: {e}"
                    );
                    on_file(FileEvent::Failed(&failed(&e, true)));
                    conn.abort();
                    return Err(e);
                }
            }
        }
        if let Err(e) = conn.close(cfg, &mut pipe) {
            // A receiver may end the session after a failed file (a chunk
            // that fails its CRC does), so BYE can find it gone: the first
            // failure is then what the session ended with.
            match &outcome.first_error {
                Some(first) => debug!("closing the session after \"{first}\": {e}"),
                None => return Err(e),
            }
        }
        // Dropping `pipe` closes the channels, which ends the reader thread.
        Ok(outcome)
    })
}

/// The sender's side of the reader thread: channels plus the slots that are
/// posted (held until their write completes).
struct Pipeline<'a> {
    pool: &'a SlotPool,
    jobs: Sender<ReadJob<'a>>,
    free: Sender<SlotToken>,
    filled: Receiver<ReaderMsg>,
    in_flight: Vec<Option<SlotToken>>,
    /// A filled chunk waiting for a credit.
    held: Option<(SlotToken, u64, u32, u32)>,
}

impl Pipeline<'_> {
    /// Slots the reader holds or has filled but not yet handed over: when
    /// nonzero, a message from the reader is on its way.
    fn with_reader(&self) -> usize {
        let posted = self.in_flight.iter().filter(|t| t.is_some()).count();
        self.in_flight.len() - posted - usize::from(self.held.is_some())
    }

    /// A write completed: its slot goes back to the reader.
    fn write_done(&mut self, index: usize) -> Result<(), XferError> {
        let token = self
            .in_flight
            .get_mut(index)
            .and_then(Option::take)
            .ok_or_else(|| {
                XferError::Protocol(format!("completion for idle staging slot {index}"))
            })?;
        // The reader may already be gone (session ending): nothing to do then.
        let _ = self.free.send(token);
        Ok(())
    }

    fn next_from_reader(&mut self, timeout: Duration) -> Result<ReaderMsg, XferError> {
        self.filled.recv_timeout(timeout).map_err(|_| {
            XferError::io(
                "reading the input",
                std::io::Error::new(std::io::ErrorKind::TimedOut, "the reader thread stalled"),
            )
        })
    }
}

/// A per-file failure either leaves the session usable or ends it.
enum FileError {
    Continue(XferError),
    Fatal(XferError),
}

impl From<XferError> for FileError {
    fn from(e: XferError) -> Self {
        FileError::Fatal(e)
    }
}

impl From<VerbsError> for FileError {
    fn from(e: VerbsError) -> Self {
        FileError::Fatal(super::peer_lost_or(e))
    }
}

struct Connection {
    connect_time: Duration,
    ep: Endpoint,
    control: Control,
    session: SenderSession,
    wcs: Vec<WorkCompletion>,
}

impl Connection {
    fn open(cfg: &SenderConfig) -> Result<Self, XferError> {
        let connect_err = |source: VerbsError| match source {
            VerbsError::NoDevice => XferError::Verbs(VerbsError::NoDevice),
            VerbsError::Memlock { .. } => XferError::Verbs(source),
            source => XferError::Connect {
                addr: cfg.addr.to_string(),
                source,
            },
        };
        let connect_started = Instant::now();
        let channel = EventChannel::new().map_err(connect_err)?;
        let id = CmId::new(&channel).map_err(connect_err)?;
        id.resolve(cfg.source, cfg.addr, cfg.timeout)
            .map_err(connect_err)?;
        let caps = QpCaps {
            max_send_wr: cfg.depth + SEND_BUFFERS as u32,
            max_recv_wr: RECV_BUFFERS as u32,
        };
        let ep = Endpoint::new(id, caps, cfg.busy_poll).map_err(connect_err)?;
        let control = Control::new(&ep, RECV_BUFFERS, SEND_BUFFERS)?;
        super::tune_ack_timeout(ep.cm_id());
        ep.cm_id().connect(cfg.timeout).map_err(connect_err)?;
        let connect_time = connect_started.elapsed();
        info!(peer = %cfg.addr, connect_s = connect_time.as_secs_f64(), "connected");
        Ok(Connection {
            connect_time,
            ep,
            control,
            session: SenderSession::new(cfg.chunk_size, cfg.token.clone()),
            wcs: Vec::with_capacity(64),
        })
    }

    /// Waits for the receiver's greeting: CHALLENGE (answered with AUTH when
    /// it requires authentication; the first HELLO follows without waiting)
    /// or a REJECT that refuses the session.
    fn greet(&mut self, cfg: &SenderConfig, pipe: &mut Pipeline<'_>) -> Result<(), XferError> {
        while self.session.state() == SenderState::AwaitChallenge {
            let event = match self.next_event(cfg, pipe, "the receiver's greeting") {
                Ok(event) => event,
                Err(FileError::Fatal(e) | FileError::Continue(e)) => return Err(e),
            };
            match event {
                None => {}
                Some(SenderEvent::Greeted(greeting)) => {
                    if greeting.token_unused {
                        warn!(
                            "the receiver does not require authentication: the token is not used \
                             (anyone who can reach that receiver may send to it)"
                        );
                    }
                    if let Some(auth) = greeting.auth {
                        debug!("the receiver requires authentication: AUTH sent");
                        self.control.send(&self.ep, &auth)?;
                    }
                }
                Some(other) => {
                    return Err(XferError::Protocol(format!(
                        "unexpected event {other:?} before the receiver's greeting"
                    )));
                }
            }
        }
        Ok(())
    }

    fn send_file<'a>(
        &mut self,
        cfg: &SenderConfig,
        src: &'a Source,
        pipe: &mut Pipeline<'a>,
    ) -> Result<FileReport, FileError> {
        let span = error_span!("file", name = %src.name, size = src.size);
        let _enter = span.enter();
        let mut phase = error_span!("phase", name = "mr exchange").entered();
        let started = Instant::now();
        let mut phases = Phases {
            connect: self.connect_time,
            ..Phases::default()
        };
        let offer = FileOffer {
            name: src.name.clone(),
            size: src.size,
            mode: src.mode,
            digest: cfg.verify,
        };
        let hello = self.session.start_file(offer).map_err(proto_err)?;
        self.control.send(&self.ep, &hello)?;
        let mut progress: Box<dyn FileProgress> = cfg.progress.file_started(&src.name, src.size);
        // Phase 1: wait for the ring (or a rejection).
        while self.session.state() == SenderState::AwaitRing {
            if let Some(event) = self.next_event(cfg, pipe, "the receiver's MR reply")? {
                match event {
                    SenderEvent::Ring(ring) => {
                        debug!(
                            addr = ring.addr,
                            slots = ring.slot_count,
                            slot_size = ring.slot_size,
                            "ring granted"
                        );
                    }
                    SenderEvent::Rejected(rej) => {
                        let err = XferError::Rejected {
                            code: rej.code.as_str(),
                            reason: rej.reason,
                        };
                        // "Busy" refuses the whole session (the receiver
                        // disconnects); other refusals concern this file.
                        return Err(if rej.code == RejectCode::Busy {
                            FileError::Fatal(err)
                        } else {
                            FileError::Continue(err)
                        });
                    }
                    SenderEvent::Acked(ack) => {
                        return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                    }
                    other => return Err(unexpected(&other)),
                }
            }
        }
        phases.mr_exchange = started.elapsed();
        phase.exit();
        phase = error_span!("phase", name = "data").entered();
        let data_started = Instant::now();
        // Phase 2: the reader fills slots; each filled slot is written to
        // the next ring slot as soon as a credit allows.
        let job = ReadJob {
            file: &src.file,
            name: &src.name,
            size: src.size,
            chunk_len: self.session.chunk_len(),
            digest: cfg.verify,
        };
        pipe.jobs
            .send(job)
            .map_err(|_| XferError::Protocol("the reader thread is gone".into()))?;
        let mut time = DataPathTimes::default();
        while !self.session.all_chunks_planned() {
            if self.session.credits() > 0 && pipe.held.is_none() && pipe.with_reader() > 0 {
                // The reader is working: wait for its next chunk.
                let t0 = Instant::now();
                let msg = pipe.next_from_reader(cfg.timeout)?;
                time.wait_reader += t0.elapsed();
                match msg {
                    ReaderMsg::Chunk {
                        token,
                        seq,
                        len,
                        crc,
                    } => pipe.held = Some((token, seq, len, crc)),
                    ReaderMsg::Done(_) => {
                        return Err(FileError::Fatal(XferError::Protocol(
                            "the reader finished before all chunks were sent".into(),
                        )));
                    }
                    ReaderMsg::Failed(context, e) => {
                        return Err(FileError::Fatal(XferError::io(context, e)));
                    }
                }
            }
            if self.session.credits() > 0
                && let Some((token, seq, len, crc)) = pipe.held.take()
            {
                self.post_chunk(pipe, token, seq, len, crc)?;
                progress.advance(len.into());
                // Hand finished slots back early so the reader keeps going.
                self.poll_events(pipe)?;
                continue;
            }
            // Out of credits, or every slot is in flight: wait for the CQ.
            let t0 = Instant::now();
            let event = self.next_event(cfg, pipe, "credit from the receiver")?;
            time.wait_cq += t0.elapsed();
            match event {
                None | Some(SenderEvent::Credit(_)) => {}
                Some(SenderEvent::Acked(ack)) => {
                    return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                }
                Some(other) => return Err(unexpected(&other)),
            }
        }
        let digest = match pipe.next_from_reader(cfg.timeout)? {
            ReaderMsg::Done(digest) => digest,
            ReaderMsg::Failed(context, e) => {
                return Err(FileError::Fatal(XferError::io(context, e)));
            }
            ReaderMsg::Chunk { .. } => {
                return Err(FileError::Fatal(XferError::Protocol(
                    "the reader produced more chunks than the file has".into(),
                )));
            }
        };
        // RC ordering: FIN arrives after every WRITE posted before it.
        let fin = self.session.finish(digest).map_err(proto_err)?;
        self.control.send(&self.ep, &fin)?;
        phases.data = data_started.elapsed();
        phase.exit();
        let _phase = error_span!("phase", name = "fsync+verify").entered();
        let fin_sent = Instant::now();
        debug!(
            file = %src.name,
            wait_reader_s = time.wait_reader.as_secs_f64(),
            wait_cq_s = time.wait_cq.as_secs_f64(),
            "FIN sent"
        );
        // Phase 3: the ACK comes only after verify + fsync + rename.
        loop {
            if let Some(event) = self.next_event(cfg, pipe, "the receiver's ACK")? {
                match event {
                    SenderEvent::Credit(_) => {}
                    SenderEvent::Acked(ack) if ack.status == AckStatus::Ok => break,
                    SenderEvent::Acked(ack) => {
                        let err = ack_error(ack.status, ack.reason);
                        // A failed verify leaves the session usable.
                        return Err(if self.session.state() == SenderState::Idle {
                            FileError::Continue(err)
                        } else {
                            FileError::Fatal(err)
                        });
                    }
                    other => return Err(unexpected(&other)),
                }
            }
        }
        phases.commit = fin_sent.elapsed();
        progress.finished();
        phases.log(&src.name, src.size);
        Ok(FileReport {
            name: src.name.clone(),
            bytes: src.size,
            elapsed: started.elapsed(),
            digest,
            phases,
        })
    }

    /// Writes a filled slot to the ring slot the state machine assigns.
    fn post_chunk(
        &mut self,
        pipe: &mut Pipeline<'_>,
        token: SlotToken,
        seq: u64,
        len: u32,
        crc: u32,
    ) -> Result<(), FileError> {
        let plan = self
            .session
            .next_chunk()
            .ok_or_else(|| XferError::Protocol("no chunk to plan despite credit".into()))?;
        if plan.seq != seq || plan.len != len {
            return Err(FileError::Fatal(XferError::Protocol(format!(
                "reader chunk {seq} ({len} bytes) does not match plan {} ({} bytes)",
                plan.seq, plan.len
            ))));
        }
        let index = token.index();
        self.ep.post_write_imm(
            pipe.pool.mr(),
            pipe.pool.offset(&token),
            len as usize,
            plan.remote_addr,
            plan.rkey,
            crc,
            wr::WRITE | index as u64,
            true,
        )?;
        if let Some(slot) = pipe.in_flight.get_mut(index) {
            *slot = Some(token);
        }
        Ok(())
    }

    /// Handles whatever completions are ready, without blocking.
    fn poll_events(&mut self, pipe: &mut Pipeline<'_>) -> Result<(), FileError> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let polled = self.ep.cq().poll(&mut wcs, 16);
        if let Err(e) = polled {
            return Err(FileError::Fatal(super::completion_error(&self.ep, e)));
        }
        let event = self.handle_completions(&wcs, pipe);
        self.wcs = wcs;
        match event? {
            None | Some(SenderEvent::Credit(_)) => Ok(()),
            Some(SenderEvent::Acked(ack)) => {
                Err(FileError::Fatal(ack_error(ack.status, ack.reason)))
            }
            Some(other) => Err(unexpected(&other)),
        }
    }

    /// Waits for completions and handles them all; returns the state machine
    /// event that matters for control flow (request/response keeps it to
    /// one such event per batch besides credits).
    fn next_event(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        what: &str,
    ) -> Result<Option<SenderEvent>, FileError> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        super::wait_completions(&self.ep, &mut wcs, cfg.timeout, what)?;
        let event = self.handle_completions(&wcs, pipe);
        self.wcs = wcs;
        event
    }

    fn handle_completions(
        &mut self,
        wcs: &[WorkCompletion],
        pipe: &mut Pipeline<'_>,
    ) -> Result<Option<SenderEvent>, FileError> {
        let mut event = None;
        for wc in wcs {
            match (wr::kind(wc.wr_id), wc.opcode) {
                (wr::WRITE, WcOpcode::RdmaWrite) => pipe.write_done(wr::index(wc.wr_id))?,
                (wr::SEND, WcOpcode::Send) => self.control.on_send_done(&self.ep, wc)?,
                (wr::RECV, WcOpcode::Recv) => {
                    let msg = self.control.decode(wc).map_err(|e| {
                        XferError::Protocol(format!("malformed message from the receiver: {e}"))
                    })?;
                    self.control.repost(&self.ep, wr::index(wc.wr_id))?;
                    let ev = self.session.on_message(msg).map_err(proto_err)?;
                    // Credits are already applied by the state machine; keep
                    // the event that changes control flow.
                    if !matches!(ev, SenderEvent::Credit(_)) || event.is_none() {
                        event = Some(ev);
                    }
                }
                (kind, opcode) => {
                    return Err(FileError::Fatal(XferError::Protocol(format!(
                        "unexpected completion {opcode:?} for work request kind {kind:#x}"
                    ))));
                }
            }
        }
        Ok(event)
    }

    /// Ends the session politely: BYE, wait until it is delivered, disconnect.
    fn close(&mut self, cfg: &SenderConfig, pipe: &mut Pipeline<'_>) -> Result<(), XferError> {
        let bye = self
            .session
            .close()
            .map_err(|e| XferError::Protocol(e.to_string()))?;
        self.control.send(&self.ep, &bye)?;
        while self.control.busy() {
            match self.next_event(cfg, pipe, "delivery of BYE") {
                Ok(_) => {}
                // Every file was answered already; a receiver that closes on
                // BYE may tear the connection down before our send completes.
                Err(FileError::Fatal(XferError::PeerLost(e))) => {
                    debug!("the receiver closed while BYE was in flight: {e}");
                    return Ok(());
                }
                Err(FileError::Fatal(e) | FileError::Continue(e)) => return Err(e),
            }
        }
        self.ep.cm_id().disconnect(Duration::from_secs(2));
        Ok(())
    }

    fn abort(&mut self) {
        self.ep.cm_id().disconnect(Duration::from_secs(1));
    }
}

/// Where the data phase spent its time (logged at debug level for tuning).
#[derive(Default)]
struct DataPathTimes {
    wait_reader: Duration,
    wait_cq: Duration,
}

fn proto_err(e: ProtocolError) -> FileError {
    FileError::Fatal(match e {
        ProtocolError::AuthFailed { reason } => auth_error(&reason),
        ProtocolError::Refused { code, reason } => XferError::Rejected {
            code: code.as_str(),
            reason,
        },
        other => XferError::Protocol(other.to_string()),
    })
}

/// The receiver refused our AUTH (REJECT with code Auth and `reason`).
fn auth_error(reason: &str) -> XferError {
    let said = reason
        .strip_prefix("authentication failed: ")
        .unwrap_or(reason);
    XferError::Auth(format!(
        "authentication failed: the receiver says {said:?}; check that --token-file or \
         RDMA_XFER_TOKEN gives both hosts the same token"
    ))
}

fn unexpected(event: &SenderEvent) -> FileError {
    FileError::Fatal(XferError::Protocol(format!("unexpected event {event:?}")))
}

fn ack_error(status: AckStatus, reason: String) -> XferError {
    match status {
        AckStatus::Ok => XferError::Protocol("unexpected ACK(ok)".into()),
        AckStatus::Integrity => XferError::Integrity(format!("the receiver reports: {reason}")),
        AckStatus::Io => XferError::PeerIo(reason),
        AckStatus::Rejected => XferError::Rejected {
            code: "rejected",
            reason,
        },
        AckStatus::Protocol => XferError::Protocol(format!("the receiver reports: {reason}")),
    }
}
