// Nor any other way to borrow the ring's bytes as a slice: no Deref to
// `[u8]`, no `Borrow<[u8]>`, no method that hands out `&[u8]` or
// `&mut [u8]`. The only way to its bytes is `copy_out`.
use rdma_xfer::sys::rdma::RemoteRing;
use std::borrow::Borrow;

fn deref(ring: &RemoteRing) -> &[u8] {
    &**ring
}

fn borrow(ring: &RemoteRing) -> &[u8] {
    ring.borrow()
}

fn as_slice(ring: &RemoteRing) -> &[u8] {
    ring.as_slice()
}

fn as_mut(ring: &mut RemoteRing) -> &mut [u8] {
    ring.as_mut()
}

fn main() {}
