//! The connection: rdma_cm, the client's buffers, and the steps run on it.

use crate::output::{describe, hex, say};
use crate::steps::{Imm, Step};
use crate::{Args, Failure};
use rdma_xfer::cli::resolve;
use rdma_xfer::engine::{WrId, WrKind};
use rdma_xfer::proto::{
    CHUNK_TAG_LEN, Channel, ChunkAuth, ChunkKey, ConnectionId, MAX_MESSAGE, Message, NONCE_LEN,
    PROTOCOL_VERSION, Prove, RingInfo, Role, SessionKey, Token, decode, encode_to_vec,
};
use rdma_xfer::sys::SysError;
use rdma_xfer::sys::rdma::{
    Buffer, BufferPool, CmId, Completion, Endpoint, EventChannel, QpCaps, RemoteTarget, WcOpcode,
};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

const RECV_BUFS: usize = 32;
/// Receive buffers are larger than any frame the receiver may send.
const RECV_BUF: usize = 2 * MAX_MESSAGE;
/// Room for oversized raw frames.
const SEND_BUF: usize = 64 << 10;

/// A received message (or undecodable frame), kept until an `expect` takes it.
struct Inbound {
    kind: String,
}

pub(crate) struct Client {
    ep: Endpoint,
    recv_pool: BufferPool,
    send_pool: BufferPool,
    /// The one send buffer, when not posted.
    send_buf: Option<Buffer>,
    /// The data buffer for writes (a pool of one slot) and its buffer when
    /// not posted.
    data: Option<(BufferPool, Option<Buffer>)>,
    ring: Option<RingInfo>,
    /// Nonce of the last CHALLENGE received.
    nonce: Option<[u8; NONCE_LEN]>,
    /// This connection's identity (as a sender computes it).
    identity: ConnectionId,
    /// The key of an honest PROVE, until its AUTH_OK arrives.
    key: Option<SessionKey>,
    /// Seals and opens every message once the receiver proved itself.
    channel: Option<Channel>,
    /// The last sealed message sent (for `replay`).
    last_sealed: Option<Vec<u8>>,
    /// `bad-mac`: alter the next sealed message's tag.
    bad_mac: bool,
    /// Chunks written into the current ring (slot = seq % slot_count).
    seq: u64,
    /// Bytes of chunks written for the current MR (the next chunk's
    /// offset in its offer's data).
    offset: u64,
    /// Once the receiver proved itself: the key that tags each chunk an
    /// honest sender writes (`writes` tags its chunks as one would).
    chunk_key: Option<ChunkKey>,
    /// HELLOs and BATCHes sent (the current offer's number).
    offers: u64,
    inbox: VecDeque<Inbound>,
    /// Work requests of ours not completed yet (sends and writes).
    outstanding: u32,
    disconnected: bool,
    /// Set once a work request failed: the QP is in the error state.
    broken: Option<String>,
    timeout: Duration,
    wcs: Vec<Completion>,
}

impl Client {
    pub(crate) fn connect(args: &Args) -> Result<Self, Failure> {
        let timeout = Duration::from_secs(args.timeout.max(1));
        let host = args.addr.as_deref().unwrap_or_default();
        let addr = resolve(host, args.port).map_err(|e| Failure::Connect(e.to_string()))?;
        let c = |e: SysError| Failure::Connect(format!("{addr}: {e}"));
        let channel = EventChannel::new().map_err(c)?;
        let id = CmId::new(&channel).map_err(c)?;
        id.resolve(args.source, addr, timeout).map_err(c)?;
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: RECV_BUFS as u32,
        };
        let ep = Endpoint::new(id, caps, false).map_err(c)?;
        let (recv_pool, recv_bufs) = BufferPool::new(ep.pd(), RECV_BUF, RECV_BUFS).map_err(c)?;
        let (send_pool, mut send_bufs) = BufferPool::new(ep.pd(), SEND_BUF, 1).map_err(c)?;
        // --no-receives: the receiver's messages can never be delivered
        // (its SENDs wait for receiver-not-ready retries forever).
        for buf in recv_bufs.into_iter().filter(|_| !args.no_receives) {
            let wr_id = WrId::recv(0, buf.index()).raw();
            ep.post_recv(&recv_pool, buf, wr_id).map_err(c)?;
        }
        ep.cm_id().connect(timeout).map_err(c)?;
        let identity = rdma_xfer::engine::connection_id(&ep, Role::Sender)
            .map_err(|e| Failure::Connect(format!("{addr}: {e}")))?;
        eprintln!(
            "raw-client: connected to {addr} (QPN {} -> {})",
            identity.sender_qpn, identity.receiver_qpn
        );
        Ok(Client {
            identity,
            key: None,
            channel: None,
            last_sealed: None,
            bad_mac: false,
            ep,
            recv_pool,
            send_pool,
            send_buf: send_bufs.pop(),
            data: None,
            ring: None,
            nonce: None,
            seq: 0,
            offset: 0,
            chunk_key: None,
            offers: 0,
            inbox: VecDeque::new(),
            outstanding: 0,
            disconnected: false,
            broken: None,
            timeout,
            wcs: Vec::with_capacity(32),
        })
    }

    pub(crate) fn run(&mut self, step: &Step) -> Result<(), Failure> {
        match step {
            Step::Raw(bytes) => self.send(bytes, "raw frame"),
            Step::Msg(msg) => {
                if matches!(msg, Message::Hello(_) | Message::Batch(_)) {
                    self.offers += 1;
                }
                let mut bytes = encode_to_vec(msg)
                    .map_err(|e| Failure::Usage(format!("cannot encode {}: {e}", msg.kind())))?;
                let mut what = describe(msg);
                if let Some(channel) = self.channel.as_mut() {
                    bytes = channel
                        .seal(&bytes)
                        .map_err(|e| Failure::Usage(format!("cannot seal: {e}")))?;
                    what.push_str(" (sealed)");
                    if std::mem::take(&mut self.bad_mac) {
                        if let Some(last) = bytes.last_mut() {
                            *last ^= 0x01;
                        }
                        what.push_str(" with a forged tag");
                    }
                    self.last_sealed = Some(bytes.clone());
                }
                self.send(&bytes, &what)
            }
            Step::BadMac => {
                self.bad_mac = true;
                Ok(())
            }
            Step::Replay => {
                let bytes = self
                    .last_sealed
                    .clone()
                    .ok_or_else(|| Failure::Usage("replay: nothing sealed sent yet".into()))?;
                self.send(&bytes, "the last sealed message again (replayed)")
            }
            Step::Prove { .. } | Step::Conn(_) => Err(Failure::Usage(
                "prove and conn steps are run by main".into(),
            )),
            Step::Auth(token) => {
                let mac = match Token::new(token.clone()) {
                    None => Vec::new(),
                    Some(t) => t.mac(&self.await_challenge()?).to_vec(),
                };
                self.run(&Step::Msg(Message::Auth { mac }))
            }
            Step::Writes { count, len, imm } => self.writes(*count, *len, *imm),
            Step::WritesTo {
                addr,
                rkey,
                count,
                len,
                imm,
            } => self.writes_to(*addr, *rkey, *count, *len, *imm),
            Step::Rewrite { count, len } => self.rewrite(*count, *len),
            Step::Expect(kinds) => self.expect(kinds),
            Step::ExpectDisconnect => self.expect_disconnect(),
            Step::Sleep(d) => {
                std::thread::sleep(*d);
                self.pump(Duration::ZERO)
            }
            Step::WaitFile(path) => self.wait_file(path),
        }
    }

    fn send(&mut self, bytes: &[u8], what: &str) -> Result<(), Failure> {
        self.usable()?;
        let mut buf = self
            .send_buf
            .take()
            .ok_or_else(|| Failure::Ended("the send buffer was lost with a failed SEND".into()))?;
        match self.send_pool.bytes_mut(&mut buf, bytes.len()) {
            Ok(slot) => slot.copy_from_slice(bytes),
            Err(e) => {
                self.send_buf = Some(buf);
                return Err(Failure::Usage(format!(
                    "frame of {} bytes: {e}",
                    bytes.len()
                )));
            }
        }
        self.ep
            .post_send(&self.send_pool, buf, bytes.len(), WrId::send(0).raw())
            .map_err(|e| Failure::Ended(format!("cannot post a SEND: {e}")))?;
        self.outstanding += 1;
        eprintln!("raw-client: sent {what} ({} bytes)", bytes.len());
        // One send buffer: wait until the NIC is done with it.
        self.drain_outstanding("the SEND to complete")
    }

    fn writes(&mut self, count: u32, len: Option<u32>, imm: Imm) -> Result<(), Failure> {
        self.usable()?;
        let ring = self
            .ring
            .ok_or_else(|| Failure::Usage("writes: no MR received yet".into()))?;
        // With a token a chunk is followed by its tag, as an honest
        // sender's: LEN is the chunk's length (the slot's room by default).
        let tag_len = if self.chunk_key.is_some() {
            CHUNK_TAG_LEN as u32
        } else {
            0
        };
        let len = len.unwrap_or(ring.slot_size.saturating_sub(tag_len)) as usize;
        for _ in 0..count {
            let seq = self.seq;
            let (slot, remote) = slot_of(&ring, seq);
            let tag = self.chunk_key.clone().map(|key| {
                (
                    ChunkAuth {
                        key,
                        offer: self.offers,
                    },
                    self.offset,
                )
            });
            let imm = self.write(len, seq, remote, ring.rkey, imm, tag)?;
            self.seq += 1;
            self.offset += len as u64;
            eprintln!("raw-client: wrote chunk {seq} ({len} bytes, imm {imm:08x}) to slot {slot}");
            if self.broken.is_some() {
                break;
            }
        }
        Ok(())
    }

    /// Plain writes of other bytes (the pattern of the next chunk) over the
    /// slot the last data write went to: after its completion, so the
    /// receiver may or may not have taken its copy yet.
    fn rewrite(&mut self, count: u32, len: Option<u32>) -> Result<(), Failure> {
        self.usable()?;
        let ring = self
            .ring
            .ok_or_else(|| Failure::Usage("rewrite: no MR received yet".into()))?;
        let last = self
            .seq
            .checked_sub(1)
            .ok_or_else(|| Failure::Usage("rewrite: no data written yet".into()))?;
        let (slot, remote) = slot_of(&ring, last);
        let len = len.unwrap_or(ring.slot_size) as usize;
        let mut done = 0;
        for _ in 0..count {
            self.write(
                len,
                last.wrapping_add(1),
                remote,
                ring.rkey,
                Imm::None,
                None,
            )?;
            if self.broken.is_some() {
                break;
            }
            done += 1;
        }
        eprintln!("raw-client: rewrote slot {slot} {done} times ({len} bytes)");
        say(&format!("REWRITE_OK {done}"));
        Ok(())
    }

    /// Writes to wherever we are told, not where the protocol says: the
    /// data of write `i` is the pattern of chunk `i`.
    fn writes_to(
        &mut self,
        addr: Option<u64>,
        rkey: Option<u32>,
        count: u32,
        len: Option<u32>,
        imm: Imm,
    ) -> Result<(), Failure> {
        self.usable()?;
        let own = || {
            self.ring
                .ok_or_else(|| Failure::Usage("writes-to: 'own' but no MR received yet".into()))
        };
        let addr = match addr {
            Some(a) => a,
            None => own()?.addr,
        };
        let rkey = match rkey {
            Some(k) => k,
            None => own()?.rkey,
        };
        let len = len.or(self.ring.map(|r| r.slot_size)).unwrap_or(4096) as usize;
        for i in 0..u64::from(count) {
            let remote = addr.wrapping_add(i.wrapping_mul(len as u64));
            eprintln!("raw-client: writing {len} bytes to {remote:#x} with rkey {rkey:#x}");
            self.write(len, i, remote, rkey, imm, None)?;
            if self.broken.is_some() {
                break;
            }
            say(&format!(
                "WRITE_OK addr={remote:#x} rkey={rkey:#x} len={len}"
            ));
        }
        Ok(())
    }

    /// One RDMA WRITE_WITH_IMM of `len` bytes of the pattern of chunk `seq`
    /// (followed by its tag at `tag`'s offset, when given), waited for (a
    /// failure sets `broken` and prints WR_FAILED); returns the immediate
    /// sent.
    fn write(
        &mut self,
        len: usize,
        seq: u64,
        remote: u64,
        rkey: u32,
        imm: Imm,
        tag: Option<(ChunkAuth, u64)>,
    ) -> Result<u32, Failure> {
        let chunk_len = len;
        let len = len + tag.as_ref().map_or(0, |_| CHUNK_TAG_LEN);
        if self
            .data
            .as_ref()
            .is_none_or(|(pool, buf)| pool.slot_size() < len.max(1) || buf.is_none())
        {
            let (pool, mut bufs) = BufferPool::new(self.ep.pd(), len.max(1), 1)
                .map_err(|e| Failure::Usage(format!("cannot register {len} bytes: {e}")))?;
            self.data = Some((pool, bufs.pop()));
        }
        let Some((pool, Some(mut buf))) = self.data.take() else {
            return Err(Failure::Usage("no data buffer".into()));
        };
        let data = pool
            .bytes_mut(&mut buf, len)
            .map_err(|e| Failure::Usage(e.to_string()))?;
        let (data, tag_space) = data.split_at_mut(chunk_len);
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i as u64).wrapping_mul(31).wrapping_add(seq) as u8;
        }
        if let Some((auth, offset)) = &tag {
            tag_space.copy_from_slice(&auth.tag(*offset, data));
        }
        let crc = crc32fast::hash(data);
        let value = match imm {
            Imm::Crc => Some(crc),
            Imm::Bad => Some(!crc),
            Imm::Value(v) => Some(v),
            Imm::None => None,
        };
        let target = RemoteTarget { addr: remote, rkey };
        let posted = match value {
            None => self
                .ep
                .post_write(&pool, buf, len, target, WrId::write(seq).raw()),
            Some(v) => self
                .ep
                .post_write_imm(&pool, buf, len, target, v, WrId::write(seq).raw()),
        }
        .map_err(|e| Failure::Ended(format!("cannot post a write: {e}")));
        // The buffer comes back with the completion (see on_completion).
        self.data = Some((pool, None));
        posted?;
        self.outstanding += 1;
        self.drain_outstanding("the RDMA write to complete")?;
        Ok(value.unwrap_or(0))
    }

    /// Waits for a file to appear (the test's go-ahead), handling whatever
    /// arrives meanwhile.
    fn wait_file(&mut self, path: &std::path::Path) -> Result<(), Failure> {
        eprintln!("raw-client: waiting for {}", path.display());
        let deadline = Instant::now() + self.timeout;
        while !path.exists() {
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!(
                    "{} did not appear within {}s",
                    path.display(),
                    self.timeout.as_secs()
                )));
            }
            if self.broken.is_some() || self.disconnected {
                std::thread::sleep(Duration::from_millis(100));
            } else {
                self.pump(Duration::from_millis(100))?;
            }
        }
        Ok(())
    }

    fn expect(&mut self, kinds: &[String]) -> Result<(), Failure> {
        let want = kinds.join("|");
        let deadline = Instant::now() + self.timeout;
        loop {
            while let Some(m) = self.inbox.pop_front() {
                if kinds.iter().any(|k| k == "ANY" || *k == m.kind) {
                    return Ok(());
                }
                eprintln!("raw-client: skipped {} while waiting for {want}", m.kind);
            }
            if self.disconnected || self.broken.is_some() {
                return Err(Failure::Ended(format!(
                    "no {want} before the connection ended{}",
                    self.broken
                        .as_ref()
                        .map(|b| format!(" ({b})"))
                        .unwrap_or_default()
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::Timeout(format!(
                    "no {want} within {}s",
                    self.timeout.as_secs()
                )));
            }
            self.pump(left.min(Duration::from_millis(200)))?;
        }
    }

    /// This connection's identity (addresses and QP numbers).
    pub(crate) fn identity(&self) -> ConnectionId {
        self.identity
    }

    /// Sends a PROVE of `token` over `nonce` and `conn`; when `honest`
    /// (both this connection's), its AUTH_OK will be checked.
    pub(crate) fn send_prove(
        &mut self,
        token: &[u8],
        nonce: [u8; NONCE_LEN],
        conn: ConnectionId,
        honest: bool,
    ) -> Result<(), Failure> {
        let nonce_s = [0x5a; NONCE_LEN];
        let proof = match Token::new(token.to_vec()) {
            None => Vec::new(),
            Some(t) => {
                let key = SessionKey::derive(&t, &nonce, &nonce_s, &conn);
                let proof = key.sender_proof().to_vec();
                if honest {
                    self.key = Some(key);
                }
                proof
            }
        };
        let msg = Message::Prove(Prove {
            version: PROTOCOL_VERSION,
            nonce: nonce_s,
            proof,
        });
        self.run(&Step::Msg(msg))
    }

    /// The nonce of the receiver's CHALLENGE, waiting for it if needed
    /// (the CHALLENGE itself stays in the inbox for a later `expect`).
    pub(crate) fn await_challenge(&mut self) -> Result<[u8; NONCE_LEN], Failure> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(n) = self.nonce {
                return Ok(n);
            }
            self.usable()?;
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!(
                    "no CHALLENGE within {}s",
                    self.timeout.as_secs()
                )));
            }
            self.pump(Duration::from_millis(200))?;
        }
    }

    fn expect_disconnect(&mut self) -> Result<(), Failure> {
        let deadline = Instant::now() + self.timeout;
        while !self.disconnected {
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!(
                    "the receiver kept the connection open for {}s",
                    self.timeout.as_secs()
                )));
            }
            self.pump(Duration::from_millis(200))?;
        }
        Ok(())
    }

    fn usable(&self) -> Result<(), Failure> {
        if let Some(b) = &self.broken {
            return Err(Failure::Ended(format!("the connection is broken: {b}")));
        }
        if self.disconnected {
            return Err(Failure::Ended("the receiver disconnected".into()));
        }
        Ok(())
    }

    fn drain_outstanding(&mut self, what: &str) -> Result<(), Failure> {
        let deadline = Instant::now() + self.timeout;
        while self.outstanding > 0 {
            // A peer that disconnected will never acknowledge them; some
            // kernels (6.12's rxe) complete them only after the whole
            // retry budget, so stop waiting.
            if self.disconnected {
                eprintln!(
                    "raw-client: the peer disconnected while waiting for {what}: {} request(s) left",
                    self.outstanding
                );
                self.outstanding = 0;
                break;
            }
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!("waiting for {what}")));
            }
            self.pump(Duration::from_millis(200))?;
        }
        Ok(())
    }

    /// Waits up to `wait` for completions (or a disconnect) and handles them.
    fn pump(&mut self, wait: Duration) -> Result<(), Failure> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let got = if wait.is_zero() {
            self.ep.poll(&mut wcs, 32)
        } else {
            self.ep.wait(&mut wcs, 32, wait, "completions")
        };
        // Successful completions are in `wcs` even when another one failed.
        for wc in wcs.drain(..) {
            self.on_completion(wc)?;
        }
        self.wcs = wcs;
        match got {
            Ok(_) | Err(SysError::Timeout { .. }) => {}
            Err(e) => {
                if self.broken.is_none() {
                    // Reported, not fatal: an `expect` after it fails unless
                    // the answer came anyway, `expect-disconnect` still works.
                    say(&format!("WR_FAILED error={:?}", e.to_string()));
                    self.broken = Some(e.to_string());
                    self.outstanding = 0;
                }
            }
        }
        if !self.disconnected && self.ep.cm_id().peer_disconnected() {
            // Whatever the receiver sent before disconnecting is already in
            // the CQ: take it first, so DISCONNECTED prints after it.
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let _ = self.ep.poll(&mut wcs, 32);
            for wc in wcs.drain(..) {
                self.on_completion(wc)?;
            }
            self.wcs = wcs;
            self.disconnected = true;
            say("DISCONNECTED");
        }
        Ok(())
    }

    fn on_completion(&mut self, wc: Completion) -> Result<(), Failure> {
        match (WrId::from_raw(wc.wr_id).kind(), wc.opcode) {
            (WrKind::Send, WcOpcode::Send) => {
                self.outstanding = self.outstanding.saturating_sub(1);
                self.send_buf = wc.buffer;
            }
            (WrKind::Write, WcOpcode::RdmaWrite) => {
                self.outstanding = self.outstanding.saturating_sub(1);
                if let Some((_, slot)) = self.data.as_mut() {
                    *slot = wc.buffer;
                }
            }
            (WrKind::Recv, WcOpcode::Recv) => {
                let Some(buf) = wc.buffer else {
                    return Err(Failure::Ended(
                        "a receive came back without its buffer".into(),
                    ));
                };
                let len = wc.byte_len as usize;
                let inbound = match self.recv_pool.bytes(&buf, len.min(RECV_BUF)) {
                    Ok(sealed) => match self
                        .channel
                        .as_mut()
                        .map_or(Ok(sealed), |c| c.open(sealed).map_err(|e| e.to_string()))
                        .map_err(|e| {
                            say(&format!("UNSEALED len={len} error={e:?}"));
                        })
                        .and_then(|bytes| {
                            decode(bytes).map(|m| (m, bytes)).map_err(|e| {
                                say(&format!(
                                    "UNDECODED len={len} error={:?} hex={}",
                                    e.to_string(),
                                    hex(&bytes[..bytes.len().min(64)])
                                ));
                            })
                        }) {
                        Ok((msg, _)) => {
                            say(&describe(&msg));
                            match &msg {
                                Message::Mr(r) => {
                                    self.ring = Some(*r);
                                    self.seq = 0;
                                    self.offset = 0;
                                }
                                Message::Challenge(c) => self.nonce = Some(c.nonce),
                                Message::AuthOk { proof } => {
                                    if let Some(key) = self.key.take() {
                                        let verified = key.verify_receiver(proof);
                                        say(&format!("AUTH_OK verified={verified}"));
                                        if verified {
                                            self.channel = Some(key.channel(Role::Sender));
                                            self.chunk_key = Some(key.chunk_key());
                                        }
                                    }
                                }
                                _ => {}
                            }
                            Inbound {
                                kind: msg.kind().to_string(),
                            }
                        }
                        Err(()) => Inbound {
                            kind: "UNDECODED".into(),
                        },
                    },
                    Err(e) => return Err(Failure::Ended(format!("receive buffer: {e}"))),
                };
                self.inbox.push_back(inbound);
                if self.broken.is_none() && !self.disconnected {
                    self.ep
                        .post_recv(&self.recv_pool, buf, wc.wr_id)
                        .map_err(|e| Failure::Ended(format!("cannot repost a receive: {e}")))?;
                }
            }
            (_, WcOpcode::RecvWithImm(imm)) => {
                say(&format!("WRITE_IMM len={} imm={imm:#x}", wc.byte_len));
            }
            (kind, opcode) => {
                eprintln!("raw-client: unexpected completion {opcode:?} for kind {kind:?}");
            }
        }
        Ok(())
    }

    pub(crate) fn close(self) {
        if !self.disconnected {
            self.ep.cm_id().disconnect(Duration::from_secs(1));
        }
    }
}

/// The ring slot chunk `seq` goes to, and its address (as the receiver's
/// machine places it: `seq % slot_count`; wrapping, since the ring may be a
/// hostile test's).
fn slot_of(ring: &RingInfo, seq: u64) -> (u64, u64) {
    let slot = seq % u64::from(ring.slot_count.max(1));
    let remote = ring
        .addr
        .wrapping_add(slot.wrapping_mul(u64::from(ring.slot_size)));
    (slot, remote)
}
