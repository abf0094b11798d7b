//! The remote receiver's side of the ssh channel: the token line, a relay
//! hop's key lines, the hang-up watch, where to listen (SSH_CONNECTION, the route, RoCE GIDs),
//! and where scp's `HOST:PATH` puts the one file.

use super::{KEY_LINE, KEYS_END, ONE_TIME_TOKEN_BYTES, keys_taken_line};
use crate::engine::relay::KeyRing;
use crate::error::XferError;
use crate::proto::Token;
use std::io::{BufRead, Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use zeroize::Zeroizing;

/// Reads the one-time token, the first line of standard input. The rest
/// of the input is the hang-up watch's (`watch_hangup`).
pub fn read_token_line(input: &mut impl BufRead) -> Result<Token, XferError> {
    let mut line = read_bounded_line(input)
        .map_err(|e| XferError::io("cannot read the one-time token from standard input", e))?;
    match secret_of(&mut line, "") {
        Some(token) => Ok(token),
        None => Err(XferError::Usage(
            "--ssh-session reads a one-time token from standard input, as `sender FILE \
             HOST:DIR` writes it; it is not meant to be started by hand"
                .into(),
        )),
    }
}

/// One line of input, its newline included, of at most `MAX_KEY_LINE`
/// bytes (a longer one is cut there); wiped on drop.
fn read_bounded_line(input: &mut impl BufRead) -> std::io::Result<Zeroizing<Vec<u8>>> {
    // Room for the most `take` gives, so that no reallocation leaves a
    // copy behind.
    let mut line = Zeroizing::new(Vec::with_capacity(MAX_KEY_LINE + 1));
    input
        .take(MAX_KEY_LINE as u64)
        .read_until(b'\n', &mut line)?;
    Ok(line)
}

/// Longest line the sender writes on the channel (a token line, a key line).
const MAX_KEY_LINE: usize = 1024;

/// The token in `line`: `prefix`, a one-time token in hex and a newline;
/// None when the line is anything else. Every copy is wiped.
fn secret_of(line: &mut Zeroizing<Vec<u8>>, prefix: &str) -> Option<Token> {
    if line.last() != Some(&b'\n') || !line.starts_with(prefix.as_bytes()) {
        return None;
    }
    line.pop();
    let hex = &line[prefix.len()..];
    if hex.len() != 2 * ONE_TIME_TOKEN_BYTES || !hex.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    // Never empty: it has 2 * ONE_TIME_TOKEN_BYTES digits.
    Token::new(hex.to_vec())
}

/// Reads the tokens of the hosts after this one in a relay chain
/// (`receiver --ssh-relay`): a line `relay-key NAME HEX` per host, then
/// `relay-keys-end`; at most `MAX_RELAY_HOPS` of them. None when the
/// input ends before anything came (the sender gave up the chain).
pub fn read_relay_keys(
    input: &mut impl BufRead,
) -> Result<Option<Vec<(String, Token)>>, XferError> {
    let bad = |what: &str| {
        XferError::Usage(format!(
            "--ssh-relay reads the next hosts' tokens from standard input, as the sender writes \
             them: {what}"
        ))
    };
    let mut keys: Vec<(String, Token)> = Vec::new();
    loop {
        let mut line = read_bounded_line(input)
            .map_err(|e| XferError::io("cannot read the next hosts' tokens", e))?;
        if line.is_empty() && keys.is_empty() {
            return Ok(None);
        }
        if line.as_slice() == format!("{KEYS_END}\n").as_bytes() {
            return Ok(Some(keys));
        }
        // `relay-key NAME HEX`: the name has no space (`check_host`).
        let words: Vec<&[u8]> = line.splitn(3, |&b| b == b' ').collect();
        let (Some(word), Some(name)) = (words.first(), words.get(1)) else {
            return Err(bad("a line that is no key"));
        };
        if *word != KEY_LINE.as_bytes() {
            return Err(bad("a line that is no key"));
        }
        let name = String::from_utf8(name.to_vec()).map_err(|_| bad("a name that is no text"))?;
        crate::proto::check_host(&name).map_err(|e| bad(&e.to_string()))?;
        let prefix = format!("{KEY_LINE} {name} ");
        let Some(token) = secret_of(&mut line, &prefix) else {
            return Err(bad("a key that is no token"));
        };
        if keys.iter().any(|(n, _)| *n == name) {
            return Err(bad("a host twice"));
        }
        if keys.len() == crate::proto::MAX_RELAY_HOPS {
            return Err(bad("more hosts than a chain has"));
        }
        keys.push((name, token));
    }
}

/// Watches standard input on a thread of its own: its end (the sender
/// finished, was killed, or ssh hung up) asks the receiver to shut down,
/// as SIGTERM does. A relay hop (`relay_keys`) first reads the next
/// hosts' tokens into the ring and says so on standard output.
pub fn watch_hangup(relay_keys: Option<Arc<KeyRing>>) {
    let spawned = std::thread::Builder::new()
        .name("ssh-hangup".into())
        .spawn(move || {
            let mut input = std::io::stdin().lock();
            if let Some(ring) = relay_keys {
                match read_relay_keys(&mut input) {
                    Ok(None) => {
                        tracing::debug!("the sender's ssh channel closed before the keys: ending");
                        crate::sys::os::request_shutdown();
                        return;
                    }
                    Ok(Some(keys)) => {
                        let count = keys.len();
                        ring.set(keys);
                        let mut out = std::io::stdout().lock();
                        let said =
                            writeln!(out, "{}", keys_taken_line(count)).and_then(|()| out.flush());
                        if let Err(e) = said {
                            tracing::warn!("cannot tell the sender the tokens arrived: {e}");
                        }
                    }
                    Err(e) => {
                        tracing::error!("{e}");
                        crate::sys::os::request_shutdown();
                        return;
                    }
                }
            }
            let mut buf = [0u8; 256];
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
