//! From parsed arguments to what the engine runs: each tool's checks (all
//! problems at once), the sender's plan (direct, or the one-command form
//! over ssh) and the receiver's configuration.

use super::{CommonArgs, DEFAULT_PORT, ReceiverArgs, SenderArgs, Verify};
use crate::cli::resolve;
use crate::engine::filter::Filter;
use crate::engine::fit::Given;
use crate::engine::receiver::{Output, ReceiverConfig};
use crate::engine::remote::{LaunchOptions, Target};
use crate::engine::sender::SenderConfig;
use crate::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, DEFAULT_SLOTS, check_buffers, entries};
use crate::error::{Problems, XferError};
use crate::proto::{DigestAlg, NameRules, Token, WhenExisting, validate_path};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest `--timeout` accepted: deadlines are computed as "now + timeout",
/// which must not overflow, and a week without progress is already no
/// timeout at all.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

impl CommonArgs {
    /// Checks the options both tools share (the token is loaded separately,
    /// see [`CommonArgs::token`]).
    fn check(&self) -> Result<(), XferError> {
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(XferError::Usage(format!(
                "--timeout must be between 1 and {} seconds, got {}",
                MAX_TIMEOUT.as_secs(),
                self.timeout.as_secs()
            )));
        }
        Ok(())
    }
}

/// A port to connect to or listen on: 0 would mean "any port", which no
/// sender could find.
fn check_port(port: u16) -> Result<(), XferError> {
    if port == 0 {
        return Err(XferError::Usage(
            "--port must be between 1 and 65535".into(),
        ));
    }
    Ok(())
}

/// The sender's ADDR as host and port, as ssh and scp users write it:
/// `host`, `host:port`, `10.0.0.1:7471`, `[fd00::1]:7471`, `[fd00::1]` or
/// a bare IPv6 address. `host:/path` (scp's remote path) is refused with
/// what to do instead: the receiver decides where files go.
pub fn parse_addr(addr: &str) -> Result<(String, Option<u16>), XferError> {
    let a = addr.trim();
    if a.is_empty() {
        return Err(XferError::Usage("the receiver's address is empty".into()));
    }
    let port = |p: &str| match p.parse::<u16>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(XferError::Usage(format!(
            "{addr:?}: the port must be a number between 1 and 65535"
        ))),
    };
    // ssh's user@host: nobody logs in anywhere here.
    if !a.starts_with('[')
        && let Some((user, rest)) = a.split_once('@')
    {
        return Err(XferError::Usage(format!(
            "{addr:?}: a running receiver is given by its address alone (sender {rest} FILE...); \
             to log in as {user} and start one there, put the target last: sender FILE... \
             {user}@{rest}:DIR"
        )));
    }
    if let Some(rest) = a.strip_prefix('[') {
        let Some((host, after)) = rest.split_once(']') else {
            return Err(XferError::Usage(format!(
                "{addr:?}: an IPv6 address in brackets needs its closing `]`"
            )));
        };
        return match after {
            "" => Ok((host.to_string(), None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((host.to_string(), port(p)?)),
                None => Err(XferError::Usage(format!(
                    "{addr:?}: expected [IPV6] or [IPV6]:PORT"
                ))),
            },
        };
    }
    match a.split_once(':') {
        // More than one colon and no brackets: an IPv6 address, no port.
        Some((_, rest)) if rest.contains(':') => Ok((a.to_string(), None)),
        Some((host, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => {
            Ok((host.to_string(), port(p)?))
        }
        Some((host, path)) => Err(XferError::Usage(format!(
            "{addr:?} is a HOST:DIR target: targets come after the files (sender FILE... \
             {host}:{}); the sender sends local files only, it cannot fetch from a host",
            if path.is_empty() { "DIR" } else { path }
        ))),
        None => Ok((a.to_string(), None)),
    }
}

impl SenderArgs {
    /// How the command line's arguments become entries; a bad pattern is
    /// one of the `problems`.
    fn walk_options(&self, times: bool, problems: &mut Problems) -> entries::WalkOptions {
        // `filter` holds both options' values in their order once parsed
        // by `try_parse_sender`; parsed otherwise, the order is lost.
        let filter = if self.filter.len() == self.exclude.len() + self.include.len() {
            problems.check(Filter::new(&self.filter))
        } else {
            problems.add("--exclude and --include were parsed without their order");
            None
        };
        entries::WalkOptions {
            recursive: self.recursive,
            follow_links: self.follow_links,
            preserve: self.preserve,
            times,
            name: self.name.clone(),
            filter: filter.unwrap_or_default(),
            relative: self.relative || self.files_from.is_some(),
            listed: self.files_from.is_some(),
        }
    }

    /// `--files-from LIST`'s paths below the one source directory `files`
    /// names, each as `DIR/./PATH` (the `/./` marks what `-R` keeps).
    /// Blank lines and lines starting with `#` are skipped; an absolute
    /// path or one with `..` is a problem (it would not be below DIR).
    fn listed_files(
        &self,
        list: &Path,
        files: &[PathBuf],
        problems: &mut Problems,
    ) -> Vec<PathBuf> {
        let dir = match files {
            [dir] if dir.is_dir() => dir,
            _ => {
                problems.add(
                    "--files-from lists paths below one source directory: sender --files-from \
                     LIST DIR HOST:DIR, or sender --files-from LIST ADDR DIR",
                );
                return Vec::new();
            }
        };
        let read = if list.as_os_str() == "-" {
            std::io::read_to_string(std::io::stdin().lock())
        } else {
            std::fs::read_to_string(list)
        };
        let text = match read {
            Ok(t) => t,
            Err(e) => {
                problems.add(format!("cannot read --files-from {}: {e}", list.display()));
                return Vec::new();
            }
        };
        let mut paths = Vec::new();
        let mut refused = false;
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() || line.starts_with('#') {
                continue;
            }
            let at = format!("{}:{}: {line:?}", list.display(), n + 1);
            let parts: Vec<&str> = line
                .split('/')
                .filter(|c| !c.is_empty() && *c != ".")
                .collect();
            let why = if line.starts_with('/') {
                format!("{at} is absolute: list paths relative to {}", dir.display())
            } else if parts.contains(&"..") {
                format!("{at}: `..` would leave {}", dir.display())
            } else if parts.is_empty() {
                format!(
                    "{at} names {} itself: list what is inside it",
                    dir.display()
                )
            } else {
                paths.push(dir.join(".").join(parts.join("/")));
                continue;
            };
            problems.add(why);
            refused = true;
        }
        if paths.is_empty() && !refused {
            problems.add(format!("--files-from {}: no paths listed", list.display()));
        }
        paths
    }

    /// The engine's configuration for the direct form (`sender ADDR
    /// FILE...`); the one-command form is a usage error here (see `plan`).
    pub fn to_config(&self) -> Result<SenderConfig, XferError> {
        match self.plan()? {
            SendPlan::Direct { cfg, .. } => Ok(cfg),
            SendPlan::Remote(_) => Err(XferError::Usage(
                "HOST:DIR targets need the one-command form (SenderArgs::plan)".into(),
            )),
        }
    }

    /// The operands as the direct form (ADDR, then files) or the
    /// one-command form (files, then the trailing `[USER@]HOST:DIR`
    /// targets, plus `--hosts`'s).
    fn operands(&self, problems: &mut Problems) -> Operands {
        let all: Vec<PathBuf> = std::iter::once(PathBuf::from(&self.addr))
            .chain(self.files.iter().cloned())
            .collect();
        // A local file is never a target, whatever its name (`12:00.log`,
        // or one planted as `evil.example:x` in a directory sent with *).
        let target_of = |p: &PathBuf| {
            if p.symlink_metadata().is_ok() {
                return None;
            }
            p.to_str().and_then(Target::parse)
        };
        let trailing = all
            .iter()
            .rev()
            .take_while(|p| target_of(p).is_some())
            .count();
        if trailing == 0 && self.hosts.is_none() {
            if self.files.is_empty() {
                problems.add(
                    "no files to send: `sender FILE... HOST:DIR` (a receiver started over ssh) or \
                     `sender ADDR FILE...` (a running receiver)",
                );
            }
            return Operands::Direct;
        }
        let (files, named) = all.split_at(all.len() - trailing);
        let mut targets = Vec::new();
        for t in named.iter().filter_map(target_of) {
            if let Some(t) = problems.check(t) {
                targets.push(t);
            }
        }
        if let Some(list) = &self.hosts {
            targets.extend(hosts_file(list, problems));
        }
        for f in files.iter().filter(|f| target_of(f).is_some()) {
            problems.add(format!(
                "{}: the sender sends local files, not from a remote host (a local name with a \
                 ':' can be given as ./NAME)",
                f.display()
            ));
        }
        if files.is_empty() {
            problems.add("no files to send: the files come before the HOST:DIR targets");
        }
        if targets.is_empty() && problems.is_empty() {
            problems.add("no targets: give [USER@]HOST:DIR after the files, or --hosts FILE");
        }
        if targets.len() > 1 && files.iter().any(|f| f.as_os_str() == "-") {
            problems.add("standard input (-) is read once: it can go to one target only");
        }
        Operands::Remote {
            files: files.to_vec(),
            targets,
        }
    }

    /// What the command line asks for, every option checked and every
    /// problem reported at once (exit 2): chunk size and depth, timeout,
    /// ADDR and port or the targets, `--name` (a relative path the
    /// receiver will accept, not with -R or --files-from),
    /// `--follow-links` only with -r, the token (`--token-file` or
    /// RDMA_XFER_TOKEN; the one-command form makes its own), and with any
    /// of those wrong, the input files too (otherwise the engine checks
    /// them, all at once, before it connects). The direct form's address
    /// is resolved last: a name that does not resolve is a connect error.
    /// The progress observer is left at its default; the tool sets its own.
    pub fn plan(&self) -> Result<SendPlan, XferError> {
        let mut problems = Problems::default();
        let buffers = problems.check(check_buffers(
            self.chunk_size.unwrap_or(DEFAULT_CHUNK_SIZE.into()),
            self.depth.unwrap_or(DEFAULT_DEPTH).into(),
            "--depth",
        ));
        problems.check(self.common.check());
        // `--relay`: every operand is a file; the chain's first host is
        // the receiver.
        let relaying = !self.relay.is_empty();
        let operands = if relaying {
            Operands::Direct
        } else {
            self.operands(&mut problems)
        };
        let remote = matches!(operands, Operands::Remote { .. });
        let mut files: Vec<PathBuf> = match &operands {
            Operands::Direct if relaying => std::iter::once(PathBuf::from(&self.addr))
                .chain(self.files.iter().cloned())
                .collect(),
            Operands::Direct => self.files.clone(),
            Operands::Remote { files, .. } => files.clone(),
        };
        if let Some(list) = &self.files_from {
            if list.as_os_str() == "-" && files.iter().any(|f| f.as_os_str() == "-") {
                problems.add(
                    "--files-from - reads the list from standard input: it cannot be sent too",
                );
                files.clear();
            } else {
                files = self.listed_files(list, &files, &mut problems);
            }
        }
        let target = if remote {
            self.check_remote_options(&mut problems);
            None
        } else if relaying {
            self.check_relay_options(&mut problems)
        } else {
            if self.overwrite {
                problems.add(format!(
                    "--overwrite is for [USER@]HOST:DIR targets (their receivers start with \
                     --overwrite); the running receiver at {} replaces files only if it was \
                     started with receiver --overwrite",
                    self.addr
                ));
            }
            for (given, name) in [
                (self.rsh.is_some(), "--rsh"),
                (self.remote_bind.is_some(), "--remote-bind"),
                (self.remote_receiver != "receiver", "--remote-receiver"),
            ] {
                if given {
                    problems.add(format!(
                        "{name} is for [USER@]HOST:DIR targets (receivers started over ssh), not \
                         for a running receiver at {}",
                        self.addr
                    ));
                }
            }
            problems.check(parse_addr(&self.addr))
        };
        let port = match (target.as_ref().and_then(|(_, p)| *p), self.port) {
            (Some(a), Some(b)) if a != b => {
                problems.add(format!(
                    "the port in {:?} ({a}) and --port {b} disagree: give it once",
                    self.addr
                ));
                DEFAULT_PORT
            }
            (a, b) => a.or(b).unwrap_or(DEFAULT_PORT),
        };
        problems.check(check_port(port));
        if let Some(name) = &self.name {
            if self.relative || self.files_from.is_some() {
                problems.add(
                    "--name gives the one file or standard input sent its own path: not with -R \
                     or --files-from, which send paths as given",
                );
            }
            // One source, not a directory: checked with the inputs (see
            // `entries::plan`).
            if let Err(e) = validate_path(name, NameRules::ANY_RECEIVER) {
                problems.add(format!("invalid --name {name:?}: {e}"));
            }
        }
        if self.follow_links && !self.recursive {
            problems.add("--follow-links follows links inside trees: it needs -r");
        }
        // Files in trees and among the inputs get the flag; standard input
        // never does, so --checksum with nothing else has no effect.
        if self.checksum && !files.is_empty() && files.iter().all(|f| f.as_os_str() == "-") {
            problems.add(
                "--checksum with only standard input (-): a stream cannot be hashed before it \
                 is sent",
            );
        }
        // `--retry=5 3 FILE`: a number is no receiver's address.
        if !remote
            && !relaying
            && !self.addr.is_empty()
            && self.addr.bytes().all(|b| b.is_ascii_digit())
        {
            problems.add(format!(
                "{} is a number, not the receiver's address",
                self.addr
            ));
        }
        // `sender FILE HOST`: the address is a local file and a "file" is not.
        if !remote
            && !relaying
            && !self.addr.is_empty()
            && Path::new(&self.addr).exists()
            && self
                .files
                .iter()
                .any(|f| f.as_os_str() != "-" && !f.exists())
        {
            problems.add(format!(
                "{} is a local file, not an address: the receiver's address comes first \
                 (sender ADDR FILE...), or a target last (sender FILE... HOST:DIR)",
                self.addr
            ));
        }
        let source = self.source.as_deref().and_then(|s| {
            problems.check(
                resolve(s, 0)
                    .map(|a| a.ip())
                    .map_err(|e| XferError::Usage(format!("--source {s}: {}", connect_reason(&e)))),
            )
        });
        // The one-command form makes a one-time token per target.
        let token = if remote {
            None
        } else {
            problems.check(self.common.token(true)).flatten()
        };
        let ack_timeout = problems.check(self.common.ack_timeout());
        if let Some(rate) = self
            .bwlimit
            .filter(|&r| r < crate::engine::sender::MIN_BWLIMIT)
        {
            problems.add(format!(
                "--bwlimit {rate}: at least 1M (bytes a second), so that the receiver hears \
                 from the sender within its --timeout"
            ));
        }
        // With a token the digest is authenticated (sealed FIN), so it must
        // resist deliberate changes: CRC32 does not (it can be kept while
        // the data is altered).
        let verify = match (self.verify, token.is_some() || remote) {
            (None, false) | (Some(Verify::Crc32), false) => DigestAlg::Crc32,
            (None, true) | (Some(Verify::Sha256), _) => DigestAlg::Sha256,
            (Some(Verify::Crc32), true) => {
                problems.add(
                    "--verify crc32 with a token: CRC32 does not detect deliberate changes to \
                     the data, so an authenticated transfer uses sha256 (the default with a \
                     token; the one-command form always has one)",
                );
                DigestAlg::Sha256
            }
        };
        let resume = self.resume || self.retry > 0;
        // A resumed file is recognised by its size and modification time.
        // Modification times always travel: a re-run finds them (rsync's
        // quick check).
        let walk = self.walk_options(true, &mut problems);
        // A name that does not resolve is a usage problem; a resolver that
        // cannot answer now is a connect error, said once all else is fine.
        let mut unanswered = None;
        let addr = match &target {
            None if remote => Some(SocketAddr::from(([0, 0, 0, 0], 0))),
            None => None,
            Some((host, _)) => match resolve(host, port) {
                Ok(a) => Some(a),
                Err(e @ XferError::Connect { .. }) => {
                    unanswered = Some(e);
                    None
                }
                Err(e) => problems.check(Err(e)),
            },
        };
        let launch = if remote {
            let env = std::env::var(crate::engine::remote::RSH_ENV).ok();
            problems
                .check(crate::engine::remote::rsh_command(
                    self.rsh.as_deref(),
                    env.as_deref(),
                ))
                .map(|rsh| self.launch_options(rsh, &files))
        } else {
            None
        };
        // Bad options: report the inputs' problems in the same run. In the
        // one-command form always: before any host is logged in to.
        if !problems.is_empty() || remote {
            problems.check(entries::check_arguments(&files, &walk));
        }
        problems.into_result()?;
        if let Some(e) = unanswered {
            return Err(e);
        }
        let (Some((chunk_size, depth)), Some(addr), Some(ack_timeout)) =
            (buffers, addr, ack_timeout)
        else {
            return Err(unchecked());
        };
        let mut cfg = SenderConfig::new(addr);
        cfg.ack_timeout = ack_timeout;
        cfg.source = source;
        cfg.chunk_size = chunk_size;
        cfg.depth = depth;
        cfg.given = Given {
            count: self.depth.is_some(),
            chunk_size: self.chunk_size.is_some(),
        };
        cfg.verify = verify;
        cfg.busy_poll = self.common.busy_poll;
        cfg.timeout = self.common.timeout;
        cfg.token = token;
        cfg.walk = walk;
        cfg.resume = resume;
        cfg.checksum = self.checksum;
        cfg.existing = if self.ignore_times {
            WhenExisting::IgnoreTimes
        } else if self.ignore_existing {
            WhenExisting::IgnoreExisting
        } else if self.update {
            WhenExisting::Update
        } else {
            WhenExisting::QuickCheck
        };
        cfg.retries = self.retry;
        cfg.dry_run = self.dry_run;
        cfg.bwlimit = self.bwlimit;
        cfg.lanes = self.lanes.unwrap_or(1);
        if cfg.lanes > 1 {
            let whole = [
                (cfg.resume, "--resume (or --retry)"),
                (self.checksum, "--checksum"),
                (self.dry_run, "--dry-run"),
                (self.bwlimit.is_some(), "--bwlimit"),
                (!self.relay.is_empty(), "--relay"),
            ];
            if let Some((_, why)) = whole.iter().find(|(on, _)| *on) {
                tracing::warn!("--lanes: with {why}, files go whole, in one session");
            }
        }
        cfg.rails = self.rails.clone();
        cfg.relay = self.relay.clone();
        Ok(match (operands, launch) {
            (Operands::Remote { targets, .. }, Some(launch)) => {
                // Each attempt starts a new receiver: the engine's own
                // retries (same address) do not apply.
                cfg.retries = 0;
                let chain = self.chain_for(&targets);
                SendPlan::Remote(RemotePlan {
                    cfg,
                    files,
                    targets,
                    launch,
                    parallel: usize::from(self.parallel),
                    retries: self.retry,
                    chain,
                })
            }
            _ => SendPlan::Direct { cfg, files },
        })
    }

    /// `--relay`'s chain: each host's name as a RESULT may carry it, and
    /// what a chain does not do; the first host, where this sender
    /// connects.
    fn check_relay_options(&self, problems: &mut Problems) -> Option<(String, Option<u16>)> {
        for host in &self.relay {
            if let Err(e) = crate::proto::check_host(host) {
                problems.add(format!("--relay {:?}: {e}", crate::proto::escaped(host)));
            }
        }
        for (i, host) in self.relay.iter().enumerate() {
            if self.relay[..i].contains(host) {
                problems.add(format!(
                    "--relay names {} twice: each host once",
                    crate::proto::escaped(host)
                ));
            }
        }
        if self.relay.len() > crate::proto::MAX_RELAY_HOPS {
            problems.add(format!(
                "--relay names {} hosts: at most {}",
                self.relay.len(),
                crate::proto::MAX_RELAY_HOPS
            ));
        }
        if self.port.is_some() {
            problems.add("--port with --relay: give each host as HOST:PORT");
        }
        for (given, name) in [
            (self.checksum, "--checksum"),
            (self.dry_run, "--dry-run"),
            (self.overwrite, "--overwrite"),
            (self.rsh.is_some(), "--rsh"),
            (self.hosts.is_some(), "--hosts"),
        ] {
            if given {
                problems.add(format!("{name} cannot be used with --relay (yet)"));
            }
        }
        if self.common.token(true).ok().flatten().is_none() {
            problems.add(
                "--relay needs a token that every host of the chain shares (RDMA_XFER_TOKEN, \
                 --token-file, or a default token file): a host forwards only for a sender \
                 that proved it",
            );
        }
        let first = self.relay.first()?;
        problems.check(parse_addr(first))
    }

    /// How `targets` targets are served: a relay chain when there are
    /// several, unless --no-relay or an option a chain does not do yet.
    fn chain_for(&self, targets: &[Target]) -> Chain {
        if targets.len() < 2 || self.no_relay {
            return Chain::Direct;
        }
        if targets.len() > crate::proto::MAX_RELAY_HOPS {
            return Chain::DirectFor(format!(
                "{} targets: copying to each directly (a relay chain has at most {} hosts)",
                targets.len(),
                crate::proto::MAX_RELAY_HOPS
            ));
        }
        for (given, name) in [(self.checksum, "--checksum"), (self.dry_run, "--dry-run")] {
            if given {
                return Chain::DirectFor(format!(
                    "{name}: copying to each target directly (a relay chain does not do it \
                     yet; --no-relay asks for direct copies without this warning)"
                ));
            }
        }
        Chain::Relay
    }

    /// Options that make no sense with receivers started over ssh.
    fn check_remote_options(&self, problems: &mut Problems) {
        if self.port.is_some() {
            problems.add(
                "--port is for a running receiver: one started over ssh listens on a free port \
                 and says which",
            );
        }
        if self.common.token_file.is_some() {
            problems.add(
                "--token-file is for a running receiver: one started over ssh gets a one-time \
                 token from the sender",
            );
        }
    }

    /// How the targets' receivers are started: the sender's timeout, its
    /// verbosity (warnings and errors; with -vv, info too), and whether a
    /// target's PATH may name the one file (`files`), as scp's.
    fn launch_options(&self, rsh: Vec<String>, files: &[PathBuf]) -> LaunchOptions {
        // The sender logged in with ssh as the user the receiver writes
        // as: its dotfiles (a tree's .git, say) are its to send, as scp's.
        let mut receiver_args = vec!["--allow-dotfiles".to_string()];
        if let Some(bind) = &self.remote_bind {
            receiver_args.extend(["--bind".to_string(), bind.clone()]);
        }
        if self.overwrite {
            receiver_args.push("--overwrite".to_string());
        }
        // A dry run removes nothing either, not even old partial files.
        if self.dry_run {
            receiver_args.push("--no-sweep".to_string());
        }
        // Its warnings (a memlock fit, say) and errors reach the user;
        // -vv shows its info too.
        if self.common.verbose > 1 {
            receiver_args.push("-v".to_string());
        }
        LaunchOptions {
            rsh,
            remote_receiver: self.remote_receiver.clone(),
            receiver_args,
            timeout: self.common.timeout,
            path_may_name_file: self.name.is_none()
                && !self.relative
                && self.files_from.is_none()
                && matches!(files, [one] if one.as_os_str() == "-" || one.is_file()),
            // The chain's driver asks for it (`cli::chain`).
            relay: false,
        }
    }
}

/// The sender's operands, once sorted (the files of the direct form are
/// `SenderArgs::files`).
enum Operands {
    Direct,
    Remote {
        files: Vec<PathBuf>,
        targets: Vec<Target>,
    },
}

/// What `sender`'s command line asks for.
pub enum SendPlan {
    /// `sender ADDR FILE...`: one session with a running receiver.
    Direct {
        cfg: SenderConfig,
        files: Vec<PathBuf>,
    },
    /// `sender FILE... [USER@]HOST:DIR...`: a receiver started over ssh for
    /// each target (see `cli::targets`).
    Remote(RemotePlan),
}

/// The one-command form: what to send, where, and how.
pub struct RemotePlan {
    /// Every target's configuration but its address and token.
    pub cfg: SenderConfig,
    pub files: Vec<PathBuf>,
    pub targets: Vec<Target>,
    pub launch: LaunchOptions,
    /// Targets served at once.
    pub parallel: usize,
    /// New receivers started after a failure that may be transient.
    pub retries: u32,
    /// Whether the targets form a relay chain.
    pub chain: Chain,
}

/// How the one-command form serves several targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chain {
    /// A relay chain in the order given: the sender sends to the first.
    Relay,
    /// A copy to each target (one target, or `--no-relay`).
    Direct,
    /// A copy to each target, because of an option a chain does not do
    /// (said once, as a warning).
    DirectFor(String),
}

/// The targets of `--hosts FILE`: one `[USER@]HOST:DIR` a line.
fn hosts_file(list: &Path, problems: &mut Problems) -> Vec<Target> {
    let text = match std::fs::read_to_string(list) {
        Ok(t) => t,
        Err(e) => {
            problems.add(format!("--hosts {}: {e}", list.display()));
            return Vec::new();
        }
    };
    let mut targets = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match Target::parse(line) {
            Some(Ok(t)) => targets.push(t),
            Some(Err(e)) => problems.add(format!("--hosts {} line {}: {e}", list.display(), n + 1)),
            None => problems.add(format!(
                "--hosts {} line {}: {line:?} is not [USER@]HOST:DIR",
                list.display(),
                n + 1
            )),
        }
    }
    if targets.is_empty() && problems.is_empty() {
        problems.add(format!("--hosts {} lists no targets", list.display()));
    }
    targets
}

/// What went wrong resolving a name, without the "cannot connect" frame.
fn connect_reason(e: &XferError) -> String {
    match e {
        XferError::Connect { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

impl ReceiverArgs {
    /// The output directory: DIR, --dir, or the current directory.
    pub fn output_dir(&self) -> PathBuf {
        self.dir_arg
            .clone()
            .or_else(|| self.dir.clone())
            .unwrap_or_else(|| PathBuf::from("."))
    }

    /// The engine's configuration for these arguments, every option checked
    /// and every problem reported at once (exit 2): slot size and count,
    /// timeout, port, `--bind` (resolved), the output directory (it must
    /// exist), `--stdout` (implies --once; takes no directory and no
    /// --overwrite; never onto a terminal), `--max-sessions` at least 1,
    /// and the token (`--token-file` or RDMA_XFER_TOKEN), required unless
    /// --insecure (see `check_authentication`). The progress observer is
    /// left at its default.
    pub fn to_config(&self) -> Result<ReceiverConfig, XferError> {
        self.to_config_with(std::io::IsTerminal::is_terminal(&std::io::stdout()))
    }

    /// What becomes of accepted files (--stdout, --discard or a
    /// directory); combinations that make no sense are problems.
    fn output(&self, problems: &mut Problems) -> Output {
        let chosen: Vec<&str> = [
            (self.stdout, "--stdout"),
            (self.discard, "--discard"),
            (self.exec.is_some(), "--exec"),
        ]
        .into_iter()
        .filter_map(|(on, name)| on.then_some(name))
        .collect();
        if chosen.len() > 1 {
            problems.add(format!(
                "{} choose what becomes of the files: give one of them",
                chosen.join(" and ")
            ));
        }
        if self.threads > 0 && !chosen.is_empty() {
            problems.add(format!(
                "--threads writes files under a directory: it does not apply to {}",
                chosen.join(" or ")
            ));
        }
        if self.discard && self.overwrite {
            problems.add("--discard writes nothing: --overwrite does not apply");
        }
        if self.exec.is_some() && self.overwrite {
            problems
                .add("--exec writes no file itself (its command does): --overwrite does not apply");
        }
        if let Some(dest) = &self.link_dest {
            if !chosen.is_empty() {
                problems.add(format!(
                    "--link-dest puts files under a directory: it does not apply to {}",
                    chosen.join(" or ")
                ));
            }
            self.check_link_dest(dest, problems);
        }
        if self.exec.as_deref().is_some_and(|c| c.trim().is_empty()) {
            problems.add("--exec needs a command (e.g. --exec 'cat > \"$RDMA_XFER_NAME\"')");
        }
        match (&self.exec, self.stdout, self.discard) {
            (_, true, _) => Output::Stdout,
            (_, _, true) => Output::Discard,
            (Some(cmd), _, _) => Output::Exec(cmd.clone()),
            (None, false, false) => Output::Dir,
        }
    }

    /// `--ssh-session`: standard output is the channel to the sender, and
    /// the token comes from the sender alone.
    fn check_ssh_session(&self, problems: &mut Problems) {
        if self.stdout {
            problems.add("--ssh-session tells the sender where to connect on standard output: --stdout does not apply");
        }
        if self.common.token_file.is_some() {
            problems.add("--ssh-session takes its one-time token from the sender: --token-file does not apply");
        }
    }

    /// --link-dest must be a directory other than the output directory (a
    /// rename between two links of one file would do nothing).
    fn check_link_dest(&self, dest: &Path, problems: &mut Problems) {
        use std::os::unix::fs::MetadataExt;
        match std::fs::metadata(dest) {
            Err(e) => problems.add(format!("--link-dest {}: {e}", dest.display())),
            Ok(meta) if !meta.is_dir() => {
                problems.add(format!("--link-dest {} is not a directory", dest.display()))
            }
            Ok(meta) => {
                let same = std::fs::metadata(self.output_dir())
                    .is_ok_and(|d| (d.dev(), d.ino()) == (meta.dev(), meta.ino()));
                if same {
                    problems.add(format!(
                        "--link-dest {} is the output directory itself: give the directory of an \
                         earlier transfer",
                        dest.display()
                    ));
                }
            }
        }
    }

    /// As `to_config`, told whether standard output is a terminal.
    pub fn to_config_with(&self, stdout_is_terminal: bool) -> Result<ReceiverConfig, XferError> {
        let mut problems = Problems::default();
        let buffers = problems.check(check_buffers(
            self.chunk_size.unwrap_or(DEFAULT_CHUNK_SIZE.into()),
            self.slots.unwrap_or(DEFAULT_SLOTS).into(),
            "--slots",
        ));
        problems.check(self.common.check());
        if !self.ssh_session {
            problems.check(check_port(self.port));
        }
        if self.wait.is_some() && !(self.once || self.stdout) {
            problems.add("--wait is how long --once waits for its sender: give --once too");
        }
        if self.ssh_session {
            self.check_ssh_session(&mut problems);
        }
        if self.max_sessions == 0 {
            problems.add("--max-sessions must be at least 1");
        }
        let dir = self.output_dir();
        let output = self.output(&mut problems);
        if self.stdout {
            if self.dir.is_some() || self.dir_arg.is_some() {
                problems.add("--stdout writes to standard output: a directory does not apply");
            }
            if self.overwrite {
                problems.add("--stdout writes to standard output: --overwrite does not apply");
            }
            if stdout_is_terminal {
                problems.add(
                    "--stdout would write the received bytes to this terminal: redirect it \
                     (receiver --stdout > FILE, or receiver --stdout | tar -x ...)",
                );
            }
        } else if matches!(output, Output::Dir | Output::Exec(_)) {
            match std::fs::metadata(&dir) {
                Err(e) => {
                    let hint = match self.dir_arg.as_deref().and_then(Path::to_str) {
                        Some(a) if a.parse::<std::net::IpAddr>().is_ok() => {
                            " (to listen on that address: --bind ADDR)"
                        }
                        _ => "",
                    };
                    problems.add(format!("output directory {}: {e}{hint}", dir.display()));
                }
                Ok(meta) if !meta.is_dir() => {
                    problems.add(format!(
                        "output directory {} is not a directory",
                        dir.display()
                    ));
                }
                Ok(_) => {}
            }
        }
        // Over ssh the port is free unless chosen, and the address is
        // picked once the RDMA devices are known (see `remote`).
        let port = if self.ssh_session && self.port == DEFAULT_PORT {
            0
        } else {
            self.port
        };
        let bind = match &self.bind {
            None => Some(SocketAddr::from(([0, 0, 0, 0], port))),
            Some(b) => problems.check(
                resolve(b, port)
                    .map_err(|e| XferError::Usage(format!("--bind {b}: {}", connect_reason(&e)))),
            ),
        };
        // Over ssh the one-time token, read from standard input by the
        // tool, is the only one; otherwise a token that fails to load is a
        // problem of its own, not a missing token.
        let loaded = if self.ssh_session {
            Some(None)
        } else {
            // --insecure means no token: none from a default location.
            problems.check(self.common.token(!self.insecure))
        };
        if let Some(token) = &loaded {
            self.check_authentication(token, &mut problems);
        }
        let token = loaded.flatten();
        let ack_timeout = problems.check(self.common.ack_timeout());
        let relay_source = self.relay_source.as_deref().and_then(|s| {
            problems.check(resolve(s, 0).map(|a| a.ip()).map_err(|e| {
                XferError::Usage(format!("--relay-source {s}: {}", connect_reason(&e)))
            }))
        });
        if relay_source.is_some() && !self.allow_relay {
            problems.add("--relay-source is for a host of relay chains: it needs --allow-relay");
        }
        if self.allow_relay && !self.has_token_source(&token) {
            problems.add(
                "--allow-relay needs a token: a receiver passes files on only for a sender \
                 that proved it, with its own copy",
            );
        }
        problems.into_result()?;
        let (Some((chunk_size, slots)), Some(bind), Some(ack_timeout)) =
            (buffers, bind, ack_timeout)
        else {
            return Err(unchecked());
        };
        let mut cfg = ReceiverConfig::new(bind, dir);
        cfg.ack_timeout = ack_timeout;
        // A relay hop serves a session per file of the host before it,
        // until the sender hangs up.
        cfg.once = (self.once || self.stdout || self.ssh_session) && !self.ssh_relay;
        cfg.wait = match (self.wait, self.ssh_session && !self.ssh_relay) {
            (Some(w), _) => Some(w),
            (None, true) => Some(self.common.timeout),
            (None, false) => None,
        };
        cfg.output = output;
        cfg.link_dest = self.link_dest.clone();
        cfg.overwrite = self.overwrite;
        cfg.keep_modes = self.keep_modes;
        cfg.max_size = self.max_size.unwrap_or(u64::MAX);
        cfg.max_sessions = self.max_sessions.into();
        cfg.max_files = self.max_files;
        cfg.max_session_bytes = self.max_session_size.unwrap_or(u64::MAX);
        cfg.slots = slots;
        cfg.chunk_size = chunk_size;
        cfg.given = Given {
            count: self.slots.is_some(),
            chunk_size: self.chunk_size.is_some(),
        };
        cfg.busy_poll = self.common.busy_poll;
        cfg.timeout = self.common.timeout;
        cfg.token = token;
        cfg.allow = self.allow.clone();
        cfg.partial_ttl = self.partial_ttl;
        cfg.sweep = !self.no_sweep;
        cfg.threads = usize::from(self.threads);
        cfg.allow_dotfiles = self.allow_dotfiles;
        cfg.relay = self.allow_relay || self.ssh_relay;
        cfg.relay_source = relay_source;
        cfg.relay_keys = self
            .ssh_relay
            .then(|| std::sync::Arc::new(crate::engine::relay::KeyRing::default()));
        Ok(cfg)
    }

    /// Whether senders will have to prove a token: one was loaded
    /// (`--token-file`, RDMA_XFER_TOKEN).
    fn has_token_source(&self, token: &Option<Token>) -> bool {
        // --ssh-session: the sender's one-time token, read from stdin.
        token.is_some() || self.ssh_session
    }

    /// Closed by default: the one place deciding whether this receiver may
    /// run without a token. Without one it needs --insecure, which takes
    /// no option that lets a sender run commands or touch existing files;
    /// --insecure with a token is a contradiction.
    fn check_authentication(&self, token: &Option<Token>, problems: &mut Problems) {
        match (self.has_token_source(token), self.insecure) {
            (true, false) => {}
            (true, true) => problems.add(
                "--insecure accepts senders without a token, but a token is given (--token-file \
                 or RDMA_XFER_TOKEN): drop one of them",
            ),
            (false, false) => problems.add(
                "the receiver needs a token, so that only senders holding it may send: make one \
                 with `rdma-xfer-gen token FILE`, then run `receiver --token-file FILE ...` here \
                 and `sender --token-file FILE ...` with a copy of FILE on the sending host (or \
                 set RDMA_XFER_TOKEN on both, or put FILE at /etc/rdma-xfer/token or \
                 ~/.config/rdma-xfer/token on both, where both tools look); to accept anyone \
                 who can reach the port instead, run `receiver --insecure`",
            ),
            (false, true) => {
                for (given, what) in [
                    (
                        self.exec.is_some(),
                        "--exec would run its command on data and names",
                    ),
                    (
                        self.link_dest.is_some(),
                        "--link-dest would link files by names",
                    ),
                    (
                        self.overwrite,
                        "--overwrite would replace existing files by names",
                    ),
                ] {
                    if given {
                        problems.add(format!(
                            "{what} chosen by anyone who can reach the port: it needs a token, \
                             not --insecure (make one with `rdma-xfer-gen token FILE`)"
                        ));
                    }
                }
            }
        }
    }
}

/// A value its check left out although the check found no problem: each
/// check either gives its value or adds a problem, so this is a bug.
fn unchecked() -> XferError {
    XferError::Internal("a checked option has no value".into())
}
