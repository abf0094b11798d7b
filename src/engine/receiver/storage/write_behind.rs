//! Write-behind: checked chunks are written to their file by a few threads
//! while the session's thread copies and checks the next ones.
//!
//! On a real NIC the receiver's per-byte work is the copy out of the ring,
//! the CRC32 check and the pwrite into the page cache, and the pwrite is
//! three quarters of it (new pages are allocated and cleared before the
//! copy; docs/performance.md). The session's thread keeps the copy and the
//! check, in order (so the whole-file digest and what is verified stay as
//! they were); each checked chunk, in a private buffer, goes to a writer
//! thread, which writes it at its offset. The ring slot is free as soon as
//! the chunk is copied out, so its credit goes back before the write.
//! Writes finish in any order; they are *retired* in submission order, so
//! the bookkeeping that needs order (the resume record of verified chunks)
//! sees them as a single writer would. Memory is bounded: a fixed number
//! of chunk buffers, a chunk waits for one to come back.

use std::collections::{BTreeMap, VecDeque};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

/// A chunk to write: where, and the buffer that holds it.
struct Job {
    seq: u64,
    file: Arc<File>,
    offset: u64,
    buf: Vec<u8>,
    len: usize,
}

/// A chunk written (or not), with its buffer back.
struct Done {
    seq: u64,
    buf: Vec<u8>,
    result: std::io::Result<()>,
}

/// A chunk whose write is over, in the order chunks were submitted.
#[derive(Debug)]
pub struct Retired {
    /// Where the chunk goes in its file.
    pub offset: u64,
    pub len: u32,
    pub crc: u32,
    pub result: std::io::Result<()>,
}

/// A chunk submitted and not yet retired.
#[derive(Clone, Copy)]
struct Submitted {
    seq: u64,
    offset: u64,
    len: u32,
    crc: u32,
}

/// The writer threads of one session and the chunks they hold.
pub struct WriteBehind {
    jobs: Option<Sender<Job>>,
    done: Receiver<Done>,
    workers: Vec<JoinHandle<()>>,
    /// Buffers not in use, how many exist and how many may.
    free: Vec<Vec<u8>>,
    created: usize,
    buffers: usize,
    chunk_len: usize,
    /// Submitted and not yet retired, in order.
    queue: VecDeque<Submitted>,
    /// Writes over whose turn to retire has not come.
    over: BTreeMap<u64, std::io::Result<()>>,
    next_seq: u64,
}

impl WriteBehind {
    /// Writers at most.
    pub const MAX_THREADS: usize = 64;

    /// `threads` writers (1..=MAX_THREADS) and twice as many chunk buffers
    /// of `chunk_len` bytes (allocated as they are first needed).
    pub fn new(threads: usize, chunk_len: usize) -> std::io::Result<Self> {
        let threads = threads.clamp(1, Self::MAX_THREADS);
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let job_rx = job_rx.clone();
            let done_tx = done_tx.clone();
            let worker = std::thread::Builder::new()
                .name(format!("writer-{i}"))
                .spawn(move || write_jobs(&job_rx, &done_tx))?;
            workers.push(worker);
        }
        Ok(WriteBehind {
            jobs: Some(jobs),
            done,
            workers,
            free: Vec::new(),
            created: 0,
            buffers: 2 * threads,
            chunk_len,
            queue: VecDeque::new(),
            over: BTreeMap::new(),
            next_seq: 0,
        })
    }

    /// A buffer for the next chunk: a free one, a new one while fewer than
    /// the limit exist, else the next to come back (whatever retires
    /// meanwhile is appended to `retired`).
    pub fn buffer(&mut self, retired: &mut Vec<Retired>) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(buf) = self.free.pop() {
                return Ok(buf);
            }
            if self.created < self.buffers {
                self.created += 1;
                return Ok(vec![0; self.chunk_len]);
            }
            self.wait_one(retired)?;
        }
    }

    /// Gives back a buffer that was not submitted (its chunk failed).
    pub fn give_back(&mut self, buf: Vec<u8>) {
        self.free.push(buf);
    }

    /// Hands `len` bytes of `buf` to a writer, to go to `offset` of `file`.
    pub fn submit(
        &mut self,
        file: &Arc<File>,
        offset: u64,
        buf: Vec<u8>,
        len: usize,
        crc: u32,
    ) -> std::io::Result<()> {
        let seq = self.next_seq;
        let job = Job {
            seq,
            file: file.clone(),
            offset,
            buf,
            len,
        };
        let Some(jobs) = self.jobs.as_ref() else {
            self.free.push(job.buf);
            return Err(gone());
        };
        if let Err(unsent) = jobs.send(job) {
            self.free.push(unsent.0.buf);
            return Err(gone());
        }
        self.next_seq += 1;
        self.queue.push_back(Submitted {
            seq,
            offset,
            len: len as u32,
            crc,
        });
        Ok(())
    }

    /// Retires, without waiting, the writes that are over and whose turn
    /// it is.
    pub fn poll(&mut self, retired: &mut Vec<Retired>) {
        while let Ok(done) = self.done.try_recv() {
            self.over(done);
        }
        self.retire(retired);
    }

    /// True when no chunk is submitted and not yet retired.
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Waits until every submitted chunk is retired.
    pub fn drain(&mut self, retired: &mut Vec<Retired>) -> std::io::Result<()> {
        self.retire(retired);
        while !self.queue.is_empty() {
            self.wait_one(retired)?;
        }
        Ok(())
    }

    /// Waits for one write to be over, then retires what can be.
    fn wait_one(&mut self, retired: &mut Vec<Retired>) -> std::io::Result<()> {
        if self.queue.len() == self.over.len() {
            return Err(std::io::Error::other("no write in flight to wait for"));
        }
        let done = self.done.recv().map_err(|_| gone())?;
        self.over(done);
        self.retire(retired);
        Ok(())
    }

    fn over(&mut self, done: Done) {
        self.free.push(done.buf);
        self.over.insert(done.seq, done.result);
    }

    fn retire(&mut self, retired: &mut Vec<Retired>) {
        while let Some(&next) = self.queue.front() {
            let Some(result) = self.over.remove(&next.seq) else {
                break;
            };
            self.queue.pop_front();
            retired.push(Retired {
                offset: next.offset,
                len: next.len,
                crc: next.crc,
                result,
            });
        }
    }
}

impl Drop for WriteBehind {
    fn drop(&mut self) {
        // Closing the queue ends each worker after the jobs it holds.
        self.jobs = None;
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

fn gone() -> std::io::Error {
    std::io::Error::other("the writer threads are gone")
}

/// A writer thread: takes jobs until the queue closes.
fn write_jobs(jobs: &Mutex<Receiver<Job>>, done: &Sender<Done>) {
    loop {
        // The lock is held only while waiting for the next job.
        let job = match jobs.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else { return };
        let result = match job.buf.get(..job.len) {
            Some(data) => job.file.write_all_at(data, job.offset),
            None => Err(std::io::Error::other("chunk longer than its buffer")),
        };
        #[cfg(feature = "fault-injection")]
        let result = if crate::engine::fault::fails_write(job.offset) {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        } else {
            result
        };
        let reply = Done {
            seq: job.seq,
            buf: job.buf,
            result,
        };
        if done.send(reply).is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn temp() -> (tempfile::NamedTempFile, Arc<File>) {
        let f = tempfile::NamedTempFile::new().unwrap();
        let file = Arc::new(f.reopen().unwrap());
        (f, file)
    }

    #[test]
    fn chunks_land_at_their_offsets_and_retire_in_order() {
        let (named, file) = temp();
        let mut wb = WriteBehind::new(3, 4096).unwrap();
        let mut retired = Vec::new();
        let chunks = 40u32;
        for i in 0..chunks {
            let mut buf = wb.buffer(&mut retired).unwrap();
            buf.fill(i as u8);
            // Chunks of different lengths: the last is short.
            let len = if i == chunks - 1 { 100 } else { 4096 };
            wb.submit(&file, u64::from(i) * 4096, buf, len, i).unwrap();
            wb.poll(&mut retired);
            // Never more buffers than the limit.
            assert!(wb.created <= 6);
        }
        wb.drain(&mut retired).unwrap();
        let crcs: Vec<u32> = retired.iter().map(|r| r.crc).collect();
        assert_eq!(crcs, (0..chunks).collect::<Vec<_>>());
        assert!(retired.iter().all(|r| r.result.is_ok()));
        assert_eq!(retired.last().unwrap().len, 100);
        let mut got = Vec::new();
        named.reopen().unwrap().read_to_end(&mut got).unwrap();
        assert_eq!(got.len(), 39 * 4096 + 100);
        for (i, block) in got.chunks(4096).enumerate() {
            assert!(block.iter().all(|&b| b == i as u8), "chunk {i}");
        }
    }

    #[test]
    fn writes_over_in_reverse_order_retire_in_submission_order() {
        let (_named, file) = temp();
        let mut wb = WriteBehind::new(1, 8).unwrap();
        // Stand-ins for three submitted chunks whose writes end last first.
        for seq in 0..3u64 {
            wb.queue.push_back(Submitted {
                seq,
                offset: seq * 8,
                len: 8,
                crc: seq as u32 + 100,
            });
        }
        wb.next_seq = 3;
        let mut retired = Vec::new();
        for seq in [2u64, 1] {
            wb.over(Done {
                seq,
                buf: vec![0; 8],
                result: Ok(()),
            });
            wb.retire(&mut retired);
            assert!(retired.is_empty(), "chunk 0 is not written yet");
        }
        assert!(!wb.is_idle());
        wb.over(Done {
            seq: 0,
            buf: vec![0; 8],
            result: Err(std::io::Error::other("disk on fire")),
        });
        wb.retire(&mut retired);
        let order: Vec<(u64, u32, bool)> = retired
            .iter()
            .map(|r| (r.offset, r.crc, r.result.is_ok()))
            .collect();
        assert_eq!(order, [(0, 100, false), (8, 101, true), (16, 102, true)]);
        assert!(wb.is_idle());
        // Nothing in flight: waiting for a write fails instead of hanging.
        assert!(wb.wait_one(&mut retired).is_err());
        drop(file);
    }

    #[test]
    fn a_failed_write_is_retired_in_its_turn_with_its_error() {
        // A file opened read-only: every write fails.
        let (named, _) = temp();
        let read_only = Arc::new(File::open(named.path()).unwrap());
        let (_named2, good) = temp();
        let mut wb = WriteBehind::new(2, 16).unwrap();
        let mut retired = Vec::new();
        for (i, file) in [&good, &read_only, &good].into_iter().enumerate() {
            let buf = wb.buffer(&mut retired).unwrap();
            wb.submit(file, i as u64 * 16, buf, 16, i as u32).unwrap();
        }
        wb.drain(&mut retired).unwrap();
        let outcome: Vec<(u32, bool)> = retired.iter().map(|r| (r.crc, r.result.is_ok())).collect();
        assert_eq!(outcome, [(0, true), (1, false), (2, true)]);
        // Nothing left to wait for.
        assert!(wb.drain(&mut retired).is_ok());
        assert_eq!(retired.len(), 3);
    }
}
