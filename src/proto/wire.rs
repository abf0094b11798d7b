//! Control-message codec, protocol v1.
//!
//! Frame: 12-byte header (magic u32, version u8, type u8, flags u16, body_len u32)
//! followed by the body; every integer is big-endian. Decoding is strict: a buffer
//! must hold exactly one frame and every body byte must be consumed, so the
//! encoding is canonical (`encode(decode(b)) == b`).

use std::fmt;

use thiserror::Error;

use super::assembly::{Piece, TransferId};
use super::auth::{CHALLENGE_FLAGS_KNOWN, MAC_LEN, NONCE_LEN, SEAL_LEN};

/// "RXFR".
pub const MAGIC: u32 = 0x5258_4652;
/// Version of the framing (header layout), not the session protocol.
pub const WIRE_VERSION: u8 = 1;
/// Bytes of the frame header that precedes every body.
pub const HEADER_LEN: usize = 12;
/// Largest control message on the wire (a sealed frame with its
/// sequence number and tag): the size of every receive buffer.
pub const MAX_MESSAGE: usize = 4096;
/// Largest frame (header + body): room is left for the seal, so that a
/// sealed frame still fits [`MAX_MESSAGE`].
pub const MAX_FRAME: usize = MAX_MESSAGE - SEAL_LEN;
/// Largest body (what is left of [`MAX_FRAME`] after the header).
pub const MAX_BODY: usize = MAX_FRAME - HEADER_LEN;
/// HELLO `caps` with no flag set: a plain file (the only value version 1
/// allows).
pub const CAP_NONE: u32 = 0;

/// Bits of HELLO's `caps` field (protocol version 2; a version-1 HELLO
/// carries 0). They say what kind of entry the offer is.
pub mod hello_flags {
    /// A stream of unknown length: `size` is 0 and the FIN carries the
    /// final size.
    pub const STREAM: u32 = 1 << 0;
    /// A directory: `size` is 0, no data follows; answered by ACK or REJECT.
    pub const DIRECTORY: u32 = 1 << 1;
    /// The body carries the modification time (`Hello::mtime`) after the
    /// digest byte. The only flag that changes the layout.
    pub const MTIME: u32 = 1 << 2;
    /// Keep `mode` as sent (`sender -p`); without it the receiver masks it
    /// with its umask, as scp does.
    pub const KEEP_MODE: u32 = 1 << 3;
    /// `sender --resume`: the receiver keeps what it verified if the
    /// session fails and answers the offer with HAVE (what it holds)
    /// before its MR; a complete copy is compared (COMPARE). Files only, and only with MTIME (the source's
    /// identity).
    /// (Bit 4 was the first form of resuming, where HAVE disclosed the
    /// receiver's whole-file digest; it is refused as unknown.)
    pub const RESUME: u32 = 1 << 5;
    /// `sender --checksum`: this sender answers a HAVE of kind `Digest`
    /// with COMPARE, the SHA-256 of the file, computed before any data
    /// (the receiver looks for a copy under its --link-dest), and a HAVE
    /// of a complete copy too: a file of the offered size under the final
    /// name is unchanged when its SHA-256 is the same, whatever its
    /// modification time. Files only.
    pub const CHECKSUM: u32 = 1 << 6;
    /// `sender --ignore-times`: a file under the final name is never
    /// taken as unchanged by its size and modification time (protocol 6).
    pub const IGNORE_TIMES: u32 = 1 << 7;
    /// `sender --ignore-existing`: any regular file under the final name
    /// stays as it is (ACK(kept-existing)) (protocol 6).
    pub const IGNORE_EXISTING: u32 = 1 << 8;
    /// `sender --update`: a regular file under the final name with a later
    /// modification time than the offer's stays as it is (ACK(kept-newer))
    /// (protocol 6). Only with MTIME.
    pub const UPDATE: u32 = 1 << 9;
    /// `sender --dry-run`: the receiver makes every check of a real run
    /// and answers without data (ACK would-receive instead of the MR);
    /// nothing is written. Never with RESUME, never in a BATCH.
    pub const DRY_RUN: u32 = 1 << 10;
    /// `sender --lanes`: the offer is one piece of a file sent over
    /// several lanes (`Hello::piece`, after the mtime: the transfer, the
    /// piece's index, the grid's piece size, the file's size); `size` is
    /// the piece's length. Only with MTIME, never with STREAM, DIRECTORY,
    /// RESUME, CHECKSUM or DRY_RUN, never in a BATCH (protocol 8).
    pub const PIECE: u32 = 1 << 11;
    /// Every flag this build knows.
    pub const KNOWN: u32 = STREAM
        | DIRECTORY
        | MTIME
        | KEEP_MODE
        | RESUME
        | CHECKSUM
        | IGNORE_TIMES
        | IGNORE_EXISTING
        | UPDATE
        | DRY_RUN
        | PIECE;
}
/// `Reject::new` / `Ack::new` cut reasons to this many bytes so any reason fits a frame.
pub const MAX_REASON: usize = 1024;

/// Declares [`MessageType`] from one table: each message's variant, its
/// code in the frame header and its name. Everything else about types
/// (the header code of a message, the name in logs, what a code decodes
/// to) follows from it.
macro_rules! message_types {
    ($($(#[$doc:meta])* $variant:ident = $code:literal, $name:literal;)*) => {
        /// The type of a control message: its code in the frame header and
        /// its name.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[repr(u8)]
        pub enum MessageType {
            $($(#[$doc])* $variant = $code,)*
        }

        impl MessageType {
            /// Every type, in code order.
            pub const ALL: &'static [MessageType] = &[$(MessageType::$variant),*];

            /// The code in the frame header.
            pub const fn code(self) -> u8 {
                self as u8
            }

            /// The name in upper case ("HELLO"), for messages and logs.
            pub const fn name(self) -> &'static str {
                match self {
                    $(MessageType::$variant => $name,)*
                }
            }

            /// The type of a header code, if it is one.
            pub const fn from_code(code: u8) -> Option<Self> {
                match code {
                    $($code => Some(MessageType::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

message_types! {
    /// [`Message::Hello`].
    Hello = 1, "HELLO";
    /// [`Message::Mr`].
    Mr = 2, "MR";
    /// [`Message::Reject`].
    Reject = 3, "REJECT";
    /// [`Message::Credit`].
    Credit = 4, "CREDIT";
    /// [`Message::Fin`].
    Fin = 5, "FIN";
    /// [`Message::Ack`].
    Ack = 6, "ACK";
    /// [`Message::Bye`].
    Bye = 7, "BYE";
    /// [`Message::Challenge`].
    Challenge = 8, "CHALLENGE";
    /// [`Message::Auth`].
    Auth = 9, "AUTH";
    /// [`Message::Keepalive`].
    Keepalive = 10, "KEEPALIVE";
    /// [`Message::Prove`].
    Prove = 11, "PROVE";
    /// [`Message::AuthOk`].
    AuthOk = 12, "AUTH_OK";
    /// [`Message::Have`].
    Have = 13, "HAVE";
    /// [`Message::From`].
    From = 14, "FROM";
    /// [`Message::Compare`].
    Compare = 15, "COMPARE";
    /// [`Message::Batch`].
    Batch = 16, "BATCH";
    /// [`Message::Relay`].
    Relay = 17, "RELAY";
    /// [`Message::Result`].
    Result = 18, "RESULT";
}

/// The whole-file digest a HELLO announces and its FIN carries (its wire
/// code is the discriminant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(u8)]
pub enum DigestAlg {
    /// CRC32 (IEEE), 4 bytes.
    #[default]
    Crc32 = 1,
    /// SHA-256, 32 bytes.
    Sha256 = 2,
}

impl DigestAlg {
    /// The algorithm of a wire code, if known.
    pub fn from_u8(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Crc32),
            2 => Some(Self::Sha256),
            _ => None,
        }
    }

    /// Digest size in bytes.
    pub const fn digest_len(self) -> usize {
        match self {
            Self::Crc32 => 4,
            Self::Sha256 => 32,
        }
    }

    /// Lowercase name, as on the command line (`--verify`) and in JSON.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Crc32 => "crc32",
            Self::Sha256 => "sha256",
        }
    }
}

impl fmt::Display for DigestAlg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A whole-file digest, as FIN carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Digest {
    /// Travels as 4 big-endian bytes.
    Crc32(u32),
    /// The 32 bytes of the hash.
    Sha256([u8; 32]),
}

impl Digest {
    /// The digest's algorithm.
    pub const fn alg(&self) -> DigestAlg {
        match self {
            Self::Crc32(_) => DigestAlg::Crc32,
            Self::Sha256(_) => DigestAlg::Sha256,
        }
    }
}

impl fmt::Display for Digest {
    /// `crc32:0123abcd` / `sha256:<64 hex>`, for mismatch messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Crc32(v) => write!(f, "crc32:{v:08x}"),
            Self::Sha256(b) => {
                f.write_str("sha256:")?;
                b.iter().try_for_each(|x| write!(f, "{x:02x}"))
            }
        }
    }
}

/// Why a REJECT refuses an offer or a session (its wire code is the
/// discriminant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum RejectCode {
    /// The name or path is not acceptable (see `names`), or resolves to
    /// something that may not be replaced.
    BadName = 1,
    /// The file exists and the receiver does not overwrite.
    Exists = 2,
    /// Larger than the receiver's `--max-size`.
    TooLarge = 3,
    /// A protocol version (or HELLO flag) the receiver does not speak.
    Version = 4,
    /// Not enough free space for the file.
    NoSpace = 5,
    /// The receiver serves its maximum of sessions already.
    Busy = 6,
    /// The receiver could not create or open the file.
    Io = 7,
    /// A protocol violation ended the session.
    Protocol = 8,
    /// The sender did not authenticate.
    Auth = 9,
}

impl RejectCode {
    /// Every code, in wire order.
    pub const ALL: [Self; 9] = [
        Self::BadName,
        Self::Exists,
        Self::TooLarge,
        Self::Version,
        Self::NoSpace,
        Self::Busy,
        Self::Io,
        Self::Protocol,
        Self::Auth,
    ];

    /// The code of a wire value, if known.
    pub fn from_u16(v: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|c| *c as u16 == v)
    }

    /// The code named by `slug` (`slug`'s inverse), if one is.
    pub fn from_slug(slug: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.slug() == slug)
    }

    /// A short description, for messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::BadName => "bad file name",
            Self::Exists => "file exists",
            Self::TooLarge => "file too large",
            Self::Version => "unsupported protocol version",
            Self::NoSpace => "no space left",
            Self::Busy => "receiver busy",
            Self::Io => "I/O error",
            Self::Protocol => "protocol error",
            Self::Auth => "authentication failed",
        }
    }

    /// A stable one-word name, for scripts (JSON, test tools).
    pub const fn slug(self) -> &'static str {
        match self {
            Self::BadName => "bad-name",
            Self::Exists => "exists",
            Self::TooLarge => "too-large",
            Self::Version => "version",
            Self::NoSpace => "no-space",
            Self::Busy => "busy",
            Self::Io => "io",
            Self::Protocol => "protocol",
            Self::Auth => "auth",
        }
    }
}

impl fmt::Display for RejectCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The receiver's verdict in an ACK (its wire code is the discriminant).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum AckStatus {
    /// Verified, fsynced and renamed (or the directory exists).
    Ok = 0,
    /// A chunk's CRC or the whole-file digest did not match.
    Integrity = 1,
    /// The receiver failed to write, sync or rename the file.
    Io = 2,
    /// The sender broke the protocol; the session ends.
    Protocol = 3,
    /// Refused while it arrived (a stream over `--max-size`).
    Rejected = 4,
    /// Answering a HELLO, before any MR (protocol 6): the receiver's file
    /// under the final name has the offer's size and modification time
    /// (or, after a COMPARE, its SHA-256). Nothing is sent; a success.
    Unchanged = 5,
    /// Answering a HELLO with IGNORE_EXISTING: a regular file is there and
    /// stays. Nothing is sent; a success.
    KeptExisting = 6,
    /// Answering a HELLO with UPDATE: the receiver's file is newer and
    /// stays. Nothing is sent; a success.
    KeptNewer = 7,
    /// Answering a HELLO with DRY_RUN where a real run would get the MR:
    /// the receiver would take it. Nothing is sent or written; a success.
    WouldReceive = 8,
    /// A piece (PIECE) verified and written; its file is not whole yet
    /// (protocol 8). After its FIN, or answering its HELLO when it was
    /// verified before (its ACK lost with a lane): a success. The ACK of
    /// the piece that makes the file whole is Ok (verified whole, fsynced,
    /// renamed).
    PieceKept = 9,
}

/// The statuses of an ACK that fails its file: every one but Ok.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AckFailure {
    /// As [`AckStatus::Integrity`].
    Integrity,
    /// As [`AckStatus::Io`].
    Io,
    /// As [`AckStatus::Protocol`].
    Protocol,
    /// As [`AckStatus::Rejected`].
    Rejected,
}

/// An ACK that fails its file (any status but Ok), with its reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FailedAck {
    /// Its status.
    pub failure: AckFailure,
    /// Its reason (at most [`MAX_REASON`] bytes).
    pub reason: String,
}

impl FailedAck {
    /// `ack` as a failure, or (status Ok) `ack` back.
    pub fn of(ack: Ack) -> Result<Self, Ack> {
        match ack.status.failure() {
            Some(failure) => Ok(FailedAck {
                failure,
                reason: ack.reason,
            }),
            None => Err(ack),
        }
    }
}

impl From<AckFailure> for AckStatus {
    fn from(f: AckFailure) -> Self {
        match f {
            AckFailure::Integrity => AckStatus::Integrity,
            AckFailure::Io => AckStatus::Io,
            AckFailure::Protocol => AckStatus::Protocol,
            AckFailure::Rejected => AckStatus::Rejected,
        }
    }
}

impl AckStatus {
    /// Every status, in wire order.
    pub const ALL: [Self; 10] = [
        Self::Ok,
        Self::Integrity,
        Self::Io,
        Self::Protocol,
        Self::Rejected,
        Self::Unchanged,
        Self::KeptExisting,
        Self::KeptNewer,
        Self::WouldReceive,
        Self::PieceKept,
    ];

    /// The failure this status says; None for Ok and the verdicts that
    /// leave the receiver's file as it is.
    pub const fn failure(self) -> Option<AckFailure> {
        match self {
            Self::Ok
            | Self::Unchanged
            | Self::KeptExisting
            | Self::KeptNewer
            | Self::WouldReceive
            | Self::PieceKept => None,
            Self::Integrity => Some(AckFailure::Integrity),
            Self::Io => Some(AckFailure::Io),
            Self::Protocol => Some(AckFailure::Protocol),
            Self::Rejected => Some(AckFailure::Rejected),
        }
    }

    /// The status of a wire value, if known.
    pub fn from_u16(v: u16) -> Option<Self> {
        Self::ALL.into_iter().find(|s| *s as u16 == v)
    }

    /// A short description, for messages.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Integrity => "integrity check failed",
            Self::Io => "I/O error",
            Self::Protocol => "protocol error",
            Self::Rejected => "rejected",
            Self::Unchanged => "unchanged",
            Self::KeptExisting => "kept: it exists",
            Self::KeptNewer => "kept: newer at the receiver",
            Self::WouldReceive => "would be received (dry run)",
            Self::PieceKept => "piece kept (its file not whole yet)",
        }
    }

    /// A verdict that answers a HELLO without data: the receiver's file
    /// stays as it is, or a dry run would receive it.
    pub const fn without_data(self) -> bool {
        matches!(
            self,
            Self::Unchanged | Self::KeptExisting | Self::KeptNewer | Self::WouldReceive
        )
    }

    /// A stable one-word name, for scripts (JSON, test tools).
    pub const fn slug(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Integrity => "integrity",
            Self::Io => "io",
            Self::Protocol => "protocol",
            Self::Rejected => "rejected",
            Self::Unchanged => "unchanged",
            Self::KeptExisting => "kept-existing",
            Self::KeptNewer => "kept-newer",
            Self::WouldReceive => "would-receive",
            Self::PieceKept => "piece-kept",
        }
    }
}

impl fmt::Display for AckStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A modification time: seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mtime {
    /// Whole seconds (negative before 1970).
    pub secs: i64,
    /// Below 1_000_000_000 (the codec refuses anything else).
    pub nanos: u32,
}

impl Mtime {
    /// Whether a file system's stored time (`secs`, `nsec` as `stat`
    /// gives them) is this one. A time stored with less precision (a file
    /// system keeping microseconds, say) matches this one cut to that
    /// precision.
    pub fn matches_stored(self, secs: i64, nsec: i64) -> bool {
        secs == self.secs
            && (0..=9).any(|digits| {
                let unit = 10u32.pow(digits);
                i64::from(self.nanos - self.nanos % unit) == nsec
            })
    }

    /// Whether a stored time is later than this one, beyond what the
    /// stored precision may have cut (`matches_stored` is not later).
    pub fn earlier_than_stored(self, secs: i64, nsec: i64) -> bool {
        !self.matches_stored(secs, nsec) && (secs, nsec) > (self.secs, i64::from(self.nanos))
    }
}

/// The sender's offer of one entry: a file, a stream or a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Sender's session protocol version (`PROTOCOL_VERSION`, or 1 for a
    /// plain file so that older receivers still take it).
    pub version: u16,
    /// Flags (`hello_flags`): stream, directory, mtime present, keep mode.
    pub caps: u32,
    /// Not validated here; see `names::validate_path`.
    pub name: String,
    /// 0 for streams and directories.
    pub size: u64,
    /// Unix permission bits; only `mode & 0o7777` is meaningful.
    pub mode: u32,
    /// Whole-file digest the FIN will carry, so the receiver can hash while receiving.
    pub digest: DigestAlg,
    /// Present on the wire exactly when `caps` has `hello_flags::MTIME`.
    pub mtime: Option<Mtime>,
    /// Present on the wire exactly when `caps` has `hello_flags::PIECE`.
    pub piece: Option<Piece>,
}

impl Hello {
    /// Whether the offer is a stream of unknown size.
    pub const fn is_stream(&self) -> bool {
        self.caps & hello_flags::STREAM != 0
    }

    /// Whether the offer is a directory.
    pub const fn is_directory(&self) -> bool {
        self.caps & hello_flags::DIRECTORY != 0
    }

    /// The permission bits the received entry gets: the sender's, never
    /// setuid, setgid or sticky, masked with the receiver's `umask`, unless
    /// the sender asked to keep them (`sender -p`, as scp does) and the
    /// receiver lets it (`keep_modes`, `receiver --keep-modes`): a sender
    /// alone never makes a file more open than the receiver's umask.
    pub const fn received_mode(&self, umask: u32, keep_modes: bool) -> u32 {
        let mode = self.mode & 0o777;
        if keep_modes && self.caps & hello_flags::KEEP_MODE != 0 {
            mode
        } else {
            mode & !umask
        }
    }
}

/// The receiver's ring; length is always `slot_size * slot_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RingInfo {
    /// The ring's first byte as the sender addresses it in RDMA WRITEs (an
    /// I/O virtual address, not the receiver's heap address).
    pub addr: u64,
    /// The remote key that lets the sender write the ring.
    pub rkey: u32,
    /// Bytes per slot (the longest chunk).
    pub slot_size: u32,
    /// Number of slots.
    pub slot_count: u32,
}

impl RingInfo {
    /// Ring length in bytes (cannot overflow: product of two u32).
    pub const fn len_bytes(&self) -> u64 {
        self.slot_size as u64 * self.slot_count as u64
    }
}

/// The receiver's greeting, always its first message of a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Challenge {
    /// `auth::AUTH_REQUIRED` or 0; other bits are refused by the codec.
    pub flags: u16,
    /// Fresh from the OS RNG when authentication is required.
    pub nonce: [u8; NONCE_LEN],
}

impl Challenge {
    /// Whether the receiver requires an AUTH before anything else.
    pub const fn auth_required(&self) -> bool {
        self.flags & super::auth::AUTH_REQUIRED != 0
    }
}

/// The sender's answer to a CHALLENGE that requires authentication
/// (protocol 3): its protocol version, its own fresh nonce, and its proof
/// of the token bound to this connection (empty when it has no token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prove {
    /// The sender's session protocol version (`PROTOCOL_VERSION`).
    pub version: u16,
    /// Fresh from the sender's OS RNG.
    pub nonce: [u8; NONCE_LEN],
    /// `SessionKey::sender_proof`, or empty (no token). The codec refuses
    /// any other length.
    pub proof: Vec<u8>,
}

/// The receiver refuses an offer (or the session), or either side aborts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reject {
    /// Why, as a code.
    pub code: RejectCode,
    /// Why, in words (at most [`MAX_REASON`] bytes).
    pub reason: String,
}

impl Reject {
    /// Cuts `reason` to `MAX_REASON` bytes so encoding cannot fail on it.
    pub fn new(code: RejectCode, reason: impl Into<String>) -> Self {
        Self {
            code,
            reason: clamp_string(reason.into(), MAX_REASON),
        }
    }
}

/// The sender's end of a file's data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fin {
    /// Bytes written (a stream's final size).
    pub bytes: u64,
    /// Chunks written.
    pub chunks: u64,
    /// The whole-file digest, of the algorithm the HELLO announced.
    pub digest: Digest,
}

/// The receiver's verdict on a file (after its FIN) or a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ack {
    /// The verdict.
    pub status: AckStatus,
    /// Details of a failure (empty for Ok; at most [`MAX_REASON`] bytes).
    pub reason: String,
}

impl Ack {
    /// Cuts `reason` to `MAX_REASON` bytes so encoding cannot fail on it.
    pub fn new(status: AckStatus, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: clamp_string(reason.into(), MAX_REASON),
        }
    }
}

/// Longest host name in RELAY and RESULT: "HOST:PORT" as the user gave it.
pub const MAX_HOST_LEN: usize = 255;
/// Most hosts a session's RELAY messages may name, all together.
pub const MAX_RELAY_HOPS: usize = 1024;

/// Sender -> receiver, after authentication and before any offer: the
/// hosts after the receiver in a relay chain, in chain order (protocol 7).
/// A long chain takes several RELAY messages; the receiver appends them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Relay {
    /// Each "HOST:PORT" as the user gave it (see [`check_host`]).
    pub hops: Vec<String>,
}

/// One host's verdict on an offer, as RESULT carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HopVerdict {
    /// The host answered with ACK of this status.
    Ack(AckStatus),
    /// The host refused the offer with REJECT of this code.
    Reject(RejectCode),
    /// The host before it could not reach it, or lost it before its
    /// verdict (it died, its link went down, it stalled): the reason says
    /// how. The sender counts it as a lost peer.
    Lost,
}

/// RESULT: one host's verdict on the offer whose own verdict comes next
/// (protocol 7). A relaying receiver sends one per host of the chain
/// (its own first, then those it got from downstream) before its verdict.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HopResult {
    /// The host, as in RELAY (see [`check_host`]).
    pub host: String,
    /// Its verdict.
    pub verdict: HopVerdict,
    /// Bytes it wrote for the offer.
    pub bytes: u64,
    /// Details of a failure (empty for success; at most [`MAX_REASON`] bytes).
    pub reason: String,
}

impl HopResult {
    /// Cuts `reason` to `MAX_REASON` bytes so that it cannot fail on it.
    pub fn new(host: String, verdict: HopVerdict, bytes: u64, reason: impl Into<String>) -> Self {
        Self {
            host,
            verdict,
            bytes,
            reason: clamp_string(reason.into(), MAX_REASON),
        }
    }
}

/// Whether `host` may travel in RELAY or RESULT: 1 to [`MAX_HOST_LEN`]
/// bytes, each a printable ASCII character (no space, no control, no
/// non-ASCII), so that it is safe in logs and reports as it is.
pub fn check_host(host: &str) -> Result<(), WireError> {
    check_host_bytes("host", host.as_bytes())
}

fn check_host_bytes(field: &'static str, host: &[u8]) -> Result<(), WireError> {
    if host.is_empty() {
        return Err(WireError::BadHost {
            field,
            why: "is empty",
        });
    }
    if host.len() > MAX_HOST_LEN {
        return Err(WireError::TooLong {
            field,
            len: host.len(),
            max: MAX_HOST_LEN,
        });
    }
    if !host.iter().all(u8::is_ascii_graphic) {
        return Err(WireError::BadHost {
            field,
            why: "has a space, a control or a non-ASCII character",
        });
    }
    Ok(())
}

/// Splits `hops` into as few RELAY messages as fit a frame each (within
/// [`MAX_MESSAGE`] once sealed), in order. Refuses an empty list, more
/// than [`MAX_RELAY_HOPS`] hosts and any host [`check_host`] refuses.
pub fn relay_messages(hops: &[String]) -> Result<Vec<Relay>, WireError> {
    if hops.is_empty() {
        return Err(WireError::NoHops);
    }
    if hops.len() > MAX_RELAY_HOPS {
        return Err(WireError::TooManyHops {
            count: hops.len(),
            max: MAX_RELAY_HOPS,
        });
    }
    let mut messages = Vec::new();
    let mut current: Vec<String> = Vec::new();
    let mut len = RELAY_FIXED;
    for hop in hops {
        check_host_bytes("RELAY hop", hop.as_bytes())?;
        let hop_len = RELAY_HOP_FIXED + hop.len();
        // A host fits an empty message: 2 + 2 + 255 bytes.
        if len + hop_len > MAX_BODY && !current.is_empty() {
            messages.push(Relay {
                hops: std::mem::take(&mut current),
            });
            len = RELAY_FIXED;
        }
        len += hop_len;
        current.push(hop.clone());
    }
    messages.push(Relay { hops: current });
    Ok(messages)
}

/// Truncates to at most `max` bytes on a char boundary.
pub fn clamp_string(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1; // terminates: index 0 is always a boundary
        }
        s.truncate(cut);
    }
    s
}

/// A control message, decoded (see docs/protocol.md for each layout).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Sender -> receiver: offers an entry.
    Hello(Hello),
    /// Sender -> receiver: offers several small files at once (protocol
    /// 4): one ring, one data stream (the files' bytes back to back), one
    /// FIN and one ACK for all. Each member is a HELLO of a plain file.
    Batch(Vec<Hello>),
    /// Receiver -> sender: accepts a file or stream; the ring to write into.
    Mr(RingInfo),
    /// Refuses an offer or the session.
    Reject(Reject),
    /// Receiver -> sender: ring slots freed.
    Credit {
        /// Slots freed since the last CREDIT.
        count: u32,
    },
    /// Sender -> receiver: a file's data is complete.
    Fin(Fin),
    /// Receiver -> sender: the verdict on a file or directory.
    Ack(Ack),
    /// Sender -> receiver: the session ends (nothing pending).
    Bye,
    /// Receiver -> sender: the first message of every session.
    Challenge(Challenge),
    /// Protocol 2's answer to a CHALLENGE (HMAC-SHA256 of the nonce, or
    /// empty). Only decoded, so that a protocol-3 receiver can tell an old
    /// sender clearly which versions differ. The codec refuses any length
    /// but 0 and `auth::MAC_LEN`.
    Auth {
        /// The MAC (empty or `auth::MAC_LEN` bytes).
        mac: Vec<u8>,
    },
    /// The sender is alive but waiting for its input (a slow stream): it
    /// resets the receiver's no-progress timeout. Empty body.
    Keepalive,
    /// Sender -> receiver: the answer to a CHALLENGE requiring
    /// authentication (protocol 3).
    Prove(Prove),
    /// Receiver -> sender: the sender's proof was right; here is the
    /// receiver's (protocol 3). Only after checking it does the sender
    /// send a HELLO.
    AuthOk {
        /// `SessionKey::receiver_proof`.
        proof: [u8; MAC_LEN],
    },
    /// Receiver -> sender: what the receiver already holds of a file
    /// offered with `hello_flags::RESUME`, or its request for the file's
    /// SHA-256 (`hello_flags::CHECKSUM`), before its MR.
    Have(Have),
    /// Sender -> receiver: where the data of the file just answered by
    /// HAVE starts: 0, or HAVE's prefix.
    From {
        /// The first byte the sender will write.
        offset: u64,
    },
    /// Sender -> receiver: answers a HAVE of a complete copy (or of kind
    /// `Digest`) with the SHA-256 of the sender's file. The receiver compares its copy and
    /// answers ACK(ok) (the same: nothing is sent) or HAVE of nothing
    /// (it differs: FROM 0 follows). The receiver never discloses a
    /// digest of its own files.
    Compare {
        /// SHA-256 of the sender's whole file.
        sha256: [u8; 32],
    },
    /// Sender -> receiver, after authentication and before any offer: the
    /// hosts after the receiver in a relay chain (protocol 7).
    Relay(Relay),
    /// Receiver -> sender: one host's verdict on the offer whose verdict
    /// comes next, before that verdict (protocol 7).
    Result(HopResult),
}

/// What a receiver holds of a file offered for resuming.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum HaveKind {
    /// Nothing usable (the note says why).
    Nothing = 0,
    /// A verified prefix kept from an earlier attempt.
    Prefix = 1,
    /// The whole file, under its final name, with the offered size.
    Complete = 2,
    /// "Send me your file's SHA-256" (an offer with
    /// `hello_flags::CHECKSUM`): a file of the offered size may be reused
    /// (the receiver's --link-dest), as COMPARE will tell.
    Digest = 3,
}

impl HaveKind {
    /// The kind of a wire value, if known.
    pub fn from_u8(v: u8) -> Option<Self> {
        [Self::Nothing, Self::Prefix, Self::Complete, Self::Digest]
            .into_iter()
            .find(|k| *k as u8 == v)
    }
}

/// HAVE: the receiver's answer to an offer with `hello_flags::RESUME`,
/// or its request for the SHA-256 of an offer with `hello_flags::CHECKSUM`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Have {
    /// What it holds.
    pub kind: HaveKind,
    /// Prefix: the verified bytes (whole chunks of `chunk_len`); Complete
    /// and Digest: the file's size; Nothing: 0.
    pub bytes: u64,
    /// Prefix: the chunk length the prefix arrived in; else 0.
    pub chunk_len: u32,
    /// Prefix: SHA-256 of the prefix's chunk CRC32s (4 bytes each,
    /// big-endian, in order); Complete, Digest and Nothing:
    /// `Digest::Crc32(0)` (a copy is compared by the receiver, see COMPARE).
    pub digest: Digest,
    /// Why nothing (or not more) can be reused, in words, for the user
    /// (at most [`MAX_REASON`] bytes).
    pub note: String,
}

impl Have {
    /// Whether this HAVE fits an offer of a `size`-byte file: a prefix of
    /// whole chunks shorter than the file (its digest SHA-256 over the
    /// chunk CRCs), or the whole file (held, or asked for its digest), or
    /// nothing.
    pub fn fits(&self, size: u64) -> bool {
        let no_digest = self.digest == Digest::Crc32(0) && self.chunk_len == 0;
        match self.kind {
            HaveKind::Nothing => self.bytes == 0 && no_digest,
            HaveKind::Prefix => {
                self.chunk_len > 0
                    && self.bytes > 0
                    && self.bytes < size
                    && self.bytes.is_multiple_of(u64::from(self.chunk_len))
                    && self.digest.alg() == DigestAlg::Sha256
            }
            HaveKind::Complete | HaveKind::Digest => self.bytes == size && no_digest,
        }
    }

    /// A complete copy of `size` bytes under the final name (to be
    /// compared: COMPARE).
    pub fn complete(size: u64) -> Self {
        Self {
            kind: HaveKind::Complete,
            bytes: size,
            chunk_len: 0,
            digest: Digest::Crc32(0),
            note: String::new(),
        }
    }

    /// A request for the SHA-256 of the offered `size`-byte file (to be
    /// answered by COMPARE).
    pub fn ask_digest(size: u64) -> Self {
        Self {
            kind: HaveKind::Digest,
            ..Self::complete(size)
        }
    }

    /// Nothing to reuse, and why.
    pub fn nothing(note: impl Into<String>) -> Self {
        Self {
            kind: HaveKind::Nothing,
            bytes: 0,
            chunk_len: 0,
            digest: Digest::Crc32(0),
            note: clamp_string(note.into(), MAX_REASON),
        }
    }
}

impl Message {
    /// The message's type (its code and name).
    pub const fn message_type(&self) -> MessageType {
        match self {
            Self::Hello(_) => MessageType::Hello,
            Self::Batch(_) => MessageType::Batch,
            Self::Mr(_) => MessageType::Mr,
            Self::Reject(_) => MessageType::Reject,
            Self::Credit { .. } => MessageType::Credit,
            Self::Fin(_) => MessageType::Fin,
            Self::Ack(_) => MessageType::Ack,
            Self::Bye => MessageType::Bye,
            Self::Challenge(_) => MessageType::Challenge,
            Self::Auth { .. } => MessageType::Auth,
            Self::Keepalive => MessageType::Keepalive,
            Self::Prove(_) => MessageType::Prove,
            Self::AuthOk { .. } => MessageType::AuthOk,
            Self::Have(_) => MessageType::Have,
            Self::From { .. } => MessageType::From,
            Self::Compare { .. } => MessageType::Compare,
            Self::Relay(_) => MessageType::Relay,
            Self::Result(_) => MessageType::Result,
        }
    }

    /// The message's name in upper case ("HELLO"), for messages and logs.
    pub const fn kind(&self) -> &'static str {
        self.message_type().name()
    }

    /// The type code in the frame header.
    pub const fn type_code(&self) -> u8 {
        self.message_type().code()
    }
}

/// Why a buffer is not exactly one valid control message (decoding), or a
/// message cannot be encoded.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum WireError {
    /// Shorter than its header, or than the header's body length says.
    #[error("control message truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes the frame needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The header declares a body longer than [`MAX_BODY`].
    #[error("declared body length {len} exceeds the maximum of {max}", max = MAX_BODY)]
    Oversized {
        /// The declared length.
        len: usize,
    },
    /// Not [`MAGIC`]: not one of our frames.
    #[error("bad magic 0x{0:08x}: not an rdma-xfer control message")]
    BadMagic(u32),
    /// A framing version other than [`WIRE_VERSION`].
    #[error("unsupported wire version {0} (this build speaks {v})", v = WIRE_VERSION)]
    UnknownVersion(u8),
    /// A type code not in [`MessageType`].
    #[error("unknown message type {0}")]
    UnknownType(u8),
    /// The header's reserved flags are not 0.
    #[error("reserved header flags must be 0, got 0x{0:04x}")]
    BadFlags(u16),
    /// Bytes after the frame (a buffer must hold exactly one).
    #[error("{extra} stray bytes after the end of the frame")]
    TrailingBytes {
        /// How many.
        extra: usize,
    },
    /// The body ends inside a field.
    #[error("{kind} body ends early: a field needs {need} bytes but only {have} remain")]
    ShortBody {
        /// The message's kind.
        kind: &'static str,
        /// Bytes the field needs.
        need: usize,
        /// Bytes left in the body.
        have: usize,
    },
    /// The body has bytes after its last field.
    #[error("{kind} body has {extra} unused bytes at the end")]
    BodyTrailing {
        /// The message's kind.
        kind: &'static str,
        /// How many bytes.
        extra: usize,
    },
    /// A string field is not UTF-8.
    #[error("{field} is not valid UTF-8")]
    BadUtf8 {
        /// The field.
        field: &'static str,
    },
    /// A code (digest algorithm, reject code, ACK status) that is not known.
    #[error("unknown {field} value {value}")]
    BadEnum {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
    },
    /// A digest whose length does not fit its algorithm.
    #[error("{alg} digest must be {} bytes, got {len}", .alg.digest_len())]
    BadDigestLength {
        /// The algorithm.
        alg: DigestAlg,
        /// The digest's length.
        len: usize,
    },
    /// A variable-length field over its limit.
    #[error("{field} is {len} bytes, over the {max}-byte limit")]
    TooLong {
        /// The field.
        field: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An AUTH MAC or PROVE proof that is neither empty nor `auth::MAC_LEN` bytes.
    #[error(
        "AUTH or PROVE carries a {len}-byte MAC; it must be empty or {} bytes",
        MAC_LEN
    )]
    BadMacLength {
        /// The MAC's length.
        len: usize,
    },
    /// CHALLENGE flags this build does not know.
    #[error("unknown CHALLENGE flags 0x{0:04x}")]
    UnknownChallengeFlags(u16),
    /// HELLO's MTIME flag is set without an mtime, or the reverse.
    #[error("HELLO mtime flag and mtime field disagree")]
    MtimeFlag,
    /// HELLO's piece (`Hello::piece`) does not match its PIECE flag.
    #[error("HELLO piece present without the PIECE flag, or the reverse")]
    PieceFlag,
    /// An mtime with a billion nanoseconds or more.
    #[error("HELLO mtime has {nanos} nanoseconds (must be below 1000000000)")]
    BadMtime {
        /// The nanoseconds.
        nanos: u32,
    },
    /// RELAY without a host.
    #[error("RELAY names no host")]
    NoHops,
    /// More hosts than a relay chain may have.
    #[error("{count} hosts to relay to, over the limit of {max}")]
    TooManyHops {
        /// Hosts named.
        count: usize,
        /// The limit ([`MAX_RELAY_HOPS`]).
        max: usize,
    },
    /// A host in RELAY or RESULT that is empty or not printable ASCII.
    #[error("{field} {why}")]
    BadHost {
        /// The field.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// `encode` was given a buffer shorter than the message.
    #[error("output buffer too small: need {need} bytes, have {have}")]
    BufferTooSmall {
        /// Bytes the message needs.
        need: usize,
        /// Bytes in the buffer.
        have: usize,
    },
}

// Fixed body bytes per message (excluding the variable string/digest payload).
const HELLO_FIXED: usize = 2 + 4 + 2 + 8 + 4 + 1;
/// BATCH's member count; the members follow as HELLO bodies.
const BATCH_FIXED: usize = 2;
/// Room in a BATCH body for its members' HELLO bodies.
pub const BATCH_ROOM: usize = MAX_BODY - BATCH_FIXED;

/// Bytes a file's HELLO body takes in a BATCH (see [`BATCH_ROOM`]).
pub const fn batch_member_len(name: &str, mtime: bool) -> usize {
    HELLO_FIXED + name.len() + if mtime { MTIME_LEN } else { 0 }
}
const MR_BODY: usize = 8 + 4 + 4 + 4;
const REASON_FIXED: usize = 2 + 2;
const FIN_FIXED: usize = 8 + 8 + 1 + 2;
const CHALLENGE_BODY: usize = 2 + NONCE_LEN;
const AUTH_FIXED: usize = 2;
const PROVE_FIXED: usize = 2 + NONCE_LEN + 2;
/// HAVE without its digest and note: kind, bytes, chunk_len, digest
/// algorithm, digest length, note length.
const HAVE_FIXED: usize = 1 + 8 + 4 + 1 + 2 + 2;
const MTIME_LEN: usize = 8 + 4;
/// A piece: transfer, index, piece size, file size.
const PIECE_LEN: usize = 16 + 4 + 8 + 8;
/// RELAY's host count; the hosts follow, each with a u16 length.
const RELAY_FIXED: usize = 2;
/// A RELAY host's length field.
const RELAY_HOP_FIXED: usize = 2;
/// RESULT without its host and reason: kind, code, bytes, the two
/// lengths.
const RESULT_FIXED: usize = 1 + 2 + 8 + 2 + 2;
/// RESULT's kind byte of an ACK.
const RESULT_ACK: u8 = 0;
/// RESULT's kind byte of a REJECT.
const RESULT_REJECT: u8 = 1;
/// RESULT's kind byte of a host lost or not reached (its code is 0).
const RESULT_LOST: u8 = 2;

/// RELAY's body length, checking every host.
fn relay_len(relay: &Relay) -> Result<usize, WireError> {
    if relay.hops.is_empty() {
        return Err(WireError::NoHops);
    }
    let mut len = RELAY_FIXED;
    for hop in &relay.hops {
        check_host_bytes("RELAY hop", hop.as_bytes())?;
        len += RELAY_HOP_FIXED + hop.len();
    }
    if len > MAX_BODY {
        return Err(WireError::TooLong {
            field: "RELAY",
            len,
            max: MAX_BODY,
        });
    }
    Ok(len)
}

/// RESULT's body length, checking its host and reason.
fn result_len(r: &HopResult) -> Result<usize, WireError> {
    check_host_bytes("RESULT host", r.host.as_bytes())?;
    check_result_reason(r.reason.len())?;
    Ok(RESULT_FIXED + r.host.len() + r.reason.len())
}

fn check_result_reason(len: usize) -> Result<(), WireError> {
    if len > MAX_REASON {
        return Err(WireError::TooLong {
            field: "RESULT reason",
            len,
            max: MAX_REASON,
        });
    }
    Ok(())
}

fn check_mtime(h: &Hello) -> Result<usize, WireError> {
    let mtime = match (h.caps & hello_flags::MTIME != 0, h.mtime) {
        (true, Some(m)) if m.nanos >= 1_000_000_000 => {
            return Err(WireError::BadMtime { nanos: m.nanos });
        }
        (true, Some(_)) => MTIME_LEN,
        (false, None) => 0,
        _ => return Err(WireError::MtimeFlag),
    };
    let piece = match (h.caps & hello_flags::PIECE != 0, h.piece) {
        (true, Some(_)) => PIECE_LEN,
        (false, None) => 0,
        _ => return Err(WireError::PieceFlag),
    };
    Ok(mtime + piece)
}

/// AUTH carries no MAC (the sender has no token) or a whole HMAC-SHA256.
fn check_mac_len(len: usize) -> Result<(), WireError> {
    if len == 0 || len == MAC_LEN {
        Ok(())
    } else {
        Err(WireError::BadMacLength { len })
    }
}

fn check_challenge_flags(flags: u16) -> Result<(), WireError> {
    if flags & !CHALLENGE_FLAGS_KNOWN == 0 {
        Ok(())
    } else {
        Err(WireError::UnknownChallengeFlags(flags))
    }
}

/// Body length of `msg`, checking the single variable-length field against the frame limit.
fn body_len(msg: &Message) -> Result<usize, WireError> {
    let str_field = |field: &'static str, s: &str, fixed: usize| {
        let max = MAX_BODY - fixed;
        if s.len() > max {
            Err(WireError::TooLong {
                field,
                len: s.len(),
                max,
            })
        } else {
            Ok(fixed + s.len())
        }
    };
    match msg {
        Message::Hello(h) => {
            let extra = check_mtime(h)?;
            str_field("HELLO name", &h.name, HELLO_FIXED + extra)
        }
        Message::Batch(members) => {
            let mut len = BATCH_FIXED;
            for h in members {
                len += HELLO_FIXED + check_mtime(h)? + h.name.len();
            }
            if members.len() > usize::from(u16::MAX) || len > MAX_BODY {
                return Err(WireError::TooLong {
                    field: "BATCH",
                    len,
                    max: MAX_BODY,
                });
            }
            Ok(len)
        }
        Message::Mr(_) => Ok(MR_BODY),
        Message::Reject(r) => str_field("REJECT reason", &r.reason, REASON_FIXED),
        Message::Credit { .. } => Ok(4),
        Message::Fin(f) => Ok(FIN_FIXED + f.digest.alg().digest_len()),
        Message::Ack(a) => str_field("ACK reason", &a.reason, REASON_FIXED),
        Message::Bye | Message::Keepalive => Ok(0),
        Message::Challenge(c) => {
            check_challenge_flags(c.flags)?;
            Ok(CHALLENGE_BODY)
        }
        Message::Auth { mac } => {
            check_mac_len(mac.len())?;
            Ok(AUTH_FIXED + mac.len())
        }
        Message::Prove(p) => {
            check_mac_len(p.proof.len())?;
            Ok(PROVE_FIXED + p.proof.len())
        }
        Message::AuthOk { .. } => Ok(MAC_LEN),
        Message::Have(h) => str_field(
            "HAVE note",
            &h.note,
            HAVE_FIXED + h.digest.alg().digest_len(),
        ),
        Message::From { .. } => Ok(8),
        Message::Compare { .. } => Ok(32),
        Message::Relay(relay) => relay_len(relay),
        Message::Result(r) => result_len(r),
    }
}

/// Encoded frame length of `msg`.
pub fn encoded_len(msg: &Message) -> Result<usize, WireError> {
    Ok(HEADER_LEN + body_len(msg)?)
}

struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) -> Result<(), WireError> {
        let have = self.buf.len();
        let end = self
            .pos
            .checked_add(bytes.len())
            .ok_or(WireError::BufferTooSmall {
                need: usize::MAX,
                have,
            })?;
        let dst = self
            .buf
            .get_mut(self.pos..end)
            .ok_or(WireError::BufferTooSmall { need: end, have })?;
        dst.copy_from_slice(bytes);
        self.pos = end;
        Ok(())
    }

    fn u8(&mut self, v: u8) -> Result<(), WireError> {
        self.put(&[v])
    }
    fn u16(&mut self, v: u16) -> Result<(), WireError> {
        self.put(&v.to_be_bytes())
    }
    fn u32(&mut self, v: u32) -> Result<(), WireError> {
        self.put(&v.to_be_bytes())
    }
    fn u64(&mut self, v: u64) -> Result<(), WireError> {
        self.put(&v.to_be_bytes())
    }

    /// A HELLO's body (also a BATCH member).
    fn hello(&mut self, h: &Hello) -> Result<(), WireError> {
        self.u16(h.version)?;
        self.u32(h.caps)?;
        self.bytes16("HELLO name", h.name.as_bytes())?;
        self.u64(h.size)?;
        self.u32(h.mode)?;
        self.u8(h.digest as u8)?;
        if let Some(m) = h.mtime {
            self.u64(m.secs as u64)?;
            self.u32(m.nanos)?;
        }
        if let Some(p) = h.piece {
            self.put(&p.transfer.0)?;
            self.u32(p.index)?;
            self.u64(p.piece_size)?;
            self.u64(p.file_size)?;
        }
        Ok(())
    }

    /// A digest: its algorithm's code, then its bytes with a u16 length.
    fn digest(&mut self, field: &'static str, d: &Digest) -> Result<(), WireError> {
        self.u8(d.alg() as u8)?;
        match d {
            Digest::Crc32(v) => self.bytes16(field, &v.to_be_bytes()),
            Digest::Sha256(b) => self.bytes16(field, b),
        }
    }

    fn bytes16(&mut self, field: &'static str, b: &[u8]) -> Result<(), WireError> {
        let len = u16::try_from(b.len()).map_err(|_| WireError::TooLong {
            field,
            len: b.len(),
            max: u16::MAX.into(),
        })?;
        self.u16(len)?;
        self.put(b)
    }
}

/// Encodes `msg` into the start of `out` (e.g. registered memory); returns the frame length.
pub fn encode(msg: &Message, out: &mut [u8]) -> Result<usize, WireError> {
    let body = body_len(msg)?;
    let need = HEADER_LEN + body;
    if out.len() < need {
        return Err(WireError::BufferTooSmall {
            need,
            have: out.len(),
        });
    }
    let body_u32 = u32::try_from(body).map_err(|_| WireError::Oversized { len: body })?;
    let mut w = Writer { buf: out, pos: 0 };
    w.u32(MAGIC)?;
    w.u8(WIRE_VERSION)?;
    w.u8(msg.type_code())?;
    w.u16(0)?;
    w.u32(body_u32)?;
    match msg {
        Message::Hello(h) => w.hello(h)?,
        Message::Batch(members) => {
            // body_len checked the count.
            w.u16(members.len() as u16)?;
            for h in members {
                w.hello(h)?;
            }
        }
        Message::Mr(r) => {
            w.u64(r.addr)?;
            w.u32(r.rkey)?;
            w.u32(r.slot_size)?;
            w.u32(r.slot_count)?;
        }
        Message::Reject(r) => {
            w.u16(r.code as u16)?;
            w.bytes16("REJECT reason", r.reason.as_bytes())?;
        }
        Message::Credit { count } => w.u32(*count)?,
        Message::Fin(f) => {
            w.u64(f.bytes)?;
            w.u64(f.chunks)?;
            w.digest("FIN digest", &f.digest)?;
        }
        Message::Ack(a) => {
            w.u16(a.status as u16)?;
            w.bytes16("ACK reason", a.reason.as_bytes())?;
        }
        Message::Bye | Message::Keepalive => {}
        Message::Challenge(c) => {
            w.u16(c.flags)?;
            w.put(&c.nonce)?;
        }
        Message::Auth { mac } => w.bytes16("AUTH mac", mac)?,
        Message::Prove(p) => {
            w.u16(p.version)?;
            w.put(&p.nonce)?;
            w.bytes16("PROVE proof", &p.proof)?;
        }
        Message::AuthOk { proof } => w.put(proof)?,
        Message::Have(h) => {
            w.u8(h.kind as u8)?;
            w.u64(h.bytes)?;
            w.u32(h.chunk_len)?;
            w.digest("HAVE digest", &h.digest)?;
            w.bytes16("HAVE note", h.note.as_bytes())?;
        }
        Message::From { offset } => w.u64(*offset)?,
        Message::Compare { sha256 } => w.put(sha256)?,
        Message::Relay(relay) => {
            // relay_len checked the count (a body holds far fewer than 2^16).
            w.u16(relay.hops.len() as u16)?;
            for hop in &relay.hops {
                w.bytes16("RELAY hop", hop.as_bytes())?;
            }
        }
        Message::Result(r) => {
            let (kind, code) = match r.verdict {
                HopVerdict::Ack(status) => (RESULT_ACK, status as u16),
                HopVerdict::Reject(code) => (RESULT_REJECT, code as u16),
                HopVerdict::Lost => (RESULT_LOST, 0),
            };
            w.u8(kind)?;
            w.u16(code)?;
            w.u64(r.bytes)?;
            w.bytes16("RESULT host", r.host.as_bytes())?;
            w.bytes16("RESULT reason", r.reason.as_bytes())?;
        }
    }
    Ok(w.pos)
}

/// Encodes one message into a new buffer of exactly its length.
pub fn encode_to_vec(msg: &Message) -> Result<Vec<u8>, WireError> {
    let mut out = vec![0u8; encoded_len(msg)?];
    let n = encode(msg, &mut out)?;
    out.truncate(n);
    Ok(out)
}

struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    kind: &'static str,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let have = self.buf.len().saturating_sub(self.pos);
        let short = WireError::ShortBody {
            kind: self.kind,
            need: n,
            have,
        };
        let end = self.pos.checked_add(n).ok_or(short.clone())?;
        let s = self.buf.get(self.pos..end).ok_or(short)?;
        self.pos = end;
        Ok(s)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let kind = self.kind;
        let s = self.take(N)?;
        <[u8; N]>::try_from(s).map_err(|_| WireError::ShortBody {
            kind,
            need: N,
            have: s.len(),
        })
    }

    fn u8(&mut self) -> Result<u8, WireError> {
        Ok(u8::from_be_bytes(self.array()?))
    }
    fn u16(&mut self) -> Result<u16, WireError> {
        Ok(u16::from_be_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32, WireError> {
        Ok(u32::from_be_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64, WireError> {
        Ok(u64::from_be_bytes(self.array()?))
    }

    /// A digest as `Writer::digest` writes it.
    fn digest(&mut self) -> Result<Digest, WireError> {
        let a = self.u8()?;
        let alg = DigestAlg::from_u8(a).ok_or(WireError::BadEnum {
            field: "digest algorithm",
            value: a.into(),
        })?;
        let raw = self.bytes16()?;
        let bad_len = WireError::BadDigestLength {
            alg,
            len: raw.len(),
        };
        Ok(match alg {
            DigestAlg::Crc32 => {
                Digest::Crc32(u32::from_be_bytes(raw.try_into().map_err(|_| bad_len)?))
            }
            DigestAlg::Sha256 => Digest::Sha256(raw.try_into().map_err(|_| bad_len)?),
        })
    }

    /// A HELLO's body as `Writer::hello` writes it.
    fn hello(&mut self) -> Result<Hello, WireError> {
        let version = self.u16()?;
        let caps = self.u32()?;
        let name = self.string("HELLO name")?;
        let size = self.u64()?;
        let mode = self.u32()?;
        let alg = self.u8()?;
        let digest = DigestAlg::from_u8(alg).ok_or(WireError::BadEnum {
            field: "digest algorithm",
            value: alg.into(),
        })?;
        let mtime = if caps & hello_flags::MTIME != 0 {
            let secs = self.u64()? as i64;
            let nanos = self.u32()?;
            if nanos >= 1_000_000_000 {
                return Err(WireError::BadMtime { nanos });
            }
            Some(Mtime { secs, nanos })
        } else {
            None
        };
        let piece = if caps & hello_flags::PIECE != 0 {
            let mut transfer = [0u8; 16];
            transfer.copy_from_slice(self.take(16)?);
            Some(Piece {
                transfer: TransferId(transfer),
                index: self.u32()?,
                piece_size: self.u64()?,
                file_size: self.u64()?,
            })
        } else {
            None
        };
        Ok(Hello {
            version,
            caps,
            name,
            size,
            mode,
            digest,
            mtime,
            piece,
        })
    }

    fn bytes16(&mut self) -> Result<&'a [u8], WireError> {
        let len = self.u16()?;
        self.take(len.into())
    }

    /// A host as RELAY and RESULT carry it (see `check_host`).
    fn host(&mut self, field: &'static str) -> Result<String, WireError> {
        let b = self.bytes16()?;
        check_host_bytes(field, b)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| WireError::BadUtf8 { field })
    }

    fn string(&mut self, field: &'static str) -> Result<String, WireError> {
        let b = self.bytes16()?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| WireError::BadUtf8 { field })
    }

    fn finish(&self) -> Result<(), WireError> {
        let extra = self.buf.len().saturating_sub(self.pos);
        if extra == 0 {
            Ok(())
        } else {
            Err(WireError::BodyTrailing {
                kind: self.kind,
                extra,
            })
        }
    }
}

/// Decodes exactly one frame; `buf` must be the whole frame and nothing more.
pub fn decode(buf: &[u8]) -> Result<Message, WireError> {
    let header = buf.get(..HEADER_LEN).ok_or(WireError::Truncated {
        need: HEADER_LEN,
        have: buf.len(),
    })?;
    let mut h = Reader {
        buf: header,
        pos: 0,
        kind: "header",
    };
    let magic = h.u32()?;
    if magic != MAGIC {
        return Err(WireError::BadMagic(magic));
    }
    let version = h.u8()?;
    if version != WIRE_VERSION {
        return Err(WireError::UnknownVersion(version));
    }
    let ty = h.u8()?;
    let flags = h.u16()?;
    if flags != 0 {
        return Err(WireError::BadFlags(flags));
    }
    let ty = MessageType::from_code(ty).ok_or(WireError::UnknownType(ty))?;
    let kind = ty.name();
    let declared = h.u32()?;
    let body_len = usize::try_from(declared)
        .ok()
        .filter(|&l| l <= MAX_BODY)
        .ok_or(WireError::Oversized {
            len: usize::try_from(declared).unwrap_or(usize::MAX),
        })?;
    let need = HEADER_LEN + body_len;
    if buf.len() < need {
        return Err(WireError::Truncated {
            need,
            have: buf.len(),
        });
    }
    if buf.len() > need {
        return Err(WireError::TrailingBytes {
            extra: buf.len() - need,
        });
    }
    let body = buf.get(HEADER_LEN..need).ok_or(WireError::Truncated {
        need,
        have: buf.len(),
    })?;
    let mut r = Reader {
        buf: body,
        pos: 0,
        kind,
    };
    let msg = match ty {
        MessageType::Hello => Message::Hello(r.hello()?),
        MessageType::Batch => {
            let count = r.u16()?;
            let mut members = Vec::with_capacity(count.min(64).into());
            for _ in 0..count {
                members.push(r.hello()?);
            }
            Message::Batch(members)
        }
        MessageType::Mr => Message::Mr(RingInfo {
            addr: r.u64()?,
            rkey: r.u32()?,
            slot_size: r.u32()?,
            slot_count: r.u32()?,
        }),
        MessageType::Reject => {
            let v = r.u16()?;
            let code = RejectCode::from_u16(v).ok_or(WireError::BadEnum {
                field: "reject code",
                value: v.into(),
            })?;
            let reason = r.string("REJECT reason")?;
            Message::Reject(Reject { code, reason })
        }
        MessageType::Credit => Message::Credit { count: r.u32()? },
        MessageType::Fin => {
            let bytes = r.u64()?;
            let chunks = r.u64()?;
            let digest = r.digest()?;
            Message::Fin(Fin {
                bytes,
                chunks,
                digest,
            })
        }
        MessageType::Ack => {
            let v = r.u16()?;
            let status = AckStatus::from_u16(v).ok_or(WireError::BadEnum {
                field: "ack status",
                value: v.into(),
            })?;
            let reason = r.string("ACK reason")?;
            Message::Ack(Ack { status, reason })
        }
        MessageType::Challenge => {
            let flags = r.u16()?;
            check_challenge_flags(flags)?;
            Message::Challenge(Challenge {
                flags,
                nonce: r.array()?,
            })
        }
        MessageType::Auth => {
            let mac = r.bytes16()?;
            check_mac_len(mac.len())?;
            Message::Auth { mac: mac.to_vec() }
        }
        MessageType::Keepalive => Message::Keepalive,
        MessageType::Prove => {
            let version = r.u16()?;
            let nonce = r.array()?;
            let proof = r.bytes16()?;
            check_mac_len(proof.len())?;
            Message::Prove(Prove {
                version,
                nonce,
                proof: proof.to_vec(),
            })
        }
        MessageType::AuthOk => Message::AuthOk { proof: r.array()? },
        MessageType::Have => {
            let v = r.u8()?;
            let kind = HaveKind::from_u8(v).ok_or(WireError::BadEnum {
                field: "HAVE kind",
                value: v.into(),
            })?;
            Message::Have(Have {
                kind,
                bytes: r.u64()?,
                chunk_len: r.u32()?,
                digest: r.digest()?,
                note: r.string("HAVE note")?,
            })
        }
        MessageType::From => Message::From { offset: r.u64()? },
        MessageType::Compare => Message::Compare { sha256: r.array()? },
        MessageType::Bye => Message::Bye,
        MessageType::Relay => {
            let count = r.u16()?;
            if count == 0 {
                return Err(WireError::NoHops);
            }
            let mut hops = Vec::with_capacity(count.min(64).into());
            for _ in 0..count {
                hops.push(r.host("RELAY hop")?);
            }
            Message::Relay(Relay { hops })
        }
        MessageType::Result => {
            let kind = r.u8()?;
            let v = r.u16()?;
            let verdict = match kind {
                RESULT_ACK => {
                    HopVerdict::Ack(AckStatus::from_u16(v).ok_or(WireError::BadEnum {
                        field: "RESULT ack status",
                        value: v.into(),
                    })?)
                }
                RESULT_REJECT => {
                    HopVerdict::Reject(RejectCode::from_u16(v).ok_or(WireError::BadEnum {
                        field: "RESULT reject code",
                        value: v.into(),
                    })?)
                }
                RESULT_LOST if v == 0 => HopVerdict::Lost,
                RESULT_LOST => {
                    return Err(WireError::BadEnum {
                        field: "RESULT lost code",
                        value: v.into(),
                    });
                }
                _ => {
                    return Err(WireError::BadEnum {
                        field: "RESULT kind",
                        value: kind.into(),
                    });
                }
            };
            let bytes = r.u64()?;
            let host = r.host("RESULT host")?;
            let reason = r.string("RESULT reason")?;
            check_result_reason(reason.len())?;
            Message::Result(HopResult {
                host,
                verdict,
                bytes,
                reason,
            })
        }
    };
    r.finish()?;
    Ok(msg)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn one_table_gives_each_type_its_code_and_name_and_the_docs_agree() {
        for (i, ty) in MessageType::ALL.iter().enumerate() {
            assert_eq!(usize::from(ty.code()), i + 1, "{ty:?}: codes are 1, 2, ...");
            assert_eq!(MessageType::from_code(ty.code()), Some(*ty));
        }
        assert_eq!(MessageType::from_code(0), None);
        let past = u8::try_from(MessageType::ALL.len() + 1).unwrap();
        assert_eq!(MessageType::from_code(past), None);
        // docs/protocol.md's table of type codes lists exactly these.
        let doc = include_str!("../../docs/protocol.md");
        let table = doc
            .split("### Type codes")
            .nth(1)
            .and_then(|t| t.split("\n## ").next())
            .expect("docs/protocol.md has a table of type codes");
        let listed: Vec<(u8, String)> = table
            .lines()
            .filter_map(|l| {
                let mut cells = l.split('|').map(str::trim).skip(1);
                let code = cells.next()?.parse().ok()?;
                Some((code, cells.next()?.to_string()))
            })
            .collect();
        let want: Vec<(u8, String)> = MessageType::ALL
            .iter()
            .map(|t| (t.code(), t.name().to_string()))
            .collect();
        assert_eq!(listed, want);
    }

    fn sha() -> [u8; 32] {
        let mut b = [0u8; 32];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i as u8).wrapping_mul(37);
        }
        b
    }

    fn hello(name: &str, size: u64) -> Message {
        Message::Hello(Hello {
            version: 1,
            caps: CAP_NONE,
            name: name.into(),
            size,
            mode: 0o644,
            digest: DigestAlg::Sha256,
            mtime: None,
            piece: None,
        })
    }

    fn flagged(name: &str, caps: u32, mtime: Option<Mtime>) -> Message {
        Message::Hello(Hello {
            version: 2,
            caps,
            name: name.into(),
            size: 0,
            mode: 0o755,
            digest: DigestAlg::Crc32,
            mtime,
            piece: None,
        })
    }

    /// One or more samples of every variant, including edge values.
    pub(crate) fn samples() -> Vec<Message> {
        let max_name = "n".repeat(MAX_BODY - HELLO_FIXED);
        let max_reason = "r".repeat(MAX_BODY - REASON_FIXED);
        let mut v = vec![
            hello("file.bin", 12345),
            hello("", 0),
            hello("ünïcødé 文件.txt", u64::MAX),
            hello(&max_name, 1),
            Message::Hello(Hello {
                version: u16::MAX,
                caps: !(hello_flags::MTIME | hello_flags::PIECE),
                name: "x".into(),
                size: 0,
                mode: u32::MAX,
                digest: DigestAlg::Crc32,
                mtime: None,
                piece: None,
            }),
            Message::Hello(Hello {
                version: u16::MAX,
                caps: u32::MAX,
                name: "y".into(),
                size: u64::MAX,
                mode: u32::MAX,
                digest: DigestAlg::Sha256,
                mtime: Some(Mtime {
                    secs: i64::MAX,
                    nanos: 999_999_999,
                }),
                piece: Some(Piece {
                    transfer: TransferId([0xa5; 16]),
                    index: u32::MAX,
                    piece_size: u64::MAX,
                    file_size: 1,
                }),
            }),
            flagged("stdin", hello_flags::STREAM, None),
            flagged("a/b/c", hello_flags::DIRECTORY, None),
            flagged("kept", hello_flags::KEEP_MODE, None),
            flagged("sum", hello_flags::CHECKSUM, None),
            flagged(
                "dir/sub",
                hello_flags::DIRECTORY | hello_flags::MTIME,
                Some(Mtime {
                    secs: 1_700_000_000,
                    nanos: 123_456_789,
                }),
            ),
            flagged(
                "old",
                hello_flags::MTIME,
                Some(Mtime {
                    secs: i64::MIN,
                    nanos: 999_999_999,
                }),
            ),
            flagged(
                &"m".repeat(MAX_BODY - HELLO_FIXED - MTIME_LEN),
                hello_flags::MTIME | hello_flags::STREAM,
                Some(Mtime { secs: -1, nanos: 0 }),
            ),
            // Unknown flags pass the codec (the receiver refuses them).
            flagged("x", 1 << 31 | hello_flags::STREAM, None),
            Message::Keepalive,
            Message::Mr(RingInfo::default()),
            Message::Mr(RingInfo {
                addr: u64::MAX,
                rkey: u32::MAX,
                slot_size: u32::MAX,
                slot_count: u32::MAX,
            }),
            Message::Mr(RingInfo {
                addr: 0x7f00_dead_beef,
                rkey: 0x1234,
                slot_size: 1 << 20,
                slot_count: 16,
            }),
            Message::Credit { count: 0 },
            Message::Credit { count: u32::MAX },
            Message::Fin(Fin {
                bytes: 0,
                chunks: 0,
                digest: Digest::Crc32(0),
            }),
            Message::Fin(Fin {
                bytes: u64::MAX,
                chunks: u64::MAX,
                digest: Digest::Crc32(0xdead_beef),
            }),
            Message::Fin(Fin {
                bytes: 42,
                chunks: 1,
                digest: Digest::Sha256(sha()),
            }),
            Message::Reject(Reject::new(RejectCode::Protocol, max_reason.clone())),
            Message::Ack(Ack {
                status: AckStatus::Rejected,
                reason: max_reason,
            }),
            Message::Bye,
            Message::Challenge(Challenge {
                flags: 0,
                nonce: [0; NONCE_LEN],
            }),
            Message::Challenge(Challenge {
                flags: crate::proto::auth::AUTH_REQUIRED,
                nonce: sha(),
            }),
            Message::Challenge(Challenge {
                flags: crate::proto::auth::AUTH_REQUIRED,
                nonce: [0xff; NONCE_LEN],
            }),
            Message::Auth { mac: Vec::new() },
            Message::Auth {
                mac: sha().to_vec(),
            },
            Message::Auth {
                mac: vec![0xff; MAC_LEN],
            },
            Message::Prove(Prove {
                version: 3,
                nonce: sha(),
                proof: Vec::new(),
            }),
            Message::Prove(Prove {
                version: u16::MAX,
                nonce: [0xff; NONCE_LEN],
                proof: sha().to_vec(),
            }),
            Message::AuthOk { proof: sha() },
            Message::Have(Have::nothing("no partial file")),
            Message::Have(Have {
                kind: HaveKind::Prefix,
                bytes: 3 << 20,
                chunk_len: 1 << 20,
                digest: Digest::Sha256(sha()),
                note: String::new(),
            }),
            Message::Have(Have::complete(10)),
            Message::Have(Have::ask_digest(0)),
            Message::Have(Have::ask_digest(u64::MAX)),
            Message::From { offset: 0 },
            Message::From { offset: u64::MAX },
            Message::Compare { sha256: sha() },
            Message::AuthOk {
                proof: [0; MAC_LEN],
            },
        ];
        for code in RejectCode::ALL {
            v.push(Message::Reject(Reject::new(code, code.as_str())));
        }
        for status in AckStatus::ALL {
            v.push(Message::Ack(Ack::new(status, "")));
        }
        v.extend(batch_samples());
        v.extend(relay_samples());
        v
    }

    /// A hop of `len` bytes, different for each `i`.
    fn hop(i: usize, len: usize) -> String {
        let mut h = format!("h{i}:");
        while h.len() < len {
            h.push(char::from(b'!' + (h.len() % 94) as u8));
        }
        h.truncate(len);
        h
    }

    fn result(host: &str, verdict: HopVerdict, bytes: u64, reason: &str) -> Message {
        Message::Result(HopResult {
            host: host.into(),
            verdict,
            bytes,
            reason: reason.into(),
        })
    }

    /// RELAY and RESULT at their edges.
    fn relay_samples() -> Vec<Message> {
        // As many 255-byte hosts as fit a body.
        let per = RELAY_HOP_FIXED + MAX_HOST_LEN;
        let full = (0..(MAX_BODY - RELAY_FIXED) / per)
            .map(|i| hop(i, MAX_HOST_LEN))
            .collect();
        let mut v = vec![
            Message::Relay(Relay {
                hops: vec!["b:7471".into()],
            }),
            Message::Relay(Relay {
                hops: vec!["[fe80::1%eth0]:7471".into(), "x".into(), "~".repeat(255)],
            }),
            Message::Relay(Relay { hops: full }),
            result("b:7471", HopVerdict::Ack(AckStatus::Ok), 12345, ""),
            result(
                &"z".repeat(MAX_HOST_LEN),
                HopVerdict::Reject(RejectCode::Auth),
                u64::MAX,
                &"r".repeat(MAX_REASON),
            ),
            result("h", HopVerdict::Ack(AckStatus::Io), 0, "ünïcødé: disk full"),
            result("l", HopVerdict::Lost, 0, "connection lost"),
        ];
        for status in AckStatus::ALL {
            v.push(result("a", HopVerdict::Ack(status), 1, status.as_str()));
        }
        for code in RejectCode::ALL {
            v.push(result("r", HopVerdict::Reject(code), 0, code.as_str()));
        }
        v
    }

    #[test]
    fn relay_layout_and_refusals() {
        let m = Message::Relay(Relay {
            hops: vec!["ab".into(), "c:1".into()],
        });
        let buf = encode_to_vec(&m).unwrap();
        assert_eq!(buf[5], MessageType::Relay.code());
        // Count, then each host with a u16 length.
        assert_eq!(&buf[12..], b"\0\x02\0\x02ab\0\x03c:1");
        let refused = |hops: Vec<String>| encode_to_vec(&Message::Relay(Relay { hops }));
        assert_eq!(refused(Vec::new()), Err(WireError::NoHops));
        for bad in ["", "a b", "tab\there", "caf\u{e9}:1", "nul\0", "del\x7f"] {
            assert!(
                matches!(
                    refused(vec!["ok".into(), bad.into()]),
                    Err(WireError::BadHost {
                        field: "RELAY hop",
                        ..
                    })
                ),
                "{bad:?}"
            );
        }
        assert_eq!(
            refused(vec!["h".repeat(256)]),
            Err(WireError::TooLong {
                field: "RELAY hop",
                len: 256,
                max: MAX_HOST_LEN
            })
        );
        // One host more than fits a body.
        let per = RELAY_HOP_FIXED + MAX_HOST_LEN;
        let over = (0..=(MAX_BODY - RELAY_FIXED) / per)
            .map(|i| hop(i, MAX_HOST_LEN))
            .collect();
        assert!(matches!(
            refused(over),
            Err(WireError::TooLong { field: "RELAY", .. })
        ));
        // Decoding: the same checks on the received bytes.
        let with = |body: &[u8]| {
            let mut b = encode_to_vec(&m).unwrap();
            b.truncate(HEADER_LEN);
            b.extend_from_slice(body);
            set_body_len(&mut b, body.len() as u32);
            decode(&b)
        };
        assert_eq!(
            with(b"\0\x01\0\x02ab"),
            Ok(Message::Relay(Relay {
                hops: vec!["ab".into()]
            }))
        );
        assert_eq!(with(b"\0\0"), Err(WireError::NoHops));
        assert!(matches!(
            with(b"\0\x01\0\0"),
            Err(WireError::BadHost { .. })
        ));
        assert!(matches!(
            with(b"\0\x01\0\x02a "),
            Err(WireError::BadHost { .. })
        ));
        assert!(matches!(
            with(b"\0\x01\0\x02\xc3\xa9"),
            Err(WireError::BadHost { .. })
        ));
        assert!(matches!(
            with(b"\0\x02\0\x02ab"),
            Err(WireError::ShortBody { kind: "RELAY", .. })
        ));
        assert!(matches!(
            with(b"\0\x01\0\x02abc"),
            Err(WireError::BodyTrailing {
                kind: "RELAY",
                extra: 1
            })
        ));
        assert!(matches!(with(b"\0"), Err(WireError::ShortBody { .. })));
        let mut long = b"\0\x01\x01\0".to_vec();
        long.extend_from_slice(&[b'h'; 256]);
        assert_eq!(
            with(&long),
            Err(WireError::TooLong {
                field: "RELAY hop",
                len: 256,
                max: MAX_HOST_LEN
            })
        );
        assert_eq!(check_host("a:1"), Ok(()));
        assert!(check_host(" ").is_err() && check_host("").is_err());
    }

    #[test]
    fn result_layout_and_refusals() {
        let m = result("ab", HopVerdict::Reject(RejectCode::Exists), 0x0102, "why");
        let buf = encode_to_vec(&m).unwrap();
        assert_eq!(buf[5], MessageType::Result.code());
        // Kind, code, bytes, host, reason.
        assert_eq!(
            &buf[12..],
            b"\x01\0\x02\0\0\0\0\0\0\x01\x02\0\x02ab\0\x03why"
        );
        let ack =
            encode_to_vec(&result("h", HopVerdict::Ack(AckStatus::KeptNewer), 0, "")).unwrap();
        assert_eq!(&ack[12..15], &[0, 0, 7]);
        let refused = |host: &str, reason: &str| {
            encode_to_vec(&result(host, HopVerdict::Ack(AckStatus::Ok), 0, reason))
        };
        assert!(matches!(
            refused("", ""),
            Err(WireError::BadHost {
                field: "RESULT host",
                ..
            })
        ));
        assert!(matches!(
            refused("a\nb", ""),
            Err(WireError::BadHost { .. })
        ));
        assert!(matches!(
            refused(&"h".repeat(256), ""),
            Err(WireError::TooLong {
                field: "RESULT host",
                len: 256,
                ..
            })
        ));
        assert_eq!(
            refused("h", &"r".repeat(MAX_REASON + 1)),
            Err(WireError::TooLong {
                field: "RESULT reason",
                len: MAX_REASON + 1,
                max: MAX_REASON
            })
        );
        // HopResult::new cuts the reason so it always encodes.
        let cut = HopResult::new(
            "h".into(),
            HopVerdict::Ack(AckStatus::Io),
            1,
            "é".repeat(MAX_REASON),
        );
        assert!(cut.reason.len() <= MAX_REASON);
        assert!(encode_to_vec(&Message::Result(cut)).is_ok());
        // Decoding: unknown kinds and codes, bad hosts, long reasons.
        let mut b = buf.clone();
        for kind in [3u8, 255] {
            b[12] = kind;
            assert_eq!(
                decode(&b),
                Err(WireError::BadEnum {
                    field: "RESULT kind",
                    value: kind.into()
                })
            );
        }
        // A lost host has no code: any but 0 is refused.
        b[12] = RESULT_LOST;
        assert_eq!(
            decode(&b),
            Err(WireError::BadEnum {
                field: "RESULT lost code",
                value: 2
            })
        );
        let mut b = buf.clone();
        for v in [0u16, 10, u16::MAX] {
            b[13..15].copy_from_slice(&v.to_be_bytes());
            assert_eq!(
                decode(&b),
                Err(WireError::BadEnum {
                    field: "RESULT reject code",
                    value: v.into()
                })
            );
        }
        b[12] = 0;
        for v in [10u16, u16::MAX] {
            b[13..15].copy_from_slice(&v.to_be_bytes());
            assert_eq!(
                decode(&b),
                Err(WireError::BadEnum {
                    field: "RESULT ack status",
                    value: v.into()
                })
            );
        }
        let mut b = buf.clone();
        b[25] = b' ';
        assert!(matches!(
            decode(&b),
            Err(WireError::BadHost {
                field: "RESULT host",
                ..
            })
        ));
        let mut b = buf.clone();
        b[29] = 0xff;
        assert_eq!(
            decode(&b),
            Err(WireError::BadUtf8 {
                field: "RESULT reason"
            })
        );
        // A reason over MAX_REASON still fits a body: refused when decoded.
        let mut b = buf[..HEADER_LEN + 15].to_vec();
        b.extend_from_slice(&((MAX_REASON + 1) as u16).to_be_bytes());
        b.extend(std::iter::repeat_n(b'r', MAX_REASON + 1));
        let len = (b.len() - HEADER_LEN) as u32;
        set_body_len(&mut b, len);
        assert_eq!(
            decode(&b),
            Err(WireError::TooLong {
                field: "RESULT reason",
                len: MAX_REASON + 1,
                max: MAX_REASON
            })
        );
    }

    #[test]
    fn relay_lists_split_into_as_few_messages_as_fit_and_join_back() {
        let longest: Vec<String> = (0..MAX_RELAY_HOPS).map(|i| hop(i, MAX_HOST_LEN)).collect();
        let per = (MAX_BODY - RELAY_FIXED) / (RELAY_HOP_FIXED + MAX_HOST_LEN);
        let parts = relay_messages(&longest).unwrap();
        assert_eq!(parts.len(), MAX_RELAY_HOPS.div_ceil(per));
        for p in &parts {
            let b = encode_to_vec(&Message::Relay(p.clone())).unwrap();
            // Sealed, it fits a receive buffer.
            assert!(b.len() + crate::proto::SEAL_LEN <= MAX_MESSAGE);
            assert_eq!(decode(&b).unwrap(), Message::Relay(p.clone()));
        }
        let joined: Vec<String> = parts.into_iter().flat_map(|p| p.hops).collect();
        assert_eq!(joined, longest);
        // Mixed lengths: in order, each message full but for the last.
        let mixed: Vec<String> = (0..MAX_RELAY_HOPS).map(|i| hop(i, 1 + i % 255)).collect();
        let parts = relay_messages(&mixed).unwrap();
        for (i, p) in parts.iter().enumerate() {
            let len = relay_len(p).unwrap();
            if let Some(next) = parts.get(i + 1) {
                assert!(len + RELAY_HOP_FIXED + next.hops[0].len() > MAX_BODY);
            }
        }
        let joined: Vec<String> = parts.into_iter().flat_map(|p| p.hops).collect();
        assert_eq!(joined, mixed);
        // Short lists: one message.
        assert_eq!(
            relay_messages(&["a:1".into()]).unwrap(),
            vec![Relay {
                hops: vec!["a:1".into()]
            }]
        );
        // Refusals.
        assert_eq!(relay_messages(&[]), Err(WireError::NoHops));
        let mut too_many = longest.clone();
        too_many.push("x".into());
        assert_eq!(
            relay_messages(&too_many),
            Err(WireError::TooManyHops {
                count: MAX_RELAY_HOPS + 1,
                max: MAX_RELAY_HOPS
            })
        );
        for bad in ["", "a b", "é"] {
            assert!(
                relay_messages(&["ok".into(), bad.into()]).is_err(),
                "{bad:?}"
            );
        }
        assert!(relay_messages(&["h".repeat(256)]).is_err());
    }

    fn member(name: &str, size: u64, mtime: Option<Mtime>) -> Hello {
        Hello {
            version: 4,
            caps: if mtime.is_some() {
                hello_flags::MTIME
            } else {
                0
            },
            name: name.into(),
            size,
            mode: 0o640,
            digest: DigestAlg::Sha256,
            mtime,
            piece: None,
        }
    }

    fn batch_samples() -> Vec<Message> {
        let t = Some(Mtime {
            secs: -5,
            nanos: 999_999_999,
        });
        // As many one-letter members as fit a body exactly.
        let per = batch_member_len("a", false);
        let full = (0..BATCH_ROOM / per)
            .map(|i| member("a", i as u64, None))
            .collect();
        vec![
            Message::Batch(Vec::new()),
            Message::Batch(vec![member("d/a", 1, None), member("d/b", 0, t)]),
            Message::Batch(vec![member("x", u64::MAX, t)]),
            Message::Batch(full),
        ]
    }

    #[test]
    fn batch_layout_and_limits() {
        let m = Message::Batch(vec![
            member("ab", 7, None),
            member("c", 0, Some(Mtime { secs: 1, nanos: 2 })),
        ]);
        let buf = encode_to_vec(&m).unwrap();
        // Header, count 2, then each member exactly as a HELLO body.
        assert_eq!(buf[5], MessageType::Batch.code());
        assert_eq!(&buf[12..14], &[0, 2]);
        let Message::Batch(members) = &m else {
            unreachable!()
        };
        let mut at = 14;
        for h in members {
            let alone = encode_to_vec(&Message::Hello(h.clone())).unwrap();
            let body = &alone[HEADER_LEN..];
            assert_eq!(&buf[at..at + body.len()], body);
            assert_eq!(body.len(), batch_member_len(&h.name, h.mtime.is_some()));
            at += body.len();
        }
        assert_eq!(at, buf.len());
        // One member more than fits: refused when encoding.
        let per = batch_member_len("a", false);
        let over = Message::Batch(
            (0..=BATCH_ROOM / per)
                .map(|_| member("a", 0, None))
                .collect(),
        );
        assert!(matches!(
            encode_to_vec(&over),
            Err(WireError::TooLong { field: "BATCH", .. })
        ));
        // A count that promises more members than the body holds.
        let mut short = buf.clone();
        short[13] = 3;
        assert!(matches!(
            decode(&short),
            Err(WireError::ShortBody { kind: "BATCH", .. })
        ));
        // A member with a bad mtime, or its flag without the field.
        let mut bad = buf.clone();
        let n = bad.len();
        bad[n - 4..].copy_from_slice(&1_000_000_000u32.to_be_bytes());
        assert_eq!(
            decode(&bad),
            Err(WireError::BadMtime {
                nanos: 1_000_000_000
            })
        );
        let lying = Message::Batch(vec![Hello {
            caps: hello_flags::MTIME,
            ..member("a", 1, None)
        }]);
        assert_eq!(encode_to_vec(&lying), Err(WireError::MtimeFlag));
    }

    #[test]
    fn round_trip_every_variant() {
        for m in samples() {
            let buf = encode_to_vec(&m).unwrap();
            assert!(buf.len() <= MAX_MESSAGE);
            assert_eq!(buf.len(), encoded_len(&m).unwrap());
            assert_eq!(decode(&buf).unwrap(), m, "{}", m.kind());
            // Encoding into a larger buffer writes only the frame.
            let mut big = vec![0xAAu8; MAX_MESSAGE + 10];
            let n = encode(&m, &mut big).unwrap();
            assert_eq!(&big[..n], &buf[..]);
            assert!(big[n..].iter().all(|&b| b == 0xAA));
        }
    }

    #[test]
    fn header_layout_is_big_endian() {
        let buf = encode_to_vec(&Message::Credit { count: 0x0102_0304 }).unwrap();
        assert_eq!(
            buf,
            [0x52, 0x58, 0x46, 0x52, 1, 4, 0, 0, 0, 0, 0, 4, 1, 2, 3, 4]
        );
        let bye = encode_to_vec(&Message::Bye).unwrap();
        assert_eq!(bye, [0x52, 0x58, 0x46, 0x52, 1, 7, 0, 0, 0, 0, 0, 0]);
        let fin = encode_to_vec(&Message::Fin(Fin {
            bytes: 1,
            chunks: 2,
            digest: Digest::Crc32(0xaabb_ccdd),
        }))
        .unwrap();
        assert_eq!(
            &fin[12..],
            &[
                0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 1, 0, 4, 0xaa, 0xbb, 0xcc, 0xdd
            ]
        );
    }

    #[test]
    fn every_truncation_is_rejected() {
        for m in samples() {
            let buf = encode_to_vec(&m).unwrap();
            for cut in 0..buf.len() {
                let err = decode(&buf[..cut]).unwrap_err();
                let need = if cut < HEADER_LEN {
                    HEADER_LEN
                } else {
                    buf.len()
                };
                assert_eq!(
                    err,
                    WireError::Truncated { need, have: cut },
                    "{} cut {cut}",
                    m.kind()
                );
            }
        }
    }

    fn set_body_len(buf: &mut [u8], len: u32) {
        buf[8..12].copy_from_slice(&len.to_be_bytes());
    }

    #[test]
    fn header_errors() {
        let good = encode_to_vec(&Message::Credit { count: 7 }).unwrap();

        let mut b = good.clone();
        b[0] = 0;
        assert_eq!(decode(&b), Err(WireError::BadMagic(0x0058_4652)));

        let mut b = good.clone();
        b[4] = 2;
        assert_eq!(decode(&b), Err(WireError::UnknownVersion(2)));

        for ty in [0u8, 19, 200, 255] {
            let mut b = good.clone();
            b[5] = ty;
            assert_eq!(decode(&b), Err(WireError::UnknownType(ty)));
        }

        let mut b = good.clone();
        b[7] = 1;
        assert_eq!(decode(&b), Err(WireError::BadFlags(1)));

        let mut b = good.clone();
        set_body_len(&mut b, (MAX_BODY + 1) as u32);
        assert_eq!(decode(&b), Err(WireError::Oversized { len: MAX_BODY + 1 }));
        set_body_len(&mut b, u32::MAX);
        assert_eq!(
            decode(&b),
            Err(WireError::Oversized {
                len: u32::MAX as usize
            })
        );

        // Buffer longer than the frame.
        let mut b = good.clone();
        b.push(0);
        assert_eq!(decode(&b), Err(WireError::TrailingBytes { extra: 1 }));

        // body_len larger than the bytes present.
        let mut b = good.clone();
        set_body_len(&mut b, 5);
        assert_eq!(decode(&b), Err(WireError::Truncated { need: 17, have: 16 }));
    }

    #[test]
    fn body_errors() {
        // Body shorter than the message layout requires (frame itself complete).
        let mut b = encode_to_vec(&Message::Credit { count: 7 }).unwrap();
        b.pop();
        set_body_len(&mut b, 3);
        assert_eq!(
            decode(&b),
            Err(WireError::ShortBody {
                kind: "CREDIT",
                need: 4,
                have: 3
            })
        );

        // Body longer than the layout consumes.
        let mut b = encode_to_vec(&Message::Bye).unwrap();
        b.push(9);
        set_body_len(&mut b, 1);
        assert_eq!(
            decode(&b),
            Err(WireError::BodyTrailing {
                kind: "BYE",
                extra: 1
            })
        );

        // String length pointing past the end of the body.
        let mut b = encode_to_vec(&Message::Reject(Reject::new(RejectCode::Busy, "abc"))).unwrap();
        b[14..16].copy_from_slice(&100u16.to_be_bytes());
        assert_eq!(
            decode(&b),
            Err(WireError::ShortBody {
                kind: "REJECT",
                need: 100,
                have: 3
            })
        );

        // Invalid UTF-8 in a name and in a reason.
        let mut b = encode_to_vec(&hello("abc", 1)).unwrap();
        b[20] = 0xff; // header 12 + version 2 + caps 4 + len 2 -> name starts at 20
        assert_eq!(
            decode(&b),
            Err(WireError::BadUtf8 {
                field: "HELLO name"
            })
        );
        let mut b = encode_to_vec(&Message::Ack(Ack::new(AckStatus::Io, "é"))).unwrap();
        b[16] = 0xc3;
        b[17] = 0x28;
        assert_eq!(
            decode(&b),
            Err(WireError::BadUtf8 {
                field: "ACK reason"
            })
        );
    }

    #[test]
    fn unknown_enum_codes() {
        let mut b = encode_to_vec(&Message::Reject(Reject::new(RejectCode::Busy, "x"))).unwrap();
        for v in [0u16, 10, u16::MAX] {
            b[12..14].copy_from_slice(&v.to_be_bytes());
            assert_eq!(
                decode(&b),
                Err(WireError::BadEnum {
                    field: "reject code",
                    value: v.into()
                })
            );
        }
        let mut b = encode_to_vec(&Message::Ack(Ack::new(AckStatus::Ok, "x"))).unwrap();
        for v in [10u16, u16::MAX] {
            b[12..14].copy_from_slice(&v.to_be_bytes());
            assert_eq!(
                decode(&b),
                Err(WireError::BadEnum {
                    field: "ack status",
                    value: v.into()
                })
            );
        }
        let mut b = encode_to_vec(&hello("", 0)).unwrap();
        let last = b.len() - 1;
        for v in [0u8, 3, 255] {
            b[last] = v;
            assert_eq!(
                decode(&b),
                Err(WireError::BadEnum {
                    field: "digest algorithm",
                    value: v.into()
                })
            );
        }
        let mut b = encode_to_vec(&Message::Fin(Fin {
            bytes: 0,
            chunks: 0,
            digest: Digest::Crc32(1),
        }))
        .unwrap();
        b[28] = 7;
        assert_eq!(
            decode(&b),
            Err(WireError::BadEnum {
                field: "digest algorithm",
                value: 7
            })
        );
    }

    /// `sender --checksum`'s wire values: HELLO flag 0x40 and HAVE kind 3
    /// (a request for the file's SHA-256: the size, no digest).
    #[test]
    fn checksum_flag_and_digest_have_layout() {
        assert_eq!(hello_flags::CHECKSUM, 0x40);
        assert_ne!(hello_flags::KNOWN & hello_flags::CHECKSUM, 0);
        let offer = flagged(
            "f",
            hello_flags::CHECKSUM | hello_flags::MTIME,
            Some(Mtime { secs: 1, nanos: 2 }),
        );
        let buf = encode_to_vec(&offer).unwrap();
        assert_eq!(&buf[14..18], &[0, 0, 0, 0x44]);
        assert_eq!(decode(&buf).unwrap(), offer);

        let ask = Message::Have(Have::ask_digest(0x0102));
        let buf = encode_to_vec(&ask).unwrap();
        // kind 3, bytes = the size, chunk_len 0, CRC32(0), empty note.
        assert_eq!(
            &buf[12..],
            &[
                3, 0, 0, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 1, 0, 4, 0, 0, 0, 0, 0, 0
            ]
        );
        assert_eq!(decode(&buf).unwrap(), ask);
        assert_eq!(HaveKind::from_u8(3), Some(HaveKind::Digest));
        let mut bad = buf.clone();
        for v in [4u8, 255] {
            bad[12] = v;
            assert_eq!(
                decode(&bad),
                Err(WireError::BadEnum {
                    field: "HAVE kind",
                    value: v.into()
                })
            );
        }
        // It fits an offer of exactly its size, without a digest or chunks.
        let have = Have::ask_digest(10);
        assert!(have.fits(10));
        assert!(!have.fits(9) && !have.fits(11));
        assert!(Have::ask_digest(0).fits(0));
        assert!(
            !Have {
                chunk_len: 1,
                ..have.clone()
            }
            .fits(10)
        );
        assert!(
            !Have {
                digest: Digest::Sha256(sha()),
                ..have
            }
            .fits(10)
        );
    }

    #[test]
    fn wrong_digest_length() {
        // A sha256 tag on a 4-byte digest, and a crc32 tag on a 32-byte digest.
        let mut b = encode_to_vec(&Message::Fin(Fin {
            bytes: 0,
            chunks: 0,
            digest: Digest::Crc32(1),
        }))
        .unwrap();
        b[28] = DigestAlg::Sha256 as u8;
        assert_eq!(
            decode(&b),
            Err(WireError::BadDigestLength {
                alg: DigestAlg::Sha256,
                len: 4
            })
        );
        let mut b = encode_to_vec(&Message::Fin(Fin {
            bytes: 0,
            chunks: 0,
            digest: Digest::Sha256(sha()),
        }))
        .unwrap();
        b[28] = DigestAlg::Crc32 as u8;
        assert_eq!(
            decode(&b),
            Err(WireError::BadDigestLength {
                alg: DigestAlg::Crc32,
                len: 32
            })
        );
    }

    #[test]
    fn encode_limits() {
        let m = hello("abc", 1);
        let len = encoded_len(&m).unwrap();
        for have in [0, 1, HEADER_LEN, len - 1] {
            let mut small = vec![0u8; have];
            assert_eq!(
                encode(&m, &mut small),
                Err(WireError::BufferTooSmall { need: len, have })
            );
        }
        let too_long = "n".repeat(MAX_BODY - HELLO_FIXED + 1);
        assert_eq!(
            encode_to_vec(&hello(&too_long, 1)),
            Err(WireError::TooLong {
                field: "HELLO name",
                len: too_long.len(),
                max: too_long.len() - 1
            })
        );
        let huge = "r".repeat(100_000);
        assert!(matches!(
            encode_to_vec(&Message::Ack(Ack {
                status: AckStatus::Io,
                reason: huge.clone()
            })),
            Err(WireError::TooLong {
                field: "ACK reason",
                ..
            })
        ));
        // The constructors clamp instead, on a char boundary.
        let a = Ack::new(AckStatus::Io, "é".repeat(MAX_REASON));
        assert_eq!(a.reason.len(), MAX_REASON);
        let r = Reject::new(RejectCode::Io, format!("x{}", "é".repeat(MAX_REASON)));
        assert_eq!(r.reason.len(), MAX_REASON - 1);
        assert!(encode_to_vec(&Message::Reject(r)).is_ok());
    }

    #[test]
    fn received_modes_follow_the_umask_unless_kept() {
        let with = |mode: u32, caps: u32| Hello {
            mode,
            caps,
            ..match hello("f", 1) {
                Message::Hello(h) => h,
                _ => unreachable!(),
            }
        };
        // As scp without -p: the receiver's umask applies.
        for kept in [false, true] {
            assert_eq!(with(0o666, 0).received_mode(0o022, kept), 0o644);
            assert_eq!(with(0o777, 0).received_mode(0o022, kept), 0o755);
            assert_eq!(with(0o777, 0).received_mode(0o077, kept), 0o700);
            assert_eq!(with(0o600, 0).received_mode(0, kept), 0o600);
            assert_eq!(with(0o7777, 0).received_mode(0o022, kept), 0o755);
            assert_eq!(with(u32::MAX, 0).received_mode(0o777, kept), 0);
        }
        // -p alone: the receiver's umask still applies.
        let keep = hello_flags::KEEP_MODE;
        assert_eq!(with(0o666, keep).received_mode(0o022, false), 0o644);
        assert_eq!(with(0o777, keep).received_mode(0o022, false), 0o755);
        assert_eq!(with(0o600, keep).received_mode(0o022, false), 0o600);
        // -p to a receiver with --keep-modes keeps them; setuid, setgid and
        // sticky are never kept.
        assert_eq!(with(0o666, keep).received_mode(0o022, true), 0o666);
        assert_eq!(with(0o7777, keep).received_mode(0o022, true), 0o777);
        assert_eq!(with(u32::MAX, keep).received_mode(0o777, true), 0o777);
    }

    #[test]
    fn names_and_display() {
        let kinds: Vec<_> = [
            hello("a", 1),
            Message::Mr(RingInfo::default()),
            Message::Reject(Reject::new(RejectCode::Io, "")),
            Message::Credit { count: 1 },
            Message::Fin(Fin {
                bytes: 0,
                chunks: 0,
                digest: Digest::Crc32(0),
            }),
            Message::Ack(Ack::new(AckStatus::Ok, "")),
            Message::Bye,
            Message::Challenge(Challenge {
                flags: 0,
                nonce: [0; NONCE_LEN],
            }),
            Message::Auth { mac: Vec::new() },
            Message::Keepalive,
        ]
        .iter()
        .map(Message::kind)
        .collect();
        assert_eq!(
            kinds,
            [
                "HELLO",
                "MR",
                "REJECT",
                "CREDIT",
                "FIN",
                "ACK",
                "BYE",
                "CHALLENGE",
                "AUTH",
                "KEEPALIVE"
            ]
        );
        assert_eq!(RejectCode::Auth.to_string(), "authentication failed");
        assert_eq!(
            WireError::BadMacLength { len: 5 }.to_string(),
            "AUTH or PROVE carries a 5-byte MAC; it must be empty or 32 bytes"
        );
        assert_eq!(
            WireError::UnknownChallengeFlags(2).to_string(),
            "unknown CHALLENGE flags 0x0002"
        );
        assert_eq!(RejectCode::Exists.to_string(), "file exists");
        // Slugs are what scripts match on: distinct, lowercase, no spaces.
        let slugs: std::collections::HashSet<_> = RejectCode::ALL.map(RejectCode::slug).into();
        assert_eq!(slugs.len(), RejectCode::ALL.len());
        for code in RejectCode::ALL {
            assert_eq!(RejectCode::from_slug(code.slug()), Some(code));
        }
        assert_eq!(RejectCode::from_slug("rejected"), None);
        let statuses: std::collections::HashSet<_> = AckStatus::ALL.map(AckStatus::slug).into();
        assert_eq!(statuses.len(), AckStatus::ALL.len());
        for s in slugs.iter().chain(&statuses) {
            assert!(
                s.bytes().all(|b| b.is_ascii_lowercase() || b == b'-'),
                "{s}"
            );
        }
        assert_eq!(RejectCode::BadName.slug(), "bad-name");
        assert_eq!(AckStatus::Integrity.as_str(), "integrity check failed");
        assert_eq!(Digest::Crc32(0xab).to_string(), "crc32:000000ab");
        assert_eq!(
            Digest::Sha256([0x11; 32]).to_string(),
            format!("sha256:{}", "11".repeat(32))
        );
        assert_eq!(
            WireError::BadMagic(1).to_string(),
            "bad magic 0x00000001: not an rdma-xfer control message"
        );
        assert_eq!(
            WireError::Oversized { len: 5000 }.to_string(),
            "declared body length 5000 exceeds the maximum of 4044"
        );
    }

    #[test]
    fn challenge_and_auth_layout() {
        let nonce: [u8; NONCE_LEN] = std::array::from_fn(|i| i as u8);
        let buf = encode_to_vec(&Message::Challenge(Challenge {
            flags: crate::proto::auth::AUTH_REQUIRED,
            nonce,
        }))
        .unwrap();
        assert_eq!(
            &buf[..12],
            &[0x52, 0x58, 0x46, 0x52, 1, 8, 0, 0, 0, 0, 0, 34]
        );
        assert_eq!(&buf[12..14], &[0, 1]);
        assert_eq!(&buf[14..], &nonce);

        let empty = encode_to_vec(&Message::Auth { mac: Vec::new() }).unwrap();
        assert_eq!(
            empty,
            [0x52, 0x58, 0x46, 0x52, 1, 9, 0, 0, 0, 0, 0, 2, 0, 0]
        );
        let full = encode_to_vec(&Message::Auth {
            mac: nonce.to_vec(),
        })
        .unwrap();
        assert_eq!(
            &full[..12],
            &[0x52, 0x58, 0x46, 0x52, 1, 9, 0, 0, 0, 0, 0, 34]
        );
        assert_eq!(&full[12..14], &[0, 32]);
        assert_eq!(&full[14..], &nonce);
    }

    #[test]
    fn prove_and_auth_ok_layout() {
        let nonce: [u8; NONCE_LEN] = std::array::from_fn(|i| i as u8);
        let proof: [u8; MAC_LEN] = std::array::from_fn(|i| 0x80 | i as u8);
        let buf = encode_to_vec(&Message::Prove(Prove {
            version: 3,
            nonce,
            proof: proof.to_vec(),
        }))
        .unwrap();
        assert_eq!(
            &buf[..12],
            &[0x52, 0x58, 0x46, 0x52, 1, 11, 0, 0, 0, 0, 0, 68]
        );
        assert_eq!(&buf[12..14], &[0, 3]);
        assert_eq!(&buf[14..46], &nonce);
        assert_eq!(&buf[46..48], &[0, 32]);
        assert_eq!(&buf[48..], &proof);
        let empty = encode_to_vec(&Message::Prove(Prove {
            version: 3,
            nonce,
            proof: Vec::new(),
        }))
        .unwrap();
        assert_eq!(empty.len(), 12 + 36);
        assert_eq!(&empty[46..], &[0, 0]);
        for len in [1, 31, 33, 64] {
            let mut b = empty.clone();
            b[46..48].copy_from_slice(&(len as u16).to_be_bytes());
            b.extend(std::iter::repeat_n(0xab, len));
            set_body_len(&mut b, (36 + len) as u32);
            assert_eq!(decode(&b), Err(WireError::BadMacLength { len }), "{len}");
        }
        let ok = encode_to_vec(&Message::AuthOk { proof }).unwrap();
        assert_eq!(
            &ok[..12],
            &[0x52, 0x58, 0x46, 0x52, 1, 12, 0, 0, 0, 0, 0, 32]
        );
        assert_eq!(&ok[12..], &proof);
        // AUTH_OK's proof is exactly 32 bytes.
        let mut short = ok.clone();
        short.pop();
        set_body_len(&mut short, 31);
        assert!(matches!(decode(&short), Err(WireError::ShortBody { .. })));
        let mut long = ok.clone();
        long.push(0);
        set_body_len(&mut long, 33);
        assert!(matches!(decode(&long), Err(WireError::BodyTrailing { .. })));
    }

    #[test]
    fn a_sealed_frame_of_the_largest_size_fits_a_receive_buffer() {
        assert_eq!(MAX_FRAME + crate::proto::auth::SEAL_LEN, MAX_MESSAGE);
        let longest = Message::Reject(Reject {
            code: RejectCode::Protocol,
            reason: "r".repeat(MAX_BODY - REASON_FIXED),
        });
        assert_eq!(encoded_len(&longest).unwrap(), MAX_FRAME);
        let too_long = Message::Reject(Reject {
            code: RejectCode::Protocol,
            reason: "r".repeat(MAX_BODY - REASON_FIXED + 1),
        });
        assert!(matches!(
            encode_to_vec(&too_long),
            Err(WireError::TooLong { .. })
        ));
    }

    /// An AUTH frame carrying `len` MAC bytes, built by hand.
    fn raw_auth(len: usize) -> Vec<u8> {
        let mut b = vec![0x52, 0x58, 0x46, 0x52, 1, MessageType::Auth.code(), 0, 0];
        b.extend_from_slice(&((2 + len) as u32).to_be_bytes());
        b.extend_from_slice(&(len as u16).to_be_bytes());
        b.extend(std::iter::repeat_n(0xab, len));
        b
    }

    #[test]
    fn auth_mac_must_be_empty_or_whole() {
        for len in [0, MAC_LEN] {
            assert_eq!(
                decode(&raw_auth(len)),
                Ok(Message::Auth {
                    mac: vec![0xab; len]
                })
            );
        }
        for len in (1..MAC_LEN).chain([MAC_LEN + 1, 64, MAX_BODY - 2]) {
            assert_eq!(
                decode(&raw_auth(len)),
                Err(WireError::BadMacLength { len }),
                "decode {len}"
            );
            assert_eq!(
                encode_to_vec(&Message::Auth {
                    mac: vec![0xab; len]
                }),
                Err(WireError::BadMacLength { len }),
                "encode {len}"
            );
        }
        // A MAC length pointing past the body.
        let mut b = raw_auth(MAC_LEN);
        b[12..14].copy_from_slice(&33u16.to_be_bytes());
        assert_eq!(
            decode(&b),
            Err(WireError::ShortBody {
                kind: "AUTH",
                need: 33,
                have: 32
            })
        );
        // Body shorter than the length field.
        let mut b = raw_auth(0);
        b.pop();
        set_body_len(&mut b, 1);
        assert_eq!(
            decode(&b),
            Err(WireError::ShortBody {
                kind: "AUTH",
                need: 2,
                have: 1
            })
        );
    }

    #[test]
    fn challenge_flags_and_nonce_length() {
        let c = |flags| {
            Message::Challenge(Challenge {
                flags,
                nonce: [1; NONCE_LEN],
            })
        };
        let good = encode_to_vec(&c(0)).unwrap();
        for flags in [2u16, 3, 0x8000, u16::MAX] {
            let mut b = good.clone();
            b[12..14].copy_from_slice(&flags.to_be_bytes());
            assert_eq!(
                decode(&b),
                Err(WireError::UnknownChallengeFlags(flags)),
                "{flags:#x}"
            );
            assert_eq!(
                encode_to_vec(&c(flags)),
                Err(WireError::UnknownChallengeFlags(flags))
            );
        }
        assert!(matches!(decode(&good), Ok(Message::Challenge(ch)) if !ch.auth_required()));
        let required = encode_to_vec(&c(crate::proto::auth::AUTH_REQUIRED)).unwrap();
        assert!(matches!(decode(&required), Ok(Message::Challenge(ch)) if ch.auth_required()));
        // A nonce one byte short, or one byte long.
        let mut b = good.clone();
        b.pop();
        set_body_len(&mut b, (CHALLENGE_BODY - 1) as u32);
        assert_eq!(
            decode(&b),
            Err(WireError::ShortBody {
                kind: "CHALLENGE",
                need: NONCE_LEN,
                have: NONCE_LEN - 1
            })
        );
        let mut b = good;
        b.push(0);
        set_body_len(&mut b, (CHALLENGE_BODY + 1) as u32);
        assert_eq!(
            decode(&b),
            Err(WireError::BodyTrailing {
                kind: "CHALLENGE",
                extra: 1
            })
        );
    }

    #[test]
    fn hello_piece_layout_and_errors() {
        let piece = Piece {
            transfer: TransferId([0x11; 16]),
            index: 0x0203_0405,
            piece_size: 0x0607,
            file_size: 0x0809,
        };
        let mtime = Mtime { secs: 1, nanos: 2 };
        let offer = Message::Hello(Hello {
            piece: Some(piece),
            ..match flagged("p", hello_flags::MTIME | hello_flags::PIECE, Some(mtime)) {
                Message::Hello(h) => h,
                _ => unreachable!(),
            }
        });
        let buf = encode_to_vec(&offer).unwrap();
        // After the mtime: the transfer, the index, the grid, the size.
        let tail = &buf[buf.len() - PIECE_LEN..];
        assert_eq!(&tail[..16], &[0x11; 16]);
        assert_eq!(&tail[16..20], &[2, 3, 4, 5]);
        assert_eq!(&tail[20..28], &0x0607u64.to_be_bytes());
        assert_eq!(&tail[28..], &0x0809u64.to_be_bytes());
        assert_eq!(decode(&buf).unwrap(), offer);
        // The flag and the field go together.
        let Message::Hello(h) = &offer else {
            unreachable!()
        };
        for lying in [
            Hello {
                piece: None,
                ..h.clone()
            },
            Hello {
                caps: hello_flags::MTIME,
                ..h.clone()
            },
        ] {
            assert_eq!(
                encode_to_vec(&Message::Hello(lying)),
                Err(WireError::PieceFlag)
            );
        }
    }

    #[test]
    fn hello_mtime_layout_and_errors() {
        let m = Mtime {
            secs: 0x0102_0304_0506_0708,
            nanos: 0x0a0b_0c0d,
        };
        let plain = encode_to_vec(&flagged("d", hello_flags::DIRECTORY, None)).unwrap();
        let timed = encode_to_vec(&flagged(
            "d",
            hello_flags::DIRECTORY | hello_flags::MTIME,
            Some(m),
        ))
        .unwrap();
        // The same fields, the flag bit, and 12 more bytes at the end.
        assert_eq!(timed.len(), plain.len() + 12);
        assert_eq!(
            &timed[14..18],
            &(hello_flags::DIRECTORY | hello_flags::MTIME).to_be_bytes()
        );
        assert_eq!(
            &timed[timed.len() - 12..],
            &[1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d]
        );
        // Flag and field must agree, both ways.
        assert_eq!(
            encode_to_vec(&flagged("d", hello_flags::MTIME, None)),
            Err(WireError::MtimeFlag)
        );
        assert_eq!(
            encode_to_vec(&flagged("d", 0, Some(m))),
            Err(WireError::MtimeFlag)
        );
        assert_eq!(
            encoded_len(&flagged("d", 0, Some(m))),
            Err(WireError::MtimeFlag)
        );
        // Nanoseconds out of range, on either side.
        let bad = Mtime {
            secs: 1,
            nanos: 1_000_000_000,
        };
        assert_eq!(
            encode_to_vec(&flagged("d", hello_flags::MTIME, Some(bad))),
            Err(WireError::BadMtime {
                nanos: 1_000_000_000
            })
        );
        let mut b = encode_to_vec(&flagged(
            "d",
            hello_flags::MTIME,
            Some(Mtime {
                secs: 1,
                nanos: 999_999_999,
            }),
        ))
        .unwrap();
        let n = b.len();
        b[n - 4..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(decode(&b), Err(WireError::BadMtime { nanos: u32::MAX }));
        // A set flag with the mtime bytes missing is a short body; a clear
        // flag with them present leaves trailing bytes.
        let mut b = plain.clone();
        b[17] |= hello_flags::MTIME as u8;
        assert_eq!(
            decode(&b),
            Err(WireError::ShortBody {
                kind: "HELLO",
                need: 8,
                have: 0
            })
        );
        let mut b = timed.clone();
        b[17] &= !(hello_flags::MTIME as u8);
        assert_eq!(
            decode(&b),
            Err(WireError::BodyTrailing {
                kind: "HELLO",
                extra: 12
            })
        );
        // The name limit shrinks by the mtime bytes.
        let long = "n".repeat(MAX_BODY - HELLO_FIXED - MTIME_LEN + 1);
        assert!(matches!(
            encode_to_vec(&flagged(&long, hello_flags::MTIME, Some(m))),
            Err(WireError::TooLong {
                field: "HELLO name",
                ..
            })
        ));
        assert!(encode_to_vec(&flagged(&long, 0, None)).is_ok());
    }

    #[test]
    fn hello_kind_helpers_and_keepalive_layout() {
        let Message::Hello(h) = flagged("s", hello_flags::STREAM, None) else {
            unreachable!()
        };
        assert!(h.is_stream() && !h.is_directory());
        let Message::Hello(h) = flagged("d", hello_flags::DIRECTORY, None) else {
            unreachable!()
        };
        assert!(!h.is_stream() && h.is_directory());
        let Message::Hello(h) = hello("f", 1) else {
            unreachable!()
        };
        assert!(!h.is_stream() && !h.is_directory());
        assert_eq!(
            encode_to_vec(&Message::Keepalive).unwrap(),
            [0x52, 0x58, 0x46, 0x52, 1, 10, 0, 0, 0, 0, 0, 0]
        );
        // A KEEPALIVE with a body is malformed.
        let mut b = encode_to_vec(&Message::Keepalive).unwrap();
        b.push(0);
        set_body_len(&mut b, 1);
        assert_eq!(
            decode(&b),
            Err(WireError::BodyTrailing {
                kind: "KEEPALIVE",
                extra: 1
            })
        );
    }

    /// xorshift64*: deterministic, no external crate.
    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        pub fn below(&mut self, n: u64) -> u64 {
            if n == 0 { 0 } else { self.next() % n }
        }
    }

    #[test]
    fn fuzz_decode_never_panics_and_is_canonical() {
        let seeds: Vec<Vec<u8>> = samples()
            .iter()
            .map(|m| encode_to_vec(m).unwrap())
            .collect();
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        let mut decoded = 0u32;
        for _ in 0..200_000 {
            let mut buf = match rng.below(4) {
                // Pure noise, sometimes with a valid magic/version so parsing gets further.
                0 => {
                    let len = rng.below(64) as usize;
                    let mut b: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
                    if len >= 6 && rng.below(2) == 0 {
                        b[..4].copy_from_slice(&MAGIC.to_be_bytes());
                        b[4] = WIRE_VERSION;
                        b[5] = rng.below(12) as u8;
                    }
                    b
                }
                _ => seeds[rng.below(seeds.len() as u64) as usize].clone(),
            };
            // Mutate: flip bytes, rewrite body_len, truncate or extend.
            for _ in 0..rng.below(4) {
                match rng.below(4) {
                    0 if !buf.is_empty() => {
                        let i = rng.below(buf.len() as u64) as usize;
                        buf[i] = rng.next() as u8;
                    }
                    1 if buf.len() >= HEADER_LEN => {
                        let body = buf.len() - HEADER_LEN;
                        let l = (body as i64 + rng.below(5) as i64 - 2).max(0) as u32;
                        set_body_len(&mut buf, l);
                    }
                    2 => buf.truncate(rng.below(buf.len() as u64 + 1) as usize),
                    _ => buf.push(rng.next() as u8),
                }
            }
            if let Ok(m) = decode(&buf) {
                decoded += 1;
                let re = encode_to_vec(&m).unwrap();
                assert_eq!(re, buf, "non-canonical decode of {m:?}");
                assert_eq!(decode(&re).unwrap(), m);
            }
        }
        assert!(decoded > 1000, "fuzzer too weak: {decoded} decodes");
    }
}
