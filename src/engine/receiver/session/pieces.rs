//! A session's pieces: an offer that is one piece of a file sent over
//! several lanes (`sender --lanes`), written at its place in the file the
//! receiver's sessions share (`storage::pieces`). The first piece of a
//! file meets the checks a whole file's offer meets (what is under its
//! final name, the space, the name); the others join it.

use super::Session;
use super::{IncomingFile, Sink};
use crate::engine::receiver::storage::pieces::{PieceBoard, PieceSink};
use crate::engine::receiver::storage::temp_file::Resume;
use crate::error::XferError;
use crate::proto::assembly::Piece;
use crate::proto::{Hello, Reject, RejectCode, Standing, escaped, hello_flags};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tracing::{debug, error_span};

type Shared = Arc<Mutex<crate::engine::receiver::storage::pieces::Assembling>>;

impl Session<'_, '_> {
    /// HELLO of a piece: received into its file, answered at once if it
    /// was verified before, or refused.
    pub(super) fn on_piece(
        &mut self,
        hello: Hello,
        piece: Piece,
        hello_at: Instant,
    ) -> Result<(), XferError> {
        debug!(
            file = %escaped(&hello.name),
            piece = piece.index,
            of = piece.count(),
            "offer of a piece"
        );
        if let Err(refusal) = self.held.may_take(piece.transfer) {
            return self.refuse(&hello, hello_at, refusal);
        }
        let board: &PieceBoard = &self.cfg.pieces;
        let file = match board.find(piece.transfer) {
            Some(file) => file,
            None => match self.start_pieces(&hello, &piece, hello_at)? {
                Some(file) => file,
                // Answered: the file stays, or it was refused.
                None => return Ok(()),
            },
        };
        match self.held.offer(file, &hello, &piece) {
            Ok(Ok(sink)) => self.accept_piece(&hello, sink, hello_at),
            Ok(Err(file_whole)) => {
                debug!(file = %escaped(&hello.name), piece = piece.index, "verified before");
                self.machine.piece_verified_before(file_whole)?;
                self.transmit()
            }
            Err(refusal) => self.refuse(&hello, hello_at, refusal),
        }
    }

    /// The first piece of a file seen: what is under its final name
    /// decides first, as for the whole file's offer; then its temporary
    /// file is made for the whole file. None: the offer was answered (the
    /// file stays, or it is refused).
    fn start_pieces(
        &mut self,
        hello: &Hello,
        piece: &Piece,
        hello_at: Instant,
    ) -> Result<Option<Shared>, XferError> {
        if self.relaying() || !self.store.takes_pieces() {
            let refusal = Reject::new(
                RejectCode::Protocol,
                "this receiver takes files whole (standard output, --exec, --discard or a \
                 relay chain): they go on one lane",
            );
            self.decline(hello, refusal)?;
            return Ok(None);
        }
        let whole = Hello {
            caps: hello.caps & !hello_flags::PIECE,
            size: piece.file_size,
            piece: None,
            ..hello.clone()
        };
        let (found, _) = self.store.existing(&whole);
        if let Standing::Stays(status) = self.machine.existing(found)? {
            self.stays(&whole, hello_at, status)?;
            return Ok(None);
        }
        let (overwrite, dir) = (self.cfg.overwrite, &self.cfg.dir);
        let created = self
            .store
            .create_announced(&whole, overwrite, dir, Resume::No, None);
        let temp = match created {
            Ok(Sink::Temp(temp)) => temp,
            Ok(_) => {
                let refusal = Reject::new(RejectCode::Io, "no temporary file for the pieces");
                self.refuse(hello, hello_at, refusal)?;
                return Ok(None);
            }
            Err(refusal) => {
                self.refuse(hello, hello_at, refusal)?;
                return Ok(None);
            }
        };
        match self.cfg.pieces.start(hello, piece, *temp) {
            Ok(file) => Ok(Some(file)),
            Err(refusal) => {
                self.refuse(hello, hello_at, refusal)?;
                Ok(None)
            }
        }
    }

    /// Accepts a piece: the ring, and its bytes to its place.
    fn accept_piece(
        &mut self,
        hello: &Hello,
        sink: PieceSink,
        hello_at: Instant,
    ) -> Result<(), XferError> {
        let ring = match self.ring_for_offer() {
            Ok(ring) => ring,
            // The piece goes back (its sink's drop): it may come again.
            Err(refusal) => return self.refuse(hello, hello_at, refusal),
        };
        let span = error_span!("piece", file = %escaped(&hello.name), size = hello.size);
        let progress = self.cfg.progress.file_started(&hello.name, hello.size);
        let mut file = IncomingFile::accepted(
            hello.name.clone(),
            hello.size,
            hello.digest,
            Sink::Piece(Box::new(sink)),
            span,
            (hello_at, self.connect_time),
            progress,
        );
        file.mode = hello.received_mode(self.cfg.umask, self.cfg.keep_modes);
        file.mtime = hello.mtime;
        self.machine.accept(ring, file)?;
        self.transmit()
    }
}
