//! `rdma-xfer-gen doctor [HOST]`: why RDMA works here or not, step by
//! step (kernel stack, device files, user-space provider, ports, locked
//! memory, the way to HOST), each finding with the command that fixes
//! it. The findings come from a pure function of what was read, so the
//! tests feed it fake hosts.

use crate::engine::fit::PROVIDER_HEADROOM;
use crate::engine::{DEFAULT_CHUNK_SIZE, DEFAULT_DEPTH, DEFAULT_SLOTS};
use crate::error::XferError;
use crate::sys::SysError;
use crate::sys::os::MemlockRoom;
use crate::sys::rdma::{DRIVER_MODULES, Inventory};
use crate::units::format_bytes;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

/// How a finding bears on a transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Ok,
    /// A transfer works, slower or less safely than it could.
    Warn,
    /// A transfer would fail.
    Fail,
}

/// One thing found, with the command that fixes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub level: Level,
    pub what: String,
    pub fix: Option<String>,
}

impl Finding {
    fn ok(what: String) -> Self {
        Finding {
            level: Level::Ok,
            what,
            fix: None,
        }
    }

    fn warn(what: String, fix: &str) -> Self {
        Finding {
            level: Level::Warn,
            what,
            fix: Some(fix.into()),
        }
    }

    fn fail(what: String, fix: &str) -> Self {
        Finding {
            level: Level::Fail,
            what,
            fix: Some(fix.into()),
        }
    }
}

/// The way to the peer the doctor was asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// As the user wrote it.
    pub host: String,
    /// What it resolved to (None: it does not resolve).
    pub peer: Option<IpAddr>,
    /// The source address the routing table picks towards it.
    pub source: Option<IpAddr>,
    /// The receiver's port, if one was given (else the default).
    pub port: Option<u16>,
}

impl Route {
    /// Resolves `host` (a name or address, with or without a port) and
    /// asks the routing table for the source address towards it.
    pub fn towards(host: &str) -> Self {
        use std::net::ToSocketAddrs;
        // HOST, HOST:PORT, [V6]:PORT or a bare IPv6 address.
        let (bare, port) = match host.strip_prefix('[') {
            Some(rest) => match rest.split_once(']') {
                Some((ip, tail)) => (ip, tail.strip_prefix(':').and_then(|p| p.parse().ok())),
                None => (rest, None),
            },
            None if host.matches(':').count() == 1 => host
                .split_once(':')
                .map_or((host, None), |(h, p)| (h, p.parse().ok())),
            None => (host, None),
        };
        let peer = (bare, 0)
            .to_socket_addrs()
            .ok()
            .and_then(|mut addrs| addrs.next())
            .map(|a| a.ip());
        Route {
            host: host.into(),
            peer,
            source: peer.and_then(crate::sys::os::source_towards),
            port,
        }
    }
}

/// What the doctor looks at.
pub struct Host<'a> {
    pub inventory: &'a Inventory,
    /// libibverbs' device list (`probe_devices`).
    pub verbs: &'a Result<Vec<String>, SysError>,
    pub memlock: &'a MemlockRoom,
    pub route: Option<&'a Route>,
}

/// Every finding, in the order a transfer needs the steps.
pub fn examine(host: &Host<'_>) -> Vec<Finding> {
    let mut out = Vec::new();
    kernel(host.inventory, &mut out);
    device_files(host.inventory, &mut out);
    verbs(host, &mut out);
    ports(host.inventory, &mut out);
    memlock(host.memlock, &mut out);
    if let Some(route) = host.route {
        out.push(route_finding(host.inventory, route));
    }
    out
}

fn kernel(inv: &Inventory, out: &mut Vec<Finding>) {
    let drivers: Vec<&str> = DRIVER_MODULES
        .iter()
        .map(|(m, _)| *m)
        .filter(|m| inv.has_module(m) == Some(true))
        .collect();
    if inv.devices.is_empty() {
        let what = match inv.has_module("ib_core") {
            Some(false) => "kernel: no RDMA stack loaded (no ib_core module)".to_string(),
            _ if !drivers.is_empty() => format!(
                "kernel: {} loaded, but no RDMA device registered (/sys/class/infiniband is \
                 empty)",
                drivers.join(", ")
            ),
            _ => "kernel: no RDMA device (/sys/class/infiniband is empty)".to_string(),
        };
        let fix = match inv.idle_nics_fix() {
            Some(fix) => fix,
            None => "load the NIC's RDMA driver (`modprobe mlx5_ib` for ConnectX, `irdma` for \
                     Intel E810, `bnxt_re` for Broadcom), or for SoftRoCE on an Ethernet \
                     interface IF: `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IF`"
                .to_string(),
        };
        out.push(Finding::fail(what, &fix));
        return;
    }
    let names: Vec<String> = inv
        .devices
        .iter()
        .map(|d| match &d.driver {
            Some(driver) => format!("{} ({driver})", d.name),
            None => d.name.clone(),
        })
        .collect();
    out.push(Finding::ok(format!("kernel: {}", names.join(", "))));
}

fn device_files(inv: &Inventory, out: &mut Vec<Finding>) {
    if inv.devices.is_empty() {
        return;
    }
    if inv.uverbs.is_empty() {
        out.push(Finding::fail(
            "/dev/infiniband has no uverbs device (verbs cannot open the devices)".into(),
            "`modprobe ib_uverbs`; in a container, pass the devices in \
             (`docker run --device=/dev/infiniband ...`, or a device plugin)",
        ));
    } else if let Some(closed) = inv.uverbs.iter().find(|f| !f.usable) {
        out.push(Finding::fail(
            format!(
                "{} cannot be opened for reading and writing",
                closed.path.display()
            ),
            "give this user access (rdma-core's udev rules make the files 0666; or join the \
             group that owns them)",
        ));
    }
    match &inv.rdma_cm {
        None => out.push(Finding::fail(
            "/dev/infiniband/rdma_cm is missing (connections cannot be set up)".into(),
            "`modprobe rdma_ucm`; in a container, pass /dev/infiniband/rdma_cm in too",
        )),
        Some(f) if !f.usable => out.push(Finding::fail(
            format!(
                "{} cannot be opened for reading and writing",
                f.path.display()
            ),
            "give this user access to /dev/infiniband/rdma_cm",
        )),
        Some(_) if !inv.uverbs.is_empty() && inv.uverbs.iter().all(|f| f.usable) => {
            out.push(Finding::ok(format!(
                "device files: {} uverbs, rdma_cm",
                inv.uverbs.len()
            )))
        }
        Some(_) => {}
    }
}

fn verbs(host: &Host<'_>, out: &mut Vec<Finding>) {
    match host.verbs {
        Ok(names) => out.push(Finding::ok(format!(
            "user space: libibverbs lists {}",
            names.join(", ")
        ))),
        // The kernel has devices and their files: the provider is missing.
        Err(_) if !host.inventory.devices.is_empty() && !host.inventory.uverbs.is_empty() => out
            .push(Finding::fail(
                "user space: libibverbs lists no device although the kernel has some (no \
                 provider library for them)"
                    .into(),
                "`apt-get install ibverbs-providers` (rdma-core), or the NIC vendor's \
                 user-space package",
            )),
        // Explained by a step above.
        Err(_) => {}
    }
}

fn ports(inv: &Inventory, out: &mut Vec<Finding>) {
    for dev in &inv.devices {
        if dev.ports.is_empty() {
            out.push(Finding::warn(
                format!("{}: no ports in sysfs", dev.name),
                "check the device with `rdma link show`",
            ));
        }
        for port in &dev.ports {
            let mut what = format!(
                "{} port {}: {}, {}, {}",
                dev.name, port.number, port.state, port.phys_state, port.link_layer
            );
            if let Some(netdev) = &port.netdev {
                let _ = write!(what, " on {netdev}");
            }
            if let Some(mtu) = port.mtu {
                let _ = write!(what, ", MTU {mtu}");
            }
            let ips: Vec<String> = port
                .gids
                .iter()
                .filter(|g| g.gid.to_ipv4_mapped().is_some() || g.netdev.is_some())
                .map(|g| match &g.kind {
                    Some(kind) => format!("{} {} ({kind})", g.index, g.ip()),
                    None => format!("{} {}", g.index, g.ip()),
                })
                .collect();
            if !ips.is_empty() {
                let _ = write!(what, "; GIDs {}", ips.join(", "));
            }
            out.push(if port.is_active() {
                Finding::ok(what)
            } else {
                Finding::warn(
                    what,
                    "bring the link up (`ip link set IF up`; check the cable, the switch port, \
                     or the subnet manager on InfiniBand: `systemctl start opensm`)",
                )
            });
        }
    }
}

/// What the defaults pin: the receiver's ring of one session, or the
/// sender's staging buffers, plus the provider's queues.
fn default_need() -> u64 {
    let buffers = u64::from(DEFAULT_CHUNK_SIZE) * u64::from(DEFAULT_SLOTS.max(DEFAULT_DEPTH));
    buffers + PROVIDER_HEADROOM
}

fn memlock(room: &MemlockRoom, out: &mut Vec<Finding>) {
    let need = default_need();
    let fix = "raise RLIMIT_MEMLOCK: `ulimit -l unlimited` (as root), `LimitMEMLOCK=infinity` \
               in a systemd unit, or `* - memlock unlimited` in \
               /etc/security/limits.d/rdma.conf; or grant CAP_IPC_LOCK";
    match room.available() {
        None => out.push(Finding::ok(
            "locked memory: no limit (CAP_IPC_LOCK or an unlimited RLIMIT_MEMLOCK)".into(),
        )),
        Some(free) if free >= need => out.push(Finding::ok(format!(
            "locked memory: {} may be pinned, the defaults need {} per session",
            format_bytes(free),
            format_bytes(need)
        ))),
        Some(free) => out.push(Finding::warn(
            format!(
                "locked memory: {} may be pinned, the defaults need {} per session: buffers \
                 are made smaller to fit, which costs speed, and fewer sessions fit at once",
                format_bytes(free),
                format_bytes(need)
            ),
            fix,
        )),
    }
}

fn route_finding(inv: &Inventory, route: &Route) -> Finding {
    let Some(peer) = route.peer else {
        return Finding::fail(
            format!("{}: does not resolve", route.host),
            "check the name (`getent hosts NAME`) or give an address",
        );
    };
    let Some(source) = route.source else {
        return Finding::fail(
            format!("{} ({peer}): no route", route.host),
            "add a route to it (`ip route`), or give an address on the RDMA network",
        );
    };
    match inv.owner_of(source) {
        Some((dev, port, gid)) => {
            let kind = gid
                .kind
                .as_deref()
                .map_or(String::new(), |k| format!(", {k}"));
            let what = format!(
                "{} ({peer}): leaves from {source}, on {} port {} (GID {}{kind})",
                route.host, dev.name, port.number, gid.index
            );
            if port.is_active() {
                Finding::ok(what)
            } else {
                Finding::fail(
                    format!("{what}, whose port is {}", port.state),
                    "bring the port up (see its line above)",
                )
            }
        }
        None => Finding::fail(
            format!(
                "{} ({peer}): leaves from {source}, which no RDMA device has (the traffic \
                 would not cross an RDMA NIC)",
                route.host
            ),
            "use the peer's address on the RDMA network (`rdma link` shows each device's \
             interface), or `--source ADDR` on the sender",
        ),
    }
}

/// What a handshake with the receiver at `addr` found: it authenticates
/// (with `token`, where the token came from, if the doctor had one) and
/// says BYE, moving no data.
pub fn handshake_finding(
    addr: SocketAddr,
    token: Option<&str>,
    greeted: &Result<(), XferError>,
) -> Finding {
    let err = match greeted {
        Ok(()) => {
            let auth = match token {
                Some(from) => format!("the token from {from} proved both ways"),
                None => "no token (it runs --insecure: anyone who reaches it may send)".into(),
            };
            return Finding::ok(format!(
                "the receiver at {addr} answers, speaks protocol {}; {auth}",
                crate::proto::PROTOCOL_VERSION
            ));
        }
        Err(e) => e,
    };
    let fix = match err {
        XferError::Connect { .. } => {
            "start a receiver there (`receiver --dir DIR`), or give its port (HOST:PORT)"
        }
        XferError::Auth(_) if token.is_none() => {
            "give the receiver's token: RDMA_XFER_TOKEN, --token-file FILE, or /etc/rdma-xfer/token"
        }
        XferError::Auth(_) => {
            "use the same token on both hosts (`rdma-xfer-gen token FILE` makes one)"
        }
        XferError::Rejected { .. } => "run the same version of rdma-xfer on both hosts",
        _ => "see the message; `receiver -v` on the other host says more",
    };
    Finding::fail(format!("the receiver at {addr}: {err}"), fix)
}

/// The findings as lines for a terminal or a log, and the verdict.
pub fn render(findings: &[Finding]) -> String {
    let mut text = String::new();
    for f in findings {
        let tag = match f.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        let _ = writeln!(text, "{tag}  {}", f.what);
        if let Some(fix) = &f.fix {
            let _ = writeln!(text, "      fix: {fix}");
        }
    }
    let fails = findings.iter().filter(|f| f.level == Level::Fail).count();
    let _ = match fails {
        0 => writeln!(text, "RDMA is ready here: a transfer should work."),
        n => writeln!(text, "A transfer would fail here: {n} problem(s) above."),
    };
    text
}

/// Whether a transfer would work: no finding fails.
pub fn ready(findings: &[Finding]) -> bool {
    findings.iter().all(|f| f.level != Level::Fail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::rdma::inventory_fixtures::{fake_rxe, put};

    fn run(
        inv: &Inventory,
        verbs: Result<Vec<String>, SysError>,
        route: Option<&Route>,
    ) -> Vec<Finding> {
        examine(&Host {
            inventory: inv,
            verbs: &verbs,
            memlock: &MemlockRoom::Unlimited,
            route,
        })
    }

    fn no_device() -> Result<Vec<String>, SysError> {
        Err(SysError::NoDevice { cause: "x".into() })
    }

    fn failing(findings: &[Finding]) -> Vec<&str> {
        findings
            .iter()
            .filter(|f| f.level == Level::Fail)
            .map(|f| f.what.as_str())
            .collect()
    }

    #[test]
    fn a_host_without_rdma_is_told_to_load_a_driver() {
        let root = tempfile::tempdir().expect("dir");
        put(root.path(), "proc/modules", "ext4 1 0 - Live 0x0\n");
        let inv = Inventory::read_below(root.path());
        let findings = run(&inv, no_device(), None);
        assert!(!ready(&findings));
        assert_eq!(
            failing(&findings),
            ["kernel: no RDMA stack loaded (no ib_core module)"]
        );
        let text = render(&findings);
        assert!(text.contains("modprobe rdma_rxe"), "{text}");
        assert!(text.contains("A transfer would fail"), "{text}");
        // A ConnectX whose RDMA driver is not loaded: that module, named.
        let nic = root.path().join("sys/class/net/ens1f0/device");
        std::fs::create_dir_all(&nic).expect("nic");
        let driver = root.path().join("sys/bus/pci/drivers/mlx5_core");
        std::fs::create_dir_all(&driver).expect("driver");
        std::os::unix::fs::symlink(&driver, nic.join("driver")).expect("link");
        let inv = Inventory::read_below(root.path());
        let text = render(&run(&inv, no_device(), None));
        assert!(
            text.contains("`modprobe -a mlx5_ib`: the RDMA driver of ens1f0 (mlx5_core)"),
            "{text}"
        );
        assert!(inv.no_device_cause().contains("modprobe -a mlx5_ib"));
        // Loaded already, or built in: not named.
        put(root.path(), "proc/modules", "mlx5_ib 1 0 - Live 0x0\n");
        assert!(Inventory::read_below(root.path()).idle_nics.is_empty());
        put(root.path(), "proc/modules", "ext4 1 0 - Live 0x0\n");
        std::fs::create_dir_all(root.path().join("sys/module/mlx5_ib")).expect("built in");
        assert!(Inventory::read_below(root.path()).idle_nics.is_empty());
    }

    #[test]
    fn a_healthy_softroce_host_is_ready_and_the_route_is_named() {
        let root = tempfile::tempdir().expect("dir");
        fake_rxe(root.path());
        let inv = Inventory::read_below(root.path());
        let route = Route {
            host: "peer".into(),
            peer: Some("10.77.0.2".parse().unwrap()),
            source: Some("10.77.0.1".parse().unwrap()),
            port: None,
        };
        let findings = run(&inv, Ok(vec!["rxe0".into()]), Some(&route));
        assert!(ready(&findings), "{findings:?}");
        let text = render(&findings);
        assert!(
            text.contains("rxe0 port 1: ACTIVE, LinkUp, Ethernet on veth0, MTU 9000"),
            "{text}"
        );
        assert!(text.contains("1 10.77.0.1 (RoCE v2)"), "{text}");
        assert!(
            text.contains(
                "peer (10.77.0.2): leaves from 10.77.0.1, on rxe0 port 1 (GID 1, RoCE v2)"
            ),
            "{text}"
        );
        assert!(text.contains("RDMA is ready here"), "{text}");
    }

    #[test]
    fn a_handshake_says_what_the_receiver_wants() {
        let addr: SocketAddr = "10.77.0.1:7471".parse().unwrap();
        let ok = handshake_finding(addr, Some("/etc/rdma-xfer/token"), &Ok(()));
        assert_eq!(ok.level, Level::Ok);
        assert!(
            ok.what
                .contains("speaks protocol 8; the token from /etc/rdma-xfer/token"),
            "{ok:?}"
        );
        let open = handshake_finding(addr, None, &Ok(()));
        assert!(open.what.contains("runs --insecure"), "{open:?}");
        let wants = handshake_finding(
            addr,
            None,
            &Err(XferError::Auth("the receiver requires a token".into())),
        );
        assert_eq!(wants.level, Level::Fail);
        assert!(wants.fix.unwrap().contains("RDMA_XFER_TOKEN"));
        let wrong = handshake_finding(addr, Some("x"), &Err(XferError::Auth("bad proof".into())));
        assert!(wrong.fix.unwrap().contains("same token"));
    }

    #[test]
    fn each_missing_step_fails_with_its_fix() {
        let root = tempfile::tempdir().expect("dir");
        fake_rxe(root.path());
        // The provider is missing.
        let inv = Inventory::read_below(root.path());
        let findings = run(&inv, no_device(), None);
        assert_eq!(failing(&findings).len(), 1);
        assert!(render(&findings).contains("ibverbs-providers"));
        // A container without the device files.
        std::fs::remove_dir_all(root.path().join("dev")).expect("rm");
        let inv = Inventory::read_below(root.path());
        let findings = run(&inv, no_device(), None);
        assert_eq!(failing(&findings).len(), 2, "{findings:?}");
        assert!(render(&findings).contains("--device=/dev/infiniband"));
        // A port down, a route that leaves by another interface.
        fake_rxe(root.path());
        put(
            root.path(),
            "sys/class/infiniband/rxe0/ports/1/state",
            "1: DOWN\n",
        );
        let inv = Inventory::read_below(root.path());
        let route = Route {
            host: "peer".into(),
            peer: Some("192.0.2.7".parse().unwrap()),
            source: Some("192.0.2.1".parse().unwrap()),
            port: None,
        };
        let findings = run(&inv, Ok(vec!["rxe0".into()]), Some(&route));
        let levels: Vec<Level> = findings.iter().map(|f| f.level).collect();
        assert!(levels.contains(&Level::Warn), "{findings:?}");
        assert_eq!(
            failing(&findings),
            [
                "peer (192.0.2.7): leaves from 192.0.2.1, which no RDMA device has (the traffic would not cross an RDMA NIC)"
            ]
        );
        let unresolved = Route {
            host: "nowhere.invalid".into(),
            peer: None,
            source: None,
            port: None,
        };
        let findings = run(&inv, Ok(vec!["rxe0".into()]), Some(&unresolved));
        assert_eq!(failing(&findings), ["nowhere.invalid: does not resolve"]);
    }

    #[test]
    fn a_low_memlock_limit_is_a_warning_with_the_fix() {
        let root = tempfile::tempdir().expect("dir");
        fake_rxe(root.path());
        let inv = Inventory::read_below(root.path());
        let room = MemlockRoom::Limited {
            limit: 8 << 20,
            hard: 8 << 20,
            pinned: 0,
        };
        let verbs = Ok(vec!["rxe0".into()]);
        let findings = examine(&Host {
            inventory: &inv,
            verbs: &verbs,
            memlock: &room,
            route: None,
        });
        assert!(ready(&findings));
        let text = render(&findings);
        assert!(
            text.contains("warn  locked memory: 8.0 MiB may be pinned"),
            "{text}"
        );
        assert!(text.contains("ulimit -l unlimited"), "{text}");
    }

    #[test]
    fn routes_resolve_names_addresses_and_ports() {
        let r = Route::towards("127.0.0.1:7471");
        assert_eq!(r.peer, Some("127.0.0.1".parse().unwrap()));
        assert_eq!(r.source, Some("127.0.0.1".parse().unwrap()));
        let r = Route::towards("[::1]:7471");
        assert_eq!(r.peer, Some("::1".parse().unwrap()));
        assert_eq!(
            Route::towards("localhost").peer.map(|ip| ip.is_loopback()),
            Some(true)
        );
        assert_eq!(Route::towards("nowhere.invalid").peer, None);
    }
}
