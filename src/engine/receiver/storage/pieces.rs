//! Files that arrive in pieces over several lanes (`sender --lanes`): the
//! board every session of the receiver shares, each file's assembly (the
//! pure `proto::assembly::Assembly`, the temporary file of the whole file
//! and its `ChunkFile` for writes from several lanes), and a piece's sink.
//!
//! Ownership: the board holds each file, and so does every session that
//! took a piece of it (`Held`, until the file is finished). A file no
//! session holds stays on the board for `ASSEMBLY_IDLE` after it was last
//! offered a piece: its verified pieces wait for the sender's other lanes
//! (the only lane that held it may be gone). Then it leaves the board; an
//! uncommitted file's temporary file goes with it (the `TempFile`'s drop).
//! The file is committed by the session whose piece makes it whole; from
//! then on no lane's write reaches it (`PieceSink::write`).

use super::chunk_file::ChunkFile;
use super::temp_file::TempFile;
use crate::error::XferError;
use crate::proto::assembly::{Assembly, LaneId, Piece, PieceAnswer, Progress, TransferId};
use crate::proto::{Digest, Hello, Mtime, Reject, RejectCode};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

/// How long a file no session holds stays on the board, waiting for
/// another lane to bring its missing pieces: well past the sender's
/// giving up a silent lane (seconds) and its next offer.
pub(in crate::engine::receiver) const ASSEMBLY_IDLE: Duration = Duration::from_secs(60);
/// Files one session may hold unfinished at once: a sender's lane works
/// on one file at a time, two pieces ahead (its next file's first).
const HELD_AT_ONCE: usize = 4;
/// Files the receiver assembles at once, all sessions together (each a
/// temporary file and its descriptors).
const ASSEMBLING_AT_ONCE: usize = 128;

/// One file being assembled.
pub(in crate::engine::receiver) struct Assembling {
    assembly: Assembly,
    /// The whole file's temporary file; taken (committed) once whole.
    temp: Option<TempFile>,
    /// Written by the lanes without the lock; dropped once committed.
    out: Option<Arc<ChunkFile>>,
    /// Open to the lanes' writes (true) until the commit closes it: a
    /// write holds it shared, the commit exclusively, so no write lands
    /// in the file once it bears its final name.
    open: Arc<RwLock<bool>>,
    /// When a piece of it was last offered or written.
    touched: Instant,
}

type Shared = Arc<Mutex<Assembling>>;

/// Every file being assembled, by transfer, shared by all sessions.
#[derive(Default)]
pub(in crate::engine::receiver) struct PieceBoard {
    files: Mutex<HashMap<TransferId, Shared>>,
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

/// Drops the files no session holds that were offered no piece for
/// `ASSEMBLY_IDLE`, as of `now`. A finished one (committed, or its commit
/// failed) stays as long, small (its temporary file and descriptors went
/// with the commit): a piece offered again (its ACK lost with a lane) is
/// told the file is whole, or why it failed.
fn sweep_files(files: &mut HashMap<TransferId, Shared>, now: Instant) {
    files.retain(|_, f| {
        // A file a session holds is held by it too (its `Held`), and
        // locked only briefly: try, and keep it when busy.
        let Ok(file) = f.try_lock() else {
            return true;
        };
        let unheld = Arc::strong_count(f) == 1;
        !(unheld && now.saturating_duration_since(file.touched) >= ASSEMBLY_IDLE)
    });
}

impl PieceBoard {
    /// A name for a new session as a lane.
    pub(in crate::engine::receiver) fn new_lane(&self) -> LaneId {
        self.next_lane.fetch_add(1, Ordering::Relaxed)
    }

    /// Drops the files left idle (see `sweep_files`): called by the
    /// serving loop now and then, and by each offer of a piece.
    pub(in crate::engine::receiver) fn sweep(&self, now: Instant) {
        sweep_files(&mut locked(&self.files), now);
    }

    /// The file `piece` belongs to, if it is being assembled.
    pub(in crate::engine::receiver) fn find(&self, transfer: TransferId) -> Option<Shared> {
        let mut files = locked(&self.files);
        sweep_files(&mut files, Instant::now());
        files.get(&transfer).cloned()
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
        sweep_files(&mut files, Instant::now());
        if let Some(there) = files.get(&piece.transfer) {
            return Ok(Arc::clone(there));
        }
        if files.len() >= ASSEMBLING_AT_ONCE {
            return Err(Reject::new(
                RejectCode::Busy,
                format!("the receiver assembles {ASSEMBLING_AT_ONCE} files in pieces already"),
            ));
        }
        let shared = Arc::new(Mutex::new(Assembling {
            assembly,
            temp: Some(temp),
            out: Some(Arc::new(out)),
            open: Arc::new(RwLock::new(true)),
            touched: Instant::now(),
        }));
        files.insert(piece.transfer, Arc::clone(&shared));
        Ok(shared)
    }
}

/// The files a session took pieces of, held until it ends (or they are
/// finished); then the pieces it was receiving may be offered again on
/// other lanes.
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

    /// Whether this session may take a piece of `transfer`: one of a
    /// file it holds, or of a new one while it holds fewer than
    /// `HELD_AT_ONCE` unfinished.
    pub(in crate::engine::receiver) fn may_take(
        &mut self,
        transfer: TransferId,
    ) -> Result<(), Reject> {
        self.release_stale(Instant::now());
        if self.files.contains_key(&transfer) || self.files.len() < HELD_AT_ONCE {
            return Ok(());
        }
        Err(Reject::new(
            RejectCode::Busy,
            format!("a session holds at most {HELD_AT_ONCE} unfinished files in pieces"),
        ))
    }

    /// `lane` offers `hello`'s piece of `file`: its sink, or "verified
    /// already" (`Err(whether its file is whole)`), or the refusal. (After
    /// `may_take`, which lets go of the files finished or idle.)
    pub(in crate::engine::receiver) fn offer(
        &mut self,
        file: Shared,
        hello: &Hello,
        piece: &Piece,
    ) -> Result<Result<PieceSink, bool>, Reject> {
        let (answer, out, open) = {
            let mut assembling = locked(&file);
            assembling.touched = Instant::now();
            let answer = assembling.assembly.offer(self.lane, hello, piece)?;
            let out = assembling.out.clone();
            (answer, out, Arc::clone(&assembling.open))
        };
        Ok(match answer {
            PieceAnswer::Receive { offset, len } => {
                let Some(out) = out else {
                    // (Only a finished file has no output, and it takes
                    // no piece.)
                    return Err(Reject::new(RejectCode::Io, "the file is no longer open"));
                };
                self.files
                    .entry(piece.transfer)
                    .or_insert_with(|| Arc::clone(&file));
                Ok(PieceSink {
                    out,
                    open,
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
                })
            }
            PieceAnswer::AlreadyVerified { file_whole } => Err(file_whole),
        })
    }
}

impl Held {
    /// Lets go of the files finished since, and of those offered no piece
    /// for `ASSEMBLY_IDLE` (their sender gave them up): its pieces under
    /// way on them go back.
    fn release_stale(&mut self, now: Instant) {
        let lane = self.lane;
        self.files.retain(|_, f| {
            let mut file = locked(f);
            if file.assembly.is_finished() {
                return false;
            }
            let idle = now.saturating_duration_since(file.touched) >= ASSEMBLY_IDLE;
            if idle {
                file.assembly.lane_gone(lane);
            }
            !idle
        });
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
    /// The file's gate (`Assembling::open`).
    open: Arc<RwLock<bool>>,
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
    /// Writes the checked chunk `data` at `offset` within the piece, as
    /// long as the piece is this lane's and the file not committed (a
    /// lane the sender gave up may still be writing what another lane
    /// took over).
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
        // The claim first (the file's lock, briefly), then the gate: the
        // commit holds the lock while it waits for the gate.
        {
            let mut file = locked(&self.file);
            if !file.assembly.is_receiving(self.lane, self.index) {
                return Err(std::io::Error::other(format!(
                    "piece {} is no longer this lane's (another lane took it over, or the file \
                     was made whole)",
                    self.index
                )));
            }
            // A file being written is not idle (`ASSEMBLY_IDLE`).
            file.touched = Instant::now();
        }
        let open = self.open.read().unwrap_or_else(|e| e.into_inner());
        if !*open {
            return Err(std::io::Error::other(format!(
                "piece {}: its file was committed",
                self.index
            )));
        }
        self.out.write_at(data, self.offset + offset)?;
        drop(open);
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
        // Its writes are made durable with the whole file's, at its
        // commit (one fsync, not one per piece on a lane's thread).
        let mut file = locked(&self.file);
        self.done = true;
        let progress = file
            .assembly
            .verified(self.lane, self.index, digest)
            .map_err(|r| XferError::Internal(format!("{name}: {}", r.reason)))?;
        if let Some(temp) = file.temp.as_mut() {
            temp.promise.wrote(self.len);
        }
        let whole = match progress {
            Progress::Pending { .. } => {
                self.end = Some(PieceEnd::Kept);
                drop(file);
                // Its pages go to the device now, not all at the commit
                // (whose fsync, on one lane's thread, must stay short).
                self.out.start_writeback(self.offset, self.len);
                return Ok(());
            }
            Progress::Complete(whole) => whole,
        };
        // No lane's write lands from here on (it waits for those under
        // way); the temporary file and the writers' descriptors go with
        // the commit, whatever its result.
        *file.open.write().unwrap_or_else(|e| e.into_inner()) = false;
        file.out = None;
        let committed = match file.temp.take() {
            Some(mut temp) => temp.commit(name, mode, mtime, overwrite),
            None => Err(XferError::Internal(format!("{name}: committed twice"))),
        };
        match committed {
            Ok(()) => {
                file.assembly.committed();
                self.end = Some(PieceEnd::Whole(whole));
                Ok(())
            }
            Err(e) => {
                file.assembly.commit_failed(e.to_string());
                Err(e)
            }
        }
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
