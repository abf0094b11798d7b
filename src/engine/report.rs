//! Per-file results as the engine produces them: an acknowledged file
//! ([`FileReport`]), a failed one ([`FileFailure`]), and the session's
//! [`Totals`]. How they are shown (text lines, `--json` objects) is
//! `cli::render`'s business.

use crate::error::{ExitCode, XferError};
use crate::proto::{Digest, DigestAlg, escaped};
use std::time::Duration;

/// A file the receiver acknowledged (verified, fsynced and renamed).
#[derive(Debug, Clone)]
pub struct FileReport {
    /// The name (relative path) it arrived under.
    pub name: String,
    /// Its size.
    pub bytes: u64,
    /// From the file's HELLO to its ACK.
    pub elapsed: Duration,
    /// The whole-file digest both sides agreed on.
    /// None when nothing was read: a file left as it is by its size and
    /// modification time (or kept by --ignore-existing, --update).
    pub digest: Option<Digest>,
    /// Where the time went.
    pub phases: Phases,
    /// Bytes at its start that an earlier attempt had delivered and that
    /// were not sent again (`--resume`).
    pub resumed_from: u64,
    /// What became of it.
    pub outcome: Outcome,
    /// The host of a relay chain this is about, as the sender named it
    /// (None: the receiver the session talks to, alone).
    pub host: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_receiver_policy_travels_in_the_ack_note() {
        for o in [Outcome::Stored, Outcome::Discarded, Outcome::Piped] {
            assert_eq!(Outcome::from_ack_note(o.ack_note()), o);
        }
        assert_eq!(Outcome::from_ack_note("something else"), Outcome::Stored);
        assert_eq!(Outcome::Piped.as_str(), "piped");
    }

    #[test]
    fn an_outcome_without_data_is_read_back_from_its_ack_status() {
        for o in [
            Outcome::Unchanged,
            Outcome::KeptExisting,
            Outcome::KeptNewer,
            Outcome::WouldSend,
        ] {
            assert_eq!(Outcome::of_no_data(o.ack_status()), Some(o));
        }
        assert_eq!(Outcome::Stored.ack_status(), crate::proto::AckStatus::Ok);
    }
}

impl FileReport {
    /// Bytes this transfer moved (the file less what was reused).
    pub fn moved(&self) -> u64 {
        if self.outcome.sent_nothing() {
            0
        } else {
            self.bytes.saturating_sub(self.resumed_from)
        }
    }
}

/// What became of an acknowledged file (on the receiver, where its policy
/// decides; the sender knows the outcomes without data, and sees the rest
/// as `Stored`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Outcome {
    /// Received, verified and stored (under --dir, or on standard output).
    #[default]
    Stored,
    /// The receiver had it: the same size and modification time, or (by
    /// SHA-256: --checksum, --resume) the same content. Nothing was sent.
    Unchanged,
    /// A file was there and stays (sender --ignore-existing): nothing was
    /// sent.
    KeptExisting,
    /// The receiver's file is newer and stays (sender --update): nothing
    /// was sent.
    KeptNewer,
    /// The receiver had it under --link-dest and linked (or copied) it
    /// into place: nothing was sent.
    Linked,
    /// Received and verified, then dropped (receiver --discard).
    Discarded,
    /// Received, verified and handed to the receiver's --exec command,
    /// which read all of it and exited 0.
    Piped,
    /// A dry run: the receiver would take it (nothing sent or written).
    WouldSend,
    /// A piece of a file sent over lanes, verified and kept by the
    /// receiver; its file is not whole yet (never a file's own outcome).
    PieceKept,
}

impl Outcome {
    /// The word for `--json` (`"outcome"`) and the logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Stored => "stored",
            Outcome::Unchanged => "unchanged",
            Outcome::KeptExisting => "kept-existing",
            Outcome::KeptNewer => "kept-newer",
            Outcome::Linked => "linked",
            Outcome::Discarded => "discarded",
            Outcome::Piped => "piped",
            Outcome::WouldSend => "would-send",
            Outcome::PieceKept => "piece-kept",
        }
    }

    /// The note an ACK(ok) carries for it, so that the sender says what
    /// the receiver did ("" for a stored file: what old senders expect).
    pub fn ack_note(self) -> &'static str {
        match self {
            Outcome::Discarded => "discarded",
            Outcome::Piped => "piped",
            Outcome::Stored
            | Outcome::Unchanged
            | Outcome::KeptExisting
            | Outcome::KeptNewer
            | Outcome::Linked
            | Outcome::WouldSend
            | Outcome::PieceKept => "",
        }
    }

    /// What an ACK(ok)'s note says became of a file sent (any other note,
    /// from a receiver that says more, is a stored file).
    pub fn from_ack_note(note: &str) -> Outcome {
        match note {
            "discarded" => Outcome::Discarded,
            "piped" => Outcome::Piped,
            _ => Outcome::Stored,
        }
    }

    /// The outcome of an ACK that answers a HELLO without data
    /// (`AckStatus::without_data`), if it is one.
    pub fn of_no_data(status: crate::proto::AckStatus) -> Option<Outcome> {
        use crate::proto::AckStatus;
        match status {
            AckStatus::Unchanged => Some(Outcome::Unchanged),
            AckStatus::KeptExisting => Some(Outcome::KeptExisting),
            AckStatus::KeptNewer => Some(Outcome::KeptNewer),
            AckStatus::WouldReceive => Some(Outcome::WouldSend),
            AckStatus::PieceKept => Some(Outcome::PieceKept),
            _ => None,
        }
    }

    /// The ACK status a receiver answers with for this outcome: the one
    /// `of_no_data` reads back, else Ok.
    pub fn ack_status(self) -> crate::proto::AckStatus {
        use crate::proto::AckStatus;
        match self {
            Outcome::Unchanged => AckStatus::Unchanged,
            Outcome::KeptExisting => AckStatus::KeptExisting,
            Outcome::KeptNewer => AckStatus::KeptNewer,
            Outcome::WouldSend => AckStatus::WouldReceive,
            Outcome::PieceKept => AckStatus::PieceKept,
            _ => AckStatus::Ok,
        }
    }

    /// No data crossed the link for it.
    pub fn sent_nothing(self) -> bool {
        matches!(
            self,
            Outcome::Unchanged
                | Outcome::KeptExisting
                | Outcome::KeptNewer
                | Outcome::Linked
                | Outcome::WouldSend
        )
    }

    /// The receiver's file was left as it is (unchanged or kept).
    pub fn left_as_is(self) -> bool {
        matches!(
            self,
            Outcome::Unchanged | Outcome::KeptExisting | Outcome::KeptNewer
        )
    }
}

/// Where a file's time went, as each side sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Setting up the session's connection (shared by its files).
    pub connect: Duration,
    /// HELLO to MR: the receiver's checks and ring registration.
    pub mr_exchange: Duration,
    /// MR to FIN: the data itself.
    pub data: Duration,
    /// FIN to ACK: whole-file verify, fsync and rename on the receiver.
    pub commit: Duration,
}

impl Phases {
    /// One file's share of a batch's phases (`n` files): the batch's time
    /// split evenly, so that sums over files are the batch's. The
    /// connection is shared by every file anyway.
    pub fn share(self, n: u32) -> Phases {
        let n = n.max(1);
        Phases {
            connect: self.connect,
            mr_exchange: self.mr_exchange / n,
            data: self.data / n,
            commit: self.commit / n,
        }
    }

    /// Logs the phases as structured fields (JSON logs carry them).
    pub fn log(&self, name: &str, bytes: u64) {
        tracing::info!(
            file = %escaped(name),
            bytes,
            connect_s = self.connect.as_secs_f64(),
            mr_exchange_s = self.mr_exchange.as_secs_f64(),
            data_s = self.data.as_secs_f64(),
            fsync_verify_s = self.commit.as_secs_f64(),
            "file done"
        );
    }
}

/// A file that was not transferred: refused by the receiver, failed its
/// check, or cut short by an error that ended the session.
#[derive(Debug, Clone)]
pub struct FileFailure {
    /// The name (relative path) it was offered under.
    pub name: String,
    /// The file's size (as offered), not what got across.
    pub bytes: u64,
    /// The whole-file digest it was to be checked with.
    pub digest_alg: DigestAlg,
    /// From the file's HELLO to the failure.
    pub elapsed: Duration,
    /// The session's connection set-up (shared by its files).
    pub connect: Duration,
    /// The exit code class of the error.
    pub exit_code: ExitCode,
    /// The error's message.
    pub reason: String,
    /// A refusal's reason code for scripts ("exists", "busy", "auth"...).
    pub reason_code: Option<&'static str>,
    /// Whether sending it again later may succeed.
    pub retryable: bool,
    /// The failure ended the session (later files were not transferred).
    pub session_ended: bool,
    /// As `FileReport::host`.
    pub host: Option<String>,
}

impl FileFailure {
    /// Records `error` (its exit code and message) as the failure of a file.
    pub fn new(
        name: &str,
        bytes: u64,
        digest_alg: DigestAlg,
        elapsed: Duration,
        connect: Duration,
        error: &XferError,
        session_ended: bool,
    ) -> Self {
        FileFailure {
            name: name.to_string(),
            bytes,
            digest_alg,
            elapsed,
            connect,
            exit_code: error.exit_code(),
            reason: error.to_string(),
            reason_code: error.reason_code(),
            retryable: error.is_transient(),
            session_ended,
            host: None,
        }
    }
}

/// What the engine reports per file: acknowledged, or failed with a reason.
#[derive(Debug, Clone, Copy)]
pub enum FileEvent<'a> {
    /// The receiver acknowledged the file.
    Done(&'a FileReport),
    /// The file was not transferred.
    Failed(&'a FileFailure),
}

/// Per-file results summed over a session (or a serving receiver's
/// lifetime), for the final `--json` summary.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Files acknowledged.
    pub files: u64,
    /// Bytes of the acknowledged files.
    pub bytes: u64,
    /// Files that failed.
    pub failed: u64,
    /// Acknowledged files the receiver had already (nothing sent).
    pub unchanged: u64,
    /// Acknowledged files left as they were by the sender's
    /// --ignore-existing or --update (nothing sent).
    pub kept: u64,
    /// Acknowledged files linked from the receiver's --link-dest (nothing
    /// sent).
    pub linked: u64,
    /// Acknowledged files verified and dropped (receiver --discard).
    pub discarded: u64,
    /// Bytes the acknowledged files moved (less what was resumed or
    /// skipped).
    pub sent: u64,
    /// Every file's HELLO-to-end time (acknowledged or not).
    pub file_time: Duration,
    /// The session's connection set-up (counted once).
    pub connect: Duration,
    /// Sums over the acknowledged files of their phases.
    pub mr_exchange: Duration,
    /// See `mr_exchange`.
    pub data: Duration,
    /// See `mr_exchange`.
    pub commit: Duration,
}

impl Totals {
    /// Counts one file's result.
    pub fn add(&mut self, event: FileEvent<'_>) {
        match event {
            FileEvent::Done(r) => {
                self.files += 1;
                self.bytes += r.bytes;
                self.unchanged += u64::from(r.outcome == Outcome::Unchanged);
                self.kept += u64::from(matches!(
                    r.outcome,
                    Outcome::KeptExisting | Outcome::KeptNewer
                ));
                self.linked += u64::from(r.outcome == Outcome::Linked);
                self.discarded += u64::from(r.outcome == Outcome::Discarded);
                self.sent += r.moved();
                self.file_time += r.elapsed;
                self.connect = self.connect.max(r.phases.connect);
                self.mr_exchange += r.phases.mr_exchange;
                self.data += r.phases.data;
                self.commit += r.phases.commit;
            }
            FileEvent::Failed(f) => {
                self.failed += 1;
                self.file_time += f.elapsed;
                self.connect = self.connect.max(f.connect);
            }
        }
    }
}
