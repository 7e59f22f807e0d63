//! Every relative link in `README.md` and `docs/` leads somewhere: the file exists, and a
//! `#fragment` into a markdown file names one of its headings (GitHub's anchors). Links in code
//! blocks and code spans are text, not links, and are skipped; so are absolute URLs. And every
//! docs file the code names (a start-up warning, an error, a comment) exists.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The repository root (this crate lives in `tests/`).
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

/// `README.md` and every markdown file under `docs/`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut found = vec![root.join("README.md")];
    let mut folders = vec![root.join("docs")];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{}: {e}", folder.display())).path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// The lines of `text` that are prose: fenced code blocks left out, inline code spans blanked.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut fence: Option<&str> = None;
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|marker| trimmed.starts_with(marker));
        match (fence, marker) {
            (None, Some(marker)) => fence = Some(marker),
            (Some(open), Some(marker)) if open == marker => fence = None,
            (Some(_), _) => {}
            (None, None) => {
                // Even segments between backticks are prose; odd ones are code spans.
                let prose: String = line
                    .split('`')
                    .enumerate()
                    .map(|(i, part)| if i % 2 == 0 { part.to_string() } else { " ".repeat(part.len()) })
                    .collect::<Vec<_>>()
                    .join(" ");
                lines.push((index + 1, prose));
            }
        }
    }
    lines
}

/// Link targets on one prose line: inline links and images `[text](target "title")` and
/// reference definitions `[label]: target`.
fn targets(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = line;
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let mut depth = 0usize;
        let end = after
            .char_indices()
            .find(|&(_, c)| match c {
                '(' => {
                    depth += 1;
                    false
                }
                ')' if depth == 0 => true,
                ')' => {
                    depth -= 1;
                    false
                }
                _ => false,
            })
            .map_or(after.len(), |(i, _)| i);
        let inside = after[..end].trim();
        let target = inside
            .strip_prefix('<')
            .and_then(|t| t.split_once('>'))
            .map_or_else(|| inside.split_whitespace().next().unwrap_or_default(), |(target, _)| target);
        found.push(target.to_string());
        rest = &after[end..];
    }
    let trimmed = line.trim_start();
    if line.len() - trimmed.len() <= 3
        && let Some(definition) = trimmed.strip_prefix('[')
        && let Some((_, target)) = definition.split_once("]:")
        && let Some(target) = target.split_whitespace().next()
    {
        found.push(target.to_string());
    }
    found
}

/// Whether `target` leaves the repository: a URL with a scheme (`https:`, `mailto:`).
fn is_external(target: &str) -> bool {
    target.starts_with("//")
        || target.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty() && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        })
}

/// GitHub's anchor for a heading: lowercase, punctuation dropped, spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a markdown file's headings, with GitHub's `-1`, `-2` for repeats.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    // Not `prose_lines`: a heading keeps its code spans (`limits:` counts as `limits`).
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    let mut fence: Option<&str> = None;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if let Some(marker) = ["```", "~~~"].into_iter().find(|marker| trimmed.starts_with(marker)) {
            fence = match fence {
                None => Some(marker),
                Some(open) if open == marker => None,
                other => other,
            };
            continue;
        }
        if fence.is_some() {
            continue;
        }
        let level = line.chars().take_while(|&c| c == '#').count();
        let Some(heading) = line.get(level..).filter(|h| (1..=6).contains(&level) && h.starts_with(' ')) else {
            continue;
        };
        // A link in a heading counts by its text: `[text](target)` becomes `text`.
        let heading = heading.trim().trim_end_matches('#').trim();
        let mut text_only = String::new();
        let mut rest = heading;
        while let Some(open) = rest.find('[') {
            match rest[open..].find("](").and_then(|mid| rest[open + mid..].find(')').map(|close| (mid, close))) {
                Some((mid, close)) => {
                    text_only.push_str(&rest[..open]);
                    text_only.push_str(&rest[open + 1..open + mid]);
                    rest = &rest[open + mid + close + 1..];
                }
                None => break,
            }
        }
        text_only.push_str(rest);
        let base = slug(&text_only);
        let count = counts.entry(base.clone()).or_default();
        seen.insert(if *count == 0 { base } else { format!("{base}-{count}") });
        *count += 1;
    }
    seen
}

#[test]
fn every_relative_link_in_the_readme_and_docs_leads_to_a_file_and_heading_that_exist() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for document in documents(&root) {
        let text = std::fs::read_to_string(&document).unwrap_or_else(|e| panic!("{}: {e}", document.display()));
        let shown = document.strip_prefix(&root).unwrap_or(&document).display().to_string();
        for (line, prose) in prose_lines(&text) {
            for target in targets(&prose) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                checked += 1;
                let (path, fragment) = target.split_once('#').unwrap_or((&target, ""));
                let path = path.split_once('?').map_or(path, |(path, _)| path);
                let file =
                    if path.is_empty() { document.clone() } else { document.parent().unwrap_or(&root).join(path) };
                if !file.exists() {
                    broken.push(format!("{shown}:{line}: `{target}`: {} does not exist", file.display()));
                    continue;
                }
                if !fragment.is_empty() && file.extension().is_some_and(|ext| ext == "md") {
                    let linked = std::fs::read_to_string(&file).unwrap_or_default();
                    if !anchors(&linked).contains(fragment) {
                        broken.push(format!("{shown}:{line}: `{target}`: no heading with the anchor `#{fragment}`"));
                    }
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} relative links found: is the link reader broken?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_reader_finds_links_and_skips_code_and_urls() {
    let text = "See [a](a.md#x-y) and ![i](img/p.svg \"t\") and `[no](code.md)`.\n\
                ```\n[no](fenced.md)\n```\n[ref]: ref.md\n[u](https://example.com/x.md)\n";
    let found: Vec<String> =
        prose_lines(text).iter().flat_map(|(_, line)| targets(line)).filter(|t| !is_external(t)).collect();
    assert_eq!(found, ["a.md#x-y", "img/p.svg", "ref.md"]);
    let headings = "# Top\n## REST limits (`limits:` in the gateway config)\n## Top\n```\n# not\n```\n\
                    ## Users: authentication, authorization and secret values\n";
    let anchors = anchors(headings);
    for anchor in [
        "top",
        "top-1",
        "rest-limits-limits-in-the-gateway-config",
        "users-authentication-authorization-and-secret-values",
    ] {
        assert!(anchors.contains(anchor), "{anchor} missing from {anchors:?}");
    }
    assert!(!anchors.contains("not"));
}

/// Every `.rs` file of the workspace's crates (the `target` and `fuzz` folders left out).
fn sources(root: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut folders = vec![root.to_path_buf()];
    while let Some(folder) = folders.pop() {
        let entries = std::fs::read_dir(&folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
        for entry in entries {
            let path = entry.unwrap_or_else(|e| panic!("{}: {e}", folder.display())).path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            if path.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "fuzz" && name != "node_modules" {
                    folders.push(path);
                }
            } else if name.ends_with(".rs") {
                found.push(path);
            }
        }
    }
    found
}

/// The `docs/….md` paths named in `text` (warnings, errors and comments point users there),
/// each with the `#anchor` that follows it, if any. A path after `/` or a word character
/// (`../docs/`, `mydocs/`) is not one: relative includes are checked by the compiler.
fn docs_paths(text: &str) -> Vec<(String, Option<String>)> {
    let mut paths = Vec::new();
    for (at, _) in text.match_indices("docs/") {
        if text[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_' || c == '-' || c == '/') {
            continue;
        }
        let path: String =
            text[at..].chars().take_while(|c| c.is_alphanumeric() || matches!(c, '/' | '.' | '_' | '-')).collect();
        if let Some(end) = path.find(".md") {
            let after = &text[at + end + 3..];
            let anchor = after.strip_prefix('#').map(|rest| {
                rest.chars().take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-').collect()
            });
            paths.push((path[..end + 3].to_string(), anchor.filter(|a: &String| !a.is_empty())));
        }
    }
    paths
}

#[test]
fn every_docs_file_and_heading_the_code_names_exists() {
    let root = root();
    let mut missing = Vec::new();
    let mut checked = 0;
    // This file's own examples name files that do not exist, on purpose.
    for source in sources(&root).into_iter().filter(|s| !s.ends_with("tests/tests/docs_links.rs")) {
        let text = std::fs::read_to_string(&source).unwrap_or_else(|e| panic!("{}: {e}", source.display()));
        for (path, anchor) in docs_paths(&text) {
            checked += 1;
            let file = root.join(&path);
            if !file.is_file() {
                missing.push(format!("{}: names {path}, which does not exist", source.display()));
            } else if let Some(anchor) = anchor {
                let linked = std::fs::read_to_string(&file).unwrap_or_default();
                if !anchors(&linked).contains(&anchor) {
                    missing.push(format!("{}: names {path}#{anchor}, a heading it does not have", source.display()));
                }
            }
        }
    }
    assert!(checked > 20, "only {checked} docs paths found in the code: is the reader broken?");
    assert!(missing.is_empty(), "{}", missing.join("\n"));
}

#[test]
fn the_docs_path_reader_finds_paths_and_anchors_in_strings_and_comments() {
    let text = "see docs/security.md#users-and-roles and (docs/security/tls.md) but not mydocs/x.md or src/docs/y.md";
    let found = docs_paths(text);
    assert_eq!(
        found,
        [
            ("docs/security.md".to_string(), Some("users-and-roles".to_string())),
            ("docs/security/tls.md".to_string(), None)
        ]
    );
}
