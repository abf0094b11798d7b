//! Validation of received file names: the receiver creates the file inside its
//! target directory, so a name must never be able to address anything else.
//! A relative path (for trees) is a sequence of such names joined by `/`.

use std::fmt;
use thiserror::Error;

/// Shows a string that came from the peer or the disk (a name, a reason)
/// with control characters and the invisible characters of
/// [`is_invisible`] escaped (`\u{1b}`, `\n`, `\u{202e}`), so that it
/// cannot move the cursor, recolour a terminal, forge a log line, reorder
/// what is shown or hide part of it. Everything else, backslashes
/// included, is shown as it is.
pub fn escaped(s: &str) -> Escaped<'_> {
    Escaped(s)
}

/// See [`escaped`].
#[derive(Debug, Clone, Copy)]
pub struct Escaped<'a>(&'a str);

/// Invisible characters that change how the text around them is shown or
/// read: bidirectional controls (a name that displays as `txt.exe`
/// backwards), zero-width characters (two names that look the same) and
/// the line and paragraph separators (a line break a terminal may honour).
/// Never accepted in a name, always escaped when shown.
pub fn is_invisible(c: char) -> bool {
    matches!(
        c,
        '\u{061c}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'
            | '\u{2066}'..='\u{2069}'
            | '\u{feff}'
    )
}

impl fmt::Display for Escaped<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use fmt::Write;
        for c in self.0.chars() {
            if c.is_control() || is_invisible(c) {
                for e in c.escape_default() {
                    f.write_char(e)?;
                }
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// Common filesystem limit (NAME_MAX) for one path component, in bytes.
pub const MAX_NAME_BYTES: usize = 255;
/// Longest relative path accepted (PATH_MAX minus the terminating NUL).
pub const MAX_PATH_BYTES: usize = 4095;
/// Deepest relative path accepted, in components.
pub const MAX_PATH_DEPTH: usize = 256;

/// Why a single file name (one path component) was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum NameError {
    /// The name is empty.
    #[error("file name is empty")]
    Empty,
    /// `.` or `..`, which name a directory, not a new file.
    #[error("file name may not be \".\" or \"..\"")]
    DotName,
    /// A `/` or `\\` (the latter is a separator elsewhere).
    #[error("file name contains a path separator")]
    PathSeparator,
    /// A NUL byte, which no Unix file name can hold.
    #[error("file name contains a NUL byte")]
    Nul,
    /// A control character, which would corrupt logs and terminals.
    #[error("file name contains control character U+{code:04X}")]
    Control {
        /// The character's code point.
        code: u32,
    },
    /// An invisible character of [`is_invisible`]: a name that shows as
    /// something else.
    #[error(
        "file name contains U+{code:04X}, an invisible character (bidirectional control, \
         zero-width character or line separator) that changes how the name is shown"
    )]
    Invisible {
        /// The character's code point.
        code: u32,
    },
    /// Starts with [`RESERVED_PREFIX`] in any ASCII case: the receiver's
    /// own partial and temporary files are named so, and no received entry
    /// may pose as one (not even on a case-insensitive file system).
    #[error(
        "names starting with {RESERVED_PREFIX:?} are reserved for the receiver's partial and temporary files"
    )]
    Reserved,
    /// Starts with `.` while [`NameRules::allow_dotfiles`] is off: a
    /// hidden file (`.bashrc`, `.ssh/authorized_keys`) configures whoever
    /// uses the directory, and goes unseen by `ls`.
    #[error("names starting with '.' are refused; the receiver allows them with --allow-dotfiles")]
    Hidden,
    /// Longer than [`MAX_NAME_BYTES`].
    #[error("file name is {len} bytes long; the limit is {max} bytes", max = MAX_NAME_BYTES)]
    TooLong {
        /// The name's length in bytes.
        len: usize,
    },
}

/// Why a relative path was refused.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PathError {
    /// Longer than [`MAX_PATH_BYTES`].
    #[error("path is {len} bytes long; the limit is {max} bytes", max = MAX_PATH_BYTES)]
    TooLong {
        /// The path's length in bytes.
        len: usize,
    },
    /// More than [`MAX_PATH_DEPTH`] components.
    #[error("path has more than {max} components", max = MAX_PATH_DEPTH)]
    TooDeep,
    /// Starts with `/`.
    #[error("path must be relative (it starts with \"/\")")]
    Absolute,
    /// Component `index` (0-based) is not a valid name; `a//b` and a
    /// trailing `/` show up as an empty component.
    #[error("path component {} {component:?}: {error}", .index + 1)]
    Component {
        /// The component's index (0-based).
        index: usize,
        /// The component (at most its first 64 characters).
        component: String,
        /// Why it is not a valid name.
        error: NameError,
    },
}

/// What the receiver's options change in the names it accepts; the rest
/// of [`validate_name`] always holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NameRules {
    /// Components starting with `.` are accepted (`receiver
    /// --allow-dotfiles`); refused by default.
    pub allow_dotfiles: bool,
}

impl NameRules {
    /// The receiver's default: no dotfiles.
    pub const DEFAULT: NameRules = NameRules {
        allow_dotfiles: false,
    };
    /// What some receiver may accept: the sender's own check, which
    /// leaves the options' decisions to the receiver.
    pub const ANY_RECEIVER: NameRules = NameRules {
        allow_dotfiles: true,
    };
}

/// Accepts a relative path of plain names joined by `/`: no empty, `.` or
/// `..` component, no leading or trailing `/`, no backslash, NUL, control
/// or invisible characters, no dotfile unless `rules` allow them, each
/// component at most 255 bytes, the whole at most 4095.
/// Such a path can only address something below the directory it is
/// resolved in (given that no component there is a symbolic link, which the
/// receiver checks as it opens each one).
pub fn validate_path(path: &str, rules: NameRules) -> Result<(), PathError> {
    if path.len() > MAX_PATH_BYTES {
        return Err(PathError::TooLong { len: path.len() });
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute);
    }
    for (index, component) in path.split('/').enumerate() {
        if index >= MAX_PATH_DEPTH {
            return Err(PathError::TooDeep);
        }
        validate_name(component, rules).map_err(|error| PathError::Component {
            index,
            component: component.chars().take(64).collect(),
            error,
        })?;
    }
    Ok(())
}

/// The prefix of the receiver's own hidden files (partial files kept for
/// `--resume`, their records, temporary files): never a received name.
pub const RESERVED_PREFIX: &str = ".rdma-xfer-";

/// Whether `name` starts with [`RESERVED_PREFIX`], in any ASCII case.
fn is_reserved(name: &str) -> bool {
    name.as_bytes()
        .get(..RESERVED_PREFIX.len())
        .is_some_and(|start| start.eq_ignore_ascii_case(RESERVED_PREFIX.as_bytes()))
}

/// Accepts only a plain single file name (no directories, no control or
/// invisible characters, not one of the receiver's own hidden names, no
/// dotfile unless `rules` allow them).
pub fn validate_name(name: &str, rules: NameRules) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(NameError::TooLong { len: name.len() });
    }
    if name == "." || name == ".." {
        return Err(NameError::DotName);
    }
    if is_reserved(name) {
        return Err(NameError::Reserved);
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
    if let Some(c) = name.chars().find(|&c| is_invisible(c)) {
        return Err(NameError::Invisible { code: c.into() });
    }
    // Last: a name that is wrong anyway says its worse fault.
    if name.starts_with('.') && !rules.allow_dotfiles {
        return Err(NameError::Hidden);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rules without the options' decisions (dotfiles allowed).
    const ANY: NameRules = NameRules::ANY_RECEIVER;

    #[test]
    fn peer_text_is_shown_with_controls_escaped() {
        let show = |s: &str| escaped(s).to_string();
        assert_eq!(show("plain name.txt"), "plain name.txt");
        assert_eq!(show("ünïcødé 文件"), "ünïcødé 文件");
        assert_eq!(show("back\\slash"), "back\\slash");
        assert_eq!(show("esc\x1b[31mred"), "esc\\u{1b}[31mred");
        assert_eq!(show("line\nforged: ok"), "line\\nforged: ok");
        assert_eq!(
            show("cr\rtab\tnul\0del\x7f"),
            "cr\\rtab\\tnul\\u{0}del\\u{7f}"
        );
        assert_eq!(show("c1\u{85}\u{9b}"), "c1\\u{85}\\u{9b}");
        assert_eq!(show("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
        // Whatever the input, nothing invisible or controlling is left.
        let all: String = (0u32..0x3000).filter_map(char::from_u32).collect();
        assert!(
            !show(&all)
                .chars()
                .any(|c| c.is_control() || is_invisible(c))
        );
    }

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
            assert_eq!(validate_name(ok, ANY), Ok(()), "{ok:?}");
        }
    }

    #[test]
    fn rejects_special_names() {
        assert_eq!(validate_name("", ANY), Err(NameError::Empty));
        assert_eq!(validate_name(".", ANY), Err(NameError::DotName));
        assert_eq!(validate_name("..", ANY), Err(NameError::DotName));
        // The receiver's own hidden files cannot be sent (nor then swept).
        for own in [
            ".rdma-xfer-partial-00ab",
            ".rdma-xfer-1-2-3.part",
            ".rdma-xfer-key",
        ] {
            assert_eq!(validate_name(own, ANY), Err(NameError::Reserved));
            assert!(validate_path(&format!("d/{own}"), ANY).is_err());
        }
        assert!(validate_name(".rdma-xfer", ANY).is_ok());
        assert!(validate_name("x.rdma-xfer-partial-1", ANY).is_ok());
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
            assert_eq!(
                validate_name(bad, ANY),
                Err(NameError::PathSeparator),
                "{bad:?}"
            );
        }
        assert_eq!(validate_name("a\0b", ANY), Err(NameError::Nul));
        assert_eq!(validate_name("\0", ANY), Err(NameError::Nul));
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
                validate_name(bad, ANY),
                Err(NameError::Control { code }),
                "{bad:?}"
            );
        }
    }

    /// Dotfiles only with --allow-dotfiles, in any component, with the
    /// reason the sender is shown; "." and ".." and the reserved prefix
    /// whatever the rules.
    #[test]
    fn dotfiles_need_the_receivers_consent() {
        let strict = NameRules::DEFAULT;
        for hidden in [".bashrc", ".ssh", "...", "..x", ". "] {
            assert_eq!(
                validate_name(hidden, strict),
                Err(NameError::Hidden),
                "{hidden:?}"
            );
            assert_eq!(validate_name(hidden, ANY), Ok(()), "{hidden:?}");
        }
        for plain in ["x.bashrc", "a.", "x..", "dir"] {
            assert_eq!(validate_name(plain, strict), Ok(()), "{plain:?}");
        }
        assert_eq!(
            validate_path("dir/.ssh/authorized_keys", strict),
            Err(PathError::Component {
                index: 1,
                component: ".ssh".into(),
                error: NameError::Hidden
            })
        );
        assert_eq!(validate_path("dir/.ssh/authorized_keys", ANY), Ok(()));
        assert_eq!(
            validate_path(".bashrc", strict).unwrap_err().to_string(),
            "path component 1 \".bashrc\": names starting with '.' are refused; the receiver \
             allows them with --allow-dotfiles"
        );
        // Worse faults first, whatever the rules.
        assert_eq!(validate_name("..", strict), Err(NameError::DotName));
        assert_eq!(
            validate_name(".rdma-xfer-1.part", strict),
            Err(NameError::Reserved)
        );
        assert_eq!(
            validate_name(".a\nb", strict),
            Err(NameError::Control { code: 10 })
        );
    }

    /// The reserved prefix in any ASCII case (a case-insensitive file
    /// system would make `.RDMA-XFER-x` the receiver's own file).
    #[test]
    fn reserved_prefix_in_any_case() {
        for own in [".RDMA-XFER-1.part", ".Rdma-Xfer-partial", ".rdma-XFER-"] {
            assert_eq!(validate_name(own, ANY), Err(NameError::Reserved), "{own:?}");
        }
        // Not ASCII: not the prefix (no Unicode folding, K is not KELVIN SIGN).
        assert_eq!(validate_name(".rdma-xfer\u{2010}x", ANY), Ok(()));
        assert_eq!(validate_name(".rdma-xfer", ANY), Ok(()));
    }

    /// Bidirectional controls, zero-width characters and line separators
    /// are never part of a name, and are escaped wherever shown.
    #[test]
    fn invisible_characters_are_refused_and_escaped() {
        let invisible = [
            0x061c, 0x200b, 0x200c, 0x200d, 0x200e, 0x200f, 0x2028, 0x2029, 0x202a, 0x202b, 0x202c,
            0x202d, 0x202e, 0x2060, 0x2066, 0x2067, 0x2068, 0x2069, 0xfeff,
        ];
        for code in invisible {
            let c = char::from_u32(code).unwrap();
            let name = format!("evil{c}txt.exe");
            assert_eq!(
                validate_name(&name, ANY),
                Err(NameError::Invisible { code }),
                "U+{code:04X}"
            );
            assert!(validate_path(&format!("d/{name}"), ANY).is_err());
            assert_eq!(
                escaped(&name).to_string(),
                format!("evil\\u{{{code:x}}}txt.exe")
            );
        }
        // Their neighbours are ordinary characters.
        for ok in [
            '\u{061b}', '\u{2010}', '\u{202f}', '\u{2061}', '\u{206a}', '\u{fefe}',
        ] {
            assert!(!is_invisible(ok), "{ok:?}");
        }
        assert_eq!(
            NameError::Invisible { code: 0x202e }.to_string(),
            "file name contains U+202E, an invisible character (bidirectional control, \
             zero-width character or line separator) that changes how the name is shown"
        );
    }

    #[test]
    fn length_limit_is_in_bytes() {
        assert_eq!(validate_name(&"a".repeat(255), ANY), Ok(()));
        assert_eq!(
            validate_name(&"a".repeat(256), ANY),
            Err(NameError::TooLong { len: 256 })
        );
        assert_eq!(
            validate_name(&"a".repeat(300), ANY),
            Err(NameError::TooLong { len: 300 })
        );
        // 127 two-byte chars = 254 bytes; one more 2-byte char crosses the limit.
        let e254 = "é".repeat(127);
        assert_eq!(validate_name(&e254, ANY), Ok(()));
        assert_eq!(validate_name(&format!("{e254}a"), ANY), Ok(()));
        assert_eq!(
            validate_name(&format!("{e254}é"), ANY),
            Err(NameError::TooLong { len: 256 })
        );
        // 85 chars but 255 bytes (3-byte chars) is fine; 86 chars is not.
        assert_eq!(validate_name(&"文".repeat(85), ANY), Ok(()));
        assert_eq!(
            validate_name(&"文".repeat(86), ANY),
            Err(NameError::TooLong { len: 258 })
        );
    }

    #[test]
    fn paths_of_plain_names_are_accepted() {
        for ok in [
            "a",
            "a/b",
            "dir/sub dir/file with spaces.txt",
            "ünïcødé/文件/🚀",
            ".hidden/.x/...",
            "..x/x..",
            "-rf/a:b/*?",
        ] {
            assert_eq!(validate_path(ok, ANY), Ok(()), "{ok:?}");
        }
        let deep = vec!["d"; MAX_PATH_DEPTH].join("/");
        assert_eq!(validate_path(&deep, ANY), Ok(()));
        let long = vec!["a".repeat(255); 16].join("/");
        assert_eq!(long.len(), MAX_PATH_BYTES);
        assert_eq!(validate_path(&long, ANY), Ok(()));
    }

    #[test]
    fn hostile_paths_are_refused() {
        let comp = |index, component: &str, error| {
            Err(PathError::Component {
                index,
                component: component.into(),
                error,
            })
        };
        assert_eq!(validate_path("/etc/passwd", ANY), Err(PathError::Absolute));
        assert_eq!(validate_path("/", ANY), Err(PathError::Absolute));
        assert_eq!(validate_path("//x", ANY), Err(PathError::Absolute));
        assert_eq!(validate_path("", ANY), comp(0, "", NameError::Empty));
        assert_eq!(validate_path("..", ANY), comp(0, "..", NameError::DotName));
        assert_eq!(
            validate_path("../x", ANY),
            comp(0, "..", NameError::DotName)
        );
        assert_eq!(
            validate_path("a/../../x", ANY),
            comp(1, "..", NameError::DotName)
        );
        assert_eq!(
            validate_path("a/..", ANY),
            comp(1, "..", NameError::DotName)
        );
        assert_eq!(validate_path("./a", ANY), comp(0, ".", NameError::DotName));
        assert_eq!(
            validate_path("a/./b", ANY),
            comp(1, ".", NameError::DotName)
        );
        assert_eq!(validate_path("a//b", ANY), comp(1, "", NameError::Empty));
        assert_eq!(validate_path("a/", ANY), comp(1, "", NameError::Empty));
        assert_eq!(
            validate_path("a\\..\\b", ANY),
            comp(0, "a\\..\\b", NameError::PathSeparator)
        );
        assert_eq!(
            validate_path("a/..\\x", ANY),
            comp(1, "..\\x", NameError::PathSeparator)
        );
        assert_eq!(
            validate_path("a/b\0c", ANY),
            comp(1, "b\0c", NameError::Nul)
        );
        assert_eq!(
            validate_path("ok/new\nline", ANY),
            comp(1, "new\nline", NameError::Control { code: 10 })
        );
        assert_eq!(
            validate_path(&format!("a/{}", "x".repeat(256)), ANY),
            comp(1, &"x".repeat(64), NameError::TooLong { len: 256 })
        );
        let deep = vec!["d"; MAX_PATH_DEPTH + 1].join("/");
        assert_eq!(validate_path(&deep, ANY), Err(PathError::TooDeep));
        let long = "a/".repeat(MAX_PATH_BYTES / 2 + 1);
        assert_eq!(
            validate_path(&long, ANY),
            Err(PathError::TooLong { len: long.len() })
        );
    }

    #[test]
    fn every_valid_name_is_a_valid_path_and_no_path_escapes() {
        use crate::proto::wire::tests::Rng;
        // Paths built from a small alphabet that includes every separator
        // and dot: whatever validate_path accepts stays below its base.
        let alphabet = ['a', '.', '/', '\\', '\0', '\n', ' ', 'é'];
        let mut rng = Rng(0xfeed_f00d_1234_5679);
        let mut accepted = 0;
        for _ in 0..50_000 {
            let len = rng.below(12) as usize;
            let p: String = (0..len)
                .map(|_| alphabet[rng.below(alphabet.len() as u64) as usize])
                .collect();
            let single = validate_name(&p, ANY).is_ok();
            match validate_path(&p, ANY) {
                Ok(()) => {
                    accepted += 1;
                    let mut depth = 0i32;
                    for c in p.split('/') {
                        assert!(!c.is_empty() && c != "." && c != "..", "{p:?}");
                        assert!(!c.contains(['\\', '\0', '\n']), "{p:?}");
                        depth += 1;
                    }
                    assert!(depth >= 1);
                    assert!(!p.starts_with('/') && !p.ends_with('/'));
                }
                Err(_) => assert!(!single, "{p:?} is a valid name but not a valid path"),
            }
        }
        assert!(accepted > 1000, "{accepted}");
    }

    #[test]
    fn messages_are_readable() {
        assert_eq!(
            PathError::Component {
                index: 1,
                component: "..".into(),
                error: NameError::DotName
            }
            .to_string(),
            "path component 2 \"..\": file name may not be \".\" or \"..\""
        );
        assert_eq!(
            PathError::Absolute.to_string(),
            "path must be relative (it starts with \"/\")"
        );
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
