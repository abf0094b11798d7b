//! Registered memory: local buffer pools (slots owned by tokens) and the
//! remotely writable ring (no Rust references to it at all).

use super::pd::ProtectionDomain;
use super::{Result, SysError};
use crate::sys::os::{ensure_memlock, memlock_refusal};
use rdma_sys::*;
use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::marker::PhantomData;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

const PAGE: usize = 4096;

/// Where a ring's I/O virtual address may start: page-aligned, below 2^47
/// so that base + length never overflows.
const RING_IOVA_MASK: u64 = 0x0000_7fff_ffff_f000;

/// What the NIC (and the peer) may do with a registration. Remote read is
/// deliberately not offered: no region of ours is ever readable remotely.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    Local,
    RemoteWrite,
}

/// A page-aligned, zeroed heap allocation registered with a protection
/// domain. Deregistered before the memory is freed, and never freed when
/// deregistration fails (the NIC or the peer might still reach it). Holds
/// its PD alive.
pub(super) struct Registration {
    mr: *mut ibv_mr,
    ptr: *mut u8,
    len: usize,
    layout: Layout,
    /// The address the NIC knows byte 0 by.
    iova: u64,
    pd: Rc<ProtectionDomain>,
}

impl Registration {
    fn new(pd: &Rc<ProtectionDomain>, len: usize, access: Access) -> Result<Self> {
        Self::with_iova(pd, len, access, None)
    }

    /// Registers a new allocation; with `iova`, the NIC (and the peer)
    /// address it from that I/O virtual address instead of its real one.
    fn with_iova(
        pd: &Rc<ProtectionDomain>,
        len: usize,
        access: Access,
        iova: Option<u64>,
    ) -> Result<Self> {
        if len == 0 {
            return Err(SysError::Invalid("cannot register an empty buffer".into()));
        }
        ensure_memlock(len as u64)?;
        let size = len
            .checked_next_multiple_of(PAGE)
            .ok_or_else(|| SysError::Invalid(format!("buffer of {len} bytes is too large")))?;
        let layout = Layout::from_size_align(size, PAGE)
            .map_err(|e| SysError::Invalid(format!("buffer of {len} bytes: {e}")))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(SysError::Invalid(format!(
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
        let flags = flags.0 as libc::c_int;
        let mr = match iova {
            // SAFETY: pd is a live PD; ptr..ptr+len is our own allocation,
            // kept alive until after a successful ibv_dereg_mr in Drop.
            None => unsafe { ibv_reg_mr(pd.raw(), ptr.cast(), len, flags) },
            // SAFETY: as above; the iova only changes how the NIC and the
            // peer name the memory, not which memory is registered.
            Some(iova) => unsafe { ibv_reg_mr_iova(pd.raw(), ptr.cast(), len, iova, flags) },
        };
        if mr.is_null() {
            let err = std::io::Error::last_os_error();
            // SAFETY: ptr was allocated above with this layout and was never
            // registered.
            unsafe { dealloc(ptr, layout) };
            // Under a limit, name it instead of a bare ENOMEM (another
            // thread's registration may have taken the room since the check).
            if err.raw_os_error() == Some(libc::ENOMEM)
                && let Some(refusal) = memlock_refusal(len as u64)
            {
                return Err(refusal);
            }
            return Err(SysError::Call {
                call: "ibv_reg_mr",
                source: err,
            });
        }
        Ok(Registration {
            mr,
            ptr,
            len,
            layout,
            iova: iova.unwrap_or(ptr as u64),
            pd: pd.clone(),
        })
    }

    pub(super) fn pd(&self) -> &Rc<ProtectionDomain> {
        &self.pd
    }

    fn lkey(&self) -> u32 {
        // SAFETY: self.mr is valid while self lives.
        unsafe { (*self.mr).lkey }
    }

    fn rkey(&self) -> u32 {
        // SAFETY: as above.
        unsafe { (*self.mr).rkey }
    }

    /// Checks that `[offset, offset+len)` lies inside the registration.
    fn check(&self, offset: usize, len: usize) -> Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(SysError::Invalid(format!(
                "range {offset}+{len} outside a {}-byte region",
                self.len
            ))),
        }
    }
}

/// What to do with the memory once `ibv_dereg_mr` returned `rc`.
#[derive(Debug, PartialEq, Eq)]
enum AfterDereg {
    Free,
    /// Deregistration failed: the memory may still be registered (and, for
    /// the ring, remotely writable), so it must never be reused.
    Leak,
}

fn after_dereg(rc: libc::c_int) -> AfterDereg {
    if rc == 0 {
        AfterDereg::Free
    } else {
        AfterDereg::Leak
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        // SAFETY: mr is valid and deregistered exactly once.
        let rc = unsafe { ibv_dereg_mr(self.mr) };
        match after_dereg(rc) {
            AfterDereg::Free => {
                // SAFETY: deregistration succeeded, so neither the NIC nor
                // the peer can reach the memory any more; ptr/layout are
                // those of the allocation in `new`.
                unsafe { dealloc(self.ptr, self.layout) }
            }
            AfterDereg::Leak => tracing::error!(
                bytes = self.len,
                "ibv_dereg_mr failed ({}): the memory stays allocated (leaked) because the \
                 device may still access it",
                std::io::Error::from_raw_os_error(rc.saturating_abs())
            ),
        }
    }
}

/// Registered memory for local use (send, receive and staging buffers),
/// cut into `count` slots of `slot_size` bytes. Each slot is owned by one
/// [`Buffer`]; the pool hands out a slot's bytes only against its buffer.
pub struct BufferPool {
    mem: PoolMemory,
    slot_size: usize,
    count: usize,
    id: u64,
}

/// A pool's memory: registered with a protection domain, or (for the
/// engine's unit tests, which have no device) plain memory that no work
/// request can use.
enum PoolMemory {
    Registered(Rc<Registration>),
    #[cfg(test)]
    Plain(PlainMemory),
}

impl PoolMemory {
    fn ptr(&self) -> *mut u8 {
        match self {
            PoolMemory::Registered(r) => r.ptr,
            #[cfg(test)]
            PoolMemory::Plain(p) => p.ptr,
        }
    }
}

/// A zeroed heap allocation, registered with nothing.
#[cfg(test)]
struct PlainMemory {
    ptr: *mut u8,
    layout: Layout,
}

#[cfg(test)]
impl Drop for PlainMemory {
    fn drop(&mut self) {
        // SAFETY: ptr/layout are those of the allocation in
        // `BufferPool::in_memory`, which no device ever knew.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// The exclusive right to one slot of one [`BufferPool`]. Not `Clone`:
/// whoever holds it may read and write the slot, and posting a work request
/// on the slot moves it into the endpoint until the completion.
#[derive(Debug)]
pub struct Buffer {
    index: usize,
    pool: u64,
}

impl Buffer {
    /// The slot's index in its pool.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl BufferPool {
    /// Registers `count` slots of `slot_size` bytes (local access only) and
    /// returns the pool with the one buffer of each slot, in index order.
    pub fn new(
        pd: &Rc<ProtectionDomain>,
        slot_size: usize,
        count: usize,
    ) -> Result<(Self, Vec<Buffer>)> {
        if slot_size == 0 || count == 0 {
            return Err(SysError::Invalid("a buffer pool needs slots".into()));
        }
        let len = slot_size
            .checked_mul(count)
            .ok_or_else(|| SysError::Invalid("buffer pool too large".into()))?;
        let mem = Rc::new(Registration::new(pd, len, Access::Local)?);
        Ok(Self::with_buffers(
            PoolMemory::Registered(mem),
            slot_size,
            count,
        ))
    }

    /// A pool in plain memory, for unit tests without a device: its
    /// buffers are filled and read as a registered pool's, and every post
    /// of one is refused.
    #[cfg(test)]
    pub fn in_memory(slot_size: usize, count: usize) -> Result<(Self, Vec<Buffer>)> {
        let len = slot_size
            .checked_mul(count)
            .filter(|&len| len > 0)
            .ok_or_else(|| SysError::Invalid("a buffer pool needs slots".into()))?;
        let layout = Layout::from_size_align(len, PAGE)
            .map_err(|e| SysError::Invalid(format!("buffer of {len} bytes: {e}")))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(SysError::Invalid(format!(
                "out of memory allocating {len} bytes"
            )));
        }
        let mem = PoolMemory::Plain(PlainMemory { ptr, layout });
        Ok(Self::with_buffers(mem, slot_size, count))
    }

    /// The pool over `mem` (`slot_size * count` bytes) and one buffer per slot.
    fn with_buffers(mem: PoolMemory, slot_size: usize, count: usize) -> (Self, Vec<Buffer>) {
        static NEXT_POOL: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_POOL.fetch_add(1, Ordering::Relaxed);
        let buffers = (0..count).map(|index| Buffer { index, pool: id }).collect();
        let pool = BufferPool {
            mem,
            slot_size,
            count,
            id,
        };
        (pool, buffers)
    }

    /// Size of each slot in bytes.
    pub fn slot_size(&self) -> usize {
        self.slot_size
    }

    /// Number of slots.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The first `len` bytes of `buf`'s slot, readable while both the pool
    /// and the buffer are borrowed (so not while the buffer is posted).
    pub fn bytes<'a>(&'a self, buf: &'a Buffer, len: usize) -> Result<&'a [u8]> {
        let ptr = self.slot_ptr(buf, len)?;
        // SAFETY: the range lies inside the live allocation (slot_ptr
        // checked it) and is initialised (zeroed, then written by us or by
        // a receive that completed); `buf` is the slot's only token and is
        // borrowed for 'a, so nobody can write the slot meanwhile.
        Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// The first `len` bytes of `buf`'s slot, writable while both the pool
    /// and the buffer are borrowed.
    pub fn bytes_mut<'a>(&'a self, buf: &'a mut Buffer, len: usize) -> Result<&'a mut [u8]> {
        let ptr = self.slot_ptr(buf, len)?;
        // SAFETY: as in `bytes`; `buf` is mutably borrowed for 'a, so this
        // is the only reference to the slot.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Write access to the slots for one other thread (`std::thread::scope`),
    /// bounded by a borrow of the pool.
    pub fn filler(&self) -> BufferFiller<'_> {
        BufferFiller {
            base: self.mem.ptr(),
            slot_size: self.slot_size,
            count: self.count,
            id: self.id,
            _pool: PhantomData,
        }
    }

    /// Start of the first `len` bytes of `buf`'s slot, after checking that
    /// `buf` belongs to this pool and `len` fits the slot.
    fn slot_ptr(&self, buf: &Buffer, len: usize) -> Result<*mut u8> {
        let offset = self.offset(buf, len)?;
        // SAFETY: offset + len <= slot_size * count, the allocation's size.
        Ok(unsafe { self.mem.ptr().add(offset) })
    }

    /// Byte offset of `buf`'s slot, after the same checks.
    fn offset(&self, buf: &Buffer, len: usize) -> Result<usize> {
        slot_offset(self.id, self.slot_size, self.count, buf, len)
    }

    /// The scatter entry for the first `len` bytes of `buf`'s slot.
    pub(super) fn scatter_entry(&self, buf: &Buffer, len: usize) -> Result<ibv_sge> {
        let offset = self.offset(buf, len)?;
        let mem = self.registration()?;
        mem.check(offset, len)?;
        let length = u32::try_from(len)
            .map_err(|_| SysError::Invalid(format!("{len} bytes exceed one work request")))?;
        Ok(ibv_sge {
            addr: mem.ptr as u64 + offset as u64,
            length,
            lkey: mem.lkey(),
        })
    }

    /// The registration, kept alive by a posted request until it completes.
    pub(super) fn registration(&self) -> Result<&Rc<Registration>> {
        match &self.mem {
            PoolMemory::Registered(r) => Ok(r),
            #[cfg(test)]
            PoolMemory::Plain(_) => Err(SysError::Invalid(
                "a buffer in plain memory cannot be posted".into(),
            )),
        }
    }
}

fn slot_offset(id: u64, slot_size: usize, count: usize, buf: &Buffer, len: usize) -> Result<usize> {
    if buf.pool != id || buf.index >= count {
        return Err(SysError::Invalid(format!(
            "buffer {} of pool {} used with pool {id}",
            buf.index, buf.pool
        )));
    }
    if len > slot_size {
        return Err(SysError::Invalid(format!(
            "{len} bytes do not fit a {slot_size}-byte slot"
        )));
    }
    Ok(buf.index * slot_size)
}

/// Write access to a pool's slots from one other thread, bounded by a
/// borrow of the pool. A slot is reached only through its buffer, so two
/// threads never get the same bytes.
pub struct BufferFiller<'p> {
    base: *mut u8,
    slot_size: usize,
    count: usize,
    id: u64,
    _pool: PhantomData<&'p BufferPool>,
}

// SAFETY: the filler hands out a slot only against a `&mut Buffer` of the
// same pool, and each buffer exists once, so no two threads get the same
// bytes; the pool borrow keeps the memory allocated (and registered, if it
// is) for as long as the filler lives. It is not `Sync` (raw pointer field).
unsafe impl Send for BufferFiller<'_> {}

impl BufferFiller<'_> {
    /// The first `len` bytes of `buf`'s slot, writable while both the
    /// filler (hence the pool) and the buffer are borrowed.
    pub fn slot_mut<'t>(&'t self, buf: &'t mut Buffer, len: usize) -> Result<&'t mut [u8]> {
        let offset = slot_offset(self.id, self.slot_size, self.count, buf, len)?;
        // SAFETY: the slot lies inside the pool's allocation (checked
        // above), which outlives 't (the filler borrows the pool); `buf` is
        // the slot's only token and is mutably borrowed for 't, so no other
        // reference to these bytes exists meanwhile.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.base.add(offset), len) })
    }
}

/// Memory the peer may RDMA WRITE into (the receiver's ring). There is no
/// `&[u8]` view of it: the peer and the NIC may change it at any moment,
/// and a Rust reference to memory that changes under it is undefined
/// behaviour. Its bytes are copied out with raw-pointer operations.
pub struct RemoteRing {
    mem: Registration,
}

impl RemoteRing {
    /// Registers `len` bytes for remote write (never remote read), at a
    /// random page-aligned I/O virtual address: the peer never learns where
    /// the ring lives in our memory, and an address learnt from another
    /// session's ring means nothing in this one.
    pub fn new(pd: &Rc<ProtectionDomain>, len: usize) -> Result<Self> {
        let mut random = [0u8; 8];
        getrandom::fill(&mut random)
            .map_err(|e| SysError::Invalid(format!("no random bytes for the ring: {e}")))?;
        let iova = u64::from_ne_bytes(random) & RING_IOVA_MASK;
        Ok(RemoteRing {
            mem: Registration::with_iova(pd, len, Access::RemoteWrite, Some(iova))?,
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.mem.len
    }

    /// Always false: an empty ring cannot be registered.
    pub fn is_empty(&self) -> bool {
        self.mem.len == 0
    }

    /// The key the peer writes with.
    pub fn rkey(&self) -> u32 {
        self.mem.rkey()
    }

    /// The address the peer uses for byte 0 of the ring (an I/O virtual
    /// address, not where the ring lives in our memory).
    pub fn remote_addr(&self) -> u64 {
        self.mem.iova
    }

    /// Copies `dst.len()` bytes starting at `offset` into `dst`. The caller
    /// chooses a range the peer has finished writing (its completion came
    /// and no credit for it went back); if a misbehaving peer writes it
    /// anyway, `dst` gets some mix of old and new bytes, but everything
    /// done afterwards (checksum, write to disk) sees one private copy.
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        self.mem.check(offset, dst.len())?;
        // SAFETY: the source range lies inside the live, writable
        // allocation (checked above), apart from the distinct, exclusively
        // borrowed destination.
        unsafe { copy_from_shared(self.mem.ptr.add(offset), dst) };
        Ok(())
    }
}

/// Copies the start of `src` into `dst` as `RemoteRing::copy_out` copies
/// out of the ring (the same code), from ordinary memory: what the
/// receiver's per-byte path costs can be measured without an RDMA device
/// (registration does not change the copy). `src` is `&mut` because the
/// copy's atomic loads need writable memory.
pub fn ring_copy(src: &mut [u8], dst: &mut [u8]) -> Result<()> {
    if dst.len() > src.len() {
        return Err(SysError::Invalid(format!(
            "a copy of {} bytes from {} bytes",
            dst.len(),
            src.len()
        )));
    }
    // SAFETY: `src` is live, writable memory (exclusively borrowed) of at
    // least `dst.len()` bytes (checked above), distinct from `dst` (both
    // are borrowed at once).
    unsafe { copy_from_shared(src.as_mut_ptr(), dst) };
    Ok(())
}

/// Copies `dst.len()` bytes from `src`, memory that another agent (the NIC,
/// on behalf of the peer) may write at the same time. Every source byte is
/// read by a relaxed atomic load (8 bytes at a time where aligned), never
/// by a plain read or through a reference: a concurrent write then gives
/// torn but defined values instead of a data race, and the compiler cannot
/// assume the bytes stay put (it may not read them again later in place
/// of the copy).
///
/// # Safety
/// `src..src + dst.len()` must lie inside one live allocation that is
/// valid for reads and writes (the atomic types require writable memory
/// even for loads) and must not overlap `dst`.
unsafe fn copy_from_shared(src: *const u8, dst: &mut [u8]) {
    use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};
    let src = src.cast_mut();
    let n = dst.len();
    let byte = |i: usize| {
        // SAFETY: i < n, so the address lies inside the range the caller
        // vouches for (writable memory of this process); a byte needs no
        // alignment.
        unsafe { AtomicU8::from_ptr(src.add(i)).load(Relaxed) }
    };
    let mut i = 0;
    while i < n && !(src as usize + i).is_multiple_of(8) {
        dst[i] = byte(i);
        i += 1;
    }
    // The aligned middle, a word at a time (no bounds checks in the loop:
    // about 18 GB/s on the build machine against memcpy's 30).
    let words = src.wrapping_add(i).cast::<u64>();
    let mut middle = dst[i..].chunks_exact_mut(8);
    for (k, out) in middle.by_ref().enumerate() {
        // SAFETY: word k covers bytes i + 8k .. i + 8k + 8 <= n of the
        // caller's range; the head loop made src + i 8-aligned.
        let word = unsafe { AtomicU64::from_ptr(words.add(k)).load(Relaxed) };
        out.copy_from_slice(&word.to_ne_bytes());
    }
    i = n - middle.into_remainder().len();
    while i < n {
        dst[i] = byte(i);
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_memory_copies_exactly_at_any_alignment_and_length() {
        let src: Vec<u8> = (0..300u32).map(|i| (i * 7 + 3) as u8).collect();
        for start in 0..9 {
            for len in [0, 1, 7, 8, 9, 15, 16, 17, 64, 255, 291 - start] {
                let mut copy = src.clone();
                let base = copy.as_mut_ptr();
                let mut dst = vec![0u8; len];
                // SAFETY: start + len <= 300 lies inside `copy`, a live,
                // writable allocation distinct from `dst`.
                unsafe { copy_from_shared(base.add(start), &mut dst) };
                assert_eq!(dst, &src[start..start + len], "start {start} len {len}");
            }
        }
        // Throughput, for docs/performance.md (printed with --nocapture).
        let mut big = vec![0x5au8; 1 << 20];
        let base = big.as_mut_ptr();
        let mut dst = vec![0u8; 1 << 20];
        // SAFETY: as above (once untimed: the first touch of dst faults).
        unsafe { copy_from_shared(base, &mut dst) };
        let t = std::time::Instant::now();
        for _ in 0..64 {
            // SAFETY: as above.
            unsafe { copy_from_shared(base, &mut dst) };
        }
        let secs = t.elapsed().as_secs_f64();
        eprintln!("copy_from_shared: {:.0} MiB/s", 64.0 / secs);
        assert!(dst.iter().all(|&b| b == 0x5a));
    }

    #[test]
    fn the_ring_copy_of_ordinary_memory_copies_its_start_and_no_more() {
        let mut src: Vec<u8> = (0..100u8).collect();
        let mut dst = vec![0u8; 60];
        ring_copy(&mut src[3..], &mut dst).unwrap();
        assert_eq!(dst, &src[3..63]);
        assert!(ring_copy(&mut src[50..], &mut dst).is_err());
    }

    #[test]
    fn memory_is_freed_only_after_a_successful_deregistration() {
        assert_eq!(after_dereg(0), AfterDereg::Free);
        for rc in [libc::EBUSY, libc::EINVAL, -1, -libc::EBUSY] {
            assert_eq!(after_dereg(rc), AfterDereg::Leak, "rc {rc}");
        }
    }

    #[test]
    fn a_buffer_only_opens_its_own_pool_and_slot() {
        let own = Buffer { index: 2, pool: 7 };
        assert_eq!(slot_offset(7, 4096, 4, &own, 4096).unwrap(), 2 * 4096);
        assert_eq!(slot_offset(7, 4096, 4, &own, 0).unwrap(), 2 * 4096);
        // Too long for the slot.
        assert!(slot_offset(7, 4096, 4, &own, 4097).is_err());
        // Another pool's buffer, even with a valid index.
        assert!(slot_offset(8, 4096, 4, &own, 16).is_err());
        // An index past the pool (cannot be built outside this module, but
        // the check does not rely on that).
        let past = Buffer { index: 4, pool: 7 };
        assert!(slot_offset(7, 4096, 4, &past, 1).is_err());
    }
}
