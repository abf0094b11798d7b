//! What is under an offer's final name before anything is decided about
//! it: a regular file's size and modification time (the machine's quick
//! check, `ReceiverSession::existing`), and the file itself, open, for a
//! COMPARE by SHA-256 (sender --checksum).

use super::FileStore;
use super::paths::{open_parent, system_time};
use crate::proto::{Existing, Hello, Mtime};
use crate::sys::dirfd::EntryKind;
use std::fs::File;
use std::os::unix::fs::MetadataExt;

impl FileStore {
    /// The regular file under `hello`'s final name, open for reading
    /// (never through a link), with its size and modification time.
    /// Anything else there (a directory, a link, a FIFO, a file that
    /// cannot be opened) is `Other`; nothing there, a path that cannot be
    /// opened, or a store that keeps nothing is `NoFile`: the offer goes
    /// on, and the store's own checks say what is wrong with it.
    pub(in crate::engine::receiver) fn existing(&self, hello: &Hello) -> (Existing, Option<File>) {
        let FileStore::Tree { root, .. } = self else {
            return (Existing::NoFile, None);
        };
        let Ok((parent, leaf)) = open_parent(root, &hello.name) else {
            return (Existing::NoFile, None);
        };
        match parent.kind(&leaf) {
            Ok(None) => return (Existing::NoFile, None),
            Ok(Some(EntryKind::File)) => {}
            _ => return (Existing::Other, None),
        }
        let Ok(file) = parent.open_file(&leaf, false) else {
            return (Existing::Other, None);
        };
        match file.metadata() {
            Ok(m) if m.is_file() => (
                Existing::File {
                    size: m.len(),
                    secs: m.mtime(),
                    nsec: m.mtime_nsec(),
                },
                Some(file),
            ),
            _ => (Existing::Other, None),
        }
    }
}

/// Gives the file under the final name the offer's modification time:
/// its content was found the same (--checksum), and the next run then
/// finds it unchanged by size and time alone, as rsync's -c with -t. Only
/// the receiver's own files (one link, its uid: never another user's, nor
/// one linked elsewhere, as a --link-dest snapshot's), and only where the
/// receiver may replace files (--overwrite: the caller's to check).
pub(in crate::engine::receiver) fn take_time(file: &File, mtime: Mtime) -> std::io::Result<()> {
    if let Some(why) = crate::sys::dirfd::not_own_file(file)? {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!("not the receiver's own file ({why}): its time stays"),
        ));
    }
    match system_time(mtime) {
        Some(t) => file.set_modified(t),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::receiver::storage::tests::{hello, store};

    #[test]
    fn only_a_regular_file_is_existing_never_through_a_link() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"abc").unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::os::unix::fs::symlink("f", dir.path().join("l")).unwrap();
        std::os::unix::fs::symlink(".", dir.path().join("up")).unwrap();
        let store = store(dir.path());
        let (found, file) = store.existing(&hello("f", 3));
        let m = std::fs::metadata(dir.path().join("f")).unwrap();
        assert_eq!(
            found,
            Existing::File {
                size: 3,
                secs: m.mtime(),
                nsec: m.mtime_nsec()
            }
        );
        assert!(file.is_some());
        for name in ["d", "l"] {
            assert_eq!(store.existing(&hello(name, 3)).0, Existing::Other, "{name}");
        }
        for name in ["up/f", "missing", "d/missing"] {
            assert_eq!(
                store.existing(&hello(name, 3)).0,
                Existing::NoFile,
                "{name}"
            );
        }
    }
}
