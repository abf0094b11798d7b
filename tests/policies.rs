//! The receiver's policies on real RDMA (run in the SoftRoCE guest by
//! `make test`): `--discard` verifies and drops, and every check that
//! guards the file store still guards it.

mod support;

use std::path::Path;
use std::time::Duration;
use support::*;

/// Everything under `dir`, as relative paths (directories too), sorted.
fn everything_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = e.path();
            found.push(path.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path);
            }
        }
    }
    found.sort();
    found
}

/// A tree of `files` files (a few bytes to a few chunks, nested three
/// deep) under `root`; returns their relative paths.
fn make_tree(root: &Path, files: u64) -> Vec<String> {
    (0..files)
        .map(|i| {
            let rel = format!("d{}/e{}/f{i:03}", i % 4, i % 3);
            let path = root.join(&rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            // Mostly small (batched), every tenth larger than a chunk.
            let size = if i % 10 == 0 { 2 * CHUNK + i } else { i * 997 };
            make_file(&path, size, 500 + i);
            rel
        })
        .collect()
}

/// The `--json` objects of acknowledged files on a tool's stdout.
fn acknowledged(who: &str, run: &Finished) -> Vec<serde_json::Value> {
    json_lines(who, &run.stdout)
        .into_iter()
        .filter(|v| v["event"] == "file" && v["exit_code"] == 0)
        .collect()
}

#[test]
fn discard_verifies_300_mib_and_a_tree_of_100_files_and_writes_nothing() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let big = src.path().join("big.bin");
    make_file(&big, 300 * MIB, 31);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--discard", "--json"],
        std::slice::from_ref(&big),
        &["--json"],
    );
    assert_both_ok(&sent, &received);
    let files = acknowledged("receiver", &received);
    assert_eq!(files.len(), 1, "{}", received.transcript());
    assert_eq!(files[0]["outcome"], "discarded");
    assert_eq!(files[0]["bytes"], 300 * MIB);
    assert_eq!(everything_under(dst.path()), Vec::<String>::new());
    assert!(
        received.stderr.contains("discarding what arrives"),
        "the listening line says so:\n{}",
        received.stderr
    );

    // A tree: batches of small files, directories, larger files.
    let tree = src.path().join("t");
    let names = make_tree(&tree, 100);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--discard", "-v"],
        std::slice::from_ref(&tree),
        &["-r", "--json"],
    );
    assert_both_ok(&sent, &received);
    assert_eq!(acknowledged("sender", &sent).len(), names.len());
    for n in &names {
        let line = format!("t/{n}: ");
        let said = received
            .stderr
            .lines()
            .find(|l| l.starts_with(&line))
            .unwrap_or_else(|| panic!("no line for t/{n}:\n{}", received.stderr));
        assert!(said.contains(", discarded"), "{said}");
    }
    assert_eq!(everything_under(dst.path()), Vec::<String>::new());
}

#[test]
fn discard_still_fails_a_corrupted_chunk_and_a_wrong_digest_with_exit_5() {
    let Some(net) = rdma_net() else { return };
    let sender = fault_injection_bin("sender");
    let (src, dst) = dirs();
    let input = src.path().join("bitflip.bin");
    make_file(&input, 8 * MIB + 5, 21);
    for (fault, says) in [
        ("corrupt-chunk:3", "chunk 3 of bitflip.bin"),
        (
            "corrupt-digest",
            "whole-file digest mismatch for bitflip.bin",
        ),
    ] {
        let port = next_port();
        let mut receiver = start_receiver(&net, port, dst.path(), &["--discard"]);
        let mut cmd = sender_cmd_with(
            &sender,
            &net,
            port,
            Path_::Wire,
            std::slice::from_ref(&input),
            &[],
        );
        cmd.env("RDMA_XFER_FAULT", fault);
        let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(120));
        assert_eq!(sent.code(), 5, "{fault}: {}", sent.stderr);
        // The receiver logs the failed file after its ACK went out: wait.
        receiver.wait_for_stderr(says, Duration::from_secs(30));
        assert_eq!(everything_under(dst.path()), Vec::<String>::new());
        // It serves on: the next (good) transfer is verified and dropped.
        let sent = run_sender(&net, port, Path_::Wire, std::slice::from_ref(&input), &[]);
        assert_eq!(sent.code(), 0, "{}", sent.stderr);
    }
}
