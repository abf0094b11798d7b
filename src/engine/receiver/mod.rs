//! Receiver: listens, and per session answers each HELLO with the ring (or a
//! REJECT), checks and writes every chunk the sender RDMA-writes into the
//! ring, returns credits, and on FIN verifies, fsyncs and renames before the
//! ACK. A directory HELLO is answered by creating the directory (ACK) or a
//! REJECT. Paths inside --dir are resolved component by component without
//! following links; with --stdout the one file or stream goes to standard
//! output instead, with --discard nowhere (checked and verified only), and
//! with --exec to a command per file.

mod admission;
mod allow;
mod config;
mod session;
#[cfg(test)]
pub(in crate::engine) use session::tests::{Reported, reported, sender_auth, serve as serve_over};
pub mod storage;

pub use allow::AllowedNet;
use config::said_upstream;
pub use config::{Output, ReceiverConfig};

use crate::engine::control::Control;
use crate::engine::fit::{Buffers, Overhead, Pool, fit_to_memlock};
use crate::engine::progress::Listening;
use crate::engine::report::FileEvent;
use crate::error::XferError;
use crate::proto::{
    AUTH_TIMEOUT, Busy, Message, NONCE_LEN, NameRules, ReceiverConfig as MachineConfig,
    ReceiverSession, busy_refusal,
};
use crate::sys::SysError;
use crate::sys::os::shutdown_requested;
use crate::sys::rdma::{CmId, Endpoint, EventChannel, IncomingConnection, QpCaps, probe_devices};
use admission::{Admission, HANDSHAKE_PER_ADDRESS, HANDSHAKE_POOL, HandshakePool, SessionSlots};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};
use storage::space::SpaceLedger;
use tracing::{debug, error_span, info, warn};

/// Default of --partial-ttl: a day.
pub const DEFAULT_PARTIAL_TTL: Duration = Duration::from_secs(24 * 3600);

/// Writer threads per session by default (`write_behind`): none. Measured
/// (docs/performance.md, `--threads`): writer threads pay only where the
/// session's own per-byte work is heavy (SHA-256); with CRC32 the hand-off
/// to another core costs more than the write it takes away, and writes to
/// one file do not run in parallel (the file system locks the inode).
pub const DEFAULT_WRITER_THREADS: u16 = 0;

/// How often a serving receiver looks for old partial files (sessions
/// may run meanwhile: what they use is spared, see `partial::sweep`).
const SWEEP_EVERY: Duration = Duration::from_secs(600);

/// Default of --max-sessions.
pub const DEFAULT_MAX_SESSIONS: usize = 8;

/// Control messages the receiver may have outstanding at once from the
/// sender besides the data writes: a pipelining sender has up to
/// `proto::MAX_PENDING` entries unanswered, plus a HELLO, a BYE, a KEEPALIVE.
const CONTROL_RECVS: u32 = crate::proto::MAX_PENDING as u32 + 8;
const SEND_BUFFERS: usize = 16;

/// `cfg` with a ring that fits the memlock limit, before listening (see
/// `fit::fit_to_memlock`). One session's: a further session at once
/// that cannot register its ring is refused with the limit's numbers.
fn fit_ring(cfg: &ReceiverConfig) -> Result<ReceiverConfig, XferError> {
    let asked = Buffers {
        count: cfg.slots,
        chunk_size: cfg.chunk_size,
    };
    // Every slot has a receive posted for its write, besides the control
    // receives and sends.
    let messages = u64::from(CONTROL_RECVS) + SEND_BUFFERS as u64;
    let overhead = Overhead::control(messages, 1);
    // A host of a relay chain also registers the staging of its session
    // to the next host.
    let pool = match cfg.relay || cfg.relay_keys.is_some() {
        true => Pool::RelayRing,
        false => Pool::Ring,
    };
    let fitted = fit_to_memlock(pool, asked, cfg.given, overhead)?;
    Ok(ReceiverConfig {
        slots: fitted.count,
        chunk_size: fitted.chunk_size,
        ..cfg.clone()
    })
}

/// Called for every file a sender offered: after it was committed, or when
/// it failed (refused, failed its check, or cut short by the session's end).
pub type OnFile<'a> = dyn Fn(FileEvent<'_>) + Sync + 'a;

/// Serves sessions, each on its own thread, until SIGINT/SIGTERM; with
/// `once`, exactly one session (whose status is then returned).
pub fn serve(cfg: &ReceiverConfig, on_file: &OnFile<'_>) -> Result<(), XferError> {
    // Every session may hold a batch's files open at once.
    let open_files = crate::sys::os::raise_open_files();
    tracing::debug!(?open_files, "open files limit");
    if cfg.output == Output::Stdout && !cfg.once {
        return Err(XferError::Usage(
            "--stdout needs --once: standard output takes one file or stream".into(),
        ));
    }
    if matches!(cfg.output, Output::Dir | Output::Exec(_)) {
        let dir_meta = std::fs::metadata(&cfg.dir)
            .map_err(|e| XferError::io(format!("output directory {}", cfg.dir.display()), e))?;
        if !dir_meta.is_dir() {
            return Err(XferError::Usage(format!(
                "{} is not a directory",
                cfg.dir.display()
            )));
        }
    }
    if matches!(cfg.output, Output::Exec(_)) || cfg.relay_keys.is_some() {
        // The commands run as the receiver's user: without this they could
        // read its memory and environment (the token) in /proc/PPID/mem
        // and /proc/PPID/environ, or ptrace it. A relay hop holds the
        // tokens of the hosts after it: the same goes for any process of
        // the ssh user there.
        crate::sys::os::set_not_dumpable().map_err(|e| {
            XferError::io(
                "cannot make the receiver non-dumpable (PR_SET_DUMPABLE), which keeps its --exec commands and the user's other processes out of its memory",
                e,
            )
        })?;
    }
    let devices = probe_devices()?;
    info!("RDMA devices: {}", devices.join(", "));
    let cfg = &fit_ring(cfg)?;
    let channel = EventChannel::new()?;
    let listener = CmId::new(&channel)?;
    listener.listen(cfg.bind, 64)?;
    let started = Instant::now();
    // With port 0 the CM chose one: say the real one.
    let bound = listener.local_addr().unwrap_or(cfg.bind);
    info!(bind = %bound, dir = %cfg.dir.display(), max_sessions = cfg.max_sessions, "listening");
    // The directory as an absolute path: what the user sees is where files go.
    let shown_dir = std::fs::canonicalize(&cfg.dir).unwrap_or(cfg.dir.clone());
    // Without a token, the listening line says who may do what here.
    let unauthenticated = cfg.token.is_none().then(|| {
        let who = if cfg.allow.is_empty() {
            "anyone who can reach this port".to_string()
        } else {
            let nets: Vec<String> = cfg.allow.iter().map(ToString::to_string).collect();
            format!("anyone from {}", nets.join(", "))
        };
        let what = match &cfg.output {
            Output::Dir => format!("write into {}", shown_dir.display()),
            Output::Stdout => "write to standard output".to_string(),
            Output::Discard => "send data to be verified and dropped".to_string(),
            Output::Exec(cmd) => format!(
                "run `{cmd}` in {} on data and names of their choosing",
                shown_dir.display()
            ),
        };
        format!("{who} may {what}")
    });
    cfg.progress.listening(&Listening {
        bind: bound,
        device: listener.bound_device(),
        devices,
        output: cfg.output.describe(&shown_dir),
        output_name: cfg.output.json_name(&shown_dir),
        unauthenticated,
    });
    // --once serves one sender: its first session and those that join
    // it while it runs (its lanes); with --stdout, one session alone
    // (standard output takes one file).
    let joins = cfg.output != Output::Stdout;
    let slots = SessionSlots::new(if cfg.once && !joins {
        1
    } else {
        cfg.max_sessions
    });
    #[cfg(feature = "fault-injection")]
    let pool_size = crate::engine::fault::handshake_pool(HANDSHAKE_POOL);
    #[cfg(not(feature = "fault-injection"))]
    let pool_size = HANDSHAKE_POOL;
    let handshakes = HandshakePool::new(pool_size, HANDSHAKE_PER_ADDRESS);
    let refusals = AtomicUsize::new(0);
    let next_id = AtomicU64::new(1);
    let ledger = Arc::new(SpaceLedger::default());
    // --once: the first session admitted (0: none yet), as the sessions
    // see it: those admitted after it join it, and carry pieces only
    // (`Session::joined`).
    let first = &AtomicU64::new(0);
    // --once: the sessions tell the listener when one is admitted and when
    // they end; the first admitted session's end is the receiver's.
    let (report_tx, reports) = mpsc::channel::<SessionReport>();
    let report_tx = cfg.once.then_some(report_tx);
    // How long the listener waits for a request before it looks again at
    // the shutdown flag and (--once) at the sessions' reports.
    let poll = if cfg.once {
        Duration::from_millis(50)
    } else {
        Duration::from_millis(500)
    };
    std::thread::scope(|scope| {
        // The sweeper stops when this is dropped: when the listener returns.
        let (_sweeping, stop_sweeping) = mpsc::channel::<()>();
        // Only a tree holds partial and temporary files.
        if cfg.output == Output::Dir && cfg.sweep {
            let spawned = std::thread::Builder::new()
                .name("sweep".into())
                .spawn_scoped(scope, move || sweep_periodically(cfg, &stop_sweeping));
            if let Err(e) = spawned {
                warn!("cannot start the thread that removes old partial files: {e}");
            }
        }
        // --once: the first admitted session, the admitted sessions still
        // running (the first and those that joined it: a sender's lanes),
        // and the first one's result.
        let mut admitted: Option<u64> = None;
        let mut running: HashSet<u64> = HashSet::new();
        let mut first_result: Option<Result<(), XferError>> = None;
        // The sender ended well if one of its sessions did: a lane it
        // gave up (its first among them) fails here, not there.
        let mut one_ended_well = false;
        loop {
            // Files in pieces no lane brings any more go (`ASSEMBLY_IDLE`).
            cfg.pieces.sweep(Instant::now());
            if cfg.once {
                while let Ok(report) = reports.try_recv() {
                    match report {
                        SessionReport::Admitted(id) => {
                            admitted = admitted.or(Some(id));
                            running.insert(id);
                        }
                        SessionReport::Ended { id, result } if running.remove(&id) => {
                            one_ended_well |= result.is_ok();
                            if Some(id) == admitted {
                                first_result = Some(result);
                            } else if let Err(e) = result {
                                warn!("session {id} (joining the first) ended: {e}");
                            }
                        }
                        SessionReport::Ended { .. } if admitted.is_none() => {
                            info!("no authenticated session yet: waiting for the next connection")
                        }
                        SessionReport::Ended { .. } => {}
                    }
                }
                if let Some(id) = admitted
                    && !joins
                {
                    // Take no more connections; stop the handshakes; the
                    // admitted session's end is the receiver's.
                    handshakes.evict_all();
                    return match first_result.take() {
                        Some(result) => result,
                        None => wait_for_end(&reports, id),
                    };
                }
                if admitted.is_some() && running.is_empty() {
                    // The sender's last session ended: take no more
                    // connections, stop the handshakes; the first
                    // session's result is the receiver's, unless another
                    // ended well (the sender gave the first up as a lane).
                    handshakes.evict_all();
                    return match first_result {
                        Some(Err(e)) if one_ended_well => {
                            warn!("the first session ended so, the sender's others well: {e}");
                            Ok(())
                        }
                        result => result.unwrap_or(Ok(())),
                    };
                }
                if admitted.is_none()
                    && let Some(wait) = cfg.wait
                    && started.elapsed() >= wait
                {
                    handshakes.evict_all();
                    return Err(SysError::Timeout {
                        what: "a sender to connect (--wait)".into(),
                        after: wait,
                    }
                    .into());
                }
            }
            if shutdown_requested() {
                let running = slots.running();
                let authenticating = handshakes.len();
                info!(
                    running,
                    authenticating, "shutting down (running sessions end first)"
                );
                handshakes.evict_all();
                return Ok(());
            }
            let request = match listener.get_request(poll) {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(SysError::Interrupted) => continue,
                Err(e) => return Err(e.into()),
            };
            let from = request.peer_addr().map(|a| a.ip());
            let peer = from.map_or_else(|| "an unknown address".into(), |a| a.to_string());
            if !allow::is_allowed(&cfg.allow, from) {
                // Refused by the CM: not a byte of ours reaches the peer.
                warn!("refused a connection from {peer}: not in --allow");
                request.reject();
                continue;
            }
            // With a token, a connection waits for its proof in the
            // handshake pool, not in a session slot; the handshake's clock
            // starts with the request.
            let deadline = Instant::now() + AUTH_TIMEOUT;
            let ticket = match cfg.token.is_some().then(|| handshakes.enter(from)) {
                None => None,
                Some(Ok(ticket)) => Some(ticket),
                Some(Err(full)) => {
                    warn!("refused a connection from {peer}: {full}");
                    request.reject();
                    continue;
                }
            };
            let conn = match request.detach() {
                Ok(c) => c,
                Err(e) => {
                    warn!("cannot take an incoming connection: {e}");
                    continue;
                }
            };
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            let span = error_span!("session", id, peer = %peer);
            let mut admission = match ticket {
                Some(ticket) => Admission::Pending {
                    ticket,
                    slots: &slots,
                    deadline,
                },
                None => match slots.take_unauthenticated(from) {
                    Ok(slot) => {
                        if cfg.once {
                            admitted = admitted.or(Some(id));
                            running.insert(id);
                            let _ =
                                first.compare_exchange(0, id, Ordering::Relaxed, Ordering::Relaxed);
                        }
                        Admission::Admitted { _slot: slot }
                    }
                    Err(busy) => {
                        refuse_busy_unauthenticated(scope, cfg, conn, span, &refusals, id, busy);
                        continue;
                    }
                },
            };
            let ledger = &ledger;
            let report = report_tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("session-{id}"))
                .spawn_scoped(scope, move || {
                    let _enter = span.enter();
                    let on_admitted = || {
                        if let Some(r) = &report {
                            let _ =
                                first.compare_exchange(0, id, Ordering::Relaxed, Ordering::Relaxed);
                            let _ = r.send(SessionReport::Admitted(id));
                        }
                    };
                    let joined = || cfg.once && first.load(Ordering::Relaxed) != id;
                    let once: (&dyn Fn(), &dyn Fn() -> bool) = (&on_admitted, &joined);
                    let result = run_logged(cfg, conn, on_file, ledger, &mut admission, once);
                    match &report {
                        // --once: the listener returns (or reports) it.
                        Some(r) => {
                            let _ = r.send(SessionReport::Ended { id, result });
                        }
                        None => {
                            if let Err(e) = result {
                                said_upstream!(
                                    cfg,
                                    else error,
                                    "session {id} from {peer} failed: {e}"
                                );
                            }
                        }
                    }
                });
            if let Err(e) = spawned {
                warn!("cannot start a session thread: {e}");
                running.remove(&id);
                if admitted == Some(id) {
                    admitted = None;
                }
            }
        }
    })
}

/// The first of `candidates` that belongs to an RDMA device (a CM id
/// binds to it and finds its device), for a receiver that was not told
/// where to listen (`--ssh-session`). No device at all is exit 8, as is
/// a host whose devices have none of these addresses.
pub fn first_rdma_address(candidates: &[std::net::IpAddr]) -> Result<std::net::IpAddr, XferError> {
    probe_devices()?;
    let channel = EventChannel::new()?;
    for &ip in candidates {
        let probe = CmId::new(&channel)?;
        match probe.listen(SocketAddr::new(ip, 0), 1) {
            Ok(()) if probe.bound_device().is_some() => return Ok(ip),
            Ok(()) => debug!(%ip, "binds to no RDMA device"),
            Err(e) => debug!(%ip, "not an RDMA address: {e}"),
        }
    }
    let tried: Vec<String> = candidates.iter().map(ToString::to_string).collect();
    Err(SysError::NotRdmaAddress(format!(
        "none of this host's addresses towards the sender belongs to an RDMA device (tried: {}); \
         give the sender --remote-bind ADDR",
        if tried.is_empty() {
            "none found".to_string()
        } else {
            tried.join(", ")
        }
    ))
    .into())
}

/// Removes old partial files (see `partial::sweep`) at start-up and, unless
/// --once, every `SWEEP_EVERY` (or --partial-ttl if shorter), on its own
/// thread: a large tree delays neither connections nor sessions. Returns
/// when `stop`'s sender is dropped, a sweep under way included.
fn sweep_periodically(cfg: &ReceiverConfig, stop: &mpsc::Receiver<()>) {
    let go_on =
        || matches!(stop.try_recv(), Err(mpsc::TryRecvError::Empty)) && !shutdown_requested();
    loop {
        match crate::sys::dirfd::DirFd::open(&cfg.dir) {
            Ok(root) => {
                let swept = storage::partial::sweep(
                    &root,
                    cfg.partial_ttl,
                    std::time::SystemTime::now(),
                    &go_on,
                );
                debug!(
                    removed = swept.removed,
                    kept = swept.kept,
                    "looked for old partial files"
                );
            }
            Err(e) => warn!(dir = %cfg.dir.display(), "cannot look for old partial files: {e}"),
        }
        if cfg.once {
            return;
        }
        match stop.recv_timeout(SWEEP_EVERY.min(cfg.partial_ttl)) {
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            _ => return,
        }
    }
}

/// What a session thread tells the listener under --once.
enum SessionReport {
    /// The sender proved the token (or needed not): this is the session.
    Admitted(u64),
    /// The session ended so.
    Ended {
        id: u64,
        result: Result<(), XferError>,
    },
}

/// --once: waits for session `id` to end and returns its result.
fn wait_for_end(reports: &mpsc::Receiver<SessionReport>, id: u64) -> Result<(), XferError> {
    for report in reports.iter() {
        if let SessionReport::Ended { id: ended, result } = report
            && ended == id
        {
            return result;
        }
    }
    Err(XferError::Internal(format!(
        "session {id} ended without a report"
    )))
}

/// No session slot for this connection, which has nothing to prove (no
/// token): all are taken, or its address holds its share. Say why, on a
/// thread of its own so the listener goes on; a flood beyond that is
/// refused at the CM level (on drop).
#[allow(clippy::too_many_arguments)]
fn refuse_busy_unauthenticated<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    cfg: &'scope ReceiverConfig,
    conn: IncomingConnection,
    span: tracing::Span,
    refusals: &'scope AtomicUsize,
    id: u64,
    busy: Busy,
) {
    if refusals.fetch_add(1, Ordering::SeqCst) >= cfg.max_sessions {
        refusals.fetch_sub(1, Ordering::SeqCst);
        let _enter = span.enter();
        warn!("too many connections: refused without a reason");
        return;
    }
    let spawned = std::thread::Builder::new()
        .name(format!("refuse-{id}"))
        .spawn_scoped(scope, move || {
            let _enter = span.enter();
            refuse_busy(cfg, conn, busy);
            refusals.fetch_sub(1, Ordering::SeqCst);
        });
    if let Err(e) = spawned {
        refusals.fetch_sub(1, Ordering::SeqCst);
        warn!("cannot start a thread: {e}");
    }
}

/// Runs one session and logs how it ended.
fn run_logged(
    cfg: &ReceiverConfig,
    conn: IncomingConnection,
    on_file: &OnFile<'_>,
    ledger: &Arc<SpaceLedger>,
    admission: &mut Admission<'_>,
    once: (&dyn Fn(), &dyn Fn() -> bool),
) -> Result<(), XferError> {
    let started = Instant::now();
    let result = session::run(cfg, conn, on_file, ledger, admission, once);
    // A failed session is said once: by the serving loop (with its id and
    // peer), or with --once by the tool's final error.
    match &result {
        Ok(()) => info!(elapsed = ?started.elapsed(), "session finished"),
        Err(e) => info!(elapsed = ?started.elapsed(), "session failed: {e}"),
    }
    result
}

/// Accepts a connection only to tell the sender that all sessions are
/// taken, or its address holds its share (no token: the refusal takes the
/// CHALLENGE's place).
fn refuse_busy(cfg: &ReceiverConfig, conn: IncomingConnection, busy: Busy) {
    let refusal = busy_refusal(busy);
    warn!("refused: {}", refusal.reason);
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
        control.send(&ep, &Message::Reject(refusal))?;
        control.drain(&ep, timeout)?;
        ep.cm_id().disconnect(Duration::from_secs(1));
        Ok(())
    })();
    if let Err(e) = result {
        debug!("could not deliver the busy refusal: {e}");
    }
}

/// The session's state machine; with a token, it requires a PROVE bound to
/// a fresh nonce from the OS RNG and to this connection before anything
/// else; `conn` names the connection (asked only then).
fn new_machine<F, W, C>(
    cfg: &ReceiverConfig,
    conn: impl FnOnce() -> Result<crate::proto::ConnectionId, XferError>,
) -> Result<ReceiverSession<F, W, C>, XferError> {
    let machine_cfg = MachineConfig {
        slot_size: cfg.slot_size(),
        slot_count: cfg.slots,
        credit_batch: (cfg.slots / 4).max(1),
        max_size: cfg.max_size,
        max_files: cfg.max_files,
        max_session_bytes: cfg.max_session_bytes,
        names: NameRules {
            allow_dotfiles: cfg.allow_dotfiles,
        },
        digest_budget: crate::proto::DigestBudget::DEFAULT,
        timeout: cfg.timeout,
        relay_allowed: cfg.relay,
    };
    let Some(token) = &cfg.token else {
        return Ok(ReceiverSession::carrying(machine_cfg));
    };
    let mut nonce = [0u8; NONCE_LEN];
    getrandom::fill(&mut nonce).map_err(|e| {
        XferError::io(
            "cannot get random bytes for the challenge",
            std::io::Error::other(e),
        )
    })?;
    let conn = conn()?;
    Ok(ReceiverSession::carrying_with_auth(
        machine_cfg,
        token.clone(),
        nonce,
        conn,
    ))
}
