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

/// The sender's log lines name the session and one file: a file's span
/// is never made inside the one before it (else each line would name
/// every earlier file, and the spans of a tree would all stay alive).
#[test]
fn each_files_log_lines_name_that_file_alone() {
    // tracing caches each call site's interest for the whole process: a
    // site first met by another test's thread, while this test's
    // subscriber is being set up, can stay disabled for it. So the check
    // runs in a process of its own, this test binary run for it alone.
    const ALONE: &str = "RXFER_TEST_LOG_LINES_ALONE";
    if std::env::var_os(ALONE).is_none() {
        let name = "engine::sender::rerun_transfers::each_files_log_lines_name_that_file_alone";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env(ALONE, "1")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    use std::sync::{Arc, Mutex};
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Lines {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let (src, dest) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    tree(src.path());
    let (cfg, rcfg) = configs(dest.path());
    let paths = [src.path().join("t")];
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // A first run and a re-run: sent files and files settled without data.
    tracing::subscriber::with_default(subscriber, || {
        transfer(&cfg, &rcfg, &paths, None).sent.unwrap();
        transfer(&cfg, &rcfg, &paths, None).sent.unwrap();
    });
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let mut named = std::collections::BTreeSet::new();
    for line in text.lines() {
        assert!(line.matches("file{").count() <= 1, "{line}");
        if let Some(at) = line.find("file{file=") {
            named.insert(
                line[at..]
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
        }
    }
    // Lines of several files were seen (the test is not vacuous).
    assert!(named.len() >= 3, "{named:?}\n{text}");
}
