//! The tools' command lines: `ReceiverCommand` and `SenderCommand` (built up,
//! then started or handed out), one session, tokens, what their logs say.

use super::*;

/// A serving receiver (pass `--once` in `extra` for one session) listening
/// on `net.addr_a`, writing into `dir`.
pub fn start_receiver(net: &Net, port: u16, dir: &Path, extra: &[&str]) -> Running {
    ReceiverCommand::new(net, port, dir).args(extra).start()
}

/// A receiver's command line, built up and then started (`start`: it waits
/// until the receiver listens) or handed out (`command`: to run it through
/// another program, `under_memlock` or strace). It listens on
/// `net.addr_a`, writes into `dir`, logs with -v, and runs `--insecure`
/// unless given a token; RDMA_XFER_TOKEN and RDMA_XFER_ACK_TIMEOUT are
/// removed from its environment unless `env` sets them.
pub struct ReceiverCommand<'a> {
    net: &'a Net,
    port: u16,
    dir: &'a Path,
    bin: String,
    args: Vec<&'a str>,
    env: Vec<(&'a str, &'a str)>,
    umask: Option<&'a str>,
}

impl<'a> ReceiverCommand<'a> {
    pub fn new(net: &'a Net, port: u16, dir: &'a Path) -> Self {
        ReceiverCommand {
            net,
            port,
            dir,
            bin: receiver_bin().to_string(),
            args: Vec::new(),
            env: Vec::new(),
            umask: None,
        }
    }

    /// Another build of the receiver (see `fault_injection_bin`).
    pub fn bin(mut self, bin: &str) -> Self {
        self.bin = bin.to_string();
        self
    }

    /// More arguments.
    pub fn args(mut self, args: &[&'a str]) -> Self {
        self.args.extend_from_slice(args);
        self
    }

    /// More environment.
    pub fn env(mut self, env: &[(&'a str, &'a str)]) -> Self {
        self.env.extend_from_slice(env);
        self
    }

    /// Runs it with this umask (through `sh -c`, so the test controls what
    /// received modes are masked with).
    pub fn umask(mut self, umask: &'a str) -> Self {
        self.umask = Some(umask);
        self
    }

    /// The command line, not started.
    pub fn command(&self) -> Command {
        let mut cmd = match self.umask {
            Some(umask) => {
                let mut sh = Command::new("sh");
                sh.args(["-c", &format!("umask {umask} && exec \"$0\" \"$@\"")])
                    .arg(&self.bin);
                sh
            }
            None => Command::new(&self.bin),
        };
        cmd.args(["--bind", &self.net.addr_a, "--port", &self.port.to_string()])
            .arg("--dir")
            .arg(self.dir)
            .arg("-v")
            .args(&self.args);
        // A receiver needs a token or --insecure: tests that give no token
        // run the insecure receiver.
        if needs_insecure(&self.args, &self.env) {
            cmd.arg("--insecure");
        }
        token_env(&mut cmd, None);
        // The tools' defaults are under test, not the developer's shell.
        cmd.env_remove("RDMA_XFER_ACK_TIMEOUT");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// Starts it and waits until it listens.
    pub fn start(&self) -> Running {
        start_receiver_cmd(self.command())
    }
}

/// Starts a receiver's command line (`ReceiverCommand::command`, perhaps
/// run through another program) and waits until it listens.
pub fn start_receiver_cmd(cmd: Command) -> Running {
    let mut r = Running::spawn("receiver", cmd);
    r.wait_for_stderr("listening", Duration::from_secs(60));
    r
}

/// Whether a receiver started with `extra` and `env` has neither a token
/// (`--token-file`, RDMA_XFER_TOKEN) nor --insecure.
pub fn needs_insecure(extra: &[&str], env: &[(&str, &str)]) -> bool {
    !extra
        .iter()
        .any(|a| matches!(*a, "--token-file" | "--insecure"))
        && !env
            .iter()
            .any(|(k, _)| matches!(*k, "RDMA_XFER_TOKEN" | "XDG_CONFIG_HOME"))
}

/// How the sender reaches the receiver.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Path_ {
    /// From the B address to A: across the veth wire.
    Wire,
    /// To A from A itself: rxe's internal loopback.
    Loopback,
}

/// A sender's command line, built up: to `net.addr_a` on `port` by `path`
/// (from the B address with `--source` across the wire), logging with -v,
/// RDMA_XFER_ACK_TIMEOUT removed. `command` hands it out to spawn.
pub struct SenderCommand<'a> {
    net: &'a Net,
    port: u16,
    path: Path_,
    bin: String,
    args: Vec<&'a str>,
    files: Vec<PathBuf>,
}

impl<'a> SenderCommand<'a> {
    pub fn new(net: &'a Net, port: u16, path: Path_) -> Self {
        SenderCommand {
            net,
            port,
            path,
            bin: sender_bin().to_string(),
            args: Vec::new(),
            files: Vec::new(),
        }
    }

    /// Another build of the sender (see `fault_injection_bin`).
    pub fn bin(mut self, bin: &str) -> Self {
        self.bin = bin.to_string();
        self
    }

    /// More options (before the address).
    pub fn args(mut self, args: &[&'a str]) -> Self {
        self.args.extend_from_slice(args);
        self
    }

    /// What to send (after the address).
    pub fn files(mut self, files: &[PathBuf]) -> Self {
        self.files.extend_from_slice(files);
        self
    }

    /// The command line, not started.
    pub fn command(&self) -> Command {
        let mut cmd = Command::new(&self.bin);
        cmd.args(["--port", &self.port.to_string(), "-v"])
            .env_remove("RDMA_XFER_ACK_TIMEOUT");
        // Without a second address (a host with one RDMA port) the "wire"
        // cases run over that port's loopback.
        if let (Path_::Wire, Some(b)) = (self.path, self.net.addr_b.as_ref()) {
            cmd.args(["--source", b]);
        }
        cmd.args(&self.args).arg(&self.net.addr_a).args(&self.files);
        cmd
    }
}

/// Runs a sender to completion.
pub fn run_sender(
    net: &Net,
    port: u16,
    path: Path_,
    files: &[PathBuf],
    extra: &[&str],
) -> Finished {
    let cmd = SenderCommand::new(net, port, path)
        .files(files)
        .args(extra)
        .command();
    Running::spawn("sender", cmd).wait(Duration::from_secs(600))
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
