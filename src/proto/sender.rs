//! Sender side of a session: the receiver's greeting (CHALLENGE, or a
//! REJECT that refuses the session); with a token, PROVE and the receiver's
//! AUTH_OK, checked before anything else is sent (a receiver that does not
//! ask for authentication is refused); then entries in order, then BYE.
//! After AUTH_OK the engine seals and opens every control message with the
//! channel that comes with `SenderEvent::Authenticated`. An entry is
//! - a file: HELLO -> (MR | REJECT) -> chunks under credit -> FIN -> ACK;
//! - a stream (size unknown): the same, the FIN carrying the final size;
//! - a directory: HELLO -> (ACK | REJECT), no data.
//!
//! Pipelining: the receiver handles messages strictly in order, so the
//! sender need not wait for a finished file's ACK (or a directory's answer)
//! before it offers the next entry. Up to `MAX_PENDING` entries may await
//! their verdict; the verdicts arrive in order, each before the reply to any
//! later HELLO. Hence an MR only comes once every earlier entry is
//! answered, and at most one finished file is pending (at the front).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::auth::{
    CHUNK_TAG_LEN, Channel, ChunkAuth, ChunkKey, ConnectionId, NONCE_LEN, Role, SessionKey, Token,
};
use super::names::escaped;
use super::wire::{
    Ack, AckStatus, Digest, DigestAlg, FailedAck, Fin, Have, HaveKind, Hello, HopResult, Message,
    Mtime, Prove, Reject, RejectCode, RingInfo, hello_flags, relay_messages,
};
use super::{MAX_BATCH_FILES, PROTOCOL_VERSION, ProtocolError, check_ring};

/// Most entries that may await the receiver's verdict at once. The
/// receiver keeps more control receives posted than this (plus the HELLO
/// and BYE that may follow), so a pipelined sender never runs it dry.
pub const MAX_PENDING: usize = 8;

/// Where a sender's session is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SenderState {
    /// Connected, waiting for the receiver's CHALLENGE (or a REJECT).
    AwaitChallenge,
    /// PROVE sent, waiting for the receiver's AUTH_OK (or a REJECT).
    AwaitAuthOk,
    /// Between files: may offer an entry, or close once nothing is pending.
    Idle,
    /// A file's or stream's HELLO sent, waiting for MR or REJECT (verdicts
    /// on pending entries come first).
    AwaitRing,
    /// A file offered with RESUME: waiting for the receiver's HAVE
    /// (verdicts on pending entries come first).
    AwaitHave,
    /// HAVE arrived: the engine checks its file against it and calls
    /// `start_from` (FROM) or, for a complete copy or a request for its
    /// digest (CHECKSUM), `compare` (COMPARE).
    AwaitFromDecision,
    /// COMPARE sent: waiting for ACK (the receiver's copy is the file) or
    /// HAVE of nothing (it differs); verdicts on pending entries first.
    AwaitCompared,
    /// Writing chunks under credit.
    Sending,
    /// BYE sent, or an error ended the session; nothing more may be sent.
    Closed,
}

impl SenderState {
    /// The state's name, for error messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::AwaitChallenge => "AWAIT_CHALLENGE",
            Self::AwaitAuthOk => "AWAIT_AUTH_OK",
            Self::Idle => "IDLE",
            Self::AwaitRing => "AWAIT_RING",
            Self::AwaitHave => "AWAIT_HAVE",
            Self::AwaitFromDecision => "AWAIT_FROM_DECISION",
            Self::AwaitCompared => "AWAIT_COMPARED",
            Self::Sending => "SENDING",
            Self::Closed => "CLOSED",
        }
    }
}

/// What an offer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum OfferKind {
    /// A file of known size.
    #[default]
    File,
    /// Data of unknown size (standard input): the FIN carries the size.
    Stream,
    /// A directory: no data, answered by ACK or REJECT.
    Directory,
}

/// An entry the engine offers the receiver (becomes a HELLO).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileOffer {
    /// A name, or a relative path (`dir/sub/file`) inside a tree.
    pub name: String,
    /// The file's size; ignored (sent as 0) for streams and directories.
    pub size: u64,
    /// Unix permission bits for the received file or directory.
    pub mode: u32,
    /// The whole-file digest the FIN will carry.
    pub digest: DigestAlg,
    /// File, stream or directory.
    pub kind: OfferKind,
    /// Modification time to keep (`-p`).
    pub mtime: Option<Mtime>,
    /// Keep `mode` as it is (`-p`) instead of the receiver's umask applying.
    pub keep_mode: bool,
    /// `--resume`: ask the receiver to keep what it verified and to say
    /// what it holds (HAVE). Files with an mtime only.
    pub resume: bool,
    /// `--checksum`: answer the receiver's request for the file's SHA-256
    /// (a HAVE of kind Digest) with COMPARE. Files only (a stream's digest
    /// is not known before its data).
    pub checksum: bool,
    /// What the receiver does with a file already under the name (files
    /// only).
    pub existing: WhenExisting,
    /// A piece of a file sent over lanes (`sender --lanes`): `size` is the
    /// piece's length. Files with an mtime only, never resumed or
    /// compared.
    pub piece: Option<super::assembly::Piece>,
}

/// What the receiver does with a regular file already under an offer's
/// name (rsync's rules; sender --ignore-times, --ignore-existing,
/// --update). Whatever is not left as it is goes on as any offer: the
/// receiver replaces a file only with --overwrite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenExisting {
    /// The same size and modification time (with --checksum: the same
    /// size and SHA-256): unchanged.
    #[default]
    QuickCheck,
    /// Never unchanged by size and time (`--ignore-times`).
    IgnoreTimes,
    /// Any regular file stays (`--ignore-existing`).
    IgnoreExisting,
    /// A file with a later modification time stays (`--update`); else
    /// as `QuickCheck`.
    Update,
}

impl FileOffer {
    /// The HELLO flags the offer goes out with.
    pub fn caps(&self) -> u32 {
        let mut caps = match self.kind {
            OfferKind::File => 0,
            OfferKind::Stream => hello_flags::STREAM,
            OfferKind::Directory => hello_flags::DIRECTORY,
        };
        if self.mtime.is_some() {
            caps |= hello_flags::MTIME;
        }
        if self.keep_mode {
            caps |= hello_flags::KEEP_MODE;
        }
        if self.resume && self.kind == OfferKind::File && self.mtime.is_some() {
            caps |= hello_flags::RESUME;
        }
        if self.checksum && self.kind == OfferKind::File {
            caps |= hello_flags::CHECKSUM;
        }
        if self.kind == OfferKind::File {
            caps |= match self.existing {
                WhenExisting::QuickCheck => 0,
                WhenExisting::IgnoreTimes => hello_flags::IGNORE_TIMES,
                WhenExisting::IgnoreExisting => hello_flags::IGNORE_EXISTING,
                WhenExisting::Update if self.mtime.is_some() => hello_flags::UPDATE,
                WhenExisting::Update => 0,
            };
        }
        if self.piece.is_some() && self.kind == OfferKind::File && self.mtime.is_some() {
            caps |= hello_flags::PIECE;
            caps &= !(hello_flags::RESUME | hello_flags::CHECKSUM);
        }
        caps
    }
}

/// Where the engine must RDMA-WRITE (with imm = CRC32 of the chunk) the next chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkPlan {
    /// The chunk's sequence number in its file (0-based).
    pub seq: u64,
    /// The ring slot it goes to (`seq % slot_count`).
    pub slot: u32,
    /// The slot's address in the receiver's ring (as the MR gave it).
    pub remote_addr: u64,
    /// The ring's remote key.
    pub rkey: u32,
    /// Byte offset in the file.
    pub file_offset: u64,
    /// Length in bytes.
    pub len: u32,
    /// Bytes the write carries: the chunk, then its tag (`tag_len`).
    pub write_len: u32,
}

/// What the receiver's CHALLENGE asks of the engine before the first HELLO.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Greeting {
    /// The receiver requires authentication: the machine queued its PROVE
    /// and waits for AUTH_OK before any HELLO. The proof is empty when
    /// this sender has no token, and the receiver will then refuse with
    /// REJECT(Auth).
    pub proving: bool,
}

/// What a sender with a token needs to prove it on one connection.
#[derive(Debug, Clone)]
pub struct SenderAuth {
    /// The shared secret.
    pub token: Token,
    /// This session's nonce, fresh from the OS RNG.
    pub nonce: [u8; NONCE_LEN],
    /// This connection's identity (see `ConnectionId`).
    pub conn: ConnectionId,
}

/// An entry that awaits the receiver's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Pending {
    /// A file or stream whose FIN was sent.
    File,
    /// A directory whose HELLO was sent.
    Directory,
}

/// The receiver's verdict on a pending entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// ACK of any status (a failure concerns this entry only: the session
    /// goes on).
    Ack(Ack),
    /// A directory refused (name, exists, ...).
    Reject(Reject),
}

/// What a received message means for the engine. `P` is what the engine
/// gave each entry to carry (see `SenderSession`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderEvent<P = u64> {
    /// The receiver's CHALLENGE arrived: with `Greeting::proving`, the
    /// PROVE is queued (then wait for `Authenticated`), else now Idle.
    Greeted(Greeting),
    /// The receiver proved the token (AUTH_OK): now Idle; install this
    /// channel before sending anything else.
    Authenticated(Channel),
    /// MR accepted: start sending (see `next_chunk`).
    Ring(RingInfo),
    /// The current file's or stream's offer was refused; back to Idle, the
    /// session may continue with another entry.
    Rejected(Reject),
    /// Credits added (or, after a FIN, late credits of that file noted).
    Credit(u32),
    /// The receiver's HAVE for a file offered with RESUME, or its request
    /// for the SHA-256 of a file offered with CHECKSUM: the engine checks
    /// its file against it and calls `start_from` or `compare`.
    Have(Have),
    /// The receiver reads what it holds of a file offered with RESUME
    /// before its HAVE, or its copy for a COMPARE; or, in a relaying
    /// session, it waits for the hosts after it while an offer awaits its
    /// verdict: it is alive (progress for the timeout).
    Keepalive,
    /// After COMPARE: the receiver's copy is the sender's file, nothing is
    /// sent; the ACK is the file's verdict. Now Idle.
    Same {
        /// The receiver's ACK(ok).
        ack: Ack,
        /// Whose copy it was.
        copy: SameCopy,
        /// The SHA-256 sent in COMPARE (the file's digest).
        sha256: [u8; 32],
    },
    /// The offer is settled without data (an ACK answering the HELLO):
    /// the receiver's file under its name stays as it is (unchanged,
    /// kept-existing, kept-newer), or a dry run would receive it
    /// (would-receive). Nothing is sent; the ACK is the file's verdict.
    /// Now Idle.
    Settled(Ack),
    /// The verdict on the oldest pending entry, with what the engine
    /// gave it to carry (`start_file`, `start_batch`, `finish_carrying`).
    Answered {
        /// What the machine carried for this entry.
        payload: P,
        /// The entry answered (the oldest pending one).
        entry: Pending,
        /// The receiver's answer.
        verdict: Verdict,
    },
    /// The receiver gave up on the current file before its FIN (an ACK
    /// with a failure status): the session is Closed.
    Aborted(FailedAck),
    /// A relaying session (`relay`): one host's verdict on the oldest
    /// offer still unanswered, whose own verdict comes next (the receiver
    /// answers in order). A notice: it needs no answer.
    HopResult(HopResult),
}

impl<P> SenderEvent<P> {
    /// Whether this event is an offer's verdict (what a RESULT precedes).
    fn is_verdict(&self) -> bool {
        matches!(
            self,
            Self::Rejected(_)
                | Self::Same { .. }
                | Self::Settled(_)
                | Self::Answered { .. }
                | Self::Aborted(_)
        )
    }
}

/// Whose copy a COMPARE found to be the sender's file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SameCopy {
    /// The receiver's own, kept under the offer's name (a HAVE of a
    /// complete copy): the file is skipped.
    Kept,
    /// A file under the receiver's --link-dest (a HAVE asking for the
    /// digest): the file is linked or copied from there.
    LinkDest,
}

/// What the engine waits on (`SenderSession::waiting`): it decides which
/// timer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The receiver: silent for the timeout, the session fails.
    Peer,
    /// The sender's own input (a stream's, a file read for a HAVE): the
    /// receiver gets a KEEPALIVE every `keepalive_interval` meanwhile.
    Input,
}

/// The session's clock: the receive timeout and the keepalive. Instants
/// come from the engine, so the machine stays pure.
#[derive(Debug, Clone, Default)]
struct Timers {
    /// The receive timeout (None: no timers).
    timeout: Option<Duration>,
    waiting: Option<Waiting>,
    /// When the receiver has been silent too long (waiting on it).
    silent_at: Option<Instant>,
    /// When a KEEPALIVE is due (waiting on our own input).
    keepalive_at: Option<Instant>,
    /// A message or chunk went out since the keepalive was armed.
    spoke: bool,
    /// Probe the path while a piece waits for credit (a lane): a KEEPALIVE
    /// every interval, so that a dead path fails in the transport's retry
    /// time, not after the receive timeout (`probing`).
    probe: bool,
}

/// A capability an older receiver of this protocol version does not
/// know: its REJECT(version) of an offer that asked for it ends the
/// session (`ProtocolError::OlderReceiver`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Capability {
    /// HELLO's CHECKSUM flag (the newer one: named first).
    Checksum,
    /// HELLO's RESUME flag.
    Resume,
}

impl Capability {
    /// The capability an offer with HELLO flags `caps` (a batch: its
    /// members' OR-ed) was refused for, if any.
    fn refused(caps: u32) -> Option<Capability> {
        if caps & hello_flags::CHECKSUM != 0 {
            Some(Capability::Checksum)
        } else if caps & hello_flags::RESUME != 0 {
            Some(Capability::Resume)
        } else {
            None
        }
    }
}

/// The sender's side of one session: decides what to send and checks
/// every message from the receiver against the protocol (pure; no I/O).
/// It carries a `P` for each entry the engine offers (its per-file data:
/// name, report, progress), from the offer to the entry's verdict, which
/// hands it back (`SenderEvent::Answered`).
#[derive(Debug, Clone)]
pub struct SenderSession<P = u64> {
    state: SenderState,
    /// Messages the machine decided on, oldest first (`poll_transmit`).
    outbox: VecDeque<Message>,
    auth: Option<SenderAuth>,
    /// Derived when the CHALLENGE arrives (with a token).
    key: Option<SessionKey>,
    chunk_size: u32,
    size: u64,
    /// The current entry is a stream (size unknown until the engine finishes it).
    stream: bool,
    /// A stream's short chunk was planned: it must be the last.
    short_planned: bool,
    digest: DigestAlg,
    ring: RingInfo,
    chunk_len: u32,
    credits: u32,
    seq: u64,
    planned: u64,
    /// What the engine gave the current file, stream or batch to carry
    /// (from its offer to its FIN, then pending).
    carried: Option<P>,
    /// The HELLO flags of the current offer (a batch: OR-ed), for the
    /// reading of a REJECT(version).
    offer_caps: u32,
    /// The receiver's HAVE for the current file.
    have: Option<Have>,
    /// The SHA-256 the current file's COMPARE carried.
    compare_sha256: Option<[u8; 32]>,
    /// The current file was offered with CHECKSUM: a HAVE of kind Digest
    /// may come instead of its MR.
    checksum: bool,
    /// A resumed prefix's chunk length (0: not resuming).
    base_chunk_len: u32,
    /// Entries awaiting a verdict, oldest first, with what they carry.
    pending: VecDeque<(P, Pending)>,
    /// The key of the chunks' tags, once the receiver proved the token.
    chunk_key: Option<ChunkKey>,
    /// HELLOs and BATCHes sent so far: the current offer's number.
    offers: u64,
    /// The current offer is a BATCH.
    batching: bool,
    /// The receiver refused a batch by policy (REJECT protocol: it takes
    /// files one by one, e.g. --exec): no more batches this session.
    batches_refused: bool,
    /// A dry run (`dry_run`).
    dry_run: bool,
    /// No batch before this many offers (`offers`): a batch was refused
    /// because a member exists.
    alone_until: u64,
    /// RELAY went out (`relay`): RESULTs may come, and KEEPALIVEs while
    /// an offer awaits its verdict.
    relaying: bool,
    /// Hosts in the chain after the receiver (`relay`'s).
    relay_hops: usize,
    /// RESULTs heard for the oldest unanswered offer.
    results: usize,
    timers: Timers,
}

impl SenderSession<u64> {
    /// A session whose entries carry a number (the tests' and fuzz's tag):
    /// see `carrying`.
    pub fn new(chunk_size: u32, auth: Option<SenderAuth>) -> Self {
        Self::carrying(chunk_size, auth)
    }
}

impl<P> SenderSession<P> {
    /// `chunk_size` is the sender's staging buffer size; 0 means "use the
    /// ring's slot size". With `auth`, the session proves the token and
    /// requires the receiver to prove it too.
    pub fn carrying(chunk_size: u32, auth: Option<SenderAuth>) -> Self {
        Self {
            state: SenderState::AwaitChallenge,
            outbox: VecDeque::new(),
            auth,
            key: None,
            chunk_size,
            size: 0,
            stream: false,
            short_planned: false,
            digest: DigestAlg::Crc32,
            ring: RingInfo::default(),
            chunk_len: 0,
            credits: 0,
            seq: 0,
            planned: 0,
            carried: None,
            offer_caps: 0,
            have: None,
            compare_sha256: None,
            checksum: false,
            base_chunk_len: 0,
            pending: VecDeque::new(),
            chunk_key: None,
            offers: 0,
            batching: false,
            batches_refused: false,
            dry_run: false,
            alone_until: 0,
            relaying: false,
            relay_hops: 0,
            results: 0,
            timers: Timers::default(),
        }
    }

    /// Every offer of this session is a dry run's (`sender --dry-run`):
    /// its HELLO carries DRY_RUN and never RESUME, no batch is offered,
    /// and the receiver answers without data (ACK would-receive where a
    /// real run would get the MR).
    pub fn dry_run(mut self) -> Self {
        self.dry_run = true;
        self
    }

    /// The session with its timers: the receiver may be silent for
    /// `timeout` while the engine waits on it; while the engine waits on
    /// its own input, a KEEPALIVE goes every `keepalive_interval(timeout)`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timers.timeout = Some(timeout);
        self
    }

    /// A lane's session: while a piece waits for credit, a KEEPALIVE goes
    /// every `keepalive_interval`, so that a dead path is found by the
    /// transport (its retries) within seconds (a receiver of pieces takes
    /// them).
    pub fn probing(mut self) -> Self {
        self.timers.probe = true;
        self
    }

    /// The engine now waits on `on`: waiting on the receiver starts its
    /// timeout (unless it runs already); waiting on its own input starts
    /// the keepalive's interval (again after anything went out).
    pub fn waiting(&mut self, on: Waiting, now: Instant) {
        let Some(timeout) = self.timers.timeout else {
            return;
        };
        let probes = self.probes();
        let t = &mut self.timers;
        let changed = t.waiting != Some(on);
        match on {
            Waiting::Peer => {
                // A lane waiting on its receiver about a piece probes its
                // path.
                let probe = t.probe && probes;
                t.keepalive_at = match (probe, t.keepalive_at) {
                    (true, Some(at)) if !changed => Some(at),
                    (true, _) => now.checked_add(keepalive_interval(timeout)),
                    (false, _) => None,
                };
                if changed || t.silent_at.is_none() {
                    t.silent_at = now.checked_add(timeout);
                }
            }
            Waiting::Input => {
                t.silent_at = None;
                if changed || t.spoke || t.keepalive_at.is_none() {
                    t.keepalive_at = now.checked_add(keepalive_interval(timeout));
                    t.spoke = false;
                }
            }
        }
        t.waiting = Some(on);
    }

    /// The link delivered something (a message, a completion): the
    /// receiver's timeout starts again.
    pub fn heard(&mut self, now: Instant) {
        if let (Some(timeout), Some(Waiting::Peer)) = (self.timers.timeout, self.timers.waiting) {
            self.timers.silent_at = now.checked_add(timeout);
        }
    }

    /// When `handle_timeout` is due next, if ever.
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.timers.silent_at, self.timers.keepalive_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The clock reached `now`: a receiver silent for the timeout ends the
    /// session (`ProtocolError::NoProgress`, saying what was awaited); a
    /// keepalive that is due is queued (when the state allows one: a
    /// stream's data, a file read for a HAVE).
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ProtocolError> {
        let Some(timeout) = self.timers.timeout else {
            return Ok(());
        };
        if self.timers.silent_at.is_some_and(|at| at <= now) {
            let what = self.waited_for();
            self.state = SenderState::Closed;
            self.outbox.clear();
            self.timers.silent_at = None;
            return Err(ProtocolError::NoProgress {
                secs: timeout.as_secs(),
                what,
            });
        }
        if self.timers.keepalive_at.is_some_and(|at| at <= now) {
            self.timers.keepalive_at = if self.keepalive().is_ok() {
                now.checked_add(keepalive_interval(timeout))
            } else {
                None
            };
        }
        Ok(())
    }

    /// What a wait on the receiver waits for, in this state (for the
    /// messages about it).
    pub fn waited_for(&self) -> &'static str {
        match self.state {
            SenderState::AwaitChallenge => "the receiver's greeting",
            SenderState::AwaitAuthOk => "the receiver's proof (AUTH_OK)",
            SenderState::Idle if self.pending.len() >= MAX_PENDING => "the receiver's verdicts",
            SenderState::Idle => "the receiver's ACK",
            SenderState::AwaitRing => "the receiver's MR reply",
            SenderState::AwaitHave => "the receiver's HAVE reply",
            SenderState::AwaitFromDecision => {
                "our own read of the file the receiver has (its HAVE)"
            }
            SenderState::AwaitCompared => "the receiver's comparison of its copy",
            SenderState::Sending => "credit from the receiver",
            SenderState::Closed => "delivery of BYE",
        }
    }

    /// The current state.
    pub fn state(&self) -> SenderState {
        self.state
    }

    /// Chunks that may be written now (free ring slots granted by CREDIT).
    pub fn credits(&self) -> u32 {
        self.credits
    }

    /// Bytes of each chunk's tag in this session: `CHUNK_TAG_LEN` once the
    /// receiver proved the token, else 0. A chunk's write carries its bytes
    /// and then its tag; a ring slot holds both.
    pub fn tag_len(&self) -> u32 {
        if self.chunk_key.is_some() {
            CHUNK_TAG_LEN as u32
        } else {
            0
        }
    }

    /// How the current offer's chunks are tagged (None without a token):
    /// valid from its HELLO or BATCH on, so that its data can be read (and
    /// tagged) ahead of its MR.
    pub fn chunk_auth(&self) -> Option<ChunkAuth> {
        self.chunk_key.as_ref().map(|key| ChunkAuth {
            key: key.clone(),
            offer: self.offers,
        })
    }

    /// Ring of the current file (meaningful from `Sending` on).
    pub fn ring(&self) -> RingInfo {
        self.ring
    }

    /// Length of every chunk but the last: min(chunk_size, slot_size).
    pub fn chunk_len(&self) -> u32 {
        self.chunk_len
    }

    /// The chunk length the next MR gives a new (not resumed) entry, if
    /// an MR came already: the receiver sends the same ring for every
    /// entry of a session, so data can be read ahead of its MR.
    pub fn expected_chunk_len(&self) -> Option<u32> {
        let slot = self.ring.slot_size.saturating_sub(self.tag_len());
        match self.chunk_size {
            _ if slot == 0 => None,
            0 => Some(slot),
            c => Some(c.min(slot)),
        }
    }

    /// Bytes of the current file planned (handed out as chunks) so far.
    pub fn bytes_planned(&self) -> u64 {
        self.planned
    }

    /// Chunks of the current file planned so far.
    pub fn chunks_planned(&self) -> u64 {
        self.seq
    }

    /// Entries awaiting the receiver's verdict, oldest first.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Whether another entry may be offered now (Idle, pipeline not full).
    pub fn can_start(&self) -> bool {
        self.state == SenderState::Idle && self.pending.len() < MAX_PENDING
    }

    /// Whether a BATCH may be offered now: not the session's first offer
    /// (its HELLO checks the receiver's version, its MR makes the ring
    /// known, so a batch is read while the receiver prepares it), not
    /// after the receiver refused a batch by policy (it would refuse the
    /// next one too), not in a dry run, and not for a batch's worth of
    /// offers after a batch refused because a member exists (a re-run:
    /// its files are settled one by one without data).
    pub fn may_batch(&self) -> bool {
        self.can_start()
            && !self.batches_refused
            && !self.dry_run
            && self.offers >= self.alone_until
            && self.expected_chunk_len().is_some()
    }

    fn wrong_state(&self, op: &'static str) -> ProtocolError {
        ProtocolError::WrongState {
            op,
            state: self.state.as_str(),
        }
    }

    /// Tells the receiver the hosts after it in a relay chain, in chain
    /// order: queues the RELAY messages (as few as fit a frame each).
    /// Once per session, only after the receiver proved the token (Idle
    /// after `SenderEvent::Authenticated`) and before the first offer;
    /// 1 to `MAX_RELAY_HOPS` hosts, each valid (`check_host`). Any misuse
    /// is an error and queues nothing. From then on, RESULTs may precede
    /// each verdict (`SenderEvent::HopResult`), and KEEPALIVEs come while
    /// an offer awaits its verdict (`SenderEvent::Keepalive`: the receiver
    /// waits for the hosts after it).
    pub fn relay(&mut self, hops: &[String]) -> Result<(), ProtocolError> {
        if self.state != SenderState::Idle {
            return Err(self.wrong_state("relay"));
        }
        let refused = |reason| Err(ProtocolError::RelayNotAllowed { reason });
        if self.relaying {
            return refused("the hosts to relay to were sent already");
        }
        if self.chunk_key.is_none() {
            return refused("a relay chain needs a session authenticated with a token");
        }
        if self.offers > 0 {
            return refused("the hosts to relay to go before the first offer");
        }
        let messages = relay_messages(hops).map_err(ProtocolError::BadRelayChain)?;
        self.outbox.extend(messages.into_iter().map(Message::Relay));
        self.relaying = true;
        self.relay_hops = hops.len();
        Ok(())
    }

    /// Whether this session relays (`relay` queued the chain).
    pub fn is_relaying(&self) -> bool {
        self.relaying
    }

    /// Idle -> AwaitRing (a file or stream) or Idle with one more pending
    /// entry (a directory); queues the HELLO. The name is not
    /// checked here: the receiver is the authority and answers a bad one
    /// with REJECT. `payload` comes back with
    /// the entry's verdict (`SenderEvent::Answered`), for the engine's
    /// report.
    pub fn start_file(&mut self, offer: FileOffer, payload: P) -> Result<(), ProtocolError> {
        self.offer_entry(offer, Some(payload), "start_file")
    }

    /// `start_file` for a file or stream whose payload comes with its FIN
    /// (`finish_carrying`): nothing is carried before it (the engine knows
    /// what its verdict needs once the data is sent). A directory, whose
    /// verdict may come next, is refused.
    pub fn offer_file(&mut self, offer: FileOffer) -> Result<(), ProtocolError> {
        self.offer_entry(offer, None, "offer_file")
    }

    fn offer_entry(
        &mut self,
        offer: FileOffer,
        payload: Option<P>,
        op: &'static str,
    ) -> Result<(), ProtocolError> {
        self.check_can_start(op)?;
        let mut hello = offer_hello(offer);
        if self.dry_run {
            hello.caps = hello.caps & !hello_flags::RESUME | hello_flags::DRY_RUN;
        }
        let resume = hello.caps & hello_flags::RESUME != 0;
        if hello.is_directory() {
            let Some(payload) = payload else {
                return Err(ProtocolError::OfferKind {
                    op,
                    kind: "a directory (its verdict needs its payload now)",
                });
            };
            self.pending.push_back((payload, Pending::Directory));
        } else {
            self.start_data(payload, hello.size, hello.is_stream(), hello.digest);
            self.offer_caps = hello.caps;
            self.checksum = hello.caps & hello_flags::CHECKSUM != 0;
            if resume {
                self.state = SenderState::AwaitHave;
            }
        }
        self.offers += 1;
        self.outbox.push_back(Message::Hello(hello));
        Ok(())
    }

    /// Idle -> AwaitRing for several plain files offered together (BATCH):
    /// one ring, their bytes back to back as one data stream (the sum of
    /// their sizes), one FIN and one verdict for all. A REJECT refuses the
    /// whole batch (`SenderEvent::Rejected`): the engine then offers each
    /// file on its own. Files only, without RESUME, all with the same
    /// digest, at most `MAX_BATCH_FILES` of them. Members keep CHECKSUM
    /// (a batch is never asked for digests; its files alone may be).
    pub fn start_batch(&mut self, offers: Vec<FileOffer>, payload: P) -> Result<(), ProtocolError> {
        self.batch(offers, Some(payload), "start_batch")
    }

    /// `start_batch` whose payload comes with its FIN (`finish_carrying`).
    pub fn offer_batch(&mut self, offers: Vec<FileOffer>) -> Result<(), ProtocolError> {
        self.batch(offers, None, "offer_batch")
    }

    fn batch(
        &mut self,
        offers: Vec<FileOffer>,
        payload: Option<P>,
        op: &'static str,
    ) -> Result<(), ProtocolError> {
        self.check_can_start(op)?;
        if self.dry_run {
            return Err(ProtocolError::BadBatch {
                reason: "a dry run offers its files one by one",
            });
        }
        let digest = offers
            .first()
            .map(|o| o.digest)
            .ok_or(ProtocolError::BadBatch {
                reason: "a batch without files",
            })?;
        if offers.len() > MAX_BATCH_FILES {
            return Err(ProtocolError::BadBatch {
                reason: "more files than a batch may hold",
            });
        }
        let mut total = 0u64;
        let mut members = Vec::with_capacity(offers.len());
        let mut caps = 0;
        for offer in offers {
            caps |= offer.caps();
            if offer.kind != OfferKind::File || offer.resume || offer.digest != digest {
                return Err(ProtocolError::BadBatch {
                    reason: "a batch holds plain files with one digest, never resumed",
                });
            }
            total = total
                .checked_add(offer.size)
                .ok_or(ProtocolError::BadBatch {
                    reason: "a batch of more than 2^64 bytes",
                })?;
            members.push(offer_hello(offer));
        }
        self.start_data(payload, total, false, digest);
        self.offer_caps = caps;
        self.batching = true;
        self.offers += 1;
        self.outbox.push_back(Message::Batch(members));
        Ok(())
    }

    fn check_can_start(&self, op: &'static str) -> Result<(), ProtocolError> {
        if self.state != SenderState::Idle {
            return Err(self.wrong_state(op));
        }
        if self.pending.len() >= MAX_PENDING {
            return Err(ProtocolError::TooManyPending {
                pending: self.pending.len(),
                max: MAX_PENDING,
            });
        }
        Ok(())
    }

    /// A file, stream or batch was offered: Idle -> AwaitRing.
    fn start_data(&mut self, payload: Option<P>, size: u64, stream: bool, digest: DigestAlg) {
        self.batching = false;
        self.carried = payload;
        self.size = size;
        self.stream = stream;
        self.short_planned = false;
        self.digest = digest;
        // `ring` and `credits` stay until the MR: a finished file's
        // late credits are still checked against its ring.
        self.chunk_len = 0;
        self.seq = 0;
        self.planned = 0;
        self.have = None;
        self.compare_sha256 = None;
        self.checksum = false;
        self.base_chunk_len = 0;
        self.state = SenderState::AwaitRing;
    }

    /// Applies a message from the receiver. Any error closes the session.
    pub fn on_message(&mut self, msg: Message) -> Result<SenderEvent<P>, ProtocolError> {
        let result = self.dispatch(msg);
        match &result {
            // The RESULTs heard were the answered offer's.
            Ok(event) if event.is_verdict() => self.results = 0,
            Ok(_) => {}
            Err(_) => {
                // Nothing queued goes out once the session is over.
                self.state = SenderState::Closed;
                self.outbox.clear();
            }
        }
        result
    }

    /// A RESULT in a relaying session while an offer awaits its verdict:
    /// the current one (from its HELLO or BATCH to its verdict) or a
    /// pending one. At most one per host of the chain for each offer (the
    /// receiver and the hosts after it: never more than
    /// `MAX_RELAY_HOPS` + 1).
    fn on_result(&mut self, result: HopResult) -> Result<SenderEvent<P>, ProtocolError> {
        if !self.hears_chain() {
            return Err(self.unexpected(&Message::Result(result)));
        }
        let hosts = self.relay_hops + 1;
        if self.results >= hosts {
            return Err(ProtocolError::TooManyResults { max: hosts });
        }
        self.results += 1;
        Ok(SenderEvent::HopResult(result))
    }

    /// A relaying session in which an offer awaits its verdict (the
    /// current one, from its HELLO or BATCH to its verdict, or a pending
    /// one): the hosts of the chain may be heard (RESULT), and the receiver
    /// waits for them (KEEPALIVE). `dispatch` calls it once authenticated.
    fn hears_chain(&self) -> bool {
        self.relaying && (self.state != SenderState::Idle || !self.pending.is_empty())
    }

    fn add_credits(&mut self, count: u32) -> Result<SenderEvent<P>, ProtocolError> {
        if count == 0 {
            return Err(ProtocolError::ZeroCredit);
        }
        let slot_count = self.ring.slot_count;
        match self.credits.checked_add(count) {
            Some(total) if total <= slot_count => {
                self.credits = total;
                Ok(SenderEvent::Credit(count))
            }
            _ => Err(ProtocolError::CreditOverflow {
                added: count,
                credits: self.credits,
                slot_count,
            }),
        }
    }

    fn dispatch(&mut self, msg: Message) -> Result<SenderEvent<P>, ProtocolError> {
        use SenderState::*;
        let front = self.pending.front().map(|&(_, entry)| entry);
        match (self.state, msg) {
            (Closed, m) => Err(self.unexpected(&m)),
            // Authentication refused: whenever it comes, the session is over.
            (_, Message::Reject(r)) if r.code == RejectCode::Auth => {
                Err(ProtocolError::AuthFailed { reason: r.reason })
            }
            // Another version, wherever it is said: the session is over.
            // Refusing an offer that asked for a capability, it is a
            // receiver of this version that predates the capability.
            (state, Message::Reject(r)) if r.code == RejectCode::Version => {
                let detail = format!(
                    "this sender speaks protocol version {PROTOCOL_VERSION}; the receiver says: {}",
                    escaped(&r.reason)
                );
                let offering = matches!(
                    state,
                    AwaitRing | AwaitHave | AwaitFromDecision | AwaitCompared
                );
                match Capability::refused(self.offer_caps) {
                    Some(lacks) if offering => Err(ProtocolError::OlderReceiver { lacks, detail }),
                    _ => Err(ProtocolError::VersionMismatch { detail }),
                }
            }
            (AwaitChallenge, Message::Challenge(c)) => {
                if !c.auth_required() {
                    // A token and a receiver that does not ask for it: a
                    // downgrade, maybe by someone posing as the receiver.
                    if self.auth.is_some() {
                        return Err(ProtocolError::NoAuthRequested);
                    }
                    self.state = Idle;
                    return Ok(SenderEvent::Greeted(Greeting { proving: false }));
                }
                let prove = match &self.auth {
                    Some(a) => {
                        let key = SessionKey::derive(&a.token, &c.nonce, &a.nonce, &a.conn);
                        let proof = key.sender_proof().to_vec();
                        self.key = Some(key);
                        Prove {
                            version: PROTOCOL_VERSION,
                            nonce: a.nonce,
                            proof,
                        }
                    }
                    // No token: the receiver will say so (REJECT(auth)).
                    None => Prove {
                        version: PROTOCOL_VERSION,
                        nonce: [0; NONCE_LEN],
                        proof: Vec::new(),
                    },
                };
                self.state = AwaitAuthOk;
                self.outbox.push_back(Message::Prove(prove));
                Ok(SenderEvent::Greeted(Greeting { proving: true }))
            }
            (AwaitAuthOk, Message::AuthOk { proof }) => {
                let Some(key) = &self.key else {
                    return Err(ProtocolError::ReceiverProofFailed);
                };
                if !key.verify_receiver(&proof) {
                    return Err(ProtocolError::ReceiverProofFailed);
                }
                let channel = key.channel(Role::Sender);
                self.chunk_key = Some(key.chunk_key());
                self.key = None;
                self.state = Idle;
                Ok(SenderEvent::Authenticated(channel))
            }
            // A receiver of protocol 2 or older cannot decode PROVE and
            // says so with ACK(protocol).
            (AwaitAuthOk, Message::Ack(a)) if a.status == AckStatus::Protocol => {
                Err(ProtocolError::VersionMismatch {
                    detail: format!(
                        "the receiver does not understand this sender's protocol version \
                         {PROTOCOL_VERSION} authentication (it runs an older version, 2 or \
                         earlier; it says: {})",
                        escaped(&a.reason)
                    ),
                })
            }
            // Greeted with a REJECT (busy: instead of the CHALLENGE without
            // a token, instead of AUTH_OK with one): refused before anything
            // began.
            (AwaitChallenge | AwaitAuthOk, Message::Reject(r)) => Err(ProtocolError::Refused {
                code: r.code,
                reason: r.reason,
            }),
            // (Before authentication it is unexpected: no RELAY went out.)
            (
                Idle | AwaitRing | AwaitHave | AwaitFromDecision | AwaitCompared | Sending,
                Message::Result(r),
            ) => self.on_result(r),
            // A host of a relay chain waits for the hosts after it before
            // its verdict on an offer (after the offer, after a file's FIN).
            (
                Idle | AwaitRing | AwaitHave | AwaitFromDecision | AwaitCompared | Sending,
                Message::Keepalive,
            ) if self.hears_chain() => Ok(SenderEvent::Keepalive),
            // A lane's receiver answers its probes (protocol 8), and may
            // answer the last after the piece's verdict.
            (
                Idle | AwaitRing | AwaitHave | AwaitFromDecision | AwaitCompared | Sending,
                Message::Keepalive,
            ) if self.timers.probe => Ok(SenderEvent::Keepalive),
            // Verdicts on pending entries come before anything about the
            // current HELLO.
            // (A verdict without data answers a HELLO, never a FIN.)
            (Idle | AwaitRing | AwaitHave | AwaitCompared, Message::Ack(a))
                if front.is_some() && !a.status.without_data() =>
            {
                self.answer_front(Verdict::Ack(a))
            }
            (Idle | AwaitRing | AwaitHave | AwaitCompared, Message::Reject(r))
                if front == Some(Pending::Directory) =>
            {
                self.answer_front(Verdict::Reject(r))
            }
            // A finished file's late credits (sent before the receiver saw
            // its FIN): noted, bounded by the ring, never used.
            (Idle | AwaitRing | AwaitHave | AwaitCompared, Message::Credit { count })
                if front == Some(Pending::File) =>
            {
                self.add_credits(count)
            }
            (AwaitHave, Message::Have(have)) if front.is_none() => {
                if have.kind == HaveKind::Digest && !self.checksum {
                    return Err(ProtocolError::BadHave {
                        reason: "a request for the digest of a file offered without CHECKSUM",
                    });
                }
                self.check_have(&have)?;
                self.have = Some(have.clone());
                self.state = AwaitFromDecision;
                Ok(SenderEvent::Have(have))
            }
            // An offer with CHECKSUM (without RESUME): the receiver asks for
            // its SHA-256 instead of the MR, once (for --link-dest, --exec,
            // or a file of the offered size under the final name).
            (AwaitRing, Message::Have(have))
                if front.is_none()
                    && self.checksum
                    && self.have.is_none()
                    && matches!(have.kind, HaveKind::Digest | HaveKind::Complete) =>
            {
                self.check_have(&have)?;
                self.have = Some(have.clone());
                self.state = AwaitFromDecision;
                Ok(SenderEvent::Have(have))
            }
            // The receiver's copy is the file: nothing is sent.
            (AwaitCompared, Message::Ack(a)) if front.is_none() && a.status == AckStatus::Ok => {
                let (Some(sha256), Some(kind)) =
                    (self.compare_sha256, self.have.as_ref().map(|h| h.kind))
                else {
                    // Unreachable: AwaitCompared comes only from `compare`,
                    // after a HAVE.
                    return Err(ProtocolError::Unexpected {
                        msg: "ACK",
                        state: self.state.as_str(),
                    });
                };
                let copy = match kind {
                    HaveKind::Digest => SameCopy::LinkDest,
                    _ => SameCopy::Kept,
                };
                self.planned = self.size;
                self.state = Idle;
                self.carried = None;
                Ok(SenderEvent::Same {
                    ack: a,
                    copy,
                    sha256,
                })
            }
            // A piece verified before (its ACK lost with a lane): PieceKept,
            // or Ok when its file is whole; no data.
            (AwaitRing, Message::Ack(a))
                if front.is_none()
                    && self.offer_caps & hello_flags::PIECE != 0
                    && matches!(a.status, AckStatus::PieceKept | AckStatus::Ok) =>
            {
                self.planned = self.size;
                self.state = Idle;
                self.carried = None;
                Ok(SenderEvent::Settled(a))
            }
            // The receiver's file stays: what it may say depends on what
            // the offer asked (a plain file; kept only as asked).
            (AwaitRing | AwaitHave, Message::Ack(a))
                if front.is_none() && a.status.without_data() =>
            {
                // A file alone (a dry run's stream too), never a batch: its
                // files get their own verdicts one by one.
                let asked = !self.batching
                    && match a.status {
                        AckStatus::KeptExisting => {
                            !self.stream && self.offer_caps & hello_flags::IGNORE_EXISTING != 0
                        }
                        AckStatus::KeptNewer => {
                            !self.stream && self.offer_caps & hello_flags::UPDATE != 0
                        }
                        AckStatus::WouldReceive => self.dry_run,
                        _ => !self.stream,
                    };
                if !asked {
                    return Err(self.unexpected(&Message::Ack(a)));
                }
                self.planned = self.size;
                self.state = Idle;
                self.carried = None;
                Ok(SenderEvent::Settled(a))
            }
            // It differs: nothing to reuse, FROM 0 follows.
            (AwaitCompared, Message::Have(have)) if front.is_none() => {
                if have.kind != HaveKind::Nothing {
                    return Err(ProtocolError::BadHave {
                        reason: "a second HAVE that is not of nothing",
                    });
                }
                self.check_have(&have)?;
                self.have = Some(have.clone());
                self.state = AwaitFromDecision;
                Ok(SenderEvent::Have(have))
            }
            // The receiver reads its copy of the file before the HAVE or
            // after COMPARE (never after FROM: it reads nothing before its
            // MR then).
            (AwaitHave | AwaitCompared, Message::Keepalive) if front.is_none() => {
                Ok(SenderEvent::Keepalive)
            }
            // (Never for a dry run: nothing is sent.)
            (AwaitRing, Message::Mr(ring)) if front.is_none() && !self.dry_run => {
                check_ring(&ring)?;
                // A slot holds a chunk and its tag.
                let room = match ring.slot_size.checked_sub(self.tag_len()) {
                    Some(room) if room > 0 => room,
                    _ => {
                        return Err(ProtocolError::BadRing {
                            reason: "slots too small for a chunk and its tag",
                        });
                    }
                };
                self.ring = ring;
                self.chunk_len = match (self.base_chunk_len, self.chunk_size) {
                    // A resumed file keeps its prefix's chunk length.
                    (b, _) if b > room => {
                        return Err(ProtocolError::BadRing {
                            reason: "slots smaller than the resumed prefix's chunks",
                        });
                    }
                    (b, _) if b > 0 => b,
                    (_, 0) => room,
                    (_, c) => c.min(room),
                };
                // The ring is empty at a file boundary, so every slot is available.
                self.credits = ring.slot_count;
                self.state = Sending;
                Ok(SenderEvent::Ring(ring))
            }
            (AwaitRing | AwaitHave | AwaitCompared, Message::Reject(r)) if front.is_none() => {
                self.state = Idle;
                self.carried = None;
                // Not one file's problem but the receiver's way.
                if self.batching && r.code == RejectCode::Protocol {
                    self.batches_refused = true;
                }
                // A member is there already (a re-run): its neighbours
                // likely are too, and each gets its own verdict without
                // data when offered alone; a batch would be read for
                // nothing. Batching is tried again after a batch's worth.
                if self.batching && r.code == RejectCode::Exists {
                    self.alone_until = self.offers.saturating_add(MAX_BATCH_FILES as u64);
                }
                Ok(SenderEvent::Rejected(r))
            }
            // A REJECT at any other point is the receiver giving up on the session.
            (_, Message::Reject(r)) => Err(ProtocolError::PeerRejected {
                code: r.code,
                reason: r.reason,
            }),
            (Sending, Message::Credit { count }) => self.add_credits(count),
            (AwaitRing | AwaitHave | AwaitCompared | Sending, Message::Ack(a)) => {
                match FailedAck::of(a) {
                    Ok(failed) => {
                        self.state = Closed;
                        self.carried = None;
                        Ok(SenderEvent::Aborted(failed))
                    }
                    Err(ok) => Err(self.unexpected(&Message::Ack(ok))),
                }
            }
            (_, m) => Err(self.unexpected(&m)),
        }
    }

    /// The oldest pending entry's verdict (`dispatch` saw one pending).
    fn answer_front(&mut self, verdict: Verdict) -> Result<SenderEvent<P>, ProtocolError> {
        let msg = match &verdict {
            Verdict::Ack(_) => "ACK",
            Verdict::Reject(_) => "REJECT",
        };
        match self.pending.pop_front() {
            Some((payload, entry)) => Ok(SenderEvent::Answered {
                payload,
                entry,
                verdict,
            }),
            None => Err(ProtocolError::Unexpected {
                msg,
                state: self.state.as_str(),
            }),
        }
    }

    fn unexpected(&self, m: &Message) -> ProtocolError {
        ProtocolError::Unexpected {
            msg: m.kind(),
            state: self.state.as_str(),
        }
    }

    /// Where chunk `self.seq` of `len` bytes goes; consumes one credit.
    fn plan(&mut self, len: u32) -> Option<ChunkPlan> {
        let slot = u32::try_from(self.seq % u64::from(self.ring.slot_count)).ok()?;
        // Cannot overflow: check_ring verified addr + slot_size * slot_count.
        let remote_addr = self
            .ring
            .addr
            .checked_add(u64::from(slot) * u64::from(self.ring.slot_size))?;
        let planned = self.planned.checked_add(u64::from(len))?;
        let plan = ChunkPlan {
            seq: self.seq,
            slot,
            remote_addr,
            rkey: self.ring.rkey,
            file_offset: self.planned,
            len,
            write_len: len.checked_add(self.tag_len())?,
        };
        self.seq += 1;
        self.planned = planned;
        self.credits -= 1;
        self.timers.spoke = true;
        Some(plan)
    }

    /// Answers the HAVE (state AwaitFromDecision) after the engine checked
    /// its file against it: 0 sends everything, HAVE's prefix continues
    /// it (the engine verified the prefix's chunk CRCs). Queues the FROM.
    pub fn start_from(&mut self, offset: u64) -> Result<(), ProtocolError> {
        if self.state != SenderState::AwaitFromDecision {
            return Err(self.wrong_state("start_from"));
        }
        let Some(have) = self.have.clone() else {
            return Err(self.wrong_state("start_from"));
        };
        match (have.kind, offset) {
            (_, 0) => self.state = SenderState::AwaitRing,
            // Chunks longer than this sender's staging buffers cannot be
            // continued: the engine must start over.
            (HaveKind::Prefix, o)
                if o == have.bytes
                    && (self.chunk_size == 0 || have.chunk_len <= self.chunk_size) =>
            {
                self.base_chunk_len = have.chunk_len;
                self.seq = o / u64::from(have.chunk_len);
                self.planned = o;
                self.state = SenderState::AwaitRing;
            }
            _ => {
                return Err(ProtocolError::BadFrom {
                    offset,
                    have: have.bytes,
                });
            }
        }
        self.outbox.push_back(Message::From { offset });
        Ok(())
    }

    /// Answers a HAVE of a complete copy or of kind Digest (state
    /// AwaitFromDecision) with the SHA-256 of the sender's file: the
    /// receiver compares and answers ACK (the same, `SenderEvent::Same`)
    /// or HAVE of nothing (FROM 0 follows). Queues the COMPARE.
    pub fn compare(&mut self, sha256: [u8; 32]) -> Result<(), ProtocolError> {
        let asked = matches!(
            self.have.as_ref().map(|h| h.kind),
            Some(HaveKind::Complete | HaveKind::Digest)
        );
        if self.state != SenderState::AwaitFromDecision || !asked {
            return Err(self.wrong_state("compare"));
        }
        self.state = SenderState::AwaitCompared;
        self.compare_sha256 = Some(sha256);
        self.outbox.push_back(Message::Compare { sha256 });
        Ok(())
    }

    /// Where the current file's data starts (its resumed prefix, in bytes).
    pub fn resumed_from(&self) -> u64 {
        match &self.have {
            Some(h) if self.base_chunk_len > 0 => h.bytes,
            _ => 0,
        }
    }

    /// A HAVE must fit the file offered: a prefix shorter than the file in
    /// whole chunks, or the whole file (held or asked for), or nothing.
    fn check_have(&self, have: &Have) -> Result<(), ProtocolError> {
        let ok = have.fits(self.size);
        if ok {
            Ok(())
        } else {
            Err(ProtocolError::BadHave {
                reason: "inconsistent with the offer",
            })
        }
    }

    /// Plans the next chunk, of `len` bytes the engine has read, consuming
    /// one credit. Every chunk is `chunk_len()` long but the last: for a
    /// file of known size the one that ends it, for a stream the one before
    /// its end. Ok(None) when out of credit. A chunk that does not fit (not
    /// Sending, a bad length, past the end of the file, after a stream's
    /// short chunk) is an error that changes nothing.
    pub fn next_chunk(&mut self, len: u32) -> Result<Option<ChunkPlan>, ProtocolError> {
        if self.state != SenderState::Sending {
            return Err(self.wrong_state("next_chunk"));
        }
        let seq = self.seq;
        let bad = |reason| ProtocolError::BadChunk { seq, len, reason };
        if len == 0 {
            return Err(bad("empty chunk"));
        }
        if len > self.chunk_len {
            return Err(bad("longer than the chunk length"));
        }
        if self.stream {
            if self.short_planned {
                return Err(bad("a stream's chunk after its short (last) chunk"));
            }
        } else {
            let remaining = self.size - self.planned;
            if remaining == 0 {
                return Err(bad("past the end of the file"));
            }
            if u64::from(len) != remaining.min(u64::from(self.chunk_len)) {
                return Err(bad("not the length of the file's next chunk"));
            }
        }
        if self.credits == 0 {
            return Ok(None);
        }
        let Some(plan) = self.plan(len) else {
            return Err(bad("longer than 2^64 bytes"));
        };
        self.short_planned = self.stream && len < self.chunk_len;
        Ok(Some(plan))
    }

    /// Whether every byte of a file of known size is planned (never for a
    /// stream: its end is the engine's to say, by `finish`).
    pub fn all_chunks_planned(&self) -> bool {
        self.state == SenderState::Sending && !self.stream && self.planned == self.size
    }

    /// Sending -> Idle with the file pending; queues the FIN. A file of
    /// known size must have every byte planned; a stream ends here, its
    /// size being what was planned. An offer without a payload
    /// (`offer_file`, `offer_batch`) gets its payload here only
    /// (`finish_carrying`).
    pub fn finish(&mut self, digest: Digest) -> Result<(), ProtocolError> {
        self.fin(digest, None)
    }

    /// `finish`, the entry carrying `payload` from now on instead of what
    /// its offer gave (the engine knows more once its data is sent).
    pub fn finish_carrying(&mut self, digest: Digest, payload: P) -> Result<(), ProtocolError> {
        self.fin(digest, Some(payload))
    }

    fn fin(&mut self, digest: Digest, payload: Option<P>) -> Result<(), ProtocolError> {
        if self.state != SenderState::Sending {
            return Err(self.wrong_state("finish"));
        }
        if !self.stream && self.planned != self.size {
            return Err(ProtocolError::Incomplete {
                planned: self.planned,
                size: self.size,
            });
        }
        if digest.alg() != self.digest {
            return Err(ProtocolError::DigestAlgMismatch {
                expected: self.digest,
                got: digest.alg(),
            });
        }
        let Some(carried) = payload.or_else(|| self.carried.take()) else {
            // `finish` of an offer that carries nothing (`offer_file`).
            return Err(ProtocolError::OfferKind {
                op: "finish",
                kind: "an offer without a payload (finish_carrying gives it)",
            });
        };
        self.carried = None;
        self.state = SenderState::Idle;
        self.pending.push_back((carried, Pending::File));
        self.outbox.push_back(Message::Fin(Fin {
            bytes: self.planned,
            chunks: self.seq,
            digest,
        }));
        Ok(())
    }

    /// While a stream waits for its input, or while the engine reads its
    /// file to compare it with a HAVE: a KEEPALIVE so that the receiver's
    /// no-progress timeout does not fire (due every `keepalive_interval`
    /// of silence). Nothing else may keep the receiver waiting.
    pub fn keepalive(&mut self) -> Result<(), ProtocolError> {
        let waiting = match self.state {
            _ if self.timers.probe && self.probes() => true,
            SenderState::Sending => self.stream,
            // Reading its file for a HAVE's answer.
            SenderState::AwaitFromDecision => true,
            _ => false,
        };
        if !waiting {
            return Err(self.wrong_state("keepalive"));
        }
        self.outbox.push_back(Message::Keepalive);
        Ok(())
    }

    /// Whether a lane's wait here is about a piece (its MR, credit, its
    /// ACK), which KEEPALIVEs may probe (the receiver takes them then).
    fn probes(&self) -> bool {
        self.offer_caps & hello_flags::PIECE != 0
            && match self.state {
                SenderState::AwaitRing | SenderState::Sending => true,
                SenderState::Idle => !self.pending.is_empty(),
                _ => false,
            }
    }

    /// The next message the machine queued for the receiver, if any. The
    /// engine sends them in this order.
    pub fn poll_transmit(&mut self) -> Option<Message> {
        let msg = self.outbox.pop_front();
        self.timers.spoke |= msg.is_some();
        msg
    }

    /// Idle with nothing pending -> Closed; queues the BYE.
    pub fn close(&mut self) -> Result<(), ProtocolError> {
        if self.state != SenderState::Idle {
            return Err(self.wrong_state("close"));
        }
        if !self.pending.is_empty() {
            return Err(ProtocolError::Unanswered {
                pending: self.pending.len(),
            });
        }
        self.state = SenderState::Closed;
        self.outbox.push_back(Message::Bye);
        Ok(())
    }

    /// What the entries awaiting a verdict carry, oldest first, taken
    /// out: when the session ended under them, no verdict comes.
    pub fn take_unanswered(&mut self) -> Vec<P> {
        self.pending.drain(..).map(|(payload, _)| payload).collect()
    }
}

/// The HELLO of an offer: flags from its kind and options, size 0 for a
/// stream or directory, RESUME only for a file with an mtime, CHECKSUM
/// only for a file.
fn offer_hello(offer: FileOffer) -> Hello {
    let caps = offer.caps();
    let size = match offer.kind {
        OfferKind::File => offer.size,
        OfferKind::Stream | OfferKind::Directory => 0,
    };
    Hello {
        version: PROTOCOL_VERSION,
        caps,
        name: offer.name,
        size,
        mode: offer.mode,
        digest: offer.digest,
        mtime: offer.mtime,
        piece: offer.piece.filter(|_| caps & hello_flags::PIECE != 0),
    }
}

/// How long a stream may wait for its input before the sender tells the
/// receiver it is still there (`SenderSession::keepalive`): often enough for
/// any receiver's --timeout (1 s at least), a few tiny messages a second at
/// most.
pub fn keepalive_interval(timeout: Duration) -> Duration {
    (timeout / 3).clamp(Duration::from_millis(200), Duration::from_millis(500))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::auth::{AUTH_REQUIRED, NONCE_LEN};
    use crate::proto::wire::{Challenge, MAX_RELAY_HOPS, WireError};

    const ADDR: u64 = 0x1000_0000;
    const NONCE: [u8; NONCE_LEN] = [0x5a; NONCE_LEN];

    fn challenge(flags: u16) -> Message {
        Message::Challenge(Challenge {
            flags,
            nonce: NONCE,
        })
    }

    /// The next chunk of a file as its reader would fill it; None when the
    /// machine plans none (not sending a file, out of credit, all planned).
    fn next_file(s: &mut SenderSession) -> Option<ChunkPlan> {
        if s.state != SenderState::Sending || s.stream {
            return None;
        }
        let len = (s.size - s.planned).min(u64::from(s.chunk_len)) as u32;
        if len == 0 {
            return None;
        }
        s.next_chunk(len).unwrap()
    }

    fn token() -> Token {
        Token::new(b"s3cret".to_vec()).unwrap()
    }

    const S_NONCE: [u8; NONCE_LEN] = [0xc3; NONCE_LEN];

    fn conn() -> ConnectionId {
        ConnectionId {
            receiver_addr: "10.0.0.1".parse().unwrap(),
            receiver_qpn: 17,
            sender_addr: "::ffff:10.0.0.2".parse().unwrap(),
            sender_qpn: 18,
        }
    }

    fn auth() -> SenderAuth {
        SenderAuth {
            token: token(),
            nonce: S_NONCE,
            conn: conn(),
        }
    }

    /// The key the real receiver derives on this connection.
    fn receiver_key() -> SessionKey {
        let receivers_view = ConnectionId {
            // The receiver may see the sender's address in its IPv4 form.
            sender_addr: "10.0.0.2".parse().unwrap(),
            ..conn()
        };
        SessionKey::derive(&token(), &NONCE, &S_NONCE, &receivers_view)
    }

    fn good_auth_ok() -> Message {
        Message::AuthOk {
            proof: receiver_key().receiver_proof(),
        }
    }

    fn expected_prove() -> Message {
        Message::Prove(Prove {
            version: PROTOCOL_VERSION,
            nonce: S_NONCE,
            proof: receiver_key().sender_proof().to_vec(),
        })
    }

    /// A session past the receiver's greeting (no authentication asked).
    fn greeted(chunk_size: u32) -> SenderSession {
        let mut s = SenderSession::new(chunk_size, None);
        s.on_message(challenge(0)).unwrap();
        s
    }

    fn offer(size: u64) -> FileOffer {
        FileOffer {
            name: "f.bin".into(),
            size,
            mode: 0o600,
            digest: DigestAlg::Crc32,
            kind: OfferKind::File,
            mtime: None,
            keep_mode: false,
            resume: false,
            checksum: false,
            existing: Default::default(),
            piece: None,
        }
    }

    fn stream_offer() -> FileOffer {
        FileOffer {
            name: "stdin".into(),
            kind: OfferKind::Stream,
            ..offer(0)
        }
    }

    fn dir_offer(name: &str) -> FileOffer {
        FileOffer {
            name: name.into(),
            mode: 0o755,
            kind: OfferKind::Directory,
            ..offer(0)
        }
    }

    fn ring(slot_size: u32, slot_count: u32) -> RingInfo {
        RingInfo {
            addr: ADDR,
            rkey: 77,
            slot_size,
            slot_count,
        }
    }

    fn ack(status: AckStatus) -> Message {
        Message::Ack(Ack::new(status, "r"))
    }

    fn fin() -> Message {
        Message::Fin(Fin {
            bytes: 0,
            chunks: 0,
            digest: Digest::Crc32(0),
        })
    }

    /// What an engine call queued: its message (the last one queued), or
    /// why it was refused.
    fn queued<P>(
        result: Result<(), ProtocolError>,
        s: &mut SenderSession<P>,
    ) -> Result<Message, ProtocolError> {
        let mut sent: Vec<Message> = std::iter::from_fn(|| s.poll_transmit()).collect();
        match result {
            Ok(()) => {
                assert_eq!(sent.len(), 1, "one message per call: {sent:?}");
                Ok(sent.remove(0))
            }
            Err(e) => {
                assert!(sent.is_empty(), "a refused call queued {sent:?}");
                Err(e)
            }
        }
    }
    fn named(name: &str, size: u64) -> FileOffer {
        FileOffer {
            name: name.into(),
            ..offer(size)
        }
    }

    #[test]
    fn a_batch_is_one_offer_one_data_stream_and_one_verdict() {
        let mut s = greeted(100);
        let msg = queued(
            s.start_batch(vec![named("a", 150), named("b", 0), named("c", 60)], 9),
            &mut s,
        )
        .unwrap();
        let Message::Batch(members) = msg else {
            panic!("{msg:?}")
        };
        let names: Vec<_> = members.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(
            members
                .iter()
                .all(|h| h.caps == 0 && h.version == PROTOCOL_VERSION)
        );
        assert_eq!(s.state(), SenderState::AwaitRing);
        assert!(matches!(
            s.on_message(Message::Mr(ring(100, 4))),
            Ok(SenderEvent::Ring(_))
        ));
        // 210 bytes: chunks of 100, 100 and 10, then nothing more.
        for (len, offset) in [(100, 0), (100, 100), (10, 200)] {
            let plan = s.next_chunk(len).unwrap().unwrap();
            assert_eq!(plan.file_offset, offset);
        }
        assert!(s.all_chunks_planned());
        queued(s.finish(Digest::Crc32(1)), &mut s).unwrap();
        assert_eq!(s.pending(), 1);
        let got = s.on_message(ack(AckStatus::Ok)).unwrap();
        assert!(
            matches!(
                got,
                SenderEvent::Answered {
                    payload: 9,
                    entry: Pending::File,
                    ..
                }
            ),
            "{got:?}"
        );
    }

    #[test]
    fn a_refused_batch_leaves_the_session_idle() {
        let mut s = greeted(100);
        queued(s.start_batch(vec![named("a", 1), named("b", 1)], 1), &mut s).unwrap();
        let got = s
            .on_message(Message::Reject(Reject::new(RejectCode::Exists, "b exists")))
            .unwrap();
        assert!(matches!(got, SenderEvent::Rejected(_)), "{got:?}");
        assert_eq!(s.state(), SenderState::Idle);
        assert_eq!(s.pending(), 0);
        assert!(s.start_file(named("a", 1), 2).is_ok());
    }

    #[test]
    fn the_first_offer_goes_alone_a_policy_refusal_ends_batching_and_an_existing_member_pauses_it()
    {
        let mut s = greeted(100);
        // No ring known yet: the first file goes alone.
        assert!(!s.may_batch());
        queued(s.start_file(named("first", 1), 1), &mut s).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        s.next_chunk(1).unwrap().unwrap();
        queued(s.finish(Digest::Crc32(1)), &mut s).unwrap();
        s.on_message(ack(AckStatus::Ok)).unwrap();
        assert!(s.may_batch());
        // A batch refused for one of its files (a re-run): a batch's worth
        // of offers go alone, then batches again.
        queued(s.start_batch(vec![named("a", 1), named("b", 1)], 2), &mut s).unwrap();
        let exists = Reject::new(RejectCode::Exists, "b exists");
        s.on_message(Message::Reject(exists.clone())).unwrap();
        for i in 0..MAX_BATCH_FILES {
            assert!(!s.may_batch(), "offer {i}");
            queued(s.start_file(named(&format!("x{i}"), 1), 10), &mut s).unwrap();
            s.on_message(Message::Reject(exists.clone())).unwrap();
        }
        assert!(s.may_batch());
        // A file refused by policy says nothing about batches.
        queued(s.start_file(named("c", 1), 3), &mut s).unwrap();
        let policy = Reject::new(RejectCode::Protocol, "no");
        s.on_message(Message::Reject(policy.clone())).unwrap();
        assert!(s.may_batch());
        // A batch refused by policy: the receiver takes files one by one.
        queued(s.start_batch(vec![named("a", 1), named("b", 1)], 4), &mut s).unwrap();
        s.on_message(Message::Reject(policy)).unwrap();
        assert!(!s.may_batch());
        assert!(s.can_start());
    }

    #[test]
    fn batches_hold_plain_files_with_one_digest() {
        let bad = |offers: Vec<FileOffer>| {
            let mut s = greeted(100);
            let got = s.start_batch(offers, 1);
            assert!(
                matches!(got, Err(ProtocolError::BadBatch { .. })),
                "{got:?}"
            );
            assert_eq!(s.state(), SenderState::Idle);
        };
        bad(Vec::new());
        bad((0..=MAX_BATCH_FILES)
            .map(|i| named(&format!("f{i}"), 1))
            .collect());
        bad(vec![
            named("a", 1),
            FileOffer {
                kind: OfferKind::Stream,
                ..named("s", 0)
            },
        ]);
        bad(vec![
            named("a", 1),
            FileOffer {
                kind: OfferKind::Directory,
                ..named("d", 0)
            },
        ]);
        bad(vec![
            named("a", 1),
            FileOffer {
                resume: true,
                ..named("r", 1)
            },
        ]);
        bad(vec![
            named("a", 1),
            FileOffer {
                digest: DigestAlg::Sha256,
                ..named("x", 1)
            },
        ]);
        bad(vec![named("a", u64::MAX), named("b", 1)]);
        // Not while another offer waits for its ring.
        let mut s = greeted(100);
        queued(s.start_file(offer(1), 1), &mut s).unwrap();
        let got = s.start_batch(vec![named("a", 1)], 2);
        assert!(
            matches!(got, Err(ProtocolError::WrongState { .. })),
            "{got:?}"
        );
    }

    /// Where a session can be, as far as the receiver's messages go.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum Situation {
        AwaitChallenge,
        /// PROVE sent (with a token).
        AwaitAuthOk,
        Idle,
        /// Idle after a FIN whose ACK has not come.
        IdleFilePending,
        /// Idle after a directory HELLO.
        IdleDirPending,
        AwaitRing,
        /// The next file's HELLO went out right after the previous FIN.
        AwaitRingFilePending,
        AwaitRingDirPending,
        Sending,
        SendingStream,
        Closed,
    }

    const SITUATIONS: [Situation; 11] = [
        Situation::AwaitChallenge,
        Situation::AwaitAuthOk,
        Situation::Idle,
        Situation::IdleFilePending,
        Situation::IdleDirPending,
        Situation::AwaitRing,
        Situation::AwaitRingFilePending,
        Situation::AwaitRingDirPending,
        Situation::Sending,
        Situation::SendingStream,
        Situation::Closed,
    ];

    impl Situation {
        fn state(self) -> SenderState {
            use Situation::*;
            match self {
                AwaitChallenge => SenderState::AwaitChallenge,
                AwaitAuthOk => SenderState::AwaitAuthOk,
                Idle | IdleFilePending | IdleDirPending => SenderState::Idle,
                AwaitRing | AwaitRingFilePending | AwaitRingDirPending => SenderState::AwaitRing,
                Sending | SendingStream => SenderState::Sending,
                Closed => SenderState::Closed,
            }
        }

        fn front(self) -> Option<Pending> {
            use Situation::*;
            match self {
                IdleFilePending | AwaitRingFilePending => Some(Pending::File),
                IdleDirPending | AwaitRingDirPending => Some(Pending::Directory),
                _ => None,
            }
        }
    }

    /// A 100-byte file through a 4x100 ring: one chunk planned (3 credits
    /// left), then FIN: the file is pending.
    fn file_pending() -> SenderSession {
        let mut s = greeted(100);
        queued(s.start_file(offer(100), 0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        next_file(&mut s).unwrap();
        queued(s.finish(Digest::Crc32(1)), &mut s).unwrap();
        s
    }

    /// A session in `sit`, with a 4x100 ring, 1000-byte file, one chunk planned.
    fn session_in(sit: Situation) -> SenderSession {
        use Situation::*;
        let mut s = match sit {
            AwaitChallenge => return SenderSession::new(100, Some(auth())),
            AwaitAuthOk => {
                let mut s = SenderSession::new(100, Some(auth()));
                s.on_message(challenge(AUTH_REQUIRED)).unwrap();
                return s;
            }
            IdleFilePending | AwaitRingFilePending => file_pending(),
            _ => greeted(100),
        };
        match sit {
            Closed => {
                queued(s.close(), &mut s).unwrap();
            }
            IdleDirPending | AwaitRingDirPending => {
                queued(s.start_file(dir_offer("d"), 0), &mut s).unwrap();
            }
            _ => {}
        }
        match sit {
            AwaitRing | AwaitRingFilePending | AwaitRingDirPending => {
                queued(s.start_file(offer(1000), 0), &mut s).unwrap();
            }
            Sending => {
                queued(s.start_file(offer(1000), 0), &mut s).unwrap();
                s.on_message(Message::Mr(ring(100, 4))).unwrap();
                next_file(&mut s).unwrap();
            }
            SendingStream => {
                queued(s.start_file(stream_offer(), 0), &mut s).unwrap();
                s.on_message(Message::Mr(ring(100, 4))).unwrap();
                s.next_chunk(100).unwrap().unwrap();
            }
            _ => {}
        }
        assert_eq!(s.state(), sit.state(), "{sit:?}");
        assert_eq!(s.pending.front().map(|&(_, e)| e), sit.front(), "{sit:?}");
        s
    }

    fn all_messages() -> Vec<Message> {
        vec![
            Message::Hello(Hello {
                version: PROTOCOL_VERSION,
                caps: 0,
                name: "x".into(),
                size: 1,
                mode: 0,
                digest: DigestAlg::Crc32,
                mtime: None,
                piece: None,
            }),
            Message::Mr(ring(100, 4)),
            Message::Reject(Reject::new(RejectCode::Exists, "exists")),
            Message::Credit { count: 1 },
            fin(),
            ack(AckStatus::Ok),
            ack(AckStatus::Io),
            Message::Bye,
            challenge(0),
            challenge(AUTH_REQUIRED),
            Message::Auth { mac: Vec::new() },
            Message::Auth {
                mac: token().mac(&NONCE).to_vec(),
            },
            Message::Reject(Reject::new(RejectCode::Busy, "busy")),
            Message::Reject(Reject::new(
                RejectCode::Auth,
                "authentication failed: wrong token",
            )),
            Message::Reject(Reject::new(RejectCode::Version, "speaks 2")),
            ack(AckStatus::Protocol),
            expected_prove(),
            good_auth_ok(),
            // Another connection's proof (relayed), the sender's own proof
            // reflected, garbage.
            Message::AuthOk {
                proof: SessionKey::derive(
                    &token(),
                    &NONCE,
                    &S_NONCE,
                    &ConnectionId {
                        receiver_qpn: 99,
                        ..conn()
                    },
                )
                .receiver_proof(),
            },
            Message::AuthOk {
                proof: receiver_key().sender_proof(),
            },
            Message::AuthOk { proof: [0; 32] },
            Message::Keepalive,
            // None of these sessions relays: RESULT is unexpected.
            hop_result("b:1"),
            Message::Relay(crate::proto::Relay {
                hops: vec!["b:1".into()],
            }),
        ]
    }

    fn hop_result(host: &str) -> Message {
        Message::Result(HopResult::new(
            host.into(),
            crate::proto::HopVerdict::Ack(AckStatus::Ok),
            7,
            "",
        ))
    }

    /// A session whose receiver proved the token: Idle, nothing offered.
    fn authenticated() -> SenderSession {
        let mut s = SenderSession::new(100, Some(auth()));
        s.on_message(challenge(AUTH_REQUIRED)).unwrap();
        assert_eq!(s.poll_transmit(), Some(expected_prove()));
        let Ok(SenderEvent::Authenticated(_)) = s.on_message(good_auth_ok()) else {
            panic!("not authenticated");
        };
        s
    }

    fn hosts(names: &[&str]) -> Vec<String> {
        names.iter().map(|h| h.to_string()).collect()
    }

    /// `relay` refused: its error, with nothing queued and the session
    /// as it was.
    fn relay_refused(s: &mut SenderSession, hops: &[String]) -> ProtocolError {
        let (state, relaying) = (s.state(), s.is_relaying());
        let err = s.relay(hops).unwrap_err();
        assert_eq!(s.poll_transmit(), None, "{err}");
        assert_eq!((s.state(), s.is_relaying()), (state, relaying), "{err}");
        err
    }

    #[test]
    fn relay_goes_once_after_the_proof_and_before_any_offer() {
        let mut s = authenticated();
        assert!(!s.is_relaying());
        assert_eq!(
            queued(s.relay(&hosts(&["b:7471", "c"])), &mut s),
            Ok(Message::Relay(crate::proto::Relay {
                hops: hosts(&["b:7471", "c"])
            }))
        );
        assert!(s.is_relaying());
        assert_eq!(s.state(), SenderState::Idle);
        // Once only.
        assert!(matches!(
            relay_refused(&mut s, &hosts(&["d"])),
            ProtocolError::RelayNotAllowed { .. }
        ));
        // Then offers as usual.
        assert!(matches!(
            queued(s.start_file(offer(1), 0), &mut s),
            Ok(Message::Hello(_))
        ));

        // Without a token: no chain (nothing authenticates the hosts).
        let mut s = greeted(100);
        assert!(matches!(
            relay_refused(&mut s, &hosts(&["b"])),
            ProtocolError::RelayNotAllowed { .. }
        ));
        // Before the receiver's proof, and once closed: the wrong state.
        for sit in [Situation::AwaitChallenge, Situation::AwaitAuthOk] {
            let mut s = session_in(sit);
            while s.poll_transmit().is_some() {}
            assert!(matches!(
                relay_refused(&mut s, &hosts(&["b"])),
                ProtocolError::WrongState { op: "relay", .. }
            ));
        }
        let mut s = authenticated();
        queued(s.close(), &mut s).unwrap();
        assert!(matches!(
            relay_refused(&mut s, &hosts(&["b"])),
            ProtocolError::WrongState { op: "relay", .. }
        ));
        // After an offer: while it is open, pending, or answered.
        let mut s = authenticated();
        queued(s.start_file(offer(1), 0), &mut s).unwrap();
        assert!(matches!(
            relay_refused(&mut s, &hosts(&["b"])),
            ProtocolError::WrongState { op: "relay", .. }
        ));
        let mut s = authenticated();
        queued(s.start_file(dir_offer("d"), 0), &mut s).unwrap();
        assert!(matches!(
            relay_refused(&mut s, &hosts(&["b"])),
            ProtocolError::RelayNotAllowed { .. }
        ));
        s.on_message(ack(AckStatus::Ok)).unwrap();
        assert_eq!((s.state(), s.pending()), (SenderState::Idle, 0));
        assert!(matches!(
            relay_refused(&mut s, &hosts(&["b"])),
            ProtocolError::RelayNotAllowed { .. }
        ));
    }

    #[test]
    fn relay_refuses_lists_relay_cannot_carry_and_splits_long_ones() {
        let mut s = authenticated();
        let too_many: Vec<String> = (0..=MAX_RELAY_HOPS).map(|i| format!("h{i}")).collect();
        for (bad, want) in [
            (Vec::new(), WireError::NoHops),
            (
                too_many,
                WireError::TooManyHops {
                    count: MAX_RELAY_HOPS + 1,
                    max: MAX_RELAY_HOPS,
                },
            ),
        ] {
            assert_eq!(
                relay_refused(&mut s, &bad),
                ProtocolError::BadRelayChain(want)
            );
        }
        for host in ["", "a b", "tab\t", "h\u{e9}", &"h".repeat(256)] {
            assert!(
                matches!(
                    relay_refused(&mut s, &hosts(&["ok", host])),
                    ProtocolError::BadRelayChain(_)
                ),
                "{host:?}"
            );
        }
        assert!(!s.is_relaying());
        // The longest chain: several messages, in order, each a frame.
        let chain: Vec<String> = (0..MAX_RELAY_HOPS).map(|i| format!("{i:0>255}")).collect();
        s.relay(&chain).unwrap();
        let sent: Vec<Message> = std::iter::from_fn(|| s.poll_transmit()).collect();
        assert!(sent.len() > 1, "{} messages", sent.len());
        let mut joined = Vec::new();
        for m in sent {
            assert!(crate::proto::encode_to_vec(&m).unwrap().len() <= crate::proto::MAX_FRAME);
            let Message::Relay(r) = m else {
                panic!("{m:?}")
            };
            joined.extend(r.hops);
        }
        assert_eq!(joined, chain);
    }

    #[test]
    fn results_come_while_an_offer_awaits_its_verdict_one_per_host() {
        // Two hosts after the receiver: three RESULTs per offer at most.
        let mut s = authenticated();
        queued(s.relay(&hosts(&["b", "c"])), &mut s).unwrap();
        let heard = |s: &mut SenderSession, host: &str| match s.on_message(hop_result(host)) {
            Ok(SenderEvent::HopResult(r)) => {
                assert_eq!(r.host, host);
                Ok(())
            }
            Ok(other) => panic!("{other:?}"),
            Err(e) => Err(e),
        };
        // Nothing offered: unexpected.
        let mut idle = s.clone();
        assert_eq!(
            heard(&mut idle, "a"),
            Err(ProtocolError::Unexpected {
                msg: "RESULT",
                state: "IDLE"
            })
        );
        assert_eq!(idle.state(), SenderState::Closed);
        // A file: before its MR, while its data goes, after its FIN.
        queued(s.start_file(offer(150), 0), &mut s).unwrap();
        heard(&mut s, "c").unwrap();
        assert_eq!(s.state(), SenderState::AwaitRing);
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        next_file(&mut s).unwrap();
        heard(&mut s, "b").unwrap();
        assert_eq!(s.state(), SenderState::Sending);
        while next_file(&mut s).is_some() {}
        queued(s.finish(Digest::Crc32(0)), &mut s).unwrap();
        heard(&mut s, "a").unwrap();
        // A fourth for the same offer: more hosts than the chain has.
        let mut over = s.clone();
        assert_eq!(
            heard(&mut over, "a"),
            Err(ProtocolError::TooManyResults { max: 3 })
        );
        assert_eq!(over.state(), SenderState::Closed);
        // The next offer's RESULTs count anew from its predecessor's verdict.
        queued(s.start_file(dir_offer("d"), 1), &mut s).unwrap();
        assert!(matches!(
            s.on_message(ack(AckStatus::Ok)),
            Ok(SenderEvent::Answered { payload: 0, .. })
        ));
        for host in ["a", "b", "c"] {
            heard(&mut s, host).unwrap();
        }
        assert_eq!(
            heard(&mut s.clone(), "d"),
            Err(ProtocolError::TooManyResults { max: 3 })
        );
        assert!(matches!(
            s.on_message(Message::Reject(Reject::new(RejectCode::Exists, "d"))),
            Ok(SenderEvent::Answered { payload: 1, .. })
        ));
        // Every verdict starts the count over: a refusal, a verdict
        // without data.
        queued(s.start_file(offer(1), 2), &mut s).unwrap();
        for host in ["a", "b", "c"] {
            heard(&mut s, host).unwrap();
        }
        assert!(matches!(
            s.on_message(Message::Reject(Reject::new(RejectCode::Exists, "f"))),
            Ok(SenderEvent::Rejected(_))
        ));
        queued(s.start_file(offer(1), 3), &mut s).unwrap();
        for host in ["a", "b", "c"] {
            heard(&mut s, host).unwrap();
        }
        assert!(matches!(
            s.on_message(Message::Ack(Ack::new(AckStatus::Unchanged, ""))),
            Ok(SenderEvent::Settled(_))
        ));
        heard(&mut s.clone(), "a").unwrap_err();
        queued(s.start_file(offer(1), 4), &mut s).unwrap();
        heard(&mut s, "a").unwrap();
        // A failed ACK aborts the file and the session: nothing more.
        assert!(matches!(
            s.on_message(ack(AckStatus::Io)),
            Ok(SenderEvent::Aborted(_))
        ));
        assert!(heard(&mut s, "b").is_err());
    }

    /// A KEEPALIVE from the receiver: the event, the session as it was.
    fn kept_waiting(s: &mut SenderSession) {
        let (state, pending) = (s.state(), s.pending());
        assert_eq!(s.on_message(Message::Keepalive), Ok(SenderEvent::Keepalive));
        assert_eq!((s.state(), s.pending()), (state, pending));
        assert_eq!(s.poll_transmit(), None);
    }

    /// A KEEPALIVE from the receiver, refused: a protocol error naming the
    /// state, and the session over (tried on a copy).
    fn keepalive_refused(s: &SenderSession) {
        let mut s = s.clone();
        let state = s.state();
        assert_eq!(
            s.on_message(Message::Keepalive),
            Err(ProtocolError::Unexpected {
                msg: "KEEPALIVE",
                state: state.as_str()
            })
        );
        assert_eq!(s.state(), SenderState::Closed);
    }

    /// A host of a relay chain waits for the hosts after it before its
    /// verdict on an offer: its KEEPALIVEs come whenever an offer awaits
    /// its verdict (where its RESULTs may come), and nowhere else.
    #[test]
    fn keepalives_come_from_a_relaying_receiver_while_an_offer_awaits_its_verdict() {
        let mut s = authenticated();
        queued(s.relay(&hosts(&["b"])), &mut s).unwrap();
        // Nothing offered.
        keepalive_refused(&s);
        // A file: before its MR, while its data goes, after its FIN.
        queued(s.start_file(offer(150), 0), &mut s).unwrap();
        kept_waiting(&mut s);
        // No verdict, no RESULT: both hosts' RESULTs still come.
        s.on_message(hop_result("a")).unwrap();
        kept_waiting(&mut s);
        s.on_message(hop_result("b")).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        next_file(&mut s).unwrap();
        assert_eq!(s.state(), SenderState::Sending);
        kept_waiting(&mut s);
        while next_file(&mut s).is_some() {}
        queued(s.finish(Digest::Crc32(0)), &mut s).unwrap();
        assert_eq!((s.state(), s.pending()), (SenderState::Idle, 1));
        kept_waiting(&mut s);
        // Pipelined: the next offer's HELLO went out, the file is pending.
        queued(s.start_file(offer(1), 1), &mut s).unwrap();
        kept_waiting(&mut s);
        assert!(matches!(
            s.on_message(ack(AckStatus::Ok)),
            Ok(SenderEvent::Answered { payload: 0, .. })
        ));
        kept_waiting(&mut s);
        assert!(matches!(
            s.on_message(Message::Reject(Reject::new(RejectCode::Exists, "f"))),
            Ok(SenderEvent::Rejected(_))
        ));
        keepalive_refused(&s);
        // A directory: pending until its verdict.
        queued(s.start_file(dir_offer("d"), 2), &mut s).unwrap();
        kept_waiting(&mut s);
        s.on_message(ack(AckStatus::Ok)).unwrap();
        assert_eq!((s.state(), s.pending()), (SenderState::Idle, 0));
        keepalive_refused(&s);
        // An offer with RESUME, from its HELLO to its verdict.
        queued(s.start_file(resumable(1000), 3), &mut s).unwrap();
        assert_eq!(s.state(), SenderState::AwaitHave);
        kept_waiting(&mut s);
        s.on_message(Message::Have(Have::complete(1000))).unwrap();
        assert_eq!(s.state(), SenderState::AwaitFromDecision);
        kept_waiting(&mut s);
        queued(s.compare([1; 32]), &mut s).unwrap();
        assert_eq!(s.state(), SenderState::AwaitCompared);
        kept_waiting(&mut s);
        s.on_message(Message::Have(Have::nothing("differs")))
            .unwrap();
        queued(s.start_from(0), &mut s).unwrap();
        assert_eq!(s.state(), SenderState::AwaitRing);
        kept_waiting(&mut s);
        assert!(matches!(
            s.on_message(Message::Ack(Ack::new(AckStatus::Unchanged, ""))),
            Ok(SenderEvent::Settled(_))
        ));
        keepalive_refused(&s);
        // Closed: nothing.
        queued(s.close(), &mut s).unwrap();
        assert!(s.clone().on_message(Message::Keepalive).is_err());
    }

    /// Without a RELAY, a KEEPALIVE comes only while the receiver reads
    /// its copy (AwaitHave, AwaitCompared, nothing pending), as before.
    #[test]
    fn keepalives_of_a_session_that_does_not_relay_are_as_before() {
        let mut s = authenticated();
        keepalive_refused(&s);
        queued(s.start_file(offer(150), 0), &mut s).unwrap();
        keepalive_refused(&s);
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        next_file(&mut s).unwrap();
        keepalive_refused(&s);
        while next_file(&mut s).is_some() {}
        queued(s.finish(Digest::Crc32(0)), &mut s).unwrap();
        assert_eq!(s.pending(), 1);
        keepalive_refused(&s);
        queued(s.start_file(resumable(1000), 1), &mut s).unwrap();
        assert_eq!(s.state(), SenderState::AwaitHave);
        // The pending file's verdict comes first.
        keepalive_refused(&s);
        s.on_message(ack(AckStatus::Ok)).unwrap();
        kept_waiting(&mut s);
        s.on_message(Message::Have(Have::complete(1000))).unwrap();
        keepalive_refused(&s);
        queued(s.compare([1; 32]), &mut s).unwrap();
        kept_waiting(&mut s);
        s.on_message(Message::Have(Have::nothing("differs")))
            .unwrap();
        queued(s.start_from(0), &mut s).unwrap();
        keepalive_refused(&s);
    }

    #[test]
    fn results_are_unexpected_where_no_relay_went_out() {
        // Authenticated, an offer open, but no RELAY sent.
        let mut s = authenticated();
        queued(s.start_file(offer(1), 0), &mut s).unwrap();
        assert_eq!(
            s.on_message(hop_result("b")),
            Err(ProtocolError::Unexpected {
                msg: "RESULT",
                state: "AWAIT_RING"
            })
        );
        assert_eq!(s.state(), SenderState::Closed);
        // A receiver never sends RELAY.
        let mut s = authenticated();
        queued(s.relay(&hosts(&["b"])), &mut s).unwrap();
        let relay = Message::Relay(crate::proto::Relay {
            hops: hosts(&["c"]),
        });
        assert!(matches!(
            s.on_message(relay),
            Err(ProtocolError::Unexpected { msg: "RELAY", .. })
        ));
    }

    #[test]
    fn every_situation_message_pair() {
        use Situation::*;
        for sit in SITUATIONS {
            for msg in all_messages() {
                let mut s = session_in(sit);
                let pending_before = s.pending();
                let res = s.on_message(msg.clone());
                let auth_reject = matches!(&msg, Message::Reject(r) if r.code == RejectCode::Auth);
                let version_reject =
                    matches!(&msg, Message::Reject(r) if r.code == RejectCode::Version);
                let failed_ack = matches!(&msg, Message::Ack(a) if a.status != AckStatus::Ok);
                let ctx = format!("{} in {sit:?}", msg.kind());
                // The expected event and state, or None for an error.
                let expect: Option<(SenderEvent, SenderState)> = match (sit, &msg) {
                    _ if auth_reject || version_reject || sit == Closed => None,
                    (AwaitChallenge, Message::Challenge(c)) if c.auth_required() => Some((
                        SenderEvent::Greeted(Greeting { proving: true }),
                        SenderState::AwaitAuthOk,
                    )),
                    (AwaitAuthOk, m) if *m == good_auth_ok() => {
                        let channel = receiver_key().channel(Role::Sender);
                        Some((SenderEvent::Authenticated(channel), SenderState::Idle))
                    }
                    (
                        IdleFilePending | IdleDirPending | AwaitRingFilePending
                        | AwaitRingDirPending,
                        Message::Ack(a),
                    ) => Some((
                        SenderEvent::Answered {
                            payload: 0,
                            entry: sit.front().unwrap(),
                            verdict: Verdict::Ack(a.clone()),
                        },
                        sit.state(),
                    )),
                    (IdleDirPending | AwaitRingDirPending, Message::Reject(r)) => Some((
                        SenderEvent::Answered {
                            payload: 0,
                            entry: Pending::Directory,
                            verdict: Verdict::Reject(r.clone()),
                        },
                        sit.state(),
                    )),
                    (
                        IdleFilePending | AwaitRingFilePending | Sending | SendingStream,
                        Message::Credit { count },
                    ) => Some((SenderEvent::Credit(*count), sit.state())),
                    (AwaitRing, Message::Mr(r)) => {
                        Some((SenderEvent::Ring(*r), SenderState::Sending))
                    }
                    (AwaitRing, Message::Reject(r)) => {
                        Some((SenderEvent::Rejected(r.clone()), SenderState::Idle))
                    }
                    (AwaitRing | Sending | SendingStream, Message::Ack(a)) if failed_ack => {
                        FailedAck::of(a.clone())
                            .ok()
                            .map(|f| (SenderEvent::Aborted(f), SenderState::Closed))
                    }
                    _ => None,
                };
                match expect {
                    Some((event, state)) => {
                        assert_eq!(res, Ok(event), "{ctx}");
                        assert_eq!(s.state(), state, "{ctx}");
                        let answered = matches!(res, Ok(SenderEvent::Answered { payload: 0, .. }));
                        assert_eq!(
                            s.pending(),
                            pending_before - usize::from(answered),
                            "{ctx}: a verdict pops exactly one entry"
                        );
                    }
                    None => {
                        let want = match (&msg, sit) {
                            (Message::Reject(r), st) if st != Closed && auth_reject => {
                                ProtocolError::AuthFailed {
                                    reason: r.reason.clone(),
                                }
                            }
                            (Message::Reject(r), st) if st != Closed && version_reject => {
                                ProtocolError::VersionMismatch {
                                    detail: format!(
                                        "this sender speaks protocol version 8; the receiver says: {}",
                                        r.reason
                                    ),
                                }
                            }
                            // A token, and a receiver that does not ask for it.
                            (Message::Challenge(_), AwaitChallenge) => {
                                ProtocolError::NoAuthRequested
                            }
                            (Message::AuthOk { .. }, AwaitAuthOk) => {
                                ProtocolError::ReceiverProofFailed
                            }
                            (Message::Ack(a), AwaitAuthOk) if a.status == AckStatus::Protocol => {
                                let Err(ProtocolError::VersionMismatch { detail }) = &res else {
                                    panic!("{ctx}: {res:?}")
                                };
                                assert!(detail.contains("older version"), "{detail}");
                                ProtocolError::VersionMismatch {
                                    detail: detail.clone(),
                                }
                            }
                            (Message::Reject(r), AwaitChallenge | AwaitAuthOk) => {
                                ProtocolError::Refused {
                                    code: r.code,
                                    reason: r.reason.clone(),
                                }
                            }
                            (Message::Reject(r), st) if st != Closed => {
                                ProtocolError::PeerRejected {
                                    code: r.code,
                                    reason: r.reason.clone(),
                                }
                            }
                            _ => ProtocolError::Unexpected {
                                msg: msg.kind(),
                                state: sit.state().as_str(),
                            },
                        };
                        assert_eq!(res, Err(want), "{ctx}");
                        assert_eq!(
                            s.state(),
                            SenderState::Closed,
                            "{ctx}: errors end the session"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn greeting_answers_the_challenge() {
        // Token and auth required: PROVE, then nothing until AUTH_OK.
        let mut s = SenderSession::new(10, Some(auth()));
        assert_eq!(s.state(), SenderState::AwaitChallenge);
        assert_eq!(
            s.on_message(challenge(AUTH_REQUIRED)),
            Ok(SenderEvent::Greeted(Greeting { proving: true }))
        );
        assert_eq!(s.poll_transmit(), Some(expected_prove()));
        assert_eq!(s.poll_transmit(), None);
        assert_eq!(s.state(), SenderState::AwaitAuthOk);
        // No HELLO (no name, no size) before the receiver has proven itself.
        assert!(s.start_file(offer(1), 0).is_err());
        assert_eq!(s.state(), SenderState::AwaitAuthOk);
        let Ok(SenderEvent::Authenticated(mut mine)) = s.on_message(good_auth_ok()) else {
            panic!("not authenticated");
        };
        assert_eq!(s.state(), SenderState::Idle);
        // The channel talks to the receiver's.
        let mut theirs = receiver_key().channel(Role::Receiver);
        assert_eq!(
            theirs.open(&mine.seal(b"HELLO").unwrap()).unwrap(),
            b"HELLO"
        );
        assert_eq!(mine.open(&theirs.seal(b"MR").unwrap()).unwrap(), b"MR");
        assert!(matches!(
            queued(s.start_file(offer(1), 0), &mut s),
            Ok(Message::Hello(_))
        ));
        // A second CHALLENGE is a protocol error.
        assert_eq!(
            s.on_message(challenge(AUTH_REQUIRED)),
            Err(ProtocolError::Unexpected {
                msg: "CHALLENGE",
                state: "AWAIT_RING"
            })
        );

        // No token, auth required: an empty PROVE (the receiver says why).
        let mut s = SenderSession::new(10, None);
        assert_eq!(
            s.on_message(challenge(AUTH_REQUIRED)),
            Ok(SenderEvent::Greeted(Greeting { proving: true }))
        );
        let Some(Message::Prove(p)) = s.poll_transmit() else {
            panic!("no PROVE");
        };
        assert!(p.proof.is_empty());
        assert_eq!(p.version, PROTOCOL_VERSION);
        // An AUTH_OK cannot prove anything to a sender without a token.
        assert_eq!(
            s.on_message(good_auth_ok()),
            Err(ProtocolError::ReceiverProofFailed)
        );

        // No token on either side: straight to Idle, nothing to send first.
        let mut s = SenderSession::new(10, None);
        assert_eq!(
            s.on_message(challenge(0)),
            Ok(SenderEvent::Greeted(Greeting { proving: false }))
        );
        assert_eq!(s.poll_transmit(), None);
        assert_eq!(s.state(), SenderState::Idle);
    }

    #[test]
    fn a_sender_with_a_token_refuses_a_receiver_that_does_not_ask() {
        // The downgrade: nothing to send (no PROVE, no HELLO), session over.
        let mut s = SenderSession::new(10, Some(auth()));
        let err = s.on_message(challenge(0)).unwrap_err();
        assert_eq!(err, ProtocolError::NoAuthRequested);
        assert!(
            err.to_string().contains("refusing to send anything"),
            "{err}"
        );
        assert_eq!(s.state(), SenderState::Closed);
        assert!(s.start_file(offer(1), 0).is_err());
        assert!(s.close().is_err());
    }

    #[test]
    fn the_receivers_proof_is_bound_to_this_connection() {
        // A proof for the same nonces on another connection (a relay), for
        // another nonce, under another token: each refused, nothing sent.
        let others = [
            ConnectionId {
                receiver_qpn: 1,
                ..conn()
            },
            ConnectionId {
                sender_qpn: 1,
                ..conn()
            },
            ConnectionId {
                receiver_addr: "10.0.0.9".parse().unwrap(),
                ..conn()
            },
        ];
        let mut proofs: Vec<[u8; 32]> = others
            .iter()
            .map(|c| SessionKey::derive(&token(), &NONCE, &S_NONCE, c).receiver_proof())
            .collect();
        proofs.push(
            SessionKey::derive(&token(), &[0; NONCE_LEN], &S_NONCE, &conn()).receiver_proof(),
        );
        proofs.push(
            SessionKey::derive(
                &Token::new(b"other".to_vec()).unwrap(),
                &NONCE,
                &S_NONCE,
                &conn(),
            )
            .receiver_proof(),
        );
        for proof in proofs {
            let mut s = session_in(Situation::AwaitAuthOk);
            assert_eq!(
                s.on_message(Message::AuthOk { proof }),
                Err(ProtocolError::ReceiverProofFailed)
            );
            assert_eq!(s.state(), SenderState::Closed);
            assert!(s.start_file(offer(1), 0).is_err());
        }
        // The PROVE answers this nonce only.
        let mut s = SenderSession::new(10, Some(auth()));
        let greeted = s.on_message(Message::Challenge(Challenge {
            flags: AUTH_REQUIRED,
            nonce: [1; NONCE_LEN],
        }));
        assert_eq!(
            greeted,
            Ok(SenderEvent::Greeted(Greeting { proving: true }))
        );
        let Some(Message::Prove(p)) = s.poll_transmit() else {
            panic!("no PROVE");
        };
        assert!(!receiver_key().verify_sender(&p.proof));
        assert!(
            SessionKey::derive(&token(), &[1; NONCE_LEN], &S_NONCE, &conn())
                .verify_sender(&p.proof)
        );
    }

    #[test]
    fn older_receivers_are_refused_naming_both_versions() {
        // A protocol-2 receiver cannot decode PROVE: ACK(protocol).
        let mut s = session_in(Situation::AwaitAuthOk);
        let err = s.on_message(ack(AckStatus::Protocol)).unwrap_err();
        assert!(
            err.to_string().contains("protocol version 8")
                && err.to_string().contains("2 or earlier"),
            "{err}"
        );
        // Without a token: it refuses our version-3 HELLO with REJECT(version).
        let mut s = greeted(10);
        queued(s.start_file(offer(1), 0), &mut s).unwrap();
        let err = s
            .on_message(Message::Reject(Reject::new(
                RejectCode::Version,
                "protocol version 8 is not supported (receiver speaks 1 to 2)",
            )))
            .unwrap_err();
        assert!(matches!(err, ProtocolError::VersionMismatch { .. }));
        assert!(
            err.to_string()
                .contains("this sender speaks protocol version 8")
                && err.to_string().contains("1 to 2"),
            "{err}"
        );
        assert_eq!(s.state(), SenderState::Closed);
    }

    #[test]
    fn a_version_refusal_of_an_offer_names_the_capability_it_asked_for() {
        let refusal = || {
            Message::Reject(Reject::new(
                RejectCode::Version,
                "HELLO flags 0x40 are not supported",
            ))
        };
        let refused = |offer: FileOffer| {
            let mut s = greeted(10);
            queued(s.start_file(offer, 0), &mut s).unwrap();
            let err = s.on_message(refusal()).unwrap_err();
            assert_eq!(s.state(), SenderState::Closed);
            err
        };
        let both = FileOffer {
            checksum: true,
            resume: true,
            mtime: Some(Mtime { secs: 1, nanos: 0 }),
            ..offer(1)
        };
        // CHECKSUM, the newer flag, is named first.
        let err = refused(both.clone());
        assert!(
            matches!(&err, ProtocolError::OlderReceiver { lacks: Capability::Checksum, detail }
                if detail.contains("this sender speaks protocol version 8")
                    && detail.contains("0x40")),
            "{err:?}"
        );
        let resume = FileOffer {
            checksum: false,
            ..both.clone()
        };
        assert!(matches!(
            refused(resume),
            ProtocolError::OlderReceiver {
                lacks: Capability::Resume,
                ..
            }
        ));
        // Neither flag: another version altogether.
        assert!(matches!(
            refused(offer(1)),
            ProtocolError::VersionMismatch { .. }
        ));
        // A batch: its members' flags.
        let mut s2 = greeted(10);
        let members = vec![
            offer(1),
            FileOffer {
                name: "g".into(),
                checksum: true,
                ..offer(2)
            },
        ];
        queued(s2.start_batch(members, 0), &mut s2).unwrap();
        assert!(matches!(
            s2.on_message(refusal()),
            Err(ProtocolError::OlderReceiver {
                lacks: Capability::Checksum,
                ..
            })
        ));
        // No offer in flight (a directory's answer): not the offer's flags.
        let mut s = greeted(10);
        queued(s.start_file(both, 0), &mut s).unwrap();
        s.on_message(Message::Reject(Reject::new(RejectCode::Exists, "f")))
            .unwrap();
        queued(s.start_file(dir_offer("d"), 1), &mut s).unwrap();
        assert!(matches!(
            s.on_message(refusal()),
            Err(ProtocolError::VersionMismatch { .. })
        ));
    }

    #[test]
    fn the_payload_rides_from_the_offer_or_the_fin_to_the_verdict() {
        let mut s: SenderSession<&str> = SenderSession::carrying(10, None);
        s.on_message(challenge(0)).unwrap();
        queued(s.start_file(dir_offer("d"), "dir"), &mut s).unwrap();
        queued(s.start_file(offer(10), "offered"), &mut s).unwrap();
        let Ok(SenderEvent::Answered { payload: "dir", .. }) = s.on_message(ack(AckStatus::Ok))
        else {
            panic!("the directory's verdict carries its payload");
        };
        s.on_message(Message::Mr(ring(64, 4))).unwrap();
        let plan = s.next_chunk(10).unwrap().unwrap();
        assert_eq!(plan.len, 10);
        // A FIN that carries what the engine knows now.
        queued(s.finish_carrying(Digest::Crc32(0), "finished"), &mut s).unwrap();
        queued(s.start_file(offer(3), "next"), &mut s).unwrap();
        // The session ends before the verdict: what is unanswered comes back.
        assert_eq!(s.take_unanswered(), vec!["finished"]);
        assert_eq!(s.pending(), 0);
    }

    /// An offer without a payload (`offer_file`, `offer_batch`) carries
    /// nothing until its FIN gives it: `finish` alone is refused, and a
    /// directory (answered before any FIN) cannot be offered so.
    #[test]
    fn an_offer_without_a_payload_gets_it_with_its_fin() {
        let mut s: SenderSession<&str> = SenderSession::carrying(10, None);
        s.on_message(challenge(0)).unwrap();
        assert!(matches!(
            s.offer_file(dir_offer("d")),
            Err(ProtocolError::OfferKind {
                op: "offer_file",
                ..
            })
        ));
        assert_eq!(s.poll_transmit(), None, "nothing offered");
        assert_eq!(s.state(), SenderState::Idle);
        queued(s.offer_file(offer(10)), &mut s).unwrap();
        s.on_message(Message::Mr(ring(64, 4))).unwrap();
        s.next_chunk(10).unwrap().unwrap();
        assert!(matches!(
            s.finish(Digest::Crc32(0)),
            Err(ProtocolError::OfferKind { op: "finish", .. })
        ));
        assert_eq!(s.state(), SenderState::Sending);
        queued(s.finish_carrying(Digest::Crc32(0), "file"), &mut s).unwrap();
        let Ok(SenderEvent::Answered {
            payload: "file", ..
        }) = s.on_message(ack(AckStatus::Ok))
        else {
            panic!("the file's verdict carries its FIN's payload");
        };
        // A batch the same way.
        queued(s.offer_batch(vec![offer(4), offer(6)]), &mut s).unwrap();
        s.on_message(Message::Mr(ring(64, 4))).unwrap();
        s.next_chunk(10).unwrap().unwrap();
        assert!(s.clone().finish(Digest::Crc32(0)).is_err());
        queued(s.finish_carrying(Digest::Crc32(0), "batch"), &mut s).unwrap();
        assert_eq!(s.take_unanswered(), vec!["batch"]);
    }

    #[test]
    fn without_a_timeout_there_are_no_timers() {
        let mut s = session_in(Situation::SendingStream);
        let now = Instant::now();
        s.waiting(Waiting::Input, now);
        assert_eq!(s.poll_timeout(), None);
        s.handle_timeout(now + Duration::from_secs(3600)).unwrap();
        assert_eq!(s.poll_transmit(), None);
        s.waiting(Waiting::Peer, now);
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn a_silent_receiver_ends_the_session_saying_what_was_awaited() {
        let t0 = Instant::now();
        let secs = |n| t0 + Duration::from_secs(n);
        let timeout = Duration::from_secs(30);
        let mut s = session_in(Situation::AwaitRing).with_timeout(timeout);
        s.waiting(Waiting::Peer, t0);
        assert_eq!(s.poll_timeout(), Some(secs(30)));
        // Waiting again changes nothing; hearing from the link restarts it.
        s.waiting(Waiting::Peer, secs(10));
        assert_eq!(s.poll_timeout(), Some(secs(30)));
        s.heard(secs(20));
        assert_eq!(s.poll_timeout(), Some(secs(50)));
        s.handle_timeout(secs(49)).unwrap();
        assert_eq!(s.state(), SenderState::AwaitRing);
        let err = s.handle_timeout(secs(50)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "no progress for 30s while waiting for the receiver's MR reply"
        );
        assert_eq!(s.state(), SenderState::Closed);
        assert_eq!(s.poll_timeout(), None);
        // Each state says what it waits for.
        let said = |sit| session_in(sit).waited_for();
        assert_eq!(said(Situation::AwaitChallenge), "the receiver's greeting");
        assert_eq!(
            said(Situation::AwaitAuthOk),
            "the receiver's proof (AUTH_OK)"
        );
        assert_eq!(said(Situation::Sending), "credit from the receiver");
        assert_eq!(said(Situation::IdleFilePending), "the receiver's ACK");
        assert_eq!(said(Situation::Closed), "delivery of BYE");
        let mut full = greeted(10);
        for tag in 0..MAX_PENDING as u64 {
            queued(full.start_file(dir_offer("d"), tag), &mut full).unwrap();
        }
        assert_eq!(full.waited_for(), "the receiver's verdicts");
    }

    #[test]
    fn a_keepalive_goes_while_the_sender_waits_on_its_own_input() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        // keepalive_interval(3 s) is 500 ms.
        let mut s = session_in(Situation::SendingStream).with_timeout(Duration::from_secs(3));
        s.waiting(Waiting::Input, t0);
        // No receive timeout meanwhile: only the keepalive.
        assert_eq!(s.poll_timeout(), Some(ms(500)));
        s.handle_timeout(ms(499)).unwrap();
        assert_eq!(s.poll_transmit(), None);
        s.handle_timeout(ms(500)).unwrap();
        assert_eq!(s.poll_transmit(), Some(Message::Keepalive));
        assert_eq!(s.poll_timeout(), Some(ms(1000)));
        // A chunk went out: the next wait starts the interval again.
        s.next_chunk(10).unwrap().unwrap();
        s.waiting(Waiting::Input, ms(700));
        assert_eq!(s.poll_timeout(), Some(ms(1200)));
        // Waiting on the receiver instead: its timeout, no keepalive.
        s.waiting(Waiting::Peer, ms(800));
        assert_eq!(s.poll_timeout(), Some(ms(3800)));
        // A file's data is never kept alive: its reader has its own limit.
        let mut f = session_in(Situation::Sending).with_timeout(Duration::from_secs(3));
        f.waiting(Waiting::Input, t0);
        f.handle_timeout(ms(500)).unwrap();
        assert_eq!(f.poll_transmit(), None);
        assert_eq!(f.poll_timeout(), None);
    }

    #[test]
    fn nothing_before_the_greeting() {
        let mut s = SenderSession::new(10, None);
        assert_eq!(
            s.start_file(offer(1), 0),
            Err(ProtocolError::WrongState {
                op: "start_file",
                state: "AWAIT_CHALLENGE"
            })
        );
        assert_eq!(
            s.close(),
            Err(ProtocolError::WrongState {
                op: "close",
                state: "AWAIT_CHALLENGE"
            })
        );
        assert_eq!(s.state(), SenderState::AwaitChallenge);
        // Greeted with REJECT (busy): the session is refused and over.
        let busy = Reject::new(RejectCode::Busy, "at --max-sessions 4");
        assert_eq!(
            s.on_message(Message::Reject(busy)),
            Err(ProtocolError::Refused {
                code: RejectCode::Busy,
                reason: "at --max-sessions 4".into()
            })
        );
        assert_eq!(s.state(), SenderState::Closed);
    }

    #[test]
    fn auth_rejection_ends_the_session() {
        // No token, auth required: empty PROVE, then the receiver's
        // REJECT(Auth).
        let mut s = SenderSession::new(10, None);
        s.on_message(challenge(AUTH_REQUIRED)).unwrap();
        let reason = "authentication failed: the sender has no token";
        let err = s
            .on_message(Message::Reject(Reject::new(RejectCode::Auth, reason)))
            .unwrap_err();
        assert_eq!(
            err,
            ProtocolError::AuthFailed {
                reason: reason.into()
            }
        );
        assert_eq!(
            err.to_string(),
            "authentication failed (the receiver says: authentication failed: the sender has no token)"
        );
        assert_eq!(s.state(), SenderState::Closed);
        // Not a per-file refusal: nothing more may be sent.
        assert!(s.start_file(offer(1), 0).is_err());
        assert!(s.close().is_err());
        // Also later in the session.
        let mut s = greeted(10);
        queued(s.start_file(dir_offer("d"), 0), &mut s).unwrap();
        assert!(matches!(
            s.on_message(Message::Reject(Reject::new(RejectCode::Auth, reason))),
            Err(ProtocolError::AuthFailed { .. })
        ));
    }

    #[test]
    fn local_calls_in_wrong_situations() {
        use Situation::*;
        for sit in SITUATIONS {
            let mut s = session_in(sit);
            let st = sit.state().as_str();
            let wrong = |op| ProtocolError::WrongState { op, state: st };
            if sit.state() == SenderState::Idle {
                assert!(s.can_start(), "{sit:?}");
                // Pending entries block BYE but not the next offer.
                if sit != Idle {
                    assert_eq!(
                        s.clone().close(),
                        Err(ProtocolError::Unanswered { pending: 1 })
                    );
                    assert!(s.clone().start_file(offer(1), 0).is_ok());
                }
            } else {
                assert!(!s.can_start(), "{sit:?}");
                assert_eq!(
                    s.start_file(offer(1), 0),
                    Err(wrong("start_file")),
                    "{sit:?}"
                );
                assert_eq!(s.close(), Err(wrong("close")), "{sit:?}");
            }
            if sit.state() != SenderState::Sending {
                assert_eq!(next_file(&mut s), None);
                assert_eq!(s.finish(Digest::Crc32(0)), Err(wrong("finish")));
                assert_eq!(s.keepalive(), Err(wrong("keepalive")));
            }
            if sit == Sending {
                // A file's chunk must be exactly its next chunk.
                assert!(
                    matches!(s.next_chunk(1), Err(ProtocolError::BadChunk { .. })),
                    "{sit:?}"
                );
            } else if sit != SendingStream {
                assert_eq!(s.next_chunk(1), Err(wrong("next_chunk")), "{sit:?}");
            } else {
                // A stream plans only what the engine read.
                assert_eq!(next_file(&mut s), None);
                assert!(!s.all_chunks_planned());
            }
            // Only a stream waits for its input.
            if sit == SendingStream {
                assert_eq!(queued(s.keepalive(), &mut s), Ok(Message::Keepalive));
            } else {
                assert_eq!(s.keepalive(), Err(wrong("keepalive")), "{sit:?}");
            }
            // Local misuse does not change the state.
            assert_eq!(s.state(), sit.state());
            assert_eq!(s.pending.front().map(|&(_, e)| e), sit.front());
        }
    }

    #[test]
    fn hello_contents_and_versions() {
        let hello = |o: FileOffer| {
            let mut s = greeted(10);
            match queued(s.start_file(o, 0), &mut s).unwrap() {
                Message::Hello(h) => h,
                other => panic!("{other:?}"),
            }
        };
        // Every HELLO carries this protocol version.
        assert_eq!(
            hello(offer(5)),
            Hello {
                version: PROTOCOL_VERSION,
                caps: 0,
                name: "f.bin".into(),
                size: 5,
                mode: 0o600,
                digest: DigestAlg::Crc32,
                mtime: None,
                piece: None,
            }
        );
        // A path, a stream, a directory, an mtime.
        let t = Mtime {
            secs: 1_600_000_000,
            nanos: 7,
        };
        let path = hello(FileOffer {
            name: "a/b".into(),
            ..offer(5)
        });
        assert_eq!((path.version, path.caps), (PROTOCOL_VERSION, 0));
        let stream = hello(FileOffer {
            size: 99,
            ..stream_offer()
        });
        assert_eq!(
            (stream.version, stream.caps, stream.size),
            (PROTOCOL_VERSION, hello_flags::STREAM, 0),
            "a stream announces no size"
        );
        let dir = hello(FileOffer {
            size: 99,
            mtime: Some(t),
            ..dir_offer("top/sub")
        });
        assert_eq!(
            (dir.version, dir.caps, dir.size, dir.mode, dir.mtime),
            (
                PROTOCOL_VERSION,
                hello_flags::DIRECTORY | hello_flags::MTIME,
                0,
                0o755,
                Some(t)
            )
        );
        let timed = hello(FileOffer {
            mtime: Some(t),
            ..offer(5)
        });
        assert_eq!(
            (timed.version, timed.caps, timed.size),
            (PROTOCOL_VERSION, hello_flags::MTIME, 5)
        );
        // -p: modes kept as they are (the receiver still drops setuid).
        let kept = hello(FileOffer {
            keep_mode: true,
            mode: 0o4777,
            ..offer(5)
        });
        assert_eq!(
            (kept.version, kept.caps, kept.mode),
            (PROTOCOL_VERSION, hello_flags::KEEP_MODE, 0o4777)
        );
        assert_eq!(kept.received_mode(0o022, true), 0o777, "never setuid");
        // Every HELLO encodes (the mtime flag matches the field).
        for h in [path, stream, dir, timed, kept] {
            assert!(crate::proto::encode_to_vec(&Message::Hello(h)).is_ok());
        }
        // Hostile names are the receiver's to refuse, so they go out as is.
        let mut s = greeted(10);
        let mut o = offer(5);
        o.name = "../etc".into();
        assert!(
            matches!(queued(s.start_file(o, 0), &mut s), Ok(Message::Hello(h)) if h.name == "../etc")
        );
        assert_eq!(s.state(), SenderState::AwaitRing);
    }

    #[test]
    fn bad_rings_are_protocol_errors() {
        for (r, reason) in [
            (ring(0, 4), "slot size is 0"),
            (ring(100, 0), "slot count is 0"),
            (
                RingInfo {
                    addr: u64::MAX - 399,
                    ..ring(100, 4)
                },
                "address + length overflows 64 bits",
            ),
        ] {
            let mut s = session_in(Situation::AwaitRing);
            assert_eq!(
                s.on_message(Message::Mr(r)),
                Err(ProtocolError::BadRing { reason })
            );
            assert_eq!(s.state(), SenderState::Closed);
        }
        // Exactly reaching the top of the address space is fine.
        let mut s = session_in(Situation::AwaitRing);
        let top = RingInfo {
            addr: u64::MAX - 400,
            ..ring(100, 4)
        };
        assert!(s.on_message(Message::Mr(top)).is_ok());
    }

    /// Plans every chunk, returning credit whenever it runs out.
    fn plan_all(s: &mut SenderSession) -> Vec<ChunkPlan> {
        let mut out = Vec::new();
        while !s.all_chunks_planned() {
            match next_file(s) {
                Some(p) => out.push(p),
                None => {
                    assert_eq!(s.credits(), 0);
                    s.on_message(Message::Credit {
                        count: s.ring().slot_count,
                    })
                    .unwrap();
                }
            }
        }
        assert_eq!(next_file(s), None);
        out
    }

    #[test]
    fn placement_math_and_wraparound() {
        let mut s = greeted(100);
        queued(s.start_file(offer(1050), 0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        assert_eq!(s.chunk_len(), 100);
        let plans = plan_all(&mut s);
        assert_eq!(plans.len(), 11);
        for (i, p) in plans.iter().enumerate() {
            let i64_ = i as u64;
            assert_eq!(p.seq, i64_);
            assert_eq!(p.slot, (i % 4) as u32);
            assert_eq!(p.remote_addr, ADDR + u64::from(p.slot) * 100);
            assert_eq!(p.rkey, 77);
            assert_eq!(p.file_offset, i64_ * 100);
            assert_eq!(p.len, if i == 10 { 50 } else { 100 });
        }
        let fin = queued(s.finish(Digest::Crc32(9)), &mut s).unwrap();
        assert_eq!(
            fin,
            Message::Fin(Fin {
                bytes: 1050,
                chunks: 11,
                digest: Digest::Crc32(9)
            })
        );
        assert_eq!(s.state(), SenderState::Idle);
        assert_eq!(s.pending(), 1);
    }

    #[test]
    fn chunk_len_is_min_of_own_and_slot() {
        for (own, slot, want) in [(64, 100, 64), (100, 64, 64), (0, 64, 64), (64, 64, 64)] {
            let mut s = greeted(own);
            queued(s.start_file(offer(1000), 0), &mut s).unwrap();
            s.on_message(Message::Mr(ring(slot, 2))).unwrap();
            assert_eq!(s.chunk_len(), want);
            let p = next_file(&mut s).unwrap();
            assert_eq!(p.len, want);
            // Slots are spaced by the ring's slot size, not the chunk length.
            assert_eq!(
                next_file(&mut s).unwrap().remote_addr,
                ADDR + u64::from(slot)
            );
        }
    }

    #[test]
    fn sizes_around_the_chunk_length() {
        for (size, lens) in [
            (0u64, vec![]),
            (1, vec![1]),
            (99, vec![99]),
            (100, vec![100]),
            (101, vec![100, 1]),
            (199, vec![100, 99]),
            (200, vec![100, 100]),
        ] {
            let mut s = greeted(100);
            queued(s.start_file(offer(size), 0), &mut s).unwrap();
            s.on_message(Message::Mr(ring(100, 3))).unwrap();
            let got: Vec<u32> = plan_all(&mut s).iter().map(|p| p.len).collect();
            assert_eq!(got, lens, "size {size}");
            assert!(matches!(
                queued(s.finish(Digest::Crc32(0)), &mut s),
                Ok(Message::Fin(Fin { bytes, chunks, .. })) if bytes == size && chunks == lens.len() as u64
            ));
        }
    }

    #[test]
    fn credit_accounting() {
        let mut s = greeted(10);
        queued(s.start_file(offer(1000), 0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(10, 3))).unwrap();
        assert_eq!(s.credits(), 3);
        // Full credit already: any more overflows.
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 1 }),
            Err(ProtocolError::CreditOverflow {
                added: 1,
                credits: 3,
                slot_count: 3
            })
        );
        for _ in 0..3 {
            assert!(next_file(&mut s).is_some());
        }
        assert_eq!(s.credits(), 0);
        assert_eq!(next_file(&mut s), None, "no chunk without credit");
        assert_eq!(
            s.on_message(Message::Credit { count: 2 }),
            Ok(SenderEvent::Credit(2))
        );
        assert_eq!(s.credits(), 2);
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 2 }),
            Err(ProtocolError::CreditOverflow {
                added: 2,
                credits: 2,
                slot_count: 3
            })
        );
        assert_eq!(
            s.clone().on_message(Message::Credit { count: u32::MAX }),
            Err(ProtocolError::CreditOverflow {
                added: u32::MAX,
                credits: 2,
                slot_count: 3
            })
        );
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 0 }),
            Err(ProtocolError::ZeroCredit)
        );
        assert_eq!(
            s.on_message(Message::Credit { count: 1 }),
            Ok(SenderEvent::Credit(1))
        );
        assert_eq!(s.credits(), 3);
        assert_eq!(s.chunks_planned(), 3);
        assert_eq!(s.bytes_planned(), 30);
    }

    #[test]
    fn late_credits_until_the_ack() {
        // 3 of 4 credits held after FIN: one late credit fits, two do not.
        let mut s = file_pending();
        assert_eq!(s.credits(), 3);
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 2 }),
            Err(ProtocolError::CreditOverflow {
                added: 2,
                credits: 3,
                slot_count: 4
            })
        );
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 0 }),
            Err(ProtocolError::ZeroCredit)
        );
        assert_eq!(
            s.on_message(Message::Credit { count: 1 }),
            Ok(SenderEvent::Credit(1))
        );
        // Also after the next HELLO went out.
        queued(s.start_file(offer(10), 0), &mut s).unwrap();
        assert!(s.clone().on_message(Message::Credit { count: 1 }).is_err());
        assert!(matches!(
            s.on_message(ack(AckStatus::Ok)),
            Ok(SenderEvent::Answered {
                payload: 0,
                entry: Pending::File,
                ..
            })
        ));
        // The file is answered: a credit now belongs to nothing.
        assert_eq!(
            s.clone().on_message(Message::Credit { count: 1 }),
            Err(ProtocolError::Unexpected {
                msg: "CREDIT",
                state: "AWAIT_RING"
            })
        );
        // The next MR starts with every slot free.
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        assert_eq!(s.credits(), 4);
    }

    #[test]
    fn finish_requires_everything_planned_and_matching_digest() {
        let mut s = greeted(10);
        queued(s.start_file(offer(25), 0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(10, 8))).unwrap();
        next_file(&mut s).unwrap();
        assert_eq!(
            s.finish(Digest::Crc32(0)),
            Err(ProtocolError::Incomplete {
                planned: 10,
                size: 25
            })
        );
        assert!(!s.all_chunks_planned());
        next_file(&mut s).unwrap();
        next_file(&mut s).unwrap();
        assert!(s.all_chunks_planned());
        assert_eq!(
            s.finish(Digest::Sha256([0; 32])),
            Err(ProtocolError::DigestAlgMismatch {
                expected: DigestAlg::Crc32,
                got: DigestAlg::Sha256
            })
        );
        assert_eq!(s.state(), SenderState::Sending);
        assert!(s.finish(Digest::Crc32(0)).is_ok());
        // Late credits after FIN are fine.
        assert!(s.on_message(Message::Credit { count: 3 }).is_ok());
    }

    #[test]
    fn zero_byte_file() {
        let mut s = greeted(10);
        queued(s.start_file(offer(0), 0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(10, 2))).unwrap();
        assert_eq!(s.state(), SenderState::Sending);
        assert!(s.all_chunks_planned());
        assert_eq!(next_file(&mut s), None);
        assert_eq!(
            queued(s.finish(Digest::Crc32(0)), &mut s).unwrap(),
            Message::Fin(Fin {
                bytes: 0,
                chunks: 0,
                digest: Digest::Crc32(0)
            })
        );
    }

    fn streaming(chunk: u32, slots: u32) -> SenderSession {
        let mut s = greeted(chunk);
        queued(s.start_file(stream_offer(), 0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(chunk, slots))).unwrap();
        s
    }

    #[test]
    fn streams_plan_what_was_read_and_fin_carries_the_size() {
        let mut s = streaming(100, 2);
        let p = s.next_chunk(100).unwrap().unwrap();
        assert_eq!((p.seq, p.slot, p.file_offset, p.len), (0, 0, 0, 100));
        let p = s.next_chunk(100).unwrap().unwrap();
        assert_eq!((p.seq, p.slot, p.file_offset), (1, 1, 100));
        // Out of credit: nothing planned, nothing changed.
        assert_eq!(s.next_chunk(100), Ok(None));
        assert_eq!(s.bytes_planned(), 200);
        s.on_message(Message::Credit { count: 2 }).unwrap();
        let p = s.next_chunk(100).unwrap().unwrap();
        assert_eq!((p.seq, p.slot, p.file_offset), (2, 0, 200));
        // The last chunk may be short; nothing may follow it.
        let p = s.next_chunk(7).unwrap().unwrap();
        assert_eq!((p.seq, p.file_offset, p.len), (3, 300, 7));
        assert_eq!(
            s.next_chunk(100),
            Err(ProtocolError::BadChunk {
                seq: 4,
                len: 100,
                reason: "a stream's chunk after its short (last) chunk"
            })
        );
        assert!(
            !s.all_chunks_planned(),
            "a stream's end is the engine's to say"
        );
        assert_eq!(
            queued(s.finish(Digest::Crc32(5)), &mut s).unwrap(),
            Message::Fin(Fin {
                bytes: 307,
                chunks: 4,
                digest: Digest::Crc32(5)
            })
        );
        assert_eq!(s.pending(), 1);
    }

    #[test]
    fn stream_chunk_lengths_and_empty_streams() {
        let mut s = streaming(100, 4);
        for (len, reason) in [(0, "empty chunk"), (101, "longer than the chunk length")] {
            assert_eq!(
                s.next_chunk(len),
                Err(ProtocolError::BadChunk {
                    seq: 0,
                    len,
                    reason
                })
            );
        }
        assert_eq!(
            s.state(),
            SenderState::Sending,
            "local misuse changes nothing"
        );
        // A stream of exactly one chunk, and one ending on a chunk boundary.
        assert!(s.next_chunk(100).unwrap().is_some());
        assert!(s.next_chunk(100).unwrap().is_some());
        assert!(matches!(
            queued(s.finish(Digest::Crc32(0)), &mut s),
            Ok(Message::Fin(Fin {
                bytes: 200,
                chunks: 2,
                ..
            }))
        ));
        // Zero bytes: FIN(0, 0) straight after the MR.
        let mut s = streaming(100, 4);
        assert_eq!(
            queued(s.finish(Digest::Crc32(0)), &mut s).unwrap(),
            Message::Fin(Fin {
                bytes: 0,
                chunks: 0,
                digest: Digest::Crc32(0)
            })
        );
        // The digest algorithm still has to match the offer.
        let mut s = streaming(100, 4);
        assert_eq!(
            s.finish(Digest::Sha256([0; 32])),
            Err(ProtocolError::DigestAlgMismatch {
                expected: DigestAlg::Crc32,
                got: DigestAlg::Sha256
            })
        );
        // The same next_chunk serves a file: only its exact next chunk
        // fits (a full one, then the rest; nothing past its end).
        let mut s = session_in(Situation::Sending);
        let bad = |r: Result<Option<ChunkPlan>, ProtocolError>| {
            matches!(r, Err(ProtocolError::BadChunk { .. }))
        };
        assert!(bad(s.next_chunk(99)));
        assert!(bad(s.next_chunk(101)));
        let planned = s.bytes_planned();
        let first = s.next_chunk(100).unwrap().unwrap();
        assert_eq!((first.file_offset, first.len), (planned, 100));
        while s.size - s.planned > 100 {
            s.next_chunk(100).unwrap().unwrap();
            if s.credits() == 0 {
                s.on_message(Message::Credit { count: 1 }).unwrap();
            }
        }
        let rest = (s.size - s.planned) as u32;
        if rest > 0 {
            if s.credits() == 0 {
                s.on_message(Message::Credit { count: 1 }).unwrap();
            }
            assert!(rest == 100 || bad(s.next_chunk(100)));
            s.next_chunk(rest).unwrap().unwrap();
        }
        assert!(s.all_chunks_planned());
        assert!(bad(s.next_chunk(1)));
    }

    #[test]
    fn verdicts_name_their_entries_by_tag() {
        let mut s = greeted(100);
        let mut dir = offer(0);
        dir.kind = OfferKind::Directory;
        queued(s.start_file(dir, 7), &mut s).unwrap();
        queued(s.start_file(offer(10), 8), &mut s).unwrap();
        // No ring before the earlier entry's verdict.
        s.on_message(Message::Mr(RingInfo {
            addr: ADDR,
            rkey: 1,
            slot_size: 100,
            slot_count: 2,
        }))
        .unwrap_err();
        let ok = || Message::Ack(Ack::new(AckStatus::Ok, String::new()));
        let mut s = greeted(100);
        let mut dir = offer(0);
        dir.kind = OfferKind::Directory;
        queued(s.start_file(dir, 7), &mut s).unwrap();
        queued(s.start_file(offer(10), 8), &mut s).unwrap();
        // The directory's verdict comes first, then the ring.
        assert_eq!(
            s.on_message(ok()),
            Ok(SenderEvent::Answered {
                payload: 7,
                entry: Pending::Directory,
                verdict: Verdict::Ack(Ack::new(AckStatus::Ok, String::new()))
            })
        );
        s.on_message(Message::Mr(RingInfo {
            addr: ADDR,
            rkey: 1,
            slot_size: 100,
            slot_count: 2,
        }))
        .unwrap();
        s.next_chunk(10).unwrap().unwrap();
        queued(s.finish(Digest::Crc32(0)), &mut s).unwrap();
        assert!(matches!(
            s.on_message(ok()),
            Ok(SenderEvent::Answered {
                payload: 8,
                entry: Pending::File,
                ..
            })
        ));
    }

    #[test]
    fn pipelined_entries_are_answered_in_order() {
        let mut s = greeted(10);
        // A directory, a file and another directory before any answer.
        queued(s.start_file(dir_offer("top"), 0), &mut s).unwrap();
        assert_eq!(s.state(), SenderState::Idle);
        queued(s.start_file(offer(5), 0), &mut s).unwrap();
        // The ring cannot come before the directory's verdict.
        assert_eq!(
            s.clone().on_message(Message::Mr(ring(10, 2))),
            Err(ProtocolError::Unexpected {
                msg: "MR",
                state: "AWAIT_RING"
            })
        );
        assert_eq!(
            s.on_message(ack(AckStatus::Ok)),
            Ok(SenderEvent::Answered {
                payload: 0,
                entry: Pending::Directory,
                verdict: Verdict::Ack(Ack::new(AckStatus::Ok, "r"))
            })
        );
        s.on_message(Message::Mr(ring(10, 2))).unwrap();
        next_file(&mut s).unwrap();
        queued(s.finish(Digest::Crc32(0)), &mut s).unwrap();
        queued(s.start_file(dir_offer("top/sub"), 0), &mut s).unwrap();
        queued(s.start_file(stream_offer(), 0), &mut s).unwrap();
        assert_eq!(s.pending(), 2);
        // A failed verify of the file, then the directory refused: both
        // are verdicts, the session goes on.
        let bad = Ack::new(AckStatus::Integrity, "digest");
        assert_eq!(
            s.on_message(Message::Ack(bad.clone())),
            Ok(SenderEvent::Answered {
                payload: 0,
                entry: Pending::File,
                verdict: Verdict::Ack(bad)
            })
        );
        let rej = Reject::new(RejectCode::Exists, "top/sub is a file");
        assert_eq!(
            s.on_message(Message::Reject(rej.clone())),
            Ok(SenderEvent::Answered {
                payload: 0,
                entry: Pending::Directory,
                verdict: Verdict::Reject(rej)
            })
        );
        // Now the stream's own answer: a REJECT concerns the stream.
        let rej = Reject::new(RejectCode::Exists, "stdin exists");
        assert_eq!(
            s.on_message(Message::Reject(rej.clone())),
            Ok(SenderEvent::Rejected(rej))
        );
        assert_eq!(s.state(), SenderState::Idle);
        assert_eq!(queued(s.close(), &mut s), Ok(Message::Bye));
    }

    #[test]
    fn a_reject_for_a_finished_file_ends_the_session() {
        // A finished file is answered by ACK only; a REJECT is the receiver
        // giving up.
        for sit in [Situation::IdleFilePending, Situation::AwaitRingFilePending] {
            let mut s = session_in(sit);
            assert!(matches!(
                s.on_message(Message::Reject(Reject::new(RejectCode::Io, "x"))),
                Err(ProtocolError::PeerRejected { .. })
            ));
            assert_eq!(s.state(), SenderState::Closed);
        }
    }

    #[test]
    fn the_pipeline_is_bounded() {
        let mut s = greeted(10);
        for i in 0..MAX_PENDING {
            assert!(s.can_start());
            queued(s.start_file(dir_offer(&format!("d{i}")), 0), &mut s).unwrap();
        }
        assert!(!s.can_start());
        assert_eq!(
            s.start_file(offer(1), 0),
            Err(ProtocolError::TooManyPending {
                pending: MAX_PENDING,
                max: MAX_PENDING
            })
        );
        assert_eq!(s.state(), SenderState::Idle);
        s.on_message(ack(AckStatus::Ok)).unwrap();
        assert!(s.can_start());
        assert!(s.start_file(offer(1), 0).is_ok());
        assert_eq!(s.pending(), MAX_PENDING - 1);
    }

    #[test]
    fn aborts_before_fin_close_the_session() {
        for sit in [
            Situation::AwaitRing,
            Situation::Sending,
            Situation::SendingStream,
        ] {
            let mut s = session_in(sit);
            let a = Ack::new(AckStatus::Io, "disk full");
            assert_eq!(
                s.on_message(Message::Ack(a.clone())),
                Ok(SenderEvent::Aborted(FailedAck::of(a).unwrap())),
                "{sit:?}"
            );
            assert_eq!(s.state(), SenderState::Closed);
            assert_eq!(next_file(&mut s), None);
        }
        // ACK(ok) before FIN makes no sense.
        let mut s = session_in(Situation::Sending);
        assert!(s.on_message(ack(AckStatus::Ok)).is_err());
    }

    #[test]
    fn multi_file_session_with_reject() {
        let mut s = greeted(10);
        // File 1: rejected.
        queued(s.start_file(offer(5), 0), &mut s).unwrap();
        let rej = Reject::new(RejectCode::Exists, "exists");
        assert_eq!(
            s.on_message(Message::Reject(rej.clone())),
            Ok(SenderEvent::Rejected(rej))
        );
        assert_eq!(s.state(), SenderState::Idle);
        // File 2 and 3: sent one after the other, each ACK awaited; credits
        // reset per file.
        for size in [25u64, 7] {
            queued(s.start_file(offer(size), 0), &mut s).unwrap();
            s.on_message(Message::Mr(ring(10, 2))).unwrap();
            assert_eq!(s.credits(), 2);
            let plans = plan_all(&mut s);
            assert_eq!(plans[0].seq, 0);
            assert_eq!(plans[0].file_offset, 0);
            queued(s.finish(Digest::Crc32(0)), &mut s).unwrap();
            let a = Ack::new(AckStatus::Integrity, "bad");
            assert_eq!(
                s.on_message(Message::Ack(a.clone())),
                Ok(SenderEvent::Answered {
                    payload: 0,
                    entry: Pending::File,
                    verdict: Verdict::Ack(a)
                })
            );
            assert_eq!(s.state(), SenderState::Idle);
        }
        assert_eq!(queued(s.close(), &mut s), Ok(Message::Bye));
        assert_eq!(s.state(), SenderState::Closed);
    }

    #[test]
    fn keepalives_come_often_enough_for_any_receiver() {
        for (secs, ms) in [(1, 333), (2, 500), (30, 500), (3600, 500)] {
            assert_eq!(
                keepalive_interval(Duration::from_secs(secs)),
                Duration::from_millis(ms)
                    + Duration::from_nanos(if secs == 1 { 333_333 } else { 0 }),
                "--timeout {secs}"
            );
        }
        // Below every possible receiver timeout (at least 1 s).
        assert!(keepalive_interval(Duration::from_secs(1)) < Duration::from_secs(1) / 2);
    }

    /// A refusal's reason comes from whoever answers (before AUTH_OK,
    /// anyone): shown with control characters escaped.
    #[test]
    fn version_refusals_show_the_peer_text_escaped() {
        let evil = "v9\x1b[2J\nsender: fake success";
        for msg in [
            Message::Reject(Reject::new(RejectCode::Version, evil)),
            Message::Ack(Ack::new(AckStatus::Protocol, evil)),
        ] {
            let mut s = session_in(Situation::AwaitAuthOk);
            let err = s.on_message(msg).unwrap_err().to_string();
            assert!(!err.chars().any(char::is_control), "{err:?}");
            assert!(
                err.contains("v9\\u{1b}[2J\\nsender: fake success"),
                "{err:?}"
            );
        }
    }

    fn resumable(size: u64) -> FileOffer {
        FileOffer {
            mtime: Some(Mtime { secs: 7, nanos: 0 }),
            resume: true,
            ..offer(size)
        }
    }

    /// With RESUME the offer waits for HAVE; FROM at the prefix continues
    /// it (chunk numbers, offsets, length and FIN count the whole file).
    #[test]
    fn a_resumed_file_continues_its_prefix() {
        let mut s = greeted(100);
        let Message::Hello(h) = queued(s.start_file(resumable(1000), 1), &mut s).unwrap() else {
            panic!("no HELLO")
        };
        assert_eq!(h.caps, hello_flags::RESUME | hello_flags::MTIME);
        assert_eq!(s.state(), SenderState::AwaitHave);
        assert_eq!(s.on_message(Message::Keepalive), Ok(SenderEvent::Keepalive));
        // No MR before the HAVE is answered.
        assert!(s.clone().on_message(Message::Mr(ring(100, 4))).is_err());
        let have = Have {
            kind: HaveKind::Prefix,
            bytes: 300,
            chunk_len: 50,
            digest: Digest::Sha256([3; 32]),
            note: String::new(),
        };
        assert_eq!(
            s.on_message(Message::Have(have.clone())),
            Ok(SenderEvent::Have(have))
        );
        assert_eq!(s.state(), SenderState::AwaitFromDecision);
        assert!(s.clone().start_from(200).is_err());
        // Checking the prefix takes a while: the receiver is kept waiting.
        assert_eq!(queued(s.keepalive(), &mut s), Ok(Message::Keepalive));
        assert_eq!(
            queued(s.start_from(300), &mut s).unwrap(),
            Message::From { offset: 300 }
        );
        assert!(
            queued(s.keepalive(), &mut s).is_err(),
            "a file does not wait for input"
        );
        assert_eq!(s.state(), SenderState::AwaitRing);
        // The receiver reads nothing after FROM: a KEEPALIVE before its MR
        // is a protocol error.
        let mut misused = s.clone();
        assert_eq!(
            misused.on_message(Message::Keepalive),
            Err(ProtocolError::Unexpected {
                msg: "KEEPALIVE",
                state: "AWAIT_RING"
            })
        );
        assert_eq!(misused.state(), SenderState::Closed);
        assert_eq!(s.resumed_from(), 300);
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        // The prefix's chunk length, not the ring's slot size.
        assert_eq!(s.chunk_len(), 50);
        let p = s.next_chunk(50).unwrap().unwrap();
        assert_eq!((p.seq, p.file_offset, p.slot), (6, 300, 2));
        let mut planned = 350;
        while planned < 1000 {
            if s.next_chunk(50).unwrap().is_none() {
                s.on_message(Message::Credit { count: 4 }).unwrap();
                continue;
            }
            planned += 50;
        }
        let Message::Fin(fin) = queued(s.finish(Digest::Crc32(0)), &mut s).unwrap() else {
            panic!("no FIN")
        };
        assert_eq!((fin.bytes, fin.chunks), (1000, 20));
    }

    /// FROM 0 starts over; a complete copy is compared: ACK is the
    /// file's verdict (nothing sent), HAVE of nothing starts over; a HAVE
    /// that does not fit the offer ends the session.
    #[test]
    fn from_starts_over_or_compares_and_bad_haves_are_refused() {
        let start = || {
            let mut s = greeted(100);
            queued(s.start_file(resumable(1000), 9), &mut s).unwrap();
            s
        };
        let mut s = start();
        s.on_message(Message::Have(Have::nothing("no partial")))
            .unwrap();
        assert!(s.clone().start_from(u64::MAX).is_err());
        assert!(s.clone().compare([0; 32]).is_err(), "nothing to compare");
        queued(s.start_from(0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        assert_eq!(s.next_chunk(100).unwrap().unwrap().file_offset, 0);
        // The same: ACK after COMPARE is the verdict, nothing is sent.
        let mut s = start();
        s.on_message(Message::Have(Have::complete(1000))).unwrap();
        assert!(s.clone().start_from(1000).is_err());
        assert_eq!(
            queued(s.compare([7; 32]), &mut s).unwrap(),
            Message::Compare { sha256: [7; 32] }
        );
        assert_eq!(s.state(), SenderState::AwaitCompared);
        // The receiver reads its copy meanwhile.
        assert_eq!(s.on_message(Message::Keepalive), Ok(SenderEvent::Keepalive));
        let same = Ack::new(AckStatus::Ok, "");
        assert_eq!(
            s.on_message(Message::Ack(same.clone())),
            Ok(SenderEvent::Same {
                ack: same,
                copy: SameCopy::Kept,
                sha256: [7; 32]
            })
        );
        assert_eq!((s.state(), s.bytes_planned()), (SenderState::Idle, 1000));
        assert!(s.close().is_ok(), "nothing pending");
        // It differs: HAVE of nothing, then FROM 0 and everything is sent.
        let mut s = start();
        s.on_message(Message::Have(Have::complete(1000))).unwrap();
        queued(s.compare([7; 32]), &mut s).unwrap();
        let differs = Have::nothing("the receiver's copy differs");
        assert_eq!(
            s.on_message(Message::Have(differs.clone())),
            Ok(SenderEvent::Have(differs))
        );
        assert!(s.clone().compare([7; 32]).is_err(), "compared once");
        queued(s.start_from(0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        assert_eq!(s.next_chunk(100).unwrap().unwrap().file_offset, 0);
        // After COMPARE only ACK or HAVE of nothing.
        let mut s = start();
        s.on_message(Message::Have(Have::complete(1000))).unwrap();
        queued(s.compare([7; 32]), &mut s).unwrap();
        assert!(s.on_message(Message::Have(Have::complete(1000))).is_err());
        assert_eq!(s.state(), SenderState::Closed);
        for bad in [
            Have {
                kind: HaveKind::Prefix,
                bytes: 1000,
                chunk_len: 100,
                digest: Digest::Sha256([0; 32]),
                note: String::new(),
            },
            // A complete copy never discloses a digest.
            Have {
                kind: HaveKind::Complete,
                bytes: 1000,
                chunk_len: 0,
                digest: Digest::Sha256([0; 32]),
                note: String::new(),
            },
            Have {
                digest: Digest::Crc32(5),
                ..Have::complete(1000)
            },
            Have::complete(999),
        ] {
            let mut s = start();
            assert!(s.on_message(Message::Have(bad.clone())).is_err(), "{bad:?}");
            assert_eq!(s.state(), SenderState::Closed);
        }
        // A stream or a file without mtime never asks to resume.
        let mut s = greeted(100);
        let Message::Hello(h) = queued(
            s.start_file(
                FileOffer {
                    mtime: None,
                    ..resumable(10)
                },
                1,
            ),
            &mut s,
        )
        .unwrap() else {
            panic!("no HELLO")
        };
        assert_eq!(h.caps & hello_flags::RESUME, 0);
        assert_eq!(s.state(), SenderState::AwaitRing);
    }

    fn checksummed(size: u64) -> FileOffer {
        FileOffer {
            checksum: true,
            ..offer(size)
        }
    }

    /// With CHECKSUM the offer goes on as any file when the receiver
    /// sends its MR; a HAVE of kind Digest instead is answered by COMPARE,
    /// then ACK(ok) is the verdict (nothing sent) or HAVE(nothing) is
    /// followed by FROM 0 and everything.
    #[test]
    fn a_checksum_offer_is_compared_when_asked() {
        let start = || {
            let mut s = greeted(100);
            let Message::Hello(h) = queued(s.start_file(checksummed(1000), 3), &mut s).unwrap()
            else {
                panic!("no HELLO")
            };
            assert_eq!(h.caps, hello_flags::CHECKSUM);
            assert_eq!(s.state(), SenderState::AwaitRing);
            s
        };
        // Not asked: its MR, and the file is sent as always.
        let mut s = start();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        assert_eq!(s.next_chunk(100).unwrap().unwrap().file_offset, 0);
        assert!(
            s.clone()
                .on_message(Message::Have(Have::ask_digest(1000)))
                .is_err(),
            "not once its data flows"
        );
        // Asked: COMPARE, and the same copy's ACK is the verdict.
        let mut s = start();
        let ask = Have::ask_digest(1000);
        assert_eq!(
            s.on_message(Message::Have(ask.clone())),
            Ok(SenderEvent::Have(ask))
        );
        assert_eq!(s.state(), SenderState::AwaitFromDecision);
        // Hashing the file takes a while: the receiver is kept waiting.
        assert_eq!(queued(s.keepalive(), &mut s), Ok(Message::Keepalive));
        assert!(s.clone().start_from(1000).is_err());
        assert_eq!(
            queued(s.compare([4; 32]), &mut s).unwrap(),
            Message::Compare { sha256: [4; 32] }
        );
        assert_eq!(s.state(), SenderState::AwaitCompared);
        assert_eq!(s.on_message(Message::Keepalive), Ok(SenderEvent::Keepalive));
        let same = Ack::new(AckStatus::Ok, "");
        assert_eq!(
            s.on_message(Message::Ack(same.clone())),
            Ok(SenderEvent::Same {
                ack: same,
                copy: SameCopy::LinkDest,
                sha256: [4; 32]
            })
        );
        assert_eq!((s.state(), s.pending()), (SenderState::Idle, 0));
        assert!(s.close().is_ok());
        // It differs: HAVE(nothing), FROM 0, everything is sent.
        let mut s = start();
        s.on_message(Message::Have(Have::ask_digest(1000))).unwrap();
        queued(s.compare([4; 32]), &mut s).unwrap();
        s.on_message(Message::Have(Have::nothing("the --link-dest copy differs")))
            .unwrap();
        assert!(s.clone().compare([4; 32]).is_err(), "compared once");
        assert_eq!(
            queued(s.start_from(0), &mut s).unwrap(),
            Message::From { offset: 0 }
        );
        assert_eq!(s.state(), SenderState::AwaitRing);
        assert!(
            s.clone()
                .on_message(Message::Have(Have::ask_digest(1000)))
                .is_err(),
            "asked once"
        );
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        assert_eq!(s.next_chunk(100).unwrap().unwrap().file_offset, 0);
        // The engine may send the whole file instead (FROM 0).
        let mut s = start();
        s.on_message(Message::Have(Have::ask_digest(1000))).unwrap();
        queued(s.start_from(0), &mut s).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        // Refused where it was not asked: the offer goes on.
        let mut s = start();
        s.on_message(Message::Have(Have::ask_digest(1000))).unwrap();
        queued(s.compare([4; 32]), &mut s).unwrap();
        s.on_message(Message::Reject(Reject::new(RejectCode::Exists, "x")))
            .unwrap();
        assert_eq!(s.state(), SenderState::Idle);
    }

    /// A HAVE of kind Digest only for an offer with CHECKSUM, only once,
    /// fitting it; of a complete copy only with CHECKSUM or RESUME; no
    /// other HAVE without RESUME; CHECKSUM only on files.
    #[test]
    fn digest_haves_are_refused_out_of_place() {
        let refused = |offer: FileOffer, have: Have| {
            let mut s = greeted(100);
            queued(s.start_file(offer.clone(), 1), &mut s).unwrap();
            let got = s.on_message(Message::Have(have.clone()));
            assert!(got.is_err(), "{have:?} for {offer:?}: {got:?}");
            assert_eq!(s.state(), SenderState::Closed);
        };
        for have in [
            Have::complete(999),
            Have::nothing(""),
            Have::ask_digest(999),
            Have {
                chunk_len: 100,
                ..Have::ask_digest(1000)
            },
            Have {
                digest: Digest::Sha256([0; 32]),
                ..Have::ask_digest(1000)
            },
        ] {
            refused(checksummed(1000), have);
        }
        refused(offer(1000), Have::ask_digest(1000));
        refused(offer(1000), Have::complete(1000));
        refused(resumable(1000), Have::ask_digest(1000));
        // With CHECKSUM a file of its size under the final name is
        // compared (protocol 6): a HAVE of a complete copy, then COMPARE.
        let mut s = greeted(100);
        queued(s.start_file(checksummed(1000), 1), &mut s).unwrap();
        s.on_message(Message::Have(Have::complete(1000))).unwrap();
        assert!(s.compare([1; 32]).is_ok());
        let same = s
            .on_message(Message::Ack(Ack::new(AckStatus::Ok, "")))
            .unwrap();
        assert!(
            matches!(
                same,
                SenderEvent::Same {
                    copy: SameCopy::Kept,
                    ..
                }
            ),
            "{same:?}"
        );
        // With RESUME too: any fitting HAVE, Digest included.
        let both = FileOffer {
            checksum: true,
            ..resumable(1000)
        };
        let mut s = greeted(100);
        let Message::Hello(h) = queued(s.start_file(both.clone(), 1), &mut s).unwrap() else {
            panic!("no HELLO")
        };
        assert_eq!(
            h.caps,
            hello_flags::RESUME | hello_flags::MTIME | hello_flags::CHECKSUM
        );
        assert_eq!(s.state(), SenderState::AwaitHave);
        s.on_message(Message::Have(Have::ask_digest(1000))).unwrap();
        assert!(s.compare([1; 32]).is_ok());
        refused(both.clone(), Have::ask_digest(999));
        // A verdict on an earlier entry comes first: HAVE then is out of
        // order.
        let mut s = greeted(100);
        queued(s.start_file(offer(100), 1), &mut s).unwrap();
        s.on_message(Message::Mr(ring(100, 4))).unwrap();
        s.next_chunk(100).unwrap();
        queued(s.finish(Digest::Crc32(0)), &mut s).unwrap();
        queued(s.start_file(checksummed(1000), 2), &mut s).unwrap();
        assert!(s.on_message(Message::Have(Have::ask_digest(1000))).is_err());
        // COMPARE only after a HAVE of a complete copy or of kind Digest.
        let mut s = greeted(100);
        queued(s.start_file(checksummed(1000), 1), &mut s).unwrap();
        assert!(s.compare([1; 32]).is_err());
        // Streams and directories never carry CHECKSUM; a batch's files do.
        for kind in [OfferKind::Stream, OfferKind::Directory] {
            let mut s = greeted(100);
            let Message::Hello(h) = queued(
                s.start_file(
                    FileOffer {
                        kind,
                        ..checksummed(0)
                    },
                    1,
                ),
                &mut s,
            )
            .unwrap() else {
                panic!("no HELLO")
            };
            assert_eq!(h.caps & hello_flags::CHECKSUM, 0, "{kind:?}");
            if kind == OfferKind::Stream {
                assert!(s.on_message(Message::Have(Have::ask_digest(0))).is_err());
            }
        }
        let mut s = greeted(100);
        let Message::Batch(members) = queued(
            s.start_batch(vec![checksummed(1), checksummed(2)], 1),
            &mut s,
        )
        .unwrap() else {
            panic!("no BATCH")
        };
        assert!(members.iter().all(|m| m.caps & hello_flags::CHECKSUM != 0));
        assert!(s.on_message(Message::Have(Have::ask_digest(3))).is_err());
    }

    /// A dry run's session: every HELLO carries DRY_RUN and never
    /// RESUME, no batch, and ACK(would-receive) settles an offer; a real
    /// session takes no such ACK.
    #[test]
    fn a_dry_run_offers_alone_and_is_settled_without_data() {
        let mut s = SenderSession::new(100, None).dry_run();
        s.on_message(challenge(0)).unwrap();
        assert!(!s.may_batch());
        assert!(s.start_batch(vec![offer(1)], 1).is_err());
        let resumed = FileOffer {
            resume: true,
            mtime: Some(Mtime { secs: 1, nanos: 0 }),
            ..offer(10)
        };
        let Message::Hello(h) = queued(s.start_file(resumed, 1), &mut s).unwrap() else {
            panic!("no HELLO")
        };
        assert_eq!(h.caps, hello_flags::DRY_RUN | hello_flags::MTIME);
        assert_eq!(s.state(), SenderState::AwaitRing);
        let would = Ack::new(AckStatus::WouldReceive, "");
        let got = s.on_message(Message::Ack(would.clone())).unwrap();
        assert_eq!(got, SenderEvent::Settled(would.clone()));
        assert_eq!(s.state(), SenderState::Idle);
        // A real session: a protocol error.
        let mut s = greeted(100);
        queued(s.start_file(offer(10), 1), &mut s).unwrap();
        assert!(s.on_message(Message::Ack(would)).is_err());
        assert_eq!(s.state(), SenderState::Closed);
    }
}
