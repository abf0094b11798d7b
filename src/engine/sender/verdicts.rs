//! The receiver's verdicts: entries sent but not yet answered (keyed by
//! the tag each went out with), the session's results so far, and the
//! wording of a REJECT(version) from an older receiver (`older_receiver`).

use super::{FileError, SessionOutcome, ack_error};
use crate::engine::progress::FileProgress;
use crate::engine::report::{FileEvent, FileFailure, FileReport};
use crate::error::XferError;
use crate::proto::{AckStatus, DigestAlg, Pending, RejectCode, Verdict, escaped, hello_flags};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};
use tracing::debug;

/// An entry sent but not yet answered by the receiver.
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
            PendingEntry::Dir { name, started } => vec![(name.clone(), 0, *started)],
            PendingEntry::Files {
                reports, fin_sent, ..
            } => reports
                .iter()
                .map(|r| (r.name.clone(), r.bytes, *fin_sent))
                .collect(),
        }
    }
}

/// Entries awaiting their verdict, and the session's results so far.
pub(super) struct Tracker<'f> {
    /// Keyed by the tag each entry's HELLO went out with.
    pub(super) pending: BTreeMap<u64, PendingEntry>,
    pub(super) next_tag: u64,
    pub(super) outcome: SessionOutcome,
    pub(super) on_file: &'f mut dyn FnMut(FileEvent<'_>),
    /// For failure reports: the session's connection set-up, the digest.
    pub(super) connect: Duration,
    pub(super) digest_alg: DigestAlg,
    /// Directories the receiver refused: what is below them is not
    /// offered (a refused `.git` would be refused thousands of times).
    pub(super) refused_dirs: Vec<String>,
}

impl Tracker<'_> {
    /// An entry failed and the session goes on (`started`: when its HELLO
    /// went out); the first such failure is the session's exit status.
    pub(super) fn fail(&mut self, name: &str, bytes: u64, started: Option<Instant>, e: XferError) {
        // The tool prints the failure (`sender: error: NAME: ...`); the
        // log keeps it for -v and JSON logs.
        tracing::info!(file = %escaped(name), "failed: {e}");
        self.report(name, bytes, started, &e, false);
        self.outcome.first_error.get_or_insert(e);
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
        (self.on_file)(FileEvent::Failed(&failure));
    }

    /// A file whose FIN went out (or that the receiver has complete)
    /// awaits the receiver's ACK.
    pub(super) fn await_verdict(
        &mut self,
        tag: u64,
        report: FileReport,
        progress: Box<dyn FileProgress>,
    ) {
        self.await_batch_verdict(tag, vec![report], progress);
    }

    /// A batch whose FIN went out awaits the receiver's ACK, from now, in
    /// its "fsync+verify" phase span.
    pub(super) fn await_batch_verdict(
        &mut self,
        tag: u64,
        reports: Vec<FileReport>,
        progress: Box<dyn FileProgress>,
    ) {
        let span = tracing::error_span!("phase", name = "fsync+verify");
        let entry = PendingEntry::Files {
            reports,
            fin_sent: Instant::now(),
            span,
            progress,
        };
        self.pending.insert(tag, entry);
    }

    /// A tag for the next entry offered.
    pub(super) fn tag(&mut self) -> u64 {
        self.next_tag += 1;
        self.next_tag
    }

    /// The receiver's verdict on the entry offered with `tag`.
    pub(super) fn answer(
        &mut self,
        tag: u64,
        entry: Pending,
        verdict: Verdict,
    ) -> Result<(), FileError> {
        let mismatch = || {
            FileError::Fatal(XferError::Internal(format!(
                "a verdict for {entry:?} {tag} does not match the entries sent"
            )))
        };
        let Some(sent) = self.pending.remove(&tag) else {
            return Err(mismatch());
        };
        match (sent, entry, verdict) {
            (
                PendingEntry::Files {
                    reports,
                    fin_sent,
                    span,
                    mut progress,
                },
                Pending::File,
                Verdict::Ack(ack),
            ) => {
                let _enter = span.enter();
                // A batch's files share its commit time evenly, as its
                // other phases.
                let n = u32::try_from(reports.len()).unwrap_or(u32::MAX).max(1);
                let commit = fin_sent.elapsed() / n;
                if ack.status == AckStatus::Ok {
                    progress.finished();
                }
                drop(progress);
                for mut report in reports {
                    report.phases.commit = commit;
                    report.elapsed += commit;
                    if ack.status == AckStatus::Ok {
                        if report.outcome == crate::engine::Outcome::Stored {
                            report.outcome = crate::engine::Outcome::from_ack_note(&ack.reason);
                        }
                        report.phases.log(&report.name, report.bytes);
                        (self.on_file)(FileEvent::Done(&report));
                        self.outcome.files.push(report);
                    } else {
                        let err = ack_error(ack.status, ack.reason.clone());
                        let started = Instant::now().checked_sub(report.elapsed);
                        self.fail(&report.name, report.bytes, started, err);
                    }
                }
            }
            (PendingEntry::Dir { name, started }, Pending::Directory, verdict) => {
                let err = match verdict {
                    Verdict::Ack(ack) if ack.status == AckStatus::Ok => {
                        debug!(dir = %name, "directory done");
                        self.outcome.directories += 1;
                        return Ok(());
                    }
                    Verdict::Ack(ack) => ack_error(ack.status, ack.reason),
                    Verdict::Reject(rej) => XferError::Rejected {
                        code: Some(rej.code),
                        reason: rej.reason,
                    },
                };
                self.refused_dirs.push(name.clone());
                self.fail(&name, 0, Some(started), err);
            }
            _ => return Err(mismatch()),
        }
        Ok(())
    }
}

/// A REJECT(version) of an offer (or a batch's members, `caps` OR-ed)
/// with flags an older receiver of this protocol version does not know
/// (it ends the session): says which option to drop. CHECKSUM is named
/// first, being the newer flag.
pub(super) fn older_receiver(e: FileError, caps: u32) -> FileError {
    let reason = match e {
        FileError::Fatal(XferError::Rejected {
            code: Some(RejectCode::Version),
            reason,
        }) => reason,
        other => return other,
    };
    let reason = if caps & hello_flags::CHECKSUM != 0 {
        format!(
            "the receiver cannot take digests (older version): send without --checksum ({reason})"
        )
    } else if caps & hello_flags::RESUME != 0 {
        format!(
            "the receiver cannot resume transfers (it runs an older version): upgrade it, or \
             send without --resume and --retry ({reason})"
        )
    } else {
        reason
    };
    FileError::Fatal(XferError::Rejected {
        code: Some(RejectCode::Version),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version_refusal() -> FileError {
        FileError::Fatal(XferError::Rejected {
            code: Some(RejectCode::Version),
            reason: "the receiver says: HELLO flags 0x40 are not supported".into(),
        })
    }

    fn reason(e: FileError) -> String {
        match e {
            FileError::Fatal(e) | FileError::Continue(e) => e.to_string(),
        }
    }

    #[test]
    fn an_older_receiver_is_named_with_the_option_to_drop() {
        let checksum = reason(older_receiver(
            version_refusal(),
            hello_flags::CHECKSUM | hello_flags::RESUME | hello_flags::MTIME,
        ));
        assert!(
            checksum.contains(
                "the receiver cannot take digests (older version): send without --checksum"
            ) && checksum.contains("0x40"),
            "{checksum}"
        );
        let resume = reason(older_receiver(
            version_refusal(),
            hello_flags::RESUME | hello_flags::MTIME,
        ));
        assert!(resume.contains("cannot resume transfers"), "{resume}");
        // Without either flag, or another refusal: as it came.
        let plain = reason(older_receiver(version_refusal(), hello_flags::MTIME));
        assert!(!plain.contains("--"), "{plain}");
        let exists = FileError::Fatal(XferError::Rejected {
            code: Some(RejectCode::Exists),
            reason: "f exists".into(),
        });
        assert!(reason(older_receiver(exists, hello_flags::CHECKSUM)).ends_with(": f exists"));
    }
}
