//! What is under an offer's name decides first: a re-run is a no-op
//! (unchanged by size and time, or by SHA-256 with --checksum), a
//! different file is refused without --overwrite, and --ignore-existing,
//! --update and --ignore-times do what rsync's do.

use super::peer::{bytes, file};
use super::{Reported, config, done, session};
use crate::engine::Outcome;
use crate::proto::{AckStatus, HaveKind, Mtime, RejectCode, SameCopy, SenderEvent, WhenExisting};

fn left(name: &str, bytes: u64, outcome: Outcome) -> Reported {
    Reported::Done {
        name: name.into(),
        bytes,
        outcome,
    }
}

fn at(secs: i64) -> Option<Mtime> {
    Some(Mtime { secs, nanos: 0 })
}

#[test]
fn a_rerun_is_unchanged_and_a_different_file_is_refused_or_decided_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let data = bytes(4096 + 9, 3);
    let size = data.len() as u64;
    let ended = session(&cfg, |peer| {
        peer.greet();
        assert_eq!(peer.send_file("f", &data).status, AckStatus::Ok);
        // The same size and time: unchanged, nothing sent.
        let SenderEvent::Settled(ack) = peer.offer(file("f", size)) else {
            panic!("not unchanged");
        };
        assert_eq!(ack.status, AckStatus::Unchanged);
        // Another time: refused (no --overwrite).
        let mut later = file("f", size);
        later.mtime = at(1_800_000_000);
        let SenderEvent::Rejected(rej) = peer.offer(later.clone()) else {
            panic!("not refused");
        };
        assert_eq!(rej.code, RejectCode::Exists);
        assert!(rej.reason.contains("--overwrite"), "{}", rej.reason);
        // --checksum: the same content under another time is unchanged.
        later.checksum = true;
        let SenderEvent::Have(have) = peer.offer(later.clone()) else {
            panic!("not compared");
        };
        assert_eq!(have.kind, HaveKind::Complete);
        use sha2::Digest as _;
        peer.machine
            .compare(sha2::Sha256::digest(&data).into())
            .unwrap();
        peer.transmit();
        assert!(matches!(
            peer.event(),
            SenderEvent::Same {
                copy: SameCopy::Kept,
                ..
            }
        ));
        // Without --overwrite the copy keeps its own time: by size and
        // time alone it still differs.
        later.checksum = false;
        assert!(matches!(
            peer.offer(later.clone()),
            SenderEvent::Rejected(_)
        ));
        // --ignore-times: the same size and time goes on (and is refused).
        let mut again = file("f", size);
        again.existing = WhenExisting::IgnoreTimes;
        assert!(matches!(peer.offer(again), SenderEvent::Rejected(_)));
        // --ignore-existing: whatever is there stays.
        let mut other = file("f", 5);
        other.existing = WhenExisting::IgnoreExisting;
        let SenderEvent::Settled(ack) = peer.offer(other) else {
            panic!("not kept");
        };
        assert_eq!(ack.status, AckStatus::KeptExisting);
        // --update: a newer file there stays; an older one does not.
        let mut older = file("f", 5);
        older.existing = WhenExisting::Update;
        older.mtime = at(1_600_000_000);
        let SenderEvent::Settled(ack) = peer.offer(older.clone()) else {
            panic!("not kept");
        };
        assert_eq!(ack.status, AckStatus::KeptNewer);
        older.mtime = at(1_800_000_000);
        assert!(matches!(peer.offer(older), SenderEvent::Rejected(_)));
        peer.bye();
    });
    ended.result.unwrap_err();
    let r = &ended.reported;
    assert_eq!(r[0], done("f", size));
    assert_eq!(r[1], left("f", size, Outcome::Unchanged));
    assert!(matches!(&r[2], Reported::Failed { .. }));
    assert_eq!(r[3], left("f", size, Outcome::Unchanged));
    assert!(matches!(&r[4], Reported::Failed { .. }));
    assert!(matches!(&r[5], Reported::Failed { .. }));
    assert_eq!(r[6], left("f", 5, Outcome::KeptExisting));
    assert_eq!(r[7], left("f", 5, Outcome::KeptNewer));
    assert!(matches!(&r[8], Reported::Failed { .. }));
    assert_eq!(r.len(), 9);
    // The file was never touched after the first run.
    assert_eq!(std::fs::read(dir.path().join("f")).unwrap(), data);
}

#[test]
fn with_overwrite_a_batch_with_a_file_there_comes_one_by_one_and_stays() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.overwrite = true;
    let data = bytes(100, 5);
    let ended = session(&cfg, |peer| {
        peer.greet();
        assert_eq!(peer.send_file("a", &data).status, AckStatus::Ok);
        let before = std::fs::metadata(dir.path().join("a")).unwrap();
        // Re-run: a batch of the same "a" and a new "b" is refused whole
        // (not replacing "a" without its verdict).
        let mut a = file("a", 100);
        a.digest = peer.digest;
        let mut b = file("b", 7);
        b.digest = peer.digest;
        peer.machine.start_batch(vec![a.clone(), b], 0).unwrap();
        peer.transmit();
        let SenderEvent::Rejected(rej) = peer.event() else {
            panic!("batch not refused");
        };
        assert_eq!(rej.code, RejectCode::Exists);
        // Alone, "a" is unchanged, and "b" is stored.
        let SenderEvent::Settled(ack) = peer.offer(a) else {
            panic!("not unchanged");
        };
        assert_eq!(ack.status, AckStatus::Unchanged);
        assert_eq!(peer.send_file("b", &bytes(7, 6)).status, AckStatus::Ok);
        peer.bye();
        before
    });
    ended.result.unwrap();
    let r = &ended.reported;
    assert_eq!(r[0], done("a", 100));
    assert_eq!(r[1], left("a", 100, Outcome::Unchanged));
    assert_eq!(r[2], done("b", 7));
    assert_eq!(r.len(), 3);
    use std::os::unix::fs::MetadataExt;
    let after = std::fs::metadata(dir.path().join("a")).unwrap();
    assert_eq!(
        (after.ino(), after.ctime(), after.ctime_nsec()),
        (
            ended.played.ino(),
            ended.played.ctime(),
            ended.played.ctime_nsec()
        )
    );
}

/// With --overwrite, a copy that --checksum finds the same takes the
/// source's time (the next run finds it unchanged by size and time), but
/// only a file of the receiver's own with one link: one linked elsewhere
/// (a --link-dest snapshot) keeps its time.
#[test]
fn with_overwrite_a_same_copy_takes_the_time_unless_it_is_linked_elsewhere() {
    use sha2::Digest as _;
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.overwrite = true;
    let data = bytes(3000, 9);
    let size = data.len() as u64;
    let sha256: [u8; 32] = sha2::Sha256::digest(&data).into();
    for name in ["own", "linked"] {
        std::fs::write(dir.path().join(name), &data).unwrap();
    }
    std::fs::hard_link(dir.path().join("linked"), dir.path().join("snapshot")).unwrap();
    let stamp = |name: &str| std::fs::metadata(dir.path().join(name)).unwrap().mtime();
    let old = stamp("linked");
    let ended = session(&cfg, |peer| {
        peer.greet();
        for name in ["own", "linked"] {
            let mut offer = file(name, size);
            offer.checksum = true;
            let SenderEvent::Have(have) = peer.offer(offer) else {
                panic!("{name} not compared");
            };
            assert_eq!(have.kind, HaveKind::Complete);
            peer.machine.compare(sha256).unwrap();
            peer.transmit();
            assert!(matches!(peer.event(), SenderEvent::Same { .. }), "{name}");
        }
        peer.bye();
    });
    ended.result.unwrap();
    assert_eq!(stamp("own"), 1_700_000_000, "the source's time");
    assert_eq!(
        stamp("linked"),
        old,
        "a file linked elsewhere keeps its time"
    );
}
