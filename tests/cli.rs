//! Command-line behaviour that needs no RDMA: help, usage errors, local
//! errors before connecting, and "no RDMA device" on a machine without one.

mod support;

use std::process::Command;
use support::{receiver_bin, sender_bin};

fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin).args(args).output().expect("run binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

#[test]
fn help_lists_exit_codes_and_examples() {
    for bin in [sender_bin(), receiver_bin()] {
        let (code, out, _) = run(bin, &["--help"]);
        assert_eq!(code, 0);
        assert!(out.contains("Exit codes:"), "{out}");
        assert!(out.contains("7  timeout or peer lost"), "{out}");
        assert!(out.contains("Examples:"), "{out}");
        let (code, out, _) = run(bin, &["--version"]);
        assert_eq!(code, 0);
        assert!(out.contains(env!("CARGO_PKG_VERSION")), "{out}");
    }
}

#[test]
fn usage_errors_exit_2() {
    let cases: &[(&str, &[&str])] = &[
        (sender_bin(), &[]),
        (sender_bin(), &["10.0.0.1"]),
        (sender_bin(), &["--verify", "md5", "h", "f"]),
        (sender_bin(), &["--chunk-size", "12Q", "h", "f"]),
        (sender_bin(), &["--timeout", "0", "h", "f"]),
        (receiver_bin(), &["--bind", "not-an-ip"]),
        (receiver_bin(), &["--slots", "x"]),
        (receiver_bin(), &["--no-such-option"]),
    ];
    for (bin, args) in cases {
        let (code, _, err) = run(bin, args);
        assert_eq!(code, 2, "{bin} {args:?}: {err}");
    }
}

#[test]
fn out_of_range_buffers_are_usage_errors() {
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let f = f.to_str().expect("utf8");
    let (code, _, err) = run(sender_bin(), &["--chunk-size", "1K", "127.0.0.1", f]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("chunk size"), "{err}");
    let (code, _, err) = run(sender_bin(), &["--depth", "0", "127.0.0.1", f]);
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(receiver_bin(), &["--slots", "100000"]);
    assert_eq!(code, 2, "{err}");
}

#[test]
fn missing_input_file_is_an_io_error_before_connecting() {
    let (code, _, err) = run(sender_bin(), &["127.0.0.1", "/nonexistent/file.bin"]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("cannot open /nonexistent/file.bin"), "{err}");
}

#[test]
fn directory_as_input_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("dir");
    let (code, _, err) = run(
        sender_bin(),
        &["127.0.0.1", dir.path().to_str().expect("utf8")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not a regular file"), "{err}");
}

#[test]
fn missing_output_directory_is_an_io_error() {
    let (code, _, err) = run(receiver_bin(), &["--dir", "/nonexistent/dir", "--once"]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("/nonexistent/dir"), "{err}");
}

#[test]
fn no_rdma_device_exits_3_with_a_clear_message() {
    if has_rdma_device() {
        // Covered by the e2e suite's connect-error case on RDMA machines.
        eprintln!("this machine has an RDMA device; the no-device path cannot be shown here");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let (code, _, err) = run(sender_bin(), &["127.0.0.1", f.to_str().expect("utf8")]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no RDMA device found"), "{err}");
    let (code, _, err) = run(
        receiver_bin(),
        &["--once", "--dir", dir.path().to_str().expect("utf8")],
    );
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("no RDMA device found"), "{err}");
}

/// Runs with RDMA_XFER_TOKEN unset or set to `token_env`.
fn run_env(bin: &str, args: &[&str], token_env: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args).env_remove("RDMA_XFER_TOKEN");
    if let Some(v) = token_env {
        cmd.env("RDMA_XFER_TOKEN", v);
    }
    let out = cmd.output().expect("run binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn empty_token_is_a_usage_error() {
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let token = dir.path().join("token");
    std::fs::write(&token, b"\n").expect("write");
    let (f, token) = (f.to_str().expect("utf8"), token.to_str().expect("utf8"));
    let out = dir.path().to_str().expect("utf8");
    let cases: [(&str, Vec<&str>); 2] = [
        (sender_bin(), vec!["--token-file", token, "127.0.0.1", f]),
        (receiver_bin(), vec!["--token-file", token, "--dir", out]),
    ];
    for (bin, args) in &cases {
        // Even with a good token in the environment: the file wins.
        let (code, err) = run_env(bin, args, Some("good"));
        assert_eq!(code, 2, "{bin}: {err}");
        assert!(
            err.contains(&format!("token file {token} is empty")),
            "{bin}: {err}"
        );
    }
    // An empty environment value is refused the same way.
    let (code, err) = run_env(sender_bin(), &["127.0.0.1", f], Some(""));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("RDMA_XFER_TOKEN is empty"), "{err}");
    let (code, err) = run_env(receiver_bin(), &["--dir", out], Some(" \n"));
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("RDMA_XFER_TOKEN is empty"), "{err}");
}

#[test]
fn missing_token_file_is_an_io_error() {
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let f = f.to_str().expect("utf8");
    let out = dir.path().to_str().expect("utf8");
    let missing = "/nonexistent/rdma-xfer-token";
    let cases: [(&str, Vec<&str>); 2] = [
        (sender_bin(), vec!["--token-file", missing, "127.0.0.1", f]),
        (receiver_bin(), vec!["--token-file", missing, "--dir", out]),
    ];
    for (bin, args) in &cases {
        let (code, err) = run_env(bin, args, None);
        assert_eq!(code, 6, "{bin}: {err}");
        assert!(
            err.contains(&format!("cannot read token file {missing}")),
            "{bin}: {err}"
        );
        assert!(err.contains("No such file"), "{bin}: {err}");
    }
}

#[test]
fn token_file_readable_by_others_warns_but_is_used() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let token = dir.path().join("token");
    std::fs::write(&token, b"secret-value\n").expect("write");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let token = token.to_str().expect("utf8");
    // A missing input file stops the sender right after the token loaded.
    let args = ["--token-file", token, "127.0.0.1", "/nonexistent/in.bin"];
    let (code, err) = run_env(sender_bin(), &args, None);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains("readable by group or others"), "{err}");
    assert!(!err.contains("secret-value"), "the token leaked: {err}");
    std::fs::set_permissions(token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, err) = run_env(sender_bin(), &args, None);
    assert_eq!(code, 6, "{err}");
    assert!(!err.contains("readable by group or others"), "{err}");
}

#[test]
fn receiver_without_token_warns_at_start_up() {
    if has_rdma_device() {
        // On an RDMA machine the receiver would start serving; tests/auth.rs
        // checks the warning there.
        eprintln!("this machine has an RDMA device; see tests/auth.rs");
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().to_str().expect("utf8");
    let (code, err) = run_env(receiver_bin(), &["--once", "--dir", out], None);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("no token configured: this receiver accepts transfers from anyone"),
        "{err}"
    );
    let (code, err) = run_env(receiver_bin(), &["--once", "--dir", out], Some("t"));
    assert_eq!(code, 3, "{err}");
    assert!(!err.contains("no token configured"), "{err}");
}
