//! A read under way to answer a HAVE (the kept prefix's chunks checked,
//! or the file's SHA-256 for a COMPARE): its worker and what its answer
//! needs. The offer's work holds it (`Work::have_read`); `have.rs` starts
//! it and answers from its result.

use crate::engine::digest::PrefixRead;
use crate::engine::link::Link;
use crate::engine::worker::Worker;
use crate::error::XferError;
use crate::proto::Digest;
use std::time::Instant;

/// A read under way to answer a HAVE, with what its answer needs.
pub(super) enum HaveRead {
    /// The receiver kept `bytes`: its chunks' CRCs are checked against
    /// `want`, the digest HAVE carried.
    Prefix {
        bytes: u64,
        want: Digest,
        worker: Worker<std::io::Result<PrefixRead>>,
    },
    /// The whole file's SHA-256, for COMPARE.
    Compare(Worker<std::io::Result<[u8; 32]>>),
}

impl HaveRead {
    /// The session's wait while the read runs (`Worker::wait_until`).
    pub(super) fn wait_until(
        &mut self,
        deadline: Instant,
        link: &mut dyn Link,
        what: &str,
    ) -> Result<(), XferError> {
        match self {
            HaveRead::Prefix { worker, .. } => worker.wait_until(deadline, link, what),
            HaveRead::Compare(worker) => worker.wait_until(deadline, link, what),
        }
    }
}
