//! `sender --lanes`: big files in pieces over several sessions at once,
//! each its own connection and queue pair, into a serving receiver.

use crate::support::*;
use std::time::Duration;

#[test]
fn a_big_file_goes_in_pieces_over_two_lanes_and_arrives_whole() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let big = src.path().join("big.bin");
    let big_sum = make_file(&big, 40 * MIB + 7, 0x1a4e);
    let small = src.path().join("small.bin");
    let small_sum = make_file(&small, CHUNK + 3, 0x1a4f);
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &[]);
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        &[big.clone(), small],
        &["--lanes", "2", "-v", "--json"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    // The sender's digest of the file sent in pieces: its CRC32, combined
    // from the pieces'.
    let crc = format!("{:08x}", crc32fast::hash(&std::fs::read(&big).unwrap()));
    let lines = json_lines("sender", &sent.stdout);
    let line = lines.iter().find(|v| v["name"] == "big.bin").unwrap();
    assert_eq!(line["digest"], crc.as_str(), "{}", sent.stdout);
    assert!(
        sent.stderr.contains("sending in pieces"),
        "{}",
        sent.transcript()
    );
    assert_eq!(sha256_file(&dst.path().join("big.bin")), big_sum);
    assert_eq!(sha256_file(&dst.path().join("small.bin")), small_sum);
    assert_no_temp_files(dst.path());
    drop(receiver);
}

#[test]
fn a_once_receiver_serves_all_lanes_of_a_tree_with_a_token() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A tree: lane 0 offers the directory and the small file first, then
    // the big file's pieces go over both lanes into that directory.
    let tree = src.path().join("run");
    std::fs::create_dir(&tree).unwrap();
    let small_sum = make_file(&tree.join("notes.txt"), 1000, 0x1a50);
    let big_sum = make_file(&tree.join("model.bin"), 24 * MIB + 5, 0x1a51);
    let token = token_args();
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &args(&token, &["--json"]),
        &[tree],
        &args(&token, &["-r", "--lanes", "2", "--json"]),
    );
    assert_both_ok(&sent, &received);
    // Both sides give the same SHA-256 of the pieces' SHA-256s.
    let digest_of = |who: &str, out: &str| {
        json_lines(who, out)
            .into_iter()
            .find(|v| v["name"] == "run/model.bin")
            .map(|v| v["digest"].clone())
            .unwrap()
    };
    let digest = digest_of("sender", &sent.stdout);
    assert_eq!(digest.as_str().map(str::len), Some(64), "{}", sent.stdout);
    assert_eq!(digest_of("receiver", &received.stdout), digest);
    assert!(
        sent.stderr.contains("sending in pieces"),
        "{}",
        sent.transcript()
    );
    // The second lane joined the one receiver: no lane was lost.
    assert!(!sent.stderr.contains("lane_down"), "{}", sent.transcript());
    assert_eq!(sha256_file(&dst.path().join("run/model.bin")), big_sum);
    assert_eq!(sha256_file(&dst.path().join("run/notes.txt")), small_sum);
    assert_no_temp_files(dst.path());
}

#[test]
fn a_once_receiver_that_takes_files_whole_gets_big_files_whole_from_lanes() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let files: Vec<_> = ["a.bin", "b.bin"]
        .into_iter()
        .enumerate()
        .map(|(i, name)| {
            let path = src.path().join(name);
            make_file_undigested(&path, 9 * MIB + 1, 0x1a53 + i as u64);
            path
        })
        .collect();
    // Every lane's session joins the one receiver; whole files go on its
    // first session only, whichever lane that is.
    let token = token_args();
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &args(&token, &["--discard"]),
        &files,
        &args(&token, &["--lanes", "2", "-v", "--json"]),
    );
    // Their pieces refused, the files go whole, verified and dropped.
    assert_both_ok(&sent, &received);
    assert!(
        sent.stderr.contains("it goes whole, on one lane"),
        "{}",
        sent.transcript()
    );
    let lines = json_lines("sender", &sent.stdout);
    for name in ["a.bin", "b.bin"] {
        let line = lines.iter().find(|v| v["name"] == name).unwrap();
        assert_eq!(line["outcome"], "discarded", "{}", sent.stdout);
    }
    assert!(!sent.stderr.contains("lane_down"), "{}", sent.transcript());
}

/// Restores the guest's two A-B wires (uncut, unlimited) however the test
/// ends.
struct WiresRestored;

impl Drop for WiresRestored {
    fn drop(&mut self) {
        for wire in [["ab2", "up"], ["ab", "unlimit"], ["ab2", "unlimit"]] {
            let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/guest/wire.sh");
            let _ = std::process::Command::new(script).args(wire).status();
        }
    }
}

fn wire(args: &[&str]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/guest/wire.sh");
    let status = std::process::Command::new(script)
        .args(args)
        .status()
        .expect("wire.sh");
    assert!(status.success(), "wire.sh {args:?}");
}

#[test]
fn a_rail_that_goes_silent_mid_file_is_dropped_and_the_file_completes_on_the_other() {
    let Some(net) = rdma_net() else { return };
    let Some(rail) = guest_wire([
        "RXFER_ADDR_A2",
        "RXFER_ADDR_B2",
        "RXFER_NETDEV_A2",
        "RXFER_NETDEV_B2",
    ]) else {
        return;
    };
    let (src, dst) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let big = src.path().join("big.bin");
    let big_sum = make_file(&big, 48 * MIB, 0x1a52);
    let _restore = WiresRestored;
    // Both wires at 10 MiB/s: 48 MiB take about 2.4 s on two rails.
    wire(&["ab", "limit", "10mibps"]);
    wire(&["ab2", "limit", "10mibps"]);
    // The receiver listens on every address (both rails).
    let port = next_port();
    let any = Net {
        addr_a: "0.0.0.0".into(),
        addr_b: None,
    };
    let receiver = start_receiver(&any, port, dst.path(), &[]);
    let b2 = rail.net.addr_b.clone().unwrap();
    let rails = format!("{b2}={}", rail.net.addr_a);
    let cmd = SenderCommand::new(&net, port, Path_::Wire)
        .files(std::slice::from_ref(&big))
        .args(&["--lanes", "2", "--rails", &rails, "--json"])
        .command();
    let before = tx_bytes(&rail.netdevs[1]);
    let started = std::time::Instant::now();
    let sending = Running::spawn("sender", cmd);
    // The second rail carries data, then its packets are dropped (its
    // carrier stays up: no error comes from the transport).
    wait_until(
        "bytes sent on the second rail",
        || tx_bytes(&rail.netdevs[1]) - before,
        |&sent| sent > 4 * MIB,
        Duration::from_secs(30),
    );
    wire(&["ab2", "down"]);
    let sent = sending.wait(Duration::from_secs(120));
    let took = started.elapsed();
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert!(sent.stderr.contains("lane_down"), "{}", sent.transcript());
    let lost: Vec<_> = json_lines("sender", &sent.stdout)
        .into_iter()
        .filter(|v| v["event"] == "lane down")
        .collect();
    assert_eq!(lost.len(), 1, "{}", sent.stdout);
    assert_eq!(lost[0]["lane"], 1, "{}", sent.stdout);
    assert_eq!(sha256_file(&dst.path().join("big.bin")), big_sum);
    // Dropped within seconds (the lane's silence while the other is
    // heard), not after the 30 s receive timeout: 48 MiB at 10 MiB/s on
    // one rail is about 5 s.
    assert!(
        took < Duration::from_secs(20),
        "{took:?}\n{}",
        sent.transcript()
    );
    assert_no_temp_files(dst.path());
    drop(receiver);
}
