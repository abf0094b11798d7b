//! Whole-file digests, fed chunk by chunk in file order.

use crate::proto::{Digest, DigestAlg};
use sha2::{Digest as _, Sha256};

/// The CRC32 of chunks one after the other, from each chunk's CRC32 and
/// length in file order: what lanes that each checked some of a file's
/// chunks give as the whole file's.
pub fn crc32_of_chunks(chunks: impl IntoIterator<Item = (u32, u64)>) -> u32 {
    let mut whole = crc32fast::Hasher::new();
    for (crc, len) in chunks {
        whole.combine(&crc32fast::Hasher::new_with_initial_len(crc, len));
    }
    whole.finalize()
}

/// CRC32 is combined from the per-chunk CRCs that are computed anyway (for
/// the immediate data), so it costs no second pass over the bytes.
pub enum FileHasher {
    Crc32(crc32fast::Hasher),
    Sha256(Box<Sha256>),
}

impl FileHasher {
    pub fn new(alg: DigestAlg) -> Self {
        match alg {
            DigestAlg::Crc32 => FileHasher::Crc32(crc32fast::Hasher::new()),
            DigestAlg::Sha256 => FileHasher::Sha256(Box::new(Sha256::new())),
        }
    }

    /// Adds the next chunk; `chunk_crc` is crc32 of `data`.
    pub fn update(&mut self, data: &[u8], chunk_crc: u32) {
        match self {
            FileHasher::Crc32(h) => {
                h.combine(&crc32fast::Hasher::new_with_initial_len(
                    chunk_crc,
                    data.len() as u64,
                ));
            }
            FileHasher::Sha256(h) => h.update(data),
        }
    }

    pub fn finish(self) -> Digest {
        match self {
            FileHasher::Crc32(h) => Digest::Crc32(h.finalize()),
            FileHasher::Sha256(h) => Digest::Sha256(h.finalize().into()),
        }
    }
}

/// A file's first bytes read back in the chunks the transfer used.
pub struct PrefixRead {
    /// SHA-256 of the chunks' CRC32s (4 bytes each, big-endian, in
    /// order): what HAVE carries for a prefix.
    pub crc_digest: [u8; 32],
    /// The whole-file digest so far, to continue with the bytes after.
    pub hasher: FileHasher,
}

/// The most a hashing read asks of the file at once: a chunk (up to
/// 64 MiB) is read in pieces of this, each after a call to its `tick`,
/// so that a caller counting progress there (`Cancel::check`) sees some
/// at least every MiB, however large the chunks and short its --timeout.
pub const MAX_READ: usize = 1 << 20;

/// Fills `buf` from `file` at `offset` in reads of `MAX_READ` at most,
/// each after `tick` (which may stop the read with an error).
fn read_in_pieces(
    file: &std::fs::File,
    buf: &mut [u8],
    offset: u64,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    let mut at = offset;
    for piece in buf.chunks_mut(MAX_READ) {
        tick()?;
        file.read_exact_at(piece, at)?;
        at += piece.len() as u64;
    }
    Ok(())
}

/// Reads `file` from byte 0 up to `upto` (at most its end) in chunks of
/// `chunk_len`, computing each chunk's CRC32 and feeding the whole-file
/// hasher: what a sender compares with a HAVE, and what a receiver
/// continues a resumed file's digest with. `tick` runs before each read
/// of at most `MAX_READ` bytes and may stop the read with an error.
/// `each_chunk` sees every chunk (its index, bytes and CRC32) in order
/// (the receiver checks the CRCs against its records, or copies the
/// bytes) and may stop the read too. One chunk of memory, whatever the
/// size.
pub fn read_prefix(
    file: &std::fs::File,
    upto: u64,
    chunk_len: u32,
    alg: DigestAlg,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
    each_chunk: impl FnMut(u64, &[u8], u32) -> std::io::Result<()>,
) -> std::io::Result<PrefixRead> {
    let fill = |data: &mut [u8], offset: u64| read_in_pieces(file, data, offset, tick);
    read_prefix_from(upto, chunk_len, alg, fill, each_chunk)
}

/// `read_prefix` over any source: `fill` fills a buffer with the bytes
/// from an offset on (in order, from 0), or fails.
pub fn read_prefix_from(
    upto: u64,
    chunk_len: u32,
    alg: DigestAlg,
    mut fill: impl FnMut(&mut [u8], u64) -> std::io::Result<()>,
    mut each_chunk: impl FnMut(u64, &[u8], u32) -> std::io::Result<()>,
) -> std::io::Result<PrefixRead> {
    let mut hasher = FileHasher::new(alg);
    let mut crcs = Sha256::new();
    let mut buf = vec![0u8; chunk_len.max(1) as usize];
    let mut offset = 0u64;
    let mut index = 0u64;
    while offset < upto {
        let len = (upto - offset).min(u64::from(chunk_len.max(1))) as usize;
        let data = &mut buf[..len];
        fill(data, offset)?;
        let crc = crc32fast::hash(data);
        each_chunk(index, data, crc)?;
        hasher.update(data, crc);
        crcs.update(crc.to_be_bytes());
        offset += len as u64;
        index += 1;
    }
    Ok(PrefixRead {
        crc_digest: crcs.finalize().into(),
        hasher,
    })
}

/// SHA-256 of `file`'s first `upto` bytes (an error if it ends before),
/// read in chunks of `chunk_len` (one chunk of memory). `tick` runs before
/// each read of at most `MAX_READ` bytes and may stop the read with an
/// error.
pub fn read_sha256(
    file: &std::fs::File,
    upto: u64,
    chunk_len: u32,
    mut tick: impl FnMut() -> std::io::Result<()>,
) -> std::io::Result<[u8; 32]> {
    let mut sha = Sha256::new();
    let mut buf = vec![0u8; chunk_len.max(1) as usize];
    let mut offset = 0u64;
    while offset < upto {
        let len = (upto - offset).min(buf.len() as u64) as usize;
        let data = &mut buf[..len];
        read_in_pieces(file, data, offset, &mut tick)?;
        sha.update(&*data);
        offset += len as u64;
    }
    Ok(sha.finalize().into())
}

/// Human-readable form for logs and JSON.
pub fn digest_hex(d: &Digest) -> String {
    match d {
        Digest::Crc32(v) => format!("{v:08x}"),
        Digest::Sha256(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn combined_crc_equals_crc_of_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for chunk in [1usize, 7, 4096, 65536, 100_000] {
            let mut h = FileHasher::new(DigestAlg::Crc32);
            for c in data.chunks(chunk) {
                h.update(c, crc32fast::hash(c));
            }
            assert_eq!(
                h.finish(),
                Digest::Crc32(crc32fast::hash(&data)),
                "chunk {chunk}"
            );
            // The same from the chunks' CRCs and lengths alone (lanes).
            let crcs = data
                .chunks(chunk)
                .map(|c| (crc32fast::hash(c), c.len() as u64));
            assert_eq!(crc32_of_chunks(crcs), crc32fast::hash(&data));
        }
    }

    #[test]
    fn sha256_matches_one_shot() {
        let data = b"hello rdma world".repeat(1000);
        let mut h = FileHasher::new(DigestAlg::Sha256);
        for c in data.chunks(333) {
            h.update(c, crc32fast::hash(c));
        }
        let want: [u8; 32] = Sha256::digest(&data).into();
        assert_eq!(h.finish(), Digest::Sha256(want));
    }

    #[test]
    fn a_prefix_reads_back_as_the_transfer_chunked_it() {
        use std::io::Write;
        let data: Vec<u8> = (0..1037u32).map(|i| (i * 13) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let mut seen = Vec::new();
        let p = read_prefix(
            &f,
            300,
            100,
            DigestAlg::Sha256,
            &mut || Ok(()),
            |i, _, crc| {
                seen.push((i, crc));
                Ok(())
            },
        )
        .unwrap();
        let crcs: Vec<u32> = data[..300].chunks(100).map(crc32fast::hash).collect();
        assert_eq!(seen, vec![(0, crcs[0]), (1, crcs[1]), (2, crcs[2])]);
        let mut want = Sha256::new();
        for c in &crcs {
            want.update(c.to_be_bytes());
        }
        assert_eq!(p.crc_digest, <[u8; 32]>::from(want.finalize()));
        // The hasher continues with the rest: the whole file's digest.
        let mut h = p.hasher;
        for c in data[300..].chunks(100) {
            h.update(c, crc32fast::hash(c));
        }
        let whole: [u8; 32] = Sha256::digest(&data).into();
        assert_eq!(h.finish(), Digest::Sha256(whole));
        // The whole file, its last chunk short, with CRC32.
        let all = read_prefix(
            &f,
            1037,
            100,
            DigestAlg::Crc32,
            &mut || Ok(()),
            |_, _, _| Ok(()),
        );
        let all = all.unwrap();
        assert_eq!(all.hasher.finish(), Digest::Crc32(crc32fast::hash(&data)));
        // Past the end: an error, not a shorter digest.
        let past = read_prefix(
            &f,
            2000,
            100,
            DigestAlg::Crc32,
            &mut || Ok(()),
            |_, _, _| Ok(()),
        );
        assert!(past.is_err());
        // The callback can stop the read.
        let stop = read_prefix(&f, 300, 100, DigestAlg::Crc32, &mut || Ok(()), |i, _, _| {
            if i == 1 {
                Err(std::io::Error::other("record mismatch"))
            } else {
                Ok(())
            }
        });
        assert!(stop.is_err());
    }

    #[test]
    fn a_files_sha256_reads_in_chunks_and_can_be_stopped() {
        use std::io::Write;
        let data: Vec<u8> = (0..1037u32).map(|i| (i * 31) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let mut ticks = 0;
        let sha = read_sha256(&f, 1037, 100, || {
            ticks += 1;
            Ok(())
        })
        .unwrap();
        let want: [u8; 32] = Sha256::digest(&data).into();
        assert_eq!((sha, ticks), (want, 11));
        // Past the end: an error, not a shorter digest.
        assert!(read_sha256(&f, 2000, 100, || Ok(())).is_err());
        let mut ticks = 0;
        let stopped = read_sha256(&f, 1037, 100, || {
            ticks += 1;
            if ticks == 3 {
                Err(std::io::Error::other("stop"))
            } else {
                Ok(())
            }
        });
        assert!(stopped.is_err());
    }

    #[test]
    fn a_large_chunk_is_read_in_pieces_of_a_mib_each_after_a_tick() {
        use std::io::Write;
        // One chunk of 3 MiB and a byte: four reads, four ticks.
        let len = 3 * MAX_READ + 1;
        let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&data).unwrap();
        let chunk = len as u32;
        let mut ticks = 0;
        let sha = read_sha256(&f, len as u64, chunk, || {
            ticks += 1;
            Ok(())
        })
        .unwrap();
        let want: [u8; 32] = Sha256::digest(&data).into();
        assert_eq!((sha, ticks), (want, 4));
        let mut ticks = 0;
        let mut chunks = 0;
        let mut tick = || {
            ticks += 1;
            Ok(())
        };
        let read = read_prefix(
            &f,
            len as u64,
            chunk,
            DigestAlg::Sha256,
            &mut tick,
            |_, d, _| {
                chunks += 1;
                assert_eq!(d.len(), len);
                Ok(())
            },
        )
        .unwrap();
        assert_eq!((ticks, chunks), (4, 1));
        assert_eq!(read.hasher.finish(), Digest::Sha256(want));
        // A tick stops the read within the chunk.
        let mut ticks = 0;
        let stopped = read_sha256(&f, len as u64, chunk, || {
            ticks += 1;
            if ticks == 2 {
                return Err(std::io::Error::other("stop"));
            }
            Ok(())
        });
        assert!(stopped.is_err());
        assert_eq!(ticks, 2);
    }

    #[test]
    fn empty_file_digests() {
        assert_eq!(FileHasher::new(DigestAlg::Crc32).finish(), Digest::Crc32(0));
        assert_eq!(
            digest_hex(&FileHasher::new(DigestAlg::Sha256).finish()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
