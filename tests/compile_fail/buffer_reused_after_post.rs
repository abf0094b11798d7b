// After a post the buffer belongs to the endpoint until its completion
// gives it back: it cannot be opened (or posted) again meanwhile.
use rdma_xfer::sys::rdma::{Buffer, BufferPool, Endpoint};

fn reuse_after_post(ep: &Endpoint, pool: &BufferPool, mut buf: Buffer) {
    ep.post_recv(pool, buf, 1).unwrap();
    pool.bytes_mut(&mut buf, 16).unwrap()[0] = 1;
}

fn main() {}
