//! Authentication with a shared token (protocol 3).
//!
//! Handshake: the receiver's CHALLENGE carries a fresh nonce (`nonce_r`);
//! the sender answers with PROVE(`nonce_s`, `proof_s`); the receiver checks
//! it and answers AUTH_OK(`proof_r`), which the sender checks before it
//! sends any HELLO. Both proofs are MACs under a session key `K` derived
//! (HKDF-SHA256) from the token, both nonces and what identifies this
//! connection (both addresses and QP numbers, in fixed receiver / sender
//! order), so a proof made on one connection is useless on another.
//! Afterwards every control message travels sealed ([`Channel`]): a MAC under
//! a per-direction key derived from `K`, over a sequence number and the
//! frame. The file data, written one-sided into the receiver's ring, is
//! authenticated too: every chunk carries a tag ([`ChunkKey`]: keyed
//! BLAKE3 under a key derived from `K`, over the offer's number in the
//! session, the chunk's offset and its bytes), checked on the receiver's
//! private copy before any byte is used. Pure computation; the engine
//! supplies the nonces (OS RNG), the token and the connection's identity.
//!
//! The protocol-2 AUTH MAC ([`Token::mac`]) is kept only so that tests can
//! play an old sender.

use std::fmt;
use std::net::IpAddr;

use hkdf::Hkdf;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use thiserror::Error;
use zeroize::Zeroize;

/// Domain separation of the protocol-2 AUTH MAC (see [`Token::mac`]).
pub const AUTH_CONTEXT: &[u8] = b"rdma-xfer auth v1\0";
/// HKDF info prefix of the session key (the transcript follows).
pub const SESSION_INFO: &[u8] = b"rdma-xfer v3 session key\0";
/// What the sender's proof is a MAC of (under the session key).
pub const SENDER_PROOF_LABEL: &[u8] = b"rdma-xfer v3 sender proof\0";
/// What the receiver's proof is a MAC of (under the session key).
pub const RECEIVER_PROOF_LABEL: &[u8] = b"rdma-xfer v3 receiver proof\0";
/// HKDF info of the key sealing sender -> receiver messages.
pub const SENDER_TO_RECEIVER_LABEL: &[u8] = b"rdma-xfer v3 sender to receiver\0";
/// HKDF info of the key sealing receiver -> sender messages.
pub const RECEIVER_TO_SENDER_LABEL: &[u8] = b"rdma-xfer v3 receiver to sender\0";
/// HKDF info of the key of the chunks' tags (sender -> receiver data).
pub const CHUNK_KEY_LABEL: &[u8] = b"rdma-xfer v5 chunk tags\0";
/// Length of a chunk's tag, written right after its bytes.
pub const CHUNK_TAG_LEN: usize = 32;
/// Length of each side's nonce.
pub const NONCE_LEN: usize = 32;
/// Length of an HMAC-SHA256 tag (proofs and seals).
pub const MAC_LEN: usize = 32;
/// Bytes a sealed frame carries after the frame: sequence number and tag.
pub const SEAL_LEN: usize = 8 + MAC_LEN;
/// Shortest token the tools accept (the CLI refuses shorter ones): with
/// fewer bytes a recorded proof could be brute-forced offline.
pub const MIN_TOKEN_LEN: usize = 16;
/// CHALLENGE flag: the sender must prove the token before anything else.
pub const AUTH_REQUIRED: u16 = 1;
/// Every CHALLENGE flag this build understands.
pub const CHALLENGE_FLAGS_KNOWN: u16 = AUTH_REQUIRED;

type HmacSha256 = Hmac<Sha256>;

/// The shared secret. Its bytes are wiped when it drops and never appear
/// in `Debug` output.
#[derive(Clone)]
pub struct Token {
    secret: Vec<u8>,
}

impl Token {
    /// None for an empty secret (which would authenticate nothing). The
    /// minimum length is the CLI's to enforce ([`MIN_TOKEN_LEN`]).
    pub fn new(secret: Vec<u8>) -> Option<Self> {
        if secret.is_empty() {
            None
        } else {
            Some(Token { secret })
        }
    }

    /// A secret of `N` bytes, never empty: `N` is checked when this is
    /// compiled. Borrowed, so that the caller's copy is the only one
    /// left to wipe.
    pub fn from_array<const N: usize>(secret: &[u8; N]) -> Self {
        const { assert!(N > 0, "an empty secret authenticates nothing") };
        Token {
            secret: secret.to_vec(),
        }
    }

    /// The secret's length in bytes.
    pub fn len(&self) -> usize {
        self.secret.len()
    }

    /// Never true (an empty token cannot be built); for clippy's taste.
    pub fn is_empty(&self) -> bool {
        self.secret.is_empty()
    }

    fn keyed(&self) -> HmacSha256 {
        // HMAC accepts keys of any length, so this never fails; an empty
        // key (impossible here) would still give a valid state.
        <HmacSha256 as KeyInit>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| <HmacSha256 as KeyInit>::new(&Default::default()))
    }

    /// HMAC state over `parts`, concatenated.
    fn over(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.keyed();
        for p in parts {
            mac.update(p);
        }
        mac
    }

    /// The protocol-2 AUTH answer, HMAC-SHA256(key = token, data =
    /// `AUTH_CONTEXT || nonce`). Protocol 3 does not use it; the hostile
    /// tests do, to play an old sender.
    pub fn mac(&self, nonce: &[u8; NONCE_LEN]) -> [u8; MAC_LEN] {
        self.over(&[AUTH_CONTEXT, nonce])
            .finalize()
            .into_bytes()
            .into()
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        // Volatile writes over the whole allocation: not elided.
        self.secret.zeroize();
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// What identifies one connection, as both ends see it: the receiver's and
/// the sender's IP address and QP number. Each side fills in its local and
/// its peer's values, so both compute the same transcript.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConnectionId {
    /// The receiver's address.
    pub receiver_addr: IpAddr,
    /// The receiver's QP number.
    pub receiver_qpn: u32,
    /// The sender's address.
    pub sender_addr: IpAddr,
    /// The sender's QP number.
    pub sender_qpn: u32,
}

/// An address as the transcript carries it: an IPv4-mapped IPv6 address
/// counts as the IPv4 address (one side may see either form), then a
/// family byte (4 or 6) and the address bytes.
fn put_addr(out: &mut Vec<u8>, addr: IpAddr) {
    match addr.to_canonical() {
        IpAddr::V4(a) => {
            out.push(4);
            out.extend_from_slice(&a.octets());
        }
        IpAddr::V6(a) => {
            out.push(6);
            out.extend_from_slice(&a.octets());
        }
    }
}

/// The transcript both sides derive the session key from: protocol
/// version (u16), nonce_r, nonce_s, receiver address, receiver QPN (u32),
/// sender address, sender QPN (u32); integers big-endian.
pub fn transcript(
    nonce_r: &[u8; NONCE_LEN],
    nonce_s: &[u8; NONCE_LEN],
    conn: &ConnectionId,
) -> Vec<u8> {
    let mut t = Vec::with_capacity(2 + 2 * NONCE_LEN + 2 * (17 + 4));
    t.extend_from_slice(&super::PROTOCOL_VERSION.to_be_bytes());
    t.extend_from_slice(nonce_r);
    t.extend_from_slice(nonce_s);
    put_addr(&mut t, conn.receiver_addr);
    t.extend_from_slice(&conn.receiver_qpn.to_be_bytes());
    put_addr(&mut t, conn.sender_addr);
    t.extend_from_slice(&conn.sender_qpn.to_be_bytes());
    t
}

/// The session key K of one connection and what is derived from it.
#[derive(Clone)]
pub struct SessionKey {
    key: [u8; MAC_LEN],
}

impl SessionKey {
    /// K = HKDF-SHA256(salt = nonce_r || nonce_s, IKM = token, info =
    /// `SESSION_INFO || transcript`, 32 bytes).
    pub fn derive(
        token: &Token,
        nonce_r: &[u8; NONCE_LEN],
        nonce_s: &[u8; NONCE_LEN],
        conn: &ConnectionId,
    ) -> Self {
        let mut salt = [0u8; 2 * NONCE_LEN];
        salt[..NONCE_LEN].copy_from_slice(nonce_r);
        salt[NONCE_LEN..].copy_from_slice(nonce_s);
        let hk = Hkdf::<Sha256>::new(Some(&salt), &token.secret);
        let t = transcript(nonce_r, nonce_s, conn);
        let mut key = [0u8; MAC_LEN];
        // 32 bytes is far below HKDF's limit (255 * 32), so this never fails.
        let _ = hk.expand_multi_info(&[SESSION_INFO, &t], &mut key);
        SessionKey { key }
    }

    fn mac(&self, label: &[u8]) -> HmacSha256 {
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.key)
            .unwrap_or_else(|_| <HmacSha256 as KeyInit>::new(&Default::default()));
        m.update(label);
        m
    }

    /// The sender's proof: HMAC-SHA256(K, `SENDER_PROOF_LABEL`).
    pub fn sender_proof(&self) -> [u8; MAC_LEN] {
        self.mac(SENDER_PROOF_LABEL).finalize().into_bytes().into()
    }

    /// The receiver's proof: HMAC-SHA256(K, `RECEIVER_PROOF_LABEL`).
    pub fn receiver_proof(&self) -> [u8; MAC_LEN] {
        self.mac(RECEIVER_PROOF_LABEL)
            .finalize()
            .into_bytes()
            .into()
    }

    /// Constant-time check of a sender's proof (any other length fails).
    pub fn verify_sender(&self, proof: &[u8]) -> bool {
        self.mac(SENDER_PROOF_LABEL).verify_slice(proof).is_ok()
    }

    /// Constant-time check of a receiver's proof (any other length fails).
    pub fn verify_receiver(&self, proof: &[u8]) -> bool {
        self.mac(RECEIVER_PROOF_LABEL).verify_slice(proof).is_ok()
    }

    /// HKDF-Expand(PRK = K, info = `label`, 32 bytes).
    fn direction_key(&self, label: &[u8]) -> [u8; MAC_LEN] {
        let mut out = [0u8; MAC_LEN];
        if let Ok(hk) = Hkdf::<Sha256>::from_prk(&self.key) {
            // 32 bytes: never fails.
            let _ = hk.expand(label, &mut out);
        }
        out
    }

    /// The key of the chunks' tags (data flows from sender to receiver
    /// only).
    pub fn chunk_key(&self) -> ChunkKey {
        ChunkKey {
            key: self.direction_key(CHUNK_KEY_LABEL),
        }
    }

    /// The sealing channel of one side: it seals with its own direction's
    /// key and opens with the other's.
    pub fn channel(&self, role: Role) -> Channel {
        let s2r = self.direction_key(SENDER_TO_RECEIVER_LABEL);
        let r2s = self.direction_key(RECEIVER_TO_SENDER_LABEL);
        let (send, recv) = match role {
            Role::Sender => (s2r, r2s),
            Role::Receiver => (r2s, s2r),
        };
        Channel {
            send_key: send,
            recv_key: recv,
            send_seq: 0,
            recv_seq: 0,
        }
    }
}

impl Drop for SessionKey {
    fn drop(&mut self) {
        self.key.fill(0);
        std::hint::black_box(&self.key);
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SessionKey(<redacted>)")
    }
}

/// The key that authenticates the file data of one session: each chunk's
/// tag is BLAKE3 in keyed mode over the offer's number in the session
/// (every HELLO or BATCH counts, from 1), the chunk's offset in the
/// offer's data and the chunk's bytes. So a tag is good for those bytes
/// at that place of that offer of that session only: bytes written into
/// the ring by anyone without the key, or replayed from another place,
/// fail. Wiped on drop, redacted in `Debug`.
#[derive(Clone)]
pub struct ChunkKey {
    key: [u8; 32],
}

impl ChunkKey {
    /// The tag of `data` at byte `offset` of offer number `offer`.
    pub fn tag(&self, offer: u64, offset: u64, data: &[u8]) -> [u8; CHUNK_TAG_LEN] {
        *self.hash(offer, offset, data).as_bytes()
    }

    /// Constant-time check of `tag` (blake3's `Hash` compares in constant
    /// time).
    pub fn verify(&self, offer: u64, offset: u64, data: &[u8], tag: &[u8; CHUNK_TAG_LEN]) -> bool {
        self.hash(offer, offset, data) == blake3::Hash::from_bytes(*tag)
    }

    /// Keyed BLAKE3 over offer ‖ offset ‖ data (integers big-endian).
    fn hash(&self, offer: u64, offset: u64, data: &[u8]) -> blake3::Hash {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(&offer.to_be_bytes());
        h.update(&offset.to_be_bytes());
        h.update(data);
        h.finalize()
    }

    /// A key from raw bytes: for the benchmarks and tests only (sessions
    /// derive theirs with [`SessionKey::chunk_key`]).
    pub fn from_bytes(key: [u8; 32]) -> Self {
        Self { key }
    }
}

impl Drop for ChunkKey {
    fn drop(&mut self) {
        self.key.fill(0);
        std::hint::black_box(&self.key);
    }
}

/// In constant time (for tests of the machines' placements; the tools
/// never compare keys).
impl PartialEq for ChunkKey {
    fn eq(&self, other: &Self) -> bool {
        blake3::Hash::from_bytes(self.key) == blake3::Hash::from_bytes(other.key)
    }
}

impl Eq for ChunkKey {}

impl fmt::Debug for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChunkKey(<redacted>)")
    }
}

/// What a chunk of the current offer is authenticated with: the session's
/// [`ChunkKey`] and the offer's number. Handed out by the machines with
/// each offer (sender) and each chunk placement (receiver).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkAuth {
    /// The session's key.
    pub key: ChunkKey,
    /// The offer's number in the session (from 1).
    pub offer: u64,
}

impl ChunkAuth {
    /// The tag of the chunk `data` at `offset` of this offer.
    pub fn tag(&self, offset: u64, data: &[u8]) -> [u8; CHUNK_TAG_LEN] {
        self.key.tag(self.offer, offset, data)
    }

    /// Whether `tag` is the tag of `data` at `offset` of this offer.
    pub fn verify(&self, offset: u64, data: &[u8], tag: &[u8; CHUNK_TAG_LEN]) -> bool {
        self.key.verify(self.offer, offset, data, tag)
    }
}

/// Which end of a session: whose key seals a message, and who sent what
/// in messages about the peer ("a control message from the receiver was
/// rejected").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// The side that sends files.
    Sender,
    /// The side that receives them.
    Receiver,
}

impl Role {
    /// The role's name, as the tools are named.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::Sender => "sender",
            Role::Receiver => "receiver",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a sealed control message was refused. Every one ends the session.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChannelError {
    /// Too short to hold a frame, a sequence number and a tag.
    #[error("sealed control message of {len} bytes is too short to carry its MAC")]
    Truncated {
        /// The message's length.
        len: usize,
    },
    /// The tag does not match: forged or altered (or sealed with another key).
    #[error("control message {seq} failed its MAC check: forged or altered")]
    BadTag {
        /// The sequence number it claims.
        seq: u64,
    },
    /// A genuine message seen before.
    #[error("control message {got} was replayed (expected {expected})")]
    Replayed {
        /// Its sequence number.
        got: u64,
        /// The one expected next.
        expected: u64,
    },
    /// A genuine message out of order (an earlier one is missing).
    #[error("control message {got} arrived out of order (expected {expected})")]
    OutOfOrder {
        /// Its sequence number.
        got: u64,
        /// The one expected next.
        expected: u64,
    },
    /// 2^64 messages in one direction (cannot happen in practice).
    #[error("control message sequence numbers exhausted")]
    Exhausted,
}

/// One side's sealing state after the handshake: frame -> frame || seq ||
/// HMAC-SHA256(direction key, seq || frame). Sequence numbers start at 0
/// in each direction and increase by one per message; RC delivers in
/// order, so exactly the next one is expected.
#[derive(Clone, PartialEq, Eq)]
pub struct Channel {
    send_key: [u8; MAC_LEN],
    recv_key: [u8; MAC_LEN],
    send_seq: u64,
    recv_seq: u64,
}

fn tag(key: &[u8; MAC_LEN], seq: u64, frame: &[u8]) -> HmacSha256 {
    let mut m = <HmacSha256 as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| <HmacSha256 as KeyInit>::new(&Default::default()));
    m.update(&seq.to_be_bytes());
    m.update(frame);
    m
}

impl Channel {
    /// Seals `frame` with the next sequence number of this direction.
    pub fn seal(&mut self, frame: &[u8]) -> Result<Vec<u8>, ChannelError> {
        let seq = self.send_seq;
        self.send_seq = seq.checked_add(1).ok_or(ChannelError::Exhausted)?;
        let mut out = Vec::with_capacity(frame.len() + SEAL_LEN);
        out.extend_from_slice(frame);
        out.extend_from_slice(&seq.to_be_bytes());
        out.extend_from_slice(&tag(&self.send_key, seq, frame).finalize().into_bytes());
        Ok(out)
    }

    /// Checks a sealed message from the peer (tag first, in constant time,
    /// then the sequence number) and returns its frame.
    pub fn open<'a>(&mut self, sealed: &'a [u8]) -> Result<&'a [u8], ChannelError> {
        let len = sealed.len();
        let frame_len = len
            .checked_sub(SEAL_LEN)
            .ok_or(ChannelError::Truncated { len })?;
        let (frame, trailer) = sealed.split_at(frame_len);
        let (seq_bytes, mac) = trailer.split_at(8);
        let mut seq_be = [0u8; 8];
        seq_be.copy_from_slice(seq_bytes);
        let seq = u64::from_be_bytes(seq_be);
        if tag(&self.recv_key, seq, frame).verify_slice(mac).is_err() {
            return Err(ChannelError::BadTag { seq });
        }
        let expected = self.recv_seq;
        if seq < expected {
            return Err(ChannelError::Replayed { got: seq, expected });
        }
        if seq > expected {
            return Err(ChannelError::OutOfOrder { got: seq, expected });
        }
        self.recv_seq = expected.checked_add(1).ok_or(ChannelError::Exhausted)?;
        Ok(frame)
    }

    /// Messages sealed so far (the next sequence number to send).
    pub fn sent(&self) -> u64 {
        self.send_seq
    }

    /// Messages opened so far (the next sequence number expected).
    pub fn received(&self) -> u64 {
        self.recv_seq
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        self.send_key.fill(0);
        self.recv_key.fill(0);
        std::hint::black_box((&self.send_key, &self.recv_key));
    }
}

impl fmt::Debug for Channel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Channel")
            .field("send_seq", &self.send_seq)
            .field("recv_seq", &self.recv_seq)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn token(s: &[u8]) -> Token {
        Token::new(s.to_vec()).unwrap()
    }

    fn nonce(seed: u8) -> [u8; NONCE_LEN] {
        std::array::from_fn(|i| seed.wrapping_add(i as u8))
    }

    #[test]
    fn rfc4231_test_case_2() {
        // Key "Jefe", data "what do ya want for nothing?".
        let want = unhex("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        let t = token(b"Jefe");
        let got = t
            .over(&[b"what do ya want for nothing?"])
            .finalize()
            .into_bytes();
        assert_eq!(got.as_slice(), want.as_slice());
        // Same data fed in pieces.
        let got = t
            .over(&[b"what do ya ", b"", b"want for nothing?"])
            .finalize()
            .into_bytes();
        assert_eq!(got.as_slice(), want.as_slice());
    }

    #[test]
    fn auth_mac_known_answers() {
        // Computed independently (Python hmac) over b"rdma-xfer auth v1\0" || nonce.
        assert_eq!(
            token(b"correct horse").mac(&nonce(0)).to_vec(),
            unhex("33f9a761e2a6d1e313ceaed36aaf525fd4c1c01f261f3e5917fe2e6dc79faeb7")
        );
        // A key longer than the SHA-256 block is hashed first.
        assert_eq!(
            token(&[b'k'; 200]).mac(&[0xff; NONCE_LEN]).to_vec(),
            unhex("a2935d4ddaa07c7a47b8d725b9e83d4e063fb0c9034bdd97950df95a8699e04f")
        );
    }

    fn conn(receiver: &str, rq: u32, sender: &str, sq: u32) -> ConnectionId {
        ConnectionId {
            receiver_addr: receiver.parse().unwrap(),
            receiver_qpn: rq,
            sender_addr: sender.parse().unwrap(),
            sender_qpn: sq,
        }
    }

    const TOK: &[u8] = b"correct horse battery staple";

    fn nonces() -> ([u8; NONCE_LEN], [u8; NONCE_LEN]) {
        (nonce(0), nonce(0x80))
    }

    #[test]
    fn key_schedule_known_answers() {
        // Computed independently with Python's hmac/hashlib (HKDF written
        // out per RFC 5869) and the blake3 package, protocol version 8:
        // nonce_r = 00 01 .. 1f, nonce_s = 80 81 .. 9f. Per case: K, both
        // proofs, the seals of BYE number 0 and 5, the chunk key and the
        // tag of "the bytes of one chunk" at offset 4096 of offer 3.
        let (nr, ns) = nonces();
        let t = token(TOK);
        let cases = [
            (
                conn("10.77.0.1", 0x11, "10.77.0.2", 0x12),
                "a89d1c3472fa469822714f161a34bc4bc9386ec36076fa6f959aef8efed8f0f0",
                "8252e4c7460d7116c4baf9c758de10041170a31a79008cc66e75387f3861847c",
                "2f1ab0748763d09f6193dc997b25180d32eba067c8fb5b9b5713a4ba1f4714bb",
                "51522694f5757b81d6ef43a077538e206e23461a130d548ffa67310e76f80b97",
                "8a3f72b9d3faf741afb627f5ef5b1ecdd9a3fbe57339e323d13b394d180aea6a",
                "7cd9b461cc520456ab4b8eb8bbd8f2a729081eabd8ee02f83835398be9124e4a",
                "9a4f23e331409ff57a6606acf17344d5e840155e9cc30a5f0568dfb1cfbfc211",
            ),
            // The IPv4-mapped form of the same address: the same key.
            (
                conn("::ffff:10.77.0.1", 0x11, "10.77.0.2", 0x12),
                "a89d1c3472fa469822714f161a34bc4bc9386ec36076fa6f959aef8efed8f0f0",
                "8252e4c7460d7116c4baf9c758de10041170a31a79008cc66e75387f3861847c",
                "2f1ab0748763d09f6193dc997b25180d32eba067c8fb5b9b5713a4ba1f4714bb",
                "51522694f5757b81d6ef43a077538e206e23461a130d548ffa67310e76f80b97",
                "8a3f72b9d3faf741afb627f5ef5b1ecdd9a3fbe57339e323d13b394d180aea6a",
                "7cd9b461cc520456ab4b8eb8bbd8f2a729081eabd8ee02f83835398be9124e4a",
                "9a4f23e331409ff57a6606acf17344d5e840155e9cc30a5f0568dfb1cfbfc211",
            ),
            (
                conn("fe80::1", 0x11, "fe80::2", 0x12),
                "432304357d6a9b05afb9e7c5cd5a51743b7a991f7e82914d8c9de3a4c7e2601d",
                "28847d2e52ed24c5adad44d346889c754f2e150b84d0d8756c68b57e8bbc71ef",
                "6bc0890d614a347c82dc1eb627500b5cad653d98fc287e96ff97872d0bfb1804",
                "4196cd926c0b838a5a90c3fdcb73275a0941d3fde145899dc43587b9c5e18469",
                "fdc1f8f99bebf7f501595dcd7dc78391db40037dfe601187086b378662992555",
                "96a36df7dc915fa702832320b55dff1c0bca7bea037ce958e5b75a3b824a4527",
                "765f874edf5fdca91d3ee74f1f0dce4ee3acc734c908b77a250ca38cadf0386e",
            ),
            // Another receiver QPN: another key.
            (
                conn("10.77.0.1", 0x13, "10.77.0.2", 0x12),
                "1456f1c5f27b4fbb026d374421c075e61600687ef3fe2ed7088219db8107ce1d",
                "a2cdbde782bbaf5195310224151ed9117e699af82db9ded5f5a1ca8b1e4a374e",
                "9828fabb272aaece07a9089f9b541d31ad4dad1e45151eb68a9c1ee16ad15af8",
                "e76f8c6c2861031bad32778991c52bbd00cf25f692c1d6cea3b2ec7f3238bdad",
                "3066cbabdad26fb9fe2465d0b30c9adee88a08a7b565f7260992027adf3abe41",
                "8b01ea7003cdfaf6c7371098819ffbf06d6c4e5a02d63849415d1a3ad6bcf0ea",
                "f76a82f5e1aa8d0df5f2c8ed3d3af2cf67636dd7d835bf6bbd0b1de59198409a",
            ),
        ];
        let bye = unhex("525846520107000000000000");
        for (c, k, ps, pr, seal0, seal5, chunk_key, chunk_tag) in cases {
            let key = SessionKey::derive(&t, &nr, &ns, &c);
            assert_eq!(key.key.to_vec(), unhex(k), "{c:?}");
            assert_eq!(key.sender_proof().to_vec(), unhex(ps), "{c:?}");
            assert_eq!(key.receiver_proof().to_vec(), unhex(pr), "{c:?}");
            let mut ch = key.channel(Role::Sender);
            let sealed = ch.seal(&bye).unwrap();
            assert_eq!(&sealed[..12], &bye[..]);
            assert_eq!(&sealed[12..20], &0u64.to_be_bytes());
            assert_eq!(sealed[20..].to_vec(), unhex(seal0));
            for _ in 1..5 {
                ch.seal(&bye).unwrap();
            }
            let sealed = ch.seal(&bye).unwrap();
            assert_eq!(&sealed[12..20], &5u64.to_be_bytes());
            assert_eq!(sealed[20..].to_vec(), unhex(seal5));
            let chunks = key.chunk_key();
            assert_eq!(chunks.key.to_vec(), unhex(chunk_key), "{c:?}");
            let tag = chunks.tag(3, 4096, b"the bytes of one chunk");
            assert_eq!(tag.to_vec(), unhex(chunk_tag), "{c:?}");
        }
    }

    #[test]
    fn mutual_proofs_succeed_only_with_the_same_token_and_connection() {
        let (nr, ns) = nonces();
        let c = conn("10.0.0.1", 7, "10.0.0.2", 9);
        let s_key = SessionKey::derive(&token(TOK), &nr, &ns, &c);
        let r_key = SessionKey::derive(&token(TOK), &nr, &ns, &c);
        assert!(r_key.verify_sender(&s_key.sender_proof()));
        assert!(s_key.verify_receiver(&r_key.receiver_proof()));
        // Role labels differ: a proof cannot be reflected back.
        assert_ne!(s_key.sender_proof(), s_key.receiver_proof());
        assert!(!s_key.verify_receiver(&r_key.sender_proof()));
        assert!(!r_key.verify_sender(&s_key.receiver_proof()));
        // Another token, nonce, address or QPN: the proof fails.
        let others = [
            SessionKey::derive(&token(b"correct horse battery stapler"), &nr, &ns, &c),
            SessionKey::derive(&token(TOK), &nonce(1), &ns, &c),
            SessionKey::derive(&token(TOK), &nr, &nonce(0x81), &c),
            SessionKey::derive(&token(TOK), &ns, &nr, &c),
            SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.3", 7, "10.0.0.2", 9)),
            SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.1", 7, "10.0.0.4", 9)),
            SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.1", 8, "10.0.0.2", 9)),
            SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.1", 7, "10.0.0.2", 10)),
            // Roles swapped: receiver and sender fields trade places.
            SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.2", 9, "10.0.0.1", 7)),
        ];
        for (i, other) in others.iter().enumerate() {
            assert!(!other.verify_sender(&s_key.sender_proof()), "case {i}");
            assert!(!s_key.verify_receiver(&other.receiver_proof()), "case {i}");
        }
        // Every single-bit flip, and wrong lengths.
        let good = s_key.sender_proof();
        for i in 0..MAC_LEN {
            for bit in 0..8 {
                let mut bad = good;
                bad[i] ^= 1 << bit;
                assert!(!r_key.verify_sender(&bad), "byte {i} bit {bit}");
            }
        }
        assert!(!r_key.verify_sender(&[]));
        assert!(!r_key.verify_sender(&good[..MAC_LEN - 1]));
        let mut long = good.to_vec();
        long.push(0);
        assert!(!r_key.verify_sender(&long));
    }

    #[test]
    fn transcript_layout() {
        let (nr, ns) = nonces();
        let t = transcript(&nr, &ns, &conn("10.0.0.1", 0x0102_0304, "::1", 5));
        assert_eq!(t.len(), 2 + 64 + 5 + 4 + 17 + 4);
        assert_eq!(&t[..2], &super::super::PROTOCOL_VERSION.to_be_bytes());
        assert_eq!(&t[2..34], &nr);
        assert_eq!(&t[34..66], &ns);
        assert_eq!(&t[66..71], &[4, 10, 0, 0, 1]);
        assert_eq!(&t[71..75], &[1, 2, 3, 4]);
        assert_eq!(t[75], 6);
        assert_eq!(&t[92..], &[0, 0, 0, 5]);
    }

    fn channels() -> (Channel, Channel) {
        let (nr, ns) = nonces();
        let key = SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.1", 1, "10.0.0.2", 2));
        (key.channel(Role::Sender), key.channel(Role::Receiver))
    }

    #[test]
    fn sealed_messages_open_in_order_in_both_directions() {
        let (mut s, mut r) = channels();
        for i in 0..5u8 {
            let sealed = s.seal(&[i; 20]).unwrap();
            assert_eq!(sealed.len(), 20 + SEAL_LEN);
            assert_eq!(r.open(&sealed).unwrap(), &[i; 20]);
            let back = r.seal(&[i, i]).unwrap();
            assert_eq!(s.open(&back).unwrap(), &[i, i]);
        }
        assert_eq!(
            (s.sent(), s.received(), r.sent(), r.received()),
            (5, 5, 5, 5)
        );
        // An empty frame seals too.
        let sealed = s.seal(&[]).unwrap();
        assert_eq!(r.open(&sealed).unwrap(), &[] as &[u8]);
    }

    #[test]
    fn forged_replayed_reordered_truncated_and_misdirected_are_refused() {
        let (mut s, mut r) = channels();
        let first = s.seal(b"HELLO frame").unwrap();
        let second = s.seal(b"FIN frame").unwrap();
        let third = s.seal(b"BYE frame").unwrap();
        // Reordered: the second before the first.
        let mut r2 = r.clone();
        assert_eq!(
            r2.open(&second),
            Err(ChannelError::OutOfOrder {
                got: 1,
                expected: 0
            })
        );
        // Forged: any bit flipped anywhere (frame, seq or tag).
        for i in 0..first.len() {
            let mut bad = first.clone();
            bad[i] ^= 0x01;
            let mut rr = r.clone();
            assert!(
                matches!(rr.open(&bad), Err(ChannelError::BadTag { .. })),
                "byte {i}"
            );
            // A refused message does not advance the sequence.
            assert_eq!(rr.received(), 0);
        }
        // A forged sequence number with the old tag fails the MAC.
        let mut bumped = second.clone();
        let at = bumped.len() - SEAL_LEN;
        bumped[at..at + 8].copy_from_slice(&0u64.to_be_bytes());
        assert!(matches!(
            r.clone().open(&bumped),
            Err(ChannelError::BadTag { seq: 0 })
        ));
        // Truncated: shorter than the trailer, or cut anywhere.
        for len in 0..SEAL_LEN {
            assert_eq!(
                r.clone().open(&first[..len]),
                Err(ChannelError::Truncated { len })
            );
        }
        for len in SEAL_LEN..first.len() {
            assert!(r.clone().open(&first[..len]).is_err(), "cut at {len}");
        }
        // In order: fine; then replayed.
        assert_eq!(r.open(&first).unwrap(), b"HELLO frame");
        assert_eq!(
            r.open(&first),
            Err(ChannelError::Replayed {
                got: 0,
                expected: 1
            })
        );
        assert_eq!(r.open(&second).unwrap(), b"FIN frame");
        assert_eq!(
            r.open(&first),
            Err(ChannelError::Replayed {
                got: 0,
                expected: 2
            })
        );
        assert_eq!(r.open(&third).unwrap(), b"BYE frame");
        // Wrong direction: the sender's own message reflected back to it,
        // or the receiver opening what it sealed itself.
        let mut s_copy = s.clone();
        assert!(matches!(
            s_copy.open(&first),
            Err(ChannelError::BadTag { .. })
        ));
        let from_r = r.seal(b"ACK frame").unwrap();
        assert!(matches!(
            r.clone().open(&from_r),
            Err(ChannelError::BadTag { .. })
        ));
        // Another connection's channel cannot open it.
        let (nr, ns) = nonces();
        let other = SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.1", 1, "10.0.0.2", 3));
        let mut other_r = other.channel(Role::Receiver);
        let mut fresh_s = channels().0;
        let sealed = fresh_s.seal(b"x").unwrap();
        assert!(matches!(
            other_r.open(&sealed),
            Err(ChannelError::BadTag { .. })
        ));
        assert_eq!(s.open(&from_r).unwrap(), b"ACK frame");
    }

    #[test]
    fn secrets_are_redacted() {
        let (nr, ns) = nonces();
        let key = SessionKey::derive(&token(TOK), &nr, &ns, &conn("10.0.0.1", 1, "10.0.0.2", 2));
        assert_eq!(format!("{key:?}"), "SessionKey(<redacted>)");
        let shown = format!("{:?}", key.channel(Role::Sender));
        assert!(shown.starts_with("Channel {"), "{shown}");
        assert!(!shown.contains("key"), "{shown}");
    }

    #[test]
    fn chunk_tags_bind_the_bytes_the_offer_the_offset_and_the_session() {
        let (nr, ns) = nonces();
        let c = conn("10.0.0.1", 1, "10.0.0.2", 2);
        let key = SessionKey::derive(&token(TOK), &nr, &ns, &c).chunk_key();
        let data = b"the bytes of one chunk".to_vec();
        let tag = key.tag(3, 4096, &data);
        assert!(key.verify(3, 4096, &data, &tag));
        // Any byte changed, or another place (offer, offset), fails.
        for i in 0..data.len() {
            let mut bad = data.clone();
            bad[i] ^= 0x20;
            assert!(!key.verify(3, 4096, &bad, &tag), "byte {i}");
        }
        assert!(!key.verify(4, 4096, &data, &tag));
        assert!(!key.verify(3, 0, &data, &tag));
        assert!(!key.verify(3, 4096, &data[1..], &tag));
        let mut bad_tag = tag;
        bad_tag[31] ^= 1;
        assert!(!key.verify(3, 4096, &data, &bad_tag));
        // Another session (another nonce) has another key.
        let other = SessionKey::derive(&token(TOK), &nonce(9), &ns, &c).chunk_key();
        assert!(!other.verify(3, 4096, &data, &tag));
        // Not a plain hash: the key is needed, and it is not a channel key.
        assert_ne!(tag, *blake3::hash(&data).as_bytes());
        let auth = ChunkAuth { key, offer: 3 };
        assert_eq!(auth.tag(4096, &data), tag);
        assert!(auth.verify(4096, &data, &tag));
        assert_eq!(format!("{:?}", auth.key), "ChunkKey(<redacted>)");
    }

    #[test]
    fn empty_token_is_refused_and_debug_is_redacted() {
        assert!(Token::new(Vec::new()).is_none());
        let t = token(b"hunter2");
        let shown = format!("{t:?}");
        assert_eq!(shown, "Token(<redacted>)");
        assert!(!shown.contains("hunter2"));
        // The nonce matters: fresh nonces give unrelated answers.
        assert_ne!(t.mac(&nonce(1)), t.mac(&nonce(2)));
        // A clone answers the same.
        assert_eq!(t.clone().mac(&nonce(3)), t.mac(&nonce(3)));
    }
}
