//! Challenge-response authentication with a shared secret: the receiver sends a
//! fresh random nonce in CHALLENGE, the sender answers with
//! HMAC-SHA256(key = token, data = `AUTH_CONTEXT || nonce`) in AUTH, and the
//! receiver checks it in constant time. Pure computation; the engine supplies
//! the nonce (from the OS RNG) and the token (from `--token-file` or the
//! environment).

use std::fmt;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

/// Domain separation: a MAC made for this protocol version cannot be replayed
/// as anything else.
pub const AUTH_CONTEXT: &[u8] = b"rdma-xfer auth v1\0";
/// Length of the receiver's nonce.
pub const NONCE_LEN: usize = 32;
/// Length of an HMAC-SHA256 tag.
pub const MAC_LEN: usize = 32;
/// CHALLENGE flag: the sender must answer with AUTH before anything else.
pub const AUTH_REQUIRED: u16 = 1;
/// Every CHALLENGE flag this build understands.
pub const CHALLENGE_FLAGS_KNOWN: u16 = AUTH_REQUIRED;

type HmacSha256 = Hmac<Sha256>;

/// The shared secret, kept only as a keyed HMAC state: the raw bytes are
/// wiped once it is built and never appear in `Debug` output.
#[derive(Clone)]
pub struct Token {
    keyed: HmacSha256,
}

impl Token {
    /// None for an empty secret (which would authenticate nothing). Wipes
    /// `secret` (best effort).
    pub fn new(mut secret: Vec<u8>) -> Option<Self> {
        let keyed = if secret.is_empty() {
            None
        } else {
            // HMAC accepts keys of any length, so this never fails.
            <HmacSha256 as KeyInit>::new_from_slice(&secret).ok()
        };
        // Zero the bytes; black_box keeps the stores from being elided.
        secret.fill(0);
        std::hint::black_box(&secret);
        keyed.map(|keyed| Token { keyed })
    }

    /// HMAC state over `parts`, concatenated.
    fn over(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut mac = self.keyed.clone();
        for p in parts {
            mac.update(p);
        }
        mac
    }

    fn start(&self, nonce: &[u8; NONCE_LEN]) -> HmacSha256 {
        self.over(&[AUTH_CONTEXT, nonce])
    }

    /// HMAC-SHA256(key = token, data = `AUTH_CONTEXT || nonce`): the AUTH
    /// answer to a CHALLENGE.
    pub fn mac(&self, nonce: &[u8; NONCE_LEN]) -> [u8; MAC_LEN] {
        self.start(nonce).finalize().into_bytes().into()
    }

    /// Constant-time check of an AUTH answer; any length other than
    /// `MAC_LEN` fails.
    pub fn verify(&self, nonce: &[u8; NONCE_LEN], mac: &[u8]) -> bool {
        self.start(nonce).verify_slice(mac).is_ok()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
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

    #[test]
    fn verify_accepts_only_the_right_mac() {
        let t = token(b"secret");
        let n = nonce(7);
        let good = t.mac(&n);
        assert!(t.verify(&n, &good));
        // Another token, another nonce.
        assert!(!token(b"secret2").verify(&n, &good));
        assert!(!token(b"secre").verify(&n, &good));
        assert!(!t.verify(&nonce(8), &good));
        // Every single-bit flip.
        for i in 0..MAC_LEN {
            for bit in 0..8 {
                let mut bad = good;
                bad[i] ^= 1 << bit;
                assert!(!t.verify(&n, &bad), "byte {i} bit {bit}");
            }
        }
        // Empty, short, truncated-correct and over-long tags.
        assert!(!t.verify(&n, &[]));
        for len in 1..MAC_LEN {
            assert!(!t.verify(&n, &good[..len]), "prefix of {len}");
            assert!(!t.verify(&n, &good[MAC_LEN - len..]), "suffix of {len}");
        }
        let mut long = good.to_vec();
        long.push(0);
        assert!(!t.verify(&n, &long));
        assert!(!t.verify(&n, &[0; MAC_LEN]));
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
