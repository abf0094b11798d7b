//! What the sender sends, decided before it connects: the command line's
//! files, standard input (`-`) and, with `-r`, directory trees walked into
//! a list of directories (parents first) and files with relative paths.

use crate::error::{Problems, XferError};
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

/// Turns the command line into entries. Before any connection, every
/// argument is checked and all problems are reported together (exit 2): a
/// missing or unreadable argument, a directory without `-r`, standard
/// input named twice, something that is not a file at all (a FIFO, a
/// device), a name that is not UTF-8, or two arguments that would arrive
/// under the same name.
pub fn plan(paths: &[PathBuf], opts: &WalkOptions) -> Result<Plan, XferError> {
    let mut plan = Plan {
        entries: Vec::new(),
        problems: Vec::new(),
        skipped: 0,
    };
    for arg in arguments(paths, opts)? {
        match arg {
            Argument::Ready(entry) => plan.entries.push(entry),
            Argument::Tree(path, name, meta) => {
                walk(path, name, &meta, opts, &mut Vec::new(), &mut plan);
            }
        }
    }
    Ok(plan)
}

/// The command line's checks of [`plan`], without walking any tree.
pub fn check_arguments(paths: &[PathBuf], opts: &WalkOptions) -> Result<(), XferError> {
    arguments(paths, opts).map(|_| ())
}

/// A command-line argument, checked: an entry ready to go, or a tree to
/// walk once every argument is known to be fine.
enum Argument<'a> {
    Ready(Entry),
    Tree(&'a Path, String, Metadata),
}

/// Checks every argument, in order; all problems at once.
fn arguments<'a>(paths: &'a [PathBuf], opts: &WalkOptions) -> Result<Vec<Argument<'a>>, XferError> {
    let mut problems = Problems::default();
    // Names the arguments arrive under, with the argument that claimed each.
    let mut arriving: Vec<(String, String)> = Vec::new();
    let mut claim = |name: &str, arg: String, problems: &mut Problems| match arriving
        .iter()
        .find(|(n, _)| n == name)
    {
        Some((_, first)) if *first == arg => problems.add(format!("{arg} is named twice")),
        Some((_, first)) => problems.add(format!(
            "{first} and {arg} would both arrive as {name}: send one of them under \
                 another name (rename it, or send its directory with -r)"
        )),
        None => arriving.push((name.to_string(), arg)),
    };
    let mut stdin_seen = false;
    let mut args = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            if stdin_seen {
                problems.add("standard input (-) can be sent only once");
                continue;
            }
            stdin_seen = true;
            claim(&opts.stdin_name, "standard input".into(), &mut problems);
            args.push(Argument::Ready(Entry::Stdin {
                name: opts.stdin_name.clone(),
            }));
            continue;
        }
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) => {
                problems.add(format!("cannot open {}: {e}", path.display()));
                continue;
            }
        };
        if meta.is_dir() {
            if !opts.recursive {
                problems.add(format!(
                    "{} is a directory (use -r to send directory trees)",
                    path.display()
                ));
                continue;
            }
            match tree_root_name(path) {
                Ok(name) => {
                    claim(&name, path.display().to_string(), &mut problems);
                    args.push(Argument::Tree(path, name, meta));
                }
                Err(e) => problems.add(e.to_string()),
            }
            continue;
        }
        if !meta.is_file() {
            problems.add(format!(
                "{} is not a regular file{}",
                path.display(),
                special_kind(&meta)
            ));
            continue;
        }
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => {
                problems.add(format!("cannot open {}: {e}", path.display()));
                continue;
            }
        };
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            problems.add(format!("{} has no valid UTF-8 file name", path.display()));
            continue;
        };
        claim(name, path.display().to_string(), &mut problems);
        args.push(Argument::Ready(Entry::File {
            path: path.clone(),
            name: name.to_string(),
            size: meta.len(),
            opened: Some(file),
            mtime: (opts.preserve || opts.times)
                .then(|| mtime_of(&meta))
                .flatten(),
        }));
    }
    problems.into_result().map(|()| args)
}

/// What a special file is, for the message that refuses it.
fn special_kind(meta: &Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_fifo() {
        " (a FIFO: to send what is written into it, use `sender ADDR - < FIFO`)"
    } else if t.is_socket() {
        " (a socket)"
    } else if t.is_block_device() || t.is_char_device() {
        " (a device: to send its contents, use `sender ADDR - < DEVICE --name NAME`)"
    } else {
        ""
    }
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
            tracing::error!("{err}");
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
            tracing::error!("{err}");
            plan.problems.push(err);
            continue;
        };
        let rel = format!("{name}/{child_name}");
        let mut meta = match std::fs::symlink_metadata(&path) {
            Ok(m) => m,
            Err(e) => {
                let err = XferError::io(format!("cannot stat {}", path.display()), e);
                tracing::error!("{err}");
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
                    tracing::error!("{err}");
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
        // A missing file is a usage error too (exit 2), found before
        // connecting; so is a FIFO, and every problem is reported.
        let err = plan(&[top.join("missing")], &opts(true, false)).unwrap_err();
        assert_eq!(err.exit_code() as u8, 2);
        let fifo = t.path().join("fifo");
        assert!(
            std::process::Command::new("mkfifo")
                .arg(&fifo)
                .status()
                .unwrap()
                .success()
        );
        let err = plan(
            &[
                fifo,
                top.join("missing"),
                top.clone(),
                "-".into(),
                "-".into(),
            ],
            &opts(false, false),
        )
        .unwrap_err();
        let XferError::Problems(all) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(all.len(), 4, "{all:#?}");
        assert!(all[0].contains("a FIFO"), "{all:#?}");
        // Two arguments arriving under one name: a file and a tree.
        let other = t.path().join("other");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("top"), b"x").unwrap();
        let err = plan(&[top.clone(), other.join("top")], &opts(true, false)).unwrap_err();
        assert!(
            err.to_string().contains("would both arrive as top"),
            "{err}"
        );
        // Trees keep their command-line place among files.
        let p = plan(
            &[top.join("a/one"), top.join("b"), "-".into()],
            &opts(true, false),
        )
        .unwrap();
        assert_eq!(p.entries.first().unwrap().name(), "one");
        assert_eq!(p.entries[1].name(), "b");
        assert_eq!(p.entries.last().unwrap().name(), "stdin");
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
