//! Authentication on real RDMA (run in the SoftRoCE guest by `make test`):
//! a shared token on both sides lets a transfer through; a wrong or missing
//! token is refused with exit 4 before the receiver writes anything or
//! registers its ring, and the receiver keeps serving; a receiver without a
//! token says at start-up that it accepts anyone; a token in the default
//! place needs no option.

use crate::support::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const TOKEN: &str = "correct horse battery staple";
const WRONG: &str = "correct horse battery stapler";

/// Writes a token file (mode 0600, with the trailing newline an editor or
/// `echo` leaves).
fn token_file(dir: &Path, name: &str, token: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("{token}\n")).expect("write token file");
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    p
}

/// A serving receiver that reads its token from `token_file`.
fn receiver_with_token_file(
    net: &Net,
    port: u16,
    dst: &Path,
    token_file: &Path,
    env: &[(&str, &str)],
) -> Running {
    let tf = token_file.to_str().expect("utf8");
    ReceiverCommand::new(net, port, dst)
        .args(&["--token-file", tf])
        .env(env)
        .start()
}

/// How the sender gets its token.
enum SenderToken<'a> {
    None,
    Env(&'a str),
    File(&'a Path),
}

fn run_sender_with(net: &Net, port: u16, files: &[PathBuf], token: SenderToken) -> Finished {
    let file_arg;
    let extra: &[&str] = match &token {
        SenderToken::File(p) => {
            file_arg = p.to_str().expect("utf8").to_string();
            &["--token-file", &file_arg]
        }
        _ => &[],
    };
    let env = match token {
        SenderToken::Env(t) => Some(t),
        _ => None,
    };
    let mut cmd = SenderCommand::new(net, port, Path_::Wire)
        .files(files)
        .args(extra)
        .command();
    token_env(&mut cmd, env);
    Running::spawn("sender", cmd).wait(Duration::from_secs(300))
}

/// How long the receiver may take to log a session's outcome.
const LOG_WAIT: Duration = Duration::from_secs(20);

/// Everything a refused sender must leave: exit 4 with the reason and a
/// hint, nothing in the output directory.
fn assert_refused(sent: &Finished, receiver_says: &str, dst: &Path) {
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("authentication failed"),
        "{}",
        sent.stderr
    );
    assert!(sent.stderr.contains(receiver_says), "{}", sent.stderr);
    assert!(
        sent.stderr.contains("--token-file") && sent.stderr.contains("RDMA_XFER_TOKEN"),
        "no hint: {}",
        sent.stderr
    );
    assert!(
        !sent.stderr.contains(TOKEN),
        "token leaked: {}",
        sent.stderr
    );
    let entries: Vec<_> = std::fs::read_dir(dst)
        .expect("read dst")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(
        entries.is_empty(),
        "written despite failed auth: {entries:?}"
    );
    assert_no_temp_files(dst);
}

#[test]
fn same_token_file_on_one_side_env_on_the_other() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tf = token_file(src.path(), "token", TOKEN);
    let input = src.path().join("a.bin");
    let sum = make_file(&input, 3 * MIB + 17, 11);
    let port = next_port();
    // Receiver: --token-file; sender: the environment.
    let mut receiver = receiver_with_token_file(&net, port, dst.path(), &tf, &[]);
    let sent = run_sender_with(
        &net,
        port,
        std::slice::from_ref(&input),
        SenderToken::Env(TOKEN),
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("a.bin")), sum);
    assert!(!sent.stderr.contains("does not require"), "{}", sent.stderr);
    let log = receiver.wait_for_stderr("sender authenticated", LOG_WAIT);
    assert!(!log.contains("UNAUTHENTICATED"), "{log}");
    assert!(!log.contains(TOKEN), "token leaked: {log}");
    drop(receiver);

    // And the other way round: receiver from the environment, sender from
    // a file; several files in the session.
    let dst2 = tempfile::tempdir().expect("dst2");
    let port = next_port();
    let receiver = ReceiverCommand::new(&net, port, dst2.path())
        .env(&[("RDMA_XFER_TOKEN", TOKEN)])
        .start();
    let second = src.path().join("b.bin");
    let sum2 = make_file(&second, 5, 12);
    let sent = run_sender_with(&net, port, &[input.clone(), second], SenderToken::File(&tf));
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst2.path().join("a.bin")), sum);
    assert_eq!(sha256_file(&dst2.path().join("b.bin")), sum2);
    assert_no_temp_files(dst2.path());
    drop(receiver);
}

/// A token where both tools look for one (here the user's,
/// `$XDG_CONFIG_HOME/rdma-xfer/token`; the host's is /etc/rdma-xfer/token)
/// authenticates without any option.
#[test]
fn a_token_in_the_default_place_needs_no_option() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let config = tempfile::tempdir().expect("config");
    std::fs::create_dir(config.path().join("rdma-xfer")).expect("mkdir");
    token_file(&config.path().join("rdma-xfer"), "token", TOKEN);
    let home = config.path().to_str().expect("utf8");
    let input = src.path().join("a.bin");
    let sum = make_file(&input, MIB + 3, 13);
    let port = next_port();
    let mut receiver = ReceiverCommand::new(&net, port, dst.path())
        .env(&[("XDG_CONFIG_HOME", home)])
        .start();
    let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
        .files(std::slice::from_ref(&input))
        .command();
    token_env(&mut cmd, None);
    cmd.env("XDG_CONFIG_HOME", home);
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(300));
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("a.bin")), sum);
    let log = receiver.wait_for_stderr("sender authenticated", LOG_WAIT);
    assert!(!log.contains("UNAUTHENTICATED"), "{log}");
    // A sender without it is refused by that receiver.
    let sent = run_sender_with(&net, port, std::slice::from_ref(&input), SenderToken::None);
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    drop(receiver);
}

/// A refused sender, then a good one to the same serving receiver.
fn refused_then_served(sender_token: SenderToken, receiver_says: &str, logged: &str) {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tf = token_file(src.path(), "token", TOKEN);
    let input = src.path().join("secret-data.bin");
    let sum = make_file(&input, 2 * MIB + 3, 21);
    let port = next_port();
    // Debug logs show whether the ring was ever registered.
    let mut receiver =
        receiver_with_token_file(&net, port, dst.path(), &tf, &[("RUST_LOG", "debug")]);
    let sent = run_sender_with(&net, port, std::slice::from_ref(&input), sender_token);
    assert_refused(&sent, receiver_says, dst.path());
    let log = receiver.wait_for_stderr(logged, LOG_WAIT);
    assert!(
        log.contains(&format!(
            "authentication failed from {}",
            net.addr_b.as_deref().unwrap_or("")
        )),
        "{log}"
    );
    assert!(
        !log.contains("ring registered"),
        "ring registered before authentication:\n{log}"
    );
    assert!(!log.contains("offer"), "HELLO considered:\n{log}");
    assert!(!log.contains(TOKEN), "token leaked: {log}");

    // The same receiver serves a correctly authenticated sender.
    let sent = run_sender_with(
        &net,
        port,
        std::slice::from_ref(&input),
        SenderToken::Env(TOKEN),
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("secret-data.bin")), sum);
    assert_no_temp_files(dst.path());
    let log = receiver.wait_for_stderr("sender authenticated", LOG_WAIT);
    assert!(log.contains("ring registered"), "{log}");
    drop(receiver);
}

#[test]
fn wrong_token_is_refused_and_the_receiver_keeps_serving() {
    refused_then_served(SenderToken::Env(WRONG), "wrong token", ": wrong token");
}

#[test]
fn sender_without_token_is_refused_and_the_receiver_keeps_serving() {
    refused_then_served(
        SenderToken::None,
        "the sender has no token",
        ": the sender has no token",
    );
}

/// Closed by default: a receiver without a token (and without
/// --insecure) does not start: exit 2, saying how to make a token and
/// that --insecure exists; --insecure takes no --exec, --link-dest or
/// --overwrite.
#[test]
fn a_receiver_without_a_token_refuses_to_start() {
    let Some(net) = rdma_net() else { return };
    let dst = tempfile::tempdir().expect("dst");
    let port = next_port().to_string();
    let base = [
        "--bind",
        net.addr_a.as_str(),
        "--port",
        port.as_str(),
        "--once",
    ];
    for (extra, says) in [
        (&[][..], "needs a token"),
        (
            &["--insecure", "--exec", "cat"],
            "--exec would run its command",
        ),
        (
            &["--insecure", "--link-dest", "/"],
            "--link-dest would link files",
        ),
        (&["--insecure", "--overwrite"], "--overwrite would replace"),
    ] {
        let mut cmd = std::process::Command::new(receiver_bin());
        cmd.args(base).args(extra).arg(dst.path());
        token_env(&mut cmd, None);
        let done = Running::spawn("receiver", cmd).wait(Duration::from_secs(60));
        assert_eq!(done.code(), 2, "{extra:?}: {}", done.stderr);
        assert!(done.stderr.contains(says), "{extra:?}: {}", done.stderr);
        assert!(!done.stderr.contains("listening"), "{}", done.stderr);
        if extra.is_empty() {
            for hint in [
                "rdma-xfer-gen token FILE",
                "receiver --token-file FILE",
                "sender --token-file FILE",
                "receiver --insecure",
            ] {
                assert!(done.stderr.contains(hint), "{hint:?}: {}", done.stderr);
            }
        }
    }
}

/// `receiver --insecure` serves senders without a token, and says so
/// even with -q: its listening line is a warning starting UNAUTHENTICATED
/// with who may do what (text), a WARN record saying so (JSON logs).
#[test]
fn an_insecure_receiver_says_unauthenticated_even_with_q() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("src");
    for json in [false, true] {
        let dst = tempfile::tempdir().expect("dst");
        let dir = std::fs::canonicalize(dst.path()).expect("dir");
        let port = next_port();
        let mut cmd = std::process::Command::new(receiver_bin());
        cmd.args(["--bind", &net.addr_a, "--port", &port.to_string()])
            .args(["--once", "--insecure", "-q"])
            .arg(dst.path());
        if json {
            cmd.args(["--log-format", "json"]);
        }
        token_env(&mut cmd, None);
        let mut receiver = Running::spawn("receiver", cmd);
        let log = receiver.wait_for_stderr("UNAUTHENTICATED", LOG_WAIT);
        let line = log
            .lines()
            .find(|l| l.contains("UNAUTHENTICATED"))
            .expect("the line");
        let exposure = format!(
            "anyone who can reach this port may write into {}",
            dir.display()
        );
        if json {
            let v: serde_json::Value = serde_json::from_str(line).expect("JSON");
            assert_eq!(v["level"], "WARN", "{line}");
            assert_eq!(v["fields"]["authenticated"], false, "{line}");
            assert_eq!(v["fields"]["exposure"], exposure.as_str(), "{line}");
            assert_eq!(v["fields"]["port"], port, "{line}");
        } else {
            let start = format!(
                "receiver: warning: UNAUTHENTICATED: listening on {}:{port} (",
                net.addr_a
            );
            assert!(line.starts_with(&start), "{line}");
            assert!(line.contains(&exposure), "{line}");
        }
        let input = src.path().join("open.bin");
        let sum = make_file(&input, MIB + 3, 31);
        let sent = run_sender_with(&net, port, std::slice::from_ref(&input), SenderToken::None);
        assert_eq!(sent.code(), 0, "{}", sent.stderr);
        assert_eq!(sha256_file(&dst.path().join("open.bin")), sum);
        let done = receiver.wait(Duration::from_secs(60));
        assert_eq!(done.code(), 0, "{}", done.stderr);
        // -q: nothing else (no per-file line).
        assert_eq!(done.stderr.lines().count(), 1, "{}", done.stderr);
    }
}

/// The downgrade: a sender with a token refuses a receiver that does not
/// ask for it (no token there, or someone posing as it): exit 4, and it
/// sends nothing, so the receiver writes nothing.
#[test]
fn auth_downgrade_sender_with_token_refuses_receiver_without() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let port = next_port();
    let mut receiver = ReceiverCommand::new(&net, port, dst.path())
        .env(&[("RUST_LOG", "debug")])
        .start();
    let input = src.path().join("never-sent.bin");
    make_file(&input, MIB, 33);
    let sent = run_sender_with(
        &net,
        port,
        std::slice::from_ref(&input),
        SenderToken::Env(TOKEN),
    );
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("does not ask for authentication")
            && sent.stderr.contains("refusing to send anything"),
        "{}",
        sent.stderr
    );
    let entries: Vec<_> = std::fs::read_dir(dst.path())
        .expect("read dst")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(
        entries.is_empty(),
        "written despite the downgrade: {entries:?}"
    );
    assert_no_temp_files(dst.path());
    // The receiver saw no offer at all (no name, no size reached it).
    let log = receiver.wait_for_stderr("session", LOG_WAIT);
    std::thread::sleep(Duration::from_secs(1));
    let log = format!("{log}{}", receiver.stderr_so_far());
    assert!(
        !log.contains("never-sent"),
        "the name reached the receiver:\n{log}"
    );
    assert!(
        !log.contains("offer"),
        "an offer reached the receiver:\n{log}"
    );
    drop(receiver);
}

/// A token shorter than 16 bytes is refused before connecting (exit 2),
/// with a hint how to make a good one; nothing reaches the receiver.
#[test]
fn auth_short_token_is_refused_before_connecting() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let port = next_port();
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .env(&[("RDMA_XFER_TOKEN", TOKEN)])
        .start();
    let input = src.path().join("short.bin");
    make_file(&input, 100, 34);
    let sent = run_sender_with(
        &net,
        port,
        std::slice::from_ref(&input),
        SenderToken::Env("only-15-bytes!!"),
    );
    assert_eq!(sent.code(), 2, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("at least 16 bytes")
            && sent.stderr.contains("rdma-xfer-gen token FILE"),
        "{}",
        sent.stderr
    );
    assert!(
        !sent.stderr.contains("only-15"),
        "token leaked: {}",
        sent.stderr
    );
    let entries: Vec<_> = std::fs::read_dir(dst.path())
        .expect("read dst")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert!(entries.is_empty(), "{entries:?}");
    let log = receiver.stderr_so_far();
    assert!(!log.contains("session established"), "it connected:\n{log}");
    drop(receiver);
}

/// The network, when it has a second address (B) to connect from; else
/// the test says it is skipped.
fn net_with_two_addresses() -> Option<Net> {
    let net = rdma_net()?;
    if net.addr_b.is_none() {
        skip(
            "needs a second address to connect from (RXFER_ADDR_B)",
            false,
        );
        return None;
    }
    Some(net)
}

/// `n` raw clients from B that take their CHALLENGE and prove nothing.
fn idle_connections(net: &Net, port: u16, n: usize) -> Vec<Running> {
    (0..n)
        .map(|_| spawn_raw_client(net, port, None, &["expect:CHALLENGE", "sleep:30000"], 60))
        .collect()
}

/// Sends a new `size`-byte file `name` from A itself with the token, and
/// checks that it arrived within 10 s of the sender's start.
fn send_from_a_in_time(
    net: &Net,
    port: u16,
    receiver: &Running,
    src: &Path,
    dst: &Path,
    name: &str,
    size: u64,
) {
    let input = src.join(name);
    let sum = make_file(&input, size, 41);
    let started = std::time::Instant::now();
    let mut cmd = SenderCommand::new(net, port, Path_::Loopback)
        .files(std::slice::from_ref(&input))
        .command();
    token_env(&mut cmd, Some(TOKEN));
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(60));
    let took = started.elapsed();
    assert_eq!(
        sent.code(),
        0,
        "{}\nreceiver:\n{}",
        sent.stderr,
        receiver.stderr_so_far()
    );
    assert!(took < Duration::from_secs(10), "took {took:?}");
    assert_eq!(sha256_file(&dst.join(name)), sum);
}

/// Without a token (`--insecure`) there is nothing to prove, and a
/// connection takes a session slot as it arrives: one address holds at
/// most half of them. With --max-sessions 4, eight idle connections from
/// B take two slots, the others are refused (told why, while the
/// receiver's refusals are not too many at once); a sender from A still
/// gets in, in under 10 s.
#[test]
fn an_insecure_receiver_gives_one_address_half_of_its_sessions() {
    let Some(net) = net_with_two_addresses() else {
        return;
    };
    let b = net.addr_b.clone().expect("B");
    let (src, dst) = dirs();
    let port = next_port();
    let mut receiver = start_receiver(&net, port, dst.path(), &["--max-sessions", "4"]);
    let idle = idle_connections(&net, port, 8);
    let established_from_b = |log: &str| {
        log.lines()
            .filter(|l| l.contains("session established") && l.contains(&format!("peer={b}")))
            .count()
    };
    let log = receiver.wait_for(
        Stream::Stderr,
        "two sessions from B, the rest refused",
        Duration::from_secs(60),
        |log| {
            let refused = log.matches("sessions from your address").count()
                + log.matches("refused without a reason").count();
            (established_from_b(log) >= 2 && refused >= 6).then(|| log.to_string())
        },
    );
    assert!(
        log.contains("2 sessions from your address are running"),
        "{log}"
    );
    let input = src.path().join("through.bin");
    let sum = make_file(&input, 3 * MIB, 42);
    let started = std::time::Instant::now();
    let cmd = SenderCommand::new(&net, port, Path_::Loopback)
        .files(std::slice::from_ref(&input))
        .command();
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(60));
    assert_eq!(
        sent.code(),
        0,
        "{}\nreceiver:\n{}",
        sent.stderr,
        receiver.stderr_so_far()
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(sha256_file(&dst.path().join("through.bin")), sum);
    assert_eq!(established_from_b(&receiver.stderr_so_far()), 2);
    drop(idle);
}

/// Connections that never prove the token wait in a pool of their own (at
/// most 8 from one address), not in a session slot. With --max-sessions 2,
/// twelve of them from one address (the wire's B side) do not keep an
/// authenticated sender from another address (A itself) out: it gets
/// through in under 10 s while they still hold their places. Beyond
/// --max-sessions, authenticated senders are told the receiver is busy
/// (after their proof, before AUTH_OK), with nothing written.
#[test]
fn unauthenticated_connections_cannot_lock_out_an_authenticated_sender() {
    let Some(net) = net_with_two_addresses() else {
        return;
    };
    let (src, dst) = dirs();
    let port = next_port();
    let env = [("RDMA_XFER_TOKEN", TOKEN)];
    let mut receiver = ReceiverCommand::new(&net, port, dst.path())
        .args(&["--max-sessions", "2"])
        .env(&env)
        .start();
    let idle = idle_connections(&net, port, 12);
    let log = receiver.wait_for(
        Stream::Stderr,
        "the pool's share of one address taken, the rest refused",
        Duration::from_secs(60),
        |log| (log.matches("already authenticating").count() >= 4).then(|| log.to_string()),
    );
    assert!(
        log.contains("connections from this address are already authenticating"),
        "{log}"
    );
    // The authenticated sender, from A, while the idle ones wait.
    send_from_a_in_time(
        &net,
        port,
        &receiver,
        src.path(),
        dst.path(),
        "through.bin",
        3 * MIB,
    );
    // It got in while the idle ones held their places: before any of them
    // timed out (AUTH_TIMEOUT, 5 s).
    let log = receiver.stderr_so_far();
    let authenticated = log.find("sender authenticated").expect("authenticated");
    if let Some(timed_out) = log.find("timed out") {
        assert!(
            authenticated < timed_out,
            "the idle connections were gone:\n{log}"
        );
    }
    drop(idle);

    // Two authenticated sessions run (big files, slowly drained); a third
    // proves the token and is refused as busy.
    // (Both files exist before either sender starts: writing one takes
    // about as long as sending one.)
    let bigs: Vec<PathBuf> = (0..2)
        .map(|i| {
            let big = src.path().join(format!("big{i}.bin"));
            make_file(&big, 128 * MIB, 50 + i);
            big
        })
        .collect();
    let third = src.path().join("third.bin");
    make_file(&third, MIB, 60);
    let mut running = Vec::new();
    for big in bigs {
        let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
            .files(&[big])
            .command();
        token_env(&mut cmd, Some(TOKEN));
        running.push(Running::spawn("sender", cmd));
    }
    receiver.wait_for(
        Stream::Stderr,
        "two sessions receiving",
        Duration::from_secs(60),
        |log| (log.contains("big0.bin") && log.contains("big1.bin")).then_some(()),
    );
    let mut cmd = SenderCommand::new(&net, port, Path_::Loopback)
        .files(std::slice::from_ref(&third))
        .command();
    token_env(&mut cmd, Some(TOKEN));
    let refused = Running::spawn("sender", cmd).wait(Duration::from_secs(60));
    assert_eq!(refused.code(), 4, "{}", refused.stderr);
    assert!(refused.stderr.contains("busy"), "{}", refused.stderr);
    assert!(!dst.path().join("third.bin").exists());
    for r in running {
        let done = r.wait(Duration::from_secs(600));
        assert_eq!(done.code(), 0, "{}", done.stderr);
    }
    assert_no_temp_files(dst.path());
}

/// `receiver --once` with a token ends after its first authenticated
/// session, not after a connection that never proved it.
#[test]
fn once_waits_for_an_authenticated_session() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let port = next_port();
    let env = [("RDMA_XFER_TOKEN", TOKEN)];
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .args(&["--once"])
        .env(&env)
        .start();
    // First a peer without the token, then one that proves nothing.
    let wrong = src.path().join("wrong.bin");
    make_file(&wrong, MIB, 70);
    let refused = run_sender_with(
        &net,
        port,
        std::slice::from_ref(&wrong),
        SenderToken::Env(WRONG),
    );
    assert_eq!(refused.code(), 4, "{}", refused.stderr);
    let idle = run_raw_client(
        &net,
        port,
        None,
        &["expect:CHALLENGE"],
        Duration::from_secs(60),
    );
    assert_eq!(idle.code(), 0, "{}", idle.transcript());
    let input = src.path().join("once.bin");
    let sum = make_file(&input, 3 * MIB, 71);
    let sent = run_sender_with(
        &net,
        port,
        std::slice::from_ref(&input),
        SenderToken::Env(TOKEN),
    );
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    let done = receiver.wait(Duration::from_secs(60));
    assert_eq!(done.code(), 0, "{}", done.stderr);
    assert!(
        done.stderr.contains("waiting for the next connection"),
        "{}",
        done.stderr
    );
    assert_eq!(sha256_file(&dst.path().join("once.bin")), sum);
    assert!(!dst.path().join("wrong.bin").exists());
    assert_no_temp_files(dst.path());
}

/// A full handshake pool drops its oldest handshake for a newcomer instead
/// of refusing it, so connections that idle from many addresses cannot
/// keep an authenticated sender out. The pool is made 4 places small (the
/// fault-injection receiver's `handshake-pool:4`; 32 by default) and filled
/// by 4 idle connections from the wire's B side; the real sender, from A,
/// gets in at once, and one idle connection is dropped for it.
#[test]
fn a_full_handshake_pool_makes_room_for_a_newcomer() {
    let Some(net) = net_with_two_addresses() else {
        return;
    };
    let (src, dst) = dirs();
    let port = next_port();
    let env = [
        ("RDMA_XFER_TOKEN", TOKEN),
        ("RDMA_XFER_FAULT", "handshake-pool:4"),
    ];
    let bin = fault_injection_bin("receiver");
    let mut receiver = ReceiverCommand::new(&net, port, dst.path())
        .bin(&bin)
        .env(&env)
        .start();
    let idle = idle_connections(&net, port, 4);
    receiver.wait_for(
        Stream::Stderr,
        "4 idle handshakes in the pool",
        Duration::from_secs(60),
        |log| (log.matches("session established").count() >= 4).then_some(()),
    );
    send_from_a_in_time(
        &net,
        port,
        &receiver,
        src.path(),
        dst.path(),
        "newcomer.bin",
        MIB,
    );
    let log = receiver.wait_for_stderr("dropped from the full handshake pool", LOG_WAIT);
    assert!(!log.contains("already authenticating"), "{log}");
    drop(idle);
}
