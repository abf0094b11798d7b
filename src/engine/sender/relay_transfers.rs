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

/// A relay hop's session to the next host: entries handed over one at a
/// time, each answered (`drained`) before the next comes, in one session
/// that closes when the feed hangs up.
#[test]
fn a_fed_session_answers_each_entry_before_the_next_and_closes_on_hang_up() {
    use super::{Connection, Feed, Offers, drive};
    use crate::engine::{entries, memory_wire};
    use crate::sys::rdma::BufferPool;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

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
    let (feed_tx, entries) = mpsc::channel();
    let (drained_tx, drained) = mpsc::channel();
    let offers = Offers {
        plan: entries::Plan {
            entries: Vec::new(),
            problems: Vec::new(),
            skipped: 0,
        },
        feed: Some(Feed {
            entries,
            drained: drained_tx,
        }),
    };
    let (sender_end, receiver_end) = memory_wire::pair();
    let mut done = 0;
    let (sent, received) = std::thread::scope(|s| {
        let receiving =
            s.spawn(|| crate::engine::receiver::serve_over(&rcfg, receiver_end, &|_| {}));
        let feeding = s.spawn(move || {
            for entry in plan.entries {
                let name = entry.name().to_string();
                feed_tx.send(entry).unwrap();
                drained
                    .recv_timeout(Duration::from_secs(20))
                    .unwrap_or_else(|e| panic!("{name} not answered: {e}"));
                // Answered means committed there.
                assert!(at.join(&name).exists(), "{name}");
            }
            // Nothing more: the session closes.
        });
        let (pool, tokens) =
            BufferPool::in_memory(cfg.slot_size() as usize, cfg.depth as usize).unwrap();
        let session = super::connection::session_for(&cfg, None);
        let conn = Connection::new(Duration::ZERO, Box::new(sender_end), session);
        let on_file = |e: crate::engine::FileEvent<'_>| {
            if matches!(e, crate::engine::FileEvent::Done(_)) {
                done += 1;
            }
        };
        let sent = drive(&cfg, offers, conn, &pool, tokens, on_file, Instant::now())
            .map_err(|ended| ended.0.0);
        feeding.join().expect("the feeder panicked");
        (sent, receiving.join().expect("the receiver panicked"))
    });
    let outcome = sent.unwrap();
    received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_arrived(dest.path(), &files);
    // Each file reported once; a session fed for long keeps no reports.
    assert_eq!(done, files.len());
    assert!(outcome.files.is_empty());
    assert_eq!(outcome.directories, dirs);
}
