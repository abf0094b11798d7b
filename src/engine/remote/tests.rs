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
        let addr: SocketAddr = a.parse().unwrap();
        assert_eq!(parse_ready_line(&ready_line(addr)), Some(addr));
    }
    for not in [
        "",
        "Welcome to node01",
        "rdma-xfer-ready 2 10.0.0.1:1",
        "rdma-xfer-ready 1 10.0.0.1",
        "rdma-xfer-ready 1 10.0.0.1:1 extra",
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
