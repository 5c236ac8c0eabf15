//! The corpus of real-world rulesets (`tests/fixtures/corpus`, see its `MANIFEST`): rulesets
//! of our own written after what ufw, fail2ban, firewalld (iptables backend), Docker 24/28,
//! kube-proxy, Calico Felix, Neutron, libvirt and hardening guides generate.
//!
//! - [`corpus_imports_and_exports_as_the_kernel`]: every file goes to a real vallumd (Apply);
//!   one listed `accept` must be accepted, one listed `refuse EXT,...` refused with an error
//!   naming each extension, so the manifest tracks what is supported. As root with the
//!   `*tables-legacy` tools, every file must also be accepted by the kernel
//!   (`iptables-legacy-restore` in a private network namespace), and every accepted file's
//!   export must be what `iptables-legacy-save` prints for it, table by table, apart from
//!   comment lines and counters. Without them it prints `SKIP kernel part: <reason>`.
//! - [`corpus_packets_through_nfqueue`] (root, NFQUEUE): see there.

#[path = "support/vallumd.rs"]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use support::{Vallumd, text_source};
use vallum_proto::v1 as pb;

/// One line of the manifest.
#[derive(Clone, Debug)]
struct Entry {
    file: String,
    v6: bool,
    text: String,
    /// `None`: accepted; `Some(exts)`: refused naming each.
    refused: Option<Vec<String>>,
}

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/corpus")
}

fn manifest() -> Vec<Entry> {
    let dir = corpus_dir();
    let text = std::fs::read_to_string(dir.join("MANIFEST")).expect("MANIFEST");
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let l = l.trim();
        if l.is_empty() || l.starts_with('#') {
            continue;
        }
        let w: Vec<&str> = l.split_whitespace().collect();
        let refused = match w.as_slice() {
            [_, "accept"] => None,
            [_, "refuse", exts] => Some(exts.split(',').map(str::to_owned).collect()),
            _ => panic!(
                "MANIFEST:{}: expected `FILE accept` or `FILE refuse EXT[,EXT]`",
                i + 1
            ),
        };
        let file = w[0].to_owned();
        let body = std::fs::read_to_string(dir.join(&file))
            .unwrap_or_else(|e| panic!("MANIFEST:{}: {file}: {e}", i + 1));
        out.push(Entry {
            v6: file.ends_with(".rules6"),
            file,
            text: body,
            refused,
        });
    }
    // Every file of the directory is listed.
    let mut listed: Vec<&str> = out.iter().map(|e| e.file.as_str()).collect();
    listed.sort_unstable();
    let mut present: Vec<String> = std::fs::read_dir(&dir)
        .expect("corpus dir")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".rules") || n.ends_with(".rules6"))
        .collect();
    present.sort_unstable();
    assert_eq!(listed, present, "MANIFEST lists every corpus file once");
    out
}

/// A ruleset name for a file: its stem.
fn ruleset_name(file: &str) -> String {
    file.trim_end_matches('6')
        .trim_end_matches(".rules")
        .replace('.', "-")
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}

/// Why the kernel part cannot run here, if it cannot.
fn kernel_unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    for t in [
        "unshare",
        "iptables-legacy-restore",
        "iptables-legacy-save",
        "ip6tables-legacy-restore",
        "ip6tables-legacy-save",
    ] {
        if !on_path(t) {
            return Some(format!("`{t}` is not on PATH"));
        }
    }
    None
}

/// `text` restored by the kernel in a private network namespace, then saved: the save text,
/// or the tool's error.
fn kernel_save(text: &str, v6: bool) -> Result<String, String> {
    let tool = if v6 {
        "ip6tables-legacy"
    } else {
        "iptables-legacy"
    };
    let mut child = Command::new("unshare")
        .args(["-n", "sh", "-c", &format!("{tool}-restore && {tool}-save")])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("unshare: {e}"))?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().ok_or("stdin")?;
        stdin
            .write_all(text.as_bytes())
            .map_err(|e| format!("stdin: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).trim().to_owned());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A save text as its tables: name -> lines from `*name` to `COMMIT`, without comment lines
/// and with every `[p:b]` counter as `[0:0]`.
fn tables(save: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut cur: Option<String> = None;
    for l in save.lines() {
        if l.starts_with('#') || l.trim().is_empty() {
            continue;
        }
        if let Some(t) = l.strip_prefix('*') {
            cur = Some(t.to_owned());
        }
        let Some(t) = &cur else { continue };
        let line = match (l.find('['), l.rfind(']')) {
            (Some(a), Some(b)) if l.starts_with(':') && b > a => format!("{}[0:0]", &l[..a]),
            _ => l.to_owned(),
        };
        out.entry(t.clone()).or_default().push(line);
        if l == "COMMIT" {
            cur = None;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_imports_and_exports_as_the_kernel() {
    let entries = manifest();
    let kernel = match kernel_unavailable() {
        None => true,
        Some(why) => {
            println!("SKIP kernel part: {why}");
            false
        }
    };
    let dir = tempfile::tempdir().unwrap();
    let d = Vallumd::start(&dir.path().join("v.db"), &[]);
    d.wait_serving().await;
    let mut rs = d.rulesets().await;
    let mut failures = Vec::new();
    let (mut kernel_ok, mut ours_ok, mut equal) = (0, 0, 0);
    for e in &entries {
        let name = ruleset_name(&e.file);
        if kernel {
            match kernel_save(&e.text, e.v6) {
                Ok(_) => kernel_ok += 1,
                Err(why) => failures.push(format!("{}: the kernel refuses it: {why}", e.file)),
            }
        }
        let applied = rs
            .apply(pb::ApplyRequest {
                ruleset: name.clone(),
                source: Some(text_source(&e.text, e.v6, &e.file)),
                ..Default::default()
            })
            .await;
        match (&e.refused, applied) {
            (None, Ok(_)) => ours_ok += 1,
            (None, Err(s)) => failures.push(format!(
                "{}: listed `accept`, refused: {}",
                e.file,
                s.message()
            )),
            (Some(exts), Ok(_)) => failures.push(format!(
                "{}: listed `refuse {}`, accepted: move it to `accept` in MANIFEST",
                e.file,
                exts.join(",")
            )),
            (Some(exts), Err(s)) => {
                use tonic_types::StatusExt;
                let mut said = s.message().to_owned();
                for v in s
                    .get_error_details()
                    .bad_request()
                    .into_iter()
                    .flat_map(|b| b.field_violations.iter())
                {
                    said.push('\n');
                    said.push_str(&v.description);
                }
                for x in exts {
                    if !said.contains(x.as_str()) {
                        failures.push(format!("{}: refused without naming {x}: {said}", e.file));
                    }
                }
            }
        }
        if e.refused.is_some() || !kernel {
            continue;
        }
        let ours = rs
            .export_revision(pb::ExportRevisionRequest {
                name: format!("rulesets/{name}/revisions/1"),
                format: pb::ExportFormat::IptablesSave as i32,
                counters: false,
            })
            .await
            .expect("export")
            .into_inner()
            .content;
        let Ok(theirs) = kernel_save(&e.text, e.v6) else {
            continue;
        };
        // Our export holds both families; keep the one of the file.
        let ours = match ours.split_once("# ---- ip6tables-save ----") {
            Some((v4, v6)) => if e.v6 { v6 } else { v4 }.to_owned(),
            None => ours,
        };
        let (a, b) = (tables(&ours), tables(&theirs));
        if a == b {
            equal += 1;
        } else {
            for t in a
                .keys()
                .chain(b.keys())
                .collect::<std::collections::BTreeSet<_>>()
            {
                let (x, y) = (a.get(t), b.get(t));
                if x != y {
                    failures.push(format!(
                        "{}: table {t} exports\n{}\niptables-legacy-save prints\n{}",
                        e.file,
                        x.map(|v| v.join("\n")).unwrap_or_default(),
                        y.map(|v| v.join("\n")).unwrap_or_default()
                    ));
                }
            }
        }
    }
    let listed_accept = entries.iter().filter(|e| e.refused.is_none()).count();
    println!(
        "corpus: {} files ({} IPv6); kernel accepts {}; vallumd accepts {} (manifest: {} accept, \
         {} refuse); exports equal to iptables-legacy-save: {}",
        entries.len(),
        entries.iter().filter(|e| e.v6).count(),
        if kernel {
            kernel_ok.to_string()
        } else {
            "not run".into()
        },
        ours_ok,
        listed_accept,
        entries.len() - listed_accept,
        if kernel {
            equal.to_string()
        } else {
            "not run".into()
        },
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
