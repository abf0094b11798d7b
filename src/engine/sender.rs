//! Sender: connects, then for each file HELLO -> MR -> WRITE_WITH_IMM chunks
//! (at most `depth` in flight and never more than the granted credits) ->
//! FIN -> ACK; finally BYE.

use super::control::Control;
use super::digest::FileHasher;
use super::report::FileReport;
use super::{DEFAULT_TIMEOUT, wr};
use crate::error::XferError;
use crate::proto::{
    AckStatus, DigestAlg, FileOffer, Message, SenderEvent, SenderSession, SenderState,
};
use crate::verbs::{
    Access, CmId, Endpoint, EventChannel, MemoryRegion, QpCaps, VerbsError, WcOpcode,
    WorkCompletion, probe_devices,
};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

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

/// Sends `paths` in one session. `on_file` is called after each ACK(ok).
pub fn send_files(
    cfg: &SenderConfig,
    paths: &[PathBuf],
    mut on_file: impl FnMut(&FileReport),
) -> Result<SessionOutcome, XferError> {
    let sources = open_sources(paths)?;
    probe_devices()?;
    let mut conn = Connection::open(cfg)?;
    let mut outcome = SessionOutcome {
        files: Vec::new(),
        first_error: None,
    };
    for source in &sources {
        match conn.send_file(cfg, source) {
            Ok(report) => {
                on_file(&report);
                outcome.files.push(report);
            }
            Err(FileError::Continue(e)) => {
                warn!(file = %source.name, "{e}");
                eprintln!("{}: {e}", source.name);
                outcome.first_error.get_or_insert(e);
            }
            Err(FileError::Fatal(e)) => {
                conn.abort();
                return Err(e);
            }
        }
    }
    conn.close(cfg)?;
    Ok(outcome)
}

/// Where the data phase spent its time (logged at debug level for tuning).
#[derive(Default)]
struct DataPathTimes {
    read: Duration,
    digest: Duration,
    wait_credit: Duration,
    wait_buffer: Duration,
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
        FileError::Fatal(peer_lost_or(e))
    }
}

/// Maps "the peer went away" style verbs errors to PeerLost.
fn peer_lost_or(e: VerbsError) -> XferError {
    match e {
        VerbsError::Disconnected => XferError::PeerLost("the receiver disconnected".into()),
        VerbsError::WorkRequest {
            peer_lost: true, ..
        } => XferError::PeerLost(format!("the receiver stopped responding ({e})")),
        other => XferError::Verbs(other),
    }
}

struct Connection {
    ep: Endpoint,
    control: Control,
    staging: MemoryRegion,
    free_staging: Vec<usize>,
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
        let staging = MemoryRegion::new(
            ep.pd(),
            cfg.depth as usize * cfg.chunk_size as usize,
            Access::Local,
        )?;
        ep.cm_id().connect(cfg.timeout).map_err(connect_err)?;
        info!(peer = %cfg.addr, "connected");
        Ok(Connection {
            ep,
            control,
            staging,
            free_staging: (0..cfg.depth as usize).rev().collect(),
            session: SenderSession::new(cfg.chunk_size),
            wcs: Vec::with_capacity(64),
        })
    }

    fn send_file(&mut self, cfg: &SenderConfig, src: &Source) -> Result<FileReport, FileError> {
        let started = Instant::now();
        let offer = FileOffer {
            name: src.name.clone(),
            size: src.size,
            mode: src.mode,
            digest: cfg.verify,
        };
        let hello = self.session.start_file(offer).map_err(proto_err)?;
        self.control.send(&self.ep, &hello)?;
        // Phase 1: wait for the ring (or a rejection).
        while self.session.state() == SenderState::AwaitRing {
            if let Some(event) = self.next_event(cfg, "the receiver's MR reply")? {
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
                        return Err(FileError::Continue(XferError::Rejected {
                            code: rej.code.as_str(),
                            reason: rej.reason,
                        }));
                    }
                    SenderEvent::Acked(ack) => {
                        return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                    }
                    other => return Err(unexpected(&other)),
                }
            }
        }
        // Phase 2: stream chunks.
        let mut hasher = FileHasher::new(cfg.verify);
        let chunk = cfg.chunk_size as usize;
        let mut time = DataPathTimes::default();
        loop {
            while !self.free_staging.is_empty() {
                let Some(plan) = self.session.next_chunk() else {
                    break;
                };
                let Some(buf) = self.free_staging.pop() else {
                    break;
                };
                let len = plan.len as usize;
                let t0 = Instant::now();
                let data = self
                    .staging
                    .slice_mut(buf * chunk, len)
                    .map_err(XferError::from)?;
                src.file
                    .read_exact_at(data, plan.file_offset)
                    .map_err(|e| {
                        XferError::io(
                            format!("cannot read {} at offset {}", src.name, plan.file_offset),
                            e,
                        )
                    })?;
                let t1 = Instant::now();
                let crc = crc32fast::hash(data);
                hasher.update(data, crc);
                let t2 = Instant::now();
                time.read += t1 - t0;
                time.digest += t2 - t1;
                self.ep.post_write_imm(
                    &self.staging,
                    buf * chunk,
                    len,
                    plan.remote_addr,
                    plan.rkey,
                    crc,
                    wr::WRITE | buf as u64,
                    true,
                )?;
            }
            if self.session.all_chunks_planned() {
                break;
            }
            // Out of credits or buffers: wait for a write or a CREDIT.
            let t0 = Instant::now();
            let waiting_for_credit = self.session.credits() == 0;
            let event = self.next_event(cfg, "credit from the receiver")?;
            if waiting_for_credit {
                time.wait_credit += t0.elapsed();
            } else {
                time.wait_buffer += t0.elapsed();
            }
            if let Some(event) = event {
                match event {
                    SenderEvent::Credit(_) => {}
                    SenderEvent::Acked(ack) => {
                        return Err(FileError::Fatal(ack_error(ack.status, ack.reason)));
                    }
                    other => return Err(unexpected(&other)),
                }
            }
        }
        // RC ordering: FIN arrives after every WRITE posted before it.
        let fin = self.session.finish(hasher.finish()).map_err(proto_err)?;
        let digest = match &fin {
            Message::Fin(f) => f.digest,
            _ => return Err(FileError::Fatal(XferError::Protocol("FIN expected".into()))),
        };
        self.control.send(&self.ep, &fin)?;
        debug!(
            file = %src.name,
            read_s = time.read.as_secs_f64(),
            crc_s = time.digest.as_secs_f64(),
            wait_credit_s = time.wait_credit.as_secs_f64(),
            wait_buffer_s = time.wait_buffer.as_secs_f64(),
            "FIN sent"
        );
        // Phase 3: the ACK comes only after verify + fsync + rename.
        loop {
            if let Some(event) = self.next_event(cfg, "the receiver's ACK")? {
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
        Ok(FileReport {
            name: src.name.clone(),
            bytes: src.size,
            elapsed: started.elapsed(),
            digest,
        })
    }

    /// Waits for completions and handles them all; returns the state machine
    /// event that matters for control flow (request/response keeps it to
    /// one such event per batch besides credits).
    fn next_event(
        &mut self,
        cfg: &SenderConfig,
        what: &str,
    ) -> Result<Option<SenderEvent>, FileError> {
        self.wcs.clear();
        let mut wcs = std::mem::take(&mut self.wcs);
        super::wait_completions(&self.ep, &mut wcs, cfg.timeout, what)?;
        let mut event = None;
        for wc in &wcs {
            match (wr::kind(wc.wr_id), wc.opcode) {
                (wr::WRITE, WcOpcode::RdmaWrite) => self.free_staging.push(wr::index(wc.wr_id)),
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
        self.wcs = wcs;
        Ok(event)
    }

    /// Ends the session politely: BYE, wait until it is delivered, disconnect.
    fn close(&mut self, cfg: &SenderConfig) -> Result<(), XferError> {
        let bye = self
            .session
            .close()
            .map_err(|e| XferError::Protocol(e.to_string()))?;
        self.control.send(&self.ep, &bye)?;
        while self.control.busy() {
            match self.next_event(cfg, "delivery of BYE") {
                Ok(_) => {}
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

fn proto_err(e: impl std::fmt::Display) -> FileError {
    FileError::Fatal(XferError::Protocol(e.to_string()))
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
