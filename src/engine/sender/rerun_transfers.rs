//! Re-runs and dry runs through both engines over the memory wire: a tree
//! sent again sends nothing (its files unchanged, batches included), and
//! a dry run says what a real run would do and writes nothing.

use super::memory_transfers::{assert_arrived, configs, transfer, tree};
use crate::engine::Outcome;
use crate::error::XferError;
use crate::proto::RejectCode;

#[test]
fn a_tree_sent_again_is_unchanged_file_by_file() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (cfg, rcfg) = configs(dest.path());
    let paths = [src.path().join("t")];
    transfer(&cfg, &rcfg, &paths, None).sent.unwrap();
    let ino = |name: &str| {
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(dest.path().join(name)).unwrap())
    };
    let before: Vec<u64> = files.iter().map(|(n, _)| ino(n)).collect();
    let again = transfer(&cfg, &rcfg, &paths, None);
    let outcome = again.sent.unwrap();
    again.received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_eq!(outcome.count(Outcome::Unchanged), files.len());
    // Nothing was written again: the same files, not new ones.
    let after: Vec<u64> = files.iter().map(|(n, _)| ino(n)).collect();
    assert_eq!(before, after);
    assert_arrived(dest.path(), &files);
}

#[test]
fn a_dry_run_says_what_would_happen_and_writes_nothing() {
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let files = tree(src.path());
    let (mut cfg, rcfg) = configs(dest.path());
    let paths = [src.path().join("t")];
    cfg.dry_run = true;
    // Into an empty directory: every file would be sent, nothing is.
    let dry = transfer(&cfg, &rcfg, &paths, None);
    let outcome = dry.sent.unwrap();
    dry.received.unwrap();
    assert!(outcome.first_error.is_none(), "{:?}", outcome.first_error);
    assert_eq!(outcome.count(Outcome::WouldSend), files.len());
    assert_eq!(std::fs::read_dir(dest.path()).unwrap().count(), 0);
    // After a real run: unchanged; a changed file would be refused.
    cfg.dry_run = false;
    transfer(&cfg, &rcfg, &paths, None).sent.unwrap();
    cfg.dry_run = true;
    let changed = src.path().join("t/small");
    std::fs::write(&changed, b"0123456789").unwrap();
    let t = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
    std::fs::File::options()
        .write(true)
        .open(&changed)
        .unwrap()
        .set_modified(t)
        .unwrap();
    let dry = transfer(&cfg, &rcfg, &paths, None);
    let outcome = dry.sent.unwrap();
    assert_eq!(outcome.count(Outcome::Unchanged), files.len() - 1);
    assert!(
        matches!(
            &outcome.first_error,
            Some(XferError::Rejected {
                code: Some(RejectCode::Exists),
                ..
            })
        ),
        "{:?}",
        outcome.first_error
    );
    // The receiver's copy is the first run's.
    assert_arrived(dest.path(), &files);
}
