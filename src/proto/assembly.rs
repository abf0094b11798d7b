//! A file that arrives in pieces over several lanes (sessions of one
//! sender, each its own connection, queue pair and thread on both sides):
//! which pieces are there, which are under way and on which lane, and when
//! the file is whole. Pure state, no I/O: the receiver's engine keeps one
//! `Assembly` per file being assembled, shared by the sessions that carry
//! its pieces, and commits the file when `verified` says it is complete.
//!
//! A piece is a range of the file on a grid the sender chose and every
//! piece offer repeats (`Piece`): piece i is bytes `[i * piece_size,
//! min((i + 1) * piece_size, file_size))`. Each piece is offered, written
//! and verified like a file of its own (its own FIN digest); the file is
//! whole when every piece is verified. Its digest is then computed from the
//! pieces' (`whole_digest`): with CRC32 the file's own CRC32, with SHA-256
//! the SHA-256 of the pieces' SHA-256s in order (a digest lanes can compute
//! in parallel; not the file's plain SHA-256).

use super::wire::{Digest, DigestAlg, Hello, Mtime, Reject, RejectCode};
use sha2::{Digest as _, Sha256};

/// Names the file a piece belongs to, chosen at random by the sender for
/// each file it sends in pieces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TransferId(pub [u8; 16]);

/// Where a piece offer's bytes go: what HELLO carries with the PIECE flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The file it belongs to.
    pub transfer: TransferId,
    /// The piece's number on the grid.
    pub index: u32,
    /// The grid: every piece but the last has this many bytes.
    pub piece_size: u64,
    /// The whole file's size.
    pub file_size: u64,
}

/// The smallest grid: a multiple of this (so O_DIRECT can write whole
/// pages at every piece's start) and at least this much.
pub const PIECE_ALIGN: u64 = 64 << 10;
/// Most pieces one file may have: the receiver's state per file stays
/// small (a piece offer names the grid; 2^16 pieces of up to 256 MiB
/// cover 16 TiB).
pub const MAX_PIECES: u64 = 1 << 16;

impl Piece {
    /// The number of pieces on the grid.
    pub const fn count(&self) -> u64 {
        self.file_size.div_ceil(self.piece_size)
    }

    /// The piece's first byte in the file.
    pub const fn offset(&self) -> u64 {
        self.index as u64 * self.piece_size
    }

    /// The piece's length in bytes.
    pub fn bytes(&self) -> u64 {
        self.piece_size.min(self.file_size - self.offset())
    }

    /// Whether the grid and the index make sense: an aligned grid of at
    /// most `MAX_PIECES` over a file of at least one byte, the index on it.
    pub fn check(&self) -> Result<(), Reject> {
        let bad = |why: String| Err(Reject::new(RejectCode::Protocol, why));
        if self.piece_size < PIECE_ALIGN || !self.piece_size.is_multiple_of(PIECE_ALIGN) {
            return bad(format!(
                "a piece size of {} bytes (a multiple of {PIECE_ALIGN} is needed)",
                self.piece_size
            ));
        }
        if self.file_size == 0 || self.count() > MAX_PIECES {
            return bad(format!(
                "a file of {} bytes in pieces of {} (1 to {MAX_PIECES} pieces)",
                self.file_size, self.piece_size
            ));
        }
        if u64::from(self.index) >= self.count() {
            return bad(format!(
                "piece {} of a file of {} pieces",
                self.index,
                self.count()
            ));
        }
        Ok(())
    }
}

/// A lane, as the engine names it (say, its session's number): whose
/// pieces go back to be offered again when it is gone.
pub type LaneId = u64;

#[derive(Debug, Clone, PartialEq, Eq)]
enum PieceState {
    Missing,
    Receiving(LaneId),
    Verified(Digest),
}

/// What becomes of a piece offer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceAnswer {
    /// Receive it.
    Receive {
        /// Where its bytes go in the file.
        offset: u64,
        /// How many.
        len: u64,
    },
    /// It was verified already (its ACK was lost with a lane): ACK it, no
    /// data (Ok when the file is whole, PieceKept otherwise).
    AlreadyVerified {
        /// Every piece of the file is verified.
        file_whole: bool,
    },
}

/// Where the file stands after a piece was verified.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// Pieces are still missing or under way.
    Pending {
        /// Pieces verified so far.
        verified: u64,
        /// Pieces in all.
        of: u64,
    },
    /// Every piece is verified: the file is whole, with this digest
    /// (`whole_digest`).
    Complete(Digest),
}

/// What a piece offer must share with the first of its file.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Identity {
    name: String,
    file_size: u64,
    piece_size: u64,
    digest: DigestAlg,
    mtime: Option<Mtime>,
    mode: u32,
}

impl Identity {
    fn of(hello: &Hello, piece: &Piece) -> Self {
        Identity {
            name: hello.name.clone(),
            file_size: piece.file_size,
            piece_size: piece.piece_size,
            digest: hello.digest,
            mtime: hello.mtime,
            mode: hello.mode,
        }
    }
}

/// One file being assembled from pieces (see the module's docs).
#[derive(Debug)]
pub struct Assembly {
    transfer: TransferId,
    identity: Identity,
    pieces: Vec<PieceState>,
    verified: u64,
    /// The engine committed the whole file (`committed`).
    committed: bool,
    /// The whole file's commit failed (`commit_failed`): why. Every later
    /// offer is refused with it.
    failed: Option<String>,
}

impl Assembly {
    /// The file `hello`'s piece belongs to, nothing of it there yet.
    pub fn new(hello: &Hello, piece: &Piece) -> Result<Self, Reject> {
        piece.check()?;
        Ok(Assembly {
            transfer: piece.transfer,
            identity: Identity::of(hello, piece),
            // At most MAX_PIECES (checked).
            pieces: vec![PieceState::Missing; piece.count() as usize],
            verified: 0,
            committed: false,
            failed: None,
        })
    }

    /// The file's final name.
    pub fn name(&self) -> &str {
        &self.identity.name
    }

    /// The file's size.
    pub fn file_size(&self) -> u64 {
        self.identity.file_size
    }

    /// `lane` offers `hello`'s piece: receive it, or ACK it at once. A
    /// piece of another file under this transfer, a piece another lane is
    /// receiving, or one off the grid is refused.
    pub fn offer(
        &mut self,
        lane: LaneId,
        hello: &Hello,
        piece: &Piece,
    ) -> Result<PieceAnswer, Reject> {
        piece.check()?;
        if piece.transfer != self.transfer || Identity::of(hello, piece) != self.identity {
            return Err(Reject::new(
                RejectCode::Protocol,
                format!(
                    "piece {} does not belong to the file its transfer names ({})",
                    piece.index,
                    super::escaped(&self.identity.name)
                ),
            ));
        }
        if let Some(why) = &self.failed {
            return Err(Reject::new(
                RejectCode::Io,
                format!(
                    "{} failed as it was made whole: {why}",
                    super::escaped(&self.identity.name)
                ),
            ));
        }
        let at = piece.index as usize;
        match &self.pieces[at] {
            // Whole only once committed: a file whose commit is under way
            // or failed is not said to be there.
            PieceState::Verified(_) => Ok(PieceAnswer::AlreadyVerified {
                file_whole: self.committed,
            }),
            // Under way on another lane: the sender gave that lane up (its
            // path died before this receiver noticed). This lane takes it
            // over; the other's verdict on it will not count (`verified`
            // checks the lane), and its writes are of the same bytes.
            _ => {
                self.pieces[at] = PieceState::Receiving(lane);
                Ok(PieceAnswer::Receive {
                    offset: piece.offset(),
                    len: piece.bytes(),
                })
            }
        }
    }

    /// `lane`'s piece `index` passed its checks with `digest` (its FIN's).
    /// A piece the lane was not receiving, or a digest of another kind, is
    /// an error of the engine's and changes nothing.
    pub fn verified(
        &mut self,
        lane: LaneId,
        index: u32,
        digest: Digest,
    ) -> Result<Progress, Reject> {
        let at = index as usize;
        if self.pieces.get(at) != Some(&PieceState::Receiving(lane))
            || digest.alg() != self.identity.digest
        {
            return Err(Reject::new(
                RejectCode::Protocol,
                format!("piece {index} was not under way on this lane"),
            ));
        }
        self.pieces[at] = PieceState::Verified(digest);
        self.verified += 1;
        if self.verified < self.pieces.len() as u64 {
            return Ok(Progress::Pending {
                verified: self.verified,
                of: self.pieces.len() as u64,
            });
        }
        Ok(Progress::Complete(self.whole_digest()))
    }

    /// Whether `lane` is receiving piece `index` (its writes may land).
    pub fn is_receiving(&self, lane: LaneId, index: u32) -> bool {
        self.pieces.get(index as usize) == Some(&PieceState::Receiving(lane))
    }

    /// The engine committed the whole file (after `verified` said
    /// Complete): later offers of its pieces are told it is whole.
    pub fn committed(&mut self) {
        self.committed = true;
    }

    /// The whole file's commit failed: every later offer is refused.
    pub fn commit_failed(&mut self, why: String) {
        self.failed = Some(why);
    }

    /// Committed, or its commit failed: nothing more happens to it.
    pub fn is_finished(&self) -> bool {
        self.committed || self.failed.is_some()
    }

    /// `lane`'s piece `index` failed (its data, its check, its write): it
    /// may be offered again, on any lane.
    pub fn failed(&mut self, lane: LaneId, index: u32) {
        if let Some(state) = self.pieces.get_mut(index as usize)
            && *state == PieceState::Receiving(lane)
        {
            *state = PieceState::Missing;
        }
    }

    /// `lane` is gone: the pieces it was receiving may be offered again.
    /// Whether any lane is still receiving a piece.
    pub fn lane_gone(&mut self, lane: LaneId) -> bool {
        let mut busy = false;
        for state in &mut self.pieces {
            match state {
                PieceState::Receiving(l) if *l == lane => *state = PieceState::Missing,
                PieceState::Receiving(_) => busy = true,
                _ => {}
            }
        }
        busy
    }

    /// The whole file's digest from its pieces' (all verified).
    fn whole_digest(&self) -> Digest {
        let digests = self.pieces.iter().filter_map(|p| match p {
            PieceState::Verified(d) => Some(d),
            _ => None,
        });
        let id = &self.identity;
        digest_of_pieces(id.digest, id.piece_size, id.file_size, digests)
    }
}

/// Pieces a lane carries of a file, about (`piece_size_for`).
pub const PIECES_PER_LANE: u64 = 8;

/// The grid a sender chooses for a file of `file_size` bytes over `lanes`
/// lanes: about eight pieces a lane (so a slow lane or a lost one costs
/// an eighth of its share, and the last pieces end close together), each a multiple of `PIECE_ALIGN` and of `chunk`
/// (so no chunk straddles two pieces), between `min_piece` and 256 MiB,
/// and never more than `MAX_PIECES`.
pub fn piece_size_for(file_size: u64, lanes: u32, chunk: u64, min_piece: u64) -> u64 {
    const MAX_PIECE: u64 = 256 << 20;
    let gcd = |mut a: u64, mut b: u64| {
        while b != 0 {
            (a, b) = (b, a % b);
        }
        a
    };
    let chunk = chunk.max(1);
    let unit = PIECE_ALIGN / gcd(PIECE_ALIGN, chunk) * chunk;
    let want = file_size.div_ceil(u64::from(lanes.max(1)) * PIECES_PER_LANE);
    let size = want
        .clamp(min_piece, MAX_PIECE.max(min_piece))
        .max(file_size.div_ceil(MAX_PIECES));
    size.div_ceil(unit) * unit
}

/// What a piece's ACK did to its file, at the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Striped {
    /// More pieces to send or to hear of.
    Pending,
    /// The file is whole at the receiver (the last piece's ACK, Ok), or
    /// the receiver's copy stays as it was (a verdict without data: the
    /// file is not sent).
    Done(super::wire::AckStatus),
    /// The file failed: the ACK's status and reason.
    Failed(super::wire::AckStatus, String),
    /// The receiver refused the file's first pieces as pieces (it takes
    /// files whole: standard output, --exec, --discard): send it whole.
    Whole(String),
}

/// The sender's side of a file sent in pieces over lanes: which piece
/// each lane sends next, the pieces of a lost lane offered again, and the
/// file's verdict from its pieces' ACKs. Pure state.
#[derive(Debug)]
pub struct Striping {
    transfer: TransferId,
    piece_size: u64,
    file_size: u64,
    /// The next piece never offered.
    next: u32,
    /// Pieces to offer again (their lane was lost).
    again: std::collections::VecDeque<u32>,
    /// Pieces offered again: only these may be answered without their
    /// data (verified before, their first ACK lost with their lane).
    offered_again: std::collections::BTreeSet<u32>,
    /// Pieces offered and not answered, with their lane.
    out: std::collections::BTreeMap<u32, LaneId>,
    kept: u64,
    /// The receiver said the file is whole (an Ok).
    whole_said: bool,
    verdict: Option<Striped>,
    /// The digests of the pieces this sender read and sent, by index.
    digests: std::collections::BTreeMap<u32, Digest>,
}

impl Striping {
    /// A file of `file_size` bytes on a grid of `piece_size` (see
    /// `piece_size_for`), named `transfer`.
    pub fn new(transfer: TransferId, file_size: u64, piece_size: u64) -> Result<Self, Reject> {
        Piece {
            transfer,
            index: 0,
            piece_size,
            file_size,
        }
        .check()?;
        Ok(Striping {
            transfer,
            piece_size,
            file_size,
            next: 0,
            again: Default::default(),
            offered_again: Default::default(),
            out: Default::default(),
            kept: 0,
            whole_said: false,
            verdict: None,
            digests: Default::default(),
        })
    }

    fn count(&self) -> u64 {
        self.file_size.div_ceil(self.piece_size)
    }

    /// The piece `lane` sends next, if one is left to send.
    pub fn next_for(&mut self, lane: LaneId) -> Option<Piece> {
        if self.verdict.is_some() {
            return None;
        }
        let index = match self.again.pop_front() {
            Some(i) => {
                self.offered_again.insert(i);
                i
            }
            None if u64::from(self.next) < self.count() => {
                self.next += 1;
                self.next - 1
            }
            None => return None,
        };
        self.out.insert(index, lane);
        Some(Piece {
            transfer: self.transfer,
            index,
            piece_size: self.piece_size,
            file_size: self.file_size,
        })
    }

    /// Whether a piece is left to offer (`next_for` has one).
    pub fn more_to_send(&self) -> bool {
        self.verdict.is_none() && (!self.again.is_empty() || u64::from(self.next) < self.count())
    }

    /// The ACK of `lane`'s piece `index`; `data`: it answers the piece's
    /// data (its FIN), not its offer alone. PieceKept counts it; Ok makes
    /// the file whole only when every other piece was kept (else the
    /// receiver lost the file's other pieces: it failed); a verdict
    /// without data ends the file; a failure fails it. A piece answered
    /// PieceKept or Ok without its data was verified before: only a
    /// piece offered again may be (its first ACK was lost with its
    /// lane); at its first offer, someone else filled it: the file failed.
    pub fn answered(
        &mut self,
        lane: LaneId,
        index: u32,
        status: super::wire::AckStatus,
        reason: &str,
        data: bool,
    ) -> Striped {
        use super::wire::AckStatus;
        if let Some(verdict) = &self.verdict {
            return verdict.clone();
        }
        if self.out.get(&index) != Some(&lane) {
            return Striped::Pending;
        }
        self.out.remove(&index);
        let verified_before = !data && matches!(status, AckStatus::PieceKept | AckStatus::Ok);
        let verdict = match status {
            _ if verified_before && !self.offered_again.contains(&index) => Striped::Failed(
                AckStatus::Protocol,
                format!("the receiver had piece {index} before this sender sent it"),
            ),
            // A refusal of the offer (no data) before any piece was kept:
            // the receiver takes no pieces; the file goes whole.
            AckStatus::Protocol if !data && self.kept == 0 => Striped::Whole(reason.into()),
            // Kept, or kept and the file whole (Ok: the receiver
            // committed it). The lanes' answers race one another to the
            // dispatcher: an Ok may come before the PieceKept of a piece
            // under way elsewhere, so the file is done once every piece is
            // answered.
            AckStatus::PieceKept | AckStatus::Ok => {
                self.kept += 1;
                self.whole_said |= status == AckStatus::Ok;
                if self.kept < self.count() {
                    return Striped::Pending;
                }
                if self.whole_said {
                    Striped::Done(AckStatus::Ok)
                } else {
                    Striped::Failed(
                        AckStatus::Io,
                        "every piece was kept, but the receiver did not say the file is whole"
                            .into(),
                    )
                }
            }
            s if s.without_data() => Striped::Done(s),
            s => Striped::Failed(s, reason.into()),
        };
        self.verdict = Some(verdict.clone());
        verdict
    }

    /// `lane` is gone: its pieces go to the other lanes. Whether pieces
    /// remain to send or to hear of.
    pub fn lane_gone(&mut self, lane: LaneId) -> bool {
        let lost: Vec<u32> = self
            .out
            .iter()
            .filter(|(_, l)| **l == lane)
            .map(|(i, _)| *i)
            .collect();
        for index in lost {
            self.out.remove(&index);
            self.again.push_back(index);
        }
        self.verdict.is_none()
    }

    /// Pieces offered and not answered.
    pub fn under_way(&self) -> usize {
        self.out.len()
    }

    /// Piece `index`'s bytes, as this sender read and sent them, hash to
    /// `digest` (its FIN's).
    pub fn piece_digest(&mut self, index: u32, digest: Digest) {
        if u64::from(index) < self.count() {
            self.digests.insert(index, digest);
        }
    }

    /// The whole file's digest (`digest_of_pieces`) once this sender sent
    /// every piece itself; None when one was answered without its data
    /// (verified before), or the digests are of two kinds.
    pub fn whole_digest(&self) -> Option<Digest> {
        let first = self.digests.values().next()?;
        let alg = first.alg();
        if self.digests.len() as u64 != self.count()
            || self.digests.values().any(|d| d.alg() != alg)
        {
            return None;
        }
        Some(digest_of_pieces(
            alg,
            self.piece_size,
            self.file_size,
            self.digests.values(),
        ))
    }
}

/// A file's digest from its pieces' (`digests`, in order, on a grid of
/// `piece_size` over `file_size` bytes): CRC32 combined (the file's own
/// CRC32), or SHA-256 over the pieces' SHA-256s (`pieces_sha256`).
pub fn digest_of_pieces<'a>(
    alg: DigestAlg,
    piece_size: u64,
    file_size: u64,
    digests: impl IntoIterator<Item = &'a Digest>,
) -> Digest {
    match alg {
        DigestAlg::Crc32 => {
            let mut whole = crc32fast::Hasher::new();
            for (i, d) in digests.into_iter().enumerate() {
                if let Digest::Crc32(crc) = d {
                    let len = piece_size.min(file_size.saturating_sub(i as u64 * piece_size));
                    whole.combine(&crc32fast::Hasher::new_with_initial_len(*crc, len));
                }
            }
            Digest::Crc32(whole.finalize())
        }
        DigestAlg::Sha256 => {
            Digest::Sha256(pieces_sha256(digests.into_iter().filter_map(|d| match d {
                Digest::Sha256(h) => Some(h),
                Digest::Crc32(_) => None,
            })))
        }
    }
}

/// The SHA-256 of pieces' SHA-256s in order: a file's digest when its
/// pieces were hashed apart (the sender computes it the same way).
pub fn pieces_sha256<'a>(pieces: impl IntoIterator<Item = &'a [u8; 32]>) -> [u8; 32] {
    let mut whole = Sha256::new();
    for piece in pieces {
        whole.update(piece);
    }
    whole.finalize().into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::CAP_NONE;

    const MIB: u64 = 1 << 20;

    fn hello(name: &str, alg: DigestAlg) -> Hello {
        Hello {
            version: crate::proto::PROTOCOL_VERSION,
            caps: CAP_NONE,
            name: name.into(),
            size: 0,
            mode: 0o644,
            digest: alg,
            mtime: Some(Mtime { secs: 7, nanos: 0 }),
            piece: None,
        }
    }

    fn piece(index: u32) -> Piece {
        Piece {
            transfer: TransferId([3; 16]),
            index,
            piece_size: 4 * MIB,
            file_size: 10 * MIB + 5,
        }
    }

    #[test]
    fn a_grid_is_aligned_and_its_pieces_cover_the_file() {
        let p = piece(2);
        assert_eq!(p.count(), 3);
        assert_eq!((p.offset(), p.bytes()), (8 * MIB, 2 * MIB + 5));
        assert_eq!(piece(0).bytes(), 4 * MIB);
        assert!(p.check().is_ok());
        for bad in [
            Piece { index: 3, ..p },
            Piece {
                piece_size: PIECE_ALIGN + 1,
                ..p
            },
            Piece { piece_size: 0, ..p },
            Piece { file_size: 0, ..p },
            Piece {
                piece_size: PIECE_ALIGN,
                file_size: (MAX_PIECES + 1) * PIECE_ALIGN,
                index: 0,
                ..p
            },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_file_is_whole_once_every_piece_is_verified_on_any_lane() {
        let data: Vec<u8> = (0..10 * MIB + 5)
            .map(|i| (i * 7 + i / 4099) as u8)
            .collect();
        let crc_of = |p: &Piece| {
            let at = p.offset() as usize;
            Digest::Crc32(crc32fast::hash(&data[at..at + p.bytes() as usize]))
        };
        let h = hello("ckpt.bin", DigestAlg::Crc32);
        let mut file = Assembly::new(&h, &piece(1)).unwrap();
        // Lanes 1 and 2 take pieces 1 and 0; lane 2 cannot take 1 too.
        assert_eq!(
            file.offer(1, &h, &piece(1)),
            Ok(PieceAnswer::Receive {
                offset: 4 * MIB,
                len: 4 * MIB
            })
        );
        assert!(file.offer(2, &h, &piece(0)).is_ok());
        // Lane 1 is given up by the sender before this side sees it go:
        // lane 2 takes its piece over, and lane 1's verdict on it no
        // longer counts.
        assert!(file.offer(2, &h, &piece(1)).is_ok());
        assert!(file.verified(1, 1, crc_of(&piece(1))).is_err());
        // Lane 1's end then changes nothing of lane 2's.
        assert!(file.lane_gone(1));
        let p0 = file.verified(2, 0, crc_of(&piece(0))).unwrap();
        assert_eq!(p0, Progress::Pending { verified: 1, of: 3 });
        // A piece not under way on that lane: an error, nothing changes.
        assert!(file.verified(1, 1, crc_of(&piece(1))).is_err());
        assert!(file.verified(2, 1, Digest::Sha256([0; 32])).is_err());
        assert!(file.verified(2, 1, crc_of(&piece(1))).is_ok());
        // A piece that failed may come again.
        assert!(file.offer(1, &h, &piece(2)).is_ok());
        file.failed(1, 2);
        assert!(file.offer(2, &h, &piece(2)).is_ok());
        // One verified already is ACKed without its data.
        assert_eq!(
            file.offer(1, &h, &piece(0)),
            Ok(PieceAnswer::AlreadyVerified { file_whole: false })
        );
        let done = file.verified(2, 2, crc_of(&piece(2))).unwrap();
        assert_eq!(
            done,
            Progress::Complete(Digest::Crc32(crc32fast::hash(&data)))
        );
        // Whole only once the engine committed it.
        assert_eq!(
            file.offer(1, &h, &piece(2)),
            Ok(PieceAnswer::AlreadyVerified { file_whole: false })
        );
        assert!(!file.is_finished());
        file.committed();
        // The last piece's ACK lost with its lane: offered again, Ok.
        assert_eq!(
            file.offer(1, &h, &piece(2)),
            Ok(PieceAnswer::AlreadyVerified { file_whole: true })
        );
        assert!(file.is_finished());
        assert!(!file.lane_gone(2));
    }

    #[test]
    fn a_file_whose_commit_failed_refuses_every_later_offer() {
        let h = hello("f.bin", DigestAlg::Crc32);
        let p = Piece {
            file_size: 4 * MIB,
            ..piece(0)
        };
        let mut file = Assembly::new(&h, &p).unwrap();
        assert!(file.offer(1, &h, &p).is_ok());
        assert!(file.is_receiving(1, 0));
        assert!(!file.is_receiving(2, 0));
        let crc = Digest::Crc32(crc32fast::hash(&[]));
        assert!(matches!(
            file.verified(1, 0, crc),
            Ok(Progress::Complete(_))
        ));
        assert!(!file.is_receiving(1, 0));
        file.commit_failed("no space left".into());
        assert!(file.is_finished());
        // Never "verified before, whole": the file is not there.
        let refused = file.offer(2, &h, &p).unwrap_err();
        assert_eq!(refused.code, RejectCode::Io);
        assert!(
            refused.reason.contains("no space left"),
            "{}",
            refused.reason
        );
    }

    #[test]
    fn a_piece_of_another_file_under_the_same_transfer_is_refused() {
        let h = hello("a.bin", DigestAlg::Sha256);
        let mut file = Assembly::new(&h, &piece(0)).unwrap();
        let other_name = hello("b.bin", DigestAlg::Sha256);
        let other_alg = hello("a.bin", DigestAlg::Crc32);
        let other_time = Hello {
            mtime: None,
            ..h.clone()
        };
        for (h, p) in [
            (&other_name, piece(1)),
            (&other_alg, piece(1)),
            (&other_time, piece(1)),
            (
                &h,
                Piece {
                    file_size: 11 * MIB,
                    ..piece(1)
                },
            ),
            (
                &h,
                Piece {
                    piece_size: 2 * MIB,
                    ..piece(1)
                },
            ),
            (
                &h,
                Piece {
                    transfer: TransferId([4; 16]),
                    ..piece(1)
                },
            ),
        ] {
            let refused = file.offer(1, h, &p).unwrap_err();
            assert_eq!(refused.code, RejectCode::Protocol, "{h:?} {p:?}");
        }
        // The file's own pieces still come.
        assert!(file.offer(1, &h, &piece(1)).is_ok());
    }

    #[test]
    fn a_grid_gives_each_lane_about_eight_pieces_on_chunk_boundaries() {
        // 1 GiB over 2 lanes: 16 pieces of 64 MiB.
        assert_eq!(piece_size_for(1 << 30, 2, MIB, 4 * MIB), 64 * MIB);
        // Small files: the least piece size; huge ones: at most 256 MiB.
        assert_eq!(piece_size_for(10 * MIB, 4, MIB, 4 * MIB), 4 * MIB);
        assert_eq!(piece_size_for(1 << 40, 2, MIB, 4 * MIB), 256 * MIB);
        // A chunk that is not a power of two: pieces still hold whole ones.
        let odd = 3 * PIECE_ALIGN;
        let size = piece_size_for(100 * MIB, 2, odd, 4 * MIB);
        assert!(size.is_multiple_of(odd) && size.is_multiple_of(PIECE_ALIGN));
        // Never more than MAX_PIECES.
        let size = piece_size_for(u64::MAX / 2, 1, MIB, MIB);
        assert!((u64::MAX / 2).div_ceil(size) <= MAX_PIECES);
    }

    #[test]
    fn a_striped_file_is_done_when_its_last_piece_makes_it_whole() {
        use crate::proto::AckStatus;
        let id = TransferId([5; 16]);
        let mut file = Striping::new(id, 10 * MIB + 5, 4 * MIB).unwrap();
        let p0 = file.next_for(1).unwrap();
        let p1 = file.next_for(2).unwrap();
        assert_eq!((p0.index, p1.index), (0, 1));
        // Lane 2 is lost: its piece goes to lane 1, after the new ones.
        assert!(file.lane_gone(2));
        assert_eq!(file.next_for(1).unwrap().index, 1);
        assert_eq!(file.next_for(1).unwrap().index, 2);
        assert_eq!(file.next_for(1), None);
        // A late ACK from the lost lane changes nothing.
        assert_eq!(
            file.answered(2, 1, AckStatus::PieceKept, "", true),
            Striped::Pending
        );
        assert_eq!(file.under_way(), 3);
        assert_eq!(
            file.answered(1, 0, AckStatus::PieceKept, "", true),
            Striped::Pending
        );
        assert_eq!(
            file.answered(1, 2, AckStatus::PieceKept, "", true),
            Striped::Pending
        );
        assert_eq!(
            file.answered(1, 1, AckStatus::Ok, "", true),
            Striped::Done(AckStatus::Ok)
        );
        assert!(!file.lane_gone(1));
        // The Ok before another lane's PieceKept (their answers race):
        // done once every piece is answered.
        let mut early = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        for lane in 1..=3 {
            early.next_for(lane);
        }
        assert_eq!(
            early.answered(3, 2, AckStatus::Ok, "", true),
            Striped::Pending
        );
        assert_eq!(
            early.answered(1, 0, AckStatus::PieceKept, "", true),
            Striped::Pending
        );
        assert_eq!(
            early.answered(2, 1, AckStatus::PieceKept, "", true),
            Striped::Done(AckStatus::Ok)
        );
        // Whole before this sender offered every piece: someone else
        // filled the others, which a first offer then finds.
        let mut filled = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        filled.next_for(1);
        assert_eq!(
            filled.answered(1, 0, AckStatus::Ok, "", true),
            Striped::Pending
        );
        let next = filled.next_for(1).unwrap();
        assert!(matches!(
            filled.answered(1, next.index, AckStatus::Ok, "", false),
            Striped::Failed(AckStatus::Protocol, _)
        ));
        // Every piece kept and no Ok: the file failed.
        let mut never = Striping::new(id, 4 * MIB, 4 * MIB).unwrap();
        never.next_for(1);
        assert!(matches!(
            never.answered(1, 0, AckStatus::PieceKept, "", true),
            Striped::Failed(AckStatus::Io, _)
        ));
        // Unchanged at the receiver: done, nothing more is sent.
        let mut same = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        same.next_for(1);
        same.next_for(2);
        assert_eq!(
            same.answered(2, 1, AckStatus::Unchanged, "", false),
            Striped::Done(AckStatus::Unchanged)
        );
        assert_eq!(same.next_for(1), None);
        // A failure fails the file with its reason.
        let mut bad = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        bad.next_for(1);
        assert_eq!(
            bad.answered(1, 0, AckStatus::Io, "disk full", true),
            Striped::Failed(AckStatus::Io, "disk full".into())
        );
    }

    #[test]
    fn a_file_whose_first_piece_is_refused_as_a_piece_goes_whole() {
        use crate::proto::AckStatus;
        let id = TransferId([5; 16]);
        let mut file = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        file.next_for(1);
        file.next_for(2);
        let why = "this receiver takes files whole";
        assert_eq!(
            file.answered(1, 0, AckStatus::Protocol, why, false),
            Striped::Whole(why.into())
        );
        assert!(!file.more_to_send());
        // Once a piece was kept, a refusal fails the file instead.
        let mut file = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        file.next_for(1);
        file.next_for(2);
        assert_eq!(
            file.answered(1, 0, AckStatus::PieceKept, "", true),
            Striped::Pending
        );
        assert_eq!(
            file.answered(2, 1, AckStatus::Protocol, why, false),
            Striped::Failed(AckStatus::Protocol, why.into())
        );
    }

    #[test]
    fn only_a_piece_offered_again_may_be_answered_without_its_data() {
        use crate::proto::AckStatus;
        let id = TransferId([6; 16]);
        // Piece 0 at its first offer, verified before: someone else
        // filled it; the file failed, and nothing more goes.
        for status in [AckStatus::PieceKept, AckStatus::Ok] {
            let mut file = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
            file.next_for(1);
            file.next_for(2);
            assert_eq!(
                file.answered(1, 0, status, "", false),
                Striped::Failed(
                    AckStatus::Protocol,
                    "the receiver had piece 0 before this sender sent it".into()
                ),
                "{status:?}"
            );
            assert!(!file.more_to_send());
            assert_eq!(file.next_for(1), None);
        }
        // Piece 1 offered again after its lane was lost (its first ACK
        // lost with it): answered without data, it counts.
        let mut file = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        assert_eq!(file.next_for(1).unwrap().index, 0);
        assert_eq!(file.next_for(2).unwrap().index, 1);
        file.lane_gone(2);
        assert_eq!(file.next_for(1).unwrap().index, 1);
        assert_eq!(
            file.answered(1, 0, AckStatus::PieceKept, "", true),
            Striped::Pending
        );
        assert_eq!(
            file.answered(1, 1, AckStatus::PieceKept, "", false),
            Striped::Pending
        );
        assert!(file.more_to_send());
        assert_eq!(file.next_for(1).unwrap().index, 2);
        assert!(!file.more_to_send());
        // The last piece at its first offer, answered Ok without data:
        // the receiver made the file whole without it.
        let mut last = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        for lane in [1, 2, 1] {
            last.next_for(lane);
        }
        for (lane, index) in [(1, 0), (2, 1)] {
            last.answered(lane, index, AckStatus::PieceKept, "", true);
        }
        assert!(matches!(
            last.answered(1, 2, AckStatus::Ok, "", false),
            Striped::Failed(AckStatus::Protocol, _)
        ));
        // A verdict on the whole file without data (kept, unchanged) is
        // no piece verified before: it ends the file.
        let mut kept = Striping::new(id, 10 * MIB, 4 * MIB).unwrap();
        kept.next_for(1);
        assert_eq!(
            kept.answered(1, 0, AckStatus::KeptExisting, "", false),
            Striped::Done(AckStatus::KeptExisting)
        );
    }

    #[test]
    fn with_sha256_the_files_digest_is_that_of_its_pieces_digests() {
        let h = hello("a.bin", DigestAlg::Sha256);
        let mut file = Assembly::new(&h, &piece(0)).unwrap();
        let digests = [[1u8; 32], [2; 32], [3; 32]];
        let mut last = None;
        for (i, d) in digests.iter().enumerate() {
            file.offer(9, &h, &piece(i as u32)).unwrap();
            last = Some(file.verified(9, i as u32, Digest::Sha256(*d)).unwrap());
        }
        let mut want = Sha256::new();
        for d in &digests {
            want.update(d);
        }
        assert_eq!(
            last,
            Some(Progress::Complete(Digest::Sha256(want.finalize().into())))
        );
    }

    #[test]
    fn the_sender_builds_the_whole_digest_the_receiver_does_from_the_pieces_it_sent() {
        let data: Vec<u8> = (0..3 * PIECE_ALIGN as usize + 777)
            .map(|i| (i * 31 + i / 977) as u8)
            .collect();
        let size = data.len() as u64;
        let pieces: Vec<&[u8]> = data.chunks(PIECE_ALIGN as usize).collect();
        let id = TransferId([3; 16]);
        // CRC32: the file's own.
        let mut crc = Striping::new(id, size, PIECE_ALIGN).unwrap();
        for (i, p) in pieces.iter().enumerate().rev() {
            assert_eq!(crc.whole_digest(), None, "not every piece yet");
            crc.piece_digest(i as u32, Digest::Crc32(crc32fast::hash(p)));
        }
        assert_eq!(
            crc.whole_digest(),
            Some(Digest::Crc32(crc32fast::hash(&data)))
        );
        // SHA-256: over the pieces' SHA-256s in order.
        let mut sha = Striping::new(id, size, PIECE_ALIGN).unwrap();
        let mut over = Sha256::new();
        for (i, p) in pieces.iter().enumerate() {
            let h: [u8; 32] = Sha256::digest(p).into();
            over.update(h);
            sha.piece_digest(i as u32, Digest::Sha256(h));
        }
        assert_eq!(
            sha.whole_digest(),
            Some(Digest::Sha256(over.finalize().into()))
        );
        // A piece of the other kind: no whole digest.
        sha.piece_digest(0, Digest::Crc32(1));
        assert_eq!(sha.whole_digest(), None);
    }
}
