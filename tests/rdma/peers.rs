//! `make bench-peers` (scripts/bench-peers.sh) in miniature: the same
//! small file B -> A with scp, rsync over ssh, a netcat pipe, rcopy and
//! rdma-xfer, each copy checked; the table and one RESULT line per peer.
//! The figures themselves are `make bench-peers`'s (docs/performance.md).

use std::path::Path;
use std::process::Command;

#[test]
fn bench_peers_prints_its_table_with_every_copy_checked() {
    // The suites' sshd (both addresses, the stock memlock limit), which
    // the script then finds running.
    let Some(_net) = crate::ssh::ssh_net() else {
        return;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/bench-peers.sh");
    let out = Command::new("bash")
        .arg(script)
        .args(["-s", "2", "-r", "1"])
        .output()
        .expect("bench-peers.sh");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("rdma-xfer time / tool time"),
        "no table:\n{text}"
    );
    for peer in ["scp", "rsync", "nc", "rcopy"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("RESULT peer={peer} ")))
            .unwrap_or_else(|| panic!("no RESULT for {peer}:\n{text}"));
        assert!(line.contains("time_ratio="), "{line}");
        assert!(!line.contains("FAILED"), "{line}");
    }
    assert!(!text.contains("DIFFERS"), "{text}");
}
