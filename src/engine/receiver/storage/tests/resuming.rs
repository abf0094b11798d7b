//! Files kept for --resume: verified chunks, records, the space they hold.

use super::*;

#[test]
fn a_resumable_file_keeps_its_verified_chunks_until_it_is_committed() {
    let root = tempfile::tempdir().unwrap();
    let mut s = store(root.path());
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 31) as u8).collect();
    let mut h = hello("f.bin", 1000);
    h.caps |= crate::proto::hello_flags::RESUME;
    let holds = |s: &FileStore| {
        s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
            .unwrap()
    };
    let (nothing, claim) = holds(&s);
    assert_eq!(nothing.found.kind(), crate::proto::HaveKind::Nothing);
    // While a session holds the name, another gets nothing to resume
    // (and no claim: it writes a plain temporary file).
    let (busy, none) = holds(&s);
    assert!(none.is_none() && busy.found.note().contains("another session"));
    // A first attempt writes 7 chunks, then fails: they are kept.
    let claim = claim.expect("a claim");
    let mut sink = s
        .create(&h, false, root.path(), Resume::Fresh(claim))
        .unwrap();
    write_chunks(&mut sink, &data[..700], 0, 100);
    drop(sink);
    let (kept, claim) = holds(&s);
    assert_eq!(kept.found.prefix_bytes(), 700);
    let prefix = kept.kept.expect("the verified prefix");
    assert_eq!(
        entries(root.path()).len(),
        3,
        "the partial, its record and the directory's key"
    );
    // The second continues it; committed, it is the file, nothing else.
    let mut sink = s
        .create(
            &h,
            false,
            root.path(),
            Resume::Continue(&prefix.sidecar, claim.unwrap()),
        )
        .unwrap();
    write_chunks(&mut sink, &data, 700, 100);
    sink.commit(&h.name, 0o640, h.mtime, false).unwrap();
    drop(sink);
    assert_eq!(entries(root.path()), [".rdma-xfer-key", "f.bin"]);
    assert_eq!(std::fs::read(root.path().join("f.bin")).unwrap(), data);
    // Now the receiver has it complete.
    assert_eq!(holds(&s).0.found.kind(), crate::proto::HaveKind::Complete);
    // Another file under that name (another time) is no copy: refused
    // at once without --overwrite, nothing said about it with it.
    let other = crate::proto::Hello {
        mtime: Some(crate::proto::Mtime { secs: 77, nanos: 0 }),
        ..h.clone()
    };
    let refused = s.holding(&other, (100, false), Duration::ZERO, &mut || {
        Err(std::io::Error::other("nothing may be read"))
    });
    assert!(matches!(
        refused,
        Err(Reject {
            code: RejectCode::Exists,
            ..
        })
    ));
    let (held, _) = s
        .holding(&other, (100, true), Duration::ZERO, &mut || Ok(()))
        .unwrap();
    assert!(
        matches!(&held.found, crate::proto::Found::Nothing(note) if note.is_empty()),
        "{:?}",
        held.found
    );
    // A failed whole-file check keeps nothing, even when resumable.
    let mut g = hello("g.bin", 1000);
    g.caps |= crate::proto::hello_flags::RESUME;
    let claim = s
        .holding(&g, (100, false), Duration::ZERO, &mut || Ok(()))
        .unwrap()
        .1
        .unwrap();
    let mut sink = s
        .create(&g, false, root.path(), Resume::Fresh(claim))
        .unwrap();
    write_chunks(&mut sink, &data, 0, 100);
    let Sink::Temp(t) = &mut sink else { panic!() };
    t.discard();
    drop(sink);
    assert_eq!(entries(root.path()), [".rdma-xfer-key", "f.bin"]);
}

#[test]
fn a_partial_file_is_continued_and_committed_by_descriptor_never_by_name() {
    let root = tempfile::tempdir().unwrap();
    let mut s = store(root.path());
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
    let mut h = hello("f.bin", 1000);
    h.caps |= crate::proto::hello_flags::RESUME;
    let holds = |s: &FileStore| {
        s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
            .unwrap()
    };
    let claim = holds(&s).1.unwrap();
    let mut sink = s
        .create(&h, false, root.path(), Resume::Fresh(claim))
        .unwrap();
    write_chunks(&mut sink, &data[..500], 0, 100);
    drop(sink);
    let (kept, claim) = holds(&s);
    let prefix = kept.kept.expect("the verified prefix");
    // Checked, then swapped: another file takes the partial's name.
    let (partial, _) = partial::partial_names("f.bin");
    let p = root.path().join(&partial);
    std::fs::rename(&p, root.path().join("moved")).unwrap();
    std::fs::write(&p, b"someone else's").unwrap();
    let mut sink = s
        .create(
            &h,
            false,
            root.path(),
            Resume::Continue(&prefix.sidecar, claim.unwrap()),
        )
        .unwrap();
    // The checked file is continued, the newcomer left alone...
    assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
    write_chunks(&mut sink, &data, 500, 100);
    // ...and never renamed into place.
    let err = sink.commit(&h.name, 0o640, h.mtime, false).unwrap_err();
    assert!(err.to_string().contains("replaced meanwhile"), "{err}");
    drop(sink);
    assert!(!root.path().join("f.bin").exists());
    assert_eq!(std::fs::read(&p).unwrap(), b"someone else's");
    assert_eq!(std::fs::read(root.path().join("moved")).unwrap(), data);
}

#[test]
fn a_kept_partial_file_that_is_not_the_receivers_own_is_never_written() {
    use std::os::unix::fs::MetadataExt;
    let root = tempfile::tempdir().unwrap();
    // Files of the receiver's user elsewhere, that a planted name
    // would lead to.
    let home = tempfile::tempdir().unwrap();
    let mut s = store(root.path());
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 11) as u8).collect();
    let mut h = hello("f.bin", 1000);
    h.caps |= crate::proto::hello_flags::RESUME;
    let (partial, meta) = partial::partial_names("f.bin");
    let at = |n: &str| root.path().join(n);
    let holds = |s: &FileStore| {
        s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
            .unwrap()
    };
    // A genuine attempt that kept 500 bytes and their records.
    let keep_500 = |s: &mut FileStore| {
        for n in [&partial, &meta, &"f.bin".to_string()] {
            let _ = std::fs::remove_file(at(n));
        }
        let claim = holds(s).1.unwrap();
        let mut sink = s
            .create(&h, false, root.path(), Resume::Fresh(claim))
            .unwrap();
        write_chunks(&mut sink, &data[..500], 0, 100);
        drop(sink);
        assert_eq!(holds(s).0.found.prefix_bytes(), 500, "kept and resumable");
    };
    // `name` replaced by a hard link to a file of the same bytes in
    // `home`: the victim.
    let plant_link = |name: &str| {
        let victim = home.path().join(name);
        let _ = std::fs::remove_file(&victim);
        std::fs::copy(at(name), &victim).unwrap();
        std::fs::remove_file(at(name)).unwrap();
        std::fs::hard_link(&victim, at(name)).unwrap();
        victim
    };
    let plant_symlink = |name: &str| {
        let victim = home.path().join(name);
        let _ = std::fs::remove_file(&victim);
        std::fs::rename(at(name), &victim).unwrap();
        std::os::unix::fs::symlink(&victim, at(name)).unwrap();
        victim
    };
    let as_root = rustix::process::geteuid().is_root();
    /// A way to plant a file; returns the file planted at.
    type Plant<'a> = Box<dyn Fn() -> std::path::PathBuf + 'a>;
    let mut cases: Vec<(&str, Plant)> = vec![
        (
            "a hard link as the partial",
            Box::new(|| plant_link(&partial)),
        ),
        ("a hard link as the record", Box::new(|| plant_link(&meta))),
        (
            "a symbolic link as the partial",
            Box::new(|| plant_symlink(&partial)),
        ),
        (
            "a symbolic link as the record",
            Box::new(|| plant_symlink(&meta)),
        ),
    ];
    if as_root {
        cases.push((
            "a partial of another owner",
            Box::new(|| {
                std::os::unix::fs::chown(at(&partial), Some(65534), Some(65534)).unwrap();
                at(&partial)
            }),
        ));
    } else {
        eprintln!(
            "not root: the case of a partial file of another owner is skipped (chown needs root)"
        );
    }
    for (case, plant) in &cases {
        keep_500(&mut s);
        let planted = plant();
        let before = std::fs::read(&planted).unwrap();
        let inode = std::fs::metadata(&planted).unwrap().ino();
        // Not resumed, and why (no uid or path told to the sender).
        let (held, claim) = holds(&s);
        assert!(held.kept.is_none(), "{case}: resumed");
        assert_eq!(held.found.kind(), crate::proto::HaveKind::Nothing, "{case}");
        assert_eq!(
            held.found.note(),
            "the kept partial file is not the receiver's own: not resumed",
            "{case}"
        );
        // Received from zero under a temporary name, committed.
        let mut sink = s
            .create(&h, false, root.path(), Resume::Fresh(claim.unwrap()))
            .unwrap();
        let Sink::Temp(t) = &sink else { panic!() };
        assert!(t.temp.ends_with(".part"), "{case}: {}", t.temp);
        write_chunks(&mut sink, &data, 0, 100);
        sink.commit(&h.name, 0o640, h.mtime, false).unwrap();
        drop(sink);
        assert_eq!(std::fs::read(at("f.bin")).unwrap(), data, "{case}");
        // The planted file: never truncated, written, nor replaced.
        assert_eq!(std::fs::read(&planted).unwrap(), before, "{case}");
        assert_eq!(std::fs::metadata(&planted).unwrap().ino(), inode, "{case}");
        assert_ne!(
            std::fs::metadata(at("f.bin")).unwrap().ino(),
            inode,
            "{case}"
        );
    }
}

#[test]
fn a_record_written_without_the_directorys_key_is_as_good_as_none() {
    let root = tempfile::tempdir().unwrap();
    let mut s = store(root.path());
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    let mut h = hello("f.bin", 1000);
    h.caps |= crate::proto::hello_flags::RESUME;
    let holds = |s: &FileStore| {
        s.holding(&h, (100, false), Duration::ZERO, &mut || Ok(()))
            .unwrap()
    };
    // The directory has its key (an earlier resumable file made it).
    let claim = holds(&s).1.unwrap();
    let mut sink = s
        .create(&h, false, root.path(), Resume::Fresh(claim))
        .unwrap();
    write_chunks(&mut sink, &data[..300], 0, 100);
    drop(sink);
    assert_eq!(holds(&s).0.found.prefix_bytes(), 300);
    // Someone who can write the directory but not read the key puts a
    // partial file of their choice there, with a record of its chunks
    // as the unkeyed format had it (CRC32 checks anyone can compute).
    let (partial, meta) = partial::partial_names("f.bin");
    let chosen = vec![0x5au8; 500];
    std::fs::write(root.path().join(&partial), &chosen).unwrap();
    let forge = |magic: &[u8; 8]| {
        let mut b = magic.to_vec();
        b.extend_from_slice(&5u16.to_be_bytes());
        b.extend_from_slice(&1000u64.to_be_bytes());
        b.extend_from_slice(&1_000_000_000i64.to_be_bytes());
        b.extend_from_slice(&5u32.to_be_bytes());
        b.push(h.digest as u8);
        b.extend_from_slice(&100u32.to_be_bytes());
        b.extend_from_slice(b"f.bin");
        let check = crc32fast::hash(&b);
        b.extend_from_slice(&check.to_be_bytes());
        for (i, c) in chosen.chunks(100).enumerate() {
            let crc = crc32fast::hash(c);
            let mut check = crc32fast::Hasher::new();
            check.update(&(i as u64).to_be_bytes());
            check.update(&crc.to_be_bytes());
            b.extend_from_slice(&crc.to_be_bytes());
            b.extend_from_slice(&check.finalize().to_be_bytes());
        }
        std::fs::write(root.path().join(&meta), b).unwrap();
    };
    for (magic, note) in [
        (b"RXFRPT1\n", "older, unkeyed format"),
        (b"RXFRPT2\n", "does not check with this directory's key"),
    ] {
        forge(magic);
        let (held, claim) = holds(&s);
        assert!(held.kept.is_none(), "{note}: resumed");
        assert_eq!(held.found.kind(), crate::proto::HaveKind::Nothing);
        assert!(held.found.note().contains(note), "{:?}", held.found.note());
        // Received from zero: the chosen bytes are not kept.
        let mut sink = s
            .create(&h, true, root.path(), Resume::Fresh(claim.unwrap()))
            .unwrap();
        write_chunks(&mut sink, &data, 0, 100);
        sink.commit(&h.name, 0o640, h.mtime, true).unwrap();
        drop(sink);
        assert_eq!(std::fs::read(root.path().join("f.bin")).unwrap(), data);
        std::fs::remove_file(root.path().join("f.bin")).unwrap();
        std::fs::write(root.path().join(&partial), &chosen).unwrap();
    }
}

#[test]
fn after_a_failed_write_no_record_is_kept_past_the_last_sync() {
    let root = tempfile::tempdir().unwrap();
    let mut s = store(root.path());
    let data: Vec<u8> = (0..1000u32).map(|i| (i * 13) as u8).collect();
    let mut h = hello("f.bin", 1000);
    h.caps |= crate::proto::hello_flags::RESUME;
    let claim = s
        .holding(&h, (10, false), Duration::ZERO, &mut || Ok(()))
        .unwrap()
        .1
        .unwrap();
    let mut sink = s
        .create(&h, false, root.path(), Resume::Fresh(claim))
        .unwrap();
    // One sync's worth of chunks, and a few more written but unsynced.
    let n = partial::SYNC_EVERY + 5;
    write_chunks(&mut sink, &data[..n * 10], 0, 10);
    let Sink::Temp(t) = &mut sink else { panic!() };
    // Then a write fails (a descriptor that cannot write).
    t.file = File::open("/dev/null").unwrap();
    let c = &data[n * 10..n * 10 + 10];
    assert!(
        t.write_chunk(c, (n * 10) as u64, crc32fast::hash(c))
            .is_err()
    );
    drop(sink);
    // Kept: only what the last good sync recorded.
    let (_, meta) = partial::partial_names("f.bin");
    let key = SidecarKey::load(&DirFd::open(root.path()).unwrap());
    let side = partial::Sidecar::decode(
        &std::fs::read(root.path().join(meta)).unwrap(),
        &key.unwrap().unwrap(),
    );
    let side = side.unwrap();
    assert_eq!(side.crcs.len(), partial::SYNC_EVERY);
}

#[test]
fn a_kept_partial_file_holds_the_space_of_its_prefix_only() {
    use std::os::unix::fs::MetadataExt;
    const CHUNK: usize = 64 << 10;
    let size: u64 = 16 << 20;
    let root = tempfile::tempdir().unwrap();
    let mut s = store(root.path());
    let data: Vec<u8> = (0..5 * CHUNK).map(|i| (i % 251) as u8).collect();
    let mut h = hello("f.bin", size);
    h.caps |= crate::proto::hello_flags::RESUME;
    let allocated = |f: &File| f.metadata().unwrap().blocks() * 512;
    let holds = |s: &FileStore| {
        s.holding(&h, (CHUNK as u32, false), Duration::ZERO, &mut || Ok(()))
            .unwrap()
    };
    let temp = |sink: &mut Sink| -> File {
        let Sink::Temp(t) = sink else { panic!() };
        t.file.try_clone().unwrap()
    };
    let claim = holds(&s).1.unwrap();
    let mut sink = s
        .create(&h, false, root.path(), Resume::Fresh(claim))
        .unwrap();
    // Only where fallocate reserved the whole file is there anything
    // to give back (tmpfs is left alone: see `reserve_blocks`).
    let reserved = allocated(&temp(&mut sink)) >= size;
    if !reserved {
        eprintln!("no space reserved on this file system: only lengths are checked");
    }
    write_chunks(&mut sink, &data[..3 * CHUNK], 0, CHUNK);
    // Bytes past the last checked chunk have no record: not kept.
    let f = temp(&mut sink);
    f.write_all_at(&data[3 * CHUNK..4 * CHUNK], 3 * CHUNK as u64)
        .unwrap();
    drop(sink);
    assert_eq!(f.metadata().unwrap().len(), 3 * CHUNK as u64);
    if reserved {
        let a = allocated(&f);
        assert!(a <= 4 * CHUNK as u64, "{a} bytes allocated");
    }
    // Continued: the rest is reserved again, and given back when it
    // fails again.
    let (kept, claim) = holds(&s);
    let prefix = kept.kept.expect("the verified prefix");
    let mut sink = s
        .create(
            &h,
            false,
            root.path(),
            Resume::Continue(&prefix.sidecar, claim.unwrap()),
        )
        .unwrap();
    let f = temp(&mut sink);
    if reserved {
        assert!(allocated(&f) >= size);
    }
    write_chunks(&mut sink, &data[..4 * CHUNK], 3 * CHUNK, CHUNK);
    drop(sink);
    assert_eq!(f.metadata().unwrap().len(), 4 * CHUNK as u64);
    if reserved {
        let a = allocated(&f);
        assert!(a <= 5 * CHUNK as u64, "{a} bytes allocated");
    }
    // Nothing kept: the space goes, even while a descriptor of it is
    // open somewhere.
    for resumable in [true, false] {
        let mut g = hello("g.bin", size);
        let resume = if resumable {
            g.caps |= crate::proto::hello_flags::RESUME;
            Resume::Fresh(
                s.holding(&g, (100, false), Duration::ZERO, &mut || Ok(()))
                    .unwrap()
                    .1
                    .unwrap(),
            )
        } else {
            Resume::No
        };
        let mut sink = s.create(&g, false, root.path(), resume).unwrap();
        write_chunks(&mut sink, &data[..2 * CHUNK], 0, CHUNK);
        let f = temp(&mut sink);
        let Sink::Temp(t) = &mut sink else { panic!() };
        t.discard();
        drop(sink);
        assert_eq!(allocated(&f), 0, "resumable: {resumable}");
    }
    let (partial, meta) = partial::partial_names("f.bin");
    let mut want = vec![partial, meta, partial::KEY_NAME.to_string()];
    want.sort();
    assert_eq!(entries(root.path()), want);
}
