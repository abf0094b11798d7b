//! The remote receiver's side of the ssh channel: the token line, the
//! hang-up watch, where to listen (SSH_CONNECTION, the route, RoCE GIDs),
//! and where scp's `HOST:PATH` puts the one file.

use super::ONE_TIME_TOKEN_BYTES;
use crate::error::XferError;
use crate::proto::Token;
use std::io::{BufRead, Read};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use zeroize::Zeroizing;

/// Reads the one-time token, the first line of standard input. The rest
/// of the input is the hang-up watch's (`watch_hangup`).
pub fn read_token_line(input: &mut impl BufRead) -> Result<Token, XferError> {
    // Bounded: a token line is 64 characters. Room for the most `take`
    // gives, so that no reallocation leaves a copy behind; wiped on drop.
    let mut line = Zeroizing::new(Vec::with_capacity(1025));
    input
        .take(1024)
        .read_until(b'\n', &mut line)
        .map_err(|e| XferError::io("cannot read the one-time token from standard input", e))?;
    let ok = line.last() == Some(&b'\n');
    line.pop();
    let hex = line.len() == 2 * ONE_TIME_TOKEN_BYTES && line.iter().all(u8::is_ascii_hexdigit);
    if ok && hex {
        // Never empty: it has 2 * ONE_TIME_TOKEN_BYTES digits.
        if let Some(token) = Token::new(std::mem::take(&mut *line)) {
            return Ok(token);
        }
    }
    Err(XferError::Usage(
        "--ssh-session reads a one-time token from standard input, as `sender FILE \
         HOST:DIR` writes it; it is not meant to be started by hand"
            .into(),
    ))
}

/// Watches standard input on a thread of its own: its end (the sender
/// finished, was killed, or ssh hung up) asks the receiver to shut down,
/// as SIGTERM does.
pub fn watch_hangup() {
    let spawned = std::thread::Builder::new()
        .name("ssh-hangup".into())
        .spawn(|| {
            let mut buf = [0u8; 256];
            let mut input = std::io::stdin();
            loop {
                match input.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(_) => {}
                }
            }
            tracing::debug!("the sender's ssh channel closed: ending");
            crate::sys::os::request_shutdown();
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch the ssh channel: {e}");
    }
}

/// Where a receiver started over ssh listens, in order of preference:
/// the address the ssh connection came in on (SSH_CONNECTION), the one
/// this host would use towards the sender, every address in the RDMA
/// devices' GID tables (RoCE), then every other interface address (IPoIB
/// on InfiniBand), IPv4 first. The caller keeps the first that binds to
/// an RDMA device.
pub fn bind_candidates(ssh_connection: Option<&str>) -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = Vec::new();
    let mut add = |ip: IpAddr| {
        if !ip.is_unspecified() && !out.contains(&ip) {
            out.push(ip);
        }
    };
    // "CLIENT_IP CLIENT_PORT SERVER_IP SERVER_PORT"
    let words: Vec<&str> = ssh_connection.unwrap_or("").split_whitespace().collect();
    if let [client, _, server, _] = words[..] {
        if let Ok(ip) = server.parse() {
            add(ip);
        }
        if let Some(ip) = client.parse().ok().and_then(crate::sys::os::source_towards) {
            add(ip);
        }
    }
    for ip in rdma_gid_addresses() {
        add(ip);
    }
    // InfiniBand GIDs are no IP addresses: its IPoIB interfaces' are, as
    // are any others (the caller keeps those an RDMA device has).
    let mut others: Vec<IpAddr> = crate::sys::os::interface_addresses()
        .into_iter()
        .map(|(_, ip)| ip)
        .filter(|ip| !ip.is_loopback() && !is_link_local(ip))
        .collect();
    others.sort_by_key(|ip| ip.is_ipv6());
    for ip in others {
        add(ip);
    }
    out
}

fn is_link_local(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.is_link_local(),
        IpAddr::V6(a) => (a.segments()[0] & 0xffc0) == 0xfe80,
    }
}

/// The IP addresses in the GID tables of this host's RDMA devices (RoCE:
/// IPv4-mapped and global IPv6 GIDs), IPv4 first.
fn rdma_gid_addresses() -> Vec<IpAddr> {
    let devices = crate::sys::rdma::devices();
    let gids = devices.iter().flat_map(|d| &d.ports).flat_map(|p| &p.gids);
    let mut out: Vec<IpAddr> = Vec::new();
    for ip in gids.filter_map(|g| routable(g.gid)) {
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    out.sort_by_key(IpAddr::is_ipv6);
    out
}

/// A GID as an IP address: IPv4-mapped ones as IPv4, global IPv6 as such;
/// None for empty, link-local and IB (non-IP) GIDs.
pub(super) fn routable(ip: std::net::Ipv6Addr) -> Option<IpAddr> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return (!v4.is_unspecified()).then_some(IpAddr::V4(v4));
    }
    let first = ip.segments()[0];
    // Global unicast 2000::/3 and unique local fc00::/7 only.
    ((first & 0xe000) == 0x2000 || (first & 0xfe00) == 0xfc00).then_some(IpAddr::V6(ip))
}

/// Where the file of `sender FILE HOST:PATH` goes, decided once, before
/// the receiver listens (`receiver --ssh-session --ssh-path`): None when
/// PATH is a directory (a link to one included, as scp's), the file
/// arriving under its own name; else PATH's parent directory, the file
/// arriving there under PATH's last component. That name is then any
/// other: a link there is never followed, an existing file is refused
/// unless replaced by the receiver's rules, and a directory made there
/// after this decision is refused too. Neither being a directory is a
/// usage error naming PATH.
pub fn scp_path(path: &Path) -> Result<Option<PathBuf>, XferError> {
    if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
        return Ok(None);
    }
    // Split as the sender did, by the last `/` of the text as given.
    use std::os::unix::ffi::OsStrExt;
    let text = path.as_os_str().as_bytes();
    let (parent, name): (&[u8], &[u8]) = match text.iter().rposition(|&b| b == b'/') {
        Some(0) => (b"/", &text[1..]),
        Some(i) => (&text[..i], &text[i + 1..]),
        // `new.pt`: in the current directory (the login's home).
        None => (b".", text),
    };
    if matches!(name, b"" | b"." | b"..") {
        return Err(XferError::Usage(format!(
            "{} is not a directory and names no file in one",
            path.display()
        )));
    }
    let parent = PathBuf::from(std::ffi::OsStr::from_bytes(parent));
    // Said here, naming PATH as given: the receiver would name the parent.
    match std::fs::metadata(&parent) {
        Ok(m) if m.is_dir() => Ok(Some(parent)),
        Ok(_) => Err(XferError::Usage(format!(
            "output directory {}: neither it nor {} is a directory",
            path.display(),
            parent.display()
        ))),
        Err(e) => Err(XferError::Usage(format!(
            "output directory {} (or {}, to hold the file under its last name): {e}",
            path.display(),
            parent.display()
        ))),
    }
}
