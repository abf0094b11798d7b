//! What the receiver holds of a file offered with RESUME: a complete copy,
//! or a kept partial file whose prefix is read back and checked against
//! its record.

use super::key::SidecarKey;
use super::sidecar::*;
use crate::proto::Hello;
use crate::sys::dirfd::OwnFileError;

/// Records past this many bytes of a sidecar are not read (a 2 TB file in
/// 1 MiB chunks needs 72 MiB of records).
const MAX_SIDECAR: u64 = 256 << 20;

/// What the receiver holds of a file offered with RESUME: the HAVE to
/// answer, for a verified prefix what continuing it needs, for a complete
/// copy the file itself (in the finding: compared when the sender's
/// COMPARE comes).
pub(crate) struct Holding {
    pub found: crate::proto::Found<std::fs::File>,
    pub kept: Option<KeptPrefix>,
}

/// A kept partial file's verified prefix, read back: its records (with
/// the descriptors that were checked), and the whole-file digest over it,
/// to continue with the bytes that follow.
pub(crate) struct KeptPrefix {
    pub sidecar: OpenSidecar,
    pub hasher: crate::engine::digest::FileHasher,
}

/// A sidecar as `find` read it, with the descriptors of it and of its
/// partial file: a transfer continues the very files that were checked,
/// never whatever the names lead to by then.
pub(crate) struct OpenSidecar {
    pub record: Sidecar,
    /// The partial file (open for reading and writing).
    pub partial: std::fs::File,
    /// The sidecar (open for reading and writing).
    pub meta: std::fs::File,
    /// The key its records checked with, to tag the next ones.
    pub key: SidecarKey,
}

impl std::ops::Deref for OpenSidecar {
    type Target = Sidecar;
    fn deref(&self) -> &Sidecar {
        &self.record
    }
}

impl Holding {
    /// A complete copy, to compare.
    pub fn copy(copy: std::fs::File) -> Self {
        Self {
            found: crate::proto::Found::Complete(copy),
            kept: None,
        }
    }

    pub fn nothing(note: impl Into<String>) -> Self {
        Self {
            found: crate::proto::Found::Nothing(note.into()),
            kept: None,
        }
    }
}

/// What the receiver holds of `hello`'s file, offered with RESUME, under
/// `parent` with final name `leaf`: the complete file (`copy_of`), else
/// what `kept_prefix` finds.
#[cfg(test)]
pub(crate) fn find(
    parent: &crate::sys::dirfd::DirFd,
    leaf: &str,
    hello: &Hello,
    chunk_len: u32,
    key: Option<&SidecarKey>,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> Holding {
    match copy_of(parent, leaf, hello) {
        Some(copy) => Holding::copy(copy),
        None => kept_prefix(parent, leaf, hello, chunk_len, key, tick),
    }
}

/// The file under the final name, if it is a copy to compare: a regular
/// file with the offer's size and modification time (a --resume run gives
/// a file the source's). Any other says nothing, so that a sender learns
/// nothing of the receiver's files but equality. A time stored with less
/// precision (a file system keeping microseconds, say) matches the
/// offer's cut to that precision.
pub(crate) fn copy_of(
    parent: &crate::sys::dirfd::DirFd,
    leaf: &str,
    hello: &Hello,
) -> Option<std::fs::File> {
    use crate::sys::dirfd::EntryKind;
    use std::os::unix::fs::MetadataExt;
    let offered = hello.mtime?;
    if !matches!(parent.kind(leaf), Ok(Some(EntryKind::File))) {
        return None;
    }
    let f = parent.open_file(leaf, false).ok()?;
    let m = f.metadata().ok()?;
    let same_time = offered.matches_stored(m.mtime(), m.mtime_nsec());
    (m.len() == hello.size && same_time).then_some(f)
}

/// The prefix of a partial file kept from an earlier attempt at `hello`'s
/// file under `parent` with final name `leaf`, read back and checked
/// against its record, or nothing, with the reason. The record must be
/// tagged with `key`, the directory's (None: it has none, or none that
/// can be used, so nothing kept can be trusted). `tick` is called
/// before each read of a MiB at most (`digest::MAX_READ`: the engine
/// counts the progress of a large file's read) and may stop the read
/// with an error.
pub(crate) fn kept_prefix(
    parent: &crate::sys::dirfd::DirFd,
    leaf: &str,
    hello: &Hello,
    chunk_len: u32,
    key: Option<&SidecarKey>,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> Holding {
    use crate::engine::digest::read_prefix;
    use crate::proto::Found;
    let (partial, meta) = partial_names(leaf);
    // Both are opened for writing too: a transfer that continues them
    // writes through these descriptors.
    // Only the receiver's own files (one link, its uid, never through a
    // symbolic link): continuing one truncates and writes it.
    let side = match parent.open_own_file(&meta) {
        Ok(f) => f,
        // Nothing kept: nothing to explain (an empty note).
        Err(OwnFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
            return Holding::nothing("");
        }
        Err(e @ OwnFileError::Foreign { .. }) => return not_own(hello, &e),
        Err(e) => {
            return Holding::nothing(format!("cannot open the partial file's record: {e}"));
        }
    };
    match side.metadata() {
        // Created, but the attempt ended before its first chunks were
        // made durable.
        Ok(m) if m.len() == 0 => {
            return Holding::nothing("nothing of the partial file was verified yet");
        }
        Ok(_) => {}
        Err(e) => {
            return Holding::nothing(format!("cannot inspect the partial file's record: {e}"));
        }
    }
    let Some(key) = key else {
        return Holding::nothing("the receiver has no usable key for its partial-file records");
    };
    // Streamed: the header first, the records only once it is acceptable.
    let mut reader = std::io::BufReader::new(&side);
    let identity = match read_header(&mut reader, key) {
        Ok(id) => id,
        Err(e) => return Holding::nothing(e.to_string()),
    };
    if identity.name != hello.name {
        return Holding::nothing("the partial file belongs to another name");
    }
    let Some(now) = Identity::of_offer(hello, identity.chunk_len) else {
        return Holding::nothing("the offer carries no modification time");
    };
    if let Some(why) = identity.mismatch(&now) {
        return Holding::nothing(why);
    }
    // Chunks larger than ours do not fit our ring: refused before any of
    // the prefix is read.
    if identity.chunk_len > chunk_len {
        return Holding::nothing(format!(
            "the kept part arrived in chunks of {} bytes, larger than this receiver's {chunk_len}",
            identity.chunk_len
        ));
    }
    let file = match parent.open_own_file(&partial) {
        Ok(f) => f,
        Err(e @ OwnFileError::Foreign { .. }) => return not_own(hello, &e),
        Err(e) => return Holding::nothing(format!("cannot open the partial file: {e}")),
    };
    let len = match file.metadata() {
        Ok(m) => m.len(),
        Err(e) => return Holding::nothing(format!("cannot inspect the partial file: {e}")),
    };
    // No more records than the file has chunks, nor than the partial file
    // can back (one more tells that it was cut short), nor than a sidecar
    // of MAX_SIDECAR bytes holds.
    let max = identity
        .chunks()
        .min(len.div_ceil(u64::from(identity.chunk_len)) + 1)
        .min(MAX_SIDECAR / RECORD_LEN as u64);
    let crcs = match read_records(&mut reader, max, &identity.records_key(key)) {
        Ok(crcs) => crcs,
        Err(e) => return Holding::nothing(format!("cannot read the partial file's record: {e}")),
    };
    drop(reader);
    let sidecar = Sidecar { identity, crcs };
    let prefix = sidecar.prefix_bytes();
    if prefix == 0 {
        return Holding::nothing("nothing of the partial file was verified yet");
    }
    if len < prefix {
        return Holding::nothing("the partial file is shorter than its record says");
    }
    // The bytes on disk must still be the ones recorded: a partial file
    // changed since (by hand, by a disk) is never continued.
    let crcs = &sidecar.crcs;
    let checked = read_prefix(
        &file,
        prefix,
        sidecar.identity.chunk_len,
        hello.digest,
        tick,
        |index, _, crc| {
            if crcs.get(index as usize) != Some(&crc) {
                return Err(std::io::Error::other(format!(
                    "chunk {index} of the partial file no longer matches its record"
                )));
            }
            Ok(())
        },
    );
    match checked {
        Ok(read) => Holding {
            found: Found::Prefix {
                bytes: prefix,
                chunk_len: sidecar.identity.chunk_len,
                sha256: sidecar.prefix_digest(),
            },
            kept: Some(KeptPrefix {
                sidecar: OpenSidecar {
                    record: sidecar,
                    partial: file,
                    meta: side,
                    key: key.clone(),
                },
                hasher: read.hasher,
            }),
        },
        Err(e) => Holding::nothing(format!("the partial file cannot be continued: {e}")),
    }
}

/// A kept partial file or record that is not the receiver's own: never
/// continued (a fresh transfer leaves it alone too, see
/// `Resumable::start`). The details go to the log, not to the sender.
fn not_own(hello: &Hello, e: &OwnFileError) -> Holding {
    tracing::warn!(file = %hello.name, "the kept partial file is not resumed: {e}");
    Holding::nothing("the kept partial file is not the receiver's own: not resumed")
}

/// SHA-256 of the complete copy `find` held (`Holding::copy`), read
/// through the descriptor it opened, to compare with the sender's COMPARE:
/// the receiver tells the sender only whether the two match. `tick` as
/// for `find`. An error if the copy changed size meanwhile.
pub(crate) fn copy_digest(
    copy: &std::fs::File,
    size: u64,
    chunk_len: u32,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<[u8; 32]> {
    if copy.metadata()?.len() != size {
        return Err(std::io::Error::other("it changed size"));
    }
    crate::engine::digest::read_sha256(copy, size, chunk_len, tick)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Digest, DigestAlg, Found, HaveKind, Mtime};
    use crate::sys::dirfd::DirFd;
    use sha2::{Digest as _, Sha256};

    fn offer(size: u64) -> Hello {
        Hello {
            version: crate::proto::PROTOCOL_VERSION,
            caps: crate::proto::hello_flags::RESUME | crate::proto::hello_flags::MTIME,
            name: "d/f.bin".into(),
            size,
            mode: 0o644,
            digest: DigestAlg::Sha256,
            mtime: Some(Mtime { secs: 9, nanos: 1 }),
            piece: None,
        }
    }

    /// A partial file of `have` bytes and a sidecar of its chunk CRCs.
    fn keep_partial(dir: &Path, data: &[u8], have: usize, chunk: u32, hello: &Hello) {
        let (partial, meta) = partial_names("f.bin");
        std::fs::write(dir.join(&partial), &data[..have]).unwrap();
        let id = Identity::of_offer(hello, chunk).unwrap();
        let key = key_of(dir);
        let mut side = id.header(&key);
        let records = id.records_key(&key);
        for (i, c) in data[..have].chunks_exact(chunk as usize).enumerate() {
            side.extend_from_slice(&records.record(i as u64, crc32fast::hash(c)));
        }
        std::fs::write(dir.join(meta), side).unwrap();
    }

    use std::path::Path;

    /// The key of the directory `dir` (created the first time).
    fn key_of(dir: &Path) -> SidecarKey {
        SidecarKey::get_or_create(&DirFd::open(dir).unwrap()).unwrap()
    }

    /// `find` with the key of `parent`'s directory.
    fn find(
        parent: &DirFd,
        leaf: &str,
        hello: &Hello,
        chunk_len: u32,
        tick: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> Holding {
        let key = SidecarKey::load(parent).unwrap();
        super::find(parent, leaf, hello, chunk_len, key.as_ref(), tick)
    }

    fn holds(parent: &DirFd, hello: &Hello) -> Found<std::fs::File> {
        find(parent, "f.bin", hello, 100, &mut || Ok(())).found
    }

    #[test]
    fn what_the_receiver_holds_and_why_not_more() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let parent = DirFd::open(dir).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let hello = offer(1000);
        // Nothing yet.
        let h = holds(&parent, &hello);
        assert_eq!(h.kind(), HaveKind::Nothing);
        assert!(h.note().is_empty(), "{}", h.note());
        // A partial of 450 bytes: 4 whole chunks verified.
        keep_partial(dir, &data, 450, 100, &hello);
        let h = holds(&parent, &hello);
        assert!(
            matches!(
                h,
                Found::Prefix {
                    bytes: 400,
                    chunk_len: 100,
                    ..
                }
            ),
            "{h:?}"
        );
        let crcs: Vec<u32> = data[..400].chunks(100).map(crc32fast::hash).collect();
        assert!(
            matches!(h, Found::Prefix { sha256, .. } if sha256 == prefix_digest(&crcs)),
            "{h:?}"
        );
        // What continuing it needs: the whole-file digest over the prefix.
        let kept = find(&parent, "f.bin", &hello, 100, &mut || Ok(()))
            .kept
            .expect("a kept prefix");
        assert_eq!(kept.sidecar.prefix_bytes(), 400);
        let mut h = kept.hasher;
        for c in data[400..].chunks(100) {
            h.update(c, crc32fast::hash(c));
        }
        let want: [u8; 32] = Sha256::digest(&data).into();
        assert_eq!(h.finish(), Digest::Sha256(want));
        // The reader of a large file can be stopped (the session ended).
        let stopped = find(&parent, "f.bin", &hello, 100, &mut || {
            Err(std::io::Error::other("session over"))
        });
        assert!(stopped.kept.is_none() && stopped.found.note().contains("session over"));
        // A byte of the partial changed in place: its record no longer
        // matches, nothing is continued.
        let (partial, _) = partial_names("f.bin");
        let mut bytes = std::fs::read(dir.join(&partial)).unwrap();
        bytes[250] ^= 1;
        std::fs::write(dir.join(&partial), &bytes).unwrap();
        let h = holds(&parent, &hello);
        assert!(
            h.kind() == HaveKind::Nothing && h.note().contains("chunk 2"),
            "{}",
            h.note()
        );
        keep_partial(dir, &data, 450, 100, &hello);
        // An empty record (the attempt ended before its first sync).
        let (_, meta) = partial_names("f.bin");
        std::fs::write(dir.join(&meta), b"").unwrap();
        let h = holds(&parent, &hello);
        assert!(h.kind() == HaveKind::Nothing && h.note().contains("verified yet"));
        keep_partial(dir, &data, 450, 100, &hello);
        // The source changed: nothing, and why.
        let changed = Hello {
            mtime: Some(Mtime { secs: 10, nanos: 1 }),
            ..offer(1000)
        };
        let h = holds(&parent, &changed);
        assert!(h.kind() == HaveKind::Nothing && h.note().contains("modification time"));
        // The partial cut short by hand: nothing.
        std::fs::write(dir.join(&partial), &data[..150]).unwrap();
        let h = holds(&parent, &hello);
        assert!(
            h.kind() == HaveKind::Nothing && h.note().contains("shorter"),
            "{}",
            h.note()
        );
        // A damaged record: nothing.
        keep_partial(dir, &data, 450, 100, &hello);
        let mut side = std::fs::read(dir.join(&meta)).unwrap();
        side[3] ^= 1;
        std::fs::write(dir.join(&meta), side).unwrap();
        let h = holds(&parent, &hello);
        assert!(
            h.kind() == HaveKind::Nothing && h.note().contains("damaged"),
            "{}",
            h.note()
        );
        // A file of that size under the final name, with another
        // modification time: no copy to compare, and nothing said about it
        // (the kept partial is what counts).
        std::fs::write(dir.join("f.bin"), &data).unwrap();
        let h = holds(&parent, &hello);
        assert!(
            h.kind() == HaveKind::Nothing && !h.note().contains("f.bin"),
            "{h:?}"
        );
        keep_partial(dir, &data, 450, 100, &hello);
        let h = holds(&parent, &hello);
        assert_eq!(
            (h.kind(), h.prefix_bytes()),
            (HaveKind::Prefix, 400),
            "the partial, still"
        );
        // With the offer's size and time: held, never its digest in the HAVE.
        let offered = std::time::UNIX_EPOCH + std::time::Duration::new(9, 1);
        let set_time = |t| {
            std::fs::File::options()
                .write(true)
                .open(dir.join("f.bin"))
                .unwrap()
                .set_modified(t)
                .unwrap()
        };
        set_time(offered);
        let held = find(&parent, "f.bin", &hello, 100, &mut || Ok(()));
        let crate::proto::Found::Complete(copy) = held.found else {
            panic!("the copy held: {:?}", held.found);
        };
        let want: [u8; 32] = Sha256::digest(&data).into();
        let mut ticks = 0;
        let got = copy_digest(&copy, 1000, 100, &mut || {
            ticks += 1;
            Ok(())
        });
        assert_eq!((got.unwrap(), ticks), (want, 10));
        // Changed size since: not compared.
        std::fs::write(dir.join("f.bin"), &data[..999]).unwrap();
        assert!(copy_digest(&copy, 1000, 100, &mut || Ok(())).is_err());
        std::fs::write(dir.join("f.bin"), &data).unwrap();
        set_time(offered);
        // A time stored with less precision (microseconds) matches the
        // offer's cut to it; other digits there do not.
        set_time(std::time::UNIX_EPOCH + std::time::Duration::new(9, 123_000));
        let at = |nanos| Hello {
            mtime: Some(Mtime { secs: 9, nanos }),
            ..offer(1000)
        };
        assert!(copy_of(&parent, "f.bin", &at(123_456)).is_some());
        assert!(copy_of(&parent, "f.bin", &at(123_000)).is_some());
        assert!(copy_of(&parent, "f.bin", &at(124_000)).is_none());
        assert!(copy_of(&parent, "f.bin", &at(1_123_000)).is_none());
        set_time(offered);
        // Another size or time: not a copy (the note is the partial's).
        for other in [
            offer(999),
            Hello {
                mtime: Some(Mtime { secs: 9, nanos: 2 }),
                ..offer(1000)
            },
        ] {
            let h = holds(&parent, &other);
            assert!(
                h.kind() == HaveKind::Nothing && !h.note().contains("f.bin"),
                "{h:?}"
            );
        }
    }

    #[test]
    fn chunks_larger_than_the_receivers_are_refused_before_the_prefix_is_read() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = DirFd::open(tmp.path()).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 3) as u8).collect();
        let hello = offer(1000);
        keep_partial(tmp.path(), &data, 600, 200, &hello);
        // Reading any of the prefix would call `tick`, which fails.
        let refused = find(&parent, "f.bin", &hello, 100, &mut || {
            Err(std::io::Error::other("the prefix was read"))
        });
        assert!(refused.kept.is_none());
        assert_eq!(
            refused.found.note(),
            "the kept part arrived in chunks of 200 bytes, larger than this receiver's 100"
        );
        // Chunks as large as the receiver's: the prefix.
        let h = find(&parent, "f.bin", &hello, 200, &mut || Ok(())).found;
        assert!(
            matches!(
                h,
                Found::Prefix {
                    bytes: 600,
                    chunk_len: 200,
                    ..
                }
            ),
            "{h:?}"
        );
    }

    #[test]
    fn records_are_read_no_further_than_the_partial_file_backs() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = DirFd::open(tmp.path()).unwrap();
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 5) as u8).collect();
        let hello = offer(1000);
        keep_partial(tmp.path(), &data, 900, 100, &hello);
        let (partial, meta) = partial_names("f.bin");
        // A long tail of garbage after the records is never read whole.
        let mut side = std::fs::OpenOptions::new()
            .append(true)
            .open(tmp.path().join(&meta))
            .unwrap();
        std::io::Write::write_all(&mut side, &vec![0u8; 1 << 20]).unwrap();
        let h = holds(&parent, &hello);
        assert_eq!((h.kind(), h.prefix_bytes()), (HaveKind::Prefix, 900));
        // The partial cut to 300 bytes: 4 records read, one more than it
        // backs, so it is known to be short.
        std::fs::write(tmp.path().join(&partial), &data[..300]).unwrap();
        let h = holds(&parent, &hello);
        assert!(h.note().contains("shorter"), "{}", h.note());
    }
}
