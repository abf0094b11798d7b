// A filler may move to one other thread, but not be shared by several:
// two threads could then fill slots through it at the same time.
use rdma_xfer::sys::rdma::BufferFiller;

fn shared<T: Sync>() {}

fn main() {
    shared::<BufferFiller<'static>>();
}
