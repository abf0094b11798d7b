//! Errors of a transfer and the exit codes they map to (documented in
//! README and `--help`).
#![forbid(unsafe_code)]

use crate::proto::{ChannelError, ProtocolError, RejectCode, Role, WireError, escaped};
use crate::sys::SysError;

/// Process exit codes shared by both tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum ExitCode {
    Ok = 0,
    Other = 1,
    Usage = 2,
    CannotConnect = 3,
    Rejected = 4,
    Integrity = 5,
    Io = 6,
    TimeoutOrPeerLost = 7,
    NoDevice = 8,
}

impl ExitCode {
    /// A short name of the class, for `--json` results ("ok", "rejected"...).
    pub fn as_str(self) -> &'static str {
        match self {
            ExitCode::Ok => "ok",
            ExitCode::Other => "error",
            ExitCode::Usage => "usage",
            ExitCode::CannotConnect => "cannot_connect",
            ExitCode::Rejected => "rejected",
            ExitCode::Integrity => "integrity",
            ExitCode::Io => "io",
            ExitCode::TimeoutOrPeerLost => "timeout_or_peer_lost",
            ExitCode::NoDevice => "no_device",
        }
    }
}

/// Exit-code table for `--help` of both binaries (a macro so that it can be
/// `concat!`ed with each tool's examples).
#[macro_export]
macro_rules! exit_codes_help {
    () => {
        "Exit codes:
  0  all files acknowledged OK
  1  other error
  2  usage error (every problem found before connecting is reported)
  3  cannot reach the receiver (nobody listening, unreachable): worth retrying
  4  rejected by the peer (name, exists, size, busy, version, authentication)
  5  integrity failure (checksum mismatch)
  6  I/O error (local, or reported by the peer)
  7  timeout or peer lost during the transfer
  8  no usable RDMA device here: retrying will not help"
    };
}

/// Problems found before connecting, gathered so that one run reports
/// them all (exit 2).
#[derive(Default)]
pub struct Problems(Vec<String>);

impl Problems {
    /// The value, or None with the error's message(s) noted.
    pub fn check<T>(&mut self, result: Result<T, XferError>) -> Option<T> {
        match result {
            Ok(v) => Some(v),
            Err(XferError::Problems(all)) => {
                self.0.extend(all);
                None
            }
            Err(e) => {
                self.0.push(e.to_string());
                None
            }
        }
    }

    pub fn add(&mut self, problem: impl Into<String>) {
        self.0.push(problem.into());
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// One usage error, or all of them.
    pub fn into_result(mut self) -> Result<(), XferError> {
        match self.0.len() {
            0 => Ok(()),
            1 => Err(XferError::Usage(self.0.remove(0))),
            _ => Err(XferError::Problems(self.0)),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum XferError {
    #[error("{0}")]
    Usage(String),
    /// Several problems found before connecting (each a usage error),
    /// reported together so that one run shows them all.
    #[error("{}", .0.join("; "))]
    Problems(Vec<String>),
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: SysError },
    #[error("{0}")]
    Sys(#[from] SysError),
    /// A refusal; `code` is None for an ACK that says "rejected" without
    /// a REJECT's code.
    #[error("rejected by the receiver ({}): {}", code.map_or("rejected", RejectCode::as_str), escaped(reason))]
    Rejected {
        code: Option<RejectCode>,
        reason: String,
    },
    /// The shared-secret check failed (the message starts with
    /// "authentication failed").
    #[error("{}", escaped(.0))]
    Auth(String),
    #[error("integrity check failed: {}", escaped(.0))]
    Integrity(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("the receiver reported an I/O error: {}", escaped(.0))]
    PeerIo(String),
    /// The peer broke the session protocol, as the state machine found;
    /// `context` says what was being handled.
    #[error("protocol error: {}{source}", context.as_ref().map(|c| format!("{c}: ")).unwrap_or_default())]
    Protocol {
        /// What was being handled ("HELLO not allowed here"), if worth saying.
        context: Option<String>,
        /// What the state machine found.
        source: ProtocolError,
    },
    /// A sealed control message from the peer failed its check (forged,
    /// replayed, reordered, truncated): the control channel was tampered
    /// with, so the session ends as an authentication failure (exit 4).
    #[error("authentication failed: a control message from the {from} was rejected: {source}")]
    Forged {
        /// The peer that sent it.
        from: Role,
        /// What the check found.
        source: ChannelError,
    },
    /// The peer sent a control message that does not decode.
    #[error("protocol error: malformed message from the {from}: {source}")]
    Malformed {
        /// The peer that sent it.
        from: Role,
        /// What the decoder found.
        source: WireError,
    },
    /// The peer ended the session reporting a protocol error of ours.
    #[error("protocol error: the {from} reports: {}", escaped(reason))]
    PeerReported {
        /// The peer that sent it.
        from: Role,
        /// The reason it gave.
        reason: String,
    },
    /// An invariant of this program failed (a bug, never the peer's doing).
    #[error("internal error: {0}")]
    Internal(String),
    #[error("peer lost: {0}")]
    PeerLost(String),
    /// Files failed while the session went on, each reported as it failed;
    /// the first decides the exit status.
    #[error("{first}")]
    FilesFailed {
        first: Box<XferError>,
        /// How many failed, of how many files.
        failed: u64,
        files: u64,
    },
    /// A target of the one-command form (`sender FILE HOST:DIR`) failed
    /// before or around its session: ssh, the remote receiver, or what it
    /// reported; `code` is the class of what went wrong there.
    #[error("{host}: {message}")]
    Remote {
        host: String,
        code: ExitCode,
        message: String,
    },
    /// Several targets, some failed (each reported as it failed); the
    /// exit status is the worst (highest) of theirs.
    #[error("{failed} of {targets} targets failed (worst: {worst})")]
    TargetsFailed {
        worst: Box<XferError>,
        failed: usize,
        targets: usize,
    },
}

impl From<ProtocolError> for XferError {
    fn from(source: ProtocolError) -> Self {
        XferError::Protocol {
            context: None,
            source,
        }
    }
}

impl XferError {
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        XferError::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether trying again later may succeed: the peer could not be
    /// reached, went away, stopped answering or was busy. Other refusals,
    /// integrity failures, I/O errors, local set-up failures (no RDMA
    /// device, a memlock limit, a permission) are not.
    pub fn is_transient(&self) -> bool {
        match self {
            XferError::Connect { source, .. } => match source {
                SysError::Timeout { .. } | SysError::Disconnected => true,
                SysError::UnexpectedEvent { got, .. } => got.is_unreachable(),
                SysError::Call { source, .. } => matches!(
                    source.raw_os_error(),
                    Some(
                        libc::EAGAIN
                            | libc::ENETUNREACH
                            | libc::EHOSTUNREACH
                            | libc::ENETDOWN
                            | libc::ETIMEDOUT
                            | libc::ECONNREFUSED
                            | libc::ECONNRESET
                    )
                ),
                _ => false,
            },
            XferError::Rejected { code, .. } => *code == Some(RejectCode::Busy),
            XferError::PeerLost(_) => true,
            XferError::FilesFailed { first, .. } => first.is_transient(),
            XferError::Remote { code, .. } => {
                matches!(code, ExitCode::CannotConnect | ExitCode::TimeoutOrPeerLost)
            }
            XferError::Sys(v) => matches!(
                v,
                SysError::Timeout { .. }
                    | SysError::Disconnected
                    | SysError::WorkRequest {
                        peer_lost: true,
                        ..
                    }
            ),
            _ => false,
        }
    }

    /// A refusal's reason as one stable word for scripts (`--json`'s
    /// `reason_code`): the REJECT's code ("exists", "busy", "too-large",
    /// "bad-name", "version", "auth"...), "rejected" for a refusal without
    /// one; None for anything that is not a refusal.
    pub fn reason_code(&self) -> Option<&'static str> {
        match self {
            XferError::Rejected { code, .. } => Some(code.map_or("rejected", RejectCode::slug)),
            XferError::Auth(_) | XferError::Forged { .. } => Some(RejectCode::Auth.slug()),
            XferError::FilesFailed { first, .. } => first.reason_code(),
            _ => None,
        }
    }

    pub fn exit_code(&self) -> ExitCode {
        match self {
            XferError::Usage(_) | XferError::Problems(_) => ExitCode::Usage,
            XferError::Connect { .. } => ExitCode::CannotConnect,
            XferError::Sys(v) => match v {
                SysError::NoDevice { .. } | SysError::NotRdmaAddress(_) => ExitCode::NoDevice,
                SysError::Timeout { .. } | SysError::Disconnected => ExitCode::TimeoutOrPeerLost,
                SysError::WorkRequest {
                    peer_lost: true, ..
                } => ExitCode::TimeoutOrPeerLost,
                _ => ExitCode::Other,
            },
            XferError::Rejected { .. } | XferError::Auth(_) | XferError::Forged { .. } => {
                ExitCode::Rejected
            }
            XferError::Integrity(_) => ExitCode::Integrity,
            XferError::Io { .. } | XferError::PeerIo(_) => ExitCode::Io,
            XferError::Protocol { .. }
            | XferError::Malformed { .. }
            | XferError::PeerReported { .. }
            | XferError::Internal(_) => ExitCode::Other,
            XferError::PeerLost(_) => ExitCode::TimeoutOrPeerLost,
            XferError::FilesFailed { first, .. } => first.exit_code(),
            XferError::Remote { code, .. } => *code,
            XferError::TargetsFailed { worst, .. } => worst.exit_code(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn what_the_peer_said_is_shown_escaped() {
        let evil = "ok\x1b[2J\nreceiver: fake line";
        let shown = [
            XferError::Rejected {
                code: Some(RejectCode::BadName),
                reason: evil.into(),
            },
            XferError::Auth(evil.into()),
            XferError::Integrity(evil.into()),
            XferError::PeerIo(evil.into()),
            XferError::PeerReported {
                from: Role::Receiver,
                reason: evil.into(),
            },
            XferError::from(ProtocolError::AuthFailed {
                reason: evil.into(),
            }),
        ]
        .map(|e| e.to_string());
        for s in shown {
            assert!(!s.chars().any(char::is_control), "{s:?}");
            assert!(s.contains("ok\\u{1b}[2J\\nreceiver: fake line"), "{s:?}");
        }
    }

    #[test]
    fn only_a_lost_unreachable_or_busy_peer_is_worth_retrying() {
        let transient = [
            XferError::PeerLost("gone".into()),
            XferError::Connect {
                addr: "a".into(),
                source: SysError::Timeout {
                    what: "x".into(),
                    after: Duration::from_secs(1),
                },
            },
            XferError::Sys(SysError::Disconnected),
            XferError::Connect {
                addr: "a".into(),
                source: SysError::UnexpectedEvent {
                    want: "ESTABLISHED",
                    got: crate::sys::rdma::CmEventKind::Rejected,
                    status: 28,
                },
            },
            XferError::Connect {
                addr: "a".into(),
                source: SysError::Call {
                    call: "rdma_resolve_addr",
                    source: std::io::Error::from_raw_os_error(libc::ENETUNREACH),
                },
            },
            XferError::Rejected {
                code: Some(RejectCode::Busy),
                reason: "at --max-sessions".into(),
            },
        ];
        for e in transient {
            assert!(e.is_transient(), "{e}");
        }
        let permanent = [
            XferError::Rejected {
                code: Some(RejectCode::Exists),
                reason: "r".into(),
            },
            XferError::Auth("x".into()),
            XferError::Integrity("x".into()),
            XferError::PeerIo("disk full".into()),
            XferError::Usage("x".into()),
            XferError::Sys(SysError::NoDevice { cause: "x".into() }),
            XferError::Connect {
                addr: "a".into(),
                source: SysError::Invalid("cannot resolve host name".into()),
            },
            XferError::Connect {
                addr: "a".into(),
                source: SysError::Call {
                    call: "rdma_create_id",
                    source: std::io::Error::from_raw_os_error(libc::EPERM),
                },
            },
            XferError::Connect {
                addr: "a".into(),
                source: SysError::UnexpectedEvent {
                    want: "ESTABLISHED",
                    got: crate::sys::rdma::CmEventKind::DeviceRemoval,
                    status: 0,
                },
            },
            XferError::Sys(SysError::Memlock {
                needed: 1,
                what: None,
                pinned: 0,
                limit: 0,
                hard: 0,
            }),
        ];
        for e in permanent {
            assert!(!e.is_transient(), "{e}");
        }
    }

    #[test]
    fn exit_codes_are_distinct_per_class() {
        let cases: Vec<(XferError, u8)> = vec![
            (XferError::Usage("x".into()), 2),
            (XferError::Sys(SysError::NoDevice { cause: "x".into() }), 8),
            (XferError::Sys(SysError::NotRdmaAddress("x".into())), 8),
            (XferError::Problems(vec!["a".into(), "b".into()]), 2),
            (
                XferError::Connect {
                    addr: "a".into(),
                    source: SysError::Disconnected,
                },
                3,
            ),
            (
                XferError::Rejected {
                    code: Some(RejectCode::Exists),
                    reason: "r".into(),
                },
                4,
            ),
            (XferError::Auth("authentication failed: x".into()), 4),
            (
                XferError::Forged {
                    from: Role::Receiver,
                    source: ChannelError::Replayed {
                        got: 1,
                        expected: 2,
                    },
                },
                4,
            ),
            (XferError::Integrity("c".into()), 5),
            (XferError::io("w", std::io::Error::other("x")), 6),
            (XferError::PeerIo("disk full".into()), 6),
            (
                XferError::Sys(SysError::Timeout {
                    what: "ACK".into(),
                    after: Duration::from_secs(1),
                }),
                7,
            ),
            (XferError::PeerLost("gone".into()), 7),
            (XferError::from(ProtocolError::ZeroCredit), 1),
            (
                XferError::Malformed {
                    from: Role::Sender,
                    source: WireError::BadMagic(1),
                },
                1,
            ),
            (
                XferError::PeerReported {
                    from: Role::Receiver,
                    reason: "x".into(),
                },
                1,
            ),
            (XferError::Internal("bug".into()), 1),
            // A memlock limit too low for the buffers (README: exit 1).
            (
                XferError::Sys(SysError::Memlock {
                    needed: 16 << 20,
                    what: None,
                    pinned: 0,
                    limit: 8 << 20,
                    hard: 8 << 20,
                }),
                1,
            ),
        ];
        for (err, code) in cases {
            assert_eq!(err.exit_code() as u8, code, "{err}");
        }
        let in_context = XferError::Protocol {
            context: Some("HELLO not allowed here".into()),
            source: ProtocolError::ZeroCredit,
        };
        assert_eq!(
            in_context.to_string(),
            "protocol error: HELLO not allowed here: CREDIT of 0 is invalid"
        );
        assert_eq!(
            XferError::from(ProtocolError::ZeroCredit).to_string(),
            "protocol error: CREDIT of 0 is invalid"
        );
    }
}
