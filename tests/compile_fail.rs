//! Misuse of the verbs wrapper that must not compile (see the comment at
//! the top of each case in tests/compile_fail/). Each case's expected
//! compiler error is in its .stderr file; `TRYBUILD=overwrite cargo test
//! --test compile_fail` regenerates them after a deliberate change.
//!
//! rustc's wording changes between releases, so the .stderr files hold one
//! compiler's errors (`RECORDED_WITH`, the toolchain of the build machines
//! and CI). With another compiler the test reports itself skipped, by
//! name, except where everything is required (CI), where it runs and a
//! mismatch fails.

use std::process::Command;

/// The compiler the expected errors were recorded with.
const RECORDED_WITH: &str = "rustc 1.95.";

fn required() -> bool {
    ["CI", "RDMA_XFER_REQUIRE_RDMA"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|s| !s.is_empty() && s != "0" && s != "false"))
}

#[test]
fn misuse_of_registered_memory_does_not_compile() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let version = Command::new(&rustc)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    if !version.starts_with(RECORDED_WITH) && !required() {
        eprintln!(
            "SKIPPED: misuse_of_registered_memory_does_not_compile: the expected errors were \
             recorded with {RECORDED_WITH}x and this is {version:?} (regenerate them with \
             TRYBUILD=overwrite cargo test --test compile_fail, then review the diff)"
        );
        return;
    }
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
