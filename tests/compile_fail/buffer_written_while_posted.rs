// Posting moves the buffer into the endpoint: a slice borrowed before the
// post cannot be written while the NIC reads the memory.
use rdma_xfer::sys::rdma::{BufferPool, Endpoint};

fn write_after_post(ep: &Endpoint, pool: &BufferPool, mut buf: rdma_xfer::sys::rdma::Buffer) {
    let bytes = pool.bytes_mut(&mut buf, 16).unwrap();
    ep.post_send(pool, buf, 16, 1).unwrap();
    bytes[0] = 1;
}

fn main() {}
