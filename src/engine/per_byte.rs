//! The work each side does for every byte, one function a side, so that
//! `make bench-native` (benches/per_byte.rs) times the code the tools run:
//! the sender's reader thread calls `fill_chunk`, the receiver's session
//! `receive_chunk`; with a token, `tag_chunk` and the tag check in
//! `receive_chunk` too. What else a chunk costs (posting, completions,
//! credits) is paid per chunk, not per byte.

use super::digest::FileHasher;
use crate::proto::{CHUNK_TAG_LEN, ChunkAuth};
use crate::sys::SysError;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The sender's work on one chunk: reads `chunk.len()` bytes of `file` at
/// `offset` into `chunk` (a staging slot) and checksums them
/// (`checksum_chunk`; a lane's chunks go into no whole-file digest here:
/// their CRCs are combined later). A file that ends before the chunk does
/// gives `UnexpectedEof`.
pub fn fill_chunk(
    file: &File,
    offset: u64,
    chunk: &mut [u8],
    hasher: Option<&mut FileHasher>,
) -> std::io::Result<u32> {
    file.read_exact_at(chunk, offset)?;
    Ok(match hasher {
        Some(hasher) => checksum_chunk(chunk, hasher),
        None => crc32fast::hash(chunk),
    })
}

/// A chunk's CRC32 (the immediate data of its write), added to the
/// whole-file digest too.
pub fn checksum_chunk(chunk: &[u8], hasher: &mut FileHasher) -> u32 {
    let crc = crc32fast::hash(chunk);
    hasher.update(chunk, crc);
    crc
}

/// With a token: writes the tag of `data` (the chunk at `offset` of the
/// offer `auth` names) into `tag`, the slot's bytes right after the chunk,
/// so that one write carries both. Without a token there is no tag.
pub fn tag_chunk(auth: Option<&ChunkAuth>, offset: u64, data: &[u8], tag: &mut [u8]) {
    // Staging slots have room for a tag whenever the session has a key (a
    // missing tag would still be refused by the receiver).
    debug_assert!(auth.is_none() || tag.len() >= CHUNK_TAG_LEN);
    if let (Some(auth), Some(space)) = (auth, tag.get_mut(..CHUNK_TAG_LEN)) {
        space.copy_from_slice(&auth.tag(offset, data));
    }
}

/// A chunk's tag as copied out of the ring, with what checks it.
pub struct TagCheck<'a> {
    pub auth: &'a ChunkAuth,
    /// The chunk's offset in its offer's data.
    pub offset: u64,
    pub tag: [u8; CHUNK_TAG_LEN],
}

/// Why the receiver did not store a chunk.
#[derive(Debug)]
pub enum ChunkRefused<E> {
    /// It could not be copied out of the ring.
    Copy(SysError),
    /// Its bytes do not have the CRC32 the sender sent; nothing was written.
    Crc { computed: u32 },
    /// Its bytes (with a token) do not have the tag that came with them:
    /// someone without the key wrote them; nothing was written.
    Forged,
    /// The sink did not take it.
    Write(E),
}

/// The block the receiver copies out of the ring and checksums before the
/// next: small enough to stay in the core's cache between the two, so the
/// checksum does not read the copy back from memory (on the build host,
/// whose L3 holds a whole chunk, one pass and two measure the same:
/// docs/performance.md).
pub const COPY_BLOCK: usize = 64 << 10;

/// Copies a chunk out of the ring into `chunk` and computes its CRC32 in
/// one pass, `COPY_BLOCK` bytes at a time: `copy_out(at, block)` copies
/// the chunk's bytes from `at` on into `block`.
pub fn copy_and_crc(
    mut copy_out: impl FnMut(usize, &mut [u8]) -> Result<(), SysError>,
    chunk: &mut [u8],
) -> Result<u32, SysError> {
    let mut crc = crc32fast::Hasher::new();
    for (i, block) in chunk.chunks_mut(COPY_BLOCK).enumerate() {
        copy_out(i * COPY_BLOCK, block)?;
        crc.update(block);
    }
    Ok(crc.finalize())
}

/// The receiver's work on one chunk: `copy_out` copies it out of the ring
/// into `chunk` (the private copy that is checked, written and hashed, so
/// what is verified is what is written; `copy_and_crc`), its CRC32 is
/// checked against `expected_crc` and, with a token, its tag (`tag`,
/// copied out of the ring before), `write` stores it (given the bytes and
/// their CRC32), and it is added to the whole-file digest, if one is kept
/// here (a lane's chunks are combined by CRC later). No byte reaches
/// `write` unchecked. Returns the chunk's CRC32.
pub fn receive_chunk<E>(
    copy_out: impl FnMut(usize, &mut [u8]) -> Result<(), SysError>,
    chunk: &mut [u8],
    expected_crc: u32,
    tag: Option<&TagCheck<'_>>,
    write: impl FnOnce(&[u8], u32) -> Result<(), E>,
    hasher: Option<&mut FileHasher>,
) -> Result<u32, ChunkRefused<E>> {
    let crc = copy_and_crc(copy_out, chunk).map_err(ChunkRefused::Copy)?;
    if crc != expected_crc {
        return Err(ChunkRefused::Crc { computed: crc });
    }
    if let Some(t) = tag
        && !t.auth.verify(t.offset, chunk, &t.tag)
    {
        return Err(ChunkRefused::Forged);
    }
    write(chunk, crc).map_err(ChunkRefused::Write)?;
    if let Some(hasher) = hasher {
        hasher.update(chunk, crc);
    }
    Ok(crc)
}

/// Zeroed heap memory that starts on a page boundary: what O_DIRECT
/// writes from, and what registered memory is (on some CPUs, this host's
/// AMD EPYC among them, the kernel's copy from or into memory that is not
/// 64-byte aligned, as a `Vec`'s often is not, makes pread 2.5 times
/// slower).
pub struct PageAligned {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl PageAligned {
    pub const PAGE: usize = 4096;

    pub fn new(len: usize) -> PageAligned {
        let raw = vec![0u8; len + Self::PAGE];
        let start = (Self::PAGE - raw.as_ptr() as usize % Self::PAGE) % Self::PAGE;
        PageAligned { raw, start, len }
    }
}

impl std::ops::Deref for PageAligned {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
}

impl std::ops::DerefMut for PageAligned {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{Digest, DigestAlg};
    use std::io::Write;

    fn pattern(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i * 31 + i / 251) as u8).collect()
    }

    #[test]
    fn the_sender_fills_each_chunk_with_the_file_bytes_and_their_crc() {
        let data = pattern(2500);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&data).unwrap();
        let mut hasher = FileHasher::new(DigestAlg::Crc32);
        let mut slot = vec![0xeeu8; 1000];
        // Two full chunks, then the short last one.
        for (offset, len) in [(0u64, 1000usize), (1000, 1000), (2000, 500)] {
            let want = &data[offset as usize..offset as usize + len];
            let crc = fill_chunk(&file, offset, &mut slot[..len], Some(&mut hasher)).unwrap();
            assert_eq!(&slot[..len], want, "offset {offset}");
            assert_eq!(crc, crc32fast::hash(want), "offset {offset}");
        }
        assert_eq!(hasher.finish(), Digest::Crc32(crc32fast::hash(&data)));
        // A file shorter than the chunk (it shrank): an error, no CRC.
        let mut hasher = FileHasher::new(DigestAlg::Crc32);
        let e = fill_chunk(&file, 2000, &mut slot, Some(&mut hasher)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::UnexpectedEof);
        assert_eq!(hasher.finish(), Digest::Crc32(0));
    }

    #[test]
    fn the_receiver_writes_only_chunks_with_the_sent_crc_at_their_offset() {
        let ring = pattern(300);
        let slot = &ring[100..200];
        let file = tempfile::tempfile().unwrap();
        let mut chunk = vec![0u8; 100];
        let mut hasher = FileHasher::new(DigestAlg::Crc32);
        let copy = |at: usize, dst: &mut [u8]| {
            dst.copy_from_slice(&slot[at..at + dst.len()]);
            Ok(())
        };
        let write = |data: &[u8], _crc: u32| file.write_all_at(data, 4096);
        // The CRC the sender sent does not match: a typed error, nothing
        // written or hashed.
        let wrong = crc32fast::hash(slot) ^ 1;
        match receive_chunk(copy, &mut chunk, wrong, None, write, Some(&mut hasher)) {
            Err(ChunkRefused::Crc { computed }) => assert_eq!(computed, wrong ^ 1),
            other => panic!("expected a CRC mismatch, got {other:?}"),
        }
        assert_eq!(file.metadata().unwrap().len(), 0);
        // It matches: written at its offset, given its CRC, and hashed.
        let mut given = None;
        let write = |data: &[u8], crc: u32| {
            given = Some(crc);
            file.write_all_at(data, 4096)
        };
        receive_chunk(
            copy,
            &mut chunk,
            crc32fast::hash(slot),
            None,
            write,
            Some(&mut hasher),
        )
        .unwrap();
        assert_eq!(given, Some(crc32fast::hash(slot)));
        let mut back = vec![0u8; 4196];
        file.read_exact_at(&mut back, 0).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert_eq!(&back[4096..], slot);
        assert_eq!(hasher.finish(), Digest::Crc32(crc32fast::hash(slot)));
        assert_eq!(file.metadata().unwrap().len(), 4196);
    }

    #[test]
    fn one_pass_copies_every_block_and_its_crc_is_the_chunks() {
        // Two whole blocks and a part: each block copied from its offset.
        let slot = pattern(2 * COPY_BLOCK + 777);
        let mut chunk = vec![0u8; slot.len()];
        let mut asked = Vec::new();
        let crc = copy_and_crc(
            |at, dst| {
                asked.push((at, dst.len()));
                dst.copy_from_slice(&slot[at..at + dst.len()]);
                Ok(())
            },
            &mut chunk,
        )
        .unwrap();
        assert_eq!(chunk, slot);
        assert_eq!(crc, crc32fast::hash(&slot));
        assert_eq!(
            asked,
            [
                (0, COPY_BLOCK),
                (COPY_BLOCK, COPY_BLOCK),
                (2 * COPY_BLOCK, 777)
            ]
        );
        let aligned = PageAligned::new(5000);
        assert_eq!(aligned.as_ptr() as usize % PageAligned::PAGE, 0);
        assert_eq!(aligned.len(), 5000);
    }

    #[test]
    fn the_receiver_passes_on_copy_and_write_errors() {
        let mut chunk = vec![0u8; 10];
        let mut hasher = FileHasher::new(DigestAlg::Crc32);
        let no_copy = |_: usize, _: &mut [u8]| Err(SysError::Invalid("outside the ring".into()));
        let never = |_: &[u8], _: u32| -> Result<(), ()> { panic!("written") };
        let copied = receive_chunk(no_copy, &mut chunk, 0, None, never, Some(&mut hasher));
        assert!(matches!(copied, Err(ChunkRefused::Copy(_))));
        let zeros = |_: usize, dst: &mut [u8]| {
            dst.fill(0);
            Ok(())
        };
        let crc = crc32fast::hash(&chunk);
        let full = |_: &[u8], _: u32| Err("disk full");
        let written = receive_chunk(zeros, &mut chunk, crc, None, full, Some(&mut hasher));
        assert!(matches!(written, Err(ChunkRefused::Write("disk full"))));
        assert_eq!(hasher.finish(), Digest::Crc32(0));
    }

    #[test]
    fn with_a_token_only_chunks_with_their_tag_are_written() {
        let auth = ChunkAuth {
            key: crate::proto::ChunkKey::from_bytes([7; 32]),
            offer: 2,
        };
        // The sender's slot: the chunk, then its tag.
        let data = pattern(300);
        let mut slot = vec![0u8; 300 + CHUNK_TAG_LEN];
        slot[..300].copy_from_slice(&data);
        let (bytes, tag_space) = slot.split_at_mut(300);
        tag_chunk(Some(&auth), 4096, bytes, tag_space);
        let tag: [u8; CHUNK_TAG_LEN] = slot[300..].try_into().unwrap();
        assert_eq!(tag, auth.tag(4096, &data));
        // Without a token the space stays as it was.
        let mut untouched = [0u8; CHUNK_TAG_LEN];
        tag_chunk(None, 4096, &data, &mut untouched);
        assert_eq!(untouched, [0; CHUNK_TAG_LEN]);

        let mut chunk = vec![0u8; 300];
        let mut hasher = FileHasher::new(DigestAlg::Crc32);
        let mut written = Vec::new();
        // Forged: other bytes with their own, right CRC32 (the immediate is
        // not authenticated), under the sender's tag.
        let forged = pattern(301)[1..].to_vec();
        let copy_forged = |at: usize, dst: &mut [u8]| {
            dst.copy_from_slice(&forged[at..at + dst.len()]);
            Ok(())
        };
        let check = TagCheck {
            auth: &auth,
            offset: 4096,
            tag,
        };
        let got = receive_chunk(
            copy_forged,
            &mut chunk,
            crc32fast::hash(&forged),
            Some(&check),
            |d: &[u8], _| -> Result<(), ()> {
                written.extend_from_slice(d);
                Ok(())
            },
            Some(&mut hasher),
        );
        assert!(matches!(got, Err(ChunkRefused::Forged)), "{got:?}");
        assert!(written.is_empty());
        // The right bytes at another offset (replayed): refused too.
        let copy_right = |at: usize, dst: &mut [u8]| {
            dst.copy_from_slice(&data[at..at + dst.len()]);
            Ok(())
        };
        let moved = TagCheck {
            auth: &auth,
            offset: 0,
            tag,
        };
        let got = receive_chunk(
            copy_right,
            &mut chunk,
            crc32fast::hash(&data),
            Some(&moved),
            |d: &[u8], _| -> Result<(), ()> {
                written.extend_from_slice(d);
                Ok(())
            },
            Some(&mut hasher),
        );
        assert!(matches!(got, Err(ChunkRefused::Forged)));
        assert!(written.is_empty());
        assert_eq!(hasher.finish(), Digest::Crc32(0));
        // The sender's bytes at their place: written and hashed.
        let mut hasher = FileHasher::new(DigestAlg::Crc32);
        receive_chunk(
            copy_right,
            &mut chunk,
            crc32fast::hash(&data),
            Some(&check),
            |d: &[u8], _| -> Result<(), ()> {
                written.extend_from_slice(d);
                Ok(())
            },
            Some(&mut hasher),
        )
        .unwrap();
        assert_eq!(written, data);
        assert_eq!(hasher.finish(), Digest::Crc32(crc32fast::hash(&data)));
    }
}
