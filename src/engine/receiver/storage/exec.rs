//! `receiver --exec CMD`: each accepted file's bytes go, in order, to the
//! standard input of `sh -c CMD`, run in --dir with a clean environment
//! (PATH and the RDMA_XFER_* variables naming the file). The file counts as
//! received only if its digest matched and CMD exited 0 having read all of
//! it. CMD sees the end of its input only once the data is verified; data
//! that failed its check, or a receiver that dies, ends CMD with a signal
//! first. A slow CMD holds the session's writes, and so the sender's
//! credits: nothing is buffered beyond the pipe.

use crate::sys::dirfd::DirFd;
use crate::sys::os::{GroupSignal, confined_command, pipe_unread, signal_group, wait_writable};
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, ExitStatus, Stdio};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// What every command of a receiver shares.
#[derive(Debug, Clone)]
pub(in crate::engine::receiver) struct ExecSpec {
    /// The command line, run by `sh -c`.
    pub(in crate::engine::receiver) command: String,
    /// How long the command may take no input, or take to exit once its
    /// input ended, before it is stopped.
    pub(in crate::engine::receiver) stall: Duration,
    /// Its pipe's size (a chunk, so that a write rarely waits twice).
    pub(in crate::engine::receiver) pipe_bytes: usize,
}

/// The command under its file: started, fed, then judged.
pub(in crate::engine::receiver) struct ExecSink {
    name: String,
    size: Option<u64>,
    stall: Duration,
    child: Child,
    /// None once closed (the command saw the end of its input) or once it
    /// closed its end (`taken`).
    stdin: Option<ChildStdin>,
    /// Bytes the command took; Some once it closed its input early, or
    /// exited with some unread (later bytes are checked and dropped).
    closed_after: Option<u64>,
    /// Its exit status, once reaped.
    status: Option<ExitStatus>,
    /// Bytes of the file received so far (fed or, after `closed_after`,
    /// dropped).
    received: u64,
    /// The SHA-256 the sender announced (RDMA_XFER_DIGEST), and the hash
    /// of what came: they must agree before the command sees the end.
    announced: Option<([u8; 32], sha2::Sha256)>,
}

/// How long a command asked to end (SIGTERM) has before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(2);

/// Why a command's file is not received.
pub(in crate::engine::receiver) enum ExecFailure {
    /// The data is not what the sender announced (RDMA_XFER_DIGEST).
    Integrity(String),
    /// The command failed, stopped early or took too long.
    Command(String),
}

impl ExecSpec {
    /// Starts the command for the file `name` (`size`: None for a stream)
    /// from `peer`; `sha256` is the whole-file SHA-256 if the sender sent
    /// it before the data.
    pub(in crate::engine::receiver) fn start(
        &self,
        dir: &DirFd,
        name: &str,
        size: Option<u64>,
        peer: &str,
        sha256: Option<[u8; 32]>,
    ) -> std::io::Result<ExecSink> {
        let path =
            std::env::var_os("PATH").unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
        // Kept open until the command is spawned (see `confined_command`).
        let dir = dir.as_file()?;
        let mut cmd = confined_command("/bin/sh", &dir);
        cmd.arg("-c")
            .arg(&self.command)
            .env_clear()
            .env("PATH", path)
            // The name only ever reaches the command as a value, never in
            // its command line.
            .env("RDMA_XFER_NAME", name)
            .env("RDMA_XFER_PEER", peer)
            .stdin(Stdio::piped())
            // Our stdout carries --json results: the command's output goes
            // with our logs.
            .stdout(Stdio::from(std::io::stderr().as_fd().try_clone_to_owned()?))
            .stderr(Stdio::inherit())
            // Its own group: a signal for the receiver's terminal is ours to
            // handle, and ending the command ends what it started.
            .process_group(0);
        if let Some(size) = size {
            cmd.env("RDMA_XFER_SIZE", size.to_string());
        }
        if let Some(sha256) = sha256 {
            let hex = crate::engine::digest::digest_hex(&crate::proto::Digest::Sha256(sha256));
            cmd.env("RDMA_XFER_DIGEST", format!("sha256:{hex}"));
        }
        let mut child = cmd.spawn()?;
        drop(dir);
        let stdin = child.stdin.take();
        if let Some(s) = &stdin {
            crate::engine::stdio::grow_pipe(s, self.pipe_bytes);
            if let Err(e) = crate::sys::os::set_nonblocking(s.as_fd(), "fcntl") {
                let mut sink = ExecSink::new(name, size, self.stall, child, None);
                sink.stop();
                return Err(std::io::Error::other(e));
            }
        }
        debug!(file = %name, pid = child.id(), "--exec command started");
        let mut sink = ExecSink::new(name, size, self.stall, child, stdin);
        sink.announced = sha256.map(|d| (d, <sha2::Sha256 as sha2::Digest>::new()));
        Ok(sink)
    }
}

impl ExecSink {
    fn new(
        name: &str,
        size: Option<u64>,
        stall: Duration,
        child: Child,
        stdin: Option<ChildStdin>,
    ) -> Self {
        ExecSink {
            name: name.to_string(),
            size,
            stall,
            child,
            stdin,
            closed_after: None,
            status: None,
            received: 0,
            announced: None,
        }
    }

    /// Feeds the next bytes of the file (`written` came before). Waits
    /// while the pipe is full, up to the stall limit; a command that
    /// closed its input takes nothing more, and that is judged at commit.
    pub(in crate::engine::receiver) fn write(
        &mut self,
        mut data: &[u8],
        written: u64,
    ) -> std::io::Result<()> {
        self.received = written + data.len() as u64;
        if let Some((_, hasher)) = self.announced.as_mut() {
            sha2::Digest::update(hasher, data);
        }
        if self.closed_after.is_some() {
            return Ok(());
        }
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(std::io::Error::other(
                "the --exec command's input is closed",
            ));
        };
        let mut deadline = Instant::now() + self.stall;
        let mut done = 0u64;
        while !data.is_empty() {
            match stdin.write(data) {
                Ok(n) => {
                    data = &data[n..];
                    done += n as u64;
                    deadline = Instant::now() + self.stall;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    match wait_writable(stdin.as_fd(), deadline) {
                        Ok(true) => {}
                        Ok(false) => {
                            return Err(std::io::Error::new(
                                std::io::ErrorKind::TimedOut,
                                format!(
                                    "the --exec command took no input for {:.1} s: stopped",
                                    self.stall.as_secs_f64()
                                ),
                            ));
                        }
                        Err(e) => return Err(std::io::Error::other(e)),
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
                    self.closed_after = Some(written + done);
                    self.stdin = None;
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The data is verified: the command sees the end of its input, and
    /// its exit decides. Ok only if it read every byte and exited 0.
    pub(in crate::engine::receiver) fn finish(&mut self) -> Result<(), ExecFailure> {
        if let Some((announced, hasher)) = self.announced.take()
            && <[u8; 32]>::from(sha2::Digest::finalize(hasher)) != announced
        {
            self.stop();
            return Err(ExecFailure::Integrity(
                "the data's SHA-256 is not the one announced before it (RDMA_XFER_DIGEST): \
                 the --exec command was stopped"
                    .into(),
            ));
        }
        self.drained()?;
        drop(self.stdin.take());
        let stall = self.stall;
        let status = match self.wait(stall) {
            Some(status) => status,
            None => {
                self.stop();
                return Err(ExecFailure::Command(format!(
                    "the --exec command did not exit within {:.1} s after its input ended: stopped",
                    stall.as_secs_f64()
                )));
            }
        };
        let how = describe(status);
        if let Some(taken) = self.closed_after {
            let of = self.size.unwrap_or(self.received);
            return Err(ExecFailure::Command(format!(
                "the --exec command stopped reading after {taken} of {of} bytes ({how})"
            )));
        }
        if status.success() {
            Ok(())
        } else {
            Err(ExecFailure::Command(format!("the --exec command {how}")))
        }
    }

    /// Waits until the command read everything in its pipe, or exited
    /// without (then `closed_after` says how much it took), up to the stall
    /// limit: a command that exits with input unread did not take the file.
    fn drained(&mut self) -> Result<(), ExecFailure> {
        let Some(stdin) = self.stdin.as_ref() else {
            return Ok(());
        };
        let until = Instant::now() + self.stall;
        loop {
            let unread = match pipe_unread(stdin) {
                Ok(0) | Err(_) => return Ok(()),
                Ok(n) => n,
            };
            if let Ok(Some(status)) = self.child.try_wait() {
                self.status = Some(status);
                self.closed_after = Some(self.received.saturating_sub(unread));
                return Ok(());
            }
            if Instant::now() >= until || crate::sys::os::shutdown_requested() {
                self.stop();
                return Err(ExecFailure::Command(format!(
                    "the --exec command took no input for {:.1} s: stopped",
                    self.stall.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Ends the command before it sees the end of its input (the data
    /// failed its check, or the transfer ended): SIGTERM to its group, then
    /// SIGKILL to whatever of it lingers; then it is reaped. Its input
    /// closes last. The group is signalled even when its first process is
    /// gone: another may hold the input (its id is not reused while any
    /// member lives).
    pub(in crate::engine::receiver) fn stop(&mut self) {
        if let Err(e) = signal_group(&self.child, GroupSignal::Terminate) {
            warn!(file = %self.name, "cannot stop the --exec command: {e}");
        }
        self.wait(TERM_GRACE);
        if let Err(e) = signal_group(&self.child, GroupSignal::Kill) {
            warn!(file = %self.name, "cannot kill the --exec command: {e}");
        }
        self.reap();
    }

    /// Waits for the command's exit (and so reaps it); blocking, so only
    /// once it was killed or has exited.
    fn reap(&mut self) {
        if self.status.is_none() {
            match self.child.wait() {
                Ok(status) => self.status = Some(status),
                Err(e) => warn!(file = %self.name, "cannot reap the --exec command: {e}"),
            }
        }
        drop(self.stdin.take());
    }

    /// Its exit status within `limit` (polled), None if it still runs.
    fn wait(&mut self, limit: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.status {
            return Some(status);
        }
        let until = Instant::now() + limit;
        loop {
            match self.child.try_wait() {
                Ok(Some(status)) => {
                    self.status = Some(status);
                    return Some(status);
                }
                Ok(None) if Instant::now() < until && !crate::sys::os::shutdown_requested() => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Ok(None) => return None,
                Err(e) => {
                    warn!(file = %self.name, "cannot wait for the --exec command: {e}");
                    return None;
                }
            }
        }
    }
}

impl Drop for ExecSink {
    /// A command not judged yet (the session ended, the file failed) is
    /// ended and reaped: no orphan, no zombie, no end of input it could
    /// take for a complete file.
    fn drop(&mut self) {
        if self.status.is_none() {
            self.stop();
        }
    }
}

/// "exited with status 1", "was killed by signal 9".
fn describe(status: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exited with status {code}"),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        (None, None) => format!("ended ({status})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(command: &str) -> ExecSpec {
        ExecSpec {
            command: command.into(),
            stall: Duration::from_secs(5),
            pipe_bytes: 1 << 16,
        }
    }

    /// Starts `command` in `dir` for a file `name` of `size` bytes.
    fn start(command: &str, dir: &std::path::Path, size: u64) -> ExecSink {
        let root = DirFd::open(dir).unwrap();
        spec(command)
            .start(&root, "f", Some(size), "p", None)
            .unwrap()
    }

    /// A command's failure text.
    fn failure(r: Result<(), ExecFailure>) -> String {
        match r {
            Ok(()) => panic!("the command's file was taken"),
            Err(ExecFailure::Command(why) | ExecFailure::Integrity(why)) => why,
        }
    }

    #[test]
    fn the_command_gets_the_bytes_the_name_and_a_clean_environment() {
        let dir = tempfile::tempdir().unwrap();
        let root = DirFd::open(dir.path()).unwrap();
        let s = spec(r#"cat > out; env | sort > env; [ "$RDMA_XFER_NAME" = 'a b/$(x)' ]"#);
        let mut sink = s
            .start(&root, "a b/$(x)", Some(200_000), "10.0.0.2", None)
            .unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        for (i, part) in data.chunks(65_536).enumerate() {
            sink.write(part, i as u64 * 65_536).unwrap();
        }
        assert!(sink.finish().is_ok());
        assert_eq!(std::fs::read(dir.path().join("out")).unwrap(), data);
        let env = std::fs::read_to_string(dir.path().join("env")).unwrap();
        let names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .filter(|k| !["PWD", "SHLVL", "_", "OLDPWD"].contains(k))
            .collect();
        assert_eq!(
            names,
            ["PATH", "RDMA_XFER_NAME", "RDMA_XFER_PEER", "RDMA_XFER_SIZE"],
            "{env}"
        );
        assert!(env.contains("RDMA_XFER_SIZE=200000\n"), "{env}");
    }

    #[test]
    fn a_failing_or_early_exiting_command_fails_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut sink = start("cat > /dev/null; exit 3", dir.path(), 3);
        sink.write(b"abc", 0).unwrap();
        assert_eq!(
            failure(sink.finish()),
            "the --exec command exited with status 3"
        );
        // It stops reading after its first bytes: the rest is dropped,
        // and the file fails even though it exits 0.
        let mut sink = start("head -c 10 > /dev/null", dir.path(), 4 << 20);
        let chunk = vec![7u8; 1 << 20];
        for i in 0..4u64 {
            sink.write(&chunk, i << 20).unwrap();
        }
        let err = failure(sink.finish());
        assert!(err.contains("stopped reading after"), "{err}");
        assert!(
            err.ends_with("of 4194304 bytes (exited with status 0)"),
            "{err}"
        );
        // A small file all in the pipe, of which it reads a part and exits
        // 0: no broken pipe, still not taken.
        let mut sink = start("head -c 100 > part", dir.path(), 50_000);
        sink.write(&vec![1u8; 50_000], 0).unwrap();
        let err = failure(sink.finish());
        assert!(err.contains("stopped reading after"), "{err}");
    }

    #[test]
    fn data_that_is_not_the_announced_digest_never_reaches_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let root = DirFd::open(dir.path()).unwrap();
        let s = spec(r#"cat > out && echo "$RDMA_XFER_DIGEST" > digest"#);
        let sha: [u8; 32] = <sha2::Sha256 as sha2::Digest>::digest(b"abc").into();
        let mut sink = s.start(&root, "f", Some(3), "p", Some(sha)).unwrap();
        sink.write(b"abc", 0).unwrap();
        assert!(sink.finish().is_ok());
        let said = std::fs::read_to_string(dir.path().join("digest")).unwrap();
        assert_eq!(
            said.trim(),
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        std::fs::remove_file(dir.path().join("digest")).unwrap();
        let mut sink = s.start(&root, "f", Some(3), "p", Some(sha)).unwrap();
        sink.write(b"abd", 0).unwrap();
        match sink.finish() {
            Err(ExecFailure::Integrity(why)) => {
                assert!(why.contains("not the one announced"), "{why}")
            }
            _ => panic!("an integrity failure"),
        }
        assert!(
            !dir.path().join("digest").exists(),
            "the command saw no end"
        );
    }

    #[test]
    fn a_stopped_command_never_sees_the_end_of_its_input() {
        let dir = tempfile::tempdir().unwrap();
        // It would mark a complete input; it must be ended before that.
        let mut sink = start("cat > out && touch complete", dir.path(), 6);
        sink.write(b"abc", 0).unwrap();
        sink.stop();
        assert!(sink.status.is_some_and(|s| !s.success()));
        assert!(!dir.path().join("complete").exists());
        // Its first process gone, a background one still holding the
        // input is ended too.
        let mut sink = start(
            "exec 3<&0; (cat <&3 > out3 && touch complete3) & exit 0",
            dir.path(),
            6,
        );
        sink.write(b"abc", 0).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        sink.stop();
        std::thread::sleep(Duration::from_millis(200));
        assert!(!dir.path().join("complete3").exists());
        // Dropped unjudged: ended and reaped the same way.
        let sink = start("cat > out2 && touch complete2", dir.path(), 6);
        let pid = sink.child.id();
        drop(sink);
        assert!(!dir.path().join("complete2").exists());
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "reaped: no zombie left"
        );
    }

    #[test]
    fn a_command_that_takes_no_input_is_stopped_at_the_stall_limit() {
        let dir = tempfile::tempdir().unwrap();
        let root = DirFd::open(dir.path()).unwrap();
        let mut s = spec("sleep 30");
        s.stall = Duration::from_millis(300);
        let mut sink = s.start(&root, "f", Some(8 << 20), "p", None).unwrap();
        let chunk = vec![0u8; 1 << 20];
        let started = Instant::now();
        let err = (0..8u64)
            .find_map(|i| sink.write(&chunk, i << 20).err())
            .expect("the pipe fills up");
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(err.to_string().contains("0.3 s"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5));
        // With its input all in the pipe, unread: stopped at the limit too.
        let mut sink = s.start(&root, "f", Some(10), "p", None).unwrap();
        sink.write(b"0123456789", 0).unwrap();
        assert!(failure(sink.finish()).contains("took no input"));
    }
}
