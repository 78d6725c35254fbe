//! The docs stay navigable: every chapter `docs/SUMMARY.md` lists exists, every relative
//! link of the README and of the book's pages points at a file that exists (and at a
//! heading of it, when the link names one), and the README stays a user's guide: at most
//! 400 lines, no commit hashes, no load averages (those belong to the book's notes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

const README_MAX_LINES: usize = 400;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The markdown files checked: the README and every page under `docs/`, sorted.
fn pages(root: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    let mut out = vec![root.join("README.md")];
    walk(&root.join("docs"), &mut out);
    out.sort();
    out
}

/// The lines of `text` outside fenced and indented code blocks, with inline code removed
/// (so `x[..](..)` in code is never read as a link), numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || line.starts_with("    ") {
            continue;
        }
        let mut prose = String::new();
        for (j, part) in line.split('`').enumerate() {
            if j % 2 == 0 {
                prose.push_str(part);
            }
        }
        out.push((i + 1, prose));
    }
    out
}

/// The targets of the inline links `[text](target)` on `line`.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                let target = &after[..end];
                if !target.is_empty() && !target.contains(char::is_whitespace) {
                    out.push(target.to_string());
                }
                rest = &after[end..];
            }
            None => break,
        }
    }
    out
}

/// GitHub's (and mdBook's) anchor of a heading: lower case, spaces to hyphens, other
/// punctuation dropped.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c.to_ascii_lowercase()),
            _ => None,
        })
        .collect()
}

/// The anchors of `text`'s headings (outside code blocks), with GitHub's `-1`, `-2`, ...
/// suffixes for repeated ones.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(title) = line.strip_prefix('#') else { continue };
        if fenced {
            continue;
        }
        let Some(title) = title.trim_start_matches('#').strip_prefix(' ') else { continue };
        let base = slug(&title.replace('`', ""));
        let mut anchor = base.clone();
        let mut n = 0;
        while out.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        out.insert(anchor);
    }
    out
}

/// Every broken relative link of `files`, as `file:line: target: why`.
fn broken_links(files: &[PathBuf]) -> Vec<String> {
    let mut broken = Vec::new();
    for file in files {
        let text =
            std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for (line, prose) in prose_lines(&text) {
            for target in link_targets(&prose) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, anchor) = match target.split_once('#') {
                    Some((p, a)) => (p, Some(a)),
                    None => (target.as_str(), None),
                };
                let resolved = if path.is_empty() {
                    file.clone()
                } else {
                    file.parent().expect("a file in a folder").join(path)
                };
                let why = if !resolved.exists() {
                    Some(format!("{} does not exist", resolved.display()))
                } else {
                    anchor.filter(|_| resolved.is_file()).and_then(|a| {
                        let heads =
                            anchors(&std::fs::read_to_string(&resolved).unwrap_or_default());
                        (!heads.contains(a)).then(|| format!("no heading with anchor #{a}"))
                    })
                };
                if let Some(why) = why {
                    broken.push(format!("{}:{line}: {target}: {why}", file.display()));
                }
            }
        }
    }
    broken
}

#[test]
fn every_summary_chapter_exists() {
    let summary = root().join("docs/SUMMARY.md");
    let text = std::fs::read_to_string(&summary).expect("docs/SUMMARY.md");
    let mut chapters = 0;
    for line in text.lines() {
        for target in link_targets(line) {
            chapters += 1;
            let path = root().join("docs").join(&target);
            assert!(
                path.is_file(),
                "docs/SUMMARY.md lists {target}, but {} is not a file",
                path.display()
            );
        }
    }
    assert!(chapters >= 10, "docs/SUMMARY.md lists only {chapters} chapters");
    let book = std::fs::read_to_string(root().join("docs/book.toml")).expect("docs/book.toml");
    assert!(book.contains("src = \".\""), "docs/book.toml must build the book from docs/ itself");
}

#[test]
fn relative_links_resolve() {
    let broken = broken_links(&pages(&root()));
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_users_guide() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines (at most {README_MAX_LINES}): move details into docs/"
    );
    for (n, line) in readme.lines().enumerate() {
        // A commit hash: 7 to 40 hex digits with at least one letter and one digit (so
        // neither a decimal figure nor an English word).
        for word in line.split(|c: char| !c.is_ascii_alphanumeric()) {
            let hex = (7..=40).contains(&word.len())
                && word.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
                && word.chars().any(|c| c.is_ascii_digit())
                && word.chars().any(|c| c.is_ascii_alphabetic());
            assert!(
                !hex,
                "README.md:{}: {word:?} looks like a commit hash: cite docs/ instead",
                n + 1
            );
        }
        assert!(
            !line.to_lowercase().contains("load average"),
            "README.md:{}: a load average belongs to docs/, not the user's guide",
            n + 1
        );
    }
}

/// The checker itself: a page with a missing file, a missing heading and a link inside
/// code; only the first two are reported.
#[test]
fn a_broken_link_is_reported() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("docs-links");
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    let page = dir.join("page.md");
    std::fs::write(
        &page,
        "# A page\n\n## Its `second` heading\n\nSee [there](missing.md), [here](#its-second-heading), \
         [nowhere](#no-such-heading) and `[code](missing-too.md)`.\n\n```\n[fenced](gone.md)\n```\n",
    )
    .expect("write the page");
    let broken = broken_links(std::slice::from_ref(&page));
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(broken[0].contains("missing.md") && broken[0].contains("does not exist"), "{broken:?}");
    assert!(broken[1].contains("#no-such-heading"), "{broken:?}");
}
