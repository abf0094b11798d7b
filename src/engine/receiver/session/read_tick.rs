//! The KEEPALIVEs that keep a sender waiting while the session reads a
//! file of its own (a kept prefix, a complete copy, a --link-dest copy).

use crate::engine::link::RingLink;
use crate::proto::{ReceiverSession, keepalive_interval};
use std::time::{Duration, Instant};

/// Keeps the sender informed while the session reads a file from disk
/// for a resumed offer (a kept prefix, a complete copy): a KEEPALIVE every
/// `interval`, so that the waiting sender does not time out. Our sends
/// complete at once; what the sender delivers meanwhile waits in the link
/// for the run loop.
pub(super) struct ReadTick<'s, F, W> {
    link: &'s mut dyn RingLink,
    machine: &'s mut ReceiverSession<F, W>,
    interval: Duration,
    last: Instant,
}

impl<'s, F, W> ReadTick<'s, F, W> {
    pub(super) fn new(
        link: &'s mut dyn RingLink,
        machine: &'s mut ReceiverSession<F, W>,
        timeout: Duration,
    ) -> Self {
        Self {
            link,
            machine,
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
        self.machine.keepalive().map_err(std::io::Error::other)?;
        while let Some(msg) = self.machine.poll_transmit() {
            self.link.send(&msg).map_err(std::io::Error::other)?;
        }
        self.link.poll().map_err(std::io::Error::other)
    }
}
