//! Memory limits: a stock host's memlock limit, run under it as root or
//! as another user.

use super::*;

/// The memlock limit of a stock host (Debian 12, fresh VMs, a
/// non-interactive ssh session): 8 MiB, soft and hard.
pub const STOCK_MEMLOCK: u64 = 8 << 20;

/// Who runs a tool under a memlock limit (`under_memlock`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunAs {
    /// This process's user with its capabilities (root in the guest:
    /// CAP_IPC_LOCK, which lets the kernel pin past the limit).
    Myself,
    /// This user without CAP_IPC_LOCK (dropped by root with setpriv; a
    /// plain user has none).
    WithoutIpcLock,
    /// The plain user nobody (65534), as setpriv makes it: no capability,
    /// no groups. It needs /dev/infiniband/* open to all
    /// (`open_rdma_devices_to_all`) and directories it may use.
    Nobody,
}

/// `cmd` (program, arguments, environment, directory) run through
/// `prlimit` with RLIMIT_MEMLOCK `bytes`, soft and hard, as `who`. Fails
/// the test if prlimit or setpriv is missing.
pub fn under_memlock(bytes: u64, who: RunAs, cmd: &Command) -> Command {
    for tool in ["prlimit", "setpriv"] {
        assert!(have(tool), "{tool} (util-linux) is needed");
    }
    let mut wrapped = Command::new("prlimit");
    wrapped.arg(format!("--memlock={bytes}:{bytes}"));
    let root = rustix::process::geteuid().is_root();
    match who {
        RunAs::Myself => {}
        RunAs::WithoutIpcLock if !root => {}
        RunAs::WithoutIpcLock => {
            // Out of the bounding and inheritable sets, so that the exec
            // (which gives root its bounding set) does not bring it back.
            wrapped.args([
                "setpriv",
                "--inh-caps=-ipc_lock",
                "--bounding-set=-ipc_lock",
            ]);
        }
        RunAs::Nobody => {
            wrapped.args([
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ]);
        }
    }
    wrapped.arg(cmd.get_program()).args(cmd.get_args());
    for (key, value) in cmd.get_envs() {
        match value {
            Some(v) => wrapped.env(key, v),
            None => wrapped.env_remove(key),
        };
    }
    if let Some(dir) = cmd.get_current_dir() {
        wrapped.current_dir(dir);
    }
    wrapped
}

/// Lets every user open the RDMA devices (the guest has no udev: they are
/// root's only), as a stock host's udev rules do.
pub fn open_rdma_devices_to_all() {
    use std::os::unix::fs::PermissionsExt;
    for entry in std::fs::read_dir("/dev/infiniband").expect("/dev/infiniband") {
        let path = entry.expect("device entry").path();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666))
            .unwrap_or_else(|e| panic!("chmod 666 {}: {e}", path.display()));
    }
}

/// The `Max locked memory` soft and hard limits of a running process
/// (/proc/PID/limits), in bytes; None: unlimited or unreadable.
pub fn memlock_limits_of(pid: u32) -> Option<(u64, u64)> {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).ok()?;
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max locked memory"))?;
    let mut numbers = line
        .trim_start_matches("Max locked memory")
        .split_whitespace()
        .map(|w| w.parse::<u64>().ok());
    Some((numbers.next()??, numbers.next()??))
}
