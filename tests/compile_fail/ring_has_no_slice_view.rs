// Remotely writable memory has no `&[u8]` view: the peer may change it at
// any moment. Its bytes are only copied out.
use rdma_xfer::sys::rdma::RemoteRing;

fn view(ring: &RemoteRing) -> &[u8] {
    ring.as_ref()
}

fn deref(ring: &RemoteRing) -> &[u8] {
    &ring[..]
}

fn main() {}
