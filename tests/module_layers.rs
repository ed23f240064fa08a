//! The crate's top-level modules form layers: no module reaches, through any chain of `crate::`
//! paths, back to itself. An import cycle (pipeline ↔ worker, config ↔ worker, tui ↔ cli, …) is
//! how a restructuring quietly comes undone, so this test reads the source and names the first
//! cycle it finds with the file and line of every edge in it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One `crate::to` reference found in `from`'s files.
#[derive(Debug, Clone)]
struct Edge {
    file: PathBuf,
    line: usize,
}

type Graph = BTreeMap<String, BTreeMap<String, Edge>>;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The top-level module a file of `src/` belongs to (`src/role/critic/net.rs` → `role`).
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?;
    let first = rel.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (!matches!(name, "lib" | "main")).then(|| name.to_string())
}

/// Every `crate::name` in `text` outside line comments, with its line number.
fn crate_refs(text: &str) -> Vec<(String, usize)> {
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        let code = line.split("//").next().unwrap_or("");
        let mut rest = code;
        while let Some(at) = rest.find("crate::") {
            let after = &rest[at + "crate::".len()..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.push((name, i + 1));
            }
            rest = after;
        }
    }
    out
}

fn graph_of(src: &Path) -> Graph {
    let mut files = vec![];
    rust_files(src, &mut files);
    files.sort();
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(src, f)).collect();
    // Every module is a node, with or without edges.
    let mut graph: Graph = modules
        .iter()
        .map(|m| (m.clone(), BTreeMap::new()))
        .collect();
    for file in &files {
        let Some(from) = module_of(src, file) else {
            continue;
        };
        let text = std::fs::read_to_string(file).expect("readable source");
        for (to, line) in crate_refs(&text) {
            if to != from && modules.contains(&to) {
                let edge = Edge {
                    file: file.clone(),
                    line,
                };
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert(edge);
            }
        }
    }
    graph
}

/// A cycle as its modules in order (the first repeated at the end), if there is one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(c) = visit(next, graph, done, path) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in graph.keys() {
        if let Some(c) = visit(node, graph, &mut done, &mut vec![]) {
            return Some(c);
        }
    }
    None
}

fn describe(graph: &Graph, cycle: &[String]) -> String {
    cycle
        .windows(2)
        .map(|w| {
            let e = &graph[&w[0]][&w[1]];
            format!("  {} -> {} ({}:{})", w[0], w[1], e.file.display(), e.line)
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn the_top_level_modules_have_no_import_cycle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let graph = graph_of(&src);
    // The modules the layering is about must all be found, or the scan itself is broken.
    for m in [
        "config",
        "pipeline",
        "role",
        "worker",
        "scheduler",
        "data",
        "cli",
        "tui",
    ] {
        assert!(
            graph.contains_key(m),
            "module '{m}' not found in {}",
            src.display()
        );
    }
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "import cycle among top-level modules: {}\n{}",
            cycle.join(" -> "),
            describe(&graph, &cycle)
        );
    }
}

#[test]
fn a_cycle_is_found_and_named_with_its_edges() {
    let dir = tempfile::tempdir().expect("temp dir");
    let src = dir.path();
    std::fs::create_dir_all(src.join("b")).expect("dir");
    std::fs::write(src.join("a.rs"), "use crate::b::X;\n").expect("write");
    // A comment naming crate::a must not count; the use on line 2 does.
    std::fs::write(src.join("b/inner.rs"), "// crate::a\nuse crate::c::Y;\n").expect("write");
    std::fs::write(src.join("c.rs"), "fn f() { crate::a::g() }\n").expect("write");
    std::fs::write(src.join("d.rs"), "use crate::a::Z;\n").expect("write");
    let graph = graph_of(src);
    let cycle = find_cycle(&graph).expect("a -> b -> c -> a is a cycle");
    assert_eq!(cycle, ["a", "b", "c", "a"]);
    let text = describe(&graph, &cycle);
    assert!(text.contains("b -> c ("), "{text}");
    assert!(text.contains("inner.rs:2)"), "{text}");
    std::fs::write(src.join("c.rs"), "fn f() {}\n").expect("write");
    assert_eq!(find_cycle(&graph_of(src)), None);
}
