//! The stage order of `src/`: each stage uses only the stages before it,
//! so data flow one way, from an array's description to the commands.
//! A file's stage is its folder under `src/` (or its name, for `error.rs`);
//! a use of a later stage (`crate::view` from `engine/`) is refused here.
//! Test modules are left out: a test may drive its stage with any other.
//!
//! Within and across stages, files import each other one way too: the
//! file-level import graph (every `crate::`, `super::`, `self::` path, and
//! a module's paths into its child modules) has no cycle beyond the known
//! ones listed in [`KNOWN_CYCLES`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The stages, earliest first.
const STAGES: &[&str] = &[
    "error", "sys", "array", "format", "input", "plan", "engine", "output", "view", "http", "fuse",
    "cli",
];

/// One reference from a stage to a later one.
#[derive(Debug, PartialEq)]
struct Upward {
    file: String,
    line: usize,
    from: &'static str,
    to: &'static str,
}

fn stage_rank(name: &str) -> Option<usize> {
    STAGES.iter().position(|s| *s == name)
}

/// The stage a source file belongs to, from its path relative to `src/`;
/// `None` for the crate roots (`lib.rs`, `main.rs`), which see everything.
fn stage_of(relative: &Path) -> Option<usize> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    stage_rank(name)
}

/// The code of a line without its comment; a `//` inside a string literal
/// (an odd number of quotes before it) is kept.
fn code_of(line: &str) -> &str {
    let mut from = 0;
    while let Some(at) = line[from..].find("//") {
        let at = from + at;
        if line[..at].matches('"').count() % 2 == 0 {
            return &line[..at];
        }
        from = at + 2;
    }
    line
}

/// Every `crate::STAGE` in `source` (up to its test module) that names a
/// stage later than `rank`.
fn upward_references(file: &str, rank: usize, source: &str) -> Vec<Upward> {
    let body = source.split("\n#[cfg(test)]").next().unwrap_or(source);
    let mut found = Vec::new();
    for (n, line) in body.lines().enumerate() {
        let code = code_of(line);
        for (at, _) in code.match_indices("crate::") {
            let boundary = at == 0 || !code.as_bytes()[at - 1].is_ascii_alphanumeric();
            let name: String = code[at + "crate::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            match stage_rank(&name) {
                Some(target) if boundary && target > rank => found.push(Upward {
                    file: file.to_string(),
                    line: n + 1,
                    from: STAGES[rank],
                    to: STAGES[target],
                }),
                _ => {}
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("listing src").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_stage_uses_only_earlier_stages() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut staged = 0;
    let mut upward = Vec::new();
    for path in &files {
        let relative = path.strip_prefix(&src).expect("under src");
        let Some(rank) = stage_of(relative) else {
            continue;
        };
        staged += 1;
        let source = std::fs::read_to_string(path).expect("read source");
        upward.extend(upward_references(
            &relative.display().to_string(),
            rank,
            &source,
        ));
    }
    assert!(
        staged >= 30,
        "only {staged} source files found under {}",
        src.display()
    );
    let listing: Vec<String> = upward
        .iter()
        .map(|u| format!("src/{}:{}: {} uses {}", u.file, u.line, u.from, u.to))
        .collect();
    assert!(
        upward.is_empty(),
        "stages must use only earlier ones ({}):\n{}",
        STAGES.join(" < "),
        listing.join("\n")
    );
}

#[test]
fn every_folder_and_root_module_under_src_is_a_known_stage() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let entries = std::fs::read_dir(&src).expect("list src");
    for entry in entries {
        let name = entry.expect("listing src").file_name();
        let name = name.to_string_lossy();
        let stem = name.strip_suffix(".rs").unwrap_or(&name);
        assert!(
            stage_rank(stem).is_some() || stem == "lib" || stem == "main",
            "src/{name} belongs to no stage: add it to a stage folder, or to STAGES in {}",
            file!()
        );
    }
}

#[test]
fn an_upward_use_is_caught() {
    let engine = stage_rank("engine").expect("engine is a stage");
    let source = "use crate::plan::Plan;\n\
                  use crate::view::ViewCore; // the view is later\n\
                  // crate::cli in a comment is no use\n\
                  let url = \"http://x\"; crate::fuse::mount();\n\
                  fn f() { mycrate::cli::run(); }\n\
                  #[cfg(test)]\nmod tests { use crate::cli::run; }\n";
    let found = upward_references("engine/mod.rs", engine, source);
    assert_eq!(
        found,
        vec![
            Upward {
                file: "engine/mod.rs".into(),
                line: 2,
                from: "engine",
                to: "view"
            },
            Upward {
                file: "engine/mod.rs".into(),
                line: 4,
                from: "engine",
                to: "fuse"
            },
        ]
    );
}

/// Import cycles between files that are still to be broken, each as the
/// set of files (relative to `src/`) of one strongly connected part of the
/// import graph. The check fails on any other cycle, and on an entry here
/// that no longer is one (remove it then): the list only shrinks. Most run
/// through a stage's `mod.rs`, which both holds types its files import and
/// uses those files.
const KNOWN_CYCLES: &[&[&str]] = &[];

/// A source file's module path from the crate root: `format/minc/mod.rs`
/// is `format::minc`, `format/hdf5.rs` is `format::hdf5`, `lib.rs` is the root.
fn module_of(relative: &str) -> Vec<String> {
    let trimmed = relative.strip_suffix(".rs").unwrap_or(relative);
    let mut segments: Vec<String> = trimmed.split('/').map(str::to_string).collect();
    if matches!(segments.last().map(String::as_str), Some("mod" | "lib")) {
        segments.pop();
    }
    segments
}

/// The file that defines module `path`, if one does.
fn module_file(files: &BTreeSet<String>, path: &[String]) -> Option<String> {
    if path.is_empty() {
        return Some("lib.rs".to_string());
    }
    let joined = path.join("/");
    [format!("{joined}.rs"), format!("{joined}/mod.rs")]
        .into_iter()
        .find(|candidate| files.contains(candidate))
}

/// The file an item path from the crate root lives in: the deepest prefix
/// of it that is a module (an item of `format/mod.rs` is in that file).
fn file_of(files: &BTreeSet<String>, path: &[String]) -> Option<String> {
    (0..=path.len())
        .rev()
        .find_map(|len| module_file(files, &path[..len]))
}

/// The full paths a path starting at `text` names, with `use` groups
/// (`a::{b, c::{d, e}}`) expanded; each a list of segments.
fn expand_path(text: &str) -> (Vec<Vec<String>>, usize) {
    let bytes = text.as_bytes();
    let mut at = 0;
    let mut segments = Vec::new();
    loop {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        if at < bytes.len() && bytes[at] == b'{' {
            at += 1;
            let mut all = Vec::new();
            loop {
                let (inner, used) = expand_path(&text[at..]);
                at += used;
                for tail in inner {
                    let mut full = segments.clone();
                    full.extend(tail.into_iter().filter(|s| s != "self"));
                    all.push(full);
                }
                while at < bytes.len() && bytes[at] != b',' && bytes[at] != b'}' {
                    at += 1;
                }
                if at >= bytes.len() || bytes[at] == b'}' {
                    return (all, (at + 1).min(bytes.len()));
                }
                at += 1;
            }
        }
        let start = at;
        while at < bytes.len() && (bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_') {
            at += 1;
        }
        if at == start {
            // `*`, or a group's trailing comma: the path so far.
            return (vec![segments], at);
        }
        segments.push(text[start..at].to_string());
        if !text[at..].starts_with("::") {
            return (vec![segments], at);
        }
        at += 2;
    }
}

/// The files `relative` imports: every path from `crate::`, `super::` or
/// `self::`, and (in a module's own file) every path into its child
/// modules, up to its test module. `files` are all of `src/`'s.
fn imports_of(relative: &str, source: &str, files: &BTreeSet<String>) -> BTreeSet<String> {
    let body = source.split("\n#[cfg(test)]").next().unwrap_or(source);
    let code: String = body.lines().map(|l| format!("{}\n", code_of(l))).collect();
    let module = module_of(relative);
    let is_module_file = relative == "lib.rs" || relative.ends_with("/mod.rs");
    let bytes = code.as_bytes();
    let mut found = BTreeSet::new();
    let mut at = 0;
    while at < bytes.len() {
        let ident = bytes[at].is_ascii_alphanumeric() || bytes[at] == b'_';
        let starts = ident
            && (at == 0 || {
                let before = bytes[at - 1];
                !(before.is_ascii_alphanumeric() || before == b'_' || before == b':')
            });
        if !starts {
            at += 1;
            continue;
        }
        let (paths, used) = expand_path(&code[at..]);
        // `pub(super)`, `pub(in crate::format)` say where an item is seen:
        // no import.
        let before = code[..at].trim_end();
        let visibility = before.ends_with("pub(") || before.ends_with("(in");
        at += used.max(1);
        if visibility {
            continue;
        }
        for path in paths {
            let Some(first) = path.first() else { continue };
            let mut absolute = match first.as_str() {
                "crate" => Vec::new(),
                "self" => module.clone(),
                "super" => {
                    let mut base = module.clone();
                    let mut rest = path.iter().skip(1);
                    base.pop();
                    let mut next = rest.next();
                    while next.is_some_and(|s| s == "super") {
                        base.pop();
                        next = rest.next();
                    }
                    let mut full = base;
                    full.extend(next.cloned());
                    full.extend(rest.cloned());
                    if let Some(file) = file_of(files, &full) {
                        found.insert(file);
                    }
                    continue;
                }
                child if is_module_file && path.len() > 1 => {
                    let mut candidate = module.clone();
                    candidate.push(child.to_string());
                    if module_file(files, &candidate).is_none() {
                        continue;
                    }
                    module.clone()
                }
                _ => continue,
            };
            let skip = usize::from(first == "crate" || first == "self");
            absolute.extend(path[skip..].iter().cloned());
            if let Some(file) = file_of(files, &absolute) {
                found.insert(file);
            }
        }
    }
    found.remove(relative);
    found
}

/// The strongly connected parts of more than one file (Tarjan's).
fn cycles_of(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<BTreeSet<String>> {
    struct Walk<'a> {
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        parts: Vec<BTreeSet<String>>,
    }
    impl<'a> Walk<'a> {
        fn visit(&mut self, file: &'a str) {
            let n = self.index.len();
            self.index.insert(file, n);
            self.low.insert(file, n);
            self.stack.push(file);
            self.on_stack.insert(file);
            for next in self.graph.get(file).into_iter().flatten() {
                let next = next.as_str();
                if !self.index.contains_key(next) {
                    self.visit(next);
                    let low = self.low[file].min(self.low[next]);
                    self.low.insert(file, low);
                } else if self.on_stack.contains(next) {
                    let low = self.low[file].min(self.index[next]);
                    self.low.insert(file, low);
                }
            }
            if self.low[file] == self.index[file] {
                let mut part = BTreeSet::new();
                while let Some(top) = self.stack.pop() {
                    self.on_stack.remove(top);
                    part.insert(top.to_string());
                    if top == file {
                        break;
                    }
                }
                if part.len() > 1 {
                    self.parts.push(part);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        parts: Vec::new(),
    };
    for file in graph.keys() {
        if !walk.index.contains_key(file.as_str()) {
            walk.visit(file);
        }
    }
    walk.parts
}

/// One cycle through `part`, from its first file back to it, for messages.
fn cycle_through(graph: &BTreeMap<String, BTreeSet<String>>, part: &BTreeSet<String>) -> String {
    let Some(start) = part.iter().next() else {
        return String::new();
    };
    // Breadth-first from `start`'s imports back to `start`, within `part`.
    let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.as_str()]);
    while let Some(file) = queue.pop_front() {
        for next in graph.get(file).into_iter().flatten() {
            if !part.contains(next) || came_from.contains_key(next.as_str()) {
                continue;
            }
            came_from.insert(next, file);
            if next == start {
                queue.clear();
                break;
            }
            queue.push_back(next);
        }
    }
    let mut path = vec![start.as_str()];
    let mut file = came_from.get(start.as_str()).copied();
    while let Some(f) = file {
        path.push(f);
        if f == start {
            break;
        }
        file = came_from.get(f).copied();
    }
    path.reverse();
    path.join(" -> ")
}

/// Every file under `src/` but the crate roots' `main.rs` and files only
/// compiled for tests (`#[cfg(test)] mod NAME;`), by path relative to `src/`.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut paths = Vec::new();
    rust_files(&src, &mut paths);
    let sources: BTreeMap<String, String> = paths
        .iter()
        .map(|path| {
            let relative = path.strip_prefix(&src).expect("under src");
            let source = std::fs::read_to_string(path).expect("read source");
            (relative.display().to_string(), source)
        })
        .filter(|(relative, _)| relative != "main.rs")
        .collect();
    let test_only: BTreeSet<String> = sources
        .iter()
        .flat_map(|(relative, source)| {
            let dir = module_of(relative).join("/");
            let lines: Vec<&str> = source.lines().collect();
            lines
                .windows(2)
                .filter(|pair| pair[0].trim() == "#[cfg(test)]")
                .filter_map(|pair| {
                    let name = pair[1].trim().strip_prefix("mod ")?.strip_suffix(';')?;
                    let dir = if dir.is_empty() {
                        String::new()
                    } else {
                        format!("{dir}/")
                    };
                    Some(format!("{dir}{name}.rs"))
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let files: BTreeSet<String> = sources.keys().cloned().collect();
    sources
        .iter()
        .filter(|(relative, _)| !test_only.contains(*relative))
        .map(|(relative, source)| (relative.clone(), imports_of(relative, source, &files)))
        .collect()
}

#[test]
fn no_two_files_import_each_other() {
    let graph = import_graph();
    let edges: usize = graph.values().map(BTreeSet::len).sum();
    assert!(
        graph.len() >= 30 && edges >= 100,
        "only {} files and {edges} imports found under src/",
        graph.len()
    );
    let found = cycles_of(&graph);
    let known: Vec<BTreeSet<String>> = KNOWN_CYCLES
        .iter()
        .map(|part| part.iter().map(|f| f.to_string()).collect())
        .collect();
    let new: Vec<String> = found
        .iter()
        .filter(|part| !known.contains(part))
        .map(|part| {
            format!(
                "{{{}}}, e.g. {}",
                part.iter().cloned().collect::<Vec<_>>().join(", "),
                cycle_through(&graph, part)
            )
        })
        .collect();
    let gone: Vec<String> = known
        .iter()
        .filter(|part| !found.contains(part))
        .map(|part| part.iter().cloned().collect::<Vec<_>>().join(", "))
        .collect();
    assert!(
        new.is_empty(),
        "files import each other (import one way: move what both need into a file \
         below both):\n{}",
        new.join("\n")
    );
    assert!(
        gone.is_empty(),
        "no longer a cycle, remove from KNOWN_CYCLES in {}:\n{}",
        file!(),
        gone.join("\n")
    );
}

#[test]
fn imports_are_read_from_paths_groups_and_child_modules() {
    let files: BTreeSet<String> = [
        "lib.rs",
        "format/mod.rs",
        "format/block.rs",
        "format/hdf5.rs",
        "format/minc/mod.rs",
        "format/minc/scaled.rs",
        "array/mod.rs",
        "array/dtype.rs",
        "view/mod.rs",
    ]
    .iter()
    .map(|f| f.to_string())
    .collect();
    let scaled = "use super::{IMAGE, dtype_range};\n\
                  use crate::format::{block::{BlockInfo, Storage}, hdf5};\n\
                  fn f() -> crate::DType { crate::array::dtype::DType::new() }\n\
                  use ::hdf5::sync::sync; // crate::view is a comment\n\
                  pub(super) fn g() {}\npub(in crate::view) fn h() {}\n\
                  #[cfg(test)]\nmod tests { use crate::view::View; }\n";
    let found = imports_of("format/minc/scaled.rs", scaled, &files);
    let expected: BTreeSet<String> = [
        "format/minc/mod.rs",
        "format/block.rs",
        "format/hdf5.rs",
        "lib.rs",
        "array/dtype.rs",
    ]
    .iter()
    .map(|f| f.to_string())
    .collect();
    assert_eq!(found, expected);
    let module =
        "pub use block::BlockFormat;\nfn p() { hdf5::probe(); ::hdf5::x(); minc::IMAGE }\n\
                  use super::array;\n";
    let found = imports_of("format/mod.rs", module, &files);
    let expected: BTreeSet<String> = [
        "format/block.rs",
        "format/hdf5.rs",
        "format/minc/mod.rs",
        "array/mod.rs",
    ]
    .iter()
    .map(|f| f.to_string())
    .collect();
    assert_eq!(found, expected);
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a.rs", vec!["b.rs"]),
        ("b.rs", vec!["c.rs"]),
        ("c.rs", vec!["a.rs", "d.rs"]),
        ("d.rs", vec![]),
    ]
    .into_iter()
    .map(|(f, to)| (f.to_string(), to.into_iter().map(str::to_string).collect()))
    .collect();
    let parts = cycles_of(&graph);
    assert_eq!(parts.len(), 1);
    assert_eq!(
        cycle_through(&graph, &parts[0]),
        "a.rs -> b.rs -> c.rs -> a.rs"
    );
}
