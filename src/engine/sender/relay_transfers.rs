//! Relay chains over the memory wire: the sender engine against the
//! receiver engine's session as a host of a chain. As the last host it
//! answers every entry with its own RESULT before the verdict, and the
//! sender reports each file for that host; with a next host it cannot
//! reach (no RDMA here, or nothing listening), it keeps its own copy and
//! reports the next host and the one after it failed with the reason.

use super::memory_transfers::{assert_arrived, configs, transfer, tree};
use crate::engine::receiver::Reported;
use crate::engine::report::Outcome;
use crate::error::XferError;
use crate::proto::{RejectCode, Token};

fn with_token(
    dest: &std::path::Path,
    chain: &[&str],
) -> (super::SenderConfig, crate::engine::receiver::ReceiverConfig) {
    let (mut cfg, mut rcfg) = configs(dest);
    let token = Token::new(b"relay-test-token".to_vec()).unwrap();
    (cfg.token, rcfg.token) = (Some(token.clone()), Some(token));
    rcfg.relay = true;
    cfg.verify = crate::proto::DigestAlg::Sha256;
    cfg.relay = chain.iter().map(|h| h.to_string()).collect();
    (cfg, rcfg)
}

#[test]
fn the_last_host_of_a_chain_reports_each_file_as_its_own() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (cfg, rcfg) = with_token(dest.path(), &["last.example:7471"]);
    let t = transfer(&cfg, &rcfg, &[src.path().join("t")], None);
    let outcome = t.sent.unwrap();
    t.received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_arrived(dest.path(), &files);
    // One report per file, each for the host, none without it.
    assert_eq!(t.sender_saw.len(), files.len(), "{:?}", t.sender_saw);
    assert!(
        t.sender_hosts
            .iter()
            .all(|h| h.as_deref() == Some("last.example:7471")),
        "{:?}",
        t.sender_hosts
    );
    assert!(
        t.sender_saw.iter().all(|r| matches!(
            r,
            Reported::Done {
                outcome: Outcome::Stored,
                ..
            }
        )),
        "{:?}",
        t.sender_saw
    );
    // Sent again: each file unchanged at that host.
    let again = transfer(&cfg, &rcfg, &[src.path().join("t")], None);
    again.sent.unwrap();
    assert!(
        again.sender_saw.iter().all(|r| matches!(
            r,
            Reported::Done {
                outcome: Outcome::Unchanged,
                ..
            }
        )),
        "{:?}",
        again.sender_saw
    );
}

#[test]
fn a_refusal_at_the_last_host_is_its_result() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(src.path().join("f"), b"the sender's bytes").unwrap();
    std::fs::write(dest.path().join("f"), b"another file").unwrap();
    let (cfg, rcfg) = with_token(dest.path(), &["h1"]);
    let t = transfer(&cfg, &rcfg, &[src.path().join("f")], None);
    let outcome = t.sent.unwrap();
    assert!(
        matches!(
            outcome.first_error,
            Some(XferError::Rejected {
                code: Some(RejectCode::Exists),
                ..
            })
        ),
        "{:?}",
        outcome.first_error
    );
    assert_eq!(t.sender_hosts, [Some("h1".to_string())]);
    assert!(
        matches!(&t.sender_saw[..], [Reported::Failed { name, .. }] if name == "f"),
        "{:?}",
        t.sender_saw
    );
    assert_eq!(
        std::fs::read(dest.path().join("f")).unwrap(),
        b"another file"
    );
}

#[test]
fn a_next_host_that_cannot_be_reached_fails_and_the_first_host_keeps_its_copy() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    std::fs::write(src.path().join("f"), vec![7u8; 10_000]).unwrap();
    // The next host is on this machine's loopback, where no RDMA device
    // answers (or nothing listens): the session to it fails.
    // (Names only this machine resolves: a test makes no lookups.)
    let chain = ["h1", "127.0.0.1:9", "127.0.0.1:10"];
    let (cfg, rcfg) = with_token(dest.path(), &chain);
    let t = transfer(&cfg, &rcfg, &[src.path().join("f")], None);
    let outcome = t.sent.unwrap();
    t.received.unwrap();
    // The first host has its copy.
    assert_eq!(
        std::fs::read(dest.path().join("f")).unwrap(),
        vec![7u8; 10_000]
    );
    let at = |host: &str| {
        t.sender_hosts
            .iter()
            .position(|h| h.as_deref() == Some(host))
            .map(|i| &t.sender_saw[i])
            .unwrap_or_else(|| panic!("no report for {host}: {:?}", t.sender_saw))
    };
    assert!(
        matches!(at("h1"), Reported::Done { .. }),
        "{:?}",
        t.sender_saw
    );
    assert!(
        matches!(at("127.0.0.1:9"), Reported::Failed { .. }),
        "{:?}",
        t.sender_saw
    );
    assert!(
        matches!(at("127.0.0.1:10"), Reported::Failed { .. }),
        "{:?}",
        t.sender_saw
    );
    assert!(outcome.first_error.is_some());
}

/// With RESUME, a host with hosts after it keeps what it verified when
/// its transfer breaks, and continues it on the next run like any
/// receiver (and passes its kept part on first: here the next host
/// cannot be reached, so only this host's copy is checked).
#[test]
fn a_host_with_hosts_after_it_resumes_its_own_copy() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..4096 * 6).map(|b| (b % 249) as u8).collect();
    let path = src.path().join("f");
    std::fs::write(&path, &data).unwrap();
    let (mut cfg, rcfg) = with_token(dest.path(), &["h1", "127.0.0.1:9"]);
    cfg.resume = true;
    cfg.walk.times = true;
    let mut broken = crate::engine::memory_wire::pair();
    broken.0.side.break_at_write = Some(3);
    let t =
        super::memory_transfers::transfer_over(&cfg, &rcfg, std::slice::from_ref(&path), broken);
    assert!(t.sent.is_err());
    assert!(!dest.path().join("f").exists());
    let again = transfer(&cfg, &rcfg, std::slice::from_ref(&path), None);
    let outcome = again.sent.unwrap();
    again.received.unwrap();
    assert_eq!(std::fs::read(dest.path().join("f")).unwrap(), data);
    let first = outcome
        .files
        .iter()
        .find(|f| f.host.as_deref() == Some("h1"));
    assert_eq!(
        first.map(|f| f.resumed_from),
        Some(3 * 4096),
        "{:?}",
        outcome.files
    );
    // The next host could not be reached: its own failure.
    assert!(
        again
            .sender_hosts
            .iter()
            .zip(&again.sender_saw)
            .any(|(h, r)| h.as_deref() == Some("127.0.0.1:9")
                && matches!(r, Reported::Failed { .. })),
        "{:?}",
        again.sender_saw
    );
    // Once more: the first host has it (HAVE of nothing, then the data
    // taken only to pass it on), unchanged.
    let third = transfer(&cfg, &rcfg, std::slice::from_ref(&path), None);
    third.sent.unwrap();
    third.received.unwrap();
    let at_first = third
        .sender_hosts
        .iter()
        .position(|h| h.as_deref() == Some("h1"));
    assert!(
        matches!(
            at_first.map(|i| &third.sender_saw[i]),
            Some(Reported::Done {
                outcome: Outcome::Unchanged,
                ..
            })
        ),
        "{:?}",
        third.sender_saw
    );
    assert_eq!(std::fs::read(dest.path().join("f")).unwrap(), data);
}

/// What a fed session reported of each entry (name, where its data
/// started), and how it and the receiver's session ended.
type Fed = (
    Result<super::SessionOutcome, XferError>,
    Vec<(String, u64, Outcome)>,
    Result<(), XferError>,
);

/// A relay hop's session to the next host over the memory wire: each
/// entry handed over once the one before was answered (`drained`),
/// `after_each` then told its name; the feed hangs up after the last.
fn feed(
    cfg: &super::SenderConfig,
    rcfg: &crate::engine::receiver::ReceiverConfig,
    entries: Vec<crate::engine::entries::Entry>,
    after_each: impl Fn(&str) + Send,
) -> Fed {
    use super::{Connection, Feed, Offers, drive};
    use crate::engine::{entries, memory_wire};
    use crate::sys::rdma::BufferPool;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    let (feed_tx, fed) = mpsc::channel();
    let (drained_tx, drained) = mpsc::channel();
    let offers = Offers {
        plan: entries::Plan {
            entries: Vec::new(),
            problems: Vec::new(),
            skipped: 0,
        },
        feed: Some(Feed {
            entries: fed,
            drained: drained_tx,
            watch: None,
        }),
    };
    let (sender_end, receiver_end) = memory_wire::pair();
    let mut done = Vec::new();
    let (sent, received) = std::thread::scope(|s| {
        let receiving =
            s.spawn(|| crate::engine::receiver::serve_over(rcfg, receiver_end, &|_| {}));
        let feeding = s.spawn(move || {
            for entry in entries {
                let name = entry.name().to_string();
                feed_tx.send(entry).unwrap();
                // Not answered: the session ended (it says why).
                if drained.recv_timeout(Duration::from_secs(20)).is_err() {
                    return;
                }
                after_each(&name);
            }
            // Nothing more: the session closes.
        });
        let (pool, tokens) =
            BufferPool::in_memory(cfg.slot_size() as usize, cfg.depth as usize).unwrap();
        let session = super::connection::session_for(cfg, None);
        let conn = Connection::new(Duration::ZERO, Box::new(sender_end), session);
        let on_file = |e: crate::engine::FileEvent<'_>| {
            if let crate::engine::FileEvent::Done(r) = e {
                done.push((r.name.clone(), r.resumed_from, r.outcome));
            }
        };
        let sent = drive(cfg, offers, conn, &pool, tokens, on_file, Instant::now())
            .map_err(|ended| ended.0.0);
        feeding.join().expect("the feeder panicked");
        (sent, receiving.join().expect("the receiver panicked"))
    });
    (sent, done, received)
}

/// A relay hop's session to the next host: entries handed over one at a
/// time, each answered (`drained`) before the next comes, in one session
/// that closes when the feed hangs up.
#[test]
fn a_fed_session_answers_each_entry_before_the_next_and_closes_on_hang_up() {
    use crate::engine::entries;

    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (cfg, rcfg) = configs(dest.path());
    let plan = entries::plan(&[src.path().join("t")], &cfg.walk).unwrap();
    let dirs = plan
        .entries
        .iter()
        .filter(|e| matches!(e, entries::Entry::Dir { .. }))
        .count() as u64;
    let at = dest.path();
    // Answered means committed there.
    let (sent, done, received) = feed(&cfg, &rcfg, plan.entries, |name| {
        assert!(at.join(name).exists(), "{name}")
    });
    received.unwrap();
    let outcome = sent.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_arrived(dest.path(), &files);
    // Each file reported once; a session fed for long keeps no reports.
    assert_eq!(done.len(), files.len());
    assert!(outcome.files.is_empty());
    assert_eq!(outcome.directories, dirs);
}

/// A relayed file with RESUME: the next host kept `held` chunks (a
/// transfer broken there), the hop kept `kept` chunks of its own (its
/// copy) and passes the rest on through its pipe as it receives them.
/// The next host's kept part is checked against the hop's bytes (its
/// copy, then the pipe) and only the rest is sent.
fn relayed_resume(kept: u64, held: u64) {
    let (data, done, outcome) = relayed_resume_of(kept, held, false);
    let outcome = outcome.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_eq!(done, [("f".to_string(), held * 4096, Outcome::Stored)]);
    assert_eq!(data.1, data.0);
}

/// What `relayed_resume_of` gives: the source's bytes and the next
/// host's copy, the fed session's reports and its end.
type Resumed = (
    (Vec<u8>, Vec<u8>),
    Vec<(String, u64, Outcome)>,
    Result<super::SessionOutcome, XferError>,
);

/// `relayed_resume`'s transfer. With `changed`, the source changed after
/// the next host kept its part (same size and time).
fn relayed_resume_of(kept: u64, held: u64, changed: bool) -> Resumed {
    use crate::engine::entries::{self, Entry};
    use crate::proto::{FileOffer, OfferKind};
    use std::io::Write;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    const CHUNK: u64 = 4096;
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let data: Vec<u8> = (0..CHUNK * 8).map(|b| (b * 7 % 251) as u8).collect();
    let path = src.path().join("f");
    std::fs::write(&path, &data).unwrap();
    let (mut cfg, rcfg) = configs(dest.path());
    cfg.resume = true;
    cfg.walk.times = true;
    // The next host keeps `held` chunks of an earlier transfer.
    let mut broken = crate::engine::memory_wire::pair();
    broken.0.side.break_at_write = Some(held);
    let t =
        super::memory_transfers::transfer_over(&cfg, &rcfg, std::slice::from_ref(&path), broken);
    assert!(t.sent.is_err());
    let mut data = data;
    if changed {
        // Another source of the same size and time.
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        data.iter_mut().for_each(|b| *b = b.wrapping_add(1));
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
    }
    let plan = entries::plan(std::slice::from_ref(&path), &cfg.walk).unwrap();
    let Some(Entry::File { mtime, .. }) = plan.entries.into_iter().next() else {
        panic!("no file planned")
    };
    let offer = FileOffer {
        name: "f".into(),
        size: data.len() as u64,
        mode: 0o644,
        digest: cfg.verify,
        kind: OfferKind::File,
        mtime,
        keep_mode: false,
        resume: true,
        checksum: false,
        existing: Default::default(),
        piece: None,
    };
    // The hop's copy of the kept part, and the pipe with the rest.
    let copy = src.path().join("hop-copy");
    std::fs::write(&copy, &data[..(kept * CHUNK) as usize]).unwrap();
    let (pipe_out, mut pipe_in) = std::io::pipe().unwrap();
    let whole = Arc::new(AtomicBool::new(false));
    let entry = Entry::Relayed {
        offer,
        kept: (kept > 0).then(|| (std::fs::File::open(&copy).unwrap(), kept * CHUNK)),
        pipe: Some(std::fs::File::from(std::os::fd::OwnedFd::from(pipe_out))),
        whole: whole.clone(),
        flowing: Arc::new(AtomicBool::new(false)),
    };
    let rest = data[(kept * CHUNK) as usize..].to_vec();
    let (sent, done, _) = std::thread::scope(|s| {
        // The rest as it arrives: in pieces, the check waiting for them.
        s.spawn(move || {
            for piece in rest.chunks(1500) {
                if pipe_in.write_all(piece).is_err() {
                    return;
                }
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
            whole.store(true, Ordering::SeqCst);
        });
        feed(&cfg, &rcfg, vec![entry], |_| {})
    });
    let arrived = std::fs::read(dest.path().join("f")).unwrap_or_default();
    ((data, arrived), done, sent)
}

/// The next host's kept part differs from the source (changed with the
/// same size and time): checked from the hop's kept part, the file goes
/// whole; checked from the pipe (whose bytes went by), it fails there,
/// nothing of it committed, and the next run starts afresh.
#[test]
fn a_next_hosts_kept_part_that_differs_is_never_continued() {
    let (data, done, outcome) = relayed_resume_of(5, 3, true);
    assert!(outcome.unwrap().first_error.is_none());
    assert_eq!(done, [("f".to_string(), 0, Outcome::Stored)]);
    assert_eq!(data.1, data.0);
    let (data, done, outcome) = relayed_resume_of(1, 3, true);
    assert!(done.is_empty(), "{done:?}");
    assert!(data.1.is_empty(), "committed");
    let failed = match outcome {
        Ok(o) => o.first_error,
        Err(e) => Some(e),
    };
    let why = failed.map(|e| e.to_string()).unwrap_or_default();
    assert!(why.contains("starts afresh"), "{why}");
}

#[test]
fn a_relayed_file_resumes_the_next_host_from_the_hops_kept_part() {
    relayed_resume(5, 3);
}

#[test]
fn a_relayed_file_resumes_the_next_host_past_the_hops_kept_part_from_its_pipe() {
    relayed_resume(1, 3);
    relayed_resume(0, 3);
}
