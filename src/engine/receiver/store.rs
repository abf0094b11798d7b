//! The receiver's file store: where received entries go (a tree under
//! `--dir`, standard output, nowhere with --discard, a command per file
//! with --exec), checked against what is on disk, written
//! to a temporary file next to the final name and committed (fsync, rename,
//! fsync of the directory) only once verified. Paths are resolved component
//! by component from the output directory's descriptor, never through a
//! link. No RDMA here: unit-tested with a temporary directory.

use super::exec::ExecSpec;
use super::partial::{
    self, Claim, Holding, Identity, OpenSidecar, Resumable, SidecarKey, TempInUse,
};
use super::sink::Sink;
use super::space::{Promise, SpaceLedger};
use super::{Output, ReceiverConfig};
use crate::engine::digest::FileHasher;
use crate::error::XferError;
use crate::proto::{Hello, Mtime, RejectCode};
use crate::sys::dirfd::{DirFd, EntryKind, OwnFileError};
use crate::sys::os::{free_space, reserve_blocks};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tracing::{debug, warn};

/// Where received entries go.
pub(super) enum FileStore {
    /// Under --dir: every path resolved from this descriptor, component by
    /// component, never through a link.
    Tree {
        root: DirFd,
        /// Attributes of directories created in this session that are
        /// applied when it ends (deepest last created first): an mtime
        /// would be changed by the entries created inside, and a mode
        /// without owner write/search would forbid creating them.
        deferred: Vec<DirAttrs>,
        /// The receiver's umask, and whether it lets `sender -p` keep its
        /// modes (see `Hello::received_mode`).
        umask: u32,
        keep_modes: bool,
        /// Space promised to the files all sessions are receiving.
        ledger: Arc<SpaceLedger>,
        /// --link-dest: where files the sender's digest matches are
        /// linked (or copied) from instead of received.
        link_dest: Option<DirFd>,
    },
    /// --stdout: the one file or stream of the session; None once taken.
    Stdout(Option<File>),
    /// --discard: entries are checked and verified, nothing is created.
    Discard,
    /// --exec: each file goes to its own command, run in --dir (`root`,
    /// which names are checked against: no link on the way is followed).
    Exec {
        root: DirFd,
        spec: ExecSpec,
        /// The sender's address (RDMA_XFER_PEER).
        peer: String,
    },
}

pub(super) struct DirAttrs {
    path: String,
    mode: Option<u32>,
    mtime: Option<Mtime>,
}

/// A refusal of an offer: the code and reason the sender hears.
pub(super) type Refusal = (RejectCode, String);

impl FileStore {
    pub(super) fn open(
        cfg: &ReceiverConfig,
        ledger: &Arc<SpaceLedger>,
    ) -> Result<FileStore, XferError> {
        let open_root = || {
            DirFd::open(&cfg.dir)
                .map_err(|e| XferError::io(format!("output directory {}", cfg.dir.display()), e))
        };
        match &cfg.output {
            Output::Dir => {}
            Output::Discard => return Ok(FileStore::Discard),
            Output::Stdout => return FileStore::stdout(cfg),
            Output::Exec(command) => {
                return Ok(FileStore::Exec {
                    root: open_root()?,
                    spec: ExecSpec {
                        command: command.clone(),
                        // Acts before the sender's own timeout (the same
                        // --timeout by default) would.
                        stall: cfg.timeout.mul_f64(0.75),
                        pipe_bytes: cfg.chunk_size as usize,
                    },
                    peer: String::new(),
                });
            }
        }
        let root = open_root()?;
        let link_dest = match &cfg.link_dest {
            Some(dir) => Some(DirFd::open(dir).map_err(|e| {
                XferError::io(format!("--link-dest directory {}", dir.display()), e)
            })?),
            None => None,
        };
        Ok(FileStore::Tree {
            root,
            deferred: Vec::new(),
            umask: cfg.umask,
            keep_modes: cfg.keep_modes,
            ledger: Arc::clone(ledger),
            link_dest,
        })
    }

    fn stdout(cfg: &ReceiverConfig) -> Result<FileStore, XferError> {
        // A duplicate of descriptor 1: unbuffered writes of whole chunks,
        // and a write error (EPIPE) is ours to handle.
        use std::os::fd::AsFd;
        let fd = std::io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| XferError::io("cannot use standard output", e))?;
        crate::engine::stdio::grow_pipe(&fd, cfg.chunk_size as usize);
        Ok(FileStore::Stdout(Some(File::from(fd))))
    }

    /// The sender's address, for the commands of --exec.
    pub(super) fn set_peer(&mut self, address: &str) {
        if let FileStore::Exec { peer, .. } = self {
            *peer = address.to_string();
        }
    }

    /// A command is started per file (--exec): it must start only for an
    /// offer the session can take (its ring registered).
    pub(super) fn starts_commands(&self) -> bool {
        matches!(self, FileStore::Exec { .. })
    }

    /// Applies the deferred directory attributes (best effort: a failure
    /// is logged, the data is already safe).
    pub(super) fn finish_dirs(&mut self) {
        let FileStore::Tree { root, deferred, .. } = self else {
            return;
        };
        for attrs in deferred.drain(..).rev() {
            let applied = open_path(root, &attrs.path).and_then(|dir| {
                let f = dir.as_file()?;
                if let Some(mode) = attrs.mode {
                    f.set_permissions(std::fs::Permissions::from_mode(mode))?;
                }
                if let Some(t) = attrs.mtime.and_then(system_time) {
                    f.set_modified(t)?;
                }
                Ok(())
            });
            if let Err(e) = applied {
                warn!(dir = %attrs.path, "cannot set the mode or time of a received directory: {e}");
            }
        }
    }

    /// Creates the directory `hello.name` (mode 0700 while its entries
    /// arrive, see `FileStore::Tree::deferred`), or accepts an existing one
    /// as it is.
    pub(super) fn make_dir(&mut self, hello: &Hello) -> Result<(), Refusal> {
        let (root, deferred, umask, keep_modes) = match self {
            FileStore::Tree {
                root,
                deferred,
                umask,
                keep_modes,
                ..
            } => (root, deferred, umask, keep_modes),
            // Accepted: its entries are checked and dropped like any.
            FileStore::Discard => return Ok(()),
            // The commands make what they need; the name must not lead
            // through a link.
            FileStore::Exec { root, .. } => return check_exec_path(root, &hello.name),
            FileStore::Stdout(_) => {
                return Err((
                    RejectCode::Protocol,
                    format!(
                        "the receiver writes to its standard output (--stdout) and cannot create directory {}; send a tar stream instead (tar -cf - DIR | sender HOST -)",
                        hello.name
                    ),
                ));
            }
        };
        let (parent, leaf) = open_parent(root, &hello.name)?;
        let io = |what: &str, e: std::io::Error| {
            let code = match e.raw_os_error() {
                Some(libc::ENOSPC | libc::EDQUOT) => RejectCode::NoSpace,
                _ => RejectCode::Io,
            };
            (code, format!("{what} {}: {e}", hello.name))
        };
        match parent.kind(&leaf).map_err(|e| io("cannot inspect", e))? {
            Some(EntryKind::Dir) => {
                debug!(dir = %hello.name, "exists already: kept as it is");
                return Ok(());
            }
            Some(EntryKind::Symlink) => {
                return Err((
                    RejectCode::Exists,
                    format!(
                        "{} is a symbolic link on the receiver: not followed",
                        hello.name
                    ),
                ));
            }
            Some(_) => {
                return Err((
                    RejectCode::Exists,
                    format!(
                        "{} exists on the receiver and is not a directory",
                        hello.name
                    ),
                ));
            }
            None => {}
        }
        parent
            .mkdir(&leaf, 0o700)
            .map_err(|e| io("cannot create directory", e))?;
        let mode = hello.received_mode(*umask, *keep_modes);
        // Owner write and search are needed while entries are created inside.
        let now = if mode & 0o300 == 0o300 {
            mode
        } else {
            mode | 0o700
        };
        let dir = parent
            .open_dir(&leaf)
            .map_err(|e| io("cannot open the new directory", e))?;
        dir.as_file()
            .and_then(|f| f.set_permissions(std::fs::Permissions::from_mode(now)))
            .map_err(|e| io("cannot set the mode of", e))?;
        // The new entry must survive a crash like every acknowledged file.
        parent
            .sync()
            .map_err(|e| io("cannot fsync the parent of", e))?;
        if now != mode || hello.mtime.is_some() {
            deferred.push(DirAttrs {
                path: hello.name.clone(),
                mode: (now != mode).then_some(mode),
                mtime: hello.mtime,
            });
        }
        Ok(())
    }

    /// What the receiver holds of an offer with RESUME (see
    /// `partial::find`), and the claim on its partial file that writing it
    /// needs. A partial file another session holds (one whose sender is
    /// gone, say, not yet timed out) is waited for up to `wait`, `tick`
    /// called meanwhile; then, or for standard output, nothing is held.
    ///
    /// Any other file under the final name is refused at once without
    /// `overwrite` (before a kept part is read for nothing).
    pub(super) fn holding(
        &self,
        hello: &Hello,
        (chunk_len, overwrite): (u32, bool),
        wait: Duration,
        tick: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> Result<(Holding, Option<Claim>), Refusal> {
        let root = match self {
            FileStore::Tree { root, .. } => root,
            FileStore::Stdout(_) => {
                return Ok((
                    Holding::nothing(
                        "the receiver writes to its standard output: nothing is kept there",
                    ),
                    None,
                ));
            }
            // Nothing is ever kept, and nothing is worth saying about it.
            FileStore::Discard | FileStore::Exec { .. } => {
                return Ok((Holding::nothing(""), None));
            }
        };
        let (parent, leaf) = open_parent(root, &hello.name)?;
        let io = |e: std::io::Error| (RejectCode::Io, format!("{}: {e}", hello.name));
        let until = std::time::Instant::now() + wait;
        let claim = loop {
            if let Some(claim) = Claim::try_take(&parent, &leaf).map_err(io)? {
                break claim;
            }
            if std::time::Instant::now() >= until {
                return Ok((
                    Holding::nothing(
                        "another session is receiving this file: sent whole, not kept",
                    ),
                    None,
                ));
            }
            tick().map_err(io)?;
            std::thread::sleep(Duration::from_millis(100));
        };
        if let Some(copy) = partial::copy_of(&parent, &leaf, hello) {
            return Ok((Holding::copy(hello.size, copy), Some(claim)));
        }
        check_final_name(&parent, &leaf, &hello.name, overwrite)?;
        // Without a usable key no record is trusted: nothing is kept.
        let key = SidecarKey::load(root).unwrap_or_else(|e| {
            warn!(file = %hello.name, "{e}");
            None
        });
        Ok((
            partial::kept_prefix(&parent, &leaf, hello, chunk_len, key.as_ref(), tick),
            Some(claim),
        ))
    }

    /// Checks an offer against what is on disk (exists, free space, links
    /// on the way) and opens where its bytes go: a new temporary file next
    /// to the final name (with RESUME a partial file kept if the transfer
    /// fails, or the kept one continued), or standard output.
    pub(super) fn create(
        &mut self,
        hello: &Hello,
        overwrite: bool,
        dir: &Path,
        resume: Resume<'_>,
    ) -> Result<Sink, Refusal> {
        self.create_announced(hello, overwrite, dir, resume, None)
    }

    /// As `create`, with the file's SHA-256 if its sender announced it
    /// before the data (`--exec` passes it on, and checks the data
    /// against it).
    pub(super) fn create_announced(
        &mut self,
        hello: &Hello,
        overwrite: bool,
        dir: &Path,
        resume: Resume<'_>,
        sha256: Option<[u8; 32]>,
    ) -> Result<Sink, Refusal> {
        let sink = match self {
            FileStore::Stdout(out) => {
                let Some(out) = out.take() else {
                    return Err((
                        RejectCode::Protocol,
                        format!(
                            "the receiver writes to its standard output (--stdout) and takes one file or stream per session; {} is one too many",
                            hello.name
                        ),
                    ));
                };
                Sink::Stdout(out)
            }
            FileStore::Discard => Sink::Discard,
            FileStore::Exec { root, spec, peer } => {
                check_exec_path(root, &hello.name)?;
                let size = (!hello.is_stream()).then_some(hello.size);
                let exec = spec
                    .start(root, &hello.name, size, peer, sha256)
                    .map_err(|e| {
                        (
                            RejectCode::Io,
                            format!("cannot start the --exec command for {}: {e}", hello.name),
                        )
                    })?;
                Sink::Exec(Box::new(exec))
            }
            FileStore::Tree { root, ledger, .. } => {
                let (parent, leaf) = open_parent(root, &hello.name)?;
                check_final_name(&parent, &leaf, &hello.name, overwrite)?;
                // A stream's size is unknown: it is checked as it arrives
                // (--max-size by the state machine, space by the writes).
                let size = if hello.is_stream() { 0 } else { hello.size };
                let kept = match &resume {
                    Resume::Continue(s, _) => s.prefix_bytes(),
                    _ => 0,
                };
                let promise =
                    ledger.promise(&hello.name, size - kept.min(size), || free_space(dir))?;
                let plain_temp = || {
                    let temp = temp_name();
                    // Marked before it exists: the sweep never sees it
                    // unmarked.
                    let in_use = TempInUse::new(&parent, &temp).map_err(cannot_create)?;
                    let file = parent.create_new(&temp, 0o600).map_err(cannot_create)?;
                    Ok::<_, Refusal>((temp, file, None, Some(in_use)))
                };
                let (temp, file, resumable, in_use) = match resume {
                    Resume::No => plain_temp()?,
                    Resume::Fresh(claim) => {
                        let identity = Identity::of_offer(hello, 0).ok_or_else(|| {
                            (
                                RejectCode::Protocol,
                                format!(
                                    "{}: a resumable offer without a modification time",
                                    hello.name
                                ),
                            )
                        })?;
                        let started = SidecarKey::get_or_create(root)
                            .map(|key| Resumable::start(&parent, &leaf, identity, key, claim));
                        // Without a key, or with kept files that are not
                        // the receiver's own (never replaced nor written):
                        // received whole under a temporary name, not kept
                        // if it fails.
                        let not_resumable = |e: &dyn std::fmt::Display| {
                            warn!(file = %hello.name, "received from the start under a temporary name, not resumable: {e}");
                        };
                        match started {
                            Ok(Ok((r, file))) => (r.names().0.to_string(), file, Some(r), None),
                            Ok(Err(e @ OwnFileError::Foreign { .. })) => {
                                not_resumable(&e);
                                plain_temp()?
                            }
                            Ok(Err(OwnFileError::Io(e))) => return Err(cannot_create(e)),
                            Err(e) => {
                                not_resumable(&e);
                                plain_temp()?
                            }
                        }
                    }
                    Resume::Continue(sidecar, claim) => {
                        let (r, file) =
                            Resumable::resume(&parent, &leaf, sidecar, claim).map_err(|e| {
                                (
                                    RejectCode::Io,
                                    format!(
                                        "cannot continue the partial file of {}: {e}",
                                        hello.name
                                    ),
                                )
                            })?;
                        (r.names().0.to_string(), file, Some(r), None)
                    }
                };
                let mut temp = TempFile {
                    parent: Arc::new(parent),
                    temp,
                    leaf,
                    file,
                    committed: false,
                    promise,
                    resumable,
                    discard: false,
                    _in_use: in_use,
                };
                // Dropping `temp` removes the file if the space is not there.
                match reserve_blocks(&temp.file, size) {
                    Ok(true) => temp.promise.settle(),
                    Ok(false) => {}
                    Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)) => {
                        return Err((
                            RejectCode::NoSpace,
                            format!("cannot reserve {size} bytes for {}: {e}", hello.name),
                        ));
                    }
                    Err(e) => warn!("cannot reserve the space of {}: {e}", hello.name),
                }
                Sink::Temp(Box::new(temp))
            }
        };
        Ok(sink)
    }
}

/// A regular file under --link-dest at an offered path, of the offered
/// size: the offer is linked to it (or copied from it) if their SHA-256s
/// are the same.
pub(super) struct LinkCandidate {
    parent: DirFd,
    leaf: String,
    /// Open without following a link: what is hashed is what is linked
    /// (checked after the link, by device and inode).
    pub(super) file: File,
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
fn copy_instead_of_link(e: &std::io::Error) -> Option<String> {
    (e.raw_os_error() == Some(libc::EXDEV)).then(|| format!("it is on another file system ({e})"))
}

/// How a file from --link-dest was put in place.
#[derive(Debug)]
pub(super) enum Linked {
    /// A hard link to the same inode.
    HardLink,
    /// A copy, checked against the sender's digest, because `why`.
    Copy(String),
}

impl FileStore {
    /// The file under --link-dest that a CHECKSUM offer might be, or None
    /// (no --link-dest, no such regular file of that size, a link on the
    /// way, or a final name the offer would be refused for anyway).
    pub(super) fn link_candidate(&self, hello: &Hello, overwrite: bool) -> Option<LinkCandidate> {
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
    /// called between the copy's pieces. Durable when it returns Ok.
    pub(super) fn link_into_place(
        &mut self,
        hello: &Hello,
        candidate: &LinkCandidate,
        sha256: [u8; 32],
        (overwrite, chunk_len, dir): (bool, u32, &Path),
        tick: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> Result<Linked, String> {
        let FileStore::Tree { root, umask, .. } = self else {
            return Err("no directory to link into".into());
        };
        let umask = *umask;
        let (parent, leaf) = open_parent(root, &hello.name).map_err(|(_, why)| why)?;
        let meta = candidate.file.metadata().map_err(|e| e.to_string())?;
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
            None => match hard_link(candidate, &parent, &leaf, overwrite) {
                Ok(()) => return Ok(Linked::HardLink),
                Err(e) => match copy_instead_of_link(&e) {
                    Some(why) => why,
                    None => return Err(format!("cannot link it: {e}")),
                },
            },
        };
        let mut sink = self
            .create(hello, overwrite, dir, Resume::No)
            .map_err(|(_, why)| why)?;
        let copied = copy_verified(&candidate.file, &mut sink, hello.size, chunk_len, tick)
            .map_err(|e| format!("cannot copy it: {e}"))?;
        if copied != crate::proto::Digest::Sha256(sha256) {
            return Err("it changed while it was copied".into());
        }
        sink.commit(&hello.name, mode, hello.mtime, overwrite)
            .map_err(|e| e.to_string())?;
        Ok(Linked::Copy(why_copy))
    }
}

/// Links the candidate to a temporary name beside `leaf` in `parent`,
/// checks that the link is the inode that was hashed, and renames it into
/// place; the directory is fsynced.
fn hard_link(
    candidate: &LinkCandidate,
    parent: &DirFd,
    leaf: &str,
    overwrite: bool,
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

/// Copies `size` bytes of `from` into the temporary file of `sink`, as
/// chunks are written, and returns their SHA-256.
fn copy_verified(
    from: &File,
    sink: &mut Sink,
    size: u64,
    chunk_len: u32,
    tick: &mut dyn FnMut() -> std::io::Result<()>,
) -> std::io::Result<crate::proto::Digest> {
    let read = crate::engine::digest::read_prefix(
        from,
        size,
        chunk_len,
        crate::proto::DigestAlg::Sha256,
        |index, data, crc| {
            let offset = index * u64::from(chunk_len);
            match sink.write(data, offset, crc, offset) {
                Ok(()) => tick(),
                Err(super::sink::Unwritten::Failed(e)) => Err(e),
                Err(super::sink::Unwritten::OutOfOrder) => {
                    Err(std::io::Error::other("the copy is written out of order"))
                }
            }
        },
    )?;
    Ok(read.hasher.finish())
}

impl FileStore {
    /// Checks the files of a batch against what is on disk and opens a
    /// temporary file for each, as `create` does for one file, with the
    /// work shared by the batch: each directory opened once, the free
    /// space checked once for all of them, and no blocks reserved (small
    /// files; a write that finds the disk full fails the batch).
    pub(super) fn create_batch(
        &mut self,
        members: &[Hello],
        overwrite: bool,
        dir: &Path,
        modes: (u32, bool),
    ) -> Result<BatchSink, Refusal> {
        let (root, ledger) = match self {
            FileStore::Tree { root, ledger, .. } => (root, ledger),
            FileStore::Stdout(_) => {
                return Err((
                    RejectCode::Protocol,
                    "the receiver writes one file to its standard output (--stdout)".into(),
                ));
            }
            FileStore::Exec { .. } => {
                return Err((
                    RejectCode::Protocol,
                    "the receiver runs a command per file (--exec): the files come one by one"
                        .into(),
                ));
            }
            FileStore::Discard => {
                let mut batch = BatchSink::new(None);
                for h in members {
                    batch.push(h, modes, None);
                }
                return Ok(batch);
            }
        };
        // Each file takes whole blocks (4 KiB on most file systems) and
        // an inode: a batch of tiny files is not "a few bytes".
        let total = members.iter().fold(0u64, |t, h| {
            t.saturating_add(h.size.saturating_add(4095) & !4095)
        });
        let what = format!("a batch of {} files", members.len());
        let files = members.len() as u64;
        let promise = ledger.promise_files(&what, total, files, || free_space(dir))?;
        let mut batch = BatchSink::new(Some(promise));
        let mut parents: std::collections::HashMap<&str, (Arc<DirFd>, (u64, u64))> =
            std::collections::HashMap::new();
        // Every name is checked before any temporary file is made: a
        // refused batch costs no file creation.
        let mut targets = Vec::with_capacity(members.len());
        for h in members {
            let (dir_path, leaf) = h.name.rsplit_once('/').unwrap_or(("", h.name.as_str()));
            let (parent, identity) = match parents.get(dir_path) {
                Some((p, id)) => (Arc::clone(p), *id),
                None => {
                    let (p, _) = open_parent(root, &h.name)?;
                    let id = p.identity().map_err(|e| {
                        let dir = if dir_path.is_empty() {
                            "the output directory"
                        } else {
                            dir_path
                        };
                        (RejectCode::Io, format!("cannot inspect {dir}: {e}"))
                    })?;
                    let p = Arc::new(p);
                    parents.insert(dir_path, (Arc::clone(&p), id));
                    (p, id)
                }
            };
            check_final_name(&parent, leaf, &h.name, overwrite)?;
            targets.push((h, parent, identity, leaf));
        }
        for (h, parent, identity, leaf) in targets {
            let temp = temp_name();
            // Marked before it exists: the sweep never sees it unmarked.
            let in_use = TempInUse::known(identity, &temp);
            let file = parent.create_new(&temp, 0o600).map_err(cannot_create)?;
            let t = TempFile {
                parent,
                temp,
                leaf: leaf.to_string(),
                file,
                committed: false,
                promise: Promise::none(ledger),
                resumable: None,
                discard: false,
                _in_use: Some(in_use),
            };
            batch.push(h, modes, Some(Box::new(t)));
        }
        Ok(batch)
    }
}

/// Opens `path` (relative, already validated) below `root`, every component
/// with O_NOFOLLOW.
fn open_path(root: &DirFd, path: &str) -> std::io::Result<DirFd> {
    let mut dir = root.try_clone()?;
    for c in path.split('/') {
        dir = dir.open_dir(c)?;
    }
    Ok(dir)
}

/// Opens the directory that holds `path`'s last component; returns it and
/// that component. Refuses symbolic links and non-directories on the way.
fn open_parent(root: &DirFd, path: &str) -> Result<(DirFd, String), Refusal> {
    let (parents, leaf) = match path.rsplit_once('/') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let dir = match parents {
        Some(parents) => walk(root, parents, false)?.ok_or_else(|| {
            (
                RejectCode::Io,
                format!("cannot open the directory of {path}"),
            )
        })?,
        None => root.try_clone().map_err(|e| {
            (
                RejectCode::Io,
                format!("cannot open the output directory: {e}"),
            )
        })?,
    };
    Ok((dir, leaf.to_string()))
}

/// Opens the directory `parents` (relative, validated) below `root`,
/// refusing links and non-directories on the way; a missing part is
/// refused too, or, with `missing_ok`, gives None.
fn walk(root: &DirFd, parents: &str, missing_ok: bool) -> Result<Option<DirFd>, Refusal> {
    let mut dir = root.try_clone().map_err(|e| {
        (
            RejectCode::Io,
            format!("cannot open the output directory: {e}"),
        )
    })?;
    let mut walked = String::new();
    for c in parents.split('/') {
        if !walked.is_empty() {
            walked.push('/');
        }
        walked.push_str(c);
        dir = match dir.open_dir(c) {
            Ok(d) => d,
            Err(e) if missing_ok && e.raw_os_error() == Some(libc::ENOENT) => return Ok(None),
            Err(e) => return Err(refusal_on_the_way(&dir, c, &walked, e)),
        };
    }
    Ok(Some(dir))
}

/// Why the directory `walked` (entry `c` of `dir`) cannot be gone through.
fn refusal_on_the_way(dir: &DirFd, c: &str, walked: &str, e: std::io::Error) -> Refusal {
    match e.raw_os_error() {
        Some(libc::ENOENT) => (
            RejectCode::Io,
            format!("directory {walked} does not exist on the receiver"),
        ),
        Some(libc::ELOOP | libc::ENOTDIR) => {
            if dir.kind(c).ok().flatten() == Some(EntryKind::Symlink) {
                (
                    RejectCode::Exists,
                    format!("{walked} is a symbolic link on the receiver: not followed"),
                )
            } else {
                (
                    RejectCode::Exists,
                    format!("{walked} exists on the receiver and is not a directory"),
                )
            }
        }
        _ => (
            RejectCode::Io,
            format!("cannot open directory {walked}: {e}"),
        ),
    }
}

/// Checks a name for --exec's command: every part of it that exists under
/// `root` is a directory (its last part anything but a link); what does not
/// exist yet is the command's to make.
fn check_exec_path(root: &DirFd, path: &str) -> Result<(), Refusal> {
    let (parents, leaf) = match path.rsplit_once('/') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let parent = match parents {
        Some(p) => match walk(root, p, true)? {
            Some(dir) => dir,
            None => return Ok(()),
        },
        None => root.try_clone().map_err(|e| {
            (
                RejectCode::Io,
                format!("cannot open the output directory: {e}"),
            )
        })?,
    };
    match parent.kind(leaf) {
        Ok(Some(EntryKind::Symlink)) => Err((
            RejectCode::Exists,
            format!("{path} is a symbolic link on the receiver: not followed"),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err((RejectCode::Io, format!("cannot inspect {path}: {e}"))),
    }
}

fn system_time(m: Mtime) -> Option<std::time::SystemTime> {
    let epoch = std::time::UNIX_EPOCH;
    let nanos = Duration::from_nanos(m.nanos.into());
    if m.secs >= 0 {
        epoch
            .checked_add(Duration::from_secs(m.secs as u64))?
            .checked_add(nanos)
    } else {
        epoch
            .checked_sub(Duration::from_secs(m.secs.unsigned_abs()))?
            .checked_add(nanos)
    }
}

/// A temporary file next to the final name, removed on drop unless it was
/// renamed into place, or, offered with RESUME, kept with its record of
/// the verified chunks (see `partial`).
pub(super) struct TempFile {
    /// Shared by the files of a batch in one directory.
    parent: Arc<DirFd>,
    temp: String,
    leaf: String,
    pub(super) file: File,
    committed: bool,
    /// What is left of the space promised to this file.
    promise: Promise,
    /// The record of verified chunks of a file offered with RESUME.
    resumable: Option<Resumable>,
    /// Nothing of it may be kept, even with RESUME (its digest failed).
    discard: bool,
    /// A plain temporary file's mark for the sweep (a partial file has
    /// its claim instead). Dropped after the file is renamed or removed.
    _in_use: Option<TempInUse>,
}

impl TempFile {
    /// Writes the next chunk (checked against its CRC32 `crc`) at its
    /// offset.
    pub(super) fn write_chunk(
        &mut self,
        data: &[u8],
        offset: u64,
        crc: u32,
    ) -> std::io::Result<()> {
        if let Err(e) = self.file.write_all_at(data, offset) {
            self.write_failed();
            return Err(e);
        }
        self.chunk_written(data.len() as u32, crc)
    }

    /// A descriptor of the file for writer threads (`WriteBehind`), which
    /// write chunks at their offsets; each write is then `chunk_written`
    /// or `write_failed`, in the order of the chunks.
    pub(super) fn writer_handle(&self) -> std::io::Result<Arc<File>> {
        Ok(Arc::new(self.file.try_clone()?))
    }

    /// The next chunk (`len` bytes, CRC32 `crc`) is written.
    pub(super) fn chunk_written(&mut self, len: u32, crc: u32) -> std::io::Result<()> {
        self.promise.wrote(u64::from(len));
        if let Some(r) = self.resumable.as_mut() {
            r.chunk_written(crc, len)?;
        }
        Ok(())
    }

    /// Writing the next chunk failed: nothing from it on is recorded.
    pub(super) fn write_failed(&mut self) {
        if let Some(r) = self.resumable.as_mut() {
            r.write_failed();
        }
    }

    /// The data failed its whole-file check: nothing of it is kept.
    pub(super) fn discard(&mut self) {
        self.discard = true;
    }

    /// The transfer failed (or the file is dropped uncommitted): with
    /// RESUME what was written and checked is kept for a later attempt,
    /// else the file goes. Returns the bytes kept (0: nothing is left).
    pub(super) fn end_uncommitted(&mut self) -> u64 {
        if self.committed {
            return 0;
        }
        // Once: the drop that follows does nothing more.
        self.committed = true;
        match self.resumable.take() {
            // Unverified: nothing worth keeping.
            Some(r) if self.discard => r.discard(),
            // Kept: whatever was written and checked gets its records.
            Some(r) => match r.keep() {
                Ok(kept) => return kept,
                Err(e) => {
                    warn!(path = %self.temp, "cannot record the last chunks of a partial file: {e}");
                }
            },
            None => {
                if let Err(e) = partial::remove(&self.parent, &self.temp, &self.file) {
                    warn!(path = %self.temp, "cannot remove temporary file: {e}");
                }
            }
        }
        0
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        self.end_uncommitted();
    }
}

/// How an offered file is written.
pub(super) enum Resume<'a> {
    /// A temporary file, removed if the transfer fails.
    No,
    /// Offered with RESUME, starting from zero: a partial file whose
    /// verified chunks are kept if the transfer fails.
    Fresh(Claim),
    /// Continues the kept partial file after its verified prefix.
    Continue(&'a OpenSidecar, Claim),
}

/// Refuses an offer whose final name `leaf` in `parent` is a directory,
/// or any existing entry without `overwrite`.
fn check_final_name(
    parent: &DirFd,
    leaf: &str,
    name: &str,
    overwrite: bool,
) -> Result<(), Refusal> {
    match parent.kind(leaf) {
        Ok(Some(EntryKind::Dir)) => Err((
            RejectCode::Exists,
            format!("{name} exists and is a directory"),
        )),
        Ok(Some(_)) if !overwrite => Err((
            RejectCode::Exists,
            format!("{name} already exists on the receiver (it runs without --overwrite)"),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err((RejectCode::Io, format!("cannot inspect {name}: {e}"))),
    }
}

/// Why a temporary file could not be made.
fn cannot_create(e: std::io::Error) -> Refusal {
    let code = match e.raw_os_error() {
        Some(libc::ENOSPC | libc::EDQUOT) => RejectCode::NoSpace,
        _ => RejectCode::Io,
    };
    (
        code,
        format!("cannot create a file in the output directory: {e}"),
    )
}

/// A temporary name that does not depend on the (up to 255-byte) final name.
pub(super) fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // One getpid for the process, not one per file.
    static PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    format!(
        ".rdma-xfer-{}-{}-{nanos:08x}.part",
        PID.get_or_init(std::process::id),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

impl TempFile {
    /// Makes the verified file durable: applies the mode (and mtime),
    /// fsyncs, renames it into place and fsyncs the directory.
    pub(super) fn commit(
        &mut self,
        name: &str,
        mode: u32,
        mtime: Option<Mtime>,
        overwrite: bool,
    ) -> Result<(), XferError> {
        self.make_durable(name, mode, mtime)?;
        self.move_into_place(name, overwrite)?;
        self.parent
            .sync()
            .map_err(|e| XferError::io(format!("cannot fsync the directory of {name}"), e))
    }

    /// Applies the mode (and mtime) and fsyncs the data.
    fn make_durable(
        &mut self,
        name: &str,
        mode: u32,
        mtime: Option<Mtime>,
    ) -> Result<(), XferError> {
        let ctx = |what: &str| format!("{what} {name}");
        self.file
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|e| XferError::io(ctx("cannot set the mode of"), e))?;
        if let Some(m) = mtime.and_then(system_time) {
            self.file
                .set_modified(m)
                .map_err(|e| XferError::io(ctx("cannot set the modification time of"), e))?;
        }
        if let Err(e) = self.file.sync_all() {
            // Pages may be lost: no record may promise them now.
            if let Some(r) = self.resumable.as_mut() {
                r.write_failed();
            }
            return Err(XferError::io(ctx("cannot fsync"), e));
        }
        Ok(())
    }

    /// Renames the temporary file to its final name (its directory still
    /// to be fsynced).
    fn move_into_place(&mut self, name: &str, overwrite: bool) -> Result<(), XferError> {
        let ctx = |what: &str| format!("{what} {name}");
        // The name must still be the file we wrote (a kept partial file lives
        // for days beside its final name, and is continued by descriptor):
        // another file put there meanwhile is never renamed into place.
        match self.parent.is_same(&self.temp, &self.file) {
            Ok(true) => {}
            Ok(false) => {
                return Err(XferError::io(
                    ctx("cannot move into place"),
                    std::io::Error::other(format!(
                        "{} is no longer the file that was received: replaced meanwhile",
                        self.temp
                    )),
                ));
            }
            Err(e) => return Err(XferError::io(ctx("cannot find the received data of"), e)),
        }
        self.parent
            .rename(&self.temp, &self.leaf, !overwrite)
            .map_err(|e| XferError::io(ctx("cannot move into place"), e))?;
        self.committed = true;
        if let Some(r) = self.resumable.take()
            && let Err(e) = r.forget()
        {
            warn!("cannot remove the record of {name}'s partial file: {e}");
        }
        Ok(())
    }
}

/// fsyncs each directory of `members` once.
fn sync_dirs(members: &[BatchMember]) -> Result<(), XferError> {
    let mut synced = std::collections::HashSet::new();
    for m in members {
        let dir = m.name.rsplit_once('/').map_or("", |(d, _)| d);
        let Some(temp) = &m.temp else { continue };
        if synced.insert(dir) {
            temp.parent.sync().map_err(|e| {
                XferError::io(format!("cannot fsync the directory of {}", m.name), e)
            })?;
        }
    }
    Ok(())
}

impl TempFile {
    /// The temporary name is still the file written, and without
    /// `overwrite` the final name is still free.
    fn check_before_rename(&self, name: &str, overwrite: bool) -> Result<(), XferError> {
        let ctx = format!("cannot move into place {name}");
        match self.parent.is_same(&self.temp, &self.file) {
            Ok(true) => {}
            Ok(false) => {
                return Err(XferError::io(
                    ctx,
                    std::io::Error::other(format!(
                        "{} is no longer the file that was received: replaced meanwhile",
                        self.temp
                    )),
                ));
            }
            Err(e) => return Err(XferError::io(ctx, e)),
        }
        if !overwrite && let Ok(Some(_)) = self.parent.kind(&self.leaf) {
            return Err(XferError::io(
                ctx,
                std::io::Error::other(format!(
                    "{name} appeared on the receiver meanwhile (it runs without --overwrite)"
                )),
            ));
        }
        Ok(())
    }

    /// Renames a committed file back to its temporary name (removed when
    /// dropped); false if it could not be (it then stays in place).
    fn take_back(&mut self, name: &str) -> bool {
        let ours = matches!(self.parent.is_same(&self.leaf, &self.file), Ok(true));
        match ours.then(|| self.parent.rename(&self.leaf, &self.temp, true)) {
            Some(Ok(())) => {
                self.committed = false;
                true
            }
            Some(Err(e)) => {
                warn!("cannot take back {name} of a failed batch: {e}");
                false
            }
            None => false,
        }
    }
}

/// One file of a batch: where its bytes are in the batch's data, and where
/// they go.
pub(super) struct BatchMember {
    pub(super) name: String,
    /// Its first byte's offset in the batch's data.
    start: u64,
    pub(super) size: u64,
    mode: u32,
    mtime: Option<Mtime>,
    /// None: it is not stored (--discard).
    temp: Option<Box<TempFile>>,
    /// Its own digest, for its report (the batch is verified as a whole).
    hasher: Option<FileHasher>,
}

/// The files of a BATCH: their bytes arrive back to back, as one file of
/// their total size, and are committed together.
pub(super) struct BatchSink {
    pub(super) members: Vec<BatchMember>,
    /// The batch's bytes so far (the next member starts at or after it).
    len: u64,
    /// The free space promised to the whole batch (none: not stored).
    promise: Option<Promise>,
}

impl BatchSink {
    fn new(promise: Option<Promise>) -> Self {
        Self {
            members: Vec::new(),
            len: 0,
            promise,
        }
    }

    /// Adds the next file: its bytes follow the previous file's.
    fn push(
        &mut self,
        hello: &Hello,
        (umask, keep_modes): (u32, bool),
        temp: Option<Box<TempFile>>,
    ) {
        self.members.push(BatchMember {
            name: hello.name.clone(),
            start: self.len,
            size: hello.size,
            mode: hello.received_mode(umask, keep_modes),
            mtime: hello.mtime,
            temp,
            hasher: Some(FileHasher::new(hello.digest)),
        });
        self.len = self.len.saturating_add(hello.size);
    }

    /// Writes the batch's bytes at `offset` (of the batch's data) to the
    /// files they belong to.
    pub(super) fn write_chunk(&mut self, data: &[u8], offset: u64) -> std::io::Result<()> {
        let end = offset + data.len() as u64;
        // Members are in order: skip those that end before the chunk.
        let first = self.members.partition_point(|m| m.start + m.size <= offset);
        for m in self.members[first..].iter_mut() {
            if m.start >= end {
                break;
            }
            let from = m.start.max(offset);
            let to = (m.start + m.size).min(end);
            let part = &data[(from - offset) as usize..(to - offset) as usize];
            let crc = crc32fast::hash(part);
            if let Some(temp) = m.temp.as_mut() {
                temp.write_chunk(part, from - m.start, crc)
                    .map_err(|e| std::io::Error::new(e.kind(), format!("{}: {e}", m.name)))?;
            }
            if let Some(h) = m.hasher.as_mut() {
                h.update(part, crc);
            }
        }
        if let Some(p) = self.promise.as_mut() {
            p.wrote(data.len() as u64);
        }
        Ok(())
    }

    /// Its files are verified and dropped (--discard), not stored.
    pub(super) fn discards(&self) -> bool {
        self.promise.is_none()
    }

    /// Every file's digest (in order), for the reports; once.
    pub(super) fn digests(&mut self) -> Vec<crate::proto::Digest> {
        self.members
            .iter_mut()
            .filter_map(|m| m.hasher.take().map(FileHasher::finish))
            .collect()
    }

    /// fsync every file, check that every temporary name is still its file
    /// and (without `overwrite`) that no final name appeared meanwhile,
    /// then rename each into place and fsync each directory once. If a
    /// rename still fails (a race, an I/O error), the files renamed before
    /// it are taken back without `overwrite`: nothing of a failed batch
    /// stays. With `overwrite` they replaced what was there; they stay,
    /// complete and verified, and their directories are fsynced.
    pub(super) fn commit(&mut self, overwrite: bool) -> Result<(), XferError> {
        for m in &mut self.members {
            if let Some(temp) = m.temp.as_mut() {
                temp.make_durable(&m.name, m.mode, m.mtime)?;
            }
        }
        for m in &self.members {
            if let Some(temp) = &m.temp {
                temp.check_before_rename(&m.name, overwrite)?;
            }
        }
        let mut renamed = 0;
        let result = self.members.iter_mut().try_for_each(|m| {
            if let Some(temp) = m.temp.as_mut() {
                temp.move_into_place(&m.name, overwrite)?;
            }
            renamed += 1;
            Ok::<(), XferError>(())
        });
        if let Err(e) = result {
            let mut stayed = 0;
            for m in &mut self.members[..renamed] {
                let Some(temp) = m.temp.as_mut() else {
                    continue;
                };
                if overwrite || !temp.take_back(&m.name) {
                    stayed += 1;
                }
            }
            if stayed > 0 {
                if let Err(d) = sync_dirs(&self.members[..renamed]) {
                    warn!("{d}");
                }
                warn!("{stayed} files of the failed batch stay in place, complete and verified");
            }
            return Err(e);
        }
        sync_dirs(&self.members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mtimes_convert_both_sides_of_the_epoch() {
        let t = |secs, nanos| system_time(Mtime { secs, nanos });
        let epoch = std::time::UNIX_EPOCH;
        assert_eq!(t(0, 0), Some(epoch));
        assert_eq!(t(10, 5), Some(epoch + Duration::new(10, 5)));
        assert_eq!(
            t(-10, 5),
            Some(epoch - Duration::from_secs(10) + Duration::from_nanos(5))
        );
        // Out of the platform's range: no time rather than a panic.
        let _ = t(i64::MAX, 999_999_999);
        let _ = t(i64::MIN, 999_999_999);
    }

    #[test]
    fn parents_are_opened_without_following_links() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("a/link")).unwrap();
        std::fs::write(root.path().join("a/file"), b"").unwrap();
        let r = DirFd::open(root.path()).unwrap();
        let (_, leaf) = open_parent(&r, "a/b/c").unwrap();
        assert_eq!(leaf, "c");
        let (_, leaf) = open_parent(&r, "top").unwrap();
        assert_eq!(leaf, "top");
        let err = |p| open_parent(&r, p).map(|_| ()).unwrap_err();
        assert_eq!(err("a/link/x").0, RejectCode::Exists);
        assert!(
            err("a/link/x").1.contains("symbolic link"),
            "{:?}",
            err("a/link/x")
        );
        assert_eq!(err("a/file/x").0, RejectCode::Exists);
        assert_eq!(err("a/missing/x").0, RejectCode::Io);
        assert!(err("a/missing/x").1.contains("a/missing does not exist"));
        assert!(open_path(&r, "a/b").is_ok());
        assert!(open_path(&r, "a/link").is_err());
    }

    fn hello(name: &str, size: u64) -> Hello {
        Hello {
            version: crate::proto::PROTOCOL_VERSION,
            caps: crate::proto::hello_flags::MTIME,
            name: name.into(),
            size,
            mode: 0o640,
            digest: crate::proto::DigestAlg::Crc32,
            mtime: Some(Mtime {
                secs: 1_000_000_000,
                nanos: 5,
            }),
        }
    }

    fn store(dir: &Path) -> FileStore {
        let cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), dir.into());
        FileStore::open(&cfg, &Arc::default()).unwrap()
    }

    fn write(sink: &mut Sink, bytes: &[u8]) {
        let Sink::Temp(t) = sink else {
            panic!("a tree store writes temporary files")
        };
        std::io::Write::write_all(&mut t.file, bytes).unwrap();
    }

    fn entries(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn link_dest_candidates_are_regular_files_of_the_size_reached_without_links() {
        let (root, earlier, outside) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let mut cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), root.path().into());
        cfg.link_dest = Some(earlier.path().into());
        let mut s = FileStore::open(&cfg, &Arc::default()).unwrap();
        let e = earlier.path();
        std::fs::create_dir(e.join("d")).unwrap();
        std::fs::write(e.join("d/f"), b"abc").unwrap();
        std::fs::write(outside.path().join("f"), b"abc").unwrap();
        std::os::unix::fs::symlink(outside.path(), e.join("via")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("f"), e.join("leaf")).unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        std::fs::create_dir(root.path().join("via")).unwrap();
        assert!(s.link_candidate(&hello("d/f", 3), false).is_some());
        assert!(s.link_candidate(&hello("d/f", 4), false).is_none(), "size");
        assert!(
            s.link_candidate(&hello("via/f", 3), false).is_none(),
            "link on the way"
        );
        assert!(
            s.link_candidate(&hello("leaf", 3), false).is_none(),
            "link as the leaf"
        );
        assert!(
            s.link_candidate(&hello("d", 3), false).is_none(),
            "a directory"
        );
        // Same mode and time (none offered): a hard link.
        let mut h = hello("d/f", 3);
        h.mtime = None;
        let mode = h.received_mode(cfg.umask, false);
        std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(mode)).unwrap();
        let c = s.link_candidate(&h, false).unwrap();
        let sha = partial::copy_digest(&c.file, 3, 1 << 20, &mut || Ok(())).unwrap();
        let how = (false, 1 << 20, root.path());
        let linked = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
        assert!(matches!(linked, Linked::HardLink));
        let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
        assert_eq!(ino(&root.path().join("d/f")), ino(&e.join("d/f")));
        // The final name is taken now: no candidate without --overwrite;
        // with it, the link already there stays, and no temporary name.
        assert!(s.link_candidate(&h, false).is_none());
        let c = s.link_candidate(&h, true).unwrap();
        let again = s.link_into_place(&h, &c, sha, (true, 1 << 20, root.path()), &mut || Ok(()));
        assert!(matches!(again, Ok(Linked::HardLink)));
        assert_eq!(entries(&root.path().join("d")), ["f"]);
        // Another mode offered: still a link (with the file's own mode).
        std::fs::remove_file(root.path().join("d/f")).unwrap();
        std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = s.link_candidate(&h, false).unwrap();
        let linked = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
        assert!(matches!(linked, Linked::HardLink));
        std::fs::remove_file(root.path().join("d/f")).unwrap();
        // A file others may write is never linked: copied, with the
        // receiver's umask (022 here) on its mode.
        std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(0o666)).unwrap();
        let c = s.link_candidate(&h, false).unwrap();
        let copied = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
        assert!(matches!(copied, Linked::Copy(_)), "{copied:?}");
        let placed = root.path().join("d/f");
        assert_ne!(ino(&placed), ino(&e.join("d/f")));
        assert_eq!(
            std::fs::metadata(&placed).unwrap().permissions().mode() & 0o777,
            0o666 & !cfg.umask
        );
        std::fs::remove_file(&placed).unwrap();
        std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
        // Another modification time offered: a copy, checked, with the
        // offer's time.
        let h = hello("d/f", 3);
        let c = s.link_candidate(&h, false).unwrap();
        let copied = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
        assert!(matches!(copied, Linked::Copy(_)));
        let placed = root.path().join("d/f");
        assert_ne!(ino(&placed), ino(&e.join("d/f")));
        assert_eq!(std::fs::read(&placed).unwrap(), b"abc");
        let placed_mtime = std::fs::metadata(&placed).unwrap().modified().unwrap();
        assert_eq!(Some(placed_mtime), system_time(h.mtime.unwrap()));
        // A digest that is not the file's: refused, nothing left behind.
        std::fs::remove_file(&placed).unwrap();
        let c = s.link_candidate(&h, false).unwrap();
        assert!(
            s.link_into_place(&h, &c, [0; 32], how, &mut || Ok(()))
                .is_err()
        );
        assert_eq!(entries(&root.path().join("d")), Vec::<String>::new());
    }

    /// A store with --link-dest `earlier` writing into `root`, and the
    /// file `name` in `earlier` holding `bytes` with `mode`.
    fn link_dest_store(
        root: &Path,
        earlier: &Path,
        name: &str,
        bytes: &[u8],
        mode: u32,
    ) -> FileStore {
        let mut cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), root.into());
        cfg.link_dest = Some(earlier.into());
        std::fs::write(earlier.join(name), bytes).unwrap();
        std::fs::set_permissions(earlier.join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
        FileStore::open(&cfg, &Arc::default()).unwrap()
    }

    #[test]
    fn a_link_dest_copy_keeps_the_files_own_mode_never_the_offers() {
        let (root, earlier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut s = link_dest_store(root.path(), earlier.path(), "f", b"secret", 0o600);
        // The sender asks for a mode open to all, and another time (so
        // that a copy is made, with the offer's time).
        let mut h = hello("f", 6);
        h.mode = 0o666;
        let c = s.link_candidate(&h, false).unwrap();
        let sha = partial::copy_digest(&c.file, 6, 1 << 20, &mut || Ok(())).unwrap();
        let how = (false, 1 << 20, root.path());
        let placed = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
        assert!(matches!(placed, Linked::Copy(_)));
        let mode = std::fs::metadata(root.path().join("f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o600, "{mode:o}");
        // A linked one shares the file's mode anyway.
        std::fs::remove_file(root.path().join("f")).unwrap();
        h.mtime = None;
        let c = s.link_candidate(&h, false).unwrap();
        let placed = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
        assert!(matches!(placed, Linked::HardLink));
        let mode = std::fs::metadata(root.path().join("f"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o7777, 0o600, "{mode:o}");
    }

    #[test]
    fn a_link_dest_file_changed_with_its_time_set_back_is_never_linked() {
        let (root, earlier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // The offer's mode (0640 under the umask 022): linked, were it not
        // for the change.
        let mut s = link_dest_store(root.path(), earlier.path(), "f", b"hashed", 0o640);
        let mut h = hello("f", 6);
        h.mtime = None;
        let c = s.link_candidate(&h, false).unwrap();
        let sha = partial::copy_digest(&c.file, 6, 1 << 20, &mut || Ok(())).unwrap();
        // Hashed, then rewritten in place: same size, the old time set
        // back. Only the inode's change time tells.
        let path = earlier.path().join("f");
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(&path, b"other!").unwrap();
        let f = File::options().write(true).open(&path).unwrap();
        f.set_modified(mtime).unwrap();
        let how = (false, 1 << 20, root.path());
        let placed = s.link_into_place(&h, &c, sha, how, &mut || Ok(()));
        let why = placed.expect_err("linked a changed file");
        assert!(why.contains("changed meanwhile"), "{why}");
        assert_eq!(entries(root.path()), Vec::<String>::new());
    }

    #[test]
    fn only_a_link_across_file_systems_becomes_a_copy() {
        let e = |n| std::io::Error::from_raw_os_error(n);
        assert!(copy_instead_of_link(&e(libc::EXDEV)).is_some());
        for refused in [libc::EPERM, libc::EMLINK, libc::EACCES] {
            assert_eq!(copy_instead_of_link(&e(refused)), None, "{refused}");
        }
        // A real EPERM: an immutable file (root, and a file system with
        // the flag, needed).
        let (root, earlier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut s = link_dest_store(root.path(), earlier.path(), "f", b"fixed", 0o644);
        let path = earlier.path().join("f");
        let chattr = |flag: &str| {
            std::process::Command::new("chattr")
                .arg(flag)
                .arg(&path)
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !chattr("+i") {
            eprintln!(
                "chattr +i failed (not root, or no such flag here): the real EPERM case is skipped"
            );
            return;
        }
        let mut h = hello("f", 5);
        h.mtime = None;
        let placed = s.link_candidate(&h, false).map(|c| {
            let sha = partial::copy_digest(&c.file, 5, 1 << 20, &mut || Ok(())).unwrap();
            s.link_into_place(&h, &c, sha, (false, 1 << 20, root.path()), &mut || Ok(()))
        });
        assert!(chattr("-i"), "chattr -i {}", path.display());
        let why = placed.expect("a candidate").expect_err("copied instead");
        assert!(why.contains("cannot link it"), "{why}");
        assert_eq!(entries(root.path()), Vec::<String>::new());
    }

    #[test]
    fn exec_names_may_lead_into_missing_directories_but_never_through_links() {
        let root = tempfile::tempdir().unwrap();
        let r = DirFd::open(root.path()).unwrap();
        std::fs::create_dir(root.path().join("a")).unwrap();
        std::fs::write(root.path().join("file"), b"").unwrap();
        std::os::unix::fs::symlink("/tmp", root.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/etc/passwd", root.path().join("a/leaf")).unwrap();
        assert!(check_exec_path(&r, "new/deeper/f").is_ok());
        assert!(check_exec_path(&r, "a/missing/f").is_ok());
        assert!(check_exec_path(&r, "a/f").is_ok());
        for refused in ["link/f", "link/x/f", "file/f", "a/leaf", "link"] {
            let (code, why) = check_exec_path(&r, refused).unwrap_err();
            assert_eq!(code, RejectCode::Exists, "{refused}: {why}");
        }
    }

    #[test]
    fn a_discarding_store_creates_nothing_and_takes_everything() {
        let root = tempfile::tempdir().unwrap();
        let mut cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), root.path().into());
        cfg.output = Output::Discard;
        let mut s = FileStore::open(&cfg, &Arc::default()).unwrap();
        // An existing name is no obstacle: nothing is written over it.
        std::fs::write(root.path().join("f.bin"), b"old").unwrap();
        let mut dir = hello("d", 0);
        dir.caps |= crate::proto::hello_flags::DIRECTORY;
        s.make_dir(&dir).unwrap();
        let h = hello("f.bin", 3);
        let mut sink = s.create(&h, false, root.path(), Resume::No).unwrap();
        assert!(sink.write(b"abc", 0, crc32fast::hash(b"abc"), 0).is_ok());
        assert_eq!(sink.corrupt(), None);
        sink.commit(&h.name, 0o640, h.mtime, false).unwrap();
        assert_eq!(sink.outcome(), crate::engine::Outcome::Discarded);
        let members = [hello("a", 2), hello("d/b", 1)];
        let batch = s
            .create_batch(&members, false, root.path(), (0o022, false))
            .unwrap();
        let mut sink = Sink::Batch(Box::new(batch));
        assert!(sink.write(b"xyz", 0, 0, 0).is_ok());
        sink.commit("batch", 0, None, false).unwrap();
        assert_eq!(sink.outcome(), crate::engine::Outcome::Discarded);
        let (held, claim) = s
            .holding(&h, (1 << 20, false), Duration::ZERO, &mut || Ok(()))
            .unwrap();
        assert_eq!(held.have.kind, crate::proto::HaveKind::Nothing);
        assert!(held.have.note.is_empty() && claim.is_none());
        assert_eq!(entries(root.path()), ["f.bin"]);
        assert_eq!(std::fs::read(root.path().join("f.bin")).unwrap(), b"old");
    }

    #[test]
    fn a_file_appears_under_its_name_only_when_committed() {
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let h = hello("f.bin", 3);
        let mut sink = s.create(&h, false, root.path(), Resume::No).unwrap();
        write(&mut sink, b"abc");
        let names = entries(root.path());
        assert_eq!(names.len(), 1);
        assert!(names[0].starts_with(".rdma-xfer-"), "{names:?}");
        sink.commit(&h.name, 0o640, h.mtime, false).unwrap();
        drop(sink);
        assert_eq!(entries(root.path()), ["f.bin"]);
        let path = root.path().join("f.bin");
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"abc");
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        assert_eq!(
            meta.modified().unwrap(),
            system_time(h.mtime.unwrap()).unwrap()
        );
    }

    /// A batch of `names` (with `sizes`) in `s`, written from `data` in
    /// chunks of `chunk` bytes that span files.
    fn batch_of(
        s: &mut FileStore,
        root: &Path,
        files: &[(&str, u64)],
        data: &[u8],
        chunk: usize,
    ) -> Sink {
        let members: Vec<_> = files.iter().map(|(n, size)| hello(n, *size)).collect();
        let mut b = s
            .create_batch(&members, false, root, (0o022, false))
            .unwrap();
        for (k, c) in data.chunks(chunk).enumerate() {
            b.write_chunk(c, (k * chunk) as u64).unwrap();
        }
        Sink::Batch(Box::new(b))
    }

    #[test]
    fn a_batch_splits_its_bytes_among_its_files_and_commits_them_together() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        let mut s = store(root.path());
        let data: Vec<u8> = (0..25u8).collect();
        let files = [("d/a", 10), ("d/empty", 0), ("b", 3), ("d/c", 12)];
        let mut sink = batch_of(&mut s, root.path(), &files, &data, 7);
        // Nothing under a final name before the commit.
        assert!(!entries(root.path()).contains(&"b".to_string()));
        let Sink::Batch(b) = &mut sink else {
            unreachable!()
        };
        let digests = b.digests();
        sink.commit("batch", 0, None, false).unwrap();
        drop(sink);
        assert_eq!(entries(root.path()), ["b", "d"]);
        assert_eq!(entries(&root.path().join("d")), ["a", "c", "empty"]);
        let read = |p: &str| std::fs::read(root.path().join(p)).unwrap();
        assert_eq!(read("d/a"), &data[..10]);
        assert_eq!(read("d/empty"), b"");
        assert_eq!(read("b"), &data[10..13]);
        assert_eq!(read("d/c"), &data[13..]);
        // Each file's own digest, and its mode under the umask.
        assert_eq!(digests.len(), 4);
        let mut h = FileHasher::new(crate::proto::DigestAlg::Crc32);
        h.update(&data[10..13], crc32fast::hash(&data[10..13]));
        assert_eq!(digests[2], h.finish());
        let mode = std::fs::metadata(root.path().join("b"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, hello("b", 3).received_mode(0o022, false));
    }

    #[test]
    fn a_failed_batch_leaves_none_of_its_files() {
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let data = [7u8; 6];
        // Refused whole, nothing made, when a file exists or a path is bad.
        std::fs::write(root.path().join("there"), b"x").unwrap();
        for files in [[("a", 1), ("there", 1)], [("b", 1), ("no/dir", 1)]] {
            let members: Vec<_> = files.iter().map(|(n, size)| hello(n, *size)).collect();
            assert!(
                s.create_batch(&members, false, root.path(), (0, false))
                    .is_err()
            );
            assert_eq!(entries(root.path()), ["there"]);
        }
        std::fs::remove_file(root.path().join("there")).unwrap();
        // Dropped uncommitted: nothing at all.
        let sink = batch_of(&mut s, root.path(), &[("x", 3), ("y", 3)], &data, 4);
        drop(sink);
        assert!(entries(root.path()).is_empty());
        // "z" appears before the commit (no --overwrite): found before any
        // rename, so "w" is not in place either, "z" is not replaced, and no
        // temporary file is left.
        let mut sink = batch_of(&mut s, root.path(), &[("w", 3), ("z", 3)], &data, 4);
        std::fs::write(root.path().join("z"), b"theirs").unwrap();
        let err = sink.commit("batch", 0, None, false).unwrap_err();
        assert!(err.to_string().contains("z appeared"), "{err}");
        drop(sink);
        assert_eq!(entries(root.path()), ["z"]);
        assert_eq!(std::fs::read(root.path().join("z")).unwrap(), b"theirs");
        // With --overwrite it is replaced, with the rest of the batch.
        let members = [hello("w", 3), hello("z", 3)];
        let mut b = s
            .create_batch(&members, true, root.path(), (0, false))
            .unwrap();
        b.write_chunk(&data, 0).unwrap();
        let mut sink = Sink::Batch(Box::new(b));
        sink.commit("batch", 0, None, true).unwrap();
        drop(sink);
        assert_eq!(entries(root.path()), ["w", "z"]);
        assert_eq!(std::fs::read(root.path().join("z")).unwrap(), &data[3..]);
    }

    #[test]
    fn an_uncommitted_file_leaves_nothing_behind() {
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let mut sink = s
            .create(&hello("gone", 3), false, root.path(), Resume::No)
            .unwrap();
        write(&mut sink, b"abc");
        drop(sink);
        assert!(entries(root.path()).is_empty());
    }

    /// Writes `data` as the sink's chunks of `chunk` bytes from `from`.
    fn write_chunks(sink: &mut Sink, data: &[u8], from: usize, chunk: usize) {
        let Sink::Temp(t) = sink else {
            panic!("a tree store writes temporary files")
        };
        for (k, c) in data[from..].chunks(chunk).enumerate() {
            let at = (from + k * chunk) as u64;
            t.write_chunk(c, at, crc32fast::hash(c)).unwrap();
        }
    }

    #[test]
    fn a_resumable_file_keeps_its_verified_chunks_until_it_is_committed() {
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
        let mut h = hello("f.bin", 1000);
        h.caps |= crate::proto::hello_flags::RESUME;
        let holds = |s: &FileStore| {
            s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
                .unwrap()
        };
        let (nothing, claim) = holds(&s);
        assert_eq!(nothing.have.kind, crate::proto::HaveKind::Nothing);
        // While a session holds the name, another gets nothing to resume
        // (and no claim: it writes a plain temporary file).
        let (busy, none) = holds(&s);
        assert!(none.is_none() && busy.have.note.contains("another session"));
        // A first attempt writes 7 chunks, then fails: they are kept.
        let claim = claim.expect("a claim");
        let mut sink = s
            .create(&h, false, root.path(), Resume::Fresh(claim))
            .unwrap();
        write_chunks(&mut sink, &data[..700], 0, 100);
        drop(sink);
        let (kept, claim) = holds(&s);
        assert_eq!(kept.have.bytes, 700);
        let prefix = kept.kept.expect("the verified prefix");
        assert_eq!(
            entries(root.path()).len(),
            3,
            "the partial, its record and the directory's key"
        );
        // The second continues it; committed, it is the file, nothing else.
        let mut sink = s
            .create(
                &h,
                false,
                root.path(),
                Resume::Continue(&prefix.sidecar, claim.unwrap()),
            )
            .unwrap();
        write_chunks(&mut sink, &data, 700, 100);
        sink.commit(&h.name, 0o640, h.mtime, false).unwrap();
        drop(sink);
        assert_eq!(entries(root.path()), [".rdma-xfer-key", "f.bin"]);
        assert_eq!(std::fs::read(root.path().join("f.bin")).unwrap(), data);
        // Now the receiver has it complete.
        assert_eq!(holds(&s).0.have.kind, crate::proto::HaveKind::Complete);
        // Another file under that name (another time) is no copy: refused
        // at once without --overwrite, nothing said about it with it.
        let other = crate::proto::Hello {
            mtime: Some(crate::proto::Mtime { secs: 77, nanos: 0 }),
            ..h.clone()
        };
        let refused = s.holding(&other, (100, false), Duration::ZERO, &mut || {
            Err(std::io::Error::other("nothing may be read"))
        });
        assert!(matches!(refused, Err((RejectCode::Exists, _))));
        let (held, _) = s
            .holding(&other, (100, true), Duration::ZERO, &mut || Ok(()))
            .unwrap();
        assert_eq!(held.have, crate::proto::Have::nothing(""));
        // A failed whole-file check keeps nothing, even when resumable.
        let mut g = hello("g.bin", 1000);
        g.caps |= crate::proto::hello_flags::RESUME;
        let claim = s
            .holding(&g, (100, false), Duration::ZERO, &mut || Ok(()))
            .unwrap()
            .1
            .unwrap();
        let mut sink = s
            .create(&g, false, root.path(), Resume::Fresh(claim))
            .unwrap();
        write_chunks(&mut sink, &data, 0, 100);
        let Sink::Temp(t) = &mut sink else { panic!() };
        t.discard();
        drop(sink);
        assert_eq!(entries(root.path()), [".rdma-xfer-key", "f.bin"]);
    }

    #[test]
    fn a_partial_file_is_continued_and_committed_by_descriptor_never_by_name() {
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut h = hello("f.bin", 1000);
        h.caps |= crate::proto::hello_flags::RESUME;
        let holds = |s: &FileStore| {
            s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
                .unwrap()
        };
        let claim = holds(&s).1.unwrap();
        let mut sink = s
            .create(&h, false, root.path(), Resume::Fresh(claim))
            .unwrap();
        write_chunks(&mut sink, &data[..500], 0, 100);
        drop(sink);
        let (kept, claim) = holds(&s);
        let prefix = kept.kept.expect("the verified prefix");
        // Checked, then swapped: another file takes the partial's name.
        let (partial, _) = partial::partial_names("f.bin");
        let p = root.path().join(&partial);
        std::fs::rename(&p, root.path().join("moved")).unwrap();
        std::fs::write(&p, b"someone else's").unwrap();
        let mut sink = s
            .create(
                &h,
                false,
                root.path(),
                Resume::Continue(&prefix.sidecar, claim.unwrap()),
            )
            .unwrap();
        // The checked file is continued, the newcomer left alone...
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
        write_chunks(&mut sink, &data, 500, 100);
        // ...and never renamed into place.
        let err = sink.commit(&h.name, 0o640, h.mtime, false).unwrap_err();
        assert!(err.to_string().contains("replaced meanwhile"), "{err}");
        drop(sink);
        assert!(!root.path().join("f.bin").exists());
        assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
        assert_eq!(std::fs::read(root.path().join("moved")).unwrap(), data);
    }

    #[test]
    fn a_kept_partial_file_that_is_not_the_receivers_own_is_never_written() {
        use std::os::unix::fs::MetadataExt;
        let root = tempfile::tempdir().unwrap();
        // Files of the receiver's user elsewhere, that a planted name
        // would lead to.
        let home = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 11) as u8).collect();
        let mut h = hello("f.bin", 1000);
        h.caps |= crate::proto::hello_flags::RESUME;
        let (partial, meta) = partial::partial_names("f.bin");
        let at = |n: &str| root.path().join(n);
        let holds = |s: &FileStore| {
            s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
                .unwrap()
        };
        // A genuine attempt that kept 500 bytes and their records.
        let keep_500 = |s: &mut FileStore| {
            for n in [&partial, &meta, &"f.bin".to_string()] {
                let _ = std::fs::remove_file(at(n));
            }
            let claim = holds(s).1.unwrap();
            let mut sink = s
                .create(&h, false, root.path(), Resume::Fresh(claim))
                .unwrap();
            write_chunks(&mut sink, &data[..500], 0, 100);
            drop(sink);
            assert_eq!(holds(s).0.have.bytes, 500, "kept and resumable");
        };
        // `name` replaced by a hard link to a file of the same bytes in
        // `home`: the victim.
        let plant_link = |name: &str| {
            let victim = home.path().join(name);
            let _ = std::fs::remove_file(&victim);
            std::fs::copy(at(name), &victim).unwrap();
            std::fs::remove_file(at(name)).unwrap();
            std::fs::hard_link(&victim, at(name)).unwrap();
            victim
        };
        let plant_symlink = |name: &str| {
            let victim = home.path().join(name);
            let _ = std::fs::remove_file(&victim);
            std::fs::rename(at(name), &victim).unwrap();
            std::os::unix::fs::symlink(&victim, at(name)).unwrap();
            victim
        };
        let as_root = rustix::process::geteuid().is_root();
        /// A way to plant a file; returns the file planted at.
        type Plant<'a> = Box<dyn Fn() -> std::path::PathBuf + 'a>;
        let mut cases: Vec<(&str, Plant)> = vec![
            (
                "a hard link as the partial",
                Box::new(|| plant_link(&partial)),
            ),
            ("a hard link as the record", Box::new(|| plant_link(&meta))),
            (
                "a symbolic link as the partial",
                Box::new(|| plant_symlink(&partial)),
            ),
            (
                "a symbolic link as the record",
                Box::new(|| plant_symlink(&meta)),
            ),
        ];
        if as_root {
            cases.push((
                "a partial of another owner",
                Box::new(|| {
                    std::os::unix::fs::chown(at(&partial), Some(65534), Some(65534)).unwrap();
                    at(&partial)
                }),
            ));
        } else {
            eprintln!(
                "not root: the case of a partial file of another owner is skipped (chown needs root)"
            );
        }
        for (case, plant) in &cases {
            keep_500(&mut s);
            let planted = plant();
            let before = std::fs::read(&planted).unwrap();
            let inode = std::fs::metadata(&planted).unwrap().ino();
            // Not resumed, and why (no uid or path told to the sender).
            let (held, claim) = holds(&s);
            assert!(held.kept.is_none(), "{case}: resumed");
            assert_eq!(
                held.have,
                crate::proto::Have::nothing(
                    "the kept partial file is not the receiver's own: not resumed"
                ),
                "{case}"
            );
            // Received from zero under a temporary name, committed.
            let mut sink = s
                .create(&h, false, root.path(), Resume::Fresh(claim.unwrap()))
                .unwrap();
            let Sink::Temp(t) = &sink else { panic!() };
            assert!(t.temp.ends_with(".part"), "{case}: {}", t.temp);
            write_chunks(&mut sink, &data, 0, 100);
            sink.commit(&h.name, 0o640, h.mtime, false).unwrap();
            drop(sink);
            assert_eq!(std::fs::read(at("f.bin")).unwrap(), data, "{case}");
            // The planted file: never truncated, written, nor replaced.
            assert_eq!(std::fs::read(&planted).unwrap(), before, "{case}");
            assert_eq!(std::fs::metadata(&planted).unwrap().ino(), inode, "{case}");
            assert_ne!(
                std::fs::metadata(at("f.bin")).unwrap().ino(),
                inode,
                "{case}"
            );
        }
    }

    #[test]
    fn a_record_written_without_the_directorys_key_is_as_good_as_none() {
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
        let mut h = hello("f.bin", 1000);
        h.caps |= crate::proto::hello_flags::RESUME;
        let holds = |s: &FileStore| {
            s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
                .unwrap()
        };
        // The directory has its key (an earlier resumable file made it).
        let claim = holds(&s).1.unwrap();
        let mut sink = s
            .create(&h, false, root.path(), Resume::Fresh(claim))
            .unwrap();
        write_chunks(&mut sink, &data[..300], 0, 100);
        drop(sink);
        assert_eq!(holds(&s).0.have.bytes, 300);
        // Someone who can write the directory but not read the key puts a
        // partial file of their choice there, with a record of its chunks
        // as the unkeyed format had it (CRC32 checks anyone can compute).
        let (partial, meta) = partial::partial_names("f.bin");
        let chosen = vec![0x5au8; 500];
        std::fs::write(root.path().join(&partial), &chosen).unwrap();
        let forge = |magic: &[u8; 8]| {
            let mut b = magic.to_vec();
            b.extend_from_slice(&5u16.to_be_bytes());
            b.extend_from_slice(&1000u64.to_be_bytes());
            b.extend_from_slice(&1_000_000_000i64.to_be_bytes());
            b.extend_from_slice(&5u32.to_be_bytes());
            b.push(h.digest as u8);
            b.extend_from_slice(&100u32.to_be_bytes());
            b.extend_from_slice(b"f.bin");
            let check = crc32fast::hash(&b);
            b.extend_from_slice(&check.to_be_bytes());
            for (i, c) in chosen.chunks(100).enumerate() {
                let crc = crc32fast::hash(c);
                let mut check = crc32fast::Hasher::new();
                check.update(&(i as u64).to_be_bytes());
                check.update(&crc.to_be_bytes());
                b.extend_from_slice(&crc.to_be_bytes());
                b.extend_from_slice(&check.finalize().to_be_bytes());
            }
            std::fs::write(root.path().join(&meta), b).unwrap();
        };
        for (magic, note) in [
            (b"RXFRPT1\n", "older, unkeyed format"),
            (b"RXFRPT2\n", "does not check with this directory's key"),
        ] {
            forge(magic);
            let (held, claim) = holds(&s);
            assert!(held.kept.is_none(), "{note}: resumed");
            assert_eq!(held.have.kind, crate::proto::HaveKind::Nothing);
            assert!(held.have.note.contains(note), "{:?}", held.have.note);
            // Received from zero: the chosen bytes are not kept.
            let mut sink = s
                .create(&h, true, root.path(), Resume::Fresh(claim.unwrap()))
                .unwrap();
            write_chunks(&mut sink, &data, 0, 100);
            sink.commit(&h.name, 0o640, h.mtime, true).unwrap();
            drop(sink);
            assert_eq!(std::fs::read(root.path().join("f.bin")).unwrap(), data);
            std::fs::remove_file(root.path().join("f.bin")).unwrap();
            std::fs::write(root.path().join(&partial), &chosen).unwrap();
        }
    }

    #[test]
    fn after_a_failed_write_no_record_is_kept_past_the_last_sync() {
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
        let mut h = hello("f.bin", 1000);
        h.caps |= crate::proto::hello_flags::RESUME;
        let claim = s
            .holding(&h, (10, false), Duration::ZERO, &mut || Ok(()))
            .unwrap()
            .1
            .unwrap();
        let mut sink = s
            .create(&h, false, root.path(), Resume::Fresh(claim))
            .unwrap();
        // One sync's worth of chunks, and a few more written but unsynced.
        let n = partial::SYNC_EVERY + 5;
        write_chunks(&mut sink, &data[..n * 10], 0, 10);
        let Sink::Temp(t) = &mut sink else { panic!() };
        // Then a write fails (a descriptor that cannot write).
        t.file = File::open("/dev/null").unwrap();
        let c = &data[n * 10..n * 10 + 10];
        assert!(
            t.write_chunk(c, (n * 10) as u64, crc32fast::hash(c))
                .is_err()
        );
        drop(sink);
        // Kept: only what the last good sync recorded.
        let (_, meta) = partial::partial_names("f.bin");
        let key = SidecarKey::load(&DirFd::open(root.path()).unwrap());
        let side = partial::Sidecar::decode(
            &std::fs::read(root.path().join(meta)).unwrap(),
            &key.unwrap().unwrap(),
        );
        let side = side.unwrap();
        assert_eq!(side.crcs.len(), partial::SYNC_EVERY);
    }

    #[test]
    fn a_kept_partial_file_holds_the_space_of_its_prefix_only() {
        use std::os::unix::fs::MetadataExt;
        const CHUNK: usize = 64 << 10;
        let size: u64 = 16 << 20;
        let root = tempfile::tempdir().unwrap();
        let mut s = store(root.path());
        let data: Vec<u8> = (0..5 * CHUNK).map(|i| (i % 251) as u8).collect();
        let mut h = hello("f.bin", size);
        h.caps |= crate::proto::hello_flags::RESUME;
        let allocated = |f: &File| f.metadata().unwrap().blocks() * 512;
        let holds = |s: &FileStore| {
            s.holding(&h, (CHUNK as u32, false), Duration::ZERO, &mut || Ok(()))
                .unwrap()
        };
        let temp = |sink: &mut Sink| -> File {
            let Sink::Temp(t) = sink else { panic!() };
            t.file.try_clone().unwrap()
        };
        let claim = holds(&s).1.unwrap();
        let mut sink = s
            .create(&h, false, root.path(), Resume::Fresh(claim))
            .unwrap();
        // Only where fallocate reserved the whole file is there anything
        // to give back (tmpfs is left alone: see `reserve_blocks`).
        let reserved = allocated(&temp(&mut sink)) >= size;
        if !reserved {
            eprintln!("no space reserved on this file system: only lengths are checked");
        }
        write_chunks(&mut sink, &data[..3 * CHUNK], 0, CHUNK);
        // Bytes past the last checked chunk have no record: not kept.
        let f = temp(&mut sink);
        f.write_all_at(&data[3 * CHUNK..4 * CHUNK], 3 * CHUNK as u64)
            .unwrap();
        drop(sink);
        assert_eq!(f.metadata().unwrap().len(), 3 * CHUNK as u64);
        if reserved {
            let a = allocated(&f);
            assert!(a <= 4 * CHUNK as u64, "{a} bytes allocated");
        }
        // Continued: the rest is reserved again, and given back when it
        // fails again.
        let (kept, claim) = holds(&s);
        let prefix = kept.kept.expect("the verified prefix");
        let mut sink = s
            .create(
                &h,
                false,
                root.path(),
                Resume::Continue(&prefix.sidecar, claim.unwrap()),
            )
            .unwrap();
        let f = temp(&mut sink);
        if reserved {
            assert!(allocated(&f) >= size);
        }
        write_chunks(&mut sink, &data[..4 * CHUNK], 3 * CHUNK, CHUNK);
        drop(sink);
        assert_eq!(f.metadata().unwrap().len(), 4 * CHUNK as u64);
        if reserved {
            let a = allocated(&f);
            assert!(a <= 5 * CHUNK as u64, "{a} bytes allocated");
        }
        // Nothing kept: the space goes, even while a descriptor of it is
        // open somewhere.
        for resumable in [true, false] {
            let mut g = hello("g.bin", size);
            let resume = if resumable {
                g.caps |= crate::proto::hello_flags::RESUME;
                Resume::Fresh(
                    s.holding(&g, (100, false), Duration::ZERO, &mut || Ok(()))
                        .unwrap()
                        .1
                        .unwrap(),
                )
            } else {
                Resume::No
            };
            let mut sink = s.create(&g, false, root.path(), resume).unwrap();
            write_chunks(&mut sink, &data[..2 * CHUNK], 0, CHUNK);
            let f = temp(&mut sink);
            let Sink::Temp(t) = &mut sink else { panic!() };
            t.discard();
            drop(sink);
            assert_eq!(allocated(&f), 0, "resumable: {resumable}");
        }
        let (partial, meta) = partial::partial_names("f.bin");
        let mut want = vec![partial, meta, partial::KEY_NAME.to_string()];
        want.sort();
        assert_eq!(entries(root.path()), want);
    }

    #[test]
    fn existing_entries_are_refused_or_replaced_as_configured() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("old"), b"old").unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        let mut s = store(root.path());
        let mut refusal = |name: &str, size: u64, overwrite: bool| {
            s.create(&hello(name, size), overwrite, root.path(), Resume::No)
                .map(|_| ())
                .unwrap_err()
                .0
        };
        assert_eq!(refusal("old", 1, false), RejectCode::Exists);
        assert_eq!(refusal("d", 1, true), RejectCode::Exists);
        assert_eq!(refusal("huge", u64::MAX, false), RejectCode::NoSpace);
        assert_eq!(refusal("missing/x", 1, false), RejectCode::Io);
        let mut sink = s
            .create(&hello("old", 3), true, root.path(), Resume::No)
            .unwrap();
        write(&mut sink, b"new");
        // Without --overwrite, a file that appeared meanwhile is kept.
        assert!(sink.commit("old", 0o600, None, false).is_err());
        sink.commit("old", 0o600, None, true).unwrap();
        drop(sink);
        assert_eq!(std::fs::read(root.path().join("old")).unwrap(), b"new");
        assert_eq!(entries(root.path()), ["d", "old"]);
    }

    #[test]
    fn directories_are_created_once_and_never_through_links() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        let mut s = store(root.path());
        let mut d = hello("sub", 0);
        d.mode = 0o500;
        s.make_dir(&d).unwrap();
        // Kept writable while entries arrive; the mode comes at the end.
        let mode = |p: &str| {
            std::fs::metadata(root.path().join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!(mode("sub"), 0o700);
        s.make_dir(&d).unwrap();
        assert_eq!(
            s.make_dir(&hello("link", 0)).unwrap_err().0,
            RejectCode::Exists
        );
        assert_eq!(
            s.make_dir(&hello("link/x", 0)).unwrap_err().0,
            RejectCode::Exists
        );
        s.finish_dirs();
        assert_eq!(mode("sub"), 0o500);
        assert!(entries(outside.path()).is_empty());
    }

    #[test]
    fn sender_modes_are_kept_only_when_the_receiver_keeps_modes() {
        let mode = |root: &Path, p: &str| {
            std::fs::metadata(root.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        // `sender -p` of a directory open to all, under umask 022.
        let mut d = hello("open", 0);
        d.mode = 0o777;
        d.caps |= crate::proto::hello_flags::KEEP_MODE;
        for (keep_modes, want) in [(false, 0o755), (true, 0o777)] {
            let root = tempfile::tempdir().unwrap();
            let mut cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), root.path().into());
            (cfg.umask, cfg.keep_modes) = (0o022, keep_modes);
            let mut s = FileStore::open(&cfg, &Arc::default()).unwrap();
            s.make_dir(&d).unwrap();
            s.finish_dirs();
            assert_eq!(
                mode(root.path(), "open"),
                want,
                "--keep-modes: {keep_modes}"
            );
            // And the files of a batch.
            let mut f = hello("f", 3);
            f.mode = 0o666;
            f.caps |= crate::proto::hello_flags::KEEP_MODE;
            let mut b = s
                .create_batch(
                    std::slice::from_ref(&f),
                    false,
                    root.path(),
                    (cfg.umask, keep_modes),
                )
                .unwrap();
            b.write_chunk(b"abc", 0).unwrap();
            b.commit(false).unwrap();
            let want = want & 0o666;
            assert_eq!(mode(root.path(), "f"), want, "--keep-modes: {keep_modes}");
        }
    }
}
