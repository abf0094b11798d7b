//! Who gets a session. With a token, a connection first waits in a small
//! pool of handshakes (`HANDSHAKE_POOL` places, `HANDSHAKE_PER_ADDRESS` from
//! any one address, `AUTH_TIMEOUT` at most from the connection request to
//! the proof; a full pool drops its oldest handshake for a newcomer); only
//! a sender that proved the token takes one of the `--max-sessions` session
//! slots. So connections that never authenticate cannot lock out one that
//! does.
//! Without a token there is nothing to prove: a connection takes a slot as
//! it arrives, but one address holds at most half of the slots
//! (`per_address_share`).

use crate::proto::Busy;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Connections in their handshake at once, from all addresses.
pub(super) const HANDSHAKE_POOL: usize = 32;
/// Connections in their handshake at once from one address: as many as
/// the default `--max-sessions`, so that one host may start that many
/// senders at once (`xargs -P8 sender ...`).
pub(super) const HANDSHAKE_PER_ADDRESS: usize = 8;

/// The `--max-sessions` slots: taken by admitted sessions only. Sessions
/// that nothing authenticated (no token) are counted per address too: one
/// address holds at most `per_address` of them, so one host cannot take
/// every slot of an open receiver.
#[derive(Debug)]
pub(super) struct SessionSlots {
    state: Mutex<SlotState>,
    max: usize,
    per_address: usize,
}

#[derive(Debug, Default)]
struct SlotState {
    running: usize,
    /// Unauthenticated sessions per address key (`address_key`).
    by_address: Vec<(Option<IpAddr>, usize)>,
}

/// One taken session slot, given back on drop.
#[derive(Debug)]
pub(super) struct SessionSlot<'a> {
    slots: &'a SessionSlots,
    /// The address it counts against (unauthenticated sessions only).
    address: Option<Option<IpAddr>>,
}

/// The share of `max` slots one address may hold unauthenticated: half,
/// at least one.
pub(super) fn per_address_share(max: usize) -> usize {
    (max / 2).max(1)
}

impl SessionSlots {
    pub(super) fn new(max: usize) -> Self {
        Self {
            state: Mutex::new(SlotState::default()),
            max,
            per_address: per_address_share(max),
        }
    }

    /// A slot for an authenticated session, unless `max` sessions run.
    pub(super) fn take(&self) -> Option<SessionSlot<'_>> {
        let mut state = self.lock();
        if state.running >= self.max {
            return None;
        }
        state.running += 1;
        Some(SessionSlot {
            slots: self,
            address: None,
        })
    }

    /// A slot for a session from `from` that nothing authenticates,
    /// unless `max` sessions run or `from` holds its share already.
    pub(super) fn take_unauthenticated(
        &self,
        from: Option<IpAddr>,
    ) -> Result<SessionSlot<'_>, Busy> {
        let key = address_key(from);
        let mut state = self.lock();
        if state.running >= self.max {
            return Err(Busy::Sessions(self.max));
        }
        let held = state
            .by_address
            .iter()
            .find(|(k, _)| *k == key)
            .map_or(0, |(_, n)| *n);
        if held >= self.per_address {
            return Err(Busy::FromAddress(held));
        }
        state.running += 1;
        match state.by_address.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => state.by_address.push((key, 1)),
        }
        Ok(SessionSlot {
            slots: self,
            address: Some(key),
        })
    }

    /// Sessions admitted and not yet ended.
    pub(super) fn running(&self) -> usize {
        self.lock().running
    }

    /// The `--max-sessions` limit.
    pub(super) fn max(&self) -> usize {
        self.max
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SlotState> {
        // Counts only: a panic while holding the lock leaves them usable.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        let mut state = self.slots.lock();
        state.running = state.running.saturating_sub(1);
        if let Some(key) = self.address {
            if let Some((_, n)) = state.by_address.iter_mut().find(|(k, _)| *k == key) {
                *n = n.saturating_sub(1);
            }
            state.by_address.retain(|(_, n)| *n > 0);
        }
    }
}

/// Connections that have not authenticated yet. When the pool is full a
/// newcomer takes the place of the oldest (which is told to stop): a real
/// sender authenticates within one round trip, so connections that idle
/// cannot keep it out unless they arrive faster than that. Each address
/// (an IPv6 address counts by its /64) holds at most `per_address` places.
#[derive(Debug)]
pub(super) struct HandshakePool {
    state: Mutex<PoolState>,
    total: usize,
    per_address: usize,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Places in the pool, oldest first.
    entries: Vec<Entry>,
    /// Evicted connections whose thread has not ended yet.
    leaving: usize,
    next_id: u64,
}

#[derive(Debug)]
struct Entry {
    id: u64,
    key: Option<IpAddr>,
    evicted: Arc<AtomicBool>,
}

/// A place in the handshake pool, given back on drop.
#[derive(Debug)]
pub(super) struct HandshakeTicket<'a> {
    pool: &'a HandshakePool,
    id: u64,
    evicted: Arc<AtomicBool>,
}

/// Why a connection found no place in the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PoolFull {
    /// So many evicted connections are still ending that a flood is on.
    Total(usize),
    /// `per_address` handshakes run from this address.
    Address(usize),
}

impl std::fmt::Display for PoolFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Total(n) => write!(
                f,
                "{n} connections are authenticating and {n} more are being dropped"
            ),
            Self::Address(n) => write!(
                f,
                "{n} connections from this address are already authenticating"
            ),
        }
    }
}

/// What counts as one address for the per-address cap: an IPv4 address,
/// or the /64 of an IPv6 address (one host owns a whole /64).
fn address_key(from: Option<IpAddr>) -> Option<IpAddr> {
    match from? {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => Some(IpAddr::V4(v4)),
            None => {
                let bits = u128::from(v6) & !((1u128 << 64) - 1);
                Some(IpAddr::V6(std::net::Ipv6Addr::from(bits)))
            }
        },
        v4 => Some(v4),
    }
}

impl HandshakePool {
    pub(super) fn new(total: usize, per_address: usize) -> Self {
        Self {
            state: Mutex::new(PoolState::default()),
            total,
            per_address,
        }
    }

    /// A place for a connection from `from`, unless this address holds its
    /// share already. A full pool drops its oldest handshake for it.
    pub(super) fn enter(&self, from: Option<IpAddr>) -> Result<HandshakeTicket<'_>, PoolFull> {
        let key = address_key(from);
        let mut state = self.lock();
        if state.entries.iter().filter(|e| e.key == key).count() >= self.per_address {
            return Err(PoolFull::Address(self.per_address));
        }
        if state.entries.len() >= self.total {
            if state.leaving >= self.total {
                return Err(PoolFull::Total(self.total));
            }
            let oldest = state.entries.remove(0);
            oldest.evicted.store(true, Ordering::SeqCst);
            state.leaving += 1;
        }
        let id = state.next_id;
        state.next_id += 1;
        let evicted = Arc::new(AtomicBool::new(false));
        state.entries.push(Entry {
            id,
            key,
            evicted: Arc::clone(&evicted),
        });
        Ok(HandshakeTicket {
            pool: self,
            id,
            evicted,
        })
    }

    /// Tells every handshake to stop (the receiver is done taking
    /// sessions).
    pub(super) fn evict_all(&self) {
        let mut state = self.lock();
        for e in std::mem::take(&mut state.entries) {
            e.evicted.store(true, Ordering::SeqCst);
            state.leaving += 1;
        }
    }

    /// Handshakes running now (evicted ones not counted).
    pub(super) fn len(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // A panic while holding the lock cannot leave the state half
        // updated in a way that matters (counts only): keep using it.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl HandshakeTicket<'_> {
    /// Whether the pool dropped this handshake for a newer one.
    pub(super) fn evicted(&self) -> bool {
        self.evicted.load(Ordering::SeqCst)
    }
}

impl Drop for HandshakeTicket<'_> {
    fn drop(&mut self) {
        let mut state = self.pool.lock();
        if self.evicted() {
            state.leaving = state.leaving.saturating_sub(1);
        } else {
            state.entries.retain(|e| e.id != self.id);
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
        ticket: HandshakeTicket<'a>,
        slots: &'a SessionSlots,
        /// When the handshake must be over (from the connection request).
        deadline: Instant,
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

    /// Whether the pool dropped this handshake for a newer connection.
    pub(super) fn evicted(&self) -> bool {
        self.handshake().is_some_and(|(_, evicted)| evicted)
    }

    /// While in the handshake: its deadline, and whether the pool dropped
    /// it for a newer connection.
    pub(super) fn handshake(&self) -> Option<(Instant, bool)> {
        match self {
            Self::Pending {
                ticket, deadline, ..
            } => Some((*deadline, ticket.evicted())),
            Self::Admitted { .. } => None,
        }
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
    fn unauthenticated_sessions_hold_half_the_slots_per_address() {
        assert_eq!(
            (1..=9).map(per_address_share).collect::<Vec<_>>(),
            [1, 1, 1, 2, 2, 3, 3, 4, 4]
        );
        let slots = SessionSlots::new(4);
        let a1 = slots.take_unauthenticated(addr("10.0.0.1")).unwrap();
        let _a2 = slots.take_unauthenticated(addr("10.0.0.1")).unwrap();
        assert_eq!(
            slots.take_unauthenticated(addr("10.0.0.1")).unwrap_err(),
            Busy::FromAddress(2)
        );
        // The same host by its IPv4-mapped address, or another address of
        // its IPv6 /64, is the same address.
        assert!(slots.take_unauthenticated(addr("::ffff:10.0.0.1")).is_err());
        let _b1 = slots.take_unauthenticated(addr("fd00::1")).unwrap();
        let _b2 = slots.take_unauthenticated(addr("fd00::2")).unwrap();
        assert_eq!(
            slots.take_unauthenticated(addr("fd00::3")).unwrap_err(),
            Busy::Sessions(4)
        );
        drop(a1);
        // A slot given back is free for that address again; an
        // authenticated session is never counted per address.
        let _a3 = slots.take_unauthenticated(addr("10.0.0.1")).unwrap();
        assert_eq!(slots.running(), 4);
        assert!(slots.take().is_none());
        let slots = SessionSlots::new(1);
        let only = slots.take_unauthenticated(None).unwrap();
        assert_eq!(
            slots.take_unauthenticated(addr("10.0.0.2")).unwrap_err(),
            Busy::Sessions(1)
        );
        drop(only);
        let _t1 = slots.take().unwrap();
        assert_eq!(slots.running(), 1);
    }

    #[test]
    fn the_pool_caps_each_address_and_drops_its_oldest_when_full() {
        let pool = HandshakePool::new(5, 2);
        let x1 = pool.enter(addr("10.0.0.1")).unwrap();
        let _x2 = pool.enter(addr("10.0.0.1")).unwrap();
        assert_eq!(
            pool.enter(addr("10.0.0.1")).unwrap_err(),
            PoolFull::Address(2)
        );
        // An IPv4-mapped IPv6 address is that IPv4 address.
        assert!(pool.enter(addr("::ffff:10.0.0.1")).is_err());
        // Another address still gets in, also while one is full.
        let _y1 = pool.enter(addr("10.0.0.2")).unwrap();
        let _y2 = pool.enter(addr("10.0.0.2")).unwrap();
        let z1 = pool.enter(None).unwrap();
        assert_eq!(pool.len(), 5);
        // Full: a newcomer takes the oldest one's place.
        let w1 = pool.enter(addr("10.0.0.3")).unwrap();
        assert!(x1.evicted() && !z1.evicted() && !w1.evicted());
        assert_eq!(pool.len(), 5);
        // A place given back is free again.
        drop(w1);
        assert_eq!(pool.len(), 4);
        // Evicting goes on while evicted handshakes end, but not when as
        // many as the pool holds are still ending (a flood).
        let small = HandshakePool::new(2, 2);
        let a = small.enter(addr("10.1.0.1")).unwrap();
        let b = small.enter(addr("10.1.0.2")).unwrap();
        let c = small.enter(addr("10.1.0.3")).unwrap();
        let d = small.enter(addr("10.1.0.4")).unwrap();
        assert!(a.evicted() && b.evicted() && !c.evicted() && !d.evicted());
        assert_eq!(
            small.enter(addr("10.1.0.5")).unwrap_err(),
            PoolFull::Total(2)
        );
        drop(a);
        let e = small.enter(addr("10.1.0.5")).unwrap();
        assert!(c.evicted() && !e.evicted());
        assert!(
            PoolFull::Address(2)
                .to_string()
                .contains("from this address")
        );
    }

    #[test]
    fn an_ipv6_host_counts_as_its_slash_64() {
        let pool = HandshakePool::new(8, 2);
        let _a = pool.enter(addr("2001:db8:1:2::1")).unwrap();
        let _b = pool.enter(addr("2001:db8:1:2:ffff::9")).unwrap();
        assert!(pool.enter(addr("2001:db8:1:2::3")).is_err());
        assert!(pool.enter(addr("2001:db8:1:3::1")).is_ok());
    }

    #[test]
    fn evict_all_stops_every_handshake() {
        let pool = HandshakePool::new(4, 4);
        let a = pool.enter(addr("10.0.0.1")).unwrap();
        let b = pool.enter(addr("10.0.0.2")).unwrap();
        pool.evict_all();
        assert!(a.evicted() && b.evicted());
        assert_eq!(pool.len(), 0);
    }

    #[test]
    fn admission_trades_the_ticket_for_a_slot() {
        let pool = HandshakePool::new(8, 4);
        let slots = SessionSlots::new(1);
        let deadline = Instant::now();
        let mut first = Admission::Pending {
            ticket: pool.enter(addr("10.0.0.1")).unwrap(),
            slots: &slots,
            deadline,
        };
        let mut second = Admission::Pending {
            ticket: pool.enter(addr("10.0.0.1")).unwrap(),
            slots: &slots,
            deadline,
        };
        assert_eq!(first.handshake(), Some((deadline, false)));
        assert!(first.handshake().is_some());
        assert_eq!(first.admit(), Ok(()));
        assert!(first.handshake().is_none());
        assert_eq!(first.handshake(), None);
        assert_eq!((pool.len(), slots.running()), (1, 1));
        // All slots taken: busy, and still in the pool until it ends.
        assert_eq!(second.admit(), Err(1));
        assert!(second.handshake().is_some());
        assert_eq!(first.admit(), Ok(()), "admitted once is admitted");
        drop(first);
        assert_eq!(second.admit(), Ok(()));
        assert_eq!((pool.len(), slots.running()), (0, 1));
        drop(second);
        assert_eq!(slots.running(), 0);
    }
}
