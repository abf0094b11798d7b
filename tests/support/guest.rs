//! The guest, its wires and faults: another wire's ends, the wire cut and
//! restored, the devices' GSI queue pairs, partial files appearing, and
//! shell pipelines run in it.

use super::*;

/// Waits until the receiver's temporary file in `dir` holds `bytes`, so a
/// fault lands in the middle of the data phase.
pub fn wait_for_partial_file(dir: &Path, bytes: u64) {
    wait_until(
        &format!("a temporary file of {bytes} bytes"),
        || largest_temp_file(dir),
        |&len| len >= bytes,
        Duration::from_secs(120),
    );
}

/// `wait_for_partial_file` while `sending` runs: if it ends first, or the
/// wait times out, the failure shows what it said.
pub fn wait_for_partial_file_from(dir: &Path, bytes: u64, sending: &mut Running) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let len = largest_temp_file(dir);
        if len >= bytes {
            return;
        }
        let ended = !sending.is_running();
        assert!(
            !ended && Instant::now() < deadline,
            "a temporary file of {bytes} bytes never came in {} (last {len}); the sender {}:\n{}",
            dir.display(),
            if ended { "ended" } else { "still runs" },
            sending.stderr_so_far()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The size of the largest temporary file in `dir` (0 if none).
pub fn largest_temp_file(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with(".rdma-xfer-"))
        .filter_map(|e| e.metadata().ok().map(|m| m.len()))
        .max()
        .unwrap_or(0)
}

/// Cuts or restores the guest's veth wire (scripts/guest/wire.sh).
pub fn set_wire(state: &str) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/guest/wire.sh");
    let status = std::process::Command::new(script)
        .arg(state)
        .status()
        .expect("wire.sh");
    assert!(status.success(), "wire.sh {state}");
}

/// The guest's rxe devices (RXFER_DEV_A, RXFER_DEV_B) whose GSI QP is in
/// the error state (`rdma resource show qp`): a known 6.12 rxe defect after
/// a wire cut (docs/testing.md#kernels).
pub fn gsi_qps_in_error() -> Vec<String> {
    let Ok(out) = std::process::Command::new("rdma")
        .args(["resource", "show", "qp"])
        .output()
    else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("rdma resource show qp:\n{text}");
    ["RXFER_DEV_A", "RXFER_DEV_B"]
        .iter()
        .filter_map(|v| std::env::var(v).ok())
        .filter(|dev| {
            text.lines().any(|l| {
                l.contains(&format!("link {dev}/"))
                    && l.contains("type GSI")
                    && l.contains("state ERR")
            })
        })
        .collect()
}

/// Whether the known 6.12 rxe defect (docs/testing.md#kernels) explains
/// why nothing connects across the wire: a device keeps its GSI QP in ERR
/// after a cut. Says so loudly, with `what` could not be done, if it does.
pub fn known_gsi_defect(what: &str) -> bool {
    let broken = gsi_qps_in_error();
    if broken.is_empty() {
        return false;
    }
    eprintln!(
        "KNOWN KERNEL DEFECT: {}: {} keep(s) its GSI QP in ERR after a wire cut: {what}",
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        broken.join(" and ")
    );
    true
}

/// The two ends of the veth wire (RXFER_NETDEV_A, RXFER_NETDEV_B) where the
/// test owns the machine's network and mounts (the guest); None elsewhere
/// (the test is skipped by name; in the guest it fails).
pub fn own_guest() -> Option<[String; 2]> {
    let devs = ["RXFER_NETDEV_A", "RXFER_NETDEV_B"].map(|v| std::env::var(v).ok());
    match devs {
        [Some(a), Some(b)] if in_guest() => Some([a, b]),
        _ => {
            skip(
                "needs the SoftRoCE guest's own wire and mounts (IN_RXFER_GUEST, RXFER_NETDEV_A/B)",
                in_guest(),
            );
            None
        }
    }
}

/// One of the guest's further wires (scripts/guest/run.sh): `net` listens
/// on its one end and sends from the other (`--source`), `netdevs` are the
/// veths of those ends (listening, sending).
pub struct Wire {
    pub net: Net,
    pub netdevs: [String; 2],
}

/// The wire whose listening end's address and netdev, and sending end's
/// address and netdev, run.sh exports as the variables `vars` (in that
/// order); None where they are not set (the test is skipped by name; in
/// the guest it fails).
pub fn guest_wire(vars: [&str; 4]) -> Option<Wire> {
    match vars.map(|v| std::env::var(v).ok()) {
        [Some(addr_a), Some(addr_b), Some(dev_a), Some(dev_b)] => Some(Wire {
            net: Net {
                addr_a,
                addr_b: Some(addr_b),
            },
            netdevs: [dev_a, dev_b],
        }),
        _ => {
            skip(
                &format!("needs the SoftRoCE guest's wire {}", vars.join(", ")),
                in_guest(),
            );
            None
        }
    }
}

/// Quotes `s` for bash.
pub fn q(s: impl AsRef<str>) -> String {
    format!("'{}'", s.as_ref().replace('\'', r"'\''"))
}

pub fn qp(p: &Path) -> String {
    q(p.to_str().expect("UTF-8 path"))
}

/// A bash pipeline run like a tool (stdin null, stderr collected). It
/// prints each stage's status as `pipe-status A B` and exits with the
/// status of stage `tool` (0: the first), the tool's.
pub fn pipeline(name: &'static str, script: &str, tool: usize) -> Running {
    let wrapped = format!(
        "{script}\ns=(\"${{PIPESTATUS[@]}}\"); echo \"pipe-status ${{s[*]}}\" >&2; exit ${{s[{tool}]}}"
    );
    let mut cmd = Command::new("bash");
    cmd.arg("-c").arg(wrapped).env_remove("RDMA_XFER_TOKEN");
    Running::spawn(name, cmd)
}

/// The sender's command line (across the wire) as a bash string.
pub fn sender_line(bin: &str, net: &Net, port: u16, extra: &[&str], args: &[&str]) -> String {
    let mut words = vec![q(bin), "--port".into(), port.to_string(), "-v".into()];
    if let Some(b) = &net.addr_b {
        words.push("--source".into());
        words.push(q(b));
    }
    words.extend(extra.iter().map(q));
    words.push(q(&net.addr_a));
    words.extend(args.iter().map(q));
    words.join(" ")
}
