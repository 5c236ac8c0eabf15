//! The kernel as the oracle of the nft printer: each ruleset in `tests/nft-rulesets/` (real-style
//! files written from the projects' documented output: Debian's default nftables.conf, a
//! kube-proxy-nftables-style table with a service verdict map, OpenWrt fw4's default shape,
//! firewalld's nftables backend, Docker 29's nftables backend, a workstation firewall with sets,
//! maps and nat) is loaded with `nft -f` into kernel nftables
//! in a private network namespace, and `nft list ruleset` there must equal, byte for byte, what
//! `vallum_engine::nft` prints for the parsed file (in the dialect of the installed nft).
//!
//! Needs root and nft: ignored unless asked for (`-- --include-ignored`), and fails when either
//! is missing. The JSON forms are checked the same way: the kernel's `nft -j list ruleset` reads
//! (`from_json`) to the same listing, and nft loads our `to_json` to the same listing.

use std::path::PathBuf;
use std::process::Command;

use vallum_engine::nft::{self, Dialect};

/// A network namespace deleted on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("vallum-nft-{}-{tag}", std::process::id());
        let st = Command::new("ip")
            .args(["netns", "add", &name])
            .status()
            .expect("run ip (needs iproute2)");
        assert!(st.success(), "ip netns add {name} failed (needs root)");
        Netns(name)
    }

    fn nft(&self, args: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.0, "nft"])
            .args(args)
            .output()
            .expect("run nft (needs the nftables package)");
        assert!(
            out.status.success(),
            "nft {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 listing")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The dialect of the installed nft (`nftables v1.0.6 (...)`).
fn installed_dialect() -> Dialect {
    let out = Command::new("nft")
        .arg("--version")
        .output()
        .expect("run nft --version (needs the nftables package)");
    let v = String::from_utf8_lossy(&out.stdout).to_string();
    if v.contains("v1.0.") || v.contains("v0.") {
        Dialect::V1_0
    } else {
        Dialect::V1_1
    }
}

/// The listing without what nft v1.0's JSON does not carry both ways: table and chain
/// comments (its `-j list` omits them and its `-j -f` ignores them), set comments (its
/// `-j -f` ignores them) and the `dynamic` set flag (its `-j list` omits it).
fn json_visible(listing: &str, d: Dialect) -> String {
    if d != Dialect::V1_0 {
        return listing.to_string();
    }
    let mut out = Vec::new();
    let mut prev = "";
    for line in listing.lines() {
        let object_comment = (line.starts_with("\tcomment \"") && prev.starts_with("table "))
            || line.starts_with("\t\tcomment \"");
        if let Some(flags) = line.strip_prefix("\t\tflags ") {
            let kept: Vec<&str> = flags.split(',').filter(|f| *f != "dynamic").collect();
            if !kept.is_empty() {
                out.push(format!("\t\tflags {}", kept.join(",")));
            }
        } else if !object_comment {
            out.push(line.to_string());
        }
        prev = line;
    }
    out.join("\n") + "\n"
}

fn rulesets() -> Vec<PathBuf> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/nft-rulesets"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("read tests/nft-rulesets")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "nft"))
        .collect();
    files.sort();
    files
}

#[test]
#[ignore = "needs root and nft"]
fn kernel_lists_what_we_print() {
    let dialect = installed_dialect();
    let files = rulesets();
    assert!(files.len() >= 6, "the rulesets are missing");
    for (k, f) in files.iter().enumerate() {
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let text = std::fs::read_to_string(f).expect("read ruleset");
        let rs = nft::parse(&name, &text).unwrap_or_else(|e| panic!("{e}"));
        let ours = nft::print_as(&rs, dialect);
        let ns = Netns::new(&k.to_string());
        ns.nft(&["-f", &f.to_string_lossy()]);
        let kernel = ns.nft(&["list", "ruleset"]);
        if kernel != ours {
            for (a, b) in kernel.lines().zip(ours.lines()) {
                if a != b {
                    eprintln!("{name}: first difference\n  kernel {a:?}\n  ours   {b:?}");
                    break;
                }
            }
        }
        assert_eq!(
            ours, kernel,
            "{name}: our listing differs from the kernel's"
        );
        // Our listing is itself a ruleset nft loads back to the same listing.
        let again = Netns::new(&format!("{k}b"));
        let listing =
            std::env::temp_dir().join(format!("vallum-nft-{}-{k}.nft", std::process::id()));
        std::fs::write(&listing, &ours).expect("write listing");
        again.nft(&["-f", &listing.to_string_lossy()]);
        let kernel_again = again.nft(&["list", "ruleset"]);
        let _ = std::fs::remove_file(&listing);
        assert_eq!(
            kernel_again, ours,
            "{name}: the listing does not load back to itself"
        );
        // JSON in: the kernel's `nft -j list ruleset` reads to the same listing.
        let kernel_json = ns.nft(&["-j", "list", "ruleset"]);
        let from_kernel = nft::from_json(&name, &kernel_json).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            json_visible(&nft::print_as(&from_kernel, dialect), dialect),
            json_visible(&kernel, dialect),
            "{name}: nft -j output reads differently"
        );
        // JSON out: nft loads our JSON to the same listing.
        let ours_json = Netns::new(&format!("{k}j"));
        let path = std::env::temp_dir().join(format!("vallum-nft-{}-{k}.json", std::process::id()));
        std::fs::write(&path, nft::to_json_as(&rs, dialect).to_string()).expect("write json");
        ours_json.nft(&["-j", "-f", &path.to_string_lossy()]);
        let listed = ours_json.nft(&["list", "ruleset"]);
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            json_visible(&listed, dialect),
            json_visible(&ours, dialect),
            "{name}: nft -j -f of our JSON lists differently"
        );
        println!(
            "{name}: kernel listing equals ours ({} bytes), JSON both ways",
            ours.len()
        );
    }
}
