//! `--exclude` and `--include`: which entries the sender leaves out, by
//! rsync's rules for the subset supported. The rules are tried in
//! command-line order and the first that matches decides; an entry no
//! rule matches is sent.
//!
//! Patterns match the path an entry arrives under (`tree/cache/x.tmp`
//! for `sender -r HOST /data/tree`; with `-R` or `--files-from`, the path
//! kept). As rsync's:
//! - a leading `/` anchors the pattern at the start of that path
//!   (`/tree/cache`); otherwise it matches the path's end, on whole
//!   components (`*.tmp`, `cache/x.tmp`);
//! - a trailing `/` matches directories only;
//! - `*` and `?` stop at `/`, `**` crosses it, `[...]` is a class, `\`
//!   escapes.
//!
//! Globs are compiled by `globset`; nothing here is a hand-written matcher.

use crate::error::XferError;
use globset::{Glob, GlobBuilder, GlobMatcher};

/// A rule as given on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `--include` (true) or `--exclude` (false).
    pub include: bool,
    pub pattern: String,
}

impl Rule {
    pub fn include(pattern: &str) -> Self {
        Rule {
            include: true,
            pattern: pattern.to_string(),
        }
    }

    pub fn exclude(pattern: &str) -> Self {
        Rule {
            include: false,
            pattern: pattern.to_string(),
        }
    }

    fn option(&self) -> &'static str {
        if self.include {
            "--include"
        } else {
            "--exclude"
        }
    }
}

/// A rule compiled.
#[derive(Debug, Clone)]
struct Compiled {
    include: bool,
    dirs_only: bool,
    matcher: GlobMatcher,
}

/// The rules, compiled; the default has none and sends everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    rules: Vec<Compiled>,
}

impl Filter {
    /// Compiles the rules, in order; every bad pattern is reported
    /// (usage error, exit 2).
    pub fn new(rules: &[Rule]) -> Result<Filter, XferError> {
        let mut problems = crate::error::Problems::default();
        let mut compiled = Vec::with_capacity(rules.len());
        for rule in rules {
            match compile(&rule.pattern) {
                Ok((matcher, dirs_only)) => compiled.push(Compiled {
                    include: rule.include,
                    dirs_only,
                    matcher,
                }),
                Err(why) => problems.add(format!("{} {:?}: {why}", rule.option(), rule.pattern)),
            }
        }
        problems.into_result().map(|()| Filter { rules: compiled })
    }

    /// Whether the entry arriving as `path` (components joined by `/`, no
    /// leading or trailing `/`) is sent: the first rule that matches
    /// decides, and without one it is.
    pub fn admits(&self, path: &str, is_dir: bool) -> bool {
        self.rules
            .iter()
            .find(|r| (is_dir || !r.dirs_only) && r.matcher.is_match(path))
            .is_none_or(|r| r.include)
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

/// A pattern as a glob over the whole path, and whether it matches
/// directories only.
fn compile(pattern: &str) -> Result<(GlobMatcher, bool), String> {
    let (body, dirs_only) = match pattern.strip_suffix('/') {
        Some(b) => (b, true),
        None => (pattern, false),
    };
    let (body, anchored) = match body.strip_prefix('/') {
        Some(b) => (b, true),
        None => (body, false),
    };
    if body.is_empty() {
        return Err("an empty pattern matches nothing".into());
    }
    if body.starts_with('/') || body.ends_with('/') || body.contains("//") {
        return Err("empty path components (`//`) match nothing".into());
    }
    // Unanchored: the path's end, on a component boundary (`**/` matches
    // no directory too).
    let glob = if anchored {
        body.to_string()
    } else {
        format!("**/{body}")
    };
    let glob: Glob = GlobBuilder::new(&glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map_err(|e| e.kind().to_string())?;
    Ok((glob.compile_matcher(), dirs_only))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter(rules: &[Rule]) -> Filter {
        Filter::new(rules).unwrap()
    }

    #[test]
    fn no_rules_send_everything() {
        let f = Filter::default();
        assert!(f.is_empty());
        assert!(f.admits("a/b.tmp", false) && f.admits("a", true));
    }

    #[test]
    fn a_pattern_without_slash_matches_the_last_component_at_any_depth() {
        let f = filter(&[Rule::exclude("*.tmp")]);
        assert!(!f.admits("x.tmp", false));
        assert!(!f.admits("tree/a/b/x.tmp", false));
        assert!(!f.admits("tree/d.tmp", true), "directories too");
        assert!(f.admits("tree/x.tmp.keep", false));
        assert!(
            f.admits("tree/x.tmpdir/y", false),
            "only the last component"
        );
        // `*` does not cross `/`.
        let f = filter(&[Rule::exclude("a*z")]);
        assert!(!f.admits("t/abcz", false));
        assert!(f.admits("t/a/z", false) && f.admits("ab/cz", false));
    }

    #[test]
    fn first_matching_rule_decides_in_command_line_order() {
        let f = filter(&[Rule::include("keep.tmp"), Rule::exclude("*.tmp")]);
        assert!(f.admits("t/keep.tmp", false));
        assert!(!f.admits("t/drop.tmp", false));
        assert!(f.admits("t/other.txt", false), "no rule matches: sent");
        // The other order: the exclusion comes first and wins.
        let f = filter(&[Rule::exclude("*.tmp"), Rule::include("keep.tmp")]);
        assert!(!f.admits("t/keep.tmp", false));
        // An include then a catch-all exclude: only what is included.
        let f = filter(&[
            Rule::include("*/"),
            Rule::include("*.pt"),
            Rule::exclude("*"),
        ]);
        assert!(f.admits("t/sub", true) && f.admits("t/sub/m.pt", false));
        assert!(!f.admits("t/sub/m.txt", false));
    }

    #[test]
    fn a_trailing_slash_matches_directories_only() {
        let f = filter(&[Rule::exclude("cache/")]);
        assert!(!f.admits("t/cache", true));
        assert!(!f.admits("t/a/cache", true));
        assert!(f.admits("t/cache", false), "a file named cache is sent");
        assert!(f.admits("t/cache2", true));
    }

    #[test]
    fn a_leading_slash_anchors_at_the_arriving_path() {
        let f = filter(&[Rule::exclude("/tree/cache")]);
        assert!(!f.admits("tree/cache", true));
        assert!(f.admits("tree/a/cache", true), "anchored: not deeper");
        assert!(f.admits("other/tree/cache", true));
        // With a `/` inside but not first: the path's end, on components.
        let f = filter(&[Rule::exclude("a/b.txt")]);
        assert!(!f.admits("a/b.txt", false) && !f.admits("t/x/a/b.txt", false));
        assert!(f.admits("t/xa/b.txt", false), "whole components only");
        assert!(f.admits("a/b.txt/c", false));
    }

    #[test]
    fn double_star_crosses_directories() {
        let f = filter(&[Rule::exclude("/t/**/*.log")]);
        assert!(!f.admits("t/x.log", false), "`**/` may match no directory");
        assert!(!f.admits("t/a/b/c/x.log", false));
        assert!(f.admits("u/x.log", false));
        let f = filter(&[Rule::exclude("/t/a/**")]);
        assert!(!f.admits("t/a/x", false) && !f.admits("t/a/b/c", true));
        // Single `*` never does: `/t/*.log` is the top level only.
        let f = filter(&[Rule::exclude("/t/*.log")]);
        assert!(!f.admits("t/x.log", false));
        assert!(f.admits("t/a/x.log", false));
    }

    #[test]
    fn classes_question_marks_and_escapes() {
        let f = filter(&[Rule::exclude("ckpt-[0-9]?.pt"), Rule::exclude("\\*")]);
        assert!(!f.admits("d/ckpt-12.pt", false));
        assert!(f.admits("d/ckpt-a2.pt", false) && f.admits("d/ckpt-1/.pt", false));
        assert!(!f.admits("d/*", false), "an escaped star is a star");
        assert!(f.admits("d/x", false));
    }

    #[test]
    fn bad_patterns_are_usage_errors_all_at_once() {
        let err = Filter::new(&[
            Rule::exclude("[z-a"),
            Rule::include("ok"),
            Rule::include(""),
            Rule::exclude("/"),
            Rule::exclude("a//b"),
        ])
        .unwrap_err();
        assert_eq!(err.exit_code() as u8, 2);
        let XferError::Problems(all) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(all.len(), 4, "{all:#?}");
        assert!(all[0].starts_with("--exclude \"[z-a\""), "{all:#?}");
        assert!(all[1].starts_with("--include \"\""), "{all:#?}");
    }
}
