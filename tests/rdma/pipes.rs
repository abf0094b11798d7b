//! End-to-end tests of streams and trees on a real RDMA stack (`make test`
//! runs them in the SoftRoCE guest): tar pipes through `sender -` and
//! `receiver --once --stdout`, `sender -r`, standard input of 0 bytes and
//! of several rings, many small files, a reader of the receiver's output
//! that goes away (EPIPE), links in trees, hostile receiver-side links,
//! --max-size on a stream, a slow producer kept alive (with progress lines
//! in the tools' logs), corruption seen on
//! standard output; the files `--exclude`/`--include`, `--files-from` and
//! `-R` select.

use crate::support::*;
use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::Path;
use std::time::{Duration, Instant};

/// The statuses of a pipeline's stages.
fn stages(stderr: &str) -> Vec<i32> {
    stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("pipe-status "))
        .unwrap_or_else(|| panic!("no pipe-status in:\n{stderr}"))
        .split_whitespace()
        .map(|s| s.parse().expect("status"))
        .collect()
}

/// `receiver --once --stdout ... | TAIL`, listening.
fn receiver_to(net: &Net, port: u16, tail: &str, extra: &[&str]) -> Running {
    let extra: Vec<String> = extra.iter().map(q).collect();
    let script = format!(
        "{} --bind {} --port {port} -v --once --stdout --insecure {} | {tail}",
        q(receiver_bin()),
        q(&net.addr_a),
        extra.join(" ")
    );
    let mut r = pipeline("receiver pipeline", &script, 0);
    r.wait_for_stderr("listening", Duration::from_secs(60));
    r
}

/// `HEAD | sender ... -`.
fn sender_from(net: &Net, port: u16, head: &str, extra: &[&str]) -> Running {
    let script = format!(
        "{head} | {}",
        sender_line(sender_bin(), net, port, extra, &["-"])
    );
    pipeline("sender pipeline", &script, 1)
}

/// What a tree holds: relative path -> (kind and content hash, mode).
fn snapshot(root: &Path) -> BTreeMap<String, (String, u32)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, (String, u32)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .expect("read_dir")
            .map(|e| e.expect("entry"))
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for e in entries {
            let path = e.path();
            let rel = path
                .strip_prefix(root)
                .expect("below root")
                .to_string_lossy()
                .into_owned();
            let meta = std::fs::symlink_metadata(&path).expect("lstat");
            let mode = meta.permissions().mode() & 0o7777;
            if meta.is_dir() {
                out.insert(rel, ("dir".into(), mode));
                walk(root, &path, out);
            } else if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path).expect("readlink");
                out.insert(rel, (format!("link {}", target.display()), 0));
            } else {
                out.insert(rel, (format!("file {}", sha256_file(&path)), mode));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn assert_same_tree(want: &Path, got: &Path) {
    let (a, b) = (snapshot(want), snapshot(got));
    for (k, v) in &a {
        assert_eq!(
            b.get(k),
            Some(v),
            "{k} differs ({} vs {})",
            want.display(),
            got.display()
        );
    }
    assert_eq!(
        a.len(),
        b.len(),
        "extra entries in {}: {:?}",
        got.display(),
        b.keys().filter(|k| !a.contains_key(*k)).collect::<Vec<_>>()
    );
}

/// No `.rdma-xfer-*.part` anywhere below `dir`.
fn assert_no_temp_files_below(dir: &Path) {
    assert_no_temp_files(dir);
    for e in std::fs::read_dir(dir).expect("read_dir") {
        let e = e.expect("entry");
        if e.file_type().expect("type").is_dir() {
            assert_no_temp_files_below(&e.path());
        }
    }
}

fn set_mode(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A tree with nested and empty directories, empty files, odd but legal
/// names, several modes and a few MiB of data.
fn make_tree(root: &Path, big: u64) {
    let dirs = [
        "a",
        "a/b",
        "a/b/c deeper",
        "empty dir",
        "ünïcødé 文件",
        "modes",
        "modes/private",
    ];
    for d in dirs {
        std::fs::create_dir_all(root.join(d)).expect("mkdir");
    }
    let files: [(&str, u64); 10] = [
        ("top.bin", big),
        ("a/one", 1),
        ("a/b/chunk", CHUNK + 3),
        ("a/b/c deeper/empty", 0),
        ("a/b/c deeper/x y z.txt", 12_345),
        ("ünïcødé 文件/🚀 rocket.dat", 4096),
        ("modes/script.sh", 100),
        ("modes/readonly", 10),
        ("modes/private/secret", 20),
        (" leading space", 7),
    ];
    for (i, (f, size)) in files.iter().enumerate() {
        make_file(&root.join(f), *size, 0xabc + i as u64);
    }
    set_mode(&root.join("modes/script.sh"), 0o755);
    set_mode(&root.join("modes/readonly"), 0o444);
    set_mode(&root.join("modes/private/secret"), 0o600);
    set_mode(&root.join("modes/private"), 0o700);
    set_mode(&root.join("empty dir"), 0o750);
}

fn mib_per_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
}

#[test]
fn tar_pipe_round_trip_of_a_tree() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    make_tree(src.path(), 64 * MIB);
    let port = next_port();
    let receiver = receiver_to(
        &net,
        port,
        &format!("tar -C {} -xpf -", qp(dst.path())),
        &[],
    );
    let started = Instant::now();
    let sent = sender_from(
        &net,
        port,
        &format!("tar -C {} -cf - .", qp(src.path())),
        &["--name", "tree.tar"],
    )
    .wait(Duration::from_secs(600));
    let elapsed = started.elapsed();
    let received = receiver.wait(Duration::from_secs(120));
    assert_eq!(stages(&sent.stderr), [0, 0], "sender:\n{}", sent.stderr);
    assert_eq!(
        stages(&received.stderr),
        [0, 0],
        "receiver:\n{}",
        received.stderr
    );
    assert_same_tree(src.path(), dst.path());
    let bytes = bytes_of_file_line(&sent.stderr, "tree.tar")
        .unwrap_or_else(|| panic!("no summary in:\n{}", sent.stderr));
    eprintln!(
        "MEASURE tar pipe: {bytes} bytes in {:.2} s = {:.1} MiB/s (tar | sender - ... receiver --stdout | tar -x)",
        elapsed.as_secs_f64(),
        mib_per_s(bytes, elapsed)
    );
}

#[test]
fn send_r_of_the_same_tree_keeps_modes_and_times() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tree = src.path().join("tree");
    make_tree(&tree, 5 * MIB);
    let tree_arg = std::slice::from_ref(&tree);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &[],
        tree_arg,
        &["-r", "--preserve-times"],
    );
    assert_both_ok(&sent, &received);
    assert!(
        sent.stderr.contains("total: 10 files and 8 directories"),
        "{}",
        sent.stderr
    );
    let got = dst.path().join("tree");
    assert_same_tree(&tree, &got);
    // Modes of the roots and every mtime, directories included.
    let m = |p: &Path| std::fs::metadata(p).expect("meta");
    assert_eq!(m(&tree).mode() & 0o7777, m(&got).mode() & 0o7777);
    for (rel, _) in snapshot(&tree) {
        let (a, b) = (m(&tree.join(&rel)), m(&got.join(&rel)));
        assert_eq!(
            (a.mtime(), a.mtime_nsec()),
            (b.mtime(), b.mtime_nsec()),
            "mtime of {rel}"
        );
    }
    assert_no_temp_files_below(dst.path());

    // Again into the same directory: the directories merge, every file is
    // unchanged (the same size and time: exit 0) and nothing changes.
    let before = snapshot(dst.path());
    let tree_arg = std::slice::from_ref(&tree);
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], tree_arg, &["-r"]);
    assert_both_ok(&sent, &received);
    assert!(
        sent.stderr.contains("10 unchanged (nothing sent)"),
        "{}",
        sent.stderr
    );
    assert_eq!(snapshot(dst.path()), before);
    // With -I (times not trusted) every file is refused as existing
    // (exit 4), and still nothing changes.
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], tree_arg, &["-r", "-I"]);
    assert_eq!(sent.code(), 4, "sender:\n{}", sent.stderr);
    assert_eq!(received.code(), 4, "receiver:\n{}", received.stderr);
    assert!(sent.stderr.contains("already exists"), "{}", sent.stderr);
    assert_eq!(snapshot(dst.path()), before);
}

#[test]
fn stdin_of_zero_bytes() {
    let Some(net) = rdma_net() else { return };
    // Into --dir, under --name.
    let dst = tempfile::tempdir().expect("dst");
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--once"]);
    let sent =
        sender_from(&net, port, "true", &["--name", "nothing.bin"]).wait(Duration::from_secs(120));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&sent.stderr), [0, 0], "{}", sent.stderr);
    assert_eq!(received.code(), 0, "{}", received.stderr);
    let out = dst.path().join("nothing.bin");
    assert_eq!(std::fs::metadata(&out).expect("output").len(), 0);
    assert!(
        bytes_of_file_line(&sent.stderr, "nothing.bin") == Some(0),
        "{}",
        sent.stderr
    );
    // To standard output, default name.
    let out = dst.path().join("stdout.bin");
    let port = next_port();
    let receiver = receiver_to(&net, port, &format!("cat > {}", qp(&out)), &[]);
    let sent = sender_from(&net, port, "true", &[]).wait(Duration::from_secs(120));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&sent.stderr), [0, 0], "{}", sent.stderr);
    assert_eq!(stages(&received.stderr), [0, 0], "{}", received.stderr);
    assert!(
        bytes_of_file_line(&received.stderr, "stdin") == Some(0),
        "{}",
        received.stderr
    );
    assert_eq!(std::fs::metadata(&out).expect("output").len(), 0);
}

#[test]
fn stdin_larger_than_four_rings_through_pipes() {
    let Some(net) = rdma_net() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let input = dir.path().join("input.bin");
    // 80 MiB + 3 bytes: five 16 x 1 MiB rings and a short last chunk.
    let size = 80 * MIB + 3;
    let sum = make_file(&input, size, 0x5717);
    let out = dir.path().join("output.bin");
    let port = next_port();
    let receiver = receiver_to(&net, port, &format!("cat > {}", qp(&out)), &[]);
    let started = Instant::now();
    let sent = sender_from(
        &net,
        port,
        &format!("cat {}", qp(&input)),
        &["--verify", "sha256"],
    )
    .wait(Duration::from_secs(600));
    let elapsed = started.elapsed();
    let received = receiver.wait(Duration::from_secs(120));
    assert_eq!(stages(&sent.stderr), [0, 0], "{}", sent.stderr);
    assert_eq!(stages(&received.stderr), [0, 0], "{}", received.stderr);
    assert_eq!(sha256_file(&out), sum);
    assert!(
        bytes_of_file_line(&received.stderr, "stdin") == Some(size),
        "{}",
        received.stderr
    );
    eprintln!(
        "MEASURE stdin pipe to stdout pipe: {size} bytes in {:.2} s = {:.1} MiB/s",
        elapsed.as_secs_f64(),
        mib_per_s(size, elapsed)
    );
    // The same from a redirected file into --dir: `sender - < file`.
    let dst = tempfile::tempdir().expect("dst");
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--once"]);
    let script = format!(
        "{} < {}",
        sender_line(sender_bin(), &net, port, &["--name", "big.iso"], &["-"]),
        qp(&input)
    );
    let sent = pipeline("sender", &script, 0).wait(Duration::from_secs(600));
    let received = receiver.wait(Duration::from_secs(120));
    assert_both_ok(&sent, &received);
    assert_eq!(sha256_file(&dst.path().join("big.iso")), sum);
    assert_no_temp_files(dst.path());
}

#[test]
fn thousand_small_files_per_second_versus_one_file() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("src");
    let tree = src.path().join("small");
    let mut total = 0u64;
    let mut state = 0x1234_5678u64;
    for d in 0..10 {
        let dir = tree.join(format!("d{d:02}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for f in 0..100 {
            // 0 .. 8 KiB, some empty.
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let size = ((state >> 33) % 8192) * u64::from(f % 10 != 0);
            make_file(&dir.join(format!("f{f:03}")), size, state);
            total += size;
        }
    }
    let one = src.path().join("one.bin");
    make_file(&one, total, 0x0e);

    let dst = tempfile::tempdir().expect("dst");
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--once"]);
    let started = Instant::now();
    let sent = run_sender(
        &net,
        port,
        Path_::Wire,
        std::slice::from_ref(&tree),
        &["-r"],
    );
    let tree_time = started.elapsed();
    let received = receiver.wait(Duration::from_secs(120));
    assert_both_ok(&sent, &received);
    assert_same_tree(&tree, &dst.path().join("small"));

    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--once"]);
    let started = Instant::now();
    let sent = run_sender(&net, port, Path_::Wire, std::slice::from_ref(&one), &[]);
    let one_time = started.elapsed();
    let received = receiver.wait(Duration::from_secs(120));
    assert_both_ok(&sent, &received);
    eprintln!(
        "MEASURE 1000 small files ({total} bytes in 10 directories): {:.2} s = {:.0} files/s, {:.2} MiB/s; \
         one file of the same size: {:.2} s, {:.2} MiB/s (sender start to exit)",
        tree_time.as_secs_f64(),
        1000.0 / tree_time.as_secs_f64(),
        mib_per_s(total, tree_time),
        one_time.as_secs_f64(),
        mib_per_s(total, one_time)
    );
}

#[test]
fn small_files_go_in_batches_and_a_refused_batch_goes_file_by_file() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("src");
    let tree = src.path().join("t");
    std::fs::create_dir_all(tree.join("sub")).expect("mkdir");
    // A file too large for a batch (it goes first, alone: its MR makes
    // the ring known, so the batch after it is read ahead of its own MR),
    // and 40 small files (one empty).
    for i in 0..40u64 {
        make_file(&tree.join(format!("sub/f{i:02}")), i * 997, 0x100 + 2 * i);
    }
    make_file(&tree.join("sub/a-big"), 3 * MIB, 0x77);
    let tree_arg = std::slice::from_ref(&tree);

    // Everything new: the small files travel in batches, all arrive.
    let dst = tempfile::tempdir().expect("dst");
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &["-vv"], tree_arg, &["-r"]);
    assert_both_ok(&sent, &received);
    assert_same_tree(&tree, &dst.path().join("t"));
    assert_no_temp_files_below(dst.path());
    assert!(
        received.stderr.contains("offer of a batch"),
        "{}",
        received.stderr
    );
    assert!(sent.stderr.contains("total: 41 files"), "{}", sent.stderr);

    // One of them exists on the receiver: its batch is refused, its files
    // go one by one, and only that one is refused (exit 4), untouched.
    let dst = tempfile::tempdir().expect("dst");
    std::fs::create_dir_all(dst.path().join("t/sub")).expect("mkdir");
    let theirs = dst.path().join("t/sub/f07");
    std::fs::write(&theirs, b"the receiver's own").expect("write");
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["-vv"],
        tree_arg,
        &["-r", "--json"],
    );
    assert_eq!(sent.code(), 4, "sender:\n{}", sent.stderr);
    assert_eq!(received.code(), 4, "receiver:\n{}", received.stderr);
    assert!(
        received.stderr.contains("batch refused"),
        "{}",
        received.stderr
    );
    assert_eq!(std::fs::read(&theirs).expect("read"), b"the receiver's own");
    let events: Vec<&str> = sent
        .stdout
        .lines()
        .filter(|l| l.contains(r#""event":"file""#))
        .collect();
    let failed: Vec<&&str> = events
        .iter()
        .filter(|l| !l.contains(r#""status":"ok""#))
        .collect();
    assert_eq!(events.len(), 41, "{}", sent.stdout);
    assert_eq!(failed.len(), 1, "{}", sent.stdout);
    assert!(
        failed[0].contains("sub/f07") && failed[0].contains("already exists"),
        "{}",
        failed[0]
    );
    std::fs::write(&theirs, std::fs::read(tree.join("sub/f07")).expect("read")).expect("write");
    assert_same_tree(&tree, &dst.path().join("t"));
    assert_no_temp_files_below(dst.path());
}

#[test]
fn epipe_on_the_receivers_stdout_ends_it_quietly() {
    let Some(net) = rdma_net() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let input = dir.path().join("input.bin");
    make_file_undigested(&input, 64 * MIB, 0xe919e);
    let port = next_port();
    let receiver = receiver_to(&net, port, "head -c 1000 > /dev/null", &[]);
    let sent =
        sender_from(&net, port, &format!("cat {}", qp(&input)), &[]).wait(Duration::from_secs(300));
    let received = receiver.wait(Duration::from_secs(60));
    // Receiver: exit 0, one warning, no panic, no broken-pipe noise.
    assert_eq!(stages(&received.stderr)[0], 0, "{}", received.stderr);
    assert!(
        received.stderr.contains("standard output was closed after"),
        "{}",
        received.stderr
    );
    assert!(!received.stderr.contains("panicked"), "{}", received.stderr);
    assert!(!received.stderr.contains("error:"), "{}", received.stderr);
    // Sender: exit 6 with the receiver's reason.
    assert_eq!(stages(&sent.stderr)[1], 6, "{}", sent.stderr);
    assert!(
        sent.stderr
            .contains("the receiver's standard output was closed by its reader"),
        "{}",
        sent.stderr
    );
    assert!(!sent.stderr.contains("panicked"), "{}", sent.stderr);
}

#[test]
fn symlinks_in_a_tree_are_skipped_or_followed() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("src");
    let tree = src.path().join("linked");
    std::fs::create_dir_all(tree.join("real dir")).expect("mkdir");
    let sum = make_file(&tree.join("real dir/data"), 5000, 7);
    make_file(&tree.join("plain"), 10, 8);
    symlink("real dir/data", tree.join("file link")).expect("symlink");
    symlink("real dir", tree.join("dir link")).expect("symlink");

    let dst = tempfile::tempdir().expect("dst");
    let tree_arg = std::slice::from_ref(&tree);
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], tree_arg, &["-r"]);
    assert_both_ok(&sent, &received);
    assert!(
        sent.stderr.contains("skipping symbolic link") && sent.stderr.contains("file link"),
        "{}",
        sent.stderr
    );
    assert!(
        sent.stderr.contains("2 links or special files skipped"),
        "{}",
        sent.stderr
    );
    let got = dst.path().join("linked");
    assert!(got.join("plain").is_file() && got.join("real dir/data").is_file());
    assert!(std::fs::symlink_metadata(got.join("file link")).is_err());
    assert!(std::fs::symlink_metadata(got.join("dir link")).is_err());

    let dst = tempfile::tempdir().expect("dst");
    let tree_arg = std::slice::from_ref(&tree);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &[],
        tree_arg,
        &["-r", "--follow-links"],
    );
    assert_both_ok(&sent, &received);
    let got = dst.path().join("linked");
    // Followed links arrive as what they point to.
    assert_eq!(sha256_file(&got.join("file link")), sum);
    assert_eq!(sha256_file(&got.join("dir link/data")), sum);
    assert!(
        std::fs::symlink_metadata(got.join("dir link"))
            .expect("dir")
            .is_dir()
    );
}

#[test]
fn a_link_on_the_receiver_is_never_written_through() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("src");
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).expect("mkdir");
    make_file(&tree.join("sub/f"), 100, 1);
    make_file(&tree.join("g"), 100, 2);
    let dst = tempfile::tempdir().expect("dst");
    let outside = tempfile::tempdir().expect("outside");
    // Someone left `tree` in --dir pointing elsewhere.
    symlink(outside.path(), dst.path().join("tree")).expect("symlink");
    let tree_arg = std::slice::from_ref(&tree);
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], tree_arg, &["-r"]);
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    assert_eq!(received.code(), 4, "{}", received.stderr);
    assert!(sent.stderr.contains("symbolic link"), "{}", sent.stderr);
    assert_eq!(
        std::fs::read_dir(outside.path()).expect("outside").count(),
        0,
        "something was written through the link"
    );
    assert_no_temp_files(dst.path());
}

#[test]
fn a_stream_over_max_size_is_refused_as_it_arrives() {
    let Some(net) = rdma_net() else { return };
    let dst = tempfile::tempdir().expect("dst");
    let input = dst.path().join("input.bin");
    make_file(&input, 5 * MIB, 3);
    let out = tempfile::tempdir().expect("out");
    let port = next_port();
    let receiver = start_receiver(&net, port, out.path(), &["--once", "--max-size", "2M"]);
    let sent = sender_from(&net, port, &format!("cat {}", qp(&input)), &["--name", "s"])
        .wait(Duration::from_secs(120));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&sent.stderr)[1], 4, "{}", sent.stderr);
    assert!(
        sent.stderr.contains("more than 2097152 bytes"),
        "{}",
        sent.stderr
    );
    assert_eq!(received.code(), 4, "{}", received.stderr);
    assert_eq!(std::fs::read_dir(out.path()).expect("out").count(), 0);
}

#[test]
fn a_slow_producer_is_kept_alive() {
    let Some(net) = rdma_net() else { return };
    let dst = tempfile::tempdir().expect("dst");
    let port = next_port();
    let every = ["--stats", "1s"];
    let receiver = start_receiver(
        &net,
        port,
        dst.path(),
        &[&["--once", "--timeout", "2"][..], &every].concat(),
    );
    // Silent for twice the receiver's timeout, mid-stream.
    let sent = sender_from(
        &net,
        port,
        "{ head -c 3000000 /dev/zero; sleep 5; printf def; }",
        &[&["--timeout", "2", "--name", "slow"][..], &every].concat(),
    )
    .wait(Duration::from_secs(60));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&sent.stderr), [0, 0], "{}", sent.stderr);
    assert_eq!(received.code(), 0, "{}", received.stderr);
    let got = std::fs::read(dst.path().join("slow")).expect("output");
    assert_eq!(got.len(), 3_000_003);
    assert!(got.ends_with(b"\0def") && got[..3_000_000].iter().all(|&b| b == 0));
    // Bytes moved again more than a second after the first: stderr is not
    // a terminal, so each tool logged a progress line.
    for (tool, stderr) in [("sender", &sent.stderr), ("receiver", &received.stderr)] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with("progress: ") && l.contains(" MiB/s")),
            "{tool} logged no progress line:\n{stderr}"
        );
    }
}

/// `--progress` draws the bars into a pipe too (a CI log that renders
/// them), with the cursor moves of a terminal.
#[test]
fn progress_bars_forced_into_a_pipe() {
    let Some(net) = rdma_net() else { return };
    let dst = tempfile::tempdir().expect("dst");
    let port = next_port();
    let receiver = start_receiver(&net, port, dst.path(), &["--once"]);
    let sent = sender_from(
        &net,
        port,
        "{ head -c 3000000 /dev/zero; sleep 1; printf def; }",
        &["--progress", "--name", "forced"],
    )
    .wait(Duration::from_secs(60));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&sent.stderr), [0, 0], "{}", sent.stderr);
    assert_eq!(received.code(), 0, "{}", received.stderr);
    assert_eq!(
        std::fs::metadata(dst.path().join("forced"))
            .expect("output")
            .len(),
        3_000_003
    );
    assert!(
        sent.stderr.contains("\x1b["),
        "no cursor moves: {:?}",
        sent.stderr
    );
    assert!(
        sent.stderr.contains("forced") && sent.stderr.contains("MiB/s"),
        "no bar: {:?}",
        sent.stderr
    );
}

#[test]
fn corruption_seen_on_stdout_exits_5() {
    let Some(net) = rdma_net() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let input = dir.path().join("input.bin");
    make_file(&input, 6 * MIB, 0xbad);
    let out = dir.path().join("out.bin");
    let port = next_port();
    let receiver = receiver_to(&net, port, &format!("cat > {}", qp(&out)), &[]);
    let script = format!(
        "cat {} | RDMA_XFER_FAULT=corrupt-chunk:3 {}",
        qp(&input),
        sender_line(&fault_injection_bin("sender"), &net, port, &[], &["-"])
    );
    let sent = pipeline("sender", &script, 1).wait(Duration::from_secs(120));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&sent.stderr)[1], 5, "{}", sent.stderr);
    assert_eq!(stages(&received.stderr)[0], 5, "{}", received.stderr);
    assert!(
        received
            .stderr
            .contains("standard output got only the 3145728 bytes before it"),
        "{}",
        received.stderr
    );
    assert_eq!(std::fs::metadata(&out).expect("out").len(), 3 * MIB);
}

/// The chunks' tags: what an on-path injector who knows the ring's rkey
/// and the queue pair's numbers (they travel in the clear) writes into the
/// ring, with a CRC32 of its own bytes as the immediate, passes every
/// chunk check but the tag. Without a token the forged chunk reaches the
/// consumer (only the whole-stream digest at the end says so); with one
/// the receiver stops before it: the consumer gets the chunks before it,
/// never a forged byte.
#[test]
fn with_a_token_a_forged_chunk_never_reaches_standard_output() {
    let Some(net) = rdma_net() else { return };
    let dir = tempfile::tempdir().expect("dir");
    let input = dir.path().join("input.bin");
    make_file(&input, 6 * MIB, 0xf0f);
    let fault_sender = fault_injection_bin("sender");
    let forged = |out: &Path| {
        std::fs::read(out)
            .expect("out")
            .windows(12)
            .any(|w| w == b"FORGEDFORGED")
    };

    // Without a token: the forged chunk is delivered, then caught.
    let open = dir.path().join("open.bin");
    let port = next_port();
    let receiver = receiver_to(&net, port, &format!("cat > {}", qp(&open)), &[]);
    let script = format!(
        "cat {} | RDMA_XFER_FAULT=forge-chunk:3 {}",
        qp(&input),
        sender_line(&fault_sender, &net, port, &[], &["-"])
    );
    let sent = pipeline("sender", &script, 1).wait(Duration::from_secs(120));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&received.stderr)[0], 5, "{}", received.stderr);
    assert_eq!(stages(&sent.stderr)[1], 5, "{}", sent.stderr);
    assert!(forged(&open), "the fault forged nothing");

    // With a token: stopped at the forged chunk, before its first byte.
    let sealed = dir.path().join("sealed.bin");
    let port = next_port();
    let token = "forge-test-token-0123456789abcdef";
    let script = format!(
        "RDMA_XFER_TOKEN={token} {} --bind {} --port {port} -v --once --stdout | cat > {}",
        q(receiver_bin()),
        q(&net.addr_a),
        qp(&sealed)
    );
    let mut receiver = pipeline("receiver pipeline", &script, 0);
    receiver.wait_for_stderr("listening", Duration::from_secs(60));
    let script = format!(
        "cat {} | RDMA_XFER_FAULT=forge-chunk:3 RDMA_XFER_TOKEN={token} {}",
        qp(&input),
        sender_line(&fault_sender, &net, port, &[], &["-"])
    );
    let sent = pipeline("sender", &script, 1).wait(Duration::from_secs(120));
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(stages(&received.stderr)[0], 5, "{}", received.stderr);
    assert!(
        received.stderr.contains("chunk 3 of") && received.stderr.contains("authentication tag"),
        "{}",
        received.stderr
    );
    assert_eq!(stages(&sent.stderr)[1], 5, "{}", sent.stderr);
    assert!(!forged(&sealed), "a forged byte reached the consumer");
    assert_eq!(std::fs::metadata(&sealed).expect("out").len(), 3 * MIB);
}

/// What arrived below `dst`: files by relative path, directories with a
/// trailing `/`.
fn arrived(dst: &Path) -> Vec<String> {
    snapshot(dst)
        .into_iter()
        .map(|(k, (kind, _))| if kind == "dir" { format!("{k}/") } else { k })
        .collect()
}

#[test]
fn selected_files_arrive_and_nothing_else() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().expect("src");
    let tree = src.path().join("sel");
    for (i, f) in [
        "keep.tmp",
        "drop.tmp",
        "a.txt",
        "cache/keep.tmp",
        "cache/c.bin",
        "sub/x.tmp",
        "sub/cache",
        "sub/deep/y",
    ]
    .iter()
    .enumerate()
    {
        std::fs::create_dir_all(tree.join(f).parent().expect("parent")).expect("mkdir");
        make_file(&tree.join(f), 1000 + i as u64, i as u64);
    }
    // rsync's first-match order: the include before the exclusion it
    // escapes; an excluded directory is not walked (its keep.tmp stays).
    let dst = tempfile::tempdir().expect("dst");
    let filter = [
        "-r",
        "--include",
        "keep.tmp",
        "--exclude",
        "*.tmp",
        "--exclude",
        "cache/",
    ];
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &[],
        std::slice::from_ref(&tree),
        &filter,
    );
    assert_both_ok(&sent, &received);
    assert_eq!(
        arrived(dst.path()),
        [
            "sel/",
            "sel/a.txt",
            "sel/keep.tmp",
            "sel/sub/",
            "sel/sub/cache",
            "sel/sub/deep/",
            "sel/sub/deep/y"
        ]
    );
    assert_eq!(
        sha256_file(&dst.path().join("sel/sub/deep/y")),
        sha256_file(&tree.join("sub/deep/y"))
    );
    // --files-from: the listed paths below the source directory, kept.
    let list = src.path().join("list");
    std::fs::write(&list, "# wanted\nsub/deep/y\n\ncache/c.bin\n").expect("list");
    let dst = tempfile::tempdir().expect("dst");
    let list_arg = list.to_str().expect("utf8");
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &[],
        std::slice::from_ref(&tree),
        &["--files-from", list_arg],
    );
    assert_both_ok(&sent, &received);
    assert_eq!(
        arrived(dst.path()),
        ["cache/", "cache/c.bin", "sub/", "sub/deep/", "sub/deep/y"]
    );
    // -R: the path from the `/./` on.
    let dst = tempfile::tempdir().expect("dst");
    let kept = std::path::PathBuf::from(format!("{}/./sel/sub/x.tmp", src.path().display()));
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], &[kept], &["-R"]);
    assert_both_ok(&sent, &received);
    assert_eq!(arrived(dst.path()), ["sel/", "sel/sub/", "sel/sub/x.tmp"]);
}
