//! Re-runs on real RDMA: what the receiver has under a name decides first.
//! A file of the same size and modification time is unchanged (nothing
//! sent, nothing written); a changed one is refused without --overwrite;
//! -c decides by content, --ignore-existing and --update keep the
//! receiver's file (docs/protocol.md#what-is-under-the-name-re-runs).

use crate::support::*;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The `--json` records of files on the sender's stdout.
fn file_records(run: &Finished) -> Vec<serde_json::Value> {
    json_lines("sender", &run.stdout)
        .into_iter()
        .filter(|v| v["event"] == "file")
        .collect()
}

/// The sender's `--json` summary.
fn summary(run: &Finished) -> serde_json::Value {
    json_lines("sender", &run.stdout)
        .into_iter()
        .find(|v| v["event"] == "summary")
        .unwrap_or_else(|| panic!("no summary:\n{}", run.transcript()))
}

/// The one record of a run that sent one file.
fn only_record(run: &Finished) -> serde_json::Value {
    let records = file_records(run);
    assert_eq!(records.len(), 1, "{}", run.transcript());
    records.into_iter().next().unwrap_or_default()
}

/// Sets `path`'s modification time.
fn set_mtime(path: &Path, when: SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .and_then(|f| f.set_modified(when))
        .unwrap_or_else(|e| panic!("cannot set the mtime of {}: {e}", path.display()));
}

fn mtime(path: &Path) -> SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

/// What shows a rewrite: inode, size, modification time (seconds and
/// nanoseconds), change time.
fn identity(path: &Path) -> (u64, u64, i64, i64, i64) {
    let m =
        std::fs::metadata(path).unwrap_or_else(|e| panic!("cannot stat {}: {e}", path.display()));
    (m.ino(), m.len(), m.mtime(), m.mtime_nsec(), m.ctime_nsec())
}

/// A tree of 20 files in three levels of directories under `root`: most
/// small (batched), every fifth larger than a batch member (offered alone).
/// Returns their relative paths.
fn make_tree(root: &Path) -> Vec<String> {
    (0..20u64)
        .map(|i| {
            let rel = format!("d{}/e{}/f{i:02}", i % 3, i % 2);
            let path = root.join(&rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            let size = if i % 5 == 0 { 100_000 + i } else { i * 1_001 };
            make_file(&path, size, 700 + 2 * i);
            rel
        })
        .collect()
}

#[test]
fn a_tree_sent_again_is_unchanged_and_nothing_is_rewritten() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tree = src.path().join("t");
    let names = make_tree(&tree);
    let port = next_port();
    let _receiver = start_receiver(&net, port, dst.path(), &[]);
    let send =
        |extra: &[&str]| run_sender(&net, port, Path_::Wire, std::slice::from_ref(&tree), extra);

    let first = send(&["-r", "--json"]);
    assert_eq!(first.code(), 0, "{}", first.transcript());
    let records = file_records(&first);
    assert_eq!(records.len(), names.len(), "{}", first.stdout);
    assert!(
        records.iter().all(|r| r["outcome"] == "stored"),
        "{records:?}"
    );
    // Modification times travel (without -p): a re-run finds them.
    let before: Vec<_> = names
        .iter()
        .map(|n| {
            let got = dst.path().join("t").join(n);
            assert_eq!(mtime(&got), mtime(&tree.join(n)), "{n}");
            identity(&got)
        })
        .collect();

    let again = send(&["-r", "--json"]);
    assert_eq!(again.code(), 0, "{}", again.transcript());
    let records = file_records(&again);
    let mut told: Vec<String> = records
        .iter()
        .map(|r| r["name"].as_str().unwrap_or_default().to_string())
        .collect();
    told.sort();
    let mut want: Vec<String> = names.iter().map(|n| format!("t/{n}")).collect();
    want.sort();
    assert_eq!(told, want);
    for r in &records {
        assert_eq!(r["outcome"], "unchanged", "{r}");
        assert_eq!(r["skipped"], true, "{r}");
        assert_eq!(r["status"], "ok", "{r}");
        // Nothing was read on either side.
        assert!(r["digest"].is_null(), "{r}");
    }
    let total = summary(&again);
    assert_eq!(total["unchanged"], names.len(), "{total}");
    assert_eq!(total["sent"], 0, "{total}");
    let after: Vec<_> = names
        .iter()
        .map(|n| identity(&dst.path().join("t").join(n)))
        .collect();
    assert_eq!(before, after, "a file was rewritten");

    // The text lines say so too.
    let text = send(&["-r"]);
    assert_eq!(text.code(), 0, "{}", text.transcript());
    for n in &names {
        let line = text
            .stderr
            .lines()
            .find(|l| l.starts_with(&format!("t/{n}: ")))
            .unwrap_or_else(|| panic!("no line for t/{n}:\n{}", text.stderr));
        assert!(
            line.contains(
                "unchanged: the receiver has it with the same size and modification time"
            ),
            "{line}"
        );
    }
    // A receiver with --overwrite (which needs a token) leaves them as
    // they are too: small files are not replaced in a batch.
    let token = token_args();
    let port = next_port();
    let mut extra = vec!["--overwrite"];
    extra.extend(token);
    let _overwriting = start_receiver(&net, port, dst.path(), &extra);
    let mut args = vec!["-r", "--json"];
    args.extend(token);
    let again = run_sender(&net, port, Path_::Wire, std::slice::from_ref(&tree), &args);
    assert_eq!(again.code(), 0, "{}", again.transcript());
    let records = file_records(&again);
    assert_eq!(records.len(), names.len(), "{}", again.stdout);
    assert!(
        records.iter().all(|r| r["outcome"] == "unchanged"),
        "{records:?}"
    );
    let after: Vec<_> = names
        .iter()
        .map(|n| identity(&dst.path().join("t").join(n)))
        .collect();
    assert_eq!(before, after, "a file was rewritten under --overwrite");
    for n in &names {
        assert_eq!(
            sha256_file(&dst.path().join("t").join(n)),
            sha256_file(&tree.join(n)),
            "{n}"
        );
    }
    assert_no_temp_files(dst.path());
}

#[test]
fn a_changed_file_is_refused_naming_overwrite_and_replaced_with_it() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("ckpt.bin");
    let old = make_file(&file, 200_000, 10);
    let got = dst.path().join("ckpt.bin");
    let files = [file.clone()];
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let sent = run_sender(&net, port, Path_::Wire, &files, &[]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());

    // The same size, other content, a later modification time.
    let new = make_file(&file, 200_000, 20);
    assert_ne!(new, old);
    set_mtime(
        &file,
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000),
    );
    let sent = run_sender(&net, port, Path_::Wire, &files, &[]);
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(
        sent.stderr
            .contains("ckpt.bin already exists on the receiver and differs")
            && sent.stderr.contains("--overwrite"),
        "{}",
        sent.stderr
    );
    assert_eq!(sha256_file(&got), old);
    drop(receiver);

    // A receiver with --overwrite (which needs a token) replaces it.
    let token = token_args();
    let port = next_port();
    let mut extra = vec!["--overwrite"];
    extra.extend(token);
    let _receiver = start_receiver(&net, port, dst.path(), &extra);
    let sent = run_sender(&net, port, Path_::Wire, &files, &token);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(sha256_file(&got), new);
    assert_eq!(mtime(&got), mtime(&file));
    // And leaves it as it is the next time.
    let before = identity(&got);
    let mut json = vec!["--json"];
    json.extend(token);
    let sent = run_sender(&net, port, Path_::Wire, &files, &json);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(only_record(&sent)["outcome"], "unchanged");
    assert_eq!(identity(&got), before);
    assert_no_temp_files(dst.path());
}

#[test]
fn checksum_decides_by_content_where_the_times_differ_or_agree() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("data.bin");
    let sum = make_file(&file, 100_000, 30);
    let got = dst.path().join("data.bin");
    let files = [file.clone()];
    let port = next_port();
    let _receiver = start_receiver(&net, port, dst.path(), &[]);
    let sent = run_sender(&net, port, Path_::Wire, &files, &[]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());

    // Only the modification time changes: by time it differs (refused),
    // by content (-c) it is unchanged.
    set_mtime(&file, mtime(&file) + Duration::from_secs(3600));
    let sent = run_sender(&net, port, Path_::Wire, &files, &[]);
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(sent.stderr.contains("already exists"), "{}", sent.stderr);
    let before = identity(&got);
    let sent = run_sender(&net, port, Path_::Wire, &files, &["-c", "--json"]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let r = only_record(&sent);
    assert_eq!(r["outcome"], "unchanged", "{r}");
    assert_eq!(r["digest_alg"], "sha256", "{r}");
    assert_eq!(r["digest"], sum.as_str(), "{r}");
    let sent = run_sender(&net, port, Path_::Wire, &files, &["-c"]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert!(
        sent.stderr
            .contains("data.bin: 97.7 KiB (100000 bytes), unchanged: the receiver has the same content (sha256 "),
        "{}",
        sent.stderr
    );
    assert_eq!(identity(&got), before);

    // The content changes, the size and time do not: by time it is
    // unchanged (the quick check's blind spot), -c finds the difference.
    make_file(&file, 100_000, 40);
    set_mtime(&file, mtime(&got));
    let sent = run_sender(&net, port, Path_::Wire, &files, &["--json"]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(only_record(&sent)["outcome"], "unchanged");
    let sent = run_sender(&net, port, Path_::Wire, &files, &["-c"]);
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(
        sent.stderr
            .contains("data.bin already exists on the receiver and differs"),
        "{}",
        sent.stderr
    );
    assert_eq!(sha256_file(&got), sum);
    assert_eq!(identity(&got), before);
    assert_no_temp_files(dst.path());
}

#[test]
fn ignore_existing_keeps_a_different_file_and_sends_the_new_one() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let (a, b) = (src.path().join("a.bin"), src.path().join("b.bin"));
    make_file(&a, 150_000, 50);
    let b_sum = make_file(&b, 3_000, 60);
    let theirs = make_file(&dst.path().join("a.bin"), 1_000, 70);
    let before = identity(&dst.path().join("a.bin"));
    let files: Vec<PathBuf> = vec![a, b];
    let port = next_port();
    let _receiver = start_receiver(&net, port, dst.path(), &[]);
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        &files,
        &["--ignore-existing", "--json"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let records = file_records(&sent);
    let outcome = |name: &str| {
        records
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| r["outcome"].clone())
            .unwrap_or_else(|| panic!("no record for {name}:\n{}", sent.stdout))
    };
    assert_eq!(outcome("a.bin"), "kept-existing");
    assert_eq!(outcome("b.bin"), "stored");
    assert_eq!(summary(&sent)["kept"], 1);
    assert_eq!(sha256_file(&dst.path().join("a.bin")), theirs);
    assert_eq!(identity(&dst.path().join("a.bin")), before);
    assert_eq!(sha256_file(&dst.path().join("b.bin")), b_sum);
    // Without it the different file is refused.
    let sent = run_sender(&net, port, Path_::Wire, &files[..1], &[]);
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(
        sent.stderr.contains("a.bin already exists"),
        "{}",
        sent.stderr
    );
}

#[test]
fn update_keeps_a_newer_receiver_copy_and_goes_on_for_an_older_one() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("model.pt");
    make_file(&file, 80_000, 80);
    let got = dst.path().join("model.pt");
    let theirs = make_file(&got, 80_000, 90);
    let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
    set_mtime(&file, t);
    set_mtime(&got, t + Duration::from_secs(60));
    let before = identity(&got);
    let files = [file.clone()];
    let port = next_port();
    let _receiver = start_receiver(&net, port, dst.path(), &[]);
    let sent = run_sender(&net, port, Path_::Wire, &files, &["-u", "--json"]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let r = only_record(&sent);
    assert_eq!(r["outcome"], "kept-newer", "{r}");
    assert_eq!(r["skipped"], true, "{r}");
    assert_eq!(identity(&got), before);
    assert_eq!(sha256_file(&got), theirs);
    let sent = run_sender(&net, port, Path_::Wire, &files, &["--update"]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert!(
        sent.stderr.contains(
            "model.pt: 78.1 KiB (80000 bytes), kept: the receiver's file is newer (--update)"
        ),
        "{}",
        sent.stderr
    );
    // An older receiver copy goes on: refused here (no --overwrite).
    set_mtime(&got, t - Duration::from_secs(60));
    let sent = run_sender(&net, port, Path_::Wire, &files, &["-u"]);
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(
        sent.stderr.contains("model.pt already exists"),
        "{}",
        sent.stderr
    );
    assert_eq!(sha256_file(&got), theirs);
}
