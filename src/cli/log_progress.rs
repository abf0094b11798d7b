//! Progress as log lines, for stderr that is not a terminal (a batch
//! job's log, a journal): one line every `--stats` interval while bytes
//! move, as rclone's `--stats`. Driven by the transfer itself (each
//! chunk looks at the clock), so a quiet process prints nothing.

use crate::engine::FileProgress;
use crate::units::{format_bytes, mib_per_sec};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// What has moved so far, shared by every file's handle.
pub(super) struct LogProgress {
    every: Duration,
    started: Instant,
    /// Bytes moved so far, all files.
    bytes: AtomicU64,
    /// When the next line is due, in ms since `started`.
    due_ms: AtomicU64,
    counts: Mutex<Counts>,
    /// Prints a line (the Ui's `eprintln`).
    print: Box<dyn Fn(&str) + Send + Sync>,
    json: bool,
}

#[derive(Default)]
struct Counts {
    /// What the sender planned (0 when not known: a receiver, several
    /// targets).
    planned_files: u64,
    planned_bytes: u64,
    /// Files (or batches' files) started and finished.
    started: u64,
    finished: u64,
    /// Bytes and instant at the last line (at first: the first bytes),
    /// for the current rate.
    last: (u64, Duration),
    /// When the first bytes moved, for the average rate.
    first_at: Duration,
}

impl LogProgress {
    pub(super) fn new(every: Duration, json: bool, print: Box<dyn Fn(&str) + Send + Sync>) -> Self {
        LogProgress {
            every,
            started: Instant::now(),
            bytes: AtomicU64::new(0),
            due_ms: AtomicU64::new(millis(every)),
            counts: Mutex::new(Counts::default()),
            print,
            json,
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn plan(&self, files: u64, bytes: u64) {
        let mut c = self.counts();
        c.planned_files = files;
        c.planned_bytes = bytes;
    }

    /// A handle for a file (or a batch of `files`).
    pub(super) fn start(self: &Arc<Self>, files: u64) -> Box<dyn FileProgress> {
        self.counts().started += files;
        Box::new(LoggedFile {
            log: Arc::clone(self),
            files,
        })
    }

    fn advance(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let before = self.bytes.fetch_add(bytes, Ordering::Relaxed);
        let now = self.started.elapsed();
        if before == 0 {
            // The clock starts with the first bytes: a receiver may have
            // waited for hours before them.
            self.counts().last = (0, now);
            self.due_ms
                .store(millis(now + self.every), Ordering::Relaxed);
            return;
        }
        let due = self.due_ms.load(Ordering::Relaxed);
        // One thread wins the line when several pass its time at once.
        if millis(now) >= due
            && self
                .due_ms
                .compare_exchange(
                    due,
                    millis(now + self.every),
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                )
                .is_ok()
        {
            let line = self.line(now);
            (self.print)(&line);
        }
    }

    /// The line at `now` (since the start): bytes so far, of how many,
    /// files, the rate since the last line and the ETA at the average rate.
    fn line(&self, now: Duration) -> String {
        let bytes = self.bytes.load(Ordering::Relaxed);
        let mut c = self.counts();
        if c.first_at.is_zero() {
            c.first_at = c.last.1;
        }
        let (last_bytes, last_at) = c.last;
        c.last = (bytes, now);
        let rate = mib_per_sec(
            bytes.saturating_sub(last_bytes),
            now.saturating_sub(last_at).as_secs_f64(),
        );
        let left = c
            .planned_bytes
            .checked_sub(bytes)
            .filter(|_| c.planned_bytes > 0);
        let average = bytes as f64 / now.saturating_sub(c.first_at).as_secs_f64().max(1e-3);
        let eta = left
            .filter(|_| average > 0.0)
            .map(|left| (left as f64 / average).ceil() as u64);
        if self.json {
            return serde_json::json!({
                "event": "progress",
                "bytes": bytes,
                "planned_bytes": (c.planned_bytes > 0).then_some(c.planned_bytes),
                "files_done": c.finished,
                "files_started": c.started,
                "planned_files": (c.planned_files > 0).then_some(c.planned_files),
                "mib_per_s": (rate * 10.0).round() / 10.0,
                "eta_s": eta,
                "seconds": now.as_secs(),
            })
            .to_string();
        }
        let mut line = format!("progress: {}", format_bytes(bytes));
        if let Some(pct) = percent(bytes, c.planned_bytes) {
            line += &format!(" of {} ({pct}%)", format_bytes(c.planned_bytes));
        }
        if c.planned_files > 0 {
            let files = plural(c.planned_files, "file");
            line += &format!(", {} of {files} done", c.finished);
        } else {
            line += &format!(", {} done", plural(c.finished, "file"));
        }
        line += &format!(", {rate:.1} MiB/s");
        if let Some(eta) = eta {
            line += &format!(", ETA {}", clock(eta));
        }
        line
    }
}

/// "1 file", "3 files".
fn plural(n: u64, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// Whole percent, never 100 before the end; None without a plan.
fn percent(bytes: u64, planned: u64) -> Option<u64> {
    (planned > 0).then(|| (u128::from(bytes) * 100 / u128::from(planned)).min(99) as u64)
}

/// "42s", "3m05s", "2h10m".
fn clock(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One file's (or batch's) handle.
struct LoggedFile {
    log: Arc<LogProgress>,
    files: u64,
}

impl FileProgress for LoggedFile {
    fn advance(&mut self, bytes: u64) {
        self.log.advance(bytes);
    }

    fn finished(&mut self) {
        self.log.counts().finished += self.files;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collecting(every: Duration, json: bool) -> (Arc<LogProgress>, Arc<Mutex<Vec<String>>>) {
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&lines);
        let print = Box::new(move |l: &str| sink.lock().unwrap().push(l.to_string()));
        (Arc::new(LogProgress::new(every, json, print)), lines)
    }

    #[test]
    fn a_line_comes_once_per_interval_while_bytes_move() {
        let (log, lines) = collecting(Duration::from_millis(200), false);
        log.plan(2, 4 << 20);
        let mut f = log.start(1);
        f.advance(1 << 20);
        assert!(lines.lock().unwrap().is_empty(), "not before the interval");
        std::thread::sleep(Duration::from_millis(250));
        f.advance(1 << 20);
        f.advance(1);
        f.finished();
        let got = lines.lock().unwrap().clone();
        assert_eq!(got.len(), 1, "{got:?}");
        assert!(
            got[0].starts_with("progress: 2.0 MiB of 4.0 MiB (50%), 0 of 2 files done, "),
            "{}",
            got[0]
        );
        assert!(got[0].contains(" MiB/s, ETA "), "{}", got[0]);
        std::thread::sleep(Duration::from_millis(250));
        log.start(1).advance(5);
        let got = lines.lock().unwrap().clone();
        assert_eq!(got.len(), 2, "{got:?}");
        assert!(got[1].contains(", 1 of 2 files done, "), "{}", got[1]);
        // No bytes, no line (a receiver's first call may carry none).
        std::thread::sleep(Duration::from_millis(250));
        log.start(1).advance(0);
        assert_eq!(lines.lock().unwrap().len(), 2);
    }

    #[test]
    fn without_a_plan_a_line_has_no_share_and_no_eta() {
        let (log, lines) = collecting(Duration::from_millis(1), false);
        // Long before the first bytes: they start the clock, no line yet.
        std::thread::sleep(Duration::from_millis(5));
        let mut f = log.start(3);
        f.advance(1024);
        assert!(lines.lock().unwrap().is_empty());
        std::thread::sleep(Duration::from_millis(5));
        f.advance(1024);
        let got = lines.lock().unwrap().clone();
        assert_eq!(got.len(), 1);
        assert!(
            got[0].starts_with("progress: 2.0 KiB, 0 files done, "),
            "{}",
            got[0]
        );
        assert!(!got[0].contains("ETA"), "{}", got[0]);
    }

    #[test]
    fn a_json_line_is_one_object_with_its_numbers() {
        let (log, lines) = collecting(Duration::from_millis(1), true);
        log.plan(1, 1000);
        let mut f = log.start(1);
        f.advance(100);
        std::thread::sleep(Duration::from_millis(5));
        f.advance(150);
        let got = lines.lock().unwrap().clone();
        let v: serde_json::Value = serde_json::from_str(&got[0]).unwrap();
        assert_eq!(v["event"], "progress");
        assert_eq!(v["bytes"], 250);
        assert_eq!(v["planned_bytes"], 1000);
        assert_eq!(v["planned_files"], 1);
        assert_eq!(v["files_done"], 0);
        assert!(v["eta_s"].is_u64());
    }

    #[test]
    fn shares_and_clocks_read_as_people_expect() {
        assert_eq!(percent(5, 0), None);
        assert_eq!(percent(1, 3), Some(33));
        assert_eq!(percent(3, 3), Some(99));
        assert_eq!(percent(u64::MAX, u64::MAX), Some(99));
        assert_eq!(clock(42), "42s");
        assert_eq!(clock(185), "3m05s");
        assert_eq!(clock(7800), "2h10m");
    }
}
