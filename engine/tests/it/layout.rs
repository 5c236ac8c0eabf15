//! The engine's layout as docs say it is: the packet walk of `docs/architecture.md` (its files
//! exist, it names at most six, every function a step names is defined in the step's file,
//! and the engine steps other files own are called from the worker loop in the walk's order),
//! one classify entry in `engine/src`, and no engine source file of more than 1,200 lines
//! (its tests apart) unless its head says why.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read_dir") {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The "## The packet walk" section of docs/architecture.md, split into its numbered steps.
fn walk_steps() -> Vec<String> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).expect("architecture");
    let start = doc
        .find("## The packet walk")
        .expect("a packet walk section");
    let section = &doc[start..];
    let section = &section[..section[3..].find("\n## ").map_or(section.len(), |e| e + 3)];
    let mut steps: Vec<String> = Vec::new();
    for line in section.lines() {
        let numbered = line
            .split_once(". **")
            .is_some_and(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        if numbered {
            steps.push(String::new());
        } else if line.trim().is_empty() || (steps.is_empty() || !line.starts_with("   ")) {
            if !steps.is_empty() && !line.trim().is_empty() {
                break; // prose after the list
            }
            continue;
        }
        if let Some(step) = steps.last_mut() {
            step.push_str(line.trim());
            step.push(' ');
        }
    }
    steps
}

/// Every `(`path`, `name`, ...)` of `step`: the path and the function names after it, up to the
/// closing parenthesis (names joined by `->` or `and` count too).
fn owned_names(step: &str) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    let mut rest = step;
    while let Some(at) = rest.find("(`") {
        let inner = &rest[at + 1..];
        let end = inner.find(')').unwrap_or(inner.len());
        let words: Vec<&str> = inner[..end].split('`').skip(1).step_by(2).collect();
        rest = &inner[end..];
        let Some((path, names)) = words.split_first() else {
            continue;
        };
        if !path.ends_with(".rs") {
            continue;
        }
        let is_fn = |w: &&&str| {
            let last = w.rsplit("::").next().unwrap_or(w);
            last.starts_with(|c: char| c.is_ascii_lowercase())
                && last
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        };
        let names = names.iter().filter(is_fn).map(|w| w.to_string()).collect();
        out.push((path.to_string(), names));
    }
    out
}

#[test]
fn packet_walk_is_six_files_that_define_what_it_names() {
    let steps = walk_steps();
    assert!(
        steps.len() >= 6,
        "the walk has its numbered steps: {steps:?}"
    );
    let mut files = BTreeSet::new();
    for (i, step) in steps.iter().enumerate() {
        let named = owned_names(step);
        assert!(!named.is_empty(), "step {} names its file: {step}", i + 1);
        for (path, names) in &named {
            files.insert(path.clone());
            let text = std::fs::read_to_string(root().join(path))
                .unwrap_or_else(|e| panic!("step {}: {path}: {e}", i + 1));
            for name in names {
                let f = name.rsplit("::").next().unwrap_or(name);
                assert!(
                    text.contains(&format!("fn {f}(")) || text.contains(&format!("fn {f}<")),
                    "step {}: {path} defines no fn {f}",
                    i + 1
                );
            }
        }
    }
    assert!(
        files.len() <= 6,
        "the packet walk spreads over {} files: {files:?}",
        files.len()
    );
}

/// The engine's steps that another file owns are calls from the engine's loop
/// (`engine/src/engine/worker.rs`), made in the order the walk lists them: the loop is the
/// one place a reader returns to. Calls inside `classify_batch` (the per-packet loop) are
/// checked for their order.
#[test]
fn engine_steps_are_calls_from_the_worker_loop_in_order() {
    const LOOP: &str = "engine/src/engine/worker.rs";
    let worker = std::fs::read_to_string(root().join(LOOP)).expect("worker.rs");
    let body = &worker[worker.find("fn classify_batch").expect("the classify loop")..];
    let mut last = 0;
    let mut called = 0;
    for (i, step) in walk_steps().iter().enumerate() {
        let named = owned_names(step);
        let Some((owner, names)) = named.first() else {
            continue;
        };
        // The server's steps (1, 10) and the loop's own; the first name is the call.
        if !owner.starts_with("engine/") || owner == LOOP {
            continue;
        }
        let name = names
            .first()
            .unwrap_or_else(|| panic!("step {} names a fn", i + 1));
        let call = format!(".{name}(");
        assert!(
            worker.contains(&call),
            "step {} ({owner} `{name}`) is not called from {LOOP}",
            i + 1
        );
        if let Some(at) = body.find(&call) {
            assert!(
                at >= last,
                "step {} (`{name}`) is called before the step it follows",
                i + 1
            );
            last = at;
            called += 1;
        }
    }
    assert!(called >= 4, "the per-packet loop calls its steps: {called}");
}

#[test]
fn one_classify_entry() {
    let mut files = Vec::new();
    rust_files(&root().join("engine/src"), &mut files);
    let mut entries = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).expect("read");
        for (n, line) in text.lines().enumerate() {
            if let Some(at) = line.find("fn classify") {
                let name: String = line[at + 3..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                entries.push(format!("{}:{}: {name}", f.display(), n + 1));
            }
        }
    }
    assert_eq!(entries.len(), 1, "classify entries: {entries:?}");
    assert!(entries[0].ends_with("classify_batch"), "{entries:?}");
}

#[test]
fn engine_files_under_1200_lines_or_say_why() {
    let mut files = Vec::new();
    rust_files(&root().join("engine/src"), &mut files);
    let mut long = Vec::new();
    for f in &files {
        if f.file_name().is_some_and(|n| n == "tests.rs") {
            continue;
        }
        let text = std::fs::read_to_string(f).expect("read");
        let code = text
            .split("\n#[cfg(test)]\nmod tests")
            .next()
            .unwrap_or(&text);
        let head: String = text.lines().take_while(|l| l.starts_with("//!")).collect();
        if code.lines().count() > 1200 && !head.contains("1,200 lines") {
            long.push(format!("{}: {} lines", f.display(), code.lines().count()));
        }
    }
    assert!(long.is_empty(), "engine files over 1,200 lines: {long:?}");
}
