//! What the sender sends, decided before it connects: the command line's
//! files, standard input (`-`) and, with `-r`, directory trees walked into
//! a list of directories (parents first) and files with relative paths;
//! with `-R` (and `--files-from`) under the paths as given, their
//! directories first; `--exclude`/`--include` applied on the way.

use super::filter::Filter;
use crate::error::{Problems, XferError};
use crate::proto::Mtime;
use std::collections::{HashMap, HashSet};
use std::fs::{File, Metadata};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use tracing::{debug, warn};

/// Name standard input arrives under unless `--name` says otherwise.
pub const DEFAULT_STDIN_NAME: &str = "stdin";

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
    /// Carry modification times even without `preserve` (the sender
    /// always does: a re-run and `--resume` find files by them; the
    /// receiver applies them).
    pub times: bool,
    /// `--name`: the relative path the one source (a regular file or
    /// standard input) arrives under; without it a file keeps its base
    /// name and standard input arrives as `stdin`.
    pub name: Option<String>,
    /// `--exclude`/`--include`: entries left out (an excluded directory
    /// is not walked).
    pub filter: Filter,
    /// `-R`: arguments arrive under their path as given (from after a
    /// `/./` in it, else without a leading `/`), their directories sent
    /// first, instead of under their base name.
    pub relative: bool,
    /// The arguments are `--files-from`'s list: a directory without `-r`
    /// is sent as itself (not a usage error), and files are opened when
    /// their turn comes (a list may name more files than a process may
    /// open).
    pub listed: bool,
}

impl WalkOptions {
    /// The name standard input arrives under.
    pub fn stdin_name(&self) -> &str {
        self.name.as_deref().unwrap_or(DEFAULT_STDIN_NAME)
    }
}

/// The mode offered for the directories a `--name` names above its file
/// (no directory here stands for them): the receiver's umask applies
/// unless it keeps modes, and then they are not open to all.
const NAMED_DIR_MODE: u32 = 0o755;

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
    /// What a relay hop passes on: the offer it took, made again for the
    /// next host, its bytes read from the part of the file the hop kept
    /// from an earlier transfer (`kept`: its first bytes, in the hop's own
    /// copy), then from `pipe` (the hop's receiver writes the rest into it
    /// as it checks them) until its end. Without
    /// a pipe, `kept` is the whole file (the hop's committed copy). The
    /// pipe's end is the file's only once `whole` is set: the hop's own
    /// checks of it passed.
    /// One piece of a file sent over lanes (`sender --lanes`): its offer
    /// (with the piece), the open file, and the piece's first byte in it.
    Piece {
        offer: crate::proto::FileOffer,
        file: File,
        start: u64,
    },
    Relayed {
        offer: crate::proto::FileOffer,
        kept: Option<(File, u64)>,
        pipe: Option<File>,
        whole: std::sync::Arc<std::sync::atomic::AtomicBool>,
        /// Set once the pipe is read (the hop waits for it).
        flowing: std::sync::Arc<std::sync::atomic::AtomicBool>,
    },
}

impl Entry {
    pub fn name(&self) -> &str {
        match self {
            Entry::File { name, .. } | Entry::Dir { name, .. } | Entry::Stdin { name } => name,
            Entry::Relayed { offer, .. } | Entry::Piece { offer, .. } => &offer.name,
        }
    }

    /// Bytes to send, as far as known (0 for directories and streams).
    pub fn size(&self) -> u64 {
        match self {
            Entry::File { size, .. } => *size,
            Entry::Relayed { offer, .. } | Entry::Piece { offer, .. } => offer.size,
            Entry::Dir { .. } | Entry::Stdin { .. } => 0,
        }
    }
}

/// The entries to send, and problems met on the way (an unreadable
/// directory inside a tree, a name that is not UTF-8): those were reported
/// and are skipped, and the sender's exit status will say so.
#[derive(Debug, Default)]
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
///
/// The directories a `--name` names above its file go before it. With
/// `-R`, an argument's directories go before it, once; an argument
/// below a directory the filter excludes is left out with them, as a walk
/// from the top would leave it. An entry that two arguments bring (a file
/// also inside a tree) goes once, in its first place.
pub fn plan(paths: &[PathBuf], opts: &WalkOptions) -> Result<Plan, XferError> {
    let mut plan = Plan {
        entries: Vec::new(),
        problems: Vec::new(),
        skipped: 0,
    };
    for Checked { parents, arg } in arguments(paths, opts)? {
        // Standard input is no path: no rule applies to it.
        let selected = match &arg {
            Argument::Ready(Entry::Stdin { .. }) => true,
            Argument::Ready(e) => {
                admitted(opts, &parents, e.name(), matches!(e, Entry::Dir { .. }))
            }
            Argument::Tree(_, name, _) => admitted(opts, &parents, name, true),
        };
        if !selected {
            continue;
        }
        plan.entries.extend(parents);
        match arg {
            Argument::Ready(entry) => plan.entries.push(entry),
            Argument::Tree(path, name, meta) => {
                walk(path, name, &meta, opts, &mut Vec::new(), &mut plan);
            }
        }
    }
    if opts.relative {
        let mut seen = HashSet::new();
        plan.entries.retain(|e| seen.insert(e.name().to_string()));
    }
    Ok(plan)
}

/// Whether the filter lets the argument arriving as `name` through, and
/// every directory above it (`-R`), as a walk from the top would.
fn admitted(opts: &WalkOptions, parents: &[Entry], name: &str, is_dir: bool) -> bool {
    let ok = parents.iter().all(|p| opts.filter.admits(p.name(), true))
        && opts.filter.admits(name, is_dir);
    if !ok {
        debug!("{name}: excluded");
    }
    ok
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

/// An argument and, with `-R`, the directories its kept path names above
/// it (outermost first).
struct Checked<'a> {
    parents: Vec<Entry>,
    arg: Argument<'a>,
}

/// Checks every argument, in order; all problems at once.
fn arguments<'a>(paths: &'a [PathBuf], opts: &WalkOptions) -> Result<Vec<Checked<'a>>, XferError> {
    let mut problems = Problems::default();
    // Names the arguments arrive under, with the argument that claimed
    // each (a map: a --files-from list may name a million).
    let mut arriving: HashMap<String, String> = HashMap::new();
    let mut claim = |name: &str, arg: String, problems: &mut Problems| match arriving.get(name) {
        Some(first) if *first == arg => problems.add(format!("{arg} is named twice")),
        Some(first) => problems.add(format!(
            "{first} and {arg} would both arrive as {name}: send one of them under \
                 another name (rename it, or send its directory with -r)"
        )),
        None => {
            arriving.insert(name.to_string(), arg);
        }
    };
    let mut stdin_seen = false;
    let mut args = Vec::new();
    // With several sources --name is refused, and the others' problems
    // are said as without it.
    let one_name = opts.name.as_deref().filter(|_| paths.len() == 1);
    if opts.name.is_some() && paths.len() != 1 {
        problems.add(format!(
            "--name gives the one file or standard input sent its path on the receiver: \
             {} sources given (send the others with a command of their own)",
            paths.len()
        ));
    }
    for path in paths {
        if path.as_os_str() == "-" {
            if stdin_seen {
                problems.add("standard input (-) can be sent only once");
                continue;
            }
            stdin_seen = true;
            let name = one_name.unwrap_or(DEFAULT_STDIN_NAME);
            claim(name, "standard input".into(), &mut problems);
            args.push(Checked {
                parents: Vec::new(),
                arg: Argument::Ready(Entry::Stdin {
                    name: name.to_string(),
                }),
            });
            continue;
        }
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) => {
                problems.add(format!("cannot open {}: {e}", path.display()));
                continue;
            }
        };
        // With -R: the path kept and the directories it names.
        let kept = match opts.relative.then(|| kept_path(path)) {
            None => None,
            Some(Ok(kept)) => Some(kept),
            Some(Err(e)) => {
                problems.add(e);
                continue;
            }
        };
        let mut parents = Vec::new();
        for (name, source) in kept.iter().flat_map(|k| &k.parents) {
            match std::fs::metadata(source) {
                Ok(m) => parents.push(dir_entry(name.clone(), &m, opts)),
                Err(e) => problems.add(format!("cannot open {}: {e}", source.display())),
            }
        }
        if meta.is_dir() && one_name.is_some() {
            problems.add(format!(
                "{} is a directory: --name names one regular file or standard input (a tree \
                 arrives under its own name)",
                path.display()
            ));
            continue;
        }
        if meta.is_dir() {
            if !opts.recursive && !opts.listed {
                problems.add(format!(
                    "{} is a directory (use -r to send directory trees)",
                    path.display()
                ));
                continue;
            }
            let name = match kept {
                Some(k) => Ok(k.name),
                None => tree_root_name(path),
            };
            let name = match name {
                Ok(name) => name,
                Err(e) => {
                    problems.add(e.to_string());
                    continue;
                }
            };
            claim(&name, path.display().to_string(), &mut problems);
            let arg = if opts.recursive {
                Argument::Tree(path, name, meta)
            } else {
                Argument::Ready(dir_entry(name, &meta, opts))
            };
            args.push(Checked { parents, arg });
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
        if let Some(name) = one_name {
            parents = named_parents(name);
        }
        let name = match (one_name, kept) {
            (Some(name), _) => name.to_string(),
            (None, Some(k)) => k.name,
            (None, None) => match path.file_name().and_then(|n| n.to_str()) {
                Some(n) => n.to_string(),
                None => {
                    problems.add(format!("{} has no valid UTF-8 file name", path.display()));
                    continue;
                }
            },
        };
        claim(&name, path.display().to_string(), &mut problems);
        args.push(Checked {
            parents,
            arg: Argument::Ready(Entry::File {
                path: path.clone(),
                name,
                size: meta.len(),
                opened: (!opts.listed).then_some(file),
                mtime: (opts.preserve || opts.times)
                    .then(|| mtime_of(&meta))
                    .flatten(),
            }),
        });
    }
    problems.into_result().map(|()| args)
}

/// A path as `-R` keeps it.
#[derive(Debug, PartialEq)]
struct Kept {
    /// What it arrives under.
    name: String,
    /// The directories above it, outermost first: the name each arrives
    /// under and where it is here.
    parents: Vec<(String, PathBuf)>,
}

/// The path `-R` keeps: as given, from after its last `/./` (rsync's
/// anchor) if it has one, without a leading `/`, `.` components or empty
/// ones; `..` in the kept part is refused (it could not arrive anywhere
/// inside the receiver's directory).
fn kept_path(path: &Path) -> Result<Kept, String> {
    let Some(text) = path.to_str() else {
        return Err(format!(
            "{}: the path is not valid UTF-8 (-R sends it as given)",
            path.display()
        ));
    };
    let (root, kept) = match text.rfind("/./") {
        Some(i) => (&text[..=i], &text[i + 3..]),
        None if text.starts_with('/') => ("/", text),
        None => ("", text),
    };
    let parts: Vec<&str> = kept
        .split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .collect();
    if parts.contains(&"..") {
        return Err(format!(
            "{text}: -R keeps the path as given, and `..` cannot arrive anywhere; mark where \
             the kept part starts with /./ (`../data/./sub/file` arrives as sub/file)"
        ));
    }
    let Some((_, above)) = parts.split_last() else {
        return Err(format!(
            "{text}: -R keeps the path as given, and nothing is left to arrive under; name \
             what is inside it"
        ));
    };
    let parents = (1..=above.len())
        .map(|n| {
            let name = parts[..n].join("/");
            let here = Path::new(root).join(&name);
            (name, here)
        })
        .collect();
    Ok(Kept {
        name: parts.join("/"),
        parents,
    })
}

/// The directories `--name` names above its file (`a`, `a/b` for
/// `a/b/f`), outermost first, offered before it so that the receiver
/// makes them.
fn named_parents(name: &str) -> Vec<Entry> {
    let parts: Vec<&str> = name.split('/').collect();
    (1..parts.len())
        .map(|n| Entry::Dir {
            name: parts[..n].join("/"),
            mode: NAMED_DIR_MODE,
            mtime: None,
        })
        .collect()
}

/// A directory's entry: its name, mode and time (`times`, which the
/// sender always sets).
fn dir_entry(name: String, meta: &Metadata, opts: &WalkOptions) -> Entry {
    Entry::Dir {
        name,
        mode: meta.permissions().mode() & 0o7777,
        mtime: (opts.preserve || opts.times)
            .then(|| mtime_of(meta))
            .flatten(),
    }
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
    plan.entries.push(dir_entry(name.clone(), meta, opts));
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
        let link = meta.file_type().is_symlink();
        if link && opts.follow_links {
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
        // Before any warning: what is excluded is not there at all. An
        // excluded directory is not walked, so nothing below it can be
        // included again (as rsync's).
        if !opts.filter.admits(&rel, meta.is_dir()) {
            debug!("{rel}: excluded");
            continue;
        }
        if link && !opts.follow_links {
            warn!(
                "skipping symbolic link {} (use --follow-links to send what it points to)",
                path.display()
            );
            plan.skipped += 1;
            continue;
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
    use crate::engine::filter::Rule;
    use std::os::unix::fs::symlink;

    fn opts(recursive: bool, follow: bool) -> WalkOptions {
        WalkOptions {
            recursive,
            follow_links: follow,
            ..WalkOptions::default()
        }
    }

    fn filtered(rules: &[Rule]) -> WalkOptions {
        WalkOptions {
            filter: Filter::new(rules).unwrap(),
            ..opts(true, false)
        }
    }

    /// `root/./rel`: what -R keeps is `rel`, wherever the test's root is.
    fn anchored(root: &Path, rel: &str) -> PathBuf {
        PathBuf::from(format!("{}/./{rel}", root.display()))
    }

    /// A tree with files to leave out: `top/{keep.tmp, drop.tmp, a.txt,
    /// cache/{keep.tmp, c.bin}, sub/{x.tmp, cache (a file), deep/cache/y}}`.
    fn selection_tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let top = t.path().join("top");
        std::fs::create_dir_all(top.join("cache")).unwrap();
        std::fs::create_dir_all(top.join("sub/deep/cache")).unwrap();
        for f in [
            "keep.tmp",
            "drop.tmp",
            "a.txt",
            "cache/keep.tmp",
            "cache/c.bin",
            "sub/x.tmp",
            "sub/cache",
            "sub/deep/cache/y",
        ] {
            std::fs::write(top.join(f), f).unwrap();
        }
        t
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
                Entry::Stdin { .. } | Entry::Relayed { .. } | Entry::Piece { .. } => unreachable!(),
            }
        }
        let p = plan(&[top], &opts(true, false)).unwrap();
        assert!(p.entries.iter().all(|e| match e {
            Entry::Dir { mtime, .. } | Entry::File { mtime, .. } => mtime.is_none(),
            Entry::Stdin { .. } | Entry::Relayed { .. } | Entry::Piece { .. } => false,
        }));
    }

    #[test]
    fn first_matching_rule_decides_and_excluded_directories_are_not_walked() {
        let t = selection_tree();
        let top = t.path().join("top");
        // rsync's order: the include before the exclusion it escapes.
        let rules = [
            Rule::include("keep.tmp"),
            Rule::exclude("*.tmp"),
            Rule::exclude("cache/"),
        ];
        let p = plan(std::slice::from_ref(&top), &filtered(&rules)).unwrap();
        assert_eq!(
            names(&p),
            [
                "top/",
                "top/a.txt",
                "top/keep.tmp",
                "top/sub/",
                "top/sub/cache",
                "top/sub/deep/",
            ],
            "cache/ is a directory pattern: the file sub/cache stays; \
             cache/keep.tmp is below an excluded directory"
        );
        assert_eq!(p.skipped, 0, "excluded is not skipped");
        // The other order: the exclusion wins for keep.tmp too.
        let rules = [Rule::exclude("*.tmp"), Rule::include("keep.tmp")];
        let n = names(&plan(std::slice::from_ref(&top), &filtered(&rules)).unwrap());
        assert!(!n.iter().any(|x| x.ends_with(".tmp")), "{n:?}");
        assert!(n.contains(&"top/cache/c.bin".to_string()), "{n:?}");
        // An include cannot reach below an excluded directory.
        let rules = [Rule::include("/top/cache/c.bin"), Rule::exclude("cache/")];
        let n = names(&plan(std::slice::from_ref(&top), &filtered(&rules)).unwrap());
        assert!(!n.iter().any(|x| x.contains("cache/")), "{n:?}");
    }

    #[test]
    fn anchored_patterns_match_from_the_arriving_path() {
        let t = selection_tree();
        let top = t.path().join("top");
        let rules = [Rule::exclude("/top/cache"), Rule::exclude("/top/sub/**/y")];
        let n = names(&plan(std::slice::from_ref(&top), &filtered(&rules)).unwrap());
        assert!(!n.iter().any(|x| x.starts_with("top/cache")), "{n:?}");
        assert!(n.contains(&"top/sub/cache".to_string()), "{n:?}");
        assert!(n.contains(&"top/sub/deep/cache/".to_string()), "{n:?}");
        assert!(!n.contains(&"top/sub/deep/cache/y".to_string()), "{n:?}");
        // The tree named on the command line is matched too.
        let p = plan(
            &[top.clone(), top.join("a.txt")],
            &filtered(&[Rule::exclude("/top/"), Rule::exclude("*.txt")]),
        )
        .unwrap();
        assert!(p.entries.is_empty(), "{:?}", names(&p));
        // Standard input has no path: no rule leaves it out.
        let p = plan(&["-".into()], &filtered(&[Rule::exclude("*")])).unwrap();
        assert_eq!(names(&p), ["stdin"]);
    }

    #[test]
    fn kept_paths() {
        let k = kept_path(Path::new("a/b/c.txt")).unwrap();
        assert_eq!(k.name, "a/b/c.txt");
        assert_eq!(
            k.parents,
            [
                ("a".to_string(), PathBuf::from("a")),
                ("a/b".to_string(), PathBuf::from("a/b"))
            ]
        );
        // Absolute: found from /, arriving without it.
        let k = kept_path(Path::new("/data/./x//f")).unwrap();
        assert_eq!(k.name, "x/f");
        assert_eq!(k.parents, [("x".to_string(), PathBuf::from("/data/x"))]);
        let k = kept_path(Path::new("/data/x/f")).unwrap();
        assert_eq!(k.name, "data/x/f");
        assert_eq!(
            k.parents[1],
            ("data/x".to_string(), PathBuf::from("/data/x"))
        );
        // The anchor: what follows it is kept; `..` before it is fine.
        let k = kept_path(Path::new("../src/./sub/f")).unwrap();
        assert_eq!(k.name, "sub/f");
        assert_eq!(
            k.parents,
            [("sub".to_string(), PathBuf::from("../src/sub"))]
        );
        let k = kept_path(Path::new("./one")).unwrap();
        assert_eq!((k.name.as_str(), k.parents.len()), ("one", 0));
        for bad in ["a/../b", "../x", ".", "/", "d/./", "d/./.."] {
            assert!(kept_path(Path::new(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn relative_paths_arrive_as_given_with_their_directories_first() {
        let t = selection_tree();
        let root = t.path();
        let mut o = opts(false, false);
        o.relative = true;
        o.preserve = true;
        let p = plan(
            &[
                anchored(root, "top/sub/deep/cache/y"),
                anchored(root, "top/sub/x.tmp"),
                anchored(root, "top/a.txt"),
            ],
            &o,
        )
        .unwrap();
        assert_eq!(
            names(&p),
            [
                "top/",
                "top/sub/",
                "top/sub/deep/",
                "top/sub/deep/cache/",
                "top/sub/deep/cache/y",
                "top/sub/x.tmp",
                "top/a.txt",
            ],
            "each directory once, before what is in it"
        );
        assert!(p.entries.iter().all(|e| match e {
            Entry::Dir { mtime, .. } => mtime.is_some(),
            Entry::File { opened, .. } => opened.is_some(),
            Entry::Stdin { .. } | Entry::Relayed { .. } | Entry::Piece { .. } => false,
        }));
        // With -r: a tree under its kept path; a file also in it goes once.
        o.recursive = true;
        let p = plan(
            &[anchored(root, "top/sub"), anchored(root, "top/sub/x.tmp")],
            &o,
        )
        .unwrap();
        let n = names(&p);
        assert_eq!(n[..2], ["top/", "top/sub/"]);
        assert_eq!(
            n.iter().filter(|x| *x == "top/sub/x.tmp").count(),
            1,
            "{n:?}"
        );
        // A directory without -r is still a usage error; `..` too.
        o.recursive = false;
        let err = plan(&[anchored(root, "top/sub")], &o).unwrap_err();
        assert!(err.to_string().contains("use -r"), "{err}");
        let err = plan(&[anchored(root, "top/sub/../a.txt")], &o).unwrap_err();
        assert_eq!(err.exit_code() as u8, 2);
        assert!(err.to_string().contains("`..`"), "{err}");
        // An argument below an excluded directory is left out, its
        // directories with it.
        o.filter = Filter::new(&[Rule::exclude("deep/")]).unwrap();
        let p = plan(
            &[
                anchored(root, "top/sub/deep/cache/y"),
                anchored(root, "top/a.txt"),
            ],
            &o,
        )
        .unwrap();
        assert_eq!(names(&p), ["top/", "top/a.txt"]);
    }

    #[test]
    fn listed_paths_send_directories_alone_and_open_files_late() {
        let t = selection_tree();
        let top = t.path().join("top");
        let o = WalkOptions {
            relative: true,
            listed: true,
            ..opts(false, false)
        };
        let p = plan(&[anchored(&top, "sub"), anchored(&top, "cache/c.bin")], &o).unwrap();
        assert_eq!(names(&p), ["sub/", "cache/", "cache/c.bin"]);
        assert!(
            p.entries
                .iter()
                .all(|e| matches!(e, Entry::Dir { .. } | Entry::File { opened: None, .. }))
        );
        // With -r, a listed directory is a tree.
        let o = WalkOptions {
            recursive: true,
            ..o
        };
        let n = names(&plan(&[anchored(&top, "sub/deep")], &o).unwrap());
        assert_eq!(
            n,
            ["sub/", "sub/deep/", "sub/deep/cache/", "sub/deep/cache/y"]
        );
        // A missing listed file is a usage error, as on the command line.
        let err = plan(&[anchored(&top, "nope")], &o).unwrap_err();
        assert_eq!(err.exit_code() as u8, 2);
    }

    #[test]
    fn a_name_gives_the_one_source_its_path() {
        let t = tree();
        let one = t.path().join("top/a/one");
        let named = |name: &str| WalkOptions {
            name: Some(name.into()),
            ..opts(false, false)
        };
        // A file: its directories first, made by the receiver.
        let p = plan(std::slice::from_ref(&one), &named("x/y/new.pt")).unwrap();
        assert_eq!(names(&p), ["x/", "x/y/", "x/y/new.pt"]);
        assert!(matches!(
            &p.entries[..],
            [
                Entry::Dir {
                    mode: NAMED_DIR_MODE,
                    mtime: None,
                    ..
                },
                _,
                Entry::File {
                    opened: Some(_),
                    ..
                }
            ]
        ));
        let p = plan(std::slice::from_ref(&one), &named("new.pt")).unwrap();
        assert_eq!(names(&p), ["new.pt"]);
        // Standard input: under the name as it is.
        let p = plan(&["-".into()], &named("s.tar")).unwrap();
        assert_eq!(names(&p), ["s.tar"]);
        // Not several sources, not a tree (with -r or without).
        let err = plan(&[one.clone(), "-".into()], &named("n")).unwrap_err();
        assert_eq!(err.exit_code() as u8, 2);
        assert!(err.to_string().contains("2 sources given"), "{err}");
        let mut o = named("n");
        o.recursive = true;
        let err = plan(&[t.path().join("top")], &o).unwrap_err();
        assert!(
            err.to_string().contains("--name names one regular file"),
            "{err}"
        );
    }
}
