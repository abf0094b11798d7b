//! Validation of received file names: the receiver creates the file inside its
//! target directory, so a name must never be able to address anything else.

use thiserror::Error;

/// Common filesystem limit (NAME_MAX) for one path component, in bytes.
pub const MAX_NAME_BYTES: usize = 255;

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NameError {
    #[error("file name is empty")]
    Empty,
    #[error("file name may not be \".\" or \"..\"")]
    DotName,
    #[error("file name contains a path separator")]
    PathSeparator,
    #[error("file name contains a NUL byte")]
    Nul,
    #[error("file name contains control character U+{code:04X}")]
    Control { code: u32 },
    #[error("file name is {len} bytes long; the limit is {max} bytes", max = MAX_NAME_BYTES)]
    TooLong { len: usize },
}

/// Accepts only a plain single file name (no directories, no control characters).
pub fn validate_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong { len: name.len() });
    }
    if name == "." || name == ".." {
        return Err(NameError::DotName);
    }
    // Backslash too: the file may later be copied to a system that treats it as a separator.
    if name.contains(['/', '\\']) {
        return Err(NameError::PathSeparator);
    }
    if name.contains('\0') {
        return Err(NameError::Nul);
    }
    // Control characters (incl. newline, DEL, C1) would corrupt logs and terminals.
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(NameError::Control { code: c.into() });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names() {
        for ok in [
            "a",
            "file.bin",
            ".bashrc",
            "...",
            "..x",
            "x..",
            "with space.txt",
            " leading and trailing ",
            "ünïcødé 文件 🚀.tar.gz",
            "-rf",
            "a:b",
            "*?",
        ] {
            assert_eq!(validate_name(ok), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn rejects_special_names() {
        assert_eq!(validate_name(""), Err(NameError::Empty));
        assert_eq!(validate_name("."), Err(NameError::DotName));
        assert_eq!(validate_name(".."), Err(NameError::DotName));
        for bad in [
            "../x",
            "/etc/passwd",
            "a/b",
            "a/",
            "/",
            "..\\x",
            "a\\b",
            "\\",
        ] {
            assert_eq!(validate_name(bad), Err(NameError::PathSeparator), "{bad:?}");
        }
        assert_eq!(validate_name("a\0b"), Err(NameError::Nul));
        assert_eq!(validate_name("\0"), Err(NameError::Nul));
        for (bad, code) in [
            ("a\nb", 0x0a),
            ("\r", 0x0d),
            ("tab\there", 0x09),
            ("esc\u{1b}[31m", 0x1b),
            ("del\u{7f}", 0x7f),
            ("c1\u{85}", 0x85),
            ("c1\u{9f}", 0x9f),
        ] {
            assert_eq!(
                validate_name(bad),
                Err(NameError::Control { code }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn length_limit_is_in_bytes() {
        assert_eq!(validate_name(&"a".repeat(255)), Ok(()));
        assert_eq!(
            validate_name(&"a".repeat(256)),
            Err(NameError::TooLong { len: 256 })
        );
        assert_eq!(
            validate_name(&"a".repeat(300)),
            Err(NameError::TooLong { len: 300 })
        );
        // 127 two-byte chars = 254 bytes; one more 2-byte char crosses the limit.
        let e254 = "é".repeat(127);
        assert_eq!(validate_name(&e254), Ok(()));
        assert_eq!(validate_name(&format!("{e254}a")), Ok(()));
        assert_eq!(
            validate_name(&format!("{e254}é")),
            Err(NameError::TooLong { len: 256 })
        );
        // 85 chars but 255 bytes (3-byte chars) is fine; 86 chars is not.
        assert_eq!(validate_name(&"文".repeat(85)), Ok(()));
        assert_eq!(
            validate_name(&"文".repeat(86)),
            Err(NameError::TooLong { len: 258 })
        );
    }

    #[test]
    fn messages_are_readable() {
        assert_eq!(
            NameError::PathSeparator.to_string(),
            "file name contains a path separator"
        );
        assert_eq!(
            NameError::Control { code: 10 }.to_string(),
            "file name contains control character U+000A"
        );
        assert_eq!(
            NameError::TooLong { len: 300 }.to_string(),
            "file name is 300 bytes long; the limit is 255 bytes"
        );
    }
}
