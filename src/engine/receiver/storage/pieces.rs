//! Files that arrive in pieces over several lanes (`sender --lanes`): the
//! board every session of the receiver shares, each file's assembly (the
//! pure `proto::assembly::Assembly`, the temporary file of the whole file
//! and its `ChunkFile` for writes from several lanes), and a piece's sink.
//!
//! Ownership: the board holds each file weakly; every session that took a
//! piece of it holds it strongly until the session ends (`Held`). So the
//! file lives while any lane of its transfer does, and when the last one
//! is gone uncommitted its temporary file is removed (the `TempFile`'s
//! drop). The file is committed by the session whose piece makes it whole.

use super::chunk_file::ChunkFile;
use super::temp_file::TempFile;
use crate::error::XferError;
use crate::proto::assembly::{Assembly, LaneId, Piece, PieceAnswer, Progress, TransferId};
use crate::proto::{Digest, Hello, Mtime, Reject, RejectCode};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};

/// One file being assembled.
pub(in crate::engine::receiver) struct Assembling {
    assembly: Assembly,
    /// The whole file's temporary file; committed once whole.
    temp: TempFile,
    /// Written by the lanes without the lock.
    out: Arc<ChunkFile>,
}

type Shared = Arc<Mutex<Assembling>>;

/// Every file being assembled, by transfer, shared by all sessions.
#[derive(Default)]
pub(in crate::engine::receiver) struct PieceBoard {
    files: Mutex<HashMap<TransferId, Weak<Mutex<Assembling>>>>,
    next_lane: AtomicU64,
}

impl std::fmt::Debug for PieceBoard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let files = locked(&self.files).len();
        f.debug_struct("PieceBoard").field("files", &files).finish()
    }
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic under the lock leaves plain data: go on with it.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PieceBoard {
    /// A name for a new session as a lane.
    pub(in crate::engine::receiver) fn new_lane(&self) -> LaneId {
        self.next_lane.fetch_add(1, Ordering::Relaxed)
    }

    /// The file `piece` belongs to, if it is being assembled.
    pub(in crate::engine::receiver) fn find(&self, transfer: TransferId) -> Option<Shared> {
        let mut files = locked(&self.files);
        files.retain(|_, f| f.strong_count() > 0);
        files.get(&transfer).and_then(Weak::upgrade)
    }

    /// Starts assembling `hello`'s file (its first piece seen) into
    /// `temp`, the temporary file of the whole file: its size set, its
    /// writes direct where the file system takes them. Another session
    /// may have started it meanwhile: then that one is returned, and
    /// `temp` goes (removed).
    pub(in crate::engine::receiver) fn start(
        &self,
        hello: &Hello,
        piece: &Piece,
        temp: TempFile,
    ) -> Result<Shared, Reject> {
        let assembly = Assembly::new(hello, piece)?;
        let out = ChunkFile::new(&temp.file, piece.file_size, true).map_err(|e| {
            Reject::new(
                RejectCode::Io,
                format!("cannot size {} for its pieces: {e}", hello.name),
            )
        })?;
        let mut files = locked(&self.files);
        files.retain(|_, f| f.strong_count() > 0);
        if let Some(there) = files.get(&piece.transfer).and_then(Weak::upgrade) {
            return Ok(there);
        }
        let shared = Arc::new(Mutex::new(Assembling {
            assembly,
            temp,
            out: Arc::new(out),
        }));
        files.insert(piece.transfer, Arc::downgrade(&shared));
        Ok(shared)
    }
}

/// The files a session took pieces of, held until it ends; then the
/// pieces it was receiving may be offered again on other lanes.
pub(in crate::engine::receiver) struct Held {
    lane: LaneId,
    files: HashMap<TransferId, Shared>,
}

impl Held {
    pub(in crate::engine::receiver) fn new(lane: LaneId) -> Self {
        Held {
            lane,
            files: HashMap::new(),
        }
    }

    /// `lane` offers `hello`'s piece of `file`: its sink, or "verified
    /// already" (`Err(whether its file is whole)`), or the refusal.
    pub(in crate::engine::receiver) fn offer(
        &mut self,
        file: Shared,
        hello: &Hello,
        piece: &Piece,
    ) -> Result<Result<PieceSink, bool>, Reject> {
        let answer = locked(&file).assembly.offer(self.lane, hello, piece)?;
        self.files
            .entry(piece.transfer)
            .or_insert_with(|| Arc::clone(&file));
        let out = Arc::clone(&locked(&file).out);
        Ok(match answer {
            PieceAnswer::Receive { offset, len } => Ok(PieceSink {
                out,
                file,
                lane: self.lane,
                index: piece.index,
                offset,
                len,
                file_size: piece.file_size,
                written: 0,
                digest: None,
                done: false,
                end: None,
            }),
            PieceAnswer::AlreadyVerified { file_whole } => Err(file_whole),
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        for file in self.files.values() {
            locked(file).assembly.lane_gone(self.lane);
        }
    }
}

/// What became of a piece at its commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::engine::receiver) enum PieceEnd {
    /// Verified and written; its file is not whole yet.
    Kept,
    /// It made its file whole: committed, with the whole file's digest.
    Whole(Digest),
}

/// One piece's bytes: written at their place in the shared file.
pub(in crate::engine::receiver) struct PieceSink {
    file: Shared,
    out: Arc<ChunkFile>,
    lane: LaneId,
    index: u32,
    /// The piece's first byte in the file, and its length.
    offset: u64,
    len: u64,
    /// The whole file's size.
    file_size: u64,
    written: u64,
    /// The piece's digest, once its FIN's matched (`verified_as`).
    digest: Option<Digest>,
    /// Committed or ended: nothing more to do.
    done: bool,
    /// What its commit made of it.
    end: Option<PieceEnd>,
}

impl PieceSink {
    /// Writes the checked chunk `data` at `offset` within the piece.
    pub(in crate::engine::receiver) fn write(
        &mut self,
        data: &[u8],
        offset: u64,
    ) -> std::io::Result<()> {
        let end = offset.checked_add(data.len() as u64);
        if end.is_none_or(|end| end > self.len) {
            return Err(std::io::Error::other(format!(
                "a chunk at {offset} of {} bytes runs past the piece's {} bytes",
                data.len(),
                self.len
            )));
        }
        self.out.write_at(data, self.offset + offset)?;
        self.written += data.len() as u64;
        Ok(())
    }

    /// The piece's bytes hash to `digest`, the one its FIN carries.
    pub(in crate::engine::receiver) fn verified_as(&mut self, digest: Digest) {
        self.digest = Some(digest);
    }

    /// The piece verified: recorded, and if that makes its file whole,
    /// the file committed (mode, mtime, fsync, rename, directory fsync).
    pub(in crate::engine::receiver) fn commit(
        &mut self,
        name: &str,
        mode: u32,
        mtime: Option<Mtime>,
        overwrite: bool,
    ) -> Result<(), XferError> {
        let Some(digest) = self.digest else {
            return Err(XferError::Internal(format!(
                "{name}: piece {} committed before its digest was checked",
                self.index
            )));
        };
        if self.written != self.len {
            return Err(XferError::Integrity(format!(
                "{name}: piece {} has {} of its {} bytes",
                self.index, self.written, self.len
            )));
        }
        // Its writes are on the device before it counts as verified.
        let mut file = locked(&self.file);
        self.done = true;
        file.temp
            .file
            .sync_data()
            .map_err(|e| XferError::io(format!("cannot fsync {name}"), e))?;
        file.temp.promise.wrote(self.len);
        let progress = file
            .assembly
            .verified(self.lane, self.index, digest)
            .map_err(|r| XferError::Internal(format!("{name}: {}", r.reason)))?;
        let end = match progress {
            Progress::Pending { .. } => PieceEnd::Kept,
            Progress::Complete(whole) => {
                file.temp.commit(name, mode, mtime, overwrite)?;
                PieceEnd::Whole(whole)
            }
        };
        self.end = Some(end);
        Ok(())
    }

    /// The whole file's size.
    pub(in crate::engine::receiver) fn file_size(&self) -> u64 {
        self.file_size
    }

    /// What its commit made of it (None before).
    pub(in crate::engine::receiver) fn end(&self) -> Option<&PieceEnd> {
        self.end.as_ref()
    }

    /// The piece failed (its data, its write, its session): it may come
    /// again, on any lane. Nothing of it is kept on its own.
    pub(in crate::engine::receiver) fn end_failed(&mut self) {
        if !self.done {
            self.done = true;
            locked(&self.file).assembly.failed(self.lane, self.index);
        }
    }
}

impl Drop for PieceSink {
    fn drop(&mut self) {
        self.end_failed();
    }
}
