//! A dry run's checks (`sender --dry-run`): everything a real run checks
//! on disk for an offer (its directory, the final name, free space), and
//! nothing created. A directory the dry run would create is remembered,
//! so that what would go inside it is judged as new.

use super::FileStore;
use super::paths::{check_exec_path, directory_in_place, open_parent};
use super::temp_file::check_final_name;
use crate::proto::{Hello, Reject, RejectCode};
use crate::sys::os::free_space;
use std::collections::HashSet;
use std::path::Path;

/// Most bytes of directory names a dry run's session remembers (the
/// directories it would create): past it, a directory offer is refused.
const MAX_NAMES: usize = 16 << 20;

/// What a dry run would have created so far in its session: its
/// directories, and the bytes of its files (its free-space check counts
/// them all, as a real run's promises would, without holding any).
#[derive(Debug, Default)]
pub(in crate::engine::receiver) struct WouldCreate {
    dirs: HashSet<String>,
    names: usize,
    bytes: u64,
}

impl WouldCreate {
    /// Whether `name` lies inside a directory the dry run would create.
    fn holds(&self, name: &str) -> bool {
        let mut at = name;
        while let Some((parent, _)) = at.rsplit_once('/') {
            if self.dirs.contains(parent) {
                return true;
            }
            at = parent;
        }
        false
    }
}

impl FileStore {
    /// The checks `make_dir` (a directory) or `create` (a file or stream)
    /// would make of `hello`, with nothing created: Ok when a real run
    /// would go on (and, for a directory, create it or use the one there),
    /// else the refusal it would send.
    pub(in crate::engine::receiver) fn dry_run(
        &self,
        hello: &Hello,
        overwrite: bool,
        dir: &Path,
        would_create: &mut WouldCreate,
    ) -> Result<(), Reject> {
        let (root, ledger) = match self {
            FileStore::Tree { root, ledger, .. } => (root, ledger),
            FileStore::Discard => return Ok(()),
            FileStore::Exec { root, .. } => return check_exec_path(root, &hello.name),
            FileStore::Stdout(_) if hello.is_directory() => {
                return Err(Reject::new(
                    RejectCode::Protocol,
                    format!(
                        "the receiver writes to its standard output (--stdout) and cannot create directory {}",
                        hello.name
                    ),
                ));
            }
            FileStore::Stdout(None) => {
                return Err(Reject::new(
                    RejectCode::Protocol,
                    "the receiver writes to its standard output (--stdout): one file or stream per session",
                ));
            }
            FileStore::Stdout(Some(_)) => return Ok(()),
        };
        // Below a directory this run would create: new, only the space
        // counts.
        if !would_create.holds(&hello.name) {
            let (parent, leaf) = open_parent(root, &hello.name)?;
            if hello.is_directory() {
                if directory_in_place(&parent, &leaf, &hello.name)? {
                    return Ok(());
                }
            } else {
                check_final_name(&parent, &leaf, &hello.name, overwrite)?;
            }
        }
        if hello.is_directory() {
            if would_create.names + hello.name.len() > MAX_NAMES {
                return Err(Reject::new(
                    RejectCode::TooLarge,
                    format!(
                        "{}: a dry run's session remembers at most {} MiB of directory names",
                        hello.name,
                        MAX_NAMES >> 20
                    ),
                ));
            }
            would_create.names += hello.name.len();
            would_create.dirs.insert(hello.name.clone());
            return Ok(());
        }
        // The space a real run would promise for this file and the ones
        // before it, given back at once (nothing is held).
        let size = if hello.is_stream() { 0 } else { hello.size };
        let all = would_create.bytes.saturating_add(size);
        ledger.promise(&hello.name, all, || free_space(dir))?;
        would_create.bytes = all;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::receiver::storage::tests::{entries, hello, store};
    use crate::proto::hello_flags;

    fn dir_offer(name: &str) -> Hello {
        Hello {
            caps: hello_flags::DIRECTORY | hello_flags::MTIME,
            size: 0,
            ..hello(name, 0)
        }
    }

    #[test]
    fn a_dry_run_checks_as_a_real_run_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"abc").unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::os::unix::fs::symlink("d", dir.path().join("l")).unwrap();
        let s = store(dir.path());
        let mut would = WouldCreate::default();
        let check = |h: &Hello, overwrite: bool, would: &mut WouldCreate| {
            s.dry_run(h, overwrite, dir.path(), would)
                .map_err(|r| r.code)
        };
        // New names go; an existing file only with --overwrite.
        assert_eq!(check(&hello("g", 3), false, &mut would), Ok(()));
        assert_eq!(
            check(&hello("f", 3), false, &mut would),
            Err(RejectCode::Exists)
        );
        assert_eq!(check(&hello("f", 3), true, &mut would), Ok(()));
        // Directories: one there is used, a link or a file refused.
        assert_eq!(check(&dir_offer("d"), false, &mut would), Ok(()));
        assert_eq!(
            check(&dir_offer("l"), false, &mut would),
            Err(RejectCode::Exists)
        );
        assert_eq!(
            check(&dir_offer("f"), false, &mut would),
            Err(RejectCode::Exists)
        );
        // Inside a missing directory: refused, unless this run would
        // create it (then its whole subtree is new).
        assert!(check(&hello("new/x", 3), false, &mut would).is_err());
        assert_eq!(check(&dir_offer("new"), false, &mut would), Ok(()));
        assert_eq!(check(&dir_offer("new/sub"), false, &mut would), Ok(()));
        assert_eq!(check(&hello("new/sub/x", 3), false, &mut would), Ok(()));
        // Through a link: refused as a real run would.
        assert!(check(&hello("l/x", 3), false, &mut would).is_err());
        // More than the file system holds: no space; and files that fit
        // one by one but not together (the dry run counts them all).
        assert_eq!(
            check(&hello("huge", u64::MAX / 2), false, &mut would),
            Err(RejectCode::NoSpace)
        );
        let free = crate::sys::os::free_space(dir.path()).unwrap().bytes;
        let mut fresh = WouldCreate::default();
        let half = free / 2 + free / 8;
        assert_eq!(check(&hello("h1", half), false, &mut fresh), Ok(()));
        assert_eq!(
            check(&hello("h2", half), false, &mut fresh),
            Err(RejectCode::NoSpace)
        );
        // Nothing was created.
        assert_eq!(entries(dir.path()), ["d", "f", "l"]);
    }
}
