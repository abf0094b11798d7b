//! One file that several lanes write at once, each chunk at its offset.
//! Buffered writes to one file take its inode's lock, so lanes writing
//! through the page cache wait for each other; O_DIRECT writes of whole
//! blocks from page-aligned memory do not (ext4, XFS: measured by `make
//! bench-native`). Where the page cache is the file (tmpfs) or the file
//! system refuses O_DIRECT, every write is buffered.

use crate::engine::per_byte::PageAligned;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// How a file's chunks are written (said with -v).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// O_DIRECT for whole pages from page-aligned memory, the rest
    /// buffered.
    Direct,
    Buffered,
}

impl WriteMode {
    pub fn as_str(self) -> &'static str {
        match self {
            WriteMode::Direct => "O_DIRECT",
            WriteMode::Buffered => "buffered",
        }
    }
}

/// A file written at offsets from several threads (`&self`).
pub struct ChunkFile {
    buffered: File,
    direct: Option<File>,
    /// Cleared when the file system refused a direct write after all:
    /// the rest goes buffered.
    direct_ok: AtomicBool,
}

impl ChunkFile {
    /// Writes to `file` (open for writing), directly where it can
    /// (`want_direct` and the file system takes O_DIRECT).
    pub fn new(file: &File, want_direct: bool) -> std::io::Result<ChunkFile> {
        let direct = match want_direct {
            true => crate::sys::os::open_direct(file)?,
            false => None,
        };
        Ok(ChunkFile {
            buffered: file.try_clone()?,
            direct_ok: AtomicBool::new(direct.is_some()),
            direct,
        })
    }

    pub fn mode(&self) -> WriteMode {
        match self.direct {
            Some(_) if self.direct_ok.load(Ordering::Relaxed) => WriteMode::Direct,
            _ => WriteMode::Buffered,
        }
    }

    /// Writes `data` at `offset`: its whole pages directly when `data`
    /// and `offset` start on a page boundary, the rest (a last chunk's
    /// tail, an unaligned chunk) through the page cache. The two parts
    /// never share a page.
    pub fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        const PAGE: usize = PageAligned::PAGE;
        let aligned =
            (data.as_ptr() as usize).is_multiple_of(PAGE) && offset.is_multiple_of(PAGE as u64);
        let pages = match (&self.direct, aligned) {
            (Some(_), true) if self.direct_ok.load(Ordering::Relaxed) => data.len() / PAGE * PAGE,
            _ => 0,
        };
        if let (Some(direct), true) = (&self.direct, pages > 0) {
            match direct.write_all_at(&data[..pages], offset) {
                Ok(()) => {
                    return match data[pages..].is_empty() {
                        true => Ok(()),
                        false => self
                            .buffered
                            .write_all_at(&data[pages..], offset + pages as u64),
                    };
                }
                // The file system wants more alignment than a page: this
                // write and the rest go buffered.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    self.direct_ok.store(false, Ordering::Relaxed);
                }
                Err(e) => return Err(e),
            }
        }
        self.buffered.write_all_at(data, offset)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
    }

    /// Chunks written out of order from two threads, the last one short
    /// and one from unaligned memory, read back as one file.
    fn written_by_two_lanes(dir: &std::path::Path, want_direct: bool) -> WriteMode {
        const CHUNK: usize = 64 << 10;
        let path = dir.join("lanes");
        let file = File::create(&path).unwrap();
        let chunks: Vec<Vec<u8>> = (0..6)
            .map(|k| pattern(if k == 5 { 1000 } else { CHUNK }, k as u8 + 3))
            .collect();
        let out = ChunkFile::new(&file, want_direct).unwrap();
        std::thread::scope(|s| {
            for lane in 0..2 {
                let (out, chunks) = (&out, &chunks);
                s.spawn(move || {
                    let mut buf = PageAligned::new(CHUNK + 1);
                    let mine: Vec<usize> = (lane..chunks.len()).step_by(2).collect();
                    for &k in mine.iter().rev() {
                        let data = &chunks[k];
                        // Chunk 2 from memory off a page boundary.
                        let at = usize::from(k == 2);
                        buf[at..at + data.len()].copy_from_slice(data);
                        out.write_at(&buf[at..at + data.len()], (k * CHUNK) as u64)
                            .unwrap();
                    }
                });
            }
        });
        let back = std::fs::read(&path).unwrap();
        assert!(
            back == chunks.concat(),
            "the file is not the chunks in order"
        );
        out.mode()
    }

    #[test]
    fn lanes_write_one_file_whole_directly_or_buffered() {
        // /var/tmp is on disk where /tmp may be tmpfs.
        let disk = tempfile::tempdir_in("/var/tmp").unwrap();
        let on_disk = written_by_two_lanes(disk.path(), true);
        // Buffered when not asked for, and on tmpfs.
        assert_eq!(
            written_by_two_lanes(disk.path(), false),
            WriteMode::Buffered
        );
        if std::path::Path::new("/dev/shm").is_dir() {
            let shm = tempfile::tempdir_in("/dev/shm").unwrap();
            assert_eq!(written_by_two_lanes(shm.path(), true), WriteMode::Buffered);
        }
        // What a file system that takes O_DIRECT gives: reported, not
        // assumed (an overlay may refuse it).
        eprintln!("on /var/tmp: {}", on_disk.as_str());
    }
}
