//! One connection to a receiver and its session: set-up (connect, the
//! greeting, authentication), the loop over the entries, the events and
//! completions that drive the machine, and the close.

use super::batch::{Fed, Next, Queue};
use super::pace::Pacer;
use super::pump::{Flow, Offered, Pipeline, Work};
use super::verdicts::{PendingEntry, Tracker};
use super::{
    FileError, RECV_BUFFERS, SEND_BUFFERS, SenderConfig, ack_error, fatal, open_offer, proto_err,
    unexpected,
};
use crate::engine::control::{Control, Undelivered};
use crate::engine::entries::Entry;
use crate::engine::link::{RdmaLink, WriteDelivery, WriteLink};
use crate::engine::reader::{Input, RelayedInput};
use crate::error::XferError;
use crate::proto::{
    FileOffer, NONCE_LEN, OfferKind, Role, SenderAuth, SenderEvent, SenderSession, Waiting, escaped,
};
use crate::sys::SysError;
use crate::sys::rdma::{BufferPool, CmId, Endpoint, EventChannel, QpCaps};
use std::collections::VecDeque;
use std::fs::File;
use std::time::{Duration, Instant};
use tracing::{debug, error_span, info};

pub(super) struct Connection {
    pub(super) connect_time: Duration,
    pub(super) link: Box<dyn WriteLink>,
    pub(super) session: SenderSession<PendingEntry>,
    /// State machine events not yet acted upon, in order.
    pub(super) events: VecDeque<SenderEvent<PendingEntry>>,
    /// `--bwlimit`, and when the chunk it held back may go.
    pub(super) pacer: Option<Pacer>,
    pub(super) paced_until: Option<Instant>,
    /// A relay chain's hosts (`SenderConfig::relay`), told to the
    /// receiver once it is authenticated.
    relay: Vec<String>,
    /// A lane's: when it last heard its receiver, and whether the lanes'
    /// dispatcher gave it up.
    pub(super) watch: Option<std::sync::Arc<super::lanes::LaneWatch>>,
}

impl Connection {
    /// Connects, and registers the staging pool while the receiver answers.
    pub(super) fn open(
        cfg: &SenderConfig,
    ) -> Result<(Self, (BufferPool, Vec<crate::sys::rdma::Buffer>)), XferError> {
        let connect_err = |source: SysError| match source {
            SysError::NoDevice { .. } | SysError::NotRdmaAddress(_) | SysError::Memlock { .. } => {
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
        crate::engine::tune_ack_timeout(ep.cm_id(), cfg.ack_timeout);
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
                    conn: crate::engine::connection_id(&ep, Role::Sender)?,
                })
            }
        };
        let session = session_for(cfg, auth);
        let mut conn = Connection::new(connect_time, Box::new(RdmaLink::new(ep, control)), session);
        conn.pace(cfg);
        Ok((conn, staging))
    }

    /// A session's connection over `link`, before the greeting.
    pub(super) fn new(
        connect_time: Duration,
        link: Box<dyn WriteLink>,
        session: SenderSession<PendingEntry>,
    ) -> Self {
        Connection {
            connect_time,
            link,
            session,
            events: VecDeque::new(),
            pacer: None,
            paced_until: None,
            relay: Vec::new(),
            watch: None,
        }
    }

    /// Paces the chunk writes to `--bwlimit`, if given.
    pub(super) fn pace(&mut self, cfg: &SenderConfig) {
        self.pacer = cfg
            .bwlimit
            .map(|rate| Pacer::new(rate, cfg.chunk_size, Instant::now()));
    }

    /// The whole session, one loop: each turn takes what the link
    /// delivered (messages through the machine, completed writes back to
    /// the reader) and the reader's chunks, does what the machine's state
    /// allows (chunks written under credit, FIN, the next entry or batch),
    /// then waits on the reader, the read that answers a HAVE, or the link
    /// until the machine's next deadline. Ends with BYE once every entry is
    /// answered.
    pub(super) fn run(
        &mut self,
        cfg: &SenderConfig,
        mut queue: Queue,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), XferError> {
        self.relay = cfg.relay.clone();
        let mut work = None;
        let result = self.turns(cfg, &mut queue, &mut work, pipe, tracker);
        if let Err(e) = &result {
            // What was under way, and what was sent but never answered:
            // the session ended under them.
            if let Some(w) = work.take() {
                if w.is_file() {
                    // Where the file stood, for whoever reads the logs.
                    info!(
                        file = %escaped(&w.name),
                        bytes_done = self.session.bytes_planned(),
                        "file abandoned: {e}"
                    );
                }
                for (name, size) in w.names() {
                    tracker.report(&name, size, Some(w.started), e, true);
                }
            }
            // Verdicts that came with the failure are not applied (as
            // before the loop); then the entries not answered at all.
            let answered = self.events.drain(..).filter_map(|event| match event {
                SenderEvent::Answered { payload, .. } => Some(payload),
                _ => None,
            });
            let answered: Vec<PendingEntry> = answered.collect();
            for entry in answered.into_iter().chain(self.session.take_unanswered()) {
                for (name, bytes, started) in entry.names() {
                    tracker.report(&name, bytes, Some(started), e, true);
                }
            }
        }
        result
    }

    fn turns(
        &mut self,
        cfg: &SenderConfig,
        queue: &mut Queue,
        work: &mut Option<Work>,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), XferError> {
        loop {
            let span = work.as_ref().map(|w| (w.span.clone(), w.phase.clone()));
            let _file = span.as_ref().map(|(file, _)| file.enter());
            let _phase = span.as_ref().map(|(_, phase)| phase.enter());
            fatal(self.poll_link(pipe))?;
            while let Some(event) = self.events.pop_front() {
                let flow = self.on_event(cfg, event, work, pipe, tracker);
                settle(flow, work, queue, tracker)?;
            }
            if let Some(w) = work.as_mut() {
                let flow = self.have_read_done(w).and_then(|()| self.advance(w, pipe));
                settle(flow, work, queue, tracker)?;
            }
            if work.is_none() && self.session.can_start() {
                // A chain's hops forward files one by one.
                let may_batch = self.session.may_batch() && cfg.relay.is_empty();
                match queue.next(cfg, may_batch, tracker) {
                    Some(next) => {
                        // The finished work's spans are left first: the next
                        // file's span is the session's child, not theirs
                        // (else every file's span would hold all earlier
                        // ones, and each log line name them all).
                        drop((_phase, _file));
                        *work = self.start(cfg, next, queue, pipe, tracker)?;
                        continue;
                    }
                    None if self.session.pending() == 0 => match queue.drained() {
                        Fed::More => {
                            // The receiver's silence while the feed was
                            // idle was ours: its wait starts now.
                            self.session.heard(Instant::now());
                            continue;
                        }
                        Fed::Over => return self.close(pipe),
                    },
                    None => {}
                }
            }
            if !self.events.is_empty() {
                continue;
            }
            fatal(self.check_watch())?;
            fatal(match work.as_mut() {
                Some(w) if w.have_read.is_some() => self.wait_have_read(w, pipe),
                Some(w) if w.waits_on_reader(pipe) => self.wait_reader(cfg, w, pipe),
                Some(w) => {
                    let since = Instant::now();
                    let waited = self.wait_peer(pipe);
                    w.waited_on_link(since);
                    waited
                }
                None => self.wait_peer(pipe),
            })?;
        }
    }

    /// One machine event: a verdict, the greeting, or the current
    /// offer's answer.
    fn on_event(
        &mut self,
        cfg: &SenderConfig,
        event: SenderEvent<PendingEntry>,
        work: &mut Option<Work>,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Flow, FileError> {
        match event {
            SenderEvent::Answered {
                payload, verdict, ..
            } => {
                if let (PendingEntry::Files { .. }, Some(w)) = (&payload, &self.watch) {
                    w.fin_answered();
                }
                tracker.answer(payload, verdict)?
            }
            SenderEvent::Greeted(greeting) => {
                self.transmit()?;
                if greeting.proving {
                    debug!("the receiver requires authentication: PROVE sent");
                }
            }
            SenderEvent::Keepalive => {
                debug!(
                    "the receiver's KEEPALIVE (it reads its copy, waits for the hosts after it, \
                     or answers a lane's probe)"
                )
            }
            SenderEvent::HopResult(result) => tracker.chain.result(result),
            SenderEvent::Aborted(failed) => {
                return Err(FileError::Fatal(ack_error(failed)));
            }
            event => {
                return match work.as_mut() {
                    Some(w) => self.on_offer_event(cfg, w, event, pipe, tracker),
                    None => Err(unexpected(&event)),
                };
            }
        }
        Ok(Flow::Going)
    }

    /// Offers the next entry: a directory (its HELLO: nothing more to do
    /// until its verdict), a file or stream, or a batch. A file that cannot
    /// be opened fails on its own.
    /// A failure that ends the session is reported for the entry (a
    /// batch's files: see `start_batch`).
    fn start(
        &mut self,
        cfg: &SenderConfig,
        next: Next,
        queue: &mut Queue,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<Option<Work>, XferError> {
        let entry = match next {
            Next::Batch(entries) => return self.start_batch(cfg, entries, queue, pipe, tracker),
            Next::Alone(entry) => entry,
        };
        let (name, size, started) = (entry.name().to_string(), entry.size(), Instant::now());
        match self.offer(cfg, entry) {
            Ok(work) => Ok(work),
            Err(FileError::Continue(e)) => {
                tracker.fail(&name, size, Some(started), e);
                Ok(None)
            }
            Err(FileError::Fatal(e)) => {
                info!(file = %escaped(&name), bytes_done = 0, "file abandoned: {e}");
                tracker.report(&name, size, Some(started), &e, true);
                Err(e)
            }
        }
    }

    /// Offers `entry` alone: its HELLO, and for a file or stream the
    /// work of sending its data.
    fn offer(&mut self, cfg: &SenderConfig, entry: Entry) -> Result<Option<Work>, FileError> {
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
                    existing: Default::default(),
                    piece: None,
                };
                let dir = PendingEntry::Dir {
                    name,
                    started: Instant::now(),
                };
                self.session.start_file(offer, dir).map_err(proto_err)?;
                self.transmit()?;
                return Ok(None);
            }
            Entry::Stdin { name } => {
                use std::os::fd::AsFd;
                let stdin = std::io::stdin().as_fd().try_clone_to_owned().map_err(|e| {
                    FileError::Fatal(XferError::io("cannot read standard input", e))
                })?;
                crate::engine::stdio::grow_pipe(&stdin, cfg.chunk_size as usize);
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
                    existing: Default::default(),
                    piece: None,
                };
                let file = File::from(stdin);
                (offer, Input::Stream { file, whole: None })
            }
            // The bytes come as the hop receives them (after the part it
            // kept), offered as the file they are; a committed copy is a
            // file like any.
            Entry::Relayed {
                offer,
                kept,
                pipe,
                whole,
                flowing,
            } => match (pipe, kept) {
                (Some(pipe), kept) => {
                    let input = RelayedInput::new(kept, pipe, whole, flowing);
                    (offer, Input::Relayed(input))
                }
                (None, Some((file, size))) => (
                    offer,
                    Input::File {
                        file,
                        size,
                        start: 0,
                    },
                ),
                (None, None) => {
                    return Err(FileError::Fatal(XferError::Internal(
                        "a relayed entry with nothing to read".into(),
                    )));
                }
            },
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
                (
                    offer,
                    Input::File {
                        file,
                        size,
                        start: 0,
                    },
                )
            }
            // A piece of a file sent over lanes: its bytes from its place.
            Entry::Piece { offer, file, start } => {
                let size = offer.size;
                (offer, Input::File { file, size, start })
            }
        };
        let stream = offer.kind == OfferKind::Stream;
        let name = offer.name.clone();
        // A stream's size is unknown (0 here: its bar grows as it goes).
        let size = offer.size;
        let span = if stream {
            error_span!("file", file = %escaped(&name), size = "unknown")
        } else {
            error_span!("file", file = %escaped(&name), size = offer.size)
        };
        let phase = error_span!(parent: &span, "phase", name = "mr exchange");
        let work = Work::new(
            name.clone(),
            (span, phase),
            Offered::File {
                input: Some(input),
                stream,
                size,
            },
            self.connect_time,
        );
        // Its verdict's payload comes with its FIN (`awaiting_ack`).
        self.session.offer_file(offer).map_err(proto_err)?;
        self.transmit()?;
        Ok(Some(work))
    }

    /// Takes what the link delivered, without waiting (see
    /// `handle_deliveries`).
    fn poll_link(&mut self, pipe: &mut Pipeline<'_>) -> Result<(), FileError> {
        let polled = self.link.poll();
        self.handle_deliveries(pipe)?;
        polled.map_err(|e| self.failure(e))
    }

    /// A completion failed (the receiver went away, typically): if the
    /// receiver told why just before, that is the better error.
    pub(super) fn failure(&mut self, err: XferError) -> FileError {
        let said = self.events.iter().find_map(|e| match e {
            SenderEvent::Aborted(failed) => Some(failed.clone()),
            _ => None,
        });
        FileError::Fatal(match said {
            Some(failed) => ack_error(failed),
            None => err,
        })
    }

    /// Waits on the receiver until the link delivers something or the
    /// machine's next deadline (its receive timeout, which then ends the
    /// session, saying what was awaited).
    fn wait_peer(&mut self, pipe: &mut Pipeline<'_>) -> Result<(), FileError> {
        let now = Instant::now();
        self.session.waiting(Waiting::Peer, now);
        let deadline = self
            .session
            .poll_timeout()
            .unwrap_or_else(|| crate::sys::os::deadline_after(Duration::MAX));
        // A chunk held back by --bwlimit goes when it may.
        let deadline = self
            .paced_until
            .take()
            .map_or(deadline, |at| at.min(deadline));
        // A lane looks at its dispatcher's word now and then.
        let deadline = match self.watch {
            Some(_) => deadline.min(now + super::lanes::WATCH_EVERY),
            None => deadline,
        };
        let waited = self.link.wait_until(deadline, self.session.waited_for());
        // What came before a failure still counts.
        self.handle_deliveries(pipe)?;
        match waited {
            // (Woken: what came is taken by `handle_deliveries`; the lane's
            // watch hears only what the receiver sent.)
            Ok(true) => self.session.heard(Instant::now()),
            Ok(false) => {
                self.session
                    .handle_timeout(Instant::now())
                    .map_err(proto_err)?;
                // A lane's probe (KEEPALIVE), if one is due, goes now.
                if self.transmit()? > 0 {
                    debug!("probe sent while waiting for {}", self.session.waited_for());
                }
            }
            Err(e) => return Err(self.failure(e)),
        }
        self.check_watch()
    }

    /// A lane the dispatcher gave up (its path silent) ends here.
    pub(super) fn check_watch(&self) -> Result<(), FileError> {
        match self.watch.as_ref().and_then(|w| w.given_up()) {
            Some(silent) => Err(FileError::Fatal(XferError::io(
                "lane given up",
                std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "its receiver did not answer for {:.1} s while the other lanes were heard",
                        silent.as_secs_f64()
                    ),
                ),
            ))),
            None => Ok(()),
        }
    }

    /// The link delivered something: the receiver is there.
    fn heard(&mut self) {
        let now = Instant::now();
        self.session.heard(now);
        if let Some(w) = &self.watch {
            w.heard(now);
        }
    }

    /// Applies what the link delivered: slots go back to the reader,
    /// messages through the state machine (its events queue up in
    /// `events`, credits apart).
    pub(super) fn handle_deliveries(&mut self, pipe: &mut Pipeline<'_>) -> Result<(), FileError> {
        while let Some(delivery) = self.link.next()? {
            // The receiver's timeout starts again (when it is awaited).
            self.heard();
            match delivery {
                WriteDelivery::Written(token) => pipe.write_done(token),
                WriteDelivery::Message(decoded) => {
                    let msg = decoded.map_err(|undelivered| match undelivered {
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
                        SenderEvent::Authenticated(channel) => {
                            // Sealed from the very next message on, in
                            // both directions.
                            self.link.install(channel);
                            info!("receiver authenticated");
                            // The chain after it, before any offer.
                            if !self.relay.is_empty() {
                                self.session.relay(&self.relay).map_err(proto_err)?;
                                self.transmit()?;
                            }
                        }
                        event => self.events.push_back(event),
                    }
                }
            }
        }
        Ok(())
    }

    /// Sends what the machine queued for the receiver, in order; says how
    /// many messages went.
    pub(super) fn transmit(&mut self) -> Result<usize, XferError> {
        let mut sent = 0;
        while let Some(msg) = self.session.poll_transmit() {
            self.link.send(&msg)?;
            sent += 1;
        }
        Ok(sent)
    }

    /// Ends the session politely: BYE, wait until it is delivered, disconnect.
    pub(super) fn close(&mut self, pipe: &mut Pipeline<'_>) -> Result<(), XferError> {
        self.session.close().map_err(XferError::from)?;
        self.transmit()?;
        while self.link.busy() {
            // Closed: any message of the receiver's is an error.
            let delivered = self.wait_peer(pipe);
            match delivered {
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
        self.link.disconnect(Duration::from_secs(2));
        Ok(())
    }

    pub(super) fn abort(&mut self) {
        self.link.disconnect(Duration::from_secs(1));
    }
}

/// What the loop makes of a step of the current work: a file's own
/// failure (refused, say) is reported and the session goes on; any other
/// error ends the session.
fn settle(
    flow: Result<Flow, FileError>,
    work: &mut Option<Work>,
    queue: &mut Queue,
    tracker: &mut Tracker<'_>,
) -> Result<(), XferError> {
    match flow {
        Ok(Flow::Going) => {}
        Ok(Flow::Done) => *work = None,
        Ok(Flow::Requeue(back)) => {
            queue.put_back(back);
            *work = None;
        }
        Err(FileError::Continue(e)) => match work.take() {
            Some(w) if w.is_file() => {
                let size = w.names().first().map_or(0, |(_, size)| *size);
                tracker.fail(&w.name, size, Some(w.started), e);
            }
            Some(w) => {
                *work = Some(w);
                return Err(e);
            }
            None => return Err(e),
        },
        Err(FileError::Fatal(e)) => return Err(e),
    }
    Ok(())
}

/// The session's machine as `cfg` asks for it: its chunk size, timeout
/// and, for --dry-run, offers that are a dry run's.
pub(super) fn session_for<P>(cfg: &SenderConfig, auth: Option<SenderAuth>) -> SenderSession<P> {
    let session = SenderSession::carrying(cfg.chunk_size, auth).with_timeout(cfg.timeout);
    let session = if cfg.lane { session.probing() } else { session };
    if cfg.dry_run {
        session.dry_run()
    } else {
        session
    }
}
