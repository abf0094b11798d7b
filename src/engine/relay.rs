//! A relay hop's forwarding: a receiver in a relay chain sends each offer
//! it takes on to the next host, in a sender session of its own (its
//! token, its RDMA connection), one per session of its own: the offers
//! are handed to it one at a time (`Downstream`). A file's bytes go through a pipe as the
//! receiver checks them; the session's reader reads the pipe, so a slow
//! next host fills the pipe and then holds the receiver, which holds its
//! credits: the chain goes at its slowest host's pace, in bounded memory.
//! The next host's result, and those of the hosts after it, come back as
//! `HopResult`s for the receiver's RESULTs.

use crate::engine::DEFAULT_PORT;
use crate::engine::entries::Entry;
use crate::engine::report::FileEvent;
use crate::engine::sender::{Feed, SenderConfig, send_fed};
use crate::error::{ExitCode, XferError};
use crate::proto::{
    AckStatus, DigestAlg, FileOffer, Hello, HopResult, HopVerdict, OfferKind, RejectCode, Token,
    WhenExisting, escaped, hello_flags,
};
use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tracing::{debug, warn};

/// What a hop needs to reach the next host: the chain after this host
/// (the next host first, as the sender named it) and the hop's own
/// settings.
#[derive(Debug, Clone)]
pub struct NextHops {
    pub hosts: Vec<String>,
    pub keys: HopKeys,
    /// The receiver's own --timeout: the next host gets half of it, so
    /// that a stalled next host is dropped before the sender gives up on
    /// this one.
    pub timeout: Duration,
    pub chunk_size: u32,
    pub ack_timeout: crate::engine::AckTimeout,
    /// The local address to connect from (`--relay-source`).
    pub source: Option<std::net::IpAddr>,
}

/// The tokens a hop proves to the hosts after it.
#[derive(Clone)]
pub enum HopKeys {
    /// Every host of the chain has this receiver's own token
    /// (`receiver --allow-relay`, `sender --relay`).
    Shared(Token),
    /// Each host its own, handed to this host by the sender over ssh
    /// (the one-command form's chain): a host it has none for is not
    /// reached.
    PerHost(Arc<KeyRing>),
}

impl std::fmt::Debug for HopKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HopKeys::Shared(_) => "HopKeys::Shared",
            HopKeys::PerHost(_) => "HopKeys::PerHost",
        })
    }
}

impl HopKeys {
    /// The token that `host` (a name of the chain) proves itself with.
    pub fn key_for(&self, host: &str) -> Result<Token, XferError> {
        match self {
            HopKeys::Shared(token) => Ok(token.clone()),
            // Not reached (LOST): this host cannot prove itself there.
            HopKeys::PerHost(ring) => ring.key_for(host).ok_or_else(|| {
                XferError::PeerLost(format!(
                    "not reached: this host holds no token for {} (the sender hands each host \
                     those of the two after it)",
                    escaped(host)
                ))
            }),
        }
    }
}

/// The tokens of the hosts after a hop started over ssh, by their names
/// in the chain: set once, when the sender hands them over, before it
/// starts the chain.
#[derive(Default)]
pub struct KeyRing {
    keys: std::sync::OnceLock<Vec<(String, Token)>>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyRing({} tokens)", self.len())
    }
}

impl KeyRing {
    /// Keeps `keys`; false when some were kept already (they stay).
    pub fn set(&self, keys: Vec<(String, Token)>) -> bool {
        self.keys.set(keys).is_ok()
    }

    /// How many hosts it has a token for.
    pub fn len(&self) -> usize {
        self.keys.get().map_or(0, Vec::len)
    }

    /// Whether it holds no token (none handed over, or none to hand).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn key_for(&self, host: &str) -> Option<Token> {
        let keys = self.keys.get()?;
        keys.iter().find(|(h, _)| h == host).map(|(_, t)| t.clone())
    }
}

/// What forwarding an offer came to: each next host's result, and, when
/// the session to the next host ended without its verdict (it could not
/// be reached, or was lost mid-file), why: the hosts after it heard
/// nothing.
pub struct Forwarded {
    pub results: Vec<HopResult>,
    pub lost: Option<String>,
}

/// The session a hop keeps to the next hosts for the offers of one
/// session of its own: each offer it passes on is handed to it (a feed),
/// one at a time; its thread reports each host's result. A tree of small
/// files costs one connection per hop, not one per file.
pub struct Downstream {
    /// The hosts it reaches, the next one first.
    hosts: Vec<String>,
    /// The settings it was opened with: an offer with others needs a
    /// session of its own.
    digest: DigestAlg,
    keep_mode: bool,
    stall: Duration,
    chunk_size: usize,
    feed: Option<mpsc::Sender<Entry>>,
    drained: Option<mpsc::Receiver<()>>,
    reports: Option<mpsc::Receiver<HopResult>>,
    session: Option<JoinHandle<Result<(), XferError>>>,
    /// Why it ended: no offer goes to it any more.
    ended: Option<XferError>,
    /// It could not even be set up for the next host (its name does not
    /// resolve, or this host holds no token for it): lost for the
    /// session, whatever the error's class.
    unreachable: bool,
    /// The offer handed over last was answered.
    answered: bool,
    /// Its results were taken (`results`): nothing handed over is left
    /// without its owner waiting for it.
    settled: bool,
    /// When it last answered an offer (the next host's receiver ends a
    /// session that idles too long).
    idle_since: Instant,
}

/// What a hop kept of a file from an earlier transfer, when the sender
/// resumed it there: the bytes it receives come after that part.
pub enum Kept {
    Nothing,
    /// The file's first bytes, in this host's copy (read back from it).
    Part(std::fs::File, u64),
}

/// One offer on its way to the next hosts: for a file, the pipe that
/// feeds the `Downstream` session.
pub struct Forward {
    name: String,
    /// The offer forwarded (a bypass makes it again).
    hello: Hello,
    pipe: Option<std::io::PipeWriter>,
    /// Set once this host's own checks of the file passed
    /// (`end_input(true)`): until then the pipe's end is the file
    /// abandoned, never its end.
    whole: Option<Arc<AtomicBool>>,
    /// Set once the next host's session reads the pipe (see
    /// `is_flowing`).
    flowing: Option<Arc<AtomicBool>>,
    /// How long a pipe write may wait for the next host.
    stall: Duration,
    /// Why the bytes stopped going on (the next host's session ended or
    /// stalled), said once.
    stopped: Option<String>,
}

/// How long a hop's session to the next host may have idled and still
/// take its next offer: far below any receiver's --timeout (the next host
/// ends a session silent that long), far above the gap between the
/// entries of a tree.
const IDLE_REUSE: Duration = Duration::from_secs(2);

/// The offer a hop makes to the next host for the offer it got: the
/// same name, size, mode, time, digest and re-run rules.
pub fn offer_for(hello: &Hello) -> FileOffer {
    let caps = hello.caps;
    let existing = if caps & hello_flags::IGNORE_EXISTING != 0 {
        WhenExisting::IgnoreExisting
    } else if caps & hello_flags::UPDATE != 0 {
        WhenExisting::Update
    } else if caps & hello_flags::IGNORE_TIMES != 0 {
        WhenExisting::IgnoreTimes
    } else {
        WhenExisting::QuickCheck
    };
    let kind = if hello.is_directory() {
        OfferKind::Directory
    } else if hello.is_stream() {
        OfferKind::Stream
    } else {
        OfferKind::File
    };
    FileOffer {
        name: hello.name.clone(),
        size: hello.size,
        mode: hello.mode,
        digest: hello.digest,
        kind,
        mtime: hello.mtime,
        keep_mode: caps & hello_flags::KEEP_MODE != 0,
        // The next host keeps what it verified, as this one does.
        resume: caps & hello_flags::RESUME != 0,
        checksum: false,
        existing,
        piece: None,
    }
}

/// A hop's name as the sender gave it (`HOST`, `HOST:PORT`, an IPv6
/// address bare or as `[ADDR]:PORT`) resolved to an address.
pub fn resolve(host: &str) -> Result<SocketAddr, XferError> {
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(SocketAddr::new(ip, DEFAULT_PORT));
    }
    if let Ok(addr) = host.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let (name, port) = match host.rsplit_once(':') {
        Some((name, port)) if !name.ends_with(':') => match port.parse::<u16>() {
            Ok(port) => (name, port),
            Err(_) => (host, DEFAULT_PORT),
        },
        _ => (host, DEFAULT_PORT),
    };
    crate::engine::resolve(name, port)
}

/// Whether an offer keeps its files' modes (the next host's must too).
fn keeps_mode(hello: &Hello) -> bool {
    hello.caps & hello_flags::KEEP_MODE != 0
}

impl Downstream {
    /// Opens the session to `next`'s hosts with the settings of `hello`
    /// (its thread connects while this host takes the offer). A next host
    /// that does not resolve, or that this host has no token for, ends it
    /// at once: lost for the session.
    pub fn open(next: &NextHops, hello: &Hello) -> Downstream {
        let (feed, entries) = mpsc::channel();
        let (drained_tx, drained) = mpsc::channel();
        let (report_tx, reports) = mpsc::channel();
        let mut downstream = Downstream {
            hosts: next.hosts.clone(),
            digest: hello.digest,
            keep_mode: keeps_mode(hello),
            stall: hop_timeout(next),
            chunk_size: next.chunk_size as usize,
            feed: Some(feed),
            drained: Some(drained),
            reports: Some(reports),
            session: None,
            ended: None,
            unreachable: false,
            answered: false,
            settled: true,
            idle_since: Instant::now(),
        };
        let cfg = match hop_config(next, hello) {
            Ok(cfg) => cfg,
            Err(e) => {
                downstream.ended = Some(e);
                downstream.unreachable = true;
                return downstream;
            }
        };
        let hosts = next.hosts.clone();
        let feed = Feed {
            entries,
            drained: drained_tx,
            watch: None,
        };
        let session = std::thread::Builder::new()
            .name("relay".into())
            .spawn(move || {
                let sent = send_fed(&cfg, feed, |event| {
                    if let Some(result) = result_of(event, &hosts) {
                        let _ = report_tx.send(result);
                    }
                });
                sent.map(drop)
            });
        match session {
            Ok(handle) => downstream.session = Some(handle),
            Err(e) => {
                warn!("cannot start the relay to the next host: {e}");
                downstream.ended = Some(XferError::io("cannot start the relay thread", e));
            }
        }
        downstream
    }

    /// Whether the offer `hello` for `hosts` may go to this session: the
    /// same hosts and settings, still going, its last offer settled (an
    /// offer abandoned unanswered ends it), and not idle so long that the
    /// next host may have given up on it (`IDLE_REUSE`: entries of a tree
    /// come milliseconds apart).
    pub fn serves(&self, hosts: &[String], hello: &Hello) -> bool {
        self.settled
            && self.ended.is_none()
            && self.running()
            && self.hosts == hosts
            && self.digest == hello.digest
            && self.keep_mode == keeps_mode(hello)
            && self.idle_since.elapsed() < IDLE_REUSE.min(self.stall / 2)
    }

    /// Starts sending `hello`'s entry to the next hosts. For a file or a
    /// stream its bytes come through the `Forward`'s `write` (after
    /// `kept`, the file's first bytes this host kept from an earlier
    /// transfer, read from its copy); `end_input` ends them, and
    /// `results` waits for the next hosts' results.
    pub fn offer(&mut self, hello: &Hello, kept: Kept) -> Forward {
        let offer = offer_for(hello);
        let mut forward = self.forward_of(hello);
        if hello.is_directory() {
            let entry = Entry::Dir {
                name: offer.name.clone(),
                mode: offer.mode,
                mtime: offer.mtime,
            };
            self.hand_over(entry);
            return forward;
        }
        let pipe = std::io::pipe().and_then(|(reader, writer)| {
            // Written with a deadline (`write`).
            crate::sys::os::set_nonblocking(writer.as_fd(), "fcntl")
                .map_err(std::io::Error::other)?;
            Ok((reader, writer))
        });
        match pipe {
            Ok((reader, writer)) => {
                let input = std::fs::File::from(std::os::fd::OwnedFd::from(reader));
                crate::engine::stdio::grow_pipe(&input, self.chunk_size);
                let whole = Arc::new(AtomicBool::new(false));
                forward.pipe = Some(writer);
                forward.whole = Some(whole.clone());
                let kept = match kept {
                    Kept::Nothing => None,
                    Kept::Part(file, len) => Some((file, len)),
                };
                let flowing = Arc::new(AtomicBool::new(false));
                forward.flowing = Some(flowing.clone());
                self.hand_over(Entry::Relayed {
                    offer,
                    kept,
                    pipe: Some(input),
                    whole,
                    flowing,
                });
            }
            Err(e) => {
                let e = XferError::io("cannot make the pipe to the next host", e);
                forward.stopped = Some(e.to_string());
                self.end(e);
            }
        }
        forward
    }

    /// Sends `hello`'s file to the next hosts from `copy`, this host's own
    /// (a host after one lost mid-file gets it so).
    pub fn offer_copy(&mut self, hello: &Hello, copy: std::fs::File) -> Forward {
        // This host's committed copy: whole as it is.
        // (With RESUME, a host that kept part of it gets only the rest.)
        let size = hello.size;
        self.hand_over(Entry::Relayed {
            offer: offer_for(hello),
            kept: Some((copy, size)),
            pipe: None,
            whole: Arc::new(AtomicBool::new(true)),
            flowing: Arc::new(AtomicBool::new(true)),
        });
        self.forward_of(hello)
    }

    /// The handle of `hello`'s offer, with no pipe yet.
    fn forward_of(&self, hello: &Hello) -> Forward {
        Forward {
            name: hello.name.clone(),
            hello: hello.clone(),
            pipe: None,
            whole: None,
            flowing: None,
            stall: self.stall,
            stopped: None,
        }
    }

    fn hand_over(&mut self, entry: Entry) {
        self.answered = false;
        self.settled = false;
        let given = self.feed.as_ref().is_some_and(|f| f.send(entry).is_ok());
        if !given && self.ended.is_none() {
            // Its thread is gone: `is_answered` finds out why.
            debug!("the session to the next host is over: the offer is not passed on");
        }
    }

    /// Ends the session for `e` (this host cannot feed it).
    fn end(&mut self, e: XferError) {
        self.feed = None;
        self.ended.get_or_insert(e);
    }

    /// Whether the offer handed over last was answered by every host, or
    /// the session ended (`results` will not wait).
    pub fn is_answered(&mut self) -> bool {
        if self.answered || self.ended.is_some() {
            return true;
        }
        if self.drained.as_ref().is_some_and(|d| d.try_recv().is_ok()) {
            self.answered = true;
            return true;
        }
        if self.running() {
            return false;
        }
        // One more look: an answer said just before the session ended.
        if self.drained.as_ref().is_some_and(|d| d.try_recv().is_ok()) {
            self.answered = true;
            return true;
        }
        let ended = match self.session.take().map(JoinHandle::join) {
            Some(Ok(Err(e))) => e,
            Some(Ok(Ok(()))) | None => {
                XferError::Internal("the session to the next host ended".into())
            }
            Some(Err(_)) => XferError::Internal("the relay thread panicked".into()),
        };
        self.end(ended);
        true
    }

    /// The next hosts' results on the offer handed over last, once
    /// `is_answered`: one per host, in the chain's order; `lost` when the
    /// session ended by the connection before its verdict.
    pub fn results(&mut self) -> Forwarded {
        let reported: Vec<HopResult> = self
            .reports
            .as_ref()
            .map(|r| r.try_iter().collect())
            .unwrap_or_default();
        self.idle_since = Instant::now();
        self.settled = true;
        let ended = (!self.answered).then_some(self.ended.as_ref()).flatten();
        // The session to the next host itself ended by the connection (it
        // could not be reached, or went away): what the hosts after it
        // heard is unknown. (A host further down failing is not this.)
        let lost = ended
            .filter(|e| {
                self.unreachable || e.is_transient() || e.exit_code() == ExitCode::CannotConnect
            })
            .map(ToString::to_string);
        // One result per host of the chain, in its order: what a next host
        // said of others, or twice, is not passed on.
        let results = self
            .hosts
            .iter()
            .map(|host| match reported.iter().find(|r| &r.host == host) {
                Some(result) => result.clone(),
                // A directory made everywhere has no report; a host the
                // session never heard from has the error that ended it.
                None => match ended {
                    None => HopResult::new(host.clone(), HopVerdict::Ack(AckStatus::Ok), 0, ""),
                    Some(e) => failed(host, e.exit_code(), e.reason_code(), &e.to_string()),
                },
            })
            .collect();
        Forwarded { results, lost }
    }

    /// Whether its thread still runs.
    fn running(&self) -> bool {
        self.session
            .as_ref()
            .is_some_and(|session| !session.is_finished())
    }

    /// Whether the session ended (a new one is needed for more offers).
    pub fn has_ended(&self) -> bool {
        self.ended.is_some()
    }
}

impl Drop for Downstream {
    /// The feed hangs up: the session closes once its offers are answered
    /// (a file cut short ends it at once), and its thread is waited for.
    fn drop(&mut self) {
        self.feed = None;
        if let Some(session) = self.session.take() {
            let _ = session.join();
        }
    }
}

impl Forward {
    /// The offer this forwards.
    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Whether the next host's session takes the bytes from the pipe (a
    /// resumed file's: once past its kept part's check), or there is no
    /// pipe to wait for.
    pub fn is_flowing(&self) -> bool {
        self.pipe.is_none()
            || self
                .flowing
                .as_ref()
                .is_none_or(|f| f.load(Ordering::SeqCst))
    }

    /// Passes checked bytes on. A next host that is gone (its session
    /// ended) stops the forwarding, not this host's transfer.
    /// A next host that takes nothing for `stall` is dropped too: this
    /// host must keep answering its own sender.
    pub fn write(&mut self, mut data: &[u8]) {
        let Some(pipe) = self.pipe.as_mut() else {
            return;
        };
        let mut progress_at = Instant::now();
        let failed = loop {
            if data.is_empty() {
                return;
            }
            match pipe.write(data) {
                Ok(n) => {
                    data = &data[n..];
                    progress_at = Instant::now();
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    let deadline = progress_at + self.stall;
                    match crate::sys::os::wait_writable(&*pipe, deadline) {
                        Ok(true) => {}
                        Ok(false) => {
                            break format!(
                                "the next host took nothing of it for {} s",
                                self.stall.as_secs()
                            );
                        }
                        Err(e) => break e.to_string(),
                    }
                }
                Err(e) => break e.to_string(),
            }
        };
        debug!(file = %escaped(&self.name), "the next host takes no more of it: {failed}");
        self.stopped = Some(failed);
        // Cut short: its end is never the file's.
        self.whole = None;
        self.pipe = None;
    }

    /// The end of the offer's bytes: `whole` once this host's own checks
    /// of them passed, else the offer is abandoned there (the next hosts'
    /// session ends without its FIN, nothing of it is kept).
    pub fn end_input(&mut self, whole: bool) {
        if let (true, Some(flag)) = (whole, &self.whole) {
            flag.store(true, Ordering::SeqCst);
        }
        self.pipe = None;
    }
}

impl Drop for Forward {
    /// An offer abandoned: the pipe's end tells the next host's session
    /// that the file is cut short.
    fn drop(&mut self) {
        self.pipe = None;
    }
}

/// The next host's timeout: half this receiver's own, so that a next
/// host that stalls is dropped before this host's sender gives up on it.
fn hop_timeout(next: &NextHops) -> Duration {
    (next.timeout / 2).max(Duration::from_secs(1))
}

/// The sender settings of the session to the next host for offers like
/// `hello` (whole staging: it serves every offer of a session).
fn hop_config(next: &NextHops, hello: &Hello) -> Result<SenderConfig, XferError> {
    let first = next
        .hosts
        .first()
        .ok_or_else(|| XferError::Internal("a relay with no next host".into()))?;
    let mut cfg = SenderConfig::new(resolve(first)?);
    cfg.token = Some(next.keys.key_for(first)?);
    cfg.timeout = hop_timeout(next);
    cfg.chunk_size = next.chunk_size;
    cfg.ack_timeout = next.ack_timeout;
    cfg.source = next.source;
    cfg.verify = hello.digest;
    cfg.walk.preserve = keeps_mode(hello);
    cfg.relay = next.hosts.clone();
    Ok(cfg)
}

/// A host's result from the session's report on it.
fn result_of(event: FileEvent<'_>, hosts: &[String]) -> Option<HopResult> {
    match event {
        FileEvent::Done(r) => {
            let host = r.host.clone().or_else(|| hosts.first().cloned())?;
            let verdict = r.outcome.ack_status();
            let note = r.outcome.ack_note();
            Some(HopResult::new(
                host,
                HopVerdict::Ack(verdict),
                // What it wrote this time (not what it kept before).
                match r.outcome.sent_nothing() {
                    true => 0,
                    false => r.bytes.saturating_sub(r.resumed_from),
                },
                note,
            ))
        }
        FileEvent::Failed(f) => {
            let host = f.host.clone().or_else(|| hosts.first().cloned())?;
            Some(failed(&host, f.exit_code, f.reason_code, &f.reason))
        }
    }
}

/// A host's failure, as close to its cause as a RESULT can say: the
/// refusal's code, or the ACK status of its class.
fn failed(host: &str, exit: ExitCode, code: Option<&str>, reason: &str) -> HopResult {
    let refusal = code.and_then(RejectCode::from_slug);
    let verdict = match (refusal, exit) {
        (Some(code), _) => HopVerdict::Reject(code),
        (None, ExitCode::Integrity) => HopVerdict::Ack(AckStatus::Integrity),
        (None, ExitCode::TimeoutOrPeerLost | ExitCode::CannotConnect) => HopVerdict::Lost,
        (None, _) => HopVerdict::Ack(AckStatus::Io),
    };
    // The sender words the verdict itself ("rejected by the receiver
    // (file exists): ..."): the reason goes without the words it was
    // reported with here, so they are not said twice.
    let said = match verdict {
        HopVerdict::Reject(code) => XferError::Rejected {
            code: Some(code),
            reason: String::new(),
        }
        .to_string(),
        HopVerdict::Ack(AckStatus::Integrity) => "the receiver reports: ".to_string(),
        HopVerdict::Lost => XferError::PeerLost(String::new()).to_string(),
        HopVerdict::Ack(_) => XferError::PeerIo(String::new()).to_string(),
    };
    let reason = reason.strip_prefix(said.as_str()).unwrap_or(reason);
    HopResult::new(host.to_string(), verdict, 0, reason)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hosts_failure_keeps_its_code_and_is_not_worded_twice() {
        let e = XferError::Rejected {
            code: Some(RejectCode::Exists),
            reason: "f already exists".into(),
        };
        let r = failed("h", e.exit_code(), e.reason_code(), &e.to_string());
        assert_eq!(r.verdict, HopVerdict::Reject(RejectCode::Exists));
        assert_eq!(r.reason, "f already exists");
        let io = XferError::PeerIo("disk full".into());
        let r = failed("h", io.exit_code(), io.reason_code(), &io.to_string());
        assert_eq!(r.verdict, HopVerdict::Ack(AckStatus::Io));
        assert_eq!(r.reason, "disk full");
        let lost = XferError::PeerLost("gone".into());
        let r = failed("h", lost.exit_code(), lost.reason_code(), &lost.to_string());
        assert_eq!(r.verdict, HopVerdict::Lost);
        assert_eq!(r.reason, "gone");
    }

    #[test]
    fn hop_names_resolve_with_the_default_port() {
        assert_eq!(
            resolve("10.0.0.1").unwrap(),
            "10.0.0.1:7471".parse().unwrap()
        );
        assert_eq!(
            resolve("10.0.0.1:9").unwrap(),
            "10.0.0.1:9".parse().unwrap()
        );
        assert_eq!(
            resolve("fe80::1").unwrap(),
            "[fe80::1]:7471".parse().unwrap()
        );
        assert_eq!(
            resolve("[fe80::1]:9").unwrap(),
            "[fe80::1]:9".parse().unwrap()
        );
        assert_eq!(resolve("localhost:9").unwrap().port(), 9);
    }

    #[test]
    fn a_next_host_that_cannot_be_set_up_is_lost_for_the_session() {
        // "" does not resolve, and asks no name server.
        let next = NextHops {
            hosts: vec![String::new(), "after:7471".into()],
            keys: HopKeys::Shared(Token::new(b"relay-test-token".to_vec()).unwrap()),
            timeout: Duration::from_secs(30),
            chunk_size: 4096,
            ack_timeout: crate::engine::AckTimeout::Auto,
            source: None,
        };
        let dir = Hello {
            version: crate::proto::PROTOCOL_VERSION,
            caps: hello_flags::DIRECTORY,
            name: "d".into(),
            size: 0,
            mode: 0o755,
            digest: DigestAlg::Crc32,
            mtime: None,
            piece: None,
        };
        let mut downstream = Downstream::open(&next, &dir);
        assert!(hop_config(&next, &dir).is_err());
        drop(downstream.offer(&dir, Kept::Nothing));
        assert!(downstream.is_answered());
        let forwarded = downstream.results();
        // Lost (the hosts after it are passed on to), each host failed.
        assert!(forwarded.lost.is_some());
        assert_eq!(forwarded.results.len(), 2);
        assert!(
            forwarded
                .results
                .iter()
                .all(|r| r.verdict != HopVerdict::Ack(AckStatus::Ok))
        );
        assert!(downstream.has_ended());
    }
}
