//! The temporary file a received file is written to, next to its final
//! name, and its commit: fsync, rename into place, fsync of the directory.

use super::partial::{self, Claim, OpenSidecar, Resumable, TempInUse};
use super::paths::system_time;
use super::space::Promise;
use crate::error::XferError;
use crate::proto::{Mtime, Reject, RejectCode};
use crate::sys::dirfd::{DirFd, EntryKind};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tracing::warn;

/// A temporary file next to the final name, removed on drop unless it was
/// renamed into place, or, offered with RESUME, kept with its record of
/// the verified chunks (see `partial`).
pub(in crate::engine::receiver) struct TempFile {
    /// Shared by the files of a batch in one directory.
    pub(super) parent: Arc<DirFd>,
    pub(super) temp: String,
    pub(super) leaf: String,
    pub(in crate::engine::receiver) file: File,
    pub(super) committed: bool,
    /// What is left of the space promised to this file.
    pub(super) promise: Promise,
    /// The record of verified chunks of a file offered with RESUME.
    pub(super) resumable: Option<Resumable>,
    /// Nothing of it may be kept, even with RESUME (its digest failed).
    pub(super) discard: bool,
    /// A plain temporary file's mark for the sweep (a partial file has
    /// its claim instead). Dropped after the file is renamed or removed.
    pub(super) _in_use: Option<TempInUse>,
}

impl TempFile {
    /// Writes the next chunk (checked against its CRC32 `crc`) at its
    /// offset.
    pub(in crate::engine::receiver) fn write_chunk(
        &mut self,
        data: &[u8],
        offset: u64,
        crc: u32,
    ) -> std::io::Result<()> {
        if let Err(e) = self.file.write_all_at(data, offset) {
            self.write_failed();
            return Err(e);
        }
        self.chunk_written(data.len() as u32, crc)
    }

    /// A descriptor of the file for writer threads (`WriteBehind`), which
    /// write chunks at their offsets; each write is then `chunk_written`
    /// or `write_failed`, in the order of the chunks.
    pub(in crate::engine::receiver) fn writer_handle(&self) -> std::io::Result<Arc<File>> {
        Ok(Arc::new(self.file.try_clone()?))
    }

    /// The next chunk (`len` bytes, CRC32 `crc`) is written.
    pub(in crate::engine::receiver) fn chunk_written(
        &mut self,
        len: u32,
        crc: u32,
    ) -> std::io::Result<()> {
        self.promise.wrote(u64::from(len));
        if let Some(r) = self.resumable.as_mut() {
            r.chunk_written(crc, len)?;
        }
        Ok(())
    }

    /// Writing the next chunk failed: nothing from it on is recorded.
    pub(in crate::engine::receiver) fn write_failed(&mut self) {
        if let Some(r) = self.resumable.as_mut() {
            r.write_failed();
        }
    }

    /// The data failed its whole-file check: nothing of it is kept.
    pub(in crate::engine::receiver) fn discard(&mut self) {
        self.discard = true;
    }

    /// The transfer failed (or the file is dropped uncommitted): with
    /// RESUME what was written and checked is kept for a later attempt,
    /// else the file goes. Returns the bytes kept (0: nothing is left).
    pub(in crate::engine::receiver) fn end_uncommitted(&mut self) -> u64 {
        if self.committed {
            return 0;
        }
        // Once: the drop that follows does nothing more.
        self.committed = true;
        match self.resumable.take() {
            // Unverified: nothing worth keeping.
            Some(r) if self.discard => r.discard(),
            // Kept: whatever was written and checked gets its records.
            Some(r) => match r.keep() {
                Ok(kept) => return kept,
                Err(e) => {
                    warn!(path = %self.temp, "cannot record the last chunks of a partial file: {e}");
                }
            },
            None => {
                if let Err(e) = partial::remove(&self.parent, &self.temp, &self.file) {
                    warn!(path = %self.temp, "cannot remove temporary file: {e}");
                }
            }
        }
        0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        self.end_uncommitted();
    }
}

/// How an offered file is written.
pub(in crate::engine::receiver) enum Resume<'a> {
    /// A temporary file, removed if the transfer fails.
    No,
    /// Offered with RESUME, starting from zero: a partial file whose
    /// verified chunks are kept if the transfer fails.
    Fresh(Claim),
    /// Continues the kept partial file after its verified prefix.
    Continue(&'a OpenSidecar, Claim),
}

/// Refuses an offer whose final name `leaf` in `parent` is a directory,
/// or any existing entry without `overwrite`.
pub(super) fn check_final_name(
    parent: &DirFd,
    leaf: &str,
    name: &str,
    overwrite: bool,
) -> Result<(), Reject> {
    match parent.kind(leaf) {
        Ok(Some(EntryKind::Dir)) => Err(Reject::new(
            RejectCode::Exists,
            format!("{name} exists and is a directory"),
        )),
        Ok(Some(_)) if !overwrite => Err(Reject::new(
            RejectCode::Exists,
            format!(
                "{name} already exists on the receiver and differs (size, modification time, or \
                 content with --checksum); the receiver replaces files only with --overwrite"
            ),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(Reject::new(
            RejectCode::Io,
            format!("cannot inspect {name}: {e}"),
        )),
    }
}

/// Why a temporary file could not be made.
pub(super) fn cannot_create(e: std::io::Error) -> Reject {
    let code = match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => RejectCode::NoSpace,
        _ => RejectCode::Io,
    };
    Reject::new(
        code,
        format!("cannot create a file in the output directory: {e}"),
    )
}

/// A temporary name that does not depend on the (up to 255-byte) final name.
pub(in crate::engine::receiver) fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // One getpid for the process, not one per file.
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    format!(
        ".rdma-xfer-{}-{}-{nanos:08x}.part",
        PID.get_or_init(std::process::id),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

impl TempFile {
    /// Makes the verified file durable: applies the mode (and mtime),
    /// fsyncs, renames it into place and fsyncs the directory.
    pub(in crate::engine::receiver) fn commit(
        &mut self,
        name: &str,
        mode: u32,
        mtime: Option<Mtime>,
        overwrite: bool,
    ) -> Result<(), XferError> {
        self.make_durable(name, mode, mtime)?;
        self.move_into_place(name, overwrite)?;
        self.parent
            .sync()
            .map_err(|e| XferError::io(format!("cannot fsync the directory of {name}"), e))
    }

    /// Applies the mode (and mtime) and fsyncs the data.
    pub(super) fn make_durable(
        &mut self,
        name: &str,
        mode: u32,
        mtime: Option<Mtime>,
    ) -> Result<(), XferError> {
        let ctx = |what: &str| format!("{what} {name}");
        self.file
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| XferError::io(ctx("cannot set the mode of"), e))?;
        if let Some(m) = mtime.and_then(system_time) {
            self.file
                .set_modified(m)
                .map_err(|e| XferError::io(ctx("cannot set the modification time of"), e))?;
        }
        if let Err(e) = self.file.sync_all() {
            // Pages may be lost: no record may promise them now.
            if let Some(r) = self.resumable.as_mut() {
                r.write_failed();
            }
            return Err(XferError::io(ctx("cannot fsync"), e));
        }
        Ok(())
    }

    /// Renames the temporary file to its final name (its directory still
    /// to be fsynced).
    pub(super) fn move_into_place(&mut self, name: &str, overwrite: bool) -> Result<(), XferError> {
        let ctx = |what: &str| format!("{what} {name}");
        // The name must still be the file we wrote (a kept partial file lives
        // for days beside its final name, and is continued by descriptor):
        // another file put there meanwhile is never renamed into place.
        match self.parent.is_same(&self.temp, &self.file) {
            Ok(true) => {}
            Ok(false) => {
                return Err(XferError::io(
                    ctx("cannot move into place"),
                    std::io::Error::other(format!(
                        "{} is no longer the file that was received: replaced meanwhile",
                        self.temp
                    )),
                ));
            }
            Err(e) => return Err(XferError::io(ctx("cannot find the received data of"), e)),
        }
        self.parent
            .rename(&self.temp, &self.leaf, !overwrite)
            .map_err(|e| XferError::io(ctx("cannot move into place"), e))?;
        self.committed = true;
        if let Some(r) = self.resumable.take()
            && let Err(e) = r.forget()
        {
            warn!("cannot remove the record of {name}'s partial file: {e}");
        }
        Ok(())
    }
}

impl TempFile {
    /// The temporary name is still the file written, and without
    /// `overwrite` the final name is still free.
    pub(super) fn check_before_rename(&self, name: &str, overwrite: bool) -> Result<(), XferError> {
        let ctx = format!("cannot move into place {name}");
        match self.parent.is_same(&self.temp, &self.file) {
            Ok(true) => {}
            Ok(false) => {
                return Err(XferError::io(
                    ctx,
                    std::io::Error::other(format!(
                        "{} is no longer the file that was received: replaced meanwhile",
                        self.temp
                    )),
                ));
            }
            Err(e) => return Err(XferError::io(ctx, e)),
        }
        if !overwrite && let Ok(Some(_)) = self.parent.kind(&self.leaf) {
            return Err(XferError::io(
                ctx,
                std::io::Error::other(format!(
                    "{name} appeared on the receiver meanwhile (it runs without --overwrite)"
                )),
            ));
        }
        Ok(())
    }

    /// Renames a committed file back to its temporary name (removed when
    /// dropped); false if it could not be (it then stays in place).
    pub(super) fn take_back(&mut self, name: &str) -> bool {
        let ours = matches!(self.parent.is_same(&self.leaf, &self.file), Ok(true));
        match ours.then(|| self.parent.rename(&self.leaf, &self.temp, true)) {
            Some(Ok(())) => {
                self.committed = false;
                true
            }
            Some(Err(e)) => {
                warn!("cannot take back {name} of a failed batch: {e}");
                false
            }
            None => false,
        }
    }
}
