//! What the sender sends, decided before it connects: the command line's
//! files, standard input (`-`) and, with `-r`, directory trees walked into
//! a list of directories (parents first) and files with relative paths.

use crate::error::XferError;
use crate::proto::Mtime;
use std::fs::{File, Metadata};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tracing::warn;

/// How command-line arguments become entries.
#[derive(Debug, Clone, Default)]
pub struct WalkOptions {
    /// `-r`: directories are sent as trees (otherwise they are a usage error).
    pub recursive: bool,
    /// `--follow-links`: follow symbolic links found inside trees (links
    /// named on the command line are always followed).
    pub follow_links: bool,
    /// `-p`: carry modification times and ask the receiver to keep modes
    /// as they are (without it the receiver's umask applies).
    pub preserve: bool,
    /// Carry modification times even without `preserve` (`--resume`: they
    /// identify the source; the receiver applies them too).
    pub times: bool,
    /// Name of standard input on the receiver (`--name`, default "stdin").
    pub stdin_name: String,
}

/// One thing to send.
#[derive(Debug)]
pub enum Entry {
    /// A regular file. Files named on the command line are opened before
    /// connecting (so a typo fails at once); files found in a tree are
    /// opened when their turn comes (a tree may hold more files than a
    /// process may open).
    File {
        path: PathBuf,
        name: String,
        /// As seen when planning (the file is measured again when sent).
        size: u64,
        opened: Option<File>,
        mtime: Option<Mtime>,
    },
    Dir {
        name: String,
        mode: u32,
        mtime: Option<Mtime>,
    },
    /// Standard input, of unknown length.
    Stdin { name: String },
}

impl Entry {
    pub fn name(&self) -> &str {
        match self {
            Entry::File { name, .. } | Entry::Dir { name, .. } | Entry::Stdin { name } => name,
        }
    }

    /// Bytes to send, as far as known (0 for directories and streams).
    pub fn size(&self) -> u64 {
        match self {
            Entry::File { size, .. } => *size,
            Entry::Dir { .. } | Entry::Stdin { .. } => 0,
        }
    }
}

/// The entries to send, and problems met on the way (an unreadable
/// directory inside a tree, a name that is not UTF-8): those were reported
/// and are skipped, and the sender's exit status will say so.
#[derive(Debug)]
pub struct Plan {
    pub entries: Vec<Entry>,
    pub problems: Vec<XferError>,
    /// Symbolic links and special files skipped (with a warning).
    pub skipped: usize,
}

impl Plan {
    /// Files (streams included) and their bytes as far as known, for
    /// progress reports.
    pub fn files_and_bytes(&self) -> (u64, u64) {
        let files = self
            .entries
            .iter()
            .filter(|e| !matches!(e, Entry::Dir { .. }))
            .count();
        (files as u64, self.entries.iter().map(Entry::size).sum())
    }
}

/// The modification time of `meta` for the wire.
pub fn mtime_of(meta: &Metadata) -> Option<Mtime> {
    let nanos = u32::try_from(meta.mtime_nsec()).ok()?;
    (nanos < 1_000_000_000).then_some(Mtime {
        secs: meta.mtime(),
        nanos,
    })
}

/// Turns the command line into entries. Fails (before any connection)
/// for a missing or unreadable argument, a directory without `-r`,
/// standard input named twice, or something that is not a file at all.
pub fn plan(paths: &[PathBuf], opts: &WalkOptions) -> Result<Plan, XferError> {
    let mut plan = Plan {
        entries: Vec::new(),
        problems: Vec::new(),
        skipped: 0,
    };
    let mut stdin_seen = false;
    for path in paths {
        if path.as_os_str() == "-" {
            if stdin_seen {
                return Err(XferError::Usage(
                    "standard input (-) can be sent only once".into(),
                ));
            }
            stdin_seen = true;
            plan.entries.push(Entry::Stdin {
                name: opts.stdin_name.clone(),
            });
            continue;
        }
        let meta = std::fs::metadata(path)
            .map_err(|e| XferError::io(format!("cannot open {}", path.display()), e))?;
        if meta.is_dir() {
            if !opts.recursive {
                return Err(XferError::Usage(format!(
                    "{} is a directory (use -r to send directory trees)",
                    path.display()
                )));
            }
            let name = tree_root_name(path)?;
            let mut ancestors = Vec::new();
            walk(path, name, &meta, opts, &mut ancestors, &mut plan);
            continue;
        }
        if !meta.is_file() {
            return Err(XferError::Usage(format!(
                "{} is not a regular file",
                path.display()
            )));
        }
        let file = File::open(path)
            .map_err(|e| XferError::io(format!("cannot open {}", path.display()), e))?;
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .ok_or_else(|| {
                XferError::Usage(format!("{} has no valid UTF-8 file name", path.display()))
            })?
            .to_string();
        plan.entries.push(Entry::File {
            path: path.clone(),
            name,
            size: meta.len(),
            opened: Some(file),
            mtime: (opts.preserve || opts.times)
                .then(|| mtime_of(&meta))
                .flatten(),
        });
    }
    Ok(plan)
}

/// The name a tree arrives under: the directory's own name (`src/` and
/// `src` both arrive as `src`; `.` as the current directory's name).
fn tree_root_name(path: &Path) -> Result<String, XferError> {
    let named = match path.file_name() {
        Some(n) => Some(n.to_owned()),
        None => std::fs::canonicalize(path)
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_owned())),
    };
    let named = named.ok_or_else(|| {
        XferError::Usage(format!(
            "{} has no name to send it under; name a directory below it",
            path.display()
        ))
    })?;
    named
        .to_str()
        .map(str::to_string)
        .ok_or_else(|| XferError::Usage(format!("{} has no valid UTF-8 name", path.display())))
}

/// Adds the directory `dir` (arriving as `name`) and, sorted by name, its
/// entries. `ancestors` holds the (device, inode) of the directories above,
/// to refuse loops when links are followed.
fn walk(
    dir: &Path,
    name: String,
    meta: &Metadata,
    opts: &WalkOptions,
    ancestors: &mut Vec<(u64, u64)>,
    plan: &mut Plan,
) {
    plan.entries.push(Entry::Dir {
        name: name.clone(),
        mode: meta.permissions().mode() & 0o7777,
        mtime: (opts.preserve || opts.times)
            .then(|| mtime_of(meta))
            .flatten(),
    });
    let read = std::fs::read_dir(dir).and_then(|it| it.collect::<Result<Vec<_>, _>>());
    let mut children = match read {
        Ok(c) => c,
        Err(e) => {
            let err = XferError::io(format!("cannot read directory {}", dir.display()), e);
            eprintln!("{err}");
            plan.problems.push(err);
            return;
        }
    };
    children.sort_by_key(|c| c.file_name());
    ancestors.push((meta.dev(), meta.ino()));
    for child in children {
        let path = child.path();
        let Some(child_name) = child.file_name().to_str().map(str::to_string) else {
            let err = XferError::Usage(format!(
                "{}: the name is not valid UTF-8; skipped",
                path.display()
            ));
            eprintln!("{err}");
            plan.problems.push(err);
            continue;
        };
        let rel = format!("{name}/{child_name}");
        let mut meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                let err = XferError::io(format!("cannot stat {}", path.display()), e);
                eprintln!("{err}");
                plan.problems.push(err);
                continue;
            }
        };
        if meta.file_type().is_symlink() {
            if !opts.follow_links {
                warn!(
                    "skipping symbolic link {} (use --follow-links to send what it points to)",
                    path.display()
                );
                plan.skipped += 1;
                continue;
            }
            meta = match std::fs::metadata(&path) {
                Ok(m) => m,
                Err(e) => {
                    let err =
                        XferError::io(format!("cannot follow symbolic link {}", path.display()), e);
                    eprintln!("{err}");
                    plan.problems.push(err);
                    continue;
                }
            };
        }
        if meta.is_dir() {
            if ancestors.contains(&(meta.dev(), meta.ino())) {
                warn!(
                    "skipping {}: a link back to a directory above it (a loop)",
                    path.display()
                );
                plan.skipped += 1;
                continue;
            }
            walk(&path, rel, &meta, opts, ancestors, plan);
        } else if meta.is_file() {
            plan.entries.push(Entry::File {
                path,
                name: rel,
                size: meta.len(),
                opened: None,
                mtime: (opts.preserve || opts.times)
                    .then(|| mtime_of(&meta))
                    .flatten(),
            });
        } else {
            warn!(
                "skipping {}: not a regular file, directory or symbolic link",
                path.display()
            );
            plan.skipped += 1;
        }
    }
    ancestors.pop();
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn opts(recursive: bool, follow: bool) -> WalkOptions {
        WalkOptions {
            recursive,
            follow_links: follow,
            preserve: false,
            times: false,
            stdin_name: "stdin".into(),
        }
    }

    fn names(plan: &Plan) -> Vec<String> {
        plan.entries
            .iter()
            .map(|e| match e {
                Entry::Dir { name, .. } => format!("{name}/"),
                other => other.name().to_string(),
            })
            .collect()
    }

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let root = t.path().join("top");
        std::fs::create_dir_all(root.join("b/empty")).unwrap();
        std::fs::create_dir_all(root.join("a")).unwrap();
        std::fs::write(root.join("z.txt"), b"z").unwrap();
        std::fs::write(root.join("a/one"), b"1").unwrap();
        std::fs::write(root.join("b/two with space"), b"").unwrap();
        symlink(root.join("a"), root.join("link-to-a")).unwrap();
        symlink(&root, root.join("b/loop")).unwrap();
        t
    }

    #[test]
    fn trees_are_walked_parents_first_in_name_order() {
        let t = tree();
        let plan = plan(&[t.path().join("top")], &opts(true, false)).unwrap();
        assert_eq!(
            names(&plan),
            [
                "top/",
                "top/a/",
                "top/a/one",
                "top/b/",
                "top/b/empty/",
                "top/b/two with space",
                "top/z.txt"
            ]
        );
        assert_eq!(plan.skipped, 2, "two links skipped");
        assert!(plan.problems.is_empty());
    }

    #[test]
    fn followed_links_are_walked_and_loops_refused() {
        let t = tree();
        let plan = plan(&[t.path().join("top")], &opts(true, true)).unwrap();
        let n = names(&plan);
        assert!(n.contains(&"top/link-to-a/".to_string()), "{n:?}");
        assert!(n.contains(&"top/link-to-a/one".to_string()), "{n:?}");
        assert!(!n.iter().any(|x| x.starts_with("top/b/loop")), "{n:?}");
        assert_eq!(plan.skipped, 1, "the loop");
    }

    #[test]
    fn command_line_rules() {
        let t = tree();
        let top = t.path().join("top");
        // A directory without -r: usage error with a hint.
        let err = plan(std::slice::from_ref(&top), &opts(false, false)).unwrap_err();
        assert_eq!(err.exit_code() as u8, 2);
        assert!(err.to_string().contains("use -r"), "{err}");
        // Standard input once, under its name; twice is an error.
        let p = plan(&["-".into()], &opts(false, false)).unwrap();
        assert!(matches!(&p.entries[..], [Entry::Stdin { name }] if name == "stdin"));
        assert!(plan(&["-".into(), "-".into()], &opts(false, false)).is_err());
        // Files keep their base name and are opened at once; missing ones fail.
        let p = plan(&[top.join("a/one")], &opts(false, false)).unwrap();
        assert!(
            matches!(&p.entries[..], [Entry::File { name, opened: Some(_), .. }] if name == "one")
        );
        let err = plan(&[top.join("missing")], &opts(true, false)).unwrap_err();
        assert_eq!(err.exit_code() as u8, 6);
        // A trailing slash and "." name the directory itself.
        let p = plan(
            &[PathBuf::from(format!("{}/", top.display()))],
            &opts(true, false),
        )
        .unwrap();
        assert_eq!(p.entries[0].name(), "top");
        assert_eq!(tree_root_name(&top.join("a/..")).unwrap(), "top");
        assert!(tree_root_name(Path::new("/")).is_err());
    }

    #[test]
    fn preserved_times_and_modes() {
        let t = tree();
        let top = t.path().join("top");
        std::fs::set_permissions(top.join("b"), std::fs::Permissions::from_mode(0o750)).unwrap();
        let mut o = opts(true, false);
        o.preserve = true;
        let p = plan(std::slice::from_ref(&top), &o).unwrap();
        for e in &p.entries {
            match e {
                Entry::Dir { name, mode, mtime } => {
                    assert!(mtime.is_some(), "{name}");
                    if name == "top/b" {
                        assert_eq!(*mode, 0o750);
                    }
                }
                Entry::File { mtime, name, .. } => assert!(mtime.is_some(), "{name}"),
                Entry::Stdin { .. } => unreachable!(),
            }
        }
        let p = plan(&[top], &opts(true, false)).unwrap();
        assert!(p.entries.iter().all(|e| match e {
            Entry::Dir { mtime, .. } | Entry::File { mtime, .. } => mtime.is_none(),
            Entry::Stdin { .. } => false,
        }));
    }
}
