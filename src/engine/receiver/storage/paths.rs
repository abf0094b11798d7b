//! Paths below the output directory, resolved component by component from
//! its descriptor (never through a link), and the refusals on the way.

use crate::proto::{Mtime, Reject, RejectCode};
use crate::sys::dirfd::{DirFd, EntryKind};
use std::time::Duration;

/// Opens `path` (relative, already validated) below `root`, every component
/// with O_NOFOLLOW.
pub(super) fn open_path(root: &DirFd, path: &str) -> std::io::Result<DirFd> {
    let mut dir = root.try_clone()?;
    for c in path.split('/') {
        dir = dir.open_dir(c)?;
    }
    Ok(dir)
}

/// What is in place of a directory offer `name` (`leaf` in `parent`):
/// true for a directory (used as it is), false for nothing (to create),
/// else the refusal: a link is never followed, nor anything else replaced.
pub(super) fn directory_in_place(parent: &DirFd, leaf: &str, name: &str) -> Result<bool, Reject> {
    match parent.kind(leaf) {
        Ok(Some(EntryKind::Dir)) => Ok(true),
        Ok(None) => Ok(false),
        Ok(Some(EntryKind::Symlink)) => Err(Reject::new(
            RejectCode::Exists,
            format!("{name} is a symbolic link on the receiver: not followed"),
        )),
        Ok(Some(_)) => Err(Reject::new(
            RejectCode::Exists,
            format!("{name} exists on the receiver and is not a directory"),
        )),
        Err(e) => Err(Reject::new(
            RejectCode::Io,
            format!("cannot inspect {name}: {e}"),
        )),
    }
}

/// Opens the directory that holds `path`'s last component; returns it and
/// that component. Refuses symbolic links and non-directories on the way.
pub(super) fn open_parent(root: &DirFd, path: &str) -> Result<(DirFd, String), Reject> {
    let (parents, leaf) = match path.rsplit_once('/') {
        Some((p, l)) => (Some(p), l),
        None => (None, path),
    };
    let dir = match parents {
        Some(parents) => walk(root, parents, false)?.ok_or_else(|| {
            Reject::new(
                RejectCode::Io,
                format!("cannot open the directory of {path}"),
            )
        })?,
        None => root.try_clone().map_err(|e| {
            Reject::new(
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
pub(super) fn walk(root: &DirFd, parents: &str, missing_ok: bool) -> Result<Option<DirFd>, Reject> {
    let mut dir = root.try_clone().map_err(|e| {
        Reject::new(
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
pub(super) fn refusal_on_the_way(dir: &DirFd, c: &str, walked: &str, e: std::io::Error) -> Reject {
    match e.raw_os_error() {
        Some(libc::ENOENT) => Reject::new(
            RejectCode::Io,
            format!("directory {walked} does not exist on the receiver"),
        ),
        Some(libc::ELOOP | libc::ENOTDIR) => {
            if dir.kind(c).ok().flatten() == Some(EntryKind::Symlink) {
                Reject::new(
                    RejectCode::Exists,
                    format!("{walked} is a symbolic link on the receiver: not followed"),
                )
            } else {
                Reject::new(
                    RejectCode::Exists,
                    format!("{walked} exists on the receiver and is not a directory"),
                )
            }
        }
        _ => Reject::new(
            RejectCode::Io,
            format!("cannot open directory {walked}: {e}"),
        ),
    }
}

/// Checks a name for --exec's command: every part of it that exists under
/// `root` is a directory (its last part anything but a link); what does not
/// exist yet is the command's to make.
pub(super) fn check_exec_path(root: &DirFd, path: &str) -> Result<(), Reject> {
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
            Reject::new(
                RejectCode::Io,
                format!("cannot open the output directory: {e}"),
            )
        })?,
    };
    match parent.kind(leaf) {
        Ok(Some(EntryKind::Symlink)) => Err(Reject::new(
            RejectCode::Exists,
            format!("{path} is a symbolic link on the receiver: not followed"),
        )),
        Ok(_) => Ok(()),
        Err(e) => Err(Reject::new(
            RejectCode::Io,
            format!("cannot inspect {path}: {e}"),
        )),
    }
}

pub(super) fn system_time(m: Mtime) -> Option<std::time::SystemTime> {
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
