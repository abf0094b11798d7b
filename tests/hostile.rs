//! Hostile input on real RDMA (run in the SoftRoCE guest by `make test`):
//! the test-only `rxfer-raw-client` (built by `make build` with
//! `--features fault-injection`) connects to a serving receiver and sends
//! hostile file names and malformed or out-of-order control messages. Each
//! case asserts the receiver's answer (code and reason), that nothing was
//! written in, beside or above the output directory, and that the same
//! receiver process keeps serving: a normal transfer by the real `sender`
//! arrives intact afterwards (SHA-256 checked). One receiver serves all
//! cases of a test in a row (three receivers in all; ~20 s in the guest).

mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use support::*;
use tempfile::TempDir;

const CLIENT_TIMEOUT: Duration = Duration::from_secs(120);

/// A serving receiver (no --once) whose output directory `out` is a
/// subdirectory of `tmp`, so that anything written beside or above it shows.
struct Served {
    tmp: TempDir,
    out: PathBuf,
    src: TempDir,
    port: u16,
    receiver: Running,
    passwd: Option<(u64, SystemTime)>,
}

fn passwd_stamp() -> Option<(u64, SystemTime)> {
    let m = std::fs::metadata("/etc/passwd").ok()?;
    Some((m.len(), m.modified().ok()?))
}

fn serve(net: &Net) -> Served {
    serve_with_token(net, None)
}

/// With `token`, the receiver requires it (RDMA_XFER_TOKEN).
fn serve_with_token(net: &Net, token: Option<&str>) -> Served {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).expect("mkdir out");
    let port = next_port();
    let env: Vec<(&str, &str)> = token.map(|t| ("RDMA_XFER_TOKEN", t)).into_iter().collect();
    let receiver = start_receiver_env(net, port, &out, &["--timeout", "10"], &env);
    Served {
        tmp,
        out,
        src: tempfile::tempdir().expect("src dir"),
        port,
        receiver,
        passwd: passwd_stamp(),
    }
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

impl Served {
    /// Nothing in the output directory (no temporary file either), nothing
    /// beside it, /etc/passwd untouched, and the receiver still running.
    fn assert_nothing_written(&mut self, case: &str) {
        assert_no_temp_files(&self.out);
        assert_eq!(
            names_in(&self.out),
            Vec::<String>::new(),
            "{case}: files in the output directory"
        );
        assert_eq!(
            names_in(self.tmp.path()),
            vec!["out".to_string()],
            "{case}: files beside the output directory"
        );
        assert_eq!(passwd_stamp(), self.passwd, "{case}: /etc/passwd changed");
        assert!(
            self.receiver.is_running(),
            "{case}: the receiver died:\n{}",
            self.receiver.stderr_so_far()
        );
    }

    /// The same receiver serves a normal transfer by the real sender.
    fn assert_still_serves(&mut self, net: &Net) {
        self.assert_still_serves_with(net, None)
    }

    /// As `assert_still_serves`, the sender using `token`.
    fn assert_still_serves_with(&mut self, net: &Net, token: Option<&str>) {
        let input = self.src.path().join("after.bin");
        let sum = make_file(&input, 3 * CHUNK + 17, 0xa11ce);
        let mut cmd = sender_cmd(net, self.port, Path_::Wire, &[input], &[]);
        cmd.env_remove("RDMA_XFER_TOKEN");
        if let Some(t) = token {
            cmd.env("RDMA_XFER_TOKEN", t);
        }
        let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(300));
        assert_eq!(
            sent.code(),
            0,
            "normal transfer after the hostile input failed:\n{}\nreceiver:\n{}",
            sent.stderr,
            self.receiver.stderr_so_far()
        );
        assert_eq!(sha256_file(&self.out.join("after.bin")), sum);
        assert_eq!(names_in(&self.out), vec!["after.bin".to_string()]);
        assert_eq!(names_in(self.tmp.path()), vec!["out".to_string()]);
        let log = self.receiver.stderr_so_far();
        assert!(!log.contains("panicked"), "receiver panicked:\n{log}");
    }
}

#[test]
fn hostile_names_are_refused_and_nothing_is_written() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve(&net);
    // One session: a HELLO per name (see `hostile_names` in the raw
    // client), each answered by REJECT bad-name, then BYE.
    let run = run_raw_client(&net, s.port, Some("bad-names"), &[], CLIENT_TIMEOUT);
    assert_eq!(
        run.code(),
        0,
        "raw client:\n{}\n{}\nreceiver:\n{}",
        run.lines.join("\n"),
        run.stderr,
        s.receiver.stderr_so_far()
    );
    let why = [
        ("../x", "path separator"),
        ("/etc/passwd", "path separator"),
        ("a/b", "path separator"),
        ("..", "may not be"),
        (".", "may not be"),
        ("(empty)", "is empty"),
        ("300 bytes", "300 bytes long"),
        ("NUL", "NUL byte"),
        ("newline", "U+000A"),
        ("tab", "U+0009"),
        ("escape", "U+001B"),
        ("DEL", "U+007F"),
        ("C1 control", "U+0085"),
        ("backslash", "path separator"),
    ];
    let rejects = run.of_kind("REJECT");
    assert_eq!(
        rejects.len(),
        why.len(),
        "one REJECT per name:\n{}",
        run.lines.join("\n")
    );
    for (line, (name, reason)) in rejects.iter().zip(why) {
        assert!(
            line.starts_with("REJECT code=bad-name reason=") && line.contains(reason),
            "{name}: got {line:?}, want bad-name with {reason:?}"
        );
    }
    assert!(
        run.of_kind("MR").is_empty(),
        "a ring was exposed:\n{}",
        run.lines.join("\n")
    );
    s.assert_nothing_written("hostile names");

    // The same names as separate sessions that just vanish after the
    // REJECT (no BYE): each refused the same way.
    for name in ["..%2f..%2fescape", "%2fetc%2fpasswd", "a%0a", "%00"] {
        let run = run_raw_client(
            &net,
            s.port,
            None,
            &[&format!("hello:{name}:5"), "expect:REJECT"],
            CLIENT_TIMEOUT,
        );
        assert_eq!(
            run.code(),
            0,
            "{name}: {}\n{}",
            run.lines.join("\n"),
            run.stderr
        );
        let rejects = run.of_kind("REJECT");
        assert!(
            rejects.len() == 1 && rejects[0].starts_with("REJECT code=bad-name reason="),
            "{name}: {:?}",
            run.lines
        );
        s.assert_nothing_written(name);
    }
    s.assert_still_serves(&net);
}

/// A malformed or out-of-order input and the answer it must get.
struct Case {
    scenario: &'static str,
    /// Start of the answer line (`REJECT code=...` / `ACK status=...`);
    /// None: no answer is possible (the receiver's QP fails).
    answer: Option<&'static [&'static str]>,
    /// Part of the reason.
    reason: &'static str,
    /// The receiver keeps the session open after answering (a refused
    /// offer): the client says BYE.
    session_goes_on: bool,
}

const PROTOCOL: &[&str] = &["ACK status=protocol reason="];

fn cases() -> Vec<Case> {
    let c = |scenario, answer, reason| Case {
        scenario,
        answer: Some(answer),
        reason,
        session_goes_on: false,
    };
    vec![
        c("empty-frame", PROTOCOL, "truncated: need 12 bytes, have 0"),
        c(
            "truncated-header",
            PROTOCOL,
            "truncated: need 12 bytes, have 6",
        ),
        c("truncated-body", PROTOCOL, "truncated"),
        c("bad-magic", PROTOCOL, "bad magic 0x58584652"),
        c(
            "bad-wire-version",
            &["REJECT code=version reason="],
            "version 2",
        ),
        c("unknown-type", PROTOCOL, "unknown message type 99"),
        c("bad-flags", PROTOCOL, "flags"),
        c("trailing-bytes", PROTOCOL, "stray bytes"),
        Case {
            scenario: "bad-protocol-version",
            answer: Some(&["REJECT code=version reason="]),
            reason: "version 999",
            session_goes_on: true,
        },
        Case {
            scenario: "huge-size",
            answer: Some(&[
                "REJECT code=too-large reason=",
                "REJECT code=no-space reason=",
            ]),
            reason: "18446744073709551615",
            session_goes_on: true,
        },
        c("fin-before-hello", PROTOCOL, "FIN"),
        c("credit-from-sender", PROTOCOL, "CREDIT"),
        c("fin-before-data", PROTOCOL, "FIN claims 0 bytes"),
        c("hello-mid-file", PROTOCOL, "HELLO"),
        c("chunk-past-size", PROTOCOL, "past the announced file size"),
        c("bad-chunk-crc", &["ACK status=integrity reason="], "CRC32"),
        Case {
            scenario: "oversized-frame",
            answer: None,
            reason: "",
            session_goes_on: false,
        },
    ]
}

/// Runs each case against the serving receiver `s`; returns the transcripts
/// of the cases not answered as expected.
fn run_cases(net: &Net, s: &mut Served, cases: Vec<Case>) -> Vec<String> {
    let mut failures = Vec::new();
    for case in cases {
        // After the answer the receiver must end the session (or, after a
        // refused offer, end it on our BYE).
        let tail: &[&str] = if case.session_goes_on {
            &["bye", "expect-disconnect"]
        } else {
            &["expect-disconnect"]
        };
        let run = run_raw_client(net, s.port, Some(case.scenario), tail, CLIENT_TIMEOUT);
        let transcript = format!(
            "{}: exit {}\nstdout:\n{}\nstderr:\n{}",
            case.scenario,
            run.code(),
            run.lines.join("\n"),
            run.stderr
        );
        eprintln!("{transcript}");
        let answers: Vec<&String> = run
            .lines
            .iter()
            .filter(|l| l.starts_with("REJECT ") || l.starts_with("ACK "))
            .collect();
        let ok = run.code() == 0
            && run.lines.last().map(String::as_str) == Some("DISCONNECTED")
            && match case.answer {
                None => answers.is_empty(),
                Some(prefixes) => {
                    answers.len() == 1
                        && prefixes.iter().any(|p| answers[0].starts_with(p))
                        && answers[0].contains(case.reason)
                }
            };
        if !ok {
            failures.push(transcript);
        }
        s.assert_nothing_written(case.scenario);
    }
    failures
}

#[test]
fn malformed_control_messages_are_refused_and_receiver_keeps_serving() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve(&net);
    let failures = run_cases(&net, &mut s, cases());
    assert!(
        failures.is_empty(),
        "{} case(s) not refused as expected:\n\n{}\n\nreceiver:\n{}",
        failures.len(),
        failures.join("\n\n"),
        s.receiver.stderr_so_far()
    );
    s.assert_still_serves(&net);
}

const TOKEN: &str = "hostile-test-token-42";

/// A receiver with a token: nothing but the right AUTH gets past the
/// greeting (no HELLO is considered, no file or ring is made); after the
/// right AUTH, hostile input is refused as without a token; the sender with
/// the token still gets through.
#[test]
fn unauthenticated_input_is_refused_before_anything() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve_with_token(&net, Some(TOKEN));
    let auth = |scenario, reason| Case {
        scenario,
        answer: Some(&["REJECT code=auth reason="]),
        reason,
        session_goes_on: false,
    };
    let cases = vec![
        auth("hello-before-auth", "authentication required"),
        auth("fin-before-hello", "authentication required"),
        auth("auth-empty", "no token"),
        auth("auth-wrong-token", "wrong token"),
        Case {
            scenario: "auth-short-mac",
            answer: Some(PROTOCOL),
            reason: "5-byte MAC",
            session_goes_on: false,
        },
        Case {
            scenario: "truncated-header",
            answer: Some(PROTOCOL),
            reason: "truncated",
            session_goes_on: false,
        },
    ];
    let mut failures = run_cases(&net, &mut s, cases);

    // The right token, then hostile names and a FIN out of place: refused
    // exactly as without a token.
    let good = format!("auth:{TOKEN}");
    let run = run_raw_client(
        &net,
        s.port,
        None,
        &[
            &good,
            "hello:..%2fx:1",
            "expect:REJECT",
            "hello:a%0ab:1",
            "expect:REJECT",
            "fin:0:0",
            "expect:ACK",
            "expect-disconnect",
        ],
        CLIENT_TIMEOUT,
    );
    let rejects = run.of_kind("REJECT");
    let acks = run.of_kind("ACK");
    if run.code() != 0
        || rejects.len() != 2
        || !rejects
            .iter()
            .all(|l| l.starts_with("REJECT code=bad-name"))
        || acks.len() != 1
        || !acks[0].starts_with("ACK status=protocol")
    {
        failures.push(format!(
            "authenticated hostile input: exit {}\n{}\n{}",
            run.code(),
            run.lines.join("\n"),
            run.stderr
        ));
    }
    s.assert_nothing_written("authenticated hostile input");
    assert!(
        failures.is_empty(),
        "{} case(s) not refused as expected:\n\n{}\n\nreceiver:\n{}",
        failures.len(),
        failures.join("\n\n"),
        s.receiver.stderr_so_far()
    );
    s.assert_still_serves_with(&net, Some(TOKEN));
}
