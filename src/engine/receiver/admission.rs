//! Who gets a session. With a token, a connection first waits in a small
//! pool of handshakes (at most `HANDSHAKE_POOL`, `HANDSHAKE_PER_ADDRESS` from
//! any one address, each for `AUTH_TIMEOUT` at most); only a sender that
//! proved the token takes one of the `--max-sessions` session slots. So
//! connections that never authenticate cannot lock out one that does.
//! Without a token there is nothing to prove: a connection takes a slot as
//! it arrives.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Connections in their handshake at once, from all addresses.
pub(super) const HANDSHAKE_POOL: usize = 32;
/// Connections in their handshake at once from one address.
pub(super) const HANDSHAKE_PER_ADDRESS: usize = 4;

/// The `--max-sessions` slots: taken by admitted sessions only.
#[derive(Debug)]
pub(super) struct SessionSlots {
    running: AtomicUsize,
    max: usize,
}

/// One taken session slot, given back on drop.
#[derive(Debug)]
pub(super) struct SessionSlot<'a>(&'a SessionSlots);

impl SessionSlots {
    pub(super) fn new(max: usize) -> Self {
        Self {
            running: AtomicUsize::new(0),
            max,
        }
    }

    /// A slot, unless `max` sessions run.
    pub(super) fn take(&self) -> Option<SessionSlot<'_>> {
        self.running
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| SessionSlot(self))
    }

    /// Sessions admitted and not yet ended.
    pub(super) fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// The `--max-sessions` limit.
    pub(super) fn max(&self) -> usize {
        self.max
    }
}

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Connections that have not authenticated yet, counted per address.
#[derive(Debug)]
pub(super) struct HandshakePool {
    /// Handshakes per peer address (None: the address is unknown).
    by_address: Mutex<HashMap<Option<IpAddr>, usize>>,
    total: usize,
    per_address: usize,
}

/// A place in the handshake pool, given back on drop.
#[derive(Debug)]
pub(super) struct HandshakeTicket<'a> {
    pool: &'a HandshakePool,
    from: Option<IpAddr>,
}

/// Why a connection found no place in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PoolFull {
    /// `total` handshakes run.
    Total(usize),
    /// `per_address` handshakes run from this address.
    Address(usize),
}

impl std::fmt::Display for PoolFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Total(n) => write!(f, "{n} connections are already authenticating"),
            Self::Address(n) => write!(
                f,
                "{n} connections from this address are already authenticating"
            ),
        }
    }
}

impl HandshakePool {
    pub(super) fn new(total: usize, per_address: usize) -> Self {
        Self {
            by_address: Mutex::new(HashMap::new()),
            total,
            per_address,
        }
    }

    /// A place for a connection from `from`, unless the pool or this
    /// address's share of it is full.
    pub(super) fn enter(&self, from: Option<IpAddr>) -> Result<HandshakeTicket<'_>, PoolFull> {
        let mut map = self.lock();
        let total: usize = map.values().sum();
        if total >= self.total {
            return Err(PoolFull::Total(self.total));
        }
        let mine = map.entry(from).or_insert(0);
        if *mine >= self.per_address {
            return Err(PoolFull::Address(self.per_address));
        }
        *mine += 1;
        Ok(HandshakeTicket { pool: self, from })
    }

    /// Handshakes running now.
    pub(super) fn len(&self) -> usize {
        self.lock().values().sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Option<IpAddr>, usize>> {
        // A panic while holding the lock cannot leave the counts half
        // updated (each update is one statement): keep using them.
        self.by_address
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for HandshakeTicket<'_> {
    fn drop(&mut self) {
        let mut map = self.pool.lock();
        if let Some(n) = map.get_mut(&self.from) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                map.remove(&self.from);
            }
        }
    }
}

/// How a session got (or gets) its slot.
#[derive(Debug)]
pub(super) enum Admission<'a> {
    /// Admitted: holds its session slot until it ends.
    Admitted { _slot: SessionSlot<'a> },
    /// In the handshake pool (its place held until it ends or is
    /// admitted); takes a slot once the sender proved the token.
    Pending {
        _ticket: HandshakeTicket<'a>,
        slots: &'a SessionSlots,
    },
}

impl Admission<'_> {
    /// The sender proved the token: leave the handshake pool for a session
    /// slot. Err(max_sessions) when all are taken (the sender is then told
    /// it is busy). Already admitted: Ok.
    pub(super) fn admit(&mut self) -> Result<(), usize> {
        let Self::Pending { slots, .. } = self else {
            return Ok(());
        };
        let slots = *slots;
        let slot = slots.take().ok_or(slots.max())?;
        // Dropping the old value gives the ticket back.
        *self = Self::Admitted { _slot: slot };
        Ok(())
    }

    /// Whether the session got past its handshake.
    pub(super) fn is_admitted(&self) -> bool {
        matches!(self, Self::Admitted { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    #[test]
    fn session_slots_count_admitted_sessions_only() {
        let slots = SessionSlots::new(2);
        let a = slots.take().expect("first");
        let b = slots.take().expect("second");
        assert!(slots.take().is_none(), "a third of two");
        assert_eq!(slots.running(), 2);
        drop(a);
        let c = slots.take().expect("a slot given back is free");
        drop((b, c));
        assert_eq!(slots.running(), 0);
    }

    #[test]
    fn the_pool_caps_each_address_and_the_total() {
        let pool = HandshakePool::new(5, 2);
        let x1 = pool.enter(addr("10.0.0.1")).unwrap();
        let _x2 = pool.enter(addr("10.0.0.1")).unwrap();
        assert_eq!(
            pool.enter(addr("10.0.0.1")).unwrap_err(),
            PoolFull::Address(2)
        );
        // Another address still gets in, also while one is full.
        let _y1 = pool.enter(addr("10.0.0.2")).unwrap();
        let _y2 = pool.enter(addr("10.0.0.2")).unwrap();
        let _z1 = pool.enter(None).unwrap();
        assert_eq!(pool.len(), 5);
        assert_eq!(
            pool.enter(addr("10.0.0.3")).unwrap_err(),
            PoolFull::Total(5)
        );
        // A place given back is free again, for its address too.
        drop(x1);
        assert_eq!(pool.len(), 4);
        let _x3 = pool.enter(addr("10.0.0.1")).unwrap();
        assert!(pool.enter(addr("10.0.0.1")).is_err());
        assert!(
            PoolFull::Address(2)
                .to_string()
                .contains("from this address")
        );
    }

    #[test]
    fn admission_trades_the_ticket_for_a_slot() {
        let pool = HandshakePool::new(8, 4);
        let slots = SessionSlots::new(1);
        let mut first = Admission::Pending {
            _ticket: pool.enter(addr("10.0.0.1")).unwrap(),
            slots: &slots,
        };
        let mut second = Admission::Pending {
            _ticket: pool.enter(addr("10.0.0.1")).unwrap(),
            slots: &slots,
        };
        assert!(!first.is_admitted());
        assert_eq!(first.admit(), Ok(()));
        assert!(first.is_admitted());
        assert_eq!((pool.len(), slots.running()), (1, 1));
        // All slots taken: busy, and still in the pool until it ends.
        assert_eq!(second.admit(), Err(1));
        assert!(!second.is_admitted());
        assert_eq!(first.admit(), Ok(()), "admitted once is admitted");
        drop(first);
        assert_eq!(second.admit(), Ok(()));
        assert_eq!((pool.len(), slots.running()), (0, 1));
        drop(second);
        assert_eq!(slots.running(), 0);
    }
}
