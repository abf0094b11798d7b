//! `--allow ADDR[/PREFIX]`: which peer addresses may connect at all. A
//! connection from anywhere else is refused at the connection-manager level,
//! before any message of ours reaches it.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

/// One network peers may connect from: an address and a prefix length
/// (the whole address without one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllowedNet {
    addr: IpAddr,
    prefix: u8,
}

impl AllowedNet {
    /// Whether `peer` is inside this network. An IPv4 peer seen as an
    /// IPv4-mapped IPv6 address (`::ffff:10.0.0.2`) counts as IPv4.
    pub fn contains(&self, peer: IpAddr) -> bool {
        match (self.addr, peer.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(p)) => same_prefix(
                u128::from(net.to_bits()) << 96,
                u128::from(p.to_bits()) << 96,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(p)) => {
                same_prefix(net.to_bits(), p.to_bits(), self.prefix)
            }
            _ => false,
        }
    }
}

/// Whether the first `prefix` bits of `a` and `b` agree.
fn same_prefix(a: u128, b: u128, prefix: u8) -> bool {
    let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
    (a ^ b) & mask == 0
}

/// Whether `peer` may connect: every peer when `allowed` is empty.
pub fn is_allowed(allowed: &[AllowedNet], peer: Option<IpAddr>) -> bool {
    allowed.is_empty() || peer.is_some_and(|p| allowed.iter().any(|n| n.contains(p)))
}

impl FromStr for AllowedNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse()
            .map_err(|_| format!("{s:?} is not an IP address or ADDR/PREFIX"))?;
        let addr = addr.to_canonical();
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= max)
                .ok_or_else(|| format!("prefix of {s:?} must be a number from 0 to {max}"))?,
        };
        Ok(AllowedNet { addr, prefix })
    }
}

impl fmt::Display for AllowedNet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> AllowedNet {
        s.parse().unwrap()
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_and_prefixes() {
        let lan = net("10.0.0.0/24");
        assert!(lan.contains(ip("10.0.0.1")));
        assert!(lan.contains(ip("10.0.0.255")));
        assert!(!lan.contains(ip("10.0.1.1")));
        assert!(!lan.contains(ip("11.0.0.1")));
        // An IPv4 peer seen through an IPv6 listener.
        assert!(lan.contains(ip("::ffff:10.0.0.7")));
        assert!(
            !lan.contains(ip("::10.0.0.7")),
            "IPv4-compatible is not mapped"
        );
        assert!(!lan.contains(ip("fe80::1")));
        // One host: the whole address.
        let host = net("192.168.1.5");
        assert_eq!(host.to_string(), "192.168.1.5/32");
        assert!(host.contains(ip("192.168.1.5")));
        assert!(!host.contains(ip("192.168.1.4")));
        // Everyone of a family.
        assert!(net("0.0.0.0/0").contains(ip("203.0.113.9")));
        assert!(!net("0.0.0.0/0").contains(ip("2001:db8::1")));
        assert!(net("::/0").contains(ip("2001:db8::1")));
        // IPv6 prefixes, and brackets as in URLs.
        let v6 = net("[2001:db8:1::]/48");
        assert!(v6.contains(ip("2001:db8:1:ffff::1")));
        assert!(!v6.contains(ip("2001:db8:2::1")));
        assert!(!v6.contains(ip("10.0.0.1")));
        assert!(net("fe80::1/128").contains(ip("fe80::1")));
        // A mapped rule is an IPv4 rule.
        assert_eq!(net("::ffff:10.0.0.1/32"), net("10.0.0.1"));
        // Odd prefixes inside a byte.
        let odd = net("10.0.0.128/25");
        assert!(odd.contains(ip("10.0.0.200")));
        assert!(!odd.contains(ip("10.0.0.127")));
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in [
            "",
            "host",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "10.0.0.0/",
            "::/129",
            "10.0.0/8",
            "10.0.0.0/8/8",
        ] {
            assert!(bad.parse::<AllowedNet>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn an_empty_list_allows_everyone() {
        assert!(is_allowed(&[], Some(ip("203.0.113.1"))));
        assert!(is_allowed(&[], None));
        let list = [net("10.0.0.0/8"), net("2001:db8::/32")];
        assert!(is_allowed(&list, Some(ip("10.1.2.3"))));
        assert!(is_allowed(&list, Some(ip("2001:db8::5"))));
        assert!(!is_allowed(&list, Some(ip("192.168.0.1"))));
        assert!(
            !is_allowed(&list, None),
            "an unknown peer is not on any list"
        );
    }
}
