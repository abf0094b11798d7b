//! The sender's reader thread: fills registered staging slots with file data
//! and computes each chunk's CRC32 and the whole-file digest, so that this
//! CPU work overlaps with posting writes (where software RDMA does its own
//! per-byte work in the posting thread's system calls).

use super::digest::FileHasher;
use crate::proto::{Digest, DigestAlg};
use crate::verbs::{SlotFiller, SlotToken};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, Sender};

/// One file to read, in chunks of `chunk_len` from offset 0.
pub struct ReadJob<'a> {
    pub file: &'a File,
    pub name: &'a str,
    pub size: u64,
    pub chunk_len: u32,
    pub digest: DigestAlg,
}

/// What the reader reports, in file order.
pub enum ReaderMsg {
    /// Chunk `seq` (at `seq * chunk_len`) is in the token's slot.
    Chunk {
        token: SlotToken,
        seq: u64,
        len: u32,
        crc: u32,
    },
    /// Every chunk of the job was reported; the whole-file digest.
    Done(Digest),
    /// Reading failed; the job is abandoned.
    Failed(String, std::io::Error),
}

/// Runs until `jobs` closes (or `free` closes mid-job).
pub fn run(
    filler: SlotFiller<'_>,
    jobs: Receiver<ReadJob<'_>>,
    free: Receiver<SlotToken>,
    out: Sender<ReaderMsg>,
) {
    while let Ok(job) = jobs.recv() {
        if !read_file(&filler, &job, &free, &out) {
            return;
        }
    }
}

/// Returns false when the session is going away (a channel closed).
fn read_file(
    filler: &SlotFiller<'_>,
    job: &ReadJob<'_>,
    free: &Receiver<SlotToken>,
    out: &Sender<ReaderMsg>,
) -> bool {
    let mut hasher = FileHasher::new(job.digest);
    let mut offset = 0u64;
    let mut seq = 0u64;
    while offset < job.size {
        let Ok(mut token) = free.recv() else {
            return false;
        };
        let len = (job.size - offset).min(job.chunk_len as u64) as u32;
        let result = filler
            .slot_mut(&mut token, len as usize)
            .map_err(std::io::Error::other)
            .and_then(|data| {
                job.file.read_exact_at(data, offset)?;
                let crc = crc32fast::hash(data);
                hasher.update(data, crc);
                #[cfg(feature = "fault-injection")]
                super::fault::after_checksum(seq, data);
                Ok(crc)
            });
        let msg = match result {
            Ok(crc) => ReaderMsg::Chunk {
                token,
                seq,
                len,
                crc,
            },
            Err(e) => {
                let context = format!("cannot read {} at offset {offset}", job.name);
                let _ = out.send(ReaderMsg::Failed(context, e));
                return true;
            }
        };
        if out.send(msg).is_err() {
            return false;
        }
        offset += len as u64;
        seq += 1;
    }
    out.send(ReaderMsg::Done(hasher.finish())).is_ok()
}
