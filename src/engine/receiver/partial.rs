//! What the receiver keeps of a file offered with `--resume` when its
//! session fails: the partial file under a hidden name beside the final
//! one, and a sidecar that says which source it came from and which prefix
//! of it was verified (one CRC32 per chunk, in order).
//!
//! The sidecar is a header, then one 8-byte record per verified chunk
//! (its CRC32 and a check value over its number and CRC), appended as the
//! chunks are made durable: the partial file is fsynced before the records
//! that cover it are appended (and the sidecar fsynced), so a record never
//! promises bytes the disk may not have. A torn or damaged record ends the
//! prefix there; a damaged header makes the whole sidecar unusable.

use crate::proto::{DigestAlg, Hello, Mtime};
use sha2::{Digest as _, Sha256};

/// The sidecar's first bytes (and its format version).
const MAGIC: &[u8; 8] = b"RXFRPT1\n";

/// Header after the magic: name length (u16), size (u64), mtime seconds
/// (i64) and nanoseconds (u32), digest algorithm (u8), chunk length (u32),
/// then the name, then a CRC32 of everything before it.
const HEADER_FIXED: usize = MAGIC.len() + 2 + 8 + 8 + 4 + 1 + 4;

/// The identity of a source file and the chunking of its transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Identity {
    /// The validated relative path it arrives under.
    pub name: String,
    pub size: u64,
    pub mtime: Mtime,
    pub digest: DigestAlg,
    pub chunk_len: u32,
}

/// A sidecar as read back: the identity and the verified chunks' CRCs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Sidecar {
    pub identity: Identity,
    pub crcs: Vec<u32>,
}

/// Why a sidecar cannot be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum SidecarError {
    #[error("the partial file's record is damaged ({0})")]
    Damaged(&'static str),
    #[error("cannot read the partial file's record: {0}")]
    Read(#[from] std::io::Error),
}

impl Identity {
    /// The identity a RESUME offer announces with chunks of `chunk_len`;
    /// None without an mtime (such an offer cannot be resumed).
    pub fn of_offer(hello: &Hello, chunk_len: u32) -> Option<Self> {
        Some(Self {
            name: hello.name.clone(),
            size: hello.size,
            mtime: hello.mtime?,
            digest: hello.digest,
            chunk_len,
        })
    }

    /// The sidecar's header for this identity.
    pub fn header(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_FIXED + self.name.len() + 4);
        h.extend_from_slice(MAGIC);
        // Names are at most 4096 bytes (validated paths).
        h.extend_from_slice(&(self.name.len().min(u16::MAX.into()) as u16).to_be_bytes());
        h.extend_from_slice(&self.size.to_be_bytes());
        h.extend_from_slice(&self.mtime.secs.to_be_bytes());
        h.extend_from_slice(&self.mtime.nanos.to_be_bytes());
        h.push(self.digest as u8);
        h.extend_from_slice(&self.chunk_len.to_be_bytes());
        h.extend_from_slice(self.name.as_bytes());
        let check = crc32fast::hash(&h);
        h.extend_from_slice(&check.to_be_bytes());
        h
    }

    /// Why a partial kept for `self` cannot continue a transfer of `now`
    /// (the same name is assumed): the source changed, or the chunks did.
    pub fn mismatch(&self, now: &Identity) -> Option<String> {
        if self.size != now.size {
            Some(format!(
                "the source's size changed ({} bytes, now {})",
                self.size, now.size
            ))
        } else if self.mtime != now.mtime {
            Some("the source's modification time changed".into())
        } else if self.digest != now.digest {
            Some(format!(
                "the digest changed ({}, now {})",
                self.digest, now.digest
            ))
        } else if self.chunk_len != now.chunk_len {
            Some(format!(
                "the chunk size changed ({} bytes, now {})",
                self.chunk_len, now.chunk_len
            ))
        } else {
            None
        }
    }
}

/// The record of verified chunk `index` with CRC32 `crc`.
pub(super) fn record(index: u64, crc: u32) -> [u8; 8] {
    let mut r = [0u8; 8];
    r[..4].copy_from_slice(&crc.to_be_bytes());
    let mut check = crc32fast::Hasher::new();
    check.update(&index.to_be_bytes());
    check.update(&crc.to_be_bytes());
    r[4..].copy_from_slice(&check.finalize().to_be_bytes());
    r
}

impl Identity {
    /// How many chunks the file has.
    pub fn chunks(&self) -> u64 {
        // chunk_len is never 0 in a header read back (see `read_header`).
        self.size.div_ceil(u64::from(self.chunk_len.max(1)))
    }
}

/// Reads a sidecar's header from `r` (and nothing past it): the identity
/// it records, if intact.
pub(super) fn read_header(r: &mut impl std::io::Read) -> Result<Identity, SidecarError> {
    let damaged = SidecarError::Damaged;
    let mut fixed = [0u8; HEADER_FIXED];
    read_all(r, &mut fixed, "not a partial-file record")?;
    if &fixed[..MAGIC.len()] != MAGIC {
        return Err(damaged("not a partial-file record"));
    }
    let mut at = MAGIC.len();
    let mut field = |n: usize| {
        let v = fixed[at..at + n]
            .iter()
            .fold(0u64, |v, &b| v << 8 | u64::from(b));
        at += n;
        v
    };
    let name_len = field(2) as usize;
    let size = field(8);
    let secs = field(8) as i64;
    let nanos = field(4) as u32;
    let alg = field(1) as u8;
    let chunk_len = field(4) as u32;
    // At most 64 KiB: the length is a u16.
    let mut name = vec![0u8; name_len];
    read_all(r, &mut name, "short header")?;
    let mut check = [0u8; 4];
    read_all(r, &mut check, "short header")?;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&fixed);
    crc.update(&name);
    if crc.finalize() != u32::from_be_bytes(check) {
        return Err(damaged("header checksum"));
    }
    let name = String::from_utf8(name).map_err(|_| damaged("name not UTF-8"))?;
    let digest = DigestAlg::from_u8(alg).ok_or(damaged("unknown digest"))?;
    if chunk_len == 0 || nanos >= 1_000_000_000 {
        return Err(damaged("impossible header values"));
    }
    Ok(Identity {
        name,
        size,
        mtime: Mtime { secs, nanos },
        digest,
        chunk_len,
    })
}

/// `read_exact`, where a short read means a damaged sidecar (`why`).
fn read_all(
    r: &mut impl std::io::Read,
    buf: &mut [u8],
    why: &'static str,
) -> Result<(), SidecarError> {
    r.read_exact(buf).map_err(|e| match e.kind() {
        std::io::ErrorKind::UnexpectedEof => SidecarError::Damaged(why),
        _ => SidecarError::Read(e),
    })
}

/// Reads the records that follow the header, at most `max` of them (read
/// one at a time: the count is never trusted for an allocation), up to
/// the first torn or damaged one.
pub(super) fn read_records(r: &mut impl std::io::Read, max: u64) -> std::io::Result<Vec<u32>> {
    let mut crcs = Vec::new();
    let mut rec = [0u8; 8];
    for index in 0..max {
        match r.read_exact(&mut rec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let crc = u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]]);
        if record(index, crc) != rec {
            break;
        }
        crcs.push(crc);
    }
    Ok(crcs)
}

impl Sidecar {
    /// Reads a sidecar: its header must be intact; its records count up to
    /// the first torn or damaged one, and never past the file's last chunk.
    /// (`find` streams the same from the file.)
    #[cfg(test)]
    pub fn decode(bytes: &[u8]) -> Result<Self, SidecarError> {
        let mut r = bytes;
        let identity = read_header(&mut r)?;
        let crcs = read_records(&mut r, identity.chunks())?;
        Ok(Self { identity, crcs })
    }

    /// Bytes of the verified prefix that a transfer may continue: whole
    /// chunks only, and never the whole file (a complete file is
    /// committed, not resumed).
    pub fn prefix_chunks(&self) -> u64 {
        let chunks = self.crcs.len() as u64;
        let whole = self.identity.size / u64::from(self.identity.chunk_len);
        let last_is_short = !self
            .identity
            .size
            .is_multiple_of(u64::from(self.identity.chunk_len));
        // The chunks before the file's last one.
        let before_last = if last_is_short {
            whole
        } else {
            whole.saturating_sub(1)
        };
        chunks.min(before_last)
    }

    /// The verified prefix in bytes (see `prefix_chunks`).
    pub fn prefix_bytes(&self) -> u64 {
        self.prefix_chunks() * u64::from(self.identity.chunk_len)
    }

    /// What HAVE carries for the prefix: SHA-256 of its chunks' CRC32s,
    /// 4 bytes each, big-endian, in order.
    pub fn prefix_digest(&self) -> [u8; 32] {
        prefix_digest(&self.crcs[..self.prefix_chunks() as usize])
    }
}

/// SHA-256 of chunk CRC32s as HAVE carries it (the sender computes the
/// same over its own file's chunks).
pub fn prefix_digest(crcs: &[u32]) -> [u8; 32] {
    let mut h = Sha256::new();
    for crc in crcs {
        h.update(crc.to_be_bytes());
    }
    h.finalize().into()
}

/// The hidden names of the partial file and its sidecar for final name
/// `leaf` (in the same directory): derived from a hash of the name, so
/// that they fit in 255 bytes whatever the name.
pub(super) fn partial_names(leaf: &str) -> (String, String) {
    let h = Sha256::digest(leaf.as_bytes());
    let id: String = h[..12].iter().map(|b| format!("{b:02x}")).collect();
    (
        format!(".rdma-xfer-partial-{id}"),
        format!(".rdma-xfer-partial-{id}.meta"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn identity() -> Identity {
        Identity {
            name: "dir/big.bin".into(),
            size: 10 * 100 + 37,
            mtime: Mtime {
                secs: -5,
                nanos: 999_999_999,
            },
            digest: DigestAlg::Sha256,
            chunk_len: 100,
        }
    }

    fn sidecar_bytes(id: &Identity, crcs: &[u32]) -> Vec<u8> {
        let mut b = id.header();
        for (i, c) in crcs.iter().enumerate() {
            b.extend_from_slice(&record(i as u64, *c));
        }
        b
    }

    #[test]
    fn a_sidecar_reads_back_what_was_written() {
        let id = identity();
        let crcs: Vec<u32> = (0..7).map(|i| 0xabc0_0000 + i).collect();
        let s = Sidecar::decode(&sidecar_bytes(&id, &crcs)).unwrap();
        assert_eq!(s.identity, id);
        assert_eq!(s.crcs, crcs);
        assert_eq!((s.prefix_chunks(), s.prefix_bytes()), (7, 700));
        assert_eq!(s.prefix_digest(), prefix_digest(&crcs));
        assert_ne!(prefix_digest(&crcs), prefix_digest(&crcs[..6]));
    }

    #[test]
    fn a_torn_or_damaged_record_ends_the_prefix_there() {
        let id = identity();
        let crcs = [1u32, 2, 3, 4];
        let mut b = sidecar_bytes(&id, &crcs);
        // A torn last record (half written).
        b.extend_from_slice(&record(4, 5)[..5]);
        assert_eq!(Sidecar::decode(&b).unwrap().crcs, crcs);
        // A flipped bit in record 2: the prefix is records 0 and 1.
        let at = b.len() - 5 - 2 * 8 + 1;
        b[at] ^= 0x10;
        assert_eq!(Sidecar::decode(&b).unwrap().crcs, [1, 2]);
        // Records in the wrong order do not check.
        let mut swapped = id.header();
        swapped.extend_from_slice(&record(1, 2));
        swapped.extend_from_slice(&record(0, 1));
        assert_eq!(Sidecar::decode(&swapped).unwrap().crcs, Vec::<u32>::new());
    }

    #[test]
    fn a_damaged_header_makes_the_sidecar_unusable() {
        let b = sidecar_bytes(&identity(), &[1, 2]);
        for at in 0..identity().header().len() {
            let mut d = b.clone();
            d[at] ^= 0x01;
            assert!(Sidecar::decode(&d).is_err(), "byte {at}");
        }
        for cut in 0..identity().header().len() {
            assert!(Sidecar::decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        assert!(Sidecar::decode(b"").is_err());
    }

    #[test]
    fn the_prefix_never_covers_the_last_chunk() {
        // 1037 bytes in chunks of 100: 10 whole chunks and a short one.
        let id = identity();
        let all: Vec<u32> = (0..11).collect();
        let s = Sidecar::decode(&sidecar_bytes(&id, &all)).unwrap();
        assert_eq!(s.prefix_chunks(), 10);
        // 1000 bytes: 10 whole chunks, the last of them is the file's end.
        let even = Identity {
            size: 1000,
            ..identity()
        };
        let s = Sidecar::decode(&sidecar_bytes(&even, &all)).unwrap();
        assert_eq!(s.crcs.len(), 10, "no more records than chunks");
        assert_eq!(s.prefix_chunks(), 9);
    }

    #[test]
    fn an_identity_change_says_what_changed() {
        let id = identity();
        assert_eq!(id.mismatch(&id), None);
        let cases = [
            (
                Identity {
                    size: 1,
                    ..identity()
                },
                "size",
            ),
            (
                Identity {
                    mtime: Mtime { secs: 0, nanos: 0 },
                    ..identity()
                },
                "modification time",
            ),
            (
                Identity {
                    digest: DigestAlg::Crc32,
                    ..identity()
                },
                "digest",
            ),
            (
                Identity {
                    chunk_len: 50,
                    ..identity()
                },
                "chunk size",
            ),
        ];
        for (now, what) in cases {
            let why = id.mismatch(&now).expect("a mismatch");
            assert!(why.contains(what), "{why}");
        }
    }

    #[test]
    fn partial_names_are_hidden_short_and_distinct() {
        let (p, m) = partial_names(&"n".repeat(255));
        assert!(p.starts_with('.') && p.len() < 64 && m == format!("{p}.meta"));
        assert_ne!(partial_names("a").0, partial_names("b").0);
    }
}

/// Records past this many bytes of a sidecar are not read (a 2 TB file in
/// 1 MiB chunks needs 16 MiB of records).
const MAX_SIDECAR: u64 = 256 << 20;

/// What the receiver holds of a file offered with RESUME: the HAVE to
/// answer, for a verified prefix what continuing it needs, for a complete
/// copy the file itself (compared when the sender's COMPARE comes).
pub(super) struct Holding {
    pub have: crate::proto::Have,
    pub kept: Option<KeptPrefix>,
    pub copy: Option<std::fs::File>,
}

/// A kept partial file's verified prefix, read back: its records (with
/// the descriptors that were checked), and the whole-file digest over it,
/// to continue with the bytes that follow.
pub(super) struct KeptPrefix {
    pub sidecar: OpenSidecar,
    pub hasher: crate::engine::digest::FileHasher,
}

/// A sidecar as `find` read it, with the descriptors of it and of its
/// partial file: a transfer continues the very files that were checked,
/// never whatever the names lead to by then.
pub(super) struct OpenSidecar {
    pub record: Sidecar,
    /// The partial file (open for reading and writing).
    pub partial: std::fs::File,
    /// The sidecar (open for reading and writing).
    pub meta: std::fs::File,
}

impl std::ops::Deref for OpenSidecar {
    type Target = Sidecar;
    fn deref(&self) -> &Sidecar {
        &self.record
    }
}

impl Holding {
    pub fn nothing(note: impl Into<String>) -> Self {
        Self {
            have: crate::proto::Have::nothing(note),
            kept: None,
            copy: None,
        }
    }
}

/// What the receiver holds of `hello`'s file, offered with RESUME, under
/// `parent` with final name `leaf`: the complete file (same size; read
/// only if the sender's COMPARE comes, see `copy_digest`), the prefix of a
/// partial file kept from an earlier attempt, read back and checked
/// against its record, or nothing, with the reason. `tick` is called
/// once per chunk read (the engine keeps the sender informed while a
/// large file is read) and may stop the read with an error.
pub(super) fn find(
    parent: &crate::sys::dirfd::DirFd,
    leaf: &str,
    hello: &Hello,
    chunk_len: u32,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> Holding {
    use crate::engine::digest::read_prefix;
    use crate::proto::{Digest, Have, HaveKind};
    use crate::sys::dirfd::EntryKind;
    let name = &hello.name;
    if let Ok(Some(EntryKind::File)) = parent.kind(leaf) {
        return match parent.open_file(leaf, false) {
            Ok(f) if f.metadata().is_ok_and(|m| m.len() == hello.size) => Holding {
                have: Have::complete(hello.size),
                kept: None,
                copy: Some(f),
            },
            Ok(_) => Holding::nothing(format!("{name} exists on the receiver with another size")),
            Err(e) => Holding::nothing(format!("cannot open the receiver's {name}: {e}")),
        };
    }
    let (partial, meta) = partial_names(leaf);
    // Both are opened for writing too: a transfer that continues them
    // writes through these descriptors.
    let side = match parent.open_file(&meta, true) {
        Ok(f) => f,
        // Nothing kept: nothing to explain (an empty note).
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Holding::nothing(""),
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
    // Streamed: the header first, the records only once it is acceptable.
    let mut reader = std::io::BufReader::new(&side);
    let identity = match read_header(&mut reader) {
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
    let file = match parent.open_file(&partial, true) {
        Ok(f) => f,
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
        .min(MAX_SIDECAR / 8);
    let crcs = match read_records(&mut reader, max) {
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
        |index, crc| {
            if crcs.get(index as usize) != Some(&crc) {
                return Err(std::io::Error::other(format!(
                    "chunk {index} of the partial file no longer matches its record"
                )));
            }
            tick()
        },
    );
    match checked {
        Ok(read) => Holding {
            have: Have {
                kind: HaveKind::Prefix,
                bytes: prefix,
                chunk_len: sidecar.identity.chunk_len,
                digest: Digest::Sha256(sidecar.prefix_digest()),
                note: String::new(),
            },
            kept: Some(KeptPrefix {
                sidecar: OpenSidecar {
                    record: sidecar,
                    partial: file,
                    meta: side,
                },
                hasher: read.hasher,
            }),
            copy: None,
        },
        Err(e) => Holding::nothing(format!("the partial file cannot be continued: {e}")),
    }
}

/// SHA-256 of the complete copy `find` held (`Holding::copy`), read
/// through the descriptor it opened, to compare with the sender's COMPARE:
/// the receiver tells the sender only whether the two match. `tick` as
/// for `find`. An error if the copy changed size meanwhile.
pub(super) fn copy_digest(
    copy: &std::fs::File,
    size: u64,
    chunk_len: u32,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<[u8; 32]> {
    if copy.metadata()?.len() != size {
        return Err(std::io::Error::other("it changed size"));
    }
    let read =
        crate::engine::digest::read_prefix(copy, size, chunk_len, DigestAlg::Sha256, |_, _| {
            tick()
        })?;
    match read.hasher.finish() {
        crate::proto::Digest::Sha256(d) => Ok(d),
        crate::proto::Digest::Crc32(_) => Err(std::io::Error::other("not a SHA-256")),
    }
}

#[cfg(test)]
mod find_tests {
    use super::*;
    use crate::proto::{Digest, HaveKind};
    use crate::sys::dirfd::DirFd;

    fn offer(size: u64) -> Hello {
        Hello {
            version: crate::proto::PROTOCOL_VERSION,
            caps: crate::proto::hello_flags::RESUME | crate::proto::hello_flags::MTIME,
            name: "d/f.bin".into(),
            size,
            mode: 0o644,
            digest: DigestAlg::Sha256,
            mtime: Some(Mtime { secs: 9, nanos: 1 }),
        }
    }

    /// A partial file of `have` bytes and a sidecar of its chunk CRCs.
    fn keep_partial(dir: &Path, data: &[u8], have: usize, chunk: u32, hello: &Hello) {
        let (partial, meta) = partial_names("f.bin");
        std::fs::write(dir.join(&partial), &data[..have]).unwrap();
        let id = Identity::of_offer(hello, chunk).unwrap();
        let mut side = id.header();
        for (i, c) in data[..have].chunks_exact(chunk as usize).enumerate() {
            side.extend_from_slice(&record(i as u64, crc32fast::hash(c)));
        }
        std::fs::write(dir.join(meta), side).unwrap();
    }

    use std::path::Path;

    fn holds(parent: &DirFd, hello: &Hello) -> crate::proto::Have {
        find(parent, "f.bin", hello, 100, &mut || Ok(())).have
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
        assert_eq!(h.kind, HaveKind::Nothing);
        assert!(h.note.is_empty(), "{}", h.note);
        // A partial of 450 bytes: 4 whole chunks verified.
        keep_partial(dir, &data, 450, 100, &hello);
        let h = holds(&parent, &hello);
        assert_eq!((h.kind, h.bytes, h.chunk_len), (HaveKind::Prefix, 400, 100));
        let crcs: Vec<u32> = data[..400].chunks(100).map(crc32fast::hash).collect();
        assert_eq!(h.digest, Digest::Sha256(prefix_digest(&crcs)));
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
        assert!(stopped.kept.is_none() && stopped.have.note.contains("session over"));
        // A byte of the partial changed in place: its record no longer
        // matches, nothing is continued.
        let (partial, _) = partial_names("f.bin");
        let mut bytes = std::fs::read(dir.join(&partial)).unwrap();
        bytes[250] ^= 1;
        std::fs::write(dir.join(&partial), &bytes).unwrap();
        let h = holds(&parent, &hello);
        assert!(
            h.kind == HaveKind::Nothing && h.note.contains("chunk 2"),
            "{}",
            h.note
        );
        keep_partial(dir, &data, 450, 100, &hello);
        // An empty record (the attempt ended before its first sync).
        let (_, meta) = partial_names("f.bin");
        std::fs::write(dir.join(&meta), b"").unwrap();
        let h = holds(&parent, &hello);
        assert!(h.kind == HaveKind::Nothing && h.note.contains("verified yet"));
        keep_partial(dir, &data, 450, 100, &hello);
        // The source changed: nothing, and why.
        let changed = Hello {
            mtime: Some(Mtime { secs: 10, nanos: 1 }),
            ..offer(1000)
        };
        let h = holds(&parent, &changed);
        assert!(h.kind == HaveKind::Nothing && h.note.contains("modification time"));
        // The partial cut short by hand: nothing.
        std::fs::write(dir.join(&partial), &data[..150]).unwrap();
        let h = holds(&parent, &hello);
        assert!(
            h.kind == HaveKind::Nothing && h.note.contains("shorter"),
            "{}",
            h.note
        );
        // A damaged record: nothing.
        keep_partial(dir, &data, 450, 100, &hello);
        let mut side = std::fs::read(dir.join(&meta)).unwrap();
        side[3] ^= 1;
        std::fs::write(dir.join(&meta), side).unwrap();
        let h = holds(&parent, &hello);
        assert!(
            h.kind == HaveKind::Nothing && h.note.contains("damaged"),
            "{}",
            h.note
        );
        // The complete file: held, and never its digest in the HAVE.
        std::fs::write(dir.join("f.bin"), &data).unwrap();
        let held = find(&parent, "f.bin", &hello, 100, &mut || Ok(()));
        assert_eq!(held.have, crate::proto::Have::complete(1000));
        let copy = held.copy.expect("the copy held");
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
        // Another size: nothing.
        let h = holds(&parent, &offer(999));
        assert!(h.kind == HaveKind::Nothing && h.note.contains("another size"));
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
            refused.have.note,
            "the kept part arrived in chunks of 200 bytes, larger than this receiver's 100"
        );
        // Chunks as large as the receiver's: the prefix.
        let h = find(&parent, "f.bin", &hello, 200, &mut || Ok(())).have;
        assert_eq!((h.kind, h.bytes, h.chunk_len), (HaveKind::Prefix, 600, 200));
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
        assert_eq!((h.kind, h.bytes), (HaveKind::Prefix, 900));
        // The partial cut to 300 bytes: 4 records read, one more than it
        // backs, so it is known to be short.
        std::fs::write(tmp.path().join(&partial), &data[..300]).unwrap();
        let h = holds(&parent, &hello);
        assert!(h.note.contains("shorter"), "{}", h.note);
    }
}

/// Chunks written between two syncs of a resumable file (and so the most
/// that a crash of the receiver can cost a resumed transfer, besides the
/// chunks in flight).
pub(super) const SYNC_EVERY: usize = 64;

/// Partial files a session of this receiver uses, by directory (device,
/// inode) and final name: two sessions never write, continue or replace
/// the same partial file.
static CLAIMS: std::sync::Mutex<std::collections::BTreeSet<(u64, u64, String)>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A session's exclusive use of the partial file of one final name, until
/// dropped.
#[derive(Debug)]
pub(super) struct Claim {
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
pub(super) struct Resumable {
    parent: crate::sys::dirfd::DirFd,
    partial: String,
    meta: String,
    /// The partial file, to make it durable before records promise it.
    file: std::fs::File,
    sidecar: std::fs::File,
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
    /// Returns the partial file for the chunks' writes.
    pub fn start(
        parent: &crate::sys::dirfd::DirFd,
        leaf: &str,
        identity: Identity,
        claim: Claim,
    ) -> std::io::Result<(Self, std::fs::File)> {
        let (partial, meta) = partial_names(leaf);
        for name in [&partial, &meta] {
            match parent.unlink(name) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
        let file = parent.create_new(&partial, 0o600)?;
        let sidecar = match parent.create_new(&meta, 0o600) {
            Ok(f) => f,
            Err(e) => {
                let _ = parent.unlink(&partial);
                return Err(e);
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
        let keep = sidecar.identity.header().len() as u64 + prefix * 8;
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
            self.identity.header()
        } else {
            Vec::with_capacity(self.unsynced.len() * 8)
        };
        for (k, crc) in self.unsynced.iter().enumerate() {
            records.extend_from_slice(&record(self.recorded + k as u64, *crc));
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
        let mut first = synced.err();
        if self.failed {
            // A failed append may have left records whose bytes are cut
            // below: they go too.
            let len = self.identity.header().len() as u64 + self.recorded * 8;
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
pub(super) fn remove(
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
mod resumable_tests {
    use super::*;
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
        let claim = || Claim::try_take(&parent, "f.bin").unwrap().expect("free");
        let (mut r, file) = Resumable::start(&parent, "f.bin", id(), claim()).unwrap();
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
        let side = Sidecar::decode(&read_side()).unwrap();
        assert_eq!(side.crcs.len(), SYNC_EVERY);
        // The chunk length came from the first chunk.
        assert_eq!(side.identity.chunk_len, 10);
        r.sync().unwrap();
        let side = Sidecar::decode(&read_side()).unwrap();
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
        };
        let (mut r, file) = Resumable::resume(&parent, "f.bin", &short, claim()).unwrap();
        assert_eq!(file.metadata().unwrap().len(), 200);
        let c = &data[200..210];
        file.write_all_at(c, 200).unwrap();
        r.chunk_written(crc32fast::hash(c), 10).unwrap();
        r.sync().unwrap();
        let again = Sidecar::decode(&read_side()).unwrap();
        assert_eq!(again.crcs.len(), 21);
        assert_eq!(again.crcs[20], crc32fast::hash(c));
        // Done: the partial is renamed by the commit, the sidecar goes.
        assert!(tmp.path().join(&partial).exists());
        r.forget().unwrap();
        assert!(!tmp.path().join(&meta).exists());
        // Starting over replaces whatever was kept; discarding removes both.
        std::fs::write(tmp.path().join(&meta), b"junk").unwrap();
        let (r, _) = Resumable::start(&parent, "f.bin", id(), claim()).unwrap();
        assert!(read_side().is_empty());
        r.discard();
        assert!(!tmp.path().join(&meta).exists() && !tmp.path().join(&partial).exists());
    }

    #[test]
    fn after_a_failed_sync_nothing_more_is_recorded() {
        let tmp = tempfile::tempdir().unwrap();
        let parent = DirFd::open(tmp.path()).unwrap();
        let claim = Claim::try_take(&parent, "f.bin").unwrap().unwrap();
        let (mut r, file) = Resumable::start(&parent, "f.bin", id(), claim).unwrap();
        let meta = tmp.path().join(r.names().1);
        let records = || {
            Sidecar::decode(&std::fs::read(&meta).unwrap())
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
        let (mut r, _) = Resumable::start(&parent, "g.bin", id(), claim).unwrap();
        r.chunk_written(1, 10).unwrap();
        r.write_failed();
        assert!(r.sync().is_err() && r.chunk_written(2, 10).is_err());
        assert_eq!(std::fs::read(tmp.path().join(r.names().1)).unwrap(), b"");
    }
}

/// Whether `name` is one of the receiver's own leftovers: a kept partial
/// file or its record, or the temporary file of a transfer whose receiver
/// died (a crash leaves it behind).
fn is_leftover(name: &str) -> bool {
    name.starts_with(".rdma-xfer-partial-")
        || (name.starts_with(".rdma-xfer-") && name.ends_with(".part"))
}

/// What a sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Swept {
    /// Leftovers older than the limit, removed.
    pub removed: u64,
    /// Leftovers younger than it, kept.
    pub kept: u64,
}

/// Removes the partial files, their records and dead temporary files
/// under `root` that were not modified for `ttl`: the whole tree, never
/// through a link nor into another file system (a mount below `--dir`).
/// Spared whatever a live session uses: a partial file claimed (see
/// `Claim`), a temporary file of this process. Directories wait as paths
/// and are opened one at a time, each from the root, component by
/// component: a tree of any width or depth costs two descriptors.
/// `go_on` is asked before each directory; false stops the sweep there.
pub(super) fn sweep(
    root: &crate::sys::dirfd::DirFd,
    ttl: std::time::Duration,
    go_on: &dyn Fn() -> bool,
) -> Swept {
    use crate::sys::dirfd::EntryKind;
    let now = std::time::SystemTime::now();
    let mut swept = Swept::default();
    let root_dev = match root.identity() {
        Ok((dev, _)) => dev,
        Err(e) => {
            tracing::warn!("cannot look for old partial files: {e}");
            return swept;
        }
    };
    // This process's temporary files belong to sessions running now.
    let own = format!(".rdma-xfer-{}-", std::process::id());
    // Directories still to search, as paths below the root ("" is the
    // root, "a/b/" a directory in it).
    let mut stack = vec![String::new()];
    while let Some(path) = stack.pop() {
        if !go_on() {
            break;
        }
        // Opened from the root, each step dropping the one before.
        let opened = root.try_clone().and_then(|top| {
            path.split_terminator('/')
                .try_fold(top, |dir, c| dir.open_dir(c))
        });
        let dir = match opened {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(dir = %path, "not searched for partial files: {e}");
                continue;
            }
        };
        let id = match dir.identity() {
            Ok((dev, _)) if dev != root_dev => {
                tracing::debug!(dir = %path, "another file system: not searched for partial files");
                continue;
            }
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(dir = %path, "cannot look for old partial files: {e}");
                continue;
            }
        };
        let entries = match dir.entries() {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %path, "cannot look for old partial files: {e}");
                continue;
            }
        };
        for (name, kind) in entries {
            match kind {
                EntryKind::Dir => stack.push(format!("{path}{name}/")),
                EntryKind::File if is_leftover(&name) => {
                    let age = dir
                        .modified(&name)
                        .ok()
                        .and_then(|m| now.duration_since(m).ok())
                        .unwrap_or_default();
                    if age < ttl || name.starts_with(&own) {
                        swept.kept += 1;
                        continue;
                    }
                    // Checked and removed under the claims' lock: no
                    // session claims it in between.
                    let claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
                    if is_claimed(&claims, id, &name) {
                        swept.kept += 1;
                        continue;
                    }
                    let removed = dir.unlink(&name);
                    drop(claims);
                    match removed {
                        Ok(()) => {
                            tracing::info!(
                                path = %format!("{path}{name}"),
                                age_s = age.as_secs(),
                                "removed a partial file older than --partial-ttl"
                            );
                            swept.removed += 1;
                        }
                        Err(e) => {
                            tracing::warn!(path = %format!("{path}{name}"), "cannot remove an old partial file: {e}")
                        }
                    }
                }
                _ => {}
            }
        }
    }
    swept
}

/// Whether the leftover `name` in directory `dir` (device, inode) is the
/// partial file or record of a name a session claimed.
fn is_claimed(
    claims: &std::collections::BTreeSet<(u64, u64, String)>,
    dir: (u64, u64),
    name: &str,
) -> bool {
    claims
        .range((dir.0, dir.1, String::new())..)
        .take_while(|(dev, ino, _)| (*dev, *ino) == dir)
        .any(|(_, _, leaf)| {
            let (partial, meta) = partial_names(leaf);
            name == partial || name == meta
        })
}

#[cfg(test)]
mod sweep_tests {
    use super::*;
    use crate::sys::dirfd::DirFd;
    use std::time::{Duration, SystemTime};

    fn age(path: &std::path::Path, secs: u64) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(secs))
            .unwrap();
    }

    #[test]
    fn old_leftovers_go_young_ones_and_everything_else_stay() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        let (partial, meta) = partial_names("x");
        let old = [
            r.join(&partial),
            r.join(format!("a/b/{meta}")),
            r.join("a/.rdma-xfer-12-0-0000abcd.part"),
        ];
        let young = r.join(format!("a/{partial}"));
        let other = [r.join("a/b/.rdma-xfer-partial"), r.join("keep.bin")];
        for p in old.iter().chain([&young]).chain(&other) {
            std::fs::write(p, b"x").unwrap();
        }
        for p in old.iter().chain(&other) {
            age(p, 7200);
        }
        // Through a link: never.
        let linked = outside.path().join(&partial);
        std::fs::write(&linked, b"x").unwrap();
        age(&linked, 7200);
        std::os::unix::fs::symlink(outside.path(), r.join("a/link")).unwrap();
        let swept = sweep(&DirFd::open(r).unwrap(), Duration::from_secs(3600), &|| {
            true
        });
        assert_eq!(
            swept,
            Swept {
                removed: 3,
                kept: 1
            }
        );
        assert!(old.iter().all(|p| !p.exists()));
        assert!(young.exists() && other.iter().all(|p| p.exists()) && linked.exists());
    }

    #[test]
    fn what_a_session_uses_is_never_swept() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("a")).unwrap();
        let (partial, meta) = partial_names("x.bin");
        let (other, _) = partial_names("y.bin");
        let own = format!(".rdma-xfer-{}-0-00000000.part", std::process::id());
        let dead = ".rdma-xfer-1-0-00000000.part".to_string();
        let files = [&partial, &meta, &other, &own, &dead].map(|n| r.join("a").join(n));
        for p in &files {
            std::fs::write(p, b"x").unwrap();
            age(p, 7200);
        }
        let a = DirFd::open(&r.join("a")).unwrap();
        let claim = Claim::try_take(&a, "x.bin").unwrap().unwrap();
        let root_fd = DirFd::open(r).unwrap();
        let ttl = Duration::from_secs(3600);
        // The claimed name's partial and record, and this process's
        // temporary file, stay; the others go.
        assert_eq!(
            sweep(&root_fd, ttl, &|| true),
            Swept {
                removed: 2,
                kept: 3
            }
        );
        assert!(files[..2].iter().all(|p| p.exists()) && files[3].exists());
        assert!(!files[2].exists() && !files[4].exists());
        // Given back: swept.
        drop(claim);
        assert_eq!(
            sweep(&root_fd, ttl, &|| true),
            Swept {
                removed: 2,
                kept: 1
            }
        );
    }

    #[test]
    fn directories_are_opened_one_at_a_time() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path().canonicalize().unwrap();
        // Wide and deep: 100 directories side by side, one of them 100 deep.
        let mut deep = r.join("d0");
        for i in 0..100 {
            std::fs::create_dir_all(r.join(format!("d{i}"))).unwrap();
            deep.push("n");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let (partial, _) = partial_names("x");
        std::fs::write(deep.join(&partial), b"x").unwrap();
        age(&deep.join(&partial), 7200);
        // Descriptors open below the root (other tests' are elsewhere),
        // counted each time the sweep turns to the next directory.
        let below = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t.starts_with(&r) && t != &r)
                .count()
        };
        // The count sees a descriptor held below the root.
        let held = DirFd::open(&r.join("d1")).unwrap();
        assert_eq!(below(), 1);
        drop(held);
        let most = std::cell::Cell::new(0);
        let turns = std::cell::Cell::new(0);
        let go_on = || {
            most.set(most.get().max(below()));
            turns.set(turns.get() + 1);
            true
        };
        let swept = sweep(&DirFd::open(&r).unwrap(), Duration::from_secs(3600), &go_on);
        assert_eq!(swept.removed, 1);
        assert_eq!(turns.get(), 1 + 100 + 100);
        assert_eq!(most.get(), 0, "directories held open between turns");
        // And it stops when told.
        let turns = std::cell::Cell::new(0);
        sweep(&DirFd::open(&r).unwrap(), Duration::ZERO, &|| {
            turns.set(turns.get() + 1);
            turns.get() < 3
        });
        assert_eq!(turns.get(), 3);
    }
}
