//! Receiver: listens, and per session answers each HELLO with the ring (or a
//! REJECT), checks and writes every chunk the sender RDMA-writes into the
//! ring, returns credits, and on FIN verifies, fsyncs and renames before the
//! ACK. A directory HELLO is answered by creating the directory (ACK) or a
//! REJECT. Paths inside --dir are resolved component by component without
//! following links; with --stdout the one file or stream goes to standard
//! output instead.

use super::control::Control;
use super::digest::{FileHasher, digest_hex};
use super::progress::{FileProgress, Progress, ProgressSink};
use super::report::{FileEvent, FileFailure, FileReport, Phases};
use super::{DEFAULT_CHUNK_SIZE, DEFAULT_SLOTS, DEFAULT_TIMEOUT, wait_completions, wr};
use crate::error::XferError;
use crate::proto::{
    Ack, AckStatus, AuthFailure, DigestAlg, Fin, Hello, Message, Mtime, NONCE_LEN,
    PROTOCOL_VERSION, ReceiverConfig as MachineConfig, ReceiverEvent, ReceiverSession,
    ReceiverState, RecvError, Reject, RejectCode, RingInfo, Token, WireError,
};
use crate::sys::SysError;
use crate::sys::dirfd::{DirFd, EntryKind};
use crate::sys::os::{free_space, shutdown_requested};
use crate::sys::rdma::{
    CmId, Completion, Endpoint, EventChannel, IncomingConnection, QpCaps, RemoteRing, WcOpcode,
    probe_devices,
};
use std::fs::File;
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tracing::{debug, error, error_span, info, warn};

#[derive(Debug, Clone)]
pub struct ReceiverConfig {
    pub bind: SocketAddr,
    pub dir: PathBuf,
    pub once: bool,
    pub overwrite: bool,
    pub slots: u32,
    pub chunk_size: u32,
    pub busy_poll: bool,
    pub timeout: Duration,
    /// Largest file accepted (checked before any memory is registered).
    pub max_size: u64,
    /// Sessions served at once; more connections are refused with a reason.
    pub max_sessions: usize,
    /// Shared secret senders must prove before anything else; None accepts anyone.
    pub token: Option<Token>,
    /// Write the one received file or stream to standard output instead of
    /// --dir (requires `once`).
    pub stdout: bool,
    /// Told about each file's progress (the tool draws bars with it).
    pub progress: ProgressSink,
}

impl ReceiverConfig {
    pub fn new(bind: SocketAddr, dir: PathBuf) -> Self {
        ReceiverConfig {
            bind,
            dir,
            once: false,
            overwrite: false,
            slots: DEFAULT_SLOTS,
            chunk_size: DEFAULT_CHUNK_SIZE,
            busy_poll: false,
            timeout: DEFAULT_TIMEOUT,
            max_size: u64::MAX,
            max_sessions: DEFAULT_MAX_SESSIONS,
            token: None,
            stdout: false,
            progress: ProgressSink::default(),
        }
    }
}

/// Longest wait for a sender's AUTH (when a token is set), so that peers
/// without the secret cannot keep all session slots busy for long.
const AUTH_TIMEOUT: Duration = Duration::from_secs(5);

/// Default of --max-sessions.
pub const DEFAULT_MAX_SESSIONS: usize = 8;

/// Control messages the receiver may have outstanding at once from the
/// sender besides the data writes: a pipelining sender has up to
/// `proto::MAX_PENDING` entries unanswered, plus a HELLO, a BYE, a KEEPALIVE.
const CONTROL_RECVS: u32 = crate::proto::MAX_PENDING as u32 + 8;
const SEND_BUFFERS: usize = 16;

/// Called for every file a sender offered: after it was committed, or when
/// it failed (refused, failed its check, or cut short by the session's end).
pub type OnFile<'a> = dyn Fn(FileEvent<'_>) + Sync + 'a;

/// Serves sessions, each on its own thread, until SIGINT/SIGTERM; with
/// `once`, exactly one session (whose status is then returned).
pub fn serve(cfg: &ReceiverConfig, on_file: &OnFile<'_>) -> Result<(), XferError> {
    if cfg.stdout {
        if !cfg.once {
            return Err(XferError::Usage(
                "--stdout needs --once: standard output takes one file or stream".into(),
            ));
        }
    } else {
        let dir_meta = std::fs::metadata(&cfg.dir)
            .map_err(|e| XferError::io(format!("output directory {}", cfg.dir.display()), e))?;
        if !dir_meta.is_dir() {
            return Err(XferError::Usage(format!(
                "{} is not a directory",
                cfg.dir.display()
            )));
        }
    }
    probe_devices()?;
    let channel = EventChannel::new()?;
    let listener = CmId::new(&channel)?;
    listener.listen(cfg.bind, 64)?;
    info!(bind = %cfg.bind, dir = %cfg.dir.display(), max_sessions = cfg.max_sessions, "listening");
    let sessions = AtomicUsize::new(0);
    let refusals = AtomicUsize::new(0);
    let next_id = AtomicU64::new(1);
    std::thread::scope(|scope| {
        loop {
            if shutdown_requested() {
                let running = sessions.load(Ordering::SeqCst);
                info!(running, "shutting down (running sessions end first)");
                return Ok(());
            }
            let request = match listener.get_request(Duration::from_millis(500)) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(SysError::Interrupted) => continue,
                Err(e) => return Err(e.into()),
            };
            let conn = match request.detach() {
                Ok(c) => c,
                Err(e) => {
                    warn!("cannot take an incoming connection: {e}");
                    continue;
                }
            };
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            let peer = conn
                .peer_addr()
                .map_or_else(|| "?".to_string(), |a| a.ip().to_string());
            let span = error_span!("session", id, peer = %peer);
            if cfg.once {
                return span.in_scope(|| run_logged(cfg, conn, on_file));
            }
            if sessions.load(Ordering::SeqCst) >= cfg.max_sessions {
                // Say why, on a thread of its own so the listener goes on;
                // a flood beyond that is refused at the CM level (on drop).
                if refusals.fetch_add(1, Ordering::SeqCst) < cfg.max_sessions {
                    let refusals = &refusals;
                    let spawned = std::thread::Builder::new()
                        .name(format!("refuse-{id}"))
                        .spawn_scoped(scope, move || {
                            let _enter = span.enter();
                            refuse_busy(cfg, conn);
                            refusals.fetch_sub(1, Ordering::SeqCst);
                        });
                    if let Err(e) = spawned {
                        refusals.fetch_sub(1, Ordering::SeqCst);
                        warn!("cannot start a thread: {e}");
                    }
                } else {
                    refusals.fetch_sub(1, Ordering::SeqCst);
                    warn!(peer = %peer, "too many connections: refused without a reason");
                }
                continue;
            }
            sessions.fetch_add(1, Ordering::SeqCst);
            let sessions = &sessions;
            let spawned = std::thread::Builder::new()
                .name(format!("session-{id}"))
                .spawn_scoped(scope, move || {
                    let _enter = span.enter();
                    if let Err(e) = run_logged(cfg, conn, on_file) {
                        cfg.progress
                            .notice(&format!("receiver: session {id} from {peer} failed: {e}"));
                    }
                    sessions.fetch_sub(1, Ordering::SeqCst);
                });
            if let Err(e) = spawned {
                sessions.fetch_sub(1, Ordering::SeqCst);
                warn!("cannot start a session thread: {e}");
            }
        }
    })
}

/// Runs one session and logs how it ended.
fn run_logged(
    cfg: &ReceiverConfig,
    conn: IncomingConnection,
    on_file: &OnFile<'_>,
) -> Result<(), XferError> {
    let started = Instant::now();
    let result = run_session(cfg, conn, on_file);
    match &result {
        Ok(()) => info!(elapsed = ?started.elapsed(), "session finished"),
        Err(e) => error!(elapsed = ?started.elapsed(), "session failed: {e}"),
    }
    result
}

/// Accepts a connection only to tell the sender that all sessions are taken.
fn refuse_busy(cfg: &ReceiverConfig, conn: IncomingConnection) {
    let reason = format!(
        "the receiver is busy: {} sessions are running (its --max-sessions); try again later",
        cfg.max_sessions
    );
    warn!("refused: {reason}");
    let result = (|| -> Result<(), XferError> {
        let id = conn.into_id()?;
        let caps = QpCaps {
            max_send_wr: 2,
            max_recv_wr: 1,
        };
        let ep = Endpoint::new(id, caps, false)?;
        let mut control = Control::new(&ep, 1, 1)?;
        let timeout = cfg.timeout.min(Duration::from_secs(5));
        ep.cm_id().accept(timeout)?;
        let reject = Message::Reject(Reject::new(RejectCode::Busy, reason));
        control.send(&ep, &reject)?;
        control.drain(&ep, timeout)?;
        ep.cm_id().disconnect(Duration::from_secs(1));
        Ok(())
    })();
    if let Err(e) = result {
        debug!("could not deliver the busy refusal: {e}");
    }
}

fn run_session(
    cfg: &ReceiverConfig,
    conn: IncomingConnection,
    on_file: &OnFile<'_>,
) -> Result<(), XferError> {
    let output = Output::open(cfg)?;
    let id = conn.into_id()?;
    let recvs = cfg.slots + CONTROL_RECVS;
    let caps = QpCaps {
        max_send_wr: SEND_BUFFERS as u32 + 4,
        max_recv_wr: recvs,
    };
    let ep = Endpoint::new(id, caps, cfg.busy_poll)?;
    let control = Control::new(&ep, recvs as usize, SEND_BUFFERS)?;
    super::tune_ack_timeout(ep.cm_id());
    let accept_started = Instant::now();
    ep.cm_id().accept(cfg.timeout)?;
    let connect_time = accept_started.elapsed();
    info!(
        connect_s = connect_time.as_secs_f64(),
        "session established"
    );
    let machine = new_machine(cfg)?;
    let peer = ep
        .cm_id()
        .peer_addr()
        .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
    let mut session = Session {
        cfg,
        on_file,
        peer,
        connect_time,
        ep,
        control,
        ring: None,
        chunk: Vec::new(),
        machine,
        output,
        file: None,
        first_error: None,
        output_closed: None,
    };
    let result = session.run();
    session.finish(result)
}

/// The session's state machine; with a token, it requires AUTH over a fresh
/// nonce from the OS RNG before anything else.
fn new_machine(cfg: &ReceiverConfig) -> Result<ReceiverSession, XferError> {
    let machine_cfg = MachineConfig {
        slot_size: cfg.chunk_size,
        slot_count: cfg.slots,
        credit_batch: (cfg.slots / 4).max(1),
        max_size: cfg.max_size,
    };
    let Some(token) = &cfg.token else {
        return Ok(ReceiverSession::new(machine_cfg));
    };
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| {
        XferError::io(
            "cannot get random bytes for the challenge",
            std::io::Error::other(e),
        )
    })?;
    Ok(ReceiverSession::with_auth(
        machine_cfg,
        token.clone(),
        nonce,
    ))
}

/// Where received entries go.
enum Output {
    /// Under --dir: every path resolved from this descriptor, component by
    /// component, never through a link.
    Tree {
        root: DirFd,
        /// Attributes of directories created in this session that are
        /// applied when it ends (deepest last created first): an mtime
        /// would be changed by the entries created inside, and a mode
        /// without owner write/search would forbid creating them.
        deferred: Vec<DirAttrs>,
    },
    /// --stdout: the one file or stream of the session; None once taken.
    Stdout(Option<File>),
}

struct DirAttrs {
    path: String,
    mode: Option<u32>,
    mtime: Option<Mtime>,
}

/// A refusal of an offer: the code and reason the sender hears.
type Refusal = (RejectCode, String);

impl Output {
    fn open(cfg: &ReceiverConfig) -> Result<Output, XferError> {
        if cfg.stdout {
            // A duplicate of descriptor 1: unbuffered writes of whole
            // chunks, and a write error (EPIPE) is ours to handle.
            use std::os::fd::AsFd;
            let fd = std::io::stdout()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| XferError::io("cannot use standard output", e))?;
            grow_pipe(&fd, cfg.chunk_size as usize);
            return Ok(Output::Stdout(Some(File::from(fd))));
        }
        let root = DirFd::open(&cfg.dir)
            .map_err(|e| XferError::io(format!("output directory {}", cfg.dir.display()), e))?;
        Ok(Output::Tree {
            root,
            deferred: Vec::new(),
        })
    }

    /// Applies the deferred directory attributes (best effort: a failure
    /// is logged, the data is already safe).
    fn finish_dirs(&mut self) {
        let Output::Tree { root, deferred } = self else {
            return;
        };
        for attrs in deferred.drain(..).rev() {
            let applied = open_path(root, &attrs.path).and_then(|dir| {
                let f = dir.as_file()?;
                if let Some(mode) = attrs.mode {
                    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
                }
                if let Some(t) = attrs.mtime.and_then(system_time) {
                    f.set_modified(t)?;
                }
                Ok(())
            });
            if let Err(e) = applied {
                warn!(dir = %attrs.path, "cannot set the mode or time of a received directory: {e}");
            }
        }
    }
}

/// A pipe as big as a chunk (when `fd` is one), for fewer wake-ups.
pub(crate) fn grow_pipe(fd: &impl std::os::fd::AsFd, chunk: usize) {
    let is_fifo = File::from(match fd.as_fd().try_clone_to_owned() {
        Ok(f) => f,
        Err(_) => return,
    })
    .metadata()
    .map(|m| std::os::unix::fs::FileTypeExt::is_fifo(&m.file_type()))
    .unwrap_or(false);
    if is_fifo {
        match crate::sys::os::set_pipe_size(fd, chunk.min(1 << 20)) {
            Ok(n) => debug!(bytes = n, "pipe buffer"),
            Err(e) => debug!("pipe buffer left as it is: {e}"),
        }
    }
}

/// Opens `path` (relative, already validated) below `root`, every component
/// with O_NOFOLLOW.
fn open_path(root: &DirFd, path: &str) -> std::io::Result<DirFd> {
    let mut dir = root.try_clone()?;
    for c in path.split('/') {
        dir = dir.open_dir(c)?;
    }
    Ok(dir)
}

/// Opens the directory that holds `path`'s last component; returns it and
/// that component. Refuses symbolic links and non-directories on the way.
fn open_parent(root: &DirFd, path: &str) -> Result<(DirFd, String), Refusal> {
    let (parents, leaf) = match path.rsplit_once('/') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let mut dir = root.try_clone().map_err(|e| {
        (
            RejectCode::Io,
            format!("cannot open the output directory: {e}"),
        )
    })?;
    if let Some(parents) = parents {
        let mut walked = String::new();
        for c in parents.split('/') {
            if !walked.is_empty() {
                walked.push('/');
            }
            walked.push_str(c);
            dir = dir.open_dir(c).map_err(|e| match e.raw_os_error() {
                Some(libc::ENOENT) => (
                    RejectCode::Io,
                    format!("directory {walked} does not exist on the receiver"),
                ),
                Some(libc::ELOOP | libc::ENOTDIR) => {
                    if dir.kind(c).ok().flatten() == Some(EntryKind::Symlink) {
                        (
                            RejectCode::Exists,
                            format!("{walked} is a symbolic link on the receiver: not followed"),
                        )
                    } else {
                        (
                            RejectCode::Exists,
                            format!("{walked} exists on the receiver and is not a directory"),
                        )
                    }
                }
                _ => (
                    RejectCode::Io,
                    format!("cannot open directory {walked}: {e}"),
                ),
            })?;
        }
    }
    Ok((dir, leaf.to_string()))
}

fn system_time(m: Mtime) -> Option<std::time::SystemTime> {
    let epoch = std::time::UNIX_EPOCH;
    let nanos = Duration::from_nanos(m.nanos.into());
    if m.secs >= 0 {
        epoch
            .checked_add(Duration::from_secs(m.secs as u64))?
            .checked_add(nanos)
    } else {
        epoch
            .checked_sub(Duration::from_secs(m.secs.unsigned_abs()))?
            .checked_add(nanos)
    }
}

/// A temporary file next to the final name, removed on drop unless it was
/// renamed into place.
struct TempFile {
    parent: DirFd,
    temp: String,
    leaf: String,
    file: File,
    committed: bool,
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.committed
            && let Err(e) = self.parent.unlink(&self.temp)
        {
            warn!(path = %self.temp, "cannot remove temporary file: {e}");
        }
    }
}

enum Sink {
    Temp(TempFile),
    /// Standard output (chunks arrive in order and are written as they come).
    Stdout(File),
}

/// The file or stream being received.
struct IncomingFile {
    name: String,
    /// The offered size (0 for a stream: unknown).
    size: u64,
    digest_alg: DigestAlg,
    sink: Sink,
    mode: u32,
    mtime: Option<Mtime>,
    hasher: FileHasher,
    /// Bytes written so far (standard output is written strictly in order).
    written: u64,
    started: Instant,
    /// The file's log span (name, size) and its phase timings so far.
    span: tracing::Span,
    phases: Phases,
    data_started: Instant,
    /// Time spent checking and writing chunks (logged for tuning).
    check_time: Duration,
    write_time: Duration,
    progress: Box<dyn FileProgress>,
}

/// A temporary name that does not depend on the (up to 255-byte) final name.
fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        ".rdma-xfer-{}-{}-{nanos:08x}.part",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

struct Session<'a> {
    cfg: &'a ReceiverConfig,
    on_file: &'a OnFile<'a>,
    /// The sender's address, for log messages.
    peer: String,
    /// How long accepting the connection took (a phase of every file).
    connect_time: Duration,
    ep: Endpoint,
    control: Control,
    /// Registered at the first accepted HELLO, reused for every file.
    ring: Option<RemoteRing>,
    /// Private copy of the chunk being handled: what is checked is what is
    /// written, whatever the peer does to the ring meanwhile.
    chunk: Vec<u8>,
    machine: ReceiverSession,
    output: Output,
    file: Option<IncomingFile>,
    /// A per-file failure that did not end the session (--once reports it).
    first_error: Option<XferError>,
    /// Standard output was closed by its reader (EPIPE): the session ended
    /// on purpose, quietly; what to log.
    output_closed: Option<String>,
}

/// What handling one completion decided.
enum Flow {
    Continue,
    /// BYE: the sender is done.
    Done,
}

impl Session<'_> {
    fn run(&mut self) -> Result<(), XferError> {
        // Always the first message: the sender waits for it.
        let challenge = self.machine.challenge();
        self.control.send(&self.ep, &challenge)?;
        let mut wcs = Vec::with_capacity(16);
        loop {
            wcs.clear();
            let (what, timeout) = match (&self.file, self.machine.state()) {
                (Some(_), _) => ("data from the sender", self.cfg.timeout),
                // An unauthenticated peer holds a session slot only briefly.
                (None, ReceiverState::AwaitAuth) => {
                    ("the sender's AUTH", self.cfg.timeout.min(AUTH_TIMEOUT))
                }
                (None, _) => ("the next HELLO or BYE", self.cfg.timeout),
            };
            wait_completions(&self.ep, &mut wcs, timeout, what)?;
            for wc in wcs.drain(..) {
                if let Flow::Done = self.on_completion(wc)? {
                    return Ok(());
                }
            }
        }
    }

    fn on_completion(&mut self, wc: Completion) -> Result<Flow, XferError> {
        match (wr::kind(wc.wr_id), wc.opcode) {
            (wr::SEND, WcOpcode::Send) => self.control.on_send_done(&self.ep, wc)?,
            (wr::RECV, WcOpcode::RecvWithImm) => {
                let (byte_len, imm) = (wc.byte_len, wc.imm);
                // The receive buffer carried no data: hand it back at once.
                self.control.recycle(&self.ep, wc)?;
                let imm = imm.ok_or_else(|| {
                    XferError::Internal("RDMA write completion without immediate data".into())
                })?;
                self.on_chunk(byte_len, imm)?;
            }
            (wr::RECV, WcOpcode::Recv) => {
                let decoded = self.control.take_message(&self.ep, wc)?;
                let msg = match decoded {
                    Ok(m) => m,
                    Err(WireError::UnknownVersion(v)) => {
                        let reason = format!(
                            "protocol version {v} is not supported (this receiver speaks {PROTOCOL_VERSION})"
                        );
                        let _ = self.control.send(
                            &self.ep,
                            &Message::Reject(Reject::new(RejectCode::Version, reason.clone())),
                        );
                        return Err(XferError::Rejected {
                            code: RejectCode::Version.as_str(),
                            reason,
                        });
                    }
                    Err(source) => {
                        let err = XferError::Malformed {
                            from: "sender",
                            source,
                        };
                        return Err(self.abort(AckStatus::Protocol, err));
                    }
                };
                return self.on_message(msg);
            }
            (kind, opcode) => {
                return Err(XferError::Internal(format!(
                    "unexpected completion {opcode:?} for work request kind {kind:#x}"
                )));
            }
        }
        Ok(Flow::Continue)
    }

    fn on_message(&mut self, msg: Message) -> Result<Flow, XferError> {
        let kind = msg.kind();
        // What a refused offer is reported as (the machine takes the HELLO).
        let offer = match &msg {
            Message::Hello(h) => Some((h.name.clone(), h.size, h.digest)),
            _ => None,
        };
        match self.machine.on_message(msg) {
            Ok(ReceiverEvent::Offer(hello)) => self.on_hello(hello)?,
            Ok(ReceiverEvent::Fin(fin)) => self.on_fin(fin)?,
            Ok(ReceiverEvent::Closed) => return Ok(Flow::Done),
            Ok(ReceiverEvent::Authenticated) => info!("sender authenticated"),
            Ok(ReceiverEvent::AuthIgnored) => {
                debug!("AUTH ignored: this receiver has no token")
            }
            Ok(ReceiverEvent::Keepalive) => debug!("the sender waits for its input"),
            Err(RecvError::Auth(failure)) => return Err(self.auth_failed(failure)),
            Err(RecvError::Reject(reject)) => {
                warn!(code = reject.code.as_str(), "refused: {}", reject.reason);
                let err = XferError::Rejected {
                    code: reject.code.as_str(),
                    reason: reject.reason.clone(),
                };
                if let Some((name, size, alg)) = offer {
                    self.report_failure(&name, size, alg, Duration::ZERO, &err, false);
                }
                self.first_error.get_or_insert(err);
                self.control.send(&self.ep, &Message::Reject(reject))?;
            }
            Err(RecvError::Protocol(e)) => {
                let err = XferError::Protocol {
                    context: Some(format!("{kind} not allowed here")),
                    source: e,
                };
                return Err(self.abort(AckStatus::Protocol, err));
            }
            Err(e @ RecvError::TooLarge { .. }) => {
                let reason = format!("{kind}: {e}");
                let err = XferError::Rejected {
                    code: RejectCode::TooLarge.as_str(),
                    reason: reason.clone(),
                };
                return Err(self.abort_with(AckStatus::Rejected, reason, err));
            }
        }
        Ok(Flow::Continue)
    }

    /// The sender did not prove the secret: tell it (best effort) and end
    /// the session before anything is written or exposed.
    fn auth_failed(&mut self, failure: AuthFailure) -> XferError {
        warn!(
            "authentication failed from {}: {}",
            self.peer,
            failure.detail()
        );
        let _ = self
            .control
            .send(&self.ep, &Message::Reject(failure.reject()));
        self.file = None;
        XferError::Auth(failure.to_string())
    }

    /// Checks that need the file system, then opens the temporary file and
    /// exposes the ring (registered once per session). A directory is
    /// created (or found) and answered at once.
    fn on_hello(&mut self, hello: Hello) -> Result<(), XferError> {
        let hello_at = Instant::now();
        if hello.is_directory() {
            info!(dir = %hello.name, "directory");
            let reply = match self.make_dir(&hello) {
                Ok(()) => self.machine.accept_directory(),
                Err((code, reason)) => {
                    warn!(dir = %hello.name, code = code.as_str(), "refused: {reason}");
                    let err = XferError::Rejected {
                        code: code.as_str(),
                        reason: reason.clone(),
                    };
                    let elapsed = hello_at.elapsed();
                    self.report_failure(&hello.name, 0, hello.digest, elapsed, &err, false);
                    self.first_error.get_or_insert(err);
                    self.machine.reject(code, reason)
                }
            }
            .map_err(XferError::from)?;
            return self.control.send(&self.ep, &reply);
        }
        if hello.is_stream() {
            info!(file = %hello.name, "offer of a stream (size unknown)");
        } else {
            info!(file = %hello.name, size = hello.size, "offer");
        }
        // The ring is registered only for an acceptable offer; if that
        // fails (memlock limit, say) the sender hears why instead of
        // waiting for an MR that never comes.
        let prepared = self
            .prepare_file(&hello)
            .and_then(|file| match self.ring_info() {
                Ok(ring) => Ok((file, ring)),
                Err(e) => {
                    error!("cannot register the receive ring: {e}");
                    Err((
                        RejectCode::Io,
                        format!("the receiver cannot register its ring: {e}"),
                    ))
                }
            });
        match prepared {
            Ok((mut file, ring)) => {
                let reply = self.machine.accept(ring).map_err(XferError::from)?;
                self.control.send(&self.ep, &reply)?;
                // A file's time runs from its HELLO, like the sender's.
                file.started = hello_at;
                file.phases.connect = self.connect_time;
                file.phases.mr_exchange = hello_at.elapsed();
                file.data_started = Instant::now();
                file.progress = self.cfg.progress.file_started(&hello.name, hello.size);
                self.file = Some(file);
                Ok(())
            }
            Err((code, reason)) => {
                warn!(file = %hello.name, code = code.as_str(), "refused: {reason}");
                let err = XferError::Rejected {
                    code: code.as_str(),
                    reason: reason.clone(),
                };
                let elapsed = hello_at.elapsed();
                self.report_failure(&hello.name, hello.size, hello.digest, elapsed, &err, false);
                self.first_error.get_or_insert(err);
                let reply = self.machine.reject(code, reason).map_err(XferError::from)?;
                self.control.send(&self.ep, &reply)
            }
        }
    }

    /// Creates the directory `hello.name` (mode 0700 while its entries
    /// arrive, see `Output::Tree::deferred`), or accepts an existing one
    /// as it is.
    fn make_dir(&mut self, hello: &Hello) -> Result<(), Refusal> {
        let Output::Tree { root, deferred } = &mut self.output else {
            return Err((
                RejectCode::Protocol,
                format!(
                    "the receiver writes to its standard output (--stdout) and cannot create                      directory {}; send a tar stream instead (tar -cf - DIR | sender HOST -)",
                    hello.name
                ),
            ));
        };
        let (parent, leaf) = open_parent(root, &hello.name)?;
        let io =
            |what: &str, e: std::io::Error| (RejectCode::Io, format!("{what} {}: {e}", hello.name));
        match parent.kind(&leaf).map_err(|e| io("cannot inspect", e))? {
            Some(EntryKind::Dir) => {
                debug!(dir = %hello.name, "exists already: kept as it is");
                return Ok(());
            }
            Some(EntryKind::Symlink) => {
                return Err((
                    RejectCode::Exists,
                    format!(
                        "{} is a symbolic link on the receiver: not followed",
                        hello.name
                    ),
                ));
            }
            Some(_) => {
                return Err((
                    RejectCode::Exists,
                    format!(
                        "{} exists on the receiver and is not a directory",
                        hello.name
                    ),
                ));
            }
            None => {}
        }
        parent
            .mkdir(&leaf, 0o700)
            .map_err(|e| io("cannot create directory", e))?;
        let mode = hello.mode & 0o777;
        // Owner write and search are needed while entries are created inside.
        let now = if mode & 0o300 == 0o300 {
            mode
        } else {
            mode | 0o700
        };
        let dir = parent
            .open_dir(&leaf)
            .map_err(|e| io("cannot open the new directory", e))?;
        dir.as_file()
            .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(now)))
            .map_err(|e| io("cannot set the mode of", e))?;
        // The new entry must survive a crash like every acknowledged file.
        parent
            .sync()
            .map_err(|e| io("cannot fsync the parent of", e))?;
        if now != mode || hello.mtime.is_some() {
            deferred.push(DirAttrs {
                path: hello.name.clone(),
                mode: (now != mode).then_some(mode),
                mtime: hello.mtime,
            });
        }
        Ok(())
    }

    fn prepare_file(&mut self, hello: &Hello) -> Result<IncomingFile, Refusal> {
        let sink = match &mut self.output {
            Output::Stdout(out) => {
                let Some(out) = out.take() else {
                    return Err((
                        RejectCode::Protocol,
                        format!(
                            "the receiver writes to its standard output (--stdout) and takes one                              file or stream per session; {} is one too many",
                            hello.name
                        ),
                    ));
                };
                Sink::Stdout(out)
            }
            Output::Tree { root, .. } => {
                let (parent, leaf) = open_parent(root, &hello.name)?;
                match parent.kind(&leaf) {
                    Ok(Some(EntryKind::Dir)) => {
                        return Err((
                            RejectCode::Exists,
                            format!("{} exists and is a directory", hello.name),
                        ));
                    }
                    Ok(Some(_)) if !self.cfg.overwrite => {
                        return Err((
                            RejectCode::Exists,
                            format!(
                                "{} already exists on the receiver (it runs without --overwrite)",
                                hello.name
                            ),
                        ));
                    }
                    Ok(_) => {}
                    Err(e) => {
                        return Err((
                            RejectCode::Io,
                            format!("cannot inspect {}: {e}", hello.name),
                        ));
                    }
                }
                // A stream's size is unknown: it is checked as it arrives
                // (--max-size by the state machine, space by the writes).
                if !hello.is_stream() {
                    match free_space(&self.cfg.dir) {
                        Ok(free) if free < hello.size => {
                            return Err((
                                RejectCode::NoSpace,
                                format!(
                                    "{} needs {} bytes but only {free} are free",
                                    hello.name, hello.size
                                ),
                            ));
                        }
                        Ok(_) => {}
                        Err(e) => {
                            warn!("cannot check free space of {}: {e}", self.cfg.dir.display())
                        }
                    }
                }
                let temp = temp_name();
                let file = parent.create_new(&temp, 0o600).map_err(|e| {
                    (
                        RejectCode::Io,
                        format!("cannot create a file in the output directory: {e}"),
                    )
                })?;
                Sink::Temp(TempFile {
                    parent,
                    temp,
                    leaf,
                    file,
                    committed: false,
                })
            }
        };
        let span = if hello.is_stream() {
            error_span!("file", name = %hello.name, size = "unknown")
        } else {
            error_span!("file", name = %hello.name, size = hello.size)
        };
        Ok(IncomingFile {
            name: hello.name.clone(),
            size: hello.size,
            digest_alg: hello.digest,
            sink,
            mode: hello.mode & 0o777,
            mtime: hello.mtime,
            hasher: FileHasher::new(hello.digest),
            written: 0,
            started: Instant::now(),
            span,
            phases: Phases::default(),
            data_started: Instant::now(),
            check_time: Duration::ZERO,
            write_time: Duration::ZERO,
            // Replaced by the observer's once the offer is accepted.
            progress: super::progress::NoProgress.file_started("", 0),
        })
    }

    fn ring_info(&mut self) -> Result<RingInfo, XferError> {
        if self.ring.is_none() {
            let len = self.cfg.slots as usize * self.cfg.chunk_size as usize;
            let ring = RemoteRing::new(self.ep.pd(), len)?;
            debug!(len, rkey = ring.rkey(), "ring registered");
            self.ring = Some(ring);
            self.chunk = vec![0; self.cfg.chunk_size as usize];
        }
        let ring = self
            .ring
            .as_ref()
            .ok_or_else(|| XferError::Internal("ring missing".into()))?;
        Ok(RingInfo {
            addr: ring.remote_addr(),
            rkey: ring.rkey(),
            slot_size: self.cfg.chunk_size,
            slot_count: self.cfg.slots,
        })
    }

    fn on_chunk(&mut self, byte_len: u32, imm: u32) -> Result<(), XferError> {
        let placement = match self.machine.on_chunk(byte_len, imm) {
            Ok(p) => p,
            Err(e @ RecvError::TooLarge { .. }) => {
                let name = self.file.as_ref().map_or("?", |f| f.name.as_str());
                let reason = format!("{name}: {e}");
                let err = XferError::Rejected {
                    code: RejectCode::TooLarge.as_str(),
                    reason: reason.clone(),
                };
                return Err(self.abort_with(AckStatus::Rejected, reason, err));
            }
            Err(RecvError::Protocol(source)) => {
                let err = XferError::Protocol {
                    context: Some("bad data write".into()),
                    source,
                };
                return Err(self.abort(AckStatus::Protocol, err));
            }
            Err(e) => {
                let err = XferError::Internal(format!("a data write gave {e}"));
                return Err(self.abort(AckStatus::Protocol, err));
            }
        };
        let (Some(ring), Some(file)) = (self.ring.as_ref(), self.file.as_mut()) else {
            return Err(XferError::Internal("data without an open file".into()));
        };
        let t0 = Instant::now();
        let data = self
            .chunk
            .get_mut(..placement.len as usize)
            .ok_or_else(|| XferError::Internal("chunk longer than a slot".into()))?;
        ring.copy_out(placement.slot_offset as usize, data)?;
        let data = &*data;
        let crc = crc32fast::hash(data);
        let t1 = Instant::now();
        if crc != placement.expected_crc {
            let mut msg = format!(
                "chunk {} of {} (offset {}) has CRC32 {crc:08x}, the sender computed {:08x}",
                placement.seq, file.name, placement.file_offset, placement.expected_crc
            );
            if let Sink::Stdout(_) = file.sink {
                msg.push_str(&format!(
                    "; standard output got only the {} bytes before it",
                    file.written
                ));
            }
            let err = XferError::Integrity(msg);
            return Err(self.abort(AckStatus::Integrity, err));
        }
        let written = match &mut file.sink {
            Sink::Temp(t) => t.file.write_all_at(data, placement.file_offset),
            Sink::Stdout(out) if placement.file_offset == file.written => out.write_all(data),
            Sink::Stdout(_) => {
                let err = XferError::Internal(format!(
                    "chunk {} of {} at offset {} is out of order ({} bytes written)",
                    placement.seq, file.name, placement.file_offset, file.written
                ));
                return Err(self.abort(AckStatus::Protocol, err));
            }
        };
        if let Err(e) = written {
            let stdout = matches!(file.sink, Sink::Stdout(_));
            if stdout && e.kind() == std::io::ErrorKind::BrokenPipe {
                // The reader of our output is gone (`| head`, say): not an
                // error of ours. Tell the sender why, and end quietly.
                let msg = format!(
                    "standard output was closed after {} bytes of {} (broken pipe): stopped receiving",
                    file.written, file.name
                );
                let context = format!(
                    "the receiver's standard output was closed by its reader after {} bytes",
                    file.written
                );
                self.output_closed = Some(msg);
                return Err(self.abort(AckStatus::Io, XferError::io(context, e)));
            }
            let what = if stdout {
                format!("cannot write {} to standard output", file.name)
            } else {
                format!("cannot write {}", file.name)
            };
            return Err(self.abort(AckStatus::Io, XferError::io(what, e)));
        }
        file.written += u64::from(placement.len);
        file.hasher.update(data, crc);
        file.check_time += t1 - t0;
        file.write_time += t1.elapsed();
        file.progress.advance(placement.len.into());
        if let Some(credit) = self.machine.chunk_done() {
            self.control.send(&self.ep, &credit)?;
        }
        Ok(())
    }

    fn on_fin(&mut self, fin: Fin) -> Result<(), XferError> {
        let Some(mut file) = self.file.take() else {
            return Err(XferError::Internal("FIN without an open file".into()));
        };
        let span = file.span.clone();
        let _enter = span.enter();
        file.phases.data = file.data_started.elapsed();
        let fin_at = Instant::now();
        let hasher = std::mem::replace(
            &mut file.hasher,
            FileHasher::new(crate::proto::DigestAlg::Crc32),
        );
        let digest = hasher.finish();
        debug!(
            file = %file.name,
            elapsed_s = file.started.elapsed().as_secs_f64(),
            crc_s = file.check_time.as_secs_f64(),
            write_s = file.write_time.as_secs_f64(),
            "all data received"
        );
        let stdout = matches!(file.sink, Sink::Stdout(_));
        let (status, reason, err) = if digest != fin.digest {
            let mut reason = format!(
                "whole-file digest mismatch for {}: received data hashes to {}, the sender's is {}",
                file.name,
                digest_hex(&digest),
                digest_hex(&fin.digest)
            );
            if stdout {
                // Written bytes cannot be taken back: say so, loudly.
                reason.push_str(
                    "; the data already written to the receiver's standard output is corrupt",
                );
            }
            (
                AckStatus::Integrity,
                reason.clone(),
                Some(XferError::Integrity(reason)),
            )
        } else {
            match commit(&mut file, self.cfg.overwrite) {
                Ok(()) => (AckStatus::Ok, String::new(), None),
                Err(e) => (AckStatus::Io, e.to_string(), Some(e)),
            }
        };
        let ack = self
            .machine
            .complete(status, reason)
            .map_err(XferError::from)?;
        self.control.send(&self.ep, &ack)?;
        match err {
            None => {
                file.phases.commit = fin_at.elapsed();
                file.phases.log(&file.name, fin.bytes);
                let report = FileReport {
                    name: file.name.clone(),
                    bytes: fin.bytes,
                    elapsed: file.started.elapsed(),
                    digest,
                    phases: file.phases,
                };
                file.progress.finished();
                (self.on_file)(FileEvent::Done(&report));
            }
            Some(e) => {
                error!(file = %file.name, "{e}");
                self.report_file_failure(&file, &e, false);
                self.first_error.get_or_insert(e);
            }
        }
        Ok(())
    }

    /// A fatal error mid-session: tell the sender why (best effort), and
    /// return the error. The temporary file is removed when `file` drops.
    fn abort(&mut self, status: AckStatus, err: XferError) -> XferError {
        let reason = err.to_string();
        self.abort_with(status, reason, err)
    }

    /// As `abort`, with the reason the sender hears given apart.
    fn abort_with(&mut self, status: AckStatus, reason: String, err: XferError) -> XferError {
        // After a peer-caused error the machine is already Closed and
        // refuses complete(); the ACK is then built directly.
        let ack = self
            .machine
            .complete(status, reason.clone())
            .unwrap_or_else(|_| Message::Ack(Ack::new(status, reason)));
        let _ = self.control.send(&self.ep, &ack);
        if let Some(file) = self.file.take() {
            self.report_file_failure(&file, &err, true);
        }
        err
    }

    /// Reports a file that was not received (`on_file`).
    fn report_failure(
        &self,
        name: &str,
        size: u64,
        alg: DigestAlg,
        elapsed: Duration,
        err: &XferError,
        session_ended: bool,
    ) {
        let failure = FileFailure::new(
            name,
            size,
            alg,
            elapsed,
            self.connect_time,
            err,
            session_ended,
        );
        (self.on_file)(FileEvent::Failed(&failure));
    }

    fn report_file_failure(&self, file: &IncomingFile, err: &XferError, session_ended: bool) {
        let elapsed = file.started.elapsed();
        self.report_failure(
            &file.name,
            file.size,
            file.digest_alg,
            elapsed,
            err,
            session_ended,
        );
    }

    /// Lets queued replies reach the sender, then disconnects.
    fn finish(mut self, result: Result<(), XferError>) -> Result<(), XferError> {
        // Best effort: the session is over either way.
        let _ = self.control.drain(&self.ep, Duration::from_secs(2));
        if let (Err(e), Some(file)) = (&result, self.file.take()) {
            // Where the file stood, for whoever reads the logs.
            file.span.in_scope(|| {
                info!(
                    phase = "data",
                    bytes_done = self.machine.bytes_received(),
                    "file abandoned: {e}"
                )
            });
            self.report_file_failure(&file, e, true);
        }
        self.file = None;
        self.output.finish_dirs();
        self.ep.cm_id().disconnect(Duration::from_secs(1));
        if let Some(msg) = self.output_closed.take() {
            warn!("{msg}");
            return Ok(());
        }
        result?;
        match self.first_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Makes a verified file durable: for a temporary file, apply the mode (and
/// mtime), fsync, rename into place, fsync the directory; for standard
/// output, fsync when it is a file.
fn commit(file: &mut IncomingFile, overwrite: bool) -> Result<(), XferError> {
    let name = &file.name;
    let ctx = |what: &str| format!("{what} {name}");
    let t = match &mut file.sink {
        Sink::Stdout(out) => {
            // A pipe or terminal cannot be fsynced (EINVAL); a file can.
            return match out.sync_all() {
                Err(e) if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EROFS)) => {
                    Err(XferError::io("cannot fsync standard output", e))
                }
                _ => Ok(()),
            };
        }
        Sink::Temp(t) => t,
    };
    t.file
        .set_permissions(std::fs::Permissions::from_mode(file.mode))
        .map_err(|e| XferError::io(ctx("cannot set the mode of"), e))?;
    if let Some(m) = file.mtime.and_then(system_time) {
        t.file
            .set_modified(m)
            .map_err(|e| XferError::io(ctx("cannot set the modification time of"), e))?;
    }
    t.file
        .sync_all()
        .map_err(|e| XferError::io(ctx("cannot fsync"), e))?;
    t.parent
        .rename(&t.temp, &t.leaf, !overwrite)
        .map_err(|e| XferError::io(ctx("cannot move into place"), e))?;
    t.committed = true;
    t.parent
        .sync()
        .map_err(|e| XferError::io(ctx("cannot fsync the directory of"), e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtimes_convert_both_sides_of_the_epoch() {
        let t = |secs, nanos| system_time(Mtime { secs, nanos });
        let epoch = std::time::UNIX_EPOCH;
        assert_eq!(t(0, 0), Some(epoch));
        assert_eq!(t(10, 5), Some(epoch + Duration::new(10, 5)));
        assert_eq!(
            t(-10, 5),
            Some(epoch - Duration::from_secs(10) + Duration::from_nanos(5))
        );
        // Out of the platform's range: no time rather than a panic.
        let _ = t(i64::MAX, 999_999_999);
        let _ = t(i64::MIN, 999_999_999);
    }

    #[test]
    fn parents_are_opened_without_following_links() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("a/link")).unwrap();
        std::fs::write(root.path().join("a/file"), b"").unwrap();
        let r = DirFd::open(root.path()).unwrap();
        let (_, leaf) = open_parent(&r, "a/b/c").unwrap();
        assert_eq!(leaf, "c");
        let (_, leaf) = open_parent(&r, "top").unwrap();
        assert_eq!(leaf, "top");
        let err = |p| open_parent(&r, p).map(|_| ()).unwrap_err();
        assert_eq!(err("a/link/x").0, RejectCode::Exists);
        assert!(
            err("a/link/x").1.contains("symbolic link"),
            "{:?}",
            err("a/link/x")
        );
        assert_eq!(err("a/file/x").0, RejectCode::Exists);
        assert_eq!(err("a/missing/x").0, RejectCode::Io);
        assert!(err("a/missing/x").1.contains("a/missing does not exist"));
        assert!(open_path(&r, "a/b").is_ok());
        assert!(open_path(&r, "a/link").is_err());
    }
}
