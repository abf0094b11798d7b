//! One file that several lanes write at once, each chunk at its offset.
//! Buffered writes to one file take its inode's lock, so lanes writing
//! through the page cache wait for each other; O_DIRECT writes of whole
//! blocks into a file already at its full size (overwrites, which ext4
//! and XFS take under a shared lock) need not. Where the page cache is
//! the file (tmpfs) or the file system refuses O_DIRECT, every write is
//! buffered. Measured by `make bench-native` (docs/performance.md).

use crate::sys::os::{DirectAlign, open_direct};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// How a file's chunks are written (said with -v).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteMode {
    /// O_DIRECT for whole aligned blocks, the rest buffered.
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
    direct: Option<(File, DirectAlign)>,
    /// Cleared when the file system refused a direct write after all:
    /// the rest goes buffered.
    direct_ok: AtomicBool,
}

impl ChunkFile {
    /// Starts writing back the `len` bytes at `offset` (not waiting for
    /// them), so that the fsync at the file's commit has less left to do
    /// (pieces verified on the way, the file committed once whole).
    /// Advice only: its failure changes nothing.
    pub fn start_writeback(&self, offset: u64, len: u64) {
        if let Some(len) = std::num::NonZeroU64::new(len) {
            let advice = rustix::fs::Advice::DontNeed;
            let _ = rustix::fs::fadvise(&self.buffered, offset, Some(len), advice);
        }
    }

    /// Writes to `file` (open for writing), made `size` bytes long first
    /// (so that writes are overwrites), directly where it can
    /// (`want_direct` and the file system takes O_DIRECT).
    pub fn new(file: &File, size: u64, want_direct: bool) -> std::io::Result<ChunkFile> {
        file.set_len(size)?;
        let direct = want_direct.then(|| open_direct(file)).flatten();
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

    /// Writes `data` at `offset`: its whole blocks directly when `data`
    /// and `offset` are aligned as the file system wants, the rest (a last
    /// chunk's tail, an unaligned chunk) through the page cache. The two
    /// parts never share a block.
    pub fn write_at(&self, data: &[u8], offset: u64) -> std::io::Result<()> {
        let whole = match &self.direct {
            Some((_, align))
                if self.direct_ok.load(Ordering::Relaxed)
                    && (data.as_ptr() as usize).is_multiple_of(align.memory)
                    && offset.is_multiple_of(align.offset) =>
            {
                // At most data.len(): fits a usize.
                (data.len() as u64 / align.offset * align.offset) as usize
            }
            _ => 0,
        };
        if let (Some((direct, _)), true) = (&self.direct, whole > 0) {
            match direct.write_all_at(&data[..whole], offset) {
                Ok(()) => {
                    let tail = &data[whole..];
                    return match tail.is_empty() {
                        true => Ok(()),
                        false => self.buffered.write_all_at(tail, offset + whole as u64),
                    };
                }
                // The file system wants another alignment after all: this
                // write (whatever part of it landed: the same bytes go
                // again) and the rest go buffered.
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
    use crate::engine::per_byte::PageAligned;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect()
    }

    /// Chunks of `chunk` bytes written out of order from two threads, the
    /// last one `last` bytes, one from memory off a page boundary, read
    /// back as one file.
    fn written_by_two_lanes(
        dir: &std::path::Path,
        chunk: usize,
        last: usize,
        want_direct: bool,
    ) -> WriteMode {
        let path = dir.join("lanes");
        let file = File::create(&path).unwrap();
        let chunks: Vec<Vec<u8>> = (0..6)
            .map(|k| pattern(if k == 5 { last } else { chunk }, k as u8 + 3))
            .collect();
        let size = (5 * chunk + last) as u64;
        let out = ChunkFile::new(&file, size, want_direct).unwrap();
        std::thread::scope(|s| {
            for lane in 0..2 {
                let (out, chunks) = (&out, &chunks);
                s.spawn(move || {
                    let mut buf = PageAligned::new(chunk + 1);
                    let mine: Vec<usize> = (lane..chunks.len()).step_by(2).collect();
                    for &k in mine.iter().rev() {
                        let data = &chunks[k];
                        // Chunk 2 from memory off a page boundary.
                        let at = usize::from(k == 2);
                        buf[at..at + data.len()].copy_from_slice(data);
                        out.write_at(&buf[at..at + data.len()], (k * chunk) as u64)
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

    /// A directory more likely on disk than in memory.
    fn on_disk() -> std::path::PathBuf {
        match std::path::Path::new("/var/tmp") {
            p if p.is_dir() => p.into(),
            _ => std::env::temp_dir(),
        }
    }

    #[test]
    fn lanes_write_one_file_whole_directly_or_buffered() {
        const KIB: usize = 1024;
        let disk = tempfile::tempdir_in(on_disk()).unwrap();
        let fs_magic = rustix::fs::statfs(disk.path()).unwrap().f_type as u64;
        const EXT4: u64 = 0xef53;
        const XFS: u64 = 0x5846_5342;
        // Whole blocks and a tail in the last chunk; chunks that are not
        // whole pages (the rest of each goes buffered).
        for (chunk, last) in [(128 * KIB, 64 * KIB + 1000), (6000, 5000), (12 * KIB, 100)] {
            let mode = written_by_two_lanes(disk.path(), chunk, last, true);
            if [EXT4, XFS].contains(&fs_magic) {
                assert_eq!(mode, WriteMode::Direct, "chunks of {chunk}");
            }
            let plain = written_by_two_lanes(disk.path(), chunk, last, false);
            assert_eq!(plain, WriteMode::Buffered);
        }
        // tmpfs: buffered whatever is asked.
        if std::path::Path::new("/dev/shm").is_dir() {
            let shm = tempfile::tempdir_in("/dev/shm").unwrap();
            let mode = written_by_two_lanes(shm.path(), 64 * KIB, 1000, true);
            assert_eq!(mode, WriteMode::Buffered);
        }
    }

    #[test]
    fn a_file_open_only_for_reading_is_never_written_directly() {
        let dir = tempfile::tempdir_in(on_disk()).unwrap();
        let path = dir.path().join("ro");
        std::fs::write(&path, [0u8; 8192]).unwrap();
        let read_only = File::open(&path).unwrap();
        assert!(open_direct(&read_only).is_none());
    }
}
