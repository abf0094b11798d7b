//! The secret that keys the records of kept partial files: 32 random bytes
//! in `.rdma-xfer-key` at the top of the output directory, created by the
//! receiver the first time a resumable file is written there. Without it
//! nobody can write a record the receiver accepts, so a record forged by
//! hand (to make the receiver continue, truncate and write a file of its
//! choice) is as good as none.

use crate::sys::dirfd::{DirFd, OwnFileError};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::PermissionsExt;

/// The key file's name: under the reserved prefix, so that no sender can
/// send, replace or read it, in none of the forms the sweep removes.
pub(crate) const KEY_NAME: &str = ".rdma-xfer-key";

/// The secret's length in bytes.
const KEY_LEN: usize = 32;

/// The length of a tag (an HMAC-SHA256).
pub(crate) const TAG_LEN: usize = 32;

type HmacSha256 = Hmac<Sha256>;

/// The key of the records under one output directory, ready to tag.
#[derive(Clone)]
pub(crate) struct SidecarKey {
    keyed: HmacSha256,
}

impl std::fmt::Debug for SidecarKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SidecarKey(<redacted>)")
    }
}

/// Why the key cannot be had.
#[derive(Debug, thiserror::Error)]
pub(crate) enum KeyError {
    #[error("the key of partial-file records is not used: {0}")]
    Foreign(String),
    #[error(
        "the key of partial-file records {KEY_NAME} is open to other users (mode {0:o}): not used"
    )]
    Exposed(u32),
    #[error("the key of partial-file records {KEY_NAME} is not {KEY_LEN} bytes long: not used")]
    Length,
    #[error("cannot read or create the key of partial-file records {KEY_NAME}: {0}")]
    Io(#[from] std::io::Error),
    #[error("no random bytes for the key of partial-file records: {0}")]
    Random(String),
}

impl SidecarKey {
    fn from_secret(secret: &[u8; KEY_LEN]) -> Self {
        Self {
            // Any length is a valid HMAC key: the fallback never runs.
            keyed: <HmacSha256 as KeyInit>::new_from_slice(secret)
                .unwrap_or_else(|_| <HmacSha256 as KeyInit>::new(&Default::default())),
        }
    }

    /// A key for tests, not from a file.
    #[cfg(test)]
    pub fn for_tests(byte: u8) -> Self {
        Self::from_secret(&[byte; KEY_LEN])
    }

    /// The tag of `parts`, in order.
    pub fn tag(&self, parts: &[&[u8]]) -> [u8; TAG_LEN] {
        self.mac_of(parts).finalize().into_bytes().into()
    }

    /// Whether `tag` is the tag of `parts` (in constant time).
    pub fn verify(&self, parts: &[&[u8]], tag: &[u8]) -> bool {
        self.mac_of(parts).verify_slice(tag).is_ok()
    }

    /// The keyed MAC with `parts` absorbed, to go on with.
    pub fn mac_of(&self, parts: &[&[u8]]) -> HmacSha256 {
        let mut m = self.keyed.clone();
        for p in parts {
            m.update(p);
        }
        m
    }

    /// The key of the directory `root`, if it has one. A key file that is
    /// not the receiver's own (see `DirFd::open_own_file`), open to other
    /// users, or not 32 bytes long is refused, never replaced.
    pub fn load(root: &DirFd) -> Result<Option<Self>, KeyError> {
        let file = match root.open_own_file(KEY_NAME) {
            Ok(f) => f,
            Err(OwnFileError::Io(e)) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(None);
            }
            Err(OwnFileError::Io(e)) => return Err(KeyError::Io(e)),
            Err(e @ OwnFileError::Foreign { .. }) => return Err(KeyError::Foreign(e.to_string())),
        };
        let mode = file.metadata()?.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Exposed(mode));
        }
        let mut secret = Vec::with_capacity(KEY_LEN + 1);
        file.take(KEY_LEN as u64 + 1).read_to_end(&mut secret)?;
        let key = <[u8; KEY_LEN]>::try_from(&secret[..])
            .map(|s| Self::from_secret(&s))
            .map_err(|_| KeyError::Length);
        wipe(&mut secret);
        key.map(Some)
    }

    /// The key of the directory `root`, created if it has none: 32 random
    /// bytes written (mode 0600, `O_EXCL`) to a temporary file that is
    /// made durable, then renamed to the key's name unless another session
    /// or receiver created it meanwhile (then that one is used).
    pub fn get_or_create(root: &DirFd) -> Result<Self, KeyError> {
        if let Some(key) = Self::load(root)? {
            return Ok(key);
        }
        let mut secret = [0u8; KEY_LEN];
        getrandom::fill(&mut secret).map_err(|e| KeyError::Random(e.to_string()))?;
        let created = Self::create(root, &secret);
        wipe(&mut secret);
        match created {
            Ok(key) => Ok(key),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                Self::load(root)?.ok_or(KeyError::Length)
            }
            Err(e) => Err(KeyError::Io(e)),
        }
    }

    fn create(root: &DirFd, secret: &[u8; KEY_LEN]) -> std::io::Result<Self> {
        let temp = super::super::temp_file::temp_name();
        // Marked before it exists: the sweep never sees it unmarked.
        let _in_use = super::TempInUse::new(root, &temp)?;
        let written = root.create_new(&temp, 0o600).and_then(|mut f| {
            f.write_all(secret)?;
            f.sync_all()?;
            root.rename(&temp, KEY_NAME, true)
        });
        if let Err(e) = written {
            let _ = root.unlink(&temp);
            return Err(e);
        }
        root.sync()?;
        Ok(Self::from_secret(secret))
    }
}

/// Best effort; black_box keeps the stores from being elided.
fn wipe(secret: &mut [u8]) {
    secret.fill(0);
    std::hint::black_box(&secret);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_is_created_once_private_and_refused_when_not_the_receivers_own() {
        let tmp = tempfile::tempdir().unwrap();
        let root = DirFd::open(tmp.path()).unwrap();
        let path = tmp.path().join(KEY_NAME);
        assert!(SidecarKey::load(&root).unwrap().is_none());
        let key = SidecarKey::get_or_create(&root).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.len(), KEY_LEN as u64);
        // Nothing else left behind.
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 1);
        // The same key, loaded or asked for again.
        let tag = key.tag(&[b"x"]);
        for again in [
            SidecarKey::load(&root).unwrap().unwrap(),
            SidecarKey::get_or_create(&root).unwrap(),
        ] {
            assert!(again.verify(&[b"x"], &tag));
        }
        // Another directory, another key.
        let other = tempfile::tempdir().unwrap();
        let other = SidecarKey::get_or_create(&DirFd::open(other.path()).unwrap()).unwrap();
        assert!(!other.verify(&[b"x"], &tag));
        // Open to others: refused, left as it is.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            SidecarKey::get_or_create(&root),
            Err(KeyError::Exposed(0o644))
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        // A second link (a planted hard link): refused.
        std::fs::hard_link(&path, tmp.path().join("second")).unwrap();
        let e = SidecarKey::get_or_create(&root).unwrap_err();
        assert!(e.to_string().contains("2 hard links"), "{e}");
        std::fs::remove_file(tmp.path().join("second")).unwrap();
        // A symbolic link: refused, never followed nor replaced.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::rename(&path, &elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, &path).unwrap();
        let e = SidecarKey::get_or_create(&root).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(std::fs::symlink_metadata(&path).unwrap().is_symlink());
        std::fs::remove_file(&path).unwrap();
        std::fs::rename(&elsewhere, &path).unwrap();
        // Another length: refused, never rewritten.
        std::fs::write(&path, b"short").unwrap();
        assert!(matches!(
            SidecarKey::get_or_create(&root),
            Err(KeyError::Length)
        ));
        assert_eq!(std::fs::read(&path).unwrap(), b"short");
        if rustix::process::geteuid().is_root() {
            std::fs::write(&path, [7u8; KEY_LEN]).unwrap();
            std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
            let e = SidecarKey::get_or_create(&root).unwrap_err();
            assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        } else {
            eprintln!("not root: the case of a key of another owner is skipped (chown needs root)");
        }
    }
}
