//! Directory-relative file operations (the `openat` family) for the
//! receiver. Every component below the root is opened with `O_NOFOLLOW`
//! and every leaf is created, inspected, renamed or removed relative to its
//! parent's descriptor without following a link, so a received path can
//! never reach outside the output directory — not even through a symbolic
//! link that already exists inside it. The calls are rustix's safe
//! wrappers; no `unsafe` here.

#![forbid(unsafe_code)]

use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags};
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::path::Path;

/// What a directory entry is (`lstat` semantics: a link is a link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    /// A regular file.
    File,
    /// A directory.
    Dir,
    /// A symbolic link (never followed).
    Symlink,
    /// Anything else (device, socket, FIFO).
    Other,
}

/// An open directory.
#[derive(Debug)]
pub struct DirFd {
    fd: OwnedFd,
}

/// Why a file the receiver would write to is not to be trusted with it.
#[derive(Debug, thiserror::Error)]
pub enum OwnFileError {
    /// It could not be looked at or opened (`NotFound`: nothing there).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// It is there, but not the receiver's own file (see `open_own_file`).
    #[error("{name} is not the receiver's own file ({why})")]
    Foreign {
        /// Its name in the directory.
        name: String,
        /// Which check it failed.
        why: String,
    },
}

/// Why the file `st` describes is not the receiver's own: not a regular
/// file, more than one link, or another owner than the effective uid.
fn not_own(st: &rustix::fs::Stat) -> Option<String> {
    let euid = rustix::process::geteuid().as_raw();
    match FileType::from_raw_mode(st.st_mode) {
        FileType::RegularFile => {}
        FileType::Symlink => return Some("a symbolic link".into()),
        _ => return Some("not a regular file".into()),
    }
    if st.st_nlink != 1 {
        return Some(format!("{} hard links, not 1", st.st_nlink));
    }
    if st.st_uid != euid {
        return Some(format!("owned by uid {}, not {euid}", st.st_uid));
    }
    None
}

/// Whether the open `file` is the receiver's own (a regular file with one
/// link, owned by the effective uid), and if not, why: what a change of a
/// file it did not write itself (its times, say) must check first.
pub fn not_own_file(file: &File) -> io::Result<Option<String>> {
    let st = rustix::fs::fstat(file).map_err(io::Error::from)?;
    Ok(not_own(&st))
}

/// A single component: no separator, not empty, not `.` or `..` (the
/// protocol layer already refuses such names; this is the last line). A
/// NUL inside is refused by rustix when it builds the C string.
fn component(name: &str) -> io::Result<&str> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a single path component"),
        ));
    }
    Ok(name)
}

impl DirFd {
    /// Opens the root directory itself (a link here is the user's choice
    /// of root, so it is followed).
    pub fn open(path: &Path) -> io::Result<DirFd> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(DirFd { fd })
    }

    /// The directory's entries (not `.` and `..`) and what each is,
    /// without following links; names that are not UTF-8 are left out
    /// (no received name is one).
    pub fn entries(&self) -> io::Result<Vec<(String, EntryKind)>> {
        let mut out = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let entry = entry?;
            let Ok(name) = entry.file_name().to_str() else {
                continue;
            };
            if name == "." || name == ".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::RegularFile => EntryKind::File,
                FileType::Directory => EntryKind::Dir,
                FileType::Symlink => EntryKind::Symlink,
                FileType::Unknown => match self.kind(name)? {
                    Some(k) => k,
                    None => continue,
                },
                _ => EntryKind::Other,
            };
            out.push((name.to_string(), kind));
        }
        Ok(out)
    }

    /// The directory's identity on this machine: its device and inode.
    pub fn identity(&self) -> io::Result<(u64, u64)> {
        let st = rustix::fs::fstat(&self.fd)?;
        Ok((st.st_dev, st.st_ino))
    }

    /// Whether `name` (not followed if a link) is the file open as `file`:
    /// the same device and inode.
    pub fn is_same(&self, name: &str, file: &File) -> io::Result<bool> {
        let at = rustix::fs::statat(&self.fd, component(name)?, AtFlags::SYMLINK_NOFOLLOW)?;
        let of = rustix::fs::fstat(file)?;
        Ok((at.st_dev, at.st_ino) == (of.st_dev, of.st_ino))
    }

    /// When `name` (not followed if a link) was last modified.
    pub fn modified(&self, name: &str) -> io::Result<std::time::SystemTime> {
        let st = rustix::fs::statat(&self.fd, component(name)?, AtFlags::SYMLINK_NOFOLLOW)?;
        let at = |secs: i64, nanos: i64| {
            std::time::UNIX_EPOCH
                + std::time::Duration::new(
                    u64::try_from(secs).unwrap_or(0),
                    u32::try_from(nanos).unwrap_or(0),
                )
        };
        // The later of the data's and the inode's change: a time set back
        // (a file given its source's mtime) still counts as a change now.
        #[allow(clippy::unnecessary_cast)]
        Ok(at(st.st_mtime as i64, st.st_mtime_nsec as i64)
            .max(at(st.st_ctime as i64, st.st_ctime_nsec as i64)))
    }

    /// Opens the subdirectory `name`; a symbolic link or a non-directory
    /// fails (ENOTDIR or ELOOP: see `kind` for which).
    pub fn open_dir(&self, name: &str) -> io::Result<DirFd> {
        let fd = rustix::fs::openat(
            &self.fd,
            component(name)?,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(DirFd { fd })
    }

    /// What `name` is, without following a link; None if it does not exist.
    pub fn kind(&self, name: &str) -> io::Result<Option<EntryKind>> {
        let st = match rustix::fs::statat(&self.fd, component(name)?, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        Ok(Some(match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => EntryKind::File,
            FileType::Directory => EntryKind::Dir,
            FileType::Symlink => EntryKind::Symlink,
            _ => EntryKind::Other,
        }))
    }

    /// Creates the directory `name` (fails if anything exists there).
    pub fn mkdir(&self, name: &str, mode: u32) -> io::Result<()> {
        // mkdirat never follows a link in its last component.
        Ok(rustix::fs::mkdirat(
            &self.fd,
            component(name)?,
            Mode::from_raw_mode(mode as _),
        )?)
    }

    /// Creates the regular file `name` for writing; fails if anything
    /// (including a dangling link) exists there.
    pub fn create_new(&self, name: &str, mode: u32) -> io::Result<File> {
        // O_EXCL with O_CREAT never follows a link.
        let fd = rustix::fs::openat(
            &self.fd,
            component(name)?,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode as _),
        )?;
        Ok(File::from(fd))
    }

    /// Opens the existing regular file `name` (for reading, or also for
    /// writing), never through a link; anything but a regular file (a
    /// FIFO, a device, a directory) is refused without blocking on it.
    pub fn open_file(&self, name: &str, write: bool) -> io::Result<File> {
        let access = if write { OFlags::RDWR } else { OFlags::RDONLY };
        let fd = rustix::fs::openat(
            &self.fd,
            component(name)?,
            access | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        let file = File::from(fd);
        if !file.metadata()?.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name} is not a regular file"),
            ));
        }
        Ok(file)
    }

    /// Opens the existing file `name` for reading and writing only if it
    /// is the receiver's own: a regular file with exactly one link, owned
    /// by the effective uid. The name is looked at without following a
    /// link (nothing else is even opened), and the verdict is the opened
    /// descriptor's (`fstat`), so a name swapped in between is caught. A
    /// file that is there but fails a check is `OwnFileError::Foreign`:
    /// writing to it (a planted hard link, another user's file) could
    /// change a file the receiver was never given.
    pub fn open_own_file(&self, name: &str) -> Result<File, OwnFileError> {
        let foreign = |why: String| OwnFileError::Foreign {
            name: name.to_string(),
            why,
        };
        let seen = rustix::fs::statat(&self.fd, component(name)?, AtFlags::SYMLINK_NOFOLLOW)
            .map_err(io::Error::from)?;
        if let Some(why) = not_own(&seen) {
            return Err(foreign(why));
        }
        let fd = rustix::fs::openat(
            &self.fd,
            component(name)?,
            OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => foreign("a symbolic link".into()),
            e => OwnFileError::Io(e.into()),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io::Error::from)?;
        if let Some(why) = not_own(&st) {
            return Err(foreign(why));
        }
        if (st.st_dev, st.st_ino) != (seen.st_dev, seen.st_ino) {
            return Err(foreign("replaced while it was opened".into()));
        }
        Ok(File::from(fd))
    }

    /// Renames `from` to `to`, both in this directory. Neither is followed
    /// if it is a link (a link at `to` is replaced, never written through).
    /// With `noreplace`, an existing `to` fails with AlreadyExists.
    pub fn rename(&self, from: &str, to: &str, noreplace: bool) -> io::Result<()> {
        let flags = if noreplace {
            RenameFlags::NOREPLACE
        } else {
            RenameFlags::empty()
        };
        Ok(rustix::fs::renameat_with(
            &self.fd,
            component(from)?,
            &self.fd,
            component(to)?,
            flags,
        )?)
    }

    /// Makes `to_name` in `to` a hard link to the file `name` here (not
    /// followed if a link). Fails with EXDEV across file systems.
    pub fn link_to(&self, name: &str, to: &DirFd, to_name: &str) -> io::Result<()> {
        Ok(rustix::fs::linkat(
            &self.fd,
            component(name)?,
            &to.fd,
            component(to_name)?,
            AtFlags::empty(),
        )?)
    }

    /// Removes the file `name` (not a directory).
    pub fn unlink(&self, name: &str) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(
            &self.fd,
            component(name)?,
            AtFlags::empty(),
        )?)
    }

    /// fsync of the directory itself (makes created/renamed entries durable).
    pub fn sync(&self) -> io::Result<()> {
        Ok(rustix::fs::fsync(&self.fd)?)
    }

    /// Another descriptor of the same directory.
    pub fn try_clone(&self) -> io::Result<DirFd> {
        Ok(DirFd {
            fd: self.fd.try_clone()?,
        })
    }

    /// The directory as a `File` (a duplicate descriptor), for the safe
    /// std calls that work on any descriptor: permissions, times, fsync.
    pub fn as_file(&self) -> io::Result<File> {
        Ok(File::from(self.fd.try_clone()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn open_file_takes_regular_files_only_and_never_a_link() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("f"), b"abc").unwrap();
        std::os::unix::fs::symlink(root.path().join("f"), root.path().join("l")).unwrap();
        std::fs::create_dir(root.path().join("d")).unwrap();
        let d = DirFd::open(root.path()).unwrap();
        let mut s = String::new();
        std::io::Read::read_to_string(&mut d.open_file("f", false).unwrap(), &mut s).unwrap();
        assert_eq!(s, "abc");
        assert!(d.open_file("f", true).is_ok());
        assert!(d.open_file("l", false).is_err(), "through a link");
        assert!(d.open_file("d", false).is_err(), "a directory");
        assert!(d.open_file("missing", false).is_err());
        assert!(d.open_file("../f", false).is_err(), "not one component");
    }

    #[test]
    fn own_files_are_regular_single_linked_and_the_euids() {
        let root = tempfile::tempdir().unwrap();
        let p = |n: &str| root.path().join(n);
        std::fs::write(p("own"), b"abc").unwrap();
        std::fs::write(p("linked"), b"abc").unwrap();
        std::fs::hard_link(p("linked"), p("second")).unwrap();
        std::os::unix::fs::symlink(p("own"), p("symlink")).unwrap();
        std::fs::create_dir(p("dir")).unwrap();
        let d = DirFd::open(root.path()).unwrap();
        assert!(d.open_own_file("own").is_ok());
        let foreign = |n: &str| match d.open_own_file(n) {
            Err(OwnFileError::Foreign { why, .. }) => why,
            other => panic!("{n}: {other:?}"),
        };
        assert_eq!(foreign("linked"), "2 hard links, not 1");
        assert_eq!(foreign("second"), "2 hard links, not 1");
        assert_eq!(foreign("symlink"), "a symbolic link");
        assert_eq!(foreign("dir"), "not a regular file");
        assert!(matches!(
            d.open_own_file("missing"),
            Err(OwnFileError::Io(e)) if e.kind() == io::ErrorKind::NotFound
        ));
        if rustix::process::geteuid().is_root() {
            std::os::unix::fs::chown(p("own"), Some(65534), None).unwrap();
            assert_eq!(foreign("own"), "owned by uid 65534, not 0");
        } else {
            eprintln!(
                "not root: the case of a file of another owner is skipped (chown needs root)"
            );
        }
        // Nothing was written through any of them.
        assert_eq!(std::fs::read(p("linked")).unwrap(), b"abc");
    }

    #[test]
    fn never_follows_links_below_the_root() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("link")).unwrap();
        std::os::unix::fs::symlink(outside.path().join("x"), root.path().join("dangling")).unwrap();
        std::fs::write(root.path().join("file"), b"x").unwrap();
        let d = DirFd::open(root.path()).unwrap();
        assert_eq!(d.kind("link").unwrap(), Some(EntryKind::Symlink));
        assert_eq!(d.kind("file").unwrap(), Some(EntryKind::File));
        assert_eq!(d.kind("nothing").unwrap(), None);
        // O_NOFOLLOW with O_DIRECTORY: Linux says ENOTDIR, others ELOOP.
        let e = d.open_dir("link").unwrap_err();
        assert!(
            matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)),
            "{e}"
        );
        let e = d.open_dir("file").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTDIR), "{e}");
        // Creating through a dangling link fails instead of creating its target.
        assert!(d.create_new("dangling", 0o600).is_err());
        assert!(d.mkdir("link", 0o700).is_err());
        assert!(!outside.path().join("x").exists());
        // Renaming onto a link replaces the link, never its target.
        let mut f = d.create_new("tmp", 0o600).unwrap();
        std::io::Write::write_all(&mut f, b"new").unwrap();
        d.rename("tmp", "link", true).unwrap_err();
        d.rename("tmp", "link", false).unwrap();
        assert_eq!(d.kind("link").unwrap(), Some(EntryKind::File));
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // Components are single names only.
        for bad in ["", ".", "..", "a/b", "../x", "a\0b"] {
            assert!(d.open_dir(bad).is_err(), "{bad:?}");
            assert!(d.create_new(bad, 0o600).is_err(), "{bad:?}");
            assert!(d.kind(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn directories_files_and_attributes() {
        let root = tempfile::tempdir().unwrap();
        let d = DirFd::open(root.path()).unwrap();
        d.mkdir("sub", 0o700).unwrap();
        assert_eq!(
            d.mkdir("sub", 0o700).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        let sub = d.open_dir("sub").unwrap();
        sub.as_file()
            .unwrap()
            .set_permissions(std::fs::Permissions::from_mode(0o751))
            .unwrap();
        let meta = std::fs::metadata(root.path().join("sub")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o751);
        let f = sub.create_new("f", 0o600).unwrap();
        drop(f);
        assert!(sub.create_new("f", 0o600).is_err());
        let f = sub.open_file("f", false).unwrap();
        assert!(sub.is_same("f", &f).unwrap());
        sub.rename("f", "g", true).unwrap();
        assert!(sub.is_same("g", &f).unwrap());
        drop(sub.create_new("f", 0o600).unwrap());
        assert!(!sub.is_same("f", &f).unwrap());
        sub.unlink("f").unwrap();
        sub.sync().unwrap();
        sub.unlink("g").unwrap();
        assert_eq!(sub.kind("g").unwrap(), None);
        assert!(DirFd::open(&root.path().join("missing")).is_err());
    }
}
