//! The sidecar of a partial file: its format (header and records), read
//! back and written, and the hidden names of both files.

use super::key::{SidecarKey, TAG_LEN};
use crate::proto::{DigestAlg, Hello, Mtime};
use hmac::Mac as _;
use sha2::{Digest as _, Sha256};

/// The sidecar's first bytes (and its format version).
const MAGIC: &[u8; 8] = b"RXFRPT2\n";

/// The first bytes of the unkeyed format before it: such a sidecar is
/// never used (anyone could have written it).
const UNKEYED_MAGIC: &[u8; 8] = b"RXFRPT1\n";

/// Header after the magic: name length (u16), size (u64), mtime seconds
/// (i64) and nanoseconds (u32), digest algorithm (u8), chunk length (u32),
/// then the name, then the tag (HMAC-SHA256 under the directory's key) of
/// everything before it.
const HEADER_FIXED: usize = MAGIC.len() + 2 + 8 + 8 + 4 + 1 + 4;

/// A record: the chunk's CRC32 and its tag.
pub(crate) const RECORD_LEN: usize = 4 + TAG_LEN;

/// What each tag's input starts with, so that no header's tag is a
/// record's and the reverse.
const HEADER_DOMAIN: &[u8] = b"rdma-xfer sidecar header";
const RECORD_DOMAIN: &[u8] = b"rdma-xfer sidecar record";

/// The identity of a source file and the chunking of its transfer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    /// The validated relative path it arrives under.
    pub name: String,
    pub size: u64,
    pub mtime: Mtime,
    pub digest: DigestAlg,
    pub chunk_len: u32,
}

/// A sidecar as read back: the identity and the verified chunks' CRCs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Sidecar {
    pub identity: Identity,
    pub crcs: Vec<u32>,
}

/// Why a sidecar cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SidecarError {
    #[error("the partial file's record is damaged ({0})")]
    Damaged(&'static str),
    #[error("the partial file's record is of an older, unkeyed format: not used")]
    Unkeyed,
    #[error(
        "the partial file's record is damaged or not the receiver's (it does not check with this directory's key): not used"
    )]
    Forged,
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

    /// The sidecar's header for this identity, tagged with `key`.
    pub fn header(&self, key: &SidecarKey) -> Vec<u8> {
        let mut h = self.header_fields();
        let tag = key.tag(&[HEADER_DOMAIN, &h]);
        h.extend_from_slice(&tag);
        h
    }

    /// The header's length in bytes.
    pub fn header_len(&self) -> u64 {
        (HEADER_FIXED + self.name.len() + TAG_LEN) as u64
    }

    /// What the header's tag covers.
    fn header_fields(&self) -> Vec<u8> {
        let mut h = Vec::with_capacity(HEADER_FIXED + self.name.len() + TAG_LEN);
        h.extend_from_slice(MAGIC);
        // Names are at most 4096 bytes (validated paths).
        h.extend_from_slice(&(self.name.len().min(u16::MAX.into()) as u16).to_be_bytes());
        h.extend_from_slice(&self.size.to_be_bytes());
        h.extend_from_slice(&self.mtime.secs.to_be_bytes());
        h.extend_from_slice(&self.mtime.nanos.to_be_bytes());
        h.push(self.digest as u8);
        h.extend_from_slice(&self.chunk_len.to_be_bytes());
        h.extend_from_slice(self.name.as_bytes());
        h
    }

    /// The key of this identity's records: each record's tag covers the
    /// header's, so that no record counts under another header.
    pub fn records_key(&self, key: &SidecarKey) -> RecordsKey {
        let header = self.header(key);
        let tag = &header[header.len() - TAG_LEN..];
        RecordsKey {
            mac: key.mac_of(&[RECORD_DOMAIN, tag]),
        }
    }

    /// Why a partial kept for `self` cannot continue a transfer of `now`
    /// (the same name is assumed): the source changed, or the chunks did.
    pub fn mismatch(&self, now: &Identity) -> Option<String> {
        // No sizes or times in the words: the sender learns nothing of an
        // earlier source of that name it could not know.
        if self.size != now.size {
            Some("the source's size changed".into())
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

/// The key of one sidecar's records (see `Identity::records_key`).
pub(crate) struct RecordsKey {
    mac: hmac::Hmac<Sha256>,
}

impl RecordsKey {
    /// The record of verified chunk `index` with CRC32 `crc`: the CRC and
    /// the tag of (its number as u64, the CRC).
    pub fn record(&self, index: u64, crc: u32) -> [u8; RECORD_LEN] {
        let mut r = [0u8; RECORD_LEN];
        r[..4].copy_from_slice(&crc.to_be_bytes());
        r[4..].copy_from_slice(&self.tag(index, crc).finalize().into_bytes());
        r
    }

    fn tag(&self, index: u64, crc: u32) -> hmac::Hmac<Sha256> {
        let mut m = self.mac.clone();
        m.update(&index.to_be_bytes());
        m.update(&crc.to_be_bytes());
        m
    }

    /// Whether `rec` is the record of chunk `index` (in constant time).
    fn checks(&self, index: u64, rec: &[u8; RECORD_LEN]) -> Option<u32> {
        let crc = u32::from_be_bytes([rec[0], rec[1], rec[2], rec[3]]);
        self.tag(index, crc)
            .verify_slice(&rec[4..])
            .is_ok()
            .then_some(crc)
    }
}

impl Identity {
    /// How many chunks the file has.
    pub fn chunks(&self) -> u64 {
        // chunk_len is never 0 in a header read back (see `read_header`).
        self.size.div_ceil(u64::from(self.chunk_len.max(1)))
    }
}

/// Reads a sidecar's header from `r` (and nothing past it): the identity
/// it records, if intact and tagged with `key`.
pub(crate) fn read_header(
    r: &mut impl std::io::Read,
    key: &SidecarKey,
) -> Result<Identity, SidecarError> {
    let damaged = SidecarError::Damaged;
    let mut fixed = [0u8; HEADER_FIXED];
    read_all(r, &mut fixed, "not a partial-file record")?;
    if &fixed[..MAGIC.len()] == UNKEYED_MAGIC {
        return Err(SidecarError::Unkeyed);
    }
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
    let mut tag = [0u8; TAG_LEN];
    read_all(r, &mut tag, "short header")?;
    if !key.verify(&[HEADER_DOMAIN, &fixed, &name], &tag) {
        return Err(SidecarError::Forged);
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
/// the first torn, damaged or forged one (whose tag does not check under
/// `key`).
pub(crate) fn read_records(
    r: &mut impl std::io::Read,
    max: u64,
    key: &RecordsKey,
) -> std::io::Result<Vec<u32>> {
    let mut crcs = Vec::new();
    let mut rec = [0u8; RECORD_LEN];
    for index in 0..max {
        match r.read_exact(&mut rec) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(e),
        }
        let Some(crc) = key.checks(index, &rec) else {
            break;
        };
        crcs.push(crc);
    }
    Ok(crcs)
}

impl Sidecar {
    /// Reads a sidecar: its header must be intact; its records count up to
    /// the first torn or damaged one, and never past the file's last chunk.
    /// (`find` streams the same from the file.)
    #[cfg(test)]
    pub fn decode(bytes: &[u8], key: &SidecarKey) -> Result<Self, SidecarError> {
        let mut r = bytes;
        let identity = read_header(&mut r, key)?;
        let crcs = read_records(&mut r, identity.chunks(), &identity.records_key(key))?;
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
pub(crate) fn partial_names(leaf: &str) -> (String, String) {
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

    fn key() -> SidecarKey {
        SidecarKey::for_tests(1)
    }

    fn sidecar_bytes(id: &Identity, crcs: &[u32]) -> Vec<u8> {
        let mut b = id.header(&key());
        let records = id.records_key(&key());
        for (i, c) in crcs.iter().enumerate() {
            b.extend_from_slice(&records.record(i as u64, *c));
        }
        b
    }

    fn decode(bytes: &[u8]) -> Result<Sidecar, SidecarError> {
        Sidecar::decode(bytes, &key())
    }

    #[test]
    fn a_sidecar_reads_back_what_was_written() {
        let id = identity();
        let crcs: Vec<u32> = (0..7).map(|i| 0xabc0_0000 + i).collect();
        let s = decode(&sidecar_bytes(&id, &crcs)).unwrap();
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
        let records = id.records_key(&key());
        b.extend_from_slice(&records.record(4, 5)[..5]);
        assert_eq!(decode(&b).unwrap().crcs, crcs);
        // A flipped bit in record 2: the prefix is records 0 and 1.
        let at = b.len() - 5 - 2 * RECORD_LEN + 1;
        b[at] ^= 0x10;
        assert_eq!(decode(&b).unwrap().crcs, [1, 2]);
        // Records in the wrong order do not check.
        let mut swapped = id.header(&key());
        swapped.extend_from_slice(&records.record(1, 2));
        swapped.extend_from_slice(&records.record(0, 1));
        assert_eq!(decode(&swapped).unwrap().crcs, Vec::<u32>::new());
    }

    #[test]
    fn a_damaged_header_makes_the_sidecar_unusable() {
        let b = sidecar_bytes(&identity(), &[1, 2]);
        for at in 0..identity().header(&key()).len() {
            let mut d = b.clone();
            d[at] ^= 0x01;
            assert!(decode(&d).is_err(), "byte {at}");
        }
        for cut in 0..identity().header(&key()).len() {
            assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        assert!(decode(b"").is_err());
    }

    #[test]
    fn records_count_only_under_the_key_and_header_they_were_written_with() {
        let id = identity();
        let crcs = [1u32, 2, 3];
        let good = sidecar_bytes(&id, &crcs);
        assert_eq!(decode(&good).unwrap().crcs, crcs);
        // Another directory's key: the whole sidecar is refused.
        let other = SidecarKey::for_tests(2);
        assert!(matches!(
            Sidecar::decode(&good, &other),
            Err(SidecarError::Forged)
        ));
        // Forged by someone without the key: the header as the unkeyed
        // format computed its check, under the keyed magic.
        let mut forged = good[..HEADER_FIXED + id.name.len()].to_vec();
        let crc = crc32fast::hash(&forged);
        forged.extend_from_slice(&crc.to_be_bytes());
        forged.resize(id.header_len() as usize, 0);
        assert!(matches!(decode(&forged), Err(SidecarError::Forged)));
        // Records of another header (another source, same name) do not
        // count under this one.
        let moved = Identity {
            size: id.size + 1,
            ..identity()
        };
        let mut mixed = id.header(&key());
        let theirs = moved.records_key(&key());
        for (i, c) in crcs.iter().enumerate() {
            mixed.extend_from_slice(&theirs.record(i as u64, *c));
        }
        assert_eq!(decode(&mixed).unwrap().crcs, Vec::<u32>::new());
        // A sidecar of the older, unkeyed format: never used.
        let mut old = good.clone();
        old[..8].copy_from_slice(UNKEYED_MAGIC);
        assert!(matches!(decode(&old), Err(SidecarError::Unkeyed)));
    }

    #[test]
    fn the_prefix_never_covers_the_last_chunk() {
        // 1037 bytes in chunks of 100: 10 whole chunks and a short one.
        let id = identity();
        let all: Vec<u32> = (0..11).collect();
        let s = decode(&sidecar_bytes(&id, &all)).unwrap();
        assert_eq!(s.prefix_chunks(), 10);
        // 1000 bytes: 10 whole chunks, the last of them is the file's end.
        let even = Identity {
            size: 1000,
            ..identity()
        };
        let s = decode(&sidecar_bytes(&even, &all)).unwrap();
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
