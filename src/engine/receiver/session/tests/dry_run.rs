//! A dry run (`sender --dry-run`): every offer gets the answer a real run
//! would get, without data: would-receive where a real run gets the MR,
//! the same unchanged and refusals; nothing is created.

use super::peer::{bytes, file};
use super::{Reported, config, done, session};
use crate::engine::Outcome;
use crate::proto::{
    AckStatus, FileOffer, Mtime, OfferKind, RejectCode, SenderEvent, SenderSession, Verdict,
};

fn dir(name: &str) -> FileOffer {
    FileOffer {
        kind: OfferKind::Directory,
        size: 0,
        ..file(name, 0)
    }
}

#[test]
fn a_dry_run_answers_as_a_real_run_would_and_writes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let cfg = config(tmp.path());
    let data = bytes(5000, 1);
    let size = data.len() as u64;
    // A real run first: "here" is there with its time.
    let first = session(&cfg, |peer| {
        peer.greet();
        assert_eq!(peer.send_file("here", &data).status, AckStatus::Ok);
        peer.bye();
    });
    first.result.unwrap();
    let ended = session(&cfg, |peer| {
        peer.machine = SenderSession::new(0, None).dry_run();
        peer.greet();
        // A new directory, and a file inside it: would be received.
        peer.machine.start_file(dir("new"), 1).unwrap();
        peer.transmit();
        let SenderEvent::Answered {
            verdict: Verdict::Ack(ack),
            ..
        } = peer.event()
        else {
            panic!("no verdict on the directory");
        };
        assert_eq!(ack.status, AckStatus::Ok);
        let SenderEvent::Settled(ack) = peer.offer(file("new/f", size)) else {
            panic!("not settled");
        };
        assert_eq!(ack.status, AckStatus::WouldReceive);
        // The same file again: unchanged; another time: refused.
        let SenderEvent::Settled(ack) = peer.offer(file("here", size)) else {
            panic!("not settled");
        };
        assert_eq!(ack.status, AckStatus::Unchanged);
        let mut later = file("here", size);
        later.mtime = Some(Mtime {
            secs: 1_800_000_000,
            nanos: 0,
        });
        let SenderEvent::Rejected(rej) = peer.offer(later) else {
            panic!("not refused");
        };
        assert_eq!(rej.code, RejectCode::Exists);
        // Inside a directory that is not there and not offered: refused.
        assert!(matches!(
            peer.offer(file("absent/f", 1)),
            SenderEvent::Rejected(_)
        ));
        peer.bye();
    });
    ended.result.unwrap_err();
    assert_eq!(first.reported, [done("here", size)]);
    let r = &ended.reported;
    assert_eq!(
        r[0],
        Reported::Done {
            name: "here".into(),
            bytes: size,
            outcome: Outcome::Unchanged
        }
    );
    assert!(matches!(&r[1], Reported::Failed { .. }));
    assert!(matches!(&r[2], Reported::Failed { .. }));
    assert_eq!(r.len(), 3);
    // Only the real run's file: no directory, no temporary file.
    assert_eq!(
        super::super::super::storage::tests::entries(tmp.path()),
        ["here"]
    );
}
