//! What the tools show while and after they work: progress bars on stderr
//! when it is a terminal (indicatif; the engine only calls the
//! [`Progress`] observer), the per-file lines on stderr, and the `--json`
//! results on stdout. Everything written to stderr (log lines included, see
//! [`Ui::log_writer`]) goes around the bars so that they never tear.

use super::log_progress::LogProgress;
use super::render::{event_json, failure_for_log, listening_line, summary_for_log, totals_json};
use super::{CommonArgs, LogFormat};
use crate::engine::{FileEvent, FileProgress, Listening, Progress, Totals};
use crate::error::XferError;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::{self, IsTerminal, Write};
use std::sync::{Arc, Mutex, PoisonError};

/// The tools' output, shared by all session threads.
pub struct Ui {
    bars: Option<Arc<Bars>>,
    /// Without bars: a progress line every `--stats`.
    log_progress: Option<Arc<LogProgress>>,
    /// `--json`: results on stdout.
    json: bool,
    /// `-q`: no per-file lines on stderr.
    quiet: bool,
    /// `-v`: the per-file lines carry the phases too.
    verbose: bool,
    /// `--log-format json`: the per-file lines are JSON objects too.
    log_json: bool,
    /// Print a line on stderr for each file that failed (the sender; the
    /// receiver logs its refusals anyway).
    print_failures: bool,
    /// `receiver --ssh-session`: say where it listens on stdout, for the
    /// sender that started it.
    ready_line: bool,
    /// With it: scp's PATH is no directory here (`--ssh-path`).
    path_names_file: bool,
    /// `sender --dry-run`: every `--json` record says so, and so does the
    /// summary line.
    dry_run: bool,
    totals: Mutex<Totals>,
}

impl Ui {
    /// Bars only when stderr is a terminal (or with `--progress`), and
    /// neither `-q` nor JSON logs; otherwise (not with `-q`) progress
    /// lines, with `--stats`.
    pub fn new(common: &CommonArgs, print_failures: bool) -> Self {
        let terminal = io::stderr().is_terminal();
        let bars = ((terminal || common.progress)
            && !common.quiet
            && common.log_format == LogFormat::Text)
            .then(|| Arc::new(Bars::new(!terminal)));
        let log_json = common.log_format == LogFormat::Json;
        let log_progress = common
            .stats
            .filter(|_| bars.is_none() && !common.quiet)
            .map(|every| {
                let print = Box::new(|line: &str| {
                    let _ = io::stderr()
                        .lock()
                        .write_all(format!("{line}\n").as_bytes());
                });
                Arc::new(LogProgress::new(every, log_json, print))
            });
        Ui {
            bars,
            log_progress,
            json: common.json,
            quiet: common.quiet,
            verbose: common.verbose > 0,
            log_json: common.log_format == LogFormat::Json,
            print_failures,
            ready_line: false,
            path_names_file: false,
            dry_run: false,
            totals: Mutex::new(Totals::default()),
        }
    }

    /// Prints the ready line of `engine::remote` on stdout once listening;
    /// per-file and listening lines are the sender's to show, so none
    /// here (warnings and errors still go to stderr, to the sender).
    /// `path_names_file`: the line says that scp's PATH names the file.
    pub fn with_ready_line(mut self, path_names_file: bool) -> Self {
        self.ready_line = true;
        self.path_names_file = path_names_file;
        self.quiet = true;
        self.log_progress = None;
        self
    }

    /// `sender --dry-run`: the records and the summary line say so.
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// A session's summary line (`render::session_summary`) as shown: a
    /// dry run's says that nothing was written.
    pub fn summary_line(&self, line: String) -> String {
        if self.dry_run && !self.log_json {
            format!("dry run, nothing sent or written: {line}")
        } else {
            line
        }
    }

    /// `-q`: errors only.
    pub fn quiet(&self) -> bool {
        self.quiet
    }

    /// `--log-format json`.
    pub fn log_json(&self) -> bool {
        self.log_json
    }

    /// Whether progress bars are drawn.
    pub fn has_bars(&self) -> bool {
        self.bars.is_some()
    }

    /// Prints a line on stderr (above the bars, if any).
    pub fn eprintln(&self, line: &str) {
        // One write per line (stderr is unbuffered): a thousand small
        // files print a thousand lines.
        let print = || {
            let _ = io::stderr()
                .lock()
                .write_all(format!("{line}\n").as_bytes());
        };
        match &self.bars {
            Some(b) => b.multi.suspend(print),
            None => print(),
        }
    }

    /// A `MakeWriter` for tracing: log lines go to stderr around the bars.
    pub fn log_writer(&self) -> impl Fn() -> LogWriter + Send + Sync + 'static {
        let multi = self.bars.as_ref().map(|b| b.multi.clone());
        move || LogWriter {
            multi: multi.clone(),
        }
    }

    /// Handles one file's result: its line on stderr, its `--json` object
    /// on stdout, and the totals.
    pub fn file_event(&self, event: FileEvent<'_>) {
        self.file_event_from(None, event);
    }

    /// As `file_event`, for a file sent to `host` (the one-command form):
    /// its `--json` object carries `host`, and with `host.labelled` its
    /// line on stderr says it too.
    pub fn file_event_from(&self, host: Option<&HostLabel>, event: FileEvent<'_>) {
        // A host of a relay chain: each file's line and record say which.
        let relayed = match event {
            FileEvent::Done(r) => r.host.as_ref(),
            FileEvent::Failed(f) => f.host.as_ref(),
        }
        .map(|host| HostLabel {
            host: host.clone(),
            labelled: true,
        });
        let host = relayed.as_ref().or(host);
        self.totals
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .add(event);
        let line = match event {
            FileEvent::Done(report) if !self.quiet => {
                Some(summary_for_log(report, self.log_json, self.verbose))
            }
            FileEvent::Failed(f) if self.print_failures && !f.session_ended => {
                // An error: shown even with -q. One that ends the session is
                // the tool's final error, printed once at exit.
                Some(failure_for_log(f, self.log_json))
            }
            _ => None,
        };
        if let Some(line) = line {
            match host.filter(|h| h.labelled) {
                Some(h) => self.eprintln(&h.label_line(&line, self.log_json)),
                None => self.eprintln(&line),
            }
        }
        if self.json {
            let mut value = event_json(event);
            if let Some(h) = host {
                value = h.label_json(value);
            }
            self.print_json(&value);
        }
    }

    /// `--json`'s record of a lane lost.
    fn lane_down_record(lane: u64, why: &str) -> serde_json::Value {
        serde_json::json!({
            "event": "lane down",
            "lane": lane,
            "reason": why,
        })
    }

    /// With `--json`, one record for a target of the one-command form
    /// once it is done: its host, status and exit code (and why it failed):
    /// a host that failed before any file is in the results too.
    pub fn target_ended(&self, host: &str, result: Result<(), &XferError>) {
        if !self.json {
            return;
        }
        let code = result.map_or_else(|e| e.exit_code(), |()| crate::error::ExitCode::Ok);
        let mut record = serde_json::json!({
            "host": host,
            "event": "target",
            "status": code.as_str(),
            "exit_code": code as u8,
        });
        if let (Err(e), Some(fields)) = (result, record.as_object_mut()) {
            fields.insert("retryable".into(), e.is_transient().into());
            fields.insert("reason".into(), e.to_string().into());
        }
        self.print_json(&record);
    }

    /// Files reported so far (acknowledged and failed), and how many of
    /// them failed.
    pub fn file_counts(&self) -> (u64, u64) {
        let t = self.totals.lock().unwrap_or_else(PoisonError::into_inner);
        (t.files + t.failed, t.failed)
    }

    /// Clears the bars (call before the final error is printed).
    pub fn finish(&self) {
        if let Some(b) = &self.bars {
            b.clear();
        }
    }

    /// With `--json`, the summary object of everything reported so far and
    /// the tool's `outcome`, on stdout.
    pub fn print_json_summary(&self, outcome: Result<(), &XferError>) {
        if self.json {
            let totals = self
                .totals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            self.print_json(&totals_json(&totals, outcome));
        }
    }
}

impl Ui {
    /// One JSON object per line on stdout, flushed at once so that a script
    /// can follow it (around the bars, in case stdout is the same terminal).
    /// A closed stdout (`| head -1`) is not an error of the transfer.
    fn print_json(&self, value: &serde_json::Value) {
        let mut value = value.clone();
        if self.dry_run
            && let Some(record) = value.as_object_mut()
        {
            record.insert("dry_run".into(), true.into());
        }
        let value = &value;
        let print = || {
            let mut out = io::stdout().lock();
            let _ = writeln!(out, "{value}").and_then(|()| out.flush());
        };
        match &self.bars {
            Some(b) => b.multi.suspend(print),
            None => print(),
        }
    }
}

impl Progress for Ui {
    fn planned(&self, files: u64, bytes: u64) {
        if let Some(b) = &self.bars {
            b.plan(files, bytes);
        }
        if let Some(log) = &self.log_progress {
            log.plan(files, bytes);
        }
    }

    fn file_started(&self, name: &str, size: u64) -> Box<dyn FileProgress> {
        self.batch_started(name, size, 1)
    }

    fn lane_down(&self, lane: u64, why: &str) {
        if self.json {
            self.print_json(&Ui::lane_down_record(lane, why));
        }
    }

    fn batch_started(&self, name: &str, size: u64, files: u64) -> Box<dyn FileProgress> {
        match (&self.bars, &self.log_progress) {
            (Some(b), _) => Box::new(b.start(name, size, files)),
            (None, Some(log)) => log.start(files),
            (None, None) => crate::engine::NoProgress.file_started(name, size),
        }
    }

    /// The listening line; an unauthenticated receiver's is a warning
    /// that -q does not hide (nobody should run one unawares).
    fn listening(&self, ready: &Listening) {
        if self.ready_line {
            let mut out = io::stdout().lock();
            let line = crate::engine::remote::ready_line(crate::engine::remote::Ready {
                addr: ready.bind,
                path_names_file: self.path_names_file,
            });
            if let Err(e) = writeln!(out, "{line}").and_then(|()| out.flush()) {
                tracing::warn!("cannot tell the sender where to connect: {e}");
            }
        }
        if self.quiet && ready.unauthenticated.is_none() {
            return;
        }
        let ansi = super::line::colours_on_stderr();
        self.eprintln(&listening_line(ready, self.log_json, ansi));
    }
}

/// A target's error without its host in front (the line adds it).
pub fn strip_host(e: &XferError, host: &str) -> String {
    let text = e.to_string();
    match text.strip_prefix(&format!("{host}: ")) {
        Some(rest) => rest.to_string(),
        None => text,
    }
}

/// Which host a file went to, in the one-command form.
#[derive(Debug, Clone)]
pub struct HostLabel {
    pub host: String,
    /// Several targets: text lines say the host too (JSON always does).
    pub labelled: bool,
}

impl HostLabel {
    /// A line on stderr with the host: `sender: error: HOST: ...`,
    /// `HOST: NAME: ...`, or a JSON log line with a `host` field.
    pub fn label_line(&self, line: &str, log_json: bool) -> String {
        if log_json {
            return match serde_json::from_str::<serde_json::Value>(line) {
                Ok(v) => self.label_json(v).to_string(),
                Err(_) => line.to_string(),
            };
        }
        let host = crate::proto::escaped(&self.host);
        for prefix in ["sender: error: ", "sender: warning: "] {
            if let Some(rest) = line.strip_prefix(prefix) {
                return format!("{prefix}{host}: {rest}");
            }
        }
        format!("{host}: {line}")
    }

    /// A JSON object with `host` first.
    pub fn label_json(&self, value: serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(fields) => {
                let mut out = serde_json::Map::new();
                out.insert("host".into(), self.host.clone().into());
                out.extend(fields.into_iter().filter(|(k, _)| k != "host"));
                serde_json::Value::Object(out)
            }
            other => other,
        }
    }
}

/// The observer of one target's transfer: its bars say the host when
/// there are several targets.
pub struct HostProgress {
    pub ui: std::sync::Arc<Ui>,
    pub label: HostLabel,
}

impl HostProgress {
    fn name(&self, name: &str) -> String {
        if self.label.labelled {
            format!("{}: {name}", crate::proto::escaped(&self.label.host))
        } else {
            name.to_string()
        }
    }
}

impl Progress for HostProgress {
    fn planned(&self, files: u64, bytes: u64) {
        // Several targets: the overall bar grows as files start instead.
        if !self.label.labelled {
            self.ui.planned(files, bytes);
        }
    }

    fn file_started(&self, name: &str, size: u64) -> Box<dyn FileProgress> {
        self.ui.file_started(&self.name(name), size)
    }

    fn batch_started(&self, name: &str, size: u64, files: u64) -> Box<dyn FileProgress> {
        self.ui.batch_started(&self.name(name), size, files)
    }

    fn listening(&self, _ready: &Listening) {}

    fn lane_down(&self, lane: u64, why: &str) {
        if !self.label.labelled {
            return self.ui.lane_down(lane, why);
        }
        if self.ui.json {
            let record = self.label.label_json(Ui::lane_down_record(lane, why));
            self.ui.print_json(&record);
        }
    }
}

/// Writes one formatted log event to stderr, suspending the bars meanwhile.
pub struct LogWriter {
    multi: Option<MultiProgress>,
}

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let write = || io::stderr().lock().write_all(buf);
        match &self.multi {
            Some(m) => m.suspend(write)?,
            None => write()?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        io::stderr().flush()
    }
}

/// The bars: one per file being transferred, and an overall bar below them
/// (the sender's covers the planned files; the receiver's every file
/// started so far, across its sessions).
struct Bars {
    multi: MultiProgress,
    overall: Mutex<Overall>,
}

struct Overall {
    bar: Option<ProgressBar>,
    /// Files planned (sender) or started (receiver), and finished so far.
    files: u64,
    done: u64,
    planned: bool,
}

const FILE_TEMPLATE: &str = "{prefix:24!} [{wide_bar}] {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} ETA {eta:>3}";
const OVERALL_TEMPLATE: &str = "{prefix:24!} [{wide_bar}] {bytes:>10}/{total_bytes:<10} {binary_bytes_per_sec:>12} ETA {eta:>3}";

fn style(template: &str) -> ProgressStyle {
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ")
}

impl Bars {
    /// `forced`: stderr is not a terminal but bars were asked for.
    fn new(forced: bool) -> Self {
        let target = if forced {
            ProgressDrawTarget::term_like(Box::new(ForcedStderr))
        } else {
            ProgressDrawTarget::stderr()
        };
        Bars {
            multi: MultiProgress::with_draw_target(target),
            overall: Mutex::new(Overall {
                bar: None,
                files: 0,
                done: 0,
                planned: false,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Overall> {
        self.overall.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn overall_bar(&self, o: &mut Overall) -> ProgressBar {
        o.bar
            .get_or_insert_with(|| {
                self.multi
                    .add(ProgressBar::new(0).with_style(style(OVERALL_TEMPLATE)))
            })
            .clone()
    }

    fn plan(&self, files: u64, bytes: u64) {
        let mut o = self.lock();
        let bar = self.overall_bar(&mut o);
        bar.set_length(bytes);
        o.files = files;
        o.planned = true;
        bar.set_prefix(overall_prefix(&o));
    }

    fn start(self: &Arc<Self>, name: &str, size: u64, files: u64) -> FileBar {
        let mut o = self.lock();
        let overall = self.overall_bar(&mut o);
        if !o.planned {
            o.files += files;
            overall.inc_length(size);
        }
        overall.set_prefix(overall_prefix(&o));
        let bar = ProgressBar::new(size)
            .with_style(style(FILE_TEMPLATE))
            .with_prefix(crate::proto::escaped(name).to_string());
        let bar = self.multi.insert_before(&overall, bar);
        FileBar {
            bars: Arc::clone(self),
            overall,
            bar,
            size,
            files,
            done: 0,
            ok: false,
        }
    }

    fn file_ended(&self, overall: &ProgressBar, unsent: u64, files: u64) {
        let mut o = self.lock();
        o.done += files;
        overall.dec_length(unsent);
        overall.set_prefix(overall_prefix(&o));
    }

    fn clear(&self) {
        let mut o = self.lock();
        if let Some(bar) = o.bar.take() {
            bar.finish_and_clear();
            self.multi.remove(&bar);
        }
        let _ = self.multi.clear();
    }
}

fn overall_prefix(o: &Overall) -> String {
    format!("total: {}/{} files", o.done, o.files)
}

/// One file's bar; gone from the screen when dropped. A file that failed
/// takes its unsent bytes out of the overall bar.
struct FileBar {
    bars: Arc<Bars>,
    overall: ProgressBar,
    bar: ProgressBar,
    size: u64,
    /// Files it stands for (a batch: many).
    files: u64,
    done: u64,
    ok: bool,
}

impl FileProgress for FileBar {
    fn advance(&mut self, bytes: u64) {
        self.done += bytes;
        // A stream's size is unknown (0) until its end; a file may grow.
        if self.done > self.size {
            let more = self.done - self.size;
            self.size = self.done;
            self.bar.set_length(self.size);
            self.overall.inc_length(more);
        }
        self.bar.inc(bytes);
        self.overall.inc(bytes);
    }

    fn finished(&mut self) {
        self.ok = true;
    }
}

impl Drop for FileBar {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
        self.bars.multi.remove(&self.bar);
        let unsent = if self.ok {
            0
        } else {
            self.size.saturating_sub(self.done)
        };
        self.bars.file_ended(&self.overall, unsent, self.files);
    }
}

/// stderr as a terminal for `--progress` where it is none (indicatif hides
/// bars there): ANSI cursor moves, the width from $COLUMNS (else 80).
#[derive(Debug)]
struct ForcedStderr;

impl ForcedStderr {
    fn put(&self, s: &str) -> io::Result<()> {
        io::stderr().lock().write_all(s.as_bytes())
    }
}

impl indicatif::TermLike for ForcedStderr {
    fn width(&self) -> u16 {
        std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .filter(|&w| w >= 40)
            .unwrap_or(80)
    }

    fn move_cursor_up(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            Ok(())
        } else {
            self.put(&format!("\x1b[{n}A"))
        }
    }

    fn move_cursor_down(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            Ok(())
        } else {
            self.put(&format!("\x1b[{n}B"))
        }
    }

    fn move_cursor_right(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            Ok(())
        } else {
            self.put(&format!("\x1b[{n}C"))
        }
    }

    fn move_cursor_left(&self, n: usize) -> io::Result<()> {
        if n == 0 {
            Ok(())
        } else {
            self.put(&format!("\x1b[{n}D"))
        }
    }

    fn write_line(&self, s: &str) -> io::Result<()> {
        self.put(&format!("{s}\n"))
    }

    fn write_str(&self, s: &str) -> io::Result<()> {
        self.put(s)
    }

    fn clear_line(&self) -> io::Result<()> {
        self.put("\r\x1b[2K")
    }

    fn flush(&self) -> io::Result<()> {
        io::stderr().flush()
    }
}
