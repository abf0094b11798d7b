//! The safety checks of the verbs wrapper (src/sys/rdma) on a real RDMA
//! stack: a posted buffer comes back only with its completion, misuse that
//! the types cannot rule out fails with an error instead of reaching the
//! NIC (another pool's buffer, another PD's memory, a work request id
//! already in flight, ranges out of bounds), and the peer addresses the
//! ring by offset, never by our heap address. tests/compile_fail.rs proves
//! the rest at compile time.

use rdma_xfer::sys::SysError;
use rdma_xfer::sys::rdma::{
    BufferPool, CmId, Completion, Endpoint, EventChannel, QpCaps, RemoteRing, RemoteTarget,
    WcOpcode,
};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TIMEOUT: Duration = Duration::from_secs(20);
const RING: usize = 4 * 4096;
const CAPS: QpCaps = QpCaps {
    max_send_wr: 8,
    max_recv_wr: 8,
};

/// Waits for `n` completions (panics on a failed one or a timeout).
fn completions(ep: &Endpoint, n: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for {n} completions");
        ep.wait(&mut out, n, left, "completions")
            .expect("completion");
    }
    out
}

fn is_invalid(r: Result<(), SysError>, what: &str) -> String {
    match r {
        Err(SysError::Invalid(msg)) => msg,
        other => panic!("{what}: expected an Invalid error, got {other:?}"),
    }
}

/// The passive side: a ring and one receive buffer; reports what arrived.
fn serve(addr: SocketAddr, ready: mpsc::Sender<RemoteTarget>, done: mpsc::Sender<Vec<u8>>) {
    let channel = EventChannel::new().expect("event channel");
    let listener = CmId::new(&channel).expect("cm id");
    listener.listen(addr, 4).expect("listen");
    let mut request = None;
    let deadline = Instant::now() + TIMEOUT;
    while request.is_none() {
        assert!(Instant::now() < deadline, "no connection request");
        request = listener
            .get_request(Duration::from_millis(200))
            .expect("get_request");
    }
    let id = request
        .expect("request")
        .detach()
        .expect("detach")
        .into_id()
        .expect("id");
    let ep = Endpoint::new(id, CAPS, false).expect("endpoint");
    let ring = RemoteRing::new(ep.pd(), RING).expect("ring");
    let (pool, mut bufs) = BufferPool::new(ep.pd(), 256, 2).expect("pool");
    // A receive for the SEND, one for the WRITE WITH IMM.
    ep.post_recv(&pool, bufs.pop().expect("buffer"), 1)
        .expect("post_recv");
    ep.post_recv(&pool, bufs.pop().expect("buffer"), 2)
        .expect("post_recv");
    ep.cm_id().accept(TIMEOUT).expect("accept");
    // The ring's address and key travel out of band here (the tools send
    // them in the MR message).
    ready
        .send(RemoteTarget {
            addr: ring.remote_addr(),
            rkey: ring.rkey(),
        })
        .expect("tell the ring");
    // The peer learns a random I/O address, not where the ring lives in
    // our memory: a second ring gets another one.
    let other = RemoteRing::new(ep.pd(), RING).expect("ring");
    assert_ne!(ring.remote_addr(), other.remote_addr());
    assert_eq!(ring.remote_addr() % 4096, 0);
    // Nothing of this process lives at either address: they are not where
    // the rings' memory is (a heap address would lie in a mapping).
    for r in [&ring, &other] {
        let (start, end) = (r.remote_addr(), r.remote_addr() + RING as u64);
        let hit = mappings()
            .into_iter()
            .find(|(lo, hi, _)| start < *hi && *lo < end);
        assert_eq!(
            hit, None,
            "the ring's address {start:#x} is memory of this process"
        );
    }
    drop(other);
    let mut got = Vec::new();
    for wc in completions(&ep, 2) {
        match wc.opcode {
            WcOpcode::Recv => {
                let buf = wc.buffer.expect("a receive gives its buffer back");
                got.extend_from_slice(pool.bytes(&buf, wc.byte_len as usize).expect("bytes"));
            }
            WcOpcode::RecvWithImm(imm) => {
                assert_eq!(imm, 0xfeed_f00d);
                let mut data = vec![0u8; 100];
                ring.copy_out(4096, &mut data).expect("copy_out");
                got.extend_from_slice(&data);
            }
            other => panic!("unexpected completion {other:?}"),
        }
    }
    // Out of bounds copies are refused.
    assert!(ring.copy_out(RING - 10, &mut [0u8; 11]).is_err());
    assert!(ring.copy_out(usize::MAX, &mut [0u8; 1]).is_err());
    done.send(got).expect("report");
    // Keep the connection until the client is done with it.
    let _ = ep.cm_id().disconnected_within(TIMEOUT);
}

#[test]
fn posting_moves_the_buffer_until_its_completion_and_checks_what_it_cannot_prove() {
    let Some(net) = crate::support::rdma_net() else {
        return;
    };
    let port = crate::support::next_port();
    let addr: SocketAddr = format!("{}:{port}", net.addr_a).parse().expect("address");
    let (ready_tx, ready_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let server = std::thread::spawn(move || serve(addr, ready_tx, done_tx));

    let source = net.addr_b.as_deref().map(|a| a.parse().expect("source"));
    let channel = EventChannel::new().expect("event channel");
    // The listener may not be up yet: retry the connection set-up.
    let deadline = Instant::now() + TIMEOUT;
    let ep = loop {
        let id = CmId::new(&channel).expect("cm id");
        id.resolve(source, addr, TIMEOUT).expect("resolve");
        let ep = Endpoint::new(id, CAPS, false).expect("endpoint");
        match ep.cm_id().connect(Duration::from_secs(2)) {
            Ok(()) => break ep,
            Err(e) => {
                assert!(Instant::now() < deadline, "cannot connect: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    };
    let target = ready_rx.recv_timeout(TIMEOUT).expect("ring");

    let (pool, mut bufs) = BufferPool::new(ep.pd(), 4096, 2).expect("pool");
    let (other_pool, mut other_bufs) = BufferPool::new(ep.pd(), 4096, 1).expect("pool");
    // Another connection's PD: its memory must never be posted here.
    let foreign_id = CmId::new(&channel).expect("cm id");
    foreign_id.resolve(source, addr, TIMEOUT).expect("resolve");
    let foreign = Endpoint::new(foreign_id, CAPS, false).expect("endpoint");
    let (foreign_pool, mut foreign_bufs) = BufferPool::new(foreign.pd(), 4096, 1).expect("pool");

    // A failed post that the provider did not pin on our request (its
    // `bad_wr`) may have been queued: rxe queues a SEND on a queue pair that
    // is not connected yet, then its doorbell fails. Such a request keeps
    // its buffer and its work request id until its completion or the QP's
    // end, so the id cannot be reused meanwhile: the old completion would
    // hand back the new buffer while the NIC may still use it.
    let (early_pool, mut early) = BufferPool::new(foreign.pd(), 4096, 2).expect("pool");
    let rxe = foreign
        .cm_id()
        .bound_device()
        .is_some_and(|(name, _)| name.starts_with("rxe"));
    match foreign.post_send(&early_pool, early.pop().expect("buffer"), 8, 92) {
        Err(SysError::PostHeld { call, .. }) => {
            assert_eq!(call, "ibv_post_send");
            let msg = is_invalid(
                foreign.post_recv(&early_pool, early.pop().expect("buffer"), 92),
                "the id of a request that may still run",
            );
            assert!(msg.contains("already in flight"), "{msg}");
        }
        other => {
            assert!(
                !rxe,
                "rxe queues a SEND before connect and fails its doorbell: {other:?}"
            );
            eprintln!("not rxe: the held post is not checked here ({other:?})");
        }
    }

    // No queue takes more requests than it was sized for: the CQ holds a
    // completion for each of those and no more (the provider may grant
    // more than asked). The refused request leaves nothing behind: its id
    // is free again.
    let (full_pool, mut full) =
        BufferPool::new(foreign.pd(), 4096, CAPS.max_recv_wr as usize + 2).expect("pool");
    for i in 0..u64::from(CAPS.max_recv_wr) {
        foreign
            .post_recv(&full_pool, full.pop().expect("buffer"), 200 + i)
            .expect("a receive within the queue's size");
    }
    let msg = is_invalid(
        foreign.post_recv(&full_pool, full.pop().expect("buffer"), 300),
        "a receive past the queue's size",
    );
    assert!(msg.contains("receive queue is full"), "{msg}");
    let msg = is_invalid(
        foreign.post_recv(&full_pool, full.pop().expect("buffer"), 300),
        "a receive past the queue's size, again",
    );
    assert!(msg.contains("receive queue is full"), "{msg}");

    // A buffer of one pool opens nothing in another.
    let mut stray = other_bufs.pop().expect("buffer");
    assert!(pool.bytes(&stray, 1).is_err());
    assert!(pool.bytes_mut(&mut stray, 1).is_err());
    assert!(other_pool.bytes(&stray, 4097).is_err());
    let msg = is_invalid(ep.post_send(&pool, stray, 8, 90), "another pool's buffer");
    assert!(msg.contains("pool"), "{msg}");
    let msg = is_invalid(
        ep.post_send(&foreign_pool, foreign_bufs.pop().expect("buffer"), 8, 91),
        "another PD's memory",
    );
    assert!(msg.contains("protection domain"), "{msg}");

    // SEND: the buffer is gone until the completion hands it back.
    let mut send = bufs.pop().expect("buffer");
    let index = send.index();
    pool.bytes_mut(&mut send, 5)
        .expect("bytes")
        .copy_from_slice(b"hello");
    ep.post_send(&pool, send, 5, 7).expect("post_send");
    // The same work request id cannot be in flight twice.
    let mut write = bufs.pop().expect("buffer");
    let pattern: Vec<u8> = (0..100u8).map(|i| i.wrapping_mul(7)).collect();
    pool.bytes_mut(&mut write, 100)
        .expect("bytes")
        .copy_from_slice(&pattern);
    let msg = is_invalid(
        ep.post_write_imm(&pool, write, 100, target, 0, 7),
        "a duplicate work request id",
    );
    assert!(msg.contains("already in flight"), "{msg}");
    let back = completions(&ep, 1).pop().expect("completion");
    assert_eq!((back.wr_id, back.opcode), (7, WcOpcode::Send));
    let send = back.buffer.expect("the completion returns the buffer");
    assert_eq!(send.index(), index);
    assert_eq!(pool.bytes(&send, 5).expect("bytes"), b"hello");

    // WRITE WITH IMM at ring offset 4096 (the duplicate above dropped its
    // buffer, so use the one that came back).
    let mut write = send;
    pool.bytes_mut(&mut write, 100)
        .expect("bytes")
        .copy_from_slice(&pattern);
    let at = RemoteTarget {
        addr: target.addr + 4096,
        rkey: target.rkey,
    };
    ep.post_write_imm(&pool, write, 100, at, 0xfeed_f00d, 8)
        .expect("post_write_imm");
    let back = completions(&ep, 1).pop().expect("completion");
    assert_eq!((back.wr_id, back.opcode), (8, WcOpcode::RdmaWrite));
    assert!(back.buffer.is_some());

    let got = done_rx.recv_timeout(TIMEOUT).expect("server result");
    let mut want = b"hello".to_vec();
    want.extend_from_slice(&pattern);
    assert_eq!(got, want);
    ep.cm_id().disconnect(Duration::from_secs(2));
    server.join().expect("server thread");
}

#[test]
fn each_id_on_a_shared_event_channel_gets_its_own_events() {
    let Some(net) = crate::support::rdma_net() else {
        return;
    };
    let port = crate::support::next_port();
    let addr: SocketAddr = format!("{}:{port}", net.addr_a).parse().expect("address");
    // A listener and another id on one channel.
    let channel = EventChannel::new().expect("event channel");
    let listener = CmId::new(&channel).expect("cm id");
    listener.listen(addr, 4).expect("listen");
    let bystander = CmId::new(&channel).expect("cm id");

    let source: Option<std::net::IpAddr> =
        net.addr_b.as_deref().map(|a| a.parse().expect("source"));
    let (requested_tx, requested_rx) = mpsc::channel();
    let client = std::thread::spawn(move || {
        let channel = EventChannel::new().expect("event channel");
        let id = CmId::new(&channel).expect("cm id");
        id.resolve(source, addr, TIMEOUT).expect("resolve");
        let ep = Endpoint::new(id, CAPS, false).expect("endpoint");
        // Says when the request is on its way (rdma_connect returned).
        ep.cm_id()
            .connect_while(TIMEOUT, || requested_tx.send(()).expect("signal"))
            .expect("connect");
        let _ = ep.cm_id().disconnected_within(TIMEOUT);
    });

    // The bystander waits for its own events, from when the request is on
    // its way: the connection request that arrives meanwhile is the
    // listener's, and stays the listener's.
    requested_rx
        .recv_timeout(TIMEOUT)
        .expect("the client's request");
    assert!(!bystander.disconnected_within(Duration::from_secs(2)));
    let request = listener
        .get_request(TIMEOUT)
        .expect("get_request")
        .expect("the request read while the bystander waited is kept for the listener");
    let id = request.detach().expect("detach").into_id().expect("id");
    let ep = Endpoint::new(id, CAPS, false).expect("endpoint");
    ep.cm_id().accept(TIMEOUT).expect("accept");
    ep.cm_id().disconnect(Duration::from_secs(2));
    client.join().expect("client thread");
}

/// This process's memory mappings: (start, end, line) from /proc/self/maps.
fn mappings() -> Vec<(u64, u64, String)> {
    let maps = std::fs::read_to_string("/proc/self/maps").expect("/proc/self/maps");
    maps.lines()
        .filter_map(|line| {
            let range = line.split_whitespace().next()?;
            let (lo, hi) = range.split_once('-')?;
            Some((
                u64::from_str_radix(lo, 16).ok()?,
                u64::from_str_radix(hi, 16).ok()?,
                line.to_string(),
            ))
        })
        .collect()
}
