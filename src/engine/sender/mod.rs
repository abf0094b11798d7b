//! Sender: connects, then for each entry HELLO -> MR -> WRITE_WITH_IMM
//! chunks (at most `depth` in flight and never more than the granted
//! credits) -> FIN, or for a directory just its HELLO; finally BYE. Entries
//! are pipelined: the next HELLO goes out right after a FIN, and the
//! receiver's verdicts (ACK, or REJECT for a directory) are collected as
//! they arrive, up to `proto::MAX_PENDING` of them outstanding.

mod batch;
mod connection;
mod have;
mod have_read;
#[cfg(test)]
mod have_transfers;
#[cfg(test)]
mod lane_transfers;
pub mod lanes;
mod member;
#[cfg(test)]
mod memory_transfers;
mod pace;
mod pump;
#[cfg(test)]
mod relay_transfers;
mod relayed;
#[cfg(test)]
mod rerun_transfers;
mod verdicts;

pub use batch::Feed;
use connection::Connection;
pub use pace::MIN_BWLIMIT;

use crate::engine::DEFAULT_TIMEOUT;
use crate::engine::entries::{self, Entry, WalkOptions};
use crate::engine::fit::{Buffers, Given, Overhead, Pool, fit_to_memlock};
use crate::engine::progress::ProgressSink;
use crate::engine::reader::Reader;
use crate::engine::report::{FileEvent, FileFailure, FileReport};
use crate::error::XferError;
use crate::proto::{
    AckFailure, DigestAlg, FailedAck, FileOffer, OfferKind, ProtocolError, SenderEvent, Token,
};
use crate::sys::SysError;
use crate::sys::rdma::{Buffer, BufferPool, probe_devices};
use pump::Pipeline;
use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::{Duration, Instant};
use tracing::{error_span, info, warn};
use verdicts::Tracker;

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
    /// What the receiver does with a file it has under the name
    /// (--ignore-times, --ignore-existing, --update).
    pub existing: crate::proto::WhenExisting,
    /// `--dry-run`: every offer checked by the receiver as a real run's
    /// would be, nothing sent or written (`SenderSession::dry_run`).
    pub dry_run: bool,
    /// After a failure that may be transient (`XferError::is_transient`),
    /// connect again this many times at most (with a growing pause) and
    /// send what was not acknowledged yet.
    pub retries: u32,
    /// `--bwlimit`: the session's data in bytes per second at most.
    pub bwlimit: Option<u64>,
    /// `--lanes`: big files in pieces over this many sessions at once
    /// (`lanes::send_striped`); 1: every file whole, in one session.
    pub lanes: u32,
    /// `--rails`: the receiver's other addresses, one per rail; lane i
    /// goes to rail i mod (1 + rails) (0: `addr`, from `source`).
    pub rails: Vec<(Option<IpAddr>, IpAddr)>,
    /// This session is a lane (`lanes::send_striped`): it probes its path
    /// while a piece waits for credit (`SenderSession::probing`).
    pub lane: bool,
    /// `--relay`: a chain of receivers, as the user named them; the first
    /// is `addr`, and each forwards what it receives to the next. Each
    /// host's result comes back per file (`FileReport::host`). Empty: the
    /// receiver at `addr` alone.
    pub relay: Vec<String>,
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
            // Times travel: a re-run finds them (the receiver's quick
            // check).
            walk: WalkOptions {
                times: true,
                ..WalkOptions::default()
            },
            progress: ProgressSink::default(),
            resume: false,
            checksum: false,
            existing: crate::proto::WhenExisting::QuickCheck,
            dry_run: false,
            retries: 0,
            bwlimit: None,
            lanes: 1,
            rails: Vec::new(),
            lane: false,
            relay: Vec::new(),
        }
    }
}

pub use super::entries::DEFAULT_STDIN_NAME;

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
    fit_staging_as(cfg, Pool::Staging)
}

/// `fit_staging` for buffers of `pool`.
fn fit_staging_as(cfg: &SenderConfig, pool: Pool) -> Result<SenderConfig, XferError> {
    let asked = Buffers {
        count: cfg.depth,
        chunk_size: cfg.chunk_size,
    };
    let overhead = Overhead::control((RECV_BUFFERS + SEND_BUFFERS) as u64, 0);
    let fitted = fit_to_memlock(pool, asked, cfg.given, overhead)?;
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
    let striping = cfg.lanes > 1
        && !cfg.resume
        && !cfg.checksum
        && !cfg.dry_run
        && cfg.bwlimit.is_none()
        && cfg.relay.is_empty();
    if !striping {
        return send_files_but(cfg, paths, HashSet::new(), on_file);
    }
    // Big files go in pieces over the lanes. Lane 0's session first
    // offers the rest (their directories first), then carries pieces like
    // the others, which start once it answered its own: one session runs
    // from first to last (a receiver with --once serves the sessions that
    // join it meanwhile).
    let started = Instant::now();
    let mut plan = entries::plan(paths, &cfg.walk)?;
    let big = lanes::striped_files(&plan.entries, cfg.walk.preserve, cfg.existing);
    if big.is_empty() {
        return send_files_but(cfg, paths, HashSet::new(), on_file);
    }
    let names: HashSet<&str> = big.iter().map(|f| f.name.as_str()).collect();
    plan.entries.retain(|e| !names.contains(e.name()));
    // The walk's problems are the run's first error; lane 0's session
    // sees refusals of pieces too, which are the dispatcher's to judge.
    let problem = std::mem::take(&mut plan.problems).into_iter().next();
    let first_own = !plan.entries.is_empty();
    let own = std::sync::Mutex::new(Some(plan));
    let own_outcome = std::sync::Mutex::new(None);
    // Fitted once for all lanes (an Nth of the memlock room each): a
    // lane starting later must not find the room the first ones took.
    let fitted = SenderConfig {
        lane: true,
        ..fit_staging_as(cfg, Pool::LaneStaging(cfg.lanes))?
    };
    let run_lane: &lanes::RunLane<'_> = &|lane, feed, on_piece| {
        let rail = (lane % (1 + cfg.rails.len() as u64)) as usize;
        let on_rail;
        let lane_cfg = match rail.checked_sub(1).and_then(|r| cfg.rails.get(r)) {
            // Another address of the receiver, from the rail's source (or
            // the route's).
            Some((source, addr)) => {
                on_rail = SenderConfig {
                    addr: SocketAddr::new(*addr, cfg.addr.port()),
                    source: *source,
                    ..fitted.clone()
                };
                info!(lane, rail = %addr, "lane on its rail");
                &on_rail
            }
            None => &fitted,
        };
        let plan = match lane {
            0 => own.lock().ok().and_then(|mut p| p.take()),
            _ => None,
        };
        let offers = Offers {
            plan: plan.unwrap_or_default(),
            feed: Some(feed),
        };
        let (outcome, ended) = match session_of(lane_cfg, offers, on_piece) {
            Ok(outcome) => (outcome, None),
            Err(SessionEnded(ended)) => (ended.1, Some(ended.0)),
        };
        if lane == 0
            && let Ok(mut o) = own_outcome.lock()
        {
            *o = Some(outcome);
        }
        match ended {
            Some(e) => Err(e),
            None => Ok(SessionOutcome::default()),
        }
    };
    let lanes_of = (cfg.lanes, fitted.chunk_size, cfg.verify);
    let mut files = Vec::new();
    let mut first_error = None;
    let progress = &cfg.progress;
    let result = lanes::send_striped(big, lanes_of, first_own, progress, run_lane, &mut |event| {
        match event {
            FileEvent::Done(r) => files.push(r.clone()),
            FileEvent::Failed(f) => {
                first_error.get_or_insert_with(|| error_of(f));
            }
        }
        on_file(event);
    });
    let mut outcome = own_outcome.into_inner().ok().flatten().unwrap_or_default();
    // A fed session keeps no reports: they came to `on_file`.
    outcome.files = files;
    outcome.first_error = problem.or(first_error);
    outcome.elapsed = started.elapsed();
    result.map(|()| outcome)
}

/// A file's failure as the run's error, its exit code kept: a digest
/// that did not match is an integrity failure, a refusal a refusal.
fn error_of(f: &crate::engine::report::FileFailure) -> XferError {
    let reason = format!("{}: {}", crate::proto::escaped(&f.name), f.reason);
    match f.exit_code {
        crate::error::ExitCode::Integrity => XferError::Integrity(reason),
        crate::error::ExitCode::Rejected => XferError::Rejected {
            code: f.reason_code.and_then(crate::proto::RejectCode::from_slug),
            reason,
        },
        _ => XferError::io(&f.name, std::io::Error::other(f.reason.clone())),
    }
}

/// `send_files` of every entry but those named in `settled` (sent in
/// pieces over lanes).
fn send_files_but(
    cfg: &SenderConfig,
    paths: &[PathBuf],
    mut settled: HashSet<String>,
    mut on_file: impl FnMut(FileEvent<'_>),
) -> Result<SessionOutcome, XferError> {
    let started = Instant::now();
    let cfg = &fit_staging(cfg)?;
    // A batch keeps its files open until its data is sent.
    crate::sys::os::raise_open_files();
    let mut total = SessionOutcome::default();
    let mut retry = 0;
    // Failures of files cut short by a session's end, by host (over a
    // relay chain) and name: reported only if no later session settles
    // them.
    let mut cut_short: BTreeMap<(Option<String>, String), FileFailure> = BTreeMap::new();
    loop {
        let mut now_settled = Vec::new();
        let (mut outcome, ended_by) = run_session(cfg, paths, &settled, |event| match event {
            FileEvent::Failed(f) if f.session_ended && retry < cfg.retries => {
                cut_short.insert((f.host.clone(), f.name.clone()), f.clone());
            }
            FileEvent::Done(FileReport { name, host, .. })
            | FileEvent::Failed(FileFailure { name, host, .. }) => {
                cut_short.remove(&(host.clone(), name.clone()));
                now_settled.push(name.clone());
                on_file(event);
            }
        });
        // Over a chain, a file some hosts have while another lost it by
        // the session's end is settled (not offered again): that host's
        // failure is said now, and counts.
        let orphaned: Vec<_> = cut_short
            .keys()
            .filter(|(_, name)| now_settled.contains(name))
            .cloned()
            .collect();
        for key in orphaned {
            if let Some(mut f) = cut_short.remove(&key) {
                f.session_ended = false;
                on_file(FileEvent::Failed(&f));
                outcome
                    .first_error
                    .get_or_insert_with(|| XferError::Remote {
                        host: f.host.clone().unwrap_or_default(),
                        code: f.exit_code,
                        message: format!("{}: {}", crate::proto::escaped(&f.name), f.reason),
                    });
            }
        }
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
            paths.iter().any(|p| p.as_os_str() == "-") && !settled.contains(cfg.walk.stdin_name());
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
    on_file: impl FnMut(FileEvent<'_>),
) -> Result<SessionOutcome, SessionEnded> {
    let mut plan = entries::plan(paths, &cfg.walk)?;
    plan.entries
        .retain(|e| matches!(e, Entry::Dir { .. }) || !settled.contains(e.name()));
    session_of(cfg, plan.into(), on_file)
}

/// Sends the entries `feed` hands over, in one session, as they are (a
/// relay hop's offers to the next host), until the feed hangs up: no
/// retries, `cfg` fitted to the memlock limit first.
pub fn send_fed(
    cfg: &SenderConfig,
    feed: Feed,
    on_file: impl FnMut(FileEvent<'_>),
) -> Result<SessionOutcome, XferError> {
    let cfg = &fit_staging(cfg)?;
    let offers = Offers {
        plan: entries::Plan {
            entries: Vec::new(),
            problems: Vec::new(),
            skipped: 0,
        },
        feed: Some(feed),
    };
    session_of(cfg, offers, on_file).map_err(|SessionEnded(ended)| {
        let (e, outcome) = *ended;
        // What the session reported before it ended stands; the error
        // is the session's.
        drop(outcome);
        e
    })
}

/// What a session offers: the entries planned before it starts, and
/// those a feed hands over while it runs.
struct Offers {
    plan: entries::Plan,
    feed: Option<Feed>,
}

impl From<entries::Plan> for Offers {
    fn from(plan: entries::Plan) -> Self {
        Offers { plan, feed: None }
    }
}

/// One session sending `offers`.
fn session_of(
    cfg: &SenderConfig,
    offers: Offers,
    on_file: impl FnMut(FileEvent<'_>),
) -> Result<SessionOutcome, SessionEnded> {
    let (files, bytes) = offers.plan.files_and_bytes();
    cfg.progress.planned(files, bytes);
    let devices = probe_devices().map_err(XferError::from)?;
    tracing::info!("RDMA devices: {}", devices.join(", "));
    let span = error_span!("session", peer = %cfg.addr);
    let _enter = span.enter();
    let started = Instant::now();
    // `drive` ends `conn` before the pool goes; a slot still posted would
    // keep its memory registered and allocated until the QP is destroyed.
    let (conn, (pool, tokens)) = Connection::open(cfg)?;
    drive(cfg, offers, conn, &pool, tokens, on_file, started)
}

/// Runs the session of `offers` over `conn`, the reader thread filling
/// `pool`'s slots (`tokens`, one per slot) as their writes complete.
fn drive(
    cfg: &SenderConfig,
    offers: Offers,
    mut conn: Connection,
    pool: &BufferPool,
    tokens: Vec<Buffer>,
    mut on_file: impl FnMut(FileEvent<'_>),
    started: Instant,
) -> Result<SessionOutcome, SessionEnded> {
    let Offers { plan, feed } = offers;
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
        let spawned = std::thread::Builder::new()
            .name("reader".into())
            .spawn_scoped(scope, move || reader.run());
        if let Err(e) = spawned {
            conn.abort();
            let e = XferError::io("cannot start the reader thread", e);
            return Err(SessionEnded::from(e));
        }
        let mut pipe = Pipeline {
            pool,
            jobs: job_tx,
            free: free_tx,
            filled: out_rx,
            depth: cfg.depth as usize,
            posted: 0,
            held: std::collections::VecDeque::new(),
            arrived: None,
            stop: &stop,
        };
        let mut tracker = Tracker {
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
            chain: relayed::Chain::new(cfg.relay.clone()),
            // A fed session's owner has each report (`on_file`): a session
            // fed for long keeps none of them.
            keeps_reports: feed.is_none(),
        };
        conn.watch = feed.as_ref().and_then(|f| f.watch.clone());
        if let Some(watch) = &conn.watch {
            watch.connected(Instant::now());
        }
        let queue = batch::Queue::new(plan.entries, feed);
        let result = conn.run(cfg, queue, &mut pipe, &mut tracker);
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
        existing: cfg.existing,
        name,
        size: meta.len(),
        mode: meta.permissions().mode() & 0o7777,
        digest: cfg.verify,
        kind: OfferKind::File,
        mtime,
        keep_mode: cfg.walk.preserve,
        piece: None,
    };
    Ok((offer, file))
}

fn proto_err(e: ProtocolError) -> FileError {
    FileError::Fatal(match e {
        ProtocolError::AuthFailed { reason } => auth_error(&reason),
        // The receiver went silent: transient, as a lost peer.
        e @ ProtocolError::NoProgress { .. } => XferError::PeerLost(e.to_string()),
        e @ (ProtocolError::NoAuthRequested | ProtocolError::ReceiverProofFailed) => {
            XferError::Auth(format!(
                "authentication failed: {e}; check that --token-file or RDMA_XFER_TOKEN gives \
                 both hosts the same token"
            ))
        }
        ProtocolError::OlderReceiver { lacks, detail } => XferError::Rejected {
            code: Some(crate::proto::RejectCode::Version),
            reason: verdicts::older_receiver(lacks, &detail),
        },
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

fn unexpected(event: &SenderEvent<verdicts::PendingEntry>) -> FileError {
    FileError::Fatal(XferError::Internal(format!("unexpected event {event:?}")))
}

/// The error an ACK that failed a file stands for.
fn ack_error(failed: FailedAck) -> XferError {
    let reason = failed.reason;
    match failed.failure {
        AckFailure::Integrity => XferError::Integrity(format!("the receiver reports: {reason}")),
        AckFailure::Io => XferError::PeerIo(reason),
        // The receiver refuses with an ACK (not a REJECT) only for a size
        // beyond its limits, found once the bytes are coming.
        AckFailure::Rejected => XferError::Rejected {
            code: Some(crate::proto::RejectCode::TooLarge),
            reason,
        },
        AckFailure::Protocol => XferError::PeerReported {
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
