//! The sweep of old leftovers (kept partial files, their records, temporary
//! files of a receiver that died) under the receiver's directory.

use super::resumable::{CLAIMS, TEMPS};
use super::sidecar::partial_names;

/// Whether `name` is one of the receiver's own leftovers, in exactly the
/// forms it writes them: a kept partial file or its record
/// (`.rdma-xfer-partial-<24 hex>[.meta]`), or the temporary file of a
/// transfer whose receiver died (`.rdma-xfer-<pid>-<n>-<8 hex>.part`).
fn is_leftover(name: &str) -> bool {
    let hex = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if let Some(rest) = name.strip_prefix(".rdma-xfer-partial-") {
        return hex(rest.strip_suffix(".meta").unwrap_or(rest), 24);
    }
    let Some(rest) = name
        .strip_prefix(".rdma-xfer-")
        .and_then(|r| r.strip_suffix(".part"))
    else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    matches!(parts[..], [pid, n, x] if digits(pid) && digits(n) && hex(x, 8))
}

/// What a sweep did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Swept {
    /// Leftovers older than the limit, removed.
    pub removed: u64,
    /// Leftovers younger than it, kept.
    pub kept: u64,
}

/// Removes the partial files, their records and dead temporary files
/// under `root` that were not modified for `ttl`: the whole tree, never
/// through a link nor into another file system (a mount below `--dir`).
/// Spared whatever a live session uses: a partial file claimed (see
/// `Claim`), a temporary file a session writes (`TempInUse`). Directories wait as paths
/// and are opened one at a time, each from the root, component by
/// component: a tree of any width or depth costs two descriptors.
/// `go_on` is asked before each directory; false stops the sweep there.
///
/// A file's age runs from the later of its data's and its inode's last
/// change as of `now` (the time a file was given, its source's, does not
/// make it old).
pub(crate) fn sweep(
    root: &crate::sys::dirfd::DirFd,
    ttl: std::time::Duration,
    now: std::time::SystemTime,
    go_on: &dyn Fn() -> bool,
) -> Swept {
    use crate::sys::dirfd::EntryKind;
    let mut swept = Swept::default();
    let root_dev = match root.identity() {
        Ok((dev, _)) => dev,
        Err(e) => {
            tracing::warn!("cannot look for old partial files: {e}");
            return swept;
        }
    };
    // Directories still to search, as paths below the root ("" is the
    // root, "a/b/" a directory in it).
    let mut stack = vec![String::new()];
    while let Some(path) = stack.pop() {
        if !go_on() {
            break;
        }
        // Opened from the root, each step dropping the one before.
        let opened = root.try_clone().and_then(|top| {
            path.split_terminator('/')
                .try_fold(top, |dir, c| dir.open_dir(c))
        });
        let dir = match opened {
            Ok(d) => d,
            Err(e) => {
                tracing::debug!(dir = %path, "not searched for partial files: {e}");
                continue;
            }
        };
        let id = match dir.identity() {
            Ok((dev, _)) if dev != root_dev => {
                tracing::debug!(dir = %path, "another file system: not searched for partial files");
                continue;
            }
            Ok(id) => id,
            Err(e) => {
                tracing::warn!(dir = %path, "cannot look for old partial files: {e}");
                continue;
            }
        };
        let entries = match dir.entries() {
            Ok(e) => e,
            Err(e) => {
                tracing::warn!(dir = %path, "cannot look for old partial files: {e}");
                continue;
            }
        };
        for (name, kind) in entries {
            match kind {
                EntryKind::Dir => stack.push(format!("{path}{name}/")),
                EntryKind::File if is_leftover(&name) => {
                    // Checked (age included) and removed under the locks:
                    // no session claims it, creates or renews it between.
                    let claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
                    let temps = TEMPS.lock().unwrap_or_else(|e| e.into_inner());
                    let age = dir
                        .modified(&name)
                        .ok()
                        .and_then(|m| now.duration_since(m).ok())
                        .unwrap_or_default();
                    if age < ttl
                        || is_claimed(&claims, id, &name)
                        || temps.contains(&(id.0, id.1, name.clone()))
                    {
                        swept.kept += 1;
                        continue;
                    }
                    let removed = dir.unlink(&name);
                    drop((temps, claims));
                    match removed {
                        Ok(()) => {
                            tracing::info!(
                                path = %format!("{path}{name}"),
                                age_s = age.as_secs(),
                                "removed a partial file older than --partial-ttl"
                            );
                            swept.removed += 1;
                        }
                        Err(e) => {
                            tracing::warn!(path = %format!("{path}{name}"), "cannot remove an old partial file: {e}")
                        }
                    }
                }
                _ => {}
            }
        }
    }
    swept
}

/// Whether the leftover `name` in directory `dir` (device, inode) is the
/// partial file or record of a name a session claimed.
fn is_claimed(
    claims: &std::collections::BTreeSet<(u64, u64, String)>,
    dir: (u64, u64),
    name: &str,
) -> bool {
    claims
        .range((dir.0, dir.1, String::new())..)
        .take_while(|(dev, ino, _)| (*dev, *ino) == dir)
        .any(|(_, _, leaf)| {
            let (partial, meta) = partial_names(leaf);
            name == partial || name == meta
        })
}

#[cfg(test)]
mod tests {
    use super::super::resumable::{Claim, TempInUse};
    use super::*;
    use crate::sys::dirfd::DirFd;
    use std::time::{Duration, SystemTime};

    /// Sweeps look at the tree two hours from now (a file's change time
    /// cannot be set back), with a limit of one hour.
    fn later() -> SystemTime {
        SystemTime::now() + Duration::from_secs(7200)
    }
    const TTL: Duration = Duration::from_secs(3600);

    /// A file changed as late as the sweep's `later()`: young then.
    fn young(path: &std::path::Path) {
        let f = std::fs::File::options().write(true).open(path).unwrap();
        f.set_modified(later()).unwrap();
    }

    #[test]
    fn old_leftovers_go_young_ones_and_everything_else_stay() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("a/b")).unwrap();
        let (partial, meta) = partial_names("x");
        let old = [
            r.join(&partial),
            r.join(format!("a/b/{meta}")),
            r.join("a/.rdma-xfer-12-0-0000abcd.part"),
        ];
        let young_one = r.join(format!("a/{partial}"));
        // Like leftovers, not in their exact forms: a user's files.
        let other = [
            r.join("a/b/.rdma-xfer-partial"),
            r.join("keep.bin"),
            r.join(format!("a/{partial}x")),
            r.join("a/b/.rdma-xfer-partial-notes.meta"),
            r.join("a/.rdma-xfer-my-notes.part"),
            r.join("a/.rdma-xfer-12-0-0000abcd.part.txt"),
            // The directory's key of partial-file records: never swept.
            r.join(super::super::key::KEY_NAME),
        ];
        for p in old.iter().chain([&young_one]).chain(&other) {
            std::fs::write(p, b"x").unwrap();
        }
        young(&young_one);
        // Through a link: never.
        let linked = outside.path().join(&partial);
        std::fs::write(&linked, b"x").unwrap();
        std::os::unix::fs::symlink(outside.path(), r.join("a/link")).unwrap();
        let swept = sweep(&DirFd::open(r).unwrap(), TTL, later(), &|| true);
        assert_eq!(
            swept,
            Swept {
                removed: 3,
                kept: 1
            }
        );
        assert!(old.iter().all(|p| !p.exists()));
        assert!(young_one.exists() && other.iter().all(|p| p.exists()) && linked.exists());
    }

    #[test]
    fn what_a_session_uses_is_never_swept() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir(r.join("a")).unwrap();
        let (partial, meta) = partial_names("x.bin");
        let (other, _) = partial_names("y.bin");
        // In use: marked by its session (a dead one of the same pid is
        // not).
        let own = format!(".rdma-xfer-{}-0-00000000.part", std::process::id());
        let dead = format!(".rdma-xfer-{}-1-00000000.part", std::process::id());
        let files = [&partial, &meta, &other, &own, &dead].map(|n| r.join("a").join(n));
        for p in &files {
            std::fs::write(p, b"x").unwrap();
        }
        let a = DirFd::open(&r.join("a")).unwrap();
        let claim = Claim::try_take(&a, "x.bin").unwrap().unwrap();
        let in_use = TempInUse::new(&a, &own).unwrap();
        let root_fd = DirFd::open(r).unwrap();
        // The claimed name's partial and record, and the temporary file in
        // use, stay; the others go.
        assert_eq!(
            sweep(&root_fd, TTL, later(), &|| true),
            Swept {
                removed: 2,
                kept: 3
            }
        );
        assert!(files[..2].iter().all(|p| p.exists()) && files[3].exists());
        assert!(!files[2].exists() && !files[4].exists());
        // Given back: swept.
        drop(claim);
        drop(in_use);
        assert_eq!(
            sweep(&root_fd, TTL, later(), &|| true),
            Swept {
                removed: 3,
                kept: 0
            }
        );
    }

    #[test]
    fn directories_are_opened_one_at_a_time() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path().canonicalize().unwrap();
        // Wide and deep: 100 directories side by side, one of them 100 deep.
        let mut deep = r.join("d0");
        for i in 0..100 {
            std::fs::create_dir_all(r.join(format!("d{i}"))).unwrap();
            deep.push("n");
        }
        std::fs::create_dir_all(&deep).unwrap();
        let (partial, _) = partial_names("x");
        std::fs::write(deep.join(&partial), b"x").unwrap();
        // Descriptors open below the root (other tests' are elsewhere),
        // counted each time the sweep turns to the next directory.
        let below = || {
            std::fs::read_dir("/proc/self/fd")
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .filter(|t| t.starts_with(&r) && t != &r)
                .count()
        };
        // The count sees a descriptor held below the root.
        let held = DirFd::open(&r.join("d1")).unwrap();
        assert_eq!(below(), 1);
        drop(held);
        let most = std::cell::Cell::new(0);
        let turns = std::cell::Cell::new(0);
        let go_on = || {
            most.set(most.get().max(below()));
            turns.set(turns.get() + 1);
            true
        };
        let swept = sweep(&DirFd::open(&r).unwrap(), TTL, later(), &go_on);
        assert_eq!(swept.removed, 1);
        assert_eq!(turns.get(), 1 + 100 + 100);
        assert_eq!(most.get(), 0, "directories held open between turns");
        // And it stops when told.
        let turns = std::cell::Cell::new(0);
        sweep(&DirFd::open(&r).unwrap(), Duration::ZERO, later(), &|| {
            turns.set(turns.get() + 1);
            turns.get() < 3
        });
        assert_eq!(turns.get(), 3);
    }
}
