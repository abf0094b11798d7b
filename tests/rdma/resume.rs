//! Resume and retry on real RDMA (run in the SoftRoCE guest by `make test`):
//! what a failed transfer leaves with `--resume`, and that a later
//! `sender --resume` sends only what did not arrive, starts over when the
//! source or the kept data changed, skips what is complete, and that
//! `--retry` reconnects by itself after transient failures only.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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

/// A sender with `--resume` (and `extra`) of `input` killed once the
/// receiver's partial file in `dst` holds `at` bytes; returns when the
/// receiver says what it kept (and how much).
fn kill_sender_at(
    net: &Net,
    port: u16,
    receiver: &mut Running,
    dst: &Path,
    (input, at): (&Path, u64),
    extra: &[&str],
) -> u64 {
    let args: Vec<&str> = ["--resume"].iter().chain(extra).copied().collect();
    let sender = Running::spawn(
        "sender",
        SenderCommand::new(net, port, Path_::Wire)
            .files(&[input.to_path_buf()])
            .args(&args)
            .command(),
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
    let kept = kill_sender_at(
        &net,
        port,
        &mut receiver,
        dst.path(),
        (&input, size * 2 / 5),
        &[],
    );
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
    assert!(
        sent.stderr.contains(" sent (resumed from "),
        "{}",
        sent.stderr
    );
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

/// A write that fails in the receiver's writer threads (the fault-injection
/// receiver's `fail-write`) ends the file with an I/O error naming it; with
/// `--resume` the receiver keeps only chunks recorded before the failure
/// (never the failed one nor any written after it by another thread), and a
/// later `sender --resume` completes the file correctly from there.
#[test]
fn a_failed_write_keeps_only_what_came_before_it_and_resumes_from_there() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("w.bin");
    let chunk = 64 * 1024u64;
    let size = 128 * chunk + 777;
    let sum = make_file(&input, size, 77);
    let failed_at = 100 * chunk;
    let port = next_port();
    let bin = fault_injection_bin("receiver");
    let fault = format!("fail-write:{failed_at}");
    let receiver_args = ["--chunk-size", "64K", "--slots", "8", "--threads", "3"];
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .bin(&bin)
        .args(&receiver_args)
        .env(&[("RDMA_XFER_FAULT", fault.as_str())])
        .start();
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--resume"],
    );
    assert_eq!(sent.code(), 6, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("cannot write w.bin"),
        "{}",
        sent.stderr
    );
    let named = format!("at offset {failed_at}");
    assert!(sent.stderr.contains(&named), "{}", sent.stderr);
    let log = wait_until(
        "the receiver to say what it kept and why",
        || receiver.stderr_so_far(),
        |log| log.contains("kept the ") && log.contains(&named),
        Duration::from_secs(30),
    );
    // Records are made durable every 64 chunks (SYNC_EVERY) and, after a
    // failed write, nothing since the last sync is kept: chunks 0-63, never
    // 64-99 (written, not yet synced) nor anything after the failure.
    let kept = kept_bytes(&log);
    assert_eq!(kept, 64 * chunk, "the write at {failed_at} failed");
    assert!(
        !dst.path().join("w.bin").exists(),
        "kept under the final name"
    );
    receiver.signal("TERM");
    drop(receiver);

    // Without the fault: resumed from what was kept, correct to the end.
    let port = next_port();
    let _receiver = start_receiver(&net, port, dst.path(), &receiver_args);
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--resume", "--json"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("w.bin")), sum);
    let result = file_result(&sent, "w.bin");
    assert_eq!(result["resumed_from"].as_u64(), Some(kept), "{result}");
    assert!(kept_files(dst.path()).is_empty());
    assert_no_temp_files(dst.path());
}

/// With a token, a chunk forged on the way (new bytes with their own
/// CRC32: the sender's `forge-chunk` fault) is stopped by its tag before a
/// writer thread (`--threads`) writes it or the resume record counts it:
/// the receiver keeps at most the chunks before it, and a later `sender
/// --resume` completes the file correctly from there.
#[test]
fn with_a_token_a_forged_chunk_is_never_written_nor_kept_for_resuming() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("f.bin");
    let chunk = 64 * 1024u64;
    let size = 128 * chunk + 777;
    let sum = make_file(&input, size, 78);
    let token = "resume-forge-token-0123456789abcdef";
    let env = [("RDMA_XFER_TOKEN", token)];
    let receiver_args = ["--chunk-size", "64K", "--slots", "8", "--threads", "3"];
    let port = next_port();
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .args(&receiver_args)
        .env(&env)
        .start();
    let sender = fault_injection_bin("sender");
    let files = std::slice::from_ref(&input);
    let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
        .bin(&sender)
        .files(files)
        .args(&["--resume"])
        .command();
    token_env(&mut cmd, Some(token));
    cmd.env("RDMA_XFER_FAULT", "forge-chunk:100");
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(120));
    assert_eq!(sent.code(), 5, "{}", sent.stderr);
    let log = wait_until(
        "the receiver to say what it kept",
        || receiver.stderr_so_far(),
        |log| log.contains("kept the ") && log.contains("authentication tag"),
        Duration::from_secs(30),
    );
    assert!(log.contains("chunk 100 of f.bin"), "{log}");
    let kept = kept_bytes(&log);
    assert!(
        kept <= 100 * chunk,
        "kept {kept} bytes: the forged chunk too"
    );
    assert!(!dst.path().join("f.bin").exists());
    receiver.signal("TERM");
    drop(receiver);

    let port = next_port();
    let _receiver = ReceiverCommand::new(&net, port, dst.path())
        .args(&receiver_args)
        .env(&env)
        .start();
    let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
        .files(files)
        .args(&["--resume", "--json"])
        .command();
    token_env(&mut cmd, Some(token));
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(120));
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("f.bin")), sum);
    let result = file_result(&sent, "f.bin");
    assert_eq!(result["resumed_from"].as_u64(), Some(kept), "{result}");
    assert!(kept_files(dst.path()).is_empty());
    assert_no_temp_files(dst.path());
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
        SenderCommand::new(&net, port, Path_::Wire)
            .files(std::slice::from_ref(&input))
            .args(&["--resume", "--timeout", "10"])
            .command(),
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
        let kept = kill_sender_at(
            &net,
            port,
            &mut receiver,
            dst.path(),
            (&input, 32 * MIB),
            &[],
        );
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
        SenderCommand::new(&net, port, Path_::Wire)
            .files(std::slice::from_ref(&tree))
            .args(&["--resume", "-r"])
            .command(),
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
    assert_eq!(s["unchanged"], complete as u64, "{s}");
    assert_eq!(s["files"], 200, "{s}");
    assert!(
        sent.stderr
            .contains(&format!("{complete} unchanged (nothing sent)")),
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

/// A run with `--retry` that must end with `code` at once, not retried.
fn assert_not_retried(sent: &Finished, code: i32, started: Instant) {
    assert_eq!(sent.code(), code, "{}", sent.stderr);
    assert!(!sent.stderr.contains("connecting again"), "{}", sent.stderr);
    assert!(started.elapsed() < Duration::from_secs(10));
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
    assert_not_retried(&sent, 4, started);
    drop(receiver);

    // A session refused (wrong token): exit 4 at once.
    let port = next_port();
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .env(&[("RDMA_XFER_TOKEN", "the-receivers-token-0123456789")])
        .start();
    let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
        .files(std::slice::from_ref(&input))
        .args(&["--retry"])
        .command();
    token_env(&mut cmd, Some("another-token-entirely-0123456789"));
    let started = Instant::now();
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(60));
    assert_not_retried(&sent, 4, started);
    drop(receiver);

    // An integrity failure (a chunk corrupted after its checksum): exit 5
    // at once, never retried.
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
        .bin(&fault_injection_bin("sender"))
        .files(&[input])
        .args(&["--retry"])
        .command();
    cmd.env("RDMA_XFER_FAULT", "corrupt-chunk:1");
    let started = Instant::now();
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(60));
    assert_not_retried(&sent, 5, started);
    assert!(!dst.path().join("r.bin").exists());
    drop(receiver);

    // A session-ending refusal after an entry (a stream over --max-size
    // fails and the receiver ends the session): exit 4, never retried.
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--max-size", "1M"]);
    let script = format!(
        "head -c 3000000 /dev/zero | {}",
        sender_line(
            sender_bin(),
            &net,
            port,
            &["--retry", "--name", "big.stream"],
            &["-"]
        )
    );
    let started = Instant::now();
    let sent = pipeline("sender", &script, 1).wait(Duration::from_secs(60));
    assert_not_retried(&sent, 4, started);
    assert!(sent.stderr.contains("max-size"), "{}", sent.stderr);
    drop(receiver);
}

/// A file cut short, then nothing to reconnect to: once the retries are
/// spent the file is reported failed (not forgotten with its attempt).
#[test]
fn retry_reports_a_file_cut_short_when_no_attempt_is_left() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("cut.bin");
    make_file_undigested(&input, 200 * MIB, 50);
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let sender = Running::spawn(
        "sender",
        SenderCommand::new(&net, port, Path_::Wire)
            .files(std::slice::from_ref(&input))
            .args(&["--retry=1", "--json", "--timeout", "5"])
            .command(),
    );
    wait_for_partial_file(dst.path(), 32 * MIB);
    receiver.signal("KILL");
    let _ = receiver.wait(Duration::from_secs(30));
    let sent = sender.wait(Duration::from_secs(120));
    assert!(
        [3, 7].contains(&sent.code()),
        "lost, then nobody listening: {}",
        sent.stderr
    );
    assert_eq!(
        sent.stderr.matches("connecting again").count(),
        1,
        "{}",
        sent.stderr
    );
    let results: Vec<serde_json::Value> = json_lines("sender", &sent.stdout)
        .into_iter()
        .filter(|v| v["event"] == "file" && v["name"] == "cut.bin")
        .collect();
    assert_eq!(results.len(), 1, "reported once: {}", sent.stdout);
    assert_ne!(results[0]["status"], "ok", "{}", sent.stdout);
    assert!(!dst.path().join("cut.bin").exists());
}

/// A receiver busy at its --max-sessions is worth retrying: the sender
/// reconnects until the session that held it is over.
#[test]
fn retry_waits_for_a_busy_receiver() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("later.bin");
    let sum = make_file(&input, MIB + 3, 36);
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--max-sessions", "1"]);
    // A stream whose input comes only after 6 s holds the one session.
    let script = format!(
        "(sleep 6; echo done) | {}",
        sender_line(sender_bin(), &net, port, &["--name", "held.txt"], &["-"])
    );
    let holder = pipeline("holder", &script, 1);
    // The stream's HELLO came: the one session is held.
    receiver.wait_for_stderr("offer of a stream", Duration::from_secs(60));
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--retry=5"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("busy") && sent.stderr.contains("connecting again"),
        "{}",
        sent.stderr
    );
    assert_eq!(sha256_file(&dst.path().join("later.bin")), sum);
    let held = holder.wait(Duration::from_secs(60));
    assert_eq!(held.code(), 0, "{}", held.stderr);
}

/// Sets the modification time of `path`.
fn set_mtime(path: &Path, t: std::time::SystemTime) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(t)
        .unwrap();
}

/// A copy under the final name with the source's size and modification
/// time is unchanged at once (the quick check, nothing read); with -I it
/// is compared, never disclosed: the same bytes are unchanged, other
/// bytes are sent whole (with --overwrite). A copy with another time is
/// no copy: sent whole, nothing compared. Without --overwrite a differing
/// copy is refused and left as it was.
#[test]
fn a_complete_copy_is_compared_and_skipped_or_replaced() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let size = 5 * MIB + 1;
    let t = std::time::SystemTime::UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    // name -> (source seed, receiver's seed); seeds differ above bit 0
    // (make_file sets it).
    let cases = [
        ("same.bin", 38, 38),
        ("differs.bin", 40, 42),
        ("touched.bin", 44, 44),
    ];
    let mut sums = Vec::new();
    for (name, ours, theirs) in cases {
        sums.push(make_file(&src.path().join(name), size, ours));
        make_file(&dst.path().join(name), size, theirs);
        set_mtime(&src.path().join(name), t);
        // The receiver's copy of touched.bin has another time.
        let at = if name == "touched.bin" {
            t + Duration::from_secs(1)
        } else {
            t
        };
        set_mtime(&dst.path().join(name), at);
    }
    let paths: Vec<PathBuf> = cases.iter().map(|c| src.path().join(c.0)).collect();

    // Without --overwrite: by size and time the same and the differing
    // copy are unchanged (nothing read: no digest); touched.bin is refused.
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let theirs = sha256_file(&dst.path().join("differs.bin"));
    let sent = run_sender(&net, port, Path_::Wire, &paths, &["--resume", "--json"]);
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    for name in ["same.bin", "differs.bin"] {
        let r = file_result(&sent, name);
        assert_eq!(r["outcome"], "unchanged", "{name}: {r}");
        assert!(r["digest"].is_null(), "{name}: {r}");
    }
    assert_eq!(file_result(&sent, "touched.bin")["status"], "rejected");
    // With -I they are compared by content: the same is unchanged, the
    // others are refused and stay as they were.
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        &paths,
        &["--resume", "-I", "--json"],
    );
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert_eq!(file_result(&sent, "same.bin")["skipped"], true);
    assert_eq!(file_result(&sent, "same.bin")["outcome"], "unchanged");
    for name in ["differs.bin", "touched.bin"] {
        assert_eq!(file_result(&sent, name)["status"], "rejected", "{name}");
    }
    assert_eq!(sha256_file(&dst.path().join("differs.bin")), theirs);
    let mtime = |n: &str| {
        std::fs::metadata(dst.path().join(n))
            .unwrap()
            .modified()
            .unwrap()
    };
    assert_eq!(mtime("differs.bin"), t, "untouched");
    drop(receiver);

    // With --overwrite: the others are sent whole.
    let port = next_port();
    let _receiver = start_receiver(
        &net,
        port,
        dst.path(),
        &args(&["--overwrite"], &token_args()),
    );
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        &paths,
        &args(&["--resume", "-I", "--json"], &token_args()),
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(file_result(&sent, "same.bin")["skipped"], true);
    for name in ["differs.bin", "touched.bin"] {
        assert_eq!(file_result(&sent, name)["skipped"], false, "{name}");
    }
    assert_eq!(
        sent.stderr
            .matches("starting from zero: the receiver's copy differs from the source")
            .count(),
        1,
        "compared: differs.bin only: {}",
        sent.stderr
    );
    assert_eq!(summary(&sent)["sent"], 2 * size, "{}", sent.stdout);
    for ((name, _, _), sum) in cases.iter().zip(&sums) {
        assert_eq!(&sha256_file(&dst.path().join(name)), sum, "{name}");
        assert_eq!(mtime(name), t, "{name}");
    }
}

/// A transfer with --overwrite over an older file of the same name,
/// interrupted, continues its kept part: the older file does not hide it.
#[test]
fn an_interrupted_overwrite_resumes_its_kept_part() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("img.bin");
    let size = 96 * MIB;
    let sum = make_file(&input, size, 46);
    make_file(&dst.path().join("img.bin"), 10 * MIB, 48);
    let port = next_port();
    let receiver_extra = args(&["--overwrite", "--timeout", "10"], &token_args());
    let mut receiver = start_receiver(&net, port, dst.path(), &receiver_extra);
    let kept = kill_sender_at(
        &net,
        port,
        &mut receiver,
        dst.path(),
        (&input, 32 * MIB),
        &token_args(),
    );
    assert!(kept >= 2 * CHUNK, "kept {kept}");
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &args(&["--resume", "--json"], &token_args()),
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    let resumed_from = file_result(&sent, "img.bin")["resumed_from"]
        .as_u64()
        .expect("resumed_from");
    assert!(resumed_from >= 2 * CHUNK, "resumed from {resumed_from}");
    assert_eq!(sha256_file(&dst.path().join("img.bin")), sum);
    assert!(kept_files(dst.path()).is_empty());
}

/// A kept part whose bytes were changed so that every chunk keeps its
/// CRC32 (and its record still fits) is continued, but the whole-file
/// SHA-256 checked before the rename catches it: exit 5, nothing under
/// the final name, the kept part discarded.
#[test]
fn a_forged_prefix_with_the_same_crcs_is_caught_before_the_rename() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("f.bin");
    let size = 96 * MIB;
    let sum = make_file(&input, size, 40);
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--timeout", "10"]);
    let sha256 = ["--verify", "sha256"];
    let kept = kill_sender_at(
        &net,
        port,
        &mut receiver,
        dst.path(),
        (&input, 32 * MIB),
        &sha256,
    );
    assert!(kept >= 2 * CHUNK, "kept {kept}");
    // Chunk 1 of the kept part: 8 bytes changed, then 4 more chosen so
    // that its CRC32 is what it was.
    let partial = partial_file(dst.path());
    let mut chunk = vec![0u8; CHUNK as usize];
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::options()
            .read(true)
            .write(true)
            .open(&partial)
            .unwrap();
        f.read_exact_at(&mut chunk, CHUNK).unwrap();
        let crc = crc32fast::hash(&chunk);
        for b in &mut chunk[100..108] {
            *b ^= 0xa5;
        }
        force_crc32(&mut chunk, 200, crc);
        assert_eq!(crc32fast::hash(&chunk), crc);
        f.write_all_at(&chunk, CHUNK).unwrap();
    }
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--resume", "--verify", "sha256", "--json"],
    );
    assert_eq!(sent.code(), 5, "{}", sent.stderr);
    assert!(
        sent.stderr
            .contains("continuing after the part the receiver kept"),
        "the forged part was continued: {}",
        sent.stderr
    );
    assert!(
        sent.stderr.contains("whole-file digest mismatch"),
        "{}",
        sent.stderr
    );
    assert!(!dst.path().join("f.bin").exists());
    assert!(
        kept_files(dst.path()).is_empty(),
        "{:?}",
        kept_files(dst.path())
    );
    assert_no_temp_files(dst.path());
    // And the next run sends it whole.
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        &[input],
        &["--resume", "--verify", "sha256"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("f.bin")), sum);
}

/// Sets `data[at..at + 4]` so that the CRC32 of `data` is `want`. CRC32's
/// register step is linear and invertible: run the wanted final register
/// back over the bytes after the patch and over the patch's 32 bit steps;
/// the patch is what turns the register before it into that.
fn force_crc32(data: &mut [u8], at: usize, want: u32) {
    const POLY: u32 = 0xedb8_8320;
    let unstep = |r: u32| {
        if r & 0x8000_0000 != 0 {
            ((r ^ POLY) << 1) | 1
        } else {
            r << 1
        }
    };
    let before = !crc32fast::hash(&data[..at]);
    let mut reg = !want;
    for &b in data[at + 4..].iter().rev() {
        for _ in 0..8 {
            reg = unstep(reg);
        }
        reg ^= u32::from(b);
    }
    for _ in 0..32 {
        reg = unstep(reg);
    }
    data[at..at + 4].copy_from_slice(&(reg ^ before).to_le_bytes());
}

/// `--partial-ttl`: the receiver's sweep removes a leftover once it is
/// older than the limit, leaves a user's file with a similar name alone,
/// and spares the temporary file of a session, however long it waits.
#[test]
fn the_sweep_removes_old_leftovers_and_spares_what_sessions_use() {
    let Some(net) = rdma_net() else { return };
    let (_src, dst) = dirs();
    let leftover = dst
        .path()
        .join(format!(".rdma-xfer-partial-{}", "0a".repeat(12)));
    let users = dst.path().join(".rdma-xfer-partial-notes");
    std::fs::write(&leftover, b"x").unwrap();
    std::fs::write(&users, b"mine").unwrap();
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--partial-ttl", "2s"]);
    // A stream whose input comes after 6 s: its temporary file does not
    // change meanwhile, and sweeps run every 2 s.
    let script = format!(
        "(sleep 6; echo late) | {}",
        sender_line(sender_bin(), &net, port, &["--name", "slow.txt"], &["-"])
    );
    let sent = pipeline("sender", &script, 1).wait(Duration::from_secs(60));
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(
        std::fs::read(dst.path().join("slow.txt")).unwrap(),
        b"late\n"
    );
    receiver.wait_for_stderr("older than --partial-ttl", Duration::from_secs(30));
    assert!(!leftover.exists());
    assert_eq!(std::fs::read(&users).unwrap(), b"mine");
    // Nothing else of the receiver's own is left.
    std::fs::remove_file(&users).unwrap();
    assert_no_temp_files(dst.path());
}
