//! Registered memory: a page-aligned buffer plus its ibv_mr.

use super::os::ensure_memlock;
use super::queue::ProtectionDomain;
use super::{Result, VerbsError};
use rdma_sys::*;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::rc::Rc;

const PAGE: usize = 4096;

/// What the peer (and the local NIC) may do with a region. Remote read is
/// deliberately not offered: no region of ours is ever readable remotely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Local use only (send buffers, receive buffers, staging buffers).
    Local,
    /// The peer may RDMA WRITE into it (the receiver's ring).
    RemoteWrite,
}

/// A page-aligned heap buffer registered with a protection domain.
/// Deregistered before the memory is freed, so the NIC can never touch freed
/// memory; holds its PD alive.
pub struct MemoryRegion {
    mr: *mut ibv_mr,
    ptr: *mut u8,
    layout: Layout,
    _pd: Rc<ProtectionDomain>,
}

impl MemoryRegion {
    pub fn new(pd: &Rc<ProtectionDomain>, len: usize, access: Access) -> Result<Self> {
        if len == 0 {
            return Err(VerbsError::Invalid(
                "cannot register an empty buffer".into(),
            ));
        }
        ensure_memlock(len as u64)?;
        let layout = Layout::from_size_align(len.next_multiple_of(PAGE), PAGE)
            .map_err(|e| VerbsError::Invalid(format!("buffer of {len} bytes: {e}")))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(VerbsError::Invalid(format!(
                "out of memory allocating {len} bytes"
            )));
        }
        // REMOTE_WRITE requires LOCAL_WRITE; REMOTE_READ is never granted.
        let flags = match access {
            Access::Local => ibv_access_flags::IBV_ACCESS_LOCAL_WRITE,
            Access::RemoteWrite => {
                ibv_access_flags::IBV_ACCESS_LOCAL_WRITE | ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            }
        };
        // SAFETY: pd is a live PD; ptr..ptr+len is our own allocation, kept
        // alive until after ibv_dereg_mr in Drop.
        let mr = unsafe { ibv_reg_mr(pd.raw(), ptr.cast(), len, flags.0 as libc::c_int) };
        if mr.is_null() {
            let err = std::io::Error::last_os_error();
            // SAFETY: ptr was allocated above with this layout and never
            // registered.
            unsafe { dealloc(ptr, layout) };
            if err.raw_os_error() == Some(libc::ENOMEM) {
                // Re-check to name the limit instead of a bare ENOMEM.
                ensure_memlock(u64::MAX / 2)?;
            }
            return Err(VerbsError::Call {
                call: "ibv_reg_mr",
                source: err,
            });
        }
        Ok(MemoryRegion {
            mr,
            ptr,
            layout,
            _pd: pd.clone(),
        })
    }

    /// Length of the registered range in bytes.
    pub fn len(&self) -> usize {
        // SAFETY: self.mr is valid while self lives.
        unsafe { (*self.mr).length }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn lkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).lkey }
    }

    pub fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }

    /// The address the peer uses for RDMA to this region.
    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    /// Bytes `[offset, offset+len)` of the region. The caller reads only
    /// ranges the NIC is done with (after the matching completion).
    pub fn slice(&self, offset: usize, len: usize) -> Result<&[u8]> {
        self.check(offset, len)?;
        // SAFETY: the range is inside our allocation (checked above); the
        // memory is initialised (zeroed at allocation, then written by us or
        // the NIC).
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) })
    }

    /// Mutable access to `[offset, offset+len)`, for filling a buffer before
    /// posting it. `&mut self` keeps two such slices from aliasing.
    pub fn slice_mut(&mut self, offset: usize, len: usize) -> Result<&mut [u8]> {
        self.check(offset, len)?;
        // SAFETY: as in slice(); unique access through &mut self.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) })
    }

    pub(crate) fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(VerbsError::Invalid(format!(
                "range {offset}+{len} outside a {}-byte region",
                self.len()
            ))),
        }
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        // SAFETY: mr is valid and deregistered exactly once; after that the
        // NIC can no longer access the memory, so freeing it is safe.
        unsafe {
            ibv_dereg_mr(self.mr);
            dealloc(self.ptr, self.layout);
        }
    }
}

/// A registered region cut into equal slots that can be filled on another
/// thread. Each slot has exactly one `SlotToken`; whoever holds a slot's
/// token may write it (the reader thread) or have the NIC read it (the
/// posting thread, until the write's completion). Tokens move between
/// threads through channels, so a slot is never written while in flight.
pub struct SlotPool {
    mr: MemoryRegion,
    slot_size: usize,
    pool_id: u64,
}

/// The exclusive right to one slot of one `SlotPool`.
#[derive(Debug)]
pub struct SlotToken {
    index: usize,
    pool_id: u64,
}

impl SlotToken {
    pub fn index(&self) -> usize {
        self.index
    }
}

/// Write access to a pool's slots for one other thread, bounded by a borrow
/// of the pool (use it in `std::thread::scope`).
pub struct SlotFiller<'a> {
    base: *mut u8,
    slot_size: usize,
    pool_id: u64,
    _pool: std::marker::PhantomData<&'a SlotPool>,
}

// SAFETY: the filler only hands out a slot's memory against a `&mut
// SlotToken` of the same pool, and each token exists once, so two threads
// never get the same bytes; the borrow keeps the memory registered and
// allocated for as long as the filler lives.
unsafe impl Send for SlotFiller<'_> {}

impl SlotPool {
    /// Registers `count` slots of `slot_size` bytes (local access only) and
    /// returns the pool with the one token of each slot.
    pub fn new(
        pd: &Rc<ProtectionDomain>,
        slot_size: usize,
        count: usize,
    ) -> Result<(Self, Vec<SlotToken>)> {
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT_POOL: AtomicU64 = AtomicU64::new(1);
        let len = slot_size
            .checked_mul(count)
            .ok_or_else(|| VerbsError::Invalid("slot pool too large".into()))?;
        let mr = MemoryRegion::new(pd, len, Access::Local)?;
        let pool_id = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        let tokens = (0..count)
            .map(|index| SlotToken { index, pool_id })
            .collect();
        Ok((
            SlotPool {
                mr,
                slot_size,
                pool_id,
            },
            tokens,
        ))
    }

    pub fn mr(&self) -> &MemoryRegion {
        &self.mr
    }

    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Byte offset of a token's slot inside `mr()`.
    pub fn offset(&self, token: &SlotToken) -> usize {
        token.index * self.slot_size
    }

    pub fn filler(&self) -> SlotFiller<'_> {
        SlotFiller {
            base: self.mr.ptr,
            slot_size: self.slot_size,
            pool_id: self.pool_id,
            _pool: std::marker::PhantomData,
        }
    }
}

impl SlotFiller<'_> {
    /// The first `len` bytes of the token's slot, writable while the token
    /// is borrowed.
    pub fn slot_mut<'t>(&self, token: &'t mut SlotToken, len: usize) -> Result<&'t mut [u8]> {
        if token.pool_id != self.pool_id || len > self.slot_size {
            return Err(VerbsError::Invalid(format!(
                "slot {} of pool {} (len {len}) used with pool {}",
                token.index, token.pool_id, self.pool_id
            )));
        }
        // SAFETY: the slot lies inside the pool's allocation (tokens are only
        // created for indices < count, len <= slot_size); the token is unique
        // and mutably borrowed for 't, so no other reference to these bytes
        // exists meanwhile; the pool outlives the filler.
        Ok(unsafe {
            std::slice::from_raw_parts_mut(self.base.add(token.index * self.slot_size), len)
        })
    }
}
