//! Whole-file digests, fed chunk by chunk in file order.

use crate::proto::{Digest, DigestAlg};
use sha2::{Digest as _, Sha256};

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
    fn empty_file_digests() {
        assert_eq!(FileHasher::new(DigestAlg::Crc32).finish(), Digest::Crc32(0));
        assert_eq!(
            digest_hex(&FileHasher::new(DigestAlg::Sha256).finish()),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
