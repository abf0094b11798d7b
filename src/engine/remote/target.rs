//! Where the one-command form goes, as scp reads it (`[USER@]HOST:DIR`),
//! and the remote command line: quoting for the remote shell, the ssh
//! command (`-e`, RDMA_XFER_RSH).

use super::RSH_ENV;
use crate::error::XferError;
use crate::proto::{NameRules, validate_path};

/// One `[USER@]HOST:DIR` target as the user wrote it (scp's
/// `[USER@]HOST:PATH`: see `file_name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// What ssh logs in to: `[user@]host` (brackets of an IPv6 literal
    /// dropped).
    pub login: String,
    /// The host alone, as results are labelled.
    pub host: String,
    /// The directory on the host ("" is the login's home, as scp's); with
    /// one file, it may name the file instead (see `file_name`).
    pub dir: String,
}

impl Target {
    /// `[USER@]HOST:DIR` (or `[USER@][IPV6]:DIR`) as a target; None when
    /// `arg` is not of that form: no colon, a slash before the first colon
    /// (a local path such as `./a:b`), or an all-digit part after it (the
    /// direct form's `HOST:PORT`).
    pub fn parse(arg: &str) -> Option<Result<Target, XferError>> {
        let (user, rest) = match arg.split_once('@') {
            Some((u, r)) if !u.contains('/') && !u.contains(':') => (Some(u), r),
            _ => (None, arg),
        };
        let (host, dir) = if let Some(inner) = rest.strip_prefix('[') {
            let (host, after) = inner.split_once(']')?;
            (host, after.strip_prefix(':')?)
        } else {
            // An IPv6 literal without brackets is an address, not a host.
            if rest.parse::<std::net::Ipv6Addr>().is_ok() {
                return None;
            }
            let (host, dir) = rest.split_once(':')?;
            if host.contains('/') {
                return None;
            }
            (host, dir)
        };
        if !dir.is_empty() && dir.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(Self::checked(arg, user, host, dir))
    }

    /// PATH's last component, when scp would read PATH as the one file's
    /// new name if it is no directory there: PATH does not end with `/`,
    /// is not `~` (the remote shell expands it) and its last component is
    /// a name any receiver may accept (not empty, `.` or `..`).
    pub fn file_name(&self) -> Option<&str> {
        if self.dir.ends_with('/') || self.dir == "~" {
            return None;
        }
        let last = self.dir.rsplit('/').next()?;
        validate_path(last, NameRules::ANY_RECEIVER).ok()?;
        Some(last)
    }

    fn checked(arg: &str, user: Option<&str>, host: &str, dir: &str) -> Result<Target, XferError> {
        let bad = |why: &str| Err(XferError::Usage(format!("target {arg:?}: {why}")));
        if host.is_empty() {
            return bad("no host before the `:`");
        }
        // ssh would take a leading '-' as an option (option injection).
        if host.starts_with('-') || user.is_some_and(|u| u.is_empty() || u.starts_with('-')) {
            return bad("a host or user may not start with '-' (or be empty)");
        }
        // Host names, IPv4 and IPv6 literals, portable user names only:
        // ssh configurations expand %h and %r into commands.
        let host_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
        let user_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
        if !host.chars().all(host_ok) || !user.unwrap_or("").chars().all(user_ok) {
            return bad(
                "a host may hold letters, digits, '.', '-', '_' (and ':' in [IPV6]); a user \
                 letters, digits, '.', '-', '_'",
            );
        }
        if dir.contains('\0') || dir.contains('\n') {
            return bad("the directory holds a NUL or newline");
        }
        // `~user` would reach the remote shell quoted, not expanded: a
        // file or directory literally named so in the login's home.
        if dir.starts_with('~') && dir != "~" && !dir.starts_with("~/") {
            return bad("another user's home (~user) is not expanded: give its full path");
        }
        Ok(Target {
            login: match user {
                Some(u) => format!("{u}@{host}"),
                None => host.to_string(),
            },
            host: host.to_string(),
            dir: dir.to_string(),
        })
    }
}

/// A word for the remote shell: quoted, but a leading `~` or `~/` stays
/// outside the quotes so that the remote shell expands it (as scp users
/// expect of `host:~/in`).
pub fn remote_word(word: &str) -> String {
    let quote = |s: &str| match shlex::try_quote(s) {
        Ok(q) => q.into_owned(),
        // Only a NUL fails, which `Target::parse` refuses.
        Err(_) => "''".to_string(),
    };
    if word == "~" {
        return "~".into();
    }
    match word.strip_prefix("~/") {
        Some("") => "~/".into(),
        Some(rest) => format!("~/{}", quote(rest)),
        None => quote(word),
    }
}

/// The remote shell command (`-e/--rsh`, else RDMA_XFER_RSH, else `ssh`),
/// split as a shell would split it.
pub fn rsh_command(option: Option<&str>, env: Option<&str>) -> Result<Vec<String>, XferError> {
    let (text, from) = match (option, env) {
        (Some(o), _) => (o, "--rsh"),
        (None, Some(e)) if !e.trim().is_empty() => (e, RSH_ENV),
        _ => return Ok(vec!["ssh".into()]),
    };
    match shlex::split(text) {
        Some(words) if !words.is_empty() => Ok(words),
        _ => Err(XferError::Usage(format!(
            "{from} {text:?} is not a command (unbalanced quotes, or empty)"
        ))),
    }
}
