//! The receiver's policies on real RDMA (run in the SoftRoCE guest by
//! `make test`): `--discard` verifies and drops, and every check that
//! guards the file store still guards it.

use crate::support::*;
use std::path::Path;
use std::time::Duration;

/// Everything under `dir`, as relative paths (directories too), sorted.
fn everything_under(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read dir").flatten() {
            let path = e.path();
            found.push(path.strip_prefix(dir).unwrap().display().to_string());
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(path);
            }
        }
    }
    found.sort();
    found
}

/// A tree of `files` files (a few bytes to a few chunks, nested three
/// deep) under `root`; returns their relative paths.
fn make_tree(root: &Path, files: u64) -> Vec<String> {
    (0..files)
        .map(|i| {
            let rel = format!("d{}/e{}/f{i:03}", i % 4, i % 3);
            let path = root.join(&rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            // Mostly small (batched), every tenth larger than a chunk.
            let size = if i % 10 == 0 { 2 * CHUNK + i } else { i * 997 };
            make_file(&path, size, 500 + i);
            rel
        })
        .collect()
}

/// Sends `input` with the fault-injection sender under `fault`
/// (`RDMA_XFER_FAULT`) and `extra`, to its end.
fn send_with_fault(net: &Net, port: u16, input: &Path, fault: &str, extra: &[&str]) -> Finished {
    let sender = fault_injection_bin("sender");
    let files = [input.to_path_buf()];
    let mut cmd = SenderCommand::new(net, port, Path_::Wire)
        .bin(&sender)
        .files(&files)
        .args(extra)
        .command();
    cmd.env("RDMA_XFER_FAULT", fault);
    Running::spawn("sender", cmd).wait(Duration::from_secs(120))
}

/// The `--json` objects of acknowledged files on a tool's stdout.
fn acknowledged(who: &str, run: &Finished) -> Vec<serde_json::Value> {
    json_lines(who, &run.stdout)
        .into_iter()
        .filter(|v| v["event"] == "file" && v["exit_code"] == 0)
        .collect()
}

#[test]
fn discard_verifies_300_mib_and_a_tree_of_100_files_and_writes_nothing() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let big = src.path().join("big.bin");
    make_file_undigested(&big, 300 * MIB, 31);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--discard", "--json"],
        std::slice::from_ref(&big),
        &["--json"],
    );
    assert_both_ok(&sent, &received);
    let files = acknowledged("receiver", &received);
    assert_eq!(files.len(), 1, "{}", received.transcript());
    assert_eq!(files[0]["outcome"], "discarded");
    assert_eq!(files[0]["bytes"], 300 * MIB);
    assert_eq!(everything_under(dst.path()), Vec::<String>::new());
    assert!(
        received.stderr.contains("discarding what arrives"),
        "the listening line says so:\n{}",
        received.stderr
    );

    // A tree: batches of small files, directories, larger files.
    let tree = src.path().join("t");
    let names = make_tree(&tree, 100);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--discard", "-v"],
        std::slice::from_ref(&tree),
        &["-r", "--json"],
    );
    assert_both_ok(&sent, &received);
    let told = acknowledged("sender", &sent);
    assert_eq!(told.len(), names.len());
    assert!(told.iter().all(|f| f["outcome"] == "discarded"), "{told:?}");
    for n in &names {
        let line = format!("t/{n}: ");
        let said = received
            .stderr
            .lines()
            .find(|l| l.starts_with(&line))
            .unwrap_or_else(|| panic!("no line for t/{n}:\n{}", received.stderr));
        assert!(said.contains(", discarded"), "{said}");
    }
    assert_eq!(everything_under(dst.path()), Vec::<String>::new());
}

#[test]
fn discard_still_fails_a_corrupted_chunk_and_a_wrong_digest_with_exit_5() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("bitflip.bin");
    make_file(&input, 8 * MIB + 5, 21);
    for (fault, says) in [
        ("corrupt-chunk:3", "chunk 3 of bitflip.bin"),
        (
            "corrupt-digest",
            "whole-file digest mismatch for bitflip.bin",
        ),
    ] {
        let port = next_port();
        let mut receiver = start_receiver(&net, port, dst.path(), &["--discard"]);
        let sent = send_with_fault(&net, port, &input, fault, &[]);
        assert_eq!(sent.code(), 5, "{fault}: {}", sent.stderr);
        // The receiver logs the failed file after its ACK went out: wait.
        receiver.wait_for_stderr(says, Duration::from_secs(30));
        assert_eq!(everything_under(dst.path()), Vec::<String>::new());
        // It serves on: the next (good) transfer is verified and dropped.
        let sent = run_sender(&net, port, Path_::Wire, std::slice::from_ref(&input), &[]);
        assert_eq!(sent.code(), 0, "{}", sent.stderr);
    }
}

/// `--exec` that stores each file as its `zstd` compression.
const ZSTD_EACH: &str =
    r#"mkdir -p -- "$(dirname -- "$RDMA_XFER_NAME")" && zstd -q -o "$RDMA_XFER_NAME.zst""#;

#[test]
fn exec_compresses_a_tree_of_50_files_as_they_arrive() {
    let Some(net) = rdma_net() else { return };
    assert!(have("zstd"), "zstd is installed by scripts/install-deps.sh");
    let (src, dst) = dirs();
    let tree = src.path().join("t");
    let names = make_tree(&tree, 50);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &args(&["--exec", ZSTD_EACH, "--json"], &token_args()),
        std::slice::from_ref(&tree),
        &args(&["-r", "--json"], &token_args()),
    );
    assert_both_ok(&sent, &received);
    let told = acknowledged("sender", &sent);
    assert!(told.iter().all(|f| f["outcome"] == "piped"), "{told:?}");
    let files = acknowledged("receiver", &received);
    assert_eq!(files.len(), names.len(), "{}", received.transcript());
    assert!(files.iter().all(|f| f["outcome"] == "piped"), "{files:?}");
    for n in &names {
        let packed = dst.path().join(format!("t/{n}.zst"));
        let out = std::process::Command::new("zstd")
            .arg("-dc")
            .arg(&packed)
            .output()
            .expect("zstd -dc");
        assert!(out.status.success(), "{}: {out:?}", packed.display());
        assert_eq!(sha256_hex(&out.stdout), sha256_file(&tree.join(n)), "{n}");
    }
    // Only what the command made: no file of the receiver's own.
    assert_eq!(
        everything_under(dst.path())
            .iter()
            .filter(|p| p.ends_with(".zst"))
            .count(),
        50
    );
    assert_no_temp_files(dst.path());
}

#[test]
fn exec_failing_on_the_third_file_fails_that_file_only_with_its_status() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tree = src.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    // f02 is larger than any pipe: the command's early exit is a broken
    // pipe mid-file, not only a status at the end.
    for i in 0..6u64 {
        let size = if i == 2 { 6 * MIB + 7 } else { 100_000 + i };
        make_file(&tree.join(format!("f{i:02}")), size, 70 + i);
    }
    for (how, cmd) in [
        (
            "exits at once",
            r#"case "$RDMA_XFER_NAME" in */f02) exit 1;; esac; mkdir -p t && cat > "$RDMA_XFER_NAME""#,
        ),
        (
            "reads it all, then fails",
            r#"mkdir -p t && cat > "$RDMA_XFER_NAME.tmp" && case "$RDMA_XFER_NAME" in */f02) exit 1;; esac && mv "$RDMA_XFER_NAME.tmp" "$RDMA_XFER_NAME""#,
        ),
    ] {
        let port = next_port();
        let receiver_extra = args(&["--exec", cmd], &token_args());
        let receiver = start_receiver(&net, port, dst.path(), &receiver_extra);
        let sent = run_sender(
            &net,
            port,
            Path_::Wire,
            std::slice::from_ref(&tree),
            &args(&["-r"], &token_args()),
        );
        assert_eq!(sent.code(), 6, "{how}: {}", sent.transcript());
        let failure = sent
            .stderr
            .lines()
            .find(|l| l.contains("t/f02"))
            .unwrap_or_else(|| panic!("{how}: no line for t/f02:\n{}", sent.stderr));
        assert!(failure.contains("exited with status 1"), "{how}: {failure}");
        for i in [0u64, 1, 3, 4, 5] {
            let name = format!("t/f{i:02}");
            assert_eq!(
                sha256_file(&dst.path().join(&name)),
                sha256_file(&src.path().join(&name)),
                "{how}: {name}"
            );
        }
        assert!(!dst.path().join("t/f02").exists(), "{how}");
        drop(receiver);
        std::fs::remove_dir_all(dst.path().join("t")).unwrap();
    }
}

#[test]
fn exec_slower_than_the_link_holds_the_sender_back_in_bounded_memory() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("slow.bin");
    let size = 128 * MIB;
    make_file(&input, size, 41);
    // About 20 MiB/s: a MiB, then a pause; counts what it took.
    let slow = r#"n=0; while k=$(head -c 1048576 | wc -c); [ "$k" -gt 0 ]; do n=$((n + k)); sleep 0.05; done; echo "$n" > taken"#;
    let started = std::time::Instant::now();
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &args(&["--exec", slow, "-v"], &token_args()),
        std::slice::from_ref(&input),
        &token_args(),
    );
    assert_both_ok(&sent, &received);
    let took = started.elapsed();
    let taken = std::fs::read_to_string(dst.path().join("taken")).unwrap();
    assert_eq!(taken.trim(), size.to_string());
    // 128 pauses of 50 ms at least: the sender went at the command's pace.
    assert!(took >= Duration::from_millis(128 * 50), "{took:?}");
    let bound = 64 * MIB + 16 * MIB;
    let (s, r) = (peak_rss(&sent.stderr), peak_rss(&received.stderr));
    eprintln!(
        "peak RSS with a slow command: sender {} KiB, receiver {} KiB",
        s / 1024,
        r / 1024
    );
    assert!(s < bound, "sender peak RSS {s} >= {bound}");
    assert!(r < bound, "receiver peak RSS {r} >= {bound}");
}

#[test]
fn exec_never_lets_its_command_finish_on_data_that_failed_its_check() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let input = src.path().join("bad.bin");
    make_file(&input, 3 * MIB + 1, 9);
    // forge-chunk: new bytes with their own CRC32 (an on-path injector's):
    // only the chunk's tag catches them, before the command reads a byte.
    for fault in ["corrupt-digest", "corrupt-chunk:1", "forge-chunk:1"] {
        let port = next_port();
        let mut receiver = start_receiver(
            &net,
            port,
            dst.path(),
            &args(
                &["--exec", r#"cat > "$RDMA_XFER_NAME" && touch complete"#],
                &token_args(),
            ),
        );
        let sent = send_with_fault(&net, port, &input, fault, &token_args());
        assert_eq!(sent.code(), 5, "{fault}: {}", sent.stderr);
        receiver.wait_for_stderr("bad.bin", Duration::from_secs(30));
        assert!(
            !dst.path().join("complete").exists(),
            "{fault}: the command saw a clean end"
        );
        if fault.starts_with("forge") {
            let fed = std::fs::read(dst.path().join("bad.bin")).unwrap_or_default();
            assert!(
                !fed.windows(12).any(|w| w == b"FORGEDFORGED"),
                "the command was fed forged bytes"
            );
            assert!(fed.len() as u64 <= MIB, "{} bytes fed", fed.len());
            let log = receiver.wait_for_stderr("authentication tag", Duration::from_secs(30));
            assert!(log.contains("chunk 1 of bad.bin"), "{log}");
        }
        // The receiver serves on, and the next good file is taken whole.
        let files = std::slice::from_ref(&input);
        let sent = run_sender(&net, port, Path_::Wire, files, &token_args());
        assert_eq!(sent.code(), 0, "{fault}: {}", sent.stderr);
        assert!(dst.path().join("complete").exists());
        assert_eq!(
            sha256_file(&dst.path().join("bad.bin")),
            sha256_file(&input)
        );
        std::fs::remove_file(dst.path().join("complete")).unwrap();
        std::fs::remove_file(dst.path().join("bad.bin")).unwrap();
    }
}

/// Device and inode of a file.
fn inode(path: &Path) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (m.dev(), m.ino())
}

/// The `--json` summary object on a tool's stdout.
fn summary(who: &str, run: &Finished) -> serde_json::Value {
    json_lines(who, &run.stdout)
        .into_iter()
        .find(|v| v["event"] == "summary")
        .unwrap_or_else(|| panic!("{who}: no summary:\n{}", run.transcript()))
}

#[test]
fn link_dest_links_a_200_mib_file_without_sending_it_and_sends_a_changed_one() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let earlier = tempfile::tempdir().unwrap();
    let big = src.path().join("big.bin");
    let sum = make_file(&big, 200 * MIB, 61);
    // The same size, one byte changed.
    let changed = src.path().join("changed.bin");
    make_file(&changed, 8 * MIB, 62);
    for f in [&big, &changed] {
        let to = earlier.path().join(f.file_name().unwrap());
        let status = std::process::Command::new("cp")
            .arg("-p")
            .arg(f)
            .arg(&to)
            .status()
            .unwrap();
        assert!(status.success());
    }
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(earlier.path().join("changed.bin"))
            .unwrap();
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, 5 * MIB).unwrap();
        f.write_all_at(&[byte[0] ^ 0x10], 5 * MIB).unwrap();
        // The copy keeps its time: only the content tells them apart.
        f.set_modified(std::fs::metadata(&changed).unwrap().modified().unwrap())
            .unwrap();
    }
    let wire = std::env::var("RXFER_NETDEV_B").ok();
    let before = wire.as_deref().map(tx_bytes);
    let ld = earlier.path().to_str().unwrap();
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &args(&["--link-dest", ld, "--json"], &token_args()),
        &[big.clone(), changed.clone()],
        &args(&["--checksum", "-p", "--json"], &token_args()),
    );
    assert_both_ok(&sent, &received);
    let on_wire = match (before, wire.as_deref()) {
        (Some(b), Some(dev)) => Some(tx_bytes(dev) - b),
        _ => None,
    };
    assert_eq!(
        inode(&dst.path().join("big.bin")),
        inode(&earlier.path().join("big.bin"))
    );
    assert_eq!(sha256_file(&dst.path().join("big.bin")), sum);
    assert_eq!(
        sha256_file(&dst.path().join("changed.bin")),
        sha256_file(&changed)
    );
    assert_ne!(
        inode(&dst.path().join("changed.bin")),
        inode(&earlier.path().join("changed.bin"))
    );
    let outcome = |who, run: &Finished, name: &str| {
        acknowledged(who, run)
            .into_iter()
            .find(|v| v["name"] == name)
            .map(|v| v["outcome"].as_str().unwrap_or("").to_string())
    };
    assert_eq!(
        outcome("sender", &sent, "big.bin").as_deref(),
        Some("linked")
    );
    assert_eq!(
        outcome("receiver", &received, "big.bin").as_deref(),
        Some("linked")
    );
    assert_eq!(
        outcome("sender", &sent, "changed.bin").as_deref(),
        Some("stored")
    );
    // Only the changed file's bytes moved: the receiver counts 8 MiB.
    assert_eq!(summary("receiver", &received)["sent"], 8 * MIB);
    assert_eq!(summary("sender", &sent)["linked"], 1);
    if let Some(n) = on_wire {
        assert!(n < 40 * MIB, "{n} bytes crossed the wire for 8 MiB of data");
    }
    assert_no_temp_files(dst.path());
}

#[test]
fn link_dest_copies_what_it_cannot_link_and_never_follows_a_link() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let earlier = tempfile::tempdir().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let tree = src.path().join("t");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    let private = tree.join("private.bin");
    make_file(&private, 3 * MIB, 71);
    let linked = tree.join("sub/via-link.bin");
    make_file(&linked, 2 * MIB, 72);
    // Offered with -p (mode 0644 and the source's time): the earlier copy
    // has another time (it was copied later), so it is copied, and keeps
    // its own mode, 0600, never the sender's.
    std::fs::create_dir_all(earlier.path().join("t")).unwrap();
    std::fs::copy(&private, earlier.path().join("t/private.bin")).unwrap();
    std::fs::set_permissions(
        earlier.path().join("t/private.bin"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    // t/sub under --link-dest is a link to a directory elsewhere that holds
    // the same file: not followed, so it is sent.
    std::fs::copy(&linked, outside.path().join("via-link.bin")).unwrap();
    std::os::unix::fs::symlink(outside.path(), earlier.path().join("t/sub")).unwrap();
    let ld = earlier.path().to_str().unwrap();
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &args(&["--link-dest", ld, "--json"], &token_args()),
        std::slice::from_ref(&tree),
        &args(&["-r", "-p", "--checksum", "--json"], &token_args()),
    );
    assert_both_ok(&sent, &received);
    let copy = dst.path().join("t/private.bin");
    assert_eq!(sha256_file(&copy), sha256_file(&private));
    assert_ne!(inode(&copy), inode(&earlier.path().join("t/private.bin")));
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&copy).unwrap().permissions());
    assert_eq!(mode & 0o7777, 0o600, "the copy's mode: {mode:o}");
    assert_eq!(
        sha256_file(&dst.path().join("t/sub/via-link.bin")),
        sha256_file(&linked)
    );
    let by_name: std::collections::HashMap<String, String> = acknowledged("sender", &sent)
        .into_iter()
        .map(|v| {
            (
                v["name"].as_str().unwrap().to_string(),
                v["outcome"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(by_name["t/private.bin"], "linked", "{by_name:?}");
    assert_eq!(by_name["t/sub/via-link.bin"], "stored", "{by_name:?}");
    assert!(
        received.stderr.contains("copied from --link-dest"),
        "{}",
        received.stderr
    );
    assert_eq!(summary("receiver", &received)["sent"], 2 * MIB);

    // Without --checksum nothing is asked: both are sent.
    let dst2 = tempfile::tempdir().unwrap();
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst2.path(),
        &args(&["--link-dest", ld, "--json"], &token_args()),
        std::slice::from_ref(&tree),
        &args(&["-r", "--json"], &token_args()),
    );
    assert_both_ok(&sent, &received);
    assert_eq!(summary("receiver", &received)["sent"], 5 * MIB);
}

#[test]
fn exec_commands_see_only_path_and_the_file_and_its_digest_with_checksum() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tree = src.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    let odd = tree.join("a 'quoted' $(name)");
    let sum = make_file(&odd, 3 * MIB + 3, 81);
    let cmd = r#"mkdir -p t && env > "$RDMA_XFER_NAME.env" && cat > "$RDMA_XFER_NAME""#;
    for checksum in [false, true] {
        let sender_extra: &[&str] = if checksum {
            &["-r", "--checksum"]
        } else {
            &["-r"]
        };
        let (sent, received) = one_session(
            &net,
            Path_::Wire,
            dst.path(),
            &args(&["--exec", cmd], &token_args()),
            std::slice::from_ref(&tree),
            &args(sender_extra, &token_args()),
        );
        assert_both_ok(&sent, &received);
        assert_eq!(sha256_file(&dst.path().join("t/a 'quoted' $(name)")), sum);
        let env = std::fs::read_to_string(dst.path().join("t/a 'quoted' $(name).env")).unwrap();
        let mut names: Vec<&str> = env
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, _)| k))
            .filter(|k| !["PWD", "SHLVL", "_", "OLDPWD"].contains(k))
            .collect();
        names.sort();
        let mut want = vec!["PATH", "RDMA_XFER_NAME", "RDMA_XFER_PEER", "RDMA_XFER_SIZE"];
        if checksum {
            want.push("RDMA_XFER_DIGEST");
            want.sort();
            assert!(
                env.contains(&format!("RDMA_XFER_DIGEST=sha256:{sum}\n")),
                "{env}"
            );
        }
        assert_eq!(names, want, "{env}");
        assert!(
            env.contains("RDMA_XFER_NAME=t/a 'quoted' $(name)\n"),
            "{env}"
        );
        assert!(
            env.contains(&format!("RDMA_XFER_SIZE={}\n", 3 * MIB + 3)),
            "{env}"
        );
        std::fs::remove_dir_all(dst.path().join("t")).unwrap();
    }
}

/// Every regular file under `dir` and what it holds, as relative paths.
fn files_under(dir: &Path) -> Vec<String> {
    everything_under(dir)
        .into_iter()
        .filter(|p| dir.join(p).is_file())
        .collect()
}

/// Dotfiles (`.bashrc`, and `dir/.ssh/authorized_keys` in a tree) are
/// offered by the sender and refused by the receiver with its reason on
/// the sender's per-file line, nothing of them written, the rest of the
/// tree received; with --allow-dotfiles they arrive.
#[test]
fn dotfiles_are_refused_with_the_reason_unless_allowed() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().unwrap();
    let bashrc = src.path().join(".bashrc");
    make_file(&bashrc, 100, 1);
    let tree = src.path().join("dir");
    std::fs::create_dir_all(tree.join(".ssh")).unwrap();
    make_file(&tree.join(".ssh/authorized_keys"), 200, 2);
    make_file(&tree.join("plain.txt"), 300, 3);
    let files = [bashrc.clone(), tree.clone()];
    let reason = "names starting with '.' are refused; the receiver allows them with \
                  --allow-dotfiles";

    let dst = tempfile::tempdir().unwrap();
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], &files, &["-r"]);
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    for name in [".bashrc", "dir/.ssh"] {
        let line = sent
            .stderr
            .lines()
            .find(|l| l.starts_with(&format!("sender: error: {name}: ")))
            .unwrap_or_else(|| panic!("no line for {name}:\n{}", sent.stderr));
        assert!(
            line.contains("rejected by the receiver (bad file name)"),
            "{line}"
        );
        assert!(line.ends_with(reason), "{line}");
    }
    assert_eq!(
        files_under(dst.path()),
        ["dir/plain.txt"],
        "{}",
        received.stderr
    );
    assert_eq!(everything_under(dst.path()), ["dir", "dir/plain.txt"]);
    assert_no_temp_files(dst.path());

    let dst = tempfile::tempdir().unwrap();
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--allow-dotfiles"],
        &files,
        &["-r"],
    );
    assert_both_ok(&sent, &received);
    assert_eq!(
        files_under(dst.path()),
        [".bashrc", "dir/.ssh/authorized_keys", "dir/plain.txt"]
    );
    assert_eq!(
        sha256_file(&dst.path().join("dir/.ssh/authorized_keys")),
        sha256_file(&tree.join(".ssh/authorized_keys"))
    );
}

/// A name with a right-to-left override (shows as `evilexe.txt`) is
/// refused whatever the options, shown escaped on the sender's line, and
/// nothing is written; the next file arrives.
#[test]
fn a_name_with_a_bidi_override_is_refused_and_shown_escaped() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let evil = src.path().join("evil\u{202e}txt.exe");
    make_file(&evil, 1000, 7);
    let good = src.path().join("good.bin");
    let sum = make_file(&good, 1000, 8);
    let (sent, received) = one_session(
        &net,
        Path_::Wire,
        dst.path(),
        &["--allow-dotfiles"],
        &[evil, good],
        &[],
    );
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    let line = sent
        .stderr
        .lines()
        .find(|l| l.starts_with("sender: error: evil\\u{202e}txt.exe: "))
        .unwrap_or_else(|| panic!("no escaped line:\n{}", sent.stderr));
    assert!(line.contains("U+202E, an invisible character"), "{line}");
    assert!(!sent.stderr.contains('\u{202e}'), "{}", sent.stderr);
    assert!(!received.stderr.contains('\u{202e}'), "{}", received.stderr);
    assert_eq!(files_under(dst.path()), ["good.bin"]);
    assert_eq!(sha256_file(&dst.path().join("good.bin")), sum);
}

/// A tree with a refused directory of many files (a `.git`): what lies
/// below it is not offered once the refusal is in, so the session goes
/// on to the other files instead of ending at the receiver's limit of
/// refusals in a row.
#[test]
fn a_refused_directory_is_not_offered_file_by_file() {
    let Some(net) = rdma_net() else { return };
    let src = tempfile::tempdir().unwrap();
    let repo = src.path().join("repo");
    std::fs::create_dir_all(repo.join(".git/objects")).unwrap();
    for i in 0..300 {
        std::fs::write(repo.join(format!(".git/objects/o{i:03}")), [i as u8]).unwrap();
    }
    make_file(&repo.join("zz-main.rs"), 1000, 4);
    let dst = tempfile::tempdir().unwrap();
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], &[repo], &["-r"]);
    // The refusal of .git decides the status; the other file arrives.
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert!(
        sent.stderr.contains("sender: error: repo/.git: "),
        "{}",
        sent.stderr
    );
    assert_eq!(
        files_under(dst.path()),
        ["repo/zz-main.rs"],
        "{}",
        received.stderr
    );
    let refused = sent.stderr.matches("sender: error: repo/.git").count();
    assert!(refused < 50, "{refused} refusals:\n{}", sent.stderr);
}

/// The token never reaches an --exec command: the receiver takes
/// RDMA_XFER_TOKEN out of its environment as it starts (its
/// /proc/PID/environ no longer shows it), its commands get a clean
/// environment, and the receiver is not dumpable while they run, so a
/// command that reads /proc/$PPID/environ (its parent: the receiver, whose
/// `sh -c` it is) finds nothing, or is refused.
#[test]
fn exec_commands_cannot_find_the_token_in_the_receivers_environment() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    const TOKEN: &str = "exec-test-token-that-must-vanish";
    let seen = tempfile::tempdir().unwrap();
    let input = src.path().join("f.bin");
    make_file(&input, MIB + 5, 91);
    let cmd = format!(
        "cat > /dev/null; tr '\\0' '\\n' < /proc/$PPID/environ > '{0}/parent.env' 2>&1; \
         env > '{0}/own.env'; echo \"$PPID\" > '{0}/ppid'",
        seen.path().display()
    );
    let port = next_port();
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .args(&["--once", "--exec", &cmd])
        .env(&[("RDMA_XFER_TOKEN", TOKEN)])
        .start();
    let shows = |bytes: &[u8]| {
        let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
        has(b"RDMA_XFER_TOKEN") || has(TOKEN.as_bytes())
    };
    // Looked at from here too, while it listens.
    let receiver_pid = receiver.pid();
    let environ = std::fs::read(format!("/proc/{receiver_pid}/environ")).unwrap_or_default();
    assert!(
        !shows(&environ),
        "the receiver's /proc/PID/environ shows the token"
    );
    let mut sender = SenderCommand::new(&net, port, Path_::Wire)
        .files(std::slice::from_ref(&input))
        .command();
    token_env(&mut sender, Some(TOKEN));
    let sent = Running::spawn("sender", sender).wait(Duration::from_secs(120));
    let received = receiver.wait(Duration::from_secs(120));
    assert_both_ok(&sent, &received);
    let ppid = std::fs::read_to_string(seen.path().join("ppid")).expect("the command ran");
    assert_eq!(
        ppid.trim(),
        receiver_pid.to_string(),
        "the command's parent is the receiver"
    );
    let parent = std::fs::read(seen.path().join("parent.env")).unwrap();
    assert!(
        !shows(&parent),
        "the command found the token in /proc/$PPID/environ"
    );
    let own = std::fs::read(seen.path().join("own.env")).unwrap();
    assert!(!shows(&own), "the command inherited the token");
}

/// --exec starts its commands without a fork of the receiver, which holds
/// registered (pinned) memory: seen with `strace -f -b execve` (children
/// followed until their exec), every process the receiver creates is a
/// clone with CLONE_VFORK (posix_spawn), never a fork; the others are its
/// threads.
#[test]
fn exec_commands_are_started_without_a_fork_of_the_receiver() {
    let Some(net) = rdma_net() else { return };
    if !have("strace") {
        skip("strace is needed to see how commands start", false);
        return;
    }
    const TOKEN: &str = "spawn-test-token-0123456789abcd";
    let (src, dst) = dirs();
    let tree = src.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    for i in 0..3u64 {
        make_file(&tree.join(format!("f{i}")), 10_000 + i, 95 + i);
    }
    let trace = tempfile::tempdir().unwrap();
    let log = trace.path().join("clones.log");
    let port = next_port();
    let receiver = ReceiverCommand::new(&net, port, dst.path())
        .args(&["--once", "--exec", "cat > /dev/null"])
        .env(&[("RDMA_XFER_TOKEN", TOKEN)])
        .command();
    let mut traced = std::process::Command::new("strace");
    traced
        .args([
            "-f",
            "-qq",
            "-b",
            "execve",
            "-e",
            "trace=clone,clone3,fork,vfork",
            "-o",
        ])
        .arg(&log)
        .arg(receiver.get_program())
        .args(receiver.get_args());
    for (key, value) in receiver.get_envs() {
        match value {
            Some(v) => traced.env(key, v),
            None => traced.env_remove(key),
        };
    }
    let receiver = start_receiver_cmd(traced);
    let mut sender = SenderCommand::new(&net, port, Path_::Wire)
        .files(std::slice::from_ref(&tree))
        .args(&["-r"])
        .command();
    token_env(&mut sender, Some(TOKEN));
    let sent = Running::spawn("sender", sender).wait(Duration::from_secs(300));
    let received = receiver.wait(Duration::from_secs(300));
    assert_both_ok(&sent, &received);
    let log = std::fs::read_to_string(&log).unwrap();
    // The first line of each call (a call another thread interrupts goes
    // on in a `resumed` line, without the flags).
    let calls: Vec<&str> = log
        .lines()
        .filter(|l| {
            ["clone(", "clone3(", "fork(", "vfork("]
                .iter()
                .any(|c| l.contains(c))
        })
        .filter(|l| !l.contains("resumed>"))
        .collect();
    let spawned = calls.iter().filter(|l| l.contains("CLONE_VFORK")).count();
    assert!(spawned >= 3, "one spawn per file, saw {spawned}:\n{log}");
    let forks: Vec<&&str> = calls
        .iter()
        .filter(|l| !l.contains("CLONE_THREAD") && !l.contains("CLONE_VFORK"))
        .filter(|l| !l.contains("vfork("))
        .collect();
    assert!(forks.is_empty(), "the receiver forked: {forks:#?}\n{log}");
}
