//! A session in a relay chain (the sender's RELAY): this host's own
//! verdict on each offer and the verdicts of the hosts after it go back
//! as RESULTs before the offer's verdict; each offer this host takes is
//! forwarded to the next host (`engine::relay`), even one it does not
//! keep itself (a refusal, a file it has unchanged): the hosts after it
//! still get it.

use super::{AwaitingFrom, IncomingFile, Session};
use crate::engine::receiver::said_upstream;
use crate::engine::receiver::storage::sink::Sink;
use crate::engine::relay::{Downstream, Forward, Forwarded, HopKeys, Kept, NextHops};
use crate::error::XferError;
use crate::proto::{AckStatus, Found, Hello, HopResult, HopVerdict, Reject, escaped, hello_flags};
use std::time::Instant;
use tracing::{debug, info, warn};

/// How often a host waiting for the hosts after it looks whether they
/// are done (and sends its KEEPALIVE when one is due).
const FORWARD_CHECK: std::time::Duration = std::time::Duration::from_millis(20);

/// This host's place in a relay chain.
pub(super) struct Relay {
    /// Its own name in the chain, as the sender gave it: its RESULTs say
    /// it.
    own: String,
    /// The hosts after it, the next one first.
    next: Vec<String>,
    /// Results of the hosts after this one for the current offer, sent
    /// after this host's own.
    relayed: Vec<HopResult>,
    /// The next host was lost (could not be reached, or went away) for an
    /// earlier offer, and why: later offers go to the hosts after it.
    lost: Option<String>,
    /// The session to the next hosts, kept from offer to offer.
    downstream: Option<Downstream>,
}

/// What an offer this host does not keep is forwarded with: its own
/// verdict, told when the offer's data is over.
pub(super) struct OwnVerdict {
    pub verdict: HopVerdict,
    pub reason: String,
}

impl Session<'_, '_> {
    /// RELAY: the chain from this host on (this host first). A second
    /// RELAY message continues the list.
    pub(super) fn on_relay(&mut self, hops: Vec<String>) -> Result<(), XferError> {
        match self.relay.as_mut() {
            Some(relay) => relay.next.extend(hops),
            None => {
                let mut hops = hops.into_iter();
                let own = hops.next().unwrap_or_default();
                self.relay = Some(Relay {
                    own,
                    next: hops.collect(),
                    relayed: Vec::new(),
                    lost: None,
                    downstream: None,
                });
            }
        }
        let Some(relay) = &self.relay else {
            return Ok(());
        };
        // A host named twice would have the chain go round in circles.
        let mut names: Vec<&String> = std::iter::once(&relay.own).chain(&relay.next).collect();
        names.sort();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            let reason = format!(
                "the relay chain names {} twice: each host once",
                escaped(twice[0])
            );
            self.machine.abort(AckStatus::Protocol, reason.clone());
            return Err(self.abandon(XferError::Protocol {
                context: Some("RELAY".into()),
                source: crate::proto::ProtocolError::RelayNotAllowed {
                    reason: "a host twice",
                },
            }));
        }
        info!(
            own = %escaped(&relay.own),
            next = relay.next.len(),
            "in a relay chain"
        );
        Ok(())
    }

    /// Whether this session is in a relay chain (its verdicts go with
    /// RESULTs).
    pub(super) fn relaying(&self) -> bool {
        self.relay.is_some()
    }

    /// The hosts after this one, if there are any to forward to.
    pub(super) fn next_hops(&self) -> Option<NextHops> {
        let relay = self.relay.as_ref()?;
        if relay.next.is_empty() {
            return None;
        }
        let keys = match &self.cfg.relay_keys {
            Some(ring) => HopKeys::PerHost(ring.clone()),
            None => HopKeys::Shared(self.cfg.token.clone()?),
        };
        Some(NextHops {
            hosts: relay.next.clone(),
            keys,
            timeout: self.cfg.timeout,
            chunk_size: self.cfg.chunk_size,
            ack_timeout: self.cfg.ack_timeout,
            source: self.cfg.relay_source,
        })
    }

    /// Starts forwarding the current offer to the next hosts (none: not
    /// in a chain, or the last host), its bytes after `kept` (the file's
    /// first bytes this host kept from an earlier transfer, in its copy).
    /// A file offered with RESUME returns once the next host takes its
    /// bytes (`await_flowing`).
    pub(super) fn forward(&mut self, hello: &Hello, kept: Kept) -> Option<Forward> {
        let hosts = self.route()?;
        let forward = self
            .downstream_for(&hosts, hello)
            .map(|d| d.offer(hello, kept))?;
        if hello.caps & hello_flags::RESUME != 0 && !hello.is_directory() {
            self.await_flowing(&forward);
        }
        Some(forward)
    }

    /// The hosts the current offer goes to: the next ones, or past a next
    /// host lost earlier in the session the hosts after it (the route
    /// choosing the device; that host's result says it was lost). None:
    /// not in a chain, or no host left to reach.
    fn route(&mut self) -> Option<NextHops> {
        let next = self.next_hops()?;
        let Some(why) = self.relay.as_ref().and_then(|r| r.lost.clone()) else {
            return Some(next);
        };
        let gone = HopResult::new(
            next.hosts[0].clone(),
            HopVerdict::Lost,
            0,
            format!(
                "lost earlier in this session: {}",
                why.strip_prefix("peer lost: ").unwrap_or(&why)
            ),
        );
        self.take_relayed(vec![gone]);
        past_the_next(next)
    }

    /// Forwards the accepted `file` (offered as `hello`). A file this host
    /// continues (RESUME) goes on as it arrives, after its kept part, only
    /// where that part may go before the sender has shown it holds the
    /// same bytes (its whole-file digest, at FIN): with the per-host
    /// tokens of a one-command chain, whose next hosts only the sender
    /// chose. With a shared token anyone who has it could name the next
    /// hosts and answer FROM without the bytes, and so read another
    /// sender's kept part: there (and when the part cannot be read back)
    /// the file goes on from this host's copy once committed. A file that
    /// goes on as it arrives waits here, the sender told this host is
    /// alive, until the next host takes the bytes (past its own kept
    /// part's check) or answered: the pipe holds 1 MiB only.
    pub(super) fn forward_resumed(&mut self, hello: &Hello, file: &mut IncomingFile) {
        if self.next_hops().is_none() {
            return;
        }
        let prefix = file.resumed_from;
        let kept = match prefix {
            0 => Kept::Nothing,
            _ if self.cfg.relay_keys.is_none() => {
                debug!(file = %escaped(&hello.name), "passed on once committed (a shared token)");
                file.pass_on = Some(hello.clone());
                return;
            }
            _ => match file.sink.kept_part() {
                Ok(copy) => Kept::Part(copy, prefix),
                Err(e) => {
                    warn!(
                        file = %escaped(&hello.name),
                        "passed on once committed: cannot read the kept part back: {e}"
                    );
                    file.pass_on = Some(hello.clone());
                    return;
                }
            },
        };
        file.forward = self.forward(hello, kept);
    }

    /// Waits until the next host takes `forward`'s bytes from the pipe, or
    /// answered the offer (the session to it ended, say), sending
    /// KEEPALIVE upstream meanwhile: the next host may read its own kept
    /// part, or this host check it, for longer than a pipe write may wait.
    /// At most this receiver's --timeout: then the pipe's own stall limit
    /// decides.
    fn await_flowing(&mut self, forward: &Forward) {
        let mut keepalives = None;
        let until = Instant::now() + self.cfg.timeout;
        loop {
            if forward.is_flowing() || Instant::now() >= until {
                return;
            }
            let Some(downstream) = self.relay.as_mut().and_then(|r| r.downstream.as_mut()) else {
                return;
            };
            if downstream.is_answered() {
                return;
            }
            self.wait_a_little(&mut keepalives);
        }
    }

    /// One turn of a wait for the hosts after this one: a short sleep,
    /// then the KEEPALIVE that is due (the sender waits for this offer;
    /// `keepalives`: whether the machine sends them, asked once). The
    /// sender's silence ends nothing here; a KEEPALIVE that cannot go
    /// says so when the verdict cannot either.
    fn wait_a_little(&mut self, keepalives: &mut Option<bool>) {
        let keepalives =
            *keepalives.get_or_insert_with(|| self.machine.work_started(Instant::now()).is_ok());
        std::thread::sleep(FORWARD_CHECK);
        if keepalives {
            let _ = self.machine.handle_timeout(Instant::now());
            let _ = self.transmit();
        }
    }

    /// The session to `next`'s hosts for offers like `hello`: the one
    /// kept, or a new one in its place (the hosts or settings changed, it
    /// ended, or it idled too long).
    fn downstream_for(&mut self, next: &NextHops, hello: &Hello) -> Option<&mut Downstream> {
        let relay = self.relay.as_mut()?;
        if let Some(kept) = relay.downstream.take_if(|d| !d.serves(&next.hosts, hello)) {
            // Its thread closes the session (BYE) and is waited for.
            drop(kept);
        }
        Some(
            relay
                .downstream
                .get_or_insert_with(|| Downstream::open(next, hello)),
        )
    }

    /// The next hosts' results, once the current offer's forwarding is
    /// over: kept until this host's own verdict is told. Whether the next
    /// host was lost on the way (the hosts after it heard nothing).
    pub(super) fn forwarded(&mut self, forward: Forward, whole: bool) -> bool {
        let Some(next) = self.next_hops() else {
            return false;
        };
        let bypassing = self.relay.as_ref().is_some_and(|r| r.lost.is_some());
        // What failed here is abandoned there: never a file that this
        // host did not receive whole and verified.
        let forwarded = self.await_forward(forward, whole);
        let lost = !bypassing && forwarded.lost.is_some();
        if let (Some(why), Some(relay), false) = (forwarded.lost, self.relay.as_mut(), bypassing) {
            warn!(
                host = %escaped(&next.hosts[0]),
                "the next host of the chain is lost: {why}; the hosts after it get the files from here"
            );
            relay.lost = Some(why);
        }
        self.take_relayed(forwarded.results);
        lost
    }

    /// The next host was lost while this host received `hello`'s file,
    /// which it keeps: the hosts after the lost one get it from this
    /// host's copy, now, and their results replace "not reached".
    pub(super) fn bypass(&mut self, hello: &Hello) {
        if let Some(past) = self.next_hops().and_then(past_the_next) {
            self.pass_copy_on(hello, &past);
        }
    }

    /// A resumed file that goes on only once committed (`pass_on`): to
    /// the hosts the route gives, or, `committed` false, their failure.
    /// A next host lost on the way is passed by, as for a file that goes
    /// on as it arrives.
    fn pass_on_committed(
        &mut self,
        hello: &Hello,
        committed: bool,
        status: AckStatus,
        reason: &str,
    ) {
        let bypassing = self.relay.as_ref().is_some_and(|r| r.lost.is_some());
        let Some(hosts) = self.route() else {
            return;
        };
        if !committed {
            self.fail_hosts(&hosts, status, &format!("not passed on: {reason}"));
            return;
        }
        let lost = self.pass_copy_on(hello, &hosts);
        if let (Some(why), false) = (lost, bypassing) {
            warn!(
                host = %escaped(&hosts.hosts[0]),
                "the next host of the chain is lost: {why}; the hosts after it get the files from here"
            );
            if let Some(relay) = self.relay.as_mut() {
                relay.lost = Some(why);
            }
            self.bypass(hello);
        }
    }

    /// `hosts` get `hello`'s file from this host's committed copy (with
    /// RESUME, only what each lacks), now; their results replace any
    /// said of them before. Why the first of them was lost, if it was.
    fn pass_copy_on(&mut self, hello: &Hello, hosts: &NextHops) -> Option<String> {
        let (_, Some(copy)) = self.store.existing(hello) else {
            let why = "this host cannot read its copy to pass it on";
            warn!(file = %escaped(&hello.name), "{why}");
            self.fail_hosts(hosts, AckStatus::Io, why);
            return None;
        };
        info!(
            file = %escaped(&hello.name),
            hosts = hosts.hosts.len(),
            "passing this host's copy on"
        );
        let again = self
            .downstream_for(hosts, hello)
            .map(|d| d.offer_copy(hello, copy))?;
        let again = self.await_forward(again, true);
        self.replace_results(hosts, again.results);
        again.lost
    }

    /// Every host of `hosts` failed `hello`'s file with `status`, for
    /// `why`: said in place of anything said of them before.
    fn fail_hosts(&mut self, hosts: &NextHops, status: AckStatus, why: &str) {
        let failed = hosts
            .hosts
            .iter()
            .map(|h| HopResult::new(h.clone(), HopVerdict::Ack(status), 0, why))
            .collect();
        self.replace_results(hosts, failed);
    }

    /// `results` of `hosts`, in place of any said of them before.
    fn replace_results(&mut self, hosts: &NextHops, results: Vec<HopResult>) {
        if let Some(relay) = self.relay.as_mut() {
            relay.relayed.retain(|r| !hosts.hosts.contains(&r.host));
            relay.relayed.extend(results);
        }
    }

    /// Ends `forward`'s input (`whole`: this host's checks passed) and
    /// waits for the next hosts' results, telling the sender meanwhile
    /// that this host is alive (KEEPALIVE: the hosts after it may take
    /// long, a bypass a whole file). A session to them that ended is let
    /// go: the next offer opens another.
    fn await_forward(&mut self, mut forward: Forward, whole: bool) -> Forwarded {
        forward.end_input(whole);
        drop(forward);
        let mut keepalives = None;
        loop {
            let Some(downstream) = self.relay.as_mut().and_then(|r| r.downstream.as_mut()) else {
                return Forwarded {
                    results: Vec::new(),
                    lost: None,
                };
            };
            if downstream.is_answered() {
                let forwarded = downstream.results();
                if downstream.has_ended()
                    && let Some(relay) = self.relay.as_mut()
                {
                    relay.downstream = None;
                }
                return forwarded;
            }
            self.wait_a_little(&mut keepalives);
        }
    }

    fn take_relayed(&mut self, results: Vec<HopResult>) {
        if let Some(relay) = self.relay.as_mut() {
            relay.relayed.extend(results);
        }
    }

    /// Tells the sender this host's verdict on the current offer and
    /// those of the hosts after it (RESULTs), before the machine's own
    /// verdict goes; nothing outside a relay chain.
    pub(super) fn tell_results(
        &mut self,
        verdict: HopVerdict,
        bytes: u64,
        reason: &str,
    ) -> Result<(), XferError> {
        let Some(relay) = self.relay.as_mut() else {
            return Ok(());
        };
        let own = HopResult::new(relay.own.clone(), verdict, bytes, reason);
        let relayed = std::mem::take(&mut relay.relayed);
        self.machine.push_result(own)?;
        for result in relayed {
            self.machine.push_result(result)?;
        }
        Ok(())
    }

    /// An offer this host does not keep (`own` says why) but takes all
    /// the same, for the hosts after it: its bytes are checked and
    /// forwarded, and discarded here.
    pub(super) fn forward_only(
        &mut self,
        hello: &Hello,
        hello_at: Instant,
        own: OwnVerdict,
    ) -> Result<(), XferError> {
        let forward = self.forward(hello, Kept::Nothing);
        let ring = match self.ring_for_offer() {
            Ok(ring) => ring,
            Err(refusal) => {
                drop(forward);
                return self.refuse(hello, hello_at, refusal);
            }
        };
        match &own.verdict {
            // Said to the sender through the chain; a hop it started over
            // ssh would say it twice on the sender's terminal.
            HopVerdict::Reject(code) => said_upstream!(
                self.cfg,
                name = %escaped(&hello.name),
                code = code.as_str(),
                "not kept here ({}): passed on to the next host",
                own.reason
            ),
            HopVerdict::Ack(status) => info!(
                file = %escaped(&hello.name),
                "{} here: passed on to the next host",
                status.as_str()
            ),
            // Never this host's own verdict.
            HopVerdict::Lost => {}
        }
        let span = tracing::error_span!("file", file = %escaped(&hello.name), size = hello.size);
        let progress = self.cfg.progress.file_started(&hello.name, hello.size);
        let mut file = IncomingFile::accepted(
            hello.name.clone(),
            hello.size,
            hello.digest,
            Sink::Discard,
            span,
            (hello_at, self.connect_time),
            progress,
        );
        file.forward = forward;
        file.own = Some(own);
        self.machine.accept(ring, file)?;
        Ok(())
    }

    /// `forward_only` for an offer that may have RESUME: such an offer
    /// gets its HAVE first (of nothing: nothing of it is kept here), and
    /// is passed on after the sender's FROM.
    pub(super) fn forward_only_resumable(
        &mut self,
        hello: Hello,
        hello_at: Instant,
        own: OwnVerdict,
    ) -> Result<(), XferError> {
        if hello.caps & hello_flags::RESUME == 0 {
            return self.forward_only(&hello, hello_at, own);
        }
        let waiting = AwaitingFrom {
            own: Some(own),
            ..AwaitingFrom::of(hello, hello_at)
        };
        self.machine
            .have_found(Found::Nothing(String::new()), waiting)?;
        Ok(())
    }

    /// An offer refused here: over a chain with hosts after this one it
    /// is forwarded all the same (this host's result says the refusal),
    /// else refused.
    pub(super) fn refuse_or_forward(
        &mut self,
        hello: &Hello,
        hello_at: Instant,
        refusal: Reject,
    ) -> Result<(), XferError> {
        if self.next_hops().is_none() || hello.is_directory() {
            return self.refuse(hello, hello_at, refusal);
        }
        let own = self.refused_here(hello, hello_at, refusal);
        self.forward_only(hello, hello_at, own)
    }

    /// `refuse_or_forward` for an offer with RESUME before its HAVE.
    pub(super) fn refuse_or_forward_resumable(
        &mut self,
        hello: Hello,
        hello_at: Instant,
        refusal: Reject,
    ) -> Result<(), XferError> {
        if self.next_hops().is_none() || hello.is_directory() {
            return self.refuse(&hello, hello_at, refusal);
        }
        let own = self.refused_here(&hello, hello_at, refusal);
        self.forward_only_resumable(hello, hello_at, own)
    }

    /// A refusal of this host's own, reported here, for an offer passed
    /// on all the same: its RESULT says it.
    fn refused_here(&mut self, hello: &Hello, hello_at: Instant, refusal: Reject) -> OwnVerdict {
        let err = XferError::Rejected {
            code: Some(refusal.code),
            reason: refusal.reason.clone(),
        };
        self.report_failure(
            &hello.name,
            hello.size,
            hello.digest,
            hello_at.elapsed(),
            &err,
            false,
        );
        self.first_error.get_or_insert(err);
        OwnVerdict {
            verdict: HopVerdict::Reject(refusal.code),
            reason: refusal.reason,
        }
    }

    /// The verdict of a file at its FIN over a chain: this host's own
    /// (`status`, or the one it was forwarded with) and the next hosts'
    /// results go first; the ACK of a file only forwarded says it went
    /// on.
    pub(super) fn relay_verdict(
        &mut self,
        file: &mut IncomingFile,
        status: AckStatus,
        reason: String,
    ) -> Result<(AckStatus, String), XferError> {
        let mut lost = None;
        if let Some(forward) = file.forward.take() {
            let hello = forward.hello().clone();
            if self.forwarded(forward, status == AckStatus::Ok) {
                lost = Some(hello);
            }
        }
        match file.own.take() {
            Some(own) => {
                self.tell_results(own.verdict, 0, &own.reason)?;
                let reason = match status {
                    AckStatus::Ok => "relayed".into(),
                    _ => reason,
                };
                Ok((status, reason))
            }
            None => {
                let committed = status == AckStatus::Ok && file.sink.is_temp_file();
                // A file kept here goes on past a next host lost mid-file.
                if let Some(hello) = lost.filter(|_| committed) {
                    self.bypass(&hello);
                }
                // A resumed file that goes on only once committed.
                if let Some(hello) = file.pass_on.take() {
                    self.pass_on_committed(&hello, committed, status, &reason);
                }
                // What came this time (a resumed file's kept part did not).
                let received = file.written.saturating_sub(file.resumed_from);
                self.tell_results(HopVerdict::Ack(status), received, &reason)?;
                Ok((status, reason))
            }
        }
    }
}

/// The hosts after the next one, reached by the route (the next host's
/// `--relay-source` may not reach them); None when there are none.
fn past_the_next(next: NextHops) -> Option<NextHops> {
    if next.hosts.len() < 2 {
        return None;
    }
    Some(NextHops {
        hosts: next.hosts[1..].to_vec(),
        source: None,
        ..next
    })
}
