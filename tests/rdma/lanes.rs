//! `sender --lanes`: big files in pieces over several sessions at once,
//! each its own connection and queue pair, into a serving receiver.

use crate::support::*;

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
        &[big, small],
        &["--lanes", "2", "-v"],
    );
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
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
