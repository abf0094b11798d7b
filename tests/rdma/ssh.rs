//! The one-command form on real RDMA: `sender FILE... [USER@]HOST:DIR`
//! starts its receiver over ssh (the guest's sshd, scripts/guest/sshd.sh),
//! sends, and leaves nothing running and nothing unverified behind.

use crate::support::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// The guest's sshd, started once for this run (scripts/guest/sshd.sh)
/// under a stock host's 8 MiB memlock limit, listening on every wire's
/// receiving address;
/// root (and root as the user rxfer) log in with a key. Every suite that
/// needs sshd starts it here first (sshd.sh keeps the first one running).
pub(crate) fn ssh_net() -> Option<Net> {
    let net = rdma_net()?;
    let dir = std::env::var("RXFER_SSHD_DIR").unwrap_or_default();
    if !in_guest() || dir.is_empty() {
        skip(
            "needs the guest's sshd (scripts/guest/sshd.sh)",
            everything_required(),
        );
        return None;
    }
    static STARTED: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    STARTED.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/guest/sshd.sh");
        // The relay chain's further hosts too, when the guest has them.
        let further = ["RXFER_ADDR_C", "RXFER_ADDR_D"].map(|v| std::env::var(v).ok());
        let addrs = [Some(net.addr_a.clone()), net.addr_b.clone()]
            .into_iter()
            .chain(further);
        let out = Command::new("bash")
            .args(["-c", "ulimit -l 8192 && exec \"$0\" start \"$@\""])
            .arg(script)
            .arg(&dir)
            .args(addrs.flatten())
            .output()
            .unwrap();
        assert!(out.status.success(), "cannot start sshd: {out:?}");
    });
    Some(net)
}

/// `sender` in the one-command form, across the wire when there is one:
/// `extra` options, then `args` (files and targets).
pub(crate) fn sender(net: &Net, extra: &[&str], args: &[&str]) -> Command {
    sender_with(net, receiver_bin(), extra, args)
}

/// As `sender`, with another program as the remote receiver.
fn sender_with(net: &Net, remote_receiver: &str, extra: &[&str], args: &[&str]) -> Command {
    let mut cmd = Command::new(sender_bin());
    cmd.args(["-v", "--remote-receiver", remote_receiver])
        .env_remove("RDMA_XFER_TOKEN")
        .env_remove("RDMA_XFER_RSH")
        .env_remove("RDMA_XFER_ACK_TIMEOUT");
    if let Some(b) = &net.addr_b {
        cmd.args(["--source", b]);
    }
    cmd.args(extra).args(args);
    cmd
}

pub(crate) fn target(host: &str, dir: &Path) -> String {
    format!("{host}:{}", dir.display())
}

pub(crate) fn run(cmd: Command) -> Finished {
    Running::spawn("sender", cmd).wait(Duration::from_secs(300))
}

/// PIDs of receivers started over ssh that write into `dir`.
pub(crate) fn remote_receivers(dir: &Path) -> Vec<u32> {
    let want = dir.display().to_string();
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let words: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        if words.iter().any(|w| w == "--ssh-session") && words.contains(&want) {
            pids.push(pid);
        }
    }
    pids
}

/// Within 5 s of the sender's end no receiver is left for `dir`.
pub(crate) fn assert_remote_gone(dir: &Path) {
    wait_until(
        &format!("the receiver for {} to end", dir.display()),
        || format!("{:?}", remote_receivers(dir)),
        |pids| pids == "[]",
        Duration::from_secs(5),
    );
}

#[test]
fn a_file_a_tree_and_a_named_stream_with_the_scp_form() {
    let Some(net) = ssh_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("ckpt.pt");
    make_file(&file, 3 * MIB + 17, 1);
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    make_file(&tree.join("a.bin"), 100_000, 2);
    make_file(&tree.join("sub/b.bin"), 5, 3);
    let to = target(&net.addr_a, dst.path());

    let sent = run(sender(&net, &[], &[file.to_str().unwrap(), &to]));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(sha256_file(&dst.path().join("ckpt.pt")), sha256_file(&file));
    assert_remote_gone(dst.path());

    let sent = run(sender(&net, &["-r"], &[tree.to_str().unwrap(), &to]));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    for f in ["a.bin", "sub/b.bin"] {
        assert_eq!(
            sha256_file(&dst.path().join("tree").join(f)),
            sha256_file(&tree.join(f)),
            "{f}"
        );
    }
    assert_remote_gone(dst.path());

    // A named stream: standard input under --name.
    let b = net
        .addr_b
        .as_deref()
        .map(|b| format!("--source {}", q(b)))
        .unwrap_or_default();
    let script = format!(
        "head -c 1000000 {} | {} -v --remote-receiver {} {b} --name stream.bin - {}",
        qp(&file),
        q(sender_bin()),
        q(receiver_bin()),
        q(&to)
    );
    let piped = pipeline("pipeline", &script, 1).wait(Duration::from_secs(300));
    assert_eq!(piped.code(), 0, "{}", piped.transcript());
    let got = std::fs::read(dst.path().join("stream.bin")).unwrap();
    assert_eq!(got, std::fs::read(&file).unwrap()[..1_000_000]);
    assert_remote_gone(dst.path());
    assert_no_temp_files(dst.path());
}

/// scp's `HOST:PATH`: one file into an existing directory (with or
/// without a trailing `/`), or, where PATH is no directory, under PATH's
/// last component in its parent; that name then follows the receiver's
/// rules (an existing file is refused). Several files need a directory.
#[test]
fn one_file_under_a_new_name_with_the_scp_form() {
    let Some(net) = ssh_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("ckpt.pt");
    let sum = make_file(&file, 2 * MIB + 5, 7);
    let other = src.path().join("other.bin");
    let other_sum = make_file(&other, 1000, 8);
    let (file, other) = (file.to_str().unwrap(), other.to_str().unwrap());
    let sub = dst.path().join("sub");
    std::fs::create_dir(&sub).unwrap();

    // A new name: /dst/new.pt, nothing else there.
    let new = dst.path().join("new.pt");
    let sent = run(sender(
        &net,
        &["--json"],
        &[file, &target(&net.addr_a, &new)],
    ));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(sha256_file(&new), sum);
    assert!(!dst.path().join("ckpt.pt").exists());
    assert!(
        json_lines("sender", &sent.stdout)
            .iter()
            .any(|r| r["name"] == "new.pt" && r["status"] == "ok"),
        "{}",
        sent.stdout
    );
    assert_remote_gone(&new);

    // An existing directory, with `/` and without: the file's own name.
    let with_slash = format!("{}/", target(&net.addr_a, &sub));
    let sent = run(sender(&net, &[], &[file, &with_slash]));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(sha256_file(&sub.join("ckpt.pt")), sum);
    let sent = run(sender(&net, &[], &[other, &target(&net.addr_a, &sub)]));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(sha256_file(&sub.join("other.bin")), other_sum);
    assert_remote_gone(&sub);

    // The name exists: refused as any existing file, left as it was.
    let sent = run(sender(&net, &[], &[other, &target(&net.addr_a, &new)]));
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(sent.stderr.contains("exists"), "{}", sent.stderr);
    assert_eq!(sha256_file(&new), sum);
    assert_remote_gone(&new);

    // Several files and a PATH that is no directory: the remote's usage
    // error, nothing written.
    let none = dst.path().join("none.pt");
    let sent = run(sender(
        &net,
        &[],
        &[file, other, &target(&net.addr_a, &none)],
    ));
    assert_eq!(sent.code(), 2, "{}", sent.transcript());
    assert!(sent.stderr.contains("none.pt"), "{}", sent.stderr);
    assert!(!none.exists());
    assert_remote_gone(&none);
    assert_no_temp_files(dst.path());
    assert_no_temp_files(&sub);
}

#[test]
fn three_targets_copied_directly_with_no_relay_each_with_its_result() {
    let Some(net) = ssh_net() else { return };
    let Some(addr_b) = net.addr_b.clone() else {
        skip("needs a second address", everything_required());
        return;
    };
    let (src, d1) = dirs();
    let (d2, d3) = dirs();
    let file = src.path().join("image.sqfs");
    make_file(&file, 2 * MIB, 4);
    let file = file.to_str().unwrap().to_string();
    let missing = d3.path().join("no/such/dir");
    let sent = run(sender(
        &net,
        &["--json", "--no-relay", "--parallel", "2"],
        &[
            &file,
            &target(&net.addr_a, d1.path()),
            &target(&addr_b, d2.path()),
            &target(&net.addr_a, &missing),
        ],
    ));
    // The worst status wins: the missing directory is a usage error there.
    assert_eq!(sent.code(), 2, "{}", sent.transcript());
    for d in [d1.path(), d2.path()] {
        assert_eq!(
            sha256_file(&d.join("image.sqfs")),
            sha256_file(Path::new(&file))
        );
        assert_remote_gone(d);
    }
    // One JSON record per host and file, each with its host; the summary.
    let records = json_lines("sender", &sent.stdout);
    let hosts: Vec<&str> = records
        .iter()
        .filter(|r| r["file"] == "image.sqfs" || r["name"] == "image.sqfs")
        .filter_map(|r| r["host"].as_str())
        .collect();
    assert_eq!(
        hosts.iter().filter(|h| **h == net.addr_a).count(),
        1,
        "{records:?}"
    );
    assert_eq!(
        hosts.iter().filter(|h| **h == addr_b).count(),
        1,
        "{records:?}"
    );
    // One record per target, the failed one with its reason.
    let targets: Vec<u64> = records
        .iter()
        .filter(|r| r["event"] == "target" && r["host"].is_string())
        .map(|r| r["exit_code"].as_u64().unwrap_or(99))
        .collect();
    assert_eq!(targets.len(), 3, "{records:?}");
    assert_eq!(
        targets.iter().filter(|c| **c == 0).count(),
        2,
        "{records:?}"
    );
    assert!(
        records.iter().any(|r| r["event"] == "target"
            && r["exit_code"] == 2
            && r["reason"]
                .as_str()
                .is_some_and(|m| m.contains("no/such/dir"))),
        "{records:?}"
    );
    // Every text line about a target names it.
    let err = &sent.stderr;
    assert!(
        err.lines().any(
            |l| l.starts_with(&format!("sender: error: {}: ", net.addr_a))
                && l.contains("no/such/dir")
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!("{}: image.sqfs: ", addr_b)),
        "the per-file line names its host:\n{err}"
    );
    assert!(err.contains("1 of 3 targets failed"), "{err}");
}

#[test]
fn a_refused_file_ends_the_remote_receiver_too() {
    let Some(net) = ssh_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("exists.bin");
    make_file(&file, 1000, 5);
    let file = file.to_str().unwrap().to_string();
    std::fs::write(dst.path().join("exists.bin"), b"already here").unwrap();
    let sent = run(sender(
        &net,
        &[],
        &[&file, &target(&net.addr_a, dst.path())],
    ));
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(sent.stderr.contains("exists"), "{}", sent.stderr);
    assert_eq!(
        std::fs::read(dst.path().join("exists.bin")).unwrap(),
        b"already here"
    );
    assert_remote_gone(dst.path());
}

/// A re-run of the one-command form leaves the file as it is; a changed
/// file is refused, and `sender --overwrite` (its receiver started so)
/// replaces it.
#[test]
fn a_rerun_is_unchanged_and_overwrite_replaces_a_changed_file() {
    let Some(net) = ssh_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("weights.bin");
    make_file(&file, 300_000, 11);
    let got = dst.path().join("weights.bin");
    let file_arg = file.to_str().unwrap().to_string();
    let to = format!("{}/", target(&net.addr_a, dst.path()));
    let sent = run(sender(&net, &[], &[&file_arg, &to]));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&got).unwrap());

    let sent = run(sender(&net, &["--json"], &[&file_arg, &to]));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert!(
        json_lines("sender", &sent.stdout)
            .iter()
            .any(|r| r["name"] == "weights.bin" && r["outcome"] == "unchanged"),
        "{}",
        sent.stdout
    );
    assert_eq!(
        std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&got).unwrap()),
        ino
    );
    assert_remote_gone(dst.path());

    // Changed (same size, other content, a later time): refused, then
    // replaced with --overwrite.
    let new = make_file(&file, 300_000, 21);
    let later = std::fs::metadata(&got).unwrap().modified().unwrap() + Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(&file)
        .and_then(|f| f.set_modified(later))
        .unwrap();
    let sent = run(sender(&net, &[], &[&file_arg, &to]));
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(sent.stderr.contains("--overwrite"), "{}", sent.stderr);
    assert_ne!(sha256_file(&got), new);
    let sent = run(sender(&net, &["--overwrite"], &[&file_arg, &to]));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_eq!(sha256_file(&got), new);
    assert_remote_gone(dst.path());
    assert_no_temp_files(dst.path());
}

/// A sender stopped mid-transfer (SIGINT, then SIGKILL in a second run):
/// its receiver is gone within 5 s and nothing stands under the final name.
#[test]
fn the_remote_receiver_ends_with_a_stopped_or_killed_sender() {
    let Some(net) = ssh_net() else { return };
    for signal in ["INT", "KILL"] {
        let (src, dst) = dirs();
        let fifo = src.path().join("input");
        let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(made.success());
        let mut cmd = Command::new("bash");
        let b = net
            .addr_b
            .as_deref()
            .map(|b| format!("--source {}", q(b)))
            .unwrap_or_default();
        cmd.arg("-c").arg(format!(
            "exec {} -v --remote-receiver {} {b} --name stream.bin - {} < {}",
            q(sender_bin()),
            q(receiver_bin()),
            q(target(&net.addr_a, dst.path())),
            qp(&fifo)
        ));
        cmd.env_remove("RDMA_XFER_TOKEN");
        let sending = Running::spawn("sender", cmd);
        // Open the writer (the sender's shell waits for it), feed 3 MiB,
        // and keep the stream open: the transfer is under way.
        let mut writer = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
        if let Err(e) = std::io::Write::write_all(&mut writer, &vec![7u8; 3 * MIB as usize]) {
            panic!(
                "{signal}: cannot feed the sender ({e}):\n{}",
                sending.stderr_so_far()
            );
        }
        wait_until(
            "the receiver's temporary file",
            || {
                std::fs::read_dir(dst.path())
                    .unwrap()
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect::<Vec<_>>()
                    .join(" ")
            },
            |names| names.contains(".rdma-xfer-"),
            Duration::from_secs(60),
        );
        assert!(!remote_receivers(dst.path()).is_empty());
        sending.signal(signal);
        let ended = sending.wait(Duration::from_secs(30));
        assert_ne!(ended.code(), 0, "{signal}: {}", ended.transcript());
        assert_remote_gone(dst.path());
        drop(writer);
        assert!(
            !dst.path().join("stream.bin").exists(),
            "{signal}: unverified data under the final name"
        );
        assert_no_temp_files(dst.path());
    }
}

#[test]
fn problems_say_where_they_are() {
    let Some(net) = ssh_net() else { return };
    let (src, dst) = dirs();
    let file = src.path().join("f.bin");
    make_file(&file, 10, 6);
    let file = file.to_str().unwrap().to_string();
    let to = target(&net.addr_a, dst.path());
    // No receiver program there: exit 2 with the hint.
    let r = run(sender_with(&net, "/no/such/receiver", &[], &[&file, &to]));
    assert_eq!(r.code(), 2, "{}", r.transcript());
    assert!(r.stderr.contains("--remote-receiver PATH"), "{}", r.stderr);
    // No such directory there (nor its parent, which would hold one file
    // under PATH's last name): exit 2, saying so.
    let r = run(sender(
        &net,
        &[],
        &[&file, &target(&net.addr_a, &dst.path().join("nope/deeper"))],
    ));
    assert_eq!(r.code(), 2, "{}", r.transcript());
    assert!(
        r.stderr.contains("No such file or directory"),
        "{}",
        r.stderr
    );
    // ssh cannot connect (nothing on that port): exit 3.
    let r = run(sender(&net, &["-e", "ssh -p 2"], &[&file, &to]));
    assert_eq!(r.code(), 3, "{}", r.transcript());
    assert!(r.stderr.contains("ssh to "), "{}", r.stderr);
    // No RDMA device there (the receiver runs where /dev/infiniband is
    // empty, as in a container it was not passed into): exit 8 with the remote's words.
    let hidden = src.path().join("receiver-without-devices");
    std::fs::write(
        &hidden,
        format!(
            "#!/bin/sh\nexec unshare -m sh -c 'mount -t tmpfs none /dev/infiniband && \
             exec \"$0\" \"$@\"' {} \"$@\"\n",
            q(receiver_bin())
        ),
    )
    .unwrap();
    let chmod = Command::new("chmod")
        .arg("755")
        .arg(&hidden)
        .status()
        .unwrap();
    assert!(chmod.success());
    let r = run(sender_with(
        &net,
        hidden.to_str().unwrap(),
        &[],
        &[&file, &to],
    ));
    assert_eq!(r.code(), 8, "{}", r.transcript());
    assert!(r.stderr.contains("no RDMA device"), "{}", r.stderr);
    assert_remote_gone(dst.path());
    assert!(!dst.path().join("f.bin").exists());
}

/// `receiver --once` no longer waits forever: `--wait` bounds it, and a
/// receiver started over ssh waits at most --timeout for its sender.
#[test]
fn receivers_do_not_wait_forever_for_their_sender() {
    let Some(net) = ssh_net() else { return };
    let (_src, dst) = dirs();
    let port = next_port();
    let mut cmd = Command::new(receiver_bin());
    cmd.args([
        "--once",
        "--wait",
        "2s",
        "--bind",
        &net.addr_a,
        "--port",
        &port.to_string(),
    ])
    .arg(dst.path())
    .env("RDMA_XFER_TOKEN", "a-token-of-at-least-16-bytes");
    let r = Running::spawn("receiver", cmd).wait(Duration::from_secs(60));
    assert_eq!(r.code(), 7, "{}", r.transcript());
    assert!(
        r.stderr.contains("waiting for a sender to connect"),
        "{}",
        r.stderr
    );
    // Over ssh: a receiver whose sender never connects (it was handed a
    // token, and its ssh channel stays open) ends after --timeout.
    let mut ssh = Command::new("ssh")
        .arg(&net.addr_a)
        .arg(format!(
            "{} --ssh-session --timeout 3s {}",
            q(receiver_bin()),
            qp(dst.path())
        ))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = ssh.stdin.take().unwrap();
    std::io::Write::write_all(&mut input, format!("{}\n", "ab".repeat(32)).as_bytes()).unwrap();
    let status = wait_until(
        "the receiver over ssh to give up",
        || match ssh.try_wait() {
            Ok(Some(s)) => s.code().unwrap_or(-1),
            _ => i32::MIN,
        },
        |code| *code != i32::MIN,
        Duration::from_secs(60),
    );
    drop(input);
    let mut out = String::new();
    std::io::Read::read_to_string(&mut ssh.stdout.take().unwrap(), &mut out).unwrap();
    assert_eq!(status, 7, "stdout: {out}");
    assert!(out.starts_with("rdma-xfer-ready 1 "), "{out}");
}

/// A plain user's receiver, started over ssh under a stock host's 8 MiB
/// memlock limit (the guest's sshd runs under it): it fits its ring into
/// the limit, says so, and the file arrives.
#[test]
fn a_plain_user_under_the_stock_memlock_limit() {
    let Some(net) = ssh_net() else { return };
    // As on a host whose udev gives users the verbs devices.
    let opened = Command::new("sh")
        .args(["-c", "chmod 666 /dev/infiniband/*"])
        .status()
        .unwrap();
    assert!(opened.success());
    let (src, _) = dirs();
    let file = src.path().join("user.bin");
    make_file(&file, 3 * MIB + 5, 7);
    let home = Path::new("/home/rxfer");
    let dir = tempfile::tempdir_in(home).unwrap();
    let chown = Command::new("chown")
        .arg("4242:4242")
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(chown.success());
    let limit = Command::new("ssh")
        .args([&format!("rxfer@{}", net.addr_a), "ulimit -l"])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&limit.stdout).trim(),
        "8192",
        "{limit:?}"
    );
    let sent = run(sender(
        &net,
        &[],
        &[
            file.to_str().unwrap(),
            &target(&format!("rxfer@{}", net.addr_a), dir.path()),
        ],
    ));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let got = dir.path().join("user.bin");
    assert_eq!(sha256_file(&got), sha256_file(&file));
    assert_eq!(
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(&got).unwrap()),
        4242
    );
    assert!(
        sent.stderr
            .contains(&format!("{}: receiver: warning: ", net.addr_a))
            && sent.stderr.contains("RLIMIT_MEMLOCK"),
        "the remote receiver says what it fitted:\n{}",
        sent.stderr
    );
    assert_remote_gone(dir.path());
    // A relay chain of plain users, A then C: A's ring and its session to
    // C share A's 8 MiB (each half of it).
    let Ok(addr_c) = std::env::var("RXFER_ADDR_C") else {
        return;
    };
    let user_dir = || {
        let d = tempfile::tempdir_in(home).unwrap();
        let chown = Command::new("chown")
            .arg("4242:4242")
            .arg(d.path())
            .status();
        assert!(chown.unwrap().success());
        d
    };
    let (at_a, at_c) = (user_dir(), user_dir());
    let anywhere = Net {
        addr_a: net.addr_a.clone(),
        addr_b: None,
    };
    let sent = run(sender(
        &anywhere,
        &[],
        &[
            file.to_str().unwrap(),
            &target(&format!("rxfer@{}", net.addr_a), at_a.path()),
            &target(&format!("rxfer@{addr_c}"), at_c.path()),
        ],
    ));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    for d in [&at_a, &at_c] {
        assert_eq!(sha256_file(&d.path().join("user.bin")), sha256_file(&file));
    }
    assert!(
        sent.stderr.contains("half the room"),
        "A says it fitted its ring in half the limit:\n{}",
        sent.stderr
    );
}
