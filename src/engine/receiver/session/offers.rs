//! A session's offers: HELLO and BATCH checked against the file system and
//! answered (accepted with the ring, refused, or asked about first: the
//! digest for --link-dest or --exec; RESUME's HAVE and COMPARE are file
//! work, `file_work.rs`), and FROM.

use super::relay::OwnVerdict;
use super::{AwaitingFrom, CompareOf, DigestFor, IncomingFile, Session};
use crate::engine::Outcome;
use crate::engine::digest::FileHasher;
use crate::engine::link::ExposedRing;
use crate::engine::progress::Progress;
use crate::engine::receiver::said_upstream;
use crate::engine::receiver::storage::partial::{Claim, KeptPrefix};
use crate::engine::receiver::storage::sink::Sink;
use crate::engine::receiver::storage::temp_file::Resume;
use crate::engine::receiver::storage::write_behind::WriteBehind;
use crate::engine::relay::Kept;
use crate::engine::report::{FileEvent, FileReport, Phases};
use crate::error::XferError;
use crate::proto::{
    AckStatus, DigestAlg, Existing, Found, Hello, HopVerdict, Reject, RejectCode, RingInfo,
    Standing, escaped, hello_flags,
};
use std::time::{Duration, Instant};
use tracing::{debug, error, error_span, info, warn};

impl Session<'_, '_> {
    /// Checks that need the file system, then opens the temporary file and
    /// exposes the ring (registered once per session). A directory is
    /// created (or found) and answered at once.
    pub(super) fn on_hello(&mut self, hello: Hello) -> Result<(), XferError> {
        let hello_at = Instant::now();
        if hello.piece.is_none() && (self.joined)() {
            let refusal = Reject::new(
                RejectCode::Protocol,
                "this receiver (--once) serves one sender: a session that joins its first \
                 carries pieces of its files only (sender --lanes)",
            );
            return self.decline(&hello, refusal);
        }
        if hello.is_directory() {
            info!(dir = %hello.name, "directory");
            if self.machine.offer_is_dry_run() {
                let checked = self.dry_run_checks(&hello);
                return match checked {
                    Ok(()) => Ok(self.machine.accept_directory()?),
                    Err(refusal) => self.refuse(&hello, hello_at, refusal),
                };
            }
            let made = self.store.make_dir(&hello);
            // Over a relay chain the hosts after this one make it too.
            if let Some(forward) = self.forward(&hello, Kept::Nothing) {
                self.forwarded(forward, true);
            }
            return match made {
                Ok(()) => {
                    self.tell_results(HopVerdict::Ack(AckStatus::Ok), 0, "")?;
                    self.machine.accept_directory()?;
                    Ok(())
                }
                Err(refusal) => self.refuse(&hello, hello_at, refusal),
            };
        }
        if let Some(piece) = hello.piece {
            return self.on_piece(hello, piece, hello_at);
        }
        if hello.is_stream() {
            info!(file = %hello.name, "offer of a stream (size unknown)");
        } else {
            info!(file = %hello.name, size = hello.size, "offer");
        }
        if !hello.is_stream() {
            // What is under the final name decides first (re-runs).
            let (found, copy) = self.store.existing(&hello);
            if self.relaying() {
                // Over a chain this host's verdict goes first; with hosts
                // after it, a file it has stays and is passed on all the
                // same (its bytes are not kept here).
                let standing = self.machine.standing_of(found);
                match (standing, self.next_hops().is_some()) {
                    (Standing::Stays(status), true) => {
                        let own = OwnVerdict {
                            verdict: HopVerdict::Ack(status),
                            reason: String::new(),
                        };
                        return self.forward_only_resumable(hello, hello_at, own);
                    }
                    (_, true) if hello.caps & hello_flags::RESUME != 0 => {
                        return self.offer_holding(hello, hello_at);
                    }
                    (_, true) => {
                        return self.prepare_and_accept(&hello, hello_at, Resume::No, None, None);
                    }
                    (Standing::Stays(status), false) => {
                        self.tell_results(HopVerdict::Ack(status), 0, "")?
                    }
                    (_, false) => {}
                }
            }
            match (self.machine.existing(found)?, copy) {
                (Standing::Stays(status), _) => return self.stays(&hello, hello_at, status),
                (Standing::Compare, Some(copy)) => {
                    info!(file = %hello.name, "a file of its size is here: its SHA-256 decides");
                    let waiting = AwaitingFrom::of(hello, hello_at);
                    self.machine
                        .have_found(Found::Complete(CompareOf::Copy(copy)), waiting)?;
                    return Ok(());
                }
                (Standing::Proceed | Standing::Compare, _) => {}
            }
        }
        if hello.caps & hello_flags::RESUME != 0 {
            return self.offer_holding(hello, hello_at);
        }
        if let Some(why) = self.digest_for(&hello) {
            return self.ask_digest(hello, hello_at, why, None);
        }
        self.prepare_and_accept(&hello, hello_at, Resume::No, None, None)
    }

    /// A dry run's checks of the current offer (nothing created).
    fn dry_run_checks(&mut self, hello: &Hello) -> Result<(), Reject> {
        let (overwrite, dir) = (self.cfg.overwrite, &self.cfg.dir);
        self.store
            .dry_run(hello, overwrite, dir, &mut self.would_create)
    }

    /// Whether to ask an offer for its SHA-256 before its data, and why:
    /// for --exec's command, or for the file --link-dest may hold, when
    /// the machine allows the question (`may_ask_digest`). Never in a dry
    /// run: a --link-dest copy would be linked into place.
    pub(super) fn digest_for(&self, hello: &Hello) -> Option<DigestFor> {
        // Nor in a relay chain, whose verdicts go with RESULTs.
        if self.machine.offer_is_dry_run() || self.relaying() {
            return None;
        }
        if let Err(why) = self.machine.may_ask_digest(hello) {
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
    pub(super) fn ask_digest(
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
        let waiting = AwaitingFrom {
            claim,
            ..AwaitingFrom::of(hello, hello_at)
        };
        self.machine.ask_digest(CompareOf::Asked(why), waiting)?;
        Ok(())
    }

    /// A BATCH of small files: each is checked on disk and gets its
    /// temporary file, and the batch gets the ring as one file would. If
    /// any file is refused, the whole batch is (quietly: the sender then
    /// offers each file on its own, and those offers get each file's own
    /// answer, reported as usual).
    pub(super) fn on_batch(&mut self, members: Vec<Hello>) -> Result<(), XferError> {
        let hello_at = Instant::now();
        // A relay hop forwards files one by one.
        if self.relaying() {
            let reason = "a host of a relay chain takes files one by one".to_string();
            self.machine.reject(RejectCode::Protocol, reason)?;
            return Ok(());
        }
        // The machine checked that the sizes add up without overflow.
        let total = members.iter().fold(0u64, |t, h| t.saturating_add(h.size));
        info!(files = members.len(), bytes = total, "offer of a batch");
        // A file --link-dest may hold is asked for its digest: alone.
        let linkable = members
            .iter()
            .find(|h| matches!(self.digest_for(h), Some(DigestFor::Link(_))));
        // Something under a member's name: each file comes alone, so that
        // what is there decides for it (`existing`), never --overwrite
        // alone.
        let taken = || {
            members
                .iter()
                .find(|h| self.store.existing(h).0 != Existing::NoFile)
        };
        let refused = match (linkable, taken()) {
            (Some(h), _) => Some(self.machine.refuse_batch_for_link(&h.name)?),
            (None, Some(h)) => Some(self.machine.refuse_batch_for_existing(&h.name)?),
            (None, None) => None,
        };
        if let Some(Reject { code, reason }) = refused {
            info!(
                code = code.as_str(),
                "batch refused, its files come one by one: {}",
                escaped(&reason)
            );
            return Ok(());
        }
        let prepared = self
            .store
            .create_batch(
                &members,
                self.cfg.overwrite,
                &self.cfg.dir,
                (self.cfg.umask, self.cfg.keep_modes),
            )
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
                self.machine.reject(code, reason)?;
                return Ok(());
            }
        };
        let name = format!(
            "{} files from {}",
            members.len(),
            members.first().map_or("", |h| h.name.as_str())
        );
        let digest_alg = members.first().map_or(DigestAlg::Crc32, |h| h.digest);
        let span = error_span!("batch", files = members.len(), size = total);
        let progress = self
            .cfg
            .progress
            .batch_started(&name, total, members.len() as u64);
        let sink = Sink::Batch(Box::new(batch));
        let file = IncomingFile::accepted(
            name,
            total,
            digest_alg,
            sink,
            span,
            (hello_at, self.connect_time),
            progress,
        );
        self.machine.accept(ring, file).map_err(XferError::from)?;
        Ok(())
    }

    /// FROM answered our HAVE: receive from 0, continue the kept prefix,
    /// or acknowledge the complete copy without any data.
    pub(super) fn on_from(&mut self, offset: u64, waiting: AwaitingFrom) -> Result<(), XferError> {
        let AwaitingFrom {
            hello,
            hello_at,
            kept,
            claim,
            announced,
            own,
        } = waiting;
        if let Some(own) = own {
            return self.forward_only(&hello, hello_at, own);
        }
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
    pub(super) fn prepare_and_accept(
        &mut self,
        hello: &Hello,
        hello_at: Instant,
        resume: Resume<'_>,
        continued: Option<(FileHasher, u64)>,
        sha256: Option<[u8; 32]>,
    ) -> Result<(), XferError> {
        if self.machine.offer_is_dry_run() {
            return match self.dry_run_checks(hello) {
                Ok(()) => {
                    info!(file = %escaped(&hello.name), "dry run: would be received");
                    Ok(self.machine.would_receive()?)
                }
                Err(refusal) => self.refuse(hello, hello_at, refusal),
            };
        }
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
                // A file's time runs from its HELLO, like the sender's.
                file.started = hello_at;
                file.phases.connect = self.connect_time;
                file.phases.mr_exchange = hello_at.elapsed();
                file.data_started = Instant::now();
                file.progress = self.cfg.progress.file_started(&hello.name, hello.size);
                file.progress.advance(file.resumed_from);
                self.forward_resumed(hello, &mut file);
                let temp_file = file.sink.is_temp_file();
                self.machine.accept(ring, file).map_err(XferError::from)?;
                // Writer threads (`--threads`) write temporary files: they
                // start while the MR is on its way.
                self.transmit()?;
                if temp_file {
                    self.start_writers();
                }
                Ok(())
            }
            Err(refusal) => self.refuse_or_forward(hello, hello_at, refusal),
        }
    }

    /// The receiver's file stays as it is (the machine queued the ACK):
    /// reported, nothing read or written.
    pub(super) fn stays(
        &mut self,
        hello: &Hello,
        hello_at: Instant,
        status: AckStatus,
    ) -> Result<(), XferError> {
        info!(file = %escaped(&hello.name), "{}: nothing received", status.as_str());
        let sent = self.transmit();
        let report = FileReport {
            name: hello.name.clone(),
            bytes: hello.size,
            elapsed: hello_at.elapsed(),
            digest: None,
            phases: Phases {
                connect: self.connect_time,
                ..Phases::default()
            },
            resumed_from: 0,
            outcome: Outcome::of_no_data(status).unwrap_or(Outcome::Unchanged),
            host: None,
        };
        (self.on_file)(FileEvent::Done(&report));
        sent
    }

    /// Refuses an offer: logs and reports it, and sends the machine's REJECT.
    pub(super) fn refuse(
        &mut self,
        hello: &Hello,
        hello_at: Instant,
        Reject { code, reason }: Reject,
    ) -> Result<(), XferError> {
        // A chain's hop: its sender hears it in a RESULT (said once).
        said_upstream!(self.cfg, name = %escaped(&hello.name), code = code.as_str(), "refused: {reason}");
        let err = XferError::Rejected {
            code: Some(code),
            reason: reason.clone(),
        };
        // A directory has no size to report.
        let size = if hello.is_directory() { 0 } else { hello.size };
        let elapsed = hello_at.elapsed();
        self.report_failure(&hello.name, size, hello.digest, elapsed, &err, false);
        self.first_error.get_or_insert(err);
        self.tell_results(HopVerdict::Reject(code), 0, &reason)?;
        self.machine.reject(code, reason)?;
        Ok(())
    }

    /// Refuses an offer its sender takes back at once and sends another
    /// way (a piece to a receiver that takes files whole, a whole file to
    /// a session that joined a `--once` receiver's first): neither a
    /// file's failure nor the session's.
    pub(super) fn decline(
        &mut self,
        hello: &Hello,
        Reject { code, reason }: Reject,
    ) -> Result<(), XferError> {
        info!(name = %escaped(&hello.name), "declined: {reason}");
        self.tell_results(HopVerdict::Reject(code), 0, &reason)?;
        self.machine.reject(code, reason)?;
        Ok(())
    }

    /// Opens where the offered file goes (see `FileStore::create`) and
    /// starts its bookkeeping.
    /// `sha256`: the file's digest, if the sender announced it.
    pub(super) fn prepare_file(
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
            forward: None,
            own: None,
            pass_on: None,
        })
    }

    /// Starts the writer threads (`--threads`) if they are wanted and not
    /// running; if they cannot start, says so once and this thread writes.
    pub(super) fn start_writers(&mut self) {
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

    pub(super) fn register_ring(&mut self) -> Result<ExposedRing, XferError> {
        if let Some(ring) = self.ring {
            return Ok(ring);
        }
        let len = self.cfg.slots as usize * self.cfg.slot_size() as usize;
        let ring = self.link.expose_ring(len)?;
        debug!(
            len,
            slots = self.cfg.slots,
            slot_size = self.cfg.slot_size(),
            "ring exposed"
        );
        self.chunk = vec![0; self.cfg.chunk_size as usize];
        Ok(*self.ring.insert(ring))
    }

    /// Registers the ring before the first offer: while the sender answers
    /// the CHALLENGE, or as soon as it has proven the token, so that no
    /// offer waits for the registration (tens of ms for 16 MiB on
    /// SoftRoCE). Never before the proof: an unproven peer must not pin
    /// the ring's memory. A failure here is not final: the first offer
    /// tries again and tells the sender why.
    pub(super) fn register_ring_ahead(&mut self) {
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
    pub(super) fn ring_for_offer(&mut self) -> Result<RingInfo, Reject> {
        self.ring_info().map_err(|e| {
            error!("cannot register the receive ring: {e}");
            Reject::new(
                RejectCode::Io,
                format!("the receiver cannot register its ring: {e}"),
            )
        })
    }

    pub(super) fn ring_info(&mut self) -> Result<RingInfo, XferError> {
        let ring = self.register_ring()?;
        Ok(RingInfo {
            addr: ring.addr,
            rkey: ring.rkey,
            slot_size: self.cfg.slot_size(),
            slot_count: self.cfg.slots,
        })
    }
}
