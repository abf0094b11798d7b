//! The one-command form's driver: for each `[USER@]HOST:DIR` target a
//! receiver started over ssh (`engine::remote`), one session with it
//! under a one-time token, and its end; up to `--parallel` targets at
//! once, each with its own result. Several targets go by a relay chain
//! (`chain`) unless `--no-relay`. Every file's `--json` record names
//! its host; with several targets so does every text line.

use super::args::{Chain, RemotePlan};
use super::render::session_summary;
use super::ui::{HostLabel, HostProgress, Ui};
use crate::engine::ProgressSink;
use crate::engine::remote::{self, Target};
use crate::engine::sender::{SessionOutcome, pause_unless_interrupted, retry_pause, send_files};
use crate::error::XferError;
use crate::sys::os::shutdown_requested;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// Sends the plan's files to every target. One target: its error as it
/// is. Several: each failure reported as it happens, then
/// `TargetsFailed` with the worst (highest) exit status.
pub fn send_to_targets(plan: &RemotePlan, ui: &Arc<Ui>, summary: bool) -> Result<(), XferError> {
    match &plan.chain {
        Chain::Relay => return super::chain::send_by_relay(plan, ui, summary),
        Chain::DirectFor(why) => tracing::warn!("{why}"),
        Chain::Direct => {}
    }
    let labelled = plan.targets.len() > 1;
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<XferError>> = Mutex::new(Vec::new());
    let workers = plan.parallel.clamp(1, plan.targets.len().max(1));
    let workers = within_memlock(workers, &plan.cfg);
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(target) = plan.targets.get(i) else {
                        break;
                    };
                    // After Ctrl-C no new target is started.
                    let result = if shutdown_requested() {
                        Err(crate::sys::SysError::Interrupted.into())
                    } else {
                        one_target(plan, target, ui, labelled, summary)
                    };
                    ui.target_ended(&target.host, result.as_ref().map(|_| ()));
                    if labelled && let Err(e) = &result {
                        // A target's end is an error line of its own; the
                        // tool's final error sums them up.
                        ui.eprintln(&format!(
                            "sender: error: {}: {}",
                            crate::proto::escaped(&target.host),
                            super::ui::strip_host(e, &target.host)
                        ));
                    }
                    if let Err(e) = result {
                        failures
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .push(e);
                    }
                }
            });
        }
    });
    let failures = failures
        .into_inner()
        .unwrap_or_else(PoisonError::into_inner);
    let failed = failures.len();
    let worst = failures.into_iter().max_by_key(XferError::exit_code);
    match (worst, plan.targets.len()) {
        (None, _) => Ok(()),
        (Some(only), 1) => Err(only),
        (Some(worst), targets) => Err(XferError::TargetsFailed {
            worst: Box::new(worst),
            failed,
            targets,
        }),
    }
}

/// Targets served at once, fewer where the locked-memory limit holds the
/// staging buffers of only some sessions at once (each fits its buffers
/// to what is left: a second one at the same time would find nothing).
fn within_memlock(workers: usize, cfg: &crate::engine::sender::SenderConfig) -> usize {
    let Some(room) = crate::sys::os::memlock_room().available() else {
        return workers;
    };
    let per_session = u64::from(cfg.chunk_size) * u64::from(cfg.depth);
    let fit = usize::try_from(room / per_session.max(1))
        .unwrap_or(usize::MAX)
        .max(1);
    if fit < workers {
        tracing::warn!(
            "the locked-memory limit (RLIMIT_MEMLOCK, {} free) holds the buffers of {fit} \
             session(s) at once: serving {fit} target(s) at a time instead of {workers}; raise \
             the limit (`ulimit -l unlimited` as root) for more",
            crate::units::format_bytes(room)
        );
    }
    workers.min(fit)
}

/// One target: start its receiver, send, end it; after a failure that
/// may be transient, again (a new receiver, a new token) up to
/// `plan.retries` times, continuing what the receiver kept.
fn one_target(
    plan: &RemotePlan,
    target: &Target,
    ui: &Arc<Ui>,
    labelled: bool,
    summary: bool,
) -> Result<(), XferError> {
    // Several targets: log lines say which (see `log::TARGET_SPAN`).
    let span = if labelled {
        tracing::error_span!(super::log::TARGET_SPAN, host = %crate::proto::escaped(&target.host))
    } else {
        tracing::Span::none()
    };
    let _enter = span.enter();
    let label = HostLabel {
        host: target.host.clone(),
        labelled,
    };
    let progress = Arc::new(HostProgress {
        ui: ui.clone(),
        label: label.clone(),
    });
    let mut attempt = 0;
    loop {
        let counts = FileCounts::default();
        let result = attempt_once(plan, target, ui, &label, &progress, &counts);
        let result = match result {
            Ok(outcome) => {
                if summary && !ui.quiet() {
                    let line = ui.summary_line(session_summary(&outcome, ui.log_json()));
                    ui.eprintln(&if labelled {
                        label.label_line(&line, ui.log_json())
                    } else {
                        line
                    });
                }
                match outcome.first_error {
                    None => Ok(()),
                    Some(first) => Err(XferError::FilesFailed {
                        first: Box::new(first),
                        failed: counts.failed.load(Ordering::Relaxed).max(1),
                        files: counts.files.load(Ordering::Relaxed).max(1),
                    }),
                }
            }
            Err(e) => Err(e),
        };
        // A stream cannot be read again: what the first attempt took from
        // standard input is gone.
        let rereadable = !plan.files.iter().any(|f| f.as_os_str() == "-");
        match result {
            Err(e)
                if e.is_transient()
                    && attempt < plan.retries
                    && rereadable
                    && !shutdown_requested() =>
            {
                attempt += 1;
                let pause = retry_pause(attempt);
                tracing::warn!(
                    "{e}; trying again in {} s with a new receiver (attempt {attempt} of {})",
                    pause.as_secs(),
                    plan.retries
                );
                if !pause_unless_interrupted(pause) {
                    return Err(crate::sys::SysError::Interrupted.into());
                }
            }
            other => return other,
        }
    }
}

/// Files reported for one target in one attempt.
#[derive(Default)]
struct FileCounts {
    files: AtomicU64,
    failed: AtomicU64,
}

fn attempt_once(
    plan: &RemotePlan,
    target: &Target,
    ui: &Arc<Ui>,
    label: &HostLabel,
    progress: &Arc<HostProgress>,
    counts: &FileCounts,
) -> Result<SessionOutcome, XferError> {
    let (token, token_hex) = remote::one_time_token()?;
    let on_stderr: Arc<dyn Fn(&str) + Send + Sync> = {
        let ui = ui.clone();
        Arc::new(move |line: &str| ui.eprintln(line))
    };
    let receiver = remote::launch(target, &plan.launch, &token_hex, on_stderr)?;
    tracing::debug!(addr = %receiver.addr, "the remote receiver listens");
    let mut cfg = plan.cfg.clone();
    cfg.addr = receiver.addr;
    cfg.token = Some(token);
    // scp's PATH named the file: it arrives under PATH's last component.
    if let Some(name) = &receiver.file_name {
        cfg.walk.name = Some(name.clone());
    }
    cfg.progress = ProgressSink::new(progress.clone());
    let result = send_files(&cfg, &plan.files, |event| {
        counts.files.fetch_add(1, Ordering::Relaxed);
        if matches!(event, crate::engine::FileEvent::Failed(_)) {
            counts.failed.fetch_add(1, Ordering::Relaxed);
        }
        ui.file_event_from(Some(label), event);
    });
    let session_ok = matches!(&result, Ok(o) if o.first_error.is_none());
    let status = receiver.finish(session_ok);
    tracing::debug!(?status, "the remote receiver ended");
    result
}
