//! One receiver session: the loop that drives the receiver's state machine
//! over the connection (control messages, data completions, credits) and
//! the file store, from the greeting to BYE or the first fatal error.

use super::admission::Admission;
use super::storage::FileStore;
use super::storage::link_dest::{LinkCandidate, Linked};
use super::storage::partial::{Claim, Holding, KeptPrefix, copy_digest};
use super::storage::sink::{Sink, Unwritten};
use super::storage::space::SpaceLedger;
use super::storage::temp_file::Resume;
use super::storage::write_behind::WriteBehind;
use super::{CONTROL_RECVS, OnFile, ReceiverConfig, SEND_BUFFERS};
use crate::engine::control::{Control, Undelivered};
use crate::engine::digest::{FileHasher, digest_hex};
use crate::engine::per_byte::{self, ChunkRefused, TagCheck};
use crate::engine::progress::{FileProgress, Progress};
use crate::engine::report::{FileEvent, FileFailure, FileReport, Phases};
use crate::engine::{WrId, WrKind, wait_completions, wait_completions_until};
use crate::error::XferError;
use crate::proto::{
    AUTH_TIMEOUT, AckStatus, AuthFailure, CHUNK_TAG_LEN, DigestAlg, Fin, Have, HaveKind, Hello,
    Message, Mtime, ProtocolError, ReceiverEvent, ReceiverSession, RecvError, Reject, RejectCode,
    RingInfo, escaped, hello_flags, keepalive_interval,
};
use crate::sys::rdma::{Completion, Endpoint, IncomingConnection, QpCaps, RemoteRing, WcOpcode};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tracing::{debug, error, error_span, info, warn};

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
}

struct Session<'a, 's> {
    cfg: &'a ReceiverConfig,
    /// Whether the sender got a session slot, or must prove the token first.
    admission: &'a mut Admission<'s>,
    /// Told when the sender is admitted (--once's listener listens).
    on_admitted: &'a dyn Fn(),
    /// Receives to post once the sender is admitted.
    unposted_recvs: usize,
    on_file: &'a OnFile<'a>,
    /// The sender's address, for log messages.
    peer: String,
    /// How long accepting the connection took (a phase of every file).
    connect_time: Duration,
    ep: Endpoint,
    control: Control,
    /// Registered ahead of the first offer (`register_ring_ahead`), else at
    /// the first accepted HELLO; reused for every file.
    ring: Option<RemoteRing>,
    /// `register_ring_ahead` ran (it tries once).
    ring_tried_ahead: bool,
    /// Private copy of the chunk being handled: what is checked is what is
    /// written, whatever the peer does to the ring meanwhile.
    chunk: Vec<u8>,
    /// Writer threads for files (`--threads`; None: this thread writes).
    /// Started at the first chunk of a file (`start_writers`).
    behind: Option<WriteBehind>,
    /// Starting the writer threads failed: this thread writes.
    writers_failed: bool,
    machine: ReceiverSession,
    store: FileStore,
    file: Option<IncomingFile>,
    /// A per-file failure that did not end the session (--once reports it).
    first_error: Option<XferError>,
    /// Standard output was closed by its reader (EPIPE): the session ended
    /// on purpose, quietly; what to log.
    output_closed: Option<String>,
    /// An offer with RESUME answered with HAVE: what FROM decides about.
    awaiting_from: Option<AwaitingFrom>,
    /// Completions polled while a file was read for a HAVE (the sends are
    /// handled at once; anything else waits for the run loop).
    stashed: Vec<Completion>,
}

/// An offer with RESUME between its HAVE and the sender's FROM.
struct AwaitingFrom {
    hello: Hello,
    hello_at: Instant,
    kept: Option<KeptPrefix>,
    /// The complete copy HAVE announced, to compare (COMPARE).
    copy: Option<std::fs::File>,
    /// Why a HAVE(digest) asked for the file's SHA-256, if one did.
    digest_for: Option<DigestFor>,
    /// The SHA-256 the sender announced (COMPARE) for --exec's command.
    announced: Option<[u8; 32]>,
    /// The session's claim on the partial file (none: a plain temporary
    /// file is written).
    claim: Option<Claim>,
}

/// Why the receiver asks an offer with CHECKSUM for its SHA-256.
enum DigestFor {
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

/// Keeps the sender informed while the session reads a file from disk
/// for a resumed offer (a kept prefix, a complete copy): a KEEPALIVE every
/// `interval`, so that the waiting sender does not time out. Our sends
/// complete at once; other completions wait for the run loop.
struct ReadTick<'s> {
    control: &'s mut Control,
    ep: &'s Endpoint,
    machine: &'s ReceiverSession,
    stashed: &'s mut Vec<Completion>,
    interval: Duration,
    last: Instant,
}

impl<'s> ReadTick<'s> {
    fn new(
        control: &'s mut Control,
        ep: &'s Endpoint,
        machine: &'s ReceiverSession,
        stashed: &'s mut Vec<Completion>,
        timeout: Duration,
    ) -> Self {
        Self {
            control,
            ep,
            machine,
            stashed,
            interval: keepalive_interval(timeout),
            last: Instant::now(),
        }
    }

    fn tick(&mut self) -> std::io::Result<()> {
        if crate::sys::os::shutdown_requested() {
            return Err(std::io::Error::other("interrupted by signal"));
        }
        if self.last.elapsed() < self.interval {
            return Ok(());
        }
        self.last = Instant::now();
        let keepalive = self.machine.keepalive().map_err(std::io::Error::other)?;
        self.control
            .send(self.ep, &keepalive)
            .map_err(std::io::Error::other)?;
        let mut wcs = Vec::new();
        self.ep.poll(&mut wcs, 16).map_err(std::io::Error::other)?;
        for wc in wcs {
            if WrId::from_raw(wc.wr_id).kind() == WrKind::Send && wc.opcode == WcOpcode::Send {
                self.control
                    .on_send_done(self.ep, wc)
                    .map_err(std::io::Error::other)?;
            } else {
                self.stashed.push(wc);
            }
        }
        Ok(())
    }
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
    on_admitted: &dyn Fn(),
) -> Result<(), XferError> {
    let mut store = FileStore::open(cfg, ledger)?;
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
    let machine = super::new_machine(cfg, &ep)?;
    let peer = ep
        .cm_id()
        .peer_addr()
        .map_or_else(|| "an unknown address".to_string(), |a| a.to_string());
    store.set_peer(&peer);
    let mut session = Session {
        cfg,
        admission,
        on_admitted,
        unposted_recvs: recvs as usize - first_recvs,
        on_file,
        peer,
        connect_time,
        ep,
        control,
        ring: None,
        ring_tried_ahead: false,
        chunk: Vec::new(),
        behind: None,
        writers_failed: false,
        machine,
        store,
        file: None,
        first_error: None,
        output_closed: None,
        awaiting_from: None,
        stashed: Vec::new(),
    };
    let result = session.run();
    session.finish(result)
}

impl Session<'_, '_> {
    /// Greets the sender and handles completions until BYE or an error.
    fn run(&mut self) -> Result<(), XferError> {
        // The CHALLENGE: always the first message, the sender waits for it.
        self.transmit()?;
        let mut wcs = Vec::with_capacity(16);
        loop {
            self.register_ring_ahead();
            wcs.clear();
            let (what, timeout) = self.machine.wait_limit(self.cfg.timeout);
            if !self.stashed.is_empty() {
                wcs.append(&mut self.stashed);
            } else {
                match self.admission.handshake() {
                    Some((deadline, _)) => self.wait_handshake(&mut wcs, deadline, what)?,
                    None => wait_completions(&self.ep, &mut wcs, timeout, what)?,
                }
            }
            // A peer that takes none of our messages is not waited for
            // forever, whatever it sends meanwhile.
            self.control.check_sends(self.cfg.timeout)?;
            for wc in wcs.drain(..) {
                let flow = self.on_completion(wc);
                // Whatever the machine replied goes out, even when the
                // completion ended the session (it says why).
                let sent = self.transmit();
                if let Flow::Done = flow? {
                    return Ok(());
                }
                sent?;
            }
        }
    }

    /// Waits for completions while the sender has proven nothing: until
    /// the handshake's deadline at most, and no longer once the pool
    /// dropped this connection for a newer one (checked every 100 ms).
    fn wait_handshake(
        &self,
        wcs: &mut Vec<Completion>,
        deadline: Instant,
        what: &str,
    ) -> Result<(), XferError> {
        let admission = &*self.admission;
        wait_completions_until(
            &self.ep,
            wcs,
            deadline,
            HANDSHAKE_CHECK,
            what,
            &|| {
                admission.evicted().then(|| {
                    XferError::PeerLost(
                        "dropped from the full handshake pool for a newer connection".into(),
                    )
                })
            },
            &|| {
                XferError::PeerLost(format!(
                    "the sender did not authenticate within {}s of connecting",
                    AUTH_TIMEOUT.as_secs()
                ))
            },
        )
    }

    /// Sends what the state machine queued for the sender.
    fn transmit(&mut self) -> Result<(), XferError> {
        while let Some(msg) = self.machine.poll_transmit() {
            self.control.send(&self.ep, &msg)?;
        }
        Ok(())
    }

    fn on_completion(&mut self, wc: Completion) -> Result<Flow, XferError> {
        match (WrId::from_raw(wc.wr_id).kind(), wc.opcode) {
            (WrKind::Send, WcOpcode::Send) => self.control.on_send_done(&self.ep, wc)?,
            (WrKind::Recv, WcOpcode::RecvWithImm) => {
                let (byte_len, imm) = (wc.byte_len, wc.imm);
                // The receive buffer carried no data: hand it back at once.
                self.control.recycle(&self.ep, wc)?;
                let imm = imm.ok_or_else(|| {
                    XferError::Internal("RDMA write completion without immediate data".into())
                })?;
                self.on_chunk(byte_len, imm)?;
            }
            (WrKind::Recv, WcOpcode::Recv) => {
                let decoded = self.control.take_message(&self.ep, wc)?;
                let msg = match decoded {
                    Ok(m) => m,
                    Err(Undelivered::Seal(e)) => {
                        warn!("control message from {} refused: {e}", self.peer);
                        let err = match self.machine.on_forged(e) {
                            RecvError::Forged(source) => XferError::Forged {
                                from: crate::proto::Role::Sender,
                                source,
                            },
                            other => XferError::Internal(format!("a forged message gave {other}")),
                        };
                        return Err(self.abandon(err));
                    }
                    Err(Undelivered::Wire(e)) => {
                        return Err(match self.machine.on_undecodable(e) {
                            RecvError::Reject(r) => XferError::Rejected {
                                code: Some(r.code),
                                reason: r.reason,
                            },
                            RecvError::Protocol(ProtocolError::Malformed(source)) => {
                                self.abandon(XferError::Malformed {
                                    from: crate::proto::Role::Sender,
                                    source,
                                })
                            }
                            other => self.abandon(XferError::Internal(format!(
                                "an undecodable message gave {other}"
                            ))),
                        });
                    }
                };
                return self.on_message(msg);
            }
            (kind, opcode) => {
                return Err(XferError::Internal(format!(
                    "unexpected completion {opcode:?} for a work request of kind {kind:?}"
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
        let batch = matches!(msg, Message::Batch(_));
        match self.machine.on_message(msg) {
            Ok(ReceiverEvent::Offer(hello)) => self.on_hello(hello)?,
            Ok(ReceiverEvent::Batch(members)) => self.on_batch(members)?,
            Ok(ReceiverEvent::Fin(fin)) => self.on_fin(fin)?,
            Ok(ReceiverEvent::Closed) => return Ok(Flow::Done),
            Ok(ReceiverEvent::Authenticated) => {
                if let Err(max_sessions) = self.admission.admit() {
                    // REJECT(busy) instead of AUTH_OK; the run loop sends it.
                    let busy = self.machine.refuse_busy(max_sessions).ok_or_else(|| {
                        XferError::Internal("a proof passed outside the handshake".into())
                    })?;
                    warn!("refused {}: {}", self.peer, busy.reason);
                    return Err(XferError::Rejected {
                        code: Some(busy.code),
                        reason: busy.reason,
                    });
                }
                self.machine.admit()?;
                // The rest of the receives: the ring's writes and the
                // messages of a pipelining sender may come now.
                let more = std::mem::take(&mut self.unposted_recvs);
                self.control.add_receives(&self.ep, more)?;
                (self.on_admitted)();
                info!("sender authenticated");
                // AUTH_OK goes out as it is; everything after it is sealed.
                self.transmit()?;
                let channel = self
                    .machine
                    .take_channel()
                    .ok_or_else(|| XferError::Internal("authenticated without a channel".into()))?;
                self.control.install(channel);
            }
            Ok(ReceiverEvent::Keepalive) => debug!("the sender waits for its input"),
            Ok(ReceiverEvent::From { offset }) => self.on_from(offset)?,
            Ok(ReceiverEvent::Compare { sha256 }) => self.on_compare(sha256)?,
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
                warn!(
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
            return match self.store.make_dir(&hello) {
                Ok(()) => {
                    let reply = self.machine.accept_directory()?;
                    self.control.send(&self.ep, &reply)
                }
                Err(refusal) => self.refuse(&hello, hello_at, refusal),
            };
        }
        if hello.is_stream() {
            info!(file = %hello.name, "offer of a stream (size unknown)");
        } else {
            info!(file = %hello.name, size = hello.size, "offer");
        }
        if hello.caps & hello_flags::RESUME != 0 {
            return self.offer_holding(hello, hello_at);
        }
        if let Some(why) = self.digest_for(&hello) {
            return self.ask_digest(hello, hello_at, why, None);
        }
        self.prepare_and_accept(&hello, hello_at, Resume::No, None, None)
    }

    /// Whether to ask an offer for its SHA-256 before its data, and why:
    /// for --exec's command, or for the file --link-dest may hold. Only
    /// offers with CHECKSUM, each name once per session.
    fn digest_for(&self, hello: &Hello) -> Option<DigestFor> {
        if hello.caps & hello_flags::CHECKSUM == 0 {
            return None;
        }
        if let Some(why) = self.machine.why_not_compare(&hello.name, hello.size) {
            debug!(file = %hello.name, "its SHA-256 is not asked: {why}");
            return None;
        }
        if self.store.starts_commands() {
            return Some(DigestFor::Command);
        }
        self.store
            .link_candidate(hello, self.cfg.overwrite)
            .map(DigestFor::Link)
    }

    /// Asks the sender for the SHA-256 of an offer (HAVE digest): for the
    /// file --link-dest may hold, or for --exec's command; its COMPARE
    /// decides (`on_compare`).
    fn ask_digest(
        &mut self,
        hello: Hello,
        hello_at: Instant,
        why: DigestFor,
        claim: Option<Claim>,
    ) -> Result<(), XferError> {
        match why {
            DigestFor::Link(_) => {
                info!(file = %hello.name, "--link-dest has a file of its size: its SHA-256 is asked")
            }
            DigestFor::Command => {
                debug!(file = %hello.name, "its SHA-256 is asked for the --exec command")
            }
        }
        let reply = self.machine.have(Have::ask_digest(hello.size))?;
        self.control.send(&self.ep, &reply)?;
        self.awaiting_from = Some(AwaitingFrom {
            hello,
            hello_at,
            kept: None,
            copy: None,
            digest_for: Some(why),
            announced: None,
            claim,
        });
        Ok(())
    }

    /// A BATCH of small files: each is checked on disk and gets its
    /// temporary file, and the batch gets the ring as one file would. If
    /// any file is refused, the whole batch is (quietly: the sender then
    /// offers each file on its own, and those offers get each file's own
    /// answer, reported as usual).
    fn on_batch(&mut self, members: Vec<Hello>) -> Result<(), XferError> {
        let hello_at = Instant::now();
        // The machine checked that the sizes add up without overflow.
        let total = members.iter().fold(0u64, |t, h| t.saturating_add(h.size));
        info!(files = members.len(), bytes = total, "offer of a batch");
        // A file --link-dest may hold is asked for its digest: alone.
        let linkable = members
            .iter()
            .find(|h| matches!(self.digest_for(h), Some(DigestFor::Link(_))));
        let prepared = match linkable {
            // Not a policy for every batch (not Protocol): the sender keeps
            // batching the others.
            Some(h) => Err(Reject::new(
                RejectCode::Exists,
                format!(
                    "{} may be linked from --link-dest: the files come one by one",
                    h.name
                ),
            )),
            None => self.store.create_batch(
                &members,
                self.cfg.overwrite,
                &self.cfg.dir,
                (self.cfg.umask, self.cfg.keep_modes),
            ),
        }
        .and_then(|batch| Ok((batch, self.ring_for_offer()?)));
        let (batch, ring) = match prepared {
            Ok(p) => p,
            // Not final for its files: the sender offers them one by one.
            Err(Reject { code, reason }) => {
                info!(
                    code = code.as_str(),
                    "batch refused, its files come one by one: {}",
                    escaped(&reason)
                );
                let reply = self.machine.reject(code, reason)?;
                return self.control.send(&self.ep, &reply);
            }
        };
        let reply = self.machine.accept(ring).map_err(XferError::from)?;
        self.control.send(&self.ep, &reply)?;
        let name = format!(
            "{} files from {}",
            members.len(),
            members.first().map_or("", |h| h.name.as_str())
        );
        let digest_alg = members.first().map_or(DigestAlg::Crc32, |h| h.digest);
        self.file = Some(IncomingFile {
            span: error_span!("batch", files = members.len(), size = total),
            progress: self
                .cfg
                .progress
                .batch_started(&name, total, members.len() as u64),
            name,
            size: total,
            digest_alg,
            sink: Sink::Batch(Box::new(batch)),
            mode: 0,
            mtime: None,
            hasher: FileHasher::new(digest_alg),
            written: 0,
            resumed_from: 0,
            started: hello_at,
            phases: Phases {
                connect: self.connect_time,
                mr_exchange: hello_at.elapsed(),
                ..Phases::default()
            },
            data_started: Instant::now(),
            check_time: Duration::ZERO,
            write_time: Duration::ZERO,
            writer: None,
        });
        Ok(())
    }

    /// An offer with RESUME: what the receiver holds of it goes back in a
    /// HAVE (reading the copy or the kept prefix, the sender kept
    /// informed); the sender's FROM decides (`on_from`).
    fn offer_holding(&mut self, hello: Hello, hello_at: Instant) -> Result<(), XferError> {
        let held = self.holding(&hello);
        // A signal stopped the wait or the read: what is kept stays as it
        // is, and nothing is answered about it.
        interrupted()?;
        let (mut holding, claim) = match held {
            Ok(h) => h,
            Err(refusal) => return self.refuse(&hello, hello_at, refusal),
        };
        if holding.have.kind == HaveKind::Complete
            && let Some(why) = self.machine.why_not_compare(&hello.name, hello.size)
        {
            holding = Holding::nothing(why);
        }
        // Nothing kept here: --link-dest may still have it.
        if holding.have.kind == HaveKind::Nothing
            && let Some(why) = self.digest_for(&hello)
        {
            return self.ask_digest(hello, hello_at, why, claim);
        }
        let have = holding.have;
        match have.kind {
            HaveKind::Complete => info!(file = %hello.name, "the complete file is here already"),
            HaveKind::Prefix => {
                info!(file = %hello.name, bytes = have.bytes, "a verified part is kept")
            }
            HaveKind::Nothing if have.note.is_empty() => debug!(file = %hello.name, "nothing kept"),
            HaveKind::Nothing => info!(file = %hello.name, "nothing reusable: {}", have.note),
            HaveKind::Digest => debug!(file = %hello.name, "its SHA-256 is asked"),
        }
        let reply = self.machine.have(have)?;
        self.control.send(&self.ep, &reply)?;
        self.awaiting_from = Some(AwaitingFrom {
            hello,
            hello_at,
            kept: holding.kept,
            copy: holding.copy,
            digest_for: None,
            announced: None,
            claim,
        });
        Ok(())
    }

    /// The sender's COMPARE of the complete copy HAVE announced: the
    /// same SHA-256 acknowledges the file without data; another (or a copy
    /// that cannot be read) is a HAVE of nothing, and FROM 0 follows.
    fn on_compare(&mut self, sha256: [u8; 32]) -> Result<(), XferError> {
        let Some(mut waiting) = self.awaiting_from.take() else {
            return Err(XferError::Internal("COMPARE without a HAVE".into()));
        };
        let link = match waiting.digest_for.take() {
            Some(DigestFor::Command) => {
                // Known before the data: the command gets it (and the data
                // is checked against it), then the data comes (FROM 0).
                waiting.announced = Some(sha256);
                let reply = self.machine.have(Have::nothing(""))?;
                self.control.send(&self.ep, &reply)?;
                self.awaiting_from = Some(waiting);
                return Ok(());
            }
            Some(DigestFor::Link(link)) => Some(link),
            None => None,
        };
        let copy = waiting.copy.take();
        let Some(file) = copy.as_ref().or(link.as_ref().map(|l| &l.file)) else {
            return Err(XferError::Internal("COMPARE without a copy".into()));
        };
        let whose = if link.is_some() {
            "the --link-dest copy"
        } else {
            "the receiver's copy"
        };
        let (size, chunk_len) = (waiting.hello.size, self.cfg.chunk_size);
        let mut tick = ReadTick::new(
            &mut self.control,
            &self.ep,
            &self.machine,
            &mut self.stashed,
            self.cfg.timeout,
        );
        let digest = copy_digest(file, size, chunk_len, &mut || tick.tick());
        // A signal stopped the read: no verdict on the copy.
        interrupted()?;
        let name = waiting.hello.name.clone();
        let mut differs = match digest {
            Ok(d) if d == sha256 => None,
            Ok(_) => Some(format!("{whose} differs from the source")),
            Err(e) => Some(format!("cannot read {whose} of {name}: {e}")),
        };
        let mut outcome = crate::engine::Outcome::Skipped;
        if let (None, Some(link)) = (&differs, &link) {
            let how = (self.cfg.overwrite, chunk_len, self.cfg.dir.as_path());
            match self
                .store
                .link_into_place(&waiting.hello, link, sha256, how, &mut || tick.tick())
            {
                Ok(Linked::HardLink) => info!(file = %name, "linked from --link-dest"),
                Ok(Linked::Copy(why)) => {
                    info!(file = %name, "copied from --link-dest ({why})")
                }
                Err(why) => differs = Some(format!("{whose} cannot be used: {why}")),
            }
            interrupted()?;
            outcome = crate::engine::Outcome::Linked;
        }
        if let Some(note) = differs {
            info!(file = %name, "{note}: received whole");
            let reply = self.machine.have(crate::proto::Have::nothing(note))?;
            self.control.send(&self.ep, &reply)?;
            self.awaiting_from = Some(waiting);
            return Ok(());
        }
        if link.is_none() {
            info!(file = %name, "skipped: the receiver's copy is the same");
        }
        drop((copy, link));
        let ack = self.machine.same()?;
        self.control.send(&self.ep, &ack)?;
        let report = FileReport {
            name,
            bytes: size,
            elapsed: waiting.hello_at.elapsed(),
            digest: crate::proto::Digest::Sha256(sha256),
            phases: Phases {
                connect: self.connect_time,
                ..Phases::default()
            },
            resumed_from: 0,
            outcome,
        };
        (self.on_file)(FileEvent::Done(&report));
        Ok(())
    }

    /// Reads what the store holds of an offer with RESUME; a KEEPALIVE
    /// goes out every `keepalive_interval` meanwhile, so that a large
    /// file's read does not time the sender out.
    fn holding(&mut self, hello: &Hello) -> Result<(Holding, Option<Claim>), Reject> {
        // An earlier session of the same file whose sender is gone ends
        // within its timeout (and records what it verified): worth waiting.
        let wait = self.cfg.timeout + Duration::from_secs(10);
        let chunk_len = self.cfg.chunk_size;
        let mut tick = ReadTick::new(
            &mut self.control,
            &self.ep,
            &self.machine,
            &mut self.stashed,
            self.cfg.timeout,
        );
        self.store
            .holding(hello, (chunk_len, self.cfg.overwrite), wait, &mut || {
                tick.tick()
            })
    }

    /// FROM answered our HAVE: receive from 0, continue the kept prefix,
    /// or acknowledge the complete copy without any data.
    fn on_from(&mut self, offset: u64) -> Result<(), XferError> {
        let Some(waiting) = self.awaiting_from.take() else {
            return Err(XferError::Internal("FROM without a HAVE".into()));
        };
        let AwaitingFrom {
            hello,
            hello_at,
            kept,
            claim,
            announced,
            ..
        } = waiting;
        match (kept, claim) {
            (Some(kept), Some(claim)) if offset > 0 => {
                let KeptPrefix { sidecar, hasher } = kept;
                let resume = Resume::Continue(&sidecar, claim);
                let continued = Some((hasher, offset));
                self.prepare_and_accept(&hello, hello_at, resume, continued, announced)
            }
            (_, Some(claim)) => {
                let resume = Resume::Fresh(claim);
                self.prepare_and_accept(&hello, hello_at, resume, None, announced)
            }
            (_, None) => self.prepare_and_accept(&hello, hello_at, Resume::No, None, announced),
        }
    }

    /// Opens where an accepted offer goes and answers with the ring (MR),
    /// or refuses it. `continued`: the whole-file digest over a kept
    /// prefix and its length; `sha256`: the file's SHA-256 if the sender
    /// announced it (for --exec's command).
    fn prepare_and_accept(
        &mut self,
        hello: &Hello,
        hello_at: Instant,
        resume: Resume<'_>,
        continued: Option<(FileHasher, u64)>,
        sha256: Option<[u8; 32]>,
    ) -> Result<(), XferError> {
        // The ring is normally registered ahead (`register_ring_ahead`);
        // if that failed, it is tried again for an acceptable offer, and if
        // that fails (memlock limit, say) the sender hears why instead of
        // waiting for an MR that never comes.
        let prepared = if self.store.starts_commands() {
            // A command starts only for an offer the ring can take.
            self.ring_for_offer()
                .and_then(|ring| Ok((self.prepare_file(hello, resume, sha256)?, ring)))
        } else {
            self.prepare_file(hello, resume, sha256)
                .and_then(|file| Ok((file, self.ring_for_offer()?)))
        };
        match prepared {
            Ok((mut file, ring)) => {
                if let Some((hasher, prefix)) = continued {
                    file.hasher = hasher;
                    file.written = prefix;
                    file.resumed_from = prefix;
                    info!(file = %hello.name, bytes = prefix, "continuing the kept part");
                }
                let reply = self.machine.accept(ring).map_err(XferError::from)?;
                self.control.send(&self.ep, &reply)?;
                // A file's time runs from its HELLO, like the sender's.
                file.started = hello_at;
                file.phases.connect = self.connect_time;
                file.phases.mr_exchange = hello_at.elapsed();
                file.data_started = Instant::now();
                file.progress = self.cfg.progress.file_started(&hello.name, hello.size);
                file.progress.advance(file.resumed_from);
                self.file = Some(file);
                Ok(())
            }
            Err(refusal) => self.refuse(hello, hello_at, refusal),
        }
    }

    /// Refuses an offer: logs and reports it, and sends the machine's REJECT.
    fn refuse(
        &mut self,
        hello: &Hello,
        hello_at: Instant,
        Reject { code, reason }: Reject,
    ) -> Result<(), XferError> {
        warn!(name = %escaped(&hello.name), code = code.as_str(), "refused: {reason}");
        let err = XferError::Rejected {
            code: Some(code),
            reason: reason.clone(),
        };
        // A directory has no size to report.
        let size = if hello.is_directory() { 0 } else { hello.size };
        let elapsed = hello_at.elapsed();
        self.report_failure(&hello.name, size, hello.digest, elapsed, &err, false);
        self.first_error.get_or_insert(err);
        let reply = self.machine.reject(code, reason)?;
        self.control.send(&self.ep, &reply)
    }

    /// Opens where the offered file goes (see `FileStore::create`) and
    /// starts its bookkeeping.
    /// `sha256`: the file's digest, if the sender announced it.
    fn prepare_file(
        &mut self,
        hello: &Hello,
        resume: Resume<'_>,
        sha256: Option<[u8; 32]>,
    ) -> Result<IncomingFile, Reject> {
        let (overwrite, dir) = (self.cfg.overwrite, &self.cfg.dir);
        let sink = self
            .store
            .create_announced(hello, overwrite, dir, resume, sha256)?;
        let span = if hello.is_stream() {
            error_span!("file", file = %escaped(&hello.name), size = "unknown")
        } else {
            error_span!("file", file = %escaped(&hello.name), size = hello.size)
        };
        Ok(IncomingFile {
            name: hello.name.clone(),
            size: hello.size,
            digest_alg: hello.digest,
            sink,
            mode: hello.received_mode(self.cfg.umask, self.cfg.keep_modes),
            mtime: hello.mtime,
            hasher: FileHasher::new(hello.digest),
            written: 0,
            resumed_from: 0,
            started: Instant::now(),
            span,
            phases: Phases::default(),
            data_started: Instant::now(),
            check_time: Duration::ZERO,
            write_time: Duration::ZERO,
            // Replaced by the observer's once the offer is accepted.
            progress: crate::engine::progress::NoProgress.file_started("", 0),
            writer: None,
        })
    }

    /// Starts the writer threads (`--threads`) if they are wanted and not
    /// running; if they cannot start, says so once and this thread writes.
    fn start_writers(&mut self) {
        if self.behind.is_some() || self.writers_failed || self.cfg.threads == 0 {
            return;
        }
        match WriteBehind::new(self.cfg.threads, self.cfg.chunk_size as usize) {
            Ok(behind) => self.behind = Some(behind),
            Err(e) => {
                warn!(
                    "cannot start the writer threads ({e}): this session writes on its own thread"
                );
                self.writers_failed = true;
            }
        }
    }

    fn register_ring(&mut self) -> Result<(), XferError> {
        if self.ring.is_none() {
            let len = self.cfg.slots as usize * self.cfg.slot_size() as usize;
            let ring = RemoteRing::new(self.ep.pd(), len)?;
            debug!(
                len,
                slots = self.cfg.slots,
                slot_size = self.cfg.slot_size(),
                rkey = ring.rkey(),
                "ring registered"
            );
            self.ring = Some(ring);
            self.chunk = vec![0; self.cfg.chunk_size as usize];
        }
        Ok(())
    }

    /// Registers the ring before the first offer: while the sender answers
    /// the CHALLENGE, or as soon as it has proven the token, so that no
    /// offer waits for the registration (tens of ms for 16 MiB on
    /// SoftRoCE). Never before the proof: an unproven peer must not pin
    /// the ring's memory. A failure here is not final: the first offer
    /// tries again and tells the sender why.
    fn register_ring_ahead(&mut self) {
        if self.ring.is_some() || self.ring_tried_ahead || self.admission.handshake().is_some() {
            return;
        }
        self.ring_tried_ahead = true;
        if let Err(e) = self.register_ring() {
            debug!("ring not registered ahead of the first offer: {e}");
        }
    }

    /// The ring for an accepted offer, or the refusal that tells the
    /// sender why it cannot be had.
    fn ring_for_offer(&mut self) -> Result<RingInfo, Reject> {
        self.ring_info().map_err(|e| {
            error!("cannot register the receive ring: {e}");
            Reject::new(
                RejectCode::Io,
                format!("the receiver cannot register its ring: {e}"),
            )
        })
    }

    fn ring_info(&mut self) -> Result<RingInfo, XferError> {
        self.register_ring()?;
        let ring = self
            .ring
            .as_ref()
            .ok_or_else(|| XferError::Internal("ring missing".into()))?;
        Ok(RingInfo {
            addr: ring.remote_addr(),
            rkey: ring.rkey(),
            slot_size: self.cfg.slot_size(),
            slot_count: self.cfg.slots,
        })
    }

    fn on_chunk(&mut self, byte_len: u32, imm: u32) -> Result<(), XferError> {
        let placement = match self.machine.on_chunk(byte_len, imm) {
            Ok(p) => p,
            // The machine queued the ACK that tells the sender why.
            Err(e @ RecvError::TooLarge { .. }) => {
                let name = self.file.as_ref().map_or("?", |f| f.name.as_str());
                return Err(self.abandon(XferError::Rejected {
                    code: Some(RejectCode::TooLarge),
                    reason: format!("{name}: {e}"),
                }));
            }
            Err(RecvError::Protocol(source)) => {
                return Err(self.abandon(XferError::Protocol {
                    context: Some("bad data write".into()),
                    source,
                }));
            }
            Err(e) => {
                let err = XferError::Internal(format!("a data write gave {e}"));
                return Err(self.abort(AckStatus::Protocol, err));
            }
        };
        if self
            .file
            .as_mut()
            .is_some_and(|f| f.sink.temp_file().is_some())
        {
            self.start_writers();
        }
        let (Some(ring), Some(file)) = (self.ring.as_ref(), self.file.as_mut()) else {
            return Err(XferError::Internal("data without an open file".into()));
        };
        let t0 = Instant::now();
        let len = placement.len as usize;
        if len > self.chunk.len() {
            return Err(XferError::Internal("chunk longer than a slot".into()));
        }
        // With a token the chunk's tag follows it in the slot: copied out
        // now, checked against the private copy of the bytes.
        let tag = match &placement.auth {
            None => None,
            Some(auth) => {
                let mut tag = [0u8; CHUNK_TAG_LEN];
                ring.copy_out(placement.slot_offset as usize + len, &mut tag)?;
                Some(TagCheck {
                    auth,
                    offset: placement.file_offset,
                    tag,
                })
            }
        };
        // When the chunk passed its check: copying and checking before,
        // writing and hashing after.
        let mut t1 = t0;
        let mut retired = Vec::new();
        let received = match (self.behind.as_mut(), file.sink.temp_file()) {
            // A file with writer threads: copied and checked here, written
            // there (the slot is free once copied).
            (Some(behind), Some(t)) => {
                let handle = match &file.writer {
                    Some(h) => Ok(h.clone()),
                    None => t.writer_handle().inspect(|h| file.writer = Some(h.clone())),
                };
                match handle.and_then(|h| Ok((h, behind.buffer(&mut retired)?))) {
                    Err(e) => Err(ChunkRefused::Write(Unwritten::Failed(e))),
                    Ok((handle, mut buf)) => {
                        // The buffers are slot-sized and len fits a slot
                        // (checked above); were it not so, the chunk fails
                        // like a write, after what retired is recorded.
                        let checked = match buf.get_mut(..len) {
                            Some(data) => per_byte::receive_chunk(
                                |chunk| ring.copy_out(placement.slot_offset as usize, chunk),
                                data,
                                placement.expected_crc,
                                tag.as_ref(),
                                |_, _| {
                                    t1 = Instant::now();
                                    Ok(())
                                },
                                &mut file.hasher,
                            ),
                            None => Err(ChunkRefused::Write(Unwritten::Failed(
                                std::io::Error::other("chunk longer than its buffer"),
                            ))),
                        };
                        match checked {
                            Ok(()) => behind
                                .submit(
                                    &handle,
                                    placement.file_offset,
                                    buf,
                                    len,
                                    placement.expected_crc,
                                )
                                .map_err(|e| ChunkRefused::Write(Unwritten::Failed(e))),
                            Err(refused) => {
                                behind.give_back(buf);
                                Err(refused)
                            }
                        }
                    }
                }
            }
            _ => {
                let data = self
                    .chunk
                    .get_mut(..len)
                    .ok_or_else(|| XferError::Internal("chunk longer than a slot".into()))?;
                per_byte::receive_chunk(
                    |chunk| ring.copy_out(placement.slot_offset as usize, chunk),
                    data,
                    placement.expected_crc,
                    tag.as_ref(),
                    |data, crc| {
                        t1 = Instant::now();
                        file.sink
                            .write(data, placement.file_offset, crc, file.written)
                    },
                    &mut file.hasher,
                )
            }
        };
        if let Some(behind) = self.behind.as_mut() {
            behind.poll(&mut retired);
        }
        // Writes that failed meanwhile count as this chunk's failure.
        let received = match (received, file.sink.chunks_written(retired)) {
            (Ok(()), Err(e)) => Err(ChunkRefused::Write(Unwritten::Failed(e))),
            (received, _) => received,
        };
        let written = match received {
            Ok(()) => Ok(()),
            Err(ChunkRefused::Copy(e)) => return Err(e.into()),
            Err(ChunkRefused::Crc { computed: crc }) => {
                let mut msg = format!(
                    "chunk {} of {} (offset {}) has CRC32 {crc:08x}, the sender computed {:08x}",
                    placement.seq, file.name, placement.file_offset, placement.expected_crc
                );
                if let Some(note) = file.sink.cut_short_note(file.written) {
                    msg.push_str(&note);
                }
                let err = XferError::Integrity(msg);
                return Err(self.abort(AckStatus::Integrity, err));
            }
            Err(ChunkRefused::Forged) => {
                let msg = format!(
                    "chunk {} of {} (offset {}) does not carry its authentication tag: its \
                     bytes were not written by the sender (forged on the way); nothing of it \
                     was used",
                    placement.seq, file.name, placement.file_offset
                );
                let err = XferError::Integrity(msg);
                return Err(self.abort(AckStatus::Integrity, err));
            }
            Err(ChunkRefused::Write(Unwritten::OutOfOrder)) => {
                let err = XferError::Internal(format!(
                    "chunk {} of {} at offset {} is out of order ({} bytes written)",
                    placement.seq, file.name, placement.file_offset, file.written
                ));
                return Err(self.abort(AckStatus::Protocol, err));
            }
            Err(ChunkRefused::Write(Unwritten::Failed(e))) => Err(e),
        };
        if let Err(e) = written {
            let stdout = file.sink.is_standard_output();
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
        file.check_time += t1 - t0;
        file.write_time += t1.elapsed();
        file.progress.advance(placement.len.into());
        if let Some(credit) = self.machine.chunk_done() {
            self.control.send(&self.ep, &credit)?;
        }
        Ok(())
    }

    fn on_fin(&mut self, fin: Fin) -> Result<(), XferError> {
        // Every chunk written before anything is checked or committed.
        if let Some(file) = self.file.as_mut()
            && let Err(e) = settle_writes(self.behind.as_mut(), file)
        {
            let what = format!("cannot write {}", file.name);
            return Err(self.abort(AckStatus::Io, XferError::io(what, e)));
        }
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
        let outcome = file.sink.outcome();
        let (status, reason, err) = if digest != fin.digest {
            let mut reason = format!(
                "whole-file digest mismatch for {}: received data hashes to {}, the sender's is {}",
                file.name,
                digest_hex(&digest),
                digest_hex(&fin.digest)
            );
            // Which part is wrong is unknown: nothing of it is kept (and
            // what cannot be taken back is said).
            if let Some(note) = file.sink.corrupt() {
                reason.push_str(note);
            }
            (
                AckStatus::Integrity,
                reason.clone(),
                Some(XferError::Integrity(reason)),
            )
        } else if self.behind.as_ref().is_some_and(|b| !b.is_idle()) {
            // settle_writes drained them: never commit with a write pending.
            let e = XferError::Internal(format!("{}: writes still pending at FIN", file.name));
            (AckStatus::Io, e.to_string(), Some(e))
        } else {
            match file
                .sink
                .commit(&file.name, file.mode, file.mtime, self.cfg.overwrite)
            {
                // The sender says what became of it too.
                Ok(()) => (AckStatus::Ok, outcome.ack_note().to_string(), None),
                Err(e @ XferError::Integrity(_)) => (AckStatus::Integrity, e.to_string(), Some(e)),
                Err(e) => (AckStatus::Io, e.to_string(), Some(e)),
            }
        };
        let ack = self
            .machine
            .complete(status, reason)
            .map_err(XferError::from)?;
        self.control.send(&self.ep, &ack)?;
        match err {
            None if file.sink.members().is_some() => {
                file.phases.commit = fin_at.elapsed();
                file.phases.log(&file.name, fin.bytes);
                file.progress.finished();
                let Some(batch) = file.sink.batch_mut() else {
                    return Ok(());
                };
                let digests = batch.digests();
                // Each file's share of the batch's time (`Phases::share`).
                let n = u32::try_from(batch.members.len())
                    .unwrap_or(u32::MAX)
                    .max(1);
                for (m, digest) in batch.members.iter().zip(digests) {
                    let report = FileReport {
                        name: m.name.clone(),
                        bytes: m.size,
                        elapsed: file.started.elapsed() / n,
                        digest,
                        phases: file.phases.share(n),
                        resumed_from: 0,
                        outcome,
                    };
                    (self.on_file)(FileEvent::Done(&report));
                }
            }
            None => {
                file.phases.commit = fin_at.elapsed();
                file.phases.log(&file.name, fin.bytes);
                let report = FileReport {
                    name: file.name.clone(),
                    bytes: fin.bytes,
                    elapsed: file.started.elapsed(),
                    digest,
                    phases: file.phases,
                    resumed_from: file.resumed_from,
                    outcome,
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
        if let Some(ack) = self.machine.abort(status, err.to_string()) {
            let _ = self.control.send(&self.ep, &ack);
        }
        self.abandon(err)
    }

    /// The session ends with `err` under the open file (if any), whose
    /// failure is reported; its temporary file goes (or, with RESUME, its
    /// verified part is kept).
    fn abandon(&mut self, err: XferError) -> XferError {
        if let Some(mut file) = self.file.take() {
            end_failed(&mut file, self.behind.as_mut());
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
        // A refused offer's name may hold anything the peer sent.
        let name = escaped(name).to_string();
        let failure = FileFailure::new(
            &name,
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
        if let Some(members) = file.sink.members() {
            for m in members {
                let alg = file.digest_alg;
                self.report_failure(&m.name, m.size, alg, elapsed, err, session_ended);
            }
            return;
        }
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
        if let (Err(e), Some(mut file)) = (&result, self.file.take()) {
            // Where the file stood, for whoever reads the logs.
            file.span.in_scope(|| {
                info!(
                    phase = "data",
                    bytes_done = self.machine.bytes_received(),
                    "file abandoned: {e}"
                )
            });
            end_failed(&mut file, self.behind.as_mut());
            self.report_file_failure(&file, e, true);
        }
        self.file = None;
        self.store.finish_dirs();
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

/// Waits for the file's chunks in the writer threads and records them;
/// the first write that failed is the error.
fn settle_writes(behind: Option<&mut WriteBehind>, file: &mut IncomingFile) -> std::io::Result<()> {
    let Some(behind) = behind else {
        return Ok(());
    };
    let mut retired = Vec::new();
    let drained = behind.drain(&mut retired);
    file.sink.chunks_written(retired)?;
    drained
}

/// Ends a file that failed: what it leaves for a later `sender --resume`
/// (its verified part, on disk and recorded) is kept and said. Its
/// chunks still with the writer threads are waited for first.
fn end_failed(file: &mut IncomingFile, behind: Option<&mut WriteBehind>) {
    if let Err(e) = settle_writes(behind, file) {
        debug!(file = %file.name, "a write failed as the file was abandoned: {e}");
    }
    let kept = file.sink.end_failed();
    if kept > 0 {
        warn!(
            file = %file.name,
            bytes = kept,
            "kept the {kept} bytes verified so far for `sender --resume`"
        );
    }
}
