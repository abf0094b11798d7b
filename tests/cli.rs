//! Command-line behaviour that needs no RDMA: help, usage errors, local
//! errors before connecting, and "no RDMA device" on a machine without one.

mod support;

use std::path::Path;
use std::process::Command;
use support::{
    RunAs, STOCK_MEMLOCK, has_rdma_device, have, receiver_bin, sender_bin, skip, test_name,
    token_env, under_memlock,
};

fn run(bin: &str, args: &[&str]) -> (i32, String, String) {
    let out = Command::new(bin).args(args).output().expect("run binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn help_lists_exit_codes_and_examples() {
    for (bin, name) in [(sender_bin(), "sender"), (receiver_bin(), "receiver")] {
        for flag in ["--help", "-h"] {
            let (code, out, _) = run(bin, &[flag]);
            assert_eq!(code, 0);
            assert!(out.contains("Exit codes:"), "{out}");
            assert!(out.contains("7  timeout or peer lost"), "{out}");
            assert!(out.contains("Examples:"), "{out}");
            assert!(out.contains(&format!("\n  {name} --")), "{out}");
            assert!(out.contains("--json"), "{out}");
            assert!(out.contains("progress bars"), "{out}");
        }
    }
}

#[test]
fn version_of_each_tool() {
    for (bin, name) in [
        (sender_bin(), "sender"),
        (receiver_bin(), "receiver"),
        (gen_bin(), "rdma-xfer-gen"),
    ] {
        for flag in ["--version", "-V"] {
            let (code, out, err) = run(bin, &[flag]);
            assert_eq!(code, 0, "{err}");
            let expected = format!(
                "{name} {} (rdma-xfer, protocol {}",
                env!("CARGO_PKG_VERSION"),
                rdma_xfer::proto::PROTOCOL_VERSION
            );
            assert!(out.starts_with(&expected), "{out}");
            // The commit, when the build knew it (make passes it).
            match option_env!("RXFER_GIT_COMMIT").filter(|c| !c.is_empty()) {
                Some(commit) => assert_eq!(out, format!("{expected}, commit {commit})\n")),
                None => assert_eq!(out, format!("{expected})\n")),
            }
        }
    }
}

fn gen_bin() -> &'static str {
    env!("CARGO_BIN_EXE_rdma-xfer-gen")
}

/// Checks a man page with groff (warnings on, all of them fatal here) and
/// renders it with `man -l`.
fn check_man_page(page: &Path, name: &str) {
    assert!(have("groff"), "groff is needed to check the man pages");
    let out = Command::new("groff")
        .args(["-man", "-Tutf8", "-ww", "-z"])
        .arg(page)
        .output()
        .expect("run groff");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && err.is_empty(),
        "{}: {err}",
        page.display()
    );
    if !have("man") {
        eprintln!(
            "{}: no man command here: checked with groff only",
            test_name()
        );
        return;
    }
    let out = Command::new("man")
        .arg("-l")
        .arg(page)
        .env("MANWIDTH", "100")
        .env("MANPAGER", "cat")
        .env("PAGER", "cat")
        .output()
        .expect("run man -l");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "man -l {}: {}",
        page.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    for needle in [
        "NAME",
        "SYNOPSIS",
        "OPTIONS",
        "EXAMPLES",
        "EXIT STATUS",
        "--json",
        "--token-file",
        "7  timeout or peer lost",
    ] {
        assert!(text.contains(needle), "{name}.1 lacks {needle:?}:\n{text}");
    }
    assert!(text.contains(&format!("{name} - ")), "{text}");
}

/// Checks the completion scripts of one directory per shell.
fn check_completions(bash: &Path, zsh: &Path, fish: &Path) {
    for name in ["sender", "receiver"] {
        let script = bash.join(name);
        let out = Command::new("bash")
            .arg("-n")
            .arg(&script)
            .output()
            .expect("bash -n");
        assert!(
            out.status.success(),
            "bash -n {}: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        // Sourced, it registers a completion function for the command.
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source '{}' && complete -p {name}",
                script.display()
            ))
            .output()
            .expect("bash");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && said.contains(name), "{said}");
        // What TAB offers after the given words: host names for the
        // sender's ADDR and for --source/--bind, no file names after a
        // numeric option.
        let complete = |words: &[&str]| {
            let line = words.join(" ");
            let out = Command::new("bash")
                .arg("-c")
                .arg(format!(
                    "source '{}' && COMP_WORDS=({line} loc) && COMP_CWORD={} && \
                     _{name} {name} loc \"${{COMP_WORDS[COMP_CWORD-1]}}\" && \
                     printf '%s\\n' \"${{COMPREPLY[@]}}\"",
                    script.display(),
                    words.len()
                ))
                .current_dir(std::env::temp_dir())
                .output()
                .expect("bash");
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let host_option = if name == "sender" {
            "--source"
        } else {
            "--bind"
        };
        assert!(
            complete(&[name, host_option])
                .lines()
                .any(|l| l == "localhost"),
            "{name} {host_option}: {}",
            complete(&[name, host_option])
        );
        assert_eq!(complete(&[name, "--timeout"]).trim(), "loc", "{name}");
        if name == "sender" {
            // The operands are files first (FILE... HOST:DIR); the remote
            // receiver's address is a host.
            for words in [
                &["sender", "--remote-bind"][..],
                &["sender", "-r", "--source"],
            ] {
                assert!(
                    complete(words).lines().any(|l| l == "localhost"),
                    "{words:?}: {}",
                    complete(words)
                );
            }
            assert!(!complete(&["sender", "host"]).contains("localhost"));
        }
        let checks = [
            ("zsh", zsh.join(format!("_{name}"))),
            ("fish", fish.join(format!("{name}.fish"))),
        ];
        for (shell, script) in checks {
            let text = std::fs::read_to_string(&script).expect("completion script");
            assert!(text.contains("token-file"), "{}", script.display());
            if have(shell) {
                let out = Command::new(shell)
                    .arg("-n")
                    .arg(&script)
                    .output()
                    .expect("shell -n");
                assert!(out.status.success(), "{shell} -n {}", script.display());
            } else {
                eprintln!(
                    "{}: no {shell} here: {} not parsed",
                    test_name(),
                    script.display()
                );
            }
        }
    }
}

#[test]
fn generator_writes_man_pages_and_completions() {
    let dir = tempfile::tempdir().expect("dir");
    // Directories are created as needed.
    let man = dir.path().join("share/man/man1");
    let (code, out, err) = run(gen_bin(), &["man", man.to_str().expect("utf8")]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out.lines().count(), 2, "{out}");
    for name in ["sender", "receiver"] {
        check_man_page(&man.join(format!("{name}.1")), name);
    }
    let mut dirs = Vec::new();
    for shell in ["bash", "zsh", "fish"] {
        let d = dir.path().join(shell).join("completions");
        let (code, _, err) = run(
            gen_bin(),
            &["completions", shell, d.to_str().expect("utf8")],
        );
        assert_eq!(code, 0, "{shell}: {err}");
        dirs.push(d);
    }
    check_completions(&dirs[0], &dirs[1], &dirs[2]);
    // `-`: both scripts on standard output, as the files hold them; man
    // pages are two files: a usage error, and no directory named `-`.
    let (code, out, err) = run(gen_bin(), &["completions", "bash", "-"]);
    assert_eq!(code, 0, "{err}");
    let files: String = ["sender", "receiver"]
        .iter()
        .map(|n| std::fs::read_to_string(dirs[0].join(n)).expect("script"))
        .collect();
    assert_eq!(out, files);
    let cwd = tempfile::tempdir().expect("dir");
    let out = Command::new(gen_bin())
        .args(["man", "-"])
        .current_dir(cwd.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!cwd.path().join("-").exists());
    // A directory that cannot be made (below a file) is an I/O error,
    // with its name.
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").expect("write");
    let below = file.join("man1");
    let (code, _, err) = run(gen_bin(), &["man", below.to_str().expect("utf8")]);
    assert_eq!(code, 6, "{err}");
    assert!(err.contains(below.to_str().expect("utf8")), "{err}");
}

/// `rdma-xfer-gen token FILE`: a new token only the owner can read, one
/// line on stderr saying how both tools use it, nothing on stdout; never
/// over an existing file, never in a missing directory (exit 2 each).
#[test]
fn generator_makes_tokens() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let token = dir.path().join("token");
    let path = token.to_str().expect("utf8");
    let (code, out, err) = run(gen_bin(), &["token", path]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(out, "");
    assert_eq!(err.lines().count(), 1, "{err}");
    for says in [
        path.to_string(),
        format!("receiver --token-file {path}"),
        format!("sender --token-file {path}"),
    ] {
        assert!(err.contains(&says), "{says:?} not in {err}");
    }
    let text = std::fs::read_to_string(&token).expect("token");
    assert!(text.len() == 65 && text.ends_with('\n'), "{text:?}");
    let mode = std::fs::metadata(&token)
        .expect("meta")
        .permissions()
        .mode();
    assert_eq!(mode & 0o077, 0, "{mode:o}");
    let (code, _, err) = run(gen_bin(), &["token", path]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("exists"), "{err}");
    assert_eq!(std::fs::read_to_string(&token).expect("token"), text);
    let missing = dir.path().join("missing/token");
    let (code, _, err) = run(gen_bin(), &["token", missing.to_str().expect("utf8")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("does not exist"), "{err}");
    // `-`: a new token on standard output, a line on stderr; no file.
    let cwd = tempfile::tempdir().expect("dir");
    let out = Command::new(gen_bin())
        .args(["token", "-"])
        .current_dir(cwd.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = String::from_utf8(out.stdout).expect("utf8");
    assert_eq!(printed.len(), 65, "{printed:?}");
    assert!(printed.trim_end().bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(printed, text);
    assert!(!String::from_utf8_lossy(&out.stderr).contains(printed.trim()));
    assert!(!cwd.path().join("-").exists());
    // Into a file others may read: refused, nothing written.
    let open = cwd.path().join("open");
    let file = std::fs::File::create(&open).expect("file");
    file.set_permissions(std::fs::Permissions::from_mode(0o644))
        .expect("chmod");
    let out = Command::new(gen_bin())
        .args(["token", "-"])
        .stdout(file)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("umask 077"));
    assert_eq!(std::fs::metadata(&open).expect("open").len(), 0);
    assert!(!missing.exists());
}

/// Closed by default, before any RDMA: a receiver without a token exits
/// 2 saying how to make one and that --insecure exists; --insecure takes
/// no --exec, --link-dest or --overwrite, and no token; a token at the
/// default location needs no option.
#[test]
fn receiver_without_a_token_refuses_to_start() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path().to_str().expect("utf8");
    // The user's default token location, empty at first.
    let config = tempfile::tempdir().expect("config");
    let receiver = |args: &[&str]| {
        let out = Command::new(receiver_bin())
            .args(args)
            .env_remove("RDMA_XFER_TOKEN")
            .env("XDG_CONFIG_HOME", config.path())
            .output()
            .expect("run receiver");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        (out.status.code().unwrap_or(-1), err)
    };
    let (code, err) = receiver(&["--once", d]);
    assert_eq!(code, 2, "{err}");
    for says in [
        "needs a token",
        "rdma-xfer-gen token FILE",
        "receiver --token-file FILE",
        "receiver --insecure",
    ] {
        assert!(err.contains(says), "{says:?} not in {err}");
    }
    for (extra, says) in [
        (&["--exec", "cat"][..], "--exec would run its command"),
        (&["--link-dest", "/"], "--link-dest would link files"),
        (&["--overwrite"], "--overwrite would replace existing files"),
    ] {
        let mut args = vec!["--insecure", "--once", d];
        args.extend(extra);
        let (code, err) = receiver(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(says), "{says:?} not in {err}");
    }
    let token = dir.path().join("token");
    std::fs::write(&token, "sixteen-bytes-ok").expect("token");
    let (code, err) = receiver(&["--insecure", "--token-file", token.to_str().unwrap(), d]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("but a token is given"), "{err}");
    // A token at the user's default location is found without options;
    // --insecure does not look for one. Both then get past the checks
    // (and fail later here, for want of RDMA, or time out waiting).
    std::fs::create_dir(config.path().join("rdma-xfer")).expect("mkdir");
    let default = config.path().join("rdma-xfer/token");
    std::fs::copy(&token, &default).expect("copy");
    std::fs::set_permissions(&default, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    for args in [&["--once"][..], &["--once", "--insecure"]] {
        let args = [args, &["--timeout", "1", d]].concat();
        let (code, err) = receiver(&args);
        assert_ne!(code, 2, "{args:?}: {err}");
        assert!(
            !err.contains("needs a token") && !err.contains("token is given"),
            "{args:?}: {err}"
        );
    }
}

/// `make install DESTDIR=... PREFIX=/usr` with the binaries this test run
/// built (`-o build`: the Makefile's build step, which installs packages,
/// is not run again here).
#[test]
fn make_install_respects_destdir_and_prefix() {
    assert!(have("make"), "make is needed");
    let dest = tempfile::tempdir().expect("dir");
    let built = Path::new(sender_bin()).parent().expect("bin dir");
    let out = Command::new("make")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["-s", "-o", "build-bins", "install", "PREFIX=/usr"])
        .arg(format!("DESTDIR={}", dest.path().display()))
        .arg(format!("RELEASE_DIR={}", built.display()))
        .output()
        .expect("run make");
    assert!(
        out.status.success(),
        "make install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let usr = dest.path().join("usr");
    let mut found: Vec<String> = Vec::new();
    let mut stack = vec![usr.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                found.push(p.strip_prefix(&usr).expect("prefix").display().to_string());
            }
        }
    }
    found.sort();
    assert_eq!(
        found,
        [
            "bin/rdma-xfer-gen",
            "bin/receiver",
            "bin/sender",
            "lib/systemd/system/rdma-xfer-receiver.service",
            "share/bash-completion/completions/receiver",
            "share/bash-completion/completions/sender",
            "share/fish/vendor_completions.d/receiver.fish",
            "share/fish/vendor_completions.d/sender.fish",
            "share/man/man1/receiver.1",
            "share/man/man1/sender.1",
            "share/zsh/site-functions/_receiver",
            "share/zsh/site-functions/_sender",
        ]
    );
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &str| {
        std::fs::metadata(usr.join(p))
            .expect("stat")
            .permissions()
            .mode()
            & 0o777
    };
    assert_eq!(mode("bin/sender"), 0o755);
    assert_eq!(mode("share/man/man1/sender.1"), 0o644);
    let (code, out, _) = run(usr.join("bin/receiver").to_str().expect("utf8"), &["-V"]);
    assert_eq!(code, 0);
    assert!(
        out.starts_with(concat!("receiver ", env!("CARGO_PKG_VERSION"), " (")),
        "{out}"
    );
    for name in ["sender", "receiver"] {
        check_man_page(&usr.join(format!("share/man/man1/{name}.1")), name);
    }
    check_completions(
        &usr.join("share/bash-completion/completions"),
        &usr.join("share/zsh/site-functions"),
        &usr.join("share/fish/vendor_completions.d"),
    );
}

/// Without --json nothing goes to stdout; with it, even a run that fails
/// before connecting ends with a summary object carrying the exit code.
#[test]
fn json_summary_on_early_failure() {
    let (code, out, err) = run(sender_bin(), &["127.0.0.1", "/nonexistent/in.bin"]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    let (code, out, err) = run(
        sender_bin(),
        &["--json", "127.0.0.1", "/nonexistent/in.bin"],
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(v["event"], "summary");
    assert_eq!(v["files"], 0);
    assert_eq!(v["status"], "usage");
    assert_eq!(v["exit_code"], 2);
    assert_eq!(v["retryable"], false);
    assert!(
        v["reason"]
            .as_str()
            .expect("reason")
            .contains("cannot open /nonexistent/in.bin"),
        "{v}"
    );
    // The error is still said once on stderr, without colours on a pipe.
    assert!(err.contains("sender: error: cannot open"), "{err}");
    assert!(!err.contains('\x1b') && !err.contains('\r'), "{err:?}");
}

/// The receiver's summary when it fails before serving (no RDMA device).
#[test]
fn json_summary_of_a_receiver_without_a_device() {
    if has_rdma_device() {
        skip("this machine has an RDMA device", false);
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let out_dir = dir.path().to_str().expect("utf8");
    let (code, out, err) = run(
        receiver_bin(),
        &["--insecure", "--once", "--json", "--dir", out_dir],
    );
    assert_eq!(code, 8, "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(
        (v["status"].as_str(), v["exit_code"].as_u64()),
        (Some("no_device"), Some(8))
    );
    assert_eq!(v["retryable"], false, "{v}");
    // UNAUTHENTICATED comes with the listening line: a receiver that
    // cannot start says only why.
    assert!(!err.contains("UNAUTHENTICATED"), "{err:?}");
    assert!(!err.contains('\x1b'), "colours on a pipe: {err:?}");
    // A serving receiver prints no summary (it reports per file only).
    let (code, out, _) = run(receiver_bin(), &["--insecure", "--json", "--dir", out_dir]);
    assert_eq!((code, out.as_str()), (8, ""));
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
fn a_bad_ack_timeout_is_a_usage_error_of_both_tools() {
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let f = f.to_str().expect("utf8");
    for value in ["300", "32", "-1", "abc"] {
        for (bin, args) in [
            (sender_bin(), vec!["127.0.0.1", f]),
            (
                receiver_bin(),
                vec!["--dir", dir.path().to_str().expect("utf8")],
            ),
        ] {
            let out = Command::new(bin)
                .args(&args)
                .env("RDMA_XFER_ACK_TIMEOUT", value)
                .output()
                .expect("run binary");
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{bin} {value}: {err}");
            assert!(err.contains("RDMA_XFER_ACK_TIMEOUT"), "{err}");
            assert!(err.contains("1..31"), "{err}");
        }
    }
}

#[test]
fn missing_input_file_is_a_usage_error_before_connecting() {
    let (code, _, err) = run(sender_bin(), &["127.0.0.1", "/nonexistent/file.bin"]);
    assert_eq!(code, 2, "{err}");
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
    assert!(err.contains("is a directory"), "{err}");
    assert!(err.contains("use -r"), "{err}");
}

#[test]
fn stream_and_stdout_usage_errors() {
    // --stdout takes no directory and replaces nothing.
    let (code, _, err) = run(receiver_bin(), &["--stdout", "--dir", "/", "--overwrite"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a directory does not apply"), "{err}");
    assert!(err.contains("--overwrite does not apply"), "{err}");
    // Standard input once only; --name only with it.
    let (code, _, err) = run(sender_bin(), &["127.0.0.1", "-", "-"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("only once"), "{err}");
    // A stream's SHA-256 is not known before its data.
    let (code, _, err) = run(sender_bin(), &["--checksum", "127.0.0.1", "-"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("a stream cannot be hashed before it is sent"),
        "{err}"
    );
    // --name names one regular file or stream: not several, not a tree.
    let file = tempfile::NamedTempFile::new().expect("file");
    let path = file.path().to_str().expect("utf8");
    let (code, _, err) = run(sender_bin(), &["--name", "x", "127.0.0.1", path, "-"]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("--name") && err.contains("2 sources given"),
        "{err}"
    );
    let dir = tempfile::tempdir().expect("dir");
    let tree = dir.path().to_str().expect("utf8");
    let (code, _, err) = run(sender_bin(), &["-r", "--name", "x", "127.0.0.1", tree]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("is a directory: --name names one"), "{err}");
    let (code, _, err) = run(sender_bin(), &["-R", "--name", "x", "127.0.0.1", path]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not with -R"), "{err}");
    // The one-command form: before any host is logged in to.
    let (code, _, err) = run(sender_bin(), &["--name", "x", path, "-", "node01:/d/"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("2 sources given"), "{err}");
}

#[test]
fn missing_output_directory_is_a_usage_error() {
    let (code, _, err) = run(receiver_bin(), &["--dir", "/nonexistent/dir", "--once"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/nonexistent/dir"), "{err}");
}

#[test]
fn no_rdma_device_exits_8_with_what_to_run() {
    if has_rdma_device() {
        // On RDMA machines the e2e suite covers the connect errors.
        skip("this machine has an RDMA device", false);
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let (code, _, err) = run(sender_bin(), &["127.0.0.1", f.to_str().expect("utf8")]);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("no RDMA device found"), "{err}");
    // The cause found (here: no device in the kernel at all), its fix,
    // and the doctor.
    for what in [
        "the kernel has no RDMA",
        "modprobe rdma_rxe",
        "rdma link add rxe0 type rxe netdev",
        "rdma-xfer-gen doctor",
    ] {
        assert!(err.contains(what), "{what}: {err}");
    }
    // The doctor names the missing step with its fix, and exits 8.
    let (code, out, err) = run(gen_bin(), &["doctor", "127.0.0.1"]);
    assert_eq!(code, 8, "{out}{err}");
    let first = out.lines().next().unwrap_or_default();
    assert!(first.starts_with("FAIL  kernel: no RDMA"), "{out}");
    assert!(
        out.contains("      fix: load the NIC's RDMA driver"),
        "{out}"
    );
    assert!(out.contains("locked memory: "), "{out}");
    assert!(
        out.contains("127.0.0.1 (127.0.0.1): leaves from 127.0.0.1, which no RDMA device has"),
        "{out}"
    );
    assert!(
        out.ends_with("A transfer would fail here: 2 problem(s) above.\n"),
        "{out}"
    );
    let (code, _, err) = run(
        receiver_bin(),
        &[
            "--insecure",
            "--once",
            "--dir",
            dir.path().to_str().expect("utf8"),
        ],
    );
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("no RDMA device found"), "{err}");
    // -v says what the probe found before it gave up: nothing.
    let (code, _, err) = run(
        sender_bin(),
        &["-v", "127.0.0.1", f.to_str().expect("utf8")],
    );
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("sender: error: no RDMA device found"), "{err}");
}

/// Runs `cmd` to its end: (exit code, stderr).
fn run_cmd(mut cmd: Command) -> (i32, String) {
    let out = cmd.output().expect("run binary");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_sender_fits_its_staging_to_the_memlock_limit_before_connecting() {
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let f = f.to_str().expect("utf8");
    // Nobody listens there; the sender gets that far only with buffers
    // that fit (exit 3 or, without an RDMA device, 8).
    let port = support::next_port().to_string();
    let sender = |extra: &[&str]| {
        let mut cmd = Command::new(sender_bin());
        cmd.args(["--port", &port, "--timeout", "2"])
            .args(extra)
            .args(["127.0.0.1", f]);
        cmd
    };
    let limited = |who, extra: &[&str]| run_cmd(under_memlock(STOCK_MEMLOCK, who, &sender(extra)));
    // The defaults (16 x 1 MiB) do not fit 8 MiB: 7 buffers, said once.
    let (code, err) = limited(RunAs::WithoutIpcLock, &[]);
    assert!(code == 3 || code == 8, "{err}");
    let warning = "sender: warning: RLIMIT_MEMLOCK is 8.0 MiB (hard limit 8.0 MiB, 0 B pinned \
                   already): using 7 staging buffers of 1.0 MiB (--depth 7 --chunk-size 1M) \
                   instead of 16 x 1.0 MiB; for full speed raise the limit: `ulimit -l unlimited`";
    assert!(err.contains(warning), "{err}");
    assert_eq!(err.matches("RLIMIT_MEMLOCK").count(), 1, "{err}");
    // Given sizes are kept: smaller buffers when only --depth is given.
    let (code, err) = limited(RunAs::WithoutIpcLock, &["--depth", "16"]);
    assert!(code == 3 || code == 8, "{err}");
    assert!(
        err.contains("using 16 staging buffers of 256.0 KiB (--depth 16 --chunk-size 256K)"),
        "{err}"
    );
    // Given settings that do not fit: the memlock error (exit 1), before
    // anything connects.
    let (code, err) = limited(
        RunAs::WithoutIpcLock,
        &["--depth", "16", "--chunk-size", "1M"],
    );
    assert_eq!(code, 1, "{err}");
    for part in [
        "sender: error: cannot lock 16.5 MiB of memory for RDMA (16 staging buffers of 1.0 MiB \
         (--depth 16 --chunk-size 1M) as given, with their control buffers): RLIMIT_MEMLOCK is \
         8.0 MiB (hard limit 8.0 MiB)",
        "ulimit -l unlimited",
        "limits.conf",
        "LimitMEMLOCK=",
    ] {
        assert!(err.contains(part), "{part}: {err}");
    }
    assert!(
        !err.contains("RDMA device") && !err.contains("connect"),
        "{err}"
    );
    // 64 KiB: not even the smallest buffers the sender would choose.
    let lowest = run_cmd(under_memlock(64 << 10, RunAs::WithoutIpcLock, &sender(&[])));
    assert_eq!(lowest.0, 1, "{}", lowest.1);
    assert!(
        lowest.1.contains("even 2 staging buffers of 64.0 KiB"),
        "{}",
        lowest.1
    );
    // With CAP_IPC_LOCK (root) the limit does not apply: no warning, no
    // refusal.
    if rustix::process::geteuid().is_root() {
        let (code, err) = limited(RunAs::Myself, &["--depth", "16", "--chunk-size", "1M"]);
        assert!(code == 3 || code == 8, "{err}");
        assert!(!err.contains("RLIMIT_MEMLOCK"), "{err}");
    }
}

/// Runs with RDMA_XFER_TOKEN unset or set to `token_env`.
fn run_env(bin: &str, args: &[&str], token: Option<&str>) -> (i32, String) {
    let mut cmd = Command::new(bin);
    cmd.args(args);
    token_env(&mut cmd, token);
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
        let (code, err) = run_env(bin, args, Some("a-good-token-of-32-bytes-or-more"));
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
fn missing_token_file_is_a_usage_error() {
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
        assert_eq!(code, 2, "{bin}: {err}");
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
    std::fs::write(&token, b"secret-value-of-32-bytes-or-so\n").expect("write");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let token = token.to_str().expect("utf8");
    // A missing input file stops the sender right after the token loaded.
    let args = ["--token-file", token, "127.0.0.1", "/nonexistent/in.bin"];
    let (code, err) = run_env(sender_bin(), &args, None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("sender: warning: token file") && err.contains("readable by group or others"),
        "{err}"
    );
    assert!(!err.contains("secret-value"), "the token leaked: {err}");
    std::fs::set_permissions(token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let (code, err) = run_env(sender_bin(), &args, None);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("readable by group or others"), "{err}");
}

#[test]
fn receiver_that_cannot_start_does_not_say_unauthenticated() {
    if has_rdma_device() {
        // The receiver would start serving; tests/rdma/auth.rs checks the
        // UNAUTHENTICATED line there.
        skip(
            "this machine has an RDMA device (see tests/rdma/auth.rs)",
            false,
        );
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().to_str().expect("utf8");
    // The warning is the listening line of a receiver that serves; this
    // one fails first and says only why.
    for (token, insecure) in [
        (None, "--insecure"),
        (Some("a-token-of-sixteen-or-more"), "-q"),
    ] {
        let (code, err) = run_env(receiver_bin(), &[insecure, "--once", "--dir", out], token);
        assert_eq!(code, 8, "{err}");
        assert!(err.contains("no RDMA device"), "{err}");
        assert!(!err.contains("UNAUTHENTICATED"), "{err}");
    }
}

#[test]
fn short_token_is_a_usage_error_before_connecting() {
    let dir = tempfile::tempdir().expect("dir");
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").expect("write");
    let f = f.to_str().expect("utf8");
    let out = dir.path().to_str().expect("utf8");
    // 15 bytes: one short. Nothing listens on the address: a sender that
    // tried to connect would fail with 3, not 2.
    for (bin, args) in [
        (sender_bin(), vec!["127.0.0.1", f]),
        (receiver_bin(), vec!["--once", "--dir", out]),
    ] {
        let (code, err) = run_env(bin, &args, Some("fifteen-bytes!!"));
        assert_eq!(code, 2, "{bin}: {err}");
        assert!(err.contains("at least 16 bytes"), "{bin}: {err}");
        assert!(err.contains("rdma-xfer-gen token FILE"), "{bin}: {err}");
        assert!(!err.contains("fifteen"), "{bin}: token leaked: {err}");
        assert!(
            !err.contains("connected") && !err.contains("listening"),
            "{bin}: {err}"
        );
    }
}

/// Every problem found before connecting exits 2 and is reported, each as
/// a `TOOL: error:` line of its own.
#[test]
fn every_problem_before_connecting_is_reported_with_exit_2() {
    let dir = tempfile::tempdir().expect("dir");
    let p = |name: &str| dir.path().join(name).to_str().expect("utf8").to_string();
    std::fs::write(p("a"), b"a").expect("write");
    std::fs::create_dir(p("sub")).expect("mkdir");
    std::fs::write(p("sub/a"), b"a").expect("write");
    assert!(
        Command::new("mkfifo")
            .arg(p("fifo"))
            .status()
            .expect("mkfifo")
            .success()
    );
    let (code, out, err) = run(
        sender_bin(),
        &[
            "--depth",
            "0",
            "--name",
            "../up",
            "127.0.0.1",
            &p("missing"),
            &p("sub"),
            &p("fifo"),
            &p("a"),
            &p("sub/a"),
        ],
    );
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    for what in [
        "--depth must be between 1 and 1024",
        "invalid --name",
        "cannot open",
        "is a directory (use -r",
        "a FIFO",
        "would both arrive as a",
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with("sender: error: ") && l.contains(what)),
            "{what:?} is not an error line of its own in:\n{err}"
        );
    }
    // With --json the summary lists them too; the log line is JSON.
    let (code, out, err) = run(
        sender_bin(),
        &[
            "--json",
            "--log-format",
            "json",
            "127.0.0.1",
            &p("missing"),
            &p("sub"),
        ],
    );
    assert_eq!(code, 2, "{err}");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
    assert_eq!(summary["status"], "usage", "{summary}");
    let log: serde_json::Value = serde_json::from_str(err.trim()).expect("one JSON line");
    assert_eq!(log["level"], "ERROR", "{log}");
    assert_eq!(log["fields"]["exit_code"], 2, "{log}");
    assert_eq!(log["fields"]["problems"].as_array().map(Vec::len), Some(2));
    // The receiver: a missing directory, port 0 and a short token at once.
    let (code, err) = run_env(
        receiver_bin(),
        &["--port", "0", "--dir", &p("missing")],
        Some("short"),
    );
    assert_eq!(code, 2, "{err}");
    for what in [
        "--port must be between 1 and 65535",
        "output directory",
        "at least 16 bytes",
    ] {
        assert!(
            err.lines()
                .any(|l| l.starts_with("receiver: error: ") && l.contains(what)),
            "{what:?} in:\n{err}"
        );
    }
}

/// scp, rsync and ssh habits get the right thing or a hint, exit 2.
#[test]
fn scp_habits_get_hints() {
    let dir = tempfile::tempdir().expect("dir");
    let file = dir.path().join("data.bin");
    std::fs::write(&file, b"x").expect("write");
    let f = file.to_str().expect("utf8");
    // host:/path first: targets come last, and nothing is fetched.
    let (code, _, err) = run(sender_bin(), &["recv-host:/data/in", f]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("targets come after the files"), "{err}");
    assert!(err.contains("sender FILE... recv-host:/data/in"), "{err}");
    assert!(err.contains("cannot fetch"), "{err}");
    // Swapped arguments.
    let (code, _, err) = run(sender_bin(), &[f, "recv-host"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("the receiver's address comes first"), "{err}");
    // HOST:PORT and --port must agree; a bad port in ADDR is refused.
    let (code, _, err) = run(sender_bin(), &["--port", "1", "127.0.0.1:2", f]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("disagree"), "{err}");
    let (code, _, err) = run(sender_bin(), &["[::1]:0", f]);
    assert_eq!(code, 2, "{err}");
    // `receiver ADDR` where a directory was meant.
    let (code, _, err) = run(receiver_bin(), &["10.0.0.1"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--bind ADDR"), "{err}");
    // --follow-links without -r; --port 0 on both.
    let (code, _, err) = run(sender_bin(), &["--follow-links", "127.0.0.1", f]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("needs -r"), "{err}");
    for bin in [sender_bin(), receiver_bin()] {
        let args: &[&str] = if bin == sender_bin() {
            &["--port", "0", "127.0.0.1", f]
        } else {
            &["--port", "0"]
        };
        let (code, _, err) = run(bin, args);
        assert_eq!(code, 2, "{bin}: {err}");
        assert!(err.contains("between 1 and 65535"), "{bin}: {err}");
    }
}

/// rsync's options that sender lacks name what to use instead, one line
/// each, exit 2 (clap alone suggests --port for --partial).
#[test]
fn rsync_options_name_their_equivalent() {
    for (flag, equivalent) in [
        ("-P", "--resume"),
        ("-avP", "-r"),
        ("--partial", "--resume"),
        ("-a", "-r"),
        ("--archive", "-p"),
        ("-z", "no compression"),
        ("--compress", "no compression"),
        ("--delete", "never deletes"),
    ] {
        let (code, out, err) = run(sender_bin(), &[flag, "host:/d", "f"]);
        assert_eq!(code, 2, "{flag}: {err}");
        assert!(out.is_empty(), "{flag}: {out}");
        let first = err.lines().next().unwrap_or_default();
        assert!(
            first.starts_with("sender: error: unknown option '-"),
            "{flag}: {err}"
        );
        assert!(first.contains(equivalent), "{flag}: {err}");
        assert!(!err.contains("--port"), "{flag}: {err}");
    }
    // Others keep clap's own message.
    let (code, _, err) = run(sender_bin(), &["--bogus", "host:/d", "f"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("unexpected argument '--bogus'"), "{err}");
}

/// Warnings look like errors (`TOOL: warning: ...`), with a timestamp only
/// with -v; JSON logs give warnings and the final error one shape.
#[test]
fn one_message_style() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("dir");
    let token = dir.path().join("token");
    std::fs::write(&token, b"a-secret-of-32-bytes-or-more-yes\n").expect("write");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let token = token.to_str().expect("utf8");
    let args = ["--token-file", token, "127.0.0.1", "/nonexistent/in.bin"];
    let (code, _, err) = run(sender_bin(), &args);
    assert_eq!(code, 2, "{err}");
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("sender: warning: token file "),
        "{err}"
    );
    assert!(lines[1].starts_with("sender: error: cannot open "), "{err}");
    // -v: timestamps first (RFC 3339), the same shape after them.
    let mut verbose = vec!["-v"];
    verbose.extend(args);
    let (_, _, err) = run(sender_bin(), &verbose);
    let warning = err
        .lines()
        .find(|l| l.contains("warning: token file"))
        .unwrap_or_else(|| panic!("{err}"));
    let (stamp, rest) = warning.split_once(' ').expect("a timestamp");
    assert!(stamp.starts_with("20") && stamp.ends_with('Z'), "{warning}");
    assert!(rest.starts_with("sender: warning: "), "{warning}");
    // JSON: the warning and the error have the same keys.
    let mut json = vec!["--log-format", "json"];
    json.extend(args);
    let (_, _, err) = run(sender_bin(), &json);
    let objects: Vec<serde_json::Value> = err
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(objects.len(), 2, "{err}");
    let keys = |v: &serde_json::Value| {
        let mut k: Vec<String> = v.as_object().expect("object").keys().cloned().collect();
        k.sort();
        k
    };
    assert_eq!(keys(&objects[0]), keys(&objects[1]), "{err}");
    assert_eq!(objects[0]["level"], "WARN");
    assert_eq!(objects[1]["level"], "ERROR");
    assert!(objects[1]["fields"]["message"].is_string(), "{err}");
}

/// On a terminal: `receiver --stdout` refuses to write binary data there;
/// `sender ADDR -` says it is reading standard input.
#[test]
fn terminals_are_not_data_streams() {
    if !have("script") {
        skip(
            "no `script` command for a terminal",
            support::everything_required(),
        );
        return;
    }
    let dir = tempfile::tempdir().expect("dir");
    let out = dir.path().join("typescript");
    let in_terminal = |line: String| {
        // `script` gives the command a terminal on stdin, stdout and stderr.
        let run = Command::new("script")
            .args(["-qec", &line])
            .arg(&out)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("script");
        (
            run.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&run.stdout).into_owned(),
        )
    };
    let (code, screen) = in_terminal(format!("{} --stdout", receiver_bin()));
    assert_eq!(code, 2, "{screen}");
    assert!(screen.contains("to this terminal"), "{screen}");
    // The sender's notice comes once its options are fine, before it
    // connects (here it then finds no RDMA device, or nobody listening).
    let (code, screen) = in_terminal(format!("{} --timeout 1 127.0.0.1 -", sender_bin()));
    assert_ne!(code, 0, "{screen}");
    assert!(
        screen.contains("sender: reading standard input from the terminal (end it with Ctrl-D)"),
        "{screen}"
    );
}

/// The one-command form's failures before any RDMA, through a stand-in
/// for ssh that runs the remote command here (`-e`): each says where it
/// happened, with the remote's words and an exit code of its class.
#[test]
fn one_command_failures_say_where_they_are() {
    if has_rdma_device() {
        skip(
            "this host has RDMA: the remote receiver would not fail",
            false,
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f.bin");
    std::fs::write(&file, b"data").unwrap();
    let file = file.to_str().unwrap();
    // HOST COMMAND -> sh -c COMMAND, with the built receiver on the PATH.
    let rsh = dir.path().join("here-rsh");
    std::fs::write(&rsh, "#!/bin/sh\nshift\nexec sh -c \"$*\"\n").unwrap();
    let made = Command::new("chmod").arg("755").arg(&rsh).status().unwrap();
    assert!(made.success());
    let rsh = rsh.to_str().unwrap();
    let bin_dir = Path::new(receiver_bin()).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sender_via = |rsh: &str, args: &[&str]| {
        let out = Command::new(sender_bin())
            .args(args)
            .env("PATH", &path)
            .env("RDMA_XFER_RSH", rsh)
            .env_remove("RDMA_XFER_TOKEN")
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let sender = |args: &[&str]| sender_via(rsh, args);
    let target = format!("node01:{}", dir.path().display());
    // No RDMA device there: exit 8, the remote's message, its host.
    let (code, err) = sender(&[file, &target]);
    assert_eq!(code, 8, "{err}");
    assert!(
        err.contains(
            "sender: error: node01: the receiver on node01 exited with status 8: no RDMA device"
        ),
        "{err}"
    );
    // Said once: the remote's own error line is not repeated.
    assert_eq!(err.matches("no RDMA device found").count(), 1, "{err}");
    // No such directory there: exit 2.
    let (code, err) = sender(&[file, "node01:/no/such/dir"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("output directory /no/such/dir"), "{err}");
    // No receiver program there: exit 2 with the hint.
    let (code, err) = sender(&["--remote-receiver", "/no/such/receiver", file, &target]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("name it with --remote-receiver PATH"), "{err}");
    // The remote shell cannot log in (ssh's 255): exit 3.
    let (code, err) = sender_via(
        "sh -c 'echo no route to host >&2; exit 255' x",
        &[file, &target],
    );
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("ssh to node01 failed: no route to host"),
        "{err}"
    );
    // Several targets: each failure labelled, the highest status.
    let (code, err) = sender(&[file, &target, "node02:/no/such/dir"]);
    assert_eq!(code, 8, "{err}");
    assert!(err.contains("sender: error: node02: "), "{err}");
    assert!(err.contains("2 of 2 targets failed"), "{err}");
    // Started by hand, the remote side refuses to run without its token.
    let out = Command::new(receiver_bin())
        .args(["--ssh-session", dir.path().to_str().unwrap()])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not meant to be started by hand"));
}

/// A local file whose name looks like HOST:DIR is sent as a file, never
/// taken for an ssh target (no ssh is started: the direct form fails for
/// want of RDMA here, or of a receiver).
#[test]
fn a_local_file_named_like_a_target_is_a_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("run-12:00.log"), b"log").unwrap();
    let out = Command::new(sender_bin())
        .args(["--timeout", "2s", "127.0.0.1", "run-12:00.log"])
        .current_dir(dir.path())
        .env("RDMA_XFER_RSH", "false")
        .env_remove("RDMA_XFER_TOKEN")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("ssh") && !err.contains("run-12:"), "{err}");
    assert!(matches!(out.status.code(), Some(3 | 8)), "{err}");
}

/// A token of the tests below: long enough, and easy to find.
const ENV_TOKEN: &str = "env-token-that-must-vanish-0123";

/// Whether `bytes` (an environment, NUL-separated) still shows the token:
/// its variable's name or its value.
fn shows_the_token(bytes: &[u8]) -> bool {
    let has = |needle: &[u8]| bytes.windows(needle.len()).any(|w| w == needle);
    has(b"RDMA_XFER_TOKEN") || has(ENV_TOKEN.as_bytes())
}

/// The entries of an environment that show the token (only those: the
/// rest of the test's environment is nobody's business).
fn token_entries(bytes: &[u8]) -> Vec<String> {
    bytes
        .split(|&b| b == 0 || b == b'\n')
        .filter(|e| shows_the_token(e))
        .map(|e| String::from_utf8_lossy(e).into_owned())
        .collect()
}

/// The receiver takes RDMA_XFER_TOKEN out of its environment as it
/// starts: /proc/PID/environ (the block the kernel wrote at exec, which
/// unsetenv alone leaves as it was) no longer shows it, while the
/// receiver still runs (`--ssh-session` waits for its one-time token on
/// standard input, before anything needs RDMA).
#[test]
fn the_token_leaves_the_receivers_environment_at_start_up() {
    use std::time::{Duration, Instant};
    let dir = tempfile::tempdir().unwrap();
    let mut receiver = Command::new(receiver_bin())
        .args(["--ssh-session", "--dir"])
        .arg(dir.path())
        .env("RDMA_XFER_TOKEN", ENV_TOKEN)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let environ = format!("/proc/{}/environ", receiver.id());
    let until = Instant::now() + Duration::from_secs(10);
    // Only once the receiver runs (posix_spawn's child shows this test's
    // own environment until its exec).
    let cmdline = format!("/proc/{}/cmdline", receiver.id());
    let started = |b: &[u8]| b.windows(13).any(|w| w == b"--ssh-session");
    while !started(&std::fs::read(&cmdline).unwrap_or_default()) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut seen = std::fs::read(&environ).unwrap_or_default();
    while shows_the_token(&seen) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
        seen = std::fs::read(&environ).unwrap_or_default();
    }
    let running = receiver.try_wait().unwrap().is_none();
    let _ = receiver.kill();
    let _ = receiver.wait();
    assert!(running, "the receiver ended before it was looked at");
    assert!(
        !shows_the_token(&seen),
        "{environ} still shows the token: {:?}",
        token_entries(&seen)
    );
    assert!(
        seen.windows(5).any(|w| w == b"PATH="),
        "the rest of the environment stays"
    );
}

/// The sender takes RDMA_XFER_TOKEN out of its environment as it starts:
/// the remote shell it runs for HOST:DIR (a stand-in that records what it
/// can see, then fails as ssh does) inherits none, and finds none in its
/// parent's /proc/PID/environ.
#[test]
fn the_token_leaves_the_senders_environment_at_start_up() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f.bin");
    std::fs::write(&file, b"data").unwrap();
    let rsh = dir.path().join("recording-rsh");
    let parent_env = dir.path().join("parent.env");
    let own_env = dir.path().join("own.env");
    std::fs::write(
        &rsh,
        format!(
            "#!/bin/sh\ncat /proc/$PPID/environ > '{}'\nenv > '{}'\nexit 255\n",
            parent_env.display(),
            own_env.display()
        ),
    )
    .unwrap();
    let made = Command::new("chmod").arg("755").arg(&rsh).status().unwrap();
    assert!(made.success());
    let out = Command::new(sender_bin())
        .arg(&file)
        .arg(format!("node01:{}", dir.path().display()))
        .env("RDMA_XFER_RSH", &rsh)
        .env("RDMA_XFER_TOKEN", ENV_TOKEN)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ssh to node01 failed"), "{err}");
    let parent = std::fs::read(&parent_env).expect("the stand-in ran");
    assert!(!parent.is_empty(), "the sender's environment was read");
    assert!(
        !shows_the_token(&parent),
        "the sender's /proc/PID/environ: {:?}",
        token_entries(&parent)
    );
    let own = std::fs::read(&own_env).unwrap();
    assert!(
        !shows_the_token(&own),
        "inherited: {:?}",
        token_entries(&own)
    );
}

/// The receiver's binary started as an --exec command's trampoline
/// (argv[0] `rdma-xfer-exec`, see `sys::os::confined_command`) becomes the
/// command in place (the same process: its parent is the receiver's), and
/// refuses to start one for a parent that is gone.
#[test]
fn the_exec_trampoline_becomes_the_command_of_a_live_parent_only() {
    use std::os::unix::process::CommandExt;
    let me = std::process::id().to_string();
    let out = Command::new(receiver_bin())
        .arg0("rdma-xfer-exec")
        .args([me.as_str(), "/bin/sh", "-c", "echo \"$PPID\""])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), me);
    // Pid 1 did not start it: nothing runs.
    let out = Command::new(receiver_bin())
        .arg0("rdma-xfer-exec")
        .args(["1", "/bin/sh", "-c", "echo ran"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(127), "{err}");
    assert!(out.stdout.is_empty(), "the command ran");
    assert!(
        err.contains("the receiver that started it is gone"),
        "{err}"
    );
}

/// An --exec command started through the trampoline is killed when what
/// started it dies (its parent-death signal survives the exec): here a
/// shell stands in for the receiver, starts the trampoline in the
/// background, and is killed with SIGKILL.
#[test]
fn the_exec_trampolines_command_dies_with_its_parent() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    if !have("bash") {
        skip("no bash for `exec -a`", false);
        return;
    }
    let mut parent = Command::new("bash")
        .args([
            "-c",
            r#"exec -a rdma-xfer-exec "$0" "$$" /bin/sleep 120 & echo $!; wait"#,
            receiver_bin(),
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(parent.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let pid: u32 = line.trim().parse().unwrap();
    let state = |pid: u32| {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let comm_and_state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        Some((comm.trim().to_string(), comm_and_state))
    };
    // Until it became the command (its signal armed before that).
    let until = Instant::now() + Duration::from_secs(10);
    while state(pid).is_none_or(|(comm, _)| comm != "sleep") && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(state(pid).map(|s| s.0).as_deref(), Some("sleep"));
    parent.kill().unwrap();
    parent.wait().unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    let alive = |pid| state(pid).is_some_and(|(_, s)| s != 'Z' && s != 'X');
    while alive(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(20));
    }
    let still = alive(pid);
    if still {
        let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
    }
    assert!(!still, "the command outlived its parent");
}

#[test]
fn selection_problems_are_usage_errors_before_connecting() {
    let dir = tempfile::tempdir().expect("dir");
    let p = |name: &str| dir.path().join(name).to_str().expect("utf8").to_string();
    std::fs::create_dir_all(p("src/sub")).expect("mkdir");
    std::fs::write(p("src/sub/f"), b"f").expect("write");
    std::fs::write(p("list"), "# the list\nsub/f\n/etc/passwd\nsub/../../x\n").expect("write");
    // A bad pattern and a bad list line: all said at once, nothing sent.
    let (code, out, err) = run(
        sender_bin(),
        &[
            "--exclude",
            "[z-a",
            "--files-from",
            &p("list"),
            "127.0.0.1",
            &p("src"),
        ],
    );
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    for what in [
        "--exclude \"[z-a\"",
        ":3: \"/etc/passwd\" is absolute",
        ":4: \"sub/../../x\": `..`",
    ] {
        assert!(err.contains(what), "{what}: {err}");
    }
    // -R keeps the path as given: `..` in it cannot arrive anywhere.
    let up = format!("{}/../src/sub/f", p("src"));
    let (code, _, err) = run(sender_bin(), &["-R", "127.0.0.1", &up]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/./"), "the hint names the anchor: {err}");
}
