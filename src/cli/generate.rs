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
/// `unit` is where the systemd unit of the receiver is installed, if it is
/// (`scripts/install.sh` passes it): receiver.1 then describes it.
pub fn write_man_pages(dir: &Path, unit: Option<&Path>) -> io::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for cmd in commands() {
        let name = cmd.get_name().to_string();
        let after_help = cmd
            .get_after_help()
            .map(|h| h.to_string())
            .unwrap_or_default();
        let headings = option_headings(&cmd);
        let man = clap_mangen::Man::new(cmd)
            .section("1")
            .source(format!("rdma-xfer {}", env!("CARGO_PKG_VERSION")))
            .manual("User Commands");
        let mut page = Vec::new();
        man.render_title(&mut page)?;
        man.render_name_section(&mut page)?;
        man.render_synopsis_section(&mut page)?;
        man.render_description_section(&mut page)?;
        let mut options = Vec::new();
        man.render_options_section(&mut options)?;
        page.extend_from_slice(headings_as_subsections(&options, &headings).as_bytes());
        let mut sections = help_sections(&after_help);
        sections.push(files_section(&name, unit));
        sections.push(see_also_section(&name, unit));
        // Stable: blocks of equal rank keep the order `--help` gives them.
        sections.sort_by_key(|s| section_rank(&s.title));
        for s in &sections {
            page.extend_from_slice(s.roff.render().as_bytes());
        }
        man.render_version_section(&mut page)?;
        let path = dir.join(format!("{name}.1"));
        std::fs::write(&path, page)?;
        written.push(path);
    }
    Ok(written)
}

/// The help headings of `cmd`'s options, in clap's order.
fn option_headings(cmd: &clap::Command) -> Vec<String> {
    let mut headings: Vec<String> = Vec::new();
    for h in cmd.get_arguments().filter_map(|a| a.get_help_heading()) {
        if !headings.iter().any(|known| known == h) {
            headings.push(h.to_string());
        }
    }
    headings
}

/// The OPTIONS section as clap_mangen renders it, with each help heading
/// (which it makes a section of its own, `.SH CONNECTION`) turned into a
/// subsection of OPTIONS: sections would break the conventional order, and
/// a heading named like an epilogue block ("Output") would appear twice.
fn headings_as_subsections(rendered: &[u8], headings: &[String]) -> String {
    let rendered = String::from_utf8_lossy(rendered);
    let mut out = String::new();
    let mut have_options = false;
    for line in rendered.lines() {
        let title = line.strip_prefix(".SH ").map(|t| t.trim_matches('"'));
        if title == Some("OPTIONS") {
            have_options = true;
        }
        let heading = title.and_then(|t| headings.iter().find(|h| h.to_uppercase() == t));
        match heading {
            Some(h) => {
                // Options all under headings: clap_mangen wrote no OPTIONS.
                if !have_options {
                    out.push_str(".SH OPTIONS\n");
                    have_options = true;
                }
                let mut ss = roff::Roff::new();
                ss.control("SS", [h.as_str()]);
                out.push_str(&ss.to_roff());
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// One man page section, its `.SH` line included.
struct Section {
    title: String,
    roff: roff::Roff,
}

impl Section {
    fn new(title: &str) -> Section {
        let mut roff = roff::Roff::new();
        roff.control("SH", [title]);
        Section {
            title: title.to_string(),
            roff,
        }
    }
}

/// The conventional order of the sections between OPTIONS and VERSION
/// (clap renders those two); a title not listed goes with OUTPUT.
const SECTION_ORDER: [&str; 6] = [
    "EXAMPLES",
    "OUTPUT",
    "ENVIRONMENT",
    "FILES",
    "EXIT STATUS",
    "SEE ALSO",
];

fn section_rank(title: &str) -> usize {
    let other = SECTION_ORDER.iter().position(|t| *t == "OUTPUT");
    SECTION_ORDER
        .iter()
        .position(|t| *t == title)
        .or(other)
        .unwrap_or(0)
}

/// The `--help` epilogue ("Examples:", "Output:", "Environment:", "Exit
/// codes:" blocks, separated by blank lines) as man page sections
/// (EXAMPLES, OUTPUT, ENVIRONMENT, EXIT STATUS), each block's lines kept as
/// they are (less the block's indentation), and less pointers to the
/// README, which is not installed with the pages.
fn help_sections(after_help: &str) -> Vec<Section> {
    let mut sections = Vec::new();
    for block in after_help.split("\n\n") {
        let mut lines = block.lines();
        let Some(heading) = lines.next() else {
            continue;
        };
        let title = match heading.trim_end_matches(':') {
            "Exit codes" => "EXIT STATUS".to_string(),
            other => other.to_uppercase(),
        };
        let lines: Vec<&str> = lines.collect();
        // The block's own indentation goes; a continuation line's deeper
        // one stays (it aligns with the column above in no-fill mode).
        let indent = lines
            .iter()
            .filter(|l| !l.trim().is_empty())
            .map(|l| l.len() - l.trim_start().len())
            .min()
            .unwrap_or(0);
        let mut s = Section::new(&title);
        s.roff.control("nf", []);
        for line in lines {
            let line = line.get(indent..).unwrap_or("");
            s.roff.text([roff::roman(without_readme_pointers(line))]);
        }
        s.roff.control("fi", []);
        sections.push(s);
    }
    sections
}

/// `line` without its parenthesised remarks that point to the README.
fn without_readme_pointers(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(open) = rest.find('(') {
        let Some(len) = rest[open..].find(')') else {
            break;
        };
        let close = open + len;
        if rest[open..close].contains("README") {
            out.push_str(rest[..open].trim_end());
        } else {
            out.push_str(&rest[..=close]);
        }
        rest = &rest[close + 1..];
    }
    out.push_str(rest);
    out
}

/// Paths the receiver's unit uses; `dist/systemd/rdma-xfer-receiver.service.in`
/// sets them (tests/install.rs checks that they agree).
const UNIT_TOKEN: &str = "/etc/rdma-xfer/token";
const UNIT_DIR: &str = "/var/lib/rdma-xfer";

/// FILES: what each tool reads, and what the receiver leaves on disk (in
/// exactly the names `engine::receiver` gives them).
fn files_section(name: &str, unit: Option<&Path>) -> Section {
    let mut s = Section::new("FILES");
    let mut entry = |heading: Vec<roff::Inline>, text: &str| {
        s.roff.control("TP", []);
        s.roff.text(heading);
        s.roff.text([roff::roman(text)]);
    };
    entry(
        vec![
            roff::roman("the "),
            roff::italic("PATH"),
            roff::roman(" of "),
            roff::bold("--token-file"),
        ],
        "The shared secret: at least 16 bytes, trailing whitespace ignored; rdma-xfer-gen token \
         FILE makes one (32 random bytes as hex, mode 600, never over an existing file), to be \
         given to both tools. Keep it to its owner (chmod 600); a file that group or others can \
         read is used, with a warning. The receiver refuses to start without a token unless \
         --insecure.",
    );
    if name != "receiver" {
        return s;
    }
    entry(
        vec![roff::bold("DIR/.rdma-xfer-PID-N-XXXXXXXX.part")],
        "A file being received, under a temporary name in the directory of its final name (DIR \
         is --dir; PID the receiver's process ID, N a counter, XXXXXXXX 8 hex digits). Renamed \
         to its final name once fsynced and checked, removed if its transfer fails. Left behind \
         only by a receiver that died; a later receiver removes it once it was not written to \
         for --partial-ttl.",
    );
    entry(
        vec![roff::bold(
            "DIR/.rdma-xfer-partial-ID, DIR/.rdma-xfer-partial-ID.meta",
        )],
        "What is kept of a file sent with sender --resume (or --retry) whose transfer failed: \
         the verified part of the file, and a record of its source and of the chunks verified \
         (ID: 24 hex digits derived from the final name), in the directory of the final name. \
         The next sender --resume of that file continues it, and its completion removes both; \
         otherwise they are removed once not written to for --partial-ttl.",
    );
    if let Some(unit) = unit {
        entry(
            vec![roff::bold(unit.display().to_string())],
            "systemd unit that runs receiver as a service under a dynamic user (installed, not \
             enabled). Its comments say how to set it up; options through `systemctl edit \
             rdma-xfer-receiver` (RECEIVER_ARGS, RECEIVER_DIR).",
        );
        entry(
            vec![roff::bold(UNIT_TOKEN)],
            "The token the unit gives receiver (a systemd credential, --token-file); the \
             service does not start without it.",
        );
        entry(
            vec![roff::bold(UNIT_DIR)],
            "Where the unit's receiver writes (its --dir).",
        );
    }
    s
}

/// SEE ALSO: the other tool, the RDMA tools to check a device and its
/// throughput, the usual copy tools; with the unit, systemd's options.
fn see_also_section(name: &str, unit: Option<&Path>) -> Section {
    let other = if name == "sender" {
        "receiver"
    } else {
        "sender"
    };
    let mut refs = vec![
        (other, "1"),
        ("ibv_devices", "1"),
        ("rdma", "8"),
        ("ib_write_bw", "1"),
        ("scp", "1"),
        ("rsync", "1"),
    ];
    let with_unit = name == "receiver" && unit.is_some();
    if with_unit {
        refs.extend([("systemctl", "1"), ("systemd.exec", "5")]);
    }
    let mut s = Section::new("SEE ALSO");
    let mut inlines = Vec::new();
    for (i, (page, section)) in refs.iter().enumerate() {
        let sep = if i + 1 < refs.len() { ", " } else { "" };
        inlines.push(roff::bold(*page));
        inlines.push(roff::roman(format!("({section}){sep}")));
    }
    if with_unit {
        inlines.push(roff::roman("; the unit "));
        inlines.push(roff::bold("rdma-xfer-receiver.service"));
        inlines.push(roff::roman(" (FILES)."));
    }
    s.roff.text(inlines);
    s
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
    for (file_name, script) in completion_scripts(shell)? {
        let path = dir.join(file_name);
        std::fs::write(&path, script)?;
        written.push(path);
    }
    Ok(written)
}

/// Both tools' completion scripts for `shell`, each with the file name it
/// is installed under.
pub fn completion_scripts(shell: Shell) -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut scripts = Vec::new();
    for mut cmd in commands() {
        let name = cmd.get_name().to_string();
        cmd.set_bin_name(&name);
        cmd.build();
        let mut script = Vec::new();
        shell
            .try_generate(&cmd, &mut script)
            .map_err(|e| io::Error::other(format!("{shell} completions for {name}: {e}")))?;
        if shell == Shell::Bash {
            let text = String::from_utf8(script)
                .map_err(|e| io::Error::other(format!("bash completions for {name}: {e}")))?;
            script = bash_host_names(text, &cmd)?.into_bytes();
        }
        scripts.push((completion_file_name(shell, &name), script));
    }
    Ok(scripts)
}

/// clap's bash completions complete file names where a host name goes
/// (zsh and fish follow the value hints already): options hinted as host
/// names complete host names, and so does the first operand (the sender's
/// ADDR) when the command takes one. Fails if clap's script no longer has
/// the shape this edits, rather than installing a script that is wrong.
fn bash_host_names(mut script: String, cmd: &clap::Command) -> io::Result<String> {
    let files = r#"COMPREPLY=($(compgen -f "${cur}"))"#;
    let hosts = r#"COMPREPLY=($(compgen -A hostname -- "${cur}"))"#;
    let unexpected =
        |what: &str| io::Error::other(format!("bash completions: clap's script has no {what}"));
    for arg in cmd.get_arguments() {
        if arg.get_value_hint() != clap::ValueHint::Hostname {
            continue;
        }
        let Some(long) = arg.get_long() else { continue };
        let branch = format!("--{long})\n                    {files}");
        if !script.contains(&branch) {
            return Err(unexpected(&format!("--{long} branch")));
        }
        script = script.replace(&branch, &format!("--{long})\n                    {hosts}"));
    }
    let first_is_host = cmd
        .get_positionals()
        .next()
        .is_some_and(|a| a.get_value_hint() == clap::ValueHint::Hostname);
    if !first_is_host {
        return Ok(script);
    }
    let name = cmd.get_name();
    // Options that take a separate value word (skipped when counting
    // operands).
    let valued: Vec<String> = cmd
        .get_arguments()
        .filter(|a| !a.is_positional() && a.get_action().takes_values())
        .filter(|a| !a.is_require_equals_set())
        .flat_map(|a| {
            let long = a.get_long().map(|l| format!("--{l}"));
            let short = a.get_short().map(|c| format!("-{c}"));
            long.into_iter().chain(short)
        })
        .collect();
    let helper = format!(
        "# rdma-xfer: true when the word being completed is the first operand.\n\
         __{name}_first_operand() {{\n    local i skip=0\n    \
         for ((i = 1; i < COMP_CWORD; i++)); do\n        \
         if ((skip)); then skip=0; continue; fi\n        \
         case ${{COMP_WORDS[i]}} in\n            {}) skip=1 ;;\n            \
         -*) ;;\n            *) return 1 ;;\n        esac\n    done\n    \
         ((!skip))\n}}\n\n",
        valued.join("|")
    );
    let test = r#"            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then"#;
    if !script.contains(test) {
        return Err(unexpected("option test"));
    }
    let operand = format!(
        "            if [[ ${{cur}} != -* ]] && __{name}_first_operand; then\n                \
         {hosts}\n                return 0\n            fi\n{test}"
    );
    Ok(format!("{helper}{}", script.replacen(test, &operand, 1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `.SH` titles of a page, in order.
    fn titles(page: &str) -> Vec<String> {
        page.lines()
            .filter_map(|l| l.strip_prefix(".SH "))
            .map(|t| t.trim_matches('"').to_string())
            .collect()
    }

    #[test]
    fn man_pages_are_roff_with_the_options_and_examples() {
        let dir = tempfile::tempdir().unwrap();
        let pages = write_man_pages(dir.path(), None).unwrap();
        assert_eq!(pages.len(), 2);
        for (page, name) in pages.iter().zip(["sender", "receiver"]) {
            assert_eq!(page.file_name().unwrap(), format!("{name}.1").as_str());
            let text = std::fs::read_to_string(page).unwrap();
            assert!(text.starts_with(".ie \\n(.g .ds Aq"), "{text}");
            assert!(text.contains(&format!(".TH {name} 1")), "{text}");
            assert!(text.contains("\\-\\-json"), "{text}");
            // Examples start with the command, dashes escaped.
            assert!(text.contains(&format!("\n{name} \\-\\-")), "{text}");
            // The conventional order; ENVIRONMENT (when --help has it) just
            // before FILES.
            let all = titles(&text);
            if let Some(env) = all.iter().position(|t| t == "ENVIRONMENT") {
                assert_eq!(all[env + 1], "FILES", "{all:?}");
            }
            let titles: Vec<String> = all.into_iter().filter(|t| t != "ENVIRONMENT").collect();
            let want = [
                "NAME",
                "SYNOPSIS",
                "DESCRIPTION",
                "OPTIONS",
                "EXAMPLES",
                "OUTPUT",
                "FILES",
                "EXIT STATUS",
                "SEE ALSO",
                "VERSION",
            ];
            assert_eq!(titles, want, "{name}");
            // Option groups are subsections of OPTIONS.
            for h in option_headings(
                &commands()
                    .into_iter()
                    .find(|c| c.get_name() == name)
                    .unwrap(),
            ) {
                let ss = format!(".SS {h}\n");
                let quoted = format!(".SS \"{h}\"\n");
                assert!(text.contains(&ss) || text.contains(&quoted), "{h}: {text}");
            }
            // The README is not installed with the pages.
            assert!(!text.contains("README"), "{text}");
            let other = if name == "sender" {
                "receiver"
            } else {
                "sender"
            };
            for r in [other, "ibv_devices", "rdma", "ib_write_bw", "scp", "rsync"] {
                assert!(text.contains(&format!("\\fB{r}\\fR(")), "{r}: {text}");
            }
            assert!(text.contains("\\fB\\-\\-token\\-file\\fR"), "{text}");
            assert!(text.contains("rdma\\-xfer\\-gen token FILE"), "{text}");
            // Without a unit, none is named.
            assert!(!text.contains("rdma\\-xfer\\-receiver.service"), "{text}");
        }
    }

    /// receiver.1's FILES names the leftovers in the forms the receiver
    /// writes them (`temp_name` in engine/receiver/storage/temp_file.rs, `partial_names`
    /// in engine/receiver/storage/partial/sidecar.rs), and the unit when installed.
    #[test]
    fn receiver_files_and_the_unit() {
        let dir = tempfile::tempdir().unwrap();
        let unit = Path::new("/usr/local/lib/systemd/system/rdma-xfer-receiver.service");
        let pages = write_man_pages(dir.path(), Some(unit)).unwrap();
        let receiver = std::fs::read_to_string(&pages[1]).unwrap();
        for want in [
            ".rdma\\-xfer\\-PID\\-N\\-XXXXXXXX.part",
            ".rdma\\-xfer\\-partial\\-ID.meta",
            "\\-\\-partial\\-ttl",
            "/usr/local/lib/systemd/system/rdma\\-xfer\\-receiver.service",
            "/etc/rdma\\-xfer/token",
            "/var/lib/rdma\\-xfer",
            "\\fBsystemd.exec\\fR(5)",
        ] {
            assert!(receiver.contains(want), "{want}: {receiver}");
        }
        // The unit is the receiver's: sender.1 does not name it.
        let sender = std::fs::read_to_string(&pages[0]).unwrap();
        assert!(!sender.contains("receiver.service"), "{sender}");
        assert!(!sender.contains(".rdma\\-xfer\\-"), "{sender}");
    }

    /// Any "Foo:" block of the epilogue becomes section FOO ("Exit codes"
    /// EXIT STATUS), in the conventional order whatever the epilogue's.
    #[test]
    fn epilogue_blocks_become_sections() {
        let after_help = "Exit codes:\n  0  ok\n\n\
            Environment:\n  RDMA_XFER_TOKEN  the shared secret\n                   (or a file)\n  NO_COLOR  no colours\n\n\
            Examples:\n  sender h f\n\n\
            Output:\n  one line per file (see the README).";
        let mut sections = help_sections(after_help);
        sections.sort_by_key(|s| section_rank(&s.title));
        let order: Vec<&str> = sections.iter().map(|s| s.title.as_str()).collect();
        assert_eq!(order, ["EXAMPLES", "OUTPUT", "ENVIRONMENT", "EXIT STATUS"]);
        let env = sections[2].roff.to_roff();
        assert!(env.starts_with(".SH ENVIRONMENT\n.nf\n"), "{env}");
        assert!(
            env.contains("\nRDMA_XFER_TOKEN  the shared secret\n                 (or a file)\n"),
            "{env}"
        );
        assert!(env.contains("NO_COLOR  no colours\n"), "{env}");
        assert_eq!(
            sections[1].roff.to_roff(),
            ".SH OUTPUT\n.nf\none line per file.\n.fi\n"
        );
        // ENVIRONMENT and FILES precede EXIT STATUS; an unknown block goes
        // with OUTPUT.
        let rank = |t| section_rank(t);
        assert!(rank("ENVIRONMENT") < rank("FILES") && rank("FILES") < rank("EXIT STATUS"));
        assert_eq!(rank("NOTES"), rank("OUTPUT"));
    }

    #[test]
    fn option_headings_become_subsections() {
        let headings = ["Connection".to_string(), "Output format".to_string()];
        let rendered = ".ie x\n.SH CONNECTION\n.TP\na\n.SH \"OUTPUT FORMAT\"\n.TP\nb\n";
        assert_eq!(
            headings_as_subsections(rendered.as_bytes(), &headings),
            ".ie x\n.SH OPTIONS\n.SS Connection\n.TP\na\n.SS \"Output format\"\n.TP\nb\n"
        );
        let rendered = ".SH OPTIONS\n.TP\nc\n.SH CONNECTION\n.TP\na\n.SH OTHER\n";
        assert_eq!(
            headings_as_subsections(rendered.as_bytes(), &headings),
            ".SH OPTIONS\n.TP\nc\n.SS Connection\n.TP\na\n.SH OTHER\n"
        );
    }

    #[test]
    fn readme_pointers_are_dropped() {
        for (line, want) in [
            ("flushed at once (see the README).", "flushed at once."),
            ("a (b) c (README) d", "a (b) c d"),
            ("(see README.md)", ""),
            ("unbalanced (README", "unbalanced (README"),
            ("nothing here", "nothing here"),
        ] {
            assert_eq!(without_readme_pointers(line), want, "{line:?}");
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
