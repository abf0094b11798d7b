//! `rxfer-raw-client`: a TEST-ONLY client that connects to a `receiver` over
//! rdma_cm like the sender does and then runs a scenario: a sequence of steps
//! that send arbitrary control-message bytes, encoded messages with hostile
//! contents, or bogus RDMA writes into the ring, and that wait for answers.
//!
//! It exists only with `--features fault-injection` (see Cargo.toml), so a
//! release build never contains it. It uses the crate's own safe verbs and
//! proto API: no `unsafe` here.
//!
//! Every control message received is printed on stdout as soon as it arrives,
//! one per line, in a stable greppable form (`REJECT code=bad-name
//! reason="..."`, `ACK status=protocol reason="..."`, `MR addr=0x...`, the
//! receiver's greeting `CHALLENGE flags=... nonce=...`, ...;
//! frames this build cannot decode as `UNDECODED ...`; the peer's disconnect
//! as `DISCONNECTED`; a failed SEND or write of ours as `WR_FAILED`; a
//! `writes-to` write that completed as `WRITE_OK`).
//! Progress and errors go to stderr.
//!
//! Exit codes: 0 every step done (every `expect` answered); 1 the receiver
//! disconnected (or the connection broke) before an expected answer; 2 usage
//! error; 3 cannot connect; 7 timeout waiting for an answer.
#![forbid(unsafe_code)]

use clap::Parser;
use rdma_xfer::cli::resolve;
use rdma_xfer::proto::{
    AckStatus, CAP_NONE, Digest, DigestAlg, Fin, Hello, MAX_MESSAGE, Message, NONCE_LEN,
    RejectCode, RingInfo, Token, decode, encode_to_vec,
};
use rdma_xfer::sys::SysError;
use rdma_xfer::sys::rdma::{
    Buffer, BufferPool, CmId, Completion, Endpoint, EventChannel, QpCaps, RemoteTarget, WcOpcode,
};
use std::collections::VecDeque;
use std::io::Write;
use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    about = "TEST ONLY: connect to a receiver and send hostile control messages.",
    after_help = STEPS_HELP
)]
struct Args {
    /// Receiver's address.
    #[arg(required_unless_present = "list_scenarios")]
    addr: Option<String>,
    /// Steps, run in order after the --scenario's steps (see below).
    steps: Vec<String>,
    /// Receiver's port.
    #[arg(long, default_value_t = 7471)]
    port: u16,
    /// Local address to connect from (picks the RDMA device and port).
    #[arg(long, value_name = "ADDR")]
    source: Option<IpAddr>,
    /// A named scenario whose steps run first (--list-scenarios shows them).
    #[arg(long, value_name = "NAME")]
    scenario: Option<String>,
    /// Seconds to wait for the connection and for each expected answer.
    #[arg(long, default_value_t = 10)]
    timeout: u64,
    /// Print the named scenarios and their steps, then exit.
    #[arg(long)]
    list_scenarios: bool,
}

const STEPS_HELP: &str = "Steps (one argument each):
  raw:HEX                 send these bytes as one SEND (HEX may be empty; '_' is ignored)
  hello:NAME[:SIZE[:DIGEST[:VERSION]]]
                          send an encoded HELLO; NAME is %-decoded (%2f = '/', %00 = NUL,
                          %3a = ':'); SIZE a number or 'max' (u64::MAX); DIGEST crc32|sha256;
                          VERSION 1 by default (a plain name), 2 for relative paths
  fin:BYTES:CHUNKS[:CRC]  send an encoded FIN with a crc32 digest (hex, default 0)
  credit:N | bye          send an encoded CREDIT / BYE
  auth:TOKEN              send AUTH with HMAC-SHA256(TOKEN, nonce of the last CHALLENGE
                          received); TOKEN is %-decoded; 'auth:' sends an empty MAC
  writes:N[:LEN[:IMM]]    N RDMA WRITE_WITH_IMM of LEN bytes (default: the slot size) into
                          the next ring slots of the last MR received; IMM is the CRC32 of
                          the data unless given as hex or 'bad' (a wrong CRC32)
  writes-to:ADDR:RKEY:N[:LEN[:IMM]]
                          N RDMA WRITE_WITH_IMM of LEN bytes (default: the last MR's slot
                          size, else 4096) to ADDR, ADDR+LEN, ... with RKEY (hex, e.g. taken
                          from an earlier MR line: another session's ring or a stale one;
                          'own' = the last MR's address / rkey); each completed write prints
                          WRITE_OK
  wait-file:PATH          pause (up to --timeout) until PATH exists: a test's go-ahead
  expect:KIND[|KIND...]   wait until a message of one of these kinds arrives (REJECT, ACK,
                          MR, CREDIT, ..., UNDECODED or ANY); messages of other kinds are
                          printed and skipped (e.g. a greeting)
  expect-disconnect       wait until the receiver ends the connection
  sleep:MS                pause

Output (stdout, one line per message received):
  REJECT code=bad-name reason=\"...\"     ACK status=protocol reason=\"...\"
  MR addr=0x.. rkey=0x.. slot_size=N slot_count=N     CREDIT count=N
  CHALLENGE flags=0x0001 auth_required=true nonce=HEX    AUTH mac=HEX
  UNDECODED len=N error=\"...\" hex=...   DISCONNECTED
  WR_FAILED error=\"...\"   (one of our SENDs or writes failed: the QP is broken)
  WRITE_OK addr=0x.. rkey=0x.. len=N   (a writes-to write completed)

Exit codes: 0 all steps done; 1 the connection ended before an expected
answer; 2 usage; 3 cannot connect; 7 timeout.";

/// One step of a scenario.
#[derive(Debug, Clone)]
enum Step {
    Raw(Vec<u8>),
    Msg(Message),
    /// AUTH answering the last CHALLENGE with this token (empty: no MAC).
    Auth(Vec<u8>),
    Writes {
        count: u32,
        len: Option<u32>,
        imm: Imm,
    },
    /// Writes to an explicit remote address and rkey (None: the last MR's).
    WritesTo {
        addr: Option<u64>,
        rkey: Option<u32>,
        count: u32,
        len: Option<u32>,
        imm: Imm,
    },
    Expect(Vec<String>),
    ExpectDisconnect,
    Sleep(Duration),
    WaitFile(PathBuf),
}

#[derive(Debug, Clone, Copy)]
enum Imm {
    Crc,
    Bad,
    Value(u32),
}

/// Why the run stopped early.
#[derive(Debug)]
enum Failure {
    Usage(String),
    Connect(String),
    /// The connection ended (or broke) before the awaited answer.
    Ended(String),
    Timeout(String),
}

impl Failure {
    fn exit_code(&self) -> u8 {
        match self {
            Failure::Ended(_) => 1,
            Failure::Usage(_) => 2,
            Failure::Connect(_) => 3,
            Failure::Timeout(_) => 7,
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Usage(s) => write!(f, "usage: {s}"),
            Failure::Connect(s) => write!(f, "cannot connect: {s}"),
            Failure::Ended(s) => write!(f, "connection ended: {s}"),
            Failure::Timeout(s) => write!(f, "timeout: {s}"),
        }
    }
}

// ---------------------------------------------------------------------------
// Parsing

fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|&b| b != b'_').collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits in {s:?}"));
    }
    digits
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("bad hex {s:?}"))
        })
        .collect()
}

fn percent_decode(s: &str) -> Result<String, String> {
    String::from_utf8(percent_decode_bytes(s)?)
        .map_err(|_| format!("{s:?} does not decode to UTF-8 (use raw:)"))
}

fn percent_decode_bytes(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or_else(|| format!("incomplete %-escape in {s:?}"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad %-escape in {s:?}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

fn parse_num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{what}: expected a number, got {s:?}"))
}

fn parse_hex_u64(s: &str, what: &str) -> Result<u64, String> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|_| format!("{what}: expected hex, got {s:?}"))
}

fn parse_imm(field: Option<&str>) -> Result<Imm, String> {
    Ok(match field {
        None | Some("crc") => Imm::Crc,
        Some("bad") => Imm::Bad,
        Some(h) => Imm::Value(u32::from_str_radix(h, 16).map_err(|_| format!("bad IMM {h:?}"))?),
    })
}

fn parse_step(arg: &str) -> Result<Step, String> {
    let mut parts = arg.split(':');
    let kind = parts.next().unwrap_or_default();
    let fields: Vec<&str> = parts.collect();
    let field = |i: usize| fields.get(i).copied().filter(|f| !f.is_empty());
    let step = match kind {
        "raw" => Step::Raw(parse_hex(&fields.join(""))?),
        "hello" => {
            let name = percent_decode(fields.first().copied().unwrap_or_default())?;
            let size = match field(1) {
                None => 0,
                Some("max") => u64::MAX,
                Some(s) => parse_num(s, "HELLO size")?,
            };
            let digest = match field(2) {
                None | Some("crc32") => DigestAlg::Crc32,
                Some("sha256") => DigestAlg::Sha256,
                Some(other) => return Err(format!("unknown digest {other:?}")),
            };
            let version = match field(3) {
                None => PLAIN_HELLO_VERSION,
                Some(v) => parse_num(v, "HELLO version")?,
            };
            Step::Msg(Message::Hello(Hello {
                version,
                caps: CAP_NONE,
                name,
                size,
                mode: 0o644,
                digest,
                mtime: None,
            }))
        }
        "fin" => {
            let bytes = parse_num(field(0).unwrap_or("0"), "FIN bytes")?;
            let chunks = parse_num(field(1).unwrap_or("0"), "FIN chunks")?;
            let crc = match field(2) {
                None => 0,
                Some(h) => u32::from_str_radix(h, 16).map_err(|_| format!("bad CRC {h:?}"))?,
            };
            Step::Msg(Message::Fin(Fin {
                bytes,
                chunks,
                digest: Digest::Crc32(crc),
            }))
        }
        "credit" => Step::Msg(Message::Credit {
            count: parse_num(field(0).unwrap_or("1"), "CREDIT count")?,
        }),
        "bye" => Step::Msg(Message::Bye),
        "auth" => Step::Auth(percent_decode_bytes(&fields.join(":"))?),
        "writes" => Step::Writes {
            count: parse_num(field(0).unwrap_or("1"), "write count")?,
            len: field(1).map(|l| parse_num(l, "write length")).transpose()?,
            imm: parse_imm(field(2))?,
        },
        "writes-to" => Step::WritesTo {
            addr: match field(0).ok_or("writes-to: needs ADDR:RKEY:N")? {
                "own" => None,
                a => Some(parse_hex_u64(a, "writes-to address")?),
            },
            rkey: match field(1).ok_or("writes-to: needs ADDR:RKEY:N")? {
                "own" => None,
                k => Some(
                    u32::try_from(parse_hex_u64(k, "writes-to rkey")?)
                        .map_err(|_| format!("writes-to: rkey {k:?} exceeds 32 bits"))?,
                ),
            },
            count: parse_num(
                field(2).ok_or("writes-to: needs ADDR:RKEY:N")?,
                "write count",
            )?,
            len: field(3).map(|l| parse_num(l, "write length")).transpose()?,
            imm: parse_imm(field(4))?,
        },
        "expect" => {
            let kinds: Vec<String> = fields
                .join(":")
                .split('|')
                .filter(|k| !k.is_empty())
                .map(str::to_ascii_uppercase)
                .collect();
            if kinds.is_empty() {
                return Err("expect: needs at least one message kind".into());
            }
            Step::Expect(kinds)
        }
        "expect-disconnect" => Step::ExpectDisconnect,
        "sleep" => Step::Sleep(Duration::from_millis(parse_num(
            field(0).unwrap_or("0"),
            "sleep",
        )?)),
        "wait-file" => {
            let path = fields.join(":");
            if path.is_empty() {
                return Err("wait-file: needs a path".into());
            }
            Step::WaitFile(PathBuf::from(path))
        }
        other => return Err(format!("unknown step {other:?} in {arg:?} (see --help)")),
    };
    Ok(step)
}

// ---------------------------------------------------------------------------
// Named scenarios

/// Hostile file names; every one must be refused with REJECT bad-name.
fn hostile_names() -> Vec<String> {
    vec![
        "../x".into(),
        "/etc/passwd".into(),
        "a/b".into(),
        "..".into(),
        ".".into(),
        String::new(),
        "n".repeat(300),
        "a\0b".into(),
        "a\nb".into(),
        "tab\there".into(),
        "esc\x1b[31m".into(),
        "del\x7f".into(),
        "c1\u{85}".into(),
        "back\\slash".into(),
    ]
}

/// A well-formed frame with one header byte changed.
fn patched(msg: &Message, index: usize, value: u8) -> Vec<u8> {
    let mut b = encode_to_vec(msg).unwrap_or_default();
    if let Some(x) = b.get_mut(index) {
        *x = value;
    }
    b
}

/// The HELLO version a sender uses for a plain file (a single name, no
/// flags); relative paths and flags need `PROTOCOL_VERSION`.
const PLAIN_HELLO_VERSION: u16 = 1;

fn hello(name: &str, size: u64) -> Message {
    Message::Hello(Hello {
        version: PLAIN_HELLO_VERSION,
        caps: CAP_NONE,
        name: name.into(),
        size,
        mode: 0o644,
        digest: DigestAlg::Crc32,
        mtime: None,
    })
}

fn expect(kinds: &str) -> Step {
    Step::Expect(kinds.split('|').map(str::to_owned).collect())
}

const ANSWER: &str = "REJECT|ACK";

/// (name, description, steps).
fn scenarios() -> Vec<(&'static str, &'static str, Vec<Step>)> {
    let good_hello = hello("x.bin", 1);
    let mut truncated_body = encode_to_vec(&good_hello).unwrap_or_default();
    truncated_body.truncate(truncated_body.len() - 5);
    let mut trailing = encode_to_vec(&Message::Bye).unwrap_or_default();
    trailing.push(0);
    let mut oversized = encode_to_vec(&Message::Bye).unwrap_or_default();
    oversized.resize(5000, 0x55);
    let mut names = Vec::new();
    for n in hostile_names() {
        names.push(Step::Msg(hello(&n, 1)));
        names.push(expect("REJECT"));
    }
    names.push(Step::Msg(Message::Bye));
    let mib = 1u64 << 20;
    vec![
        (
            "bad-names",
            "a HELLO for every hostile name, each answered by REJECT, then BYE",
            names,
        ),
        (
            "empty-frame",
            "a zero-length SEND",
            vec![Step::Raw(vec![]), expect(ANSWER)],
        ),
        (
            "truncated-header",
            "6 bytes of a header",
            vec![
                Step::Raw(vec![0x52, 0x58, 0x46, 0x52, 1, 1]),
                expect(ANSWER),
            ],
        ),
        (
            "truncated-body",
            "a HELLO missing its last 5 bytes",
            vec![Step::Raw(truncated_body), expect(ANSWER)],
        ),
        (
            "bad-magic",
            "a HELLO whose magic is XXFR",
            vec![Step::Raw(patched(&good_hello, 0, b'X')), expect(ANSWER)],
        ),
        (
            "bad-wire-version",
            "a HELLO framed with wire version 2",
            vec![Step::Raw(patched(&good_hello, 4, 2)), expect(ANSWER)],
        ),
        (
            "bad-protocol-version",
            "a well-framed HELLO offering protocol version 999",
            vec![
                Step::Msg(Message::Hello(Hello {
                    version: 999,
                    caps: CAP_NONE,
                    name: "v.bin".into(),
                    size: 1,
                    mode: 0o644,
                    digest: DigestAlg::Crc32,
                    mtime: None,
                })),
                expect(ANSWER),
            ],
        ),
        (
            "unknown-type",
            "a frame of message type 99",
            vec![
                Step::Raw(vec![0x52, 0x58, 0x46, 0x52, 1, 99, 0, 0, 0, 0, 0, 0]),
                expect(ANSWER),
            ],
        ),
        (
            "bad-flags",
            "a BYE with reserved header flags set",
            vec![Step::Raw(patched(&Message::Bye, 7, 1)), expect(ANSWER)],
        ),
        (
            "trailing-bytes",
            "a BYE followed by a stray byte in the same SEND",
            vec![Step::Raw(trailing), expect(ANSWER)],
        ),
        (
            "huge-size",
            "a HELLO announcing u64::MAX bytes",
            vec![Step::Msg(hello("huge.bin", u64::MAX)), expect(ANSWER)],
        ),
        (
            "fin-before-hello",
            "a FIN as the first message",
            vec![
                Step::Msg(Message::Fin(Fin {
                    bytes: 0,
                    chunks: 0,
                    digest: Digest::Crc32(0),
                })),
                expect(ANSWER),
            ],
        ),
        (
            "fin-before-data",
            "HELLO of 1 MiB + 1, MR, then FIN(0 bytes) before any data",
            vec![
                Step::Msg(hello("early-fin.bin", mib + 1)),
                expect("MR"),
                Step::Msg(Message::Fin(Fin {
                    bytes: 0,
                    chunks: 0,
                    digest: Digest::Crc32(0),
                })),
                expect(ANSWER),
            ],
        ),
        (
            "hello-mid-file",
            "HELLO of 3 MiB, MR, one chunk written, then a second HELLO",
            vec![
                Step::Msg(hello("mid.bin", 3 * mib)),
                expect("MR"),
                Step::Writes {
                    count: 1,
                    len: None,
                    imm: Imm::Crc,
                },
                Step::Msg(hello("second.bin", 10)),
                expect(ANSWER),
            ],
        ),
        (
            "bad-chunk-crc",
            "HELLO of 3 MiB, MR, one chunk whose immediate is a wrong CRC32",
            vec![
                Step::Msg(hello("crc.bin", 3 * mib)),
                expect("MR"),
                Step::Writes {
                    count: 1,
                    len: None,
                    imm: Imm::Bad,
                },
                expect(ANSWER),
            ],
        ),
        (
            "chunk-past-size",
            "HELLO of 10 bytes, MR, then a whole slot written",
            vec![
                Step::Msg(hello("small.bin", 10)),
                expect("MR"),
                Step::Writes {
                    count: 1,
                    len: None,
                    imm: Imm::Crc,
                },
                expect(ANSWER),
            ],
        ),
        (
            "oversized-frame",
            "a 5000-byte SEND, larger than any receive buffer \
             (no answer is possible: the receiver's QP fails)",
            vec![Step::Raw(oversized), Step::ExpectDisconnect],
        ),
        (
            "hello-before-auth",
            "for a receiver with a token: a HELLO instead of the AUTH",
            vec![Step::Msg(hello("x.bin", 1)), expect(ANSWER)],
        ),
        (
            "auth-empty",
            "for a receiver with a token: an AUTH without a MAC (a sender without a token)",
            vec![Step::Auth(Vec::new()), expect(ANSWER)],
        ),
        (
            "auth-wrong-token",
            "for a receiver with a token: the MAC of the nonce under another token",
            vec![Step::Auth(b"not-the-token".to_vec()), expect(ANSWER)],
        ),
        (
            "auth-short-mac",
            "an AUTH frame carrying a 5-byte MAC",
            vec![
                Step::Raw(vec![
                    0x52, 0x58, 0x46, 0x52, 1, 9, 0, 0, 0, 0, 0, 7, 0, 5, 1, 2, 3, 4, 5,
                ]),
                expect(ANSWER),
            ],
        ),
        (
            "credit-from-sender",
            "a CREDIT (a receiver-only message) as the first message",
            vec![Step::Msg(Message::Credit { count: 1 }), expect(ANSWER)],
        ),
    ]
}

/// The command-line form of a step (what `parse_step` reads back).
fn step_arg(step: &Step) -> String {
    let pct = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_graphic() && !matches!(b, b'%' | b':' | b'|') {
                    (b as char).to_string()
                } else {
                    format!("%{b:02x}")
                }
            })
            .collect()
    };
    match step {
        Step::Raw(b) => format!("raw:{}", hex(b)),
        Step::Msg(Message::Hello(h)) => format!(
            "hello:{}:{}:{}:{}",
            pct(&h.name),
            if h.size == u64::MAX {
                "max".to_string()
            } else {
                h.size.to_string()
            },
            h.digest,
            h.version
        ),
        Step::Msg(Message::Fin(f)) => match f.digest {
            Digest::Crc32(c) => format!("fin:{}:{}:{c:x}", f.bytes, f.chunks),
            Digest::Sha256(_) => format!("fin:{}:{}", f.bytes, f.chunks),
        },
        Step::Msg(Message::Credit { count }) => format!("credit:{count}"),
        Step::Msg(Message::Bye) => "bye".into(),
        Step::Msg(m) => format!("({})", m.kind()),
        Step::Auth(t) => format!("auth:{}", pct(&String::from_utf8_lossy(t))),
        Step::Writes { count, len, imm } => format!(
            "writes:{count}:{}:{}",
            len.map(|l| l.to_string()).unwrap_or_default(),
            imm_arg(*imm)
        ),
        Step::WritesTo {
            addr,
            rkey,
            count,
            len,
            imm,
        } => format!(
            "writes-to:{}:{}:{count}:{}:{}",
            addr.map_or_else(|| "own".to_string(), |a| format!("{a:#x}")),
            rkey.map_or_else(|| "own".to_string(), |k| format!("{k:#x}")),
            len.map(|l| l.to_string()).unwrap_or_default(),
            imm_arg(*imm)
        ),
        Step::Expect(k) => format!("expect:{}", k.join("|")),
        Step::ExpectDisconnect => "expect-disconnect".into(),
        Step::Sleep(d) => format!("sleep:{}", d.as_millis()),
        Step::WaitFile(p) => format!("wait-file:{}", p.display()),
    }
}

fn imm_arg(imm: Imm) -> String {
    match imm {
        Imm::Crc => "crc".to_string(),
        Imm::Bad => "bad".to_string(),
        Imm::Value(v) => format!("{v:x}"),
    }
}

fn scenario_steps(name: &str) -> Result<Vec<Step>, String> {
    scenarios()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, steps)| steps)
        .ok_or_else(|| format!("unknown scenario {name:?} (see --list-scenarios)"))
}

// ---------------------------------------------------------------------------
// Output

fn reject_slug(c: RejectCode) -> &'static str {
    match c {
        RejectCode::BadName => "bad-name",
        RejectCode::Exists => "exists",
        RejectCode::TooLarge => "too-large",
        RejectCode::Version => "version",
        RejectCode::NoSpace => "no-space",
        RejectCode::Busy => "busy",
        RejectCode::Io => "io",
        RejectCode::Protocol => "protocol",
        RejectCode::Auth => "auth",
    }
}

fn ack_slug(s: AckStatus) -> &'static str {
    match s {
        AckStatus::Ok => "ok",
        AckStatus::Integrity => "integrity",
        AckStatus::Io => "io",
        AckStatus::Protocol => "protocol",
        AckStatus::Rejected => "rejected",
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The one-line form of a received message (strings Debug-quoted, so a
/// hostile reason can never break the line).
#[allow(unreachable_patterns)] // a newer protocol may add message kinds
fn describe(msg: &Message) -> String {
    match msg {
        Message::Hello(h) => format!(
            "HELLO version={} caps={} name={:?} size={} mode={:o} digest={}",
            h.version, h.caps, h.name, h.size, h.mode, h.digest
        ),
        Message::Mr(r) => format!(
            "MR addr={:#x} rkey={:#x} slot_size={} slot_count={}",
            r.addr, r.rkey, r.slot_size, r.slot_count
        ),
        Message::Reject(r) => format!("REJECT code={} reason={:?}", reject_slug(r.code), r.reason),
        Message::Credit { count } => format!("CREDIT count={count}"),
        Message::Fin(f) => format!(
            "FIN bytes={} chunks={} digest={}",
            f.bytes, f.chunks, f.digest
        ),
        Message::Ack(a) => format!("ACK status={} reason={:?}", ack_slug(a.status), a.reason),
        Message::Bye => "BYE".into(),
        Message::Challenge(c) => format!(
            "CHALLENGE flags={:#06x} auth_required={} nonce={}",
            c.flags,
            c.auth_required(),
            hex(&c.nonce)
        ),
        Message::Auth { mac } => format!("AUTH mac={}", hex(mac)),
        other => format!("{} {other:?}", other.kind()),
    }
}

fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}

// ---------------------------------------------------------------------------
// The connection

const RECV_BUFS: usize = 32;
/// Receive buffers are larger than any frame the receiver may send.
const RECV_BUF: usize = 2 * MAX_MESSAGE;
/// Room for oversized raw frames.
const SEND_BUF: usize = 64 << 10;
const RECV: u64 = 1 << 56;
const SEND: u64 = 2 << 56;
const WRITE: u64 = 3 << 56;
const KIND: u64 = 0xff << 56;

/// A received message (or undecodable frame), kept until an `expect` takes it.
struct Inbound {
    kind: String,
}

struct Client {
    ep: Endpoint,
    recv_pool: BufferPool,
    send_pool: BufferPool,
    /// The one send buffer, when not posted.
    send_buf: Option<Buffer>,
    /// The data buffer for writes (a pool of one slot) and its buffer when
    /// not posted.
    data: Option<(BufferPool, Option<Buffer>)>,
    ring: Option<RingInfo>,
    /// Nonce of the last CHALLENGE received.
    nonce: Option<[u8; NONCE_LEN]>,
    /// Chunks written into the current ring (slot = seq % slot_count).
    seq: u64,
    inbox: VecDeque<Inbound>,
    /// Work requests of ours not completed yet (sends and writes).
    outstanding: u32,
    disconnected: bool,
    /// Set once a work request failed: the QP is in the error state.
    broken: Option<String>,
    timeout: Duration,
    wcs: Vec<Completion>,
}

impl Client {
    fn connect(args: &Args) -> Result<Self, Failure> {
        let timeout = Duration::from_secs(args.timeout.max(1));
        let host = args.addr.as_deref().unwrap_or_default();
        let addr = resolve(host, args.port).map_err(|e| Failure::Connect(e.to_string()))?;
        let c = |e: SysError| Failure::Connect(format!("{addr}: {e}"));
        let channel = EventChannel::new().map_err(c)?;
        let id = CmId::new(&channel).map_err(c)?;
        id.resolve(args.source, addr, timeout).map_err(c)?;
        let caps = QpCaps {
            max_send_wr: 64,
            max_recv_wr: RECV_BUFS as u32,
        };
        let ep = Endpoint::new(id, caps, false).map_err(c)?;
        let (recv_pool, recv_bufs) = BufferPool::new(ep.pd(), RECV_BUF, RECV_BUFS).map_err(c)?;
        let (send_pool, mut send_bufs) = BufferPool::new(ep.pd(), SEND_BUF, 1).map_err(c)?;
        for buf in recv_bufs {
            let wr_id = RECV | buf.index() as u64;
            ep.post_recv(&recv_pool, buf, wr_id).map_err(c)?;
        }
        ep.cm_id().connect(timeout).map_err(c)?;
        eprintln!("raw-client: connected to {addr}");
        Ok(Client {
            ep,
            recv_pool,
            send_pool,
            send_buf: send_bufs.pop(),
            data: None,
            ring: None,
            nonce: None,
            seq: 0,
            inbox: VecDeque::new(),
            outstanding: 0,
            disconnected: false,
            broken: None,
            timeout,
            wcs: Vec::with_capacity(32),
        })
    }

    fn run(&mut self, step: &Step) -> Result<(), Failure> {
        match step {
            Step::Raw(bytes) => self.send(bytes, "raw frame"),
            Step::Msg(msg) => {
                let bytes = encode_to_vec(msg)
                    .map_err(|e| Failure::Usage(format!("cannot encode {}: {e}", msg.kind())))?;
                self.send(&bytes, &describe(msg))
            }
            Step::Auth(token) => {
                let mac = match Token::new(token.clone()) {
                    None => Vec::new(),
                    Some(t) => t.mac(&self.await_challenge()?).to_vec(),
                };
                self.run(&Step::Msg(Message::Auth { mac }))
            }
            Step::Writes { count, len, imm } => self.writes(*count, *len, *imm),
            Step::WritesTo {
                addr,
                rkey,
                count,
                len,
                imm,
            } => self.writes_to(*addr, *rkey, *count, *len, *imm),
            Step::Expect(kinds) => self.expect(kinds),
            Step::ExpectDisconnect => self.expect_disconnect(),
            Step::Sleep(d) => {
                std::thread::sleep(*d);
                self.pump(Duration::ZERO)
            }
            Step::WaitFile(path) => self.wait_file(path),
        }
    }

    fn send(&mut self, bytes: &[u8], what: &str) -> Result<(), Failure> {
        self.usable()?;
        let mut buf = self
            .send_buf
            .take()
            .ok_or_else(|| Failure::Ended("the send buffer was lost with a failed SEND".into()))?;
        match self.send_pool.bytes_mut(&mut buf, bytes.len()) {
            Ok(slot) => slot.copy_from_slice(bytes),
            Err(e) => {
                self.send_buf = Some(buf);
                return Err(Failure::Usage(format!(
                    "frame of {} bytes: {e}",
                    bytes.len()
                )));
            }
        }
        self.ep
            .post_send(&self.send_pool, buf, bytes.len(), SEND)
            .map_err(|e| Failure::Ended(format!("cannot post a SEND: {e}")))?;
        self.outstanding += 1;
        eprintln!("raw-client: sent {what} ({} bytes)", bytes.len());
        // One send buffer: wait until the NIC is done with it.
        self.drain_outstanding("the SEND to complete")
    }

    fn writes(&mut self, count: u32, len: Option<u32>, imm: Imm) -> Result<(), Failure> {
        self.usable()?;
        let ring = self
            .ring
            .ok_or_else(|| Failure::Usage("writes: no MR received yet".into()))?;
        let len = len.unwrap_or(ring.slot_size) as usize;
        for _ in 0..count {
            let seq = self.seq;
            let slot = seq % u64::from(ring.slot_count.max(1));
            let remote = ring
                .addr
                .wrapping_add(slot.wrapping_mul(u64::from(ring.slot_size)));
            let imm = self.write(len, seq, remote, ring.rkey, imm)?;
            self.seq += 1;
            eprintln!("raw-client: wrote chunk {seq} ({len} bytes, imm {imm:08x}) to slot {slot}");
            if self.broken.is_some() {
                break;
            }
        }
        Ok(())
    }

    /// Writes to wherever we are told, not where the protocol says: the
    /// data of write `i` is the pattern of chunk `i`.
    fn writes_to(
        &mut self,
        addr: Option<u64>,
        rkey: Option<u32>,
        count: u32,
        len: Option<u32>,
        imm: Imm,
    ) -> Result<(), Failure> {
        self.usable()?;
        let own = || {
            self.ring
                .ok_or_else(|| Failure::Usage("writes-to: 'own' but no MR received yet".into()))
        };
        let addr = match addr {
            Some(a) => a,
            None => own()?.addr,
        };
        let rkey = match rkey {
            Some(k) => k,
            None => own()?.rkey,
        };
        let len = len.or(self.ring.map(|r| r.slot_size)).unwrap_or(4096) as usize;
        for i in 0..u64::from(count) {
            let remote = addr.wrapping_add(i.wrapping_mul(len as u64));
            eprintln!("raw-client: writing {len} bytes to {remote:#x} with rkey {rkey:#x}");
            self.write(len, i, remote, rkey, imm)?;
            if self.broken.is_some() {
                break;
            }
            say(&format!(
                "WRITE_OK addr={remote:#x} rkey={rkey:#x} len={len}"
            ));
        }
        Ok(())
    }

    /// One RDMA WRITE_WITH_IMM of `len` bytes of the pattern of chunk `seq`,
    /// waited for (a failure sets `broken` and prints WR_FAILED); returns
    /// the immediate sent.
    fn write(
        &mut self,
        len: usize,
        seq: u64,
        remote: u64,
        rkey: u32,
        imm: Imm,
    ) -> Result<u32, Failure> {
        if self
            .data
            .as_ref()
            .is_none_or(|(pool, buf)| pool.slot_size() < len.max(1) || buf.is_none())
        {
            let (pool, mut bufs) = BufferPool::new(self.ep.pd(), len.max(1), 1)
                .map_err(|e| Failure::Usage(format!("cannot register {len} bytes: {e}")))?;
            self.data = Some((pool, bufs.pop()));
        }
        let Some((pool, Some(mut buf))) = self.data.take() else {
            return Err(Failure::Usage("no data buffer".into()));
        };
        let data = pool
            .bytes_mut(&mut buf, len)
            .map_err(|e| Failure::Usage(e.to_string()))?;
        for (i, b) in data.iter_mut().enumerate() {
            *b = (i as u64).wrapping_mul(31).wrapping_add(seq) as u8;
        }
        let crc = crc32fast::hash(data);
        let imm = match imm {
            Imm::Crc => crc,
            Imm::Bad => !crc,
            Imm::Value(v) => v,
        };
        let target = RemoteTarget { addr: remote, rkey };
        let posted = self
            .ep
            .post_write_imm(&pool, buf, len, target, imm, WRITE | seq)
            .map_err(|e| Failure::Ended(format!("cannot post a write: {e}")));
        // The buffer comes back with the completion (see on_completion).
        self.data = Some((pool, None));
        posted?;
        self.outstanding += 1;
        self.drain_outstanding("the RDMA write to complete")?;
        Ok(imm)
    }

    /// Waits for a file to appear (the test's go-ahead), handling whatever
    /// arrives meanwhile.
    fn wait_file(&mut self, path: &std::path::Path) -> Result<(), Failure> {
        eprintln!("raw-client: waiting for {}", path.display());
        let deadline = Instant::now() + self.timeout;
        while !path.exists() {
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!(
                    "{} did not appear within {}s",
                    path.display(),
                    self.timeout.as_secs()
                )));
            }
            if self.broken.is_some() || self.disconnected {
                std::thread::sleep(Duration::from_millis(100));
            } else {
                self.pump(Duration::from_millis(100))?;
            }
        }
        Ok(())
    }

    fn expect(&mut self, kinds: &[String]) -> Result<(), Failure> {
        let want = kinds.join("|");
        let deadline = Instant::now() + self.timeout;
        loop {
            while let Some(m) = self.inbox.pop_front() {
                if kinds.iter().any(|k| k == "ANY" || *k == m.kind) {
                    return Ok(());
                }
                eprintln!("raw-client: skipped {} while waiting for {want}", m.kind);
            }
            if self.disconnected || self.broken.is_some() {
                return Err(Failure::Ended(format!(
                    "no {want} before the connection ended{}",
                    self.broken
                        .as_ref()
                        .map(|b| format!(" ({b})"))
                        .unwrap_or_default()
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Failure::Timeout(format!(
                    "no {want} within {}s",
                    self.timeout.as_secs()
                )));
            }
            self.pump(left.min(Duration::from_millis(200)))?;
        }
    }

    /// The nonce of the receiver's CHALLENGE, waiting for it if needed
    /// (the CHALLENGE itself stays in the inbox for a later `expect`).
    fn await_challenge(&mut self) -> Result<[u8; NONCE_LEN], Failure> {
        let deadline = Instant::now() + self.timeout;
        loop {
            if let Some(n) = self.nonce {
                return Ok(n);
            }
            self.usable()?;
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!(
                    "no CHALLENGE within {}s",
                    self.timeout.as_secs()
                )));
            }
            self.pump(Duration::from_millis(200))?;
        }
    }

    fn expect_disconnect(&mut self) -> Result<(), Failure> {
        let deadline = Instant::now() + self.timeout;
        while !self.disconnected {
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!(
                    "the receiver kept the connection open for {}s",
                    self.timeout.as_secs()
                )));
            }
            self.pump(Duration::from_millis(200))?;
        }
        Ok(())
    }

    fn usable(&self) -> Result<(), Failure> {
        if let Some(b) = &self.broken {
            return Err(Failure::Ended(format!("the connection is broken: {b}")));
        }
        if self.disconnected {
            return Err(Failure::Ended("the receiver disconnected".into()));
        }
        Ok(())
    }

    fn drain_outstanding(&mut self, what: &str) -> Result<(), Failure> {
        let deadline = Instant::now() + self.timeout;
        while self.outstanding > 0 {
            // A peer that disconnected will never acknowledge them; some
            // kernels (6.12's rxe) complete them only after the whole
            // retry budget, so stop waiting.
            if self.disconnected {
                eprintln!(
                    "raw-client: the peer disconnected while waiting for {what}: {} request(s) left",
                    self.outstanding
                );
                self.outstanding = 0;
                break;
            }
            if Instant::now() >= deadline {
                return Err(Failure::Timeout(format!("waiting for {what}")));
            }
            self.pump(Duration::from_millis(200))?;
        }
        Ok(())
    }

    /// Waits up to `wait` for completions (or a disconnect) and handles them.
    fn pump(&mut self, wait: Duration) -> Result<(), Failure> {
        let mut wcs = std::mem::take(&mut self.wcs);
        wcs.clear();
        let got = if wait.is_zero() {
            self.ep.poll(&mut wcs, 32)
        } else {
            self.ep.wait(&mut wcs, 32, wait, "completions")
        };
        // Successful completions are in `wcs` even when another one failed.
        for wc in wcs.drain(..) {
            self.on_completion(wc)?;
        }
        self.wcs = wcs;
        match got {
            Ok(_) | Err(SysError::Timeout { .. }) => {}
            Err(e) => {
                if self.broken.is_none() {
                    // Reported, not fatal: an `expect` after it fails unless
                    // the answer came anyway, `expect-disconnect` still works.
                    say(&format!("WR_FAILED error={:?}", e.to_string()));
                    self.broken = Some(e.to_string());
                    self.outstanding = 0;
                }
            }
        }
        if !self.disconnected && self.ep.cm_id().peer_disconnected() {
            // Whatever the receiver sent before disconnecting is already in
            // the CQ: take it first, so DISCONNECTED prints after it.
            let mut wcs = std::mem::take(&mut self.wcs);
            wcs.clear();
            let _ = self.ep.poll(&mut wcs, 32);
            for wc in wcs.drain(..) {
                self.on_completion(wc)?;
            }
            self.wcs = wcs;
            self.disconnected = true;
            say("DISCONNECTED");
        }
        Ok(())
    }

    fn on_completion(&mut self, wc: Completion) -> Result<(), Failure> {
        match (wc.wr_id & KIND, wc.opcode) {
            (SEND, WcOpcode::Send) => {
                self.outstanding = self.outstanding.saturating_sub(1);
                self.send_buf = wc.buffer;
            }
            (WRITE, WcOpcode::RdmaWrite) => {
                self.outstanding = self.outstanding.saturating_sub(1);
                if let Some((_, slot)) = self.data.as_mut() {
                    *slot = wc.buffer;
                }
            }
            (RECV, WcOpcode::Recv) => {
                let Some(buf) = wc.buffer else {
                    return Err(Failure::Ended(
                        "a receive came back without its buffer".into(),
                    ));
                };
                let len = wc.byte_len as usize;
                let inbound = match self.recv_pool.bytes(&buf, len.min(RECV_BUF)) {
                    Ok(bytes) => match decode(bytes) {
                        Ok(msg) => {
                            say(&describe(&msg));
                            match &msg {
                                Message::Mr(r) => {
                                    self.ring = Some(*r);
                                    self.seq = 0;
                                }
                                Message::Challenge(c) => self.nonce = Some(c.nonce),
                                _ => {}
                            }
                            Inbound {
                                kind: msg.kind().to_string(),
                            }
                        }
                        Err(e) => {
                            say(&format!(
                                "UNDECODED len={len} error={:?} hex={}",
                                e.to_string(),
                                hex(&bytes[..bytes.len().min(64)])
                            ));
                            Inbound {
                                kind: "UNDECODED".into(),
                            }
                        }
                    },
                    Err(e) => return Err(Failure::Ended(format!("receive buffer: {e}"))),
                };
                self.inbox.push_back(inbound);
                if self.broken.is_none() && !self.disconnected {
                    self.ep
                        .post_recv(&self.recv_pool, buf, wc.wr_id)
                        .map_err(|e| Failure::Ended(format!("cannot repost a receive: {e}")))?;
                }
            }
            (_, WcOpcode::RecvWithImm) => {
                say(&format!(
                    "WRITE_IMM len={} imm={:#x}",
                    wc.byte_len,
                    wc.imm.unwrap_or(0)
                ));
            }
            (kind, opcode) => {
                eprintln!("raw-client: unexpected completion {opcode:?} for kind {kind:#x}");
            }
        }
        Ok(())
    }

    fn close(self) {
        if !self.disconnected {
            self.ep.cm_id().disconnect(Duration::from_secs(1));
        }
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list_scenarios {
        for (name, about, steps) in scenarios() {
            println!("{name}: {about}");
            let args: Vec<String> = steps.iter().map(step_arg).collect();
            println!("    {}", args.join(" "));
        }
        return ExitCode::SUCCESS;
    }
    let mut steps = Vec::new();
    if let Some(name) = &args.scenario {
        match scenario_steps(name) {
            Ok(s) => steps.extend(s),
            Err(e) => return fail(Failure::Usage(e)),
        }
    }
    for arg in &args.steps {
        match parse_step(arg) {
            Ok(s) => steps.push(s),
            Err(e) => return fail(Failure::Usage(e)),
        }
    }
    let mut client = match Client::connect(&args) {
        Ok(c) => c,
        Err(e) => return fail(e),
    };
    for step in &steps {
        if let Err(e) = client.run(step) {
            client.close();
            return fail(e);
        }
    }
    client.close();
    ExitCode::SUCCESS
}

fn fail(e: Failure) -> ExitCode {
    eprintln!("raw-client: {e}");
    ExitCode::from(e.exit_code())
}
