//! Two-sided control messages: a pool of posted receive buffers and a pool of
//! send buffers, both registered for local access only.

use super::wr;
use crate::error::XferError;
use crate::proto::{MAX_MESSAGE, Message, WireError, decode, encode};
use crate::verbs::{Access, Endpoint, MemoryRegion, WorkCompletion};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

pub(super) struct Control {
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    recv_count: usize,
    send_count: usize,
    free_send: Vec<usize>,
    /// Encoded messages waiting for a free send buffer, in order.
    queued: VecDeque<Vec<u8>>,
}

impl Control {
    /// Registers the buffers and posts every receive.
    pub fn new(ep: &Endpoint, recv_count: usize, send_count: usize) -> Result<Self, XferError> {
        let recv_mr = MemoryRegion::new(ep.pd(), recv_count * MAX_MESSAGE, Access::Local)?;
        let send_mr = MemoryRegion::new(ep.pd(), send_count * MAX_MESSAGE, Access::Local)?;
        let control = Control {
            recv_mr,
            send_mr,
            recv_count,
            send_count,
            free_send: (0..send_count).rev().collect(),
            queued: VecDeque::new(),
        };
        for i in 0..recv_count {
            control.repost(ep, i)?;
        }
        Ok(control)
    }

    /// Hands receive buffer `index` back to the QP.
    pub fn repost(&self, ep: &Endpoint, index: usize) -> Result<(), XferError> {
        if index >= self.recv_count {
            return Err(XferError::Protocol(format!(
                "receive completion for unknown buffer {index}"
            )));
        }
        ep.post_recv(
            &self.recv_mr,
            index * MAX_MESSAGE,
            MAX_MESSAGE,
            wr::RECV | index as u64,
        )?;
        Ok(())
    }

    /// Decodes the control message a RECV completion delivered.
    pub fn decode(&self, wc: &WorkCompletion) -> Result<Message, WireError> {
        let index = wr::index(wc.wr_id);
        let len = wc.byte_len as usize;
        match self.recv_mr.slice(index * MAX_MESSAGE, len) {
            Ok(bytes) if len <= MAX_MESSAGE => decode(bytes),
            _ => Err(WireError::Oversized { len }),
        }
    }

    /// Sends `msg` now, or as soon as a send buffer is free (order kept).
    pub fn send(&mut self, ep: &Endpoint, msg: &Message) -> Result<(), XferError> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let len = encode(msg, &mut buf)
            .map_err(|e| XferError::Protocol(format!("cannot encode {}: {e}", msg.kind())))?;
        buf.truncate(len);
        self.queued.push_back(buf);
        self.flush(ep)
    }

    /// A SEND completed: its buffer is free again.
    pub fn on_send_done(&mut self, ep: &Endpoint, wc: &WorkCompletion) -> Result<(), XferError> {
        self.free_send.push(wr::index(wc.wr_id));
        self.flush(ep)
    }

    /// True while some message is queued or not yet completed.
    pub fn busy(&self) -> bool {
        !self.queued.is_empty() || self.free_send.len() < self.send_count
    }

    /// At the end of a session: lets queued and posted messages complete
    /// (until `within` passes) so that a last reply reaches the peer before
    /// the disconnect. Other completions are dropped.
    pub fn drain(&mut self, ep: &Endpoint, within: Duration) -> Result<(), XferError> {
        let deadline = Instant::now() + within;
        let mut wcs = Vec::new();
        while self.busy() && Instant::now() < deadline {
            wcs.clear();
            ep.cq()
                .wait(&mut wcs, 16, Duration::from_millis(200), "the last sends")?;
            for wc in &wcs {
                if wr::kind(wc.wr_id) == wr::SEND {
                    self.on_send_done(ep, wc)?;
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self, ep: &Endpoint) -> Result<(), XferError> {
        while !self.queued.is_empty() {
            let Some(slot) = self.free_send.pop() else {
                return Ok(());
            };
            let Some(bytes) = self.queued.pop_front() else {
                return Ok(());
            };
            self.send_mr
                .slice_mut(slot * MAX_MESSAGE, bytes.len())?
                .copy_from_slice(&bytes);
            ep.post_send(
                &self.send_mr,
                slot * MAX_MESSAGE,
                bytes.len(),
                wr::SEND | slot as u64,
                true,
            )?;
        }
        Ok(())
    }
}
