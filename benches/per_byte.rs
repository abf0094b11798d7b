//! `make bench-native`: the CPU cost of each side's per-byte work on this
//! host at native speed, no RDMA needed. The sender's path is
//! `per_byte::fill_chunk` (file in page cache -> staging slot, CRC32,
//! whole-file digest), the receiver's `per_byte::receive_chunk` (ring slot
//! -> private copy with its CRC32 in one pass -> CRC32 check -> pwrite into
//! the page cache, digest): the functions the tools call, with page-aligned
//! heap memory standing in for the registered slots (registration does not
//! change the CPU cost). With `tagged=yes` each chunk is authenticated too,
//! as with a token (`per_byte::tag_chunk` on the sender, the tag check in
//! `receive_chunk`: keyed BLAKE3 over the chunk). memcpy, the ring copy
//! (alone, then its CRC32 in a second pass, and both in one), CRC32,
//! SHA-256, the chunk tag, pread and pwrite alone are printed beside them.
//! Lanes: one file by 1 and 2 threads a side, each with its own slots,
//! the receiver's writing at offsets through `ChunkFile` (buffered, and
//! O_DIRECT on the ext4 that RXFER_BENCH_EXT4_DIR names). Figures are GB/s
//! (10^9 bytes/s), the median of several timed repetitions after a
//! warm-up; the bench fails (exit 1) if a path produced wrong bytes or
//! checksums, never because of its speed. RXFER_BENCH_ONLY=TEXT measures
//! only the steps whose name contains TEXT.

use rdma_xfer::engine::per_byte::{
    PageAligned, TagCheck, copy_and_crc, fill_chunk, receive_chunk, tag_chunk,
};
use rdma_xfer::engine::receiver::storage::chunk_file::{ChunkFile, WriteMode};
use rdma_xfer::engine::receiver::storage::write_behind::WriteBehind;
use rdma_xfer::engine::{
    DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, DEFAULT_SLOTS, FileHasher, crc32_of_chunks,
};
use rdma_xfer::proto::{CHUNK_TAG_LEN, ChunkAuth, ChunkKey, Digest, DigestAlg};
use rdma_xfer::sys::rdma::ring_copy;
use sha2::{Digest as _, Sha256};
use std::fs::File;
use std::hint::black_box;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

/// Bytes each thread moves in one repetition: the size of its input and
/// output files.
const FILE_BYTES: usize = 256 << 20;
const WARMUPS: usize = 1;
const REPS: usize = 5;
/// The default chunk size first: the summary is computed from it.
const CHUNK_SIZES: [usize; 2] = [DEFAULT_CHUNK_SIZE as usize, 4 << 20];
/// Staging slots (sender) and ring slots (receiver): the larger of the
/// tools' defaults, so that buffers cycle through as much memory as in a
/// transfer (caches matter).
const SLOTS: usize = if DEFAULT_SLOTS > DEFAULT_DEPTH {
    DEFAULT_SLOTS as usize
} else {
    DEFAULT_DEPTH as usize
};
const LINE_RATES_GBIT: [u32; 3] = [100, 200, 400];
/// Where the input and output files go unless RXFER_BENCH_DIR says.
const DEFAULT_DIR: &str = "/dev/shm";

type Outcome<T> = Result<T, String>;

/// What one repetition does, `FILE_BYTES` per thread in chunks.
#[derive(Clone, Copy, PartialEq)]
enum Step {
    /// Slot -> one chunk buffer, `copy_from_slice`.
    Memcpy,
    /// The same with the receiver's copy out of the ring (atomic loads).
    RingCopy,
    /// The ring copy of a whole chunk, then its CRC32: two passes over the
    /// bytes.
    CopyThenCrc,
    /// The receiver's copy with the CRC32 in one pass
    /// (`per_byte::copy_and_crc`, 64 KiB blocks).
    CopyCrcOnePass,
    Crc32,
    Sha256,
    /// A chunk's tag (keyed BLAKE3), as the sender computes it with a token.
    Tag,
    /// Input file (page cache) -> slots.
    Pread,
    /// Slots -> a new output file (page cache), as the receiver writes.
    Pwrite,
    /// Slots -> the same output file again (its pages already there).
    PwriteOverwrite,
    /// The sender's path; `true`: each chunk tagged too (a token).
    SenderPath(DigestAlg, bool),
    /// The receiver's path; `true`: each chunk's tag checked too.
    ReceiverPath(DigestAlg, bool),
    /// The receiver's path with writer threads (`receiver --threads N`,
    /// `engine::receiver::storage::write_behind`): this thread copies and checks,
    /// N threads write. Its CPU time is the whole process's.
    ReceiverThreads(DigestAlg, usize),
    /// The sender's path (CRC32) on one file by N lanes: lane i reads the
    /// chunks k with k % N == i into its own slots, on its own thread; the
    /// whole-file CRC32 combined from the chunks' afterwards.
    SenderLanes(usize),
    /// The receiver's path (CRC32) on one file by N lanes, each with its
    /// own ring slots, private copy and thread, writing its chunks at
    /// their offsets into the one file (`ChunkFile`, written as the mode
    /// says: O_DIRECT is asked for, and must be what the file gets).
    ReceiverLanes(usize, WriteMode),
}

impl Step {
    fn name(self) -> String {
        let digest = |alg| match alg {
            DigestAlg::Crc32 => "crc32",
            DigestAlg::Sha256 => "sha256",
        };
        match self {
            Step::Memcpy => "memcpy".into(),
            Step::RingCopy => "ring_copy".into(),
            Step::CopyThenCrc => "ring_copy_then_crc32 passes=2".into(),
            Step::CopyCrcOnePass => "ring_copy_crc32 passes=1".into(),
            Step::Crc32 => "crc32fast".into(),
            Step::Sha256 => "sha256".into(),
            Step::Tag => "chunk_tag".into(),
            Step::Pread => "pread".into(),
            Step::Pwrite => "pwrite".into(),
            Step::PwriteOverwrite => "pwrite_overwrite".into(),
            Step::SenderPath(alg, tagged) => {
                format!("sender_path digest={} tagged={}", digest(alg), yes(tagged))
            }
            Step::ReceiverPath(alg, tagged) => {
                format!(
                    "receiver_path digest={} tagged={}",
                    digest(alg),
                    yes(tagged)
                )
            }
            Step::ReceiverThreads(alg, n) => {
                format!("receiver_path digest={} writers={n}", digest(alg))
            }
            Step::SenderLanes(n) => format!("sender_path digest=crc32 lanes={n}"),
            Step::ReceiverLanes(n, mode) => {
                format!(
                    "receiver_path digest=crc32 lanes={n} write={}",
                    mode.as_str()
                )
            }
        }
    }
}

fn yes(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

/// The key of the tagged paths (any key costs the same).
fn bench_auth() -> ChunkAuth {
    ChunkAuth {
        key: ChunkKey::from_bytes([0x42; 32]),
        offer: 1,
    }
}

/// One thread's files: the input (in the page cache) with its digests,
/// and the output the receiver path and pwrite write anew each time.
struct Lane {
    input: File,
    output: File,
    input_crc32: u32,
    input_sha256: [u8; 32],
}

impl Lane {
    fn new(dir: &Path, seed: u64) -> Outcome<Lane> {
        let mut input =
            tempfile::tempfile_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let output = tempfile::tempfile_in(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        // Pseudo-random bytes (xorshift64): nothing compresses or repeats.
        let mut state = seed | 1;
        let mut block = vec![0u8; 1 << 20];
        for _ in 0..FILE_BYTES / block.len() {
            for word in block.chunks_exact_mut(8) {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                word.copy_from_slice(&state.to_le_bytes());
            }
            input
                .write_all(&block)
                .map_err(|e| format!("writing the input: {e}"))?;
        }
        // Read back once: the digests to check against, and the file is
        // in the page cache from here on.
        let mut crc = crc32fast::Hasher::new();
        let mut sha = Sha256::new();
        for at in (0..FILE_BYTES).step_by(block.len()) {
            input
                .read_exact_at(&mut block, at as u64)
                .map_err(|e| format!("reading the input: {e}"))?;
            crc.update(&block);
            sha.update(&block);
        }
        Ok(Lane {
            input,
            output,
            input_crc32: crc.finalize(),
            input_sha256: sha.finalize().into(),
        })
    }
}

/// One thread's part of a measurement.
struct Worker<'a> {
    step: Step,
    lane: &'a Lane,
    chunk: usize,
    /// `SLOTS` chunks: the sender's staging slots, the receiver's ring
    /// (holding the input's first chunks).
    slots: PageAligned,
    /// One chunk: memcpy's target, the receiver's private copy (a `Vec`,
    /// as the receiver's is).
    copy: Vec<u8>,
    /// CRC32 of each chunk of what the step reads: the input file's (the
    /// sender path) or the slots' (the receiver path).
    crcs: Vec<u32>,
    /// The tag of each chunk the receiver path takes (chunk i: slot
    /// i % SLOTS at offset i * chunk), when tagged.
    tags: Vec<[u8; CHUNK_TAG_LEN]>,
    auth: ChunkAuth,
    /// The digest the last repetition computed.
    digest: Option<Digest>,
    /// The writer threads of `ReceiverThreads`, started once (as a
    /// session starts them once for all its files).
    behind: Option<WriteBehind>,
    /// How the last repetition of `ReceiverLanes` wrote its file.
    written: Option<WriteMode>,
}

impl<'a> Worker<'a> {
    fn new(step: Step, lane: &'a Lane, chunk: usize) -> Outcome<Worker<'a>> {
        let mut slots = PageAligned::new(SLOTS * chunk);
        lane.input
            .read_exact_at(&mut slots[..], 0)
            .map_err(|e| format!("reading the input: {e}"))?;
        let auth = bench_auth();
        let tags = match step {
            Step::ReceiverPath(_, true) => (0..FILE_BYTES / chunk)
                .map(|i| {
                    let slot = (i % SLOTS) * chunk;
                    auth.tag((i * chunk) as u64, &slots[slot..slot + chunk])
                })
                .collect(),
            _ => Vec::new(),
        };
        let crcs = match step {
            Step::SenderPath(..) | Step::SenderLanes(_) => {
                let mut crcs = Vec::with_capacity(FILE_BYTES / chunk);
                let mut buf = vec![0u8; chunk];
                for at in (0..FILE_BYTES).step_by(chunk) {
                    lane.input
                        .read_exact_at(&mut buf, at as u64)
                        .map_err(|e| format!("reading the input: {e}"))?;
                    crcs.push(crc32fast::hash(&buf));
                }
                crcs
            }
            _ => slots.chunks(chunk).map(crc32fast::hash).collect(),
        };
        Ok(Worker {
            step,
            lane,
            chunk,
            slots,
            copy: vec![0u8; chunk],
            crcs,
            tags,
            auth,
            digest: None,
            behind: match step {
                Step::ReceiverThreads(_, n) => {
                    Some(WriteBehind::new(n, chunk).map_err(|e| e.to_string())?)
                }
                _ => None,
            },
            written: None,
        })
    }

    /// Untimed, before each repetition.
    fn prepare(&mut self) -> Outcome<()> {
        if matches!(
            self.step,
            Step::Pwrite
                | Step::ReceiverPath(..)
                | Step::ReceiverThreads(..)
                | Step::ReceiverLanes(..)
        ) {
            // A new file each time, as a transfer writes: its pages are
            // allocated in the timed part.
            self.lane
                .output
                .set_len(0)
                .map_err(|e| format!("truncating the output: {e}"))?;
        }
        // What steps before this one left to write back is written now,
        // not during this one's figures.
        rustix::fs::syncfs(&self.lane.output).map_err(|e| format!("syncfs: {e}"))?;
        Ok(())
    }

    /// The timed part: `FILE_BYTES` through the step.
    fn run(&mut self) -> Outcome<()> {
        let chunk = self.chunk;
        let Worker {
            step,
            lane,
            slots,
            copy,
            crcs,
            tags,
            auth,
            behind,
            ..
        } = self;
        let slot_ranges = (0..FILE_BYTES / chunk).map(|i| {
            let slot = (i % SLOTS) * chunk;
            (i, (i * chunk) as u64, slot..slot + chunk)
        });
        match *step {
            Step::Memcpy => {
                for (_, _, slot) in slot_ranges {
                    copy.copy_from_slice(&slots[slot]);
                    black_box(&mut *copy);
                }
            }
            Step::RingCopy => {
                for (_, _, slot) in slot_ranges {
                    ring_copy(&mut slots[slot], copy).map_err(|e| e.to_string())?;
                    black_box(&mut *copy);
                }
            }
            Step::CopyThenCrc => {
                for (_, _, slot) in slot_ranges {
                    ring_copy(&mut slots[slot], copy).map_err(|e| e.to_string())?;
                    black_box(crc32fast::hash(copy));
                }
            }
            Step::CopyCrcOnePass => {
                for (_, _, slot) in slot_ranges {
                    let ring = &mut slots[slot];
                    let crc = copy_and_crc(|at, block| ring_copy(&mut ring[at..], block), copy)
                        .map_err(|e| e.to_string())?;
                    black_box(crc);
                }
            }
            Step::Crc32 => {
                for (_, _, slot) in slot_ranges {
                    black_box(crc32fast::hash(&slots[slot]));
                }
            }
            Step::Sha256 => {
                let mut sha = Sha256::new();
                for (_, _, slot) in slot_ranges {
                    sha.update(&slots[slot]);
                }
                black_box(sha.finalize());
            }
            Step::Tag => {
                for (_, at, slot) in slot_ranges {
                    black_box(auth.tag(at, &slots[slot]));
                }
            }
            Step::Pread => {
                for (_, at, slot) in slot_ranges {
                    lane.input
                        .read_exact_at(&mut slots[slot], at)
                        .map_err(|e| format!("pread at {at}: {e}"))?;
                }
            }
            Step::Pwrite | Step::PwriteOverwrite => {
                for (_, at, slot) in slot_ranges {
                    lane.output
                        .write_all_at(&slots[slot], at)
                        .map_err(|e| format!("pwrite at {at}: {e}"))?;
                }
            }
            Step::SenderPath(alg, tagged) => {
                let mut hasher = FileHasher::new(alg);
                let auth = tagged.then_some(&*auth);
                let mut tag = [0u8; CHUNK_TAG_LEN];
                for (i, at, slot) in slot_ranges {
                    let data = &mut slots[slot];
                    let crc = fill_chunk(&lane.input, at, data, Some(&mut hasher))
                        .map_err(|e| format!("sender path at {at}: {e}"))?;
                    tag_chunk(auth, at, data, &mut tag);
                    black_box(&tag);
                    if crc != crcs[i] {
                        return Err(format!(
                            "sender path: chunk {i} has CRC32 {crc:08x}, the file's is {:08x}",
                            crcs[i]
                        ));
                    }
                }
                self.digest = Some(hasher.finish());
            }
            Step::ReceiverPath(alg, tagged) => {
                let mut hasher = FileHasher::new(alg);
                for (i, at, slot) in slot_ranges {
                    let expected_crc = crcs[i % SLOTS];
                    let check = tags.get(i).filter(|_| tagged).map(|&tag| TagCheck {
                        auth,
                        offset: at,
                        tag,
                    });
                    let ring = &mut slots[slot];
                    let received = receive_chunk(
                        |at, block| ring_copy(&mut ring[at..], block),
                        copy,
                        expected_crc,
                        check.as_ref(),
                        |data, _crc| lane.output.write_all_at(data, at),
                        Some(&mut hasher),
                    );
                    received.map_err(|e| format!("receiver path at {at}: {e:?}"))?;
                }
                self.digest = Some(hasher.finish());
            }
            Step::ReceiverThreads(alg, n) => {
                let mut hasher = FileHasher::new(alg);
                let behind = behind
                    .as_mut()
                    .ok_or_else(|| format!("no writer threads for {n} writers"))?;
                let mut retired = Vec::new();
                let output = lane
                    .output
                    .try_clone()
                    .map(Arc::new)
                    .map_err(|e| format!("output: {e}"))?;
                for (i, at, slot) in slot_ranges {
                    let expected_crc = crcs[i % SLOTS];
                    let mut buf = behind.buffer(&mut retired).map_err(|e| e.to_string())?;
                    let ring = &mut slots[slot];
                    let received = receive_chunk(
                        |at, block| ring_copy(&mut ring[at..], block),
                        &mut buf,
                        expected_crc,
                        None,
                        |_, _| Ok::<(), ()>(()),
                        Some(&mut hasher),
                    );
                    received.map_err(|e| format!("receiver path at {at}: {e:?}"))?;
                    behind
                        .submit(&output, at, buf, chunk, expected_crc)
                        .map_err(|e| e.to_string())?;
                    behind.poll(&mut retired);
                }
                behind.drain(&mut retired).map_err(|e| e.to_string())?;
                for r in &retired {
                    if let Err(e) = &r.result {
                        return Err(format!("receiver path (writers): {e}"));
                    }
                }
                self.digest = Some(hasher.finish());
            }
            Step::SenderLanes(n) => {
                let crcs = &*crcs;
                let chunks = by_lane(slots, chunk, n, |lane_no, mut own| {
                    let (mut done, owned) = (Vec::new(), own.len());
                    for k in (lane_no..FILE_BYTES / chunk).step_by(n) {
                        let at = (k * chunk) as u64;
                        let data = &mut own[(k / n) % owned];
                        let crc = fill_chunk(&lane.input, at, data, None)
                            .map_err(|e| format!("sender lane at {at}: {e}"))?;
                        if crc != crcs[k] {
                            return Err(format!("sender lane: chunk {k} has a wrong CRC32"));
                        }
                        done.push((k, crc));
                    }
                    Ok(done)
                })?;
                self.digest = Some(Digest::Crc32(whole_crc(chunks, chunk)));
            }
            Step::ReceiverLanes(n, mode) => {
                // As the receiver does: the file at its size, its blocks
                // reserved, so lanes overwrite and never extend it.
                let out =
                    ChunkFile::new(&lane.output, FILE_BYTES as u64, mode == WriteMode::Direct)
                        .map_err(|e| format!("opening the output: {e}"))?;
                if let Err(e) = rdma_xfer::sys::os::reserve_blocks(&lane.output, FILE_BYTES as u64)
                {
                    return Err(format!("reserving the output: {e}"));
                }
                let (out, crcs) = (&out, &*crcs);
                let chunks = by_lane(slots, chunk, n, |lane_no, mut own| {
                    let mut copy = PageAligned::new(chunk);
                    let (mut done, owned) = (Vec::new(), own.len());
                    for k in (lane_no..FILE_BYTES / chunk).step_by(n) {
                        let at = (k * chunk) as u64;
                        let ring = &mut own[(k / n) % owned];
                        let crc = receive_chunk(
                            |from, block| ring_copy(&mut ring[from..], block),
                            &mut copy,
                            crcs[k % SLOTS],
                            None,
                            |data, _| out.write_at(data, at),
                            None,
                        )
                        .map_err(|e| format!("receiver lane at {at}: {e:?}"))?;
                        done.push((k, crc));
                    }
                    Ok(done)
                })?;
                // As the receiver's commit does: the bytes on the device
                // (buffered ones written back), timed with the rest.
                lane.output
                    .sync_data()
                    .map_err(|e| format!("syncing the output: {e}"))?;
                self.written = Some(out.mode());
                self.digest = Some(Digest::Crc32(whole_crc(chunks, chunk)));
            }
        }
        Ok(())
    }

    /// Once, after the last repetition: did the path produce the right
    /// bytes and digests?
    fn verify(&self) -> Outcome<()> {
        let wrong = |what: &str| Err(format!("{}: wrong {what}", self.step.name()));
        match self.step {
            Step::SenderLanes(_) if self.digest != Some(Digest::Crc32(self.lane.input_crc32)) => {
                return wrong("whole-file digest");
            }
            Step::SenderPath(alg, _) => {
                let want = match alg {
                    DigestAlg::Crc32 => Digest::Crc32(self.lane.input_crc32),
                    DigestAlg::Sha256 => Digest::Sha256(self.lane.input_sha256),
                };
                if self.digest != Some(want) {
                    return wrong("whole-file digest");
                }
            }
            Step::ReceiverLanes(_, mode) if self.written != Some(mode) => {
                return wrong("write mode: the file system did not take O_DIRECT");
            }
            Step::ReceiverPath(..) | Step::ReceiverThreads(..) | Step::ReceiverLanes(..) => {
                let alg = match self.step {
                    Step::ReceiverPath(alg, _) | Step::ReceiverThreads(alg, _) => alg,
                    _ => DigestAlg::Crc32,
                };
                // The output must be the slots in turn, chunk i at offset
                // i * chunk, and the digest that of those bytes.
                let mut want = crc32fast::Hasher::new();
                for slot in self
                    .slots
                    .chunks(self.chunk)
                    .cycle()
                    .take(FILE_BYTES / self.chunk)
                {
                    want.update(slot);
                }
                let (crc, sha) = file_digests(&self.lane.output, self.chunk)?;
                if crc != want.finalize() {
                    return wrong("output file contents");
                }
                let written = match alg {
                    DigestAlg::Crc32 => Digest::Crc32(crc),
                    DigestAlg::Sha256 => Digest::Sha256(sha),
                };
                if self.digest != Some(written) {
                    return wrong("whole-file digest");
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// Runs `work(i, its slots)` for each lane i of `n` on a thread of its
/// own: lane i owns the slots s with s % n == i (chunk k, on lane k % n,
/// finds its bytes in slot k % SLOTS, as in the one-thread steps). The
/// chunks each lane checked, with their CRC32s.
fn by_lane<'s>(
    slots: &'s mut [u8],
    chunk: usize,
    n: usize,
    work: impl Fn(usize, Vec<&'s mut [u8]>) -> Outcome<Vec<(usize, u32)>> + Sync,
) -> Outcome<Vec<(usize, u32)>> {
    if n == 0 || !SLOTS.is_multiple_of(n) {
        return Err(format!("{n} lanes do not share {SLOTS} slots evenly"));
    }
    let mut owned: Vec<Vec<&mut [u8]>> = (0..n).map(|_| Vec::new()).collect();
    for (s, slot) in slots.chunks_mut(chunk).enumerate() {
        owned[s % n].push(slot);
    }
    let work = &work;
    std::thread::scope(|scope| {
        let lanes: Vec<_> = owned
            .into_iter()
            .enumerate()
            .map(|(i, own)| scope.spawn(move || work(i, own)))
            .collect();
        let mut all = Vec::new();
        for lane in lanes {
            all.extend(
                lane.join()
                    .unwrap_or_else(|_| Err("a lane panicked".into()))?,
            );
        }
        Ok(all)
    })
}

/// The whole file's CRC32 from its chunks' (any order, each once).
fn whole_crc(mut chunks: Vec<(usize, u32)>, chunk: usize) -> u32 {
    chunks.sort_unstable_by_key(|&(k, _)| k);
    crc32_of_chunks(chunks.into_iter().map(|(_, crc)| (crc, chunk as u64)))
}

/// CRC32 and SHA-256 of a whole `FILE_BYTES` file, which must be that long.
fn file_digests(file: &File, chunk: usize) -> Outcome<(u32, [u8; 32])> {
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    if len != FILE_BYTES as u64 {
        return Err(format!("the output has {len} bytes, not {FILE_BYTES}"));
    }
    let mut buf = vec![0u8; chunk];
    let mut crc = crc32fast::Hasher::new();
    let mut sha = Sha256::new();
    for at in (0..FILE_BYTES).step_by(chunk) {
        file.read_exact_at(&mut buf, at as u64)
            .map_err(|e| format!("reading the output: {e}"))?;
        crc.update(&buf);
        sha.update(&buf);
    }
    Ok((crc.finalize(), sha.finalize().into()))
}

/// A measurement's result, each figure the median over the repetitions.
struct Rate {
    /// GB/s of all threads together by the clock: each repetition's bytes
    /// over its slowest thread's time.
    wall: f64,
    wall_min: f64,
    wall_max: f64,
    /// GB/s per core: the bytes over the CPU time the threads used (time
    /// the threads waited for a core on a loaded machine not counted).
    per_cpu: f64,
    /// For the lane steps, GB/s per CPU second of the whole machine:
    /// kernel threads' work on the bytes counted too (a loop device's
    /// copy, writeback).
    per_machine_cpu: Option<f64>,
}

/// One thread's time for one repetition.
#[derive(Clone, Copy)]
struct Took {
    wall: Duration,
    cpu: Duration,
    /// The whole machine's busy time meanwhile (lane steps only).
    machine: Duration,
}

/// The time all CPUs have been busy since boot (/proc/stat: user, nice,
/// system, irq, softirq), to a tick.
fn machine_busy() -> Duration {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let ticks: u64 = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .map(|l| {
            l.split_whitespace()
                .filter_map(|v| v.parse::<u64>().ok())
                .enumerate()
                // user nice system idle iowait irq softirq: not idle, iowait.
                .filter(|(i, _)| matches!(i, 0 | 1 | 2 | 5 | 6))
                .map(|(_, v)| v)
                .sum()
        })
        .unwrap_or(0);
    let hz = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000 / hz))
}

/// The CPU time the calling thread has used.
fn thread_cpu_time() -> Duration {
    cpu_time(rustix::time::ClockId::ThreadCPUTime)
}

/// The CPU time the whole process has used (for a step with threads of
/// its own, measured on one lane).
fn process_cpu_time() -> Duration {
    cpu_time(rustix::time::ClockId::ProcessCPUTime)
}

fn cpu_time(clock: rustix::time::ClockId) -> Duration {
    let t = rustix::time::clock_gettime(clock);
    Duration::new(
        u64::try_from(t.tv_sec).unwrap_or(0),
        u32::try_from(t.tv_nsec).unwrap_or(0),
    )
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// Runs `step` on one thread per lane at once, `WARMUPS` + `REPS` times;
/// each repetition's rate is all the threads' bytes over the slowest
/// thread's time.
fn measure(step: Step, lanes: &[Lane], chunk: usize) -> Outcome<Rate> {
    let mut workers = Vec::new();
    for lane in lanes {
        workers.push(Worker::new(step, lane, chunk)?);
    }
    let start = Barrier::new(lanes.len());
    let end = Barrier::new(lanes.len());
    let times = std::thread::scope(|s| {
        let threads: Vec<_> = workers
            .into_iter()
            .map(|mut worker| {
                let (start, end) = (&start, &end);
                s.spawn(move || {
                    // On an error a thread stops working but keeps meeting
                    // the others at the barriers, so that none waits forever.
                    let mut failed = None;
                    let mut times = Vec::new();
                    for rep in 0..WARMUPS + REPS {
                        if failed.is_none() {
                            failed = worker.prepare().err();
                        }
                        start.wait();
                        let clock = match worker.step {
                            Step::ReceiverThreads(..)
                            | Step::SenderLanes(_)
                            | Step::ReceiverLanes(..) => process_cpu_time,
                            _ => thread_cpu_time,
                        };
                        let lanes =
                            matches!(worker.step, Step::SenderLanes(_) | Step::ReceiverLanes(..));
                        let busy = if lanes {
                            machine_busy()
                        } else {
                            Duration::ZERO
                        };
                        let (t, cpu) = (Instant::now(), clock());
                        if failed.is_none() {
                            failed = worker.run().err();
                        }
                        let took = Took {
                            wall: t.elapsed(),
                            cpu: clock().saturating_sub(cpu),
                            machine: match lanes {
                                true => machine_busy().saturating_sub(busy),
                                false => Duration::ZERO,
                            },
                        };
                        end.wait();
                        if rep >= WARMUPS {
                            times.push(took);
                        }
                    }
                    match failed {
                        Some(e) => Err(e),
                        None => worker.verify().map(|()| times),
                    }
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|_| Err("a thread panicked".into())))
            .collect::<Outcome<Vec<Vec<Took>>>>()
    })?;
    let gb = (FILE_BYTES * lanes.len()) as f64 / 1e9;
    let per_second = |d: Duration| gb / d.as_secs_f64().max(1e-9);
    let wall: Vec<f64> = (0..REPS)
        .map(|rep| per_second(times.iter().map(|t| t[rep].wall).max().unwrap_or_default()))
        .collect();
    let per_cpu = (0..REPS)
        .map(|rep| per_second(times.iter().map(|t| t[rep].cpu).sum()))
        .collect();
    // Each repetition's bytes over the machine's busy time meanwhile (to
    // a tick of /proc/stat, 10 ms: a tenth of a repetition or less).
    let machine: Vec<f64> = (0..REPS)
        .map(|rep| times.iter().map(|t| t[rep].machine).sum::<Duration>())
        .filter(|busy| *busy > Duration::ZERO)
        .map(per_second)
        .collect();
    Ok(Rate {
        per_machine_cpu: (!machine.is_empty()).then(|| median(machine)),
        wall_min: wall.iter().copied().fold(f64::INFINITY, f64::min),
        wall_max: wall.iter().copied().fold(0.0, f64::max),
        wall: median(wall),
        per_cpu: median(per_cpu),
    })
}

fn mib(bytes: usize) -> String {
    format!("{}MiB", bytes >> 20)
}

/// Measures and prints one line; `single` is the one-thread rate (GB/s by
/// the clock) the scaling of several threads is given against.
fn report(step: Step, lanes: &[Lane], chunk: usize, single: Option<f64>) -> Outcome<Rate> {
    if let Ok(only) = std::env::var("RXFER_BENCH_ONLY")
        && !step.name().contains(&only)
    {
        return Ok(Rate {
            wall: f64::NAN,
            wall_min: f64::NAN,
            wall_max: f64::NAN,
            per_cpu: f64::NAN,
            per_machine_cpu: None,
        });
    }
    let rate = measure(step, lanes, chunk)?;
    let scaling = single.map_or(String::new(), |one| {
        format!(" scaling={:.2}", rate.wall / one)
    });
    println!(
        "native: {} {} threads={} GB/s={:.2} min={:.2} max={:.2} GB/s_per_cpu={:.2}{}{scaling}",
        step.name(),
        mib(chunk),
        lanes.len(),
        rate.wall,
        rate.wall_min,
        rate.wall_max,
        rate.per_cpu,
        rate.per_machine_cpu
            .map_or(String::new(), |m| format!(" GB/s_per_machine_cpu={m:.2}")),
    );
    Ok(rate)
}

/// The lane steps on `lane`'s files (on a file system of type `fs`): the
/// sender's, and the receiver's written each way of `modes`, by 1 and 2
/// lanes; the 2-lane scaling of each (target 1.8) goes into `scalings`.
fn lanes_on(
    lane: &[Lane],
    fs: &str,
    modes: &[WriteMode],
    scalings: &mut Vec<String>,
) -> Outcome<()> {
    let mut kinds: Vec<Box<dyn Fn(usize) -> Step>> = vec![Box::new(Step::SenderLanes)];
    for &mode in modes {
        kinds.push(Box::new(move |n| Step::ReceiverLanes(n, mode)));
    }
    for step in &kinds {
        let one = report(step(1), lane, CHUNK_SIZES[0], None)?;
        let two = report(step(2), lane, CHUNK_SIZES[0], Some(one.wall))?;
        let scaling = two.wall / one.wall;
        // What a byte costs the whole machine with two lanes against one
        // (1.00: the lanes do not wait for each other, nothing else grows),
        // and one lane's rate per CPU second of the whole machine.
        let machine = |r: &Rate| r.per_machine_cpu.unwrap_or(f64::NAN);
        scalings.push(format!(
            "{} fs={fs} 2_lanes_over_1={scaling:.2} target=1.80 met={} \
             machine_cpu_per_byte_2_over_1={:.2} 1_lane_Gb/s_per_machine_core={:.1}",
            step(2).name().replace(" lanes=2", ""),
            if scaling >= 1.8 { "yes" } else { "no" },
            machine(&one) / machine(&two),
            machine(&one) * 8.0,
        ));
    }
    Ok(())
}

/// The header: what the figures depend on.
fn describe_host(dir: &Path) {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map_or("unknown", |(_, m)| m.trim());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "native: host cpu=\"{model}\" cores={cores} loadavg=\"{}\"",
        loadavg()
    );
    println!(
        "native: setup dir={} fs={} file={} slots={SLOTS} warmups={WARMUPS} reps={REPS} \
         (GB/s = 10^9 B/s, median of reps: by the clock, and per CPU second)",
        dir.display(),
        fs_type(dir),
        mib(FILE_BYTES),
    );
}

/// The 1, 5 and 15 minute load averages.
fn loadavg() -> String {
    let all = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    all.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

/// The type of the file system `dir` is on (the longest mount point that
/// contains it), from /proc/self/mounts.
fn fs_type(dir: &Path) -> String {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    mounts
        .lines()
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            let point = fields.nth(1)?;
            let kind = fields.next()?;
            dir.starts_with(point).then_some((point.len(), kind))
        })
        .max_by_key(|&(len, _)| len)
        .map_or("unknown".into(), |(_, kind)| kind.into())
}

fn bench_dir() -> PathBuf {
    match std::env::var_os("RXFER_BENCH_DIR") {
        Some(d) => d.into(),
        None if Path::new(DEFAULT_DIR).is_dir() => DEFAULT_DIR.into(),
        None => std::env::temp_dir(),
    }
}

fn run() -> Outcome<()> {
    let dir = bench_dir();
    describe_host(&dir);
    let lanes = [Lane::new(&dir, 0x5eed_0001)?, Lane::new(&dir, 0x5eed_0002)?];
    let one = &lanes[..1];
    // Without a token (CRC32 or SHA-256), and as with one: SHA-256 (a
    // receiver with a token takes no other) and every chunk tagged.
    let paths = [
        Step::SenderPath(DigestAlg::Crc32, false),
        Step::SenderPath(DigestAlg::Sha256, false),
        Step::SenderPath(DigestAlg::Sha256, true),
        Step::ReceiverPath(DigestAlg::Crc32, false),
        Step::ReceiverPath(DigestAlg::Sha256, false),
        Step::ReceiverPath(DigestAlg::Sha256, true),
    ];
    let references = [
        Step::Memcpy,
        Step::RingCopy,
        Step::CopyThenCrc,
        Step::CopyCrcOnePass,
        Step::Crc32,
        Step::Sha256,
        Step::Tag,
        Step::Pread,
        Step::Pwrite,
        Step::PwriteOverwrite,
    ];
    // Single-thread figures of the default chunk size, for the summary.
    let mut per_core = Vec::new();
    for chunk in CHUNK_SIZES {
        for step in references {
            report(step, one, chunk, None)?;
        }
        for step in paths {
            let rate = report(step, one, chunk, None)?;
            if chunk == CHUNK_SIZES[0] {
                per_core.push((step, rate));
            }
        }
    }
    // Each thread its own files: does the work scale with cores?
    for (step, single) in &per_core {
        report(*step, &lanes, CHUNK_SIZES[0], Some(single.wall))?;
    }
    // One session's receiver with writer threads (`receiver --threads`).
    for alg in [DigestAlg::Crc32, DigestAlg::Sha256] {
        let single = per_core
            .iter()
            .find(|(step, _)| *step == Step::ReceiverPath(alg, false))
            .map(|(_, rate)| rate.wall);
        for writers in [1, 2] {
            report(
                Step::ReceiverThreads(alg, writers),
                one,
                CHUNK_SIZES[0],
                single,
            )?;
        }
    }
    // Lanes: one file by 1 and 2 threads on each side, in the page cache
    // (tmpfs: buffered), then on ext4 (buffered and O_DIRECT).
    let mut scalings = Vec::new();
    let fs = fs_type(&dir);
    lanes_on(one, &fs, &[WriteMode::Buffered], &mut scalings)?;
    match std::env::var_os("RXFER_BENCH_EXT4_DIR") {
        Some(ext4) => {
            let ext4 = PathBuf::from(ext4);
            println!(
                "native: setup ext4_dir={} fs={}",
                ext4.display(),
                fs_type(&ext4)
            );
            let on_ext4 = [Lane::new(&ext4, 0x5eed_0003)?];
            report(
                Step::ReceiverPath(DigestAlg::Crc32, false),
                &on_ext4,
                CHUNK_SIZES[0],
                None,
            )?;
            let modes = [WriteMode::Buffered, WriteMode::Direct];
            lanes_on(&on_ext4, &fs_type(&ext4), &modes, &mut scalings)?;
        }
        None => println!(
            "native: ext4 not measured: RXFER_BENCH_EXT4_DIR is not set (make bench-native sets it)"
        ),
    }
    for line in scalings {
        println!("native: summary {line}");
    }
    // Cores needed if every core did what one did here, per CPU second.
    for (step, rate) in per_core {
        let gbit = rate.per_cpu * 8.0;
        let cores: Vec<String> = LINE_RATES_GBIT
            .iter()
            .map(|&line| format!("cores_{line}G={}", (f64::from(line) / gbit).ceil() as u32))
            .collect();
        println!(
            "native: summary {} {} Gb/s_per_core={gbit:.1} {} one_core_12.5GB/s={}",
            step.name(),
            mib(CHUNK_SIZES[0]),
            cores.join(" "),
            if rate.per_cpu >= 12.5 { "yes" } else { "no" }
        );
    }
    println!("native: done loadavg=\"{}\"", loadavg());
    Ok(())
}

fn main() -> ExitCode {
    // `cargo bench` passes --bench; nothing else is taken.
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("native: FAILED {e}");
            ExitCode::FAILURE
        }
    }
}
