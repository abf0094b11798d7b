//! Test-only fault injection, compiled only with the cargo feature
//! `fault-injection` (never in release builds). The fault tests set
//! `RDMA_XFER_FAULT` to make a tool misbehave in one precise way:
//!
//! - `corrupt-chunk:N` — the sender flips one byte of chunk N after its CRC
//!   was computed, as a bit error the transport did not catch would.
//! - `forge-chunk:N` — the sender replaces chunk N's bytes after its
//!   checksums and tag were computed, and gives the new bytes their own
//!   CRC32: what an on-path injector that knows the ring's rkey and the
//!   queue pair's numbers (they travel in the clear) can write. Only the
//!   chunk's tag (with a token) tells.
//! - `handshake-pool:N` — the receiver's pool of handshakes holds N places
//!   (instead of 32), so that a test fills it with a few connections.
//! - `fail-write:OFFSET` — the receiver's writer threads fail (EIO) the
//!   write of the chunk that starts at byte OFFSET of its file.
//! - `corrupt-digest` — the sender flips one bit of every whole-file digest
//!   it sends in a FIN: every chunk passes its CRC, the file fails the
//!   whole-file check (the one path no chunk fault reaches).

use std::sync::OnceLock;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    CorruptChunk(u64),
    ForgeChunk(u64),
    HandshakePool(usize),
    FailWrite(u64),
    CorruptDigest,
}

fn fault() -> Fault {
    static FAULT: OnceLock<Fault> = OnceLock::new();
    *FAULT.get_or_init(|| {
        let spec = std::env::var("RDMA_XFER_FAULT").unwrap_or_default();
        let fault = parse(&spec);
        if fault != Fault::None {
            tracing::warn!("fault injection active: {spec}");
        }
        fault
    })
}

fn parse(spec: &str) -> Fault {
    match spec.split_once(':') {
        Some(("corrupt-chunk", n)) => n.parse().map_or(Fault::None, Fault::CorruptChunk),
        Some(("forge-chunk", n)) => n.parse().map_or(Fault::None, Fault::ForgeChunk),
        Some(("handshake-pool", n)) => n.parse().map_or(Fault::None, Fault::HandshakePool),
        Some(("fail-write", n)) => n.parse().map_or(Fault::None, Fault::FailWrite),
        None if spec == "corrupt-digest" => Fault::CorruptDigest,
        _ => Fault::None,
    }
}

/// The bytes a forged chunk carries: "FORGED" over and over.
pub const FORGED: &[u8] = b"FORGED";

/// Called by the sender's reader with each chunk (and its CRC32, the
/// write's immediate) after its checksums and tag.
pub fn after_checksum(seq: u64, data: &mut [u8], crc: &mut u32) {
    match fault() {
        Fault::CorruptChunk(n) if n == seq => {
            if let Some(b) = data.get_mut(data.len() / 2) {
                *b ^= 0x5a;
            }
        }
        Fault::ForgeChunk(n) if n == seq => {
            for (b, f) in data.iter_mut().zip(FORGED.iter().cycle()) {
                *b = *f;
            }
            *crc = crc32fast::hash(data);
        }
        _ => {}
    }
}

/// Called by the sender with each whole-file digest it puts in a FIN.
pub fn fin_digest(digest: crate::proto::Digest) -> crate::proto::Digest {
    use crate::proto::Digest;
    if fault() != Fault::CorruptDigest {
        return digest;
    }
    match digest {
        Digest::Crc32(c) => Digest::Crc32(c ^ 1),
        Digest::Sha256(mut h) => {
            h[0] ^= 1;
            Digest::Sha256(h)
        }
    }
}

/// Whether a writer thread is to fail the write of the chunk at `offset`.
pub fn fails_write(offset: u64) -> bool {
    fault() == Fault::FailWrite(offset)
}

/// The receiver's handshake pool size: `default` unless a test says.
pub fn handshake_pool(default: usize) -> usize {
    match fault() {
        Fault::HandshakePool(n) => n,
        _ => default,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_corrupt_chunk_switch() {
        assert_eq!(parse("corrupt-chunk:3"), Fault::CorruptChunk(3));
        assert_eq!(parse("corrupt-chunk:x"), Fault::None);
        assert_eq!(parse("forge-chunk:1"), Fault::ForgeChunk(1));
        assert_eq!(parse(""), Fault::None);
        assert_eq!(parse("other:1"), Fault::None);
        assert_eq!(parse("handshake-pool:4"), Fault::HandshakePool(4));
        assert_eq!(parse("fail-write:65536"), Fault::FailWrite(65536));
        assert_eq!(parse("corrupt-digest"), Fault::CorruptDigest);
    }
}
