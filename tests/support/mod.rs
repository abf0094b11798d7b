//! Shared helpers of the end-to-end tests: they drive the built `receiver`
//! and `sender` binaries exactly as a user would, on a real RDMA stack
//! (SoftRoCE in the QEMU guest of scripts/guest/run.sh, or a host that has an
//! RDMA device).
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
/// Default chunk (slot) size of the tools.
pub const CHUNK: u64 = MIB;

/// Where the tests talk: the receiver's address and the sender's source.
pub struct Net {
    /// Receiver side (rxe0 / veth0 in the guest).
    pub addr_a: String,
    /// Sender side (rxe1 / veth1 in the guest); connecting from it to
    /// `addr_a` crosses the veth wire.
    pub addr_b: Option<String>,
}

/// Returns the network to use, or None (test skipped) when this machine has
/// no RDMA device and nobody demanded one. In CI, or inside the guest
/// (RDMA_XFER_REQUIRE_RDMA=1), a missing device fails the test.
pub fn rdma_net() -> Option<Net> {
    let has_device = std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    if !has_device {
        let required = std::env::var_os("RDMA_XFER_REQUIRE_RDMA").is_some()
            || std::env::var("CI")
                .map(|v| !v.is_empty() && v != "false")
                .unwrap_or(false);
        assert!(
            !required,
            "no RDMA device on this machine: the end-to-end tests must run where there is one \
             (`make test` boots a SoftRoCE guest for them)"
        );
        eprintln!("SKIPPED: no RDMA device (run `make test` to use the SoftRoCE guest)");
        return None;
    }
    Some(Net {
        addr_a: std::env::var("RXFER_ADDR_A").unwrap_or_else(|_| "127.0.0.1".into()),
        addr_b: std::env::var("RXFER_ADDR_B").ok(),
    })
}

pub fn receiver_bin() -> &'static str {
    env!("CARGO_BIN_EXE_receiver")
}

pub fn sender_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sender")
}

/// A binary of the test-only build with the `fault-injection` feature, which
/// `make build` puts into target/fault-injection.
pub fn fault_injection_bin(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/fault-injection/release")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `make build` (it builds the fault-injection binaries)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// A port no other test of this run uses.
pub fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 200) as u16 * 100;
    base + NEXT.fetch_add(1, Ordering::SeqCst)
}

/// Deterministic pseudo-random bytes (xorshift64*), fast even in the guest.
pub fn fill_pseudo_random(buf: &mut [u8], state: &mut u64) {
    for chunk in buf.chunks_mut(8) {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        let v = state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes();
        chunk.copy_from_slice(&v[..chunk.len()]);
    }
}

/// Writes `size` pseudo-random bytes to `path`; returns their SHA-256.
pub fn make_file(path: &Path, size: u64, seed: u64) -> String {
    let mut f = std::fs::File::create(path).expect("create input file");
    let mut state = seed | 1;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 4 * MIB as usize];
    let mut left = size;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        fill_pseudo_random(&mut buf[..n], &mut state);
        hasher.update(&buf[..n]);
        f.write_all(&buf[..n]).expect("write input file");
        left -= n as u64;
    }
    hex(&hasher.finalize())
}

pub fn sha256_file(path: &Path) -> String {
    let mut f =
        std::fs::File::open(path).unwrap_or_else(|e| panic!("cannot open {}: {e}", path.display()));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 4 * MIB as usize];
    loop {
        let n = f.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    hex(&hasher.finalize())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Asserts that no temporary file of the receiver is left in `dir`.
pub fn assert_no_temp_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read output dir") {
        let name = entry.expect("dir entry").file_name();
        let name = name.to_string_lossy();
        assert!(
            !name.starts_with(".rdma-xfer-"),
            "temporary file {name} left behind in {}",
            dir.display()
        );
    }
}

/// Output of a finished tool run.
pub struct Finished {
    pub status: ExitStatus,
    pub stderr: String,
    /// Empty unless the tool ran with --json.
    pub stdout: String,
}

impl Finished {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }
}

/// A running child whose stderr and stdout are collected by threads.
pub struct Running {
    child: Child,
    stderr: Arc<Mutex<String>>,
    stdout: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    name: &'static str,
}

/// Collects a pipe's lines into a shared string on a thread of its own.
fn collect_lines(
    pipe: impl Read + Send + 'static,
    sink: Arc<Mutex<String>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { break };
            let mut s = sink.lock().expect("output lock");
            s.push_str(&line);
            s.push('\n');
        }
    })
}

impl Running {
    pub fn spawn(name: &'static str, mut cmd: Command) -> Running {
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
        let stderr = Arc::new(Mutex::new(String::new()));
        let stdout = Arc::new(Mutex::new(String::new()));
        let readers = vec![
            collect_lines(child.stderr.take().expect("stderr pipe"), stderr.clone()),
            collect_lines(child.stdout.take().expect("stdout pipe"), stdout.clone()),
        ];
        Running {
            child,
            stderr,
            stdout,
            readers,
            name,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// True while the process has not exited.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn stderr_so_far(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    pub fn stdout_so_far(&self) -> String {
        self.stdout.lock().expect("stdout lock").clone()
    }

    /// Waits until stdout contains `needle` (or the process exits): for a
    /// tool run under `script`, whose terminal output arrives on stdout.
    pub fn wait_for_stdout(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.stdout_so_far().contains(needle) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before printing {needle:?}:\n{}",
                    self.name,
                    self.stdout_so_far()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{} did not print {needle:?} within {timeout:?}:\n{}",
            self.name,
            self.stdout_so_far()
        );
    }

    /// Waits until stdout has `n` complete lines (the process still running).
    pub fn wait_for_stdout_lines(&mut self, n: usize, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            let out = self.stdout_so_far();
            if out.lines().count() >= n {
                return out;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before printing {n} lines on stdout:\n{out}\n{}",
                    self.name,
                    self.stderr_so_far()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{} did not print {n} lines on stdout within {timeout:?}:\n{}",
            self.name,
            self.stdout_so_far()
        );
    }

    /// Waits until stderr contains `needle` (or the process exits).
    pub fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if self.stderr_so_far().contains(needle) {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "{} exited ({status}) before printing {needle:?}:\n{}",
                    self.name,
                    self.stderr_so_far()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "{} did not print {needle:?} within {timeout:?}:\n{}",
            self.name,
            self.stderr_so_far()
        );
    }

    /// Waits for exit; kills the process (which this test started) after
    /// `timeout` and fails, so a hang never hangs the suite.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{} did not finish within {timeout:?} (killed):\n{}",
                    self.name,
                    self.stderr_so_far()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Finished {
            status,
            stderr: self.stderr_so_far(),
            stdout: self.stdout_so_far(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        // Only our own child: never leave a receiver running after a failure.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A serving receiver (pass `--once` in `extra` for one session) listening
/// on `net.addr_a`, writing into `dir`.
pub fn start_receiver(net: &Net, port: u16, dir: &Path, extra: &[&str]) -> Running {
    start_receiver_env(net, port, dir, extra, &[])
}

/// As `start_receiver`, with RDMA_XFER_TOKEN removed from the environment
/// unless `env` sets it, and `env` added.
pub fn start_receiver_env(
    net: &Net,
    port: u16,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Running {
    let mut cmd = Command::new(receiver_bin());
    cmd.args(["--bind", &net.addr_a, "--port", &port.to_string()])
        .arg("--dir")
        .arg(dir)
        .arg("-v")
        .args(extra);
    cmd.env_remove("RDMA_XFER_TOKEN");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut r = Running::spawn("receiver", cmd);
    r.wait_for_stderr("listening", Duration::from_secs(60));
    r
}

/// How the sender reaches the receiver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path_ {
    /// From the B address to A: across the veth wire.
    Wire,
    /// To A from A itself: rxe's internal loopback.
    Loopback,
}

pub fn sender_cmd(net: &Net, port: u16, path: Path_, files: &[PathBuf], extra: &[&str]) -> Command {
    sender_cmd_with(sender_bin(), net, port, path, files, extra)
}

/// Like `sender_cmd`, with another build of the sender (see
/// `fault_injection_bin`).
pub fn sender_cmd_with(
    bin: &str,
    net: &Net,
    port: u16,
    path: Path_,
    files: &[PathBuf],
    extra: &[&str],
) -> Command {
    let mut cmd = Command::new(bin);
    cmd.args(["--port", &port.to_string(), "-v"]);
    // Without a second address (a host with one RDMA port) the "wire" cases
    // run over that port's loopback.
    if let (Path_::Wire, Some(b)) = (path, net.addr_b.as_ref()) {
        cmd.args(["--source", b]);
    }
    cmd.args(extra).arg(&net.addr_a).args(files);
    cmd
}

/// Runs a sender to completion.
pub fn run_sender(
    net: &Net,
    port: u16,
    path: Path_,
    files: &[PathBuf],
    extra: &[&str],
) -> Finished {
    Running::spawn("sender", sender_cmd(net, port, path, files, extra))
        .wait(Duration::from_secs(600))
}

/// Parses `peak_rss_bytes=N` printed by a tool run with -v.
pub fn peak_rss(stderr: &str) -> u64 {
    stderr
        .split("peak_rss_bytes=")
        .nth(1)
        .and_then(|s| s.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no peak_rss_bytes in:\n{stderr}"))
}

/// Bytes sent so far on a network interface (to prove traffic used the wire).
pub fn tx_bytes(netdev: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/class/net/{netdev}/statistics/tx_bytes"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// The test-only raw client (src/bin/rxfer-raw-client.rs). It exists only
/// with `--features fault-injection`, which `make build` builds into
/// target/fault-injection so that target/release never contains it.
pub fn raw_client_bin() -> PathBuf {
    PathBuf::from(fault_injection_bin("rxfer-raw-client"))
}

/// A finished raw-client run: exit status, stdout lines (one per message
/// received), stderr.
pub struct RawRun {
    pub status: ExitStatus,
    pub lines: Vec<String>,
    pub stderr: String,
}

impl RawRun {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }

    /// Lines of one kind (`REJECT`, `ACK`, `MR`, ...).
    pub fn of_kind(&self, kind: &str) -> Vec<&str> {
        self.lines
            .iter()
            .map(String::as_str)
            .filter(|l| l.split(' ').next() == Some(kind))
            .collect()
    }
}

/// Runs the raw client against `net.addr_a:port` across the wire (from the
/// B address when there is one): `--scenario scenario` (if given), then
/// `steps`. Fails the test if it runs for more than `timeout` (it is killed).
pub fn run_raw_client(
    net: &Net,
    port: u16,
    scenario: Option<&str>,
    steps: &[&str],
    timeout: Duration,
) -> RawRun {
    RawClient::spawn(net, port, scenario, steps, 20).finish(timeout)
}

/// A running raw client whose stdout lines can be read while it runs (to
/// learn an MR's address and rkey, say, while the client holds its session).
pub struct RawClient {
    child: Child,
    lines: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl RawClient {
    /// Starts the raw client as `run_raw_client` does, with `--timeout
    /// timeout_s` (its wait for each answer and for a `wait-file`).
    pub fn spawn(
        net: &Net,
        port: u16,
        scenario: Option<&str>,
        steps: &[&str],
        timeout_s: u64,
    ) -> RawClient {
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
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start rxfer-raw-client");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out = child.stdout.take().expect("stdout");
        let err = child.stderr.take().expect("stderr");
        let sink = lines.clone();
        let out_reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                sink.lock().expect("lines lock").push(line);
            }
        });
        let sink = stderr.clone();
        let err_reader = std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                let mut s = sink.lock().expect("stderr lock");
                s.push_str(&line);
                s.push('\n');
            }
        });
        RawClient {
            child,
            lines,
            stderr,
            readers: vec![out_reader, err_reader],
        }
    }

    /// True while the client has not exited.
    pub fn still_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits for the first stdout line starting with `prefix` and returns
    /// it; fails the test if the client exits or `timeout` passes first.
    pub fn wait_line(&mut self, prefix: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(l) = self
                .lines
                .lock()
                .expect("lines lock")
                .iter()
                .find(|l| l.starts_with(prefix))
            {
                return l.clone();
            }
            let exited = matches!(self.child.try_wait(), Ok(Some(_)));
            if exited || Instant::now() >= deadline {
                // A last look: the line may have come with the exit.
                std::thread::sleep(Duration::from_millis(100));
                if let Some(l) = self
                    .lines
                    .lock()
                    .expect("lines lock")
                    .iter()
                    .find(|l| l.starts_with(prefix))
                {
                    return l.clone();
                }
                panic!(
                    "rxfer-raw-client {} without a {prefix:?} line:\nstdout:\n{}\nstderr:\n{}",
                    if exited { "exited" } else { "timed out" },
                    self.lines.lock().expect("lines lock").join("\n"),
                    self.stderr.lock().expect("stderr lock")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the client to exit; fails the test (killing the client)
    /// after `timeout`.
    pub fn finish(mut self, timeout: Duration) -> RawRun {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                // Only our own child.
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "rxfer-raw-client did not finish within {timeout:?} (killed):\n{}",
                    self.stderr.lock().expect("stderr lock")
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        RawRun {
            status,
            lines: std::mem::take(&mut *self.lines.lock().expect("lines lock")),
            stderr: std::mem::take(&mut *self.stderr.lock().expect("stderr lock")),
        }
    }
}

impl Drop for RawClient {
    fn drop(&mut self) {
        // Only our own child: never leave it running after a failure.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
