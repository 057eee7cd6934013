//! The code blocks of the READMEs and the guide's main pages
//! (`docs/guide/`) and their compiled copies in `tests/outside/` (a crate
//! outside the workspace, built with the default features only, as a user
//! builds it) agree, line for line.
//!
//! - In `tests/outside/src/lib.rs`, each snippet sits between a
//!   `// README: <file>, "<section>"` line and a `// README: end` line; it
//!   must be the first `rust` block under that section's heading in that
//!   file (less the indentation of the marker).
//! - `tests/outside/src/bin/main.rs` is, whole, the first `rust` block of
//!   "A complete `main.rs`" in README.md and in docs/guide/axum.md, and
//!   `tests/outside/tests/handlers.rs` that of docs/guide/axum.md's
//!   "Testing your handlers with the guard".

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the repository")
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|error| panic!("{path}: {error}"))
}

/// The first ```` ```rust ```` block under the heading `section` of the
/// markdown file `path`, before the next heading.
fn block(path: &str, section: &str) -> String {
    let text = read(path);
    let mut lines = text.lines();
    lines
        .by_ref()
        .find(|line| line.starts_with('#') && line.trim_start_matches('#').trim() == section)
        .unwrap_or_else(|| panic!("{path} has no heading {section:?}"));
    let mut fenced = false;
    let mut code = Vec::new();
    for line in lines {
        if fenced {
            if line.trim_start().starts_with("```") {
                return code.join("\n");
            }
            code.push(line);
        } else if line.starts_with("```rust") {
            fenced = true;
        } else if line.starts_with('#') {
            break;
        }
    }
    panic!("{path} has no rust block under {section:?}")
}

/// The snippets of `tests/outside/src/lib.rs`: (file, section, code).
fn snippets() -> Vec<(String, String, String)> {
    let text = read("tests/outside/src/lib.rs");
    let mut found = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let Some(marker) = line.trim_start().strip_prefix("// README: ") else {
            continue;
        };
        if marker == "end" {
            panic!("a `// README: end` without its start in tests/outside/src/lib.rs");
        }
        let (file, section) = marker
            .split_once(", ")
            .unwrap_or_else(|| panic!("a marker is `// README: <file>, \"<section>\"`: {line}"));
        let indent = line.len() - line.trim_start().len();
        let code: Vec<&str> = lines
            .by_ref()
            .take_while(|line| line.trim() != "// README: end")
            .map(|line| line.get(indent..).unwrap_or("").trim_end())
            .collect();
        found.push((
            file.to_owned(),
            section.trim_matches('"').to_owned(),
            code.join("\n"),
        ));
    }
    found
}

#[test]
fn the_readme_snippets_are_the_compiled_ones() {
    let snippets = snippets();
    let files: Vec<&str> = snippets.iter().map(|(file, ..)| file.as_str()).collect();
    for page in [
        "client/README.md",
        "docs/guide/axum.md",
        "docs/guide/engine.md",
        "docs/guide/client.md",
    ] {
        assert!(
            files.contains(&page),
            "tests/outside/src/lib.rs must carry {page}'s snippet: {files:?}"
        );
    }
    for (file, section, code) in snippets {
        assert_eq!(
            block(&file, &section),
            code,
            "{file}, {section:?}: the README's block and tests/outside/src/lib.rs differ"
        );
    }
}

/// The sections (page, heading) whose first `rust` block is a whole file
/// of `tests/outside`.
const WHOLE_FILES: [(&str, &str, &str); 3] = [
    (
        "README.md",
        "A complete `main.rs`",
        "tests/outside/src/bin/main.rs",
    ),
    (
        "docs/guide/axum.md",
        "A complete `main.rs`",
        "tests/outside/src/bin/main.rs",
    ),
    (
        "docs/guide/axum.md",
        "Testing your handlers with the guard",
        "tests/outside/tests/handlers.rs",
    ),
];

#[test]
fn the_readme_whole_files_are_the_compiled_ones() {
    for (page, section, file) in WHOLE_FILES {
        assert_eq!(
            block(page, section),
            read(file).trim_end(),
            "{page}, {section:?}: the block and {file} differ"
        );
    }
}
