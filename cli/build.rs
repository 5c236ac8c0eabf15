//! Link settings of `vallum-iptables`, a process started once per `iptables` command (issue
//! #33 item 7): linked as a position-dependent executable (`-no-pie`), so the loader applies
//! none of the ~10,000 relative relocations a PIE of it needs at every start (tonic, for TCP
//! endpoints, is linked in), and only the pages a call touches are faulted in.
//! BENCHMARKS.md "Drop-in iptables" has the measurements.

fn main() {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo:rustc-link-arg-bin=vallum-iptables=-no-pie");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
