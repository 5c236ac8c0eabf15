//! Every fenced code block of README.md and docs/*.md is either run by a test or says why not
//! (CONTRIBUTING.md, "Code blocks in the docs"): `every_doc_block_is_run_or_says_why` reads
//! them all and holds each against [`RUN`], the table of the blocks meant to run and the test
//! that runs each, and [`NO_RUN`], the reasons a `sh no-run=REASON` block may give.
//!
//! The blocks this file runs, as a new user would run them, each in a sandbox of its own
//! ([`sandbox`]: private mount, network and PID namespaces, so the docs' fixed ports, sockets
//! and /tmp paths are the test's own whatever else runs on the machine, and every process a
//! block leaves running ends with it), with `sh -e` (a failing line fails the test):
//!
//! - the Quick start's vallumd (`vallumd --example --source synthetic`), every line of
//!   "Walk-through with vallumctl" but `vallumctl watch` (it blocks until Ctrl-C), the first
//!   block of "Drop-in iptables" and docs/operations.md's "Sets (ipset-style)" block, in one
//!   session;
//! - README's NFQUEUE-on-a-host block and docs/operations.md's "NFQUEUE mode" block;
//! - README's kernel-tables block (`vallumd --kernel-tables nat`), after the drop-in block's
//!   set-up lines;
//! - README's fleet demo, with etcd;
//! - docs/dropin.md's update-alternatives block, on overlays of /usr/sbin and the
//!   alternatives' directories, then `iptables` through the new links;
//! - docs/operations.md's backup block against a running vallumd (on overlays of /var/lib and
//!   /var/backups), then the restore that section describes;
//! - docs/operations.md's scrape config (`promtool check config`).
//!
//! What the sandbox does instead of the user: the test has built the binaries, so a block's
//! `cargo` lines are skipped, the working directory's `target/release` and `target/debug` are
//! links to the test's target directory, and that directory leads `PATH`. A command whose
//! comment says `(exit N)` must exit N.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

// === the inventory ===

/// The test that runs the Quick start, the walk-through, the drop-in block and the sets block.
const QUICK: &str = "server/tests/it/readme.rs:readme_quick_start_walk_through_and_drop_in_run";

/// Each block meant to run: (file, heading, index among the heading's fenced blocks, the test
/// that runs it as `FILE:FN`). The test's file must name the heading (it finds the block by
/// it) and define the function.
const RUN: &[(&str, &str, usize, &str)] = &[
    ("README.md", "## Quick start", 0, QUICK),
    // The build lines: what the test does before it runs anything (checked there).
    ("README.md", "## Quick start", 1, QUICK),
    (
        "README.md",
        "## Quick start",
        2,
        "server/tests/it/readme.rs:nfqueue_blocks_run",
    ),
    ("README.md", "## Walk-through with vallumctl", 0, QUICK),
    (
        "README.md",
        "## Fleet mode",
        0,
        "server/tests/it/readme.rs:fleet_block_runs",
    ),
    ("README.md", "## Drop-in iptables", 0, QUICK),
    (
        "README.md",
        "## Drop-in iptables",
        1,
        "server/tests/it/readme.rs:kernel_tables_block_runs",
    ),
    (
        "README.md",
        "## Using the engine as a library",
        0,
        "engine/tests/it/readme.rs:readme_library_example_is_the_crate_doctest",
    ),
    (
        "docs/operations.md",
        "## NFQUEUE mode",
        0,
        "server/tests/it/readme.rs:nfqueue_blocks_run",
    ),
    (
        "docs/operations.md",
        "### A safe first NFQUEUE run",
        0,
        "server/tests/coexist.rs:documented_first_run_works",
    ),
    ("docs/operations.md", "## Sets (ipset-style)", 0, QUICK),
    (
        "docs/operations.md",
        "## Backup and restore of the SQLite store",
        0,
        "server/tests/it/readme.rs:backup_block_runs_and_restores",
    ),
    (
        "docs/dropin.md",
        "## Installing with update-alternatives (Debian/Ubuntu)",
        0,
        "server/tests/it/readme.rs:update_alternatives_block_runs",
    ),
    (
        "docs/operations.md",
        "## Alerts",
        0,
        "server/tests/it/readme.rs:scrape_config_block_is_valid",
    ),
];

/// The reasons a ```` ```sh no-run=REASON ```` block may give (CONTRIBUTING.md).
const NO_RUN: &[(&str, &str)] = &[
    (
        "docker",
        "needs a Docker daemon and image downloads; server/tests/deploy.rs checks the Dockerfile",
    ),
    ("kubernetes", "needs a Kubernetes cluster"),
    (
        "host",
        "enables systemd units on the machine itself (systemctl talks to its systemd); \
         server/tests/install.rs installs into a DESTDIR and verifies the units",
    ),
    (
        "build",
        "a cargo build or test line: the test suite builds and runs what it names",
    ),
];

/// One fenced block of a Markdown file.
#[derive(Debug)]
struct Block {
    file: String,
    /// 1-based line of the opening fence.
    line: usize,
    /// The last heading line above it (`## Quick start`).
    heading: String,
    /// Index among the blocks under that heading.
    index: usize,
    /// The fence's info string (`sh`, `sh no-run=docker`, `text`, ...).
    info: String,
    body: String,
}

/// The fenced blocks of `file` (relative to the repository root), in order.
fn blocks(file: &str) -> Vec<Block> {
    let text = std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut out: Vec<Block> = Vec::new();
    let mut heading = String::new();
    let mut open: Option<Block> = None;
    for (i, l) in text.lines().enumerate() {
        match open.take() {
            Some(b) if l.starts_with("```") => out.push(b),
            Some(mut b) => {
                b.body.push_str(l);
                b.body.push('\n');
                open = Some(b);
            }
            None if l.starts_with("```") => {
                let index = out.iter().filter(|b| b.heading == heading).count();
                open = Some(Block {
                    file: file.to_owned(),
                    line: i + 1,
                    heading: heading.clone(),
                    index,
                    info: l.trim_start_matches('`').trim().to_owned(),
                    body: String::new(),
                });
            }
            None if l.starts_with('#') => heading = l.trim().to_owned(),
            None => {}
        }
    }
    assert!(open.is_none(), "{file}: a fence is not closed");
    out
}

/// The body of the block `RUN` lists as (file, heading, index), checked to be there.
fn block(file: &str, heading: &str, index: usize) -> String {
    blocks(file)
        .into_iter()
        .find(|b| b.heading == heading && b.index == index)
        .unwrap_or_else(|| panic!("{file} has no block {index} under {heading:?}"))
        .body
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn every_doc_block_is_run_or_says_why() {
    let mut files = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| {
            e.expect("docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    files.extend(docs);
    let mut wrong = Vec::new();
    let mut claimed = vec![0; RUN.len()];
    for b in files.iter().flat_map(|f| blocks(f)) {
        let at = format!("{}:{} ({} [{}])", b.file, b.line, b.heading, b.info);
        let run = RUN
            .iter()
            .position(|&(f, h, i, _)| f == b.file && h == b.heading && i == b.index);
        if let Some(k) = run {
            claimed[k] += 1;
        }
        match (b.info.as_str(), run) {
            ("sh" | "rust" | "yaml", Some(_)) | ("text", None) => {}
            ("sh" | "rust" | "yaml", None) => wrong.push(format!(
                "{at}: meant to run, but no test in RUN runs it (add the test, or mark it \
                 `sh no-run=REASON` / `text`)"
            )),
            (info, None) if info.starts_with("sh no-run=") => {
                let why = &info["sh no-run=".len()..];
                if !NO_RUN.iter().any(|(r, _)| *r == why) {
                    wrong.push(format!("{at}: no-run={why} is not one of NO_RUN's reasons"));
                }
            }
            (info, Some(_)) => wrong.push(format!("{at}: RUN lists it, but it is `{info}`")),
            (info, None) => wrong.push(format!(
                "{at}: info string `{info}` is none of sh, sh no-run=REASON, text, rust, yaml"
            )),
        }
    }
    for (k, &(f, h, i, test)) in RUN.iter().enumerate() {
        if claimed[k] != 1 {
            wrong.push(format!("RUN lists {f} {h:?} block {i}, which is not there"));
        }
        let (path, name) = test.split_once(':').expect("FILE:FN");
        let src = std::fs::read_to_string(root().join(path)).unwrap_or_default();
        let title = h.trim_start_matches('#').trim();
        if !src.contains(&format!("fn {name}(")) || !src.contains(title) {
            wrong.push(format!(
                "RUN says {test} runs {f} {h:?}, but {path} has no fn {name} naming {title:?}"
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

// === the sandbox ===

/// A working directory for a block that looks like the repository root (the docs' commands
/// run there): a link to each of the root's entries but `target` and `.git`; its own
/// `target/release` and `target/debug` link to the directory of the test's binaries
/// (vallumd, vallumctl and vallum-iptables, built if missing); `files` are written into it.
/// Under `CARGO_TARGET_TMPDIR`, not /tmp, which the sandbox covers.
fn workdir(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let bin = bin_dir();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    for e in std::fs::read_dir(root()).expect("the repository root") {
        let name = e.expect("an entry").file_name();
        if name != "target" && name != ".git" {
            std::os::unix::fs::symlink(root().join(&name), dir.path().join(&name))
                .expect("symlink");
        }
    }
    std::fs::create_dir(dir.path().join("target")).expect("mkdir target");
    for profile in ["release", "debug"] {
        std::os::unix::fs::symlink(&bin, dir.path().join("target").join(profile)).expect("symlink");
    }
    for (name, text) in files {
        std::fs::write(dir.path().join(name), text).expect("write a file");
    }
    (dir, bin)
}

/// The directory holding vallumd, vallumctl and vallum-iptables.
fn bin_dir() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_vallumd"))
        .parent()
        .expect("bin dir")
        .to_owned();
    let ctl = support::vallumctl();
    assert_eq!(
        ctl.parent(),
        Some(bin.as_path()),
        "vallumctl beside vallumd"
    );
    assert!(
        ctl.with_file_name("vallum-iptables").exists(),
        "vallum-iptables beside vallumctl"
    );
    bin
}

/// `block` as the sandbox runs it: `cargo` lines dropped (the test built the binaries), and a
/// command whose comment says `(exit N)` checked to exit N instead of stopping `sh -e`.
fn runnable(block: &str) -> String {
    let mut out = String::new();
    let mut continued = false;
    for (i, l) in block.lines().enumerate() {
        let whole = !continued;
        continued = l.ends_with('\\');
        if whole && l.starts_with("cargo ") {
            assert!(!continued, "a cargo line continues: {l}");
            continue;
        }
        let expect = l
            .rsplit_once(" # ")
            .filter(|_| whole && !continued)
            .and_then(|(cmd, comment)| {
                let n = comment.split("(exit ").nth(1)?.split(')').next()?;
                Some((cmd, n.parse::<u8>().ok()?))
            });
        match expect {
            Some((cmd, n)) => out.push_str(&format!(
                "if {cmd}; then rc=0; else rc=$?; fi; [ \"$rc\" -eq {n} ] || \
                 {{ echo \"block line {}: exit $rc, the docs say {n}\" >&2; exit 97; }}\n",
                i + 1
            )),
            None => {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out
}

/// What a sandboxed script printed.
struct Ran {
    ok: bool,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stdout:\n{}\nstderr:\n{}", self.stdout, self.stderr)
    }
}

/// Runs `script` with `sh -e -x` in `dir` inside new mount, network and PID namespaces
/// (`unshare --mount --net --pid --fork --mount-proc`; root): tmpfs on /run and /tmp, an
/// overlay on each directory of `overlays` (writes land under `dir`, the real directory is
/// untouched), loopback up, `PATH` led by `bin`, `HOME` the working directory, no
/// `VALLUM_*` variables. The PID namespace ends every process the script left running when
/// it exits; a mount that fails stops it before the script runs.
fn sandbox(dir: &Path, bin: &Path, overlays: &[&str], script: &str) -> Ran {
    let file = dir.join("block.sh");
    std::fs::write(&file, format!("set -e -x\n{script}")).expect("write the script");
    let mut setup = String::from("mount -t tmpfs tmpfs /run; mount -t tmpfs tmpfs /tmp; ");
    for (k, over) in overlays.iter().enumerate() {
        let (upper, work) = (
            dir.join(format!("overlay{k}/upper")),
            dir.join(format!("overlay{k}/work")),
        );
        std::fs::create_dir_all(&upper).expect("mkdir upper");
        std::fs::create_dir_all(&work).expect("mkdir work");
        setup.push_str(&format!(
            "mount -t overlay overlay -o lowerdir={over},upperdir={},workdir={} {over}; ",
            upper.display(),
            work.display()
        ));
    }
    setup.push_str("ip link set lo up; exec sh \"$0\"");
    let out = Command::new("unshare")
        .args([
            "--mount",
            "--net",
            "--pid",
            "--fork",
            "--mount-proc",
            "sh",
            "-ec",
            &setup,
        ])
        .arg(&file)
        .current_dir(dir)
        .env_clear()
        .env(
            "PATH",
            format!(
                "{}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                bin.display()
            ),
        )
        .env("HOME", dir)
        .output()
        .expect("unshare (util-linux)");
    Ran {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Panics unless the process runs as root (the sandbox's namespaces need it).
fn need_root(test: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        panic!("{test}: needs root (unshare --mount --net --pid)");
    }
}

/// Panics unless `tool` is on PATH.
fn need(test: &str, tool: &str) {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()));
    if !found {
        panic!("{test}: `{tool}` is not on PATH");
    }
}

// === the blocks ===

#[test]
#[ignore = "needs root (unshare --mount --net --pid for the README's fixed ports and socket) and ip"]
fn readme_quick_start_walk_through_and_drop_in_run() {
    need_root("readme_quick_start_walk_through_and_drop_in_run");
    // "## Quick start": `cargo run ... --bin vallumd -- ARGS` (run here as the built vallumd
    // with ARGS) and `cargo test --workspace`.
    let quick = block("README.md", "## Quick start", 0);
    let quick: Vec<&str> = quick.lines().collect();
    assert_eq!(quick.len(), 2, "Quick start has two commands: {quick:?}");
    assert!(quick[1].starts_with("cargo test --workspace"), "{quick:?}");
    let args = quick[0]
        .strip_prefix("cargo run --release -p vallum-server --bin vallumd -- ")
        .unwrap_or_else(|| panic!("Quick start runs vallumd: {quick:?}"));
    // The build lines are what the sandbox is: built binaries, `target/release` on PATH.
    let build = block("README.md", "## Quick start", 1);
    assert!(
        build
            .lines()
            .all(|l| l.starts_with("cargo build ")
                || l == "export PATH=\"$PWD/target/release:$PATH\""),
        "{build}"
    );
    let walk: String = block("README.md", "## Walk-through with vallumctl", 0)
        .lines()
        .filter(|l| !l.contains("(Ctrl-C)"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(walk.lines().count() > 20, "{walk}");
    let drop_in = block("README.md", "## Drop-in iptables", 0);
    assert!(drop_in.contains("\niptables-save"), "{drop_in}");
    let sets = block("docs/operations.md", "## Sets (ipset-style)", 0);

    let (dir, bin) = workdir(&[]);
    let script = format!(
        "vallumd {args} > vallumd.log 2>&1 &\n\
         {build}\
         {walk}\
         echo '@@drop-in'\n\
         {drop_in}\
         echo '@@sets'\n\
         {sets}",
        build = runnable(&build),
        walk = runnable(&walk),
        drop_in = runnable(&drop_in),
        sets = runnable(&sets),
    );
    let ran = sandbox(dir.path(), &bin, &[], &script);
    let log = std::fs::read_to_string(dir.path().join("vallumd.log")).unwrap_or_default();
    assert!(
        ran.ok,
        "the README's blocks failed:\n{ran}\nvallumd:\n{log}"
    );
    // What the blocks say they print: the walk-through's status and export, the drop-in's
    // save, the sets block's `set show`.
    let stdout = &ran.stdout;
    assert!(stdout.contains("host-firewall"), "{ran}");
    assert!(stdout.contains("*filter"), "{ran}");
    let saved = stdout
        .split("@@drop-in")
        .nth(1)
        .and_then(|s| s.split("@@sets").next())
        .unwrap_or_default();
    assert!(
        saved.contains("-A SSH -s 10.0.0.0/8 -p tcp -m tcp --dport 22 -j ACCEPT")
            && saved.contains(":INPUT DROP"),
        "iptables-save after the drop-in script:\n{saved}"
    );
    let sets = stdout.split("@@sets").nth(1).unwrap_or_default();
    assert!(
        sets.contains("Name: f2b-sshd") && sets.contains("Type: hash:ip"),
        "set show after the sets block:\n{sets}"
    );
    // What `set save` wrote and `set import` read back: the swapped-in element.
    let saved = std::fs::read_to_string(dir.path().join("sets.save")).expect("sets.save");
    assert!(
        saved.contains("create f2b-sshd hash:ip") && saved.contains("add f2b-sshd 192.0.2.10"),
        "{saved}"
    );
}

/// The rules the NFQUEUE-on-a-host block applies ("your own ruleset"): ACCEPT policies, SSH
/// accepted.
const HOST_RULES: &str = "*filter\n:INPUT ACCEPT [0:0]\n:FORWARD ACCEPT [0:0]\n\
    :OUTPUT ACCEPT [0:0]\n-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT\nCOMMIT\n";

#[test]
#[ignore = "needs root, unshare, iptables and nfnetlink_queue"]
fn nfqueue_blocks_run() {
    let test = "nfqueue_blocks_run";
    need_root(test);
    need(test, "iptables-restore");
    let _ = Command::new("modprobe").arg("nfnetlink_queue").output();
    // The README's ("## Quick start", after "To filter real packets on Linux"), then
    // docs/operations.md's ("## NFQUEUE mode"); after each, the steering must be gone.
    let readme = block("README.md", "## Quick start", 2);
    let ops = block("docs/operations.md", "## NFQUEUE mode", 0);
    for (name, text) in [("README.md", &readme), ("docs/operations.md", &ops)] {
        assert!(text.contains("dataplane install"), "{name}: {text}");
        let (dir, bin) = workdir(&[("host.rules", HOST_RULES)]);
        let script = format!("{}echo '@@after'\niptables-save\n", runnable(text));
        let ran = sandbox(dir.path(), &bin, &[], &script);
        assert!(ran.ok, "{name}'s NFQUEUE block failed:\n{ran}");
        let (during, after) = ran.stdout.split_once("@@after").expect("@@after");
        assert!(
            !after.contains("VALLUM-NFQUEUE"),
            "{name}: steering left:\n{after}"
        );
        if name == "README.md" {
            assert!(during.contains("host/1"), "{name}: confirm:\n{ran}");
        } else {
            assert!(
                during.contains("source nfqueue:0"),
                "{name}: status:\n{ran}"
            );
        }
    }
}

#[test]
#[ignore = "needs root, unshare, iptables-nft and nf_tables"]
fn kernel_tables_block_runs() {
    let test = "kernel_tables_block_runs";
    need_root(test);
    need(test, "iptables-nft-restore");
    // The drop-in block's set-up (its first paragraph: links named iptables.. on PATH), then
    // the kernel-tables block.
    let drop_in = block("README.md", "## Drop-in iptables", 0);
    let setup = drop_in.split("\n\n").next().expect("a first paragraph");
    assert!(setup.contains("export PATH=~/vallum-bin"), "{setup}");
    let kernel = block("README.md", "## Drop-in iptables", 1);
    let (dir, bin) = workdir(&[]);
    let script = format!("{}\n{}", runnable(setup), runnable(&kernel));
    let ran = sandbox(dir.path(), &bin, &[], &script);
    assert!(ran.ok, "the kernel-tables block failed:\n{ran}");
    assert!(
        ran.stdout
            .contains("-j DNAT --to-destination 172.17.0.2:80")
            && ran.stdout.contains("-j MASQUERADE"),
        "iptables-nft-save -t nat lacks the rules:\n{ran}"
    );
    // `vallumctl status`: "kernel tables: ipv4 nat in sync", as the block's comment says.
    assert!(
        ran.stdout.lines().any(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w == ["ipv4", "nat", "in", "sync"]
        }),
        "vallumctl status:\n{ran}"
    );
}

#[test]
#[ignore = "needs root, unshare and etcd (Debian etcd-server)"]
fn fleet_block_runs() {
    let test = "fleet_block_runs";
    need_root(test);
    need(test, "etcd");
    let fleet = block("README.md", "## Fleet mode", 0);
    let (dir, bin) = workdir(&[]);
    let ran = sandbox(dir.path(), &bin, &[], &runnable(&fleet));
    assert!(ran.ok, "the fleet block failed:\n{ran}");
    assert!(ran.stdout.contains("node-a"), "{ran}");
    assert!(ran.stdout.contains("node-b"), "{ran}");
    assert!(ran.stdout.contains("ACK"), "{ran}");
}

/// Where update-alternatives writes: the links, its database, its log.
const ALTERNATIVES: &[&str] = &[
    "/usr/sbin",
    "/etc/alternatives",
    "/var/lib/dpkg/alternatives",
    "/var/log",
];

#[test]
#[ignore = "needs root, unshare, overlayfs and update-alternatives (Debian)"]
fn update_alternatives_block_runs() {
    let test = "update_alternatives_block_runs";
    need_root(test);
    need(test, "update-alternatives");
    // docs/dropin.md, "Installing with update-alternatives (Debian/Ubuntu)", on overlays of
    // the directories it writes; then vallumd, and `iptables` as a script calls it goes to
    // vallumd; then the way back the page gives (`update-alternatives --set iptables
    // /usr/sbin/iptables-legacy`).
    let alt = block(
        "docs/dropin.md",
        "## Installing with update-alternatives (Debian/Ubuntu)",
        0,
    );
    let (dir, bin) = workdir(&[]);
    let script = format!(
        "{}vallumd > vallumd.log 2>&1 &\n\
         vallumctl --wait=60s status > /dev/null\n\
         iptables -A INPUT -p tcp --dport 22 -j ACCEPT\n\
         echo @@save\n\
         iptables-save\n\
         echo @@back\n\
         update-alternatives --set iptables /usr/sbin/iptables-legacy\n\
         iptables -V\n",
        runnable(&alt)
    );
    let ran = sandbox(dir.path(), &bin, ALTERNATIVES, &script);
    assert!(
        !Path::new("/usr/sbin/vallum-iptables").exists(),
        "the block wrote to the real /usr/sbin"
    );
    assert!(ran.ok, "the update-alternatives block failed:\n{ran}");
    let (save, back) = ran.stdout.split_once("@@back").expect("@@back");
    assert!(
        save.contains("-A INPUT -p tcp -m tcp --dport 22 -j ACCEPT") && save.contains("*filter"),
        "iptables-save through the alternatives:\n{ran}"
    );
    assert!(
        back.contains("legacy"),
        "iptables -V after going back:\n{ran}"
    );
}

#[test]
#[ignore = "needs root, unshare, overlayfs and sqlite3"]
fn backup_block_runs_and_restores() {
    let test = "backup_block_runs_and_restores";
    need_root(test);
    need(test, "sqlite3");
    // docs/operations.md, "## Backup and restore of the SQLite store": the block while vallumd
    // runs with a committed ruleset; then a commit after the backup, and the restore the
    // section describes (stop, replace vallum.db, delete -wal and -shm, start): the backup's
    // ruleset is back, the later one gone.
    let backup = block(
        "docs/operations.md",
        "## Backup and restore of the SQLite store",
        0,
    );
    let (dir, bin) = workdir(&[]);
    let script = format!(
        "mkdir -p /var/lib/vallum\n\
         vallumd --db /var/lib/vallum/vallum.db > vallumd.log 2>&1 &\n\
         VALLUMD=$!\n\
         vallumctl --wait=60s apply web server/examples/web.rules\n\
         echo @@block\n\
         {}echo @@restore\n\
         vallumctl apply later server/examples/web.rules\n\
         kill $VALLUMD; wait $VALLUMD || true\n\
         cp \"/var/backups/vallum-$(date +%F).db\" /var/lib/vallum/vallum.db\n\
         rm -f /var/lib/vallum/vallum.db-wal /var/lib/vallum/vallum.db-shm\n\
         vallumd --db /var/lib/vallum/vallum.db > vallumd2.log 2>&1 &\n\
         vallumctl --wait=60s revisions web\n\
         if vallumctl revisions later; then exit 96; fi\n",
        runnable(&backup)
    );
    let ran = sandbox(dir.path(), &bin, &["/var/lib", "/var/backups"], &script);
    assert!(ran.ok, "the backup block or the restore failed:\n{ran}");
    let (_, after) = ran.stdout.split_once("@@block").expect("@@block");
    let (checks, restored) = after.split_once("@@restore").expect("@@restore");
    // One `ok` of PRAGMA integrity_check per backup file: the plain and the compacted one.
    assert_eq!(
        checks.lines().filter(|l| l.trim() == "ok").count(),
        2,
        "integrity checks:\n{ran}"
    );
    assert!(
        restored.contains("web"),
        "revisions web after the restore:\n{ran}"
    );
    assert!(
        ran.stderr.contains("NOT_FOUND"),
        "`later` (committed after the backup) must be gone:\n{ran}"
    );
}

#[test]
#[ignore = "needs promtool (Debian prometheus)"]
fn scrape_config_block_is_valid() {
    need("scrape_config_block_is_valid", "promtool");
    // docs/operations.md, "## Alerts": a hand-written scrape config with the label the
    // alerts select on.
    let yaml = block("docs/operations.md", "## Alerts", 0);
    assert!(yaml.contains("container: vallumd"), "{yaml}");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("prometheus.yml");
    std::fs::write(&file, &yaml).expect("write");
    let out = Command::new("promtool")
        .args(["check", "config"])
        .arg(&file)
        .output()
        .expect("promtool");
    assert!(
        out.status.success(),
        "promtool check config:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
