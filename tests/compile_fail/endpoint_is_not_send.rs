// Endpoints, pools and rings stay on the thread that made them (their
// parents are reference-counted with Rc and posted buffers live in them).
use rdma_xfer::sys::rdma::{BufferPool, Endpoint, RemoteRing};

fn sendable<T: Send>() {}

fn main() {
    sendable::<Endpoint>();
    sendable::<BufferPool>();
    sendable::<RemoteRing>();
}
