//! One receiver session: the loop that drives the receiver's state machine
//! over the connection (control messages, data completions, credits) and
//! the file store, from the greeting to BYE or the first fatal error.

mod data;
mod end;
mod file_work;
mod offers;
mod pieces;
mod relay;
#[cfg(test)]
pub(super) mod tests;

use crate::engine::receiver::storage::dry_run::WouldCreate;
use crate::engine::worker::Worker;
use file_work::Done;

use super::admission::Admission;
use super::storage::FileStore;
use super::storage::link_dest::LinkCandidate;
use super::storage::partial::{Claim, KeptPrefix};
use super::storage::sink::Sink;
use super::storage::space::SpaceLedger;
use super::storage::write_behind::WriteBehind;
use super::{CONTROL_RECVS, OnFile, ReceiverConfig, SEND_BUFFERS, said_upstream};
use crate::engine::control::{Control, Undelivered};
use crate::engine::digest::FileHasher;
use crate::engine::link::{ExposedRing, RdmaLink, RingDelivery, RingLink, Until};
use crate::engine::progress::FileProgress;
use crate::engine::report::Phases;
use crate::error::XferError;
use crate::proto::{
    AUTH_TIMEOUT, AckStatus, AuthFailure, DigestAlg, Hello, Message, Mtime, ReceiverEvent,
    ReceiverSession, RecvError, RejectCode, Undecodable, escaped,
};
use crate::sys::rdma::{Endpoint, IncomingConnection, QpCaps};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// The receiver's machine, carrying the file being received and what an
/// offer's HAVE was made of.
pub(super) type Machine = ReceiverSession<IncomingFile, AwaitingFrom, CompareOf>;

/// The file or stream being received.
pub(super) struct IncomingFile {
    name: String,
    /// The offered size (0 for a stream: unknown).
    size: u64,
    digest_alg: DigestAlg,
    sink: Sink,
    mode: u32,
    mtime: Option<Mtime>,
    hasher: FileHasher,
    /// Bytes written so far (standard output is written strictly in order),
    /// counting a resumed prefix.
    written: u64,
    /// The kept prefix this transfer continued (bytes not sent again).
    resumed_from: u64,
    started: Instant,
    /// The file's log span (name, size) and its phase timings so far.
    span: tracing::Span,
    phases: Phases,
    data_started: Instant,
    /// Time spent checking and writing chunks (logged for tuning).
    check_time: Duration,
    write_time: Duration,
    progress: Box<dyn FileProgress>,
    /// The descriptor the writer threads write a temporary file through
    /// (opened at its first chunk).
    writer: Option<Arc<std::fs::File>>,
    /// In a relay chain: its bytes on their way to the next host.
    forward: Option<crate::engine::relay::Forward>,
    /// In a relay chain: an offer this host takes only to pass it on,
    /// and its own verdict on it.
    own: Option<relay::OwnVerdict>,
    /// In a relay chain: a resumed file passed on from this host's copy
    /// once committed, not as it arrives (see `Session::forward_resumed`).
    pass_on: Option<crate::proto::Hello>,
}

impl IncomingFile {
    /// An offer's bookkeeping from its HELLO at `hello_at` (after
    /// `connect`), its bytes going into `sink`, reported to `progress`.
    fn accepted(
        name: String,
        size: u64,
        digest_alg: DigestAlg,
        sink: Sink,
        span: tracing::Span,
        (hello_at, connect): (Instant, Duration),
        progress: Box<dyn FileProgress>,
    ) -> Self {
        IncomingFile {
            name,
            size,
            digest_alg,
            sink,
            mode: 0,
            mtime: None,
            hasher: FileHasher::new(digest_alg),
            written: 0,
            resumed_from: 0,
            started: hello_at,
            span,
            phases: Phases {
                connect,
                mr_exchange: hello_at.elapsed(),
                ..Phases::default()
            },
            data_started: Instant::now(),
            check_time: Duration::ZERO,
            write_time: Duration::ZERO,
            progress,
            writer: None,
            forward: None,
            own: None,
            pass_on: None,
        }
    }
}

struct Session<'a, 's> {
    cfg: &'a ReceiverConfig,
    /// Whether the sender got a session slot, or must prove the token first.
    admission: &'a mut Admission<'s>,
    /// Told when the sender is admitted (--once's listener listens).
    on_admitted: &'a dyn Fn(),
    /// Whether this session joined another's (--once: one sender's
    /// lanes); then it carries pieces only.
    joined: &'a dyn Fn() -> bool,
    /// Receives to post once the sender is admitted.
    unposted_recvs: usize,
    on_file: &'a OnFile<'a>,
    /// The sender's address, for log messages.
    peer: String,
    /// How long accepting the connection took (a phase of every file).
    connect_time: Duration,
    link: Box<dyn RingLink + 'a>,
    /// Registered ahead of the first offer (`register_ring_ahead`), else at
    /// the first accepted HELLO; reused for every file.
    ring: Option<ExposedRing>,
    /// `register_ring_ahead` ran (it tries once).
    ring_tried_ahead: bool,
    /// The directories a dry run of this session would have created.
    would_create: WouldCreate,
    /// Private copy of the chunk being handled: what is checked is what is
    /// written, whatever the peer does to the ring meanwhile.
    chunk: Vec<u8>,
    /// Writer threads for files (`--threads`; None: this thread writes).
    /// Started at the first chunk of a file (`start_writers`).
    behind: Option<WriteBehind>,
    /// Starting the writer threads failed: this thread writes.
    writers_failed: bool,
    machine: Machine,
    store: FileStore,
    /// A per-file failure that did not end the session (--once reports it).
    first_error: Option<XferError>,
    /// Standard output was closed by its reader (EPIPE): the session ended
    /// on purpose, quietly; what to log.
    output_closed: Option<String>,
    /// Long file work for the current offer, on its own thread (the
    /// machine waits for its result; dropping it stops and joins it).
    work: Option<Worker<Done>>,
    /// This host's place in a relay chain (the sender's RELAY).
    relay: Option<relay::Relay>,
    /// This session as a lane: the files it took pieces of (their pieces
    /// it was receiving go back when it ends).
    held: super::storage::pieces::Held,
}

/// An offer with RESUME between its HAVE and the sender's FROM.
pub(super) struct AwaitingFrom {
    hello: Hello,
    hello_at: Instant,
    kept: Option<KeptPrefix>,
    /// The SHA-256 the sender announced (COMPARE) for --exec's command.
    announced: Option<[u8; 32]>,
    /// The session's claim on the partial file (none: a plain temporary
    /// file is written).
    claim: Option<Claim>,
    /// In a relay chain: an offer this host does not keep, passed on
    /// after the FROM (its HAVE said nothing).
    own: Option<relay::OwnVerdict>,
}

impl AwaitingFrom {
    /// An offer with nothing kept, announced or claimed yet.
    fn of(hello: Hello, hello_at: Instant) -> Self {
        AwaitingFrom {
            hello,
            hello_at,
            kept: None,
            announced: None,
            claim: None,
            own: None,
        }
    }
}

/// What a COMPARE is about, carried by the machine from the HAVE that
/// asked for the sender's SHA-256.
pub(super) enum CompareOf {
    /// The complete copy a HAVE(complete) announced (an offer with RESUME).
    Copy(std::fs::File),
    /// What a HAVE(digest) asked it for (an offer with CHECKSUM).
    Asked(DigestFor),
}

/// Why the receiver asks an offer with CHECKSUM for its SHA-256.
pub(super) enum DigestFor {
    /// The file --link-dest may hold, linked if the digests match.
    Link(LinkCandidate),
    /// --exec's command gets it (RDMA_XFER_DIGEST).
    Command,
}

/// Ends the session if SIGINT or SIGTERM came (a read for a resumed offer
/// stopped early says nothing about what is held).
fn interrupted() -> Result<(), XferError> {
    if crate::sys::os::shutdown_requested() {
        return Err(XferError::Sys(crate::sys::SysError::Interrupted));
    }
    Ok(())
}

/// Receives posted before the sender is admitted: PROVE or BYE is all it
/// may send, and a few more cost little.
const HANDSHAKE_RECVS: usize = 4;

/// How often a handshake's wait looks whether the pool dropped it.
const HANDSHAKE_CHECK: Duration = Duration::from_millis(100);

/// What handling one completion decided.
enum Flow {
    Continue,
    /// BYE: the sender is done.
    Done,
}

/// Accepts the connection and runs its session to the end.
pub(super) fn run(
    cfg: &ReceiverConfig,
    conn: IncomingConnection,
    on_file: &OnFile<'_>,
    ledger: &Arc<SpaceLedger>,
    admission: &mut Admission<'_>,
    (on_admitted, joined): (&dyn Fn(), &dyn Fn() -> bool),
) -> Result<(), XferError> {
    let store = FileStore::open(cfg, ledger)?;
    let id = conn.into_id()?;
    let recvs = cfg.slots + CONTROL_RECVS;
    let caps = QpCaps {
        max_send_wr: SEND_BUFFERS as u32 + 4,
        max_recv_wr: recvs,
    };
    let ep = Endpoint::new(id, caps, cfg.busy_poll)?;
    // Before its proof a peer may send only PROVE or BYE: a few receives
    // (and so little registered memory) until it is admitted.
    let first_recvs = match admission.handshake() {
        Some(_) => HANDSHAKE_RECVS,
        None => recvs as usize,
    };
    let control = Control::new(&ep, first_recvs, SEND_BUFFERS)?;
    crate::engine::tune_ack_timeout(ep.cm_id(), cfg.ack_timeout);
    let accept_started = Instant::now();
    match admission.handshake() {
        // A peer that has proven nothing yet holds a place only until the
        // handshake's deadline, or until the pool needs it.
        Some((deadline, _)) => {
            ep.cm_id().accept_until(deadline, &|| admission.evicted())?;
        }
        // Nothing to prove (no token), but the slot was taken on the
        // connection request's word: a peer that does not complete the
        // connection (one round trip for a real sender) holds it at most
        // AUTH_TIMEOUT.
        None => ep.cm_id().accept(cfg.timeout.min(AUTH_TIMEOUT))?,
    }
    let connect_time = accept_started.elapsed();
    info!(
        connect_s = connect_time.as_secs_f64(),
        "session established"
    );
    let machine = super::new_machine(cfg, || {
        crate::engine::connection_id(&ep, crate::proto::Role::Receiver)
    })?;
    let peer = ep
        .cm_id()
        .peer_addr()
        .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
    let parts = Parts {
        cfg,
        admission,
        on_admitted,
        joined,
        on_file,
        unposted_recvs: recvs as usize - first_recvs,
        peer,
        connect_time,
    };
    drive(parts, Box::new(RdmaLink::new(ep, control)), machine, store)
}

/// What a session is given besides its link, machine and store.
pub(super) struct Parts<'a, 's> {
    pub cfg: &'a ReceiverConfig,
    pub admission: &'a mut Admission<'s>,
    pub on_admitted: &'a dyn Fn(),
    /// Whether this session joined another's (see `Session::joined`).
    pub joined: &'a dyn Fn() -> bool,
    pub on_file: &'a OnFile<'a>,
    /// Receives to post once the sender is admitted.
    pub unposted_recvs: usize,
    /// The sender's address, for log messages.
    pub peer: String,
    pub connect_time: Duration,
}

/// Runs a session over `link` from the greeting to its end.
pub(super) fn drive<'a>(
    parts: Parts<'a, '_>,
    link: Box<dyn RingLink + 'a>,
    machine: Machine,
    mut store: FileStore,
) -> Result<(), XferError> {
    store.set_peer(&parts.peer);
    let mut session = Session {
        cfg: parts.cfg,
        admission: parts.admission,
        on_admitted: parts.on_admitted,
        joined: parts.joined,
        unposted_recvs: parts.unposted_recvs,
        on_file: parts.on_file,
        peer: parts.peer,
        connect_time: parts.connect_time,
        link,
        ring: None,
        ring_tried_ahead: false,
        would_create: WouldCreate::default(),
        chunk: Vec::new(),
        behind: None,
        writers_failed: false,
        machine,
        store,
        first_error: None,
        output_closed: None,
        work: None,
        relay: None,
        held: super::storage::pieces::Held::new(parts.cfg.pieces.new_lane()),
    };
    let result = session.run();
    session.finish(result)
}

impl Session<'_, '_> {
    /// Greets the sender and handles completions until BYE or an error.
    fn run(&mut self) -> Result<(), XferError> {
        // The CHALLENGE: always the first message, the sender waits for it.
        self.transmit()?;
        self.machine.progressed(Instant::now());
        loop {
            self.register_ring_ahead();
            if self.file_work_done()? {
                self.machine.progressed(Instant::now());
                self.transmit()?;
                continue;
            }
            let what = self.machine.waiting_for();
            match self.admission.handshake() {
                Some((deadline, _)) => self.wait_handshake(deadline, what)?,
                None => self.wait_for_sender(what)?,
            }
            // A peer that takes none of our messages is not waited for
            // forever, whatever it sends meanwhile.
            self.link.check_sends(self.cfg.timeout)?;
            let mut delivered = false;
            while let Some(delivery) = self.link.next()? {
                delivered = true;
                let flow = self.on_delivery(delivery);
                // Whatever the machine replied goes out, even when the
                // completion ended the session (it says why).
                let sent = self.transmit();
                if let Flow::Done = flow? {
                    return Ok(());
                }
                sent?;
            }
            if delivered {
                self.machine.progressed(Instant::now());
            }
            // The machine's timers: a KEEPALIVE while the file work runs,
            // or the end of the wait for a silent sender. A handshake in the
            // pool has the pool's deadline instead (`wait_handshake`).
            if self.admission.handshake().is_none() {
                self.machine
                    .handle_timeout(Instant::now())
                    .map_err(|timed_out| XferError::PeerLost(timed_out.to_string()))?;
                self.transmit()?;
            }
        }
    }

    /// Waits for completions while the sender has proven nothing: until
    /// the handshake's deadline at most, and no longer once the pool
    /// dropped this connection for a newer one (checked every 100 ms).
    fn wait_handshake(&mut self, deadline: Instant, what: &str) -> Result<(), XferError> {
        let admission = &*self.admission;
        self.link.wait(Until {
            deadline,
            slice: HANDSHAKE_CHECK,
            what,
            give_up: &|| {
                admission.evicted().then(|| {
                    XferError::PeerLost(
                        "dropped from the full handshake pool for a newer connection".into(),
                    )
                })
            },
            expired: &|| {
                XferError::PeerLost(format!(
                    "the sender did not authenticate within {}s of connecting",
                    AUTH_TIMEOUT.as_secs()
                ))
            },
        })
    }

    /// Waits on the link until the machine's next deadline; while the file
    /// work runs, on its result instead, looking at the link often (the
    /// sender waits for our answer meanwhile; `Worker::wait_until`).
    fn wait_for_sender(&mut self, what: &str) -> Result<(), XferError> {
        // None: no deadline (a timeout past the clock's range), or the
        // machine is over and the loop ends with the next delivery.
        let deadline = self
            .machine
            .poll_timeout()
            .unwrap_or_else(|| crate::sys::os::deadline_after(self.cfg.timeout));
        if let Some(work) = self.work.as_mut() {
            let waited = work.wait_until(deadline, &mut *self.link, what);
            return match waited {
                // A local read stuck: the sender hears why (an I/O error,
                // not a vanished peer worth retrying).
                Err(stalled) if work.has_stalled() => Err(self.abort(AckStatus::Io, stalled)),
                waited => waited,
            };
        }
        self.link.wait_until(deadline, what).map(|_| ())
    }

    /// Sends what the state machine queued for the sender.
    fn transmit(&mut self) -> Result<(), XferError> {
        while let Some(msg) = self.machine.poll_transmit() {
            self.link.send(&msg)?;
        }
        Ok(())
    }

    fn on_delivery(&mut self, delivery: RingDelivery) -> Result<Flow, XferError> {
        match delivery {
            RingDelivery::Chunk { byte_len, imm } => self.on_chunk(byte_len, imm)?,
            RingDelivery::Message(decoded) => {
                let msg = match decoded {
                    Ok(m) => m,
                    Err(Undelivered::Seal(e)) => {
                        warn!("control message from {} refused: {e}", self.peer);
                        let err = XferError::Forged {
                            from: crate::proto::Role::Sender,
                            source: self.machine.on_forged(e),
                        };
                        return Err(self.abandon(err));
                    }
                    Err(Undelivered::Wire(e)) => {
                        return Err(match self.machine.on_undecodable(e) {
                            Undecodable::Version(r) => XferError::Rejected {
                                code: Some(r.code),
                                reason: r.reason,
                            },
                            Undecodable::Malformed(source) => self.abandon(XferError::Malformed {
                                from: crate::proto::Role::Sender,
                                source,
                            }),
                        });
                    }
                };
                return self.on_message(msg);
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
        let batch = matches!(msg, Message::Batch(_));
        match self.machine.on_message(msg) {
            Ok(ReceiverEvent::Offer(hello)) => self.on_hello(hello)?,
            Ok(ReceiverEvent::Batch(members)) => self.on_batch(members)?,
            Ok(ReceiverEvent::Fin(fin, file)) => self.on_fin(fin, file)?,
            Ok(ReceiverEvent::Closed) => return Ok(Flow::Done),
            Ok(ReceiverEvent::Authenticated) => {
                if let Err(max_sessions) = self.admission.admit() {
                    // REJECT(busy) instead of AUTH_OK; the run loop sends it.
                    let busy = self.machine.refuse_busy(max_sessions)?;
                    warn!("refused {}: {}", self.peer, busy.reason);
                    return Err(XferError::Rejected {
                        code: Some(busy.code),
                        reason: busy.reason,
                    });
                }
                let channel = self.machine.admit()?;
                // The rest of the receives: the ring's writes and the
                // messages of a pipelining sender may come now.
                let more = std::mem::take(&mut self.unposted_recvs);
                self.link.add_receives(more)?;
                (self.on_admitted)();
                info!("sender authenticated");
                // AUTH_OK goes out as it is; everything after it is sealed.
                self.transmit()?;
                self.link.install(channel);
            }
            Ok(ReceiverEvent::Keepalive) => debug!("the sender waits for its input"),
            Ok(ReceiverEvent::Relay(hops)) => self.on_relay(hops)?,
            Ok(ReceiverEvent::From { offset, waiting }) => self.on_from(offset, waiting)?,
            Ok(ReceiverEvent::Compare {
                sha256,
                copy,
                waiting,
            }) => self.on_compare(sha256, copy, waiting)?,
            // The machine queued the sender's reply to each error.
            Err(RecvError::Auth(failure)) => return Err(self.auth_failed(failure)),
            Err(RecvError::Version(reject)) => {
                warn!("refused {}: {}", self.peer, reject.reason);
                return Err(self.abandon(XferError::Rejected {
                    code: Some(reject.code),
                    reason: reject.reason,
                }));
            }
            Err(RecvError::Forged(source)) => {
                return Err(self.abandon(XferError::Forged {
                    from: crate::proto::Role::Sender,
                    source,
                }));
            }
            // Not a verdict on any file: they come one by one next.
            Err(RecvError::Reject(reject)) if batch => {
                info!(
                    code = reject.code.as_str(),
                    "batch refused, its files come one by one: {}",
                    escaped(&reject.reason)
                );
            }
            Err(RecvError::Reject(reject)) => {
                // A chain's hop: its sender hears it in a RESULT.
                said_upstream!(
                    self.cfg,
                    code = reject.code.as_str(),
                    "refused: {}",
                    escaped(&reject.reason)
                );
                let err = XferError::Rejected {
                    code: Some(reject.code),
                    reason: reject.reason.clone(),
                };
                if let Some((name, size, alg)) = offer {
                    self.report_failure(&name, size, alg, Duration::ZERO, &err, false);
                }
                self.first_error.get_or_insert(err);
            }
            Err(RecvError::Protocol(e)) => {
                return Err(self.abandon(XferError::Protocol {
                    context: Some(format!("{kind} not allowed here")),
                    source: e,
                }));
            }
            Err(e @ RecvError::TooLarge { .. }) => {
                return Err(self.abandon(XferError::Rejected {
                    code: Some(RejectCode::TooLarge),
                    reason: format!("{kind}: {e}"),
                }));
            }
            Err(RecvError::SessionLimit(reject)) => {
                warn!("session ended: {}", reject.reason);
                let err = XferError::Rejected {
                    code: Some(reject.code),
                    reason: reject.reason,
                };
                if let Some((name, size, alg)) = offer {
                    self.report_failure(&name, size, alg, Duration::ZERO, &err, true);
                }
                return Err(err);
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
        XferError::Auth(failure.to_string())
    }
}
