//! `make install` and its surroundings, without RDMA: scripts/install.sh
//! into temporary prefixes (as this user and, when root, as `nobody`) and
//! its --uninstall, the man pages it installs (groff), the receiver's
//! systemd unit (`systemd-analyze verify`, its command line parsed by the
//! receiver's own definitions, the settings RDMA needs), and
//! scripts/install-deps.sh without root.

mod support;

use clap::Parser;
use rdma_xfer::cli::ReceiverArgs;
use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{everything_required, have, skip};

const UNIT: &str = "rdma-xfer-receiver.service";

/// Every file an install puts under its prefix but the unit.
const FILES: [&str; 11] = [
    "bin/sender",
    "bin/receiver",
    "bin/rdma-xfer-gen",
    "share/man/man1/sender.1",
    "share/man/man1/receiver.1",
    "share/bash-completion/completions/sender",
    "share/bash-completion/completions/receiver",
    "share/zsh/site-functions/_sender",
    "share/zsh/site-functions/_receiver",
    "share/fish/vendor_completions.d/sender.fish",
    "share/fish/vendor_completions.d/receiver.fish",
];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Where cargo put the binaries of this build (sender, receiver and
/// rdma-xfer-gen, which cargo builds for every integration test).
fn build_dir() -> PathBuf {
    let _ = env!("CARGO_BIN_EXE_rdma-xfer-gen");
    Path::new(env!("CARGO_BIN_EXE_sender"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs scripts/install.sh (as it is in `scripts`) with PREFIX and DESTDIR
/// (none: unset) and `args`.
fn install_sh(scripts: &Path, prefix: &Path, destdir: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new("bash");
    cmd.arg(scripts.join("install.sh"))
        .args(args)
        .env("PREFIX", prefix)
        .env_remove("DESTDIR");
    if let Some(d) = destdir {
        cmd.env("DESTDIR", d);
    }
    cmd.output().expect("run scripts/install.sh")
}

fn install(prefix: &Path, destdir: Option<&Path>) -> String {
    let build = build_dir();
    let out = install_sh(
        &repo().join("scripts"),
        prefix,
        destdir,
        &[build.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn uninstall(prefix: &Path, destdir: Option<&Path>) -> String {
    let out = install_sh(&repo().join("scripts"), prefix, destdir, &["--uninstall"]);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The files (and links) below `root`, as paths relative to it.
fn files_under(root: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let path = e.unwrap().path();
            if path.is_dir() && !path.is_symlink() {
                dirs.push(path);
            } else {
                let rel = path.strip_prefix(root).unwrap();
                found.insert(rel.to_string_lossy().into_owned());
            }
        }
    }
    found
}

fn set(items: impl IntoIterator<Item = impl Into<String>>) -> BTreeSet<String> {
    items.into_iter().map(Into::into).collect()
}

/// A path as roff writes it (dashes escaped).
fn roff(path: &str) -> String {
    path.replace('-', "\\-")
}

/// The `Key=value` settings of a unit file, in order (comments skipped).
fn settings(unit: &str) -> Vec<(String, String)> {
    unit.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with('#') && !l.starts_with('['))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn values<'a>(settings: &'a [(String, String)], key: &str) -> Vec<&'a str> {
    settings
        .iter()
        .filter(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
        .collect()
}

fn uid() -> u32 {
    let out = Command::new("id").arg("-u").output().expect("id -u");
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

/// The uid of `nobody`, when this test runs as root and can become it with
/// runuser; None (the test skipped, by name) otherwise.
fn nobody() -> Option<u32> {
    if uid() != 0 {
        skip(
            "not root, so it cannot become another user: the other tests already run \
             install.sh as this plain user",
            false,
        );
        return None;
    }
    if !have("runuser") {
        skip("no runuser (util-linux)", everything_required());
        return None;
    }
    let out = Command::new("id").args(["-u", "nobody"]).output().unwrap();
    if !out.status.success() {
        skip("no user nobody", everything_required());
        return None;
    }
    Some(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap())
}

/// Copies `files` (relative to the repository, or absolute) into `dir`
/// under their base names, world-readable: `nobody` can read neither a
/// checkout under /root nor cargo's target dir there.
fn copy_for_nobody(dir: &Path, files: &[PathBuf]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for f in files {
        let to = dir.join(f.file_name().unwrap());
        std::fs::copy(repo().join(f), &to).unwrap();
        std::fs::set_permissions(&to, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// A tempdir others may enter (tempfile makes it 0700).
fn open_tempdir() -> tempfile::TempDir {
    let t = tempfile::tempdir().unwrap();
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    t
}

// ---------------------------------------------------------------------------
// scripts/install.sh

/// A prefix of one's own (PREFIX=$HOME/.local): every file, with its mode,
/// and nothing else; the unit beside, not where systemd looks; man pages
/// with their sections; --uninstall removes exactly those files.
#[test]
fn installs_into_a_user_prefix_and_uninstalls_exactly_that() {
    let t = tempfile::tempdir().unwrap();
    let prefix = t.path().join("home/.local");
    // Someone else's file in the same tree stays.
    std::fs::create_dir_all(prefix.join("bin")).unwrap();
    std::fs::write(prefix.join("bin/other"), "x").unwrap();
    let said = install(&prefix, None);

    let unit_rel = format!("share/rdma-xfer/systemd/{UNIT}");
    let unit_path = prefix.join(&unit_rel);
    let mut want = set(FILES);
    want.insert(unit_rel.clone());
    want.insert("bin/other".into());
    assert_eq!(files_under(&prefix), want);
    for f in FILES.iter().copied().chain([unit_rel.as_str()]) {
        let mode = std::fs::metadata(prefix.join(f))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777;
        let expected = if f.starts_with("bin/") { 0o755 } else { 0o644 };
        assert_eq!(mode, expected, "{f}: {mode:o}");
    }
    for bin in ["sender", "receiver"] {
        assert!(
            std::fs::read(prefix.join("bin").join(bin)).unwrap()
                == std::fs::read(build_dir().join(bin)).unwrap(),
            "{bin} is not the built one"
        );
    }
    assert!(said.contains(&unit_path.display().to_string()), "{said}");
    assert!(said.contains("systemd does not look there"), "{said}");

    let unit = std::fs::read_to_string(&unit_path).unwrap();
    let exec = format!("ExecStart={}/bin/receiver ", prefix.display());
    assert!(unit.contains(&exec), "{unit}");
    let placeholder = unit
        .split('@')
        .skip(1)
        .step_by(2)
        .any(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'));
    assert!(!placeholder, "a placeholder is left: {unit}");

    let receiver = std::fs::read_to_string(prefix.join("share/man/man1/receiver.1")).unwrap();
    for want in [
        ".SH FILES",
        ".SH \"EXIT STATUS\"",
        ".SH \"SEE ALSO\"",
        &roff(&unit_path.display().to_string()),
    ] {
        assert!(receiver.contains(want), "{want}: {receiver}");
    }

    let said = uninstall(&prefix, None);
    assert_eq!(files_under(&prefix), set(["bin/other"]));
    assert!(said.contains(&unit_path.display().to_string()), "{said}");
    // Its own directory goes with it; the shared ones stay.
    assert!(!prefix.join("share/rdma-xfer").exists());
    assert!(prefix.join("share/man/man1").is_dir());
    // Nothing left to remove: it says nothing, and succeeds.
    assert_eq!(uninstall(&prefix, None), "");
}

/// PREFIX /usr/local and /usr (staged with DESTDIR): the unit goes where
/// systemd looks for units, names the installed binary, and receiver.1
/// says where it is.
#[test]
fn system_prefixes_put_the_unit_where_systemd_looks() {
    for prefix in ["/usr/local", "/usr"] {
        let stage = tempfile::tempdir().unwrap();
        let said = install(Path::new(prefix), Some(stage.path()));
        let unit_rel = format!("{}/lib/systemd/system/{UNIT}", &prefix[1..]);
        let mut want: BTreeSet<String> = FILES
            .iter()
            .map(|f| format!("{}/{f}", &prefix[1..]))
            .collect();
        want.insert(unit_rel.clone());
        assert_eq!(files_under(stage.path()), want, "{prefix}");
        let unit = std::fs::read_to_string(stage.path().join(&unit_rel)).unwrap();
        assert!(
            unit.contains(&format!("ExecStart={prefix}/bin/receiver ")),
            "{unit}"
        );
        assert!(!said.contains("does not look there"), "{said}");
        let man = stage
            .path()
            .join(&prefix[1..])
            .join("share/man/man1/receiver.1");
        let receiver = std::fs::read_to_string(man).unwrap();
        let installed = format!("{prefix}/lib/systemd/system/{UNIT}");
        assert!(receiver.contains(&roff(&installed)), "{receiver}");

        uninstall(Path::new(prefix), Some(stage.path()));
        assert_eq!(files_under(stage.path()), BTreeSet::new(), "{prefix}");
    }
}

/// A prefix under /home: the unit is installed all the same, with a word
/// that ProtectHome=yes keeps the service from running that binary.
#[test]
fn a_home_prefix_warns_that_the_service_cannot_run_it() {
    let stage = tempfile::tempdir().unwrap();
    let said = install(Path::new("/home/someone/.local"), Some(stage.path()));
    assert!(said.contains("ProtectHome=yes hides"), "{said}");
    let unit = format!("home/someone/.local/share/rdma-xfer/systemd/{UNIT}");
    assert!(stage.path().join(unit).is_file());
    let elsewhere = tempfile::tempdir().unwrap();
    let said = install(Path::new("/opt/rdma-xfer"), Some(elsewhere.path()));
    assert!(!said.contains("ProtectHome"), "{said}");
}

#[test]
fn install_refuses_prefixes_the_unit_cannot_hold() {
    let build = build_dir();
    let t = tempfile::tempdir().unwrap();
    for bad in ["relative/dir", "/opt/with space", "/opt/100%", "/opt/$HOME"] {
        let out = install_sh(
            &repo().join("scripts"),
            Path::new(bad),
            Some(t.path()),
            &[build.to_str().unwrap()],
        );
        assert_eq!(out.status.code(), Some(1), "{bad}: {}", text(&out));
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("PREFIX must"),
            "{bad}: {}",
            text(&out)
        );
    }
    assert_eq!(files_under(t.path()), BTreeSet::new());
}

/// As an unprivileged user (`nobody`) into a prefix it owns: the same
/// files, owned by it; and its uninstall.
#[test]
fn installs_as_an_unprivileged_user() {
    let Some(nobody) = nobody() else {
        return;
    };
    let t = open_tempdir();
    let build = build_dir();
    let bins: Vec<PathBuf> = ["sender", "receiver", "rdma-xfer-gen"]
        .iter()
        .map(|b| build.join(b))
        .collect();
    copy_for_nobody(&t.path().join("build"), &bins);
    // install.sh finds the unit's template at ../dist/systemd.
    copy_for_nobody(
        &t.path().join("src/scripts"),
        &["scripts/install.sh".into()],
    );
    copy_for_nobody(
        &t.path().join("src/dist/systemd"),
        &[format!("dist/systemd/{UNIT}.in").into()],
    );
    std::fs::set_permissions(t.path().join("src"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        t.path().join("src/dist"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let prefix = t.path().join("prefix");
    std::fs::create_dir(&prefix).unwrap();
    std::os::unix::fs::chown(&prefix, Some(nobody), None).unwrap();
    let as_nobody = |args: &[&str]| {
        let out = Command::new("runuser")
            .args(["-u", "nobody", "--", "env", "-i"])
            .arg("PATH=/usr/sbin:/usr/bin:/sbin:/bin")
            .arg(format!("PREFIX={}", prefix.display()))
            .arg("bash")
            .arg(t.path().join("src/scripts/install.sh"))
            .args(args)
            .output()
            .expect("runuser");
        assert!(out.status.success(), "{}", text(&out));
    };
    as_nobody(&[t.path().join("build").to_str().unwrap()]);
    let mut want = set(FILES);
    want.insert(format!("share/rdma-xfer/systemd/{UNIT}"));
    assert_eq!(files_under(&prefix), want);
    for f in &want {
        let owner = std::fs::metadata(prefix.join(f)).unwrap().uid();
        assert_eq!(owner, nobody, "{f}");
    }
    as_nobody(&["--uninstall"]);
    assert_eq!(files_under(&prefix), BTreeSet::new());
}

/// The installed pages render without a warning from groff.
#[test]
fn man_pages_render() {
    if !have("groff") {
        skip(
            "no groff (scripts/install-deps.sh --unit installs groff-base)",
            everything_required(),
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let prefix = t.path().join("p");
    install(&prefix, None);
    for page in ["sender.1", "receiver.1"] {
        let path = prefix.join("share/man/man1").join(page);
        let out = Command::new("groff")
            // -P-cbou: plain text, no overstriking (bold "OPTIONS" would
            // be "OOPPTTIIOONNSS").
            .args(["-man", "-Tutf8", "-ww", "-P-cbou"])
            .arg(&path)
            .env("LC_ALL", "C.UTF-8")
            .output()
            .expect("groff");
        assert!(out.status.success(), "{page}: {}", text(&out));
        assert!(out.stderr.is_empty(), "{page}: {}", text(&out));
        let shown = String::from_utf8_lossy(&out.stdout);
        for section in ["OPTIONS", "EXAMPLES", "FILES", "EXIT STATUS", "SEE ALSO"] {
            assert!(shown.contains(section), "{page}: {section}: {shown}");
        }
    }
}

// ---------------------------------------------------------------------------
// The systemd unit

/// `systemd-analyze verify` on the installed unit (its ExecStart= binary
/// exists there): any output is a failure. A unit with a bad setting next
/// to it shows that verify does report.
#[test]
fn the_unit_passes_systemd_analyze_verify() {
    if !have("systemd-analyze") {
        skip(
            "no systemd-analyze (scripts/install-deps.sh --unit installs systemd)",
            everything_required(),
        );
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let prefix = t.path().join("p");
    install(&prefix, None);
    let dir = prefix.join("share/rdma-xfer/systemd");
    let unit = dir.join(UNIT);
    // Documentation=man:receiver(1) is checked below, not by running man,
    // which a fresh machine may lack.
    let verify = |path: &Path| {
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(path)
            .output()
            .expect("systemd-analyze")
    };
    let out = verify(&unit);
    assert!(
        out.status.success() && out.stdout.is_empty() && out.stderr.is_empty(),
        "{}",
        text(&out)
    );
    let text_of_unit = std::fs::read_to_string(&unit).unwrap();
    assert!(text_of_unit.contains("Documentation=man:receiver(1)\n"));
    assert!(prefix.join("share/man/man1/receiver.1").is_file());

    let bad = dir.join("bad-rdma-xfer-receiver.service");
    std::fs::write(
        &bad,
        text_of_unit.replace("ProtectSystem=strict", "ProtectSystem=maybe"),
    )
    .unwrap();
    let out = verify(&bad);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("bad-rdma-xfer-receiver.service") && said.contains("maybe"),
        "{}",
        text(&out)
    );
}

fn unit_template() -> String {
    std::fs::read_to_string(repo().join("dist/systemd").join(format!("{UNIT}.in"))).unwrap()
}

/// ExecStart= as the receiver gets it: its variables replaced as systemd
/// would (RECEIVER_ARGS: the example of the unit's own comments, and
/// empty) is accepted by the receiver's own argument definitions and
/// checks, as a long-running receiver (not --once) with a token.
#[test]
fn the_units_command_line_is_one_the_receiver_accepts() {
    let unit = unit_template();
    let s = settings(&unit);
    let exec = values(&s, "ExecStart");
    assert_eq!(exec.len(), 1, "{exec:?}");
    let example = unit
        .lines()
        .find_map(|l| {
            l.trim_start_matches(['#', ' '])
                .strip_prefix("Environment=\"RECEIVER_ARGS=")
        })
        .and_then(|rest| rest.strip_suffix('"'))
        .expect("an example of RECEIVER_ARGS in the unit's comments");
    let t = tempfile::tempdir().unwrap();
    let creds = t.path().join("credentials");
    std::fs::create_dir(&creds).unwrap();
    std::fs::write(creds.join("token"), "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(creds.join("token"), std::fs::Permissions::from_mode(0o400)).unwrap();
    for args in [example, ""] {
        let mut argv = Vec::new();
        for word in exec[0].split_whitespace() {
            match word {
                "${RECEIVER_DIR}" => argv.push(t.path().display().to_string()),
                "$RECEIVER_ARGS" => argv.extend(args.split_whitespace().map(String::from)),
                w if w.starts_with("${CREDENTIALS_DIRECTORY}/") => {
                    argv.push(w.replace("${CREDENTIALS_DIRECTORY}", &creds.display().to_string()))
                }
                w => {
                    assert!(!w.contains('$'), "a variable this test does not know: {w}");
                    argv.push(w.to_string());
                }
            }
        }
        assert_eq!(argv[0], "@BINDIR@/receiver");
        let parsed = ReceiverArgs::try_parse_from(&argv)
            .unwrap_or_else(|e| panic!("{argv:?} does not parse: {e}"));
        let cfg = parsed
            .to_config()
            .unwrap_or_else(|e| panic!("{argv:?} is refused: {e}"));
        assert!(!cfg.once, "{argv:?}");
        assert!(cfg.token.is_some(), "{argv:?}");
        assert_eq!(cfg.dir, t.path(), "{argv:?}");
    }
}

/// What RDMA needs of the service, and its hardening: these settings are
/// easy to "improve" into a receiver that cannot open its device.
#[test]
fn the_unit_keeps_what_rdma_needs() {
    let unit = unit_template();
    let s = settings(&unit);
    let one = |key: &str| {
        let v = values(&s, key);
        assert_eq!(v.len(), 1, "{key}: {v:?}");
        v[0].to_string()
    };
    // Memory registration pins the rings.
    assert_eq!(one("LimitMEMLOCK"), "infinity");
    // /dev/infiniband stays visible: no private /dev, no device allow-list
    // (ProtectClock= implies one).
    assert_eq!(one("DevicePolicy"), "auto");
    for key in ["PrivateDevices", "DeviceAllow", "ProtectClock"] {
        assert!(values(&s, key).is_empty(), "{key} must not be set: {unit}");
    }
    // rdma_cm and libibverbs speak netlink; addresses are IP.
    let families = one("RestrictAddressFamilies");
    let families: BTreeSet<&str> = families.split_whitespace().collect();
    for f in ["AF_INET", "AF_INET6", "AF_NETLINK", "AF_UNIX"] {
        assert!(families.contains(f), "{f} is not allowed: {families:?}");
    }
    assert!(!one("ExecStart").contains("--once"));
    assert_eq!(one("KillSignal"), "SIGTERM");
    assert!(one("TimeoutStopSec").parse::<u32>().unwrap() >= 30);
    assert_eq!(one("Restart"), "on-failure");
    for (key, value) in [
        ("DynamicUser", "yes"),
        ("ProtectSystem", "strict"),
        ("ProtectHome", "yes"),
        ("NoNewPrivileges", "yes"),
        ("PrivateTmp", "yes"),
        ("StateDirectory", "rdma-xfer"),
        ("LoadCredential", "token:/etc/rdma-xfer/token"),
        ("WantedBy", "multi-user.target"),
    ] {
        assert_eq!(one(key), value, "{key}");
    }
    // The directory it writes: the state directory, which receiver.1's
    // FILES names as /var/lib/rdma-xfer (%S is /var/lib for system units).
    let dirs = values(&s, "Environment");
    assert!(dirs.contains(&"RECEIVER_DIR=%S/rdma-xfer"), "{dirs:?}");
    let pages = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rdma-xfer-gen"))
        .arg("man")
        .args([
            "--unit",
            "/usr/local/lib/systemd/system/rdma-xfer-receiver.service",
        ])
        .arg(pages.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let page = String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.ends_with("receiver.1"))
        .map(|p| std::fs::read_to_string(p.trim()).unwrap())
        .unwrap();
    for named in ["/etc/rdma-xfer/token", "/var/lib/rdma-xfer"] {
        assert!(page.contains(&roff(named)), "{named}: {page}");
    }
}

// ---------------------------------------------------------------------------
// scripts/install-deps.sh

/// A directory holding `apt-get` and `sudo` that log their arguments into
/// `log` and fail: put first on PATH, they catch any attempt to install.
fn fake_apt(dir: &Path, log: &Path) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    for tool in ["apt-get", "sudo"] {
        let p = dir.join(tool);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"{tool} $*\" >> '{}'\nexit 1\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", dir.display())
}

fn dpkg_or_skip() -> bool {
    if have("dpkg-query") {
        return true;
    }
    skip("not Debian (no dpkg-query)", everything_required());
    false
}

#[test]
fn install_deps_leaves_apt_alone_when_everything_is_installed() {
    if !dpkg_or_skip() {
        return;
    }
    let t = tempfile::tempdir().unwrap();
    let log = t.path().join("log");
    let path = fake_apt(&t.path().join("bin"), &log);
    let out = Command::new("bash")
        .arg(repo().join("scripts/install-deps.sh"))
        .args(["coreutils", "bash"])
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(out.stderr.is_empty(), "{}", text(&out));
    assert!(!log.exists(), "{}", std::fs::read_to_string(&log).unwrap());
}

/// Without root, and with a sudo that wants a password: it names what is
/// missing and the command to run, fails, and never runs apt-get.
#[test]
fn install_deps_without_root_says_what_to_install() {
    if !dpkg_or_skip() {
        return;
    }
    let root = uid() == 0;
    if root && nobody().is_none() {
        return;
    }
    let t = open_tempdir();
    let log = t.path().join("log");
    let path = fake_apt(&t.path().join("bin"), &log);
    let scripts = t.path().join("scripts");
    copy_for_nobody(
        &scripts,
        &["scripts/install-deps.sh".into(), "scripts/lib.sh".into()],
    );
    let missing = "rdma-xfer-no-such-package";
    let mut cmd = if root {
        // The log is written by nobody.
        std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--", "env", "-i"]);
        c.arg(format!("PATH={path}")).arg("bash");
        c
    } else {
        let mut c = Command::new("bash");
        c.env("PATH", &path);
        c
    };
    let out = cmd
        .arg(scripts.join("install-deps.sh"))
        .args([missing, "coreutils"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(&format!("missing packages: {missing}\n")),
        "{said}"
    );
    assert!(
        said.contains(&format!("sudo apt-get install {missing}\n")),
        "{said}"
    );
    let calls = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!calls.contains("apt-get"), "{calls}");
}

/// Off Debian (no dpkg-query on PATH): the build's packages cannot be
/// checked, which it says, and goes on; the guest's cannot be done without.
#[test]
fn install_deps_off_debian_says_so() {
    let t = tempfile::tempdir().unwrap();
    // A PATH with only what the script runs besides dpkg.
    let bin = t.path().join("bin");
    std::fs::create_dir(&bin).unwrap();
    for tool in ["bash", "dirname", "id", "sed"] {
        let out = Command::new("sh")
            .args(["-c", &format!("command -v {tool}")])
            .output()
            .unwrap();
        let real = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!real.is_empty(), "{tool} not found");
        std::os::unix::fs::symlink(real, bin.join(tool)).unwrap();
    }
    let run = |arg: &str| {
        Command::new(bin.join("bash"))
            .arg(repo().join("scripts/install-deps.sh"))
            .arg(arg)
            .env("PATH", &bin)
            .output()
            .unwrap()
    };
    let out = run("--build");
    assert!(out.status.success(), "{}", text(&out));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("not a Debian-based system"), "{said}");
    assert!(said.contains("libibverbs-dev"), "{said}");
    assert!(said.contains("going on"), "{said}");
    let out = run("--guest");
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
}
