//! `--json` results of both tools and their progress output, on real RDMA
//! (scripts/e2e.sh runs this in the SoftRoCE guest): every JSON line is
//! checked against the real files (names, sizes, digests), a refused file
//! included; no progress bar when stderr is not a terminal; and one under a
//! pseudo-terminal (`script`).

use crate::support::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// A progress bar redraws its line with \r or moves the cursor with ESC
/// sequences; a log or summary line does neither.
fn assert_no_progress_output(tool: &str, stderr: &str) {
    assert!(
        !stderr.contains('\r') && !stderr.contains('\x1b'),
        "{tool} drew on a stderr that is not a terminal:\n{stderr:?}"
    );
    assert!(!stderr.contains("ETA"), "{tool}:\n{stderr}");
}

fn crc32_file(path: &Path) -> String {
    format!(
        "{:08x}",
        crc32fast::hash(&std::fs::read(path).expect("read"))
    )
}

/// Checks one acknowledged file's object against the file on disk.
fn check_ok(v: &Value, path: &Path, alg: &str, digest: &str) {
    let name = path.file_name().expect("name").to_str().expect("utf8");
    let size = std::fs::metadata(path).expect("stat").len();
    assert_eq!(v["event"], "file", "{v}");
    assert_eq!(v["name"], name, "{v}");
    assert_eq!(v["bytes"], size, "{v}");
    assert_eq!(v["status"], "ok", "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    assert_eq!(v["digest_alg"], alg, "{v}");
    assert_eq!(v["digest"], digest, "{v}");
    assert!(v.get("reason").is_none(), "{v}");
    let secs = v["seconds"].as_f64().expect("seconds");
    assert!(secs > 0.0, "{v}");
    let rate = v["mib_per_s"].as_f64().expect("mib_per_s");
    let want = size as f64 / 1048576.0 / secs;
    assert!((rate - want).abs() <= want * 1e-6 + 1e-9, "{v}");
    for phase in ["connect_s", "mr_exchange_s", "data_s", "fsync_verify_s"] {
        assert!(v["phases"][phase].as_f64().expect(phase) >= 0.0, "{v}");
    }
}

/// One session: a.bin, exists.bin (refused: the receiver has one), b.bin
/// (empty), c.bin. Both tools' JSON must describe exactly that.
#[test]
fn json_results_match_the_files_including_a_refused_one() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let files = [
        ("a.bin", 3 * CHUNK + 17),
        ("exists.bin", 4096),
        ("b.bin", 0),
        ("c.bin", CHUNK),
    ];
    let mut paths = Vec::new();
    let mut sums = Vec::new();
    for (i, (name, size)) in files.iter().enumerate() {
        let p = src.path().join(name);
        sums.push(make_file(&p, *size, 0x15_0000 + i as u64));
        paths.push(p);
    }
    std::fs::write(dst.path().join("exists.bin"), b"old").expect("existing file");
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--json"],
        &paths,
        &["--json", "--verify", "sha256"],
    );
    // The refusal is the first failure of both sides: exit 4.
    assert_eq!(sent.code(), 4, "{}\n{}", sent.stderr, received.stderr);
    assert_eq!(received.code(), 4, "{}", received.stderr);
    for (tool, run) in [("sender", &sent), ("receiver", &received)] {
        let lines = json_lines(tool, &run.stdout);
        assert_eq!(lines.len(), 5, "{tool}: {}", run.stdout);
        for (i, (p, sum)) in paths.iter().zip(&sums).enumerate() {
            if i == 1 {
                continue;
            }
            check_ok(&lines[i], p, "sha256", sum);
            // What the receiver reports is what is on its disk.
            let out = dst.path().join(p.file_name().expect("name"));
            assert_eq!(&sha256_file(&out), sum);
        }
        let refused = &lines[1];
        assert_eq!(refused["name"], "exists.bin", "{tool}: {refused}");
        assert_eq!(refused["bytes"], 4096, "{tool}: {refused}");
        assert_eq!(refused["status"], "rejected", "{tool}: {refused}");
        assert_eq!(refused["exit_code"], 4, "{tool}: {refused}");
        assert_eq!(refused["reason_code"], "exists", "{tool}: {refused}");
        assert_eq!(refused["retryable"], false, "{tool}: {refused}");
        assert_eq!(refused["digest"], Value::Null, "{tool}: {refused}");
        let reason = refused["reason"].as_str().expect("reason");
        assert!(
            reason.contains("exists.bin already exists"),
            "{tool}: {reason}"
        );
        let summary = &lines[4];
        assert_eq!(summary["event"], "summary", "{tool}: {summary}");
        assert_eq!(summary["files"], 3, "{tool}: {summary}");
        assert_eq!(summary["failed"], 1, "{tool}: {summary}");
        assert_eq!(summary["bytes"], 4 * CHUNK + 17, "{tool}: {summary}");
        assert_eq!(summary["status"], "rejected", "{tool}: {summary}");
        assert_eq!(summary["exit_code"], 4, "{tool}: {summary}");
        assert_eq!(summary["reason_code"], "exists", "{tool}: {summary}");
        assert!(
            summary["reason"]
                .as_str()
                .expect("reason")
                .contains("exists.bin")
        );
        // seconds = connect + every file's time; the phases add up below it.
        let secs = summary["seconds"].as_f64().expect("seconds");
        let phases: f64 = ["connect_s", "mr_exchange_s", "data_s", "fsync_verify_s"]
            .iter()
            .map(|p| summary["phases"][*p].as_f64().expect(p))
            .sum();
        assert!(secs > 0.0 && phases <= secs + 1e-6, "{tool}: {summary}");
        assert_no_progress_output(tool, &run.stderr);
        // The text summaries still go to stderr.
        assert!(
            run.stderr.contains("a.bin: 3.0 MiB (3145745 bytes) in"),
            "{}",
            run.stderr
        );
    }
    assert_eq!(
        std::fs::read(dst.path().join("exists.bin")).expect("read"),
        b"old"
    );
    assert_no_temp_files(dst.path());
}

/// A serving receiver prints each file's line as soon as the file is in
/// place (a script can follow it) and no summary at exit; the CRC32 digests
/// are the files' CRC32s.
#[test]
fn serving_receiver_prints_each_line_at_once() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--json"]);
    for i in 0..2u64 {
        let p = src.path().join(format!("f{i}.bin"));
        make_file(&p, i * CHUNK + 5, 77 + i);
        let sent = run_sender(
            &net,
            port,
            Path_::Wire,
            std::slice::from_ref(&p),
            &["--json"],
        );
        assert_eq!(sent.code(), 0, "{}", sent.stderr);
        let crc = crc32_file(&p);
        let lines = json_lines("sender", &sent.stdout);
        assert_eq!(lines.len(), 2, "{}", sent.stdout);
        check_ok(&lines[0], &p, "crc32", &crc);
        assert_eq!(lines[1]["event"], "summary");
        assert_eq!(
            (lines[1]["files"].as_u64(), lines[1]["failed"].as_u64()),
            (Some(1), Some(0))
        );
        assert_eq!(lines[1]["status"], "ok");
        // The receiver, still running, has printed this file's line.
        let out = receiver.wait_for_stdout_lines(i as usize + 1, Duration::from_secs(10));
        let lines = json_lines("receiver", &out);
        check_ok(
            &lines[i as usize],
            &dst.path().join(format!("f{i}.bin")),
            "crc32",
            &crc,
        );
    }
    receiver.signal("TERM");
    let done = receiver.wait(Duration::from_secs(30));
    assert_eq!(done.code(), 0, "{}", done.stderr);
    assert_eq!(
        json_lines("receiver", &done.stdout).len(),
        2,
        "no summary: {}",
        done.stdout
    );
    assert_no_progress_output("receiver", &done.stderr);
}

/// Under a pseudo-terminal (`script`) both tools draw a file bar and the
/// overall bar; with -q or --log-format json they draw none even there.
#[test]
fn progress_bars_only_on_a_terminal() {
    let Some(net) = rdma_net() else { return };
    if !have("script") {
        skip(
            "no `script` command to give the tools a terminal",
            everything_required(),
        );
        return;
    }
    let src = tempfile::tempdir().expect("src");
    let input = src.path().join("big.bin");
    let sum = make_file(&input, 48 * CHUNK, 99);
    for sender_extra in ["", "-q", "--log-format json"] {
        let dst = tempfile::tempdir().expect("dst");
        let port = next_port();
        // The receiver on a terminal too, logging (around its bars) unless -q.
        let logs = if sender_extra == "-q" { "" } else { "-v" };
        let receiver_line = format!(
            "{} --bind {} --port {port} --dir {} --once --insecure {logs} {sender_extra}",
            receiver_bin(),
            net.addr_a,
            dst.path().display()
        );
        let mut receiver = Running::spawn("receiver (pty)", script_cmd(&receiver_line));
        if logs.is_empty() {
            // Nothing to wait for on a quiet terminal: give it time to listen.
            std::thread::sleep(Duration::from_secs(3));
        } else {
            receiver.wait_for_stdout("listening", Duration::from_secs(60));
        }
        let source = match &net.addr_b {
            Some(b) => format!("--source {b}"),
            None => String::new(),
        };
        // With bars, --json too: stdout is the same terminal, and its lines
        // must not tear either.
        let json = if sender_extra.is_empty() {
            "--json"
        } else {
            ""
        };
        let sender_line = format!(
            "{} --port {port} {source} {sender_extra} {json} {} {}",
            sender_bin(),
            net.addr_a,
            input.display()
        );
        let sent =
            Running::spawn("sender (pty)", script_cmd(&sender_line)).wait(Duration::from_secs(300));
        let received = receiver.wait(Duration::from_secs(60));
        assert_eq!(sha256_file(&dst.path().join("big.bin")), sum);
        // `script` puts the terminal's output on its stdout.
        for (tool, run) in [("sender", &sent), ("receiver", &received)] {
            assert_eq!(run.code(), 0, "{tool}: {}{}", run.stdout, run.stderr);
            let screen = &run.stdout;
            if sender_extra.is_empty() {
                assert!(
                    screen.contains("total: 0/1 files"),
                    "{tool}: no overall bar: {screen:?}"
                );
                assert!(screen.contains("ETA"), "{tool}: no bar: {screen:?}");
                assert!(screen.contains("MiB/s"), "{tool}: no rate: {screen:?}");
                // The per-file summary line is printed whole (the bars
                // cleared first, drawn again below it).
                // Human sizes; the receiver (-v) adds the exact bytes and
                // its phases.
                let line = screen
                    .split("big.bin: 48.0 MiB")
                    .nth(1)
                    .and_then(|rest| rest.lines().next())
                    .unwrap_or_else(|| panic!("{tool}: no summary line: {screen:?}"));
                assert!(
                    line.contains(" in ")
                        && line.contains(" MiB/s (crc32 ")
                        && !line.contains('\x1b'),
                    "{tool}: torn summary line {line:?}"
                );
                if tool == "receiver" {
                    assert!(
                        line.starts_with(" (50331648 bytes) in ")
                            && line.ends_with(" ms")
                            && line.contains("fsync+verify"),
                        "{tool}: -v summary line {line:?}"
                    );
                }
                if tool == "sender" {
                    for event in ["{\"event\":\"file\"", "{\"event\":\"summary\""] {
                        let line = screen
                            .split(event)
                            .nth(1)
                            .and_then(|rest| rest.lines().next())
                            .unwrap_or_else(|| panic!("no {event} line: {screen:?}"));
                        let v: Value = serde_json::from_str(&format!("{event}{line}"))
                            .unwrap_or_else(|e| panic!("torn JSON line ({e}): {line:?}"));
                        assert_eq!(v["status"], "ok", "{v}");
                    }
                }
            } else {
                assert!(
                    !screen.contains("ETA") && !screen.contains("total: "),
                    "{tool} {sender_extra}: bars drawn: {screen:?}"
                );
            }
        }
    }
}

/// `script -qfec CMD /dev/null`: runs CMD with a pseudo-terminal as its
/// stdin, stdout and stderr, copying what it prints to our stdout pipe.
fn script_cmd(line: &str) -> Command {
    let mut cmd = Command::new("script");
    cmd.args(["-qfec", line, "/dev/null"]);
    // A terminal type: with none (or "dumb") nothing draws on it.
    cmd.env("TERM", "xterm");
    cmd.env_remove("RDMA_XFER_TOKEN");
    cmd
}

/// The progress bars on a real terminal, as a user sees them: the sender
/// runs in a tmux pane; screen captures taken while it works show the file
/// bar and the overall bar, and the last one shows the per-file line with
/// no bar left behind.
#[test]
fn progress_bars_on_a_tmux_screen() {
    let Some(net) = rdma_net() else { return };
    if !have("tmux") {
        skip("no tmux for a real terminal", everything_required());
        return;
    }
    let (src, dst) = dirs();
    let input = src.path().join("screen.bin");
    let sum = make_file(&input, 96 * MIB, 41);
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--once"]);
    // A tmux server of this test's own (its own socket, no user
    // configuration), ended when the test ends, even by a panic.
    struct TmuxServer(String);
    impl TmuxServer {
        fn run(&self, args: &[&str]) -> std::process::Output {
            Command::new("tmux")
                .args(["-L", &self.0, "-f", "/dev/null"])
                .args(args)
                .env_remove("TMUX")
                .output()
                .expect("tmux")
        }
    }
    impl Drop for TmuxServer {
        fn drop(&mut self) {
            let _ = self.run(&["kill-server"]);
        }
    }
    let server = TmuxServer(format!("rxfer-test-{}-{port}", std::process::id()));
    let tmux = |args: &[&str]| server.run(args);
    let source = match &net.addr_b {
        Some(b) => format!("--source {b}"),
        None => String::new(),
    };
    // The pane stays after the sender exits, showing its status.
    let line = format!(
        "env -u RDMA_XFER_TOKEN -u RDMA_XFER_ACK_TIMEOUT {} --port {port} {source} {} {}; \
         echo \"EXIT=$?\"; sleep 600",
        sender_bin(),
        net.addr_a,
        input.display()
    );
    let started = tmux(&[
        "new-session",
        "-d",
        "-x",
        "160",
        "-y",
        "24",
        "-s",
        "rx",
        &line,
    ]);
    assert!(started.status.success(), "{started:?}");
    let capture =
        || String::from_utf8_lossy(&tmux(&["capture-pane", "-p", "-t", "rx"]).stdout).into_owned();
    let mut bars_seen = false;
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    let last = loop {
        let screen = capture();
        // Bars under way: both, with a rate (the first draw says 0 B/s).
        if !bars_seen
            && screen.contains("screen.bin")
            && screen.contains("ETA")
            && screen.contains("total: 0/1 files")
            && screen.contains("MiB/s")
        {
            bars_seen = true;
        }
        if screen.contains("EXIT=") {
            break screen;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the sender did not finish:\n{screen}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(server);
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(received.code(), 0, "{}", received.stderr);
    assert_eq!(sha256_file(&dst.path().join("screen.bin")), sum);
    assert!(last.contains("EXIT=0"), "{last}");
    assert!(
        bars_seen,
        "no capture showed the bars moving; the last:\n{last}"
    );
    // The final screen: the per-file line whole, the bars gone.
    let done = last
        .lines()
        .find(|l| l.starts_with("screen.bin: 96.0 MiB in "))
        .unwrap_or_else(|| panic!("no per-file line:\n{last}"));
    assert!(done.contains(" MiB/s (crc32 "), "{done}");
    assert!(!last.contains("ETA") && !last.contains("total: "), "{last}");
}
