// A buffer is the one right to its slot: it cannot be duplicated.
use rdma_xfer::sys::rdma::{Buffer, BufferPool, Endpoint};

fn two_owners(ep: &Endpoint, pool: &BufferPool, buf: Buffer) {
    let copy = buf.clone();
    ep.post_recv(pool, buf, 1).unwrap();
    let _ = pool.bytes(&copy, 16);
}

fn main() {}
