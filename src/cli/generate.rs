//! Man pages and shell completions of both tools, generated from the same
//! clap definitions the binaries parse with (`rdma-xfer-gen`, run by
//! `make install`).

use super::args::commands;
use clap_complete::{Generator, Shell};
use std::io;
use std::path::{Path, PathBuf};

/// Shells whose completions are generated and installed.
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// Writes `sender.1` and `receiver.1` into `dir`; returns their paths.
pub fn write_man_pages(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for cmd in commands() {
        let name = cmd.get_name().to_string();
        let after_help = cmd
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let man = clap_mangen::Man::new(cmd)
            .section("1")
            .source(format!("rdma-xfer {}", env!("CARGO_PKG_VERSION")))
            .manual("User Commands");
        let mut page = Vec::new();
        man.render_title(&mut page)?;
        man.render_name_section(&mut page)?;
        man.render_synopsis_section(&mut page)?;
        man.render_description_section(&mut page)?;
        man.render_options_section(&mut page)?;
        page.extend_from_slice(help_sections(&after_help).as_bytes());
        man.render_version_section(&mut page)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page)?;
        written.push(path);
    }
    Ok(written)
}

/// The `--help` epilogue ("Examples:", "Output:", "Exit codes:" blocks,
/// separated by blank lines) as man page sections (EXAMPLES, OUTPUT, EXIT
/// STATUS), each block's lines kept as they are.
fn help_sections(after_help: &str) -> String {
    let mut roff = roff::Roff::new();
    for block in after_help.split("\n\n") {
        let mut lines = block.lines();
        let Some(heading) = lines.next() else {
            continue;
        };
        let title = match heading.trim_end_matches(':') {
            "Exit codes" => "EXIT STATUS".to_string(),
            other => other.to_uppercase(),
        };
        roff.control("SH", [title.as_str()]);
        roff.control("nf", []);
        for line in lines {
            roff.text([roff::roman(line.trim_start())]);
        }
        roff.control("fi", []);
    }
    roff.to_roff()
}

/// The file name a completion script is installed under: what each shell
/// looks up on demand (bash-completion: the command's name; zsh: `_name` in
/// a `site-functions` directory; fish: `name.fish`).
pub fn completion_file_name(shell: Shell, name: &str) -> String {
    match shell {
        Shell::Bash => name.to_string(),
        other => other.file_name(name),
    }
}

/// Writes both tools' completion scripts for `shell` into `dir`.
pub fn write_completions(shell: Shell, dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for mut cmd in commands() {
        let name = cmd.get_name().to_string();
        cmd.set_bin_name(&name);
        cmd.build();
        let mut script = Vec::new();
        shell
            .try_generate(&cmd, &mut script)
            .map_err(|e| io::Error::other(format!("{shell} completions for {name}: {e}")))?;
        let path = dir.join(completion_file_name(shell, &name));
        std::fs::write(&path, script)?;
        written.push(path);
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn man_pages_are_roff_with_the_options_and_examples() {
        let dir = tempfile::tempdir().unwrap();
        let pages = write_man_pages(dir.path()).unwrap();
        assert_eq!(pages.len(), 2);
        for (page, name) in pages.iter().zip(["sender", "receiver"]) {
            assert_eq!(page.file_name().unwrap(), format!("{name}.1").as_str());
            let text = std::fs::read_to_string(page).unwrap();
            assert!(text.starts_with(".ie \\n(.g .ds Aq"), "{text}");
            assert!(text.contains(&format!(".TH {name} 1")), "{text}");
            assert!(text.contains("\\-\\-json"), "{text}");
            assert!(text.contains(".SH EXAMPLES"), "{text}");
            assert!(text.contains(".SH \"EXIT STATUS\""), "{text}");
            // Examples start with the command, dashes escaped.
            assert!(text.contains(&format!("\n{name} \\-\\-")), "{text}");
        }
    }

    #[test]
    fn completions_for_each_shell() {
        let dir = tempfile::tempdir().unwrap();
        for shell in SHELLS {
            let files = write_completions(shell, dir.path()).unwrap();
            assert_eq!(files.len(), 2);
            for f in files {
                let text = std::fs::read_to_string(&f).unwrap();
                assert!(text.contains("json"), "{}: {text}", f.display());
                assert!(text.contains("token-file"), "{}: {text}", f.display());
            }
        }
        for name in ["sender", "_sender", "sender.fish", "receiver", "_receiver"] {
            assert!(dir.path().join(name).exists(), "{name}");
        }
    }
}
