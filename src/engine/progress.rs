//! How the engine tells its user how far a transfer got, without knowing
//! anything about terminals: the binaries implement [`Progress`] (progress
//! bars on a terminal, nothing otherwise). The engine calls it at most once
//! per chunk, so an implementation must only be cheap, not clever.

use std::fmt;
use std::sync::Arc;

/// Observer of a tool's transfers. Every method may be called from several
/// session threads at once (receiver).
pub trait Progress: Send + Sync {
    /// The sender is about to send `files` files of `bytes` bytes in total.
    fn planned(&self, _files: u64, _bytes: u64) {}

    /// A file of `size` bytes starts (sender: HELLO sent; receiver: offer
    /// accepted). Its bytes are reported to the returned handle; dropping
    /// the handle without [`FileProgress::finished`] means the file failed.
    fn file_started(&self, name: &str, size: u64) -> Box<dyn FileProgress>;

    /// As `file_started`, for a batch of `files` small files sent (or
    /// received) as one: the handle stands for all of them.
    fn batch_started(&self, name: &str, size: u64, _files: u64) -> Box<dyn FileProgress> {
        self.file_started(name, size)
    }

    /// The receiver is ready: it listens (said once, before any session).
    fn listening(&self, _ready: &Listening) {}

    /// `sender --lanes`: lane `lane` is gone (`why`); its piece goes to
    /// the others (said once per lane, besides the log's warning).
    fn lane_down(&self, _lane: u64, _why: &str) {}
}

/// Where a receiver listens and what it writes to, once it is ready.
#[derive(Debug, Clone)]
pub struct Listening {
    /// The address and port it listens on.
    pub bind: std::net::SocketAddr,
    /// The device and port that address belongs to (None for a wildcard
    /// address, which listens on every device).
    pub device: Option<(String, u8)>,
    /// Every RDMA device found.
    pub devices: Vec<String>,
    /// What becomes of the files, as the line says it: "writing to DIR"
    /// (absolute where it can be), "writing to standard output", ...
    pub output: String,
    /// The same for JSON: the directory, "standard output" or "discard".
    pub output_name: String,
    /// Without a token: who may do what here ("anyone who can reach this
    /// port may write into DIR"); None when senders must prove the token.
    pub unauthenticated: Option<String>,
}

/// Progress of one file.
pub trait FileProgress: Send {
    /// `bytes` more bytes were sent (sender: posted as RDMA writes) or
    /// received (receiver: checked, and written or queued for a writer
    /// thread).
    fn advance(&mut self, bytes: u64);

    /// The file was acknowledged (sender) or committed (receiver).
    fn finished(&mut self) {}
}

/// Reports nothing (the default; what the tools use without a terminal).
#[derive(Debug, Default, Clone, Copy)]
pub struct NoProgress;

struct NoFileProgress;

impl FileProgress for NoFileProgress {
    fn advance(&mut self, _bytes: u64) {}
}

impl Progress for NoProgress {
    fn file_started(&self, _name: &str, _size: u64) -> Box<dyn FileProgress> {
        Box::new(NoFileProgress)
    }
}

/// The observer a configuration carries (shared by its session threads).
#[derive(Clone)]
pub struct ProgressSink(Arc<dyn Progress>);

impl ProgressSink {
    pub fn new(progress: Arc<dyn Progress>) -> Self {
        ProgressSink(progress)
    }
}

impl Default for ProgressSink {
    fn default() -> Self {
        ProgressSink(Arc::new(NoProgress))
    }
}

impl fmt::Debug for ProgressSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ProgressSink")
    }
}

impl std::ops::Deref for ProgressSink {
    type Target = dyn Progress;

    fn deref(&self) -> &Self::Target {
        &*self.0
    }
}
