//! The shape the architecture document promises stays true: inside the core, the placement
//! crate, `meridian-proto`, the gateway and the agent, files (gateway and agent: modules) import
//! one another one way only (no file circle), and the pure crates build without the wire edge. A circle added later fails here, naming the files on it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a failed unwrap is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A crate's top-level modules and, for each, the other top-level modules its non-test code
/// names through `crate::` (or `super::` from a nested file, which is its own module). `lib.rs`
/// is the node `lib`.
fn module_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    collect(src, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| top_module(src, f)).collect();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for file in &files {
        let module = top_module(src, file);
        if is_test_file(src, file) {
            continue;
        }
        let text = std::fs::read_to_string(file).unwrap();
        let code = production_code(&text);
        let deps = graph.entry(module.clone()).or_default();
        let mut named = crate_paths(&code);
        if module == "lib" {
            // The crate root names its modules without `crate::`.
            named.extend(relative_paths(&code).into_iter().filter(|name| modules.contains(name)));
        }
        for name in named {
            let target = if modules.contains(&name) { name } else { "lib".to_string() };
            if target != module {
                deps.insert(target);
            }
        }
    }
    graph
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// `fit/scan.rs` and `fit.rs` are module `fit`; `lib.rs` is `lib`.
fn top_module(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    first.trim_end_matches(".rs").to_string()
}

/// Test files may use everything: `tests.rs`, `*_tests.rs`, anything under a `tests/` folder.
fn is_test_file(src: &Path, file: &Path) -> bool {
    let relative = file.strip_prefix(src).unwrap();
    relative.components().any(|part| {
        let name = part.as_os_str().to_string_lossy();
        let stem = name.trim_end_matches(".rs");
        stem == "tests" || stem.ends_with("_tests")
    })
}

/// The text without comments and without the file's inline test module (`#[cfg(test)]`, maybe
/// more attributes, then `mod … {`).
fn production_code(text: &str) -> String {
    let code: Vec<&str> = text.lines().map(|line| line.split("//").next().unwrap_or("")).collect();
    let mut end = code.len();
    for (i, line) in code.iter().enumerate() {
        if line.trim() == "#[cfg(test)]" {
            let next = code[i + 1..].iter().map(|l| l.trim()).find(|l| !l.is_empty() && !l.starts_with("#["));
            if next.is_some_and(|l| l.starts_with("mod ") && l.ends_with('{')) {
                end = i;
                break;
            }
        }
    }
    code[..end].join("\n")
}

/// Every identifier directly followed by `::` that is not itself after `::` (`fit::Nodes`).
fn relative_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("::") {
        let before = &code[..at];
        let start = before.rfind(|c: char| !(c.is_alphanumeric() || c == '_')).map_or(0, |i| i + 1);
        if !before[..start].ends_with("::") {
            names.insert(before[start..].to_string());
        }
    }
    names
}

/// The first segment after every `crate::`, including each name of a `crate::{a, b::c}` group.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut item_start = true;
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && (c.is_alphanumeric() || c == '_') => {
                        names.insert(ident(&group[i..]));
                        item_start = false;
                    }
                    _ => {}
                }
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names.retain(|n| !n.is_empty() && n != "self");
    names
}

fn ident(text: &str) -> String {
    text.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
}

/// Every circle found by a depth-first walk, each as the list of modules on it.
fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
        found: &mut Vec<Vec<String>>,
    ) {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let start = stack.iter().position(|n| n == next).unwrap_or(0);
                    let mut circle = stack[start..].to_vec();
                    circle.push(next.clone());
                    found.push(circle);
                }
                Some(_) => {}
                None => visit(next, graph, state, stack, found),
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
    }
    let (mut state, mut stack, mut found) = (BTreeMap::new(), Vec::new(), Vec::new());
    for node in graph.keys() {
        if !state.contains_key(node.as_str()) {
            visit(node, graph, &mut state, &mut stack, &mut found);
        }
    }
    found
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn assert_no_circles(crate_src: &str) {
    let graph = module_graph(&workspace().join(crate_src));
    assert!(graph.len() > 5, "{crate_src}: too few modules found ({graph:?})");
    let found = circles(&graph);
    assert!(
        found.is_empty(),
        "{crate_src}: file circles (docs/architecture.md, module maps, says imports run one way):\n{}",
        found.iter().map(|c| c.join(" → ")).collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn the_core_files_import_one_way() {
    assert_no_circles("gateway/core/src");
}

#[test]
fn the_placement_files_import_one_way() {
    assert_no_circles("gateway/placement/src");
}

#[test]
fn the_proto_files_import_one_way() {
    assert_no_circles("proto/src");
}

#[test]
fn the_agent_modules_import_one_way() {
    assert_no_circles("member-agent/src");
}

#[test]
fn the_gateway_modules_import_one_way() {
    assert_no_circles("gateway/src");
}

#[test]
fn the_circle_check_finds_a_circle() {
    let graph = BTreeMap::from([
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
        ("d".to_string(), BTreeSet::from(["a".to_string()])),
    ]);
    assert_eq!(circles(&graph), [["a", "b", "c", "a"]]);
    let code = "use crate::{alpha::X, beta, gamma::{self, Y}};\nuse crate::delta::Z; // crate::comment\n";
    assert_eq!(
        crate_paths(&production_code(code)),
        BTreeSet::from(["alpha", "beta", "delta", "gamma"].map(String::from))
    );
}

#[test]
fn the_pure_crates_build_without_the_wire_edge() {
    for manifest in ["gateway/core", "gateway/placement", "gateway/sim", "member-agent/scheduler"] {
        let text = std::fs::read_to_string(workspace().join(manifest).join("Cargo.toml")).unwrap();
        let dependencies = text.split("[dependencies]").nth(1).unwrap_or("").split("\n[").next().unwrap_or("");
        for line in dependencies.lines().filter(|l| l.starts_with("meridian-proto")) {
            assert!(
                !line.contains("grpc") && !line.contains("wire"),
                "{manifest} asks meridian-proto for the wire edge: {line}"
            );
        }
        for edge in ["prost", "tonic", "axum", "tokio"] {
            assert!(
                !dependencies.lines().any(|l| l.starts_with(&format!("{edge} ")) || l.starts_with(&format!("{edge}."))),
                "{manifest} depends on {edge}"
            );
        }
    }
    let workspace_manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let proto = workspace_manifest.lines().find(|l| l.starts_with("meridian-proto ")).unwrap();
    assert!(proto.contains("default-features = false"), "the workspace must declare meridian-proto lean: {proto}");
}
