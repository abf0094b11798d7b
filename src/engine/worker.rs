//! Long file work of a session (the receiver's kept prefix read back, a
//! copy hashed, a --link-dest copy made; the sender's read to answer a
//! HAVE) on a thread of its own, so that the session's loop keeps waiting
//! on the link meanwhile: a vanished peer is noticed and KEEPALIVEs go out
//! on time. The result comes back to the loop. A job that makes no
//! progress for the session's --timeout (a read stuck in the kernel: a
//! hung NFS or FUSE source) ends the session, so that it does not hold
//! its peer (and a receiver's --max-sessions slot) with KEEPALIVEs for
//! ever.

use crate::engine::link::Link;
use crate::error::XferError;
use crate::sys::SysError;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// While a job runs the session's loop waits on its result (which wakes
/// it at once) and looks at the link this often: the peer's messages and
/// its disconnect, our KEEPALIVEs' completions.
pub(crate) const WORK_CHECK: Duration = Duration::from_millis(50);

/// How long dropping a worker waits for its stopped job to end before it
/// lets the thread go (`Drop`): a job looks at `Cancel` between pieces,
/// well within this unless a read is stuck in the kernel.
const JOIN_PATIENCE: Duration = Duration::from_secs(1);

/// What a job looks at between its pieces: whether to stop. Looking
/// counts as progress (`Worker::wait_until`).
pub(crate) struct Cancel {
    stop: Arc<AtomicBool>,
    pieces: Arc<AtomicU64>,
}

impl Cancel {
    /// Between two pieces of the job: counts the piece done, and fails
    /// once the session stopped the job (it ends, or goes on without it)
    /// or SIGINT or SIGTERM came.
    pub(crate) fn check(&self) -> std::io::Result<()> {
        self.pieces.fetch_add(1, Ordering::Relaxed);
        if self.stop.load(Ordering::Relaxed) || crate::sys::os::shutdown_requested() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "interrupted",
            ));
        }
        Ok(())
    }

    /// Whether the session stopped the job (or SIGINT or SIGTERM came),
    /// without counting a piece: for a job waiting on someone else's
    /// input, whose wait is no progress of its own.
    pub(crate) fn is_stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed) || crate::sys::os::shutdown_requested()
    }
}

/// One job on its thread. Dropping it stops the job and waits for its
/// thread a little (see `Drop`).
pub(crate) struct Worker<T> {
    /// The thread's name, for errors.
    name: &'static str,
    /// What the job does, for errors ("hashing the receiver's copy of f").
    what: String,
    /// The job made no progress for its stall limit (`wait_until` failed).
    stalled: bool,
    stop: Arc<AtomicBool>,
    /// Pieces the job has done (`Cancel::check`).
    pieces: Arc<AtomicU64>,
    /// The count last seen, and when it was first seen.
    seen: (u64, Instant),
    /// No progress for this long ends the session (its --timeout).
    stall_limit: Duration,
    /// Where `run` sends the job.
    jobs: Option<mpsc::SyncSender<Job<T>>>,
    result: Receiver<T>,
    /// A result `wait` took, until `result` hands it over.
    ready: Option<Result<T, Lost>>,
    thread: Option<JoinHandle<()>>,
}

/// A thread ended without its result (it panicked; the panic was
/// reported on its thread).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Lost {
    /// The thread's name.
    pub(crate) thread: &'static str,
}

impl From<Lost> for XferError {
    fn from(Lost { thread }: Lost) -> Self {
        XferError::Internal(format!("the thread {thread} ended without its result"))
    }
}

/// The error of a session whose helper thread made no progress for its
/// --timeout (`context`: what it was doing; `thread`: which one).
pub(crate) fn stalled(context: impl Into<String>, thread: &str) -> XferError {
    XferError::io(
        context,
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("the {thread} thread stalled"),
        ),
    )
}

/// A job, sent to its thread.
type Job<T> = Box<dyn FnOnce(&Cancel) -> T + Send>;

#[cfg(test)]
thread_local! {
    /// Tests: the next `Worker::start` on this thread fails (no thread to
    /// spare), so that the callers' answers to that are tried.
    static START_FAILS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Tests: makes the next `Worker::start` on this thread fail.
#[cfg(test)]
pub(crate) fn fail_next_start() {
    START_FAILS.set(true);
}

impl<T: Send + 'static> Worker<T> {
    /// Starts a thread named `name` for one job (`run` gives it), which
    /// does `what` (said in its errors). A job that does no piece for
    /// `stall_limit` ends the session (`wait_until`). The thread comes
    /// first so that a failure to start it takes nothing of the job's:
    /// the caller still has it all to say why the file is not read.
    pub(crate) fn start(
        name: &'static str,
        what: String,
        stall_limit: Duration,
    ) -> std::io::Result<Self> {
        #[cfg(test)]
        if START_FAILS.take() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WouldBlock,
                "no thread to spare (the test's)",
            ));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let pieces = Arc::new(AtomicU64::new(0));
        let (jobs, job) = mpsc::sync_channel::<Job<T>>(1);
        let (tx, result) = mpsc::sync_channel(1);
        let cancel = Cancel {
            stop: Arc::clone(&stop),
            pieces: Arc::clone(&pieces),
        };
        // What the job logs is logged under the session's span (its peer).
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _in_session = span.enter();
                // None: the worker was dropped before its job came.
                if let Ok(job) = job.recv() {
                    // The session may be gone: then nobody wants the result.
                    let _ = tx.send(job(&cancel));
                }
            })?;
        Ok(Self {
            name,
            what,
            stalled: false,
            stop,
            pieces,
            seen: (0, Instant::now()),
            stall_limit,
            jobs: Some(jobs),
            result,
            ready: None,
            thread: Some(thread),
        })
    }

    /// Gives the thread its job (once; a second is dropped). The stall
    /// limit counts from now.
    pub(crate) fn run(mut self, job: impl FnOnce(&Cancel) -> T + Send + 'static) -> Self {
        self.seen = (self.pieces.load(Ordering::Relaxed), Instant::now());
        if let Some(jobs) = self.jobs.take() {
            // Fails only if the thread is gone: `result` says so then.
            let _ = jobs.send(Box::new(job));
        }
        self
    }

    /// The job's result once it is there (then the thread has ended or is
    /// ending).
    pub(crate) fn result(&mut self) -> Option<Result<T, Lost>> {
        if let Some(ready) = self.ready.take() {
            return Some(ready);
        }
        match self.result.try_recv() {
            Ok(t) => Some(Ok(t)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(Err(self.lost())),
        }
    }
}

impl<T> Worker<T> {
    fn lost(&self) -> Lost {
        Lost { thread: self.name }
    }

    /// Whether the job made no progress for its stall limit (the error
    /// `wait_until` returned was that).
    pub(crate) fn has_stalled(&self) -> bool {
        self.stalled
    }

    /// Waits up to `timeout` for the job's result (`result` then has it).
    fn wait(&mut self, timeout: Duration) {
        if self.ready.is_some() {
            return;
        }
        match self.result.recv_timeout(timeout) {
            Ok(t) => self.ready = Some(Ok(t)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.ready = Some(Err(self.lost())),
        }
    }

    /// The session's wait while the job runs: on its result until
    /// `deadline` (the machine's next KEEPALIVE, say), `WORK_CHECK` at
    /// most, then on `link` without waiting any longer (what the peer
    /// sent meanwhile, its disconnect). Fails once SIGINT or SIGTERM
    /// came, or when the job did no piece for its stall limit (the
    /// session ends then, and its KEEPALIVEs with it).
    pub(crate) fn wait_until<L: Link + ?Sized>(
        &mut self,
        deadline: Instant,
        link: &mut L,
        what: &str,
    ) -> Result<(), XferError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.wait(left.min(WORK_CHECK));
        if crate::sys::os::shutdown_requested() {
            return Err(XferError::Sys(SysError::Interrupted));
        }
        if self.ready.is_none() {
            self.check_progress()?;
        }
        link.wait_until(Instant::now(), what).map(drop)
    }

    /// Fails when the job did no piece for its stall limit.
    fn check_progress(&mut self) -> Result<(), XferError> {
        let pieces = self.pieces.load(Ordering::Relaxed);
        if pieces != self.seen.0 {
            self.seen = (pieces, Instant::now());
            return Ok(());
        }
        if self.seen.1.elapsed() >= self.stall_limit {
            self.stalled = true;
            return Err(stalled(
                format!(
                    "{} made no progress for {}s",
                    self.what,
                    self.stall_limit.as_secs_f64()
                ),
                self.name,
            ));
        }
        Ok(())
    }
}

/// Stops the job, and joins its thread once it ended; if it does not end
/// within `JOIN_PATIENCE` (a read stuck in the kernel), lets it go rather
/// than hang the session's end on it. The job owns only what it was
/// given (its own descriptor, its buffer, for a receiver a store of its
/// own and a claim on one partial file), and its result goes into a
/// channel nobody reads, where it is dropped (and what it holds
/// released). It stops at its next look at `Cancel`, and a job that
/// puts a file in place (a --link-dest link or copy) looks right before
/// it does: a job left behind puts nothing under a final name after its
/// session ended, unless it was already doing so (its commit's fsync, or
/// the rename, under way when the session gave up).
impl<T> Drop for Worker<T> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        // A thread still waiting for its job ends without one.
        self.jobs = None;
        let Some(thread) = self.thread.take() else {
            return;
        };
        // The channel disconnects when the thread's closure ends: the
        // result sent (or taken already) or the job panicked.
        let ended = self.ready.is_some()
            || loop {
                match self.result.recv_timeout(JOIN_PATIENCE) {
                    Ok(_) => continue,
                    Err(RecvTimeoutError::Disconnected) => break true,
                    Err(RecvTimeoutError::Timeout) => break false,
                }
            };
        if ended {
            // A panic was reported on its thread; nothing to add.
            let _ = thread.join();
        } else {
            tracing::warn!(
                thread = self.name,
                "the stopped job did not end within {}s (stuck in the kernel?): left behind",
                JOIN_PATIENCE.as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::memory_wire;

    const LONG: Duration = Duration::from_secs(60);

    fn started<T: Send + 'static>(
        name: &'static str,
        stall_limit: Duration,
        job: impl FnOnce(&Cancel) -> T + Send + 'static,
    ) -> Worker<T> {
        Worker::start(name, "the test's job".into(), stall_limit)
            .unwrap()
            .run(job)
    }

    #[test]
    fn a_start_the_test_refuses_fails_once() {
        fail_next_start();
        assert!(Worker::<u8>::start("test-refused", "idling".into(), LONG).is_err());
        assert!(Worker::<u8>::start("test-refused", "idling".into(), LONG).is_ok());
    }

    #[test]
    fn a_worker_dropped_before_its_job_ends_its_thread() {
        let worker = Worker::<u8>::start("test-idle", "idling".into(), LONG).unwrap();
        let started = Instant::now();
        drop(worker);
        assert!(started.elapsed() < JOIN_PATIENCE);
    }

    #[test]
    fn the_result_comes_back_once() {
        let mut worker = started("test-worker", LONG, |_| 7);
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            if let Some(r) = worker.result() {
                break r.unwrap();
            }
            assert!(Instant::now() < deadline, "no result");
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(got, 7);
    }

    #[test]
    fn a_wait_ends_when_the_result_comes_not_at_its_deadline() {
        let (mut link, _peer) = memory_wire::pair();
        let mut worker = started("test-worker", LONG, |_| {
            std::thread::sleep(Duration::from_millis(20));
            7
        });
        let started = Instant::now();
        while worker.ready.is_none() {
            let deadline = Instant::now() + LONG;
            worker.wait_until(deadline, &mut link, "the test").unwrap();
            assert!(started.elapsed() < Duration::from_secs(10));
        }
        assert_eq!(worker.result().map(Result::unwrap), Some(7));
    }

    #[test]
    fn a_panicked_job_is_a_lost_result_and_an_internal_error() {
        let mut worker = started::<u8>("test-panics", LONG, |_| panic!("the test's"));
        worker.wait(Duration::from_secs(10));
        let Some(Err(lost)) = worker.result() else {
            panic!("no lost result");
        };
        let err = XferError::from(lost);
        assert!(matches!(err, XferError::Internal { .. }), "{err:?}");
        assert!(err.to_string().contains("test-panics"), "{err}");
    }

    #[test]
    fn dropping_a_worker_stops_its_job_and_joins_its_thread() {
        let ended = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&ended);
        let mut worker = started("test-worker", LONG, move |cancel| {
            // Would run for a minute unless stopped.
            let until = Instant::now() + LONG;
            let stopped = loop {
                if cancel.check().is_err() {
                    break true;
                }
                if Instant::now() >= until {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(1));
            };
            seen.store(true, Ordering::SeqCst);
            stopped
        });
        assert!(worker.result().is_none());
        let started = Instant::now();
        drop(worker);
        assert!(
            ended.load(Ordering::SeqCst),
            "the thread outlived its worker"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    /// A job blocked where it cannot look at `Cancel` (a read stuck in
    /// the kernel), until the test lets it go; sets its flag at its end.
    fn stuck(ended: &Arc<AtomicBool>) -> (Worker<()>, mpsc::Sender<()>) {
        let (release, held) = mpsc::channel::<()>();
        let seen = Arc::clone(ended);
        let worker = started("test-stuck", Duration::from_millis(300), move |_| {
            // At most 10 s: a drop that waits for it shows, and does not hang.
            let _ = held.recv_timeout(Duration::from_secs(10));
            seen.store(true, Ordering::SeqCst);
        });
        (worker, release)
    }

    #[test]
    fn a_job_without_progress_for_its_limit_fails_the_wait_and_is_left_behind_on_drop() {
        let (mut link, _peer) = memory_wire::pair();
        let ended = Arc::new(AtomicBool::new(false));
        let (mut worker, release) = stuck(&ended);
        let started = Instant::now();
        let failed = loop {
            if let Err(e) = worker.wait_until(Instant::now() + LONG, &mut link, "the test") {
                break e;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "never stalled");
        };
        assert!(started.elapsed() >= Duration::from_millis(300));
        assert!(
            matches!(&failed, XferError::Io { context, source }
                if source.kind() == std::io::ErrorKind::TimedOut
                    && source.to_string() == "the test-stuck thread stalled"
                    && context == "the test's job made no progress for 0.3s"),
            "{failed:?}"
        );
        assert!(worker.has_stalled());
        // A local read stuck: an I/O error (exit 6), not worth a retry.
        assert_eq!(failed.exit_code(), crate::error::ExitCode::Io);
        assert!(!failed.is_transient());
        // Dropped while stuck: it does not wait for the thread for ever.
        let dropping = Instant::now();
        drop(worker);
        assert!(dropping.elapsed() < JOIN_PATIENCE + Duration::from_secs(5));
        assert!(!ended.load(Ordering::SeqCst), "the job was never stuck");
        // Let go, it ends on its own.
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !ended.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "the job never ended");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    #[test]
    fn a_job_that_does_its_pieces_is_not_stalled_however_long_it_runs() {
        let (mut link, _peer) = memory_wire::pair();
        let mut worker = started("test-slow", Duration::from_millis(500), |cancel| {
            // A second in pieces of 20 ms: twice the stall limit.
            for _ in 0..50 {
                std::thread::sleep(Duration::from_millis(20));
                cancel.check()?;
            }
            Ok::<_, std::io::Error>(7)
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        let got = loop {
            if let Some(got) = worker.result() {
                break got.unwrap().unwrap();
            }
            worker
                .wait_until(Instant::now() + LONG, &mut link, "the test")
                .unwrap();
            assert!(Instant::now() < deadline, "no result");
        };
        assert_eq!(got, 7);
    }
}
