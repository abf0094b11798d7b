//! Long file work of a session (the receiver's kept prefix read back, a
//! copy hashed, a --link-dest copy made; the sender's read to answer a
//! HAVE) on a thread of its own, so that the session's loop keeps waiting
//! on the link meanwhile: a vanished peer is noticed and KEEPALIVEs go out
//! on time. The result comes back to the loop.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::thread::JoinHandle;
use std::time::Duration;

/// What a job looks at between its pieces: whether to stop.
pub(crate) struct Cancel(Arc<AtomicBool>);

impl Cancel {
    /// Fails once the session stopped the job (it ends, or goes on
    /// without it) or SIGINT or SIGTERM came.
    pub(crate) fn check(&self) -> std::io::Result<()> {
        if self.0.load(Ordering::Relaxed) || crate::sys::os::shutdown_requested() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "interrupted",
            ));
        }
        Ok(())
    }
}

/// One job on its thread. Dropping it stops the job and waits for its
/// thread: nothing it does outlives the session.
pub(crate) struct Worker<T> {
    cancel: Arc<AtomicBool>,
    result: Receiver<T>,
    /// A result `wait` took, until `result` hands it over.
    ready: Option<Result<T, Lost>>,
    thread: Option<JoinHandle<()>>,
}

/// The job's thread ended without its result (it panicked).
#[derive(Debug)]
pub(crate) struct Lost;

impl<T: Send + 'static> Worker<T> {
    /// Starts `job` on a thread of its own.
    pub(crate) fn start(
        name: &str,
        job: impl FnOnce(&Cancel) -> T + Send + 'static,
    ) -> std::io::Result<Self> {
        let cancel = Arc::new(AtomicBool::new(false));
        let (tx, result) = mpsc::sync_channel(1);
        let stop = Cancel(Arc::clone(&cancel));
        // What the job logs is logged under the session's span (its peer).
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let _in_session = span.enter();
                // The session may be gone: then nobody wants the result.
                let _ = tx.send(job(&stop));
            })?;
        Ok(Self {
            cancel,
            result,
            ready: None,
            thread: Some(thread),
        })
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
            Err(TryRecvError::Disconnected) => Some(Err(Lost)),
        }
    }
}

impl<T> Worker<T> {
    /// Waits up to `timeout` for the job's result (`result` then has it).
    pub(crate) fn wait(&mut self, timeout: Duration) {
        if self.ready.is_some() {
            return;
        }
        match self.result.recv_timeout(timeout) {
            Ok(t) => self.ready = Some(Ok(t)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => self.ready = Some(Err(Lost)),
        }
    }
}

impl<T> Drop for Worker<T> {
    fn drop(&mut self) {
        self.cancel.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panic was reported on its thread; nothing to add.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn the_result_comes_back_once() {
        let mut worker = Worker::start("test-worker", |_| 7).unwrap();
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
    fn a_wait_ends_when_the_result_comes_not_at_its_timeout() {
        let mut worker = Worker::start("test-worker", |_| {
            std::thread::sleep(Duration::from_millis(20));
            7
        })
        .unwrap();
        let started = Instant::now();
        worker.wait(Duration::from_secs(30));
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(worker.result().map(Result::unwrap), Some(7));
    }

    #[test]
    fn dropping_a_worker_stops_its_job_and_joins_its_thread() {
        let ended = Arc::new(AtomicBool::new(false));
        let seen = Arc::clone(&ended);
        let mut worker = Worker::start("test-worker", move |cancel| {
            // Would run for a minute unless stopped.
            let until = Instant::now() + Duration::from_secs(60);
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
        })
        .unwrap();
        assert!(worker.result().is_none());
        let started = Instant::now();
        drop(worker);
        assert!(
            ended.load(Ordering::SeqCst),
            "the thread outlived its worker"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}
