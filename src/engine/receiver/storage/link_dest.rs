//! --link-dest: a file the sender's digest matches is linked (or copied)
//! from the link-dest tree instead of received.

use super::FileStore;
use super::partial::TempInUse;
use super::paths::open_parent;
use super::sink::Sink;
use super::temp_file::{Resume, check_final_name, temp_name};
use crate::error::XferError;
use crate::proto::{Hello, Reject};
use crate::sys::dirfd::DirFd;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A regular file under --link-dest at an offered path, of the offered
/// size: the offer is linked to it (or copied from it) if their SHA-256s
/// are the same.
pub(in crate::engine::receiver) struct LinkCandidate {
    parent: DirFd,
    leaf: String,
    /// Open without following a link: what is hashed is what is linked
    /// (checked after the link, by device and inode).
    pub(in crate::engine::receiver) file: File,
    /// Its size and times before it was hashed: unchanged just before
    /// the link, the linked data is the hashed data.
    seen: Seen,
}

/// A file's size, modification time and inode change time: a write that
/// keeps the size and sets the modification time back still changes the
/// inode's (which nobody can set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

/// What `Seen` records of `file` now.
fn seen(file: &File) -> std::io::Result<Seen> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata()?;
    Ok(Seen {
        size: m.len(),
        mtime: (m.mtime(), m.mtime_nsec()),
        ctime: (m.ctime(), m.ctime_nsec()),
    })
}

/// Why a failed hard link may become a copy, if it may: only across file
/// systems (EXDEV). Any other failure, EPERM above all (the kernel's
/// protected_hardlinks refusing a file the receiver does not own, an
/// immutable file), is an answer, never worked around by copying.
pub(super) fn copy_instead_of_link(e: &std::io::Error) -> Option<String> {
    (e.raw_os_error() == Some(libc::EXDEV)).then(|| format!("it is on another file system ({e})"))
}

/// How a file from --link-dest was put in place.
#[derive(Debug)]
pub(in crate::engine::receiver) enum Linked {
    /// A hard link to the same inode.
    HardLink,
    /// A copy, checked against the sender's digest, because `why`.
    Copy(String),
}

/// Why a file from --link-dest could not be put in place: the offer is
/// then received whole, with this as the note.
#[derive(Debug, thiserror::Error)]
pub(in crate::engine::receiver) enum LinkError {
    /// Not a --dir receiver.
    #[error("no directory to link into")]
    NoDirectory,
    /// The offer's name cannot take a file (a link on the way, ...).
    #[error("{}", .0.reason)]
    Refused(Reject),
    /// The candidate could not be inspected.
    #[error("cannot inspect it: {0}")]
    Inspect(std::io::Error),
    /// The hard link failed (and a copy would not help).
    #[error("cannot link it: {0}")]
    Link(std::io::Error),
    /// Reading or writing the copy failed.
    #[error("cannot copy it: {0}")]
    Copy(std::io::Error),
    /// The copy's SHA-256 is not the one the offer was matched by.
    #[error("it changed while it was copied")]
    Changed,
    /// The copy could not be committed.
    #[error("{0}")]
    Commit(XferError),
    /// The session stopped the work (it ended, or SIGINT or SIGTERM came)
    /// before the file was put in place: nothing was.
    #[error("stopped before it was put in place: {0}")]
    Stopped(std::io::Error),
}

impl FileStore {
    /// The file under --link-dest that a CHECKSUM offer might be, or None
    /// (no --link-dest, no such regular file of that size, a link on the
    /// way, or a final name the offer would be refused for anyway).
    pub(in crate::engine::receiver) fn link_candidate(
        &self,
        hello: &Hello,
        overwrite: bool,
    ) -> Option<LinkCandidate> {
        let FileStore::Tree {
            root,
            link_dest: Some(dest),
            ..
        } = self
        else {
            return None;
        };
        if hello.is_stream() || hello.is_directory() {
            return None;
        }
        let (parent, leaf) = open_parent(root, &hello.name).ok()?;
        check_final_name(&parent, &leaf, &hello.name, overwrite).ok()?;
        let (parent, leaf) = open_parent(dest, &hello.name).ok()?;
        let file = parent.open_file(&leaf, false).ok()?;
        let seen = seen(&file).ok()?;
        (seen.size == hello.size).then_some(LinkCandidate {
            parent,
            leaf,
            file,
            seen,
        })
    }

    /// Puts `candidate`, whose SHA-256 is the offer's `sha256`, under the
    /// offer's name: a hard link when its modification time is the offer's
    /// (a link shares it with --link-dest's file), else, or across file
    /// systems, a copy made and committed like a received file (its
    /// SHA-256 checked again). Either way the file has the candidate's own
    /// permissions, never the offer's mode: a sender that knows a file's
    /// digest gets no wider access to it than its owner gave. `tick` is
    /// called between the copy's pieces, and once more right before the
    /// file takes its name (its failure leaves nothing there: a job its
    /// session left behind puts no file in place). Durable when it
    /// returns Ok.
    pub(in crate::engine::receiver) fn link_into_place(
        &mut self,
        hello: &Hello,
        candidate: &LinkCandidate,
        sha256: [u8; 32],
        (overwrite, chunk_len, dir): (bool, u32, &Path),
        tick: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> Result<Linked, LinkError> {
        let FileStore::Tree { root, umask, .. } = self else {
            return Err(LinkError::NoDirectory);
        };
        let umask = *umask;
        let (parent, leaf) = open_parent(root, &hello.name).map_err(LinkError::Refused)?;
        let meta = candidate.file.metadata().map_err(LinkError::Inspect)?;
        use std::os::unix::fs::MetadataExt;
        // A copy is the receiver's file: the candidate's permission bits
        // (no set-id bit), never more open than the receiver's umask, and
        // no group bits for a group that is not the receiver's.
        let mut mode = meta.permissions().mode() & 0o777 & !umask;
        if meta.gid() != rustix::process::getegid().as_raw() {
            mode &= !0o070;
        }
        // A link is the candidate itself: only one of the receiver's own
        // that nobody else may write, or a "received" file could change
        // under it later.
        let not_own = meta.uid() != rustix::process::geteuid().as_raw()
            || meta.permissions().mode() & 0o022 != 0;
        let why_copy = if hello
            .mtime
            .is_some_and(|m| (meta.mtime(), meta.mtime_nsec()) != (m.secs, i64::from(m.nanos)))
        {
            Some("its modification time is not the offer's".to_string())
        } else if not_own {
            Some("it is not the receiver's own, or others may write it".to_string())
        } else {
            None
        };
        let why_copy = match why_copy {
            Some(why) => why,
            None => match hard_link(candidate, &parent, &leaf, overwrite, tick) {
                Ok(()) => return Ok(Linked::HardLink),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {
                    return Err(LinkError::Stopped(e));
                }
                Err(e) => match copy_instead_of_link(&e) {
                    Some(why) => why,
                    None => return Err(LinkError::Link(e)),
                },
            },
        };
        let mut sink = self
            .create(hello, overwrite, dir, Resume::No)
            .map_err(LinkError::Refused)?;
        let copied = copy_verified(&candidate.file, &mut sink, hello.size, chunk_len, tick)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::Interrupted => LinkError::Stopped(e),
                _ => LinkError::Copy(e),
            })?;
        if copied != crate::proto::Digest::Sha256(sha256) {
            return Err(LinkError::Changed);
        }
        // Stopped now: the temporary file goes with the sink.
        if let Err(e) = tick() {
            drop(sink);
            return Err(LinkError::Stopped(e));
        }
        sink.commit(&hello.name, mode, hello.mtime, overwrite)
            .map_err(LinkError::Commit)?;
        Ok(Linked::Copy(why_copy))
    }
}

/// Links the candidate to a temporary name beside `leaf` in `parent`,
/// checks that the link is the inode that was hashed, and renames it into
/// place; the directory is fsynced. `tick` runs before the link and
/// before the rename: its failure leaves nothing under `leaf`.
pub(super) fn hard_link(
    candidate: &LinkCandidate,
    parent: &DirFd,
    leaf: &str,
    overwrite: bool,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<()> {
    let changed = || std::io::Error::other("the --link-dest file changed meanwhile");
    // Already there (--overwrite of an earlier run's link): nothing to do
    // but make it durable (a rename between two links of one file does
    // nothing, and would leave the temporary name).
    if matches!(parent.is_same(leaf, &candidate.file), Ok(true)) {
        candidate.file.sync_all()?;
        return parent.sync();
    }
    // The inode hashed, unchanged since (its change time too: the link
    // below changes that one): the data hashed. A write after the link
    // would change both names alike, as it would any hard link's.
    if seen(&candidate.file)? != candidate.seen {
        return Err(changed());
    }
    tick()?;
    let temp = temp_name();
    // Marked before it exists: the sweep never sees it unmarked.
    let _in_use = TempInUse::new(parent, &temp)?;
    candidate.parent.link_to(&candidate.leaf, parent, &temp)?;
    let linked = parent.is_same(&temp, &candidate.file).and_then(|same| {
        let now = seen(&candidate.file)?;
        if !same || (now.size, now.mtime) != (candidate.seen.size, candidate.seen.mtime) {
            return Err(changed());
        }
        // What the ACK promises must survive a crash: the data, then the
        // new name.
        candidate.file.sync_all()?;
        tick()?;
        parent.rename(&temp, leaf, !overwrite)
    });
    if let Err(e) = linked {
        let _ = parent.unlink(&temp);
        return Err(e);
    }
    // In place now: if this fsync fails the file is sent instead, and
    // refused as existing (the name is taken): the sender hears of it.
    parent.sync()
}

/// How much of a --link-dest copy is written between two `sync_data`s:
/// the commit's fsync, one long call that counts no progress, then has
/// little left to do (a slow disk does not look like a stalled copy).
const SYNC_EVERY: u64 = 64 << 20;

/// Copies `size` bytes of `from` into the temporary file of `sink`, as
/// chunks are written, and returns their SHA-256. `tick` runs before each
/// read (`digest::MAX_READ` at most); the data written is synced every
/// `SYNC_EVERY` bytes, the next `tick` counting that as progress.
pub(super) fn copy_verified(
    from: &File,
    sink: &mut Sink,
    size: u64,
    chunk_len: u32,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<crate::proto::Digest> {
    let mut unsynced = 0u64;
    let read = crate::engine::digest::read_prefix(
        from,
        size,
        chunk_len,
        crate::proto::DigestAlg::Sha256,
        tick,
        |index, data, crc| {
            let offset = index * u64::from(chunk_len);
            sink.write(data, offset, crc, offset)?;
            unsynced += data.len() as u64;
            if unsynced >= SYNC_EVERY {
                sink.sync_data()?;
                unsynced = 0;
            }
            Ok(())
        },
    )?;
    Ok(read.hasher.finish())
}
