//! The sender's reader thread: fills registered staging slots with file data
//! and computes each chunk's CRC32, its tag (with a token: right after the
//! chunk in the slot) and the whole-file digest, so that this CPU work
//! overlaps with posting writes (where software RDMA does its own per-byte
//! work in the posting thread's system calls).

use super::digest::FileHasher;
use super::per_byte::{checksum_chunk, fill_chunk, tag_chunk};
use crate::proto::{CHUNK_TAG_LEN, ChunkAuth, Digest, DigestAlg};
use crate::sys::SysError;
use crate::sys::os::wait_readable;
use crate::sys::rdma::{Buffer, BufferFiller};
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::time::{Duration, Instant};

/// What a job reads.
pub enum Input {
    /// A file of known size, read by offset from 0.
    /// `size` bytes of `file` from `start` on (0, or a piece's first
    /// byte); the offer's offsets count from `start`.
    File { file: File, size: u64, start: u64 },
    /// A stream (standard input) read until end of file. With `whole`,
    /// the end of file is the stream's end only once `whole` is set (a
    /// relay hop sets it after its own checks passed); before, the
    /// stream was abandoned and its end fails the read.
    Stream {
        file: File,
        whole: Option<std::sync::Arc<AtomicBool>>,
    },
    /// The files of a batch, read back to back as one file.
    Batch(Vec<BatchFile>),
    /// What a relay hop passes on while it receives it.
    Relayed(RelayedInput),
}

/// A file a relay hop passes on while it receives it: the part it kept
/// from an earlier transfer (its own partial file, read by offset), then
/// the bytes it receives, through a pipe, as they pass its checks.
pub struct RelayedInput {
    /// `[0, len)` of the file, in the hop's own copy.
    pub kept: Option<(File, u64)>,
    /// The rest of the file, from `pipe_at` on.
    pub pipe: File,
    /// The file offset of the pipe's next byte: the kept part's end, or
    /// further once the check of the next host's HAVE read on.
    pub pipe_at: u64,
    /// As for a stream: the pipe's end is the file's only once set (the
    /// hop's own checks passed).
    pub whole: std::sync::Arc<AtomicBool>,
    /// Set when the pipe is first read: the hop holds its sender until
    /// then (the pipe is small).
    pub flowing: std::sync::Arc<AtomicBool>,
}

impl RelayedInput {
    /// `pipe` carries the file from `kept`'s end on.
    pub fn new(
        kept: Option<(File, u64)>,
        pipe: File,
        whole: std::sync::Arc<AtomicBool>,
        flowing: std::sync::Arc<AtomicBool>,
    ) -> Self {
        let pipe_at = kept.as_ref().map_or(0, |(_, len)| *len);
        Self {
            kept,
            pipe,
            pipe_at,
            whole,
            flowing,
        }
    }

    /// The kept part's length.
    pub fn kept_len(&self) -> u64 {
        self.kept.as_ref().map_or(0, |(_, len)| *len)
    }

    /// Why it cannot be read from `offset` on, if it cannot: the pipe's
    /// bytes from there went by already (read to check what the next host
    /// kept, which differed).
    fn cannot_start_at(&self, offset: u64) -> Option<String> {
        let pipe_from = offset.max(self.kept_len());
        (self.pipe_at != pipe_from).then(|| {
            format!(
                "this host cannot send it from byte {offset}: it holds its first {} bytes and \
                 those from byte {} on (what the next host kept differs from them; it starts \
                 afresh on the next run)",
                self.kept_len(),
                self.pipe_at
            )
        })
    }

    /// Fills `buf` with the file's bytes from `offset` on, from the kept
    /// part, then the pipe (`offset` at most `pipe_at` there): the bytes
    /// filled, fewer than asked only at the pipe's end. Waits for the
    /// pipe's input without blocking in read(), looking at `stopped`
    /// every 200 ms (`Ok(None)` once it says so).
    pub fn fill(
        &mut self,
        buf: &mut [u8],
        offset: u64,
        stopped: &mut dyn FnMut() -> bool,
    ) -> std::io::Result<Option<usize>> {
        let mut filled = 0;
        if let Some((kept, len)) = &self.kept
            && offset < *len
        {
            let n = ((*len - offset) as usize).min(buf.len());
            kept.read_exact_at(&mut buf[..n], offset)?;
            filled = n;
        }
        // `cannot_start_at` let the first read in; the reads follow on
        // from it. Should one not, no byte goes out as another offset's.
        if filled < buf.len() && offset + filled as u64 != self.pipe_at {
            return Err(std::io::Error::other(format!(
                "bytes {} to {} of it are not here to be passed on",
                offset + filled as u64,
                self.pipe_at
            )));
        }
        if filled < buf.len() {
            self.flowing.store(true, Ordering::SeqCst);
        }
        let Some(piped) = fill_from_pipe(&self.pipe, &mut buf[filled..], stopped)? else {
            return Ok(None);
        };
        self.pipe_at += piped as u64;
        Ok(Some(filled + piped))
    }

    /// A descriptor of each part, for a check read on another thread
    /// (the pipe's bytes it reads are gone for this one: `read_on`).
    pub fn try_clone(&self) -> std::io::Result<RelayedInput> {
        let kept = match &self.kept {
            Some((file, len)) => Some((file.try_clone()?, *len)),
            None => None,
        };
        Ok(RelayedInput {
            kept,
            pipe: self.pipe.try_clone()?,
            pipe_at: self.pipe_at,
            whole: self.whole.clone(),
            flowing: self.flowing.clone(),
        })
    }

    /// A clone (`try_clone`) read up to `offset`: the pipe's next byte is
    /// at `offset` now, if it reached into the pipe.
    pub fn read_on(&mut self, offset: u64) {
        self.pipe_at = self.pipe_at.max(offset);
    }
}

/// One file of a batch: read from 0 to its size as measured when offered.
pub struct BatchFile {
    pub file: File,
    pub size: u64,
    pub name: String,
}

/// One file or stream to read, in chunks of `chunk_len`.
pub struct ReadJob {
    pub input: Input,
    pub name: String,
    pub chunk_len: u32,
    pub digest: DigestAlg,
    /// A file resumed after a prefix the receiver kept: where to start,
    /// and the whole-file digest over the bytes before it.
    pub resume: Option<(u64, FileHasher)>,
    /// With a token: how each chunk is tagged (the offer's, from the
    /// session machine).
    pub auth: Option<ChunkAuth>,
}

impl ReadJob {
    /// Bytes of a slot after each chunk: its tag, or nothing.
    fn tag_len(&self) -> usize {
        if self.auth.is_some() {
            CHUNK_TAG_LEN
        } else {
            0
        }
    }
}

/// What the reader reports, in file order.
pub enum ReaderMsg {
    /// The next chunk of the job (in order) is in the token's
    /// slot (`len` bytes, then its tag if the job has `auth`). Every chunk
    /// but the last is `chunk_len` long.
    Chunk { token: Buffer, len: u32, crc: u32 },
    /// Every chunk of the job was reported; the whole-file digest (of a
    /// batch: of all its bytes, then each file's own).
    Done(Digest, Vec<Digest>),
    /// Reading failed; the job is abandoned.
    Failed(String, std::io::Error),
}

/// Fills a buffer with the bytes from a file offset on: fewer only at the
/// end, None once the given `stopped` says so.
type Fill<'a> =
    dyn FnMut(&mut [u8], u64, &mut dyn FnMut() -> bool) -> std::io::Result<Option<usize>> + 'a;

/// How long a stream read waits before it looks at `stop` again.
const STOP_CHECK: Duration = Duration::from_millis(200);

/// The reader's channels and state across jobs.
pub struct Reader<'a> {
    pub filler: BufferFiller<'a>,
    pub jobs: Receiver<ReadJob>,
    pub free: Receiver<Buffer>,
    pub out: Sender<ReaderMsg>,
    /// Set when the session goes away: a read waiting for input gives up.
    pub stop: &'a AtomicBool,
    /// A slot taken from `free` but not filled (a stream ended on a slot
    /// boundary): used for the next chunk.
    pub spare: Option<Buffer>,
}

impl Reader<'_> {
    /// Runs until `jobs` closes (or `free` closes mid-job, or `stop`).
    pub fn run(mut self) {
        while let Ok(mut job) = self.jobs.recv() {
            let resume = job.resume.take();
            let mut input = std::mem::replace(&mut job.input, Input::Batch(Vec::new()));
            let going_on = match &mut input {
                Input::File { file, size, start } => {
                    self.read_file(&job, (file, *start), *size, resume)
                }
                Input::Stream { file, whole } => self.read_stream(&job, file, whole.as_deref()),
                Input::Batch(files) => self.read_batch(&job, files),
                Input::Relayed(input) => self.read_relayed(&job, input, resume),
            };
            if !going_on {
                return;
            }
        }
    }

    fn next_slot(&mut self) -> Option<Buffer> {
        self.spare.take().or_else(|| self.free.recv().ok())
    }

    /// Returns false when the session is going away (a channel closed).
    fn read_file(
        &mut self,
        job: &ReadJob,
        (file, start): (&File, u64),
        size: u64,
        resume: Option<(u64, FileHasher)>,
    ) -> bool {
        let (mut offset, mut hasher) = resume.unwrap_or_else(|| (0, FileHasher::new(job.digest)));
        while offset < size {
            let Some(mut token) = self.next_slot() else {
                return false;
            };
            let len = (size - offset).min(job.chunk_len as u64) as u32;
            let result = self
                .filler
                .slot_mut(&mut token, len as usize + job.tag_len())
                .map_err(std::io::Error::other)
                .and_then(|slot| {
                    let (data, tag) = slot.split_at_mut(len as usize);
                    #[allow(unused_mut)]
                    let mut crc = fill_chunk(file, start + offset, data, Some(&mut hasher))?;
                    tag_chunk(job.auth.as_ref(), offset, data, tag);
                    #[cfg(feature = "fault-injection")]
                    super::fault::after_checksum(offset / u64::from(job.chunk_len), data, &mut crc);
                    Ok(crc)
                });
            let msg = match result {
                Ok(crc) => ReaderMsg::Chunk { token, len, crc },
                Err(e) => {
                    self.spare = Some(token);
                    let (context, e) = read_failure(&job.name, size, offset, len as usize, e);
                    let _ = self.out.send(ReaderMsg::Failed(context, e));
                    return true;
                }
            };
            if self.out.send(msg).is_err() {
                return false;
            }
            offset += len as u64;
        }
        self.out
            .send(ReaderMsg::Done(hasher.finish(), Vec::new()))
            .is_ok()
    }

    /// Reads a batch's files back to back, in chunks that span files;
    /// each file's own digest is kept too (for its report). Returns false
    /// when the session is going away.
    fn read_batch(&mut self, job: &ReadJob, files: &[BatchFile]) -> bool {
        let mut hasher = FileHasher::new(job.digest);
        let mut own: Vec<FileHasher> = files.iter().map(|_| FileHasher::new(job.digest)).collect();
        let total: u64 = files.iter().map(|f| f.size).sum();
        // The file being read and the offset in it.
        let (mut index, mut at) = (0usize, 0u64);
        let mut offset = 0u64;
        while offset < total {
            let Some(mut token) = self.next_slot() else {
                return false;
            };
            let len = (total - offset).min(u64::from(job.chunk_len)) as u32;
            let (data, tag) = match self
                .filler
                .slot_mut(&mut token, len as usize + job.tag_len())
            {
                Ok(slot) => slot.split_at_mut(len as usize),
                Err(e) => {
                    self.spare = Some(token);
                    let context = format!("cannot read {}", job.name);
                    let _ = self
                        .out
                        .send(ReaderMsg::Failed(context, std::io::Error::other(e)));
                    return true;
                }
            };
            let mut filled = 0usize;
            while filled < data.len() {
                let Some(f) = files.get(index) else { break };
                let part = ((f.size - at) as usize).min(data.len() - filled);
                let dst = &mut data[filled..filled + part];
                if let Err(e) = f.file.read_exact_at(dst, at) {
                    self.spare = Some(token);
                    let (context, e) = read_failure(&f.name, f.size, at, part, e);
                    let _ = self.out.send(ReaderMsg::Failed(context, e));
                    return true;
                }
                if let Some(h) = own.get_mut(index) {
                    h.update(dst, crc32fast::hash(dst));
                }
                filled += part;
                at += part as u64;
                if at == f.size {
                    (index, at) = (index + 1, 0);
                }
            }
            #[allow(unused_mut)]
            let mut crc = checksum_chunk(data, &mut hasher);
            tag_chunk(job.auth.as_ref(), offset, data, tag);
            #[cfg(feature = "fault-injection")]
            super::fault::after_checksum(offset / u64::from(job.chunk_len), data, &mut crc);
            if self.out.send(ReaderMsg::Chunk { token, len, crc }).is_err() {
                return false;
            }
            offset += u64::from(len);
        }
        let each = own.into_iter().map(FileHasher::finish).collect();
        self.out
            .send(ReaderMsg::Done(hasher.finish(), each))
            .is_ok()
    }

    /// Reads a stream to its end: every slot is filled completely (pipes
    /// deliver short reads) unless the end comes first. Returns false when
    /// the session is going away.
    fn read_stream(&mut self, job: &ReadJob, file: &File, whole: Option<&AtomicBool>) -> bool {
        let start = (0, FileHasher::new(job.digest));
        self.read_on(job, start, whole, &mut |buf, _, stopped| {
            fill_from_pipe(file, buf, stopped)
        })
    }

    /// Reads what a relay hop passes on, from the resumed offset (or 0):
    /// its kept part, then the pipe.
    fn read_relayed(
        &mut self,
        job: &ReadJob,
        input: &mut RelayedInput,
        resume: Option<(u64, FileHasher)>,
    ) -> bool {
        let start = resume.unwrap_or_else(|| (0, FileHasher::new(job.digest)));
        if let Some(why) = input.cannot_start_at(start.0) {
            let _ = self.out.send(ReaderMsg::Failed(
                format!("{} is not passed on", job.name),
                std::io::Error::other(why),
            ));
            return true;
        }
        let whole = input.whole.clone();
        self.read_on(job, start, Some(&whole), &mut |buf, offset, stopped| {
            input.fill(buf, offset, stopped)
        })
    }

    /// Reads chunks from `fill` (which fills a buffer from a file offset
    /// on: fewer bytes only at the end, None once told to stop) from
    /// `offset` on, with the digest so far, to the end. With `whole`, the
    /// end is the file's only once it is set. Returns false when the
    /// session is going away.
    fn read_on(
        &mut self,
        job: &ReadJob,
        (mut total, mut hasher): (u64, FileHasher),
        whole: Option<&AtomicBool>,
        fill: &mut Fill<'_>,
    ) -> bool {
        let stop = self.stop;
        let mut stopped = || stop.load(Ordering::SeqCst);
        loop {
            let Some(mut token) = self.next_slot() else {
                return false;
            };
            let tag_len = job.tag_len();
            let data = match self
                .filler
                .slot_mut(&mut token, job.chunk_len as usize + tag_len)
            {
                Ok(slot) => slot,
                Err(e) => {
                    self.spare = Some(token);
                    let _ = self.out.send(ReaderMsg::Failed(
                        format!("cannot read {}", job.name),
                        std::io::Error::other(e),
                    ));
                    return true;
                }
            };
            let room = data.len() - tag_len;
            let filled = match fill(&mut data[..room], total, &mut stopped) {
                Ok(Some(filled)) => filled,
                Ok(None) => return false,
                Err(e) => {
                    self.spare = Some(token);
                    let context = if e.kind() == std::io::ErrorKind::Interrupted {
                        format!("reading {}", job.name)
                    } else {
                        format!("cannot read {} at offset {total}", job.name)
                    };
                    let _ = self.out.send(ReaderMsg::Failed(context, e));
                    return true;
                }
            };
            let eof = filled < room;
            if filled > 0 {
                // The tag goes right after the chunk, short or not.
                let (chunk, tag) = data.split_at_mut(filled);
                #[allow(unused_mut)]
                let mut crc = checksum_chunk(chunk, &mut hasher);
                tag_chunk(job.auth.as_ref(), total, chunk, tag);
                #[cfg(feature = "fault-injection")]
                super::fault::after_checksum(total / u64::from(job.chunk_len), chunk, &mut crc);
                let msg = ReaderMsg::Chunk {
                    token,
                    len: filled as u32,
                    crc,
                };
                if self.out.send(msg).is_err() {
                    return false;
                }
                total += filled as u64;
            } else {
                self.spare = Some(token);
            }
            if eof {
                if whole.is_some_and(|w| !w.load(Ordering::SeqCst)) {
                    let _ = self.out.send(ReaderMsg::Failed(
                        format!("{} was abandoned", job.name),
                        std::io::Error::other(
                            "the host before this one did not receive it whole: nothing of it is \
                             kept",
                        ),
                    ));
                    return true;
                }
                return self
                    .out
                    .send(ReaderMsg::Done(hasher.finish(), Vec::new()))
                    .is_ok();
            }
        }
    }
}

/// Fills `buf` from a pipe (or standard input): the bytes filled, fewer
/// only at its end. Waits for input without blocking in read(), so that a
/// session that ends meanwhile is not held up by a silent producer: looks
/// at `stopped` every 200 ms (`Ok(None)` once it says so).
pub fn fill_from_pipe(
    mut pipe: &File,
    buf: &mut [u8],
    stopped: &mut dyn FnMut() -> bool,
) -> std::io::Result<Option<usize>> {
    let mut filled = 0;
    while filled < buf.len() {
        match wait_readable(pipe, Instant::now() + STOP_CHECK) {
            Ok(true) => {}
            Ok(false) if stopped() => return Ok(None),
            Ok(false) => continue,
            Err(SysError::Interrupted) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Interrupted,
                    "interrupted",
                ));
            }
            // poll() itself failed: let read() block or say why.
            Err(_) => {}
        }
        match pipe.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock
                ) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Some(filled))
}

/// What a failed read of `len` bytes at `offset` of `name` (`size` bytes
/// when offered) says: that the file shrank, or why it cannot be read.
fn read_failure(
    name: &str,
    size: u64,
    offset: u64,
    len: usize,
    e: std::io::Error,
) -> (String, std::io::Error) {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        let why = format!(
            "it had {size} bytes when the transfer started and now ends before byte {}",
            offset + len as u64
        );
        (
            format!("{name} shrank while being sent"),
            std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why),
        )
    } else {
        (format!("cannot read {name} at offset {offset}"), e)
    }
}
