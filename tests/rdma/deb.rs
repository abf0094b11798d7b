//! The Debian package of `make deb` (scripts/deb.sh), installed with
//! `dpkg -i` into the guest's root (a tmpfs overlay over the host's, thrown
//! away with the guest): a transfer with the installed binaries, which
//! find the token at /etc/rdma-xfer/token without any option; the man
//! pages, completions and the systemd unit where Debian looks for them.

use crate::support::*;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const PACKAGE: &str = "rdma-xfer";
const VERSION: &str = env!("CARGO_PKG_VERSION");
const TOKEN_DIR: &str = "/etc/rdma-xfer";
const TOKEN: &str = "/etc/rdma-xfer/token";
const UNIT: &str = "/usr/lib/systemd/system/rdma-xfer-receiver.service";

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `cmd`, failing the test unless it exits 0; its output.
fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", text(&out));
    out
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The package `make deb` built for this version, if there is one.
fn built_package() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/deb");
    let prefix = format!("{PACKAGE}_{VERSION}_");
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".deb"))
        })
}

/// Removes the token and the package when the test ends, however it
/// ends: the other suites run in the same guest and expect no token at
/// /etc/rdma-xfer/token.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(TOKEN);
        let _ = Command::new("dpkg")
            .args(["--no-triggers", "--purge", PACKAGE])
            .output();
        let _ = std::fs::remove_dir(TOKEN_DIR);
    }
}

/// `make deb`'s package installs with dpkg, and its binaries (resolved
/// through PATH to /usr/bin) move a file authenticated by the token in
/// its default place; removing it takes its files away, not the token.
#[test]
fn the_debian_package_installs_and_transfers() {
    let Some(net) = rdma_net() else { return };
    // dpkg -i changes the root it runs in: only the throw-away guest's.
    if !in_guest() {
        skip(
            "installs a package into /: runs only in the SoftRoCE guest (make e2e)",
            false,
        );
        return;
    }
    let Some(deb) = built_package() else {
        skip(
            &format!("no target/deb/{PACKAGE}_{VERSION}_*.deb: run `make deb`"),
            everything_required(),
        );
        return;
    };
    assert!(!Path::new(TOKEN).exists(), "{TOKEN} exists before the test");
    let installed = Installed;
    // --no-triggers: man-db's trigger (not awaited) rebuilds the index of
    // every man page on the host, minutes under TCG; `man -w` below needs
    // no index.
    let out = run_ok(Command::new("dpkg").args(["--no-triggers", "-i"]).arg(&deb));
    // No token yet: the postinst says how to make one.
    assert!(
        stdout(&out).contains("rdma-xfer-gen token /etc/rdma-xfer/token"),
        "{}",
        text(&out)
    );
    let status =
        run_ok(Command::new("dpkg-query").args(["-W", "-f=${Status} ${Version}", PACKAGE]));
    assert_eq!(stdout(&status), format!("install ok installed {VERSION}"));

    for tool in ["sender", "receiver", "rdma-xfer-gen"] {
        let found = run_ok(Command::new("sh").args(["-c", &format!("command -v {tool}")]));
        assert_eq!(stdout(&found), format!("/usr/bin/{tool}"));
    }
    let version = run_ok(Command::new("sender").arg("--version"));
    assert!(stdout(&version).contains(VERSION), "{}", text(&version));

    // The token directory is the package's, the token the admin's.
    let mode = std::fs::metadata(TOKEN_DIR)
        .expect(TOKEN_DIR)
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o700, "{TOKEN_DIR} mode {mode:o}");
    run_ok(Command::new("rdma-xfer-gen").args(["token", TOKEN]));

    // Both tools find it without --token-file (no user token: an empty
    // XDG_CONFIG_HOME and HOME).
    let home = tempfile::tempdir().expect("home");
    let home = home.path().to_str().expect("utf8");
    let user_env = [("XDG_CONFIG_HOME", home), ("HOME", home)];
    let (src, dst) = dirs();
    let input = src.path().join("packaged.bin");
    let sum = make_file(&input, 3 * MIB + 5, 61);
    let port = next_port();
    let mut receiver = ReceiverCommand::new(&net, port, dst.path())
        .bin("receiver")
        .args(&["--once"])
        .env(&user_env)
        .start();
    let mut cmd = SenderCommand::new(&net, port, Path_::Wire)
        .bin("sender")
        .files(std::slice::from_ref(&input))
        .command();
    token_env(&mut cmd, None);
    cmd.envs(user_env);
    let sent = Running::spawn("sender", cmd).wait(Duration::from_secs(300));
    assert_eq!(sent.code(), 0, "{}", sent.stderr);
    assert_eq!(sha256_file(&dst.path().join("packaged.bin")), sum);
    assert_no_temp_files(dst.path());
    let log = receiver.wait_for_stderr("sender authenticated", Duration::from_secs(20));
    assert!(!log.contains("UNAUTHENTICATED"), "{log}");
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(received.code(), 0, "{}", received.stderr);

    // Man pages and completions where Debian looks.
    for page in ["sender", "receiver"] {
        let path = format!("/usr/share/man/man1/{page}.1.gz");
        assert!(Path::new(&path).is_file(), "{path} missing");
        if have("man") {
            let found = run_ok(Command::new("man").args(["-w", page]));
            assert_eq!(stdout(&found), path);
        }
    }
    for file in [
        "/usr/share/bash-completion/completions/sender",
        "/usr/share/zsh/site-functions/_receiver",
        "/usr/share/fish/vendor_completions.d/sender.fish",
    ] {
        assert!(Path::new(file).is_file(), "{file} missing");
    }
    let unit = std::fs::read_to_string(UNIT).expect(UNIT);
    assert!(unit.contains("ExecStart=/usr/bin/receiver "), "{unit}");
    if have("systemd-analyze") {
        let out = Command::new("systemd-analyze")
            .args(["verify", "--man=no", UNIT])
            .output()
            .expect("systemd-analyze");
        assert!(
            out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
            "{}",
            text(&out)
        );
    } else {
        eprintln!("no systemd-analyze: the unit is not verified");
    }

    // Removal takes the package's files away and leaves the token (the
    // admin's) and so its directory.
    run_ok(Command::new("dpkg").args(["--no-triggers", "-r", PACKAGE]));
    for gone in ["/usr/bin/sender", "/usr/bin/receiver", UNIT] {
        assert!(!Path::new(gone).exists(), "{gone} left after dpkg -r");
    }
    assert!(Path::new(TOKEN).exists(), "dpkg -r removed the token");
    drop(installed);
}

/// Bind mounts into a root, undone (lazily, last first) when dropped.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    /// `dirs` of this host bound into `root`, and a fresh tmpfs on its
    /// /tmp (the root itself may be read-only in the guest; what the test
    /// leaves there goes with the mount).
    fn bind(root: &Path, dirs: &[&str]) -> Mounts {
        let mut done = Mounts(Vec::new());
        for d in dirs {
            let target = root.join(d);
            run_ok(
                Command::new("mount")
                    .arg("--bind")
                    .arg(format!("/{d}"))
                    .arg(&target),
            );
            done.0.push(target);
        }
        let tmp = root.join("tmp");
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "rxfer-clean-tmp"])
                .arg(&tmp),
        );
        done.0.push(tmp);
        done
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for target in self.0.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(target).output();
        }
    }
}

/// The package in a clean Debian 12 root (debootstrap minbase, the
/// package installed there by apt-get from the Debian mirror: `make
/// deb-root`): a transfer between two of its binaries, run inside that
/// root, shows that the package declares every library it needs and
/// that the installed tools work with nothing of this host's around.
#[test]
fn the_package_transfers_in_a_clean_debian_root() {
    let Some(net) = rdma_net() else { return };
    let Some(addr_b) = net.addr_b.clone() else {
        skip("needs the guest's second address", everything_required());
        return;
    };
    // Mounts into the root: only in the throw-away guest.
    if !in_guest() {
        skip(
            "mounts /dev, /proc and /sys into a chroot: runs only in the SoftRoCE guest (make e2e)",
            false,
        );
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/deb-root");
    if !root.join("usr/bin/receiver").is_file() {
        skip(
            "no target/deb-root with the package installed: run `make deb-root`",
            everything_required(),
        );
        return;
    }
    let _mounts = Mounts::bind(&root, &["dev", "proc", "sys"]);
    let inside = "/tmp/rxfer-clean-root";
    let work = root.join(inside.trim_start_matches('/'));
    std::fs::create_dir_all(work.join("in")).expect("in");
    std::fs::create_dir_all(work.join("out")).expect("out");
    let sum = make_file(&work.join("in/clean.bin"), 2 * MIB + 3, 71);
    // Only the root's own programs and libraries, no environment.
    let in_root = |args: &[&str]| {
        let mut cmd = Command::new("chroot");
        cmd.arg(&root)
            .args(["env", "-i", "PATH=/usr/bin:/bin", "HOME=/root"])
            .args(args);
        cmd
    };
    // This build's package, not an older one left in target/deb.
    let installed = run_ok(&mut in_root(&[
        "dpkg-query",
        "-W",
        "-f=${Version}",
        PACKAGE,
    ]));
    assert_eq!(stdout(&installed), VERSION);
    let token = format!("{inside}/token");
    run_ok(&mut in_root(&["rdma-xfer-gen", "token", &token]));
    let port = next_port().to_string();
    let out_dir = format!("{inside}/out");
    let mut receiver = Running::spawn(
        "receiver",
        in_root(&[
            "receiver",
            "--once",
            "--bind",
            &net.addr_a,
            "--port",
            &port,
            "--token-file",
            &token,
            "--dir",
            &out_dir,
        ]),
    );
    receiver.wait_for_stderr("listening", Duration::from_secs(60));
    let to = format!("{}:{port}", net.addr_a);
    let file = format!("{inside}/in/clean.bin");
    let sent = Running::spawn(
        "sender",
        in_root(&[
            "sender",
            "--source",
            &addr_b,
            "--token-file",
            &token,
            &to,
            &file,
        ]),
    )
    .wait(Duration::from_secs(300));
    assert_eq!(sent.code(), 0, "{}", sent.transcript());
    let received = receiver.wait(Duration::from_secs(60));
    assert_eq!(received.code(), 0, "{}", received.transcript());
    assert_eq!(sha256_file(&work.join("out/clean.bin")), sum);
}
