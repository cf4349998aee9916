//! The stage order of `src/`: each stage uses only the stages before it,
//! so data flow one way, from an array's description to the commands.
//! A file's stage is its folder under `src/` (or its name, for `error.rs`);
//! a use of a later stage (`crate::view` from `engine/`) is refused here.
//! Test modules are left out: a test may drive its stage with any other.

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
