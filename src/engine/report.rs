//! Per-file results: the one-line summary each tool prints, the JSON
//! objects of `--json` (one per file, and a final summary) and the failures
//! that go with them.

use super::digest::digest_hex;
use crate::error::{ExitCode, XferError};
use crate::proto::{Digest, DigestAlg};
use crate::units::mib_per_sec;
use serde_json::json;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct FileReport {
    pub name: String,
    pub bytes: u64,
    pub elapsed: Duration,
    pub digest: Digest,
    pub phases: Phases,
}

/// Where a file's time went, as each side sees it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phases {
    /// Setting up the session's connection (shared by its files).
    pub connect: Duration,
    /// HELLO to MR: the receiver's checks and ring registration.
    pub mr_exchange: Duration,
    /// MR to FIN: the data itself.
    pub data: Duration,
    /// FIN to ACK: whole-file verify, fsync and rename on the receiver.
    pub commit: Duration,
}

impl Phases {
    /// Logs the phases as structured fields (JSON logs carry them).
    pub fn log(&self, name: &str, bytes: u64) {
        tracing::info!(
            file = name,
            bytes,
            connect_s = self.connect.as_secs_f64(),
            mr_exchange_s = self.mr_exchange.as_secs_f64(),
            data_s = self.data.as_secs_f64(),
            fsync_verify_s = self.commit.as_secs_f64(),
            "file done"
        );
    }
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

impl FileReport {
    pub fn summary_line(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        format!(
            "{}: {} bytes in {:.3} s, {:.1} MiB/s ({} {}); connect {}, MR {}, data {}, fsync+verify {}",
            self.name,
            self.bytes,
            secs,
            mib_per_sec(self.bytes, secs),
            digest_alg(&self.digest).as_str(),
            digest_hex(&self.digest),
            ms(self.phases.connect),
            ms(self.phases.mr_exchange),
            ms(self.phases.data),
            ms(self.phases.commit),
        )
    }
}

impl FileReport {
    /// The summary as one JSON object (for `--log-format json`).
    pub fn summary_json(&self) -> serde_json::Value {
        let secs = self.elapsed.as_secs_f64();
        serde_json::json!({
            "event": "file done",
            "file": self.name,
            "bytes": self.bytes,
            "seconds": secs,
            "mib_per_s": mib_per_sec(self.bytes, secs),
            "digest_alg": digest_alg(&self.digest).as_str(),
            "digest": digest_hex(&self.digest),
            "phases": self.phases.json(),
        })
    }

    /// The file's result for `--json` (one line on stdout).
    pub fn result_json(&self) -> serde_json::Value {
        let secs = self.elapsed.as_secs_f64();
        json!({
            "event": "file",
            "name": self.name,
            "bytes": self.bytes,
            "seconds": secs,
            "mib_per_s": mib_per_sec(self.bytes, secs),
            "digest_alg": digest_alg(&self.digest).as_str(),
            "digest": digest_hex(&self.digest),
            "status": ExitCode::Ok.as_str(),
            "exit_code": ExitCode::Ok as u8,
            "phases": self.phases.json(),
        })
    }
}

impl Phases {
    fn json(&self) -> serde_json::Value {
        json!({
            "connect_s": self.connect.as_secs_f64(),
            "mr_exchange_s": self.mr_exchange.as_secs_f64(),
            "data_s": self.data.as_secs_f64(),
            "fsync_verify_s": self.commit.as_secs_f64(),
        })
    }
}

fn digest_alg(digest: &Digest) -> DigestAlg {
    match digest {
        Digest::Crc32(_) => DigestAlg::Crc32,
        Digest::Sha256(_) => DigestAlg::Sha256,
    }
}

/// A file that was not transferred: refused by the receiver, failed its
/// check, or cut short by an error that ended the session.
#[derive(Debug, Clone)]
pub struct FileFailure {
    pub name: String,
    /// The file's size (as offered), not what got across.
    pub bytes: u64,
    pub digest_alg: DigestAlg,
    /// From the file's HELLO to the failure.
    pub elapsed: Duration,
    /// The session's connection set-up (shared by its files).
    pub connect: Duration,
    pub exit_code: ExitCode,
    pub reason: String,
    /// The failure ended the session (later files were not transferred).
    pub session_ended: bool,
}

impl FileFailure {
    pub fn new(
        name: &str,
        bytes: u64,
        digest_alg: DigestAlg,
        elapsed: Duration,
        connect: Duration,
        error: &XferError,
        session_ended: bool,
    ) -> Self {
        FileFailure {
            name: name.to_string(),
            bytes,
            digest_alg,
            elapsed,
            connect,
            exit_code: error.exit_code(),
            reason: error.to_string(),
            session_ended,
        }
    }

    /// The failure for `--json` (one line on stdout).
    pub fn result_json(&self) -> serde_json::Value {
        json!({
            "event": "file",
            "name": self.name,
            "bytes": self.bytes,
            "seconds": self.elapsed.as_secs_f64(),
            "mib_per_s": null,
            "digest_alg": self.digest_alg.as_str(),
            "digest": null,
            "status": self.exit_code.as_str(),
            "exit_code": self.exit_code as u8,
            "reason": self.reason,
        })
    }
}

/// What the engine reports per file: acknowledged, or failed with a reason.
#[derive(Debug, Clone, Copy)]
pub enum FileEvent<'a> {
    Done(&'a FileReport),
    Failed(&'a FileFailure),
}

impl FileEvent<'_> {
    pub fn result_json(&self) -> serde_json::Value {
        match self {
            FileEvent::Done(r) => r.result_json(),
            FileEvent::Failed(f) => f.result_json(),
        }
    }
}

/// Sums per-file results into the final `--json` summary of a session.
#[derive(Debug, Clone, Default)]
pub struct Totals {
    /// Files acknowledged, and their bytes.
    pub files: u64,
    pub bytes: u64,
    pub failed: u64,
    /// Every file's HELLO-to-end time (acknowledged or not).
    pub file_time: Duration,
    /// The session's connection set-up (counted once).
    pub connect: Duration,
    /// Sums over the acknowledged files.
    pub mr_exchange: Duration,
    pub data: Duration,
    pub commit: Duration,
}

impl Totals {
    pub fn add(&mut self, event: FileEvent<'_>) {
        match event {
            FileEvent::Done(r) => {
                self.files += 1;
                self.bytes += r.bytes;
                self.file_time += r.elapsed;
                self.connect = self.connect.max(r.phases.connect);
                self.mr_exchange += r.phases.mr_exchange;
                self.data += r.phases.data;
                self.commit += r.phases.commit;
            }
            FileEvent::Failed(f) => {
                self.failed += 1;
                self.file_time += f.elapsed;
                self.connect = self.connect.max(f.connect);
            }
        }
    }

    /// The summary object: `seconds` is the connection set-up plus every
    /// file's HELLO-to-ACK time; `outcome` is the tool's final result.
    pub fn summary_json(&self, outcome: Result<(), &XferError>) -> serde_json::Value {
        let secs = (self.connect + self.file_time).as_secs_f64();
        let mut v = json!({
            "event": "summary",
            "files": self.files,
            "failed": self.failed,
            "bytes": self.bytes,
            "seconds": secs,
            "mib_per_s": mib_per_sec(self.bytes, secs),
            "phases": {
                "connect_s": self.connect.as_secs_f64(),
                "mr_exchange_s": self.mr_exchange.as_secs_f64(),
                "data_s": self.data.as_secs_f64(),
                "fsync_verify_s": self.commit.as_secs_f64(),
            },
        });
        let code = outcome.map_or_else(|e| e.exit_code(), |()| ExitCode::Ok);
        v["status"] = code.as_str().into();
        v["exit_code"] = (code as u8).into();
        if let Err(e) = outcome {
            v["reason"] = e.to_string().into();
        }
        v
    }
}

/// The summary for stderr: a line of text, or a JSON object when the logs
/// are JSON.
pub fn summary_for_log(report: &FileReport, json: bool) -> String {
    if json {
        report.summary_json().to_string()
    } else {
        report.summary_line()
    }
}

/// Totals of a session (printed for trees): how many files and
/// directories, how fast in files per second and MiB/s.
pub fn session_summary_line(outcome: &super::sender::SessionOutcome) -> String {
    let secs = outcome.elapsed.as_secs_f64();
    let bytes: u64 = outcome.files.iter().map(|f| f.bytes).sum();
    let files = outcome.files.len();
    let per_sec = if secs > 0.0 { files as f64 / secs } else { 0.0 };
    let mut line = format!(
        "total: {files} files and {} directories, {bytes} bytes in {secs:.3} s: {per_sec:.1} files/s, {:.1} MiB/s",
        outcome.directories,
        mib_per_sec(bytes, secs),
    );
    if outcome.skipped > 0 {
        line.push_str(&format!(
            "; {} links or special files skipped",
            outcome.skipped
        ));
    }
    line
}

/// The session totals for stderr: a line of text, or one JSON object.
pub fn session_summary(outcome: &super::sender::SessionOutcome, json: bool) -> String {
    if json {
        let secs = outcome.elapsed.as_secs_f64();
        let bytes: u64 = outcome.files.iter().map(|f| f.bytes).sum();
        let files = outcome.files.len();
        let line = serde_json::json!({
            "event": "session done",
            "files": files,
            "directories": outcome.directories,
            "skipped": outcome.skipped,
            "bytes": bytes,
            "seconds": secs,
            "files_per_s": if secs > 0.0 { files as f64 / secs } else { 0.0 },
            "mib_per_s": mib_per_sec(bytes, secs),
        });
        line.to_string()
    } else {
        session_summary_line(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(name: &str, bytes: u64, secs: f64) -> FileReport {
        FileReport {
            name: name.into(),
            bytes,
            elapsed: Duration::from_secs_f64(secs),
            digest: Digest::Crc32(0x0102_0a0b),
            phases: Phases {
                connect: Duration::from_millis(2),
                mr_exchange: Duration::from_millis(1),
                data: Duration::from_secs_f64(secs - 0.01),
                commit: Duration::from_millis(5),
            },
        }
    }

    #[test]
    fn result_objects() {
        let r = report("a.bin", 1 << 21, 2.0);
        let v = r.result_json();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "event",
                "name",
                "bytes",
                "seconds",
                "mib_per_s",
                "digest_alg",
                "digest",
                "status",
                "exit_code",
                "phases"
            ]
        );
        assert_eq!(v["name"], "a.bin");
        assert_eq!(v["mib_per_s"], 1.0);
        assert_eq!(v["digest"], "01020a0b");
        assert_eq!(v["status"], "ok");
        assert_eq!(v["phases"]["fsync_verify_s"], 0.005);
        let err = XferError::Rejected {
            code: "file exists",
            reason: "b.bin already exists".into(),
        };
        let f = FileFailure::new(
            "b.bin",
            7,
            DigestAlg::Sha256,
            Duration::from_millis(3),
            Duration::from_millis(2),
            &err,
            false,
        );
        let v = f.result_json();
        assert_eq!(v["status"], "rejected");
        assert_eq!(v["exit_code"], 4);
        assert_eq!(v["bytes"], 7);
        assert_eq!(v["digest_alg"], "sha256");
        assert!(v["digest"].is_null() && v["mib_per_s"].is_null());
        assert_eq!(
            v["reason"],
            "rejected by the receiver (file exists): b.bin already exists"
        );
        // One line each: what --json prints.
        assert!(!v.to_string().contains('\n'));
    }

    #[test]
    fn totals_sum_files_and_count_connect_once() {
        let mut t = Totals::default();
        let a = report("a", 1 << 20, 0.5);
        let b = report("b", 1 << 20, 0.5);
        let err = XferError::PeerLost("gone".into());
        let c = FileFailure::new(
            "c",
            9,
            DigestAlg::Crc32,
            Duration::from_millis(1000),
            Duration::from_millis(2),
            &err,
            true,
        );
        t.add(FileEvent::Done(&a));
        t.add(FileEvent::Done(&b));
        t.add(FileEvent::Failed(&c));
        let v = t.summary_json(Err(&err));
        assert_eq!(v["files"], 2);
        assert_eq!(v["failed"], 1);
        assert_eq!(v["bytes"], 2 << 20);
        assert_eq!(v["seconds"], 2.002);
        assert_eq!(v["phases"]["connect_s"], 0.002);
        assert_eq!(v["phases"]["mr_exchange_s"], 0.002);
        assert_eq!(v["status"], "timeout_or_peer_lost");
        assert_eq!(v["exit_code"], 7);
        assert_eq!(v["reason"], "peer lost: gone");
        let ok = Totals::default().summary_json(Ok(()));
        assert_eq!(
            (ok["status"].as_str(), ok["exit_code"].as_u64()),
            (Some("ok"), Some(0))
        );
        assert!(ok.get("reason").is_none());
        assert_eq!(ok["mib_per_s"], 0.0);
    }

    #[test]
    fn tree_session_summary() {
        let report = |bytes| FileReport {
            name: "t/f".into(),
            bytes,
            elapsed: Duration::from_millis(5),
            digest: Digest::Crc32(0),
            phases: Phases::default(),
        };
        let outcome = crate::engine::sender::SessionOutcome {
            files: vec![report(1000), report(48_576)],
            directories: 3,
            skipped: 2,
            elapsed: Duration::from_millis(500),
            first_error: None,
        };
        assert_eq!(
            session_summary(&outcome, false),
            "total: 2 files and 3 directories, 49576 bytes in 0.500 s: 4.0 files/s, 0.1 MiB/s; \
             2 links or special files skipped"
        );
        let v: serde_json::Value =
            serde_json::from_str(&session_summary(&outcome, true)).expect("JSON");
        assert_eq!(v["event"], "session done");
        assert_eq!(v["files"], 2);
        assert_eq!(v["directories"], 3);
        assert_eq!(v["files_per_s"], 4.0);
    }
}
