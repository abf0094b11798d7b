//! `sender -n/--dry-run` on real RDMA: the receiver judges each offer as a
//! real run would (would be sent, unchanged, refused with its reason) and
//! nothing is written on either side; `--json` records say `dry_run`.

use crate::support::*;
use serde_json::Value;
use std::path::Path;

/// Every entry under `dir`, as relative paths, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            out.push(p.strip_prefix(dir).unwrap().display().to_string());
            if p.is_dir() {
                todo.push(p);
            }
        }
    }
    out.sort();
    out
}

/// The `--json` file records, by name.
fn records(stdout: &str) -> Vec<Value> {
    json_lines("sender", stdout)
        .into_iter()
        .filter(|v| v["event"] == "file")
        .collect()
}

#[test]
fn a_dry_run_says_what_a_real_run_would_do_and_writes_nothing() {
    let Some(net) = rdma_net() else { return };
    let (src, dst) = dirs();
    let tree = src.path().join("tree");
    std::fs::create_dir_all(tree.join("sub")).unwrap();
    for (name, size) in [("a", 10), ("b", 70_000), ("sub/c", 3_000_000)] {
        make_file(&tree.join(name), size, size);
    }
    let tree_arg = [tree.clone()];
    let dry = ["-r", "-n", "--json"];
    // Into an empty directory: everything would be sent; nothing is,
    // not even the directories.
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], &tree_arg, &dry);
    assert_both_ok(&sent, &received);
    let recs = records(&sent.stdout);
    assert_eq!(recs.len(), 3, "{}", sent.stdout);
    for r in &recs {
        assert_eq!(r["outcome"], "would-send", "{r}");
        assert_eq!(r["dry_run"], true, "{r}");
    }
    let summary = json_lines("sender", &sent.stdout).pop().unwrap();
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["dry_run"], true);
    assert!(
        sent.stderr.contains("dry run, nothing sent or written"),
        "{}",
        sent.stderr
    );
    assert!(listing(dst.path()).is_empty(), "{:?}", listing(dst.path()));
    // A real run, then a changed file: a dry run says it would be refused
    // (and why), the others unchanged; the exit status is the real run's.
    let (sent, received) = one_session(&net, Path_::Wire, dst.path(), &[], &tree_arg, &["-r"]);
    assert_both_ok(&sent, &received);
    let before = sha256_file(&dst.path().join("tree/b"));
    make_file(&tree.join("b"), 70_000, 99);
    let (sent, _) = one_session(&net, Path_::Wire, dst.path(), &[], &tree_arg, &dry);
    assert_eq!(sent.code(), 4, "{}", sent.stderr);
    for r in records(&sent.stdout) {
        let name = r["name"].as_str().unwrap();
        assert_eq!(r["dry_run"], true, "{r}");
        if name == "tree/b" {
            assert_eq!(r["status"], "rejected", "{r}");
            assert!(r["reason"].as_str().unwrap().contains("--overwrite"), "{r}");
        } else {
            assert_eq!(r["outcome"], "unchanged", "{r}");
        }
    }
    assert_eq!(sha256_file(&dst.path().join("tree/b")), before);
    assert_no_temp_files(&dst.path().join("tree"));
}
