//! Misuse of the verbs wrapper that must not compile (see the comment at
//! the top of each case in tests/compile_fail/).
//!
//! Two checks. The property, with any stable compiler: each case fails to
//! compile against this crate with the errors recorded in its .stderr
//! file, each by its code and the line of the case it points at (`E0382`
//! at line 12: the code names the rule broken, the line the misuse, and
//! neither changes between releases the way the wording does). And, with
//! the compiler the .stderr files were recorded with (`RECORDED_WITH`, the
//! toolchain of the build machines and CI: under CI any other fails), the
//! whole expected output (trybuild); `TRYBUILD=overwrite cargo test --test
//! compile_fail` regenerates it after a deliberate change.

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

/// The errors in a compiler's output, each as its code and the line of
/// `case` it points at (`error[E0382]` then ` --> .../case.rs:12:5`); an
/// error located elsewhere counts with line 0.
fn errors(output: &str, case: &str) -> BTreeSet<(String, u32)> {
    let mut found = BTreeSet::new();
    let mut lines = output.lines().peekable();
    while let Some(line) = lines.next() {
        let Some(code) = line
            .strip_prefix("error[")
            .and_then(|rest| rest.split_once(']'))
            .map(|(code, _)| code.to_string())
        else {
            continue;
        };
        let at = lines
            .peek()
            .and_then(|l| l.trim_start().strip_prefix("--> "))
            .and_then(|loc| {
                let mut parts = loc.rsplitn(3, ':');
                let (_col, line, path) = (parts.next()?, parts.next()?, parts.next()?);
                (Path::new(path).file_name() == Some(std::ffi::OsStr::new(case)))
                    .then(|| line.parse().ok())
                    .flatten()
            })
            .unwrap_or(0);
        found.insert((code, at));
    }
    found
}

/// This crate's library as the test binaries link it: every
/// `librdma_xfer-*.rlib` beside the test binary (target/PROFILE/deps).
/// Usually one; if an older build left another, each case must fail
/// against each, except a library another compiler built (E0514, E0460:
/// left by an earlier toolchain), which is passed over and said so.
fn crate_rlibs(deps: &Path) -> Vec<PathBuf> {
    let rlibs: Vec<PathBuf> = std::fs::read_dir(deps)
        .expect("deps dir")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("librdma_xfer-") && n.ends_with(".rlib"))
        })
        .collect();
    assert!(
        !rlibs.is_empty(),
        "no librdma_xfer-*.rlib in {}",
        deps.display()
    );
    rlibs
}

#[test]
fn misuse_of_registered_memory_does_not_compile_with_any_compiler() {
    let exe = std::env::current_exe().expect("test binary");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    let out_dir = tempfile::tempdir().expect("temp dir");
    let mut failures = Vec::new();
    let mut checked = 0;
    'rlibs: for rlib in crate_rlibs(&deps) {
        for case in cases() {
            let name = case
                .file_name()
                .and_then(|n| n.to_str())
                .expect("case name")
                .to_string();
            let recorded = std::fs::read_to_string(case.with_extension("stderr"))
                .unwrap_or_else(|e| panic!("{}: no .stderr: {e}", case.display()));
            let want = errors(&recorded, &name);
            assert!(
                want.iter().any(|(_, line)| *line > 0),
                "{name}: no error at a line of the case recorded"
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
            let got = errors(&stderr, &name);
            if got
                .iter()
                .any(|(code, _)| code == "E0514" || code == "E0460")
            {
                eprintln!(
                    "passed over {}: built by another compiler (cargo clean removes it)",
                    rlib.display()
                );
                continue 'rlibs;
            }
            if out.status.success() || got != want {
                failures.push(format!(
                    "{name} against {}: want a failure with {want:?}, got {} with {got:?}:\n{stderr}",
                    rlib.display(),
                    if out.status.success() {
                        "success"
                    } else {
                        "a failure"
                    }
                ));
            }
        }
        checked += 1;
    }
    assert!(
        checked > 0,
        "no library of this compiler's to check against"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn misuse_of_registered_memory_gives_the_recorded_errors() {
    let version = rustc_version();
    if !version.starts_with(RECORDED_WITH) {
        // CI runs on the recording toolchain: there, a mismatch means the
        // exact check would be skipped silently, so it fails instead.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must build with {RECORDED_WITH}x (the expected errors were recorded with it), \
             not {version:?}"
        );
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
fn errors_are_read_as_code_and_line_of_the_case() {
    let out = "error[E0382]: borrow of moved value\n --> tests/compile_fail/a.rs:12:5\n  |\n\
               error[E0599]: no method\n --> /abs/tests/compile_fail/a.rs:20:9\n\
               error[E0382]: again\n --> tests/compile_fail/a.rs:12:7\n\
               error[E0277]: elsewhere\n --> src/sys/rdma/queue.rs:3:1\n\
               warning: unused";
    let got: Vec<(String, u32)> = errors(out, "a.rs").into_iter().collect();
    assert_eq!(
        got,
        [
            ("E0277".to_string(), 0),
            ("E0382".to_string(), 12),
            ("E0599".to_string(), 20)
        ]
    );
    assert!(errors("warning: nothing", "a.rs").is_empty());
}
