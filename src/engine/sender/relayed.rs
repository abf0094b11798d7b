//! A relay chain's results at the sender: the session talks to the
//! chain's first host, which answers each entry with one RESULT per host
//! (its own first, then those it got from downstream) before its verdict.
//! Each host's RESULT becomes that host's report; a host that sent none
//! (the chain broke before it) is reported failed with the chain's reason.

use crate::engine::Outcome;
use crate::error::XferError;
use crate::proto::{Ack, AckStatus, FailedAck, HopResult, HopVerdict, escaped};

/// The hosts of a relay chain, in order, and the RESULTs of the entry
/// whose verdict comes next.
#[derive(Debug, Default)]
pub(super) struct Chain {
    hosts: Vec<String>,
    /// RESULTs that came before the next verdict.
    arriving: Vec<HopResult>,
    /// The RESULTs of the verdict being reported (`verdict`): only a
    /// verdict takes them, never a failure of the sender's own (a file it
    /// cannot open, the session's end).
    settled: Option<Vec<HopResult>>,
}

impl Chain {
    /// `hosts`: the chain as the user named it, the first the session's
    /// receiver (empty: no relay).
    pub(super) fn new(hosts: Vec<String>) -> Self {
        Chain {
            hosts,
            ..Chain::default()
        }
    }

    pub(super) fn is_on(&self) -> bool {
        !self.hosts.is_empty()
    }

    /// A RESULT for the entry whose verdict comes next.
    pub(super) fn result(&mut self, result: HopResult) {
        tracing::debug!(
            host = %escaped(&result.host),
            verdict = ?result.verdict,
            "result from the chain"
        );
        self.arriving.push(result);
    }

    /// A verdict came: the RESULTs before it are its entry's.
    pub(super) fn verdict(&mut self) {
        self.settled = Some(std::mem::take(&mut self.arriving));
    }

    /// The RESULTs of the verdict being reported (none for a failure of
    /// the sender's own), and the chain's hosts none of them is about.
    pub(super) fn take(&mut self) -> (Vec<HopResult>, Vec<String>) {
        let results = self.settled.take().unwrap_or_default();
        let silent = self
            .hosts
            .iter()
            .filter(|h| !results.iter().any(|r| &r.host == *h))
            .cloned()
            .collect();
        (results, silent)
    }
}

/// What a host's RESULT says of the entry: a success (how it ended) or
/// the error it failed with.
pub(super) fn host_verdict(result: &HopResult) -> Result<Outcome, XferError> {
    match result.verdict {
        HopVerdict::Ack(AckStatus::Ok) => Ok(Outcome::from_ack_note(&result.reason)),
        HopVerdict::Ack(status) => match Outcome::of_no_data(status) {
            Some(outcome) => Ok(outcome),
            None => match FailedAck::of(Ack::new(status, result.reason.clone())) {
                Ok(failed) => Err(super::ack_error(failed)),
                // A success status with no outcome of its own.
                Err(_) => Ok(Outcome::Stored),
            },
        },
        HopVerdict::Reject(code) => Err(XferError::Rejected {
            code: Some(code),
            reason: result.reason.clone(),
        }),
        HopVerdict::Lost => Err(XferError::PeerLost(result.reason.clone())),
    }
}
