//! Property-based fuzzing (proptest) of everything a peer's bytes reach
//! before any I/O happens: the control-message codec and both session state
//! machines. No RDMA needed.
//!
//! - `decode_*`: the decoder on arbitrary bytes and on mutated valid frames
//!   never panics, and whatever it accepts re-encodes to the same bytes;
//!   `decode(encode(m)) == m` for generated messages.
//! - `machine_receiver`: a `ReceiverSession` fed arbitrary sequences of
//!   decoded messages, chunk completions and engine decisions never panics,
//!   never places a chunk outside the ring or past the offered size (a
//!   stream's: --max-size), never hands out an MR without an accepted file
//!   HELLO (nor for a directory), never accepts a path that could leave its
//!   directory, and every protocol error closes the session for good.
//!   Resuming: FROM only at 0 or HAVE's prefix, COMPARE only after a HAVE
//!   of a complete copy, then the engine's verdict (ACK or HAVE of nothing).
//!   `--checksum`: a HAVE asking for the digest only for an offer with
//!   CHECKSUM (files only, batch members included), once, then COMPARE
//!   and the same verdicts; an offer with CHECKSUM not asked goes on as
//!   any other. One engine decision at a time: a message that asks the
//!   engine to decide leaves the machine waiting for the answer, and no
//!   message asks for another meanwhile (so engine work needs no queue).
//! - `machine_sender`: a `SenderSession` fed arbitrary receiver messages and
//!   engine calls (files, streams, directories, pipelined) never panics,
//!   never plans a write outside the ring or beyond its credits, hands out
//!   verdicts in the order the entries were sent, and every error closes
//!   the session; COMPARE only answers a HAVE of a complete copy (or one
//!   asking for the digest of an offer with CHECKSUM, in AWAIT_RING or
//!   AWAIT_HAVE), and its ACK is the file's verdict (nothing sent, nothing
//!   left pending). With
//!   a token it never offers an entry before a correct AUTH_OK, and
//!   refuses a receiver that does not ask for authentication. Its timers
//!   (synthetic instants): a receiver silent for the timeout ends the
//!   session, saying what was awaited; a KEEPALIVE only while a stream
//!   waits for its input or a file is read for a HAVE. A HAVE waits for
//!   the engine's `start_from` or `compare`: no HAVE or MR meanwhile.
//! - Relay chains (protocol 7), in both machine properties: RELAY and
//!   RESULT come as the peer's input in every state; the receiver takes a
//!   RELAY only from an authenticated sender before its first offer,
//!   within MAX_RELAY_HOPS, when it relays (else one reply, the session
//!   over), and the sender a RESULT only after its own `relay`, while an
//!   offer awaits its verdict, one per host of the chain per offer. The
//!   engines' `relay` and `push_result` are called anywhere: a misuse
//!   never panics and queues nothing. A relaying receiver's engine waits
//!   for the hosts after it (`work_started` in AWAIT_DECISION and
//!   VERIFYING, misuse elsewhere and outside a relaying session): a
//!   KEEPALIVE every interval until its verdict, no timeout meanwhile; a
//!   relaying sender takes KEEPALIVE wherever it takes RESULT.
//! - `decode_sealed`: sealed control messages (protocol 3) through a
//!   sender/receiver channel pair, delivered in order, replayed, reordered,
//!   dropped, bit-flipped, truncated, extended or reflected: exactly the
//!   genuine next message opens, to its exact frame; nothing else does, and
//!   a refused one never advances the sequence.
//! - The receiver property drives the v3 handshake (PROVE with right,
//!   wrong, relayed and other-version proofs; AUTH_OK checked against the
//!   sender's key) and checks that the channel both sides get interoperates.
//!
//! One module per property (`decode.rs`, `handshake.rs`, `receiver.rs`,
//! `sender.rs`), the generators they share in `strategies.rs`, and the
//! runner that counts how deep the inputs got here.
//!
//! The number of cases per property is proptest's: `PROPTEST_CASES`
//! (default 256, a few seconds in all). `make fuzz` runs >= 1 million.
//! Each property prints its case and input counts (`--nocapture` shows them).

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use rdma_xfer::proto::wire::{HEADER_LEN, MAX_BODY};
use rdma_xfer::proto::{
    AUTH_REQUIRED, Ack, AckStatus, CHUNK_TAG_LEN, Challenge, Channel, ChannelError, ConnectionId,
    DEFAULT_MAX_FILES, Digest, DigestAlg, DigestBudget, FileOffer, Fin, Have, HaveKind, Hello,
    HopResult, HopVerdict, MAX_BATCH_FILES, MAX_HOST_LEN, MAX_MESSAGE, MAX_PENDING,
    MAX_REFUSALS_IN_A_ROW, MAX_RELAY_HOPS, Message, Mtime, NONCE_LEN, NameRules, OfferKind,
    PROTOCOL_VERSION, Pending, ProtocolError, Prove, ReceiverConfig, ReceiverEvent,
    ReceiverSession, ReceiverState, RecvError, Reject, RejectCode, Relay, RingInfo, Role, SEAL_LEN,
    SameCopy, SenderAuth, SenderEvent, SenderSession, SenderState, SessionKey, Token, Verdict,
    WhenExisting, decode, encode_to_vec, hello_flags, is_invisible, relay_messages, validate_path,
};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// How deep the generated inputs got (printed with the counts, so a weak
/// generator shows): frames decoded, chunks placed, files verified, ...
struct Reached([AtomicU64; 16]);

impl Reached {
    const fn new() -> Self {
        Reached([const { AtomicU64::new(0) }; 16])
    }
    fn hit(&self, i: usize) {
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
    fn get(&self, i: usize) -> u64 {
        self.0[i].load(Ordering::Relaxed)
    }
}

/// Runs `test` on `PROPTEST_CASES` values of `strategy`; prints the counts.
/// `inputs` is what one case feeds the code under test (1 for a frame, the
/// number of events for a session).
fn fuzz<S: Strategy>(
    name: &str,
    strategy: S,
    inputs: impl Fn(&S::Value) -> u64,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
    reached: impl Fn() -> String,
) {
    let config = Config {
        // Failures print the shrunk input; no regression files in the tree.
        failure_persistence: None,
        ..Config::default() // reads PROPTEST_CASES
    };
    let cases = config.cases;
    let mut runner = TestRunner::new(config);
    let fed = AtomicU64::new(0);
    let ran = AtomicU64::new(0);
    let started = Instant::now();
    let result = runner.run(&strategy, |v| {
        ran.fetch_add(1, Ordering::Relaxed);
        fed.fetch_add(inputs(&v), Ordering::Relaxed);
        test(v)
    });
    if let Err(e) = result {
        panic!("{name}: {e}");
    }
    eprintln!(
        "fuzz {name}: {cases} cases ({} run), {} inputs in {:.1}s; reached: {}",
        ran.load(Ordering::Relaxed),
        fed.load(Ordering::Relaxed),
        started.elapsed().as_secs_f64(),
        reached()
    );
}

/// What one call of a machine queued, as the model expects it: its one
/// message when the call was taken, nothing when it was refused.
fn one_message<E: std::fmt::Debug>(
    result: Result<(), E>,
    mut queued: Vec<Message>,
) -> Result<Message, E> {
    match result {
        Ok(()) => {
            assert_eq!(queued.len(), 1, "one message per call: {queued:?}");
            Ok(queued.remove(0))
        }
        Err(e) => {
            assert!(
                queued.is_empty(),
                "a refused call queued {queued:?} ({e:?})"
            );
            Err(e)
        }
    }
}

mod decode;
mod handshake;
mod receiver;
mod sender;
mod strategies;
