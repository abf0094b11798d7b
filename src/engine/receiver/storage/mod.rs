//! The receiver's file store: where received entries go (a tree under
//! `--dir`, standard output, nowhere with --discard, a command per file
//! with --exec), checked against what is on disk, written
//! to a temporary file next to the final name and committed (fsync, rename,
//! fsync of the directory) only once verified. Paths are resolved component
//! by component from the output directory's descriptor, never through a
//! link. No RDMA here: unit-tested with a temporary directory.

pub(in crate::engine::receiver) mod batch;
pub mod chunk_file;
pub(in crate::engine::receiver) mod dry_run;
pub(in crate::engine::receiver) mod exec;
pub(in crate::engine::receiver) mod existing;
pub(in crate::engine::receiver) mod link_dest;
pub(in crate::engine::receiver) mod partial;
mod paths;
pub(in crate::engine::receiver) mod pieces;
pub(in crate::engine::receiver) mod sink;
pub(in crate::engine::receiver) mod space;
pub(in crate::engine::receiver) mod temp_file;
#[cfg(test)]
pub(super) mod tests;
pub mod write_behind;

use super::{Output, ReceiverConfig};
use crate::error::XferError;
use crate::proto::{Hello, Mtime, Reject, RejectCode};
use crate::sys::dirfd::{DirFd, OwnFileError};
use crate::sys::os::{free_space, reserve_blocks};
use batch::BatchSink;
use exec::ExecSpec;
use partial::{Claim, Holding, Identity, Resumable, SidecarKey, TempInUse};
use paths::{check_exec_path, directory_in_place, open_parent, open_path, system_time};
use sink::Sink;
use space::{Promise, SpaceLedger};
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use temp_file::{Resume, TempFile, cannot_create, check_final_name, temp_name};
use tracing::{debug, warn};
/// Where received entries go.
pub(in crate::engine::receiver) enum FileStore {
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

pub(in crate::engine::receiver) struct DirAttrs {
    path: String,
    mode: Option<u32>,
    mtime: Option<Mtime>,
}

impl FileStore {
    pub(in crate::engine::receiver) fn open(
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
    pub(in crate::engine::receiver) fn set_peer(&mut self, address: &str) {
        if let FileStore::Exec { peer, .. } = self {
            *peer = address.to_string();
        }
    }

    /// A command is started per file (--exec): it must start only for an
    /// offer the session can take (its ring registered).
    pub(in crate::engine::receiver) fn starts_commands(&self) -> bool {
        matches!(self, FileStore::Exec { .. })
    }

    /// Whether files may come in pieces over several lanes: into a
    /// directory tree only (the others take bytes in order, or none).
    pub(in crate::engine::receiver) fn takes_pieces(&self) -> bool {
        matches!(self, FileStore::Tree { .. })
    }

    /// The store a worker thread reads and links in (`--dir` only: the
    /// other stores read nothing for an offer): the same directories
    /// (descriptors duplicated), umask and ledger; no deferred attributes
    /// (those stay with the session). None for the other stores.
    pub(in crate::engine::receiver) fn for_worker(&self) -> std::io::Result<Option<FileStore>> {
        let FileStore::Tree {
            root,
            umask,
            keep_modes,
            ledger,
            link_dest,
            ..
        } = self
        else {
            return Ok(None);
        };
        Ok(Some(FileStore::Tree {
            root: root.try_clone()?,
            deferred: Vec::new(),
            umask: *umask,
            keep_modes: *keep_modes,
            ledger: Arc::clone(ledger),
            link_dest: link_dest.as_ref().map(DirFd::try_clone).transpose()?,
        }))
    }

    /// Applies the deferred directory attributes (best effort: a failure
    /// is logged, the data is already safe).
    pub(in crate::engine::receiver) fn finish_dirs(&mut self) {
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
    pub(in crate::engine::receiver) fn make_dir(&mut self, hello: &Hello) -> Result<(), Reject> {
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
                return Err(Reject::new(
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
            Reject::new(code, format!("{what} {}: {e}", hello.name))
        };
        if directory_in_place(&parent, &leaf, &hello.name)? {
            debug!(dir = %hello.name, "exists already: kept as it is");
            return Ok(());
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
    pub(in crate::engine::receiver) fn holding(
        &self,
        hello: &Hello,
        (chunk_len, overwrite): (u32, bool),
        wait: Duration,
        tick: &mut dyn FnMut() -> std::io::Result<()>,
    ) -> Result<(Holding, Option<Claim>), Reject> {
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
        let io = |e: std::io::Error| Reject::new(RejectCode::Io, format!("{}: {e}", hello.name));
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
            return Ok((Holding::copy(copy), Some(claim)));
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
    pub(in crate::engine::receiver) fn create(
        &mut self,
        hello: &Hello,
        overwrite: bool,
        dir: &Path,
        resume: Resume<'_>,
    ) -> Result<Sink, Reject> {
        self.create_announced(hello, overwrite, dir, resume, None)
    }

    /// As `create`, with the file's SHA-256 if its sender announced it
    /// before the data (`--exec` passes it on, and checks the data
    /// against it).
    pub(in crate::engine::receiver) fn create_announced(
        &mut self,
        hello: &Hello,
        overwrite: bool,
        dir: &Path,
        resume: Resume<'_>,
        sha256: Option<[u8; 32]>,
    ) -> Result<Sink, Reject> {
        let sink = match self {
            FileStore::Stdout(out) => {
                let Some(out) = out.take() else {
                    return Err(Reject::new(
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
                        Reject::new(
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
                    Ok::<_, Reject>((temp, file, None, Some(in_use)))
                };
                let (temp, file, resumable, in_use) = match resume {
                    Resume::No => plain_temp()?,
                    Resume::Fresh(claim) => {
                        let identity = Identity::of_offer(hello, 0).ok_or_else(|| {
                            Reject::new(
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
                                Reject::new(
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
                        return Err(Reject::new(
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

impl FileStore {
    /// Checks the files of a batch against what is on disk and opens a
    /// temporary file for each, as `create` does for one file, with the
    /// work shared by the batch: each directory opened once, the free
    /// space checked once for all of them, and no blocks reserved (small
    /// files; a write that finds the disk full fails the batch).
    pub(in crate::engine::receiver) fn create_batch(
        &mut self,
        members: &[Hello],
        overwrite: bool,
        dir: &Path,
        modes: (u32, bool),
    ) -> Result<BatchSink, Reject> {
        let (root, ledger) = match self {
            FileStore::Tree { root, ledger, .. } => (root, ledger),
            FileStore::Stdout(_) => {
                return Err(Reject::new(
                    RejectCode::Protocol,
                    "the receiver writes one file to its standard output (--stdout)",
                ));
            }
            FileStore::Exec { .. } => {
                return Err(Reject::new(
                    RejectCode::Protocol,
                    "the receiver runs a command per file (--exec): the files come one by one",
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
                        Reject::new(RejectCode::Io, format!("cannot inspect {dir}: {e}"))
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
