//! Faults on real RDMA (run in the SoftRoCE guest by `make test`): a peer
//! killed mid-transfer and limits refused up front. Each case checks both
//! tools' exit codes, that nothing appears under the final name, that no
//! temporary file remains, and that the receiver then still serves a normal
//! transfer.

mod support;

use std::path::Path;
use std::time::{Duration, Instant};
use support::*;

/// Waits until the receiver's temporary file in `dir` holds `bytes`, so a
/// fault lands in the middle of the data phase.
fn wait_for_partial_file(dir: &Path, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let grown = std::fs::read_dir(dir)
            .expect("read dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(".rdma-xfer-"))
            .any(|e| e.metadata().map(|m| m.len() >= bytes).unwrap_or(false));
        if grown {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the transfer never reached {bytes} bytes");
}

fn sigkill(pid: u32) {
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
}

/// A 300 MiB transfer caught in the middle of its data phase (32 MiB
/// arrived), for injecting a fault.
struct MidTransfer {
    src: tempfile::TempDir,
    dst: tempfile::TempDir,
    port: u16,
    receiver: Running,
    sender: Running,
}

fn start_big_transfer(
    net: &Net,
    seed: u64,
    receiver_args: &[&str],
    sender_args: &[&str],
) -> MidTransfer {
    let (src, dst) = (
        tempfile::tempdir().expect("src"),
        tempfile::tempdir().expect("dst"),
    );
    let input = src.path().join("big.bin");
    make_file(&input, 300 * MIB, seed);
    let port = next_port();
    let receiver = start_receiver(net, port, dst.path(), receiver_args);
    let sender = Running::spawn(
        "sender",
        sender_cmd(
            net,
            port,
            Path_::Wire,
            std::slice::from_ref(&input),
            sender_args,
        ),
    );
    wait_for_partial_file(dst.path(), 32 * MIB);
    MidTransfer {
        src,
        dst,
        port,
        receiver,
        sender,
    }
}

/// A normal transfer to an already running receiver must still work.
fn assert_still_serves(net: &Net, port: u16, src: &Path, dst: &Path) {
    let input = src.join("after.bin");
    let sum = make_file(&input, CHUNK + 1, 77);
    let sent = run_sender(net, port, Path_::Wire, &[input], &[]);
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.join("after.bin")), sum);
}

#[test]
fn sender_killed_mid_transfer() {
    let Some(net) = rdma_net() else { return };
    let MidTransfer {
        src,
        dst,
        port,
        receiver,
        sender,
    } = start_big_transfer(&net, 1, &["--timeout", "10"], &[]);
    let killed_at = Instant::now();
    sigkill(sender.pid());
    let sent = sender.wait(Duration::from_secs(30));
    assert!(sent.status.code().is_none(), "sender was killed");

    // The receiver notices within the timeout plus a few seconds, cleans up
    // and keeps serving.
    let deadline = Instant::now() + Duration::from_secs(15);
    while !receiver.stderr_so_far().contains("session failed") {
        assert!(
            Instant::now() < deadline,
            "receiver did not notice:\n{}",
            receiver.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "receiver noticed the dead sender after {:?}",
        killed_at.elapsed()
    );
    let log = receiver.stderr_so_far();
    assert!(log.contains("peer lost"), "{log}");
    assert!(
        !dst.path().join("big.bin").exists(),
        "partial file under the final name"
    );
    assert_no_temp_files(dst.path());
    assert_still_serves(&net, port, src.path(), dst.path());
    assert!(!dst.path().join("big.bin").exists());
    assert_no_temp_files(dst.path());
}

#[test]
fn receiver_killed_mid_transfer_sender_exits_7() {
    let Some(net) = rdma_net() else { return };
    let MidTransfer {
        src,
        dst,
        port: _,
        receiver,
        sender,
    } = start_big_transfer(&net, 2, &["--once"], &["--timeout", "10"]);
    let killed_at = Instant::now();
    sigkill(receiver.pid());
    let _ = receiver.wait(Duration::from_secs(30));
    let sent = sender.wait(Duration::from_secs(40));
    eprintln!(
        "sender gave up {:?} after the receiver died",
        killed_at.elapsed()
    );
    assert_eq!(sent.code(), 7, "{}", sent.stderr);
    assert!(
        killed_at.elapsed() < Duration::from_secs(15),
        "took {:?}",
        killed_at.elapsed()
    );
    assert!(
        !dst.path().join("big.bin").exists(),
        "partial file under the final name"
    );

    // A fresh receiver on the same directory serves normally. (The killed
    // one could not remove its temporary file; it never has the final name.)
    let port = next_port();
    let again = start_receiver(&net, port, dst.path(), &[]);
    assert_still_serves(&net, port, src.path(), dst.path());
    drop(again);
}

#[test]
fn oversized_file_is_refused_before_any_data() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = (
        tempfile::tempdir().expect("src"),
        tempfile::tempdir().expect("dst"),
    );
    let input = src.path().join("too-big.bin");
    make_file(&input, 2 * MIB + 1, 3);
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--max-size", "2M"]);
    let sent = run_sender(&net, port, Path_::Wire, &[input], &[]);
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("at most 2097152 bytes"),
        "{}",
        sent.stderr
    );
    assert!(!dst.path().join("too-big.bin").exists());
    assert_no_temp_files(dst.path());
    assert_still_serves(&net, port, src.path(), dst.path());
    drop(receiver);
}

/// Cuts or restores the guest's veth wire (scripts/guest/wire.sh).
fn set_wire(state: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/guest/wire.sh");
    let status = std::process::Command::new(script)
        .arg(state)
        .status()
        .expect("wire.sh");
    assert!(status.success(), "wire.sh {state}");
}

#[test]
fn wire_cut_mid_transfer_ends_both_sides_within_the_timeout() {
    let Some(net) = rdma_net() else { return };
    // Only where the test owns the wire (the guest's veth pair).
    if std::env::var_os("RXFER_NETDEV_B").is_none() {
        eprintln!("SKIPPED: no veth wire of our own (RXFER_NETDEV_B unset)");
        return;
    }
    let MidTransfer {
        src: _src,
        dst,
        port: _,
        receiver,
        sender,
    } = start_big_transfer(&net, 4, &["--once", "--timeout", "5"], &["--timeout", "5"]);
    let cut_at = Instant::now();
    set_wire("down");
    let sent = sender.wait(Duration::from_secs(60));
    let sender_took = cut_at.elapsed();
    let received = receiver.wait(Duration::from_secs(60));
    let receiver_took = cut_at.elapsed();
    set_wire("up");
    eprintln!("wire cut: sender gave up after {sender_took:?}, receiver after {receiver_took:?}");
    assert_eq!(sent.code(), 7, "{}", sent.stderr);
    assert_eq!(received.code(), 7, "{}", received.stderr);
    // Timeout 5 s plus the transport's own retries and a little slack.
    assert!(
        sender_took < Duration::from_secs(20),
        "sender took {sender_took:?}"
    );
    assert!(
        receiver_took < Duration::from_secs(20),
        "receiver took {receiver_took:?}"
    );
    assert!(
        !dst.path().join("big.bin").exists(),
        "partial file under the final name"
    );
    assert_no_temp_files(dst.path());
    // Known gap (issue 3): right after the link comes back, new rdma_cm
    // connections to the guest time out for a while, so serving again after
    // a link flap is not asserted here yet.
}
