//! A file being received with RESUME: its partial file and sidecar, and
//! the claim that keeps every other session away from them.

use super::find::OpenSidecar;
use super::key::SidecarKey;
use super::sidecar::*;
use crate::sys::dirfd::OwnFileError;

/// Chunks written between two syncs of a resumable file (and so the most
/// that a crash of the receiver can cost a resumed transfer, besides the
/// chunks in flight).
pub(crate) const SYNC_EVERY: usize = 64;

/// Partial files a session of this receiver uses, by directory (device,
/// inode) and final name: two sessions never write, continue or replace
/// the same partial file.
pub(super) static CLAIMS: std::sync::Mutex<std::collections::BTreeSet<(u64, u64, String)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Temporary files the sessions of this receiver write now, by directory
/// (device, inode) and name: the sweep spares them whatever their age
/// (and whatever became of an earlier process with the same pid).
pub(super) static TEMPS: std::sync::Mutex<std::collections::BTreeSet<(u64, u64, String)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A temporary file in use (see `TEMPS`), until dropped.
#[derive(Debug)]
pub(crate) struct TempInUse {
    key: (u64, u64, String),
}

impl TempInUse {
    /// Marks `name` in `parent` as in use.
    pub fn new(parent: &crate::sys::dirfd::DirFd, name: &str) -> std::io::Result<Self> {
        Ok(Self::known(parent.identity()?, name))
    }

    /// Marks `name` in the directory of identity `(dev, ino)` as in use.
    pub fn known((dev, ino): (u64, u64), name: &str) -> Self {
        let key = (dev, ino, name.to_string());
        TEMPS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone());
        Self { key }
    }
}

impl Drop for TempInUse {
    fn drop(&mut self) {
        TEMPS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// A session's exclusive use of the partial file of one final name, until
/// dropped.
#[derive(Debug)]
pub(crate) struct Claim {
    key: (u64, u64, String),
}

impl Claim {
    /// Claims the partial file of `leaf` in `parent`; None while another
    /// session holds it.
    pub fn try_take(
        parent: &crate::sys::dirfd::DirFd,
        leaf: &str,
    ) -> std::io::Result<Option<Claim>> {
        let (dev, ino) = parent.identity()?;
        let key = (dev, ino, leaf.to_string());
        let taken = CLAIMS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key.clone());
        // Built only when taken: a Claim's drop gives the name back.
        Ok(if taken { Some(Claim { key }) } else { None })
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        CLAIMS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.key);
    }
}

/// A file being received with RESUME: its partial file (at the hidden
/// name) and its sidecar, which gets a record for each chunk only after
/// the partial file was made durable up to it. The store writes the
/// chunks through its own descriptor of the partial file.
pub(crate) struct Resumable {
    parent: crate::sys::dirfd::DirFd,
    partial: String,
    meta: String,
    /// The partial file, to make it durable before records promise it.
    file: std::fs::File,
    sidecar: std::fs::File,
    /// The directory's key, that tags the records.
    key: SidecarKey,
    /// The source and chunking; a fresh partial learns its chunk length
    /// from the first chunk (the header is written at the first sync).
    identity: Identity,
    header_written: bool,
    /// Chunks that have their record, and their bytes.
    recorded: u64,
    recorded_bytes: u64,
    /// CRCs of chunks written since the last sync, in order, and their
    /// bytes.
    unsynced: Vec<u32>,
    unsynced_bytes: u64,
    /// Set by the first failed write or sync: after an error the disk may
    /// have lost bytes that a later, successful fsync would not report,
    /// so no record is written any more.
    failed: bool,
    /// Held until the partial file is committed or left for later (the
    /// last records written).
    _claim: Claim,
}

impl Resumable {
    /// Starts over: a new, empty partial file and sidecar for `identity`
    /// (whose chunk length may be 0: the first chunk's), old ones removed.
    /// Returns the partial file for the chunks' writes. Old ones that are
    /// not the receiver's own (see `DirFd::open_own_file`) are left alone
    /// and refused (`OwnFileError::Foreign`): the caller receives the file
    /// under a temporary name instead.
    pub fn start(
        parent: &crate::sys::dirfd::DirFd,
        leaf: &str,
        identity: Identity,
        key: SidecarKey,
        claim: Claim,
    ) -> Result<(Self, std::fs::File), OwnFileError> {
        let (partial, meta) = partial_names(leaf);
        for name in [&partial, &meta] {
            match parent.open_own_file(name) {
                Ok(_) => parent.unlink(name)?,
                Err(OwnFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        }
        let file = parent.create_new(&partial, 0o600)?;
        let sidecar = match parent.create_new(&meta, 0o600) {
            Ok(f) => f,
            Err(e) => {
                let _ = parent.unlink(&partial);
                return Err(e.into());
            }
        };
        let writes = file.try_clone()?;
        Ok((
            Self {
                parent: parent.try_clone()?,
                partial,
                meta,
                file,
                sidecar,
                key,
                identity,
                header_written: false,
                recorded: 0,
                recorded_bytes: 0,
                unsynced: Vec::new(),
                unsynced_bytes: 0,
                failed: false,
                _claim: claim,
            },
            writes,
        ))
    }

    /// Continues the kept partial file of `sidecar` (through the
    /// descriptors `find` checked) after its verified prefix
    /// (`Sidecar::prefix_chunks`): bytes and records past it are dropped.
    /// Returns the partial file for the chunks' writes.
    pub fn resume(
        parent: &crate::sys::dirfd::DirFd,
        leaf: &str,
        sidecar: &OpenSidecar,
        claim: Claim,
    ) -> std::io::Result<(Self, std::fs::File)> {
        let (partial, meta) = partial_names(leaf);
        let file = sidecar.partial.try_clone()?;
        let mut side = sidecar.meta.try_clone()?;
        let prefix = sidecar.prefix_chunks();
        file.set_len(sidecar.prefix_bytes())?;
        let keep = sidecar.identity.header_len() + prefix * RECORD_LEN as u64;
        side.set_len(keep)?;
        side.sync_data()?;
        // Records are appended after the kept ones.
        std::io::Seek::seek(&mut side, std::io::SeekFrom::Start(keep))?;
        let writes = file.try_clone()?;
        Ok((
            Self {
                parent: parent.try_clone()?,
                partial,
                meta,
                file,
                sidecar: side,
                key: sidecar.key.clone(),
                identity: sidecar.identity.clone(),
                header_written: true,
                recorded: prefix,
                recorded_bytes: sidecar.prefix_bytes(),
                unsynced: Vec::new(),
                unsynced_bytes: 0,
                failed: false,
                _claim: claim,
            },
            writes,
        ))
    }

    /// The next chunk (in order), `len` bytes with CRC32 `crc`, was
    /// written and checked: its record follows at the next sync (every
    /// `SYNC_EVERY` chunks). Refused after a failed write or sync.
    pub fn chunk_written(&mut self, crc: u32, len: u32) -> std::io::Result<()> {
        self.usable()?;
        if self.identity.chunk_len == 0 {
            self.identity.chunk_len = len;
        }
        self.unsynced.push(crc);
        self.unsynced_bytes += u64::from(len);
        if self.unsynced.len() >= SYNC_EVERY {
            self.sync()?;
        }
        Ok(())
    }

    /// A write to the partial file failed: nothing written from now on,
    /// nor since the last sync, gets a record.
    pub fn write_failed(&mut self) {
        self.failed = true;
    }

    /// An error once a write or sync failed.
    fn usable(&self) -> std::io::Result<()> {
        if self.failed {
            return Err(std::io::Error::other(
                "an earlier write or sync of the partial file failed: nothing more is recorded",
            ));
        }
        Ok(())
    }

    /// Makes every written chunk durable: the partial file first, then
    /// their records (and, the first time, the header and both names).
    /// After an error nothing more is recorded (see `failed`).
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.usable()?;
        if self.unsynced.is_empty() {
            return Ok(());
        }
        let synced = self.sync_unsynced();
        if synced.is_err() {
            self.failed = true;
        }
        synced
    }

    fn sync_unsynced(&mut self) -> std::io::Result<()> {
        self.file.sync_data()?;
        let first = !self.header_written;
        let mut records = if first {
            self.identity.header(&self.key)
        } else {
            Vec::with_capacity(self.unsynced.len() * RECORD_LEN)
        };
        let records_key = self.identity.records_key(&self.key);
        for (k, crc) in self.unsynced.iter().enumerate() {
            records.extend_from_slice(&records_key.record(self.recorded + k as u64, *crc));
        }
        std::io::Write::write_all(&mut self.sidecar, &records)?;
        self.sidecar.sync_data()?;
        self.header_written = true;
        if first {
            // The two names must survive a crash of the host too.
            self.parent.sync()?;
        }
        self.recorded += self.unsynced.len() as u64;
        self.recorded_bytes += self.unsynced_bytes;
        self.unsynced.clear();
        self.unsynced_bytes = 0;
        Ok(())
    }

    /// The names of the partial file and its sidecar in the parent.
    pub fn names(&self) -> (&str, &str) {
        (&self.partial, &self.meta)
    }

    /// After the partial file was renamed into place: the sidecar goes.
    pub fn forget(self) -> std::io::Result<()> {
        self.parent.unlink(&self.meta)
    }

    /// The transfer failed: its verified chunks are kept for a later
    /// attempt. The last of them get their records (unless a write or
    /// sync failed), then the partial file is cut to what the records
    /// cover: the blocks reserved for the rest of the file (fallocate
    /// KEEP_SIZE) are given back while it waits, maybe for days, and
    /// nothing unrecorded stays. With nothing recorded nothing is kept.
    /// Returns the bytes kept (0: nothing).
    pub fn keep(mut self) -> std::io::Result<u64> {
        let synced = self.sync();
        if self.recorded == 0 {
            self.discard();
            return synced.map(|()| 0);
        }
        // The last chunks could not be recorded (or a write failed
        // earlier): what is recorded is kept all the same, said here.
        if let Err(e) = synced {
            tracing::warn!(path = %self.partial, "the last chunks of a partial file are not kept: {e}");
        }
        let mut first = None;
        if self.failed {
            // A failed append may have left records whose bytes are cut
            // below: they go too.
            let len = self.identity.header_len() + self.recorded * RECORD_LEN as u64;
            if let Err(e) = self.sidecar.set_len(len) {
                first.get_or_insert(e);
            }
        }
        // Never longer than the file (chunks come in order, at most all).
        let kept = self.recorded_bytes.min(self.identity.size);
        if let Err(e) = self.file.set_len(kept) {
            first.get_or_insert(e);
        }
        first.map_or(Ok(kept), Err)
    }

    /// Nothing of it may be kept (its whole-file digest failed, or nothing
    /// was recorded): both go, and their space with them.
    pub fn discard(self) {
        for (name, file) in [(&self.partial, &self.file), (&self.meta, &self.sidecar)] {
            if let Err(e) = remove(&self.parent, name, file) {
                tracing::warn!(path = %name, "cannot remove a partial file: {e}");
            }
        }
    }
}

/// Removes the file `name` of `parent` that is open as `file`: emptied
/// first, so its space is given back whatever holds the inode still (an
/// open descriptor, another name); the name is removed only while it is
/// still that file (one put there meanwhile is left alone).
pub(crate) fn remove(
    parent: &crate::sys::dirfd::DirFd,
    name: &str,
    file: &std::fs::File,
) -> std::io::Result<()> {
    let emptied = file.set_len(0);
    match parent.is_same(name, file) {
        Ok(true) => parent.unlink(name)?,
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    emptied
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{DigestAlg, Mtime};
    use crate::sys::dirfd::DirFd;
    use std::os::unix::fs::FileExt;

    fn id() -> Identity {
        Identity {
            name: "f.bin".into(),
            size: 1000,
            mtime: Mtime { secs: 1, nanos: 0 },
            digest: DigestAlg::Crc32,
            chunk_len: 0,
        }
    }

    #[test]
    fn records_follow_the_data_and_a_resume_drops_what_is_past_the_prefix() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = DirFd::open(tmp.path()).unwrap();
        let key = SidecarKey::for_tests(3);
        let claim = || Claim::try_take(&parent, "f.bin").unwrap().expect("free");
        let (mut r, file) = Resumable::start(&parent, "f.bin", id(), key.clone(), claim()).unwrap();
        // One session at a time.
        assert!(Claim::try_take(&parent, "f.bin").unwrap().is_none());
        assert!(Claim::try_take(&parent, "g.bin").unwrap().is_some());
        let (partial, meta) = (r.names().0.to_string(), r.names().1.to_string());
        let read_side = || std::fs::read(tmp.path().join(&meta)).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        // Nothing durable yet: an empty record.
        assert!(read_side().is_empty());
        for (k, c) in data.chunks(10).take(SYNC_EVERY + 3).enumerate() {
            file.write_all_at(c, (k * 10) as u64).unwrap();
            r.chunk_written(crc32fast::hash(c), 10).unwrap();
        }
        // One sync so far: SYNC_EVERY records; 3 chunks wait for the next.
        let side = Sidecar::decode(&read_side(), &key).unwrap();
        assert_eq!(side.crcs.len(), SYNC_EVERY);
        // The chunk length came from the first chunk.
        assert_eq!(side.identity.chunk_len, 10);
        r.sync().unwrap();
        let side = Sidecar::decode(&read_side(), &key).unwrap();
        assert_eq!(side.crcs.len(), SYNC_EVERY + 3);
        assert_eq!(
            side.identity,
            Identity {
                chunk_len: 10,
                ..id()
            }
        );
        drop(r);
        // Resume after 20 chunks (as if only they were trusted): records
        // and bytes past them are dropped, the next one is number 20.
        let short = Sidecar {
            crcs: side.crcs[..20].to_vec(),
            ..side.clone()
        };
        let short = OpenSidecar {
            record: short,
            partial: parent.open_file(&partial, true).unwrap(),
            meta: parent.open_file(&meta, true).unwrap(),
            key: key.clone(),
        };
        let (mut r, file) = Resumable::resume(&parent, "f.bin", &short, claim()).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 200);
        let c = &data[200..210];
        file.write_all_at(c, 200).unwrap();
        r.chunk_written(crc32fast::hash(c), 10).unwrap();
        r.sync().unwrap();
        let again = Sidecar::decode(&read_side(), &key).unwrap();
        assert_eq!(again.crcs.len(), 21);
        assert_eq!(again.crcs[20], crc32fast::hash(c));
        // Done: the partial is renamed by the commit, the sidecar goes.
        assert!(tmp.path().join(&partial).exists());
        r.forget().unwrap();
        assert!(!tmp.path().join(&meta).exists());
        // Starting over replaces whatever was kept; discarding removes both.
        std::fs::write(tmp.path().join(&meta), b"junk").unwrap();
        let (r, _) = Resumable::start(&parent, "f.bin", id(), key.clone(), claim()).unwrap();
        assert!(read_side().is_empty());
        r.discard();
        assert!(!tmp.path().join(&meta).exists() && !tmp.path().join(&partial).exists());
    }

    #[test]
    fn after_a_failed_sync_nothing_more_is_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = DirFd::open(tmp.path()).unwrap();
        let key = SidecarKey::for_tests(3);
        let claim = Claim::try_take(&parent, "f.bin").unwrap().unwrap();
        let (mut r, file) = Resumable::start(&parent, "f.bin", id(), key.clone(), claim).unwrap();
        let meta = tmp.path().join(r.names().1);
        let records = || {
            Sidecar::decode(&std::fs::read(&meta).unwrap(), &key)
                .unwrap()
                .crcs
        };
        let data = [7u8; 10];
        let write = |r: &mut Resumable, k: u64| {
            file.write_all_at(&data, k * 10).unwrap();
            r.chunk_written(crc32fast::hash(&data), 10)
        };
        write(&mut r, 0).unwrap();
        r.sync().unwrap();
        assert_eq!(records().len(), 1);
        // The sidecar's writes fail (a descriptor that cannot write).
        let good = std::mem::replace(&mut r.sidecar, std::fs::File::open("/dev/null").unwrap());
        write(&mut r, 1).unwrap();
        assert!(r.sync().is_err());
        // Writable again: still nothing more is accepted or recorded.
        r.sidecar = good;
        assert!(write(&mut r, 2).is_err());
        assert!(r.sync().is_err());
        assert_eq!(records().len(), 1);
        // A failed write of the partial file poisons it the same way.
        let claim = Claim::try_take(&parent, "g.bin").unwrap().unwrap();
        let (mut r, _) = Resumable::start(&parent, "g.bin", id(), key.clone(), claim).unwrap();
        r.chunk_written(1, 10).unwrap();
        r.write_failed();
        assert!(r.sync().is_err() && r.chunk_written(2, 10).is_err());
        assert_eq!(std::fs::read(tmp.path().join(r.names().1)).unwrap(), b"");
    }
}
