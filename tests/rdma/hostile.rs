//! Hostile input on real RDMA (run in the SoftRoCE guest by `make test`):
//! the test-only `rxfer-raw-client` (built by `make build` with
//! `--features fault-injection`) connects to a serving receiver and sends
//! hostile file names, malformed or out-of-order control messages, and RDMA
//! writes into another session's ring or with a stale rkey. Each case
//! asserts the receiver's answer (code and reason) or the write's failure,
//! that nothing was written in, beside or above the output directory, and
//! that the same receiver process keeps serving: a normal transfer by the
//! real `sender` arrives intact afterwards (SHA-256 checked). One receiver
//! serves all cases of a test in a row (five receivers in all; ~50 s in the
//! guest).

use crate::support::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
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
    serve_with(net, token, "10")
}

/// A serving receiver with `--timeout timeout` (seconds without progress).
fn serve_with(net: &Net, token: Option<&str>, timeout: &str) -> Served {
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("out");
    std::fs::create_dir(&out).expect("mkdir out");
    let port = next_port();
    let env: Vec<(&str, &str)> = token.map(|t| ("RDMA_XFER_TOKEN", t)).into_iter().collect();
    let receiver = ReceiverCommand::new(net, port, &out)
        .args(&["--timeout", timeout])
        .env(&env)
        .start();
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

    /// Fails the test if any case's transcript is in `failures`.
    fn assert_no_failures(&self, failures: &[String]) {
        assert!(
            failures.is_empty(),
            "{} case(s) not refused as expected:\n\n{}\n\nreceiver:\n{}",
            failures.len(),
            failures.join("\n\n"),
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
        let mut cmd = SenderCommand::new(net, self.port, Path_::Wire)
            .files(&[input])
            .command();
        token_env(&mut cmd, token);
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
        "raw client: {}\nreceiver:\n{}",
        run.transcript(),
        s.receiver.stderr_so_far()
    );
    let why = [
        ("../x", "may not be"),
        ("/etc/passwd", "must be relative"),
        ("a//b", "is empty"),
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
        run.stdout
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
        run.stdout
    );
    s.assert_nothing_written("hostile names");
    // Whatever the peer sent, the receiver's log shows it escaped.
    let log = s.receiver.stderr_so_far();
    assert!(
        !log.chars().any(|c| c.is_control() && c != '\n'),
        "a raw control character in the receiver's log:\n{log:?}"
    );

    // The same names as separate sessions that just vanish after the
    // REJECT (no BYE): each refused the same way.
    for name in ["..%2f..%2fescape", "%2fetc%2fpasswd", "a%0a", "%00"] {
        assert_name_refused(&net, &mut s, &format!("hello:{name}:5"), "bad-name", "");
    }

    // Trees: a HELLO may carry a relative path, each component
    // checked like a name; nothing may climb out of the output directory,
    // and a path into a directory that does not exist is refused too.
    for (name, code, reason) in [
        ("..%2fx", "bad-name", "may not be"),
        ("a%2f..%2f..%2fx", "bad-name", "may not be"),
        ("a%2f..", "bad-name", "may not be"),
        ("%2fetc%2fpasswd", "bad-name", "must be relative"),
        ("a%2f%2fb", "bad-name", "is empty"),
        ("a%2f", "bad-name", "is empty"),
        (".%2fa", "bad-name", "may not be"),
        ("a%5c..%5cb", "bad-name", "path separator"),
        ("a%2fnew%0aline", "bad-name", "U+000A"),
        ("missing%2fx", "io", "does not exist"),
    ] {
        assert_name_refused(&net, &mut s, &format!("hello:{name}:5"), code, reason);
    }
    s.assert_still_serves(&net);
}

/// A session of the raw client that offers `hello` and vanishes after the
/// REJECT (no BYE): refused with `code` and a reason containing `reason`,
/// and nothing written.
fn assert_name_refused(net: &Net, s: &mut Served, hello: &str, code: &str, reason: &str) {
    let run = run_raw_client(net, s.port, None, &[hello, "expect:REJECT"], CLIENT_TIMEOUT);
    let rejects = run.of_kind("REJECT");
    assert!(
        run.code() == 0
            && rejects.len() == 1
            && rejects[0].starts_with(&format!("REJECT code={code} reason="))
            && rejects[0].contains(reason),
        "{hello}: want REJECT code={code} with {reason:?}; {}",
        run.transcript()
    );
    s.assert_nothing_written(hello);
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
        // Another protocol version is no single entry's problem: refused
        // naming both versions, and the session ends.
        Case {
            scenario: "bad-protocol-version",
            answer: Some(&["REJECT code=version reason="]),
            reason: "version 999",
            session_goes_on: false,
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
        let transcript = format!("{}: {}", case.scenario, run.transcript());
        eprintln!("{transcript}");
        let lines = run.lines();
        let answers: Vec<&str> = lines
            .iter()
            .copied()
            .filter(|l| l.starts_with("REJECT ") || l.starts_with("ACK "))
            .collect();
        // The session ends: DISCONNECTED, possibly followed by the flushed
        // work requests of the dead QP (their order is not defined).
        let ended = lines
            .iter()
            .position(|&l| l == "DISCONNECTED")
            .is_some_and(|i| lines[i + 1..].iter().all(|l| l.starts_with("WR_FAILED")));
        let ok = run.code() == 0
            && ended
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
    s.assert_no_failures(&failures);
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
        // An older sender is told which versions differ.
        Case {
            scenario: "auth-v2",
            answer: Some(&["REJECT code=version reason="]),
            reason: "protocol version 8",
            session_goes_on: false,
        },
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
    // exactly as without a token; and a CRC32 digest, which a sealed FIN
    // must not carry (it would not detect deliberate changes).
    let good = format!("prove:{TOKEN}");
    let run = run_raw_client(
        &net,
        s.port,
        None,
        &[
            &good,
            "expect:AUTH_OK",
            "hello:..%2fx:1:sha256",
            "expect:REJECT",
            "hello:a%0ab:1:sha256",
            "expect:REJECT",
            "hello:weak.bin:1:crc32",
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
        || rejects.len() != 3
        || !rejects[..2]
            .iter()
            .all(|l| l.starts_with("REJECT code=bad-name"))
        || !(rejects[2].starts_with("REJECT code=protocol") && rejects[2].contains("sha256"))
        || acks.len() != 1
        || !acks[0].starts_with("ACK status=protocol")
    {
        failures.push(format!("authenticated hostile input: {}", run.transcript()));
    }
    if !run.stdout.contains("AUTH_OK verified=true") {
        failures.push(format!("the receiver's proof: {}", run.transcript()));
    }
    s.assert_nothing_written("authenticated hostile input");
    s.assert_no_failures(&failures);
    s.assert_still_serves_with(&net, Some(TOKEN));
}

/// A relay: a client that cannot prove the token itself hands the
/// receiver's challenge to a real sender on another connection and passes
/// that sender's proof back (or replays a proof made for another
/// connection). Simulated with the token on two connections to the same
/// receiver: a proof over connection 1's nonce but connection 2's
/// addresses and QPs, sent on connection 1, and connection 1's own proof
/// sent on connection 2. Both are refused, nothing is written; an honest
/// proof on a third connection gets in (so the refusals are the binding's).
#[test]
fn auth_relayed_proofs_are_refused() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve_with_token(&net, Some(TOKEN));
    let relayed = format!("prove:{TOKEN}:1:2");
    let replayed = format!("prove:{TOKEN}:1:1");
    let honest = format!("prove:{TOKEN}");
    let run = run_raw_client(
        &net,
        s.port,
        None,
        &[
            "expect:CHALLENGE",
            "conn:2",
            "expect:CHALLENGE",
            "conn:1",
            &relayed,
            "expect:REJECT",
            "conn:2",
            &replayed,
            "expect:REJECT",
            "conn:3",
            "expect:CHALLENGE",
            &honest,
            "expect:AUTH_OK",
            "bye",
        ],
        CLIENT_TIMEOUT,
    );
    let rejects = run.of_kind("REJECT");
    assert_eq!(run.code(), 0, "{}", run.transcript());
    assert_eq!(rejects.len(), 2, "{}", run.transcript());
    assert!(
        rejects
            .iter()
            .all(|l| l.starts_with("REJECT code=auth") && l.contains("wrong token")),
        "{}",
        run.transcript()
    );
    assert!(
        run.stdout.contains("AUTH_OK verified=true"),
        "{}",
        run.transcript()
    );
    s.assert_nothing_written("relayed proofs");
    s.assert_still_serves_with(&net, Some(TOKEN));
}

/// After the handshake every control message is sealed: a FIN whose tag
/// was altered, or a HELLO replayed byte for byte, ends the session with an
/// ACK(protocol) saying why, and nothing is written.
#[test]
fn auth_forged_or_replayed_control_messages_end_the_session() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve_with_token(&net, Some(TOKEN));
    let honest = format!("prove:{TOKEN}");
    let mut failures = Vec::new();
    for (case, steps, reason) in [
        (
            "forged FIN",
            vec![
                "hello:forged.bin:10:sha256",
                "expect:MR",
                "writes:1:10",
                "bad-mac",
                "fin:10:1",
                "expect:ACK",
                "expect-disconnect",
            ],
            "forged or altered",
        ),
        (
            "replayed HELLO",
            vec![
                "hello:replayed.bin:10:sha256",
                "expect:MR",
                "replay",
                "expect:ACK",
                "expect-disconnect",
            ],
            "was replayed",
        ),
    ] {
        let mut all = vec![honest.as_str(), "expect:AUTH_OK"];
        all.extend(steps);
        let run = run_raw_client(&net, s.port, None, &all, CLIENT_TIMEOUT);
        let acks = run.of_kind("ACK");
        if run.code() != 0
            || !run.stdout.contains("AUTH_OK verified=true")
            || acks.len() != 1
            || !acks[0].starts_with("ACK status=protocol")
            || !acks[0].contains(reason)
        {
            failures.push(format!("{case}: {}", run.transcript()));
        }
        s.assert_nothing_written(case);
    }
    s.assert_no_failures(&failures);
    s.assert_still_serves_with(&net, Some(TOKEN));
}

// ---------------------------------------------------------------------------
// Session isolation: each session has its own protection domain, CQ, QP and
// ring, so one session's queue pair can never reach another session's
// memory, and each ring is deregistered when its session ends, so a stale
// rkey is useless. The raw client's `writes-to` step aims real RDMA writes at
// an address and rkey learnt from another session's MR message; on SoftRoCE
// (and on RDMA NICs) the target QP's responder finds no region for that
// rkey in its own PD and answers with a remote access error NAK, which fails
// the write on the writer (IBV_WC_REM_ACCESS_ERR) before a byte lands.

/// A file announced as 3 slots of the default 1 MiB ring slot.
const ISOLATION_SIZE: u64 = 3 * CHUNK;

/// The address and rkey of an `MR addr=0x.. rkey=0x.. ...` line.
fn mr_of(line: &str) -> (u64, u32) {
    let field = |key: &str| {
        line.split(' ')
            .find_map(|f| f.strip_prefix(key))
            .and_then(|v| u64::from_str_radix(v.trim_start_matches("0x"), 16).ok())
            .unwrap_or_else(|| panic!("no {key} in {line:?}"))
    };
    let rkey = field("rkey=");
    (
        field("addr="),
        u32::try_from(rkey).unwrap_or_else(|_| panic!("rkey {rkey:#x} in {line:?}")),
    )
}

/// A `wait-file` step and the path that lets it go on.
fn go_ahead(dir: &Path, name: &str) -> (PathBuf, String) {
    let path = dir.join(name);
    let step = format!("wait-file:{}", path.display());
    (path, step)
}

/// Starts a raw client (`--timeout 60`) whose `steps` open a session with a
/// HELLO and get a ring; returns it, running, with the ring's address and
/// rkey from its MR line.
fn spawn_with_ring(net: &Net, port: u16, steps: &[&str]) -> (Running, u64, u32) {
    let mut client = spawn_raw_client(net, port, None, steps, 60);
    let (addr, rkey) = mr_of(&client.wait_for_line("MR ", CLIENT_TIMEOUT));
    (client, addr, rkey)
}

/// The control write into the client's own ring, then the hostile one.
const OWN_WRITE: &str = "writes-to:own:own:1";

/// Asserts that the client's control write into its own ring (OWN_WRITE,
/// at `own_addr`) completed, so its connection and the tool work, and that
/// the hostile write after it failed on the writer with a remote access
/// error; then the receiver ended that session.
fn assert_write_refused(run: &Finished, own_addr: u64, case: &str, receiver_log: &str) {
    let transcript = format!("{case}: {}\nreceiver:\n{receiver_log}", run.transcript());
    eprintln!("{case}: {}", run.lines().join(" | "));
    let ok = run.of_kind("WRITE_OK");
    assert!(
        ok.len() <= 1,
        "{case}: an RDMA write reached memory of another (or an ended) session:\n{transcript}"
    );
    assert!(
        ok.len() == 1 && ok[0].starts_with(&format!("WRITE_OK addr={own_addr:#x} ")),
        "{case}: the control write into the client's own ring did not complete:\n{transcript}"
    );
    let failed = run.of_kind("WR_FAILED");
    assert!(
        failed.len() == 1 && failed[0].contains("remote access error"),
        "{case}: the write did not fail with a remote access error:\n{transcript}"
    );
    // The receiver ends the session whose QP failed (the peer sees it).
    assert_eq!(
        run.lines().last().copied(),
        Some("DISCONNECTED"),
        "{case}: the receiver kept the failed session:\n{transcript}"
    );
    assert_eq!(run.code(), 0, "{case}:\n{transcript}");
}

/// The bytes the raw client writes as chunk `seq` of `len` bytes.
fn raw_chunk(seq: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| i.wrapping_mul(31).wrapping_add(seq) as u8)
        .collect()
}

/// A memory region as the kernel's resource tracking lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct KernelMr {
    dev: String,
    rkey: u32,
    pdn: u32,
    /// The registering task: a thread id (the receiver's session thread).
    pid: Option<u32>,
}

/// Every memory region registered on this machine, from the kernel's own
/// bookkeeping (`rdma resource show mr`, which shows rkeys to root only).
/// None where that is unavailable (no `rdma` tool, not root); in the test
/// guest (root, iproute2) it must work.
fn kernel_mrs() -> Option<Vec<KernelMr>> {
    let unavailable = |why: String| {
        assert!(
            !in_guest(),
            "`rdma resource show mr` is needed in the guest: {why}"
        );
        eprintln!("{}: not checking the kernel's MR list: {why}", test_name());
        None
    };
    let listing = match std::process::Command::new("rdma")
        .args(["resource", "show", "mr"])
        .output()
    {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        Ok(o) => {
            return unavailable(format!(
                "rdma: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        Err(e) => return unavailable(format!("cannot run rdma: {e}")),
    };
    // dev rxe0 mrn 2 rkey 0x4cb lkey 0x4cb mrlen 16777216 pdn 2 pid 142 comm session-1
    let mut mrs = Vec::new();
    for line in listing.lines().filter(|l| !l.trim().is_empty()) {
        let tokens: Vec<&str> = line.split_whitespace().collect();
        let value = |key: &str| tokens.windows(2).find(|w| w[0] == key).map(|w| w[1]);
        let rkey =
            value("rkey").and_then(|v| u32::from_str_radix(v.trim_start_matches("0x"), 16).ok());
        let (Some(dev), Some(rkey), Some(pdn)) = (
            value("dev"),
            rkey,
            value("pdn").and_then(|v| v.parse().ok()),
        ) else {
            return unavailable(format!("no dev/rkey/pdn in {line:?}"));
        };
        mrs.push(KernelMr {
            dev: dev.to_string(),
            rkey,
            pdn,
            pid: value("pid").and_then(|v| v.parse().ok()),
        });
    }
    Some(mrs)
}

/// The MR with `rkey` that a thread of process `pid` registered (None if
/// the kernel's list is unavailable); fails the test if there is none.
fn mr_of_process(pid: u32, rkey: u32, case: &str) -> Option<KernelMr> {
    let mrs = kernel_mrs()?;
    let ours = |m: &&KernelMr| {
        m.rkey == rkey
            && m.pid
                .is_some_and(|t| Path::new(&format!("/proc/{pid}/task/{t}")).exists())
    };
    Some(mrs.iter().find(ours).cloned().unwrap_or_else(|| {
        panic!("{case}: no MR with rkey {rkey:#x} registered by the receiver: {mrs:?}")
    }))
}

impl Served {
    /// Waits until `n` sessions of the receiver have ended: it logs "session
    /// finished" or "session failed" after the session's QP, ring and PD are
    /// gone and its temporary file removed.
    fn wait_sessions_ended(&mut self, n: usize) {
        self.receiver.wait_for(
            Stream::Stderr,
            &format!("the end of {n} sessions"),
            Duration::from_secs(60),
            |log| {
                let ended =
                    log.matches("session finished").count() + log.matches("session failed").count();
                (ended >= n).then_some(())
            },
        );
    }
}

/// (a) A stale rkey: client 1 gets a ring (HELLO, MR) and ends its session,
/// in turn cleanly (a whole file written, ACK ok, BYE), with a BYE in the
/// middle of a file (a protocol error) and by disconnecting in the middle of
/// a file; the kernel's list shows that ring's MR registered while the
/// session lives and gone once it ended. Client 2 then
/// opens its own session and ring (HELLO, MR; on SoftRoCE the new ring gets
/// the old one's address, only the rkey differs), writes one chunk into its
/// own ring (a control: it completes) and then RDMA-writes to client 1's old
/// address and rkey: that write fails on client 2 with a remote access
/// error, the receiver writes nothing of it (no file under either name, no
/// temporary file) and ends that session, and keeps serving.
#[test]
fn a_stale_rkey_of_an_ended_session_is_useless() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve_with(&net, None, "60");
    let mut ended = 0;
    // One whole chunk, for the session that ends cleanly.
    let chunk = raw_chunk(0, CHUNK as usize);
    let fin = format!("fin:{CHUNK}:1:{:x}", crc32fast::hash(&chunk));
    // How session 1 ends, the size it announces, and whether its file lands.
    let endings: [(&str, &[&str], u64, bool); 3] = [
        (
            "a completed file and BYE",
            &["writes:1", &fin, "expect:ACK", "bye", "expect-disconnect"],
            CHUNK,
            true,
        ),
        (
            "BYE in the middle of a file (a protocol error)",
            &["bye", "expect-disconnect"],
            ISOLATION_SIZE,
            false,
        ),
        (
            "a disconnect in the middle of a file",
            &[],
            ISOLATION_SIZE,
            false,
        ),
    ];
    for (i, (how, ending, size, lands)) in endings.into_iter().enumerate() {
        let case = format!("stale rkey after {how}");
        let (go, wait) = go_ahead(s.src.path(), &format!("go-{i}"));
        let hello = format!("hello:one.bin:{size}");
        let mut steps = vec![hello.as_str(), "expect:MR", wait.as_str()];
        steps.extend(ending);
        let (one, addr1, rkey1) = spawn_with_ring(&net, s.port, &steps);
        // The kernel lists the ring as registered by the receiver.
        let ring1 = mr_of_process(s.receiver.pid(), rkey1, &case);
        std::fs::write(&go, b"go").expect("go-ahead");
        let run1 = one.wait(CLIENT_TIMEOUT);
        assert_eq!(run1.code(), 0, "{case}: client 1: {}", run1.transcript());
        ended += 1;
        s.wait_sessions_ended(ended);
        // ... and not at all (by no task) once the session ended.
        if let (Some(ring1), Some(mrs)) = (&ring1, kernel_mrs()) {
            assert!(
                !mrs.iter().any(|m| m.dev == ring1.dev && m.rkey == rkey1),
                "{case}: the ended session's ring (rkey {rkey1:#x}) is still registered: {mrs:?}"
            );
        }
        if lands {
            let acks = run1.of_kind("ACK");
            assert!(
                acks.len() == 1 && acks[0].starts_with("ACK status=ok"),
                "{case}: {}",
                run1.stdout
            );
            let path = s.out.join("one.bin");
            assert_eq!(
                sha256_file(&path),
                sha256_hex(&chunk),
                "{case}: client 1's file"
            );
            std::fs::remove_file(path).expect("remove one.bin");
        }
        s.assert_nothing_written(&case);

        let stale = format!("writes-to:{addr1:#x}:{rkey1:#x}:1");
        let hello = format!("hello:two.bin:{ISOLATION_SIZE}");
        let run2 = run_raw_client(
            &net,
            s.port,
            None,
            &[&hello, "expect:MR", OWN_WRITE, &stale, "expect-disconnect"],
            CLIENT_TIMEOUT,
        );
        let mr2 = run2.of_kind("MR");
        assert_eq!(
            mr2.len(),
            1,
            "{case}: client 2 got no ring:\n{}",
            run2.stdout
        );
        let (addr2, rkey2) = mr_of(mr2[0]);
        // Were the rkey the same, the write would be a legitimate one.
        assert_ne!(rkey2, rkey1, "{case}: the new ring reuses the old rkey");
        eprintln!(
            "{case}: old ring {addr1:#x}/{rkey1:#x}, new ring {addr2:#x}/{rkey2:#x}{}",
            if addr1 == addr2 {
                " (same address: only the rkey is stale)"
            } else {
                ""
            }
        );
        assert_write_refused(&run2, addr2, &case, &s.receiver.stderr_so_far());
        ended += 1;
        s.wait_sessions_ended(ended);
        s.assert_nothing_written(&case);
    }
    s.assert_still_serves(&net);
}

/// (b) Across live sessions: raw client A holds a session with an open
/// HELLO and its ring; while it waits, raw clients B1 and B2 (sessions of
/// their own, each with its own HELLO and ring) each write one chunk into
/// their own ring (a control: it completes) and then RDMA-write into A's
/// ring, B1 with A's address and rkey, B2 with A's address and its own
/// rkey. The kernel's list shows A's ring in another protection domain than
/// B1's and B2's; both hostile writes fail on the writer with a remote
/// access error (none completes), the receiver
/// ends those sessions without writing anything of them, and A then writes
/// its 3 chunks, FIN, and gets ACK ok: its file arrives with the SHA-256 of
/// exactly what A wrote. Then a normal sender still gets through.
///
/// A raw client, not the real sender, plays A: it prints its MR (the real
/// sender does not) and waits at a go-ahead file, so the attacks happen
/// while A's ring is live, every time, instead of racing a transfer.
#[test]
fn a_session_cannot_write_into_another_sessions_ring() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve_with(&net, None, "60");
    let chunks = (ISOLATION_SIZE / CHUNK) as usize;
    let mut content = Vec::with_capacity(ISOLATION_SIZE as usize);
    for seq in 0..chunks {
        content.extend(raw_chunk(seq as u64, CHUNK as usize));
    }
    let crc = crc32fast::hash(&content);
    let sum = sha256_hex(&content);

    let (go_a, wait_a) = go_ahead(s.src.path(), "go-a");
    let hello_a = format!("hello:a.bin:{ISOLATION_SIZE}");
    let writes_a = format!("writes:{chunks}");
    let fin_a = format!("fin:{ISOLATION_SIZE}:{chunks}:{crc:x}");
    let (mut a, addr_a, rkey_a) = spawn_with_ring(
        &net,
        s.port,
        &[
            &hello_a,
            "expect:MR",
            &wait_a,
            &writes_a,
            &fin_a,
            "expect:ACK",
            "bye",
            "expect-disconnect",
        ],
    );
    eprintln!("A's ring: {addr_a:#x}/{rkey_a:#x}");

    let attacks = [
        (
            "B1",
            "A's rkey",
            format!("writes-to:{addr_a:#x}:{rkey_a:#x}:1"),
        ),
        ("B2", "its own rkey", format!("writes-to:{addr_a:#x}:own:1")),
    ];
    let mut ended = 0;
    for (who, key, write) in &attacks {
        let case = format!("{who} writing into A's ring with {key}");
        let (go, wait) = go_ahead(s.src.path(), &format!("go-{who}"));
        let hello = format!("hello:{who}.bin:{ISOLATION_SIZE}");
        let (b, addr_b, rkey_b) = spawn_with_ring(
            &net,
            s.port,
            &[
                &hello,
                "expect:MR",
                &wait,
                OWN_WRITE,
                write,
                "expect-disconnect",
            ],
        );
        assert_ne!(rkey_b, rkey_a, "{case}: two live rings with one rkey");
        if let (Some(ring_a), Some(ring_b)) = (
            mr_of_process(s.receiver.pid(), rkey_a, &case),
            mr_of_process(s.receiver.pid(), rkey_b, &case),
        ) {
            assert!(
                ring_a.dev != ring_b.dev || ring_a.pdn != ring_b.pdn,
                "{case}: A's and {who}'s rings share a protection domain: {ring_a:?} {ring_b:?}"
            );
            eprintln!("{case}: A's ring {ring_a:?}, {who}'s ring {ring_b:?}");
        }
        std::fs::write(&go, b"go").expect("go-ahead");
        let run = b.wait(CLIENT_TIMEOUT);
        assert_write_refused(&run, addr_b, &case, &s.receiver.stderr_so_far());
        ended += 1;
        s.wait_sessions_ended(ended);
        // Nothing of B: only A's temporary file (its file is still open).
        let names = names_in(&s.out);
        assert!(
            names.len() == 1 && names[0].starts_with(".rdma-xfer-"),
            "{case}: the output directory holds {names:?}, want only A's temporary file"
        );
        assert!(a.is_running(), "{case}: A's session ended");
    }

    std::fs::write(&go_a, b"go").expect("go-ahead");
    let run_a = a.wait(CLIENT_TIMEOUT);
    let acks = run_a.of_kind("ACK");
    assert!(
        run_a.code() == 0 && acks.len() == 1 && acks[0].starts_with("ACK status=ok"),
        "A's transfer did not complete after the attacks: {}\nreceiver:\n{}",
        run_a.transcript(),
        s.receiver.stderr_so_far()
    );
    s.wait_sessions_ended(ended + 1);
    assert_eq!(names_in(&s.out), vec!["a.bin".to_string()]);
    assert_eq!(sha256_file(&s.out.join("a.bin")), sum, "A's file");
    std::fs::remove_file(s.out.join("a.bin")).expect("remove a.bin");
    s.assert_nothing_written("after the cross-session writes");
    s.assert_still_serves(&net);
}

/// A peer that floods HELLOs of one directory (each answered, none
/// refused: refusals alone would end the session after 100) and takes none
/// of the answers (it posts no receives, so the receiver's SENDs can never
/// complete): the
/// receiver ends the session instead of queueing replies without bound,
/// its memory stays flat, and it goes on serving.
#[test]
fn a_peer_that_takes_no_answers_cannot_make_the_receiver_queue_them() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve(&net);
    let rss = |pid: u32| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .expect("VmRSS")
            * 1024
    };
    let before = rss(s.receiver.pid());
    let run = spawn_raw_client(&net, s.port, Some("hello-flood"), &["--no-receives"], 30)
        .wait(Duration::from_secs(180));
    // The receiver hangs up: the client sees it (0) or its next SEND fails (1).
    assert!(
        matches!(run.code(), 0 | 1),
        "raw client: {}\nreceiver:\n{}",
        run.transcript(),
        s.receiver.stderr_so_far()
    );
    let log = s
        .receiver
        .wait_for_stderr("takes none of our messages", Duration::from_secs(60));
    let after = rss(s.receiver.pid());
    assert!(
        after < before + 16 * (1 << 20),
        "receiver RSS grew from {before} to {after} bytes:\n{log}"
    );
    // The one directory the flood named, and nothing else.
    assert_eq!(names_in(&s.out), vec!["flood".to_string()]);
    std::fs::remove_dir(s.out.join("flood")).expect("remove the flood's directory");
    s.assert_nothing_written("HELLO flood without receives");
    s.assert_still_serves(&net);
}

/// A plain RDMA WRITE (no immediate, so the receiver gets no completion for
/// it) over a chunk's slot right after the chunk's WRITE_WITH_IMM completed
/// races the receiver's handling of that chunk. Whichever wins, what the
/// receiver stores is what it checked: it checks and stores one private
/// copy of the slot. So either the file lands with exactly the bytes whose
/// CRC and digest were sent (the copy came first), or the check fails and
/// nothing is left (the rewrite came first); never the rewritten bytes
/// under a good ACK.
#[test]
fn a_plain_write_after_a_chunk_cannot_change_what_is_stored() {
    let Some(net) = rdma_net() else { return };
    let mut s = serve_with(&net, None, "30");
    let chunk = raw_chunk(0, CHUNK as usize);
    let fin = format!("fin:{CHUNK}:1:{:x}", crc32fast::hash(&chunk));
    let hello = format!("hello:one.bin:{CHUNK}");
    let steps = [
        hello.as_str(),
        "expect:MR",
        "writes:1",
        "rewrite:32",
        &fin,
        "expect:ACK",
        "bye",
    ];
    let path = s.out.join("one.bin");
    let (mut landed, mut failed) = (0, 0);
    for round in 0..6 {
        // Sessions are numbered from 1.
        let case = format!("session {}", round + 1);
        let run = run_raw_client(&net, s.port, None, &steps, CLIENT_TIMEOUT);
        let transcript = run.transcript();
        // The rewrites were all made, or the receiver, having copied a
        // slot some of them had reached already, failed the check and
        // hung up while the rest were still in flight.
        let cut_short = run
            .of_kind("ACK")
            .iter()
            .any(|l| l.starts_with("ACK status=integrity"))
            && transcript.contains("peer disconnected while waiting for the RDMA write");
        assert!(
            cut_short || run.lines().iter().any(|l| l.starts_with("REWRITE_OK ")),
            "{case}: the plain writes were not tried:\n{transcript}"
        );
        let acked = run
            .of_kind("ACK")
            .iter()
            .any(|l| l.starts_with("ACK status=ok"));
        if acked {
            assert_eq!(
                sha256_file(&path),
                sha256_hex(&chunk),
                "{case}: a good ACK for bytes other than those checked:\n{transcript}"
            );
            landed += 1;
            std::fs::remove_file(&path).expect("remove the landed file");
        } else {
            assert!(
                !path.exists(),
                "{case}: a file without a good ACK:\n{transcript}"
            );
            failed += 1;
        }
        s.wait_sessions_ended(round + 1);
        assert_no_temp_files(&s.out);
    }
    eprintln!(
        "plain rewrites: {landed} rounds stored the checked bytes, {failed} failed the check"
    );
    s.assert_nothing_written("after the plain rewrites");
    s.assert_still_serves(&net);
}
