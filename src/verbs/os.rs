//! The few plain libc calls the tools need besides verbs: waiting on a file
//! descriptor, shutdown signals, the memlock limit and peak RSS. They live
//! here so that all `unsafe` of the crate stays inside `verbs`.

use super::{Result, VerbsError};
use std::os::fd::RawFd;
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
/// waits in this module then return `VerbsError::Interrupted`.
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
            return Err(VerbsError::last_os("sigaction"));
        }
    }
    Ok(())
}

/// True once SIGINT or SIGTERM arrived.
pub fn shutdown_requested() -> bool {
    SHUTDOWN.load(Ordering::SeqCst)
}

/// Puts a file descriptor into non-blocking mode.
pub(crate) fn set_nonblocking(fd: RawFd, call: &'static str) -> Result<()> {
    // SAFETY: fcntl on a descriptor owned by a live verbs object; invalid fds
    // only produce an error return.
    let rc = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 {
            -1
        } else {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK)
        }
    };
    if rc < 0 {
        return Err(VerbsError::last_os(call));
    }
    Ok(())
}

/// Waits until `fd` is readable or `deadline` passes. Returns Ok(true) when
/// readable, Ok(false) on timeout, Err(Interrupted) on a shutdown request.
pub(crate) fn wait_readable(fd: RawFd, deadline: Instant) -> Result<bool> {
    loop {
        if shutdown_requested() {
            return Err(VerbsError::Interrupted);
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(false);
        }
        let slice = (deadline - now).min(SLICE);
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = slice.as_millis().clamp(1, i32::MAX as u128) as libc::c_int;
        // SAFETY: pfd is a valid pollfd array of length 1 on the stack.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc > 0 {
            return Ok(true);
        }
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(VerbsError::Call {
                    call: "poll",
                    source: err,
                });
            }
        }
    }
}

/// Makes sure `needed` bytes can be locked (registered). Raises the soft
/// RLIMIT_MEMLOCK up to the hard limit if that suffices; otherwise fails with
/// a message naming the limit and how to raise it.
pub fn ensure_memlock(needed: u64) -> Result<()> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid, writable rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } != 0 {
        return Err(VerbsError::last_os("getrlimit(RLIMIT_MEMLOCK)"));
    }
    // Other locked memory (libraries, CQ/QP rings) also counts: keep headroom.
    let want = needed.saturating_add(8 << 20);
    let fits = |limit: libc::rlim_t| limit == libc::RLIM_INFINITY || limit >= want;
    if fits(lim.rlim_cur) {
        return Ok(());
    }
    if fits(lim.rlim_max) {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: raised is a valid rlimit; raising soft up to hard is allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raised) } == 0 {
            return Ok(());
        }
    }
    Err(VerbsError::Memlock {
        needed,
        limit: lim.rlim_cur,
        hard: lim.rlim_max,
    })
}

/// Peak resident set size of this process in bytes.
pub fn peak_rss_bytes() -> u64 {
    // SAFETY: a zeroed rusage is valid; getrusage only writes into it.
    let (rc, usage) = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        let rc = libc::getrusage(libc::RUSAGE_SELF, &mut usage);
        (rc, usage)
    };
    if rc != 0 {
        return 0;
    }
    (usage.ru_maxrss.max(0) as u64) * 1024
}

/// Bytes available to an unprivileged writer on the filesystem holding `path`.
pub fn free_space(path: &std::path::Path) -> std::io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))?;
    // SAFETY: c is a valid NUL-terminated string; st is a writable statvfs.
    let (rc, st) = unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        let rc = libc::statvfs(c.as_ptr(), &mut st);
        (rc, st)
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st.f_bavail.saturating_mul(st.f_frsize))
}

/// Renames `from` to `to` but fails with `AlreadyExists` if `to` exists
/// (renameat2 RENAME_NOREPLACE), so a file that appeared after the HELLO
/// check is never clobbered.
pub fn rename_noreplace(from: &std::path::Path, to: &std::path::Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let cstr = |p: &std::path::Path| {
        std::ffi::CString::new(p.as_os_str().as_bytes())
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "path contains NUL"))
    };
    let (f, t) = (cstr(from)?, cstr(to)?);
    // SAFETY: both are valid NUL-terminated paths; AT_FDCWD resolves them
    // like rename(2).
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            f.as_ptr(),
            libc::AT_FDCWD,
            t.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Asks for a pipe buffer of `bytes` on `fd` (Linux F_SETPIPE_SZ), so that
/// whole 1 MiB chunks pass a pipe with one wake-up of its other end rather
/// than sixteen. Best effort: returns the size granted, or an error for
/// descriptors that are not pipes or a size above the system's limit
/// (/proc/sys/fs/pipe-max-size).
pub fn set_pipe_size(fd: &impl std::os::fd::AsFd, bytes: usize) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    let want = libc::c_int::try_from(bytes)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidInput, "pipe size"))?;
    // SAFETY: fcntl on a descriptor borrowed for the call; F_SETPIPE_SZ
    // takes an int and touches no memory of ours.
    let rc = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_SETPIPE_SZ, want) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc as usize)
}
