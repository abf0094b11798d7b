//! `--bwlimit`: the session's chunk writes paced to a rate, so that a
//! transfer shares a fabric with other jobs. A token bucket that holds
//! one chunk at most: a session never writes faster than the rate for
//! longer than one chunk.

use std::time::{Duration, Instant};

/// The lowest rate: one chunk of the largest default size a second keeps
/// the receiver hearing from the sender well within any --timeout.
pub const MIN_BWLIMIT: u64 = 1 << 20;

/// Bytes per second, spent by chunk writes.
#[derive(Debug, Clone)]
pub(super) struct Pacer {
    /// Bytes per second.
    rate: f64,
    /// What the bucket holds at most: one chunk.
    burst: f64,
    /// What it holds now; below zero after a chunk larger than what was
    /// there (the debt is paid before the next one).
    tokens: f64,
    at: Instant,
}

impl Pacer {
    /// A full bucket (one chunk may go at once).
    pub(super) fn new(rate: u64, chunk: u32, now: Instant) -> Self {
        Pacer {
            rate: rate.max(1) as f64,
            burst: f64::from(chunk),
            tokens: f64::from(chunk),
            at: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
    }

    /// None when a chunk of `bytes` may be written now (then `spend`);
    /// else when it may.
    pub(super) fn ready_at(&mut self, bytes: u32, now: Instant) -> Option<Instant> {
        self.refill(now);
        // A chunk larger than the bucket waits for a full bucket.
        let need = f64::from(bytes).min(self.burst);
        if self.tokens >= need {
            return None;
        }
        let wait = Duration::from_secs_f64((need - self.tokens) / self.rate);
        // A zero wait would spin: at least one microsecond.
        Some(now + wait.max(Duration::from_micros(1)))
    }

    /// A chunk of `bytes` was written.
    pub(super) fn spend(&mut self, bytes: u32) {
        self.tokens -= f64::from(bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes `chunks` chunks of `len` as fast as the pacer allows, on a
    /// synthetic clock; the time it took.
    fn paced(rate: u64, len: u32, chunks: u32) -> Duration {
        let t0 = Instant::now();
        let mut now = t0;
        let mut p = Pacer::new(rate, len, now);
        for _ in 0..chunks {
            while let Some(at) = p.ready_at(len, now) {
                assert!(at > now);
                now = at;
            }
            p.spend(len);
        }
        now - t0
    }

    #[test]
    fn a_long_transfer_takes_its_bytes_over_the_rate_less_one_chunk() {
        // 100 MiB at 10 MiB/s in 1 MiB chunks: the first chunk goes at
        // once, each further one after 0.1 s.
        let took = paced(10 << 20, 1 << 20, 100).as_secs_f64();
        assert!((took - 9.9).abs() < 0.01, "{took}");
        // Smaller chunks: the same rate.
        let took = paced(10 << 20, 64 << 10, 1600).as_secs_f64();
        assert!((took - 9.99375).abs() < 0.01, "{took}");
    }

    #[test]
    fn an_idle_bucket_holds_one_chunk_at_most() {
        let t0 = Instant::now();
        let mut p = Pacer::new(1 << 20, 1 << 20, t0);
        let later = t0 + Duration::from_secs(60);
        assert_eq!(p.ready_at(1 << 20, later), None);
        p.spend(1 << 20);
        // A minute idle bought one chunk, not sixty: the next waits 1 s.
        let next = p.ready_at(1 << 20, later).expect("must wait");
        assert!(((next - later).as_secs_f64() - 1.0).abs() < 1e-6);
        let again = p
            .ready_at(1 << 20, later + Duration::from_millis(1))
            .expect("must wait");
        assert!((again.max(next) - again.min(next)) < Duration::from_micros(2));
        assert_eq!(p.ready_at(1 << 20, next + Duration::from_micros(2)), None);
    }
}
