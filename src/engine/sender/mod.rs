//! Sender: connects, then for each entry HELLO -> MR -> WRITE_WITH_IMM
//! chunks (at most `depth` in flight and never more than the granted
//! credits) -> FIN, or for a directory just its HELLO; finally BYE. Entries
//! are pipelined: the next HELLO goes out right after a FIN, and the
//! receiver's verdicts (ACK, or REJECT for a directory) are collected as
//! they arrive, up to `proto::MAX_PENDING` of them outstanding.

mod batch;
mod pump;
mod verdicts;

use crate::engine::control::{Control, Undelivered};
use crate::engine::entries::{self, Entry, WalkOptions};
use crate::engine::fit::{Buffers, Given, Overhead, Pool, fit_to_memlock};
use crate::engine::progress::ProgressSink;
use crate::engine::reader::{Input, Reader};
use crate::engine::report::{FileEvent, FileFailure, FileReport};
use crate::engine::{DEFAULT_TIMEOUT, WrId, WrKind};
use crate::error::XferError;
use crate::proto::{
    AckStatus, DigestAlg, FileOffer, NONCE_LEN, OfferKind, ProtocolError, Role, SenderAuth,
    SenderEvent, SenderSession, SenderState, Token, escaped,
};
use crate::sys::SysError;
use crate::sys::rdma::{
    BufferPool, CmId, Completion, Endpoint, EventChannel, QpCaps, WcOpcode, probe_devices,
};
use pump::Pipeline;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tracing::{debug, error_span, info, warn};
use verdicts::{PendingEntry, Tracker};

#[derive(Debug, Clone)]
pub struct SenderConfig {
    pub addr: SocketAddr,
    /// Local address to connect from (selects the RDMA device / port).
    pub source: Option<IpAddr>,
    pub chunk_size: u32,
    pub depth: u32,
    /// Which of `depth` and `chunk_size` the user gave; the others are
    /// lowered to fit the memlock limit (`fit::fit_to_memlock`).
    pub given: Given,
    pub verify: DigestAlg,
    pub busy_poll: bool,
    pub ack_timeout: super::AckTimeout,
    pub timeout: Duration,
    /// Shared secret proving this sender to a receiver that requires one.
    pub token: Option<Token>,
    /// Trees (`-r`), links, times, the name of standard input.
    pub walk: WalkOptions,
    /// Told about each file's progress (the tool draws bars with it).
    pub progress: ProgressSink,
    /// Offer files with RESUME: the receiver keeps what it verified if the
    /// transfer fails, and a later offer continues it or skips a file it
    /// has complete.
    pub resume: bool,
    /// Offer regular files with CHECKSUM (`--checksum`): asked by the
    /// receiver, the sender hashes the file (SHA-256) before any data, and
    /// a copy the receiver has under its --link-dest is linked instead of
    /// sent.
    pub checksum: bool,
    /// After a failure that may be transient (`XferError::is_transient`),
    /// connect again this many times at most (with a growing pause) and
    /// send what was not acknowledged yet.
    pub retries: u32,
}

impl SenderConfig {
    /// Bytes per staging slot: a chunk, and with a token its tag after it.
    pub fn slot_size(&self) -> u32 {
        let tag = if self.token.is_some() {
            crate::proto::CHUNK_TAG_LEN as u32
        } else {
            0
        };
        self.chunk_size.saturating_add(tag)
    }

    pub fn new(addr: SocketAddr) -> Self {
        SenderConfig {
            addr,
            source: None,
            chunk_size: super::DEFAULT_CHUNK_SIZE,
            depth: super::DEFAULT_DEPTH,
            given: Given::default(),
            verify: DigestAlg::Crc32,
            busy_poll: false,
            ack_timeout: super::AckTimeout::Auto,
            timeout: DEFAULT_TIMEOUT,
            token: None,
            walk: WalkOptions {
                stdin_name: DEFAULT_STDIN_NAME.into(),
                ..WalkOptions::default()
            },
            progress: ProgressSink::default(),
            resume: false,
            checksum: false,
            retries: 0,
        }
    }
}

/// Name standard input arrives under unless `--name` says otherwise.
pub const DEFAULT_STDIN_NAME: &str = "stdin";

/// Outcome of a whole session: reports of acknowledged files, directories
/// created, and the first per-entry failure (later entries are still
/// attempted after a rejection).
#[derive(Default)]
pub struct SessionOutcome {
    pub files: Vec<FileReport>,
    pub directories: u64,
    /// Links and special files skipped in trees.
    pub skipped: usize,
    /// From the start of the connection to the last verdict.
    pub elapsed: Duration,
    pub first_error: Option<XferError>,
}

/// `cfg` with staging buffers that fit the memlock limit, before
/// anything connects (see `fit::fit_to_memlock`).
fn fit_staging(cfg: &SenderConfig) -> Result<SenderConfig, XferError> {
    let asked = Buffers {
        count: cfg.depth,
        chunk_size: cfg.chunk_size,
    };
    let overhead = Overhead::control((RECV_BUFFERS + SEND_BUFFERS) as u64, 0);
    let fitted = fit_to_memlock(Pool::Staging, asked, cfg.given, overhead)?;
    Ok(SenderConfig {
        depth: fitted.count,
        chunk_size: fitted.chunk_size,
        ..cfg.clone()
    })
}

/// Receive buffers the sender keeps posted (MR, CREDIT, ACK, REJECT).
const RECV_BUFFERS: usize = 64;
const SEND_BUFFERS: usize = 8;

/// Whether `name` lies below one of `dirs` (relative paths, `/`-joined).
fn below_any(name: &str, dirs: &[String]) -> bool {
    dirs.iter().any(|d| {
        name.len() > d.len() && name.starts_with(d.as_str()) && name.as_bytes()[d.len()] == b'/'
    })
}

/// The pause before retry number `n` (from 1): 1 s, 2 s, 4 s ... 30 s.
pub fn retry_pause(n: u32) -> Duration {
    Duration::from_secs((1u64 << n.saturating_sub(1).min(5)).min(30))
}

/// Sends `paths` ("-" is standard input; directories need
/// `cfg.walk.recursive`) in one session, or, after a failure that may be
/// transient, in up to `cfg.retries` more, each sending only what no
/// earlier one had acknowledged (with `cfg.resume`, continuing what the
/// receiver kept). `on_file` is called for every file that was offered:
/// after its ACK(ok), or when it failed (refused, failed its check, or
/// cut short by an error that ended the last session); also for a
/// directory that could not be created.
pub fn send_files(
    cfg: &SenderConfig,
    paths: &[PathBuf],
    mut on_file: impl FnMut(FileEvent<'_>),
) -> Result<SessionOutcome, XferError> {
    let started = Instant::now();
    let cfg = &fit_staging(cfg)?;
    // A batch keeps its files open until its data is sent.
    crate::sys::os::raise_open_files();
    // Files acknowledged or failed for good: not offered again.
    let mut settled: HashSet<String> = HashSet::new();
    let mut total = SessionOutcome::default();
    let mut retry = 0;
    // Failures of files cut short by a session's end, by name: reported
    // only if no later session settles them.
    let mut cut_short: BTreeMap<String, FileFailure> = BTreeMap::new();
    loop {
        let mut now_settled = Vec::new();
        let (outcome, ended_by) = run_session(cfg, paths, &settled, |event| match event {
            FileEvent::Failed(f) if f.session_ended && retry < cfg.retries => {
                cut_short.insert(f.name.clone(), f.clone());
            }
            FileEvent::Done(FileReport { name, .. })
            | FileEvent::Failed(FileFailure { name, .. }) => {
                cut_short.remove(name);
                now_settled.push(name.clone());
                on_file(event);
            }
        });
        settled.extend(now_settled);
        total.absorb(outcome);
        total.elapsed = started.elapsed();
        let Some(err) = ended_by else {
            return Ok(total);
        };
        // Whether to try again depends on what ended the session; what is
        // reported, if not, is the first failure (a receiver that failed an
        // entry may end the session right after saying why).
        let stdin_cut =
            paths.iter().any(|p| p.as_os_str() == "-") && !settled.contains(&cfg.walk.stdin_name);
        // Why not to try again, if so (said only when it is not obvious).
        let give_up = if retry >= cfg.retries || !err.is_transient() {
            Some("")
        } else if stdin_cut {
            Some("standard input cannot be read again, so ")
        } else {
            None
        };
        let err = match give_up {
            Some(why) => {
                if cfg.retries > 0 && !why.is_empty() {
                    warn!("{why}the transfer is not retried");
                }
                match total.first_error.take() {
                    // The run's result is its first failure; the last one
                    // is said all the same.
                    Some(first) => {
                        if retry > 0 {
                            warn!("the last attempt ended: {err}");
                        }
                        first
                    }
                    None => err,
                }
            }
            None => {
                retry += 1;
                let pause = retry_pause(retry);
                warn!(
                    "{err}; connecting again in {} s (retry {retry} of {})",
                    pause.as_secs(),
                    cfg.retries
                );
                if pause_unless_interrupted(pause) {
                    continue;
                }
                XferError::Sys(SysError::Interrupted)
            }
        };
        for f in cut_short.values() {
            on_file(FileEvent::Failed(f));
        }
        return Err(err);
    }
}

/// Sleeps for `pause`; false if SIGINT or SIGTERM came meanwhile.
pub fn pause_unless_interrupted(pause: Duration) -> bool {
    let until = Instant::now() + pause;
    while Instant::now() < until {
        if crate::sys::os::shutdown_requested() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    !crate::sys::os::shutdown_requested()
}

impl SessionOutcome {
    /// How many acknowledged files came to `outcome`.
    pub fn count(&self, outcome: crate::engine::Outcome) -> usize {
        self.files.iter().filter(|f| f.outcome == outcome).count()
    }

    /// Adds a later session's results (a retry) to these.
    fn absorb(&mut self, later: SessionOutcome) {
        self.files.extend(later.files);
        self.directories += later.directories;
        // Each session plans the same tree: its count of what it skips.
        self.skipped = later.skipped;
        if self.first_error.is_none() {
            self.first_error = later.first_error;
        }
    }
}

/// One session: sends the entries of `paths` not in `settled`. Returns
/// what it achieved and the error that ended it early, if one did.
fn run_session(
    cfg: &SenderConfig,
    paths: &[PathBuf],
    settled: &HashSet<String>,
    on_file: impl FnMut(FileEvent<'_>),
) -> (SessionOutcome, Option<XferError>) {
    match try_session(cfg, paths, settled, on_file) {
        Ok(outcome) => (outcome, None),
        Err(SessionEnded(ended)) => (ended.1, Some(ended.0)),
    }
}

/// An error that ended a session, and what the session achieved before
/// (boxed: an outcome is large).
struct SessionEnded(Box<(XferError, SessionOutcome)>);

impl From<XferError> for SessionEnded {
    /// An error before anything was sent.
    fn from(e: XferError) -> Self {
        SessionEnded(Box::new((e, SessionOutcome::default())))
    }
}

fn try_session(
    cfg: &SenderConfig,
    paths: &[PathBuf],
    settled: &HashSet<String>,
    mut on_file: impl FnMut(FileEvent<'_>),
) -> Result<SessionOutcome, SessionEnded> {
    let mut plan = entries::plan(paths, &cfg.walk)?;
    plan.entries
        .retain(|e| matches!(e, Entry::Dir { .. }) || !settled.contains(e.name()));
    let (files, bytes) = plan.files_and_bytes();
    cfg.progress.planned(files, bytes);
    let devices = probe_devices().map_err(XferError::from)?;
    tracing::info!("RDMA devices: {}", devices.join(", "));
    let span = error_span!("session", peer = %cfg.addr);
    let _enter = span.enter();
    let started = Instant::now();
    // The pool is dropped before `conn`, but a slot still posted keeps its
    // memory registered and allocated until the endpoint's QP is destroyed.
    let (mut conn, (pool, tokens)) = Connection::open(cfg)?;
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let (job_tx, job_rx) = mpsc::channel();
        let (free_tx, free_rx) = mpsc::channel();
        let (out_tx, out_rx) = mpsc::channel();
        for token in tokens {
            let _ = free_tx.send(token);
        }
        let reader = Reader {
            filler: pool.filler(),
            jobs: job_rx,
            free: free_rx,
            out: out_tx,
            stop: &stop,
            spare: None,
        };
        scope.spawn(move || reader.run());
        let mut pipe = Pipeline {
            pool: &pool,
            jobs: job_tx,
            free: free_tx,
            filled: out_rx,
            depth: cfg.depth as usize,
            posted: 0,
            held: None,
            stop: &stop,
        };
        let mut tracker = Tracker {
            pending: BTreeMap::new(),
            next_tag: 0,
            outcome: SessionOutcome {
                files: Vec::new(),
                directories: 0,
                skipped: plan.skipped,
                elapsed: Duration::ZERO,
                first_error: plan.problems.into_iter().next(),
            },
            on_file: &mut on_file,
            connect: conn.connect_time,
            digest_alg: cfg.verify,
            refused_dirs: Vec::new(),
        };
        let result = conn.run(cfg, plan.entries, &mut pipe, &mut tracker);
        if let Err(e) = result {
            conn.abort();
            // A receiver that failed an entry may end the session right
            // after saying why (a stream over --max-size, say): the first
            // failure is the one to report, as for any session.
            // (A chunk that fails its CRC ends the session too, so even
            // the BYE can find the receiver gone.)
            if tracker.outcome.first_error.is_some() {
                info!("then the session ended: {e}");
            }
            tracker.outcome.elapsed = started.elapsed();
            return Err(SessionEnded(Box::new((e, tracker.outcome))));
        }
        tracker.outcome.elapsed = started.elapsed();
        // Dropping `pipe` closes the channels and sets `stop`, which ends
        // the reader thread.
        Ok(tracker.outcome)
    })
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

impl From<SysError> for FileError {
    fn from(e: SysError) -> Self {
        FileError::Fatal(super::peer_lost_or(e))
    }
}

fn fatal(r: Result<(), FileError>) -> Result<(), XferError> {
    match r {
        Ok(()) => Ok(()),
        Err(FileError::Fatal(e) | FileError::Continue(e)) => Err(e),
    }
}

struct Connection {
    connect_time: Duration,
    ep: Endpoint,
    control: Control,
    session: SenderSession,
    wcs: Vec<Completion>,
    /// State machine events not yet acted upon, in order.
    events: VecDeque<SenderEvent>,
    /// The receiver refused a batch by policy (REJECT protocol: it takes
    /// files one by one, e.g. --exec): no more batches this session.
    batches_refused: bool,
}

impl Connection {
    /// Connects, and registers the staging pool while the receiver answers.
    fn open(
        cfg: &SenderConfig,
    ) -> Result<(Self, (BufferPool, Vec<crate::sys::rdma::Buffer>)), XferError> {
        let connect_err = |source: SysError| match source {
            SysError::NoDevice | SysError::NotRdmaAddress(_) | SysError::Memlock { .. } => {
                XferError::Sys(source)
            }
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
        super::tune_ack_timeout(ep.cm_id(), cfg.ack_timeout);
        let staging = ep
            .cm_id()
            .connect_while(cfg.timeout, || {
                BufferPool::new(ep.pd(), cfg.slot_size() as usize, cfg.depth as usize)
            })
            .map_err(connect_err)?
            .map_err(XferError::from)?;
        debug!(
            buffers = cfg.depth,
            chunk_size = cfg.chunk_size,
            "staging registered"
        );
        let connect_time = connect_started.elapsed();
        info!(peer = %cfg.addr, connect_s = connect_time.as_secs_f64(), "connected");
        let auth = match &cfg.token {
            None => None,
            Some(token) => {
                let mut nonce = [0u8; NONCE_LEN];
                getrandom::fill(&mut nonce).map_err(|e| {
                    XferError::io(
                        "cannot get random bytes for the authentication",
                        std::io::Error::other(e),
                    )
                })?;
                Some(SenderAuth {
                    token: token.clone(),
                    nonce,
                    conn: super::connection_id(&ep, Role::Sender)?,
                })
            }
        };
        let conn = Connection {
            connect_time,
            ep,
            control,
            session: SenderSession::new(cfg.chunk_size, auth),
            wcs: Vec::with_capacity(64),
            events: VecDeque::new(),
            batches_refused: false,
        };
        Ok((conn, staging))
    }

    /// The whole session: greeting, every entry (pipelined), the last
    /// verdicts, BYE.
    fn run(
        &mut self,
        cfg: &SenderConfig,
        entries: Vec<Entry>,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), XferError> {
        let result = self.run_entries(cfg, entries, pipe, tracker);
        if let Err(e) = &result {
            // Entries sent but never answered: the session ended under them.
            for entry in std::mem::take(&mut tracker.pending).into_values() {
                for (name, bytes, started) in entry.names() {
                    tracker.report(&name, bytes, Some(started), e, true);
                }
            }
        }
        result
    }

    fn run_entries(
        &mut self,
        cfg: &SenderConfig,
        entries: Vec<Entry>,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), XferError> {
        fatal(self.greet(cfg, pipe, tracker))?;
        let mut queue = VecDeque::from(entries);
        // Files of a refused batch, at the front of the queue: they go one
        // by one.
        let mut unbatched = 0usize;
        let mut pruned = 0usize;
        while let Some(entry) = queue.pop_front() {
            // What lies below a refused directory would be refused too.
            if tracker.refused_dirs.len() > pruned {
                let dirs = &tracker.refused_dirs[pruned..];
                let before = queue.len();
                queue.retain(|e| !below_any(e.name(), dirs));
                let dropped = before - queue.len();
                if dropped > 0 {
                    info!(
                        dropped,
                        "not offered: below a directory the receiver refused"
                    );
                }
                tracker.outcome.skipped += dropped;
                pruned = tracker.refused_dirs.len();
            }
            if below_any(entry.name(), &tracker.refused_dirs) {
                tracker.outcome.skipped += 1;
                unbatched = unbatched.saturating_sub(1);
                continue;
            }
            // Room in the pipeline: wait for the oldest verdicts.
            while !self.session.can_start() {
                fatal(self.expect_nothing(cfg, pipe, tracker, "the receiver's verdicts"))?;
            }
            let entry = if unbatched > 0 {
                unbatched -= 1;
                entry
            } else if batch::batchable(cfg, &entry)
                && !self.batches_refused
                // The session's first file goes alone: its HELLO checks
                // the receiver's version, its MR makes the ring known (a
                // batch is then read while the receiver prepares it).
                && self.session.expected_chunk_len().is_some()
            {
                let mut files = batch::take_batch(cfg, entry, &mut queue);
                if files.len() > 1 {
                    let (batch::Batched::Sent { alone: back } | batch::Batched::Refused(back)) =
                        self.send_batch(cfg, files, pipe, tracker)?;
                    unbatched = back.len();
                    for e in back.into_iter().rev() {
                        queue.push_front(e);
                    }
                    continue;
                }
                match files.pop() {
                    Some(e) => e,
                    None => continue,
                }
            } else {
                entry
            };
            let name = entry.name().to_string();
            let size = entry.size();
            let started = Instant::now();
            match self.send_entry(cfg, entry, pipe, tracker) {
                Ok(()) => {}
                Err(FileError::Continue(e)) => tracker.fail(&name, size, Some(started), e),
                Err(FileError::Fatal(e)) => {
                    // Where the file stood, for whoever reads the logs.
                    info!(
                        file = %escaped(&name),
                        bytes_done = self.session.bytes_planned(),
                        "file abandoned: {e}"
                    );
                    tracker.report(&name, size, Some(started), &e, true);
                    return Err(e);
                }
            }
        }
        while self.session.pending() > 0 {
            fatal(self.expect_nothing(cfg, pipe, tracker, "the receiver's ACK"))?;
        }
        self.close(cfg, pipe, tracker)
    }

    /// Waits for the receiver's greeting: CHALLENGE (answered with AUTH when
    /// it requires authentication; the first HELLO follows without waiting)
    /// or a REJECT that refuses the session.
    fn greet(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        while matches!(
            self.session.state(),
            SenderState::AwaitChallenge | SenderState::AwaitAuthOk
        ) {
            let what = match self.session.state() {
                SenderState::AwaitAuthOk => "the receiver's proof (AUTH_OK)",
                _ => "the receiver's greeting",
            };
            match self.next_event(cfg, pipe, tracker, what)? {
                None => {}
                Some(SenderEvent::Greeted(greeting)) => {
                    if let Some(prove) = greeting.prove {
                        debug!("the receiver requires authentication: PROVE sent");
                        self.control.send(&self.ep, &prove)?;
                    }
                }
                // The channel is installed already (handle_completions).
                Some(SenderEvent::Authenticated) => info!("receiver authenticated"),
                Some(other) => return Err(unexpected(&other)),
            }
        }
        Ok(())
    }

    /// One wait in which only verdicts and credits may arrive.
    fn expect_nothing(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
        what: &str,
    ) -> Result<(), FileError> {
        match self.next_event(cfg, pipe, tracker, what)? {
            None => Ok(()),
            Some(other) => Err(unexpected(&other)),
        }
    }

    fn send_entry(
        &mut self,
        cfg: &SenderConfig,
        entry: Entry,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        let (offer, input) = match entry {
            Entry::Dir { name, mode, mtime } => {
                let offer = FileOffer {
                    resume: false,
                    checksum: false,
                    name: name.clone(),
                    size: 0,
                    mode,
                    digest: cfg.verify,
                    kind: OfferKind::Directory,
                    mtime,
                    keep_mode: cfg.walk.preserve,
                };
                let tag = tracker.tag();
                let hello = self.session.start_file(offer, tag).map_err(proto_err)?;
                self.control.send(&self.ep, &hello)?;
                tracker.pending.insert(
                    tag,
                    PendingEntry::Dir {
                        name,
                        started: Instant::now(),
                    },
                );
                return Ok(());
            }
            Entry::Stdin { name } => {
                use std::os::fd::AsFd;
                let stdin = std::io::stdin().as_fd().try_clone_to_owned().map_err(|e| {
                    FileError::Fatal(XferError::io("cannot read standard input", e))
                })?;
                super::stdio::grow_pipe(&stdin, cfg.chunk_size as usize);
                let offer = FileOffer {
                    resume: false,
                    // Its SHA-256 is not known before its data.
                    checksum: false,
                    name,
                    size: 0,
                    mode: 0o644,
                    digest: cfg.verify,
                    kind: OfferKind::Stream,
                    mtime: None,
                    keep_mode: false,
                };
                (offer, Input::Stream(File::from(stdin)))
            }
            Entry::File {
                path,
                name,
                opened,
                mtime,
                ..
            } => {
                let (offer, file) =
                    open_offer(cfg, &path, name, opened, mtime).map_err(FileError::Continue)?;
                let size = offer.size;
                (offer, Input::File { file, size })
            }
        };
        self.send_data(cfg, offer, input, pipe, tracker)
    }

    /// Handles whatever completions are ready, without blocking. In the
    /// data phase only credits and an abort may arrive.
    fn poll_events(
        &mut self,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let polled = self.ep.poll(&mut wcs, 16);
        let handled = self.handle_completions(&mut wcs, pipe);
        self.wcs = wcs;
        handled?;
        if let Err(e) = polled {
            return Err(self.failure(super::completion_error(&self.ep, e)));
        }
        match self.pop_event(tracker)? {
            None => Ok(()),
            Some(SenderEvent::Aborted(ack)) => {
                Err(FileError::Fatal(ack_error(ack.status, ack.reason)))
            }
            Some(other) => Err(unexpected(&other)),
        }
    }

    /// A completion failed (the receiver went away, typically): if the
    /// receiver told why just before, that is the better error.
    fn failure(&mut self, err: XferError) -> FileError {
        let said = self.events.iter().find_map(|e| match e {
            SenderEvent::Aborted(ack) => Some(ack.clone()),
            _ => None,
        });
        FileError::Fatal(match said {
            Some(ack) => ack_error(ack.status, ack.reason),
            None => err,
        })
    }

    /// The next state machine event that needs the caller, waiting for
    /// completions if none is queued. Verdicts on pending entries go to
    /// `tracker` on the way (then None is returned); so do credits.
    fn next_event(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
        what: &str,
    ) -> Result<Option<SenderEvent>, FileError> {
        if self.events.is_empty() {
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let waited = super::wait_completions(&self.ep, &mut wcs, cfg.timeout, what);
            // Completions polled before a failure still count.
            let handled = self.handle_completions(&mut wcs, pipe);
            self.wcs = wcs;
            handled?;
            if let Err(e) = waited {
                return Err(self.failure(e));
            }
        }
        self.pop_event(tracker)
    }

    fn pop_event(&mut self, tracker: &mut Tracker<'_>) -> Result<Option<SenderEvent>, FileError> {
        while let Some(event) = self.events.pop_front() {
            match event {
                SenderEvent::Answered {
                    tag,
                    entry,
                    verdict,
                } => tracker.answer(tag, entry, verdict)?,
                other => return Ok(Some(other)),
            }
        }
        Ok(None)
    }

    /// Applies completions: slots go back to the reader, messages through
    /// the state machine (its events queue up in `events`, credits apart).
    fn handle_completions(
        &mut self,
        wcs: &mut Vec<Completion>,
        pipe: &mut Pipeline<'_>,
    ) -> Result<(), FileError> {
        for wc in wcs.drain(..) {
            match (WrId::from_raw(wc.wr_id).kind(), wc.opcode) {
                (WrKind::Write, WcOpcode::RdmaWrite) => pipe.write_done(wc)?,
                (WrKind::Send, WcOpcode::Send) => self.control.on_send_done(&self.ep, wc)?,
                (WrKind::Recv, WcOpcode::Recv) => {
                    let msg = self
                        .control
                        .take_message(&self.ep, wc)?
                        .map_err(|undelivered| match undelivered {
                            Undelivered::Wire(source) => XferError::Malformed {
                                from: crate::proto::Role::Receiver,
                                source,
                            },
                            Undelivered::Seal(source) => XferError::Forged {
                                from: crate::proto::Role::Receiver,
                                source,
                            },
                        })?;
                    match self.session.on_message(msg).map_err(proto_err)? {
                        // Already applied by the state machine.
                        SenderEvent::Credit(_) => {}
                        event @ SenderEvent::Authenticated => {
                            // Sealed from the very next message on, in
                            // both directions.
                            let channel = self.session.take_channel().ok_or_else(|| {
                                XferError::Internal("authenticated without a channel".into())
                            })?;
                            self.control.install(channel);
                            self.events.push_back(event);
                        }
                        event => self.events.push_back(event),
                    }
                }
                (kind, opcode) => {
                    return Err(FileError::Fatal(XferError::Internal(format!(
                        "unexpected completion {opcode:?} for a work request of kind {kind:?}"
                    ))));
                }
            }
        }
        Ok(())
    }

    /// Ends the session politely: BYE, wait until it is delivered, disconnect.
    fn close(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), XferError> {
        let bye = self.session.close().map_err(XferError::from)?;
        self.control.send(&self.ep, &bye)?;
        while self.control.busy() {
            match self.expect_nothing(cfg, pipe, tracker, "delivery of BYE") {
                Ok(()) => {}
                // Every entry was answered already; a receiver that closes
                // on BYE may tear the connection down before our send
                // completes.
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

/// Opens a file to send (unless it was opened already) and makes its
/// offer from what it is now: size and mode as measured, a regular file
/// still.
fn open_offer(
    cfg: &SenderConfig,
    path: &std::path::Path,
    name: String,
    opened: Option<File>,
    mtime: Option<crate::proto::Mtime>,
) -> Result<(FileOffer, File), XferError> {
    let cannot = |what: &str, e| XferError::io(format!("{what} {}", path.display()), e);
    let file = match opened {
        Some(f) => f,
        None => File::open(path).map_err(|e| cannot("cannot open", e))?,
    };
    let meta = file.metadata().map_err(|e| cannot("cannot stat", e))?;
    if !meta.is_file() {
        return Err(XferError::Usage(format!(
            "{} is no longer a regular file",
            path.display()
        )));
    }
    let offer = FileOffer {
        resume: cfg.resume,
        checksum: cfg.checksum,
        name,
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        digest: cfg.verify,
        kind: OfferKind::File,
        mtime,
        keep_mode: cfg.walk.preserve,
    };
    Ok((offer, file))
}

fn proto_err(e: ProtocolError) -> FileError {
    FileError::Fatal(match e {
        ProtocolError::AuthFailed { reason } => auth_error(&reason),
        e @ (ProtocolError::NoAuthRequested | ProtocolError::ReceiverProofFailed) => {
            XferError::Auth(format!(
                "authentication failed: {e}; check that --token-file or RDMA_XFER_TOKEN gives \
                 both hosts the same token"
            ))
        }
        ProtocolError::VersionMismatch { detail } => XferError::Rejected {
            code: Some(crate::proto::RejectCode::Version),
            reason: detail,
        },
        ProtocolError::Refused { code, reason } => XferError::Rejected {
            code: Some(code),
            reason,
        },
        other => XferError::from(other),
    })
}

/// The receiver refused our AUTH (REJECT with code Auth and `reason`).
fn auth_error(reason: &str) -> XferError {
    let said = crate::proto::AuthFailure::from_reason(reason).map_or(reason, |f| f.detail());
    XferError::Auth(format!(
        "authentication failed: the receiver says {said:?}; check that --token-file or \
         RDMA_XFER_TOKEN gives both hosts the same token"
    ))
}

fn unexpected(event: &SenderEvent) -> FileError {
    FileError::Fatal(XferError::Internal(format!("unexpected event {event:?}")))
}

fn ack_error(status: AckStatus, reason: String) -> XferError {
    match status {
        AckStatus::Ok => XferError::Internal("an abort with status ok".into()),
        AckStatus::Integrity => XferError::Integrity(format!("the receiver reports: {reason}")),
        AckStatus::Io => XferError::PeerIo(reason),
        // The receiver refuses with an ACK (not a REJECT) only for a size
        // beyond its limits, found once the bytes are coming.
        AckStatus::Rejected => XferError::Rejected {
            code: Some(crate::proto::RejectCode::TooLarge),
            reason,
        },
        AckStatus::Protocol => XferError::PeerReported {
            from: crate::proto::Role::Receiver,
            reason,
        },
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn retries_pause_longer_each_time_up_to_30_s() {
        let pauses: Vec<u64> = (1..=8).map(|n| super::retry_pause(n).as_secs()).collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30]);
    }

    #[test]
    fn below_a_refused_directory_is_by_path_component() {
        let dirs = vec!["repo/.git".to_string()];
        assert!(super::below_any("repo/.git/HEAD", &dirs));
        assert!(super::below_any("repo/.git/objects/ab/cd", &dirs));
        assert!(!super::below_any("repo/.git", &dirs));
        assert!(!super::below_any("repo/.gitignore", &dirs));
        assert!(!super::below_any("repo/src/x", &dirs));
        assert!(!super::below_any("repo/.git", &[]));
    }
}
