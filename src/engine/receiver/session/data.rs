//! A session's data: each chunk copied out of the ring, checked and
//! written (or handed to the writers), and the FIN that ends a file.

use super::{IncomingFile, Session};
use crate::engine::digest::{FileHasher, digest_hex};
use crate::engine::per_byte::{self, ChunkRefused, TagCheck};
use crate::engine::receiver::storage::write_behind::WriteBehind;
use crate::engine::report::{FileEvent, FileReport};
use crate::error::XferError;
use crate::proto::ChunkPlacement;
use crate::proto::{AckStatus, CHUNK_TAG_LEN, ChunkError, Fin, RejectCode};
use std::time::Instant;
use tracing::{debug, error, warn};

/// How a chunk that was not received ends the session.
enum ChunkEnd {
    /// The machine said why (its ACK is queued).
    Abandon(XferError),
    /// The engine's reason, for the ACK that tells the sender.
    Abort(AckStatus, XferError),
    /// The link failed: nothing can be told.
    Fatal(XferError),
}

impl From<XferError> for ChunkEnd {
    fn from(e: XferError) -> Self {
        ChunkEnd::Fatal(e)
    }
}

impl Session<'_, '_> {
    pub(super) fn on_chunk(&mut self, byte_len: u32, imm: u32) -> Result<(), XferError> {
        match self.receive_chunk(byte_len, imm) {
            Ok(()) => {
                self.machine.chunk_done();
                Ok(())
            }
            Err(ChunkEnd::Abandon(err)) => Err(self.abandon(err)),
            Err(ChunkEnd::Abort(status, err)) => Err(self.abort(status, err)),
            Err(ChunkEnd::Fatal(err)) => Err(err),
        }
    }

    /// Copies the chunk the machine placed out of the ring, checks it and
    /// writes it (or hands it to the writers).
    fn receive_chunk(&mut self, byte_len: u32, imm: u32) -> Result<(), ChunkEnd> {
        let (placement, file) = match self.machine.on_chunk_of(byte_len, imm) {
            Ok(placed) => placed,
            Err(e) => return Err(self.refused_chunk(e)),
        };
        let placement: ChunkPlacement = placement;
        let link = &*self.link;
        let t0 = Instant::now();
        let len = placement.len as usize;
        // With a token the chunk's tag follows it in the slot: copied out
        // now, checked against the private copy of the bytes.
        let tag = match &placement.auth {
            None => None,
            Some(auth) => {
                let mut tag = [0u8; CHUNK_TAG_LEN];
                link.copy_out(placement.slot_offset as usize + len, &mut tag)
                    .map_err(|e| ChunkEnd::Fatal(e.into()))?;
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
                    Err(e) => Err(ChunkRefused::Write(e)),
                    Ok((handle, mut buf)) => {
                        // The buffers are slot-sized and len fits a slot
                        // (checked above); were it not so, the chunk fails
                        // like a write, after what retired is recorded.
                        let checked = match buf.get_mut(..len) {
                            Some(data) => per_byte::receive_chunk(
                                |at, block| {
                                    link.copy_out(placement.slot_offset as usize + at, block)
                                },
                                data,
                                placement.expected_crc,
                                tag.as_ref(),
                                |_, _| {
                                    t1 = Instant::now();
                                    Ok(())
                                },
                                Some(&mut file.hasher),
                            )
                            .map(drop),
                            None => Err(ChunkRefused::Write(std::io::Error::other(
                                "chunk longer than its buffer",
                            ))),
                        };
                        if checked.is_ok()
                            && let Some(forward) = file.forward.as_mut()
                        {
                            forward.write(&buf[..len]);
                        }
                        match checked {
                            Ok(()) => behind
                                .submit(
                                    &handle,
                                    placement.file_offset,
                                    buf,
                                    len,
                                    placement.expected_crc,
                                )
                                .map_err(ChunkRefused::Write),
                            Err(refused) => {
                                behind.give_back(buf);
                                Err(refused)
                            }
                        }
                    }
                }
            }
            _ => {
                // The private copy takes the chunk's length (the same
                // for every chunk of a file but its last).
                self.chunk.resize(len, 0);
                let data = self.chunk.as_mut_slice();
                per_byte::receive_chunk(
                    |at, block| link.copy_out(placement.slot_offset as usize + at, block),
                    data,
                    placement.expected_crc,
                    tag.as_ref(),
                    |data, crc| {
                        t1 = Instant::now();
                        file.sink
                            .write(data, placement.file_offset, crc, file.written)?;
                        // Checked and written here: on to the next host.
                        if let Some(forward) = file.forward.as_mut() {
                            forward.write(data);
                        }
                        Ok(())
                    },
                    Some(&mut file.hasher),
                )
                .map(drop)
            }
        };
        if let Some(behind) = self.behind.as_mut() {
            behind.poll(&mut retired);
        }
        // Writes that failed meanwhile count as this chunk's failure.
        let received = match (received, file.sink.chunks_written(retired)) {
            (Ok(()), Err(e)) => Err(ChunkRefused::Write(e)),
            (received, _) => received,
        };
        let written = match received {
            Ok(()) => Ok(()),
            Err(ChunkRefused::Copy(e)) => return Err(ChunkEnd::Fatal(e.into())),
            Err(ChunkRefused::Crc { computed: crc }) => {
                let mut msg = format!(
                    "chunk {} of {} (offset {}) has CRC32 {crc:08x}, the sender computed {:08x}",
                    placement.seq, file.name, placement.file_offset, placement.expected_crc
                );
                if let Some(note) = file.sink.cut_short_note(file.written) {
                    msg.push_str(&note);
                }
                let err = XferError::Integrity(msg);
                return Err(ChunkEnd::Abort(AckStatus::Integrity, err));
            }
            Err(ChunkRefused::Forged) => {
                let msg = format!(
                    "chunk {} of {} (offset {}) does not carry its authentication tag: its \
                     bytes were not written by the sender (forged on the way); nothing of it \
                     was used",
                    placement.seq, file.name, placement.file_offset
                );
                let err = XferError::Integrity(msg);
                return Err(ChunkEnd::Abort(AckStatus::Integrity, err));
            }
            Err(ChunkRefused::Write(e)) => Err(e),
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
                return Err(ChunkEnd::Abort(AckStatus::Io, XferError::io(context, e)));
            }
            let what = if stdout {
                format!("cannot write {} to standard output", file.name)
            } else {
                format!("cannot write {}", file.name)
            };
            return Err(ChunkEnd::Abort(AckStatus::Io, XferError::io(what, e)));
        }
        file.written += u64::from(placement.len);
        file.check_time += t1 - t0;
        file.write_time += t1.elapsed();
        file.progress.advance(placement.len.into());
        Ok(())
    }

    /// A data write the machine refused: it queued the ACK that tells the
    /// sender why.
    fn refused_chunk(&self, e: ChunkError) -> ChunkEnd {
        match e {
            ChunkError::TooLarge { .. } => {
                let name = self.machine.file().map_or("?", |f| f.name.as_str());
                ChunkEnd::Abandon(XferError::Rejected {
                    code: Some(RejectCode::TooLarge),
                    reason: format!("{name}: {e}"),
                })
            }
            ChunkError::Protocol(source) => ChunkEnd::Abandon(XferError::Protocol {
                context: Some("bad data write".into()),
                source,
            }),
        }
    }

    pub(super) fn on_fin(&mut self, fin: Fin, mut file: IncomingFile) -> Result<(), XferError> {
        // Every chunk written before anything is checked or committed.
        if let Err(e) = settle_writes(self.behind.as_mut(), &mut file) {
            let what = format!("cannot write {}", file.name);
            return Err(self.abort_file(file, AckStatus::Io, XferError::io(what, e)));
        }
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
        // Verified: its end goes on to the next host of a relay chain now,
        // so that the hosts commit side by side, not one after the other.
        if digest == fin.digest
            && let Some(forward) = file.forward.as_mut()
        {
            forward.end_input(true);
        }
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
            // A piece counts as verified with its digest.
            if let Some(piece) = file.sink.piece_mut() {
                piece.verified_as(digest);
            }
            match file
                .sink
                .commit(&file.name, file.mode, file.mtime, self.cfg.overwrite)
            {
                // A piece whose file is not whole yet.
                Ok(()) if file.sink.piece_end() == Some(None) => {
                    (AckStatus::PieceKept, String::new(), None)
                }
                // The sender says what became of it too.
                Ok(()) => (AckStatus::Ok, outcome.ack_note().to_string(), None),
                Err(e @ XferError::Integrity(_)) => (AckStatus::Integrity, e.to_string(), Some(e)),
                Err(e) => (AckStatus::Io, e.to_string(), Some(e)),
            }
        };
        // Over a relay chain: the results of this host and those after it.
        let forward_only = file.own.is_some();
        let (status, reason) = self.relay_verdict(&mut file, status, reason)?;
        self.machine
            .complete(status, reason)
            .map_err(XferError::from)?;
        // The verdict goes out before the reports (which may wait on a
        // terminal): a pipelining sender waits for it. The file is
        // reported whether or not it could be told.
        let sent = self.transmit();
        match err {
            // Its refusal (or its staying) was reported at its offer.
            None if forward_only => {}
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
                        digest: Some(digest),
                        phases: file.phases.share(n),
                        resumed_from: 0,
                        outcome,
                        host: None,
                    };
                    (self.on_file)(FileEvent::Done(&report));
                }
            }
            // A piece: its file is reported when whole.
            None if status == AckStatus::PieceKept => {
                debug!(file = %file.name, bytes = fin.bytes, "piece verified and written");
                file.progress.finished();
            }
            None => {
                file.phases.commit = fin_at.elapsed();
                file.phases.log(&file.name, fin.bytes);
                // A piece that made its file whole: the file's figures.
                let (bytes, digest) = match (file.sink.piece_end(), file.sink.piece_mut()) {
                    (Some(Some(whole)), Some(piece)) => (piece.file_size(), whole),
                    _ => (fin.bytes, digest),
                };
                let report = FileReport {
                    name: file.name.clone(),
                    bytes,
                    elapsed: file.started.elapsed(),
                    digest: Some(digest),
                    phases: file.phases,
                    resumed_from: file.resumed_from,
                    outcome,
                    host: None,
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
        sent
    }
}

/// Waits for the file's chunks in the writer threads and records them;
/// the first write that failed is the error.
pub(super) fn settle_writes(
    behind: Option<&mut WriteBehind>,
    file: &mut IncomingFile,
) -> std::io::Result<()> {
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
pub(super) fn end_failed(file: &mut IncomingFile, behind: Option<&mut WriteBehind>) {
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
