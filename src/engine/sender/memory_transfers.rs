//! Whole transfers without RDMA: the sender engine (reader thread,
//! pipeline, verdicts) against the receiver engine's session, joined by the
//! memory wire. The files are real, in temporary directories. The
//! HAVE's read on its worker: `have_transfers.rs`.

use super::{Connection, SenderConfig, SessionOutcome, drive};
use crate::engine::entries;
use crate::engine::link::{Link, Until, WriteDelivery, WriteLink};
use crate::engine::memory_wire;
use crate::engine::receiver::{ReceiverConfig, Reported, reported, sender_auth, serve_over};
use crate::engine::report::{FileEvent, Outcome};
use crate::error::XferError;
use crate::proto::{Channel, DigestAlg, Message, Reject, RejectCode, Token};
use crate::sys::SysError;
use crate::sys::rdma::{Buffer, BufferPool};
use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Both sides of one transfer.
pub(super) struct Transfer {
    pub(super) sent: Result<SessionOutcome, XferError>,
    /// What the sender reported, file by file.
    pub(super) sender_saw: Vec<Reported>,
    /// Which host of a relay chain each of those was about.
    pub(super) sender_hosts: Vec<Option<String>>,
    pub(super) received: Result<(), XferError>,
    pub(super) receiver_saw: Vec<Reported>,
}

/// Small chunks and few of them: files of a few chunks wait for credit.
pub(super) fn configs(dest: &Path) -> (SenderConfig, ReceiverConfig) {
    let mut cfg = SenderConfig::new("127.0.0.1:1".parse().unwrap());
    cfg.chunk_size = 4096;
    cfg.depth = 3;
    cfg.walk.recursive = true;
    let mut rcfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), dest.into());
    rcfg.chunk_size = 4096;
    rcfg.slots = 4;
    (cfg, rcfg)
}

/// Sends `paths` with `cfg` to a receiver session with `rcfg`;
/// `flip_write` corrupts one write on the way.
pub(super) fn transfer(
    cfg: &SenderConfig,
    rcfg: &ReceiverConfig,
    paths: &[PathBuf],
    flip_write: Option<u64>,
) -> Transfer {
    let mut wire = memory_wire::pair();
    wire.0.side.flip_write = flip_write;
    transfer_over(cfg, rcfg, paths, wire)
}

/// `transfer` over the ends of `wire`.
pub(super) fn transfer_over(
    cfg: &SenderConfig,
    rcfg: &ReceiverConfig,
    paths: &[PathBuf],
    (sender_end, receiver_end): (memory_wire::SenderEnd, memory_wire::ReceiverEnd),
) -> Transfer {
    transfer_meddled(cfg, rcfg, paths, Box::new(sender_end), receiver_end)
}

/// `transfer` with the sender's end of the wire as the test made it.
pub(super) fn transfer_meddled(
    cfg: &SenderConfig,
    rcfg: &ReceiverConfig,
    paths: &[PathBuf],
    sender_end: Box<dyn WriteLink>,
    receiver_end: memory_wire::ReceiverEnd,
) -> Transfer {
    let receiver_log = Mutex::new(Vec::new());
    let mut sender_saw = Vec::new();
    let mut sender_hosts = Vec::new();
    let (sent, received) = std::thread::scope(|s| {
        let receiving = s.spawn(|| {
            let on_file = |e: FileEvent<'_>| receiver_log.lock().unwrap().push(reported(e));
            serve_over(rcfg, receiver_end, &on_file)
        });
        let plan = entries::plan(paths, &cfg.walk).expect("a plan");
        let (pool, tokens) =
            BufferPool::in_memory(cfg.slot_size() as usize, cfg.depth as usize).expect("staging");
        let session = super::connection::session_for(cfg, sender_auth(rcfg));
        let mut conn = Connection::new(Duration::ZERO, sender_end, session);
        conn.pace(cfg);
        let on_file = |e: FileEvent<'_>| {
            sender_hosts.push(match e {
                FileEvent::Done(r) => r.host.clone(),
                FileEvent::Failed(f) => f.host.clone(),
            });
            sender_saw.push(reported(e));
        };
        let sent = drive(
            cfg,
            plan.into(),
            conn,
            &pool,
            tokens,
            on_file,
            Instant::now(),
        )
        .map_err(|ended| ended.0.0);
        (sent, receiving.join().expect("the receiver panicked"))
    });
    Transfer {
        sent,
        sender_saw,
        sender_hosts,
        received,
        receiver_saw: receiver_log.into_inner().unwrap(),
    }
}

/// The sender's end of the wire with a test's faults: the receiver's
/// messages of some kinds arrive late (and what follows them, in order),
/// a message arrives after some writes, the connection is cut once a FIN
/// went out.
/// Which of the receiver's messages arrive late, and by how much.
type Late = Option<(fn(&Message) -> bool, Duration)>;

pub(super) struct Meddled {
    end: memory_wire::SenderEnd,
    late: Late,
    inject: Option<(u64, Message)>,
    writes: u64,
    cut_after_fin: bool,
    cut: bool,
    /// KEEPALIVEs sent to the receiver.
    pub(super) keepalives: Arc<AtomicUsize>,
    /// The connection is cut once this many KEEPALIVEs went out.
    pub(super) cut_after_keepalives: Option<usize>,
    /// Deliveries held back until their time, in order.
    held: VecDeque<(Instant, WriteDelivery)>,
    ready: VecDeque<WriteDelivery>,
}

impl Meddled {
    pub(super) fn new(end: memory_wire::SenderEnd) -> Self {
        Meddled {
            end,
            late: None,
            inject: None,
            writes: 0,
            cut_after_fin: false,
            cut: false,
            keepalives: Arc::default(),
            cut_after_keepalives: None,
            held: VecDeque::new(),
            ready: VecDeque::new(),
        }
    }

    /// Takes what the wire delivered: late messages (and what comes after
    /// them) are held; what is due is ready.
    fn pull(&mut self) -> Result<(), XferError> {
        while let Some(delivery) = self.end.next()? {
            let delay = match (&delivery, self.late) {
                // Our writes' completions are not the receiver's to delay.
                (WriteDelivery::Written(_), _) => {
                    self.ready.push_back(delivery);
                    continue;
                }
                // Once cut, nothing more comes from the receiver.
                _ if self.cut => continue,
                (WriteDelivery::Message(Ok(m)), Some((late, delay))) if late(m) => delay,
                _ => Duration::ZERO,
            };
            let after = self.held.back().map(|(at, _)| *at);
            let at = after.into_iter().fold(Instant::now() + delay, Instant::max);
            self.held.push_back((at, delivery));
        }
        let now = Instant::now();
        while self.held.front().is_some_and(|(at, _)| *at <= now) {
            self.ready.extend(self.held.pop_front().map(|(_, d)| d));
        }
        Ok(())
    }
}

impl Link for Meddled {
    fn send(&mut self, msg: &Message) -> Result<(), XferError> {
        if self.cut {
            return Err(XferError::PeerLost("the connection broke".into()));
        }
        self.end.send(msg)?;
        if matches!(msg, Message::Keepalive) {
            let sent = self.keepalives.fetch_add(1, Ordering::Relaxed) + 1;
            self.cut |= self.cut_after_keepalives == Some(sent);
            return Ok(());
        }
        self.cut = self.cut_after_fin && matches!(msg, Message::Fin(_));
        Ok(())
    }

    fn wait(&mut self, until: Until<'_>) -> Result<(), XferError> {
        loop {
            self.pull()?;
            if !self.ready.is_empty() {
                return Ok(());
            }
            if self.cut {
                return Err(XferError::PeerLost(format!(
                    "the peer disconnected while we waited for {}",
                    until.what
                )));
            }
            let Some(&(at, _)) = self.held.front() else {
                return self.end.wait(until);
            };
            let now = Instant::now();
            if now >= until.deadline {
                return Err((until.expired)());
            }
            std::thread::sleep(at.min(until.deadline).saturating_duration_since(now));
        }
    }

    fn poll(&mut self) -> Result<(), XferError> {
        self.end.poll()
    }

    fn install(&mut self, channel: Channel) {
        self.end.install(channel);
    }

    fn check_sends(&self, limit: Duration) -> Result<(), XferError> {
        self.end.check_sends(limit)
    }

    fn busy(&self) -> bool {
        self.end.busy()
    }

    fn drain(&mut self) {
        self.end.drain();
    }

    fn disconnect(&mut self, within: Duration) {
        self.end.disconnect(within);
    }
}

impl WriteLink for Meddled {
    fn post_write(
        &mut self,
        pool: &BufferPool,
        buf: Buffer,
        write: crate::engine::link::ChunkWrite,
    ) -> Result<(), SysError> {
        self.end.post_write(pool, buf, write)?;
        self.writes += 1;
        if let Some((_, msg)) = self.inject.take_if(|(after, _)| *after == self.writes) {
            self.ready.push_back(WriteDelivery::Message(Ok(msg)));
        }
        Ok(())
    }

    fn next(&mut self) -> Result<Option<WriteDelivery>, XferError> {
        self.pull()?;
        Ok(self.ready.pop_front())
    }
}

/// A tree of files of 0 bytes to a few chunks, and one more level.
pub(super) fn tree(root: &Path) -> Vec<(String, Vec<u8>)> {
    let files = [
        ("t/empty", 0),
        ("t/small", 10),
        ("t/chunk", 4096),
        ("t/sub/big", 4096 * 5 + 17),
        ("t/sub/mid", 5000),
    ];
    files
        .iter()
        .enumerate()
        .map(|(i, &(name, len))| {
            let data: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
            let path = root.join(name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &data).unwrap();
            (name.to_string(), data)
        })
        .collect()
}

/// Each file of `files` is in `dest` with its bytes.
pub(super) fn assert_arrived(dest: &Path, files: &[(String, Vec<u8>)]) {
    for (name, data) in files {
        assert_eq!(&std::fs::read(dest.join(name)).unwrap(), data, "{name}");
    }
}

fn names(reports: &[Reported]) -> Vec<String> {
    let mut names: Vec<String> = reports
        .iter()
        .map(|r| match r {
            Reported::Done { name, .. } | Reported::Failed { name, .. } => name.clone(),
        })
        .collect();
    names.sort();
    names
}

#[test]
fn a_tree_arrives_whole_and_both_sides_report_each_file() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (cfg, rcfg) = configs(dest.path());
    let t = transfer(&cfg, &rcfg, &[src.path().join("t")], None);
    let outcome = t.sent.unwrap();
    t.received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_eq!(outcome.files.len(), files.len());
    assert_eq!(outcome.directories, 2);
    assert_arrived(dest.path(), &files);
    let mut expected: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    expected.sort();
    assert_eq!(names(&t.sender_saw), expected);
    assert_eq!(names(&t.receiver_saw), expected);
}

#[test]
fn a_bandwidth_limit_paces_the_chunks() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..256 * 1024u32)
        .map(|i| (i * 7 + i / 251) as u8)
        .collect();
    let input = src.path().join("paced.bin");
    std::fs::write(&input, &data).unwrap();
    let (mut cfg, rcfg) = configs(dest.path());
    // 64 chunks of 4 KiB at 1 MiB/s: the first goes at once, then one
    // every 3.9 ms.
    cfg.bwlimit = Some(1 << 20);
    let started = Instant::now();
    let t = transfer(&cfg, &rcfg, &[input], None);
    let took = started.elapsed();
    assert!(t.sent.unwrap().first_error.is_none());
    assert_arrived(dest.path(), &[("paced.bin".into(), data)]);
    let least = Duration::from_secs_f64(63.0 * 4096.0 / f64::from(1u32 << 20));
    assert!(took >= least, "{took:?} < {least:?}");
}

#[test]
fn with_a_token_and_sha256_everything_is_sealed_tagged_and_verified() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (mut cfg, mut rcfg) = configs(dest.path());
    let token = Token::new(b"engine-test".to_vec()).unwrap();
    (cfg.token, rcfg.token) = (Some(token.clone()), Some(token));
    cfg.verify = DigestAlg::Sha256;
    let t = transfer(&cfg, &rcfg, &[src.path().join("t")], None);
    t.sent.unwrap();
    t.received.unwrap();
    assert_arrived(dest.path(), &files);
}

#[test]
fn a_second_run_with_resume_sends_nothing_again() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (mut cfg, rcfg) = configs(dest.path());
    cfg.resume = true;
    cfg.walk.times = true;
    transfer(&cfg, &rcfg, &[src.path().join("t")], None)
        .sent
        .unwrap();
    let again = transfer(&cfg, &rcfg, &[src.path().join("t")], None);
    let outcome = again.sent.unwrap();
    again.received.unwrap();
    assert_eq!(outcome.count(Outcome::Unchanged), files.len());
    assert_arrived(dest.path(), &files);
}

#[test]
fn a_file_the_receiver_refuses_fails_alone() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    tree(src.path());
    std::fs::create_dir_all(dest.path().join("t")).unwrap();
    std::fs::write(dest.path().join("t/small"), b"already here").unwrap();
    let (cfg, rcfg) = configs(dest.path());
    let t = transfer(&cfg, &rcfg, &[src.path().join("t")], None);
    let outcome = t.sent.unwrap();
    assert!(
        matches!(&outcome.first_error, Some(XferError::Rejected { .. })),
        "{:?}",
        outcome.first_error
    );
    assert_eq!(outcome.files.len(), 4);
    let failed: Vec<_> = t
        .sender_saw
        .iter()
        .filter(|r| matches!(r, Reported::Failed { .. }))
        .collect();
    assert!(
        matches!(&failed[..], [Reported::Failed { name, reason }] if name == "t/small" && reason.contains("exists")),
        "{failed:?}"
    );
    assert_eq!(
        std::fs::read(dest.path().join("t/small")).unwrap(),
        b"already here"
    );
}

#[test]
fn a_chunk_corrupted_on_the_way_is_caught_and_nothing_of_it_stays() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..4096 * 4).map(|b| (b % 251) as u8).collect();
    std::fs::write(src.path().join("f"), &data).unwrap();
    let (cfg, rcfg) = configs(dest.path());
    let t = transfer(&cfg, &rcfg, &[src.path().join("f")], Some(2));
    // The sender hears it as the file's verdict, or as the session's end
    // if that comes first.
    let failure = match &t.sent {
        Ok(outcome) => outcome.first_error.as_ref(),
        Err(e) => Some(e),
    };
    assert!(
        matches!(failure, Some(XferError::Integrity(m)) if m.contains("chunk 2 of f")),
        "{failure:?}"
    );
    assert!(matches!(&t.sender_saw[..], [Reported::Failed { name, .. }] if name == "f"));
    assert!(matches!(t.received, Err(XferError::Integrity(_))));
    assert!(matches!(&t.receiver_saw[..], [Reported::Failed { name, .. }] if name == "f"));
    let left: Vec<_> = std::fs::read_dir(dest.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn a_connection_broken_mid_file_keeps_the_verified_part_and_resume_continues_it() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..4096 * 6).map(|b| (b % 253) as u8).collect();
    std::fs::write(src.path().join("f"), &data).unwrap();
    let (mut cfg, rcfg) = configs(dest.path());
    cfg.resume = true;
    cfg.walk.times = true;
    // Three chunks land, the fourth write finds the connection gone.
    let mut broken = memory_wire::pair();
    broken.0.side.break_at_write = Some(3);
    let t = transfer_over(&cfg, &rcfg, &[src.path().join("f")], broken);
    assert!(
        matches!(t.sent, Err(XferError::PeerLost(_))),
        "{:?}",
        t.sent.as_ref().map(|_| ())
    );
    assert!(matches!(t.received, Err(XferError::PeerLost(_))));
    assert!(matches!(&t.receiver_saw[..], [Reported::Failed { name, .. }] if name == "f"));
    assert!(!dest.path().join("f").exists());
    // The next run sends only what is missing.
    let again = transfer(&cfg, &rcfg, &[src.path().join("f")], None);
    let outcome = again.sent.unwrap();
    again.received.unwrap();
    assert_eq!(outcome.files.len(), 1);
    assert_eq!(outcome.files[0].resumed_from, 3 * 4096);
    assert_eq!(std::fs::read(dest.path().join("f")).unwrap(), data);
}

#[test]
fn a_receiver_that_answers_late_is_waited_for_while_the_reader_reads_ahead() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (mut cfg, rcfg) = configs(dest.path());
    cfg.walk.times = true;
    let late_mr = |m: &Message| matches!(m, Message::Mr(_));
    // Its MR comes late: the batch after the first file is read ahead
    // meanwhile (more chunks than staging slots: the reader waits for
    // slots when the MR comes).
    let (s, r) = memory_wire::pair();
    let mut meddled = Meddled::new(s);
    meddled.late = Some((late_mr, Duration::from_millis(150)));
    let t = transfer_meddled(&cfg, &rcfg, &[src.path().join("t")], Box::new(meddled), r);
    let outcome = t.sent.unwrap();
    t.received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_eq!(outcome.files.len(), files.len());
    assert_arrived(dest.path(), &files);
    // Again with --resume: each HAVE and each COMPARE's ACK comes late.
    cfg.resume = true;
    let late_answer = |m: &Message| matches!(m, Message::Have(_) | Message::Ack(_));
    let (s, r) = memory_wire::pair();
    let mut meddled = Meddled::new(s);
    meddled.late = Some((late_answer, Duration::from_millis(100)));
    let again = transfer_meddled(&cfg, &rcfg, &[src.path().join("t")], Box::new(meddled), r);
    let outcome = again.sent.unwrap();
    again.received.unwrap();
    assert_eq!(outcome.count(Outcome::Unchanged), files.len());
    let mut expected: Vec<String> = files.iter().map(|(n, _)| n.clone()).collect();
    expected.sort();
    assert_eq!(names(&again.sender_saw), expected);
}

#[test]
fn a_reject_while_chunks_are_in_flight_ends_the_session_and_fails_the_file() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..4096 * 6).map(|b| (b % 241) as u8).collect();
    std::fs::write(src.path().join("f"), &data).unwrap();
    let (cfg, rcfg) = configs(dest.path());
    let (s, r) = memory_wire::pair();
    let mut meddled = Meddled::new(s);
    let reject = Reject::new(RejectCode::Protocol, "the test says no");
    meddled.inject = Some((2, Message::Reject(reject)));
    let t = transfer_meddled(&cfg, &rcfg, &[src.path().join("f")], Box::new(meddled), r);
    assert!(
        matches!(&t.sent, Err(XferError::Protocol { source, .. })
            if source.to_string().contains("the test says no")),
        "{:?}",
        t.sent.as_ref().map(|_| ())
    );
    assert!(
        matches!(&t.sender_saw[..], [Reported::Failed { name, reason }]
            if name == "f" && reason.contains("the test says no")),
        "{:?}",
        t.sender_saw
    );
    assert!(t.received.is_err());
    assert!(!dest.path().join("f").exists());
}

#[test]
fn a_connection_broken_while_waiting_for_a_verdict_fails_the_files_that_wait() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..4096 * 2 + 5).map(|b| (b % 239) as u8).collect();
    std::fs::write(src.path().join("f"), &data).unwrap();
    let (cfg, rcfg) = configs(dest.path());
    let (s, r) = memory_wire::pair();
    let mut meddled = Meddled::new(s);
    meddled.cut_after_fin = true;
    let t = transfer_meddled(&cfg, &rcfg, &[src.path().join("f")], Box::new(meddled), r);
    assert!(
        matches!(&t.sent, Err(XferError::PeerLost(m)) if m.contains("the receiver's ACK")),
        "{:?}",
        t.sent.as_ref().map(|_| ())
    );
    // Sent whole, never answered: failed, the session having ended.
    assert!(
        matches!(&t.sender_saw[..], [Reported::Failed { name, .. }] if name == "f"),
        "{:?}",
        t.sender_saw
    );
}

#[test]
fn a_receiver_silent_for_the_timeout_ends_the_session_saying_what_was_awaited() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(src.path().join("f"), b"some bytes").unwrap();
    let (mut cfg, rcfg) = configs(dest.path());
    cfg.timeout = Duration::from_secs(1);
    let (s, r) = memory_wire::pair();
    let mut meddled = Meddled::new(s);
    let mr = |m: &Message| matches!(m, Message::Mr(_));
    meddled.late = Some((mr, Duration::from_secs(3)));
    let t = transfer_meddled(&cfg, &rcfg, &[src.path().join("f")], Box::new(meddled), r);
    let Err(e) = &t.sent else {
        panic!("the session went on");
    };
    assert!(e.is_transient(), "{e:?}");
    assert_eq!(
        e.to_string(),
        XferError::PeerLost("no progress for 1s while waiting for the receiver's MR reply".into())
            .to_string()
    );
    assert!(
        matches!(&t.sender_saw[..], [Reported::Failed { name, .. }] if name == "f"),
        "{:?}",
        t.sender_saw
    );
}
