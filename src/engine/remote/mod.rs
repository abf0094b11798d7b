//! The one-command form, `sender FILE... [USER@]HOST:DIR`: the sender
//! starts a receiver on the target over ssh, hands it a one-time token on
//! the ssh channel (its standard input: never a command line, never an
//! environment), and learns from one line of its standard output where it
//! listens. Both ends of that channel live here: the sender's launcher
//! (`launch`, `RemoteReceiver`) and the remote receiver's side (the token
//! line, the bind address, the ready line, the hang-up watch).
//!
//! The channel: sender -> receiver, one line with the token (hex), then
//! nothing; its end (EOF: the sender finished, died or lost ssh) ends the
//! remote receiver. Receiver -> sender, one line `rdma-xfer-ready 1
//! ADDR:PORT` once it listens, with a last word `file` when the sender
//! asked whether scp's PATH is a directory (`--ssh-path`) and it is not:
//! then the one file arrives in PATH's parent under PATH's last
//! component. Other lines on its standard output (a shell's start-up
//! files may print some) are ignored.
//!
//! A host of a relay chain (`receiver --ssh-relay`, the one-command form
//! with several targets) gets the tokens of the hosts after it once they
//! all listen: lines `relay-key ADDR:PORT HEX`, then `relay-keys-end`,
//! after its own token; it answers `rdma-xfer-keys N` once it holds them,
//! and the sender starts the chain only then.

mod far_end;
mod target;
#[cfg(test)]
mod tests;

pub use far_end::{bind_candidates, read_relay_keys, read_token_line, scp_path, watch_hangup};
pub use target::{Target, remote_word, rsh_command};

use crate::error::{ExitCode, XferError};
use crate::proto::Token;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};
use zeroize::Zeroizing;

/// The word that starts the ready line, and the channel's version.
const READY: &str = "rdma-xfer-ready";
const CHANNEL_VERSION: &str = "1";
/// The ready line's last word when PATH names the file (see `scp_path`).
const NAMES_FILE: &str = "file";

/// A relay hop's key line starts with this word, and this line ends them.
const KEY_LINE: &str = "relay-key";
const KEYS_END: &str = "relay-keys-end";
/// The word of a relay hop's answer once it holds the keys.
const KEYS_TAKEN: &str = "rdma-xfer-keys";

/// How long a relay hop may take to answer that it holds its keys.
const KEYS_TIMEOUT: Duration = Duration::from_secs(30);

/// A relay hop's answer once it holds `count` keys.
pub fn keys_taken_line(count: usize) -> String {
    format!("{KEYS_TAKEN} {count}")
}

/// How many keys a relay hop's answer says it holds; None for any other
/// line.
fn parse_keys_taken(line: &str) -> Option<usize> {
    let mut words = line.split_whitespace();
    if words.next() != Some(KEYS_TAKEN) {
        return None;
    }
    let count = words.next()?.parse().ok()?;
    words.next().is_none().then_some(count)
}

/// Random bytes of a one-time token (sent as hex: 64 characters).
pub const ONE_TIME_TOKEN_BYTES: usize = 32;

/// Environment variable naming the remote shell (`-e/--rsh` wins).
pub const RSH_ENV: &str = "RDMA_XFER_RSH";

/// How long a remote receiver may take to go once told to (or once its
/// session ended) before its ssh is killed.
pub const REMOTE_EXIT_GRACE: Duration = Duration::from_secs(5);

/// Lines of the remote's stderr kept to explain a failure.
const STDERR_TAIL: usize = 20;

/// Longest line kept from the remote's output (the rest of a longer one
/// is dropped): a hostile or broken remote cannot grow our memory.
const MAX_REMOTE_LINE: usize = 4096;

/// How long the sender waits for its readers of ssh's output once ssh is
/// gone (a grandchild may hold the pipes open).
const READERS_GRACE: Duration = Duration::from_secs(1);

/// Calls `each` with every line of `pipe` (lossy UTF-8, at most
/// `MAX_REMOTE_LINE` bytes kept of each) until its end or an error; it
/// never stops early, so the remote never blocks on a full pipe.
fn each_line(pipe: impl Read, mut each: impl FnMut(String)) {
    let mut input = BufReader::new(pipe);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut input)
            .take(MAX_REMOTE_LINE as u64)
            .read_until(b'\n', &mut line)
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.last() != Some(&b'\n') {
            // Too long: skip to the end of it, a buffer at a time.
            loop {
                let skipped = match input.fill_buf() {
                    Ok([]) | Err(_) => return each(lossy(&line)),
                    Ok(buf) => match buf.iter().position(|&b| b == b'\n') {
                        Some(i) => Err(i + 1),
                        None => Ok(buf.len()),
                    },
                };
                match skipped {
                    Ok(n) => input.consume(n),
                    Err(n) => {
                        input.consume(n);
                        break;
                    }
                }
            }
        }
        each(lossy(&line));
    }
}

/// A thread that reads ssh's output (a failure to start one is an error,
/// not a panic: a chain of many hosts needs many).
fn reader_thread(
    read: impl FnOnce() + Send + 'static,
) -> Result<std::thread::JoinHandle<()>, XferError> {
    std::thread::Builder::new()
        .name("ssh-output".into())
        .spawn(read)
        .map_err(|e| XferError::io("cannot start a thread to read ssh's output", e))
}

fn lossy(line: &[u8]) -> String {
    String::from_utf8_lossy(line)
        .trim_end_matches(['\n', '\r'])
        .to_string()
}

/// A fresh one-time token: `ONE_TIME_TOKEN_BYTES` random bytes as hex,
/// which is also the token's secret (64 bytes).
/// Every copy of the secret here is wiped when it drops; the text goes on
/// to the remote receiver's stdin.
pub fn one_time_token() -> Result<(Token, Zeroizing<String>), XferError> {
    let mut raw = Zeroizing::new([0u8; ONE_TIME_TOKEN_BYTES]);
    getrandom::fill(raw.as_mut_slice())
        .map_err(|e| XferError::io("no random bytes for a token", std::io::Error::other(e)))?;
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut hex = Zeroizing::new([0u8; 2 * ONE_TIME_TOKEN_BYTES]);
    for (pair, &b) in hex.chunks_exact_mut(2).zip(raw.iter()) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    let text = Zeroizing::new(hex.iter().copied().map(char::from).collect());
    Ok((Token::from_array(&hex), text))
}

/// What a remote receiver says once it listens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// Where it listens.
    pub addr: SocketAddr,
    /// scp's PATH is no directory there: the one file arrives in its
    /// parent under its last component.
    pub path_names_file: bool,
}

/// The ready line for a receiver listening on `ready.addr`.
pub fn ready_line(ready: Ready) -> String {
    let file = if ready.path_names_file {
        format!(" {NAMES_FILE}")
    } else {
        String::new()
    };
    format!("{READY} {CHANNEL_VERSION} {}{file}", ready.addr)
}

/// What a ready line says; None for any other line.
pub fn parse_ready_line(line: &str) -> Option<Ready> {
    let mut words = line.split_whitespace();
    if words.next() != Some(READY) || words.next() != Some(CHANNEL_VERSION) {
        return None;
    }
    let addr = words.next()?.parse().ok()?;
    let path_names_file = match words.next() {
        None => false,
        Some(NAMES_FILE) => true,
        Some(_) => return None,
    };
    words.next().is_none().then_some(Ready {
        addr,
        path_names_file,
    })
}

/// How the sender starts remote receivers.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The remote shell and its options (`ssh` by default).
    pub rsh: Vec<String>,
    /// The receiver program on the remote host (`receiver` on its PATH).
    pub remote_receiver: String,
    /// Options for the remote receiver besides the session's own.
    pub receiver_args: Vec<String>,
    /// How long to wait for the ready line (ssh's log-in included).
    pub timeout: Duration,
    /// One regular file or standard input is sent, without `--name`: a
    /// target's PATH that is no directory there names it, as scp's
    /// (asked with `--ssh-path`).
    pub path_may_name_file: bool,
    /// A host of a relay chain: it serves the sessions of the host before
    /// it until its input ends, and takes the keys of the hosts after it
    /// (`hand_relay_keys`).
    pub relay: bool,
}

/// A receiver started over ssh for one session. Dropped, it tells the
/// remote to go (EOF on its input) and kills its ssh if that does not end
/// within `REMOTE_EXIT_GRACE`.
pub struct RemoteReceiver {
    host: String,
    /// The remote receiver program, for messages.
    program: String,
    child: Child,
    /// Held open for the whole session: its end ends the remote receiver.
    stdin: Option<ChildStdin>,
    /// Where the remote receiver listens.
    pub addr: SocketAddr,
    /// The name the one file arrives under when the target's PATH is no
    /// directory there (PATH's last component, in its parent).
    pub file_name: Option<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
    /// A relay hop's answers that it holds its keys (their count).
    keys_taken: Option<mpsc::Receiver<usize>>,
    ended: bool,
}

/// Starts `receiver --ssh-session` on `target` over the remote shell,
/// writes the token, and waits for the ready line. Each line the remote
/// prints on stderr (its errors, ssh's own) goes to `on_stderr`, labelled
/// with the host.
pub fn launch(
    target: &Target,
    opts: &LaunchOptions,
    token_hex: &str,
    on_stderr: Arc<dyn Fn(&str) + Send + Sync>,
) -> Result<RemoteReceiver, XferError> {
    let mut words = vec![
        remote_word(&opts.remote_receiver),
        "--ssh-session".into(),
        "--timeout".into(),
        format!("{}s", opts.timeout.as_secs().max(1)),
    ];
    words.extend(opts.receiver_args.iter().map(|a| remote_word(a)));
    // Only the remote host knows whether PATH is a directory.
    let file_name = target.file_name().filter(|_| opts.path_may_name_file);
    if file_name.is_some() {
        words.push("--ssh-path".into());
    }
    if opts.relay {
        words.push("--ssh-relay".into());
    }
    words.push("--".into());
    words.push(remote_word(if target.dir.is_empty() {
        "."
    } else {
        &target.dir
    }));
    let Some((program, rsh_args)) = opts.rsh.split_first() else {
        return Err(XferError::Usage("the remote shell command is empty".into()));
    };
    let mut cmd = Command::new(program);
    cmd.args(rsh_args)
        .arg(&target.login)
        .arg(words.join(" "))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    tracing::debug!(host = %target.host, command = ?cmd, "starting the remote receiver");
    let mut child = cmd.spawn().map_err(|e| {
        let code = if e.kind() == std::io::ErrorKind::NotFound {
            ExitCode::Usage
        } else {
            ExitCode::Other
        };
        XferError::Remote {
            host: target.host.clone(),
            code,
            message: format!("cannot run the remote shell `{program}`: {e}"),
        }
    })?;
    let stdin = child.stdin.take();
    let (stdout, stderr_pipe) = (child.stdout.take(), child.stderr.take());
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let mut remote = RemoteReceiver {
        host: target.host.clone(),
        program: opts.remote_receiver.clone(),
        child,
        stdin,
        addr: SocketAddr::from(([0, 0, 0, 0], 0)),
        file_name: None,
        stderr: stderr.clone(),
        readers: Vec::new(),
        keys_taken: None,
        ended: false,
    };
    // Before it listens, the receiver's own error is said once, in the
    // sender's error (`failed_to_start`); everything else is shown as it
    // comes (ssh's prompts and warnings, the session's errors).
    let listening = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(pipe) = stderr_pipe {
        let host = target.host.clone();
        let listening = listening.clone();
        remote.readers.push(reader_thread(move || {
            each_line(pipe, |line| {
                let held = line.starts_with("receiver: error: ")
                    && !listening.load(std::sync::atomic::Ordering::SeqCst);
                if !held {
                    on_stderr(&format!("{host}: {}", crate::proto::escaped(&line)));
                }
                let mut tail = stderr.lock().unwrap_or_else(PoisonError::into_inner);
                if tail.len() == STDERR_TAIL {
                    tail.remove(0);
                }
                tail.push(line);
            })
        })?);
    }
    let (ready_tx, ready_rx) = mpsc::channel();
    let (keys_tx, keys_rx) = mpsc::channel();
    remote.keys_taken = Some(keys_rx);
    if let Some(pipe) = stdout {
        let listening = listening.clone();
        remote.readers.push(reader_thread(move || {
            let (mut told, mut keys_told) = (false, false);
            each_line(pipe, |line| {
                if !told && let Some(ready) = parse_ready_line(&line) {
                    told = true;
                    listening.store(true, std::sync::atomic::Ordering::SeqCst);
                    let _ = ready_tx.send(ready);
                } else if told
                    && !keys_told
                    && let Some(count) = parse_keys_taken(&line)
                {
                    // Once: a remote that says it again is not heard.
                    keys_told = true;
                    let _ = keys_tx.send(count);
                }
            })
        })?);
    }
    // ssh may already have failed (EPIPE): its status says why.
    let wrote = remote.stdin.as_mut().map(|s| {
        // Two writes, so that no other copy of the secret is made.
        s.write_all(token_hex.as_bytes())
            .and_then(|()| s.write_all(b"\n"))
            .and_then(|()| s.flush())
    });
    if let Some(Err(e)) = wrote {
        tracing::debug!("cannot hand the token to ssh: {e}");
    }
    // In slices, so that Ctrl-C is not kept waiting for ssh.
    let deadline = Instant::now() + opts.timeout;
    let answer = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match ready_rx.recv_timeout(left.min(Duration::from_millis(100))) {
            Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                if crate::sys::os::shutdown_requested() {
                    return Err(crate::sys::SysError::Interrupted.into());
                }
            }
            other => break other,
        }
    };
    match answer {
        // A wildcard says nothing about where to connect.
        Ok(ready) if ready.addr.ip().is_unspecified() => Err(XferError::Remote {
            host: target.host.clone(),
            code: ExitCode::Usage,
            message: format!(
                "the receiver on {} listens on {}, every address: give --remote-bind the \
                 one to connect to",
                target.host, ready.addr
            ),
        }),
        Ok(ready) => {
            remote.addr = ready.addr;
            // Said only when asked; a remote that says it unasked is not
            // obeyed.
            remote.file_name = file_name
                .filter(|_| ready.path_names_file)
                .map(str::to_string);
            // From now on its errors are the session's: shown as they come.
            listening.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(remote)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(remote.failed_to_start(&target.login)),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(XferError::Remote {
            host: target.host.clone(),
            code: ExitCode::CannotConnect,
            message: format!(
                "no answer from the receiver on {} within {} s (ssh still logging in, or the \
                 host slow to start it)",
                target.login,
                opts.timeout.as_secs()
            ),
        }),
    }
}

impl RemoteReceiver {
    /// Why ssh ended before the ready line: its exit status and the last
    /// thing it (or the remote receiver) said.
    fn failed_to_start(&mut self, login: &str) -> XferError {
        self.stdin = None;
        let mut status = wait_until(&mut self.child, Instant::now() + REMOTE_EXIT_GRACE);
        if status.is_none() {
            let _ = self.child.kill();
            status = self.child.wait().ok();
        }
        self.ended = true;
        self.join_readers();
        let tail = self.stderr_tail();
        // What the remote says is shown, never obeyed (escape sequences).
        let said = last_error_line(&tail).map(|l| crate::proto::escaped(l).to_string());
        let said = said.as_deref();
        let (code, message) = match status.and_then(|s| s.code()) {
            // It ended well, but never said where it listens: not ours.
            Some(0) => (
                ExitCode::Other,
                format!(
                    "the receiver on {} ended without saying where it listens (is `{}` there \
                     rdma-xfer's receiver? does a start-up file of the remote shell exit?){}",
                    self.host,
                    self.program,
                    said.map(|s| format!(": {s}")).unwrap_or_default()
                ),
            ),
            Some(255) => (
                ssh_failure_class(said.unwrap_or("")),
                format!(
                    "ssh to {login} failed: {}",
                    said.unwrap_or("no reason given")
                ),
            ),
            Some(127) => (
                ExitCode::Usage,
                format!(
                    "no receiver program on {}: install rdma-xfer there, or name it with \
                     --remote-receiver PATH{}",
                    self.host,
                    said.map(|s| format!(" ({s})")).unwrap_or_default()
                ),
            ),
            Some(126) => (
                ExitCode::Usage,
                format!(
                    "the receiver program on {} cannot be run{}",
                    self.host,
                    said.map(|s| format!(" ({s})")).unwrap_or_default()
                ),
            ),
            Some(n) => {
                let code = exit_code_from(n);
                let why = said.unwrap_or("it gave no reason").to_string();
                let unknown = |flag: &str| tail.iter().any(|l| l.contains(flag));
                let hint = if unknown("--ssh-relay") {
                    " (the receiver there is older than this sender and cannot be a host of a \
                     relay chain: install the same version, or name it with --remote-receiver \
                     PATH, or copy to each host directly with --no-relay)"
                } else if unknown("--ssh-session") || unknown("--ssh-path") {
                    " (the receiver there may be older than this sender: install the same \
                     version, or name it with --remote-receiver PATH)"
                } else {
                    ""
                };
                (
                    code,
                    format!(
                        "the receiver on {} exited with status {n}: {why}{hint}",
                        self.host
                    ),
                )
            }
            None => (
                ExitCode::Other,
                format!(
                    "ssh to {login} ended without a status: {}",
                    said.unwrap_or("no reason given")
                ),
            ),
        };
        XferError::Remote {
            host: self.host.clone(),
            code,
            message,
        }
    }

    /// Hands a relay hop the tokens of the hosts after it, each under its
    /// name in the chain, and waits until it says it holds them all.
    pub fn hand_relay_keys(&mut self, keys: &[(String, &str)]) -> Result<(), XferError> {
        let lost = |e: std::io::Error| XferError::Remote {
            host: self.host.clone(),
            code: ExitCode::TimeoutOrPeerLost,
            message: format!("cannot hand the next hosts' tokens to ssh: {e}"),
        };
        let Some(stdin) = self.stdin.as_mut() else {
            return Err(lost(std::io::ErrorKind::BrokenPipe.into()));
        };
        // In pieces, so that no other copy of a secret is made.
        let mut wrote = Ok(());
        for (name, hex) in keys {
            wrote = wrote
                .and_then(|()| write!(stdin, "{KEY_LINE} {name} "))
                .and_then(|()| stdin.write_all(hex.as_bytes()))
                .and_then(|()| stdin.write_all(b"\n"));
        }
        wrote = wrote
            .and_then(|()| writeln!(stdin, "{KEYS_END}"))
            .and_then(|()| stdin.flush());
        wrote.map_err(lost)?;
        // In slices, so that Ctrl-C is not kept waiting.
        let deadline = Instant::now() + KEYS_TIMEOUT;
        let answer = loop {
            let Some(rx) = self.keys_taken.as_ref() else {
                break None;
            };
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left.min(Duration::from_millis(100))) {
                Err(mpsc::RecvTimeoutError::Timeout) if !left.is_zero() => {
                    if crate::sys::os::shutdown_requested() {
                        return Err(crate::sys::SysError::Interrupted.into());
                    }
                }
                Ok(count) => break Some(count),
                Err(_) => break None,
            }
        };
        match answer {
            Some(count) if count == keys.len() => Ok(()),
            Some(count) => Err(XferError::Remote {
                host: self.host.clone(),
                code: ExitCode::Other,
                message: format!(
                    "the receiver there holds {count} of the {} tokens handed to it",
                    keys.len()
                ),
            }),
            _ => Err(XferError::Remote {
                host: self.host.clone(),
                code: ExitCode::TimeoutOrPeerLost,
                message: format!(
                    "the receiver there did not take the next hosts' tokens within {} s{}",
                    KEYS_TIMEOUT.as_secs(),
                    last_error_line(&self.stderr_tail())
                        .map(|l| format!(": {}", crate::proto::escaped(l)))
                        .unwrap_or_default()
                ),
            }),
        }
    }

    /// Whether its ssh (and so the receiver there) is still running.
    pub fn is_running(&mut self) -> bool {
        !self.ended && matches!(self.child.try_wait(), Ok(None))
    }

    /// Ends the remote receiver now (its input closed: it stops at once),
    /// before the session that owns it is over: a host given up on.
    pub fn hang_up(&mut self) {
        self.end(false);
    }

    /// The last lines the remote printed on stderr.
    pub fn stderr_tail(&self) -> Vec<String> {
        self.stderr
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Ends the remote receiver. After a session that ended well it is
    /// given `REMOTE_EXIT_GRACE` to finish on its own (it serves one
    /// session); otherwise, or then, its input is closed (it stops at
    /// once: nothing unverified is renamed into place) and after another
    /// grace its ssh is killed. Returns its exit status, when known.
    pub fn finish(mut self, session_ok: bool) -> Option<i32> {
        let status = self.end(session_ok);
        status.and_then(|s| s.code())
    }

    fn end(&mut self, session_ok: bool) -> Option<std::process::ExitStatus> {
        if self.ended {
            return None;
        }
        self.ended = true;
        let mut status = None;
        if session_ok {
            status = wait_until(&mut self.child, Instant::now() + REMOTE_EXIT_GRACE);
        }
        self.stdin = None;
        if status.is_none() {
            status = wait_until(&mut self.child, Instant::now() + REMOTE_EXIT_GRACE);
        }
        if status.is_none() {
            tracing::warn!(
                "the receiver on {} did not end within {} s: killing its ssh",
                self.host,
                REMOTE_EXIT_GRACE.as_secs()
            );
            let _ = self.child.kill();
            status = self.child.wait().ok();
        }
        self.join_readers();
        status
    }

    /// Waits a little for the readers of ssh's output; a grandchild of
    /// ssh (a ProxyCommand, say) may hold the pipes open, and then they
    /// are left to end on their own.
    fn join_readers(&mut self) {
        let deadline = Instant::now() + READERS_GRACE;
        for r in self.readers.drain(..) {
            while !r.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if r.is_finished() {
                let _ = r.join();
            }
        }
    }
}

impl Drop for RemoteReceiver {
    fn drop(&mut self) {
        self.end(false);
    }
}

/// Waits for `child` until `deadline`; None if it is still running.
fn wait_until(child: &mut Child, deadline: Instant) -> Option<std::process::ExitStatus> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

/// What kind of failure ssh's own exit (255) was, by its message: a
/// name that does not resolve is a usage error (as in the direct form),
/// a refused log-in or host key a rejection; neither is worth retrying.
/// Anything else (refused, unreachable, timed out) is "cannot connect".
fn ssh_failure_class(said: &str) -> ExitCode {
    if said.contains("Could not resolve hostname") || said.contains("Name or service not known") {
        ExitCode::Usage
    } else if said.contains("Permission denied")
        || said.contains("Host key verification failed")
        || said.contains("REMOTE HOST IDENTIFICATION HAS CHANGED")
    {
        ExitCode::Rejected
    } else {
        ExitCode::CannotConnect
    }
}

/// A remote tool's exit status as ours (unknown ones: "other").
fn exit_code_from(n: i32) -> ExitCode {
    match n {
        0 => ExitCode::Ok,
        2 => ExitCode::Usage,
        3 => ExitCode::CannotConnect,
        4 => ExitCode::Rejected,
        5 => ExitCode::Integrity,
        6 => ExitCode::Io,
        7 => ExitCode::TimeoutOrPeerLost,
        8 => ExitCode::NoDevice,
        _ => ExitCode::Other,
    }
}

/// The most telling line of a remote's stderr: the receiver's own error
/// (without its `receiver: error: ` prefix), else its command line's
/// (`error: ...`), else ssh's last line.
fn last_error_line(tail: &[String]) -> Option<&str> {
    tail.iter()
        .rev()
        .find_map(|l| l.strip_prefix("receiver: error: "))
        .or_else(|| tail.iter().rev().find_map(|l| l.strip_prefix("error: ")))
        .or_else(|| tail.iter().rev().map(|l| l.trim()).find(|l| !l.is_empty()))
}
