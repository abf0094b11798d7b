//! Whole transfers (as in `memory_transfers.rs`) whose HAVE is answered
//! by a long read on the sender's worker: the receiver kept informed
//! meanwhile, the read stopped when the connection breaks, a read stuck
//! (as in a hung NFS or FUSE source) ending the session after --timeout.

use super::SenderConfig;
use super::have::READ_HOOK;
use super::memory_transfers::{Meddled, configs, transfer, transfer_meddled};
use crate::engine::memory_wire;
use crate::engine::receiver::{ReceiverConfig, Reported};
use crate::engine::report::Outcome;
use crate::error::XferError;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Set when the HAVE's read ends (it drops the hook that holds it).
struct JobEnd(Arc<AtomicBool>);

impl Drop for JobEnd {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Waits up to 10 s for `flag`.
fn wait_for(flag: &AtomicBool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !flag.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `data` sent once as the file "big" with its time: the next run, with
/// --resume and --ignore-times (set, with `timeout` on both sides; by its
/// size and time alone the copy would be unchanged at once), finds the
/// complete copy and the sender reads the file for a COMPARE; that read
/// calls `before_piece` before each of its pieces.
fn sent_once(
    data: &[u8],
    timeout: Duration,
    before_piece: impl Fn() + Send + Sync + 'static,
) -> (TempDir, TempDir, SenderConfig, ReceiverConfig) {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(src.path().join("big"), data).unwrap();
    let (mut cfg, mut rcfg) = configs(dest.path());
    cfg.walk.times = true;
    transfer(&cfg, &rcfg, &[src.path().join("big")], None)
        .sent
        .unwrap();
    cfg.resume = true;
    cfg.existing = crate::proto::WhenExisting::IgnoreTimes;
    (cfg.timeout, rcfg.timeout) = (timeout, timeout);
    READ_HOOK.set(Some(Arc::new(before_piece)));
    (src, dest, cfg, rcfg)
}

#[test]
fn a_long_read_for_a_compare_keeps_the_receiver_informed_and_compares_right() {
    let data: Vec<u8> = (0..4u32 << 20).map(|b| (b * 7 + b / 4099) as u8).collect();
    // Both sides give up after 2 s of silence; the sender's read takes
    // longer (1024 chunks, each after a pause of 3 ms).
    let pause = || std::thread::sleep(Duration::from_millis(3));
    let (src, dest, cfg, mut rcfg) = sent_once(&data, Duration::from_secs(2), pause);
    let (s, r) = memory_wire::pair();
    let meddled = Meddled::new(s);
    let keepalives = Arc::clone(&meddled.keepalives);
    let again = transfer_meddled(&cfg, &rcfg, &[src.path().join("big")], Box::new(meddled), r);
    let outcome = again.sent.unwrap();
    again.received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    // The receiver found its copy the same as the sender's SHA-256.
    assert_eq!(outcome.count(Outcome::Unchanged), 1);
    assert_eq!(std::fs::read(dest.path().join("big")).unwrap(), data);
    // One every 667 ms over more than 3 s: about 4; 2 leave room for a
    // loaded machine and still show that they flow during the read.
    let keepalives = keepalives.load(Ordering::Relaxed);
    assert!(keepalives >= 2, "{keepalives} KEEPALIVEs");
    // The source changed, size and time kept: the COMPARE differs and
    // the file is sent again (over the copy: --overwrite).
    rcfg.overwrite = true;
    let mut changed = data.clone();
    changed[3 << 20] ^= 1;
    let mtime = std::fs::metadata(src.path().join("big"))
        .unwrap()
        .modified()
        .unwrap();
    std::fs::write(src.path().join("big"), &changed).unwrap();
    let f = std::fs::File::options()
        .write(true)
        .open(src.path().join("big"))
        .unwrap();
    f.set_modified(mtime).unwrap();
    drop(f);
    let third = transfer(&cfg, &rcfg, &[src.path().join("big")], None);
    let outcome = third.sent.unwrap();
    third.received.unwrap();
    assert_eq!(outcome.count(Outcome::Unchanged), 0);
    assert_eq!(std::fs::read(dest.path().join("big")).unwrap(), changed);
}

#[test]
fn a_connection_broken_during_a_long_read_for_a_compare_stops_the_read_at_once() {
    let data: Vec<u8> = (0..1u32 << 20).map(|b| (b * 3) as u8).collect();
    // The read would take 256 chunks of 100 ms: about 26 s.
    let ended = Arc::new(AtomicBool::new(false));
    let end = JobEnd(Arc::clone(&ended));
    let pause = move || {
        let _held = &end;
        std::thread::sleep(Duration::from_millis(100));
    };
    let (src, _dest, cfg, rcfg) = sent_once(&data, Duration::from_secs(2), pause);
    let (s, r) = memory_wire::pair();
    let mut meddled = Meddled::new(s);
    meddled.cut_after_keepalives = Some(2);
    let started = Instant::now();
    let t = transfer_meddled(&cfg, &rcfg, &[src.path().join("big")], Box::new(meddled), r);
    // The session ended and its read stopped long before the read's end.
    assert!(
        matches!(t.sent, Err(XferError::PeerLost(_))),
        "{:?}",
        t.sent.map(|o| o.first_error)
    );
    assert!(t.received.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    wait_for(&ended, "the read went on after the session");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(matches!(&t.sender_saw[..], [Reported::Failed { .. }]));
}

#[test]
fn a_read_stuck_for_the_timeout_ends_the_session_and_is_left_behind() {
    let data: Vec<u8> = (0..64u32 << 10).map(|b| (b * 5) as u8).collect();
    // The read blocks before its first piece until the test lets it go,
    // as a read stuck in the kernel does.
    let ended = Arc::new(AtomicBool::new(false));
    let end = JobEnd(Arc::clone(&ended));
    let (release, held) = mpsc::channel::<()>();
    let held = Mutex::new(held);
    let stuck = move || {
        let _held = &end;
        // At most 10 s: a session that waits for it shows, and does not hang.
        let _ = held.lock().unwrap().recv_timeout(Duration::from_secs(10));
    };
    let timeout = Duration::from_secs(1);
    let (src, _dest, cfg, mut rcfg) = sent_once(&data, timeout, stuck);
    // The receiver would wait much longer: the sender's stall ends it.
    rcfg.timeout = Duration::from_secs(30);
    let (s, r) = memory_wire::pair();
    let mut meddled = Meddled::new(s);
    // A session that would send KEEPALIVEs for ever ends otherwise.
    meddled.cut_after_keepalives = Some(8);
    let keepalives = Arc::clone(&meddled.keepalives);
    let started = Instant::now();
    let t = transfer_meddled(&cfg, &rcfg, &[src.path().join("big")], Box::new(meddled), r);
    let took = started.elapsed();
    assert!(
        matches!(&t.sent, Err(XferError::Io { context, source })
            if source.kind() == std::io::ErrorKind::TimedOut
                && source.to_string() == "the have-read thread stalled"
                && context == "reading big for the receiver's HAVE made no progress for 1s"),
        "{:?}",
        t.sent.as_ref().map(|_| ())
    );
    assert!(matches!(&t.sender_saw[..], [Reported::Failed { name, .. }] if name == "big"));
    assert!(t.received.is_err());
    // Not before the timeout, and not after the read (still stuck).
    assert!(took >= timeout, "{took:?}");
    assert!(took < Duration::from_secs(8), "{took:?}");
    assert!(!ended.load(Ordering::SeqCst), "the read was never stuck");
    // One KEEPALIVE every 333 ms until the stall was found, then none.
    let sent = keepalives.load(Ordering::Relaxed);
    assert!((1..=4).contains(&sent), "{sent} KEEPALIVEs");
    // Let go, the read ends on its own.
    release.send(()).unwrap();
    wait_for(&ended, "the stuck read never ended");
}

#[test]
fn a_read_for_a_have_that_cannot_start_has_the_file_sent_whole() {
    let data: Vec<u8> = (0..64u32 << 10).map(|b| (b * 11) as u8).collect();
    let (src, dest, cfg, mut rcfg) = sent_once(&data, Duration::from_secs(30), || {});
    // The receiver's complete copy is replaced by the data sent again.
    rcfg.overwrite = true;
    // The sender's read (on this thread) gets no thread: FROM 0.
    crate::engine::worker::fail_next_start();
    let t = transfer(&cfg, &rcfg, &[src.path().join("big")], None);
    let outcome = t.sent.unwrap();
    t.received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    // Sent, not skipped: nothing was compared.
    assert_eq!(outcome.count(Outcome::Unchanged), 0);
    assert_eq!(outcome.count(Outcome::Stored), 1);
    assert_eq!(std::fs::read(dest.path().join("big")).unwrap(), data);
}
