//! Unit tests of the one-command form's channel, targets and quoting.

use super::far_end::routable;
use super::*;

fn target(s: &str) -> Target {
    Target::parse(s).expect("a target").expect("valid")
}

#[test]
fn targets_as_scp_writes_them() {
    let t = target("node01:/ckpt/");
    assert_eq!(
        (t.login.as_str(), t.host.as_str(), t.dir.as_str()),
        ("node01", "node01", "/ckpt/")
    );
    let t = target("me@node01:in");
    assert_eq!(
        (t.login.as_str(), t.host.as_str(), t.dir.as_str()),
        ("me@node01", "node01", "in")
    );
    let t = target("node01:");
    assert_eq!(t.dir, "");
    let t = target("[fd00::1]:/d");
    assert_eq!((t.login.as_str(), t.dir.as_str()), ("fd00::1", "/d"));
    let t = target("me@[fd00::1]:~/x");
    assert_eq!((t.login.as_str(), t.dir.as_str()), ("me@fd00::1", "~/x"));
    let t = target("h:/a:b");
    assert_eq!(t.dir, "/a:b");
    // Not targets: local paths, the direct form's HOST:PORT, addresses.
    for not in [
        "file",
        "./a:b",
        "dir/x:y",
        "host:7471",
        "10.0.0.1:7471",
        "[fd00::1]:7471",
        "fd00::1",
        "fd00:1:2::3",
        "[fd00::1]",
    ] {
        assert!(Target::parse(not).is_none(), "{not}");
    }
    // Targets, but wrong.
    for bad in [
        ":/d",
        "-oProxyCommand=x:/d",
        "@h:/d",
        "-u@h:/d",
        "a b:/d",
        "h:/x\ny",
        "h`id`:/d",
        "h$(id):/d",
        "h;x:/d",
        "u@h@x:/d",
        "u%x@h:/d",
        // Another user's home is not expanded (quoted for the shell).
        "h:~bob",
        "h:~bob/d",
    ] {
        assert!(
            matches!(Target::parse(bad), Some(Err(XferError::Usage(_)))),
            "{bad}"
        );
    }
}

#[test]
fn remote_words_are_quoted_but_tilde_expands() {
    assert_eq!(remote_word("/data/in"), "/data/in");
    assert_eq!(remote_word("a b"), "'a b'");
    assert_eq!(remote_word("$(reboot)"), "'$(reboot)'");
    assert_eq!(remote_word("~"), "~");
    assert_eq!(remote_word("~/in dir"), "~/'in dir'");
    assert_eq!(remote_word("~root/x"), "'~root/x'");
    assert_eq!(remote_word("it's"), "\"it's\"");
}

#[test]
fn rsh_from_option_env_or_ssh() {
    assert_eq!(rsh_command(None, None).unwrap(), ["ssh"]);
    assert_eq!(rsh_command(None, Some(" ")).unwrap(), ["ssh"]);
    assert_eq!(
        rsh_command(Some("ssh -p 2222 -o 'ProxyJump gw'"), Some("rsh")).unwrap(),
        ["ssh", "-p", "2222", "-o", "ProxyJump gw"]
    );
    assert_eq!(rsh_command(None, Some("ssh -4")).unwrap(), ["ssh", "-4"]);
    for bad in ["", "ssh 'x"] {
        let err = rsh_command(Some(bad), None).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{bad}");
    }
}

#[test]
fn ready_lines_round_trip_and_nothing_else_is_one() {
    for a in ["10.0.0.1:40000", "[fd00::1]:7"] {
        for path_names_file in [false, true] {
            let ready = Ready {
                addr: a.parse().unwrap(),
                path_names_file,
            };
            assert_eq!(parse_ready_line(&ready_line(ready)), Some(ready));
        }
    }
    assert_eq!(
        parse_ready_line("rdma-xfer-ready 1 10.0.0.1:1"),
        Some(Ready {
            addr: "10.0.0.1:1".parse().unwrap(),
            path_names_file: false
        }),
        "the line of a receiver that was not asked about PATH"
    );
    for not in [
        "",
        "Welcome to node01",
        "rdma-xfer-ready 2 10.0.0.1:1",
        "rdma-xfer-ready 1 10.0.0.1",
        "rdma-xfer-ready 1 10.0.0.1:1 extra",
        "rdma-xfer-ready 1 10.0.0.1:1 file extra",
    ] {
        assert_eq!(parse_ready_line(not), None, "{not}");
    }
}

#[test]
fn one_time_tokens_are_fresh_hex() {
    let (a, hex_a) = one_time_token().unwrap();
    let (_, hex_b) = one_time_token().unwrap();
    assert_eq!(hex_a.len(), 64);
    assert!(hex_a.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_ne!(hex_a, hex_b);
    // The remote side reads exactly that token back.
    let read = read_token_line(&mut format!("{}\nmore", *hex_a).as_bytes()).unwrap();
    let nonce = [7u8; crate::proto::NONCE_LEN];
    assert_eq!(read.mac(&nonce), a.mac(&nonce));
}

#[test]
fn the_token_line_must_be_one() {
    let good = "ab".repeat(32);
    for bad in [
        String::new(),
        "\n".into(),
        good.clone(),
        format!("{}\n", &good[2..]),
        format!("{}zz\n", &good[2..]),
        format!("{good}0\n"),
        "x".repeat(5000),
    ] {
        let err = read_token_line(&mut bad.as_bytes()).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{bad:?}");
        assert!(err.to_string().contains("not meant to be started by hand"));
    }
}

#[test]
fn gids_as_addresses() {
    let gid = |text: &str| routable(text.parse().unwrap());
    assert_eq!(
        gid("0000:0000:0000:0000:0000:ffff:0a4d:0001"),
        Some("10.77.0.1".parse().unwrap())
    );
    assert_eq!(gid("fe80:0000:0000:0000:0000:00ff:fe00:0001"), None);
    assert_eq!(gid("0000:0000:0000:0000:0000:0000:0000:0000"), None);
    assert_eq!(
        gid("fd00:0000:0000:0000:0000:0000:0000:0001"),
        Some("fd00::1".parse().unwrap())
    );
}

#[test]
fn ssh_connection_comes_first() {
    let c = bind_candidates(Some("10.77.0.2 51000 10.77.0.1 22"));
    assert_eq!(c.first(), Some(&"10.77.0.1".parse().unwrap()));
    // No duplicates; garbage is ignored.
    let mut seen = c.clone();
    seen.dedup();
    assert_eq!(seen.len(), c.len());
    assert!(!bind_candidates(Some("garbage")).contains(&"0.0.0.0".parse().unwrap()));
}

#[test]
fn remote_errors_say_the_receivers_own_line() {
    let tail = vec![
        "receiver: warning: x".to_string(),
        "receiver: error: output directory /nope: No such file or directory".to_string(),
        "".to_string(),
    ];
    assert_eq!(
        last_error_line(&tail),
        Some("output directory /nope: No such file or directory")
    );
    let tail = vec!["ssh: connect to host x port 22: Connection refused".to_string()];
    assert_eq!(last_error_line(&tail), Some(tail[0].as_str()));
    // An older receiver's command line refuses a newer option: that line.
    let tail = vec![
        "error: unexpected argument '--ssh-relay' found".to_string(),
        "".to_string(),
        "For more information, try '--help'.".to_string(),
    ];
    assert_eq!(
        last_error_line(&tail),
        Some("unexpected argument '--ssh-relay' found")
    );
    assert_eq!(exit_code_from(8), ExitCode::NoDevice);
    for (said, class) in [
        (
            "ssh: Could not resolve hostname nodo01: Name or service not known",
            ExitCode::Usage,
        ),
        (
            "me@node01: Permission denied (publickey).",
            ExitCode::Rejected,
        ),
        ("Host key verification failed.", ExitCode::Rejected),
        (
            "ssh: connect to host x port 22: Connection refused",
            ExitCode::CannotConnect,
        ),
        (
            "ssh: connect to host x port 22: No route to host",
            ExitCode::CannotConnect,
        ),
    ] {
        assert_eq!(ssh_failure_class(said), class, "{said}");
    }
    assert_eq!(exit_code_from(99), ExitCode::Other);
}

#[test]
fn remote_output_is_read_in_bounded_lossy_lines() {
    let mut input = b"short\r\n".to_vec();
    input.extend(vec![b'x'; 3 * MAX_REMOTE_LINE]);
    input.extend(b"\n\xff\xfe bytes\nlast");
    let mut got = Vec::new();
    each_line(&input[..], |l| got.push(l));
    assert_eq!(got.len(), 4, "{got:?}");
    assert_eq!(got[0], "short");
    assert_eq!(got[1].len(), MAX_REMOTE_LINE);
    assert_eq!(got[2], "\u{fffd}\u{fffd} bytes");
    assert_eq!(got[3], "last");
}

#[test]
fn scp_paths_name_a_file_only_where_a_name_is_left() {
    for (path, name) in [
        ("/data/new.pt", Some("new.pt")),
        ("new.pt", Some("new.pt")),
        ("~/in/x", Some("x")),
        ("a//b", Some("b")),
        ("/data/", None),
        ("", None),
        ("~", None),
        ("/", None),
        ("d/.", None),
        ("d/..", None),
        ("d/bad\u{1}", None),
    ] {
        let t = Target {
            login: "h".into(),
            host: "h".into(),
            dir: path.into(),
        };
        assert_eq!(t.file_name(), name, "{path:?}");
    }
}

#[test]
fn the_far_end_decides_whether_path_is_a_directory() {
    use std::path::{Path, PathBuf};
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("dir");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(t.path().join("file"), b"x").unwrap();
    std::os::unix::fs::symlink(&dir, t.path().join("to-dir")).unwrap();
    std::os::unix::fs::symlink(t.path().join("file"), t.path().join("to-file")).unwrap();
    // A directory, or a link to one (as scp's): the file goes into it.
    assert_eq!(scp_path(&dir).unwrap(), None);
    assert_eq!(scp_path(&t.path().join("to-dir")).unwrap(), None);
    // Anything else names the file in its parent: missing, a file, a
    // link to a file (the receiver then refuses to follow it).
    for name in ["new.pt", "file", "to-file"] {
        assert_eq!(
            scp_path(&t.path().join(name)).unwrap(),
            Some(t.path().to_path_buf()),
            "{name}"
        );
    }
    assert_eq!(
        scp_path(Path::new("no-such-name-here")).unwrap(),
        Some(PathBuf::from("."))
    );
    assert_eq!(
        scp_path(Path::new("/no-such-name-here")).unwrap(),
        Some(PathBuf::from("/"))
    );
    // Missing, and no name left to give the file.
    for bad in ["/no/such/dir/.", "/no/such/dir/..", "/no/such/dir/"] {
        let err = scp_path(Path::new(bad)).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{bad}");
    }
    // No directory to put it in: PATH named, as the user wrote it.
    for bad in [t.path().join("no/such"), t.path().join("file/x")] {
        let err = scp_path(&bad).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{}", bad.display());
        assert!(err.to_string().contains(&*bad.to_string_lossy()), "{err}");
    }
}

/// A remote shell that answers as a receiver would: the ready line, with
/// `file` when asked with --ssh-path, then waits for its input to end.
fn fake_rsh() -> LaunchOptions {
    let script = "read -r token; case \"$2\" in *--ssh-path*) f=' file';; *) f='';; esac; \
                  echo \"rdma-xfer-ready 1 10.0.0.1:5$f\"; cat >/dev/null";
    LaunchOptions {
        rsh: vec!["sh".into(), "-c".into(), script.into(), "sh".into()],
        remote_receiver: "receiver".into(),
        receiver_args: Vec::new(),
        timeout: std::time::Duration::from_secs(20),
        path_may_name_file: true,
        relay: false,
    }
}

/// The sender hands a relay hop its keys and waits for its answer; the
/// remote asked with --ssh-relay, and a wrong count is an error.
#[test]
fn a_relay_hop_is_handed_its_keys_and_says_it_holds_them() {
    let quiet: std::sync::Arc<dyn Fn(&str) + Send + Sync> = std::sync::Arc::new(|_| {});
    // Counts the key lines; answers one short when told `short`.
    let script = "read -r token; case \"$2\" in *--ssh-relay*) ;; *) exit 9;; esac; \
                  echo 'rdma-xfer-ready 1 10.0.0.1:5'; n=0; \
                  while read -r w rest; do [ \"$w\" = relay-keys-end ] && break; n=$((n+1)); done; \
                  case \"$2\" in *short*) n=$((n-1));; esac; \
                  echo \"rdma-xfer-keys $n\"; cat >/dev/null";
    let opts = LaunchOptions {
        rsh: vec!["sh".into(), "-c".into(), script.into(), "sh".into()],
        relay: true,
        ..fake_rsh()
    };
    let (_, hex) = one_time_token().unwrap();
    let keys = [
        ("10.0.0.2:6".to_string(), hex.as_str()),
        ("10.0.0.3:7".into(), hex.as_str()),
    ];
    let mut r = launch(&target("h:/d"), &opts, "00", quiet.clone()).unwrap();
    r.hand_relay_keys(&keys).unwrap();
    drop(r);
    let opts = LaunchOptions {
        receiver_args: vec!["short".into()],
        ..opts
    };
    let mut r = launch(&target("h:/d"), &opts, "00", quiet).unwrap();
    let e = r.hand_relay_keys(&keys).unwrap_err();
    assert!(e.to_string().contains("holds 1 of the 2 tokens"), "{e}");
}

#[test]
fn the_sender_asks_about_path_only_for_one_file_and_a_name() {
    let quiet: std::sync::Arc<dyn Fn(&str) + Send + Sync> = std::sync::Arc::new(|_| {});
    let opts = fake_rsh();
    let r = launch(&target("h:/d/new.pt"), &opts, "00", quiet.clone()).unwrap();
    assert_eq!(r.addr, "10.0.0.1:5".parse().unwrap());
    assert_eq!(r.file_name.as_deref(), Some("new.pt"));
    drop(r);
    // A trailing `/`: a directory, not asked.
    let r = launch(&target("h:/d/"), &opts, "00", quiet.clone()).unwrap();
    assert_eq!(r.file_name, None);
    drop(r);
    // Several files (or a tree, or --name): not asked either.
    let opts = LaunchOptions {
        path_may_name_file: false,
        ..fake_rsh()
    };
    let r = launch(&target("h:/d/new.pt"), &opts, "00", quiet).unwrap();
    assert_eq!(r.file_name, None);
}

/// A relay hop reads the tokens of the hosts after it by name, bounded;
/// anything else on the channel is refused before it is used.
#[test]
fn relay_keys_are_read_by_name_and_nothing_else_is_one() {
    let (a, hex_a) = one_time_token().unwrap();
    let (b, hex_b) = one_time_token().unwrap();
    let text = format!(
        "{KEY_LINE} 10.0.0.2:7000 {}\n{KEY_LINE} [fe80::1]:9 {}\n{KEYS_END}\nrest",
        *hex_a, *hex_b
    );
    let mut input = text.as_bytes();
    let keys = read_relay_keys(&mut input).unwrap().unwrap();
    assert_eq!(input, b"rest", "the hang-up watch reads on after them");
    let names: Vec<&str> = keys.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["10.0.0.2:7000", "[fe80::1]:9"]);
    let nonce = [3u8; crate::proto::NONCE_LEN];
    assert_eq!(keys[0].1.mac(&nonce), a.mac(&nonce));
    assert_eq!(keys[1].1.mac(&nonce), b.mac(&nonce));
    // The ring hands each host its own, and none for a stranger.
    let ring = std::sync::Arc::new(crate::engine::relay::KeyRing::default());
    assert!(ring.set(keys));
    let keys = crate::engine::relay::HopKeys::PerHost(ring);
    assert_eq!(
        keys.key_for("[fe80::1]:9").unwrap().mac(&nonce),
        b.mac(&nonce)
    );
    let stranger = keys.key_for("10.0.0.9:7000").unwrap_err();
    assert_eq!(stranger.exit_code(), ExitCode::TimeoutOrPeerLost);
    assert_eq!(
        read_relay_keys(&mut format!("{KEYS_END}\n").as_bytes())
            .unwrap()
            .map(|k| k.len()),
        Some(0)
    );
    // A sender that gave up before the keys: no error, no keys.
    assert!(read_relay_keys(&mut "".as_bytes()).unwrap().is_none());
    let good = "ab".repeat(32);
    for bad in [
        "\n".to_string(),
        format!("{KEY_LINE} h {good}\n"),
        format!("{KEY_LINE} h {good}0\n{KEYS_END}\n"),
        format!("{KEY_LINE} h\n{KEYS_END}\n"),
        format!("{KEY_LINE} a\tb {good}\n{KEYS_END}\n"),
        format!("{KEY_LINE} h {good}\n{KEY_LINE} h {good}\n{KEYS_END}\n"),
        format!("key h {good}\n{KEYS_END}\n"),
        format!("{KEY_LINE} {} {good}\n{KEYS_END}\n", "h".repeat(2000)),
    ] {
        let err = read_relay_keys(&mut bad.as_bytes()).unwrap_err();
        assert_eq!(err.exit_code(), ExitCode::Usage, "{bad:?}");
    }
    assert_eq!(parse_keys_taken(&keys_taken_line(3)), Some(3));
    for not in [
        "rdma-xfer-keys",
        "rdma-xfer-keys x",
        "rdma-xfer-keys 1 2",
        "3",
    ] {
        assert_eq!(parse_keys_taken(not), None, "{not}");
    }
}
