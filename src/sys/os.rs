//! The plain system calls the tools need besides verbs: waiting on a file
//! descriptor, shutdown signals, the memlock limit, free space, pipe sizes
//! and peak RSS and CPU time. Safe wrappers from `rustix` where they
//! exist; only the signal handler and `getrusage` need `unsafe` here.

use super::{Result, SysError};
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::process::{Resource, Rlimit};
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static SHUTDOWN: AtomicBool = AtomicBool::new(false);

/// Longest single sleep in `wait_readable`, so that a shutdown signal is
/// noticed promptly even if it raced with the start of `poll()`.
const SLICE: Duration = Duration::from_millis(200);

extern "C" fn on_shutdown_signal(_sig: libc::c_int) {
    SHUTDOWN.store(true, Ordering::SeqCst);
}

/// Installs SIGINT/SIGTERM handlers that request a clean shutdown. Blocking
/// waits in this module then return `SysError::Interrupted`.
pub fn install_shutdown_handlers() -> Result<()> {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: a zeroed sigaction is a valid starting value; the handler
        // only stores to an atomic, which is async-signal-safe. No SA_RESTART,
        // so a blocked poll() returns EINTR.
        let rc = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_shutdown_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if rc != 0 {
            return Err(SysError::last_os("sigaction"));
        }
    }
    Ok(())
}

/// `timeout` from now, saturating (a century) instead of panicking when a
/// configuration asks for an absurd timeout.
pub fn deadline_after(timeout: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)))
        .unwrap_or(now)
}

/// Asks for the same clean shutdown as SIGINT/SIGTERM (a receiver
/// started over ssh whose channel closed).
pub fn request_shutdown() {
    SHUTDOWN.store(true, Ordering::SeqCst);
}

/// True once SIGINT or SIGTERM arrived (or `request_shutdown` was called).
pub fn shutdown_requested() -> bool {
    SHUTDOWN.load(Ordering::SeqCst)
}

/// Puts a file descriptor into non-blocking mode.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, call: &'static str) -> Result<()> {
    let flags = rustix::fs::fcntl_getfl(fd).map_err(|e| errno(call, e))?;
    rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK).map_err(|e| errno(call, e))
}

fn errno(call: &'static str, e: rustix::io::Errno) -> SysError {
    SysError::Call {
        call,
        source: e.into(),
    }
}

/// Waits until `fd` is readable or `deadline` passes. Returns Ok(true) when
/// readable, Ok(false) on timeout, Err(Interrupted) on a shutdown request.
pub fn wait_readable(fd: impl AsFd, deadline: Instant) -> Result<bool> {
    wait_ready(fd, PollFlags::IN, deadline)
}

/// Waits until `fd` (a pipe's write end) takes data or its reader is gone,
/// as `wait_readable` does.
pub fn wait_writable(fd: impl AsFd, deadline: Instant) -> Result<bool> {
    wait_ready(fd, PollFlags::OUT, deadline)
}

/// A signal for `signal_group`.
#[derive(Debug, Clone, Copy)]
pub enum GroupSignal {
    /// SIGTERM: asks the processes to end.
    Terminate,
    /// SIGKILL: ends them.
    Kill,
}

/// Sends `sig` to the process group led by `child` (a child started with
/// `process_group(0)`: the command and whatever it started). A group that
/// is gone already is no error.
pub fn signal_group(child: &std::process::Child, sig: GroupSignal) -> std::io::Result<()> {
    let sig = match sig {
        GroupSignal::Terminate => rustix::process::Signal::TERM,
        GroupSignal::Kill => rustix::process::Signal::KILL,
    };
    match rustix::process::kill_process_group(rustix::process::Pid::from_child(child), sig) {
        Ok(()) | Err(rustix::io::Errno::SRCH) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// argv[0] of the receiver's own binary started as the trampoline of an
/// `--exec` command (see `confined_command`).
pub const EXEC_TRAMPOLINE: &str = "rdma-xfer-exec";

/// Set once the running binary serves as the trampoline
/// (`exec_trampoline_or_continue` was called in its `main`).
static TRAMPOLINE_READY: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// The first call of the receiver's `main`. Started as the trampoline
/// (argv[0] is `EXEC_TRAMPOLINE`: `confined_command` started it), this
/// process arms its parent-death signal and becomes the command (never
/// returns). Otherwise it notes that this binary can serve as the
/// trampoline, and returns.
pub fn exec_trampoline_or_continue() {
    let mut args = std::env::args_os();
    if args.next().as_deref() != Some(std::ffi::OsStr::new(EXEC_TRAMPOLINE)) {
        TRAMPOLINE_READY.store(true, std::sync::atomic::Ordering::Relaxed);
        return;
    }
    let why = become_the_command(args);
    eprintln!("receiver: error: cannot start the --exec command: {why}");
    std::process::exit(127)
}

/// The trampoline: `PARENT_PID PROGRAM ARGS...`. Killed (SIGKILL) when the
/// thread that started it ends, checked to still have that parent, then
/// replaced by PROGRAM (same process: the signal stays armed). Returns
/// only why it could not.
fn become_the_command(mut args: std::env::ArgsOs) -> String {
    use std::os::unix::process::CommandExt;
    let parent = args
        .next()
        .and_then(|p| p.to_str()?.parse::<i32>().ok())
        .and_then(rustix::process::Pid::from_raw);
    let (Some(parent), Some(program)) = (parent, args.next()) else {
        return format!("usage: {EXEC_TRAMPOLINE} PARENT_PID PROGRAM [ARGS...]");
    };
    let kill = Some(rustix::process::Signal::KILL);
    if let Err(e) = rustix::process::set_parent_process_death_signal(kill) {
        return format!("cannot arm the parent-death signal: {e}");
    }
    // The parent may have died before the signal was armed.
    if rustix::process::getppid() != Some(parent) {
        return "the receiver that started it is gone".into();
    }
    std::process::Command::new(program)
        .args(args)
        .exec()
        .to_string()
}

/// A command that runs `program` in the directory open as `dir` (by
/// descriptor: the directory that was checked, not a path looked up
/// again) and is killed (SIGKILL) when the thread that starts it ends: if
/// the receiver dies mid-file, the command must not take the end of its
/// input for a complete file. `dir` must stay open until the command is
/// spawned.
///
/// Started without a fork of the receiver: a fork would copy the page
/// tables of a process that holds registered (pinned) memory, and the
/// kernel copies pinned pages for the child at once (or, on kernels
/// before 5.9 without `ibv_fork_init`, the parent's next write to a
/// registered page can leave the NIC writing to the child's copy). So the
/// command carries no `pre_exec` code: std then starts it with
/// posix_spawn (clone with CLONE_VM and CLONE_VFORK: nothing copied, the
/// receiver's thread waits until the exec); its directory is a spawn
/// file action (chdir to `/proc/self/fd/N`, resolved in the child, where
/// N is still open: exactly `dir`), its process group a spawn attribute
/// (`process_group`); and the parent-death signal, which only the child
/// can arm, is armed after an exec, by the receiver's own binary started
/// as a trampoline (`EXEC_TRAMPOLINE`) that then becomes `program`. A
/// binary that never called `exec_trampoline_or_continue` (tests, other
/// users of the library) runs `program` directly, without that signal.
pub fn confined_command(program: &str, dir: &std::fs::File) -> std::process::Command {
    use std::os::fd::AsRawFd;
    use std::os::unix::process::CommandExt;
    let mut cmd = if TRAMPOLINE_READY.load(std::sync::atomic::Ordering::Relaxed) {
        let mut cmd = std::process::Command::new("/proc/self/exe");
        cmd.arg0(EXEC_TRAMPOLINE)
            .arg(rustix::process::getpid().as_raw_nonzero().to_string())
            .arg(program);
        cmd
    } else {
        std::process::Command::new(program)
    };
    cmd.current_dir(format!("/proc/self/fd/{}", dir.as_raw_fd()));
    cmd
}

/// statfs's f_type of procfs (linux/magic.h).
const PROC_SUPER_MAGIC: i64 = 0x9fa0;

/// Takes the variable `name` out of the process environment for good: its
/// value is returned, the variable removed (no child inherits it, no
/// later `getenv` finds it), and its bytes in the environment block the
/// kernel wrote at exec — what `/proc/PID/environ` shows to whoever may
/// read it, long after `unsetenv` — overwritten with zeros. Meant for a
/// secret (the token), first thing in `main`.
///
/// Changing the environment is unsound while another thread may read it
/// (hence `std::env::remove_var` is `unsafe`): this checks that the
/// process runs exactly one thread, this one (which then cannot start
/// another meanwhile), and otherwise changes nothing and says why.
pub fn take_env_var(name: &str) -> std::io::Result<Option<std::ffi::OsString>> {
    use std::os::unix::ffi::OsStrExt;
    let Some(value) = std::env::var_os(name) else {
        return Ok(None);
    };
    // /proc answers for this process below (threads, the block's bounds):
    // only the kernel's procfs may be believed.
    if !rustix::fs::statfs("/proc/self").is_ok_and(|s| s.f_type == PROC_SUPER_MAGIC) {
        return Err(std::io::Error::other(format!(
            "/proc is not procfs: {name} cannot be removed from the environment safely"
        )));
    }
    let threads = std::fs::read_dir("/proc/self/task")?.count();
    if threads != 1 {
        return Err(std::io::Error::other(format!(
            "{threads} threads run: {name} cannot be removed from the environment safely"
        )));
    }
    let cname = std::ffi::CString::new(name)
        .map_err(|_| std::io::Error::other(format!("{name:?} holds a NUL byte")))?;
    // SAFETY: getenv only reads the environment, and this is the process's
    // only thread (checked above): nothing changes it meanwhile.
    let found = unsafe { libc::getenv(cname.as_ptr()) };
    // The whole `NAME=value` entry, if it lies in the exec-time block (an
    // entry set later lives in memory the C library owns: left alone).
    let entry_len = name.len() + 1 + value.as_bytes().len();
    let entry = (!found.is_null())
        .then(|| found.cast::<u8>().wrapping_sub(name.len() + 1))
        .filter(|start| {
            exec_env_block().is_some_and(|(from, to)| {
                start.addr() >= from && start.addr().saturating_add(entry_len) <= to
            })
        });
    // SAFETY: as above, the only thread: no other reads or writes the
    // environment while it changes.
    unsafe { std::env::remove_var(name) };
    if let Some(start) = entry {
        // SAFETY: [start, start + entry_len) lies inside the environment
        // block the kernel wrote on the initial stack at exec (checked
        // against /proc/self/stat): mapped and writable for the life of the
        // process, owned by no allocator (the C library never frees it),
        // and no longer listed in `environ` (removed just above). It holds
        // `NAME=value`: `found` was the value getenv returned, right after
        // `NAME=`, and the value is `entry_len` - `NAME=` bytes long. No
        // Rust reference to these bytes exists, and no other thread runs.
        unsafe { std::ptr::write_bytes(start, 0, entry_len) };
    }
    Ok(Some(value))
}

/// Where the kernel put the environment strings at exec: fields 50 and 51
/// (env_start, env_end) of /proc/self/stat, after the command name (which
/// may hold spaces and parentheses, hence from the last `)`).
fn exec_env_block() -> Option<(usize, usize)> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let (_, after_name) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Field 3 (the state) comes first.
    let field = |n: usize| fields.get(n - 3)?.parse::<usize>().ok();
    Some((field(50)?, field(51)?))
}

/// Makes the process not dumpable (`PR_SET_DUMPABLE` 0): no core dump,
/// and its `/proc/PID` files (`environ`, `mem`, ...) and ptrace refused to
/// processes of the same user without CAP_SYS_PTRACE, such as the
/// commands it starts. Also reset by the kernel at an exec of a setuid
/// program; never set back here.
pub fn set_not_dumpable() -> std::io::Result<()> {
    Ok(rustix::process::set_dumpable_behavior(
        rustix::process::DumpableBehavior::NotDumpable,
    )?)
}

/// Bytes written to the pipe `fd` and not read yet.
pub fn pipe_unread(fd: impl AsFd) -> std::io::Result<u64> {
    Ok(rustix::io::ioctl_fionread(fd)?)
}

fn wait_ready(fd: impl AsFd, flags: PollFlags, deadline: Instant) -> Result<bool> {
    loop {
        if shutdown_requested() {
            return Err(SysError::Interrupted);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let slice = (deadline - now).min(SLICE);
        let mut fds = [PollFd::new(&fd, flags)];
        let slice = slice.max(Duration::from_millis(1));
        let timeout = Timespec {
            tv_sec: slice.as_secs() as _,
            tv_nsec: slice.subsec_nanos() as _,
        };
        match rustix::event::poll(&mut fds, Some(&timeout)) {
            Ok(n) if n > 0 => return Ok(true),
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(errno("poll", e)),
        }
    }
}

/// CAP_IPC_LOCK's bit in the capability sets (linux/capability.h).
const CAP_IPC_LOCK: u32 = 14;

/// How much memory this process may still pin (register for RDMA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemlockRoom {
    /// No limit: CAP_IPC_LOCK in the effective set of the initial user
    /// namespace (the kernel then pins past RLIMIT_MEMLOCK: root, or a
    /// unit with AmbientCapabilities=CAP_IPC_LOCK), or an unlimited
    /// RLIMIT_MEMLOCK.
    Unlimited,
    /// RLIMIT_MEMLOCK applies.
    Limited {
        /// The soft limit, raised to the hard one where it was lower.
        limit: u64,
        /// The hard limit (`u64::MAX`: unlimited).
        hard: u64,
        /// Bytes pinned (registered) or locked (mlock) already.
        pinned: u64,
    },
}

impl MemlockRoom {
    /// Bytes that may still be pinned; None: no limit.
    pub fn available(&self) -> Option<u64> {
        match *self {
            MemlockRoom::Unlimited => None,
            MemlockRoom::Limited { limit, pinned, .. } => Some(limit.saturating_sub(pinned)),
        }
    }

    /// The refusal of `needed` more bytes (what for, if known): the error
    /// every memlock failure is reported with.
    pub fn refusal(&self, needed: u64, what: Option<String>) -> SysError {
        let (limit, hard, pinned) = match *self {
            MemlockRoom::Unlimited => (u64::MAX, u64::MAX, 0),
            MemlockRoom::Limited {
                limit,
                hard,
                pinned,
            } => (limit, hard, pinned),
        };
        SysError::Memlock {
            needed,
            what,
            pinned,
            limit,
            hard,
        }
    }
}

/// What this process may still pin. Raises the soft RLIMIT_MEMLOCK to the
/// hard limit first (best effort) when the limit applies at all.
pub fn memlock_room() -> MemlockRoom {
    // Without /proc nothing is known: no capability, nothing pinned.
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid_map = std::fs::read_to_string("/proc/self/uid_map").ok();
    if has_ipc_lock(&status, uid_map.as_deref()) {
        return MemlockRoom::Unlimited;
    }
    let mut lim = rustix::process::getrlimit(Resource::Memlock);
    if lim.current != lim.maximum {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if rustix::process::setrlimit(Resource::Memlock, raised).is_ok() {
            lim = raised;
        }
    }
    // None means unlimited.
    match lim.current {
        None => MemlockRoom::Unlimited,
        Some(limit) => MemlockRoom::Limited {
            limit,
            hard: lim.maximum.unwrap_or(u64::MAX),
            pinned: pinned_bytes(&status),
        },
    }
}

/// Makes sure `needed` more bytes can be pinned (registered): with
/// CAP_IPC_LOCK always; otherwise if they fit under RLIMIT_MEMLOCK (raised
/// to the hard limit if need be) beside what is pinned already. Fails
/// with a message naming the limit and how to raise it.
pub fn ensure_memlock(needed: u64) -> Result<()> {
    let room = memlock_room();
    // The kernel counts whole pages.
    let pages = needed.div_ceil(4096).saturating_mul(4096);
    match room.available() {
        Some(available) if pages > available => Err(room.refusal(needed, None)),
        _ => Ok(()),
    }
}

/// The memlock refusal that most likely explains an ENOMEM from a
/// registration of `needed` bytes; None where no limit applies (the
/// memory itself ran out).
pub fn memlock_refusal(needed: u64) -> Option<SysError> {
    let room = memlock_room();
    room.available().map(|_| room.refusal(needed, None))
}

/// Whether the kernel lets this process pin memory past RLIMIT_MEMLOCK:
/// CAP_IPC_LOCK in the effective set (`CapEff:` of /proc/self/status),
/// which the kernel checks in the initial user namespace only
/// (`capable()`): a root of a container's user namespace has the bit
/// set and is still limited. `uid_map` is /proc/self/uid_map (None: no
/// user namespaces in this kernel, so the initial one).
fn has_ipc_lock(status: &str, uid_map: Option<&str>) -> bool {
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    effective.is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
        && uid_map.is_none_or(is_initial_uid_map)
}

/// True for the uid_map of the initial user namespace: every uid, mapped
/// to itself.
fn is_initial_uid_map(uid_map: &str) -> bool {
    let lines: Vec<Vec<&str>> = uid_map
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| !f.is_empty())
        .collect();
    matches!(lines.as_slice(), [only] if only.as_slice() == ["0", "0", "4294967295"])
}

/// Bytes pinned (`VmPin:`, registrations) and locked (`VmLck:`, mlock)
/// by this process, from /proc/self/status; 0 for lines not there. The
/// kernel checks a registration against RLIMIT_MEMLOCK with the pinned
/// count alone; adding the locked one errs on the safe side.
fn pinned_bytes(status: &str) -> u64 {
    ["VmPin:", "VmLck:"]
        .iter()
        .filter_map(|field| status_kib(status, field))
        .fold(0, u64::saturating_add)
}

/// A `NAME:  1234 kB` line of /proc/self/status, in bytes.
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Raises the soft RLIMIT_NOFILE to the hard limit (best effort): a
/// receiver keeps a batch's files open from its MR to its commit, up to a
/// few hundred per session, and the default soft limit is 1024. Returns
/// the soft limit now in force (None: unlimited).
pub fn raise_open_files() -> Option<u64> {
    let lim = rustix::process::getrlimit(Resource::Nofile);
    if lim.current != lim.maximum {
        let raised = Rlimit {
            current: lim.maximum,
            maximum: lim.maximum,
        };
        if rustix::process::setrlimit(Resource::Nofile, raised).is_ok() {
            return lim.maximum;
        }
    }
    lim.current
}

/// The receiver's umask, which received modes are masked with (as scp
/// does without -p).
pub fn process_umask() -> u32 {
    // /proc shows it without changing it (Linux 4.7+).
    let from_proc = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        });
    from_proc.unwrap_or_else(|| {
        // Older kernels: set and restore. Racy only against threads that
        // create files meanwhile; it is called once, at start-up.
        let old = rustix::process::umask(rustix::fs::Mode::from_raw_mode(0o077));
        rustix::process::umask(old);
        old.as_raw_mode()
    }) & 0o777
}

/// The source address the routing table picks towards `peer` (a UDP
/// socket's connect sends nothing).
pub fn source_towards(peer: std::net::IpAddr) -> Option<std::net::IpAddr> {
    use std::net::{SocketAddr, UdpSocket};
    let any: SocketAddr = match peer {
        std::net::IpAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        std::net::IpAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    let socket = UdpSocket::bind(any).ok()?;
    socket.connect(SocketAddr::new(peer, 9)).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}

/// The IP addresses of this host's network interfaces, as (interface,
/// address), in the order the kernel lists them.
pub fn interface_addresses() -> Vec<(String, std::net::IpAddr)> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: head is a valid out-pointer; on success the list it gets is
    // freed below, once, with freeifaddrs.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut node = head;
    while !node.is_null() {
        // SAFETY: node is an element of the list getifaddrs returned, alive
        // until freeifaddrs below; nothing here keeps a reference past it.
        let ifa = unsafe { &*node };
        node = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is non-NULL and points to a sockaddr whose
        // sa_family tells its real type, read only as that type below.
        let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
        let ip = match family {
            libc::AF_INET => {
                // SAFETY: an AF_INET address is a sockaddr_in.
                let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
                IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
            }
            libc::AF_INET6 => {
                // SAFETY: an AF_INET6 address is a sockaddr_in6.
                let sin6 = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in6>() };
                IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
            }
            _ => continue,
        };
        // SAFETY: ifa_name is a non-NULL NUL-terminated string of the
        // list, copied out at once.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }
            .to_string_lossy()
            .into_owned();
        out.push((name, ip));
    }
    // SAFETY: head came from a successful getifaddrs and is freed once;
    // no reference into the list outlives this call.
    unsafe { libc::freeifaddrs(head) };
    out
}

/// Peak resident set size of this process in bytes (0 if unknown).
pub fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| vm_hwm_bytes(&status))
        .unwrap_or(0)
}

/// CPU time this process has used so far: (user, system).
pub fn cpu_times() -> (Duration, Duration) {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes one struct rusage into memory we own, which
    // is zeroed (a valid rusage) whatever the call does; RUSAGE_SELF is a
    // valid `who`.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return (Duration::ZERO, Duration::ZERO);
    }
    // SAFETY: zero-initialized above and filled by the successful call.
    let usage = unsafe { usage.assume_init() };
    let of = |t: libc::timeval| {
        Duration::from_secs(u64::try_from(t.tv_sec).unwrap_or(0))
            + Duration::from_micros(u64::try_from(t.tv_usec).unwrap_or(0))
    };
    (of(usage.ru_utime), of(usage.ru_stime))
}

/// The `VmHWM:` line of /proc/self/status, in bytes.
fn vm_hwm_bytes(status: &str) -> Option<u64> {
    status_kib(status, "VmHWM:")
}

/// What an unprivileged writer may still use on a file system.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeSpace {
    /// Bytes.
    pub bytes: u64,
    /// Inodes (new files and directories).
    pub inodes: u64,
}

/// Free bytes and inodes on the filesystem holding `path`.
pub fn free_space(path: &std::path::Path) -> std::io::Result<FreeSpace> {
    let st = rustix::fs::statvfs(path)?;
    Ok(FreeSpace {
        bytes: st.f_bavail.saturating_mul(st.f_frsize),
        inodes: st.f_favail,
    })
}

/// Reserves the blocks of `file`'s first `len` bytes without changing its
/// size (fallocate with KEEP_SIZE), where that costs only metadata: on
/// tmpfs and ramfs it would clear every page up front (measured: 0.14 s
/// per 256 MiB on the host, far more in an emulated guest), so there it
/// returns Ok(false), as where the file system cannot (EOPNOTSUPP). An
/// error means the space is not there (ENOSPC, EDQUOT, EFBIG).
pub fn reserve_blocks(file: &std::fs::File, len: u64) -> std::io::Result<bool> {
    if len == 0 || in_memory(file)? {
        return Ok(false);
    }
    match rustix::fs::fallocate(file, rustix::fs::FallocateFlags::KEEP_SIZE, 0, len) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::OPNOTSUPP | rustix::io::Errno::NOSYS) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether `file` lives in memory (tmpfs, ramfs): its page cache is its
/// storage.
fn in_memory(file: &std::fs::File) -> std::io::Result<bool> {
    const TMPFS_MAGIC: u64 = 0x0102_1994;
    const RAMFS_MAGIC: u64 = 0x8584_58f6;
    let fs_type = rustix::fs::fstatfs(file)?.f_type as u64;
    Ok(fs_type == TMPFS_MAGIC || fs_type == RAMFS_MAGIC)
}

/// `file` opened again for writing with O_DIRECT, and the alignment its
/// direct writes need (offset, length and memory), where that bypasses a
/// page cache: None on tmpfs and ramfs (the page cache is the file
/// there), where `file` is not open for writing, and wherever the reopen
/// does not work out (no procfs, the file system refuses the flag): the
/// caller writes through the page cache then. The reopen goes through
/// /proc/self/fd (O_DIRECT belongs to an open file description, so
/// `file`'s own stays buffered) and must reach the same inode.
pub fn open_direct(file: &std::fs::File) -> Option<(std::fs::File, DirectAlign)> {
    use rustix::fs::{Mode, OFlags};
    use std::os::fd::AsRawFd;
    if in_memory(file).unwrap_or(true) {
        return None;
    }
    let access = rustix::fs::fcntl_getfl(file).ok()? & OFlags::RWMODE;
    if access != OFlags::WRONLY && access != OFlags::RDWR {
        return None;
    }
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let direct = rustix::fs::open(
        path.as_str(),
        OFlags::WRONLY | OFlags::DIRECT | OFlags::CLOEXEC | OFlags::NOCTTY,
        Mode::empty(),
    )
    .ok()
    .map(std::fs::File::from)?;
    // Whatever /proc is here, only the same inode will do.
    let (ours, reopened) = (
        rustix::fs::fstat(file).ok()?,
        rustix::fs::fstat(&direct).ok()?,
    );
    if (ours.st_dev, ours.st_ino) != (reopened.st_dev, reopened.st_ino) {
        return None;
    }
    // What direct writes must be aligned to: the file system's answer
    // (Linux 6.1 and later) and never less than its block or a page, so
    // that a direct write and a buffered one never share a block.
    let dio = rustix::fs::statx(
        &direct,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        rustix::fs::StatxFlags::DIOALIGN | rustix::fs::StatxFlags::BASIC_STATS,
    )
    .ok()?;
    if dio.stx_mask & rustix::fs::StatxFlags::DIOALIGN.bits() != 0 && dio.stx_dio_offset_align == 0
    {
        // The file system says it takes no direct I/O for this file.
        return None;
    }
    // The page of this host (4 KiB on most, 16 or 64 KiB on some arm64
    // and ppc64 kernels).
    let page = rustix::param::page_size().max(4096);
    let offset = [
        u64::from(dio.stx_dio_offset_align),
        u64::from(dio.stx_blksize),
        page as u64,
    ]
    .into_iter()
    .max()
    .unwrap_or(page as u64);
    // Without the file system's answer (before 6.1), a page.
    let memory = match dio.stx_mask & rustix::fs::StatxFlags::DIOALIGN.bits() {
        0 => page,
        _ => usize::try_from(dio.stx_dio_mem_align)
            .unwrap_or(usize::MAX)
            .max(1),
    };
    Some((direct, DirectAlign { offset, memory }))
}

/// What a direct write of a file must be aligned to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectAlign {
    /// Its offset and length (never less than the file system's block or
    /// a page).
    pub offset: u64,
    /// The memory it is written from.
    pub memory: usize,
}

/// Asks for a pipe buffer of `bytes` on `fd` (Linux F_SETPIPE_SZ), so that
/// whole 1 MiB chunks pass a pipe with one wake-up of its other end rather
/// than sixteen. Best effort: returns the size granted, or an error for
/// descriptors that are not pipes or a size above the system's limit
/// (/proc/sys/fs/pipe-max-size).
pub fn set_pipe_size(fd: &impl AsFd, bytes: usize) -> std::io::Result<usize> {
    Ok(rustix::pipe::fcntl_setpipe_size(fd, bytes)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_environment_is_left_alone_while_other_threads_run() {
        // The test harness runs this test on a thread of its own: more
        // than one thread, so nothing is removed.
        assert_eq!(take_env_var("RDMA_XFER_TEST_NEVER_SET").unwrap(), None);
        let path = std::env::var_os("PATH").expect("PATH is set");
        let e = take_env_var("PATH").unwrap_err();
        assert!(e.to_string().contains("threads run"), "{e}");
        assert_eq!(std::env::var_os("PATH"), Some(path));
    }

    #[test]
    fn the_exec_environment_block_is_found() {
        let (from, to) = exec_env_block().expect("/proc/self/stat fields 50, 51");
        assert!(from < to, "{from:x}..{to:x}");
    }

    #[test]
    fn a_process_can_be_made_not_dumpable() {
        use rustix::process::{DumpableBehavior, dumpable_behavior, set_dumpable_behavior};
        let before = dumpable_behavior().unwrap();
        set_not_dumpable().unwrap();
        assert_eq!(dumpable_behavior().unwrap(), DumpableBehavior::NotDumpable);
        set_dumpable_behavior(before).unwrap();
    }

    #[test]
    fn peak_rss_is_read_from_proc() {
        assert_eq!(
            vm_hwm_bytes("Name:\tx\nVmHWM:\t    1234 kB\nVmRSS:\t 1 kB\n"),
            Some(1234 * 1024)
        );
        assert_eq!(vm_hwm_bytes("Name:\tx\n"), None);
        assert!(peak_rss_bytes() > 0);
        // CPU time grows as the process works (however loaded the machine).
        let total = || {
            let (user, system) = cpu_times();
            user + system
        };
        let before = total();
        let spin = Instant::now();
        while total() < before + Duration::from_millis(10) {
            assert!(
                spin.elapsed() < Duration::from_secs(30),
                "no CPU time counted"
            );
            std::hint::black_box(spin.elapsed());
        }
    }

    #[test]
    fn waits_on_a_pipe_until_it_is_readable_or_the_deadline() {
        let (r, w) = rustix::pipe::pipe().unwrap();
        let t0 = Instant::now();
        assert!(!wait_readable(&r, t0 + Duration::from_millis(50)).unwrap());
        assert!(t0.elapsed() >= Duration::from_millis(50));
        rustix::io::write(&w, b"x").unwrap();
        assert!(wait_readable(&r, Instant::now() + Duration::from_secs(5)).unwrap());
        set_nonblocking(r.as_fd(), "fcntl").unwrap();
        assert!(
            rustix::fs::fcntl_getfl(&r)
                .unwrap()
                .contains(rustix::fs::OFlags::NONBLOCK)
        );
    }

    #[test]
    fn deadlines_saturate() {
        let far = deadline_after(Duration::MAX);
        assert!(far > Instant::now() + Duration::from_secs(86_400 * 365));
        assert!(deadline_after(Duration::ZERO) <= Instant::now());
    }

    #[test]
    fn memlock_within_the_limit_is_fine() {
        ensure_memlock(0).unwrap();
        assert!(free_space(std::path::Path::new("/")).is_ok());
    }

    const INITIAL_MAP: &str = "         0          0 4294967295\n";

    #[test]
    fn cap_ipc_lock_is_read_from_the_effective_set() {
        let status = |eff: &str| format!("Name:\tx\nCapPrm:\t000001ffffffffff\nCapEff:\t{eff}\n");
        // root (all capabilities), and only CAP_IPC_LOCK (bit 14).
        for eff in ["000001ffffffffff", "0000000000004000"] {
            assert!(has_ipc_lock(&status(eff), Some(INITIAL_MAP)), "{eff}");
            assert!(
                has_ipc_lock(&status(eff), None),
                "{eff}: no user namespaces"
            );
        }
        // A plain user; Docker's default set (no IPC_LOCK); all but bit 14;
        // permitted is not effective.
        for eff in ["0000000000000000", "00000000a80425fb", "000001ffffffbfff"] {
            assert!(!has_ipc_lock(&status(eff), Some(INITIAL_MAP)), "{eff}");
        }
        // Unreadable or missing: no capability assumed.
        assert!(!has_ipc_lock(&status("zz"), Some(INITIAL_MAP)));
        assert!(!has_ipc_lock("Name:\tx\n", Some(INITIAL_MAP)));
        assert!(!has_ipc_lock("", None));
        // Root of a user namespace (a rootless container): the kernel
        // checks the capability in the initial namespace, where it has none.
        let userns = "         0       1000          1\n         1     100000      65536\n";
        assert!(!has_ipc_lock(&status("000001ffffffffff"), Some(userns)));
        assert!(!has_ipc_lock(
            &status("000001ffffffffff"),
            Some("0 0 4294967294\n")
        ));
    }

    #[test]
    fn the_initial_uid_map_is_recognised() {
        assert!(is_initial_uid_map(INITIAL_MAP));
        assert!(is_initial_uid_map("0 0 4294967295"));
        assert!(!is_initial_uid_map(""));
        assert!(!is_initial_uid_map("0 0 4294967295\n1 1 1\n"));
        assert!(!is_initial_uid_map("0 1000 1\n"));
    }

    #[test]
    fn pinned_memory_is_read_from_proc() {
        let status = "Name:\tx\nVmLck:\t       8 kB\nVmPin:\t    1024 kB\nVmHWM:\t 1 kB\n";
        assert_eq!(pinned_bytes(status), (1024 + 8) * 1024);
        assert_eq!(pinned_bytes("VmPin:\t 4 kB\n"), 4096);
        assert_eq!(pinned_bytes("Name:\tx\n"), 0);
        assert_eq!(pinned_bytes("VmPin:\t junk kB\n"), 0);
    }

    #[test]
    fn the_room_left_under_a_limit() {
        let room = MemlockRoom::Limited {
            limit: 8 << 20,
            hard: u64::MAX,
            pinned: 1 << 20,
        };
        assert_eq!(room.available(), Some(7 << 20));
        let full = MemlockRoom::Limited {
            limit: 1 << 20,
            hard: 1 << 20,
            pinned: 2 << 20,
        };
        assert_eq!(full.available(), Some(0));
        assert_eq!(MemlockRoom::Unlimited.available(), None);
        let msg = room.refusal(16 << 20, Some("the ring".into())).to_string();
        for part in [
            "16.0 MiB",
            "(the ring)",
            "RLIMIT_MEMLOCK is 8.0 MiB (hard limit unlimited)",
            "1.0 MiB is pinned already",
            "ulimit -l unlimited",
            "limits.conf",
            "LimitMEMLOCK=",
        ] {
            assert!(msg.contains(part), "{part}: {msg}");
        }
    }

    #[test]
    fn interface_addresses_include_loopback() {
        let all = interface_addresses();
        assert!(
            all.iter().any(|(_, ip)| ip.is_loopback()),
            "no loopback among {all:?}"
        );
    }
}
