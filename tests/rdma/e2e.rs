//! End-to-end tests of `receiver` + `sender` on a real RDMA stack.
//! `make test` runs them inside the SoftRoCE guest (scripts/guest/run.sh).
//! Every case checks the output's SHA-256 against the input's and that no
//! temporary file is left behind.

use crate::support::*;
use std::path::PathBuf;
use std::time::Duration;

/// Sends `files` (name, size) in one session and checks every byte.
fn transfer_and_check(
    net: &Net,
    path: Path_,
    files: &[(&str, u64)],
    extra: &[&str],
) -> (Finished, Finished) {
    let (src, dst) = dirs();
    let mut inputs = Vec::new();
    for (i, (name, size)) in files.iter().enumerate() {
        let p = src.path().join(name);
        let sum = make_file(&p, *size, 0x5eed + i as u64 * 7919 + size);
        inputs.push((p, sum));
    }
    let paths: Vec<PathBuf> = inputs.iter().map(|(p, _)| p.clone()).collect();
    let (sent, received) = one_session(net, path, dst.path(), &[], &paths, extra);
    assert_both_ok(&sent, &received);
    for (p, sum) in &inputs {
        let out = dst.path().join(p.file_name().expect("name"));
        assert_eq!(&sha256_file(&out), sum, "content of {}", out.display());
        let want_mode = std::fs::metadata(p).expect("meta").permissions();
        let got_mode = std::fs::metadata(&out).expect("meta").permissions();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            got_mode.mode() & 0o777,
            want_mode.mode() & 0o777,
            "mode of {}",
            out.display()
        );
    }
    assert_no_temp_files(dst.path());
    (sent, received)
}

#[test]
fn sizes_around_the_chunk_boundary_across_the_wire() {
    let Some(net) = rdma_net() else { return };
    for size in [0, 1, CHUNK - 1, CHUNK, CHUNK + 1] {
        let name = format!("file-{size}.bin");
        let (sent, _) = transfer_and_check(&net, Path_::Wire, &[(&name, size)], &[]);
        // -v: the human size, then the exact one.
        assert!(
            sent.stderr
                .lines()
                .any(|l| l.starts_with(&format!("{name}: "))
                    && l.contains(&format!(" ({size} bytes) in "))),
            "{}",
            sent.stderr
        );
    }
}

#[test]
fn several_files_in_one_session() {
    let Some(net) = rdma_net() else { return };
    transfer_and_check(
        &net,
        Path_::Wire,
        &[
            ("a.bin", 3 * CHUNK + 5),
            ("empty", 0),
            ("b.bin", 17),
            ("c.bin", 2 * CHUNK),
        ],
        &[],
    );
}

/// `--name sub/deep/new.pt` for one regular file: its directories are
/// offered first, so it arrives there in an empty directory, and nothing
/// arrives under its own name.
#[test]
fn one_file_under_a_name_with_directories_into_an_empty_directory() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("ckpt.pt");
    let sum = make_file(&file, 2 * CHUNK + 3, 0x4e41);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &[],
        &[file],
        &["--name", "sub/deep/new.pt"],
    );
    assert_both_ok(&sent, &received);
    assert_eq!(sha256_file(&dst.path().join("sub/deep/new.pt")), sum);
    let top: Vec<_> = std::fs::read_dir(dst.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(top, ["sub"], "only the named path arrived");
    assert!(
        sent.stderr.contains("new.pt"),
        "the file's line names it as it arrived:\n{}",
        sent.stderr
    );
    assert_no_temp_files(&dst.path().join("sub/deep"));
}

#[test]
fn hundred_mib_across_the_wire_uses_the_wire() {
    let Some(net) = rdma_net() else { return };
    let before = std::env::var("RXFER_NETDEV_B").map(|d| tx_bytes(&d)).ok();
    transfer_and_check(&net, Path_::Wire, &[("random-100m.bin", 100 * MIB)], &[]);
    if let (Some(before), Ok(dev)) = (before, std::env::var("RXFER_NETDEV_B")) {
        let sent = tx_bytes(&dev) - before;
        assert!(
            sent >= 100 * MIB,
            "only {sent} bytes left through {dev}: not across the wire"
        );
    }
}

/// Sends a file across the guest's wire named by `vars` (see `guest_wire`)
/// and checks that its bytes crossed that wire and not A-B's.
fn across_another_wire(vars: [&str; 4]) {
    let Some(_) = rdma_net() else { return };
    let Some(ab) = own_guest() else { return };
    let Some(wire) = guest_wire(vars) else { return };
    let size = 3 * CHUNK + 777;
    let ab_sent = || ab.iter().map(|d| tx_bytes(d)).sum::<u64>();
    let (ab_before, wire_before) = (ab_sent(), tx_bytes(&wire.netdevs[1]));
    transfer_and_check(&wire.net, Path_::Wire, &[("other-wire.bin", size)], &[]);
    let crossed = tx_bytes(&wire.netdevs[1]) - wire_before;
    assert!(
        crossed >= size,
        "only {crossed} of {size} bytes left through {}: not across its wire",
        wire.netdevs[1]
    );
    let on_ab = ab_sent() - ab_before;
    assert!(
        on_ab < size,
        "{on_ab} bytes crossed the A-B wire ({}) for a {size}-byte file",
        ab.join("-")
    );
}

#[test]
fn a_file_to_c_crosses_wire_c_from_its_upstream_end() {
    across_another_wire([
        "RXFER_ADDR_C",
        "RXFER_SRC_C",
        "RXFER_NETDEV_C",
        "RXFER_NETDEV_SRC_C",
    ]);
}

#[test]
fn a_file_to_d_crosses_wire_d_from_its_upstream_end() {
    across_another_wire([
        "RXFER_ADDR_D",
        "RXFER_SRC_D",
        "RXFER_NETDEV_D",
        "RXFER_NETDEV_SRC_D",
    ]);
}

#[test]
fn a_file_from_b2_to_a2_crosses_the_second_a_b_wire() {
    across_another_wire([
        "RXFER_ADDR_A2",
        "RXFER_ADDR_B2",
        "RXFER_NETDEV_A2",
        "RXFER_NETDEV_B2",
    ]);
}

#[test]
fn file_larger_than_four_rings_over_loopback() {
    let Some(net) = rdma_net() else { return };
    // 300 MiB through a 16 x 1 MiB ring: every slot is reused ~19 times.
    transfer_and_check(
        &net,
        Path_::Loopback,
        &[("random-300m.bin", 300 * MIB)],
        &[],
    );
}

#[test]
fn sha256_verification() {
    let Some(net) = rdma_net() else { return };
    let (sent, received) = transfer_and_check(
        &net,
        Path_::Wire,
        &[("sha.bin", 5 * CHUNK + 123)],
        &["--verify", "sha256"],
    );
    assert!(sent.stderr.contains("sha256"), "{}", sent.stderr);
    assert!(received.stderr.contains("sha256"), "{}", received.stderr);
}

#[test]
fn any_number_of_writer_threads_stores_the_same_bytes() {
    let Some(net) = rdma_net() else { return };
    // 0: the session's thread writes; 1, 2 and 5: writer threads, whose
    // writes finish in any order (with a 4-slot ring and 64 KiB chunks,
    // many chunks are in flight at once); 2 with SHA-256, the setting the
    // docs recommend for it.
    for (threads, verify) in [
        ("0", "crc32"),
        ("1", "crc32"),
        ("5", "crc32"),
        ("2", "sha256"),
    ] {
        let (src, dst) = dirs();
        let mut inputs = Vec::new();
        for (i, size) in [(0u64, 41 * 65536 + 333), (1, 3 * CHUNK), (2, 70_000)] {
            let p = src.path().join(format!("w{threads}-{i}.bin"));
            let sum = make_file(&p, size, (0x77 + i * 31) | 1);
            inputs.push((p, sum));
        }
        let paths: Vec<PathBuf> = inputs.iter().map(|(p, _)| p.clone()).collect();
        let (sent, received) = one_session(
            &net,
            Path_::Wire,
            dst.path(),
            &["--threads", threads, "--slots", "4", "--chunk-size", "64K"],
            &paths,
            &["--verify", verify],
        );
        assert_both_ok(&sent, &received);
        for (p, sum) in &inputs {
            let out = dst.path().join(p.file_name().expect("name"));
            assert_eq!(
                &sha256_file(&out),
                sum,
                "--threads {threads}: {}",
                out.display()
            );
        }
        assert_no_temp_files(dst.path());
    }
}

#[test]
fn small_ring_and_odd_chunk_sizes() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("odd.bin");
    let sum = make_file(&input, 3 * MIB + 4321, 99);
    // The sender's bigger chunk is capped by the receiver's slot size.
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--slots", "3", "--chunk-size", "256K"],
        &[input],
        &["--depth", "2", "--chunk-size", "1M"],
    );
    assert_both_ok(&sent, &received);
    assert_eq!(sha256_file(&dst.path().join("odd.bin")), sum);
    assert_no_temp_files(dst.path());
}

#[test]
fn existing_file_is_refused_without_overwrite_and_replaced_with_it() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("report.txt");
    let sum = make_file(&input, 2 * CHUNK + 9, 4);
    let existing = dst.path().join("report.txt");
    std::fs::write(&existing, b"old content").expect("write existing");

    let files = std::slice::from_ref(&input);
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], files, &[]);
    assert_eq!(sent.code(), 4, "sender:\n{}", sent.stderr);
    assert!(sent.stderr.contains("already exists"), "{}", sent.stderr);
    assert_eq!(
        received.code(),
        4,
        "receiver --once status:\n{}",
        received.stderr
    );
    assert_eq!(std::fs::read(&existing).expect("read"), b"old content");
    assert_no_temp_files(dst.path());

    let overwrite = args(&["--overwrite"], &token_args());
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &overwrite,
        files,
        &token_args(),
    );
    assert_both_ok(&sent, &received);
    assert_eq!(sha256_file(&existing), sum);
    assert_no_temp_files(dst.path());
}

#[test]
fn hostile_name_is_refused_and_later_files_still_arrive() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let bad = src.path().join("bad\nname");
    make_file(&bad, 1000, 5);
    let good = src.path().join("good.bin");
    let sum = make_file(&good, 1000, 6);
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], &[bad, good], &[]);
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert!(sent.stderr.contains("control character"), "{}", sent.stderr);
    assert_eq!(received.code(), 4, "{}", received.stderr);
    let names: Vec<_> = std::fs::read_dir(dst.path())
        .expect("read dir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("good.bin")]);
    assert_eq!(sha256_file(&dst.path().join("good.bin")), sum);
}

#[test]
fn receiver_without_once_serves_sessions_until_sigterm() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    for i in 0..3u64 {
        let input = src.path().join(format!("s{i}.bin"));
        let sum = make_file(&input, i * CHUNK + 77, i);
        let sent = run_sender(&net, port, Path_::Wire, std::slice::from_ref(&input), &[]);
        assert_eq!(
            sent.code(),
            0,
            "{}\n{}",
            sent.stderr,
            receiver.stderr_so_far()
        );
        assert_eq!(sha256_file(&dst.path().join(format!("s{i}.bin"))), sum);
    }
    // SIGTERM to the receiver this test started: a clean exit 0.
    receiver.signal("TERM");
    let done = receiver.wait(Duration::from_secs(30));
    assert_eq!(done.code(), 0, "{}", done.stderr);
    assert_no_temp_files(dst.path());
}

#[test]
fn nothing_listening_is_a_connect_error() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("dir");
    let input = src.path().join("x");
    make_file(&input, 10, 1);
    let port = next_port();
    let sent = run_sender(&net, port, Path_::Wire, &[input], &["--timeout", "5"]);
    assert_eq!(sent.code(), 3, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("cannot connect")
            && sent.stderr.contains("nothing listens on that port"),
        "{}",
        sent.stderr
    );
}

/// A local address no RDMA device has is a permanent mistake (exit 8, not
/// retried), named in the message; exit 3 stays "cannot reach", and its
/// `--json` summary says it is worth retrying.
#[test]
fn a_source_address_without_rdma_exits_8_and_is_not_retried() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("dir");
    let input = src.path().join("x");
    make_file(&input, 10, 1);
    let port = next_port();
    let mut cmd = std::process::Command::new(sender_bin());
    cmd.args(["--port", &port.to_string(), "--retry=3", "--json"])
        .args(["--source", "10.99.0.9", &net.addr_a])
        .arg(&input);
    token_env(&mut cmd, None);
    let started = std::time::Instant::now();
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(120));
    assert_eq!(sent.code(), 8, "{}", sent.stderr);
    assert!(
        sent.stderr
            .contains("--source 10.99.0.9: no RDMA device has this address"),
        "{}",
        sent.stderr
    );
    assert!(started.elapsed() < Duration::from_secs(10), "retried?");
    let summary: serde_json::Value =
        serde_json::from_str(sent.stdout.lines().last().expect("summary")).expect("JSON");
    assert_eq!(summary["status"], "no_device", "{summary}");
    assert_eq!(summary["retryable"], false, "{summary}");
    // Nobody listening: exit 3, retryable.
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        &[input],
        &["--timeout", "5", "--json"],
    );
    assert_eq!(sent.code(), 3, "{}", sent.stderr);
    let summary: serde_json::Value =
        serde_json::from_str(sent.stdout.lines().last().expect("summary")).expect("JSON");
    assert_eq!(summary["retryable"], true, "{summary}");
}

#[test]
fn one_gib_keeps_memory_bounded() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("one-gib.bin");
    // No SHA-256 of 1 GiB twice (~45 s in the guest): the copy is compared
    // byte for byte with the input's pseudo-random stream, made again.
    make_file_undigested(&input, 1024 * MIB, 11);
    let files = std::slice::from_ref(&input);
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], files, &[]);
    assert_both_ok(&sent, &received);
    // Remove the input before reading the output: the guest's tmpfs is RAM.
    std::fs::remove_file(&input).expect("rm input");
    assert_made_file(&dst.path().join("one-gib.bin"), 1024 * MIB, 11);
    assert_no_temp_files(dst.path());
    // 64 MiB plus the registered buffers (16 x 1 MiB ring; 16 x 1 MiB staging).
    let bound = 64 * MIB + 16 * MIB;
    let (s, r) = (peak_rss(&sent.stderr), peak_rss(&received.stderr));
    eprintln!(
        "peak RSS for 1 GiB: sender {} KiB, receiver {} KiB",
        s / 1024,
        r / 1024
    );
    assert!(s < bound, "sender peak RSS {s} >= {bound}");
    assert!(r < bound, "receiver peak RSS {r} >= {bound}");
}

/// The tracing event "file done": its phase fields and its spans.
fn check_file_done_event(who: &str, lines: &[serde_json::Value], name: &str) {
    let event = lines
        .iter()
        .find(|v| v["fields"]["message"] == "file done")
        .unwrap_or_else(|| panic!("{who}: no \"file done\" log event in {lines:?}"));
    assert_eq!(event["fields"]["file"], name, "{event}");
    for field in ["connect_s", "mr_exchange_s", "data_s", "fsync_verify_s"] {
        assert!(
            event["fields"][field].as_f64().is_some_and(|s| s >= 0.0),
            "{who}: {field} in {event}"
        );
    }
    let spans = event["spans"].as_array().expect("span list");
    assert!(
        spans
            .iter()
            .any(|s| s["name"] == "session" && s["peer"].is_string()),
        "{who}: no session span with the peer in {event}"
    );
    assert!(
        spans
            .iter()
            .any(|s| s["name"] == "file" && s["size"].is_u64()),
        "{who}: no file span in {event}"
    );
}

#[test]
fn json_logs_carry_spans_and_phase_timings() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("logged.bin");
    let sum = make_file(&input, 3 * CHUNK + 1, 5);
    let json = &["--log-format", "json"];
    let files = std::slice::from_ref(&input);
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), json, files, json);
    assert_both_ok(&sent, &received);
    assert_eq!(sha256_file(&dst.path().join("logged.bin")), sum);
    for (who, stderr) in [("sender", &sent.stderr), ("receiver", &received.stderr)] {
        let lines = json_lines(who, stderr);
        check_file_done_event(who, &lines, "logged.bin");
        let summary = lines
            .iter()
            .find(|v| v["event"] == "file done")
            .unwrap_or_else(|| panic!("{who}: no JSON summary in {stderr}"));
        assert_eq!(summary["bytes"], 3 * CHUNK + 1, "{summary}");
        assert!(
            summary["phases"]["data_s"]
                .as_f64()
                .is_some_and(|s| s > 0.0)
        );
        assert!(
            lines
                .iter()
                .any(|v| v["fields"]["message"] == "peak rss" && v["level"] == "INFO"),
            "{stderr}"
        );
    }
}

#[test]
fn text_summary_shows_phase_timings() {
    let Some(net) = rdma_net() else { return };
    let (sent, received) = transfer_and_check(&net, Path_::Wire, &[("phases.bin", CHUNK)], &[]);
    for out in [&sent.stderr, &received.stderr] {
        let line = out
            .lines()
            .find(|l| l.starts_with("phases.bin: "))
            .unwrap_or_else(|| panic!("no summary line in {out}"));
        for part in ["connect ", "MR ", "data ", "fsync+verify "] {
            assert!(line.contains(part), "{part:?} missing from {line}");
        }
    }
}

/// As scp: without -p received modes are the sender's masked with the
/// receiver's umask; -p keeps them only if the receiver lets it
/// (`--keep-modes`): a sender alone never makes a file more open than the
/// receiver's umask (0666 arrives 0644 under umask 022). Setuid, setgid
/// and sticky are never kept. Files and directories alike.
#[test]
fn modes_follow_the_receivers_umask_unless_both_keep_them() {
    use std::os::unix::fs::PermissionsExt;
    let Some(net) = rdma_net() else { return };
    let (src, _) = dirs();
    let tree = src.path().join("modes");
    std::fs::create_dir(&tree).expect("mkdir");
    let files = [
        ("rw-all", 0o666),
        ("rwx-all", 0o777),
        ("setuid", 0o4755),
        ("private", 0o600),
    ];
    for (name, mode) in files {
        let p = tree.join(name);
        make_file(&p, 1000, mode as u64);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    let open_dir = tree.join("open");
    std::fs::create_dir(&open_dir).expect("mkdir");
    std::fs::set_permissions(&open_dir, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    std::fs::set_permissions(&tree, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let mode_of = |p: PathBuf| std::fs::metadata(&p).expect("meta").permissions().mode() & 0o7777;
    let masked = [0o644, 0o755, 0o755, 0o600, 0o755, 0o755];
    const TOKEN: &str = "modes-test-token-0123456789";
    for (receiver_flag, flag, want) in [
        (None, None, masked),
        (None, Some("-p"), masked),
        (Some("--keep-modes"), None, masked),
        (
            Some("--keep-modes"),
            Some("-p"),
            [0o666, 0o777, 0o755, 0o600, 0o777, 0o777],
        ),
    ] {
        let dst = tempfile::tempdir().expect("tempdir");
        let port = next_port();
        let mut receiver_extra = vec!["--once"];
        receiver_extra.extend(receiver_flag);
        let token = [("RDMA_XFER_TOKEN", TOKEN)];
        let receiver = ReceiverCommand::new(&net, port, dst.path())
            .args(&receiver_extra)
            .env(&token)
            .umask("022")
            .start();
        let mut extra = vec!["-r"];
        extra.extend(flag);
        let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
            .files(std::slice::from_ref(&tree))
            .args(&extra)
            .command();
        token_env(&mut cmd, Some(TOKEN));
        let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(600));
        let received = receiver.wait(Duration::from_secs(120));
        assert_both_ok(&sent, &received);
        let got = dst.path().join("modes");
        let seen = [
            mode_of(got.join("rw-all")),
            mode_of(got.join("rwx-all")),
            mode_of(got.join("setuid")),
            mode_of(got.join("private")),
            mode_of(got.join("open")),
            mode_of(got.clone()),
        ];
        assert_eq!(
            seen.map(|m| format!("{m:o}")),
            want.map(|m| format!("{m:o}")),
            "modes with {flag:?} to a receiver with {receiver_flag:?} (rw-all rwx-all setuid \
             private open/ modes/)"
        );
        assert_no_temp_files(&got);
    }
}

/// A source file cut short while it is being sent (a log rotated, a file
/// rewritten in place): the sender says so in words and fails (exit 6),
/// and the receiver keeps nothing of it.
#[test]
fn a_file_that_shrinks_while_sent_fails_clearly_and_leaves_nothing() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("shrinking.bin");
    make_file_undigested(&input, 300 * MIB, 81);
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &[]);
    let sender = Running::spawn(
        "sender",
        SenderCommand::new(&net, port, Path_::Wire)
            .files(std::slice::from_ref(&input))
            .command(),
    );
    receiver.wait_for_stderr("offer", Duration::from_secs(60));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&input)
        .and_then(|f| f.set_len(MIB))
        .expect("truncate the source");
    let sent = sender.wait(Duration::from_secs(300));
    assert_eq!(sent.code(), 6, "{}", sent.stderr);
    assert!(
        sent.stderr
            .contains("shrinking.bin shrank while being sent")
            && sent
                .stderr
                .contains("it had 314572800 bytes when the transfer started"),
        "{}",
        sent.stderr
    );
    assert!(
        !sent.stderr.contains("failed to fill whole buffer"),
        "{}",
        sent.stderr
    );
    receiver.wait_for_stderr("session failed", Duration::from_secs(60));
    assert!(!dst.path().join("shrinking.bin").exists());
    assert_no_temp_files(dst.path());
}

/// A new user's first run (on a trusted link, --insecure): the receiver,
/// quiet by default, says once where it listens (device and port), where
/// files go, and that anyone who reaches it may write there; `sender
/// HOST:PORT FILE` reaches it; `receiver DIR` works as `--dir DIR`; the
/// per-file line shows human sizes.
#[test]
fn the_receiver_says_where_it_listens_and_host_port_reaches_it() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let port = next_port();
    let mut cmd = std::process::Command::new(receiver_bin());
    cmd.args(["--bind", &net.addr_a, "--port", &port.to_string(), "--once"])
        .arg("--insecure")
        .arg(dst.path())
        .env_remove("RDMA_XFER_ACK_TIMEOUT");
    token_env(&mut cmd, None);
    let mut receiver = Running::spawn("receiver", cmd);
    let log = receiver.wait_for_stderr("listening", Duration::from_secs(60));
    let listening = format!(
        "receiver: warning: UNAUTHENTICATED: listening on {}:{port} (",
        net.addr_a
    );
    let line = log
        .lines()
        .find(|l| l.starts_with(&listening))
        .unwrap_or_else(|| panic!("no listening line in:\n{log}"));
    let dir = std::fs::canonicalize(dst.path()).expect("canonical");
    // "(rxe0 port 1)": the device the bound address belongs to.
    let device = line[listening.len()..]
        .split_once(')')
        .map(|(d, _)| d)
        .unwrap_or_default();
    assert!(
        device.split_once(" port ").is_some_and(|(name, port)| {
            !name.is_empty() && port.parse::<u8>().is_ok_and(|p| p >= 1)
        }),
        "{line}"
    );
    let d = dir.display();
    assert!(
        line.contains(&format!(
            "), writing to {d}; anyone who can reach this port may write into {d} (--insecure"
        )),
        "{line}"
    );
    assert_eq!(
        log.lines().filter(|l| l.contains("warning")).count(),
        1,
        "{log}"
    );
    let input = src.path().join("first.bin");
    let sum = make_file(&input, 3 * MIB + 5, 77);
    let mut cmd = std::process::Command::new(sender_bin());
    if let Some(b) = &net.addr_b {
        cmd.args(["--source", b]);
    }
    cmd.arg(format!("{}:{port}", net.addr_a))
        .arg(&input)
        .env_remove("RDMA_XFER_ACK_TIMEOUT");
    token_env(&mut cmd, None);
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(300));
    let received = receiver.wait(Duration::from_secs(60));
    assert_both_ok(&sent, &received);
    assert_eq!(sha256_file(&dst.path().join("first.bin")), sum);
    // Without -v: the human line, no phases.
    let done = sent
        .stderr
        .lines()
        .find(|l| l.starts_with("first.bin: 3.0 MiB in "))
        .unwrap_or_else(|| panic!("no per-file line in:\n{}", sent.stderr));
    assert!(
        done.contains(" MiB/s (crc32 ") && !done.contains("fsync"),
        "{done}"
    );
    assert_no_temp_files(dst.path());
}

/// The doctor finds a working stack healthy (exit 0): the devices, their
/// active ports with the GID of each address, and the device the way to
/// the peer leaves by.
#[test]
fn the_doctor_reports_a_healthy_host() {
    let Some(net) = rdma_net() else { return };
    let dst = tempfile::tempdir().expect("dst");
    let port = next_port();
    // A serving receiver without a token: the handshake says so.
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let target = format!("{}:{port}", net.addr_a);
    let doctor = |token: Option<&str>| {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_rdma-xfer-gen"));
        cmd.args(["doctor", &target]).env_remove("RDMA_XFER_TOKEN");
        if let Some(t) = token {
            cmd.env("RDMA_XFER_TOKEN", t);
        }
        let out = cmd.output().expect("run the doctor");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let (code, text) = doctor(None);
    assert_eq!(code, Some(0), "{text}");
    assert!(!text.contains("FAIL"), "{text}");
    assert!(text.contains("user space: libibverbs lists "), "{text}");
    assert!(text.contains(" port 1: ACTIVE, LinkUp, "), "{text}");
    assert!(
        text.contains(&format!(" {} (", net.addr_a)),
        "the GID of {}: {text}",
        net.addr_a
    );
    assert!(
        text.contains(&format!("({}): leaves from ", net.addr_a)),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "ok    the receiver at {target} answers, speaks protocol 8; no token (it runs --insecure"
        )),
        "{text}"
    );
    assert!(
        text.ends_with("RDMA is ready here: a transfer should work.\n"),
        "{text}"
    );
    // With a token the doctor, as a sender would, refuses a receiver
    // that asks for none: a transfer would fail, exit 8.
    let (code, text) = doctor(Some("sixteen-bytes-at-least"));
    assert_eq!(code, Some(8), "{text}");
    assert!(
        text.contains(&format!("FAIL  the receiver at {target}: ")),
        "{text}"
    );
    drop(receiver);
    // Nobody there any more: it says so, exit 8.
    let (code, text) = doctor(None);
    assert_eq!(code, Some(8), "{text}");
    assert!(text.contains("start a receiver there"), "{text}");
}

/// `--bwlimit` holds over a 10 s transfer: the data's rate is within 5 %
/// of the limit (the first chunk goes at once: 2.5 % above it at most).
#[test]
fn a_bandwidth_limit_holds_over_ten_seconds() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("paced.bin");
    let sum = make_file(&input, 40 * MIB, 41);
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--once"]);
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&input),
        &["--bwlimit", "4M", "--json"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(receiver.wait(Duration::from_secs(60)).code(), 0);
    assert_eq!(sha256_file(&dst.path().join("paced.bin")), sum);
    // The data phase's rate: connecting and the ring's set-up are not paced.
    let file = &json_lines("sender", &sent.stdout)[0];
    let data_s = file["phases"]["data_s"].as_f64().expect("data_s");
    let rate = 40.0 / data_s;
    assert!(
        (4.0 * 0.95..=4.0 * 1.05).contains(&rate),
        "{rate} MiB/s against --bwlimit 4M: {file}"
    );
}
