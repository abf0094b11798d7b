//! The receiver's verdicts: what the sender machine carries for each
//! entry until its verdict (`PendingEntry`), the session's results so
//! far, and the wording of a REJECT(version) from an older receiver
//! (`older_receiver`).

use super::{FileError, SessionOutcome, ack_error};
use crate::engine::progress::FileProgress;
use crate::engine::report::{FileEvent, FileFailure, FileReport};
use crate::error::XferError;
use crate::proto::{Capability, DigestAlg, FailedAck, Reject, Verdict, escaped};
use std::time::{Duration, Instant};
use tracing::debug;

/// What the sender machine carries for an entry, from its offer to its
/// verdict (`SenderSession<PendingEntry>`).
/// A file, stream or batch carries nothing until its FIN
/// (`offer_file`, `finish_carrying`): no verdict can find it unsent.
pub(super) enum PendingEntry {
    Dir {
        name: String,
        started: Instant,
    },
    /// A file, or a batch of files, whose FIN went out: one verdict for
    /// all of them; their reports lack only that. Its log span (the
    /// "fsync+verify" phase) goes with it: the verdict may come during
    /// another entry.
    Files {
        reports: Vec<FileReport>,
        fin_sent: Instant,
        span: tracing::Span,
        /// Finished on ACK(ok); dropped unfinished on a failure.
        progress: Box<dyn FileProgress>,
    },
}

impl PendingEntry {
    /// The files (or directory) of the entry, with their sizes and when
    /// they were offered: what is reported if it is never answered.
    pub(super) fn names(&self) -> Vec<(String, u64, Instant)> {
        match self {
            PendingEntry::Dir { name, started } => {
                vec![(name.clone(), 0, *started)]
            }
            PendingEntry::Files {
                reports, fin_sent, ..
            } => reports
                .iter()
                .map(|r| (r.name.clone(), r.bytes, *fin_sent))
                .collect(),
        }
    }
}

impl std::fmt::Debug for PendingEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PendingEntry::Dir { name, .. } => write!(f, "Dir({})", escaped(name)),
            PendingEntry::Files { reports, .. } => write!(f, "Files({})", reports.len()),
        }
    }
}

/// The session's results so far.
pub(super) struct Tracker<'f> {
    pub(super) outcome: SessionOutcome,
    pub(super) on_file: &'f mut dyn FnMut(FileEvent<'_>),
    /// For failure reports: the session's connection set-up, the digest.
    pub(super) connect: Duration,
    pub(super) digest_alg: DigestAlg,
    /// Directories the receiver refused: what is below them is not
    /// offered (a refused `.git` would be refused thousands of times).
    pub(super) refused_dirs: Vec<String>,
    /// A relay chain's hosts, the first the one the session talks to,
    /// and the RESULTs for the entry whose verdict comes next
    /// (`relayed.rs`); no chain: reports as the receiver's verdicts say.
    pub(super) chain: super::relayed::Chain,
    /// Whether the session's outcome keeps each file's report (not when
    /// its entries are fed: `on_file` has them).
    pub(super) keeps_reports: bool,
}

impl Tracker<'_> {
    /// Keeps a file's report in the session's outcome (see
    /// `keeps_reports`).
    fn keep(&mut self, report: FileReport) {
        if self.keeps_reports {
            self.outcome.files.push(report);
        }
    }

    /// An entry failed and the session goes on (`started`: when its HELLO
    /// went out); the first such failure is the session's exit status.
    pub(super) fn fail(&mut self, name: &str, bytes: u64, started: Option<Instant>, e: XferError) {
        // The tool prints the failure (`sender: error: NAME: ...`); the
        // log keeps it for -v and JSON logs.
        tracing::info!(file = %escaped(name), "failed: {e}");
        self.report(name, bytes, started, &e, false);
        self.note_error(e);
    }

    /// The session's exit status: its first failure, or over a relay
    /// chain the worst of its hosts'.
    pub(super) fn note_error(&mut self, e: XferError) {
        match &self.outcome.first_error {
            Some(first) if !self.chain.is_on() || first.exit_code() >= e.exit_code() => {}
            _ => self.outcome.first_error = Some(e),
        }
    }

    /// Tells `on_file` about a failed entry.
    pub(super) fn report(
        &mut self,
        name: &str,
        bytes: u64,
        started: Option<Instant>,
        e: &XferError,
        session_ended: bool,
    ) {
        let failure = FileFailure::new(
            name,
            bytes,
            self.digest_alg,
            started.map_or(Duration::ZERO, |t| t.elapsed()),
            self.connect,
            e,
            session_ended,
        );
        if self.chain.is_on() {
            return self.failed_over_chain(failure);
        }
        (self.on_file)(FileEvent::Failed(&failure));
    }

    /// The receiver's verdict on the entry that carried `sent`.
    pub(super) fn answer(&mut self, sent: PendingEntry, verdict: Verdict) -> Result<(), FileError> {
        self.chain.verdict();
        match (sent, verdict) {
            (
                PendingEntry::Files {
                    reports,
                    fin_sent,
                    span,
                    mut progress,
                },
                verdict,
            ) => {
                let _enter = span.enter();
                // A batch's files share its commit time evenly, as its
                // other phases.
                let n = u32::try_from(reports.len()).unwrap_or(u32::MAX).max(1);
                let commit = fin_sent.elapsed() / n;
                // ACK(ok) says how it was stored; anything else fails it.
                // (The machine refuses a file's REJECT after its FIN; taken
                // as said all the same.)
                let piece_kept = matches!(
                    &verdict,
                    Verdict::Ack(a) if a.status == crate::proto::AckStatus::PieceKept
                );
                let stored = Refusal::of(verdict);
                if stored.is_ok() {
                    progress.finished();
                }
                drop(progress);
                for mut report in reports {
                    report.phases.commit = commit;
                    report.elapsed += commit;
                    match &stored {
                        Ok(note) => {
                            if piece_kept {
                                report.outcome = crate::engine::Outcome::PieceKept;
                            } else if report.outcome == crate::engine::Outcome::Stored {
                                report.outcome = crate::engine::Outcome::from_ack_note(note);
                            }
                            report.phases.log(&report.name, report.bytes);
                            if self.chain.is_on() {
                                self.done_over_chain(report);
                                continue;
                            }
                            (self.on_file)(FileEvent::Done(&report));
                            self.keep(report);
                        }
                        Err(refusal) => {
                            let err = refusal.clone().error();
                            let started = Instant::now().checked_sub(report.elapsed);
                            self.fail(&report.name, report.bytes, started, err);
                        }
                    }
                }
            }
            (PendingEntry::Dir { name, started }, verdict) => {
                let err = match Refusal::of(verdict) {
                    Ok(_) => {
                        debug!(dir = %name, "directory done");
                        self.outcome.directories += 1;
                        if self.chain.is_on() {
                            self.dir_over_chain(&name, started, |host| {
                                XferError::PeerLost(format!(
                                    "no result from {}: the chain ended before it",
                                    escaped(host)
                                ))
                            });
                        }
                        return Ok(());
                    }
                    Err(refusal) if self.chain.is_on() => {
                        // Each host's own verdict; a host without one has
                        // the refusal's.
                        let refusal = refusal.clone();
                        self.dir_over_chain(&name, started, |_| refusal.clone().error());
                        let err = refusal.error();
                        self.note_error(err);
                        return Ok(());
                    }
                    Err(refusal) => refusal.error(),
                };
                // Over a chain the other hosts may have made it: what lies
                // below goes on.
                if !self.chain.is_on() {
                    self.refused_dirs.push(name.clone());
                }
                self.fail(&name, 0, Some(started), err);
            }
        }
        Ok(())
    }
}

/// Reports over a relay chain (`relayed.rs`): each host's RESULT.
impl Tracker<'_> {
    /// The chain's verdict on a file was a success: each host's result.
    pub(super) fn done_over_chain(&mut self, report: FileReport) {
        let (results, silent) = self.chain.take();
        let started = Instant::now().checked_sub(report.elapsed);
        for result in results {
            match super::relayed::host_verdict(&result) {
                Ok(outcome) => {
                    let mut theirs = report.clone();
                    theirs.outcome = outcome;
                    // What it kept from an earlier transfer: the rest came.
                    theirs.resumed_from = match outcome.sent_nothing() {
                        true => 0,
                        false => report.bytes.saturating_sub(result.bytes),
                    };
                    if outcome.sent_nothing() {
                        theirs.digest = None;
                    }
                    theirs.host = Some(result.host);
                    (self.on_file)(FileEvent::Done(&theirs));
                    self.keep(theirs);
                }
                Err(e) => self.host_failed(&result.host, &report.name, report.bytes, started, e),
            }
        }
        for host in silent {
            let e = XferError::PeerLost(format!(
                "no result from {}: the chain ended before it",
                escaped(&host)
            ));
            self.host_failed(&host, &report.name, report.bytes, started, e);
        }
    }

    /// The chain's verdict on a directory: the hosts that failed it (a
    /// host without a RESULT failed with `silent`'s error).
    pub(super) fn dir_over_chain(
        &mut self,
        name: &str,
        started: Instant,
        silent: impl Fn(&str) -> XferError,
    ) {
        let (results, hosts) = self.chain.take();
        for result in results {
            if let Err(e) = super::relayed::host_verdict(&result) {
                self.host_failed(&result.host, name, 0, Some(started), e);
            }
        }
        for host in hosts {
            self.host_failed(&host, name, 0, Some(started), silent(&host));
        }
    }

    /// The chain's verdict on an entry was a failure (`failure`): the hosts' own results where they came, else the
    /// failure for each host that sent none.
    pub(super) fn failed_over_chain(&mut self, failure: FileFailure) {
        let (results, silent) = self.chain.take();
        let started = Instant::now().checked_sub(failure.elapsed);
        for result in results {
            match super::relayed::host_verdict(&result) {
                Err(theirs) => {
                    self.host_failed(&result.host, &failure.name, failure.bytes, started, theirs)
                }
                // A host that has the file: its success stands.
                Ok(outcome) => {
                    let report = FileReport {
                        name: failure.name.clone(),
                        bytes: failure.bytes,
                        elapsed: failure.elapsed,
                        digest: None,
                        phases: Default::default(),
                        resumed_from: 0,
                        outcome,
                        host: Some(result.host),
                    };
                    (self.on_file)(FileEvent::Done(&report));
                    self.keep(report);
                }
            }
        }
        // The failure's own error is the caller's to note (the exit
        // status), once.
        for host in silent {
            let mut theirs = failure.clone();
            theirs.host = Some(host);
            (self.on_file)(FileEvent::Failed(&theirs));
        }
    }

    /// One host failed the entry `name`.
    fn host_failed(
        &mut self,
        host: &str,
        name: &str,
        bytes: u64,
        started: Option<Instant>,
        e: XferError,
    ) {
        tracing::info!(host = %escaped(host), file = %escaped(name), "failed: {e}");
        let mut failure = FileFailure::new(
            name,
            bytes,
            self.digest_alg,
            started.map_or(Duration::ZERO, |t| t.elapsed()),
            self.connect,
            &e,
            false,
        );
        failure.host = Some(host.to_string());
        (self.on_file)(FileEvent::Failed(&failure));
        self.note_error(e);
    }
}

/// A file (or batch) whose FIN goes out now (or that the receiver has
/// complete): it awaits the receiver's ACK from now, in its
/// "fsync+verify" phase span.
pub(super) fn awaiting_ack(
    reports: Vec<FileReport>,
    progress: Box<dyn FileProgress>,
) -> PendingEntry {
    PendingEntry::Files {
        reports,
        fin_sent: Instant::now(),
        span: tracing::error_span!("phase", name = "fsync+verify"),
        progress,
    }
}

/// Why the receiver failed an entry: an ACK with a failure status, or
/// a REJECT.
#[derive(Clone)]
enum Refusal {
    Failed(FailedAck),
    Rejected(Reject),
}

impl Refusal {
    /// ACK(ok)'s note (how it was stored), or why it failed.
    fn of(verdict: Verdict) -> Result<String, Self> {
        match verdict {
            Verdict::Ack(ack) => {
                FailedAck::of(ack).map_or_else(|ok| Ok(ok.reason), |f| Err(Refusal::Failed(f)))
            }
            Verdict::Reject(r) => Err(Refusal::Rejected(r)),
        }
    }

    fn error(self) -> XferError {
        match self {
            Refusal::Failed(failed) => ack_error(failed),
            Refusal::Rejected(r) => XferError::Rejected {
                code: Some(r.code),
                reason: r.reason,
            },
        }
    }
}

/// How a REJECT(version) from a receiver that predates `lacks` is told:
/// which option to drop. `detail`: both versions, as the machine says.
pub(super) fn older_receiver(lacks: Capability, detail: &str) -> String {
    match lacks {
        Capability::Checksum => format!(
            "the receiver cannot take digests (older version): send without --checksum ({detail})"
        ),
        Capability::Resume => format!(
            "the receiver cannot resume transfers (it runs an older version): upgrade it, or \
             send without --resume and --retry ({detail})"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_older_receiver_is_named_with_the_option_to_drop() {
        let detail = "the receiver says: HELLO flags 0x40 are not supported";
        let checksum = older_receiver(Capability::Checksum, detail);
        assert!(
            checksum.contains(
                "the receiver cannot take digests (older version): send without --checksum"
            ) && checksum.contains("0x40"),
            "{checksum}"
        );
        let resume = older_receiver(Capability::Resume, detail);
        assert!(resume.contains("cannot resume transfers"), "{resume}");
        assert!(resume.ends_with(&format!("({detail})")), "{resume}");
    }
}
