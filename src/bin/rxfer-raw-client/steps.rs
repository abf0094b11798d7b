//! Steps: what the client does, one command-line argument each.

use crate::output::hex;
use rdma_xfer::proto::{CAP_NONE, Digest, DigestAlg, Fin, Hello, Message};
use std::path::PathBuf;
use std::time::Duration;

/// The HELLO version the client offers unless told otherwise: the one
/// this build speaks (any other is refused by the receiver).
pub(crate) const PLAIN_HELLO_VERSION: u16 = rdma_xfer::proto::PROTOCOL_VERSION;

/// One step of a scenario.
#[derive(Debug, Clone)]
pub(crate) enum Step {
    Raw(Vec<u8>),
    Msg(Message),
    /// AUTH answering the last CHALLENGE with this token (empty: no MAC):
    /// what a protocol-2 sender sends.
    Auth(Vec<u8>),
    /// PROVE (protocol 3) with this token, over the CHALLENGE nonce of
    /// connection `nonce_from` and the identity of connection `conn_from`
    /// (1-based; None: the current one). Honest when both are the current
    /// connection: its AUTH_OK is then checked and the channel installed.
    Prove {
        token: Vec<u8>,
        nonce_from: Option<usize>,
        conn_from: Option<usize>,
    },
    /// Switch to connection N (1-based), connecting it first if new.
    Conn(usize),
    /// The next sealed message goes out with its tag altered.
    BadMac,
    /// The last sealed message, sent again as it was.
    Replay,
    Writes {
        count: u32,
        len: Option<u32>,
        imm: Imm,
    },
    /// Writes to an explicit remote address and rkey (None: the last MR's).
    WritesTo {
        addr: Option<u64>,
        rkey: Option<u32>,
        count: u32,
        len: Option<u32>,
        imm: Imm,
    },
    /// Plain RDMA WRITEs of other data over the slot of the last data
    /// write.
    Rewrite {
        count: u32,
        len: Option<u32>,
    },
    Expect(Vec<String>),
    ExpectDisconnect,
    Sleep(Duration),
    WaitFile(PathBuf),
}

/// The immediate of a data write: the data's CRC32, a wrong one, or a
/// value; or none at all (a plain RDMA WRITE).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Imm {
    Crc,
    Bad,
    Value(u32),
    None,
}

pub(crate) fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s.bytes().filter(|&b| b != b'_').collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits in {s:?}"));
    }
    digits
        .chunks(2)
        .map(|p| {
            std::str::from_utf8(p)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 16).ok())
                .ok_or_else(|| format!("bad hex {s:?}"))
        })
        .collect()
}

pub(crate) fn percent_decode(s: &str) -> Result<String, String> {
    String::from_utf8(percent_decode_bytes(s)?)
        .map_err(|_| format!("{s:?} does not decode to UTF-8 (use raw:)"))
}

pub(crate) fn percent_decode_bytes(s: &str) -> Result<Vec<u8>, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s
                .get(i + 1..i + 3)
                .ok_or_else(|| format!("incomplete %-escape in {s:?}"))?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| format!("bad %-escape in {s:?}"))?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    Ok(out)
}

pub(crate) fn parse_num<T: std::str::FromStr>(s: &str, what: &str) -> Result<T, String> {
    s.parse()
        .map_err(|_| format!("{what}: expected a number, got {s:?}"))
}

pub(crate) fn parse_hex_u64(s: &str, what: &str) -> Result<u64, String> {
    let digits = s
        .strip_prefix("0x")
        .or_else(|| s.strip_prefix("0X"))
        .unwrap_or(s);
    u64::from_str_radix(digits, 16).map_err(|_| format!("{what}: expected hex, got {s:?}"))
}

pub(crate) fn parse_imm(field: Option<&str>) -> Result<Imm, String> {
    Ok(match field {
        None | Some("crc") => Imm::Crc,
        Some("bad") => Imm::Bad,
        Some("none") => Imm::None,
        Some(h) => Imm::Value(u32::from_str_radix(h, 16).map_err(|_| format!("bad IMM {h:?}"))?),
    })
}

pub(crate) fn parse_step(arg: &str) -> Result<Step, String> {
    let mut parts = arg.split(':');
    let kind = parts.next().unwrap_or_default();
    let fields: Vec<&str> = parts.collect();
    let field = |i: usize| fields.get(i).copied().filter(|f| !f.is_empty());
    let step = match kind {
        "raw" => Step::Raw(parse_hex(&fields.join(""))?),
        "hello" => {
            let name = percent_decode(fields.first().copied().unwrap_or_default())?;
            let size = match field(1) {
                None => 0,
                Some("max") => u64::MAX,
                Some(s) => parse_num(s, "HELLO size")?,
            };
            let digest = match field(2) {
                None | Some("crc32") => DigestAlg::Crc32,
                Some("sha256") => DigestAlg::Sha256,
                Some(other) => return Err(format!("unknown digest {other:?}")),
            };
            let version = match field(3) {
                None => PLAIN_HELLO_VERSION,
                Some(v) => parse_num(v, "HELLO version")?,
            };
            Step::Msg(Message::Hello(Hello {
                version,
                caps: CAP_NONE,
                name,
                size,
                mode: 0o644,
                digest,
                mtime: None,
                piece: None,
            }))
        }
        "fin" => {
            let bytes = parse_num(field(0).unwrap_or("0"), "FIN bytes")?;
            let chunks = parse_num(field(1).unwrap_or("0"), "FIN chunks")?;
            let crc = match field(2) {
                None => 0,
                Some(h) => u32::from_str_radix(h, 16).map_err(|_| format!("bad CRC {h:?}"))?,
            };
            Step::Msg(Message::Fin(Fin {
                bytes,
                chunks,
                digest: Digest::Crc32(crc),
            }))
        }
        "credit" => Step::Msg(Message::Credit {
            count: parse_num(field(0).unwrap_or("1"), "CREDIT count")?,
        }),
        "bye" => Step::Msg(Message::Bye),
        "auth" => Step::Auth(percent_decode_bytes(&fields.join(":"))?),
        "prove" => Step::Prove {
            token: percent_decode_bytes(fields.first().copied().unwrap_or_default())?,
            nonce_from: field(1)
                .map(|n| parse_num(n, "prove NONCE_FROM"))
                .transpose()?,
            conn_from: field(2)
                .map(|n| parse_num(n, "prove CONN_FROM"))
                .transpose()?,
        },
        "conn" => Step::Conn(parse_num(field(0).unwrap_or("1"), "conn")?),
        "bad-mac" => Step::BadMac,
        "replay" => Step::Replay,
        "writes" => Step::Writes {
            count: parse_num(field(0).unwrap_or("1"), "write count")?,
            len: field(1).map(|l| parse_num(l, "write length")).transpose()?,
            imm: parse_imm(field(2))?,
        },
        "writes-to" => Step::WritesTo {
            addr: match field(0).ok_or("writes-to: needs ADDR:RKEY:N")? {
                "own" => None,
                a => Some(parse_hex_u64(a, "writes-to address")?),
            },
            rkey: match field(1).ok_or("writes-to: needs ADDR:RKEY:N")? {
                "own" => None,
                k => Some(
                    u32::try_from(parse_hex_u64(k, "writes-to rkey")?)
                        .map_err(|_| format!("writes-to: rkey {k:?} exceeds 32 bits"))?,
                ),
            },
            count: parse_num(
                field(2).ok_or("writes-to: needs ADDR:RKEY:N")?,
                "write count",
            )?,
            len: field(3).map(|l| parse_num(l, "write length")).transpose()?,
            imm: parse_imm(field(4))?,
        },
        "rewrite" => Step::Rewrite {
            count: parse_num(field(0).unwrap_or("1"), "rewrite count")?,
            len: field(1)
                .map(|l| parse_num(l, "rewrite length"))
                .transpose()?,
        },
        "expect" => {
            let kinds: Vec<String> = fields
                .join(":")
                .split('|')
                .filter(|k| !k.is_empty())
                .map(str::to_ascii_uppercase)
                .collect();
            if kinds.is_empty() {
                return Err("expect: needs at least one message kind".into());
            }
            Step::Expect(kinds)
        }
        "expect-disconnect" => Step::ExpectDisconnect,
        "sleep" => Step::Sleep(Duration::from_millis(parse_num(
            field(0).unwrap_or("0"),
            "sleep",
        )?)),
        "wait-file" => {
            let path = fields.join(":");
            if path.is_empty() {
                return Err("wait-file: needs a path".into());
            }
            Step::WaitFile(PathBuf::from(path))
        }
        other => return Err(format!("unknown step {other:?} in {arg:?} (see --help)")),
    };
    Ok(step)
}

pub(crate) fn step_arg(step: &Step) -> String {
    let pct = |s: &str| -> String {
        s.bytes()
            .map(|b| {
                if b.is_ascii_graphic() && !matches!(b, b'%' | b':' | b'|') {
                    (b as char).to_string()
                } else {
                    format!("%{b:02x}")
                }
            })
            .collect()
    };
    match step {
        Step::Raw(b) => format!("raw:{}", hex(b)),
        Step::Msg(Message::Hello(h)) => format!(
            "hello:{}:{}:{}:{}",
            pct(&h.name),
            if h.size == u64::MAX {
                "max".to_string()
            } else {
                h.size.to_string()
            },
            h.digest,
            h.version
        ),
        Step::Msg(Message::Fin(f)) => match f.digest {
            Digest::Crc32(c) => format!("fin:{}:{}:{c:x}", f.bytes, f.chunks),
            Digest::Sha256(_) => format!("fin:{}:{}", f.bytes, f.chunks),
        },
        Step::Msg(Message::Credit { count }) => format!("credit:{count}"),
        Step::Msg(Message::Bye) => "bye".into(),
        Step::Msg(m) => format!("({})", m.kind()),
        Step::Auth(t) => format!("auth:{}", pct(&String::from_utf8_lossy(t))),
        Step::Prove {
            token,
            nonce_from,
            conn_from,
        } => format!(
            "prove:{}:{}:{}",
            pct(&String::from_utf8_lossy(token)),
            nonce_from.map(|n| n.to_string()).unwrap_or_default(),
            conn_from.map(|n| n.to_string()).unwrap_or_default()
        ),
        Step::Conn(n) => format!("conn:{n}"),
        Step::BadMac => "bad-mac".into(),
        Step::Replay => "replay".into(),
        Step::Writes { count, len, imm } => format!(
            "writes:{count}:{}:{}",
            len.map(|l| l.to_string()).unwrap_or_default(),
            imm_arg(*imm)
        ),
        Step::WritesTo {
            addr,
            rkey,
            count,
            len,
            imm,
        } => format!(
            "writes-to:{}:{}:{count}:{}:{}",
            addr.map_or_else(|| "own".to_string(), |a| format!("{a:#x}")),
            rkey.map_or_else(|| "own".to_string(), |k| format!("{k:#x}")),
            len.map(|l| l.to_string()).unwrap_or_default(),
            imm_arg(*imm)
        ),
        Step::Rewrite { count, len } => format!(
            "rewrite:{count}:{}",
            len.map(|l| l.to_string()).unwrap_or_default()
        ),
        Step::Expect(k) => format!("expect:{}", k.join("|")),
        Step::ExpectDisconnect => "expect-disconnect".into(),
        Step::Sleep(d) => format!("sleep:{}", d.as_millis()),
        Step::WaitFile(p) => format!("wait-file:{}", p.display()),
    }
}

pub(crate) fn imm_arg(imm: Imm) -> String {
    match imm {
        Imm::Crc => "crc".to_string(),
        Imm::Bad => "bad".to_string(),
        Imm::Value(v) => format!("{v:x}"),
        Imm::None => "none".to_string(),
    }
}
