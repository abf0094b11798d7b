//! The one helper module of the integration tests (tests/rdma/,
//! tests/cli.rs, tests/install.rs), a file per purpose: here skipping by
//! name, the one wait loop (`wait_until`) and where the binaries are;
//! `process.rs` the one process helper (`Running`, for every binary a test
//! starts: receiver, sender, shell pipelines and the raw client);
//! `tools.rs` the tools' command lines (`ReceiverCommand`,
//! `SenderCommand`); `data.rs` test data; `limits.rs` memlock limits;
//! `raw_client.rs` the hostile client; `guest.rs` the guest's wire and
//! devices, faults injected into a transfer. The end-to-end tests drive
//! the built binaries exactly as a user would, on a real RDMA stack
//! (SoftRoCE in the QEMU guest of scripts/guest/run.sh, or a host that has
//! an RDMA device).
#![allow(dead_code)]

use sha2::{Digest, Sha256};
use std::fmt::Display;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tempfile::TempDir;

// Each test binary uses a part of these.
mod data;
mod guest;
mod limits;
mod process;
mod raw_client;
mod tools;
#[allow(unused_imports)]
pub use {data::*, guest::*, limits::*, process::*, raw_client::*, tools::*};

pub const MIB: u64 = 1 << 20;
/// Default chunk (slot) size of the tools.
pub const CHUNK: u64 = MIB;

// ---------------------------------------------------------------------------
// Skipping: a test that cannot run here says so by name, and fails instead
// where the run demands it.

/// The running test's name (libtest runs each test on a thread named after
/// it, with --test-threads=1 too).
pub fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("<unnamed test>")
        .to_string()
}

fn env_set(var: &str) -> bool {
    std::env::var(var)
        .map(|v| !v.is_empty() && v != "0" && v != "false")
        .unwrap_or(false)
}

/// True where every test must run (the guest sets RDMA_XFER_REQUIRE_RDMA=1;
/// CI sets CI=true): there a test that cannot run fails.
pub fn everything_required() -> bool {
    env_set("RDMA_XFER_REQUIRE_RDMA") || env_set("CI")
}

/// True inside the SoftRoCE guest of scripts/guest/run.sh, whose network and
/// mounts the tests own.
pub fn in_guest() -> bool {
    env_set("IN_RXFER_GUEST")
}

/// Reports the running test as skipped, by name: `SKIPPED: <test>:
/// <reason>` on stderr (shown with --nocapture, and by e2e.sh). Where
/// `required`, the test fails instead: it never passes without running.
pub fn skip(reason: &str, required: bool) {
    let name = test_name();
    assert!(
        !required,
        "{name} cannot run here, and this run requires it: {reason}"
    );
    eprintln!("SKIPPED: {name}: {reason}");
}

pub fn has_rdma_device() -> bool {
    std::fs::read_dir("/sys/class/infiniband")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false)
}

/// Where the tests talk: the receiver's address and the sender's source.
pub struct Net {
    /// Receiver side (rxe0 / veth0 in the guest).
    pub addr_a: String,
    /// Sender side (rxe1 / veth1 in the guest); connecting from it to
    /// `addr_a` crosses the veth wire.
    pub addr_b: Option<String>,
}

/// Returns the network to use, or None when this machine has no RDMA device
/// (the test is skipped, by name); where one is required (the guest, CI) a
/// missing device fails the test.
pub fn rdma_net() -> Option<Net> {
    if !has_rdma_device() {
        skip(
            "no RDMA device (`make test` runs the end-to-end tests in a SoftRoCE guest)",
            everything_required(),
        );
        return None;
    }
    Some(Net {
        addr_a: std::env::var("RXFER_ADDR_A").unwrap_or_else(|_| "127.0.0.1".into()),
        addr_b: std::env::var("RXFER_ADDR_B").ok(),
    })
}

/// True if `tool` is on the PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

// ---------------------------------------------------------------------------
// The one wait loop.

/// Reads `source` every 20 ms until `done` holds for what it read, and
/// returns that reading; fails the test after `timeout`, naming `what` it
/// waited for and showing the last reading.
pub fn wait_until<T: Display>(
    what: &str,
    mut source: impl FnMut() -> T,
    mut done: impl FnMut(&T) -> bool,
    timeout: Duration,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        let now = source();
        if done(&now) {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "waited {timeout:?} for {what}; last seen:\n{now}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------
// Binaries.

pub fn receiver_bin() -> &'static str {
    env!("CARGO_BIN_EXE_receiver")
}

pub fn sender_bin() -> &'static str {
    env!("CARGO_BIN_EXE_sender")
}

/// A binary of the test-only build with the `fault-injection` feature, which
/// `make build` puts into target/fault-injection.
pub fn fault_injection_bin(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("target/fault-injection/release")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run `make build` (it builds the fault-injection binaries)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// A port no other test of this run uses.
pub fn next_port() -> u16 {
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 200) as u16 * 100;
    base + NEXT.fetch_add(1, Ordering::SeqCst)
}
