//! The one-command form's relay chain, the default with several targets:
//! every target's receiver is started over ssh with a one-time token of
//! its own (`receiver --ssh-relay`); once all of them listen, each is
//! handed the tokens of the two hosts after it (on its ssh channel, never
//! on the fabric: the next one, and the one after it for a bypass), and
//! the sender sends to the first only. Each host passes the files on to
//! the next (`engine::relay`) and its results come back per file. A
//! target that cannot be started is left out of the chain and reported
//! failed; a first host lost mid-way is reported failed and the chain
//! starts again from the next one (what the hosts after it hold is
//! `unchanged` on the way); hosts the chain did not reach (two lost in a
//! row before them) get the files from the sender directly. The exit
//! status is the worst of all.

use super::args::RemotePlan;
use super::render::session_summary;
use super::ui::Ui;
use crate::engine::remote::{self, RemoteReceiver, Target};
use crate::engine::sender::send_files;
use crate::engine::{FileEvent, FileFailure, ProgressSink};
use crate::error::XferError;
use crate::proto::Token;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use zeroize::Zeroizing;

/// Receivers started at once, at least (ssh log-ins are mostly waiting).
const LAUNCHES_AT_ONCE: usize = 16;

/// Hosts after a hop whose tokens it holds: the next, and the one after
/// it (the host a bypass of a lost next host reaches).
const KEYS_PER_HOP: usize = 2;

/// A host of the chain: its target, its receiver, its token, and its
/// name in the chain (where it listens, as the hosts before it reach it).
struct Hop<'a> {
    /// Its place among the targets given.
    index: usize,
    target: &'a Target,
    receiver: RemoteReceiver,
    token: Token,
    token_hex: Zeroizing<String>,
    name: String,
}

impl Hop<'_> {
    /// How results name the host: by its target's host, as the direct
    /// copies do.
    fn label(&self) -> &str {
        &self.target.host
    }
}

/// Sends the plan's files along a chain of its targets, in their order.
pub fn send_by_relay(plan: &RemotePlan, ui: &Arc<Ui>, summary: bool) -> Result<(), XferError> {
    // Three pipes per host stay open for the whole chain.
    crate::sys::os::raise_open_files();
    let targets = plan.targets.len();
    let (mut hops, mut failed) = start_all(plan, ui);
    let aborted = if crate::sys::os::shutdown_requested() {
        Some(crate::sys::SysError::Interrupted.into())
    } else {
        names_disagree(&hops)
    };
    let aborted = aborted.or_else(|| {
        hand_keys(&mut hops, &mut failed);
        crate::sys::os::shutdown_requested().then(|| crate::sys::SysError::Interrupted.into())
    });
    failed.sort_by_key(|(i, _)| *i);
    for (i, e) in &failed {
        report_target(ui, &plan.targets[*i].host, Err(e));
    }
    let mut errors: Vec<XferError> = failed.into_iter().map(|(_, e)| e).collect();
    if let Some(e) = aborted {
        // Said once, as the tool's error; each target has its record.
        for hop in &hops {
            ui.target_ended(hop.label(), Err(&e));
        }
        end_all(hops);
        // The reason nothing was sent, whatever else failed to start.
        return Err(if targets > 1 {
            XferError::TargetsFailed {
                worst: Box::new(e),
                failed: targets,
                targets,
            }
        } else {
            e
        });
    }
    let mut reported = Reported::default();
    // Each started host's error, when it has one other than its files'.
    let mut host_errors: HashMap<String, XferError> = HashMap::new();
    // A stream cannot be read again for a second chain.
    let rereadable = !plan.files.iter().any(|f| f.as_os_str() == "-");
    let mut first = 0;
    while first < hops.len() {
        let chain: Vec<&Hop<'_>> = hops[first..].iter().collect();
        let ended = match relay_through(plan, ui, &chain, summary, &mut reported) {
            Ok(own) => {
                // A failure no host's result explains (the sender's own).
                errors.extend(own);
                break;
            }
            Err(ended) => ended,
        };
        // The session to the chain's first host ended: that host failed;
        // the hosts after it start a chain of their own, unless the
        // cause is this host's, or the input cannot be read again.
        let again =
            ended.restart && rereadable && chain.len() > 1 && !crate::sys::os::shutdown_requested();
        if !again {
            for (name, f) in &ended.held {
                reported.say(ui, name, FileEvent::Failed(f));
            }
            for hop in &chain[1..] {
                host_errors.insert(hop.name.clone(), not_reached(hop, &ended.error));
            }
        }
        host_errors.insert(chain[0].name.clone(), ended.error);
        if !again {
            break;
        }
        drop(chain);
        // Gone for good: its ssh ends now, so that nothing of it writes on.
        hops[first].receiver.hang_up();
        first += 1;
        // A host the lost one already found lost is passed by too.
        while first + 1 < hops.len() && reported.lost(&hops[first].name) {
            first += 1;
        }
        tracing::warn!(
            "{} is lost: the chain goes on from {}",
            crate::proto::escaped(hops[first - 1].label()),
            crate::proto::escaped(hops[first].label())
        );
    }
    if rereadable {
        reach_orphans(
            plan,
            ui,
            &mut hops,
            summary,
            &mut reported,
            &mut host_errors,
            &mut errors,
        );
    }
    reported.flush(ui);
    // One record per started host, in the order given.
    for hop in &hops {
        if let Some(e) = host_errors.remove(&hop.name) {
            report_target(ui, hop.label(), Err(&e));
            errors.push(e);
        } else if let Some(f) = reported.worst.get(&hop.name) {
            let e = XferError::Remote {
                host: hop.label().to_string(),
                code: f.exit_code,
                message: format!("{}: {}", crate::proto::escaped(&f.name), f.reason),
            };
            ui.target_ended(hop.label(), Err(&e));
            errors.push(e);
        } else {
            ui.target_ended(hop.label(), Ok(()));
        }
    }
    end_all(hops);
    worst_of(errors, targets)
}

/// Sends the files to the hosts the chain did not reach (`reported` holds
/// a lost peer's record for them) whose receivers still run: in a chain
/// of their own, again while that reaches some of them.
fn reach_orphans(
    plan: &RemotePlan,
    ui: &Arc<Ui>,
    hops: &mut [Hop<'_>],
    summary: bool,
    reported: &mut Reported,
    host_errors: &mut HashMap<String, XferError>,
    errors: &mut Vec<XferError>,
) {
    let mut tried = std::collections::HashSet::new();
    loop {
        let mut orphans = Vec::new();
        for (i, hop) in hops.iter_mut().enumerate() {
            let unreached = reported.unreached(&hop.name) && !host_errors.contains_key(&hop.name);
            if unreached && hop.receiver.is_running() {
                orphans.push(i);
            }
        }
        // Each round starts from a host not tried first before (the
        // hosts before it go last): every round tries a new one.
        let Some(at) = orphans.iter().position(|&i| !tried.contains(&hops[i].name)) else {
            return;
        };
        if crate::sys::os::shutdown_requested() {
            return;
        }
        orphans.rotate_left(at);
        let head = hops[orphans[0]].name.clone();
        tried.insert(head.clone());
        let chain: Vec<&Hop<'_>> = orphans.iter().map(|&i| &hops[i]).collect();
        let names: Vec<String> = chain
            .iter()
            .map(|h| crate::proto::escaped(h.label()).to_string())
            .collect();
        tracing::warn!(
            "lost or not reached along the chain: sending to {} directly",
            names.join(", ")
        );
        match relay_through(plan, ui, &chain, summary, reported) {
            Ok(own) => errors.extend(own),
            // The head's failure: the hosts after it keep their own
            // records (the next round tries them).
            Err(ended) => {
                host_errors.insert(head, ended.error);
            }
        }
    }
}

/// What the sender said so far along the chain, over every attempt: one
/// record per host and file (the first: a second chain sends again what
/// the first did not finish, and the hosts that had it say `unchanged`),
/// and each host's worst failure, by its name in the chain. A lost peer's
/// record waits until the end (`flush`): the sender may still reach the
/// host another way.
#[derive(Default)]
struct Reported {
    said: std::collections::HashSet<(String, String)>,
    worst: HashMap<String, FileFailure>,
    /// Lost-peer records not said yet, by host name, in order.
    lost: Vec<(String, FileFailure)>,
}

impl Reported {
    /// Says `event` for the host named `name` in the chain, unless its
    /// record of the file was said already; a lost peer's is kept back.
    fn say(&mut self, ui: &Ui, name: &str, event: FileEvent<'_>) {
        let file = match event {
            FileEvent::Done(r) => &r.name,
            FileEvent::Failed(f) => &f.name,
        };
        let key = (name.to_string(), file.clone());
        if self.said.contains(&key) {
            return;
        }
        if let FileEvent::Failed(f) = event
            && f.exit_code == crate::error::ExitCode::TimeoutOrPeerLost
        {
            if !self.unreached(name) {
                tracing::warn!(
                    "{}: lost ({})",
                    crate::proto::escaped(f.host.as_deref().unwrap_or(name)),
                    f.reason
                );
            }
            // The latest word on it.
            self.lost.retain(|(n, l)| !(n == name && &l.name == file));
            self.lost.push((name.to_string(), f.clone()));
            return;
        }
        self.lost.retain(|(n, l)| !(n == name && &l.name == file));
        self.said.insert(key);
        ui.file_event_from(None, event);
        if let FileEvent::Failed(f) = event {
            self.count(name, f);
        }
    }

    fn count(&mut self, name: &str, f: &FileFailure) {
        let keep = self
            .worst
            .get(name)
            .is_none_or(|w| w.exit_code < f.exit_code);
        if keep {
            self.worst.insert(name.to_string(), f.clone());
        }
    }

    /// Says the lost-peer records no later attempt replaced.
    fn flush(&mut self, ui: &Ui) {
        for (name, f) in std::mem::take(&mut self.lost) {
            if self.said.insert((name.clone(), f.name.clone())) {
                ui.file_event_from(None, FileEvent::Failed(&f));
                self.count(&name, &f);
            }
        }
    }

    /// Whether the host named `name` was found lost (a LOST result).
    fn lost(&self, name: &str) -> bool {
        self.unreached(name)
            || self
                .worst
                .get(name)
                .is_some_and(|f| f.exit_code == crate::error::ExitCode::TimeoutOrPeerLost)
    }

    /// Whether some file's record for `name` is a lost peer's, not said.
    fn unreached(&self, name: &str) -> bool {
        self.lost.iter().any(|(n, _)| n == name)
    }

    /// Whether any host failed some file (said or kept back).
    fn any_failed(&self) -> bool {
        !self.worst.is_empty() || !self.lost.is_empty()
    }
}

/// How a session along the chain ended before its end: the error, whether
/// the cause was the first host's (its connection, its side: a new chain
/// from the next host may go on), and the files it cut short at the hosts
/// after the first, not said yet.
struct Ended {
    error: XferError,
    restart: bool,
    /// By the host's name in the chain.
    held: Vec<(String, FileFailure)>,
}

/// One error per failed target: Ok when there is none, the only one with
/// a single target, else `TargetsFailed` with the worst (highest) status.
fn worst_of(errors: Vec<XferError>, targets: usize) -> Result<(), XferError> {
    let failed = errors.len().min(targets);
    match errors.into_iter().max_by_key(XferError::exit_code) {
        None => Ok(()),
        Some(only) if targets == 1 => Err(only),
        Some(worst) => Err(XferError::TargetsFailed {
            worst: Box::new(worst),
            failed,
            targets,
        }),
    }
}

/// `hop`, after a first host lost for `e`, never heard of the files: a
/// host not reached, as a lost peer (exit 7).
fn not_reached(hop: &Hop<'_>, e: &XferError) -> XferError {
    XferError::Remote {
        host: hop.label().to_string(),
        code: crate::error::ExitCode::TimeoutOrPeerLost,
        message: format!("not reached: {}", super::ui::strip_host(e, hop.label())),
    }
}

/// With `--json`, a target's record; a failure's line on stderr.
fn report_target(ui: &Ui, label: &str, result: Result<(), &XferError>) {
    ui.target_ended(label, result);
    if let Err(e) = result {
        ui.eprintln(&format!(
            "sender: error: {}: {}",
            crate::proto::escaped(label),
            super::ui::strip_host(e, label)
        ));
    }
}

/// Runs `each` on every item, `workers` at a time, in threads of their
/// own where they can be had (else here); the results in the items'
/// order.
fn at_once<T: Send, R: Send>(
    items: Vec<T>,
    workers: usize,
    each: impl Fn(T) -> R + Sync,
) -> Vec<R> {
    let count = items.len();
    let queue = Mutex::new(items.into_iter().enumerate());
    let results: Mutex<Vec<(usize, R)>> = Mutex::new(Vec::with_capacity(count));
    let work = || {
        loop {
            let next = queue.lock().unwrap_or_else(PoisonError::into_inner).next();
            let Some((i, item)) = next else {
                break;
            };
            let r = each(item);
            results
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push((i, r));
        }
    };
    std::thread::scope(|scope| {
        let mut spawned = 0;
        for _ in 0..workers.clamp(1, count.max(1)) {
            if std::thread::Builder::new()
                .name("chain".into())
                .spawn_scoped(scope, work)
                .is_ok()
            {
                spawned += 1;
            }
        }
        if spawned == 0 {
            work();
        }
    });
    let mut results = results.into_inner().unwrap_or_else(PoisonError::into_inner);
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// Starts every target's receiver, `--parallel` (at least
/// `LAUNCHES_AT_ONCE`) at once: the hops, in the order given, and the
/// targets that could not be started, with their index.
fn start_all<'a>(plan: &'a RemotePlan, ui: &Arc<Ui>) -> (Vec<Hop<'a>>, Vec<(usize, XferError)>) {
    let mut launch = plan.launch.clone();
    launch.relay = true;
    let on_stderr: Arc<dyn Fn(&str) + Send + Sync> = {
        let ui = ui.clone();
        Arc::new(move |line: &str| ui.eprintln(line))
    };
    let workers = plan.parallel.max(LAUNCHES_AT_ONCE);
    let started = at_once(
        plan.targets.iter().enumerate().collect(),
        workers,
        |(index, target)| {
            if crate::sys::os::shutdown_requested() {
                return Err(crate::sys::SysError::Interrupted.into());
            }
            let (token, token_hex) = remote::one_time_token()?;
            let receiver = remote::launch(target, &launch, &token_hex, on_stderr.clone())?;
            Ok(Hop {
                index,
                target,
                name: receiver.addr.to_string(),
                receiver,
                token,
                token_hex,
            })
        },
    );
    let mut hops: Vec<Hop<'a>> = Vec::new();
    let mut failed = Vec::new();
    for (i, hop) in started.into_iter().enumerate() {
        match hop {
            // Two receivers cannot listen on one address: a target that
            // says another's is not believed.
            Ok(hop) if hops.iter().any(|h| h.name == hop.name) => {
                let e = XferError::Remote {
                    host: hop.label().to_string(),
                    code: crate::error::ExitCode::Other,
                    message: format!(
                        "its receiver says it listens on {}, as another target's does",
                        hop.name
                    ),
                };
                failed.push((i, e));
                end_all(vec![hop]);
            }
            Ok(hop) => hops.push(hop),
            Err(e) => failed.push((i, e)),
        }
    }
    (hops, failed)
}

/// scp's PATH naming the one file: the chain sends it under one name,
/// so every host must name it alike.
fn names_disagree(hops: &[Hop<'_>]) -> Option<XferError> {
    let first = hops.first()?;
    let name = &first.receiver.file_name;
    let other = hops.iter().find(|h| h.receiver.file_name != *name)?;
    let said = |h: &Hop<'_>| match &h.receiver.file_name {
        Some(n) => format!("names the file {}", crate::proto::escaped(n)),
        None => "is a directory".to_string(),
    };
    Some(XferError::Usage(format!(
        "the targets' PATHs disagree ({} on {}, it {} on {}): a relay chain sends one name; \
         give each target the same name or directory, or --no-relay",
        said(first),
        crate::proto::escaped(first.label()),
        said(other),
        crate::proto::escaped(other.label()),
    )))
}

/// Hands each host the tokens of the `KEYS_PER_HOP` hosts after it. A
/// host that does not take them is left out (reported in `failed`); the
/// hosts before it hold a token they will not use.
fn hand_keys(hops: &mut Vec<Hop<'_>>, failed: &mut Vec<(usize, XferError)>) {
    let names: Vec<(String, Zeroizing<String>)> = hops
        .iter()
        .map(|h| (h.name.clone(), h.token_hex.clone()))
        .collect();
    let work: Vec<(usize, &mut Hop<'_>)> = hops.iter_mut().enumerate().collect();
    let results = at_once(work, LAUNCHES_AT_ONCE, |(i, hop)| {
        let after: Vec<(String, &str)> = names
            .iter()
            .skip(i + 1)
            .take(KEYS_PER_HOP)
            .map(|(n, hex)| (n.clone(), hex.as_str()))
            .collect();
        hop.receiver.hand_relay_keys(&after)
    });
    let mut kept = Vec::with_capacity(hops.len());
    let mut dropped = Vec::new();
    for (hop, result) in std::mem::take(hops).into_iter().zip(results) {
        match result {
            Ok(()) => kept.push(hop),
            Err(e) => {
                failed.push((hop.index, e));
                dropped.push(hop);
            }
        }
    }
    end_all(dropped);
    *hops = kept;
}

/// The session along `chain`: each file's line and record name its host
/// by its target (`reported`). Ok with the sender's own failure, if it
/// had one no host's result explains; when the session itself ended, how
/// (`Ended`).
fn relay_through(
    plan: &RemotePlan,
    ui: &Arc<Ui>,
    chain: &[&Hop<'_>],
    summary: bool,
    reported: &mut Reported,
) -> Result<Option<XferError>, Ended> {
    let Some(&first) = chain.first() else {
        return Ok(None);
    };
    let by_name: HashMap<&str, &Hop<'_>> = chain.iter().map(|&h| (h.name.as_str(), h)).collect();
    let mut cfg = plan.cfg.clone();
    cfg.addr = first.receiver.addr;
    cfg.token = Some(first.token.clone());
    cfg.relay = chain.iter().map(|h| h.name.clone()).collect();
    if let Some(name) = &first.receiver.file_name {
        cfg.walk.name = Some(name.clone());
    }
    cfg.progress = ProgressSink::new(ui.clone());
    let mut held: Vec<(String, FileFailure)> = Vec::new();
    // What cut the session short at the first host.
    let mut cut: Option<FileFailure> = None;
    let hop_of = |host: Option<&String>| {
        host.and_then(|h| by_name.get(h.as_str()).copied())
            .unwrap_or(first)
    };
    let outcome = send_files(&cfg, &plan.files, |event| match event {
        FileEvent::Done(report) => {
            let hop = hop_of(report.host.as_ref());
            let mut report = report.clone();
            report.host = Some(hop.label().to_string());
            reported.say(ui, &hop.name, FileEvent::Done(&report));
        }
        FileEvent::Failed(failure) => {
            let hop = hop_of(failure.host.as_ref());
            let mut failure = failure.clone();
            failure.host = Some(hop.label().to_string());
            if failure.session_ended {
                if !std::ptr::eq(hop, first) {
                    // Said only if no second chain sends it again.
                    held.push((hop.name.clone(), failure));
                    return;
                }
                cut.get_or_insert_with(|| failure.clone());
            }
            reported.say(ui, &hop.name, FileEvent::Failed(&failure));
        }
    });
    let outcome = match outcome {
        Ok(outcome) => outcome,
        Err(error) => {
            // The first failure is what `send_files` returns; what ended
            // the session decides (a host's refusal earlier is no reason
            // to give up on the others).
            use crate::error::ExitCode;
            let (error, restart) = match cut {
                Some(f) => (
                    // The first host's own end, not an earlier failure of
                    // another host.
                    XferError::Remote {
                        host: first.label().to_string(),
                        code: f.exit_code,
                        message: f.reason,
                    },
                    f.retryable || !matches!(f.exit_code, ExitCode::Usage | ExitCode::NoDevice),
                ),
                None => {
                    let restart = error.is_transient();
                    (error, restart)
                }
            };
            return Err(Ended {
                error,
                restart,
                held,
            });
        }
    };
    if summary && !ui.quiet() {
        ui.eprintln(&ui.summary_line(session_summary(&outcome, ui.log_json())));
    }
    // A failure no host's result explains (the sender's own).
    let own = outcome.first_error.filter(|_| !reported.any_failed());
    Ok(own)
}

/// Ends receivers, `LAUNCHES_AT_ONCE` at a time (their input closed:
/// each stops).
fn end_all(hops: Vec<Hop<'_>>) {
    at_once(hops, LAUNCHES_AT_ONCE, |hop| {
        let status = hop.receiver.finish(false);
        tracing::debug!(host = %hop.target.host, ?status, "the remote receiver ended");
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ExitCode;

    #[test]
    fn work_at_once_comes_back_in_order() {
        let out = at_once((0..50u64).collect(), 7, |n| n * 2);
        assert_eq!(out, (0..50u64).map(|n| n * 2).collect::<Vec<_>>());
        assert!(at_once(Vec::<u8>::new(), 4, |n| n).is_empty());
    }

    #[test]
    fn the_worst_target_decides_and_several_are_summed_up() {
        assert!(worst_of(Vec::new(), 3).is_ok());
        let e = |code| XferError::Remote {
            host: "h".into(),
            code,
            message: "m".into(),
        };
        let only = worst_of(vec![e(ExitCode::Usage)], 1).unwrap_err();
        assert!(matches!(only, XferError::Remote { .. }));
        match worst_of(vec![e(ExitCode::Usage), e(ExitCode::Rejected)], 3) {
            Err(XferError::TargetsFailed {
                worst,
                failed: 2,
                targets: 3,
            }) => assert_eq!(worst.exit_code(), ExitCode::Rejected),
            other => panic!("{other:?}"),
        }
    }
}
