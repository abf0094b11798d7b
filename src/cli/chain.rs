//! The one-command form's relay chain, the default with several targets:
//! every target's receiver is started over ssh with a one-time token of
//! its own (`receiver --ssh-relay`); once all of them listen, each is
//! handed the tokens of the hosts after it (on its ssh channel, never on
//! the fabric), and the sender sends to the first only. Each host passes
//! the files on to the next (`engine::relay`) and its results come back
//! per file. A target that cannot be started is left out of the chain
//! and reported failed; the exit status is the worst of all.

use super::args::RemotePlan;
use super::render::session_summary;
use super::ui::Ui;
use crate::engine::ProgressSink;
use crate::engine::remote::{self, RemoteReceiver, Target};
use crate::engine::sender::send_files;
use crate::engine::{FileEvent, FileFailure};
use crate::error::XferError;
use crate::proto::Token;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use zeroize::Zeroizing;

/// Receivers started at once, at least (ssh log-ins are mostly waiting).
const LAUNCHES_AT_ONCE: usize = 16;

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

/// Sends the plan's files along a chain of its targets, in their order.
pub fn send_by_relay(plan: &RemotePlan, ui: &Arc<Ui>, summary: bool) -> Result<(), XferError> {
    let targets = plan.targets.len();
    let mut failed: Vec<(usize, XferError)> = Vec::new();
    let mut hops = start_all(plan, ui, &mut failed)?;
    hand_keys(&mut hops, &mut failed);
    for (i, e) in &failed {
        report_target(ui, &plan.targets[*i].host, Err(e));
    }
    let mut worst: Vec<XferError> = failed.into_iter().map(|(_, e)| e).collect();
    if !hops.is_empty() {
        match relay_through(plan, ui, &hops, summary) {
            Ok(per_host) => worst.extend(per_host),
            Err(e) => {
                // The session to the first host ended: no host's result
                // is known.
                for hop in &hops {
                    report_target(ui, &label_of(hop), Err(&e));
                }
                let lost = hops.len();
                end_all(hops);
                return Err(if lost == targets {
                    e
                } else {
                    XferError::TargetsFailed {
                        worst: Box::new(e),
                        failed: lost + worst.len(),
                        targets,
                    }
                });
            }
        }
    }
    end_all(hops);
    let failed = worst.len();
    match worst.into_iter().max_by_key(XferError::exit_code) {
        None => Ok(()),
        Some(only) if targets == 1 => Err(only),
        Some(worst) => Err(XferError::TargetsFailed {
            worst: Box::new(worst),
            failed,
            targets,
        }),
    }
}

/// How results name a host: by its target's host, as the direct copies'
/// do.
fn label_of(hop: &Hop<'_>) -> String {
    hop.target.host.clone()
}

/// With `--json`, a target's record; a failure's line on stderr.
fn report_target(ui: &Ui, label: &str, result: Result<(), &XferError>) {
    ui.target_ended(label, result);
    if let Err(e) = result {
        ui.eprintln(&format!(
            "sender: error: {}: {}",
            crate::proto::escaped(label),
            super::targets::strip_host(e, label)
        ));
    }
}

/// Starts every target's receiver, up to `LAUNCHES_AT_ONCE` (or
/// `--parallel`) at once; the ones that could not be started go to
/// `failed` with their index.
fn start_all<'a>(
    plan: &'a RemotePlan,
    ui: &Arc<Ui>,
    failed: &mut Vec<(usize, XferError)>,
) -> Result<Vec<Hop<'a>>, XferError> {
    let mut launch = plan.launch.clone();
    launch.relay = true;
    let on_stderr: Arc<dyn Fn(&str) + Send + Sync> = {
        let ui = ui.clone();
        Arc::new(move |line: &str| ui.eprintln(line))
    };
    let mut tokens = Vec::with_capacity(plan.targets.len());
    for _ in &plan.targets {
        tokens.push(Mutex::new(Some(remote::one_time_token()?)));
    }
    let next = AtomicUsize::new(0);
    let started: Mutex<Vec<(usize, Result<Hop<'a>, XferError>)>> = Mutex::new(Vec::new());
    let workers = plan.parallel.max(LAUNCHES_AT_ONCE).min(plan.targets.len());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let (Some(target), Some(token)) = (plan.targets.get(i), tokens.get(i)) else {
                        break;
                    };
                    let Some((token, token_hex)) =
                        token.lock().unwrap_or_else(PoisonError::into_inner).take()
                    else {
                        break;
                    };
                    let result = if crate::sys::os::shutdown_requested() {
                        Err(crate::sys::SysError::Interrupted.into())
                    } else {
                        remote::launch(target, &launch, &token_hex, on_stderr.clone())
                    };
                    let hop = result.map(|receiver| Hop {
                        index: i,
                        target,
                        name: receiver.addr.to_string(),
                        receiver,
                        token,
                        token_hex,
                    });
                    started
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((i, hop));
                }
            });
        }
    });
    let mut started = started.into_inner().unwrap_or_else(PoisonError::into_inner);
    // The chain goes in the order given.
    started.sort_by_key(|(i, _)| *i);
    let mut hops = Vec::new();
    for (i, hop) in started {
        match hop {
            Ok(hop) => hops.push(hop),
            Err(e) => failed.push((i, e)),
        }
    }
    if crate::sys::os::shutdown_requested() {
        end_all(hops);
        return Err(crate::sys::SysError::Interrupted.into());
    }
    // scp's PATH naming the one file: the chain sends it under one name.
    if let Some(first) = hops.first() {
        let name = &first.receiver.file_name;
        if let Some(other) = hops.iter().find(|h| h.receiver.file_name != *name) {
            let e = XferError::Usage(format!(
                "{} and {} disagree about the file's name (a PATH is a directory on one and \
                 names the file on the other): a relay chain sends one name; give each target \
                 as a directory, or --no-relay",
                first.target.host, other.target.host
            ));
            end_all(hops);
            return Err(e);
        }
    }
    Ok(hops)
}

/// Hands each host the tokens of the hosts after it. A host that does
/// not take them is left out (reported in `failed`); the hosts before it
/// hold a token they will not use.
fn hand_keys(hops: &mut Vec<Hop<'_>>, failed: &mut Vec<(usize, XferError)>) {
    let names: Vec<(String, Zeroizing<String>)> = hops
        .iter()
        .map(|h| (h.name.clone(), h.token_hex.clone()))
        .collect();
    let results: Vec<Result<(), XferError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = hops
            .iter_mut()
            .enumerate()
            .map(|(i, hop)| {
                let after: Vec<(String, &str)> = names[i + 1..]
                    .iter()
                    .map(|(n, hex)| (n.clone(), hex.as_str()))
                    .collect();
                scope.spawn(move || hop.receiver.hand_relay_keys(&after))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(XferError::Internal("a key hand-over panicked".into())))
            })
            .collect()
    });
    let mut kept = Vec::with_capacity(hops.len());
    for (hop, result) in std::mem::take(hops).into_iter().zip(results) {
        match result {
            Ok(()) => kept.push(hop),
            Err(e) => {
                failed.push((hop.index, e));
                end_all(vec![hop]);
            }
        }
    }
    *hops = kept;
}

/// The session along the chain: each file's line and record name its
/// host by its target. Each host that failed for some file: its worst
/// failure, as the target's error.
fn relay_through(
    plan: &RemotePlan,
    ui: &Arc<Ui>,
    hops: &[Hop<'_>],
    summary: bool,
) -> Result<Vec<XferError>, XferError> {
    let Some(first) = hops.first() else {
        return Ok(Vec::new());
    };
    let by_name: HashMap<&str, String> = hops
        .iter()
        .map(|h| (h.name.as_str(), label_of(h)))
        .collect();
    let first_label = label_of(first);
    let mut cfg = plan.cfg.clone();
    cfg.addr = first.receiver.addr;
    cfg.token = Some(first.token.clone());
    cfg.relay = hops.iter().map(|h| h.name.clone()).collect();
    if let Some(name) = &first.receiver.file_name {
        cfg.walk.name = Some(name.clone());
    }
    cfg.progress = ProgressSink::new(ui.clone());
    let worst: Mutex<HashMap<String, FileFailure>> = Mutex::new(HashMap::new());
    let label_for = |host: Option<&String>| {
        host.and_then(|h| by_name.get(h.as_str()))
            .cloned()
            .unwrap_or_else(|| first_label.clone())
    };
    let outcome = send_files(&cfg, &plan.files, |event| match event {
        FileEvent::Done(report) => {
            let mut report = report.clone();
            report.host = Some(label_for(report.host.as_ref()));
            ui.file_event_from(None, FileEvent::Done(&report));
        }
        FileEvent::Failed(failure) => {
            let mut failure = failure.clone();
            let label = label_for(failure.host.as_ref());
            failure.host = Some(label.clone());
            ui.file_event_from(None, FileEvent::Failed(&failure));
            let mut worst = worst.lock().unwrap_or_else(PoisonError::into_inner);
            let keep = worst
                .get(&label)
                .is_none_or(|w| w.exit_code < failure.exit_code);
            if keep {
                worst.insert(label, failure);
            }
        }
    })?;
    if summary && !ui.quiet() {
        ui.eprintln(&ui.summary_line(session_summary(&outcome, ui.log_json())));
    }
    let worst = worst.into_inner().unwrap_or_else(PoisonError::into_inner);
    let mut failures = Vec::new();
    for hop in hops {
        let label = label_of(hop);
        match worst.get(&label) {
            None => ui.target_ended(&label, Ok(())),
            Some(f) => {
                let e = XferError::Remote {
                    host: label.clone(),
                    code: f.exit_code,
                    message: format!("{}: {}", crate::proto::escaped(&f.name), f.reason),
                };
                ui.target_ended(&label, Err(&e));
                failures.push(e);
            }
        }
    }
    // A failure no host's result explains (the sender's own).
    if failures.is_empty()
        && let Some(first) = outcome.first_error
    {
        failures.push(first);
    }
    Ok(failures)
}

/// Ends every receiver at once (their input closed: each stops).
fn end_all(hops: Vec<Hop<'_>>) {
    std::thread::scope(|scope| {
        for hop in hops {
            scope.spawn(move || {
                let status = hop.receiver.finish(false);
                tracing::debug!(host = %hop.target.host, ?status, "the remote receiver ended");
            });
        }
    });
}
