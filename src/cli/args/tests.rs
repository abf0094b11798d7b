use super::config::*;
use super::*;
use crate::engine::fit::Given;
use crate::engine::receiver::{Output, ReceiverConfig};
use crate::engine::sender::{DEFAULT_STDIN_NAME, SenderConfig};
use crate::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, DEFAULT_SLOTS, entries};
use crate::error::XferError;
use clap::Parser;

#[test]
fn definitions_are_consistent() {
    for cmd in commands() {
        cmd.debug_assert();
    }
}

/// The command lines of a `--help`'s "Examples:" block, as argv (from
/// the command's name on: leading VAR=value assignments dropped; cut at
/// a pipe or redirection).
fn examples(cmd: &mut clap::Command) -> Vec<Vec<String>> {
    let name = cmd.get_name().to_string();
    let help = cmd.render_help().to_string();
    let block = help
        .split("Examples:\n")
        .nth(1)
        .and_then(|rest| rest.split("\n\n").next())
        .expect("an Examples: block");
    block
        .lines()
        .map(|line| {
            let start = line.find(&format!("{name} ")).unwrap_or(0);
            shell_words(&line[start..])
                .into_iter()
                .take_while(|w| !matches!(w.as_str(), "|" | ">"))
                .collect()
        })
        .collect()
}

/// Words as sh splits them, for the examples: whitespace apart, '...'
/// quoted (what the examples use).
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quoted, mut any) = (Vec::new(), String::new(), false, false);
    for c in line.chars() {
        match c {
            '\'' => (quoted, any) = (!quoted, true),
            c if c.is_whitespace() && !quoted => {
                if any {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            c => {
                word.push(c);
                any = true;
            }
        }
    }
    if any {
        words.push(word);
    }
    words
}

#[test]
fn help_examples_parse() {
    for mut cmd in commands() {
        let name = cmd.get_name().to_string();
        let examples = examples(&mut cmd);
        assert!(examples.len() >= 4, "{name}: {examples:?}");
        for argv in examples {
            assert_eq!(argv[0], name, "{argv:?}");
            if let Err(e) = cmd.clone().try_get_matches_from(&argv) {
                panic!("{argv:?} does not parse: {e}");
            }
        }
    }
}

#[test]
fn json_option_on_both() {
    let s = SenderArgs::try_parse_from(["sender", "--json", "h", "f"]).unwrap();
    assert!(s.common.json);
    assert_eq!(s.verify, None);
    let r = ReceiverArgs::try_parse_from(["receiver", "--once", "--json"]).unwrap();
    assert!(r.common.json && r.once);
}

#[test]
fn names_are_the_binaries() {
    let names: Vec<String> = commands()
        .iter()
        .map(|c| c.get_name().to_string())
        .collect();
    assert_eq!(names, ["sender", "receiver"]);
}
fn sender(args: &[&str]) -> Result<SenderConfig, XferError> {
    let argv = std::iter::once("sender").chain(args.iter().copied());
    super::try_parse_sender(argv.map(std::ffi::OsString::from))
        .expect("parses")
        .to_config()
}

fn receiver(args: &[&str]) -> Result<ReceiverConfig, XferError> {
    let argv = std::iter::once("receiver").chain(args.iter().copied());
    ReceiverArgs::try_parse_from(argv)
        .expect("parses")
        .to_config()
}

/// A usage error (or several) whose message contains `what`.
fn usage<T>(result: Result<T, XferError>, what: &str) {
    match result {
        Err(e @ (XferError::Usage(_) | XferError::Problems(_))) => {
            assert!(e.to_string().contains(what), "{e}")
        }
        Err(e) => panic!("expected a usage error about {what:?}, got {e:?}"),
        Ok(_) => panic!("expected a usage error about {what:?}, got a configuration"),
    }
}

fn plan(args: &[&str]) -> Result<SendPlan, XferError> {
    let argv = std::iter::once("sender").chain(args.iter().copied());
    super::try_parse_sender(argv.map(std::ffi::OsString::from))
        .expect("parses")
        .plan()
}

fn remote_plan(args: &[&str]) -> RemotePlan {
    match plan(args) {
        Ok(SendPlan::Remote(p)) => p,
        Ok(SendPlan::Direct { .. }) => panic!("{args:?}: the direct form"),
        Err(e) => panic!("{args:?}: {e}"),
    }
}

/// The last operands decide the form: `[USER@]HOST:DIR` targets make
/// it the one-command form, whose files come first.
#[test]
fn the_one_command_form_is_told_by_its_last_operands() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.bin");
    std::fs::write(&f, b"x").unwrap();
    let f = f.to_str().unwrap();
    let p = remote_plan(&[f, "node01:/ckpt/"]);
    assert_eq!(p.files, [PathBuf::from(f)]);
    assert_eq!(p.targets.len(), 1);
    assert_eq!(
        (p.targets[0].login.as_str(), p.targets[0].dir.as_str()),
        ("node01", "/ckpt/")
    );
    // A one-time token per target: SHA-256, no engine retries (each
    // attempt is a new receiver), and ssh by default.
    assert_eq!(p.cfg.verify, DigestAlg::Sha256);
    assert!(p.cfg.token.is_none() && p.cfg.retries == 0);
    assert_eq!(p.launch.rsh, ["ssh"]);
    assert_eq!(p.launch.remote_receiver, "receiver");
    let g = dir.path().join("g.bin");
    std::fs::write(&g, b"y").unwrap();
    let g = g.to_str().unwrap();
    let p = remote_plan(&[
        "--retry=2",
        "-e",
        "ssh -p 2222",
        "--remote-receiver",
        "/opt/r",
        "--remote-bind",
        "10.0.0.1",
        "--parallel",
        "3",
        "--overwrite",
        f,
        g,
        "a:/d",
        "me@b:",
        "[fd00::1]:/x",
    ]);
    assert_eq!(p.files.len(), 2);
    let logins: Vec<&str> = p.targets.iter().map(|t| t.login.as_str()).collect();
    assert_eq!(logins, ["a", "me@b", "fd00::1"]);
    assert_eq!((p.parallel, p.retries), (3, 2));
    assert!(p.cfg.resume, "--retry continues what a receiver kept");
    assert_eq!(p.launch.rsh, ["ssh", "-p", "2222"]);
    assert_eq!(
        p.launch.receiver_args,
        ["--allow-dotfiles", "--bind", "10.0.0.1", "--overwrite"]
    );
    // --hosts adds targets, one a line.
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "# nodes\nn1:/d\n\n  me@n2:/e  \n").unwrap();
    let p = remote_plan(&["--hosts", hosts.to_str().unwrap(), f]);
    let logins: Vec<&str> = p.targets.iter().map(|t| t.login.as_str()).collect();
    assert_eq!(logins, ["n1", "me@n2"]);
    // The direct form is untouched: ADDR first, HOST:PORT is an address.
    assert!(matches!(
        plan(&["10.0.0.1:7471", f]),
        Ok(SendPlan::Direct { .. })
    ));
    assert!(matches!(
        plan(&["127.0.0.1", f]),
        Ok(SendPlan::Direct { .. })
    ));
}

#[test]
fn the_one_command_form_refuses_what_cannot_work() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f.bin");
    std::fs::write(&f, b"x").unwrap();
    let f = f.to_str().unwrap();
    let token = token_file(dir.path(), b"sixteen-bytes-ok");
    for (args, says) in [
        (vec!["h:/d"], "no files to send"),
        (vec!["-", "a:/d", "b:/d"], "standard input (-) is read once"),
        (vec!["other:/x", f, "h:/d"], "the sender sends local files"),
        (
            vec!["--port", "9", f, "h:/d"],
            "--port is for a running receiver",
        ),
        (
            vec!["--token-file", &token, f, "h:/d"],
            "--token-file is for a running receiver",
        ),
        (vec!["--verify", "crc32", f, "h:/d"], "--verify crc32"),
        (vec!["-e", "ssh 'x", f, "h:/d"], "not a command"),
        (
            vec!["--", f, "-oProxyCommand=x:/d"],
            "may not start with '-'",
        ),
        (
            vec!["-e", "ssh", "127.0.0.1", f],
            "--rsh is for [USER@]HOST:DIR targets",
        ),
        (
            vec!["--remote-bind", "x", "127.0.0.1", f],
            "--remote-bind is for",
        ),
        (vec!["127.0.0.1"], "no files to send"),
    ] {
        usage(plan(&args), says);
    }
    let hosts = dir.path().join("hosts");
    std::fs::write(&hosts, "n1:/d\nnot-a-target\n").unwrap();
    usage(
        plan(&["--hosts", hosts.to_str().unwrap(), f]),
        "line 2: \"not-a-target\"",
    );
    std::fs::write(&hosts, "# none\n").unwrap();
    usage(
        plan(&["--hosts", hosts.to_str().unwrap(), f]),
        "lists no targets",
    );
    usage(
        plan(&["--hosts", "/no/such/list", f]),
        "--hosts /no/such/list",
    );
    // Over ssh RDMA_XFER_TOKEN does not apply: the one-time token does.
    let p = remote_plan(&[f, "h:/d"]);
    assert!(p.cfg.token.is_none());
}

fn token_file(dir: &std::path::Path, content: &[u8]) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join("token");
    std::fs::write(&p, content).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_str().unwrap().to_string()
}

/// CRC32 by default; SHA-256 with a token, which refuses CRC32 (a
/// sealed FIN must carry a digest that resists deliberate changes).
#[test]
fn the_digest_follows_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), b"a-secret-of-some-length\n");
    let t = ["--token-file", token.as_str()];
    let with = |extra: &[&str]| {
        let mut args: Vec<&str> = extra.to_vec();
        args.extend(["10.0.0.1", "f"]);
        sender(&args)
    };
    assert_eq!(with(&[]).unwrap().verify, DigestAlg::Crc32);
    assert_eq!(
        with(&["--verify", "sha256"]).unwrap().verify,
        DigestAlg::Sha256
    );
    assert_eq!(with(&t).unwrap().verify, DigestAlg::Sha256);
    let both = [t[0], t[1], "--verify", "sha256"];
    assert_eq!(with(&both).unwrap().verify, DigestAlg::Sha256);
    let crc = [t[0], t[1], "--verify", "crc32"];
    usage(with(&crc), "--verify crc32 with a token");
}

#[test]
fn sender_config_carries_every_option() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), b"a-secret-of-some-length\n");
    let cfg = sender(&[
        "--source",
        "127.0.0.2",
        "--port",
        "9000",
        "--verify",
        "sha256",
        "--depth",
        "4",
        "--chunk-size",
        "64K",
        "--busy-poll",
        "--timeout",
        "7",
        "--token-file",
        &token,
        "-r",
        "--follow-links",
        "--preserve-times",
        "--name",
        "dir/in.tar",
        "127.0.0.1",
        "-",
    ])
    .unwrap();
    assert_eq!(cfg.addr, "127.0.0.1:9000".parse().unwrap());
    assert_eq!(cfg.source, Some("127.0.0.2".parse().unwrap()));
    assert_eq!((cfg.chunk_size, cfg.depth), (64 << 10, 4));
    let both = Given {
        count: true,
        chunk_size: true,
    };
    assert_eq!(
        cfg.given, both,
        "given: kept even if the memlock limit is lower"
    );
    assert_eq!(cfg.verify, DigestAlg::Sha256);
    assert!(cfg.busy_poll);
    assert_eq!(cfg.timeout, Duration::from_secs(7));
    assert!(cfg.token.is_some());
    assert!(cfg.walk.recursive && cfg.walk.follow_links && cfg.walk.preserve);
    assert_eq!(cfg.walk.name.as_deref(), Some("dir/in.tar"));
    // Times always travel (a re-run finds them).
    assert!(!cfg.resume && cfg.retries == 0 && cfg.walk.times && !cfg.checksum);
    // --checksum: every regular file is offered with CHECKSUM (streams
    // never are), batches included.
    let cfg = sender(&["--checksum", "127.0.0.1", "a", "-"]).unwrap();
    assert!(cfg.checksum && !cfg.resume);
    // --resume carries times; --retry alone is 5 and implies --resume,
    // and takes a count after `=` or as the next argument (never the address).
    let cfg = sender(&["--resume", "127.0.0.1", "a"]).unwrap();
    assert!(cfg.resume && cfg.walk.times && cfg.retries == 0);
    let cfg = sender(&["--retry", "127.0.0.1", "a"]).unwrap();
    assert!(cfg.resume && cfg.retries == 5);
    assert_eq!(cfg.addr, "127.0.0.1:7471".parse().unwrap());
    let cfg = sender(&["--retry=2", "127.0.0.1", "a"]).unwrap();
    assert_eq!(cfg.retries, 2);
    // Defaults.
    let cfg = sender(&["::1", "-"]).unwrap();
    assert_eq!(cfg.addr, "[::1]:7471".parse().unwrap());
    assert_eq!(
        (cfg.chunk_size, cfg.depth),
        (crate::engine::DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH)
    );
    assert_eq!(cfg.given, Given::default(), "defaults: fitted to the limit");
    // One given, the other a default; the default's value given.
    let cfg = sender(&["--depth", "16", "::1", "-"]).unwrap();
    let depth = Given {
        count: true,
        chunk_size: false,
    };
    assert_eq!((cfg.depth, cfg.given), (16, depth));
    let cfg = sender(&["--chunk-size", "1M", "::1", "-"]).unwrap();
    let chunk = Given {
        count: false,
        chunk_size: true,
    };
    assert_eq!((cfg.chunk_size, cfg.given), (1 << 20, chunk));
    assert_eq!(cfg.walk.name, None);
    assert_eq!(cfg.walk.stdin_name(), DEFAULT_STDIN_NAME);
    assert!(!cfg.walk.recursive && cfg.source.is_none());
}

#[test]
fn sender_config_refuses_bad_options() {
    usage(sender(&["--chunk-size", "1K", "h", "f"]), "chunk size");
    usage(sender(&["--chunk-size", "65M", "h", "f"]), "chunk size");
    usage(sender(&["--depth", "0", "h", "f"]), "--depth");
    usage(sender(&["--depth", "1025", "h", "f"]), "--depth");
    usage(sender(&["--timeout", "604801", "h", "f"]), "--timeout");
    usage(sender(&["--port", "0", "h", "f"]), "--port");
    usage(sender(&["--name", "x", "-R", "h", "f"]), "not with -R");
    usage(
        sender(&["--name", "x", "--files-from", "list", "h", "d"]),
        "not with -R or --files-from",
    );
    for bad in [
        "",
        "/etc/passwd",
        "../up",
        "a/../b",
        "a//b",
        "dir/",
        ".",
        "x\u{1}y",
        "evil\u{202e}txt.exe",
        ".RDMA-XFER-1.part",
    ] {
        usage(sender(&["--name", bad, "h", "-"]), "invalid --name");
    }
    // A dotfile is the receiver's to refuse (--allow-dotfiles).
    assert!(sender(&["--name", ".config/app.toml", "127.0.0.1", "-"]).is_ok());
    usage(sender(&["", "f"]), "address is empty");
    let dir = tempfile::tempdir().unwrap();
    let empty = token_file(dir.path(), b"\n");
    usage(sender(&["--token-file", &empty, "h", "f"]), "is empty");
    let missing = dir.path().join("missing");
    let err = sender(&["--token-file", missing.to_str().unwrap(), "h", "f"]).unwrap_err();
    assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
    usage(sender(&["--follow-links", "h", "f"]), "needs -r");
    usage(
        sender(&["--checksum", "h", "-"]),
        "a stream cannot be hashed before it is sent",
    );
    // A name that does not resolve is a usage error, reported with the
    // inputs' problems.
    let err = sender(&["no.such.host.invalid", "/nonexistent/f"]).unwrap_err();
    assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("cannot resolve host name no.such.host.invalid"),
        "{msg}"
    );
    assert!(msg.contains("cannot open /nonexistent/f"), "{msg}");
}

#[test]
fn receiver_config_carries_every_option() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), b"sixteen-bytes-ok");
    let cfg = receiver(&[
        "--bind",
        "::1",
        "--port",
        "9001",
        "--dir",
        "/",
        "--once",
        "--overwrite",
        "--slots",
        "3",
        "--chunk-size",
        "8K",
        "--max-size",
        "1G",
        "--max-sessions",
        "2",
        "--busy-poll",
        "--timeout",
        "9",
        "--token-file",
        &token,
        "--allow",
        "10.0.0.0/24",
        "--allow",
        "[fe80::1]",
        "--max-files",
        "10",
        "--max-session-size",
        "2G",
    ])
    .unwrap();
    assert_eq!(cfg.bind, "[::1]:9001".parse().unwrap());
    let allowed: Vec<String> = cfg.allow.iter().map(ToString::to_string).collect();
    assert_eq!(allowed, ["10.0.0.0/24", "fe80::1/128"]);
    assert_eq!(cfg.dir, PathBuf::from("/"));
    assert!(cfg.once && cfg.output == Output::Dir && cfg.overwrite && cfg.busy_poll);
    assert_eq!((cfg.slots, cfg.chunk_size), (3, 8 << 10));
    let both = Given {
        count: true,
        chunk_size: true,
    };
    assert_eq!(cfg.given, both);
    assert_eq!((cfg.max_size, cfg.max_sessions), (1 << 30, 2));
    assert_eq!((cfg.max_files, cfg.max_session_bytes), (10, 2 << 30));
    assert_eq!(cfg.timeout, Duration::from_secs(9));
    assert!(cfg.token.is_some());
    let cfg = receiver(&["--insecure"]).unwrap();
    assert_eq!(cfg.bind, "0.0.0.0:7471".parse().unwrap());
    assert!(cfg.token.is_none() && !cfg.allow_dotfiles);
    assert!(
        receiver(&["--insecure", "--allow-dotfiles"])
            .unwrap()
            .allow_dotfiles
    );
    assert_eq!(
        (cfg.slots, cfg.chunk_size),
        (DEFAULT_SLOTS, crate::engine::DEFAULT_CHUNK_SIZE)
    );
    assert_eq!(cfg.given, Given::default());
    let cfg = receiver(&["--insecure", "--slots", "16"]).unwrap();
    let slots = Given {
        count: true,
        chunk_size: false,
    };
    assert_eq!((cfg.slots, cfg.given), (16, slots));
    assert_eq!(cfg.max_size, u64::MAX);
    assert_eq!(cfg.max_sessions, DEFAULT_MAX_SESSIONS);
    assert!(!cfg.once && cfg.output == Output::Dir && !cfg.overwrite);
    assert!(!cfg.keep_modes, "sender -p modes masked by default");
    assert!(
        receiver(&["--insecure", "--keep-modes"])
            .unwrap()
            .keep_modes
    );
    assert!(cfg.allow.is_empty(), "everyone by default");
    assert_eq!(
        (cfg.max_files, cfg.max_session_bytes),
        (1_000_000, u64::MAX)
    );
}

#[test]
fn receiver_config_refuses_bad_options() {
    usage(receiver(&["--chunk-size", "100"]), "chunk size");
    usage(receiver(&["--slots", "0"]), "--slots");
    usage(receiver(&["--slots", "5000"]), "--slots");
    usage(receiver(&["--timeout", "99999999"]), "--timeout");
    usage(receiver(&["--port", "0"]), "--port");
    for bad in ["10.0.0.0/33", "example.org", ""] {
        let err = ReceiverArgs::try_parse_from(["receiver", "--allow", bad]).unwrap_err();
        assert!(err.to_string().contains("--allow"), "{bad:?}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let err = receiver(&["--token-file", dir.path().to_str().unwrap()]).unwrap_err();
    assert!(err.to_string().contains("not a regular file"), "{err}");
    // Built directly (not through clap), the cross-option checks hold too.
    let mut args = ReceiverArgs::try_parse_from(["receiver"]).unwrap();
    args.max_sessions = 0;
    usage(args.to_config(), "--max-sessions");
    args.max_sessions = 1;
    args.common.timeout = Duration::ZERO;
    usage(args.to_config(), "--timeout");
}

/// Closed by default: no token is a usage error that says how to make
/// one and that --insecure exists; --insecure takes no option that lets
/// a sender run commands or touch existing files, and no token.
#[test]
fn a_receiver_needs_a_token_or_insecure() {
    if std::env::var_os(crate::cli::TOKEN_ENV).is_some() {
        return; // this test's own environment decides, not the caller's
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    let err = receiver(&[path]).unwrap_err();
    assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
    for says in [
        "needs a token",
        "rdma-xfer-gen token FILE",
        "receiver --token-file FILE",
        "sender --token-file FILE",
        "receiver --insecure",
    ] {
        assert!(err.to_string().contains(says), "{says:?} not in {err}");
    }
    let cfg = receiver(&["--insecure", path]).unwrap();
    assert!(cfg.token.is_none());
    let token = token_file(dir.path(), b"sixteen-bytes-ok");
    assert!(
        receiver(&["--token-file", &token, path])
            .unwrap()
            .token
            .is_some()
    );
    usage(
        receiver(&["--insecure", "--token-file", &token, path]),
        "--insecure accepts senders without a token, but a token is given",
    );
    for (args, says) in [
        (&["--exec", "cat"][..], "--exec would run its command"),
        (&["--link-dest", "/"], "--link-dest would link files"),
        (&["--overwrite"], "--overwrite would replace existing files"),
    ] {
        let mut argv = vec!["--insecure", path];
        argv.extend(args);
        usage(receiver(&argv), says);
        usage(receiver(&argv), "it needs a token, not --insecure");
        argv.remove(0);
        argv.extend(["--token-file", &token]);
        assert!(receiver(&argv).is_ok(), "{argv:?}");
    }
    // A token that fails to load is said as such, not as a missing one.
    let short = dir.path().join("short");
    std::fs::write(&short, "short").unwrap();
    let err = receiver(&["--token-file", short.to_str().unwrap(), path]).unwrap_err();
    assert!(!err.to_string().contains("needs a token"), "{err}");
}

#[test]
fn addresses_as_ssh_and_scp_users_write_them() {
    let ok = |a: &str, host: &str, port: Option<u16>| {
        assert_eq!(parse_addr(a).unwrap(), (host.to_string(), port), "{a}");
    };
    ok("10.0.0.1", "10.0.0.1", None);
    ok("10.0.0.1:7000", "10.0.0.1", Some(7000));
    ok("recv-host:9", "recv-host", Some(9));
    ok("recv-host", "recv-host", None);
    ok("fd00::1", "fd00::1", None);
    ok("[fd00::1]", "fd00::1", None);
    ok("[fd00::1]:7471", "fd00::1", Some(7471));
    ok(" host ", "host", None);
    for (bad, what) in [
        ("", "empty"),
        ("host:0", "between 1 and 65535"),
        ("host:65536", "between 1 and 65535"),
        ("[fd00::1", "closing `]`"),
        ("[fd00::1]x", "[IPV6]:PORT"),
        ("[fd00::1]:x", "between 1 and 65535"),
        ("host:/data/in", "sender FILE... host:/data/in"),
        ("host:", "sender FILE... host:DIR"),
        ("host:~/in", "targets come after the files"),
        ("host:in", "it cannot fetch from a host"),
        ("me@host", "address alone (sender host FILE...)"),
        ("me@host", "sender FILE... me@host:DIR"),
    ] {
        usage(parse_addr(bad), what);
    }
    // Through the whole configuration: HOST:PORT sets the port, and
    // --port must agree with it.
    let cfg = sender(&["127.0.0.1:9000", "-"]).unwrap();
    assert_eq!(cfg.addr, "127.0.0.1:9000".parse().unwrap());
    let cfg = sender(&["[::1]:9001", "-"]).unwrap();
    assert_eq!(cfg.addr, "[::1]:9001".parse().unwrap());
    let cfg = sender(&["--port", "9000", "127.0.0.1:9000", "-"]).unwrap();
    assert_eq!(cfg.addr.port(), 9000);
    usage(
        sender(&["--port", "9001", "127.0.0.1:9000", "-"]),
        "disagree",
    );
    let err = sender(&["host:/data", "-"]).unwrap_err();
    assert_eq!(err.exit_code(), crate::ExitCode::Usage);
    // `--retry 3 HOST FILE` as written: 3 is the count; after `--`, a file.
    let cfg = sender(&["--retry", "3", "127.0.0.1", "-"]).unwrap();
    assert_eq!((cfg.retries, cfg.addr.port()), (3, 7471));
    usage(
        sender(&["--retry=2", "3", "h", "-"]),
        "a number, not the receiver's address",
    );
    let err = sender(&["--", "--retry", "3", "-"]).unwrap_err();
    assert_eq!(err.exit_code(), crate::ExitCode::Usage);
    usage(
        sender(&["7471", "-"]),
        "a number, not the receiver's address",
    );
}

/// Everything wrong before connecting is reported in one run, with
/// exit 2: options, token, and the input files.
#[test]
fn every_problem_is_reported_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let d = |name: &str| dir.path().join(name).to_str().unwrap().to_string();
    std::fs::write(d("a"), b"a").unwrap();
    std::fs::create_dir(d("sub")).unwrap();
    std::fs::write(d("sub/a"), b"a").unwrap();
    std::fs::create_dir(d("tree")).unwrap();
    let short = token_file(dir.path(), b"short");
    let err = sender(&[
        "--depth",
        "0",
        "--token-file",
        &short,
        "--name",
        "../x",
        "h",
        &d("missing"),
        &d("tree"),
        &d("a"),
        &d("sub/a"),
    ])
    .unwrap_err();
    assert_eq!(err.exit_code(), crate::ExitCode::Usage, "{err}");
    let XferError::Problems(all) = &err else {
        panic!("expected every problem, got {err:?}");
    };
    for what in [
        "--depth",
        "at least 16 bytes",
        "invalid --name",
        "4 sources given",
        "cannot open",
        "is a directory (use -r",
        "would both arrive as a",
    ] {
        assert!(
            all.iter().any(|p| p.contains(what)),
            "{what:?} not in {all:#?}"
        );
    }
    // Only input problems: the engine's planning reports them all too.
    let walk = entries::WalkOptions::default();
    let files = [d("missing"), d("missing2"), d("a"), d("a")].map(PathBuf::from);
    match entries::check_arguments(&files, &walk).unwrap_err() {
        XferError::Problems(all) => {
            assert_eq!(all.len(), 3, "{all:#?}");
            assert!(all[2].ends_with("is named twice"), "{all:#?}");
        }
        other => panic!("{other:?}"),
    }
    // `sender FILE HOST`: a hint that the address comes first.
    usage(
        sender(&[&d("a"), "recv-host"]),
        "the receiver's address comes first",
    );
    // Receiver: a missing directory, a bad port and a short token at once.
    let err = receiver(&[
        "--port",
        "0",
        "--token-file",
        &short,
        "--dir",
        &d("missing"),
    ])
    .unwrap_err();
    let XferError::Problems(all) = &err else {
        panic!("expected every problem, got {err:?}");
    };
    assert_eq!(all.len(), 3, "{all:#?}");
    assert!(
        all.iter().any(|p| p.contains("output directory")),
        "{all:#?}"
    );
    usage(receiver(&[&d("a")]), "is not a directory");
    usage(receiver(&["10.0.0.1"]), "--bind ADDR");
}

#[test]
fn receiver_directory_stdout_and_bind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_str().unwrap();
    // DIR works as --dir; both at once is refused by clap.
    assert_eq!(receiver(&["--insecure", path]).unwrap().dir, dir.path());
    assert_eq!(
        receiver(&["--insecure", "--dir", path]).unwrap().dir,
        dir.path()
    );
    assert!(ReceiverArgs::try_parse_from(["receiver", path, "--dir", path]).is_err());
    // --stdout implies --once, takes no directory or --overwrite, and
    // refuses a terminal. (With a token: --exec, --link-dest and
    // --overwrite need one.)
    let token = token_file(dir.path(), b"sixteen-bytes-ok");
    let parse = |args: &[&str]| {
        let argv = ["receiver", "--token-file", &token]
            .into_iter()
            .chain(args.iter().copied());
        ReceiverArgs::try_parse_from(argv).expect("parses")
    };
    let cfg = parse(&["--stdout"]).to_config_with(false).unwrap();
    assert!(cfg.output == Output::Stdout && cfg.once);
    usage(parse(&["--stdout"]).to_config_with(true), "terminal");
    usage(
        parse(&["--stdout", "--dir", path]).to_config_with(false),
        "a directory does not apply",
    );
    usage(
        parse(&["--stdout", path]).to_config_with(false),
        "a directory does not apply",
    );
    usage(
        parse(&["--stdout", "--overwrite"]).to_config_with(false),
        "--overwrite does not apply",
    );
    // --discard: no directory needed (one given is not used), and
    // nothing that writes files goes with it.
    let cfg = parse(&["--discard", "--dir", "/no/such/dir"])
        .to_config_with(true)
        .unwrap();
    assert!(cfg.output == Output::Discard && !cfg.once);
    // --exec runs its command in the directory: it must exist.
    let cfg = parse(&["--exec", "wc -c", path])
        .to_config_with(true)
        .unwrap();
    assert_eq!(cfg.output, Output::Exec("wc -c".into()));
    usage(
        parse(&["--exec", "wc -c", "/no/such/dir"]).to_config_with(false),
        "output directory",
    );
    for (args, says) in [
        (&["--discard", "--stdout"][..], "give one of them"),
        (&["--discard", "--overwrite"], "--overwrite does not apply"),
        (&["--discard", "--threads", "2"], "--threads"),
        (&["--stdout", "--threads", "2"], "--threads"),
        (&["--exec", "cat", "--discard"], "give one of them"),
        (&["--exec", "cat", "--stdout"], "give one of them"),
        (
            &["--exec", "cat", "--overwrite"],
            "--overwrite does not apply",
        ),
        (&["--exec", " "], "needs a command"),
        (&["--exec", "cat", "--threads", "1"], "--threads"),
        (
            &["--link-dest", path, "--discard"],
            "does not apply to --discard",
        ),
        (
            &["--link-dest", path, "--exec", "cat"],
            "does not apply to --exec",
        ),
        (
            &["--link-dest", path, "--stdout"],
            "does not apply to --stdout",
        ),
        (&["--link-dest", "/no/such/dir"], "--link-dest /no/such/dir"),
        (
            &["--link-dest", path, "--dir", path],
            "the output directory itself",
        ),
    ] {
        usage(parse(args).to_config_with(false), says);
    }
    // --bind takes a host name as the sender's ADDR does.
    let cfg = receiver(&["--insecure", "--bind", "localhost", "--port", "9"]).unwrap();
    assert!(
        cfg.bind.ip().is_loopback() && cfg.bind.port() == 9,
        "{}",
        cfg.bind
    );
    usage(receiver(&["--bind", "no.such.host.invalid"]), "--bind");
}

#[test]
fn help_groups_options_and_shows_human_defaults() {
    // The defaults as the help texts give them.
    assert_eq!(
        crate::units::parse_size("1M").unwrap(),
        u64::from(DEFAULT_CHUNK_SIZE)
    );
    assert_eq!((DEFAULT_SLOTS, DEFAULT_DEPTH), (16, 16));
    for mut cmd in commands() {
        let help = cmd.render_long_help().to_string();
        for heading in [CONNECTION, OUTPUT, SECURITY, PERFORMANCE, FORMAT] {
            assert!(help.contains(&format!("{heading}:")), "{heading}:\n{help}");
        }
        assert!(help.contains("[default: 1M]"), "{help}");
        assert!(help.contains("[default: 16]"), "{help}");
        assert!(help.contains("memlock limit"), "{help}");
        assert!(!help.contains("1048576"), "{help}");
        for var in [
            "RDMA_XFER_TOKEN",
            "RDMA_XFER_ACK_TIMEOUT",
            "RUST_LOG",
            "NO_COLOR",
        ] {
            assert!(help.contains(var), "{var}:\n{help}");
        }
        assert!(help.contains("8  no usable RDMA device"), "{help}");
    }
}

#[test]
fn exclude_and_include_keep_their_command_line_order() {
    use crate::engine::filter::Rule;
    let argv = [
        "sender",
        "--exclude",
        "a",
        "--include=b",
        "--exclude",
        "c/",
        "--include",
        "/d",
        "h",
        "f",
    ];
    let args = super::try_parse_sender(argv.map(std::ffi::OsString::from)).unwrap();
    assert_eq!(
        args.filter,
        [
            Rule::exclude("a"),
            Rule::include("b"),
            Rule::exclude("c/"),
            Rule::include("/d"),
        ]
    );
    // The order reaches the filter: the include before the exclusion wins.
    let cfg = sender(&[
        "--include",
        "keep.tmp",
        "--exclude",
        "*.tmp",
        "127.0.0.1",
        "-",
    ])
    .unwrap();
    assert!(cfg.walk.filter.admits("t/keep.tmp", false));
    assert!(!cfg.walk.filter.admits("t/x.tmp", false));
    assert!(!cfg.walk.relative && !cfg.walk.listed);
    let cfg = sender(&["-R", "127.0.0.1", "-"]).unwrap();
    assert!(cfg.walk.relative && !cfg.walk.listed);
    // A bad pattern is a usage error, with the others.
    usage(
        sender(&["--exclude", "[z-a", "--port", "0", "127.0.0.1", "-"]),
        "--exclude \"[z-a\"",
    );
    // Parsed without try_parse_sender, the order is lost: said, not guessed.
    let args = SenderArgs::try_parse_from(["sender", "--exclude", "x", "h", "-"]).unwrap();
    usage(args.plan(), "without their order");
}

#[test]
fn files_from_lists_paths_below_one_directory() {
    let t = tempfile::tempdir().unwrap();
    let src = t.path().join("src");
    std::fs::create_dir_all(src.join("a/b")).unwrap();
    std::fs::write(src.join("a/b/c.txt"), b"c").unwrap();
    std::fs::write(src.join("top.txt"), b"t").unwrap();
    let list = t.path().join("list");
    std::fs::write(&list, "# a comment\n\n  \na/b/c.txt\n./top.txt\r\na//b/\n").unwrap();
    let l = list.to_str().unwrap();
    let s = src.to_str().unwrap();
    let SendPlan::Direct { cfg, files } = plan(&["--files-from", l, "127.0.0.1", s]).unwrap()
    else {
        panic!("the direct form")
    };
    assert!(cfg.walk.relative && cfg.walk.listed && !cfg.walk.recursive);
    assert_eq!(
        files,
        [
            src.join("./a/b/c.txt"),
            src.join("./top.txt"),
            src.join("./a/b")
        ]
    );
    let p = entries::plan(&files, &cfg.walk).unwrap();
    let names: Vec<&str> = p.entries.iter().map(|e| e.name()).collect();
    assert_eq!(names, ["a", "a/b", "a/b/c.txt", "top.txt"]);
    // The one-command form: the same list, the source before the target.
    let p = remote_plan(&["--files-from", l, s, "node01:/in"]);
    assert_eq!(p.files.len(), 3);
    assert!(p.cfg.walk.listed);
    // Absolute paths, `..`, the directory itself: each said with its line.
    std::fs::write(&list, "top.txt\n/etc/passwd\na/../../x\n./\n").unwrap();
    let Err(err) = plan(&["--files-from", l, "127.0.0.1", s]) else {
        panic!("a bad list accepted")
    };
    let XferError::Problems(all) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(all.len(), 3, "{all:#?}");
    assert!(
        all[0].contains(":2: \"/etc/passwd\" is absolute"),
        "{all:#?}"
    );
    assert!(
        all[1].contains(":3:") && all[1].contains("`..`"),
        "{all:#?}"
    );
    assert!(
        all[2].contains(":4:") && all[2].contains("itself"),
        "{all:#?}"
    );
    assert_eq!(err.exit_code() as u8, 2);
    // One source directory, a list that exists and names something.
    usage(
        plan(&["--files-from", l, "127.0.0.1", s, s]),
        "below one source directory",
    );
    usage(
        plan(&["--files-from", l, "127.0.0.1", &format!("{s}/top.txt")]),
        "below one source directory",
    );
    usage(
        plan(&["--files-from", "/no/such/list", "127.0.0.1", s]),
        "cannot read --files-from",
    );
    std::fs::write(&list, "# nothing\n").unwrap();
    usage(
        plan(&["--files-from", l, "127.0.0.1", s]),
        "no paths listed",
    );
    usage(
        plan(&["--files-from", "-", "127.0.0.1", "-"]),
        "cannot be sent too",
    );
}

#[test]
fn rules_for_existing_files_are_rsyncs_and_overwrite_is_the_receivers() {
    use crate::proto::WhenExisting;
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let f = f.to_str().unwrap();
    let rule = |flag: &str| sender(&[flag, "127.0.0.1", f]).unwrap().existing;
    assert_eq!(
        sender(&["127.0.0.1", f]).unwrap().existing,
        WhenExisting::QuickCheck
    );
    assert_eq!(rule("-I"), WhenExisting::IgnoreTimes);
    assert_eq!(rule("--ignore-times"), WhenExisting::IgnoreTimes);
    assert_eq!(rule("--ignore-existing"), WhenExisting::IgnoreExisting);
    assert_eq!(rule("-u"), WhenExisting::Update);
    assert_eq!(rule("--update"), WhenExisting::Update);
    // One rule at a time.
    for pair in [
        ["-I", "--update"],
        ["-I", "--ignore-existing"],
        ["--update", "--ignore-existing"],
    ] {
        let argv = ["sender", pair[0], pair[1], "127.0.0.1", f];
        let parsed = super::try_parse_sender(argv.map(std::ffi::OsString::from));
        assert!(parsed.is_err(), "{pair:?}");
    }
    // -c is --checksum, as rsync's.
    assert!(sender(&["-c", "127.0.0.1", f]).unwrap().checksum);
    // A dry run's receiver over ssh removes nothing, not even old
    // partial files.
    let p = remote_plan(&["-n", f, "h:/d"]);
    assert!(p.cfg.dry_run);
    assert!(p.launch.receiver_args.iter().any(|a| a == "--no-sweep"));
    assert!(
        !remote_plan(&[f, "h:/d"])
            .launch
            .receiver_args
            .iter()
            .any(|a| a == "--no-sweep")
    );
    // A running receiver decides about replacing for itself.
    let e = sender(&["--overwrite", "127.0.0.1", f]).err().unwrap();
    assert!(e.to_string().contains("receiver --overwrite"), "{e}");
}

/// `--name` gives the one regular file (or standard input) its path on
/// the receiver, its directories offered first; not for several
/// sources or a tree.
#[test]
fn name_gives_the_one_file_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    std::fs::write(d("f.pt"), b"f").unwrap();
    std::fs::write(d("g.pt"), b"g").unwrap();
    std::fs::create_dir(d("tree")).unwrap();
    let cfg = sender(&["--name", "a/b/new.pt", "127.0.0.1", &d("f.pt")]).unwrap();
    let p = entries::plan(&[PathBuf::from(d("f.pt"))], &cfg.walk).unwrap();
    let got: Vec<(&str, bool)> = p
        .entries
        .iter()
        .map(|e| (e.name(), matches!(e, entries::Entry::Dir { .. })))
        .collect();
    assert_eq!(got, [("a", true), ("a/b", true), ("a/b/new.pt", false)]);
    // Several sources, a tree: usage errors (exit 2) before connecting.
    let cfg = sender(&["--name", "x", "127.0.0.1", &d("f.pt"), &d("g.pt")]).unwrap();
    let files = [PathBuf::from(d("f.pt")), PathBuf::from(d("g.pt"))];
    usage(entries::plan(&files, &cfg.walk), "2 sources given");
    let cfg = sender(&["-r", "--name", "x", "127.0.0.1", &d("tree")]).unwrap();
    usage(
        entries::plan(&[PathBuf::from(d("tree"))], &cfg.walk),
        "is a directory: --name names one regular file",
    );
    // The one-command form checks the inputs at once.
    usage(
        plan(&["--name", "x", &d("f.pt"), &d("g.pt"), "h:/d/"]),
        "2 sources given",
    );
    usage(
        plan(&["-r", "--name", "x", &d("tree"), "h:/d/"]),
        "is a directory",
    );
}

/// scp's `HOST:PATH`: with one regular file (or standard input) and no
/// --name, the remote is asked whether PATH names the file.
#[test]
fn a_target_path_may_name_the_one_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = |n: &str| dir.path().join(n).to_str().unwrap().to_string();
    std::fs::write(d("f.pt"), b"f").unwrap();
    std::fs::write(d("g.pt"), b"g").unwrap();
    std::fs::create_dir(d("tree")).unwrap();
    assert!(
        remote_plan(&[&d("f.pt"), "h:/d/new.pt"])
            .launch
            .path_may_name_file
    );
    assert!(
        remote_plan(&["-", "h:/d/new.tar"])
            .launch
            .path_may_name_file
    );
    for not in [
        &[&d("f.pt"), &d("g.pt"), "h:/d"][..],
        &["-r", &d("tree"), "h:/d"],
        &["--name", "n.pt", &d("f.pt"), "h:/d"],
        &["-R", &d("f.pt"), "h:/d"],
    ] {
        assert!(!remote_plan(not).launch.path_may_name_file, "{not:?}");
    }
}

/// `--relay`: every operand is a file, the chain's first host the
/// receiver; a token, each host once, and what a chain does not do yet
/// refused. A receiver relays only with --allow-relay and a token.
#[test]
fn relay_chains_take_files_a_token_and_each_host_once() {
    let dir = tempfile::tempdir().unwrap();
    let token = token_file(dir.path(), b"a-secret-of-some-length\n");
    let t = ["--token-file", token.as_str()];
    let relay = |extra: &[&str]| {
        let mut args = vec![t[0], t[1]];
        args.extend_from_slice(extra);
        sender(&args)
    };
    let chain = "10.0.0.1,10.0.0.2:9,[fe80::1]:7";
    let cfg = relay(&["--relay", chain, "f", "g"]).unwrap();
    assert_eq!(cfg.relay, ["10.0.0.1", "10.0.0.2:9", "[fe80::1]:7"]);
    assert_eq!(cfg.addr, "10.0.0.1:7471".parse().unwrap());
    let argv = ["sender", t[0], t[1], "--relay", chain, "f", "g"];
    match plan(&argv[1..]) {
        Ok(SendPlan::Direct { files, .. }) => {
            assert_eq!(files, [PathBuf::from("f"), PathBuf::from("g")])
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    usage(
        sender(&["--relay", "10.0.0.1", "f"]),
        "--relay needs a token",
    );
    usage(
        relay(&["--relay", "10.0.0.1,10.0.0.2,10.0.0.1", "f"]),
        "twice",
    );
    usage(
        relay(&["--relay", "10.0.0.1", "--checksum", "f"]),
        "cannot be used with --relay",
    );
    // A chain resumes: each host keeps what it verified.
    let cfg = relay(&["--relay", "10.0.0.1,10.0.0.2", "--retry", "f"]).unwrap();
    assert!(cfg.resume && cfg.retries == 5 && cfg.relay.len() == 2);
    usage(
        relay(&["--relay", "10.0.0.1", "-n", "f"]),
        "--dry-run cannot be used",
    );
    usage(
        relay(&["--relay", "10.0.0.1", "--port", "9", "f"]),
        "--port with --relay",
    );
    usage(relay(&["--relay", "a b", "f"]), "--relay");
    // The receiver: off by default, with a token only.
    assert!(!receiver(&[t[0], t[1]]).unwrap().relay);
    let r = receiver(&[t[0], t[1], "--allow-relay", "--relay-source", "127.0.0.1"]).unwrap();
    assert!(r.relay);
    assert_eq!(r.relay_source, Some("127.0.0.1".parse().unwrap()));
    usage(
        receiver(&["--insecure", "--allow-relay"]),
        "--allow-relay needs a token",
    );
    usage(
        receiver(&[t[0], t[1], "--relay-source", "127.0.0.1"]),
        "it needs --allow-relay",
    );
}

/// Several targets form a relay chain, unless --no-relay or an option a
/// chain does not do (then direct copies, with the reason); a relay
/// hop's receiver serves sessions until its sender hangs up.
#[test]
fn several_targets_form_a_chain_unless_told_or_unable() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("f");
    std::fs::write(&f, b"x").unwrap();
    let f = f.to_str().unwrap();
    assert_eq!(remote_plan(&[f, "a:/d"]).chain, Chain::Direct);
    assert_eq!(remote_plan(&[f, "a:/d", "b:/d"]).chain, Chain::Relay);
    assert_eq!(
        remote_plan(&["--no-relay", f, "a:/d", "b:/d"]).chain,
        Chain::Direct
    );
    // A chain resumes at each host.
    for extra in ["--resume", "--retry"] {
        assert_eq!(remote_plan(&[extra, f, "a:/d", "b:/d"]).chain, Chain::Relay);
    }
    for extra in ["--checksum", "--dry-run"] {
        match remote_plan(&[extra, f, "a:/d", "b:/d"]).chain {
            Chain::DirectFor(why) => assert!(why.contains("--no-relay"), "{why}"),
            other => panic!("{extra}: {other:?}"),
        }
    }
    let out = dir.path().to_str().unwrap();
    let hop = receiver(&["--ssh-session", "--ssh-relay", out]).unwrap();
    assert!(hop.relay && !hop.once && hop.wait.is_none());
    assert!(hop.relay_keys.is_some());
    let plain = receiver(&["--ssh-session", out]).unwrap();
    assert!(!plain.relay && plain.once && plain.relay_keys.is_none());
}
