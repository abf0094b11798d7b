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
//! ADDR:PORT` once it listens; other lines on its standard output (a
//! shell's start-up files may print some) are ignored.

use crate::error::{ExitCode, XferError};
use crate::proto::Token;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::time::{Duration, Instant};

/// The word that starts the ready line, and the channel's version.
const READY: &str = "rdma-xfer-ready";
const CHANNEL_VERSION: &str = "1";

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

fn lossy(line: &[u8]) -> String {
    String::from_utf8_lossy(line)
        .trim_end_matches(['\n', '\r'])
        .to_string()
}

/// One `[USER@]HOST:DIR` target as the user wrote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// What ssh logs in to: `[user@]host` (brackets of an IPv6 literal
    /// dropped).
    pub login: String,
    /// The host alone, as results are labelled.
    pub host: String,
    /// The directory on the host ("" is the login's home, as scp's).
    pub dir: String,
}

impl Target {
    /// `[USER@]HOST:DIR` (or `[USER@][IPV6]:DIR`) as a target; None when
    /// `arg` is not of that form: no colon, a slash before the first colon
    /// (a local path such as `./a:b`), or an all-digit part after it (the
    /// direct form's `HOST:PORT`).
    pub fn parse(arg: &str) -> Option<Result<Target, XferError>> {
        let (user, rest) = match arg.split_once('@') {
            Some((u, r)) if !u.contains('/') && !u.contains(':') => (Some(u), r),
            _ => (None, arg),
        };
        let (host, dir) = if let Some(inner) = rest.strip_prefix('[') {
            let (host, after) = inner.split_once(']')?;
            (host, after.strip_prefix(':')?)
        } else {
            // An IPv6 literal without brackets is an address, not a host.
            if rest.parse::<std::net::Ipv6Addr>().is_ok() {
                return None;
            }
            let (host, dir) = rest.split_once(':')?;
            if host.contains('/') {
                return None;
            }
            (host, dir)
        };
        if !dir.is_empty() && dir.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self::checked(arg, user, host, dir))
    }

    fn checked(arg: &str, user: Option<&str>, host: &str, dir: &str) -> Result<Target, XferError> {
        let bad = |why: &str| Err(XferError::Usage(format!("target {arg:?}: {why}")));
        if host.is_empty() {
            return bad("no host before the `:`");
        }
        // ssh would take a leading '-' as an option (option injection).
        if host.starts_with('-') || user.is_some_and(|u| u.is_empty() || u.starts_with('-')) {
            return bad("a host or user may not start with '-' (or be empty)");
        }
        // Host names, IPv4 and IPv6 literals, portable user names only:
        // ssh configurations expand %h and %r into commands.
        let host_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
        let user_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
        if !host.chars().all(host_ok) || !user.unwrap_or("").chars().all(user_ok) {
            return bad(
                "a host may hold letters, digits, '.', '-', '_' (and ':' in [IPV6]); a user \
                 letters, digits, '.', '-', '_'",
            );
        }
        if dir.contains('\0') || dir.contains('\n') {
            return bad("the directory holds a NUL or newline");
        }
        Ok(Target {
            login: match user {
                Some(u) => format!("{u}@{host}"),
                None => host.to_string(),
            },
            host: host.to_string(),
            dir: dir.to_string(),
        })
    }
}

/// A word for the remote shell: quoted, but a leading `~` or `~/` stays
/// outside the quotes so that the remote shell expands it (as scp users
/// expect of `host:~/in`).
pub fn remote_word(word: &str) -> String {
    let quote = |s: &str| match shlex::try_quote(s) {
        Ok(q) => q.into_owned(),
        // Only a NUL fails, which `Target::parse` refuses.
        Err(_) => "''".to_string(),
    };
    if word == "~" {
        return "~".into();
    }
    match word.strip_prefix("~/") {
        Some("") => "~/".into(),
        Some(rest) => format!("~/{}", quote(rest)),
        None => quote(word),
    }
}

/// The remote shell command (`-e/--rsh`, else RDMA_XFER_RSH, else `ssh`),
/// split as a shell would split it.
pub fn rsh_command(option: Option<&str>, env: Option<&str>) -> Result<Vec<String>, XferError> {
    let (text, from) = match (option, env) {
        (Some(o), _) => (o, "--rsh"),
        (None, Some(e)) if !e.trim().is_empty() => (e, RSH_ENV),
        _ => return Ok(vec!["ssh".into()]),
    };
    match shlex::split(text) {
        Some(words) if !words.is_empty() => Ok(words),
        _ => Err(XferError::Usage(format!(
            "{from} {text:?} is not a command (unbalanced quotes, or empty)"
        ))),
    }
}

/// A fresh one-time token: `ONE_TIME_TOKEN_BYTES` random bytes as hex,
/// which is also the token's secret (64 bytes).
pub fn one_time_token() -> Result<(Token, String), XferError> {
    let mut raw = [0u8; ONE_TIME_TOKEN_BYTES];
    getrandom::fill(&mut raw)
        .map_err(|e| XferError::Internal(format!("no random bytes for a token: {e}")))?;
    let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
    raw.fill(0);
    let token = Token::new(hex.clone().into_bytes())
        .ok_or_else(|| XferError::Internal("empty one-time token".into()))?;
    Ok((token, hex))
}

/// The ready line for a receiver listening on `addr`.
pub fn ready_line(addr: SocketAddr) -> String {
    format!("{READY} {CHANNEL_VERSION} {addr}")
}

/// The address in a ready line; None for any other line.
pub fn parse_ready_line(line: &str) -> Option<SocketAddr> {
    let mut words = line.split_whitespace();
    (words.next() == Some(READY) && words.next() == Some(CHANNEL_VERSION))
        .then(|| words.next()?.parse().ok())
        .flatten()
        .filter(|_| words.next().is_none())
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
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
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
        stderr: stderr.clone(),
        readers: Vec::new(),
        ended: false,
    };
    // Before it listens, the receiver's own error is said once, in the
    // sender's error (`failed_to_start`); everything else is shown as it
    // comes (ssh's prompts and warnings, the session's errors).
    let listening = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if let Some(pipe) = stderr_pipe {
        let host = target.host.clone();
        let listening = listening.clone();
        remote.readers.push(std::thread::spawn(move || {
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
        }));
    }
    let (ready_tx, ready_rx) = mpsc::channel();
    if let Some(pipe) = stdout {
        let listening = listening.clone();
        remote.readers.push(std::thread::spawn(move || {
            let mut told = false;
            each_line(pipe, |line| {
                if !told && let Some(addr) = parse_ready_line(&line) {
                    told = true;
                    listening.store(true, std::sync::atomic::Ordering::SeqCst);
                    let _ = ready_tx.send(addr);
                }
            })
        }));
    }
    // ssh may already have failed (EPIPE): its status says why.
    let wrote = remote.stdin.as_mut().map(|s| {
        s.write_all(format!("{token_hex}\n").as_bytes())
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
        Ok(addr) if addr.ip().is_unspecified() => Err(XferError::Remote {
            host: target.host.clone(),
            code: ExitCode::Usage,
            message: format!(
                "the receiver on {} listens on {addr}, every address: give --remote-bind the \
                 one to connect to",
                target.host
            ),
        }),
        Ok(addr) => {
            remote.addr = addr;
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
                let hint = if tail.iter().any(|l| l.contains("--ssh-session")) {
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
/// (without its `receiver: error: ` prefix), else ssh's last line.
fn last_error_line(tail: &[String]) -> Option<&str> {
    tail.iter()
        .rev()
        .find_map(|l| l.strip_prefix("receiver: error: "))
        .or_else(|| tail.iter().rev().map(|l| l.trim()).find(|l| !l.is_empty()))
}

// ---------------------------------------------------------------------------
// The remote receiver's side.

/// Reads the one-time token, the first line of standard input. The rest
/// of the input is the hang-up watch's (`watch_hangup`).
pub fn read_token_line(input: &mut impl BufRead) -> Result<Token, XferError> {
    let mut line = Vec::new();
    // Bounded: a token line is 64 characters.
    input
        .take(1024)
        .read_until(b'\n', &mut line)
        .map_err(|e| XferError::io("cannot read the one-time token from standard input", e))?;
    let ok = line.last() == Some(&b'\n');
    line.pop();
    let hex = line.len() == 2 * ONE_TIME_TOKEN_BYTES && line.iter().all(u8::is_ascii_hexdigit);
    if !ok || !hex {
        line.fill(0);
        return Err(XferError::Usage(
            "--ssh-session reads a one-time token from standard input, as `sender FILE \
             HOST:DIR` writes it; it is not meant to be started by hand"
                .into(),
        ));
    }
    Token::new(line).ok_or_else(|| XferError::Internal("empty one-time token".into()))
}

/// Watches standard input on a thread of its own: its end (the sender
/// finished, was killed, or ssh hung up) asks the receiver to shut down,
/// as SIGTERM does.
pub fn watch_hangup() {
    let spawned = std::thread::Builder::new()
        .name("ssh-hangup".into())
        .spawn(|| {
            let mut buf = [0u8; 256];
            let mut input = std::io::stdin();
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            tracing::debug!("the sender's ssh channel closed: ending");
            crate::sys::os::request_shutdown();
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch the ssh channel: {e}");
    }
}

/// Where a receiver started over ssh listens, in order of preference:
/// the address the ssh connection came in on (SSH_CONNECTION), the one
/// this host would use towards the sender, every address in the RDMA
/// devices' GID tables (RoCE), then every other interface address (IPoIB
/// on InfiniBand), IPv4 first. The caller keeps the first that binds to
/// an RDMA device.
pub fn bind_candidates(ssh_connection: Option<&str>) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    let mut add = |ip: IpAddr| {
        if !ip.is_unspecified() && !out.contains(&ip) {
            out.push(ip);
        }
    };
    // "CLIENT_IP CLIENT_PORT SERVER_IP SERVER_PORT"
    let words: Vec<&str> = ssh_connection.unwrap_or("").split_whitespace().collect();
    if let [client, _, server, _] = words[..] {
        if let Ok(ip) = server.parse() {
            add(ip);
        }
        if let Some(ip) = client.parse().ok().and_then(source_towards) {
            add(ip);
        }
    }
    for ip in rdma_gid_addresses() {
        add(ip);
    }
    // InfiniBand GIDs are no IP addresses: its IPoIB interfaces' are, as
    // are any others (the caller keeps those an RDMA device has).
    let mut others: Vec<IpAddr> = crate::sys::os::interface_addresses()
        .into_iter()
        .map(|(_, ip)| ip)
        .filter(|ip| !ip.is_loopback() && !is_link_local(ip))
        .collect();
    others.sort_by_key(|ip| ip.is_ipv6());
    for ip in others {
        add(ip);
    }
    out
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The source address the routing table picks towards `peer` (a UDP
/// socket's connect sends nothing).
fn source_towards(peer: IpAddr) -> Option<IpAddr> {
    let any: SocketAddr = match peer {
        IpAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        IpAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(SocketAddr::new(peer, 9)).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}

/// The IP addresses in the GID tables of this host's RDMA devices (RoCE:
/// IPv4-mapped and global IPv6 GIDs), IPv4 first.
fn rdma_gid_addresses() -> Vec<IpAddr> {
    let mut v4 = Vec::new();
    let mut v6 = Vec::new();
    let Ok(devices) = std::fs::read_dir("/sys/class/infiniband") else {
        return v4;
    };
    let mut gid_files = Vec::new();
    for dev in devices.flatten() {
        let Ok(ports) = std::fs::read_dir(dev.path().join("ports")) else {
            continue;
        };
        for port in ports.flatten() {
            if let Ok(gids) = std::fs::read_dir(port.path().join("gids")) {
                gid_files.extend(gids.flatten().map(|g| g.path()));
            }
        }
    }
    gid_files.sort();
    for path in gid_files {
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        match parse_gid(text.trim()) {
            Some(IpAddr::V4(a)) if !v4.contains(&IpAddr::V4(a)) => v4.push(IpAddr::V4(a)),
            Some(IpAddr::V6(a)) if !v6.contains(&IpAddr::V6(a)) => v6.push(IpAddr::V6(a)),
            _ => {}
        }
    }
    v4.extend(v6);
    v4
}

/// A GID as an IP address: IPv4-mapped ones as IPv4, global IPv6 as such;
/// None for empty, link-local and IB (non-IP) GIDs.
fn parse_gid(text: &str) -> Option<IpAddr> {
    let ip: std::net::Ipv6Addr = text.parse().ok()?;
    if let Some(v4) = ip.to_ipv4_mapped() {
        return (!v4.is_unspecified()).then_some(IpAddr::V4(v4));
    }
    let first = ip.segments()[0];
    // Global unicast 2000::/3 and unique local fc00::/7 only.
    ((first & 0xe000) == 0x2000 || (first & 0xfe00) == 0xfc00).then_some(IpAddr::V6(ip))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(s: &str) -> Target {
        Target::parse(s).expect("a target").expect("valid")
    }

    #[test]
    fn targets_as_scp_writes_them() {
        let t = target("node01:/ckpt/");
        assert_eq!(
            (t.login.as_str(), t.host.as_str(), t.dir.as_str()),
            ("node01", "node01", "/ckpt/")
        );
        let t = target("me@node01:in");
        assert_eq!(
            (t.login.as_str(), t.host.as_str(), t.dir.as_str()),
            ("me@node01", "node01", "in")
        );
        let t = target("node01:");
        assert_eq!(t.dir, "");
        let t = target("[fd00::1]:/d");
        assert_eq!((t.login.as_str(), t.dir.as_str()), ("fd00::1", "/d"));
        let t = target("me@[fd00::1]:~/x");
        assert_eq!((t.login.as_str(), t.dir.as_str()), ("me@fd00::1", "~/x"));
        let t = target("h:/a:b");
        assert_eq!(t.dir, "/a:b");
        // Not targets: local paths, the direct form's HOST:PORT, addresses.
        for not in [
            "file",
            "./a:b",
            "dir/x:y",
            "host:7471",
            "10.0.0.1:7471",
            "[fd00::1]:7471",
            "fd00::1",
            "fd00:1:2::3",
            "[fd00::1]",
        ] {
            assert!(Target::parse(not).is_none(), "{not}");
        }
        // Targets, but wrong.
        for bad in [
            ":/d",
            "-oProxyCommand=x:/d",
            "@h:/d",
            "-u@h:/d",
            "a b:/d",
            "h:/x\ny",
            "h`id`:/d",
            "h$(id):/d",
            "h;x:/d",
            "u@h@x:/d",
            "u%x@h:/d",
        ] {
            assert!(
                matches!(Target::parse(bad), Some(Err(XferError::Usage(_)))),
                "{bad}"
            );
        }
    }

    #[test]
    fn remote_words_are_quoted_but_tilde_expands() {
        assert_eq!(remote_word("/data/in"), "/data/in");
        assert_eq!(remote_word("a b"), "'a b'");
        assert_eq!(remote_word("$(reboot)"), "'$(reboot)'");
        assert_eq!(remote_word("~"), "~");
        assert_eq!(remote_word("~/in dir"), "~/'in dir'");
        assert_eq!(remote_word("~root/x"), "'~root/x'");
        assert_eq!(remote_word("it's"), "\"it's\"");
    }

    #[test]
    fn rsh_from_option_env_or_ssh() {
        assert_eq!(rsh_command(None, None).unwrap(), ["ssh"]);
        assert_eq!(rsh_command(None, Some(" ")).unwrap(), ["ssh"]);
        assert_eq!(
            rsh_command(Some("ssh -p 2222 -o 'ProxyJump gw'"), Some("rsh")).unwrap(),
            ["ssh", "-p", "2222", "-o", "ProxyJump gw"]
        );
        assert_eq!(rsh_command(None, Some("ssh -4")).unwrap(), ["ssh", "-4"]);
        for bad in ["", "ssh 'x"] {
            let err = rsh_command(Some(bad), None).unwrap_err();
            assert_eq!(err.exit_code(), ExitCode::Usage, "{bad}");
        }
    }

    #[test]
    fn ready_lines_round_trip_and_nothing_else_is_one() {
        for a in ["10.0.0.1:40000", "[fd00::1]:7"] {
            let addr: SocketAddr = a.parse().unwrap();
            assert_eq!(parse_ready_line(&ready_line(addr)), Some(addr));
        }
        for not in [
            "",
            "Welcome to node01",
            "rdma-xfer-ready 2 10.0.0.1:1",
            "rdma-xfer-ready 1 10.0.0.1",
            "rdma-xfer-ready 1 10.0.0.1:1 extra",
        ] {
            assert_eq!(parse_ready_line(not), None, "{not}");
        }
    }

    #[test]
    fn one_time_tokens_are_fresh_hex() {
        let (a, hex_a) = one_time_token().unwrap();
        let (_, hex_b) = one_time_token().unwrap();
        assert_eq!(hex_a.len(), 64);
        assert!(hex_a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(hex_a, hex_b);
        // The remote side reads exactly that token back.
        let read = read_token_line(&mut format!("{hex_a}\nmore").as_bytes()).unwrap();
        let nonce = [7u8; crate::proto::NONCE_LEN];
        assert_eq!(read.mac(&nonce), a.mac(&nonce));
    }

    #[test]
    fn the_token_line_must_be_one() {
        let good = "ab".repeat(32);
        for bad in [
            String::new(),
            "\n".into(),
            good.clone(),
            format!("{}\n", &good[2..]),
            format!("{}zz\n", &good[2..]),
            format!("{good}0\n"),
            "x".repeat(5000),
        ] {
            let err = read_token_line(&mut bad.as_bytes()).unwrap_err();
            assert_eq!(err.exit_code(), ExitCode::Usage, "{bad:?}");
            assert!(err.to_string().contains("not meant to be started by hand"));
        }
    }

    #[test]
    fn gids_as_addresses() {
        assert_eq!(
            parse_gid("0000:0000:0000:0000:0000:ffff:0a4d:0001"),
            Some("10.77.0.1".parse().unwrap())
        );
        assert_eq!(parse_gid("fe80:0000:0000:0000:0000:00ff:fe00:0001"), None);
        assert_eq!(parse_gid("0000:0000:0000:0000:0000:0000:0000:0000"), None);
        assert_eq!(
            parse_gid("fd00:0000:0000:0000:0000:0000:0000:0001"),
            Some("fd00::1".parse().unwrap())
        );
        assert_eq!(parse_gid("nonsense"), None);
    }

    #[test]
    fn ssh_connection_comes_first() {
        let c = bind_candidates(Some("10.77.0.2 51000 10.77.0.1 22"));
        assert_eq!(c.first(), Some(&"10.77.0.1".parse().unwrap()));
        // No duplicates; garbage is ignored.
        let mut seen = c.clone();
        seen.dedup();
        assert_eq!(seen.len(), c.len());
        assert!(!bind_candidates(Some("garbage")).contains(&"0.0.0.0".parse().unwrap()));
    }

    #[test]
    fn remote_errors_say_the_receivers_own_line() {
        let tail = vec![
            "receiver: warning: x".to_string(),
            "receiver: error: output directory /nope: No such file or directory".to_string(),
            "".to_string(),
        ];
        assert_eq!(
            last_error_line(&tail),
            Some("output directory /nope: No such file or directory")
        );
        let tail = vec!["ssh: connect to host x port 22: Connection refused".to_string()];
        assert_eq!(last_error_line(&tail), Some(tail[0].as_str()));
        assert_eq!(exit_code_from(8), ExitCode::NoDevice);
        for (said, class) in [
            (
                "ssh: Could not resolve hostname nodo01: Name or service not known",
                ExitCode::Usage,
            ),
            (
                "me@node01: Permission denied (publickey).",
                ExitCode::Rejected,
            ),
            ("Host key verification failed.", ExitCode::Rejected),
            (
                "ssh: connect to host x port 22: Connection refused",
                ExitCode::CannotConnect,
            ),
            (
                "ssh: connect to host x port 22: No route to host",
                ExitCode::CannotConnect,
            ),
        ] {
            assert_eq!(ssh_failure_class(said), class, "{said}");
        }
        assert_eq!(exit_code_from(99), ExitCode::Other);
    }

    #[test]
    fn remote_output_is_read_in_bounded_lossy_lines() {
        let mut input = b"short\r\n".to_vec();
        input.extend(vec![b'x'; 3 * MAX_REMOTE_LINE]);
        input.extend(b"\n\xff\xfe bytes\nlast");
        let mut got = Vec::new();
        each_line(&input[..], |l| got.push(l));
        assert_eq!(got.len(), 4, "{got:?}");
        assert_eq!(got[0], "short");
        assert_eq!(got[1].len(), MAX_REMOTE_LINE);
        assert_eq!(got[2], "\u{fffd}\u{fffd} bytes");
        assert_eq!(got[3], "last");
    }
}
