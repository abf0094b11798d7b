//! The answer to a HAVE: the file checked against what the receiver holds
//! (a kept prefix read back, or the whole file's SHA-256 for a COMPARE).
//! The read runs on a worker thread; the loop waits on its result, taking
//! the link's deliveries and sending the machine's KEEPALIVEs meanwhile,
//! and answers once it is there.

use super::have_read::HaveRead;
use super::pump::{Offered, Pipeline, Stage, Work};
use super::{Connection, FileError, SenderConfig, proto_err, unexpected};
use crate::engine::digest::{FileHasher, PrefixRead, read_prefix, read_prefix_from, read_sha256};
use crate::engine::reader::{Input, RelayedInput};
use crate::engine::worker::{Cancel, Lost, WORK_CHECK, Worker};
use crate::error::XferError;
use crate::proto::{Digest, Have, HaveKind, SenderEvent, Waiting, escaped};
use crate::sys::SysError;
use std::time::Instant;
use tracing::{debug, info, warn};

#[cfg(test)]
pub(super) type ReadHook = std::sync::Arc<dyn Fn() + Send + Sync>;

#[cfg(test)]
thread_local! {
    /// Tests: called before each piece of the next HAVE's read started on
    /// this thread (a pause, so that the loop's KEEPALIVEs come due; or a
    /// block the test lifts), and dropped at that read's end.
    pub(super) static READ_HOOK: std::cell::RefCell<Option<ReadHook>> =
        const { std::cell::RefCell::new(None) };
}

/// What a HAVE's read does before each piece besides its look at
/// `Cancel`: nothing, but in tests (`READ_HOOK`).
struct BeforePiece {
    #[cfg(test)]
    hook: Option<ReadHook>,
}

impl BeforePiece {
    fn next() -> Self {
        Self {
            #[cfg(test)]
            hook: READ_HOOK.take(),
        }
    }

    /// Before each piece of a HAVE's read: stops it once the session
    /// stopped it or SIGINT or SIGTERM came (see `Cancel`).
    fn tick(&self, cancel: &Cancel) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(hook) = &self.hook {
            hook();
        }
        cancel.check()
    }
}

/// How the sender answers a HAVE.
enum Answer {
    /// FROM: data from this offset (0 or the kept prefix; for a prefix,
    /// the whole-file digest over it).
    From(u64, Option<(u64, FileHasher)>),
    /// COMPARE: the receiver has a complete copy, or asked for the file's
    /// digest; this is the file's SHA-256.
    Compare([u8; 32]),
}

impl Connection {
    /// Checks the file against what the receiver holds of it (HAVE): for
    /// a complete copy, or a request for it (`--checksum`), the file's
    /// SHA-256 (the receiver compares), else where its data starts: the
    /// kept prefix when every chunk of it has the CRC the receiver recorded
    /// (with the whole-file digest over it), else 0, saying why. What needs
    /// the file read is answered when the read is done (`have_read_done`).
    pub(super) fn on_have(
        &mut self,
        cfg: &SenderConfig,
        w: &mut Work,
        have: Have,
    ) -> Result<(), FileError> {
        let Offered::File {
            input: Some(input), ..
        } = &w.offered
        else {
            return Err(unexpected(&SenderEvent::Have(have)));
        };
        let name = &w.name;
        let read = match (have.kind, input) {
            (HaveKind::Nothing, _) => {
                if !have.note.is_empty() {
                    warn!(file = %escaped(name), "starting from zero: {}", escaped(&have.note));
                }
                return self.reply(&mut w.stage, Answer::From(0, None));
            }
            (HaveKind::Prefix, _) if have.chunk_len > cfg.chunk_size => {
                warn!(
                    file = %escaped(name),
                    "starting from zero: the receiver kept {} bytes in chunks of {}, larger than \
                     this sender's --chunk-size {}",
                    have.bytes, have.chunk_len, cfg.chunk_size
                );
                return self.reply(&mut w.stage, Answer::From(0, None));
            }
            (HaveKind::Prefix, Input::File { file, .. }) => {
                let what = format!(
                    "reading {} to check the part the receiver kept",
                    escaped(name)
                );
                let Some((file, worker)) = start(cfg, name, what, file) else {
                    return self.reply(&mut w.stage, Answer::From(0, None));
                };
                let (bytes, chunk_len, alg) = (have.bytes, have.chunk_len, cfg.verify);
                let before = BeforePiece::next();
                HaveRead::Prefix {
                    bytes,
                    want: have.digest,
                    worker: worker.run(move |cancel| {
                        let mut tick = || before.tick(cancel);
                        read_prefix(&file, bytes, chunk_len, alg, &mut tick, |_, _, _| Ok(()))
                    }),
                }
            }
            (HaveKind::Prefix, Input::Relayed(_)) if have.chunk_len < MIN_CHECKED_CHUNK => {
                warn!(
                    file = %escaped(name),
                    "starting from zero: the next host kept {} bytes in chunks of {} bytes, \
                     too small to check",
                    have.bytes, have.chunk_len
                );
                return self.reply(&mut w.stage, Answer::From(0, None));
            }
            // A relay hop's: its kept part, then the bytes as they come.
            (HaveKind::Prefix, Input::Relayed(input)) => {
                let what = format!(
                    "reading {} to check the part the next host kept",
                    escaped(name)
                );
                let Some((input, worker)) = start_relayed(cfg, name, what, input) else {
                    return self.reply(&mut w.stage, Answer::From(0, None));
                };
                let (bytes, chunk_len, alg) = (have.bytes, have.chunk_len, cfg.verify);
                HaveRead::Prefix {
                    bytes,
                    want: have.digest,
                    worker: worker.run(move |cancel| {
                        read_relayed_prefix(input, bytes, chunk_len, alg, cancel)
                    }),
                }
            }
            // Read before any data, whatever the receiver then decides.
            // (A piece, never resumed or compared, starts at 0 here.)
            (HaveKind::Complete | HaveKind::Digest, Input::File { file, size, .. }) => {
                // FROM 0 answers any HAVE: the receiver takes the data.
                let what = format!("reading {} for the receiver's HAVE", escaped(name));
                let Some((file, worker)) = start(cfg, name, what, file) else {
                    return self.reply(&mut w.stage, Answer::From(0, None));
                };
                let (size, chunk_len) = (*size, cfg.chunk_size);
                let before = BeforePiece::next();
                HaveRead::Compare(
                    worker.run(move |cancel| {
                        read_sha256(&file, size, chunk_len, || before.tick(cancel))
                    }),
                )
            }
            // A stream's SHA-256 (a relay hop's file as it comes) is not
            // known before its data; streams are never offered with
            // RESUME or CHECKSUM.
            (_, Input::Stream { .. } | Input::Batch(_) | Input::Relayed(_)) => {
                return self.reply(&mut w.stage, Answer::From(0, None));
            }
        };
        w.have_read = Some(read);
        Ok(())
    }

    /// Answers the HAVE once its read is done (nothing before).
    pub(super) fn have_read_done(&mut self, w: &mut Work) -> Result<(), FileError> {
        let name = &w.name;
        let answer = match w.have_read.as_mut() {
            None => return Ok(()),
            Some(HaveRead::Prefix {
                bytes,
                want,
                worker,
            }) => {
                let Some(read) = worker.result() else {
                    return Ok(());
                };
                let read = finished(name, read)?;
                // A relay hop's bytes up to there are read, from its pipe.
                if let Offered::File {
                    input: Some(Input::Relayed(input)),
                    ..
                } = &mut w.offered
                {
                    input.read_on(*bytes);
                }
                if Digest::Sha256(read.crc_digest) == *want {
                    info!(file = %escaped(name), bytes = *bytes, "continuing after the part the receiver kept");
                    Answer::From(*bytes, Some((*bytes, read.hasher)))
                } else {
                    warn!(
                        file = %escaped(name),
                        "starting from zero: the source changed within the {} bytes the receiver kept",
                        bytes
                    );
                    Answer::From(0, None)
                }
            }
            Some(HaveRead::Compare(worker)) => {
                let Some(read) = worker.result() else {
                    return Ok(());
                };
                Answer::Compare(finished(name, read)?)
            }
        };
        // Its thread has ended: joined here.
        w.have_read = None;
        self.reply(&mut w.stage, answer)
    }

    /// Waits a little for the HAVE's read, then takes what the link
    /// delivered meanwhile (watching for the receiver's disconnect) and
    /// sends the machine's KEEPALIVE when due.
    pub(super) fn wait_have_read(
        &mut self,
        w: &mut Work,
        pipe: &mut Pipeline<'_>,
    ) -> Result<(), FileError> {
        let now = Instant::now();
        self.session.waiting(Waiting::Input, now);
        // The machine's next KEEPALIVE; the worker's wait is short anyway.
        let deadline = self.session.poll_timeout().unwrap_or(now + WORK_CHECK);
        let what = self.session.waited_for();
        let waited = match w.have_read.as_mut() {
            Some(read) => read.wait_until(deadline, &mut *self.link, what),
            None => self.link.wait_until(Instant::now(), what).map(drop),
        };
        // What came before a failure still counts.
        self.handle_deliveries(pipe)?;
        waited.map_err(|e| self.failure(e))?;
        self.session
            .handle_timeout(Instant::now())
            .map_err(proto_err)?;
        if self.transmit()? > 0 {
            debug!("reading the file for the receiver's HAVE: KEEPALIVE sent");
        }
        Ok(())
    }

    /// Sends the answer to the HAVE: FROM (the data's offset; `stage`
    /// keeps the prefix's digest for the data) or COMPARE.
    fn reply(&mut self, stage: &mut Stage, answer: Answer) -> Result<(), FileError> {
        match answer {
            Answer::From(offset, resume) => {
                self.session.start_from(offset).map_err(proto_err)?;
                self.transmit()?;
                *stage = Stage::Offer { resume };
            }
            Answer::Compare(sha256) => {
                self.session.compare(sha256).map_err(proto_err)?;
                self.transmit()?;
            }
        }
        Ok(())
    }
}

/// The file (a descriptor of its own) and a thread for a HAVE's read
/// (`what` it does, for its errors), whose stall limit is --timeout;
/// None when either is not to be had (no descriptor or thread to
/// spare): the file is then sent whole.
fn start<T: Send + 'static>(
    cfg: &SenderConfig,
    name: &str,
    what: String,
    file: &std::fs::File,
) -> Option<(std::fs::File, Worker<T>)> {
    start_with(cfg, name, what, "receiver", || file.try_clone())
}

/// `start` for a relay hop's input: a descriptor of each part.
fn start_relayed<T: Send + 'static>(
    cfg: &SenderConfig,
    name: &str,
    what: String,
    input: &RelayedInput,
) -> Option<(RelayedInput, Worker<T>)> {
    start_with(cfg, name, what, "next host", || input.try_clone())
}

/// What `start` and `start_relayed` share: `input`'s own descriptors and
/// the thread, or None, said (`peer`: who holds the other copy).
fn start_with<I, T: Send + 'static>(
    cfg: &SenderConfig,
    name: &str,
    what: String,
    peer: &str,
    input: impl FnOnce() -> std::io::Result<I>,
) -> Option<(I, Worker<T>)> {
    let started =
        input().and_then(|input| Ok((input, Worker::start("have-read", what, cfg.timeout)?)));
    match started {
        Ok(started) => Some(started),
        Err(e) => {
            warn!(
                file = %escaped(name),
                "starting from zero: cannot start the read to compare it with what the \
                 {peer} holds: {e}"
            );
            None
        }
    }
}

/// The most of a relay hop's pipe its HAVE check waits for at once.
const CHECK_PIECE: usize = 64 << 10;

/// The smallest chunk length of a next host's kept part a relay hop
/// checks (smaller ones cost it a read per few bytes): below it the file
/// goes whole.
const MIN_CHECKED_CHUNK: u32 = 4096;

/// A relay hop's first `bytes` of a file read as `read_prefix` does: its
/// kept part, then the bytes from its pipe as they come (the host before
/// it sends them meanwhile). Each piece of `CHECK_PIECE` bytes counts as
/// progress; the wait for the pipe does not.
fn read_relayed_prefix(
    mut input: RelayedInput,
    bytes: u64,
    chunk_len: u32,
    alg: crate::proto::DigestAlg,
    cancel: &Cancel,
) -> std::io::Result<PrefixRead> {
    let mut stopped = || cancel.is_stopped();
    // In pieces, each counted as progress: the stall limit is on the
    // bytes coming, however large the chunks.
    let fill = |data: &mut [u8], offset: u64| {
        let mut at = offset;
        for piece in data.chunks_mut(CHECK_PIECE) {
            cancel.check()?;
            match input.fill(piece, at, &mut stopped)? {
                Some(n) if n == piece.len() => at += n as u64,
                Some(n) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::UnexpectedEof,
                        format!(
                            "the host before this one ended the file at byte {}",
                            at + n as u64
                        ),
                    ));
                }
                None => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::Interrupted,
                        "interrupted",
                    ));
                }
            }
        }
        Ok(())
    };
    read_prefix_from(bytes, chunk_len, alg, fill, |_, _, _| Ok(()))
}

/// A read's result: its value, or why the session ends (SIGINT or SIGTERM
/// stopped it, the file could not be read).
fn finished<T>(name: &str, read: Result<std::io::Result<T>, Lost>) -> Result<T, FileError> {
    match read {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::Interrupted => {
            Err(FileError::Fatal(XferError::Sys(SysError::Interrupted)))
        }
        Ok(Err(e)) => Err(FileError::Fatal(XferError::io(
            format!("cannot read {name} to compare it with what the receiver holds"),
            e,
        ))),
        Err(lost) => Err(FileError::Fatal(lost.into())),
    }
}
