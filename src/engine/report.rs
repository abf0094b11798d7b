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
}

impl FileReport {
    pub fn summary_line(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        format!(
            "{}: {} bytes in {:.3} s, {:.1} MiB/s ({} {})",
            self.name,
            self.bytes,
            secs,
            mib_per_sec(self.bytes, secs),
            match self.digest {
                Digest::Crc32(_) => "crc32",
                Digest::Sha256(_) => "sha256",
            },
            digest_hex(&self.digest)
        )
    }
}

/// Prints the summary line on stderr (the tools' stdout stays free for data).
pub fn print_summary(report: &FileReport, quiet: bool) {
    if !quiet {
        eprintln!("{}", report.summary_line());
    }
}
