//! The KEEPALIVEs that keep a sender waiting while the session reads a
//! file of its own (a kept prefix, a complete copy, a --link-dest copy).

use crate::engine::control::Control;
use crate::engine::{WrId, WrKind};
use crate::proto::{ReceiverSession, keepalive_interval};
use crate::sys::rdma::{Completion, Endpoint, WcOpcode};
use std::time::{Duration, Instant};

/// Keeps the sender informed while the session reads a file from disk
/// for a resumed offer (a kept prefix, a complete copy): a KEEPALIVE every
/// `interval`, so that the waiting sender does not time out. Our sends
/// complete at once; other completions wait for the run loop.
pub(super) struct ReadTick<'s> {
    control: &'s mut Control,
    ep: &'s Endpoint,
    machine: &'s ReceiverSession,
    stashed: &'s mut Vec<Completion>,
    interval: Duration,
    last: Instant,
}

impl<'s> ReadTick<'s> {
    pub(super) fn new(
        control: &'s mut Control,
        ep: &'s Endpoint,
        machine: &'s ReceiverSession,
        stashed: &'s mut Vec<Completion>,
        timeout: Duration,
    ) -> Self {
        Self {
            control,
            ep,
            machine,
            stashed,
            interval: keepalive_interval(timeout),
            last: Instant::now(),
        }
    }

    pub(super) fn tick(&mut self) -> std::io::Result<()> {
        if crate::sys::os::shutdown_requested() {
            return Err(std::io::Error::other("interrupted by signal"));
        }
        if self.last.elapsed() < self.interval {
            return Ok(());
        }
        self.last = Instant::now();
        let keepalive = self.machine.keepalive().map_err(std::io::Error::other)?;
        self.control
            .send(self.ep, &keepalive)
            .map_err(std::io::Error::other)?;
        let mut wcs = Vec::new();
        self.ep.poll(&mut wcs, 16).map_err(std::io::Error::other)?;
        for wc in wcs {
            if WrId::from_raw(wc.wr_id).kind() == WrKind::Send && wc.opcode == WcOpcode::Send {
                self.control
                    .on_send_done(self.ep, wc)
                    .map_err(std::io::Error::other)?;
            } else {
                self.stashed.push(wc);
            }
        }
        Ok(())
    }
}
