// A buffer's bytes cannot outlive the pool that registered them.
use rdma_xfer::sys::rdma::{BufferPool, ProtectionDomain};
use std::rc::Rc;

fn use_after_free(pd: &Rc<ProtectionDomain>) {
    let (pool, mut bufs) = BufferPool::new(pd, 4096, 1).unwrap();
    let mut buf = bufs.pop().unwrap();
    let bytes = pool.bytes_mut(&mut buf, 16).unwrap();
    drop(pool);
    bytes[0] = 1;
}

fn main() {}
