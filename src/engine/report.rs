//! Per-file results and the one-line summary each tool prints.

use super::digest::digest_hex;
use crate::proto::Digest;
use crate::units::mib_per_sec;
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
            match self.digest {
                Digest::Crc32(_) => "crc32",
                Digest::Sha256(_) => "sha256",
            },
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
            "digest_alg": match self.digest {
                Digest::Crc32(_) => "crc32",
                Digest::Sha256(_) => "sha256",
            },
            "digest": digest_hex(&self.digest),
            "phases": {
                "connect_s": self.phases.connect.as_secs_f64(),
                "mr_exchange_s": self.phases.mr_exchange.as_secs_f64(),
                "data_s": self.phases.data.as_secs_f64(),
                "fsync_verify_s": self.phases.commit.as_secs_f64(),
            },
        })
    }
}

/// Prints the summary on stderr (the tools' stdout stays free for data):
/// a line of text, or a JSON object when the logs are JSON.
pub fn print_summary(report: &FileReport, quiet: bool, json: bool) {
    if quiet {
        return;
    }
    if json {
        eprintln!("{}", report.summary_json());
    } else {
        eprintln!("{}", report.summary_line());
    }
}
