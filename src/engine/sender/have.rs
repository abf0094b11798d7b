//! The answer to a HAVE: the file checked against what the receiver holds
//! (a kept prefix read back, or the whole file's SHA-256 for a COMPARE).
//! The read runs on a worker thread; the loop waits on its result, taking
//! the link's deliveries and sending the machine's KEEPALIVEs meanwhile,
//! and answers once it is there.

use super::have_read::HaveRead;
use super::pump::{Offered, Pipeline, Stage, Work};
use super::{Connection, FileError, SenderConfig, proto_err, unexpected};
use crate::engine::digest::{FileHasher, read_prefix, read_sha256};
use crate::engine::reader::Input;
use crate::engine::worker::{Cancel, Lost, Worker};
use crate::error::XferError;
use crate::proto::{Digest, Have, HaveKind, SenderEvent, Waiting, escaped};
use crate::sys::SysError;
use std::time::{Duration, Instant};
use tracing::{debug, info, warn};

/// How often the loop looks at the link while a read runs (the machine's
/// KEEPALIVE may be due sooner: then at that time).
const READ_CHECK: Duration = Duration::from_millis(50);

#[cfg(test)]
thread_local! {
    /// Tests: a pause before each chunk of a HAVE's read started on this
    /// thread, so that the loop's KEEPALIVEs come due meanwhile.
    pub(super) static READ_PAUSE: std::cell::Cell<Duration> =
        const { std::cell::Cell::new(Duration::ZERO) };
}

/// Before each chunk of a HAVE's read: stops it once the session stopped
/// it or SIGINT or SIGTERM came (see `Cancel`).
fn tick(cancel: &Cancel, pause: Duration) -> std::io::Result<()> {
    if !pause.is_zero() {
        std::thread::sleep(pause);
    }
    cancel.check()
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
        // Streams are never offered with RESUME or CHECKSUM.
        let Input::File { file, size } = input else {
            return self.reply(&mut w.stage, Answer::From(0, None));
        };
        let name = &w.name;
        #[cfg(test)]
        let pause = READ_PAUSE.get();
        #[cfg(not(test))]
        let pause = Duration::ZERO;
        let read = match have.kind {
            HaveKind::Nothing => {
                if !have.note.is_empty() {
                    warn!(file = %escaped(name), "starting from zero: {}", escaped(&have.note));
                }
                return self.reply(&mut w.stage, Answer::From(0, None));
            }
            HaveKind::Prefix if have.chunk_len > cfg.chunk_size => {
                warn!(
                    file = %escaped(name),
                    "starting from zero: the receiver kept {} bytes in chunks of {}, larger than \
                     this sender's --chunk-size {}",
                    have.bytes, have.chunk_len, cfg.chunk_size
                );
                return self.reply(&mut w.stage, Answer::From(0, None));
            }
            HaveKind::Prefix => {
                let file = for_worker(name, file)?;
                let (bytes, chunk_len, alg) = (have.bytes, have.chunk_len, cfg.verify);
                let worker = start(move |cancel| {
                    read_prefix(&file, bytes, chunk_len, alg, |_, _, _| tick(cancel, pause))
                })?;
                HaveRead::Prefix {
                    bytes,
                    want: have.digest,
                    worker,
                }
            }
            // Read before any data, whatever the receiver then decides.
            HaveKind::Complete | HaveKind::Digest => {
                let file = for_worker(name, file)?;
                let (size, chunk_len) = (*size, cfg.chunk_size);
                HaveRead::Compare(start(move |cancel| {
                    read_sha256(&file, size, chunk_len, || tick(cancel, pause))
                })?)
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
        if let Some(read) = w.have_read.as_mut() {
            let left = self.session.poll_timeout().map_or(READ_CHECK, |due| {
                due.saturating_duration_since(now).min(READ_CHECK)
            });
            read.wait(left);
        }
        let waited = self
            .link
            .wait_until(Instant::now(), self.session.waited_for());
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

/// The file, for the worker's thread (its own descriptor).
fn for_worker(name: &str, file: &std::fs::File) -> Result<std::fs::File, FileError> {
    file.try_clone().map_err(|e| {
        FileError::Fatal(XferError::io(
            format!("cannot read {name} to compare it with what the receiver holds"),
            e,
        ))
    })
}

/// Starts a HAVE's read on a worker thread of its own.
fn start<T: Send + 'static>(
    job: impl FnOnce(&Cancel) -> T + Send + 'static,
) -> Result<Worker<T>, FileError> {
    Worker::start("have-read", job).map_err(|e| {
        FileError::Fatal(XferError::io(
            "cannot start the thread that reads for the receiver's HAVE",
            e,
        ))
    })
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
        Err(Lost) => Err(FileError::Fatal(XferError::Internal(
            "the read for the receiver's HAVE ended without its result".into(),
        ))),
    }
}
