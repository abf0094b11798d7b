//! One receiver, many sessions: concurrent senders, the --max-sessions
//! refusal, and a soak of sequential transfers (no fd or memory growth).
//! Real RDMA (the SoftRoCE guest under `make test`).

use crate::support::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const TOKEN: &str = "sessions-test-token-0123456789";

/// Open descriptors and resident memory of a process we started.
fn fds_and_rss(pid: u32) -> (usize, u64) {
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .expect("read /proc/PID/fd")
        .count();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok())
        .expect("VmRSS");
    (fds, rss_kib * 1024)
}

/// Most sessions the receiver's log shows running at the same time.
fn max_overlap(log: &str) -> i32 {
    let (mut now, mut max) = (0, 0);
    for line in log.lines() {
        if line.contains("session established") {
            now += 1;
            max = max.max(now);
        } else if line.contains("session finished") || line.contains("session failed") {
            now -= 1;
        }
    }
    max
}

#[test]
fn eight_senders_at_once_all_arrive_intact() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let inputs: Vec<(PathBuf, u64)> = (0..8)
        .map(|i| {
            let p = src.path().join(format!("part-{i}.bin"));
            // Distinct contents: a session writing into another's file
            // would show up as a byte that differs.
            let seed = 0xc0ffee + i;
            make_file_undigested(&p, 64 * MIB, seed);
            (p, seed)
        })
        .collect();
    let port = next_port();
    // With a token: an --insecure receiver gives one address (these
    // senders share one) only half of its sessions.
    let env = [("RDMA_XFER_TOKEN", TOKEN)];
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .env(&env)
        .start();
    let started = Instant::now();
    let senders: Vec<Running> = inputs
        .iter()
        .map(|(p, _)| {
            let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
                .files(std::slice::from_ref(p))
                .command();
            token_env(&mut cmd, Some(TOKEN));
            Running::spawn("sender", cmd)
        })
        .collect();
    for (i, s) in senders.into_iter().enumerate() {
        let done = s.wait(Duration::from_secs(600));
        assert_eq!(
            done.code(),
            0,
            "sender {i} failed:\n{}\nreceiver:\n{}",
            done.stderr,
            receiver.stderr_so_far()
        );
    }
    let elapsed = started.elapsed();
    eprintln!(
        "8 x 64 MiB at once: {elapsed:?}, {:.1} MiB/s in total",
        512.0 / elapsed.as_secs_f64()
    );
    for (p, seed) in &inputs {
        // Byte for byte against the input's stream (SHA-256 of 2 x 512 MiB
        // took ~20 s in the guest).
        assert_made_file(
            &dst.path().join(p.file_name().expect("name")),
            64 * MIB,
            *seed,
        );
    }
    assert_no_temp_files(dst.path());
    let log = receiver.stderr_so_far();
    let overlap = max_overlap(&log);
    assert!(
        overlap >= 2,
        "sessions never overlapped (max {overlap} at once):\n{log}"
    );
    eprintln!("at most {overlap} sessions ran at once");
}

#[test]
fn beyond_max_sessions_a_sender_is_refused_with_a_reason() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let big = src.path().join("big.bin");
    let big_sum = make_file(&big, 200 * MIB, 11);
    let small = src.path().join("small.bin");
    let small_sum = make_file(&small, CHUNK + 3, 12);
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--max-sessions", "1"]);
    let first = Running::spawn(
        "sender",
        SenderCommand::new(&net, port, Path_::Wire)
            .files(std::slice::from_ref(&big))
            .command(),
    );
    receiver.wait_for_stderr("offer", Duration::from_secs(60));

    let refused = run_sender(&net, port, Path_::Wire, std::slice::from_ref(&small), &[]);
    assert_eq!(refused.code(), 4, "{}", refused.stderr);
    assert!(refused.stderr.contains("busy"), "{}", refused.stderr);
    assert!(!dst.path().join("small.bin").exists());

    let done = first.wait(Duration::from_secs(600));
    assert_eq!(done.code(), 0, "{}", done.stderr);
    assert_eq!(sha256_file(&dst.path().join("big.bin")), big_sum);

    // The slot is free again.
    let again = run_sender(&net, port, Path_::Wire, &[small], &[]);
    assert_eq!(again.code(), 0, "{}", again.stderr);
    assert_eq!(sha256_file(&dst.path().join("small.bin")), small_sum);
    assert_no_temp_files(dst.path());
}

fn send_one(net: &Net, port: u16, input: &Path, dst: &Path, name: &str) {
    let named = input.with_file_name(name);
    std::fs::rename(input, &named).expect("rename input");
    let sent = run_sender(net, port, Path_::Wire, std::slice::from_ref(&named), &[]);
    assert_eq!(sent.code(), 0, "transfer {name}: {}", sent.stderr);
    std::fs::rename(&named, input).expect("rename back");
    assert!(dst.join(name).exists(), "{name} missing");
}

#[test]
fn soak_100_transfers_leave_fds_and_memory_flat() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("input.bin");
    let sum = make_file(&input, 3 * CHUNK + 12345, 99);
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let pid = receiver.pid();
    let mut baseline = None;
    for i in 0..100 {
        send_one(&net, port, &input, dst.path(), &format!("soak-{i:03}.bin"));
        if i == 4 {
            baseline = Some(fds_and_rss(pid));
        }
    }
    let (fds0, rss0) = baseline.expect("baseline");
    let (fds, rss) = fds_and_rss(pid);
    eprintln!("after 5 transfers: {fds0} fds, RSS {rss0} B; after 100: {fds} fds, RSS {rss} B");
    assert_eq!(fds, fds0, "file descriptors leaked");
    // The allocator may keep a little more; a per-session leak of the ring
    // (16 MiB) or of any buffer would show as megabytes.
    assert!(
        rss <= rss0 + 2 * MIB,
        "RSS grew from {rss0} to {rss} bytes over 95 sessions"
    );
    for i in [0, 50, 99] {
        assert_eq!(
            sha256_file(&dst.path().join(format!("soak-{i:03}.bin"))),
            sum
        );
    }
    assert_no_temp_files(dst.path());
}

/// `--allow`: a peer outside the list is refused by the connection manager
/// (nothing of ours is sent to it, nothing is written, `--once` goes on
/// waiting); a peer inside it gets through.
#[test]
fn allow_refuses_peers_outside_the_list() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("allowed.bin");
    let sum = make_file(&file, 300_000, 11);
    let files = std::slice::from_ref(&file);
    let peer = net.addr_b.clone().unwrap_or_else(|| net.addr_a.clone());

    // 192.0.2.0/24 is TEST-NET-1: never this test's sender.
    let port = next_port();
    let mut receiver = start_receiver(
        &net,
        port,
        dst.path(),
        &["--once", "--allow", "192.0.2.0/24"],
    );
    let started = Instant::now();
    let sent = run_sender(&net, port, Path_::Wire, files, &["--timeout", "10"]);
    assert_eq!(sent.code(), 3, "sender:\n{}", sent.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "refused at once"
    );
    let log = receiver.wait_for_stderr(
        &format!("refused a connection from {peer}: not in --allow"),
        Duration::from_secs(10),
    );
    assert!(!log.contains("session established"), "{log}");
    assert!(
        receiver.is_running(),
        "--once ends only after a session it served"
    );
    assert_eq!(
        std::fs::read_dir(dst.path()).expect("ls").count(),
        0,
        "nothing written"
    );
    receiver.signal("TERM");
    drop(receiver);

    // The same sender, allowed by address or by network.
    for rule in [format!("{peer}/32"), format!("{peer}/8")] {
        let port = next_port();
        let receiver = start_receiver(
            &net,
            port,
            dst.path(),
            &args(
                &[
                    "--once",
                    "--overwrite",
                    "--allow",
                    "192.0.2.1",
                    "--allow",
                    &rule,
                ],
                &token_args(),
            ),
        );
        let sent = run_sender(&net, port, Path_::Wire, files, &token_args());
        let received = receiver.wait(Duration::from_secs(60));
        assert_both_ok(&sent, &received);
        assert_eq!(
            sha256_file(&dst.path().join("allowed.bin")),
            sum,
            "with --allow {rule}"
        );
    }
}
