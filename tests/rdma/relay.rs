//! Relay chains on real RDMA (`sender --relay`): the sender at B talks to
//! A only; A passes each file on to C over C's own wire (from its other
//! end, `--relay-source`), C to D over D's. Every host keeps the files,
//! each host's result comes back per file, and a file refused at one host
//! is that host's failure alone (docs/protocol.md#relay-chains).

use crate::support::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The chain's hosts after A: each a receiver on its wire's listening
/// end, forwarding from the sending end of the next wire.
struct Hop {
    addr: String,
    /// Where the host before it connects from to reach it.
    upstream_source: String,
    dir: tempfile::TempDir,
    port: u16,
}

/// The guest's wires C and D as hops (None outside the guest: skipped).
fn hops() -> Option<[Hop; 2]> {
    let c = guest_wire([
        "RXFER_ADDR_C",
        "RXFER_SRC_C",
        "RXFER_NETDEV_C",
        "RXFER_NETDEV_SRC_C",
    ])?;
    let d = guest_wire([
        "RXFER_ADDR_D",
        "RXFER_SRC_D",
        "RXFER_NETDEV_D",
        "RXFER_NETDEV_SRC_D",
    ])?;
    let hop = |w: Wire| Hop {
        addr: w.net.addr_a,
        upstream_source: w.net.addr_b.unwrap_or_default(),
        dir: tempfile::tempdir().expect("hop dir"),
        port: next_port(),
    };
    Some([hop(c), hop(d)])
}

/// `HOST:PORT` as --relay takes it.
fn label(addr: &str, port: u16) -> String {
    format!("{addr}:{port}")
}

/// A receiver of the chain with the shared token, listening on `addr`,
/// passing files on from `source` (the next wire's sending end).
fn chain_receiver(
    addr: &str,
    port: u16,
    dir: &Path,
    source: Option<&str>,
    extra: &[&str],
) -> Running {
    let net = Net {
        addr_a: addr.to_string(),
        addr_b: None,
    };
    let mut args: Vec<&str> = token_args().to_vec();
    args.push("--allow-relay");
    if let Some(s) = source {
        args.extend(["--relay-source", s]);
    }
    args.extend_from_slice(extra);
    ReceiverCommand::new(&net, port, dir).args(&args).start()
}

/// The chain's receivers, running: A (into `dst_a`), then C, then D
/// when `d` is given, each forwarding over the next one's wire; their
/// `--relay` names, in order.
fn start_chain(net: &Net, dst_a: &Path, c: &Hop, d: Option<&Hop>) -> (Vec<Running>, Vec<String>) {
    let port_a = next_port();
    let a = chain_receiver(&net.addr_a, port_a, dst_a, Some(&c.upstream_source), &[]);
    let c_next = d.map(|d| d.upstream_source.as_str());
    let mut running = vec![
        a,
        chain_receiver(&c.addr, c.port, c.dir.path(), c_next, &[]),
    ];
    let mut chain = vec![label(&net.addr_a, port_a), label(&c.addr, c.port)];
    if let Some(d) = d {
        running.push(chain_receiver(&d.addr, d.port, d.dir.path(), None, &[]));
        chain.push(label(&d.addr, d.port));
    }
    (running, chain)
}

/// The sender at B: `--relay` over `chain`, the token, --json.
fn relay_sender(net: &Net, chain: &[String], files: &[PathBuf], extra: &[&str]) -> Finished {
    let mut cmd = std::process::Command::new(sender_bin());
    cmd.arg("-v").env_remove("RDMA_XFER_ACK_TIMEOUT");
    if let Some(b) = &net.addr_b {
        cmd.args(["--source", b]);
    }
    cmd.args(token_args())
        .arg("--json")
        .args(extra)
        .arg("--relay")
        .arg(chain.join(","))
        .args(files);
    token_env(&mut cmd, None);
    Running::spawn("sender", cmd).wait(Duration::from_secs(300))
}

/// The sender's `--json` file records: (host, what it had kept).
fn resumed_by_host(run: &Finished) -> Vec<(String, u64)> {
    json_lines("sender", &run.stdout)
        .into_iter()
        .filter(|v| v["event"] == "file")
        .map(|v| {
            let host = v["host"].as_str().unwrap_or_default().to_string();
            (host, v["resumed_from"].as_u64().unwrap_or(0))
        })
        .collect()
}

/// The sender's `--json` file records: (host, name, status).
fn records(run: &Finished) -> Vec<(String, String, String)> {
    json_lines("sender", &run.stdout)
        .into_iter()
        .filter(|v| v["event"] == "file")
        .map(|v| {
            let s = |k: &str| v[k].as_str().unwrap_or_default().to_string();
            (s("host"), s("name"), s("status"))
        })
        .collect()
}

/// `name`'s records: ok at the first and last host of `chain`, failed at
/// the middle one.
fn assert_only_the_middle_failed(sent: &Finished, chain: &[String], name: &str) {
    let got = records(sent);
    let status_at = |host: &String| {
        got.iter()
            .find(|(h, n, _)| h == host && n == name)
            .map(|(_, _, s)| s.clone())
            .unwrap_or_else(|| panic!("no record for {host}:\n{}", sent.transcript()))
    };
    assert_eq!(status_at(&chain[0]), "ok", "{}", sent.transcript());
    assert_eq!(status_at(&chain[2]), "ok", "{}", sent.transcript());
    assert_ne!(status_at(&chain[1]), "ok", "{}", sent.transcript());
}

/// Every `names` under `src` is under `dst` with the same SHA-256, and
/// nothing half-written is left.
fn assert_copies(src: &Path, dst: &Path, names: &[&str]) {
    for name in names {
        let got = dst.join(name);
        assert!(got.exists(), "{} missing", got.display());
        assert_eq!(
            sha256_file(&src.join(name)),
            sha256_file(&got),
            "{} differs",
            got.display()
        );
    }
    assert_no_temp_files(dst);
}

#[test]
fn a_file_reaches_two_hosts_by_relay() {
    let Some(net) = rdma_net() else { return };
    let Some([c, _]) = hops() else { return };
    let (src, dst_a) = dirs();
    let file = src.path().join("ckpt.bin");
    make_file(&file, 5 * MIB + 333, 61);
    let (_running, chain) = start_chain(&net, dst_a.path(), &c, None);
    let sent = relay_sender(&net, &chain, &[file], &[]);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    assert_copies(src.path(), dst_a.path(), &["ckpt.bin"]);
    assert_copies(src.path(), c.dir.path(), &["ckpt.bin"]);
    // One record per host, each labelled, each ok.
    let mut got = records(&sent);
    got.sort();
    let mut want: Vec<_> = chain
        .iter()
        .map(|h| (h.clone(), "ckpt.bin".to_string(), "ok".to_string()))
        .collect();
    want.sort();
    assert_eq!(got, want, "{}", sent.transcript());
}

#[test]
fn a_file_and_a_tree_reach_three_hosts_each_byte_leaving_the_source_once() {
    let Some(net) = rdma_net() else { return };
    let Some([c, d]) = hops() else { return };
    let Some([_, dev_b]) = own_guest() else {
        return;
    };
    let (src, dst_a) = dirs();
    let file = src.path().join("image.bin");
    let size = 6 * MIB + 17;
    make_file(&file, size, 71);
    let tree = src.path().join("t");
    let mut names = vec!["image.bin".to_string()];
    for i in 0..6u64 {
        let rel = format!("t/d{}/f{i}", i % 2);
        let path = src.path().join(&rel);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        make_file(&path, 40_000 * i + 3, 90 + i);
        names.push(rel);
    }
    let (_running, chain) = start_chain(&net, dst_a.path(), &c, Some(&d));
    let before = tx_bytes(&dev_b);
    let sent = relay_sender(&net, &chain, &[file, tree], &["-r"]);
    let from_b = tx_bytes(&dev_b) - before;
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for dir in [dst_a.path(), c.dir.path(), d.dir.path()] {
        assert_copies(src.path(), dir, &names);
    }
    assert_ok_everywhere_and_sent_once(&sent, &chain, src.path(), &names, from_b);
}

/// An `ok` record for every file at every host (labelled with it), and
/// the source's wire carrying the bytes about once (not once per host).
fn assert_ok_everywhere_and_sent_once(
    sent: &Finished,
    hosts: &[impl AsRef<str>],
    src: &Path,
    names: &[&str],
    from_b: u64,
) {
    let got = records(sent);
    for host in hosts.iter().map(AsRef::as_ref) {
        for name in names {
            assert!(
                got.iter()
                    .any(|(h, n, s)| h == host && n == name && s == "ok"),
                "no ok record for {name} at {host}:\n{}",
                sent.transcript()
            );
        }
    }
    let total: u64 = names
        .iter()
        .map(|n| std::fs::metadata(src.join(n)).unwrap().len())
        .sum();
    assert!(
        from_b < total + total / 4 + MIB,
        "{from_b} bytes left B for {total} bytes to {} hosts",
        hosts.len()
    );
}

#[test]
fn a_file_refused_at_one_host_is_that_hosts_failure_alone() {
    let Some(net) = rdma_net() else { return };
    let Some([c, d]) = hops() else { return };
    let (src, dst_a) = dirs();
    let file = src.path().join("weights.bin");
    make_file(&file, 3 * MIB + 5, 81);
    // C has another file under the name, and does not overwrite.
    make_file(&c.dir.path().join("weights.bin"), 1000, 82);
    let (_running, chain) = start_chain(&net, dst_a.path(), &c, Some(&d));
    let sent = relay_sender(&net, &chain, &[file], &[]);
    // Exit 4: refused (at C only).
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert_copies(src.path(), dst_a.path(), &["weights.bin"]);
    assert_copies(src.path(), d.dir.path(), &["weights.bin"]);
    assert_eq!(
        std::fs::metadata(c.dir.path().join("weights.bin"))
            .unwrap()
            .len(),
        1000,
        "C's own file was replaced"
    );
    assert_only_the_middle_failed(&sent, &chain, "weights.bin");
    // The line on stderr names C and why.
    assert!(
        sent.stderr.contains(&chain[1]) && sent.stderr.contains("exists"),
        "{}",
        sent.stderr
    );
}

#[test]
fn the_middle_host_killed_mid_file_leaves_the_last_host_complete() {
    middle_host_killed_mid_file(&[]);
}

/// With --resume the last host keeps what it verified when the middle
/// one dies, and the first host's copy continues it: only the rest goes.
#[test]
fn with_resume_the_last_host_continues_its_part_past_a_killed_middle_host() {
    let d_log = middle_host_killed_mid_file(&["--resume"]);
    assert!(
        d_log.contains("continuing the kept part"),
        "D did not continue its kept part:\n{d_log}"
    );
}

/// C is killed with a few MiB of a file in: A and D end with the file,
/// verified, C's loss is the exit status and named. D's log, returned.
fn middle_host_killed_mid_file(extra: &[&str]) -> String {
    let Some(net) = rdma_net() else {
        return String::new();
    };
    let Some([c, d]) = hops() else {
        return String::new();
    };
    let (src, dst_a) = dirs();
    let file = src.path().join("shard.bin");
    make_file(&file, 16 * MIB + 9, 91);
    let (running, chain) = start_chain(&net, dst_a.path(), &c, Some(&d));
    // Paced at the source (4 MiB/s): C is killed with a few MiB in.
    let sending = paced_relay_sender(&net, &chain, &file, extra);
    wait_for_partial_file(c.dir.path(), 3 * MIB);
    running[1].signal("KILL");
    let sent = sending.wait(Duration::from_secs(300));
    // The exit status is C's loss (7); A and D have the file, verified.
    assert_eq!(sent.code(), 7, "{}", sent.transcript());
    assert_copies(src.path(), dst_a.path(), &["shard.bin"]);
    assert_copies(src.path(), d.dir.path(), &["shard.bin"]);
    assert_only_the_middle_failed(&sent, &chain, "shard.bin");
    assert!(
        sent.stderr
            .lines()
            .any(|l| l.contains("error") && l.contains(&chain[1])),
        "the failure does not name {}:\n{}",
        chain[1],
        sent.stderr
    );
    running[2].stderr_so_far()
}

/// `relay_sender` paced at 4 MiB/s, started: a fault lands mid-file.
fn paced_relay_sender(net: &Net, chain: &[String], file: &Path, extra: &[&str]) -> Running {
    let mut cmd = std::process::Command::new(sender_bin());
    cmd.arg("-v").env_remove("RDMA_XFER_ACK_TIMEOUT");
    if let Some(b) = &net.addr_b {
        cmd.args(["--source", b]);
    }
    cmd.args(token_args())
        .args(["--json", "--bwlimit", "4M", "--relay", &chain.join(",")])
        .args(extra)
        .arg(file);
    token_env(&mut cmd, None);
    Running::spawn("sender", cmd)
}

/// A chain's transfer cut at the source (the sender killed mid-file) and
/// run again with --resume: every host continues what it kept, so each
/// wire of the chain carries only the rest of the file.
#[test]
fn a_chain_run_again_with_resume_sends_each_host_only_what_it_lacks() {
    let Some(net) = rdma_net() else { return };
    let Some([c, d]) = hops() else { return };
    let Some([_, dev_b]) = own_guest() else {
        return;
    };
    let wire_of = |var: &str| std::env::var(var).unwrap_or_else(|_| panic!("{var} not set"));
    let (dev_c, dev_d) = (wire_of("RXFER_NETDEV_SRC_C"), wire_of("RXFER_NETDEV_SRC_D"));
    let (src, dst_a) = dirs();
    let file = src.path().join("ckpt.bin");
    let size = 16 * MIB + 21;
    make_file(&file, size, 93);
    let (running, chain) = start_chain(&net, dst_a.path(), &c, Some(&d));
    let sending = paced_relay_sender(&net, &chain, &file, &["--resume"]);
    // The last host holds 4 MiB (the others more): the source goes.
    wait_for_partial_file(d.dir.path(), 4 * MIB);
    sending.signal("KILL");
    let cut = sending.wait(Duration::from_secs(60));
    assert_ne!(cut.code(), 0, "{}", cut.transcript());
    let before = [&dev_b, &dev_c, &dev_d].map(|dev| tx_bytes(dev));
    let sent = relay_sender(&net, &chain, std::slice::from_ref(&file), &["--resume"]);
    let carried = [&dev_b, &dev_c, &dev_d].map(|dev| tx_bytes(dev));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    for dir in [dst_a.path(), c.dir.path(), d.dir.path()] {
        assert_copies(src.path(), dir, &["ckpt.bin"]);
    }
    // Each host's record says what it had kept.
    let resumed = resumed_by_host(&sent);
    assert_eq!(resumed.len(), 3, "{}", sent.transcript());
    eprintln!("resumed chain: kept at each host {resumed:?}");
    // With the shared token, A passed the file on once committed.
    let a_log = running[0].stderr_so_far();
    assert!(
        a_log.contains("passing this host's copy on"),
        "A passed on a resumed file before its commit:\n{a_log}"
    );
    assert!(
        resumed.iter().all(|(_, kept)| *kept >= 3 * MIB),
        "{resumed:?}\n{}",
        sent.transcript()
    );
    for (i, wire) in ["B to A", "A to C", "C to D"].iter().enumerate() {
        let moved = carried[i] - before[i];
        // For the record (--nocapture): what each wire carried, what each
        // host had kept.
        eprintln!("resumed chain: the wire {wire} carried {moved} of {size} bytes");
        assert!(
            moved < size - 3 * MIB,
            "the wire {wire} carried {moved} bytes of a {size}-byte file of which every host \
             kept 4 MiB or more:\n{}",
            sent.transcript()
        );
    }
}

/// The names in `dir` (temporary files included), sorted.
fn names_in(dir: &Path) -> String {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .expect("read dir")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names.join(" ")
}

#[test]
fn a_stream_cut_at_the_source_is_kept_by_no_host() {
    let Some(net) = rdma_net() else { return };
    let Some([c, _]) = hops() else { return };
    let (src, dst_a) = dirs();
    let input = src.path().join("input.bin");
    make_file(&input, 16 * MIB, 93);
    let (_running, chain) = start_chain(&net, dst_a.path(), &c, None);
    // Standard input, paced: the sender is killed with a few MiB at C
    // (bash execs it: its PID is the sender's).
    let mut words = vec![q(sender_bin()), "-v".into()];
    if let Some(b) = &net.addr_b {
        words.extend(["--source".into(), q(b)]);
    }
    words.extend(token_args().iter().map(q));
    words.extend(["--bwlimit", "4M", "--name", "s.bin", "--relay"].map(q));
    words.extend([q(chain.join(",")), "-".into(), "<".into(), qp(&input)]);
    let script = format!("exec {}", words.join(" "));
    let sending = pipeline("sender", &script, 0);
    wait_for_partial_file(c.dir.path(), 3 * MIB);
    sending.signal("KILL");
    let _ = sending.wait(Duration::from_secs(60));
    // A abandons the stream, and so does C: no host keeps any of it (a
    // stream's end alone would look like its end).
    for dir in [dst_a.path(), c.dir.path()] {
        wait_until(
            &format!("nothing left in {}", dir.display()),
            || names_in(dir),
            |names| names.is_empty(),
            Duration::from_secs(60),
        );
    }
}

/// The one-command form with targets A, C and D, from B: `extra`
/// options, then the files, then the targets.
fn chain_by_ssh(net: &Net, extra: &[&str], files: &[&Path], targets: &[String]) -> Finished {
    let mut args: Vec<&str> = files.iter().map(|f| f.to_str().unwrap()).collect();
    args.extend(targets.iter().map(String::as_str));
    let mut extra = extra.to_vec();
    extra.push("--json");
    crate::ssh::run(crate::ssh::sender(net, &extra, &args))
}

#[test]
fn one_command_sends_a_file_and_a_tree_along_three_targets() {
    let Some(net) = crate::ssh::ssh_net() else {
        return;
    };
    let Some([c, d]) = hops() else { return };
    let Some([_, dev_b]) = own_guest() else {
        return;
    };
    let (src, dst_a) = dirs();
    let file = src.path().join("model.pt");
    make_file(&file, 4 * MIB + 5, 41);
    let tree = src.path().join("t");
    std::fs::create_dir(&tree).unwrap();
    let mut names = vec!["model.pt".to_string()];
    for i in 0..4u64 {
        let rel = format!("t/f{i}");
        make_file(&src.path().join(&rel), 30_000 * i + 1, 50 + i);
        names.push(rel);
    }
    let dirs = [dst_a.path(), c.dir.path(), d.dir.path()];
    let hosts = [&net.addr_a, &c.addr, &d.addr];
    let targets: Vec<String> = hosts
        .iter()
        .zip(dirs)
        .map(|(h, dir)| crate::ssh::target(h, dir))
        .collect();
    let before = tx_bytes(&dev_b);
    let sent = chain_by_ssh(&net, &["-r"], &[&file, &tree], &targets);
    let from_b = tx_bytes(&dev_b) - before;
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    for dir in dirs {
        assert_copies(src.path(), dir, &names);
        crate::ssh::assert_remote_gone(dir);
    }
    // Each labelled with its target's host; by relay.
    assert_ok_everywhere_and_sent_once(&sent, &hosts, src.path(), &names, from_b);
}

#[test]
fn one_command_chain_goes_on_past_a_target_that_cannot_start_or_refuses() {
    let Some(net) = crate::ssh::ssh_net() else {
        return;
    };
    let Some([c, d]) = hops() else { return };
    let (src, dst_a) = dirs();
    let file = src.path().join("shard.bin");
    make_file(&file, 2 * MIB + 7, 43);
    // C's directory does not exist; D has another file under the name.
    make_file(&d.dir.path().join("shard.bin"), 100, 44);
    let missing = c.dir.path().join("no/such/dir");
    let targets = vec![
        crate::ssh::target(&net.addr_a, dst_a.path()),
        crate::ssh::target(&c.addr, &missing),
        crate::ssh::target(&d.addr, d.dir.path()),
    ];
    let sent = chain_by_ssh(&net, &[], &[&file], &targets);
    // The worst (highest) status: D's refusal (4) over C's usage error.
    assert_eq!(sent.code(), 4, "{}", sent.transcript());
    assert_copies(src.path(), dst_a.path(), &["shard.bin"]);
    assert_eq!(
        std::fs::metadata(d.dir.path().join("shard.bin"))
            .unwrap()
            .len(),
        100,
        "D's own file was replaced"
    );
    let got = records(&sent);
    let status_at = |host: &str| {
        got.iter()
            .find(|(h, n, _)| h == host && n == "shard.bin")
            .map(|(_, _, s)| s.clone())
    };
    assert_eq!(
        status_at(&net.addr_a).as_deref(),
        Some("ok"),
        "{}",
        sent.transcript()
    );
    assert_eq!(
        status_at(&d.addr).as_deref(),
        Some("rejected"),
        "{}",
        sent.transcript()
    );
    // One record per target: A ok, C usage (2), D rejected (4).
    let ends: Vec<(String, u64)> = json_lines("sender", &sent.stdout)
        .into_iter()
        .filter(|r| r["event"] == "target")
        .map(|r| {
            (
                r["host"].as_str().unwrap_or_default().to_string(),
                r["exit_code"].as_u64().unwrap_or(99),
            )
        })
        .collect();
    let mut ends = ends;
    ends.sort();
    let mut want = vec![
        (net.addr_a.clone(), 0),
        (c.addr.clone(), 2),
        (d.addr.clone(), 4),
    ];
    want.sort();
    assert_eq!(ends, want, "{}", sent.transcript());
    assert!(
        sent.stderr.contains("no/such/dir") && sent.stderr.contains("3 targets failed"),
        "{}",
        sent.stderr
    );
    for dir in [dst_a.path(), d.dir.path()] {
        crate::ssh::assert_remote_gone(dir);
    }
}

#[test]
fn one_command_chain_goes_on_from_the_next_target_when_the_first_is_lost() {
    let Some(net) = crate::ssh::ssh_net() else {
        return;
    };
    let Some([c, d]) = hops() else { return };
    let (src, dst_a) = dirs();
    // First a small file D refuses (another under its name): a refusal
    // before the loss is no reason to give up on the others.
    let note = src.path().join("note.txt");
    make_file(&note, 1000, 46);
    make_file(&d.dir.path().join("note.txt"), 100, 47);
    let file = src.path().join("image.sqfs");
    make_file(&file, 16 * MIB + 3, 45);
    let targets = [
        crate::ssh::target(&net.addr_a, dst_a.path()),
        crate::ssh::target(&c.addr, c.dir.path()),
        crate::ssh::target(&d.addr, d.dir.path()),
    ];
    // Paced at the source (4 MiB/s): A is killed with a few MiB in. The
    // sender must reach C once A is gone: the route picks the device
    // (from B, only A's wire is reachable in the guest).
    let mut args = vec![note.to_str().unwrap(), file.to_str().unwrap()];
    args.extend(targets.iter().map(String::as_str));
    let sending = paced_by_ssh(&net, &args);
    wait_for_partial_file(dst_a.path(), 3 * MIB);
    kill_receiver_of(dst_a.path());
    let sent = sending.wait(Duration::from_secs(300));
    // A's loss is the worst status (7, over D's refusal, 4); C and D
    // have the file, verified.
    assert_eq!(sent.code(), 7, "{}", sent.transcript());
    for dir in [c.dir.path(), d.dir.path()] {
        assert!(
            dir.join("image.sqfs").exists(),
            "{} has no copy:\n{}",
            dir.display(),
            sent.transcript()
        );
        assert_copies(src.path(), dir, &["image.sqfs"]);
    }
    // One record per host and file (C and D's first try at the image,
    // cut short with A, is not said; their second is): the image failed
    // at A only, the note refused at D only.
    let got = records(&sent);
    let status = |host: &str, name: &str| {
        let said: Vec<&String> = got
            .iter()
            .filter(|(h, n, _)| h == host && n == name)
            .map(|(_, _, s)| s)
            .collect();
        assert_eq!(said.len(), 1, "{host} {name}: {}", sent.transcript());
        said[0].clone()
    };
    assert_ne!(status(&net.addr_a, "image.sqfs"), "ok");
    assert_eq!(status(&c.addr, "image.sqfs"), "ok");
    assert_eq!(status(&d.addr, "image.sqfs"), "ok");
    assert_eq!(status(&net.addr_a, "note.txt"), "ok");
    assert_eq!(status(&c.addr, "note.txt"), "ok");
    assert_eq!(status(&d.addr, "note.txt"), "rejected");
    let ends: Vec<(String, String)> = json_lines("sender", &sent.stdout)
        .into_iter()
        .filter(|r| r["event"] == "target")
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("host"), s("status"))
        })
        .collect();
    let status_of = |host: &str| {
        let got: Vec<&String> = ends
            .iter()
            .filter(|(h, _)| h == host)
            .map(|(_, s)| s)
            .collect();
        assert_eq!(got.len(), 1, "{host}: {}", sent.transcript());
        got[0].clone()
    };
    assert_eq!(
        status_of(&net.addr_a),
        "timeout_or_peer_lost",
        "{}",
        sent.transcript()
    );
    assert_eq!(status_of(&c.addr), "ok", "{}", sent.transcript());
    assert_eq!(status_of(&d.addr), "rejected", "{}", sent.transcript());
    assert!(
        sent.stderr.contains("the chain goes on from"),
        "{}",
        sent.stderr
    );
    for dir in [c.dir.path(), d.dir.path()] {
        crate::ssh::assert_remote_gone(dir);
    }
}

/// The one-command chain stopped mid-file (Ctrl-C at the source) and run
/// again with --resume: every host continues what it kept, passing its
/// kept part on as the rest arrives (per-host tokens), and says so in
/// its record.
#[test]
fn one_command_chain_run_again_with_resume_continues_at_every_host() {
    let Some(net) = crate::ssh::ssh_net() else {
        return;
    };
    let Some([c, d]) = hops() else { return };
    let (src, dst_a) = dirs();
    let file = src.path().join("ckpt.bin");
    make_file(&file, 16 * MIB + 23, 94);
    let targets = [
        crate::ssh::target(&net.addr_a, dst_a.path()),
        crate::ssh::target(&c.addr, c.dir.path()),
        crate::ssh::target(&d.addr, d.dir.path()),
    ];
    let mut args = vec!["--resume", file.to_str().unwrap()];
    args.extend(targets.iter().map(String::as_str));
    let mut sending = paced_by_ssh(&net, &args);
    wait_for_partial_file_from(d.dir.path(), 4 * MIB, &mut sending);
    sending.signal("INT");
    let cut = sending.wait(Duration::from_secs(60));
    assert_ne!(cut.code(), 0, "{}", cut.transcript());
    let sent = chain_by_ssh(&net, &["--resume"], &[&file], &targets);
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    for dir in [dst_a.path(), c.dir.path(), d.dir.path()] {
        assert_copies(src.path(), dir, &["ckpt.bin"]);
    }
    let resumed = resumed_by_host(&sent);
    eprintln!("resumed one-command chain: kept at each host {resumed:?}");
    assert_eq!(resumed.len(), 3, "{}", sent.transcript());
    assert!(
        resumed.iter().all(|(_, kept)| *kept >= 3 * MIB),
        "{resumed:?}\n{}",
        sent.transcript()
    );
}

#[test]
fn one_command_chain_sends_directly_to_a_target_past_two_lost_ones() {
    let Some(net) = crate::ssh::ssh_net() else {
        return;
    };
    let Some([c, d]) = hops() else { return };
    let (src, dst_a) = dirs();
    // A fourth target: a second receiver on A, last in the chain. The
    // first host holds the tokens of the two after it (C and D) only.
    let dst_last = tempfile::tempdir().expect("last dir");
    let file = src.path().join("weights.bin");
    make_file(&file, 16 * MIB + 5, 48);
    let targets = [
        crate::ssh::target(&net.addr_a, dst_a.path()),
        crate::ssh::target(&c.addr, c.dir.path()),
        crate::ssh::target(&d.addr, d.dir.path()),
        crate::ssh::target(&net.addr_a, dst_last.path()),
    ];
    let mut args = vec![file.to_str().unwrap()];
    args.extend(targets.iter().map(String::as_str));
    // C and D are killed with a few MiB at A.
    let mut sending = paced_by_ssh(&net, &args);
    wait_for_partial_file_from(dst_a.path(), 3 * MIB, &mut sending);
    kill_receiver_of(c.dir.path());
    kill_receiver_of(d.dir.path());
    let sent = sending.wait(Duration::from_secs(300));
    // C and D are lost (exit 7); A has the file by the chain, and the last
    // target, past two lost hosts, from the sender directly.
    assert_eq!(sent.code(), 7, "{}", sent.transcript());
    for dir in [dst_a.path(), dst_last.path()] {
        assert_copies(src.path(), dir, &["weights.bin"]);
    }
    assert!(
        sent.stderr
            .contains("not reached along the chain: sending to"),
        "{}",
        sent.stderr
    );
    // One record per host and file: ok at both of A's targets, lost at C
    // and D (said once, at the end).
    let got = records(&sent);
    let said = |host: &str| -> Vec<String> {
        got.iter()
            .filter(|(h, n, _)| h == host && n == "weights.bin")
            .map(|(_, _, s)| s.clone())
            .collect()
    };
    assert_eq!(said(&net.addr_a), ["ok", "ok"], "{}", sent.transcript());
    for host in [&c.addr, &d.addr] {
        let s = said(host);
        assert_eq!(s.len(), 1, "{host}: {}", sent.transcript());
        assert_ne!(s[0], "ok", "{host}: {}", sent.transcript());
    }
    for dir in [dst_a.path(), dst_last.path()] {
        crate::ssh::assert_remote_gone(dir);
    }
}

/// The one-command form with `args` (files, then targets), paced at the
/// source (4 MiB/s, so that a test can act mid-file), `--json`, the route
/// choosing the device (from B only A's wire is reachable).
fn paced_by_ssh(net: &Net, args: &[&str]) -> Running {
    let from_anywhere = Net {
        addr_a: net.addr_a.clone(),
        addr_b: None,
    };
    let cmd = crate::ssh::sender(&from_anywhere, &["--json", "--bwlimit", "4M"], args);
    Running::spawn("sender", cmd)
}

/// Kills (SIGKILL) the one receiver the sender started over ssh for `dir`.
fn kill_receiver_of(dir: &Path) {
    // Its ssh may still be starting it on a loaded host: wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let pids = loop {
        let pids = crate::ssh::remote_receivers(dir);
        if !pids.is_empty() || std::time::Instant::now() > deadline {
            break pids;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(pids.len(), 1, "{pids:?}");
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
}
