//! Resume and retry on real RDMA (run in the SoftRoCE guest by `make test`):
//! what a failed transfer leaves with `--resume`, and that a later
//! `sender --resume` sends only what did not arrive, starts over when the
//! source or the kept data changed, skips what is complete, and that
//! `--retry` reconnects by itself after transient failures only.

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use support::*;

/// The receiver's ring with the default options (16 slots of 1 MiB): the
/// most a resumed transfer may send again besides what did not arrive.
const RING: u64 = 16 * CHUNK;

/// The partial files and records kept in `dir` (not below it).
fn kept_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".rdma-xfer-partial-"))
        .collect();
    names.sort();
    names
}

/// The partial file itself (not its record) in `dir`.
fn partial_file(dir: &Path) -> PathBuf {
    let names = kept_files(dir);
    let name = names
        .iter()
        .find(|n| !n.ends_with(".meta"))
        .unwrap_or_else(|| panic!("no partial file in {}: {names:?}", dir.display()));
    dir.join(name)
}

/// The bytes the receiver says it kept when the session failed.
fn kept_bytes(receiver_log: &str) -> u64 {
    let at = receiver_log
        .rfind("kept the ")
        .unwrap_or_else(|| panic!("no `kept the` line in:\n{receiver_log}"));
    receiver_log[at + "kept the ".len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no byte count after `kept the` in:\n{receiver_log}"))
}

/// The sender's `--json` object for the file `name`.
fn file_result(sent: &Finished, name: &str) -> serde_json::Value {
    json_lines("sender", &sent.stdout)
        .into_iter()
        .find(|v| v["event"] == "file" && v["name"] == name)
        .unwrap_or_else(|| panic!("no result for {name} in:\n{}", sent.stdout))
}

/// The sender's final `--json` summary.
fn summary(sent: &Finished) -> serde_json::Value {
    json_lines("sender", &sent.stdout)
        .into_iter()
        .find(|v| v["event"] == "summary")
        .unwrap_or_else(|| panic!("no summary in:\n{}", sent.stdout))
}

/// A sender with `--resume` of `input` killed once the receiver's partial
/// file in `dst` holds `at` bytes; returns when the receiver says what it
/// kept (and how much).
fn kill_sender_at(
    net: &Net,
    port: u16,
    receiver: &mut Running,
    dst: &Path,
    input: &Path,
    at: u64,
) -> u64 {
    let sender = Running::spawn(
        "sender",
        sender_cmd(
            net,
            port,
            Path_::Wire,
            &[input.to_path_buf()],
            &["--resume"],
        ),
    );
    let said_before = receiver.stderr_so_far().matches("kept the ").count();
    wait_for_partial_file(dst, at);
    sender.signal("KILL");
    let _ = sender.wait(Duration::from_secs(30));
    // This session's line, not an earlier one of the same receiver.
    let log = wait_until(
        "the receiver to say what it kept",
        || receiver.stderr_so_far(),
        |log| log.matches("kept the ").count() > said_before,
        Duration::from_secs(30),
    );
    kept_bytes(&log)
}

#[test]
fn a_killed_sender_resumes_after_what_the_receiver_verified() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("big.bin");
    let size = 300 * MIB;
    let sum = make_file(&input, size, 31);
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--timeout", "10"]);
    let kept = kill_sender_at(&net, port, &mut receiver, dst.path(), &input, size * 2 / 5);
    assert!(kept >= size / 4, "kept only {kept} bytes");
    assert!(
        !dst.path().join("big.bin").exists(),
        "kept under the final name"
    );
    assert_eq!(
        kept_files(dst.path()).len(),
        2,
        "the partial and its record"
    );

    let started = Instant::now();
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--resume", "--json"],
    );
    let resumed_took = started.elapsed();
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("big.bin")), sum);
    let result = file_result(&sent, "big.bin");
    let resumed_from = result["resumed_from"].as_u64().expect("resumed_from");
    let moved = size - resumed_from;
    assert!(
        moved <= size - kept + RING,
        "moved {moved} bytes again, {kept} had arrived"
    );
    assert!(sent.stderr.contains("resumed from byte"), "{}", sent.stderr);
    assert!(
        kept_files(dst.path()).is_empty(),
        "{:?}",
        kept_files(dst.path())
    );
    assert_no_temp_files(dst.path());

    // For comparison (the closing note): the whole file in one go.
    std::fs::remove_file(dst.path().join("big.bin")).expect("remove");
    let started = Instant::now();
    let full = run_sender(&net, port, Path_::Wire, &[input], &[]);
    let full_took = started.elapsed();
    assert_eq!(full.code(), 0, "{}", full.stderr);
    eprintln!(
        "RESUME MEASURED: {kept} of {size} bytes kept; the resumed run moved {moved} bytes in \
         {:.2} s, a full transfer took {:.2} s",
        resumed_took.as_secs_f64(),
        full_took.as_secs_f64()
    );
}

#[test]
fn a_restarted_receiver_resumes_from_the_record_on_disk() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("big.bin");
    let size = 300 * MIB;
    let sum = make_file(&input, size, 32);
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let sender = Running::spawn(
        "sender",
        sender_cmd(
            &net,
            port,
            Path_::Wire,
            std::slice::from_ref(&input),
            &["--resume", "--timeout", "10"],
        ),
    );
    wait_for_partial_file(dst.path(), 120 * MIB);
    receiver.signal("KILL");
    let _ = receiver.wait(Duration::from_secs(30));
    let sent = sender.wait(Duration::from_secs(60));
    assert_eq!(sent.code(), 7, "{}", sent.stderr);
    assert_eq!(
        kept_files(dst.path()).len(),
        2,
        "the partial and its record"
    );

    // The killed receiver recorded what it had made durable (every 64
    // chunks): a new one continues from there.
    let port = next_port();
    let again = start_receiver(&net, port, dst.path(), &[]);
    let sent = run_sender(&net, port, Path_::Wire, &[input], &["--resume", "--json"]);
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("big.bin")), sum);
    let resumed_from = file_result(&sent, "big.bin")["resumed_from"]
        .as_u64()
        .expect("resumed_from");
    assert!(
        resumed_from >= 64 * CHUNK,
        "resumed from {resumed_from} after 120 MiB had arrived"
    );
    assert!(kept_files(dst.path()).is_empty());
    drop(again);
}

#[test]
fn a_changed_source_or_damaged_kept_data_start_over_and_never_give_a_wrong_file() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("f.bin");
    let size = 96 * MIB;
    make_file(&input, size, 34);
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--timeout", "10"]);
    let out = dst.path().join("f.bin");

    // Each case: an interrupted transfer, something changed, a resumed one.
    type Change = fn(&Path, &Path);
    let cases: [(&str, Change, &str); 3] = [
        (
            "one byte of the source inside the kept part (same size and mtime)",
            |input, _| {
                let mtime = std::fs::metadata(input).unwrap().modified().unwrap();
                let mut data = std::fs::read(input).unwrap();
                data[CHUNK as usize + 7] ^= 0x5a;
                std::fs::write(input, &data).unwrap();
                let f = std::fs::File::options().write(true).open(input).unwrap();
                f.set_modified(mtime).unwrap();
            },
            "the source changed within",
        ),
        (
            "a damaged record",
            |_, dst| {
                let meta = dst.join(
                    kept_files(dst)
                        .into_iter()
                        .find(|n| n.ends_with(".meta"))
                        .expect("a record"),
                );
                let mut bytes = std::fs::read(&meta).unwrap();
                bytes[12] ^= 1;
                std::fs::write(&meta, bytes).unwrap();
            },
            "damaged",
        ),
        (
            "a partial file cut short by hand",
            |_, dst| {
                let partial = partial_file(dst);
                let f = std::fs::File::options().write(true).open(partial).unwrap();
                f.set_len(CHUNK).unwrap();
            },
            "shorter than its record",
        ),
    ];
    for (what, change, said) in cases {
        let _ = std::fs::remove_file(&out);
        let kept = kill_sender_at(&net, port, &mut receiver, dst.path(), &input, 32 * MIB);
        assert!(kept >= 2 * CHUNK, "{what}: kept {kept}");
        change(&input, dst.path());
        let sent = run_sender(
            &net,
            port,
            Path_::Wire,
            std::slice::from_ref(&input),
            &["--resume", "--json"],
        );
        assert_eq!(sent.code(), 0, "{what}: {}", sent.stderr);
        assert!(
            sent.stderr.contains("starting from zero") && sent.stderr.contains(said),
            "{what}: {}",
            sent.stderr
        );
        assert_eq!(file_result(&sent, "f.bin")["resumed_from"], 0, "{what}");
        assert_eq!(
            sha256_file(&out),
            sha256_file(&input),
            "{what}: not the source"
        );
        assert!(kept_files(dst.path()).is_empty(), "{what}");
    }
}

#[test]
fn an_interrupted_tree_resumed_skips_what_is_complete() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tree = src.path().join("tree");
    let mut sums = Vec::new();
    for i in 0..200u64 {
        let dir = tree.join(format!("d{}", i % 10));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("f{i:03}.bin"));
        sums.push((path.clone(), make_file(&path, MIB + i * 512, 100 + i)));
    }
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--timeout", "10"]);
    let arrived = |dst: &Path| -> usize {
        (0..10)
            .map(|d| {
                std::fs::read_dir(dst.join(format!("tree/d{d}")))
                    .map(|e| {
                        e.filter_map(Result::ok)
                            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
                            .count()
                    })
                    .unwrap_or(0)
            })
            .sum()
    };
    let sender = Running::spawn(
        "sender",
        sender_cmd(
            &net,
            port,
            Path_::Wire,
            std::slice::from_ref(&tree),
            &["--resume", "-r"],
        ),
    );
    wait_until(
        "half of the tree",
        || arrived(dst.path()),
        |&n| n >= 100,
        Duration::from_secs(120),
    );
    sender.signal("KILL");
    let killed = sender.wait(Duration::from_secs(30));
    assert!(killed.status.code().is_none(), "the sender finished first");
    receiver.wait_for_stderr("session failed", Duration::from_secs(30));
    let complete = arrived(dst.path());
    assert!((100..200).contains(&complete), "{complete} files arrived");

    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        &[tree],
        &["--resume", "-r", "--json"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    let s = summary(&sent);
    assert_eq!(s["skipped"], complete as u64, "{s}");
    assert_eq!(s["files"], 200, "{s}");
    assert!(
        sent.stderr.contains(&format!("{complete} skipped")),
        "{}",
        sent.stderr
    );
    for (path, sum) in &sums {
        let rel = path.strip_prefix(src.path()).unwrap();
        assert_eq!(
            &sha256_file(&dst.path().join(rel)),
            sum,
            "{}",
            rel.display()
        );
    }
    for d in 0..10 {
        assert_no_temp_files(&dst.path().join(format!("tree/d{d}")));
    }
}

#[test]
fn retry_reconnects_only_after_transient_failures() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("r.bin");
    make_file(&input, 2 * MIB + 1, 35);

    // Nobody listening: tried again twice (1 s, then 2 s), then exit 3.
    let port = next_port();
    let started = Instant::now();
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--retry=2"],
    );
    assert_eq!(sent.code(), 3, "{}", sent.stderr);
    assert_eq!(
        sent.stderr.matches("connecting again").count(),
        2,
        "{}",
        sent.stderr
    );
    assert!(started.elapsed() >= Duration::from_secs(3));

    // A refusal: exit 4 at once, never retried.
    let receiver = start_receiver(&net, port, dst.path(), &["--max-size", "1M"]);
    let started = Instant::now();
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--retry"],
    );
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert!(!sent.stderr.contains("connecting again"), "{}", sent.stderr);
    assert!(started.elapsed() < Duration::from_secs(10));
    drop(receiver);

    // A session refused (wrong token): exit 4 at once.
    let port = next_port();
    let receiver = start_receiver_env(
        &net,
        port,
        dst.path(),
        &[],
        &[("RDMA_XFER_TOKEN", "the-receivers-token-0123456789")],
    );
    let mut cmd = sender_cmd(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--retry"],
    );
    token_env(&mut cmd, Some("another-token-entirely-0123456789"));
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(60));
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert!(!sent.stderr.contains("connecting again"), "{}", sent.stderr);
    drop(receiver);

    // An integrity failure (a chunk corrupted after its checksum): exit 5
    // at once, never retried.
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let mut cmd = sender_cmd_with(
        &fault_injection_bin("sender"),
        &net,
        port,
        Path_::Wire,
        &[input],
        &["--retry"],
    );
    cmd.env("RDMA_XFER_FAULT", "corrupt-chunk:1");
    let started = Instant::now();
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(60));
    assert_eq!(sent.code(), 5, "{}", sent.stderr);
    assert!(!sent.stderr.contains("connecting again"), "{}", sent.stderr);
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!dst.path().join("r.bin").exists());
    drop(receiver);
}
