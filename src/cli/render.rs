//! How the tools show results: the per-file line on stderr (text, or a JSON
//! object with `--log-format json`), the `--json` objects on stdout (one per
//! file and a final summary) and a tree session's totals. The engine only
//! produces the data ([`FileReport`], [`FileFailure`], [`Totals`],
//! [`SessionOutcome`]); every byte of its presentation is decided here.

use crate::engine::sender::SessionOutcome;
use crate::engine::{FileEvent, FileFailure, FileReport, Listening, Outcome, Phases, Totals};
use crate::error::{ExitCode, XferError};
use crate::proto::{Digest, escaped};
use crate::units::{format_bytes, mib_per_sec};
use serde_json::json;
use std::time::Duration;

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// A digest as lowercase hex, without its algorithm.
fn digest_hex(d: &Digest) -> String {
    match d {
        Digest::Crc32(v) => format!("{v:08x}"),
        Digest::Sha256(b) => b.iter().map(|x| format!("{x:02x}")).collect(),
    }
}

/// A report's digest for JSON: its algorithm and hex, both null when
/// nothing was read.
fn digest_json(d: Option<&Digest>) -> (serde_json::Value, serde_json::Value) {
    match d {
        Some(d) => (d.alg().as_str().into(), digest_hex(d).into()),
        None => (serde_json::Value::Null, serde_json::Value::Null),
    }
}

/// The phases as a JSON object (seconds).
fn phases_json(p: &Phases) -> serde_json::Value {
    json!({
        "connect_s": p.connect.as_secs_f64(),
        "mr_exchange_s": p.mr_exchange.as_secs_f64(),
        "data_s": p.data.as_secs_f64(),
        "fsync_verify_s": p.commit.as_secs_f64(),
    })
}

/// The receiver's line once it is ready: where it listens, on which
/// device, and where files go. Text, or tracing's JSON shape. Without a
/// token it is a warning that starts with UNAUTHENTICATED and says who
/// may do what (`ansi`: the level in colour, as log lines have it).
pub fn listening_line(ready: &Listening, json: bool, ansi: bool) -> String {
    if json {
        let mut fields = json!({
            "tool": "receiver",
            "address": ready.bind.ip().to_string(),
            "port": ready.bind.port(),
            "device": ready.device.as_ref().map(|(name, _)| name),
            "device_port": ready.device.as_ref().map(|(_, port)| port),
            "devices": ready.devices,
            "output": ready.output_name,
            "authenticated": ready.unauthenticated.is_none(),
        });
        let Some(exposure) = &ready.unauthenticated else {
            return super::line::json_message(tracing::Level::INFO, "listening", fields);
        };
        fields["exposure"] = exposure.as_str().into();
        return super::line::json_message(
            tracing::Level::WARN,
            "listening UNAUTHENTICATED (--insecure)",
            fields,
        );
    }
    let device = match &ready.device {
        Some((name, port)) => format!("{name} port {port}"),
        None => format!("any RDMA device: {}", ready.devices.join(", ")),
    };
    let listening = format!("listening on {} ({device}), {}", ready.bind, ready.output);
    match &ready.unauthenticated {
        None => format!("receiver: {listening}"),
        Some(exposure) => format!(
            "{}UNAUTHENTICATED: {listening}; {exposure} (--insecure: no token; limit who may \
             connect with --allow)",
            super::line::text_prefix("receiver", tracing::Level::WARN, ansi)
        ),
    }
}

/// An acknowledged file's line of text on stderr: human sizes and its
/// digest; with -v (`phases`) also the time of each phase and exact bytes.
pub fn file_line(r: &FileReport, phases: bool) -> String {
    let secs = r.elapsed.as_secs_f64();
    let digest = match &r.digest {
        Some(d) => format!(" ({} {})", d.alg().as_str(), digest_hex(d)),
        None => String::new(),
    };
    let exact = if phases {
        format!(" ({} bytes)", r.bytes)
    } else {
        String::new()
    };
    let left = |why: &str| {
        format!(
            "{}: {}{exact}, {why}{digest}",
            escaped(&r.name),
            format_bytes(r.bytes)
        )
    };
    match r.outcome {
        Outcome::Unchanged if r.digest.is_some() => {
            return left("unchanged: the receiver has the same content");
        }
        Outcome::Unchanged => {
            return left("unchanged: the receiver has it with the same size and modification time");
        }
        Outcome::KeptExisting => {
            return left("kept: the receiver has a file by that name (--ignore-existing)");
        }
        Outcome::KeptNewer => return left("kept: the receiver's file is newer (--update)"),
        Outcome::Linked => return left("linked: the receiver had it under --link-dest"),
        Outcome::WouldSend => return left("would be sent (dry run)"),
        Outcome::PieceKept => return left("piece kept: its file is not whole yet"),
        Outcome::Stored | Outcome::Discarded | Outcome::Piped => {}
    }
    let resumed = if r.resumed_from > 0 {
        format!(
            ", {} sent (resumed from {})",
            format_bytes(r.moved()),
            format_bytes(r.resumed_from)
        )
    } else {
        String::new()
    };
    let mut line = format!(
        "{}: {}{exact}{resumed} in {}, {:.1} MiB/s{digest}",
        escaped(&r.name),
        format_bytes(r.bytes),
        format_secs(secs),
        mib_per_sec(r.moved(), secs),
    );
    match r.outcome {
        Outcome::Discarded => line.push_str(", discarded"),
        Outcome::Piped => line.push_str(", taken by the --exec command"),
        _ => {}
    }
    if phases {
        line.push_str(&format!(
            "; connect {}, MR {}, data {}, fsync+verify {}",
            ms(r.phases.connect),
            ms(r.phases.mr_exchange),
            ms(r.phases.data),
            ms(r.phases.commit),
        ));
    }
    line
}

/// "1 file", "2 files", "1 directory", "3 directories".
fn count(n: u64, what: &str) -> String {
    match (n, what.strip_suffix('y')) {
        (1, _) => format!("1 {what}"),
        (_, Some(stem)) => format!("{n} {stem}ies"),
        (_, None) => format!("{n} {what}s"),
    }
}

/// Seconds as a person reads them: "0.004 s", "5.8 s", "312 s".
fn format_secs(secs: f64) -> String {
    if secs < 1.0 {
        format!("{secs:.3} s")
    } else if secs < 100.0 {
        format!("{secs:.1} s")
    } else {
        format!("{secs:.0} s")
    }
}

/// An acknowledged file's line on stderr as one JSON object (for
/// `--log-format json`).
pub fn file_log_json(r: &FileReport) -> serde_json::Value {
    let secs = r.elapsed.as_secs_f64();
    json!({
        "event": "file done",
        "file": escaped(&r.name).to_string(),
        "bytes": r.bytes,
        "resumed_from": r.resumed_from,
        "skipped": r.outcome.left_as_is(),
        "outcome": r.outcome.as_str(),
        "seconds": secs,
        "mib_per_s": mib_per_sec(r.moved(), secs),
        "digest_alg": digest_json(r.digest.as_ref()).0,
        "digest": digest_json(r.digest.as_ref()).1,
        "phases": phases_json(&r.phases),
    })
}

/// The summary for stderr: a line of text, or a JSON object when the logs
/// are JSON.
pub fn summary_for_log(report: &FileReport, json: bool, phases: bool) -> String {
    if json {
        file_log_json(report).to_string()
    } else {
        file_line(report, phases)
    }
}

/// A failed file's line on stderr: text, or a JSON object when the logs
/// are JSON.
pub fn failure_for_log(f: &FileFailure, json: bool) -> String {
    if json {
        json!({
            "event": "file failed", "file": escaped(&f.name).to_string(),
            "exit_code": f.exit_code as u8, "message": f.reason,
        })
        .to_string()
    } else {
        // Only the sender prints these (the receiver logs its refusals).
        format!(
            "sender: error: {}: {}",
            escaped(&f.name),
            escaped(&f.reason)
        )
    }
}

/// An acknowledged file's result for `--json` (one line on stdout).
pub fn report_json(r: &FileReport) -> serde_json::Value {
    let secs = r.elapsed.as_secs_f64();
    json!({
        "event": "file",
        "name": r.name,
        "bytes": r.bytes,
        "resumed_from": r.resumed_from,
        "skipped": r.outcome.left_as_is(),
        "outcome": r.outcome.as_str(),
        "seconds": secs,
        "mib_per_s": mib_per_sec(r.moved(), secs),
        "digest_alg": digest_json(r.digest.as_ref()).0,
        "digest": digest_json(r.digest.as_ref()).1,
        "status": ExitCode::Ok.as_str(),
        "exit_code": ExitCode::Ok as u8,
        "phases": phases_json(&r.phases),
    })
}

/// A failed file's result for `--json` (one line on stdout).
pub fn failure_json(f: &FileFailure) -> serde_json::Value {
    json!({
        "event": "file",
        "name": f.name,
        "bytes": f.bytes,
        "resumed_from": null,
        "skipped": false,
        "outcome": "failed",
        "seconds": f.elapsed.as_secs_f64(),
        "mib_per_s": null,
        "digest_alg": f.digest_alg.as_str(),
        "digest": null,
        "status": f.exit_code.as_str(),
        "exit_code": f.exit_code as u8,
        "reason": f.reason,
        "reason_code": f.reason_code,
        "retryable": f.retryable,
    })
}

/// A file's result for `--json`, acknowledged or failed.
pub fn event_json(event: FileEvent<'_>) -> serde_json::Value {
    match event {
        FileEvent::Done(r) => report_json(r),
        FileEvent::Failed(f) => failure_json(f),
    }
}

/// The final `--json` summary object: `seconds` is the connection set-up
/// plus every file's HELLO-to-ACK time; `outcome` is the tool's final
/// result.
pub fn totals_json(t: &Totals, outcome: Result<(), &XferError>) -> serde_json::Value {
    let secs = (t.connect + t.file_time).as_secs_f64();
    let mut v = json!({
        "event": "summary",
        "files": t.files,
        "failed": t.failed,
        // `skipped`: as each file's, files left as the receiver had them.
        "skipped": t.unchanged + t.kept,
        "unchanged": t.unchanged,
        "kept": t.kept,
        "linked": t.linked,
        "discarded": t.discarded,
        "bytes": t.bytes,
        "sent": t.sent,
        "seconds": secs,
        "mib_per_s": mib_per_sec(t.sent, secs),
        "phases": {
            "connect_s": t.connect.as_secs_f64(),
            "mr_exchange_s": t.mr_exchange.as_secs_f64(),
            "data_s": t.data.as_secs_f64(),
            "fsync_verify_s": t.commit.as_secs_f64(),
        },
    });
    let code = outcome.map_or_else(|e| e.exit_code(), |()| ExitCode::Ok);
    v["status"] = code.as_str().into();
    v["exit_code"] = (code as u8).into();
    v["retryable"] = outcome.is_err_and(XferError::is_transient).into();
    if let Err(e) = outcome {
        v["reason"] = e.to_string().into();
        if let Some(code) = e.reason_code() {
            v["reason_code"] = code.into();
        }
    }
    v
}

/// Totals of a session (printed for trees): how many files and
/// directories, how fast in files per second and MiB/s.
pub fn session_summary_line(outcome: &SessionOutcome) -> String {
    let secs = outcome.elapsed.as_secs_f64();
    let bytes: u64 = outcome.files.iter().map(|f| f.bytes).sum();
    let sent: u64 = outcome.files.iter().map(FileReport::moved).sum();
    let files = outcome.files.len();
    let per_sec = if secs > 0.0 { files as f64 / secs } else { 0.0 };
    let mut line = format!(
        "total: {} and {}, {} in {}: {per_sec:.1} files/s, {:.1} MiB/s",
        count(files as u64, "file"),
        count(outcome.directories, "directory"),
        format_bytes(bytes),
        format_secs(secs),
        mib_per_sec(sent, secs),
    );
    let unchanged = outcome.count(Outcome::Unchanged);
    if unchanged > 0 {
        line.push_str(&format!("; {unchanged} unchanged (nothing sent)"));
    }
    let would = outcome.count(Outcome::WouldSend);
    if would > 0 {
        line.push_str(&format!("; {would} would be sent"));
    }
    let kept = outcome.count(Outcome::KeptExisting) + outcome.count(Outcome::KeptNewer);
    if kept > 0 {
        line.push_str(&format!("; {kept} kept (--ignore-existing, --update)"));
    }
    let linked = outcome.count(Outcome::Linked);
    if linked > 0 {
        line.push_str(&format!(
            "; {linked} linked (from the receiver's --link-dest)"
        ));
    }
    let resumed: Vec<&FileReport> = outcome
        .files
        .iter()
        .filter(|f| f.resumed_from > 0)
        .collect();
    if !resumed.is_empty() {
        let kept: u64 = resumed.iter().map(|f| f.resumed_from).sum();
        line.push_str(&format!(
            "; {} resumed ({} not sent again)",
            resumed.len(),
            format_bytes(kept)
        ));
    }
    if outcome.skipped > 0 {
        line.push_str(&format!(
            "; {} links or special files skipped",
            outcome.skipped
        ));
    }
    line
}

/// The session totals for stderr: a line of text, or one JSON object.
pub fn session_summary(outcome: &SessionOutcome, json: bool) -> String {
    if json {
        let secs = outcome.elapsed.as_secs_f64();
        let bytes: u64 = outcome.files.iter().map(|f| f.bytes).sum();
        let sent: u64 = outcome.files.iter().map(FileReport::moved).sum();
        let files = outcome.files.len();
        let line = json!({
            "event": "session done",
            "files": files,
            "directories": outcome.directories,
            // Links and special files left out of trees (as before
            // resuming existed); files the receiver had complete apart.
            "skipped": outcome.skipped,
            // `already_complete` as before: files the receiver had.
            "already_complete": outcome.count(Outcome::Unchanged),
            "unchanged": outcome.count(Outcome::Unchanged),
            "kept": outcome.count(Outcome::KeptExisting) + outcome.count(Outcome::KeptNewer),
            "would_send": outcome.count(Outcome::WouldSend),
            "linked": outcome.count(Outcome::Linked),
            "resumed_bytes": outcome.files.iter().map(|f| f.resumed_from).sum::<u64>(),
            "bytes": bytes,
            "seconds": secs,
            "sent": sent,
            "files_per_s": if secs > 0.0 { files as f64 / secs } else { 0.0 },
            "mib_per_s": mib_per_sec(sent, secs),
        });
        line.to_string()
    } else {
        session_summary_line(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::DigestAlg;

    fn report(name: &str, bytes: u64, secs: f64) -> FileReport {
        FileReport {
            name: name.into(),
            bytes,
            elapsed: Duration::from_secs_f64(secs),
            digest: Some(Digest::Crc32(0x0102_0a0b)),
            phases: Phases {
                connect: Duration::from_millis(2),
                mr_exchange: Duration::from_millis(1),
                data: Duration::from_secs_f64(secs - 0.01),
                commit: Duration::from_millis(5),
            },
            resumed_from: 0,
            outcome: Outcome::Stored,
            host: None,
        }
    }

    #[test]
    fn result_objects() {
        let r = report("a.bin", 1 << 21, 2.0);
        let v = report_json(&r);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "event",
                "name",
                "bytes",
                "resumed_from",
                "skipped",
                "outcome",
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
            code: Some(crate::proto::RejectCode::Exists),
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
        let v = failure_json(&f);
        assert_eq!(v["status"], "rejected");
        assert_eq!(v["exit_code"], 4);
        assert_eq!(v["reason_code"], "exists");
        assert_eq!(v["retryable"], false);
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
        let v = totals_json(&t, Err(&err));
        assert_eq!(v["files"], 2);
        assert_eq!(v["failed"], 1);
        assert_eq!(v["bytes"], 2 << 20);
        assert_eq!(v["seconds"], 2.002);
        assert_eq!(v["phases"]["connect_s"], 0.002);
        assert_eq!(v["phases"]["mr_exchange_s"], 0.002);
        assert_eq!(v["status"], "timeout_or_peer_lost");
        assert_eq!(v["exit_code"], 7);
        assert_eq!(v["retryable"], true);
        assert!(v.get("reason_code").is_none());
        assert_eq!(v["reason"], "peer lost: gone");
        let ok = totals_json(&Totals::default(), Ok(()));
        assert_eq!(
            (ok["status"].as_str(), ok["exit_code"].as_u64()),
            (Some("ok"), Some(0))
        );
        assert!(ok.get("reason").is_none());
        assert_eq!(ok["mib_per_s"], 0.0);
    }

    /// Names from the disk or the peer are shown escaped on stderr (text
    /// and JSON logs; bars take the same), exactly in `--json` results.
    #[test]
    fn names_in_lines_and_logs_are_escaped() {
        let name = "evil\u{202e}txt.exe\u{200b}\u{2028}\u{1b}[31m";
        let shown = "evil\\u{202e}txt.exe\\u{200b}\\u{2028}\\u{1b}[31m";
        let r = report(name, 10, 1.0);
        assert!(file_line(&r, false).starts_with(&format!("{shown}: ")));
        let log: serde_json::Value =
            serde_json::from_str(&summary_for_log(&r, true, false)).unwrap();
        assert_eq!(log["file"], shown);
        assert_eq!(report_json(&r)["name"], name);
        let err = XferError::Rejected {
            code: Some(crate::proto::RejectCode::BadName),
            reason: "names starting with '.' are refused".into(),
        };
        let f = FileFailure::new(
            name,
            9,
            DigestAlg::Crc32,
            Duration::ZERO,
            Duration::ZERO,
            &err,
            false,
        );
        let line = failure_for_log(&f, false);
        assert!(
            line.starts_with(&format!("sender: error: {shown}: ")),
            "{line}"
        );
        assert!(
            line.ends_with("names starting with '.' are refused"),
            "{line}"
        );
        let log: serde_json::Value = serde_json::from_str(&failure_for_log(&f, true)).unwrap();
        assert_eq!(log["file"], shown);
        assert_eq!(failure_json(&f)["name"], name);
    }

    /// With a token: an info line, hidden by -q (see `Ui::listening`).
    /// Without: a warning starting UNAUTHENTICATED that says who may do
    /// what, in text and in JSON.
    #[test]
    fn listening_lines() {
        let mut ready = Listening {
            bind: "10.0.0.1:7471".parse().unwrap(),
            device: Some(("rxe0".into(), 1)),
            devices: vec!["rxe0".into()],
            output: "writing to /in".into(),
            output_name: "/in".into(),
            unauthenticated: None,
        };
        assert_eq!(
            listening_line(&ready, false, false),
            "receiver: listening on 10.0.0.1:7471 (rxe0 port 1), writing to /in"
        );
        let v: serde_json::Value =
            serde_json::from_str(&listening_line(&ready, true, false)).unwrap();
        assert_eq!(
            (v["level"].as_str(), v["fields"]["message"].as_str()),
            (Some("INFO"), Some("listening"))
        );
        assert_eq!(v["fields"]["authenticated"], true);
        ready.unauthenticated = Some("anyone who can reach this port may write into /in".into());
        assert_eq!(
            listening_line(&ready, false, false),
            "receiver: warning: UNAUTHENTICATED: listening on 10.0.0.1:7471 (rxe0 port 1), \
             writing to /in; anyone who can reach this port may write into /in (--insecure: no \
             token; limit who may connect with --allow)"
        );
        let v: serde_json::Value =
            serde_json::from_str(&listening_line(&ready, true, false)).unwrap();
        assert_eq!(v["level"], "WARN");
        assert!(
            v["fields"]["message"]
                .as_str()
                .unwrap()
                .contains("UNAUTHENTICATED"),
            "{v}"
        );
        assert_eq!(v["fields"]["authenticated"], false);
        assert_eq!(
            v["fields"]["exposure"],
            "anyone who can reach this port may write into /in"
        );
    }

    #[test]
    fn tree_session_summary() {
        let report = |bytes| FileReport {
            name: "t/f".into(),
            bytes,
            elapsed: Duration::from_millis(5),
            digest: Some(Digest::Crc32(0)),
            phases: Phases::default(),
            resumed_from: 0,
            outcome: Outcome::Stored,
            host: None,
        };
        let outcome = SessionOutcome {
            files: vec![report(1000), report(48_576)],
            directories: 3,
            skipped: 2,
            elapsed: Duration::from_millis(500),
            first_error: None,
        };
        assert_eq!(
            session_summary(&outcome, false),
            "total: 2 files and 3 directories, 48.4 KiB in 0.500 s: 4.0 files/s, 0.1 MiB/s; \
             2 links or special files skipped"
        );
        let v: serde_json::Value =
            serde_json::from_str(&session_summary(&outcome, true)).expect("JSON");
        assert_eq!(v["event"], "session done");
        assert_eq!(v["files"], 2);
        assert_eq!(v["directories"], 3);
        assert_eq!(v["files_per_s"], 4.0);
        assert_eq!(count(1, "directory"), "1 directory");
        assert_eq!(count(0, "directory"), "0 directories");
        assert_eq!(count(1, "file"), "1 file");
        assert_eq!(count(41, "file"), "41 files");
    }
    #[test]
    fn stderr_lines() {
        let r = report("a.bin", 1 << 21, 2.0);
        // Human sizes by default; exact bytes and the phases with -v.
        assert_eq!(
            summary_for_log(&r, false, false),
            "a.bin: 2.0 MiB in 2.0 s, 1.0 MiB/s (crc32 01020a0b)"
        );
        assert_eq!(
            summary_for_log(&r, false, true),
            "a.bin: 2.0 MiB (2097152 bytes) in 2.0 s, 1.0 MiB/s (crc32 01020a0b); \
             connect 2.0 ms, MR 1.0 ms, data 1990.0 ms, fsync+verify 5.0 ms"
        );
        let mut big = report("model.safetensors", 4 << 30, 5.81);
        big.elapsed = Duration::from_secs_f64(5.81);
        assert_eq!(
            file_line(&big, false),
            "model.safetensors: 4.0 GiB in 5.8 s, 705.0 MiB/s (crc32 01020a0b)"
        );
        big.elapsed = Duration::from_millis(4);
        assert!(file_line(&big, false).contains(" in 0.004 s, "));
        big.elapsed = Duration::from_secs(312);
        assert!(file_line(&big, false).contains(" in 312 s, "));
        let v: serde_json::Value = serde_json::from_str(&summary_for_log(&r, true, false)).unwrap();
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        assert_eq!(
            keys,
            [
                "event",
                "file",
                "bytes",
                "resumed_from",
                "skipped",
                "outcome",
                "seconds",
                "mib_per_s",
                "digest_alg",
                "digest",
                "phases"
            ]
        );
        assert_eq!(v["event"], "file done");
        // A resumed file: its rate counts only what was sent.
        let mut resumed = r.clone();
        resumed.resumed_from = 1 << 20;
        assert_eq!(
            file_line(&resumed, false),
            "a.bin: 2.0 MiB, 1.0 MiB sent (resumed from 1.0 MiB) in 2.0 s, 0.5 MiB/s \
             (crc32 01020a0b)"
        );
        assert_eq!(report_json(&resumed)["resumed_from"], 1 << 20);
        assert_eq!(report_json(&resumed)["mib_per_s"], 0.5);
        let mut skipped = r.clone();
        skipped.outcome = Outcome::Unchanged;
        assert_eq!(
            file_line(&skipped, false),
            "a.bin: 2.0 MiB, unchanged: the receiver has the same content (crc32 01020a0b)"
        );
        assert_eq!(report_json(&skipped)["skipped"], true);
        assert_eq!(report_json(&skipped)["mib_per_s"], 0.0);
        let mut sha = r.clone();
        sha.digest = Some(Digest::Sha256([0xab; 32]));
        assert!(file_line(&sha, false).contains(&format!("(sha256 {})", "ab".repeat(32))));
        let err = XferError::Integrity("crc mismatch".into());
        let f = FileFailure::new(
            "c.bin",
            1,
            DigestAlg::Crc32,
            Duration::ZERO,
            Duration::ZERO,
            &err,
            false,
        );
        assert_eq!(
            failure_for_log(&f, false),
            "sender: error: c.bin: integrity check failed: crc mismatch"
        );
        assert_eq!(
            failure_for_log(&f, true),
            r#"{"event":"file failed","file":"c.bin","exit_code":5,"message":"integrity check failed: crc mismatch"}"#
        );
    }
}
