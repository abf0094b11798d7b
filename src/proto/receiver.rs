//! Receiver side of a session. The engine feeds the machine decoded
//! messages, undecodable frames and WRITE_WITH_IMM completions, and sends
//! whatever the machine queues in reply (`poll_transmit`: the CHALLENGE
//! first, then a REJECT for a refused offer, an ACK ending a session the
//! peer broke); the messages that carry the engine's own decisions (MR,
//! REJECT, ACK, CREDIT) are the return values of `accept`, `reject`,
//! `complete`, `abort` and `chunk_done`. The engine builds no message. With
//! a token, nothing but a correct PROVE (or BYE) is accepted first, so no
//! HELLO is considered and no ring is exposed before the sender has proven
//! the secret; the AUTH_OK that proves the receiver follows, and from then
//! on the engine seals and opens every control message with the channel
//! `admit` hands out.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use thiserror::Error;

use super::auth::{
    AUTH_REQUIRED, CHUNK_TAG_LEN, Channel, ChannelError, ChunkAuth, ChunkKey, ConnectionId,
    NONCE_LEN, Role, SessionKey, Token,
};
use super::names::{NameRules, escaped, validate_path};
use super::sender::keepalive_interval;
use super::wire::{
    Ack, AckStatus, Challenge, Digest, DigestAlg, Fin, Have, HaveKind, Hello, HopResult,
    MAX_RELAY_HOPS, Message, Mtime, Prove, Reject, RejectCode, Relay, RingInfo, WireError,
    encoded_len, hello_flags,
};
use super::{MAX_BATCH_FILES, PROTOCOL_VERSION, ProtocolError, check_ring};

/// Where a receiver's session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReceiverState {
    /// CHALLENGE (auth required) sent; only PROVE or BYE may come.
    AwaitAuth,
    /// The sender proved the token; the engine decides whether a session
    /// is free: `admit` (AUTH_OK) or `refuse_busy` (REJECT(busy)). Nothing
    /// from the sender is accepted meanwhile.
    AwaitAdmission,
    /// Between files: the next HELLO (or BYE) may come.
    AwaitHello,
    /// HELLO passed the pure checks; the engine must `accept` (a file or
    /// stream), `accept_directory` (a directory) or `reject`.
    AwaitDecision,
    /// HAVE sent for an offer with RESUME (or CHECKSUM): the sender's FROM
    /// says where its data starts (then AwaitDecision), or, for a complete
    /// copy or a request for its digest, its COMPARE gives its file's
    /// SHA-256 (then Comparing).
    AwaitFrom,
    /// COMPARE arrived; the engine compares its copy and calls `same`
    /// (ACK) or `have` with nothing (it differs; FROM 0 follows).
    Comparing,
    /// MR sent: the file's chunks arrive, until its FIN.
    Receiving,
    /// FIN arrived; the engine verifies and calls `complete`.
    Verifying,
    /// BYE arrived, or an error ended the session; nothing more is accepted.
    Closed,
}

impl ReceiverState {
    /// The state's name, for error messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AwaitAuth => "AWAIT_AUTH",
            Self::AwaitAdmission => "AWAIT_ADMISSION",
            Self::AwaitHello => "AWAIT_HELLO",
            Self::AwaitDecision => "AWAIT_DECISION",
            Self::Receiving => "RECEIVING",
            Self::Verifying => "VERIFYING",
            Self::AwaitFrom => "AWAIT_FROM",
            Self::Comparing => "COMPARING",
            Self::Closed => "CLOSED",
        }
    }
}

/// The receiver's limits, fixed for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReceiverConfig {
    /// Size of each ring slot: the longest chunk accepted.
    pub slot_size: u32,
    /// Number of ring slots: the most chunks in flight (credits) at once.
    pub slot_count: u32,
    /// Return credits once this many slots are free (clamped to 1..=slot_count,
    /// since a larger batch would starve the sender forever).
    pub credit_batch: u32,
    /// Largest accepted file or stream; `u64::MAX` = no limit. A stream is
    /// checked as its chunks arrive.
    pub max_size: u64,
    /// Most entries (HELLOs, refused ones included) one session may offer;
    /// the one past it ends the session, so a peer cannot offer forever.
    pub max_files: u64,
    /// Most bytes one session may bring, over all its files and streams;
    /// `u64::MAX` = no limit.
    pub max_session_bytes: u64,
    /// What names the receiver's options allow (`--allow-dotfiles`).
    pub names: NameRules,
    /// How much comparing one session may ask of the receiver (see
    /// `DigestBudget`).
    pub digest_budget: DigestBudget,
    /// How long the session waits for the sender without progress
    /// (`--timeout`; for the sender's PROVE, `AUTH_TIMEOUT` at most); while
    /// the engine's own file work keeps the sender waiting, a KEEPALIVE
    /// goes out every `keepalive_interval` of it instead.
    pub timeout: Duration,
    /// Whether this receiver relays (protocol 7): it takes a RELAY from an
    /// authenticated sender. When false, a RELAY ends the session with
    /// REJECT(protocol) "this receiver does not relay (it runs without --allow-relay)".
    pub relay_allowed: bool,
}

/// How many digest questions one session may ask, and of how many bytes
/// in all: HAVEs of a complete copy or asking for a file's SHA-256 (with
/// CHECKSUM, for --link-dest or --exec), each followed by a COMPARE that
/// makes the receiver read a whole file to hash it (or the sender read
/// its file twice). Without a bound, a sender offering file after file of
/// sizes the receiver holds would make it read them all for nothing; past
/// it the engine asks no more (`ReceiverSession::why_not_compare`) and the
/// files are sent whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestBudget {
    /// Most digest questions.
    pub questions: u32,
    /// Most bytes the files asked about may add up to.
    pub bytes: u64,
}

impl DigestBudget {
    /// The receiver's budget per session: 65,536 questions, 1 TiB.
    pub const DEFAULT: DigestBudget = DigestBudget {
        questions: 1 << 16,
        bytes: 1 << 40,
    };
}

/// Default of `ReceiverConfig::max_files` (`receiver --max-files`).
pub const DEFAULT_MAX_FILES: u64 = 1_000_000;

/// Offers refused in a row (nothing accepted in between) after which the
/// session ends: a session that only produces refusals costs the receiver
/// work and log lines for nothing.
pub const MAX_REFUSALS_IN_A_ROW: u32 = 100;

/// Where an arrived chunk is in the ring and where it belongs in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkPlacement {
    /// The chunk's sequence number in its file (0-based).
    pub seq: u64,
    /// The ring slot holding it (`seq % slot_count`).
    pub slot: u32,
    /// Byte offset inside the ring (= slot * slot_size).
    pub slot_offset: u64,
    /// Byte offset in the file.
    pub file_offset: u64,
    /// Length in bytes.
    pub len: u32,
    /// The CRC32 the sender sent as the immediate data; the engine checks
    /// the slot's bytes against it.
    pub expected_crc: u32,
    /// With a token: the chunk's tag follows its bytes in the slot
    /// (`CHUNK_TAG_LEN` bytes at `slot_offset + len`), and the engine uses
    /// no byte of it before the tag checks out with this (for the chunk's
    /// offset, `file_offset`).
    pub auth: Option<ChunkAuth>,
}

/// What a received message means for the engine. `F` and `W` are the
/// engine's data the machine carried for the offer (see `ReceiverSession`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiverEvent<F = (), W = (), C = ()> {
    /// Version, name and size passed; the engine does its I/O checks and calls
    /// `accept` or `reject`.
    Offer(Hello),
    /// A BATCH of plain files passed the same checks as a HELLO each: the
    /// engine checks them on disk and calls `accept` (their bytes arrive
    /// back to back, as one file of their total size) or `reject` (the
    /// whole batch; the sender then offers each file on its own).
    Batch(Vec<Hello>),
    /// All data arrived; the engine verifies the digest, fsyncs, renames, then
    /// calls `complete`. The file's data given to `accept` comes back.
    Fin(Fin, F),
    /// The sender said BYE.
    Closed,
    /// PROVE carried the right proof. The engine decides at once whether
    /// the sender gets a session: `admit` queues AUTH_OK and returns the
    /// channel (install it after sending AUTH_OK; HELLOs are welcome then),
    /// `refuse_busy` queues REJECT(busy) and ends the session.
    Authenticated,
    /// KEEPALIVE: the sender waits for its input; progress for the timeout.
    Keepalive,
    /// FROM answered the HAVE: where the sender's data starts, 0 or the
    /// prefix. The engine calls `accept` (or `reject`), and the data
    /// continues the prefix.
    From {
        /// The first byte the sender will write.
        offset: u64,
        /// What the engine gave `have`.
        waiting: W,
    },
    /// COMPARE answered the HAVE of a complete copy (or a digest
    /// request): the engine computes its copy's SHA-256 and calls `same`
    /// or `have_found` (nothing).
    Compare {
        /// SHA-256 of the sender's file.
        sha256: [u8; 32],
        /// What the HAVE asked about (`have_found`'s complete copy,
        /// `ask_digest`'s).
        copy: C,
        /// What the engine gave `have`.
        waiting: W,
    },
    /// RELAY: hosts after this receiver in a relay chain, in chain order
    /// (one event per RELAY; the engine appends them). Only from an
    /// authenticated sender, before its first offer, with
    /// `ReceiverConfig::relay_allowed`. From then on the engine may
    /// `push_result` while an offer is open.
    Relay(Vec<String>),
}

/// Why a sender was not authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthFailure {
    /// PROVE with a proof that does not match (another token, or a proof
    /// made for another connection).
    WrongToken,
    /// PROVE without a proof: the sender has no token.
    NoToken,
    /// Something other than PROVE (or BYE) came first.
    Required,
}

impl AuthFailure {
    /// The reason in a few words (without "authentication failed").
    pub const fn detail(self) -> &'static str {
        match self {
            Self::WrongToken => "wrong token",
            Self::NoToken => "the sender has no token",
            Self::Required => "authentication required",
        }
    }

    /// Every failure.
    pub const ALL: [AuthFailure; 3] = [Self::WrongToken, Self::NoToken, Self::Required];

    /// The REJECT that tells the sender: code Auth, the detail as reason.
    pub fn reject(self) -> Reject {
        Reject::new(RejectCode::Auth, self.detail())
    }

    /// The failure a REJECT(auth)'s reason names, if it names one (a
    /// receiver of this version sends the detail; an earlier build of
    /// version 5 sent it after "authentication failed: ").
    pub fn from_reason(reason: &str) -> Option<Self> {
        let detail = reason
            .strip_prefix("authentication failed: ")
            .unwrap_or(reason);
        Self::ALL.into_iter().find(|f| f.detail() == detail)
    }
}

impl std::fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "authentication failed: {}", self.detail())
    }
}

/// What went wrong with a message or chunk the sender sent, and what the
/// engine must answer.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RecvError {
    /// Answer with this REJECT; the session continues (state stays AwaitHello).
    #[error("offer rejected ({}): {}", .0.code, .0.reason)]
    Reject(Reject),
    /// The session is over (state is now Closed): send `Ack::new(AckStatus::Protocol, err)`
    /// (or a `Reject` with `RejectCode::Protocol`) directly and disconnect.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// The sender did not authenticate (state is now Closed): send
    /// `Message::Reject(failure.reject())` and end the session; nothing may
    /// be written or exposed.
    #[error("{0}")]
    Auth(AuthFailure),
    /// The sender speaks another protocol version (state is now Closed):
    /// the REJECT(version) naming both versions is queued.
    #[error("{}", .0.reason)]
    Version(Reject),
    /// A sealed message failed its check (state is now Closed): forged,
    /// replayed, reordered or truncated. An ACK(protocol) is queued.
    #[error("{0}")]
    Forged(ChannelError),
    /// A stream grew past `max_size` or the session past
    /// `max_session_bytes` (state is now Closed): abort the file with
    /// `Ack::new(AckStatus::Rejected, err)`.
    #[error("the stream is larger than the receiver accepts: more than {limit} bytes ({option})")]
    TooLarge {
        /// The limit passed.
        limit: u64,
        /// The receiver's option that sets it.
        option: &'static str,
    },
    /// The session reached one of the receiver's limits per session (state
    /// is now Closed): send this REJECT and end the session.
    #[error("session limit ({}): {}", .0.code, .0.reason)]
    SessionLimit(Reject),
}

/// The receiver's secret, this session's nonce and the connection.
#[derive(Debug, Clone)]
struct AuthKey {
    token: Token,
    nonce: [u8; NONCE_LEN],
    conn: ConnectionId,
}

/// Where a file's data starts: after the verified prefix a resumed file
/// keeps (FROM), or at 0. Its chunks keep their numbers, and so their ring
/// slots, and their length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ResumeBase {
    /// Bytes already held.
    bytes: u64,
    /// Whole chunks already held.
    chunks: u64,
    /// Their length (0: no prefix).
    chunk_len: u32,
}

impl ResumeBase {
    /// No prefix: the file starts at 0.
    const START: ResumeBase = ResumeBase {
        bytes: 0,
        chunks: 0,
        chunk_len: 0,
    };
}

/// The receiver's side of one session: checks every message and chunk
/// against the protocol and decides what to answer (pure; no I/O).
///
/// The machine carries the engine's data for the current offer, so that
/// the engine keeps no state beside it: `F` (the file being written) from
/// `accept` to the FIN that hands it back, `W` (what a HAVE was made of)
/// from `have` to the FROM or COMPARE that answers it, and `C` (the copy
/// a COMPARE is about) from a HAVE that asks for one to that COMPARE.
#[derive(Debug, Clone)]
pub struct ReceiverSession<F = (), W = (), C = ()> {
    cfg: ReceiverConfig,
    auth: Option<AuthKey>,
    /// The session key between a right PROVE and the engine's admission.
    admitting: Option<SessionKey>,
    /// The key of the chunks' tags, once the sender is admitted.
    chunk_key: Option<ChunkKey>,
    /// HELLOs and BATCHes received so far: the current offer's number.
    offers: u64,
    state: ReceiverState,
    /// Replies the machine decided on, oldest first (`poll_transmit`).
    outbox: VecDeque<Message>,
    /// Name of the current offer (for the reasons the sender hears).
    name: String,
    /// Announced size (0 for streams and directories).
    size: u64,
    /// The current offer is a stream (size unknown until FIN).
    stream: bool,
    /// The current offer is a directory (no ring, no data).
    directory: bool,
    /// The current offer is a BATCH of this many files (0: it is not);
    /// they count as entries once accepted.
    batch_files: u64,
    /// A stream's short chunk arrived: it must have been the last one.
    short_seen: bool,
    digest: DigestAlg,
    ring: RingInfo,
    bytes: u64,
    chunks: u64,
    /// Length of the first chunk of the file; 0 until it arrives.
    chunk_len: u32,
    /// Chunks received but not yet consumed (`chunk_done`).
    unconsumed: u32,
    /// Slots consumed whose credit has not been returned yet.
    pending: u32,
    /// HELLOs this session offered so far.
    entries: u64,
    /// Offers refused since the last accepted one.
    refused_in_a_row: u32,
    /// The current offer asked to resume (`hello_flags::RESUME`).
    resume: bool,
    /// The current offer's sender answers a HAVE of kind Digest
    /// (`hello_flags::CHECKSUM`).
    checksum: bool,
    /// The current offer's flags and modification time, for what is
    /// under its final name (`existing`).
    offer_caps: u32,
    offer_mtime: Option<Mtime>,
    /// The current offer's place in its file when it is a piece (its
    /// file's size is what `existing` compares).
    offer_piece: Option<super::assembly::Piece>,
    /// `existing` decided that the file under the final name is compared
    /// (a HAVE of a complete copy without RESUME).
    compare_existing: bool,
    /// `existing` was asked about the current offer (once per offer).
    existing_decided: bool,
    /// What HAVE told the sender about the current offer.
    have: Option<Have>,
    /// Where the current file's data starts (a resumed prefix).
    base: ResumeBase,
    /// Bytes this session brought so far: accepted files' sizes and the
    /// streams' bytes as they arrive.
    session_bytes: u64,
    /// Digest questions asked so far, and the bytes of their files
    /// (`DigestBudget`).
    digest_questions: u32,
    digest_bytes: u64,
    /// Names whose copy was compared in this session (a HAVE of a complete
    /// copy or asking a digest): each at most once, so that a sender cannot
    /// make the receiver read the same file again and again. At most one per
    /// digest question (`DigestBudget`).
    compared: std::collections::HashSet<String>,
    /// The engine's data for the file being received (state Receiving),
    /// until its FIN or until the engine takes it back (`take_file`).
    file: Option<F>,
    /// The engine's data for an offer answered with HAVE (state
    /// AwaitFrom), until FROM or COMPARE.
    waiting: Option<Awaiting<W, C>>,
    /// The session's clock: when it last made progress (`progressed`);
    /// None before the engine starts it.
    progressed_at: Option<Instant>,
    /// While the engine's work for the offer runs (`work_started` until
    /// its decision: file work, or a relaying engine's wait for the hosts
    /// after it): when the next KEEPALIVE is due.
    keepalive_due: Option<Instant>,
    /// Hosts after this receiver that RELAY named (0: it relays nothing).
    relay_hops: usize,
    /// RESULTs queued for the current offer (`push_result`).
    results: usize,
}

/// What the engine gave with a HAVE, by the HAVE's kind: a HAVE that
/// asks for the sender's SHA-256 (complete, digest) also carries what the
/// COMPARE is about, so that COMPARE hands back exactly that.
#[derive(Debug, Clone)]
enum Awaiting<W, C> {
    /// Nothing or a prefix: FROM answers.
    From(W),
    /// A complete copy or a digest request: COMPARE (or FROM 0) answers.
    Compare(W, C),
}

/// What the receiver has under an offer's final name, as the engine
/// found it (`stat` without following a link): `ReceiverSession::existing`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// Nothing under the name (or a path the engine's own checks will
    /// refuse).
    NoFile,
    /// Something that is not a regular file the engine can read (a
    /// directory, a link, a FIFO, an unreadable file): kept with
    /// IGNORE_EXISTING, else the engine's own checks refuse or replace it.
    Other,
    /// A regular file.
    File {
        /// Its size.
        size: u64,
        /// Its modification time as `stat` gives it: seconds and
        /// nanoseconds.
        secs: i64,
        /// See `secs`.
        nsec: i64,
    },
}

/// What to do with an offer given what is under its final name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// On as any offer (HAVE for RESUME, a digest asked, the MR, or the
    /// engine's refusal of a file it may not replace).
    Proceed,
    /// The receiver's file stays as it is: this ACK (unchanged,
    /// kept-existing, kept-newer) is queued; nothing is sent.
    Stays(AckStatus),
    /// A file of the offered size whose SHA-256 decides (CHECKSUM): the
    /// engine answers with `have_found` of its complete copy, COMPARE
    /// follows.
    Compare,
}

/// What the receiver's store found of an offer with RESUME; the machine
/// makes the HAVE of it (`have_found`). `C`: the complete copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found<C = ()> {
    /// Nothing reusable, and why (empty: nothing worth saying).
    Nothing(String),
    /// A verified prefix of whole chunks, and the SHA-256 over their CRCs.
    Prefix {
        /// Its length: whole chunks, shorter than the file.
        bytes: u64,
        /// The length of its chunks (the resumed file's chunks keep it).
        chunk_len: u32,
        /// SHA-256 over the chunks' CRCs, which the sender checks.
        sha256: [u8; 32],
    },
    /// A complete copy, to compare.
    Complete(C),
}

impl<C> Found<C> {
    /// The kind of HAVE it makes.
    pub fn kind(&self) -> HaveKind {
        match self {
            Found::Nothing(_) => HaveKind::Nothing,
            Found::Prefix { .. } => HaveKind::Prefix,
            Found::Complete(_) => HaveKind::Complete,
        }
    }

    /// The verified prefix's length (0 for the others).
    pub fn prefix_bytes(&self) -> u64 {
        match self {
            Found::Prefix { bytes, .. } => *bytes,
            Found::Nothing(_) | Found::Complete(_) => 0,
        }
    }

    /// Why nothing is reusable (empty for the others).
    pub fn note(&self) -> &str {
        match self {
            Found::Nothing(note) => note,
            Found::Prefix { .. } | Found::Complete(_) => "",
        }
    }

    /// The same finding, its complete copy turned by `f`.
    pub fn map_copy<D>(self, f: impl FnOnce(C) -> D) -> Found<D> {
        match self {
            Found::Nothing(note) => Found::Nothing(note),
            Found::Prefix {
                bytes,
                chunk_len,
                sha256,
            } => Found::Prefix {
                bytes,
                chunk_len,
                sha256,
            },
            Found::Complete(copy) => Found::Complete(f(copy)),
        }
    }
}

/// Why a data write was refused (`on_chunk`): the session is over, the
/// ACK saying why is queued.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ChunkError {
    /// Not a write the protocol allows here.
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
    /// A stream grew past --max-size.
    #[error("the stream is larger than the receiver accepts: more than {limit} bytes ({option})")]
    TooLarge {
        /// The limit passed.
        limit: u64,
        /// The receiver's option that sets it.
        option: &'static str,
    },
}

impl From<ChunkError> for RecvError {
    fn from(e: ChunkError) -> Self {
        match e {
            ChunkError::Protocol(e) => RecvError::Protocol(e),
            ChunkError::TooLarge { limit, option } => RecvError::TooLarge { limit, option },
        }
    }
}

/// A frame from the sender that does not decode (`on_undecodable`).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum Undecodable {
    /// A HELLO of a wire version this build does not speak: REJECT(version).
    #[error("{}", .0.reason)]
    Version(Reject),
    /// Anything else: a protocol error.
    #[error("malformed message: {0}")]
    Malformed(WireError),
}

impl From<Undecodable> for RecvError {
    fn from(e: Undecodable) -> Self {
        match e {
            Undecodable::Version(reject) => RecvError::Reject(reject),
            Undecodable::Malformed(e) => RecvError::Protocol(ProtocolError::Malformed(e)),
        }
    }
}

/// The sender said nothing for the session's whole timeout: the session
/// is over (nothing is said to a sender that says nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("no progress for {}s while waiting for {waiting_for}", after.as_secs())]
pub struct TimedOut {
    /// What the session waited for (`ReceiverSession::waiting_for`).
    pub waiting_for: &'static str,
    /// How long it waited.
    pub after: Duration,
    /// The state it waited in.
    pub state: ReceiverState,
}

impl<F, W, C: Default> ReceiverSession<F, W, C> {
    /// `have_found` or `ask_digest` as the HAVE `have` says, for a machine
    /// whose copy for COMPARE has a default (the tests'; the engine's has
    /// none and says which copy it holds). `waiting` comes back with the
    /// answer (`ReceiverEvent::From` or `Compare`).
    pub fn have(&mut self, have: Have, waiting: W) -> Result<(), ProtocolError> {
        let waiting = match have.kind {
            HaveKind::Complete | HaveKind::Digest => Awaiting::Compare(waiting, C::default()),
            HaveKind::Nothing | HaveKind::Prefix => Awaiting::From(waiting),
        };
        self.answer_have(have, waiting)
    }
}

impl ReceiverSession {
    /// A session that accepts any sender (no token configured), carrying
    /// nothing for the engine.
    pub fn new(cfg: ReceiverConfig) -> Self {
        Self::carrying(cfg)
    }

    /// `carrying_with_auth`, carrying nothing for the engine.
    pub fn with_auth(
        cfg: ReceiverConfig,
        token: Token,
        nonce: [u8; NONCE_LEN],
        conn: ConnectionId,
    ) -> Self {
        Self::carrying_with_auth(cfg, token, nonce, conn)
    }
}

impl<F, W, C> ReceiverSession<F, W, C> {
    /// A session that accepts any sender (no token configured).
    pub fn carrying(cfg: ReceiverConfig) -> Self {
        let mut s = Self::unannounced(cfg);
        s.outbox.push_back(s.challenge());
        s
    }

    fn unannounced(cfg: ReceiverConfig) -> Self {
        Self {
            cfg,
            auth: None,
            admitting: None,
            chunk_key: None,
            offers: 0,
            state: ReceiverState::AwaitHello,
            outbox: VecDeque::new(),
            name: String::new(),
            size: 0,
            stream: false,
            directory: false,
            batch_files: 0,
            short_seen: false,
            digest: DigestAlg::Crc32,
            ring: RingInfo::default(),
            bytes: 0,
            chunks: 0,
            chunk_len: 0,
            unconsumed: 0,
            pending: 0,
            entries: 0,
            refused_in_a_row: 0,
            resume: false,
            checksum: false,
            offer_caps: 0,
            offer_mtime: None,
            offer_piece: None,
            compare_existing: false,
            existing_decided: false,
            have: None,
            base: ResumeBase::START,
            session_bytes: 0,
            digest_questions: 0,
            digest_bytes: 0,
            compared: Default::default(),
            file: None,
            waiting: None,
            progressed_at: None,
            keepalive_due: None,
            relay_hops: 0,
            results: 0,
        }
    }

    /// A session that first requires a PROVE of `token`, bound to `nonce`
    /// (which must be fresh from the OS RNG for every session) and to
    /// `conn`, this connection's identity.
    pub fn carrying_with_auth(
        cfg: ReceiverConfig,
        token: Token,
        nonce: [u8; NONCE_LEN],
        conn: ConnectionId,
    ) -> Self {
        let mut s = Self::unannounced(cfg);
        s.auth = Some(AuthKey { token, nonce, conn });
        s.state = ReceiverState::AwaitAuth;
        s.outbox.push_back(s.challenge());
        s
    }

    /// Admits the authenticated sender (state AwaitAdmission): AUTH_OK,
    /// the receiver's proof, is queued, and the channel that seals every
    /// later message is returned (once: only an admission makes it);
    /// HELLOs are welcome from now on.
    pub fn admit(&mut self) -> Result<Channel, ProtocolError> {
        let (ReceiverState::AwaitAdmission, Some(key)) = (self.state, self.admitting.take()) else {
            return Err(self.unexpected("admission"));
        };
        self.outbox.push_back(Message::AuthOk {
            proof: key.receiver_proof(),
        });
        self.chunk_key = Some(key.chunk_key());
        self.state = ReceiverState::AwaitHello;
        Ok(key.channel(Role::Receiver))
    }

    /// Bytes of each chunk's tag: `CHUNK_TAG_LEN` with a token (every chunk
    /// of an authenticated session carries one), else 0. The ring's slots
    /// (`ReceiverConfig::slot_size`) hold a chunk and its tag.
    pub fn tag_len(&self) -> u32 {
        if self.auth.is_some() {
            CHUNK_TAG_LEN as u32
        } else {
            0
        }
    }

    /// The longest chunk a slot holds (with its tag).
    fn chunk_room(&self) -> u32 {
        self.cfg.slot_size.saturating_sub(self.tag_len())
    }

    /// Answers an offer with RESUME (state AwaitDecision, after the
    /// engine's checks, once): what the receiver holds of it. Queues the
    /// HAVE; the sender's FROM (or, for a complete copy, COMPARE)
    /// comes next. A HAVE of kind Digest asks an offer with CHECKSUM (with
    /// or without RESUME) for its SHA-256: COMPARE comes next.
    ///
    /// From Comparing (the sender's file differs from the copy) only a HAVE
    /// of nothing: the sender starts over with FROM 0.
    /// `waiting` comes back with the answer (`ReceiverEvent::From` or
    /// `Compare`). The engine answers with `have_found` or `ask_digest`
    /// (which carry a COMPARE's copy); `have` is for a machine that
    /// carries none.
    fn answer_have(&mut self, have: Have, waiting: Awaiting<W, C>) -> Result<(), ProtocolError> {
        let comparing = self.state == ReceiverState::Comparing;
        // Only the sender of a CHECKSUM offer knows what a Digest HAVE asks.
        let offered = match have.kind {
            HaveKind::Digest => self.checksum,
            HaveKind::Complete => self.resume || self.compare_existing,
            HaveKind::Nothing | HaveKind::Prefix => self.resume,
        };
        let answering =
            self.state == ReceiverState::AwaitDecision && self.have.is_none() && offered;
        if !(answering || comparing && have.kind == HaveKind::Nothing) {
            return Err(self.wrong_state("have"));
        }
        let consistent = have.fits(self.size) && have.chunk_len <= self.chunk_room();
        if !consistent {
            return Err(ProtocolError::BadHave {
                reason: "inconsistent with the offer",
            });
        }
        let asks_compare = matches!(have.kind, HaveKind::Complete | HaveKind::Digest);
        if asks_compare {
            if let Some(reason) = self.why_not_compare(&self.name, have.bytes) {
                return Err(ProtocolError::BadHave { reason });
            }
            self.digest_questions += 1;
            self.digest_bytes += have.bytes;
            self.compared.insert(self.name.clone());
        }
        self.have = Some(have.clone());
        self.state = ReceiverState::AwaitFrom;
        self.waiting = Some(waiting);
        self.work_done();
        self.outbox.push_back(Message::Have(have));
        Ok(())
    }

    /// `have` of what the store found of the current offer: the HAVE is
    /// made here, from the offer (a complete copy has its size).
    pub fn have_found(&mut self, found: Found<C>, waiting: W) -> Result<(), ProtocolError> {
        let (have, waiting) = match found {
            Found::Nothing(note) => (Have::nothing(note), Awaiting::From(waiting)),
            Found::Prefix {
                bytes,
                chunk_len,
                sha256,
            } => {
                let have = Have {
                    kind: HaveKind::Prefix,
                    bytes,
                    chunk_len,
                    digest: Digest::Sha256(sha256),
                    note: String::new(),
                };
                (have, Awaiting::From(waiting))
            }
            Found::Complete(copy) => (Have::complete(self.size), Awaiting::Compare(waiting, copy)),
        };
        self.answer_have(have, waiting)
    }

    /// `have` asking the current offer (with CHECKSUM) for its SHA-256;
    /// `why` comes back with its COMPARE.
    pub fn ask_digest(&mut self, why: C, waiting: W) -> Result<(), ProtocolError> {
        self.answer_have(Have::ask_digest(self.size), Awaiting::Compare(waiting, why))
    }

    /// Whether the copy of the file `name` of `size` bytes may be compared
    /// (a HAVE of a complete copy, or asking for a digest), and if not,
    /// why: each name once per session, within the session's budget of
    /// digest questions (`DigestBudget`). `have` refuses such a HAVE then;
    /// the engine offers nothing instead (the file is sent whole).
    pub fn why_not_compare(&self, name: &str, size: u64) -> Option<&'static str> {
        if self.compared.contains(name) {
            return Some("its copy was compared once in this session already");
        }
        let budget = self.cfg.digest_budget;
        let within = self.digest_questions < budget.questions
            && self
                .digest_bytes
                .checked_add(size)
                .is_some_and(|b| b <= budget.bytes);
        if !within {
            return Some(
                "the session's budget of compared copies is spent: sent whole, a later session compares it",
            );
        }
        None
    }

    /// Whether the offer `hello` (the current one, or a batch's member)
    /// may be asked for its SHA-256 before its data (a HAVE of kind
    /// Digest), and if not, why: only an offer with CHECKSUM (its sender
    /// answers), and as `why_not_compare` allows.
    pub fn may_ask_digest(&self, hello: &Hello) -> Result<(), &'static str> {
        if hello.caps & hello_flags::CHECKSUM == 0 {
            return Err("it was not offered with CHECKSUM");
        }
        match self.why_not_compare(&hello.name, hello.size) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }

    /// `why_not_compare` found no reason.
    pub fn may_compare(&self, name: &str, size: u64) -> bool {
        self.why_not_compare(name, size).is_none()
    }

    /// FROM: the sender starts at 0, continues the prefix HAVE offered, or
    /// skips a complete copy; anything else is a protocol error.
    fn on_from(&mut self, offset: u64) -> Result<ReceiverEvent<F, W, C>, RecvError> {
        let have = self.have.clone().ok_or_else(|| self.unexpected("FROM"))?;
        match (have.kind, offset) {
            (_, 0) => self.state = ReceiverState::AwaitDecision,
            (HaveKind::Prefix, o) if o == have.bytes => {
                self.base = ResumeBase {
                    bytes: o,
                    chunks: o / u64::from(have.chunk_len),
                    chunk_len: have.chunk_len,
                };
                self.state = ReceiverState::AwaitDecision;
            }
            _ => {
                return Err(ProtocolError::BadFrom {
                    offset,
                    have: have.bytes,
                }
                .into());
            }
        }
        // FROM 0 after a HAVE that asked for a COMPARE: its copy is not
        // needed.
        match self.waiting.take() {
            Some(Awaiting::From(waiting) | Awaiting::Compare(waiting, _)) => {
                Ok(ReceiverEvent::From { offset, waiting })
            }
            None => Err(self.unexpected("FROM").into()),
        }
    }

    /// COMPARE: only after a HAVE of a complete copy or of kind Digest
    /// (`have` moved to AwaitFrom with what the COMPARE is about; FROM and
    /// COMPARE take it once).
    fn on_compare(&mut self, sha256: [u8; 32]) -> Result<ReceiverEvent<F, W, C>, RecvError> {
        match self.waiting.take() {
            Some(Awaiting::Compare(waiting, copy)) => {
                self.state = ReceiverState::Comparing;
                Ok(ReceiverEvent::Compare {
                    sha256,
                    copy,
                    waiting,
                })
            }
            kept => {
                self.waiting = kept;
                Err(self.unexpected("COMPARE").into())
            }
        }
    }

    /// The copy is the sender's file (state Comparing): the file is done
    /// without data (kept, or linked from --link-dest). Queues its ACK(ok).
    pub fn same(&mut self) -> Result<(), ProtocolError> {
        if self.state != ReceiverState::Comparing {
            return Err(self.wrong_state("same"));
        }
        self.bytes = self.size;
        self.state = ReceiverState::Verifying;
        self.work_done();
        self.complete(AckStatus::Ok, String::new())
    }

    /// The engine starts reading its copy of an offer with RESUME from
    /// disk at `now` (what it holds, before the HAVE; or the complete file
    /// for a COMPARE): until its decision (`have`, `same`, `reject`) the
    /// sender waits, and a KEEPALIVE is due every `keepalive_interval`
    /// (`poll_timeout`, `handle_timeout`) so that it does not time out.
    /// Only while such work is pending: after FROM the engine reads nothing
    /// (the kept prefix's digest came with its HAVE), so there it is misuse.
    ///
    /// A relaying session's engine also waits for the hosts after it
    /// while an offer awaits its verdict: in AwaitDecision (the next host's
    /// answer to the offer, before `accept` ... `reject`) and in Verifying
    /// (their verdicts on the file, before `complete`). There too: its
    /// KEEPALIVEs until the verdict.
    pub fn work_started(&mut self, now: Instant) -> Result<(), ProtocolError> {
        use ReceiverState::*;
        let reading = self.state == Comparing
            || self.state == AwaitDecision && self.resume && self.have.is_none();
        let relaying = self.is_relaying() && matches!(self.state, AwaitDecision | Verifying);
        if !(reading || relaying) {
            return Err(self.wrong_state("work_started"));
        }
        self.keepalive_due = Some(now + keepalive_interval(self.cfg.timeout));
        Ok(())
    }

    /// The engine's work ended with its decision on the offer.
    fn work_done(&mut self) {
        self.keepalive_due = None;
    }

    /// The session made progress at `now` (the sender's input was
    /// handled, or the engine's work ended): its wait for the sender
    /// starts over. The engine calls it first when the session starts.
    pub fn progressed(&mut self, now: Instant) {
        self.progressed_at = Some(now);
    }

    /// When `handle_timeout` is due next: the next KEEPALIVE while the
    /// engine's work runs (`work_started`), else the end of the wait for the sender.
    /// None once the session is over, before `progressed` started it, or
    /// when the wait ends past the clock's range (no deadline then).
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.state == ReceiverState::Closed {
            return None;
        }
        if let Some(due) = self.keepalive_due {
            return Some(due);
        }
        self.progressed_at?.checked_add(self.idle_limit())
    }

    /// The deadline `poll_timeout` gave (or a later time) came at `now`:
    /// a KEEPALIVE is queued while the engine's work runs (the sender
    /// waits for it, so its silence ends nothing); else, once
    /// the sender made no progress for the whole wait, the session is over
    /// (`TimedOut`, nothing queued). Earlier, nothing happens.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), TimedOut> {
        if self.state == ReceiverState::Closed {
            return Ok(());
        }
        if let Some(due) = self.keepalive_due {
            if now >= due {
                self.outbox.push_back(Message::Keepalive);
                self.keepalive_due = Some(now + keepalive_interval(self.cfg.timeout));
            }
            return Ok(());
        }
        let expired = self.poll_timeout().is_some_and(|deadline| now >= deadline);
        if !expired {
            return Ok(());
        }
        let timed_out = TimedOut {
            waiting_for: self.waiting_for(),
            after: self.idle_limit(),
            state: self.state,
        };
        self.state = ReceiverState::Closed;
        Err(timed_out)
    }

    /// Where the current file's data starts: its resumed prefix in bytes
    /// (0 unless FROM continued one).
    pub fn resumed_from(&self) -> u64 {
        self.base.bytes
    }

    /// Refuses the authenticated sender (state AwaitAdmission) because
    /// `max_sessions` sessions run: REJECT(busy) is queued instead of
    /// AUTH_OK and the session is over. Returns that refusal; in any other
    /// state nothing changes (as `admit`).
    pub fn refuse_busy(&mut self, max_sessions: usize) -> Result<Reject, ProtocolError> {
        if self.state != ReceiverState::AwaitAdmission {
            return Err(self.unexpected("admission"));
        }
        self.admitting = None;
        let reject = busy_refusal(Busy::Sessions(max_sessions));
        self.close_with(Message::Reject(reject.clone()), true);
        Ok(reject)
    }

    /// The file being received (`accept`'s), until its FIN.
    pub fn file(&self) -> Option<&F> {
        self.file.as_ref()
    }

    /// The session ends under the file being received (an error, a
    /// vanished sender): the engine takes the file's data back, to keep
    /// what was verified and report the failure. A session that held one
    /// is over (Closed).
    pub fn take_file(&mut self) -> Option<F> {
        let file = self.file.take();
        if file.is_some() {
            self.state = ReceiverState::Closed;
        }
        file
    }

    /// The next message the machine queued for the sender (the CHALLENGE
    /// first of all), if any. The engine sends them in this order.
    pub fn poll_transmit(&mut self) -> Option<Message> {
        self.outbox.pop_front()
    }

    /// What the session waits for from the sender in the current state
    /// (for the messages that say why a wait ended).
    pub fn waiting_for(&self) -> &'static str {
        match self.state {
            ReceiverState::AwaitAuth | ReceiverState::AwaitAdmission => "the sender's PROVE",
            ReceiverState::Receiving | ReceiverState::Verifying => "data from the sender",
            ReceiverState::AwaitFrom => "the sender's FROM or COMPARE",
            _ => "the next HELLO or BYE",
        }
    }

    /// How long the session waits for the sender in the current state: an
    /// unauthenticated peer holds a session `AUTH_TIMEOUT` at most.
    fn idle_limit(&self) -> Duration {
        match self.state {
            ReceiverState::AwaitAuth | ReceiverState::AwaitAdmission => {
                self.cfg.timeout.min(AUTH_TIMEOUT)
            }
            _ => self.cfg.timeout,
        }
    }

    /// The CHALLENGE, the very first message of a session.
    fn challenge(&self) -> Message {
        Message::Challenge(match &self.auth {
            Some(a) => Challenge {
                flags: AUTH_REQUIRED,
                nonce: a.nonce,
            },
            None => Challenge {
                flags: 0,
                nonce: [0; NONCE_LEN],
            },
        })
    }

    /// The current state.
    pub fn state(&self) -> ReceiverState {
        self.state
    }

    /// Bytes of the current file (or stream) received so far.
    pub fn bytes_received(&self) -> u64 {
        self.bytes
    }

    /// Chunks of the current file (or stream) received so far.
    pub fn chunks_received(&self) -> u64 {
        self.chunks
    }

    fn batch(&self) -> u32 {
        self.cfg.credit_batch.clamp(1, self.cfg.slot_count.max(1))
    }

    fn wrong_state(&self, op: &'static str) -> ProtocolError {
        ProtocolError::WrongState {
            op,
            state: self.state.as_str(),
        }
    }

    /// Whether a RELAY came: this session relays.
    pub fn is_relaying(&self) -> bool {
        self.relay_hops > 0
    }

    /// Queues a RESULT, one host's verdict on the current offer, so that
    /// it goes before the offer's verdict: only in a relaying session,
    /// while an offer is open (from its `Offer` or `Batch` event until the
    /// engine's verdict on it: `accept` ... `complete`, `reject`,
    /// `existing` that keeps the file, `would_receive`, `same`,
    /// `accept_directory`), once per host of the chain (this receiver and
    /// those after it). Misuse is an error and queues nothing.
    pub fn push_result(&mut self, result: HopResult) -> Result<(), ProtocolError> {
        if !self.is_relaying() {
            return Err(ProtocolError::RelayNotAllowed {
                reason: "no RELAY came in this session",
            });
        }
        if !self.offer_open() {
            return Err(self.wrong_state("push_result"));
        }
        let hosts = self.relay_hops + 1;
        if self.results >= hosts {
            return Err(ProtocolError::TooManyResults { max: hosts });
        }
        let msg = Message::Result(result);
        encoded_len(&msg).map_err(ProtocolError::BadResult)?;
        self.results += 1;
        self.outbox.push_back(msg);
        Ok(())
    }

    /// An offer awaits the engine's verdict (or its data, its FIN's).
    fn offer_open(&self) -> bool {
        use ReceiverState::*;
        matches!(
            self.state,
            AwaitDecision | AwaitFrom | Comparing | Receiving | Verifying
        )
    }

    /// RELAY: only from a sender that proved the token, before its first
    /// offer, within `MAX_RELAY_HOPS` for the session; refused by policy
    /// without `relay_allowed` (the session ends: the sender asked for a
    /// chain that cannot be).
    fn on_relay(&mut self, relay: Relay) -> Result<ReceiverEvent<F, W, C>, RecvError> {
        let refused = |reason| Err(ProtocolError::RelayNotAllowed { reason }.into());
        if self.auth.is_none() {
            return refused("a relay chain needs a session authenticated with a token");
        }
        if self.offers > 0 {
            return refused("the hosts to relay to come before the first offer");
        }
        if !self.cfg.relay_allowed {
            return Err(RecvError::SessionLimit(Reject::new(
                RejectCode::Protocol,
                "this receiver does not relay (it runs without --allow-relay)",
            )));
        }
        let total = self.relay_hops.saturating_add(relay.hops.len());
        if total > MAX_RELAY_HOPS {
            return Err(ProtocolError::BadRelayChain(WireError::TooManyHops {
                count: total,
                max: MAX_RELAY_HOPS,
            })
            .into());
        }
        self.relay_hops = total;
        Ok(ReceiverEvent::Relay(relay.hops))
    }

    fn reset_file(&mut self) {
        self.short_seen = false;
        self.bytes = 0;
        self.chunks = 0;
        self.chunk_len = 0;
        self.unconsumed = 0;
        self.pending = 0;
    }

    /// Applies a message from the sender. A `RecvError::Protocol` or
    /// `RecvError::Auth` closes the session.
    /// Applies a message from the sender. Every error queues the reply the
    /// sender gets (`poll_transmit`): a REJECT for a refused offer (the
    /// session goes on), a REJECT(auth) or an ACK saying why for the others,
    /// which close the session.
    pub fn on_message(&mut self, msg: Message) -> Result<ReceiverEvent<F, W, C>, RecvError> {
        let kind = msg.kind();
        let was_closed = self.state == ReceiverState::Closed;
        let result = self.dispatch(msg);
        if let Err(e) = &result
            && !was_closed
        {
            let reply = match e {
                RecvError::Reject(r) => {
                    // Every refused offer counts (the engine's refusals
                    // too, in `reject`); an accepted one starts over.
                    self.refused_in_a_row = self.refused_in_a_row.saturating_add(1);
                    Message::Reject(r.clone())
                }
                RecvError::Auth(f) => Message::Reject(f.reject()),
                RecvError::Version(r) => Message::Reject(r.clone()),
                RecvError::Forged(c) => Message::Ack(Ack::new(
                    AckStatus::Protocol,
                    format!("protocol error: {c}"),
                )),
                RecvError::Protocol(p) => Message::Ack(Ack::new(
                    AckStatus::Protocol,
                    format!("protocol error: {kind} not allowed here: {p}"),
                )),
                RecvError::TooLarge { .. } => {
                    Message::Ack(Ack::new(AckStatus::Rejected, format!("{kind}: {e}")))
                }
                RecvError::SessionLimit(r) => Message::Reject(r.clone()),
            };
            self.close_with(reply, !matches!(e, RecvError::Reject(_)));
        }
        result
    }

    /// A frame from the sender that does not decode. A HELLO of a wire
    /// version this build does not speak is refused with REJECT(version)
    /// naming both versions; anything else is a protocol error (ACK). Either
    /// way the session is over (nothing more is sent once it is).
    pub fn on_undecodable(&mut self, err: WireError) -> Undecodable {
        let (error, reply) = match err {
            WireError::UnknownVersion(v) => {
                let reject = Reject::new(
                    RejectCode::Version,
                    format!(
                        "protocol version {v} is not supported (this receiver speaks {PROTOCOL_VERSION})"
                    ),
                );
                (
                    Undecodable::Version(reject.clone()),
                    Message::Reject(reject),
                )
            }
            other => {
                let reason = format!("protocol error: malformed message from the sender: {other}");
                (
                    Undecodable::Malformed(other),
                    Message::Ack(Ack::new(AckStatus::Protocol, reason)),
                )
            }
        };
        if self.state != ReceiverState::Closed {
            self.close_with(reply, true);
        }
        error
    }

    /// A sealed message from the sender that failed its check: the session
    /// is over; the ACK(protocol) saying why is queued (sealed by the
    /// engine, so the real sender can trust it). Returns `err`.
    pub fn on_forged(&mut self, err: ChannelError) -> ChannelError {
        if self.state != ReceiverState::Closed {
            let reply = Message::Ack(Ack::new(
                AckStatus::Protocol,
                format!("protocol error: {err}"),
            ));
            self.close_with(reply, true);
        }
        err
    }

    /// A lane's probe (KEEPALIVE about a piece) is answered with a
    /// KEEPALIVE (one queued at a time): its sender tells a dead path from
    /// a busy receiver by the answer (protocol 8).
    fn echo_probe(&mut self) {
        if !self.outbox.contains(&Message::Keepalive) {
            self.outbox.push_back(Message::Keepalive);
        }
    }

    /// Queues `reply`; with `close`, the session is over.
    fn close_with(&mut self, reply: Message, close: bool) {
        self.outbox.push_back(reply);
        if close {
            self.state = ReceiverState::Closed;
            self.work_done();
            self.reset_file();
        }
    }

    /// The engine cannot go on with the current entry (a chunk failed its
    /// check, a write failed...): the session ends, and unless it had ended
    /// already (the machine then replied itself), the ACK that tells the
    /// sender why is queued. Whether it was.
    pub fn abort(&mut self, status: AckStatus, reason: String) -> bool {
        if self.state == ReceiverState::Closed {
            return false;
        }
        self.close_with(Message::Ack(Ack::new(status, reason)), true);
        true
    }

    fn dispatch(&mut self, msg: Message) -> Result<ReceiverEvent<F, W, C>, RecvError> {
        use ReceiverState::*;
        match (self.state, msg) {
            (Closed, m) => Err(self.unexpected(m.kind()).into()),
            (AwaitAuth, Message::Prove(p)) => self.on_prove(p),
            // Protocol 2's answer: an older sender.
            (AwaitAuth, Message::Auth { .. }) => Err(RecvError::Version(Reject::new(
                RejectCode::Version,
                format!(
                    "the sender speaks protocol version 2 or older (its AUTH is protocol 2's); \
                     this receiver speaks protocol version {PROTOCOL_VERSION}: upgrade the sender"
                ),
            ))),
            (AwaitAuth, Message::Bye) => {
                self.state = Closed;
                Ok(ReceiverEvent::Closed)
            }
            (AwaitAuth, _) => Err(RecvError::Auth(AuthFailure::Required)),
            (AwaitHello, Message::Relay(relay)) => self.on_relay(relay),
            (AwaitHello, Message::Hello(h)) => {
                self.offers += 1;
                self.results = 0;
                self.entries += 1;
                if self.entries > self.cfg.max_files {
                    return Err(RecvError::SessionLimit(Reject::new(
                        RejectCode::TooLarge,
                        format!(
                            "the session offered more than {} entries, the receiver's limit \
                             per session (--max-files)",
                            self.cfg.max_files
                        ),
                    )));
                }
                if self.refused_in_a_row >= MAX_REFUSALS_IN_A_ROW {
                    return Err(RecvError::SessionLimit(Reject::new(
                        RejectCode::Protocol,
                        format!(
                            "the receiver refused the session's last {MAX_REFUSALS_IN_A_ROW} \
                             offers in a row and ends it"
                        ),
                    )));
                }
                // With a token the FIN's digest must resist deliberate
                // changes: CRC32 can be kept while the data is altered.
                if self.auth.is_some() && !h.is_directory() && h.digest != DigestAlg::Sha256 {
                    return Err(RecvError::Reject(Reject::new(
                        RejectCode::Protocol,
                        format!(
                            "{}: with a token this receiver takes only SHA-256 whole-file \
                             digests (a {} digest does not detect deliberate changes): use \
                             sender --verify sha256",
                            escaped(&h.name),
                            h.digest
                        ),
                    )));
                }
                check_hello(&h, &self.cfg).map_err(|r| {
                    // Another version (or flags this version does not know)
                    // is no single entry's problem: the session ends.
                    if r.code == RejectCode::Version {
                        RecvError::Version(r)
                    } else {
                        RecvError::Reject(r)
                    }
                })?;
                if self.session_bytes.saturating_add(h.size) > self.cfg.max_session_bytes {
                    return Err(RecvError::Reject(Reject::new(
                        RejectCode::TooLarge,
                        format!(
                            "file is {} bytes; after the {} bytes of this session that exceeds \
                             the receiver's limit of {} bytes per session (--max-session-size)",
                            h.size, self.session_bytes, self.cfg.max_session_bytes
                        ),
                    )));
                }
                self.name.clone_from(&h.name);
                self.size = h.size;
                self.stream = h.is_stream();
                self.directory = h.is_directory();
                self.batch_files = 0;
                self.resume = h.caps & hello_flags::RESUME != 0;
                self.checksum = h.caps & hello_flags::CHECKSUM != 0;
                self.offer_caps = h.caps;
                self.offer_mtime = h.mtime;
                self.offer_piece = h.piece;
                self.compare_existing = false;
                self.existing_decided = false;
                self.have = None;
                self.base = ResumeBase::START;
                self.digest = h.digest;
                self.reset_file();
                self.state = AwaitDecision;
                Ok(ReceiverEvent::Offer(h))
            }
            (AwaitHello, Message::Batch(members)) => self.on_batch(members),
            (AwaitHello, Message::Bye) => {
                self.state = Closed;
                Ok(ReceiverEvent::Closed)
            }
            (Receiving, Message::Fin(f)) => {
                if f.digest.alg() != self.digest {
                    return Err(ProtocolError::DigestAlgMismatch {
                        expected: self.digest,
                        got: f.digest.alg(),
                    }
                    .into());
                }
                if self.stream {
                    // The FIN is where a stream's size is announced.
                    if f.bytes != self.bytes || f.chunks != self.chunks {
                        return Err(ProtocolError::StreamFinMismatch {
                            fin_bytes: f.bytes,
                            fin_chunks: f.chunks,
                            got_bytes: self.bytes,
                            got_chunks: self.chunks,
                        }
                        .into());
                    }
                } else if f.bytes != self.bytes
                    || f.chunks != self.chunks
                    || self.bytes != self.size
                {
                    return Err(ProtocolError::FinMismatch {
                        fin_bytes: f.bytes,
                        fin_chunks: f.chunks,
                        got_bytes: self.bytes,
                        got_chunks: self.chunks,
                        size: self.size,
                    }
                    .into());
                }
                // `accept` moved to Receiving with the file; only the FIN
                // and `take_file` take it.
                let file = self.file.take().ok_or_else(|| self.unexpected("FIN"))?;
                self.state = Verifying;
                Ok(ReceiverEvent::Fin(f, file))
            }
            (AwaitFrom, Message::From { offset }) => self.on_from(offset),
            (AwaitFrom, Message::Compare { sha256 }) => self.on_compare(sha256),
            // The sender reads its copy of the prefix (or of the whole file)
            // to compare it with HAVE: it says it is alive meanwhile.
            (AwaitFrom, Message::Keepalive) => Ok(ReceiverEvent::Keepalive),
            // Only a stream may wait for its input; a file's data is there.
            // A stream's sender waiting on its input; a lane probing its
            // path while a piece waits for credit.
            (Receiving, Message::Keepalive) if self.offer_piece.is_some() => {
                self.echo_probe();
                Ok(ReceiverEvent::Keepalive)
            }
            (Receiving, Message::Keepalive) if self.stream => Ok(ReceiverEvent::Keepalive),
            // A lane probing its path about a piece: before its MR, after
            // its FIN (the ACK may be on its way).
            (AwaitHello | AwaitDecision | Verifying, Message::Keepalive)
                if self.offer_piece.is_some() =>
            {
                self.echo_probe();
                Ok(ReceiverEvent::Keepalive)
            }
            // The sender aborting (e.g. a local read error) ends the session.
            (_, Message::Reject(r)) => Err(ProtocolError::PeerRejected {
                code: r.code,
                reason: r.reason,
            }
            .into()),
            (_, m) => Err(self.unexpected(m.kind()).into()),
        }
    }

    /// BATCH: every member is checked as a HELLO of a plain file would be,
    /// and the batch as a whole against the session's limits. A refusal
    /// refuses the whole batch and is not final: the sender offers each
    /// file on its own, and those offers get each file's own answer (and
    /// count against `--max-files`; a refused batch does not).
    fn on_batch(&mut self, members: Vec<Hello>) -> Result<ReceiverEvent<F, W, C>, RecvError> {
        // A batch counts as one entry when offered, refused or not (so
        // refused batches cannot go on for ever), its other files when
        // accepted.
        self.offers += 1;
        self.results = 0;
        self.entries = self.entries.saturating_add(1);
        let refuse = |code, reason: String| Err(RecvError::Reject(Reject::new(code, reason)));
        // Never the end of the session (the sender takes any REJECT of a
        // batch as "one by one"): the next HELLO meets the limits and
        // ends it with its reason.
        if self.refused_in_a_row >= MAX_REFUSALS_IN_A_ROW || self.entries > self.cfg.max_files {
            return refuse(
                RejectCode::TooLarge,
                "the session is at the receiver's limits: the files go one by one".into(),
            );
        }
        let count = members.len() as u64;
        let Some(first) = members.first() else {
            return refuse(RejectCode::Protocol, "a batch without files".into());
        };
        if members.len() > MAX_BATCH_FILES {
            return refuse(
                RejectCode::Protocol,
                format!(
                    "a batch of {count} files; at most {MAX_BATCH_FILES} may be offered together"
                ),
            );
        }
        if (self.entries - 1).saturating_add(count) > self.cfg.max_files {
            return refuse(
                RejectCode::TooLarge,
                format!(
                    "a batch of {count} files would pass the receiver's limit of {} entries \
                     per session (--max-files)",
                    self.cfg.max_files
                ),
            );
        }
        let digest = first.digest;
        if self.auth.is_some() && digest != DigestAlg::Sha256 {
            return refuse(
                RejectCode::Protocol,
                "with a token this receiver takes only SHA-256 whole-file digests".into(),
            );
        }
        let mut total = 0u64;
        let mut names = std::collections::HashSet::with_capacity(members.len());
        for h in &members {
            check_hello(h, &self.cfg).map_err(|r| {
                if r.code == RejectCode::Version {
                    RecvError::Version(r)
                } else {
                    RecvError::Reject(r)
                }
            })?;
            let kind = hello_flags::STREAM
                | hello_flags::DIRECTORY
                | hello_flags::RESUME
                | hello_flags::DRY_RUN
                | hello_flags::PIECE;
            if h.caps & kind != 0 {
                return refuse(
                    RejectCode::Protocol,
                    format!(
                        "{}: a batch holds plain files only (no stream, directory, resumed file, \
                         dry run or piece)",
                        escaped(&h.name)
                    ),
                );
            }
            if h.digest != digest {
                return refuse(
                    RejectCode::Protocol,
                    "the files of a batch announce different digests".into(),
                );
            }
            if !names.insert(h.name.as_str()) {
                return refuse(
                    RejectCode::Protocol,
                    format!("a batch names {} twice", escaped(&h.name)),
                );
            }
            let Some(sum) = total.checked_add(h.size) else {
                return refuse(
                    RejectCode::TooLarge,
                    "a batch of more than 2^64 bytes".into(),
                );
            };
            total = sum;
        }
        if self.session_bytes.saturating_add(total) > self.cfg.max_session_bytes {
            return refuse(
                RejectCode::TooLarge,
                format!(
                    "a batch of {total} bytes; after the {} bytes of this session that exceeds \
                     the receiver's limit of {} bytes per session (--max-session-size)",
                    self.session_bytes, self.cfg.max_session_bytes
                ),
            );
        }
        self.name = format!("a batch of {count} files from {}", escaped(&first.name));
        self.size = total;
        self.stream = false;
        self.directory = false;
        self.batch_files = count;
        // Its members may carry CHECKSUM, but a batch is never asked.
        self.resume = false;
        self.checksum = false;
        self.offer_caps = 0;
        self.offer_mtime = None;
        self.offer_piece = None;
        self.compare_existing = false;
        self.existing_decided = false;
        self.have = None;
        self.base = ResumeBase::START;
        self.digest = digest;
        self.reset_file();
        self.state = ReceiverState::AwaitDecision;
        Ok(ReceiverEvent::Batch(members))
    }

    /// PROVE: the sender's version, then its proof over this connection's
    /// transcript; a right one waits for the engine's admission (`admit`).
    fn on_prove(&mut self, p: Prove) -> Result<ReceiverEvent<F, W, C>, RecvError> {
        let Some(auth) = &self.auth else {
            return Err(self.unexpected("PROVE").into());
        };
        if p.version != PROTOCOL_VERSION {
            return Err(RecvError::Version(Reject::new(
                RejectCode::Version,
                format!(
                    "the sender speaks protocol version {}; this receiver speaks protocol \
                     version {PROTOCOL_VERSION}",
                    p.version
                ),
            )));
        }
        if p.proof.is_empty() {
            return Err(RecvError::Auth(AuthFailure::NoToken));
        }
        let key = SessionKey::derive(&auth.token, &auth.nonce, &p.nonce, &auth.conn);
        if !key.verify_sender(&p.proof) {
            return Err(RecvError::Auth(AuthFailure::WrongToken));
        }
        self.admitting = Some(key);
        self.state = ReceiverState::AwaitAdmission;
        Ok(ReceiverEvent::Authenticated)
    }

    fn unexpected(&self, msg: &'static str) -> ProtocolError {
        ProtocolError::Unexpected {
            msg,
            state: self.state.as_str(),
        }
    }

    /// Whether the offer awaiting a decision (or being received) is a
    /// directory / a stream.
    pub fn offer_is_directory(&self) -> bool {
        self.directory
    }

    /// Whether the current offer is a stream (of unknown size).
    pub fn offer_is_stream(&self) -> bool {
        self.stream
    }

    /// What is under the current offer's final name decides first
    /// (AwaitDecision, a plain file, before any HAVE): the receiver's
    /// file stays (`Standing::Stays`: the ACK is queued, AwaitHello), its
    /// SHA-256 decides (`Standing::Compare`: answer with `have_found` of
    /// the complete copy), or the offer goes on as any (`Proceed`: the
    /// engine's own checks refuse an existing file it may not replace).
    ///
    /// The rules, in order (rsync's): IGNORE_EXISTING keeps any regular
    /// file; UPDATE keeps one with a later modification time; a file of
    /// another size goes on; CHECKSUM compares (within the session's
    /// budget, `why_not_compare`); IGNORE_TIMES goes on; the offer's
    /// modification time stored there is unchanged.
    pub fn existing(&mut self, found: Existing) -> Result<Standing, ProtocolError> {
        if self.state != ReceiverState::AwaitDecision
            || self.have.is_some()
            || self.existing_decided
        {
            return Err(self.wrong_state("existing"));
        }
        if self.stream || self.directory || self.batch_files > 0 {
            return Err(ProtocolError::OfferKind {
                op: "existing",
                kind: "not a plain file",
            });
        }
        self.existing_decided = true;
        Ok(match self.standing_of(found) {
            Standing::Stays(status) => self.stays(status),
            Standing::Compare => {
                self.compare_existing = true;
                Standing::Compare
            }
            Standing::Proceed => Standing::Proceed,
        })
    }

    /// What `existing` decides for `found`, by the same rules, without
    /// deciding it (nothing queued, the state unchanged): a relay hop's
    /// own verdict on an offer that it takes for the hosts after it all
    /// the same.
    pub fn standing_of(&self, found: Existing) -> Standing {
        let caps = self.offer_caps;
        let (size, secs, nsec) = match found {
            Existing::NoFile => return Standing::Proceed,
            Existing::Other if caps & hello_flags::IGNORE_EXISTING != 0 => {
                return Standing::Stays(AckStatus::KeptExisting);
            }
            Existing::Other => return Standing::Proceed,
            Existing::File { size, secs, nsec } => (size, secs, nsec),
        };
        let newer = self
            .offer_mtime
            .is_some_and(|m| m.earlier_than_stored(secs, nsec));
        let same_time = self
            .offer_mtime
            .is_some_and(|m| m.matches_stored(secs, nsec));
        if caps & hello_flags::IGNORE_EXISTING != 0 {
            Standing::Stays(AckStatus::KeptExisting)
        } else if caps & hello_flags::UPDATE != 0 && newer {
            Standing::Stays(AckStatus::KeptNewer)
        } else if size != self.piece_or_file_size() {
            Standing::Proceed
        } else if self.checksum && self.may_compare(&self.name, size) {
            Standing::Compare
        } else if caps & hello_flags::IGNORE_TIMES == 0 && same_time {
            Standing::Stays(AckStatus::Unchanged)
        } else {
            Standing::Proceed
        }
    }

    /// The size of the current offer's file: a piece's whole file's.
    fn piece_or_file_size(&self) -> u64 {
        self.offer_piece.map_or(self.size, |p| p.file_size)
    }

    /// The current offer is a piece verified before (its ACK was lost
    /// with a lane): its ACK without data, PieceKept, or Ok when its file
    /// is whole already -> AwaitHello.
    pub fn piece_verified_before(&mut self, file_whole: bool) -> Result<(), ProtocolError> {
        if self.state != ReceiverState::AwaitDecision || self.have.is_some() {
            return Err(self.wrong_state("piece_verified_before"));
        }
        if self.offer_piece.is_none() {
            return Err(ProtocolError::OfferKind {
                op: "piece_verified_before",
                kind: "not a piece",
            });
        }
        let status = if file_whole {
            AckStatus::Ok
        } else {
            AckStatus::PieceKept
        };
        self.stays(status);
        Ok(())
    }

    /// The file stays: its ACK (without data) -> AwaitHello. Neither a
    /// refusal nor an accepted offer: the refusals in a row go on
    /// counting from where they were.
    fn stays(&mut self, status: AckStatus) -> Standing {
        self.state = ReceiverState::AwaitHello;
        self.work_done();
        self.outbox
            .push_back(Message::Ack(Ack::new(status, String::new())));
        Standing::Stays(status)
    }

    /// AwaitDecision -> Receiving; queues the MR. `ring` must match the
    /// config's shape. The machine holds `file` until the FIN hands it
    /// back (`ReceiverEvent::Fin`), or the engine takes it (`take_file`).
    pub fn accept(&mut self, ring: RingInfo, file: F) -> Result<(), ProtocolError> {
        if self.state != ReceiverState::AwaitDecision {
            return Err(self.wrong_state("accept"));
        }
        if self.directory {
            return Err(ProtocolError::OfferKind {
                op: "accept",
                kind: "a directory",
            });
        }
        check_ring(&ring)?;
        if ring.slot_size != self.cfg.slot_size || ring.slot_count != self.cfg.slot_count {
            return Err(ProtocolError::BadRing {
                reason: "ring shape differs from the receiver configuration",
            });
        }
        if self.offer_caps & hello_flags::DRY_RUN != 0 {
            return Err(ProtocolError::OfferKind {
                op: "accept",
                kind: "a dry run (answered by would_receive)",
            });
        }
        self.ring = ring;
        self.reset_file();
        self.refused_in_a_row = 0;
        // The batch counted as one entry when offered.
        self.entries = self
            .entries
            .saturating_add(self.batch_files.saturating_sub(1));
        // A resumed file continues its prefix: its chunks keep their
        // numbers (and so their slots) and their length.
        self.bytes = self.base.bytes;
        self.chunks = self.base.chunks;
        self.chunk_len = self.base.chunk_len;
        // A stream's bytes are counted as they arrive.
        self.session_bytes = self
            .session_bytes
            .saturating_add(self.size.saturating_sub(self.base.bytes));
        self.state = ReceiverState::Receiving;
        self.file = Some(file);
        self.work_done();
        self.outbox.push_back(Message::Mr(ring));
        Ok(())
    }

    /// A dry run's offer passed every check a real run makes (state
    /// AwaitDecision, a file or stream offered with DRY_RUN, where a real
    /// run would `accept`): queues ACK(would-receive) -> AwaitHello.
    /// Nothing was created.
    pub fn would_receive(&mut self) -> Result<(), ProtocolError> {
        if self.state != ReceiverState::AwaitDecision {
            return Err(self.wrong_state("would_receive"));
        }
        if self.offer_caps & hello_flags::DRY_RUN == 0 || self.directory || self.batch_files > 0 {
            return Err(ProtocolError::OfferKind {
                op: "would_receive",
                kind: "not a file or stream of a dry run",
            });
        }
        self.refused_in_a_row = 0;
        self.state = ReceiverState::AwaitHello;
        self.work_done();
        self.outbox.push_back(Message::Ack(Ack::new(
            AckStatus::WouldReceive,
            String::new(),
        )));
        Ok(())
    }

    /// Whether the current offer is a dry run's (`hello_flags::DRY_RUN`):
    /// the engine checks, writes nothing, and answers with
    /// `would_receive` (or `accept_directory` for a directory that exists
    /// or would be created) instead of `accept`.
    pub fn offer_is_dry_run(&self) -> bool {
        self.offer_caps & hello_flags::DRY_RUN != 0
    }

    /// A directory offer was carried out (the directory exists now):
    /// AwaitDecision -> AwaitHello; queues the ACK(ok).
    pub fn accept_directory(&mut self) -> Result<(), ProtocolError> {
        if self.state != ReceiverState::AwaitDecision {
            return Err(self.wrong_state("accept_directory"));
        }
        if !self.directory {
            return Err(ProtocolError::OfferKind {
                op: "accept_directory",
                kind: "not a directory",
            });
        }
        self.refused_in_a_row = 0;
        self.state = ReceiverState::AwaitHello;
        self.work_done();
        self.outbox
            .push_back(Message::Ack(Ack::new(AckStatus::Ok, String::new())));
        Ok(())
    }

    /// AwaitDecision -> AwaitHello; queues the REJECT.
    pub fn reject(&mut self, code: RejectCode, reason: String) -> Result<(), ProtocolError> {
        if self.state != ReceiverState::AwaitDecision {
            return Err(self.wrong_state("reject"));
        }
        self.refused_in_a_row = self.refused_in_a_row.saturating_add(1);
        self.state = ReceiverState::AwaitHello;
        self.work_done();
        self.outbox
            .push_back(Message::Reject(Reject::new(code, reason)));
        Ok(())
    }

    /// Refuses the current BATCH because its member `member` may be
    /// linked from --link-dest (whose digest is asked of a file offered
    /// alone): AwaitDecision -> AwaitHello; queues REJECT(exists), which
    /// is not a policy against batches (the sender offers these files one
    /// by one and keeps batching others). Returns that refusal.
    pub fn refuse_batch_for_link(&mut self, member: &str) -> Result<Reject, ProtocolError> {
        self.refuse_batch_one_by_one(
            "refuse_batch_for_link",
            format!("{member} may be linked from --link-dest: the files come one by one"),
        )
    }

    /// Refuses the current BATCH because its member `member` has
    /// something under its name already: each file comes alone, so that
    /// what is there decides (`existing`: unchanged, kept, compared,
    /// replaced only with --overwrite). REJECT(exists), as
    /// `refuse_batch_for_link`.
    pub fn refuse_batch_for_existing(&mut self, member: &str) -> Result<Reject, ProtocolError> {
        self.refuse_batch_one_by_one(
            "refuse_batch_for_existing",
            format!("{member} is there already: the files come one by one"),
        )
    }

    /// The current BATCH refused with REJECT(exists) and `reason` (its
    /// files come one by one; no policy against batches); `op` names the
    /// caller for the misuse error outside a batch.
    fn refuse_batch_one_by_one(
        &mut self,
        op: &'static str,
        reason: String,
    ) -> Result<Reject, ProtocolError> {
        if self.batch_files == 0 {
            return Err(ProtocolError::OfferKind {
                op,
                kind: "not a batch",
            });
        }
        let reject = Reject::new(RejectCode::Exists, reason);
        self.reject(reject.code, reject.reason.clone())?;
        Ok(reject)
    }

    /// A WRITE_WITH_IMM completion (`imm` = CRC32 of the chunk). Returns where the
    /// data is in the ring and where it belongs in the file. Errors close the session.
    /// Every error queues the ACK that tells the sender why
    /// (`poll_transmit`).
    pub fn on_chunk(&mut self, byte_len: u32, imm: u32) -> Result<ChunkPlacement, ChunkError> {
        self.on_chunk_of(byte_len, imm)
            .map(|(placement, _)| placement)
    }

    /// `on_chunk`, with the file the chunk belongs to (`accept`'s).
    pub fn on_chunk_of(
        &mut self,
        byte_len: u32,
        imm: u32,
    ) -> Result<(ChunkPlacement, &mut F), ChunkError> {
        let was_closed = self.state == ReceiverState::Closed;
        // Only Receiving places chunks, and it holds the file (`accept`
        // moved there with it): checked before anything is counted. The
        // file is out of its place while the chunk is, and back after.
        let placed = match self.file.take() {
            Some(file) => match self.place_chunk(byte_len, imm) {
                Ok(placement) => Ok((placement, file)),
                Err(e) => {
                    self.file = Some(file);
                    Err(e)
                }
            },
            None => Err(self.unexpected("WRITE_WITH_IMM").into()),
        };
        if let Err(e) = &placed
            && !was_closed
        {
            let reply = match e {
                ChunkError::TooLarge { .. } => {
                    Ack::new(AckStatus::Rejected, format!("{}: {e}", self.name))
                }
                ChunkError::Protocol(other) => Ack::new(
                    AckStatus::Protocol,
                    format!("protocol error: bad data write: {other}"),
                ),
            };
            self.close_with(Message::Ack(reply), true);
        }
        let (placement, file) = placed?;
        Ok((placement, self.file.insert(file)))
    }

    fn place_chunk(&mut self, written: u32, imm: u32) -> Result<ChunkPlacement, ChunkError> {
        if self.state != ReceiverState::Receiving {
            return Err(self.unexpected("WRITE_WITH_IMM").into());
        }
        let seq = self.chunks;
        // The write carries the chunk, then its tag (with a token).
        let tag_len = self.tag_len();
        let len = written.saturating_sub(tag_len);
        let bad = |reason| ProtocolError::BadChunk { seq, len, reason };
        if written <= tag_len {
            return Err(bad(if tag_len == 0 {
                "empty chunk"
            } else {
                "no longer than a chunk's tag"
            })
            .into());
        }
        if written > self.ring.slot_size {
            return Err(bad("larger than a ring slot").into());
        }
        let auth = match (tag_len, &self.chunk_key) {
            (0, _) => None,
            (_, Some(key)) => Some(ChunkAuth {
                key: key.clone(),
                offer: self.offers,
            }),
            (_, None) => return Err(bad("data before the sender was admitted").into()),
        };
        let in_flight = u64::from(self.unconsumed) + u64::from(self.pending);
        if in_flight >= u64::from(self.ring.slot_count) {
            return Err(ProtocolError::CreditOverrun {
                slot_count: self.ring.slot_count,
            }
            .into());
        }
        let end = if self.stream {
            if self.short_seen {
                return Err(bad("a stream's chunk after its short (last) chunk").into());
            }
            let end = self
                .bytes
                .checked_add(u64::from(len))
                .ok_or(bad("stream longer than 2^64 bytes"))?;
            if end > self.cfg.max_size {
                return Err(ChunkError::TooLarge {
                    limit: self.cfg.max_size,
                    option: "--max-size",
                });
            }
            let session = self.session_bytes.saturating_add(u64::from(len));
            if session > self.cfg.max_session_bytes {
                return Err(ChunkError::TooLarge {
                    limit: self.cfg.max_session_bytes,
                    option: "--max-session-size",
                });
            }
            self.session_bytes = session;
            end
        } else {
            self.bytes
                .checked_add(u64::from(len))
                .filter(|&e| e <= self.size)
                .ok_or(bad("past the announced file size"))?
        };
        if self.chunk_len == 0 {
            self.chunk_len = len;
        } else if len > self.chunk_len {
            return Err(bad("longer than the first chunk").into());
        }
        if len < self.chunk_len {
            // Only the chunk that completes the file may be short; for a
            // stream, no chunk may follow it.
            if self.stream {
                self.short_seen = true;
            } else if end != self.size {
                return Err(bad("short chunk before the end of the file").into());
            }
        }
        let slot = u32::try_from(seq % u64::from(self.ring.slot_count))
            .map_err(|_| bad("slot out of range"))?;
        let placement = ChunkPlacement {
            seq,
            slot,
            slot_offset: u64::from(slot) * u64::from(self.ring.slot_size),
            file_offset: self.bytes,
            len,
            expected_crc: imm,
            auth,
        };
        self.bytes = end;
        self.chunks += 1;
        self.unconsumed += 1;
        Ok(placement)
    }

    /// The engine consumed the oldest received slot (verified and written).
    /// Queues a CREDIT once `credit_batch` slots are free. Calls without an
    /// unconsumed chunk are ignored; after FIN no credit is sent (the sender
    /// needs none).
    pub fn chunk_done(&mut self) {
        if self.unconsumed == 0 {
            return;
        }
        self.unconsumed -= 1;
        self.pending += 1;
        if self.state == ReceiverState::Receiving && self.pending >= self.batch() {
            self.flush_credits();
        }
    }

    /// Queues all pending credits now (e.g. when the engine goes idle).
    pub fn flush_credits(&mut self) {
        if self.state != ReceiverState::Receiving || self.pending == 0 {
            return;
        }
        let count = self.pending;
        self.pending = 0;
        self.outbox.push_back(Message::Credit { count });
    }

    /// Ends the current file with an ACK (queued). From Verifying (any
    /// status) -> AwaitHello. From Receiving / AwaitDecision it is an abort
    /// (non-OK status only) and the session ends -> Closed.
    pub fn complete(&mut self, status: AckStatus, reason: String) -> Result<(), ProtocolError> {
        match self.state {
            ReceiverState::Verifying => self.state = ReceiverState::AwaitHello,
            ReceiverState::Receiving | ReceiverState::AwaitDecision if status != AckStatus::Ok => {
                self.state = ReceiverState::Closed
            }
            _ => return Err(self.wrong_state("complete")),
        }
        self.work_done();
        self.reset_file();
        self.outbox
            .push_back(Message::Ack(Ack::new(status, reason)));
        Ok(())
    }
}

/// Longest wait for a sender's AUTH (when a token is set), so that peers
/// without the secret cannot keep all session slots busy for long.
pub const AUTH_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a receiver has no session for a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Busy {
    /// `--max-sessions` sessions run.
    Sessions(usize),
    /// Without a token: this many sessions run from the connection's
    /// address already (no address may hold more than half the slots).
    FromAddress(usize),
}

/// The REJECT(busy) a receiver without a free session sends: instead of
/// the CHALLENGE without a token (no session machine exists for such a
/// connection), instead of AUTH_OK with one (`refuse_busy`).
pub fn busy_refusal(busy: Busy) -> Reject {
    let reason = match busy {
        Busy::Sessions(max) => format!(
            "the receiver is busy: {max} sessions are running (its --max-sessions); try again later"
        ),
        Busy::FromAddress(n) => format!(
            "the receiver is busy: {n} sessions from your address are running (an --insecure \
             receiver gives one address at most half of its --max-sessions); try again later"
        ),
    };
    Reject::new(RejectCode::Busy, reason)
}

/// The checks that need no file system: version, flags, name or path, size.
fn check_hello(h: &Hello, cfg: &ReceiverConfig) -> Result<(), Reject> {
    let max_size = cfg.max_size;
    if h.version != PROTOCOL_VERSION {
        let which = if h.version < PROTOCOL_VERSION {
            "an older sender: upgrade it"
        } else {
            "a newer sender: upgrade this receiver"
        };
        return Err(Reject::new(
            RejectCode::Version,
            format!(
                "the sender offers protocol version {}; this receiver speaks protocol version \
                 {PROTOCOL_VERSION} ({which})",
                h.version
            ),
        ));
    }
    {
        let unknown = h.caps & !hello_flags::KNOWN;
        if unknown != 0 {
            return Err(Reject::new(
                RejectCode::Version,
                format!("HELLO flags 0x{unknown:x} are not supported by this receiver"),
            ));
        }
        if h.is_stream() && h.is_directory() {
            return Err(Reject::new(
                RejectCode::Protocol,
                "an entry cannot be both a stream and a directory",
            ));
        }
        if (h.is_stream() || h.is_directory()) && h.size != 0 {
            return Err(Reject::new(
                RejectCode::Protocol,
                format!(
                    "a stream or directory announces size 0, not {} (a stream's FIN carries its size)",
                    h.size
                ),
            ));
        }
        if h.caps & hello_flags::RESUME != 0
            && (h.is_stream() || h.is_directory() || h.mtime.is_none())
        {
            return Err(Reject::new(
                RejectCode::Protocol,
                "only a file offered with its mtime can be resumed",
            ));
        }
        if h.caps & hello_flags::CHECKSUM != 0 && (h.is_stream() || h.is_directory()) {
            return Err(Reject::new(
                RejectCode::Protocol,
                "only a file can be offered with its SHA-256 (CHECKSUM): a stream's is not \
                 known before its data, a directory has none",
            ));
        }
        let existing_rules =
            hello_flags::IGNORE_TIMES | hello_flags::IGNORE_EXISTING | hello_flags::UPDATE;
        if h.caps & existing_rules != 0 && (h.is_stream() || h.is_directory()) {
            return Err(Reject::new(
                RejectCode::Protocol,
                "only a file can say what to do with an existing one (IGNORE_TIMES, \
                 IGNORE_EXISTING, UPDATE)",
            ));
        }
        if h.caps & hello_flags::DRY_RUN != 0 && h.caps & hello_flags::RESUME != 0 {
            return Err(Reject::new(
                RejectCode::Protocol,
                "a dry run keeps nothing to resume (DRY_RUN with RESUME)",
            ));
        }
        if h.caps & hello_flags::UPDATE != 0 && h.mtime.is_none() {
            return Err(Reject::new(
                RejectCode::Protocol,
                "only a file offered with its mtime can be compared by time (UPDATE)",
            ));
        }
        if let Some(piece) = &h.piece {
            check_piece(h, piece)?;
        }
        if let Err(e) = validate_path(&h.name, cfg.names) {
            return Err(Reject::new(RejectCode::BadName, e.to_string()));
        }
    }
    // A piece is held to the limit by its whole file's size.
    let size = h.piece.map_or(h.size, |p| p.file_size);
    if size > max_size {
        return Err(Reject::new(
            RejectCode::TooLarge,
            format!("file is {size} bytes; the receiver accepts at most {max_size} bytes"),
        ));
    }
    Ok(())
}

/// A piece of a file sent over lanes (PIECE): of a file with its mtime,
/// not a stream, directory, resume, compare or dry run, on a grid that
/// makes sense, announcing its own length.
fn check_piece(h: &Hello, piece: &super::assembly::Piece) -> Result<(), Reject> {
    let alone = hello_flags::STREAM
        | hello_flags::DIRECTORY
        | hello_flags::RESUME
        | hello_flags::CHECKSUM
        | hello_flags::DRY_RUN;
    if h.caps & alone != 0 || h.mtime.is_none() {
        return Err(Reject::new(
            RejectCode::Protocol,
            "a piece is of a file offered with its mtime, never resumed, compared or dry-run",
        ));
    }
    piece.check()?;
    if h.size != piece.bytes() {
        return Err(Reject::new(
            RejectCode::Protocol,
            format!(
                "piece {} announces {} bytes; on its grid it has {}",
                piece.index,
                h.size,
                piece.bytes()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_failures_travel_as_their_detail_and_are_read_back_as_codes() {
        for f in AuthFailure::ALL {
            let r = f.reject();
            assert_eq!(r.code, RejectCode::Auth);
            assert_eq!(r.reason, f.detail());
            assert_eq!(AuthFailure::from_reason(&r.reason), Some(f));
            // What an earlier build of version 5 sent.
            assert_eq!(AuthFailure::from_reason(&f.to_string()), Some(f));
        }
        assert_eq!(AuthFailure::from_reason("something else"), None);
    }
    use crate::proto::wire::{Digest, Mtime};

    const ADDR: u64 = 0x2000;

    fn cfg(slot_size: u32, slot_count: u32, credit_batch: u32) -> ReceiverConfig {
        ReceiverConfig {
            slot_size,
            slot_count,
            credit_batch,
            max_size: u64::MAX,
            max_files: DEFAULT_MAX_FILES,
            max_session_bytes: u64::MAX,
            names: NameRules::DEFAULT,
            digest_budget: DigestBudget::DEFAULT,
            timeout: Duration::from_secs(30),
            relay_allowed: false,
        }
    }

    /// A moment of the tests' clock.
    fn at(ms: u64) -> Instant {
        static T0: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        *T0.get_or_init(Instant::now) + Duration::from_millis(ms)
    }

    /// The engine reads its copy: the KEEPALIVE due once an interval passed.
    fn keepalive(r: &mut ReceiverSession) -> Result<Message, ProtocolError> {
        r.work_started(at(0))?;
        let due = r.poll_timeout().expect("a KEEPALIVE is due");
        assert_eq!(due, at(0) + keepalive_interval(r.cfg.timeout));
        r.handle_timeout(due)
            .expect("no timeout while the engine works");
        Ok(last_queued(r).expect("a KEEPALIVE"))
    }

    fn ring(c: &ReceiverConfig) -> RingInfo {
        RingInfo {
            addr: ADDR,
            rkey: 5,
            slot_size: c.slot_size,
            slot_count: c.slot_count,
        }
    }

    fn hello(name: &str, size: u64) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            caps: 0,
            name: name.into(),
            size,
            mode: 0o644,
            // Taken with and without a token.
            digest: DigestAlg::Sha256,
            mtime: None,
            piece: None,
        }
    }

    fn hello_v2(name: &str, caps: u32, size: u64) -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            caps,
            ..hello(name, size)
        }
    }

    fn fin(bytes: u64, chunks: u64) -> Fin {
        Fin {
            bytes,
            chunks,
            digest: Digest::Sha256([0; 32]),
        }
    }

    const NONCE: [u8; NONCE_LEN] = [0x3c; NONCE_LEN];

    fn token() -> Token {
        Token::new(b"the shared secret".to_vec()).unwrap()
    }

    const SENDER_NONCE: [u8; NONCE_LEN] = [0xa5; NONCE_LEN];

    fn conn() -> ConnectionId {
        ConnectionId {
            receiver_addr: "10.0.0.1".parse().unwrap(),
            receiver_qpn: 17,
            sender_addr: "10.0.0.2".parse().unwrap(),
            sender_qpn: 18,
        }
    }

    /// What a sender computes: its proof over `conn`'s transcript.
    fn prove_for(token: &Token, nonce_r: &[u8; NONCE_LEN], conn: &ConnectionId) -> Message {
        let key = SessionKey::derive(token, nonce_r, &SENDER_NONCE, conn);
        Message::Prove(Prove {
            version: PROTOCOL_VERSION,
            nonce: SENDER_NONCE,
            proof: key.sender_proof().to_vec(),
        })
    }

    fn good_auth() -> Message {
        prove_for(&token(), &NONCE, &conn())
    }

    fn with_auth(c: ReceiverConfig) -> ReceiverSession {
        ReceiverSession::with_auth(c, token(), NONCE, conn())
    }

    /// Session of a 4x100 ring, batch 2, file of 1000 bytes (100 for Verifying).
    /// What an engine call queued: its reply (the last message queued),
    /// or why it was refused.
    fn reply(
        result: Result<(), ProtocolError>,
        r: &mut ReceiverSession,
    ) -> Result<Message, ProtocolError> {
        result.map(|()| last_queued(r).expect("a reply"))
    }

    /// The last message queued (earlier ones, such as the CHALLENGE, are
    /// dropped).
    fn last_queued(r: &mut ReceiverSession) -> Option<Message> {
        std::iter::from_fn(|| r.poll_transmit()).last()
    }

    fn session_in(state: ReceiverState) -> ReceiverSession {
        session_in_auth(state, false)
    }

    fn relay(hops: &[&str]) -> Message {
        Message::Relay(Relay {
            hops: hops.iter().map(|h| h.to_string()).collect(),
        })
    }

    fn hop(host: &str) -> HopResult {
        HopResult::new(
            host.into(),
            crate::proto::HopVerdict::Ack(AckStatus::Ok),
            100,
            "",
        )
    }

    /// An authenticated session of a receiver that relays, admitted,
    /// with nothing offered yet.
    fn relay_receiver() -> ReceiverSession {
        let c = ReceiverConfig {
            relay_allowed: true,
            ..cfg(100 + CHUNK_TAG_LEN as u32, 4, 2)
        };
        let mut r = with_auth(c);
        assert_eq!(r.on_message(good_auth()), Ok(ReceiverEvent::Authenticated));
        r.admit().unwrap();
        sent(&mut r);
        r
    }

    /// `relay_receiver` told of `hops`: relaying.
    fn relaying(hops: &[&str]) -> ReceiverSession {
        let mut r = relay_receiver();
        let want: Vec<String> = hops.iter().map(|h| h.to_string()).collect();
        assert_eq!(r.on_message(relay(hops)), Ok(ReceiverEvent::Relay(want)));
        assert!(r.is_relaying());
        assert_eq!(sent(&mut r), []);
        r
    }

    /// `push_result` refused: its error, with nothing queued.
    fn result_refused(r: &mut ReceiverSession, result: HopResult) -> ProtocolError {
        let (state, queued) = (r.state(), r.outbox.clone());
        let err = r.push_result(result).unwrap_err();
        assert_eq!(r.outbox, queued, "{err}");
        assert_eq!(r.state(), state, "{err}");
        err
    }

    #[test]
    fn relay_comes_once_authenticated_before_any_offer() {
        // Appended message by message, up to MAX_RELAY_HOPS in all.
        let mut r = relaying(&["b:7471", "c"]);
        let rest: Vec<String> = (2..MAX_RELAY_HOPS).map(|i| format!("h{i}")).collect();
        for part in crate::proto::relay_messages(&rest).unwrap() {
            let hops = part.hops.clone();
            assert_eq!(
                r.on_message(Message::Relay(part)),
                Ok(ReceiverEvent::Relay(hops))
            );
        }
        assert_eq!(sent(&mut r), []);
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        // One more: over the limit, the session ends with one reply.
        let over = r.on_message(relay(&["z"]));
        assert_eq!(
            over,
            Err(RecvError::Protocol(ProtocolError::BadRelayChain(
                WireError::TooManyHops {
                    count: MAX_RELAY_HOPS + 1,
                    max: MAX_RELAY_HOPS
                }
            )))
        );
        let replies = sent(&mut r);
        assert!(
            matches!(&replies[..], [Message::Ack(a)] if a.status == AckStatus::Protocol),
            "{replies:?}"
        );
        assert_eq!(r.state(), ReceiverState::Closed);

        // One RELAY over the limit at once.
        let mut r = relay_receiver();
        let too_many: Vec<String> = (0..=MAX_RELAY_HOPS).map(|i| format!("h{i}")).collect();
        let mut parts = crate::proto::relay_messages(&too_many[..MAX_RELAY_HOPS]).unwrap();
        parts.last_mut().unwrap().hops.push("z".into());
        let last = parts.pop().unwrap();
        for part in parts {
            r.on_message(Message::Relay(part)).unwrap();
        }
        assert!(r.on_message(Message::Relay(last)).is_err());
        assert_eq!(sent(&mut r).len(), 1);

        // Without a token nothing authenticates the hosts: a protocol error.
        let mut r = ReceiverSession::new(ReceiverConfig {
            relay_allowed: true,
            ..cfg(100, 4, 2)
        });
        sent(&mut r);
        assert!(matches!(
            r.on_message(relay(&["b"])),
            Err(RecvError::Protocol(ProtocolError::RelayNotAllowed { .. }))
        ));
        assert_eq!(sent(&mut r).len(), 1);
        assert!(!r.is_relaying());
        assert_eq!(r.state(), ReceiverState::Closed);

        // Before the proof: the authentication failure, as for any message.
        let c = ReceiverConfig {
            relay_allowed: true,
            ..cfg(132, 4, 2)
        };
        let mut r = with_auth(c);
        sent(&mut r);
        assert_eq!(
            r.on_message(relay(&["b"])),
            Err(RecvError::Auth(AuthFailure::Required))
        );
        assert_eq!(
            sent(&mut r),
            [Message::Reject(AuthFailure::Required.reject())]
        );

        // After an offer: while it is open, once answered, once refused.
        let mut r = relay_receiver();
        r.on_message(Message::Hello(hello("f", 1))).unwrap();
        assert!(matches!(
            r.clone().on_message(relay(&["b"])),
            Err(RecvError::Protocol(ProtocolError::Unexpected {
                msg: "RELAY",
                ..
            }))
        ));
        r.reject(RejectCode::Exists, "f".into()).unwrap();
        sent(&mut r);
        assert!(matches!(
            r.on_message(relay(&["b"])),
            Err(RecvError::Protocol(ProtocolError::RelayNotAllowed { .. }))
        ));
        assert_eq!(sent(&mut r).len(), 1);
        let mut r = relay_receiver();
        // (A refusal by the machine itself is an offer too.)
        assert!(matches!(
            r.on_message(Message::Hello(hello("../f", 1))),
            Err(RecvError::Reject(_))
        ));
        sent(&mut r);
        assert!(r.on_message(relay(&["b"])).is_err());
        assert_eq!(sent(&mut r).len(), 1);
        assert!(!r.is_relaying());

        // A receiver that does not relay refuses with one REJECT and ends
        // the session (the sender asked for a chain that cannot be).
        let mut r = with_auth(cfg(132, 4, 2));
        r.on_message(good_auth()).unwrap();
        r.admit().unwrap();
        sent(&mut r);
        let refusal = Reject::new(
            RejectCode::Protocol,
            "this receiver does not relay (it runs without --allow-relay)",
        );
        assert_eq!(
            r.on_message(relay(&["b"])),
            Err(RecvError::SessionLimit(refusal.clone()))
        );
        assert_eq!(sent(&mut r), [Message::Reject(refusal)]);
        assert_eq!(r.state(), ReceiverState::Closed);
        assert!(!r.is_relaying());
    }

    #[test]
    fn results_are_queued_before_the_verdict_of_the_open_offer() {
        let c = cfg(100 + CHUNK_TAG_LEN as u32, 4, 2);
        // A directory: its RESULTs, then its ACK.
        let mut r = relaying(&["b"]);
        r.on_message(Message::Hello(hello_v2("d", hello_flags::DIRECTORY, 0)))
            .unwrap();
        r.push_result(hop("a")).unwrap();
        r.push_result(hop("b")).unwrap();
        // One per host of the chain (this receiver and b).
        assert_eq!(
            result_refused(&mut r, hop("c")),
            ProtocolError::TooManyResults { max: 2 }
        );
        r.accept_directory().unwrap();
        assert_eq!(
            sent(&mut r),
            [
                Message::Result(hop("a")),
                Message::Result(hop("b")),
                Message::Ack(Ack::new(AckStatus::Ok, ""))
            ]
        );
        // Answered: no offer is open.
        assert!(matches!(
            result_refused(&mut r, hop("a")),
            ProtocolError::WrongState {
                op: "push_result",
                ..
            }
        ));
        // A file: before its MR, while its data comes, while it is
        // verified; the count starts over with each offer.
        r.on_message(Message::Hello(hello("f", 100))).unwrap();
        r.push_result(hop("b")).unwrap();
        r.accept(ring(&c), ()).unwrap();
        r.on_chunk(100 + CHUNK_TAG_LEN as u32, 0).unwrap();
        assert_eq!(r.state(), ReceiverState::Receiving);
        // A RESULT RESULT cannot carry: refused, not counted.
        assert!(matches!(
            result_refused(&mut r, hop("")),
            ProtocolError::BadResult(WireError::BadHost { .. })
        ));
        let long = HopResult {
            reason: "r".repeat(crate::proto::wire::MAX_REASON + 1),
            ..hop("a")
        };
        assert!(matches!(
            result_refused(&mut r, long),
            ProtocolError::BadResult(WireError::TooLong { .. })
        ));
        r.chunk_done();
        r.on_message(Message::Fin(fin(100, 1))).unwrap();
        assert_eq!(r.state(), ReceiverState::Verifying);
        r.push_result(hop("a")).unwrap();
        assert_eq!(
            result_refused(&mut r, hop("a")),
            ProtocolError::TooManyResults { max: 2 }
        );
        r.complete(AckStatus::Ok, String::new()).unwrap();
        let out = sent(&mut r);
        let kinds: Vec<&str> = out.iter().map(Message::kind).collect();
        assert_eq!(kinds.first(), Some(&"RESULT"));
        assert_eq!(kinds.last(), Some(&"ACK"));
        assert_eq!(kinds.iter().filter(|k| **k == "RESULT").count(), 2);
        let mr = kinds.iter().position(|k| *k == "MR").unwrap();
        assert!(kinds[..mr] == ["RESULT"], "{kinds:?}");
        // Refusals and verdicts without data: RESULTs first too.
        r.on_message(Message::Hello(hello("g", 1))).unwrap();
        r.push_result(hop("a")).unwrap();
        r.reject(RejectCode::Exists, "g".into()).unwrap();
        let out = sent(&mut r);
        assert!(matches!(&out[..], [Message::Result(_), Message::Reject(_)]));
        let kept = Hello {
            caps: hello_flags::MTIME,
            mtime: Some(Mtime { secs: 5, nanos: 0 }),
            ..hello("k", 10)
        };
        r.on_message(Message::Hello(kept)).unwrap();
        r.push_result(hop("a")).unwrap();
        r.push_result(hop("b")).unwrap();
        assert_eq!(
            r.existing(Existing::File {
                size: 10,
                secs: 5,
                nsec: 0
            }),
            Ok(Standing::Stays(AckStatus::Unchanged))
        );
        let out = sent(&mut r);
        assert!(matches!(
            &out[..],
            [Message::Result(_), Message::Result(_), Message::Ack(a)] if a.status == AckStatus::Unchanged
        ));
        // A resumed file's HAVE and a comparison: still open.
        r.on_message(Message::Hello(resumable(1000))).unwrap();
        r.have(Have::complete(1000), ()).unwrap();
        assert_eq!(r.state(), ReceiverState::AwaitFrom);
        r.push_result(hop("b")).unwrap();
        r.on_message(Message::Compare { sha256: [1; 32] }).unwrap();
        assert_eq!(r.state(), ReceiverState::Comparing);
        r.push_result(hop("a")).unwrap();
        r.same().unwrap();
        let kinds: Vec<&str> = sent(&mut r).iter().map(Message::kind).collect();
        assert_eq!(kinds, ["HAVE", "RESULT", "RESULT", "ACK"]);
        // A batch is one offer.
        r.on_message(Message::Batch(vec![hello("m1", 1), hello("m2", 1)]))
            .unwrap();
        r.push_result(hop("a")).unwrap();
        r.reject(RejectCode::Exists, "m1".into()).unwrap();
        assert_eq!(sent(&mut r).len(), 2);
        // Once closed: nothing.
        r.on_message(Message::Bye).unwrap();
        assert!(matches!(
            result_refused(&mut r, hop("a")),
            ProtocolError::WrongState { .. }
        ));
    }

    #[test]
    fn results_need_a_relay() {
        // Authenticated, an offer open, no RELAY came.
        let mut r = relay_receiver();
        r.on_message(Message::Hello(hello("f", 1))).unwrap();
        assert!(!r.is_relaying());
        assert!(matches!(
            result_refused(&mut r, hop("a")),
            ProtocolError::RelayNotAllowed { .. }
        ));
        // A sender never sends RESULT.
        let mut r = relaying(&["b"]);
        r.on_message(Message::Hello(hello("f", 1))).unwrap();
        assert!(matches!(
            r.on_message(Message::Result(hop("b"))),
            Err(RecvError::Protocol(ProtocolError::Unexpected {
                msg: "RESULT",
                ..
            }))
        ));
        assert_eq!(sent(&mut r).len(), 1);
    }

    /// The engine's work started at `at(0)` with the session's clock
    /// there: KEEPALIVEs every interval, well past the session's timeout
    /// (the sender waits for the engine, its silence ends nothing), and
    /// the state unchanged.
    fn keepalives_while_working(r: &mut ReceiverSession) {
        let state = r.state();
        r.progressed(at(0));
        r.work_started(at(0)).unwrap();
        assert_eq!(sent(r), [], "nothing at once");
        let interval = keepalive_interval(r.cfg.timeout);
        let k_max = (r.cfg.timeout.as_millis() / interval.as_millis()) as u32 * 3;
        for k in 1..=k_max {
            let due = r.poll_timeout().expect("a KEEPALIVE is due");
            assert_eq!(due, at(0) + interval * k);
            assert_eq!(r.handle_timeout(due - Duration::from_millis(1)), Ok(()));
            assert_eq!(sent(r), [], "not before it is due");
            assert_eq!(r.handle_timeout(due), Ok(()));
            assert_eq!(sent(r), [Message::Keepalive]);
            assert_eq!(r.state(), state);
        }
        assert!(interval * k_max > r.cfg.timeout);
    }

    /// The engine's verdict ended its work: no KEEPALIVE is due, the wait
    /// for the sender is back (from the engine's `progressed`).
    fn no_more_keepalives(r: &mut ReceiverSession) {
        let now = at(100_000);
        r.progressed(now);
        assert_eq!(r.poll_timeout(), Some(now + r.cfg.timeout));
        let interval = keepalive_interval(r.cfg.timeout);
        assert_eq!(r.handle_timeout(now + interval), Ok(()));
        assert_eq!(sent(r), [], "a KEEPALIVE after the verdict");
    }

    /// `work_started` refused: the misuse error, nothing queued, no
    /// KEEPALIVE due, the state unchanged.
    fn work_refused(r: &mut ReceiverSession) -> ProtocolError {
        let (state, queued, due) = (r.state(), r.outbox.clone(), r.poll_timeout());
        let err = r.work_started(at(0)).unwrap_err();
        assert_eq!(r.outbox, queued, "{err}");
        assert_eq!(r.state(), state, "{err}");
        assert_eq!(r.poll_timeout(), due, "{err}");
        assert_eq!(
            err,
            ProtocolError::WrongState {
                op: "work_started",
                state: state.as_str()
            }
        );
        err
    }

    /// A host of a relay chain waits for the hosts after it before its
    /// verdict on an offer (after the offer, after a file's FIN): KEEPALIVEs
    /// keep its sender waiting until the verdict, whichever it is.
    #[test]
    fn a_relaying_receiver_sends_keepalives_while_an_offer_awaits_its_verdict() {
        let c = cfg(100 + CHUNK_TAG_LEN as u32, 4, 2);
        let mut r = relaying(&["b"]);
        // A file: after its offer, until the MR.
        r.on_message(Message::Hello(hello("f", 100))).unwrap();
        keepalives_while_working(&mut r);
        r.push_result(hop("a")).unwrap();
        r.accept(ring(&c), ()).unwrap();
        assert!(matches!(
            &sent(&mut r)[..],
            [Message::Result(_), Message::Mr(_)]
        ));
        no_more_keepalives(&mut r);
        // Its data is the sender's to send: no work there.
        r.on_chunk(100 + CHUNK_TAG_LEN as u32, 0).unwrap();
        work_refused(&mut r);
        r.chunk_done();
        // After its FIN, until its ACK.
        r.on_message(Message::Fin(fin(100, 1))).unwrap();
        assert_eq!(r.state(), ReceiverState::Verifying);
        sent(&mut r);
        keepalives_while_working(&mut r);
        r.push_result(hop("b")).unwrap();
        r.complete(AckStatus::Ok, String::new()).unwrap();
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        sent(&mut r);
        no_more_keepalives(&mut r);
        work_refused(&mut r);
        // A directory, until its ACK.
        r.on_message(Message::Hello(hello_v2("d", hello_flags::DIRECTORY, 0)))
            .unwrap();
        keepalives_while_working(&mut r);
        r.accept_directory().unwrap();
        assert_eq!(sent(&mut r), [Message::Ack(Ack::new(AckStatus::Ok, ""))]);
        no_more_keepalives(&mut r);
        // Until a REJECT.
        r.on_message(Message::Hello(hello("g", 1))).unwrap();
        keepalives_while_working(&mut r);
        r.reject(RejectCode::Exists, "g".into()).unwrap();
        sent(&mut r);
        no_more_keepalives(&mut r);
        // What is under the name: a file that stays is a verdict; one that
        // goes on is not (the wait goes on).
        let kept = Hello {
            caps: hello_flags::MTIME,
            mtime: Some(Mtime { secs: 5, nanos: 0 }),
            ..hello("k", 10)
        };
        let there = Existing::File {
            size: 10,
            secs: 5,
            nsec: 0,
        };
        r.on_message(Message::Hello(kept.clone())).unwrap();
        keepalives_while_working(&mut r);
        assert_eq!(r.existing(there), Ok(Standing::Stays(AckStatus::Unchanged)));
        sent(&mut r);
        no_more_keepalives(&mut r);
        r.on_message(Message::Hello(kept)).unwrap();
        keepalives_while_working(&mut r);
        assert_eq!(r.existing(Existing::NoFile), Ok(Standing::Proceed));
        let due = r.poll_timeout().expect("still working");
        assert_eq!(r.handle_timeout(due), Ok(()));
        assert_eq!(sent(&mut r), [Message::Keepalive]);
        // A verdict that ends the session ends the work too.
        r.complete(AckStatus::Io, "gone".into()).unwrap();
        assert_eq!(r.state(), ReceiverState::Closed);
        assert_eq!(r.poll_timeout(), None);
        work_refused(&mut r);
        // A batch, and a dry run's file, until their verdicts.
        let mut r = relaying(&["b"]);
        r.on_message(Message::Batch(vec![hello("m1", 1), hello("m2", 1)]))
            .unwrap();
        keepalives_while_working(&mut r);
        r.accept(ring(&c), ()).unwrap();
        sent(&mut r);
        no_more_keepalives(&mut r);
        let mut r = relaying(&["b"]);
        let dry = Hello {
            caps: hello_flags::DRY_RUN | hello_flags::MTIME,
            mtime: Some(Mtime { secs: 5, nanos: 0 }),
            ..hello("w", 10)
        };
        r.on_message(Message::Hello(dry)).unwrap();
        keepalives_while_working(&mut r);
        r.would_receive().unwrap();
        sent(&mut r);
        no_more_keepalives(&mut r);
        // After FROM too (the offer still awaits its MR).
        let mut r = relaying(&["b"]);
        r.on_message(Message::Hello(resumable(1000))).unwrap();
        r.have(Have::nothing("none"), ()).unwrap();
        sent(&mut r);
        // (Between the HAVE and FROM the sender has the word.)
        work_refused(&mut r);
        r.on_message(Message::From { offset: 0 }).unwrap();
        assert_eq!(r.state(), ReceiverState::AwaitDecision);
        keepalives_while_working(&mut r);
        r.accept(ring(&c), ()).unwrap();
        sent(&mut r);
        no_more_keepalives(&mut r);
    }

    /// Outside a relaying session, a file's verification and an offer
    /// without RESUME are no work that keeps the sender waiting: misuse,
    /// nothing queued; so is every other state of a relaying session.
    #[test]
    fn work_started_waits_for_the_hosts_after_it_only_in_a_relaying_session() {
        let c = cfg(100 + CHUNK_TAG_LEN as u32, 4, 2);
        // Authenticated, no RELAY.
        let mut r = relay_receiver();
        work_refused(&mut r);
        r.on_message(Message::Hello(hello("f", 100))).unwrap();
        work_refused(&mut r);
        r.accept(ring(&c), ()).unwrap();
        r.on_chunk(100 + CHUNK_TAG_LEN as u32, 0).unwrap();
        r.chunk_done();
        r.on_message(Message::Fin(fin(100, 1))).unwrap();
        assert_eq!(r.state(), ReceiverState::Verifying);
        work_refused(&mut r);
        r.complete(AckStatus::Ok, String::new()).unwrap();
        r.on_message(Message::Hello(hello_v2("d", hello_flags::DIRECTORY, 0)))
            .unwrap();
        work_refused(&mut r);
        // Without a token.
        for state in [ReceiverState::AwaitDecision, ReceiverState::Verifying] {
            let mut r = session_in(state);
            assert_eq!(r.state(), state);
            work_refused(&mut r);
        }
        // A relaying session, where no offer awaits the engine's verdict.
        let mut r = relaying(&["b"]);
        work_refused(&mut r);
        r.on_message(Message::Hello(resumable(1000))).unwrap();
        r.have(Have::complete(1000), ()).unwrap();
        assert_eq!(r.state(), ReceiverState::AwaitFrom);
        work_refused(&mut r);
        r.on_message(Message::Bye).unwrap_err();
        assert_eq!(r.state(), ReceiverState::Closed);
        work_refused(&mut r);
    }

    /// As `session_in`; with `auth` the session requires a token and every
    /// state past AwaitAuth is reached through a correct AUTH.
    fn session_in_auth(state: ReceiverState, auth: bool) -> ReceiverSession {
        // With a token a slot holds a chunk of 100 and its tag.
        let tag = if auth { CHUNK_TAG_LEN as u32 } else { 0 };
        let c = cfg(100 + tag, 4, 2);
        let mut r = if auth {
            with_auth(c)
        } else {
            ReceiverSession::new(c)
        };
        if auth && state != ReceiverState::AwaitAuth {
            assert_eq!(r.on_message(good_auth()), Ok(ReceiverEvent::Authenticated));
            assert_eq!(r.state(), ReceiverState::AwaitAdmission);
            if state == ReceiverState::AwaitAdmission {
                return r;
            }
            r.admit().unwrap();
        }
        match state {
            ReceiverState::AwaitAuth => {
                assert!(auth, "AwaitAuth exists only with a token");
                return r;
            }
            ReceiverState::AwaitHello => return r,
            ReceiverState::Closed => {
                r.on_message(Message::Bye).unwrap();
                return r;
            }
            _ => {}
        }
        let size = if state == ReceiverState::Verifying {
            100
        } else {
            1000
        };
        r.on_message(Message::Hello(hello("f", size))).unwrap();
        if state == ReceiverState::AwaitDecision {
            return r;
        }
        r.accept(ring(&c), ()).unwrap();
        r.on_chunk(100 + tag, 0).unwrap();
        if state == ReceiverState::Verifying {
            r.on_message(Message::Fin(fin(100, 1))).unwrap();
        }
        assert_eq!(r.state(), state);
        r
    }

    const STATES: [ReceiverState; 5] = [
        ReceiverState::AwaitHello,
        ReceiverState::AwaitDecision,
        ReceiverState::Receiving,
        ReceiverState::Verifying,
        ReceiverState::Closed,
    ];

    fn all_messages(size_for_fin: u64) -> Vec<Message> {
        vec![
            relay(&["b:1"]),
            Message::Result(HopResult::new(
                "b:1".into(),
                crate::proto::HopVerdict::Ack(AckStatus::Ok),
                1,
                "",
            )),
            Message::Hello(hello("x", 1)),
            Message::Mr(RingInfo::default()),
            Message::Reject(Reject::new(RejectCode::Io, "read error")),
            Message::Credit { count: 1 },
            Message::Fin(fin(size_for_fin, 1)),
            Message::Ack(Ack::new(AckStatus::Ok, "")),
            Message::Ack(Ack::new(AckStatus::Io, "x")),
            Message::Bye,
            Message::Challenge(Challenge {
                flags: AUTH_REQUIRED,
                nonce: NONCE,
            }),
            // Protocol 2's AUTH (an old sender), empty and with a MAC.
            Message::Auth { mac: Vec::new() },
            Message::Auth {
                mac: token().mac(&NONCE).to_vec(),
            },
            Message::Prove(Prove {
                version: PROTOCOL_VERSION,
                nonce: SENDER_NONCE,
                proof: Vec::new(),
            }),
            good_auth(),
            // Right token, another nonce (a relayed challenge); another
            // connection (a relayed proof); wrong token; a short proof.
            prove_for(&token(), &[0; NONCE_LEN], &conn()),
            prove_for(
                &token(),
                &NONCE,
                &ConnectionId {
                    sender_qpn: 19,
                    ..conn()
                },
            ),
            prove_for(
                &token(),
                &NONCE,
                &ConnectionId {
                    sender_addr: "10.0.0.3".parse().unwrap(),
                    ..conn()
                },
            ),
            prove_for(
                &Token::new(b"a guess of a token".to_vec()).unwrap(),
                &NONCE,
                &conn(),
            ),
            Message::Prove(Prove {
                version: PROTOCOL_VERSION,
                nonce: SENDER_NONCE,
                proof: vec![0; 32],
            }),
            // A good proof from another protocol version.
            Message::Prove(Prove {
                version: PROTOCOL_VERSION - 1,
                ..match good_auth() {
                    Message::Prove(p) => p,
                    _ => unreachable!(),
                }
            }),
            Message::AuthOk { proof: [7; 32] },
            Message::Keepalive,
        ]
    }

    /// What an AUTH-state session answers to `msg`.
    fn expected_in_await_auth(msg: &Message) -> Result<ReceiverEvent, RecvError> {
        match msg {
            Message::Auth { .. } => Err(RecvError::Version(Reject::new(
                RejectCode::Version,
                "the sender speaks protocol version 2 or older (its AUTH is protocol 2's); \
                 this receiver speaks protocol version 8: upgrade the sender",
            ))),
            Message::Prove(p) if p.version != PROTOCOL_VERSION => {
                Err(RecvError::Version(Reject::new(
                    RejectCode::Version,
                    "the sender speaks protocol version 7; this receiver speaks protocol version 8",
                )))
            }
            Message::Prove(p) if p.proof.is_empty() => Err(RecvError::Auth(AuthFailure::NoToken)),
            m if *m == good_auth() => Ok(ReceiverEvent::Authenticated),
            Message::Prove(_) => Err(RecvError::Auth(AuthFailure::WrongToken)),
            Message::Bye => Ok(ReceiverEvent::Closed),
            _ => Err(RecvError::Auth(AuthFailure::Required)),
        }
    }

    #[test]
    fn await_auth_every_message() {
        for msg in all_messages(100) {
            let mut r = session_in_auth(ReceiverState::AwaitAuth, true);
            sent(&mut r);
            let want = expected_in_await_auth(&msg);
            let res = r.on_message(msg.clone());
            assert_eq!(res, want, "{}", msg.kind());
            // A good PROVE waits for the engine's admission: nothing is
            // answered before it, and only the admission makes the channel.
            let mut channel = None;
            if res == Ok(ReceiverEvent::Authenticated) {
                assert_eq!(sent(&mut r), [], "before admission");
                channel = Some(r.admit().unwrap());
                assert!(r.admit().is_err(), "admitted once");
            }
            // Admitted, it is answered with the receiver's proof, and only
            // then is there a channel; anything else gets one refusal.
            let replies = sent(&mut r);
            if res.is_ok() && msg != Message::Bye {
                let key = SessionKey::derive(&token(), &NONCE, &SENDER_NONCE, &conn());
                assert_eq!(
                    replies,
                    [Message::AuthOk {
                        proof: key.receiver_proof()
                    }]
                );
                let mut mine = key.channel(Role::Sender);
                let mut theirs = channel.expect("a channel");
                let sealed = mine.seal(b"frame").unwrap();
                assert_eq!(theirs.open(&sealed).unwrap(), b"frame");
            } else {
                if res.is_err() {
                    assert_eq!(replies.len(), 1, "{}: {replies:?}", msg.kind());
                    assert!(
                        matches!(&replies[0], Message::Reject(j)
                            if j.code == RejectCode::Auth || j.code == RejectCode::Version),
                        "{}: {replies:?}",
                        msg.kind()
                    );
                }
            }
            let next = match want {
                Ok(ReceiverEvent::Authenticated) => ReceiverState::AwaitHello,
                _ => ReceiverState::Closed,
            };
            assert_eq!(r.state(), next, "{}", msg.kind());
            // Failed or not, nothing may be placed or exposed yet.
            assert!(r.clone().accept(ring(&cfg(100, 4, 2)), ()).is_err());
            assert!(r.clone().on_chunk(100, 0).is_err());
        }
        // No WRITE_WITH_IMM is legal before AUTH either.
        let mut r = session_in_auth(ReceiverState::AwaitAuth, true);
        assert_eq!(
            r.on_chunk(100, 0),
            Err(ChunkError::Protocol(ProtocolError::Unexpected {
                msg: "WRITE_WITH_IMM",
                state: "AWAIT_AUTH"
            }))
        );
        assert_eq!(r.state(), ReceiverState::Closed);
    }

    /// With a token the FIN's digest must be SHA-256: a CRC32 can be kept
    /// by whoever alters the data, so an authenticated session refuses it
    /// (the entry only; directories carry no data).
    #[test]
    fn with_a_token_only_sha256_digests_are_taken() {
        let mut r = session_in_auth(ReceiverState::AwaitHello, true);
        sent(&mut r);
        let crc = Hello {
            digest: DigestAlg::Crc32,
            ..hello("f", 10)
        };
        let Err(RecvError::Reject(rej)) = r.on_message(Message::Hello(crc.clone())) else {
            panic!("a CRC32 offer was taken with a token")
        };
        assert_eq!(rej.code, RejectCode::Protocol);
        assert!(rej.reason.contains("--verify sha256"), "{}", rej.reason);
        assert_eq!(r.state(), ReceiverState::AwaitHello, "the session goes on");
        let dir = Hello {
            digest: DigestAlg::Crc32,
            ..hello_v2("d", hello_flags::DIRECTORY, 0)
        };
        assert!(matches!(
            r.on_message(Message::Hello(dir)),
            Ok(ReceiverEvent::Offer(_))
        ));
        r.accept_directory().unwrap();
        assert!(matches!(
            r.on_message(Message::Hello(hello("f", 10))),
            Ok(ReceiverEvent::Offer(_))
        ));
        // Without a token CRC32 is the default and taken.
        let mut open = session_in(ReceiverState::AwaitHello);
        assert!(matches!(
            open.on_message(Message::Hello(crc)),
            Ok(ReceiverEvent::Offer(_))
        ));
    }

    /// A session whose offers are all refused ends after
    /// MAX_REFUSALS_IN_A_ROW of them; an accepted entry starts the count
    /// again.
    #[test]
    fn a_session_of_refusals_only_ends() {
        let c = cfg(100, 4, 2);
        let mut r = ReceiverSession::new(c);
        let bad = || Message::Hello(hello("../x", 1));
        for _ in 0..MAX_REFUSALS_IN_A_ROW - 2 {
            assert!(matches!(r.on_message(bad()), Err(RecvError::Reject(_))));
        }
        // The engine's refusals count too (one short of the limit); an
        // accepted directory resets.
        r.on_message(Message::Hello(hello("f", 1))).unwrap();
        r.reject(RejectCode::Exists, "f exists".into()).unwrap();
        r.on_message(Message::Hello(hello_v2("d", hello_flags::DIRECTORY, 0)))
            .unwrap();
        r.accept_directory().unwrap();
        for _ in 0..MAX_REFUSALS_IN_A_ROW {
            assert!(matches!(r.on_message(bad()), Err(RecvError::Reject(_))));
        }
        let Err(RecvError::SessionLimit(end)) = r.on_message(Message::Hello(hello("g", 1))) else {
            panic!("the session went on")
        };
        assert!(end.reason.contains("in a row"), "{}", end.reason);
        assert_eq!(r.state(), ReceiverState::Closed);
        assert_eq!(
            sent(&mut r).last(),
            Some(&Message::Reject(end)),
            "the sender is told why"
        );
    }

    /// After a right PROVE the engine admits the sender or refuses it as
    /// busy; nothing from the sender is taken in between, and neither
    /// decision is possible anywhere else.
    #[test]
    fn admission_follows_a_right_proof_only() {
        // Refused: REJECT(busy) instead of AUTH_OK, no channel, closed.
        let mut r = session_in_auth(ReceiverState::AwaitAdmission, true);
        sent(&mut r);
        let busy = r.refuse_busy(2).expect("refused");
        assert_eq!(busy.code, RejectCode::Busy);
        assert!(busy.reason.contains("2 sessions"), "{}", busy.reason);
        assert_eq!(sent(&mut r), [Message::Reject(busy)]);
        assert_eq!(r.state(), ReceiverState::Closed);
        assert!(r.admit().is_err(), "admitted after the refusal");
        // Nothing from the sender is taken while the engine decides.
        for msg in all_messages(100) {
            let mut r = session_in_auth(ReceiverState::AwaitAdmission, true);
            sent(&mut r);
            assert!(r.on_message(msg.clone()).is_err(), "{}", msg.kind());
            assert_eq!(r.state(), ReceiverState::Closed, "{}", msg.kind());
            assert!(r.admit().is_err(), "{}", msg.kind());
            assert!(
                !sent(&mut r)
                    .iter()
                    .any(|m| matches!(m, Message::AuthOk { .. }))
            );
        }
        let mut r = session_in_auth(ReceiverState::AwaitAdmission, true);
        assert!(r.on_chunk(100, 0).is_err());
        // Admitted once only; neither decision exists in another state.
        let mut r = session_in_auth(ReceiverState::AwaitAdmission, true);
        r.admit().unwrap();
        assert!(r.admit().is_err());
        assert!(r.refuse_busy(2).is_err());
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        for state in STATES {
            for auth in [false, true] {
                let mut r = session_in_auth(state, auth);
                assert!(r.admit().is_err(), "{state:?}");
                assert!(r.refuse_busy(2).is_err(), "{state:?}");
            }
        }
        let mut r = session_in_auth(ReceiverState::AwaitAuth, true);
        assert!(r.admit().is_err());
        assert!(r.refuse_busy(2).is_err());
    }

    #[test]
    fn auth_failures_say_why() {
        for (f, reason) in [
            (
                AuthFailure::WrongToken,
                "authentication failed: wrong token",
            ),
            (
                AuthFailure::NoToken,
                "authentication failed: the sender has no token",
            ),
            (
                AuthFailure::Required,
                "authentication failed: authentication required",
            ),
        ] {
            assert_eq!(f.to_string(), reason);
            assert_eq!(RecvError::Auth(f).to_string(), reason);
            assert_eq!(f.reject(), Reject::new(RejectCode::Auth, f.detail()));
        }
    }

    #[test]
    fn challenge_carries_the_nonce_only_with_a_token() {
        let c = cfg(100, 4, 2);
        assert_eq!(
            with_auth(c).poll_transmit().unwrap(),
            Message::Challenge(Challenge {
                flags: AUTH_REQUIRED,
                nonce: NONCE
            })
        );
        let mut open = ReceiverSession::new(c);
        assert_eq!(open.state(), ReceiverState::AwaitHello);
        assert_eq!(
            open.poll_transmit().unwrap(),
            Message::Challenge(Challenge {
                flags: 0,
                nonce: [0; NONCE_LEN]
            })
        );
    }

    /// Every sequence of up to three messages from a fresh session that
    /// requires a token, with the engine accepting every offer it can: an
    /// MR (or a placed chunk) only ever follows a correct AUTH.
    #[test]
    fn no_ring_before_a_good_auth() {
        let c = cfg(100, 4, 2);
        let msgs = all_messages(0);
        let good = good_auth();
        let mut paths = 0u32;
        let mut rings = 0u32;
        let mut stack: Vec<(ReceiverSession, bool, usize)> = vec![(with_auth(c), false, 0)];
        while let Some((r, authed, depth)) = stack.pop() {
            paths += 1;
            let mut probe = r.clone();
            let exposed =
                probe.accept(ring(&c), ()).is_ok() || probe.clone().on_chunk(1, 0).is_ok();
            assert!(!exposed || authed, "ring exposed without AUTH: {r:?}");
            rings += u32::from(exposed);
            if depth == 3 {
                continue;
            }
            for m in &msgs {
                let mut next = r.clone();
                let res = next.on_message(m.clone());
                let now_authed = authed || (res.is_ok() && *m == good);
                // Engine: a session is free.
                if res == Ok(ReceiverEvent::Authenticated) {
                    next.admit().unwrap();
                }
                // Engine: accept an offer when the machine hands one over.
                if let Ok(ReceiverEvent::Offer(_)) = res {
                    assert!(now_authed, "offer before AUTH");
                    assert!(next.accept(ring(&c), ()).is_ok());
                    rings += 1;
                }
                stack.push((next, now_authed, depth + 1));
            }
        }
        assert_eq!(
            paths,
            (0..=3).map(|d| msgs.len().pow(d)).sum::<usize>() as u32
        );
        assert!(rings > 0, "the good path must reach a ring");
    }

    #[test]
    fn every_state_message_pair() {
        use ReceiverState::*;
        for (state, auth) in STATES.into_iter().flat_map(|s| [(s, false), (s, true)]) {
            // A FIN matching what arrived, so only the state decides legality.
            for msg in all_messages(100) {
                let mut r = session_in_auth(state, auth);
                // Make the Receiving session's FIN consistent: 100 bytes of a 100-byte file.
                if state == Receiving {
                    r.size = 100;
                }
                let res = r.on_message(msg.clone());
                let ctx = format!("{} in {} (auth {auth})", msg.kind(), state.as_str());
                // RELAY before any offer: refused by this receiver's policy
                // (it does not relay), or a protocol error without a token.
                if let (AwaitHello, Message::Relay(_)) = (state, &msg) {
                    let want = if auth {
                        RecvError::SessionLimit(Reject::new(
                            RejectCode::Protocol,
                            "this receiver does not relay (it runs without --allow-relay)",
                        ))
                    } else {
                        RecvError::Protocol(ProtocolError::RelayNotAllowed {
                            reason: "a relay chain needs a session authenticated with a token",
                        })
                    };
                    assert_eq!(res, Err(want), "{ctx}");
                    assert_eq!(r.state(), Closed, "{ctx}");
                    continue;
                }
                let legal = match (state, &msg) {
                    (AwaitHello, Message::Hello(_)) => Some(AwaitDecision),
                    (AwaitHello, Message::Bye) => Some(Closed),
                    (Receiving, Message::Fin(_)) => Some(Verifying),
                    // (A file is receiving here: KEEPALIVE is for streams.)
                    _ => None,
                };
                match legal {
                    Some(next) => {
                        assert!(res.is_ok(), "{ctx}: {res:?}");
                        assert_eq!(r.state(), next, "{ctx}");
                    }
                    None => {
                        let want = match (&msg, state) {
                            (Message::Reject(j), st) if st != Closed => {
                                ProtocolError::PeerRejected {
                                    code: j.code,
                                    reason: j.reason.clone(),
                                }
                            }
                            _ => ProtocolError::Unexpected {
                                msg: msg.kind(),
                                state: state.as_str(),
                            },
                        };
                        assert_eq!(res, Err(RecvError::Protocol(want)), "{ctx}");
                        assert_eq!(r.state(), Closed, "{ctx}: errors end the session");
                    }
                }
            }
            // Chunks are only legal while Receiving.
            let mut r = session_in_auth(state, auth);
            let res = r.on_chunk(100 + r.tag_len(), 0);
            if state == Receiving {
                assert!(res.is_ok());
            } else {
                assert_eq!(
                    res,
                    Err(ChunkError::Protocol(ProtocolError::Unexpected {
                        msg: "WRITE_WITH_IMM",
                        state: state.as_str()
                    }))
                );
            }
        }
    }

    #[test]
    fn local_calls_in_wrong_state() {
        use ReceiverState::*;
        for state in STATES {
            let c = cfg(100, 4, 2);
            if state != AwaitDecision {
                let mut r = session_in(state);
                let e = |op| ProtocolError::WrongState {
                    op,
                    state: state.as_str(),
                };
                assert_eq!(reply(r.accept(ring(&c), ()), &mut r), Err(e("accept")));
                assert_eq!(
                    reply(r.reject(RejectCode::Busy, "b".into()), &mut r),
                    Err(e("reject"))
                );
                assert_eq!(r.state(), state);
            }
            let mut r = session_in(state);
            let ok = reply(r.complete(AckStatus::Ok, String::new()), &mut r);
            assert_eq!(ok.is_ok(), state == Verifying, "{}", state.as_str());
            let mut r = session_in(state);
            let fail = reply(r.complete(AckStatus::Io, "disk full".into()), &mut r);
            assert_eq!(
                fail.is_ok(),
                matches!(state, Verifying | Receiving | AwaitDecision),
                "{}",
                state.as_str()
            );
            if fail.is_ok() {
                let next = if state == Verifying {
                    AwaitHello
                } else {
                    Closed
                };
                assert_eq!(r.state(), next);
                assert_eq!(fail, Ok(Message::Ack(Ack::new(AckStatus::Io, "disk full"))));
            }
        }
    }

    /// A dotfile (file, directory, or below one) is refused with the
    /// reason the sender shows, unless the receiver's rules allow it; an
    /// invisible character or the reserved prefix in any case never is.
    #[test]
    fn dotfiles_follow_the_rules_and_invisible_names_never_pass() {
        for (name, caps) in [
            (".bashrc", 0),
            ("dir/.ssh/authorized_keys", 0),
            (".ssh", hello_flags::DIRECTORY),
        ] {
            let mut r = ReceiverSession::new(cfg(100, 4, 1));
            let Err(RecvError::Reject(j)) = r.on_message(Message::Hello(hello_v2(name, caps, 0)))
            else {
                panic!("{name:?} not rejected");
            };
            assert_eq!(j.code, RejectCode::BadName, "{name:?}");
            assert!(
                j.reason.ends_with(
                    "names starting with '.' are refused; the receiver allows them with \
                     --allow-dotfiles"
                ),
                "{}",
                j.reason
            );
            assert_eq!(r.state(), ReceiverState::AwaitHello);
            let mut r = ReceiverSession::new(ReceiverConfig {
                names: NameRules {
                    allow_dotfiles: true,
                },
                ..cfg(100, 4, 1)
            });
            let h = hello_v2(name, caps, 0);
            assert_eq!(
                r.on_message(Message::Hello(h.clone())),
                Ok(ReceiverEvent::Offer(h))
            );
        }
        for name in ["evil\u{202e}txt.exe", "a\u{200b}b", "d/.RDMA-XFER-1.part"] {
            let mut r = ReceiverSession::new(ReceiverConfig {
                names: NameRules {
                    allow_dotfiles: true,
                },
                ..cfg(100, 4, 1)
            });
            let Err(RecvError::Reject(j)) = r.on_message(Message::Hello(hello_v2(name, 0, 0)))
            else {
                panic!("{name:?} not rejected");
            };
            assert_eq!(j.code, RejectCode::BadName, "{name:?}");
        }
    }

    #[test]
    fn hello_checks_reject_and_stay() {
        let mut c = cfg(100, 4, 1);
        c.max_size = 1000;
        let mut r = ReceiverSession::new(c);
        for bad in ["", ".", "..", "../x", "/etc/passwd", "a\nb"] {
            let Err(RecvError::Reject(j)) = r.on_message(Message::Hello(hello(bad, 1))) else {
                panic!("{bad:?} not rejected");
            };
            assert_eq!(j.code, RejectCode::BadName, "{bad:?}");
            assert_eq!(r.state(), ReceiverState::AwaitHello);
        }
        let Err(RecvError::Reject(j)) = r.on_message(Message::Hello(hello("big", 1001))) else {
            panic!("size not rejected");
        };
        assert_eq!(j.code, RejectCode::TooLarge);
        assert_eq!(
            j.reason,
            "file is 1001 bytes; the receiver accepts at most 1000 bytes"
        );
        // Exactly the limit is fine; the offer is handed to the engine unchanged.
        let h = hello("edge", 1000);
        assert_eq!(
            r.on_message(Message::Hello(h.clone())),
            Ok(ReceiverEvent::Offer(h))
        );
        // Engine-side rejection returns to AwaitHello.
        assert_eq!(
            reply(r.reject(RejectCode::Exists, "exists".into()), &mut r),
            Ok(Message::Reject(Reject::new(RejectCode::Exists, "exists")))
        );
        assert_eq!(r.state(), ReceiverState::AwaitHello);
    }

    #[test]
    fn accept_checks_ring() {
        let c = cfg(100, 4, 1);
        let mut r = session_in(ReceiverState::AwaitDecision);
        let mut other = ring(&c);
        other.slot_count = 5;
        assert!(matches!(
            r.accept(other, ()),
            Err(ProtocolError::BadRing { .. })
        ));
        assert!(matches!(
            r.accept(
                RingInfo {
                    addr: u64::MAX,
                    ..ring(&c)
                },
                ()
            ),
            Err(ProtocolError::BadRing { .. })
        ));
        assert_eq!(r.state(), ReceiverState::AwaitDecision);
        assert_eq!(
            reply(r.accept(ring(&c), ()), &mut r),
            Ok(Message::Mr(ring(&c)))
        );
        assert_eq!(r.state(), ReceiverState::Receiving);
    }

    fn receiving(c: ReceiverConfig, size: u64) -> ReceiverSession {
        let mut r = ReceiverSession::new(c);
        r.on_message(Message::Hello(hello("f", size))).unwrap();
        r.accept(ring(&c), ()).unwrap();
        // The CHALLENGE and the MR: what comes next is the test's.
        assert_eq!(sent(&mut r).len(), 2);
        r
    }

    #[test]
    fn with_a_token_every_write_carries_its_chunk_then_its_tag() {
        // Slots of 100 bytes hold chunks of up to 68 and their 32-byte tag.
        let c = cfg(100, 4, 2);
        let mut r = with_auth(c);
        assert_eq!(r.tag_len(), CHUNK_TAG_LEN as u32);
        assert_eq!(r.on_message(good_auth()), Ok(ReceiverEvent::Authenticated));
        r.admit().unwrap();
        let key = SessionKey::derive(&token(), &NONCE, &SENDER_NONCE, &conn()).chunk_key();
        // A directory and a refused file are offers too: the file is the
        // third, and its chunks are tagged as offer 3.
        r.on_message(Message::Hello(hello_v2("d", hello_flags::DIRECTORY, 0)))
            .unwrap();
        r.accept_directory().unwrap();
        r.on_message(Message::Hello(hello("no", 10))).unwrap();
        r.reject(RejectCode::Exists, "exists".into()).unwrap();
        r.on_message(Message::Hello(hello("f", 100))).unwrap();
        r.accept(ring(&c), ()).unwrap();
        let p = r.on_chunk(68 + 32, 1).unwrap();
        assert_eq!((p.len, p.file_offset, p.slot_offset), (68, 0, 0));
        assert_eq!(
            p.auth,
            Some(ChunkAuth {
                key: key.clone(),
                offer: 3
            })
        );
        // A write with no room for a chunk besides its tag, or one larger
        // than a slot, is a protocol error.
        for bad in [32, 101] {
            let mut r2 = r.clone();
            assert!(
                matches!(
                    r2.on_chunk(bad, 0),
                    Err(ChunkError::Protocol(ProtocolError::BadChunk { .. }))
                ),
                "{bad}"
            );
        }
        r.chunk_done();
        let p = r.on_chunk(32 + 32, 2).unwrap();
        assert_eq!((p.len, p.file_offset, p.slot_offset), (32, 68, 100));
        assert_eq!(p.auth.map(|a| a.offer), Some(3));
        // Without a token nothing is tagged and a write is all chunk.
        let mut plain = receiving(c, 150);
        assert_eq!(plain.tag_len(), 0);
        let p = plain.on_chunk(100, 1).unwrap();
        assert_eq!((p.len, p.auth), (100, None));
    }

    #[test]
    fn placement_wraps_and_last_chunk_is_short() {
        let c = cfg(100, 3, 1);
        let mut r = receiving(c, 750);
        for i in 0..8u64 {
            let len = if i == 7 { 50 } else { 100 };
            let p = r.on_chunk(len, i as u32 + 7).unwrap();
            assert_eq!(
                p,
                ChunkPlacement {
                    seq: i,
                    slot: (i % 3) as u32,
                    slot_offset: (i % 3) * 100,
                    file_offset: i * 100,
                    len,
                    expected_crc: i as u32 + 7,
                    auth: None,
                }
            );
            r.chunk_done();
            assert_eq!(last_queued(&mut r), Some(Message::Credit { count: 1 }));
        }
        assert_eq!(
            r.on_message(Message::Fin(fin(750, 8))),
            Ok(ReceiverEvent::Fin(fin(750, 8), ()))
        );
        assert_eq!(r.state(), ReceiverState::Verifying);
    }

    #[test]
    fn chunk_length_rules() {
        let c = cfg(100, 8, 1);
        let err = |r: &mut ReceiverSession, len| match r.on_chunk(len, 0) {
            Err(ChunkError::Protocol(ProtocolError::BadChunk { reason, .. })) => reason,
            other => panic!("expected BadChunk, got {other:?}"),
        };
        assert_eq!(err(&mut receiving(c, 1000), 0), "empty chunk");
        assert_eq!(err(&mut receiving(c, 1000), 101), "larger than a ring slot");
        assert_eq!(
            err(&mut receiving(c, 50), 60),
            "past the announced file size"
        );
        // Sender chunk length may be below the slot size; it is fixed by the first chunk.
        let mut r = receiving(c, 1000);
        r.on_chunk(64, 0).unwrap();
        assert_eq!(err(&mut r.clone(), 65), "longer than the first chunk");
        assert_eq!(err(&mut r, 63), "short chunk before the end of the file");
        assert_eq!(r.state(), ReceiverState::Closed);
        // Short final chunk is fine, then nothing more fits.
        let mut r = receiving(c, 100);
        r.on_chunk(64, 0).unwrap();
        r.on_chunk(36, 0).unwrap();
        assert_eq!(err(&mut r, 1), "past the announced file size");
        // Zero-byte file: no chunk allowed.
        assert_eq!(err(&mut receiving(c, 0), 1), "past the announced file size");
    }

    #[test]
    fn sizes_around_the_chunk_length() {
        let c = cfg(100, 4, 1);
        for (size, lens) in [
            (0u64, vec![]),
            (99, vec![99]),
            (100, vec![100]),
            (101, vec![100, 1]),
            (199, vec![100, 99]),
            (200, vec![100, 100]),
        ] {
            let mut r = receiving(c, size);
            for &len in &lens {
                r.on_chunk(len, 0).unwrap();
                r.chunk_done();
            }
            let n = lens.len() as u64;
            // A FIN disagreeing in bytes or chunks is fatal.
            for bad in [fin(size + 1, n), fin(size, n + 1)] {
                assert!(matches!(
                    r.clone().on_message(Message::Fin(bad)),
                    Err(RecvError::Protocol(ProtocolError::FinMismatch { .. }))
                ));
            }
            assert_eq!(
                r.on_message(Message::Fin(fin(size, n))),
                Ok(ReceiverEvent::Fin(fin(size, n), ())),
                "size {size}"
            );
        }
    }

    #[test]
    fn fin_before_all_data_or_wrong_digest() {
        let c = cfg(100, 4, 1);
        let mut r = receiving(c, 150);
        r.on_chunk(100, 0).unwrap();
        assert_eq!(
            r.clone().on_message(Message::Fin(fin(100, 1))),
            Err(RecvError::Protocol(ProtocolError::FinMismatch {
                fin_bytes: 100,
                fin_chunks: 1,
                got_bytes: 100,
                got_chunks: 1,
                size: 150
            }))
        );
        r.on_chunk(50, 0).unwrap();
        let crc = Fin {
            digest: Digest::Crc32(0),
            ..fin(150, 2)
        };
        assert_eq!(
            r.on_message(Message::Fin(crc)),
            Err(RecvError::Protocol(ProtocolError::DigestAlgMismatch {
                expected: DigestAlg::Sha256,
                got: DigestAlg::Crc32
            }))
        );
    }

    #[test]
    fn credit_batching_and_overrun() {
        let c = cfg(10, 4, 3);
        let mut r = receiving(c, 1000);
        for _ in 0..4 {
            r.on_chunk(10, 0).unwrap();
        }
        // A fifth chunk without credit returned overruns the ring.
        assert_eq!(
            r.clone().on_chunk(10, 0),
            Err(ChunkError::Protocol(ProtocolError::CreditOverrun {
                slot_count: 4
            }))
        );
        r.chunk_done();
        assert_eq!(last_queued(&mut r), None);
        r.chunk_done();
        assert_eq!(last_queued(&mut r), None);
        // Consumed but not yet credited slots still count as in flight.
        assert!(r.clone().on_chunk(10, 0).is_err());
        r.chunk_done();
        assert_eq!(last_queued(&mut r), Some(Message::Credit { count: 3 }));
        r.flush_credits();
        assert_eq!(last_queued(&mut r), None);
        r.chunk_done();
        assert_eq!(last_queued(&mut r), None);
        r.flush_credits();
        assert_eq!(last_queued(&mut r), Some(Message::Credit { count: 1 }));
        r.flush_credits();
        assert_eq!(last_queued(&mut r), None);
        // Nothing left to consume: extra chunk_done calls are ignored.
        r.chunk_done();
        assert_eq!(last_queued(&mut r), None);
        r.flush_credits();
        assert_eq!(last_queued(&mut r), None);
        for _ in 0..4 {
            r.on_chunk(10, 0).unwrap();
        }
    }

    #[test]
    fn credit_batch_is_clamped() {
        // Batch larger than the ring would deadlock; 0 would never send.
        for (batch, want) in [(0u32, 1u32), (1, 1), (99, 2)] {
            let c = cfg(10, 2, batch);
            let mut r = receiving(c, 1000);
            r.on_chunk(10, 0).unwrap();
            r.on_chunk(10, 0).unwrap();
            let mut got = Vec::new();
            for _ in 0..2 {
                r.chunk_done();
                got.extend(last_queued(&mut r));
            }
            assert_eq!(
                got.first(),
                Some(&Message::Credit { count: want }),
                "batch {batch}"
            );
        }
    }

    #[test]
    fn no_credits_after_fin() {
        let c = cfg(10, 4, 1);
        let mut r = receiving(c, 20);
        r.on_chunk(10, 0).unwrap();
        r.on_chunk(10, 0).unwrap();
        r.on_message(Message::Fin(fin(20, 2))).unwrap();
        r.chunk_done();
        assert_eq!(last_queued(&mut r), None);
        r.flush_credits();
        assert_eq!(last_queued(&mut r), None);
        assert_eq!(
            reply(r.complete(AckStatus::Ok, String::new()), &mut r),
            Ok(Message::Ack(Ack::new(AckStatus::Ok, "")))
        );
        r.chunk_done();
        assert_eq!(last_queued(&mut r), None);
    }

    #[test]
    fn zero_byte_file_and_multi_file_session() {
        let c = cfg(10, 2, 1);
        let mut r = ReceiverSession::new(c);
        // File 1: zero bytes.
        r.on_message(Message::Hello(hello("empty", 0))).unwrap();
        r.accept(ring(&c), ()).unwrap();
        r.on_message(Message::Fin(fin(0, 0))).unwrap();
        r.complete(AckStatus::Ok, String::new()).unwrap();
        // File 2: rejected by the engine.
        r.on_message(Message::Hello(hello("b", 5))).unwrap();
        r.reject(RejectCode::NoSpace, "full".into()).unwrap();
        // File 3: data; counters restart at 0.
        r.on_message(Message::Hello(hello("c", 15))).unwrap();
        r.accept(ring(&c), ()).unwrap();
        let p = r.on_chunk(10, 0).unwrap();
        assert_eq!((p.seq, p.slot, p.file_offset), (0, 0, 0));
        r.chunk_done();
        r.on_chunk(5, 0).unwrap();
        r.on_message(Message::Fin(fin(15, 2))).unwrap();
        r.complete(AckStatus::Integrity, "crc".into()).unwrap();
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        assert_eq!(r.on_message(Message::Bye), Ok(ReceiverEvent::Closed));
        assert_eq!(r.state(), ReceiverState::Closed);
    }

    #[test]
    fn hello_versions_flags_and_paths() {
        use hello_flags::{DIRECTORY, MTIME, STREAM};
        let mut c = cfg(100, 4, 1);
        c.max_size = 1000;
        let code = |h: Hello| {
            let mut r = ReceiverSession::new(c);
            let res = r.on_message(Message::Hello(h));
            match res {
                Ok(ReceiverEvent::Offer(_)) => {
                    assert_eq!(r.state(), ReceiverState::AwaitDecision);
                    None
                }
                Err(RecvError::Reject(j)) => {
                    // A refused offer leaves the session waiting for the next.
                    assert_eq!(r.state(), ReceiverState::AwaitHello);
                    Some(j.code)
                }
                // Another version ends the session, naming both.
                Err(RecvError::Version(j)) => {
                    assert_eq!(r.state(), ReceiverState::Closed);
                    assert_eq!(sent(&mut r).last(), Some(&Message::Reject(j.clone())));
                    Some(j.code)
                }
                other => panic!("{other:?}"),
            }
        };
        let v = |version, caps, name: &str, size| Hello {
            version,
            ..hello_v2(name, caps, size)
        };
        let t = Some(crate::proto::Mtime { secs: 1, nanos: 2 });
        for (h, want) in [
            // Older senders (a protocol-2 sender offers plain files as 1).
            (v(1, 0, "f", 1), Some(RejectCode::Version)),
            (v(2, 0, "f", 1), Some(RejectCode::Version)),
            (v(2, STREAM, "f", 0), Some(RejectCode::Version)),
            // Version 3: flags and relative paths.
            (v(8, 0, "f", 1000), None),
            (v(8, 0, "a/b/c", 1), None),
            (v(8, STREAM, "stdin", 0), None),
            (v(8, DIRECTORY, "top/sub", 0), None),
            (
                Hello {
                    mtime: t,
                    ..v(8, DIRECTORY | MTIME, "top", 0)
                },
                None,
            ),
            (v(8, 0, "f", 1001), Some(RejectCode::TooLarge)),
            (v(8, hello_flags::KEEP_MODE, "f", 1), None),
            (v(8, 1 << 4, "f", 1), Some(RejectCode::Version)),
            (v(8, 1 << 12, "f", 1), Some(RejectCode::Version)),
            (v(8, hello_flags::CHECKSUM, "f", 1), None),
            (
                v(8, hello_flags::CHECKSUM | STREAM, "s", 0),
                Some(RejectCode::Protocol),
            ),
            (
                v(8, hello_flags::CHECKSUM | DIRECTORY, "d", 0),
                Some(RejectCode::Protocol),
            ),
            (
                v(8, hello_flags::RESUME, "f", 1),
                Some(RejectCode::Protocol),
            ),
            (v(8, 1 << 31 | STREAM, "f", 0), Some(RejectCode::Version)),
            (v(8, STREAM | DIRECTORY, "f", 0), Some(RejectCode::Protocol)),
            (v(8, STREAM, "f", 5), Some(RejectCode::Protocol)),
            (v(8, DIRECTORY, "d", 5), Some(RejectCode::Protocol)),
            // Other versions.
            (v(0, 0, "f", 1), Some(RejectCode::Version)),
            (v(7, 0, "f", 1), Some(RejectCode::Version)),
            (v(6, 0, "f", 1), Some(RejectCode::Version)),
            (v(5, 0, "f", 1), Some(RejectCode::Version)),
            (v(3, 0, "f", 1), Some(RejectCode::Version)),
            (v(4, 0, "f", 1), Some(RejectCode::Version)),
            (v(u16::MAX, 0, "f", 1), Some(RejectCode::Version)),
        ] {
            assert_eq!(code(h.clone()), want, "{h:?}");
        }
        // A stream is not held to --max-size up front (its size is unknown).
        assert_eq!(code(v(8, STREAM, "s", 0)), None);
        // A piece of a file on lanes: with its mtime, its own length, on a
        // grid that makes sense; never a stream, resumed, compared or dry
        // run.
        let grid = crate::proto::assembly::Piece {
            transfer: crate::proto::assembly::TransferId([1; 16]),
            index: 1,
            piece_size: 1 << 20,
            file_size: (1 << 20) + 10,
        };
        let piece = |caps, size, piece| Hello {
            mtime: t,
            piece: Some(piece),
            ..v(8, hello_flags::PIECE | hello_flags::MTIME | caps, "p", size)
        };
        // Held to --max-size by its whole file's size, not its own.
        assert_eq!(code(piece(0, 10, grid)), Some(RejectCode::TooLarge));
        let mut roomy = c;
        roomy.max_size = grid.file_size;
        let mut r = ReceiverSession::new(roomy);
        let offered = r.on_message(Message::Hello(piece(0, 10, grid)));
        assert!(
            matches!(offered, Ok(ReceiverEvent::Offer(_))),
            "{offered:?}"
        );
        for (bad, why) in [
            (piece(0, 11, grid), "not its length"),
            (
                piece(0, 10, crate::proto::assembly::Piece { index: 2, ..grid }),
                "off the grid",
            ),
            (
                piece(
                    0,
                    10,
                    crate::proto::assembly::Piece {
                        piece_size: 1000,
                        ..grid
                    },
                ),
                "a grid not aligned",
            ),
            (piece(hello_flags::RESUME, 10, grid), "resumed"),
            (piece(hello_flags::CHECKSUM, 10, grid), "compared"),
            (piece(hello_flags::DRY_RUN, 10, grid), "a dry run"),
            (
                Hello {
                    mtime: None,
                    caps: hello_flags::PIECE,
                    ..piece(0, 10, grid)
                },
                "no mtime",
            ),
        ] {
            assert_eq!(code(bad), Some(RejectCode::Protocol), "{why}");
        }
        // The refusal names both versions.
        let mut r = ReceiverSession::new(c);
        let Err(RecvError::Version(j)) = r.on_message(Message::Hello(v(2, 0, "f", 1))) else {
            panic!("version 2 accepted");
        };
        assert!(
            j.reason.contains("protocol version 2") && j.reason.contains("protocol version 8"),
            "{}",
            j.reason
        );
    }

    #[test]
    fn hostile_paths_are_refused_for_every_kind() {
        use hello_flags::{DIRECTORY, STREAM};
        for name in [
            "",
            ".",
            "..",
            "../x",
            "a/../../x",
            "a/..",
            "/etc/passwd",
            "/",
            "a//b",
            "a/",
            "./a",
            "a/./b",
            "a\\b",
            "..\\x",
            "a/b\0c",
            "a/new\nline",
            "esc\u{1b}[31m/x",
        ] {
            for caps in [0, STREAM, DIRECTORY] {
                let mut r = ReceiverSession::new(cfg(100, 4, 1));
                let Err(RecvError::Reject(j)) =
                    r.on_message(Message::Hello(hello_v2(name, caps, 0)))
                else {
                    panic!("{name:?} (flags {caps}) not rejected");
                };
                assert_eq!(j.code, RejectCode::BadName, "{name:?}");
                assert_eq!(r.state(), ReceiverState::AwaitHello);
            }
        }
        let long = format!("{}/x", "d/".repeat(2048));
        let mut r = ReceiverSession::new(cfg(100, 4, 1));
        assert!(matches!(
            r.on_message(Message::Hello(hello_v2(&long, 0, 1))),
            Err(RecvError::Reject(Reject {
                code: RejectCode::BadName,
                ..
            }))
        ));
    }

    #[test]
    fn directories_are_answered_without_a_ring() {
        let c = cfg(100, 4, 1);
        let mut r = ReceiverSession::new(c);
        let dir = hello_v2("top/sub", hello_flags::DIRECTORY, 0);
        assert_eq!(
            r.on_message(Message::Hello(dir.clone())),
            Ok(ReceiverEvent::Offer(dir))
        );
        assert!(r.offer_is_directory() && !r.offer_is_stream());
        // No ring for a directory, and no data.
        assert_eq!(
            r.clone().accept(ring(&c), ()),
            Err(ProtocolError::OfferKind {
                op: "accept",
                kind: "a directory"
            })
        );
        assert!(r.clone().on_chunk(1, 0).is_err());
        // Refused (exists as a file, say) or created: back to AwaitHello.
        let mut refused = r.clone();
        assert_eq!(
            reply(
                refused.reject(RejectCode::Exists, "a file".into()),
                &mut refused
            ),
            Ok(Message::Reject(Reject::new(RejectCode::Exists, "a file")))
        );
        assert_eq!(refused.state(), ReceiverState::AwaitHello);
        assert_eq!(
            reply(r.accept_directory(), &mut r),
            Ok(Message::Ack(Ack::new(AckStatus::Ok, "")))
        );
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        assert_eq!(
            reply(r.accept_directory(), &mut r),
            Err(ProtocolError::WrongState {
                op: "accept_directory",
                state: "AWAIT_HELLO"
            })
        );
        // A file offer cannot be answered as a directory; the next file
        // of the session gets its ring.
        r.on_message(Message::Hello(hello_v2("top/sub/f", 0, 5)))
            .unwrap();
        assert!(!r.offer_is_directory());
        assert_eq!(
            r.clone().accept_directory(),
            Err(ProtocolError::OfferKind {
                op: "accept_directory",
                kind: "not a directory"
            })
        );
        assert!(r.accept(ring(&c), ()).is_ok());
        // A failed directory (complete with an error) aborts like a file.
        let mut r = ReceiverSession::new(c);
        r.on_message(Message::Hello(hello_v2("d", hello_flags::DIRECTORY, 0)))
            .unwrap();
        assert!(r.complete(AckStatus::Io, "x".into()).is_ok());
        assert_eq!(r.state(), ReceiverState::Closed);
    }

    fn receiving_stream(c: ReceiverConfig) -> ReceiverSession {
        let mut r = ReceiverSession::new(c);
        r.on_message(Message::Hello(hello_v2("s", hello_flags::STREAM, 0)))
            .unwrap();
        assert!(r.offer_is_stream());
        r.accept(ring(&c), ()).unwrap();
        r
    }

    #[test]
    fn keepalive_only_while_a_stream_waits_for_input() {
        let c = cfg(100, 3, 1);
        let mut stream = receiving_stream(c);
        for _ in 0..3 {
            assert_eq!(
                stream.on_message(Message::Keepalive),
                Ok(ReceiverEvent::Keepalive)
            );
        }
        let mut file = ReceiverSession::new(c);
        file.on_message(Message::Hello(hello_v2("f", 0, 250)))
            .unwrap();
        file.accept(ring(&c), ()).unwrap();
        assert!(matches!(
            file.on_message(Message::Keepalive),
            Err(RecvError::Protocol(ProtocolError::Unexpected { .. }))
        ));
        assert_eq!(file.state(), ReceiverState::Closed);
    }

    #[test]
    fn streams_take_chunks_until_fin_announces_the_size() {
        let c = cfg(100, 3, 1);
        let mut r = receiving_stream(c);
        for i in 0..7u64 {
            let p = r.on_chunk(100, i as u32).unwrap();
            assert_eq!((p.seq, p.slot, p.file_offset), (i, (i % 3) as u32, i * 100));
            r.chunk_done();
        }
        assert_eq!(
            r.on_message(Message::Keepalive),
            Ok(ReceiverEvent::Keepalive)
        );
        let p = r.on_chunk(42, 0).unwrap();
        assert_eq!((p.file_offset, p.len), (700, 42));
        r.chunk_done();
        // Nothing may follow the short chunk.
        let mut after = r.clone();
        assert_eq!(
            after.on_chunk(42, 0),
            Err(ChunkError::Protocol(ProtocolError::BadChunk {
                seq: 8,
                len: 42,
                reason: "a stream's chunk after its short (last) chunk"
            }))
        );
        assert_eq!(after.state(), ReceiverState::Closed);
        // The FIN must agree with what arrived.
        for bad in [fin(741, 8), fin(742, 9), fin(0, 0)] {
            assert_eq!(
                r.clone().on_message(Message::Fin(bad.clone())),
                Err(RecvError::Protocol(ProtocolError::StreamFinMismatch {
                    fin_bytes: bad.bytes,
                    fin_chunks: bad.chunks,
                    got_bytes: 742,
                    got_chunks: 8
                }))
            );
        }
        assert_eq!(
            r.on_message(Message::Fin(fin(742, 8))),
            Ok(ReceiverEvent::Fin(fin(742, 8), ()))
        );
        assert_eq!(r.state(), ReceiverState::Verifying);
        assert!(r.complete(AckStatus::Ok, String::new()).is_ok());
    }

    #[test]
    fn empty_streams_and_chunk_rules() {
        let c = cfg(100, 4, 1);
        let mut r = receiving_stream(c);
        assert_eq!(
            r.on_message(Message::Fin(fin(0, 0))),
            Ok(ReceiverEvent::Fin(fin(0, 0), ()))
        );
        let err = |r: &mut ReceiverSession, len| match r.on_chunk(len, 0) {
            Err(ChunkError::Protocol(ProtocolError::BadChunk { reason, .. })) => reason,
            other => panic!("expected BadChunk, got {other:?}"),
        };
        assert_eq!(err(&mut receiving_stream(c), 0), "empty chunk");
        assert_eq!(
            err(&mut receiving_stream(c), 101),
            "larger than a ring slot"
        );
        let mut r = receiving_stream(c);
        r.on_chunk(64, 0).unwrap();
        assert_eq!(err(&mut r.clone(), 65), "longer than the first chunk");
        // A stream of one short chunk.
        let mut r = receiving_stream(c);
        r.on_chunk(5, 0).unwrap();
        assert!(r.on_message(Message::Fin(fin(5, 1))).is_ok());
        // Credit overruns count for streams too.
        let mut r = receiving_stream(c);
        for _ in 0..4 {
            r.on_chunk(100, 0).unwrap();
        }
        assert_eq!(
            r.on_chunk(100, 0),
            Err(ChunkError::Protocol(ProtocolError::CreditOverrun {
                slot_count: 4
            }))
        );
    }

    #[test]
    fn a_stream_over_max_size_is_stopped_as_it_arrives() {
        let mut c = cfg(100, 4, 1);
        c.max_size = 250;
        let mut r = receiving_stream(c);
        r.on_chunk(100, 0).unwrap();
        r.chunk_done();
        r.on_chunk(100, 0).unwrap();
        r.chunk_done();
        // 300 > 250: stopped, whatever the chunk's length.
        let mut over = r.clone();
        assert_eq!(
            over.on_chunk(100, 0),
            Err(ChunkError::TooLarge {
                limit: 250,
                option: "--max-size"
            })
        );
        assert_eq!(over.state(), ReceiverState::Closed);
        assert_eq!(
            RecvError::TooLarge {
                limit: 250,
                option: "--max-size"
            }
            .to_string(),
            "the stream is larger than the receiver accepts: more than 250 bytes (--max-size)"
        );
        // Exactly the limit is fine.
        assert!(r.on_chunk(50, 0).is_ok());
        assert!(r.on_message(Message::Fin(fin(250, 3))).is_ok());
        // The abort the engine then sends is legal from Receiving only.
        let mut r = receiving_stream(c);
        r.on_chunk(100, 0).unwrap();
        let _ = r.on_chunk(100, 0);
        r.chunk_done();
        r.chunk_done();
        assert!(r.on_chunk(100, 0).is_err());
        assert!(r.complete(AckStatus::Rejected, "too large".into()).is_err());
    }

    #[test]
    fn error_messages() {
        let e = RecvError::Reject(Reject::new(RejectCode::Exists, "f.bin exists"));
        assert_eq!(e.to_string(), "offer rejected (file exists): f.bin exists");
        let e = RecvError::Protocol(ProtocolError::Unexpected {
            msg: "HELLO",
            state: "RECEIVING",
        });
        assert_eq!(e.to_string(), "unexpected HELLO in state RECEIVING");
    }

    /// Everything queued for the sender.
    fn sent(r: &mut ReceiverSession) -> Vec<Message> {
        std::iter::from_fn(|| r.poll_transmit()).collect()
    }

    #[test]
    fn a_session_offers_at_most_max_files_entries() {
        let mut c = cfg(100, 4, 1);
        c.max_files = 3;
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        // Refused offers count too: a peer cannot offer forever.
        for name in ["../a", "../b"] {
            let got = r.on_message(Message::Hello(hello_v2(name, 0, 1)));
            assert!(matches!(got, Err(RecvError::Reject(_))), "{got:?}");
        }
        r.on_message(Message::Hello(hello_v2("d", hello_flags::DIRECTORY, 0)))
            .unwrap();
        r.accept_directory().unwrap();
        sent(&mut r);
        let got = r.on_message(Message::Hello(hello_v2("f", 0, 1)));
        let Err(RecvError::SessionLimit(rej)) = got else {
            panic!("{got:?}")
        };
        assert_eq!(rej.code, RejectCode::TooLarge);
        assert!(rej.reason.contains("more than 3 entries") && rej.reason.contains("--max-files"));
        assert_eq!(r.state(), ReceiverState::Closed);
        assert_eq!(sent(&mut r), [Message::Reject(rej)]);
    }

    fn batch(names: &[&str], size: u64) -> Message {
        Message::Batch(names.iter().map(|n| hello(n, size)).collect())
    }

    /// A batch with a member --link-dest may hold is refused (exists, not
    /// a policy): its files come one by one. Only a batch, only undecided.
    #[test]
    fn a_batch_with_a_link_dest_member_is_refused_for_one_by_one() {
        let c = cfg(100, 4, 1);
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        r.on_message(batch(&["a", "b"], 70)).unwrap();
        let refusal = r.refuse_batch_for_link("b").unwrap();
        assert_eq!(refusal.code, RejectCode::Exists);
        assert_eq!(
            refusal.reason,
            "b may be linked from --link-dest: the files come one by one"
        );
        assert_eq!(sent(&mut r), [Message::Reject(refusal)]);
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        assert!(r.refuse_batch_for_link("b").is_err(), "decided already");
        // A file offered alone is not a batch.
        r.on_message(Message::Hello(hello("b", 70))).unwrap();
        assert!(r.refuse_batch_for_link("b").is_err());
        assert_eq!(r.state(), ReceiverState::AwaitDecision);
        assert!(sent(&mut r).is_empty());
    }

    #[test]
    fn a_batch_is_received_as_one_file_and_its_files_count_once_accepted() {
        let c = cfg(100, 4, 1);
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        let got = r.on_message(batch(&["d/a", "d/b", "c"], 70)).unwrap();
        let ReceiverEvent::Batch(members) = got else {
            panic!("{got:?}")
        };
        assert_eq!(members.len(), 3);
        assert_eq!(r.state(), ReceiverState::AwaitDecision);
        assert!(!r.offer_is_directory() && !r.offer_is_stream());
        assert_eq!(
            reply(r.accept(ring(&c), ()), &mut r).unwrap(),
            Message::Mr(ring(&c))
        );
        // 210 bytes back to back: chunks of 100, 100 and 10.
        for (len, offset) in [(100, 0), (100, 100), (10, 200)] {
            let p = r.on_chunk(len, 0).unwrap();
            assert_eq!((p.len, p.file_offset), (len, offset));
            r.chunk_done();
        }
        assert!(r.on_chunk(1, 0).is_err(), "a byte past the batch");
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        r.on_message(batch(&["a", "b"], 70)).unwrap();
        r.accept(ring(&c), ()).unwrap();
        for len in [100, 40] {
            r.on_chunk(len, 0).unwrap();
            r.chunk_done();
        }
        let fin = Fin {
            bytes: 140,
            chunks: 2,
            digest: Digest::Sha256([0; 32]),
        };
        assert_eq!(
            r.on_message(Message::Fin(fin.clone())),
            Ok(ReceiverEvent::Fin(fin, ()))
        );
        r.complete(AckStatus::Ok, String::new()).unwrap();
        assert_eq!(r.state(), ReceiverState::AwaitHello);
    }

    #[test]
    fn batches_are_refused_whole_and_quietly_or_end_the_session() {
        let c = cfg(100, 4, 1);
        let refused = |m: Message| {
            let mut r = ReceiverSession::new(c);
            sent(&mut r);
            let got = r.on_message(m);
            let Err(RecvError::Reject(rej)) = got else {
                panic!("{got:?}")
            };
            // The session goes on: the files come one by one next.
            assert_eq!(r.state(), ReceiverState::AwaitHello);
            assert_eq!(sent(&mut r), [Message::Reject(rej.clone())]);
            rej
        };
        let one = |h: Hello| Message::Batch(vec![hello("ok", 1), h]);
        let cases = [
            (Message::Batch(Vec::new()), "without files"),
            (batch(&["a", "a"], 1), "twice"),
            (one(hello("../x", 1)), ".."),
            (
                one(hello_v2("s", hello_flags::STREAM, 0)),
                "plain files only",
            ),
            (
                one(hello_v2("d", hello_flags::DIRECTORY, 0)),
                "plain files only",
            ),
            (
                one(Hello {
                    mtime: Some(Mtime { secs: 1, nanos: 0 }),
                    ..hello_v2("r", hello_flags::RESUME | hello_flags::MTIME, 1)
                }),
                "plain files only",
            ),
            (
                one(Hello {
                    digest: DigestAlg::Crc32,
                    ..hello("crc", 1)
                }),
                "different digests",
            ),
            (
                Message::Batch(
                    (0..=MAX_BATCH_FILES)
                        .map(|i| hello(&format!("f{i}"), 1))
                        .collect(),
                ),
                "at most 256",
            ),
            (batch(&["a", "b"], u64::MAX), "2^64"),
        ];
        for (m, why) in cases {
            let rej = refused(m);
            assert!(rej.reason.contains(why), "{why}: {}", rej.reason);
        }
        // A member of another version ends the session, as its HELLO would.
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        let got = r.on_message(one(Hello {
            version: 3,
            ..hello("v", 1)
        }));
        assert!(matches!(got, Err(RecvError::Version(_))), "{got:?}");
        assert_eq!(r.state(), ReceiverState::Closed);
    }

    #[test]
    fn a_batch_keeps_the_sessions_limits_without_ending_it() {
        let mut c = cfg(100, 4, 1);
        c.max_files = 6;
        c.max_session_bytes = 250;
        c.max_size = 100;
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        // Over --max-files, --max-session-size or --max-size: refused, not
        // fatal; each refused batch counts as one entry.
        for (m, why) in [
            (
                batch(&["a", "b", "c", "d", "e", "f", "g"], 1),
                "--max-files",
            ),
            (batch(&["a", "b", "c"], 90), "--max-session-size"),
            (batch(&["a", "b"], 101), "at most 100 bytes"),
        ] {
            let got = r.on_message(m);
            let Err(RecvError::Reject(rej)) = got else {
                panic!("{got:?}")
            };
            assert!(rej.reason.contains(why), "{why}: {}", rej.reason);
            assert_eq!(r.state(), ReceiverState::AwaitHello);
        }
        // The engine refuses one (a file exists, say): one entry more.
        r.on_message(batch(&["a", "b"], 1)).unwrap();
        r.reject(RejectCode::Exists, "b exists".into()).unwrap();
        // An accepted batch counts each of its files: 4 + 2 = 6, the limit.
        r.on_message(batch(&["a", "b"], 1)).unwrap();
        r.accept(ring(&c), ()).unwrap();
        r.on_chunk(2, 0).unwrap();
        r.chunk_done();
        let fin = Fin {
            bytes: 2,
            chunks: 1,
            digest: Digest::Sha256([0; 32]),
        };
        r.on_message(Message::Fin(fin)).unwrap();
        r.complete(AckStatus::Ok, String::new()).unwrap();
        // A batch past the limit is refused, and the next HELLO ends the
        // session with the reason.
        let got = r.on_message(batch(&["x"], 1));
        assert!(matches!(got, Err(RecvError::Reject(_))), "{got:?}");
        let got = r.on_message(Message::Hello(hello("c", 1)));
        assert!(matches!(got, Err(RecvError::SessionLimit(_))), "{got:?}");
    }

    #[test]
    fn refusals_in_a_row_end_the_session_at_a_hello_never_at_a_batch() {
        let mut r = ReceiverSession::new(cfg(100, 4, 1));
        sent(&mut r);
        for i in 0..MAX_REFUSALS_IN_A_ROW {
            let got = r.on_message(Message::Hello(hello(&format!("../{i}"), 1)));
            assert!(matches!(got, Err(RecvError::Reject(_))), "{got:?}");
        }
        let got = r.on_message(batch(&["a"], 1));
        let Err(RecvError::Reject(rej)) = got else {
            panic!("{got:?}")
        };
        assert!(rej.reason.contains("one by one"), "{}", rej.reason);
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        let got = r.on_message(Message::Hello(hello("a", 1)));
        assert!(matches!(got, Err(RecvError::SessionLimit(_))), "{got:?}");
    }

    #[test]
    fn with_a_token_a_batch_must_carry_sha256() {
        let mut r = with_auth(cfg(100, 4, 1));
        r.on_message(good_auth()).unwrap();
        r.admit().unwrap();
        sent(&mut r);
        let crc = Message::Batch(vec![Hello {
            digest: DigestAlg::Crc32,
            ..hello("a", 1)
        }]);
        let got = r.on_message(crc);
        let Err(RecvError::Reject(rej)) = got else {
            panic!("{got:?}")
        };
        assert!(rej.reason.contains("SHA-256"), "{}", rej.reason);
        assert!(matches!(
            r.on_message(batch(&["a"], 1)),
            Ok(ReceiverEvent::Batch(_))
        ));
    }

    #[test]
    fn a_session_brings_at_most_max_session_bytes() {
        let mut c = cfg(100, 4, 1);
        c.max_session_bytes = 250;
        let mut r = ReceiverSession::new(c);
        // 200 of 250: accepted and received.
        r.on_message(Message::Hello(hello_v2("a", 0, 200))).unwrap();
        r.accept(ring(&c), ()).unwrap();
        for _ in 0..2 {
            r.on_chunk(100, 0).unwrap();
            r.chunk_done();
        }
        // A refused offer brings nothing; 60 more would exceed 250.
        let fin = Fin {
            bytes: 200,
            chunks: 2,
            digest: crate::proto::Digest::Sha256([0; 32]),
        };
        r.on_message(Message::Fin(fin)).unwrap();
        r.complete(AckStatus::Ok, String::new()).unwrap();
        let got = r.on_message(Message::Hello(hello_v2("b", 0, 60)));
        let Err(RecvError::Reject(rej)) = got else {
            panic!("{got:?}")
        };
        assert!(rej.reason.contains("--max-session-size"), "{}", rej.reason);
        assert_eq!(r.state(), ReceiverState::AwaitHello, "the session goes on");
        // 50 fit exactly.
        r.on_message(Message::Hello(hello_v2("c", 0, 50))).unwrap();
        r.accept(ring(&c), ()).unwrap();
        r.on_chunk(50, 0).unwrap();
        r.chunk_done();
        // A stream is stopped once it passes what is left of the limit
        // (as if 240 bytes had come before it).
        let mut s = receiving_stream(c);
        s.session_bytes = 240;
        s.on_chunk(10, 0).unwrap();
        assert_eq!(
            s.on_chunk(1, 0),
            Err(ChunkError::TooLarge {
                limit: 250,
                option: "--max-session-size"
            })
        );
        assert_eq!(s.state(), ReceiverState::Closed);
    }

    #[test]
    fn the_machine_builds_every_reply_to_the_sender() {
        // The CHALLENGE first, then nothing until something happens.
        let mut r = ReceiverSession::new(cfg(100, 4, 2));
        assert!(matches!(sent(&mut r)[..], [Message::Challenge(_)]));
        // A refused offer: its REJECT, and the session goes on.
        let bad = r.on_message(Message::Hello(hello("../x", 1))).unwrap_err();
        let RecvError::Reject(rej) = &bad else {
            panic!("{bad:?}")
        };
        assert_eq!(sent(&mut r), [Message::Reject(rej.clone())]);
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        // A broken session: one ACK saying why, then silence.
        assert!(r.on_message(Message::Keepalive).is_err());
        let acks = sent(&mut r);
        assert!(
            matches!(&acks[..], [Message::Ack(a)] if a.status == AckStatus::Protocol
                && a.reason.contains("KEEPALIVE not allowed here")),
            "{acks:?}"
        );
        assert_eq!(r.state(), ReceiverState::Closed);
        assert!(r.on_message(Message::Keepalive).is_err());
        assert!(r.on_chunk(1, 0).is_err());
        assert_eq!(
            r.on_undecodable(WireError::BadMagic(1)),
            Undecodable::Malformed(WireError::BadMagic(1))
        );
        assert!(!r.abort(AckStatus::Io, "late".into()));
        assert!(sent(&mut r).is_empty());
    }

    #[test]
    fn a_failed_authentication_is_answered_with_reject_auth() {
        let mut r = with_auth(cfg(100, 4, 2));
        assert!(matches!(sent(&mut r)[..], [Message::Challenge(c)] if c.auth_required()));
        let wrong = Message::Prove(Prove {
            version: PROTOCOL_VERSION,
            nonce: SENDER_NONCE,
            proof: vec![0; 32],
        });
        assert_eq!(
            r.on_message(wrong),
            Err(RecvError::Auth(AuthFailure::WrongToken))
        );
        assert_eq!(
            sent(&mut r),
            [Message::Reject(AuthFailure::WrongToken.reject())]
        );
        assert_eq!(r.state(), ReceiverState::Closed);
    }

    #[test]
    fn undecodable_frames_end_the_session_with_the_machines_reply() {
        let mut r = ReceiverSession::new(cfg(100, 4, 2));
        sent(&mut r);
        let err = r.on_undecodable(WireError::UnknownVersion(9));
        let Undecodable::Version(rej) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(rej.code, RejectCode::Version);
        assert!(
            rej.reason.contains("version 9") && rej.reason.contains(&PROTOCOL_VERSION.to_string())
        );
        assert_eq!(sent(&mut r), [Message::Reject(rej.clone())]);
        assert_eq!(r.state(), ReceiverState::Closed);

        let mut r = ReceiverSession::new(cfg(100, 4, 2));
        sent(&mut r);
        let err = r.on_undecodable(WireError::BadFlags(3));
        assert_eq!(err, Undecodable::Malformed(WireError::BadFlags(3)));
        assert_eq!(
            RecvError::from(err),
            RecvError::Protocol(ProtocolError::Malformed(WireError::BadFlags(3)))
        );
        assert!(
            matches!(&sent(&mut r)[..], [Message::Ack(a)] if a.status == AckStatus::Protocol
            && a.reason.contains("malformed message from the sender"))
        );
    }

    #[test]
    fn a_bad_write_and_an_engine_abort_each_send_one_ack() {
        // A stream past --max-size: ACK(rejected) naming the stream.
        let mut r = ReceiverSession::new(ReceiverConfig {
            max_size: 150,
            ..cfg(100, 4, 2)
        });
        sent(&mut r);
        let mut h = hello("s", 0);
        h.caps = hello_flags::STREAM;
        r.on_message(Message::Hello(h)).unwrap();
        r.accept(
            RingInfo {
                addr: 0,
                rkey: 1,
                slot_size: 100,
                slot_count: 4,
            },
            (),
        )
        .unwrap();
        assert!(matches!(&sent(&mut r)[..], [Message::Mr(_)]));
        r.on_chunk(100, 0).unwrap();
        assert_eq!(
            r.on_chunk(100, 0),
            Err(ChunkError::TooLarge {
                limit: 150,
                option: "--max-size"
            })
        );
        assert!(
            matches!(&sent(&mut r)[..], [Message::Ack(a)] if a.status == AckStatus::Rejected
            && a.reason.starts_with("s: "))
        );

        // The engine's own failure (a CRC mismatch, say): one ACK from abort.
        let mut r = session_in_auth(ReceiverState::Receiving, false);
        sent(&mut r);
        assert!(r.abort(AckStatus::Integrity, "bad CRC".into()));
        assert_eq!(
            sent(&mut r),
            [Message::Ack(Ack::new(
                AckStatus::Integrity,
                "bad CRC".to_string()
            ))]
        );
        assert_eq!(r.state(), ReceiverState::Closed);
        assert!(!r.abort(AckStatus::Io, "again".into()));
        assert!(sent(&mut r).is_empty());
    }

    #[test]
    fn deadlines_follow_the_state_and_busy_is_refused_by_the_protocol() {
        let t = Duration::from_secs(30);
        // What each state waits for, how long, and the session's end at
        // the deadline (not before).
        let expect = |mut r: ReceiverSession, what: &'static str, limit: Duration| {
            let state = r.state();
            assert_eq!(r.waiting_for(), what);
            assert_eq!(r.poll_timeout(), None, "not started");
            r.progressed(at(10));
            assert_eq!(r.poll_timeout(), Some(at(10) + limit));
            sent(&mut r);
            assert_eq!(r.handle_timeout(at(10) + limit / 2), Ok(()));
            r.progressed(at(20));
            assert_eq!(r.handle_timeout(at(10) + limit), Ok(()), "it progressed");
            let end = at(20) + limit;
            assert_eq!(
                r.handle_timeout(end),
                Err(TimedOut {
                    waiting_for: what,
                    after: limit,
                    state
                })
            );
            assert_eq!(r.state(), ReceiverState::Closed);
            assert!(
                sent(&mut r).is_empty(),
                "nothing is said to a silent sender"
            );
            assert_eq!(r.poll_timeout(), None);
        };
        expect(
            with_auth(cfg(100, 4, 2)),
            "the sender's PROVE",
            AUTH_TIMEOUT,
        );
        let mut short = cfg(100, 4, 2);
        short.timeout = Duration::from_secs(1);
        expect(with_auth(short), "the sender's PROVE", short.timeout);
        expect(
            ReceiverSession::new(cfg(100, 4, 2)),
            "the next HELLO or BYE",
            t,
        );
        expect(
            session_in_auth(ReceiverState::Receiving, false),
            "data from the sender",
            t,
        );
        let e = TimedOut {
            waiting_for: "data from the sender",
            after: t,
            state: ReceiverState::Receiving,
        };
        assert_eq!(
            e.to_string(),
            "no progress for 30s while waiting for data from the sender"
        );
        let busy = busy_refusal(Busy::Sessions(3));
        assert_eq!(busy.code, RejectCode::Busy);
        assert!(busy.reason.contains("3 sessions"));
        let busy = busy_refusal(Busy::FromAddress(2));
        assert_eq!(busy.code, RejectCode::Busy);
        assert!(busy.reason.contains("2 sessions from your address"));
    }

    #[test]
    fn a_forged_message_ends_the_session_with_one_ack() {
        for state in [
            ReceiverState::AwaitHello,
            ReceiverState::Receiving,
            ReceiverState::Verifying,
        ] {
            let mut r = session_in_auth(state, true);
            sent(&mut r);
            let err = r.on_forged(ChannelError::Replayed {
                got: 1,
                expected: 2,
            });
            assert_eq!(
                err,
                ChannelError::Replayed {
                    got: 1,
                    expected: 2
                }
            );
            assert_eq!(r.state(), ReceiverState::Closed);
            assert!(
                matches!(&sent(&mut r)[..], [Message::Ack(a)] if a.status == AckStatus::Protocol
                    && a.reason.contains("replayed")),
                "{state:?}"
            );
            // Once closed, nothing more.
            r.on_forged(ChannelError::BadTag { seq: 3 });
            assert!(sent(&mut r).is_empty());
            assert!(r.clone().accept(ring(&cfg(100, 4, 2)), ()).is_err());
        }
    }

    fn resumable(size: u64) -> Hello {
        Hello {
            caps: hello_flags::RESUME | hello_flags::MTIME,
            mtime: Some(crate::proto::Mtime {
                secs: 1_700_000_000,
                nanos: 5,
            }),
            ..hello("r.bin", size)
        }
    }

    fn prefix(bytes: u64, chunk_len: u32) -> Have {
        Have {
            kind: HaveKind::Prefix,
            bytes,
            chunk_len,
            digest: Digest::Sha256([7; 32]),
            note: String::new(),
        }
    }

    /// The HAVE is made by the machine from what the store found, for the
    /// offer it answers.
    #[test]
    fn the_have_is_made_from_what_was_found() {
        let c = cfg(100, 4, 1);
        let answer = |found: Option<Found>| {
            let mut r = ReceiverSession::new(c);
            sent(&mut r);
            let mut offer = resumable(1000);
            offer.caps |= hello_flags::CHECKSUM;
            r.on_message(Message::Hello(offer)).unwrap();
            match found {
                Some(found) => r.have_found(found, ()).unwrap(),
                None => r.ask_digest((), ()).unwrap(),
            }
            last_queued(&mut r)
        };
        let have = |h: Have| Some(Message::Have(h));
        assert_eq!(
            answer(Some(Found::Complete(()))),
            have(Have::complete(1000))
        );
        assert_eq!(answer(None), have(Have::ask_digest(1000)));
        assert_eq!(
            answer(Some(Found::Nothing("why".into()))),
            have(Have::nothing("why"))
        );
        let kept = Found::Prefix {
            bytes: 300,
            chunk_len: 100,
            sha256: [7; 32],
        };
        assert_eq!(answer(Some(kept)), have(prefix(300, 100)));
        // Not answering an offer: nothing is made.
        let mut r = ReceiverSession::new(c);
        assert!(r.have_found(Found::Complete(()), ()).is_err());
        assert!(r.ask_digest((), ()).is_err());
    }

    /// While the engine reads its copy the sender hears a KEEPALIVE every
    /// interval, however long it takes, and the session does not time out;
    /// once the engine decided, the wait for the sender is back.
    #[test]
    fn keepalives_are_due_only_while_the_engine_works() {
        let c = cfg(100, 4, 1);
        let mut r = ReceiverSession::new(c);
        r.progressed(at(0));
        sent(&mut r);
        assert!(r.work_started(at(0)).is_err(), "no offer to read for");
        r.on_message(Message::Hello(resumable(1000))).unwrap();
        r.work_started(at(0)).unwrap();
        let interval = keepalive_interval(c.timeout);
        // Longer than the session's timeout.
        for k in 1..=100u32 {
            let due = r.poll_timeout().expect("a KEEPALIVE is due");
            assert_eq!(due, at(0) + interval * k);
            assert_eq!(r.handle_timeout(due - Duration::from_millis(1)), Ok(()));
            assert!(sent(&mut r).is_empty(), "not before it is due");
            assert_eq!(r.handle_timeout(due), Ok(()));
            assert_eq!(sent(&mut r), [Message::Keepalive]);
        }
        r.have(prefix(300, 100), ()).unwrap();
        sent(&mut r);
        let now = at(60_000);
        r.progressed(now);
        assert_eq!(r.poll_timeout(), Some(now + c.timeout));
        assert_eq!(r.handle_timeout(now + interval), Ok(()));
        assert!(
            sent(&mut r).is_empty(),
            "no KEEPALIVE once the engine decided"
        );
        assert!(r.handle_timeout(now + c.timeout).is_err());
    }

    /// A resumed file continues its prefix: its chunks keep their numbers,
    /// slots, length and file offsets, and FIN counts the whole file.
    #[test]
    fn a_resumed_file_continues_its_prefix() {
        let c = cfg(100, 4, 1);
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        assert!(matches!(
            r.on_message(Message::Hello(resumable(1000))),
            Ok(ReceiverEvent::Offer(_))
        ));
        // Reading its copy for the HAVE may take a while.
        assert_eq!(keepalive(&mut r), Ok(Message::Keepalive));
        assert_eq!(
            reply(r.have(prefix(300, 100), ()), &mut r).unwrap(),
            Message::Have(prefix(300, 100))
        );
        assert_eq!(r.state(), ReceiverState::AwaitFrom);
        assert_eq!(
            r.on_message(Message::From { offset: 300 }),
            Ok(ReceiverEvent::From {
                offset: 300,
                waiting: ()
            })
        );
        assert_eq!(r.resumed_from(), 300);
        // Nothing is read after FROM (the prefix's digest came with the
        // HAVE): file work there is the engine's misuse.
        assert_eq!(
            r.work_started(at(0)),
            Err(ProtocolError::WrongState {
                op: "work_started",
                state: "AWAIT_DECISION"
            })
        );
        assert_eq!(r.poll_timeout(), None, "no KEEPALIVE is due");
        r.accept(ring(&c), ()).unwrap();
        for k in 3..10u64 {
            let p = r.on_chunk(100, 0).unwrap();
            assert_eq!((p.seq, p.file_offset), (k, k * 100));
            assert_eq!(u64::from(p.slot), k % 4);
            r.chunk_done();
        }
        assert!(matches!(
            r.on_message(Message::Fin(fin(1000, 10))),
            Ok(ReceiverEvent::Fin(..))
        ));
        // A chunk of another length than the prefix's is refused.
        let mut r2 = ReceiverSession::new(c);
        r2.on_message(Message::Hello(resumable(1000))).unwrap();
        r2.have(prefix(300, 50), ()).unwrap();
        r2.on_message(Message::From { offset: 300 }).unwrap();
        r2.accept(ring(&c), ()).unwrap();
        assert!(
            r2.on_chunk(100, 0).is_err(),
            "longer than the prefix's chunks"
        );
    }

    /// FROM 0 starts over; COMPARE of a complete copy ends in its ACK
    /// (the same) or a HAVE of nothing and FROM 0 (it differs); any other
    /// offset ends the session.
    #[test]
    fn from_starts_over_compares_or_is_refused() {
        let c = cfg(100, 4, 1);
        let start = |have: Have| {
            let mut r = ReceiverSession::new(c);
            sent(&mut r);
            r.on_message(Message::Hello(resumable(1000))).unwrap();
            r.have(have, ()).unwrap();
            r
        };
        let mut r = start(prefix(300, 100));
        r.on_message(Message::From { offset: 0 }).unwrap();
        assert_eq!(r.resumed_from(), 0);
        r.accept(ring(&c), ()).unwrap();
        assert_eq!(r.on_chunk(100, 0).unwrap().file_offset, 0);
        let complete = Have::complete(1000);
        // The same: ACK, the file is done.
        let mut r = start(complete.clone());
        assert!(r.clone().same().is_err(), "not before COMPARE");
        assert_eq!(
            r.on_message(Message::Compare { sha256: [1; 32] }),
            Ok(ReceiverEvent::Compare {
                copy: (),
                sha256: [1; 32],
                waiting: ()
            })
        );
        assert_eq!(r.state(), ReceiverState::Comparing);
        assert_eq!(
            keepalive(&mut r),
            Ok(Message::Keepalive),
            "reading its copy"
        );
        assert!(r.clone().have(complete.clone(), ()).is_err());
        assert_eq!(
            reply(r.same(), &mut r).unwrap(),
            Message::Ack(Ack::new(AckStatus::Ok, ""))
        );
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        // It differs: HAVE of nothing, FROM 0, everything is received.
        let mut r = start(complete.clone());
        r.on_message(Message::Compare { sha256: [1; 32] }).unwrap();
        r.have(Have::nothing("the receiver's copy differs"), ())
            .unwrap();
        assert!(
            r.clone()
                .on_message(Message::Compare { sha256: [1; 32] })
                .is_err(),
            "compared once"
        );
        r.on_message(Message::From { offset: 0 }).unwrap();
        r.accept(ring(&c), ()).unwrap();
        assert_eq!(r.on_chunk(100, 0).unwrap().file_offset, 0);
        // COMPARE only of a complete copy.
        for have in [prefix(300, 100), Have::nothing("none")] {
            let mut r = start(have);
            assert!(r.on_message(Message::Compare { sha256: [1; 32] }).is_err());
            assert_eq!(r.state(), ReceiverState::Closed);
        }
        for (have, offset) in [
            (prefix(300, 100), 200),
            (prefix(300, 100), u64::MAX),
            (complete.clone(), 300),
            (complete.clone(), u64::MAX),
            (Have::nothing("none"), 300),
            (Have::nothing("none"), u64::MAX),
        ] {
            let mut r = start(have.clone());
            sent(&mut r);
            assert!(
                matches!(
                    r.on_message(Message::From { offset }),
                    Err(RecvError::Protocol(ProtocolError::BadFrom { .. }))
                ),
                "{have:?} {offset}"
            );
            assert_eq!(r.state(), ReceiverState::Closed);
            assert_eq!(sent(&mut r).len(), 1, "the sender is told why");
        }
        // FROM anywhere else is out of place.
        let mut r = ReceiverSession::new(c);
        assert!(r.on_message(Message::From { offset: 0 }).is_err());
        // While the sender checks its file against HAVE it keeps alive.
        let mut r = start(prefix(300, 100));
        assert_eq!(
            r.on_message(Message::Keepalive),
            Ok(ReceiverEvent::Keepalive)
        );
        assert_eq!(r.state(), ReceiverState::AwaitFrom);
    }

    /// Only a file with its mtime may ask to resume, and HAVE must fit the
    /// offer.
    #[test]
    fn resume_offers_and_haves_are_checked() {
        let c = cfg(100, 4, 1);
        let refused = |h: Hello| {
            let mut r = ReceiverSession::new(c);
            matches!(r.on_message(Message::Hello(h)), Err(RecvError::Reject(j)) if j.code == RejectCode::Protocol)
        };
        assert!(refused(Hello {
            mtime: None,
            caps: hello_flags::RESUME,
            ..resumable(10)
        }));
        assert!(refused(Hello {
            caps: hello_flags::RESUME | hello_flags::MTIME | hello_flags::STREAM,
            size: 0,
            ..resumable(0)
        }));
        for bad in [
            prefix(1000, 100),
            prefix(250, 100),
            prefix(0, 100),
            prefix(300, 0),
            prefix(300, 300),
            Have {
                digest: Digest::Crc32(0),
                ..prefix(300, 100)
            },
            Have {
                kind: HaveKind::Complete,
                bytes: 999,
                ..Have::nothing("")
            },
            Have {
                bytes: 1,
                ..Have::nothing("")
            },
        ] {
            let mut r = ReceiverSession::new(c);
            r.on_message(Message::Hello(resumable(1000))).unwrap();
            assert!(r.have(bad.clone(), ()).is_err(), "{bad:?}");
        }
        // Not without RESUME.
        let mut r = ReceiverSession::new(c);
        r.on_message(Message::Hello(hello("f", 1000))).unwrap();
        assert!(r.have(Have::nothing(""), ()).is_err());
    }

    fn checksummed(size: u64) -> Hello {
        hello_v2("c.bin", hello_flags::CHECKSUM, size)
    }

    /// Digest questions (HAVE of a digest or of a complete copy) stop at
    /// the session's budget, in questions and in bytes: past it `have`
    /// refuses them, and the offer can still be received.
    #[test]
    fn digest_questions_stop_at_the_sessions_budget() {
        let mut c = cfg(100, 4, 1);
        c.digest_budget = DigestBudget {
            questions: 3,
            bytes: 1500,
        };
        let mut r = ReceiverSession::new(c);
        sent(&mut r);
        let offer = |r: &mut ReceiverSession, h: Hello| {
            let got = r.on_message(Message::Hello(h));
            assert!(matches!(got, Ok(ReceiverEvent::Offer(_))), "{got:?}");
        };
        // Asked, compared, the same: done without data.
        let compared = |r: &mut ReceiverSession, have: Have| {
            assert!(r.have(have, ()).is_ok());
            assert!(r.on_message(Message::Compare { sha256: [1; 32] }).is_ok());
            assert!(r.same().is_ok());
            assert_eq!(r.state(), ReceiverState::AwaitHello);
        };
        // Each offer under its own name (a name is compared once).
        let named = |h: Hello, name: &str| Hello {
            name: name.into(),
            ..h
        };
        offer(&mut r, named(checksummed(1000), "a"));
        assert!(r.may_compare("a", 1000));
        compared(&mut r, Have::ask_digest(1000));
        // 1000 + 600 bytes: past the budget's bytes.
        offer(&mut r, named(checksummed(600), "b"));
        assert!(!r.may_compare("b", 600));
        assert!(r.have(Have::ask_digest(600), ()).is_err());
        assert_eq!(r.state(), ReceiverState::AwaitDecision);
        assert!(r.reject(RejectCode::Exists, "no".into()).is_ok());
        // 500 more fit exactly, a complete copy as well as a digest.
        offer(&mut r, named(resumable(500), "c"));
        assert!(r.may_compare("c", 500) && !r.may_compare("c", 501));
        compared(&mut r, Have::complete(500));
        // The bytes are spent: only an empty file may still be asked
        // about, once (the third question), then none.
        offer(&mut r, named(checksummed(1), "d"));
        assert!(r.have(Have::ask_digest(1), ()).is_err());
        assert!(r.reject(RejectCode::Exists, "no".into()).is_ok());
        offer(&mut r, named(checksummed(0), "e"));
        compared(&mut r, Have::ask_digest(0));
        offer(&mut r, named(checksummed(0), "f"));
        assert!(!r.may_compare("f", 0));
        assert!(r.have(Have::ask_digest(0), ()).is_err());
        assert!(r.reject(RejectCode::Exists, "no".into()).is_ok());
        // A HAVE of nothing needs no budget: the file is received.
        offer(&mut r, named(resumable(0), "g"));
        assert!(!r.may_compare("g", 0));
        assert!(r.have(Have::complete(0), ()).is_err());
        assert!(r.have(Have::nothing(""), ()).is_ok());
    }

    /// A name's copy is compared at most once per session (a HAVE of a
    /// complete copy or asking a digest), whatever the budget: a sender
    /// offering the same file again and again cannot make the receiver
    /// read it again and again. Other names still may be.
    #[test]
    fn each_name_is_compared_at_most_once_per_session() {
        let mut r = ReceiverSession::new(cfg(100, 4, 1));
        sent(&mut r);
        let offer = |r: &mut ReceiverSession, h: Hello| {
            let got = r.on_message(Message::Hello(h));
            assert!(matches!(got, Ok(ReceiverEvent::Offer(_))), "{got:?}");
        };
        offer(&mut r, checksummed(10));
        assert_eq!(r.why_not_compare("c.bin", 10), None);
        assert_eq!(r.may_ask_digest(&checksummed(10)), Ok(()));
        // Only an offer with CHECKSUM is asked: its sender answers.
        let plain = Hello {
            caps: 0,
            ..checksummed(10)
        };
        assert!(r.may_ask_digest(&plain).unwrap_err().contains("CHECKSUM"));
        assert!(r.have(Have::ask_digest(10), ()).is_ok());
        assert!(r.on_message(Message::Compare { sha256: [1; 32] }).is_ok());
        assert!(r.same().is_ok());
        // The same name again, asked for its digest or held complete.
        for again in [checksummed(10), resumable(10)] {
            let again = Hello {
                name: "c.bin".into(),
                ..again
            };
            offer(&mut r, again);
            let why = r.why_not_compare("c.bin", 10).expect("compared already");
            assert!(why.contains("compared once"), "{why}");
            assert_eq!(r.may_ask_digest(&checksummed(10)), Err(why));
            assert!(r.have(Have::ask_digest(10), ()).is_err());
            assert!(r.have(Have::complete(10), ()).is_err());
            assert_eq!(r.state(), ReceiverState::AwaitDecision);
            assert!(r.reject(RejectCode::Exists, "no".into()).is_ok());
        }
        assert!(r.may_compare("other.bin", 10));
    }

    /// An offer with CHECKSUM: asked for its SHA-256 (HAVE of kind
    /// Digest), COMPARE, then ACK(ok) without data (a copy under
    /// --link-dest), or HAVE(nothing) and FROM 0 (it differs); or not
    /// asked at all, and received as any file.
    #[test]
    fn checksum_offers_are_asked_for_their_digest_or_received() {
        let c = cfg(100, 4, 1);
        let asked = |h: Hello| {
            let mut r = ReceiverSession::new(c);
            sent(&mut r);
            assert!(matches!(
                r.on_message(Message::Hello(h.clone())),
                Ok(ReceiverEvent::Offer(_))
            ));
            let size = h.size;
            assert_eq!(
                reply(r.have(Have::ask_digest(size), ()), &mut r),
                Ok(Message::Have(Have::ask_digest(size)))
            );
            assert_eq!(r.state(), ReceiverState::AwaitFrom);
            r
        };
        let resumable_too = Hello {
            caps: resumable(1000).caps | hello_flags::CHECKSUM,
            ..resumable(1000)
        };
        for offer in [checksummed(1000), resumable_too.clone()] {
            // The same: ACK(ok), the file is done without data.
            let mut r = asked(offer.clone());
            // The sender reads its file meanwhile.
            assert_eq!(
                r.on_message(Message::Keepalive),
                Ok(ReceiverEvent::Keepalive)
            );
            assert!(r.clone().same().is_err(), "not before COMPARE");
            assert_eq!(
                r.on_message(Message::Compare { sha256: [9; 32] }),
                Ok(ReceiverEvent::Compare {
                    copy: (),
                    sha256: [9; 32],
                    waiting: ()
                })
            );
            assert_eq!(r.state(), ReceiverState::Comparing);
            assert_eq!(
                keepalive(&mut r),
                Ok(Message::Keepalive),
                "reading its copy"
            );
            for not_nothing in [Have::ask_digest(1000), Have::complete(1000)] {
                assert!(r.clone().have(not_nothing, ()).is_err());
            }
            assert_eq!(
                reply(r.same(), &mut r),
                Ok(Message::Ack(Ack::new(AckStatus::Ok, "")))
            );
            assert_eq!(r.state(), ReceiverState::AwaitHello);
            assert!(sent(&mut r).is_empty());
            // It differs: HAVE(nothing), FROM 0, everything is received.
            let mut r = asked(offer.clone());
            r.on_message(Message::Compare { sha256: [9; 32] }).unwrap();
            r.have(Have::nothing("the --link-dest copy differs"), ())
                .unwrap();
            assert_eq!(r.state(), ReceiverState::AwaitFrom);
            assert!(
                r.clone()
                    .on_message(Message::Compare { sha256: [9; 32] })
                    .is_err(),
                "compared once"
            );
            assert_eq!(
                r.on_message(Message::From { offset: 0 }),
                Ok(ReceiverEvent::From {
                    offset: 0,
                    waiting: ()
                })
            );
            assert!(
                r.clone().have(Have::ask_digest(1000), ()).is_err(),
                "asked once"
            );
            r.accept(ring(&c), ()).unwrap();
            assert_eq!(r.on_chunk(100, 0).unwrap().file_offset, 0);
            // The sender may send it all instead of its digest (FROM 0).
            let mut r = asked(offer.clone());
            r.on_message(Message::From { offset: 0 }).unwrap();
            assert_eq!(r.state(), ReceiverState::AwaitDecision);
            assert_eq!(r.resumed_from(), 0);
            r.accept(ring(&c), ()).unwrap();
            // Any other offset ends the session, saying why.
            for offset in [1, 1000, u64::MAX] {
                let mut r = asked(offer.clone());
                assert!(matches!(
                    r.on_message(Message::From { offset }),
                    Err(RecvError::Protocol(ProtocolError::BadFrom { .. }))
                ));
                assert_eq!(r.state(), ReceiverState::Closed);
                assert_eq!(sent(&mut r).len(), 1);
            }
            // Not asked (no copy under --link-dest): received as any file.
            let mut r = ReceiverSession::new(c);
            r.on_message(Message::Hello(offer.clone())).unwrap();
            assert_eq!(
                reply(r.accept(ring(&c), ()), &mut r),
                Ok(Message::Mr(ring(&c)))
            );
            assert_eq!(r.on_chunk(100, 0).unwrap().file_offset, 0);
        }
        // With RESUME too, the other kinds still answer it.
        for have in [prefix(300, 100), Have::complete(1000), Have::nothing("")] {
            let mut r = ReceiverSession::new(c);
            r.on_message(Message::Hello(resumable_too.clone())).unwrap();
            assert!(r.have(have.clone(), ()).is_ok(), "{have:?}");
        }
        // A batch's members may carry CHECKSUM; a batch is never asked.
        let mut r = ReceiverSession::new(c);
        let members = vec![checksummed(10), hello_v2("b", hello_flags::CHECKSUM, 20)];
        assert!(matches!(
            r.on_message(Message::Batch(members)),
            Ok(ReceiverEvent::Batch(_))
        ));
        assert!(r.clone().have(Have::ask_digest(30), ()).is_err());
        assert_eq!(
            reply(r.accept(ring(&c), ()), &mut r),
            Ok(Message::Mr(ring(&c)))
        );
    }

    /// A HAVE of kind Digest only for an offer with CHECKSUM, fitting it;
    /// without RESUME no other HAVE; COMPARE only after Complete or Digest.
    #[test]
    fn digest_haves_and_compares_are_refused_out_of_place() {
        use hello_flags::{CHECKSUM, DIRECTORY, MTIME, STREAM};
        let c = cfg(100, 4, 1);
        let offered = |h: &Hello| {
            let mut r = ReceiverSession::new(c);
            sent(&mut r);
            r.on_message(Message::Hello(h.clone())).unwrap();
            r
        };
        for (offer, have) in [
            // Without CHECKSUM no Digest HAVE: a plain offer, a resumed one.
            (hello("f", 1000), Have::ask_digest(1000)),
            (resumable(1000), Have::ask_digest(1000)),
            // Without RESUME no other HAVE.
            (checksummed(1000), Have::complete(1000)),
            (checksummed(1000), Have::nothing("")),
            (checksummed(1000), prefix(300, 100)),
            // A Digest HAVE must fit the offer.
            (checksummed(1000), Have::ask_digest(999)),
            (checksummed(1000), Have::ask_digest(1001)),
            (
                checksummed(1000),
                Have {
                    chunk_len: 100,
                    ..Have::ask_digest(1000)
                },
            ),
            (
                checksummed(1000),
                Have {
                    digest: Digest::Sha256([1; 32]),
                    ..Have::ask_digest(1000)
                },
            ),
        ] {
            let mut r = offered(&offer);
            assert!(r.have(have.clone(), ()).is_err(), "{have:?} for {offer:?}");
            assert_eq!(r.state(), ReceiverState::AwaitDecision, "nothing changed");
            assert!(sent(&mut r).is_empty());
        }
        // Asked once: not again after it.
        let mut r = offered(&checksummed(1000));
        r.have(Have::ask_digest(1000), ()).unwrap();
        assert!(r.clone().have(Have::ask_digest(1000), ()).is_err());
        // Not in any other state.
        for state in STATES {
            let mut r = session_in(state);
            assert!(r.have(Have::ask_digest(1000), ()).is_err(), "{state:?}");
        }
        // CHECKSUM is for files only.
        for (caps, name) in [(CHECKSUM | STREAM, "s"), (CHECKSUM | DIRECTORY, "d")] {
            let mut r = ReceiverSession::new(c);
            let got = r.on_message(Message::Hello(hello_v2(name, caps, 0)));
            assert!(
                matches!(&got, Err(RecvError::Reject(j)) if j.code == RejectCode::Protocol
                    && j.reason.contains("only a file")),
                "{got:?}"
            );
            assert_eq!(r.state(), ReceiverState::AwaitHello, "the session goes on");
        }
        let mut r = ReceiverSession::new(c);
        let timed = Hello {
            mtime: Some(crate::proto::Mtime { secs: 1, nanos: 0 }),
            ..hello_v2("d", CHECKSUM | DIRECTORY | MTIME, 0)
        };
        assert!(r.on_message(Message::Hello(timed)).is_err());
        // COMPARE without a HAVE of kind Complete or Digest ends the session.
        for have in [None, Some(Have::nothing(""))] {
            let mut r = offered(&Hello {
                caps: resumable(1000).caps | CHECKSUM,
                ..resumable(1000)
            });
            if let Some(h) = have {
                r.have(h, ()).unwrap();
            }
            assert!(r.on_message(Message::Compare { sha256: [1; 32] }).is_err());
            assert_eq!(r.state(), ReceiverState::Closed);
        }
    }

    /// A dry run's file (or stream) gets ACK(would-receive) where a real
    /// run gets the MR, never an MR; its directory is answered as any;
    /// DRY_RUN never with RESUME, never in a batch.
    #[test]
    fn a_dry_run_is_answered_without_data() {
        let dry = |name: &str, caps: u32| Hello {
            caps: caps | hello_flags::DRY_RUN,
            ..hello(name, 3)
        };
        let mut r = ReceiverSession::new(cfg(100, 4, 1));
        sent(&mut r);
        r.on_message(Message::Hello(dry("f", 0))).unwrap();
        assert!(r.offer_is_dry_run());
        assert!(
            r.accept(ring(&cfg(100, 4, 1)), ()).is_err(),
            "an MR in a dry run"
        );
        r.would_receive().unwrap();
        assert_eq!(
            sent(&mut r),
            [Message::Ack(Ack::new(AckStatus::WouldReceive, ""))]
        );
        assert_eq!(r.state(), ReceiverState::AwaitHello);
        // A real offer is never answered so.
        r.on_message(Message::Hello(hello("g", 3))).unwrap();
        assert!(!r.offer_is_dry_run());
        assert!(r.would_receive().is_err());
        r.reject(RejectCode::Exists, "g".into()).unwrap();
        sent(&mut r);
        // Nor is a directory (it exists, or would be created: ACK ok).
        let d = Hello {
            size: 0,
            ..dry("d", hello_flags::DIRECTORY)
        };
        r.on_message(Message::Hello(d)).unwrap();
        assert!(r.would_receive().is_err());
        r.accept_directory().unwrap();
        sent(&mut r);
        // With RESUME: refused.
        let both = Hello {
            mtime: Some(Mtime { secs: 1, nanos: 0 }),
            ..dry("r", hello_flags::RESUME | hello_flags::MTIME)
        };
        let got = r.on_message(Message::Hello(both));
        assert!(
            matches!(got, Err(RecvError::Reject(ref j)) if j.code == RejectCode::Protocol),
            "{got:?}"
        );
        sent(&mut r);
        // In a batch: refused (the files come one by one).
        let got = r.on_message(Message::Batch(vec![dry("b/0", 0), hello("b/1", 1)]));
        assert!(
            matches!(got, Err(RecvError::Reject(ref j)) if j.code == RejectCode::Protocol),
            "{got:?}"
        );
    }
}
