//! A batch of small files received as one: one write per batch, each
//! member committed with the batch.

use super::space::Promise;
use super::temp_file::TempFile;
use crate::engine::digest::FileHasher;
use crate::error::XferError;
use crate::proto::{Hello, Mtime};
use tracing::warn;

/// fsyncs each directory of `members` once.
pub(super) fn sync_dirs(members: &[BatchMember]) -> Result<(), XferError> {
    let mut synced = std::collections::HashSet::new();
    for m in members {
        let dir = m.name.rsplit_once('/').map_or("", |(d, _)| d);
        let Some(temp) = &m.temp else { continue };
        if synced.insert(dir) {
            temp.parent.sync().map_err(|e| {
                XferError::io(format!("cannot fsync the directory of {}", m.name), e)
            })?;
        }
    }
    Ok(())
}

/// One file of a batch: where its bytes are in the batch's data, and where
/// they go.
pub(in crate::engine::receiver) struct BatchMember {
    pub(in crate::engine::receiver) name: String,
    /// Its first byte's offset in the batch's data.
    start: u64,
    pub(in crate::engine::receiver) size: u64,
    mode: u32,
    mtime: Option<Mtime>,
    /// None: it is not stored (--discard).
    temp: Option<Box<TempFile>>,
    /// Its own digest, for its report (the batch is verified as a whole).
    hasher: Option<FileHasher>,
}

/// The files of a BATCH: their bytes arrive back to back, as one file of
/// their total size, and are committed together.
pub(in crate::engine::receiver) struct BatchSink {
    pub(in crate::engine::receiver) members: Vec<BatchMember>,
    /// The batch's bytes so far (the next member starts at or after it).
    len: u64,
    /// The free space promised to the whole batch (none: not stored).
    promise: Option<Promise>,
}

impl BatchSink {
    pub(super) fn new(promise: Option<Promise>) -> Self {
        Self {
            members: Vec::new(),
            len: 0,
            promise,
        }
    }

    /// Adds the next file: its bytes follow the previous file's.
    pub(super) fn push(
        &mut self,
        hello: &Hello,
        (umask, keep_modes): (u32, bool),
        temp: Option<Box<TempFile>>,
    ) {
        self.members.push(BatchMember {
            name: hello.name.clone(),
            start: self.len,
            size: hello.size,
            mode: hello.received_mode(umask, keep_modes),
            mtime: hello.mtime,
            temp,
            hasher: Some(FileHasher::new(hello.digest)),
        });
        self.len = self.len.saturating_add(hello.size);
    }

    /// Writes the batch's bytes at `offset` (of the batch's data) to the
    /// files they belong to.
    pub(in crate::engine::receiver) fn write_chunk(
        &mut self,
        data: &[u8],
        offset: u64,
    ) -> std::io::Result<()> {
        let end = offset + data.len() as u64;
        // Members are in order: skip those that end before the chunk.
        let first = self.members.partition_point(|m| m.start + m.size <= offset);
        for m in self.members[first..].iter_mut() {
            if m.start >= end {
                break;
            }
            let from = m.start.max(offset);
            let to = (m.start + m.size).min(end);
            let part = &data[(from - offset) as usize..(to - offset) as usize];
            let crc = crc32fast::hash(part);
            if let Some(temp) = m.temp.as_mut() {
                temp.write_chunk(part, from - m.start, crc)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", m.name)))?;
            }
            if let Some(h) = m.hasher.as_mut() {
                h.update(part, crc);
            }
        }
        if let Some(p) = self.promise.as_mut() {
            p.wrote(data.len() as u64);
        }
        Ok(())
    }

    /// Its files are verified and dropped (--discard), not stored.
    pub(in crate::engine::receiver) fn discards(&self) -> bool {
        self.promise.is_none()
    }

    /// Every file's digest (in order), for the reports; once.
    pub(in crate::engine::receiver) fn digests(&mut self) -> Vec<crate::proto::Digest> {
        self.members
            .iter_mut()
            .filter_map(|m| m.hasher.take().map(FileHasher::finish))
            .collect()
    }

    /// fsync every file, check that every temporary name is still its file
    /// and (without `overwrite`) that no final name appeared meanwhile,
    /// then rename each into place and fsync each directory once. If a
    /// rename still fails (a race, an I/O error), the files renamed before
    /// it are taken back without `overwrite`: nothing of a failed batch
    /// stays. With `overwrite` they replaced what was there; they stay,
    /// complete and verified, and their directories are fsynced.
    pub(in crate::engine::receiver) fn commit(&mut self, overwrite: bool) -> Result<(), XferError> {
        for m in &mut self.members {
            if let Some(temp) = m.temp.as_mut() {
                temp.make_durable(&m.name, m.mode, m.mtime)?;
            }
        }
        for m in &self.members {
            if let Some(temp) = &m.temp {
                temp.check_before_rename(&m.name, overwrite)?;
            }
        }
        let mut renamed = 0;
        let result = self.members.iter_mut().try_for_each(|m| {
            if let Some(temp) = m.temp.as_mut() {
                temp.move_into_place(&m.name, overwrite)?;
            }
            renamed += 1;
            Ok::<(), XferError>(())
        });
        if let Err(e) = result {
            let mut stayed = 0;
            for m in &mut self.members[..renamed] {
                let Some(temp) = m.temp.as_mut() else {
                    continue;
                };
                if overwrite || !temp.take_back(&m.name) {
                    stayed += 1;
                }
            }
            if stayed > 0 {
                if let Err(d) = sync_dirs(&self.members[..renamed]) {
                    warn!("{d}");
                }
                warn!("{stayed} files of the failed batch stay in place, complete and verified");
            }
            return Err(e);
        }
        sync_dirs(&self.members)
    }
}
