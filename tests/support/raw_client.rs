//! The raw client (the test side of src/bin/rxfer-raw-client/).

use super::*;

/// The test-only raw client. It exists only with `--features
/// fault-injection`, which `make build` builds into target/fault-injection
/// so that target/release never contains it.
pub fn raw_client_bin() -> String {
    fault_injection_bin("rxfer-raw-client")
}

/// Starts the raw client against `net.addr_a:port` across the wire (from
/// the B address when there is one): `--scenario scenario` (if given), then
/// `steps`, with `--timeout timeout_s` (its wait for each answer and for a
/// `wait-file`). It prints one stdout line per message received; read them
/// while it runs with `Running::wait_for_line`, or at the end from
/// `Finished::lines` and `Finished::of_kind`.
pub fn spawn_raw_client(
    net: &Net,
    port: u16,
    scenario: Option<&str>,
    steps: &[&str],
    timeout_s: u64,
) -> Running {
    let mut cmd = Command::new(raw_client_bin());
    cmd.args([
        "--port",
        &port.to_string(),
        "--timeout",
        &timeout_s.to_string(),
    ]);
    if let Some(b) = &net.addr_b {
        cmd.args(["--source", b]);
    }
    if let Some(s) = scenario {
        cmd.args(["--scenario", s]);
    }
    cmd.arg(&net.addr_a).args(steps);
    Running::spawn("rxfer-raw-client", cmd)
}

/// Runs the raw client (as `spawn_raw_client`, each answer awaited for at
/// most 20 s) to its end; fails the test if it runs for more than
/// `timeout` (it is killed).
pub fn run_raw_client(
    net: &Net,
    port: u16,
    scenario: Option<&str>,
    steps: &[&str],
    timeout: Duration,
) -> Finished {
    spawn_raw_client(net, port, scenario, steps, 20).wait(timeout)
}
