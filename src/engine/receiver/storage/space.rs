//! Free space promised to files being received, shared by every session of
//! one receiver, so that two sessions cannot both pass the free-space check
//! for the same bytes and then fail mid-file. Where the file system reserves
//! the blocks itself (fallocate, see `sys::os::reserve_blocks`) the promise
//! is settled at once; elsewhere (tmpfs) it shrinks as the bytes are
//! written, since written bytes are no longer free.

use crate::proto::{Reject, RejectCode};
use crate::sys::os::FreeSpace;
use std::sync::{Arc, Mutex, PoisonError};

/// Bytes promised to files being received and not written yet.
#[derive(Debug, Default)]
pub(in crate::engine::receiver) struct SpaceLedger {
    outstanding: Mutex<u64>,
}

impl SpaceLedger {
    /// Promises `bytes` for `name` if the file system (as `free` reads it,
    /// under the ledger's lock so no other promise slips in between) has
    /// them beyond what is promised already, and an inode for the file.
    pub(in crate::engine::receiver) fn promise(
        self: &Arc<Self>,
        name: &str,
        bytes: u64,
        free: impl FnOnce() -> std::io::Result<FreeSpace>,
    ) -> Result<Promise, Reject> {
        self.promise_files(name, bytes, 1, free)
    }

    /// As `promise`, for `files` files at once (a batch): an inode each.
    pub(in crate::engine::receiver) fn promise_files(
        self: &Arc<Self>,
        name: &str,
        bytes: u64,
        files: u64,
        free: impl FnOnce() -> std::io::Result<FreeSpace>,
    ) -> Result<Promise, Reject> {
        let mut outstanding = self
            .outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let free = match free() {
            Ok(f) => f,
            Err(e) => {
                // Unknown: a full disk then fails the write (exit 6), never
                // leaving a finished-looking file.
                tracing::warn!("cannot check the free space for {name}: {e}");
                return Ok(Promise::none(self));
            }
        };
        if free.inodes == 0 {
            return Err(Reject::new(
                RejectCode::NoSpace,
                format!("no free inodes on the receiver's file system for {name}"),
            ));
        }
        if free.inodes < files {
            return Err(Reject::new(
                RejectCode::NoSpace,
                format!(
                    "{name} needs {files} inodes; the receiver's file system has {} free",
                    free.inodes
                ),
            ));
        }
        let available = free.bytes.saturating_sub(*outstanding);
        if available < bytes {
            let promised = if *outstanding > 0 {
                format!(
                    " ({} more are promised to files being received)",
                    *outstanding
                )
            } else {
                String::new()
            };
            return Err(Reject::new(
                RejectCode::NoSpace,
                format!(
                    "{name} needs {bytes} bytes but only {} are free{promised}",
                    free.bytes
                ),
            ));
        }
        *outstanding += bytes;
        Ok(Promise {
            ledger: Arc::clone(self),
            left: bytes,
        })
    }

    fn release(&self, bytes: u64) {
        let mut outstanding = self
            .outstanding
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *outstanding = outstanding.saturating_sub(bytes);
    }

    #[cfg(test)]
    fn outstanding(&self) -> u64 {
        *self.outstanding.lock().unwrap()
    }
}

/// Space promised to one file; what is left of it is released on drop
/// (the file was committed or removed).
#[derive(Debug)]
pub(in crate::engine::receiver) struct Promise {
    ledger: Arc<SpaceLedger>,
    left: u64,
}

impl Promise {
    /// Nothing promised (the space is someone else's to promise).
    pub(in crate::engine::receiver) fn none(ledger: &Arc<SpaceLedger>) -> Self {
        Promise {
            ledger: Arc::clone(ledger),
            left: 0,
        }
    }

    /// `n` more bytes of the file were written: they are taken from the
    /// file system's free space now, no longer from the promise.
    pub(in crate::engine::receiver) fn wrote(&mut self, n: u64) {
        let n = n.min(self.left);
        if n > 0 {
            self.left -= n;
            self.ledger.release(n);
        }
    }

    /// The file system reserved the blocks itself: nothing is left to promise.
    pub(in crate::engine::receiver) fn settle(&mut self) {
        let left = std::mem::take(&mut self.left);
        self.ledger.release(left);
    }
}

impl Drop for Promise {
    fn drop(&mut self) {
        self.settle();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free(bytes: u64, inodes: u64) -> impl FnOnce() -> std::io::Result<FreeSpace> {
        move || Ok(FreeSpace { bytes, inodes })
    }

    #[test]
    fn two_files_cannot_both_have_the_same_bytes() {
        let ledger = Arc::new(SpaceLedger::default());
        let mut a = ledger.promise("a", 60, free(100, 10)).unwrap();
        // Nothing written yet: 100 free, 60 promised.
        let Reject { code, reason: why } = ledger.promise("b", 60, free(100, 10)).unwrap_err();
        assert_eq!(code, RejectCode::NoSpace);
        assert!(
            why.contains("b needs 60 bytes but only 100 are free (60 more are promised"),
            "{why}"
        );
        assert!(
            ledger.promise("c", 40, free(100, 10)).is_ok(),
            "what is left is free"
        );
        // a wrote 50: the file system has 50 free, 10 are still promised to a.
        a.wrote(50);
        assert_eq!(ledger.outstanding(), 10);
        assert!(ledger.promise("d", 41, free(50, 10)).is_err());
        let d = ledger.promise("d", 40, free(50, 10)).unwrap();
        // Writing more than promised releases no more than the promise.
        a.wrote(1000);
        assert_eq!(ledger.outstanding(), 40);
        drop(d);
        drop(a);
        assert_eq!(ledger.outstanding(), 0);
    }

    #[test]
    fn a_reserved_or_dropped_file_releases_its_promise() {
        let ledger = Arc::new(SpaceLedger::default());
        let mut a = ledger.promise("a", 70, free(100, 10)).unwrap();
        a.settle();
        assert_eq!(ledger.outstanding(), 0);
        let b = ledger.promise("b", 70, free(30, 10));
        assert!(b.is_err(), "the blocks fallocate took are not free");
        {
            let _failed = ledger.promise("c", 30, free(100, 10)).unwrap();
            assert_eq!(ledger.outstanding(), 30);
        }
        assert_eq!(
            ledger.outstanding(),
            0,
            "a failed file's promise is released"
        );
    }

    #[test]
    fn inodes_and_unknown_space() {
        let ledger = Arc::new(SpaceLedger::default());
        let Reject { code, reason: why } = ledger.promise("f", 0, free(1 << 30, 0)).unwrap_err();
        assert_eq!(code, RejectCode::NoSpace);
        assert!(why.contains("no free inodes"), "{why}");
        assert!(
            ledger.promise("f", 0, free(0, 1)).is_ok(),
            "an empty file needs an inode only"
        );
        // A batch needs an inode per file.
        assert!(ledger.promise_files("b", 0, 3, free(0, 2)).is_err());
        assert!(ledger.promise_files("b", 0, 3, free(0, 3)).is_ok());
        let unknown = ledger
            .promise("f", u64::MAX, || {
                Err(std::io::Error::other("statvfs failed"))
            })
            .unwrap();
        assert_eq!(ledger.outstanding(), 0);
        drop(unknown);
        assert_eq!(ledger.outstanding(), 0);
    }
}
