//! The one helper module of the integration tests (tests/rdma/,
//! tests/cli.rs, tests/install.rs): skipping by name, the one wait loop (`wait_until`), the one process helper
//! (`Running`, for every binary a test starts: receiver, sender, shell
//! pipelines and the raw client), test data, and the command lines of the
//! tools. The end-to-end tests drive the built binaries exactly as a user
//! would, on a real RDMA stack (SoftRoCE in the QEMU guest of
//! scripts/guest/run.sh, or a host that has an RDMA device).
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::fmt::Display;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;

pub const MIB: u64 = 1 << 20;
/// Default chunk (slot) size of the tools.
pub const CHUNK: u64 = MIB;

// ---------------------------------------------------------------------------
// Skipping: a test that cannot run here says so by name, and fails instead
// where the run demands it.

/// The running test's name (libtest runs each test on a thread named after
/// it, with --test-threads=1 too).
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string()
}

fn env_set(var: &str) -> bool {
    std::env::var(var)
        .map(|v| !v.is_empty() && v != "0" && v != "false")
        .unwrap_or(false)
}

/// True where every test must run (the guest sets RDMA_XFER_REQUIRE_RDMA=1;
/// CI sets CI=true): there a test that cannot run fails.
pub fn everything_required() -> bool {
    env_set("RDMA_XFER_REQUIRE_RDMA") || env_set("CI")
}

/// True inside the SoftRoCE guest of scripts/guest/run.sh, whose network and
/// mounts the tests own.
pub fn in_guest() -> bool {
    env_set("IN_RXFER_GUEST")
}

/// Reports the running test as skipped, by name: `SKIPPED: <test>:
/// <reason>` on stderr (shown with --nocapture, and by e2e.sh). Where
/// `required`, the test fails instead: it never passes without running.
pub fn skip(reason: &str, required: bool) {
    let name = test_name();
    assert!(
        !required,
        "{name} cannot run here, and this run requires it: {reason}"
    );
    eprintln!("SKIPPED: {name}: {reason}");
}

pub fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// Where the tests talk: the receiver's address and the sender's source.
pub struct Net {
    /// Receiver side (rxe0 / veth0 in the guest).
    pub addr_a: String,
    /// Sender side (rxe1 / veth1 in the guest); connecting from it to
    /// `addr_a` crosses the veth wire.
    pub addr_b: Option<String>,
}

/// Returns the network to use, or None when this machine has no RDMA device
/// (the test is skipped, by name); where one is required (the guest, CI) a
/// missing device fails the test.
pub fn rdma_net() -> Option<Net> {
    if !has_rdma_device() {
        skip(
            "no RDMA device (`make test` runs the end-to-end tests in a SoftRoCE guest)",
            everything_required(),
        );
        return None;
    }
    Some(Net {
        addr_a: std::env::var("RXFER_ADDR_A").unwrap_or_else(|_| "127.0.0.1".into()),
        addr_b: std::env::var("RXFER_ADDR_B").ok(),
    })
}

/// True if `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------
// The one wait loop.

/// Reads `source` every 20 ms until `done` holds for what it read, and
/// returns that reading; fails the test after `timeout`, naming `what` it
/// waited for and showing the last reading.
pub fn wait_until<T: Display>(
    what: &str,
    mut source: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
    timeout: Duration,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let now = source();
        if done(&now) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "waited {timeout:?} for {what}; last seen:\n{now}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Binaries.

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

// ---------------------------------------------------------------------------
// Test data.

/// A source and a destination directory.
pub fn dirs() -> (TempDir, TempDir) {
    (
        tempfile::tempdir().expect("src dir"),
        tempfile::tempdir().expect("dst dir"),
    )
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

pub fn sha256_hex(data: &[u8]) -> String {
    hex(&Sha256::digest(data))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Asserts that no temporary file of the receiver is left in `dir`.
pub fn assert_no_temp_files(dir: &Path) {
    for entry in std::fs::read_dir(dir).expect("read output dir") {
        let name = entry.expect("dir entry").file_name();
        let name = name.to_string_lossy();
        // The key of partial-file records stays (made by --resume).
        assert!(
            !name.starts_with(".rdma-xfer-") || name == ".rdma-xfer-key",
            "temporary file {name} left behind in {}",
            dir.display()
        );
    }
}

/// Every non-empty line of a tool's --json stdout or --log-format json
/// stderr, parsed; `who` names the tool in a failure.
pub fn json_lines(who: &str, text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("{who} printed a non-JSON line ({e}): {l:?}"))
        })
        .collect()
}

// ---------------------------------------------------------------------------
// The one process helper.

/// Output of a finished process.
pub struct Finished {
    pub status: ExitStatus,
    pub stderr: String,
    /// Empty unless the process printed there (--json, `script`, the raw
    /// client's one line per message).
    pub stdout: String,
}

impl Finished {
    pub fn code(&self) -> i32 {
        self.status.code().unwrap_or(-1)
    }

    /// Exit, stdout and stderr, for a failure message.
    pub fn transcript(&self) -> String {
        format!(
            "exit {}\nstdout:\n{}stderr:\n{}",
            self.code(),
            self.stdout,
            self.stderr
        )
    }

    /// The lines of stdout.
    pub fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// Stdout lines of one kind, by first word (the raw client's `REJECT`,
    /// `ACK`, `MR`, ...).
    pub fn of_kind(&self, kind: &str) -> Vec<&str> {
        self.stdout
            .lines()
            .filter(|l| l.split(' ').next() == Some(kind))
            .collect()
    }
}

/// Which output of a process.
#[derive(Clone, Copy, Debug)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// What a wait on a running process saw last: its output so far, and its
/// exit if it exited.
struct Seen {
    name: &'static str,
    text: String,
    exited: Option<ExitStatus>,
}

impl Display for Seen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.exited {
            Some(status) => writeln!(f, "({} exited: {status})", self.name)?,
            None => writeln!(f, "({} still running)", self.name)?,
        }
        f.write_str(&self.text)
    }
}

/// A child process this test started, its stdin null, its stdout and
/// stderr collected by threads. Dropping it kills the process if it still
/// runs, so a failed test never leaves one behind.
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

    /// Sends `signal` (`TERM`, `KILL`, ...) to the process, which this test
    /// started.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{signal} {}", self.name);
    }

    pub fn stderr_so_far(&self) -> String {
        self.stderr.lock().expect("stderr lock").clone()
    }

    pub fn stdout_so_far(&self) -> String {
        self.stdout.lock().expect("stdout lock").clone()
    }

    /// Waits until `found` finds something in the process's `stream` so far
    /// and returns it; fails the test if the process exits first, or after
    /// `timeout`. `what` names what is awaited.
    pub fn wait_for<T>(
        &mut self,
        stream: Stream,
        what: &str,
        timeout: Duration,
        mut found: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let name = self.name;
        let seen = wait_until(
            &format!("{name} to print {what} on {stream:?}"),
            || {
                let exited = self.child.try_wait().ok().flatten();
                if exited.is_some() {
                    // A last look: the readers may still hold its last lines.
                    std::thread::sleep(Duration::from_millis(100));
                }
                let text = match stream {
                    Stream::Stdout => self.stdout_so_far(),
                    Stream::Stderr => self.stderr_so_far(),
                };
                Seen { name, text, exited }
            },
            |seen| seen.exited.is_some() || found(&seen.text).is_some(),
            timeout,
        );
        found(&seen.text).unwrap_or_else(|| {
            panic!(
                "{name} exited before printing {what} on {stream:?}:\n{seen}\nstderr:\n{}",
                self.stderr_so_far()
            )
        })
    }

    /// Waits until stderr contains `needle`; returns stderr so far.
    pub fn wait_for_stderr(&mut self, needle: &str, timeout: Duration) -> String {
        self.wait_for(Stream::Stderr, &format!("{needle:?}"), timeout, |t| {
            t.contains(needle).then(|| t.to_string())
        })
    }

    /// Waits until stdout contains `needle` (for a tool run under `script`,
    /// whose terminal output arrives on stdout).
    pub fn wait_for_stdout(&mut self, needle: &str, timeout: Duration) {
        self.wait_for(Stream::Stdout, &format!("{needle:?}"), timeout, |t| {
            t.contains(needle).then_some(())
        })
    }

    /// Waits until stdout has `n` complete lines; returns stdout so far.
    pub fn wait_for_stdout_lines(&mut self, n: usize, timeout: Duration) -> String {
        self.wait_for(Stream::Stdout, &format!("{n} lines"), timeout, |t| {
            (t.lines().count() >= n).then(|| t.to_string())
        })
    }

    /// Waits for the first stdout line starting with `prefix` and returns it.
    pub fn wait_for_line(&mut self, prefix: &str, timeout: Duration) -> String {
        self.wait_for(
            Stream::Stdout,
            &format!("a line {prefix:?}..."),
            timeout,
            |t| {
                t.lines()
                    .find(|l| l.starts_with(prefix))
                    .map(str::to_string)
            },
        )
    }

    /// Waits for exit; kills the process after `timeout` and fails, so a
    /// hang never hangs the suite.
    pub fn wait(mut self, timeout: Duration) -> Finished {
        let name = self.name;
        let exited = wait_until(
            &format!("{name} to exit"),
            || Seen {
                name,
                exited: self.child.try_wait().expect("try_wait"),
                text: self.stderr_so_far(),
            },
            |seen| seen.exited.is_some(),
            timeout,
        );
        // Not reached on a timeout: Drop kills the process.
        let status = exited.exited.expect("exited");
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

// ---------------------------------------------------------------------------
// The tools' command lines.

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
    start_receiver_bin(receiver_bin(), net, port, dir, extra, env)
}

/// As `start_receiver_env`, with another build of the receiver (see
/// `fault_injection_bin`).
pub fn start_receiver_bin(
    bin: &str,
    net: &Net,
    port: u16,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Running {
    spawn_receiver(Command::new(bin), net, port, dir, extra, env)
}

/// The command line of `start_receiver_env`, not started (to run it
/// through another program: `under_memlock`).
pub fn receiver_cmd(
    net: &Net,
    port: u16,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Command {
    receiver_args(Command::new(receiver_bin()), net, port, dir, extra, env)
}

/// Starts a receiver's command line (`receiver_cmd`) and waits until it
/// listens.
pub fn start_receiver_cmd(cmd: Command) -> Running {
    let mut r = Running::spawn("receiver", cmd);
    r.wait_for_stderr("listening", Duration::from_secs(60));
    r
}

/// Adds the receiver's arguments to `cmd` (the receiver itself or a shell
/// that runs it), starts it and waits until it listens.
fn spawn_receiver(
    cmd: Command,
    net: &Net,
    port: u16,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Running {
    start_receiver_cmd(receiver_args(cmd, net, port, dir, extra, env))
}

/// Adds the receiver's arguments and environment to `cmd`.
fn receiver_args(
    mut cmd: Command,
    net: &Net,
    port: u16,
    dir: &Path,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Command {
    cmd.args(["--bind", &net.addr_a, "--port", &port.to_string()])
        .arg("--dir")
        .arg(dir)
        .arg("-v")
        .args(extra);
    // A receiver needs a token or --insecure: tests that give no token
    // run the insecure receiver.
    if needs_insecure(extra, env) {
        cmd.arg("--insecure");
    }
    token_env(&mut cmd, None);
    // The tools' defaults are under test, not the developer's shell.
    cmd.env_remove("RDMA_XFER_ACK_TIMEOUT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

/// Whether a receiver started with `extra` and `env` has neither a token
/// (`--token-file`, RDMA_XFER_TOKEN) nor --insecure.
pub fn needs_insecure(extra: &[&str], env: &[(&str, &str)]) -> bool {
    !extra
        .iter()
        .any(|a| matches!(*a, "--token-file" | "--insecure"))
        && !env.iter().any(|(k, _)| *k == "RDMA_XFER_TOKEN")
}

/// As `start_receiver`, run with the given umask (through `sh -c`, so
/// the test controls what received modes are masked with).
pub fn start_receiver_umask(
    net: &Net,
    port: u16,
    dir: &Path,
    extra: &[&str],
    umask: &str,
    env: &[(&str, &str)],
) -> Running {
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &format!("umask {umask} && exec \"$0\" \"$@\"")])
        .arg(receiver_bin());
    spawn_receiver(cmd, net, port, dir, extra, env)
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
    cmd.args(["--port", &port.to_string(), "-v"])
        .env_remove("RDMA_XFER_ACK_TIMEOUT");
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

/// One session across the wire: a receiver with `--once` and
/// `receiver_extra` writing into `dst`, a sender of `files` with
/// `sender_extra`; returns both runs (sender, receiver), whatever their
/// exit.
pub fn one_session(
    net: &Net,
    path: Path_,
    dst: &Path,
    receiver_extra: &[&str],
    files: &[PathBuf],
    sender_extra: &[&str],
) -> (Finished, Finished) {
    let port = next_port();
    let mut extra = vec!["--once"];
    extra.extend(receiver_extra);
    let receiver = start_receiver(net, port, dst, &extra);
    let sent = run_sender(net, port, path, files, sender_extra);
    (sent, receiver.wait(Duration::from_secs(120)))
}

/// Asserts that both ends of a session exited 0 (the sender's and the
/// receiver's logs in the failure).
pub fn assert_both_ok(sent: &Finished, received: &Finished) {
    assert_eq!(
        sent.code(),
        0,
        "sender:\n{}\nreceiver:\n{}",
        sent.stderr,
        received.stderr
    );
    assert_eq!(received.code(), 0, "receiver:\n{}", received.stderr);
}

/// `--token-file FILE` with a token made once per test process: for
/// receivers that need one (--exec, --link-dest and --overwrite are
/// refused with --insecure) and the senders that talk to them. (A token
/// makes sha256 the default digest.)
pub fn token_args() -> [&'static str; 2] {
    use std::os::unix::fs::OpenOptionsExt;
    static FILE: std::sync::OnceLock<(TempDir, String)> = std::sync::OnceLock::new();
    let (_, path) = FILE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("token dir");
        let path = dir.path().join("token");
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .expect("token file");
        f.write_all(b"a token the tests share, long enough\n")
            .expect("write token");
        (dir, path.to_str().expect("utf8").to_string())
    });
    ["--token-file", path]
}

/// `a` and `b` as one argument list.
pub fn args<'a>(a: &[&'a str], b: &[&'a str]) -> Vec<&'a str> {
    a.iter().chain(b).copied().collect()
}

/// Sets RDMA_XFER_TOKEN to `token` for `cmd`, or removes it.
pub fn token_env(cmd: &mut Command, token: Option<&str>) {
    match token {
        Some(t) => cmd.env("RDMA_XFER_TOKEN", t),
        None => cmd.env_remove("RDMA_XFER_TOKEN"),
    };
}

/// The exact size on NAME's per-file line (`NAME: 3.0 MiB (3145745 bytes)
/// in ...`, as a tool run with -v prints it).
pub fn bytes_of_file_line(stderr: &str, name: &str) -> Option<u64> {
    stderr
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}: ")))
        .and_then(|rest| rest.split_once(" ("))
        .and_then(|(_, rest)| rest.split_once(" bytes)"))
        .and_then(|(n, _)| n.parse().ok())
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

// ---------------------------------------------------------------------------
// Memory limits.

/// The memlock limit of a stock host (Debian 12, fresh VMs, a
/// non-interactive ssh session): 8 MiB, soft and hard.
pub const STOCK_MEMLOCK: u64 = 8 << 20;

/// Who runs a tool under a memlock limit (`under_memlock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// This process's user with its capabilities (root in the guest:
    /// CAP_IPC_LOCK, which lets the kernel pin past the limit).
    Myself,
    /// This user without CAP_IPC_LOCK (dropped by root with setpriv; a
    /// plain user has none).
    WithoutIpcLock,
    /// The plain user nobody (65534), as setpriv makes it: no capability,
    /// no groups. It needs /dev/infiniband/* open to all
    /// (`open_rdma_devices_to_all`) and directories it may use.
    Nobody,
}

/// `cmd` (program, arguments, environment, directory) run through
/// `prlimit` with RLIMIT_MEMLOCK `bytes`, soft and hard, as `who`. Fails
/// the test if prlimit or setpriv is missing.
pub fn under_memlock(bytes: u64, who: RunAs, cmd: &Command) -> Command {
    for tool in ["prlimit", "setpriv"] {
        assert!(have(tool), "{tool} (util-linux) is needed");
    }
    let mut wrapped = Command::new("prlimit");
    wrapped.arg(format!("--memlock={bytes}:{bytes}"));
    let root = rustix::process::geteuid().is_root();
    match who {
        RunAs::Myself => {}
        RunAs::WithoutIpcLock if !root => {}
        RunAs::WithoutIpcLock => {
            // Out of the bounding and inheritable sets, so that the exec
            // (which gives root its bounding set) does not bring it back.
            wrapped.args([
                "setpriv",
                "--inh-caps=-ipc_lock",
                "--bounding-set=-ipc_lock",
            ]);
        }
        RunAs::Nobody => {
            wrapped.args([
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ]);
        }
    }
    wrapped.arg(cmd.get_program()).args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => wrapped.env(key, v),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// Lets every user open the RDMA devices (the guest has no udev: they are
/// root's only), as a stock host's udev rules do.
pub fn open_rdma_devices_to_all() {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir("/dev/infiniband").expect("/dev/infiniband") {
        let path = entry.expect("device entry").path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .unwrap_or_else(|e| panic!("chmod 666 {}: {e}", path.display()));
    }
}

/// The `Max locked memory` soft and hard limits of a running process
/// (/proc/PID/limits), in bytes; None: unlimited or unreadable.
pub fn memlock_limits_of(pid: u32) -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let mut numbers = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .map(|w| w.parse::<u64>().ok());
    Some((numbers.next()??, numbers.next()??))
}

// ---------------------------------------------------------------------------
// The raw client (the test side of src/bin/rxfer-raw-client.rs).

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

// ---------------------------------------------------------------------------
// Faults injected into a running transfer (the guest's wire, its devices).

/// Waits until the receiver's temporary file in `dir` holds `bytes`, so a
/// fault lands in the middle of the data phase.
pub fn wait_for_partial_file(dir: &Path, bytes: u64) {
    let largest_temp_file = || {
        std::fs::read_dir(dir)
            .expect("read dir")
            .filter_map(Result::ok)
            .filter(|e| e.file_name().to_string_lossy().starts_with(".rdma-xfer-"))
            .filter_map(|e| e.metadata().ok().map(|m| m.len()))
            .max()
            .unwrap_or(0)
    };
    wait_until(
        &format!("a temporary file of {bytes} bytes"),
        largest_temp_file,
        |&len| len >= bytes,
        Duration::from_secs(120),
    );
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
