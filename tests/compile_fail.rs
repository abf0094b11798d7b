//! Misuse of the verbs wrapper that must not compile (see the comment at
//! the top of each case in tests/compile_fail/). Each case's expected
//! compiler error is in its .stderr file; `TRYBUILD=overwrite cargo test
//! --test compile_fail` regenerates them after a deliberate change.

#[test]
fn misuse_of_registered_memory_does_not_compile() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/compile_fail/*.rs");
}
