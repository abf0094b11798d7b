//! The answer to a HAVE: the file checked against what the receiver holds
//! (a kept prefix read back, or the whole file's SHA-256 for a COMPARE),
//! read while the receiver is kept informed (the machine's KEEPALIVE) and
//! listened to.

use super::pump::{Answer, Pipeline};
use super::{Connection, FileError, SenderConfig, proto_err};
use crate::engine::digest::{PrefixRead, read_prefix};
use crate::engine::reader::Input;
use crate::error::XferError;
use crate::proto::{Digest, DigestAlg, Have, HaveKind, Waiting, escaped};
use crate::sys::SysError;
use std::time::Instant;
use tracing::{info, warn};

impl Connection {
    /// Checks the file against what the receiver holds of it (HAVE) and
    /// answers: for a complete copy, or a request for it (`--checksum`),
    /// the file's SHA-256 (the receiver compares), else where its data starts: the kept prefix when every
    /// chunk of it has the CRC the receiver recorded (with the whole-file
    /// digest over it), else 0, saying why.
    pub(super) fn answer(
        &mut self,
        cfg: &SenderConfig,
        name: &str,
        have: &Have,
        input: &Input,
        pipe: &mut Pipeline<'_>,
    ) -> Result<Answer, FileError> {
        // Streams are never offered with RESUME or CHECKSUM.
        let Input::File { file, size } = input else {
            return Ok(Answer::From(0, None));
        };
        match have.kind {
            HaveKind::Nothing if have.note.is_empty() => Ok(Answer::From(0, None)),
            HaveKind::Nothing => {
                warn!(file = %escaped(name), "starting from zero: {}", escaped(&have.note));
                Ok(Answer::From(0, None))
            }
            HaveKind::Prefix if have.chunk_len > cfg.chunk_size => {
                warn!(
                    file = %escaped(name),
                    "starting from zero: the receiver kept {} bytes in chunks of {}, larger than \
                     this sender's --chunk-size {}",
                    have.bytes, have.chunk_len, cfg.chunk_size
                );
                Ok(Answer::From(0, None))
            }
            HaveKind::Prefix => {
                let read =
                    self.read_for_have(name, file, (have.bytes, have.chunk_len, cfg.verify), pipe)?;
                if Digest::Sha256(read.crc_digest) == have.digest {
                    info!(file = %escaped(name), bytes = have.bytes, "continuing after the part the receiver kept");
                    Ok(Answer::From(have.bytes, Some((have.bytes, read.hasher))))
                } else {
                    warn!(
                        file = %escaped(name),
                        "starting from zero: the source changed within the {} bytes the receiver kept",
                        have.bytes
                    );
                    Ok(Answer::From(0, None))
                }
            }
            // Read before any data, whatever the receiver then decides.
            HaveKind::Complete | HaveKind::Digest => {
                let read = self.read_for_have(
                    name,
                    file,
                    (*size, cfg.chunk_size, DigestAlg::Sha256),
                    pipe,
                )?;
                let sha256 = read.hasher.finish_sha256().ok_or_else(|| {
                    FileError::Fatal(XferError::Internal("a SHA-256 read gave a CRC32".into()))
                })?;
                Ok(Answer::Compare(sha256))
            }
        }
    }

    /// Reads the file's first `upto` bytes in chunks of `chunk_len` with
    /// whole-file digest `alg` (see `read_prefix`), keeping the receiver
    /// informed meanwhile (KEEPALIVE) and listening to it.
    fn read_for_have(
        &mut self,
        name: &str,
        file: &std::fs::File,
        (upto, chunk_len, alg): (u64, u32, DigestAlg),
        pipe: &mut Pipeline<'_>,
    ) -> Result<PrefixRead, FileError> {
        self.session.waiting(Waiting::Input, Instant::now());
        let mut failed = None;
        let read = read_prefix(file, upto, chunk_len, alg, |_, _, _| {
            if crate::sys::os::shutdown_requested() {
                failed = Some(FileError::Fatal(XferError::Sys(SysError::Interrupted)));
                return Err(std::io::Error::other("interrupted by signal"));
            }
            // The machine's keepalive, when due.
            let now = Instant::now();
            if self.session.poll_timeout().is_none_or(|due| now < due) {
                return Ok(());
            }
            let sent = self
                .session
                .handle_timeout(now)
                .map_err(proto_err)
                .and_then(|()| Ok(self.transmit()?))
                .and_then(|_| self.poll_link(pipe));
            match sent {
                Ok(()) => Ok(()),
                Err(e) => {
                    failed = Some(e);
                    Err(std::io::Error::other("the session failed"))
                }
            }
        });
        if let Some(e) = failed {
            return Err(e);
        }
        read.map_err(|e| {
            FileError::Fatal(XferError::io(
                format!("cannot read {name} to compare it with what the receiver holds"),
                e,
            ))
        })
    }
}
