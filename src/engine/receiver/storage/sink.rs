//! Where one accepted offer's bytes go, whatever the receiver's policy:
//! a temporary file under --dir (committed once verified), the files of a
//! batch, standard output, nowhere (--discard), a command (--exec). The session drives every
//! sink through the same calls: write a checked chunk, hear that the data
//! failed its whole-file check, commit, end uncommitted. Naming,
//! confinement and refusals happen before a sink exists (`FileStore`).

use super::batch::{BatchMember, BatchSink};
use super::exec::{ExecFailure, ExecSink};
use super::pieces::{PieceEnd, PieceSink};
use super::temp_file::TempFile;
use super::write_behind::Retired;
use crate::engine::Outcome;
use crate::error::XferError;
use crate::proto::Digest;
use crate::proto::Mtime;
use std::fs::File;
use std::io::Write;

pub(in crate::engine::receiver) enum Sink {
    /// A temporary file next to the final name (see `TempFile`).
    Temp(Box<TempFile>),
    /// The files of a batch (see `BatchSink`).
    Batch(Box<BatchSink>),
    /// Standard output (chunks arrive in order and are written as they come).
    Stdout(File),
    /// --discard: every chunk is checked and hashed, then dropped.
    Discard,
    /// --exec: the standard input of the file's command (in order).
    Exec(Box<ExecSink>),
    /// One piece of a file sent over lanes, written at its place in the
    /// file its sessions share (see `pieces`).
    Piece(Box<PieceSink>),
}

impl Sink {
    /// Writes the checked chunk `data` (CRC32 `crc`) at `offset`; `written`
    /// is how much of the file came before. Standard output and a command
    /// take the chunks as they come: the machine places each one right
    /// after the one before (`offset == written`).
    pub(in crate::engine::receiver) fn write(
        &mut self,
        data: &[u8],
        offset: u64,
        crc: u32,
        written: u64,
    ) -> std::io::Result<()> {
        match self {
            Sink::Temp(t) => t.write_chunk(data, offset, crc),
            Sink::Batch(b) => b.write_chunk(data, offset),
            Sink::Stdout(out) => out.write_all(data),
            Sink::Exec(e) => e.write(data, written),
            Sink::Piece(p) => p.write(data, offset),
            Sink::Discard => Ok(()),
        }
    }

    /// Makes the data written so far durable, for a temporary file (a
    /// commit's fsync has less left to do then); nothing for the others.
    pub(in crate::engine::receiver) fn sync_data(&self) -> std::io::Result<()> {
        match self {
            Sink::Temp(t) => t.file.sync_data(),
            _ => Ok(()),
        }
    }

    /// Whether it writes a temporary file (the writer threads' work).
    pub(in crate::engine::receiver) fn is_temp_file(&self) -> bool {
        matches!(self, Sink::Temp(_))
    }

    /// A descriptor to read back what is written (a relay hop passes its
    /// kept part on from it): a continued partial file's.
    pub(in crate::engine::receiver) fn kept_part(&self) -> std::io::Result<std::fs::File> {
        match self {
            Sink::Temp(t) => t.file.try_clone(),
            _ => Err(std::io::Error::other("nothing of it is kept here")),
        }
    }

    /// The file for writer threads (`--threads`): only a temporary file
    /// takes them.
    pub(in crate::engine::receiver) fn temp_file(&mut self) -> Option<&mut TempFile> {
        match self {
            Sink::Temp(t) => Some(t),
            _ => None,
        }
    }

    /// Records chunks the writer threads are done with, in order: after
    /// the first that failed nothing more is (a kept prefix has no holes),
    /// and that failure is returned.
    pub(in crate::engine::receiver) fn chunks_written(
        &mut self,
        retired: Vec<Retired>,
    ) -> std::io::Result<()> {
        let Sink::Temp(t) = self else {
            return Ok(());
        };
        for r in retired {
            match r.result {
                Ok(()) => t.chunk_written(r.len, r.crc)?,
                Err(e) => {
                    t.write_failed();
                    let at = format!("at offset {}: {e}", r.offset);
                    return Err(std::io::Error::new(e.kind(), at));
                }
            }
        }
        Ok(())
    }

    /// Standard output: its reader may end the session by closing it, and
    /// what was written cannot be taken back.
    pub(in crate::engine::receiver) fn is_standard_output(&self) -> bool {
        matches!(self, Sink::Stdout(_))
    }

    /// What a failed chunk check (after `written` good bytes) leaves where
    /// the bytes went, if anything worth saying.
    pub(in crate::engine::receiver) fn cut_short_note(&self, written: u64) -> Option<String> {
        match self {
            Sink::Stdout(_) => Some(format!(
                "; standard output got only the {written} bytes before it"
            )),
            Sink::Exec(_) => Some(format!(
                "; the --exec command got only the {written} bytes before it, and was stopped"
            )),
            _ => None,
        }
    }

    /// The data failed its whole-file check: nothing of it may be kept.
    /// Returns what the failure leaves behind that the reason must say.
    pub(in crate::engine::receiver) fn corrupt(&mut self) -> Option<&'static str> {
        match self {
            Sink::Temp(t) => {
                t.discard();
                None
            }
            // Written bytes cannot be taken back: say so, loudly.
            Sink::Stdout(_) => {
                Some("; the data already written to the receiver's standard output is corrupt")
            }
            // Ended before it sees the end of its input.
            Sink::Exec(e) => {
                e.stop();
                Some("; the --exec command was stopped before the end of its input")
            }
            Sink::Batch(_) | Sink::Discard => None,
            // Its place in the file is not counted verified: the piece
            // comes again.
            Sink::Piece(p) => {
                p.end_failed();
                None
            }
        }
    }

    /// Makes a verified file durable: for a temporary file, apply the mode
    /// (and mtime), fsync, rename into place, fsync the directory; for
    /// standard output, fsync when it is a file. A batch: every file is
    /// fsynced before any is renamed, and each directory is fsynced once,
    /// after the last rename into it.
    pub(in crate::engine::receiver) fn commit(
        &mut self,
        name: &str,
        mode: u32,
        mtime: Option<Mtime>,
        overwrite: bool,
    ) -> Result<(), XferError> {
        match self {
            Sink::Stdout(out) => match out.sync_all() {
                // A pipe or terminal cannot be fsynced (EINVAL); a file can.
                Err(e) if !matches!(e.raw_os_error(), Some(libc::EINVAL | libc::EROFS)) => {
                    Err(XferError::io("cannot fsync standard output", e))
                }
                _ => Ok(()),
            },
            Sink::Batch(b) => b.commit(overwrite),
            Sink::Temp(t) => t.commit(name, mode, mtime, overwrite),
            Sink::Piece(p) => p.commit(name, mode, mtime, overwrite),
            Sink::Discard => Ok(()),
            Sink::Exec(e) => e.finish().map_err(|failure| match failure {
                ExecFailure::Integrity(why) => XferError::Integrity(format!("{name}: {why}")),
                ExecFailure::Command(why) => XferError::io(name, std::io::Error::other(why)),
            }),
        }
    }

    /// The file failed or its session ended before it was committed: with
    /// RESUME its verified part is kept (the bytes returned), else what
    /// was written goes.
    pub(in crate::engine::receiver) fn end_failed(&mut self) -> u64 {
        match self {
            Sink::Temp(t) => t.end_uncommitted(),
            Sink::Exec(e) => {
                e.stop();
                0
            }
            Sink::Piece(p) => {
                p.end_failed();
                0
            }
            // Batch members go when dropped.
            Sink::Batch(_) | Sink::Stdout(_) | Sink::Discard => 0,
        }
    }

    /// The files of a batch, each reported on its own.
    pub(in crate::engine::receiver) fn members(&self) -> Option<&[BatchMember]> {
        match self {
            Sink::Batch(b) => Some(&b.members),
            _ => None,
        }
    }

    /// The batch, for its members' digests.
    pub(in crate::engine::receiver) fn batch_mut(&mut self) -> Option<&mut BatchSink> {
        match self {
            Sink::Batch(b) => Some(b),
            _ => None,
        }
    }

    /// A piece's sink, for its digest before the commit.
    pub(in crate::engine::receiver) fn piece_mut(&mut self) -> Option<&mut PieceSink> {
        match self {
            Sink::Piece(p) => Some(p),
            _ => None,
        }
    }

    /// A piece's sink, if this is one.
    pub(in crate::engine::receiver) fn piece(&self) -> Option<&PieceSink> {
        match self {
            Sink::Piece(p) => Some(p),
            _ => None,
        }
    }

    /// A committed piece: whether it made its file whole, and the file's
    /// digest then.
    pub(in crate::engine::receiver) fn piece_end(&self) -> Option<Option<Digest>> {
        match self {
            Sink::Piece(p) => p.end().map(|end| match end {
                PieceEnd::Kept => None,
                PieceEnd::Whole(d) => Some(*d),
            }),
            _ => None,
        }
    }

    /// What became of a file committed through this sink.
    pub(in crate::engine::receiver) fn outcome(&self) -> Outcome {
        match self {
            Sink::Discard => Outcome::Discarded,
            Sink::Exec(_) => Outcome::Piped,
            Sink::Batch(b) if b.discards() => Outcome::Discarded,
            Sink::Temp(_) | Sink::Batch(_) | Sink::Stdout(_) | Sink::Piece(_) => Outcome::Stored,
        }
    }
}
