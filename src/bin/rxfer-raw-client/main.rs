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
//!
//! Layout: `steps` (what a step is, parsed from and printed as an
//! argument), `scenarios` (the named step lists the tests use), `client`
//! (the connection that runs the steps) and `output` (the printed lines).
#![forbid(unsafe_code)]

mod client;
mod output;
mod scenarios;
mod steps;

use clap::Parser;
use client::Client;
use output::say;
use scenarios::{scenario_steps, scenarios};
use std::net::IpAddr;
use std::process::ExitCode;
use steps::{Step, parse_step, step_arg};

#[derive(Parser, Debug)]
#[command(
    about = "TEST ONLY: connect to a receiver and send hostile control messages.",
    after_help = STEPS_HELP
)]
pub(crate) struct Args {
    /// Receiver's address.
    #[arg(required_unless_present = "list_scenarios")]
    pub(crate) addr: Option<String>,
    /// Steps, run in order after the --scenario's steps (see below).
    pub(crate) steps: Vec<String>,
    /// Receiver's port.
    #[arg(long, default_value_t = 7471)]
    pub(crate) port: u16,
    /// Local address to connect from (picks the RDMA device and port).
    #[arg(long, value_name = "ADDR")]
    pub(crate) source: Option<IpAddr>,
    /// A named scenario whose steps run first (--list-scenarios shows them).
    #[arg(long, value_name = "NAME")]
    pub(crate) scenario: Option<String>,
    /// Seconds to wait for the connection and for each expected answer.
    #[arg(long, default_value_t = 10)]
    pub(crate) timeout: u64,
    /// Print the named scenarios and their steps, then exit.
    #[arg(long)]
    pub(crate) list_scenarios: bool,
    /// Post no receive buffers: take none of the receiver's messages.
    #[arg(long)]
    pub(crate) no_receives: bool,
}

const STEPS_HELP: &str = "Steps (one argument each):
  raw:HEX                 send these bytes as one SEND (HEX may be empty; '_' is ignored)
  hello:NAME[:SIZE[:DIGEST[:VERSION]]]
                          send an encoded HELLO; NAME is %-decoded (%2f = '/', %00 = NUL,
                          %3a = ':'); SIZE a number or 'max' (u64::MAX); DIGEST crc32|sha256;
                          VERSION this build's by default
  fin:BYTES:CHUNKS[:CRC]  send an encoded FIN with a crc32 digest (hex, default 0)
  credit:N | bye          send an encoded CREDIT / BYE
  auth:TOKEN              send protocol 2's AUTH with HMAC-SHA256(TOKEN, nonce of the last
                          CHALLENGE received); TOKEN is %-decoded; 'auth:' sends an empty MAC
  prove:TOKEN[:NONCE_FROM[:CONN_FROM]]
                          send a protocol-3 PROVE with TOKEN's proof over the CHALLENGE nonce
                          of connection NONCE_FROM and the identity (addresses, QPNs) of
                          connection CONN_FROM (default: the current one; a relay uses
                          another). Honest: the AUTH_OK is checked (AUTH_OK verified=...) and
                          every later message sealed / opened
  conn:N                  switch to connection N (1-based), connecting it if new
  bad-mac                 the next sealed message goes out with a wrong tag
  replay                  send the last sealed message again, byte for byte
  writes:N[:LEN[:IMM]]    N RDMA WRITE_WITH_IMM of LEN bytes (default: the slot size) into
                          the next ring slots of the last MR received; IMM is the CRC32 of
                          the data unless given as hex or 'bad' (a wrong CRC32)
  writes-to:ADDR:RKEY:N[:LEN[:IMM]]
                          N RDMA WRITE_WITH_IMM of LEN bytes (default: the last MR's slot
                          size, else 4096) to ADDR, ADDR+LEN, ... with RKEY (hex, e.g. taken
                          from an earlier MR line: another session's ring or a stale one;
                          'own' = the last MR's address / rkey); each completed write prints
                          WRITE_OK
  rewrite:N[:LEN]         N plain RDMA WRITEs (no immediate: the receiver gets no completion)
                          of LEN bytes (default: the slot size) of other data over the slot
                          of the last data write, each waited for; prints REWRITE_OK N
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
/// Why the run stopped early.
#[derive(Debug)]
pub(crate) enum Failure {
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

fn main() -> ExitCode {
    let args = Args::parse();
    if args.list_scenarios {
        for (name, about, steps) in scenarios() {
            let args: Vec<String> = steps.iter().map(step_arg).collect();
            say(&format!("{name}: {about}\n    {}", args.join(" ")));
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
    let mut clients = match Client::connect(&args) {
        Ok(c) => vec![c],
        Err(e) => return fail(e),
    };
    let mut current = 0;
    for step in &steps {
        let result = match step {
            Step::Conn(n) if *n == 0 || *n > clients.len() + 1 => Err(Failure::Usage(format!(
                "conn:{n}: connections are numbered 1.."
            ))),
            Step::Conn(n) => {
                if *n > clients.len() {
                    match Client::connect(&args) {
                        Ok(c) => clients.push(c),
                        Err(e) => {
                            close_all(clients);
                            return fail(e);
                        }
                    }
                }
                current = n - 1;
                say(&format!("CONN {n}"));
                Ok(())
            }
            Step::Prove {
                token,
                nonce_from,
                conn_from,
            } => prove(&mut clients, current, token, *nonce_from, *conn_from),
            step => clients[current].run(step),
        };
        if let Err(e) = result {
            close_all(clients);
            return fail(e);
        }
    }
    close_all(clients);
    ExitCode::SUCCESS
}

/// A PROVE on the current connection, made from what another one saw.
fn prove(
    clients: &mut [Client],
    current: usize,
    token: &[u8],
    nonce_from: Option<usize>,
    conn_from: Option<usize>,
) -> Result<(), Failure> {
    let pick = |n: Option<usize>| match n {
        None => Ok(current),
        Some(n) if (1..=clients.len()).contains(&n) => Ok(n - 1),
        Some(n) => Err(Failure::Usage(format!("prove: no connection {n}"))),
    };
    let (nonce_at, conn_at) = (pick(nonce_from)?, pick(conn_from)?);
    let nonce = clients[nonce_at].await_challenge()?;
    let conn = clients[conn_at].identity();
    clients[current].send_prove(
        token,
        nonce,
        conn,
        nonce_at == current && conn_at == current,
    )
}

fn close_all(clients: Vec<Client>) {
    for c in clients {
        c.close();
    }
}

fn fail(e: Failure) -> ExitCode {
    eprintln!("raw-client: {e}");
    ExitCode::from(e.exit_code())
}
