//! The first run on a stock host: both tools under the 8 MiB memlock limit
//! of Debian 12, fresh VMs and ssh sessions (prlimit, soft and hard). Root
//! (CAP_IPC_LOCK) keeps the default buffers; a plain user gets buffers
//! that fit, told once; settings given that do not fit are refused
//! before anything connects; a receiver fits one session's ring, and a
//! second session at once that cannot register its own is refused with
//! the limit's numbers. Real RDMA in the SoftRoCE guest only: it opens
//! /dev/infiniband/* to all users there.

use crate::support::*;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Both sides use it (a receiver without a token may soon refuse to
/// start).
const TOKEN: &str = "memlock-test-token-0123456789abcdef";
/// With a token each ring slot holds a chunk and its tag.
const TAG: u64 = rdma_xfer::proto::CHUNK_TAG_LEN as u64;
/// More chunks than a fitted ring has slots: the credits go round.
const SIZE: u64 = 5 * MIB + 12_345;
/// Every slot of the ring has a receive buffer of this size besides it.
const CONTROL_BUFFER: u64 = 4096;

/// The guest's network, with RDMA devices every user may open; None (the
/// test skipped) elsewhere.
fn guest_net() -> Option<Net> {
    own_guest()?;
    let net = rdma_net()?;
    open_rdma_devices_to_all();
    Some(net)
}

/// A source directory nobody can read and a destination it can write.
fn dirs_for_nobody() -> (tempfile::TempDir, tempfile::TempDir) {
    use std::os::unix::fs::PermissionsExt;
    let (src, dst) = dirs();
    for (dir, mode) in [(src.path(), 0o755), (dst.path(), 0o777)] {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    (src, dst)
}

/// The receiver's command line (`--once` unless `serving`), with the
/// token and `-vv` (its ring's size is a debug line).
fn receiver(net: &Net, port: u16, dst: &Path, extra: &[&str], serving: bool) -> Command {
    let mut args = vec!["-v"];
    if !serving {
        args.push("--once");
    }
    args.extend(extra);
    ReceiverCommand::new(net, port, dst)
        .args(&args)
        .env(&[("RDMA_XFER_TOKEN", TOKEN)])
        .command()
}

/// The sender's command line (across the wire), with the token and `-vv`.
fn sender(net: &Net, port: u16, files: &[PathBuf], extra: &[&str]) -> Command {
    let mut args = vec!["-v"];
    args.extend(extra);
    let mut cmd = SenderCommand::new(net, port, Path_::Wire)
        .files(files)
        .args(&args)
        .command();
    token_env(&mut cmd, Some(TOKEN));
    cmd
}

/// Starts the receiver under the stock limit as `who`, checking the limit
/// is in force.
fn start_limited_receiver(who: RunAs, cmd: &Command) -> Running {
    let r = start_receiver_cmd(under_memlock(STOCK_MEMLOCK, who, cmd));
    assert_eq!(
        memlock_limits_of(r.pid()),
        Some((STOCK_MEMLOCK, STOCK_MEMLOCK)),
        "the receiver does not run under the stock limit"
    );
    r
}

/// `N` in "... NAME N ..." of the first line of `text` containing `line`.
fn number_after(text: &str, line: &str, name: &str) -> Option<u64> {
    let found = text.lines().find(|l| l.contains(line))?;
    let rest = found.split(name).nth(1)?;
    rest.split(|c: char| !c.is_ascii_digit())
        .find(|w| !w.is_empty())?
        .parse()
        .ok()
}

#[test]
fn memlock_root_keeps_the_default_buffers_under_8_mib() {
    let Some(net) = guest_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("data.bin");
    let sum = make_file(&file, SIZE, 0x10c4);
    let port = next_port();
    let receiver =
        start_limited_receiver(RunAs::Myself, &receiver(&net, port, dst.path(), &[], false));
    let sent = Running::spawn(
        "sender",
        under_memlock(
            STOCK_MEMLOCK,
            RunAs::Myself,
            &sender(&net, port, std::slice::from_ref(&file), &[]),
        ),
    )
    .wait(Duration::from_secs(300));
    let received = receiver.wait(Duration::from_secs(120));
    assert_both_ok(&sent, &received);
    assert_eq!(sha256_file(&dst.path().join("data.bin")), sum);
    // CAP_IPC_LOCK: 16 MiB (and the chunks' tags) pinned on each side
    // under an 8 MiB limit, and nothing to say about it.
    assert_eq!(
        number_after(&received.stderr, "ring registered", "len="),
        Some(16 * (MIB + TAG)),
        "{}",
        received.stderr
    );
    assert_eq!(
        number_after(&sent.stderr, "staging registered", "buffers="),
        Some(16),
        "{}",
        sent.stderr
    );
    for (who, log) in [("sender", &sent.stderr), ("receiver", &received.stderr)] {
        assert!(!log.contains("RLIMIT_MEMLOCK"), "{who}:\n{log}");
    }
}

#[test]
fn memlock_a_plain_user_gets_buffers_that_fit_8_mib() {
    let Some(net) = guest_net() else { return };
    let (src, dst) = dirs_for_nobody();
    let file = src.path().join("data.bin");
    let sum = make_file(&file, SIZE, 0x10c5);
    let port = next_port();
    let receiver =
        start_limited_receiver(RunAs::Nobody, &receiver(&net, port, dst.path(), &[], false));
    let sent = Running::spawn(
        "sender",
        under_memlock(
            STOCK_MEMLOCK,
            RunAs::Nobody,
            &sender(&net, port, std::slice::from_ref(&file), &[]),
        ),
    )
    .wait(Duration::from_secs(300));
    let received = receiver.wait(Duration::from_secs(120));
    assert_both_ok(&sent, &received);
    let out = dst.path().join("data.bin");
    assert_eq!(sha256_file(&out), sum);
    let owner = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&out).expect("stat"));
    assert_eq!(owner, 65534, "the receiver did not run as nobody");
    // Each side said once what it chose, the limit, and how to raise it.
    let limit = "warning: RLIMIT_MEMLOCK is 8.0 MiB (hard limit 8.0 MiB";
    for (who, log, chosen) in [
        ("receiver", &received.stderr, "using a ring of "),
        ("sender", &sent.stderr, "using "),
    ] {
        assert_eq!(log.matches(limit).count(), 1, "{who}:\n{log}");
        for part in [
            chosen,
            "ulimit -l unlimited",
            "limits.conf",
            "LimitMEMLOCK=",
        ] {
            assert!(log.contains(part), "{who}: {part}:\n{log}");
        }
    }
    let slots = number_after(&received.stderr, limit, "--slots ").expect("slots chosen");
    let depth = number_after(&sent.stderr, limit, "--depth ").expect("depth chosen");
    eprintln!("under 8 MiB as nobody: --slots {slots}, --depth {depth} (chunks of 1 MiB)");
    // Fewer buffers of the default size, as many as fit.
    assert!(
        (2..16).contains(&slots) && (2..16).contains(&depth),
        "{slots} {depth}"
    );
    assert!(received.stderr.contains(&format!(
        "a ring of {slots} slots of 1.0 MiB per session (--slots {slots} --chunk-size 1M)"
    )));
    assert!(sent.stderr.contains(&format!(
        "{depth} staging buffers of 1.0 MiB (--depth {depth} --chunk-size 1M)"
    )));
    assert!(slots * (MIB + CONTROL_BUFFER) <= STOCK_MEMLOCK);
    // ... and that is what was registered.
    assert_eq!(
        number_after(&received.stderr, "ring registered", "len="),
        Some(slots * (MIB + TAG)),
        "{}",
        received.stderr
    );
    assert_eq!(
        number_after(&sent.stderr, "staging registered", "buffers="),
        Some(depth)
    );
}

#[test]
fn memlock_given_buffers_that_do_not_fit_are_refused_before_connecting() {
    let Some(net) = guest_net() else { return };
    let (src, dst) = dirs_for_nobody();
    let file = src.path().join("data.bin");
    make_file(&file, MIB, 0x10c6);
    let port = next_port();
    let given = ["--slots", "16", "--chunk-size", "1M"];
    let cmd = receiver(&net, port, dst.path(), &given, false);
    let refused = Running::spawn(
        "receiver",
        under_memlock(STOCK_MEMLOCK, RunAs::Nobody, &cmd),
    )
    .wait(Duration::from_secs(60));
    // Nobody listens on that port now: a sender that got past its check
    // would fail to connect (exit 3).
    let cmd = sender(
        &net,
        port,
        std::slice::from_ref(&file),
        &["--depth", "16", "--chunk-size", "1M"],
    );
    let not_sent = Running::spawn("sender", under_memlock(STOCK_MEMLOCK, RunAs::Nobody, &cmd))
        .wait(Duration::from_secs(60));
    for (who, run, what) in [
        (
            "receiver",
            &refused,
            "a ring of 16 slots of 1.0 MiB per session (--slots 16 --chunk-size 1M) as given",
        ),
        (
            "sender",
            &not_sent,
            "16 staging buffers of 1.0 MiB (--depth 16 --chunk-size 1M) as given",
        ),
    ] {
        // The memlock error's exit code (README: 1).
        assert_eq!(run.code(), 1, "{who}:\n{}", run.transcript());
        for part in [
            &format!("{who}: error: cannot lock "),
            what,
            "RLIMIT_MEMLOCK is 8.0 MiB (hard limit 8.0 MiB)",
            "ulimit -l unlimited",
        ] {
            assert!(run.stderr.contains(part), "{who}: {part}:\n{}", run.stderr);
        }
    }
    assert!(!refused.stderr.contains("listening"), "{}", refused.stderr);
    assert!(!not_sent.stderr.contains("connect"), "{}", not_sent.stderr);
    assert_eq!(std::fs::read_dir(dst.path()).expect("dst").count(), 0);
}

#[test]
fn memlock_a_second_session_that_cannot_register_its_ring_is_refused() {
    let Some(net) = guest_net() else { return };
    let (src, dst) = dirs_for_nobody();
    let file = src.path().join("second.bin");
    make_file(&file, MIB, 0x10c7);
    let port = next_port();
    let receiver = start_limited_receiver(
        RunAs::Nobody,
        &receiver(&net, port, dst.path(), &["--max-sessions", "2"], true),
    );
    // The first session: a stream from a FIFO this test holds open (read
    // and write, so that opening it blocks nobody), so it stays connected
    // with its ring registered until the test writes its data.
    let fifo = src.path().join("stream.fifo");
    let made = Command::new("mkfifo")
        .arg("-m")
        .arg("0666")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success(), "mkfifo");
    let mut feed = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .expect("open the FIFO");
    let first = sender(&net, port, &[PathBuf::from("-")], &["--name", "stream.bin"]);
    let mut from_fifo = Command::new("bash");
    from_fifo
        .arg("-c")
        .arg("exec \"$0\" \"$@\" < \"$STREAM_FIFO\"")
        .arg(first.get_program())
        .args(first.get_args())
        .env("STREAM_FIFO", &fifo);
    for (key, value) in first.get_envs() {
        match value {
            Some(v) => from_fifo.env(key, v),
            None => from_fifo.env_remove(key),
        };
    }
    let first = Running::spawn(
        "first sender",
        under_memlock(STOCK_MEMLOCK, RunAs::Nobody, &from_fifo),
    );
    let mut receiver = receiver;
    receiver.wait_for_stderr("ring registered", Duration::from_secs(120));
    // The second session at once: its ring does not fit beside the first.
    let second = Running::spawn(
        "second sender",
        under_memlock(
            STOCK_MEMLOCK,
            RunAs::Nobody,
            &sender(&net, port, std::slice::from_ref(&file), &[]),
        ),
    )
    .wait(Duration::from_secs(120));
    assert_eq!(second.code(), 4, "{}", second.transcript());
    for part in [
        "the receiver cannot register its ring: cannot lock ",
        "RLIMIT_MEMLOCK is 8.0 MiB",
    ] {
        assert!(second.stderr.contains(part), "{part}:\n{}", second.stderr);
    }
    // The first session is unharmed: its stream arrives whole.
    let mut data = vec![0u8; (2 * MIB) as usize];
    let mut state = 0x10c8;
    fill_pseudo_random(&mut data, &mut state);
    feed.write_all(&data).expect("feed the stream");
    drop(feed);
    let first = first.wait(Duration::from_secs(300));
    assert_eq!(first.code(), 0, "{}", first.transcript());
    assert_eq!(
        sha256_file(&dst.path().join("stream.bin")),
        sha256_hex(&data)
    );
    assert!(!dst.path().join("second.bin").exists());
    receiver.signal("TERM");
    let served = receiver.wait(Duration::from_secs(60));
    assert_eq!(
        served
            .stderr
            .matches("warning: RLIMIT_MEMLOCK is 8.0 MiB")
            .count(),
        1,
        "{}",
        served.stderr
    );
}
