//! Misuse of the verbs wrapper that must not compile (see the comment at
//! the top of each case in tests/compile_fail/).
//!
//! Two checks. The property, with any stable compiler: each case fails to
//! compile against this crate, with the error codes recorded in its
//! .stderr file (`E0382`, `E0599`, ...: the codes name the rule broken, and
//! do not change between releases the way the wording does). And, with the
//! compiler the .stderr files were recorded with (`RECORDED_WITH`, the
//! toolchain of the build machines and CI), the whole expected output
//! (trybuild); `TRYBUILD=overwrite cargo test --test compile_fail`
//! regenerates it after a deliberate change.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The compiler the expected errors were recorded with.
const RECORDED_WITH: &str = "rustc 1.95.";

fn rustc() -> String {
    std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into())
}

fn rustc_version() -> String {
    Command::new(rustc())
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The cases: every tests/compile_fail/*.rs.
fn cases() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/compile_fail");
    let mut cases: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/compile_fail")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs"))
        .collect();
    cases.sort();
    assert!(cases.len() >= 8, "compile-fail cases missing: {cases:?}");
    cases
}

/// The distinct error codes in a compiler's output (`error[E0382]`).
fn error_codes(output: &str) -> BTreeSet<String> {
    output
        .match_indices("error[E")
        .filter_map(|(at, _)| output.get(at + 6..at + 11))
        .map(str::to_string)
        .collect()
}

/// This crate's library as the test binary was built against it: the
/// newest `librdma_xfer-*.rlib` beside the test binary (target/PROFILE/deps).
fn crate_rlib(deps: &Path) -> PathBuf {
    std::fs::read_dir(deps)
        .expect("deps dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librdma_xfer-") && n.ends_with(".rlib"))
        })
        .max_by_key(|p| {
            p.metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH)
        })
        .expect("librdma_xfer-*.rlib beside the test binary")
}

#[test]
fn misuse_of_registered_memory_does_not_compile_with_any_compiler() {
    let exe = std::env::current_exe().expect("test binary");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let rlib = crate_rlib(&deps);
    let out_dir = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    for case in cases() {
        let recorded = std::fs::read_to_string(case.with_extension("stderr"))
            .unwrap_or_else(|e| panic!("{}: no .stderr: {e}", case.display()));
        let want = error_codes(&recorded);
        assert!(
            !want.is_empty(),
            "{}: no error code recorded",
            case.display()
        );
        let out = Command::new(rustc())
            .args([
                "--edition",
                "2024",
                "--crate-type",
                "bin",
                "--emit=metadata",
            ])
            .arg("--extern")
            .arg(format!("rdma_xfer={}", rlib.display()))
            .arg("-L")
            .arg(format!("dependency={}", deps.display()))
            .arg("--out-dir")
            .arg(out_dir.path())
            .arg(&case)
            .output()
            .expect("run rustc");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let got = error_codes(&stderr);
        if out.status.success() || got != want {
            failures.push(format!(
                "{}: want a failure with {want:?}, got {} with {got:?}:\n{stderr}",
                case.display(),
                if out.status.success() {
                    "success"
                } else {
                    "a failure"
                }
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn misuse_of_registered_memory_gives_the_recorded_errors() {
    let version = rustc_version();
    if !version.starts_with(RECORDED_WITH) {
        eprintln!(
            "not compared: the expected errors were recorded with {RECORDED_WITH}x and this \
             is {version:?}; the error codes were checked \
             (misuse_of_registered_memory_does_not_compile_with_any_compiler). Regenerate them \
             with TRYBUILD=overwrite cargo test --test compile_fail, then review the diff."
        );
        return;
    }
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}

#[test]
fn error_codes_are_read_from_compiler_output() {
    let out = "error[E0382]: borrow of moved value\nerror[E0599]: no method\n\
               error[E0382]: again\nwarning: unused";
    let codes: Vec<String> = error_codes(out).into_iter().collect();
    assert_eq!(codes, ["E0382", "E0599"]);
    assert!(error_codes("warning: nothing").is_empty());
}
