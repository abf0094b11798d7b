//! A session's long file work for an offer, on its worker (`engine/worker.rs`):
//! what is held of an offer with RESUME (a partial file another session
//! holds waited for, a kept prefix read back), and for a COMPARE the
//! copy's SHA-256 (and the --link-dest link or copy). The loop keeps
//! waiting on the link meanwhile; the result comes back to it
//! (`file_work_done`).

use super::{AwaitingFrom, CompareOf, DigestFor, Session, interrupted};
use crate::engine::receiver::storage::FileStore;
use crate::engine::receiver::storage::existing::take_time;
use crate::engine::receiver::storage::link_dest::{LinkCandidate, LinkError, Linked};
use crate::engine::receiver::storage::partial::{Claim, Holding, copy_digest};
use crate::engine::report::{FileEvent, FileReport, Phases};
use crate::engine::worker::{Cancel, Worker};
use crate::error::XferError;
use crate::proto::{AckStatus, Found, Hello, HopVerdict, Mtime, Reject, escaped};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tracing::{debug, info};

/// What the store holds of an offer with RESUME, and the claim on its
/// partial file.
type Held = Result<(Holding, Option<Claim>), Reject>;

/// A finished piece of file work, with what the session needs to go on.
pub(super) enum Done {
    /// What is held of an offer with RESUME (`offer_holding`).
    Holding {
        held: Box<Held>,
        hello: Hello,
        hello_at: Instant,
    },
    /// A COMPARE: the copy's SHA-256, and the link if it is the sender's.
    Compare(Box<Comparison>),
}

/// A COMPARE's finished work, with the offer it is about.
pub(super) struct Comparison {
    compared: Compared,
    waiting: AwaitingFrom,
    sha256: [u8; 32],
    /// The copy is --link-dest's (else the receiver's own).
    link: bool,
}

/// What a COMPARE's copy was found to be.
pub(super) struct Compared {
    /// The copy's SHA-256, or why it could not be read.
    digest: std::io::Result<[u8; 32]>,
    /// The --link-dest copy put in place (only when it is the sender's).
    linked: Option<Result<Linked, LinkError>>,
}

/// The copy a COMPARE is about.
enum HeldCopy {
    /// The complete copy HAVE announced.
    Own(std::fs::File),
    /// --link-dest's file.
    Link(Box<LinkCopy>),
}

/// --link-dest's file, linked (or copied) into place by its own store if
/// it is the sender's.
struct LinkCopy {
    candidate: LinkCandidate,
    store: Option<FileStore>,
    hello: Hello,
    /// Overwrite, chunk length, the output directory.
    how: (bool, u32, PathBuf),
}

impl HeldCopy {
    /// The copy's SHA-256 against the sender's; the receiver's own copy
    /// found the same takes `retime` (the offer's modification time, so
    /// that the next run finds it unchanged by size and time alone).
    fn compare(
        self,
        sha256: [u8; 32],
        (size, chunk_len): (u64, u32),
        retime: Option<Mtime>,
        cancel: &Cancel,
    ) -> Compared {
        let mut tick = || cancel.check();
        let file = match &self {
            HeldCopy::Own(file) => file,
            HeldCopy::Link(link) => &link.candidate.file,
        };
        let digest = copy_digest(file, size, chunk_len, &mut tick);
        if let (HeldCopy::Own(file), Ok(d), Some(t)) = (&self, &digest, retime)
            && *d == sha256
            && let Err(e) = take_time(file, t)
        {
            info!("the same copy keeps its modification time: {e}");
        }
        let linked = match self {
            HeldCopy::Link(link) if matches!(digest, Ok(d) if d == sha256) => {
                let LinkCopy {
                    candidate,
                    store,
                    hello,
                    how: (overwrite, chunk_len, dir),
                } = *link;
                Some(match store {
                    Some(mut store) => store.link_into_place(
                        &hello,
                        &candidate,
                        sha256,
                        (overwrite, chunk_len, &dir),
                        &mut tick,
                    ),
                    None => Err(LinkError::NoDirectory),
                })
            }
            _ => None,
        };
        Compared { digest, linked }
    }
}

/// Tests: what the next COMPARE's work started on a session's thread
/// does first (blocks, as a read stuck in the kernel does).
#[cfg(test)]
pub(super) type CompareHook = Box<dyn FnOnce() + Send>;

#[cfg(test)]
thread_local! {
    pub(super) static COMPARE_HOOK: std::cell::Cell<Option<CompareHook>> =
        const { std::cell::Cell::new(None) };
}

/// Which copy a COMPARE is about: --link-dest's (`link`) or the
/// receiver's own.
fn whose(link: bool) -> &'static str {
    if link {
        "the --link-dest copy"
    } else {
        "the receiver's copy"
    }
}

/// Why the file work could not start (no descriptor or thread to spare):
/// that offer's failure, not the session's.
fn not_started(e: &std::io::Error) -> String {
    format!("cannot start the session's file work: {e}")
}

impl Session<'_, '_> {
    /// An offer with RESUME: what the receiver holds of it is read on the
    /// worker (a KEEPALIVE every `keepalive_interval` meanwhile); its HAVE
    /// follows (`held`), and the sender's FROM decides (`on_from`).
    pub(super) fn offer_holding(
        &mut self,
        hello: Hello,
        hello_at: Instant,
    ) -> Result<(), XferError> {
        // An earlier session of the same file whose sender is gone ends
        // within its timeout (and records what it verified): worth waiting.
        let wait = self.cfg.timeout + Duration::from_secs(10);
        let how = (self.cfg.chunk_size, self.cfg.overwrite);
        let what = format!("reading back the kept part of {}", escaped(&hello.name));
        let started = match self.store.for_worker() {
            Ok(Some(store)) => self
                .start_worker("rdma-xfer-holding", what)
                .map(|worker| (store, worker)),
            // Nothing is read for the other stores: answered at once.
            Ok(None) => {
                let held = self.store.holding(&hello, how, wait, &mut || Ok(()));
                return self.held(hello, hello_at, held);
            }
            Err(e) => Err(e),
        };
        let (store, worker) = match started {
            Ok(started) => started,
            // Not this offer's failure: it comes whole, nothing kept (no
            // claim), as when another session holds its partial file.
            Err(e) => {
                let nothing = Holding::nothing(format!("{}: sent whole", not_started(&e)));
                return self.held(hello, hello_at, Ok((nothing, None)));
            }
        };
        let job = move |cancel: &Cancel| Done::Holding {
            held: Box::new(store.holding(&hello, how, wait, &mut || cancel.check())),
            hello,
            hello_at,
        };
        self.run_work(worker, job)
    }

    /// The sender's COMPARE of the copy HAVE announced (or of the file
    /// --link-dest may hold): hashed on the worker, the verdict follows
    /// (`compared`). For --exec's command the digest is all that was
    /// asked: the data comes (FROM 0).
    pub(super) fn on_compare(
        &mut self,
        sha256: [u8; 32],
        of: CompareOf,
        mut waiting: AwaitingFrom,
    ) -> Result<(), XferError> {
        let link = matches!(of, CompareOf::Asked(DigestFor::Link(_)));
        let copy = match of {
            CompareOf::Asked(DigestFor::Command) => {
                // Known before the data: the command gets it (and the data
                // is checked against it), then the data comes (FROM 0).
                waiting.announced = Some(sha256);
                self.machine
                    .have_found(Found::Nothing(String::new()), waiting)?;
                return Ok(());
            }
            CompareOf::Copy(file) => Ok(HeldCopy::Own(file)),
            CompareOf::Asked(DigestFor::Link(candidate)) => self.store.for_worker().map(|store| {
                HeldCopy::Link(Box::new(LinkCopy {
                    candidate,
                    store,
                    hello: waiting.hello.clone(),
                    how: (
                        self.cfg.overwrite,
                        self.cfg.chunk_size,
                        self.cfg.dir.clone(),
                    ),
                }))
            }),
        };
        let what = format!(
            "hashing {} of {}",
            whose(link),
            escaped(&waiting.hello.name)
        );
        let started =
            copy.and_then(|copy| Ok((copy, self.start_worker("rdma-xfer-compare", what)?)));
        let (copy, worker) = match started {
            Ok(started) => started,
            // The copy cannot be compared: the file comes whole.
            Err(e) => {
                let e = std::io::Error::new(e.kind(), not_started(&e));
                let compared = Compared {
                    digest: Err(e),
                    linked: None,
                };
                return self.compared(compared, waiting, sha256, link);
            }
        };
        let (size, chunk_len) = (waiting.hello.size, self.cfg.chunk_size);
        // Only where files may be replaced (--overwrite); a dry run changes
        // nothing, not even a time.
        let retime = waiting
            .hello
            .mtime
            .filter(|_| !link && self.cfg.overwrite && !self.machine.offer_is_dry_run());
        #[cfg(test)]
        let hook = COMPARE_HOOK.take();
        let job = move |cancel: &Cancel| {
            #[cfg(test)]
            if let Some(hook) = hook {
                hook();
            }
            Done::Compare(Box::new(Comparison {
                compared: copy.compare(sha256, (size, chunk_len), retime, cancel),
                waiting,
                sha256,
                link,
            }))
        };
        self.run_work(worker, job)
    }

    /// A thread for the offer's file work (`what` it does, for its
    /// errors); its stall limit is the session's --timeout.
    fn start_worker(&self, name: &'static str, what: String) -> std::io::Result<Worker<Done>> {
        Worker::start(name, what, self.cfg.timeout)
    }

    /// Runs `job` on the session's worker (the machine waits for its
    /// result: one at a time). KEEPALIVEs go out while it runs.
    fn run_work(
        &mut self,
        worker: Worker<Done>,
        job: impl FnOnce(&Cancel) -> Done + Send + 'static,
    ) -> Result<(), XferError> {
        // The sender waits meanwhile: the machine keeps it informed.
        self.machine.work_started(Instant::now())?;
        self.work = Some(worker.run(job));
        Ok(())
    }

    /// Goes on with the file work's result once it is there (the worker
    /// has ended then); false while it is not.
    pub(super) fn file_work_done(&mut self) -> Result<bool, XferError> {
        let Some(done) = self.work.as_mut().and_then(Worker::result) else {
            return Ok(false);
        };
        self.work = None;
        match done? {
            Done::Holding {
                held,
                hello,
                hello_at,
            } => self.held(hello, hello_at, *held)?,
            Done::Compare(comparison) => {
                let Comparison {
                    compared,
                    waiting,
                    sha256,
                    link,
                } = *comparison;
                self.compared(compared, waiting, sha256, link)?
            }
        }
        Ok(true)
    }

    /// What the store holds of an offer with RESUME goes back in a HAVE
    /// (or the offer is refused, or --link-dest is asked about).
    fn held(&mut self, hello: Hello, hello_at: Instant, held: Held) -> Result<(), XferError> {
        // A signal stopped the wait or the read: what is kept stays as it
        // is, and nothing is answered about it.
        interrupted()?;
        let (mut holding, claim) = match held {
            Ok(h) => h,
            Err(refusal) => return self.refuse_or_forward_resumable(hello, hello_at, refusal),
        };
        if matches!(holding.found, Found::Complete(_)) {
            if let Some(why) = self.machine.why_not_compare(&hello.name, hello.size) {
                holding = Holding::nothing(why);
            } else if self.next_hops().is_some() {
                // With hosts after it, a host takes the data to pass it on
                // (what is here then decides as for any offer).
                holding = Holding::nothing(String::new());
            }
        }
        // Nothing kept here: --link-dest may still have it.
        if matches!(holding.found, Found::Nothing(_))
            && let Some(why) = self.digest_for(&hello)
        {
            return self.ask_digest(hello, hello_at, why, claim);
        }
        match &holding.found {
            Found::Complete(_) => info!(file = %hello.name, "the complete file is here already"),
            Found::Prefix { bytes, .. } => {
                info!(file = %hello.name, bytes, "a verified part is kept")
            }
            Found::Nothing(note) if note.is_empty() => debug!(file = %hello.name, "nothing kept"),
            Found::Nothing(note) => info!(file = %hello.name, "nothing reusable: {note}"),
        }
        let waiting = AwaitingFrom {
            hello,
            hello_at,
            kept: holding.kept,
            announced: None,
            claim,
            own: None,
        };
        let found = holding.found.map_copy(CompareOf::Copy);
        self.machine.have_found(found, waiting)?;
        Ok(())
    }

    /// The verdict on a compared copy: the same SHA-256 acknowledges the
    /// file without data (kept, or linked from --link-dest); another (or a
    /// copy that cannot be read or linked) is a HAVE of nothing, and FROM 0
    /// follows.
    fn compared(
        &mut self,
        Compared { digest, linked }: Compared,
        waiting: AwaitingFrom,
        sha256: [u8; 32],
        link: bool,
    ) -> Result<(), XferError> {
        // A signal stopped the read: no verdict on the copy.
        interrupted()?;
        let whose = whose(link);
        let name = waiting.hello.name.clone();
        let mut differs = match digest {
            Ok(d) if d == sha256 => None,
            Ok(_) => Some(format!("{whose} differs from the source")),
            Err(e) => Some(format!("cannot read {whose} of {name}: {e}")),
        };
        let mut outcome = crate::engine::Outcome::Unchanged;
        if let Some(linked) = linked {
            match linked {
                Ok(Linked::HardLink) => info!(file = %name, "linked from --link-dest"),
                Ok(Linked::Copy(why)) => {
                    info!(file = %name, "copied from --link-dest ({why})")
                }
                Err(why) => differs = Some(format!("{whose} cannot be used: {why}")),
            }
            outcome = crate::engine::Outcome::Linked;
        }
        if let Some(note) = differs {
            info!(file = %name, "{note}: received whole");
            self.machine.have_found(Found::Nothing(note), waiting)?;
            return Ok(());
        }
        if !link {
            info!(file = %name, "unchanged: the receiver's copy is the same");
            // The last host of a chain (the others take the data).
            self.tell_results(HopVerdict::Ack(AckStatus::Unchanged), 0, "")?;
        }
        self.machine.same()?;
        // The verdict goes out before the report, which is made either way.
        let sent = self.transmit();
        let report = FileReport {
            name,
            bytes: waiting.hello.size,
            elapsed: waiting.hello_at.elapsed(),
            digest: Some(crate::proto::Digest::Sha256(sha256)),
            phases: Phases {
                connect: self.connect_time,
                ..Phases::default()
            },
            resumed_from: 0,
            outcome,
            host: None,
        };
        (self.on_file)(FileEvent::Done(&report));
        sent
    }
}
