//! The crate's modules depend on each other one way: no import circle (a module that reaches
//! itself through `crate::` paths), so each can be read, tested and changed knowing only
//! those it builds on.

use std::collections::BTreeMap;
use std::path::Path;

/// The `crate::<module>` paths a source file uses in code (comments and doc links are not
/// dependencies), grouped `use crate::{a::.., b::..}` included.
fn dependencies(source: &str) -> Vec<String> {
    let code: String =
        source.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    let ident = |s: &str| -> String {
        s.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect()
    };
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let rest = &code[at + "crate::".len()..];
        let Some(group) = rest.strip_prefix('{') else {
            out.push(ident(rest));
            continue;
        };
        // `crate::{a::x, b::{y, z}, c}`: the first name of each item at the top level.
        let mut depth = 0;
        let mut item_start = true;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => item_start = true,
                c if item_start && (c.is_alphanumeric() || c == '_') => {
                    out.push(ident(&group[i..]));
                    item_start = false;
                }
                _ => {}
            }
        }
    }
    out.retain(|m| !m.is_empty());
    out.sort();
    out.dedup();
    out
}

/// A path of modules that leads from one back to itself, if any.
fn circle(graph: &BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, Vec<String>>,
        module: &str,
        path: &mut Vec<String>,
        done: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|m| m == module) {
            let mut found = path[start..].to_vec();
            found.push(module.to_string());
            return Some(found);
        }
        if done.iter().any(|m| m == module) {
            return None;
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(found) = visit(graph, next, path, done) {
                return Some(found);
            }
        }
        path.pop();
        done.push(module.to_string());
        None
    }
    let mut done = Vec::new();
    graph.keys().find_map(|m| visit(graph, m, &mut Vec::new(), &mut done))
}

#[test]
fn the_fusion_modules_import_each_other_one_way() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = BTreeMap::new();
    for entry in std::fs::read_dir(&src).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "rs") {
            let module = path.file_stem().unwrap().to_string_lossy().to_string();
            let mut uses = dependencies(&std::fs::read_to_string(&path).unwrap());
            uses.retain(|m| *m != module);
            graph.insert(module, uses);
        }
    }
    assert!(graph.contains_key("plan") && graph.contains_key("shard"), "{graph:?}");
    assert!(graph["plan"].contains(&"shard".to_string()), "the plan calls the sharding planner");
    if let Some(found) = circle(&graph) {
        panic!("import circle among fusion's modules: {}", found.join(" -> "));
    }
}

#[test]
fn dependencies_read_grouped_uses_and_skip_comments() {
    let source = "//! [`crate::report`]\nuse crate::{\n    layout::{A, B},\n    plan::{C, D},\n};\nuse crate::shard::{self, E};\n/// [`crate::emit`]\n#[serde(serialize_with = \"crate::layout::display\")]\n";
    assert_eq!(dependencies(source), ["layout", "plan", "shard"]);
}
