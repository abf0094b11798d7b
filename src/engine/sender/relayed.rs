//! A relay chain's results at the sender: the session talks to the
//! chain's first host, which answers each entry with one RESULT per host
//! (its own first, then those it got from downstream) before its verdict.
//! Each host's RESULT becomes that host's report; a host that sent none
//! (the chain broke before it) is reported failed with the chain's reason.

use super::verdicts::Tracker;
use crate::engine::Outcome;
use crate::engine::report::{FileEvent, FileFailure, FileReport};
use crate::error::XferError;
use crate::proto::{Ack, AckStatus, FailedAck, HopResult, HopVerdict, escaped};
use std::time::{Duration, Instant};

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
    fn take(&mut self) -> (Vec<HopResult>, Vec<String>) {
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
fn host_verdict(result: &HopResult) -> Result<Outcome, XferError> {
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
    }
}

impl Tracker<'_> {
    /// The chain's verdict on a file was a success: each host's result.
    pub(super) fn done_over_chain(&mut self, report: FileReport) {
        let (results, silent) = self.chain.take();
        let started = Instant::now().checked_sub(report.elapsed);
        for result in results {
            match host_verdict(&result) {
                Ok(outcome) => {
                    let mut theirs = report.clone();
                    theirs.outcome = outcome;
                    if outcome.sent_nothing() {
                        theirs.digest = None;
                    }
                    theirs.host = Some(result.host);
                    (self.on_file)(FileEvent::Done(&theirs));
                    self.outcome.files.push(theirs);
                }
                Err(e) => self.host_failed(&result.host, &report.name, report.bytes, started, e),
            }
        }
        for host in silent {
            let e = XferError::PeerLost(format!(
                "no result from {}: the chain ended before it",
                escaped(&host)
            ));
            self.host_failed(&host, &report.name, report.bytes, started, e);
        }
    }

    /// The chain's verdict on a directory: the hosts that failed it (a
    /// host without a RESULT failed with `silent`'s error).
    pub(super) fn dir_over_chain(
        &mut self,
        name: &str,
        started: Instant,
        silent: impl Fn(&str) -> XferError,
    ) {
        let (results, hosts) = self.chain.take();
        for result in results {
            if let Err(e) = host_verdict(&result) {
                self.host_failed(&result.host, name, 0, Some(started), e);
            }
        }
        for host in hosts {
            self.host_failed(&host, name, 0, Some(started), silent(&host));
        }
    }

    /// The chain's verdict on an entry was a failure (`failure`): the hosts' own results where they came, else the
    /// failure for each host that sent none.
    pub(super) fn failed_over_chain(&mut self, failure: FileFailure) {
        let (results, silent) = self.chain.take();
        let started = Instant::now().checked_sub(failure.elapsed);
        for result in results {
            match host_verdict(&result) {
                Err(theirs) => {
                    self.host_failed(&result.host, &failure.name, failure.bytes, started, theirs)
                }
                // A host that has the file: its success stands.
                Ok(outcome) => {
                    let report = FileReport {
                        name: failure.name.clone(),
                        bytes: failure.bytes,
                        elapsed: failure.elapsed,
                        digest: None,
                        phases: Default::default(),
                        resumed_from: 0,
                        outcome,
                        host: Some(result.host),
                    };
                    (self.on_file)(FileEvent::Done(&report));
                    self.outcome.files.push(report);
                }
            }
        }
        // The failure's own error is the caller's to note (the exit
        // status), once.
        for host in silent {
            let mut theirs = failure.clone();
            theirs.host = Some(host);
            (self.on_file)(FileEvent::Failed(&theirs));
        }
    }

    /// One host failed the entry `name`.
    fn host_failed(
        &mut self,
        host: &str,
        name: &str,
        bytes: u64,
        started: Option<Instant>,
        e: XferError,
    ) {
        tracing::info!(host = %escaped(host), file = %escaped(name), "failed: {e}");
        let mut failure = FileFailure::new(
            name,
            bytes,
            self.digest_alg,
            started.map_or(Duration::ZERO, |t| t.elapsed()),
            self.connect,
            &e,
            false,
        );
        failure.host = Some(host.to_string());
        (self.on_file)(FileEvent::Failed(&failure));
        self.note_error(e);
    }
}
