//! One connection to a receiver and its session: set-up (connect, the
//! greeting, authentication), the loop over the entries, the events and
//! completions that drive the machine, and the close.

use super::batch;
use super::pump::Pipeline;
use super::verdicts::{PendingEntry, Tracker};
use super::{
    FileError, RECV_BUFFERS, SEND_BUFFERS, SenderConfig, ack_error, below_any, fatal, open_offer,
    proto_err, unexpected,
};
use crate::engine::control::{Control, Undelivered};
use crate::engine::entries::Entry;
use crate::engine::link::{Delivery, RdmaLink, WriteLink};
use crate::engine::reader::Input;
use crate::error::XferError;
use crate::proto::{
    FileOffer, NONCE_LEN, OfferKind, Role, SenderAuth, SenderEvent, SenderSession, SenderState,
    escaped,
};
use crate::sys::SysError;
use crate::sys::rdma::{BufferPool, CmId, Endpoint, EventChannel, QpCaps};
use std::collections::VecDeque;
use std::fs::File;
use std::time::{Duration, Instant};
use tracing::{debug, info};

pub(super) struct Connection {
    pub(super) connect_time: Duration,
    pub(super) link: Box<dyn WriteLink>,
    pub(super) session: SenderSession,
    /// State machine events not yet acted upon, in order.
    pub(super) events: VecDeque<SenderEvent>,
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
        let session = SenderSession::new(cfg.chunk_size, auth);
        let conn = Connection::new(connect_time, Box::new(RdmaLink::new(ep, control)), session);
        Ok((conn, staging))
    }

    /// A session's connection over `link`, before the greeting.
    pub(super) fn new(
        connect_time: Duration,
        link: Box<dyn WriteLink>,
        session: SenderSession,
    ) -> Self {
        Connection {
            connect_time,
            link,
            session,
            events: VecDeque::new(),
        }
    }

    /// The whole session: greeting, every entry (pipelined), the last
    /// verdicts, BYE.
    pub(super) fn run(
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

    pub(super) fn run_entries(
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
            } else if batch::batchable(cfg, &entry) && self.session.may_batch() {
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

    /// Waits for the receiver's greeting: CHALLENGE (answered with PROVE when
    /// it requires authentication; the first HELLO follows without waiting)
    /// or a REJECT that refuses the session.
    pub(super) fn greet(
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
                    self.transmit()?;
                    if greeting.proving {
                        debug!("the receiver requires authentication: PROVE sent");
                    }
                }
                // AUTH_OK installs its channel as it is handled
                // (`handle_deliveries`): the loop ends, Idle.
                Some(other) => return Err(unexpected(&other)),
            }
        }
        Ok(())
    }

    /// One wait in which only verdicts and credits may arrive.
    pub(super) fn expect_nothing(
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

    pub(super) fn send_entry(
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
                self.session.start_file(offer, tag).map_err(proto_err)?;
                self.transmit()?;
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
    pub(super) fn poll_events(
        &mut self,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), FileError> {
        let polled = self.link.poll();
        self.handle_deliveries(pipe)?;
        if let Err(e) = polled {
            return Err(self.failure(e));
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
    pub(super) fn failure(&mut self, err: XferError) -> FileError {
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
    pub(super) fn next_event(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
        what: &str,
    ) -> Result<Option<SenderEvent>, FileError> {
        if self.events.is_empty() {
            let waited = self.link.wait_for(cfg.timeout, what);
            // What came before a failure still counts.
            self.handle_deliveries(pipe)?;
            if let Err(e) = waited {
                return Err(self.failure(e));
            }
        }
        self.pop_event(tracker)
    }

    pub(super) fn pop_event(
        &mut self,
        tracker: &mut Tracker<'_>,
    ) -> Result<Option<SenderEvent>, FileError> {
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

    /// Applies what the link delivered: slots go back to the reader,
    /// messages through the state machine (its events queue up in
    /// `events`, credits apart).
    pub(super) fn handle_deliveries(&mut self, pipe: &mut Pipeline<'_>) -> Result<(), FileError> {
        while let Some(delivery) = self.link.next()? {
            match delivery {
                Delivery::Written(token) => pipe.write_done(token),
                Delivery::Message(decoded) => {
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
                        }
                        event => self.events.push_back(event),
                    }
                }
                // The receiver's ring is not ours.
                Delivery::Chunk { .. } => {
                    return Err(FileError::Fatal(XferError::Internal(
                        "a data write into the sender".into(),
                    )));
                }
            }
        }
        Ok(())
    }

    /// Sends what the machine queued for the receiver, in order.
    pub(super) fn transmit(&mut self) -> Result<(), XferError> {
        while let Some(msg) = self.session.poll_transmit() {
            self.link.send(&msg)?;
        }
        Ok(())
    }

    /// Ends the session politely: BYE, wait until it is delivered, disconnect.
    pub(super) fn close(
        &mut self,
        cfg: &SenderConfig,
        pipe: &mut Pipeline<'_>,
        tracker: &mut Tracker<'_>,
    ) -> Result<(), XferError> {
        self.session.close().map_err(XferError::from)?;
        self.transmit()?;
        while self.link.busy() {
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
        self.link.disconnect(Duration::from_secs(2));
        Ok(())
    }

    pub(super) fn abort(&mut self) {
        self.link.disconnect(Duration::from_secs(1));
    }
}
