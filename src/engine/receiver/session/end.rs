//! How a session ends: a fatal error told to the sender (best effort),
//! the file it ends under kept for a resume or removed, the failures
//! reported, queued replies drained, directories given their attributes,
//! the disconnect.

use super::data::end_failed;
use super::{IncomingFile, Session};
use crate::engine::report::{FileEvent, FileFailure};
use crate::error::XferError;
use crate::proto::{AckStatus, DigestAlg, escaped};
use std::time::Duration;
use tracing::{info, warn};

impl Session<'_, '_> {
    /// A fatal error mid-session: tell the sender why (best effort), and
    /// return the error. The temporary file is removed when `file` drops.
    pub(super) fn abort(&mut self, status: AckStatus, err: XferError) -> XferError {
        self.machine.abort(status, err.to_string());
        // Best effort: the session ends with `err` either way.
        let _ = self.transmit();
        self.abandon(err)
    }

    /// The session ends with `err` under the open file (if any), whose
    /// failure is reported; its temporary file goes (or, with RESUME, its
    /// verified part is kept).
    pub(super) fn abandon(&mut self, err: XferError) -> XferError {
        if let Some(file) = self.machine.take_file() {
            self.end_file(file, &err);
        }
        err
    }

    /// `abort` when the machine has handed the file back already (FIN).
    pub(super) fn abort_file(
        &mut self,
        file: IncomingFile,
        status: AckStatus,
        err: XferError,
    ) -> XferError {
        self.machine.abort(status, err.to_string());
        // Best effort: the session ends with `err` either way.
        let _ = self.transmit();
        self.end_file(file, &err);
        err
    }

    /// A file the session ends under: what it leaves for a resume is
    /// kept, and its failure reported.
    pub(super) fn end_file(&mut self, mut file: IncomingFile, err: &XferError) {
        end_failed(&mut file, self.behind.as_mut());
        self.report_file_failure(&file, err, true);
    }

    /// Reports a file that was not received (`on_file`).
    pub(super) fn report_failure(
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

    pub(super) fn report_file_failure(
        &self,
        file: &IncomingFile,
        err: &XferError,
        session_ended: bool,
    ) {
        let elapsed = file.started.elapsed();
        // A piece's failure is not its file's: the piece goes back to be
        // sent again, on this lane or another.
        if file.sink.piece().is_some() {
            warn!(
                file = %file.name,
                "a piece of it failed (its sender sends it again, or fails the file): {err}"
            );
            return;
        }
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
    pub(super) fn finish(mut self, result: Result<(), XferError>) -> Result<(), XferError> {
        // File work still running is for an offer nobody waits for now:
        // stopped (and its thread joined) before anything else ends.
        self.work = None;
        self.link.drain();
        if let (Err(e), Some(file)) = (&result, self.machine.take_file()) {
            // Where the file stood, for whoever reads the logs.
            file.span.in_scope(|| {
                info!(
                    phase = "data",
                    bytes_done = self.machine.bytes_received(),
                    "file abandoned: {e}"
                )
            });
            self.end_file(file, e);
        }
        // Directories get their attributes before the sender, waiting for
        // the disconnect, looks.
        self.store.finish_dirs();
        self.link.disconnect(Duration::from_secs(1));
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
