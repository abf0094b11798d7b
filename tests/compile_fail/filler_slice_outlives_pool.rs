// A slot filled on another thread cannot be kept past its filler (and so
// past the pool): that would write deregistered, freed memory.
use rdma_xfer::sys::rdma::{BufferPool, ProtectionDomain};
use std::rc::Rc;

fn use_after_free(pd: &Rc<ProtectionDomain>) {
    let (pool, mut bufs) = BufferPool::new(pd, 4096, 1).unwrap();
    let mut buf = bufs.pop().unwrap();
    let filler = pool.filler();
    let slot = filler.slot_mut(&mut buf, 16).unwrap();
    drop(filler);
    drop(pool);
    slot[0] = 1;
}

fn main() {}
