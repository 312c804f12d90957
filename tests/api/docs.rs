//! The docs stay true to the binary and to themselves: every command of README's
//! walk-through still parses (the built binary, the same arguments and `--help`, which clap
//! only reaches after accepting the arguments before it), and every relative link in
//! README.md and docs/ reaches an existing file and, for `#anchor` links, one of its
//! headings (GitHub's slug rule).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use regex::Regex;

pub(crate) fn repository_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The lines of `markdown` outside fenced code blocks, and the blocks themselves with
/// their info string (`sh`, `python`, ...).
pub(crate) struct Markdown {
    pub prose: String,
    pub code_blocks: Vec<(String, Vec<String>)>,
}

pub(crate) fn split_markdown(markdown: &str) -> Markdown {
    let mut prose = String::new();
    let mut code_blocks = Vec::new();
    let mut open_block: Option<(String, Vec<String>)> = None;
    for line in markdown.lines() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open_block, fence) {
            (None, true) => {
                let info = line.trim_start().trim_start_matches('`').trim().to_string();
                open_block = Some((info, Vec::new()));
            }
            (Some(_), true) => code_blocks.push(open_block.take().unwrap()),
            (Some((_, lines)), false) => lines.push(line.to_string()),
            (None, false) => {
                prose.push_str(line);
                prose.push('\n');
            }
        }
    }
    Markdown { prose, code_blocks }
}

/// Splits a shell command line into words as sh would for these simple lines: single and
/// double quotes, backslash escapes, and a `#` comment at the start of a word.
pub(crate) fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for q in chars.by_ref() {
                    if q == '\'' {
                        break;
                    }
                    word.push(q);
                }
            }
            '"' => {
                in_word = true;
                while let Some(q) = chars.next() {
                    match q {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        _ => word.push(q),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '#' if !in_word => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// The coloc command lines of a document's shell blocks, continuation lines joined, as the
/// arguments after the program: `cargo run --release -- X` and `coloc X` both give `X`.
fn coloc_commands(markdown: &str) -> Vec<Vec<String>> {
    let mut commands = Vec::new();
    for (info, lines) in split_markdown(markdown).code_blocks {
        if !matches!(info.as_str(), "" | "sh" | "bash" | "console") {
            continue;
        }
        let mut joined = Vec::new();
        let mut pending = String::new();
        for line in lines {
            match line.strip_suffix('\\') {
                Some(head) => {
                    pending.push_str(head);
                    pending.push(' ');
                }
                None => {
                    pending.push_str(&line);
                    joined.push(std::mem::take(&mut pending));
                }
            }
        }
        for line in joined {
            let line = line.trim();
            let rest = line
                .strip_prefix("cargo run --release -- ")
                .or_else(|| line.strip_prefix("coloc "));
            if let Some(rest) = rest {
                commands.push(shell_words(rest));
            }
        }
    }
    commands
}

/// Whether the built binary accepts `arguments` up to `--help` (exit status 0), with its
/// stderr when it does not.
fn parses(arguments: &[String]) -> Result<(), String> {
    let output = Command::new(env!("CARGO_BIN_EXE_coloc"))
        .args(arguments)
        .arg("--help")
        .current_dir(repository_root())
        .output()
        .expect("the coloc binary runs");
    if output.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&output.stderr).into_owned())
    }
}

/// GitHub's anchor for a heading: the rendered text lowercased, spaces to `-`, everything
/// but letters, digits, `-` and `_` dropped; a repeated heading gets `-1`, `-2`, ...
fn heading_slugs(markdown: &str) -> HashSet<String> {
    let link = Regex::new(r"\[([^\]]*)\]\([^)]*\)").unwrap();
    let mut slugs = HashSet::new();
    for line in split_markdown(markdown).prose.lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let text = link.replace_all(line[hashes..].trim(), "$1");
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter_map(|c| match c {
                ' ' => Some('-'),
                c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                _ => None,
            })
            .collect();
        let mut unique = slug.clone();
        let mut n = 0;
        while slugs.contains(&unique) {
            n += 1;
            unique = format!("{slug}-{n}");
        }
        slugs.insert(unique);
    }
    slugs
}

/// Every relative link of the document at `path` (text `markdown`) that does not resolve,
/// with why.
fn broken_links(path: &Path, markdown: &str) -> Vec<String> {
    let inline_code = Regex::new(r"`[^`]*`").unwrap();
    let link = Regex::new(r#"\]\(([^)\s]+)(?:\s+"[^"]*")?\)"#).unwrap();
    let prose = split_markdown(markdown).prose;
    let prose = inline_code.replace_all(&prose, "");
    let folder = path.parent().unwrap_or(Path::new("."));
    let mut broken = Vec::new();
    for captures in link.captures_iter(&prose) {
        let target = &captures[1];
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (file, anchor) = match target.split_once('#') {
            Some((file, anchor)) => (file, Some(anchor)),
            None => (target, None),
        };
        let resolved = if file.is_empty() {
            path.to_path_buf()
        } else {
            folder.join(file)
        };
        if !resolved.exists() {
            broken.push(format!("{}: {target}: no such file", path.display()));
            continue;
        }
        let Some(anchor) = anchor else { continue };
        let text = if file.is_empty() {
            markdown.to_string()
        } else {
            std::fs::read_to_string(&resolved).unwrap_or_default()
        };
        if !heading_slugs(&text).contains(anchor) {
            broken.push(format!(
                "{}: {target}: no heading #{anchor}",
                path.display()
            ));
        }
    }
    broken
}

fn markdown_files(folder: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(folder).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            markdown_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "md") {
            found.push(path);
        }
    }
}

#[test]
fn every_command_of_the_readme_walk_through_still_parses() {
    let readme = std::fs::read_to_string(repository_root().join("README.md")).unwrap();
    let commands = coloc_commands(&readme);
    assert!(
        commands.len() >= 8,
        "README's walk-through should show the coloc commands a newcomer runs; found {commands:?}"
    );
    for verb in ["import", "serve", "rank", "predict", "place"] {
        assert!(
            commands
                .iter()
                .any(|c| c.first().map(String::as_str) == Some(verb)),
            "README's walk-through shows no `coloc {verb}`"
        );
    }
    let refused: Vec<String> = commands
        .iter()
        .filter_map(|c| {
            parses(c)
                .err()
                .map(|e| format!("coloc {}: {e}", c.join(" ")))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "commands the binary refuses:\n{}",
        refused.join("\n")
    );
}

#[test]
fn every_relative_link_of_the_readme_and_the_docs_resolves() {
    let root = repository_root();
    let mut files = vec![root.join("README.md")];
    markdown_files(&root.join("docs"), &mut files);
    assert!(
        files.len() > 10,
        "docs/ should hold the pages README links to"
    );
    let broken: Vec<String> = files
        .iter()
        .flat_map(|f| broken_links(f, &std::fs::read_to_string(f).unwrap()))
        .collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn a_broken_link_a_missing_heading_and_an_unknown_flag_are_caught() {
    let readme = repository_root().join("README.md");
    let page = "# Title\n\n## A `code` heading: yes\n\n[ok](#a-code-heading-yes) [self](README.md)\n\
                [gone](docs/no-such-page.md) [no anchor](#nowhere)\n\n```sh\n[not a link](x.md)\n```\n";
    let broken = broken_links(&readme, page);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("no-such-page.md") && broken[1].contains("#nowhere"));

    let walk_through =
        "```sh\ncargo run --release -- rank bert --top 3 \\\n    --no-such-flag  # comment\n\
                        coloc jobs assign j1 gpu-1 --node \"node a\"\n```\n";
    let commands = coloc_commands(walk_through);
    assert_eq!(
        commands[0],
        ["rank", "bert", "--top", "3", "--no-such-flag"]
    );
    assert_eq!(
        commands[1],
        ["jobs", "assign", "j1", "gpu-1", "--node", "node a"]
    );
    assert!(parses(&commands[0]).is_err());
    assert!(parses(&commands[1]).is_ok());
    assert!(parses(&["no-such-command".to_string()]).is_err());
}
