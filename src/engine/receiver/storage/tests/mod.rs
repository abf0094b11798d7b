//! Unit tests of the storage subsystem, with a temporary directory.

use super::link_dest::{LinkError, Linked, copy_instead_of_link};
use super::*;
use crate::engine::digest::FileHasher;
use std::os::unix::fs::FileExt;

mod linking;
mod resuming;

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
    assert_eq!(err("a/link/x").code, RejectCode::Exists);
    assert!(
        err("a/link/x").reason.contains("symbolic link"),
        "{:?}",
        err("a/link/x")
    );
    assert_eq!(err("a/file/x").code, RejectCode::Exists);
    assert_eq!(err("a/missing/x").code, RejectCode::Io);
    assert!(
        err("a/missing/x")
            .reason
            .contains("a/missing does not exist")
    );
    assert!(open_path(&r, "a/b").is_ok());
    assert!(open_path(&r, "a/link").is_err());
}

pub(super) fn hello(name: &str, size: u64) -> Hello {
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
        piece: None,
    }
}

pub(super) fn store(dir: &Path) -> FileStore {
    let cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), dir.into());
    FileStore::open(&cfg, &Arc::default()).unwrap()
}

fn write(sink: &mut Sink, bytes: &[u8]) {
    let Sink::Temp(t) = sink else {
        panic!("a tree store writes temporary files")
    };
    std::io::Write::write_all(&mut t.file, bytes).unwrap();
}

/// The names in `dir`, sorted (temporary files included).
pub(in crate::engine::receiver) fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
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
        let Reject { code, reason: why } = check_exec_path(&r, refused).unwrap_err();
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
    assert_eq!(held.found.kind(), crate::proto::HaveKind::Nothing);
    assert!(held.found.note().is_empty() && claim.is_none());
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
fn existing_entries_are_refused_or_replaced_as_configured() {
    let root = tempfile::tempdir().unwrap();
    std::fs::write(root.path().join("old"), b"old").unwrap();
    std::fs::create_dir(root.path().join("d")).unwrap();
    let mut s = store(root.path());
    let mut refusal = |name: &str, size: u64, overwrite: bool| {
        s.create(&hello(name, size), overwrite, root.path(), Resume::No)
            .map(|_| ())
            .unwrap_err()
            .code
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
        s.make_dir(&hello("link", 0)).unwrap_err().code,
        RejectCode::Exists
    );
    assert_eq!(
        s.make_dir(&hello("link/x", 0)).unwrap_err().code,
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
