//! The README's library example is the crate documentation's doctest (engine/src/lib.rs), which
//! `cargo test` compiles and runs: the README block equals the doctest without its hidden `#`
//! lines.

use std::path::Path;

/// The first ```rust block after `heading` in `text`.
fn rust_block<'t>(text: &'t str, heading: &str) -> &'t str {
    let after = text
        .split(heading)
        .nth(1)
        .unwrap_or_else(|| panic!("no {heading:?}"));
    after
        .split("```rust\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .unwrap_or_else(|| panic!("no rust block after {heading:?}"))
}

#[test]
fn readme_library_example_is_the_crate_doctest() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("../README.md")).expect("README.md");
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).expect("lib.rs");
    // The crate docs without their `//! ` prefix.
    let docs: String = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| format!("{}\n", l.strip_prefix(' ').unwrap_or(l)))
        .collect();
    let doctest: String = rust_block(&docs, "Used as a library")
        .lines()
        .filter(|l| *l != "#" && !l.starts_with("# "))
        .map(|l| format!("{l}\n"))
        .collect();
    let shown = rust_block(&readme, "## Using the engine as a library");
    assert_eq!(
        shown, doctest,
        "README.md's library example differs from engine/src/lib.rs's doctest"
    );
}
