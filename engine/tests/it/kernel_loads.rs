//! What the kernel loads, the parser accepts, and in the form iptables-legacy-save prints;
//! what the kernel refuses, the parser refuses, or accepts with a warning at the line. Each
//! case is restored with `iptables-legacy-restore` in a network namespace of its own
//! (`oracle/kernel.rs` `restore_and_save`) and parsed here:
//!
//! - option ranges: `recent --hitcount` up to 65535, `hashlimit --hashlimit-burst` up to
//!   1000000 with the kernel's overflow check, `limit`'s overflow check;
//! - `-m sctp` (ports, chunk types with flags) and `-m u32` (the expression grammar, the
//!   kernel's shift check), printed as the kernel's save prints them;
//! - stored-only extensions' save forms (NFLOG, TCPMSS, tcpmss, connbytes, NFQUEUE, quota,
//!   esp, policy) and refusals (TCPMSS without a SYN match, libxt_policy's checks);
//! - restore texts iptables-restore refuses line by line (CRLF line ends, blank lines of
//!   spaces, a blank before `COMMIT`, no newline after it).
//!
//! Needs root and the `*tables-legacy*` tools: `#[ignore]`d, run with `-- --ignored`.

// Shared with kernel_oracle.rs, which uses the parts this test does not.
#[allow(dead_code)]
use crate::oracle::kernel;

use vallum_engine::model::Family;
use vallum_engine::restore::{ParseOptions, ParseWarningKind, parse, print_rule_spec};

/// Every rule case: a rule for `-A INPUT` in the filter table.
const RULES: &[&str] = &[
    // recent: XT_RECENT_MAX_NSTAMPS is 65536 since Linux 6.10.
    "-m recent --rcheck --hitcount 255 --name a",
    "-m recent --rcheck --hitcount 256 --name a",
    "-m recent --rcheck --hitcount 348 --name a",
    "-m recent --update --seconds 60 --hitcount 65535 --name a",
    "-m recent --rcheck --hitcount 65536 --name a",
    // hashlimit: libxt_hashlimit allows 1-1000000, the kernel refuses an overflow.
    "-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 10001 --hashlimit-name h",
    "-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 14497 --hashlimit-name h",
    "-m hashlimit --hashlimit-upto 1/hour --hashlimit-burst 1000000 --hashlimit-name h",
    "-m hashlimit --hashlimit-upto 1/day --hashlimit-burst 1000000 --hashlimit-name h",
    "-m hashlimit --hashlimit-upto 1/day --hashlimit-burst 10000 --hashlimit-name h",
    "-m hashlimit --hashlimit-upto 1/sec --hashlimit-burst 1000001 --hashlimit-name h",
    // limit: libxt_limit allows a burst of 0-10000, the kernel refuses 0 and an overflow.
    "-m limit --limit 1/day --limit-burst 4",
    "-m limit --limit 1/day --limit-burst 5",
    "-m limit --limit 1/day --limit-burst 5000",
    "-m limit --limit 1/hour --limit-burst 10000",
    "-m limit --limit 7/min --limit-burst 9999",
    "-m limit --limit 1/sec --limit-burst 0",
    // sctp.
    "-p sctp -m sctp --sport 1:65535",
    "-p sctp -m sctp ! --dport 80 --chunk-types any INIT,SACK",
    "-p sctp -m sctp --chunk-types all INIT,DATA:iUbE,SACK,ABORT:T",
    "-p sctp -m sctp ! --chunk-types only i_data,asconf,asconf_ack,forward_tsn",
    "-p sctp -m sctp --chunk-types any ALL",
    "-p sctp -m sctp --chunk-types any NONE",
    "-p sctp -m sctp --chunk-types any DATA:x",
    "-p sctp -m sctp --chunk-types some DATA",
    "-p sctp -m sctp --source-port 1 --sport 2",
    "-p sctp -m sctp --chunk-types any DATA:I,ABORT:T,SHUTDOWN_COMPLETE:t,DATA:E",
    "-p tcp -m sctp --sport 1",
    // u32.
    "-m u32 --u32 \"0x0=0x0&&0x0=0x1\"",
    "-m u32 ! --u32 \"6 & 0xFF = 1 && 4 & 0x3FFF = 0 && 0 >> 22 & 0x3C @ 0 >> 16 = 1:2,0x10\"",
    "-m u32 --u32 \"0>>22&0x3C@12>>26&0x3C@0=0x47455420\"",
    "-m u32 --u32 \" 010 = 0x1f : 077 \"",
    "-m u32 --u32 \"0<<31=1\"",
    "-m u32 --u32 \"0<<32=1\"",
    "-m u32 --u32 \"0>>32=1\"",
    "-m u32 --u32 \"0=1,2,3,4,5,6,7,8,9,10,11\"",
    "-m u32 --u32 \"-0=0\"",
    // Stored-only extensions' save forms and refusals.
    "-j NFLOG --nflog-range 1",
    "-j NFLOG --nflog-prefix xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
    "-p tcp -j TCPMSS --set-mss 42",
    "-p tcp -m tcp --tcp-flags SYN,RST SYN -j TCPMSS --set-mss 1400",
    "-p tcp -m tcp --syn -j TCPMSS --set-mss 1400",
    "-p tcp -m tcp ! --syn -j TCPMSS --set-mss 1400",
    "-m tcpmss --mss 42",
    "-p tcp -m tcpmss ! --mss 42:",
    "-m connbytes --connbytes 1000 --connbytes-mode packets --connbytes-dir original",
    "-m connbytes ! --connbytes 10:20 --connbytes-dir both --connbytes-mode bytes",
    "-j NFQUEUE --queue-balance 4:",
    "-j NFQUEUE --queue-bypass",
    "-j NFQUEUE --queue-balance 4:4",
    "-j NFQUEUE --queue-balance :",
    "-j NFQUEUE --queue-balance 0:65534 --queue-cpu-fanout",
    "-j NFQUEUE --queue-cpu-fanout",
    "-m quota ! --quota 5",
    "-p esp -m esp --espspi 0:4294967295",
    "-p esp -m esp ! --espspi 7:7",
    // policy (stored only): libxt_policy's grammar and save order.
    "-m policy --dir in",
    "-m policy --dir in --pol none --proto esp",
    "-m policy ! --dir in --pol ipsec",
    "-m policy --dir in ! --pol ipsec",
    "-m policy --dir in --dir in",
    "-m policy --dir in --pol none --strict",
    "-m policy --dir in --pol ipsec --strict",
    "-m policy --dir in --pol ipsec --proto tcp",
    "-m policy --dir in --pol ipsec --proto esp --proto ah",
    "-m policy --dir in --pol ipsec --tunnel-src 1.2.3.4",
    "-m policy --dir in --pol ipsec --mode tunnel --tunnel-src 1.2.3.0/24 --tunnel-dst 1.2.3.4 ! --spi 10 --reqid 0x10 --proto 50",
    "-m policy --dir in --pol ipsec --mode tunnel --tunnel-src 1.2.3.5/255.255.255.0",
    "-m policy --dir in --pol ipsec ! --mode transport --tunnel-dst 1.2.3.5/32",
    "-m policy --dir in --pol ipsec --strict --proto esp --next --mode tunnel --tunnel-dst 10.0.0.0/8",
    "-m policy --dir in --pol ipsec --strict --proto esp --next --proto esp --next --proto esp --next --proto esp",
    "-m policy --dir in --pol ipsec --strict --proto esp --next --proto esp --next --proto esp --next --proto esp --next --proto ah",
    "-m policy --dir in --pol ipsec --proto esp --next --proto ah",
    "-m policy --dir in --pol ipsec --spi 4294967296",
];

fn v4() -> ParseOptions<'static> {
    ParseOptions {
        family: Family::Ipv4,
        ..ParseOptions::default()
    }
}

/// The kernel's saved `-A INPUT` line of `rule`, or its refusal.
fn kernel_rule(rule: &str) -> Result<String, String> {
    let text = format!("*filter\n-A INPUT {rule}\nCOMMIT\n");
    let save = kernel::restore_and_save(Family::Ipv4, "filter", &text)?;
    save.lines()
        .find_map(|l| l.strip_prefix("-A INPUT "))
        .map(str::to_string)
        .ok_or_else(|| format!("no rule in {save}"))
}

/// Ours: the printed rule, or the parse error.
fn our_rule(rule: &str) -> Result<String, String> {
    let text = format!("*filter\n-A INPUT {rule}\nCOMMIT\n");
    let r = parse(&text, &v4()).map_err(|e| e.to_string())?;
    let chain = r.tables[0].chain("INPUT").ok_or("no INPUT")?;
    Ok(print_rule_spec(&chain.rules[0], Family::Ipv4))
}

#[test]
#[ignore = "needs root and iptables-legacy"]
fn rules_load_as_in_the_kernel() {
    kernel::availability().expect("root and iptables-legacy");
    let mut failures = Vec::new();
    for rule in RULES {
        let (k, ours) = (kernel_rule(rule), our_rule(rule));
        let same = match (&k, &ours) {
            (Ok(a), Ok(b)) => a == b,
            (Err(_), Err(_)) => true,
            _ => false,
        };
        if !same {
            failures.push(format!("{rule}\n  kernel: {k:?}\n  ours:   {ours:?}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

/// Texts that iptables-restore reads line by line, with the quirks of its `fgets` loop.
const TEXTS: &[&str] = &[
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n\n",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n# done\n",
    "*filter\n\n-A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n   \n",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n\t\n",
    "*filter\n  \n-A INPUT -j ACCEPT\nCOMMIT\n",
    "  \n*filter\n-A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\r\n-A INPUT -j ACCEPT\r\nCOMMIT\r\n",
    "*filter\n-A INPUT -j ACCEPT\r\nCOMMIT\n",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT\r\n",
    "*filter\n:INPUT ACCEPT [0:0]\r\n-A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\n:FOO - [0:0]\r\n-A FOO -j ACCEPT\nCOMMIT\n",
    "*filter\n:FOO -\r\n-A FOO -j ACCEPT\nCOMMIT\n",
    "*filter\n# c\r\n-A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT \n",
    "*filter\n-A INPUT -j ACCEPT\n COMMIT\n",
    "*filter \n-A INPUT -j ACCEPT\nCOMMIT\n",
    " *filter\n-A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\n :FOO - [0:0]\n-A FOO -j ACCEPT\nCOMMIT\n",
    "*filter\n # x\n-A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\n  -A INPUT -j ACCEPT\nCOMMIT\n",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT",
    "*filter\n-A INPUT -j ACCEPT\nCOMMIT\n\r\n",
];

/// Every text the kernel refuses is refused here or accepted with a warning at the line
/// (`RestoreRefusesLine`); every text it loads is accepted without one.
#[test]
#[ignore = "needs root and iptables-legacy"]
fn restore_texts_behave_as_iptables_restore() {
    kernel::availability().expect("root and iptables-legacy");
    let mut failures = Vec::new();
    for text in TEXTS {
        let kernel_ok = kernel::restore_and_save(Family::Ipv4, "filter", text).is_ok();
        let ours = parse(text, &v4());
        let warned = ours.as_ref().is_ok_and(|r| {
            r.warnings
                .iter()
                .any(|w| matches!(w.kind, ParseWarningKind::RestoreRefusesLine { .. }))
        });
        let ok = if kernel_ok {
            ours.is_ok() && !warned
        } else {
            ours.is_err() || warned
        };
        if !ok {
            failures.push(format!(
                "{text:?}: kernel {}, ours {:?}",
                if kernel_ok { "loads" } else { "refuses" },
                ours.map(|r| r.warnings)
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}
