//! The one process helper: `Running`, for every binary a test starts
//! (receiver, sender, shell pipelines, the raw client), and `Finished`.

use super::*;

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
