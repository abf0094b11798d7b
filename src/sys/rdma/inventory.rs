//! What the kernel shows of its RDMA stack, read from sysfs, /proc and
//! /dev only (no verbs call): the devices and their ports, the modules,
//! the device files. The doctor reports it; a "no RDMA device" error
//! names the first missing step from it.
//!
//! Every path is read below a root (`/` in use, a fake tree in tests).
#![forbid(unsafe_code)]

use std::net::{IpAddr, Ipv6Addr};
use std::path::{Path, PathBuf};

/// Kernel modules of the RDMA stack a user loads by hand, with what they
/// drive: the hardware drivers and the two software ones.
pub const DRIVER_MODULES: &[(&str, &str)] = &[
    ("mlx5_ib", "NVIDIA/Mellanox ConnectX-4 and later"),
    ("mlx4_ib", "Mellanox ConnectX-3"),
    ("irdma", "Intel E810/X722 (iWARP, RoCE)"),
    ("bnxt_re", "Broadcom NetXtreme-E"),
    ("efa", "AWS Elastic Fabric Adapter"),
    ("hfi1", "Cornelis Omni-Path"),
    ("qedr", "Marvell FastLinQ"),
    ("erdma", "Alibaba Elastic RDMA"),
    ("mana_ib", "Microsoft Azure MANA"),
    ("rdma_rxe", "SoftRoCE: RoCE v2 over any Ethernet interface"),
    ("siw", "Soft-iWARP: iWARP over any TCP/IP interface"),
];

/// Ethernet drivers whose NICs do RDMA with a kernel module of their
/// own: (the NIC's driver, its RDMA module).
pub const NIC_RDMA_MODULES: &[(&str, &str)] = &[
    ("mlx5_core", "mlx5_ib"),
    ("mlx4_core", "mlx4_ib"),
    ("ice", "irdma"),
    ("i40e", "irdma"),
    ("bnxt_en", "bnxt_re"),
    ("qede", "qedr"),
    ("mana", "mana_ib"),
];

/// A network interface whose NIC has an RDMA driver that is not loaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleNic {
    /// The interface (`eth0`).
    pub netdev: String,
    /// Its Ethernet driver (`mlx5_core`).
    pub driver: String,
    /// The RDMA module for it (`mlx5_ib`).
    pub module: &'static str,
}

/// One GID table entry in use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gid {
    /// Its index in the port's table (what a GID index option takes).
    pub index: u32,
    /// The GID itself.
    pub gid: Ipv6Addr,
    /// "IB/RoCE v1" or "RoCE v2" (`gid_attrs/types`), when the kernel says.
    pub kind: Option<String>,
    /// The network interface the entry belongs to (RoCE), when known.
    pub netdev: Option<String>,
}

impl Gid {
    /// The IP address a RoCE GID stands for: an IPv4-mapped GID is its
    /// IPv4 address; any other (a link-local or global IPv6 one) itself.
    pub fn ip(&self) -> IpAddr {
        match self.gid.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(self.gid),
        }
    }
}

/// One port of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// The port's number, from 1.
    pub number: u32,
    /// "ACTIVE", "DOWN", "INIT"... (the word after the number in sysfs).
    pub state: String,
    /// "LinkUp", "Disabled", "Polling"...
    pub phys_state: String,
    /// "Ethernet" (RoCE) or "InfiniBand".
    pub link_layer: String,
    /// The network interface under the port (RoCE: the first GID's).
    pub netdev: Option<String>,
    /// That interface's MTU.
    pub mtu: Option<u32>,
    /// The GID entries in use.
    pub gids: Vec<Gid>,
}

impl Port {
    /// Whether the port can carry traffic.
    pub fn is_active(&self) -> bool {
        self.state == "ACTIVE"
    }
}

/// One RDMA device as the kernel registered it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    /// `mlx5_0`, `rxe0`...
    pub name: String,
    /// The kernel driver behind it (`mlx5_core`; for software devices
    /// their module name), when sysfs says.
    pub driver: Option<String>,
    /// Its ports, by number.
    pub ports: Vec<Port>,
}

/// A device file under /dev/infiniband and whether this process may open
/// it for reading and writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFile {
    /// Where it is.
    pub path: PathBuf,
    /// Whether it opens for reading and writing.
    pub usable: bool,
}

/// The kernel's side of the RDMA stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inventory {
    /// The registered devices, by name.
    pub devices: Vec<Device>,
    /// Loaded modules of the stack (`ib_core`, `ib_uverbs`, `rdma_ucm`,
    /// drivers); None when /proc/modules cannot be read (a container).
    pub modules: Option<Vec<String>>,
    /// /dev/infiniband/uverbsN: one per device for verbs.
    pub uverbs: Vec<DeviceFile>,
    /// /dev/infiniband/rdma_cm, for connection set-up; None if absent.
    pub rdma_cm: Option<DeviceFile>,
    /// Interfaces whose NIC could do RDMA with a module that is not
    /// loaded (known only where /proc/modules can be read).
    pub idle_nics: Vec<IdleNic>,
}

impl Inventory {
    /// Reads the running system's stack.
    pub fn read() -> Self {
        Self::read_below(Path::new("/"))
    }

    /// Reads the stack from the tree below `root`.
    pub fn read_below(root: &Path) -> Self {
        let devices = devices_below(root);
        let modules = std::fs::read_to_string(root.join("proc/modules"))
            .ok()
            .map(|text| stack_modules(&text));
        let dev = root.join("dev/infiniband");
        let mut uverbs: Vec<DeviceFile> = names_in(&dev)
            .into_iter()
            .filter(|n| n.starts_with("uverbs"))
            .map(|n| device_file(dev.join(n)))
            .collect();
        uverbs.sort_by(|a, b| a.path.cmp(&b.path));
        let cm = dev.join("rdma_cm");
        let rdma_cm = cm.exists().then(|| device_file(cm));
        let idle_nics = idle_nics_below(root, modules.as_deref());
        Inventory {
            devices,
            modules,
            uverbs,
            rdma_cm,
            idle_nics,
        }
    }

    /// What to load for the NICs here that could do RDMA: `modprobe
    /// MODULE` naming the interfaces, or None when none is known.
    pub fn idle_nics_fix(&self) -> Option<String> {
        let mut modules: Vec<&str> = self.idle_nics.iter().map(|n| n.module).collect();
        modules.dedup();
        if modules.is_empty() {
            return None;
        }
        let nics: Vec<String> = self
            .idle_nics
            .iter()
            .map(|n| format!("{} ({})", n.netdev, n.driver))
            .collect();
        Some(format!(
            "`modprobe -a {}`: the RDMA driver of {} (if the card has RDMA; else SoftRoCE on \
             it: `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IF`)",
            modules.join(" "),
            nics.join(", ")
        ))
    }

    /// Whether module `name` is loaded (None: cannot tell).
    pub fn has_module(&self, name: &str) -> Option<bool> {
        self.modules
            .as_ref()
            .map(|m| m.iter().any(|loaded| loaded == name))
    }

    /// The first missing step when verbs lists no device: the kernel has
    /// none, its device files are missing or closed to us, or (the kernel
    /// has them all) the user-space provider is missing.
    pub fn no_device_cause(&self) -> String {
        if self.devices.is_empty() {
            if let Some(fix) = self.idle_nics_fix() {
                return format!("the kernel has no RDMA device: {fix}");
            }
            return match self.has_module("ib_core") {
                Some(false) => "the kernel has no RDMA stack loaded (no ib_core module): load \
                                the NIC's driver, e.g. `modprobe mlx5_ib`, or for SoftRoCE \
                                `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IF`"
                    .into(),
                _ => "the kernel has no RDMA device (/sys/class/infiniband is empty): load \
                      the NIC's driver, or for SoftRoCE on an Ethernet interface IF: \
                      `modprobe rdma_rxe && rdma link add rxe0 type rxe netdev IF`"
                    .into(),
            };
        }
        let names: Vec<&str> = self.devices.iter().map(|d| d.name.as_str()).collect();
        let names = names.join(", ");
        if self.uverbs.is_empty() {
            return format!(
                "the kernel has {names} but /dev/infiniband has no uverbs device: \
                 `modprobe ib_uverbs`, or in a container pass the devices in \
                 (`--device=/dev/infiniband`)"
            );
        }
        if let Some(closed) = self.uverbs.iter().find(|f| !f.usable) {
            return format!(
                "{} cannot be opened for reading and writing by this user (see its \
                 permissions, or run as a member of its group)",
                closed.path.display()
            );
        }
        format!(
            "the kernel has {names} and its device files, but libibverbs finds no \
             user-space provider for them: install rdma-core's providers \
             (`apt-get install ibverbs-providers`)"
        )
    }

    /// The device and port that own IP address `ip` (its GID), with the
    /// GID entry.
    pub fn owner_of(&self, ip: IpAddr) -> Option<(&Device, &Port, &Gid)> {
        let ip = canonical(ip);
        self.devices.iter().find_map(|d| {
            d.ports.iter().find_map(|p| {
                p.gids
                    .iter()
                    .find(|g| canonical(g.ip()) == ip)
                    .map(|g| (d, p, g))
            })
        })
    }
}

/// The running system's devices with their ports, from sysfs alone (no
/// device file is opened).
pub fn devices() -> Vec<Device> {
    devices_below(Path::new("/"))
}

fn devices_below(root: &Path) -> Vec<Device> {
    let class = root.join("sys/class/infiniband");
    let mut devices: Vec<Device> = names_in(&class)
        .into_iter()
        .map(|name| read_device(root, &class.join(&name), name))
        .collect();
    devices.sort_by(|a, b| a.name.cmp(&b.name));
    devices
}

/// An IPv4-mapped IPv6 address as its IPv4 address.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

/// The modules of /proc/modules that belong to the RDMA stack.
fn stack_modules(text: &str) -> Vec<String> {
    const STACK: &[&str] = &["ib_core", "ib_uverbs", "rdma_ucm", "rdma_cm", "ib_cm"];
    text.lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|m| STACK.contains(m) || DRIVER_MODULES.iter().any(|(d, _)| d == m))
        .map(str::to_owned)
        .collect()
}

/// Interfaces under `root`/sys/class/net whose driver has an RDMA module
/// in `NIC_RDMA_MODULES` that is not among `modules` (none when the
/// modules are unknown).
fn idle_nics_below(root: &Path, modules: Option<&[String]>) -> Vec<IdleNic> {
    let Some(modules) = modules else {
        return Vec::new();
    };
    let net = root.join("sys/class/net");
    let mut nics: Vec<IdleNic> = names_in(&net)
        .into_iter()
        .filter_map(|netdev| {
            let link = std::fs::read_link(net.join(&netdev).join("device/driver")).ok()?;
            let driver = link.file_name()?.to_str()?.to_owned();
            let (_, module) = NIC_RDMA_MODULES.iter().find(|(d, _)| *d == driver)?;
            // Built into the kernel: in /sys/module, never in /proc/modules.
            let loaded = modules.iter().any(|m| m == module)
                || root.join("sys/module").join(module).exists();
            (!loaded).then_some(IdleNic {
                netdev,
                driver,
                module,
            })
        })
        .collect();
    nics.sort_by(|a, b| (a.module, &a.netdev).cmp(&(b.module, &b.netdev)));
    nics
}

fn names_in(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .collect()
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// A device file, tried for reading and writing (opening uverbs or
/// rdma_cm allocates nothing until a command is written).
fn device_file(path: PathBuf) -> DeviceFile {
    let usable = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .is_ok();
    DeviceFile { path, usable }
}

fn read_device(root: &Path, dir: &Path, name: String) -> Device {
    // Hardware: device/driver links to the PCI driver. Software devices
    // have no parent device; their name tells (rxe, siw).
    let driver = std::fs::read_link(dir.join("device/driver"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()))
        .or_else(|| {
            let parent = read_trimmed(&dir.join("parent"));
            match name.as_str() {
                n if n.starts_with("rxe") => Some("rdma_rxe".into()),
                n if n.starts_with("siw") => Some("siw".into()),
                _ => parent,
            }
        });
    let ports_dir = dir.join("ports");
    let mut ports: Vec<Port> = names_in(&ports_dir)
        .into_iter()
        .filter_map(|n| n.parse::<u32>().ok())
        .map(|number| read_port(root, &ports_dir.join(number.to_string()), number))
        .collect();
    ports.sort_by_key(|p| p.number);
    Device {
        name,
        driver,
        ports,
    }
}

/// sysfs writes "4: ACTIVE" and "5: LinkUp": the word after the number.
fn state_word(text: Option<String>) -> String {
    text.map(|s| {
        s.split_once(':')
            .map_or(s.clone(), |(_, w)| w.trim().to_owned())
    })
    .unwrap_or_default()
}

fn read_port(root: &Path, dir: &Path, number: u32) -> Port {
    let gids_dir = dir.join("gids");
    let mut gids: Vec<Gid> = names_in(&gids_dir)
        .into_iter()
        .filter_map(|n| n.parse::<u32>().ok())
        .filter_map(|index| {
            let gid: Ipv6Addr = read_trimmed(&gids_dir.join(index.to_string()))?
                .parse()
                .ok()?;
            // Unused entries read as all zeros (and fe80::/64 ones without
            // an interface are the port's default GID: kept, they say the
            // port is there).
            if gid.is_unspecified() {
                return None;
            }
            let attrs = dir.join("gid_attrs");
            let kind = read_trimmed(&attrs.join("types").join(index.to_string()));
            let netdev = read_trimmed(&attrs.join("ndevs").join(index.to_string()));
            Some(Gid {
                index,
                gid,
                kind,
                netdev,
            })
        })
        .collect();
    gids.sort_by_key(|g| g.index);
    let netdev = gids.iter().find_map(|g| g.netdev.clone());
    let mtu = netdev.as_ref().and_then(|n| {
        read_trimmed(&root.join("sys/class/net").join(n).join("mtu"))?
            .parse()
            .ok()
    });
    Port {
        number,
        state: state_word(read_trimmed(&dir.join("state"))),
        phys_state: state_word(read_trimmed(&dir.join("phys_state"))),
        link_layer: read_trimmed(&dir.join("link_layer")).unwrap_or_default(),
        netdev,
        mtu,
        gids,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes `text` at `root/rel`, creating its directories.
    pub(crate) fn put(root: &Path, rel: &str, text: &str) {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    /// A SoftRoCE device rxe0 on veth0 (10.77.0.1, MTU 9000), port ACTIVE.
    pub(crate) fn fake_rxe(root: &Path) {
        let port = "sys/class/infiniband/rxe0/ports/1";
        put(root, &format!("{port}/state"), "4: ACTIVE\n");
        put(root, &format!("{port}/phys_state"), "5: LinkUp\n");
        put(root, &format!("{port}/link_layer"), "Ethernet\n");
        put(
            root,
            &format!("{port}/gids/0"),
            "fe80:0000:0000:0000:0000:0aff:fe4d:0001\n",
        );
        put(
            root,
            &format!("{port}/gids/1"),
            "0000:0000:0000:0000:0000:ffff:0a4d:0001\n",
        );
        put(
            root,
            &format!("{port}/gids/2"),
            "0000:0000:0000:0000:0000:0000:0000:0000\n",
        );
        put(root, &format!("{port}/gid_attrs/types/0"), "RoCE v2\n");
        put(root, &format!("{port}/gid_attrs/types/1"), "RoCE v2\n");
        put(root, &format!("{port}/gid_attrs/ndevs/0"), "veth0\n");
        put(root, &format!("{port}/gid_attrs/ndevs/1"), "veth0\n");
        put(root, "sys/class/net/veth0/mtu", "9000\n");
        put(
            root,
            "proc/modules",
            "rdma_rxe 1 0 - Live 0x0\nib_uverbs 1 0 - Live 0x0\nib_core 1 0 - Live 0x0\nrdma_ucm 1 0 - Live 0x0\next4 1 0 - Live 0x0\n",
        );
        put(root, "dev/infiniband/uverbs0", "");
        put(root, "dev/infiniband/rdma_cm", "");
    }

    #[test]
    fn a_softroce_device_is_read_with_its_port_gids_and_files() {
        let root = tempfile::tempdir().expect("dir");
        fake_rxe(root.path());
        let inv = Inventory::read_below(root.path());
        assert_eq!(inv.devices.len(), 1);
        let dev = &inv.devices[0];
        assert_eq!(
            (dev.name.as_str(), dev.driver.as_deref()),
            ("rxe0", Some("rdma_rxe"))
        );
        let port = &dev.ports[0];
        assert!(port.is_active());
        assert_eq!(port.phys_state, "LinkUp");
        assert_eq!(port.link_layer, "Ethernet");
        assert_eq!(
            (port.netdev.as_deref(), port.mtu),
            (Some("veth0"), Some(9000))
        );
        // The unused all-zero entry is left out.
        assert_eq!(port.gids.len(), 2);
        assert_eq!(port.gids[1].ip(), "10.77.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(port.gids[1].kind.as_deref(), Some("RoCE v2"));
        assert_eq!(
            inv.modules.as_deref(),
            Some(&["rdma_rxe", "ib_uverbs", "ib_core", "rdma_ucm"].map(String::from)[..])
        );
        assert_eq!(inv.uverbs.len(), 1);
        assert!(inv.uverbs[0].usable && inv.rdma_cm.as_ref().is_some_and(|f| f.usable));
        let (d, p, g) = inv.owner_of("10.77.0.1".parse().unwrap()).expect("owner");
        assert_eq!((d.name.as_str(), p.number, g.index), ("rxe0", 1, 1));
        assert!(inv.owner_of("::ffff:10.77.0.1".parse().unwrap()).is_some());
        assert!(inv.owner_of("10.77.0.9".parse().unwrap()).is_none());
    }

    #[test]
    fn the_first_missing_step_is_named() {
        let root = tempfile::tempdir().expect("dir");
        // No stack at all.
        put(root.path(), "proc/modules", "ext4 1 0 - Live 0x0\n");
        let cause = Inventory::read_below(root.path()).no_device_cause();
        assert!(cause.contains("no ib_core module"), "{cause}");
        // /proc/modules unreadable: the empty class is the cause.
        let bare = tempfile::tempdir().expect("dir");
        let cause = Inventory::read_below(bare.path()).no_device_cause();
        assert!(cause.contains("/sys/class/infiniband is empty"), "{cause}");
        // A device, no device files (a container without them).
        fake_rxe(root.path());
        std::fs::remove_dir_all(root.path().join("dev")).expect("rm");
        let cause = Inventory::read_below(root.path()).no_device_cause();
        assert!(cause.contains("--device=/dev/infiniband"), "{cause}");
        // Everything the kernel has: the provider is missing.
        fake_rxe(root.path());
        let cause = Inventory::read_below(root.path()).no_device_cause();
        assert!(cause.contains("ibverbs-providers"), "{cause}");
    }
}
