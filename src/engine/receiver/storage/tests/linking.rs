//! --link-dest: which files are candidates, how a link or copy is made.

use super::*;

#[test]
fn link_dest_candidates_are_regular_files_of_the_size_reached_without_links() {
    let (root, earlier, outside) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let mut cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), root.path().into());
    cfg.link_dest = Some(earlier.path().into());
    let mut s = FileStore::open(&cfg, &Arc::default()).unwrap();
    let e = earlier.path();
    std::fs::create_dir(e.join("d")).unwrap();
    std::fs::write(e.join("d/f"), b"abc").unwrap();
    std::fs::write(outside.path().join("f"), b"abc").unwrap();
    std::os::unix::fs::symlink(outside.path(), e.join("via")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("f"), e.join("leaf")).unwrap();
    std::fs::create_dir(root.path().join("d")).unwrap();
    std::fs::create_dir(root.path().join("via")).unwrap();
    assert!(s.link_candidate(&hello("d/f", 3), false).is_some());
    assert!(s.link_candidate(&hello("d/f", 4), false).is_none(), "size");
    assert!(
        s.link_candidate(&hello("via/f", 3), false).is_none(),
        "link on the way"
    );
    assert!(
        s.link_candidate(&hello("leaf", 3), false).is_none(),
        "link as the leaf"
    );
    assert!(
        s.link_candidate(&hello("d", 3), false).is_none(),
        "a directory"
    );
    // Same mode and time (none offered): a hard link.
    let mut h = hello("d/f", 3);
    h.mtime = None;
    let mode = h.received_mode(cfg.umask, false);
    std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(mode)).unwrap();
    let c = s.link_candidate(&h, false).unwrap();
    let sha = partial::copy_digest(&c.file, 3, 1 << 20, &mut || Ok(())).unwrap();
    let how = (false, 1 << 20, root.path());
    let linked = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
    assert!(matches!(linked, Linked::HardLink));
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    assert_eq!(ino(&root.path().join("d/f")), ino(&e.join("d/f")));
    // The final name is taken now: no candidate without --overwrite;
    // with it, the link already there stays, and no temporary name.
    assert!(s.link_candidate(&h, false).is_none());
    let c = s.link_candidate(&h, true).unwrap();
    let again = s.link_into_place(&h, &c, sha, (true, 1 << 20, root.path()), &mut || Ok(()));
    assert!(matches!(again, Ok(Linked::HardLink)));
    assert_eq!(entries(&root.path().join("d")), ["f"]);
    // Another mode offered: still a link (with the file's own mode).
    std::fs::remove_file(root.path().join("d/f")).unwrap();
    std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    let c = s.link_candidate(&h, false).unwrap();
    let linked = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
    assert!(matches!(linked, Linked::HardLink));
    std::fs::remove_file(root.path().join("d/f")).unwrap();
    // A file others may write is never linked: copied, with the
    // receiver's umask (022 here) on its mode.
    std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(0o666)).unwrap();
    let c = s.link_candidate(&h, false).unwrap();
    let copied = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
    assert!(matches!(copied, Linked::Copy(_)), "{copied:?}");
    let placed = root.path().join("d/f");
    assert_ne!(ino(&placed), ino(&e.join("d/f")));
    assert_eq!(
        std::fs::metadata(&placed).unwrap().permissions().mode() & 0o777,
        0o666 & !cfg.umask
    );
    std::fs::remove_file(&placed).unwrap();
    std::fs::set_permissions(e.join("d/f"), std::fs::Permissions::from_mode(0o600)).unwrap();
    // Another modification time offered: a copy, checked, with the
    // offer's time.
    let h = hello("d/f", 3);
    let c = s.link_candidate(&h, false).unwrap();
    let copied = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
    assert!(matches!(copied, Linked::Copy(_)));
    let placed = root.path().join("d/f");
    assert_ne!(ino(&placed), ino(&e.join("d/f")));
    assert_eq!(std::fs::read(&placed).unwrap(), b"abc");
    let placed_mtime = std::fs::metadata(&placed).unwrap().modified().unwrap();
    assert_eq!(Some(placed_mtime), system_time(h.mtime.unwrap()));
    // A digest that is not the file's: refused, nothing left behind.
    std::fs::remove_file(&placed).unwrap();
    let c = s.link_candidate(&h, false).unwrap();
    assert!(
        s.link_into_place(&h, &c, [0; 32], how, &mut || Ok(()))
            .is_err()
    );
    assert_eq!(entries(&root.path().join("d")), Vec::<String>::new());
}

/// A store with --link-dest `earlier` writing into `root`, and the
/// file `name` in `earlier` holding `bytes` with `mode`.
fn link_dest_store(root: &Path, earlier: &Path, name: &str, bytes: &[u8], mode: u32) -> FileStore {
    let mut cfg = ReceiverConfig::new("127.0.0.1:0".parse().unwrap(), root.into());
    cfg.link_dest = Some(earlier.into());
    std::fs::write(earlier.join(name), bytes).unwrap();
    std::fs::set_permissions(earlier.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
    FileStore::open(&cfg, &Arc::default()).unwrap()
}

#[test]
fn a_link_dest_copy_keeps_the_files_own_mode_never_the_offers() {
    let (root, earlier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut s = link_dest_store(root.path(), earlier.path(), "f", b"secret", 0o600);
    // The sender asks for a mode open to all, and another time (so
    // that a copy is made, with the offer's time).
    let mut h = hello("f", 6);
    h.mode = 0o666;
    let c = s.link_candidate(&h, false).unwrap();
    let sha = partial::copy_digest(&c.file, 6, 1 << 20, &mut || Ok(())).unwrap();
    let how = (false, 1 << 20, root.path());
    let placed = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
    assert!(matches!(placed, Linked::Copy(_)));
    let mode = std::fs::metadata(root.path().join("f"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600, "{mode:o}");
    // A linked one shares the file's mode anyway.
    std::fs::remove_file(root.path().join("f")).unwrap();
    h.mtime = None;
    let c = s.link_candidate(&h, false).unwrap();
    let placed = s.link_into_place(&h, &c, sha, how, &mut || Ok(())).unwrap();
    assert!(matches!(placed, Linked::HardLink));
    let mode = std::fs::metadata(root.path().join("f"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o600, "{mode:o}");
}

#[test]
fn a_link_dest_file_changed_with_its_time_set_back_is_never_linked() {
    let (root, earlier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The offer's mode (0640 under the umask 022): linked, were it not
    // for the change.
    let mut s = link_dest_store(root.path(), earlier.path(), "f", b"hashed", 0o640);
    let mut h = hello("f", 6);
    h.mtime = None;
    let c = s.link_candidate(&h, false).unwrap();
    let sha = partial::copy_digest(&c.file, 6, 1 << 20, &mut || Ok(())).unwrap();
    // Hashed, then rewritten in place: same size, the old time set
    // back. Only the inode's change time tells.
    let path = earlier.path().join("f");
    let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
    std::thread::sleep(Duration::from_millis(20));
    std::fs::write(&path, b"other!").unwrap();
    let f = File::options().write(true).open(&path).unwrap();
    f.set_modified(mtime).unwrap();
    let how = (false, 1 << 20, root.path());
    let placed = s.link_into_place(&h, &c, sha, how, &mut || Ok(()));
    let why = placed.expect_err("linked a changed file");
    assert!(matches!(why, LinkError::Link(_)), "{why}");
    assert!(why.to_string().contains("changed meanwhile"), "{why}");
    assert_eq!(entries(root.path()), Vec::<String>::new());
}

#[test]
fn only_a_link_across_file_systems_becomes_a_copy() {
    let e = |n| std::io::Error::from_raw_os_error(n);
    assert!(copy_instead_of_link(&e(libc::EXDEV)).is_some());
    for refused in [libc::EPERM, libc::EMLINK, libc::EACCES] {
        assert_eq!(copy_instead_of_link(&e(refused)), None, "{refused}");
    }
    // A real EPERM: an immutable file (root, and a file system with
    // the flag, needed).
    let (root, earlier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut s = link_dest_store(root.path(), earlier.path(), "f", b"fixed", 0o644);
    let path = earlier.path().join("f");
    let chattr = |flag: &str| {
        std::process::Command::new("chattr")
            .arg(flag)
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !chattr("+i") {
        eprintln!(
            "chattr +i failed (not root, or no such flag here): the real EPERM case is skipped"
        );
        return;
    }
    let mut h = hello("f", 5);
    h.mtime = None;
    let placed = s.link_candidate(&h, false).map(|c| {
        let sha = partial::copy_digest(&c.file, 5, 1 << 20, &mut || Ok(())).unwrap();
        s.link_into_place(&h, &c, sha, (false, 1 << 20, root.path()), &mut || Ok(()))
    });
    assert!(chattr("-i"), "chattr -i {}", path.display());
    let why = placed.expect("a candidate").expect_err("copied instead");
    assert!(matches!(why, LinkError::Link(_)), "{why}");
    assert!(why.to_string().contains("cannot link it"), "{why}");
    assert_eq!(entries(root.path()), Vec::<String>::new());
}

/// A `tick` that stops the work (as a session that ended does) at its
/// `n`th call, the first being 1.
fn stopping_at(n: usize) -> impl FnMut() -> std::io::Result<()> {
    let mut calls = 0;
    move || {
        calls += 1;
        if calls == n {
            return Err(std::io::Error::new(
                std::io::ErrorKind::Interrupted,
                "interrupted",
            ));
        }
        Ok(())
    }
}

#[test]
fn a_link_or_copy_stopped_after_the_digest_puts_nothing_in_place() {
    let (root, earlier) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut s = link_dest_store(root.path(), earlier.path(), "f", b"hashed", 0o600);
    let how = (false, 1 << 20, root.path());
    // No time offered: a link; the offer's own: a copy.
    let mut linked = hello("f", 6);
    linked.mtime = None;
    for h in [linked, hello("f", 6)] {
        let c = s.link_candidate(&h, false).unwrap();
        let sha = partial::copy_digest(&c.file, 6, 1 << 20, &mut || Ok(())).unwrap();
        // A link looks before it links and before its rename; a copy
        // before its one read and, the copy's digest matched, before its
        // commit. Stopped at either, nothing is left.
        for n in [1, 2] {
            let c = s.link_candidate(&h, false).unwrap();
            let placed = s.link_into_place(&h, &c, sha, how, &mut stopping_at(n));
            let why = placed.expect_err("put in place though stopped");
            assert!(matches!(why, LinkError::Stopped(_)), "{n}: {why}");
            assert_eq!(entries(root.path()), Vec::<String>::new(), "{n}");
        }
        // Not stopped: in place (a new candidate: the link above changed
        // the file's inode change time).
        let c = s.link_candidate(&h, false).unwrap();
        let placed = s.link_into_place(&h, &c, sha, how, &mut stopping_at(3));
        let want_link = h.mtime.is_none();
        assert!(
            matches!(placed, Ok(Linked::HardLink)) == want_link
                && matches!(placed, Ok(Linked::Copy(_))) != want_link,
            "{placed:?}"
        );
        assert_eq!(std::fs::read(root.path().join("f")).unwrap(), b"hashed");
        std::fs::remove_file(root.path().join("f")).unwrap();
    }
}
